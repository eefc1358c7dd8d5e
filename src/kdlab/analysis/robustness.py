"""Robustness variants beside the main grid: the companion studies of a profile.

A profile's ``companions`` (``kdlab.study.config.companion_profile``) each run the main grid under some
overrides (sampled KL estimators, no gradient clipping, a longer trace, ...) into their own study
directory; the runner lists them in ``<study>/companions.json``. Here the main grid and every
companion are put side by side per (policy, KL direction, learning rate). A sampled estimator
(k1/k2/k3/sf) is placed in the row of the direction it targets (``sampled_direction``), so
"forward, sampled" sits beside "forward, full vocabulary".
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.schema import SAMPLED_KINDS
from .table import load_results, main_grid, resolve_path

SAMPLED = SAMPLED_KINDS  # k1, k2, k3 and the paper's sf


def load_companions(study_dir: str | Path) -> list[dict[str, Any]]:
    """``companions.json`` of a study: [{"suffix", "name", "study_dir", "overrides"}]; [] if absent."""
    path = resolve_path(study_dir) / "companions.json"
    return json.loads(path.read_text()) if path.exists() else []


def variant_rows(df: pd.DataFrame, variant: str) -> pd.DataFrame:
    """The policy x KL x lr runs of one study as rows of the comparison: ``variant`` (the study's
    label), ``direction`` (forward / reverse; a sampled estimator's target direction) and
    ``estimator`` ("full vocabulary" or the sampled kind)."""
    keep = df["policy"].isin(["off", "on"]) & (df["kl"].isin(["forward", "reverse", *SAMPLED]))
    d = df[keep].copy()
    sampled = d["kl"].isin(SAMPLED)
    direction = d["sampled_direction"] if "sampled_direction" in d.columns else pd.Series("reverse", index=d.index)
    d["direction"] = d["kl"].where(~sampled, direction)
    d["estimator"] = d["kl"].where(sampled, "full vocabulary")
    d["variant"] = variant
    return d


def comparison_rows(study_dir: str | Path) -> pd.DataFrame:
    """The main grid (``main_grid``: clipping on, full-vocabulary KL, off/on) labelled ``main`` and
    every companion study that has a results table, labelled by its suffix."""
    parts = [variant_rows(main_grid(load_results(study_dir)), "main")]
    for comp in load_companions(study_dir):
        results = Path(comp["study_dir"]) / "results.parquet"
        if results.exists():
            parts.append(variant_rows(load_results(results), comp["suffix"]))
    return pd.concat(parts, ignore_index=True)


def robustness_table(rows: pd.DataFrame, metric: str, scale: float = 100.0) -> pd.DataFrame:
    """``metric`` x ``scale`` (mean over seeds) per (direction, policy, lr), one column per variant
    (``main`` first); NaN where a variant lacks the cell."""
    if metric not in rows.columns:
        raise ValueError(f"metric {metric!r} is not a column; columns: {sorted(rows.columns)}")
    order = list(dict.fromkeys(rows["variant"]))
    table = (rows.assign(_v=pd.to_numeric(rows[metric], errors="coerce") * scale)
             .pivot_table(index=["direction", "policy", "lr"], columns="variant", values="_v", aggfunc="mean"))
    return table[[v for v in order if v in table.columns]].round(1)


def plot_robustness(rows: pd.DataFrame, metrics: list[str], dpi: int = 90):
    """One panel per metric: the mean over runs (points) per variant, one line per direction x
    learning rate, OffPD and OnPD pooled. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    order = list(dict.fromkeys(rows["variant"]))
    fig = Figure(figsize=(4.2 * len(metrics), 3.4), dpi=dpi, layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        for (direction, lr), d in rows.groupby(["direction", "lr"], sort=True):
            means = (100 * pd.to_numeric(d[metric], errors="coerce")).groupby(d["variant"]).mean().reindex(order)
            ax.plot(range(len(order)), means.values, marker="o", ls="-" if direction == "forward" else "--",
                    label=f"{direction}, lr {lr:g}")
        ax.set_xticks(range(len(order)), order, rotation=20, fontsize=8)
        ax.set_title(metric, fontsize=10)
    axes[0].set_ylabel("points")
    axes[-1].legend(fontsize=7)
    return fig
