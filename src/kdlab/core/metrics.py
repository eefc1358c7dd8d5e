"""Evaluation metrics: unbiased pass@k and parameter-update sparsity."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

StateLike = Mapping[str, torch.Tensor] | nn.Module


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct.

    ``pass@k = 1 - C(n - c, k) / C(n, k)``: the probability that at least one of ``k`` samples
    drawn without replacement from the ``n`` is correct. Evaluated as the product
    ``prod_{i = n-c+1}^{n} (1 - k / i)`` so that large ``n`` neither overflows nor loses precision;
    1.0 when ``n - c < k`` (every k-subset contains a correct sample).

    Args:
        n: number of samples (>= 1).
        c: number of correct samples, 0 <= c <= n.
        k: subset size, 1 <= k <= n.

    Returns:
        A probability in [0, 1].
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, got {value!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must satisfy 0 <= c <= n = {n}, got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must satisfy 1 <= k <= n = {n}, got {k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{j=0}^{k-1} (n-c-j)/(n-j) = prod_{i=n-c+1}^{n} (1 - k/i)
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def _as_tensor_dict(obj: StateLike, name: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        # Parameters only (buffers are not trained); tied parameters are counted once.
        return {key: p.detach() for key, p in obj.named_parameters()}
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(
                    f"{name}[{key!r}] must be a torch.Tensor, got {type(value).__name__}"
                )
            out[key] = value.detach()
        return out
    raise ValueError(
        f"{name} must be a state dict (name -> tensor) or an nn.Module, got {type(obj).__name__}"
    )


def _unchanged_counts(
    before: StateLike, after: StateLike, tol: float
) -> dict[str, tuple[int, int]]:
    """Per tensor: (number of elements with |after - before| < tol, number of elements)."""
    valid = isinstance(tol, (int, float)) and not isinstance(tol, bool)
    if not valid or not math.isfinite(tol) or tol <= 0:
        raise ValueError(f"tol must be a positive finite number, got {tol!r}")
    b = _as_tensor_dict(before, "before")
    a = _as_tensor_dict(after, "after")
    only_before = sorted(set(b) - set(a))
    only_after = sorted(set(a) - set(b))
    if only_before:
        raise ValueError(f"key {only_before[0]!r} is in before but not in after")
    if only_after:
        raise ValueError(f"key {only_after[0]!r} is in after but not in before")
    counts = {}
    for key, tb in b.items():
        ta = a[key]
        if tb.shape != ta.shape:
            raise ValueError(
                f"shape mismatch for key {key!r}: before {tuple(tb.shape)}, after {tuple(ta.shape)}"
            )
        # Each tensor is cast from its own dtype to float64, so e.g. bf16 weights are compared
        # exactly as stored; NaN differences count as changed.
        diff = ta.to(device=tb.device, dtype=torch.float64) - tb.to(torch.float64)
        unchanged = int((diff.abs() < tol).sum().item())
        counts[key] = (unchanged, tb.numel())
    return counts


def update_sparsity(before: StateLike, after: StateLike, tol: float = 1e-6) -> float:
    """Share of parameter elements whose absolute change is strictly below ``tol``.

    Args:
        before: initial weights, a state dict (name -> tensor) or an ``nn.Module`` (its
            ``named_parameters()``: buffers excluded, tied weights counted once).
        after: weights after training, same kind of keys and shapes.
        tol: threshold (> 0) on ``|after - before|``, compared in float64 after casting each
            tensor from its own dtype. With bf16 weights, updates smaller than one bf16 step
            vanish on storage, so report the dtype with the figure.

    Returns:
        Fraction in [0, 1] over all elements of all tensors.

    Raises:
        ValueError: on mismatched keys or shapes (naming the key), bad ``tol``, or no elements.
    """
    counts = _unchanged_counts(before, after, tol)
    total = sum(n for _, n in counts.values())
    if total == 0:
        raise ValueError("before/after contain no tensor elements to compare")
    return sum(u for u, _ in counts.values()) / total


def update_sparsity_by_tensor(
    before: StateLike, after: StateLike, tol: float = 1e-6
) -> dict[str, float]:
    """Per-tensor version of :func:`update_sparsity`: name -> share of unchanged elements.

    Tensors with zero elements are left out of the result.
    """
    counts = _unchanged_counts(before, after, tol)
    return {key: u / n for key, (u, n) in counts.items() if n > 0}
