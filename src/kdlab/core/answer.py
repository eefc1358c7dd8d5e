"""What each KL direction does where the student must change its mind: the diagnosis of reverse KL.

At a response position, with ``p_S = softmax(z_S)`` and ``p_T = softmax(z_T)`` (logits already
divided by their temperatures) and ``a`` the teacher's token there (``argmax p_T``), the
gradients of the per-position KL with respect to the student's logits are, in closed form:

* forward ``KL(p_T || p_S)``: ``dKL/dz_v = p_S(v) - p_T(v)``; at ``a``: ``p_S(a) - p_T(a)``, about
  ``-p_T(a)`` when the student puts no mass on ``a``: a strong pull towards the teacher's token;
* reverse ``KL(p_S || p_T)``: ``dKL/dz_v = p_S(v) (log p_S(v) - log p_T(v) - KL(p_S || p_T))``; at
  ``a`` it carries the factor ``p_S(a)``, so it vanishes as the student's mass on the teacher's
  token does (the paper's mechanism: mode seeking does not find a mode the student ignores).

Two sets of positions are measured:

* **contested** positions (``contested``): inside the response, where the student's most likely
  token is not the teacher's. On the multiple-choice tasks these are the facts of the trace the
  student gets wrong (a hop's entity, a rule's output), which decide the answer;
* the **answer** position (``answer_positions``): the token right after the row's last answer mark
  ("#"). On kb-mc and rules-mc the answer after the mark repeats the trace's last value, so that
  position is decided before it is reached; it is kept as the literal "answer position".

``position_stats`` sums, over the positions given, the student's and the teacher's mass on ``a``,
the L2 norm (over the vocabulary) of each direction's gradient, and each gradient's component at
``a`` (the descent direction on ``z_a`` is its negative), as one float64 tensor that the training
loop reads with its loss (no host read of its own). Pure functions of tensors; shapes in the
docstrings. They materialise (B, T, V) float32 softmaxes: meant for small vocabularies (kdlab's
character models); the training loop records them only there.
"""
from __future__ import annotations

import torch

STATS = ("positions", "p_student", "p_teacher", "grad_reverse", "grad_forward", "grad_reverse_at_a",
         "grad_forward_at_a")  # the sums position_stats returns, in order


def answer_positions(tokens: torch.Tensor, mask: torch.Tensor, mark_id: int) -> torch.Tensor:
    """(B, T) float 0/1: per row of ``tokens`` (B, T) a one at the first token after the row's last
    ``mark_id`` when that token is inside ``mask`` (B, T, bool); rows without one are all zero."""
    B, T = tokens.shape
    mask = mask.bool()
    cols = torch.arange(T, device=tokens.device).expand(B, T)
    last = torch.where((tokens == mark_id) & mask, cols, torch.full_like(cols, -1)).amax(dim=1, keepdim=True)  # (B, 1)
    return ((cols == last + 1) & (last >= 0) & mask).float()


def contested(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float 0/1: the positions inside ``mask`` (B, T) where the student's most likely token
    (``argmax z_S``) is not the teacher's (``argmax z_T``); logits (B, T, V)."""
    return ((student_logits.argmax(-1) != teacher_logits.argmax(-1)) & mask.bool()).float()


def position_stats(student_logits: torch.Tensor, teacher_logits: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Sums over the positions ``where`` (B, T, 0/1) of the quantities ``STATS`` names, a float64
    tensor (7,): the number of positions, then p_S(a), p_T(a), ||dKL_rev/dz_S||_2,
    ||dKL_fwd/dz_S||_2, dKL_rev/dz_S(a) and dKL_fwd/dz_S(a), with a = argmax p_T at each position.
    Logits (B, T, V), already divided by their temperatures; computed in float32 (float64 stays
    float64), under no gradient, without a host read."""
    with torch.no_grad():
        dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
        log_s, log_t = student_logits.to(dtype).log_softmax(-1), teacher_logits.to(dtype).log_softmax(-1)  # (B, T, V)
        p_s, p_t = log_s.exp(), log_t.exp()
        a = p_t.argmax(-1, keepdim=True)  # (B, T, 1) the teacher's token
        rkl = (p_s * (log_s - log_t)).sum(-1, keepdim=True)  # (B, T, 1)
        g_rev = p_s * (log_s - log_t - rkl)  # (B, T, V)
        g_fwd = p_s - p_t  # (B, T, V)
        per = torch.stack([torch.ones_like(rkl.squeeze(-1)), p_s.gather(-1, a).squeeze(-1), p_t.gather(-1, a).squeeze(-1),
                           g_rev.norm(dim=-1), g_fwd.norm(dim=-1),
                           g_rev.gather(-1, a).squeeze(-1), g_fwd.gather(-1, a).squeeze(-1)], dim=-1)  # (B, T, 7)
        w = where.to(per.device).double().unsqueeze(-1)  # (B, T, 1)
        return (per.double() * w).sum(dim=(0, 1))  # (7,)
