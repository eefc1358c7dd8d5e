"""The diagnosis of each KL where the student must change its mind (kdlab.core.answer): positions,
and each KL's gradient checked against autograd of kdlab.core.kl.token_kls and the closed form's limits."""
import math

import pytest
import torch

from kdlab.core.answer import STATS, answer_positions, contested, position_stats
from kdlab.core.kl import token_kls

MARK = 5


def test_the_answer_position_is_the_token_after_the_last_mark_inside_the_mask():
    tokens = torch.tensor([[1, MARK, 7, 8, 0],   # mark at 1 -> 2
                           [MARK, 3, MARK, 9, 0],  # the last mark counts -> 3
                           [1, 2, 3, 4, 0],      # no mark
                           [1, 2, 3, 4, MARK],   # mark at the end: nothing after it
                           [1, MARK, 6, 0, 0]])  # the token after the mark is padding
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]).bool()
    where = answer_positions(tokens, mask, MARK)
    assert where.shape == tokens.shape and where.sum(1).tolist() == [1, 1, 0, 0, 0]
    assert where[0, 2] == 1 and where[1, 3] == 1


def test_contested_positions_are_where_the_most_likely_tokens_differ_inside_the_mask():
    s = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]])
    t = torch.tensor([[[2.0, 0.0], [2.0, 0.0], [0.0, 2.0]]])
    assert contested(s, t, torch.tensor([[True, True, False]])).tolist() == [[0.0, 1.0, 0.0]]


def _autograd(z_s, z_t, direction):
    z = z_s.clone().requires_grad_(True)
    fwd, rev = token_kls(z.view(1, 1, -1), z_t.view(1, 1, -1))
    (fwd if direction == "forward" else rev).sum().backward()
    return z.grad


def test_stats_equal_autograd_of_each_kl_summed_over_the_positions_given():
    g = torch.Generator().manual_seed(0)
    B, T, V = 3, 4, 11
    s = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    t = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    where = torch.zeros(B, T)
    for b, j in ((0, 1), (0, 3), (2, 0)):
        where[b, j] = 1
    got = position_stats(s, t, where)
    assert got.shape == (len(STATS),) and got.dtype == torch.float64
    want = torch.zeros(len(STATS), dtype=torch.float64)
    for b, j in ((0, 1), (0, 3), (2, 0)):
        z_s, z_t = s[b, j], t[b, j]
        a = int(z_t.softmax(-1).argmax())
        g_rev, g_fwd = _autograd(z_s, z_t, "reverse"), _autograd(z_s, z_t, "forward")
        want += torch.tensor([1.0, float(z_s.softmax(-1)[a]), float(z_t.softmax(-1)[a]), float(g_rev.norm()),
                              float(g_fwd.norm()), float(g_rev[a]), float(g_fwd[a])], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert position_stats(s, t, torch.zeros(B, T)).abs().sum() == 0


def test_reverse_gradient_at_the_teachers_token_vanishes_with_the_students_mass_while_forward_pulls():
    V = 8
    z_t = torch.zeros(V, dtype=torch.float64)
    z_t[3] = 6.0  # the teacher puts ~0.98 on token 3
    rows = []
    for gap in (0.0, 5.0, 10.0, 20.0):  # the student's logit of the teacher's token, ever lower
        z_s = torch.zeros(V, dtype=torch.float64)
        z_s[3] = -gap
        rows.append(position_stats(z_s.view(1, 1, V), z_t.view(1, 1, V), torch.ones(1, 1)))
    p_s = [float(r[1]) for r in rows]
    rev_a = [abs(float(r[5])) for r in rows]
    fwd_a = [float(r[6]) for r in rows]
    assert p_s == sorted(p_s, reverse=True) and p_s[-1] < 1e-8
    assert rev_a[-1] < 1e-6 < rev_a[0]  # the reverse pull on z_a dies with p_S(a)
    assert math.isclose(fwd_a[-1], -float(z_t.softmax(-1)[3]), rel_tol=1e-6)  # forward: p_S(a) - p_T(a) -> -p_T(a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_logits_are_computed_in_float32(dtype):
    s = torch.randn(2, 3, 7).to(dtype)
    t = torch.randn(2, 3, 7).to(dtype)
    where = torch.ones(2, 3)
    torch.testing.assert_close(position_stats(s, t, where), position_stats(s.double(), t.double(), where),
                               rtol=1e-5, atol=1e-6)
