"""What each KL direction does at the answer position: the diagnosis of reverse KL on one-token answers.

A completion is a trace, ``ANSWER_MARK`` ("#"), then the answer; on the multiple-choice tasks the
token right after the mark decides it. At that position, with ``p_S = softmax(z_S)`` and
``p_T = softmax(z_T)`` (logits already divided by their temperatures) and ``a`` the teacher's answer
token (``argmax p_T``), the gradients of the per-position KL with respect to the student's logits
are, in closed form:

* forward ``KL(p_T || p_S)``: ``dKL/dz_v = p_S(v) - p_T(v)``; at ``a``: ``p_S(a) - p_T(a)``, about
  ``-p_T(a)`` when the student puts no mass on ``a``: a strong pull towards the teacher's answer;
* reverse ``KL(p_S || p_T)``: ``dKL/dz_v = p_S(v) (log p_S(v) - log p_T(v) - KL(p_S || p_T))``; at
  ``a`` it carries the factor ``p_S(a)``, so it vanishes as the student's mass on the teacher's
  answer does (the paper's mechanism: mode seeking cannot find a mode it does not sample).

``answer_positions`` finds the position per row; ``answer_stats`` sums, over the rows that have
one, the student's and the teacher's mass on ``a``, the L2 norm (over the vocabulary) of each
direction's gradient and each gradient's component at ``a`` (the descent direction on ``z_a`` is
its negative), as one float64 tensor the training loop reads with its loss. Pure functions of
tensors; shapes in the docstrings.
"""
from __future__ import annotations

import torch

STATS = ("answer_rows", "answer_p_student", "answer_p_teacher", "answer_grad_reverse", "answer_grad_forward",
         "answer_grad_reverse_at_a", "answer_grad_forward_at_a")  # the sums answer_stats returns, in order


def answer_positions(tokens: torch.Tensor, mask: torch.Tensor, mark_id: int) -> torch.Tensor:
    """(B,) long: per row of ``tokens`` (B, T) the index of the first token after the row's last
    ``mark_id`` when that token is inside ``mask`` (B, T, bool), else -1."""
    B, T = tokens.shape
    cols = torch.arange(T, device=tokens.device).expand(B, T)
    is_mark = (tokens == mark_id) & mask.bool()
    last = torch.where(is_mark, cols, torch.full_like(cols, -1)).amax(dim=1)  # (B,)
    pos = last + 1
    inside = (last >= 0) & (pos < T)
    ok = inside & mask.bool().gather(1, pos.clamp(max=T - 1).unsqueeze(1)).squeeze(1)
    return torch.where(ok, pos, torch.full_like(pos, -1))


def answer_stats(student_logits: torch.Tensor, teacher_logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Sums over the rows with an answer position (``positions`` (B,) >= 0, from ``answer_positions``)
    of the quantities ``STATS`` names, as a float64 tensor (7,): the number of such rows, then per row
    p_S(a), p_T(a), ||dKL_rev/dz_S||_2, ||dKL_fwd/dz_S||_2, dKL_rev/dz_S(a) and dKL_fwd/dz_S(a) at its
    answer position, with a = argmax p_T there. Logits (B, T, V), already divided by their
    temperatures; computed in float32 (float64 stays float64), under no gradient."""
    with torch.no_grad():
        B = positions.shape[0]
        keep = positions >= 0  # (B,); gathered at a clamped index and weighted (no host sync)
        at = (torch.arange(B, device=positions.device), positions.clamp(min=0))
        dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
        z_s = student_logits[at].to(dtype)  # (B, V)
        z_t = teacher_logits[at].to(dtype)  # (B, V)
        log_s, log_t = z_s.log_softmax(-1), z_t.log_softmax(-1)
        p_s, p_t = log_s.exp(), log_t.exp()
        a = p_t.argmax(-1, keepdim=True)  # (B, 1) the teacher's answer token
        rkl = (p_s * (log_s - log_t)).sum(-1, keepdim=True)  # (B, 1)
        g_rev = p_s * (log_s - log_t - rkl)  # (B, V)
        g_fwd = p_s - p_t  # (B, V)
        per_row = torch.stack([torch.ones_like(rkl.squeeze(1)), p_s.gather(1, a).squeeze(1), p_t.gather(1, a).squeeze(1),
                               g_rev.norm(dim=-1), g_fwd.norm(dim=-1),
                               g_rev.gather(1, a).squeeze(1), g_fwd.gather(1, a).squeeze(1)], dim=1)  # (B, 7)
        return (per_row.double() * keep.to(per_row.device).double().unsqueeze(1)).sum(0)  # (7,)
