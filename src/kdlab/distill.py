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
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Any, Callable

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
    problems = [pool.problems[i % len(pool.problems)] for i in rng.sample(range(max(n, len(pool.problems))), n)] \
        if n <= len(pool.problems) else [rng.choice(pool.problems) for _ in range(n)]
    gen = torch.Generator().manual_seed(seed)
    responses: list[list[int]] = []
    tp = teacher_prompt or (lambda p: p.prompt)
    for i in range(0, n, batch_size):
        chunk = problems[i:i + batch_size]
        ro = sample(None, [prompt_ids(p.prompt) for p in chunk], max_new_tokens, lam=-1.0, teacher=teacher,
                    teacher_prompts=[prompt_ids(tp(p)) for p in chunk], temperature=temperature, generator=gen)
        responses.extend(ro.token_lists())
    return problems, responses


def _params_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


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
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999),
                            eps=1e-8)
    history: list[dict[str, Any]] = []
    collapsed, collapse_step = False, None
    bar = tqdm(range(cfg.steps), desc=desc or cfg.run_id, disable=not progress, leave=False)
    for step in bar:
        t0 = time.perf_counter()
        if cfg.policy == "off":
            idx = [rng.randrange(len(offpd[0])) for _ in range(cfg.batch_size)]
            problems = [offpd[0][i] for i in idx]
            responses = [offpd[1][i] for i in idx]
            r, rm = pad_right(responses)
            entropy = float("nan")
        else:
            problems = pool.sample(cfg.batch_size, rng)
            student.eval()
            ro: Rollout = sample(student, [prompt_ids(p.prompt) for p in problems], task.max_new_tokens, lam=cfg.lam,
                                 teacher=teacher, teacher_prompts=[prompt_ids(tp(p)) for p in problems],
                                 temperature=cfg.temperature, logratio_clip=cfg.logratio_clip,
                                 plausibility_alpha=cfg.plausibility_alpha, generator=gen)
            r, rm = ro.tokens, ro.mask
            entropy = float((ro.entropy * rm).sum() / rm.sum().clamp(min=1))
        t1 = time.perf_counter()
        sp, spm = pad_left([prompt_ids(p.prompt) for p in problems])
        tpids, tpm = pad_left([prompt_ids(tp(p)) for p in problems])
        student.train()
        with torch.no_grad():
            t_logits = response_logits(teacher, tpids, tpm, r, rm)  # (B, R, V)
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
        gnorm = torch.nn.utils.clip_grad_norm_(student.parameters(),
                                               cfg.grad_clip if cfg.grad_clip is not None else float("inf"))
        opt.step()
        with torch.no_grad():
            n_tok = rm.sum().clamp(min=1)
            fkl = float(token_kl(s_logits.detach(), t_logits, "forward", rm).sum() / n_tok)
            rkl = float(token_kl(s_logits.detach(), t_logits, "reverse", rm).sum() / n_tok)
        history.append({"step": step, "loss": loss_val, "forward_kl": fkl, "reverse_kl": rkl,
                        "grad_norm": float(gnorm), "entropy": entropy,
                        "length": float(rm.sum(-1).float().mean()), "lr": opt.param_groups[0]["lr"]})
        t2 = time.perf_counter()
        phase["rollout"] += t1 - t0
        phase["step"] += t2 - t1
        if not math.isfinite(float(gnorm)) or not _params_finite(student):
            collapsed, collapse_step = True, step
            break
        bar.set_postfix(loss=f"{loss_val:.3f}")
    student.eval()
    return RunResult(history=history, collapsed=collapsed, collapse_step=collapse_step,
                     wall_s=time.perf_counter() - t_start, phase_s=phase)
