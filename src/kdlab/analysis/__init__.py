"""Analysis of kdlab studies: the toy forward/reverse-KL picture, KL gradients on real rollouts,
lambda-spectrum curves, statistics and the findings scoreboard.

It reads finished runs and draws them; it never samples or trains (the gradient experiment's
sampling and gradients are ``kdlab.engine.gradients``).

Modules: ``toy`` (teaching forward vs reverse KL), ``gradients`` (figures of the gradient
experiment), ``table`` (loading the results table, output folders), ``spectrum`` (metrics against
lambda), ``stats`` (ANOVA, paired tests, seed variance, mixed model), ``findings`` (STUDY.md
findings as tests), ``explore`` (the explorer's plotting), ``synthetic`` (tables with planted
effects for tests and demos). Widgets live in ``kdlab.widgets``.

The names below are re-exported lazily, so that ``kdlab.analysis.table`` or ``.stats`` can be
used without importing torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "explore": ("apply_filters", "explorer_data", "explorer_plot"),
    "findings": ("FindingResult", "compare_scoreboards", "evaluate_findings", "scoreboard", "summarize"),
    "gradients": ("find_models", "plot_gradient_entries", "plot_update_bound"),
    "spectrum": ("mean_ci", "plot_spectrum", "spectrum_table"),
    "stats": ("anova_table", "holm", "knob_table", "mixed_model", "paired_comparisons", "seed_variance"),
    "synthetic": ("SyntheticEffects", "synthetic_results"),
    "table": ("load_results", "notebook_out_dir", "prepare_results"),
    "toy": ("fit_student", "fit_student_result", "kl_gradients", "teacher_probs", "teaching_figure", "teaching_scene"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
