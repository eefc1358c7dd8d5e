"""The kdlab command line end to end on the tiny profile: distill (saving the student), then GRPO from it."""
import json

from kdlab.cli import main


def test_distill_then_rlvr_from_the_distilled_student(tmp_path, repo_root):
    out = tmp_path / "o"
    params = str(repo_root / "params" / "tiny.yaml")
    assert main(["--outputs", str(out), "distill", params, "--policy", "on", "--kl", "reverse", "--lr", "1e-4",
                 "--save-student", "--set", "distill.steps=2"]) == 0
    run_dir = out / "tiny" / "runs" / "countdown-3_on_reverse_lr0.0001_s0"
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["policy"] == "on" and m["kl"] == "reverse" and 0 <= m["accuracy"] <= 1 and 0 <= m["sparsity"] <= 1
    assert (run_dir / "student" / "config.json").exists()
    assert main(["--outputs", str(out), "rlvr", params, "--start", str(run_dir / "student")]) == 0
    r = json.loads((out / "tiny" / "rlvr" / f"{run_dir.name}_s0" / "metrics.json").read_text())
    assert r["steps_done"] == 3 and r["task"] == "countdown-3" and 0 <= r["final_accuracy"] <= 1
    hist = json.loads((out / "tiny" / "rlvr" / f"{run_dir.name}_s0" / "history.json").read_text())
    assert len(hist) == 3 and all("reward_mean" in h for h in hist)


def test_rlvr_with_a_kl_to_the_teacher_loads_the_tasks_teacher(tmp_path, repo_root):
    """The joint objective (GRPO plus a KL-to-teacher term on the student's samples) from the base:
    the run records the teacher it pulled towards, and the penalty is non-zero from the first step
    (the base is not the teacher), where a penalty to the start is zero."""
    from kdlab.study import materials
    from kdlab.study.building import model_paths
    from kdlab.study.config import load_profile

    out = tmp_path / "o"
    params = str(repo_root / "params" / "tiny.yaml")
    sets = ["--set", "rlvr.kl_coef=0.1", "--set", "rlvr.kl_reference=teacher"]
    assert main(["--outputs", str(out), "rlvr", params, "--start", "base", *sets]) == 0
    r = json.loads((out / "tiny" / "rlvr" / "base_s0" / "metrics.json").read_text())
    teacher = model_paths(load_profile(params), out / "models", progress=False)["countdown-3"]
    assert r["kl_reference"] == "teacher" and r["kl_teacher_sha256"] == materials.model_id(teacher)
    hist = json.loads((out / "tiny" / "rlvr" / "base_s0" / "history.json").read_text())
    assert hist[0]["kl"] > 1e-3


def test_bad_parameters_exit_2(tmp_path, repo_root, capsys):
    assert main(["--outputs", str(tmp_path), "distill", str(repo_root / "params" / "tiny.yaml"),
                 "--set", "distill.dtype=fp16"]) == 2
    assert "distill.dtype" in capsys.readouterr().err


def test_teachers_capacity_check_trains_the_student_preset_with_the_teacher_recipe(tmp_path, repo_root, capsys):
    from kdlab.study.config import load_profile
    from kdlab.models.toy import load_checkpoint, n_params

    out = tmp_path / "o"
    params = str(repo_root / "params" / "tiny.yaml")
    # a student preset that differs from the teacher's, so the check must use the student's
    sets = ["--set", "teacher.size=student-s"]
    assert main(["--outputs", str(out), "teachers", params, "--capacity", *sets]) == 0
    rows = json.loads((out / "tiny" / "models.json").read_text())
    by_model = {r["model"]: r for r in rows}
    cap = by_model["capacity check (student preset, teacher recipe)"]
    assert cap["task"] == "countdown-3" and 0 <= cap["accuracy"] <= 1 and 0 <= cap["probe_mean"] <= 1
    assert "capacity check" in capsys.readouterr().out
    assert cap["n_params"] == by_model["student base"]["n_params"] != by_model["teacher"]["n_params"]
    assert "/capacity-countdown-3-" in cap["path"]
    meta = json.loads((out / "models" / cap["path"].rsplit("/", 1)[-1] / "kdlab.json").read_text())
    tiny = load_profile(params)
    assert meta["key"]["pretrain"]["steps"] == tiny.teacher_pretrain.steps  # the teacher's schedule
    assert any(m[0] == "countdown-3" and m[3] == tiny.teacher_pretrain.task_weight for m in meta["key"]["mixture"])


def test_diagnose_sorts_every_answer_into_one_error_mode(tmp_path, repo_root, capsys):
    from kdlab.models.toy import build_model, save_checkpoint
    from kdlab.tasks.countdown import ERROR_MODES

    ckpt = tmp_path / "nano"
    save_checkpoint(build_model("llama", "nano", seed=0), ckpt)
    params = str(repo_root / "params" / "tiny.yaml")
    out_json = tmp_path / "modes.json"
    assert main(["diagnose", params, str(ckpt), "--n", "12", "--json", str(out_json)]) == 0
    modes = json.loads(out_json.read_text())
    assert set(modes) <= set(ERROR_MODES) and sum(r["count"] for r in modes.values()) == 12
    assert abs(sum(r["share"] for r in modes.values()) - 1.0) < 1e-9
    assert "held-out countdown-3" in capsys.readouterr().out
    # an untrained model writes no valid answer; the bad inputs name what is wrong
    assert "correct" not in modes
    assert main(["diagnose", params, str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["diagnose", params, str(ckpt), "--task", "kb-mc"]) == 2
    assert "kb-mc" in capsys.readouterr().err


def test_one_run_commands_use_the_profiles_threads(tmp_path, repo_root, monkeypatch):
    """``threads`` in a profile (or ``--set threads=N``) sets torch's threads for ``kdlab distill`` and
    ``kdlab rlvr`` as it does for a study's kernels: two runs side by side with the default would
    each take every core (a 5x slowdown measured on 2 cores, docs/calibration.md 33)."""
    import torch

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    out = tmp_path / "o"
    params = str(repo_root / "params" / "tiny.yaml")
    assert main(["--outputs", str(out), "distill", params, "--set", "distill.steps=1", "--set", "threads=1"]) == 0
    assert calls == [1]
    assert main(["--outputs", str(out), "rlvr", params, "--start", "base", "--set", "rlvr.steps=1",
                 "--set", "threads=3"]) == 0
    assert calls == [1, 3]
    assert main(["--outputs", str(out), "distill", params, "--set", "distill.steps=1", "--out",
                 str(tmp_path / "r2")]) == 0
    assert calls == [1, 3]  # 0: torch's default is left alone
