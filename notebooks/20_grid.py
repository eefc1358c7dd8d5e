# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The study's results table
#
# Collects every completed run (`runs/*/metrics.json`) into `results.parquet`, one row per run,
# and shows it with the accuracy per grid cell (mean ± std over seeds, points).

# %% tags=["parameters"]
study_dir = "../outputs/tiny"  # outputs/<study>

# %%
import pandas as pd
from IPython.display import display

from kdlab.study.results import accuracy_table, failed_runs, write_results

path = write_results(study_dir)
results = pd.read_parquet(path)
print(f"{len(results)} completed runs -> {path}")
failures = failed_runs(study_dir)
if len(failures):
    print(f"{len(failures)} failed runs (see runs/<run_id>/error.json):")
    display(failures)

# %%
columns = ["run_id", "accuracy", "base_accuracy", "pass_at_10", "forgetting", "sparsity", "collapsed", "wall_s"]
display(results[columns])

# %%
display(accuracy_table(results))
