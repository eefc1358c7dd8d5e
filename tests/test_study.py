"""Tests for the study runner (kdlab.study): grid expansion, parameter errors, parallel workers,
failure recording and finishing a study after SIGKILL.

The end-to-end tests share one set of tiny models (built once per session, ~1 min) and one clean
two-worker study of the tiny profile (the ``full_study`` fixture, also used by
tests/test_notebooks.py). Runs are shrunk with overrides (2 distillation steps, 1 torch thread).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import nbformat
import pandas as pd
import pytest

from kdlab.cli import main
from kdlab.study.config import ConfigError, load_profile
from kdlab.study.results import LOCATION_COLUMNS, REQUIRED_COLUMNS, WALL_TIME_COLUMNS
from kdlab.study.plan import expand_grid, notebook_finished
from kdlab.study.runner import run_study
from kdlab.study.plan import analysis_lanes
from kdlab.study.teachers import model_paths

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = REPO_ROOT / "params" / "tiny.yaml"
FAST = {"distill.steps": 2, "threads": 1}
# The clean study: the tiny grid (off/on x forward/reverse x 2 lrs, seed 0) + lambda = +0.5;
# lambda = -1 and +1 are the off and on runs and must not be repeated: 8 + 4 runs.
FULL = {**FAST, "grid.lambdas": [-1.0, 0.5, 1.0]}
FULL_RUNS = 12
_SESSION: dict[str, Any] = {}  # session objects, shared with test_notebooks.py (which imports them)


def ensure_kernel() -> None:
    """The study notebooks run in the Jupyter kernel 'python3'; install this venv's if missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"], check=True)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> Path:
    """The tiny profile's student base and teacher, trained once for the whole session."""
    if "models" not in _SESSION:
        ensure_kernel()
        root = tmp_path_factory.getbasetemp() / "kdlab-models"
        model_paths(load_profile(TINY), root, progress=False)
        _SESSION["models"] = root
    return _SESSION["models"]


def outputs_with_models(root: Path, models: Path) -> Path:
    """A fresh outputs root whose models/ is the session's model store (caches stay private)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "models").symlink_to(models, target_is_directory=True)
    return root


@pytest.fixture(scope="session")
def full_study(tiny_models, tmp_path_factory) -> SimpleNamespace:
    """One clean study of the tiny profile with two workers (``FULL`` overrides)."""
    if "full" not in _SESSION:
        outputs = outputs_with_models(tmp_path_factory.getbasetemp() / "full-study", tiny_models)
        t0 = time.perf_counter()
        rc = run_study(TINY, outputs, workers=2, overrides=FULL, progress=False)
        _SESSION["full"] = SimpleNamespace(rc=rc, outputs=outputs, study_dir=outputs / "tiny",
                                           seconds=time.perf_counter() - t0)
    return _SESSION["full"]


def set_args(overrides: dict[str, Any]) -> list[str]:
    """``--set key=value`` arguments (JSON is valid YAML) for the kdlab command line."""
    return [arg for k, v in overrides.items() for arg in ("--set", f"{k}={json.dumps(v)}")]


# ------------------------------------------------------------------------------- grid expansion


def test_expand_grid_crosses_the_factors_and_does_not_repeat_lambda_ends():
    profile = load_profile(TINY, {"grid.lambdas": [-1.0, 0.0, -0.0, 0.5, 1.0], "grid.seeds": [0, 3]})
    cells = expand_grid(profile)
    ids = [c.run_id for c in cells]
    assert len(ids) == len(set(ids))
    core = [c for c in cells if c.policy in ("off", "on")]
    spectrum = [c for c in cells if c.policy == "lambda"]
    # 1 task x 2 policies x 2 kls x 2 lrs x 2 seeds; lambdas 0 (= -0) and 0.5 x 2 kls x 2 lrs x 2 seeds
    assert len(core) == 16 and len(spectrum) == 16
    assert {(c.policy, c.lam) for c in core} == {("off", -1.0), ("on", 1.0)}
    assert sorted({c.lam for c in spectrum}) == [0.0, 0.5]
    assert "countdown-3_lam+0_forward_lr0.0001_s3" in ids
    assert not any("lam-0" in i or "lam+1" in i or "lam-1" in i for i in ids)
    assert {(c.kl, c.lr, c.seed) for c in core} == {(k, lr, s) for k in ("forward", "reverse")
                                                    for lr in (1e-4, 5e-4) for s in (0, 3)}
    assert all(c.steps == profile.distill.steps and c.batch_size == profile.distill.batch_size for c in cells)


def test_expand_grid_adds_lambda_ends_missing_from_the_policy_grid():
    # Only on-policy in the main grid: lambda = -1 on the spectrum is then the (new) off run.
    profile = load_profile(TINY, {"grid.policies": ["on"], "grid.kls": ["forward"], "grid.lrs": [1e-4],
                                  "grid.lambdas": [-1.0, 1.0]})
    assert [(c.policy, c.lam) for c in expand_grid(profile)] == [("on", 1.0), ("off", -1.0)]


def test_analysis_lanes_keep_a_notebook_after_what_it_reads():
    names = ["40_teaching_kl.ipynb", "50_gradients.ipynb", "60_spectrum.ipynb", "70_statistics.ipynb",
             "80_explorer.ipynb", "90_coverage.ipynb", "91_rlvr.ipynb"]
    assert analysis_lanes(names, 1) == [names]
    assert analysis_lanes(names, 2) == [["50_gradients.ipynb", "70_statistics.ipynb"],
                                        ["40_teaching_kl.ipynb", "60_spectrum.ipynb", "80_explorer.ipynb",
                                         "90_coverage.ipynb", "91_rlvr.ipynb"]]
    three = analysis_lanes(names, 3)
    assert three[0] == ["50_gradients.ipynb", "70_statistics.ipynb"] and sorted(sum(three, [])) == sorted(names)
    assert [len(lane) for lane in three[1:]] == [3, 2]
    assert analysis_lanes(["40_teaching_kl.ipynb"], 2) == [["40_teaching_kl.ipynb"]]


def test_embedded_default_profile_is_a_valid_controlled_grid():
    profile = load_profile(REPO_ROOT / "params" / "quick.yaml")  # (model sizes and budgets are calibrated)
    assert (profile.name, profile.student.family, profile.teacher.family) == ("quick", "llama", "llama")
    cells = expand_grid(profile)
    # the paper's main grid in miniature: its three target tasks, each with its own teacher
    tasks = ("countdown-3", "kb-mc", "rules-mc")
    assert len(cells) == 72 and {c.task for c in cells} == set(tasks)  # x the paper's three seeds
    rates = {t: [profile.grid.rate(t, lr) for lr in sorted(profile.grid.lrs)] for t in tasks}  # grid.task_lrs
    for low, high in rates.values():
        assert high / low == pytest.approx(5.0)  # the paper's ratio between the high and the low rate, per task
    assert {(c.task, c.policy, c.kl, c.lr, c.seed) for c in cells} == {
        (t, p, k, lr, s) for t in tasks for p in ("off", "on") for k in ("forward", "reverse")
        for lr in rates[t] for s in (0, 1, 2)}
    # the paper's training details (docs/calibration.md 15): teacher 0.5 / student 1.0, 10 warm-up steps, fused AdamW
    d = profile.distill
    assert (d.teacher_temperature, d.student_temperature, d.warmup, d.fused_adamw, d.batch_size) == (0.5, 1.0, 10, True, 32)


# ----------------------------------------------------------------------------- parameter errors


@pytest.mark.parametrize("setting, named", [
    ("distill.stepz=3", "distill.stepz"),
    ("grid.kls=[forward, sideways]", "grid.kls"),
    ("distill.steps=0", "distill.steps"),
    ("eval.n_test=many", "eval.n_test"),
    ("name=../elsewhere", "name"),
])
def test_invalid_parameters_fail_before_any_work(tmp_path, capsys, setting, named):
    rc = main(["--outputs", str(tmp_path), "study", str(TINY), "--workers", "1", "--set", setting])
    err = capsys.readouterr().err
    assert rc == 2
    assert named in err and "invalid parameters" in err
    assert list(tmp_path.iterdir()) == []  # nothing written, no kernel started


def test_empty_grid_and_bad_workers_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="grid"):
        run_study(TINY, tmp_path, workers=1, overrides={"grid.tasks": [], "grid.lambdas": []})
    with pytest.raises(ValueError, match="workers"):
        run_study(TINY, tmp_path, workers=0)
    assert list(tmp_path.iterdir()) == []


def test_rerun_with_other_settings_is_refused(full_study):
    with pytest.raises(ConfigError, match="distill.steps"):
        run_study(TINY, full_study.outputs, workers=1, overrides={**FULL, "distill.steps": 3}, progress=False)


# ------------------------------------------------------------------------------------ parallel


def _notebook_span(path: Path) -> tuple[datetime, datetime]:
    meta = json.loads(path.read_text())["metadata"]["papermill"]
    return datetime.fromisoformat(meta["start_time"]), datetime.fromisoformat(meta["end_time"])


def test_parallel_workers_run_the_whole_grid(full_study):
    assert full_study.rc == 0
    study = full_study.study_dir
    timing = json.loads((study / "timing.json").read_text())
    (inv,) = timing["invocations"]
    assert inv["workers"] == 2 and inv["threads_per_worker"] == 1
    assert inv["runs_done"] == FULL_RUNS and inv["runs_failed"] == 0
    cells = expand_grid(load_profile(TINY, FULL))
    assert len(cells) == FULL_RUNS and set(timing["runs"]) == {c.run_id for c in cells}
    by_worker: dict[int, list[str]] = {}
    for run_id, entry in timing["runs"].items():
        by_worker.setdefault(entry["worker"], []).append(run_id)
        # notebook overhead = notebook wall time - the run's own wall time
        assert entry["overhead_s"] == pytest.approx(entry["notebook_s"] - entry["wall_s"], abs=2e-3)
        assert 0 < entry["overhead_s"] < entry["notebook_s"]
    assert set(by_worker) == {0, 1}
    # The two kernels really ran at the same time: some run of worker 0 overlaps one of worker 1.
    spans = {w: [_notebook_span(study / "runs" / r / "run.ipynb") for r in ids] for w, ids in by_worker.items()}
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans[0] for b0, b1 in spans[1])
    assert (study / "logs" / "kernel-0.log").exists() and (study / "logs" / "kernel-1.log").exists()
    # The analysis notebooks ran on both kernels: 70 after 50 (it reads 50's bound.csv), the others beside them.
    span = {nb: _notebook_span(study / "analysis" / f"{nb}.ipynb")
            for nb in ("40_teaching_kl", "50_gradients", "60_spectrum", "70_statistics")}
    assert span["50_gradients"][1] <= span["70_statistics"][0]
    assert any(span[a][0] < span[b][1] and span[b][0] < span[a][1]
               for a in ("50_gradients", "70_statistics") for b in ("40_teaching_kl", "60_spectrum"))


# ----------------------------------------------------------------------------------- failures


def test_failed_run_is_recorded_and_the_study_goes_on(tiny_models, tmp_path, capsys):
    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    # A file where the OffPD rollout cache directory belongs: off-policy runs fail for real when
    # they store their teacher rollouts; on-policy runs never touch that cache.
    (outputs / "cache").mkdir()
    (outputs / "cache" / "offpd").write_text("not a directory")
    sets = {**FAST, "grid.kls": ["forward"], "grid.lrs": [1e-4]}
    rc = run_study(TINY, outputs, workers=1, overrides=sets, progress=True)
    captured = capsys.readouterr()
    study = outputs / "tiny"
    off, on = study / "runs" / "countdown-3_off_forward_lr0.0001_s0", study / "runs" / "countdown-3_on_forward_lr0.0001_s0"
    assert rc == 1
    assert "1 run(s) failed" in captured.out and off.name in captured.out and "FileExistsError" in captured.out
    assert "failed=1" in captured.err  # the progress bar counts failures

    err = json.loads((off / "error.json").read_text())
    assert err["ename"] == "FileExistsError" and err["run_id"] == off.name
    assert not (off / "metrics.json").exists()
    nb = nbformat.read(off / "run.ipynb", as_version=4)  # the partial executed notebook is kept
    failing = nb.cells[err["cell_index"]]
    assert failing.source == err["source"] and "execute_run(" in failing.source
    assert [o.ename for o in failing.outputs if o.output_type == "error"] == ["FileExistsError"]
    assert all(not c.get("outputs") for c in nb.cells[err["cell_index"] + 1:])  # nothing ran after it
    assert json.loads((study / "timing.json").read_text())["runs"][off.name]["error"] == "FileExistsError"

    # collect and report still ran, on what succeeded
    assert (on / "metrics.json").exists() and notebook_finished(on / "run.ipynb")
    assert pd.read_parquet(study / "results.parquet")["run_id"].tolist() == [on.name]
    html = (study / "report.html").read_text()
    assert "Accuracy by policy" in html and off.name in html  # the report lists the failed run


# ------------------------------------------------------------------------------------- resume


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the study's process group and every descendant (its kernels run in their own
    sessions, so the group alone would miss them)."""
    import psutil

    parent = psutil.Process(proc.pid)
    family = [parent] + parent.children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)
    psutil.wait_procs(family, timeout=30)


def kill_when(argv: list[str], tmp_path: Path, ready, what: str = "the moment to kill", limit_s: float = 240) -> None:
    """Start ``kdlab ARGV`` in its own session and SIGKILL it (kernels included) as soon as
    ``ready()`` is true (it must come, within ``limit_s``, before the command ends)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kdlab", *argv], cwd=tmp_path, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + limit_s
            while not ready():
                assert proc.poll() is None, f"ended before {what}:\n" + (tmp_path / "killed.log").read_text()
                assert time.monotonic() < deadline, f"{what} did not come in time"
                time.sleep(0.02)
        finally:
            _kill_tree(proc)


def kill_after_first_run(argv: list[str], study: Path, tmp_path: Path) -> None:
    """``kill_when`` the first run of ``study`` has written its metrics.json."""
    kill_when(argv, tmp_path, lambda: bool(list(study.glob("runs/*/metrics.json"))), "the first run's end")


def test_study_killed_after_its_first_run_finishes_on_rerun(tiny_models, full_study, tmp_path, capsys):
    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    # Three cells of the clean study: off, on and lambda=+0.5 (forward KL, low lr).
    sets = {**FAST, "grid.kls": ["forward"], "grid.lrs": [1e-4], "grid.lambdas": [0.5]}
    argv = ["--outputs", str(outputs), "study", str(TINY), "--workers", "1", "--quiet", *set_args(sets)]
    study = outputs / "tiny"
    kill_after_first_run(argv, study, tmp_path)
    before = {p.parent.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in study.glob("runs/*/metrics.json")}
    assert 1 <= len(before) < 3

    assert main(argv) == 0  # the same command again
    out = capsys.readouterr().out
    assert f"({len(before)} already complete" in out
    cells = [c.run_id for c in expand_grid(load_profile(TINY, sets))]
    for run_id, (mtime, blob) in before.items():  # completed runs were not redone
        path = study / "runs" / run_id / "metrics.json"
        assert path.stat().st_mtime_ns == mtime and path.read_bytes() == blob
    for run_id in cells:  # and every run has its whole executed notebook
        assert notebook_finished(study / "runs" / run_id / "run.ipynb")
        assert not (study / "runs" / run_id / "error.json").exists()

    resumed = pd.read_parquet(study / "results.parquet")
    clean = pd.read_parquet(full_study.study_dir / "results.parquet")
    assert resumed["run_id"].tolist() == sorted(cells)
    clean = clean[clean["run_id"].isin(cells)].reset_index(drop=True)
    drop = [c for c in WALL_TIME_COLUMNS + LOCATION_COLUMNS if c in resumed.columns]
    assert set(REQUIRED_COLUMNS) <= set(resumed.columns)
    pd.testing.assert_frame_equal(resumed.drop(columns=drop), clean.drop(columns=drop))


# ------------------------------------------------------------------------------------- Ray


def test_runs_on_a_local_ray_cluster_with_the_same_failure_and_resume_semantics(tiny_models, tmp_path):
    """`kdlab study --ray-address local`: each cell is a Ray task executing the run notebook with
    papermill; a failing cell is recorded and the study goes on; a rerun skips complete runs."""
    pytest.importorskip("ray", reason="ray is not installed (pip install -e .[dev])")
    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    (outputs / "cache").mkdir()
    (outputs / "cache" / "offpd").write_text("not a directory")  # off-policy runs fail for real
    sets = {**FAST, "grid.kls": ["forward"], "grid.lrs": [1e-4]}
    rc = run_study(TINY, outputs, workers=1, overrides=sets, progress=False, ray_address="local", gpus_per_run=0)
    study = outputs / "tiny"
    off, on = study / "runs" / "countdown-3_off_forward_lr0.0001_s0", study / "runs" / "countdown-3_on_forward_lr0.0001_s0"
    assert rc == 1
    assert (on / "metrics.json").exists() and notebook_finished(on / "run.ipynb")
    assert (off / "error.json").exists() and not (off / "metrics.json").exists()
    assert pd.read_parquet(study / "results.parquet")["run_id"].tolist() == [on.name]
    # repair and rerun: only the failed run is redone
    (outputs / "cache" / "offpd").unlink()
    mtime = (on / "metrics.json").stat().st_mtime_ns
    rc = run_study(TINY, outputs, workers=1, overrides=sets, progress=False, ray_address="local", gpus_per_run=0)
    assert rc == 0 and (off / "metrics.json").exists()
    assert (on / "metrics.json").stat().st_mtime_ns == mtime
    assert sorted(pd.read_parquet(study / "results.parquet")["run_id"]) == sorted([off.name, on.name])


def test_a_process_loads_its_models_once_and_every_run_gets_a_fresh_student(tiny_models, tmp_path, monkeypatch):
    """A warm worker serves run after run: the teacher and the student base are loaded from disk
    once per process (``materials.RESIDENT``) and each run trains its own copy of the base, so a
    run's record is the one it has when it loads everything itself (first in a fresh process)."""
    from kdlab.study import materials
    from kdlab.study.contract import contract_for, run_config
    from kdlab.study.runs import execute_run

    profile = load_profile(TINY, FAST)
    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    loads = []
    real_load = materials.load_model
    monkeypatch.setattr(materials, "load_model", lambda p, path, *a, **k: loads.append(Path(path).name)
                        or real_load(p, path, *a, **k))
    monkeypatch.setattr(materials, "RESIDENT", materials._Resident())
    cells = [dict(task="countdown-3", policy="off", kl="forward", lr=profile.grid.lrs[0], seed=0),
             dict(task="countdown-3", policy="on", kl="reverse", lr=profile.grid.lrs[0], seed=0)]

    def record(cell, where):
        contract = contract_for(profile, run_config(profile, **cell), outputs, out_dir=tmp_path / where)
        m = execute_run(contract, progress=False)
        return {k: m[k] for k in ("accuracy", "probe_mean", "forgetting", "sparsity")}, m

    first, _ = record(cells[0], "a")
    second, _ = record(cells[1], "b")
    again, _ = record(cells[0], "c")  # the base was trained by the runs before: its copy must not be
    # three runs: the teacher and the run's student base loaded once, plus the base's own evaluation
    # (once per base and task, then read from its cache file)
    paths = model_paths(profile, outputs / "models", progress=False)
    assert sorted(loads) == sorted([paths["student"].name, paths["student"].name, paths["countdown-3"].name])
    assert again == first
    monkeypatch.setattr(materials, "RESIDENT", materials._Resident())  # a fresh process
    alone, _ = record(cells[1], "d")
    assert alone == second and len(loads) == 5
