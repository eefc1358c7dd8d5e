"""Forward vs reverse KL on a toy problem: a multi-modal teacher, a student fitted by gradient descent.

The teacher is a mixture of bumps over a 1-D *support* ``x``: either the token ids
``0, 1, ..., V-1`` of a small vocabulary (a categorical distribution) or a fine grid standing in
for a continuous variable (the probabilities are then the density times the grid step, and
every KL below is a Riemann sum of the continuous KL). The student is a softmax over logits:

* ``family="gaussian"`` - the logits are ``-(x - mu)^2 / (2 s^2)``: a single bump (a discretised
  Gaussian) with two parameters ``mu`` and ``log s``. It cannot represent two modes, which is
  where the two KL directions disagree: forward KL (mode covering) spreads the bump over all
  modes, reverse KL (mode seeking) settles on one.
* ``family="free"`` - one free logit per support point: the student can match any teacher, and
  both directions reach the teacher (a strong student makes the direction matter less).

Gradients with respect to the student logits z_S (closed forms, see :func:`kl_gradients`):
forward KL(p_T || p_S): ``p_S - p_T``, every entry in [-1, 1];
reverse KL(p_S || p_T): ``p_S (log p_S - log p_T - KL(p_S || p_T))``, unbounded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..core.kl import token_kl
from .explore import figure_png  # noqa: F401 - re-exported: notebooks draw with toy.figure_png

FAMILIES = ("gaussian", "free")
DIRECTIONS = ("forward", "reverse")


def _as_prob_vector(p: object, name: str) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"{name} must be a 1-D probability vector of length >= 2, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold finite non-negative probabilities, got min {arr.min()!r}")
    total = arr.sum()
    if not math.isclose(total, 1.0, rel_tol=0, abs_tol=1e-6):
        raise ValueError(f"{name} must sum to 1, got sum {total!r}")
    return arr


def _support(support: object, size: int) -> np.ndarray:
    if support is None:
        return np.arange(size, dtype=np.float64)
    x = np.asarray(support, dtype=np.float64)
    if x.shape != (size,):
        raise ValueError(f"support must have shape ({size},) like the probabilities, got {x.shape}")
    if not np.all(np.diff(x) > 0):
        raise ValueError("support must be strictly increasing")
    return x


def teacher_probs(support: object, centers: list[float], widths: list[float], weights: list[float],
                  floor: float = 1e-6) -> np.ndarray:
    """A mixture of Gaussian bumps evaluated on ``support`` and normalised to sum to 1.

    ``p(x_i) ∝ sum_k w_k N(x_i; c_k, s_k^2)`` (each bump normalised on the support, so ``w_k`` is
    the share of mass of bump k), then mixed with a uniform floor:
    ``p <- (1 - floor) p + floor / n`` so that ``log p`` is finite everywhere (reverse KL needs it).

    Args:
        support: (n,) increasing points (token ids or a grid).
        centers, widths, weights: one entry per bump; widths > 0, weights >= 0 with a positive sum.
        floor: uniform mixing weight in [0, 1).

    Returns:
        (n,) float64 probabilities summing to 1.
    """
    x = np.asarray(support, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"support must be 1-D with >= 2 points, got shape {x.shape}")
    if not (len(centers) == len(widths) == len(weights)) or len(centers) == 0:
        raise ValueError(f"centers, widths, weights must have the same positive length, got "
                         f"{len(centers)}, {len(widths)}, {len(weights)}")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(weights)}")
    if any(s <= 0 for s in widths):
        raise ValueError(f"widths must be > 0, got {list(widths)}")
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"floor must be in [0, 1), got {floor!r}")
    p = np.zeros_like(x)
    for c, s, wk in zip(centers, widths, w / w.sum()):
        bump = np.exp(-0.5 * ((x - c) / s) ** 2)
        if bump.sum() == 0:  # a bump far outside the support: put its mass at the nearest point
            bump[np.argmin(np.abs(x - c))] = 1.0
        p += wk * bump / bump.sum()
    p = (1.0 - floor) * p + floor / x.size
    return p / p.sum()


def kl_gradients(p_s: object, p_t: object) -> dict[str, np.ndarray | float]:
    """Closed-form gradients of both KL directions with respect to the student logits.

    Args:
        p_s: (n,) student probabilities (strictly positive).
        p_t: (n,) teacher probabilities (strictly positive).

    Returns:
        dict with ``"forward"`` = d KL(p_T||p_S) / d z_S = ``p_S - p_T`` (n,),
        ``"reverse"`` = d KL(p_S||p_T) / d z_S = ``p_S (log p_S - log p_T - KL(p_S||p_T))`` (n,),
        and the two divergences ``"forward_kl"``, ``"reverse_kl"`` in nats (floats).
    """
    ps = _as_prob_vector(p_s, "p_s")
    pt = _as_prob_vector(p_t, "p_t")
    if ps.shape != pt.shape:
        raise ValueError(f"p_s and p_t must have the same shape, got {ps.shape} and {pt.shape}")
    if np.any(ps <= 0) or np.any(pt <= 0):
        raise ValueError("p_s and p_t must be strictly positive (log-probabilities must be finite)")
    log_ratio = np.log(ps) - np.log(pt)
    reverse_kl = float(np.sum(ps * log_ratio))
    forward_kl = float(np.sum(pt * -log_ratio))
    return {"forward": ps - pt, "reverse": ps * (log_ratio - reverse_kl),
            "forward_kl": forward_kl, "reverse_kl": reverse_kl}


@dataclass
class StudentFit:
    """Result of :func:`fit_student_result`.

    probs: (n,) fitted student probabilities; mean / width: the bump's ``mu`` and ``s`` (for the
    ``"free"`` family, the mean and standard deviation of the fitted distribution on the support);
    losses: the KL (nats) before each step, then after the last one (steps + 1 values).
    """

    probs: np.ndarray
    mean: float
    width: float
    losses: list[float] = field(default_factory=list)


def _initial_bump(x: np.ndarray, init_mean: float | None, init_width: float | None) -> tuple[float, float]:
    span = float(x[-1] - x[0])
    mu = float(x[0] + span / 2) if init_mean is None else float(init_mean)
    s = span / 4 if init_width is None else float(init_width)
    if not math.isfinite(mu):
        raise ValueError(f"init_mean must be finite, got {init_mean!r}")
    if not (s > 0 and math.isfinite(s)):
        raise ValueError(f"init_width must be a positive finite number, got {init_width!r}")
    return mu, s


def fit_student_result(teacher: object, direction: str, steps: int = 300, lr: float = 0.1, *,
                       family: str = "gaussian", support: object = None, init_mean: float | None = None,
                       init_width: float | None = None, width_lr_scale: float = 0.2) -> StudentFit:
    """Fit a student to ``teacher`` by Adam on ``kdlab.core.kl.token_kl`` (float64).

    Args:
        teacher: (n,) teacher probabilities (strictly positive, sum 1).
        direction: ``"forward"`` (minimise KL(p_T || p_S)) or ``"reverse"`` (KL(p_S || p_T)).
        steps: Adam steps (>= 0; 0 returns the initial student).
        lr: Adam learning rate (> 0), in logit units for ``"free"``, support units for ``mu``.
        family: ``"gaussian"`` (one bump, parameters mu and log s) or ``"free"`` (n free logits).
        support: (n,) increasing support points; default ``0..n-1`` (token ids).
        init_mean, init_width: the initial bump (default: centre of the support, a quarter of its
            span); the ``"free"`` student starts from the same bump.
        width_lr_scale: the bump's ``log s`` learns at ``lr * width_lr_scale`` (``"gaussian"`` only).
            On a bounded vocabulary reverse KL has a flat, near-uniform local optimum: a bump
            starting between modes that widens as fast as it moves drifts there instead of
            sliding to a mode. A slower width (default 0.2) lets it slide first; forward KL's single
            optimum is unaffected (it is only reached a little later).

    Returns:
        a :class:`StudentFit`.
    """
    pt = _as_prob_vector(teacher, "teacher")
    if np.any(pt <= 0):
        raise ValueError("teacher must be strictly positive (use a floor, see teacher_probs)")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    x_np = _support(support, pt.size)
    mu0, s0 = _initial_bump(x_np, init_mean, init_width)

    x = torch.tensor(x_np, dtype=torch.float64)
    t_logits = torch.log(torch.tensor(pt, dtype=torch.float64))[None]  # (1, n)
    if family == "gaussian":
        if not (isinstance(width_lr_scale, (int, float)) and width_lr_scale > 0 and math.isfinite(width_lr_scale)):
            raise ValueError(f"width_lr_scale must be a positive finite number, got {width_lr_scale!r}")
        mu = torch.tensor(mu0, dtype=torch.float64, requires_grad=True)
        log_s = torch.tensor(math.log(s0), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([{"params": [mu], "lr": lr}, {"params": [log_s], "lr": lr * width_lr_scale}])

        def logits() -> torch.Tensor:
            return (-0.5 * ((x - mu) / log_s.exp()) ** 2)[None]
    else:
        z = (-0.5 * ((x - mu0) / s0) ** 2).clone().requires_grad_(True)
        opt = torch.optim.Adam([z], lr=lr)

        def logits() -> torch.Tensor:
            return z[None]

    losses: list[float] = []
    for _ in range(steps):
        loss = token_kl(logits(), t_logits, direction).sum()
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = logits()
        losses.append(float(token_kl(final, t_logits, direction).sum()))
        probs = torch.softmax(final[0], -1).numpy()
    if family == "gaussian":
        mean, width = float(mu.detach()), float(log_s.detach().exp())
    else:
        mean = float(np.sum(probs * x_np))
        width = float(np.sqrt(np.sum(probs * (x_np - mean) ** 2)))
    return StudentFit(probs=probs, mean=mean, width=width, losses=losses)


def fit_student(teacher_probs: object, direction: str, steps: int = 300, lr: float = 0.1, **kwargs) -> np.ndarray:
    """The fitted student's (n,) probabilities; see :func:`fit_student_result` for the arguments."""
    return fit_student_result(teacher_probs, direction, steps, lr, **kwargs).probs


def mode_masses(probs: object, support: object, centers: list[float]) -> np.ndarray:
    """Share of ``probs`` on each mode: support points are assigned to the nearest center.

    Returns a (len(centers),) array summing to 1 (ties go to the first center).
    """
    p = np.asarray(probs, dtype=np.float64)
    x = np.asarray(support, dtype=np.float64)
    if p.shape != x.shape:
        raise ValueError(f"probs and support must have the same shape, got {p.shape} and {x.shape}")
    if len(centers) == 0:
        raise ValueError("centers must not be empty")
    nearest = np.argmin(np.abs(x[:, None] - np.asarray(centers, dtype=np.float64)[None, :]), axis=1)
    return np.array([p[nearest == k].sum() for k in range(len(centers))])


def gaussian_moments(probs: object, support: object) -> tuple[float, float]:
    """Mean and standard deviation of a distribution on ``support`` (forward-KL Gaussian optimum)."""
    p = np.asarray(probs, dtype=np.float64)
    x = np.asarray(support, dtype=np.float64)
    mean = float(np.sum(p * x))
    return mean, float(np.sqrt(np.sum(p * (x - mean) ** 2)))


# ---------------------------------------------------------------------------------------------
# the teaching scene: everything the widget and the notebook draw, from plain arguments
# ---------------------------------------------------------------------------------------------

GRAD_AT = ("start", "forward", "reverse")


def continuous_support(vocab_size: int, points_per_unit: int = 8) -> np.ndarray:
    """A grid standing in for a continuous variable, in the same units as token ids.

    It reaches 4 units beyond ``0 .. vocab_size - 1`` on both sides so that a wide student pays
    for mass far from every mode: ``linspace(-4, vocab_size + 3, ...)``, ``points_per_unit`` points
    per unit.
    """
    if vocab_size < 2 or points_per_unit < 1:
        raise ValueError(f"vocab_size must be >= 2 and points_per_unit >= 1, got {vocab_size}, {points_per_unit}")
    lo, hi = -4.0, vocab_size + 3.0
    return np.linspace(lo, hi, int(round((hi - lo) * points_per_unit)) + 1)


@dataclass
class TeachingScene:
    """A teacher, the initial student and the two fitted students, with gradients at one pair.

    support: (n,) points; teacher / start: (n,) probabilities; fits: {"forward": StudentFit,
    "reverse": StudentFit}; centers: the active modes (weight > 0); masses: {"teacher" | "start" |
    "forward" | "reverse": (k,) share of mass nearest each active center}; grad_at: which student
    the gradients are taken at ("start", "forward" or "reverse"); grads: :func:`kl_gradients` of
    that student against the teacher; continuous: whether the support is a grid.
    """

    support: np.ndarray
    teacher: np.ndarray
    start: np.ndarray
    fits: dict[str, StudentFit]
    centers: list[float]
    masses: dict[str, np.ndarray]
    grad_at: str
    grads: dict[str, np.ndarray | float]
    continuous: bool
    family: str

    def summary(self) -> dict[str, float | int | str]:
        """Plain numbers for a readout: KLs, mass on the biggest mode, max |gradient| per direction."""
        out: dict[str, float | int | str] = {"family": self.family, "grad_at": self.grad_at}
        for d, fit in self.fits.items():
            out[f"{d}_kl"] = fit.losses[-1]
            out[f"{d}_top_mode_mass"] = float(self.masses[d].max())
            out[f"{d}_top_mode"] = int(self.masses[d].argmax())
            out[f"{d}_mean"] = fit.mean
            out[f"{d}_width"] = fit.width
        out["max_abs_forward_grad"] = float(np.abs(self.grads["forward"]).max())
        out["max_abs_reverse_grad"] = float(np.abs(self.grads["reverse"]).max())
        return out


def teaching_scene(centers: list[float], widths: list[float], weights: list[float], *, vocab_size: int = 20,
                   continuous: bool = False, family: str = "gaussian", steps: int = 300, lr: float = 0.1,
                   init_mean: float | None = 7.0, init_width: float = 1.5, grad_at: str = "start") -> TeachingScene:
    """Build the teacher from bumps, fit both directions from the same start, take gradients.

    Modes with weight 0 are ignored (at least one weight must be positive). With
    ``continuous=False`` the support is the token ids ``0 .. vocab_size-1``; otherwise the grid of
    :func:`continuous_support`. Positions and widths are in token-id units in both cases.
    """
    if grad_at not in GRAD_AT:
        raise ValueError(f"grad_at must be one of {GRAD_AT}, got {grad_at!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
    active = [(c, s, w) for c, s, w in zip(centers, widths, weights) if w > 0]
    if not active:
        raise ValueError(f"at least one weight must be > 0, got {list(weights)}")
    x = continuous_support(vocab_size) if continuous else np.arange(vocab_size, dtype=np.float64)
    pt = teacher_probs(x, [a[0] for a in active], [a[1] for a in active], [a[2] for a in active])
    fits = {d: fit_student_result(pt, d, steps, lr, family=family, support=x, init_mean=init_mean,
                                  init_width=init_width) for d in DIRECTIONS}
    start = fit_student_result(pt, "forward", 0, lr, family=family, support=x, init_mean=init_mean,
                               init_width=init_width).probs
    act_centers = [a[0] for a in active]
    masses = {"teacher": mode_masses(pt, x, act_centers), "start": mode_masses(start, x, act_centers)}
    masses.update({d: mode_masses(f.probs, x, act_centers) for d, f in fits.items()})
    at = start if grad_at == "start" else fits[grad_at].probs
    # Keep the pair strictly positive for the logs (a fitted bump can underflow far from its mean).
    at = np.maximum(at, 1e-300)
    grads = kl_gradients(at / at.sum(), pt)
    return TeachingScene(support=x, teacher=pt, start=start, fits=fits, centers=act_centers, masses=masses,
                         grad_at=grad_at, grads=grads, continuous=continuous, family=family)


def teaching_figure(scene: TeachingScene, dpi: int = 80):
    """Three panels: teacher and both fitted students; the KL during fitting; the gradients
    of both directions with respect to the student logits at ``scene.grad_at``.

    Returns a ``matplotlib.figure.Figure`` (not attached to pyplot, so nothing leaks in loops).
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8), dpi=dpi, layout="constrained")
    ax_p, ax_l, ax_g = fig.subplots(1, 3, gridspec_kw={"width_ratios": [2.2, 1.2, 2.2]})
    x = scene.support
    colors = {"forward": "tab:blue", "reverse": "tab:red", "start": "0.5"}
    # On a grid, plot densities (probability / step) so that the picture does not depend on the grid.
    scale = 1.0 / (x[1] - x[0]) if scene.continuous else 1.0
    if scene.continuous:
        ax_p.fill_between(x, scene.teacher * scale, color="0.85", label="teacher")
        for d in DIRECTIONS:
            ax_p.plot(x, scene.fits[d].probs * scale, color=colors[d], lw=2, label=f"{d}-KL student")
        ax_p.plot(x, scene.start * scale, color=colors["start"], ls=":", label="start")
        ax_p.set_ylabel("density")
    else:
        ax_p.bar(x, scene.teacher, width=0.9, color="0.85", label="teacher")
        for d, off in (("forward", -0.2), ("reverse", 0.2)):
            ax_p.bar(x + off, scene.fits[d].probs, width=0.4, color=colors[d], alpha=0.8, label=f"{d}-KL student")
        ax_p.step(x, scene.start, where="mid", color=colors["start"], ls=":", label="start")
        ax_p.set_ylabel("probability")
    ax_p.set_xlabel("token id" if not scene.continuous else "x")
    top = {d: scene.masses[d].max() for d in DIRECTIONS}
    ax_p.set_title(f"{scene.family} student; mass on its top mode: "
                   f"forward {top['forward']:.0%}, reverse {top['reverse']:.0%}", fontsize=9)
    ax_p.legend(fontsize=8, loc="upper right")

    for d in DIRECTIONS:
        ax_l.plot(scene.fits[d].losses, color=colors[d], label=f"{d} KL")
    ax_l.set_yscale("log")
    ax_l.set_xlabel("Adam step")
    ax_l.set_ylabel("KL being minimised (nats)")
    ax_l.set_title("fitting", fontsize=10)
    ax_l.legend(fontsize=8)

    gf, gr = scene.grads["forward"], scene.grads["reverse"]
    if scene.continuous:
        ax_g.plot(x, gf, color=colors["forward"], label="forward: p_S - p_T")
        ax_g.plot(x, gr, color=colors["reverse"], label="reverse: p_S (log p_S - log p_T - KL)")
    else:
        ax_g.bar(x - 0.2, gf, width=0.4, color=colors["forward"], label="forward: p_S - p_T")
        ax_g.bar(x + 0.2, gr, width=0.4, color=colors["reverse"], label="reverse: p_S (log p_S - log p_T - KL)")
    ax_g.axhline(0, color="k", lw=0.6)
    ax_g.set_xlabel("token id" if not scene.continuous else "x")
    ax_g.set_ylabel("d KL / d z_S(v)")
    ax_g.set_title(f"logit gradients at the {scene.grad_at} student: max|fwd| {np.abs(gf).max():.2f}, "
                   f"max|rev| {np.abs(gr).max():.2f}", fontsize=9)
    ax_g.legend(fontsize=8, loc="lower right")
    return fig
