"""kdlab's distillation step against TRL's GKDTrainer, side by side, in one invocation.

Command (``make bench`` runs it after ``pip install -e .[bench]``)::

    python benchmarks/bench_distill.py [--quick] [--kl-memory] [--out outputs/bench/distill.json]

What is compared
----------------
Both frameworks train the same student ("student-s", 0.87M parameters) from the same teacher (a
6.06M-parameter Llama: hidden 256, 8 layers, 4 heads, MLP 640), both built with
``kdlab.models.toy.build_model`` and run in bf16 (parameters and compute, no fp32 master copy, as the
study runs), on the same countdown-3 prompts (the OffPD pool's prompts, which both also sample
on-policy), batch 32, at most 32 new tokens, AdamW at the same learning rate (constant),
gradient clipping at 1.0, temperature 1. Four cells: OffPD / OnPD x forward / reverse KL.

* kdlab: ``kdlab.engine.distill.distill`` with a ``RunConfig``, exactly as the study calls it; the time
  of each step is read from its history (``time_s``: rollout + teacher + student update +
  per-step metrics, i.e. the whole loop body).
* TRL: ``trl.experimental.gkd.GKDTrainer`` with ``lmbda`` = 0 (off-policy: the dataset's
  completions, which are the same cached teacher responses kdlab uses) or 1 (on-policy: the
  student generates with ``model.generate``), ``seq_kd=False``, ``beta`` = 0 for forward KL and 1
  for reverse KL. TRL's convention, read from its source (``generalized_jsd_loss``): beta = 0 is
  ``F.kl_div(log p_S, log p_T, log_target=True)`` = sum_v p_T (log p_T - log p_S) = KL(T || S),
  the forward KL; beta = 1 is KL(S || T), the reverse KL. The time of a step is the wall time
  between consecutive ``on_step_end`` callbacks (data collation, generation, both forwards,
  backward, optimizer step: the whole step). ``gradient_checkpointing`` is turned off (TRL's
  SFT-derived default turns it on, which would also disable the KV cache during generation) and
  ``bf16`` autocast is off because the models already are bf16.

Throughput counts the response tokens each step trains on (masked-in positions) per second of
wall time (``*_tokens_per_s``; the ratio and the targets use these) and, because this machine
may be shared, also per second of the process's own CPU time (``*_tokens_per_cpu_s``,
``ratio_cpu``). Each cell and framework runs in a fresh subprocess with one thread
(``OMP_NUM_THREADS=1``): a warm-up run of ``warmup`` steps first (process-level lazy
initialisation: allocator, kernels, autograd engine), then the measured run (a new
``distill`` call / a new trainer) of ``repeats`` windows of ``window`` steps; the median window
is quoted.

OffPD teacher-logit cache
-------------------------
kdlab caches the teacher's logits of each OffPD pool response the first time a run draws it.
Its benefit grows during a run: over a study run (150 steps x 32 rows from a 2,048-response
pool) 61% of the rows drawn are served from the cache. The benchmark's short measured run uses
a smaller pool, sized so that the expected share of cached rows over the run equals that study
run average; the measured share is reported as ``kdlab_teacher_cache_hit``. TRL reads the same
pool.

Peak memory
-----------
Per subprocess, for the measured run only: free heap memory is first handed back to the OS
(glibc ``malloc_trim``, so memory freed by the warm-up run cannot hide the run's allocations),
then the resident set size (models, data, framework objects) is the baseline; the kernel's
peak-RSS counter (``VmHWM``) is reset there (writing ``5`` to ``/proc/self/clear_refs``) and
read after the run; the peak is that high-water mark minus the baseline (MiB). It counts what
the training phase allocates (optimizer state, activations, caches), measured by the kernel,
not by Python; one-time process initialisation (tens of MiB on the first backward pass) falls
in the warm-up run and is not counted.

Equal work
----------
``loss_abs_diff``: on one identical batch (the same prompt + response tokens, the same float32
logits from the same models), kdlab's ``kl_loss`` and TRL's ``GKDTrainer.generalized_jsd_loss``
(labels = the response tokens, -100 on padding; its "batchmean" reduction divides the summed
per-token KL by the number of unmasked tokens, which is kdlab's masked token mean) must agree
to 1e-4. The check isolates the loss function: inside its trainer TRL evaluates it in the
logits' dtype (bf16 here; kdlab upcasts to float32) and divides by the Trainer's
``num_items_in_batch``, which is counted from the collated dataset labels before on-policy
generation replaces them, so TRL's logged on-policy losses are scaled by that count.

``--kl-memory``: peak extra memory of ``kdlab.core.kl.token_kl_chunked`` against a naive
two-log-softmax KL (forward + backward) at a Llama-3 vocabulary (128,256) and 4,096 tokens
with bf16 logits, each in its own subprocess, same RSS method; values compared to 1e-5.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT / "src") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "src"))

from kdlab.engine.batching import pad_left, pad_right, response_logits
from kdlab.engine.data import ProblemPool, prompt_ids
from kdlab.engine.run_config import RunConfig
from kdlab.engine.distill import distill
from kdlab.engine.offpd import offpd_rollouts
from kdlab.core.kl import kl_loss
from kdlab.models.toy import build_model
from kdlab.tasks import get_task
from kdlab.models.tokenizer import build_tokenizer

TEACHER_SIZE: dict[str, int] = dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
                                    num_key_value_heads=4, intermediate_size=640)
STUDENT_SIZE = "student-s"
TASK = "countdown-3"
BATCH = 32
NEW_TOKENS = 32
LR = 1e-4
CELLS: tuple[tuple[str, str], ...] = (("off", "forward"), ("off", "reverse"), ("on", "forward"), ("on", "reverse"))
TRL_BETA = {"forward": 0.0, "reverse": 1.0}  # TRL's generalized JSD: beta=0 -> KL(T||S), beta=1 -> KL(S||T)
TRL_LMBDA = {"off": 0.0, "on": 1.0}  # share of steps on student-generated data
STUDY_POOL, STUDY_STEPS = 2048, 150  # the study's OffPD pool and run length (batch 32)
FULL = dict(warmup=2, window=4, repeats=3)
QUICK = dict(warmup=1, window=2, repeats=2)
TARGETS = {"off": 2.0, "on": 1.5}
LOSS_TOL = 1e-4


# ---------------------------------------------------------------------------------------------
# shared setup
# ---------------------------------------------------------------------------------------------


def cached_share(pool: int, first_draw: int, last_draw: int) -> float:
    """Expected share of draws (uniform, with replacement, from ``pool`` items) in the draw range
    [first_draw, last_draw) whose item was already drawn before: 1 - n/(k1-k0) (e^-k0/n - e^-k1/n)."""
    if last_draw <= first_draw:
        raise ValueError(f"last_draw must exceed first_draw, got {first_draw}..{last_draw}")
    n = float(pool)
    return 1.0 - n / (last_draw - first_draw) * (math.exp(-first_draw / n) - math.exp(-last_draw / n))


def matched_pool_size(steps: int, batch: int, ref_pool: int = STUDY_POOL, ref_draws: int = STUDY_STEPS * 32) -> int:
    """OffPD pool size whose expected cached share over a run of ``steps`` x ``batch`` draws
    equals that of a reference run of ``ref_draws`` draws from ``ref_pool`` responses (default:
    a toy study run, 150 x 32 draws from 2,048 responses: 0.614)."""
    target = cached_share(ref_pool, 0, ref_draws)
    lo, hi = 1, 1 << 20  # cached_share decreases as the pool grows
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cached_share(mid, 0, steps * batch) > target else (lo, mid)
    return hi


def build_models(teacher_size: Any = TEACHER_SIZE, student_size: Any = STUDENT_SIZE
                 ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(teacher bf16 eval, student fp32) freshly built from fixed seeds; distill casts the student."""
    teacher = build_model("llama", teacher_size, seed=1).to(torch.bfloat16).eval()
    student = build_model("llama", student_size, seed=0)
    return teacher, student


def bench_task(new_tokens: int = NEW_TOKENS):
    task = get_task(TASK)
    task.max_new_tokens = new_tokens  # instance attribute: the OnPD rollout budget
    return task


def make_data(teacher: torch.nn.Module, n_offpd: int, new_tokens: int = NEW_TOKENS, pool_size: int = 512) -> dict:
    """``n_offpd`` countdown-3 training prompts with one teacher response each (the OffPD pool;
    its prompts are also the OnPD prompts of both frameworks), seed 0."""
    task = bench_task(new_tokens)
    pool = ProblemPool(task, "train", pool_size, seed=0)
    problems, responses = offpd_rollouts(teacher, task, pool, n_offpd, 1.0, seed=0, max_new_tokens=new_tokens)
    return {"problems": problems, "responses": responses, "new_tokens": new_tokens}


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))


def _release_free_heap() -> None:
    """Return memory that is free but still held by the C allocator to the OS (glibc
    ``malloc_trim``), so that RSS counts live memory only; a no-op elsewhere."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """Peak resident memory of this process above a baseline, from the kernel's own counter.

    ``start()`` releases free heap memory (otherwise a run could reuse memory freed by an
    earlier one without RSS growing), records the current RSS and resets the peak
    (``/proc/self/clear_refs`` = 5); ``peak_mb()`` returns (VmHWM - baseline) in MiB.
    """

    def start(self) -> None:
        _release_free_heap()
        self.base = _status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")

    def peak_mb(self) -> float:
        return (_status_kib("VmHWM") - self.base) / 1024.0


# ---------------------------------------------------------------------------------------------
# the two frameworks
# ---------------------------------------------------------------------------------------------


def _windows(wall: list[float], cpu: list[float], tokens: list[float], window: int, repeats: int
             ) -> dict[str, Any]:
    """Medians over ``repeats`` consecutive windows of ``window`` steps: response tokens and steps
    per second of wall time and per second of this process's CPU time."""
    out: dict[str, Any] = {}
    for clock, times in (("s", wall), ("cpu_s", cpu)):
        tps, sps = [], []
        for r in range(repeats):
            sl = slice(r * window, (r + 1) * window)
            t = sum(times[sl])
            tps.append(sum(tokens[sl]) / t)
            sps.append(window / t)
        out[f"tokens_per_{clock}"] = statistics.median(tps)
        out[f"steps_per_{clock}"] = statistics.median(sps)
        out[f"window_tokens_per_{clock}"] = tps
    out.update(step_wall_s=wall, step_cpu_s=cpu, step_tokens=tokens)
    return out


def _pool_of(task: Any, problems: list) -> ProblemPool:
    """A ProblemPool holding exactly ``problems`` (the parent's draw; nothing is regenerated)."""
    pool = ProblemPool.__new__(ProblemPool)
    pool.task, pool.problems = task, problems
    return pool


def run_kdlab(policy: str, kl: str, data: dict, warmup: int, window: int, repeats: int,
              teacher_size: Any = TEACHER_SIZE, student_size: Any = STUDENT_SIZE, batch: int = BATCH
              ) -> dict[str, Any]:
    """Time ``kdlab.engine.distill.distill`` on one toy cell (see :func:`time_kdlab`)."""
    torch.manual_seed(0)
    teacher, student = build_models(teacher_size, student_size)
    return time_kdlab(student, teacher, bench_task(data["new_tokens"]), policy, kl, data, warmup, window, repeats,
                      batch)


def time_kdlab(student: torch.nn.Module, teacher: torch.nn.Module, task: Any, policy: str, kl: str, data: dict,
               warmup: int, window: int, repeats: int, batch: int, lr: float = LR, codec: Any = None,
               clock: Any = None, compute_dtype: str = "auto") -> dict[str, Any]:
    """Time ``kdlab.engine.distill.distill`` on one cell: a warm-up run, then the measured run, as the
    study calls it (``codec``: a real model's ``HFCodec``, default kdlab's char tokenizer).

    Returns throughput (tokens and steps per second, wall and CPU), peak memory of the measured
    run (MiB), its per-step losses and, for OffPD, the share of rows served from the teacher cache.
    ``clock``: a context manager entered around the measured run only (phase timers).
    ``compute_dtype``: the run's arithmetic (``distill.compute_dtype``; auto = what a study does).
    """
    from kdlab.models.codec import CHAR

    codec = codec or CHAR
    pool = _pool_of(task, data["problems"])
    offpd = (data["problems"], data["responses"]) if policy == "off" else None

    def cfg(steps: int) -> RunConfig:
        return RunConfig(task=task.name, policy=policy, kl=kl, lr=lr, seed=0, steps=steps, batch_size=batch,
                         temperature=1.0, grad_clip=1.0, dtype="bf16", compute_dtype=compute_dtype,
                         offpd_pool=len(data["responses"]))

    def run(steps: int):
        return distill(student, teacher, task, cfg(steps), offpd=offpd, pool=pool, progress=False, codec=codec,
                       max_new_tokens=data["new_tokens"])

    if warmup:
        run(warmup)
    steps = window * repeats
    mem = PeakRSS()
    with clock or contextlib.nullcontext():
        mem.start()
        res = run(steps)
        peak = mem.peak_mb()
    if res.collapsed or len(res.history) != steps:
        raise RuntimeError(f"kdlab run {policy}/{kl} stopped early: {res.history[-1]}")
    tokens = [h["length"] * batch for h in res.history]
    out = _windows([h["time_s"] for h in res.history], [h["cpu_s"] for h in res.history], tokens, window, repeats)
    out.update(peak_mb=peak, loss=[h["loss"] for h in res.history])
    hits = [h["teacher_cached"] for h in res.history if "teacher_cached" in h]
    if hits:
        out["teacher_cache_hit"] = sum(hits) / len(hits)
    return out


def run_trl(policy: str, kl: str, data: dict, warmup: int, window: int, repeats: int,
            teacher_size: Any = TEACHER_SIZE, student_size: Any = STUDENT_SIZE, batch: int = BATCH) -> dict[str, Any]:
    """Time TRL's GKDTrainer on one toy cell (see :func:`time_trl`)."""
    torch.manual_seed(0)
    teacher, student = build_models(teacher_size, student_size)
    rows = trl_rows(data, prompt_ids, batch * max(window * repeats, warmup))
    return time_trl(student.to(torch.bfloat16), teacher, build_tokenizer(), rows, policy, kl, data["new_tokens"],
                    warmup, window, repeats, batch)


def trl_rows(data: dict, encode_prompt: Any, n: int) -> list[dict[str, Any]]:
    """The OffPD pool as TRL dataset rows (prompt ids + response ids, completion mask), cycled to
    exactly ``n`` rows: every step gets a full batch and no epoch boundary (dataloader restart,
    short last batch) falls inside a run. ``encode_prompt``: prompt text -> ids, as kdlab's."""
    rows = []
    pairs = list(zip(data["problems"], data["responses"]))
    for i in range(n):
        p, resp = pairs[i % len(pairs)]
        ids = encode_prompt(p.prompt)
        rows.append({"prompt": p.prompt, "input_ids": ids + resp, "completion_mask": [0] * len(ids) + [1] * len(resp)})
    return rows


def step_clock(stamps: list[tuple[float, float]]) -> type:
    """A transformers ``TrainerCallback`` class that appends (wall, CPU) time to ``stamps`` at the
    first step's start and at every step's end: a trainer's step times are the differences."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not stamps:
                stamps.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):
            stamps.append((time.perf_counter(), time.process_time()))

    return Clock


def time_trl(student: torch.nn.Module, teacher: torch.nn.Module, tokenizer: Any, rows: list[dict[str, Any]],
             policy: str, kl: str, new_tokens: int, warmup: int, window: int, repeats: int, batch: int,
             lr: float = LR, clock: Any = None, use_cpu: bool = True) -> dict[str, Any]:
    """Time TRL's GKDTrainer on one cell (same models, prompts, batch, lr, KL direction as kdlab):
    a warm-up trainer, then the measured one. Returns what :func:`time_kdlab` returns;
    ``clock`` is entered around the measured training only; ``use_cpu`` False: the trainer's
    device is the GPU the models are on."""
    from datasets import Dataset

    GKDConfig, GKDTrainer = trl_gkd()
    steps = window * repeats
    dataset = Dataset.from_list(rows)
    stamps: list[tuple[float, float]] = []  # (wall, cpu) at the start and at the end of every step
    tokens: list[int] = []
    Clock = step_clock(stamps)

    class CountingGKD(GKDTrainer):
        """GKDTrainer that records how many response tokens each step trains on."""

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            tokens.append(int((inputs["labels"][:, 1:] != -100).sum()))
            return loss

    def trainer(max_steps: int, out_dir: str) -> GKDTrainer:
        args = GKDConfig(output_dir=out_dir, per_device_train_batch_size=batch, gradient_accumulation_steps=1,
                         max_steps=max_steps, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
                         weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", lmbda=TRL_LMBDA[policy],
                         beta=TRL_BETA[kl], temperature=1.0, max_new_tokens=new_tokens, seq_kd=False,
                         gradient_checkpointing=False, bf16=False, use_cpu=use_cpu, seed=0, data_seed=0,
                         dataloader_num_workers=0, dataloader_drop_last=True, logging_strategy="no",
                         save_strategy="no", report_to="none", disable_tqdm=True)
        return CountingGKD(model=student, teacher_model=teacher, args=args, processing_class=tokenizer,
                           train_dataset=dataset, callbacks=[Clock()])

    with tempfile.TemporaryDirectory() as tmp:
        if warmup:
            trainer(warmup, tmp).train()
            stamps.clear()
            tokens.clear()
        measured = trainer(steps, tmp)
        mem = PeakRSS()
        with clock or contextlib.nullcontext():
            mem.start()
            measured.train()
            peak = mem.peak_mb()
    wall = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])]
    cpu = [b[1] - a[1] for a, b in zip(stamps, stamps[1:])]
    if len(wall) != steps or len(tokens) != steps:
        raise RuntimeError(f"TRL ran {len(wall)} steps, expected {steps}")
    out = _windows(wall, cpu, [float(t) for t in tokens], window, repeats)
    out.update(peak_mb=peak)
    return out


# ---------------------------------------------------------------------------------------------
# equal work: the two losses on one identical batch
# ---------------------------------------------------------------------------------------------


def loss_abs_diff(kl: str, data: dict, teacher_size: Any = TEACHER_SIZE, student_size: Any = STUDENT_SIZE,
                  batch: int = BATCH) -> dict[str, float]:
    """|kdlab kl_loss - TRL generalized_jsd_loss| on the same batch and the same float32 logits."""
    teacher, student = build_models(teacher_size, student_size)
    problems, responses = data["problems"][:batch], data["responses"][:batch]
    p, pm = pad_left([prompt_ids(x.prompt) for x in problems])
    r, rm = pad_right(responses)
    with torch.no_grad():
        t_logits = response_logits(teacher, p, pm, r, rm).float()  # (B, R, V)
        s_logits = response_logits(student, p, pm, r, rm).float()
    return losses_on_logits(kl, s_logits, t_logits, r, rm)


def losses_on_logits(kl: str, s_logits: torch.Tensor, t_logits: torch.Tensor, r: torch.Tensor, rm: torch.Tensor
                     ) -> dict[str, float]:
    """kdlab's ``kl_loss`` and TRL's ``generalized_jsd_loss`` on the same (B, R, V) logits of
    responses ``r`` (mask ``rm``) and their absolute difference."""
    _, GKDTrainer = trl_gkd()
    ours = float(kl_loss(s_logits, t_logits, kl, rm))
    labels = torch.where(rm, r, torch.full_like(r, -100))
    theirs = float(GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=labels, beta=TRL_BETA[kl],
                                                   temperature=1.0, reduction="batchmean"))
    return {"kdlab_loss": ours, "trl_loss": theirs, "loss_abs_diff": abs(ours - theirs)}


def trl_gkd() -> tuple[type, type]:
    """(GKDConfig, GKDTrainer): ``trl.experimental.gkd`` (TRL 1.x, tested with 1.16), else the
    top-level names of older releases."""
    try:
        from trl.experimental.gkd import GKDConfig, GKDTrainer
    except ImportError:
        from trl import GKDConfig, GKDTrainer
    return GKDConfig, GKDTrainer


def trl_available() -> bool:
    try:
        trl_gkd()
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# chunked KL memory at a Llama-3 vocabulary
# ---------------------------------------------------------------------------------------------

KL_VOCAB = 128_256
KL_TOKENS = 4_096
KL_CHUNKS = (1024, 256)  # 1024 is token_kl_chunked's default
KL_MEMORY_TARGET = 0.30
KL_VALUE_TOL = 1e-5
KL_GRAD_ROWS = 64  # rows of the student gradient compared between the two implementations


def _kl_inputs(tokens: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 student (requires grad) and teacher logits (tokens, vocab), ~N(0, 2^2), and a mask
    with ~10% of positions off; filled 256 rows at a time so no float32 copy of the whole exists."""
    g = torch.Generator().manual_seed(seed)
    student = torch.empty(tokens, vocab, dtype=torch.bfloat16)
    teacher = torch.empty(tokens, vocab, dtype=torch.bfloat16)
    for start in range(0, tokens, 256):
        n = min(256, tokens - start)
        student[start:start + n] = torch.randn(n, vocab, generator=g) * 2
        teacher[start:start + n] = torch.randn(n, vocab, generator=g) * 2
    mask = torch.rand(tokens, generator=g) > 0.1
    return student.requires_grad_(), teacher, mask


def kl_memory_worker(kind: str, tokens: int, vocab: int, chunk_size: int, out_path: str) -> dict[str, Any]:
    """Forward + backward of one KL implementation on bf16 logits; peak RSS above the inputs.

    ``kind``: "naive" (``kdlab.core.kl.token_kl``: two full float32 log-softmaxes) or "chunked"
    (``kdlab.core.kl.token_kl_chunked`` with ``chunk_size``). Per-token values and the first
    ``KL_GRAD_ROWS`` rows of the student gradient are saved to ``out_path`` for comparison.
    """
    from kdlab.core.kl import token_kl, token_kl_chunked

    student, teacher, mask = _kl_inputs(tokens, vocab)
    mem = PeakRSS()
    t0 = time.perf_counter()
    mem.start()
    if kind == "naive":
        per_token = token_kl(student, teacher, "forward", mask)
    elif kind == "chunked":
        per_token = token_kl_chunked(student, teacher, "forward", mask, chunk_size=chunk_size)
    else:
        raise ValueError(f"kind must be 'naive' or 'chunked', got {kind!r}")
    (per_token.sum() / mask.sum()).backward()
    peak = mem.peak_mb()
    wall = time.perf_counter() - t0
    torch.save({"values": per_token.detach(), "grad": student.grad[:KL_GRAD_ROWS].float()}, out_path)
    return {"kind": kind, "chunk_size": chunk_size if kind == "chunked" else None, "peak_mb": peak, "wall_s": wall,
            "inputs_mb": 2 * tokens * vocab * 2 / 2**20}


def kl_memory_section(tokens: int = KL_TOKENS, vocab: int = KL_VOCAB, chunks: tuple[int, ...] = KL_CHUNKS
                      ) -> dict[str, Any]:
    """Peak extra memory of the chunked KL against the naive one, each in its own subprocess."""
    import psutil

    # the naive forward + backward holds about six (tokens, vocab) float32 tensors at once
    need = 6 * tokens * vocab * 4 + 2 * tokens * vocab * 2
    note = None
    while need > 0.8 * psutil.virtual_memory().available and tokens > 256:
        tokens //= 2
        need = 6 * tokens * vocab * 4 + 2 * tokens * vocab * 2
        note = f"reduced to {tokens} tokens to fit the available memory"
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("naive", 0)] + [("chunked", c) for c in chunks]
        results, saved = [], []
        for kind, chunk in runs:
            path = str(Path(tmp) / f"{kind}{chunk}.pt")
            results.append(_subprocess(["--worker", "klmem", "--kind", kind, "--tokens", str(tokens), "--vocab",
                                        str(vocab), "--chunk-size", str(chunk), "--tensors", path]))
            saved.append(torch.load(path))
    naive = results[0]
    ref_v, ref_g = saved[0]["values"], saved[0]["grad"]
    chunked = []
    for res, got in zip(results[1:], saved[1:]):
        value_diff = float((got["values"] - ref_v).abs().max())
        grad_diff = float((got["grad"] - ref_g).abs().max())
        share = res["peak_mb"] / naive["peak_mb"]
        chunked.append({**res, "share_of_naive": share, "value_max_abs_diff": value_diff,
                        "grad_max_abs_diff": grad_diff, "meets_memory_target": share <= KL_MEMORY_TARGET,
                        "meets_value_tolerance": value_diff <= KL_VALUE_TOL})
    return {"tokens": tokens, "vocab": vocab, "dtype": "bf16", "direction": "forward", "naive": naive,
            "chunked": chunked, "target_share": KL_MEMORY_TARGET, "value_tolerance": KL_VALUE_TOL, "note": note}


# ---------------------------------------------------------------------------------------------
# orchestration
# ---------------------------------------------------------------------------------------------


def _subprocess(args: list[str], script: str | Path = __file__, threads: int = 1) -> dict[str, Any]:
    """Run ``script`` (default: this file) as a worker in a fresh interpreter with ``threads``
    threads; returns its JSON result."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = f.name
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run([sys.executable, str(Path(script).resolve()), *args, "--result", result], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"worker {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
        return json.loads(Path(result).read_text())
    finally:
        Path(result).unlink(missing_ok=True)


def each_cell(data: dict, cells: tuple[tuple[str, str], ...], with_trl: bool,
              run_one: Callable[[str, str, str, str], dict[str, Any]], log=print):
    """Yields (policy, kl, {framework: result}) per cell: ``run_one(framework, policy, kl,
    data_path)`` runs kdlab and TRL (kdlab only without trl), alternating which goes first, on
    ``data`` pickled once to a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        data_path = Path(tmp) / "data.pkl"
        data_path.write_bytes(pickle.dumps(data))
        for i, (policy, kl) in enumerate(cells):
            order = ["kdlab", "trl"] if with_trl else ["kdlab"]
            if i % 2:  # alternate which framework runs first
                order.reverse()
            res = {}
            for fw in order:
                log(f"  {policy}-policy / {kl} KL: {fw} ...")
                res[fw] = run_one(fw, policy, kl, str(data_path))
            yield policy, kl, res


def run_cells(settings: dict[str, int], cells: tuple[tuple[str, str], ...] = CELLS, with_trl: bool = True,
              log=print) -> list[dict[str, Any]]:
    """Both frameworks on every cell, each in its own subprocess; the equal-work check per KL."""
    steps = settings["window"] * settings["repeats"]
    n_pool = max(matched_pool_size(steps, BATCH), BATCH)
    torch.manual_seed(0)
    teacher, _ = build_models()
    log(f"sampling the OffPD pool: {n_pool} teacher responses to countdown-3 prompts ...")
    data = make_data(teacher, n_pool)
    losses = {kl: loss_abs_diff(kl, data) for kl in {k for _, k in cells}} if with_trl else {}
    out = []

    def run_one(fw: str, policy: str, kl: str, data_path: str) -> dict[str, Any]:
        return _subprocess(["--worker", fw, "--policy", policy, "--kl", kl, "--data", data_path,
                            *[f"--{k}={v}" for k, v in settings.items()]])

    for policy, kl, res in each_cell(data, cells, with_trl, run_one, log):
        k, t = res["kdlab"], res.get("trl")
        cell: dict[str, Any] = {
            "policy": policy, "kl": kl,
            "kdlab_tokens_per_s": k["tokens_per_s"], "trl_tokens_per_s": t and t["tokens_per_s"],
            "ratio": t and k["tokens_per_s"] / t["tokens_per_s"],
            "kdlab_steps_per_s": k["steps_per_s"], "trl_steps_per_s": t and t["steps_per_s"],
            "kdlab_tokens_per_cpu_s": k["tokens_per_cpu_s"], "trl_tokens_per_cpu_s": t and t["tokens_per_cpu_s"],
            "ratio_cpu": t and k["tokens_per_cpu_s"] / t["tokens_per_cpu_s"],
            "kdlab_peak_mb": k["peak_mb"], "trl_peak_mb": t and t["peak_mb"],
            "loss_abs_diff": losses[kl]["loss_abs_diff"] if losses else None,
            "loss_within_tolerance": losses[kl]["loss_abs_diff"] <= LOSS_TOL if losses else None,
            "target_ratio": TARGETS[policy],
            "meets_target": None if t is None else k["tokens_per_s"] / t["tokens_per_s"] >= TARGETS[policy],
            "kdlab_teacher_cache_hit": k.get("teacher_cache_hit"),
            "kdlab_window_tokens_per_s": k["window_tokens_per_s"],
            "trl_window_tokens_per_s": t and t["window_tokens_per_s"],
            "kdlab_step_s": k["step_wall_s"], "trl_step_s": t and t["step_wall_s"],
            "setup": {"teacher": TEACHER_SIZE, "student": STUDENT_SIZE, "task": TASK, "batch": BATCH,
                      "new_tokens": NEW_TOKENS, "lr": LR, "dtype": "bf16", "threads": 1,
                      "offpd_pool": n_pool, **settings},
        }
        out.append(cell)
    return out


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


# (header, key, format) of the table's columns; a missing value prints as "-"
TABLE = (("policy", "policy", "6"), ("KL", "kl", "8"), ("kdlab tok/s", "kdlab_tokens_per_s", "11.0f"),
         ("TRL tok/s", "trl_tokens_per_s", "9.0f"), ("ratio", "ratio", "6.2f"), ("target", "target_ratio", "6.1f"),
         ("cpu ratio", "ratio_cpu", "9.2f"), ("kdlab MiB", "kdlab_peak_mb", "9.1f"), ("TRL MiB", "trl_peak_mb", "8.1f"),
         ("loss diff", "loss_abs_diff", "9.1e"), ("cache", "kdlab_teacher_cache_hit", "5.2f"))


def print_table(cells: list[dict[str, Any]], columns: tuple[tuple[str, str, str], ...] = TABLE) -> None:
    width = {h: int(re.match(r"\d*", spec).group() or 0) for h, _, spec in columns}
    head = " ".join(format(h, f"<{width[h]}" if i < 2 else f">{width[h]}") for i, (h, _, _) in enumerate(columns))
    print(head)
    print("-" * len(head))
    for c in cells:
        print(" ".join(format(c[key], spec) if c.get(key) is not None else format("-", f">{width[h]}")
                       for h, key, spec in columns))


def print_kl_memory(res: dict[str, Any]) -> None:
    print(f"\nKL memory, forward + backward, {res['tokens']} tokens x vocab {res['vocab']}, bf16 logits "
          f"(peak RSS above the inputs){'; ' + res['note'] if res['note'] else ''}:")
    print(f"  naive token_kl        {res['naive']['peak_mb']:9.0f} MiB  ({res['naive']['wall_s']:.1f} s)")
    for c in res["chunked"]:
        print(f"  chunked (chunk {c['chunk_size']:5d}) {c['peak_mb']:9.0f} MiB  = {c['share_of_naive']:.0%} of naive "
              f"(target <= {res['target_share']:.0%}: {'met' if c['meets_memory_target'] else 'MISSED'}); "
              f"max |value diff| {c['value_max_abs_diff']:.1e}, max |grad diff| {c['grad_max_abs_diff']:.1e} "
              f"({c['wall_s']:.1f} s)")


def _worker(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    if args.worker == "klmem":
        return kl_memory_worker(args.kind, args.tokens, args.vocab, args.chunk_size, args.tensors)
    data = pickle.loads(Path(args.data).read_bytes())
    fn = run_kdlab if args.worker == "kdlab" else run_trl
    return fn(args.policy, args.kl, data, args.warmup, args.window, args.repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer timed steps (a smoke run, not a measurement)")
    ap.add_argument("--kl-memory", action="store_true", help="also measure the chunked KL's peak memory")
    ap.add_argument("--no-distill", action="store_true", help="skip the kdlab-vs-TRL cells")
    ap.add_argument("--out", default=str(REPO_ROOT / "outputs" / "bench" / "distill.json"))
    ap.add_argument("--worker", choices=["kdlab", "trl", "klmem"], help=argparse.SUPPRESS)
    for name in ("policy", "kl", "data", "result", "kind", "tensors"):
        ap.add_argument(f"--{name.replace('_', '-')}", help=argparse.SUPPRESS)
    for name in ("warmup", "window", "repeats", "tokens", "vocab", "chunk-size"):
        ap.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        Path(args.result).write_text(json.dumps(_worker(args)))
        return 0
    torch.set_num_threads(1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.no_distill:
        with_trl = trl_available()
        if not with_trl:
            print("trl is not importable (pip install -e .[bench]): timing kdlab only")
        cells = run_cells(QUICK if args.quick else FULL, with_trl=with_trl)
        out.write_text(json.dumps(cells, indent=2))
        print()
        print_table(cells)
        print(f"\nratio = kdlab / TRL response tokens per wall second (median window); targets: >= 2.0 off-policy, "
              f">= 1.5 on-policy. cpu ratio: the same per CPU second. loss diff: |kdlab - TRL| loss on one "
              f"identical batch. cache: share of OffPD rows served from kdlab's teacher-logit cache. Wrote {out}")
    if args.kl_memory:
        res = kl_memory_section()
        (out.parent / "kl_memory.json").write_text(json.dumps(res, indent=2))
        print_kl_memory(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
