"""KL from the teacher's hidden states and head (kdlab.core.head_kl) equals token_kl on the
materialised teacher logits: values and student gradients, both directions, temperatures, mask, bias."""
import pytest
import torch

from kdlab.core.head_kl import token_kl_from_hidden
from kdlab.core.kl import token_kl


def _case(dtype=torch.float64, B=3, T=5, d=8, V=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2).to(dtype)
    h = torch.randn(B, T, d, generator=g, dtype=torch.float64).to(dtype)
    W = (torch.randn(V, d, generator=g, dtype=torch.float64) * 0.7).to(dtype)
    b = (torch.randn(V, generator=g, dtype=torch.float64) * 0.3).to(dtype)
    mask = torch.rand(B, T, generator=g) > 0.3
    return s, h, W, b, mask


@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("temps", [(1.0, 1.0), (1.0, 0.5), (2.0, 0.7)])
def test_values_and_gradients_equal_the_materialised_logits(direction, chunk, temps):
    s, h, W, b, mask = _case()
    tau_s, tau_t = temps
    s1 = s.clone().requires_grad_(True)
    s2 = s.clone().requires_grad_(True)
    got = token_kl_from_hidden(s1, h, W, direction, mask, b, tau_s, tau_t, chunk)
    want = token_kl(s2 / tau_s, (h @ W.T + b) / tau_t, direction, mask)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    w = torch.randn(got.shape, dtype=got.dtype)
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(s1.grad, s2.grad, rtol=1e-10, atol=1e-12)
    assert (s1.grad[~mask] == 0).all() and (got[~mask] == 0).all()


def test_float32_and_bf16_match_to_the_issues_tolerance():
    s, h, W, b, mask = _case(torch.float32, B=2, T=16, d=32, V=4096)
    s1 = s.clone().requires_grad_(True)
    s2 = s.clone().requires_grad_(True)
    got = token_kl_from_hidden(s1, h, W, "reverse", mask, b, 1.0, 0.5, 7)
    want = token_kl(s2, (h @ W.T + b) / 0.5, "reverse", mask)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s1.grad, s2.grad, rtol=1e-5, atol=1e-5)
    sb, hb, Wb = s.bfloat16().requires_grad_(True), h.bfloat16(), W.bfloat16()
    out = token_kl_from_hidden(sb, hb, Wb, "forward", mask)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.sum().backward()
    assert sb.grad.dtype == torch.bfloat16


def test_the_teacher_gets_no_gradient_and_bad_shapes_are_named():
    s, h, W, b, mask = _case()
    h = h.clone().requires_grad_(True)
    W = W.clone().requires_grad_(True)
    out = token_kl_from_hidden(s.clone().requires_grad_(True), h, W, "forward", mask)
    out.sum().backward()
    assert h.grad is None and W.grad is None
    with pytest.raises(ValueError, match="teacher_head"):
        token_kl_from_hidden(s, h.detach(), W.detach()[:-1], "forward")
    with pytest.raises(ValueError, match="teacher_hidden"):
        token_kl_from_hidden(s, h.detach()[:, :-1], W.detach(), "forward")
    with pytest.raises(ValueError, match="chunk_size"):
        token_kl_from_hidden(s, h.detach(), W.detach(), "forward", chunk_size=0)
    with pytest.raises(ValueError, match="direction"):
        token_kl_from_hidden(s, h.detach(), W.detach(), "sideways")
