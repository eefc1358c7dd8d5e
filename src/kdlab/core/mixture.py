"""The lambda spectrum of rollout policies between teacher and student.

``log pi_lambda(v) ∝ ((1 + lam) / 2) log p_S(v) + ((1 - lam) / 2) log p_T(v)``, renormalised over
the vocabulary: lam = -1 is the teacher (off-policy), lam = +1 the student (on-policy), lam = 0
the normalised geometric mean, and |lam| > 1 extrapolates beyond either model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def mixture_logprobs(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    lam: float,
    logratio_clip: float | None = None,
    plausibility_alpha: float | None = None,
) -> torch.Tensor:
    """Next-token log-probabilities of the mixture rollout policy pi_lambda.

    With ``a = (1 + lam) / 2`` (so ``1 - a = (1 - lam) / 2``) the unnormalised log-probability is
    ``a log p_S + (1 - a) log p_T = log p_T + a (log p_S - log p_T)``, then a log-softmax over the
    vocabulary normalises it. Computation is in float32 whatever the input dtype (float64 stays
    float64) and uses ``log_softmax`` throughout, so finite logits as large as +-1e4 are fine.

    Safeguards for extrapolation (applied for every lam strictly between the endpoints, in
    this order):

    * ``logratio_clip = c > 0``: use ``log p_T + a * clamp(log p_S - log p_T, -c, c)``, which is
      the formula above wherever the log-ratio lies in [-c, c]; the log-ratio's effect on any
      token is thus at most ``|a| c`` nats relative to the teacher.
    * ``plausibility_alpha = alpha in (0, 1]``: tokens with ``p_S(v) < alpha * max p_S`` AND
      ``p_T(v) < alpha * max p_T`` get probability 0 (log-prob -inf); a token plausible under at
      least one model survives, so each model's argmax always survives.

    ``lam = -1`` and ``lam = 1`` are the pure policies: they return exactly
    ``log_softmax(teacher_logits)`` / ``log_softmax(student_logits)`` (in float32) and the
    safeguards are not applied, so that lam = +-1 reproduce off- and on-policy sampling exactly.

    Args:
        student_logits: (..., V) student next-token logits, any floating dtype.
        teacher_logits: (..., V) teacher logits, same shape and vocabulary.
        lam: position on the spectrum (any finite number).
        logratio_clip: optional positive bound c on the log-ratio (nats).
        plausibility_alpha: optional alpha in (0, 1].

    Returns:
        (..., V) float32 log-probabilities of pi_lambda (logsumexp over V is 0; -inf on tokens
        removed by the plausibility mask).
    """
    for name, t in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a floating-point tensor, got {what}")
        if t.dim() < 1 or t.shape[-1] == 0:
            raise ValueError(f"{name} must have shape (..., V) with V >= 1, got {tuple(t.shape)}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            "student_logits and teacher_logits must have the same shape, got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )
    lam = _check_number("lam", lam)
    if logratio_clip is not None:
        logratio_clip = _check_number("logratio_clip", logratio_clip)
        if logratio_clip <= 0:
            raise ValueError(f"logratio_clip must be > 0, got {logratio_clip!r}")
    if plausibility_alpha is not None:
        plausibility_alpha = _check_number("plausibility_alpha", plausibility_alpha)
        if not 0.0 < plausibility_alpha <= 1.0:
            raise ValueError(f"plausibility_alpha must be in (0, 1], got {plausibility_alpha!r}")

    dtype = torch.promote_types(
        torch.promote_types(torch.float32, student_logits.dtype), teacher_logits.dtype
    )
    log_p_s = F.log_softmax(student_logits.to(dtype), dim=-1)
    log_p_t = F.log_softmax(teacher_logits.to(dtype), dim=-1)
    if lam == 1.0:
        return log_p_s
    if lam == -1.0:
        return log_p_t

    a = (1.0 + lam) / 2.0
    log_ratio = log_p_s - log_p_t
    if logratio_clip is not None:
        log_ratio = log_ratio.clamp(-logratio_clip, logratio_clip)
    scores = log_p_t + a * log_ratio
    if plausibility_alpha is not None:
        log_alpha = math.log(plausibility_alpha)
        plausible = (log_p_s >= log_p_s.amax(dim=-1, keepdim=True) + log_alpha) | (
            log_p_t >= log_p_t.amax(dim=-1, keepdim=True) + log_alpha
        )
        scores = scores.masked_fill(~plausible, float("-inf"))
    return F.log_softmax(scores, dim=-1)
