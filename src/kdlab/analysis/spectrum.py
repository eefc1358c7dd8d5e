"""The lambda spectrum: metrics against the rollout-policy position lambda, with seed bands.

Policy "off" is lambda = -1 and "on" is lambda = +1 (``kdlab.analysis.table.prepare_results``
fills lam from the policy), so OffPD/OnPD runs are the end points of every spectrum.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from .table import variant_columns


def mean_ci(values: object, level: float = 0.95) -> dict[str, float]:
    """Mean and a two-sided Student-t confidence interval of the mean.

    Returns {"n", "mean", "sd", "ci_lo", "ci_hi"}; the interval is NaN with fewer than 2 finite
    values (one seed has no spread to estimate).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return {"n": 0, "mean": math.nan, "sd": math.nan, "ci_lo": math.nan, "ci_hi": math.nan}
    mean = float(x.mean())
    if n < 2:
        return {"n": 1, "mean": mean, "sd": math.nan, "ci_lo": math.nan, "ci_hi": math.nan}
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "ci_lo": mean - half, "ci_hi": mean + half}


def spectrum_tasks(df: pd.DataFrame) -> list[str]:
    """Tasks that have lambda-spectrum runs (policy "lambda"); all tasks when there are none."""
    lam_tasks = sorted(df.loc[df["policy"] == "lambda", "task"].unique())
    return lam_tasks or sorted(df["task"].unique())


def _spectrum_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that make up spectra: clipped runs (the no-clipping robustness runs are left out
    when clipped ones exist) of the KL kinds that have lambda-policy runs (all kinds when the
    table has no lambda runs), so sampled-estimator robustness runs do not appear as two-point
    spectra."""
    if "grad_clip" in df.columns and df["grad_clip"].notna().any():
        df = df[df["grad_clip"].notna()]
    kls = set(df.loc[df["policy"] == "lambda", "kl"])
    return df[df["kl"].isin(kls)] if kls else df


def spectrum_table(df: pd.DataFrame, metric: str, task: str | None = None, level: float = 0.95) -> pd.DataFrame:
    """Per (task, kl, lr, lam): n seeds, mean, SD and a ``level`` CI of ``metric``.

    Rows of every policy count (off = -1, on = +1, lambda runs at their lam), restricted as in
    ``_spectrum_rows`` (clipped runs; KL kinds that have lambda runs). ``task=None`` uses every task.
    """
    if metric not in df.columns:
        raise ValueError(f"metric {metric!r} is not a column of the results table; columns: {sorted(df.columns)}")
    d = _spectrum_rows(df)
    if task is not None:
        if task not in set(d["task"]):
            raise ValueError(f"task {task!r} is not in the results table; tasks: {sorted(d['task'].unique())}")
        d = d[d["task"] == task]
    rows = []
    for (t, kl, lr, lam), g in d.groupby(["task", "kl", "lr", "lam"], sort=True):
        rows.append({"task": t, "kl": kl, "lr": lr, "lam": lam, "metric": metric, **mean_ci(g[metric], level)})
    return pd.DataFrame(rows, columns=["task", "kl", "lr", "lam", "metric", "n", "mean", "sd", "ci_lo", "ci_hi"])


def spectrum_metrics(df: pd.DataFrame, base: tuple[str, ...] = ("accuracy", "pass_at_1", "pass_at_10")) -> list[str]:
    """The spectrum metrics present in ``df``: ``base`` then the harder-variant accuracies."""
    return [m for m in base if m in df.columns] + variant_columns(df)


def plot_spectrum(df: pd.DataFrame, metrics: list[str], task: str | None = None, level: float = 0.95, dpi: int = 90):
    """One row per metric (shared y axis), one column per (kl, lr): seed mean against lambda with a
    ``level`` band and the individual seeds as dots. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    if not metrics:
        raise ValueError("metrics must name at least one column")
    tables = {m: spectrum_table(df, m, task, level) for m in metrics}
    d = _spectrum_rows(df) if task is None else _spectrum_rows(df[df["task"] == task])
    panels = sorted({(kl, lr) for kl, lr in zip(d["kl"], d["lr"])}, key=lambda p: (str(p[0]), p[1]))
    fig = Figure(figsize=(3.2 * max(len(panels), 1), 2.6 * len(metrics)), dpi=dpi, layout="constrained")
    # One y scale per metric row, so that flat (robust) and steep spectra look different.
    axes = np.atleast_2d(fig.subplots(len(metrics), max(len(panels), 1), squeeze=False, sharey="row"))
    for i, m in enumerate(metrics):
        tab = tables[m]
        for j, (kl, lr) in enumerate(panels):
            ax = axes[i, j]
            sub = tab[(tab["kl"] == kl) & (tab["lr"] == lr)].sort_values("lam")
            raw = d[(d["kl"] == kl) & (d["lr"] == lr)]
            color = "tab:blue" if kl == "forward" else "tab:red" if kl == "reverse" else "tab:green"
            ax.scatter(raw["lam"], raw[m], s=8, color=color, alpha=0.35)
            ax.plot(sub["lam"], sub["mean"], marker="o", color=color)
            ax.fill_between(sub["lam"], sub["ci_lo"], sub["ci_hi"], color=color, alpha=0.2)
            ax.axvline(0, color="0.8", lw=0.6)
            if i == 0:
                ax.set_title(f"{kl} KL, lr {lr:g}", fontsize=10)
            if j == 0:
                ax.set_ylabel(m)
            if i == len(metrics) - 1:
                ax.set_xlabel("lambda (-1 OffPD, +1 OnPD)")
    fig.suptitle(f"lambda spectrum{'' if task is None else ' - ' + task}: mean and {level:.0%} CI over seeds",
                 fontsize=11)
    return fig
