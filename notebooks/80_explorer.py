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
# # Results explorer
#
# Pick a metric, the factor on the x axis, a hue and filters; the figure (seaborn point plot:
# mean with a bootstrap 95% CI, every run as a dot) follows. The static figure below uses the
# parameters of this notebook; the widget needs a live kernel.

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # folder holding results.parquet
out_dir = ""  # default: <study_dir>/analysis/80_explorer
metric = "accuracy"
x = "lam"
hue = "kl"  # or None
filters = {}  # e.g. {"lr": [0.0001], "task": ["countdown-3"]}

# %%
from IPython.display import Image, display

from kdlab.analysis.explore import explorer_data, explorer_plot
from kdlab.analysis.table import load_results, notebook_out_dir
from kdlab.analysis.explore import figure_png
from kdlab.study.report_page import title

OUT = notebook_out_dir(study_dir, "80_explorer", out_dir)
df = load_results(study_dir)
print(f"{len(df)} runs; columns: {sorted(df.columns)}")

# %%
data = explorer_data(df, metric, x, hue, filters)
data.to_csv(OUT / "explorer_data.csv", index=False)
png = figure_png(explorer_plot(df, metric, x, hue, filters))
(OUT / "explorer.png").write_bytes(png)
display(Image(data=png))
display(title(f"Explorer data: {metric} (its unit in results.parquet) by {x} and {hue}"))
data.round(4)

# %%
from kdlab.widgets import ResultsExplorer

explorer = ResultsExplorer(df, metric=metric, x=x, hue=hue)
explorer
