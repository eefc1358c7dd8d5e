"""Bad input on the command line: one clear line naming the key, flag or value, exit code 2, no
traceback, nothing written. (Every check here fails before any model is loaded.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from kdlab.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = str(REPO_ROOT / "params" / "tiny.yaml")


def _refused(capsys, tmp_path, argv, *needles):
    outputs = tmp_path / "out"
    assert main(["--outputs", str(outputs), *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    assert not outputs.exists()


@pytest.mark.parametrize("override,needle", [
    ("distill.temperature=nan", "distill.temperature: nan is not a finite number"),
    ("eval.temperature=.inf", "eval.temperature: inf is not a finite number"),
    ("student_pretrain.lr=.nan", "student_pretrain.lr: nan is not a finite number"),
    ("student_pretrain.lr=0", "student_pretrain.lr: 0.0 must be above 0.0"),
    ("rlvr.lr=0", "rlvr.lr: 0.0 must be above 0.0"),
    ("grid.lrs=[1e-4", "--set grid.lrs=[1e-4: the value is not valid YAML"),
    ("distill.steps.foo=1", "--set distill.steps.foo: distill.steps is not a mapping"),
    ("grid.lrs.0=1", "--set grid.lrs.0: grid.lrs is not a mapping"),
    ("grid.seeds=[-1]", "grid.seeds: -1 is below the minimum 0"),
    ("nokey", "--set expects KEY=VALUE"),
])
def test_bad_overrides_are_one_line(capsys, tmp_path, override, needle):
    _refused(capsys, tmp_path, ["study", TINY, "--set", override], needle)


@pytest.mark.parametrize("flags,needle", [
    (["--lr", "-1"], "--lr: -1.0 must be above 0.0 and at most 1.0"),
    (["--lr", "0"], "--lr: 0.0 must be above 0.0"),
    (["--lr", "nan"], "--lr: nan is not a finite number"),
    (["--lr", "inf"], "--lr: inf is not a finite number"),
    (["--lr", "1e30"], "--lr: 1e+30 is above the maximum 1.0"),
    (["--kl", "bogus"], "--kl: 'bogus' is not a valid choice"),
    (["--lam", "99"], "--lam: 99.0 is above the maximum 3.0"),
    (["--policy", "lambda"], "--lam: policy 'lambda' needs lam"),
    (["--seed", "-1"], "--seed: -1 is below the minimum 0"),
    (["--task", "countdown-9"], "--task 'countdown-9'"),
    (["--task", "kb-mc"], "--task 'kb-mc': profile"),
])
def test_distill_flags_are_validated_like_a_profile(capsys, tmp_path, flags, needle):
    _refused(capsys, tmp_path, ["distill", TINY, *flags], needle)


def test_workers_and_empty_or_duplicated_profiles(capsys, tmp_path):
    _refused(capsys, tmp_path, ["study", TINY, "--workers", "0"], "--workers 0: must be at least 1")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    _refused(capsys, tmp_path, ["study", str(empty)], "empty.yaml: the profile is empty")
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: a\ndistill: {steps: 2}\ndistill: {steps: 3}\n")
    _refused(capsys, tmp_path, ["study", str(dup)], "dup.yaml: not valid YAML", "duplicate key 'distill'")


def test_outputs_is_accepted_after_the_subcommand(capsys, tmp_path):
    outputs = tmp_path / "late"
    assert main(["study", TINY, "--outputs", str(outputs), "--set", "grid.kls=[bogus]"]) == 2
    assert "grid.kls" in capsys.readouterr().err and not outputs.exists()
    with pytest.raises(SystemExit):
        main(["study", "--help"])
    assert "--outputs" in capsys.readouterr().out


# ------------------------------------------------------------------- issue 35: round three

SMOL = str(REPO_ROOT / "params" / "smol.yaml")


@pytest.mark.parametrize("device,gpus,needle", [
    ("cuda", None, "pretrained.device: 'cuda' asks for a GPU but this machine has none"),
    ("cuda:0", None, "pretrained.device: 'cuda:0' asks for a GPU but this machine has none"),
    ("cuda:3", 1, "pretrained.device: 'cuda:3' but this machine has 1 CUDA device(s), cuda:0 to cuda:0"),
    ("gpu", None, "pretrained.device: 'gpu' is not a device; choose auto, cpu, cuda or cuda:N"),
])
@pytest.mark.parametrize("profile", [TINY, SMOL])
def test_a_gpu_that_is_not_there_is_refused_before_any_work(capsys, tmp_path, monkeypatch, profile, device, gpus,
                                                             needle):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus is not None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus or 0)
    for cmd in ("study", "teachers", "distill"):
        _refused(capsys, tmp_path, [cmd, profile, "--set", f"pretrained.device={device}"], needle)


def test_a_gpu_that_is_there_is_accepted(monkeypatch, tmp_path):
    import torch

    from kdlab.study.config import load_profile
    from kdlab.study.preflight import check_machine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    for device in ("auto", "cpu", "cuda", "cuda:3"):
        check_machine(load_profile(TINY, {"pretrained.device": device}), tmp_path / "models")


def test_optional_packages_a_profile_needs_are_checked_up_front(capsys, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # not importable
    monkeypatch.setitem(sys.modules, "ray", None)
    for cmd in ("study", "teachers"):  # (the SmolLM2 import needs gguf; nothing is downloaded first)
        _refused(capsys, tmp_path, [cmd, SMOL], "pretrained.student: 'smollm2' is imported from a GGUF file",
                 "needs the package 'gguf'", "pip install 'kdlab[real]'")
    _refused(capsys, tmp_path, ["study", TINY, "--ray-address", "auto"],
             "--ray-address: 'auto' sends the runs to a Ray cluster", "needs the package 'ray'", "pip install 'ray>=")
    _refused(capsys, tmp_path, ["study", TINY, "--set", "pretrained.ray_address=auto"], "pretrained.ray_address: 'auto'",
             "needs the package 'ray'")


def test_gguf_is_not_needed_once_the_model_is_imported(tmp_path, monkeypatch):
    import sys

    from kdlab.study.config import load_profile
    from kdlab.study.preflight import check_machine
    from kdlab.models.smol import checkpoint_dir

    monkeypatch.setitem(sys.modules, "gguf", None)
    imported = checkpoint_dir(tmp_path / "models")
    imported.mkdir(parents=True)
    (imported / "kdlab.json").write_text("{}")
    check_machine(load_profile(SMOL), tmp_path / "models")  # nothing to import: no gguf needed


def test_a_profile_path_that_is_a_directory_or_not_text_is_one_line(capsys, tmp_path):
    _refused(capsys, tmp_path, ["study", str(REPO_ROOT / "params")], "params is a directory; give a profile file in it:",
             "quick.yaml")
    (tmp_path / "folder.yaml").mkdir()
    _refused(capsys, tmp_path, ["study", str(tmp_path / "folder.yaml")], "folder.yaml is a directory")
    child = tmp_path / "child.yaml"
    child.write_text("extends: folder.yaml\nname: child\n")
    _refused(capsys, tmp_path, ["distill", str(child)], "child.yaml: extends: 'folder.yaml'", "is a directory")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: x\n\xff\xfe\n")
    _refused(capsys, tmp_path, ["teachers", str(binary)], "binary.yaml is not UTF-8 text")


@pytest.mark.parametrize("override,needle", [
    ("distill.steps=100000000", "distill.steps: 100000000 is above the bound 100,000 (optimisation steps: the paper"),
    ("student_pretrain.steps=1000001", "student_pretrain.steps: 1000001 is above the bound 100,000"),
    ("teacher_pretrain.task_steps={kb-mc: 200000}", "teacher_pretrain.task_steps.kb-mc: 200000 is above the bound"),
    ("distill.batch_size=100000", "distill.batch_size: 100000 is above the bound 4,096 (rows per optimisation step"),
    ("pretrained.micro_batch_size=5000", "pretrained.micro_batch_size: 5000 is above the bound 4,096"),
    ("pretrained.max_prompt_tokens=1000000", "pretrained.max_prompt_tokens: 1000000 is above the bound 32,768 (tokens"),
    ("distill.offpd_pool=10000000", "distill.offpd_pool: 10000000 is above the bound 100,000 (problems or rollouts"),
    ("eval.n_test=1000000", "eval.n_test: 1000000 is above the bound 100,000"),
    ("eval.pass_n=100000", "eval.pass_n: 100000 is above the bound 1,024 (samples per problem"),
    ("rlvr.group_size=5000", "rlvr.group_size: 5000 is above the bound 1,024"),
    ("rlvr.seeds=[-1]", "rlvr.seeds: -1 is below the minimum 0"),
])
def test_absurd_sizes_are_refused_with_the_bound_and_its_reason(capsys, tmp_path, override, needle):
    _refused(capsys, tmp_path, ["study", TINY, "--set", override], needle)


def test_a_checkpoint_without_tokenizer_files_is_one_line(capsys, tmp_path):
    import shutil

    import yaml
    from tiny_hf import write_real_profile

    profile = write_real_profile(tmp_path / "data", "llama")
    capsys.readouterr()  # (its progress bars)
    for where in ("pretrained.student", "pretrained.tasks[0].teacher"):
        data = yaml.safe_load(profile.read_text())
        holder, role = (data["pretrained"], "student") if where == "pretrained.student" else \
            (data["pretrained"]["tasks"][0], "teacher")
        bare = tmp_path / f"bare-{role}"
        shutil.copytree(holder[role], bare)
        for f in bare.glob("tokenizer*"):
            f.unlink()
        holder[role] = str(bare)
        edited = tmp_path / f"no-tokenizer-{role}.yaml"
        edited.write_text(yaml.safe_dump(data, sort_keys=False))
        _refused(capsys, tmp_path, ["study", str(edited)], f"{where}: '{bare}' has a config.json but no tokenizer",
                 "tokenizer.save_pretrained")


def test_what_a_study_drops_or_collapses_is_said_in_one_line(capsys, tmp_path, monkeypatch):
    import kdlab.study.runner as runner
    from kdlab.study.runner import run_study

    monkeypatch.setattr(runner, "_run_profile", lambda *a, **k: 0)  # stop where the work would start
    assert run_study(TINY, tmp_path / "out", overrides={"grid.lrs": [2e-4, 0.0002]}, progress=False) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert notes == ["note: grid.lrs lists 0.0002 more than once (done once); "
                     "eval.pass_ks [10] is above eval.pass_n 4 (no pass@10 recorded)"]


def test_a_run_out_of_gpu_memory_on_the_command_line_is_one_line_with_the_settings_to_lower(capsys, tmp_path,
                                                                                           monkeypatch):
    import torch

    import kdlab.study.runs

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore text")

    monkeypatch.setattr(kdlab.study.runs, "execute_run", out_of_memory)
    outputs = tmp_path / "out"
    assert main(["--outputs", str(outputs), "distill", TINY, "--set", "pretrained.micro_batch_size=4"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "kdlab: note: eval.pass_ks [10] is above eval.pass_n 4 (no pass@10 recorded)"
    assert len(lines) == 2 and "CUDA out of memory. Tried to allocate 20.00 GiB more text" in lines[1]
    assert "lower pretrained.micro_batch_size (rows per forward/backward, now 4)" in lines[1]
    assert "pretrained.kl_chunk_size" in lines[1] and not outputs.exists()


@pytest.mark.parametrize("override,needle", [
    ("grid.task_lrs={kb-mcq: [1e-4, 5e-4]}", "grid.task_lrs: 'kb-mcq' is not a valid task; choose from"),
    ("grid.task_lrs={countdown-3: [1e-4]}", "grid.task_lrs.countdown-3: ['1e-4'] must be a list of 2 learning rates"),
    ("grid.task_lrs={countdown-3: 1e-4}", "grid.task_lrs.countdown-3: '1e-4' must be a list of 2 learning rates"),
    ("grid.task_lrs={countdown-3: [1e-4, 0]}", "grid.task_lrs.countdown-3[1]: 0.0 must be above 0.0"),
    ("grid.task_lrs={countdown-3: [1e-4, fast]}", "grid.task_lrs.countdown-3[1]: 'fast' has the wrong type"),
    ("grid.task_lrs={countdown-3: [5e-4, 1e-4]}", "grid.task_lrs.countdown-3: [0.0005, 0.0001] must be distinct "
                                                  "and in the order of grid.lrs"),
    ("grid.task_lrs={countdown-3: [1e-4, 1e-4]}", "must be distinct and in the order of grid.lrs"),
    ("grid.task_lrs=[1e-4, 5e-4]", "grid.task_lrs: ['1e-4', '5e-4'] has the wrong type; expected dict"),
])
def test_a_malformed_per_task_rate_is_refused_in_one_line(capsys, tmp_path, override, needle):
    _refused(capsys, tmp_path, ["study", TINY, "--set", override], needle)


def test_teacher_hidden_states_with_a_sampled_kl_are_refused_before_any_work(capsys, tmp_path):
    _refused(capsys, tmp_path, ["study", TINY, "--set", "pretrained.teacher_hidden=true", "--set", "grid.kls=[forward, k3]"],
             "teacher_hidden: the KL from the teacher's hidden states is the full-vocabulary forward / reverse KL; "
             "kl 'k3' needs the teacher's logits")
