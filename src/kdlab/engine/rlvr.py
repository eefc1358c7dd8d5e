"""RLVR follow-up: GRPO with a verifiable reward (the task's verifier), started from any checkpoint.

One GRPO step: draw ``prompts_per_step`` problems, sample ``group_size`` responses per problem from
the current policy (``kdlab.engine.rollout.sample`` with lam = +1, i.e. student only; the ``codec``,
``kdlab.models.codec``, renders the prompts and decodes the responses, so a toy model and a real Hugging
Face checkpoint train the same way, as in distillation), score each with
``task.score`` (0/1 for countdown), turn rewards into per-group normalised advantages, and take
``inner_epochs`` AdamW steps on the PPO-style clipped objective (optionally with a k3 KL penalty
to the frozen starting model). There is no value network and no learned reward.

Conventions (all documented where they are used):

* log-probabilities are those of the *sampling* distribution, softmax(logits / temperature), so the
  importance ratio of the first inner epoch is exactly 1;
* advantages use the population standard deviation of each group (see ``group_advantages``);
* the loss averages tokens within each sequence, then sequences within the batch (see
  ``grpo_loss``; ``normalisation="token"`` gives the global token mean instead).
"""
from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from .batching import pad_left, response_logits
from ..models.codec import CHAR
from .data import ProblemPool
from ..core.dtypes import DTYPES
from .trainer import Arithmetic, Trainer, compute_dtype_of
from ..core.kl import sampled_kl
from .rollout import sample
from .run_config import NORMALISATIONS, GRPOSettings, RLVRConfig  # noqa: F401 (RLVRConfig: GRPO's config)
from ..tasks.base import Problem, Task



# ---------------------------------------------------------------------------------------------
# advantages, rewards and the clipped objective
# ---------------------------------------------------------------------------------------------
def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, normalise_std: bool = True) -> torch.Tensor:
    """Per-prompt group-normalised advantages.

    Args:
        rewards: (P, G) float rewards, P prompts with G sampled responses each.
        eps: added to the standard deviation (> 0 keeps all-equal groups finite).
        normalise_std: divide by ``std + eps`` (GRPO); False leaves ``r - mean`` (Dr. GRPO).

    Returns:
        (P, G) float32 (float64 for float64 input): ``(r - mean_g r) / (std_g r + eps)``.

    The standard deviation is the *population* one (divide by G, not G - 1): a group of one
    response, or a group whose rewards are all equal, then gets advantage exactly 0 instead of
    NaN, and the normalised advantages of a group have unit mean square up to ``eps``.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2:
        what = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a (P, G) tensor, got {what}")
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(f"rewards must have P >= 1 and G >= 1, got shape {tuple(rewards.shape)}")
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps > 0):
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    r = rewards.to(torch.promote_types(torch.float32, rewards.dtype))
    centred = r - r.mean(dim=1, keepdim=True)
    if not normalise_std:
        return centred
    std = r.std(dim=1, unbiased=False, keepdim=True)
    return centred / (std + eps)


def verifiable_rewards(task: Task, problems: list[Problem], completions: list[str]) -> torch.Tensor:
    """(N,) float32 rewards ``task.score(problem, completion)`` for matching lists."""
    if len(problems) != len(completions):
        raise ValueError(f"problems and completions differ in length: {len(problems)} != {len(completions)}")
    return torch.tensor([float(task.score(p, c)) for p, c in zip(problems, completions)], dtype=torch.float32)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(B, R) float32 log-probabilities of ``tokens`` (B, R) under softmax(logits (B, R, V) / temperature)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    return z.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


STAT_KEYS = ("clip_frac", "ratio_mean", "kl")  # grpo_loss's stats, in the order grpo_train reads them


def flat_batch(advantages: torch.Tensor, cfg: RLVRConfig) -> bool:
    """Whether a step's batch has no gradient at all: every advantage (P*G,) is exactly zero (each
    group's rewards were equal), there is no KL term, and one inner epoch (whose stats are then
    known exactly: ratio 1, nothing clipped, loss 0). Its gradient is then exactly zero, so the
    forward and backward can be skipped and the optimiser stepped on zeros, which leaves the
    parameters and the optimiser's moments bitwise as the full step would (AdamW still decays its
    moments and moves by them). ``advantages`` lives on the host: no device read."""
    return cfg.kl_coef == 0 and cfg.inner_epochs == 1 and not bool(advantages.any())


def zero_gradient_step(trainer: Trainer) -> tuple[float, dict[str, float], float]:
    """One optimiser step on exact-zero gradients (a :func:`flat_batch`): every parameter gets a
    zero gradient (AdamW skips a parameter without one, which the full step would not), no clipping
    is needed (norm 0). Returns what the full step would log: loss 0, clip_frac 0, ratio_mean 1,
    kl 0, grad norm 0."""
    trainer.zero_grad()
    for p in trainer.params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    trainer.step()
    return 0.0, {"clip_frac": 0.0, "ratio_mean": 1.0, "kl": 0.0}, 0.0


def grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip_eps: float = 0.2, kl_coef: float = 0.0, logp_ref: torch.Tensor | None = None,
              normalisation: str = "sequence") -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss (to minimise) on one batch of sampled responses.

    Per token t of response b, with ``ratio = exp(logp_new - logp_old)`` and ``A = advantages[b]``:

        objective_bt = min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A)
        loss_bt      = -objective_bt + kl_coef * k3_bt

    where ``k3_bt = (q/p - 1) - log(q/p)``, ``p = exp(logp_new)``, ``q = exp(logp_ref)``, is
    ``kdlab.core.kl.sampled_kl(logp_new, logp_ref, "k3", "reverse")``: an estimate of KL(policy || ref)
    from tokens the policy sampled (exact for the first inner epoch, where sampler = policy).
    Differentiated with the tokens fixed, its expected gradient is that of KL(ref || policy)
    (see ``sampled_kl``), the usual GRPO penalty.

    Normalisation (``normalisation``): ``"sequence"`` (default, the GRPO paper) averages loss_bt
    over each response's masked tokens, then averages responses with at least one token;
    ``"token"`` divides the sum over all masked tokens of the batch by their count (DAPO), so
    longer responses weigh more.

    Args:
        logp_new: (B, R) log-probs of the sampled tokens under the policy being trained (with grad).
        logp_old: (B, R) log-probs under the policy that sampled them (treated as constants).
        advantages: (B,) one advantage per response (constants).
        mask: (B, R) bool, True on response tokens (up to and including the stop token).
        clip_eps: PPO clip range (> 0).
        kl_coef: weight of the KL penalty (>= 0); > 0 needs ``logp_ref``.
        logp_ref: (B, R) log-probs under the frozen reference model (constants).

    Returns:
        (loss, stats): loss is a 0-dim tensor; stats has ``clip_frac`` (share of masked tokens where
        the clipped branch is taken, i.e. its gradient is zero), ``ratio_mean`` and ``kl`` (mean k3
        over masked tokens; 0 when no reference is given), all 0-dim float tensors on the loss's
        device: nothing here reads the device (the caller reads loss and stats once, together).
    """
    if logp_new.dim() != 2:
        raise ValueError(f"logp_new must be (B, R), got shape {tuple(logp_new.shape)}")
    B, R = logp_new.shape
    if logp_old.shape != (B, R):
        raise ValueError(f"logp_old must have shape {(B, R)}, got {tuple(logp_old.shape)}")
    if mask.shape != (B, R) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor of shape {(B, R)}, got {mask.dtype} {tuple(mask.shape)}")
    if advantages.shape != (B,):
        raise ValueError(f"advantages must have shape {(B,)}, got {tuple(advantages.shape)}")
    if not clip_eps > 0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps!r}")
    if not kl_coef >= 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
    if kl_coef > 0 and logp_ref is None:
        raise ValueError(f"kl_coef={kl_coef} needs logp_ref (the reference model's log-probs)")
    if logp_ref is not None and logp_ref.shape != (B, R):
        raise ValueError(f"logp_ref must have shape {(B, R)}, got {tuple(logp_ref.shape)}")
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")

    logp_new = logp_new.float()
    adv = advantages.detach().float().unsqueeze(1)  # (B, 1)
    ratio = torch.exp(logp_new - logp_old.detach().float())  # (B, R)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_tok = None
    if logp_ref is not None:
        kl_tok = sampled_kl(logp_new, logp_ref.detach().float(), "k3", "reverse", mask)
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl_tok
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    n_tok = mask.sum(dim=1)  # (B,)
    if normalisation == "sequence":
        has = n_tok > 0
        seq = per_token.sum(dim=1) / n_tok.clamp(min=1)
        # the mean over responses with a token, written without a host read: (B,) weights 0 / 1;
        # no such response gives 0 (every per_token entry is masked to 0), as the empty mean would
        loss = (seq * has).sum() / has.sum().clamp(min=1)
    else:
        loss = per_token.sum() / n_tok.sum().clamp(min=1)

    with torch.no_grad():
        total = mask.sum().clamp(min=1)
        # The clipped branch is the minimum (and carries no gradient) exactly when the ratio left
        # the range on the side the advantage pushes it towards.
        is_clipped = ((adv > 0) & (ratio > 1.0 + clip_eps)) | ((adv < 0) & (ratio < 1.0 - clip_eps))
        stats = {
            "clip_frac": (is_clipped & mask).sum() / total,
            "ratio_mean": (ratio * mask).sum() / total,
            "kl": kl_tok.sum() / total if kl_tok is not None else torch.zeros((), device=ratio.device),
        }
    return loss, stats


# ---------------------------------------------------------------------------------------------
# collapse detection
# ---------------------------------------------------------------------------------------------
def detect_collapse(history: list[dict[str, Any]], window: int, drop: float,
                    key: str = "reward_mean") -> tuple[bool, int | None]:
    """Whether (and at which step) a run's reward collapsed.

    The reward moving average ``ma_t`` is the mean of ``history[i][key]`` over the trailing
    ``window`` entries (defined once ``window`` entries exist). A collapse starts at entry ``s``
    when ``ma`` stays more than ``drop`` (absolute) below its running maximum (the max of ``ma``
    up to that entry) for ``window`` consecutive entries ``s .. s+window-1``. An entry with a
    non-finite reward, loss or grad norm, or with ``"nan": True`` (``grpo_train`` marks a run
    stopped on non-finite parameters so), is a collapse at its own entry if none came before.

    Returns:
        (collapsed, step): ``step`` is the ``"step"`` field of the first collapsed entry (its
        index when there is no such field), or None.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not drop >= 0:
        raise ValueError(f"drop must be a non-negative number, got {drop!r}")

    def step_of(i: int) -> int:
        return int(history[i].get("step", i))

    nan_at = None
    for i, h in enumerate(history):
        if h.get("nan") or any(h.get(k) is not None and not math.isfinite(float(h[k]))
                               for k in (key, "loss", "grad_norm")):
            nan_at = i
            break
    rewards = [float(h[key]) for h in (history if nan_at is None else history[:nan_at])]
    best = -math.inf
    run_start, run_len = None, 0
    for i in range(window - 1, len(rewards)):
        ma = sum(rewards[i - window + 1: i + 1]) / window
        best = max(best, ma)
        if ma < best - drop:
            if run_len == 0:
                run_start = i
            run_len += 1
            if run_len >= window:
                return True, step_of(run_start)
        else:
            run_len = 0
    if nan_at is not None:
        return True, step_of(nan_at)
    return False, None


# ---------------------------------------------------------------------------------------------
# training loop
# ---------------------------------------------------------------------------------------------
def _sequence_logprobs(model: torch.nn.Module, prompts: torch.Tensor, prompt_mask: torch.Tensor,
                       tokens: torch.Tensor, mask: torch.Tensor, temperature: float,
                       vocab_size: int | None = None) -> torch.Tensor:
    """(B, R) float32 log-probs of the sampled ``tokens`` (B, R) after left-padded ``prompts``
    (B, P), over the first ``vocab_size`` logits (the codec's: embedding rows beyond the tokenizer
    are never sampled)."""
    logits = response_logits(model, prompts, prompt_mask, tokens, mask, vocab_size)  # (B, R, V)
    return token_logprobs(logits, tokens, temperature)


def grpo_train(model: torch.nn.Module, task: Task, cfg: RLVRConfig, pool: ProblemPool,
               eval_fn: Callable[[torch.nn.Module], float] | None = None, eval_every: int = 0,
               progress: bool = True, desc: str = "grpo", codec=CHAR,
               reference: torch.nn.Module | None = None) -> dict[str, Any]:
    """Train ``model`` in place (cast to ``cfg.dtype``) with GRPO on ``task``'s verifier.

    The KL penalty (``cfg.kl_coef`` > 0) is to a frozen copy of the starting model, or with
    ``cfg.kl_reference == "teacher"`` to ``reference`` (the task's teacher, sharing the codec's
    vocabulary; moved in place to the compute dtype and the model's device, and frozen): the
    k3 estimate of KL(policy || teacher) on the policy's own samples.

    ``codec`` (``kdlab.models.codec``) renders prompts, pads, stops and decodes, for sampling, the loss
    and evaluation alike (default: kdlab's char tokenizer; ``HFCodec`` for a real checkpoint).

    ``pool`` supplies training problems; ``eval_fn(model)`` (optional; e.g. greedy pass@1 on held-out
    problems, ``kdlab.evaluation.evaluate.accuracy``) scores the model before training and after every ``eval_every`` steps
    and the last one (``eval_every`` 0: only before and after). Never raises on divergence: a
    non-finite loss, gradient or parameter stops the run and marks it collapsed.

    Returns a dict with ``history`` (one entry per step: ``step``, ``reward_mean``,
    ``reward_std``, ``solved_groups`` (share of groups with at least one reward > 0),
    ``zero_adv_groups`` (share of groups whose rewards are all equal: no policy gradient),
    ``length`` (mean response tokens incl. the stop token), ``loss``, ``clip_frac``, ``ratio_mean``, ``kl``,
    ``grad_norm`` (before clipping, last inner epoch), ``accuracy`` (None when not evaluated
    at that step) and ``collapsed`` (the collapse detector on the history so far)),
    ``initial_accuracy`` / ``final_accuracy`` (None without ``eval_fn``), ``collapsed``,
    ``collapse_step``, ``nan`` (the run stopped on a non-finite value), ``wall_s``, ``phase_s``
    (rollout / update / eval seconds) and ``config``.
    """
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0, got {eval_every!r}")
    t_start = time.perf_counter()
    phase = {"rollout": 0.0, "update": 0.0, "eval": 0.0}
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model.to(DTYPES[cfg.dtype])
    # the parameters, the optimizer and the update in cfg.dtype; sampling, the log-probs, the
    # backward and the evaluation in the compute dtype (``work``: fp32 on a CPU by default, a copy
    # reloaded from the parameters after every update), as in distillation
    arith = Arithmetic(model, compute_dtype_of(cfg, next(model.parameters()).device), 1)
    work = arith.model
    # sampling draws on the model's device: a CPU generator would copy each token's (B, V)
    # probabilities to the host (the same stream as before on a CPU)
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(cfg.seed)
    max_new = cfg.max_new_tokens or task.max_new_tokens
    ref = None
    if cfg.kl_coef > 0:
        if cfg.kl_reference == "teacher":
            if reference is None:
                raise ValueError("kl_reference 'teacher' needs the teacher model (reference=)")
            w = next(work.parameters())
            ref = reference.to(device=w.device, dtype=w.dtype).eval()
        else:
            ref = copy.deepcopy(work).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
    trainer = Trainer(model.parameters(), cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip)

    def evaluate() -> float | None:
        if eval_fn is None:
            return None
        t0 = time.perf_counter()
        acc = eval_fn(work)
        phase["eval"] += time.perf_counter() - t0
        return acc

    initial_accuracy = evaluate()
    history: list[dict[str, Any]] = []
    flat_steps = 0  # steps whose every group had equal rewards (see flat_batch)
    collapsed, collapse_step, nan_stop = False, None, False
    P, G = cfg.prompts_per_step, cfg.group_size
    bar = tqdm(range(cfg.steps), desc=desc, disable=not progress, leave=False)
    for step in bar:
        t0 = time.perf_counter()
        problems = pool.sample(P, rng)
        group_problems = [p for p in problems for _ in range(G)]  # row i*G + g: problem i, sample g
        prompts = [codec.prompt(p.prompt) for p in group_problems]
        work.eval()
        ro = sample(work, prompts, max_new, lam=1.0, temperature=cfg.temperature, generator=gen, codec=codec)
        texts = [codec.decode(row) for row in ro.token_lists()]
        rewards = verifiable_rewards(task, group_problems, texts).view(P, G)
        device = next(model.parameters()).device  # the rollout comes back on the CPU
        adv_host = group_advantages(rewards, normalise_std=cfg.normalise_std).reshape(P * G)  # (P*G,) on the host
        t1 = time.perf_counter()

        loss_val, stats, gnorm = float("nan"), {}, float("nan")
        trainer.set_lr(step)  # constant: GRPO has no warm-up
        flat = flat_batch(adv_host, cfg)
        if flat:  # no policy gradient: the optimiser steps on exact zeros, no forward or backward
            loss_val, stats, gnorm = zero_gradient_step(trainer)
            arith.pull()
            flat_steps += 1
        else:
            adv = adv_host.to(device)
            sp, spm = pad_left(prompts, codec.pad_id)
            tokens, mask = ro.tokens.to(device), ro.mask.to(device)
            with torch.no_grad():
                logp_ref = (_sequence_logprobs(ref, sp, spm, tokens, mask, cfg.temperature, codec.vocab_size)
                            if ref is not None else None)
            work.train()
        logp_old = None
        for _epoch in range(0 if flat else cfg.inner_epochs):
            logp_new = _sequence_logprobs(work, sp, spm, tokens, mask, cfg.temperature, codec.vocab_size)
            if logp_old is None:  # the sampling policy: ratio exactly 1 on the first epoch
                logp_old = logp_new.detach()
            loss, stats = grpo_loss(logp_new, logp_old, adv, mask, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef,
                                    logp_ref=logp_ref, normalisation=cfg.normalisation)
            trainer.zero_grad()
            trainer.backward(loss)
            arith.push()
            gnorm_t = trainer.clip()
            # the epoch's one host read: loss, its stats and the gradient norm together (a
            # non-finite loss or gradient stops the run before the optimiser steps)
            loss_val, *vals, gnorm = torch.stack([loss.detach().float(), *(stats[k].float() for k in STAT_KEYS),
                                                  gnorm_t.detach().float().to(loss.device)]).tolist()
            stats = dict(zip(STAT_KEYS, vals))
            if not (math.isfinite(loss_val) and math.isfinite(gnorm)):
                nan_stop = True
                trainer.zero_grad()
                break
            trainer.step()
            arith.pull()
        work.eval()
        model.eval()
        if not nan_stop and not trainer.params_finite():
            nan_stop = True
        t2 = time.perf_counter()
        phase["rollout"] += t1 - t0
        phase["update"] += t2 - t1

        entry: dict[str, Any] = {
            "step": step,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "solved_groups": float((rewards.amax(dim=1) > 0).float().mean()),
            "zero_adv_groups": float((rewards.amax(dim=1) == rewards.amin(dim=1)).float().mean()),
            "length": float(ro.mask.sum(dim=1).float().mean()),  # the rollout's mask is on the host
            "loss": loss_val,
            "clip_frac": stats.get("clip_frac", float("nan")),
            "ratio_mean": stats.get("ratio_mean", float("nan")),
            "kl": stats.get("kl", float("nan")),
            "grad_norm": gnorm,
            "accuracy": None,
        }
        if nan_stop:
            entry["nan"] = True
        elif (eval_every and (step + 1) % eval_every == 0) or step == cfg.steps - 1:
            entry["accuracy"] = evaluate()
        history.append(entry)
        hit, at = detect_collapse(history, cfg.collapse_window, cfg.collapse_drop)
        entry["collapsed"] = hit
        if hit and not collapsed:
            collapsed, collapse_step = True, at
        if nan_stop:
            break
        bar.set_postfix(reward=f"{entry['reward_mean']:.3f}")
    final_accuracy = history[-1]["accuracy"] if history and history[-1]["accuracy"] is not None else None
    if nan_stop:
        final_accuracy = None
    return {
        "history": history,
        "initial_accuracy": initial_accuracy,
        "final_accuracy": final_accuracy,
        "collapsed": collapsed,
        "collapse_step": collapse_step,
        "nan": nan_stop,
        "wall_s": time.perf_counter() - t_start,
        "phase_s": phase,
        "flat_steps": flat_steps,
        "config": asdict(cfg),
    }
