# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Axes: teacher strength and student scale
#
# STUDY.md stops at one fixed teacher per task and one student size. Each point of an axis
# (`axes:` in the profile, listed in `axes.json`) reruns this study's main grid with another
# teacher or student, as its own study; this study is every axis's first point (`own`). At the
# grid's low rate, per task and configuration (policy x KL): the student's accuracy, gain over its
# base and forgetting against the point's teacher accuracy or parameter count, then one answer
# line per question: the statistic in points, its 95% interval over seeds (parametric bootstrap
# of the cell-means model, as the scoreboard's), the claim it tests and the verdict
# (`kdlab.analysis.axes`).

# %% tags=["parameters"]
study_dir = "../outputs/teachers"  # the axis study's folder (holding axes.json)
out_dir = ""  # default: <study_dir>/analysis/94_axes

# %%
from IPython.display import Image, Markdown, display

from kdlab.analysis.axes import answers, axis_rows, load_axes, plot_axis, point_table
from kdlab.analysis.explore import figure_png
from kdlab.analysis.table import notebook_out_dir

OUT = notebook_out_dir(study_dir, "94_axes", out_dir)
points = load_axes(study_dir)
for p in points:
    display(Markdown(f"- **{p['axis']}: {p['label']}** (`{p['study_dir']}`): overrides `{p['overrides']}`"))
axes = list(dict.fromkeys(p["axis"] for p in points))

# %%
for axis in axes:
    rows = axis_rows(study_dir, axis)
    display(Markdown(f"## The {axis} axis ({rows['point'].nunique()} points, {len(rows)} runs at the low rate)"))
    table = point_table(rows, axis)
    table.to_csv(OUT / f"{axis}.csv", index=False)
    display(table)
    png = figure_png(plot_axis(rows, axis))
    (OUT / f"{axis}.png").write_bytes(png)
    display(Image(data=png))
    lines = answers(rows, axis)
    lines.to_csv(OUT / f"{axis}_answers.csv", index=False)
    display(Markdown("\n".join(f"- {r.task}, {r.configuration}: **{r.claim}**: {r.line} ({r.rule})"
                               for r in lines.itertuples())))
