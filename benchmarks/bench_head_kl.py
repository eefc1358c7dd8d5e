"""The KL loss from the teacher's hidden states and head against today's chunked KL on its logits.

Command::

    python benchmarks/bench_head_kl.py [--tokens 1024] [--chunk-size 256] [--out outputs/bench/head_kl.json]

Two vocabularies with their teachers' hidden sizes: V = 49,152 with d = 960 (SmolLM2-360M) and
V = 128,256 with d = 2,048 (Llama-3.2-1B). Inputs, the same for both paths (float32, the CPU's
compute dtype; random, seed 0): student logits (N, V) that require grad, the teacher's last hidden
states (N, d) and its head (V, d); 10% of the rows masked out.

* ``logits`` (today): the teacher's logits are materialised, ``z_T = h W^T`` (N, V), as the
  OffPD pool's cache and the loss hold them, then ``kdlab.core.kl.token_kl_chunked`` (forward +
  backward);
* ``hidden``: ``kdlab.core.head_kl.token_kl_from_hidden`` (forward + backward), which makes each
  chunk's teacher logits from its hidden states and drops them.

Each path runs in its own subprocess; its peak memory is the process's peak RSS (VmHWM, reset
once the inputs exist: ``bench_distill.PeakRSS``) above what it held then, and its time the wall time of forward + backward
(the ``logits`` path includes the head's matmul, which the ``hidden`` path does twice, forward
and backward). The values and the student gradients of the two paths are compared (max abs
difference; the issue's bound: 1e-5). Teacher temperature 0.5, forward and reverse KL.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHAPES = ((49_152, 960), (128_256, 2_048))  # (V, d)
TOLERANCE = 1e-5


def _inputs(tokens: int, vocab: int, d: int):
    g = torch.Generator().manual_seed(0)
    student = (torch.randn(tokens, vocab, generator=g) * 2).requires_grad_(True)
    hidden = torch.randn(tokens, d, generator=g)
    head = torch.randn(vocab, d, generator=g) / d ** 0.5 * 3
    mask = torch.rand(tokens, generator=g) > 0.1
    return student, hidden, head, mask


def worker(path: str, tokens: int, vocab: int, d: int, direction: str, chunk: int, out: str) -> dict:
    from kdlab.core.head_kl import token_kl_from_hidden
    from kdlab.core.kl import token_kl_chunked

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_distill import PeakRSS  # the kernel's peak counter, reset once the inputs exist

    student, hidden, head, mask = _inputs(tokens, vocab, d)
    mem = PeakRSS()
    mem.start()
    t0 = time.perf_counter()
    if path == "logits":
        teacher = hidden @ head.T  # (N, V): what the cache and the loss hold today
        kl = token_kl_chunked(student, teacher / 0.5, direction, mask, chunk_size=chunk)
    else:
        kl = token_kl_from_hidden(student, hidden, head, direction, mask, teacher_temperature=0.5, chunk_size=chunk)
    (kl.sum() / mask.sum()).backward()
    wall = time.perf_counter() - t0
    peak = mem.peak_mb()
    torch.save({"values": kl.detach(), "grad": student.grad}, out)
    return {"path": path, "peak_mb": peak, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--out", default=str(REPO_ROOT / "outputs" / "bench" / "head_kl.json"))
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        path, vocab, d, direction, chunk, out = args.worker
        print(json.dumps(worker(path, args.tokens, int(vocab), int(d), direction, int(chunk), out)))
        return 0
    if args.tokens < 1 or args.chunk_size < 1:
        print(f"bench_head_kl: --tokens and --chunk-size must be >= 1, got {args.tokens}, {args.chunk_size}",
              file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab, d in SHAPES:
            for direction in ("forward", "reverse"):
                res, saved = {}, {}
                for path in ("logits", "hidden"):
                    f = str(Path(tmp) / f"{path}.pt")
                    cmd = [sys.executable, __file__, "--tokens", str(args.tokens), "--worker", path, str(vocab), str(d),
                           direction, str(args.chunk_size), f]
                    res[path] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                    saved[path] = torch.load(f)
                row = {"vocab": vocab, "d": d, "tokens": args.tokens, "direction": direction, "chunk_size": args.chunk_size,
                       **{f"{p}_{k}": res[p][k] for p in res for k in ("peak_mb", "wall_s")},
                       "value_max_abs_diff": float((saved["hidden"]["values"] - saved["logits"]["values"]).abs().max()),
                       "grad_max_abs_diff": float((saved["hidden"]["grad"] - saved["logits"]["grad"]).abs().max())}
                row["within_tolerance"] = row["value_max_abs_diff"] <= TOLERANCE and row["grad_max_abs_diff"] <= TOLERANCE
                rows.append(row)
                print(f"V={vocab:>7,} d={d:>5} {direction:8s} peak MiB logits {row['logits_peak_mb']:7.0f} hidden "
                      f"{row['hidden_peak_mb']:7.0f} | s logits {row['logits_wall_s']:6.2f} hidden {row['hidden_wall_s']:6.2f}"
                      f" | max diff value {row['value_max_abs_diff']:.1e} grad {row['grad_max_abs_diff']:.1e}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "tolerance": TOLERANCE, "threads": torch.get_num_threads()}, indent=2))
    print(f"written: {out}")
    return 0 if all(r["within_tolerance"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
