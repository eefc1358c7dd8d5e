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
# # Study report: rollout policy x KL direction x learning rate

# %% tags=["parameters"]
study_dir = "../outputs/tiny"  # outputs/<study>

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns
from IPython.display import Markdown, display

from kdlab.analysis import regime
from kdlab.analysis.table import prepare_results
from kdlab.study import report_page as P
from kdlab.study import results as R

sns.set_theme(style="whitegrid", context="notebook")
df = R.load_results(study_dir)
models = R.load_models(study_dir)
timing = R.load_timing(study_dir)
runs = R.annotate(df)
lrs = " / ".join(f"{lr:g}" for lr in sorted(df["lr"].unique()))
display(Markdown(f"**{Path(study_dir).name}**: {len(df)} completed runs; tasks {', '.join(sorted(df['task'].unique()))}; "
                 f"grid rates {lrs} (each task's own: below Table 2); seeds {sorted(df['seed'].unique().tolist())}; "
                 f"{', '.join(sorted(df['dtype'].astype(str).unique()))} parameters."))
failures = R.failed_runs(study_dir)
if len(failures):
    display(Markdown(f"**{len(failures)} runs failed** and are missing from every table below "
                     "(table: failed runs, with the error of each):"))
    display(failures)

# %% [markdown]
# ## Regime check and findings scoreboard
# Does the regime play the paper's three roles (Table 1), and what does each claim of STUDY.md come to (Table 2)?

# %%
check = regime.regime_check(prepare_results(df))
display(P.title("Table 1. Regime check: the paper's roles per task (range over the cells each rule reads, points)"))
display(P.compact_html(regime.regime_table(check)))
board = P.scoreboard_view(study_dir)
if board is None:
    display(Markdown("*No scoreboard: the statistics section (70_statistics) did not write one; see it below.*"))
else:
    display(P.title("Table 2. Findings scoreboard, one row per claim: verdict, statistic (unit on each row), 95% interval"))
    display(P.scoreboard_html(board))
display(Markdown("Table 2: a compound finding's line counts its parts (hover for the full verdict; hover a "
                 "statistic for its name); points = percentage points. *power*: the 95% interval's half-width on "
                 "the side of the verdict's bound against the distance from the estimate to that bound (decided "
                 "when smaller), and for an inconclusive part about how many times its data (seeds, or evaluation "
                 "problems) would decide it if the estimate stayed (`kdlab.analysis.power`). *regime*: the unmet "
                 "roles of Table 1 a verdict rests on, with their tasks. "
                 "The regime check's rules (`kdlab.analysis.regime`; seed means per cell): "
                 + "; ".join(f"*{role}*: {rule}" for role, rule in regime.RULES.items()) + ". "
                 "Learning rates per task (low, high): " + "; ".join(
                     f"{task} {', '.join(row.astype(str))}" for task, row in R.task_rates(df).iterrows())
                 + ". Each test and its evidence: section *Statistics* below."))

# %% [markdown]
# ## Which knob explains each metric
# Partial η² (0 to 1: the share of the variance left after the other terms that a factor or
# interaction explains) per metric, from the ANOVA of the statistics section. The scoreboard
# tests the same effects with intervals, each as its own part: KL against policy on accuracy
# (2a), learning rate and policy on forgetting (3a, 3b), learning rate on sparsity (4a); a part's
# detail in section *Statistics* quotes the η² beside its interval.

# %%
knobs = P.knob_view(study_dir)
if knobs is None:
    display(Markdown("*No ANOVA table: the statistics section did not write one (too few runs or seeds).*"))
else:
    display(P.title("Table 3. Which knob explains each metric: partial η² (0-1) per factor (rows) and metric (columns)"))
    display(knobs)

# %% [markdown]
# ## Headline figure: held-out accuracy by policy × KL × learning rate
# Bars: mean over seeds ± std; dots: single runs (points = percentage points).

# %%
grid = sns.catplot(data=runs, x="cell", y=runs["accuracy"] * 100, hue="lr_label", col="task", kind="bar",
                   errorbar="sd", alpha=0.6, height=3.6, aspect=1.6, sharex=False)
for ax, (task, d) in zip(grid.axes.flat, runs.groupby("task", sort=True)):
    sns.stripplot(data=d, x="cell", y=d["accuracy"] * 100, hue="lr_label", dodge=True, palette="dark:black",
                  size=4, ax=ax, legend=False)
    ax.set_ylabel("held-out accuracy (points)")
    ax.tick_params(axis="x", rotation=30)
grid.legend.set_title("learning rate")
plt.show()

# %% [markdown] tags=["toc"]
# ## Contents
# (filled in by the study runner when it writes report.html)

# %% [markdown]
# ## How to read this report
# Every number below comes from the study's results table (`results.parquet`, one row per run,
# collected from the runs' `metrics.json`) through `kdlab.study.results`. Accuracies, pass@k,
# forgetting and sparsity are in percentage points; spreads are over seeds (mean ± sample std,
# n runs). Gains are held-out accuracy after distillation minus the student base's. Long
# diagnostic tables are folded (click to open) and kept as CSV in each section's files
# (`analysis/<section>/`).

# %% [markdown]
# ## Accuracy by policy × KL × learning rate
# Held-out accuracy (greedy pass@1) per grid cell, mean ± std over seeds (n runs).

# %%
display(P.title("Table 4. Held-out accuracy (points, mean ± std over seeds, n runs): policy × KL (rows) by learning rate"))
display(R.wide(R.accuracy_table(df)))

# %% [markdown]
# ## Forgetting and sparsity by learning rate
# Forgetting: change of the mean probe score (seven out-of-distribution skills), after minus
# before distillation (negative = forgot). Sparsity: share of parameters whose change is below
# 1e-6 (in the parameter dtype shown above).

# %%
display(P.title("Table 5. Forgetting (points of mean probe score, after - before) by learning rate"))
display(R.wide(R.by_lr(df, "forgetting")))
display(P.title("Table 6. Sparsity (% of parameters changed by less than 1e-6) by learning rate"))
display(R.wide(R.by_lr(df, "sparsity")))

# %%
display(P.title("Table 7. Forgetting (points) by policy × KL (rows) and learning rate"))
display(R.wide(R.by_lr(runs, "forgetting", within=("rollout", "kl"))))
display(P.title("Table 8. Sparsity (% of parameters) by policy × KL (rows) and learning rate"))
display(R.wide(R.by_lr(runs, "sparsity", within=("rollout", "kl"))))

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
dodge = runs["cell"].nunique() > 1  # seaborn cannot dodge a single hue level
for ax, metric in zip(axes, ["forgetting", "sparsity"]):
    sns.pointplot(data=runs, x="lr_label", y=runs[metric] * 100, hue="cell", errorbar="sd",
                  dodge=0.4 if dodge else False, linestyle="none", ax=ax)
    sns.stripplot(data=runs, x="lr_label", y=runs[metric] * 100, hue="cell", dodge=dodge, alpha=0.4,
                  legend=False, ax=ax)
    ax.set(xlabel="learning rate", ylabel="forgetting (points)" if metric == "forgetting" else "sparsity (% of parameters)")
plt.show()

# %% [markdown]
# ## Base vs teacher vs distilled
# Held-out accuracy and mean probe score (points) of the student base, the task teacher
# (from `models.json`) and the distilled students.

# %%
display(P.title("Table 9. Held-out accuracy and mean probe score (points): base, teacher, distilled"))
display(R.model_comparison(df, models))

# %% [markdown]
# ## Each KL where the student must change its mind
# Why reverse KL may not learn a task: at the *contested* tokens of the training batch (where the
# student's most likely token is not the teacher's; on kb-mc and rules-mc the facts of the trace
# that decide the answer), the student's mass on the teacher's token a = argmax p_T, and the
# gradient of the run's own KL with respect to the student's logit of a (forward: p_S(a) - p_T(a),
# about -p_T(a) when the student ignores a; reverse: carries the factor p_S(a), so it vanishes
# with it). Logged every step (`kdlab.core.answer`); lines: mean over seeds, low learning rate;
# the gradient on a log scale (its magnitude). The table adds the answer position (the token
# after `#`), which on the multiple-choice tasks repeats the trace's last value.

# %%
steps = R.diagnosis_steps(study_dir, df)
if steps.empty:
    print("no diagnosis in the runs' histories (runs recorded before it, or a vocabulary too large to record it)")
else:
    low = steps[steps["lr"] == steps["lr"].min()].assign(
        rollout=lambda d: d["policy"], mass=lambda d: 100 * d["contested_p_student"],
        pull=lambda d: d["contested_grad_at_a"].abs(), share=lambda d: 100 * d["contested_share"])
    n = low["task"].nunique()
    fig, axes = plt.subplots(3, n, figsize=(4.2 * n, 8.4), squeeze=False, constrained_layout=True)
    for j, (task, d) in enumerate(low.groupby("task", sort=True)):
        for i, (y, label) in enumerate((("share", "contested tokens (%)"), ("mass", "p_S(teacher's token) (%)"),
                                        ("pull", "|d own KL / d z_S(teacher's token)|"))):
            sns.lineplot(data=d, x="step", y=y, hue="kl", style="rollout", errorbar=None, ax=axes[i, j],
                         legend=(i == 0 and j == 0))
            axes[i, j].set(ylabel=label, title=task if i == 0 else "")
        axes[2, j].set(yscale="log")
    plt.show()
    display(P.title("Table 10. Contested tokens: their share, the student's and teacher's mass on the teacher's token (%), each KL's gradient there, and the student's mass at the answer position; first step and last 10 steps (seed means)"))
    display(R.diagnosis_summary(steps))

# %% [markdown]
# ## Lambda spectrum and coverage
# Rollouts from pi_lambda between the teacher (λ = -1, off-policy) and the student (λ = +1,
# on-policy); pass@10 (coverage) where the study sampled at least 10 answers per problem.

# %%
spectrum = runs[runs["task"].isin(runs.loc[runs["policy"] == "lambda", "task"])]
if spectrum["lam"].nunique() > 2:
    display(P.title("Table 11. Held-out accuracy (points, mean ± std over seeds) along the λ spectrum"))
    display(R.wide(R.summarize(spectrum, "accuracy", ["task", "kl", "lam", "lr"])))
    grid = sns.relplot(data=spectrum, x="lam", y=spectrum["accuracy"] * 100, hue="kl", style="lr_label",
                       col="task", kind="line", errorbar="sd", marker="o", height=3.5, aspect=1.4)
    grid.set_axis_labels("λ (−1 teacher rollouts … +1 student rollouts)", "held-out accuracy (points)")
    plt.show()
else:
    print("no lambda-spectrum runs in this study")
if df["pass_at_10"].notna().any():
    display(P.title("Table 12. pass@10 (points, mean ± std over seeds) by policy × KL and learning rate"))
    display(R.wide(R.accuracy_table(df, "pass_at_10")))
else:
    print("pass@10 not measured (eval.pass_n < 10)")

# %% [markdown]
# ## Toy-regime acceptance checks
# At the low learning rate: the mean gain over the four policy × KL cells on countdown-3
# (>= 25 points) and its best cell's (>= 35), and every other target task's mean gain
# (>= 20), each cell averaged over seeds.

# %%
checks = R.acceptance(df)
print(R.format_acceptance(checks))
display(P.title("Table 13. Acceptance checks: measured gains and their targets (points)"))
display(checks)

# %% [markdown]
# ## Wall time per phase
# Seconds summed over runs and workers: model training (`train_s` in models.json), rollouts,
# distillation steps and evaluation (from the runs), and the notebook overhead (each run
# notebook's wall time minus the run's own `wall_s`, plus kernel start-ups, from `timing.json`).

# %%
display(P.title("Table 14. Wall time per phase (seconds, summed over runs and workers)"))
display(R.phase_times(df, models, timing))
