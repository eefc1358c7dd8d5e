"""GRPO with a verifiable reward: advantages, the clipped objective, rewards, training, collapse."""
import math
import random

import pytest
import torch

from kdlab.engine.data import ProblemPool
from kdlab.models.toy import build_model
from kdlab.evaluation.evaluate import accuracy
from kdlab.engine.rlvr import (RLVRConfig, detect_collapse, group_advantages, grpo_loss, grpo_train, token_logprobs,
                               verifiable_rewards)
from kdlab.tasks import get_task
from kdlab.tasks.base import Problem, Task


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Nano models are far faster on one thread, and the test machine's cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class DigitTask(Task):
    """Toy verifiable task: reward 1 when the completion starts with a digit (an untrained nano
    model does so ~10% of the time, so groups have mixed rewards from the first step)."""

    name, tag, max_new_tokens = "toy-digit", "z", 3

    def problems(self, split, count, seed=0):
        return [Problem(task=self.name, key=f"{split}:{seed}:{i}", prompt=f"z{i}:", data={}) for i in range(count)]

    def reference(self, problem, rng):
        return "7"

    def score(self, problem, completion):
        return 1.0 if completion[:1].isdigit() else 0.0


# --------------------------------------------------------------------------------------------
# advantages
# --------------------------------------------------------------------------------------------
def test_group_advantages_match_a_hand_computation():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 3.0, 6.0]])
    # row 0: mean 1/3, population variance ((2/3)^2 + 2 (1/3)^2) / 3 = 2/9, std sqrt(2)/3
    #   -> (2/3) / (sqrt(2)/3) = sqrt(2), (-1/3) / (sqrt(2)/3) = -1/sqrt(2)
    # row 1: mean 3, population variance (9 + 0 + 9) / 3 = 6 -> -3/sqrt(6), 0, 3/sqrt(6)
    s2, s6 = math.sqrt(2), math.sqrt(6)
    expected = torch.tensor([[s2, -1 / s2, -1 / s2], [-3 / s6, 0.0, 3 / s6]])
    assert torch.allclose(group_advantages(rewards), expected, atol=1e-5)
    centred = torch.tensor([[2 / 3, -1 / 3, -1 / 3], [-3.0, 0.0, 3.0]])
    assert torch.allclose(group_advantages(rewards, normalise_std=False), centred, atol=1e-6)


def test_group_advantages_all_equal_or_single_sample_are_zero():
    assert torch.equal(group_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])), torch.zeros(2, 3))
    assert torch.equal(group_advantages(torch.tensor([[1.0], [0.0]])), torch.zeros(2, 1))


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(0, 2), torch.zeros(2, 2, 2)])
def test_group_advantages_reject_bad_shapes(bad):
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(bad)


# --------------------------------------------------------------------------------------------
# the clipped objective
# --------------------------------------------------------------------------------------------
def _one_token_grad(ratio: float, advantage: float, clip_eps: float = 0.2) -> tuple[float, dict]:
    """d loss / d logp_new for one token whose importance ratio is ``ratio``."""
    logp_old = torch.tensor([[-1.0]])
    logp_new = (logp_old + math.log(ratio)).requires_grad_(True)
    loss, stats = grpo_loss(logp_new, logp_old, torch.tensor([advantage]), torch.tensor([[True]]), clip_eps=clip_eps)
    loss.backward()
    return float(logp_new.grad), {k: float(v) for k, v in stats.items()}


@pytest.mark.parametrize("ratio,adv,grad,clipped", [
    (1.1, 1.0, -1.1, 0.0),   # A > 0, inside: descent raises logp; d(-ratio*A)/dlogp = -ratio*A
    (0.5, 1.0, -0.5, 0.0),   # A > 0, below the range: min takes the unclipped term, still pushes up
    (1.5, 1.0, 0.0, 1.0),    # A > 0, beyond 1+eps: clipped, no gradient
    (0.9, -1.0, 0.9, 0.0),   # A < 0, inside: descent lowers logp
    (1.5, -1.0, 1.5, 0.0),   # A < 0, above the range: unclipped term, still pushes down
    (0.5, -1.0, 0.0, 1.0),   # A < 0, below 1-eps: clipped, no gradient
])
def test_clipped_objective_gradient_sign_and_value(ratio, adv, grad, clipped):
    g, stats = _one_token_grad(ratio, adv)
    assert g == pytest.approx(grad, abs=1e-6)
    assert stats["clip_frac"] == clipped
    assert stats["ratio_mean"] == pytest.approx(ratio, rel=1e-6)


def test_positive_advantage_step_increases_logp_of_sampled_token():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 3))
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    before = token_logprobs(logits, tokens).detach()
    loss, _ = grpo_loss(token_logprobs(logits, tokens), before, adv, mask)
    loss.backward()
    with torch.no_grad():
        after = token_logprobs(logits - 0.1 * logits.grad, tokens)
    assert bool((after[0] > before[0]).all()) and bool((after[1] < before[1]).all())


def test_normalisation_sequence_vs_token_mean():
    # ratio 1 everywhere, so loss_bt = -A_b; sequence 0 has 1 token, sequence 1 has 3
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[True, False, False], [True, True, True]])
    adv = torch.tensor([2.0, -1.0])
    seq, _ = grpo_loss(logp, logp, adv, mask, normalisation="sequence")
    tok, _ = grpo_loss(logp, logp, adv, mask, normalisation="token")
    assert float(seq) == pytest.approx((-2.0 + 1.0) / 2)
    assert float(tok) == pytest.approx((-2.0 * 1 + 1.0 * 3) / 4)


def test_kl_penalty_is_k3_to_the_reference():
    logp_new = torch.tensor([[-1.0, -2.0]])
    logp_ref = torch.tensor([[-1.5, -1.0]])
    mask = torch.tensor([[True, True]])
    d = logp_ref - logp_new  # log(q/p)
    k3 = (torch.exp(d) - 1 - d)  # hand formula
    loss, stats = grpo_loss(logp_new, logp_new, torch.tensor([0.0]), mask, kl_coef=0.5, logp_ref=logp_ref)
    assert float(loss) == pytest.approx(0.5 * float(k3.mean()), rel=1e-6)
    assert float(stats["kl"]) == pytest.approx(float(k3.mean()), rel=1e-6)
    with pytest.raises(ValueError, match="logp_ref"):
        grpo_loss(logp_new, logp_new, torch.tensor([0.0]), mask, kl_coef=0.5)


def test_masked_tokens_get_no_gradient():
    logp_old = torch.zeros(1, 3)
    logp_new = torch.full((1, 3), 0.05, requires_grad=True)
    loss, _ = grpo_loss(logp_new, logp_old, torch.tensor([1.0]), torch.tensor([[True, True, False]]))
    loss.backward()
    assert logp_new.grad[0, 2] == 0 and bool((logp_new.grad[0, :2] < 0).all())


# --------------------------------------------------------------------------------------------
# rewards
# --------------------------------------------------------------------------------------------
def test_countdown_rewards_on_known_completions():
    task = get_task("countdown-3")
    problems = task.problems("test", 20, seed=0)
    rng = random.Random(0)
    refs = [task.reference(p, rng) for p in problems]
    assert verifiable_rewards(task, problems, refs).tolist() == [1.0] * 20
    # corrupted: answer for another problem, answer removed, a literal changed by one
    wrong = [refs[(i + 1) % 20] for i in range(20)]
    no_answer = [r.split("#")[0] for r in refs]
    bumped = [r[:-1] + str((int(r[-1]) + 1) % 10) if r[-1].isdigit() else r[:-1] for r in refs]
    assert verifiable_rewards(task, problems, no_answer).tolist() == [0.0] * 20
    assert verifiable_rewards(task, problems, bumped).tolist() == [0.0] * 20
    assert verifiable_rewards(task, problems, wrong).sum() <= 1  # a coincidental match at most
    with pytest.raises(ValueError, match="differ in length"):
        verifiable_rewards(task, problems, refs[:3])


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------
def _run(seed: int, **kw):
    task = DigitTask()
    pool = ProblemPool(task, "train", 32, seed=0)
    model = build_model("llama", "nano", seed=0)
    lr = kw.pop("force_lr", None)
    cfg = RLVRConfig(**{"steps": 3, "prompts_per_step": 4, "group_size": 4, "lr": 1e-2, "seed": seed, **kw})
    if lr is not None:  # a rate beyond the rule (0, 1], set past the check, to make the run diverge
        cfg.lr = lr
    test = task.problems("test", 4)
    res = grpo_train(model, task, cfg, pool, eval_fn=lambda m: accuracy(m, task, test), eval_every=2, progress=False)
    return model, res


def test_same_seed_same_history_other_seed_differs():
    kw = dict(kl_coef=0.1, inner_epochs=2)
    m1, a = _run(3, **kw)
    m2, b = _run(3, **kw)
    _, c = _run(4, **kw)
    assert a["history"] == b["history"]
    assert all(torch.equal(x, y) for x, y in zip(m1.parameters(), m2.parameters()))
    assert a["history"] != c["history"]
    h = a["history"]
    assert len(h) == 3 and not a["collapsed"] and not a["nan"]
    assert [e["accuracy"] is not None for e in h] == [False, True, True]
    assert a["initial_accuracy"] is not None and a["final_accuracy"] == h[-1]["accuracy"]
    for e in h:
        assert 0 <= e["reward_mean"] <= 1 and 1 <= e["length"] <= 3 and 0 <= e["clip_frac"] <= 1
        assert e["grad_norm"] >= 0 and e["kl"] >= 0 and e["collapsed"] is False
    assert next(m1.parameters()).dtype == torch.bfloat16
    # one inner epoch is on-policy: the ratio is exactly 1, and the first step starts at the reference
    _, one = _run(3, kl_coef=0.1)
    assert all(e["ratio_mean"] == pytest.approx(1.0) for e in one["history"])
    assert one["history"][0]["kl"] == pytest.approx(0.0, abs=1e-6)


def test_kl_to_the_teacher_is_the_penalty_to_the_given_model(monkeypatch):
    """``kl_reference: teacher``: the k3 penalty is to the given model. A teacher equal to the start
    gives the history of the usual penalty to the start; another teacher gives the k3 of
    KL(policy || teacher) on the policy's samples, computed here from the logged tokens."""
    import kdlab.engine.rlvr as rlvr

    kw = dict(kl_coef=0.5, inner_epochs=1)
    _, start = _run(3, **kw)

    def with_reference(teacher, **k):
        task = DigitTask()
        pool = ProblemPool(task, "train", 32, seed=0)
        model = build_model("llama", "nano", seed=0)
        cfg = RLVRConfig(steps=3, prompts_per_step=4, group_size=4, lr=1e-2, seed=3, kl_reference="teacher", **kw)
        test = task.problems("test", 4)
        return grpo_train(model, task, cfg, pool, eval_fn=lambda m: accuracy(m, task, test), eval_every=2,
                          progress=False, reference=teacher, **k)

    same = with_reference(build_model("llama", "nano", seed=0).to(torch.bfloat16))  # the start as GRPO holds it
    assert same["history"] == start["history"]
    seen = []
    real = rlvr.grpo_loss
    monkeypatch.setattr(rlvr, "grpo_loss", lambda logp_new, logp_old, adv, mask, **k: seen.append(
        (logp_new.detach(), k["logp_ref"], mask)) or real(logp_new, logp_old, adv, mask, **k))
    other = with_reference(build_model("llama", "nano", seed=5))
    lp, lr_, mask = seen[0]
    d = (lr_ - lp)[mask]
    k3 = float((d.exp() - 1 - d).mean())
    assert other["history"][0]["kl"] == pytest.approx(k3, rel=1e-4) and k3 > 1e-3
    with pytest.raises(ValueError, match="needs the teacher model"):
        with_reference(None)


def test_grpo_on_bf16_parameters_computes_in_fp32_on_a_cpu_and_updates_them_in_bf16(monkeypatch):
    """As distillation: the parameters and their update stay bf16 (no master copy), while sampling,
    the log-probs, the backward and the evaluation run on an fp32 copy reloaded after every update
    (``compute_dtype`` auto on a CPU; bf16 matmuls are 35x slower than fp32 on an avx2-only CPU).
    The bf16 arithmetic (``compute_dtype: bf16``) samples and scores the bf16 model itself; the two
    agree on the first step's sampled batch to bf16 precision."""
    from kdlab.engine import rlvr

    seen = []
    real_sample = rlvr.sample
    monkeypatch.setattr(rlvr, "sample", lambda m, *a, **k: seen.append(next(m.parameters()).dtype) or real_sample(m, *a, **k))
    m32, a = _run(3, inner_epochs=2)
    assert set(seen) == {torch.float32} and next(m32.parameters()).dtype == torch.bfloat16
    seen.clear()
    m16, b = _run(3, inner_epochs=2, compute_dtype="bf16")
    assert set(seen) == {torch.bfloat16} and next(m16.parameters()).dtype == torch.bfloat16
    assert a["history"][0]["reward_mean"] == b["history"][0]["reward_mean"]
    assert a["history"][0]["loss"] == pytest.approx(b["history"][0]["loss"], rel=0.05, abs=1e-3)
    # the update reached the bf16 parameters: they moved from the start
    start = build_model("llama", "nano", seed=0).to(torch.bfloat16)
    assert any(not torch.equal(x, y) for x, y in zip(m32.parameters(), start.parameters()))


def test_grpo_raises_the_verifiable_reward():
    task = DigitTask()
    pool = ProblemPool(task, "train", 32, seed=0)
    model = build_model("llama", "nano", seed=0)
    cfg = RLVRConfig(steps=20, prompts_per_step=8, group_size=8, lr=1e-2, dtype="fp32")
    h = grpo_train(model, task, cfg, pool, progress=False)["history"]
    first = sum(e["reward_mean"] for e in h[:3]) / 3
    last = sum(e["reward_mean"] for e in h[-3:]) / 3
    assert first < 0.3 and last > 0.8


def test_divergence_is_recorded_not_raised():
    _, res = _run(0, force_lr=1e30, grad_clip=None, dtype="fp32")
    assert res["nan"] and res["collapsed"] and res["collapse_step"] == res["history"][-1]["step"]
    assert res["final_accuracy"] is None


@pytest.mark.parametrize("field,value", [("steps", 0), ("group_size", 0), ("lr", 0.0), ("dtype", "fp16"),
                                         ("clip_eps", 0.0), ("kl_coef", -1.0), ("normalisation", "batch")])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        RLVRConfig(**{field: value})


# --------------------------------------------------------------------------------------------
# collapse detector
# --------------------------------------------------------------------------------------------
def _hist(rewards, start=0):
    return [{"step": start + i, "reward_mean": r, "loss": 0.0} for i, r in enumerate(rewards)]


def test_collapse_detector_flags_a_sustained_drop():
    # window 3: moving averages from entry 2; at entry 10 MA = 0.6 (drop 0.2 <= 0.3), at 11 MA = 0.4
    # (drop 0.4), and 12, 13 stay at 0.2: three entries in a row -> collapse starts at entry 11.
    h = _hist([0.8] * 10 + [0.2] * 10, start=100)
    assert detect_collapse(h, window=3, drop=0.3) == (True, 111)
    assert detect_collapse(h, window=3, drop=0.7) == (False, None)


def test_collapse_detector_ignores_a_short_dip_and_steady_runs():
    dip = _hist([0.8] * 10 + [0.2] * 2 + [0.8] * 10)  # MA below by > 0.3 only at entries 11, 12
    assert detect_collapse(dip, window=3, drop=0.3) == (False, None)
    rising = _hist([i / 30 for i in range(30)])
    assert detect_collapse(rising, window=5, drop=0.01) == (False, None)
    assert detect_collapse([], window=5, drop=0.1) == (False, None)


def test_collapse_detector_flags_nan():
    h = _hist([0.5] * 5 + [float("nan")] + [0.5] * 3)
    assert detect_collapse(h, window=3, drop=0.3) == (True, 5)
    h = _hist([0.5] * 6)
    h[4]["loss"] = float("inf")
    assert detect_collapse(h, window=3, drop=0.3) == (True, 4)
    h = _hist([0.5] * 6)
    h[2]["nan"] = True
    assert detect_collapse(h, window=3, drop=0.3) == (True, 2)


@pytest.mark.parametrize("window,drop", [(0, 0.1), (2.5, 0.1), (3, -0.1)])
def test_collapse_detector_rejects_bad_arguments(window, drop):
    with pytest.raises(ValueError):
        detect_collapse(_hist([0.1] * 4), window=window, drop=drop)


def test_a_flat_batch_skips_the_backward_and_leaves_the_run_bitwise_unchanged(monkeypatch):
    """A step whose every group has equal rewards has no gradient (no KL term): GRPO steps the
    optimiser on zeros without a forward or backward. Rewards zeroed on every other step: the skip
    and the full computation (``flat_batch`` forced False) end with bitwise equal parameters and
    the same history, and the skip scores no log-probs on its flat steps."""
    import kdlab.engine.rlvr as rlvr

    real_rewards, real_logprobs = rlvr.verifiable_rewards, rlvr._sequence_logprobs
    calls = {"rewards": 0, "logprobs": 0}

    def some_flat(task, problems, texts):
        calls["rewards"] += 1
        r = real_rewards(task, problems, texts)
        return r * 0 if calls["rewards"] % 2 == 0 else r

    def counted(*a, **k):
        calls["logprobs"] += 1
        return real_logprobs(*a, **k)

    monkeypatch.setattr(rlvr, "verifiable_rewards", some_flat)
    monkeypatch.setattr(rlvr, "_sequence_logprobs", counted)

    def run():
        calls.update(rewards=0, logprobs=0)
        model, res = _run(3, steps=6, weight_decay=0.01)
        return model, res, calls["logprobs"]

    m_skip, skip, n_skip = run()
    monkeypatch.setattr(rlvr, "flat_batch", lambda adv, cfg: False)
    m_full, full, n_full = run()
    assert skip["flat_steps"] >= 3 and full["flat_steps"] == 0  # the zeroed steps, and any flat by itself
    assert n_skip == n_full - skip["flat_steps"]
    assert skip["history"] == full["history"]
    assert all(torch.equal(x, y) for x, y in zip(m_skip.parameters(), m_full.parameters()))
    start = build_model("llama", "nano", seed=0).to(torch.bfloat16)
    assert any(not torch.equal(x, y) for x, y in zip(m_skip.parameters(), start.parameters()))


def test_a_batch_is_flat_only_without_gradient_terms():
    zeros, some = torch.zeros(8), torch.tensor([0.0, 0.5, -0.5, 0, 0, 0, 0, 0])
    assert rlvr_flat(zeros, RLVRConfig()) and not rlvr_flat(some, RLVRConfig())
    assert not rlvr_flat(zeros, RLVRConfig(kl_coef=0.1))  # the KL term has a gradient
    assert not rlvr_flat(zeros, RLVRConfig(inner_epochs=2))  # later epochs' stats are not known exactly


def rlvr_flat(adv, cfg):
    from kdlab.engine.rlvr import flat_batch
    return flat_batch(adv, cfg)
