"""What a study is: its runs, their directories and when each is complete.

- ``expand_grid`` / ``schedule``: the grid cells of a profile (tasks x policies x KLs x rates x
  seeds, then the lambda spectrum), in grid order and in the order workers start them;
- ``Job``: one notebook execution (a grid cell, a style run or an RLVR start) with the one
  parameter that carries its whole configuration (a grid or style run: ``contract``, its
  ``kdlab.study.contract.RunContract`` as a mapping);
- completeness: a run directory whose ``metrics.json`` and ``history.json`` hold the fields the
  results table reads (``kdlab.study.records``) is complete (never redone); anything less is redone;
- ``check_params``: the resolved profile kept as ``params.yaml``; a rerun with other settings
  (except the grid lists) is refused;
- ``study_model_paths`` / ``models_ready``: the models the study needs, built or not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, Profile, from_dict, read_yaml, to_dict
from ..engine.run_config import RunConfig
from .followups import RLVRStart
from ..core.atomic import write_text_atomic
from .records import record_problems
from .contract import contract_for, run_config, study_dir_of  # noqa: F401 (study_dir_of: the runner's)
from .building import study_model_paths

NOTEBOOKS_DIR = Path(__file__).resolve().parents[3] / "notebooks"
TEACHERS_NB, RUN_NB, GRID_NB, REPORT_NB = "00_teachers.ipynb", "10_run.ipynb", "20_grid.ipynb", "30_report.ipynb"

RLVR_NB = "11_rlvr.ipynb"

ANALYSIS_NBS = ("40_teaching_kl.ipynb", "50_gradients.ipynb", "60_spectrum.ipynb", "70_statistics.ipynb",
                "80_explorer.ipynb", "90_coverage.ipynb")

# Analysis notebooks that read another's output: 70's scoreboard reads 50's bound.csv. A
# notebook and its prerequisite run on one kernel, in this order; the rest may run beside them.
ANALYSIS_AFTER = {"70_statistics.ipynb": "50_gradients.ipynb"}

# Report sections of the follow-ups, executed only when the profile runs them.
RLVR_REPORT_NB, STYLE_REPORT_NB, ROBUSTNESS_NB = "91_rlvr.ipynb", "92_style.ipynb", "93_robustness.ipynb"
AXES_NB = "94_axes.ipynb"

# Grid lists that may change between invocations of one study (each run is identified by its cell).
GRID_LISTS = ("policies", "kls", "lrs", "seeds", "lambdas")



def analysis_notebooks(profile: Profile) -> list[str]:
    """The analysis notebooks of a study's report, in order: ``ANALYSIS_NBS``, then the RLVR
    (``rlvr.enabled``), style (``style.enabled``), robustness (``companions``) and axes (``axes``) sections."""
    axes = profile.axes.teachers or profile.axes.students
    return [*ANALYSIS_NBS, *([RLVR_REPORT_NB] if profile.rlvr.enabled else []),
            *([STYLE_REPORT_NB] if profile.style.enabled else []), *([ROBUSTNESS_NB] if profile.companions else []),
            *([AXES_NB] if axes else [])]


def analysis_lanes(names: list[str], n: int) -> list[list[str]]:
    """``names`` split over at most ``n`` kernels, each lane run in order on one kernel: the
    notebooks linked by ``ANALYSIS_AFTER`` (a prerequisite and what reads it) on the first, in
    the order of ``names``; the others round-robin over the remaining kernels (all on one when
    ``n`` is 1). Empty lanes are dropped."""
    linked = set(ANALYSIS_AFTER) | set(ANALYSIS_AFTER.values())
    lanes: list[list[str]] = [[] for _ in range(max(1, n))]
    free = lanes[1:] or lanes
    for name in names:
        (lanes[0] if name in linked else min(free, key=len)).append(name)
    return [lane for lane in lanes if lane]


def _notebook(name: str) -> Path:
    path = NOTEBOOKS_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"study notebook {path} is missing (kdlab runs the notebooks of its source tree)")
    return path


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
                        add(run_config(profile, task=task, policy=policy, kl=kl, lr=lr, seed=seed))
    for task in g.lambda_tasks:
        for lam in g.lambdas:
            lam = _lam_key(lam)
            policy = {-1.0: "off", 1.0: "on"}.get(lam, "lambda")
            for kl in g.kls:
                for lr in g.lrs:
                    for seed in g.seeds:
                        add(run_config(profile, task=task, policy=policy, lam=lam, kl=kl, lr=lr, seed=seed))
    return list(cells.values())


def schedule(cells: list[RunConfig]) -> list[RunConfig]:
    """The order runs are started in: per task, seed, lr and KL, the rollout policies next to each
    other, so that parallel workers start on different policies (and do not both build the same
    OffPD cache at once)."""
    task_rank = {t: i for i, t in enumerate(dict.fromkeys(c.task for c in cells))}
    return sorted(cells, key=lambda c: (task_rank[c.task], c.seed, c.lr, c.kl, c.lam))


@dataclass(frozen=True, eq=False)
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

    @property
    def kind(self) -> str:
        """The kind of record its notebook writes (``kdlab.study.records.SCHEMAS``)."""
        return "rlvr" if self.notebook == RLVR_NB else "run"

    def complete(self) -> bool:
        return run_is_complete(self.out_dir, self.kind) and all((self.out_dir / r).exists() for r in self.requires)

    def parameters(self, params_path: Path, outputs: Path, threads: int, recorded: bool) -> dict[str, Any]:
        """The notebook's parameters: a run's contract (it names everything the run reads and
        writes), or for an RLVR start the study-wide ones and its own; then the kernel's."""
        own = dict(self.params)
        where = {} if "contract" in own else {"params": str(params_path), "outputs": str(outputs), "out_dir": str(self.out_dir)}
        return {**where, **own, "threads": threads, "recorded": recorded}


def run_job(profile: Profile, outputs: Path, cfg: RunConfig, save: set[str] = frozenset(), style: bool = False) -> Job:
    """The job of a grid cell (``runs/<run_id>``) or of a style run (``style/<run_id>``) of
    ``profile`` under the outputs root ``outputs``; a run in ``save`` keeps its distilled student."""
    keep = cfg.run_id in save
    contract = contract_for(profile, cfg, outputs, save_student=keep, style=style)
    return Job(id=("style/" if style else "") + cfg.run_id, notebook=RUN_NB, out_dir=contract.out_dir,
               params=(("contract", contract.to_json()),), requires=("student/config.json",) if keep else ())


def rlvr_job(study_dir: Path, start: RLVRStart) -> Job:
    """The job of one RLVR start (``rlvr/<start_id>_s<seed>``)."""
    return Job(id=f"rlvr/{start.job_id}", notebook=RLVR_NB, out_dir=study_dir / "rlvr" / start.job_id,
               params=(("start", start.spec), ("seed", start.seed)), output="rlvr.ipynb")


def run_is_complete(run_dir: Path, kind: str = "run") -> bool:
    """A run is complete when its ``metrics.json`` and ``history.json`` (both written atomically,
    metrics last) hold the fields of its kind of record (``kdlab.study.records``): a truncated file, an
    empty ``{}`` or a field of the wrong type makes it redo."""
    return not record_problems(run_dir, kind)


def invalid_records(jobs: list[Job]) -> list[tuple[Job, list[str]]]:
    """(job, what its record lacks) for each job that has a ``metrics.json`` but is not complete:
    a record written wrong or cut short, which the study redoes and names."""
    out = []
    for job in jobs:
        if (job.out_dir / "metrics.json").exists():
            problems = record_problems(job.out_dir, job.kind)
            if problems:
                out.append((job, problems))
    return out


def notebook_finished(path: Path) -> bool:
    """True when the executed notebook at ``path`` ran to its end without an error (papermill's
    metadata: an end time and no exception; it is saved atomically, so it is always whole)."""
    try:
        meta = json.loads(path.read_text())["metadata"]["papermill"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False
    return meta.get("end_time") is not None and not meta.get("exception")


def _pending(jobs: list[Job], order: list[Job] | None = None) -> list[tuple[Job, bool]]:
    """(job, recorded) to execute: incomplete jobs (in ``order``, default ``jobs``), then complete
    ones whose notebook was cut short (shown again on their recorded metrics)."""
    todo = [(j, False) for j in (order or jobs) if not j.complete()]
    todo += [(j, True) for j in jobs if j.complete() and not notebook_finished(j.out_dir / j.output)]
    return todo


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _record(profile: Profile) -> dict[str, Any]:
    """The profile as ``params.yaml`` keeps it: every setting, less the axes without points
    (a profile file that names an axis must list a point, and the record reads back as a profile)."""
    data = to_dict(profile)
    data["axes"] = {axis: points for axis, points in data["axes"].items() if points}
    if not data["axes"]:
        data.pop("axes")
    return data


def _check_params(study_dir: Path, profile: Profile) -> Path:
    """Keep the resolved profile as ``params.yaml``; refuse a rerun with other settings."""
    path = study_dir / "params.yaml"
    new = _record(profile)
    if path.exists():
        try:
            old = _record(from_dict(Profile, read_yaml(path.read_text())))
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
