"""Figures of the gradient experiment (STUDY.md finding 6) and where its models are.

The experiment itself (sampling from pi_lambda, logit and parameter gradients, TV and the update
bound) is ``kdlab.engine.gradients``: it runs models; this module only draws its finished results.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.schema import DIRECTIONS
from .table import resolve_path


def plot_update_bound(table: pd.DataFrame, dpi: int = 90):
    """Two panels: functional (logit) distance vs TV with the forward bound ``2 TV``, and the
    parameter-space distance vs TV. One marker per (lam_a, lam_b); colour = direction."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=dpi, layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    colors = {"forward": "tab:blue", "reverse": "tab:red"}
    tv_max = float(table["tv"].max()) if len(table) else 1.0
    grid = np.linspace(0, max(tv_max, 1e-3) * 1.05, 50)
    ax1.plot(grid, 2 * grid, color="k", lw=1, ls="--", label="forward bound: 2 TV")
    for d in DIRECTIONS:
        sub = table[table["direction"] == d]
        ax1.scatter(sub["tv"], sub["dist_logit"], color=colors[d], s=28, label=f"{d} KL", alpha=0.8)
        if sub["dist_param"].notna().any():
            ax2.scatter(sub["tv"], sub["dist_param"], color=colors[d], s=28, label=f"{d} KL", alpha=0.8)
            c = float(sub["param_const"].max())
            ax2.plot(grid, 2 * c * grid, color=colors[d], lw=1, ls="--",
                     label=f"2 TV max_i||grad L(x_i)|| ({d}: {c:.3g})")
    ax1.set_xlabel("TV(P_a, P_b) (importance-ratio estimate)")
    ax1.set_ylabel("max |u_a - u_b| over (prefix, token) logits")
    ax1.set_title("expected logit update vs TV", fontsize=10)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("TV(P_a, P_b)")
    ax2.set_ylabel("|| u_a - u_b ||_2 over parameters")
    ax2.set_title("expected parameter update vs TV (sample constants)", fontsize=10)
    ax2.legend(fontsize=8)
    return fig


def plot_gradient_entries(entries: list, dpi: int = 90):
    """Histograms (log counts) of logit-gradient entries and of per-token norms, per direction,
    one line per lambda. ``entries``: ``kdlab.engine.gradients.GradientEntries``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 6.5), dpi=dpi, layout="constrained")
    axes = fig.subplots(2, 2)
    for col, d in enumerate(DIRECTIONS):
        vals = np.concatenate([e.of(d).ravel() for e in entries]) if entries else np.zeros(1)
        lo, hi = float(min(vals.min(), -1.0)), float(max(vals.max(), 1.0))
        bins = np.linspace(lo, hi, 81)
        nmax = max(float(e.norms(d).max()) if e.of(d).size else 0.0 for e in entries) if entries else 1.0
        nbins = np.linspace(0, max(nmax, 1.5) * 1.02, 61)
        for e in entries:
            axes[0, col].hist(e.of(d).ravel(), bins=bins, histtype="step", log=True, label=f"lambda={e.lam:+g}")
            axes[1, col].hist(e.norms(d), bins=nbins, histtype="step", log=True, label=f"lambda={e.lam:+g}")
        for x in (-1, 1):
            axes[0, col].axvline(x, color="k", lw=0.6, ls="--")
        axes[1, col].axvline(math.sqrt(2), color="k", lw=0.6, ls="--")
        mx = max(e.max_abs(d) for e in entries) if entries else 0.0
        axes[0, col].set_title(f"{d} KL: d KL / d z_S(v) entries (max |entry| {mx:.3g})", fontsize=10)
        axes[1, col].set_title(f"{d} KL: per-token gradient L2 norm (sqrt 2 dashed)", fontsize=10)
        axes[0, col].legend(fontsize=7)
    return fig


def find_models(study_dir: str | Path, task: str) -> tuple[Path | None, Path | None]:
    """(student base, teacher of ``task``) checkpoint dirs listed in ``<study_dir>/models.json``
    (written by ``kdlab teachers``); None for whichever is not listed or not on disk."""
    path = resolve_path(study_dir) / "models.json"
    if not path.exists():
        return None, None
    rows = json.loads(path.read_text())
    student = teacher = None
    for r in rows:
        p = Path(r.get("path", ""))
        if not (p / "config.json").exists():
            continue
        if r.get("model") == "student base":
            student = p
        elif r.get("model") == "teacher" and r.get("task") == task:
            teacher = p
    return student, teacher
