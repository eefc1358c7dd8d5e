"""The teachers and students axes: a study's main grid at several teachers or student sizes.

A profile's ``axes`` (``kdlab.study.config.axis_points``) run the main grid once per point, each
as a study of its own listed in ``<study>/axes.json``; the profile's own study is every axis's
first point (label ``own``). Here the points' runs are put side by side, at the grid's low rate
(the smallest rate of each task), with what sets each point apart read from its study's
``models.json``: the teacher's held-out accuracy, the student base's parameter count.

The answer lines are parts in the scoreboard's sense (``kdlab.analysis.findings``): a statistic
in points with its 95% interval from the parametric bootstrap of the cell-means model (cells =
task x point x policy x KL, the seed-to-seed variance pooled over them) and a verdict on the
claim written next to it. The claims are questions STUDY.md leaves open, phrased as hypotheses:

* teachers (per task and configuration): (a) "the student's gain grows with the teacher's
  accuracy": gain under the most accurate teacher minus gain under the least accurate, > 0;
  (b) "capacity gap: the most accurate teacher teaches less than a weaker one": gain under the
  most accurate teacher minus the largest gain under any weaker teacher, < 0;
* students (per task): "the OnPD - OffPD gap changes with the student's size" and "the forward -
  reverse gap changes with the student's size": the gap (gain difference averaged over the other
  factor) at the largest student minus at the smallest, a two-sided rule (``decide_differs``).

Gain = accuracy - base accuracy (the point's own student base), in points.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .findings import (ACCURACY_EQUIVALENCE_POINTS, INCONCLUSIVE, NOT_REPRODUCED, NOT_RUN, REPRODUCED, Estimate,
                       Part, _part, _part_not_run, bootstrap, cell_model, sel)
from .table import load_results, main_grid, resolve_path

OWN = "own"  # the label of the profile's own study, every axis's first point
CELL = ["task", "point", "policy", "kl"]
AXIS_X = {"teachers": "teacher_accuracy", "students": "student_params"}


def load_axes(study_dir: str | Path) -> list[dict[str, Any]]:
    """``axes.json`` of a study: [{"axis", "label", "suffix", "name", "study_dir", "overrides"}]; [] if absent."""
    path = resolve_path(study_dir) / "axes.json"
    return json.loads(path.read_text()) if path.exists() else []


def _models(study_dir: Path) -> list[dict[str, Any]]:
    path = study_dir / "models.json"
    return json.loads(path.read_text()) if path.exists() else []


def point_rows(results: pd.DataFrame, models: list[dict[str, Any]], label: str) -> pd.DataFrame:
    """The low-rate main-grid runs of one point's study (``results``: its prepared results table;
    ``models``: its ``models.json`` rows), with ``point``, ``gain`` (points of accuracy over the
    point's base), ``teacher_accuracy`` (of the run's task) and ``student_params``."""
    d = main_grid(results)
    d = d[d["lr"] == d.groupby("task")["lr"].transform("min")].copy()
    teacher = {m["task"]: m["accuracy"] for m in models if m.get("model") == "teacher"}
    params = [m["n_params"] for m in models if m.get("model") == "student base" and m.get("n_params")]
    d["point"] = label
    d["gain"] = d["accuracy"] - d["base_accuracy"]
    d["teacher_accuracy"] = d["task"].map(teacher).astype(float)
    d["student_params"] = float(params[0]) if params else math.nan
    return d


def axis_rows(study_dir: str | Path, axis: str) -> pd.DataFrame:
    """The runs of ``axis`` ("teachers" / "students"): the study's own (point ``own``) and each
    point's study that has a results table, as ``point_rows``."""
    if axis not in AXIS_X:
        raise ValueError(f"axis must be one of {sorted(AXIS_X)}, got {axis!r}")
    root = resolve_path(study_dir)
    parts = [point_rows(load_results(root), _models(root), OWN)]
    for point in load_axes(root):
        folder = Path(point["study_dir"])
        if point["axis"] == axis and (folder / "results.parquet").exists():
            parts.append(point_rows(load_results(folder), _models(folder), point["label"]))
    return pd.concat(parts, ignore_index=True)


def decide_differs(est: Estimate, margin: float) -> str:
    """Claim ``statistic != 0`` (a change in either direction): reproduced when the interval
    excludes 0, not reproduced when it lies inside [-margin, margin] (no change worth the name),
    inconclusive otherwise."""
    if not (np.isfinite(est.lo) and np.isfinite(est.hi)):
        return INCONCLUSIVE
    if est.lo > 0 or est.hi < 0:
        return REPRODUCED
    if -margin <= est.lo and est.hi <= margin:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def _differs_part(claim: str, name: str, est: Estimate, margin: float) -> Part:
    rule = f"95% interval ({est.method}) excludes 0 (inside +-{margin:g}: no change)"
    return Part(name, est, 0.0, decide_differs(est, margin), "points", claim, rule)


def _order(d: pd.DataFrame, task: str, x: str) -> list[str]:
    """The task's points from the smallest to the largest ``x`` (NaN last)."""
    xs = d[d["task"] == task].groupby("point")[x].first()
    return list(xs.sort_values(na_position="last").index)


def _lines(parts: list[tuple[str, str, Part]]) -> pd.DataFrame:
    return pd.DataFrame([{"task": task, "configuration": conf, "claim": p.claim, "statistic": p.name,
                          "value": p.estimate.value, "ci_low": p.estimate.lo, "ci_high": p.estimate.hi,
                          "threshold": p.threshold, "rule": p.rule, "verdict": p.verdict, "note": p.note,
                          "line": p.text()} for task, conf, p in parts])


def teacher_answers(d: pd.DataFrame) -> pd.DataFrame:
    """The teachers axis's answer lines (module docstring), one pair per task x configuration, from
    ``axis_rows(..., "teachers")``; "not run" lines when a task has fewer than two teachers of
    known accuracy or no seed replicates."""
    claims = ("the student's gain grows with the teacher's accuracy",
              "capacity gap: the most accurate teacher teaches less than a weaker one")
    out: list[tuple[str, str, Part]] = []
    for task in sorted(d["task"].unique()):
        dt = d[(d["task"] == task) & d["teacher_accuracy"].notna()]
        order = _order(dt, task, "teacher_accuracy")
        configs = sorted(dt.groupby(["policy", "kl"]).groups)
        c = cell_model(dt, "gain", CELL) if len(dt) else None
        for policy, kl in configs or [("", "")]:
            conf = f"{policy}/{kl}"
            if len(order) < 2 or c is None or not c.replicated:
                why = (f"needs >= 2 teachers of known accuracy on {task}, has {len(order)}" if len(order) < 2
                       else "needs >= 2 seeds in some cell for the seed-to-seed variance")
                out += [(task, conf, _part_not_run(claim, why)) for claim in claims]
                continue
            strong, weak, weaker = order[-1], order[0], order[:-1]

            def g(M, point, policy=policy, kl=kl):
                return sel(M, task=task, point=point, policy=policy, kl=kl).mean(axis=1)

            grows = bootstrap(c, lambda M: g(M, strong) - g(M, weak))
            gap = bootstrap(c, lambda M: g(M, strong) - np.max([g(M, w) for w in weaker], axis=0))
            out.append((task, conf, _part(claims[0], f"gain({strong}) - gain({weak})", grows, "greater", 0.0)))
            out.append((task, conf, _part(claims[1], f"gain({strong}) - max gain(weaker)", gap, "less", 0.0)))
    return _lines(out)


def student_answers(d: pd.DataFrame, margin: float = ACCURACY_EQUIVALENCE_POINTS) -> pd.DataFrame:
    """The students axis's answer lines (module docstring), two per task, from
    ``axis_rows(..., "students")``; ``margin`` (points): a change of the gap inside it is "no change"."""
    claims = {"policy": ("the OnPD - OffPD gap changes with the student's size", "on", "off"),
              "kl": ("the forward - reverse gap changes with the student's size", "forward", "reverse")}
    out: list[tuple[str, str, Part]] = []
    for task in sorted(d["task"].unique()):
        dt = d[(d["task"] == task) & d["student_params"].notna()]
        order = _order(dt, task, "student_params")
        c = cell_model(dt, "gain", CELL) if len(dt) else None
        for factor, (claim, hi, lo) in claims.items():
            levels = set(dt[factor])
            if len(order) < 2 or c is None or not c.replicated or not {hi, lo} <= levels:
                why = (f"needs >= 2 student sizes on {task}, has {len(order)}" if len(order) < 2
                       else f"needs {factor} {hi} and {lo}" if not {hi, lo} <= levels
                       else "needs >= 2 seeds in some cell for the seed-to-seed variance")
                out.append((task, factor, _part_not_run(claim, why)))
                continue
            big, small = order[-1], order[0]

            def gap(M, point, factor=factor, hi=hi, lo=lo):
                s = sel(M, task=task, point=point)
                return sel(s, **{factor: hi}).mean(axis=1) - sel(s, **{factor: lo}).mean(axis=1)

            est = bootstrap(c, lambda M: gap(M, big) - gap(M, small))
            out.append((task, factor, _differs_part(claim, f"{hi}-{lo} gap({big}) - gap({small})", est, margin)))
    return _lines(out)


def answers(d: pd.DataFrame, axis: str) -> pd.DataFrame:
    """The answer lines of ``axis`` ("teachers" / "students")."""
    return {"teachers": teacher_answers, "students": student_answers}[axis](d)


def point_table(d: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Per task, point and configuration: the axis's x (teacher accuracy or parameter count), mean
    accuracy, gain and forgetting over seeds (points), their seed SD and the number of seeds."""
    x = AXIS_X[axis]
    g = d.assign(accuracy_pts=100 * d["accuracy"], gain_pts=100 * d["gain"], forgetting_pts=100 * d["forgetting"])
    t = g.groupby(["task", "point", "policy", "kl"]).agg(
        **{x: (x, "first"), "accuracy": ("accuracy_pts", "mean"), "gain": ("gain_pts", "mean"),
           "gain_sd": ("gain_pts", "std"), "forgetting": ("forgetting_pts", "mean"), "seeds": ("seed", "nunique")})
    return t.reset_index().sort_values(["task", x, "policy", "kl"]).round(2)


def plot_axis(d: pd.DataFrame, axis: str, dpi: int = 90):
    """Teachers: the student's accuracy and forgetting against the teacher's accuracy; students:
    the gain against the parameter count (log axis). One line per configuration, per task a row
    of panels, each point the mean over seeds with its 95% t interval. Returns a Figure."""
    from matplotlib.figure import Figure
    from scipy import stats as sstats

    x = AXIS_X[axis]
    metrics = ["accuracy", "forgetting"] if axis == "teachers" else ["gain"]
    tasks = sorted(d["task"].unique())
    fig = Figure(figsize=(4.4 * len(metrics), 3.3 * len(tasks)), dpi=dpi, layout="constrained")
    grid = fig.subplots(len(tasks), len(metrics), squeeze=False)
    for row, task in zip(grid, tasks):
        dt = d[d["task"] == task]
        for ax, metric in zip(row, metrics):
            for (policy, kl), dc in dt.groupby(["policy", "kl"], sort=True):
                s = (100 * dc[metric]).groupby(dc[x])
                m, sd, n = s.mean(), s.std(), s.count()
                half = sstats.t.ppf(0.975, np.maximum(n - 1, 1)) * sd.fillna(0) / np.sqrt(n)
                xs = m.index.to_numpy() * (100 if axis == "teachers" else 1)
                ax.errorbar(xs, m.to_numpy(), yerr=half.to_numpy(), marker="o", capsize=3,
                            ls="-" if kl == "forward" else "--", label=f"{policy}/{kl}")
            if axis == "students":
                ax.set_xscale("log")
            ax.set_xlabel("teacher accuracy (%)" if axis == "teachers" else "student parameters")
            ax.set_ylabel(f"{metric} (points)")
            ax.set_title(f"{task}: {metric}", fontsize=10)
        row[-1].legend(fontsize=7)
    return fig
