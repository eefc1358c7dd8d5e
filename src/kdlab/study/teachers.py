"""Building the models a study needs: one student base and one teacher per target task.

- The **student base** is pretrained on the seven probe skills and on the answer formats of the
  target tasks: countdown traces at a small mixture weight (so it is weak but not at zero), and
  kb-mc / rules-mc on a *different hidden world* (world_seed=1) than the teacher's (world 0), so
  it knows the format but not the facts (near the 25% chance level of 4 options).
- Each **teacher** is larger and trained on its task (world 0) and the probes.

Models are cached under ``<root>/<role>-<hash>/`` where the hash covers everything that
determines the weights (spec, schedule, mixture, trace style, code version); a second run reuses
them, and an interrupted training resumes from its last ``.partial`` checkpoint.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from ..core.atomic import locked, write_atomic, write_dir_atomic, write_json_atomic
from .config import ModelSpec, PretrainSpec, Profile
from ..evaluation.evaluate import accuracy
from ..models.toy import (SHIPPED_DIR, build_model, checkpoint_meta, copy_checkpoint, n_params, save_checkpoint,
                          verify_weights)
from ..tasks import get_task, probe_tasks
from ..tasks.base import Task
from ..models.store import _digest, model_key, shipped_manifest
from ..engine.sft import SFTSchedule, sft, sft_trainer
from . import materials

def student_mixture(profile: Profile, tasks: list[str]) -> list[tuple[Task, float]]:
    sp = profile.student_pretrain
    mix: list[tuple[Task, float]] = [(t, sp.probe_weight) for t in probe_tasks()]
    for name in tasks:
        world = 0 if name.startswith("countdown") else 1
        weight = sp.extra_tasks.get(name, sp.task_weight)
        mix.append((get_task(name, trace=profile.trace, world_seed=world), weight))
    return mix


def teacher_mixture(profile: Profile, task: str) -> list[tuple[Task, float]]:
    tp = profile.teacher_pretrain
    return [(t, tp.probe_weight) for t in probe_tasks()] + [(get_task(task, trace=profile.trace), tp.task_weight)]


def teacher_schedule(profile: Profile, task: str) -> PretrainSpec:
    """The teacher of ``task``'s schedule: ``teacher_pretrain`` with its per-task steps applied."""
    tp = profile.teacher_pretrain
    return replace(tp, steps=tp.task_steps.get(task, tp.steps), task_steps={})


def base_tasks(profile: Profile) -> list[str]:
    """The target tasks the profile distils on (the student base learns their formats). Harder
    variants (``eval.harder``) are left out on purpose: they measure generalisation."""
    lam_tasks = profile.grid.lambda_tasks if profile.grid.lambdas else []
    return sorted(set(profile.grid.tasks + lam_tasks))


def student_tasks(profile: Profile) -> list[str]:
    """The tasks whose formats the student base learns: ``base_tasks`` plus
    ``student_pretrain.extra_tasks`` (e.g. countdown-4, for an RLVR stage on it), at their own weights."""
    return base_tasks(profile) + list(profile.student_pretrain.extra_tasks)


class ModelStore:
    """Content-addressed cache of trained checkpoints under ``root``.

    A checkpoint the repository ships (``checkpoints/<role>-<hash>/``, listed with its weights'
    SHA-256 in ``checkpoints/MANIFEST.json``, its weights packed: ``ship_checkpoint``) is
    copied in, unpacked, instead of being trained, after its hash is checked; ``kdlab teachers
    --rebuild`` trains it from scratch instead. A cached checkpoint's hash is checked against its
    ``kdlab.json`` whenever it is reused. One process at a time builds a model
    (``kdlab.core.atomic.locked``); the others wait and reuse its copy.
    """

    def __init__(self, root: str | Path, shipped_dir: Path | None = SHIPPED_DIR):
        self.root = Path(root)
        self.shipped_dir = shipped_dir

    def shipped(self, name: str, params: str = "PROFILE") -> Path | None:
        """The shipped checkpoint ``name``, its weights checked against the manifest; None if none."""
        sha = shipped_manifest(self.shipped_dir).get(name) if self.shipped_dir is not None else None
        if sha is None or not (self.shipped_dir / name / "config.json").exists():
            return None
        verify_weights(self.shipped_dir / name, sha, params=params, shipped=True)
        return self.shipped_dir / name

    def install_shipped(self, name: str, final: Path) -> bool:
        src = self.shipped(name)
        if src is not None:
            write_dir_atomic(final, lambda tmp: copy_checkpoint(src, tmp, packed=False))
            verify_weights(final)  # the unpacked copy is what the shipped hash vouched for
        return src is not None

    def path(self, role: str, key: dict[str, Any]) -> Path:
        return self.root / f"{role}-{_digest(key)}"

    @staticmethod
    def cached(final: Path) -> bool:
        """True when ``final`` is built (and its weights match their recorded hash)."""
        if not (final / "config.json").exists():
            return False
        verify_weights(final)
        return True

    def get_or_train(self, role: str, key: dict[str, Any], spec: ModelSpec, pre: PretrainSpec,
                     mix: list[tuple[Task, float]], progress: bool = True, checkpoint_every: int = 250) -> Path:
        final = self.path(role, key)
        if self.cached(final):
            return final
        with locked(final):
            if self.cached(final) or self.install_shipped(final.name, final):  # (another process built it)
                return final
            return self._train(final, role, key, spec, pre, mix, progress, checkpoint_every)

    def _train(self, final: Path, role: str, key: dict[str, Any], spec: ModelSpec, pre: PretrainSpec,
               mix: list[tuple[Task, float]], progress: bool, checkpoint_every: int) -> Path:
        """Train the model into ``final``, resuming from its ``.partial`` checkpoint."""
        partial = final.with_name(final.name + ".partial")
        model = build_model(spec.family, spec.size, seed=spec.seed)
        sched = SFTSchedule(steps=pre.steps, batch_size=pre.batch_size, lr=pre.lr, warmup=pre.warmup, seed=pre.seed,
                            autocast_bf16=pre.arithmetic == "bf16")
        opt = sft_trainer(model, sched).optimizer  # resumable: its state is saved with the partial model
        start = 0
        if (partial / "state.pt").exists():
            state = torch.load(partial / "state.pt", weights_only=False)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            start = state["step"]

        def save_partial(step: int, optimizer: torch.optim.Optimizer) -> None:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            write_atomic(partial / "state.pt", lambda tmp: torch.save(state, tmp))

        t0 = time.perf_counter()
        sft(model, mix, sched, desc=f"train {role}", progress=progress, start_step=start, optimizer=opt,
            on_checkpoint=save_partial, checkpoint_every=checkpoint_every, until=pre.until or None)
        # Shipped and cached weights are bf16: distillation runs in bf16 and the teacher is frozen.
        model.to(torch.bfloat16)
        save_checkpoint(model, final, {"key": key, "train_s": round(time.perf_counter() - t0, 1)})
        shutil.rmtree(partial, ignore_errors=True)
        return final


def model_paths(profile: Profile, root: str | Path, progress: bool = True, train: bool = True,
                rebuild: bool = False) -> dict[str, Path]:
    """{"student": dir, "<task>": teacher dir, ...}: trains what is missing (unless ``train`` is
    False, which raises FileNotFoundError naming the missing model). ``rebuild`` ignores the
    checkpoints shipped in the repository and trains them."""
    store = ModelStore(root, shipped_dir=None if rebuild else SHIPPED_DIR)
    out: dict[str, Path] = {}
    for role, spec, pre, mix, key, path in _planned(profile, store):
        if not (path / "config.json").exists() and not train and not store.install_shipped(path.name, path):
            raise FileNotFoundError(f"model {role} for profile {profile.name!r} is not built at {path}; run `kdlab teachers`")
        out[role.removeprefix("teacher-")] = store.get_or_train(role, key, spec, pre, mix, progress=progress)
    return out


def _recipes(profile: Profile) -> list[tuple[str, ModelSpec, PretrainSpec, list[tuple[Task, float]]]]:
    """(role, spec, schedule, mixture) of the student base and of each task's teacher."""
    jobs = [("student", profile.student, profile.student_pretrain, student_mixture(profile, student_tasks(profile)))]
    for t in base_tasks(profile):
        jobs.append((f"teacher-{t}", profile.teacher, teacher_schedule(profile, t), teacher_mixture(profile, t)))
    return jobs


def _planned(profile: Profile, store: ModelStore):
    """(role, spec, schedule, mixture, key, directory in ``store``) of each of the profile's models."""
    for role, spec, pre, mix in _recipes(profile):
        key = model_key(role, spec, pre, mix, profile.trace)
        yield role, spec, pre, mix, key, store.path(role, key)


def check_models(profile: Profile, root: str | Path, params: str = "PROFILE") -> None:
    """Refuse (``CorruptCheckpoint``), writing nothing, a model of the profile whose weights do
    not match their recorded hash: its cached copy under ``root``, else the shipped one."""
    store = ModelStore(root, shipped_dir=SHIPPED_DIR)
    for *_, path in _planned(profile, store):
        if (path / "config.json").exists():
            verify_weights(path, params=params)
        else:
            store.shipped(path.name, params)


def models_to_train(profile: Profile, root: str | Path) -> list[str]:
    """The profile's models that are neither cached under ``root`` nor shipped, each as
    "<name> (<steps> steps)": what ``model_paths`` would train. Checks no hash."""
    manifest = shipped_manifest(SHIPPED_DIR)
    return [f"{path.name} ({f'{pre.until} of ' if pre.until else ''}{pre.steps} steps)" for _, _, pre, _, _, path in _planned(profile, ModelStore(root))
            if not (path / "config.json").exists() and path.name not in manifest]


def capacity_paths(profile: Profile, root: str | Path, progress: bool = True) -> dict[str, Path]:
    """The capacity check, {task: checkpoint dir}: the *student's* architecture trained with each
    teacher's recipe (the teacher's schedule and mixture: the probes plus that target task).

    If this model reaches the teacher's accuracy while keeping its probe skills, the student
    preset has the headroom to learn the task from a teacher without losing what it knows, and
    a weak distilled student is a finding about distillation, not about a full model. Cached
    like the other models (role ``capacity-<task>``)."""
    store = ModelStore(root, shipped_dir=SHIPPED_DIR)
    out: dict[str, Path] = {}
    for t in base_tasks(profile):
        role, mix = f"capacity-{t}", teacher_mixture(profile, t)
        pre = teacher_schedule(profile, t)
        key = model_key(role, profile.student, pre, mix, profile.trace)
        out[t] = store.get_or_train(role, key, profile.student, pre, mix, progress=progress)
    return out


def model_table(profile: Profile, paths: dict[str, Path], n_test: int | None = None,
                label: str = "teacher", cache_root: Path | None = None) -> list[dict[str, Any]]:
    """Rows: model, task, held-out accuracy (greedy pass@1, test split), mean score on the
    forgetting set (``probe-<name>`` each: the toy probes, or a real profile's benchmark files).
    ``paths`` as ``kdlab.study.building.model_paths`` returns; every role but "student" is ``label``.

    With ``cache_root``, each model's rows are kept in ``cache_root/model_table/`` under the hash
    of the model's identity (its weights' sha256) and of everything the evaluation reads (eval
    settings, tasks, forgetting set, trace, data seed, label): ``kdlab teachers`` and the study's
    models notebook then evaluate a model once, not once each (minutes per model on a real one)."""

    n_test = n_test or profile.eval.n_test
    real = materials.is_real(profile)
    rows = []
    for role, path in paths.items():
        key = _digest([materials.model_id(path), role, label, n_test, asdict(profile.eval), profile.trace,
                       profile.data_seed, asdict(profile.pretrained) if real else student_tasks(profile)])
        cached = cache_root / "model_table" / f"{Path(path).name}-{key}.json" if cache_root is not None else None
        if cached is not None and cached.exists():
            rows += [{**r, "path": str(path)} for r in json.loads(cached.read_text())]
            continue
        rows += (new := _model_rows(profile, role, Path(path), n_test, label))
        if cached is not None:
            write_json_atomic(cached, new)
    return rows


def _model_rows(profile: Profile, role: str, path: Path, n_test: int, label: str) -> list[dict[str, Any]]:
    """``model_table``'s rows of one model, evaluated."""

    sets = materials.forgetting_sets(profile)
    real = materials.is_real(profile)
    rows = []
    model, codec = materials.load_model(profile, path, "bf16" if real else "fp32")
    probe_scores = {f"probe-{name}": accuracy(model, t, problems, codec=codec) for name, t, problems in sets}
    if role != "student":
        tasks = [role]
    else:
        tasks = [t.name for t in profile.pretrained.tasks] if real else student_tasks(profile)
    if real:  # the harder variants too (toy: the runs record them)
        tasks += [h for h in profile.eval.harder if h not in tasks]
    for t in tasks:
        task, test = materials.test_set(profile, t, n_test)
        acc = accuracy(model, task, test, codec=codec)
        rows.append({"model": "student base" if role == "student" else label, "task": t,
                     "accuracy": acc,
                     "probe_mean": sum(probe_scores.values()) / len(probe_scores) if probe_scores else float("nan"),
                     **probe_scores, "n_params": n_params(model), "path": str(path),
                     "train_s": checkpoint_meta(path).get("train_s")})
    del model
    return rows
