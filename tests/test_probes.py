"""Tests of the seven probe skills (kdlab.tasks.probes)."""
from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from kdlab.tasks.base import SPLITS, Task, split_of
from kdlab.tasks.probes import PROBES, probe_tasks

PRINTABLE = {chr(c) for c in range(32, 127)}
SKILLS = ["add", "compare", "sort", "reverse", "copy", "count", "successor"]
RNG = random.Random(0)


# Independent answers, parsed from the prompt text alone.
def _sort_by_counting(s: str) -> str:
    counts = Counter(s)
    return "".join(d * counts[d] for d in "0123456789")


EXPECTED = {
    "add": (r"a(\d\d)\+(\d\d):", lambda m: str(int(m[1]) + int(m[2]))),
    "compare": (r"m(\d{2,3}),(\d{2,3}):",
                lambda m: m[1] if int(m[1]) > int(m[2]) else m[2]),
    "sort": (r"s(\d{4,5}):", lambda m: _sort_by_counting(m[1])),
    "reverse": (r"v([a-z]{4,6}):",
                lambda m: "".join(m[1][i] for i in range(len(m[1]) - 1, -1, -1))),
    "copy": (r"y([a-z]{5,7}):", lambda m: m[1]),
    "count": (r"n([abc]{6,9}):", lambda m: str(sum(1 for ch in m[1] if ch == "a"))),
    "successor": (r"u(0|[1-9]\d{0,3}):", lambda m: str(int(m[1]) + 1)),
}


def test_registry() -> None:
    assert list(PROBES) == SKILLS
    tasks = probe_tasks()
    assert [t.name for t in tasks] == [f"probe-{s}" for s in SKILLS]
    assert [type(t) for t in tasks] == list(PROBES.values())
    assert all(isinstance(t, Task) for t in tasks)
    tags = [t.tag for t in tasks]
    assert all(len(tag) == 1 for tag in tags)
    assert len(set(tags)) == 7 and not set(tags) & {"c", "k", "r"}
    assert [t.name for t in probe_tasks()] == [t.name for t in tasks]  # fixed order


@pytest.mark.parametrize("skill", SKILLS)
def test_answers_texts_and_lengths(skill: str) -> None:
    task = PROBES[skill]()
    assert task.max_new_tokens <= 12
    pattern, solve = EXPECTED[skill]
    problems = task.problems("train", 400, seed=1) + task.problems("test", 100, seed=1)
    for p in problems:
        m = re.fullmatch(pattern, p.prompt)
        assert m, p.prompt
        ref = task.reference(p, RNG)
        assert ref == "#" + solve(m)
        assert set(p.prompt) <= PRINTABLE and set(ref) <= PRINTABLE
        assert len(ref) <= task.max_new_tokens and len(p.prompt) <= 12
        assert p.prompt == task.tag + p.key + ":"
        assert task.score(p, ref) == 1.0
    assert max(len(task.reference(p, RNG)) for p in problems) == task.max_new_tokens


@pytest.mark.parametrize("skill", SKILLS)
def test_wrong_answers_score_zero(skill: str) -> None:
    task = PROBES[skill]()
    for p in task.problems("validation", 50, seed=2):
        answer = task.reference(p, RNG)[1:]
        # change the last character to another one of the same kind
        last = answer[-1]
        pool = "0123456789" if last.isdigit() else "abcdefghijklmnopqrstuvwxyz"
        wrong = answer[:-1] + pool[(pool.index(last) + 1) % len(pool)]
        assert task.score(p, "#" + wrong) == 0.0
        assert task.score(p, "#" + answer + answer[-1]) == 0.0
        assert task.score(p, answer) == 0.0          # no answer mark
        assert task.score(p, "#") == 0.0
        assert task.score(p, "x#y#" + answer + " ") == 1.0  # last mark counts, spaces stripped


def test_examples_by_hand() -> None:
    examples = {"add": ("47+38", "85"), "compare": ("347,291", "347"),
                "sort": ("53819", "13589"), "reverse": ("house", "esuoh"),
                "copy": ("trains", "trains"), "count": ("abcaab", "3"),
                "successor": ("1999", "2000")}
    for skill, (key, answer) in examples.items():
        task = PROBES[skill]()
        p = task.problem_for_key(key)
        assert task.reference(p, RNG) == "#" + answer
        assert p.key == key and split_of(key) in SPLITS


@pytest.mark.parametrize("skill", SKILLS)
def test_determinism_splits_and_size(skill: str) -> None:
    task = PROBES[skill]()
    a = task.problems("test", 100, seed=3)
    b = PROBES[skill]().problems("test", 100, seed=3)
    assert [(p.key, p.prompt, p.data) for p in a] == [(p.key, p.prompt, p.data) for p in b]
    assert [p.key for p in task.problems("test", 30, seed=3)] == [p.key for p in a[:30]]
    assert [p.key for p in task.problems("test", 100, seed=4)] != [p.key for p in a]
    keys = {}
    for split in SPLITS:
        problems = task.problems(split, 150, seed=5)
        assert all(split_of(p.key) == split for p in problems)
        keys[split] = {p.key for p in problems}
        assert len(keys[split]) == 150  # >= 100 distinct in every split, test included
    assert not keys["train"] & keys["test"]
    assert not keys["train"] & keys["validation"]
    assert not keys["validation"] & keys["test"]
    assert task.space_size * 0.1 >= 500  # test split holds several hundred problems


def test_space_sizes_match_enumeration() -> None:
    adds = {f"{a}+{b}" for a in range(10, 100) for b in range(10, 100)}
    assert PROBES["add"].space_size == len(adds)
    assert PROBES["successor"].space_size == len(range(0, 9999))
    assert PROBES["count"].space_size == 729 + 2187 + 6561 + 19683
    assert PROBES["sort"].space_size == 110_000
    assert PROBES["compare"].space_size == 990 * 990 - 990


def test_small_space_is_exhausted_cleanly() -> None:
    task = PROBES["successor"]()
    test_keys = [str(n) for n in range(9999) if split_of(str(n)) == "test"]
    assert len(task.problems("test", 800, seed=0)) == 800
    with pytest.raises(ValueError, match="count"):
        task.problems("test", len(test_keys) + 1, seed=0)
    with pytest.raises(ValueError, match="count"):
        task.problems("test", 10_000, seed=0)


def test_bad_input_raises() -> None:
    task = PROBES["add"]()
    with pytest.raises(ValueError, match="split"):
        task.problems("dev", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        task.problems("train", -2)
    with pytest.raises(ValueError, match="seed"):
        task.problems("train", 2, seed=1.5)  # type: ignore[arg-type]
    foreign = PROBES["copy"]().problems("train", 1)[0]
    with pytest.raises(ValueError, match="problem.task"):
        task.score(foreign, "#x")
    with pytest.raises(ValueError, match="problem.task"):
        task.reference(foreign, RNG)
    assert task.problems("train", 0) == []
