"""kdlab's distillation step against TRL's GKDTrainer, side by side, in one invocation.

Command (``make bench`` runs it after ``pip install -e .[bench]``)::

    python benchmarks/bench_distill.py [--quick] [--kl-memory] [--out outputs/bench/distill.json]

What is compared
----------------
Both frameworks train the same student ("student-s", 0.87M parameters) from the same teacher (a
6.06M-parameter Llama: hidden 256, 8 layers, 4 heads, MLP 640), both built with
``kdlab.models.build_model`` and run in bf16 (parameters and compute, no fp32 master copy, as the
study runs), on the same countdown-3 prompts, batch 32, at most 32 new tokens, AdamW at the same
learning rate (constant), gradient clipping at 1.0, temperature 1. Four cells: OffPD / OnPD x
forward / reverse KL.

* kdlab: ``kdlab.distill.distill`` with a ``RunConfig``, exactly as the study calls it; the time
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

Throughput counts the response tokens each step trains on (masked-in positions) per second.
Each cell and framework runs in a fresh subprocess: ``WARMUP`` steps are excluded, then
``REPEATS`` windows of ``WINDOW`` steps are timed and the median window is quoted.

OffPD teacher-logit cache
-------------------------
kdlab caches the teacher's logits of each OffPD pool response the first time a batch draws it.
Its benefit grows during a run: over a study run (150 steps x 32 rows from a 2,048-response
pool) 61% of the rows drawn are served from the cache. The benchmark's short runs use a smaller
pool, sized so that the expected share of cached rows during the timed steps equals that study
run average; the measured share is reported as ``kdlab_teacher_cache_hit``.

Peak memory
-----------
Per subprocess: the resident set size right after the models, data and framework objects are
set up is the baseline; the kernel's peak-RSS counter (``VmHWM``) is reset there (writing ``5``
to ``/proc/self/clear_refs``) and read after training; the peak is that high-water mark minus
the baseline (MiB). It counts everything the training phase allocates (optimizer state,
activations, caches), measured by the kernel, not by Python.

Equal work
----------
``loss_abs_diff``: on one identical batch (the same prompt + response tokens, the same float32
logits from the same models), kdlab's ``kl_loss`` and TRL's ``GKDTrainer.generalized_jsd_loss``
(labels = the response tokens, -100 on padding; its "batchmean" reduction divides the summed
per-token KL by the number of unmasked tokens, which is kdlab's masked token mean) must agree
to 1e-4.

``--kl-memory``: peak extra memory of ``kdlab.kl.token_kl_chunked`` against a naive
two-log-softmax KL (forward + backward) at a Llama-3 vocabulary (128,256) and 4,096 tokens
with bf16 logits, each in its own subprocess, same RSS method; values compared to 1e-5.
"""
from __future__ import annotations

import argparse
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
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT / "src") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "src"))

from kdlab.batching import pad_left, pad_right, response_logits  # noqa: E402
from kdlab.data import ProblemPool, prompt_ids  # noqa: E402
from kdlab.distill import RunConfig, distill, offpd_rollouts  # noqa: E402
from kdlab.kl import kl_loss  # noqa: E402
from kdlab.models import build_model  # noqa: E402
from kdlab.tasks import get_task  # noqa: E402
from kdlab.tokenizer import PAD_ID, build_tokenizer  # noqa: E402

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
QUICK = dict(warmup=1, window=2, repeats=1)
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


def matched_pool_size(warmup: int, timed: int, batch: int) -> int:
    """OffPD pool size whose expected cached share over the timed steps equals a study run's."""
    target = cached_share(STUDY_POOL, 0, STUDY_STEPS * 32)
    k0, k1 = warmup * batch, (warmup + timed) * batch
    lo, hi = 1, 1 << 20  # cached_share decreases as the pool grows
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cached_share(mid, k0, k1) > target else (lo, mid)
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
    """Training prompts and ``n_offpd`` cached teacher responses (the OffPD pool), seed 0."""
    task = bench_task(new_tokens)
    pool = ProblemPool(task, "train", pool_size, seed=0)
    problems, responses = offpd_rollouts(teacher, task, pool, n_offpd, 1.0, seed=0, max_new_tokens=new_tokens)
    return {"pool": pool.problems, "problems": problems, "responses": responses, "new_tokens": new_tokens}


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))


class PeakRSS:
    """Peak resident memory of this process above a baseline, from the kernel's own counter.

    ``start()`` records the current RSS and resets the peak (``/proc/self/clear_refs`` = 5);
    ``peak_mb()`` returns (VmHWM - baseline) in MiB.
    """

    def start(self) -> None:
        self.base = _status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")

    def peak_mb(self) -> float:
        return (_status_kib("VmHWM") - self.base) / 1024.0


# ---------------------------------------------------------------------------------------------
# the two frameworks
# ---------------------------------------------------------------------------------------------


def _windows(wall: list[float], cpu: list[float], tokens: list[float], warmup: int, window: int, repeats: int
             ) -> dict[str, Any]:
    """Medians over ``repeats`` windows of ``window`` steps after ``warmup``: response tokens and
    steps per second of wall time and per second of this process's CPU time."""
    out: dict[str, Any] = {}
    for clock, times in (("s", wall), ("cpu_s", cpu)):
        tps, sps = [], []
        for r in range(repeats):
            sl = slice(warmup + r * window, warmup + (r + 1) * window)
            t = sum(times[sl])
            tps.append(sum(tokens[sl]) / t)
            sps.append(window / t)
        out[f"tokens_per_{clock}"] = statistics.median(tps)
        out[f"steps_per_{clock}"] = statistics.median(sps)
        out[f"window_tokens_per_{clock}"] = tps
    out.update(step_wall_s=wall, step_cpu_s=cpu, step_tokens=tokens)
    return out


def run_kdlab(policy: str, kl: str, data: dict, warmup: int, window: int, repeats: int,
              teacher_size: Any = TEACHER_SIZE, student_size: Any = STUDENT_SIZE, offpd_pool: int | None = None
              ) -> dict[str, Any]:
    """Time ``kdlab.distill.distill`` on one cell; returns throughput, peak memory and losses."""
    torch.manual_seed(0)
    teacher, student = build_models(teacher_size, student_size)
    task = bench_task(data["new_tokens"])
    pool = ProblemPool.__new__(ProblemPool)  # the exact prompts the parent drew
    pool.task, pool.problems = task, data["pool"]
    n = len(data["responses"]) if offpd_pool is None else offpd_pool
    offpd = (data["problems"][:n], data["responses"][:n])
    steps = warmup + window * repeats
    cfg = RunConfig(task=TASK, policy=policy, kl=kl, lr=LR, seed=0, steps=steps, batch_size=BATCH, temperature=1.0,
                    grad_clip=1.0, dtype="bf16", offpd_pool=n)
    mem = PeakRSS()
    mem.start()
    res = distill(student, teacher, task, cfg, offpd=offpd if policy == "off" else None, pool=pool, progress=False)
    peak = mem.peak_mb()
    if res.collapsed or len(res.history) != steps:
        raise RuntimeError(f"kdlab run {policy}/{kl} stopped early: {res.history[-1]}")
    tokens = [h["length"] * BATCH for h in res.history]
    out = _windows([h["time_s"] for h in res.history], [h["cpu_s"] for h in res.history], tokens, warmup, window,
                   repeats)
    out.update(peak_mb=peak, loss=[h["loss"] for h in res.history])
    hits = [h["teacher_cached"] for h in res.history[warmup:] if "teacher_cached" in h]
    if hits:
        out["teacher_cache_hit"] = sum(hits) / len(hits)
    return out


def run_trl(policy: str, kl: str, data: dict, warmup: int, window: int, repeats: int,
            teacher_size: Any = TEACHER_SIZE, student_size: Any = STUDENT_SIZE) -> dict[str, Any]:
    """Time TRL's GKDTrainer on one cell (same models, prompts, batch, lr, KL direction)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    torch.manual_seed(0)
    teacher, student = build_models(teacher_size, student_size)
    student = student.to(torch.bfloat16)
    tok = build_tokenizer()
    rows = []
    for p, resp in zip(data["problems"], data["responses"]):
        ids = prompt_ids(p.prompt)
        rows.append({"prompt": p.prompt, "input_ids": ids + resp, "completion_mask": [0] * len(ids) + [1] * len(resp)})
    steps = warmup + window * repeats
    stamps: list[tuple[float, float]] = []  # (wall, cpu) at the start and at the end of every step
    tokens: list[int] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not stamps:
                stamps.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):
            stamps.append((time.perf_counter(), time.process_time()))

    class CountingGKD(GKDTrainer):
        """GKDTrainer that records how many response tokens each step trains on."""

        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            tokens.append(int((inputs["labels"][:, 1:] != -100).sum()))
            return loss

    with tempfile.TemporaryDirectory() as tmp:
        args = GKDConfig(output_dir=tmp, per_device_train_batch_size=BATCH, gradient_accumulation_steps=1,
                         max_steps=steps, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                         weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", lmbda=TRL_LMBDA[policy],
                         beta=TRL_BETA[kl], temperature=1.0, max_new_tokens=data["new_tokens"], seq_kd=False,
                         gradient_checkpointing=False, bf16=False, use_cpu=True, seed=0, data_seed=0,
                         dataloader_num_workers=0, logging_strategy="no", save_strategy="no", report_to="none",
                         disable_tqdm=True)
        trainer = CountingGKD(model=student, teacher_model=teacher, args=args, processing_class=tok,
                              train_dataset=Dataset.from_list(rows), callbacks=[Clock()])
        mem = PeakRSS()
        mem.start()
        trainer.train()
        peak = mem.peak_mb()
    wall = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])]
    cpu = [b[1] - a[1] for a, b in zip(stamps, stamps[1:])]
    if len(wall) != steps or len(tokens) != steps:
        raise RuntimeError(f"TRL ran {len(wall)} steps, expected {steps}")
    out = _windows(wall, cpu, [float(t) for t in tokens], warmup, window, repeats)
    out.update(peak_mb=peak)
    return out


# ---------------------------------------------------------------------------------------------
# equal work: the two losses on one identical batch
# ---------------------------------------------------------------------------------------------


def loss_abs_diff(kl: str, data: dict, teacher_size: Any = TEACHER_SIZE, student_size: Any = STUDENT_SIZE,
                  batch: int = BATCH) -> dict[str, float]:
    """|kdlab kl_loss - TRL generalized_jsd_loss| on the same batch and the same float32 logits."""
    from trl.experimental.gkd import GKDTrainer

    teacher, student = build_models(teacher_size, student_size)
    problems, responses = data["problems"][:batch], data["responses"][:batch]
    p, pm = pad_left([prompt_ids(x.prompt) for x in problems])
    r, rm = pad_right(responses)
    with torch.no_grad():
        t_logits = response_logits(teacher, p, pm, r, rm).float()  # (B, R, V)
        s_logits = response_logits(student, p, pm, r, rm).float()
    ours = float(kl_loss(s_logits, t_logits, kl, rm))
    labels = torch.where(rm, r, torch.full_like(r, -100))
    theirs = float(GKDTrainer.generalized_jsd_loss(s_logits, t_logits, labels=labels, beta=TRL_BETA[kl],
                                                   temperature=1.0, reduction="batchmean"))
    return {"kdlab_loss": ours, "trl_loss": theirs, "loss_abs_diff": abs(ours - theirs)}


def trl_available() -> bool:
    try:
        import trl.experimental.gkd  # noqa: F401
    except ImportError:
        return False
    return True
