"""The study runner behind ``kdlab study PARAMS --workers N``.

A study is one profile's whole grid. The runner

1. validates the profile (bad keys and values fail before any work) and keeps the resolved
   profile as ``outputs/<study>/params.yaml``; a rerun must use the same settings (only the grid
   lists policies, kls, lrs, seeds and lambdas may grow or shrink);
2. builds or reuses the models by executing ``notebooks/00_teachers.ipynb``
   (-> ``teachers/00_teachers.ipynb``, ``models.json``);
3. executes ``notebooks/10_run.ipynb`` once per grid cell into ``runs/<run_id>/run.ipynb``; the
   run writes ``metrics.json`` atomically and last, so a run directory with it is complete and is
   never redone, and one without it is cleared and redone: a study killed at any moment finishes
   when the same command runs again. A run whose notebook raises gets ``error.json`` (failing
   cell, error name and message) next to its partial notebook, and the study goes on;
4. collects ``results.parquet`` (``notebooks/20_grid.ipynb`` -> ``grid.ipynb``) and writes the
   report (``notebooks/30_report.ipynb`` -> ``report.ipynb`` -> ``report.html``, code hidden).

Follow-ups (``kdlab.followups``) run as jobs with the same resume and failure rules: the style
runs (``style.enabled``: ``notebooks/10_run.ipynb`` with the style teacher, into ``style/``) next
to the grid, then the RLVR starts (``rlvr.enabled``: ``notebooks/11_rlvr.ipynb`` into ``rlvr/``)
from the students the grid saved for them; their report sections are ``91_rlvr`` / ``92_style``.
A profile's ``companions`` are run first as studies of their own (``<name>-<suffix>``, the main
grid under the companion's overrides, no report) and shown in section ``93_robustness``.

Notebooks are executed papermill-style (papermill parameterizes them and tracks cell state) but
in warm kernels: each worker owns one Jupyter kernel for the whole study and runs notebook after
notebook in it, resetting the user namespace in between, so only the first notebook per worker
pays for the kernel start and the imports. ``timing.json`` records each run's notebook wall time
minus the run's own ``wall_s`` (the notebook overhead) and the kernel start-ups.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import queue
import re
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import nbformat
import yaml

from .config import ConfigError, Profile, companion_profile, from_dict, load_profile, read_yaml, to_dict
from .distill import RunConfig
from .followups import RLVRStart, rlvr_starts, students_to_save, style_cells
from .runs import run_config_from

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
KERNEL_NAME = "python3"
TEACHERS_NB, RUN_NB, GRID_NB, REPORT_NB = "00_teachers.ipynb", "10_run.ipynb", "20_grid.ipynb", "30_report.ipynb"
RLVR_NB = "11_rlvr.ipynb"
ANALYSIS_NBS = ("40_teaching_kl.ipynb", "50_gradients.ipynb", "60_spectrum.ipynb", "70_statistics.ipynb",
                "80_explorer.ipynb", "90_coverage.ipynb")
# Report sections of the follow-ups, executed only when the profile runs them.
RLVR_REPORT_NB, STYLE_REPORT_NB, ROBUSTNESS_NB = "91_rlvr.ipynb", "92_style.ipynb", "93_robustness.ipynb"


def analysis_notebooks(profile: Profile) -> list[str]:
    """The analysis notebooks of a study's report, in order: ``ANALYSIS_NBS``, then the RLVR
    (``rlvr.enabled``), style (``style.enabled``) and robustness (``companions``) sections."""
    return [*ANALYSIS_NBS, *([RLVR_REPORT_NB] if profile.rlvr.enabled else []),
            *([STYLE_REPORT_NB] if profile.style.enabled else []), *([ROBUSTNESS_NB] if profile.companions else [])]
KERNEL_STARTUP_TIMEOUT_S = 180
# Grid lists that may change between invocations of one study (each run is identified by its cell).
GRID_LISTS = ("policies", "kls", "lrs", "seeds", "lambdas")

log = logging.getLogger("kdlab.study")

# Imported once per kernel at start-up, so that no run pays for them. gc.freeze() moves the
# (long-lived) module objects out of the collector's sight: a full collection then costs
# milliseconds instead of ~0.4 s, and the reset below can afford one per notebook.
_WARM_IMPORTS = """
import gc
import matplotlib.pyplot, pandas, seaborn, torch
import kdlab.results, kdlab.runs, kdlab.teachers
gc.collect()
gc.freeze()
"""
# Run before every notebook in a warm kernel: a fresh user namespace (modules stay imported),
# no figures left open, the notebook's working directory and execution counts from 1.
_RESET = """
%reset -f
def _kdlab_prepare(cwd):
    import gc, os, sys
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
    os.chdir(cwd)
    gc.collect()
    gc.freeze()  # what survives a reset is module state (imports, caches): keep it frozen too
    get_ipython().execution_count = 1
_kdlab_prepare({cwd!r})
del _kdlab_prepare
"""
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ------------------------------------------------------------------------------------ the grid


def _lam_key(lam: float) -> float:
    return float(lam) + 0.0  # -0.0 -> 0.0, so that run ids do not differ by the sign of zero


def expand_grid(profile: Profile) -> list[RunConfig]:
    """Every run of the study, in grid order, without duplicates (by run_id).

    tasks x policies x kls x lrs x seeds, then the lambda spectrum: lambda_tasks x lambdas x kls x
    lrs x seeds with policy "lambda"; a lambda of exactly -1 (+1) is the off (on) run, so it is
    not repeated when that run is already in the grid.
    """
    g = profile.grid
    cells: dict[str, RunConfig] = {}

    def add(cfg: RunConfig) -> None:
        cells.setdefault(cfg.run_id, cfg)

    for task in g.tasks:
        for policy in g.policies:
            for kl in g.kls:
                for lr in g.lrs:
                    for seed in g.seeds:
                        add(run_config_from(profile, task=task, policy=policy, kl=kl, lr=lr, seed=seed))
    for task in g.lambda_tasks:
        for lam in g.lambdas:
            lam = _lam_key(lam)
            policy = {-1.0: "off", 1.0: "on"}.get(lam, "lambda")
            for kl in g.kls:
                for lr in g.lrs:
                    for seed in g.seeds:
                        add(run_config_from(profile, task=task, policy=policy, lam=lam, kl=kl, lr=lr, seed=seed))
    return list(cells.values())


def schedule(cells: list[RunConfig]) -> list[RunConfig]:
    """The order runs are started in: per task, seed, lr and KL, the rollout policies next to each
    other, so that parallel workers start on different policies (and do not both build the same
    OffPD cache at once)."""
    task_rank = {t: i for i, t in enumerate(dict.fromkeys(c.task for c in cells))}
    return sorted(cells, key=lambda c: (task_rank[c.task], c.seed, c.lr, c.kl, c.lam))


def study_dir_of(profile: Profile, outputs: str | Path) -> Path:
    """``<outputs>/<profile.name>``: everything one study writes."""
    return Path(outputs).resolve() / profile.name


@dataclass(frozen=True)
class Job:
    """One notebook execution of a study: a grid cell, a style run or an RLVR start.

    ``id`` names it in timing.json and in messages (a grid cell's run_id; ``style/<run_id>``;
    ``rlvr/<start_id>_s<seed>``); ``notebook`` is executed into ``out_dir/<output>`` with
    ``params`` (besides the study-wide ones); ``requires`` lists files (relative to ``out_dir``)
    that must exist besides ``metrics.json`` for the job to count as complete (a grid run whose
    student an RLVR start needs: ``student/config.json``)."""

    id: str
    notebook: str
    out_dir: Path
    params: tuple[tuple[str, Any], ...]
    output: str = "run.ipynb"
    requires: tuple[str, ...] = ()

    def complete(self) -> bool:
        return run_is_complete(self.out_dir) and all((self.out_dir / r).exists() for r in self.requires)


def run_job(study_dir: Path, cfg: RunConfig, save: set[str] = frozenset(), style: bool = False) -> Job:
    """The job of a grid cell (``runs/<run_id>``) or of a style run (``style/<run_id>``); a run in
    ``save`` keeps its distilled student."""
    keep = cfg.run_id in save
    return Job(id=("style/" if style else "") + cfg.run_id, notebook=RUN_NB,
               out_dir=study_dir / ("style" if style else "runs") / cfg.run_id,
               params=(("task", cfg.task), ("policy", cfg.policy), ("lam", cfg.lam), ("kl", cfg.kl), ("lr", cfg.lr),
                       ("seed", cfg.seed), ("save_student", keep), ("style", style)),
               requires=("student/config.json",) if keep else ())


def rlvr_job(study_dir: Path, start: RLVRStart) -> Job:
    """The job of one RLVR start (``rlvr/<start_id>_s<seed>``)."""
    return Job(id=f"rlvr/{start.job_id}", notebook=RLVR_NB, out_dir=study_dir / "rlvr" / start.job_id,
               params=(("start", start.spec), ("seed", start.seed)), output="rlvr.ipynb")


def run_is_complete(run_dir: Path) -> bool:
    """A run is complete when its ``metrics.json`` (written atomically, last) holds a JSON object."""
    try:
        return isinstance(json.loads((run_dir / "metrics.json").read_text()), dict)
    except (OSError, json.JSONDecodeError):
        return False


def notebook_finished(path: Path) -> bool:
    """True when the executed notebook at ``path`` ran to its end without an error (papermill's
    metadata: an end time and no exception; it is saved atomically, so it is always whole)."""
    try:
        meta = json.loads(path.read_text())["metadata"]["papermill"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False
    return meta.get("end_time") is not None and not meta.get("exception")


# ------------------------------------------------------------------------- executing notebooks


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename, so that no reader (and no
    crash) ever sees half a file; the file gets the usual permissions (0666 minus the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_json(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _write_notebook_atomic(nb: nbformat.NotebookNode, path: str | Path) -> None:
    write_text_atomic(path, nbformat.writes(nb))


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
                _write_notebook_atomic(self.nb, self.output_path)
            self.last_save_time = self.now()

        def cell_start(self, cell, cell_index=None, **kwargs: Any) -> None:
            self.current_cell = cell_index
            super().cell_start(cell, cell_index, **kwargs)

    return dict(client=PapermillNotebookClient, manager=AtomicExecutionManager, error=PapermillExecutionError,
                prepare=prepare_notebook_metadata, raise_errors=raise_for_execution_errors,
                remove_markers=remove_error_markers, load=load_notebook_node, parameterize=parameterize_notebook)


@dataclass
class NotebookOutcome:
    """One executed notebook: where it is, its wall time (s) and, if it raised, the error."""

    path: Path
    seconds: float
    error: dict[str, Any] | None = None


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
        self._run(self.km.start_kernel(cwd=str(self.cwd), env=self.env, **streams))
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
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, output)
        return {"cell_index": index, "execution_count": e.exec_count, "source": e.source, "ename": e.ename,
                "evalue": e.evalue, "traceback": [_ANSI.sub("", line) for line in e.traceback or []]}
    return None


# ------------------------------------------------------------------------------ study plumbing


def _notebook(name: str) -> Path:
    path = NOTEBOOKS_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"study notebook {path} is missing (kdlab runs the notebooks of its source tree)")
    return path


def _check_kernel(name: str) -> str | None:
    """None if the Jupyter kernel ``name`` is installed, else a message saying how to install it."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return (f"Jupyter kernel {name!r} is not installed; install it with "
                f"`{sys.executable} -m ipykernel install --sys-prefix --name {name}`")
    return None


def _kernel_env(threads: int) -> dict[str, str]:
    """The kernels' environment: this one, plus kdlab's source on the path (the kernels import the
    same kdlab), per-worker thread counts and inline figures."""
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1])
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


class StudyBusy(RuntimeError):
    """Another process holds the study directory's lock."""


class _StudyLock:
    """An exclusive ``flock`` on ``<study>/.lock``; the OS releases it when the process dies."""

    def __init__(self, study_dir: Path):
        self.path = study_dir / ".lock"
        self.fd: int | None = None

    def __enter__(self) -> "_StudyLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self.fd, 64).decode(errors="replace").strip()
            os.close(self.fd)
            raise StudyBusy(f"another kdlab study (pid {holder or '?'}) is running in {self.path.parent}") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, str(os.getpid()).encode())
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _check_params(study_dir: Path, profile: Profile) -> Path:
    """Keep the resolved profile as ``params.yaml``; refuse a rerun with other settings."""
    path = study_dir / "params.yaml"
    new = to_dict(profile)
    if path.exists():
        try:
            old = to_dict(from_dict(Profile, read_yaml(path.read_text())))
        except (ConfigError, yaml.YAMLError) as e:
            raise ConfigError(f"{path} (the parameters this study was run with) cannot be read by this kdlab: {e}; "
                              f"name this study differently (--set name=...) or remove {study_dir}") from None
        free = {"threads"} | {f"grid.{k}" for k in GRID_LISTS}
        diff = [(k, v, _flat(new).get(k)) for k, v in _flat(old).items() if k not in free and _flat(new).get(k) != v]
        if diff:
            key, was, now = diff[0]
            raise ConfigError(f"{study_dir} holds study {profile.name!r} run with other parameters ({key}: {was!r} "
                              f"there, {now!r} now); name this study differently (--set name=...) or remove {study_dir}")
    write_text_atomic(path, "# The resolved parameters of this study (written by kdlab study).\n"
                      + yaml.safe_dump(new, sort_keys=False))
    return path


def study_model_paths(profile: Profile, root: Path, progress: bool = True, train: bool = True) -> dict[str, Path]:
    """``kdlab.teachers.model_paths`` plus, when ``style.enabled``, ``"style-teacher"``: every model
    a study needs (FileNotFoundError naming a missing one when ``train`` is False)."""
    from .style_teacher import style_teacher_path
    from .teachers import model_paths

    paths = model_paths(profile, root, progress=progress, train=train)
    if profile.style.enabled:
        paths["style-teacher"] = style_teacher_path(profile, root, progress=progress, train=train)
    return paths


def _models_ready(profile: Profile, outputs: Path, study_dir: Path) -> bool:
    """True when every model exists and models.json (from a finished teachers notebook) lists them."""

    try:
        paths = study_model_paths(profile, outputs / "models", progress=False, train=False)
    except FileNotFoundError:
        return False
    models_json = study_dir / "models.json"
    if not models_json.exists() or not (study_dir / "teachers" / TEACHERS_NB).exists():
        return False
    try:
        listed = {str(Path(r["path"]).resolve()) for r in json.loads(models_json.read_text())}
    except (json.JSONDecodeError, KeyError, TypeError):
        return False
    return listed == {str(Path(p).resolve()) for p in paths.values()}


def _execute_safely(kernel: WarmKernel, notebook: Path, output: Path, parameters: dict[str, Any],
                    cwd: Path) -> NotebookOutcome:
    """``kernel.execute`` (on the kernel's thread), with a failure of the runner itself (a kernel
    that cannot be reset or restarted, ...) reported as the notebook's error instead of raised."""
    t0 = time.perf_counter()
    try:
        return kernel.execute(notebook, output, parameters, cwd)
    except Exception as e:  # noqa: BLE001 - recorded, and the study goes on
        return NotebookOutcome(output, time.perf_counter() - t0,
                               {"cell_index": None, "execution_count": None, "source": "", "ename": type(e).__name__,
                                "evalue": f"the study runner could not execute this notebook: {e}", "traceback": []})


def _record_error(path: Path, outcome: NotebookOutcome, **extra: Any) -> None:
    _write_json(path, {**extra, **outcome.error, "notebook": outcome.path.name,
                             "time": datetime.now(timezone.utc).isoformat(timespec="seconds")})


def _execute_job(kernel: WarmKernel, job: Job, recorded: bool, ctx: dict[str, Any]) -> NotebookOutcome:
    """One job in ``kernel``: clear its directory, execute its notebook, record errors.

    ``recorded``: the job is complete but its notebook was interrupted; the notebook is executed
    again on the recorded metrics.json (the run is not redone).
    """
    run_dir = job.out_dir
    if not recorded:
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished earlier attempt
        run_dir.mkdir(parents=True)
    params = {"params": str(ctx["params"]), "outputs": str(ctx["outputs"]), "overrides": {}, **dict(job.params),
              "out_dir": str(run_dir), "threads": ctx["threads"], "recorded": recorded}
    outcome = _execute_safely(kernel, _notebook(job.notebook), run_dir / job.output, params, run_dir)
    if outcome.error is None and not job.complete():
        outcome.error = {"cell_index": None, "execution_count": None, "source": "", "ename": "MissingMetrics",
                         "evalue": f"the notebook finished without writing {', '.join(('metrics.json',) + job.requires)}",
                         "traceback": []}
    if outcome.error is not None and not ctx["stop"].is_set():  # (an interrupted study killed it: no error)
        _record_error(run_dir / "error.json", outcome, run_id=job.id)
    return outcome


def papermill_run(notebook: str, output: str, parameters: dict[str, Any], cwd: str, kernel_name: str = KERNEL_NAME) -> dict[str, Any]:
    """Execute the run notebook with papermill in a fresh kernel (how a run executes on a Ray
    worker); returns its metrics. Raises (papermill's ``PapermillExecutionError``) when a cell
    fails: the Ray executor records that as the run's ``error.json``."""
    import papermill as pm

    run_dir = Path(parameters["out_dir"])
    if run_dir.exists() and not run_is_complete(run_dir):
        shutil.rmtree(run_dir)  # an unfinished earlier attempt
    run_dir.mkdir(parents=True, exist_ok=True)
    pm.execute_notebook(notebook, output, parameters=parameters, kernel_name=kernel_name, cwd=cwd, progress_bar=False)
    return json.loads((run_dir / "metrics.json").read_text())


def _run_on_ray(address: str, todo: list[Job], ctx: dict[str, Any], on_done: Callable[[str, dict | None], None],
                num_gpus_per_task: float) -> None:
    """The grid on a Ray cluster: one task per cell, each executing the run notebook with
    papermill on its worker (so every run still leaves its executed notebook). Same resume
    (complete runs are skipped) and failure (``error.json``, the study goes on) semantics."""
    from .distributed import RunSpec, run_on_ray

    specs = []
    for job in todo:
        run_dir = job.out_dir
        params = {"params": str(ctx["params"]), "outputs": str(ctx["outputs"]), "overrides": {}, **dict(job.params),
                  "out_dir": str(run_dir), "threads": ctx["threads"], "recorded": False}
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


def _worker(kernel: WarmKernel, todo: queue.Queue, done: queue.Queue, ctx: dict[str, Any]) -> None:
    """A worker's loop: take the next (job, recorded) until none is left or the study stops."""
    while not ctx["stop"].is_set():
        try:
            job, recorded = todo.get_nowait()
        except queue.Empty:
            return
        done.put((job, recorded, _execute_job(kernel, job, recorded, ctx), kernel.index))


def _export_html(notebooks: list[Path], html: Path) -> None:
    """The executed report, followed by the analysis notebooks, as one standalone HTML page with
    the code cells hidden (written atomically). A notebook that is missing is skipped."""
    from nbconvert import HTMLExporter

    combined = None
    for path in notebooks:
        if not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        if combined is None:
            combined = nb
        else:
            combined.cells.extend(c for c in nb.cells if "parameters" not in c.get("metadata", {}).get("tags", [])
                                  and "injected-parameters" not in c.get("metadata", {}).get("tags", []))
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(combined)
    write_text_atomic(html, body)


def _say(msg: str) -> None:
    print(msg, flush=True)


def _started(starts: list[Future], kernels: list[WarmKernel]) -> bool:
    """Wait for kernel start-ups; on a failure say why (and where the kernel's log is)."""
    for kernel, start in zip(kernels, starts):
        try:
            start.result()
        except Exception as e:  # noqa: BLE001 - reported; the study cannot run without its kernels
            print(f"kdlab study: could not start Jupyter kernel {kernel.index}: {type(e).__name__}: {e}"
                  + (f"\n  kernel log: {kernel.log_path}" if kernel.log_path else ""), file=sys.stderr)
            return False
    return True


def run_study(params: str | Path, outputs: Path, workers: int = 2, overrides: dict[str, Any] | None = None,
              progress: bool = True, ray_address: str | None = None, gpus_per_run: float = 1.0) -> int:
    """Run a whole study; returns the exit code (0: every run and the report succeeded, 1: some
    run or notebook failed, 2: the environment is not ready).

    Raises ``ConfigError`` (naming the key) for invalid parameters, before any work.
    ``workers`` warm kernels execute runs in parallel with ``profile.threads`` torch threads each
    (0: max(1, cores // workers)).

    A profile with ``companions`` runs each companion study first (``<outputs>/<name>-<suffix>``:
    the main grid under the companion's overrides, its results table, no report of its own), then
    its own study, whose report shows the companions beside its main grid (``companions.json``
    lists them). The exit code is the worst of all.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    t_study = time.perf_counter()
    profile = load_profile(params, overrides)
    companions = [companion_profile(profile, suffix) for suffix in profile.companions]
    for p in [profile, *companions]:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", p.name):
            raise ConfigError(f"name: {p.name!r} must be a plain directory name (letters, digits, '_', '.', '-')")
        if not expand_grid(p):
            raise ConfigError(f"grid: the study {p.name!r} has no runs (grid.tasks, grid.policies, grid.kls, grid.lrs and "
                              "grid.seeds, or grid.lambdas with grid.lambda_tasks, must all be non-empty)")
    for name in [TEACHERS_NB, RUN_NB, RLVR_NB, GRID_NB, REPORT_NB, *analysis_notebooks(profile)]:
        _notebook(name)
    problem = _check_kernel(KERNEL_NAME)
    if problem:
        print(f"kdlab study: {problem}", file=sys.stderr)
        return 2
    outputs = Path(outputs).resolve()
    rc = 0
    for companion in companions:
        _say(f"companion study {companion.name} (robustness variant of {profile.name})")
        rc = max(rc, _run_profile(companion, outputs, workers, progress, time.perf_counter(), ray_address, gpus_per_run,
                                  report=False))
    study_dir = study_dir_of(profile, outputs)
    if companions or (study_dir / "companions.json").exists():
        study_dir.mkdir(parents=True, exist_ok=True)
        _write_json(study_dir / "companions.json",
                    [{"suffix": suffix, "name": c.name, "study_dir": str(study_dir_of(c, outputs)),
                      "overrides": profile.companions[suffix]} for suffix, c in zip(profile.companions, companions)])
    return max(rc, _run_profile(profile, outputs, workers, progress, t_study, ray_address, gpus_per_run))


def _run_profile(profile: Profile, outputs: Path, workers: int, progress: bool, t_study: float,
                 ray_address: str | None, gpus_per_run: float, report: bool = True) -> int:
    """One study (no companions) under its lock; see ``run_study``."""
    study_dir = study_dir_of(profile, outputs)
    study_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = _StudyLock(study_dir).__enter__()
    except StudyBusy as e:
        print(f"kdlab study: {e}", file=sys.stderr)
        return 2
    try:
        return _run_locked(profile, expand_grid(profile), study_dir, outputs, workers, progress, t_study, ray_address,
                           gpus_per_run, report)
    finally:
        lock.__exit__(None, None, None)


def _pending(jobs: list[Job], order: list[Job] | None = None) -> list[tuple[Job, bool]]:
    """(job, recorded) to execute: incomplete jobs (in ``order``, default ``jobs``), then complete
    ones whose notebook was cut short (shown again on their recorded metrics)."""
    todo = [(j, False) for j in (order or jobs) if not j.complete()]
    todo += [(j, True) for j in jobs if j.complete() and not notebook_finished(j.out_dir / j.output)]
    return todo


def _run_jobs(todo: list[tuple[Job, bool]], kernels: list[WarmKernel], ctx: dict[str, Any], timing: dict[str, Any],
              invocation: dict[str, Any], failed: list[tuple[str, dict[str, Any]]], save_timing: Callable[[], None],
              desc: str, progress: bool) -> None:
    """Execute ``todo`` on the warm ``kernels`` (one queue, one worker per kernel), recording each
    job's timing (notebook wall time, the job's own ``wall_s``, the overhead) and failures."""
    from tqdm.auto import tqdm

    work: queue.Queue = queue.Queue()
    for item in todo:
        work.put(item)
    done: queue.Queue = queue.Queue()
    futures = [k.submit(_worker, k, work, done, ctx) for k in kernels] if todo else []
    bar = tqdm(total=len(todo), desc=desc, unit="run", disable=not progress, dynamic_ncols=True)
    finished = 0
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
        if outcome.error is None and recorded:
            entry["recorded"] = True  # notebook shown again; the run's timing is its first one's
            entry = {**timing["runs"].get(job.id, {}), **entry}
        elif outcome.error is None:
            wall = json.loads((job.out_dir / "metrics.json").read_text()).get("wall_s")
            entry.update(wall_s=wall, overhead_s=round(outcome.seconds - wall, 3) if wall is not None else None)
            invocation["runs_done"] += 1
            invocation["runs_overhead_s"] = round(invocation["runs_overhead_s"] + (entry["overhead_s"] or 0.0), 3)
        else:
            entry["error"] = outcome.error["ename"]
            invocation["runs_failed"] += 1
            failed.append((job.id, outcome.error))
        timing["runs"][job.id] = entry
        save_timing()
        bar.update(1)
        bar.set_postfix(failed=len(failed))
    bar.close()


def _run_locked(profile: Profile, cells: list[RunConfig], study_dir: Path, outputs: Path, workers: int,
                progress: bool, t_study: float, ray_address: str | None = None, gpus_per_run: float = 1.0,
                report: bool = True) -> int:
    import pandas as pd
    from tqdm.auto import tqdm

    params_path = _check_params(study_dir, profile)
    save = students_to_save(profile)
    grid_jobs = [run_job(study_dir, c, save) for c in cells]
    order = [run_job(study_dir, c, save) for c in schedule(cells)]
    style_jobs = [run_job(study_dir, c, style=True) for c in style_cells(profile)]
    rlvr_jobs = [rlvr_job(study_dir, s) for s in rlvr_starts(profile)]
    extra_jobs = style_jobs + rlvr_jobs
    todo = _pending(grid_jobs, order)
    todo_extra = _pending(extra_jobs)
    cores = _cores()
    threads = profile.threads or max(1, cores // workers)
    n_kernels = max(1, min(workers, len(todo) + len(todo_extra)))
    reuse_models = _models_ready(profile, outputs, study_dir)
    n_redo = sum(recorded for _, recorded in todo)
    extra = (f"; {len(style_jobs)} style runs and {len(rlvr_jobs)} RLVR runs "
             f"({len(extra_jobs) - sum(not r for _, r in todo_extra)} already complete)") if extra_jobs else ""
    _say(f"study {profile.name}: {len(cells)} runs ({len(cells) - len(todo) + n_redo} already complete"
         + (f", {n_redo} of them with an interrupted notebook" if n_redo else "") + f"){extra}, "
         f"{n_kernels} worker(s) x {threads} torch thread(s) -> {study_dir}")

    timing_path = study_dir / "timing.json"
    timing: dict[str, Any] = {"runs": {}, "invocations": []}
    if timing_path.exists():
        try:
            timing = {**timing, **json.loads(timing_path.read_text())}
        except json.JSONDecodeError:
            pass
    invocation: dict[str, Any] = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                  "workers": n_kernels, "threads_per_worker": threads, "runs_done": 0,
                                  "runs_failed": 0, "kernel_start_s": 0.0, "runs_overhead_s": 0.0, "notebooks": {}}
    timing["invocations"].append(invocation)

    def save_timing() -> None:
        invocation["wall_s"] = round(time.perf_counter() - t_study, 3)
        kernel_time = n_kernels * invocation["wall_s"]
        invocation["overhead_fraction"] = ((invocation["runs_overhead_s"] + invocation["kernel_start_s"]) / kernel_time
                                           if kernel_time > 0 else None)
        _write_json(timing_path, timing)

    env = _kernel_env(threads)
    kernels = [WarmKernel(i, study_dir, env, log_path=study_dir / "logs" / f"kernel-{i}.log") for i in range(n_kernels)]
    failed: list[tuple[str, dict[str, Any]]] = []
    stop = threading.Event()
    try:
        starts = [k.submit(k.start) for k in kernels]
        ctx = {"study_dir": study_dir, "outputs": outputs, "params": params_path, "threads": threads, "stop": stop}
        nb_params = {"params": str(params_path), "outputs": str(outputs), "overrides": {}, "threads": threads}

        # 1. models
        if reuse_models:
            _say("models: reusing the built models (models.json)")
        else:
            _say(f"models: building or loading them ({study_dir / 'teachers' / TEACHERS_NB})")
            teachers_dir = study_dir / "teachers"
            teachers_dir.mkdir(exist_ok=True)
            k0 = kernels[0]
            if not _started(starts[:1], kernels):
                return 2
            outcome = k0.submit(_execute_safely, k0, _notebook(TEACHERS_NB), teachers_dir / TEACHERS_NB,
                                {**nb_params, "threads": profile.threads or cores}, teachers_dir).result()
            invocation["notebooks"]["teachers_s"] = round(outcome.seconds, 3)
            if outcome.error:
                _record_error(teachers_dir / "error.json", outcome)
                print(f"kdlab study: the teachers notebook failed: {outcome.error['ename']}: {outcome.error['evalue']}"
                      f"\n  see {outcome.path}", file=sys.stderr)
                save_timing()
                return 1
            (teachers_dir / "error.json").unlink(missing_ok=True)
        if not _started(starts, kernels):
            return 2
        invocation["kernel_start_s"] = round(sum(k.start_s for k in kernels), 3)
        save_timing()

        # 2. runs: the grid (on Ray, or on the local workers with the style runs), then the RLVR
        # follow-up, which starts from students the grid saved
        if ray_address:
            bar = tqdm(total=sum(not r for _, r in todo), desc=f"study {profile.name} (ray)", unit="run", disable=not progress,
                       dynamic_ncols=True)

            def on_done(run_id: str, error: dict | None) -> None:
                if error is not None:
                    failed.append((run_id, {"ename": error["ename"], "evalue": " ".join(error["evalue"])}))
                    invocation["runs_failed"] += 1
                else:
                    invocation["runs_done"] += 1
                bar.update(1)
                bar.set_postfix(failed=len(failed))

            _run_on_ray(ray_address, [j for j, recorded in todo if not recorded], ctx, on_done, gpus_per_run)
            bar.close()
            todo = []
        style_todo = [(j, r) for j, r in todo_extra if j.notebook == RUN_NB]
        _run_jobs(todo + style_todo, kernels, ctx, timing, invocation, failed, save_timing, f"study {profile.name}",
                  progress)
        rlvr_todo = _pending([j for j in extra_jobs if j.notebook == RLVR_NB])
        if rlvr_todo:
            _run_jobs(rlvr_todo, kernels, ctx, timing, invocation, failed, save_timing, f"study {profile.name} (RLVR)",
                      progress)
        invocation["kernel_start_s"] = round(sum(k.start_s for k in kernels), 3)  # restarts included

        # 3. results table and report
        k0 = kernels[0]
        report_ok = True
        outcome = k0.submit(_execute_safely, k0, _notebook(GRID_NB), study_dir / "grid.ipynb",
                            {"study_dir": str(study_dir)}, study_dir).result()
        invocation["notebooks"]["grid_s"] = round(outcome.seconds, 3)
        if outcome.error or not (study_dir / "results.parquet").exists():
            report_ok = False
            if outcome.error:
                _record_error(study_dir / "grid_error.json", outcome)
            _say(f"kdlab study: the grid notebook failed: {outcome.error and outcome.error['ename']}; see {outcome.path}")
        else:
            (study_dir / "grid_error.json").unlink(missing_ok=True)
            n_rows = len(pd.read_parquet(study_dir / "results.parquet"))
            if n_rows == 0:
                _say("no completed runs: no report")
            elif not report:
                _say(f"results: {study_dir / 'results.parquet'} (a companion study: shown in its main study's report)")
            else:
                outcome = k0.submit(_execute_safely, k0, _notebook(REPORT_NB), study_dir / "report.ipynb",
                                    {"study_dir": str(study_dir)}, study_dir).result()
                invocation["notebooks"]["report_s"] = round(outcome.seconds, 3)
                if outcome.error:
                    report_ok = False
                    _record_error(study_dir / "report_error.json", outcome)
                    _say(f"kdlab study: the report notebook failed: {outcome.error['ename']}: {outcome.error['evalue']}")
                else:
                    (study_dir / "report_error.json").unlink(missing_ok=True)
                sections = [study_dir / "report.ipynb"]
                for name in analysis_notebooks(profile):  # 50 (gradients) before 70 (its scoreboard reads bound.csv)
                    out = study_dir / "analysis" / name
                    out.parent.mkdir(exist_ok=True)
                    outcome = k0.submit(_execute_safely, k0, _notebook(name), out, {"study_dir": str(study_dir)},
                                        out.parent).result()
                    invocation["notebooks"][name.split(".")[0] + "_s"] = round(outcome.seconds, 3)
                    err_path = out.with_name(out.stem + "_error.json")
                    if outcome.error:
                        report_ok = False
                        _record_error(err_path, outcome)
                        _say(f"kdlab study: analysis notebook {name} failed: {outcome.error['ename']}: {outcome.error['evalue']}")
                    else:
                        err_path.unlink(missing_ok=True)
                    sections.append(out)
                _export_html(sections, study_dir / "report.html")
        save_timing()
    except BaseException:
        stop.set()
        for k in kernels:
            k.kill()
        raise
    finally:
        for k in kernels:
            k.close()

    complete = sum(run_is_complete(study_dir / "runs" / c.run_id) for c in cells)
    extras = (f" (+ {sum(j.complete() for j in extra_jobs)}/{len(extra_jobs)} style and RLVR runs)"
              if extra_jobs else "")
    share = invocation.get("overhead_fraction")
    _say(f"study {profile.name}: {complete}/{len(cells)} runs complete{extras} in {invocation['wall_s']:.0f} s; notebook "
         f"overhead {invocation['runs_overhead_s'] + invocation['kernel_start_s']:.1f} s"
         + (f" ({100 * share:.1f}% of worker time)" if share is not None else ""))
    if (study_dir / "report.html").exists():
        _say(f"report: {study_dir / 'report.html'}")
    if failed:
        _say(f"{len(failed)} run(s) failed:")
        for run_id, err in failed:
            where = run_id if "/" in run_id else f"runs/{run_id}"
            _say(f"  {run_id}: {err['ename']}: {str(err['evalue']).splitlines()[0] if err['evalue'] else ''} "
                 f"({where}/error.json)")
    return 0 if not failed and report_ok else 1
