"""The models a study needs, built or reused: a toy profile's by ``kdlab.study.teachers`` (the
model store), a real profile's by ``kdlab.study.recipes`` (imported or fine-tuned), plus the style
teacher (``kdlab.study.style_teacher``) when the profile enables the style experiment."""
from __future__ import annotations

from pathlib import Path

from ..models.toy import verify_weights
from . import recipes, teachers
from .config import Profile
from .materials import is_real
from .style_teacher import style_teacher_path


def model_paths(profile: Profile, root: str | Path, progress: bool = True, train: bool = True) -> dict[str, Path]:
    """{"student": dir, "<task>": teacher dir, ...}: a real profile's are its local directories;
    a toy profile's are built or reused by ``kdlab.study.teachers.model_paths``."""
    if not is_real(profile):
        return teachers.model_paths(profile, root, progress=progress, train=train)
    return recipes.model_paths(profile, root, train=train, progress=progress)


def models_to_train(profile: Profile, root: str | Path) -> list[str]:
    """The toy models a study of ``profile`` would train first (neither cached nor shipped), each
    named with its steps; empty for a real profile (its checkpoints are imported, not trained)."""
    if is_real(profile):
        return []
    return teachers.models_to_train(profile, root)


def check_models(profile: Profile, root: str | Path, params: str = "PROFILE") -> None:
    """Refuse (``kdlab.core.faults.CorruptCheckpoint``), before any work and writing nothing, a model of
    the profile whose weights do not match the hash recorded for them: a toy model's cached or
    shipped copy, a real profile's checkpoints that record one (``kdlab.json``) once all are built."""
    if not is_real(profile):
        return teachers.check_models(profile, root, params)
    try:
        paths = model_paths(profile, root, progress=False, train=False)
    except FileNotFoundError:
        return  # some are not built yet; each is checked when it is reused
    for path in paths.values():
        verify_weights(path, params=params)


def study_model_paths(profile: Profile, root: Path, progress: bool = True, train: bool = True) -> dict[str, Path]:
    """``model_paths`` plus, when ``style.enabled``, ``"style-teacher"``: every model a study needs
    (FileNotFoundError naming a missing one when ``train`` is False)."""
    paths = model_paths(profile, root, progress=progress, train=train)
    if profile.style.enabled:
        paths["style-teacher"] = style_teacher_path(profile, root, progress=progress, train=train)
    return paths
