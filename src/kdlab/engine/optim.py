"""The optimiser of the training loops: AdamW (fused where supported), the warm-up schedule and the
non-finite check."""
from __future__ import annotations

import math

import torch



def make_adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float,
               fused: bool) -> tuple[torch.optim.Optimizer, str]:
    """AdamW (betas 0.9/0.999, eps 1e-8) and the name of its implementation.

    ``fused=True`` asks for ``torch.optim.AdamW(fused=True)`` (one kernel per step; the paper's
    choice) and falls back to the default implementation where the device or dtype does not
    support it (the name then says ``adamw``). Fused and default AdamW compute the same update
    up to floating-point rounding."""
    kw = dict(lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8)
    if fused:
        try:
            return torch.optim.AdamW(params, fused=True, **kw), "adamw-fused"
        except (RuntimeError, ValueError, TypeError):
            pass
    return torch.optim.AdamW(params, **kw), "adamw"


def lr_at(step: int, lr: float, warmup: int) -> float:
    """The learning-rate schedule: linear warm-up over ``warmup`` steps (step 0 at lr / warmup),
    then constant at ``lr``; ``warmup`` 0 is constant from the first step."""
    return lr * min(1.0, (step + 1) / warmup) if warmup else lr


def all_finite(params: list[torch.nn.Parameter], world: int = 1) -> bool:
    """Whether every parameter value is finite: one fused max-abs pass over all of them (a
    tensor's infinity norm is finite exactly when its values are), instead of a check and a
    host sync per tensor; sharded parameters (DTensors) are checked tensor by tensor."""
    if world > 1:
        return all(bool(torch.isfinite(p).all()) for p in params)
    return bool(torch.stack(torch._foreach_norm(params, math.inf)).isfinite().all())


