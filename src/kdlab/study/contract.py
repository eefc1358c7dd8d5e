"""The run contract: one distillation run, whole, built once from a validated profile.

A run is a grid cell (task, policy, lambda, KL, learning rate, seed) plus the profile's validated
sections. The profile is read and validated once, by the command that starts the work
(``kdlab.study.config.load_profile``: one rule per field, declared with the field). From it:

- ``run_config`` builds the engine's ``RunConfig``: the cell, the profile's ``distill`` section
  as it stands (``DistillSettings``: the same class, so no field is copied by hand) and the
  machine's memory settings;
- ``RunContract`` adds where the run writes and what it keeps;
- ``to_json`` / ``from_json`` carry it to the run notebook as one mapping (the study runner's
  papermill parameter ``contract``), which rebuilds it and hands it to
  ``kdlab.study.runs.execute_run``. Nothing is read from YAML, derived from the profile or
  defaulted a second time; rebuilding the dataclasses applies their field rules again (the same
  rules), not a second set.

``kdlab distill``, the study runner and the sharded launcher (``kdlab.study.fsdp_run``) all build
a run this way.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError, Profile, from_dict, to_dict
from ..engine.run_config import RunConfig


def run_config(profile: Profile, *, task: str, policy: str, kl: str, lr: float, seed: int,
               lam: float | None = None, task_rate: bool = True) -> RunConfig:
    """The ``RunConfig`` of one grid cell of ``profile`` (ConfigError/ValueError on a bad cell).
    ``lr`` is a rate of ``grid.lrs``, which a task of ``grid.task_lrs`` replaces by its own rate
    of that role (``GridSpec.rate``); with ``task_rate`` false ``lr`` is the run's rate as it is."""
    lr = profile.grid.rate(task, lr) if task_rate else lr
    return RunConfig(**asdict(profile.distill), task=task, policy=policy, lam=lam, kl=kl, lr=lr, seed=seed,
                     data_seed=profile.data_seed, micro_batch_size=profile.pretrained.micro_batch_size,
                     kl_chunk_size=profile.pretrained.kl_chunk_size, teacher_hidden=profile.pretrained.teacher_hidden)


@dataclass
class RunContract:
    """One run: its profile (validated), its ``RunConfig`` (a cell of that profile), the folder it
    writes (``history.json``, ``metrics.json``, ``config.json``, with ``save_student`` the
    distilled ``student/``), the model store it reads, and whether it is a style run."""

    profile: Profile
    run: RunConfig
    out_dir: Path
    models_root: Path
    save_student: bool = False
    style: bool = False

    def to_json(self) -> dict[str, Any]:
        """The contract as plain JSON values (a papermill parameter)."""
        return {"profile": to_dict(self.profile), "run": asdict(self.run), "out_dir": str(self.out_dir),
                "models_root": str(self.models_root), "save_student": self.save_student, "style": self.style}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunContract":
        """The contract ``to_json`` wrote."""
        unknown = sorted(set(data) - {"profile", "run", "out_dir", "models_root", "save_student", "style"})
        if unknown:
            raise ValueError(f"a run contract has no key {unknown[0]!r}")
        return cls(profile=from_dict(Profile, data["profile"]), run=RunConfig(**data["run"]),
                   out_dir=Path(data["out_dir"]), models_root=Path(data["models_root"]),
                   save_student=bool(data.get("save_student", False)), style=bool(data.get("style", False)))


def study_dir_of(profile: Profile, outputs: str | Path) -> Path:
    """``<outputs>/<profile.name>``: everything one study writes."""
    return Path(outputs).resolve() / profile.name


def run_dir(profile: Profile, outputs: str | Path, cfg: RunConfig, style: bool = False) -> Path:
    """Where a run of ``profile`` writes: ``<study>/runs/<run_id>`` (``style/`` for a style run)."""
    return study_dir_of(profile, outputs) / ("style" if style else "runs") / cfg.run_id


def contract_for(profile: Profile, cfg: RunConfig, outputs: str | Path, *, out_dir: str | Path | None = None,
                 save_student: bool = False, style: bool = False) -> RunContract:
    """The contract of run ``cfg`` of ``profile`` under the outputs root ``outputs`` (models in
    ``<outputs>/models``); ``out_dir`` None: ``run_dir``."""
    outputs = Path(outputs).resolve()
    return RunContract(profile=profile, run=cfg, out_dir=Path(out_dir).resolve() if out_dir else run_dir(profile, outputs, cfg, style),
                       models_root=outputs / "models", save_student=save_student, style=style)


def add_cell_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that name one run of a profile (``kdlab distill``, ``kdlab.study.fsdp_run``), for
    ``cell_contract``."""
    first = "default: the profile's first grid value"
    parser.add_argument("--task", default=None, help=f"target task ({first})")
    parser.add_argument("--policy", default=None, choices=["off", "on", "lambda"], help=f"rollout policy ({first})")
    parser.add_argument("--lam", type=float, default=None, help="lambda of --policy lambda, in [-3, 3]")
    parser.add_argument("--kl", default=None, help=f"KL direction or estimator ({first})")
    parser.add_argument("--lr", type=float, default=None, help="learning rate, used as given (default: the task's first rate, from "
                        "grid.task_lrs when it names the task, else grid.lrs)")
    parser.add_argument("--seed", type=int, default=None, help=f"seed ({first})")
    parser.add_argument("--out", default=None, help="run directory (default: <outputs>/<study>/runs/<run_id>)")
    parser.add_argument("--save-student", action="store_true", help="save the distilled student checkpoint")


def cell_contract(profile: Profile, outputs: str | Path, *, task: str | None = None, policy: str | None = None,
                  kl: str | None = None, lr: float | None = None, seed: int | None = None, lam: float | None = None,
                  out_dir: str | Path | None = None, save_student: bool = False) -> RunContract:
    """The contract of the cell that command-line flags name (``kdlab distill``, ``kdlab.study.fsdp_run``):
    each flag not given is the profile's first grid value (the one default, the profile's). The
    flags meet the rules of ``RunConfig``'s fields, named as flags (``--lr: ...``)."""
    g = profile.grid
    tasks = list(dict.fromkeys(g.tasks + (g.lambda_tasks if g.lambdas else [])))
    if task is not None and task not in tasks:
        raise ConfigError(f"--task {task!r}: the profile distils {tasks} (its teachers are for those); "
                          f"add it to grid.tasks to build its teacher")
    pick = lambda flag, values: values[0] if flag is None else flag  # noqa: E731
    try:
        cfg = run_config(profile, task=pick(task, g.tasks), policy=pick(policy, g.policies), lam=lam,
                         kl=pick(kl, g.kls), lr=pick(lr, g.lrs), seed=pick(seed, g.seeds), task_rate=lr is None)
    except ConfigError as e:
        raise ConfigError(f"--{e}") from None
    return contract_for(profile, cfg, outputs, out_dir=out_dir, save_student=save_student)


def first_cell(profile: Profile, outputs: str | Path) -> RunContract:
    """The contract of the profile's first grid cell (what the run notebook shows when opened by hand)."""
    return cell_contract(profile, outputs)
