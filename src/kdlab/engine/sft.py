"""Supervised fine-tuning of student bases and task teachers on reference traces.

This is how kdlab makes its models: a mixture of tasks (target tasks and probe skills) with
weights, next-token cross-entropy on completion tokens only, AdamW with warmup and cosine decay,
fp32 master weights under bf16 autocast. The loss and the batch source are here; the optimiser,
schedule, accumulation and clipping are ``kdlab.engine.trainer``'s. The same loop trains kdlab's toy models (char
tokenizer) and real checkpoints (``codec``: a Hugging Face tokenizer with its chat template,
micro-batches). Distillation lives in ``kdlab.engine.distill``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .batching import pad_left, pad_right, response_logits
from ..models.codec import CHAR
from .data import ProblemPool
from .trainer import Trainer, cosine_lr_at
from ..tasks.base import Task


@dataclass
class SFTSchedule:
    steps: int
    batch_size: int
    lr: float
    warmup: int = 100
    weight_decay: float = 0.01
    min_lr_ratio: float = 0.1
    seed: int = 0
    pool_size: int = 20000
    autocast_bf16: bool = True
    micro_batch_size: int = 0  # rows per forward/backward (gradient accumulation); 0 = the whole batch


SFT_BETAS = (0.9, 0.98)


def sft_trainer(model: torch.nn.Module, sched: SFTSchedule, optimizer: torch.optim.Optimizer | None = None) -> Trainer:
    """SFT's trainer: AdamW (betas 0.9 / 0.98), linear warm-up then cosine decay to
    ``min_lr_ratio``, gradients clipped to norm 1; ``optimizer``: one to continue (a resumed run)."""
    return Trainer(model.parameters(), sched.lr, weight_decay=sched.weight_decay, betas=SFT_BETAS, schedule="cosine",
                   warmup=sched.warmup, total_steps=sched.steps, min_lr_ratio=sched.min_lr_ratio, grad_clip=1.0,
                   optimizer=optimizer)


def lr_at(step: int, sched: SFTSchedule) -> float:
    """SFT's learning rate at ``step`` (``kdlab.engine.trainer.cosine_lr_at``)."""
    return cosine_lr_at(step, sched.lr, sched.warmup, sched.steps, sched.min_lr_ratio)


def sft_loss(model: torch.nn.Module, prompts: list[list[int]], completions: list[list[int]], codec=CHAR,
             reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy (nats/token) over completion tokens: their mean, or their sum."""
    p, pm = pad_left(prompts, codec.pad_id)
    r, rm = pad_right(completions, pad_id=codec.pad_id)
    logits = response_logits(model, p, pm, r, rm, codec.vocab_size)  # (B, R, V)
    return F.cross_entropy(logits.float()[rm.to(logits.device)], r.to(logits.device)[rm.to(logits.device)],
                           reduction=reduction)


def sft(model: torch.nn.Module, mixture: list[tuple[Task, float]], sched: SFTSchedule,
        desc: str = "sft", progress: bool = True, start_step: int = 0,
        optimizer: torch.optim.Optimizer | None = None, on_checkpoint=None, checkpoint_every: int = 0,
        until: int | None = None, codec=CHAR) -> list[dict]:
    """Train ``model`` in place on a weighted task mixture; returns the loss history.
    ``codec`` renders prompts and reference completions (``kdlab.models.codec``).

    ``on_checkpoint(step, optimizer)`` is called every ``checkpoint_every`` steps (resumability);
    ``until`` stops early (the schedule still spans ``sched.steps``).
    """
    rng = random.Random(sched.seed * 1000 + start_step)
    torch.manual_seed(sched.seed * 1000 + start_step)
    pools = [ProblemPool(task, "train", sched.pool_size, seed=sched.seed + i) for i, (task, _) in enumerate(mixture)]
    weights = [w for _, w in mixture]
    trainer = sft_trainer(model, sched, optimizer)
    model.train()
    history = []
    bar = tqdm(range(start_step, until or sched.steps), desc=desc, disable=not progress, initial=start_step, total=sched.steps)
    ema = None
    for step in bar:
        if checkpoint_every and step % checkpoint_every == 0:
            # Reseed at every checkpoint boundary, so a resumed run sees exactly the data and
            # dropout-free noise of an uninterrupted one.
            rng = random.Random(sched.seed * 1000 + step)
            torch.manual_seed(sched.seed * 1000 + step)
        picks = rng.choices(range(len(pools)), weights=weights, k=sched.batch_size)
        prompts, comps = [], []
        for k in picks:
            prob = rng.choice(pools[k].problems)
            prompts.append(codec.prompt(prob.prompt))
            comps.append(codec.completion(pools[k].task.reference(prob, rng)))
        trainer.set_lr(step)
        trainer.zero_grad()
        mb = sched.micro_batch_size or len(prompts)
        if mb >= len(prompts):
            with torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16, enabled=sched.autocast_bf16):
                loss = sft_loss(model, prompts, comps, codec)
            trainer.backward(loss)
        else:  # gradient accumulation: summed token losses over the batch's token count
            n_tokens = sum(len(c) for c in comps)
            loss = None  # summed on the device: the host reads the step's loss once
            for i in range(0, len(prompts), mb):
                with torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16,
                                    enabled=sched.autocast_bf16):
                    part = sft_loss(model, prompts[i:i + mb], comps[i:i + mb], codec, reduction="sum") / n_tokens
                trainer.backward(part)
                loss = part.detach().double() if loss is None else loss + part.detach().double()
        trainer.clip()
        trainer.step()
        val = loss.item()
        ema = val if ema is None else 0.98 * ema + 0.02 * val
        history.append({"step": step, "loss": val})
        bar.set_postfix(loss=f"{ema:.3f}")
        if on_checkpoint is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < sched.steps:
            on_checkpoint(step + 1, trainer.optimizer)
    model.eval()
    return history
