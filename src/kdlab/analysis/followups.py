"""The follow-ups of a study: the RLVR (GRPO) runs from distilled students and the style runs.

Files (written by the study runner, see ``kdlab.study.followups``):

- ``<study>/rlvr/<start_id>_s<seed>/metrics.json`` and ``history.json`` (one entry per GRPO step:
  ``reward_mean``, ``length`` in tokens, ``accuracy`` (greedy, on ``rlvr.n_eval`` test problems)
  at evaluation steps, ...);
- ``<study>/style/<run_id>/metrics.json``: a distillation run from the style teacher with
  ``style_adoption`` (share of the student's styled outputs in the teacher's notation) and
  ``base_style_adoption`` (the student base's).

Fractions stay fractions here; tables for the report are scaled to points where they say so.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .robustness import load_companions
from .table import load_results, main_grid, resolve_path

RLVR_CURVES = ("reward_mean", "accuracy", "length")


def _rows(folder: Path) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(folder.glob("*/metrics.json")):
        metrics = json.loads(path.read_text())
        if not isinstance(metrics, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(metrics).__name__}")
        out.append((path.parent, metrics))
    return out


def start_label(policy: str, kl: str, lr: float | None) -> str:
    """``base`` or ``off / forward / lr 0.0002`` for an RLVR start."""
    if policy == "base" or lr is None or (isinstance(lr, float) and np.isnan(lr)):
        return "base"
    return f"{policy} / {kl} / lr {lr:g}"


def load_rlvr(study_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, history) of a study's RLVR runs.

    summary: one row per completed run (its metrics.json scalars) plus ``label``
    (``start_label``) and ``no_signal_share`` (mean over steps of the share of groups whose
    rewards are all equal: no GRPO gradient). history: one row per GRPO step of every run, with ``job`` (the run's
    folder), ``label``, ``seed`` and the step's fields. Both empty when the study has none."""
    rows, hist = [], []
    for folder, m in _rows(resolve_path(study_dir) / "rlvr"):
        label = (f"pipeline {m['pipeline']}" if m.get("pipeline") in ("rlvr-only", "joint")  # GRPO from the base, longer
                 else start_label(m.get("start_policy", "base"), m.get("start_kl", ""), m.get("start_lr")))
        row = {"job": folder.name, "label": label, **{k: v for k, v in m.items() if not isinstance(v, (list, dict))}}
        path = folder / "history.json"
        steps = json.loads(path.read_text()) if path.exists() else []
        hist += [{"job": folder.name, "label": label, "seed": m.get("seed"), **h} for h in steps]
        row["no_signal_share"] = float(np.mean([h["zero_adv_groups"] for h in steps])) if steps else np.nan
        rows.append(row)
    summary, history = pd.DataFrame(rows), pd.DataFrame(hist)
    if not history.empty:
        history["accuracy"] = pd.to_numeric(history["accuracy"], errors="coerce")
    return summary, history


def rlvr_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per start (over seeds): accuracy before, at the end and at best (points), the end reward
    (points) and response length (tokens), the share of groups without a learning signal (all
    rewards equal, so every advantage is 0; points), how many runs collapsed and at which steps."""
    if summary.empty:
        return pd.DataFrame()
    cols = {"initial_accuracy": "before", "final_accuracy": "final", "best_accuracy": "best", "final_reward": "final reward"}
    g = summary.groupby("label", sort=False)
    out = pd.DataFrame({name: 100 * g[c].mean() for c, name in cols.items() if c in summary.columns})
    out["gain"] = out["final"] - out["before"]
    out["final length"] = g["final_length"].mean() if "final_length" in summary.columns else np.nan
    out["runs"] = g.size()
    out["no-signal groups"] = 100 * summary["no_signal_share"].groupby(summary["label"], sort=False).mean() \
        if "no_signal_share" in summary.columns else np.nan
    out["collapsed"] = g["collapsed"].sum().astype(int)
    out["collapse steps"] = g["collapse_step"].apply(lambda s: ", ".join(str(int(v)) for v in s.dropna()) or "-")
    return out.round(1).sort_values("final", ascending=False)


def plot_rlvr_curves(history: pd.DataFrame, smooth: int = 10, dpi: int = 90, summary: pd.DataFrame | None = None):
    """Three panels against the number of GRPO updates done: training reward of the responses
    sampled then (moving average over ``smooth`` steps), held-out accuracy (after each evaluated
    step's update; with ``summary``, the start's accuracy at 0) and response length (tokens,
    moving average); one line per start (mean over seeds). Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    if history.empty:
        raise ValueError("no RLVR history to plot")
    fig = Figure(figsize=(13, 3.4), dpi=dpi, layout="constrained")
    axes = fig.subplots(1, 3)
    labels = list(dict.fromkeys(history["label"]))
    for label in labels:
        h = history[history["label"] == label].groupby("step", sort=True)
        reward = h["reward_mean"].mean().rolling(max(1, smooth), min_periods=1).mean()
        length = h["length"].mean().rolling(max(1, smooth), min_periods=1).mean()
        acc = h["accuracy"].mean().dropna()
        acc.index = acc.index + 1  # evaluated after the step's update: x = updates done
        if summary is not None and "initial_accuracy" in summary.columns:
            before = summary.loc[summary["label"] == label, "initial_accuracy"].mean()
            acc = pd.concat([pd.Series([before], index=[0]), acc])
        style = "--" if label == "base" else "-"
        axes[0].plot(reward.index, reward.values, style, label=label)
        axes[1].plot(acc.index, acc.values, style, marker="o", ms=3, label=label)
        axes[2].plot(length.index, length.values, style, label=label)
    for ax, title in zip(axes, ["training reward (moving average)", "held-out accuracy", "response length (tokens)"]):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("GRPO updates done")
    axes[2].legend(fontsize=7, title="start", title_fontsize=7)
    return fig


def load_style(study_dir: str | Path) -> pd.DataFrame:
    """One row per completed style run (its metrics.json scalars); empty when the study has none."""
    return pd.DataFrame([{k: v for k, v in m.items() if not isinstance(v, (list, dict))}
                         for _, m in _rows(resolve_path(study_dir) / "style")])


def style_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per policy x KL x learning rate (mean over seeds, points): ``adoption`` of the teacher's
    notation by the distilled student, the student base's, the share of outputs with a
    detectable style and the accuracy of the same greedy outputs."""
    if df.empty:
        return pd.DataFrame()
    cols = {"style_adoption": "adoption", "base_style_adoption": "base adoption", "style_styled_share": "styled share",
            "style_accuracy": "accuracy"}
    g = df.groupby(["policy", "kl", "lr"], sort=True)
    out = pd.DataFrame({name: 100 * g[c].mean() for c, name in cols.items() if c in df.columns})
    out["runs"] = g.size()
    return out.round(1)


def findings_table(study_dir: str | Path, df: pd.DataFrame) -> pd.DataFrame:
    """The results table ``df`` (prepared) with the follow-ups where the findings scoreboard
    (``kdlab.analysis.findings``, findings 11-13) looks for them:

    - ``rlvr_accuracy`` on the grid run each RLVR start came from: its final held-out accuracy
      after GRPO (mean over RLVR seeds);
    - ``style_share`` on the grid run whose run_id the style run shares (same task, policy, KL,
      lr and seed, distilled from the style teacher instead): its ``style_adoption``;
    - the runs of the companion studies that are not main-grid runs (sampled estimators, no
      clipping; ``main_grid``), with ``study`` = the companion's suffix. Companion runs that look
      like main-grid runs (e.g. another trace) stay out: they would mix into the main grid.
    """
    out = df.copy()
    summary, _ = load_rlvr(study_dir)
    if not summary.empty and "start_run" in summary.columns:
        rl = summary.dropna(subset=["start_run"]).groupby("start_run")["final_accuracy"].mean()
        out["rlvr_accuracy"] = out["run_id"].map(rl)
    style = load_style(study_dir)
    if not style.empty:
        out["style_share"] = out["run_id"].map(style.set_index("run_id")["style_adoption"])
    parts = [out]
    for comp in load_companions(study_dir):
        path = Path(comp["study_dir"]) / "results.parquet"
        if path.exists():
            c = load_results(path)
            parts.append(c.drop(index=main_grid(c).index).assign(study=comp["suffix"]))
    return pd.concat(parts, ignore_index=True)
