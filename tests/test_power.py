"""The power of a scoreboard part (kdlab.analysis.power): interval half-width against the distance
its verdict must clear, checked against the findings' own verdict rules and a closed form."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sstats

from kdlab.analysis import findings, power
from kdlab.analysis.findings import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Estimate


def _row(stat, lo, hi, thr, verdict="inconclusive", unit="points", method="bootstrap", part="a"):
    return {"statistic": stat, "ci_low": lo, "ci_high": hi, "threshold": thr, "verdict": verdict, "unit": unit,
            "method": method, "part": part, "test": f"95% interval ({method}) above {thr}"}


def test_decided_exactly_when_the_findings_rule_decides():
    """On random intervals, 'decided' (factor 1) is the same event as the findings' rules giving a
    verdict other than inconclusive, for both directions of a claim."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        stat, thr = rng.normal(0, 3), rng.normal(0, 3)
        lo, hi = stat - abs(rng.normal(0, 3)), stat + abs(rng.normal(0, 3))
        for decide in (findings.decide_greater, findings.decide_less):
            verdict = decide(Estimate(stat, lo, hi), thr)
            p = power.part_power(_row(stat, lo, hi, thr, verdict))
            assert (p["factor"] == 1.0) == (verdict != INCONCLUSIVE), (stat, lo, hi, thr, verdict, p)
            assert p["needed"] == pytest.approx(abs(stat - thr))


def test_factor_is_the_data_that_brings_the_half_width_to_the_distance():
    """A t interval of a mean of n seeds: after factor x n seeds (same mean and SD) its half-width
    equals the distance to the bound (large n, where t ~ z: the factor's 1/sqrt(n) law)."""
    sd, n, mean, thr = 4.0, 400, 0.3, 0.0
    half = sstats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    p = power.part_power(_row(mean, mean - half, mean + half, thr))
    assert p["half_width"] == pytest.approx(half) and p["factor"] == pytest.approx((half / mean) ** 2)
    n2 = n * p["factor"]
    assert sstats.t.ppf(0.975, n2 - 1) * sd / math.sqrt(n2) == pytest.approx(mean, rel=2e-3)


def test_the_half_on_the_bounds_side_counts():
    """An asymmetric interval: only the side facing the bound matters."""
    p = power.part_power(_row(5.0, 4.0, 20.0, 0.0, REPRODUCED))  # bound below: half = 5 - 4
    assert p["half_width"] == 1.0 and p["power"] == "±1 < 5"
    p = power.part_power(_row(5.0, 4.0, 20.0, 10.0))  # bound above: half = 20 - 5 = 15 vs 5
    assert p["half_width"] == 15.0 and p["factor"] == pytest.approx(9.0)
    assert p["power"] == "±15 ≥ 5, ≈9× data"


def test_lines_for_the_special_cases():
    share = power.part_power(_row(0.4, 0.2, 0.6, 0.5, unit="share"))  # shares read in points
    assert share["power"] == "±20 ≥ 10, ≈4× data"
    bound = power.part_power(_row(0.5, 0.2, 0.8, 0.5, unit="share"))
    assert math.isinf(bound["factor"]) and "on the bound" in bound["power"]
    none_seen = power.part_power(_row(0.0, 0.0, 0.3, 0.0, unit="share", method="wilson") | {"test": "Wilson ..."})
    assert none_seen["power"] == "none seen yet" and math.isnan(none_seen["factor"])
    huge = power.part_power(_row(0.01, -5.0, 5.0, 0.0))
    assert "> 100×" in huge["power"]
    for row in (_row(0.9, 0.9, 0.9, 0.95, method="bootstrap share") | {"test": ">= 0.95 of the bootstrap replicates"},
                _row(0.9, 0.9, 0.9, 1.0, REPRODUCED, method="max over entries") | {"test": "every entry <= 1"},
                _row(math.nan, math.nan, math.nan, math.nan, verdict="not run", method=""),
                _row(1.0, math.nan, 2.0, 0.0)):
        assert power.part_power(row)["power"] == "" and math.isnan(power.part_power(row)["factor"])


@pytest.mark.parametrize("case", sorted(k for k in __import__("test_findings_parts").PART_CASES))
def test_every_part_of_the_scoreboard_gets_the_power_its_verdict_implies(case):
    """Each constructed case of every part (test_findings_parts.PART_CASES): a decided part's power
    line says decided, an inconclusive one says what it needs; finding lines get none."""
    from test_findings_parts import PART_CASES

    label, verdict = case
    df, gradients = PART_CASES[case]()
    board = power.add_power(findings.scoreboard(df, gradients))
    assert set(power.POWER_COLUMNS) <= set(board.columns)
    assert (board.loc[board["part"] == "", "power"] == "").all()
    row = board.set_index("label").loc[label]
    assert row["verdict"] == verdict
    if row["power"] == "":
        assert not str(row["test"]).startswith(power.INTERVAL_RULE) or row["verdict"] == "not run"
    elif verdict in (REPRODUCED, NOT_REPRODUCED):
        assert row["factor"] == 1.0 and " < " in row["power"], row.to_dict()
    else:
        assert not row["factor"] == 1.0 and ("× data" in row["power"] or "bound" in row["power"]
                                            or row["power"] == "none seen yet"), row.to_dict()


def test_inconclusive_power_lists_the_weakest_first():
    board = pd.DataFrame([_row(1.0, -3.0, 5.0, 0.0) | {"label": "2a", "claim": "x"},
                          _row(1.0, -1.0, 3.0, 0.0) | {"label": "2b", "claim": "y"},
                          _row(4.0, 3.0, 5.0, 0.0, REPRODUCED) | {"label": "2c", "claim": "z"},
                          _row(math.nan, math.nan, math.nan, math.nan, "", part="") | {"label": "2", "claim": "w"}])
    weak = power.inconclusive_power(board)
    assert list(weak["label"]) == ["2a", "2b"] and list(weak["factor"]) == [16.0, 4.0]


def test_report_view_shows_the_power_beside_the_verdict(tmp_path):
    from kdlab.study import report_page as P
    from test_findings_parts import _noisy

    out = tmp_path / "analysis" / "70_statistics"
    out.mkdir(parents=True)
    power.add_power(findings.scoreboard(_noisy())).to_csv(out / "scoreboard.csv", index=False)
    view = P.scoreboard_view(tmp_path)
    assert list(view.columns) == ["claim (STUDY.md)", "verdict", "statistic", "95% interval", "power"]
    assert view.loc["1", "verdict"] == "? inconclusive" and "× data" in view.loc["1", "power"]
    assert view.loc["2", "power"] == ""  # a compound finding's line: its parts speak


def _neg_row(stat, lo, hi, thr, small, rule, verdict):
    side = {"greater": "above", "less": "below"}[rule]
    return _row(stat, lo, hi, thr, verdict) | {"negligible": small, "test": f"95% interval (bootstrap) {side} {thr}; ..."}


def test_with_a_smallest_effect_decided_exactly_when_the_rule_decides():
    """A direction claim with a smallest effect of interest has two ways to be decided (the bound,
    and the edge bound +/- negligible); on random intervals the power says 'decided' exactly when
    the findings' rules give a verdict, and an inconclusive part's factor is the nearer route's."""
    rng = np.random.default_rng(1)
    for _ in range(2000):
        stat, thr, small = rng.normal(0, 3), rng.normal(0, 1), abs(rng.normal(0, 3))
        lo, hi = stat - abs(rng.normal(0, 3)), stat + abs(rng.normal(0, 3))
        for rule, decide in (("greater", findings.decide_greater), ("less", findings.decide_less)):
            verdict = decide(Estimate(stat, lo, hi), thr, small)
            p = power.part_power(_neg_row(stat, lo, hi, thr, small, rule, verdict))
            assert (p["factor"] == 1.0) == (verdict != INCONCLUSIVE), (rule, stat, lo, hi, thr, small, verdict, p)
            if verdict == INCONCLUSIVE and math.isfinite(p["factor"]):
                edge = thr + small if rule == "greater" else thr - small
                to_bound = ((stat - lo) if thr <= stat else (hi - stat)) / abs(stat - thr)
                inside = (stat < edge) if rule == "greater" else (stat > edge)
                to_edge = ((hi - stat) if rule == "greater" else (stat - lo)) / abs(edge - stat) if inside else math.inf
                assert p["factor"] == pytest.approx(min(to_bound, to_edge) ** 2)


def test_a_near_zero_effect_is_decided_by_the_edge():
    """0.2 [-1, 1.4] against 0 with a 3-point smallest effect: not reproduced, decided by the edge
    (half 1.2 against 2.8 to the edge 3); 0.2 [-2, 4]: the edge route (3.8 against 2.8) is nearer
    than the bound's (2.2 against 0.2)."""
    decided = power.part_power(_neg_row(0.2, -1.0, 1.4, 0.0, 3.0, "greater", NOT_REPRODUCED))
    assert decided["factor"] == 1.0 and decided["power"] == "±1.2 < 2.8"
    open_ = power.part_power(_neg_row(0.2, -2.0, 4.0, 0.0, 3.0, "greater", INCONCLUSIVE))
    assert open_["half_width"] == pytest.approx(3.8) and open_["needed"] == pytest.approx(2.8)
    assert open_["factor"] == pytest.approx((3.8 / 2.8) ** 2)
