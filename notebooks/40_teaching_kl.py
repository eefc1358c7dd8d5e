# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Forward vs reverse KL, by hand
#
# Distillation trains a student distribution $p_S$ towards a teacher $p_T$ by minimising a KL
# divergence at every position. The two directions want different things:
#
# * **forward** $\mathrm{KL}(p_T \| p_S) = \sum_v p_T(v)\,(\log p_T(v) - \log p_S(v))$ punishes the student for
#   missing mass where the teacher has some: it is **mode covering**;
# * **reverse** $\mathrm{KL}(p_S \| p_T) = \sum_v p_S(v)\,(\log p_S(v) - \log p_T(v))$ punishes the student for
#   putting mass where the teacher has little: it is **mode seeking**.
#
# The difference only shows when the student cannot represent the teacher (strong-to-weak
# distillation). Below the teacher is a mixture of bumps over a small vocabulary (or a continuous
# variable), and the *weak* student is a single bump (a softmax over logits $-(x-\mu)^2/2s^2$),
# fitted by Adam on `kdlab.core.kl.token_kl`.
#
# Gradients with respect to the student logits $z_S$ (STUDY.md finding 6):
# forward $\partial/\partial z_S(v) = p_S(v) - p_T(v) \in [-1, 1]$;
# reverse $\partial/\partial z_S(v) = p_S(v)\,(\log p_S(v) - \log p_T(v) - \mathrm{KL}(p_S\|p_T))$, unbounded.
#
# The figures are saved as PNG next to the notebook's outputs, so the executed notebook and its
# HTML show them without a kernel; the interactive widget at the end needs a live kernel.

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # the study these figures belong to (only used for the output folder)
out_dir = ""  # default: <study_dir>/analysis/40_teaching_kl
vocab_size = 20  # tokens of the toy vocabulary
modes = [[5.0, 1.0, 0.55], [14.0, 1.0, 0.45]]  # teacher bumps: (position, width, weight)
start = 7.0  # where the student's bump starts
steps = 300  # Adam steps per fit
lr = 0.1  # Adam learning rate

# %%
import json

import numpy as np
import pandas as pd
from kdlab.study.report_page import title
import torch
from IPython.display import Image, display

from kdlab.analysis import toy
from kdlab.analysis.table import notebook_out_dir
from kdlab.core.kl import token_kl

OUT = notebook_out_dir(study_dir, "40_teaching_kl", out_dir)
centers, widths, weights = (list(v) for v in zip(*modes))
print("writing to", OUT)


def show(fig, name):
    """Save a figure as PNG under OUT and display that PNG (static output)."""
    png = toy.figure_png(fig)
    (OUT / f"{name}.png").write_bytes(png)
    display(Image(data=png))


# %% [markdown]
# ## 1. A bimodal teacher and a one-bump student
# Both students start from the same bump (dotted). Forward KL stretches it over both modes;
# reverse KL settles on one mode and ignores the other.

# %%
scene = toy.teaching_scene(centers, widths, weights, vocab_size=vocab_size, steps=steps, lr=lr, init_mean=start)
show(toy.teaching_figure(scene), "bimodal_tokens")
summary = scene.summary()
pd.Series(summary)

# %% [markdown]
# ## 2. Where reverse KL ends depends on where it starts
# Forward KL has a single optimum in this family: from every start it heads for the same wide
# bump (the starts farthest away may still be on their way after `steps` steps, see the KL
# column). Reverse KL has one local optimum per mode, and the start decides which one it finds.
# (The bump's width learns 5x slower than its position, see `fit_student_result`: on a bounded
# vocabulary reverse KL also has a flat, near-uniform local optimum that a fast-widening bump
# drifts into.)

# %%
starts = np.linspace(1, vocab_size - 2, 7)
rows = []
for s0 in starts:
    sc = toy.teaching_scene(centers, widths, weights, vocab_size=vocab_size, steps=steps, lr=lr, init_mean=float(s0))
    for d in ("forward", "reverse"):
        rows.append({"start": float(s0), "direction": d, "top_mode": int(sc.masses[d].argmax()) + 1,
                     "top_mode_mass": float(sc.masses[d].max()), "kl": sc.fits[d].losses[-1],
                     "mean": sc.fits[d].mean, "width": sc.fits[d].width})
starts_table = pd.DataFrame(rows)
starts_table.to_csv(OUT / "starts.csv", index=False)
display(title('Mode seeking by starting point: the mode the fit ends on (index), its mass (probability) and the final KL (nats), per direction'))
starts_table.pivot(index="start", columns="direction", values=["top_mode", "top_mode_mass", "kl"]).round(3)

# %% [markdown]
# ## 3. The same picture for a continuous variable
# A fine grid stands in for the real line (the KLs are Riemann sums). The forward-KL Gaussian
# matches the teacher's mean and standard deviation (moment matching: the student family is
# exponential with statistics $x, x^2$); the reverse-KL Gaussian fits one mode.

# %%
cscene = toy.teaching_scene(centers, widths, weights, vocab_size=vocab_size, continuous=True, steps=steps, lr=lr,
                            init_mean=start)
show(toy.teaching_figure(cscene), "bimodal_continuous")
t_mean, t_sd = toy.gaussian_moments(cscene.teacher, cscene.support)
moments = pd.DataFrame([toy.gaussian_moments(p, cscene.support) for p in
                        (cscene.teacher, cscene.fits["forward"].probs, cscene.fits["reverse"].probs)],
                       columns=["mean", "sd"], index=["teacher", "forward-KL Gaussian", "reverse-KL Gaussian"])
display(title('Mean and standard deviation (grid units) of the teacher and of the two fitted Gaussians'))
moments.round(3)

# %% [markdown]
# ## 4. A strong student makes the direction matter less
# With one free logit per token the student can represent the teacher, and both directions reach it.

# %%
fscene = toy.teaching_scene(centers, widths, weights, vocab_size=vocab_size, family="free", steps=steps, lr=lr,
                            init_mean=start)
show(toy.teaching_figure(fscene), "bimodal_free_student")

# %% [markdown]
# ## 5. The gradient formulas, checked against autograd
# For random student/teacher pairs: the closed forms above against `torch.autograd` through
# `kdlab.core.kl.token_kl` (float64), and the forward entries' range.

# %%
gen = torch.Generator().manual_seed(0)
checks = []
for trial in range(20):
    scale = float(torch.empty(1).uniform_(0.5, 8.0, generator=gen))
    z_s = (scale * torch.randn(vocab_size, generator=gen, dtype=torch.float64)).requires_grad_(True)
    z_t = scale * torch.randn(vocab_size, generator=gen, dtype=torch.float64)
    closed = toy.kl_gradients(torch.softmax(z_s, -1).detach().numpy(), torch.softmax(z_t, -1).numpy())
    for d in ("forward", "reverse"):
        (g,) = torch.autograd.grad(token_kl(z_s[None], z_t[None], d).sum(), z_s)
        checks.append({"trial": trial, "direction": d, "logit_scale": scale,
                       "max_abs_diff": float(np.abs(g.numpy() - closed[d]).max()),
                       "max_abs_entry": float(np.abs(closed[d]).max())})
checks = pd.DataFrame(checks)
grad_check = {d: {"max_abs_diff": float(checks.loc[checks.direction == d, "max_abs_diff"].max()),
                  "max_abs_entry": float(checks.loc[checks.direction == d, "max_abs_entry"].max())}
              for d in ("forward", "reverse")}
print(json.dumps(grad_check, indent=2))
assert grad_check["forward"]["max_abs_entry"] <= 1.0, "forward-KL logit gradient left [-1, 1]"

# %%
results = {"bimodal_tokens": summary, "continuous": cscene.summary(), "free_student": fscene.summary(),
           "continuous_teacher_moments": {"mean": t_mean, "sd": t_sd}, "gradient_check": grad_check,
           "parameters": {"vocab_size": vocab_size, "modes": modes, "start": start, "steps": steps, "lr": lr}}
(OUT / "teaching_kl.json").write_text(json.dumps(results, indent=2))
print("written:", sorted(p.name for p in OUT.iterdir()))

# %% [markdown]
# ## 6. Try it
# Move the modes, change their widths and weights, switch to a strong student or a continuous
# variable, move the student's start (or press *random start*), and choose where the gradient
# bars are taken. Every change refits both students.

# %%
from kdlab.widgets import TeachingKLWidget

widget = TeachingKLWidget(vocab_size=vocab_size, modes=(tuple(tuple(m) for m in modes) + ((10.0, 1.0, 0.0),))[:3],
                          steps=steps, lr=lr, start=start)
widget
