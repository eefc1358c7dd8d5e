"""Executing notebooks: warm Jupyter kernels, papermill, the worker loop and Ray.

Notebooks are executed papermill-style (papermill parameterizes them and tracks cell state) but
in warm kernels: each worker owns one Jupyter kernel for the whole study and runs notebook after
notebook in it, resetting the user namespace in between, so only the first notebook per worker
pays for the kernel start and the imports. A job's notebook that raises gets ``error.json``
(failing cell, error name and message) next to its partial notebook, and the study goes on.
A run that runs out of GPU memory is recorded with the settings to lower and its kernel's
memory is released; a CUDA error that poisons the kernel's process replaces that kernel and
the run is redone in the fresh one (``kdlab.study.gpu_faults``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import nbformat

from ..core.atomic import FILE_MODE, write_json_atomic, write_text_atomic
from .gpu_faults import RELEASE, oom_remedy, out_of_memory, poisons_process
from .records import only_nonfinite, record_problems
from .plan import NOTEBOOKS_DIR, Job, _notebook
from .distributed import RunSpec, run_on_ray

KERNEL_NAME = "python3"
KERNEL_STARTUP_TIMEOUT_S = 180
log = logging.getLogger("kdlab.study")

# Imported once per kernel at start-up, so that no run pays for them. gc.freeze() moves the
# (long-lived) module objects out of the collector's sight: a full collection then costs
# milliseconds instead of ~0.4 s, and the reset below can afford one per notebook.
_WARM_IMPORTS = """
import gc
import matplotlib.pyplot, pandas, seaborn, torch
import kdlab.study.results, kdlab.study.runs, kdlab.study.teachers
import datasets, transformers
datasets.disable_progress_bars()  # progress bars never reach an executed notebook or the report
transformers.utils.logging.disable_progress_bar()
gc.collect()
gc.freeze()
"""


# Run before every notebook in a warm kernel: a fresh user namespace (modules stay imported),
# no figures left open, the notebook's working directory and execution counts from 1.
_RESET = """
%reset -f
def _kdlab_prepare(cwd):
    import gc, os, sys
    import kdlab.study.gpu_faults
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
    os.chdir(cwd)
    kdlab.study.gpu_faults.release_memory()  # the last notebook's error and its frames too
    gc.freeze()  # what survives a reset is module state (imports, caches): keep it frozen too
    get_ipython().execution_count = 1
_kdlab_prepare({cwd!r})
del _kdlab_prepare
"""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _papermill():
    """papermill's pieces (imported lazily: they pull in nbclient and jupyter_client)."""
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NotebookExecutionManager
    from papermill.exceptions import PapermillExecutionError
    from papermill.execute import prepare_notebook_metadata, raise_for_execution_errors, remove_error_markers
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    class AtomicExecutionManager(NotebookExecutionManager):
        """papermill's cell-state tracker, but every save is atomic (temp file + rename), so a
        notebook on disk is always whole, and it remembers the cell being executed."""

        current_cell: int | None = None

        def save(self, **kwargs: Any) -> None:
            if kwargs.get("nb") is not None:
                self.nb = kwargs["nb"]
            if self.output_path:
                write_text_atomic(self.output_path, nbformat.writes(self.nb))
            self.last_save_time = self.now()

        def cell_start(self, cell, cell_index=None, **kwargs: Any) -> None:
            self.current_cell = cell_index
            super().cell_start(cell, cell_index, **kwargs)

    return dict(client=PapermillNotebookClient, manager=AtomicExecutionManager, error=PapermillExecutionError,
                prepare=prepare_notebook_metadata, raise_errors=raise_for_execution_errors,
                remove_markers=remove_error_markers, load=load_notebook_node, parameterize=parameterize_notebook)


@dataclass
class NotebookOutcome:
    """One executed notebook: where it is, its wall time (s), if it raised, the error and, if it
    was redone in a fresh kernel after a CUDA error, that error (``redone``)."""

    path: Path
    seconds: float
    error: dict[str, Any] | None = None
    redone: str | None = None


class WarmKernel:
    """One Jupyter kernel kept alive across notebooks, with its own thread.

    Every call that talks to the kernel goes through ``submit`` and so runs on the kernel's
    thread (its asyncio loop and ZMQ sockets live there); ``kill`` may be called from any thread.
    """

    def __init__(self, index: int, cwd: Path, env: dict[str, str], kernel_name: str = KERNEL_NAME,
                 log_path: Path | None = None):
        self.index = index
        self.cwd = cwd
        self.env = env
        self.kernel_name = kernel_name
        self.log_path = log_path  # the kernel process's own stdout/stderr (None: inherit ours)
        self.km = None
        self.kc = None
        self._log = None
        self.start_s = 0.0  # total seconds spent starting (and restarting) this kernel
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kdlab-kernel-{index}")

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        return self._thread.submit(fn, *args, **kwargs)

    def _run(self, coro):
        from jupyter_core.utils import ensure_event_loop

        return ensure_event_loop().run_until_complete(coro)

    # ---- kernel thread only
    def start(self) -> float:
        """Start the kernel and import the heavy modules; returns the seconds it took."""
        from jupyter_client.manager import AsyncKernelManager

        t0 = time.perf_counter()
        self.km = AsyncKernelManager(kernel_name=self.kernel_name)
        streams = {}
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a")
            streams = {"stdout": self._log, "stderr": self._log}
        # no IPython history: the warm kernels would share one history database and report
        # "Session/line number was not unique in database" into the notebooks
        self._run(self.km.start_kernel(cwd=str(self.cwd), env=self.env, extra_arguments=["--HistoryManager.enabled=False"],
                                       **streams))
        self.kc = self.km.client()
        self.kc.start_channels()
        self._run(self.kc.wait_for_ready(timeout=KERNEL_STARTUP_TIMEOUT_S))
        self.kc.allow_stdin = False
        self.run_code(_WARM_IMPORTS, timeout=KERNEL_STARTUP_TIMEOUT_S)
        seconds = time.perf_counter() - t0
        self.start_s += seconds
        return seconds

    def alive(self) -> bool:
        return self.km is not None and bool(self._run(self.km.is_alive()))

    def run_code(self, code: str, timeout: float = 120) -> None:
        """Execute ``code`` silently; RuntimeError if it raises in the kernel."""
        reply = self._run(self.kc.execute_interactive(code, silent=True, store_history=False, allow_stdin=False,
                                                      timeout=timeout, output_hook=lambda msg: None))
        content = reply["content"]
        if content.get("status") != "ok":
            raise RuntimeError(f"kernel {self.index}: setup code failed: {content.get('ename')}: {content.get('evalue')}")

    def restart(self) -> float:
        self.shutdown()
        return self.start()

    def shutdown(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km is not None:
            try:
                if self._run(self.km.is_alive()):
                    self._run(self.km.shutdown_kernel(now=True))
                self._run(self.km.cleanup_resources())
            except RuntimeError:
                pass
            self.km = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def execute(self, notebook: Path, output: Path, parameters: dict[str, Any], cwd: Path) -> NotebookOutcome:
        """Execute ``notebook`` with papermill ``parameters`` into ``output`` (saved after every cell),
        in this kernel with a fresh namespace and working directory ``cwd``."""
        from nbclient.exceptions import DeadKernelError

        pm = _papermill()
        t0 = time.perf_counter()
        if not self.alive():
            self.restart()
        self.run_code(_RESET.format(cwd=str(cwd)))
        nb = pm["load"](str(notebook))
        nb = pm["parameterize"](nb, parameters, kernel_name=self.kernel_name, language="python")
        nb = pm["prepare"](nb, str(notebook), str(output))
        nb = pm["remove_markers"](nb)
        manager = pm["manager"](nb, output_path=str(output), progress_bar=False)
        manager.notebook_start()
        error = None
        try:
            client = pm["client"](manager, km=self.km, kernel_name=self.kernel_name, timeout=None,
                                  startup_timeout=KERNEL_STARTUP_TIMEOUT_S, log=log)
            client.kc = self.kc  # reuse this kernel's client: no new channels per notebook
            client.execute()
        except DeadKernelError as e:
            i = manager.current_cell
            error = {"cell_index": i, "execution_count": None,
                     "source": manager.nb.cells[i].source if i is not None else "",
                     "ename": "DeadKernelError", "evalue": f"the kernel died while executing this cell: {e}",
                     "traceback": []}
        finally:
            manager.notebook_complete()
        if error is None:
            error = _notebook_error(manager.nb, output, pm)
        return NotebookOutcome(path=output, seconds=time.perf_counter() - t0, error=error)

    # ---- any thread
    def kill(self) -> None:
        """SIGKILL this kernel's process group (it runs in its own session)."""
        import signal

        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self, timeout: float = 30) -> None:
        """Shut the kernel down (on its thread) and stop the thread."""
        try:
            self.submit(self.shutdown).result(timeout=timeout)
        except Exception:  # noqa: BLE001 - a kernel that will not shut down is killed
            self.kill()
        self._thread.shutdown(wait=False, cancel_futures=True)


def _notebook_error(nb: nbformat.NotebookNode, output: Path, pm: dict[str, Any]) -> dict[str, Any] | None:
    """The first error a notebook recorded (papermill's rules), or None. On an error the saved
    notebook gets papermill's error marker cells (message at the top, anchor before the cell);
    ``cell_index`` is the failing cell's index in that saved notebook."""
    tmp = output.with_name(f".{output.stem}.error.ipynb")
    try:
        pm["raise_errors"](nb, str(tmp))
    except pm["error"] as e:
        saved = nbformat.read(tmp, as_version=4)
        index = next((i for i, c in enumerate(saved.cells) if c.cell_type == "code" and c.source == e.source
                      and c.get("execution_count") == e.exec_count), e.cell_index)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, output)
        return {"cell_index": index, "execution_count": e.exec_count, "source": e.source, "ename": e.ename,
                "evalue": e.evalue, "traceback": [_ANSI.sub("", line) for line in e.traceback or []]}
    return None


def _kernel_env(threads: int, gpu: str | None = None) -> dict[str, str]:
    """The kernels' environment: this one, plus kdlab's source on the path (the kernels import the
    same kdlab), per-worker thread counts, inline figures and, with ``gpu``, the one GPU the
    worker sees (``CUDA_VISIBLE_DEVICES``; ``kdlab.study.preflight.worker_gpus``)."""
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    return env


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _execute_safely(kernel: WarmKernel, notebook: Path, output: Path, parameters: dict[str, Any],
                    cwd: Path) -> NotebookOutcome:
    """``kernel.execute`` (on the kernel's thread), with a failure of the runner itself (a kernel
    that cannot be reset or restarted, ...) reported as the notebook's error instead of raised."""
    t0 = time.perf_counter()
    try:
        return kernel.execute(notebook, output, parameters, cwd)
    except Exception as e:  # noqa: BLE001 - recorded, and the study goes on
        return NotebookOutcome(output, time.perf_counter() - t0,
                               _runner_error(type(e).__name__, f"the study runner could not execute this notebook: {e}"))


def _runner_error(ename: str, evalue: str) -> dict[str, Any]:
    """An error the runner found (not raised by a notebook cell), shaped like a notebook's."""
    return {"cell_index": None, "execution_count": None, "source": "", "ename": ename, "evalue": evalue,
            "traceback": []}


def _record_error(path: Path, outcome: NotebookOutcome, **extra: Any) -> None:
    write_json_atomic(path, {**extra, **outcome.error, "notebook": outcome.path.name,
                             "time": datetime.now(timezone.utc).isoformat(timespec="seconds")})


def _execute_job(kernel: WarmKernel, job: Job, recorded: bool, ctx: "Context") -> NotebookOutcome:
    """One job in ``kernel``: clear its directory, execute its notebook, record errors.

    ``recorded``: the job is complete but its notebook was interrupted; the notebook is executed
    again on the recorded metrics.json (the run is not redone).
    """
    run_dir = job.out_dir
    try:
        if not recorded:
            _fresh_dir(run_dir)
    except OSError as e:
        return _record_fault(job, ctx, NotebookOutcome(run_dir / job.output, 0.0, _runner_error(
            type(e).__name__, f"the run directory {run_dir} cannot be written: {e}")))
    outcome = _attempt(kernel, job, recorded, ctx)
    if outcome.error is not None and poisons_process(outcome.error) and not ctx.stop.is_set():
        outcome = _redo_in_a_fresh_kernel(kernel, job, recorded, ctx, outcome)
    elif outcome.error is not None and out_of_memory(outcome.error):
        _release_after_oom(kernel, job, outcome)
    return _record_fault(job, ctx, outcome)


def _redo_in_a_fresh_kernel(kernel: WarmKernel, job: Job, recorded: bool, ctx: "Context",
                            outcome: NotebookOutcome) -> NotebookOutcome:
    """After a CUDA error that poisons ``kernel``'s process: replace that kernel (the other workers
    go on) and execute the job again in the fresh one, once; the outcome of the second attempt
    (``redone`` says why it was redone), or the first when the kernel could not be replaced."""
    first = f"{outcome.error['ename']}: {_first_line(outcome.error['evalue'])}"
    log.warning("kernel %d: %s in %s; replacing the kernel and redoing the run", kernel.index, first, job.id)
    problem = _replace(kernel)
    try:
        if not recorded:
            _fresh_dir(job.out_dir)
    except OSError as e:
        problem = problem or f"the run directory {job.out_dir} cannot be written: {e}"
    if problem:
        outcome.error["evalue"] = f"{outcome.error['evalue']} (then {problem})"
        return outcome
    again = _attempt(kernel, job, recorded, ctx)
    if again.error is None:
        again.redone = f"{first} (kernel {kernel.index} replaced, the run redone)"
    elif poisons_process(again.error):
        again.error["evalue"] = f"{again.error['evalue']} (again in a fresh kernel: the run itself causes it)"
        _replace(kernel)  # the next run gets a usable process
    return again


def _release_after_oom(kernel: WarmKernel, job: Job, outcome: NotebookOutcome) -> None:
    """After a run ran out of GPU memory: add the settings to lower to its error and release the
    kernel's memory (a kernel that cannot is replaced); the worker goes on in it."""
    outcome.error["remedy"] = oom_remedy(dict(job.params).get("contract", {}).get("run"))
    try:
        kernel.run_code(RELEASE)
    except Exception as e:  # noqa: BLE001 - a kernel that cannot release is replaced
        log.warning("kernel %d: could not release memory after %s (%s); replacing it", kernel.index, job.id, e)
        _replace(kernel)


def _attempt(kernel: WarmKernel, job: Job, recorded: bool, ctx: "Context") -> NotebookOutcome:
    """Execute the job's notebook once in ``kernel``; a notebook that finished without a complete
    record gets the error that says why (``_unfinished``)."""
    run_dir = job.out_dir
    params = job.parameters(ctx.params_path, ctx.outputs, ctx.threads, recorded)
    outcome = _execute_safely(kernel, _notebook(job.notebook), run_dir / job.output, params, run_dir)
    if outcome.error is None:
        outcome.error = _unfinished(job)
    return outcome


def _replace(kernel: WarmKernel) -> str | None:
    """End ``kernel``'s process and start a fresh one (this worker only); None, or why it failed."""
    try:
        kernel.restart()
    except Exception as e:  # noqa: BLE001 - the next job tries again (``execute`` restarts a dead kernel)
        return f"the kernel could not be replaced: {type(e).__name__}: {e}"
    return None


def _first_line(text: Any) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0] if lines else ""


def _fresh_dir(run_dir: Path) -> None:
    """An empty ``run_dir`` (an unfinished earlier attempt is removed)."""
    if run_dir.exists() or run_dir.is_symlink():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)


def _unfinished(job: Job) -> dict[str, Any] | None:
    """Why a job whose notebook ran to its end is not a complete run (None: it is)."""
    missing = [name for name in ("history.json", "metrics.json", *job.requires) if not (job.out_dir / name).exists()]
    if missing:
        return _runner_error("MissingMetrics", "the notebook finished without writing " + ", ".join(missing))
    why = _set_aside_invalid(job.out_dir, job.kind)
    return None if why is None else _runner_error(*why)


def _set_aside_invalid(run_dir: Path, kind: str = "run") -> tuple[str, str] | None:
    """When a run's record lacks what the results table reads (``kdlab.study.records``): move its
    ``metrics.json`` aside (the run is then not done) and return (error name, message):
    ``NonFiniteMetrics`` (``metrics.nonfinite.json``) when only measured values are not finite,
    else ``InvalidRecord`` (``metrics.invalid.json``); None for a complete record."""
    problems = record_problems(run_dir, kind)
    if not problems:
        return None
    ename, aside = (("NonFiniteMetrics", "metrics.nonfinite.json") if only_nonfinite(problems)
                    else ("InvalidRecord", "metrics.invalid.json"))
    if (run_dir / "metrics.json").exists():
        os.replace(run_dir / "metrics.json", run_dir / aside)
    return ename, f"{'; '.join(problems[:3])} (the metrics are kept in {aside})"


def _record_fault(job: Job, ctx: "Context", outcome: NotebookOutcome) -> NotebookOutcome:
    """Write the job's ``error.json`` when it failed (not when an interrupted study killed it);
    a directory that cannot take it leaves the failure to the study's summary."""
    if outcome.error is not None and not ctx.stop.is_set():
        try:
            _record_error(job.out_dir / "error.json", outcome, run_id=job.id)
        except OSError:
            pass
    return outcome


def papermill_run(notebook: str, output: str, parameters: dict[str, Any], cwd: str, kernel_name: str = KERNEL_NAME) -> dict[str, Any]:
    """Execute the run notebook with papermill in a fresh kernel (how a run executes on a Ray
    worker); returns its metrics. Raises (papermill's ``PapermillExecutionError``) when a cell
    fails: the Ray executor records that as the run's ``error.json``. The run's folder is its
    contract's ``out_dir``."""
    import papermill as pm

    run_dir = Path(parameters["contract"]["out_dir"])
    if run_dir.exists() and record_problems(run_dir):
        shutil.rmtree(run_dir)  # an unfinished earlier attempt
    run_dir.mkdir(parents=True, exist_ok=True)
    pm.execute_notebook(notebook, output, parameters=parameters, kernel_name=kernel_name, cwd=cwd, progress_bar=False)
    why = _set_aside_invalid(run_dir)
    if why:
        raise ValueError(": ".join(why))
    return json.loads((run_dir / "metrics.json").read_text())


def _run_on_ray(address: str, todo: list[Job], ctx: "Context", on_done: Callable[[str, dict | None], None],
                num_gpus_per_task: float) -> None:
    """The grid on a Ray cluster: one task per cell, each executing the run notebook with
    papermill on its worker (so every run still leaves its executed notebook). Same resume
    (complete runs are skipped) and failure (``error.json``, the study goes on) semantics."""

    specs = []
    for job in todo:
        run_dir = job.out_dir
        with contextlib.suppress(OSError):  # an incomplete run (truncated history.json) is not skipped
            (run_dir / "metrics.json").unlink(missing_ok=True)
        params = job.parameters(ctx.params_path, ctx.outputs, ctx.threads, False)
        specs.append(RunSpec(str(run_dir), papermill_run, dict(notebook=str(_notebook(job.notebook)),
                                                                output=str(run_dir / job.output),
                                                                parameters=params, cwd=str(run_dir.parent))))

    def relay(o) -> None:
        job = todo[o.index]
        on_done(job.id, None if o.status in ("done", "skipped") else {"ename": "RayTaskError",
                                                                           "evalue": (o.error or "").strip().splitlines()[-1:] or [""]})

    run_on_ray(address, specs, num_gpus_per_task=num_gpus_per_task, on_result=relay,
               runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(NOTEBOOKS_DIR.parent / "src"),
                                                                          os.environ.get("PYTHONPATH", "")])}})


def _worker(kernel: WarmKernel, todo: queue.Queue, done: queue.Queue, ctx: "Context") -> None:
    """A worker's loop: take the next (job, recorded) until none is left or the study stops."""
    while not ctx.stop.is_set():
        try:
            job, recorded = todo.get_nowait()
        except queue.Empty:
            return
        done.put((job, recorded, _execute_job(kernel, job, recorded, ctx), kernel.index))


@dataclass
class Context:
    """What the phases and the workers of one study share (``kdlab.study.runner``)."""

    study_dir: Path
    outputs: Path
    params_path: Path
    threads: int
    progress: bool
    kernels: list[WarmKernel]
    t_study: float
    timing: dict[str, Any]
    invocation: dict[str, Any]
    stop: threading.Event = field(default_factory=threading.Event)
    failed: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    redone: list[tuple[str, str]] = field(default_factory=list)  # (job id, why it was redone)

    def save_timing(self) -> None:
        inv = self.invocation
        inv["wall_s"] = round(time.perf_counter() - self.t_study, 3)
        kernel_time = len(self.kernels) * inv["wall_s"]
        inv["overhead_fraction"] = ((inv["runs_overhead_s"] + inv["kernel_start_s"]) / kernel_time
                                    if kernel_time > 0 else None)
        write_json_atomic(self.study_dir / "timing.json", self.timing)


def _run_jobs(todo: list[tuple[Job, bool]], ctx: Context, desc: str) -> None:
    """Execute ``todo`` on the warm kernels (one queue, one worker per kernel), recording each
    job's timing (notebook wall time, the job's own ``wall_s``, the overhead) and failures."""
    from tqdm.auto import tqdm

    work: queue.Queue = queue.Queue()
    for item in todo:
        work.put(item)
    done: queue.Queue = queue.Queue()
    futures = [k.submit(_worker, k, work, done, ctx) for k in ctx.kernels] if todo else []
    bar = tqdm(total=len(todo), desc=desc, unit="run", disable=not ctx.progress, dynamic_ncols=True)
    finished, inv = 0, ctx.invocation
    while finished < len(todo):
        try:
            job, recorded, outcome, worker = done.get(timeout=0.5)
        except queue.Empty:
            if all(f.done() for f in futures) and done.empty():
                for f in futures:
                    f.result()  # a worker died: surface its exception
                break
            continue
        finished += 1
        entry: dict[str, Any] = {"notebook_s": round(outcome.seconds, 3), "worker": worker,
                                 "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if outcome.redone:
            entry["redone"] = outcome.redone
            ctx.redone.append((job.id, outcome.redone))
        if outcome.error is None and recorded:
            entry["recorded"] = True  # notebook shown again; the run's timing is its first one's
            entry = {**ctx.timing["runs"].get(job.id, {}), **entry}
        elif outcome.error is None:
            wall = json.loads((job.out_dir / "metrics.json").read_text()).get("wall_s")
            entry.update(wall_s=wall, overhead_s=round(outcome.seconds - wall, 3) if wall is not None else None)
            inv["runs_done"] += 1
            inv["runs_overhead_s"] = round(inv["runs_overhead_s"] + (entry["overhead_s"] or 0.0), 3)
        else:
            entry["error"] = outcome.error["ename"]
            inv["runs_failed"] += 1
            ctx.failed.append((job.id, outcome.error))
        ctx.timing["runs"][job.id] = entry
        ctx.save_timing()
        bar.update(1)
        bar.set_postfix(failed=len(ctx.failed))
    bar.close()
