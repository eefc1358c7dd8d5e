"""The findings scoreboard: each numbered finding of STUDY.md as explicit tests on the results,
one verdict per claim.

Every finding has one function ``finding_<n>(df, ...) -> FindingResult``. A finding whose sentence
in STUDY.md makes several claims ("learning rate governs sparsity; OffPD at least as sparse as
OnPD") is split into **parts** (2a, 2b, ...), each with its claim in words, its own statistic,
95% interval and verdict; the function's docstring says, part by part, how the test
operationalises the sentence. The verdicts are computed from the table, never typed in. A part's
verdict is three-valued, plus "not run":

* "reproduced": the part's 95% interval lies on the claim's side of its bound (a direction: the
  interval excludes 0 on the claimed side; a "no advantage" or "at least as" claim: the interval
  lies inside the margin, a one-sided TOST);
* "not reproduced": the interval lies entirely on the wrong side of the bound (the opposite
  direction, or outside the margin): the evidence is against the claim at ``ALPHA``. A direction
  claim about accuracy, forgetting or sparsity also has a **smallest effect of interest**
  (``NEGLIGIBLE``, the study's own margins: 3 accuracy points as in findings 1 and 13e, 1.5
  forgetting points as in 5b, 0.5 sparsity points as in 4b): an interval that does not clear the
  bound but lies entirely below bound + that margin is "not reproduced" too, since the data then
  exclude any effect in the claimed direction that the study counts as one (a minimum-effect test;
  an interval above the bound is "reproduced" however small the effect);
* "inconclusive": neither: the interval straddles the bound, the test cannot tell at this power
  (few seeds, noisy cells). More seeds, not another reading of the means, settle it;
* "not run": the table lacks the columns, configurations or replicate seeds the part needs (the
  detail says which).

The finding's own line does not let one part speak for the others: it says how many parts hold
(:func:`summarize`: "1 of 2 parts reproduced (1 not reproduced)"); a finding with a single part
takes that part's verdict. ``scoreboard`` gives one row per finding (its summary) followed by
one row per part.

Intervals (documented in ``docs/calibration.md``, section "Findings verdicts"): the runs of the
cells a test compares (a cell = task x policy x KL x lr, or x lambda on the spectrum) are modelled
as cell means plus a common seed-to-seed error, whose variance is pooled over those cells
(residual of the cell-means model, df = runs - cells). Each statistic (a difference of cell means,
a spread max - min, the best cell of one policy minus the best of the other, a minimum over
matched pairs, a rank correlation) gets a 95% percentile interval from a parametric bootstrap of
that model (``N_BOOTSTRAP`` replicates, fixed seed ``BOOTSTRAP_SEED``): each replicate draws the
error variance from its scaled inverse chi-square (df of the pooled residual) and every cell mean
from a normal around the observed one; for a plain difference of means this is the t interval.
With two seeds the pooled variance has few degrees of freedom and the intervals are wide: that is
the honest answer. Exceptions: finding 6 (mathematical bounds checked on every entry and policy
pair: the largest entry, and a Wilson interval on the share of pairs under the bound), finding 8's
seed-variance part (an F interval on the ratio of pooled variances) and collapse part (a Wilson
interval on the share of collapsed runs), finding 9 (the OLS t interval), and the follow-up
findings 11-12 when each configuration has a single value (a binomial model over
``FOLLOWUP_EVAL_N`` evaluation problems: evaluation noise only, it understates seed-to-seed
variation). Wilson intervals come from ``statsmodels.stats.proportion.proportion_confint``.

Statistics of accuracy, forgetting and sparsity are in points (x100 of the table's fractions);
``df`` is a prepared table (``table.prepare_results``).
"""
from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sstats

from ..core.schema import SAMPLED_KINDS
from .stats import anova_table, paired_comparisons
from .table import lr_levels, main_grid, variant_columns

ALPHA = 0.05  # two-sided: every interval is a (1 - ALPHA) = 95% interval
N_BOOTSTRAP = 2000  # replicates of the parametric bootstrap
BOOTSTRAP_SEED = 0  # the bootstrap's generator: the same table always gets the same verdicts
# Equivalence and non-inferiority margins (points = percentage points of the table's fractions).
ACCURACY_EQUIVALENCE_POINTS = 3.0  # findings 1 and 13e: an OnPD accuracy advantage below 3 points is "no advantage"
SPARSITY_EQUIVALENCE_POINTS = 0.5  # finding 4b: two sparsities within 0.5 points are equal ("OffPD at least as sparse")
F5_ACCURACY_TOLERANCE_POINTS = 2.0  # finding 5a: "top accuracy" = within 2 points of the best configuration
F5_FORGETTING_TOLERANCE_POINTS = 1.5  # finding 5b: "without losing prior skills" = mean probe change >= -1.5 points
F7_SPREAD_TOLERANCE_POINTS = 10.0  # finding 7: forward-KL accuracy spread along the spectrum (paper: 5.2 points)
F12_STYLE_MAJORITY = 0.5  # finding 12: "adopts the teacher's style" = share of outputs above one half
F6_MIN_PAIRS = 3  # finding 6b: fewer forward-KL policy pairs than this cannot support the bound
# Smallest effect of interest of a direction claim, per metric (points): the margins above, one per
# metric, so a direction whose whole interval lies below it is "not reproduced" (docs/calibration.md 32).
NEGLIGIBLE = {"accuracy": ACCURACY_EQUIVALENCE_POINTS, "forgetting": F5_FORGETTING_TOLERANCE_POINTS,
              "sparsity": SPARSITY_EQUIVALENCE_POINTS}
FOLLOWUP_EVAL_N = 200  # findings 11-12 without replicates: problems behind each share (rlvr.n_eval, style.n_test)

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN = "reproduced", "not reproduced", "inconclusive", "not run"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN)
# One row per finding (part "") followed by one row per part (part "a", "b", ...; label "2a").
SCOREBOARD_COLUMNS = ["finding", "part", "label", "claim", "verdict", "n_parts", "n_reproduced", "statistic_name",
                      "statistic", "ci_low", "ci_high", "unit", "threshold", "negligible", "method", "detail", "test"]

CLAIMS = {
    1: "No consistent accuracy advantage for on-policy distillation",
    2: "KL direction matters more than the rollout policy; forward KL is stable, reverse KL is not",
    3: "Learning rate governs forgetting; rollout policy negligible by comparison",
    4: "Learning rate governs update sparsity; OffPD at least as sparse as OnPD in every matched pair",
    5: "Forgetting is not a necessary cost: forward KL at the low rate reaches top accuracy without forgetting",
    6: "Forward-KL logit gradients lie in [-1, 1], so update differences are bounded by TV; reverse has no such bound",
    7: "Forward KL is robust along the lambda spectrum at the low rate",
    8: "Reverse KL favours student-side rollouts at the low rate, is unstable at the high rate and occasionally collapses",
    9: "Forward KL gives better coverage: higher pass@10 at equal pass@1 (lambda > 0)",
    10: "On-policy generalises better to harder variants: rises along the spectrum, lambda > 0 above OffPD, both KLs",
    11: "After RLVR, OffPD+forward at the low rate (or reverse at the high rate) ends highest; reverse-low does not",
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


NO_ESTIMATE = Estimate(math.nan, math.nan, math.nan, "")


def _margin(negligible: float) -> float:
    return float(negligible) if np.isfinite(negligible) and negligible > 0 else 0.0


def decide_greater(est: Estimate, bound: float = 0.0, negligible: float = math.nan) -> str:
    """Claim ``statistic > bound`` (a direction, or non-inferiority with ``bound = -margin``).
    ``negligible``: the smallest effect of interest; an interval entirely below ``bound +
    negligible`` that does not clear the bound is "not reproduced" (NaN or 0: none)."""
    if not (np.isfinite(est.lo) and np.isfinite(est.hi)):
        return INCONCLUSIVE
    if est.lo > bound:
        return REPRODUCED
    if est.hi < bound + _margin(negligible):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def decide_less(est: Estimate, bound: float = 0.0, negligible: float = math.nan) -> str:
    """Claim ``statistic < bound`` (a direction, or non-superiority with ``bound = +margin``);
    ``negligible`` as in :func:`decide_greater`, mirrored: entirely above ``bound - negligible``."""
    if not (np.isfinite(est.lo) and np.isfinite(est.hi)):
        return INCONCLUSIVE
    if est.hi < bound:
        return REPRODUCED
    if est.lo > bound - _margin(negligible):
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


def summarize(verdicts: Sequence[str]) -> str:
    """A finding's line from its parts' verdicts: how many parts hold, never one part for all.

    No part -> "not run"; one part -> its verdict; several -> "k of n parts reproduced", followed
    by the count of every other verdict in parentheses, e.g. "1 of 2 parts reproduced (1 not
    reproduced)", "0 of 3 parts reproduced (2 inconclusive, 1 not run)"; every part "not run"
    -> "not run"."""
    verdicts = list(verdicts)
    if not verdicts or all(v == NOT_RUN for v in verdicts):
        return NOT_RUN
    if len(verdicts) == 1:
        return verdicts[0]
    k = sum(v == REPRODUCED for v in verdicts)
    others = [f"{sum(v == o for v in verdicts)} {o}" for o in (NOT_REPRODUCED, INCONCLUSIVE, NOT_RUN) if o in verdicts]
    return f"{k} of {len(verdicts)} parts reproduced" + (f" ({', '.join(others)})" if others else "")


@dataclass
class Part:
    """One claim of a finding: the statistic that tests it (``name``), its interval, the bound it is
    compared to, the verdict; ``claim`` is the part of STUDY.md's sentence in words, ``rule`` how
    the verdict is reached, ``note`` what else the reader needs (why it was not run; the partial
    eta squared of the knob table for the same effect), ``label`` its letter (set by the finding)."""

    name: str
    estimate: Estimate
    threshold: float
    verdict: str
    unit: str = "points"
    claim: str = ""
    rule: str = ""
    note: str = ""
    label: str = ""
    negligible: float = math.nan  # the smallest effect of interest of a direction claim (NEGLIGIBLE), NaN: none

    def text(self) -> str:
        head = f"({self.label}) " if self.label else ""
        if self.verdict == NOT_RUN:
            return f"{head}{self.claim}: not run ({self.note})"
        e, u = self.estimate, ("" if self.unit == "points" else f" {self.unit}")
        pts = " pts" if self.unit == "points" else ""
        note = f" ({self.note})" if self.note else ""
        small = f" (negligible under {_fmt(self.negligible)})" if _margin(self.negligible) else ""
        return (f"{head}{self.name} {_fmt(e.value)}{pts} [{_fmt(e.lo)}, {_fmt(e.hi)}]{u} vs {_fmt(self.threshold)}"
                f"{small}: {self.verdict}{note}")


def _rule_text(rule: str, threshold: float, method: str, negligible: float = math.nan) -> str:
    side = {"greater": "above", "less": "below"}[rule]
    text = f"95% interval ({method}) {side} {_fmt(threshold)}"
    if m := _margin(negligible):
        edge = threshold + m if rule == "greater" else threshold - m
        other = {"greater": "below", "less": "above"}[rule]
        text += f"; not reproduced when entirely {other} {_fmt(edge)} (effects under {_fmt(m)} negligible)"
    return text


def _part(claim: str, name: str, est: Estimate, rule: str, threshold: float, unit: str = "points",
          note: str = "", metric: str = "") -> Part:
    """A part decided by its interval: ``rule`` "greater" (the claim is statistic > threshold) or
    "less" (statistic < threshold). ``metric`` ("accuracy", "forgetting", "sparsity") names a
    direction claim's smallest effect of interest (``NEGLIGIBLE``); empty: none (a claim that is
    already a margin, a ratio, a correlation or a share)."""
    decide = {"greater": decide_greater, "less": decide_less}[rule]
    negligible = NEGLIGIBLE[metric] if metric else math.nan
    return Part(name, est, threshold, decide(est, threshold, negligible), unit, claim,
                _rule_text(rule, threshold, est.method, negligible), note, negligible=negligible)


def _part_not_run(claim: str, why: str) -> Part:
    return Part("", NO_ESTIMATE, math.nan, NOT_RUN, "", claim, "", why)


@dataclass
class FindingResult:
    """One finding: its ``parts`` (each a claim with its own verdict) and the summary. ``verdict``
    is :func:`summarize` of the parts' verdicts; ``statistic`` (with ``ci_low``/``ci_high``,
    ``unit``, ``threshold``) is the part's when there is a single part and NaN otherwise (no part
    speaks for the others); ``values`` hold the numbers behind the detail."""

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

    @property
    def n_reproduced(self) -> int:
        return sum(p.verdict == REPRODUCED for p in self.parts)

    def part(self, label: str) -> Part:
        """The part labelled ``label`` ("a", "b", ...)."""
        for p in self.parts:
            if p.label == label:
                return p
        raise KeyError(f"finding {self.number} has no part {label!r}; parts {[p.label for p in self.parts]}")


def _result(number: int, test: str, parts: list[Part], notes: Sequence[str] = (),
            values: dict[str, Any] | None = None) -> FindingResult:
    for letter, p in zip(string.ascii_lowercase, parts):
        p.label = letter
    detail = "; ".join([p.text() for p in parts] + list(notes))
    r = FindingResult(number, summarize([p.verdict for p in parts]), detail, test, parts=parts, values=values or {})
    if len(parts) == 1 and parts[0].verdict != NOT_RUN:
        h = parts[0]
        r.statistic_name, r.statistic, r.ci_low, r.ci_high = h.name, h.estimate.value, h.estimate.lo, h.estimate.hi
        r.unit, r.threshold = h.unit, h.threshold
    return r


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
    binomial variance of a share over ``n_eval`` problems per run, in the Agresti-Coull form
    ``p~ (1 - p~) / (m + z^2)`` with ``p~ = (p m + z^2 / 2) / (m + z^2)`` (the Wilson centre: p
    shrunk towards 1/2, so that a share of 0 or 1 still gets a spread). It is the variance of
    the bootstrap's normal draws, not an interval; statsmodels' ``proportion_confint`` returns
    intervals clipped to [0, 1], from which this variance cannot be read back."""
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


def _eta(g: pd.DataFrame, metric: str) -> dict[str, float]:
    """Partial eta squared per ANOVA term of ``metric`` on ``g`` (the knob table's numbers)."""
    an = anova_table(g, metric)
    return dict(zip(an["term"], an["partial_eta_sq"])) if len(an) else {}


def _eta_note(eta: dict[str, float], *terms: str) -> str:
    shown = [f"{t} {eta[t]:.2f}" for t in terms if t in eta and np.isfinite(eta[t])]
    return ("knob table: partial eta^2 " + " vs ".join(shown)) if shown else ""


def finding_1(df: pd.DataFrame) -> FindingResult:
    """Best OnPD minus best OffPD accuracy is below ACCURACY_EQUIVALENCE_POINTS (one part).

    STUDY.md: "No consistent accuracy advantage for on-policy: best means 72% OnPD vs 73% OffPD."
    One claim, tested the way the paper states its evidence: (a) per task, the best OnPD cell mean
    over kl x lr minus the best OffPD cell mean (main grid), averaged over tasks, has its 95%
    interval under the margin (non-superiority; an OffPD advantage also satisfies the claim).
    Matched OnPD-OffPD pairs (paired by seed, Holm) are reported, not tested.
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
    part = _part("no accuracy advantage for OnPD: its best cell is not above OffPD's best by the margin",
                 "best OnPD - best OffPD accuracy", est, "less", ACCURACY_EQUIVALENCE_POINTS)
    return _result(1, test, [part], notes=notes,
                   values={"best": best, "n_pairs": len(pairs), "n_on_better": n_on, "n_off_better": n_off})


def finding_2(df: pd.DataFrame) -> FindingResult:
    """Three parts on main-grid accuracy: KL effect larger than the policy effect; reverse KL's
    spread over policy x lr larger than forward's; reverse KL more sensitive to the lr.

    STUDY.md: "KL direction matters more: forward KL 71-73% across all policies and rates;
    reverse KL 35-72%, very sensitive to learning rate." Parts:

    (a) "KL direction matters more [than the rollout policy]": |KL main effect| - |policy main
        effect| on accuracy (forward - reverse and OnPD - OffPD, each balanced over the cells
        task x policy x kl x lr), interval above 0. The knob table's partial eta squared of kl and
        policy is shown with it (the same question without an interval).
    (b) "forward KL 71-73% across all policies and rates; reverse KL 35-72%": the spread (max -
        min) of the cell means over policy x lr, reverse minus forward, per task, averaged over
        tasks, interval above 0.
    (c) "reverse KL ... very sensitive to learning rate": |lr effect (high - low) within reverse
        KL| - |lr effect within forward KL| (per task, balanced over policy, averaged over tasks),
        interval above 0.
    """
    test = _first_line(finding_2)
    g = main_grid(df)
    if miss := _has(g, "accuracy"):
        return _not_run(2, test, f"missing columns {miss}")
    lv = lr_levels(g)
    if set(g["kl"]) != {"forward", "reverse"} or g["policy"].nunique() < 2 or lv is None:
        return _not_run(2, test, "needs forward and reverse KL, both policies and >= 2 learning rates")
    lo, hi = lv
    c = cell_model(g, "accuracy", GRID_CELL, GRID_POOL)
    if not c.replicated:
        return _no_replicates(2, test)
    tasks = _levels(c, "task")

    def effects(M):
        return _effect(M, "kl", "forward", "reverse").abs() - _effect(M, "policy", "on", "off").abs()

    def spread_gap(M):
        return np.mean([_spread(sel(M, task=t, kl="reverse")) - _spread(sel(M, task=t, kl="forward"))
                        for t in tasks], axis=0)

    def lr_sensitivity(M):
        return np.mean([_effect(sel(M, task=t, kl="reverse"), "lr", hi, lo).abs()
                        - _effect(sel(M, task=t, kl="forward"), "lr", hi, lo).abs() for t in tasks], axis=0)

    eta = _eta(g, "accuracy")
    parts = [_part("KL direction matters more than the rollout policy for accuracy",
                   "|KL effect| - |policy effect| on accuracy", bootstrap(c, effects), "greater", 0.0,
                   note=_eta_note(eta, "kl", "policy"), metric="accuracy"),
             _part("forward KL stays in a narrow band across policies and rates, reverse KL spreads widely",
                   "reverse - forward accuracy spread over policy x lr", bootstrap(c, spread_gap), "greater", 0.0,
                   metric="accuracy"),
             _part("reverse KL is very sensitive to the learning rate (more than forward KL)",
                   "|lr effect| under reverse - under forward KL", bootstrap(c, lr_sensitivity), "greater", 0.0,
                   metric="accuracy")]
    spreads, notes = {}, []
    for t in tasks:
        m = c.means.xs(t, level="task")
        spreads[t] = {kl: float(m.xs(kl, level="kl").max() - m.xs(kl, level="kl").min()) for kl in ("forward", "reverse")}
        notes.append(f"{t}: spread forward {spreads[t]['forward']:.3f} vs reverse {spreads[t]['reverse']:.3f}")
    return _result(2, test, parts, notes=notes,
                   values={"spreads": spreads, "eta_kl": eta.get("kl", math.nan), "eta_policy": eta.get("policy", math.nan)})


def finding_3(df: pd.DataFrame) -> FindingResult:
    """Two parts on main-grid forgetting: more forgetting at the high lr; the lr effect larger
    than the policy effect.

    STUDY.md: "Learning rate governs forgetting: mean OOD change at most 1.3 points at the low
    rate, -11.2 to -14.0 points at the high rate; rollout policy negligible by comparison." At toy
    scale the directions are tested, not the paper's point values. Parts (cell means balanced over
    task x policy x kl x lr):

    (a) "learning rate governs forgetting": the lr main effect on forgetting (high - low) is
        negative, interval below 0.
    (b) "rollout policy negligible by comparison": |lr main effect| - |policy main effect| on
        forgetting, interval above 0 (the knob table's partial eta squared of lr and policy shown).
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
    eta = _eta(g, "forgetting")
    parts = [_part("learning rate governs forgetting: more forgetting at the high rate",
                   "lr effect on forgetting (high - low)", lr_eff, "less", 0.0, note=_eta_note(eta, "lr"),
                   metric="forgetting"),
             _part("rollout policy negligible by comparison",
                   "|lr effect| - |policy effect| on forgetting", gap, "greater", 0.0,
                   note=_eta_note(eta, "lr", "policy"), metric="forgetting")]
    notes = [f"mean forgetting low lr {f_lo:+.4f}, high lr {f_hi:+.4f}; policy effect (OnPD - OffPD) "
             f"{_fmt(pol_eff.value)} pts [{_fmt(pol_eff.lo)}, {_fmt(pol_eff.hi)}]"]
    return _result(3, test, parts, notes=notes,
                   values={"forgetting_low": f_lo, "forgetting_high": f_hi, "lr_effect": lr_eff.value / 100,
                           "policy_effect": pol_eff.value / 100})


def finding_4(df: pd.DataFrame) -> FindingResult:
    """Two parts on main-grid sparsity: sparser updates at the low lr; OffPD at least as sparse
    as OnPD in every matched configuration.

    STUDY.md: "Learning rate governs sparsity: 85.3-89.6% at the low rate vs 51.9-60.0% at the
    high rate; OffPD at least as sparse as OnPD in every matched pair." Parts:

    (a) "learning rate governs sparsity": sparsity at the low lr minus the high lr (balanced over
        task x policy x kl), interval above 0 (the knob table's partial eta squared of lr shown).
    (b) "OffPD at least as sparse as OnPD in every matched pair": the smallest OffPD - OnPD
        sparsity difference over the matched (task, kl, lr) configurations has its interval above
        -SPARSITY_EQUIVALENCE_POINTS (non-inferiority: equal within the margin counts as "as
        sparse").
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

    n_ok = int((wide["off"] >= wide["on"]).sum())
    eta = _eta(g, "sparsity")
    parts = [_part("learning rate governs sparsity: sparser updates at the low rate", "sparsity low lr - high lr",
                   bootstrap(c, lambda M: _effect(M, "lr", lo, hi)), "greater", 0.0, note=_eta_note(eta, "lr", "policy"),
                   metric="sparsity"),
             _part("OffPD at least as sparse as OnPD in every matched pair",
                   "min over matched pairs of OffPD - OnPD sparsity", bootstrap(c, worst_pair), "greater",
                   -SPARSITY_EQUIVALENCE_POINTS, note=f"OffPD >= OnPD in {n_ok}/{len(wide)} pairs by the means")]
    s_lo, s_hi = float(g.loc[g["lr"] == lo, "sparsity"].mean()), float(g.loc[g["lr"] == hi, "sparsity"].mean())
    dtypes = sorted(map(str, df["sparsity_dtype"].dropna().unique())) if "sparsity_dtype" in df.columns else \
        sorted(map(str, df["dtype"].dropna().unique())) if "dtype" in df.columns else []
    notes = [f"mean sparsity low lr {s_lo:.3f}, high lr {s_hi:.3f}; OffPD >= OnPD in {n_ok}/{len(wide)} matched "
             f"configurations by the means (weights dtype {', '.join(dtypes) or 'unknown'})"]
    return _result(4, test, parts, notes=notes,
                   values={"sparsity_low": s_lo, "sparsity_high": s_hi, "n_matched": len(wide), "n_off_ge_on": n_ok})


def finding_5(df: pd.DataFrame) -> FindingResult:
    """Two parts on the best forward-KL low-lr configuration of each task: top accuracy, and no
    forgetting.

    STUDY.md: "Forgetting is not a necessary cost: forward KL at the low rate reaches top accuracy
    without losing prior skills." In every task the forward-KL low-lr configuration with the best
    mean accuracy (either policy) is the one tested. Parts:

    (a) "forward KL at the low rate reaches top accuracy": its accuracy minus the best of the main
        grid, the smallest over tasks, has its interval above -F5_ACCURACY_TOLERANCE_POINTS.
    (b) "without losing prior skills": its mean forgetting, the smallest over tasks, has its
        interval above -F5_FORGETTING_TOLERANCE_POINTS.
    """
    test = _first_line(finding_5) + f" (tolerances {F5_ACCURACY_TOLERANCE_POINTS}, {F5_FORGETTING_TOLERANCE_POINTS} points)"
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

    parts = [_part("forward KL at the low rate reaches top accuracy", "best forward low-lr accuracy - best accuracy",
                   bootstrap(acc, gap), "greater", -F5_ACCURACY_TOLERANCE_POINTS),
             _part("forward KL at the low rate loses no prior skills", "forgetting of the best forward low-lr configuration",
                   bootstrap(forg, forgetting), "greater", -F5_FORGETTING_TOLERANCE_POINTS)]
    return _result(5, test, parts, notes=notes, values=values)


def finding_6(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> FindingResult:
    """Three parts on the gradient analysis (notebook 50's ``bound.csv``, one row per policy pair
    and KL direction): forward entries in [-1, 1]; forward update distances under 2 TV; a reverse
    counterexample to both.

    STUDY.md: "d FKL / d z_S(v) = pi_S(v) - pi_T(v), bounded in [-1, 1], so the difference between
    updates under two rollout policies is bounded linearly by the total variation distance between
    their prefix distributions ...; d RKL / d z_S(v) ... contain[s] an unbounded log-ratio, so no
    such bound exists." These are mathematical statements, checked on every sample rather than
    estimated: one entry or pair over a bound refutes it. Parts:

    (a) "forward-KL logit gradients are bounded in [-1, 1]": the largest |entry| over the
        forward rows is <= 1 (reproduced), else not reproduced.
    (b) "... so update differences are bounded linearly by TV": every forward-KL update distance
        lies under the 2 TV line; the statistic is the share of forward pairs under it with its
        Wilson interval; one pair over it -> not reproduced; fewer than F6_MIN_PAIRS pairs ->
        inconclusive.
    (c) "reverse KL has no such bound": a counterexample in the reverse rows, an |entry| > 1 or a
        pair above 2 TV -> reproduced; none -> inconclusive (not finding a counterexample does not
        show that a bound exists); no reverse rows -> not run.
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
    entries = Part("largest |forward-KL logit-gradient entry|", Estimate(fmax, fmax, fmax, "max over entries"), 1.0,
                   REPRODUCED if fmax <= 1.0 + 1e-9 else NOT_REPRODUCED, "gradient",
                   "forward-KL logit gradients are bounded in [-1, 1]", "every entry <= 1 (a bound: one entry over refutes it)",
                   f"{len(fw)} forward rows")
    share = Estimate(k / n, lo, hi, "wilson")
    pairs = Part("share of forward-KL policy pairs under 2 TV", share, 1.0,
                 NOT_REPRODUCED if k < n else REPRODUCED if n >= F6_MIN_PAIRS else INCONCLUSIVE, "share",
                 "forward KL: the update difference between two rollout policies is bounded linearly by their TV",
                 f"every pair under 2 TV (one over refutes it); >= {F6_MIN_PAIRS} pairs to support it",
                 f"{k}/{n} pairs under the line")
    claim_c = "reverse KL has no such bound (unbounded log-ratio)"
    if rv.empty:
        reverse = _part_not_run(claim_c, "no reverse-KL rows in the gradient table")
    else:
        found = rmax > 1.0 + 1e-9 or r_cross > 0
        reverse = Part("largest |reverse-KL logit-gradient entry|", Estimate(rmax, rmax, rmax, "max over entries"), 1.0,
                       REPRODUCED if found else INCONCLUSIVE, "gradient", claim_c,
                       "a counterexample (an entry > 1 or a pair above 2 TV) -> reproduced; none -> inconclusive",
                       f"{r_cross}/{len(rv)} reverse pairs above 2 TV")
    notes = [f"forward max |entry| {fmax:.3f}, under 2 TV in {k}/{n} policy pairs (Wilson [{lo:.3f}, {hi:.3f}]); "
             f"reverse max |entry| {_fmt(rmax)}, above 2 TV in {r_cross}/{len(rv)} pairs"]
    return _result(6, test, [entries, pairs, reverse], notes=notes,
                   values={"forward_max_abs_entry": fmax, "reverse_max_abs_entry": rmax, "reverse_crossings": r_cross})


def wilson(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n (level 1 - alpha): statsmodels'
    ``proportion_confint(method="wilson")``; (nan, nan) without observations."""
    from statsmodels.stats.proportion import proportion_confint

    if n <= 0:
        return math.nan, math.nan
    lo, hi = proportion_confint(k, n, alpha=alpha, method="wilson")
    return float(lo), float(hi)


# --------------------------------------------------------------------------------------------- findings 7-13


def _spectrum_data(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the tasks with lambda runs (all policies), clipped runs only."""
    tasks = set(df.loc[df["policy"] == "lambda", "task"])
    d = df[df["task"].isin(tasks) & df["kl"].isin(["forward", "reverse"])]
    if "grad_clip" in d.columns and d["grad_clip"].notna().any():
        d = d[d["grad_clip"].notna()]
    return d


def finding_7(df: pd.DataFrame) -> FindingResult:
    """Forward-KL accuracy spread over the lambda spectrum at the low lr is below
    F7_SPREAD_TOLERANCE_POINTS (one part).

    STUDY.md: "Forward KL is robust along the lambda spectrum (held-out accuracy > 80%, spread 5.2
    points at the low rate), even through the incoherent high-entropy rollouts of early OnPD." One
    claim (the 80% level is the paper's scale, not a direction): (a) on each lambda task at the
    low lr, the spread (max - min) of the forward-KL cell means over the lambda values (>= 3
    values, OffPD/OnPD included, so the OnPD end counts), the largest over tasks, has its
    interval below the tolerance. The reverse-KL spread is reported beside it; the contrast with
    reverse KL is finding 8's claim, not tested here.
    """
    test = _first_line(finding_7) + f" (tolerance {F7_SPREAD_TOLERANCE_POINTS} points)"
    d = _spectrum_data(df)
    if d.empty or _has(d, "accuracy"):
        return _not_run(7, test, "no lambda-spectrum runs with accuracy")
    lo = float(d["lr"].min())
    d = d[d["lr"] == lo]
    c = cell_model(d, "accuracy", ["task", "kl", "lam"], ["kl"])
    tasks = _levels(c, "task")
    values, notes = {}, []
    for t in tasks:
        m = c.means.xs(t, level="task")
        fw = m.xs("forward", level="kl") if "forward" in m.index.get_level_values("kl") else pd.Series(dtype=float)
        if len(fw) < 3:
            return _not_run(7, test, f"{t}: needs >= 3 lambda values for forward KL at lr {lo:g}, has {len(fw)}")
        rv = m.xs("reverse", level="kl") if "reverse" in m.index.get_level_values("kl") else pd.Series(dtype=float)
        values[t] = {"forward_spread": float(fw.max() - fw.min()),
                     "reverse_spread": float(rv.max() - rv.min()) if len(rv) else math.nan, "n_lambdas": len(fw)}
        notes.append(f"{t} lr {lo:g}: forward spread {values[t]['forward_spread']:.3f} over {len(fw)} lambdas "
                     f"(min {fw.min():.3f}), reverse spread {_fmt(values[t]['reverse_spread'])}")
    if not c.replicated:
        return _no_replicates(7, test, "spectrum point")
    parts = [_part("forward KL is robust along the lambda spectrum at the low rate",
                   "largest forward-KL accuracy spread over lambda", bootstrap(
                       c, lambda M: np.max([_spread(sel(M, task=t, kl="forward")) for t in tasks], axis=0)), "less",
                   F7_SPREAD_TOLERANCE_POINTS)]
    return _result(7, test, parts, notes=notes, values=values)


def variance_ratio(a: Cells, b: Cells) -> Estimate:
    """Ratio of the pooled seed variances of ``a`` and ``b`` with its F interval."""
    if a.df < 1 or b.df < 1 or not (b.mse > 0):
        return Estimate(math.nan, math.nan, math.nan, "F")
    r = a.mse / b.mse
    return Estimate(r, r / sstats.f.ppf(1 - ALPHA / 2, a.df, b.df), r / sstats.f.ppf(ALPHA / 2, a.df, b.df), "F")


def finding_8(df: pd.DataFrame) -> FindingResult:
    """Three parts on the reverse-KL runs of the lambda tasks: lambda > 0 above lambda < 0 at the
    low lr; larger seed variance than forward KL at the high lr; collapses at the high lr.

    STUDY.md: "Reverse KL favours student-side rollouts (lambda > 0) at the low rate, is unstable
    at the high rate and occasionally collapses; large seed variance." Parts:

    (a) "favours student-side rollouts (lambda > 0) at the low rate": reverse-KL accuracy over the
        lambda > 0 cells minus over the lambda < 0 cells at the low lr, the smallest over tasks,
        interval above 0.
    (b) "unstable at the high rate ...; large seed variance": the pooled within-cell (seed)
        variance of reverse-KL accuracy over that of forward KL at the high lr, F interval above 1.
    (c) "occasionally collapses": the share of reverse-KL runs at the high lr marked ``collapsed``,
        Wilson interval above 0 (at least one collapse). None -> inconclusive: an occasional event
        may not show in a few runs, so its absence is not evidence against the claim.
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
    r_hi = d[(d["kl"] == "reverse") & (d["lr"] == hi)]
    v_rev = cell_model(r_hi, "accuracy", ["task", "lam"])
    v_fwd = cell_model(d[(d["kl"] == "forward") & (d["lr"] == hi)], "accuracy", ["task", "lam"])
    if not (c.replicated and v_rev.replicated and v_fwd.replicated):
        return _no_replicates(8, test, "spectrum point")

    def side_gap(M):
        return np.min([sel(M, task=t, lam=lambda x: x > 0).mean(axis=1) - sel(M, task=t, lam=lambda x: x < 0).mean(axis=1)
                       for t in tasks], axis=0)

    ratio = variance_ratio(v_rev, v_fwd)
    n_hi = int(r_hi["accuracy"].notna().sum())
    k_hi = int(r_hi.loc[r_hi["accuracy"].notna(), "collapsed"].astype(bool).sum()) if "collapsed" in r_hi.columns else 0
    c_lo, c_hi = wilson(k_hi, n_hi)
    parts = [_part("reverse KL favours student-side rollouts (lambda > 0) at the low rate",
                   "reverse low-lr accuracy lambda>0 - lambda<0", bootstrap(c, side_gap), "greater", 0.0, metric="accuracy"),
             _part("reverse KL is unstable at the high rate: larger seed variance than forward KL",
                   "seed variance ratio reverse / forward at the high lr", ratio, "greater", 1.0, unit="ratio")]
    collapse = Estimate(k_hi / n_hi if n_hi else math.nan, c_lo, c_hi, "wilson")
    parts.append(Part("share of reverse-KL high-lr runs collapsed", collapse, 0.0,
                      REPRODUCED if k_hi > 0 else INCONCLUSIVE, "share", "reverse KL occasionally collapses at the high rate",
                      "Wilson interval above 0 (one collapse or more); none -> inconclusive",
                      f"{k_hi}/{n_hi} runs collapsed"))
    values, notes = {}, []
    for t in tasks:
        x = r_lo[r_lo["task"] == t]
        pos, neg = x.loc[x["lam"] > 0, "accuracy"].mean(), x.loc[x["lam"] < 0, "accuracy"].mean()
        sd = {kl: float(d[(d["task"] == t) & (d["kl"] == kl) & (d["lr"] == hi)].groupby("lam")["accuracy"].std(ddof=1).mean())
              for kl in ("forward", "reverse")}
        t_hi = r_hi[r_hi["task"] == t]
        collapsed = int(t_hi["collapsed"].sum()) if "collapsed" in t_hi.columns else 0
        values[t] = {"reverse_low_pos": float(pos), "reverse_low_neg": float(neg), "sd_reverse_high": sd["reverse"],
                     "sd_forward_high": sd["forward"], "collapsed": collapsed}
        notes.append(f"{t}: reverse lr {lo:g} lambda>0 {pos:.3f} vs lambda<0 {neg:.3f}; lr {hi:g} seed SD reverse "
                     f"{sd['reverse']:.3f} vs forward {sd['forward']:.3f}; {collapsed} reverse runs collapsed")
    return _result(8, test, parts, notes=notes, values=values)


def finding_9(df: pd.DataFrame) -> FindingResult:
    """At equal pass@1, forward KL has the higher pass@10 on the lambda > 0 runs (one part).

    STUDY.md: "Forward KL gives better coverage: at equal pass@1 for lambda > 0, higher pass@10
    than reverse KL on Countdown-3." One claim: (a) on the lambda task (countdown-3 when present),
    runs with lambda > 0, the forward-KL coefficient of the OLS ``pass_at_10 ~ pass_at_1 + kl``
    (the pass@10 advantage at equal pass@1) has its 95% t interval above 0.
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
    part = _part("forward KL gives better coverage: higher pass@10 than reverse at equal pass@1 (lambda > 0)",
                 "forward pass@10 advantage at equal pass@1", est, "greater", 0.0, metric="accuracy")
    return _result(9, test, [part], notes=notes, values={"task": task, "coef": coef, "p": p})


def _rank_trend(M: pd.DataFrame, groups: Sequence[tuple]) -> np.ndarray:
    """Spearman rho between lambda and the cell means of each group (kl, task, lr) with >= 3
    lambdas, per row of ``M`` (replicates), averaged over the groups."""
    rhos = []
    for kl, task, lr in groups:
        x = sel(M, kl=kl, task=task, lr=lr)
        lam = np.asarray(x.columns.get_level_values("lam"), dtype=float)
        rx = sstats.rankdata(x.to_numpy(), axis=1)
        rl = sstats.rankdata(lam)
        rx, rl = rx - rx.mean(axis=1, keepdims=True), rl - rl.mean()
        with np.errstate(invalid="ignore", divide="ignore"):
            rhos.append((rx @ rl) / np.sqrt((rx ** 2).sum(axis=1) * (rl ** 2).sum()))
    return np.mean(rhos, axis=0)


def _variant_metric(df: pd.DataFrame, variants: list[str]) -> str:
    """Finding 10's metric: on countdown-4e (else the first harder variant), pass@10 when recorded
    (``<variant>_pass_at_10``, ``eval.harder_pass``), else its largest pass@k with k > 1, else its
    accuracy (pass@1)."""
    base = ("countdown-4e_accuracy" if "countdown-4e_accuracy" in variants else variants[0])[:-len("_accuracy")]
    ks = {}
    for c in df.columns:
        tail = c[len(f"{base}_pass_at_"):] if c.startswith(f"{base}_pass_at_") else ""
        if tail.isdigit() and int(tail) > 1 and df[c].notna().any():
            ks[int(tail)] = c
    return ks[10] if 10 in ks else ks[max(ks)] if ks else f"{base}_accuracy"


def finding_10(df: pd.DataFrame) -> FindingResult:
    """Three parts on harder-variant pass@k along the spectrum: it rises with lambda; lambda > 0 is
    above OffPD under forward KL; and under reverse KL.

    STUDY.md: "On-policy generalises better to harder variants: on Countdown-4E, pass@k rises
    gradually along the spectrum; lambda > 0 is 10-15 points above off-policy, under both
    directions." The metric is pass@k on countdown-4e (else the first harder variant): pass@10
    when the study recorded it (``eval.harder_pass``), else the largest k recorded, else the
    variant's accuracy (pass@1); cells = kl x task x lambda x lr (clipped runs). Parts:

    (a) "pass@k rises gradually along the spectrum": Spearman rho between lambda and the cell
        means, per (kl, task, lr) with >= 3 lambda values, averaged; bootstrap interval above 0.
    (b) "lambda > 0 is above off-policy ... [under forward KL]": the mean over the forward-KL
        lambda > 0 cells minus the OffPD (lambda = -1; not the extrapolated lambda < -1) cells,
        interval above 0.
    (c) "... under both directions": the same under reverse KL.
    """
    test = _first_line(finding_10)
    variants = variant_columns(df)
    if not variants:
        return _not_run(10, test, "no harder-variant accuracy column (<variant>_accuracy)")
    col = _variant_metric(df, variants)
    d = df[df["kl"].isin(["forward", "reverse"])].dropna(subset=[col])
    if "grad_clip" in d.columns and d["grad_clip"].notna().any():
        d = d[d["grad_clip"].notna()]
    values, notes, missing = {}, [], {}
    for kl in ("forward", "reverse"):
        k = d[d["kl"] == kl]
        pos, off = k.loc[k["lam"] > 0, col], k.loc[np.isclose(k["lam"], -1.0), col]
        if pos.empty or off.empty:
            missing[kl] = f"{col}: needs {kl}-KL runs at lambda > 0 and OffPD (lambda = -1)"
            continue
        rho = float(sstats.spearmanr(k["lam"], k[col]).statistic) if k["lam"].nunique() > 1 else math.nan
        values[kl] = {"pos": float(pos.mean()), "off": float(off.mean()), "rho": rho}
        notes.append(f"{kl}: lambda>0 {pos.mean():.3f} vs OffPD {off.mean():.3f} (Spearman rho over runs {_fmt(rho)})")
    if len(missing) == 2:
        return _not_run(10, test, "; ".join(missing.values()))
    c = cell_model(d, col, ["kl", "task", "lam", "lr"], ["kl", "lr"])
    if not c.replicated:
        return _no_replicates(10, test, "(kl, lambda, lr) cell")
    idx = c.means.index
    groups = [g for g in idx.droplevel("lam").unique() if (idx.droplevel("lam") == g).sum() >= 3]
    claim_a = "harder-variant pass@k rises gradually along the lambda spectrum"
    if groups:
        parts = [_part(claim_a, f"{col}: Spearman rho(lambda, cell mean)", bootstrap(c, lambda M: _rank_trend(M, groups),
                                                                                       scale=1.0),
                       "greater", 0.0, unit="rho", note=f"mean over {len(groups)} (kl, task, lr) groups")]
    else:
        parts = [_part_not_run(claim_a, "needs >= 3 lambda values in some (kl, task, lr)")]
    for kl in ("forward", "reverse"):
        claim = f"lambda > 0 is above off-policy under {kl} KL"
        if kl in missing:
            parts.append(_part_not_run(claim, missing[kl]))
            continue

        def gap(M, kl=kl):
            return (sel(M, kl=kl, lam=lambda x: x > 0).mean(axis=1)
                    - sel(M, kl=kl, lam=lambda x: np.isclose(np.asarray(x, dtype=float), -1.0)).mean(axis=1))

        parts.append(_part(claim, f"{col} lambda>0 - OffPD ({kl})", bootstrap(c, gap), "greater", 0.0, metric="accuracy"))
    return _result(10, test, parts, notes=notes, values={"column": col, **values})


def finding_11(df: pd.DataFrame) -> FindingResult:
    """Two parts on the RLVR follow-up (column ``rlvr_accuracy``): reverse KL from the low lr ends
    below OffPD+forward at the low lr; the best configuration is OffPD+forward low or reverse high.

    STUDY.md: "That advantage does not survive RLVR reliably: after 300 GRPO steps on Countdown-4,
    reverse-KL checkpoints from the low rate improve fast and then collapse; OffPD+forward at the
    low rate (and reverse at the high rate) improve steadily and end highest." The table holds the
    final accuracies only (curves are in section 91), so "improve fast, then collapse" is tested by
    where they end. Parts:

    (a) "reverse-KL checkpoints from the low rate ... collapse": OffPD+forward low-lr RLVR accuracy
        minus the mean of the reverse-KL low-lr starts, interval above 0.
    (b) "OffPD+forward at the low rate (and reverse at the high rate) ... end highest": the share
        of bootstrap replicates whose best configuration is one of those; >= 95% reproduced,
        <= 5% not reproduced.

    Without replicate runs per configuration the intervals are binomial over FOLLOWUP_EVAL_N
    problems.
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
    parts = [_part("after RLVR, reverse-KL starts from the low rate end below OffPD+forward at the low rate",
                   "OffPD+forward low - reverse low RLVR accuracy", bootstrap(c, gap), "greater", 0.0, metric="accuracy"),
             Part("share of replicates whose best is OffPD+forward low or reverse high",
                  Estimate(observed, share, share, "bootstrap share"), 1 - ALPHA, best_verdict, "share",
                  "after RLVR, OffPD+forward at the low rate (or reverse at the high rate) ends highest",
                  f">= {1 - ALPHA:g} of the bootstrap replicates reproduced, <= {ALPHA:g} not reproduced",
                  "observed best " + ("is" if observed else "is not") + " one of them")]
    best = means.idxmax()
    notes = [f"best after RLVR: {best} ({means.max():.3f}); OffPD+forward low lr {off_fwd_lo:.3f}, reverse low lr "
             f"{rev_lo.mean():.3f}" + (" (one run per configuration: binomial intervals)" if c.known_var is not None else "")]
    return _result(11, test, parts, notes=notes,
                   values={"best": best, "off_forward_low": off_fwd_lo, "reverse_low": float(rev_lo.mean()),
                           "best_share": share})


def finding_12(df: pd.DataFrame) -> FindingResult:
    """Two parts on the style experiment (column ``style_share``: share of student outputs in the
    teacher's style): OnPD+reverse stays below F12_STYLE_MAJORITY; every other configuration is
    above it.

    STUDY.md: "OnPD + reverse KL avoids incidental style transfer (keeps the student's English);
    every other configuration adopts the teacher's Spanish almost completely." Parts ("adopts" =
    a share above F12_STYLE_MAJORITY; "almost completely" is the paper's level, not tested):

    (a) "OnPD + reverse KL avoids incidental style transfer": OnPD+reverse's mean share, interval
        below F12_STYLE_MAJORITY.
    (b) "every other configuration adopts the teacher's style": the smallest share of the other
        (policy, kl) configurations, interval above F12_STYLE_MAJORITY.

    Without replicate runs per configuration the intervals are binomial over FOLLOWUP_EVAL_N
    outputs.
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
    parts = [_part("OnPD + reverse KL avoids incidental style transfer", "OnPD+reverse style share", on_rev, "less",
                   F12_STYLE_MAJORITY, unit="share"),
             _part("every other configuration adopts the teacher's style", "smallest style share of the other configurations",
                   rest, "greater", F12_STYLE_MAJORITY, unit="share")]
    notes = ["others " + ", ".join(f"{k[0]}+{k[1]} {v:.3f}" for k, v in others.items())
             + (" (one run per configuration: binomial intervals)" if c.known_var is not None else "")]
    return _result(12, test, parts, notes=notes, values={"on_reverse": onrev, "others": others.to_dict()})


def finding_13(df: pd.DataFrame) -> FindingResult:
    """Five parts on the robustness runs, each run when its runs exist: sampled estimators (a)
    reverse spread above forward, (b) lr still governs forgetting, (c) and sparsity; without
    clipping (d) the KL gap grows, (e) no OnPD advantage.

    STUDY.md: "Robustness: with sampled estimators forward stays robust, reverse stays brittle,
    and learning rate still governs forgetting and sparsity; without gradient clipping the KL
    directions differ more but OnPD-OffPD still shows no consistent gap." Parts:

    (a) "with sampled estimators forward stays robust, reverse stays brittle": runs with a sampled
        KL (k1/k2/k3/sf) and a ``sampled_direction``: the accuracy spread over policy x lr cells,
        reverse minus forward estimator, interval above 0.
    (b) "[with sampled estimators] learning rate still governs forgetting": forgetting high - low
        lr, interval below 0.
    (c) "... and sparsity": sparsity low - high lr, interval above 0.
    (d) "without gradient clipping the KL directions differ more": runs with grad_clip empty: the
        |forward - reverse| accuracy gap without clipping minus the clipped runs' gap, interval
        above 0.
    (e) "but OnPD-OffPD still shows no consistent gap": best OnPD minus best OffPD accuracy without
        clipping (as in finding 1), interval below ACCURACY_EQUIVALENCE_POINTS (non-superiority).
    """
    test = _first_line(finding_13)
    claims = {"a": "with sampled KL estimators forward KL stays robust, reverse KL brittle",
              "b": "with sampled estimators the learning rate still governs forgetting",
              "c": "with sampled estimators the learning rate still governs sparsity",
              "d": "without gradient clipping the KL directions differ more",
              "e": "without gradient clipping OnPD-OffPD still shows no consistent accuracy gap"}
    parts: dict[str, Part] = {}
    notes, values = [], {}
    single = "a single seed per configuration (no seed-to-seed variance, no interval)"
    sampled = df[df["kl"].isin(SAMPLED_KINDS)]
    why_sampled = ("no sampled-estimator (k1/k2/k3/sf) runs" if sampled.empty else
                   "the sampled-estimator runs need >= 2 learning rates" if sampled["lr"].nunique() < 2 else "")
    if not why_sampled:
        lo, hi = float(sampled["lr"].min()), float(sampled["lr"].max())
        if "sampled_direction" in sampled.columns and sampled["sampled_direction"].nunique() == 2 \
                and not _has(sampled, "accuracy"):
            c = cell_model(sampled, "accuracy", ["sampled_direction", "policy", "lr"], ["sampled_direction", "lr"])
            if c.replicated:
                est = bootstrap(c, lambda M: _spread(sel(M, sampled_direction="reverse")) - _spread(sel(M, sampled_direction="forward")))
                parts["a"] = _part(claims["a"], "sampled estimators: reverse - forward accuracy spread", est, "greater", 0.0,
                                   metric="accuracy")
            else:
                parts["a"] = _part_not_run(claims["a"], single)
            m = c.means
            values["sampled_spread"] = {d: float(m.xs(d, level="sampled_direction").max() - m.xs(d, level="sampled_direction").min())
                                        for d in ("forward", "reverse")}
        else:
            parts["a"] = _part_not_run(claims["a"], "needs accuracy of sampled runs targeting both directions "
                                                    "(sampled_direction forward and reverse)")
        by = ["sampled_direction", "policy", "lr"] if "sampled_direction" in sampled.columns else ["policy", "lr"]
        s = sampled.assign(sampled_direction=sampled.get("sampled_direction", pd.Series("?", index=sampled.index)).fillna("?"))
        for key, metric, rule, (a, b), name in (("b", "forgetting", "less", (hi, lo), "sampled estimators: forgetting high - low lr"),
                                                ("c", "sparsity", "greater", (lo, hi), "sampled estimators: sparsity low - high lr")):
            if _has(s, metric):
                parts[key] = _part_not_run(claims[key], f"no {metric} measured in the sampled-estimator runs")
                continue
            cm = cell_model(s, metric, by, ["lr"])
            parts[key] = (_part(claims[key], name, bootstrap(cm, lambda M, a=a, b=b: _effect(M, "lr", a, b)), rule, 0.0,
                                metric=metric)
                          if cm.replicated else _part_not_run(claims[key], single))
            values.setdefault("sampled_lr", {})[metric] = s.groupby("lr")[metric].mean().to_dict()
    else:
        for key in "abc":
            parts[key] = _part_not_run(claims[key], why_sampled)
    why_noclip = ""
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
                parts["d"] = (_part(claims["d"], "no clipping: |forward - reverse| gap minus the clipped gap",
                                    bootstrap(c, lambda M: kl_gap(M, False) - kl_gap(M, True)), "greater", 0.0,
                                    metric="accuracy")
                              if has_clip else _part_not_run(claims["d"], "no clipped runs to compare with"))
                nc_tasks = sorted(noclip["task"].unique())

                def best_gap(M):
                    x = sel(M, clipped=False)
                    return np.mean([sel(x, task=t, policy="on").max(axis=1) - sel(x, task=t, policy="off").max(axis=1)
                                    for t in nc_tasks], axis=0)
                parts["e"] = _part(claims["e"], "no clipping: best OnPD - best OffPD accuracy", bootstrap(c, best_gap),
                                   "less", ACCURACY_EQUIVALENCE_POINTS)
            else:
                parts["d"], parts["e"] = _part_not_run(claims["d"], single), _part_not_run(claims["e"], single)
            pairs = paired_comparisons(noclip, "accuracy", alpha=ALPHA)
            n_on = int((pairs["significant"] & (pairs["mean_diff"] > 0)).sum())
            values["noclip"] = {"kl_gap_noclip": gap["noclip"], "kl_gap_clip": gap["clip"], "n_on_better": n_on,
                                "n_pairs": len(pairs)}
            notes.append(f"no clipping: |forward - reverse| accuracy {gap['noclip']:.3f} vs clipped {_fmt(gap['clip'])}; "
                         f"OnPD significantly better in {n_on}/{len(pairs)} matched pairs")
        else:
            why_noclip = "no OffPD/OnPD x forward/reverse runs without gradient clipping"
    else:
        why_noclip = "no grad_clip or accuracy column"
    for key in "de":
        parts.setdefault(key, _part_not_run(claims[key], why_noclip))
    ordered = [parts[k] for k in "abcde"]
    if all(p.verdict == NOT_RUN for p in ordered):
        why = ("the robustness runs have a single seed per configuration (no intervals)" if values else
               "no sampled-estimator (k1/k2/k3/sf) runs with >= 2 lrs and no runs without clipping")
        return _not_run(13, test, why)
    return _result(13, test, ordered, notes=notes, values=values)


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


def scoreboard_rows(results: Sequence[FindingResult]) -> pd.DataFrame:
    """The scoreboard of already evaluated findings (see :func:`scoreboard`)."""
    rows = []
    for r in results:
        single = len(r.parts) == 1
        method = r.parts[0].estimate.method if single else ""
        rows.append({"finding": r.number, "part": "", "label": str(r.number), "claim": r.claim, "verdict": r.verdict,
                     "n_parts": len(r.parts), "n_reproduced": r.n_reproduced, "statistic_name": r.statistic_name,
                     "statistic": r.statistic, "ci_low": r.ci_low, "ci_high": r.ci_high, "unit": r.unit,
                     "threshold": r.threshold, "negligible": r.parts[0].negligible if single else math.nan, "method": method,
                     "detail": r.detail, "test": r.test})
        for p in r.parts:
            rows.append({"finding": r.number, "part": p.label, "label": f"{r.number}{p.label}", "claim": p.claim,
                         "verdict": p.verdict, "n_parts": 1, "n_reproduced": int(p.verdict == REPRODUCED),
                         "statistic_name": p.name, "statistic": p.estimate.value, "ci_low": p.estimate.lo,
                         "ci_high": p.estimate.hi, "unit": p.unit, "threshold": p.threshold, "negligible": p.negligible,
                         "method": p.estimate.method,
                         "detail": p.text(), "test": p.rule})
    return pd.DataFrame(rows, columns=SCOREBOARD_COLUMNS)


def scoreboard(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> pd.DataFrame:
    """The findings scoreboard (``SCOREBOARD_COLUMNS``): for each finding 1-13 its summary row
    (part "", label "2") followed by one row per part (part "a", label "2a", ...).

    A part's row: its claim in words, verdict (reproduced / not reproduced / inconclusive / not
    run), statistic_name, statistic with its 95% interval ci_low..ci_high, unit (points, share,
    ratio, rho, gradient), threshold (the bound the interval is compared to: 0 for a direction, the
    margin for an equivalence or non-inferiority claim), negligible (a direction claim's smallest
    effect of interest, ``NEGLIGIBLE``; NaN where none), method (how the interval was computed),
    detail (the statistic, interval and verdict in one line, with notes) and test (the rule). The
    summary row: the finding's claim, its verdict from its parts (:func:`summarize`: "1 of 2 parts
    reproduced (1 not reproduced)"; a single part's verdict as it is), n_parts and n_reproduced;
    the statistic columns are the part's for a single-part finding and empty otherwise (no part
    speaks for the others); detail lists every part and the notes; test is the finding's rule.
    A finding that was not run has its summary row only."""
    return scoreboard_rows(evaluate_findings(df, gradients))


def summary_rows(board: pd.DataFrame) -> pd.DataFrame:
    """The findings' own rows of a scoreboard (one per finding)."""
    part = board["part"].fillna("").astype(str)
    return board[part == ""]


def part_rows(board: pd.DataFrame) -> pd.DataFrame:
    """The parts' rows of a scoreboard (one per part)."""
    part = board["part"].fillna("").astype(str)
    return board[part != ""]


def compare_scoreboards(boards: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Several scoreboards (e.g. quick with seeds 0-2 and with seeds 3-5) side by side, one row per
    label (each finding's line and each part, in the first board's order): per board the verdict
    and the statistic with its interval as text; ``contradiction`` is True for a part that is
    "reproduced" in one board and "not reproduced" in another (issue 34's stability criterion:
    "inconclusive" in one of them is allowed). Boards may be read back from ``scoreboard.csv``."""
    names = list(boards)
    frames = {}
    for name, b in boards.items():
        b = b.assign(part=b["part"].fillna("").astype(str), label=b["label"].astype(str))
        frames[name] = b.set_index("label")
    labels = list(dict.fromkeys(lab for b in frames.values() for lab in b.index))
    rows = []
    for lab in labels:
        first = next(b.loc[lab] for b in frames.values() if lab in b.index)
        row = {"label": lab, "claim": first["claim"]}
        verdicts = []
        for name in names:
            b = frames[name]
            if lab not in b.index:
                row[f"{name}: verdict"], row[f"{name}: statistic"] = "", ""
                continue
            r = b.loc[lab]
            verdicts.append(r["verdict"])
            stat = "" if pd.isna(r["statistic"]) else (
                f"{_fmt(float(r['statistic']))} [{_fmt(float(r['ci_low']))}, {_fmt(float(r['ci_high']))}]"
                + (f" {r['unit']}" if isinstance(r["unit"], str) and r["unit"] else ""))
            row[f"{name}: verdict"], row[f"{name}: statistic"] = r["verdict"], stat
        is_part = bool(str(first["part"]))  # a finding's line is a count; a single part has its own row too
        row["contradiction"] = is_part and REPRODUCED in verdicts and NOT_REPRODUCED in verdicts
        rows.append(row)
    return pd.DataFrame(rows).set_index("label")
