"""The regime check: does a study's toy regime play the three roles the paper's regime plays?

The paper's findings are read off a regime with three roles (STUDY.md, issue 40):

1. **learns at both rates**: forward KL learns the task at the low and at the high learning rate
   (every forward-KL cell, OffPD and OnPD, gains at least ``LEARN_GAIN`` points of held-out
   accuracy over the student base, seed means);
2. **high-rate forgetting in a working band**: the high rate forgets visibly but leaves a working
   model (every policy x KL cell's seed-mean forgetting at the high rate within
   ``HIGH_FORGET_BAND`` points of mean probe score; the paper's is 11-14 points);
3. **low-rate forgetting small**: the low rate forgets at most ``LOW_FORGET_MAX`` points in every
   policy x KL cell (the paper's: at most 1.3 points).

``regime_check`` measures each role per task on a results table (main grid: off/on x
forward/reverse with clipping; low / high = the table's smallest / largest ``lr``) and marks it
"met", "not met" or "not measured" (a cell it needs is missing). ``FINDING_ROLES`` says which
roles each finding's verdict rests on, and ``regime_notes`` writes, per scoreboard row, the roles
that row rests on that are not met (or not measured), with their tasks: the mark the scoreboard
shows next to the verdict. Pure functions of tables: nothing here trains or samples.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from .table import lr_levels, main_grid

LEARNS = "learns at both rates"
HIGH_BAND = "high-rate forgetting in a working band"
LOW_SMALL = "low-rate forgetting small"
ROLES = (LEARNS, HIGH_BAND, LOW_SMALL)
SHORT = {LEARNS: "learns", HIGH_BAND: "high-rate band", LOW_SMALL: "low-rate forgetting"}  # in scoreboard notes
MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"

LEARN_GAIN = 10.0  # points of held-out accuracy over the base, every forward-KL cell at each rate
HIGH_FORGET_BAND = (-25.0, -3.0)  # points of mean probe score at the high rate: visible, still working
LOW_FORGET_MAX = 3.0  # points of mean probe score the low rate may lose, every cell
POLICIES, KLS = ("off", "on"), ("forward", "reverse")

RULES = {
    LEARNS: f"every forward-KL cell (OffPD, OnPD) at the low and the high rate gains >= {LEARN_GAIN:g} points "
            "of held-out accuracy over the base (seed means)",
    HIGH_BAND: f"every policy x KL cell's forgetting at the high rate within [{HIGH_FORGET_BAND[0]:g}, "
               f"{HIGH_FORGET_BAND[1]:g}] points of mean probe score (visible, still a working model)",
    LOW_SMALL: f"every policy x KL cell's forgetting at the low rate >= -{LOW_FORGET_MAX:g} points",
}

# The roles each finding's verdict rests on (a part label, e.g. "5b", overrides its finding's).
# Findings 4 (sparsity) and 6 (the gradient experiment) measure updates and gradients, which the
# roles do not condition.
FINDING_ROLES: dict[str, tuple[str, ...]] = {
    "1": (LEARNS,), "2": (LEARNS,), "3": (HIGH_BAND, LOW_SMALL), "4": (), "5": (LEARNS, LOW_SMALL),
    "5a": (LEARNS,), "5b": (LOW_SMALL,), "6": (), "7": (LEARNS,), "8": (LEARNS,), "9": (LEARNS,),
    "10": (LEARNS,), "11": (LEARNS,), "12": (LEARNS,), "13": (LEARNS, HIGH_BAND),
}


def _cell_means(d: pd.DataFrame, column: str) -> pd.Series:
    """Seed means of ``column`` per (policy, kl, lr) cell."""
    return d.groupby(["policy", "kl", "lr"])[column].mean()


def _get(means: pd.Series, key: tuple) -> float:
    return float(means[key]) if key in means.index and pd.notna(means[key]) else math.nan


def _role(task: str, role: str, values: dict[str, float], ok: bool | None, measured: str) -> dict:
    status = NOT_MEASURED if ok is None else (MET if ok else NOT_MET)
    return {"task": task, "role": role, "status": status, "measured": measured,
            "min": min(values.values()) if values and ok is not None else math.nan,
            "max": max(values.values()) if values and ok is not None else math.nan, "rule": RULES[role]}


def _missing(values: dict[str, float]) -> list[str]:
    return [k for k, v in values.items() if not math.isfinite(v)]


def regime_check(df: pd.DataFrame) -> pd.DataFrame:
    """One row per task x role (``ROLES``): task, role, status (met / not met / not measured),
    measured (the cell values in points, or what is missing), min and max of those values (points)
    and the rule. ``df``: a results table (``kdlab.analysis.table.prepare_results``); only its
    main grid counts; the low and high rates are its smallest and largest ``lr``."""
    g = main_grid(df)
    levels = lr_levels(g) if len(g) else None
    rows = []
    for task in sorted(g["task"].unique()) if len(g) else []:
        d = g[g["task"] == task]
        if levels is None:
            for role in ROLES:
                rows.append(_role(task, role, {}, None, "needs runs at two learning rates"))
            continue
        lo, hi = levels
        gain = _cell_means(d.assign(gain=(d["accuracy"] - d["base_accuracy"]) * 100.0), "gain")
        forget = _cell_means(d.assign(f=d["forgetting"] * 100.0), "f")
        learn = {f"{p}/forward {name}": _get(gain, (p, "forward", r)) for name, r in (("low", lo), ("high", hi))
                 for p in POLICIES}
        high = {f"{p}/{k}": _get(forget, (p, k, hi)) for p in POLICIES for k in KLS}
        low = {f"{p}/{k}": _get(forget, (p, k, lo)) for p in POLICIES for k in KLS}
        for role, values, rule in (
                (LEARNS, learn, lambda v: v >= LEARN_GAIN),
                (HIGH_BAND, high, lambda v: HIGH_FORGET_BAND[0] <= v <= HIGH_FORGET_BAND[1]),
                (LOW_SMALL, low, lambda v: v >= -LOW_FORGET_MAX)):
            missing = _missing(values)
            if missing:
                rows.append(_role(task, role, values, None, "missing cells: " + ", ".join(missing)))
                continue
            measured = "; ".join(f"{k} {v:+.1f}" for k, v in values.items())
            rows.append(_role(task, role, values, all(rule(v) for v in values.values()), measured))
    return pd.DataFrame(rows, columns=["task", "role", "status", "measured", "min", "max", "rule"])


def regime_table(check: pd.DataFrame) -> pd.DataFrame:
    """``regime_check`` as the report's first table: one row per task, one column per role, each
    cell "met" / "not met" / "not measured" with the range of its cells in points."""
    def cell(r: pd.Series) -> str:
        if r["status"] == NOT_MEASURED:
            return f"not measured ({r['measured']})"
        span = f"{r['min']:+.1f}" if np.isclose(r["min"], r["max"]) else f"{r['min']:+.1f} to {r['max']:+.1f}"
        return f"{'✔' if r['status'] == MET else '✘'} {r['status']} ({span})"
    if check.empty:
        return pd.DataFrame(columns=list(ROLES))
    table = check.assign(cell=check.apply(cell, axis=1)).pivot(index="task", columns="role", values="cell")
    return table[[r for r in ROLES if r in table.columns]]


def unmet_roles(check: pd.DataFrame, roles: Sequence[str]) -> dict[str, list[str]]:
    """For each of ``roles`` that some task does not meet (or does not measure), the status and
    tasks: {"learns at both rates": ["not met: kb-mc, rules-mc"]}; {} when all are met."""
    out: dict[str, list[str]] = {}
    for role in roles:
        rows = check[check["role"] == role]
        for status in (NOT_MET, NOT_MEASURED):
            tasks = sorted(rows.loc[rows["status"] == status, "task"])
            if tasks:
                out.setdefault(role, []).append(f"{status}: {', '.join(tasks)}")
    return out


def roles_of(label: str, finding_roles: Mapping[str, tuple[str, ...]] = FINDING_ROLES) -> tuple[str, ...]:
    """The roles a scoreboard row rests on: its part's entry ("5b"), else its finding's ("5")."""
    label = str(label)
    if label in finding_roles:
        return finding_roles[label]
    return finding_roles.get(label.rstrip("abcdefghijklmnopqrstuvwxyz"), ())


def regime_notes(board: pd.DataFrame, check: pd.DataFrame) -> pd.Series:
    """Per scoreboard row (its ``label``), the roles it rests on that are not met or not measured:
    "rests on unmet roles: low-rate forgetting (not met: rules-mc)" (the roles' ``SHORT`` names,
    Table 1's columns in full); "" when every role it
    rests on is met, when it rests on none, and for a finding that was not run."""
    def note(row: pd.Series) -> str:
        if row.get("verdict") == "not run":
            return ""
        unmet = unmet_roles(check, roles_of(row["label"]))
        if not unmet:
            return ""
        return "rests on unmet roles: " + "; ".join(f"{SHORT[role]} ({', '.join(v)})" for role, v in unmet.items())
    if board.empty:
        return pd.Series([], dtype=str)
    return board.apply(note, axis=1).astype(str)


# ------------------------------------------------------------------ calibrating the rates by role

HIGH_TO_LOW = 5.0  # the paper's ratio of its high to its low learning rate


def rate_calibration(runs: pd.DataFrame, budget: int, n_test: int) -> pd.DataFrame:
    """The rate calibration table of the baseline arm (OffPD + forward KL), from its runs: columns
    task, lr, steps, seed, accuracy (a fraction on ``n_test`` held-out problems), forgetting.

    One row per task x lr: the seed-mean accuracy after ``budget`` steps and after the longest run
    (``4 x budget`` in the calibration), the standard error of the latter (binomial, over the
    ``n_test x seeds`` graded answers), ``plateau`` = the budget's accuracy is within one standard
    error of the long run's (or above it), the budget's forgetting, and the seeds; percentage points."""
    rows = []
    for (task, lr), d in runs.groupby(["task", "lr"], sort=True):
        short, long_ = d[d["steps"] == budget], d[d["steps"] == d["steps"].max()]
        if short.empty or long_.empty or long_["steps"].iloc[0] <= budget:
            continue
        p_long = float(long_["accuracy"].mean())
        se = math.sqrt(max(p_long * (1 - p_long), 1e-12) / (n_test * len(long_)))
        p_short = float(short["accuracy"].mean())
        rows.append({"task": task, "lr": float(lr), f"accuracy {budget}": 100 * p_short,
                     f"accuracy {int(long_['steps'].iloc[0])}": 100 * p_long, "se": 100 * se,
                     "plateau": bool(p_short >= p_long - se),
                     f"forgetting {budget}": 100 * float(short["forgetting"].mean()),
                     "seeds": ",".join(str(s) for s in sorted(set(short["seed"]) & set(long_["seed"])))})
    return pd.DataFrame(rows, columns=None if rows else ["task", "lr", "plateau"])


def low_rates(calibration: pd.DataFrame) -> dict[str, float | None]:
    """Per task, the smallest calibrated rate whose budget run reaches its plateau (``plateau``);
    None where no rate tried does (the calibration needs larger rates)."""
    out: dict[str, float | None] = {}
    for task, d in calibration.groupby("task", sort=True):
        ok = d[d["plateau"]]
        out[task] = float(ok["lr"].min()) if len(ok) else None
    return out
