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


def test_bad_parameters_exit_2(tmp_path, repo_root, capsys):
    assert main(["--outputs", str(tmp_path), "distill", str(repo_root / "params" / "tiny.yaml"),
                 "--set", "distill.dtype=fp16"]) == 2
    assert "distill.dtype" in capsys.readouterr().err
