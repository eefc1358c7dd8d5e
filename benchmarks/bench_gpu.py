"""kdlab against TRL on one GPU, side by side, in one invocation (``make bench-gpu``).

Command::

    python benchmarks/bench_gpu.py [--quick] [--new-tokens 64 256] [--out outputs/bench/gpu.json]

Without CUDA it prints one line and exits 2 (``--device cpu --tiny`` is the CPU smoke run the
tests use; its figures mean nothing).

What is compared
----------------
Random-weight checkpoints of the real shapes (speed does not depend on the weights, and with
random weights every rollout runs to full length in both frameworks): a SmolLM2-135M-shaped
student (576 wide, 30 layers, 9 query / 3 key-value heads, MLP 1536, tied embeddings) and a
SmolLM2-360M-shaped teacher (960 wide, 32 layers, 15 / 5 heads, MLP 2560), vocabulary 49,152
(a byte-level BPE tokenizer trained here on made-up text, filled with added tokens to the
vocabulary size, so every logit row is a real token for both frameworks). bf16 parameters, no
fp32 master copy, 32 prompts per step (countdown-3 in natural language), temperature 1,
constant lr 1e-5, clipping at 1.0. Four cells, OffPD / OnPD x forward / reverse KL, at 64 and
256 new tokens:

* kdlab: ``kdlab.engine.distill.distill`` exactly as a study calls it (``bench_distill.time_kdlab``).
* TRL ``GKDTrainer`` (``lmbda`` 0 / 1, ``beta`` 0 / 1; ``bench_distill.time_trl`` with
  ``use_cpu=False``), on the same OffPD pool.
* TRL's maintained on-policy ``DistillationTrainer`` (OnPD cells only: it always generates),
  ``beta`` 0 / 1, the same prompts as plain text, ``max_completion_length`` = new tokens.

Each framework runs a warm-up, then ``repeats`` windows of ``window`` steps; the median window
is quoted (tokens trained on per second of wall time). The step split by phase
(``bench_real.PhaseClock``: rollout, teacher forward, student forward + backward, optimiser,
other) synchronises the GPU at each phase boundary, so phases are attributed to the phase that
queued them. Peak memory: ``torch.cuda.max_memory_allocated`` over the measured run. Share of
the matmul rate: the phase's model FLOPs per second over this GPU's measured bf16 GEMM rate
(8192^3). Equal work: on one batch, kdlab's ``kl_loss`` and TRL's ``generalized_jsd_loss`` on
the same float32 logits (``bench_distill.losses_on_logits``, tolerance 1e-4).

Targets (issue 32): on-policy >= 3x and off-policy >= 2x TRL GKD's tokens per second at 64 new
tokens, and the same ratios against ``DistillationTrainer`` where it applies.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # tiny_hf: the made-up byte-level tokenizer
import bench_distill as common  # noqa: E402  (puts src/ on the path too)
import bench_real  # noqa: E402

VOCAB = 49_152
SHAPES = {"student": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          intermediate_size=1536, tie_word_embeddings=True),
          "teacher": dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                          intermediate_size=2560, tie_word_embeddings=True)}
TINY = {"student": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                        intermediate_size=64, tie_word_embeddings=True),
        "teacher": dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=96, tie_word_embeddings=True)}
BATCH = 32
LR = 1e-5
NEW_TOKENS = (64, 256)
TARGETS = {"off": 2.0, "on": 3.0}
FULL = dict(warmup=2, window=3, repeats=3)
QUICK = dict(warmup=1, window=2, repeats=1)


def no_cuda_line() -> str | None:
    """The one line said where there is no GPU to benchmark on (None when there is one)."""
    if torch.cuda.is_available():
        return None
    return ("bench-gpu: CUDA is not available here (torch " + torch.__version__
            + "); run it on a machine with an NVIDIA GPU and a CUDA build of PyTorch")


def build_checkpoints(root: Path, tiny: bool = False) -> tuple[Path, Path]:
    """(student_dir, teacher_dir): random-weight Llama checkpoints of ``SHAPES`` (``TINY``) sharing
    one made-up byte-level tokenizer filled with added tokens up to the vocabulary size."""
    from tiny_hf import build_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer("llama")
    vocab = len(tok) if tiny else VOCAB
    if len(tok) < vocab:
        tok.add_tokens([f"<x{i}>" for i in range(vocab - len(tok))])
    tok.pad_token = tok.eos_token
    dirs = []
    for seed, role in enumerate(("student", "teacher")):
        cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, rope_theta=100_000.0,
                          **(TINY if tiny else SHAPES)[role])
        torch.manual_seed(seed)
        d = root / role
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(d))
        tok.save_pretrained(str(d))
        dirs.append(d)
    return dirs[0], dirs[1]


def load(student_dir: Path, teacher_dir: Path, device: str):
    """(student, teacher, codec): bf16 on ``device``."""
    from kdlab.models.codec import HFCodec
    from kdlab.models.hf import load_pretrained

    student, tok = load_pretrained(student_dir, "bf16", device)
    teacher, _ = load_pretrained(teacher_dir, "bf16", device)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return student, teacher, HFCodec.of(tok, student, teacher)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_tflops(device: str, n: int = 8192) -> float:
    """This device's bf16 GEMM rate (TFLOP/s) at n x n x n, the median of 10 timed products."""
    if not device.startswith("cuda"):
        n = 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    times = []
    for i in range(13):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e12


class GpuClock(bench_real.PhaseClock):
    """``PhaseClock`` that synchronises the device at each phase boundary and records the peak
    GPU memory of the run it is entered around (GiB)."""

    def __init__(self, student, teacher, device: str):
        super().__init__(student, teacher)
        self.device, self.peak_gib = device, None

    def _now(self) -> tuple[float, float]:
        _sync(self.device)
        return super()._now()

    def __enter__(self):
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        if self.device.startswith("cuda"):
            self.peak_gib = torch.cuda.max_memory_allocated() / 2 ** 30
        super().__exit__(*exc)


def time_distillation_trainer(student, teacher, tokenizer, prompts: list[str], kl: str, new_tokens: int, warmup: int,
                              window: int, repeats: int, batch: int, lr: float, clock: Any, use_cpu: bool
                              ) -> dict[str, Any]:
    """Time TRL's on-policy ``DistillationTrainer`` (same models, prompts, batch, lr, KL direction)."""
    from datasets import Dataset
    from trl import DistillationConfig, DistillationTrainer

    steps = window * repeats
    stamps: list[tuple[float, float]] = []
    tokens: list[int] = []
    rows = [{"prompt": prompts[i % len(prompts)]} for i in range(batch * max(steps, warmup))]

    Clock = common.step_clock(stamps)

    class Counting(DistillationTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            if model.training:
                tokens.append(int(inputs["completion_mask"].sum()))
            return super().compute_loss(model, inputs, *args, **kwargs)

    def trainer(max_steps: int, out_dir: str):
        args = DistillationConfig(output_dir=out_dir, per_device_train_batch_size=batch, gradient_accumulation_steps=1,
                                  max_steps=max_steps, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
                                  weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", beta=common.TRL_BETA[kl],
                                  temperature=1.0, max_completion_length=new_tokens, gradient_checkpointing=False,
                                  bf16=False, use_cpu=use_cpu, seed=0, data_seed=0, dataloader_num_workers=0,
                                  logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
                                  shuffle_dataset=False)
        return Counting(model=student, teacher_model=teacher, args=args, processing_class=tokenizer,
                        train_dataset=Dataset.from_list(rows), callbacks=[Clock()])

    with tempfile.TemporaryDirectory() as tmp:
        if warmup:
            trainer(warmup, tmp).train()
            stamps.clear()
            tokens.clear()
        measured = trainer(steps, tmp)
        with clock:
            measured.train()
    wall = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])]
    cpu = [b[1] - a[1] for a, b in zip(stamps, stamps[1:])]
    if len(wall) != steps or len(tokens) < steps:
        raise RuntimeError(f"DistillationTrainer ran {len(wall)} steps, expected {steps}")
    return common._windows(wall, cpu, [float(t) for t in tokens[-steps:]], window, repeats)


def run(student_dir: Path, teacher_dir: Path, device: str, settings: dict[str, int], new_tokens: tuple[int, ...],
        batch: int = BATCH, cells=common.CELLS, log=print) -> dict[str, Any]:
    """Every cell at every response length, each framework in turn, in this process."""
    from kdlab.engine.data import ProblemPool
    from kdlab.engine.offpd import offpd_rollouts

    with_trl = common.trl_available()
    if not with_trl:
        log("trl is not importable (pip install -e .[bench]): timing kdlab only")
    use_cpu = not device.startswith("cuda")
    rate = matmul_tflops(device)
    log(f"bf16 GEMM rate: {rate:.0f} TFLOP/s")
    steps = settings["window"] * settings["repeats"]
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if not use_cpu else "cpu",
                              "torch": torch.__version__, "matmul_tflops": rate, "batch": batch, "lr": LR,
                              "settings": settings, "cells": []}
    for n_new in new_tokens:
        student, teacher, codec = load(student_dir, teacher_dir, device)
        task = bench_real.real_task(n_new)
        pool = ProblemPool(task, "train", 512, seed=0)
        n_pool = max(common.matched_pool_size(steps, batch), batch)
        problems, responses = offpd_rollouts(teacher, task, pool, n_pool, 1.0, seed=0, max_new_tokens=n_new,
                                             codec=codec)
        data = {"problems": problems, "responses": responses, "new_tokens": n_new}
        prompts_text = [codec.render(p.prompt) if codec.templated else p.prompt for p in problems]
        losses = {}
        if with_trl:
            from kdlab.engine.batching import pad_left, pad_right, response_logits

            p, pm = pad_left([codec.prompt(x.prompt) for x in problems[:batch]], codec.pad_id)
            r, rm = pad_right(responses[:batch], pad_id=codec.pad_id)
            with torch.no_grad():
                t_l = response_logits(teacher, p, pm, r, rm, codec.vocab_size).float().cpu()
                s_l = response_logits(student, p, pm, r, rm, codec.vocab_size).float().cpu()
            losses = {kl: common.losses_on_logits(kl, s_l, t_l, r, rm) for kl in ("forward", "reverse")}
        del student, teacher
        for policy, kl in cells:
            cell: dict[str, Any] = {"policy": policy, "kl": kl, "new_tokens": n_new, **losses.get(kl, {})}
            fws = ["kdlab"] + (["trl_gkd"] + (["trl_distillation"] if policy == "on" else []) if with_trl else [])
            for fw in fws:
                gc.collect()
                if not use_cpu:
                    torch.cuda.empty_cache()
                student, teacher, codec = load(student_dir, teacher_dir, device)
                clock = GpuClock(student, teacher, device)
                log(f"  {n_new} new tokens, {policy}-policy / {kl} KL: {fw} ...")
                if fw == "kdlab":
                    res = common.time_kdlab(student, teacher, task, policy, kl, data, settings["warmup"],
                                            settings["window"], settings["repeats"], batch, lr=LR, codec=codec,
                                            clock=clock)
                elif fw == "trl_gkd":
                    rows = common.trl_rows(data, codec.prompt, batch * max(steps, settings["warmup"]))
                    res = common.time_trl(student, teacher, codec.tokenizer, rows, policy, kl, n_new,
                                          settings["warmup"], settings["window"], settings["repeats"], batch, lr=LR,
                                          clock=clock, use_cpu=use_cpu)
                else:
                    res = time_distillation_trainer(student, teacher, codec.tokenizer, prompts_text, kl, n_new,
                                                    settings["warmup"], settings["window"], settings["repeats"],
                                                    batch, LR, clock, use_cpu)
                split = clock.split(res["step_wall_s"], rate * 1e3)
                cell[fw] = {"tokens_per_s": res["tokens_per_s"], "s_per_step": 1.0 / res["steps_per_s"],
                            "peak_gib": clock.peak_gib, "split": split,
                            "share_of_matmul_rate": split.get("peak_fraction", {})}
                log(f"    {res['tokens_per_s']:.0f} tokens/s, {1.0 / res['steps_per_s']:.2f} s/step")
                del student, teacher
            k = cell["kdlab"]["tokens_per_s"]
            for fw in ("trl_gkd", "trl_distillation"):
                if fw in cell:
                    cell[f"ratio_{fw}"] = k / cell[fw]["tokens_per_s"]
                    cell[f"meets_target_{fw}"] = cell[f"ratio_{fw}"] >= TARGETS[policy] if n_new == 64 else None
            result["cells"].append(cell)
    return result


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['device']}, torch {result['torch']}, bf16 GEMM {result['matmul_tflops']:.0f} TFLOP/s, "
          f"batch {result['batch']}")
    print(f"{'new':>4} {'policy':>6} {'kl':>8} {'kdlab tok/s':>12} {'GKD tok/s':>10} {'x GKD':>6} "
          f"{'Distill tok/s':>13} {'x Dist':>6} {'kdlab GiB':>9} {'GKD GiB':>8} {'loss diff':>9}")
    for c in result["cells"]:
        def g(fw, key, spec):
            v = c.get(fw, {}).get(key) if fw else c.get(key)
            return format(v, spec) if isinstance(v, (int, float)) else "-".rjust(int(spec.split(".")[0]))
        print(f"{c['new_tokens']:>4} {c['policy']:>6} {c['kl']:>8} {g('kdlab', 'tokens_per_s', '12.0f')} "
              f"{g('trl_gkd', 'tokens_per_s', '10.0f')} {g(None, 'ratio_trl_gkd', '6.2f')} "
              f"{g('trl_distillation', 'tokens_per_s', '13.0f')} {g(None, 'ratio_trl_distillation', '6.2f')} "
              f"{g('kdlab', 'peak_gib', '9.1f')} {g('trl_gkd', 'peak_gib', '8.1f')} {g(None, 'loss_abs_diff', '9.1e')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer timed steps (a smoke run, not a measurement)")
    ap.add_argument("--new-tokens", type=int, nargs="+", default=list(NEW_TOKENS))
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the tests' smoke run)")
    ap.add_argument("--tiny", action="store_true", help="tiny models (the tests' smoke run)")
    ap.add_argument("--cells", default="all", help="all, or policy/kl pairs such as off/forward,on/reverse")
    ap.add_argument("--out", default=str(common.REPO_ROOT / "outputs" / "bench" / "gpu.json"))
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and (line := no_cuda_line()):
        print(line, file=sys.stderr)
        return 2
    if any(n < 1 for n in args.new_tokens):
        print(f"bench-gpu: --new-tokens must be >= 1, got {args.new_tokens}", file=sys.stderr)
        return 2
    cells = common.CELLS if args.cells == "all" else tuple(tuple(c.split("/")) for c in args.cells.split(","))
    if any(len(c) != 2 or c[0] not in ("off", "on") or c[1] not in ("forward", "reverse") for c in cells):
        print(f"bench-gpu: --cells must be 'all' or policy/kl pairs (off|on)/(forward|reverse), got {args.cells!r}",
              file=sys.stderr)
        return 2
    settings = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory() as tmp:
        print("building random-weight checkpoints of the real shapes ...")
        s_dir, t_dir = build_checkpoints(Path(tmp), tiny=args.tiny)
        result = run(s_dir, t_dir, args.device, dict(settings), tuple(args.new_tokens), cells=cells,
                     batch=4 if args.tiny else BATCH)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print_table(result)
    print(f"\n-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
