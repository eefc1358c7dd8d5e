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
# # The lambda spectrum
#
# Held-out accuracy, pass@1 and pass@10 against the rollout-policy position $\lambda$
# ($-1$ = teacher rollouts / OffPD, $+1$ = student rollouts / OnPD, $0$ = geometric mean), one panel
# per KL direction x learning rate: the mean over seeds, a 95% Student-t confidence band (absent
# with one seed) and every run as a dot. The same for the harder-variant accuracies
# (`<variant>_accuracy`, e.g. Countdown-4E) when the table has them (findings 7-10).
# Runs without gradient clipping are left out (they are a robustness check, notebook 70).

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # folder holding results.parquet
out_dir = ""  # default: <study_dir>/analysis/60_spectrum
metrics = ["accuracy", "pass_at_1", "pass_at_10"]  # the main spectrum metrics (missing ones are skipped)
level = 0.95  # confidence level of the bands

# %%
from IPython.display import Image, display
import pandas as pd
from kdlab.study.report_page import title

from kdlab.analysis import spectrum as sp
from kdlab.analysis.table import load_results, notebook_out_dir, variant_columns
from kdlab.analysis.explore import figure_png

OUT = notebook_out_dir(study_dir, "60_spectrum", out_dir)
df = load_results(study_dir)
tasks = sp.spectrum_tasks(df)
main = [m for m in metrics if m in df.columns]
variants = variant_columns(df)
print(f"{len(df)} runs; spectrum tasks {tasks}; metrics {main}; harder variants {variants}")


def show(fig, name):
    png = figure_png(fig)
    (OUT / f"{name}.png").write_bytes(png)
    display(Image(data=png))


# %% [markdown]
# ## Main metrics

# %%
for task in tasks:
    if main:
        show(sp.plot_spectrum(df, main, task=task, level=level), f"spectrum_{task}")

# %% [markdown]
# ## Harder variants

# %%
for task in tasks:
    have = [v for v in variants if df.loc[df.task == task, v].notna().any()]
    if have:
        show(sp.plot_spectrum(df, have, task=task, level=level), f"spectrum_variants_{task}")
    else:
        print(f"{task}: no harder-variant accuracy columns")

# %% [markdown]
# ## The numbers

# %%
table = pd.concat([sp.spectrum_table(df, m, task=t, level=level) for t in tasks for m in main + variants
                   if df.loc[df.task == t, m].notna().any()], ignore_index=True)
table.to_csv(OUT / "spectrum.csv", index=False)
print("written:", OUT / "spectrum.csv")
display(title("Each metric along the lambda spectrum: mean over seeds, in the metric's unit as in results.parquet (rows task x metric x KL x rate, columns lambda)"))
table.pivot_table(index=["task", "metric", "kl", "lr"], columns="lam", values="mean").round(3)
