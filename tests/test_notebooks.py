"""Tests for the notebook suite (notebooks/NN_*.ipynb) and the results summaries it shows.

The notebooks are executed by one clean study of the tiny profile (``full_study``, shared with
tests/test_study.py); the tests check what each notebook recorded against the run files read
directly. The summaries in kdlab.study.results are checked on small synthetic tables against numpy and
hand-computed values.
"""
from __future__ import annotations

import json
from dataclasses import asdict
import math
from pathlib import Path

import jupytext
import nbformat
import numpy as np
import pandas as pd
import pytest

from kdlab.study import results as R
from kdlab.study.config import load_profile, to_dict
from kdlab.models.toy import checkpoint_meta
from kdlab.study.plan import expand_grid, notebook_finished
from test_study import FULL, FULL_RUNS, TINY, full_study, tiny_models  # noqa: F401 (session fixtures)

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["00_teachers", "10_run", "20_grid", "30_report"]


def _outputs(nb: nbformat.NotebookNode, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if kind in o.get("data", {})]


def _errors(nb: nbformat.NotebookNode) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]


# --------------------------------------------------------------------------- stored notebooks


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_paired_parameterized_and_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1
    paired = jupytext.read(NOTEBOOKS / f"{name}.py")
    assert [(c.cell_type, c.source) for c in paired.cells] == [(c.cell_type, c.source) for c in nb.cells]
    assert 'formats = "ipynb,py:percent"' in (NOTEBOOKS / "jupytext.toml").read_text()


# ----------------------------------------------------------------------------- executed notebooks


def test_teachers_notebook_recorded_the_models(full_study):
    teachers_nb = full_study.study_dir / "teachers" / "00_teachers.ipynb"
    assert notebook_finished(teachers_nb)
    nb = nbformat.read(teachers_nb, as_version=4)
    assert not _errors(nb) and _outputs(nb, "image/png") and _outputs(nb, "text/html")
    rows = json.loads((full_study.study_dir / "models.json").read_text())
    assert sorted((r["model"], r["task"]) for r in rows) == [("student base", "countdown-3"), ("teacher", "countdown-3")]
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["probe_mean"] <= 1.0
        meta = checkpoint_meta(r["path"])  # the checkpoint the row names
        assert r["n_params"] == meta["n_params"] and r["train_s"] == meta["train_s"] > 0


def test_every_run_notebook_executed_and_recorded_its_metrics(full_study):
    cells = expand_grid(load_profile(TINY, FULL))
    assert len(cells) == FULL_RUNS
    for cfg in cells:
        run_dir = full_study.study_dir / "runs" / cfg.run_id
        assert notebook_finished(run_dir / "run.ipynb"), cfg.run_id
        nb = nbformat.read(run_dir / "run.ipynb", as_version=4)
        assert not _errors(nb)
        params = nb.metadata.papermill.parameters
        contract = params["contract"]  # the whole run, as one parameter: its cell and the validated profile
        assert set(params) == {"contract", "threads", "recorded"}
        assert contract["run"] == asdict(cfg) and contract["profile"] == to_dict(load_profile(TINY, FULL))
        assert contract["out_dir"] == str(run_dir) and Path(contract["out_dir"]).is_absolute()
        assert len(_outputs(nb, "image/png")) == 1  # the training curves
        assert any(cfg.run_id in "".join(o["data"]["text/html"]) for o in _outputs(nb, "text/html"))  # metrics

        m = json.loads((run_dir / "metrics.json").read_text())
        assert (m["run_id"], m["policy"], m["lam"], m["kl"], m["lr"], m["seed"]) == \
            (cfg.run_id, cfg.policy, cfg.lam, cfg.kl, cfg.lr, cfg.seed)
        assert m["steps_done"] == 2 and m["collapsed"] is False
        probes = [k for k in m if k.startswith("probe_") and k != "probe_mean"]
        assert len(probes) == 7
        for key in ["accuracy", "base_accuracy", "pass_at_1", "sparsity", "probe_mean", *probes]:
            assert 0.0 <= m[key] <= 1.0, (cfg.run_id, key, m[key])
        assert m["forgetting"] == pytest.approx(m["probe_mean"] - m["base_probe_mean"], abs=1e-12)
        for p in probes:
            skill = p.removeprefix("probe_")
            assert m[f"forgetting_{skill}"] == pytest.approx(m[p] - m[f"base_{p}"], abs=1e-12)
        times = [m["time_rollout_s"], m["time_step_s"], m["time_eval_s"]]
        assert all(t >= 0 for t in times) and sum(times) <= m["wall_s"]
        history = json.loads((run_dir / "history.json").read_text())
        assert [h["step"] for h in history] == [0, 1]
        assert all(math.isfinite(h["loss"]) and h["loss"] >= 0 for h in history)
        assert m["final_loss"] == history[-1]["loss"]


def test_grid_notebook_wrote_one_row_per_grid_cell(full_study):
    study = full_study.study_dir
    assert notebook_finished(study / "grid.ipynb")
    df = pd.read_parquet(study / "results.parquet")
    cells = expand_grid(load_profile(TINY, FULL))
    assert df["run_id"].tolist() == sorted(c.run_id for c in cells)
    assert set(R.REQUIRED_COLUMNS) <= set(df.columns)
    assert {c for c in df.columns if c.startswith("forgetting_")} and {c for c in df.columns if c.startswith("probe_")}
    assert df["pass_at_10"].isna().all()  # eval.pass_n = 4 < 10: measured nowhere, but the column exists
    assert (df["dtype"] == "bf16").all() and (df["grad_clip"] == 1.0).all() and df["collapsed"].dtype == bool
    for row in df.itertuples():
        m = json.loads((study / "runs" / row.run_id / "metrics.json").read_text())
        assert (row.accuracy, row.base_accuracy, row.forgetting, row.sparsity, row.wall_s) == \
            (m["accuracy"], m["base_accuracy"], m["forgetting"], m["sparsity"], m["wall_s"])
    html = "".join("".join(o["data"]["text/html"]) for o in _outputs(nbformat.read(study / "grid.ipynb", 4), "text/html"))
    assert all(c.run_id in html for c in cells)


def test_report_is_exported_with_its_tables_and_without_code(full_study):
    study = full_study.study_dir
    assert notebook_finished(study / "report.ipynb")
    assert not _errors(nbformat.read(study / "report.ipynb", as_version=4))
    html = (study / "report.html").read_text()
    for heading in ["Accuracy by policy × KL × learning rate", "Forgetting and sparsity by learning rate",
                    "Base vs teacher vs distilled", "Toy-regime acceptance checks", "Wall time per phase"]:
        assert heading in html
    # The accuracy table: each cell's value, recomputed from metrics.json (one seed: no spread).
    for cfg in expand_grid(load_profile(TINY, FULL)):
        acc = json.loads((study / "runs" / cfg.run_id / "metrics.json").read_text())["accuracy"]
        assert f"{100 * acc:.1f} (n=1)" in html
    sparsity = [json.loads(p.read_text())["sparsity"] for p in study.glob("runs/*_lr0.0001_s0/metrics.json")]
    mean, std = 100 * np.mean(sparsity), 100 * np.std(sparsity, ddof=1)
    assert f"{mean:.1f} ± {std:.1f} (n={len(sparsity)})" in html  # sparsity at the low learning rate
    assert html.count("<img") >= 3  # accuracy, forgetting/sparsity and lambda-spectrum figures
    assert "FAIL" in html or "PASS" in html
    assert "load_results(" not in html and "import seaborn" not in html  # code cells hidden


# ------------------------------------------------------------------------------- results summaries


def _row(run_id: str, **kw) -> dict:
    base = {"run_id": run_id, "task": "countdown-3", "policy": "off", "lam": -1.0, "kl": "forward", "lr": 1e-4,
            "seed": 0, "dtype": "bf16", "grad_clip": 1.0, "accuracy": 0.5, "base_accuracy": 0.1,
            "forgetting": 0.0, "sparsity": 0.9, "collapsed": False, "wall_s": 10.0}
    return {**base, **kw}


def test_collect_reads_every_metrics_file_sorted_without_nested_values(tmp_path):
    for run_id, extra in [("b_run", {"pass_at_10": 0.7, "grad_clip": None}), ("a_run", {"curve": [1, 2], "meta": {"x": 1}})]:
        d = tmp_path / "runs" / run_id
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps(_row(run_id, **extra)))
    (tmp_path / "runs" / "c_unfinished").mkdir()  # no metrics.json: not a row
    df = R.collect(tmp_path)
    assert df["run_id"].tolist() == ["a_run", "b_run"]
    assert "curve" not in df.columns and "meta" not in df.columns
    assert set(R.REQUIRED_COLUMNS) <= set(df.columns)
    assert math.isnan(df.loc[0, "pass_at_10"]) and df.loc[1, "pass_at_10"] == 0.7
    assert df.loc[0, "grad_clip"] == 1.0 and math.isnan(df.loc[1, "grad_clip"])
    path = R.write_results(tmp_path)
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)
    assert list(tmp_path.glob("*.tmp")) == []
    empty = R.collect(tmp_path / "runs" / "c_unfinished")
    assert empty.empty and list(empty.columns) == list(R.REQUIRED_COLUMNS)
    with pytest.raises(ValueError, match="study_dir"):
        R.collect(tmp_path / "missing")


def test_accuracy_table_is_mean_and_sample_std_over_seeds():
    accs = {("off", 1e-4): [0.50, 0.70, 0.60], ("on", 1e-4): [0.40, 0.45, 0.80], ("off", 5e-4): [0.2]}
    df = pd.DataFrame([_row(f"{p}{lr}{s}", policy=p, lam=-1.0 if p == "off" else 1.0, lr=lr, seed=s, accuracy=a)
                       for (p, lr), values in accs.items() for s, a in enumerate(values)])
    table = R.accuracy_table(df)
    for (p, lr), values in accs.items():
        row = table[(table["policy"] == p) & np.isclose(table["lr"], lr)].iloc[0]
        assert row["n"] == len(values)
        assert row["mean"] == pytest.approx(100 * np.mean(values))
        if len(values) > 1:
            assert row["std"] == pytest.approx(100 * np.std(values, ddof=1))
            assert row["mean ± std"] == f"{100 * np.mean(values):.1f} ± {100 * np.std(values, ddof=1):.1f} (n=3)"
        else:
            assert math.isnan(row["std"]) and row["mean ± std"] == "20.0 (n=1)"
    wide = R.wide(table)
    assert list(wide.columns) == ["lr=0.0001", "lr=0.0005"] and wide.shape[0] == 2
    lr_table = R.by_lr(df, "sparsity")
    assert lr_table["n"].tolist() == [6, 1] and lr_table["mean"].tolist() == pytest.approx([90.0, 90.0])
    with pytest.raises(ValueError, match="metric"):
        R.by_lr(df, "no_such_metric")


def test_acceptance_checks_follow_their_definition():
    # countdown-3 at the low lr: cell gains (seed means) 30, 20, 40, 10 -> mean 25 (pass), best 40 (pass);
    # kb-mc: gains 10, 20, 30, 20 -> mean 20 (pass at exactly the threshold); the high lr is ignored.
    rows = []
    for task, gains in [("countdown-3", [30, 20, 40, 10]), ("kb-mc", [10, 20, 30, 20])]:
        for (policy, kl), gain in zip([("off", "forward"), ("off", "reverse"), ("on", "forward"), ("on", "reverse")], gains):
            for seed, jitter in [(0, -5), (1, 5)]:  # seeds average to the cell's gain
                rows.append(_row(f"{task}{policy}{kl}{seed}", task=task, policy=policy, kl=kl, seed=seed,
                                 base_accuracy=0.1, accuracy=0.1 + (gain + jitter) / 100))
                rows.append(_row(f"{task}{policy}{kl}{seed}hi", task=task, policy=policy, kl=kl, seed=seed,
                                 lr=5e-4, accuracy=0.0))
    checks = R.acceptance(pd.DataFrame(rows)).set_index(["task", "check"])
    cd3_mean = checks.loc[("countdown-3", "mean gain over the policy x KL cells")]
    assert cd3_mean["value"] == pytest.approx(25.0) and cd3_mean["threshold"] == 25 and cd3_mean["passed"]
    assert cd3_mean["cells"] == 4 and cd3_mean["seeds"] == 2 and cd3_mean["lr"] == 1e-4
    best = checks.loc[("countdown-3", "best cell gain")]
    assert best["value"] == pytest.approx(40.0) and best["threshold"] == 35 and best["status"] == "pass"
    kb = checks.loc[("kb-mc", "mean gain over the policy x KL cells")]
    assert kb["value"] == pytest.approx(20.0) and kb["threshold"] == 20 and kb["passed"]
    # Lower the best countdown cell below 35 points: that check fails, the others hold.
    df = pd.DataFrame(rows)
    df.loc[(df["task"] == "countdown-3") & (df["policy"] == "on") & (df["kl"] == "forward"), "accuracy"] -= 0.06
    checks = R.acceptance(df).set_index(["task", "check"])
    assert checks.loc[("countdown-3", "best cell gain"), "value"] == pytest.approx(34.0)
    assert checks.loc[("countdown-3", "best cell gain"), "status"] == "FAIL"
    assert "FAIL" in R.format_acceptance(checks.reset_index())
    # No countdown-3 runs: the checks say so instead of passing.
    other = R.acceptance(pd.DataFrame([r for r in rows if r["task"] == "kb-mc"]))
    assert other.loc[other["task"] == "countdown-3", "status"].tolist() == ["not run", "not run"]


def test_phase_times_sum_the_runs_models_and_notebook_overhead():
    df = pd.DataFrame([_row("a", wall_s=10.0, time_rollout_s=2.0, time_step_s=3.0, time_eval_s=1.0),
                       _row("b", wall_s=20.0, time_rollout_s=4.0, time_step_s=6.0, time_eval_s=2.0)])
    models = [{"path": "/m/student", "train_s": 50.0}, {"path": "/m/student", "train_s": 50.0},
              {"path": "/m/teacher", "train_s": 25.0}]
    timing = {"runs": {"a": {"overhead_s": 1.5}, "b": {"overhead_s": 0.5}, "gone": {"overhead_s": 9.0}},
              "invocations": [{"kernel_start_s": 6.0}, {"kernel_start_s": 4.0}]}
    t = R.phase_times(df, models, timing).set_index("phase")["seconds"]
    assert t["model training (students, teachers)"] == 75.0  # each model once
    assert (t["rollouts"], t["distillation steps"], t["evaluation"]) == (6.0, 9.0, 3.0)
    assert t["other run work"] == 30.0 - 18.0
    assert t["notebook overhead (per run)"] == 2.0 and t["kernel start-up"] == 10.0
    assert R.phase_times(df, models, timing)["share %"].sum() == pytest.approx(100.0, abs=0.5)
