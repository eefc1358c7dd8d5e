# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # One RLVR (GRPO) run from a distilled student
#
# The follow-up of STUDY.md finding 11: GRPO with the countdown verifier as reward
# (`kdlab.engine.rlvr`: groups of sampled responses per prompt, group-normalised advantages, clipped
# ratio, optional k3 penalty to the start, collapse detector), started from the distilled
# student of one grid run (`rlvr.starts`: `policy/kl/lr-index`) or from the student base
# (`base`), with the profile's `rlvr:` settings; a toy model or a real checkpoint (countdown in
# natural language), each through its own tokenizer (`kdlab.models.codec`). `kdlab.study.runs.execute_rlvr`
# writes `metrics.json` (last) and `history.json` into the run directory; this notebook shows the
# training curves.

# %% tags=["parameters"]
params = "../params/tiny.yaml"  # profile YAML
outputs = "../outputs"  # outputs root (models under outputs/models, the study under outputs/<name>)
overrides = {}  # dotted-key overrides applied on top of params
start = "base"  # an rlvr.starts entry ("base" or policy/kl/lr-index, e.g. "off/forward/0") or a pipeline: rlvr-only, joint
seed = 0
out_dir = ""  # run directory; "" = outputs/<study>/rlvr/<start_id>_s<seed>
threads = 0  # torch threads (0: leave torch's default)
recorded = False  # True: show the recorded metrics.json instead of running again

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import display

from kdlab.study.config import load_profile
from kdlab.study.followups import rlvr_start, start_checkpoint
from kdlab.study.runs import execute_rlvr

if threads:
    torch.set_num_threads(threads)
profile = load_profile(params, overrides)
study_dir = Path(outputs).resolve() / profile.name
begin = rlvr_start(profile, start, seed)
run_dir = Path(out_dir) if out_dir else study_dir / "rlvr" / begin.job_id
print(f"GRPO on {profile.rlvr.task} from {begin.start_id} (seed {seed}) -> {run_dir}")

# %%
if recorded:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    print("showing the metrics recorded by an earlier execution of this run")
else:
    metrics = execute_rlvr(profile, start_checkpoint(study_dir, begin), run_dir, Path(outputs).resolve() / "models",
                           seed=seed, progress=False, info=begin.info(), settings=dict(begin.settings))
display(pd.DataFrame({"value": {k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}}))

# %% [markdown]
# ## Training curves
# Reward: mean verifier score of the sampled responses of each step; accuracy: greedy, on
# `rlvr.n_eval` held-out problems, every `rlvr.eval_every` steps; length: response tokens.

# %%
history = pd.DataFrame(json.loads((run_dir / "history.json").read_text()))
fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), constrained_layout=True)
for ax, name in zip(axes, ["reward_mean", "accuracy", "length"]):
    h = history[["step", name]].dropna()
    ax.plot(h["step"], h[name], marker="o" if len(h) < 20 else None)
    ax.set_title(name)
    ax.set_xlabel("GRPO step")
fig.suptitle(f"{begin.start_id}, seed {seed}" + (f"  (collapsed at step {metrics['collapse_step']})"
                                                 if metrics["collapsed"] else ""))
plt.show()
