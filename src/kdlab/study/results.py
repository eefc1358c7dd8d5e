"""A study's results table and the summaries its report shows.

``collect`` reads every complete ``runs/<run_id>/metrics.json`` of a study directory (its fields
and types checked against ``kdlab.study.records``) into one row per run;
``write_results`` stores that table as ``results.parquet``. The other functions turn the table
into the report's tables: mean ± std over seeds per grid cell, forgetting and sparsity by
learning rate, base vs teacher vs distilled, the toy-regime acceptance checks and the wall time
per phase. Notebooks call these; no metric or table logic lives in a notebook.

Learning rates: ``lr`` is the grid's rate (a ``grid.lrs`` entry: the low or the high one), which
every table and test groups by; ``lr_run`` is the rate the run trained at, which differs from
``lr`` for a task that ``grid.task_lrs`` gives rates of its own (``task_rates`` lists them).

Units: ``accuracy``, ``pass_at_*``, ``probe_*``, ``forgetting*`` and ``sparsity`` are fractions
in the table (``forgetting`` is a difference of fractions, in [-1, 1]); summaries report them in
percentage points (x100) unless ``scale`` says otherwise. Times are seconds.
"""
from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.atomic import write_atomic
from .records import columns, metrics_problems

# Columns every results table has: the fields of a run's record (kdlab.study.records.RUN_METRICS), NaN
# where a run did not measure one (pass_at_10 when eval.pass_n < 10).
REQUIRED_COLUMNS = columns("run")
# Columns that measure time, and so differ between two runs of the same cell.
WALL_TIME_COLUMNS = ("wall_s", "time_rollout_s", "time_step_s", "time_eval_s")
# Where the run's models were on disk: the same study under another outputs root differs only here
# (the models' identities, student_id / teacher_id, do not depend on where they are).
LOCATION_COLUMNS = ("student_path", "teacher_path")
CELL = ("task", "policy", "lam", "kl", "lr")  # a grid cell; seeds are its repetitions
CORE_POLICIES = ("off", "on")
CORE_KLS = ("forward", "reverse")
# Toy-regime acceptance thresholds, in points of accuracy gain at the low learning rate.
ACCEPTANCE_THRESHOLDS = {"countdown-3 mean gain": 25.0, "countdown-3 best cell gain": 35.0,
                         "mean gain": 20.0}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


def collect(study_dir: str | Path) -> pd.DataFrame:
    """One row per completed run (every ``runs/*/metrics.json`` that holds the fields of a run
    record, ``kdlab.study.records``), sorted by ``run_id``; a record that does not is left out with a
    warning naming it and what it lacks (the study runner redoes that run).

    List and dict values (e.g. nested histories) are dropped; ``None`` becomes NaN in numeric
    columns. Every column of ``REQUIRED_COLUMNS`` exists, NaN where a run lacks it.
    """
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise ValueError(f"study_dir {str(study_dir)!r} is not a directory")
    rows = []
    for path in sorted((study_dir / "runs").glob("*/metrics.json")):
        try:
            problems = metrics_problems(metrics := _read_json(path))
        except ValueError as e:  # cut short: not whole JSON
            problems = [str(e)]
        if problems:
            warnings.warn(f"{path} left out of the results: {'; '.join(problems[:3])}", stacklevel=2)
            continue
        row = {k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}
        row.setdefault("run_id", path.parent.name)
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in REQUIRED_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    if df.empty:
        return df[list(REQUIRED_COLUMNS)]
    for col in ("grad_clip", "pass_at_10", "lam", "lr"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["lr_run"] = df["lr"]  # the rate the run trained at; lr: the grid's rate whose role it plays
    if "grid_lr" in df.columns:
        df["lr"] = pd.to_numeric(df["grid_lr"], errors="coerce").astype(float).fillna(df["lr_run"])
    df["grid_lr"] = df["lr"]
    if "collapse_step" in df.columns:
        df["collapse_step"] = pd.to_numeric(df["collapse_step"], errors="coerce").astype(float)
    df["collapsed"] = df["collapsed"].fillna(False).astype(bool)
    front = [c for c in REQUIRED_COLUMNS if c in df.columns]
    df = df[front + [c for c in df.columns if c not in front]]
    return df.sort_values("run_id", kind="stable").reset_index(drop=True)


def write_results(study_dir: str | Path) -> Path:
    """Collect the study's runs and write ``<study_dir>/results.parquet`` atomically; returns its path."""
    study_dir = Path(study_dir)
    df = collect(study_dir)
    path = study_dir / "results.parquet"
    write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False))
    return path


def load_results(study_dir: str | Path) -> pd.DataFrame:
    """``results.parquet`` of a study (collected and written first if it is missing)."""
    path = Path(study_dir) / "results.parquet"
    if not path.exists():
        write_results(study_dir)
    return pd.read_parquet(path)


def load_models(study_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of ``models.json`` (written by the teachers notebook); [] when absent."""
    path = Path(study_dir) / "models.json"
    return _read_json(path) if path.exists() else []


def load_timing(study_dir: str | Path) -> dict[str, Any]:
    """``timing.json`` (written by the study runner); {} when absent."""
    path = Path(study_dir) / "timing.json"
    return _read_json(path) if path.exists() else {}


def failed_runs(study_dir: str | Path) -> pd.DataFrame:
    """Runs that have an ``error.json`` and no ``metrics.json``: run_id, error name and message."""
    rows = []
    for path in sorted(Path(study_dir).glob("runs/*/error.json")):
        if (path.parent / "metrics.json").exists():
            continue
        err = _read_json(path)
        rows.append({"run_id": path.parent.name, "error": err.get("ename"), "message": err.get("evalue"),
                     "cell": err.get("cell_index")})
    return pd.DataFrame(rows, columns=["run_id", "error", "message", "cell"])


def task_rates(df: pd.DataFrame) -> pd.DataFrame:
    """The learning rates each task trained at, per grid rate: one row per task, one column per
    grid rate (``lr``, lowest first), the run rate(s) ``lr_run`` as text ("1e-04")."""
    rate = df["lr_run"] if "lr_run" in df.columns else df["lr"]
    d = df.assign(_rate=rate).dropna(subset=["lr"])
    table = d.groupby(["task", "lr"])["_rate"].agg(lambda s: ", ".join(f"{v:.2g}" for v in sorted(s.unique())))
    out = table.unstack("lr")
    out.columns = [f"grid rate {c:g}" for c in out.columns]
    return out


DIAGNOSIS = ("contested_share", "contested_p_student", "contested_p_teacher", "contested_grad_reverse_at_a",
             "contested_grad_forward_at_a", "answer_p_student", "answer_p_teacher", "answer_grad_reverse_at_a",
             "answer_grad_forward_at_a")  # per step in history.json (kdlab.core.answer, kdlab.engine.distill)


def diagnosis_steps(study_dir: str | Path, df: pd.DataFrame) -> pd.DataFrame:
    """The diagnosis of each KL (kdlab.core.answer) of every main-grid run (off/on x forward/reverse)
    per step, from its ``history.json``: task, policy, kl, lr, seed, step, ``DIAGNOSIS`` (means over
    the step's contested / answer positions) and ``contested_grad_at_a``: the gradient of the run's
    own KL at the teacher's token on the contested positions. Runs whose history has no diagnosis
    (recorded before it, or a large vocabulary) are left out."""
    core = df[df["policy"].isin(CORE_POLICIES) & df["kl"].isin(CORE_KLS)]
    frames = []
    for r in core.itertuples():
        path = Path(study_dir) / "runs" / str(r.run_id) / "history.json"
        if not path.exists():
            continue
        hist = pd.DataFrame(_read_json(path))
        if not set(DIAGNOSIS) <= set(hist.columns) or hist["contested_share"].isna().all():
            continue
        frames.append(hist[["step", *DIAGNOSIS]].assign(task=r.task, policy=r.policy, kl=r.kl, lr=r.lr, seed=r.seed))
    cols = ["task", "policy", "kl", "lr", "seed", "step", *DIAGNOSIS, "contested_grad_at_a"]
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    out["contested_grad_at_a"] = out["contested_grad_reverse_at_a"].where(out["kl"] == "reverse",
                                                                          out["contested_grad_forward_at_a"])
    return out[cols]


def diagnosis_summary(steps: pd.DataFrame, last: int = 10) -> pd.DataFrame:
    """``diagnosis_steps`` at the first step and over the ``last`` steps of each run, seed means per
    task x policy x KL x lr: the share of contested tokens, the student's and the teacher's mass on
    the teacher's token there, each KL's gradient at that token, and the student's mass on the
    teacher's token at the answer position (masses and shares in percent)."""
    if steps.empty:
        return pd.DataFrame()
    end = steps.groupby(["task", "policy", "kl", "lr", "seed"])["step"].transform("max")
    keep = ["contested_share", "contested_p_student", "contested_p_teacher", "contested_grad_reverse_at_a",
            "contested_grad_forward_at_a", "answer_p_student"]
    frames = []
    for when, d in {"first step": steps[steps["step"] == 0], f"last {last} steps": steps[steps["step"] > end - last]}.items():
        frames.append(d.groupby(["task", "policy", "kl", "lr"])[keep].mean().assign(when=when).reset_index())
    out = pd.concat(frames, ignore_index=True)
    for c in ("contested_share", "contested_p_student", "contested_p_teacher", "answer_p_student"):
        out[c] *= 100
    out = out.rename(columns={"contested_share": "contested tokens %", "contested_p_student": "p_S(a) %",
                              "contested_p_teacher": "p_T(a) %", "contested_grad_reverse_at_a": "dKL_rev/dz_a",
                              "contested_grad_forward_at_a": "dKL_fwd/dz_a", "answer_p_student": "answer: p_S(a) %"})
    return out.set_index(["task", "policy", "kl", "lr", "when"]).sort_index().round(4)


def rollout_label(policy: str, lam: float) -> str:
    """'off', 'on' or 'λ=+0.5' for a lambda-spectrum run."""
    return policy if policy in CORE_POLICIES else f"λ={lam:+g}"


def annotate(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with plotting labels: ``rollout`` (off | on | λ=..), ``cell`` ('off / forward'),
    ``gain`` (accuracy - base_accuracy, points) and ``lr_label`` (the lr as text)."""
    out = df.copy()
    out["rollout"] = [rollout_label(p, l) for p, l in zip(out["policy"], out["lam"])]
    out["cell"] = out["rollout"] + " / " + out["kl"].astype(str)
    out["gain"] = (out["accuracy"] - out["base_accuracy"]) * 100.0
    out["lr_label"] = [f"{lr:g}" for lr in out["lr"]]
    return out


def _fmt(mean: float, std: float, n: int, digits: int) -> str:
    if not math.isfinite(mean):
        return "n/a"
    if n > 1 and math.isfinite(std):
        return f"{mean:.{digits}f} ± {std:.{digits}f} (n={n})"
    return f"{mean:.{digits}f} (n={n})"


def summarize(df: pd.DataFrame, metric: str, by: Sequence[str], scale: float = 100.0, digits: int = 1) -> pd.DataFrame:
    """Mean, sample std and count of ``metric`` x ``scale`` over the rows of each ``by`` group
    (the seeds of a cell), plus a text column ``'mean ± std'`` ("72.0 ± 1.3 (n=3)"). Groups are
    ordered by ``by``; the std of a single run is NaN."""
    if metric not in df.columns:
        raise ValueError(f"metric {metric!r} is not a column of the results; columns: {sorted(df.columns)}")
    missing = [c for c in by if c not in df.columns]
    if missing:
        raise ValueError(f"by: {missing} are not columns of the results")
    values = df.assign(_v=pd.to_numeric(df[metric], errors="coerce") * scale)
    g = values.groupby(list(by), dropna=False, sort=True)["_v"]
    out = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "n": g.count()}).reset_index()
    out["mean ± std"] = [_fmt(m, s, int(n), digits) for m, s, n in zip(out["mean"], out["std"], out["n"])]
    return out


def wide(table: pd.DataFrame, column: str = "lr", value: str = "mean ± std") -> pd.DataFrame:
    """A summary table with one column per value of ``column`` (the learning rates by default)."""
    index = [c for c in table.columns if c not in (column, "mean", "std", "n", "mean ± std")]
    labels = table.assign(**{column: [f"{column}={v:g}" if isinstance(v, float) else f"{column}={v}"
                                      for v in table[column]]})
    return labels.pivot_table(index=index, columns=column, values=value, aggfunc="first")


def accuracy_table(df: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Held-out accuracy (points) per task x policy x lambda x KL x learning rate: mean, std over
    seeds and n. ``lam`` separates lambda-spectrum runs; it is -1 for off and +1 for on."""
    return summarize(df, metric, CELL)


def by_lr(df: pd.DataFrame, metric: str, within: Sequence[str] = (), scale: float = 100.0) -> pd.DataFrame:
    """``metric`` x ``scale`` per task x learning rate (x ``within``, e.g. ("policy", "kl")),
    over every run of the group (seeds and any dimension not named)."""
    return summarize(df, metric, ["task", *within, "lr"], scale=scale)


def model_comparison(df: pd.DataFrame, models: list[dict[str, Any]]) -> pd.DataFrame:
    """Per task: the student base, the teacher and the distilled students (mean over all runs, and
    the best cell) on held-out accuracy and mean probe score, in points.

    Base numbers come from the runs (``base_accuracy``, ``base_probe_mean``); the teacher's from
    ``models`` (rows of models.json); NaN where unknown.
    """
    rows = []
    teacher = {m["task"]: m for m in models if m.get("model") == "teacher"}
    for task, d in df.groupby("task", sort=True):
        cells = summarize(d, "accuracy", CELL)
        best = cells.loc[cells["mean"].idxmax()] if cells["mean"].notna().any() else None
        t = teacher.get(task, {})
        rows.append({"task": task, "model": "student base", "accuracy": 100 * d["base_accuracy"].mean(),
                     "probe_mean": 100 * d.get("base_probe_mean", pd.Series(dtype=float)).mean(), "runs": len(d)})
        rows.append({"task": task, "model": "teacher", "accuracy": 100 * t.get("accuracy", np.nan),
                     "probe_mean": 100 * t.get("probe_mean", np.nan), "runs": 0})
        rows.append({"task": task, "model": "distilled (mean of all runs)", "accuracy": 100 * d["accuracy"].mean(),
                     "probe_mean": 100 * d.get("probe_mean", pd.Series(dtype=float)).mean(), "runs": len(d)})
        if best is not None:
            sel = d[(d["policy"] == best["policy"]) & np.isclose(d["lam"], best["lam"]) & (d["kl"] == best["kl"])
                    & np.isclose(d["lr"], best["lr"])]
            label = f"distilled (best cell: {rollout_label(best['policy'], best['lam'])} / {best['kl']} / lr={best['lr']:g})"
            rows.append({"task": task, "model": label, "accuracy": best["mean"],
                         "probe_mean": 100 * sel.get("probe_mean", pd.Series(dtype=float)).mean(), "runs": len(sel)})
    return pd.DataFrame(rows, columns=["task", "model", "accuracy", "probe_mean", "runs"]).round(
        {"accuracy": 1, "probe_mean": 1})


def acceptance(df: pd.DataFrame, low_lr: float | None = None) -> pd.DataFrame:
    """The toy-regime acceptance checks, at the low learning rate (the smallest lr of the off/on
    runs unless ``low_lr`` is given), gains = accuracy - base_accuracy in points:

    - countdown-3: mean gain over the four policy x KL cells (off/on x forward/reverse), each
      cell's gain averaged over seeds, >= 25 points;
    - countdown-3: the best of those cells' seed-averaged gains, >= 35 points;
    - every other target task in the study: its mean gain over its four cells, >= 20 points.

    Returns one row per check: check, task, value, threshold, cells, seeds, status
    ('pass' | 'FAIL' | 'not run') and passed (bool).
    """
    core = df[df["policy"].isin(CORE_POLICIES) & df["kl"].isin(CORE_KLS)]
    if low_lr is None:
        low_lr = float(core["lr"].min()) if len(core) else float("nan")
    d = core[np.isclose(core["lr"], low_lr)] if len(core) else core
    d = d.assign(gain=(d["accuracy"] - d["base_accuracy"]) * 100.0)
    per_cell = d.groupby(["task", "policy", "kl"], sort=True)["gain"].agg(["mean", "count"]).reset_index()

    def row(check: str, task: str, threshold: float, stat: str) -> dict[str, Any]:
        cells = per_cell[per_cell["task"] == task]
        if cells.empty:
            value = float("nan")
        else:
            value = float(cells["mean"].mean() if stat == "mean" else cells["mean"].max())
        seeds = int(d[d["task"] == task]["seed"].nunique()) if len(d) else 0
        passed = bool(math.isfinite(value) and value >= threshold)
        status = "not run" if not math.isfinite(value) else ("pass" if passed else "FAIL")
        return {"check": check, "task": task, "lr": low_lr, "value": value, "threshold": threshold,
                "cells": len(cells), "seeds": seeds, "status": status, "passed": passed}

    rows = [row("mean gain over the policy x KL cells", "countdown-3", ACCEPTANCE_THRESHOLDS["countdown-3 mean gain"], "mean"),
            row("best cell gain", "countdown-3", ACCEPTANCE_THRESHOLDS["countdown-3 best cell gain"], "max")]
    for task in sorted(set(df["task"]) - {"countdown-3"}):
        rows.append(row("mean gain over the policy x KL cells", task, ACCEPTANCE_THRESHOLDS["mean gain"], "mean"))
    return pd.DataFrame(rows)


def format_acceptance(checks: pd.DataFrame) -> str:
    """The acceptance checks as text lines: 'PASS  countdown-3  best cell gain ... 41.2 >= 35'."""
    lines = []
    for r in checks.itertuples():
        value = "n/a" if not math.isfinite(r.value) else f"{r.value:.1f}"
        lines.append(f"{r.status.upper():8s}{r.task:14s}{r.check} at lr={r.lr:g}: {value} points "
                     f"(threshold >= {r.threshold:g}; {r.cells} cells, {r.seeds} seeds)")
    return "\n".join(lines)


def phase_times(df: pd.DataFrame, models: list[dict[str, Any]] | None = None,
                timing: dict[str, Any] | None = None) -> pd.DataFrame:
    """Wall time per phase (seconds and share of the total), summed over the study:

    - model training: ``train_s`` of each distinct model in ``models`` (models.json);
    - rollouts / distillation steps / evaluation: the runs' ``time_rollout_s``, ``time_step_s``,
      ``time_eval_s``; other run work: the rest of each run's ``wall_s`` (loading, caches);
    - notebook overhead: per run, the run notebook's wall time minus the run's ``wall_s`` (from
      timing.json, runs of ``df`` only), plus kernel start-ups.
    Time spent by parallel workers adds up, so the total can exceed the study's wall time.
    """
    models = models or []
    timing = timing or {}
    seen, train = set(), 0.0
    for m in models:
        if m.get("path") not in seen and m.get("train_s") is not None:
            seen.add(m.get("path"))
            train += float(m["train_s"])

    def total(col: str) -> float:
        return float(pd.to_numeric(df[col], errors="coerce").fillna(0).sum()) if col in df.columns else 0.0

    rollout, step, ev, wall = total("time_rollout_s"), total("time_step_s"), total("time_eval_s"), total("wall_s")
    run_timing = timing.get("runs", {})
    overhead = sum(float(run_timing[r]["overhead_s"]) for r in df.get("run_id", []) if r in run_timing
                   and run_timing[r].get("overhead_s") is not None)
    kernels = sum(float(inv.get("kernel_start_s", 0.0)) for inv in timing.get("invocations", []))
    phases = [("model training (students, teachers)", train), ("rollouts", rollout), ("distillation steps", step),
              ("evaluation", ev), ("other run work", max(0.0, wall - rollout - step - ev)),
              ("notebook overhead (per run)", overhead), ("kernel start-up", kernels)]
    out = pd.DataFrame(phases, columns=["phase", "seconds"])
    grand = out["seconds"].sum()
    out["share %"] = 100.0 * out["seconds"] / grand if grand > 0 else np.nan
    return out.round({"seconds": 1, "share %": 1})
