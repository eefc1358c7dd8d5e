"""Which knob matters: ANOVA with partial eta squared, paired OnPD-OffPD tests, seed variance,
and a mixed model with task as a grouping factor (statsmodels).

All functions take a prepared results table (``kdlab.analysis.table.prepare_results``) and do
not filter it themselves except where stated: pass ``table.main_grid(df)`` for the off/on x
forward/reverse grid with clipping on.
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
from scipy import stats

DEFAULT_FACTORS = ("policy", "kl", "lr", "task")


def _check_metric(df: pd.DataFrame, metric: str) -> None:
    if metric not in df.columns:
        raise ValueError(f"metric {metric!r} is not a column of the results table; columns: {sorted(df.columns)}")
    if not pd.api.types.is_numeric_dtype(df[metric]):
        raise ValueError(f"metric {metric!r} must be numeric, got dtype {df[metric].dtype}")


def _clean_term(term: str) -> str:
    """``C(policy)[T.on]:C(kl)`` -> ``policy[T.on]:kl``."""
    return re.sub(r"C\(([^()]*)\)", r"\1", term)


def anova_table(df: pd.DataFrame, metric: str, factors: tuple[str, ...] = DEFAULT_FACTORS) -> pd.DataFrame:
    """OLS ANOVA (type II sums of squares) of ``metric`` on categorical ``factors`` with interactions.

    Factors with a single level in ``df`` are dropped. All interactions are included when the
    residual keeps at least one degree of freedom (e.g. >= 2 seeds per cell); otherwise the highest
    interaction order is lowered until it does. Each term gets its partial eta squared
    ``SS_term / (SS_term + SS_residual)``: the share of the variance not explained by the other
    terms that this term explains.

    Returns:
        rows per term and the residual: metric, term ("policy", "kl:lr", ..., "Residual"), df,
        sum_sq, F, p, partial_eta_sq, order (the interaction order used). Empty when the metric
        has no variance or no factor varies.
    """
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    _check_metric(df, metric)
    unknown = [f for f in factors if f not in df.columns]
    factors = tuple(f for f in factors if f in df.columns)
    if unknown and not factors:
        raise ValueError(f"none of the factors {unknown} is a column of the results table")
    data = df[[metric, *factors]].dropna(subset=[metric])
    used = [f for f in factors if data[f].nunique(dropna=True) >= 2]
    columns = ["metric", "term", "df", "sum_sq", "F", "p", "partial_eta_sq", "order"]
    if not used or data[metric].var() == 0 or len(data) < 3:
        return pd.DataFrame(columns=columns)
    rhs_terms = " + ".join(f"C({f})" for f in used)
    target = f'Q("{metric}")'
    for order in range(len(used), 0, -1):
        formula = f"{target} ~ ({rhs_terms})" + (f"**{order}" if order > 1 else "")
        model = smf.ols(formula, data=data).fit()
        if model.df_resid >= 1:
            break
    else:
        return pd.DataFrame(columns=columns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        table = anova_lm(model, typ=2)
    ss_res = float(table.loc["Residual", "sum_sq"])
    rows = []
    for term, r in table.iterrows():
        ss = float(r["sum_sq"])
        eta = math.nan if term == "Residual" else (ss / (ss + ss_res) if ss + ss_res > 0 else math.nan)
        rows.append({"metric": metric, "term": "Residual" if term == "Residual" else _clean_term(term),
                     "df": float(r["df"]), "sum_sq": ss, "F": float(r["F"]) if pd.notna(r["F"]) else math.nan,
                     "p": float(r["PR(>F)"]) if pd.notna(r["PR(>F)"]) else math.nan,
                     "partial_eta_sq": eta, "order": order})
    return pd.DataFrame(rows, columns=columns)


def knob_table(df: pd.DataFrame, metrics: list[str], factors: tuple[str, ...] = DEFAULT_FACTORS) -> pd.DataFrame:
    """"Which knob matters": partial eta squared per term (rows) and metric (columns).

    Metrics absent from ``df`` or without variance are left out; rows are sorted by the largest
    value across metrics.
    """
    parts = [anova_table(df, m, factors) for m in metrics if m in df.columns]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame()
    long = pd.concat(parts)
    long = long[long["term"] != "Residual"]
    wide = long.pivot(index="term", columns="metric", values="partial_eta_sq")
    wide = wide[[m for m in metrics if m in wide.columns]]
    return wide.loc[wide.max(axis=1).sort_values(ascending=False).index]


def holm(pvalues: object) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1) of the finite entries,
    by statsmodels' ``multipletests(method="holm")``; NaN stays NaN and is not counted."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


def paired_comparisons(df: pd.DataFrame, metric: str, a: str = "on", b: str = "off",
                       by: tuple[str, ...] = ("task", "kl", "lr"), level: float = 0.95,
                       alpha: float = 0.05) -> pd.DataFrame:
    """Matched policy comparisons: ``a`` minus ``b`` per ``by`` group, paired by seed.

    For every group the seeds run under both policies are paired (several rows of one seed are
    averaged). Per group: n_pairs, mean_a, mean_b, mean_diff, sd_diff, the ``level`` t-interval of
    the mean difference, t, the two-sided paired-t p-value, Cohen's d_z = mean_diff / sd_diff, and
    the Holm-adjusted p over all groups of this call (``p_holm``, ``significant`` at ``alpha``).
    With fewer than 2 pairs the test statistics are NaN. Identical pairs (sd_diff = 0) give
    p = 1 when the mean difference is 0, else p = 0.
    """
    _check_metric(df, metric)
    by = tuple(c for c in by if c in df.columns)
    d = df[df["policy"].isin([a, b])].dropna(subset=[metric])
    rows = []
    groups = d.groupby(list(by), sort=True) if by else [((), d)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        wide = g.pivot_table(index="seed", columns="policy", values=metric, aggfunc="mean")
        if a not in wide.columns or b not in wide.columns:
            continue
        pairs = wide[[a, b]].dropna()
        diff = (pairs[a] - pairs[b]).to_numpy()
        n = int(diff.size)
        row = dict(zip(by, key), metric=metric, n_pairs=n, mean_a=float(pairs[a].mean()) if n else math.nan,
                   mean_b=float(pairs[b].mean()) if n else math.nan)
        mean = float(diff.mean()) if n else math.nan
        sd = float(diff.std(ddof=1)) if n >= 2 else math.nan
        t = p = dz = lo = hi = math.nan
        if n >= 2:
            if sd > 0:
                se = sd / math.sqrt(n)
                t = mean / se
                p = float(2 * stats.t.sf(abs(t), n - 1))
                dz = mean / sd
                half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
                lo, hi = mean - half, mean + half
            else:
                t = math.copysign(math.inf, mean) if mean != 0 else 0.0
                p = 1.0 if mean == 0 else 0.0
                dz = math.copysign(math.inf, mean) if mean != 0 else 0.0
                lo = hi = mean
        row.update(mean_diff=mean, sd_diff=sd, ci_lo=lo, ci_hi=hi, t=t, p=p, d_z=dz)
        rows.append(row)
    cols = [*by, "metric", "n_pairs", "mean_a", "mean_b", "mean_diff", "sd_diff", "ci_lo", "ci_hi", "t", "p", "d_z",
            "p_holm", "significant"]
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=cols)
    out["p_holm"] = holm(out["p"].to_numpy())
    out["significant"] = out["p_holm"] < alpha
    return out[cols]


CONFIG_COLUMNS = ("task", "policy", "lam", "kl", "lr", "grad_clip", "sampled_direction", "dtype")


def seed_variance(df: pd.DataFrame, metrics: list[str], by: tuple[str, ...] = CONFIG_COLUMNS) -> pd.DataFrame:
    """Per configuration (``by``: the columns of it present in ``df``; NaN is a value of its own, so
    runs without clipping are not pooled with clipped ones) and metric: n seeds, mean, SD,
    variance, min, max, range."""
    by = [c for c in by if c in df.columns]
    rows = []
    for key, g in df.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            if m not in g.columns:
                continue
            x = g[m].dropna().to_numpy(dtype=np.float64)
            n = int(x.size)
            sd = float(x.std(ddof=1)) if n >= 2 else math.nan
            rows.append({**dict(zip(by, key)), "metric": m, "n": n, "mean": float(x.mean()) if n else math.nan,
                         "sd": sd, "var": sd ** 2 if n >= 2 else math.nan,
                         "min": float(x.min()) if n else math.nan, "max": float(x.max()) if n else math.nan,
                         "range": float(x.max() - x.min()) if n else math.nan})
    return pd.DataFrame(rows)


def mixed_model(df: pd.DataFrame, metric: str, fixed: tuple[str, ...] = ("policy", "kl", "lr"),
                group: str = "task") -> dict:
    """Linear mixed model: ``metric ~ policy * kl * lr`` (categorical, fixed) with a random
    intercept per ``group`` (statsmodels MixedLM, REML).

    Returns a dict with ``status`` ("fit", "skipped" or "failed") and ``reason``; when fit also
    ``table`` (fixed effects: coef, se, z, p, ci_lo, ci_hi), ``group_var`` (variance of the
    random intercept), ``converged`` and ``warnings`` (messages statsmodels raised). Skipped when
    ``group`` has fewer than 2 levels (a random effect needs several groups).
    """
    import statsmodels.formula.api as smf

    _check_metric(df, metric)
    if group not in df.columns:
        return {"status": "skipped", "reason": f"no {group!r} column in the results table"}
    data = df.dropna(subset=[metric])
    n_groups = data[group].nunique()
    if n_groups < 2:
        return {"status": "skipped",
                "reason": f"{group!r} has {n_groups} level(s) ({sorted(map(str, data[group].unique()))}); "
                          f"a mixed model with {group} as grouping factor needs at least 2"}
    used = [f for f in fixed if f in data.columns and data[f].nunique() >= 2]
    if not used:
        return {"status": "skipped", "reason": f"none of the fixed factors {list(fixed)} varies"}
    formula = f'Q("{metric}") ~ ' + " * ".join(f"C({f})" for f in used)
    caught: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            res = smf.mixedlm(formula, data=data, groups=data[group]).fit(reml=True)
        caught = sorted({str(x.message).splitlines()[0] for x in w})
    except Exception as exc:  # singular designs, failed optimisation
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    ci = res.conf_int()
    fe = res.fe_params.index
    table = pd.DataFrame({"term": [_clean_term(t) for t in fe], "coef": res.fe_params.values,
                          "se": res.bse[fe].values, "z": res.tvalues[fe].values, "p": res.pvalues[fe].values,
                          "ci_lo": ci.loc[fe, 0].values, "ci_hi": ci.loc[fe, 1].values})
    group_var = float(res.cov_re.iloc[0, 0]) if res.cov_re.size else math.nan
    return {"status": "fit", "reason": f"random intercept per {group} ({n_groups} groups)", "table": table,
            "group_var": group_var, "converged": bool(getattr(res, "converged", True)), "warnings": caught,
            "formula": formula}
