"""Tests for kdlab.core.metrics: pass@k and update sparsity."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from kdlab.core.metrics import pass_at_k, update_sparsity, update_sparsity_by_tensor

# ---------------------------------------------------------------- pass@k


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of k-subsets of n samples (the first c correct) containing a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in sub) for sub in subsets) / len(subsets)


def test_pass_at_k_matches_subset_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(200, 37, 10), (100, 1, 1), (100, 1, 10), (1000, 3, 50), (50, 0, 5)])
def test_pass_at_k_matches_math_comb(n, c, k):
    ref = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0  # n - c = 2 < k
    assert pass_at_k(10, 10, 10) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the accuracy
    big = pass_at_k(100_000, 7, 1000)
    assert 0.0 <= big <= 1.0
    assert big == pytest.approx(1 - math.comb(100_000 - 7, 1000) / math.comb(100_000, 1000), rel=1e-10)


@pytest.mark.parametrize(
    "n,c,k,name",
    [(5, 2, 6, "k"), (5, 6, 1, "c"), (5, -1, 1, "c"), (-1, 0, 1, "n"), (5, 2, 0, "k"), (5, 2.0, 1, "c")],
)
def test_pass_at_k_invalid(n, c, k, name):
    with pytest.raises(ValueError, match=name):
        pass_at_k(n, c, k)


# ---------------------------------------------------------------- update sparsity


def test_update_sparsity_hand_made():
    before = {
        "w": torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
        "b": torch.zeros(2, 2, dtype=torch.float64),
    }
    after = {
        "w": torch.tensor([1.0 + 1e-3, 2.0 + 5e-7, 3.0, 4.0 - 2e-6], dtype=torch.float64),
        "b": torch.tensor([[0.0, 0.0], [-5e-7, 3.0]], dtype=torch.float64),
    }
    # unchanged: w -> 2 of 4 (indices 1, 2); b -> 3 of 4.
    assert update_sparsity(before, after) == pytest.approx(5 / 8)
    assert update_sparsity_by_tensor(before, after) == pytest.approx({"w": 0.5, "b": 0.75})
    assert update_sparsity(before, after, tol=1e-2) == pytest.approx(7 / 8)
    assert update_sparsity(before, before) == 1.0


def test_update_sparsity_threshold_is_strict():
    before = {"x": torch.tensor([0.0, 0.0], dtype=torch.float64)}
    after = {"x": torch.tensor([0.5, 0.25], dtype=torch.float64)}
    assert update_sparsity(before, after, tol=0.5) == 0.5  # |0.5| is not < 0.5


def test_update_sparsity_bf16_as_stored():
    w = torch.tensor([1.0, 0.5, 2.0, -3.0], dtype=torch.bfloat16)
    tiny = (w.float() + 1e-4).to(torch.bfloat16)  # below half a bf16 step: vanishes on storage
    large = (w.float() + 0.1).to(torch.bfloat16)
    assert torch.equal(tiny, w)
    assert update_sparsity({"w": w}, {"w": tiny}) == 1.0
    assert update_sparsity({"w": w}, {"w": large}) == 0.0
    # The same tiny update kept in fp32 is visible (1e-4 >= tol).
    assert update_sparsity({"w": w.float()}, {"w": w.float() + 1e-4}) == 0.0
    # Mixed dtypes are compared after casting each from its own dtype.
    assert update_sparsity({"w": w}, {"w": w.float()}) == 1.0
    # bf16 step at 1.0 is 2^-7; a change below tol in bf16 magnitudes is counted as unchanged.
    before = {"w": torch.tensor([256.0], dtype=torch.bfloat16)}
    after = {"w": torch.tensor([258.0], dtype=torch.bfloat16)}  # one bf16 step at 256 is 2
    assert update_sparsity(before, after, tol=2.0) == 0.0
    assert update_sparsity(before, after, tol=2.0 + 1e-9) == 1.0


def test_update_sparsity_modules():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model.register_buffer("counter", torch.zeros(5))
    before = {k: v.clone() for k, v in model.named_parameters()}
    start = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    start.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        model[1].bias += 1.0  # 2 of 4*3 + 3 + 3*2 + 2 = 23 elements change
        model.counter += 1.0  # buffers are not parameters: ignored
    assert update_sparsity(start, model) == pytest.approx(21 / 23)
    assert update_sparsity(before, model) == pytest.approx(21 / 23)
    per = update_sparsity_by_tensor(start, model)
    assert set(per) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert per["1.bias"] == 0.0 and per["0.weight"] == 1.0


def test_update_sparsity_tied_weights_counted_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 2)
            self.head = nn.Linear(2, 5, bias=False)
            self.head.weight = self.emb.weight

    a, b = Tied(), Tied()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.emb.weight[0, 0] += 1.0
    assert update_sparsity(a, b) == pytest.approx(9 / 10)


def test_update_sparsity_invalid():
    x = {"a": torch.zeros(3), "b": torch.zeros(2)}
    with pytest.raises(ValueError, match="'b'"):
        update_sparsity(x, {"a": torch.zeros(3)})
    with pytest.raises(ValueError, match="'c'"):
        update_sparsity(x, {**x, "c": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape.*'a'"):
        update_sparsity(x, {"a": torch.zeros(4), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match="shape.*'a'"):
        update_sparsity_by_tensor(x, {"a": torch.zeros(1, 3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match="tol"):
        update_sparsity(x, x, tol=-1.0)
    with pytest.raises(ValueError, match="'a'"):
        update_sparsity(x, {"a": [0.0, 0.0, 0.0], "b": torch.zeros(2)})
    with pytest.raises(ValueError, match="no tensor elements"):
        update_sparsity({}, {})
    with pytest.raises(ValueError, match="before"):
        update_sparsity([torch.zeros(1)], x)
