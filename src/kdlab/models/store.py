"""The model store's content addressing and the shipped checkpoints: what determines a trained
model's weights (``model_key``, its digest names the directory) and the checkpoints the repository
ships (``checkpoints/``: packed weights, a manifest of their SHA-256). Building models is
``kdlab.study.teachers``."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core.atomic import write_atomic, write_dir_atomic
from ..core.schema import PRETRAIN_ARITHMETIC
from .toy import SHIPPED_DIR, checkpoint_meta, copy_checkpoint, verify_weights

REGIME_VERSION = 1  # bump when task formats or training code change the weights


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _describe(mix: list[tuple[Any, float]]) -> list[list[Any]]:
    """What the model key records of a mixture: task name, trace style, world, weight. Only plain
    values: ``KBTask.trace`` is a method, whose text (with a memory address) would make the key
    differ from one process to the next."""
    def plain(v: Any) -> Any:
        return v if v is None or isinstance(v, (str, int, float)) else None
    # a format version other than 1 is appended, so keys of unchanged tasks stay as they were
    return [[t.name, plain(getattr(t, "trace", None)), plain(getattr(t, "world_seed", None)), w]
            + ([t.format_version] if getattr(t, "format_version", 1) != 1 else []) for t, w in mix]


def model_key(role: str, spec: Any, pre: Any, mix, trace: str) -> dict[str, Any]:
    """Everything that determines a trained model's weights, as plain data: its hash names the
    model's directory in the store (``ModelStore.path``). ``spec`` / ``pre``: the profile's
    ``ModelSpec`` / ``PretrainSpec`` (dataclasses)."""
    schedule = asdict(pre)
    schedule.pop("task_steps")  # resolved into ``steps`` by ``teacher_schedule``
    schedule.pop("extra_tasks")  # recorded by the mixture
    if schedule.get("arithmetic") == PRETRAIN_ARITHMETIC[0]:
        schedule.pop("arithmetic")  # the default: keys of models built before the field existed stay as they were
    if not schedule.get("until"):
        schedule.pop("until", None)  # the whole training (the default), likewise
    return {"role": role, "model": asdict(spec), "pretrain": schedule, "mixture": _describe(mix),
            "trace": trace, "regime_version": REGIME_VERSION}


SHIPPED_MANIFEST = "MANIFEST.json"


def shipped_manifest(shipped_dir: Path = SHIPPED_DIR) -> dict[str, str]:
    """{checkpoint dir name: weights sha256} of the checkpoints shipped in the repository."""
    path = shipped_dir / SHIPPED_MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def ship_checkpoint(built: str | Path, shipped_dir: Path = SHIPPED_DIR) -> Path:
    """Add a built checkpoint to the shipped ones: ``shipped_dir/<its name>/`` with its weights
    packed (``kdlab.models.toy.PACKED_WEIGHTS``) and its weights' SHA-256 in the manifest."""
    built = Path(built)
    verify_weights(built)
    sha = checkpoint_meta(built)["sha256"]
    target = shipped_dir / built.name
    write_dir_atomic(target, lambda tmp: copy_checkpoint(built, tmp, packed=True))
    verify_weights(target, sha, shipped=True)
    manifest = {**shipped_manifest(shipped_dir), built.name: sha}
    write_atomic(shipped_dir / SHIPPED_MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=2) + "\n"))
    return target
