"""One distillation run: rollout policy x KL x learning rate, from a student base to a teacher.

The run samples training sequences under its rollout policy (OffPD: a cached pool of teacher
rollouts; OnPD: fresh student rollouts every step; lambda: fresh pi_lambda rollouts), scores
every response position with the frozen teacher over the full vocabulary, and takes one AdamW
step on the chosen KL. Parameters are bf16 with no fp32 master copy by default (an update
smaller than one bf16 step is lost, as in the paper's bf16 training), or fp32.
"""
from __future__ import annotations

import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from tqdm.auto import tqdm

from .batching import pad_left, pad_right, response_logits
from .data import ProblemPool, prompt_ids
from .kl import kl_loss, token_kl
from .rollout import Rollout, sample
from .tasks.base import Problem, Task

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class RunConfig:
    """Everything that defines one distillation run (the grid varies policy, lam, kl, lr, seed)."""

    task: str = "countdown-3"
    policy: str = "off"  # "off" (lam=-1), "on" (lam=+1) or "lambda" (lam as given)
    lam: float = -1.0
    kl: str = "forward"  # forward | reverse | jsd | k1 | k2 | k3
    lr: float = 1e-4
    seed: int = 0
    steps: int = 150
    batch_size: int = 32
    temperature: float = 1.0
    grad_clip: float | None = 1.0
    dtype: str = "bf16"
    jsd_beta: float = 0.5
    sampled_direction: str = "reverse"
    logratio_clip: float | None = 5.0
    plausibility_alpha: float | None = 0.1
    offpd_pool: int = 2048
    warmup: int = 0
    weight_decay: float = 0.0
    data_seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in ("off", "on", "lambda"):
            raise ValueError(f"policy must be 'off', 'on' or 'lambda', got {self.policy!r}")
        if self.policy == "off":
            self.lam = -1.0
        elif self.policy == "on":
            self.lam = 1.0
        if self.kl not in ("forward", "reverse", "jsd", "k1", "k2", "k3"):
            raise ValueError(f"kl must be one of forward, reverse, jsd, k1, k2, k3; got {self.kl!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not (self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")

    @property
    def run_id(self) -> str:
        pol = self.policy if self.policy != "lambda" else f"lam{self.lam:+g}"
        return f"{self.task}_{pol}_{self.kl}_lr{self.lr:g}_s{self.seed}"


@dataclass
class RunResult:
    history: list[dict[str, Any]]
    collapsed: bool
    collapse_step: int | None
    wall_s: float
    phase_s: dict[str, float] = field(default_factory=dict)


def offpd_rollouts(teacher: torch.nn.Module, task: Task, pool: ProblemPool, n: int, temperature: float,
                   seed: int, max_new_tokens: int, batch_size: int = 512,
                   teacher_prompt: Callable[[Problem], str] | None = None) -> tuple[list[Problem], list[list[int]]]:
    """Sample ``n`` teacher responses (token ids incl. </s>) to pool problems, once."""
    rng = random.Random(f"offpd:{seed}")
    # distinct problems while the pool has enough, then with replacement
    problems = rng.sample(pool.problems, n) if n <= len(pool.problems) else [rng.choice(pool.problems) for _ in range(n)]
    gen = torch.Generator().manual_seed(seed)
    responses: list[list[int]] = []
    tp = teacher_prompt or (lambda p: p.prompt)
    for i in range(0, n, batch_size):
        chunk = problems[i:i + batch_size]
        ro = sample(None, [prompt_ids(p.prompt) for p in chunk], max_new_tokens, lam=-1.0, teacher=teacher,
                    teacher_prompts=[prompt_ids(tp(p)) for p in chunk], temperature=temperature, generator=gen)
        responses.extend(ro.token_lists())
    return problems, responses


# Largest OffPD teacher-logit cache kept in memory (bytes); bigger pools are scored per batch.
TEACHER_CACHE_BYTES = 1 << 30


class _OffPDTeacherLogits:
    """Teacher logits of each OffPD pool response, computed the first time a batch draws it.

    The teacher is frozen and a response's logits depend only on its own prompt and tokens
    (left padding is skipped by the position ids and masked out), so a row drawn again reuses
    them. One (pool, longest response, V) tensor in the teacher's output dtype holds them, zero
    past each response's end; it is allocated uninitialised, so only rows written take memory.
    """

    def __init__(self, teacher: torch.nn.Module, problems: list[Problem], responses: list[list[int]],
                 teacher_prompt: Callable[[Problem], str]):
        self.teacher, self.problems, self.responses, self.tp = teacher, problems, responses, teacher_prompt
        self.store: torch.Tensor | None = None
        self.filled = torch.zeros(len(responses), dtype=torch.bool)

    @staticmethod
    def fits(teacher: torch.nn.Module, responses: list[list[int]]) -> bool:
        """Whether the cache for the whole pool stays under ``TEACHER_CACHE_BYTES``."""
        head = teacher.get_output_embeddings() if hasattr(teacher, "get_output_embeddings") else None
        if head is None or not responses:
            return False
        vocab = head.weight.shape[0]
        item = next(teacher.parameters()).element_size()
        return len(responses) * max(1, max(len(r) for r in responses)) * vocab * item <= TEACHER_CACHE_BYTES

    def batch(self, idx: list[int], width: int) -> tuple[torch.Tensor, int]:
        """(B, width, V) teacher logits of pool rows ``idx`` (zeros past a row's end) and how many
        rows reused logits (cached before, or computed once for an earlier row of this batch)."""
        missing = sorted({i for i in idx if not self.filled[i]})
        if missing:
            tp, tpm = pad_left([prompt_ids(self.tp(self.problems[i])) for i in missing])
            r, rm = pad_right([self.responses[i] for i in missing])
            with torch.no_grad():
                logits = response_logits(self.teacher, tp, tpm, r, rm)  # (M, R, V)
            if self.store is None:
                longest = max(1, max(len(x) for x in self.responses))
                self.store = logits.new_empty((len(self.responses), longest, logits.shape[-1]))
            for j, i in enumerate(missing):
                n = len(self.responses[i])
                self.store[i, :n] = logits[j, :n]
                self.store[i, n:] = 0
            self.filled[missing] = True
        return self.store[torch.tensor(idx), :width], len(idx) - len(missing)


@contextmanager
def _fast_cpu_attention(*models: torch.nn.Module) -> Iterator[None]:
    """Run CPU models that use SDPA attention with the eager (matmul) attention instead.

    Same function; on CPU the eager path is faster at these sizes, mostly in backward (the fused
    CPU attention's bf16 backward is slow). GPU models and other implementations are untouched;
    each model's setting is restored on exit.
    """
    switched = []
    for m in models:
        cfg = getattr(m, "config", None)
        if (cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa"
                and next(m.parameters()).device.type == "cpu" and hasattr(m, "set_attn_implementation")):
            m.set_attn_implementation("eager")
            switched.append(m)
    try:
        yield
    finally:
        for m in switched:
            m.set_attn_implementation("sdpa")


def distill(student: torch.nn.Module, teacher: torch.nn.Module, task: Task, cfg: RunConfig, *,
            offpd: tuple[list[Problem], list[list[int]]] | None = None, pool: ProblemPool | None = None,
            teacher_prompt: Callable[[Problem], str] | None = None, progress: bool = True,
            desc: str | None = None) -> RunResult:
    """Train ``student`` in place (cast to ``cfg.dtype``) by distillation from frozen ``teacher``.

    ``offpd`` (problems, teacher responses) is required for policy "off"; ``pool`` (train
    problems) for the others. ``teacher_prompt`` maps a problem to the teacher's prompt text
    (default: the student's). Returns the per-step history; never raises on divergence: a
    non-finite loss or parameter stops the run and marks it collapsed.
    """
    t_start = time.perf_counter()
    phase = {"rollout": 0.0, "step": 0.0}
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = DTYPES[cfg.dtype]
    student.to(dtype)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    if cfg.policy == "off" and offpd is None:
        raise ValueError("policy 'off' needs the cached teacher rollouts (offpd=...)")
    if cfg.policy != "off" and pool is None:
        raise ValueError(f"policy {cfg.policy!r} needs a pool of training problems (pool=...)")
    tp = teacher_prompt or (lambda p: p.prompt)
    params = list(student.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999),
                            eps=1e-8)
    cache = None
    if cfg.policy == "off" and _OffPDTeacherLogits.fits(teacher, offpd[1]):
        cache = _OffPDTeacherLogits(teacher, offpd[0], offpd[1], tp)
    history: list[dict[str, Any]] = []
    collapsed, collapse_step = False, None
    bar = tqdm(range(cfg.steps), desc=desc or cfg.run_id, disable=not progress, leave=False)
    with _fast_cpu_attention(student, teacher):
        for step in bar:
            t0, c0 = time.perf_counter(), time.process_time()
            extra: dict[str, Any] = {}
            if cfg.policy == "off":
                idx = [rng.randrange(len(offpd[0])) for _ in range(cfg.batch_size)]
                problems = [offpd[0][i] for i in idx]
                responses = [offpd[1][i] for i in idx]
                r, rm = pad_right(responses)
                entropy = float("nan")
            else:
                problems = pool.sample(cfg.batch_size, rng)
            s_prompts = [prompt_ids(p.prompt) for p in problems]
            t_prompts = s_prompts if teacher_prompt is None else [prompt_ids(tp(p)) for p in problems]
            if cfg.policy != "off":
                student.eval()
                ro: Rollout = sample(student, s_prompts, task.max_new_tokens, lam=cfg.lam, teacher=teacher,
                                     teacher_prompts=t_prompts, temperature=cfg.temperature,
                                     logratio_clip=cfg.logratio_clip, plausibility_alpha=cfg.plausibility_alpha,
                                     generator=gen)
                r, rm = ro.tokens, ro.mask
                entropy = float((ro.entropy * rm).sum() / rm.sum().clamp(min=1))
            t1 = time.perf_counter()
            sp, spm = pad_left(s_prompts)
            if cache is not None:
                t_logits, hits = cache.batch(idx, r.shape[1])  # (B, R, V)
                extra["teacher_cached"] = hits / len(idx)
            else:
                tpids, tpm = pad_left(t_prompts)
                with torch.no_grad():
                    t_logits = response_logits(teacher, tpids, tpm, r, rm)  # (B, R, V)
            if not student.training:
                student.train()
            s_logits = response_logits(student, sp, spm, r, rm)  # (B, R, V)
            loss = kl_loss(s_logits, t_logits, cfg.kl, rm, temperature=1.0, beta=cfg.jsd_beta, tokens=r,
                           sample_direction=cfg.sampled_direction)
            if cfg.warmup:
                for g in opt.param_groups:
                    g["lr"] = cfg.lr * min(1.0, (step + 1) / cfg.warmup)
            opt.zero_grad(set_to_none=True)
            loss_val = loss.item()
            if not math.isfinite(loss_val):
                collapsed, collapse_step = True, step
                history.append({"step": step, "loss": loss_val})
                break
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params,
                                                   cfg.grad_clip if cfg.grad_clip is not None else float("inf"))
            opt.step()
            with torch.no_grad():
                n_tok = rm.sum().clamp(min=1)
                fkl = float(token_kl(s_logits.detach(), t_logits, "forward", rm).sum() / n_tok)
                rkl = float(token_kl(s_logits.detach(), t_logits, "reverse", rm).sum() / n_tok)
            finite = math.isfinite(float(gnorm)) and all(bool(torch.isfinite(p).all()) for p in params)
            t2 = time.perf_counter()
            history.append({"step": step, "loss": loss_val, "forward_kl": fkl, "reverse_kl": rkl,
                            "grad_norm": float(gnorm), "entropy": entropy,
                            "length": float(rm.sum(-1).float().mean()), "lr": opt.param_groups[0]["lr"],
                            "time_s": t2 - t0, "cpu_s": time.process_time() - c0, **extra})
            phase["rollout"] += t1 - t0
            phase["step"] += t2 - t1
            if not finite:
                collapsed, collapse_step = True, step
                break
            bar.set_postfix(loss=f"{loss_val:.3f}")
    student.eval()
    return RunResult(history=history, collapsed=collapsed, collapse_step=collapse_step,
                     wall_s=time.perf_counter() - t_start, phase_s=phase)
