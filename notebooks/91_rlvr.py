# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # RLVR follow-up: GRPO from the distilled students
#
# Finding 11 of STUDY.md: the on-policy advantage on harder variants does not reliably survive
# RLVR; reverse-KL students from the low rate improve fast and then collapse, OffPD + forward
# KL at the low rate improves steadily and ends highest. Each start (`rlvr.starts`: the student
# base, or the distilled student of a grid run on the first task and first seed) is trained with
# GRPO on `rlvr.task` with the verifier as reward (`notebooks/11_rlvr`, one run per start and
# seed). Accuracies and rewards in points; a collapse is a sustained drop of the reward's moving
# average (`kdlab.engine.rlvr.detect_collapse`).

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # the study folder (holding rlvr/)
out_dir = ""  # default: <study_dir>/analysis/91_rlvr
smooth = 10  # moving-average window (steps) of the reward and length curves

# %%
from IPython.display import Image, Markdown, display

from kdlab.analysis.explore import figure_png
from kdlab.analysis.followups import load_rlvr, plot_rlvr_curves, rlvr_table
from kdlab.analysis.table import notebook_out_dir

OUT = notebook_out_dir(study_dir, "91_rlvr", out_dir)
summary, history = load_rlvr(study_dir)
print(f"{len(summary)} RLVR runs, {len(history)} GRPO steps recorded")

# %%
if summary.empty:
    display(Markdown("No RLVR run finished in this study (`rlvr.enabled`)."))
else:
    table = rlvr_table(summary)
    table.to_csv(OUT / "rlvr.csv")
    display(Markdown(f"GRPO on **{summary['task'].iloc[0]}**, {int(summary['steps_done'].max())} steps; per start "
                     "(mean over seeds): held-out accuracy before, at the end and at best, the reward and the response "
                     "length at the end (last tenth of the steps), collapses."))
    display(table)
    if (summary["no_signal_share"] >= 1).all():
        display(Markdown(f"**No learning signal**: in every group of every step all responses got the same reward "
                         f"(mean reward {100 * history['reward_mean'].mean():.1f} points), so every GRPO advantage "
                         f"was 0 and the starts did not move. The models cannot (yet) solve {summary['task'].iloc[0]}; "
                         "GRPO needs starts that solve some of its problems."))
    png = figure_png(plot_rlvr_curves(history, smooth=smooth, summary=summary))
    (OUT / "curves.png").write_bytes(png)
    display(Image(data=png))

# %% [markdown]
# ## How distillation and RLVR combine (`pipelines`)
# At equal training compute, counted in training sequences (a distillation step: `distill.batch_size`,
# a GRPO step: `prompts_per_step` x `group_size`): GRPO from the distilled student
# (`distill-rlvr`), GRPO alone from the base for as many sequences (`rlvr-only`), and GRPO plus
# a KL-to-teacher term on the student's own samples from the base (`joint`); accuracy on the
# RLVR task at the end and forgetting (probe mean at the end minus the student base's), points.

# %%
from kdlab.analysis.pipelines import pipeline_answers, pipeline_rows, pipeline_table

pipes = pipeline_rows(summary)
if pipes.empty:
    display(Markdown("This study runs no pipelines (`pipelines.enabled`)."))
else:
    ptable = pipeline_table(pipes)
    ptable.to_csv(OUT / "pipelines.csv")
    display(ptable)
    answers = pipeline_answers(pipes)
    answers.to_csv(OUT / "pipelines_answers.csv", index=False)
    display(Markdown("\n".join(f"- **{r.claim}**: {r.line} ({r.rule})" for r in answers.itertuples())))
