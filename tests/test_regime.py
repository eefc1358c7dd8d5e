"""The regime check's rules (kdlab.analysis.regime) on constructed results tables: met, not met,
not measured (missing cells, one rate), and the scoreboard notes of verdicts that rest on a role."""
import math

import pandas as pd
import pytest

from kdlab.analysis import regime as G
from kdlab.analysis.table import prepare_results

LO, HI = 2e-4, 1e-3


def table(gain=None, forget=None, tasks=("kb-mc",), seeds=(0, 1, 2), drop=()):
    """Runs of the main grid: accuracy = base + gain[(policy, kl, lr)] points, forgetting =
    forget[(policy, kl, lr)] points (defaults: a regime that meets every role)."""
    gain = gain or {}
    forget = forget or {}
    rows = []
    for task in tasks:
        for policy in ("off", "on"):
            for kl in ("forward", "reverse"):
                for lr in (LO, HI):
                    if (task, policy, kl, lr) in drop:
                        continue
                    for seed in seeds:
                        g = gain.get((policy, kl, lr), 30.0 if kl == "forward" else 5.0)
                        f = forget.get((policy, kl, lr), -1.0 if lr == LO else -12.0)
                        rows.append({"task": task, "policy": policy, "kl": kl, "lr": lr, "seed": seed, "lam": None,
                                     "dtype": "bf16", "grad_clip": 1.0, "base_accuracy": 0.2,
                                     "accuracy": 0.2 + g / 100 + 0.001 * seed, "forgetting": f / 100,
                                     "collapsed": False})
    return prepare_results(pd.DataFrame(rows))


def status(check, task, role):
    return check.set_index(["task", "role"]).loc[(task, role), "status"]


def test_a_regime_like_the_papers_meets_every_role():
    check = G.regime_check(table(tasks=("kb-mc", "rules-mc")))
    assert len(check) == 6 and set(check["status"]) == {G.MET}
    row = check.set_index(["task", "role"]).loc[("kb-mc", G.HIGH_BAND)]
    assert row["min"] == pytest.approx(-12.0) and row["max"] == pytest.approx(-12.0)
    assert G.unmet_roles(check, G.ROLES) == {}


@pytest.mark.parametrize("gain,forget,role", [
    ({("on", "forward", LO): 9.0}, {}, G.LEARNS),  # on-policy forward KL underfits at the low rate
    ({("off", "forward", HI): 2.0}, {}, G.LEARNS),  # the high rate does not learn
    ({}, {("off", "reverse", HI): -40.0}, G.HIGH_BAND),  # the high rate wipes out the probes
    ({}, {("on", "forward", HI): -1.0}, G.HIGH_BAND),  # ... or forgets nothing visible
    ({}, {("on", "reverse", LO): -3.5}, G.LOW_SMALL),  # the low rate forgets
])
def test_each_role_fails_on_its_own_cell(gain, forget, role):
    check = G.regime_check(table(gain, forget))
    assert status(check, "kb-mc", role) == G.NOT_MET
    assert {r for r in G.ROLES if status(check, "kb-mc", r) == G.MET} == set(G.ROLES) - {role}


def test_reverse_kl_that_does_not_learn_breaks_no_role():
    check = G.regime_check(table({("off", "reverse", LO): 0.0, ("on", "reverse", HI): -2.0}))
    assert set(check["status"]) == {G.MET}


def test_boundaries_are_inclusive():
    check = G.regime_check(table({("off", "forward", LO): G.LEARN_GAIN}, {("off", "forward", HI): G.HIGH_FORGET_BAND[0],
                                                                         ("on", "forward", LO): -G.LOW_FORGET_MAX}))
    assert set(check["status"]) == {G.MET}


def test_missing_cells_and_a_single_rate_are_not_measured():
    check = G.regime_check(table(drop={("kb-mc", "on", "forward", HI)}))
    assert status(check, "kb-mc", G.LEARNS) == G.NOT_MEASURED
    assert "on/forward high" in check.set_index(["task", "role"]).loc[("kb-mc", G.LEARNS), "measured"]
    assert status(check, "kb-mc", G.HIGH_BAND) == G.NOT_MEASURED and status(check, "kb-mc", G.LOW_SMALL) == G.MET
    one = table()
    check = G.regime_check(one[one["lr"] == LO])
    assert set(check["status"]) == {G.NOT_MEASURED} and math.isnan(check["min"].iloc[0])
    assert G.regime_check(one.iloc[0:0]).empty


def test_only_the_main_grid_counts():
    df = table()
    extra = df[df["policy"] == "off"].assign(policy="lambda", lam=0.0, forgetting=-0.9)
    unclipped = df.assign(grad_clip=float("nan"), forgetting=-0.9)
    assert set(G.regime_check(pd.concat([df, extra, unclipped]))["status"]) == {G.MET}


def test_scoreboard_rows_name_the_unmet_roles_they_rest_on():
    check = G.regime_check(table({("on", "forward", LO): 0.0}, {("off", "forward", HI): -50.0},
                                 tasks=("kb-mc", "rules-mc")))
    board = pd.DataFrame({"label": ["1", "3", "3a", "4", "5", "5a", "5b", "6", "11"],
                          "verdict": ["inconclusive", "1 of 2", "reproduced", "reproduced", "0 of 2", "not reproduced",
                                      "not reproduced", "reproduced", "not run"]})
    notes = dict(zip(board["label"], G.regime_notes(board, check)))
    assert notes["1"] == f"rests on unmet roles: {G.SHORT[G.LEARNS]} (not met: kb-mc, rules-mc)"
    assert notes["3a"] == f"rests on unmet roles: {G.SHORT[G.HIGH_BAND]} (not met: kb-mc, rules-mc)"
    assert notes["4"] == "" and notes["6"] == "" and notes["11"] == ""  # no role; not run
    assert notes["5a"].startswith(f"rests on unmet roles: {G.SHORT[G.LEARNS]}") and G.SHORT[G.LOW_SMALL] not in notes["5"]
    assert notes["5b"] == ""  # the low rate forgets nothing here: 5b rests on that role only
    met = G.regime_check(table())
    assert set(G.regime_notes(board, met)) == {""}


def test_the_report_table_marks_each_role():
    check = G.regime_check(table({("off", "forward", HI): 2.0}, tasks=("kb-mc",)))
    t = G.regime_table(check)
    assert list(t.columns) == list(G.ROLES) and list(t.index) == ["kb-mc"]
    assert t.loc["kb-mc", G.LEARNS] == "✘ not met (+2.1 to +30.1)"  # seed means: +0.1 from the seeds
    assert t.loc["kb-mc", G.LOW_SMALL] == "✔ met (-1.0)"


def test_the_low_rate_is_the_smallest_that_reaches_its_plateau_within_the_budget():
    rows = []
    # task A: 1e-4 still climbing at 150 steps (30% vs 50% at 600), 2e-4 within one SE, 4e-4 above it
    for lr, short, long_ in ((1e-4, 0.30, 0.50), (2e-4, 0.47, 0.49), (4e-4, 0.52, 0.50)):
        for seed in (100, 101):
            rows += [{"task": "A", "lr": lr, "steps": 150, "seed": seed, "accuracy": short, "forgetting": -0.01},
                     {"task": "A", "lr": lr, "steps": 600, "seed": seed, "accuracy": long_, "forgetting": -0.02}]
    # task B: never within one SE (needs larger rates)
    rows += [{"task": "B", "lr": 1e-4, "steps": s, "seed": 100, "accuracy": a, "forgetting": 0.0}
             for s, a in ((150, 0.2), (600, 0.6))]
    cal = G.rate_calibration(pd.DataFrame(rows), budget=150, n_test=200)
    a = cal[cal["task"] == "A"].set_index("lr")
    se = 100 * math.sqrt(0.49 * 0.51 / 400)
    assert a.loc[2e-4, "se"] == pytest.approx(se) and a.loc[2e-4, "accuracy 600"] == pytest.approx(49.0)
    assert a["plateau"].tolist() == [False, True, True]
    assert G.low_rates(cal) == {"A": 2e-4, "B": None}
    assert a.loc[2e-4, "seeds"] == "100,101" and a.loc[2e-4, "forgetting 150"] == pytest.approx(-1.0)
