# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Statistics: which knob matters, matched comparisons, and the findings scoreboard
#
# On the main grid (OffPD/OnPD x forward/reverse KL x learning rate, gradient clipping on):
#
# 1. **Which knob matters**: per metric an OLS ANOVA (type II) with factors policy, kl, lr (and
#    task when there are several) and their interactions; each term's partial $\eta^2$ =
#    SS_term / (SS_term + SS_residual).
# 2. **Matched OnPD vs OffPD**: for every (task, kl, lr), paired t-tests across seeds (paired by
#    seed), the mean difference with a 95% CI, Cohen's $d_z$, Holm correction per metric.
# 3. **Seed variance** per configuration.
# 4. **Mixed model** (statsmodels MixedLM) with task as grouping factor, when there are >= 2 tasks.
# 5. **Findings scoreboard**: every numbered finding of STUDY.md, one verdict per claim: a
#    compound finding is split into parts (2a, 2b, ...), each with the statistic measured here, its
#    95% interval and a verdict computed by the test written in `kdlab.analysis.findings` (shown in
#    the table); the finding's own row counts the parts that hold.

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # folder holding results.parquet
out_dir = ""  # default: <study_dir>/analysis/70_statistics
metrics = ["accuracy", "forgetting", "sparsity", "pass_at_10"]
alpha = 0.05  # significance level of the Holm-corrected paired tests
gradients_csv = ""  # notebook 50's bound.csv; default: <study_dir>/analysis/50_gradients/bound.csv if present

# %%
import json

import pandas as pd
from kdlab.study.report_page import title
from IPython.display import Image, display

from kdlab.analysis import findings, power, regime, stats
from kdlab.analysis.followups import findings_table
from kdlab.analysis.table import load_results, main_grid, notebook_out_dir, resolve_path
from kdlab.analysis.explore import figure_png

pd.set_option("display.max_colwidth", 200)
OUT = notebook_out_dir(study_dir, "70_statistics", out_dir)
df = load_results(study_dir)
grid = main_grid(df)
present = [m for m in metrics if m in grid.columns and grid[m].notna().any()]
print(f"{len(df)} runs, {len(grid)} in the main grid; tasks {sorted(df.task.unique())}; metrics {present}")


def stack(frames):
    """The tables of every metric as one (empty when the main grid is)."""
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

# %% [markdown]
# ## 1. Which knob matters (partial eta squared)

# %%
anova = stack([stats.anova_table(grid, m) for m in present])
anova.to_csv(OUT / "anova.csv", index=False)
knobs = stats.knob_table(grid, present)
knobs.to_csv(OUT / "knob_table.csv")
if not knobs.empty:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 + 1.3 * knobs.shape[1], 0.9 + 0.35 * knobs.shape[0]), dpi=90, layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(knobs.to_numpy(dtype=float), vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(knobs.shape[1]), knobs.columns, rotation=30, ha="right")
    ax.set_yticks(range(knobs.shape[0]), knobs.index)
    for i in range(knobs.shape[0]):
        for j in range(knobs.shape[1]):
            v = knobs.iat[i, j]
            if pd.notna(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="w" if v < 0.6 else "k", fontsize=8)
    fig.colorbar(im, ax=ax, label="partial eta^2")
    ax.set_title("which knob matters")
    png = figure_png(fig)
    (OUT / "knob_table.png").write_bytes(png)
    display(Image(data=png))
display(title('Partial eta squared (0-1) per factor (rows) and metric (columns)'))
knobs.round(3)

# %%
display(title('ANOVA per metric: sums of squares (metric units squared), F, p-value, partial eta squared'))
anova.round(4)

# %% [markdown]
# ## 2. Matched OnPD - OffPD comparisons (paired by seed, Holm per metric)

# %%
paired = stack([stats.paired_comparisons(grid, m, alpha=alpha) for m in present])
paired.to_csv(OUT / "paired.csv", index=False)
display(title('Matched OnPD - OffPD differences per metric (metric units), paired by seed, Holm-adjusted p-values'))
paired.round(4)

# %% [markdown]
# ## 3. Seed variance per configuration

# %%
seedvar = stats.seed_variance(df, present)
seedvar.to_csv(OUT / "seed_variance.csv", index=False)
config = [c for c in stats.CONFIG_COLUMNS if c in seedvar.columns and seedvar[c].notna().any()]
shown = seedvar.assign(**{c: seedvar[c].astype(object).where(seedvar[c].notna(), "-") for c in config})
display(title('Seed standard deviation per configuration and metric (metric units)'))
(shown.pivot_table(index=config, columns="metric", values="sd").round(4) if len(shown)
 else "no main-grid metric to compare")

# %% [markdown]
# ## 4. Mixed model with task as grouping factor

# %%
mixed = {}
for m in present:
    res = stats.mixed_model(grid, m)
    mixed[m] = {k: v for k, v in res.items() if k != "table"}
    if res["status"] == "fit":
        print(f"{m}: {res['formula']} | {res['reason']} | converged {res['converged']} | "
              f"task variance {res['group_var']:.4g}" + (f" | warnings: {res['warnings']}" if res["warnings"] else ""))
        res["table"].assign(metric=m).to_csv(OUT / f"mixed_{m}.csv", index=False)
        display(title('Mixed model coefficients (metric units)'))
        display(res["table"].round(4))
    else:
        print(f"{m}: mixed model {res['status']}: {res['reason']}")
_ = (OUT / "mixed_model.json").write_text(json.dumps(mixed, indent=2, default=str))

# %% [markdown]
# ## 5. Findings scoreboard
# One row per finding (its line: how many of its parts are reproduced) followed by one row per
# part (label 2a, 2b, ...: the part's claim, statistic, 95% interval, verdict). Each verdict is
# computed from the table by the rule in the `test` column; `detail` gives the numbers (and, for
# the parts that test a knob table effect, the partial eta squared beside the interval); "not
# run" says what is missing. Findings 11-13 also read the study's follow-ups (`kdlab.analysis.followups.findings_table`):
# the RLVR final accuracy of each start, the style runs' adoption, and the companion studies'
# sampled-estimator and no-clipping runs.

# %%
grad_path = resolve_path(gradients_csv) if gradients_csv else resolve_path(study_dir) / "analysis" / "50_gradients" / "bound.csv"
grad_table = pd.read_csv(grad_path) if grad_path.exists() else None
print("gradient table:", grad_path if grad_table is not None else "none")
board = findings.scoreboard(findings_table(study_dir, df), grad_table)  # + RLVR, style and companion runs
check = regime.regime_check(df)  # the regime's three roles per task (kdlab.analysis.regime)
check.to_csv(OUT / "regime_check.csv", index=False)
board["regime"] = regime.regime_notes(board, check).values  # a verdict resting on an unmet role says so
board = power.add_power(board)  # each part's interval half-width against the distance to its bound
board.to_csv(OUT / "scoreboard.csv", index=False)
(OUT / "scoreboard.json").write_text(json.dumps(board.to_dict(orient="records"), indent=2))
parts = findings.part_rows(board)
print(f"{len(parts)} parts of {len(findings.summary_rows(board))} findings:", parts["verdict"].value_counts().to_dict())
display(title('Findings scoreboard, one row per finding then per part: verdict, statistic (unit on each row), 95% interval'))
display(board.set_index("label"))

# %% [markdown]
# ### The power of each inconclusive part
# `half_width`: the 95% interval's half on the bound's side; `needed`: the distance from the
# estimate to the bound (the margin the verdict must clear); `factor` = (half_width / needed)²:
# about how many times the data (seeds, or evaluation problems for binomial intervals) the part
# needs to be decided if its estimate stays where it is (`kdlab.analysis.power`).

# %%
weak = power.inconclusive_power(board)
display(title(f"Inconclusive parts ({len(weak)}), the data each needs (statistic units; shares as fractions)"))
weak
