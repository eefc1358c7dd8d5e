"""Coverage: pass@k curves along the lambda spectrum and forward vs reverse KL at equal pass@1.

A run records ``pass_at_<k>`` on its target task for each k of ``eval.pass_ks`` (the unbiased
estimator from ``eval.pass_n`` samples per problem) and, with ``eval.harder_pass``,
``<variant>_pass_at_<k>`` on each harder variant (``eval.harder``). A *target* below is the
column prefix: ``""`` for the run's own task, ``"countdown-4e_"`` for a variant.

Finding 9 (STUDY.md): at equal pass@1, forward KL has the higher pass@10 (better coverage) for
lambda > 0. ``equal_pass1_gap`` measures it as the KL coefficient of a common-slope linear model
(ANCOVA) ``pass@k = a + b * pass@1 + g * [kl = forward]`` over the runs: ``g`` is the pass@k gap
between the directions at any fixed pass@1.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from scipy import stats

from .spectrum import _spectrum_rows, mean_ci

_PASS = re.compile(r"^(?P<prefix>.*?)pass_at_(?P<k>\d+)$")


def pass_targets(df: pd.DataFrame) -> list[str]:
    """Column prefixes that have pass@k columns with at least one value: ``""`` (the target task)
    first, then the harder variants (``"countdown-4_"``, ...), sorted. ``base_`` columns excluded."""
    found = set()
    for col in df.columns:
        m = _PASS.match(col)
        if m and not col.startswith("base_") and df[col].notna().any():
            found.add(m["prefix"])
    return sorted(found, key=lambda p: (p != "", p))


def pass_ks(df: pd.DataFrame, prefix: str = "") -> list[int]:
    """The k with a ``<prefix>pass_at_<k>`` column holding values, ascending."""
    ks = []
    for col in df.columns:
        m = _PASS.match(col)
        if m and m["prefix"] == prefix and not col.startswith("base_") and df[col].notna().any():
            ks.append(int(m["k"]))
    return sorted(ks)


def target_label(prefix: str, task: str) -> str:
    """``countdown-3`` for the target task (prefix ""), else the variant name."""
    return task if prefix == "" else prefix.rstrip("_")


def pass_curves(df: pd.DataFrame, prefix: str = "", task: str | None = None, level: float = 0.95) -> pd.DataFrame:
    """Long table of pass@k curves: per (task, kl, lr, lam, k) the seed mean, SD and a ``level``
    CI of ``<prefix>pass_at_<k>``. Rows as in the lambda spectrum (off = -1, on = +1; clipped runs;
    KL kinds that have lambda runs, all when none). Empty when there are no such columns."""
    ks = pass_ks(df, prefix)
    d = _spectrum_rows(df)
    if task is not None:
        d = d[d["task"] == task]
    rows = []
    for (t, kl, lr, lam), g in d.groupby(["task", "kl", "lr", "lam"], sort=True):
        for k in ks:
            rows.append({"task": t, "target": target_label(prefix, t), "kl": kl, "lr": lr, "lam": lam, "k": k,
                         **mean_ci(g[f"{prefix}pass_at_{k}"], level)})
    return pd.DataFrame(rows, columns=["task", "target", "kl", "lr", "lam", "k", "n", "mean", "sd", "ci_lo", "ci_hi"])


def plot_pass_curves(df: pd.DataFrame, prefix: str = "", task: str | None = None, dpi: int = 90):
    """pass@k against k, one line per lambda (blue = teacher rollouts ... red = student rollouts),
    one panel per (kl, lr), seed means with their 95% band. Returns a matplotlib Figure."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    curves = pass_curves(df, prefix, task)
    if curves.empty:
        raise ValueError(f"no {prefix}pass_at_<k> columns in the results table")
    panels = sorted({(kl, lr) for kl, lr in zip(curves["kl"], curves["lr"])}, key=lambda p: (str(p[0]), p[1]))
    lams = sorted(curves["lam"].unique())
    cmap = colormaps["coolwarm"]
    span = (min(lams), max(lams)) if len(lams) > 1 else (lams[0] - 1, lams[0] + 1)
    fig = Figure(figsize=(max(6.0, 3.3 * len(panels)), 3.0), dpi=dpi, layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False, sharey=True)[0])
    for ax, (kl, lr) in zip(axes, panels):
        for lam in lams:
            c = curves[(curves["kl"] == kl) & (curves["lr"] == lr) & (curves["lam"] == lam)].sort_values("k")
            if c.empty:
                continue
            color = cmap((lam - span[0]) / (span[1] - span[0]))
            ax.plot(c["k"], c["mean"], marker="o", ms=3, color=color, label=f"λ={lam:+g}")
            ax.fill_between(c["k"], c["ci_lo"], c["ci_hi"], color=color, alpha=0.15)
        ax.set_title(f"{kl} KL, lr {lr:g}", fontsize=10)
        ax.set_xlabel("k")
    axes[0].set_ylabel("pass@k")
    axes[-1].legend(fontsize=7, title="rollouts", title_fontsize=7)
    name = target_label(prefix, task or "target task")
    fig.suptitle(f"pass@k curves on {name} (runs distilled on {task or 'their task'})", fontsize=11)
    return fig


def equal_pass1_gap(df: pd.DataFrame, prefix: str = "", k: int = 10, lam_above: float | None = 0.0,
                    level: float = 0.95, lr: float | None = None) -> dict[str, float]:
    """pass@k of forward minus reverse KL at equal pass@1 (finding 9), from the runs.

    Fits ``y = a + b x + g f`` by least squares over the runs with ``lam > lam_above`` (all runs
    when None) and, when given, learning rate ``lr``, where ``x`` = ``<prefix>pass_at_1``,
    ``y`` = ``<prefix>pass_at_<k>``, ``f`` = 1 for forward and 0 for reverse KL; other KL kinds
    are left out. ``g`` is the vertical distance between the two parallel lines, i.e. the pass@k
    gap at any common pass@1.

    Returns {"gap", "se", "ci_lo", "ci_hi", "p", "slope", "n_forward", "n_reverse",
    "overlap_lo", "overlap_hi"} (the overlap is the pass@1 range both directions reach; outside
    it the comparison extrapolates). NaN statistics when either direction has no run or the
    model has no residual degrees of freedom (or the design is singular).
    """
    x_col, y_col = f"{prefix}pass_at_1", f"{prefix}pass_at_{k}"
    for col in (x_col, y_col):
        if col not in df.columns:
            raise ValueError(f"{col!r} is not a column of the results table (record it with eval.pass_ks)")
    d = _spectrum_rows(df)
    d = d[d["kl"].isin(["forward", "reverse"])]
    if lam_above is not None:
        d = d[d["lam"] > lam_above]
    if lr is not None:
        d = d[np.isclose(d["lr"], lr)]
    d = d[np.isfinite(d[x_col].astype(float)) & np.isfinite(d[y_col].astype(float))]
    fwd, rev = d[d["kl"] == "forward"], d[d["kl"] == "reverse"]
    out = {"gap": math.nan, "se": math.nan, "ci_lo": math.nan, "ci_hi": math.nan, "p": math.nan, "slope": math.nan,
           "n_forward": len(fwd), "n_reverse": len(rev), "overlap_lo": math.nan, "overlap_hi": math.nan}
    if fwd.empty or rev.empty:
        return out
    out["overlap_lo"] = float(max(fwd[x_col].min(), rev[x_col].min()))
    out["overlap_hi"] = float(min(fwd[x_col].max(), rev[x_col].max()))
    x = d[x_col].to_numpy(float)
    y = d[y_col].to_numpy(float)
    f = (d["kl"] == "forward").to_numpy(float)
    X = np.column_stack([np.ones_like(x), x, f])
    if np.linalg.matrix_rank(X) < 3:
        # pass@1 constant over the runs: the gap is the difference of the means
        if np.ptp(x) == 0:
            out["gap"] = float(y[f == 1].mean() - y[f == 0].mean())
        return out
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    out["gap"], out["slope"] = float(coef[2]), float(coef[1])
    dof = len(y) - 3
    if dof > 0:
        resid = y - X @ coef
        sigma2 = float(resid @ resid) / dof
        se = math.sqrt(sigma2 * float(np.linalg.inv(X.T @ X)[2, 2]))
        out["se"] = se
        t = float(stats.t.ppf(0.5 + level / 2, dof))
        out["ci_lo"], out["ci_hi"] = out["gap"] - t * se, out["gap"] + t * se
        out["p"] = float(2 * stats.t.sf(abs(out["gap"] / se), dof)) if se > 0 else (0.0 if out["gap"] else 1.0)
    return out


def equal_pass1_table(df: pd.DataFrame, k: int = 10, lam_above: float | None = 0.0) -> pd.DataFrame:
    """``equal_pass1_gap`` for every target (task and harder variants with pass@1 and pass@k) and
    task, over all learning rates and per learning rate; one row each."""
    rows = []
    for prefix in pass_targets(df):
        if k not in pass_ks(df, prefix) or 1 not in pass_ks(df, prefix):
            continue
        for task, d in df.groupby("task", sort=True):
            for lr in [None, *sorted(d["lr"].unique())]:
                rows.append({"task": task, "target": target_label(prefix, task), "lr": "all" if lr is None else f"{lr:g}",
                             **equal_pass1_gap(d, prefix, k=k, lam_above=lam_above, lr=lr)})
    return pd.DataFrame(rows)


def plot_equal_pass1(df: pd.DataFrame, prefix: str = "", k: int = 10, lam_above: float | None = 0.0, dpi: int = 90):
    """pass@k against pass@1 per run (forward blue, reverse red) with the two fitted parallel lines
    of ``equal_pass1_gap``. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    d = _spectrum_rows(df)
    d = d[d["kl"].isin(["forward", "reverse"])]
    if lam_above is not None:
        d = d[d["lam"] > lam_above]
    fit = equal_pass1_gap(df, prefix, k=k, lam_above=lam_above)
    fig = Figure(figsize=(4.6, 3.6), dpi=dpi, layout="constrained")
    ax = fig.subplots()
    x_col, y_col = f"{prefix}pass_at_1", f"{prefix}pass_at_{k}"
    for kl, color in (("forward", "tab:blue"), ("reverse", "tab:red")):
        sub = d[d["kl"] == kl]
        ax.scatter(sub[x_col], sub[y_col], s=14, color=color, alpha=0.7, label=f"{kl} KL (n={len(sub)})")
    if math.isfinite(fit["slope"]):
        xs = np.linspace(float(d[x_col].min()), float(d[x_col].max()), 20)
        a = float((d[y_col] - fit["slope"] * d[x_col] - fit["gap"] * (d["kl"] == "forward")).mean())
        ax.plot(xs, a + fit["slope"] * xs + fit["gap"], color="tab:blue", lw=1)
        ax.plot(xs, a + fit["slope"] * xs, color="tab:red", lw=1)
    ax.set(xlabel="pass@1", ylabel=f"pass@{k}")
    where = "" if lam_above is None else f", runs with λ > {lam_above:+g}"
    ax.set_title(f"{prefix.rstrip('_') or 'target task'}: forward - reverse at equal pass@1 = "
                 f"{fit['gap']:+.3f}{where}", fontsize=9)
    ax.legend(fontsize=8)
    return fig
