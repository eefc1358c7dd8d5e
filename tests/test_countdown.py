"""Tests for kdlab.tasks.countdown: verifier, solvers, generation, traces and the task."""
from __future__ import annotations

import itertools
import json
import random
import re
import time
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import pytest

from kdlab.tasks import countdown
from kdlab.tasks.base import SPLITS, split_of
from kdlab.tasks.countdown import (DFS_VARIANTS, TRACE_STYLES, VARIANTS, CountdownTask, dfs_steps, dfs_text,
                                   expression_from_steps, generate, max_completion_chars, solutions, solve, verify)

REPO_ROOT = Path(__file__).resolve().parents[1]
EVAL_FILE = REPO_ROOT.parent / "shared" / "data" / "countdown_3to4_eval.json"

VALUE = r"-?\d+(?:/\d+)?"
STEP = rf"{VALUE}[-+*/]{VALUE}={VALUE}"
STEPS = rf"{STEP}(?:,{STEP})*"
EXPR = r"[0-9+\-*/()]+"


# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _ordered_values(seq: tuple[int, ...]) -> frozenset[Fraction]:
    """All values of expressions with the numbers in this left-to-right order, every
    bracketing and operator choice (Fraction arithmetic, division by zero skipped)."""
    if len(seq) == 1:
        return frozenset({Fraction(seq[0])})
    out = set()
    for i in range(1, len(seq)):
        for a in _ordered_values(seq[:i]):
            for b in _ordered_values(seq[i:]):
                out.update((a + b, a - b, a * b))
                if b != 0:
                    out.add(a / b)
    return frozenset(out)


def brute_force_solvable(numbers: list[int], target: int) -> bool:
    """Every permutation x every bracketing x every operator: all expression trees."""
    return any(Fraction(target) in _ordered_values(perm) for perm in set(itertools.permutations(numbers)))


def parse_steps(text: str) -> list[tuple[Fraction, str, Fraction, Fraction]]:
    out = []
    for step in text.split(","):
        m = re.fullmatch(rf"({VALUE})([-+*/])({VALUE})=({VALUE})", step)
        assert m, f"bad step {step!r} in {text!r}"
        out.append((Fraction(m.group(1)), m.group(2), Fraction(m.group(3)), Fraction(m.group(4))))
    return out


def replay(numbers: list[int], steps: list[tuple], integer_only: bool = False) -> Fraction:
    """Check the steps consume available values with correct arithmetic; return the last value."""
    pool = [Fraction(n) for n in numbers]
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "/": lambda a, b: a / b}
    for a, op, b, r in steps:
        pool.remove(Fraction(a))  # ValueError when not available
        pool.remove(Fraction(b))
        assert ops[op](Fraction(a), Fraction(b)) == r, (a, op, b, r)
        if integer_only:
            assert Fraction(r).denominator == 1 and r >= 0, (a, op, b, r)
        pool.append(Fraction(r))
    assert len(pool) == 1
    return pool[0]


def fast(fn, *args) -> tuple[object, float]:
    """Result and best-of-3 wall time in seconds."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - start)
    return result, best


# ---------------------------------------------------------------------------------------------
# Shared external data
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eval_set() -> list[dict]:
    if not EVAL_FILE.exists():
        pytest.skip(f"shared Countdown eval data not found at {EVAL_FILE} (../shared absent)")
    return json.loads(EVAL_FILE.read_text())


def test_verify_accepts_every_reference_solution(eval_set):
    with_solution = [row for row in eval_set if row["solution"] is not None]
    assert len(with_solution) == 1981
    rejected = [row for row in with_solution if not verify(row["numbers"], row["target"], row["solution"])]
    assert rejected == []
    # The same solutions checked against a wrong target must fail.
    assert not any(verify(r["numbers"], str(int(r["target"]) + 1), r["solution"]) for r in with_solution[:200])


def test_solve_solves_every_eval_problem(eval_set):
    start = time.perf_counter()
    unsolved = []
    for row in eval_set:
        expr = solve(row["numbers"], int(row["target"]))
        if expr is None or not verify(row["numbers"], row["target"], expr):
            unsolved.append((row["id"], expr))
    elapsed = time.perf_counter() - start
    assert unsolved == []
    assert sum(row["solution"] is None for row in eval_set) == 19
    assert elapsed / len(eval_set) < 0.01, f"mean solve time {elapsed / len(eval_set):.4f}s"


# ---------------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "numbers, target, expression, expected",
    [
        ([12, 34, 56], 78, "(34+56)-12", True),
        ([12, 34, 56], "78", " ( 34 + 56 ) - 12 ", True),
        ([12, 34, 56], " 78 ", "34+56-12", True),
        ([96, 28, 32, 39], "15", "((96 / (28 - 32)) + 39)", True),  # negative intermediate
        ([7, 2, 2], 7, "7/2*2", True),  # fractional intermediate, left-associative
        ([2, 3, 4], 14, "2+3*4", True),  # precedence
        ([2, 3, 4], 20, "2+3*4", False),
        ([8, 4, 2], 2, "8-4-2", True),
        ([8, 4, 2], 6, "8-4-2", False),
        ([8, 4, 2], 1, "8/4/2", True),
        ([8, 4, 2], 4, "8/4/2", False),
        ([5, 5], 10, "5+5", True),
        ([0, 5], 5, "5+0", True),
        ([1, 2, 3], -4, "1-2-3", True),
    ],
)
def test_verify_accepts_and_evaluates(numbers, target, expression, expected):
    assert verify(numbers, target, expression) is expected


NESTED_10K = "(" * 10_000 + "1+2" + ")" * 10_000
HOSTILE = [
    ("missing number", [1, 2, 3], 3, "1+2"),
    ("extra number", [1, 2], 6, "1+2+3"),
    ("repeated number", [2, 3], 4, "2+2"),
    ("number used twice", [2, 3], 7, "2+3+2"),
    ("wrong value", [1, 2, 3], 7, "1+2+3"),
    ("division by zero", [3, 5, 5], 3, "3/(5-5)"),
    ("division by zero times zero", [5, 5, 4], 0, "(5-5)/(4-4)+0*5"),
    ("unary minus", [1, 2, 3], 4, "-1+2+3"),
    ("unary minus inside", [1, 2, 3], 4, "2-(-1)+3"),
    ("unary plus", [1, 2], 3, "+1+2"),
    ("power", [2, 3], 8, "2**3"),
    ("letters", [1, 2], 3, "1+2a"),
    ("import", [1], 1, "__import__('os').system('x')"),
    ("tower", [9, 9, 9], 9, "9**9**9"),
    ("nested 10k", [1, 2], 3, NESTED_10K),
    ("nested over depth limit", [1, 2], 3, "(" * 40 + "1+2" + ")" * 40),
    ("1 MB", [1, 2], 3, "1+2" + " " * 1_000_000),
    ("1 MB of terms", [1, 2], 3, "1+" * 500_000 + "2"),
    ("5000-digit literal", [9], 9, "9" * 5000),
    ("5000-digit literal sum", [1, 2], 3, "1" + "0" * 4999 + "+2"),
    ("900-digit literal", [1, 2], 3, "1" + "0" * 900 + "+2"),
    ("leading zero", [1, 2], 3, "01+2"),
    ("empty", [1, 2], 3, ""),
    ("empty parentheses", [1, 2], 3, "()+1+2"),
    ("unbalanced open", [1, 2], 3, "(1+2"),
    ("unbalanced close", [1, 2], 3, "1+2)"),
    ("adjacent numbers", [1, 2], 12, "1 2"),
    ("trailing operator", [1, 2], 3, "1+2+"),
    ("equals sign", [1, 2], 3, "1+2=3"),
    ("decimal point", [1, 2], 3, "1.0+2"),
    ("float target", [1, 2], "3.0", "1+2"),
    ("word target", [1, 2], "three", "1+2"),
    ("None target", [1, 2], None, "1+2"),
    ("non-string expression", [1, 2], 3, None),
    ("empty numbers", [], 0, "0"),
]


@pytest.mark.parametrize("why, numbers, target, expression", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_verify_rejects_fast(why, numbers, target, expression):
    result, seconds = fast(verify, numbers, target, expression)
    assert result is False, why
    assert seconds < 0.01, f"{why}: {seconds:.4f}s"


def test_verify_depth_limit_is_generous_enough():
    assert verify([1, 2], 3, "(" * 30 + "1+2" + ")" * 30)


# ---------------------------------------------------------------------------------------------
# solve and solutions
# ---------------------------------------------------------------------------------------------
def test_solve_agrees_with_brute_force():
    rng = random.Random(1234)
    cases = []
    for _ in range(300):
        cases.append(([rng.randint(1, 99) for _ in range(3)], rng.randint(10, 100)))
    for _ in range(60):
        # small numbers: many duplicates and zero intermediates
        cases.append(([rng.randint(1, 9) for _ in range(3)], rng.randint(0, 40)))
    for _ in range(40):
        cases.append(([rng.randint(1, 12) for _ in range(4)], rng.randint(0, 60)))
    for _ in range(15):
        cases.append(([rng.randint(1, 99) for _ in range(4)], rng.randint(10, 100)))
    solvable = 0
    for numbers, target in cases:
        expr = solve(numbers, target)
        assert (expr is not None) == brute_force_solvable(numbers, target), (numbers, target, expr)
        if expr is not None:
            solvable += 1
            assert verify(numbers, target, expr), (numbers, target, expr)
    assert 20 < solvable < len(cases)  # both outcomes exercised


def test_solve_known_cases_and_speed():
    assert solve([5], 5) == "5"
    assert solve([5], 6) is None
    assert solve([1, 1], 5) is None
    assert verify([3, 3, 8, 8], 24, solve([3, 3, 8, 8], 24))  # needs 8/(3-8/3)
    assert solve([2, 2, 2, 2], 97) is None
    rng = random.Random(7)
    draws = [([rng.randint(1, 99) for _ in range(4)], rng.randint(10, 100)) for _ in range(50)]
    start = time.perf_counter()
    for numbers, target in draws:
        solve(numbers, target)
    assert (time.perf_counter() - start) / len(draws) < 0.02


def test_solutions_integer_only_hand_enumerated():
    # Worked by hand: every distinct way to reach 6 from 1, 2, 3 with non-negative integers.
    expected = {
        ((2, "+", 1, 3), (3, "+", 3, 6)),
        ((2, "*", 1, 2), (3, "*", 2, 6)),
        ((2, "/", 1, 2), (3, "*", 2, 6)),
        ((3, "+", 1, 4), (4, "+", 2, 6)),
        ((3, "*", 1, 3), (3, "*", 2, 6)),
        ((3, "/", 1, 3), (3, "*", 2, 6)),
        ((3, "+", 2, 5), (5, "+", 1, 6)),
        ((3, "*", 2, 6), (6, "*", 1, 6)),
        ((3, "*", 2, 6), (6, "/", 1, 6)),
    }
    got = solutions([3, 1, 2], 6, integer_only=True)
    assert len(got) == len(expected)
    assert {tuple(seq) for seq in got} == expected
    assert solutions([5, 5], 10, integer_only=True) == [[(5, "+", 5, 10)]]
    assert solutions([5, 5], 0, integer_only=True) == [[(5, "-", 5, 0)]]
    assert solutions([5, 5], 0) == [[(5, "-", 5, 0)]]
    assert solutions([2, 4], 7) == []  # 6, 8, 2, -2, 2, 1/2 are all there is
    with pytest.raises(ValueError, match="target"):
        solutions([2, 4], "6")


def test_solutions_general_mode_is_consistent():
    rng = random.Random(99)
    checked = 0
    for _ in range(40):
        numbers = [rng.randint(1, 20) for _ in range(3)] + ([rng.randint(1, 20)] if checked % 2 else [])
        target = rng.randint(0, 50)
        general = solutions(numbers, target)
        integer = solutions(numbers, target, integer_only=True)
        assert bool(general) == (solve(numbers, target) is not None)
        for seq in integer:
            assert replay(numbers, seq, integer_only=True) == target
            assert all(a >= b for a, _, b, _ in seq)
        for seq in general:
            assert replay(numbers, seq) == target
            assert verify(numbers, target, expression_from_steps(numbers, seq))
            assert all(a >= b for a, op, b, _ in seq if op in "+*")
        assert len({tuple(s) for s in general}) == len(general)
        # Integer-only sequences are general ones too (same orientation rules).
        general_set = {tuple((Fraction(a), op, Fraction(b), Fraction(r)) for a, op, b, r in s) for s in general}
        assert all(tuple((Fraction(a), op, Fraction(b), Fraction(r)) for a, op, b, r in s) in general_set
                   for s in integer)
        checked += 1
    # A problem with only a fractional route: 8/(3-8/3) = 24.
    assert solutions([3, 3, 8, 8], 24, integer_only=True) == []
    general = solutions([3, 3, 8, 8], 24)
    assert general and all(any(Fraction(r).denominator > 1 for *_, r in seq) for seq in general)


def test_expression_from_steps_rejects_bad_steps():
    assert expression_from_steps([34, 56, 12], [(34, "+", 56, 90), (90, "-", 12, 78)]) == "34+56-12"
    assert expression_from_steps([34, 56, 12], [(56, "-", 34, 22), (12, "-", 22, -10)]) == "12-(56-34)"
    with pytest.raises(ValueError, match="not available"):
        expression_from_steps([1, 2], [(1, "+", 3, 4)])
    with pytest.raises(ValueError, match="!="):
        expression_from_steps([1, 2], [(1, "+", 2, 4)])
    with pytest.raises(ValueError, match="values left"):
        expression_from_steps([1, 2, 3], [(1, "+", 2, 3)])


# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------
KEY = re.compile(r"cd([34]):(\d+(?:,\d+)*)>(\d+)")
PROMPT = re.compile(r"c(\d+(?: \d+)*)>(\d+):")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_generate_is_deterministic_and_well_formed(variant):
    n = VARIANTS[variant]
    first = generate(n, 25, seed=3, variant=variant)
    assert first == generate(n, 25, seed=3, variant=variant)
    assert [p.data for p in first] == [p.data for p in generate(n, 25, seed=3, variant=variant)]
    other = generate(n, 25, seed=4, variant=variant)
    assert [p.key for p in first] != [p.key for p in other]
    assert len(first) == 25 and len({p.key for p in first}) == 25
    for p in first:
        numbers, target = p.data["numbers"], p.data["target"]
        assert p.task == variant
        m = KEY.fullmatch(p.key)
        assert m and int(m.group(1)) == n
        key_numbers = [int(x) for x in m.group(2).split(",")]
        assert key_numbers == sorted(numbers) and int(m.group(3)) == target
        pm = PROMPT.fullmatch(p.prompt)
        assert pm and [int(x) for x in pm.group(1).split()] == numbers and int(pm.group(2)) == target
        assert len(numbers) == n and all(1 <= x <= 99 for x in numbers) and 10 <= target <= 100
        assert verify(numbers, target, solve(numbers, target))
        if variant == "countdown-4e":
            # No signed sum of the numbers (at least one taken positively) hits the target.
            for signs in itertools.product((1, -1), repeat=n):
                if 1 in signs:
                    assert sum(s * x for s, x in zip(signs, numbers)) != target, (numbers, target)
    # Shown order is shuffled, not always sorted.
    assert any(p.data["numbers"] != sorted(p.data["numbers"]) for p in first)


def test_generate_splits_are_disjoint_and_consistent():
    keys: dict[str, set[str]] = {s: set() for s in SPLITS}
    for variant in sorted(VARIANTS):
        n = VARIANTS[variant]
        for seed in range(4):
            for split in SPLITS:
                problems = generate(n, 8, seed=seed, split=split, variant=variant)
                assert len(problems) == 8
                assert all(split_of(p.key) == split for p in problems)
                keys[split].update(p.key for p in problems)
    assert not keys["train"] & keys["validation"]
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    # A split's problems are the matching subsequence of the unfiltered stream.
    stream = generate(3, 60, seed=11)
    expected = [p for p in stream if split_of(p.key) == "validation"]
    assert expected and generate(3, len(expected), seed=11, split="validation") == expected


def test_generate_default_variant_and_errors():
    assert all(p.task == "countdown-4" for p in generate(4, 3, seed=0))
    assert generate(3, 0, seed=0) == []
    with pytest.raises(ValueError, match="countdown-5"):
        generate(4, 3, seed=0, variant="countdown-5")
    with pytest.raises(ValueError, match="n_numbers"):
        generate(3, 3, seed=0, variant="countdown-4e")
    with pytest.raises(ValueError, match="n_numbers"):
        generate(5, 3, seed=0)
    with pytest.raises(ValueError, match="split"):
        generate(3, 3, seed=0, split="dev")
    with pytest.raises(ValueError, match="count"):
        generate(3, -1, seed=0)


def test_countdown_4e_has_fewer_integer_only_solutions():
    def mean_and_none(variant: str) -> tuple[float, float]:
        counts = [len(solutions(p.data["numbers"], p.data["target"], integer_only=True))
                  for p in generate(4, 200, seed=0, variant=variant)]
        return sum(counts) / len(counts), sum(c == 0 for c in counts) / len(counts)

    plain_mean, plain_none = mean_and_none("countdown-4")
    hard_mean, hard_none = mean_and_none("countdown-4e")
    assert hard_mean < plain_mean
    assert hard_none > plain_none
    # The numbers stated in the module docstring.
    assert plain_mean == pytest.approx(8.055) and hard_mean == pytest.approx(2.77)
    assert (plain_none, hard_none) == (0.005, 0.02)


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------
def test_task_errors_and_attributes():
    with pytest.raises(ValueError) as err:
        CountdownTask("countdown-9")
    assert "countdown-9" in str(err.value) and "countdown-4e" in str(err.value)
    with pytest.raises(ValueError) as err:
        CountdownTask("countdown-3", trace="verbose")
    assert "verbose" in str(err.value) and "search" in str(err.value)
    with pytest.raises(ValueError, match="max_failed"):
        CountdownTask("countdown-3", trace="search", max_failed=-1)
    with pytest.raises(ValueError, match="split"):
        CountdownTask().problems("dev", 3)
    for variant in ("countdown-4", "countdown-4e"):
        with pytest.raises(ValueError) as err:
            CountdownTask(variant, trace="dfs")
        assert variant in str(err.value) and "countdown-3" in str(err.value)
    task = CountdownTask()
    assert (task.name, task.tag, task.trace) == ("countdown-3", "c", "steps")
    assert CountdownTask("countdown-4e").name == "countdown-4e"


def test_max_new_tokens_matches_hand_bounds():
    # Hand-computed worst cases for numbers <= 99, targets <= 100. Value widths: a number 2
    # chars; a value of 2 numbers 8 (sign, numerator <= 9801, '/', denominator <= 99); of 3
    # numbers 12 (sign, <= 970299, '/', <= 9801); the target 3. A step is a op b = r.
    # direct: '#' + n two-digit literals + (n-1) operators + one paren pair per inner operator.
    # steps, n=3: first step 2+1+2+1+8 = 14, a comma, last step 8+1+2+1+3 = 15 -> 30,
    #   + answer 11 = 41.
    # steps, n=4: 14 + 24 (8+1+2+1+12) + 19 (12+1+2+1+3) + 2 commas = 59, + answer 16 = 75.
    # search adds per failure an integer trace (n=3: "99*99=9801,9801*99=970299" = 25;
    #   n=4: 10 + 14 + 18 + 2 = 44) plus "!;".
    # dfs, n=3: before the live first step at most 3 pairs x 4 ops - 1 = 11 dead steps of
    #   "99*99=9801!," = 12 chars; before the live last step at most 4 - 1 = 3 dead steps of
    #   "9801*99=970299!," = 16 chars: 41 + 132 + 48 = 221.
    expected = {3: {"direct": 11, "steps": 41, "search": 41 + 2 * 27, "dfs": 221},
                4: {"direct": 16, "steps": 75, "search": 75 + 2 * 46}}
    for variant, n in VARIANTS.items():
        for trace in TRACE_STYLES:
            if trace == "dfs" and variant not in DFS_VARIANTS:
                continue
            assert CountdownTask(variant, trace).max_new_tokens == expected[n][trace]
    assert CountdownTask("countdown-4", "search", max_failed=5).max_new_tokens == 75 + 5 * 46
    assert max_completion_chars(3, "search", 0) == 41


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_references_score_and_fit(variant):
    n = VARIANTS[variant]
    problems = CountdownTask(variant).problems("train", 40, seed=5)
    for trace in ("direct", "steps", "search"):  # dfs: test_dfs_references_are_a_true_search
        task = CountdownTask(variant, trace)
        rng = random.Random(0)
        failures_seen = set()
        for p in problems:
            numbers, target = p.data["numbers"], p.data["target"]
            for _ in range(2):
                state = rng.getstate()
                completion = task.reference(p, rng)
                rng.setstate(state)
                assert task.reference(p, rng) == completion  # same rng state -> same text
                assert task.score(p, completion) == 1.0, completion
                assert len(completion) <= task.max_new_tokens, completion
                assert completion.isascii() and completion.isprintable() and " " not in completion
                trace_text, answer = completion.rsplit("#", 1)
                assert re.fullmatch(EXPR, answer)
                if trace == "direct":
                    assert trace_text == ""
                    continue
                *failed, success = trace_text.split(";")
                if trace == "steps":
                    assert failed == []
                assert len(failed) <= task.max_failed
                failures_seen.add(len(failed))
                assert re.fullmatch(STEPS, success), completion
                steps = parse_steps(success)
                assert len(steps) == n - 1
                assert replay(numbers, steps) == target
                assert verify(numbers, target, expression_from_steps(numbers, steps))
                if solutions(numbers, target, integer_only=True):
                    replay(numbers, steps, integer_only=True)
                for attempt in failed:
                    assert attempt.endswith("!") and re.fullmatch(STEPS, attempt[:-1]), completion
                    assert replay(numbers, parse_steps(attempt[:-1]), integer_only=True) != target
        if trace == "search":
            assert failures_seen == {0, 1, 2}


def test_reference_variety_and_mutations():
    task = CountdownTask("countdown-4", "steps")
    problem = next(p for p in task.problems("train", 20, seed=2)
                   if len(solutions(p.data["numbers"], p.data["target"], integer_only=True)) >= 3)
    completions = {task.reference(problem, random.Random(s)) for s in range(30)}
    assert len(completions) >= 3
    for completion in list(completions)[:3]:
        trace_text, answer = completion.rsplit("#", 1)
        assert task.score(problem, completion) == 1.0
        assert task.score(problem, "junk#" + completion) == 1.0  # only the last answer counts
        assert task.score(problem, trace_text + answer) == 0.0  # no answer mark
        bumped = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), answer, count=1)
        assert task.score(problem, f"{trace_text}#{bumped}") == 0.0  # wrong multiset
        assert task.score(problem, f"{trace_text}#({answer})+({answer})") == 0.0  # numbers twice
        assert task.score(problem, f"{completion}#1") == 0.0  # a later wrong answer wins
    # A wrong value with the right multiset: every operator flipped + <-> - and * <-> /.
    answer = task.reference(problem, random.Random(0)).rsplit("#", 1)[1]
    flipped = answer.translate(str.maketrans("+-*/", "-+/*"))
    numbers, target = problem.data["numbers"], problem.data["target"]
    assert sorted(map(int, re.findall(r"\d+", flipped))) == sorted(numbers)
    assert task.score(problem, "#" + flipped) == 0.0


def test_task_problems_match_generate():
    task = CountdownTask("countdown-4e", "direct")
    assert task.problems("test", 5, seed=9) == generate(4, 5, seed=9, split="test", variant="countdown-4e")


# --------------------------------------------------------------------------------------------
# diagnose: the error mode of a completion
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, mode", [
    ("34+56=90,90-12=78#(34+56)-12", "correct"),
    ("#34+56-12", "correct"),                                 # direct trace
    ("34+56=90,90-12=78", "no answer"),
    ("#34+56+12", "wrong answer"),
    ("34+56=90,90-12=78#34+56+12", "answer mismatch"),
    ("34+56=90,90+12=102#34+56+12", "misses target"),
    ("34+12=46,46+56=78#34+12+56", "false finish"),           # 46+56 is 102, written as the target
    ("34+12=47,47+56=103#34+12+56", "arithmetic error"),
    ("34+34=68,68+10=78#34+34+10", "unavailable value"),      # 34 is given once
    ("34+56=90,90-12=78,78*1=78#(34+56)-12*1", "unavailable value"),
    ("34+56=90;90-12=78#34+56+12", "malformed step"),
    ("12+34=46,46+56=102!;34+56=90,90-12=78#(34+56)-12", "correct"),   # search trace
    ("12+34=46,46+56=102!;34+12=46,46+56=78#34+12+56", "false finish"),  # only the last attempt counts
    ("56/0=0,0+12=78#56/0+12", "unavailable value"),         # 0 is not given
    ("34+56=90/0,90-12=78#34+56+12", "malformed step"),       # a value with denominator 0
    ("34+56=90/00,90-12=78#34+56+12", "malformed step"),
])
def test_diagnose_names_the_first_fault(completion, mode):
    assert countdown.diagnose([12, 34, 56], 78, completion) == mode
    assert mode in countdown.ERROR_MODES


def test_diagnose_agrees_with_the_verifier_on_references():
    rng = random.Random(0)
    for trace in countdown.TRACE_STYLES:
        task = countdown.CountdownTask("countdown-3", trace=trace)
        for p in task.problems("train", 50, seed=1):
            ref = task.reference(p, rng)
            assert countdown.diagnose(p.data["numbers"], p.data["target"], ref) == "correct"


def test_diagnose_handles_fractions_and_negatives():
    # 7/2 * 2 ... numbers 7, 2, 4, target 14: 7/2=7/2, 7/2*4=14
    assert countdown.diagnose([7, 2, 4], 14, "7/2=7/2,7/2*4=14#7/2*4") == "correct"
    assert countdown.diagnose([7, 2, 4], 14, "7/2=7/2,7/2*4=14#7*4") == "answer mismatch"
    assert countdown.diagnose([2, 9, 20], 13, "2-9=-7,20+-7=13#20+2-9") == "correct"
    assert countdown.diagnose([2, 9, 20], 13, "2-9=-8,20+-8=12#20+2-9") == "correct"  # answer decides
    assert countdown.diagnose([2, 9, 20], 13, "2-9=-8,20+-8=12#20+2-8") == "arithmetic error"
    assert countdown.diagnose([5, 5, 9], 10, "5-5=0,9/0=10#9/(5-5)") == "false finish"  # x/0 is never right
    assert countdown.diagnose([5, 5, 9], 11, "5-5=0,9/0=0#9/(5-5)") == "arithmetic error"


# ---------------------------------------------------------------------------------------------
# The dfs trace
# ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _int_reachable(values: tuple[int, ...]) -> frozenset[int]:
    """Every value reachable from ``values`` (using all of them) with non-negative integer
    intermediates: an independent brute force over pairs and the four operations."""
    if len(values) == 1:
        return frozenset(values)
    out: set[int] = set()
    for i, j in itertools.combinations(range(len(values)), 2):
        a, b = max(values[i], values[j]), min(values[i], values[j])
        rest = [values[k] for k in range(len(values)) if k not in (i, j)]
        results = [a + b, a * b, a - b] + ([a // b] if b and a % b == 0 else [])
        for r in results:
            out |= _int_reachable(tuple(sorted(rest + [r])))
    return frozenset(out)


def _hand_order(values: list[int]) -> list[tuple[int, str, int, int]]:
    """The documented try order: pairs by position, then + * - / (larger operand first)."""
    order = []
    for i, j in itertools.combinations(range(len(values)), 2):
        a, b = max(values[i], values[j]), min(values[i], values[j])
        for op, r in (("+", a + b), ("*", a * b), ("-", a - b), ("/", a // b if b and a % b == 0 else None)):
            if r is not None and (a, op, b, r) not in order:
                order.append((a, op, b, r))
    return order


@pytest.mark.parametrize("numbers, target, text", [
    ([12, 34, 56], 78, "34+12=46!,34*12=408!,34-12=22,56+22=78"),
    ([4, 4, 2], 16, "4+4=8,8+2=10!,8*2=16"),
    ([6, 5, 2], 17, "6+5=11!,6*5=30!,6-5=1!,6+2=8!,6*2=12,12+5=17"),
    ([5, 5, 9], 10, "5+5=10!,5*5=25!,5-5=0!,5/5=1,9+1=10"),  # (5,5) tried once; 0 is never a divisor
])
def test_dfs_hand_cases(numbers, target, text):
    assert dfs_text(dfs_steps(numbers, target)) == text
    reference = CountdownTask("countdown-3", "dfs").reference(
        countdown.Problem(task="countdown-3", key="k", prompt="", data={"numbers": numbers, "target": target}),
        random.Random(0))
    assert reference.startswith(text + "#") and verify(numbers, target, reference.rsplit("#", 1)[1])


def test_dfs_references_are_a_true_search():
    task = CountdownTask("countdown-3", "dfs")
    for split in ("train", "test"):
        for p in task.problems(split, 150, seed=3):
            numbers, target = p.data["numbers"], p.data["target"]
            completion = task.reference(p, random.Random(0))
            assert completion == task.reference(p, random.Random(99))  # deterministic
            assert task.score(p, completion) == 1.0 and len(completion) <= task.max_new_tokens
            assert countdown.diagnose(numbers, target, completion) == "correct"
            trace_text, answer = completion.rsplit("#", 1)
            values, written = list(numbers), trace_text.split(",")
            while len(values) > 1:  # each state: a prefix of the try order, dead until the live step
                order = _hand_order(values)
                for k, (a, op, b, r) in enumerate(order):
                    rest = values[:]
                    rest.remove(a)
                    rest.remove(b)
                    rest.append(r)
                    live = target in _int_reachable(tuple(sorted(rest)))
                    assert written.pop(0) == f"{a}{op}{b}={r}" + ("" if live else "!"), completion
                    if live:
                        values = rest
                        break
                else:
                    raise AssertionError(f"no live step in {completion}")
            assert written == [] and values == [target]


def test_dfs_covers_every_three_number_eval_problem(eval_set):
    rows = [r for r in eval_set if len(r["numbers"]) == 3]
    assert rows
    for row in rows:
        marked = dfs_steps(row["numbers"], int(row["target"]))
        path = [step for step, live in marked if live]
        assert verify(row["numbers"], row["target"], expression_from_steps(row["numbers"], path))
        text = dfs_text(marked) + "#" + expression_from_steps(row["numbers"], path)
        assert len(text) <= max_completion_chars(3, "dfs")


def test_dfs_rejects_problems_without_an_integer_solution():
    with pytest.raises(ValueError, match="integer-only"):
        dfs_steps([3, 5, 7], 10)  # unsolvable


@pytest.mark.parametrize("completion, mode", [
    ("34+12=46!,34*12=408!,34-12=22,56+22=78#56+34-12", "correct"),
    ("34+12=47!,34-12=22,56+22=78#56+34-12", "correct"),       # dead steps are not checked
    ("34+12=46!,34+12=46,56+46=78#56+34+12", "false finish"),  # live by mistake, then faked
    ("34+12=46!,34-12=22,56+22=77#56+34+12", "arithmetic error"),
    ("34+12=46!,56+34=90!,#56+34+12", "malformed step"),
    ("34+12=46!,56-12=44!#56-12", "misses target"),            # every step dead
])
def test_diagnose_skips_dead_steps(completion, mode):
    assert countdown.diagnose([12, 34, 56], 78, completion) == mode
