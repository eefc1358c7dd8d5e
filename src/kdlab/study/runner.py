"""The study runner behind ``kdlab study PARAMS --workers N``, as named phases.

1. **check**: the profile is validated and every file, checkpoint and tokenizer it names is
   checked (``kdlab.study.preflight``) before anything is written; the resolved profile is kept as
   ``outputs/<study>/params.yaml``, and a rerun must use the same settings (only the grid lists
   policies, kls, lrs, seeds and lambdas may grow or shrink);
2. **models**: built or reused by executing ``notebooks/00_teachers.ipynb`` (toy models are
   trained or copied from the shipped checkpoints; a real profile's are its local directories,
   evaluated) -> ``teachers/00_teachers.ipynb``, ``models.json``;
3. **jobs**: ``notebooks/10_run.ipynb`` once per grid cell into ``runs/<run_id>/run.ipynb``, on
   warm kernels or on Ray (``kdlab.study.kernels``), then the follow-ups (style runs, RLVR
   starts, ``kdlab.study.followups``); a killed study finishes when the same command runs again;
4. **report**: ``results.parquet`` (``20_grid``), the analysis notebooks, then ``30_report``
   (its first screen shows the scoreboard and knob table the statistics notebook wrote) ->
   ``report.html`` (report first, then the analyses; ``kdlab.study.report_page``).

A profile's ``companions`` are run first as studies of their own (``<name>-<suffix>``, the main
grid under the companion's overrides, no report) and shown in section ``93_robustness``.
``timing.json`` records each run's notebook wall time minus the run's own ``wall_s`` (the
notebook overhead) and the kernel start-ups.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


from .config import ConfigError, Profile, axis_profiles, companion_profile, dropped_values, load_profile
from .followups import rlvr_starts, students_to_save, style_cells
from .building import check_models, models_to_train
from ..core.atomic import write_json_atomic, write_text_atomic
from .preflight import check_machine, check_profile, worker_gpus
from .kernels import (KERNEL_NAME, Context, WarmKernel, _cores, _execute_safely, _kernel_env, _record_error,
                      _run_jobs, _run_on_ray)
from .plan import (GRID_NB, REPORT_NB, RLVR_NB, RUN_NB, TEACHERS_NB, _check_params, _models_ready, _notebook,
                   _pending, analysis_lanes, analysis_notebooks, expand_grid, invalid_records, rlvr_job,
                   run_is_complete, run_job, schedule, study_dir_of)
from .report_page import export_html


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
    lists them). Each point of its ``axes`` (``kdlab.study.config.axis_points``) is run the same way,
    as ``<name>-<axis>-<label>``, listed in ``axes.json`` and shown in report section 94_axes. The
    exit code is the worst of all.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    t_study = time.perf_counter()
    profile = load_profile(params, overrides)
    try:  # every path, checkpoint, tokenizer and data file it names, before any work
        check_profile(profile)
    except ConfigError as e:
        raise ConfigError(f"{params}: {e}") from None
    ray_key = "--ray-address"
    if ray_address is None and profile.pretrained.ray_address:  # a real profile may name its cluster
        ray_address, gpus_per_run = profile.pretrained.ray_address, profile.pretrained.gpus_per_run
        ray_key = "pretrained.ray_address"
    try:  # the device it asks for and the packages its path needs
        check_machine(profile, Path(outputs).resolve() / "models", ray_address, ray_key)
    except ConfigError as e:
        raise ConfigError(f"{params}: {e}") from None
    companions = [companion_profile(profile, suffix) for suffix in profile.companions]
    points = axis_profiles(profile)
    for p in [profile, *companions, *(q for _, q in points)]:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", p.name):
            raise ConfigError(f"name: {p.name!r} must be a plain directory name (letters, digits, '_', '.', '-')")
        if not expand_grid(p):
            raise ConfigError(f"grid: the study {p.name!r} has no runs (grid.tasks, grid.policies, grid.kls, grid.lrs and "
                              "grid.seeds, or grid.lambdas with grid.lambda_tasks, must all be non-empty)")
        check_models(p, Path(outputs).resolve() / "models", str(params))  # a corrupt model: refused before any work
    for name in [TEACHERS_NB, RUN_NB, RLVR_NB, GRID_NB, REPORT_NB, *analysis_notebooks(profile)]:
        _notebook(name)
    problem = _check_kernel(KERNEL_NAME)
    if problem:
        print(f"kdlab study: {problem}", file=sys.stderr)
        return 2
    dropped = dropped_values(profile)
    if dropped:
        _say(f"note: {'; '.join(dropped)}")
    outputs = Path(outputs).resolve()
    rc = 0
    for companion in companions:
        _say(f"companion study {companion.name} (robustness variant of {profile.name})")
        rc = max(rc, _run_profile(companion, outputs, workers, progress, time.perf_counter(), ray_address, gpus_per_run,
                                  report=False))
    for point, p in points:
        _say(f"axis study {p.name} ({point.axis} axis of {profile.name}: {point.label})")
        rc = max(rc, _run_profile(p, outputs, workers, progress, time.perf_counter(), ray_address, gpus_per_run,
                                  report=False))
    study_dir = study_dir_of(profile, outputs)
    if points or (study_dir / "axes.json").exists():
        study_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(study_dir / "axes.json",
                          [{"axis": point.axis, "label": point.label, "suffix": point.suffix, "name": p.name,
                            "study_dir": str(study_dir_of(p, outputs)), "overrides": point.overrides}
                           for point, p in points])
    if companions or (study_dir / "companions.json").exists():
        study_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(study_dir / "companions.json",
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
        return _run_locked(profile, study_dir, outputs, workers, progress, t_study, ray_address, gpus_per_run, report)
    finally:
        lock.__exit__(None, None, None)


def _run_locked(profile: Profile, study_dir: Path, outputs: Path, workers: int, progress: bool, t_study: float,
                ray_address: str | None = None, gpus_per_run: float = 1.0, report: bool = True) -> int:
    """One study under its lock: the phases models, jobs, report; returns the exit code."""
    cells = expand_grid(profile)
    params_path = _check_params(study_dir, profile)
    save = students_to_save(profile)
    grid_jobs = [run_job(profile, outputs, c, save) for c in cells]
    order = [run_job(profile, outputs, c, save) for c in schedule(cells)]
    extra_jobs = [run_job(profile, outputs, c, style=True) for c in style_cells(profile)]
    extra_jobs += [rlvr_job(study_dir, s) for s in rlvr_starts(profile)]
    todo, todo_extra = _pending(grid_jobs, order), _pending(extra_jobs)
    invalid = invalid_records([j for j, recorded in todo + todo_extra if not recorded])
    threads = profile.threads or max(1, _cores() // workers)
    n_kernels = max(1, min(workers, len(todo) + len(todo_extra)))
    n_redo = sum(recorded for _, recorded in todo)
    gpus = worker_gpus(profile, n_kernels)
    extra = (f"; {len(extra_jobs)} style and RLVR runs "
             f"({len(extra_jobs) - sum(not r for _, r in todo_extra)} already complete)") if extra_jobs else ""
    _say(f"study {profile.name}: {len(cells)} runs ({len(cells) - len(todo) + n_redo} already complete"
         + (f", {n_redo} of them with an interrupted notebook" if n_redo else "") + f"){extra}, "
         f"{n_kernels} worker(s) x {threads} torch thread(s)"
         + (f", one per GPU (CUDA_VISIBLE_DEVICES {', '.join(gpus)})" if gpus[0] is not None else "") + f" -> {study_dir}")
    if invalid:
        _say(f"{len(invalid)} recorded run(s) redone, their record is not what the results table reads: "
             + "; ".join(f"{j.id} ({problems[0]})" for j, problems in invalid[:3])
             + (f"; and {len(invalid) - 3} more" if len(invalid) > 3 else ""))
    ctx = Context(study_dir=study_dir, outputs=outputs, params_path=params_path, threads=threads, progress=progress,
                  kernels=[WarmKernel(i, study_dir, _kernel_env(threads, gpu), log_path=study_dir / "logs" / f"kernel-{i}.log")
                           for i, gpu in enumerate(gpus)],
                  t_study=t_study, timing=_load_timing(study_dir),
                  invocation={"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "workers": n_kernels,
                              "threads_per_worker": threads, "runs_done": 0, "runs_failed": 0, "kernel_start_s": 0.0,
                              "runs_overhead_s": 0.0, "notebooks": {}})
    ctx.timing["invocations"].append(ctx.invocation)
    ctx.redone += [(j.id, f"its record was not what the results table reads ({problems[0]})") for j, problems in invalid]
    report_ok = True
    try:
        starts = [k.submit(k.start) for k in ctx.kernels]
        rc = _build_models(ctx, profile, starts, outputs)
        if rc is not None:
            return rc
        if not _started(starts, ctx.kernels):
            return 2
        ctx.invocation["kernel_start_s"] = round(sum(k.start_s for k in ctx.kernels), 3)
        ctx.save_timing()
        _run_all_jobs(ctx, profile, todo, todo_extra, extra_jobs, ray_address, gpus_per_run)
        report_ok = _write_report(ctx, profile, report)
        ctx.save_timing()
    except BaseException:
        ctx.stop.set()
        for k in ctx.kernels:
            k.kill()
        raise
    finally:
        for k in ctx.kernels:
            k.close()
    _summary(ctx, profile, cells, extra_jobs)
    return 0 if not ctx.failed and report_ok else 1


def _load_timing(study_dir: Path) -> dict[str, Any]:
    timing: dict[str, Any] = {"runs": {}, "invocations": []}
    try:
        timing.update(json.loads((study_dir / "timing.json").read_text()))
    except (OSError, json.JSONDecodeError):
        pass
    return timing


def _build_models(ctx: Context, profile: Profile, starts: list, outputs: Path) -> int | None:
    """Phase 1: build or reuse the models (``00_teachers``) unless ``models.json`` lists them;
    an exit code when the study cannot go on (2: no kernel, 1: the notebook failed)."""
    if _models_ready(profile, outputs, ctx.study_dir):
        _say("models: reusing the built models (models.json)")
        return None
    teachers_dir = ctx.study_dir / "teachers"
    if train := models_to_train(profile, outputs / "models"):
        # A changed recipe key (e.g. --set grid.tasks=[...] changes the student base's mixture)
        # means hours of training on a CPU: say so before it starts.
        _say(f"models: {len(train)} neither shipped nor cached, trained first: {', '.join(train)}")
    _say(f"models: building or loading them ({teachers_dir / TEACHERS_NB})")
    teachers_dir.mkdir(exist_ok=True)
    k0 = ctx.kernels[0]
    if not _started(starts[:1], ctx.kernels):
        return 2
    params = {"params": str(ctx.params_path), "outputs": str(outputs), "threads": profile.threads or _cores()}
    outcome = k0.submit(_execute_safely, k0, _notebook(TEACHERS_NB), teachers_dir / TEACHERS_NB, params,
                        teachers_dir).result()
    ctx.invocation["notebooks"]["teachers_s"] = round(outcome.seconds, 3)
    if outcome.error:
        _record_error(teachers_dir / "error.json", outcome)
        print(f"kdlab study: the teachers notebook failed: {outcome.error['ename']}: {outcome.error['evalue']}"
              f"\n  see {outcome.path}", file=sys.stderr)
        ctx.save_timing()
        return 1
    (teachers_dir / "error.json").unlink(missing_ok=True)
    return None


def _run_all_jobs(ctx: Context, profile: Profile, todo: list, todo_extra: list, extra_jobs: list,
                  ray_address: str | None, gpus_per_run: float) -> None:
    """Phase 2: the grid (on Ray, or on the local workers with the style runs), then the RLVR
    follow-up, which starts from students the grid saved."""
    from tqdm.auto import tqdm

    if ray_address:
        bar = tqdm(total=sum(not r for _, r in todo), desc=f"study {profile.name} (ray)", unit="run",
                   disable=not ctx.progress, dynamic_ncols=True)

        def on_done(run_id: str, error: dict | None) -> None:
            if error is not None:
                ctx.failed.append((run_id, {"ename": error["ename"], "evalue": " ".join(error["evalue"])}))
                ctx.invocation["runs_failed"] += 1
            else:
                ctx.invocation["runs_done"] += 1
            bar.update(1)
            bar.set_postfix(failed=len(ctx.failed))

        _run_on_ray(ray_address, [j for j, recorded in todo if not recorded], ctx, on_done, gpus_per_run)
        bar.close()
        todo = []
    style_todo = [(j, r) for j, r in todo_extra if j.notebook == RUN_NB]
    _run_jobs(todo + style_todo, ctx, f"study {profile.name}")
    rlvr_todo = _pending([j for j in extra_jobs if j.notebook == RLVR_NB])
    if rlvr_todo:
        _run_jobs(rlvr_todo, ctx, f"study {profile.name} (RLVR)")
    ctx.invocation["kernel_start_s"] = round(sum(k.start_s for k in ctx.kernels), 3)  # restarts included


def _section(ctx: Context, name: str, out: Path, label: str, kernel: int = 0) -> Future:
    """Execute one report notebook into ``out`` on kernel ``kernel``; the future gives True when it
    ran (an error is recorded and said)."""
    k = ctx.kernels[kernel]
    out.parent.mkdir(exist_ok=True)
    done: Future = Future()

    def finish(f: Future) -> None:
        try:
            outcome = f.result()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on ``done``
            done.set_exception(e)
            return
        ctx.invocation["notebooks"][label] = round(outcome.seconds, 3)
        err_path = out.with_name(out.stem + "_error.json")
        if outcome.error:
            _record_error(err_path, outcome)
            _say(f"kdlab study: notebook {name} failed: {outcome.error['ename']}: {outcome.error['evalue']}; see {out}")
            done.set_result(False)
            return
        err_path.unlink(missing_ok=True)
        done.set_result(True)

    k.submit(_execute_safely, k, _notebook(name), out, {"study_dir": str(ctx.study_dir)}, out.parent
             ).add_done_callback(finish)
    return done


def _write_report(ctx: Context, profile: Profile, report: bool) -> bool:
    """Phase 3: ``results.parquet`` (``20_grid``), then the analysis notebooks (spread over the
    warm kernels: ``analysis_lanes``) and the report -> ``report.html``; False when a notebook
    failed."""
    import pandas as pd

    study_dir = ctx.study_dir
    if not _section(ctx, GRID_NB, study_dir / "grid.ipynb", "grid_s").result() \
            or not (study_dir / "results.parquet").exists():
        return False
    if len(pd.read_parquet(study_dir / "results.parquet")) == 0:
        _say("no completed runs: no report")
        return True
    if not report:
        _say(f"results: {study_dir / 'results.parquet'} (a companion study: shown in its main study's report)")
        return True
    names = analysis_notebooks(profile)
    outs = {name: study_dir / "analysis" / name for name in names}
    pending = [_section(ctx, name, outs[name], name.split(".")[0] + "_s", kernel=i)
               for i, lane in enumerate(analysis_lanes(names, len(ctx.kernels))) for name in lane]
    ok = all([f.result() for f in pending])
    # The report runs last: its first screen shows the scoreboard and knob table 70 wrote.
    ok = _section(ctx, REPORT_NB, study_dir / "report.ipynb", "report_s").result() and ok
    _export_html([study_dir / "report.ipynb", *outs.values()], study_dir / "report.html")
    return ok


def _summary(ctx: Context, profile: Profile, cells: list, extra_jobs: list) -> None:
    study_dir, inv = ctx.study_dir, ctx.invocation
    complete = sum(run_is_complete(study_dir / "runs" / c.run_id) for c in cells)
    extras = (f" (+ {sum(j.complete() for j in extra_jobs)}/{len(extra_jobs)} style and RLVR runs)"
              if extra_jobs else "")
    share = inv.get("overhead_fraction")
    _say(f"study {profile.name}: {complete}/{len(cells)} runs complete{extras} in {inv.get('wall_s', 0):.0f} s; notebook "
         f"overhead {inv['runs_overhead_s'] + inv['kernel_start_s']:.1f} s"
         + (f" ({100 * share:.1f}% of worker time)" if share is not None else ""))
    if (study_dir / "report.html").exists():
        _say(f"report: {study_dir / 'report.html'}")
    if ctx.redone:
        _say(f"{len(ctx.redone)} run(s) redone:")
        for run_id, why in ctx.redone:
            _say(f"  {run_id}: {why}")
    if ctx.failed:
        _say(f"{len(ctx.failed)} run(s) failed:")
        for run_id, err in ctx.failed:
            where = run_id if "/" in run_id else f"runs/{run_id}"
            _say(f"  {run_id}: {err['ename']}: {str(err['evalue']).splitlines()[0] if err['evalue'] else ''} "
                 f"({where}/error.json)")
            if err.get("remedy"):
                _say(f"    {err['remedy']}")


def _export_html(notebooks: list[Path], html: Path) -> None:
    """The executed report, followed by the analysis notebooks, as one standalone HTML page with
    the code cells hidden, a table of contents and long tables collapsed
    (``kdlab.study.report_page``; written atomically). A notebook that is missing is skipped."""

    body = export_html(notebooks)
    if body is not None:
        write_text_atomic(html, body)


def _check_kernel(name: str) -> str | None:
    """None if the Jupyter kernel ``name`` is installed, else a message saying how to install it."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return (f"Jupyter kernel {name!r} is not installed; install it with "
                f"`{sys.executable} -m ipykernel install --sys-prefix --name {name}`")
    return None


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
