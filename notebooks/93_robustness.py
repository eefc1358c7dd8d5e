# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Robustness: the companion studies beside the main grid
#
# Finding 13 of STUDY.md: with sampled KL estimators forward stays robust and reverse brittle,
# and the learning rate still governs forgetting and sparsity; without gradient clipping the KL
# directions differ more but OnPD vs OffPD still shows no consistent gap. Each companion
# (`companions:` in the profile, listed in `companions.json`) reruns this study's main grid
# (OffPD/OnPD x KL x learning rate x seeds) with its overrides, as its own study. Tables: mean
# over seeds in points, one column per study (`main` = this one); a sampled estimator sits in the
# row of the KL direction it targets.

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # the main study's folder (holding companions.json)
out_dir = ""  # default: <study_dir>/analysis/93_robustness
metrics = ["accuracy", "forgetting", "sparsity"]

# %%
from IPython.display import Image, Markdown, display

from kdlab.analysis.explore import figure_png
from kdlab.analysis.robustness import comparison_rows, load_companions, plot_robustness, robustness_table
from kdlab.analysis.table import notebook_out_dir

OUT = notebook_out_dir(study_dir, "93_robustness", out_dir)
companions = load_companions(study_dir)
for c in companions:
    display(Markdown(f"- **{c['suffix']}** (`{c['study_dir']}`): overrides `{c['overrides']}`"))
rows = comparison_rows(study_dir)
print(f"{len(rows)} runs: " + ", ".join(f"{v} {n}" for v, n in rows["variant"].value_counts(sort=False).items()))

# %%
present = [m for m in metrics if m in rows.columns and rows[m].notna().any()]
for m in present:
    table = robustness_table(rows, m)
    table.to_csv(OUT / f"{m}.csv")
    display(Markdown(f"### {m}"))
    display(table)
if present and rows["variant"].nunique() > 1:
    png = figure_png(plot_robustness(rows, present))
    (OUT / "robustness.png").write_bytes(png)
    display(Image(data=png))
