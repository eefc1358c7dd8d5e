import subprocess
import sys

import pytest

from pathlib import Path

from kdlab.study.config import ConfigError, Profile, from_dict, load_profile, read_yaml

REPO_TINY = Path(__file__).resolve().parents[1] / "params" / "tiny.yaml"


def write(tmp_path, text):
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


def test_shipped_profiles_load(repo_root):
    for path in sorted((repo_root / "params").glob("*.yaml")):
        prof = load_profile(path)
        assert isinstance(prof, Profile) and prof.name


def test_dfs_trace_with_countdown_3_only_loads(tmp_path):
    prof = load_profile(write(tmp_path, "trace: dfs\ngrid: {tasks: [countdown-3, kb-mc]}\nrlvr: {enabled: true, task: countdown-3}\n"))
    assert prof.trace == "dfs" and prof.rlvr.task == "countdown-3"


def test_off_on_are_strings_not_booleans(tmp_path):
    prof = load_profile(write(tmp_path, "grid: {policies: [off, on]}\n"))
    assert prof.grid.policies == ["off", "on"]
    assert read_yaml("a: yes") == {"a": "yes"} and read_yaml("a: true") == {"a": True}


def test_scientific_notation_floats(tmp_path):
    prof = load_profile(write(tmp_path, "grid: {lrs: [1e-4, 5.0e-4]}\n"))
    assert prof.grid.lrs == [1e-4, 5e-4]


@pytest.mark.parametrize("text, needle", [
    ("distil: {steps: 3}\n", "unknown key 'distil'"),
    ("distill: {stepz: 3}\n", "unknown key 'distill.stepz'"),
    ("distill: {steps: many}\n", "distill.steps: 'many' has the wrong type"),
    ("distill: {steps: 0}\n", "distill.steps: 0 is below the minimum 1"),
    ("distill: {dtype: fp16}\n", "distill.dtype: 'fp16' is not a valid choice; choose from ['bf16', 'fp32']"),
    ("grid: {kls: [forward, sideways]}\n", "grid.kls: 'sideways' is not a valid choice"),
    ("grid: {policies: [off, maybe]}\n", "grid.policies: 'maybe' is not a valid choice"),
    ("grid: {tasks: [chess]}\n", "task 'chess'"),
    ("grid: {lrs: [2.0]}\n", "grid.lrs: 2.0"),
    ("student: {size: enormous}\n", "student.size: 'enormous' is not a valid choice"),
    ("student: {family: gpt2}\n", "student.family: 'gpt2' is not a valid choice"),
    ("[1, 2]\n", "expected a mapping"),
    ("grid: {seeds: []}\n", "grid.seeds"),
    ("teacher_pretrain: {task_steps: {chess: 100}}\n", "teacher_pretrain.task_steps: 'chess' is not a valid choice"),
    ("teacher_pretrain: {task_steps: {kb-mc: 0}}\n", "teacher_pretrain.task_steps.kb-mc: 0 must be an integer >= 1"),
    ("student_pretrain: {task_steps: {kb-mc: 10}}\n", "student_pretrain.task_steps: only teachers"),
    ("student_pretrain: {extra_tasks: {chess: 1.0}}\n", "student_pretrain.extra_tasks: 'chess' is not a valid choice"),
    ("student_pretrain: {extra_tasks: {countdown-3: 1.0}}\n", "'countdown-3' is already a target task of the grid"),
    ("student_pretrain: {extra_tasks: {countdown-4: 0}}\n", "student_pretrain.extra_tasks.countdown-4: 0 must be a mixture weight > 0"),
    ("teacher_pretrain: {extra_tasks: {countdown-4: 1.0}}\n", "teacher_pretrain.extra_tasks: only the student base"),
    ("trace: bfs\n", "trace: 'bfs' is not a valid choice"),
    ("trace: dfs\neval: {harder: [countdown-4e]}\n", "eval.harder: 'countdown-4e' cannot be used with trace 'dfs'"),
    ("trace: dfs\ngrid: {tasks: [countdown-3, countdown-4]}\n", "grid.tasks: 'countdown-4' cannot be used with trace 'dfs'"),
    ("trace: dfs\nstudent_pretrain: {extra_tasks: {countdown-4: 1.0}}\n", "student_pretrain.extra_tasks: 'countdown-4' cannot"),
    ("trace: dfs\nrlvr: {enabled: true}\n", "rlvr.task: 'countdown-4' cannot be used with trace 'dfs'"),
    ("trace: dfs\nstyle: {enabled: true}\n", "style.enabled: needs countdown traces in style 'steps' or 'search', got trace 'dfs'"),
])
def test_invalid_parameters_name_key_and_value(tmp_path, text, needle):
    with pytest.raises(ConfigError) as err:
        load_profile(write(tmp_path, text))
    assert needle in str(err.value)
    assert "p.yaml" in str(err.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_profile(write(tmp_path, "a: [1,\n"))


def test_overrides_are_validated_too(tmp_path):
    p = write(tmp_path, "name: x\n")
    assert load_profile(p, {"distill.steps": 7}).distill.steps == 7
    with pytest.raises(ConfigError, match="distill.steps"):
        load_profile(p, {"distill.steps": -1})


def test_cli_rejects_bad_params_before_work(tmp_path):
    p = write(tmp_path, "distill: {stepz: 3}\n")
    out = subprocess.run([sys.executable, "-m", "kdlab", "--outputs", str(tmp_path / "o"), "teachers", str(p)],
                         capture_output=True, text=True, env={**__import__("os").environ, "PYTHONPATH": "src"})
    assert out.returncode == 2
    assert "distill.stepz" in out.stderr
    assert not (tmp_path / "o").exists()


def test_from_dict_nested_unknown():
    with pytest.raises(ConfigError, match="eval.bogus"):
        from_dict(Profile, {"eval": {"bogus": 1}})


def test_paper_training_details_are_parameters(tmp_path):
    """teacher/student temperatures, warm-up, prompts per step and fused AdamW: validated like any
    key; unset they keep kdlab's toy behaviour; the paper profiles set the paper's values."""
    d = load_profile(write(tmp_path, "name: x\n")).distill
    assert (d.teacher_temperature, d.student_temperature, d.fused_adamw, d.warmup, d.batch_size) == (None, None, False, 0, 32)
    p = load_profile(write(tmp_path, "distill: {teacher_temperature: 0.5, student_temperature: 1.0, fused_adamw: true, "
                                     "warmup: 10}\ngrid: {kls: [sf]}\n"))
    assert (p.distill.teacher_temperature, p.distill.fused_adamw, p.grid.kls) == (0.5, True, ["sf"])
    for text, needle in (("distill: {teacher_temperature: 0}\n", "distill.teacher_temperature"),
                         ("distill: {student_temperature: .nan}\n", "distill.student_temperature"),
                         ("distill: {fused_adamw: 1}\n", "distill.fused_adamw"),
                         ("distill: {warmup: -1}\n", "distill.warmup")):
        with pytest.raises(ConfigError, match=needle):
            load_profile(write(tmp_path, text))


# ------------------------------------------------------------------- issue 35: bounds, notes


def _bounded_fields(cls, path=""):
    """(dotted key, kind of bound) of every field of ``cls`` with an upper bound (``bound=``),
    nested mappings included (lists of mappings: their own dataclass, checked separately)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _bounded_fields(hints[f.name], f"{path}{f.name}.")
        elif f.metadata.get("bound"):
            yield path + f.name, f.metadata["bound"], typing.get_origin(hints[f.name]) is list


def test_every_bounded_size_is_refused_above_its_bound_with_the_reason():
    from kdlab.study.config import BOUNDS, BenchmarkSpec, PretrainedTaskSpec, _check_range, dataclasses

    fields = list(_bounded_fields(Profile))
    assert {"distill.steps", "distill.batch_size", "distill.offpd_pool", "eval.pass_n", "pretrained.max_prompt_tokens",
            "pretrained.micro_batch_size", "rlvr.prompts_per_step"} <= {k for k, _, _ in fields}
    for key, kind, is_list in fields:
        top, why = BOUNDS[kind]
        assert why and top > 0
        value = top + 1
        with pytest.raises(ConfigError, match=f"{key}: {value} is above the bound {top:,} \\({why[:20]}"):
            load_profile(REPO_TINY, {key: [value] if is_list else value})
    for cls in (BenchmarkSpec, PretrainedTaskSpec):  # lists of mappings under pretrained
        meta = {f.name: f.metadata for f in dataclasses.fields(cls)}
        with pytest.raises(ConfigError, match="above the bound 32,768"):
            _check_range("pretrained.tasks[0].max_new_tokens", 40_000, meta["max_new_tokens"])


def test_shipped_profiles_are_within_the_bounds_and_say_nothing_dropped(repo_root):
    from kdlab.study.config import dropped_values

    for name in ("quick", "paper", "beyond", "smol", "paper-llama", "paper-qwen", "tiny-beyond"):
        assert dropped_values(load_profile(repo_root / "params" / f"{name}.yaml")) == [], name


def test_what_the_study_drops_or_collapses_is_said():
    from kdlab.study.config import dropped_values

    p = load_profile(REPO_TINY, {"grid.lrs": [2e-4, 0.0002, 1e-3, 1e-3], "grid.lambdas": [0.0, -0.0, 0.5],
                                 "eval.pass_n": 4, "eval.pass_ks": [1, 1, 8, 16]})
    assert dropped_values(p) == ["eval.pass_ks lists 1 more than once (done once)",
                                 "grid.lambdas lists 0.0 more than once (done once)",
                                 "grid.lrs lists 0.0002, 0.001 more than once (done once)",
                                 "eval.pass_ks [8, 16] are above eval.pass_n 4 (no pass@8, pass@16 recorded)"]
    assert dropped_values(load_profile(REPO_TINY, {"eval.pass_ks": [1, 4]})) == []


def test_the_device_is_auto_cpu_cuda_or_cuda_n():
    for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert load_profile(REPO_TINY, {"pretrained.device": device}).pretrained.device == device
    for device in ("gpu", "cuda:", "cuda:x", "cuda0", "CUDA", "mps"):
        with pytest.raises(ConfigError, match=f"pretrained.device: '{device}' is not a device"):
            load_profile(REPO_TINY, {"pretrained.device": device})
