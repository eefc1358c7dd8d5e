"""How distillation and RLVR combine: the three pipelines of ``pipelines`` at equal training compute.

Per RLVR seed the study runs (``kdlab.study.followups``): ``distill-rlvr`` (GRPO from the grid's
distilled student), ``rlvr-only`` (GRPO from the student base, as many training sequences as the
distillation and the GRPO stage together) and ``joint`` (as long, GRPO plus a KL-to-teacher term
on the student's own samples). Each records its final held-out accuracy on ``rlvr.task`` and its
forgetting (mean probe score at its end minus the student base's).

Answer lines (parts in the scoreboard's sense, ``kdlab.analysis.findings``; cells = pipelines,
seeds replicate, the seed-to-seed variance pooled, points): for each pair of pipelines, "A ends
above B" (final accuracy A - B > 0); for each pipeline, "it forgets" (forgetting < 0).
"""
from __future__ import annotations

from itertools import combinations

import pandas as pd

from ..core.schema import PIPELINES
from .findings import Part, _part, _part_not_run, bootstrap, cell_model, sel


def pipeline_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The pipeline runs of ``kdlab.analysis.followups.load_rlvr``'s summary (column ``pipeline``)."""
    if summary.empty or "pipeline" not in summary.columns:
        return summary.iloc[0:0]
    return summary[summary["pipeline"].isin(PIPELINES)].copy()


def pipeline_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per pipeline (in ``PIPELINES`` order): GRPO steps, final accuracy and forgetting (points,
    mean and seed SD) and the number of seeds."""
    if rows.empty:
        return pd.DataFrame()
    g = rows.assign(final=100 * rows["final_accuracy"], forget=100 * rows["forgetting"]).groupby("pipeline")
    t = pd.DataFrame({"GRPO steps": g["grpo_steps"].first(), "final accuracy": g["final"].mean(),
                      "final SD": g["final"].std(), "forgetting": g["forget"].mean(), "forgetting SD": g["forget"].std(),
                      "seeds": g["seed"].nunique()})
    return t.reindex([p for p in PIPELINES if p in t.index]).round(2)


def pipeline_answers(rows: pd.DataFrame) -> pd.DataFrame:
    """The answer lines (module docstring): one per pair of pipelines, then one per pipeline;
    "not run" without two pipelines or without seed replicates."""
    present = [p for p in PIPELINES if p in set(rows.get("pipeline", pd.Series(dtype=str)))]
    parts: list[tuple[str, Part]] = []
    acc = cell_model(rows, "final_accuracy", ["pipeline"]) if len(rows) else None
    forget = cell_model(rows, "forgetting", ["pipeline"]) if len(rows) and "forgetting" in rows else None
    for a, b in combinations(present, 2) if len(present) >= 2 else [("", "")]:
        claim = f"{a} ends above {b} on the RLVR task" if a else "the pipelines end at different accuracies"
        if acc is None or not acc.replicated or not a:
            parts.append((a, _part_not_run(claim, "needs >= 2 pipelines with >= 2 seeds")))
            continue

        def diff(M, a=a, b=b):
            return sel(M, pipeline=a).iloc[:, 0] - sel(M, pipeline=b).iloc[:, 0]

        parts.append((f"{a} - {b}", _part(claim, f"final accuracy {a} - {b}", bootstrap(acc, diff), "greater", 0.0)))
    for p in present:
        claim = f"{p} forgets (its probe skills end below the student base's)"
        if forget is None or not forget.replicated:
            parts.append((p, _part_not_run(claim, "needs the forgetting of >= 2 seeds")))
            continue
        est = bootstrap(forget, lambda M, p=p: sel(M, pipeline=p).iloc[:, 0])
        parts.append((p, _part(claim, f"forgetting of {p}", est, "less", 0.0)))
    return pd.DataFrame([{"comparison": key, "claim": pt.claim, "statistic": pt.name, "value": pt.estimate.value,
                          "ci_low": pt.estimate.lo, "ci_high": pt.estimate.hi, "rule": pt.rule,
                          "verdict": pt.verdict, "line": pt.text()} for key, pt in parts])
