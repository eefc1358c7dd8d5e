"""Token-level KL from the teacher's last hidden states and its head, never its (N, V) logits.

A teacher's logits are ``z_T = h_T W^T + b`` with hidden states ``h_T`` (N, d) and head ``W``
(V, d): at d = 960 (SmolLM2-360M) against V = 49,152 the hidden states are 51x smaller than the
logits, and at V = 128,256 (Llama 3) with d = 2048 63x. ``token_kl_from_hidden`` computes the exact
full-vocabulary KL between the student's logits and ``softmax(z_T / tau_T)`` chunk by chunk of
token rows: each chunk's teacher logits are made from its hidden states, used and dropped, in
the forward pass and again in the backward pass (recomputed, not saved). The extra memory is
O(chunk_size x V) instead of the (N, V) teacher logits a caller of
``kdlab.core.kl.token_kl_chunked`` must hold. Values and gradients (with respect to the student's
logits; the teacher is frozen) equal ``token_kl`` on the materialised logits.

Pure functions of tensors, as ``kdlab.core.kl`` (whose conventions hold: nats, float32 arithmetic
for low-precision inputs, masked rows exactly zero with zero gradient).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .kl import (_check_direction, _check_mask, _check_temperature, _chunk_rows, _compute_dtype, _kl_from_log_probs,
                 _log_probs, _put, _take)


def _teacher_log_probs(hidden: torch.Tensor, head: torch.Tensor, bias: torch.Tensor | None, rows,
                       temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """log softmax((h[rows] W^T + b) / tau) in ``dtype``: (c, V) for the chunk's c rows."""
    h = _take(hidden, rows)  # (c, d)
    z = h.to(head.dtype) @ head.T  # (c, V), in the head's dtype as the teacher's own forward
    if bias is not None:
        z = z + bias
    return _log_probs(z, temperature, dtype)


class _HiddenTokenKL(torch.autograd.Function):
    """KL per row between (N, V) student logits and the teacher logits of (N, d) hidden states."""

    @staticmethod
    def forward(ctx, student_flat, hidden, head, bias, mask_flat, direction, s_temp, t_temp, chunk_size):
        dtype = _compute_dtype(student_flat, head)
        out = torch.zeros(student_flat.shape[0], dtype=dtype, device=student_flat.device)
        with torch.no_grad():
            for rows in _chunk_rows(student_flat.shape[0], mask_flat, chunk_size):
                log_p_s = _log_probs(_take(student_flat, rows), s_temp, dtype)
                log_p_t = _teacher_log_probs(hidden, head, bias, rows, t_temp, dtype)
                kl = _kl_from_log_probs(log_p_t, log_p_s) if direction == "forward" else _kl_from_log_probs(log_p_s, log_p_t)
                _put(out, rows, kl)
        ctx.save_for_backward(student_flat, hidden, head, bias, mask_flat)
        ctx.args = (direction, s_temp, t_temp, chunk_size)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        student_flat, hidden, head, bias, mask_flat = ctx.saved_tensors
        direction, s_temp, t_temp, chunk_size = ctx.args
        if not ctx.needs_input_grad[0]:
            return (None,) * 9
        dtype = _compute_dtype(student_flat, head)
        grad_s = torch.zeros_like(student_flat)
        for rows in _chunk_rows(student_flat.shape[0], mask_flat, chunk_size):
            log_p_s = _log_probs(_take(student_flat, rows), s_temp, dtype)
            log_p_t = _teacher_log_probs(hidden, head, bias, rows, t_temp, dtype)
            p_s = log_p_s.exp()
            g = (_take(grad_out, rows).to(dtype) / s_temp).unsqueeze(-1)  # d(z / tau_S)/dz = 1 / tau_S
            if direction == "forward":  # d KL(p_T || p_S) / d(z_S / tau_S) = p_S - p_T
                grad = g * (p_s - log_p_t.exp())
            else:  # d KL(p_S || p_T) / d(z_S / tau_S) = p_S (log p_S - log p_T - KL)
                log_ratio = log_p_s - log_p_t
                grad = g * p_s * (log_ratio - (p_s * log_ratio).sum(-1, keepdim=True))
            _put(grad_s, rows, grad.to(grad_s.dtype))
        return grad_s, None, None, None, None, None, None, None, None


def token_kl_from_hidden(student_logits: torch.Tensor, teacher_hidden: torch.Tensor, teacher_head: torch.Tensor,
                         direction: str, mask: torch.Tensor | None = None, teacher_bias: torch.Tensor | None = None,
                         student_temperature: float = 1.0, teacher_temperature: float = 1.0,
                         chunk_size: int = 256) -> torch.Tensor:
    """Per-token ``KL`` of ``direction`` between ``softmax(student_logits / tau_S)`` and
    ``softmax((teacher_hidden @ teacher_head.T + teacher_bias) / tau_T)``, ``chunk_size`` token rows
    at a time, without materialising the teacher's logits.

    Args:
        student_logits: (B, T, V), requires grad for training.
        teacher_hidden: (B, T, d) the teacher's last hidden states (after its final norm).
        teacher_head: (V, d) the teacher's output projection; ``teacher_bias`` (V,) or None.
        direction: "forward" (KL(p_T || p_S)) or "reverse" (KL(p_S || p_T)).
        mask: (B, T) bool or None; False rows are zero and get zero gradient (and are not computed).
        student_temperature, teacher_temperature: each side's logit divisor (> 0).
        chunk_size: token rows per chunk (int >= 1).
    Returns: (B, T) KL in nats (float32 for low-precision inputs), differentiable in
    ``student_logits`` only (the teacher's tensors get no gradient; not twice differentiable).
    """
    _check_direction(direction)
    _check_temperature(student_temperature)
    _check_temperature(teacher_temperature)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    *lead, V = student_logits.shape
    if teacher_hidden.shape[:-1] != tuple(lead):
        raise ValueError(f"teacher_hidden {tuple(teacher_hidden.shape)} must be {tuple(lead)} + (d,) "
                         f"for student_logits {tuple(student_logits.shape)}")
    if teacher_head.dim() != 2 or teacher_head.shape != (V, teacher_hidden.shape[-1]):
        raise ValueError(f"teacher_head {tuple(teacher_head.shape)} must be (V, d) = ({V}, {teacher_hidden.shape[-1]})")
    if teacher_bias is not None and teacher_bias.shape != (V,):
        raise ValueError(f"teacher_bias {tuple(teacher_bias.shape)} must be ({V},)")
    _check_mask(mask, student_logits.shape[:-1])
    out = _HiddenTokenKL.apply(student_logits.reshape(-1, V), teacher_hidden.reshape(-1, teacher_hidden.shape[-1]).detach(),
                               teacher_head.detach(), None if teacher_bias is None else teacher_bias.detach(),
                               None if mask is None else mask.reshape(-1), direction, float(student_temperature),
                               float(teacher_temperature), chunk_size)
    return out.reshape(lead)
