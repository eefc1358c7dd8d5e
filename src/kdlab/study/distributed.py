"""Sweeps on a Ray cluster: one remote task per run, with the local runner's resume semantics.

Two layers:

- ``RayExecutor(address).map(fn, items)``: a generic executor. ``fn(item)`` runs as one Ray
  task per item, asking for ``num_gpus_per_task`` GPUs when the cluster has GPUs and none on a
  CPU-only cluster. Results come back in input order as ``Outcome`` records; an exception in
  ``fn`` (or a crashed worker) becomes a "failed" outcome with its traceback, never an exception
  in the driver.
- ``run_on_ray(address, runs)``: a sweep of ``RunSpec`` (an output directory plus the call that
  fills it). A run whose ``metrics.json`` exists is skipped (checked on the driver before
  submission and again on the worker); a failure writes ``error.json`` into the run directory
  (atomically) and is reported, not raised; a later success removes the stale ``error.json``.

``fn`` and the items are pickled (cloudpickle) and must be importable on the workers: module-
level functions of an installed package (or a package on the workers' PYTHONPATH; pass
``runtime_env={"env_vars": {"PYTHONPATH": ...}}`` or ``{"py_modules": [...]}`` for a remote
cluster whose nodes do not have kdlab). A local cluster started by ``address="local"`` inherits
the driver's environment and working directory.
"""
from __future__ import annotations

import json
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.atomic import write_json_atomic

STATUSES = ("done", "skipped", "failed")


@dataclass(frozen=True)
class Outcome:
    """What happened to one item. ``value``: fn's return value (done) or the existing metrics
    (skipped); ``error``: "Type: message" plus the traceback (failed)."""

    index: int
    status: str
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"


def _call(fn: Callable[[Any], Any], item: Any) -> tuple[str, Any, str | None]:
    """Runs on the worker: never raises, so one failing item cannot fail the whole map."""
    try:
        return "done", fn(item), None
    except Exception as e:  # noqa: BLE001 - recorded, reported by the driver
        return "failed", None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


class RayExecutor:
    """Maps a function over items as Ray tasks.

    Args:
        address: a running cluster ("auto", "ray://host:10001", "host:6379") or "local" to
            start a private one for the lifetime of this executor.
        num_gpus_per_task: GPUs each task asks for when the cluster has any; 0 on a CPU-only
            cluster whatever is given (a task asking for a GPU there would wait forever).
        num_cpus_per_task: CPUs each task asks for (limits how many run at once per node).
        max_retries: Ray retries of a task whose worker process died (not of Python errors).
        runtime_env: passed to ``ray.init`` (e.g. env_vars, py_modules, pip).
        init_kwargs: more ``ray.init`` keyword arguments (num_cpus for a local cluster, ...).

    Use as a context manager, or call ``start()`` / ``shutdown()``; ``map`` starts it lazily.
    Only a connection this executor opened is closed by ``shutdown``.
    """

    def __init__(self, address: str = "auto", *, num_gpus_per_task: float = 1, num_cpus_per_task: float = 1,
                 max_retries: int = 0, runtime_env: dict[str, Any] | None = None,
                 init_kwargs: dict[str, Any] | None = None):
        if not isinstance(address, str) or not address:
            raise ValueError(f"address must be a non-empty string ('auto', 'local', 'host:port'), got {address!r}")
        for name, value in (("num_gpus_per_task", num_gpus_per_task), ("num_cpus_per_task", num_cpus_per_task)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self.address = address
        self.requested_gpus = float(num_gpus_per_task)
        self.num_cpus_per_task = float(num_cpus_per_task)
        self.max_retries = max_retries
        self.runtime_env = runtime_env
        self.init_kwargs = dict(init_kwargs or {})
        self._owns_connection = False
        self._remote: Any = None
        self.num_gpus = 0.0  # GPUs per task actually requested, set by start()

    def start(self) -> "RayExecutor":
        import ray

        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": self.address, "log_to_driver": False, **self.init_kwargs}
            if self.runtime_env is not None:
                kwargs["runtime_env"] = self.runtime_env
            if self.address == "local":
                kwargs.setdefault("include_dashboard", False)
            ray.init(**kwargs)
            self._owns_connection = True
        cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
        self.num_gpus = self.requested_gpus if cluster_gpus > 0 else 0.0
        self._remote = ray.remote(_call)
        return self

    def shutdown(self) -> None:
        import ray

        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False
        self._remote = None

    def __enter__(self) -> "RayExecutor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any],
            on_result: Callable[[Outcome], None] | None = None) -> list[Outcome]:
        """``fn(item)`` for every item, one Ray task each, all submitted at once (Ray queues what
        the cluster cannot run yet). ``on_result`` is called on the driver as each finishes.
        Returns the outcomes in input order."""
        import ray

        if self._remote is None:
            self.start()
        items = list(items)
        opts = {"num_gpus": self.num_gpus, "num_cpus": self.num_cpus_per_task, "max_retries": self.max_retries}
        refs = [self._remote.options(**opts).remote(fn, item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        outcomes: list[Outcome | None] = [None] * len(items)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ref = ready[0]
            i = index[ref]
            try:
                status, value, error = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a dead worker, an unpicklable result, ...
                status, value, error = "failed", None, f"{type(e).__name__}: {e}"
            outcomes[i] = Outcome(i, status, value, error)
            if on_result is not None:
                on_result(outcomes[i])
        return [o for o in outcomes if o is not None]


# --------------------------------------------------------------------------------------------
# Runs with resume semantics
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: ``fn(**kwargs)`` fills ``out_dir``; ``out_dir/metrics.json`` marks it
    complete. If ``fn`` returns a dict and has not written metrics.json itself, the dict is
    written there (atomically). Example: ``RunSpec(out_dir, kdlab.study.fsdp_run.run_argv,
    dict(argv=[profile_path, "--task", "mc", "--policy", "on", "--out", out_dir]))``."""

    out_dir: str
    fn: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


def _metrics(out_dir: str | Path) -> dict[str, Any] | None:
    path = Path(out_dir) / "metrics.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # unreadable: treat the run as not done


def execute_spec(spec: RunSpec | Callable[[], Any]) -> dict[str, Any]:
    """Run one spec with resume semantics; the body of every Ray task (usable locally too).

    Returns {"status": "skipped" | "done", "metrics": ...}. Raises what ``fn`` raised, after
    writing ``out_dir/error.json``. A bare zero-argument callable is simply called.
    """
    if not isinstance(spec, RunSpec):
        if not callable(spec):
            raise ValueError(f"a run must be a RunSpec or a zero-argument callable, got {spec!r}")
        return {"status": "done", "metrics": spec()}
    out_dir = Path(spec.out_dir)
    existing = _metrics(out_dir)
    if existing is not None:
        return {"status": "skipped", "metrics": existing}
    t0 = time.time()
    try:
        result = spec.fn(**spec.kwargs)
    except Exception as e:
        write_json_atomic(out_dir / "error.json", {
            "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(), "host": socket.gethostname(),
            "pid": os.getpid(), "started": t0, "failed": time.time()})
        raise
    metrics = _metrics(out_dir)
    if metrics is None and isinstance(result, dict):
        write_json_atomic(out_dir / "metrics.json", result)
        metrics = result
    (out_dir / "error.json").unlink(missing_ok=True)
    return {"status": "done", "metrics": metrics if metrics is not None else result}


def run_on_ray(address: str, runs: Sequence[RunSpec | Callable[[], Any]], num_gpus_per_task: float = 1, *,
               num_cpus_per_task: float = 1, max_retries: int = 0, runtime_env: dict[str, Any] | None = None,
               on_result: Callable[[Outcome], None] | None = None,
               executor: RayExecutor | None = None, **init_kwargs: Any) -> list[Outcome]:
    """Run a sweep on a Ray cluster; returns one ``Outcome`` per run, in order.

    Runs already complete (``metrics.json`` present) are "skipped" without being submitted;
    the others are "done" (value: their metrics) or "failed" (error: the traceback, also in
    ``out_dir/error.json``). ``executor``: reuse an open ``RayExecutor`` (then ``address`` and
    the resource arguments are ignored).
    """
    runs = list(runs)
    outcomes: list[Outcome | None] = [None] * len(runs)
    todo: list[int] = []
    for i, spec in enumerate(runs):
        existing = _metrics(spec.out_dir) if isinstance(spec, RunSpec) else None
        if existing is not None:
            outcomes[i] = Outcome(i, "skipped", existing)
            if on_result is not None:
                on_result(outcomes[i])
        else:
            todo.append(i)

    def relay(o: Outcome) -> None:
        i = todo[o.index]
        if o.status == "done":
            outcomes[i] = Outcome(i, o.value["status"], o.value["metrics"])
        else:
            outcomes[i] = Outcome(i, "failed", None, o.error)
        if on_result is not None:
            on_result(outcomes[i])

    if todo:
        own = executor is None
        ex = executor or RayExecutor(address, num_gpus_per_task=num_gpus_per_task, num_cpus_per_task=num_cpus_per_task,
                                     max_retries=max_retries, runtime_env=runtime_env, init_kwargs=init_kwargs)
        try:
            ex.map(execute_spec, [runs[i] for i in todo], on_result=relay)
        finally:
            if own:
                ex.shutdown()
    return [o for o in outcomes if o is not None]
