"""The run contract (issue 33): a run is a grid cell plus the validated profile, built once; each
setting has one default and one rule, declared with its field."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from kdlab.core.fields import ConfigError
from kdlab.engine.run_config import DistillSettings, GRPOSettings, RLVRConfig, RunConfig
from kdlab.study.config import DistillSpec, Profile, RLVRSpec, load_profile
from kdlab.study.contract import RunContract, cell_contract, contract_for, run_config
from kdlab.study.plan import expand_grid

REPO_ROOT = Path(__file__).resolve().parents[1]
QUICK = REPO_ROOT / "params" / "quick.yaml"
CELL = dict(task="countdown-3", policy="on", kl="reverse", lr=2e-4, seed=1)

# A valid value other than the default for every distillation setting.
OTHER = {"steps": 7, "batch_size": 5, "temperature": 0.7, "teacher_temperature": 0.25, "student_temperature": 0.9,
         "fused_adamw": False, "grad_clip": 0.3, "dtype": "fp32", "compute_dtype": "bf16", "jsd_beta": 0.2,
         "sampled_direction": "forward", "logratio_clip": 2.0, "plausibility_alpha": 0.05, "offpd_pool": 64,
         "warmup": 3, "weight_decay": 0.01}


def test_the_profile_sections_are_the_engine_settings():
    """One declaration: the profile's distill section is the engine's class, the rlvr section
    extends GRPO's, so a setting's default and rule exist once."""
    assert DistillSpec is DistillSettings and issubclass(RunConfig, DistillSettings)
    assert issubclass(RLVRSpec, GRPOSettings) and issubclass(RLVRConfig, GRPOSettings)
    assert {f.name for f in dataclasses.fields(DistillSettings)} == set(OTHER)
    cell_fields = [f for f in dataclasses.fields(RunConfig) if f.name in CELL]
    assert len(cell_fields) == 5 and all(f.default is dataclasses.MISSING for f in cell_fields)  # no second default
    with pytest.raises(TypeError):
        RunConfig(task="countdown-3", policy="off", kl="forward", seed=0)  # a cell is named whole


def test_run_config_takes_every_distill_setting_from_the_profile():
    profile = load_profile(QUICK, {f"distill.{k}": v for k, v in OTHER.items()} | {"data_seed": 3,
                           "pretrained.micro_batch_size": 2, "pretrained.kl_chunk_size": 16})
    cfg = run_config(profile, **CELL)
    assert {k: getattr(cfg, k) for k in OTHER} == OTHER
    assert (cfg.data_seed, cfg.micro_batch_size, cfg.kl_chunk_size) == (3, 2, 16)
    # the grid's low rate 2e-4 is countdown-3's own low rate in quick (grid.task_lrs)
    assert (cfg.task, cfg.policy, cfg.lam, cfg.kl, cfg.lr, cfg.seed) == ("countdown-3", "on", 1.0, "reverse", 1e-4, 1)
    assert run_config(profile, **CELL, task_rate=False).lr == 2e-4


@pytest.mark.parametrize("where", ["grid.lrs", "style.lrs", "RunConfig", "--lr", "rlvr.lr", "student_pretrain.lr"])
def test_a_learning_rate_has_one_rule_wherever_it_is_set(where, tmp_path):
    """0 and 2 are refused with the same words by the profile's lists, the run configuration, the
    command line's flag and GRPO's setting: one rule (``kdlab.core.fields.LEARNING_RATE``)."""
    for bad, words in [(0.0, "0.0 must be above 0.0 and at most 1.0"), (2.0, "2.0 is above the maximum 1.0")]:
        with pytest.raises(ConfigError) as e:
            if where == "RunConfig":
                RunConfig(**{**CELL, "lr": bad})
            elif where == "--lr":
                cell_contract(load_profile(QUICK), tmp_path, lr=bad)
            else:
                load_profile(QUICK, {where: [bad] if where.endswith("lrs") else bad})
        assert words in str(e.value), (where, str(e.value))


def test_a_setting_set_in_code_meets_the_profile_rule():
    for field, bad in [("steps", 0), ("batch_size", 10_000), ("dtype", "fp16"), ("plausibility_alpha", 2.0),
                       ("temperature", float("nan")), ("offpd_pool", 10_000_000)]:
        with pytest.raises(ConfigError, match=field):
            RunConfig(**{**CELL, field: bad})
        with pytest.raises(ConfigError, match=f"distill.{field}"):
            load_profile(QUICK, {f"distill.{field}": bad})
    with pytest.raises(ConfigError, match="lam: policy 'lambda' needs lam"):
        RunConfig(**{**CELL, "policy": "lambda"})
    with pytest.raises(ConfigError, match="lam: 0.5 with policy 'on'"):
        RunConfig(**{**CELL, "lam": 0.5})
    assert RunConfig(**{**CELL, "policy": "lambda", "lam": 0.5}).run_id == "countdown-3_lam+0.5_reverse_lr0.0002_s1"


def test_the_contract_goes_through_json_whole(tmp_path):
    """What the study runner hands the run notebook (a papermill parameter) comes back equal."""
    profile = load_profile(QUICK, {"eval.harder": ["countdown-4e"], "companions": {"x": {"distill": {"steps": 5}}}})
    contract = contract_for(profile, run_config(profile, **CELL), tmp_path, save_student=True)
    back = RunContract.from_json(contract.to_json())
    assert back == contract and isinstance(back.profile, Profile) and back.run.run_id == contract.run.run_id
    assert back.out_dir == tmp_path.resolve() / "quick" / "runs" / contract.run.run_id
    assert back.models_root == tmp_path.resolve() / "models"
    with pytest.raises(ValueError, match="no key 'params'"):
        RunContract.from_json({**contract.to_json(), "params": "x.yaml"})


def test_every_grid_cell_is_a_contract_of_the_same_profile(tmp_path):
    from kdlab.study.plan import run_job

    profile = load_profile(QUICK)
    cells = expand_grid(profile)
    assert len(cells) == 72
    job = run_job(profile, tmp_path, cells[5], save={cells[5].run_id})
    params = job.parameters(tmp_path / "params.yaml", tmp_path, threads=1, recorded=False)
    assert set(params) == {"contract", "threads", "recorded"}  # no profile path to parse again
    back = RunContract.from_json(params["contract"])
    assert back.run == cells[5] and back.profile == profile and back.save_student and job.requires


def test_the_profile_schema_imports_no_torch():
    """``kdlab.study.config`` builds on the engine's settings classes without importing torch (bad
    input is refused before the heavy imports)."""
    code = "import sys, kdlab.study.config, kdlab.study.contract; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_per_task_rates_replace_the_grid_rates_by_role_everywhere_a_cell_is_named(tmp_path):
    """grid.task_lrs: a task it names trains at its own rate of each role (run ids, the grid, the
    command line's default cell, RLVR starts); the others at grid.lrs; the record names the role."""
    from kdlab.study.followups import rlvr_start
    from kdlab.study.plan import expand_grid

    root = Path(__file__).resolve().parents[1]
    p = load_profile(root / "params" / "quick.yaml", {"grid.lrs": [2e-4, 1e-3], "grid.tasks": ["countdown-3", "kb-mc"],
                                                      "grid.task_lrs": {"kb-mc": ["5e-5", "2.5e-4"]}})
    assert p.grid.task_lrs == {"kb-mc": [5e-5, 2.5e-4]}  # YAML's "5e-5" read as a number
    rates = {(c.task, c.lr) for c in expand_grid(p)}
    assert rates == {("countdown-3", 2e-4), ("countdown-3", 1e-3), ("kb-mc", 5e-5), ("kb-mc", 2.5e-4)}
    assert p.grid.rate("kb-mc", 1e-3) == 2.5e-4 and p.grid.role("kb-mc", 2.5e-4) == 1e-3
    assert p.grid.rate("countdown-3", 1e-3) == 1e-3 and p.grid.role("countdown-3", 1e-3) == 1e-3
    assert cell_contract(p, tmp_path, task="kb-mc").run.run_id == "kb-mc_off_forward_lr5e-05_s0"
    assert cell_contract(p, tmp_path, task="kb-mc", lr=1e-3).run.lr == 1e-3  # a flag's rate is used as given
    q = load_profile(root / "params" / "quick.yaml", {"grid.task_lrs": {"countdown-3": [1e-4, 5e-4]}})
    assert rlvr_start(q, "off/forward/1", 0).run_id == "countdown-3_off_forward_lr0.0005_s0"


def test_the_results_table_groups_by_the_grid_rate_and_keeps_the_run_rate(tmp_path):
    import json

    from kdlab.study.records import columns
    from kdlab.study import results as R

    for run_id, task, lr, grid_lr in (("a", "kb-mc", 5e-5, 2e-4), ("b", "kb-mc", 2.5e-4, 1e-3),
                                      ("c", "countdown-3", 2e-4, 2e-4), ("d", "countdown-3", 1e-3, None)):
        record = {c: 0.0 for c in columns("run") if c != "grid_lr"} | {"run_id": run_id, "task": task, "policy": "off", "kl": "forward",
                                                     "lr": lr, "seed": 0, "dtype": "bf16", "collapsed": False,
                                                     "lam": -1.0, "grad_clip": 1.0}
        if grid_lr is not None:  # "d": a record from before grid_lr (its rate is its role)
            record["grid_lr"] = grid_lr
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / "metrics.json").write_text(json.dumps(record))
        (tmp_path / "runs" / run_id / "history.json").write_text(json.dumps([{"step": 0, "loss": 0.0}]))
    df = R.collect(tmp_path)
    assert df.set_index("run_id")["lr"].to_dict() == {"a": 2e-4, "b": 1e-3, "c": 2e-4, "d": 1e-3}
    assert df.set_index("run_id")["lr_run"].to_dict() == {"a": 5e-5, "b": 2.5e-4, "c": 2e-4, "d": 1e-3}
    rates = R.task_rates(df)
    assert rates.loc["kb-mc"].tolist() == ["5e-05", "0.00025"] and rates.loc["countdown-3"].tolist() == ["0.0002", "0.001"]
