"""Synthetic results tables with known, planted effects: for tests and for trying the notebooks.

The defaults plant the paper's directions (STUDY.md findings), so every test of
``kdlab.analysis.findings`` that the table can support comes out "reproduced"; tests flip one
effect at a time and check that the matching verdict flips. Nothing here is a measurement.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass
class SyntheticEffects:
    """Planted effects (accuracy-like metrics are fractions in [0, 1]).

    forward_accuracy: forward-KL accuracy everywhere; reverse_low / reverse_high: reverse-KL
    accuracy at the low / high lr (before the lambda slope); reverse_lambda_slope: reverse accuracy
    gain per unit lambda at the low lr (student-side rollouts help); policy_accuracy: OnPD minus
    OffPD accuracy shift (all configs); forgetting_low / forgetting_high: mean probe change;
    policy_forgetting: OnPD minus OffPD forgetting; sparsity_low / sparsity_high; off_sparsity_gain:
    OffPD minus OnPD sparsity; coverage_gap: pass@10 - pass@1 for (forward, reverse);
    variant_base / variant_slope: harder-variant accuracy = base + slope * (lambda + 1);
    noise: seed SD of every metric; reverse_high_noise: extra seed SD of reverse at the high lr;
    noclip_reverse_drop: reverse accuracy lost without gradient clipping.
    """

    forward_accuracy: float = 0.72
    reverse_low: float = 0.62
    reverse_high: float = 0.45
    reverse_lambda_slope: float = 0.08
    policy_accuracy: float = 0.0
    forgetting_low: float = -0.005
    forgetting_high: float = -0.12
    policy_forgetting: float = 0.0
    sparsity_low: float = 0.87
    sparsity_high: float = 0.56
    off_sparsity_gain: float = 0.01
    coverage_gap: tuple[float, float] = (0.15, 0.05)
    variant_base: float = 0.20
    variant_slope: float = 0.06
    noise: float = 0.01
    reverse_high_noise: float = 0.08
    noclip_reverse_drop: float = 0.10
    probes: tuple[str, ...] = field(default=("arith", "copy", "sort"))


def synthetic_results(effects: SyntheticEffects | None = None, *, tasks: tuple[str, ...] = ("countdown-3",),
                      lrs: tuple[float, float] = (1e-4, 5e-4), seeds: tuple[int, ...] = (0, 1, 2),
                      lambdas: tuple[float, ...] = (-0.5, 0.0, 0.5), variants: tuple[str, ...] = ("countdown-4e",),
                      robustness: bool = False, rng_seed: int = 0) -> pd.DataFrame:
    """A results table shaped like the runner's, with the planted ``effects``.

    Rows: every task x {off, on} x {forward, reverse} x lrs x seeds (grad_clip 1.0), plus lambda
    runs at ``lambdas`` for the first task, plus with ``robustness`` the same off/on grid without
    clipping (grad_clip NaN) and with the sampled estimator "k3" (``sampled_direction`` forward
    and reverse). Each seed shares one random offset across the configs of a task (seeds are
    paired, as real seeds share data order and initial noise).
    """
    e = effects or SyntheticEffects()
    rng = np.random.default_rng(rng_seed)
    lo, hi = float(min(lrs)), float(max(lrs))
    rows = []

    def add(task: str, policy: str, lam: float, kl: str, lr: float, seed: int, grad_clip: float,
            sampled_direction: str | None = None) -> None:
        high = lr == hi
        direction = sampled_direction or kl
        if direction == "forward":
            acc = e.forward_accuracy
        else:
            acc = e.reverse_high if high else e.reverse_low + e.reverse_lambda_slope * lam
        acc += e.policy_accuracy * (1.0 if policy == "on" else 0.0)
        if direction == "reverse" and np.isnan(grad_clip):
            acc -= e.noclip_reverse_drop
        sd = e.noise + (e.reverse_high_noise if (direction == "reverse" and high) else 0.0)
        seed_shift = seed_offsets[(task, seed)]
        acc = float(np.clip(acc + seed_shift + rng.normal(0, sd), 0, 1))
        gap = e.coverage_gap[0] if direction == "forward" else e.coverage_gap[1]
        p1 = float(np.clip(acc + rng.normal(0, e.noise / 2), 0, 1))
        p10 = float(np.clip(p1 + gap + rng.normal(0, e.noise / 2), 0, 1))
        forg = (e.forgetting_high if high else e.forgetting_low) + e.policy_forgetting * (1.0 if policy == "on" else 0.0)
        forg_by_probe = {p: forg + rng.normal(0, e.noise) for p in e.probes}
        forg = float(np.mean(list(forg_by_probe.values())))
        sp = (e.sparsity_high if high else e.sparsity_low) + (e.off_sparsity_gain if policy == "off" else 0.0)
        sp = float(np.clip(sp + rng.normal(0, e.noise / 4), 0, 1))
        row = {"task": task, "policy": policy, "lam": lam, "kl": kl, "lr": lr, "seed": seed, "dtype": "bf16",
               "grad_clip": grad_clip, "accuracy": acc, "base_accuracy": 0.3, "pass_at_1": p1, "pass_at_10": p10,
               "forgetting": forg, "sparsity": sp,
               "collapsed": bool(direction == "reverse" and high and acc < 0.2), "wall_s": float(rng.uniform(50, 70))}
        if sampled_direction is not None:
            row["sampled_direction"] = sampled_direction
        for p, f in forg_by_probe.items():
            row[f"probe_{p}"] = float(np.clip(0.8 + f, 0, 1))
            row[f"forgetting_{p}"] = float(f)
        if task.startswith("countdown"):
            for v in variants:
                if v != task:
                    row[f"{v}_accuracy"] = float(np.clip(e.variant_base + e.variant_slope * (lam + 1)
                                                         + rng.normal(0, e.noise), 0, 1))
        rows.append(row)

    seed_offsets = {(t, s): float(rng.normal(0, e.noise)) for t in tasks for s in seeds}
    for task in tasks:
        for policy, lam in (("off", -1.0), ("on", 1.0)):
            for kl in ("forward", "reverse"):
                for lr in lrs:
                    for seed in seeds:
                        add(task, policy, lam, kl, float(lr), seed, 1.0)
                        if robustness:
                            add(task, policy, lam, kl, float(lr), seed, float("nan"))
                            add(task, policy, lam, "k3", float(lr), seed, 1.0, sampled_direction=kl)
    for lam in lambdas:
        for kl in ("forward", "reverse"):
            for lr in lrs:
                for seed in seeds:
                    add(tasks[0], "lambda", float(lam), kl, float(lr), seed, 1.0)
    return pd.DataFrame(rows)
