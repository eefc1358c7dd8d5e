"""``make gpu-check``: kdlab on this machine's CUDA GPU, in one command and one screen.

1. the ``gpu`` tests (``pytest -m gpu``: CUDA-graph decoding against transformers, rollouts,
   distillation in every cell, evaluation, on the GPU);
2. a real-model study of two runs (OffPD and OnPD, forward KL) on tiny Hugging Face checkpoints
   built here on the spot, with ``pretrained.device: cuda`` (``kdlab study``: teachers, runs,
   results, report);
3. the GPU benchmark at 64 new tokens (``benchmarks/bench_gpu.py --quick``: kdlab against TRL's
   GKDTrainer and DistillationTrainer when trl is installed, kdlab alone otherwise).

Nothing is downloaded. Without CUDA: one line, exit 2. Exit 0 when every part passed, else 1.
Budget: under 5 minutes on one H200.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _run(cmd: list[str], log: Path, env: dict | None = None, timeout: int = 240) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.perf_counter() - t0


def _tail(path: Path, n: int = 3) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return "\n      ".join(lines[-n:])


def study_profile(root: Path, device: str = "cuda") -> Path:
    """A two-run real-checkpoint study on tiny checkpoints built here (tests/tiny_hf), on ``device``."""
    sys.path.insert(0, str(ROOT / "tests"))
    import yaml
    from tiny_hf import write_real_profile

    path = write_real_profile(root, "llama", name="gpu-check", tasks=["mc"], policies=["off", "on"],
                              kls=["forward"], lrs=[1.0e-4], lambdas=[])
    profile = yaml.safe_load(path.read_text())
    profile["pretrained"]["device"] = device
    profile["pretrained"].pop("gradient_checkpointing", None)
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def main() -> int:
    if not torch.cuda.is_available():
        print(f"gpu-check: CUDA is not available here (torch {torch.__version__}); it needs an NVIDIA GPU and a "
              f"CUDA build of PyTorch (make env TORCH_SPEC=\"torch --index-url https://download.pytorch.org/whl/cu126\")",
              file=sys.stderr)
        return 2
    out = ROOT / "outputs" / "gpu-check"
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"gpu-check on {torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"]
    ok = True
    t_all = time.perf_counter()

    rc, secs = _run([PY, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py"], out / "tests.log")
    ok &= rc == 0
    lines.append(f"  1. gpu tests       {'PASS' if rc == 0 else 'FAIL'}  {secs:5.0f} s  {_tail(out / 'tests.log', 1)}")

    with tempfile.TemporaryDirectory() as tmp:
        profile = study_profile(Path(tmp) / "ckpt")
        outputs = Path(tmp) / "outputs"
        rc, secs = _run([PY, "-m", "kdlab", "--outputs", str(outputs), "study", str(profile), "--workers", "1"],
                        out / "study.log", env={**os.environ, "HF_HUB_OFFLINE": "1"})
        runs = sorted((outputs / "gpu-check" / "runs").glob("*/metrics.json"))
        acc = [json.loads(p.read_text()).get("accuracy") for p in runs]
        report = (outputs / "gpu-check" / "report.html").exists()
    good = rc == 0 and len(runs) == 2 and report
    ok &= good
    lines.append(f"  2. real-model study {'PASS' if good else 'FAIL'}  {secs:5.0f} s  {len(runs)}/2 runs, "
                 f"accuracy {acc}, report {'written' if report else 'missing'}")
    if not good:
        lines.append(f"      {_tail(out / 'study.log')}")

    rc, secs = _run([PY, "benchmarks/bench_gpu.py", "--quick", "--new-tokens", "64", "--out", str(out / "gpu.json")],
                    out / "bench.log", timeout=300)
    ok &= rc == 0
    lines.append(f"  3. bench-gpu       {'PASS' if rc == 0 else 'FAIL'}  {secs:5.0f} s  (a --quick run; "
                 f"make bench-gpu measures)")
    if rc == 0:
        res = json.loads((out / "gpu.json").read_text())
        for c in res["cells"]:
            k = c["kdlab"]
            ratios = ", ".join(f"{c[f'ratio_{fw}']:.2f}x {fw[4:]}" for fw in ("trl_gkd", "trl_distillation")
                               if f"ratio_{fw}" in c)
            lines.append(f"      {c['policy']:>3}/{c['kl']:<7} kdlab {k['tokens_per_s']:8.0f} tok/s "
                         f"{k['s_per_step']:.2f} s/step {k['peak_gib'] or 0:.1f} GiB  {ratios}")
    else:
        lines.append(f"      {_tail(out / 'bench.log')}")
    lines.append(f"  {'ALL PASSED' if ok else 'FAILED'} in {time.perf_counter() - t_all:.0f} s; logs in {out}")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
