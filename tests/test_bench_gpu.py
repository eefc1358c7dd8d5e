"""benchmarks/bench_gpu.py and benchmarks/gpu_check.py without a GPU: the one-line refusal, and the
benchmark's whole path as a CPU smoke run on tiny models (kdlab's side; TRL's too where trl is
installed)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gpu  # noqa: E402

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@needs_no_cuda
@pytest.mark.parametrize("script", ["bench_gpu.py", "gpu_check.py"])
def test_without_cuda_one_line_and_exit_2(script, tmp_path):
    out = tmp_path / "gpu.json"
    args = ["--out", str(out)] if script == "bench_gpu.py" else []
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    assert len(lines) == 1 and "CUDA is not available" in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()  # nothing written


def test_bad_arguments_are_refused_in_one_line(capsys):
    assert bench_gpu.main(["--device", "cpu", "--cells", "sideways/forward"]) == 2
    assert "--cells" in capsys.readouterr().err
    assert bench_gpu.main(["--device", "cpu", "--new-tokens", "0"]) == 2


def test_cpu_smoke_run_writes_every_field(tmp_path, monkeypatch, capsys):
    """The benchmark end to end on tiny models on the CPU, kdlab's side (figures meaningless)."""
    monkeypatch.setattr(bench_gpu.common, "trl_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert bench_gpu.main(["--device", "cpu", "--tiny", "--quick", "--new-tokens", "4", "--cells", "off/forward,on/reverse",
                           "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["matmul_tflops"] > 0
    assert [(c["policy"], c["kl"], c["new_tokens"]) for c in res["cells"]] == [("off", "forward", 4), ("on", "reverse", 4)]
    for c in res["cells"]:
        k = c["kdlab"]
        assert k["tokens_per_s"] > 0 and k["s_per_step"] > 0
        assert {"rollout_s", "teacher_s", "student_fb_s", "optimizer_s", "other_s"} <= set(k["split"])
    assert "kdlab tok/s" in capsys.readouterr().out


def test_the_real_shapes_are_smollm2s():
    """135M / 360M parameters at the real shapes (counted on the meta device: no memory)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    counts = {}
    for role, shape in bench_gpu.SHAPES.items():
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(vocab_size=bench_gpu.VOCAB, **shape))
        counts[role] = sum(p.numel() for p in model.parameters())
    assert 130e6 < counts["student"] < 140e6 and 355e6 < counts["teacher"] < 370e6
