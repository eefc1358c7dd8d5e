"""Token-level divergences between a student and a teacher language model.

All functions are pure functions of tensors. Logits have shape (B, T, V) (any leading shape
``(...)`` works the same way); per-token results have the leading shape (B, T).

Conventions
-----------
* ``p_S = softmax(student_logits / temperature)``, ``p_T = softmax(teacher_logits / temperature)``.
* ``"forward"`` is ``KL(p_T || p_S) = sum_v p_T(v) (log p_T(v) - log p_S(v))`` (mode-covering),
  ``"reverse"`` is ``KL(p_S || p_T) = sum_v p_S(v) (log p_S(v) - log p_T(v))`` (mode-seeking).
  Both are in nats and are summed over the full vocabulary at every position.
* Computation happens in float32 whatever the input dtype (bf16 / fp16 inputs are upcast; float64
  inputs stay float64), and log-probabilities always come from ``log_softmax``, so logits as
  large as +-1e4 give finite values and gradients. Logits are assumed finite.
* Positions where ``mask`` (bool, shape (B, T)) is False are exactly zero in the output and get
  zero gradient.
* Nothing is detached here: gradients flow into whichever of the two logit tensors requires
  grad. For distillation the caller passes teacher logits computed under ``torch.no_grad()`` (or
  calls ``.detach()``), so that only the student is trained.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .schema import DIRECTIONS, ESTIMATORS, LOSS_KINDS, SCORE_FUNCTION


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------


def _check_direction(direction: str, name: str = "direction") -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"{name} must be one of {DIRECTIONS}, got {direction!r}")


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")


def _check_logits(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> None:
    for name, t in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.dim() < 1 or t.shape[-1] == 0:
            raise ValueError(f"{name} must have shape (..., V) with V >= 1, got {tuple(t.shape)}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            "student_logits and teacher_logits must have the same shape, got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )


def _check_mask(mask: torch.Tensor | None, leading_shape: torch.Size, name: str = "mask") -> None:
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        what = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a bool tensor, got {what}")
    if mask.shape != leading_shape:
        raise ValueError(
            f"{name} must have shape {tuple(leading_shape)} (the logits without the vocabulary "
            f"dimension), got {tuple(mask.shape)}"
        )


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 when any input is float64 (lets gradcheck run in double)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _log_probs(logits: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    z = logits.to(dtype)
    if temperature != 1.0:
        z = z / temperature
    return F.log_softmax(z, dim=-1)


def _apply_mask(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return values
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def _kl_from_log_probs(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension from log-probabilities, shape (...)."""
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


# ---------------------------------------------------------------------------------------------
# full-vocabulary KL
# ---------------------------------------------------------------------------------------------


def token_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    direction: str,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-token KL divergence over the full vocabulary.

    Args:
        student_logits: (B, T, V) student logits, any floating dtype.
        teacher_logits: (B, T, V) teacher logits, same shape. Not detached here: detach them (or
            compute them under ``torch.no_grad()``) if only the student should get gradients.
        direction: ``"forward"`` for KL(p_T || p_S) or ``"reverse"`` for KL(p_S || p_T).
        mask: optional (B, T) bool; positions where it is False are exactly 0.
        temperature: divides both logits before the softmax (> 0).

    Returns:
        (B, T) float32 tensor (float64 for float64 inputs) of KL values in nats.

    Gradient w.r.t. the student logits z_S (temperature 1), per token:
    forward ``p_S - p_T``; reverse ``p_S * (log p_S - log p_T - KL)``.
    """
    _check_logits(student_logits, teacher_logits)
    _check_direction(direction)
    _check_mask(mask, student_logits.shape[:-1])
    _check_temperature(temperature)
    dtype = _compute_dtype(student_logits, teacher_logits)
    log_p_s = _log_probs(student_logits, temperature, dtype)
    log_p_t = _log_probs(teacher_logits, temperature, dtype)
    if direction == "forward":
        kl = _kl_from_log_probs(log_p_t, log_p_s)
    else:
        kl = _kl_from_log_probs(log_p_s, log_p_t)
    return _apply_mask(kl, mask)


def token_kls(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward, reverse) per-token KL, each exactly :func:`token_kl` of its direction, from one
    pair of log-softmaxes (a loop that logs both directions every step pays for two, not four).

    Args: as :func:`token_kl`, without ``direction``. Returns two (B, T) tensors:
    ``KL(p_T || p_S)`` and ``KL(p_S || p_T)``.
    """
    _check_logits(student_logits, teacher_logits)
    _check_mask(mask, student_logits.shape[:-1])
    _check_temperature(temperature)
    dtype = _compute_dtype(student_logits, teacher_logits)
    log_p_s = _log_probs(student_logits, temperature, dtype)
    log_p_t = _log_probs(teacher_logits, temperature, dtype)
    diff = log_p_t - log_p_s  # (B, T, V)
    forward = (log_p_t.exp() * diff).sum(dim=-1)
    reverse = -(log_p_s.exp() * diff).sum(dim=-1)
    return _apply_mask(forward, mask), _apply_mask(reverse, mask)


def _chunk_rows(n_rows: int, mask_flat: torch.Tensor | None, chunk_size: int):
    """Yield index tensors (or slices) of the rows to process, ``chunk_size`` rows at a time."""
    if mask_flat is None:
        for start in range(0, n_rows, chunk_size):
            yield slice(start, min(start + chunk_size, n_rows))
    else:
        rows = mask_flat.nonzero().squeeze(1)
        for start in range(0, rows.numel(), chunk_size):
            yield rows[start : start + chunk_size]


def _take(flat: torch.Tensor, rows) -> torch.Tensor:
    return flat[rows] if isinstance(rows, slice) else flat.index_select(0, rows)


def _put(dest: torch.Tensor, rows, values: torch.Tensor) -> None:
    if isinstance(rows, slice):
        dest[rows] = values
    else:
        dest.index_copy_(0, rows, values)


class _ChunkedTokenKL(torch.autograd.Function):
    """KL per row of (N, V) logits, chunk by chunk; backward recomputes each chunk.

    Only the input logits (already alive in the caller) and the mask are saved for backward, so
    no (N, V) float32 intermediate is kept between forward and backward.
    """

    @staticmethod
    def forward(ctx, student_flat, teacher_flat, mask_flat, direction, temperature, chunk_size):
        dtype = _compute_dtype(student_flat, teacher_flat)
        n_rows = student_flat.shape[0]
        out = torch.zeros(n_rows, dtype=dtype, device=student_flat.device)
        for rows in _chunk_rows(n_rows, mask_flat, chunk_size):
            log_p_s = _log_probs(_take(student_flat, rows), temperature, dtype)
            log_p_t = _log_probs(_take(teacher_flat, rows), temperature, dtype)
            if direction == "forward":
                kl = _kl_from_log_probs(log_p_t, log_p_s)
            else:
                kl = _kl_from_log_probs(log_p_s, log_p_t)
            _put(out, rows, kl)
        ctx.save_for_backward(student_flat, teacher_flat, mask_flat)
        ctx.direction = direction
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        student_flat, teacher_flat, mask_flat = ctx.saved_tensors
        need_s, need_t = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not (need_s or need_t):
            return None, None, None, None, None, None
        dtype = _compute_dtype(student_flat, teacher_flat)
        grad_s = torch.zeros_like(student_flat) if need_s else None
        grad_t = torch.zeros_like(teacher_flat) if need_t else None
        n_rows = student_flat.shape[0]
        for rows in _chunk_rows(n_rows, mask_flat, ctx.chunk_size):
            log_p_s = _log_probs(_take(student_flat, rows), ctx.temperature, dtype)
            log_p_t = _log_probs(_take(teacher_flat, rows), ctx.temperature, dtype)
            p_s, p_t = log_p_s.exp(), log_p_t.exp()
            # d/dz of logits/temperature contributes the 1/temperature factor.
            g = (_take(grad_out, rows).to(dtype) / ctx.temperature).unsqueeze(-1)
            # For KL(p || q) with p = softmax(a), q = softmax(b):
            #   dKL/db = q - p,   dKL/da = p * (log p - log q - KL).
            if ctx.direction == "forward":  # p = p_T, q = p_S
                if need_s:
                    _put(grad_s, rows, (g * (p_s - p_t)).to(grad_s.dtype))
                if need_t:
                    log_ratio = log_p_t - log_p_s
                    kl = (p_t * log_ratio).sum(-1, keepdim=True)
                    _put(grad_t, rows, (g * p_t * (log_ratio - kl)).to(grad_t.dtype))
            else:  # p = p_S, q = p_T
                if need_s:
                    log_ratio = log_p_s - log_p_t
                    kl = (p_s * log_ratio).sum(-1, keepdim=True)
                    _put(grad_s, rows, (g * p_s * (log_ratio - kl)).to(grad_s.dtype))
                if need_t:
                    _put(grad_t, rows, (g * (p_t - p_s)).to(grad_t.dtype))
        return grad_s, grad_t, None, None, None, None


def token_kl_chunked(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    direction: str,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 256,
) -> torch.Tensor:
    """Memory-lean :func:`token_kl`: same values and gradients, ``chunk_size`` tokens at a time.

    The (B, T) tokens are flattened to N = B*T rows and processed in chunks of ``chunk_size`` rows
    (only rows where ``mask`` is True are computed). A custom autograd function saves only the
    inputs and recomputes each chunk's softmaxes in backward, so the extra memory is
    O(chunk_size * V) float32 instead of several (N, V) float32 tensors; this matters at
    vocabularies such as V = 128,256. Gradients are returned in the dtype of each input and are
    not twice differentiable.

    Args/Returns: as :func:`token_kl`, plus ``chunk_size`` (int >= 1), the number of token rows
    per chunk.
    """
    _check_logits(student_logits, teacher_logits)
    _check_direction(direction)
    _check_mask(mask, student_logits.shape[:-1])
    _check_temperature(temperature)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    leading = student_logits.shape[:-1]
    vocab = student_logits.shape[-1]
    mask_flat = None if mask is None else mask.reshape(-1)
    out = _ChunkedTokenKL.apply(
        student_logits.reshape(-1, vocab),
        teacher_logits.reshape(-1, vocab),
        mask_flat,
        direction,
        float(temperature),
        chunk_size,
    )
    return out.reshape(leading)


# ---------------------------------------------------------------------------------------------
# generalised Jensen-Shannon divergence
# ---------------------------------------------------------------------------------------------


def _log_mix_ratio(x: torch.Tensor, w: float) -> torch.Tensor:
    """``log((1 - w) + w * exp(x))`` elementwise for ``0 < w < 1``, accurate also when tiny.

    Near 0 it is evaluated as ``log1p(w * expm1(x))`` (no cancellation, which matters when w -> 0
    or w -> 1); elsewhere as a logaddexp, which cannot overflow.
    """
    x_cap = 30.0
    y = w * torch.expm1(x.clamp(max=x_cap))
    near_zero = (y.abs() <= 0.5) & (x <= x_cap)
    small = torch.log1p(torch.where(near_zero, y, torch.zeros_like(y)))
    large = torch.logaddexp(x + math.log(w), x.new_tensor(math.log1p(-w)))
    return torch.where(near_zero, small, large)


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Scaled generalised Jensen-Shannon divergence that interpolates forward and reverse KL.

    With the mixture ``m = beta * p_T + (1 - beta) * p_S`` this returns, per token,

        JSD_beta = [beta * KL(p_T || m) + (1 - beta) * KL(p_S || m)] / (beta * (1 - beta)).

    The division by ``beta * (1 - beta)`` makes it continuous on [0, 1]: as beta -> 0,
    ``m -> p_S`` and ``KL(p_T || m) -> KL(p_T || p_S)`` while ``KL(p_S || m) = O(beta^2)``, so
    JSD_beta -> forward KL; symmetrically JSD_beta -> reverse KL ``KL(p_S || p_T)`` as beta -> 1.
    ``beta = 0`` and ``beta = 1`` return :func:`token_kl` forward / reverse exactly. At
    ``beta = 0.5`` it is 4x the usual symmetric JSD (and symmetric in student and teacher).

    Args:
        student_logits, teacher_logits: (B, T, V) logits (teacher not detached here).
        beta: mixture weight of the teacher, in [0, 1].
        mask: optional (B, T) bool; False positions are exactly 0.
        temperature: divides both logits (> 0).

    Returns:
        (B, T) float32 tensor (float64 for float64 inputs), nats.
    """
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")
    if beta == 0.0:
        return token_kl(student_logits, teacher_logits, "forward", mask, temperature)
    if beta == 1.0:
        return token_kl(student_logits, teacher_logits, "reverse", mask, temperature)
    _check_logits(student_logits, teacher_logits)
    _check_mask(mask, student_logits.shape[:-1])
    _check_temperature(temperature)
    beta = float(beta)
    dtype = _compute_dtype(student_logits, teacher_logits)
    log_p_s = _log_probs(student_logits, temperature, dtype)
    log_p_t = _log_probs(teacher_logits, temperature, dtype)
    # log(m / p_T) = log(beta + (1 - beta) p_S / p_T)
    # log(m / p_S) = log((1 - beta) + beta p_T / p_S)
    log_m_over_t = _log_mix_ratio(log_p_s - log_p_t, 1.0 - beta)
    log_m_over_s = _log_mix_ratio(log_p_t - log_p_s, beta)
    kl_t_m = -(log_p_t.exp() * log_m_over_t).sum(-1)
    kl_s_m = -(log_p_s.exp() * log_m_over_s).sum(-1)
    jsd = kl_t_m / (1.0 - beta) + kl_s_m / beta
    return _apply_mask(jsd, mask)


# ---------------------------------------------------------------------------------------------
# sampled (single-token) estimators
# ---------------------------------------------------------------------------------------------


def sampled_kl(
    student_logprobs_tok: torch.Tensor,
    teacher_logprobs_tok: torch.Tensor,
    estimator: str,
    direction: str,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Single-sample KL estimators (Schulman's k1, k2, k3) at the sampled tokens.

    To estimate ``KL(p || q)`` from tokens ``x ~ p``, let ``log r = log q(x) - log p(x)``:

    * ``k1 = -log r``: unbiased, high variance, can be negative;
    * ``k2 = (log r)^2 / 2``: biased (its mean is not the KL, noticeably so when p and q are far
      apart) but low variance, non-negative;
    * ``k3 = (r - 1) - log r``: unbiased (``E_p[r] = 1``) and non-negative, but grows like ``r``
      when q(x) >> p(x).

    The direction fixes which model must have produced the tokens:

    * ``"reverse"`` estimates KL(S || T): tokens MUST be sampled from the student (p = S, q = T);
    * ``"forward"`` estimates KL(T || S): tokens MUST be sampled from the teacher (p = T, q = S).

    With tokens from the wrong model the values are not estimates of the named KL.

    Gradients flow through both log-prob tensors. Note that differentiating these per-token values
    with the sampled tokens held fixed does not in general give an unbiased gradient of the
    estimated KL: for "reverse" with x ~ student, the expected student gradient is 0 for k1,
    grad KL(S || T) for k2 and grad KL(T || S) for k3.

    Args:
        student_logprobs_tok: (B, T) log p_S(x_t) of the sampled tokens.
        teacher_logprobs_tok: (B, T) log p_T(x_t) of the same tokens.
        estimator: "k1", "k2" or "k3".
        direction: "forward" or "reverse", the KL being estimated (see above).
        mask: optional (B, T) bool; False positions are exactly 0.

    Returns:
        (B, T) float32 tensor (float64 for float64 inputs), nats.
    """
    for name, t in (
        ("student_logprobs_tok", student_logprobs_tok),
        ("teacher_logprobs_tok", teacher_logprobs_tok),
    ):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a floating-point tensor, got {what}")
    if student_logprobs_tok.shape != teacher_logprobs_tok.shape:
        raise ValueError(
            "student_logprobs_tok and teacher_logprobs_tok must have the same shape, got "
            f"{tuple(student_logprobs_tok.shape)} and {tuple(teacher_logprobs_tok.shape)}"
        )
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    _check_direction(direction)
    _check_mask(mask, student_logprobs_tok.shape)
    dtype = _compute_dtype(student_logprobs_tok, teacher_logprobs_tok)
    log_s = student_logprobs_tok.to(dtype)
    log_t = teacher_logprobs_tok.to(dtype)
    # log r = log q(x) - log p(x), with p the sampling model.
    log_r = log_t - log_s if direction == "reverse" else log_s - log_t
    if estimator == "k1":
        values = -log_r
    elif estimator == "k2":
        values = 0.5 * log_r.square()
    else:
        values = torch.expm1(log_r) - log_r
    return _apply_mask(values, mask)


def draw_tokens(logits: torch.Tensor, generator: torch.Generator | None = None,
                temperature: float = 1.0) -> torch.Tensor:
    """One token per position drawn from ``softmax(logits / temperature)``.

    Args:
        logits: (B, T, V) logits (any leading shape); not differentiated through.
        generator: a ``torch.Generator`` on the logits' device (None: the global one).
        temperature: divides the logits (> 0).

    Returns:
        (B, T) int64 token ids.
    """
    _check_temperature(temperature)
    with torch.no_grad():
        probs = torch.softmax(logits.detach().to(_compute_dtype(logits)) / temperature, dim=-1)
        flat = probs.reshape(-1, probs.shape[-1])
        draws = torch.multinomial(flat, 1, generator=generator) if flat.shape[0] else \
            torch.zeros((0, 1), dtype=torch.long, device=flat.device)
    return draws.reshape(probs.shape[:-1])


def score_function_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    samples: torch.Tensor,
    direction: str,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The sampled KL of the paper: one extra token per position, a score-function surrogate.

    At every position t of the rollout a token ``x_t`` is drawn (by the caller, e.g.
    :func:`draw_tokens`) from the teacher for ``"forward"`` (``x ~ p_T``) or from the student for
    ``"reverse"`` (``x ~ p_S``), independently of the rollout's own token. With
    ``d(x) = log p_T(x) - log p_S(x)``:

    * forward, ``KL(p_T || p_S) = E_{x~p_T}[d(x)]``: the per-token value is ``d(x)`` (k1 on a
      teacher sample); its student gradient ``-grad log p_S(x)`` is an unbiased estimate of
      ``grad KL(p_T || p_S) = p_S - p_T`` (w.r.t. the student logits; the sampling law does not
      depend on the student).
    * reverse, ``KL(p_S || p_T) = E_{x~p_S}[-d(x)]``: the value is ``-d(x)``; since the sampling
      law is the student's, the gradient needs the score function:
      ``grad KL(p_S || p_T) = E_{x~p_S}[(log p_S(x) - log p_T(x)) grad log p_S(x)]`` (the term
      ``E[grad log p_S(x)]`` is 0). The returned tensor has the value ``-d(x)`` and the gradient of
      the surrogate ``stopgrad(-d(x)) * log p_S(x)`` (value + surrogate - stopgrad(surrogate)).

    Both values are unbiased estimates of the KL and both student gradients are unbiased
    estimates of the exact KL's gradient (tests/test_kl.py checks this by Monte Carlo). The
    teacher gets no gradient from the surrogate term; detach its logits as usual.

    Args:
        student_logits, teacher_logits: (B, T, V) logits, same shape.
        samples: (B, T) integer ids of the extra tokens (teacher samples for "forward", student
            samples for "reverse", both at ``temperature``).
        direction: "forward" or "reverse": the KL being estimated.
        mask: optional (B, T) bool; False positions are exactly 0 (value and gradient).
        temperature: divides both logits (> 0).

    Returns:
        (B, T) float32 tensor (float64 for float64 inputs), nats.
    """
    _check_logits(student_logits, teacher_logits)
    _check_direction(direction)
    _check_mask(mask, student_logits.shape[:-1])
    _check_temperature(temperature)
    _check_tokens(samples, student_logits, "samples")
    samples = samples.long()
    log_s = _token_log_probs(student_logits, samples, temperature)
    log_t = _token_log_probs(teacher_logits, samples, temperature)
    if direction == "forward":
        values = log_t - log_s
    else:
        values = log_s - log_t
        surrogate = values.detach() * log_s
        values = values + (surrogate - surrogate.detach())
    return _apply_mask(values, mask)


def _check_tokens(tokens: torch.Tensor | None, logits: torch.Tensor, name: str = "tokens") -> None:
    leading = logits.shape[:-1]
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"{name} (B, T) integer tensor is required, got {tokens!r}")
    if tokens.dtype in (torch.bool,) or tokens.is_floating_point() or tokens.is_complex():
        raise ValueError(f"{name} must be an integer tensor, got dtype {tokens.dtype}")
    if tokens.shape != leading:
        raise ValueError(f"{name} must have shape {tuple(leading)}, got {tuple(tokens.shape)}")
    vocab = logits.shape[-1]
    if tokens.numel():  # one host read for both ends (the step's only other read is its sums)
        lo, hi = torch.stack(torch.aminmax(tokens)).tolist()
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{name} must be ids in [0, {vocab}), got values in [{lo}, {hi}]")


def _token_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> torch.Tensor:
    """(B, T) log-probabilities of ``tokens`` under softmax(logits / temperature)."""
    z = logits.to(_compute_dtype(logits))
    if temperature != 1.0:
        z = z / temperature
    return z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def kl_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    kind: str,
    mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    beta: float | None = None,
    tokens: torch.Tensor | None = None,
    sample_direction: str | None = None,
    chunk_size: int | None = None,
    samples: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scalar distillation loss: masked mean over tokens of a per-token divergence.

    Args:
        student_logits, teacher_logits: (B, T, V) logits (detach the teacher yourself).
        kind: "forward" / "reverse" (full-vocabulary KL, :func:`token_kl`), "jsd"
            (:func:`generalized_jsd`, needs ``beta``), or "k1" / "k2" / "k3" (:func:`sampled_kl`,
            needs ``tokens`` and ``sample_direction``), or "sf" (:func:`score_function_kl`, the
            paper's sampled KL, needs ``samples`` and ``sample_direction``).
        mask: optional (B, T) bool of positions that count (response tokens).
        temperature: divides both logits (> 0).
        beta: teacher weight in [0, 1] for "jsd".
        tokens: (B, T) integer ids of the sampled tokens, for the sampled kinds.
        sample_direction: for the sampled kinds, the KL being estimated: "reverse" (KL(S||T),
            tokens drawn from the student) or "forward" (KL(T||S), tokens drawn from the teacher).
        chunk_size: if given, "forward"/"reverse" use :func:`token_kl_chunked` with this chunk size.
        samples: for "sf", (B, T) ids of the extra tokens, one per position, drawn from the teacher
            ("forward") or the student ("reverse") at ``temperature`` (:func:`draw_tokens`).

    Arguments that do not apply to ``kind`` are ignored.

    Returns:
        0-dim float32 tensor: sum of per-token values over masked-in positions divided by their
        number (all positions when ``mask`` is None); 0 when no position is masked in.
    """
    if kind not in LOSS_KINDS:
        raise ValueError(f"kind must be one of {LOSS_KINDS}, got {kind!r}")
    if kind in DIRECTIONS:
        if chunk_size is None:
            per_token = token_kl(student_logits, teacher_logits, kind, mask, temperature)
        else:
            per_token = token_kl_chunked(
                student_logits, teacher_logits, kind, mask, temperature, chunk_size
            )
    elif kind == "jsd":
        if beta is None:
            raise ValueError("beta is required for kind='jsd', got None")
        per_token = generalized_jsd(student_logits, teacher_logits, beta, mask, temperature)
    elif kind == SCORE_FUNCTION:
        if sample_direction is None:
            raise ValueError(f"sample_direction is required for kind={kind!r}, got None")
        _check_direction(sample_direction, "sample_direction")
        if samples is None:
            raise ValueError(f"samples (B, T) integer tensor is required for kind={kind!r}, got None")
        per_token = score_function_kl(student_logits, teacher_logits, samples, sample_direction, mask, temperature)
    else:
        _check_logits(student_logits, teacher_logits)
        _check_temperature(temperature)
        if sample_direction is None:
            raise ValueError(f"sample_direction is required for kind={kind!r}, got None")
        _check_direction(sample_direction, "sample_direction")
        if not isinstance(tokens, torch.Tensor):
            raise ValueError(
                f"tokens (B, T) integer tensor is required for kind={kind!r}, got {tokens!r}"
            )
        _check_tokens(tokens, student_logits)
        tokens = tokens.long()
        log_s = _token_log_probs(student_logits, tokens, temperature)
        log_t = _token_log_probs(teacher_logits, tokens, temperature)
        per_token = sampled_kl(log_s, log_t, kind, sample_direction, mask)
    if mask is None:
        return per_token.mean() if per_token.numel() else per_token.sum()
    count = mask.sum().clamp(min=1).to(per_token.dtype)
    return per_token.sum() / count
