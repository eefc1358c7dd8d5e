"""Tests for kdlab.core.kl: full-vocabulary KL, chunked KL, generalised JSD, sampled estimators."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from kdlab.core.kl import generalized_jsd, kl_loss, sampled_kl, token_kl, token_kl_chunked, token_kls


def _logits(*shape: int, seed: int = 0, scale: float = 2.0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


# ---------------------------------------------------------------- brute-force references (math)


def _softmax_list(row: list[float], temperature: float = 1.0) -> list[float]:
    z = [x / temperature for x in row]
    top = max(z)
    e = [math.exp(x - top) for x in z]
    s = sum(e)
    return [x / s for x in e]


def _kl_list(p: list[float], q: list[float]) -> float:
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0)


def _brute_token_kl(s: torch.Tensor, t: torch.Tensor, direction: str, temperature=1.0):
    out = torch.zeros(s.shape[:-1], dtype=torch.float64)
    for idx in itertools.product(*(range(n) for n in s.shape[:-1])):
        p_s = _softmax_list(s[idx].tolist(), temperature)
        p_t = _softmax_list(t[idx].tolist(), temperature)
        out[idx] = _kl_list(p_t, p_s) if direction == "forward" else _kl_list(p_s, p_t)
    return out


def _brute_jsd(s: torch.Tensor, t: torch.Tensor, beta: float):
    out = torch.zeros(s.shape[:-1], dtype=torch.float64)
    for idx in itertools.product(*(range(n) for n in s.shape[:-1])):
        p_s = _softmax_list(s[idx].tolist())
        p_t = _softmax_list(t[idx].tolist())
        m = [beta * a + (1 - beta) * b for a, b in zip(p_t, p_s)]
        raw = beta * _kl_list(p_t, m) + (1 - beta) * _kl_list(p_s, m)
        out[idx] = raw / (beta * (1 - beta))
    return out


# ---------------------------------------------------------------- token_kl


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_token_kl_matches_bruteforce(direction, temperature):
    s, t = _logits(2, 3, 7, seed=1), _logits(2, 3, 7, seed=2)
    got = token_kl(s, t, direction, temperature=temperature)
    assert got.shape == (2, 3) and got.dtype == torch.float32
    ref = _brute_token_kl(s.double(), t.double(), direction, temperature)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_token_kl_matches_f_kl_div_argument_order():
    s, t = _logits(3, 4, 11, seed=3), _logits(3, 4, 11, seed=4)
    ls, lt = F.log_softmax(s, -1), F.log_softmax(t, -1)
    # F.kl_div(input, target) = KL(target || exp(input)).
    fwd = F.kl_div(ls, lt, reduction="none", log_target=True).sum(-1)
    rev = F.kl_div(lt, ls, reduction="none", log_target=True).sum(-1)
    torch.testing.assert_close(token_kl(s, t, "forward"), fwd)
    torch.testing.assert_close(token_kl(s, t, "reverse"), rev)


def test_non_negative_zero_iff_equal_and_asymmetric():
    s, t = _logits(4, 5, 9, seed=5), _logits(4, 5, 9, seed=6)
    for direction in ("forward", "reverse"):
        kl = token_kl(s, t, direction)
        assert (kl > 0).all()
        assert torch.equal(token_kl(s, s.clone(), direction), torch.zeros(4, 5))
        # Softmax is shift invariant: shifted logits are the same distribution.
        assert token_kl(s, s + 3.0, direction).abs().max() < 1e-5
    assert (token_kl(s, t, "forward") - token_kl(s, t, "reverse")).abs().max() > 1e-2
    # Hand-made asymmetric pair: KL(T||S) != KL(S||T).
    p_s = torch.tensor([[[0.9, 0.05, 0.05]]]).log()
    p_t = torch.tensor([[[0.4, 0.3, 0.3]]]).log()
    fwd = _kl_list([0.4, 0.3, 0.3], [0.9, 0.05, 0.05])
    rev = _kl_list([0.9, 0.05, 0.05], [0.4, 0.3, 0.3])
    assert token_kl(p_s, p_t, "forward").item() == pytest.approx(fwd, rel=1e-5)
    assert token_kl(p_s, p_t, "reverse").item() == pytest.approx(rev, rel=1e-5)


@pytest.mark.parametrize("fn", [token_kl, token_kl_chunked])
def test_mask_zeroes_values_and_gradients(fn):
    s = _logits(2, 4, 6, seed=7).requires_grad_()
    t = _logits(2, 4, 6, seed=8)
    mask = torch.tensor([[True, False, True, False], [False, False, True, True]])
    kl = fn(s, t, "reverse", mask=mask)
    assert (kl[~mask] == 0).all() and (kl[mask] > 0).all()
    kl.sum().backward()
    assert (s.grad[~mask] == 0).all()
    assert (s.grad[mask].abs().sum(-1) > 0).all()


def test_bf16_inputs_give_float32_outputs():
    s32, t32 = _logits(2, 3, 50, seed=9), _logits(2, 3, 50, seed=10)
    s16, t16 = s32.bfloat16(), t32.bfloat16()
    for direction in ("forward", "reverse"):
        got = token_kl(s16, t16, direction)
        assert got.dtype == torch.float32
        # Same as an fp32 computation on the values bf16 actually stores ...
        torch.testing.assert_close(got, token_kl(s16.float(), t16.float(), direction))
        # ... and close to the fp32 logits they came from.
        torch.testing.assert_close(got, token_kl(s32, t32, direction), rtol=3e-2, atol=1e-2)
        chunked = token_kl_chunked(s16, t16, direction, chunk_size=2)
        assert chunked.dtype == torch.float32
        torch.testing.assert_close(chunked, got, rtol=1e-5, atol=1e-6)
    # Mixed dtypes (bf16 student, fp32 teacher) also work.
    assert token_kl(s16, t32, "forward").dtype == torch.float32


@pytest.mark.parametrize("fn", [token_kl, token_kl_chunked])
def test_extreme_logits_finite(fn):
    v = 8
    s = torch.full((1, 2, v), -1e4)
    t = torch.full((1, 2, v), -1e4)
    s[..., 1] = 1e4
    t[..., 0] = 1e4
    s.requires_grad_()
    for direction in ("forward", "reverse"):
        kl = fn(s, t, direction)
        assert torch.isfinite(kl).all()
        # One-hot vs one-hot at distance 2e4 in log-space: KL = 2e4 nats either way.
        torch.testing.assert_close(kl, torch.full((1, 2), 2e4), rtol=1e-6, atol=0)
        (grad,) = torch.autograd.grad(kl.sum(), s)
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("temperature", [1.0, 2.5])
@pytest.mark.parametrize("fn", [token_kl, token_kl_chunked])
def test_gradients_match_closed_forms(fn, temperature):
    s = _logits(2, 3, 10, seed=11, dtype=torch.float64).float().requires_grad_()
    t = _logits(2, 3, 10, seed=12).float()
    p_s = torch.softmax(s.detach() / temperature, -1)
    p_t = torch.softmax(t / temperature, -1)

    (g_fwd,) = torch.autograd.grad(fn(s, t, "forward", temperature=temperature).sum(), s)
    torch.testing.assert_close(g_fwd, (p_s - p_t) / temperature, rtol=1e-5, atol=1e-6)

    rkl = token_kl(s.detach(), t, "reverse", temperature=temperature).unsqueeze(-1)
    closed = p_s * (p_s.log() - p_t.log() - rkl) / temperature
    (g_rev,) = torch.autograd.grad(fn(s, t, "reverse", temperature=temperature).sum(), s)
    torch.testing.assert_close(g_rev, closed, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [token_kl, token_kl_chunked])
def test_teacher_gets_gradient_only_if_not_detached(fn):
    s = _logits(1, 2, 5, seed=13).requires_grad_()
    t = _logits(1, 2, 5, seed=14).requires_grad_()
    g_s, g_t = torch.autograd.grad(fn(s, t, "forward").sum(), (s, t))
    p_s, p_t = torch.softmax(s.detach(), -1), torch.softmax(t.detach(), -1)
    fkl = token_kl(s.detach(), t.detach(), "forward").unsqueeze(-1)
    torch.testing.assert_close(g_t, p_t * (p_t.log() - p_s.log() - fkl), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_s, p_s - p_t, rtol=1e-5, atol=1e-6)
    out = fn(s, t.detach(), "forward")
    out.sum().backward()
    assert t.grad is None and s.grad is not None


# ---------------------------------------------------------------- chunked


@pytest.mark.parametrize("chunk_size", [1, 3, 5, 1000])
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("use_mask", [False, True])
def test_chunked_equals_unchunked(chunk_size, direction, use_mask):
    s0, t0 = _logits(3, 5, 13, seed=15), _logits(3, 5, 13, seed=16)
    mask = (torch.arange(15).reshape(3, 5) % 3 != 1) if use_mask else None
    weights = _logits(3, 5, seed=17)  # a non-trivial upstream gradient
    results = []
    for fn, kwargs in ((token_kl, {}), (token_kl_chunked, {"chunk_size": chunk_size})):
        s, t = s0.clone().requires_grad_(), t0.clone().requires_grad_()
        kl = fn(s, t, direction, mask=mask, temperature=1.3, **kwargs)
        grads = torch.autograd.grad((kl * weights).sum(), (s, t))
        results.append((kl, *grads))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_chunked_bf16_gradient_dtype():
    s = _logits(2, 3, 17, seed=18).bfloat16().requires_grad_()
    t = _logits(2, 3, 17, seed=19).bfloat16()
    (g_c,) = torch.autograd.grad(token_kl_chunked(s, t, "reverse", chunk_size=2).sum(), s)
    (g_u,) = torch.autograd.grad(token_kl(s, t, "reverse").sum(), s)
    assert g_c.dtype == torch.bfloat16
    torch.testing.assert_close(g_c.float(), g_u.float(), rtol=1e-2, atol=1e-3)


def _saved_tensors(fn, s, t):
    saved = []

    def pack(x):
        saved.append((x.dtype, x.numel()))
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        fn(s, t, "forward")
    return saved


def test_chunked_keeps_no_full_float32_intermediates():
    n, v = 6, 257
    s = _logits(2, 3, v, seed=20).bfloat16().requires_grad_()
    t = _logits(2, 3, v, seed=21).bfloat16()
    big_fp32 = lambda saved: [x for x in saved if x[0] == torch.float32 and x[1] >= n * v]  # noqa: E731
    # The plain version keeps float32 log-softmax outputs for backward; the chunked one does not.
    assert big_fp32(_saved_tensors(token_kl, s, t))
    saved = _saved_tensors(lambda *a: token_kl_chunked(*a, chunk_size=2), s, t)
    assert not big_fp32(saved)
    assert sum(numel for _, numel in saved) <= 2 * n * v  # just the two bf16 inputs


def test_chunked_gradcheck_double():
    s = _logits(2, 2, 5, seed=22, dtype=torch.float64).requires_grad_()
    t = _logits(2, 2, 5, seed=23, dtype=torch.float64).requires_grad_()
    mask = torch.tensor([[True, False], [True, True]])
    for direction in ("forward", "reverse"):
        assert torch.autograd.gradcheck(
            lambda a, b: token_kl_chunked(a, b, direction, mask=mask, temperature=0.7, chunk_size=2),
            (s, t),
        )


# ---------------------------------------------------------------- validation


def test_invalid_arguments():
    s, t = _logits(2, 3, 4), _logits(2, 3, 4, seed=1)
    with pytest.raises(ValueError, match="direction") as err:
        token_kl(s, t, "sideways")
    assert all(word in str(err.value) for word in ("'sideways'", "forward", "reverse"))
    with pytest.raises(ValueError, match="same shape"):
        token_kl(s, t[..., :3], "forward")
    with pytest.raises(ValueError, match="same shape"):
        token_kl_chunked(s, t[:1], "forward")
    with pytest.raises(ValueError, match="mask"):
        token_kl(s, t, "forward", mask=torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="mask"):
        token_kl(s, t, "forward", mask=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="temperature"):
        token_kl(s, t, "forward", temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_kl_chunked(s, t, "forward", chunk_size=0)
    with pytest.raises(ValueError, match="direction"):
        token_kl_chunked(s, t, "both")
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(s, t, 1.5)


# ---------------------------------------------------------------- generalised JSD


@pytest.mark.parametrize("beta", [1e-4, 0.1, 0.3, 0.5, 0.9, 1 - 1e-4])
def test_jsd_matches_bruteforce(beta):
    s, t = _logits(2, 3, 7, seed=24), _logits(2, 3, 7, seed=25)
    got = generalized_jsd(s, t, beta)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _brute_jsd(s.double(), t.double(), beta), rtol=1e-4, atol=1e-5)


def test_jsd_endpoints_and_continuity():
    s, t = _logits(3, 4, 12, seed=26, scale=1.0), _logits(3, 4, 12, seed=27, scale=1.0)
    fwd, rev = token_kl(s, t, "forward"), token_kl(s, t, "reverse")
    assert torch.equal(generalized_jsd(s, t, 0.0), fwd)
    assert torch.equal(generalized_jsd(s, t, 1.0), rev)
    assert torch.equal(generalized_jsd(s, t, 0), fwd)
    torch.testing.assert_close(generalized_jsd(s, t, 1e-4), fwd, rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(generalized_jsd(s, t, 1 - 1e-4), rev, rtol=2e-3, atol=1e-4)
    # The gap closes as beta approaches the end: it is O(beta).
    gap_far = (generalized_jsd(s, t, 1e-2) - fwd).abs().max()
    gap_near = (generalized_jsd(s, t, 1e-4) - fwd).abs().max()
    assert gap_near < gap_far / 20


def test_jsd_properties():
    s, t = _logits(3, 4, 12, seed=28), _logits(3, 4, 12, seed=29)
    for beta in (0.2, 0.5, 0.8):
        assert (generalized_jsd(s, t, beta) > 0).all()
        assert generalized_jsd(s, s.clone(), beta).abs().max() < 1e-6
    # beta = 0.5 is symmetric; swapping the models maps beta to 1 - beta.
    torch.testing.assert_close(generalized_jsd(s, t, 0.5), generalized_jsd(t, s, 0.5))
    torch.testing.assert_close(generalized_jsd(s, t, 0.3), generalized_jsd(t, s, 0.7))
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[0, 1] = True
    out = generalized_jsd(s, t, 0.4, mask=mask)
    assert (out[~mask] == 0).all() and out[0, 1] > 0


def test_jsd_extreme_logits_and_gradients():
    s = torch.full((1, 1, 6), -1e4)
    s[..., 2] = 1e4
    t = torch.full((1, 1, 6), 1e4)
    t[..., 2] = -1e4
    s.requires_grad_()
    for beta in (1e-6, 0.3, 0.999999):
        val = generalized_jsd(s, t, beta)
        assert torch.isfinite(val).all() and (val > 0).all()
        (grad,) = torch.autograd.grad(val.sum(), s)
        assert torch.isfinite(grad).all()
    # Gradient at an interior beta agrees with a float64 autograd of the naive formula.
    s2 = _logits(1, 2, 6, seed=30, dtype=torch.float64)
    t2 = _logits(1, 2, 6, seed=31, dtype=torch.float64)

    def naive(a, b, beta):
        p_s, p_t = torch.softmax(a, -1), torch.softmax(b, -1)
        m = beta * p_t + (1 - beta) * p_s
        kl = lambda p, q: (p * (p.log() - q.log())).sum(-1)  # noqa: E731
        return (beta * kl(p_t, m) + (1 - beta) * kl(p_s, m)) / (beta * (1 - beta))

    for beta in (1e-3, 0.35, 0.999):
        a = s2.float().requires_grad_()
        (g,) = torch.autograd.grad(generalized_jsd(a, t2.float(), beta).sum(), a)
        a64 = s2.clone().requires_grad_()
        (g64,) = torch.autograd.grad(naive(a64, t2, beta).sum(), a64)
        torch.testing.assert_close(g.double(), g64, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- sampled estimators


def _pair(v=6, seed=32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    s = scale * torch.randn(v, generator=g, dtype=torch.float64)
    t = scale * torch.randn(v, generator=g, dtype=torch.float64)
    return F.log_softmax(s, -1), F.log_softmax(t, -1)


def _exact_expectation(log_s, log_t, estimator, direction):
    """E_{x ~ p}[k(x)] by enumeration, p the sampling model of the direction."""
    vals = sampled_kl(log_s[None], log_t[None], estimator, direction)[0]
    p = (log_s if direction == "reverse" else log_t).exp()
    return float((p * vals).sum())


def _true_kl(log_s, log_t, direction):
    log_p, log_q = (log_s, log_t) if direction == "reverse" else (log_t, log_s)
    return float((log_p.exp() * (log_p - log_q)).sum())


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_sampled_estimators_exact_expectations(direction):
    log_s, log_t = _pair(scale=2.0)
    kl = _true_kl(log_s, log_t, direction)
    assert _exact_expectation(log_s, log_t, "k1", direction) == pytest.approx(kl, rel=1e-10)
    assert _exact_expectation(log_s, log_t, "k3", direction) == pytest.approx(kl, rel=1e-10)
    # k2 is biased: for a far pair its mean is measurably off.
    assert abs(_exact_expectation(log_s, log_t, "k2", direction) - kl) > 0.1 * kl


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_sampled_estimators_monte_carlo(direction):
    log_s, log_t = _pair(v=6, seed=33, scale=1.5)
    sampler = log_s if direction == "reverse" else log_t  # reverse: x ~ student
    g = torch.Generator().manual_seed(1234)
    n = 200_000
    x = torch.multinomial(sampler.exp(), n, replacement=True, generator=g)
    ls_tok, lt_tok = log_s[x].float().reshape(1, n), log_t[x].float().reshape(1, n)
    kl = _true_kl(log_s, log_t, direction)
    other = _true_kl(log_s, log_t, "forward" if direction == "reverse" else "reverse")
    assert abs(kl - other) > 0.1  # the two directions are distinguishable here
    for est in ("k1", "k3"):
        vals = sampled_kl(ls_tok, lt_tok, est, direction).double()
        se = float(vals.std()) / math.sqrt(n)
        assert abs(float(vals.mean()) - kl) < 4 * se
        assert abs(float(vals.mean()) - other) > 10 * se
    vals2 = sampled_kl(ls_tok, lt_tok, "k2", direction).double()
    se2 = float(vals2.std()) / math.sqrt(n)
    assert abs(float(vals2.mean()) - kl) > 10 * se2


def test_sampled_estimator_signs_and_variance():
    log_s, log_t = _pair(v=8, seed=34, scale=1.5)
    ls, lt = log_s[None].float(), log_t[None].float()
    k1 = sampled_kl(ls, lt, "k1", "reverse")
    k2 = sampled_kl(ls, lt, "k2", "reverse")
    k3 = sampled_kl(ls, lt, "k3", "reverse")
    assert (k1 < 0).any()  # k1 can be negative
    assert (k2 >= 0).all() and (k3 >= 0).all()
    # Closed forms with log r = log T(x) - log S(x).
    log_r = lt - ls
    torch.testing.assert_close(k1, -log_r)
    torch.testing.assert_close(k2, log_r**2 / 2)
    torch.testing.assert_close(k3, log_r.exp() - 1 - log_r)
    # Forward uses log r = log S(x) - log T(x).
    torch.testing.assert_close(sampled_kl(ls, lt, "k1", "forward"), log_r)
    p = log_s.exp()
    var = lambda k: float((p * (k[0].double() - (p * k[0].double()).sum()) ** 2).sum())  # noqa: E731
    assert var(k3) < var(k1)
    big = torch.tensor([[-30.0, 0.0]]), torch.tensor([[0.0, -30.0]])
    assert (sampled_kl(*big, "k3", "reverse") >= 0).all()
    mask = torch.tensor([[True, False]])
    assert sampled_kl(*big, "k1", "reverse", mask=mask)[0, 1] == 0


def test_sampled_expected_gradients_documented():
    z_s = torch.randn(7, generator=torch.Generator().manual_seed(35), dtype=torch.float64)
    z_t = torch.randn(7, generator=torch.Generator().manual_seed(36), dtype=torch.float64)

    def expected_grad(est):
        z = z_s.clone().requires_grad_()
        ls, lt = F.log_softmax(z, -1), F.log_softmax(z_t, -1)
        vals = sampled_kl(ls[None], lt[None], est, "reverse")[0]
        (g,) = torch.autograd.grad((ls.exp().detach() * vals).sum(), z)
        return g

    def kl_grad(direction):
        z = z_s.clone().requires_grad_()
        (g,) = torch.autograd.grad(token_kl(z[None], z_t[None], direction).sum(), z)
        return g

    torch.testing.assert_close(expected_grad("k1"), torch.zeros(7, dtype=torch.float64))
    torch.testing.assert_close(expected_grad("k2"), kl_grad("reverse"))
    torch.testing.assert_close(expected_grad("k3"), kl_grad("forward"))


def test_sampled_invalid_arguments():
    a = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="estimator.*'k4'"):
        sampled_kl(a, a, "k4", "reverse")
    with pytest.raises(ValueError, match="direction.*'up'"):
        sampled_kl(a, a, "k1", "up")
    with pytest.raises(ValueError, match="same shape"):
        sampled_kl(a, a[:, :2], "k1", "reverse")


# ---------------------------------------------------------------- kl_loss


def test_kl_loss_dispatch_and_masked_mean():
    s = _logits(2, 4, 9, seed=37).requires_grad_()
    t = _logits(2, 4, 9, seed=38)
    mask = torch.tensor([[True, True, False, False], [True, False, False, False]])
    for kind in ("forward", "reverse"):
        ref = token_kl(s, t, kind)[mask].mean()
        torch.testing.assert_close(kl_loss(s, t, kind, mask), ref)
        torch.testing.assert_close(kl_loss(s, t, kind, mask, chunk_size=2), ref)
        torch.testing.assert_close(kl_loss(s, t, kind), token_kl(s, t, kind).mean())
    torch.testing.assert_close(
        kl_loss(s, t, "jsd", mask, beta=0.3), generalized_jsd(s, t, 0.3)[mask].mean()
    )
    tokens = torch.randint(0, 9, (2, 4), generator=torch.Generator().manual_seed(0))
    ls = F.log_softmax(s / 2.0, -1).gather(-1, tokens[..., None])[..., 0]
    lt = F.log_softmax(t / 2.0, -1).gather(-1, tokens[..., None])[..., 0]
    for kind in ("k1", "k2", "k3"):
        for direction in ("forward", "reverse"):
            ref = sampled_kl(ls, lt, kind, direction)[mask].mean()
            got = kl_loss(s, t, kind, mask, temperature=2.0, tokens=tokens, sample_direction=direction)
            torch.testing.assert_close(got, ref)
    loss = kl_loss(s, t, "reverse", mask)
    assert loss.dim() == 0 and loss.dtype == torch.float32
    loss.backward()
    assert (s.grad[~mask] == 0).all()
    empty = kl_loss(s, t, "forward", torch.zeros(2, 4, dtype=torch.bool))
    assert empty.item() == 0.0


def test_kl_loss_invalid_arguments():
    s, t = _logits(2, 3, 5), _logits(2, 3, 5, seed=1)
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"kind.*'kl'"):
        kl_loss(s, t, "kl")
    with pytest.raises(ValueError, match="beta"):
        kl_loss(s, t, "jsd")
    with pytest.raises(ValueError, match="tokens"):
        kl_loss(s, t, "k3", sample_direction="reverse")
    with pytest.raises(ValueError, match="sample_direction"):
        kl_loss(s, t, "k3", tokens=tokens)
    with pytest.raises(ValueError, match="sample_direction.*'student'"):
        kl_loss(s, t, "k3", tokens=tokens, sample_direction="student")
    with pytest.raises(ValueError, match="tokens"):
        kl_loss(s, t, "k1", tokens=tokens + 5, sample_direction="reverse")
    with pytest.raises(ValueError, match="tokens"):
        kl_loss(s, t, "k1", tokens=tokens.float(), sample_direction="reverse")
    with pytest.raises(ValueError, match="tokens"):
        kl_loss(s, t, "k1", tokens=tokens[:, :2], sample_direction="reverse")


# ---------------------------------------------------------------------------------------------
# the paper's sampled KL: one extra token per position, score-function surrogate
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_score_function_kl_is_unbiased_for_the_kl_and_its_gradient(direction, temperature):
    """Monte Carlo on tiny random logits: the mean of the per-token values is the exact KL and the
    mean student gradient of the surrogate is the exact KL's gradient (forward: teacher samples;
    reverse: student samples, the score-function term carries the gradient)."""
    from kdlab.core.kl import draw_tokens, score_function_kl

    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    t = torch.randn(2, 3, 5, generator=g, dtype=torch.float64) * 1.5
    n = 40_000
    s_rep = s.clone().requires_grad_(True)
    big_s, big_t = s_rep.expand(n, *s.shape), t.expand(n, *t.shape)
    sampler = big_t if direction == "forward" else big_s
    x = draw_tokens(sampler, generator=torch.Generator().manual_seed(1), temperature=temperature)
    assert x.shape == (n, 2, 3) and x.dtype == torch.long
    values = score_function_kl(big_s, big_t, x, direction, temperature=temperature)  # (n, 2, 3)
    values.sum().div(n).backward()
    s_ex = s.clone().requires_grad_(True)
    exact = token_kl(s_ex, t, direction, temperature=temperature)
    exact.sum().backward()
    assert torch.allclose(values.detach().mean(0), exact.detach(), atol=0.05)
    assert torch.allclose(s_rep.grad, s_ex.grad, atol=0.03), (s_rep.grad - s_ex.grad).abs().max()
    # the teacher's logits get no gradient from the surrogate when detached, and a mask zeroes a position
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask[0, 1] = False
    s2 = s.clone().requires_grad_(True)
    xs = draw_tokens(t if direction == "forward" else s, generator=torch.Generator().manual_seed(2))
    v = score_function_kl(s2, t, xs, direction, mask)
    v.sum().backward()
    assert v[0, 1] == 0 and torch.all(s2.grad[0, 1] == 0)


def test_score_function_kl_through_kl_loss_and_invalid_arguments():
    from kdlab.core.schema import LOSS_KINDS, SAMPLED_KINDS
    from kdlab.core.kl import draw_tokens, score_function_kl

    assert "sf" in LOSS_KINDS and "sf" in SAMPLED_KINDS
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 4, 7, generator=g), torch.randn(2, 4, 7, generator=g)
    x = draw_tokens(t, generator=g)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    loss = kl_loss(s, t, "sf", mask, samples=x, sample_direction="forward")
    ref = score_function_kl(s, t, x, "forward", mask)
    assert torch.allclose(loss, ref.sum() / 6)
    # value of the reverse estimator: log p_S(x) - log p_T(x) at the drawn tokens
    r = score_function_kl(s, t, x, "reverse")
    ls, lt = F.log_softmax(s, -1).gather(-1, x[..., None])[..., 0], F.log_softmax(t, -1).gather(-1, x[..., None])[..., 0]
    assert torch.allclose(r, ls - lt, atol=1e-6)
    with pytest.raises(ValueError, match="samples"):
        kl_loss(s, t, "sf", mask, sample_direction="forward")
    with pytest.raises(ValueError, match="sample_direction"):
        kl_loss(s, t, "sf", mask, samples=x)
    with pytest.raises(ValueError, match="samples must have shape"):
        score_function_kl(s, t, x[:, :2], "forward")
    with pytest.raises(ValueError, match="ids in"):
        score_function_kl(s, t, x + 7, "forward")


@pytest.mark.parametrize("temperature", [1.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_token_kls_is_token_kl_in_both_directions(temperature, dtype):
    g = torch.Generator().manual_seed(3)
    s = (torch.randn(3, 5, 11, generator=g) * 3).to(dtype)
    t = (torch.randn(3, 5, 11, generator=g) * 3).to(dtype)
    mask = torch.rand(3, 5, generator=g) > 0.3
    fwd, rev = token_kls(s, t, mask, temperature)
    torch.testing.assert_close(fwd, token_kl(s, t, "forward", mask, temperature), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rev, token_kl(s, t, "reverse", mask, temperature), rtol=1e-6, atol=1e-6)
    ref = _brute_token_kl(s.double(), t.double(), "forward", temperature)
    torch.testing.assert_close(fwd.double(), torch.where(mask, ref, 0.0), rtol=1e-4, atol=1e-5)
    assert fwd.dtype == rev.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
