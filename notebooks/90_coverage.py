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
# # Coverage: pass@k curves and forward vs reverse KL at equal pass@1
#
# Every run records pass@k for the k of `eval.pass_ks` (unbiased estimator from `eval.pass_n`
# samples per problem on `eval.pass_problems` test problems) on its task and, with
# `eval.harder_pass`, on the harder variants of `eval.harder` (countdown-4, countdown-4e).
# Below: the curves pass@k against k for every configuration along the lambda spectrum (one
# line per lambda, one panel per KL x learning rate; seed means with 95% bands), then finding 9:
# **pass@10 at equal pass@1**, forward minus reverse KL, from a common-slope linear fit
# pass@10 = a + b pass@1 + g [forward] over the runs with lambda > 0 (`kdlab.analysis.coverage`):
# g > 0 means forward KL covers more answers at the same pass@1.

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # folder holding results.parquet
out_dir = ""  # default: <study_dir>/analysis/90_coverage
k = 10  # the k compared at equal pass@1 (the largest recorded k when this one is not)
lam_above = 0.0  # compare the runs with a lambda above this (finding 9: 0); None for all runs

# %%
from IPython.display import Image, Markdown, display

from kdlab.analysis import coverage as cov
from kdlab.analysis.explore import figure_png
from kdlab.analysis.table import load_results, notebook_out_dir
from kdlab.study.report_page import title

OUT = notebook_out_dir(study_dir, "90_coverage", out_dir)
df = load_results(study_dir)
targets = cov.pass_targets(df)
recorded = cov.pass_ks(df)
if recorded and k not in recorded:
    k = max(recorded)
print(f"{len(df)} runs; pass@k recorded on: " + (", ".join(t.rstrip('_') or "the target task" for t in targets) or "nothing")
      + "; ks " + str({t.rstrip('_') or 'task': cov.pass_ks(df, t) for t in targets}))


def show(fig, name):
    png = figure_png(fig)
    (OUT / f"{name}.png").write_bytes(png)
    display(Image(data=png))


# %% [markdown]
# ## pass@k curves

# %%
curves = []
for task in sorted(df["task"].unique()):
    for prefix in targets:
        if len(cov.pass_ks(df[df.task == task], prefix)) > 1:
            show(cov.plot_pass_curves(df, prefix, task=task), f"curves_{task}_{prefix.rstrip('_') or 'task'}")
            curves.append(cov.pass_curves(df, prefix, task=task))
if curves:
    import pandas as pd

    table = pd.concat(curves, ignore_index=True)
    table.to_csv(OUT / "pass_curves.csv", index=False)
    display(title("pass@k (fraction of problems, 0-1): mean over seeds per configuration (rows) and k (columns)"))
    display(table.pivot_table(index=["task", "target", "kl", "lr", "lam"], columns="k", values="mean").round(3))
else:
    display(Markdown("No pass@k curves: this study records fewer than two k (set `eval.pass_ks`)."))

# %% [markdown]
# ## pass@k at equal pass@1: forward vs reverse KL
# `gap` = forward minus reverse pass@k (k = 10, or the largest recorded) at equal pass@1 (fraction), with its standard error, 95%
# CI and p-value (t test of the KL coefficient); `overlap_lo`..`overlap_hi` is the pass@1 range
# both directions reach (outside it the comparison extrapolates). One row over all learning
# rates, then one per rate.

# %%
gaps = cov.equal_pass1_table(df, k=k, lam_above=lam_above) if k > 1 else []
if len(gaps):
    gaps.to_csv(OUT / "equal_pass1.csv", index=False)
    display(title("Forward - reverse KL pass@k at equal pass@1 (fractions, 0-1), with standard error, 95% CI and p-value"))
    display(gaps.round(3))
    for prefix in targets:
        if {1, k} <= set(cov.pass_ks(df, prefix)):
            show(cov.plot_equal_pass1(df, prefix, k=k, lam_above=lam_above), f"equal_pass1_{prefix.rstrip('_') or 'task'}")
else:
    display(Markdown(f"pass@1 and pass@{k} are not both recorded: no comparison at equal pass@1."))
