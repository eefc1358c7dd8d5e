"""GPU faults inside a study's runs, as the worker loop (``kdlab.study.kernels``) meets them.

- **Out of memory** (``torch.OutOfMemoryError``, or a ``RuntimeError`` saying "CUDA out of
  memory"): the run is recorded (``error.json``) with the reason and the settings to lower
  (``oom_remedy``), the kernel's memory is released (``RELEASE``: the failed notebook's
  namespace and the exception that holds its frames are dropped, then ``release_memory``) and
  the worker goes on with the next run in the same kernel.
- **A CUDA error that poisons the process** (a device-side assert, an illegal memory access:
  every later CUDA call in that process fails): the worker's kernel is replaced by a fresh one
  and the run is redone there, once.

Both are decided from the error a notebook recorded (its exception's name and message), so
they are simulated on a CPU by raising the same exceptions.
"""
from __future__ import annotations

from typing import Any

# Phrases of a CUDA error after which the process's CUDA context is unusable.
POISON_PHRASES = ("CUDA error", "device-side assert", "illegal memory access", "CUBLAS_STATUS", "CUDNN_STATUS")

# Run in the kernel after an out-of-memory error: a fresh namespace, then the memory released.
RELEASE = """
%reset -f
import kdlab.study.gpu_faults
kdlab.study.gpu_faults.release_memory()
"""


def out_of_memory(error: dict[str, Any]) -> bool:
    """True when a recorded notebook error is the GPU running out of memory."""
    return error.get("ename") == "OutOfMemoryError" or "CUDA out of memory" in str(error.get("evalue", ""))


def poisons_process(error: dict[str, Any]) -> bool:
    """True when a recorded notebook error is a CUDA error that leaves the process unusable."""
    if out_of_memory(error):
        return False
    text = f"{error.get('ename', '')}: {error.get('evalue', '')}"
    return error.get("ename") == "AcceleratorError" or any(p in text for p in POISON_PHRASES)


def oom_remedy(run: dict[str, Any] | None) -> str:
    """What to lower after a run ran out of GPU memory, with the run's own values."""
    run = run or {}
    micro, chunk = run.get("micro_batch_size", 0), run.get("kl_chunk_size", 0)
    batch = run.get("batch_size")
    micro_now = f"{micro}" if micro else f"0, the whole batch of {batch}" if batch else "0, the whole batch"
    chunk_now = f"{chunk}" if chunk else "0, off"
    return (f"out of GPU memory: lower pretrained.micro_batch_size (rows per forward/backward, now {micro_now}) "
            f"or set pretrained.kl_chunk_size (positions per chunk of the full-vocabulary KL, now {chunk_now}; "
            "e.g. 4096)")


def release_memory() -> None:
    """Drop the last exception (``sys.last_*`` and IPython's traceback formatter keep its
    traceback, and with it the frames and tensors of the notebook that raised), collect garbage
    and return CUDA's cached blocks to the device. Called in a kernel after ``%reset -f``, which
    keeps all three."""
    import gc
    import sys

    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    for formatter in (getattr(shell, "InteractiveTB", None), getattr(shell, "SyntaxTB", None)):
        if hasattr(formatter, "tb"):
            formatter.tb = None
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
