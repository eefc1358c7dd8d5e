"""Countdown: combine N numbers with + - * / and parentheses to reach a target.

Every given number is used exactly once. Problems are generated as in Stream-of-Search:
numbers drawn independently and uniformly from 1..99, the target uniformly from 10..100, and a
draw is kept only when the exhaustive solver finds a solution (exact rational arithmetic, so
negative and fractional intermediates are allowed).

Variants (``VARIANTS``):

- ``countdown-3``: 3 numbers.
- ``countdown-4``: 4 numbers.
- ``countdown-4e`` ("easy paths removed"): 4 numbers, target 10..100, kept only when the problem
  is solvable but has NO solution whose intermediates are all non-negative integers using only
  ``+`` and ``-``. Every solution therefore needs ``*`` or ``/``, or passes through a negative or
  fractional intermediate. Measured on the first 200 problems of each variant
  (``generate(4, 200, seed=0)``, all splits): countdown-4 problems have on average 8.055
  integer-only solution step-sequences (``solutions(..., integer_only=True)``), countdown-4e
  problems 2.77; 2.0% of countdown-4e problems have no integer-only solution at all, against
  0.5% of countdown-4 problems (``tests/test_countdown.py`` re-measures this). About 14% of
  uniform 4-number draws are solvable at all (6% of 3-number draws).

Text formats (character-level tokenizer, printable ASCII, see ``kdlab.tasks.base``):

- prompt: ``c`` + the numbers in a seeded shuffled order separated by spaces + ``>`` + target +
  ``:``, e.g. ``c12 34 56>78:`` (the number count tells the variant apart).
- completion, chosen by the task's ``trace`` style:

  - ``direct``: ``#`` + expression, e.g. ``#(34+56)-12``;
  - ``steps``: the solution as steps, then the answer: ``34+56=90,90-12=78#(34+56)-12``. An
    integer-only solution (non-negative integer intermediates, exact division) is used when one
    exists; otherwise a general one, with exact values written as ``7/2`` or ``-4``;
  - ``search``: 0..``max_failed`` failed attempts (full integer-only step sequences that miss
    the target), each followed by ``!;``, then the steps trace:
    ``12+34=46,46+56=102!;34+56=90,90-12=78#(34+56)-12``;
  - ``dfs`` (countdown-3 only): a depth-first search with one-step look-ahead, written in full
    (``dfs_steps``). At each state the distinct steps are tried in a fixed order (pairs of
    values by position, the prompt's numbers first and a new result last; then ``+ * - /``),
    each step from which the target cannot be reached is written and marked dead with ``!``,
    and the first live step is taken: ``34+12=46!,34*12=408!,34-12=22,56+22=78#56+34-12``.
    Unlike ``search``, every failed attempt is a distinct
    step in a fixed order, so a model that learns it always knows what to try next.

Problem keys are canonical, ``cd<N>:<sorted numbers>><target>`` (e.g. ``cd3:12,34,56>78``), and
countdown-4 and countdown-4e share the ``cd4`` prefix: a countdown-4e problem is also a
countdown-4 problem and always lands in the same split under both variants.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from fractions import Fraction
from functools import lru_cache
from math import gcd
from typing import Union

from ..core.schema import DFS_VARIANTS
from .base import ANSWER_MARK, SPLITS, Problem, Task, final_answer, split_of

Number = Union[int, Fraction]
Step = tuple[Number, str, Number, Number]  # (left, op, right, result)

VARIANTS: dict[str, int] = {"countdown-3": 3, "countdown-4": 4, "countdown-4e": 4}
TRACE_STYLES: tuple[str, ...] = ("direct", "steps", "search", "dfs")
DEAD_MARK = "!"
TAG = "c"
MIN_NUMBER, MAX_NUMBER = 1, 99
MIN_TARGET, MAX_TARGET = 10, 100

# verify() limits: anything longer or deeper is rejected before any arithmetic happens.
MAX_EXPRESSION_CHARS = 1024
MAX_PAREN_DEPTH = 32
MAX_NUMBER_BITS = 64

_ALLOWED = re.compile(r"[0-9+\-*/() ]*")
_TOKEN = re.compile(r"\d+|[-+*/()]")
_TARGET_TEXT = re.compile(r"-?\d{1,30}")


# --------------------------------------------------------------------------------------------
# Verifier
# --------------------------------------------------------------------------------------------
class _ParseError(Exception):
    pass


class _Parser:
    """Recursive descent over tokens, evaluating exactly with Fractions.

    Grammar (no unary operators): expr := term (('+'|'-') term)*,
    term := factor (('*'|'/') factor)*, factor := NUMBER | '(' expr ')'.
    Recursion only grows with parentheses, and their depth is capped at MAX_PAREN_DEPTH.
    """

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def parse(self) -> Fraction:
        value = self.expr()
        if self.pos != len(self.tokens):
            raise _ParseError("trailing tokens")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.factor()
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise _ParseError("division by zero")
            else:
                value = value / rhs
        return value

    def factor(self) -> Fraction:
        tok = self.peek()
        if tok is None:
            raise _ParseError("unexpected end")
        if tok.isdigit():
            self.pos += 1
            return Fraction(int(tok))
        if tok != "(":
            raise _ParseError(f"unexpected {tok!r}")
        self.depth += 1
        if self.depth > MAX_PAREN_DEPTH:
            raise _ParseError("too deep")
        self.pos += 1
        value = self.expr()
        if self.peek() != ")":
            raise _ParseError("missing ')'")
        self.pos += 1
        self.depth -= 1
        return value


def _parse_target(target: object) -> int | None:
    if isinstance(target, bool):
        return None
    if isinstance(target, int):
        return target
    if isinstance(target, str):
        text = target.strip()
        return int(text) if _TARGET_TEXT.fullmatch(text) else None
    return None


def verify(numbers: list[int], target: int | str, expression: str) -> bool:
    """True exactly when ``expression`` uses each of ``numbers`` once and equals ``target``.

    ``numbers``: the given non-negative integers (a multiset; order irrelevant).
    ``target``: an int, or a string holding an integer (e.g. ``"78"``); anything else -> False.
    ``expression``: digits, ``+ - * / ( )`` and spaces only; number literals are plain digit
    runs written exactly as ``str(n)`` (no sign, no leading zeros), with no unary operators.
    Evaluation is exact (``fractions.Fraction``); negative and fractional intermediates are
    allowed, division by zero gives False. Never raises: malformed, hostile or oversized input
    (over MAX_EXPRESSION_CHARS characters or MAX_PAREN_DEPTH nested parentheses) gives False.
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return False
    if not isinstance(numbers, (list, tuple)) or not numbers:
        return False
    for n in numbers:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n.bit_length() > MAX_NUMBER_BITS:
            return False
    goal = _parse_target(target)
    if goal is None or not _ALLOWED.fullmatch(expression):
        return False
    tokens = _TOKEN.findall(expression)
    # Literals are compared as text, so an enormous digit run never becomes an int.
    literals = Counter(tok for tok in tokens if tok.isdigit())
    if literals != Counter(str(n) for n in numbers):
        return False
    try:
        value = _Parser(tokens).parse()
    except _ParseError:
        return False
    return value == goal


# --------------------------------------------------------------------------------------------
# Expression trees and rendering
# --------------------------------------------------------------------------------------------
# A tree is an int leaf or a tuple (op, left, right).
_Tree = Union[int, tuple]


def _render(tree: _Tree) -> tuple[str, int]:
    """Render with minimal parentheses; returns (text, precedence) with 3 = atom, 2 = * /,
    1 = + -. Parentheses are dropped only where the exact rational value is unchanged
    (a+(b-c) -> a+b-c, a*(b/c) -> a*b/c)."""
    if isinstance(tree, int):
        return str(tree), 3
    op, left, right = tree
    ltext, lprec = _render(left)
    rtext, rprec = _render(right)
    if op in "+-":
        if op == "-" and rprec == 1:
            rtext = f"({rtext})"
        return f"{ltext}{op}{rtext}", 1
    if lprec == 1:
        ltext = f"({ltext})"
    if rprec == 1 or (op == "/" and rprec == 2):
        rtext = f"({rtext})"
    return f"{ltext}{op}{rtext}", 2


def _format_value(value: Number) -> str:
    """Exact value as text: ``12``, ``-4``, ``7/2``, ``-7/2``."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b


def expression_from_steps(numbers: list[int], steps: list[Step]) -> str:
    """The expression (minimal parentheses, no spaces) that a step sequence computes.

    ``steps``: each ``(left, op, right, result)`` consumes two available values (given numbers or
    earlier results) and adds its result. Raises ValueError when a step uses an unavailable
    value, has a wrong result, or the steps do not end with exactly one value.
    """
    pool: list[tuple[Fraction, _Tree]] = [(Fraction(n), n) for n in numbers]

    def take(value: Number) -> _Tree:
        for i, (v, tree) in enumerate(pool):
            if v == value:
                del pool[i]
                return tree
        raise ValueError(f"steps: value {value} is not available")

    for left, op, right, result in steps:
        if op not in "+-*/" or len(op) != 1:
            raise ValueError(f"steps: unknown operator {op!r}")
        if op == "/" and right == 0:
            raise ValueError("steps: division by zero")
        if _apply(Fraction(left), op, Fraction(right)) != result:
            raise ValueError(f"steps: {left}{op}{right} != {result}")
        tree = (op, take(left), take(right))
        pool.append((Fraction(result), tree))
    if len(pool) != 1:
        raise ValueError(f"steps: {len(pool)} values left, expected 1")
    return _render(pool[0][1])[0]


def steps_text(steps: list[Step]) -> str:
    """Steps written as ``34+56=90,90-12=78`` (exact values, fractions as ``7/2``)."""
    return ",".join(
        f"{_format_value(a)}{op}{_format_value(b)}={_format_value(r)}" for a, op, b, r in steps
    )


def dfs_steps(numbers: list[int], target: int) -> list[tuple[Step, bool]]:
    """The ``dfs`` trace of a problem: ``(step, live)`` pairs in the order they are tried.

    At each state (the values left, in order: untouched numbers in the given order, then results
    in the order made) the distinct integer-only steps of ``_distinct_steps`` are tried in order;
    a step is live when the target can still be reached from the values it leaves (the last
    step: when its result is the target). Dead steps are listed, the first live one is taken and
    the search goes on from there, so the live steps form a solution.

    Raises ValueError when the problem has no integer-only solution. Every solvable 3-number
    problem has one: a fractional intermediate ``a/b`` can only reach an integer target as
    ``a*c/b``, ``c*b/a`` or ``a/(b*c)``, and a negative one ``a-b`` only as ``c-(b-a)`` or
    ``c+b-a``, each computable with non-negative integer intermediates.
    """
    nums = _check_numbers(numbers)
    t = _check_target(target)
    if min(nums) < 0 or not _solutions_sorted(tuple(sorted(nums)), t, True, "+-*/"):
        raise ValueError(f"countdown problem {list(nums)!r} -> {t} has no integer-only solution, "
                         "which the dfs trace needs")
    values: list[Number] = list(nums)
    out: list[tuple[Step, bool]] = []
    while len(values) > 1:
        for step, rest in _distinct_steps(values, True):
            live = rest[0] == t if len(rest) == 1 else bool(_solutions_sorted(tuple(sorted(rest)), t, True, "+-*/"))
            out.append((step, live))
            if live:
                values = rest
                break
    return out


def dfs_text(marked: list[tuple[Step, bool]]) -> str:
    """``dfs_steps`` output written as ``12+34=46!,34+56=90,90-12=78`` (dead steps end in ``!``)."""
    return ",".join(steps_text([step]) + ("" if live else DEAD_MARK) for step, live in marked)


# --------------------------------------------------------------------------------------------
# Error modes of a completion
# --------------------------------------------------------------------------------------------
ERROR_MODES: tuple[str, ...] = (
    "correct",            # the verifier accepts the final answer
    "no answer",          # no ``#`` final answer
    "malformed step",     # a step of the (last) attempt is not ``a<op>b=c`` with exact values
    "unavailable value",  # a step uses a number that is not (or no longer) available
    "false finish",       # a step's arithmetic is wrong and its written result is the target
    "arithmetic error",   # a step's arithmetic is wrong (result not the target)
    "misses target",      # every step is right, but the last result is not the target
    "answer mismatch",    # the steps reach the target, but the final expression fails ``verify``
    "wrong answer",       # no steps to check (``direct`` trace) and the answer fails ``verify``
)
_VALUE = r"-?\d{1,12}(?:/\d{1,12})?"
_STEP = re.compile(rf"({_VALUE})([-+*/])({_VALUE})=({_VALUE})")


def diagnose(numbers: list[int], target: int, completion: str) -> str:
    """The error mode (one of ERROR_MODES) of a completion in any trace style.

    The steps checked are those of the last attempt (after the last ``!;`` of a ``search``
    trace) that are not marked dead (``!`` of a ``dfs`` trace), in order; the first faulty step
    decides the mode. "false finish" is a step that
    claims the target with wrong arithmetic: a model that chose a first step from which the
    target cannot be reached, then wrote the target anyway.
    """
    answer = final_answer(completion)
    if answer is None:
        return "no answer"
    if verify(list(numbers), target, answer):
        return "correct"
    trace = completion.rsplit(ANSWER_MARK, 1)[0].rsplit("!;", 1)[-1]
    if not trace:
        return "wrong answer"
    pool = Counter(Fraction(n) for n in numbers)
    last: Fraction | None = None
    for text in trace.split(","):
        if text.endswith(DEAD_MARK):
            continue
        m = _STEP.fullmatch(text)
        if m is None:
            return "malformed step"
        try:
            a, op, b, written = Fraction(m[1]), m[2], Fraction(m[3]), Fraction(m[4])
        except ZeroDivisionError:  # a value written with denominator 0, e.g. "7/00"
            return "malformed step"
        need = Counter([a, b])
        if any(pool[v] < k for v, k in need.items()):
            return "unavailable value"
        if (op == "/" and b == 0) or _apply(a, op, b) != written:
            return "false finish" if written == target else "arithmetic error"
        pool.subtract(need)
        pool[written] += 1
        last = written
    return "answer mismatch" if last == target else "misses target"


# --------------------------------------------------------------------------------------------
# Solvers
# --------------------------------------------------------------------------------------------
def _check_numbers(numbers: object, name: str = "numbers") -> tuple[int, ...]:
    if not isinstance(numbers, (list, tuple)) or not numbers:
        raise ValueError(f"{name} must be a non-empty list of ints, got {numbers!r}")
    for n in numbers:
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"{name} must hold ints, got {n!r} in {numbers!r}")
    return tuple(numbers)


def _check_target(target: object) -> int:
    if isinstance(target, bool) or not isinstance(target, int):
        raise ValueError(f"target must be an int, got {target!r}")
    return target


def _splits(ms: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Distinct ways to cut a sorted multiset into two non-empty sorted sub-multisets
    (unordered: each pair once)."""
    n = len(ms)
    out, seen = [], set()
    for mask in range(1, 2 ** n - 1):
        if not mask & 1:  # element 0 always goes left, so (L, R) and (R, L) are not both made
            continue
        left = tuple(ms[i] for i in range(n) if mask >> i & 1)
        right = tuple(ms[i] for i in range(n) if not mask >> i & 1)
        if (left, right) not in seen and (right, left) not in seen:
            seen.add((left, right))
            out.append((left, right))
    return out


# The solver's values are reduced rationals as int pairs (num, den), den > 0: hashing and
# arithmetic on them is several times cheaper than on fractions.Fraction.
_Rat = tuple[int, int]


def _rat(num: int, den: int) -> _Rat:
    if den < 0:
        num, den = -num, -den
    g = gcd(num, den)
    return (num // g, den // g) if g > 1 else (num, den)


def _combinations(a: _Rat, b: _Rat) -> list[tuple[_Rat, str, bool]]:
    """(value, op, swapped) for a+b, a*b, a-b, b-a, a/b, b/a (divisions by zero left out);
    ``swapped`` means the expression is b op a."""
    (p, q), (r, s) = a, b
    if q == 1 and s == 1:
        out = [((p + r, 1), "+", False), ((p * r, 1), "*", False),
               ((p - r, 1), "-", False), ((r - p, 1), "-", True)]
    else:
        total = _rat(p * s + r * q, q * s)
        diff = _rat(p * s - r * q, q * s)
        out = [(total, "+", False), (_rat(p * r, q * s), "*", False),
               (diff, "-", False), ((-diff[0], diff[1]), "-", True)]
    if r:
        out.append((_rat(p * s, q * r), "/", False))
    if p:
        out.append((_rat(r * q, s * p), "/", True))
    return out


def _reachable(ms: tuple[int, ...], memo: dict) -> dict[_Rat, _Tree]:
    """Every value an expression over exactly the numbers in ``ms`` can take, each with one
    expression tree; memoised in ``memo`` on the sorted multiset."""
    if ms in memo:
        return memo[ms]
    if len(ms) == 1:
        out: dict[_Rat, _Tree] = {(ms[0], 1): ms[0]}
    else:
        out = {}
        for left, right in _splits(ms):
            rvals = _reachable(right, memo)
            for a, ta in _reachable(left, memo).items():
                for b, tb in rvals.items():
                    for value, op, swapped in _combinations(a, b):
                        if value not in out:
                            out[value] = (op, tb, ta) if swapped else (op, ta, tb)
    memo[ms] = out
    return out


def _find(ms: tuple[int, ...], target: int) -> _Tree | None:
    """An expression tree over exactly ``ms`` worth ``target``, or None.

    Exhaustive over every binary expression tree (equivalently, every order of combining two
    available values): the value sets of the sub-multisets are built bottom up, and at the top
    level the partner value each operator would need is looked up instead of enumerated."""
    if len(ms) == 1:
        return ms[0] if ms[0] == target else None
    memo: dict = {}
    t = target
    for left, right in _splits(ms):
        lvals, rvals = _reachable(left, memo), _reachable(right, memo)
        if len(lvals) > len(rvals):
            lvals, rvals = rvals, lvals
        for (p, q), ta in lvals.items():
            # b such that a+b, a-b, b-a, a*b, b/a or a/b equals t (a = p/q); b_first: b op a.
            needed = [(_rat(t * q - p, q), "+", False), (_rat(p - t * q, q), "-", False),
                      (_rat(p + t * q, q), "-", True)]
            if p:  # a * b = t and b / a = t need a != 0; a / b = t needs b = a / t != 0
                needed += [(_rat(t * q, p), "*", False), (_rat(t * p, q), "/", True)]
                if t:
                    needed.append((_rat(p, q * t), "/", False))
            for b, op, b_first in needed:
                if b in rvals:
                    tb = rvals[b]
                    return (op, tb, ta) if b_first else (op, ta, tb)
    return None


@lru_cache(maxsize=8192)
def _solve_sorted(numbers: tuple[int, ...], target: int) -> str | None:
    tree = _find(numbers, target)
    return None if tree is None else _render(tree)[0]


def solve(numbers: list[int], target: int) -> str | None:
    """An expression (minimal parentheses, no spaces) that ``verify`` accepts, or None when no
    expression over ``numbers`` with + - * / reaches ``target`` exactly.

    Exhaustive over all ways of combining two available values (both orders for - and /),
    exact Fractions (see ``_find``); results are memoised on the sorted multiset of numbers and
    the target.
    """
    nums = _check_numbers(numbers)
    return _solve_sorted(tuple(sorted(nums)), _check_target(target))


def _candidate_steps(a: Number, b: Number, integer_only: bool) -> list[Step]:
    """Distinct steps combining a and b. + and * larger operand first; with ``integer_only``
    also - and / larger first, / only when exact and the divisor is non-zero, so every result
    is a non-negative integer; otherwise - and / in both orders."""
    hi, lo = (a, b) if a >= b else (b, a)
    steps: list[Step] = [(hi, "+", lo, hi + lo), (hi, "*", lo, hi * lo)]
    if integer_only:
        steps.append((hi, "-", lo, hi - lo))
        if lo != 0 and hi % lo == 0:
            steps.append((hi, "/", lo, hi // lo))
        return steps
    steps += [(a, "-", b, a - b), (b, "-", a, b - a)]
    if b != 0:
        steps.append((a, "/", b, Fraction(a) / b))
    if a != 0:
        steps.append((b, "/", a, Fraction(b) / a))
    return steps


def _distinct_steps(values: list[Number], integer_only: bool, ops: str = "+-*/") -> list[tuple[Step, list[Number]]]:
    """Every distinct step available from ``values`` with the values left after it."""
    seen: set[Step] = set()
    out: list[tuple[Step, list[Number]]] = []
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            for step in _candidate_steps(values[i], values[j], integer_only):
                if step[1] not in ops or step in seen:
                    continue
                seen.add(step)
                rest = [values[k] for k in range(len(values)) if k != i and k != j]
                out.append((step, rest + [step[3]]))
    return out


def _collect(values: list[Number], target: Number, integer_only: bool, ops: str,
             prefix: list[Step], out: list[tuple[Step, ...]]) -> None:
    if len(values) == 1:
        if values[0] == target:
            out.append(tuple(prefix))
        return
    for step, remaining in _distinct_steps(values, integer_only, ops):
        prefix.append(step)
        _collect(remaining, target, integer_only, ops, prefix, out)
        prefix.pop()


@lru_cache(maxsize=4096)
def _solutions_sorted(numbers: tuple[int, ...], target: int, integer_only: bool, ops: str) -> tuple[tuple[Step, ...], ...]:
    values: list[Number] = list(numbers) if integer_only else [Fraction(n) for n in numbers]
    out: list[tuple[Step, ...]] = []
    _collect(values, target, integer_only, ops, [], out)
    return tuple(out)


def solutions(numbers: list[int], target: int, integer_only: bool = False) -> list[list[Step]]:
    """All distinct solution step-sequences, each a list of ``(left, op, right, result)`` steps.

    A sequence has ``len(numbers) - 1`` steps; each combines two available values (given
    numbers or earlier results) and the last result equals ``target``. Commutative duplicates
    are removed (+ and * keep the larger operand first). With ``integer_only`` every
    intermediate is a non-negative int (- and / larger operand first, / only when exact);
    otherwise values are ``Fraction`` and - and / appear in both orders. Steps that differ only
    in which of two equal numbers they consume count once. Order of the list is deterministic.
    """
    nums = tuple(sorted(_check_numbers(numbers)))
    if integer_only and min(nums) < 0:
        raise ValueError(f"numbers must be non-negative with integer_only, got {list(numbers)!r}")
    found = _solutions_sorted(nums, _check_target(target), bool(integer_only), "+-*/")
    return [list(seq) for seq in found]


def _has_plus_minus_solution(numbers: tuple[int, ...], target: int) -> bool:
    """Whether an integer-only solution with non-negative intermediates uses only + and -."""
    return bool(_solutions_sorted(tuple(sorted(numbers)), target, True, "+-"))


def _random_integer_path(numbers: list[int], rng: random.Random) -> list[Step]:
    """A uniformly chosen step at every state until one value is left (integer-only rules)."""
    values: list[Number] = list(numbers)
    path: list[Step] = []
    while len(values) > 1:
        step, values = rng.choice(_distinct_steps(values, True))
        path.append(step)
    return path


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------
def problem_key(numbers: list[int], target: int) -> str:
    """Canonical key: ``cd<N>:<numbers sorted ascending, comma-separated>><target>``."""
    return f"cd{len(numbers)}:{','.join(map(str, sorted(numbers)))}>{target}"


def render_prompt(numbers: list[int], target: int) -> str:
    """``c12 34 56>78:``: the numbers in the given order, then the target."""
    return f"{TAG}{' '.join(map(str, numbers))}>{target}:"


def _check_variant(variant: object) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    return variant  # type: ignore[return-value]


def _accept(variant: str, numbers: tuple[int, ...], target: int) -> bool:
    if variant == "countdown-4e" and _has_plus_minus_solution(numbers, target):
        return False
    return _solve_sorted(tuple(sorted(numbers)), target) is not None


def generate(n_numbers: int, count: int, seed: int, split: str | None = None,
             variant: str | None = None) -> list[Problem]:
    """``count`` distinct problems, deterministic in (n_numbers, count, seed, split, variant).

    Each candidate draws ``n_numbers`` numbers uniformly from 1..99 (with replacement), a target
    uniformly from 10..100 and a shuffled display order, always consuming the same random
    stream, then is filtered: wrong split (``split_of(key)``; None keeps all), already returned,
    or not accepted by the variant (unsolvable; for countdown-4e also solvable with integer
    + and - only). So the problems of one split are the matching subsequence of the unfiltered
    stream. ``variant`` defaults to ``f"countdown-{n_numbers}"`` and must have ``n_numbers``
    numbers. ``Problem.data = {"numbers": shown order, "target": int}``.
    """
    if variant is None:
        variant = f"countdown-{n_numbers}"
        if variant not in VARIANTS:
            raise ValueError(f"n_numbers must be one of {sorted(set(VARIANTS.values()))}, got {n_numbers!r}")
    _check_variant(variant)
    if n_numbers != VARIANTS[variant]:
        raise ValueError(f"n_numbers must be {VARIANTS[variant]} for {variant}, got {n_numbers!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)} or None, got {split!r}")

    rng = random.Random(f"kdlab-countdown:{variant}:{seed}")
    problems: list[Problem] = []
    seen: set[str] = set()
    max_draws = 100_000 + 1_000 * count  # acceptance is >= ~2% even for countdown-4e test
    for _ in range(max_draws):
        if len(problems) == count:
            break
        numbers = [rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(n_numbers)]
        target = rng.randint(MIN_TARGET, MAX_TARGET)
        shown = numbers[:]
        rng.shuffle(shown)
        key = problem_key(numbers, target)
        if key in seen or (split is not None and split_of(key) != split):
            continue
        if not _accept(variant, tuple(numbers), target):
            continue
        seen.add(key)
        problems.append(Problem(task=variant, key=key, prompt=render_prompt(shown, target),
                                data={"numbers": shown, "target": target}))
    else:
        if len(problems) < count:
            raise RuntimeError(f"generate: only {len(problems)} of {count} problems after {max_draws} draws")
    return problems


# --------------------------------------------------------------------------------------------
# Length bounds (for max_new_tokens)
# --------------------------------------------------------------------------------------------
def _value_len_bounds(n: int, integer_only: bool) -> list[int]:
    """Upper bound on the characters of a value computed from k of the numbers, k = 0..n.

    Integer-only values are non-negative and at most MAX_NUMBER**k. General values p/q obey
    |p| <= A(k), q <= B(k) with A(1) = MAX_NUMBER, B(1) = 1 and, over splits k = i + j,
    A = max(A_i B_j + A_j B_i, A_i A_j, A_i B_j), B = max(B_i B_j, B_i A_j); text is a sign,
    the numerator, and ``/`` + denominator when one can exist."""
    lens = [0, len(str(MAX_NUMBER))]
    if integer_only:
        return lens + [len(str(MAX_NUMBER ** k)) for k in range(2, n + 1)]
    num, den = [0, MAX_NUMBER], [0, 1]
    for k in range(2, n + 1):
        a = b = 0
        for i in range(1, k):
            j = k - i
            a = max(a, num[i] * den[j] + num[j] * den[i], num[i] * num[j], num[i] * den[j])
            b = max(b, den[i] * den[j], den[i] * num[j])
        num.append(a)
        den.append(b)
        lens.append(1 + len(str(a)) + (1 + len(str(b)) if b > 1 else 0))
    return lens


def _trace_len_bound(n: int, integer_only: bool, root_len: int) -> int:
    """Max characters of a steps trace (``a+b=c,...``) over every binary tree shape on n leaves;
    the root's result has at most ``root_len`` characters."""
    lens = _value_len_bounds(n, integer_only)

    def best(k: int, root: bool) -> int:
        # Max total step text of a subtree with k leaves (commas added by the caller).
        if k == 1:
            return 0
        result = root_len if root else lens[k]
        # one step: left operand, op, right operand, '=', result
        return max(best(i, False) + best(k - i, False) + lens[i] + lens[k - i] + 2 + result
                   for i in range(1, k))

    return best(n, True) + (n - 2)


def _expression_len_bound(n: int) -> int:
    # n literals, n - 1 operators, at most one pair of parentheses per non-root operator.
    return n * len(str(MAX_NUMBER)) + (n - 1) + 2 * max(n - 2, 0)


def max_completion_chars(n: int, trace: str, max_failed: int = 2) -> int:
    """Upper bound on the length of any reference completion for n numbers (analytic, see
    ``_value_len_bounds``): direct = ``#`` + expression; steps = trace + ``#`` + expression;
    search adds ``max_failed`` failed attempts, each an integer-only trace plus ``!;``."""
    if trace not in TRACE_STYLES:
        raise ValueError(f"trace must be one of {list(TRACE_STYLES)}, got {trace!r}")
    answer = 1 + _expression_len_bound(n)
    if trace == "direct":
        return answer
    target_len = len(str(MAX_TARGET))
    steps = max(_trace_len_bound(n, True, target_len), _trace_len_bound(n, False, target_len)) + answer
    if trace == "steps":
        return steps
    if trace == "dfs":
        # Before each live step, every other distinct step of its state may be written dead
        # (``a<op>b=r!,``): with k values left, at most 4 ops x k(k-1)/2 pairs - 1 of them; the two
        # operands together hold at most n - k + 2 of the numbers (integer-only values).
        lens = _value_len_bounds(n, True)
        dead = 0
        for k in range(2, n + 1):
            leaves = n - k + 2
            operands = max(lens[i] + lens[leaves - i] for i in range(1, leaves))
            dead += (4 * k * (k - 1) // 2 - 1) * (operands + 2 + lens[leaves] + 2)
        return steps + dead
    failed = _trace_len_bound(n, True, _value_len_bounds(n, True)[n]) + 2
    return steps + max_failed * failed


# --------------------------------------------------------------------------------------------
# Task
# --------------------------------------------------------------------------------------------
class CountdownTask(Task):
    """Countdown as a kdlab task; see the module docstring for variants and text formats.

    ``variant``: one of VARIANTS. ``trace``: ``direct``, ``steps``, ``search`` or ``dfs``
    (``dfs`` for the variants in DFS_VARIANTS only).
    ``max_failed``: most failed attempts in a ``search`` trace (the count is drawn from
    0..max_failed). ``max_new_tokens`` is an analytic bound on the reference completion length.
    """

    tag = TAG

    def __init__(self, variant: str = "countdown-3", trace: str = "steps", max_failed: int = 2) -> None:
        self.name = _check_variant(variant)
        if trace not in TRACE_STYLES:
            raise ValueError(f"trace must be one of {list(TRACE_STYLES)}, got {trace!r}")
        if trace == "dfs" and variant not in DFS_VARIANTS:
            raise ValueError(f"trace 'dfs' is defined for {list(DFS_VARIANTS)} only, got variant {variant!r} "
                             f"(its traces can outgrow the models' 512 positions)")
        if isinstance(max_failed, bool) or not isinstance(max_failed, int) or max_failed < 0:
            raise ValueError(f"max_failed must be a non-negative int, got {max_failed!r}")
        self.trace = trace
        self.max_failed = max_failed
        self.n_numbers = VARIANTS[variant]
        self.max_new_tokens = max_completion_chars(self.n_numbers, trace, max_failed)

    def problems(self, split: str, count: int, seed: int = 0) -> list[Problem]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        return generate(self.n_numbers, count, seed, split=split, variant=self.name)

    def reference(self, problem: Problem, rng: random.Random) -> str:
        numbers, target = problem.data["numbers"], int(problem.data["target"])
        if self.trace == "dfs":  # deterministic: the search order fixes the solution
            marked = dfs_steps(numbers, target)
            path = [step for step, live in marked if live]
            return dfs_text(marked) + ANSWER_MARK + expression_from_steps(numbers, path)
        candidates = solutions(numbers, target, integer_only=True) or solutions(numbers, target)
        if not candidates:
            raise ValueError(f"problem {problem.key!r} has no solution")
        chosen = rng.choice(candidates)
        answer = "#" + expression_from_steps(numbers, chosen)
        if self.trace == "direct":
            return answer
        text = steps_text(chosen) + answer
        if self.trace == "steps":
            return text
        failures = []
        for _ in range(rng.randint(0, self.max_failed)):
            # A random integer-only path misses the target almost always; retry when it hits.
            for _attempt in range(20):
                path = _random_integer_path(numbers, rng)
                if path[-1][3] != target:
                    failures.append(steps_text(path) + "!;")
                    break
        return "".join(failures) + text

    def diagnose(self, problem: Problem, completion: str) -> str:
        """The completion's error mode, one of ERROR_MODES (see ``diagnose``)."""
        return diagnose(problem.data["numbers"], int(problem.data["target"]), completion)

    def score(self, problem: Problem, completion: str) -> float:
        answer = final_answer(completion)
        if answer is None:
            return 0.0
        return 1.0 if verify(problem.data["numbers"], problem.data["target"], answer) else 0.0


NL_ANSWER = "Answer:"


class NaturalCountdownTask(CountdownTask):
    """Countdown in natural language, for models with a real tokenizer and a chat template.

    The same problems, splits and keys as ``CountdownTask(variant)``; the prompt names the numbers
    and the target in words, and a completion ends with ``Answer: <expression>``, e.g.
    ``48-35=13, 54+13=67. Answer: 54+48-35``. The verifier reads the expression after the last
    ``Answer:`` (up to the end of that line) with exact rational arithmetic.
    """

    def __init__(self, variant: str = "countdown-3", max_new_tokens: int = 64) -> None:
        super().__init__(variant, trace="steps")
        self.max_new_tokens = max_new_tokens

    @staticmethod
    def render(numbers: list[int], target: int) -> str:
        listed = ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"
        return (f"Using the numbers {listed}, make {target}. Use each number exactly once, with + - * / and "
                f"parentheses. Write the steps, then the final expression after \"{NL_ANSWER}\".")

    def problems(self, split: str, count: int, seed: int = 0) -> list[Problem]:
        return [Problem(task=self.name, key=p.key, prompt=self.render(p.data["numbers"], int(p.data["target"])),
                        data=p.data) for p in super().problems(split, count, seed)]

    def reference(self, problem: Problem, rng: random.Random) -> str:
        steps, answer = super().reference(problem, rng).split(ANSWER_MARK)
        return f"{steps.replace(',', ', ')}. {NL_ANSWER} {answer}"

    def score(self, problem: Problem, completion: str) -> float:
        if NL_ANSWER not in completion:
            return 0.0
        answer = completion.rsplit(NL_ANSWER, 1)[1].strip().split("\n")[0].strip().rstrip(".")
        return 1.0 if answer and verify(problem.data["numbers"], problem.data["target"], answer) else 0.0
