"""What a run is made of, for a toy or a real profile: its tasks, its models and their codec.

This is the only place where toy and real studies differ. A profile is *real* when
``pretrained.student`` names a local Hugging Face checkpoint directory; then

- the target tasks are ``pretrained.tasks`` (local data files read by ``kdlab.tasks.real``:
  ``choice`` or ``math``), each with its own frozen teacher directory; the held-out problems
  come from the task's ``test`` file (every row), else from the train file's test split;
- models load with ``kdlab.models.hf.load_pretrained`` (``pretrained.device``, gradient
  checkpointing) and speak through ``kdlab.models.codec.HFCodec`` (chat template, pad / stop ids,
  vocabulary cut); teacher and student must share the vocabulary token for token;
- the forgetting set is the profile's benchmark files (``pretrained.benchmarks``), recorded as
  ``probe_<benchmark>`` so that every later table treats them as the toy's seven probe skills.

Toy profiles keep kdlab's own tasks, models (``kdlab.study.teachers`` builds them) and probes.
Which models a profile needs, built or reused, is ``kdlab.study.building``.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from ..engine.ranks import _world
from ..models.codec import CHAR, HFCodec
from .config import Profile
from ..tasks.base import Problem, Task, held_out
from ..tasks.real import EVAL_ONLY, real_task
from ..tasks.countdown import NaturalCountdownTask
from ..models.toy import checkpoint_meta, load_checkpoint
from ..core.dtypes import DTYPES
from ..models.hf import load_pretrained, check_same_vocab, load_tokenizer
from ..tasks import get_task, probe_tasks
from ..tasks.probes import natural_probes


def is_real(profile: Profile) -> bool:
    return bool(profile.pretrained.student)


def _task_spec(profile: Profile, name: str):
    for spec in profile.pretrained.tasks:
        if spec.name == name:
            return spec
    raise ValueError(f"task {name!r} is not one of pretrained.tasks {[t.name for t in profile.pretrained.tasks]}")


@functools.lru_cache(maxsize=32)
def _real_task(kind: str, path: str, name: str, eval_only: bool, max_new_tokens: int) -> Task:

    kw = {"fractions": EVAL_ONLY} if eval_only else {}
    return real_task(kind, path, name=name, max_new_tokens=max_new_tokens, **kw)


def target_task(profile: Profile, name: str) -> Task:
    """The task a run trains on (its train split is the pool of prompts)."""
    if not is_real(profile):

        return get_task(name, trace=profile.trace)
    spec = next((t for t in profile.pretrained.tasks if t.name == name), None)
    if spec is None and name.startswith("countdown"):  # a harder variant of a countdown task (eval.harder)
        return _countdown(name, max(t.max_new_tokens for t in profile.pretrained.tasks if t.kind == "countdown"))
    spec = _task_spec(profile, name)
    if spec.kind == "countdown":
        return _countdown(name, spec.max_new_tokens)
    return _real_task(spec.kind, str(Path(spec.train).resolve()), name, False, spec.max_new_tokens)


@functools.lru_cache(maxsize=8)
def _countdown(variant: str, max_new_tokens: int) -> Task:

    return NaturalCountdownTask(variant, max_new_tokens=max_new_tokens)


def test_set(profile: Profile, name: str, n: int) -> tuple[Task, list[Problem]]:
    """(task, its first ``n`` held-out problems) for evaluation."""
    if not is_real(profile):
        task = target_task(profile, name)
        return task, held_out(task, n, seed=profile.data_seed)
    spec = next((t for t in profile.pretrained.tasks if t.name == name), None)
    task = (_real_task(spec.kind, str(Path(spec.test).resolve()), name, True, spec.max_new_tokens)
            if spec is not None and spec.test else target_task(profile, name))
    problems = held_out(task, n, seed=profile.data_seed)
    if not problems:
        raise ValueError(f"task {name!r} has no held-out problems (pretrained.tasks: test file or the train file's "
                         "test split)")
    return task, problems


def forgetting_sets(profile: Profile) -> list[tuple[str, Task, list[Problem]]]:
    """(name, task, problems) of the forgetting set: the seven probe skills (toy) or, real, the
    natural-language probes (``pretrained.probes``, ``eval.n_probe`` each) and the benchmark files
    (first ``pretrained.n_benchmark`` problems of each; 0 = all)."""
    if not is_real(profile):

        return [(p.skill, p, held_out(p, profile.eval.n_probe, seed=profile.data_seed)) for p in probe_tasks()]
    out = []
    n = profile.pretrained.n_benchmark
    if profile.pretrained.probes:

        out += [(p.skill, p, held_out(p, profile.eval.n_probe, seed=profile.data_seed)) for p in natural_probes()]
    for b in profile.pretrained.benchmarks:
        name = b.name or Path(b.path).stem
        task = _real_task(b.kind, str(Path(b.path).resolve()), name, True, b.max_new_tokens)
        count = task.capacity("test") if n == 0 else n
        out.append((name, task, held_out(task, count, seed=profile.data_seed)))
    return out




def model_id(path: str | Path) -> str:
    """A model's identity: the weights' sha256 that kdlab recorded (``kdlab.json``), else a
    fingerprint of its weight files (names, sizes, modification times; hashing 16 GB of an 8B
    checkpoint per run would cost minutes)."""

    path = Path(path)
    sha = checkpoint_meta(path).get("sha256")
    if sha:
        return sha
    files = sorted(f for f in path.iterdir() if f.suffix in (".safetensors", ".bin")) if path.is_dir() else []
    stamp = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return "stamp:" + hashlib.sha256(json.dumps([str(path.resolve()), stamp]).encode()).hexdigest()[:16]


def load_model(profile: Profile, path: str | Path, dtype: str = "fp32", train: bool = False):
    """(model, codec) of one checkpoint; ``train``: with gradient checkpointing (real models,
    when the profile asks for it)."""

    if not is_real(profile):
        return load_checkpoint(path, dtype=DTYPES[dtype]), CHAR
    pre = profile.pretrained
    model, tok = load_pretrained(path, dtype, pre.device, gradient_checkpointing=train and pre.gradient_checkpointing)
    return model, HFCodec.of(tok, model, max_prompt_tokens=pre.max_prompt_tokens)


class _Resident:
    """The models a process keeps loaded from one run to the next (a warm kernel serving a
    study's cells: the worker loop runs notebook after notebook in one process, one worker per
    GPU): the last frozen teacher, used as it is, and the last student base, kept pristine on the
    host, of which each run gets a fresh copy on the model's device (runs train it in place). A
    key is everything the loaded model depends on: the checkpoint's identity (its weights'
    hash), the dtype, the profile's device and training settings. One of each, so a study of
    several tasks (its runs ordered by task) holds one teacher at a time."""

    def __init__(self):
        self.teacher: tuple[Any, Any] | None = None  # (key, (model, codec))
        self.student: tuple[Any, Any] | None = None  # (key, (pristine model on the host, codec, device))

    @staticmethod
    def _sharded() -> bool:  # FSDP shards a run's models in place: a sharded process keeps nothing
        return _world()[1] > 1

    def load_teacher(self, key, load):
        if self._sharded():
            return load()
        if self.teacher is None or self.teacher[0] != key:
            self.teacher = None  # the old one is freed before the new one loads
            self.teacher = (key, load())
        return self.teacher[1]

    def load_student(self, key, load):
        import copy

        if self._sharded():
            return load()
        if self.student is None or self.student[0] != key:
            self.student = None
            model, codec = load()
            device = next(model.parameters()).device
            self.student = (key, (model.to("cpu"), codec, device))
        pristine, codec, device = self.student[1]
        return copy.deepcopy(pristine).to(device), codec


RESIDENT = _Resident()


def _resident_key(profile: Profile, path: Path, dtype: str, train: bool) -> tuple:
    pre = profile.pretrained
    return (str(Path(path).resolve()), model_id(path), dtype, train, pre.device if is_real(profile) else "cpu",
            pre.gradient_checkpointing, pre.max_prompt_tokens)


def load_pair(profile: Profile, student_dir: Path, teacher_dir: Path, dtype: str):
    """(student, teacher, codec): the student in ``dtype`` (fp32 for the toy, cast by the loop),
    the teacher in bf16; a real pair must share its vocabulary token for token. Both come from
    ``RESIDENT``: loaded once per process and reused by the runs after it (a fresh student each run)."""

    if not is_real(profile):
        student, _ = RESIDENT.load_student(_resident_key(profile, student_dir, "fp32", False),
                                           lambda: load_model(profile, student_dir, "fp32"))
        teacher, _ = RESIDENT.load_teacher(_resident_key(profile, teacher_dir, "bf16", False),
                                           lambda: load_model(profile, teacher_dir, "bf16"))
        return student, teacher, CHAR
    check_same_vocab(load_tokenizer(teacher_dir), load_tokenizer(student_dir), names=("teacher", "student"))
    student, codec = RESIDENT.load_student(_resident_key(profile, student_dir, dtype, True),
                                           lambda: load_model(profile, student_dir, dtype, train=True))
    teacher, _ = RESIDENT.load_teacher(_resident_key(profile, teacher_dir, "bf16", False),
                                       lambda: load_model(profile, teacher_dir, "bf16"))
    codec = HFCodec.of(codec.tokenizer, student, teacher, max_prompt_tokens=codec.max_prompt_tokens)
    return student, teacher, codec


def teacher_system(profile: Profile) -> str | None:
    """A system turn only the teacher sees (real profiles' ``teacher_system_prompt``)."""
    return (profile.pretrained.teacher_system_prompt or None) if is_real(profile) else None


def describe(profile: Profile, paths: dict[str, Path], task: str) -> dict[str, Any]:
    """The model columns of a run's metrics: paths and identities of its student base and teacher."""
    return {"student_path": str(paths["student"]), "teacher_path": str(paths[task]),
            "student_id": model_id(paths["student"]), "teacher_id": model_id(paths[task]),
            "model_kind": "pretrained" if is_real(profile) else "toy"}
