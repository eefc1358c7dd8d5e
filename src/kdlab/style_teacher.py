"""The style teacher of a study's incidental-style-transfer runs (``style:`` in a profile).

A teacher of the profile's teacher size and recipe (``teacher``, and the schedule of the teacher
of ``style.task``: ``kdlab.teachers.teacher_schedule``, with ``style.teacher_steps`` steps when
that is set), trained on the probe skills and on
``kdlab.style.style_teacher_tasks``: plain countdown traces for the student's (uninstructed)
prompts and alt-notation traces for instructed prompts. It is stored in
the same content-addressed model store as the other models (``<models>/teacher-style-<task>-<hash>/``,
the hash covering the spec, the recipe and the mixture), so a study builds it once and reuses it.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import PretrainSpec, Profile
from .evaluate import accuracy
from .models import checkpoint_meta, load_checkpoint, n_params
from .style import StyledCountdownTask, student_prompt, style_report, style_teacher_tasks, teacher_prompt
from .tasks import probe_tasks
from .tasks.base import Task, held_out
from .teachers import ModelStore, model_key, teacher_schedule


def style_teacher_mixture(profile: Profile) -> list[tuple[Task, float]]:
    """Probe skills at ``teacher_pretrain.probe_weight`` each, plus the two styled countdown
    tasks sharing ``teacher_pretrain.task_weight`` (``style.alt_share`` of it on the instructed one)."""
    tp, st = profile.teacher_pretrain, profile.style
    return ([(t, tp.probe_weight) for t in probe_tasks()]
            + style_teacher_tasks(st.task, st.alt_share, weight=tp.task_weight, trace=profile.trace))


def style_teacher_schedule(profile: Profile) -> PretrainSpec:
    """The schedule of the teacher of ``style.task``, with ``style.teacher_steps`` steps when set."""
    schedule = teacher_schedule(profile, profile.style.task)
    if profile.style.teacher_steps:
        schedule = replace(schedule, steps=profile.style.teacher_steps)
    return schedule


def style_teacher_role(profile: Profile) -> str:
    """``teacher-style-<task>``: the model-store role (directory prefix) of the style teacher."""
    return f"teacher-style-{profile.style.task}"


def style_teacher_path(profile: Profile, root: str | Path, progress: bool = True, train: bool = True) -> Path:
    """The style teacher's checkpoint directory under the model store ``root``; trained when
    missing (``train=False`` raises FileNotFoundError instead)."""
    role = style_teacher_role(profile)
    mix = style_teacher_mixture(profile)
    schedule = style_teacher_schedule(profile)
    key = model_key(role, profile.teacher, schedule, mix, profile.trace)
    store = ModelStore(root)
    path = store.path(role, key)
    if not (path / "config.json").exists() and not train:
        raise FileNotFoundError(f"model {role} for profile {profile.name!r} is not built at {path}; run `kdlab study`")
    return store.get_or_train(role, key, profile.teacher, schedule, mix, progress=progress)


def style_teacher_row(profile: Profile, path: Path) -> dict[str, Any]:
    """The style teacher's row of ``models.json``: accuracy on the student's (uninstructed) prompts,
    on instructed prompts, and ``instructed_adoption`` / ``plain_adoption``, the share of its
    outputs written in the alt notation with and without the instruction (fractions; a teacher
    that follows the instruction has ~1 and ~0)."""
    model = load_checkpoint(path)
    task = StyledCountdownTask(profile.style.task, "plain", instructed=False, trace=profile.trace)
    test = held_out(task, profile.eval.n_test, seed=profile.data_seed)
    plain = style_report(model, task, test, prompt=student_prompt)
    instructed = style_report(model, task, test, prompt=teacher_prompt)
    probes = [accuracy(model, p, held_out(p, profile.eval.n_probe, seed=profile.data_seed)) for p in probe_tasks()]
    return {"model": "style teacher", "task": profile.style.task, "accuracy": plain["accuracy"],
            "instructed_accuracy": instructed["accuracy"], "plain_adoption": plain["adoption"],
            "instructed_adoption": instructed["adoption"], "probe_mean": sum(probes) / len(probes),
            "n_params": n_params(model), "path": str(path), "train_s": checkpoint_meta(path).get("train_s")}
