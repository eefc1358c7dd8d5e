"""Precision: parameters in bf16 (no fp32 master copy) or fp32, arithmetic in a compute-dtype copy;
CPU allocator and attention settings of the loop."""
from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator

import torch

from ..core.dtypes import DTYPES
from .run_config import RunConfig


def compute_dtype_of(cfg: RunConfig, device: torch.device) -> torch.dtype:
    """The student's arithmetic dtype: ``cfg.compute_dtype``, or for "auto" fp32 on a CPU (small
    bf16 matmuls are slower there than fp32 ones without AMX; measured in docs/calibration.md 17)
    and ``cfg.dtype`` elsewhere."""
    if cfg.compute_dtype != "auto":
        return DTYPES[cfg.compute_dtype]
    return torch.float32 if device.type == "cpu" else DTYPES[cfg.dtype]


class _Arithmetic:
    """The student's parameters in ``cfg.dtype``, its arithmetic in another dtype.

    ``model`` is the module that samples and runs forward and backward: the student itself, or a
    copy in the compute dtype that ``pull`` reloads from the parameters before each step; ``push``
    rounds the copy's gradients into the parameters' ``.grad``. Clipping, the optimizer and the
    update stay on the parameters in ``cfg.dtype``: with bf16 there is still no fp32 master copy
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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt() parameters (malloc.h)
HEAP_KEEP_BYTES = 1 << 30


def keep_freed_heap() -> bool:
    """Ask glibc's allocator to serve large blocks from its heap and keep freed memory there,
    for reuse by the next step, instead of mapping fresh zeroed pages for every large tensor and
    unmapping them when freed. A step on a real model allocates and frees several (B, R, V)
    float32 tensors (100 MB each at V = 49,152); faulting their pages in again every step cost
    about a third of kdlab's step time on SmolLM2-135M (docs/calibration.md 18). The process's
    resident memory then stays near its peak. Returns whether the allocator took the setting (a
    no-op without glibc)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, HEAP_KEEP_BYTES)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, 2 * HEAP_KEEP_BYTES))
    except (OSError, AttributeError):
        return False


@contextmanager
def _fast_cpu_attention(*models: torch.nn.Module) -> Iterator[None]:
    """Run CPU models that use SDPA attention with the eager (matmul) attention instead.

    Same function; on CPU the eager path is faster at these sizes, mostly in backward (the fused
    CPU attention's bf16 backward is slow). GPU models and other implementations are untouched;
    each model's setting is restored on exit.
    """
    switched = []
    for m in models:
        cfg = getattr(m, "config", None)
        if (cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa"
                and next(m.parameters()).device.type == "cpu" and hasattr(m, "set_attn_implementation")):
            m.set_attn_implementation("eager")
            switched.append(m)
    try:
        yield
    finally:
        for m in switched:
            m.set_attn_implementation("sdpa")
