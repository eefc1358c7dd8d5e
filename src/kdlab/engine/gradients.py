"""KL gradients on real rollouts, and an empirical check of the update bound (STUDY.md finding 6).

Vocabulary: a *policy* is pi_lambda (``kdlab.core.mixture``; lambda = -1 teacher / OffPD, +1 student /
OnPD); a *sample set* is N responses drawn from one policy (``samples_per_prompt`` per prompt).
Every response position is scored over the full vocabulary, as in training.

Per-token logit gradients (student logits z_S, temperature 1):

* forward KL(p_T || p_S): ``p_S - p_T``: every entry lies in [-1, 1] and the L2 norm of a
  token's gradient is at most sqrt(2);
* reverse KL(p_S || p_T): ``p_S (log p_S - log p_T - KL(p_S || p_T))``: unbounded (it grows with
  the log-ratio where the student puts mass the teacher does not).

The update bound. Let ``L(x) = sum_t KL_t(x)`` be a response's summed per-token KL and
``G(x)`` its gradient. The expected update under policy a is ``u_a = E_{x ~ P_a}[G(x)]``, with
P_a the distribution of whole responses under pi_a. Then
``||u_a - u_b|| = ||sum_x (P_a(x) - P_b(x)) G(x)|| <= 2 TV(P_a, P_b) sup_x ||G(x)||``. In the
*functional* (logit) view, where each visited prefix has its own logit vector (a student with an
identity Jacobian; a real student adds a factor bounded by its logit Jacobian), each coordinate
of ``G(x)`` is one token's logit-gradient entry, so for forward KL
``max_coord |u_a - u_b| <= 2 TV`` with no model-dependent constant. Reverse KL has no such
constant. TV between whole-response distributions also bounds TV between the prefix
distributions at every length (marginalising can only shrink TV).

Estimators (all from one sample set x_1..x_N ~ P_a, no second sampling):

* importance ratios ``w_i = P_b(x_i) / P_a(x_i)`` from the sequence log-probabilities under
  pi_a and pi_b (:func:`sequence_logprobs`; the same temperature, log-ratio clip and
  plausibility mask as the sampler), self-normalised: ``w~_i = w_i / mean(w)``;
* ``TV ~= 0.5 * mean_i |1 - w~_i|`` (used for the bound; see :func:`tv_distance`, which also
  returns the unbiased bounded estimate ``mean_i max(0, 1 - w_i)`` as a check);
* ``u_a - u_b ~= mean_i (1 - w~_i) G(x_i)``, for which ``max_coord |.| <= 2 TV_hat max|entry|``
  holds sample by sample, so forward points lie under the line ``2 TV_hat`` exactly while
  reverse points can cross it whenever reverse entries exceed 1.

Sample counts: ``len(prompts) * samples_per_prompt`` responses per lambda_a (one sample set per
lambda_a, reused for every lambda_b). Long responses make whole-response distributions of
different policies nearly disjoint (TV -> 1) and the ratios heavy-tailed (watch ``ess``), so
short responses (``max_new_tokens`` ~ 4-16) give the most informative picture.

The parameter-space distance ``|| mean_i (1 - w~_i) grad_theta L(x_i) ||_2`` is reported too,
with the constant ``max_i ||grad_theta L(x_i)||`` measured on the samples (the a-priori constant
would need the student's logit-Jacobian norm, which is not estimated).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .batching import pad_left, response_logits
from ..core.kl import token_kl
from ..core.mixture import mixture_logprobs
from .rollout import sample
from ..models.codec import CHAR

from ..core.schema import DIRECTIONS
from ..models.toy import build_model


@dataclass
class PolicySamples:
    """One sample set from pi_lambda with everything the analysis needs (no gradients kept).

    prompt_index: (B,) long, which prompt each row answers; prompts / prompt_mask (B, P) and
    teacher_prompts / teacher_prompt_mask (B, P') left-padded; tokens / mask (B, R) right-padded
    responses (mask True up to and including </s>); student_logits / teacher_logits (B, R, V)
    float32, the logits that predict each response token.
    """

    lam: float
    prompt_index: torch.Tensor
    prompts: torch.Tensor
    prompt_mask: torch.Tensor
    teacher_prompts: torch.Tensor
    teacher_prompt_mask: torch.Tensor
    tokens: torch.Tensor
    mask: torch.Tensor
    student_logits: torch.Tensor
    teacher_logits: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])


def _check_prompts(prompts: list[list[int]], name: str) -> None:
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, list) and p for p in prompts):
        raise ValueError(f"{name} must be a non-empty list of non-empty token-id lists, got {prompts!r:.80}")


@torch.no_grad()
def sample_policy(student: torch.nn.Module, teacher: torch.nn.Module, prompts: list[list[int]], lam: float,
                  samples_per_prompt: int, max_new_tokens: int, *, teacher_prompts: list[list[int]] | None = None,
                  temperature: float = 1.0, logratio_clip: float | None = None,
                  plausibility_alpha: float | None = None, seed: int = 0, codec=None) -> PolicySamples:
    """Draw ``samples_per_prompt`` responses per prompt from pi_lambda and score them with both models.
    ``codec`` (``kdlab.models.codec``): pad / stop ids and vocabulary of real tokenizers (default: kdlab's).

    Sampling is ``kdlab.engine.rollout.sample`` (seeded by ``seed``); then both models are run over
    prompt + response to get the (B, R, V) logits at every response position, B = len(prompts) *
    samples_per_prompt.
    """
    _check_prompts(prompts, "prompts")
    if teacher_prompts is None:
        teacher_prompts = prompts
    _check_prompts(teacher_prompts, "teacher_prompts")
    if len(teacher_prompts) != len(prompts):
        raise ValueError(f"teacher_prompts has {len(teacher_prompts)} prompts, prompts has {len(prompts)}")
    if isinstance(samples_per_prompt, bool) or not isinstance(samples_per_prompt, int) or samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be an int >= 1, got {samples_per_prompt!r}")
    index = [i for i in range(len(prompts)) for _ in range(samples_per_prompt)]
    s_prompts = [prompts[i] for i in index]
    t_prompts = [teacher_prompts[i] for i in index]
    gen = torch.Generator(device=next(student.parameters()).device).manual_seed(seed)
    student.eval()
    teacher.eval()
    codec = codec or CHAR
    ro = sample(student, s_prompts, max_new_tokens, lam=lam, teacher=teacher, teacher_prompts=t_prompts,
                temperature=temperature, logratio_clip=logratio_clip, plausibility_alpha=plausibility_alpha,
                generator=gen, codec=codec)
    sp, spm = pad_left(s_prompts, codec.pad_id)
    tp, tpm = pad_left(t_prompts, codec.pad_id)
    s_logits = response_logits(student, sp, spm, ro.tokens, ro.mask, codec.vocab_size).float().cpu()
    t_logits = response_logits(teacher, tp, tpm, ro.tokens, ro.mask, codec.vocab_size).float().cpu()
    return PolicySamples(lam=float(lam), prompt_index=torch.tensor(index, dtype=torch.long), prompts=sp,
                         prompt_mask=spm, teacher_prompts=tp, teacher_prompt_mask=tpm, tokens=ro.tokens,
                         mask=ro.mask, student_logits=s_logits, teacher_logits=t_logits)


def logit_gradients(student_logits: torch.Tensor, teacher_logits: torch.Tensor, direction: str,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """Closed-form per-token gradient of the KL with respect to the student logits, float64.

    Args:
        student_logits, teacher_logits: (B, R, V) logits.
        direction: "forward" -> ``p_S - p_T``; "reverse" -> ``p_S (log p_S - log p_T - KL(p_S||p_T))``.
        mask: optional (B, R) bool; masked-out positions get exactly 0.

    Returns:
        (B, R, V) float64: the gradient of ``sum_{b,r} token_kl[b, r]`` with respect to
        ``student_logits`` (each position's own gradient, since positions do not interact).
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student_logits and teacher_logits must have the same shape, got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    log_s = torch.log_softmax(student_logits.detach().double(), -1)
    log_t = torch.log_softmax(teacher_logits.detach().double(), -1)
    p_s = log_s.exp()
    if direction == "forward":
        g = p_s - log_t.exp()
    else:
        ratio = log_s - log_t
        g = p_s * (ratio - (p_s * ratio).sum(-1, keepdim=True))
    if mask is not None:
        if mask.shape != student_logits.shape[:-1]:
            raise ValueError(f"mask must have shape {tuple(student_logits.shape[:-1])}, got {tuple(mask.shape)}")
        g = g * mask[..., None]
    return g


@dataclass
class GradientEntries:
    """Logit-gradient entries of both directions at every response token of one sample set.

    forward / reverse: (N, V) float64 numpy arrays, one row per masked-in response token.
    """

    lam: float
    forward: np.ndarray
    reverse: np.ndarray

    def of(self, direction: str) -> np.ndarray:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        return self.forward if direction == "forward" else self.reverse

    def norms(self, direction: str) -> np.ndarray:
        """(N,) L2 norm of each token's logit gradient."""
        return np.linalg.norm(self.of(direction), axis=1)

    def max_abs(self, direction: str) -> float:
        g = self.of(direction)
        return float(np.abs(g).max()) if g.size else 0.0

    def summary(self) -> list[dict[str, float | str | int]]:
        """One row per direction: counts, max |entry|, quantiles of |entry| and of the norms."""
        rows = []
        for d in DIRECTIONS:
            g, n = np.abs(self.of(d)), self.norms(d)
            rows.append({"lam": self.lam, "direction": d, "n_tokens": int(g.shape[0]), "max_abs_entry": self.max_abs(d),
                         "q99_abs_entry": float(np.quantile(g, 0.99)) if g.size else 0.0,
                         "frac_entries_outside_unit": float((g > 1).mean()) if g.size else 0.0,
                         "mean_norm": float(n.mean()) if n.size else 0.0, "max_norm": float(n.max()) if n.size else 0.0})
        return rows


def gradient_entries(samples: PolicySamples) -> GradientEntries:
    """Closed-form logit gradients of both directions at every masked-in response token."""
    m = samples.mask
    rows = {d: logit_gradients(samples.student_logits, samples.teacher_logits, d)[m].numpy() for d in DIRECTIONS}
    return GradientEntries(lam=samples.lam, forward=rows["forward"], reverse=rows["reverse"])


def sequence_logprobs(samples: PolicySamples, lam: float, *, temperature: float = 1.0,
                      logratio_clip: float | None = None, plausibility_alpha: float | None = None) -> torch.Tensor:
    """(B,) float64 log-probability of each sampled response under pi_lambda.

    The same recipe as the sampler: both models' logits divided by ``temperature``, then
    ``mixture_logprobs`` with the same safeguards, summed over the masked-in positions
    (the response up to and including </s>). ``-inf`` where pi_lambda cannot produce a token.
    """
    if not (temperature > 0):
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    logp = mixture_logprobs(samples.student_logits / temperature, samples.teacher_logits / temperature, lam,
                            logratio_clip=logratio_clip, plausibility_alpha=plausibility_alpha)
    tok = logp.gather(-1, samples.tokens.unsqueeze(-1)).squeeze(-1).double()
    tok = torch.where(samples.mask, tok, torch.zeros_like(tok))
    return tok.sum(-1)


def importance_weights(logp_a: torch.Tensor | np.ndarray, logp_b: torch.Tensor | np.ndarray) -> np.ndarray:
    """Self-normalised importance ratios ``w~_i = w_i / mean(w)``, ``w_i = P_b(x_i) / P_a(x_i)``.

    Args:
        logp_a, logp_b: (N,) log P_a(x_i), log P_b(x_i) for samples x_i ~ P_a (logp_a finite;
            logp_b may be -inf where P_b cannot produce x_i).

    Returns:
        (N,) float64 ratios with mean 1; all zeros when P_b gives probability 0 to every sample
        (then nothing about P_b is known from these samples).
    """
    a = np.asarray(logp_a, dtype=np.float64)
    b = np.asarray(logp_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"logp_a and logp_b must be equal-length non-empty 1-D arrays, got {a.shape} and {b.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("logp_a must be finite: the samples must come from P_a")
    log_w = b - a
    if not np.any(np.isfinite(log_w)):
        return np.zeros_like(a)
    # Normalise in log space: the raw ratios of long sequences overflow easily.
    log_w = log_w - log_w[np.isfinite(log_w)].max()
    w = np.exp(log_w)
    return w / w.mean()


def tv_distance(logp_a: torch.Tensor | np.ndarray, logp_b: torch.Tensor | np.ndarray) -> dict[str, float]:
    """Total-variation distance between P_a and P_b from N samples of P_a.

    Returns a dict with

    * ``tv``: ``0.5 mean |1 - w~|`` with the self-normalised ratios of :func:`importance_weights`
      (equal to ``mean max(0, 1 - w~)`` because mean w~ = 1; consistent, slightly biased, in
      [0, 1)); 1.0 when P_b gives every sample probability 0;
    * ``tv_bounded``: ``mean max(0, 1 - w)`` with the raw ratios: unbiased for TV whatever the
      supports, summands in [0, 1] (variance <= 1/(4N));
    * ``mean_w``: ``mean w`` (raw; its expectation is P_b(supp P_a) <= 1: far from 1 means the
      ratios are too heavy-tailed for N samples), ``ess``: ``(sum w)^2 / sum w^2``, ``n``: N.
    """
    a = np.asarray(logp_a, dtype=np.float64)
    b = np.asarray(logp_b, dtype=np.float64)
    w_sn = importance_weights(a, b)
    w = np.exp(np.minimum(b - a, 700.0))
    ess = float(w_sn.sum() ** 2 / (w_sn ** 2).sum()) if np.any(w_sn > 0) else 0.0
    tv = float(0.5 * np.abs(1 - w_sn).mean()) if np.any(w_sn > 0) else 1.0
    return {"tv": tv, "tv_bounded": float(np.maximum(0.0, 1 - w).mean()), "mean_w": float(w.mean()),
            "ess": ess, "n": int(a.size)}


def functional_update_distance(samples: PolicySamples, grads: torch.Tensor, coef: torch.Tensor) -> float:
    """``max |sum_i coef_i G(x_i)|`` over the coordinates (prefix, token) of the functional view.

    A coordinate is a visited prefix (prompt index + the response tokens before the position) and
    a vocabulary entry; response i contributes ``coef_i * grads[i, t]`` to the coordinate of its
    t-th prefix. Different responses that share a prefix add up on the same coordinate.

    Args:
        samples: the sample set (for prompt indices, tokens, mask).
        grads: (B, R, V) per-position logit gradients (zeros where masked out).
        coef: (B,) weights, e.g. ``(1 - w~_i) / N``.
    """
    acc: dict[tuple, np.ndarray] = {}
    g = grads.double().numpy()
    c = coef.double().numpy()
    lengths = samples.mask.sum(-1).tolist()
    for i, n in enumerate(lengths):
        toks = samples.tokens[i].tolist()
        pi = int(samples.prompt_index[i])
        for t in range(int(n)):
            key = (pi, tuple(toks[:t]))
            contrib = c[i] * g[i, t]
            if key in acc:
                acc[key] = acc[key] + contrib
            else:
                acc[key] = contrib
    return float(max(np.abs(v).max() for v in acc.values())) if acc else 0.0


def _param_update_distances(student: torch.nn.Module, samples: PolicySamples, coefs: dict[float, torch.Tensor]
                            ) -> tuple[dict[tuple[float, str], float], dict[str, float]]:
    """Parameter-space distances and constants, one response at a time.

    Returns ``({(lambda_b, direction): || sum_i coef_i grad_theta L(x_i) ||_2},
    {direction: max_i || grad_theta L(x_i) ||_2})`` where ``L(x_i)`` is the response's summed
    per-token KL (teacher logits fixed).
    """
    params = list(student.parameters())
    flags = [p.requires_grad for p in params]
    acc = {(lb, d): None for lb in coefs for d in DIRECTIONS}
    const = {d: 0.0 for d in DIRECTIONS}
    try:
        for p in params:
            p.requires_grad_(True)
        student.eval()
        for i in range(samples.n):
            n_i = int(samples.mask[i].sum())
            if n_i == 0:
                continue
            sl = slice(i, i + 1)
            s_logits = response_logits(student, samples.prompts[sl], samples.prompt_mask[sl],
                                       samples.tokens[sl, :n_i], samples.mask[sl, :n_i],
                                       samples.teacher_logits.shape[-1]).cpu()
            t_logits = samples.teacher_logits[sl, :n_i]
            for k, d in enumerate(DIRECTIONS):
                loss = token_kl(s_logits, t_logits, d).sum()
                grads = torch.autograd.grad(loss, params, retain_graph=k == 0, allow_unused=True)
                flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double()
                                  for g, p in zip(grads, params)])
                const[d] = max(const[d], float(flat.norm()))
                for lb, coef in coefs.items():
                    term = float(coef[i]) * flat
                    acc[(lb, d)] = term if acc[(lb, d)] is None else acc[(lb, d)] + term
    finally:
        for p, f in zip(params, flags):
            p.requires_grad_(f)
    dist = {key: (float(v.norm()) if v is not None else 0.0) for key, v in acc.items()}
    return dist, const


def update_distance_vs_tv(student: torch.nn.Module, teacher: torch.nn.Module, prompts: list[list[int]],
                          lambdas: list[float], *, samples_per_prompt: int = 8, max_new_tokens: int = 32,
                          teacher_prompts: list[list[int]] | None = None, temperature: float = 1.0,
                          logratio_clip: float | None = None, plausibility_alpha: float | None = None,
                          pairs: list[tuple[float, float]] | None = None, param_space: bool = True,
                          seed: int = 0, codec=None) -> pd.DataFrame:
    """Distance between expected KL updates under two rollout policies against their TV distance.

    For each ``lambda_a`` one sample set of ``len(prompts) * samples_per_prompt`` responses is drawn
    from pi_{lambda_a}; every other ``lambda_b`` (or the given ``pairs``) is evaluated on it by
    importance ratios (module docstring). Returns one row per (lam_a, lam_b, direction) with:

    * ``tv``, ``tv_bounded``, ``mean_w``, ``ess``, ``n``: :func:`tv_distance`;
    * ``dist_logit``: functional-view distance ``max |mean_i (1 - w~_i) G(x_i)|`` (nats per logit);
    * ``bound_logit``: ``2 tv`` (the forward bound: entries in [-1, 1]);
    * ``max_abs_entry``: the largest |logit-gradient entry| in the sample set for that direction;
    * ``below_bound``: ``dist_logit <= 2 tv`` (always True for forward, up to rounding);
    * ``dist_param``: ``|| mean_i (1 - w~_i) grad_theta L(x_i) ||_2``;
    * ``param_const``: ``max_i || grad_theta L(x_i) ||_2`` over the sample set, and
      ``bound_param = 2 tv param_const``, which ``dist_param`` never exceeds (same identity as in
      the logit view, but with a constant measured on the samples: for forward KL it is at most
      sqrt(2) times the summed logit-Jacobian norms, for reverse KL it has no model-free bound).
      The three are NaN when ``param_space`` is False (it costs one backward pass per response).

    Samples with ``P_a(x) = 0`` (possible only through float noise at the plausibility-mask edge)
    are dropped and counted in ``n_dropped``.
    """
    lambdas = [float(v) for v in lambdas]
    if len(lambdas) < 2:
        raise ValueError(f"lambdas must hold at least two values, got {lambdas}")
    if pairs is None:
        pairs = [(a, b) for a in lambdas for b in lambdas if a != b]
    else:
        pairs = [(float(a), float(b)) for a, b in pairs]
    by_a: dict[float, list[float]] = {}
    for a, b in pairs:
        by_a.setdefault(a, []).append(b)
    mix = dict(temperature=temperature, logratio_clip=logratio_clip, plausibility_alpha=plausibility_alpha)
    rows = []
    for k, (lam_a, lam_bs) in enumerate(by_a.items()):
        samples = sample_policy(student, teacher, prompts, lam_a, samples_per_prompt, max_new_tokens,
                                teacher_prompts=teacher_prompts, seed=seed + k, codec=codec, **mix)
        logp_a = sequence_logprobs(samples, lam_a, **mix)
        keep = torch.isfinite(logp_a)
        n_dropped = int((~keep).sum())
        grads = {d: logit_gradients(samples.student_logits, samples.teacher_logits, d, samples.mask)
                 for d in DIRECTIONS}
        max_abs = {d: float(grads[d].abs().max()) for d in DIRECTIONS}
        coefs, stats = {}, {}
        for lam_b in lam_bs:
            logp_b = sequence_logprobs(samples, lam_b, **mix)
            st = tv_distance(logp_a[keep].numpy(), logp_b[keep].numpy())
            w = torch.zeros_like(logp_a)
            w[keep] = torch.from_numpy(importance_weights(logp_a[keep].numpy(), logp_b[keep].numpy()))
            coef = torch.where(keep, (1 - w) / max(int(keep.sum()), 1), torch.zeros_like(w))
            coefs[lam_b], stats[lam_b] = coef, st
        dist_param, const = _param_update_distances(student, samples, coefs) if param_space else ({}, {})
        for lam_b in lam_bs:
            for d in DIRECTIONS:
                dist = functional_update_distance(samples, grads[d], coefs[lam_b])
                tv = stats[lam_b]["tv"]
                rows.append({"lam_a": lam_a, "lam_b": lam_b, "direction": d, **stats[lam_b],
                             "n_dropped": n_dropped, "dist_logit": dist, "bound_logit": 2 * tv,
                             "max_abs_entry": max_abs[d], "below_bound": dist <= 2 * tv * (1 + 1e-9) + 1e-12,
                             "dist_param": dist_param.get((lam_b, d), float("nan")),
                             "param_const": const.get(d, float("nan")),
                             "bound_param": 2 * tv * const.get(d, float("nan"))})
    return pd.DataFrame(rows)


def demo_models(seed: int = 0, student_sharpness: float = 3.0, teacher_sharpness: float = 20.0
                ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Random "nano" Llama student and teacher for demos and tests (not trained: no science here).

    Their final RMSNorm weights are multiplied by ``student_sharpness`` / ``teacher_sharpness``,
    which multiplies the logits: a confident teacher and a less confident student give the large
    log-ratios where reverse-KL gradients leave [-1, 1], as a trained teacher does.
    """

    student = build_model("llama", "nano", seed)
    teacher = build_model("llama", "nano", seed + 1)
    with torch.no_grad():
        student.model.norm.weight.mul_(student_sharpness)
        teacher.model.norm.weight.mul_(teacher_sharpness)
    return student.eval(), teacher.eval()
