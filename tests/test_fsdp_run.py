"""kdlab.study.fsdp_run: two CPU processes on gloo with FSDP2-sharded student and teacher, launched the
way ``accelerate launch --multi_gpu`` launches (torch.distributed.run), checked against the same
run in one unsharded process."""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tiny_hf import build_pair, write_synthetic_choice

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install 'accelerate>=1.0'); "
                                         "kdlab.study.fsdp_run needs it")
from kdlab.study.fsdp_run import main

REPO_ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(_free_port()), "-m", "kdlab.study.fsdp_run", *args, "--cpu"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _profile(root: Path, family: str, teacher: Path, student: Path, data: Path, bench: Path) -> Path:
    """A real-checkpoint profile of one choice task on the tiny pair, at the test's scale."""
    profile = {
        "name": f"fsdp-{family}",
        "pretrained": {"student": str(student),
                       "tasks": [{"name": "mc", "kind": "choice", "train": str(data), "teacher": str(teacher),
                                  "max_new_tokens": 6}],
                       "benchmarks": [{"kind": "choice", "path": str(bench), "name": "mc", "max_new_tokens": 4}],
                       "n_benchmark": 3, "device": "cpu", "gradient_checkpointing": False},
        # 32 OffPD prompts: two sampling chunks of 16 (HFCodec.eval_batch_size), one per rank
        "distill": {"steps": 2, "batch_size": 4, "offpd_pool": 32, "dtype": "fp32", "grad_clip": 0.05},
        "eval": {"n_test": 3, "pass_n": 2, "pass_problems": 2, "pass_ks": [1]},
        "grid": {"tasks": ["mc"], "policies": ["off"], "kls": ["forward"], "lrs": [1.0e-3], "seeds": [0],
                 "lambda_tasks": ["mc"]},
    }
    path = root / f"fsdp-{family}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    pairs = {fam: build_pair(root, fam) for fam in ("llama", "qwen2")}
    # Let the qwen2 teacher stop on 60 of its ~400 ids, so that rollouts have ragged lengths and
    # ranks / micro-batches hold different numbers of tokens (what the loss weighting is for).
    gen_path = pairs["qwen2"][0] / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    gen["eos_token_id"] = [gen["eos_token_id"], *range(100, 160)]
    gen_path.write_text(json.dumps(gen))
    data = write_synthetic_choice(root / "train.jsonl")
    bench = write_synthetic_choice(root / "bench.jsonl", n=12, seed=3)
    profiles = {fam: _profile(root, fam, *pairs[fam], data, bench) for fam in pairs}
    return root, pairs, profiles


def test_offpd_two_sharded_processes_equal_one_process(setup):
    """The study's run, sharded over two processes by the launcher: the global token-mean objective,
    global grad norm and clipping, the gathered student and rank 0's evaluation reproduce the same
    run in one unsharded process with micro-batches of one row (same pool and batches), and the
    record is the study's own (kdlab.study.records)."""
    from kdlab.study.records import record_problems

    root, pairs, profiles = setup
    teacher, student = pairs["qwen2"]  # tied embeddings, vocabulary padded differently per model
    out = root / "outputs"
    common = [str(profiles["qwen2"]), "--outputs", str(out), "--policy", "off", "--save-student"]
    _launch([*common, "--out", str(root / "off2")])
    ranks = [json.loads((root / "off2" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 2
    assert all(math.isfinite(h["loss"]) and h["loss"] > 0 for h in ranks[0])
    assert any(h["length"] < 6 for h in ranks[0])  # ragged responses
    assert record_problems(root / "off2") == []  # a complete record, as any study run writes
    metrics = json.loads((root / "off2" / "metrics.json").read_text())
    assert metrics["steps_done"] == 2 and metrics["run_id"] == "mc_off_forward_lr0.001_s0"

    # One process, the batch in micro-batches of one row: the same objective and updates.
    assert main([*common, "--out", str(root / "off1"), "--cpu", "--threads", "1",
                 "--set", "pretrained.micro_batch_size=1"]) == 0
    single = json.loads((root / "off1" / "history.json").read_text())
    for a, b in zip(ranks[0], single):
        for key in ("loss", "forward_kl", "reverse_kl", "grad_norm", "length"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    assert single[0]["grad_norm"] > 0.05  # clipping was active
    sharded = load_file(root / "off2" / "student" / "model.safetensors")
    alone = load_file(root / "off1" / "student" / "model.safetensors")
    init = load_file(student / "model.safetensors")
    assert sorted(sharded) == sorted(alone)
    assert max(float((sharded[k] - alone[k]).abs().max()) for k in sharded) < 1e-6
    assert max(float((sharded[k] - init[k]).abs().max()) for k in sharded) > 1e-4  # it did train

    # Evaluation on rank 0: same scores as the single process; forgetting and sparsity by hand.
    m1 = json.loads((root / "off1" / "metrics.json").read_text())
    for key in ("accuracy", "pass_at_1", "probe_mc", "probe_mean", "base_accuracy", "base_probe_mean",
                "forgetting", "sparsity"):
        assert 0 <= abs(metrics[key]) <= 1 and metrics[key] == pytest.approx(m1[key], abs=1e-6), key
    assert metrics["forgetting"] == pytest.approx(metrics["probe_mean"] - metrics["base_probe_mean"])
    unchanged = sum(int(((sharded[k] - init[k]).abs() < 1e-6).sum()) for k in sharded)
    assert metrics["sparsity"] == pytest.approx(unchanged / sum(v.numel() for v in sharded.values()))
    assert len(list((out / "cache" / "base_eval").glob("mc-*.json"))) == 1  # the base was evaluated once


def test_onpd_two_sharded_processes_agree(setup):
    root, pairs, profiles = setup
    _launch([str(profiles["llama"]), "--outputs", str(root / "outputs"), "--policy", "on", "--kl", "reverse",
             "--out", str(root / "on2"), "--no-shard-teacher"])  # untied embeddings, two stop ids
    ranks = [json.loads((root / "on2" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 2
    assert all(math.isfinite(h["loss"]) and h["loss"] == pytest.approx(h["reverse_kl"]) for h in ranks[0])


def test_bad_flags_are_one_line(setup, tmp_path, capsys):
    root, pairs, profiles = setup
    profile = str(profiles["llama"])
    for args, needle in [(["--policy", "sideways"], None), (["--kl", "k9"], "--kl: 'k9' is not a valid choice"),
                         (["--lr", "0"], "--lr: 0.0 must be above 0.0"), (["--task", "essay"], "--task 'essay'"),
                         (["--set", "distill.steps=0"], "distill.steps: 0 is below the minimum 1")]:
        if needle is None:
            with pytest.raises(SystemExit):
                main([profile, *args])
            capsys.readouterr()
            continue
        assert main([profile, "--outputs", str(tmp_path / "out"), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (args, err)
        assert not (tmp_path / "out").exists()
