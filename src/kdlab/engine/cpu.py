"""CPU settings of the distillation loop: keep freed heap memory for the next step (glibc), and
the attention implementation that is fastest on a CPU for the duration of a run."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


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
