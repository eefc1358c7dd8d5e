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
# # KL gradients on real rollouts, and the update bound (finding 6)
#
# For a teacher/student pair and rollouts from several points of the lambda spectrum
# ($\lambda=-1$ teacher/OffPD, $+1$ student/OnPD), this notebook measures
#
# 1. the distribution of the per-token logit-gradient entries of both KL directions
#    (forward $p_S - p_T$, which must lie in $[-1, 1]$; reverse $p_S(\log p_S - \log p_T - \mathrm{KL})$) and
#    their per-token norms;
# 2. the distance between the *expected* updates under two rollout policies $a$ and $b$ against
#    the total-variation distance between their response distributions.
#
# **Estimators** (see `kdlab.engine.gradients`). For each $\lambda_a$ one sample set of
# `n_prompts * samples_per_prompt` responses is drawn from $\pi_{\lambda_a}$ and reused for every
# $\lambda_b$. Importance ratios $w_i = P_b(x_i)/P_a(x_i)$ come from the sequence log-probabilities
# under both mixture policies (same temperature, log-ratio clip and plausibility mask as the
# sampler) and are self-normalised ($\tilde w_i = w_i/\bar w$). Then
# $\widehat{\mathrm{TV}} = \tfrac12\,\overline{|1-\tilde w|}$ and
# $\widehat{u_a - u_b} = \overline{(1-\tilde w_i)\,G(x_i)}$ with $G(x)$ the gradient of the response's
# summed per-token KL, either with respect to the logits of every visited prefix (the
# "functional" view, a student with an identity Jacobian) or with respect to the parameters.
# Because forward entries lie in $[-1,1]$, forward points lie under the line $2\,\mathrm{TV}$ in the
# logit view; reverse points are free to cross it. `tv_bounded` (the unbiased
# $\overline{\max(0, 1-w)}$), `mean_w` and `ess` are diagnostics of the ratios: short responses keep
# them informative.

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # study folder; its models.json locates the checkpoints
out_dir = ""  # default: <study_dir>/analysis/50_gradients
student_dir = ""  # student checkpoint dir; default: the student base in <study_dir>/models.json
teacher_dir = ""  # teacher checkpoint dir; default: the teacher of `task` in <study_dir>/models.json
task = "countdown-3"  # prompts come from this task's test split
n_prompts = 4  # distinct prompts
samples_per_prompt = 16  # responses per prompt and lambda
lambdas = [-1.0, -0.5, 0.0, 0.5, 1.0]  # rollout policies
max_new_tokens = 8  # response length cap (short keeps the importance ratios usable)
temperature = 1.0
logratio_clip = 5.0  # the sampler's safeguards (null to disable)
plausibility_alpha = 0.1
param_space = None  # also the parameter-space distance (one gradient vector per response); None = toy models only
# (a 135M-parameter model would hold 64 x 135M gradient entries)
seed = 0
threads = 0  # torch threads; 0 keeps torch's default (use 1 on a busy shared machine)

# %%
import json

import pandas as pd
from kdlab.study.report_page import title
import torch
from IPython.display import Image, display

from kdlab.analysis import gradients as gfig
from kdlab.engine import gradients as ga
from kdlab.analysis.explore import figure_png
from kdlab.analysis.table import notebook_out_dir, resolve_path
from kdlab.study import materials
from kdlab.models.codec import CHAR
from kdlab.study.config import Profile, from_dict, read_yaml

OUT = notebook_out_dir(study_dir, "50_gradients", out_dir)
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(seed)
# The study's profile (toy or real checkpoints) says how its models and tasks load; without one,
# kdlab's toy tasks.
params_yaml = resolve_path(study_dir) / "params.yaml"
profile = from_dict(Profile, read_yaml(params_yaml.read_text())) if params_yaml.exists() else Profile()
if materials.is_real(profile) and task not in profile.grid.tasks:
    task = profile.grid.tasks[0]
found_s, found_t = gfig.find_models(study_dir, task)
s_path = resolve_path(student_dir) if student_dir else found_s
t_path = resolve_path(teacher_dir) if teacher_dir else found_t
codec = CHAR
if s_path is not None and t_path is not None:
    (student, codec), (teacher, _) = materials.load_model(profile, s_path), materials.load_model(profile, t_path)
    models = {"student": str(s_path), "teacher": str(t_path), "demo": False}
else:
    print("!! no checkpoints given or found in models.json: using RANDOM, sharpened nano models (a demo of the "
          "method, not a result). Pass student_dir / teacher_dir or run `kdlab teachers` first.")
    student, teacher = ga.demo_models(seed)
    models = {"student": "demo: random nano", "teacher": "demo: random nano (sharpened)", "demo": True}
if param_space is None:
    param_space = not materials.is_real(profile) or models["demo"]
if models["demo"]:
    profile = Profile()  # the demo models speak kdlab's char tokenizer: toy task prompts
task_obj = materials.test_set(profile, task, 1)[0]
problems = task_obj.problems("test", min(n_prompts, task_obj.capacity("test") or n_prompts), seed=seed)
prompts = [codec.prompt(p.prompt) for p in problems]
mix = dict(temperature=temperature, logratio_clip=logratio_clip, plausibility_alpha=plausibility_alpha)
print(models, f"{len(prompts)} prompts x {samples_per_prompt} samples x {len(lambdas)} lambdas")


def show(fig, name):
    png = figure_png(fig)
    (OUT / f"{name}.png").write_bytes(png)
    display(Image(data=png))


# %% [markdown]
# ## 1. Logit-gradient entries and per-token norms
# One sample set per lambda; every response token, every vocabulary entry. Dashed lines: the
# forward bounds ($\pm 1$ per entry, $\sqrt 2$ per token).

# %%
entries = []
for k, lam in enumerate(lambdas):
    samples = ga.sample_policy(student, teacher, prompts, lam, samples_per_prompt, max_new_tokens, seed=seed + k,
                               codec=codec, **mix)
    entries.append(ga.gradient_entries(samples))
entries_summary = pd.DataFrame([row for e in entries for row in e.summary()])
entries_summary.to_csv(OUT / "entries_summary.csv", index=False)
show(gfig.plot_gradient_entries(entries), "gradient_entries")
fwd_max = float(entries_summary.loc[entries_summary.direction == "forward", "max_abs_entry"].max())
rev_max = float(entries_summary.loc[entries_summary.direction == "reverse", "max_abs_entry"].max())
print(f"max |forward entry| = {fwd_max:.4f} (bound 1: {'holds' if fwd_max <= 1 else 'VIOLATED'}); "
      f"max |reverse entry| = {rev_max:.4f}")
display(title('Logit-gradient entries per lambda and KL direction (entries and per-token norms, unitless; forward bounds 1 and sqrt 2)'))
entries_summary.round(4)

# %% [markdown]
# ## 2. Expected-update distance against TV
# Every ordered pair $(\lambda_a, \lambda_b)$ of the lambdas above.

# %%
bound = ga.update_distance_vs_tv(student, teacher, prompts, lambdas, samples_per_prompt=samples_per_prompt,
                                 max_new_tokens=max_new_tokens, param_space=param_space, seed=seed, codec=codec, **mix)
bound.to_csv(OUT / "bound.csv", index=False)
show(gfig.plot_update_bound(bound), "update_bound")
cols = ["lam_a", "lam_b", "direction", "tv", "tv_bounded", "mean_w", "ess", "dist_logit", "bound_logit",
        "below_bound", "dist_param", "param_const"]
display(title('Expected-update distance against TV per ordered pair of lambdas (TV as a probability; distances in logit-gradient units)'))
bound[cols].round(4)

# %%
fw, rv = bound[bound.direction == "forward"], bound[bound.direction == "reverse"]
summary = {"models": models, "n_prompts": len(prompts), "samples_per_prompt": samples_per_prompt,
           "lambdas": lambdas, "max_new_tokens": max_new_tokens, **mix,
           "forward_max_abs_entry": fwd_max, "forward_within_unit": fwd_max <= 1.0,
           "reverse_max_abs_entry": rev_max,
           "forward_pairs_below_bound": int(fw.below_bound.sum()), "reverse_pairs_below_bound": int(rv.below_bound.sum()),
           "n_pairs": int(len(fw)),
           "param_const": {d: float(bound.loc[bound.direction == d, "param_const"].max()) for d in ("forward", "reverse")}}
(OUT / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
print(json.dumps(summary, indent=2, default=float))
