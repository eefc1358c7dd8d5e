"""How much power a scoreboard part has: its interval against the distance its verdict must clear.

A part decided by an interval (``findings._part``: the claim is ``statistic > threshold`` or
``statistic < threshold``; its rule, the scoreboard's ``test``, begins "95% interval") is decided
exactly when the interval excludes the threshold. With the interval's half on the threshold's side,

    half  = statistic - ci_low    (threshold below the statistic)
            ci_high - statistic   (threshold above it)
    need  = |statistic - threshold|   (the margin the verdict uses, seen from the estimate)

the part is decided when ``half < need`` and inconclusive otherwise. A direction claim with a
smallest effect of interest (the scoreboard's ``negligible``, ``findings.NEGLIGIBLE``) has a second
way to be decided: "not reproduced" once its interval lies entirely on the estimate's side of the
edge ``threshold + negligible`` (``threshold - negligible`` for a "below" claim), i.e. the other
half of the interval against the distance from the estimate to that edge. An inconclusive part's
power is then the nearer of the two. Intervals shrink as one over
the square root of the data behind them (seeds for the cell-means model, evaluation problems for
the binomial one), so an inconclusive part whose estimate stays where it is needs about
``(half / need) ** 2`` times its data to be decided (``factor``); an estimate on the bound
(``need`` 0) is decided by no amount of data, and says so. A part decided by another rule
(a bound checked on every entry or a counterexample, 6a-c; the bootstrap share of replicates,
11b) or not run gets no power figure; an occasional event with none observed (8c, collapses)
says that more runs may show one.

Pure functions of a scoreboard table (``findings.SCOREBOARD_COLUMNS``); no training, no sampling.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

INTERVAL_RULE = "95% interval"  # how an interval-decided part's rule (scoreboard column ``test``) begins
ON_THE_BOUND = 1e-12  # |statistic - threshold| below this is "on the bound"
MAX_FACTOR = 100.0  # factors above this are written "> 100x"
POWER_COLUMNS = ["half_width", "needed", "factor", "power"]


def _num(row: Mapping[str, Any], key: str) -> float:
    v = row.get(key)
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def part_power(row: Mapping[str, Any]) -> dict[str, Any]:
    """The power of one scoreboard part ``row`` (a mapping with statistic, ci_low, ci_high,
    threshold, unit, method, verdict): ``half_width`` (the interval's half on the threshold's
    side), ``needed`` (|statistic - threshold|), ``factor`` (the multiple of the data an
    inconclusive part needs, ``(half / need) ** 2``; 1 for a decided part; inf on the bound) and
    ``power``, the line the report prints next to the verdict, in the statistic's unit (shares in
    points): "±1.2 < 3.4" (decided), "±4.1 ≥ 1.2, ≈12× data" (inconclusive), "±0.3, on the bound"
    (no amount of data decides it), "none seen yet" (an occasional event), "" where no power
    figure applies."""
    none = {"half_width": math.nan, "needed": math.nan, "factor": math.nan, "power": ""}
    stat, lo, hi, thr, small = (_num(row, k) for k in ("statistic", "ci_low", "ci_high", "threshold", "negligible"))
    if str(row.get("verdict")) == "inconclusive" and str(row.get("method")) == "wilson" and stat == 0:
        return none | {"power": "none seen yet"}  # an occasional event (8c, collapses)
    if not str(row.get("test") or "").startswith(INTERVAL_RULE) or str(row.get("verdict")) == "not run":
        return none
    if any(math.isnan(x) for x in (stat, lo, hi, thr)) or lo > hi:
        return none
    routes = [(max((stat - lo) if thr <= stat else (hi - stat), 0.0), abs(stat - thr))]  # (half, need) to the bound
    if math.isfinite(small) and small > 0:
        above = "above" in str(row.get("test") or "").split(";")[0]  # the claim: statistic above the threshold
        edge = thr + small if above else thr - small
        if (stat < edge) if above else (stat > edge):  # the estimate is inside the negligible band
            routes.append((max(hi - stat if above else stat - lo, 0.0), abs(edge - stat)))
    half, need = min(routes, key=lambda r: (r[0] / r[1]) if r[1] >= ON_THE_BOUND else math.inf)
    scale = 100.0 if str(row.get("unit") or "") == "share" else 1.0  # shares are read in points
    h, n = f"{half * scale:.2g}", f"{need * scale:.2g}"
    if need < ON_THE_BOUND:
        return {"half_width": half, "needed": need, "factor": math.inf,
                "power": f"±{h}, on the bound"}
    if half < need:
        return {"half_width": half, "needed": need, "factor": 1.0, "power": f"±{h} < {n}"}
    factor = (half / need) ** 2
    times = f"> {MAX_FACTOR:.0f}×" if factor > MAX_FACTOR else f"≈{factor:.2g}×"
    return {"half_width": half, "needed": need, "factor": factor, "power": f"±{h} ≥ {n}, {times} data"}


def power_table(board: pd.DataFrame) -> pd.DataFrame:
    """``POWER_COLUMNS`` for every row of a scoreboard (the findings' own rows, part "", get none:
    no part speaks for the others), in the board's index."""
    part = board["part"].fillna("").astype(str) if "part" in board.columns else pd.Series("x", index=board.index)
    rows = [part_power(r) if p else part_power({}) for p, r in zip(part, board.to_dict(orient="records"))]
    return pd.DataFrame(rows, index=board.index, columns=POWER_COLUMNS)


def add_power(board: pd.DataFrame) -> pd.DataFrame:
    """The scoreboard with ``POWER_COLUMNS`` added (replacing any already there)."""
    table = power_table(board)
    return board.drop(columns=[c for c in POWER_COLUMNS if c in board.columns]).join(table)


def inconclusive_power(board: pd.DataFrame) -> pd.DataFrame:
    """The inconclusive parts of a scoreboard with their power (label, claim, statistic, interval,
    half_width, needed, factor, power), largest factor first: what it takes to decide each."""
    b = add_power(board)
    part = b["part"].fillna("").astype(str)
    rows = b[(part != "") & (b["verdict"] == "inconclusive")]
    cols = ["label", "claim", "statistic", "ci_low", "ci_high", "threshold", *POWER_COLUMNS]
    return rows[cols].sort_values("factor", ascending=False, kind="stable").reset_index(drop=True)
