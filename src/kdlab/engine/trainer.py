"""The one trainer skeleton of kdlab's training loops (distillation, SFT, GRPO).

Each loop is a loss and a batch source; this module owns what they share:

- the optimiser: AdamW (``make_adamw``; fused where the device supports it), one set-up for all;
- the learning-rate schedule (``Trainer.lr_at``): ``constant`` (linear warm-up, then constant:
  transformers' ``get_constant_schedule_with_warmup``, counted so that step 0 already trains at
  ``lr / warmup``, as kdlab's runs always did) or ``cosine`` (SFT: kdlab's linear warm-up, then
  transformers' ``get_cosine_with_min_lr_schedule_with_warmup`` decay to ``min_lr_ratio``);
- precision: parameters in their dtype (bf16 keeps no fp32 master copy: an update below half a
  bf16 step is lost), arithmetic in a compute-dtype copy (``Arithmetic``, ``compute_dtype_of``,
  ``upcast``), or bf16 autocast over fp32 weights (SFT);
- gradient accumulation: a micro-batch's loss is weighted by its share of the batch's tokens
  (``Trainer.backward``);
- clipping (``Trainer.clip``: the norm before clipping, a plain tensor also under FSDP2) and the
  non-finite checks (``all_finite``, ``Trainer.params_finite``).
"""
from __future__ import annotations

import copy
import math
from functools import lru_cache
from typing import Callable

import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from ..core.dtypes import DTYPES

SCHEDULES = ("constant", "cosine")


def make_adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float, fused: bool,
               betas: tuple[float, float] = (0.9, 0.999)) -> tuple[torch.optim.Optimizer, str]:
    """AdamW (eps 1e-8; betas 0.9/0.999 unless given: SFT uses 0.9/0.98) and the name of its
    implementation.

    ``fused=True`` asks for ``torch.optim.AdamW(fused=True)`` (one kernel per step; the paper's
    choice) and falls back to the default implementation where the device or dtype does not
    support it (the name then says ``adamw``). Fused and default AdamW compute the same update
    up to floating-point rounding."""
    kw = dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=1e-8)
    if fused:
        try:
            return torch.optim.AdamW(params, fused=True, **kw), "adamw-fused"
        except (RuntimeError, ValueError, TypeError):
            pass
    return torch.optim.AdamW(params, **kw), "adamw"


@lru_cache(maxsize=64)
def _factor(schedule: str, warmup: int, total: int, min_lr_ratio: float) -> Callable[[int], float]:
    """transformers' multiplier of the base rate at a step (``LambdaLR.lr_lambdas[0]``), built on a
    throwaway optimiser: the rate itself is set on the real optimiser's groups step by step."""
    dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    if schedule == "constant":
        sched = get_constant_schedule_with_warmup(dummy, warmup)
    else:
        sched = get_cosine_with_min_lr_schedule_with_warmup(dummy, warmup, max(total, warmup + 1),
                                                            min_lr_rate=min_lr_ratio)
    return sched.lr_lambdas[0]


def lr_at(step: int, lr: float, warmup: int) -> float:
    """The constant schedule: linear warm-up over ``warmup`` steps (step 0 at ``lr / warmup``),
    then ``lr``; ``warmup`` 0 is constant from the first step. transformers' schedule counts
    warm-up from 0 (its step 0 has rate 0): kdlab's step s is its step s + 1."""
    return lr * _factor("constant", warmup, 0, 0.0)(step + 1)


def cosine_lr_at(step: int, lr: float, warmup: int, total: int, min_lr_ratio: float) -> float:
    """SFT's schedule: linear warm-up (step 0 at ``lr / warmup``), then a half cosine from ``lr``
    down to ``min_lr_ratio * lr`` at step ``total`` (transformers' cosine with a minimum rate).
    The warm-up keeps kdlab's own arithmetic, ``lr * (step + 1) / warmup``: the shipped models
    were trained with it, and transformers' (``lr * (step / warmup)``, from 0) rounds otherwise."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * _factor("cosine", warmup, max(1, total - warmup) + warmup, min_lr_ratio)(min(step, total))


def all_finite(params: list[torch.nn.Parameter], world: int = 1) -> bool:
    """Whether every parameter value is finite: one fused max-abs pass over all of them (a
    tensor's infinity norm is finite exactly when its values are), instead of a check and a
    host sync per tensor; sharded parameters (DTensors) are checked tensor by tensor."""
    if world > 1:
        return all(bool(torch.isfinite(p).all()) for p in params)
    return bool(torch.stack(torch._foreach_norm(params, math.inf)).isfinite().all())


def compute_dtype_of(cfg, device: torch.device) -> torch.dtype:
    """The student's arithmetic dtype: ``cfg.compute_dtype``, or for "auto" fp32 on a CPU (small
    bf16 matmuls are slower there than fp32 ones without AMX; measured in docs/calibration.md 17)
    and ``cfg.dtype`` elsewhere. ``cfg``: anything with ``dtype`` and ``compute_dtype`` names."""
    if cfg.compute_dtype != "auto":
        return DTYPES[cfg.compute_dtype]
    return torch.float32 if device.type == "cpu" else DTYPES[cfg.dtype]


class Arithmetic:
    """The student's parameters in their dtype, its arithmetic in another dtype.

    ``model`` is the module that samples and runs forward and backward: the student itself, or a
    copy in the compute dtype that ``pull`` reloads from the parameters before each step; ``push``
    rounds the copy's gradients into the parameters' ``.grad``. Clipping, the optimizer and the
    update stay on the parameters in their dtype: with bf16 there is still no fp32 master copy
    (an update below half a bf16 step is lost); only the forward and backward run in the wider
    type. One process only (a sharded student computes in its own dtype)."""

    def __init__(self, student: torch.nn.Module, dtype: torch.dtype, world: int):
        self.student = student
        same = next(student.parameters()).dtype == dtype or world > 1
        self.model = student if same else copy.deepcopy(student).to(dtype)
        self.pairs = [] if same else list(zip(self.model.parameters(), student.parameters()))

    def pull(self) -> None:
        with torch.no_grad():
            for w, p in self.pairs:
                w.copy_(p)

    def push(self) -> None:
        for w, p in self.pairs:
            p.grad = None if w.grad is None else w.grad.to(p.dtype)
            w.grad = None


def upcast(model: torch.nn.Module, dtype: torch.dtype, world: int = 1) -> torch.nn.Module:
    """``model`` computing in ``dtype``: a cast copy when its parameters are of a narrower type
    (bf16 values are exact in fp32), else ``model`` itself (never narrowed; a sharded model is
    left as it is). The frozen teacher and the distilled student under evaluation go through it."""
    if world > 1 or next(model.parameters()).dtype.itemsize >= dtype.itemsize:
        return model
    return copy.deepcopy(model).to(dtype)


class Trainer:
    """The optimiser, schedule, clipping and checks of one training run over ``params``.

    A loop calls, per step: ``set_lr(step)``, ``zero_grad()``, ``backward(loss, weight)`` per
    micro-batch, ``clip()`` (the norm before clipping), ``step()``, and ``params_finite()``.
    ``optimizer``: one to continue (a resumed SFT run's), else AdamW from ``make_adamw``."""

    def __init__(self, params, lr: float, *, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 fused: bool = False, schedule: str = "constant", warmup: int = 0, total_steps: int = 0,
                 min_lr_ratio: float = 0.0, grad_clip: float | None = None, world: int = 1,
                 optimizer: torch.optim.Optimizer | None = None):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.params = list(params)
        self.lr, self.schedule, self.warmup = lr, schedule, warmup
        self.total_steps, self.min_lr_ratio = total_steps, min_lr_ratio
        self.grad_clip, self.world = grad_clip, world
        if optimizer is None:
            optimizer, self.name = make_adamw(self.params, lr, weight_decay, fused, betas)
        else:
            self.name = "adamw-fused" if optimizer.defaults.get("fused") else "adamw"
        self.optimizer = optimizer

    def lr_at(self, step: int) -> float:
        if self.schedule == "constant":
            return lr_at(step, self.lr, self.warmup)
        return cosine_lr_at(step, self.lr, self.warmup, self.total_steps, self.min_lr_ratio)

    def set_lr(self, step: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step)

    @property
    def current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @staticmethod
    def backward(loss: torch.Tensor, weight: float = 1.0) -> None:
        """Accumulate ``loss``'s gradient, weighted by its micro-batch's share of the batch
        (e.g. ``world * n_tokens / n_total``: the accumulated gradient is the batch's token mean)."""
        (loss if weight == 1.0 else loss * weight).backward()

    def clip(self) -> torch.Tensor:
        """Clip the gradients to ``grad_clip`` (None: no clipping) and return their norm before
        clipping, a plain tensor (a DTensor's full value under FSDP2)."""
        gnorm = torch.nn.utils.clip_grad_norm_(self.params,
                                               self.grad_clip if self.grad_clip is not None else float("inf"))
        if hasattr(gnorm, "full_tensor"):
            gnorm = gnorm.full_tensor()
        return gnorm

    def step(self) -> None:
        self.optimizer.step()

    def params_finite(self) -> bool:
        return all_finite(self.params, self.world)
