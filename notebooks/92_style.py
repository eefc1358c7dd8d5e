# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Incidental style transfer
#
# Finding 12 of STUDY.md: OnPD + reverse KL keeps the student's own style; every other
# configuration adopts the teacher's almost completely. The style teacher (`kdlab.study.style_teacher`)
# writes its countdown steps in another notation (operators as letters) when its prompt carries
# an instruction (a toy model trained so; for real checkpoints, the student's base fine-tuned so
# on countdown in natural language, the instruction a sentence of the prompt); during these
# distillation runs the teacher sees the instructed prompt and the student its usual one.
# **Adoption** = the share of the distilled student's outputs (greedy, on its own uninstructed
# prompts, `style.n_test` test problems) written in the teacher's notation,
# among outputs with a detectable style (`kdlab.evaluation.style.detect_style`); points, mean over seeds.

# %% tags=["parameters"]
study_dir = "../outputs/quick"  # the study folder (holding style/)
out_dir = ""  # default: <study_dir>/analysis/92_style

# %%
import matplotlib.pyplot as plt
import seaborn as sns
from IPython.display import Markdown, display

from kdlab.analysis.followups import load_style, style_table
from kdlab.analysis.table import notebook_out_dir
from kdlab.study.results import load_models

OUT = notebook_out_dir(study_dir, "92_style", out_dir)
runs = load_style(study_dir)
teacher = [m for m in load_models(study_dir) if m.get("model") == "style teacher"]
print(f"{len(runs)} style runs")
def pct(x):
    return "n/a (no output with a detectable style)" if x != x else f"{100 * x:.1f}%"


if teacher:
    t = teacher[0]
    display(Markdown(f"Style teacher: {pct(t['accuracy'])} accuracy on the student's prompts; alt notation in "
                     f"{pct(t['plain_adoption'])} of its styled outputs without the instruction and "
                     f"{pct(t['instructed_adoption'])} with it."))

# %%
if runs.empty:
    display(Markdown("No style run finished in this study (`style.enabled`)."))
else:
    table = style_table(runs)
    table.to_csv(OUT / "adoption.csv")
    display(table)
    runs["config"] = runs["policy"] + " / " + runs["kl"]
    runs["lr_label"] = [f"{lr:g}" for lr in runs["lr"]]
    ax = sns.barplot(data=runs, x="config", y=runs["style_adoption"] * 100, hue="lr_label", errorbar=None)
    ax.set(ylabel="adoption of the teacher's notation (%)", xlabel="policy / KL", ylim=(0, 100))
    ax.legend(title="learning rate")
    plt.show()
