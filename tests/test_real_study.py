"""``kdlab study`` on real Hugging Face checkpoints: tiny random Llama / Qwen2 models with byte-level
BPE tokenizers (``tiny_hf``), a choice task and a math task from small made-up files, a made-up
benchmark for forgetting. The same runner, run notebook, results table, report and scoreboard as
the toy study; resume after a kill; a failing run recorded while the study goes on; every
refusal of what the profile names on disk, before anything is written."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pandas as pd
import pytest
import yaml

from kdlab.cli import main
from kdlab.study.config import load_profile
from kdlab.study.results import REQUIRED_COLUMNS
from kdlab.study.plan import expand_grid, notebook_finished
from kdlab.study.runner import run_study
from test_study import ensure_kernel, kill_after_first_run
from tiny_hf import build_checkpoint, build_tokenizer, write_real_profile

REPO_ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("qwen2", "llama")
RUNS = 2 * 2 * 2 * 2 + 2 * 2  # tasks x policies x kls x lrs (1 seed), then lambda 0 on one task x kls x lrs


@pytest.fixture(scope="module", params=FAMILIES)
def real_study(request, tmp_path_factory) -> SimpleNamespace:
    ensure_kernel()
    root = tmp_path_factory.mktemp(f"real-{request.param}")
    profile = write_real_profile(root / "data", request.param)
    outputs = root / "out"
    t0 = time.perf_counter()
    rc = run_study(profile, outputs, workers=2, progress=False)
    return SimpleNamespace(family=request.param, profile=profile, outputs=outputs, rc=rc,
                           study_dir=outputs / "hf-tiny", wall_s=time.perf_counter() - t0)


def test_real_checkpoint_study_runs_the_grid_through_notebooks_table_and_report(real_study):
    assert real_study.rc == 0
    study = real_study.study_dir
    cells = expand_grid(load_profile(real_study.profile))
    assert len(cells) == RUNS
    for cfg in cells:
        run_dir = study / "runs" / cfg.run_id
        assert notebook_finished(run_dir / "run.ipynb"), cfg.run_id
        m = json.loads((run_dir / "metrics.json").read_text())
        assert m["model_kind"] == "pretrained" and m["steps_done"] == 2 and m["micro_batch_size"] == 2
        assert m["student_path"].endswith(f"{real_study.family}-student")
        assert m["teacher_id"].startswith("stamp:")
        for key in ("accuracy", "base_accuracy", "pass_at_1", "pass_at_2", "probe_bench", "probe_mean", "sparsity"):
            assert 0.0 <= m[key] <= 1.0, (cfg.run_id, key)
        assert m["forgetting"] == pytest.approx(m["probe_mean"] - m["base_probe_mean"])
        assert 0.0 < m["sparsity"] < 1.0  # it trained, in bf16 without a master copy
    df = pd.read_parquet(study / "results.parquet")
    assert len(df) == RUNS and set(REQUIRED_COLUMNS) <= set(df.columns)
    assert {"student_path", "teacher_path", "student_id", "teacher_id"} <= set(df.columns)
    assert sorted(df["task"].unique()) == ["arith", "mc"] and sorted(df["lam"].unique()) == [-1.0, 0.0, 1.0]
    models = json.loads((study / "models.json").read_text())
    assert sorted((r["model"], r["task"]) for r in models) == [("student base", "arith"), ("student base", "mc"),
                                                              ("teacher", "arith"), ("teacher", "mc")]
    html = (study / "report.html").read_text()
    for section in ("Accuracy by policy", "Findings scoreboard", "Lambda spectrum"):
        assert section in html, section
    assert "Traceback" not in html
    for nb_path in [study / "report.ipynb", *sorted((study / "analysis").glob("*.ipynb"))]:
        nb = nbformat.read(nb_path, as_version=4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        assert not errors, nb_path.name
    board = json.loads((study / "analysis" / "70_statistics" / "scoreboard.json").read_text())
    assert len(board) >= 6 and all(row.get("verdict") for row in board)
    grads = json.loads((study / "analysis" / "50_gradients" / "summary.json").read_text())
    assert grads["models"]["demo"] is False  # the study's own checkpoints, not the demo models


@pytest.fixture(scope="module")
def qwen_profile(tmp_path_factory) -> Path:
    return write_real_profile(tmp_path_factory.mktemp("resume"), "qwen2")


def test_real_study_resumes_after_a_kill_and_records_a_failing_run(qwen_profile, tmp_path, capsys):
    """Kill and failure semantics on one family (both families run the full study above)."""
    real_study = SimpleNamespace(profile=qwen_profile)
    sets = ["--set", "grid.tasks=[mc]", "--set", "grid.lambdas=[]", "--set", "grid.lrs=[1.0e-4]"]
    outputs = tmp_path / "out"
    argv = ["--outputs", str(outputs), "study", str(real_study.profile), "--workers", "1", "--quiet", *sets]
    study = outputs / "hf-tiny"
    kill_after_first_run(argv, study, tmp_path)
    before = {p.parent.name: p.stat().st_mtime_ns for p in study.glob("runs/*/metrics.json")}
    assert 1 <= len(before) < 4
    # A file where the OffPD rollout cache belongs: the off-policy runs not yet done fail for real.
    shutil.rmtree(outputs / "cache" / "offpd", ignore_errors=True)
    (outputs / "cache").mkdir(exist_ok=True)
    (outputs / "cache" / "offpd").write_text("not a directory")
    rc = main(argv)
    out = capsys.readouterr().out
    assert f"({len(before)} already complete" in out
    for run_id, mtime in before.items():  # completed runs were not redone
        assert (study / "runs" / run_id / "metrics.json").stat().st_mtime_ns == mtime
    cells = [c.run_id for c in expand_grid(load_profile(real_study.profile, {"grid.tasks": ["mc"], "grid.lambdas": [],
                                                                             "grid.lrs": [1e-4]}))]
    failed = [r for r in cells if (study / "runs" / r / "error.json").exists()]
    done = [r for r in cells if (study / "runs" / r / "metrics.json").exists()]
    assert sorted(failed + done) == sorted(cells)
    assert all("_off_" in r and r not in before for r in failed)  # only off-policy runs touch that cache
    assert rc == (1 if failed else 0)
    if failed:
        assert json.loads((study / "runs" / failed[0] / "error.json").read_text())["ename"] == "FileExistsError"
        assert f"{len(failed)} run(s) failed" in out
    assert sorted(pd.read_parquet(study / "results.parquet")["run_id"]) == sorted(done)
    assert (study / "report.html").exists()


# ------------------------------------------------------------------------------- refusals


def _edit(profile: Path, tmp_path: Path, edit) -> Path:
    data = yaml.safe_load(profile.read_text())
    edit(data)
    out = tmp_path / "edited.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _refused(path: Path, tmp_path: Path, capsys, *needles: str) -> None:
    outputs = tmp_path / "refused-out"
    capsys.readouterr()  # what the test itself printed so far
    assert main(["--outputs", str(outputs), "study", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    assert not outputs.exists()  # nothing written


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory) -> Path:
    return write_real_profile(tmp_path_factory.mktemp("refusals"), "llama")


def test_refuses_a_missing_checkpoint(profile_file, tmp_path, capsys):
    def edit(d):
        d["pretrained"]["tasks"][0]["teacher"] = str(tmp_path / "no-such-teacher")
    _refused(_edit(profile_file, tmp_path, edit), tmp_path, capsys, "pretrained.tasks[0].teacher", "does not exist")


def test_refuses_a_directory_that_is_not_a_checkpoint(profile_file, tmp_path, capsys):
    (tmp_path / "empty").mkdir()

    def edit(d):
        d["pretrained"]["student"] = str(tmp_path / "empty")
    _refused(_edit(profile_file, tmp_path, edit), tmp_path, capsys, "pretrained.student", "no config.json")


def test_refuses_placeholders(profile_file, tmp_path, capsys):
    def edit(d):
        d["pretrained"]["benchmarks"][0]["path"] = "/path/to/ood_benchmark_1.jsonl"
    _refused(_edit(profile_file, tmp_path, edit), tmp_path, capsys, "pretrained.benchmarks[0].path", "placeholder")
    _refused(REPO_ROOT / "params" / "paper-llama.yaml", tmp_path, capsys, "pretrained.student", "placeholder")


def test_refuses_a_vocabulary_mismatch_showing_the_first_differences(profile_file, tmp_path, capsys):
    other = build_checkpoint(tmp_path / "other-teacher", "qwen2", "teacher", build_tokenizer("qwen2", vocab_size=380))

    def edit(d):
        d["pretrained"]["tasks"][1]["teacher"] = str(other)
    _refused(_edit(profile_file, tmp_path, edit), tmp_path, capsys, "pretrained.tasks[1].teacher",
             "vocabularies differ", "first (id, teacher, student)")


def test_refuses_a_data_file_without_the_fields_its_kind_needs(profile_file, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "Q?", "options": {"A": "x", "B": "y"}}) + "\n")  # no answer

    def edit(d):
        d["pretrained"]["tasks"][0]["train"] = str(bad)
    _refused(_edit(profile_file, tmp_path, edit), tmp_path, capsys, "pretrained.tasks[0].train", "row 0",
             "answer")


def test_refuses_follow_ups_that_need_toy_models(profile_file, tmp_path, capsys):
    def edit(d):
        d["rlvr"] = {"enabled": True}
    _refused(_edit(profile_file, tmp_path, edit), tmp_path, capsys, "rlvr.enabled")
