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
# # Models of the study: student base and task teachers
#
# Builds (or reuses, from the content-addressed store under `outputs/models`) the student base
# and one teacher per target task of the profile, then evaluates them: held-out accuracy on each
# task (greedy pass@1, test split) and the mean score over the seven probe skills. The table is
# written to `outputs/<study>/models.json`; the report reads the teachers' accuracy and the
# training times from it. A profile with `style.enabled` also gets its style teacher
# (`kdlab.study.style_teacher`), shown with how well it follows the style instruction.

# %% tags=["parameters"]
params = "../params/tiny.yaml"  # profile YAML
outputs = "../outputs"  # outputs root: models under outputs/models, the study under outputs/<name>
overrides = {}  # dotted-key overrides applied on top of params, e.g. {"distill.steps": 2}
threads = 0  # torch threads (0: leave torch's default)

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
import torch
from IPython.display import Markdown, display

from kdlab.study.config import load_profile
from kdlab.core.atomic import write_json_atomic
from kdlab.study.teachers import model_table
from kdlab.study.building import study_model_paths
from kdlab.study.style_teacher import style_teacher_row

if threads:
    torch.set_num_threads(threads)
profile = load_profile(params, overrides)
study_dir = Path(outputs).resolve() / profile.name
if profile.pretrained.student:
    print(f"study {profile.name}: student {profile.pretrained.student}, teachers "
          + ", ".join(f"{t.name}: {t.teacher}" for t in profile.pretrained.tasks))
else:
    print(f"study {profile.name}: student {profile.student.family}/{profile.student.size}, "
          f"teacher {profile.teacher.family}/{profile.teacher.size}")

# %%
paths = study_model_paths(profile, Path(outputs).resolve() / "models", progress=False)
style_path = paths.pop("style-teacher", None)
rows = model_table(profile, paths, cache_root=Path(outputs).resolve() / "cache")
if style_path is not None:
    rows.append(style_teacher_row(profile, style_path))
write_json_atomic(study_dir / "models.json", rows)
models = pd.DataFrame(rows)
display(models[["model", "task", "accuracy", "probe_mean", "n_params", "train_s"]])

# %% [markdown]
# The teacher should beat the student base on its task by a wide margin (that gap is what
# distillation closes), while both keep the probe skills.

# %%
if style_path is not None:
    display(Markdown("**Style teacher**: accuracy on the student's prompts and on instructed prompts, and the "
                     "share of its outputs in the alt notation without (`plain_adoption`, should be ~0) and with "
                     "the instruction (`instructed_adoption`, should be ~1)."))
    display(models[models.model == "style teacher"][["task", "accuracy", "instructed_accuracy", "plain_adoption",
                                                     "instructed_adoption", "probe_mean"]])

# %%
plot = models.melt(id_vars=["model", "task"], value_vars=["accuracy", "probe_mean"], var_name="score")
grid = sns.catplot(data=plot, x="task", y="value", hue="model", col="score", kind="bar", height=3, aspect=1.3)
grid.set(ylim=(0, 1))
plt.show()
