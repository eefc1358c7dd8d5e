"""Batched sampling under the lambda-mixture rollout policy pi_lambda, with KV caches.

lam = +1 samples from the student alone (OnPD), lam = -1 from the teacher alone (OffPD), and
anything else steps both models together and samples from ``mixture_logprobs``. The teacher may
see a different prompt from the student (the style experiment); the sampled response tokens are
shared. Sequences stop at </s>; tokens after it are <pad> and masked out.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .batching import pad_left, positions
from .mixture import mixture_logprobs
from .tokenizer import EOS_ID, PAD_ID


@dataclass
class Rollout:
    """Sampled responses. tokens/mask: (B, R); mask is True up to and including </s>.
    entropy: (B, R) float32 entropy (nats) of the sampling distribution at each step."""

    tokens: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    def token_lists(self) -> list[list[int]]:
        return [row[: int(n)].tolist() for row, n in zip(self.tokens, self.lengths)]


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.x names the KV-cache argument ``cache``; earlier ones ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Stepper:
    """One model with its own prompt and KV cache, fed one shared token per step."""

    def __init__(self, model: torch.nn.Module, prompts: list[list[int]], pad_id: int = PAD_ID):
        self.model = model
        self.kw = _cache_kwarg(model)
        ids, mask = pad_left(prompts, pad_id)
        self.mask = mask
        out = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask), use_cache=True)
        self.cache = getattr(out, self.kw)
        self.last = out.logits[:, -1].float()  # (B, V)
        self.next_pos = mask.sum(-1, keepdim=True)  # (B, 1)

    def feed(self, tok: torch.Tensor) -> None:  # tok (B,)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask.long(), position_ids=self.next_pos,
                         use_cache=True, **{self.kw: self.cache})
        self.cache = getattr(out, self.kw)
        self.last = out.logits[:, -1].float()
        self.next_pos = self.next_pos + 1


@torch.no_grad()
def sample(student: torch.nn.Module | None, student_prompts: list[list[int]], max_new_tokens: int, *,
           lam: float = 1.0, teacher: torch.nn.Module | None = None, teacher_prompts: list[list[int]] | None = None,
           temperature: float = 1.0, greedy: bool = False, logratio_clip: float | None = None,
           plausibility_alpha: float | None = None, generator: torch.Generator | None = None,
           pad_id: int = PAD_ID, eos_id: int | Sequence[int] = EOS_ID) -> Rollout:
    """Sample one response per prompt under pi_lambda.

    ``student_prompts`` / ``teacher_prompts`` are token-id lists (with <s>); teacher prompts
    default to the student's. ``greedy`` takes the argmax of pi_lambda. Temperature divides
    both models' logits before they are mixed. ``pad_id`` fills prompt padding and the columns
    after a row's stop; ``eos_id`` is the stop id, or several (real tokenizers: see
    ``kdlab.hf.pad_id_of`` / ``kdlab.hf.stop_ids``); defaults are kdlab's char tokenizer's.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature must be > 0 (or use greedy=True), got {temperature}")
    need_s, need_t = lam != -1.0, lam != 1.0
    if need_s and student is None:
        raise ValueError("lam != -1 needs a student model")
    if need_t and teacher is None:
        raise ValueError(f"lam={lam} needs a teacher model")
    if teacher_prompts is None:
        teacher_prompts = student_prompts
    if len(teacher_prompts) != len(student_prompts):
        raise ValueError("teacher_prompts and student_prompts differ in length")
    steppers = {}
    stops = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), dtype=torch.long)
    if stops.numel() == 0:
        raise ValueError("eos_id must name at least one stop id, got an empty sequence")
    if need_s:
        steppers["s"] = _Stepper(student, student_prompts, pad_id)
    if need_t:
        steppers["t"] = _Stepper(teacher, teacher_prompts, pad_id)
    B = len(student_prompts)
    done = torch.zeros(B, dtype=torch.bool)
    toks, ents, alive = [], [], []
    temp = 1.0 if greedy else temperature
    for step in range(max_new_tokens):
        if not need_t:
            logp = torch.log_softmax(steppers["s"].last / temp, -1)
        elif not need_s:
            logp = torch.log_softmax(steppers["t"].last / temp, -1)
        else:
            logp = mixture_logprobs(steppers["s"].last / temp, steppers["t"].last / temp, lam,
                                    logratio_clip=logratio_clip, plausibility_alpha=plausibility_alpha)
        bad = ~torch.isfinite(logp).any(-1)  # a diverged (NaN) model: end its sequences
        if bool(bad.any()):
            logp = torch.nan_to_num(logp, nan=-math.inf)
            logp[bad] = -math.inf
            logp[bad, int(stops[0])] = 0.0
        p = logp.exp()
        ent = -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)
        if greedy:
            tok = logp.argmax(-1)
        else:
            tok = torch.multinomial(p, 1, generator=generator).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        alive.append(~done)
        toks.append(tok)
        ents.append(torch.where(done, torch.zeros_like(ent), ent))
        done = done | torch.isin(tok, stops)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        for st in steppers.values():
            st.feed(tok)
    tokens = torch.stack(toks, 1)  # (B, R)
    mask = torch.stack(alive, 1)  # sampled tokens up to and including the first </s>
    return Rollout(tokens=tokens, mask=mask, entropy=torch.stack(ents, 1))
