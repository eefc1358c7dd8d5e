"""Tests for kdlab.core.mixture.mixture_logprobs (the lambda spectrum of rollout policies)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kdlab.core.mixture import mixture_logprobs


def _logits(*shape: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=g)


def _brute_mixture(s_row: list[float], t_row: list[float], lam: float) -> list[float]:
    """pi_lambda by hand in float64: p_S^a p_T^(1-a) / Z with a = (1 + lam) / 2."""

    def softmax(row):
        top = max(row)
        e = [math.exp(x - top) for x in row]
        return [x / sum(e) for x in e]

    a = (1 + lam) / 2
    w = [ps**a * pt ** (1 - a) for ps, pt in zip(softmax(s_row), softmax(t_row))]
    return [x / sum(w) for x in w]


def test_exact_endpoints():
    s, t = _logits(2, 3, 11, seed=0), _logits(2, 3, 11, seed=1)
    assert torch.equal(mixture_logprobs(s, t, -1.0), F.log_softmax(t, -1))
    assert torch.equal(mixture_logprobs(s, t, 1.0), F.log_softmax(s, -1))
    assert torch.equal(mixture_logprobs(s, t, -1), F.log_softmax(t, -1))
    # The safeguards are bypassed at the pure policies (documented).
    assert torch.equal(
        mixture_logprobs(s, t, 1.0, logratio_clip=0.1, plausibility_alpha=0.5), F.log_softmax(s, -1)
    )
    assert torch.equal(
        mixture_logprobs(s, t, -1.0, logratio_clip=0.1, plausibility_alpha=0.5), F.log_softmax(t, -1)
    )


def test_lambda_zero_is_normalised_geometric_mean():
    s, t = _logits(3, 9, seed=2), _logits(3, 9, seed=3)
    got = mixture_logprobs(s, t, 0.0).exp().double()
    p_s, p_t = torch.softmax(s.double(), -1), torch.softmax(t.double(), -1)
    geo = (p_s * p_t).sqrt()
    torch.testing.assert_close(got, geo / geo.sum(-1, keepdim=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("lam", [-2.5, -0.6, 0.4, 0.9, 1.5, 3.0])
def test_matches_bruteforce_and_is_normalised(lam):
    s, t = _logits(2, 7, seed=4), _logits(2, 7, seed=5)
    got = mixture_logprobs(s, t, lam)
    assert got.dtype == torch.float32 and got.shape == (2, 7)
    torch.testing.assert_close(torch.logsumexp(got, -1), torch.zeros(2), atol=1e-6, rtol=0)
    for i in range(2):
        ref = torch.tensor(_brute_mixture(s[i].tolist(), t[i].tolist(), lam), dtype=torch.float64)
        torch.testing.assert_close(got[i].exp().double(), ref, rtol=1e-4, atol=1e-7)


def test_extrapolation_moves_mass_towards_student_favoured_tokens():
    s, t = _logits(4, 12, seed=6), _logits(4, 12, seed=7)
    p_s, p_t = torch.softmax(s, -1), torch.softmax(t, -1)
    favoured = p_s > p_t
    student_mass = (p_s * favoured).sum(-1)
    prev = student_mass
    for lam in (1.5, 2.0, 3.0):
        pi = mixture_logprobs(s, t, lam).exp()
        mass = (pi * favoured).sum(-1)
        assert (mass > student_mass).all()
        assert (mass >= prev - 1e-6).all()  # monotone along the spectrum
        prev = mass
        # The token with the largest p_S / p_T gains probability relative to the student.
        top = (p_s.log() - p_t.log()).argmax(-1, keepdim=True)
        assert (pi.gather(-1, top) > p_s.gather(-1, top)).all()
    # Symmetrically lam < -1 goes beyond the teacher.
    pi = mixture_logprobs(s, t, -2.0).exp()
    teacher_mass = (p_t * ~favoured).sum(-1)
    assert ((pi * ~favoured).sum(-1) > teacher_mass).all()


@pytest.mark.parametrize("lam", [0.3, 2.0, 4.0, -3.0])
def test_logratio_clip_bounds_the_effect(lam):
    s, t = _logits(3, 15, seed=8, scale=4.0), _logits(3, 15, seed=9, scale=4.0)
    clip = 0.5
    a = (1 + lam) / 2
    log_pi = mixture_logprobs(s, t, lam, logratio_clip=clip)
    torch.testing.assert_close(torch.logsumexp(log_pi, -1), torch.zeros(3), atol=1e-5, rtol=0)
    shift = log_pi - F.log_softmax(t, -1)  # log(pi / p_T): a constant plus a * clipped log-ratio
    spread = shift.amax(-1) - shift.amin(-1)
    assert (spread <= 2 * abs(a) * clip + 1e-4).all()
    unclipped = mixture_logprobs(s, t, lam) - F.log_softmax(t, -1)
    assert ((unclipped.amax(-1) - unclipped.amin(-1)) > 2 * abs(a) * clip + 1).all()
    # A bound larger than every |log-ratio| changes nothing.
    torch.testing.assert_close(
        mixture_logprobs(s, t, lam, logratio_clip=1e3), mixture_logprobs(s, t, lam), rtol=1e-5, atol=1e-5
    )


def test_plausibility_mask_hand_made():
    p_s = torch.tensor([0.60, 0.25, 0.10, 0.04, 0.01])
    p_t = torch.tensor([0.10, 0.50, 0.30, 0.05, 0.05])
    # alpha = 0.4: student keeps p_S >= 0.24 -> {0, 1}; teacher keeps p_T >= 0.2 -> {1, 2}.
    for lam in (0.0, 2.0):
        log_pi = mixture_logprobs(p_s.log(), p_t.log(), lam, plausibility_alpha=0.4)
        assert torch.isneginf(log_pi[3:]).all()
        assert torch.isfinite(log_pi[:3]).all()
        a = (1 + lam) / 2
        w = p_s[:3].double() ** a * p_t[:3].double() ** (1 - a)
        torch.testing.assert_close(log_pi[:3].exp().double(), w / w.sum(), rtol=1e-5, atol=1e-7)
    # alpha = 1 keeps exactly the two argmaxes.
    log_pi = mixture_logprobs(p_s.log(), p_t.log(), 0.5, plausibility_alpha=1.0)
    assert torch.isfinite(log_pi).tolist() == [True, True, False, False, False]
    # A tiny alpha removes nothing.
    torch.testing.assert_close(
        mixture_logprobs(p_s.log(), p_t.log(), 0.5, plausibility_alpha=1e-6),
        mixture_logprobs(p_s.log(), p_t.log(), 0.5),
    )


def test_extreme_logits_finite():
    s = torch.full((2, 6), -1e4)
    t = torch.full((2, 6), -1e4)
    s[:, 0] = 1e4
    t[:, 1] = 1e4
    t[1, 0] = 9e3
    for lam in (-3.0, -0.5, 0.0, 0.5, 3.0):
        for kwargs in ({}, {"logratio_clip": 5.0}, {"plausibility_alpha": 0.1}):
            log_pi = mixture_logprobs(s, t, lam, **kwargs)
            assert not torch.isnan(log_pi).any()
            assert torch.isfinite(log_pi).any(-1).all()
            torch.testing.assert_close(torch.logsumexp(log_pi, -1), torch.zeros(2), atol=1e-5, rtol=0)
    assert torch.isfinite(mixture_logprobs(s, t, 3.0)).all()


def test_bf16_input():
    s, t = _logits(2, 3, 40, seed=10), _logits(2, 3, 40, seed=11)
    got = mixture_logprobs(s.bfloat16(), t.bfloat16(), 0.5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, mixture_logprobs(s.bfloat16().float(), t.bfloat16().float(), 0.5))
    torch.testing.assert_close(got, mixture_logprobs(s, t, 0.5), rtol=0, atol=5e-2)
    endpoint = mixture_logprobs(s.bfloat16(), t.bfloat16(), 1.0)
    assert endpoint.dtype == torch.float32
    assert torch.equal(endpoint, F.log_softmax(s.bfloat16().float(), -1))


def test_invalid_arguments():
    s, t = _logits(2, 5, seed=12), _logits(2, 5, seed=13)
    with pytest.raises(ValueError, match="same shape"):
        mixture_logprobs(s, t[:, :4], 0.0)
    with pytest.raises(ValueError, match="lam"):
        mixture_logprobs(s, t, float("nan"))
    with pytest.raises(ValueError, match="lam"):
        mixture_logprobs(s, t, "0.5")
    with pytest.raises(ValueError, match="logratio_clip.*-1"):
        mixture_logprobs(s, t, 2.0, logratio_clip=-1.0)
    with pytest.raises(ValueError, match="logratio_clip"):
        mixture_logprobs(s, t, 2.0, logratio_clip=0.0)
    with pytest.raises(ValueError, match="plausibility_alpha"):
        mixture_logprobs(s, t, 2.0, plausibility_alpha=0.0)
    with pytest.raises(ValueError, match="plausibility_alpha.*1.5"):
        mixture_logprobs(s, t, 2.0, plausibility_alpha=1.5)
    with pytest.raises(ValueError, match="student_logits"):
        mixture_logprobs(torch.zeros(2, 5, dtype=torch.long), t, 0.0)
