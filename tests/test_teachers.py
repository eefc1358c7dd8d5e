"""Model store: caching by config hash, resumable training equal to uninterrupted, shipped checkpoints."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from kdlab.study.config import ModelSpec, PretrainSpec
from kdlab.models.toy import PACKED_WEIGHTS, WEIGHTS, checkpoint_meta, load_checkpoint
from kdlab.tasks import probe_tasks
from kdlab.study.teachers import ModelStore
from kdlab.models.store import SHIPPED_MANIFEST, ship_checkpoint

SPEC = ModelSpec(family="llama", size="nano", seed=0)
PRE = PretrainSpec(steps=6, batch_size=4, lr=1e-3, warmup=2)


def mixture():
    return [(t, 1.0) for t in probe_tasks()[:2]]


def weights(path):
    return load_checkpoint(path).state_dict()


def test_cache_hit_reuses_the_checkpoint(tmp_path):
    store = ModelStore(tmp_path, shipped_dir=None)
    key = {"k": 1}
    a = store.get_or_train("student", key, SPEC, PRE, mixture(), progress=False, checkpoint_every=3)
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    b = store.get_or_train("student", key, SPEC, PRE, mixture(), progress=False, checkpoint_every=3)
    assert a == b and (b / "model.safetensors").stat().st_mtime_ns == mtime
    assert store.path("student", {"k": 2}) != a
    assert checkpoint_meta(a)["dtype"] == "bfloat16"  # stored as trained-then-cast bf16


def test_pretraining_arithmetic_reaches_the_training_and_the_key_only_when_not_the_default(tmp_path, monkeypatch):
    """``arithmetic: fp32`` trains without bf16 autocast (what makes builds 10x faster on an avx2-only
    CPU) and names its own model; the default 'bf16' leaves the key of every shipped model as it was."""
    from dataclasses import replace

    import kdlab.study.teachers as teachers
    from kdlab.models.store import model_key

    seen = []
    real_sft = teachers.sft
    monkeypatch.setattr(teachers, "sft", lambda model, mix, sched, **k: seen.append(sched.autocast_bf16)
                        or real_sft(model, mix, sched, **k))
    fp32 = replace(PRE, arithmetic="fp32")
    store = ModelStore(tmp_path, shipped_dir=None)
    a = store.get_or_train("student", model_key("student", SPEC, PRE, mixture(), "steps"), SPEC, PRE, mixture(),
                           progress=False)
    b = store.get_or_train("student", model_key("student", SPEC, fp32, mixture(), "steps"), SPEC, fp32, mixture(),
                           progress=False)
    assert seen == [True, False] and a != b
    assert "arithmetic" not in model_key("student", SPEC, PRE, mixture(), "steps")["pretrain"]
    assert model_key("student", SPEC, fp32, mixture(), "steps")["pretrain"]["arithmetic"] == "fp32"
    wa, wb = weights(a), weights(b)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # the arithmetic changes the weights


def test_resumed_training_equals_uninterrupted(tmp_path, monkeypatch):
    full = ModelStore(tmp_path / "full", shipped_dir=None).get_or_train(
        "student", {"k": 1}, SPEC, PRE, mixture(), progress=False, checkpoint_every=3)

    store = ModelStore(tmp_path / "resumed", shipped_dir=None)
    import kdlab.study.teachers as teachers

    real_save = teachers.save_checkpoint

    def crash(*a, **k):  # the process "dies" right before the final save
        raise KeyboardInterrupt

    monkeypatch.setattr(teachers, "save_checkpoint", crash)
    with pytest.raises(KeyboardInterrupt):
        store.get_or_train("student", {"k": 1}, SPEC, PRE, mixture(), progress=False, checkpoint_every=3)
    partial = store.path("student", {"k": 1}).with_name(store.path("student", {"k": 1}).name + ".partial")
    assert torch.load(partial / "state.pt", weights_only=False)["step"] == 3
    monkeypatch.setattr(teachers, "save_checkpoint", real_save)
    resumed = store.get_or_train("student", {"k": 1}, SPEC, PRE, mixture(), progress=False, checkpoint_every=3)
    wa, wb = weights(full), weights(resumed)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not partial.exists()


def test_shipped_checkpoint_is_installed_after_its_hash_is_checked(tmp_path):
    built = ModelStore(tmp_path / "a", shipped_dir=None).get_or_train(
        "student", {"k": 1}, SPEC, PRE, mixture(), progress=False, checkpoint_every=3)
    shipped = tmp_path / "shipped"
    ship_checkpoint(built, shipped)
    # shipped packed: the weights compressed, the manifest holding the plain weights' hash
    assert not (shipped / built.name / WEIGHTS).exists()
    assert (shipped / built.name / PACKED_WEIGHTS).stat().st_size < (built / WEIGHTS).stat().st_size
    assert json.loads((shipped / SHIPPED_MANIFEST).read_text()) == {built.name: checkpoint_meta(built)["sha256"]}
    store = ModelStore(tmp_path / "b", shipped_dir=shipped)

    def no_training(*a, **k):
        raise AssertionError("a shipped checkpoint must not be retrained")

    import kdlab.study.teachers as teachers
    orig, teachers.sft = teachers.sft, no_training
    try:
        got = store.get_or_train("student", {"k": 1}, SPEC, PRE, mixture(), progress=False)
    finally:
        teachers.sft = orig
    assert checkpoint_meta(got)["sha256"] == checkpoint_meta(built)["sha256"]
    # installed unpacked, byte for byte the built weights
    assert (got / WEIGHTS).read_bytes() == (built / WEIGHTS).read_bytes() and not (got / PACKED_WEIGHTS).exists()
    # a damaged pack is refused before anything is installed, naming the packed file
    packed = shipped / built.name / PACKED_WEIGHTS
    data = bytearray(packed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    packed.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"{PACKED_WEIGHTS}: sha256 unreadable"):
        ModelStore(tmp_path / "d", shipped_dir=shipped).get_or_train("student", {"k": 1}, SPEC, PRE, mixture(),
                                                                      progress=False)
    assert not (tmp_path / "d" / built.name).exists()
    ship_checkpoint(built, shipped)  # shipped again, whole
    # a tampered shipped file is refused, naming the file
    (shipped / SHIPPED_MANIFEST).write_text(json.dumps({built.name: "0" * 64}))
    with pytest.raises(ValueError, match="does not match"):
        ModelStore(tmp_path / "c", shipped_dir=shipped).get_or_train("student", {"k": 1}, SPEC, PRE, mixture(),
                                                                      progress=False)


def test_model_keys_are_plain_data_and_stable_across_processes():
    """Every profile's model keys serialise without a fallback and hash the same in a fresh
    process (kb-mc's ``trace`` is a method: its repr, with a memory address, once leaked into
    the key, so the paper profile's student and kb-mc teacher were never reused)."""
    import subprocess
    import sys

    code = ("import json; from kdlab.study.config import load_profile; from kdlab.study.teachers import model_key, "
            "base_tasks, student_mixture, teacher_mixture\n"
            "p = load_profile('params/paper.yaml')\n"
            "keys = [model_key('student', p.student, p.student_pretrain, student_mixture(p, base_tasks(p)), p.trace)]\n"
            "keys += [model_key('teacher-' + t, p.teacher, p.teacher_pretrain, teacher_mixture(p, t), p.trace) "
            "for t in base_tasks(p)]\n"
            "print(json.dumps(keys, sort_keys=True))")
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert "kb-mc" in runs[0] and "bound method" not in runs[0]


def test_per_task_teacher_steps_change_only_that_teachers_schedule_and_key(repo_root):
    from kdlab.study.config import load_profile
    from kdlab.models.store import model_key
    from kdlab.study.teachers import teacher_mixture, teacher_schedule

    base = load_profile(repo_root / "params" / "paper.yaml")
    steps = {**base.teacher_pretrain.task_steps, "kb-mc": 123}
    over = load_profile(repo_root / "params" / "paper.yaml", {"teacher_pretrain.task_steps": steps})
    assert teacher_schedule(over, "kb-mc").steps == 123
    for t in ("countdown-3", "rules-mc"):
        assert teacher_schedule(over, t) == teacher_schedule(base, t)

    def key(p, t):
        return model_key("teacher-" + t, p.teacher, teacher_schedule(p, t), teacher_mixture(p, t), p.trace)
    assert key(over, "countdown-3") == key(base, "countdown-3")
    assert key(over, "kb-mc") != key(base, "kb-mc") and key(over, "kb-mc")["pretrain"]["steps"] == 123


def test_student_extra_tasks_enter_the_student_mixture_and_key_only(repo_root):
    from kdlab.study.config import load_profile
    from kdlab.models.store import model_key
    from kdlab.study.teachers import student_mixture, student_tasks, teacher_mixture, teacher_schedule

    base = load_profile(repo_root / "params" / "quick.yaml")
    over = load_profile(repo_root / "params" / "quick.yaml", {"student_pretrain.extra_tasks": {"countdown-4": 1.5}})
    targets = ["countdown-3", "kb-mc", "rules-mc"]
    assert student_tasks(base) == targets and student_tasks(over) == targets + ["countdown-4"]
    mix = student_mixture(over, student_tasks(over))
    weights = {t.name: w for t, w in mix}
    assert (weights["countdown-3"], weights["countdown-4"]) == (over.student_pretrain.task_weight, 1.5)

    def skey(p):
        return model_key("student", p.student, p.student_pretrain, student_mixture(p, student_tasks(p)), p.trace)

    def tkey(p):
        return model_key("teacher-countdown-3", p.teacher, teacher_schedule(p, "countdown-3"),
                         teacher_mixture(p, "countdown-3"), p.trace)
    assert skey(over) != skey(base) and tkey(over) == tkey(base)
    # an empty list leaves the key as it was before the field existed (shipped hashes stay valid)
    assert "extra_tasks" not in skey(base)["pretrain"]


def test_model_table_evaluates_a_model_once_per_weights_and_eval_settings(tmp_path, repo_root, monkeypatch):
    """`kdlab teachers` and the study's models notebook share the models table's evaluations
    (minutes per real model): a second call with the same weights and eval settings reads the
    cache; other eval settings or other weights evaluate again."""
    from kdlab.study import teachers
    from kdlab.study.config import load_profile

    calls = []

    def fake_rows(profile, role, path, n_test, label):
        calls.append((role, n_test))
        return [{"model": label, "task": role, "accuracy": 0.5, "path": str(path)}]

    monkeypatch.setattr(teachers, "_model_rows", fake_rows)
    ckpt = ModelStore(tmp_path / "models", shipped_dir=None).get_or_train(
        "teacher-x", {"k": 1}, SPEC, PRE, mixture(), progress=False)
    profile = load_profile(repo_root / "params" / "tiny.yaml")
    cache = tmp_path / "cache"
    first = teachers.model_table(profile, {"x": ckpt}, cache_root=cache)
    again = teachers.model_table(profile, {"x": ckpt}, cache_root=cache)
    assert first == again and calls == [("x", profile.eval.n_test)]
    teachers.model_table(profile, {"x": ckpt}, n_test=3, cache_root=cache)  # other eval settings
    assert calls[-1] == ("x", 3)
    other = ModelStore(tmp_path / "models", shipped_dir=None).get_or_train(
        "teacher-x", {"k": 2}, SPEC, PRE, [(t, 1.0) for t in probe_tasks()[:3]], progress=False)
    teachers.model_table(profile, {"x": other}, cache_root=cache)  # other weights
    assert len(calls) == 3
    teachers.model_table(profile, {"x": ckpt}, cache_root=None)  # no cache: always evaluates
    assert len(calls) == 4


SHIPPED_CAP_BYTES = 20_000_000  # issue 20: all shipped checkpoints together at most 20 MB


def test_shipped_checkpoints_match_their_manifest_and_fit_the_cap():
    """Every shipped checkpoint is listed in the manifest with its packed weights' hash (the hash
    of the plain bytes), nothing unlisted is shipped, and the folder stays within its cap."""
    from kdlab.models.toy import SHIPPED_DIR, weights_file

    manifest = json.loads((SHIPPED_DIR / SHIPPED_MANIFEST).read_text())
    dirs = sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir())
    assert dirs == sorted(manifest)
    for name, sha in manifest.items():
        weights, got = weights_file(SHIPPED_DIR / name)
        assert weights.name == PACKED_WEIGHTS and got == sha, name
        assert checkpoint_meta(SHIPPED_DIR / name)["sha256"] == sha
    total = sum(f.stat().st_size for f in SHIPPED_DIR.rglob("*") if f.is_file())
    assert total <= SHIPPED_CAP_BYTES, f"checkpoints/ holds {total} bytes"


def test_models_to_train_names_what_is_neither_shipped_nor_cached(tmp_path):
    from kdlab.study.config import load_profile
    from kdlab.study.teachers import models_to_train

    params = Path(__file__).resolve().parents[1] / "params"
    assert models_to_train(load_profile(params / "quick.yaml"), tmp_path) == []  # all shipped
    # One task only: the student base learns another mixture, so it is a new model (3000 steps);
    # the rules-mc teacher is the shipped one.
    one = models_to_train(load_profile(params / "quick.yaml", {"grid.tasks": ["rules-mc"]}), tmp_path)
    assert len(one) == 1 and one[0].startswith("student-") and one[0].endswith(" (3000 steps)")
    tiny = load_profile(params / "tiny.yaml")
    todo = models_to_train(tiny, tmp_path)
    assert sorted(t.split("-")[0] for t in todo) == ["student", "teacher"]
    for entry in todo:  # a cached copy counts as built
        (tmp_path / entry.split(" ")[0]).mkdir()
        (tmp_path / entry.split(" ")[0] / "config.json").write_text("{}")
    assert models_to_train(tiny, tmp_path) == []
