"""Faults of the environment and inside runs (issues 19 and 35): one line and exit 2 for what
stops a command (an outputs root that cannot be written, a corrupt cached or shipped model), a
failed run recorded while the study goes on, whole and valid records for every completed run (an
invalid one is redone and named), GPU faults (out of memory: recorded with the settings to lower,
memory released; a CUDA error that poisons the process: that kernel replaced, the run redone),
one copy of a model two studies build at once, and SIGKILL at random moments (the chaos test).

Faults inside the kernels are planted with a ``sitecustomize`` module on the kernels'
``PYTHONPATH`` (the runner passes its environment on to them): it wraps ``kdlab.study.runs`` so that
one grid cell's kernel dies and another's sparsity comes out NaN.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kdlab.cli import main
from kdlab.study.config import load_profile
from kdlab.study.results import LOCATION_COLUMNS, WALL_TIME_COLUMNS
from kdlab.study.plan import expand_grid
from kdlab.study.runner import run_study
from kdlab.study.plan import _pending, invalid_records, run_is_complete, run_job
from test_study import (FAST, REPO_ROOT, TINY, kill_when, outputs_with_models, set_args,  # noqa: F401
                        tiny_models)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------ outputs root


@pytest.mark.parametrize("cmd", ["study", "teachers"])
def test_an_outputs_root_that_cannot_be_written_is_one_line(tmp_path, capsys, cmd):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for root in ("/sys/kdlab-outputs", str(a_file)):  # sysfs refuses even root; a file is no folder
        rc = main(["--outputs", root, cmd, str(TINY)])
        line = _one_line(capsys.readouterr().err)
        assert rc == 2 and line.startswith(f"kdlab: outputs root {root} cannot be written") and "--outputs" in line
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"] and a_file.read_text() == ""


# ------------------------------------------------------------------------- truncated files


# A whole run record (kdlab.study.records.RUN_METRICS / RUN_HISTORY).
RECORD = {"run_id": "r", "task": "countdown-3", "policy": "off", "lam": -1.0, "kl": "forward", "lr": 1e-4, "seed": 0,
          "dtype": "bf16", "grad_clip": 1.0, "accuracy": 0.5, "base_accuracy": 0.25, "forgetting": -0.01,
          "sparsity": 0.9, "collapsed": False, "wall_s": 3.0}


def test_a_truncated_history_or_metrics_file_makes_the_run_redo(tmp_path):
    profile = load_profile(TINY)
    job = run_job(profile, tmp_path, expand_grid(profile)[0])
    job.out_dir.mkdir(parents=True)
    whole = {"history.json": "[{\"step\": 0, \"loss\": 1.0}]", "metrics.json": json.dumps(RECORD)}
    for name, text in whole.items():
        (job.out_dir / name).write_text(text)
    assert run_is_complete(job.out_dir) and _pending([job]) == [(job, True)]  # (no run.ipynb: shown again)
    for name, text in whole.items():
        (job.out_dir / name).write_text(text[: len(text) // 2])
        assert not run_is_complete(job.out_dir) and _pending([job]) == [(job, False)], name
        (job.out_dir / name).write_text(text)


@pytest.mark.parametrize("metrics,history,needle", [
    ({}, [], "metrics.json: 'run_id' is missing"),
    ([], [], "metrics.json holds list, not an object"),
    ({**RECORD, "accuracy": "0.5"}, [], "metrics.json: 'accuracy' is '0.5', expected a number"),
    ({**RECORD, "seed": 0.5}, [], "metrics.json: 'seed' is 0.5, expected an integer"),
    ({**RECORD, "collapsed": 0}, [], "metrics.json: 'collapsed' is 0, expected true or false"),
    ({**RECORD, "sparsity": None}, [], "metrics.json: 'sparsity' is null, expected a number"),
    (RECORD, {}, "history.json holds dict, not a list"),
    (RECORD, [{"step": 0, "loss": 1.0}, {"loss": 0.5}], "history.json entry 1: 'step' is missing"),
])
def test_a_record_that_parses_but_lacks_what_the_table_reads_makes_the_run_redo(tmp_path, metrics, history, needle):
    """Issue 35: `{}` (and any record without the fields and types of kdlab.study.records) is not complete."""
    profile = load_profile(TINY)
    job = run_job(profile, tmp_path, expand_grid(profile)[0])
    job.out_dir.mkdir(parents=True)
    (job.out_dir / "metrics.json").write_text(json.dumps(metrics))
    (job.out_dir / "history.json").write_text(json.dumps(history))
    assert not run_is_complete(job.out_dir) and _pending([job]) == [(job, False)]
    [(named, problems)] = invalid_records([job])
    assert named is job and needle in problems, problems


# ------------------------------------------------------------------------ faults inside runs

# Planted in every kernel: off/reverse kills its kernel, on/forward measures a NaN sparsity.
FAULTS = """
import os
import kdlab.study.runs as R

_run, _sparsity, _cell = R.execute_run, R.update_sparsity, {}


def execute_run(contract, *args, **kwargs):
    _cell["now"] = (contract.run.policy, contract.run.kl)
    return _run(contract, *args, **kwargs)


def update_sparsity(*args, **kwargs):
    if _cell.get("now") == ("off", "reverse"):
        os._exit(1)
    return float("nan") if _cell.get("now") == ("on", "forward") else _sparsity(*args, **kwargs)


R.execute_run, R.update_sparsity = execute_run, update_sparsity
"""


def test_faults_inside_runs_are_recorded_and_the_study_goes_on(tiny_models, tmp_path, monkeypatch, capsys):
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(FAULTS)
    monkeypatch.setenv("PYTHONPATH", str(plant))
    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    sets = {**FAST, "grid.lrs": [1e-4]}  # off/on x forward/reverse
    runs = outputs / "tiny" / "runs"
    ids = {(c.policy, c.kl): c.run_id for c in expand_grid(load_profile(TINY, sets))}
    runs.mkdir(parents=True)
    (runs / ids["off", "forward"]).write_text("a file where the run directory belongs")

    rc = run_study(TINY, outputs, workers=1, overrides=sets, progress=False)
    out = capsys.readouterr().out
    assert rc == 1
    assert "3 run(s) failed:" in out
    for cell, ename in [(("off", "forward"), "NotADirectoryError"), (("on", "forward"), "NonFiniteMetrics"),
                        (("off", "reverse"), "DeadKernelError")]:
        assert f"  {ids[cell]}: {ename}: " in out, (cell, out)
    assert "cannot be written" in out and "'sparsity' is nan, not a finite number" in out
    nan_run = runs / ids["on", "forward"]
    assert not (nan_run / "metrics.json").exists() and (nan_run / "metrics.nonfinite.json").exists()
    assert json.loads((nan_run / "error.json").read_text())["ename"] == "NonFiniteMetrics"
    assert json.loads((runs / ids["off", "reverse"] / "error.json").read_text())["ename"] == "DeadKernelError"
    # the fourth run, after the dead kernel was replaced, completed; the report shows it
    assert pd.read_parquet(outputs / "tiny" / "results.parquet")["run_id"].tolist() == [ids["on", "reverse"]]
    assert (outputs / "tiny" / "report.html").exists()


# ------------------------------------------------------------------------------ GPU faults

# Planted in every kernel (issue 35), each fault once (a marker file): off/reverse runs out of GPU
# memory holding a stand-in for its tensors (a finalizer logs when it is collected; torch.cuda
# reports an initialised context until empty_cache is called, which logs); on/forward hits a
# device-side assert. $KDLAB_FAULT_LOG gets "<event> <cell or what> <kernel pid>" lines.
GPU_FAULTS = """
import os
import weakref
from pathlib import Path

import torch
import kdlab.study.runs as R

_run = R.execute_run
LOG = Path(os.environ["KDLAB_FAULT_LOG"])


class Tensors:
    pass


def log(*words):
    with open(LOG, "a") as f:
        f.write(" ".join(str(w) for w in (*words, os.getpid())) + "\\n")


def once(name):
    marker = LOG.parent / name
    if marker.exists():
        return False
    marker.write_text("")
    return True


def execute_run(contract, *args, **kwargs):
    cell = f"{contract.run.policy}/{contract.run.kl}"
    log("start", cell)
    if cell == "off/reverse" and once("oom"):
        tensors = Tensors()
        weakref.finalize(tensors, log, "collected", cell)
        initialised, empty = torch.cuda.is_initialized, torch.cuda.empty_cache

        def empty_cache():
            log("empty_cache", cell)
            torch.cuda.is_initialized, torch.cuda.empty_cache = initialised, empty

        torch.cuda.is_initialized, torch.cuda.empty_cache = (lambda: True), empty_cache
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
    if cell == "on/forward" and once("assert"):
        raise torch.AcceleratorError("CUDA error: device-side assert triggered (simulated)")
    return _run(contract, *args, **kwargs)


R.execute_run = execute_run
"""


def test_gpu_faults_and_an_invalid_record(tiny_models, tmp_path, monkeypatch, capsys):
    """Out of GPU memory: recorded with the settings to lower, the run's memory released before the
    next run, which goes on in the same kernel. A device-side assert: that kernel replaced, the run
    redone in the fresh one. Then a rerun: the OOM run is done, and a record emptied to ``{}`` is
    redone and named; the table has every run."""
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(GPU_FAULTS)
    log = tmp_path / "faults.log"
    monkeypatch.setenv("PYTHONPATH", str(plant))
    monkeypatch.setenv("KDLAB_FAULT_LOG", str(log))
    outputs = outputs_with_models(tmp_path / "out", tiny_models)
    sets = {**FAST, "grid.lrs": [1e-4]}  # off/forward, on/forward, off/reverse, on/reverse (schedule order)
    ids = {f"{c.policy}/{c.kl}": c.run_id for c in expand_grid(load_profile(TINY, sets))}
    runs = outputs / "tiny" / "runs"

    rc = run_study(TINY, outputs, workers=1, overrides=sets, progress=False)
    out = capsys.readouterr().out
    events = [line.split() for line in log.read_text().splitlines()]
    assert rc == 1 and "1 run(s) failed:" in out, out
    # out of memory: recorded with the reason and the settings to lower, with the run's values
    err = json.loads((runs / ids["off/reverse"] / "error.json").read_text())
    assert err["ename"] == "OutOfMemoryError" and "CUDA out of memory" in err["evalue"]
    for needle in ("out of GPU memory", "pretrained.micro_batch_size", "now 0, the whole batch of 8",
                   "pretrained.kl_chunk_size", "now 0, off"):
        assert needle in err["remedy"] and needle in out, needle
    # its memory released before the next run started, in the same kernel
    oom_pid = next(pid for e, cell, pid in events if e == "start" and cell == "off/reverse")
    after = [(e, cell) for e, cell, pid in events[events.index(["start", "off/reverse", oom_pid]) + 1:]]
    assert after[:3] == [("collected", "off/reverse"), ("empty_cache", "off/reverse"), ("start", "on/reverse")], events
    assert [pid for e, cell, pid in events if cell == "on/reverse"] == [oom_pid]
    # the device-side assert: a fresh kernel (another process) redid the run, which completed
    starts = [(cell, pid) for e, cell, pid in events if e == "start" and cell == "on/forward"]
    assert len(starts) == 2 and starts[0][1] != starts[1][1], events
    assert run_is_complete(runs / ids["on/forward"]) and not (runs / ids["on/forward"] / "error.json").exists()
    assert f"1 run(s) redone:\n  {ids['on/forward']}: AcceleratorError: CUDA error: device-side assert" in out, out
    timing = json.loads((outputs / "tiny" / "timing.json").read_text())
    assert "device-side assert" in timing["runs"][ids["on/forward"]]["redone"]

    (runs / ids["on/reverse"] / "metrics.json").write_text("{}")  # parses, holds nothing
    before = (runs / ids["off/forward"] / "metrics.json").stat().st_mtime_ns
    assert run_study(TINY, outputs, workers=1, overrides=sets, progress=False) == 0
    out = capsys.readouterr().out
    assert (f"1 recorded run(s) redone, their record is not what the results table reads: "
            f"{ids['on/reverse']} (metrics.json: 'run_id' is missing)") in out, out
    assert f"  {ids['on/reverse']}: its record was not what the results table reads" in out
    assert "study tiny: 4/4 runs complete" in out
    assert (runs / ids["off/forward"] / "metrics.json").stat().st_mtime_ns == before  # complete: not redone
    df = pd.read_parquet(outputs / "tiny" / "results.parquet")
    assert sorted(df["run_id"]) == sorted(ids.values()) and df["accuracy"].notna().all()


# ------------------------------------------------------------------------- corrupt models


def _flip_a_byte(path) -> tuple[str, str]:
    """Flip one byte in the middle of ``path``; (sha256 before, after)."""
    from kdlab.models.toy import file_sha256

    before = file_sha256(path)
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    return before, file_sha256(path)


def test_a_corrupt_cached_model_is_refused_before_any_work(tiny_models, tmp_path, capsys):
    import shutil

    from kdlab.core.faults import CorruptCheckpoint
    from kdlab.models.toy import load_checkpoint

    outputs = tmp_path / "out"
    shutil.copytree(tiny_models, outputs / "models", symlinks=True)
    teacher = next((outputs / "models").glob("teacher-countdown-3-*"))
    recorded, now = _flip_a_byte(teacher / "model.safetensors")
    for argv in (["study", str(TINY), "--workers", "1"], ["distill", str(TINY)], ["teachers", str(TINY)]):
        rc = main(["--outputs", str(outputs), *argv])
        line = _one_line(capsys.readouterr().err)
        assert rc == 2, argv
        assert str(teacher / "model.safetensors") in line and recorded in line and now in line, line
        assert f"remove {teacher} and run `kdlab teachers {TINY}`" in line
        assert sorted(p.name for p in outputs.iterdir()) == ["models"]  # no params.yaml, nothing
    with pytest.raises(CorruptCheckpoint, match=now):  # and every load checks it
        load_checkpoint(teacher)


def test_a_corrupt_shipped_model_is_refused_with_the_command_that_restores_it(tmp_path, capsys, monkeypatch):
    import shutil

    import kdlab.study.teachers as teachers

    shipped = tmp_path / "checkpoints"
    shutil.copytree(teachers.SHIPPED_DIR, shipped)
    monkeypatch.setattr(teachers, "SHIPPED_DIR", shipped)
    quick = TINY.parent / "quick.yaml"
    # The shipped folder holds more than one countdown-3 teacher (the beyond search companion's
    # too): corrupt the one the quick profile uses, named the way the model store names it.
    profile = load_profile(quick)
    path = next(p for role, *_, p in teachers._planned(profile, teachers.ModelStore(tmp_path)) if role == "teacher-countdown-3")
    teacher = shipped / path.name
    recorded = json.loads((shipped / "MANIFEST.json").read_text())[teacher.name]
    _flip_a_byte(teacher / "model.safetensors.xz")  # shipped weights are packed (xz, with its own check)
    rc = main(["--outputs", str(tmp_path / "out"), "study", str(quick)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and str(teacher / "model.safetensors.xz") in line and recorded in line and "unreadable" in line
    assert f"`git restore checkpoints/{teacher.name}`" in line and f"`kdlab teachers {quick} --rebuild`" in line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ concurrent model store

# Planted in every process: each model training appends its name to $KDLAB_TRAINED.
COUNT_TRAINING = """
import os
import kdlab.study.teachers as T

_sft = T.sft


def sft(*args, desc="", **kwargs):
    with open(os.environ["KDLAB_TRAINED"], "a") as f:
        f.write(desc + "\\n")
    return _sft(*args, desc=desc, **kwargs)


T.sft = sft
"""


def _kdlab(argv: list[str], log: Path, **env: str) -> subprocess.Popen:
    """``kdlab ARGV`` in a subprocess of its own session, output to ``log``; ``env`` added."""
    path = os.pathsep.join([*env.pop("PYTHONPATH", "").split(os.pathsep), str(REPO_ROOT / "src")])
    return subprocess.Popen([sys.executable, "-m", "kdlab", *argv], cwd=log.parent, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **env, "PYTHONPATH": path.strip(os.pathsep)})


def test_two_studies_building_the_same_models_at_once_end_with_one_good_copy(tmp_path):
    from kdlab.models.toy import checkpoint_meta, verify_weights

    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(COUNT_TRAINING)
    trained, outputs = tmp_path / "trained.txt", tmp_path / "out"
    sets = {**FAST, "grid.policies": ["on"], "grid.kls": ["forward"], "grid.lrs": [1e-4]}
    procs = {name: _kdlab(["--outputs", str(outputs), "study", str(TINY), "--workers", "1", "--quiet",
                           *set_args({**sets, "name": name})], tmp_path / f"{name}.log",
                          PYTHONPATH=str(plant), KDLAB_TRAINED=str(trained))
             for name in ("a", "b")}
    for name, proc in procs.items():
        assert proc.wait(timeout=1200) == 0, (tmp_path / f"{name}.log").read_text()
    assert sorted(trained.read_text().split()) == ["student", "teacher-countdown-3", "train", "train"]  # once each
    said = [line for name in procs for line in (tmp_path / f"{name}.log").read_text().splitlines()
            if line.startswith("models: 2 neither shipped nor cached, trained first: student-")]
    assert said and "teacher-countdown-3-" in said[0] and "steps)" in said[0]  # announced before the build
    store = outputs / "models"
    models = [p for p in store.iterdir() if not (p.name.startswith(".") and p.name.endswith(".lock"))]
    assert sorted(p.name.rsplit("-", 1)[0] for p in models) == ["student", "teacher-countdown-3"]  # nothing else
    for path in models:
        verify_weights(path)
    ids = {checkpoint_meta(p)["sha256"] for p in models}
    for name in procs:
        df = pd.read_parquet(outputs / name / "results.parquet")
        assert set(df["student_id"]) | set(df["teacher_id"]) == ids


# --------------------------------------------------------------------------------- chaos


def test_chaos_sigkill_during_models_grid_and_report_then_rerun_equals_an_uninterrupted_study(tmp_path, capsys):
    """SIGKILL at seeded random moments: while the models are built (a fresh store), after a
    random number of runs (one run's history.json is then truncated: that run is redone), and
    while the report is written; the same command then finishes the study, and its results
    table equals an uninterrupted study's (another name, the same models) on every column but
    the wall times and model locations."""
    rng = random.Random(19)
    outputs = tmp_path / "out"
    sets = {**FAST, "grid.kls": ["forward"], "grid.lrs": [1e-4], "grid.lambdas": [0.5]}  # off, on, lambda +0.5
    argv = ["--outputs", str(outputs), "study", str(TINY), "--workers", "1", "--quiet", *set_args(sets)]
    study = outputs / "tiny"

    def after(exists, delay: float):
        seen: list[float] = []

        def ready() -> bool:
            if not seen and exists():
                seen.append(time.monotonic())
            return bool(seen) and time.monotonic() > seen[0] + delay
        return ready

    kill_when(argv, tmp_path, after(lambda: (study / "teachers" / "00_teachers.ipynb").exists(), rng.uniform(0, 3)),
              "the model build", limit_s=1800)
    done = rng.randint(1, 2)
    kill_when(argv, tmp_path, lambda: len(list(study.glob("runs/*/metrics.json"))) >= done, f"run {done}",
              limit_s=1800)
    first = sorted(study.glob("runs/*/history.json"))[0]
    first.write_text(first.read_text()[:10])  # truncated: that run is redone
    kill_when(argv, tmp_path, after(lambda: (study / "grid.ipynb").exists(), rng.uniform(0, 3)), "the report",
              limit_s=1800)

    assert main(argv) == 0  # the same command again
    assert json.loads(first.read_text())  # whole again
    assert main([*argv[:2], "study", str(TINY), "--workers", "1", "--quiet", *set_args({**sets, "name": "clean"})]) == 0
    capsys.readouterr()
    chaos, clean = (pd.read_parquet(outputs / name / "results.parquet") for name in ("tiny", "clean"))
    assert len(chaos) == 3
    drop = [c for c in WALL_TIME_COLUMNS + LOCATION_COLUMNS if c in chaos.columns]
    pd.testing.assert_frame_equal(chaos.drop(columns=drop), clean.drop(columns=drop))
    assert (study / "report.html").exists()
