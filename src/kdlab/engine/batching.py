"""Turning token lists into padded batches, and the forward pass over prompt + response.

Layout used everywhere: prompts LEFT-padded to a common width P, responses RIGHT-padded to a
common width R, so that the response starts at column P for every row. Position ids skip the
left padding, so a row's logits do not depend on how much padding it got.
"""
from __future__ import annotations

import functools
import inspect

import torch

from ..models.tokenizer import PAD_ID


@functools.lru_cache(maxsize=None)
def _forward_keeps_logits(forward_cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(forward_cls.forward).parameters


def _keeps_logits(model: torch.nn.Module) -> bool:
    """True when ``model``'s forward can compute the logits of its last positions only
    (Hugging Face causal LMs: ``logits_to_keep``)."""
    return _forward_keeps_logits(type(model))


def pad_left(seqs: list[list[int]], pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) long ids and (B, P) bool mask, left-padded with ``pad_id`` (kdlab's <pad> by default)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = True
    return ids, mask


def pad_right(seqs: list[list[int]], width: int | None = None, pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, R) long ids and (B, R) bool mask, right-padded with ``pad_id`` (kdlab's <pad> by default)."""
    width = max(1, max(len(s) for s in seqs)) if width is None else width
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        s = s[:width]
        if s:
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, :len(s)] = True
    return ids, mask


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, L) that count only real tokens (0 for left padding)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def response_logits(model: torch.nn.Module, prompt: torch.Tensor, prompt_mask: torch.Tensor,
                    response: torch.Tensor, response_mask: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """Logits that predict each response token: (B, R, V), V cut to ``vocab_size`` when given
    (embedding rows beyond the tokenizer never enter a KL).

    prompt (B, P) left-padded, response (B, R) right-padded, on any device (moved to the
    model's). Row b's logit at response column r is the model's next-token distribution after
    prompt_b + response_b[:r].
    """
    device = next(model.parameters()).device
    prompt, prompt_mask = prompt.to(device), prompt_mask.to(device)
    response, response_mask = response.to(device), response_mask.to(device)
    # The last response token predicts nothing we need (and, the model being causal, changes no
    # earlier logit), so it is not fed: P + R - 1 positions.
    ids = torch.cat([prompt, response[:, :-1]], dim=1)  # (B, P+R-1)
    # Keep padding inside the response attendable-but-irrelevant: masked positions never feed a
    # kept position because padding only follows a row's last real token.
    mask = torch.cat([prompt_mask, torch.ones_like(response_mask[:, :-1])], dim=1)
    R = response.shape[1]
    # Only the last R positions' logits are needed: the LM head (a fifth of a 135M model's weights
    # at V = 49,152) and its (B, L, V) output then skip the prompt positions.
    keep = {"logits_to_keep": R} if _keeps_logits(model) else {}
    out = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask), use_cache=False, **keep)
    logits = out.logits[:, -R:]  # (B, R, V): positions P-1 .. P+R-2
    return logits if vocab_size is None or vocab_size >= logits.shape[-1] else logits[..., :vocab_size]


def output_head(model: torch.nn.Module, vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The causal LM's output projection: (V, d) weight and (V,) bias or None, V cut to
    ``vocab_size`` when given, as ``response_logits`` cuts the logits."""
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    if vocab_size is not None and vocab_size < weight.shape[0]:
        weight, bias = weight[:vocab_size], None if bias is None else bias[:vocab_size]
    return weight, bias


def response_hidden(model: torch.nn.Module, prompt: torch.Tensor, prompt_mask: torch.Tensor,
                    response: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The last hidden states (after the final norm) that predict each response token: (B, R, d),
    aligned as ``response_logits`` (whose logits are ``output_head``'s projection of these), without
    running the LM head: what ``kdlab.core.head_kl`` needs of a teacher."""
    device = next(model.parameters()).device
    prompt, prompt_mask = prompt.to(device), prompt_mask.to(device)
    response, response_mask = response.to(device), response_mask.to(device)
    ids = torch.cat([prompt, response[:, :-1]], dim=1)  # (B, P+R-1), as response_logits
    mask = torch.cat([prompt_mask, torch.ones_like(response_mask[:, :-1])], dim=1)
    out = model.get_decoder()(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask), use_cache=False)
    return out.last_hidden_state[:, -response.shape[1]:]  # (B, R, d)
