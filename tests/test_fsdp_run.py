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
from safetensors.torch import load_file

from tiny_hf import build_pair, write_synthetic_choice

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install 'accelerate>=1.0'); "
                                         "kdlab.study.fsdp_run needs it")
from kdlab.study.fsdp_run import FSDPRunConfig, main, run

REPO_ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(cfg: dict) -> list[str]:
    out = []
    for k, v in cfg.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        else:
            out += [flag, str(v)]
    return out


def _launch(cfg: dict, nproc: int = 2) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(_free_port()), "-m", "kdlab.study.fsdp_run", *_args(cfg)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


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
    return root, pairs, write_synthetic_choice(root / "train.jsonl")


def _cfg(teacher: Path, student: Path, data: Path, out: Path, **kw) -> dict:
    return dict(student=str(student), teacher=str(teacher), task_kind="choice", task_path=str(data), out_dir=str(out),
                steps=2, batch_size=4, max_new_tokens=6, offpd_pool=8, rollout_batch=2, dtype="fp32", lr=1e-3,
                grad_clip=0.05, cpu=True, **{"evaluate": False, **kw})


def test_offpd_two_sharded_processes_equal_one_process(setup):
    """Global token-mean objective, global grad norm and clipping, sharded save, evaluation: the
    2-process run must reproduce the single-process, micro-batched run (same pool and batches)."""
    root, pairs, data = setup
    teacher, student = pairs["qwen2"]  # tied embeddings, vocabulary padded differently per model
    bench = [{"kind": "choice", "path": str(data), "name": "mc", "max_new_tokens": 4}]
    cfg = _cfg(teacher, student, data, root / "off2", policy="off", save_student=True, evaluate=True, n_eval=3,
               eval_max_new_tokens=4, pass_n=2, pass_problems=2, benchmarks=json.dumps(bench), n_benchmark=3,
               base_eval_cache=str(root / "base_cache"))
    _launch(cfg)
    ranks = [json.loads((root / "off2" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 2
    assert all(math.isfinite(h["loss"]) and h["loss"] > 0 for h in ranks[0])
    assert any(h["length"] < cfg["max_new_tokens"] for h in ranks[0])  # ragged responses
    metrics = json.loads((root / "off2" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["steps_done"] == 2

    # One process, the batch in micro-batches of one row: the same objective and updates.
    single = run(FSDPRunConfig(**{**cfg, "out_dir": str(root / "off1"), "threads": 1, "benchmarks": bench,
                                  "micro_batch_size": 1}))
    for a, b in zip(ranks[0], single):
        for key in ("loss", "forward_kl", "reverse_kl", "grad_norm", "length"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    assert single[0]["grad_norm"] > cfg["grad_clip"]  # clipping was active
    sharded = load_file(root / "off2" / "student" / "model.safetensors")
    alone = load_file(root / "off1" / "student" / "model.safetensors")
    init = load_file(student / "model.safetensors")
    assert sorted(sharded) == sorted(alone)
    assert max(float((sharded[k] - alone[k]).abs().max()) for k in sharded) < 1e-6
    assert max(float((sharded[k] - init[k]).abs().max()) for k in sharded) > 1e-4  # it did train

    # Evaluation on rank 0: same scores as the single process; forgetting and sparsity by hand.
    m1 = json.loads((root / "off1" / "metrics.json").read_text())
    for key in ("accuracy", "pass_at_1", "bench_mc", "benchmark_mean", "base_accuracy", "base_benchmark_mean",
                "forgetting", "sparsity"):
        assert 0 <= abs(metrics[key]) <= 1 and metrics[key] == pytest.approx(m1[key], abs=1e-6), key
    assert metrics["forgetting"] == pytest.approx(metrics["benchmark_mean"] - metrics["base_benchmark_mean"])
    unchanged = sum(int(((sharded[k] - init[k]).abs() < 1e-6).sum()) for k in sharded)
    assert metrics["sparsity"] == pytest.approx(unchanged / sum(v.numel() for v in sharded.values()))
    assert len(list((root / "base_cache").glob("base-*.json"))) == 1  # the base was evaluated once


def test_onpd_two_sharded_processes_agree(setup):
    root, pairs, data = setup
    teacher, student = pairs["llama"]  # untied embeddings, two stop ids
    _launch(_cfg(teacher, student, data, root / "on2", policy="on", kl="reverse", shard_teacher=False))
    ranks = [json.loads((root / "on2" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 2
    assert all(math.isfinite(h["loss"]) and h["loss"] == pytest.approx(h["reverse_kl"]) for h in ranks[0])


def test_config_and_cli_errors(setup, tmp_path):
    root, pairs, data = setup
    teacher, student = pairs["llama"]
    base = _cfg(teacher, student, data, tmp_path)
    with pytest.raises(ValueError, match="policy"):
        FSDPRunConfig(**{**base, "policy": "sideways"})
    with pytest.raises(ValueError, match="task_kind"):
        FSDPRunConfig(**{**base, "task_kind": "essay"})
    with pytest.raises(ValueError, match="offpd_pool"):
        run(FSDPRunConfig(**{**base, "offpd_pool": 7}))
    with pytest.raises(SystemExit):
        main(["--student", "x"])  # required flags missing
    assert FSDPRunConfig(**{**base, "policy": "on"}).lam == 1.0
