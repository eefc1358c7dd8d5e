"""Tests for kdlab.analysis: toy KL fits, KL gradients and the update bound, spectrum, statistics,
the findings scoreboard, the explorer's functions, and notebooks 50/60/70 run with papermill."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sstats

from kdlab.analysis import explore, findings, power, spectrum, stats, toy
from kdlab.engine import gradients as ga
from kdlab.analysis.synthetic import SyntheticEffects, synthetic_results
from kdlab.analysis.table import main_grid, prepare_results, resolve_path, variant_columns
from kdlab.core.kl import token_kl
from test_findings_parts import GRADIENTS_OK, _followups, _paper

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models on a shared 2-core machine: intra-op threads only add contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------------- toy KL fits


def test_kl_gradients_match_autograd_through_token_kl():
    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 3.0, 12.0):
        z_s = (scale * torch.randn(17, generator=gen, dtype=torch.float64)).requires_grad_(True)
        z_t = scale * torch.randn(17, generator=gen, dtype=torch.float64)
        closed = toy.kl_gradients(torch.softmax(z_s, -1).detach().numpy(), torch.softmax(z_t, -1).numpy())
        for d in ("forward", "reverse"):
            kl = token_kl(z_s[None], z_t[None], d).sum()
            (g,) = torch.autograd.grad(kl, z_s)
            np.testing.assert_allclose(closed[d], g.numpy(), atol=1e-12)
            assert closed[f"{d}_kl"] == pytest.approx(kl.item(), rel=1e-10)
        assert np.abs(closed["forward"]).max() <= 1.0


def test_reverse_gradient_leaves_unit_interval_by_hand():
    # Two tokens, student (1/2, 1/2), teacher (q, 1 - q): entry 1 = p1 (r1 - KL) with r_i = log p_i - log q_i.
    q = 1e-10
    p_s, p_t = np.array([0.5, 0.5]), np.array([q, 1 - q])
    r = np.log(p_s) - np.log(p_t)
    kl = 0.5 * r.sum()
    g = toy.kl_gradients(p_s, p_t)
    assert g["reverse"][0] == pytest.approx(0.5 * (r[0] - kl))
    assert g["reverse"][0] > 5  # 0.25 * log((1 - q) / q) ~ 5.76: unbounded in the log-ratio
    assert np.abs(g["forward"]).max() <= 1


def test_teacher_probs_and_mode_masses():
    x = np.arange(20.0)
    p = toy.teacher_probs(x, [5, 14], [1.0, 1.0], [0.55, 0.45])
    assert p.sum() == pytest.approx(1.0) and p.min() > 0
    np.testing.assert_allclose(toy.mode_masses(p, x, [5, 14]), [0.55, 0.45], atol=1e-4)
    with pytest.raises(ValueError, match="weights"):
        toy.teacher_probs(x, [5], [1.0], [0.0])
    with pytest.raises(ValueError, match="widths"):
        toy.teacher_probs(x, [5], [-1.0], [1.0])


def test_reverse_seeks_one_mode_forward_covers_both():
    x = np.arange(20.0)
    p = toy.teacher_probs(x, [5, 14], [1.0, 1.0], [0.55, 0.45])
    rev = toy.fit_student(p, "reverse", steps=200, lr=0.1, init_mean=7.0, init_width=1.5)
    fwd = toy.fit_student(p, "forward", steps=200, lr=0.1, init_mean=7.0, init_width=1.5)
    m_rev, m_fwd = toy.mode_masses(rev, x, [5, 14]), toy.mode_masses(fwd, x, [5, 14])
    assert m_rev.max() > 0.8
    assert m_fwd.min() > 0.3
    # Started on the other side, reverse KL finds the other mode (several local optima).
    rev2 = toy.fit_student(p, "reverse", steps=200, lr=0.1, init_mean=12.0, init_width=1.5)
    assert toy.mode_masses(rev2, x, [5, 14])[1] > 0.8


def test_forward_gaussian_matches_teacher_moments_on_a_grid():
    grid = toy.continuous_support(20)
    p = toy.teacher_probs(grid, [5, 14], [1.0, 1.5], [0.6, 0.4])
    fit = toy.fit_student_result(p, "forward", steps=300, lr=0.1, support=grid, init_mean=7.0, init_width=2.0)
    # The student family is exponential with statistics (x, x^2) on the grid, so the forward-KL
    # optimum matches the teacher's mean and variance exactly (moment matching).
    mean, sd = toy.gaussian_moments(p, grid)
    fit_mean, fit_sd = toy.gaussian_moments(fit.probs, grid)
    assert fit_mean == pytest.approx(mean, abs=0.02)
    assert fit_sd == pytest.approx(sd, abs=0.02)
    assert fit.losses[-1] < fit.losses[0]


def test_free_student_reaches_the_teacher_both_ways_and_zero_steps_is_the_start():
    x = np.arange(12.0)
    p = toy.teacher_probs(x, [3, 8], [1.0, 1.0], [0.5, 0.5], floor=1e-3)
    for d in ("forward", "reverse"):
        assert toy.fit_student_result(p, d, steps=300, lr=0.2, family="free").losses[-1] < 0.02
    start = toy.fit_student(p, "reverse", steps=0, init_mean=4.0, init_width=2.0)
    ref = np.exp(-0.5 * ((x - 4.0) / 2.0) ** 2)
    np.testing.assert_allclose(start, ref / ref.sum(), atol=1e-12)
    with pytest.raises(ValueError, match="direction"):
        toy.fit_student(p, "sideways")
    with pytest.raises(ValueError, match="family"):
        toy.fit_student(p, "forward", family="mlp")


# ---------------------------------------------------------------------------- real-model gradients


@pytest.fixture(scope="module")
def demo_pair():
    torch.manual_seed(0)
    return ga.demo_models(seed=0)


@pytest.fixture(scope="module")
def prompts():
    from kdlab.engine.data import prompt_ids

    return [prompt_ids("12+3:"), prompt_ids("abc:")]


def test_logit_gradients_match_autograd_and_respect_mask():
    gen = torch.Generator().manual_seed(1)
    s = (4 * torch.randn(2, 5, 11, generator=gen, dtype=torch.float64)).requires_grad_(True)
    t = 4 * torch.randn(2, 5, 11, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    for d in ("forward", "reverse"):
        (g,) = torch.autograd.grad(token_kl(s, t, d, mask).sum(), s)
        closed = ga.logit_gradients(s, t, d, mask)
        torch.testing.assert_close(closed, g, atol=1e-12, rtol=0)
        assert bool((closed[~mask] == 0).all())


def test_sequence_logprobs_match_independent_computation(demo_pair, prompts):
    student, teacher = demo_pair
    samples = ga.sample_policy(student, teacher, prompts, 0.0, 3, 6, seed=0)
    assert samples.n == 6 and samples.student_logits.shape[:2] == samples.tokens.shape
    for lam, logits in ((1.0, samples.student_logits), (-1.0, samples.teacher_logits)):
        lp = torch.log_softmax(logits.double(), -1).gather(-1, samples.tokens[..., None])[..., 0]
        torch.testing.assert_close(ga.sequence_logprobs(samples, lam), (lp * samples.mask).sum(-1), atol=1e-4, rtol=0)
    # lambda = 0 without safeguards: the normalised geometric mean, by hand in float64.
    ls = torch.log_softmax(samples.student_logits.double(), -1)
    lt = torch.log_softmax(samples.teacher_logits.double(), -1)
    mix = torch.log_softmax(0.5 * ls + 0.5 * lt, -1).gather(-1, samples.tokens[..., None])[..., 0]
    torch.testing.assert_close(ga.sequence_logprobs(samples, 0.0), (mix * samples.mask).sum(-1), atol=1e-4, rtol=0)
    # The sampler's own policy (with safeguards) gives every sample a finite log-probability.
    s2 = ga.sample_policy(student, teacher, prompts, 0.5, 3, 6, seed=1, logratio_clip=5.0, plausibility_alpha=0.1)
    assert bool(torch.isfinite(ga.sequence_logprobs(s2, 0.5, logratio_clip=5.0, plausibility_alpha=0.1)).all())


def test_tv_estimator_on_a_known_pair_of_distributions():
    p_a = np.array([0.4, 0.3, 0.2, 0.1, 0.0])
    p_b = np.array([0.1, 0.2, 0.3, 0.2, 0.2])
    exact = 0.5 * np.abs(p_a - p_b).sum()
    rng = np.random.default_rng(0)
    x = rng.choice(5, size=40000, p=p_a)
    with np.errstate(divide="ignore"):
        est = ga.tv_distance(np.log(p_a[x]), np.log(p_b[x]))
    assert est["tv_bounded"] == pytest.approx(exact, abs=0.01)
    assert est["mean_w"] == pytest.approx(0.8, abs=0.02)  # P_b's mass on P_a's support
    assert 0 <= est["tv"] <= 1
    assert ga.tv_distance(np.zeros(3), np.full(3, -np.inf))["tv"] == 1.0
    same = ga.tv_distance(np.log(p_a[x]), np.log(p_a[x]))
    assert same["tv"] == 0.0 and same["tv_bounded"] == 0.0
    with pytest.raises(ValueError, match="logp_a"):
        ga.tv_distance(np.array([0.0, -np.inf]), np.zeros(2))


def test_functional_distance_adds_shared_prefixes():
    samples = ga.PolicySamples(
        lam=0.0, prompt_index=torch.tensor([0, 0]), prompts=torch.zeros(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1, dtype=torch.bool), teacher_prompts=torch.zeros(2, 1, dtype=torch.long),
        teacher_prompt_mask=torch.ones(2, 1, dtype=torch.bool), tokens=torch.tensor([[3, 4], [3, 5]]),
        mask=torch.ones(2, 2, dtype=torch.bool), student_logits=torch.zeros(2, 2, 3), teacher_logits=torch.zeros(2, 2, 3))
    g = torch.tensor([[[0.5, -0.5, 0.0], [0.1, 0.2, -0.3]], [[0.5, -0.5, 0.0], [0.9, 0.0, -0.9]]], dtype=torch.float64)
    coef = torch.tensor([0.3, 0.4], dtype=torch.float64)
    # Coordinates: prefix () shared by both rows -> 0.3*0.5 + 0.4*0.5 = 0.35; prefixes (3,) differ?
    # No: both rows' second position has prefix (3,), so it is shared too: 0.3*g[0,1] + 0.4*g[1,1].
    shared_second = 0.3 * g[0, 1] + 0.4 * g[1, 1]
    expected = max(0.35, float(shared_second.abs().max()))
    assert ga.functional_update_distance(samples, g, coef) == pytest.approx(expected)


def test_update_distance_bound_forward_holds_reverse_escapes(demo_pair, prompts):
    student, teacher = demo_pair
    table = ga.update_distance_vs_tv(student, teacher, prompts, [-1.0, 0.0, 1.0], samples_per_prompt=4,
                                     max_new_tokens=5, pairs=[(0.0, 0.0), (-1.0, 0.0), (-1.0, 1.0)],
                                     logratio_clip=5.0, plausibility_alpha=0.1, seed=0)
    assert set(table.columns) >= {"tv", "dist_logit", "bound_logit", "dist_param", "param_const", "max_abs_entry"}
    fw, rv = table[table.direction == "forward"], table[table.direction == "reverse"]
    assert fw["below_bound"].all() and (fw["max_abs_entry"] <= 1).all()
    assert (rv["max_abs_entry"] > 1).all()  # the sharpened teacher pushes reverse entries out of [-1, 1]
    same = table[(table.lam_a == 0.0) & (table.lam_b == 0.0)]
    assert (same["tv"] == 0).all() and (same["dist_logit"] == 0).all() and (same["dist_param"] == 0).all()
    assert (table["dist_param"] <= table["bound_param"] * (1 + 1e-9)).all()


def test_param_distance_equals_one_batched_backward(demo_pair, prompts):
    """Independent check of the per-response accumulation: one weighted batched loss, one backward."""
    from kdlab.engine.batching import response_logits

    student, teacher = demo_pair
    samples = ga.sample_policy(student, teacher, prompts, 0.0, 3, 5, seed=3)
    coef = torch.linspace(-0.5, 0.7, samples.n, dtype=torch.float64)
    dist, const = ga._param_update_distances(student, samples, {1.0: coef})
    student.zero_grad()
    for p in student.parameters():
        p.requires_grad_(True)
    logits = response_logits(student, samples.prompts, samples.prompt_mask, samples.tokens, samples.mask)
    per_seq = token_kl(logits, samples.teacher_logits, "reverse", samples.mask).sum(-1)
    (coef.float() * per_seq).sum().backward()
    ref = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in student.parameters() if p.grad is not None))
    student.zero_grad()
    assert dist[(1.0, "reverse")] == pytest.approx(ref, rel=1e-4)
    assert const["forward"] > 0 and const["reverse"] > 0


def test_gradient_entries_summary(demo_pair, prompts):
    student, teacher = demo_pair
    e = ga.gradient_entries(ga.sample_policy(student, teacher, prompts, 1.0, 2, 4, seed=0))
    rows = {r["direction"]: r for r in e.summary()}
    assert rows["forward"]["max_abs_entry"] <= 1 and rows["forward"]["max_norm"] <= math.sqrt(2)
    assert rows["forward"]["n_tokens"] == e.forward.shape[0] > 0
    np.testing.assert_allclose(e.norms("reverse"), np.sqrt((e.reverse ** 2).sum(1)))


# ------------------------------------------------------------------------- table, spectrum, explorer


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return prepare_results(synthetic_results(tasks=("countdown-3", "kb-mc"), robustness=True))


def test_prepare_results_fills_lambda_and_rejects_bad_tables():
    raw = synthetic_results(lambdas=()).drop(columns=["lam"])
    out = prepare_results(raw)
    assert set(out.loc[out.policy == "off", "lam"]) == {-1.0} and set(out.loc[out.policy == "on", "lam"]) == {1.0}
    with pytest.raises(ValueError, match="lam is missing"):
        prepare_results(synthetic_results().drop(columns=["lam"]))
    with pytest.raises(ValueError, match="seed"):
        prepare_results(raw.drop(columns=["seed"]))
    with pytest.raises(ValueError, match="policy"):
        prepare_results(raw.assign(policy="sideways"))
    assert variant_columns(prepare_results(synthetic_results())) == ["countdown-4e_accuracy"]
    assert resolve_path("notebooks") == REPO_ROOT / "notebooks"


def test_mean_ci_matches_scipy():
    x = [0.61, 0.70, 0.66, 0.72]
    r = spectrum.mean_ci(x)
    lo, hi = sstats.t.interval(0.95, 3, loc=np.mean(x), scale=sstats.sem(x))
    assert (r["ci_lo"], r["ci_hi"]) == (pytest.approx(lo), pytest.approx(hi))
    one = spectrum.mean_ci([0.5])
    assert one["mean"] == 0.5 and math.isnan(one["ci_lo"])


def test_spectrum_table_and_plot(results):
    tab = spectrum.spectrum_table(results, "accuracy", task="countdown-3")
    assert set(tab["lam"]) == {-1.0, -0.5, 0.0, 0.5, 1.0}
    assert set(tab["kl"]) == {"forward", "reverse"}  # sampled-estimator runs have no spectrum
    row = tab[(tab.kl == "reverse") & (tab.lr == 1e-4) & (tab.lam == -1.0)].iloc[0]
    src = results[(results.task == "countdown-3") & (results.kl == "reverse") & (results.lr == 1e-4)
                  & (results.policy == "off") & results.grad_clip.notna()]
    assert row["n"] == 3 and row["mean"] == pytest.approx(src["accuracy"].mean())
    fig = spectrum.plot_spectrum(results, ["accuracy", "pass_at_10"], task="countdown-3")
    assert len(fig.axes) == 2 * 4
    with pytest.raises(ValueError, match="metric"):
        spectrum.spectrum_table(results, "nope")


def test_explorer_functions(results):
    data = explore.explorer_data(results, "accuracy", "lam", "kl", {"lr": [1e-4], "task": ["countdown-3"]})
    ref = results[(results.lr == 1e-4) & (results.task == "countdown-3")].groupby(["lam", "kl"])["accuracy"].mean()
    np.testing.assert_allclose(data.set_index(["lam", "kl"])["mean"].sort_index(), ref.sort_index())
    assert len(explore.apply_filters(results, {"kl": []})) == len(results)
    fig = explore.explorer_plot(results, "forgetting", "lr", None, {"policy": ["off"]})
    assert fig.axes[0].get_title().startswith("forgetting by lr")
    empty = explore.explorer_plot(results, "accuracy", "lam", "kl", {"task": ["none"]})
    assert "no runs" in empty.axes[0].texts[0].get_text()
    for bad in ({"metric": "zzz"}, {"x": "zzz"}, {"hue": "zzz"}, {"filters": {"zzz": [1]}}):
        kw = {"metric": "accuracy", "x": "lam", "hue": None, "filters": None, **bad}
        with pytest.raises(ValueError):
            explore.explorer_data(results, **kw)


# ------------------------------------------------------------------------------------- statistics


def _holm_step_down(p):
    """The step-down Holm adjustment written out (kdlab's own code before statsmodels replaced it)."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    running = 0.0
    for rank, idx in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (ok.size - rank) * p[idx]))
        out[idx] = running
    return out


def _wilson_closed_form(k, n, z=1.959963984540054):
    """Wilson score interval, closed form: (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def test_holm_is_statsmodels_and_matches_the_step_down_by_hand():
    # by hand: sorted 0.005, 0.01, 0.03, 0.04, 0.2 times 5, 4, 3, 2, 1 -> 0.025, 0.04, 0.09, 0.08 -> 0.09 (monotone), 0.2
    p = np.array([0.01, 0.04, 0.03, 0.2, 0.005])
    np.testing.assert_allclose(stats.holm(p), [0.04, 0.09, 0.09, 0.2, 0.025])
    rng = np.random.default_rng(0)
    for case in ([0.02, np.nan, 0.01], [0.5, 0.6, 0.9], [0.01, 0.01, 0.01], [0.3], [], rng.uniform(0, 0.2, 12),
                 np.r_[rng.uniform(0, 1, 6), np.nan, np.nan]):
        np.testing.assert_allclose(stats.holm(case), _holm_step_down(case), rtol=1e-12)  # NaN where NaN
    out = stats.holm([0.02, np.nan, 0.01])
    assert math.isnan(out[1]) and out[2] == pytest.approx(0.02)  # NaN is not counted: m = 2
    assert stats.holm([0.5, 0.6, 0.9]).max() == 1.0  # capped at 1


def test_wilson_is_statsmodels_and_matches_the_closed_form():
    from statsmodels.stats.proportion import proportion_confint

    # published 95% Wilson intervals: 0/10 -> [0, 0.2775], 5/10 -> [0.2366, 0.7634]
    np.testing.assert_allclose(findings.wilson(0, 10), (0.0, 0.2775), atol=5e-5)
    np.testing.assert_allclose(findings.wilson(5, 10), (0.2366, 0.7634), atol=5e-5)
    for k, n in ((0, 10), (5, 10), (10, 10), (1, 3), (10, findings.FOLLOWUP_EVAL_N), (199, 200), (3, 72)):
        np.testing.assert_allclose(findings.wilson(k, n), _wilson_closed_form(k, n), atol=1e-12)
        assert findings.wilson(k, n) == pytest.approx(proportion_confint(k, n, alpha=0.05, method="wilson"))
    assert all(math.isnan(x) for x in findings.wilson(0, 0))


def test_anova_partial_eta_squared_by_hand():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"lr": np.repeat([1e-4, 5e-4], 6), "y": np.r_[rng.normal(0, 1, 6), rng.normal(3, 1, 6)]})
    tab = stats.anova_table(df, "y", factors=("lr",)).set_index("term")
    grand = df.y.mean()
    ss_b = sum(len(g) * (g.y.mean() - grand) ** 2 for _, g in df.groupby("lr"))
    ss_w = sum(((g.y - g.y.mean()) ** 2).sum() for _, g in df.groupby("lr"))
    assert tab.loc["lr", "partial_eta_sq"] == pytest.approx(ss_b / (ss_b + ss_w))
    assert tab.loc["Residual", "df"] == 10


def test_planted_lr_effect_is_the_biggest_knob_for_forgetting(results):
    grid = main_grid(results)
    knobs = stats.knob_table(grid, ["forgetting", "sparsity", "accuracy"])
    assert knobs["forgetting"].idxmax() == "lr" and knobs["sparsity"].idxmax() == "lr"
    assert knobs.loc["kl", "accuracy"] > knobs.loc["policy", "accuracy"]
    # With one seed the full interaction model has no residual: the order is lowered.
    one_seed = grid[grid.seed == 0]
    assert stats.anova_table(one_seed, "forgetting")["order"].iloc[0] < 4


def test_paired_test_finds_a_planted_policy_effect():
    seeds = tuple(range(6))
    planted = prepare_results(synthetic_results(SyntheticEffects(policy_accuracy=0.05), seeds=seeds, rng_seed=1))
    pairs = stats.paired_comparisons(main_grid(planted), "accuracy")
    fwd = pairs[pairs.kl == "forward"]
    assert fwd["significant"].all() and (fwd["mean_diff"] > 0.03).all()
    null = prepare_results(synthetic_results(seeds=seeds, rng_seed=1))
    assert not stats.paired_comparisons(main_grid(null), "accuracy").query("kl == 'forward'")["significant"].any()
    # One group against scipy's paired t-test.
    g = main_grid(planted).query("kl == 'forward' and lr == 1e-4")
    on = g[g.policy == "on"].sort_values("seed")["accuracy"].to_numpy()
    off = g[g.policy == "off"].sort_values("seed")["accuracy"].to_numpy()
    ref = sstats.ttest_rel(on, off)
    row = fwd[fwd.lr == 1e-4].iloc[0]
    assert row["t"] == pytest.approx(ref.statistic) and row["p"] == pytest.approx(ref.pvalue)
    assert row["d_z"] == pytest.approx((on - off).mean() / (on - off).std(ddof=1))
    assert row["ci_lo"] < row["mean_diff"] < row["ci_hi"]


def test_seed_variance_and_mixed_model(results):
    sv = stats.seed_variance(results, ["accuracy"])
    g = results[(results.task == "kb-mc") & (results.policy == "on") & (results.kl == "forward") & (results.lr == 1e-4)
                & results.grad_clip.notna()]
    row = sv[(sv.task == "kb-mc") & (sv.policy == "on") & (sv.kl == "forward") & (sv.lr == 1e-4)]
    assert row["n"].max() >= 3
    one = stats.seed_variance(g, ["accuracy"]).iloc[0]
    assert one["sd"] == pytest.approx(g["accuracy"].std(ddof=1))
    skipped = stats.mixed_model(main_grid(results[results.task == "kb-mc"]), "accuracy")
    assert skipped["status"] == "skipped" and "at least 2" in skipped["reason"]
    fit = stats.mixed_model(main_grid(results), "forgetting")
    assert fit["status"] == "fit" and "Intercept" in set(fit["table"]["term"])


# --------------------------------------------------------------------------------------- findings


def _board(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> pd.DataFrame:
    board = findings.scoreboard(prepare_results(df), gradients)
    assert list(findings.summary_rows(board)["finding"]) == list(range(1, 14))
    return board


def _verdicts(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> dict[int, str]:
    """Each finding's own line (its summary row)."""
    s = findings.summary_rows(_board(df, gradients))
    return dict(zip(s["finding"], s["verdict"]))


def _part_verdicts(df: pd.DataFrame, gradients: pd.DataFrame | None = None) -> dict[str, str]:
    """Each part's verdict by its label ("2a")."""
    p = findings.part_rows(_board(df, gradients))
    return dict(zip(p["label"], p["verdict"]))


def test_scoreboard_on_planted_paper_directions(results):
    board = _board(results)
    ran = board[board["finding"].isin([1, 2, 3, 4, 5, 7, 8, 9, 10, 13])]
    parts = findings.part_rows(ran)
    assert (parts["verdict"] == "reproduced").all(), parts[["label", "verdict", "detail"]]
    for _, s in findings.summary_rows(ran).iterrows():
        n = s["n_parts"]
        assert s["verdict"] == ("reproduced" if n == 1 else f"{n} of {n} parts reproduced"), s["verdict"]
    v = _verdicts(results)
    assert v[6] == v[11] == v[12] == "not run"


@pytest.mark.parametrize("effects, part", [
    (SyntheticEffects(policy_accuracy=0.10), "1a"),
    (SyntheticEffects(forgetting_low=-0.12, forgetting_high=-0.005), "3a"),
    (SyntheticEffects(off_sparsity_gain=-0.05), "4b"),
    (SyntheticEffects(forgetting_low=-0.08), "5b"),
    (SyntheticEffects(reverse_lambda_slope=-0.08), "8a"),
    (SyntheticEffects(coverage_gap=(0.05, 0.15)), "9a"),
    (SyntheticEffects(variant_slope=-0.06), "10b"),
])
def test_verdict_flips_when_the_planted_effect_flips(effects, part):
    df = synthetic_results(effects)
    assert _part_verdicts(df)[part] == "not reproduced"
    assert "not reproduced" in _verdicts(df)[int(part[:-1])]  # the line says so, counting the parts


def test_findings_not_run_without_the_data():
    one_seed = synthetic_results(seeds=(0,))
    v = _verdicts(one_seed.drop(columns=["countdown-4e_accuracy"]))
    assert v[1] == "not run" and v[8] == "not run" and v[10] == "not run"
    r = findings.finding_1(prepare_results(one_seed))
    assert "2 seeds" in r.detail and np.isnan(r.statistic) and not r.parts
    no_lambda = synthetic_results(lambdas=())
    assert _verdicts(no_lambda)[7] == "not run"


def test_finding_6_uses_the_gradient_table():
    ok = pd.DataFrame({"direction": ["forward", "reverse"], "max_abs_entry": [0.9, 3.0], "dist_logit": [0.1, 0.5],
                       "tv": [0.2, 0.2]})
    df = synthetic_results()
    one = _part_verdicts(df, ok)  # one forward pair: fewer than F6_MIN_PAIRS
    assert (one["6a"], one["6b"], one["6c"]) == ("reproduced", "inconclusive", "reproduced")
    assert _verdicts(df, ok)[6] == "2 of 3 parts reproduced (1 inconclusive)"
    assert _verdicts(df, GRADIENTS_OK)[6] == "3 of 3 parts reproduced"
    bad = _part_verdicts(df, ok.assign(max_abs_entry=[1.2, 3.0]))
    assert bad["6a"] == "not reproduced" and bad["6c"] == "reproduced"


def test_findings_11_and_12_with_planted_columns():
    df = prepare_results(synthetic_results())
    low = df["lr"] == df["lr"].min()
    rl = np.where((df.policy == "off") & (df.kl == "forward") & low, 0.6, np.where((df.kl == "reverse") & low, 0.1, 0.4))
    assert findings.finding_11(df.assign(rlvr_accuracy=rl)).verdict == "2 of 2 parts reproduced"
    assert findings.finding_11(df.assign(rlvr_accuracy=1 - rl)).verdict == "0 of 2 parts reproduced (2 not reproduced)"
    style = np.where((df.policy == "on") & (df.kl == "reverse"), 0.05, 0.95)
    assert findings.finding_12(df.assign(style_share=style)).verdict == "2 of 2 parts reproduced"
    assert findings.finding_12(df.assign(style_share=1 - style)).verdict == "0 of 2 parts reproduced (2 not reproduced)"


def test_each_finding_is_not_run_without_its_data():
    one_seed = _paper(seeds=(0,))
    v = {r.number: r for r in findings.evaluate_findings(one_seed)}
    for n in (1, 2, 3, 4, 5, 7, 8, 10):  # no replicate seeds: no seed-to-seed variance, no interval
        assert v[n].verdict == "not run" and "2 seeds" in v[n].detail, (n, v[n].detail)
    bare = prepare_results(synthetic_results(lambdas=(), variants=()))
    w = {r.number: r.verdict for r in findings.evaluate_findings(bare)}
    assert w[6] == w[9] == w[11] == w[12] == w[13] == w[10] == w[7] == "not run"


def test_single_runs_of_the_follow_ups_get_binomial_intervals():
    """One RLVR value and one style run per configuration: the intervals are binomial over the
    evaluation problems (FOLLOWUP_EVAL_N), wide enough to leave close calls inconclusive."""
    df = prepare_results(synthetic_results(seeds=(0,)))

    def one_run(t):  # style runs at the low rate only, as the study runs them
        return t.assign(style_share=t.style_share.where(t.lr == t.lr.min()))

    far = one_run(_followups(df, noise=0.0))
    r12 = findings.finding_12(far)
    assert r12.verdict == "2 of 2 parts reproduced" and r12.part("a").estimate.method == "binomial"
    lo, hi = findings.wilson(10, findings.FOLLOWUP_EVAL_N)
    a = r12.part("a").estimate
    assert a.lo < 0.05 < a.hi and 0 < lo < hi < 0.15
    near = findings.finding_12(one_run(_followups(df, noise=0.0, near=True)))
    assert [p.verdict for p in near.parts] == ["inconclusive", "inconclusive"]
    assert findings.finding_11(far).verdict == "2 of 2 parts reproduced"


def test_verdict_rules_and_scoreboard_columns():
    e = findings.Estimate(1.0, 0.2, 1.8)
    assert findings.decide_greater(e) == "reproduced" and findings.decide_less(e) == "not reproduced"
    assert findings.decide_greater(findings.Estimate(0.1, -0.5, 0.7)) == "inconclusive"
    assert findings.decide_equivalent(findings.Estimate(0.1, -0.3, 0.4), 0.5) == "reproduced"
    assert findings.decide_equivalent(findings.Estimate(0.1, -0.3, 0.6), 0.5) == "inconclusive"
    assert findings.decide_equivalent(findings.Estimate(0.8, 0.6, 1.0), 0.5) == "not reproduced"
    assert findings.summarize(["reproduced", "inconclusive"]) == "1 of 2 parts reproduced (1 inconclusive)"
    assert findings.summarize(["reproduced", "not reproduced", "inconclusive"]) == \
        "1 of 3 parts reproduced (1 not reproduced, 1 inconclusive)"
    assert findings.SPARSITY_EQUIVALENCE_POINTS == 0.5
    board = findings.scoreboard(_paper())
    assert list(board.columns) == findings.SCOREBOARD_COLUMNS
    parts = findings.part_rows(board)
    assert set(parts["verdict"]) <= set(findings.VERDICTS)
    ran = parts[parts.verdict != "not run"]
    assert ran[["statistic", "ci_low", "ci_high", "threshold"]].notna().all().all()
    assert (board.loc[board.verdict == "not run", "detail"].str.len() > 0).all()
    # the same table gives the same verdicts and intervals (fixed bootstrap seed)
    pd.testing.assert_frame_equal(board, findings.scoreboard(_paper()))


def test_pooled_t_interval_matches_the_bootstrap_for_a_difference_of_means():
    """For a plain difference of two cell means the parametric bootstrap is the pooled t interval."""
    rng = np.random.default_rng(0)
    d = pd.DataFrame({"g": ["a"] * 5 + ["b"] * 5, "x": np.r_[rng.normal(1, 1, 5), rng.normal(0, 1, 5)]})
    c = findings.cell_model(d, "x", ["g"])
    est = findings.bootstrap(c, lambda M: findings.sel(M, g="a").iloc[:, 0] - findings.sel(M, g="b").iloc[:, 0], scale=1)
    a, b = d.x[d.g == "a"], d.x[d.g == "b"]
    ref = sstats.ttest_ind(a, b).confidence_interval(0.95)
    assert est.value == pytest.approx(a.mean() - b.mean())
    assert est.lo == pytest.approx(ref.low, abs=0.12) and est.hi == pytest.approx(ref.high, abs=0.12)


# -------------------------------------------------------------------------------- notebooks (papermill)


def run_notebook(name: str, tmp_path: Path, **parameters) -> Path:
    """Execute notebooks/<name>.ipynb with papermill (kernel python3) into tmp_path; returns the output."""
    import papermill as pm

    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "src"), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    out = tmp_path / f"{name}.out.ipynb"
    pm.execute_notebook(str(REPO_ROOT / "notebooks" / f"{name}.ipynb"), str(out), parameters=parameters,
                        kernel_name="python3", cwd=str(REPO_ROOT / "notebooks"), progress_bar=False)
    return out


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("study")
    synthetic_results(tasks=("countdown-3", "kb-mc"), robustness=True).to_parquet(folder / "results.parquet")
    return folder


def test_notebooks_are_paired_and_stored_without_outputs():
    for name in ("40_teaching_kl", "50_gradients", "60_spectrum", "70_statistics", "80_explorer"):
        nb = json.loads((REPO_ROOT / "notebooks" / f"{name}.ipynb").read_text())
        assert nb["metadata"]["kernelspec"]["name"] == "python3"
        py = (REPO_ROOT / "notebooks" / f"{name}.py").read_text()
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), name
        params = [c for c in code if "parameters" in c["metadata"].get("tags", [])]
        assert len(params) == 1 and "study_dir" in "".join(params[0]["source"]), name
        # The pair is in sync: every code cell of the notebook appears in the py:percent file.
        assert all("".join(c["source"]).strip() in py for c in code), name


@pytest.mark.slow
def test_notebook_60_spectrum(study_dir, tmp_path):
    run_notebook("60_spectrum", tmp_path, study_dir=str(study_dir))
    out = study_dir / "analysis" / "60_spectrum"
    table = pd.read_csv(out / "spectrum.csv")
    assert {"accuracy", "pass_at_10", "countdown-4e_accuracy"} <= set(table["metric"])
    src = pd.read_parquet(study_dir / "results.parquet")
    ref = src[(src.task == "countdown-3") & (src.kl == "forward") & (src.lr == 1e-4) & (src.policy == "on")
              & src.grad_clip.notna()]["accuracy"].mean()
    row = table[(table.metric == "accuracy") & (table.kl == "forward") & (table.lr == 1e-4) & (table.lam == 1.0)]
    assert row["mean"].iloc[0] == pytest.approx(ref)
    assert (out / "spectrum_countdown-3.png").stat().st_size > 10_000


@pytest.mark.slow
def test_notebook_70_statistics(study_dir, tmp_path):
    run_notebook("70_statistics", tmp_path, study_dir=str(study_dir))
    out = study_dir / "analysis" / "70_statistics"
    board = json.loads((out / "scoreboard.json").read_text())
    assert [r["finding"] for r in board if not r["part"]] == list(range(1, 14))
    expected = findings.scoreboard(prepare_results(pd.read_parquet(study_dir / "results.parquet")))
    assert [r["label"] for r in board] == list(expected["label"])
    assert [r["verdict"] for r in board] == list(expected["verdict"])
    # every part carries its power: the interval's half-width against the distance to its bound
    assert [r["power"] for r in board] == list(power.add_power(expected)["power"])
    assert any(r["power"] for r in board if r["part"]) and not any(r["power"] for r in board if not r["part"])
    knobs = pd.read_csv(out / "knob_table.csv", index_col=0)
    assert knobs["forgetting"].idxmax() == "lr"
    assert json.loads((out / "mixed_model.json").read_text())["accuracy"]["status"] == "fit"
    assert len(pd.read_csv(out / "paired.csv")) == 4 * 8  # 4 metrics x 2 tasks x 2 kls x 2 lrs


@pytest.mark.slow
def test_notebook_50_gradients(study_dir, tmp_path):
    run_notebook("50_gradients", tmp_path, study_dir=str(study_dir), n_prompts=2, samples_per_prompt=3,
                 lambdas=[-1.0, 1.0], max_new_tokens=5, threads=1)
    out = study_dir / "analysis" / "50_gradients"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"]["demo"] is True and summary["forward_within_unit"] is True
    bound = pd.read_csv(out / "bound.csv")
    assert len(bound) == 4 and bound.loc[bound.direction == "forward", "below_bound"].all()
    assert (out / "update_bound.png").exists() and (out / "gradient_entries.png").exists()


def test_explorer_plot_with_a_single_hue_level():
    """A study with one KL direction: seaborn's dodge would divide by zero."""
    import pandas as pd

    from kdlab.analysis.explore import explorer_plot

    df = pd.DataFrame({"lam": [-1.0, 1.0], "kl": ["forward", "forward"], "accuracy": [0.2, 0.3],
                       "policy": ["off", "on"], "lr": [1e-4, 1e-4], "seed": [0, 0], "task": ["countdown-3"] * 2})
    fig = explorer_plot(df, "accuracy", "lam", "kl", {})
    assert fig.axes and fig.axes[0].get_title().startswith("accuracy by lam")
