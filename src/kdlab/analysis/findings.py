"""The findings scoreboard: each numbered finding of STUDY.md as an explicit test on the results.

Every finding has one function ``finding_<n>(df, ...) -> FindingResult``. Its docstring is the
test; the verdict is computed from the table, never typed in. Verdicts are three-valued, plus
"not run":

* "reproduced": the 95% interval of every part of the test lies on the claim's side of its
  bound (a direction: the interval excludes 0 on the claimed side; a "no difference" or "at least
  as" claim: the interval lies inside the equivalence margin, TOST-style);
* "not reproduced": the evidence is against the claim at ``ALPHA`` for some part (its interval
  lies entirely on the wrong side of the bound: the opposite direction, or outside the margin);
* "inconclusive": neither: the interval straddles the bound, the test cannot tell at this power
  (few seeds, noisy cells). More seeds, not another reading of the means, settle it;
* "not run": the table lacks the columns, configurations or replicate seeds the test needs
  (``detail`` says which).

Intervals (documented in ``docs/calibration.md``, section "Findings verdicts"): the runs of the
cells a test compares (a cell = task x policy x KL x lr, or x lambda on the spectrum) are modelled
as cell means plus a common seed-to-seed error, whose variance is pooled over those cells
(residual of the cell-means model, df = runs - cells). Each statistic (a difference of cell means,
a spread max - min, the best cell of one policy minus the best of the other, a minimum over
matched pairs) gets a 95% percentile interval from a parametric bootstrap of that model
(``N_BOOTSTRAP`` replicates, fixed seed ``BOOTSTRAP_SEED``): each replicate draws the error
variance from its scaled inverse chi-square (df of the pooled residual) and every cell mean from a
normal around the observed one; for a plain difference of means this is the t interval. With two
seeds the pooled variance has few degrees of freedom and the intervals are wide: that is the
honest answer. Exceptions: finding 6 (a mathematical bound checked on every policy pair: a Wilson
interval on the share of pairs under the bound), finding 8's seed-variance part (an F interval on
the ratio of pooled variances), finding 9 (the OLS t interval), and the follow-up findings 11-12
when each configuration has a single value (a binomial interval over ``FOLLOWUP_EVAL_N``
evaluation problems: evaluation noise only, it understates seed-to-seed variation).

Statistics of accuracy, forgetting and sparsity are in points (x100 of the table's fractions);
``df`` is a prepared table (``table.prepare_results``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sstats

from ..kl import SAMPLED_KINDS
from .stats import anova_table, paired_comparisons
from .table import lr_levels, main_grid, variant_columns

ALPHA = 0.05  # two-sided: every interval is a (1 - ALPHA) = 95% interval
N_BOOTSTRAP = 2000  # replicates of the parametric bootstrap
BOOTSTRAP_SEED = 0  # the bootstrap's generator: the same table always gets the same verdicts
# Equivalence and non-inferiority margins (points = percentage points of the table's fractions).
ACCURACY_EQUIVALENCE_POINTS = 3.0  # findings 1 and 13(c): an OnPD accuracy advantage below 3 points is "no advantage"
SPARSITY_EQUIVALENCE_POINTS = 0.5  # finding 4: two sparsities within 0.5 points are equal ("OffPD at least as sparse")
F5_ACCURACY_TOLERANCE_POINTS = 2.0  # finding 5: "top accuracy" = within 2 points of the best configuration
F5_FORGETTING_TOLERANCE_POINTS = 1.5  # finding 5: "without losing prior skills" = mean probe change >= -1.5 points
F7_SPREAD_TOLERANCE_POINTS = 10.0  # finding 7: forward-KL accuracy spread along the spectrum (paper: 5.2 points)
F12_STYLE_MAJORITY = 0.5  # finding 12: "adopts the teacher's style" = share of outputs above one half
F6_MIN_PAIRS = 3  # finding 6: fewer forward-KL policy pairs than this cannot support the bound
FOLLOWUP_EVAL_N = 200  # findings 11-12 without replicates: problems behind each share (rlvr.n_eval, style.n_test)

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN = "reproduced", "not reproduced", "inconclusive", "not run"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN)
SCOREBOARD_COLUMNS = ["finding", "claim", "verdict", "statistic_name", "statistic", "ci_low", "ci_high", "unit",
                      "threshold", "detail", "test"]

CLAIMS = {
    1: "No consistent accuracy advantage for on-policy distillation",
    2: "KL direction matters more than policy; reverse KL is sensitive to the learning rate",
    3: "Learning rate governs forgetting; rollout policy negligible by comparison",
    4: "Learning rate governs update sparsity; OffPD at least as sparse as OnPD in every matched pair",
    5: "Forgetting is not a necessary cost: forward KL at the low rate reaches top accuracy without forgetting",
    6: "Forward-KL logit gradients lie in [-1, 1], so update differences are bounded by TV; reverse has no such bound",
    7: "Forward KL is robust along the lambda spectrum at the low rate",
    8: "Reverse KL favours student-side rollouts at the low rate and is unstable at the high rate",
    9: "Forward KL gives better coverage: higher pass@10 at equal pass@1 (lambda > 0)",
    10: "On-policy generalises better to harder variants (lambda > 0 above off-policy, both directions)",
    11: "After RLVR, OffPD+forward at the low rate (or reverse at the high rate) ends highest; reverse-low collapses",
    12: "Only OnPD + reverse KL avoids incidental style transfer",
    13: "Robustness: sampled estimators keep forward robust / reverse brittle and lr's role; no clipping keeps no OnPD-OffPD gap",
}


# --------------------------------------------------------------------------------------------- verdict rules


@dataclass
class Estimate:
    """A statistic with its 95% interval (``lo``, ``hi``) and how the interval was computed."""

    value: float
    lo: float
    hi: float
    method: str = "bootstrap"


def decide_greater(est: Estimate, bound: float = 0.0) -> str:
    """Claim ``statistic > bound`` (a direction, or non-inferiority with ``bound = -margin``)."""
    if not (np.isfinite(est.lo) and np.isfinite(est.hi)):
        return INCONCLUSIVE
    if est.lo > bound:
        return REPRODUCED
    if est.hi < bound:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def decide_less(est: Estimate, bound: float = 0.0) -> str:
    """Claim ``statistic < bound`` (a direction, or non-superiority with ``bound = +margin``)."""
    if not (np.isfinite(est.lo) and np.isfinite(est.hi)):
        return INCONCLUSIVE
    if est.hi < bound:
        return REPRODUCED
    if est.lo > bound:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def decide_equivalent(est: Estimate, margin: float) -> str:
    """Claim ``|statistic| <= margin`` (TOST-style: the interval inside [-margin, margin])."""
    if not (np.isfinite(est.lo) and np.isfinite(est.hi)):
        return INCONCLUSIVE
    if -margin <= est.lo and est.hi <= margin:
        return REPRODUCED
    if est.lo > margin or est.hi < -margin:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def combine(verdicts: Sequence[str]) -> str:
    """All parts reproduced -> reproduced; any part not reproduced -> not reproduced; else inconclusive."""
    if not verdicts:
        return NOT_RUN
    if any(v == NOT_REPRODUCED for v in verdicts):
        return NOT_REPRODUCED
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return INCONCLUSIVE


@dataclass
class Part:
    """One part of a finding's test: its statistic, interval, the bound it is compared to, verdict."""

    name: str
    estimate: Estimate
    threshold: float
    verdict: str
    unit: str = "points"

    def text(self) -> str:
        e, u = self.estimate, ("" if self.unit == "points" else f" {self.unit}")
        pts = " pts" if self.unit == "points" else ""
        return (f"{self.name} {_fmt(e.value)}{pts} [{_fmt(e.lo)}, {_fmt(e.hi)}]{u} vs {_fmt(self.threshold)}"
                f": {self.verdict}")


def _part(name: str, est: Estimate, claim: str, threshold: float, unit: str = "points") -> Part:
    rule = {"greater": decide_greater, "less": decide_less}[claim]
    return Part(name, est, threshold, rule(est, threshold), unit)


@dataclass
class FindingResult:
    """One scoreboard row. ``statistic`` (with ``ci_low``/``ci_high``) is the headline part's
    value; ``parts`` hold every part of the test, ``values`` the numbers behind the detail."""

    number: int
    verdict: str
    detail: str
    test: str
    statistic_name: str = ""
    statistic: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    unit: str = ""
    threshold: float = math.nan
    parts: list[Part] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def claim(self) -> str:
        return CLAIMS[self.number]


def _result(number: int, test: str, parts: list[Part], headline: int = 0, notes: Sequence[str] = (),
            values: dict[str, Any] | None = None) -> FindingResult:
    h = parts[headline]
    detail = "; ".join([p.text() for p in parts] + list(notes))
    return FindingResult(number, combine([p.verdict for p in parts]), detail, test, h.name, h.estimate.value,
                         h.estimate.lo, h.estimate.hi, h.unit, h.threshold, parts, values or {})


def _not_run(number: int, test: str, why: str) -> FindingResult:
    return FindingResult(number, NOT_RUN, why, test)


def _first_line(func: Callable) -> str:
    doc = (func.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def _has(df: pd.DataFrame, *cols: str) -> list[str]:
    return [c for c in cols if c not in df.columns or df[c].notna().sum() == 0]


def _fmt(x: float, digits: int = 3) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


# --------------------------------------------------------------------------------------------- the cell-means model


@dataclass
class Cells:
    """Cell means of one metric, their run counts and the pooled seed-to-seed variance.

    ``stratum`` (per cell) indexes ``s_mse`` / ``s_df``, the variance pooled within each stratum
    of cells (``pool_by``); ``mse`` / ``df`` pool over all cells. ``known_var`` (per cell, the
    variance of the mean) replaces the pooled model when given (the binomial fallback)."""

    means: pd.Series
    n: pd.Series
    mse: float
    df: int
    stratum: np.ndarray | None = None
    s_mse: np.ndarray | None = None
    s_df: np.ndarray | None = None
    known_var: np.ndarray | None = None

    @property
    def replicated(self) -> bool:
        return self.known_var is not None or self.df >= 1


def cell_model(d: pd.DataFrame, metric: str, by: Sequence[str], pool_by: Sequence[str] = ()) -> Cells:
    """The cell-means model of ``metric`` over the cells ``by`` (NaN rows dropped).

    The seed-to-seed variance is pooled within the strata of cells that share the ``pool_by``
    levels (e.g. kl x lr: reverse KL at the high rate is noisier than the rest), falling back to
    the variance pooled over all cells for a stratum without replicates."""
    x = d.dropna(subset=[metric])
    g = x.groupby(list(by), sort=True)[metric]
    means, n = g.mean(), g.count()
    ss_cell = g.var(ddof=1).fillna(0.0) * (n - 1)
    dof = int((n - 1).sum())
    if not isinstance(means.index, pd.MultiIndex):
        idx = pd.MultiIndex.from_arrays([means.index], names=list(by))
        means.index, n.index, ss_cell.index = idx, idx, idx
    mse = float(ss_cell.sum() / dof) if dof > 0 else math.nan
    pool_by = [p for p in pool_by if p in by]
    if pool_by:
        keys = pd.MultiIndex.from_arrays([means.index.get_level_values(p) for p in pool_by])
        codes, uniques = pd.factorize(keys)
        s_df = np.array([float((n.to_numpy()[codes == k] - 1).sum()) for k in range(len(uniques))])
        s_ss = np.array([float(ss_cell.to_numpy()[codes == k].sum()) for k in range(len(uniques))])
        with np.errstate(invalid="ignore", divide="ignore"):
            s_mse = np.where(s_df > 0, s_ss / np.maximum(s_df, 1), mse)
        s_df = np.where(s_df > 0, s_df, dof)
    else:
        codes, s_mse, s_df = np.zeros(len(means), dtype=int), np.array([mse]), np.array([float(dof)])
    return Cells(means.astype(float), n, mse, dof, codes, s_mse, s_df)


def binomial_cells(d: pd.DataFrame, metric: str, by: Sequence[str], n_eval: int = FOLLOWUP_EVAL_N) -> Cells:
    """Like :func:`cell_model`, but when no cell has two runs each cell mean (a share) gets the
    binomial variance of a share over ``n_eval`` problems per run (Wilson-centred: p shrunk
    towards 1/2, so that a share of 0 or 1 still gets an interval)."""
    c = cell_model(d, metric, by)
    if c.df >= 1:
        return c
    p = c.means.to_numpy().clip(0, 1)
    z2 = sstats.norm.ppf(1 - ALPHA / 2) ** 2
    m = n_eval * c.n.to_numpy()
    p_w = (p * m + z2 / 2) / (m + z2)
    c.known_var = p_w * (1 - p_w) / (m + z2)
    return c


def _draws(c: Cells, n_boot: int = N_BOOTSTRAP, seed: int = BOOTSTRAP_SEED) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    m = c.means.to_numpy()
    z = rng.standard_normal((n_boot, m.size))
    if c.known_var is not None:
        draws = m + np.sqrt(c.known_var) * z
    elif c.df >= 1:
        s_df = c.s_df.astype(float)
        ok = (s_df >= 1) & np.isfinite(c.s_mse)
        chi = rng.chisquare(np.where(ok, s_df, 1.0), size=(n_boot, s_df.size))
        # sigma^2 | s^2 ~ df s^2 / chi2_df (scaled inverse chi-square): a difference of means then has the t interval
        s2 = np.where(ok, np.nan_to_num(c.s_mse) * np.where(ok, s_df, 1.0) / chi, 0.0)  # (n_boot, strata)
        draws = m + np.sqrt(s2[:, c.stratum] / c.n.to_numpy()) * z
    else:
        draws = np.tile(m, (n_boot, 1))
    return pd.DataFrame(draws, columns=c.means.index)


def bootstrap(c: Cells, stat: Callable[[pd.DataFrame], Any], scale: float = 100.0) -> Estimate:
    """``stat`` (rows of cell means -> one value per row) on the observed means, with its 95%
    percentile interval over the parametric bootstrap of ``c``; times ``scale``."""
    obs = pd.DataFrame([c.means.to_numpy()], columns=c.means.index)
    value = float(np.asarray(stat(obs), dtype=float).reshape(-1)[0]) * scale
    reps = np.asarray(stat(_draws(c)), dtype=float).reshape(-1) * scale
    reps = reps[np.isfinite(reps)]
    if not reps.size or not math.isfinite(value):
        return Estimate(value, math.nan, math.nan)
    lo, hi = np.quantile(reps, [ALPHA / 2, 1 - ALPHA / 2])
    method = "binomial" if c.known_var is not None else "bootstrap"
    return Estimate(value, float(min(lo, value)), float(max(hi, value)), method)


def sel(M: pd.DataFrame, **levels: Any) -> pd.DataFrame:
    """Columns (cells) of ``M`` whose index levels equal the given values (a callable: a test)."""
    mask = np.ones(M.shape[1], dtype=bool)
    for name, v in levels.items():
        vals = M.columns.get_level_values(name)
        mask &= np.asarray(v(vals) if callable(v) else vals == v, dtype=bool)
    return M.loc[:, mask]


def _levels(c: Cells, name: str) -> list:
    return sorted(c.means.index.get_level_values(name).unique())


def _spread(M: pd.DataFrame) -> pd.Series:
    return M.max(axis=1) - M.min(axis=1)


def _effect(M: pd.DataFrame, factor: str, hi: Any, lo: Any) -> pd.Series:
    """Main effect balanced over cells: mean of the cells at ``hi`` minus the mean at ``lo``."""
    return sel(M, **{factor: hi}).mean(axis=1) - sel(M, **{factor: lo}).mean(axis=1)


def _no_replicates(number: int, test: str, what: str = "configuration") -> FindingResult:
    return _not_run(number, test, f"needs >= 2 seeds in some {what} for the seed-to-seed variance (intervals)")


# --------------------------------------------------------------------------------------------- findings 1-6


GRID_CELL = ["task", "policy", "kl", "lr"]
GRID_POOL = ["kl", "lr"]  # seed variance pooled per KL x lr (reverse at the high rate is noisier)


def finding_1(df: pd.DataFrame) -> FindingResult:
    """Best OnPD minus best OffPD accuracy (the best of each policy over kl x lr in the main grid,
    per task, averaged over tasks) is below ACCURACY_EQUIVALENCE_POINTS: its 95% interval lies
    under the margin (non-superiority; an OffPD advantage also satisfies the claim). Matched
    OnPD-OffPD pairs (paired by seed, Holm) are reported.
    """
    test = _first_line(finding_1) + f" (margin {ACCURACY_EQUIVALENCE_POINTS} points)"
    g = main_grid(df)
    if miss := _has(g, "accuracy"):
        return _not_run(1, test, f"missing columns {miss}")
    if set(g["policy"]) != {"off", "on"}:
        return _not_run(1, test, f"needs OffPD and OnPD runs, has policies {sorted(set(g['policy']))}")
    c = cell_model(g, "accuracy", GRID_CELL, GRID_POOL)
    if not c.replicated:
        return _no_replicates(1, test)
    tasks = _levels(c, "task")

    def stat(M):
        return np.mean([sel(M, task=t, policy="on").max(axis=1) - sel(M, task=t, policy="off").max(axis=1)
                        for t in tasks], axis=0)

    est = bootstrap(c, stat)
    best = []
    for t in tasks:
        m = c.means.xs(t, level="task")
        on, off = m.xs("on", level="policy"), m.xs("off", level="policy")
        best.append({"task": t, "best_on": float(on.max()), "best_off": float(off.max()),
                     "best_on_config": on.idxmax(), "best_off_config": off.idxmax()})
    pairs = paired_comparisons(g, "accuracy", alpha=ALPHA)
    n_on = int((pairs["significant"] & (pairs["mean_diff"] > 0)).sum())
    n_off = int((pairs["significant"] & (pairs["mean_diff"] < 0)).sum())
    notes = [f"{b['task']}: best OnPD {b['best_on']:.3f} vs best OffPD {b['best_off']:.3f}" for b in best]
    notes.append(f"matched pairs significant after Holm: {n_on}/{len(pairs)} OnPD better, {n_off}/{len(pairs)} OffPD better")
    part = _part("best OnPD - best OffPD accuracy", est, "less", ACCURACY_EQUIVALENCE_POINTS)
    return _result(1, test, [part], notes=notes,
                   values={"best": best, "n_pairs": len(pairs), "n_on_better": n_on, "n_off_better": n_off})


def finding_2(df: pd.DataFrame) -> FindingResult:
    """(a) The accuracy spread (max - min of the cell means over policy x lr) is larger for reverse
    than for forward KL (reverse minus forward, averaged over tasks, interval above 0), and (b) the
    KL main effect on accuracy is larger in size than the policy main effect (|kl| - |policy|,
    balanced over cells, interval above 0). Partial eta squared of the ANOVA is reported.
    """
    test = _first_line(finding_2)
    g = main_grid(df)
    if miss := _has(g, "accuracy"):
        return _not_run(2, test, f"missing columns {miss}")
    if set(g["kl"]) != {"forward", "reverse"} or g["policy"].nunique() < 2 or g["lr"].nunique() < 2:
        return _not_run(2, test, "needs forward and reverse KL, both policies and >= 2 learning rates")
    c = cell_model(g, "accuracy", GRID_CELL, GRID_POOL)
    if not c.replicated:
        return _no_replicates(2, test)
    tasks = _levels(c, "task")

    def spread_gap(M):
        return np.mean([_spread(sel(M, task=t, kl="reverse")) - _spread(sel(M, task=t, kl="forward"))
                        for t in tasks], axis=0)

    def effects(M):
        return _effect(M, "kl", "forward", "reverse").abs() - _effect(M, "policy", "on", "off").abs()

    parts = [_part("reverse - forward accuracy spread", bootstrap(c, spread_gap), "greater", 0.0),
             _part("|kl effect| - |policy effect| on accuracy", bootstrap(c, effects), "greater", 0.0)]
    spreads, notes = {}, []
    for t in tasks:
        m = c.means.xs(t, level="task")
        spreads[t] = {kl: float(m.xs(kl, level="kl").max() - m.xs(kl, level="kl").min()) for kl in ("forward", "reverse")}
        notes.append(f"{t}: spread forward {spreads[t]['forward']:.3f} vs reverse {spreads[t]['reverse']:.3f}")
    an = anova_table(g, "accuracy")
    eta = dict(zip(an["term"], an["partial_eta_sq"])) if len(an) else {}
    if "kl" in eta and "policy" in eta:
        notes.append(f"partial eta^2 kl {eta['kl']:.3f} vs policy {eta['policy']:.3f}")
    return _result(2, test, parts, notes=notes,
                   values={"spreads": spreads, "eta_kl": eta.get("kl", math.nan), "eta_policy": eta.get("policy", math.nan)})


def finding_3(df: pd.DataFrame) -> FindingResult:
    """Main grid, cell means balanced over task x policy x kl x lr: (a) the lr main effect on
    forgetting (high - low) is negative (interval below 0), and (b) it is larger in size than the
    policy main effect (|lr| - |policy|, interval above 0).
    """
    test = _first_line(finding_3)
    g = main_grid(df)
    if miss := _has(g, "forgetting"):
        return _not_run(3, test, f"missing columns {miss}")
    lv = lr_levels(g)
    if lv is None or g["policy"].nunique() < 2:
        return _not_run(3, test, "needs >= 2 learning rates and both policies")
    lo, hi = lv
    g = g[g["lr"].isin([lo, hi])]
    c = cell_model(g, "forgetting", GRID_CELL, GRID_POOL)
    if not c.replicated:
        return _no_replicates(3, test)
    lr_eff = bootstrap(c, lambda M: _effect(M, "lr", hi, lo))
    gap = bootstrap(c, lambda M: _effect(M, "lr", hi, lo).abs() - _effect(M, "policy", "on", "off").abs())
    pol_eff = bootstrap(c, lambda M: _effect(M, "policy", "on", "off"))
    f_lo, f_hi = float(g.loc[g["lr"] == lo, "forgetting"].mean()), float(g.loc[g["lr"] == hi, "forgetting"].mean())
    parts = [_part("lr effect on forgetting (high - low)", lr_eff, "less", 0.0),
             _part("|lr effect| - |policy effect| on forgetting", gap, "greater", 0.0)]
    notes = [f"mean forgetting low lr {f_lo:+.4f}, high lr {f_hi:+.4f}; policy effect (OnPD - OffPD) "
             f"{_fmt(pol_eff.value)} pts [{_fmt(pol_eff.lo)}, {_fmt(pol_eff.hi)}]"]
    return _result(3, test, parts, notes=notes,
                   values={"forgetting_low": f_lo, "forgetting_high": f_hi, "lr_effect": lr_eff.value / 100,
                           "policy_effect": pol_eff.value / 100})


def finding_4(df: pd.DataFrame) -> FindingResult:
    """(a) In every matched (task, kl, lr) configuration OffPD is at least as sparse as OnPD: the
    smallest OffPD - OnPD sparsity difference over the matched pairs has its interval above
    -SPARSITY_EQUIVALENCE_POINTS (non-inferiority), and (b) sparsity is higher at the low lr (low -
    high, balanced over cells, interval above 0).
    """
    test = _first_line(finding_4) + f" (margin {SPARSITY_EQUIVALENCE_POINTS} points)"
    g = main_grid(df)
    if miss := _has(g, "sparsity"):
        return _not_run(4, test, f"missing columns {miss}")
    lv = lr_levels(g)
    if lv is None or g["policy"].nunique() < 2:
        return _not_run(4, test, "needs >= 2 learning rates and both policies")
    lo, hi = lv
    wide = g.pivot_table(index=["task", "kl", "lr"], columns="policy", values="sparsity", aggfunc="mean").dropna()
    if wide.empty:
        return _not_run(4, test, "no (task, kl, lr) configuration has both policies")
    c = cell_model(g, "sparsity", GRID_CELL, GRID_POOL)
    if not c.replicated:
        return _no_replicates(4, test)
    matched = list(wide.index)

    def worst_pair(M):
        return np.min([sel(M, task=t, kl=k, lr=r, policy="off").iloc[:, 0] - sel(M, task=t, kl=k, lr=r, policy="on").iloc[:, 0]
                       for t, k, r in matched], axis=0)

    parts = [_part("min over matched pairs of OffPD - OnPD sparsity", bootstrap(c, worst_pair), "greater",
                   -SPARSITY_EQUIVALENCE_POINTS),
             _part("sparsity low lr - high lr", bootstrap(c, lambda M: _effect(M, "lr", lo, hi)), "greater", 0.0)]
    n_ok = int((wide["off"] >= wide["on"]).sum())
    s_lo, s_hi = float(g.loc[g["lr"] == lo, "sparsity"].mean()), float(g.loc[g["lr"] == hi, "sparsity"].mean())
    dtypes = sorted(map(str, df["sparsity_dtype"].dropna().unique())) if "sparsity_dtype" in df.columns else \
        sorted(map(str, df["dtype"].dropna().unique())) if "dtype" in df.columns else []
    notes = [f"mean sparsity low lr {s_lo:.3f}, high lr {s_hi:.3f}; OffPD >= OnPD in {n_ok}/{len(wide)} matched "
             f"configurations by the means (weights dtype {', '.join(dtypes) or 'unknown'})"]
    return _result(4, test, parts, notes=notes,
                   values={"sparsity_low": s_lo, "sparsity_high": s_hi, "n_matched": len(wide), "n_off_ge_on": n_ok})


def finding_5(df: pd.DataFrame) -> FindingResult:
    """In every task, the best forward-KL low-lr configuration (either policy, chosen by its mean
    accuracy) (a) loses no prior skills: its mean forgetting has its interval above
    -F5_FORGETTING_TOLERANCE_POINTS (the smallest over tasks), and (b) reaches top accuracy: the
    best forward low-lr accuracy minus the best of the main grid has its interval above
    -F5_ACCURACY_TOLERANCE_POINTS (the smallest over tasks).
    """
    test = _first_line(finding_5) + f" (tolerances {F5_FORGETTING_TOLERANCE_POINTS}, {F5_ACCURACY_TOLERANCE_POINTS} points)"
    g = main_grid(df)
    if miss := _has(g, "accuracy", "forgetting"):
        return _not_run(5, test, f"missing columns {miss}")
    lv = lr_levels(g)
    if lv is None or "forward" not in set(g["kl"]):
        return _not_run(5, test, "needs forward-KL runs and >= 2 learning rates")
    lo = lv[0]
    acc, forg = cell_model(g, "accuracy", GRID_CELL, GRID_POOL), cell_model(g, "forgetting", GRID_CELL, GRID_POOL)
    if not (acc.replicated and forg.replicated):
        return _no_replicates(5, test)
    tasks = _levels(acc, "task")
    picks, values, notes = {}, {}, []
    for t in tasks:
        m = acc.means.xs(t, level="task")
        fl = m[(m.index.get_level_values("kl") == "forward") & (m.index.get_level_values("lr") == lo)]
        if fl.empty:
            return _not_run(5, test, f"task {t}: no forward-KL run at the low lr {lo:g}")
        pol = fl.index.get_level_values("policy")[int(np.argmax(fl.to_numpy()))]
        picks[t] = pol
        if (t, pol, "forward", lo) not in forg.means.index:
            return _not_run(5, test, f"task {t}: no forgetting measured for {pol}/forward at the low lr {lo:g}")
        f = float(forg.means.loc[(t, pol, "forward", lo)])
        values[t] = {"forward_low_accuracy": float(fl.max()), "best_accuracy": float(m.max()), "forward_low_forgetting": f}
        notes.append(f"{t}: forward low-lr ({pol}) accuracy {fl.max():.3f} vs best {m.max():.3f}, forgetting {f:+.4f}")

    def forgetting(M):
        return np.min([sel(M, task=t, policy=picks[t], kl="forward", lr=lo).iloc[:, 0] for t in tasks], axis=0)

    def gap(M):
        return np.min([sel(M, task=t, kl="forward", lr=lo).max(axis=1) - sel(M, task=t).max(axis=1) for t in tasks], axis=0)

    parts = [_part("forgetting of the best forward low-lr configuration", bootstrap(forg, forgetting), "greater",
                   -F5_FORGETTING_TOLERANCE_POINTS),
             _part("best forward low-lr accuracy - best accuracy", bootstrap(acc, gap), "greater",
                   -F5_ACCURACY_TOLERANCE_POINTS)]
    return _result(5, test, parts, notes=notes, values=values)


def finding_6(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> FindingResult:
    """From the gradient analysis (notebook 50's ``bound.csv``): every forward-KL logit-gradient
    entry has |entry| <= 1 and every forward-KL update distance lies under the 2 TV line (a
    mathematical bound: one pair over it refutes it). The statistic is the share of forward-KL
    policy pairs under the line with its Wilson interval; fewer than F6_MIN_PAIRS pairs is
    inconclusive. Reverse KL is reported (its max |entry|, how often it crosses the line).
    """
    test = _first_line(finding_6)
    need = {"direction", "max_abs_entry", "dist_logit", "tv"}
    if gradients is None or len(gradients) == 0:
        return _not_run(6, test, "no gradient-analysis table (run notebooks/50_gradients first)")
    if miss := sorted(need - set(gradients.columns)):
        return _not_run(6, test, f"gradient table lacks columns {miss}")
    fw = gradients[gradients["direction"] == "forward"]
    rv = gradients[gradients["direction"] == "reverse"]
    if fw.empty:
        return _not_run(6, test, "gradient table has no forward-KL rows")
    fmax = float(fw["max_abs_entry"].max())
    below = fw["dist_logit"] <= 2 * fw["tv"] * (1 + 1e-9) + 1e-12
    k, n = int(below.sum()), len(fw)
    lo, hi = wilson(k, n)
    rmax = float(rv["max_abs_entry"].max()) if len(rv) else math.nan
    r_cross = int((rv["dist_logit"] > 2 * rv["tv"] * (1 + 1e-9) + 1e-12).sum()) if len(rv) else 0
    est = Estimate(k / n, lo, hi, "wilson")
    if fmax > 1.0 + 1e-9 or k < n:
        verdict = NOT_REPRODUCED
    else:
        verdict = REPRODUCED if n >= F6_MIN_PAIRS else INCONCLUSIVE
    detail = (f"forward max |entry| {fmax:.3f}, under 2 TV in {k}/{n} policy pairs (Wilson [{lo:.3f}, {hi:.3f}]); "
              f"reverse max |entry| {_fmt(rmax)}, above 2 TV in {r_cross}/{len(rv)} pairs")
    part = Part("share of forward-KL pairs under 2 TV", est, 1.0, verdict, "share")
    return FindingResult(6, verdict, detail, test, part.name, est.value, lo, hi, "share", 1.0, [part],
                         {"forward_max_abs_entry": fmax, "reverse_max_abs_entry": rmax, "reverse_crossings": r_cross})


def wilson(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n (level 1 - alpha)."""
    if n <= 0:
        return math.nan, math.nan
    z = sstats.norm.ppf(1 - alpha / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# --------------------------------------------------------------------------------------------- findings 7-13


def _spectrum_data(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the tasks with lambda runs (all policies), clipped runs only."""
    tasks = set(df.loc[df["policy"] == "lambda", "task"])
    d = df[df["task"].isin(tasks) & df["kl"].isin(["forward", "reverse"])]
    if "grad_clip" in d.columns and d["grad_clip"].notna().any():
        d = d[d["grad_clip"].notna()]
    return d


def finding_7(df: pd.DataFrame) -> FindingResult:
    """On each lambda task at the low lr, (a) the spread (max - min) of forward-KL accuracy over the
    lambda values (>= 3 values, OffPD/OnPD included) is below F7_SPREAD_TOLERANCE_POINTS (the
    largest over tasks; interval below the tolerance), and (b) when reverse runs cover >= 3
    lambdas, the reverse spread exceeds the forward one (the smallest over tasks; interval above 0).
    """
    test = _first_line(finding_7) + f" (tolerance {F7_SPREAD_TOLERANCE_POINTS} points)"
    d = _spectrum_data(df)
    if d.empty or _has(d, "accuracy"):
        return _not_run(7, test, "no lambda-spectrum runs with accuracy")
    lo = float(d["lr"].min())
    d = d[d["lr"] == lo]
    c = cell_model(d, "accuracy", ["task", "kl", "lam"], ["kl"])
    tasks = _levels(c, "task")
    values, notes, with_reverse = {}, [], []
    for t in tasks:
        m = c.means.xs(t, level="task")
        fw = m.xs("forward", level="kl") if "forward" in m.index.get_level_values("kl") else pd.Series(dtype=float)
        if len(fw) < 3:
            return _not_run(7, test, f"{t}: needs >= 3 lambda values for forward KL at lr {lo:g}, has {len(fw)}")
        rv = m.xs("reverse", level="kl") if "reverse" in m.index.get_level_values("kl") else pd.Series(dtype=float)
        if len(rv) >= 3:
            with_reverse.append(t)
        values[t] = {"forward_spread": float(fw.max() - fw.min()),
                     "reverse_spread": float(rv.max() - rv.min()) if len(rv) else math.nan, "n_lambdas": len(fw)}
        notes.append(f"{t} lr {lo:g}: forward spread {values[t]['forward_spread']:.3f} over {len(fw)} lambdas "
                     f"(min {fw.min():.3f}), reverse spread {_fmt(values[t]['reverse_spread'])}")
    if not c.replicated:
        return _no_replicates(7, test, "spectrum point")
    parts = [_part("largest forward-KL accuracy spread over lambda", bootstrap(
        c, lambda M: np.max([_spread(sel(M, task=t, kl="forward")) for t in tasks], axis=0)), "less",
        F7_SPREAD_TOLERANCE_POINTS)]
    if with_reverse:
        parts.append(_part("reverse - forward spread over lambda", bootstrap(
            c, lambda M: np.min([_spread(sel(M, task=t, kl="reverse")) - _spread(sel(M, task=t, kl="forward"))
                                 for t in with_reverse], axis=0)), "greater", 0.0))
    return _result(7, test, parts, notes=notes, values=values)


def variance_ratio(a: Cells, b: Cells) -> Estimate:
    """Ratio of the pooled seed variances of ``a`` and ``b`` with its F interval."""
    if a.df < 1 or b.df < 1 or not (b.mse > 0):
        return Estimate(math.nan, math.nan, math.nan, "F")
    r = a.mse / b.mse
    return Estimate(r, r / sstats.f.ppf(1 - ALPHA / 2, a.df, b.df), r / sstats.f.ppf(ALPHA / 2, a.df, b.df), "F")


def finding_8(df: pd.DataFrame) -> FindingResult:
    """On the lambda tasks with reverse KL: (a) at the low lr, reverse-KL accuracy over lambda > 0
    cells minus over lambda < 0 cells is positive (the smallest over tasks; interval above 0), and
    (b) at the high lr the seed variance of reverse KL exceeds that of forward KL (ratio of pooled
    within-cell variances; F interval above 1). Collapsed reverse runs are counted.
    """
    test = _first_line(finding_8)
    d = _spectrum_data(df)
    if d.empty or _has(d, "accuracy"):
        return _not_run(8, test, "no lambda-spectrum runs with accuracy")
    lv = lr_levels(d)
    if lv is None:
        return _not_run(8, test, "needs >= 2 learning rates on the spectrum")
    lo, hi = lv
    r_lo = d[(d["kl"] == "reverse") & (d["lr"] == lo)]
    tasks = sorted(d["task"].unique())
    for t in tasks:
        lam = r_lo.loc[r_lo["task"] == t, "lam"]
        if not ((lam > 0).any() and (lam < 0).any()):
            return _not_run(8, test, f"{t}: needs reverse-KL runs at lambda > 0 and < 0 at lr {lo:g}")
    c = cell_model(r_lo, "accuracy", ["task", "lam"])
    v_rev = cell_model(d[(d["kl"] == "reverse") & (d["lr"] == hi)], "accuracy", ["task", "lam"])
    v_fwd = cell_model(d[(d["kl"] == "forward") & (d["lr"] == hi)], "accuracy", ["task", "lam"])
    if not (c.replicated and v_rev.replicated and v_fwd.replicated):
        return _no_replicates(8, test, "spectrum point")

    def side_gap(M):
        return np.min([sel(M, task=t, lam=lambda x: x > 0).mean(axis=1) - sel(M, task=t, lam=lambda x: x < 0).mean(axis=1)
                       for t in tasks], axis=0)

    ratio = variance_ratio(v_rev, v_fwd)
    parts = [_part("reverse low-lr accuracy lambda>0 - lambda<0", bootstrap(c, side_gap), "greater", 0.0),
             Part("seed variance ratio reverse / forward at the high lr", ratio, 1.0, decide_greater(ratio, 1.0), "ratio")]
    values, notes = {}, []
    for t in tasks:
        x = r_lo[r_lo["task"] == t]
        pos, neg = x.loc[x["lam"] > 0, "accuracy"].mean(), x.loc[x["lam"] < 0, "accuracy"].mean()
        sd = {kl: float(d[(d["task"] == t) & (d["kl"] == kl) & (d["lr"] == hi)].groupby("lam")["accuracy"].std(ddof=1).mean())
              for kl in ("forward", "reverse")}
        t_hi = d[(d["task"] == t) & (d["kl"] == "reverse") & (d["lr"] == hi)]
        collapsed = int(t_hi["collapsed"].sum()) if "collapsed" in t_hi.columns else 0
        values[t] = {"reverse_low_pos": float(pos), "reverse_low_neg": float(neg), "sd_reverse_high": sd["reverse"],
                     "sd_forward_high": sd["forward"], "collapsed": collapsed}
        notes.append(f"{t}: reverse lr {lo:g} lambda>0 {pos:.3f} vs lambda<0 {neg:.3f}; lr {hi:g} seed SD reverse "
                     f"{sd['reverse']:.3f} vs forward {sd['forward']:.3f}; {collapsed} reverse runs collapsed")
    return _result(8, test, parts, notes=notes, values=values)


def finding_9(df: pd.DataFrame) -> FindingResult:
    """On the lambda task (countdown-3 when present), runs with lambda > 0: in the OLS
    ``pass_at_10 ~ pass_at_1 + kl`` the forward-KL coefficient (pass@10 advantage at equal pass@1)
    is positive: its 95% t interval lies above 0.
    """
    import statsmodels.formula.api as smf

    test = _first_line(finding_9)
    d = _spectrum_data(df)
    if d.empty or _has(d, "pass_at_1", "pass_at_10"):
        return _not_run(9, test, "no lambda-spectrum runs with pass_at_1 and pass_at_10")
    task = "countdown-3" if "countdown-3" in set(d["task"]) else sorted(d["task"].unique())[0]
    t = d[(d["task"] == task) & (d["lam"] > 0)].dropna(subset=["pass_at_1", "pass_at_10"])
    if t["kl"].nunique() < 2 or len(t) < 4:
        return _not_run(9, test, f"{task}: needs lambda > 0 runs of both KL directions (>= 4 runs)")
    fit = smf.ols("pass_at_10 ~ pass_at_1 + C(kl, Treatment('reverse'))", data=t).fit()
    name = "C(kl, Treatment('reverse'))[T.forward]"
    coef, p = float(fit.params[name]), float(fit.pvalues[name])
    if fit.df_resid >= 1 and np.isfinite(fit.bse[name]):
        lo, hi = (float(v) for v in fit.conf_int(alpha=ALPHA).loc[name])
    else:
        lo = hi = math.nan
    est = Estimate(100 * coef, 100 * lo, 100 * hi, "t (OLS)")
    gaps = (t["pass_at_10"] - t["pass_at_1"]).groupby(t["kl"]).mean()
    notes = [f"{task}, lambda > 0 ({len(t)} runs), p {p:.3g}; mean pass@10 - pass@1 forward "
             f"{gaps.get('forward', math.nan):.3f}, reverse {gaps.get('reverse', math.nan):.3f}"]
    part = _part("forward pass@10 advantage at equal pass@1", est, "greater", 0.0)
    return _result(9, test, [part], notes=notes, values={"task": task, "coef": coef, "p": p})


def finding_10(df: pd.DataFrame) -> FindingResult:
    """Harder-variant accuracy (countdown-4e_accuracy when present, else the first variant column):
    for both KL directions, the mean over lambda > 0 cells minus the mean over lambda < 0 cells
    (OffPD included; cells = task x lambda x lr) is positive: the smaller of the two has its
    interval above 0. Spearman rho(lambda, metric) is reported.
    """
    test = _first_line(finding_10)
    variants = variant_columns(df)
    if not variants:
        return _not_run(10, test, "no harder-variant accuracy column (<variant>_accuracy)")
    col = "countdown-4e_accuracy" if "countdown-4e_accuracy" in variants else variants[0]
    d = df[df["kl"].isin(["forward", "reverse"])].dropna(subset=[col])
    if "grad_clip" in d.columns and d["grad_clip"].notna().any():
        d = d[d["grad_clip"].notna()]
    values, notes = {}, []
    for kl in ("forward", "reverse"):
        k = d[d["kl"] == kl]
        pos, neg = k.loc[k["lam"] > 0, col], k.loc[k["lam"] < 0, col]
        if pos.empty or neg.empty:
            return _not_run(10, test, f"{col}: needs {kl}-KL runs at lambda > 0 and < 0")
        rho = float(sstats.spearmanr(k["lam"], k[col]).statistic) if k["lam"].nunique() > 1 else math.nan
        values[kl] = {"pos": float(pos.mean()), "neg": float(neg.mean()), "rho": rho}
        notes.append(f"{kl}: lambda>0 {pos.mean():.3f} vs lambda<0 {neg.mean():.3f} (Spearman rho {_fmt(rho)})")
    c = cell_model(d, col, ["kl", "task", "lam", "lr"], ["kl", "lr"])
    if not c.replicated:
        return _no_replicates(10, test, "(kl, lambda, lr) cell")

    def gap(M):
        return np.min([sel(M, kl=kl, lam=lambda x: x > 0).mean(axis=1) - sel(M, kl=kl, lam=lambda x: x < 0).mean(axis=1)
                       for kl in ("forward", "reverse")], axis=0)

    part = _part(f"{col} lambda>0 - lambda<0 (smaller of the two KLs)", bootstrap(c, gap), "greater", 0.0)
    return _result(10, test, [part], notes=notes, values={"column": col, **values})


def finding_11(df: pd.DataFrame) -> FindingResult:
    """Needs RLVR results (column ``rlvr_accuracy``): (a) reverse KL at the low lr ends below
    OffPD+forward at the low lr (difference interval above 0), and (b) the configuration with the
    highest mean rlvr_accuracy is OffPD+forward at the low lr or reverse KL at the high lr (in at
    least 95% of the bootstrap replicates; in at most 5% is evidence against). Without replicate
    runs per configuration the intervals are binomial over FOLLOWUP_EVAL_N problems.
    """
    test = _first_line(finding_11)
    g = main_grid(df)
    if miss := _has(g, "rlvr_accuracy"):
        return _not_run(11, test, f"no RLVR results (missing {miss}); kdlab has not run the GRPO follow-up")
    lv = lr_levels(g)
    if lv is None:
        return _not_run(11, test, "needs >= 2 learning rates")
    lo, hi = lv
    c = binomial_cells(g, "rlvr_accuracy", ["policy", "kl", "lr"])
    means = c.means
    if ("off", "forward", lo) not in means.index:
        return _not_run(11, test, "needs OffPD+forward RLVR runs at the low lr")
    rev_lo = means[(means.index.get_level_values("kl") == "reverse") & (means.index.get_level_values("lr") == lo)]
    if rev_lo.empty:
        return _not_run(11, test, "needs reverse-KL RLVR runs at the low lr")
    off_fwd_lo = float(means.loc[("off", "forward", lo)])

    def gap(M):
        return sel(M, policy="off", kl="forward", lr=lo).iloc[:, 0] - sel(M, kl="reverse", lr=lo).mean(axis=1)

    def best_ok(M):
        best = M.to_numpy().argmax(axis=1)
        ok = np.array([(p == "off" and k == "forward" and r == lo) or (k == "reverse" and r == hi) for p, k, r in M.columns])
        return ok[best].astype(float)

    share = float(np.mean(best_ok(_draws(c)))) if len(means) > 1 else math.nan
    observed = float(best_ok(pd.DataFrame([means.to_numpy()], columns=means.index))[0])
    best_verdict = REPRODUCED if share >= 1 - ALPHA else NOT_REPRODUCED if share <= ALPHA else INCONCLUSIVE
    parts = [_part("OffPD+forward low - reverse low RLVR accuracy", bootstrap(c, gap), "greater", 0.0),
             Part("share of replicates whose best is OffPD+forward low or reverse high",
                  Estimate(observed, share, share, "bootstrap share"), 1 - ALPHA, best_verdict, "share")]
    best = means.idxmax()
    notes = [f"best after RLVR: {best} ({means.max():.3f}); OffPD+forward low lr {off_fwd_lo:.3f}, reverse low lr "
             f"{rev_lo.mean():.3f}" + (" (one run per configuration: binomial intervals)" if c.known_var is not None else "")]
    return _result(11, test, parts, notes=notes,
                   values={"best": best, "off_forward_low": off_fwd_lo, "reverse_low": float(rev_lo.mean()),
                           "best_share": share})


def finding_12(df: pd.DataFrame) -> FindingResult:
    """Needs the style experiment (column ``style_share``: share of student outputs in the teacher's
    style): (a) OnPD+reverse's mean share is below F12_STYLE_MAJORITY (interval below), and (b)
    every other (policy, kl) configuration is above it (the smallest; interval above). Without
    replicate runs per configuration the intervals are binomial over FOLLOWUP_EVAL_N outputs.
    """
    test = _first_line(finding_12)
    g = main_grid(df)
    if miss := _has(g, "style_share"):
        return _not_run(12, test, f"no style-transfer results (missing {miss})")
    c = binomial_cells(g, "style_share", ["policy", "kl"])
    means = c.means
    if ("on", "reverse") not in means.index or len(means) < 2:
        return _not_run(12, test, "needs OnPD+reverse and at least one other configuration with style_share")
    onrev = float(means.loc[("on", "reverse")])
    others = means.drop(("on", "reverse"))
    on_rev = bootstrap(c, lambda M: sel(M, policy="on", kl="reverse").iloc[:, 0], scale=1.0)
    rest = bootstrap(c, lambda M: M.drop(columns=[("on", "reverse")]).min(axis=1), scale=1.0)
    parts = [_part("OnPD+reverse style share", on_rev, "less", F12_STYLE_MAJORITY, unit="share"),
             _part("smallest style share of the other configurations", rest, "greater", F12_STYLE_MAJORITY, unit="share")]
    notes = ["others " + ", ".join(f"{k[0]}+{k[1]} {v:.3f}" for k, v in others.items())
             + (" (one run per configuration: binomial intervals)" if c.known_var is not None else "")]
    return _result(12, test, parts, notes=notes, values={"on_reverse": onrev, "others": others.to_dict()})


def finding_13(df: pd.DataFrame) -> FindingResult:
    """Robustness, each part run when its runs exist. Sampled estimators (kl k1/k2/k3/sf with a
    ``sampled_direction`` column): (a) the accuracy spread over policy x lr cells is larger for the
    reverse than for the forward estimator (interval above 0); (b) forgetting high lr - low lr is
    negative and sparsity low - high positive. Runs without clipping (grad_clip empty): (c) the
    |forward - reverse| accuracy gap exceeds the clipped runs' (interval above 0) and (d) best OnPD
    minus best OffPD accuracy without clipping (as in finding 1) is below
    ACCURACY_EQUIVALENCE_POINTS (non-superiority).
    """
    test = _first_line(finding_13)
    parts, notes, values = [], [], {}
    sampled = df[df["kl"].isin(SAMPLED_KINDS)]
    if not sampled.empty and sampled["lr"].nunique() >= 2:
        lo, hi = float(sampled["lr"].min()), float(sampled["lr"].max())
        if "sampled_direction" in sampled.columns and sampled["sampled_direction"].nunique() == 2 \
                and not _has(sampled, "accuracy"):
            c = cell_model(sampled, "accuracy", ["sampled_direction", "policy", "lr"], ["sampled_direction", "lr"])
            if c.replicated:
                est = bootstrap(c, lambda M: _spread(sel(M, sampled_direction="reverse")) - _spread(sel(M, sampled_direction="forward")))
                parts.append(_part("(a) sampled estimators: reverse - forward accuracy spread", est, "greater", 0.0))
            m = c.means
            values["sampled_spread"] = {d: float(m.xs(d, level="sampled_direction").max() - m.xs(d, level="sampled_direction").min())
                                        for d in ("forward", "reverse")}
        if not _has(sampled, "forgetting", "sparsity"):
            by = ["sampled_direction", "policy", "lr"] if "sampled_direction" in sampled.columns else ["policy", "lr"]
            s = sampled.assign(sampled_direction=sampled.get("sampled_direction", pd.Series("?", index=sampled.index)).fillna("?"))
            cf, cs = cell_model(s, "forgetting", by, ["lr"]), cell_model(s, "sparsity", by, ["lr"])
            if cf.replicated and cs.replicated:
                parts.append(_part("(b) sampled estimators: forgetting high - low lr",
                                   bootstrap(cf, lambda M: _effect(M, "lr", hi, lo)), "less", 0.0))
                parts.append(_part("(b) sampled estimators: sparsity low - high lr",
                                   bootstrap(cs, lambda M: _effect(M, "lr", lo, hi)), "greater", 0.0))
            f, sp = s.groupby("lr")["forgetting"].mean(), s.groupby("lr")["sparsity"].mean()
            values["sampled_lr"] = {"forgetting": f.to_dict(), "sparsity": sp.to_dict()}
    if "grad_clip" in df.columns and "accuracy" in df.columns:
        grid = df["policy"].isin(["off", "on"]) & df["kl"].isin(["forward", "reverse"])
        both = df[grid].assign(clipped=df.loc[grid, "grad_clip"].notna())
        noclip = both[~both["clipped"]]
        if not noclip.empty and noclip["kl"].nunique() == 2 and noclip["policy"].nunique() == 2:
            c = cell_model(both, "accuracy", ["clipped", "task", "policy", "kl", "lr"], ["clipped", "kl", "lr"])
            has_clip = bool(both["clipped"].any())
            gap = {name: abs(float(x.loc[x["kl"] == "forward", "accuracy"].mean() - x.loc[x["kl"] == "reverse", "accuracy"].mean()))
                   for name, x in (("noclip", noclip), ("clip", both[both["clipped"]]))}
            if c.replicated:
                def kl_gap(M, clipped):
                    x = sel(M, clipped=clipped)
                    return _effect(x, "kl", "forward", "reverse").abs()
                if has_clip:
                    parts.append(_part("(c) no clipping: |forward - reverse| gap minus the clipped gap",
                                       bootstrap(c, lambda M: kl_gap(M, False) - kl_gap(M, True)), "greater", 0.0))
                nc_tasks = sorted(noclip["task"].unique())

                def best_gap(M):
                    x = sel(M, clipped=False)
                    return np.mean([sel(x, task=t, policy="on").max(axis=1) - sel(x, task=t, policy="off").max(axis=1)
                                    for t in nc_tasks], axis=0)
                parts.append(_part("(d) no clipping: best OnPD - best OffPD accuracy", bootstrap(c, best_gap), "less",
                                   ACCURACY_EQUIVALENCE_POINTS))
            pairs = paired_comparisons(noclip, "accuracy", alpha=ALPHA)
            n_on = int((pairs["significant"] & (pairs["mean_diff"] > 0)).sum())
            values["noclip"] = {"kl_gap_noclip": gap["noclip"], "kl_gap_clip": gap["clip"], "n_on_better": n_on,
                                "n_pairs": len(pairs)}
            notes.append(f"no clipping: |forward - reverse| accuracy {gap['noclip']:.3f} vs clipped {_fmt(gap['clip'])}; "
                         f"OnPD significantly better in {n_on}/{len(pairs)} matched pairs")
    if not parts:
        why = ("the robustness runs have a single seed per configuration (no intervals)" if values else
               "no sampled-estimator (k1/k2/k3/sf) runs with >= 2 lrs and no runs without clipping")
        return _not_run(13, test, why)
    return _result(13, test, parts, notes=notes, values=values)


FINDINGS: dict[int, Callable[..., FindingResult]] = {
    1: finding_1, 2: finding_2, 3: finding_3, 4: finding_4, 5: finding_5, 6: finding_6, 7: finding_7,
    8: finding_8, 9: finding_9, 10: finding_10, 11: finding_11, 12: finding_12, 13: finding_13,
}


def evaluate_findings(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> list[FindingResult]:
    """Run every finding's test on a prepared results table (and the optional gradient table)."""
    out = []
    for n, func in FINDINGS.items():
        out.append(func(df, gradients) if n == 6 else func(df))
    return out


def scoreboard(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> pd.DataFrame:
    """The findings scoreboard, one row per finding 1-13 (``SCOREBOARD_COLUMNS``): finding, claim,
    verdict (reproduced / not reproduced / inconclusive / not run), statistic_name, statistic with
    its 95% interval ci_low..ci_high, unit (points, share, ratio), threshold (the bound the interval
    is compared to: 0 for a direction, the margin for an equivalence or non-inferiority claim),
    detail (every part with its interval and verdict) and test (the rule)."""
    rows = [{"finding": r.number, "claim": r.claim, "verdict": r.verdict, "statistic_name": r.statistic_name,
             "statistic": r.statistic, "ci_low": r.ci_low, "ci_high": r.ci_high, "unit": r.unit,
             "threshold": r.threshold, "detail": r.detail, "test": r.test}
            for r in evaluate_findings(df, gradients)]
    return pd.DataFrame(rows, columns=SCOREBOARD_COLUMNS)
