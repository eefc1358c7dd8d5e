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
# # One distillation run
#
# The lab record of one grid cell: rollout policy x KL direction x learning rate x seed, given
# whole as its run contract (`kdlab.study.contract`: the cell plus the study's validated profile).
# `kdlab.study.runs.execute_run` does the work (distil, evaluate, write `metrics.json` and
# `history.json` atomically into the run directory); this notebook shows what it recorded.
# The models must already be built (`00_teachers`, or `kdlab teachers`).

# %% tags=["parameters"]
contract = {}  # the run contract (kdlab.study.contract.RunContract as a mapping: profile, run, out_dir, ...), as
# the study runner passes it; {} = the first grid cell of `params`, written under `outputs`
params = "../params/tiny.yaml"  # read only when contract is {}: a profile YAML
outputs = "../outputs"  # read only when contract is {}: the outputs root (models under outputs/models)
threads = 0  # torch threads (0: leave torch's default)
recorded = False  # True: show the run's existing metrics.json instead of running it again (the study
# runner sets it when a run finished but its notebook was interrupted before its last cell)

# %%
import json

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
import torch
from IPython.display import display

from kdlab.study.config import load_profile
from kdlab.study.contract import RunContract, first_cell
from kdlab.study.runs import execute_run

if threads:
    torch.set_num_threads(threads)
sns.set_theme(style="whitegrid")
run = RunContract.from_json(contract) if contract else first_cell(load_profile(params), outputs)
cfg, run_dir = run.run, run.out_dir
print(f"run {cfg.run_id} -> {run_dir}")

# %%
if recorded:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    if metrics.get("run_id") != cfg.run_id:
        raise ValueError(f"{run_dir / 'metrics.json'} is run {metrics.get('run_id')!r}, not {cfg.run_id!r}")
    print("showing the metrics recorded by an earlier execution of this run")
else:
    metrics = execute_run(run, progress=False, train_missing=False)

# %% [markdown]
# ## Metrics
# Accuracies and probe scores are fractions; `forgetting` is the change of the mean probe score
# (negative = forgot); `sparsity` is the share of parameters that did not move (bf16 steps).
# The source of truth is `metrics.json` in the run directory.

# %%
scalars = {k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}
display(pd.DataFrame({"value": scalars}))

# %% [markdown]
# ## Training curves

# %%
history = pd.DataFrame(json.loads((run_dir / "history.json").read_text()))
curves = ["loss", "forward_kl", "reverse_kl", "grad_norm", "entropy", "length"]
fig, axes = plt.subplots(2, 3, figsize=(12, 6), constrained_layout=True)
for ax, name in zip(axes.flat, curves):
    if name in history and history[name].notna().any():
        ax.plot(history["step"], history[name], marker="o" if len(history) < 20 else None)
    else:
        ax.text(0.5, 0.5, "not recorded" + (" (teacher rollouts)" if name == "entropy" else ""),
                ha="center", va="center", transform=ax.transAxes)
    ax.set_title(name)
    ax.set_xlabel("step")
fig.suptitle(cfg.run_id + ("  (collapsed)" if metrics["collapsed"] else ""))
plt.show()
