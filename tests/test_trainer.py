"""kdlab.engine.trainer: the one optimiser set-up and schedule of the three training loops."""
from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from kdlab.engine.sft import SFTSchedule, lr_at as sft_lr_at, sft_trainer
from kdlab.engine.trainer import Trainer, cosine_lr_at, lr_at, make_adamw

SRC = Path(__file__).resolve().parents[1] / "src" / "kdlab"


def _old_sft_lr(step: int, lr: float, warmup: int, steps: int, min_lr_ratio: float) -> float:
    """SFT's schedule as kdlab wrote it before the trainer (kdlab/train.py lr_at)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def _old_distill_lr(step: int, lr: float, warmup: int) -> float:
    return lr * min(1.0, (step + 1) / warmup) if warmup else lr


@pytest.mark.parametrize("lr,warmup,steps,ratio", [(3e-3, 100, 2000, 0.1), (1e-3, 4, 12, 0.1), (2e-4, 0, 50, 0.0),
                                                   (5e-4, 10, 10, 0.1), (1e-2, 3, 1, 0.25)])
def test_sft_schedule_keeps_its_exact_values(lr, warmup, steps, ratio):
    """Bit for bit the schedule the shipped models were trained with, over the whole run."""
    sched = SFTSchedule(steps=steps, batch_size=1, lr=lr, warmup=warmup, min_lr_ratio=ratio)
    for step in range(steps + 1):
        assert sft_lr_at(step, sched) == _old_sft_lr(step, lr, warmup, steps, ratio), step


def test_sft_decay_is_transformers_cosine_with_min_rate():
    """After the warm-up the rate is transformers' cosine-with-minimum schedule, exactly."""
    lr, warmup, steps, ratio = 3e-3, 100, 2000, 0.1
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, steps, min_lr_rate=ratio)
    for step in range(warmup, steps + 1):
        assert cosine_lr_at(step, lr, warmup, steps, ratio) == lr * sched.lr_lambdas[0](step)


@pytest.mark.parametrize("warmup", [0, 1, 10])
def test_constant_schedule_is_transformers_warmup_one_step_on(warmup):
    lr = 1e-5
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = get_constant_schedule_with_warmup(opt, warmup)
    for step in range(40):
        assert lr_at(step, lr, warmup) == _old_distill_lr(step, lr, warmup) == lr * sched.lr_lambdas[0](step + 1)


def test_trainer_steps_like_a_hand_written_loop():
    """zero_grad, backward, clip, step on a Trainer = the same calls on AdamW by hand."""
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 4)
    trainer = Trainer(a.parameters(), 1e-2, weight_decay=0.01, warmup=2, grad_clip=0.5)
    opt = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
    for step in range(4):
        trainer.set_lr(step)
        trainer.zero_grad()
        trainer.backward(a(x).pow(2).mean(), 0.5)
        na = trainer.clip()
        trainer.step()
        for g in opt.param_groups:
            g["lr"] = 1e-2 * min(1.0, (step + 1) / 2)
        opt.zero_grad()
        (b(x).pow(2).mean() * 0.5).backward()
        nb = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.5)
        opt.step()
        assert torch.equal(na, nb)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert trainer.params_finite() and trainer.name == "adamw"
    with torch.no_grad():
        next(a.parameters())[0, 0] = float("nan")
    assert not trainer.params_finite()


def test_sft_trainer_is_adamw_098_with_clip_one():
    model = torch.nn.Linear(2, 2)
    t = sft_trainer(model, SFTSchedule(steps=10, batch_size=1, lr=1e-3, warmup=2))
    assert t.optimizer.defaults["betas"] == (0.9, 0.98) and t.grad_clip == 1.0 and t.schedule == "cosine"
    assert make_adamw(list(model.parameters()), 1e-3, 0.0, False)[0].defaults["betas"] == (0.9, 0.999)
    with pytest.raises(ValueError, match="schedule"):
        Trainer(model.parameters(), 1e-3, schedule="linear")


def test_one_optimiser_set_up_in_the_package():
    """AdamW is constructed in ``kdlab.engine.trainer`` only; no loop clips or steps by hand."""
    makers = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("AdamW", "clip_grad_norm_"):
                makers.append((path.relative_to(SRC).as_posix(), node.attr))
    assert {p for p, _ in makers} == {"engine/trainer.py"}, makers
