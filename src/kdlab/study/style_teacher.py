"""The style teacher of a study's incidental-style-transfer runs (``style:`` in a profile).

- **Toy profile**: a teacher of the profile's teacher size and recipe (``teacher``, and the
  schedule of the teacher of ``style.task``: ``kdlab.study.teachers.teacher_schedule``, with
  ``style.teacher_steps`` steps when that is set), trained on the probe skills and on
  ``kdlab.evaluation.style.style_teacher_tasks``: plain countdown traces for the student's (uninstructed)
  prompts and alt-notation traces for instructed prompts. It is stored in the same
  content-addressed model store as the other models
  (``<models>/teacher-style-<task>-<hash>/``, the hash covering the spec, the recipe and the
  mixture).
- **Real profile** (``pretrained.student`` set): the student's base fine-tuned as the ``sft``
  teachers are (``kdlab.study.recipes.fine_tuned``, recipe ``pretrained.teacher_sft`` with
  ``style.teacher_steps`` steps when set), through its tokenizer's codec, on the same two styled
  tasks in natural language (``natural=True``) plus, with ``teacher_sft.probes``, the probe
  skills in natural language; stored as ``<models>/teacher-style-<task>-<hash>/``.

Either way a study builds it once and reuses it.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import materials
from .config import PretrainSpec, Profile, SFTSpec
from ..evaluation.evaluate import accuracy
from ..models.toy import checkpoint_meta, n_params
from ..evaluation.style import StyledCountdownTask, student_prompt, style_report, style_teacher_tasks, teacher_prompt
from ..tasks import probe_tasks
from ..tasks.base import Task, held_out
from .teachers import ModelStore, teacher_schedule
from ..models.store import model_key
from ..tasks.probes import natural_probes
from .recipes import base_path, fine_tuned


def _natural_budget(profile: Profile) -> int:
    """A real profile's response budget (tokens) for ``style.task``: that of its countdown task."""
    return materials.target_task(profile, profile.style.task).max_new_tokens


def style_teacher_recipe(profile: Profile) -> SFTSpec:
    """A real profile's recipe: ``pretrained.teacher_sft``, with ``style.teacher_steps`` steps when set."""
    spec = profile.pretrained.teacher_sft
    return replace(spec, steps=profile.style.teacher_steps) if profile.style.teacher_steps else spec


def style_teacher_mixture(profile: Profile) -> list[tuple[Task, float]]:
    """Toy: probe skills at ``teacher_pretrain.probe_weight`` each, plus the two styled countdown
    tasks sharing ``teacher_pretrain.task_weight`` (``style.alt_share`` of it on the instructed one).
    Real: the two styled tasks in natural language sharing ``1 - teacher_sft.probes``, the seven
    natural-language probe skills sharing ``teacher_sft.probes``."""
    st = profile.style
    if materials.is_real(profile):

        probes = style_teacher_recipe(profile).probes
        mix = style_teacher_tasks(st.task, st.alt_share, weight=1.0 - probes, natural=True,
                                  max_new_tokens=_natural_budget(profile))
        return mix + ([(p, probes / len(natural_probes())) for p in natural_probes()] if probes > 0 else [])
    tp = profile.teacher_pretrain
    return ([(t, tp.probe_weight) for t in probe_tasks()]
            + style_teacher_tasks(st.task, st.alt_share, weight=tp.task_weight, trace=profile.trace))


def style_teacher_schedule(profile: Profile) -> PretrainSpec:
    """A toy profile's schedule: that of the teacher of ``style.task``, with ``style.teacher_steps``
    steps when set."""
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
    if materials.is_real(profile):

        names = [f"{t.name}:{w:g}" for t, w in mix]  # the mixture in the model's key
        base = base_path(profile, root, train=train, progress=progress)
        return fine_tuned(profile, root, role, names, style_teacher_recipe(profile), base, train=train,
                          progress=progress, mixture=mix)
    schedule = style_teacher_schedule(profile)
    key = model_key(role, profile.teacher, schedule, mix, profile.trace)
    store = ModelStore(root)
    path = store.path(role, key)
    if not (path / "config.json").exists() and not train:
        raise FileNotFoundError(f"model {role} for profile {profile.name!r} is not built at {path}; run `kdlab study`")
    return store.get_or_train(role, key, profile.teacher, schedule, mix, progress=progress)


def style_task(profile: Profile) -> StyledCountdownTask:
    """``style.task`` with plain traces on uninstructed prompts, as the profile's models read it
    (natural language for a real profile)."""
    if materials.is_real(profile):
        return StyledCountdownTask(profile.style.task, "plain", instructed=False, natural=True,
                                   max_new_tokens=_natural_budget(profile))
    return StyledCountdownTask(profile.style.task, "plain", instructed=False, trace=profile.trace)


def style_teacher_row(profile: Profile, path: Path) -> dict[str, Any]:
    """The style teacher's row of ``models.json``: accuracy on the student's (uninstructed) prompts,
    on instructed prompts, and ``instructed_adoption`` / ``plain_adoption``, the share of its
    outputs written in the alt notation with and without the instruction (fractions; a teacher
    that follows the instruction has ~1 and ~0), and its mean score on the forgetting set."""
    real = materials.is_real(profile)
    model, codec = materials.load_model(profile, path, profile.distill.dtype if real else "fp32")
    task = style_task(profile)
    test = held_out(task, profile.eval.n_test, seed=profile.data_seed)
    plain = style_report(model, task, test, prompt=student_prompt, codec=codec)
    instructed = style_report(model, task, test, prompt=teacher_prompt, codec=codec)
    probes = [accuracy(model, t, problems, codec=codec) for _, t, problems in materials.forgetting_sets(profile)]
    return {"model": "style teacher", "task": profile.style.task, "accuracy": plain["accuracy"],
            "instructed_accuracy": instructed["accuracy"], "plain_adoption": plain["adoption"],
            "instructed_adoption": instructed["adoption"],
            "probe_mean": sum(probes) / len(probes) if probes else math.nan,
            "n_params": n_params(model), "path": str(path), "train_s": checkpoint_meta(path).get("train_s")}
