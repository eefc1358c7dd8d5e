"""Beyond pass@1 (issue 7): profile inheritance and companions, the beyond profile, the coverage
statistics, and one end-to-end study of params/tiny-beyond.yaml (pass@k curves on the target
task and the harder variants, the RLVR follow-up from saved students, the style runs, a
robustness companion, their report sections, and resuming).

The end-to-end study (``beyond_study``, ~2-3 min on one core) reuses the session's tiny models
(tests/test_study.py) and adds the style teacher.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pandas as pd
import pytest

from kdlab.analysis.coverage import equal_pass1_gap, pass_curves, pass_ks, pass_targets
from kdlab.study.config import ConfigError, companion_profile, load_profile
from kdlab.study.followups import rlvr_starts, students_to_save, style_cells
from kdlab.models.toy import file_sha256, load_checkpoint
from kdlab.study.plan import expand_grid, notebook_finished
from kdlab.study.runner import run_study
from test_study import REPO_ROOT, outputs_with_models, tiny_models  # noqa: F401 (session fixture)

PARAMS = REPO_ROOT / "params"
TINY_BEYOND = PARAMS / "tiny-beyond.yaml"
FAST = {"distill.steps": 2, "threads": 1}


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------- profiles


def test_extends_merges_mappings_and_replaces_lists(tmp_path):
    write(tmp_path, "base.yaml", "name: base\ndistill: {steps: 7, batch_size: 3}\ngrid: {lrs: [1.0e-4, 5.0e-4], seeds: [0, 1]}\n")
    child = write(tmp_path, "child.yaml", "extends: base.yaml\nname: child\ndistill: {steps: 9}\ngrid: {seeds: [4]}\n")
    p = load_profile(child)
    assert (p.name, p.distill.steps, p.distill.batch_size) == ("child", 9, 3)  # batch_size inherited
    assert p.grid.lrs == [1e-4, 5e-4] and p.grid.seeds == [4]  # a list replaces the parent's
    assert load_profile(child, {"distill.steps": 2}).distill.steps == 2  # overrides apply last


@pytest.mark.parametrize("files, needle", [
    ({"base.yaml": "distill: {stepz: 3}\n", "child.yaml": "extends: base.yaml\n"}, "unknown key 'distill.stepz'"),
    ({"base.yaml": "name: b\n", "child.yaml": "extends: base.yaml\ngrid: {kls: [sideways]}\n"}, "grid.kls: 'sideways'"),
    ({"child.yaml": "extends: nowhere.yaml\n"}, "nowhere.yaml"),
    ({"base.yaml": "extends: child.yaml\n", "child.yaml": "extends: base.yaml\n"}, "cycle"),
    ({"child.yaml": "extends: [a, b]\n"}, "extends: ['a', 'b']"),
])
def test_extends_errors_name_the_key_or_file(tmp_path, files, needle):
    for name, text in files.items():
        write(tmp_path, name, text)
    with pytest.raises(ConfigError) as err:
        load_profile(tmp_path / "child.yaml")
    assert needle in str(err.value)


@pytest.mark.parametrize("text, needle", [
    ("companions: {noclip: {distill: {grad_clipp: null}}}\n", "companions.noclip: unknown key 'distill.grad_clipp'"),
    ("companions: {noclip: {grid: {kls: [k9]}}}\n", "companions.noclip: grid.kls: 'k9'"),
    ("companions: {noclip: {name: other}}\n", "companions.noclip: may not set 'name'"),
    ("companions: {'../up': {}}\n", "'../up' must be a plain name"),
    ("companions: {noclip: 3}\n", "companions.noclip: expected a mapping"),
    ("rlvr: {enabled: true, starts: [off/forward/5]}\n", "lr index 5 is out of range"),
    ("rlvr: {enabled: true, starts: [sideways/forward/0]}\n", "policy 'sideways'"),
    ("rlvr: {enabled: true, starts: [off-forward]}\n", "'off-forward' is not 'base' or 'policy/kl/lr-index'"),
    ("eval: {pass_ks: [0, 1]}\n", "eval.pass_ks: 0 is below the minimum 1"),
    ("eval: {pass_ks: []}\n", "eval.pass_ks: must list at least one k"),
    ("style: {kls: [sideways]}\n", "style.kls: 'sideways' is not a valid choice"),
    ("rlvr: {enabled: true, starts: [base, off/forward/0], seeds: [0, 7]}\n",
     "rlvr.seeds: [7] not in grid.seeds [0, 1]: the GRPO run of seed s starts from the distilled student of grid seed s"),
    ("style: {enabled: true}\ntrace: direct\n", "style.enabled"),
    ("rlvr: {enabled: true, kl_reference: teacher}\n", "rlvr.kl_reference: 'teacher' needs rlvr.kl_coef > 0"),
    ("rlvr: {enabled: true, kl_reference: teacher, kl_coef: 0.1, task: countdown-4}\n",
     "needs a teacher of rlvr.task 'countdown-4'; the profile has teachers of ['countdown-3']"),
    ("rlvr: {kl_reference: parent}\n", "rlvr.kl_reference: 'parent' is not a valid choice"),
])
def test_bad_follow_up_settings_are_rejected_by_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as err:
        load_profile(write(tmp_path, "p.yaml", text))
    assert needle in str(err.value)


def test_each_rlvr_seed_starts_from_the_distilled_student_of_its_own_grid_seed(tmp_path):
    """A replicate of the RLVR follow-up repeats the pipeline: GRPO seed s from grid seed s's
    student (so the intervals of finding 11 hold the distillation's seed-to-seed variation);
    the base start has no distilled run, and any seed is allowed when only the base starts."""
    p = load_profile(write(tmp_path, "p.yaml", "rlvr: {enabled: true, starts: [base, off/forward/0, on/reverse/1], "
                                               "seeds: [0, 1]}\n"))
    lo, hi = p.grid.lrs
    got = {(s.spec, s.seed): s.run_id for s in rlvr_starts(p)}
    assert got == {("base", 0): None, ("base", 1): None,
                   ("off/forward/0", 0): f"countdown-3_off_forward_lr{lo:g}_s0",
                   ("off/forward/0", 1): f"countdown-3_off_forward_lr{lo:g}_s1",
                   ("on/reverse/1", 0): f"countdown-3_on_reverse_lr{hi:g}_s0",
                   ("on/reverse/1", 1): f"countdown-3_on_reverse_lr{hi:g}_s1"}
    assert students_to_save(p) <= {c.run_id for c in expand_grid(p)}
    only_base = load_profile(write(tmp_path, "b.yaml", "rlvr: {enabled: true, starts: [base], seeds: [7]}\n"))
    assert [s.seed for s in rlvr_starts(only_base)] == [7]


def test_companion_runs_the_main_grid_under_its_overrides():
    p = load_profile(TINY_BEYOND)
    c = companion_profile(p, "noclip")
    assert c.name == "tiny-beyond-noclip" and c.distill.grad_clip is None
    assert (c.rlvr.enabled, c.style.enabled, c.grid.lambdas, c.companions) == (False, False, [], {})
    assert [x.run_id for x in expand_grid(c)] == ["countdown-3_off_forward_lr0.0001_s0", "countdown-3_on_forward_lr0.0001_s0"]
    assert (c.student, c.teacher, c.eval) == (p.student, p.teacher, p.eval)


def test_beyond_profile_runs_everything_on_the_quick_models():
    beyond, quick = load_profile(PARAMS / "beyond.yaml"), load_profile(PARAMS / "quick.yaml")
    # the quick profile's models and budgets, whatever their current calibration (extends)
    for key in ("trace", "student", "teacher", "teacher_pretrain", "distill", "data_seed"):
        assert getattr(beyond, key) == getattr(quick, key), key
    # ... but on countdown-3 alone (findings 7-13 are about countdown), with a student base that
    # learns countdown-3 at its calibrated weight and countdown-4, so that RLVR on countdown-4 has a signal
    assert beyond.student_pretrain == replace(quick.student_pretrain, task_weight=0.4, extra_tasks={"countdown-4": 0.6},
                                              arithmetic="fp32")
    assert (beyond.grid.tasks, beyond.grid.lrs, beyond.grid.seeds) == (["countdown-3"], quick.grid.lrs, quick.grid.seeds)
    # coverage: pass@1..10 from >= 20 samples, on the task and the harder variant, along the spectrum
    assert beyond.eval.pass_ks == list(range(1, 11)) and beyond.eval.pass_n >= 20
    assert beyond.eval.harder == ["countdown-4"] and beyond.eval.harder_pass  # countdown-4e: at the floor
    # greedy accuracy on enough problems that the evaluation's noise does not swamp the seeds'
    # (docs/calibration.md 34), in every study with replicates
    assert beyond.eval.n_test >= 2000 and all(companion_profile(beyond, s).eval.n_test >= 2000
                                              for s in beyond.companions if s != "search")
    assert {c.lam for c in expand_grid(beyond)} >= {-1.0, -0.5, 0.0, 0.5, 1.0}
    # RLVR on countdown-4 from off/on x forward/reverse x both rates (and the base), 300 steps
    starts = rlvr_starts(beyond)
    assert beyond.rlvr.task == "countdown-4" and beyond.rlvr.steps == 300
    # three seeds per start and per style configuration, as the main grid
    assert beyond.rlvr.seeds == beyond.style.seeds == beyond.grid.seeds == [0, 1, 2]
    assert {(s.policy, s.kl, s.lr) for s in starts if s.run_id} == {
        (p, k, lr) for p in ("off", "on") for k in ("forward", "reverse") for lr in quick.grid.lrs}
    assert students_to_save(beyond) <= {c.run_id for c in expand_grid(beyond)}
    # style: the four policy x KL configurations
    assert {(c.policy, c.kl) for c in style_cells(beyond)} == {(p, k) for p in ("off", "on") for k in ("forward", "reverse")}
    # robustness companions: sampled estimators for both directions, no clipping, a longer trace
    comps = {s: companion_profile(beyond, s) for s in beyond.companions}
    sampled = {(c.distill.sampled_direction, tuple(c.grid.kls)) for c in comps.values() if set(c.grid.kls) <= {"k1", "k2", "k3"}}
    assert {d for d, _ in sampled} == {"forward", "reverse"}
    assert any(c.distill.grad_clip is None for c in comps.values())
    assert any(c.trace == "search" for c in comps.values())


# --------------------------------------------------------------------------------- coverage math


def _planted(gap: float, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Runs whose pass@10 = 0.2 + 1.5 pass@1 + gap [forward] (+ noise), at lambdas 0.5 and 1."""
    rng = np.random.default_rng(seed)
    rows = []
    for kl in ("forward", "reverse"):
        for lam, policy in ((0.5, "lambda"), (1.0, "on"), (-1.0, "off")):
            for s in range(4):
                x = rng.uniform(0.1, 0.4)
                y = 0.2 + 1.5 * x + (gap if kl == "forward" else 0.0) + noise * rng.standard_normal()
                if lam < 0:
                    y = 0.0  # lambda <= 0 runs are left out of the comparison
                rows.append({"task": "countdown-3", "policy": policy, "lam": lam, "kl": kl, "lr": 1e-4, "seed": s,
                             "grad_clip": 1.0, "pass_at_1": x, "pass_at_10": y, "pass_at_5": (x + y) / 2})
    return pd.DataFrame(rows)


def test_equal_pass1_gap_recovers_a_planted_gap_exactly():
    fit = equal_pass1_gap(_planted(0.07), k=10, lam_above=0.0)
    assert fit["gap"] == pytest.approx(0.07, abs=1e-12) and fit["slope"] == pytest.approx(1.5, abs=1e-12)
    assert fit["se"] == pytest.approx(0.0, abs=1e-9) and (fit["n_forward"], fit["n_reverse"]) == (8, 8)
    assert fit["overlap_lo"] <= fit["overlap_hi"]


def test_equal_pass1_gap_matches_ols_with_noise():
    df = _planted(-0.03, noise=0.02, seed=3)
    fit = equal_pass1_gap(df, k=10, lam_above=0.0)
    d = df[df.lam > 0]
    X = np.column_stack([np.ones(len(d)), d.pass_at_1, (d.kl == "forward").astype(float)])
    coef, res, *_ = np.linalg.lstsq(X, d.pass_at_10.to_numpy(), rcond=None)
    se = math.sqrt(res[0] / (len(d) - 3) * np.linalg.inv(X.T @ X)[2, 2])
    assert fit["gap"] == pytest.approx(coef[2], abs=1e-12) and fit["se"] == pytest.approx(se, rel=1e-9)
    assert fit["ci_lo"] < fit["gap"] < fit["ci_hi"] and 0 <= fit["p"] <= 1


def test_pass_curves_are_seed_means_per_lambda():
    df = _planted(0.0)
    assert pass_targets(df) == [""] and pass_ks(df) == [1, 5, 10]
    curves = pass_curves(df)
    row = curves[(curves.kl == "forward") & (curves.lam == 0.5) & (curves.k == 10)].iloc[0]
    expected = df[(df.kl == "forward") & (df.lam == 0.5)].pass_at_10.mean()
    assert row["n"] == 4 and row["mean"] == pytest.approx(expected, abs=1e-12)


def test_evaluate_model_records_pass_at_k_on_the_task_and_the_harder_variants(tmp_path, monkeypatch):
    """On the shipped quick student (weak but not at zero): every k of eval.pass_ks on countdown-3
    and countdown-4e, equal to pass_at_ks on the same problems, samples and seed."""
    from kdlab.evaluation.evaluate import pass_at_ks
    from kdlab.study.runs import evaluate_model
    from kdlab.tasks import get_task
    from kdlab.tasks.base import held_out

    from kdlab.study.teachers import model_paths

    # the quick profile's student base, installed from checkpoints/ (no training)
    student_dir = model_paths(load_profile(REPO_ROOT / "params" / "quick.yaml"), tmp_path / "models",
                              progress=False, train=False)["student"]
    model = load_checkpoint(student_dir)
    profile = load_profile(TINY_BEYOND, {"eval.pass_n": 6, "eval.pass_ks": [1, 3, 6, 9], "eval.harder": ["countdown-4e"],
                                         "eval.n_probe": 1, "eval.n_test": 12, "eval.pass_problems": 12})
    out = evaluate_model(model, profile, "countdown-3", seed=5)
    assert "pass_at_9" not in out and "countdown-4e_pass_at_9" not in out  # k > pass_n is skipped
    for prefix, task in (("", "countdown-3"), ("countdown-4e_", "countdown-4e")):
        t = get_task(task)
        expected = pass_at_ks(model, t, held_out(t, 12, seed=profile.data_seed), n=6, ks=(1, 3, 6), seed=5)
        got = [out[f"{prefix}pass_at_{k}"] for k in (1, 3, 6)]
        assert got == [expected[k] for k in (1, 3, 6)]
        assert got[0] <= got[1] <= got[2] <= 1
    assert out["pass_at_6"] > 0  # the shipped student solves some countdown-3 problems
    # eval.n_harder: the harder variant's greedy accuracy on its own number of problems (default n_test)
    from kdlab.study import materials
    asked, real = [], materials.test_set
    monkeypatch.setattr(materials, "test_set", lambda prof, name, n: (asked.append((name, n)), real(prof, name, n))[1])
    for n_harder, n in ((None, 12), (5, 5)):
        asked.clear()
        over = {"eval.harder": ["countdown-4e"], "eval.n_probe": 1, "eval.n_test": 12, "eval.pass_problems": 2,
                "eval.pass_n": 2, "eval.pass_ks": [1], "eval.n_harder": n_harder}
        evaluate_model(model, load_profile(TINY_BEYOND, over), "countdown-3")
        assert asked == [("countdown-3", 12), ("countdown-4e", n)]


# --------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def beyond_study(tiny_models, tmp_path_factory) -> SimpleNamespace:
    """params/tiny-beyond.yaml end to end with two workers."""
    outputs = outputs_with_models(tmp_path_factory.mktemp("beyond"), tiny_models)
    t0 = time.perf_counter()
    rc = run_study(TINY_BEYOND, outputs, workers=2, overrides=FAST, progress=False)
    profile = load_profile(TINY_BEYOND, FAST)
    return SimpleNamespace(rc=rc, outputs=outputs, study_dir=outputs / "tiny-beyond", profile=profile,
                           seconds=time.perf_counter() - t0)


def _metrics(path: Path) -> dict:
    return json.loads((path / "metrics.json").read_text())


def test_every_run_records_pass_at_k_curves_on_the_task_and_the_harder_variants(beyond_study):
    assert beyond_study.rc == 0
    df = pd.read_parquet(beyond_study.study_dir / "results.parquet")
    assert len(df) == len(expand_grid(beyond_study.profile)) == 12
    for prefix in ("", "countdown-4_", "countdown-4e_"):
        cols = [f"{prefix}pass_at_{k}" for k in (1, 2, 3, 4)]
        values = df[cols].to_numpy()
        assert np.isfinite(values).all() and (values >= 0).all() and (values <= 1).all(), prefix
        assert (np.diff(values, axis=1) >= -1e-12).all(), prefix  # pass@k never falls with k
    # pass@k from n = 4 samples is 1 - C(4-c, k)/C(4, k): per problem a multiple of 1/C(4, k)
    # averaged over 4 problems, so 4 x C(4, k) x pass@k is an integer
    for k, comb in ((1, 4), (2, 6), (3, 4), (4, 1)):
        scaled = df[f"countdown-4e_pass_at_{k}"].to_numpy() * 4 * comb
        assert np.allclose(scaled, np.round(scaled), atol=1e-9)
    assert set(df.lam) == {-1.0, 0.5, 1.0}


def test_rlvr_starts_from_the_saved_students(beyond_study):
    study, profile = beyond_study.study_dir, beyond_study.profile
    (base,) = [r for r in json.loads((study / "models.json").read_text()) if r["model"] == "student base"]
    base_sha = file_sha256(Path(base["path"]) / "model.safetensors")
    saved = {p.parent.parent.name for p in study.glob("runs/*/student/config.json")}
    assert saved == students_to_save(profile) == {"countdown-3_off_forward_lr0.0005_s0", "countdown-3_on_reverse_lr0.0001_s0"}
    for start in rlvr_starts(profile):
        run = study / "rlvr" / start.job_id
        assert notebook_finished(run / "rlvr.ipynb")
        m = _metrics(run)
        assert (m["task"], m["steps_done"], m["start_id"], m["seed"]) == ("countdown-4", 3, start.start_id, 0)
        history = json.loads((run / "history.json").read_text())
        assert [h["step"] for h in history] == [0, 1, 2]
        assert all(0 <= h["reward_mean"] <= 1 and h["length"] > 0 for h in history)
        assert [h["accuracy"] is not None for h in history] == [False, True, True]  # eval_every 2 and the last step
        assert m["final_accuracy"] == history[-1]["accuracy"]
        assert m["final_reward"] == pytest.approx(history[-1]["reward_mean"])  # last tenth of 3 steps: 1 step
        if start.run_id:  # the start is the distilled student that run saved and evaluated
            assert (m["start_policy"], m["start_kl"], m["start_lr"]) == (start.policy, start.kl, start.lr)
            assert m["start_sha256"] == file_sha256(study / "runs" / start.run_id / "student" / "model.safetensors")
            assert m["start_sha256"] != base_sha  # distillation moved the weights
            # same weights, same 16 held-out countdown-4 problems (rlvr.n_eval = eval.n_test), greedy
            assert m["initial_accuracy"] == _metrics(study / "runs" / start.run_id)["countdown-4_accuracy"]
        else:
            assert m["start_sha256"] == base_sha and m["start_policy"] == "base"


def test_style_runs_measure_adoption_for_the_four_configurations(beyond_study):
    study, profile = beyond_study.study_dir, beyond_study.profile
    cells = style_cells(profile)
    assert {(c.policy, c.kl) for c in cells} == {(p, k) for p in ("off", "on") for k in ("forward", "reverse")}
    for cfg in cells:
        m = _metrics(study / "style" / cfg.run_id)
        assert m["experiment"] == "style" and m["run_id"] == cfg.run_id and m["steps_done"] == 2
        for prefix in ("style_", "base_style_"):
            counts = [m[f"{prefix}{s}"] for s in ("plain", "alt", "none")]
            assert sum(counts) == profile.style.n_test
            styled = counts[0] + counts[1]
            assert m[f"{prefix}styled_share"] == styled / profile.style.n_test
            if styled:
                assert m[f"{prefix}adoption"] == counts[1] / styled
            else:
                assert math.isnan(m[f"{prefix}adoption"])
    (teacher,) = [r for r in json.loads((study / "models.json").read_text()) if r["model"] == "style teacher"]
    assert Path(teacher["path"]).name.startswith("teacher-style-countdown-3-")
    assert 0 <= teacher["instructed_adoption"] <= 1 or math.isnan(teacher["instructed_adoption"])


def test_companion_study_and_report_sections(beyond_study):
    study = beyond_study.study_dir
    (comp,) = json.loads((study / "companions.json").read_text())
    assert comp["name"] == "tiny-beyond-noclip" and comp["overrides"]["distill"] == {"grad_clip": None}
    df = pd.read_parquet(Path(comp["study_dir"]) / "results.parquet")
    assert len(df) == 2 and df["grad_clip"].isna().all() and set(df["policy"]) == {"off", "on"}
    assert not (Path(comp["study_dir"]) / "report.html").exists()  # shown in the main report instead
    html = (study / "report.html").read_text()
    for title in ("Coverage: pass@k curves", "RLVR follow-up", "Incidental style transfer", "Robustness: the companion"):
        assert title in html, title
    for name in ("90_coverage", "91_rlvr", "92_style", "93_robustness"):
        nb = nbformat.read(study / "analysis" / f"{name}.ipynb", as_version=4)
        assert notebook_finished(study / "analysis" / f"{name}.ipynb"), name
        assert not any(o.output_type == "error" for c in nb.cells for o in c.get("outputs", [])), name
    assert (study / "analysis" / "90_coverage" / "equal_pass1.csv").exists()
    assert len(pd.read_csv(study / "analysis" / "91_rlvr" / "rlvr.csv")) == 3
    table = pd.read_csv(study / "analysis" / "93_robustness" / "accuracy.csv")
    assert {"main", "noclip"} <= set(table.columns)


def test_rerun_redoes_only_what_is_missing(beyond_study):
    """Resume semantics: a complete run is never redone; a start run whose student is gone and an
    RLVR run without metrics.json are."""
    study, profile = beyond_study.study_dir, beyond_study.profile
    start = next(s for s in rlvr_starts(profile) if s.run_id)
    import shutil

    shutil.rmtree(study / "runs" / start.run_id / "student")
    (study / "rlvr" / start.job_id / "metrics.json").unlink()
    stamps = {p: p.stat().st_mtime_ns for p in study.glob("*/*/metrics.json")}
    stamps.update({p: p.stat().st_mtime_ns for p in Path(f"{study}-noclip").glob("runs/*/metrics.json")})
    assert run_study(TINY_BEYOND, beyond_study.outputs, workers=1, overrides=FAST, progress=False) == 0
    redone = {p for p, t in stamps.items() if p.stat().st_mtime_ns != t}
    assert redone == {study / "runs" / start.run_id / "metrics.json"}
    assert (study / "runs" / start.run_id / "student" / "config.json").exists()
    assert (study / "rlvr" / start.job_id / "metrics.json").exists()


@pytest.mark.parametrize("name", ["11_rlvr", "90_coverage", "91_rlvr", "92_style", "93_robustness", "94_axes"])
def test_new_notebooks_are_paired_parameterized_and_stored_without_outputs(name):
    import jupytext

    folder = REPO_ROOT / "notebooks"
    nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1
    paired = jupytext.read(folder / f"{name}.py")
    assert [(c.cell_type, c.source) for c in paired.cells] == [(c.cell_type, c.source) for c in nb.cells]


# --------------------------------------------------------------------------------- follow-up tables


def test_robustness_rows_put_sampled_estimators_beside_their_direction(tmp_path):
    from kdlab.analysis.robustness import comparison_rows, robustness_table

    def table(rows, folder):
        folder.mkdir()
        pd.DataFrame(rows).to_parquet(folder / "results.parquet")

    base = {"task": "countdown-3", "lr": 1e-4, "grad_clip": 1.0, "collapsed": False}
    table([{**base, "policy": p, "kl": k, "seed": s, "accuracy": acc + s / 100}
           for p, k, acc in (("off", "forward", 0.5), ("on", "reverse", 0.3)) for s in (0, 1)], tmp_path / "main")
    table([{**base, "policy": "off", "kl": "k3", "sampled_direction": "forward", "seed": 0, "accuracy": 0.4}],
          tmp_path / "main-sf")
    (tmp_path / "main" / "companions.json").write_text(json.dumps(
        [{"suffix": "sf", "name": "main-sf", "study_dir": str(tmp_path / "main-sf"), "overrides": {}},
         {"suffix": "missing", "name": "main-missing", "study_dir": str(tmp_path / "nowhere"), "overrides": {}}]))
    rows = comparison_rows(tmp_path / "main")
    t = robustness_table(rows, "accuracy")
    assert list(t.columns) == ["main", "sf"]  # a companion without results is left out
    assert t.loc[("forward", "off", 1e-4), "main"] == pytest.approx(50.5)  # mean over the two seeds, points
    assert t.loc[("forward", "off", 1e-4), "sf"] == pytest.approx(40.0)  # k3 targeting forward KL
    assert math.isnan(t.loc[("reverse", "on", 1e-4), "sf"])


def test_rlvr_table_summarises_starts_and_flags_missing_signal(tmp_path):
    from kdlab.analysis.followups import load_rlvr, rlvr_table

    for job, policy, lr, rewards in (("base_s0", "base", None, [0.0, 0.0]), ("x_s0", "off", 1e-4, [0.25, 0.75])):
        run = tmp_path / "rlvr" / job
        run.mkdir(parents=True)
        history = [{"step": i, "reward_mean": r, "length": 10.0 + i, "accuracy": None if i == 0 else r,
                    "zero_adv_groups": 1.0 if r == 0 else 0.5} for i, r in enumerate(rewards)]
        (run / "history.json").write_text(json.dumps(history))
        (run / "metrics.json").write_text(json.dumps({
            "task": "countdown-4", "seed": 0, "steps_done": 2, "start_policy": policy, "start_kl": "forward",
            "start_lr": lr, "initial_accuracy": 0.1, "final_accuracy": rewards[-1], "best_accuracy": rewards[-1],
            "final_reward": rewards[-1], "final_length": 11.0, "collapsed": False, "collapse_step": None}))
    summary, history = load_rlvr(tmp_path)
    assert len(history) == 4 and set(history["label"]) == {"base", "off / forward / lr 0.0001"}
    t = rlvr_table(summary)
    assert t.loc["base", "no-signal groups"] == 100.0 and t.loc["off / forward / lr 0.0001", "no-signal groups"] == 50.0
    assert t.loc["off / forward / lr 0.0001", "gain"] == pytest.approx(65.0)  # 75 - 10 points
    assert list(t.index) == ["off / forward / lr 0.0001", "base"]  # best final accuracy first


def test_findings_table_feeds_the_follow_ups_to_the_scoreboard(tmp_path):
    """Findings 11-13 read rlvr_accuracy, style_share and the robustness runs from the table that
    findings_table builds out of the study's rlvr/, style/ and companion studies."""
    from kdlab.analysis.findings import NOT_RUN, finding_11, finding_12, finding_13
    from kdlab.analysis.followups import findings_table
    from kdlab.analysis.synthetic import synthetic_results
    from kdlab.analysis.table import main_grid, prepare_results

    full = synthetic_results(robustness=True, lambdas=())
    full["run_id"] = [f"r{i}" for i in range(len(full))]
    grid = main_grid(full)
    main, robust = full.loc[grid.index], full.drop(index=grid.index)
    study = tmp_path / "study"
    study.mkdir()
    main.to_parquet(study / "results.parquet")
    (tmp_path / "robust").mkdir()
    robust.to_parquet(tmp_path / "robust" / "results.parquet")
    (study / "companions.json").write_text(json.dumps(
        [{"suffix": "robust", "name": "study-robust", "study_dir": str(tmp_path / "robust"), "overrides": {}}]))
    low, high = sorted(main["lr"].unique())
    final = {("off", "forward", low): 0.6, ("on", "reverse", low): 0.2, ("on", "forward", high): 0.4}
    for (policy, kl, lr), acc in final.items():  # one RLVR start per configuration, two RLVR seeds
        start = main[(main.policy == policy) & (main.kl == kl) & (main.lr == lr) & (main.seed == 0)].iloc[0]
        for s, delta in ((0, -0.05), (1, 0.05)):
            run = study / "rlvr" / f"{start.run_id}_s{s}"
            run.mkdir(parents=True)
            (run / "metrics.json").write_text(json.dumps({"start_run": start.run_id, "start_policy": policy,
                                                          "start_kl": kl, "start_lr": lr, "final_accuracy": acc + delta}))
    for policy, kl, share in (("off", "forward", 0.9), ("off", "reverse", 0.8), ("on", "forward", 0.95), ("on", "reverse", 0.1)):
        row = main[(main.policy == policy) & (main.kl == kl) & (main.lr == low) & (main.seed == 0)].iloc[0]
        (study / "style" / row.run_id).mkdir(parents=True)
        (study / "style" / row.run_id / "metrics.json").write_text(json.dumps(
            {"run_id": row.run_id, "policy": policy, "kl": kl, "lr": low, "style_adoption": share}))

    table = findings_table(study, prepare_results(main))
    assert len(table) == len(full) and set(table.loc[table.study == "robust", "run_id"]) == set(robust.run_id)
    assert table["rlvr_accuracy"].notna().sum() == 3
    assert table.loc[table.policy.eq("off") & table.kl.eq("forward") & table.rlvr_accuracy.notna(), "rlvr_accuracy"].item() \
        == pytest.approx(0.6)  # mean over the two RLVR seeds
    assert table["style_share"].notna().sum() == 4
    f11, f12, f13 = finding_11(table), finding_12(table), finding_13(table)
    assert f11.verdict != NOT_RUN and f11.values["off_forward_low"] == pytest.approx(0.6)
    assert f12.verdict != NOT_RUN and f12.values["on_reverse"] == pytest.approx(0.1)
    assert f13.verdict != NOT_RUN and "noclip" in f13.values and "sampled_spread" in f13.values
    # without the follow-ups the scoreboard cannot test them
    assert {finding_11(main).verdict, finding_12(main).verdict} == {NOT_RUN}


def test_style_teacher_steps_override_only_the_step_count():
    from kdlab.study.style_teacher import style_teacher_schedule
    from kdlab.study.teachers import teacher_schedule

    p = load_profile(TINY_BEYOND)
    assert style_teacher_schedule(p) == teacher_schedule(p, p.style.task)
    q = load_profile(TINY_BEYOND, {"style.teacher_steps": 7})
    assert style_teacher_schedule(q) == replace(teacher_schedule(p, p.style.task), steps=7)
