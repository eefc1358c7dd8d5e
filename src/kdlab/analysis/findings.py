"""The findings scoreboard: each numbered finding of STUDY.md as an explicit test on the results.

Every finding has one function ``finding_<n>(df, ...) -> FindingResult``. Its docstring is the
test; the verdict is computed from the table, never typed in:

* "reproduced": every part of the test passes;
* "not reproduced": a part fails;
* "not run": the table lacks the columns, configurations or seeds the test needs (the statistic
  says which).

Toy-scale runs are expected to show the paper's *directions*, so most tests compare means in the
claimed direction and report the supporting statistics (p-values, effect sizes) alongside; the
tests of "no difference" claims use paired t-tests with Holm correction. Thresholds are the named
constants below. ``df`` is a prepared table (``table.prepare_results``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd
from scipy import stats as sstats

from ..kl import ESTIMATORS
from .stats import anova_table, holm, paired_comparisons
from .table import lr_levels, main_grid, variant_columns

ALPHA = 0.05  # significance level (after Holm where several tests form a family)
F5_ACCURACY_TOLERANCE = 0.02  # "top accuracy": within 2 accuracy points of the best configuration
F5_FORGETTING_TOLERANCE = 0.015  # "without losing prior skills": mean probe change >= -1.5 points
F7_SPREAD_TOLERANCE = 0.10  # forward-KL accuracy spread along the spectrum at the low lr (paper: 5.2 points)
F12_STYLE_MAJORITY = 0.5  # "adopts the teacher's style": share of outputs above one half

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced", "not run"

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


@dataclass
class FindingResult:
    """One scoreboard row. ``values`` holds the numbers behind ``statistic`` (for tests and JSON)."""

    number: int
    verdict: str
    statistic: str
    test: str
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def claim(self) -> str:
        return CLAIMS[self.number]


def _verdict(parts: list[bool]) -> str:
    return REPRODUCED if all(parts) else NOT_REPRODUCED


def _not_run(number: int, test: str, why: str) -> FindingResult:
    return FindingResult(number, NOT_RUN, why, test)


def _first_line(func: Callable) -> str:
    doc = (func.__doc__ or "").strip()
    return " ".join(doc.split("\n\n")[0].split())


def _has(df: pd.DataFrame, *cols: str) -> list[str]:
    return [c for c in cols if c not in df.columns or df[c].notna().sum() == 0]


def _cell_means(df: pd.DataFrame, metric: str, by: list[str]) -> pd.Series:
    return df.groupby(by)[metric].mean()


def _max_seeds(df: pd.DataFrame, by: list[str]) -> int:
    return int(df.groupby(by)["seed"].nunique().min()) if len(df) else 0


def _fmt(x: float, digits: int = 3) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


# ---------------------------------------------------------------------------------------------


def finding_1(df: pd.DataFrame) -> FindingResult:
    """Per task, the best OnPD and best OffPD configurations (highest seed-mean accuracy over kl x lr
    in the main grid) do not differ significantly (Welch t-test over seeds, Holm across tasks), and
    OnPD is not significantly better (paired by seed, Holm) in every matched (task, kl, lr) pair.

    Needs both policies and >= 2 seeds per configuration.
    """
    test = _first_line(finding_1)
    g = main_grid(df)
    if miss := _has(g, "accuracy"):
        return _not_run(1, test, f"missing columns {miss}")
    if set(g["policy"]) != {"off", "on"}:
        return _not_run(1, test, f"needs OffPD and OnPD runs, has policies {sorted(set(g['policy']))}")
    if _max_seeds(g, ["task", "policy", "kl", "lr"]) < 2:
        return _not_run(1, test, "needs >= 2 seeds per configuration for the t-tests")
    best, pvals, texts = [], [], []
    for task, t in g.groupby("task"):
        means = _cell_means(t, "accuracy", ["policy", "kl", "lr"])
        top = {pol: means.loc[pol].idxmax() for pol in ("on", "off")}
        vals = {pol: t[(t["policy"] == pol) & (t["kl"] == top[pol][0]) & (t["lr"] == top[pol][1])]["accuracy"]
                for pol in ("on", "off")}
        res = sstats.ttest_ind(vals["on"], vals["off"], equal_var=False)
        p = float(res.pvalue) if np.isfinite(res.pvalue) else (1.0 if vals["on"].mean() == vals["off"].mean() else 0.0)
        best.append({"task": task, "best_on": float(vals["on"].mean()), "best_off": float(vals["off"].mean()),
                     "best_on_config": top["on"], "best_off_config": top["off"], "p": p})
        pvals.append(p)
    for b, ph in zip(best, holm(pvals)):
        b["p_holm"] = float(ph)
        texts.append(f"{b['task']}: best OnPD {b['best_on']:.3f} vs best OffPD {b['best_off']:.3f} (Holm p {ph:.3g})")
    pairs = paired_comparisons(g, "accuracy", alpha=ALPHA)
    n_on_better = int((pairs["significant"] & (pairs["mean_diff"] > 0)).sum())
    n_off_better = int((pairs["significant"] & (pairs["mean_diff"] < 0)).sum())
    best_ok = all(b["p_holm"] >= ALPHA for b in best)
    not_consistent = n_on_better < len(pairs)
    stat = "; ".join(texts) + (f"; matched pairs significant after Holm: {n_on_better}/{len(pairs)} OnPD better, "
                               f"{n_off_better}/{len(pairs)} OffPD better")
    return FindingResult(1, _verdict([best_ok, not_consistent]), stat, test,
                         {"best": best, "n_pairs": len(pairs), "n_on_better": n_on_better, "n_off_better": n_off_better})


def _spread(means: pd.Series) -> float:
    return float(means.max() - means.min()) if len(means) else math.nan


def finding_2(df: pd.DataFrame) -> FindingResult:
    """In every task, the spread (max - min) of seed-mean accuracy over the policy x lr cells is
    smaller for forward than for reverse KL, and in the main-grid ANOVA of accuracy the kl term has
    a larger partial eta squared than the policy term.
    """
    test = _first_line(finding_2)
    g = main_grid(df)
    if miss := _has(g, "accuracy"):
        return _not_run(2, test, f"missing columns {miss}")
    if set(g["kl"]) != {"forward", "reverse"} or g["policy"].nunique() < 2 or g["lr"].nunique() < 2:
        return _not_run(2, test, "needs forward and reverse KL, both policies and >= 2 learning rates")
    spreads, parts, texts = {}, [], []
    for task, t in g.groupby("task"):
        sp = {kl: _spread(_cell_means(t[t["kl"] == kl], "accuracy", ["policy", "lr"])) for kl in ("forward", "reverse")}
        spreads[task] = sp
        parts.append(sp["forward"] < sp["reverse"])
        texts.append(f"{task}: accuracy spread forward {sp['forward']:.3f} vs reverse {sp['reverse']:.3f}")
    an = anova_table(g, "accuracy")
    eta = dict(zip(an["term"], an["partial_eta_sq"])) if len(an) else {}
    if "kl" not in eta or "policy" not in eta:
        return _not_run(2, test, "the ANOVA could not separate kl and policy (too few runs)")
    parts.append(eta["kl"] > eta["policy"])
    texts.append(f"partial eta^2 kl {eta['kl']:.3f} vs policy {eta['policy']:.3f}")
    return FindingResult(2, _verdict(parts), "; ".join(texts), test,
                         {"spreads": spreads, "eta_kl": eta["kl"], "eta_policy": eta["policy"]})


def _main_effect(g: pd.DataFrame, metric: str, factor: str, hi: Any, lo: Any) -> float:
    """Difference of seed-and-cell-balanced means: mean over cells at ``hi`` minus at ``lo``."""
    cells = g.groupby(["task", "policy", "kl", "lr"])[metric].mean().reset_index()
    return float(cells.loc[cells[factor] == hi, metric].mean() - cells.loc[cells[factor] == lo, metric].mean())


def finding_3(df: pd.DataFrame) -> FindingResult:
    """Main grid: mean forgetting at the high lr is below (more negative than) the mean at the low lr,
    and the policy main effect on forgetting (OnPD - OffPD) is smaller in size than the lr main
    effect (high - low); means are balanced over the task x policy x kl x lr cells.
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
    f_lo = float(g.loc[g["lr"] == lo, "forgetting"].mean())
    f_hi = float(g.loc[g["lr"] == hi, "forgetting"].mean())
    lr_eff = _main_effect(g, "forgetting", "lr", hi, lo)
    pol_eff = _main_effect(g, "forgetting", "policy", "on", "off")
    stat = (f"mean forgetting low lr {f_lo:+.4f}, high lr {f_hi:+.4f}; lr effect {lr_eff:+.4f}, "
            f"policy effect {pol_eff:+.4f}")
    return FindingResult(3, _verdict([f_hi < f_lo, abs(pol_eff) < abs(lr_eff)]), stat, test,
                         {"forgetting_low": f_lo, "forgetting_high": f_hi, "lr_effect": lr_eff, "policy_effect": pol_eff})


def finding_4(df: pd.DataFrame) -> FindingResult:
    """Main grid: mean sparsity at the low lr exceeds the mean at the high lr, and in every matched
    (task, kl, lr) configuration the OffPD seed-mean sparsity is >= the OnPD one.
    """
    test = _first_line(finding_4)
    g = main_grid(df)
    if miss := _has(g, "sparsity"):
        return _not_run(4, test, f"missing columns {miss}")
    lv = lr_levels(g)
    if lv is None or g["policy"].nunique() < 2:
        return _not_run(4, test, "needs >= 2 learning rates and both policies")
    lo, hi = lv
    s_lo = float(g.loc[g["lr"] == lo, "sparsity"].mean())
    s_hi = float(g.loc[g["lr"] == hi, "sparsity"].mean())
    wide = g.pivot_table(index=["task", "kl", "lr"], columns="policy", values="sparsity", aggfunc="mean").dropna()
    if wide.empty:
        return _not_run(4, test, "no (task, kl, lr) configuration has both policies")
    n_ok = int((wide["off"] >= wide["on"]).sum())
    dtypes = sorted(map(str, df["sparsity_dtype"].dropna().unique())) if "sparsity_dtype" in df.columns else \
        sorted(map(str, df["dtype"].dropna().unique())) if "dtype" in df.columns else []
    stat = (f"mean sparsity low lr {s_lo:.3f}, high lr {s_hi:.3f}; OffPD >= OnPD in {n_ok}/{len(wide)} matched "
            f"configurations (weights dtype {', '.join(dtypes) or 'unknown'})")
    return FindingResult(4, _verdict([s_lo > s_hi, n_ok == len(wide)]), stat, test,
                         {"sparsity_low": s_lo, "sparsity_high": s_hi, "n_matched": len(wide), "n_off_ge_on": n_ok})


def finding_5(df: pd.DataFrame) -> FindingResult:
    """In every task, the best forward-KL low-lr configuration (either policy) has seed-mean accuracy
    within F5_ACCURACY_TOLERANCE of the best configuration of the main grid, and its mean forgetting
    is >= -F5_FORGETTING_TOLERANCE.
    """
    test = _first_line(finding_5) + f" (tolerances {F5_ACCURACY_TOLERANCE}, {F5_FORGETTING_TOLERANCE})"
    g = main_grid(df)
    if miss := _has(g, "accuracy", "forgetting"):
        return _not_run(5, test, f"missing columns {miss}")
    lv = lr_levels(g)
    if lv is None or "forward" not in set(g["kl"]):
        return _not_run(5, test, "needs forward-KL runs and >= 2 learning rates")
    lo = lv[0]
    parts, texts, values = [], [], {}
    for task, t in g.groupby("task"):
        means = t.groupby(["policy", "kl", "lr"])[["accuracy", "forgetting"]].mean()
        fl = means.xs(("forward", lo), level=("kl", "lr"))
        if fl.empty:
            return _not_run(5, test, f"task {task}: no forward-KL run at the low lr {lo:g}")
        pick = fl["accuracy"].idxmax()
        acc, forg = float(fl.loc[pick, "accuracy"]), float(fl.loc[pick, "forgetting"])
        top = float(means["accuracy"].max())
        parts += [acc >= top - F5_ACCURACY_TOLERANCE, forg >= -F5_FORGETTING_TOLERANCE]
        values[task] = {"forward_low_accuracy": acc, "best_accuracy": top, "forward_low_forgetting": forg}
        texts.append(f"{task}: forward low-lr ({pick}) accuracy {acc:.3f} vs best {top:.3f}, forgetting {forg:+.4f}")
    return FindingResult(5, _verdict(parts), "; ".join(texts), test, values)


def finding_6(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> FindingResult:
    """From the gradient analysis (notebook 50's ``bound.csv``): every forward-KL logit-gradient
    entry has |entry| <= 1 and every forward-KL update distance lies under the 2 TV line. Reverse KL
    is reported (its max |entry| and how often it crosses the line) but not required to cross.
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
    rmax = float(rv["max_abs_entry"].max()) if len(rv) else math.nan
    r_cross = int((rv["dist_logit"] > 2 * rv["tv"] * (1 + 1e-9) + 1e-12).sum()) if len(rv) else 0
    stat = (f"forward max |entry| {fmax:.3f}, under 2 TV in {int(below.sum())}/{len(fw)} policy pairs; "
            f"reverse max |entry| {_fmt(rmax)}, above 2 TV in {r_cross}/{len(rv)} pairs")
    return FindingResult(6, _verdict([fmax <= 1.0 + 1e-9, bool(below.all())]), stat, test,
                         {"forward_max_abs_entry": fmax, "reverse_max_abs_entry": rmax, "reverse_crossings": r_cross})


def _spectrum_data(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the tasks with lambda runs (all policies), clipped runs only."""
    tasks = set(df.loc[df["policy"] == "lambda", "task"])
    d = df[df["task"].isin(tasks) & df["kl"].isin(["forward", "reverse"])]
    if "grad_clip" in d.columns and d["grad_clip"].notna().any():
        d = d[d["grad_clip"].notna()]
    return d


def finding_7(df: pd.DataFrame) -> FindingResult:
    """On each lambda task at the low lr, the spread (max - min) of forward-KL seed-mean accuracy over
    the lambda values (>= 3 values, OffPD/OnPD included) is <= F7_SPREAD_TOLERANCE and smaller than
    the reverse-KL spread when reverse runs exist.
    """
    test = _first_line(finding_7) + f" (tolerance {F7_SPREAD_TOLERANCE})"
    d = _spectrum_data(df)
    if d.empty or _has(d, "accuracy"):
        return _not_run(7, test, "no lambda-spectrum runs with accuracy")
    lo = float(d["lr"].min())
    parts, texts, values = [], [], {}
    for task, t in d[d["lr"] == lo].groupby("task"):
        fw = t[t["kl"] == "forward"].groupby("lam")["accuracy"].mean()
        if len(fw) < 3:
            return _not_run(7, test, f"{task}: needs >= 3 lambda values for forward KL at lr {lo:g}, has {len(fw)}")
        rv = t[t["kl"] == "reverse"].groupby("lam")["accuracy"].mean()
        sf, sr = _spread(fw), _spread(rv)
        parts.append(sf <= F7_SPREAD_TOLERANCE)
        if len(rv) >= 3:
            parts.append(sf < sr)
        values[task] = {"forward_spread": sf, "reverse_spread": sr, "n_lambdas": len(fw)}
        texts.append(f"{task} lr {lo:g}: forward spread {sf:.3f} over {len(fw)} lambdas "
                     f"(min {fw.min():.3f}), reverse spread {_fmt(sr)}")
    return FindingResult(7, _verdict(parts), "; ".join(texts), test, values)


def finding_8(df: pd.DataFrame) -> FindingResult:
    """On each lambda task with reverse KL: at the low lr the mean accuracy over lambda > 0 runs
    exceeds the mean over lambda < 0 runs, and at the high lr the seed SD of reverse KL (averaged
    over lambda values) exceeds that of forward KL. Needs >= 2 seeds.
    """
    test = _first_line(finding_8)
    d = _spectrum_data(df)
    if d.empty or _has(d, "accuracy"):
        return _not_run(8, test, "no lambda-spectrum runs with accuracy")
    lv = lr_levels(d)
    if lv is None:
        return _not_run(8, test, "needs >= 2 learning rates on the spectrum")
    lo, hi = lv
    if _max_seeds(d, ["task", "kl", "lr", "lam"]) < 2:
        return _not_run(8, test, "needs >= 2 seeds per spectrum point for the seed variance")
    parts, texts, values = [], [], {}
    for task, t in d.groupby("task"):
        r_lo = t[(t["kl"] == "reverse") & (t["lr"] == lo)]
        pos, neg = r_lo.loc[r_lo["lam"] > 0, "accuracy"], r_lo.loc[r_lo["lam"] < 0, "accuracy"]
        if pos.empty or neg.empty:
            return _not_run(8, test, f"{task}: needs reverse-KL runs at lambda > 0 and < 0 at lr {lo:g}")
        sd = {kl: float(t[(t["kl"] == kl) & (t["lr"] == hi)].groupby("lam")["accuracy"].std(ddof=1).mean())
              for kl in ("forward", "reverse")}
        collapsed = int(t.loc[(t["kl"] == "reverse") & (t["lr"] == hi), "collapsed"].sum()) \
            if "collapsed" in t.columns else 0
        parts += [pos.mean() > neg.mean(), sd["reverse"] > sd["forward"]]
        values[task] = {"reverse_low_pos": float(pos.mean()), "reverse_low_neg": float(neg.mean()),
                        "sd_reverse_high": sd["reverse"], "sd_forward_high": sd["forward"], "collapsed": collapsed}
        texts.append(f"{task}: reverse lr {lo:g} accuracy lambda>0 {pos.mean():.3f} vs lambda<0 {neg.mean():.3f}; "
                     f"lr {hi:g} seed SD reverse {sd['reverse']:.3f} vs forward {sd['forward']:.3f}; "
                     f"{collapsed} reverse runs collapsed at lr {hi:g}")
    return FindingResult(8, _verdict(parts), "; ".join(texts), test, values)


def finding_9(df: pd.DataFrame) -> FindingResult:
    """On the lambda task (countdown-3 when present), runs with lambda > 0: in the OLS
    ``pass_at_10 ~ pass_at_1 + kl`` the forward-KL coefficient (pass@10 advantage at equal pass@1)
    is positive.
    """
    import statsmodels.formula.api as smf

    test = _first_line(finding_9)
    d = _spectrum_data(df)
    if d.empty or (miss := _has(d, "pass_at_1", "pass_at_10")):
        return _not_run(9, test, "no lambda-spectrum runs with pass_at_1 and pass_at_10")
    task = "countdown-3" if "countdown-3" in set(d["task"]) else sorted(d["task"].unique())[0]
    t = d[(d["task"] == task) & (d["lam"] > 0)].dropna(subset=["pass_at_1", "pass_at_10"])
    if t["kl"].nunique() < 2 or len(t) < 4:
        return _not_run(9, test, f"{task}: needs lambda > 0 runs of both KL directions (>= 4 runs)")
    fit = smf.ols("pass_at_10 ~ pass_at_1 + C(kl, Treatment('reverse'))", data=t).fit()
    name = "C(kl, Treatment('reverse'))[T.forward]"
    coef, p = float(fit.params[name]), float(fit.pvalues[name])
    gaps = (t["pass_at_10"] - t["pass_at_1"]).groupby(t["kl"]).mean()
    stat = (f"{task}, lambda > 0 ({len(t)} runs): forward pass@10 advantage at equal pass@1 {coef:+.3f} (p {p:.3g}); "
            f"mean pass@10 - pass@1 forward {gaps.get('forward', math.nan):.3f}, reverse {gaps.get('reverse', math.nan):.3f}")
    return FindingResult(9, _verdict([coef > 0]), stat, test, {"task": task, "coef": coef, "p": p})


def finding_10(df: pd.DataFrame) -> FindingResult:
    """Harder-variant accuracy (countdown-4e_accuracy when present, else the first variant column):
    for both KL directions, the mean over lambda > 0 runs exceeds the mean over lambda < 0 runs
    (OffPD included), pooled over learning rates; Spearman rho(lambda, metric) is reported.
    """
    test = _first_line(finding_10)
    variants = variant_columns(df)
    if not variants:
        return _not_run(10, test, "no harder-variant accuracy column (<variant>_accuracy)")
    col = "countdown-4e_accuracy" if "countdown-4e_accuracy" in variants else variants[0]
    d = df[df["kl"].isin(["forward", "reverse"])].dropna(subset=[col])
    if "grad_clip" in d.columns and d["grad_clip"].notna().any():
        d = d[d["grad_clip"].notna()]
    parts, texts, values = [], [], {}
    for kl in ("forward", "reverse"):
        k = d[d["kl"] == kl]
        pos, neg = k.loc[k["lam"] > 0, col], k.loc[k["lam"] < 0, col]
        if pos.empty or neg.empty:
            return _not_run(10, test, f"{col}: needs {kl}-KL runs at lambda > 0 and < 0")
        rho = float(sstats.spearmanr(k["lam"], k[col]).statistic) if k["lam"].nunique() > 1 else math.nan
        parts.append(pos.mean() > neg.mean())
        values[kl] = {"pos": float(pos.mean()), "neg": float(neg.mean()), "rho": rho}
        texts.append(f"{kl}: {col} lambda>0 {pos.mean():.3f} vs lambda<0 {neg.mean():.3f} "
                     f"(+{100 * (pos.mean() - neg.mean()):.1f} points, Spearman rho {_fmt(rho)})")
    return FindingResult(10, _verdict(parts), "; ".join(texts), test, {"column": col, **values})


def finding_11(df: pd.DataFrame) -> FindingResult:
    """Needs RLVR results (column ``rlvr_accuracy``): the main-grid configuration with the highest
    mean rlvr_accuracy is OffPD+forward at the low lr or reverse KL at the high lr, and reverse KL at
    the low lr ends below OffPD+forward at the low lr.
    """
    test = _first_line(finding_11)
    g = main_grid(df)
    if miss := _has(g, "rlvr_accuracy"):
        return _not_run(11, test, f"no RLVR results (missing {miss}); kdlab has not run the GRPO follow-up")
    lv = lr_levels(g)
    if lv is None:
        return _not_run(11, test, "needs >= 2 learning rates")
    lo, hi = lv
    means = g.groupby(["policy", "kl", "lr"])["rlvr_accuracy"].mean()
    best = means.idxmax()
    ok_best = (best[0] == "off" and best[1] == "forward" and best[2] == lo) or (best[1] == "reverse" and best[2] == hi)
    try:
        off_fwd_lo = float(means.loc[("off", "forward", lo)])
    except KeyError:
        return _not_run(11, test, "needs OffPD+forward RLVR runs at the low lr")
    rev_lo = means.xs(("reverse", lo), level=("kl", "lr"))
    if rev_lo.empty:
        return _not_run(11, test, "needs reverse-KL RLVR runs at the low lr")
    stat = (f"best after RLVR: {best} ({means.max():.3f}); OffPD+forward low lr {off_fwd_lo:.3f}, "
            f"reverse low lr {rev_lo.mean():.3f}")
    return FindingResult(11, _verdict([ok_best, float(rev_lo.mean()) < off_fwd_lo]), stat, test,
                         {"best": best, "off_forward_low": off_fwd_lo, "reverse_low": float(rev_lo.mean())})


def finding_12(df: pd.DataFrame) -> FindingResult:
    """Needs the style experiment (column ``style_share``: share of student outputs in the teacher's
    style): OnPD+reverse has the lowest mean share, below F12_STYLE_MAJORITY, and every other
    (policy, kl) configuration is above it.
    """
    test = _first_line(finding_12)
    g = main_grid(df)
    if miss := _has(g, "style_share"):
        return _not_run(12, test, f"no style-transfer results (missing {miss})")
    means = g.groupby(["policy", "kl"])["style_share"].mean()
    if ("on", "reverse") not in means.index or len(means) < 2:
        return _not_run(12, test, "needs OnPD+reverse and at least one other configuration with style_share")
    onrev = float(means.loc[("on", "reverse")])
    others = means.drop(("on", "reverse"))
    ok = onrev < F12_STYLE_MAJORITY and bool((others > F12_STYLE_MAJORITY).all())
    stat = f"style share OnPD+reverse {onrev:.3f}; others " + ", ".join(f"{k[0]}+{k[1]} {v:.3f}" for k, v in others.items())
    return FindingResult(12, _verdict([ok]), stat, test, {"on_reverse": onrev, "others": others.to_dict()})


def finding_13(df: pd.DataFrame) -> FindingResult:
    """Robustness, each part run when its runs exist. (a) sampled estimators (kl k1/k2/k3, with a
    ``sampled_direction`` column): accuracy spread over policy x lr cells smaller for the forward
    than for the reverse estimator; (b) sampled estimators: mean forgetting high lr < low lr and mean
    sparsity low lr > high lr; (c) runs without clipping (grad_clip empty): the forward-reverse
    accuracy gap exceeds the clipped one, and OnPD is not significantly better (paired, Holm) in
    every matched pair.
    """
    test = _first_line(finding_13)
    parts, texts, values = [], [], {}
    sampled = df[df["kl"].isin(ESTIMATORS)]
    if not sampled.empty and sampled["lr"].nunique() >= 2:
        lo, hi = float(sampled["lr"].min()), float(sampled["lr"].max())
        if "sampled_direction" in sampled.columns and sampled["sampled_direction"].nunique() == 2 \
                and "accuracy" in sampled.columns:
            sp = {d: _spread(_cell_means(sampled[sampled["sampled_direction"] == d], "accuracy", ["policy", "lr"]))
                  for d in ("forward", "reverse")}
            parts.append(sp["forward"] < sp["reverse"])
            values["sampled_spread"] = sp
            texts.append(f"(a) sampled-estimator accuracy spread forward {sp['forward']:.3f} vs reverse {sp['reverse']:.3f}")
        if not _has(sampled, "forgetting", "sparsity"):
            f = sampled.groupby("lr")["forgetting"].mean()
            s = sampled.groupby("lr")["sparsity"].mean()
            parts.append(bool(f[hi] < f[lo] and s[lo] > s[hi]))
            values["sampled_lr"] = {"forgetting": f.to_dict(), "sparsity": s.to_dict()}
            texts.append(f"(b) sampled estimators: forgetting low {f[lo]:+.4f} / high {f[hi]:+.4f}, "
                         f"sparsity low {s[lo]:.3f} / high {s[hi]:.3f}")
    if "grad_clip" in df.columns and "accuracy" in df.columns:
        grid = df["policy"].isin(["off", "on"]) & df["kl"].isin(["forward", "reverse"])
        noclip, clip = df[grid & df["grad_clip"].isna()], df[grid & df["grad_clip"].notna()]
        if not noclip.empty and noclip["kl"].nunique() == 2 and noclip["policy"].nunique() == 2:
            gap = {name: abs(float(x.loc[x["kl"] == "forward", "accuracy"].mean() - x.loc[x["kl"] == "reverse", "accuracy"].mean()))
                   for name, x in (("noclip", noclip), ("clip", clip))}
            pairs = paired_comparisons(noclip, "accuracy", alpha=ALPHA)
            n_on = int((pairs["significant"] & (pairs["mean_diff"] > 0)).sum())
            parts += [gap["noclip"] > gap["clip"] if not math.isnan(gap["clip"]) else True, n_on < len(pairs)]
            values["noclip"] = {"kl_gap_noclip": gap["noclip"], "kl_gap_clip": gap["clip"], "n_on_better": n_on,
                                "n_pairs": len(pairs)}
            texts.append(f"(c) no clipping: |forward - reverse| accuracy {gap['noclip']:.3f} vs clipped {_fmt(gap['clip'])}; "
                         f"OnPD significantly better in {n_on}/{len(pairs)} matched pairs")
    if not parts:
        return _not_run(13, test, "no sampled-estimator (k1/k2/k3) runs with >= 2 lrs and no runs without clipping")
    return FindingResult(13, _verdict(parts), "; ".join(texts), test, values)


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
    """The findings scoreboard: one row per finding 1-13 with finding, claim, verdict, statistic, test."""
    rows = [{"finding": r.number, "claim": r.claim, "verdict": r.verdict, "statistic": r.statistic, "test": r.test}
            for r in evaluate_findings(df, gradients)]
    return pd.DataFrame(rows, columns=["finding", "claim", "verdict", "statistic", "test"])
