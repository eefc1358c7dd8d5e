import subprocess
import sys

import pytest

from kdlab.config import ConfigError, Profile, from_dict, load_profile, read_yaml


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
