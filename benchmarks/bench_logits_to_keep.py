"""One SFT step (forward + backward) of SmolLM2-135M-Instruct on countdown-3 chat examples,
with the LM head over every position against over the response positions only
(``kdlab.engine.batching.response_logits`` with ``logits_to_keep``). Same batch, same weights; median
of ``--repeats`` after one warm-up each. Needs the imported model (``kdlab teachers
params/smol.yaml``, or any run of ``make smol``).

    python benchmarks/bench_logits_to_keep.py [--outputs outputs] [--batch 16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from kdlab.engine import batching
from kdlab.study import materials
from kdlab.study.config import load_profile
from kdlab.models.smol import import_smollm2
from kdlab.engine.sft import sft_loss


def step_s(model, prompts, comps, codec, repeats: int) -> tuple[float, float]:
    times, loss = [], float("nan")
    for _ in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_t = sft_loss(model, prompts, comps, codec)
        loss_t.backward()
        times.append(time.perf_counter() - t0)
        loss = float(loss_t.detach())
    return statistics.median(times[1:]), loss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outputs", default="outputs")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of (all positions, response only)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    profile = load_profile("params/smol.yaml")
    path = import_smollm2(Path(args.outputs) / "models", progress=False)
    model, codec = materials.load_model(profile, path, "fp32", train=True)
    task = materials.target_task(profile, "countdown-3")
    rng = random.Random(0)
    problems = task.problems("train", args.batch, seed=0)
    prompts = [codec.prompt(p.prompt) for p in problems]
    comps = [codec.completion(task.reference(p, rng)) for p in problems]
    real = batching._keeps_logits
    full_s, keep_s = [], []
    for _ in range(args.rounds):  # alternate, so that drifts of the machine hit both alike
        batching._keeps_logits = lambda m: False
        try:
            t, full_loss = step_s(model, prompts, comps, codec, args.repeats)
            full_s.append(t)
        finally:
            batching._keeps_logits = real
        t, keep_loss = step_s(model, prompts, comps, codec, args.repeats)
        keep_s.append(t)
    full_s, keep_s = statistics.median(full_s), statistics.median(keep_s)
    out = {"batch": args.batch, "threads": args.threads, "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
           "response_tokens_mean": sum(map(len, comps)) / len(comps), "all_positions_s": round(full_s, 3),
           "response_positions_s": round(keep_s, 3), "speedup": round(full_s / keep_s, 3),
           "loss_abs_diff": abs(full_loss - keep_loss)}
    print(json.dumps(out, indent=1))
    dest = Path(args.outputs) / "bench" / "logits_to_keep.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
