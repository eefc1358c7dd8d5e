"""What a study runs besides its grid: the RLVR follow-up and the style-transfer runs.

- **RLVR** (``rlvr.enabled``): one GRPO run per ``rlvr.starts`` entry x ``rlvr.seeds``, into
  ``<study>/rlvr/<start_id>_s<seed>/``. A start is ``"base"`` (the student base) or
  ``policy/kl/lr-index`` (``"off/forward/1"``), the distilled student of that grid run on the
  first grid task and the GRPO run's own seed (a replicate repeats the whole pipeline, so seed-to-seed
  variation of the distillation reaches the RLVR intervals); the runner saves those students
  (``runs/<run_id>/student/``) and starts GRPO only after the grid.
- **Style** (``style.enabled``): distillation runs from the style teacher (instructed prompt for
  the teacher only) for ``style.policies`` x ``style.kls`` x ``style.lrs`` (default: the grid's
  first rate) x ``style.seeds`` on ``style.task``, into ``<study>/style/<run_id>/``.

Both follow the grid's rules: a directory with ``metrics.json`` is complete and is never redone.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import Profile, matched_steps, parse_start
from ..engine.run_config import RunConfig
from .contract import run_config


@dataclass(frozen=True)
class RLVRStart:
    """One GRPO run of the follow-up: ``spec`` as written in ``rlvr.starts`` (or a pipeline's name,
    ``rlvr-only`` / ``joint``), ``run_id`` of the distilled run it starts from (None for the base),
    its policy / kl / lr (None for the base), the ``pipeline`` it is a part of (``PIPELINES``; None
    outside ``pipelines``) and ``settings``, the GRPO settings it runs with other than ``rlvr``'s
    ((field, value) pairs)."""

    spec: str
    seed: int
    run_id: str | None
    policy: str | None = None
    kl: str | None = None
    lr: float | None = None
    pipeline: str | None = None
    settings: tuple = ()

    @property
    def start_id(self) -> str:
        """``base``, the start run's id, or the pipeline's name for a pipeline from the base."""
        return self.run_id or (self.pipeline if self.settings else None) or "base"

    @property
    def job_id(self) -> str:
        """The directory name under ``<study>/rlvr/``: ``<start_id>_s<seed>``."""
        return f"{self.start_id}_s{self.seed}"

    def info(self) -> dict[str, object]:
        """What the GRPO run's metrics.json records about its start."""
        return {"start_spec": self.spec, "start_id": self.start_id, "start_policy": self.policy or "base",
                "start_kl": self.kl or "none", "start_lr": self.lr, "start_run": self.run_id,
                **({"pipeline": self.pipeline} if self.pipeline else {})}


def pipeline_settings(profile: Profile, name: str) -> tuple:
    """The GRPO settings of a pipeline from the base (``PipelinesSpec``): the matched steps and,
    for ``joint``, the KL-to-teacher term."""
    steps = ("steps", matched_steps(profile))
    if name == "joint":
        return (steps, ("kl_reference", "teacher"), ("kl_coef", profile.pipelines.joint_kl_coef))
    return (steps,)


def rlvr_start(profile: Profile, spec: str, seed: int) -> RLVRStart:
    """The ``RLVRStart`` of one ``rlvr.starts`` entry or pipeline name (ConfigError naming a bad entry)."""
    pipes = profile.pipelines
    if pipes.enabled and spec in ("rlvr-only", "joint"):
        return RLVRStart(spec, seed, None, pipeline=spec, settings=pipeline_settings(profile, spec))
    parsed = parse_start(profile, spec)
    if parsed is None:
        return RLVRStart(spec, seed, None)
    policy, kl, lr = parsed
    cfg = run_config(profile, task=profile.grid.tasks[0], policy=policy, kl=kl, lr=lr, seed=seed)
    pipeline = "distill-rlvr" if pipes.enabled and spec == pipes.distilled else None
    return RLVRStart(spec, seed, cfg.run_id, policy, kl, lr, pipeline=pipeline)


def rlvr_starts(profile: Profile) -> list[RLVRStart]:
    """Every GRPO run of the follow-up ([] when ``rlvr.enabled`` is false), starts x seeds, then
    the pipelines' (``pipelines.enabled``: the distilled start joins the starts; rlvr-only and joint)."""
    if not profile.rlvr.enabled:
        return []
    specs = list(dict.fromkeys(profile.rlvr.starts))
    if profile.pipelines.enabled:
        specs += [s for s in (profile.pipelines.distilled, "rlvr-only", "joint") if s not in specs]
    return [rlvr_start(profile, spec, seed) for spec in specs for seed in profile.rlvr.seeds]


def students_to_save(profile: Profile) -> set[str]:
    """Run ids of the grid runs whose distilled student an RLVR start needs."""
    return {s.run_id for s in rlvr_starts(profile) if s.run_id is not None}


def start_checkpoint(study_dir: str | Path, start: RLVRStart) -> Path | str:
    """The checkpoint a start begins from: "base", or ``<study>/runs/<run_id>/student`` (a clear
    FileNotFoundError when that run did not finish or did not save its student)."""
    if start.run_id is None:
        return "base"
    path = Path(study_dir) / "runs" / start.run_id / "student"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"RLVR start {start.spec!r} needs the distilled student of run {start.run_id}, "
                                f"which is not at {path} (did the run fail? see runs/{start.run_id}/error.json)")
    return path


def style_cells(profile: Profile) -> list[RunConfig]:
    """The style-transfer distillation runs ([] when ``style.enabled`` is false)."""
    st = profile.style
    if not st.enabled:
        return []
    lrs = st.lrs or profile.grid.lrs[:1]
    return [run_config(profile, task=st.task, policy=policy, kl=kl, lr=lr, seed=seed)
            for policy in st.policies for kl in st.kls for lr in lrs for seed in st.seeds]
