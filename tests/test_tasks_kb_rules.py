"""Tests of the two target tasks: kb-mc (knowledge base) and rules-mc (rule application)."""
from __future__ import annotations

import random
import re
from collections import Counter
from itertools import product

import pytest

from kdlab.tasks.base import SPLITS, Problem, split_of
from kdlab.tasks.kb import KBTask
from kdlab.tasks.rules import RulesTask

TASKS = [KBTask, RulesTask]
PRINTABLE = {chr(c) for c in range(32, 127)}
RNG = random.Random(0)


def letter_value(problem: Problem) -> str:
    """The option the problem's correct letter points at."""
    options = problem.data["options"]
    return options["ABCD".index(problem.data["answer"])]


# ----- independent solvers built only from world_facts() ------------------------------------
def kb_tables(task: KBTask) -> dict[str, dict[str, str]]:
    tables: dict[str, dict[str, str]] = {}
    for fact in task.world_facts():
        m = re.fullmatch(r"([a-z]) -(\d)-> ([a-z])", fact)
        assert m, fact
        tables.setdefault(m[2], {})[m[1]] = m[3]
    return tables


def rules_tables(task: RulesTask) -> dict[str, str]:
    tables = {}
    for fact in task.world_facts():
        m = re.fullmatch(r"([a-z]) maps 0123456789 to (\d{10})", fact)
        assert m, fact
        tables[m[1]] = m[2]
    return tables


def kb_answer_from_facts(task: KBTask, prompt: str) -> str:
    m = re.fullmatch(r"k([a-z])(\d+)\?[a-z]A[a-z]B[a-z]C[a-z]D:", prompt)
    assert m, prompt
    tables = kb_tables(task)
    node = m[1]
    for rel in m[2]:
        node = tables[rel][node]
    return node


def rules_answer_from_facts(task: RulesTask, prompt: str) -> str:
    m = re.fullmatch(r"r(\d\d)([a-z]+)\?\d\dA,\d\dB,\d\dC,\d\dD:", prompt)
    assert m, prompt
    tables = rules_tables(task)
    digits = [int(d) for d in m[1]]
    for rule in m[2]:
        digits = [int(tables[rule][d]) for d in digits]
    return "".join(map(str, digits))


def trace_facts(task, completion: str) -> set[tuple[str, str, str]]:
    """(source, rule, result) triples the trace reveals; digit-level for rules-mc."""
    trace = completion.split("#")[0]
    if isinstance(task, KBTask):
        return {(trace[i], trace[i + 1], trace[i + 2]) for i in range(0, len(trace) - 1, 2)}
    steps = re.findall(r"[a-z]\d\d", trace)
    values = [trace[:2]] + [s[1:] for s in steps]
    facts = set()
    for (rule, before, after) in zip([s[0] for s in steps], values, values[1:]):
        facts |= {(b, rule, a) for b, a in zip(before, after)}
    return facts


# ----- tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", TASKS)
def test_identity_and_bounds(cls) -> None:
    task = cls()
    assert (task.name, task.tag) == {KBTask: ("kb-mc", "k"), RulesTask: ("rules-mc", "r")}[cls]
    assert task.max_new_tokens <= 30
    problems = task.problems("train", 300, seed=3) + task.problems("test", 50, seed=3)
    for p in problems:
        completion = task.reference(p, RNG)
        for text in (p.prompt, completion):
            assert set(text) <= PRINTABLE, text
        assert p.prompt.startswith(task.tag) and p.prompt.endswith(":")
        assert len(p.prompt) <= 24
        assert len(completion) <= task.max_new_tokens
        assert p.task == task.name
    # the bound is tight: the longest questions fill it exactly
    assert max(len(task.reference(p, RNG)) for p in problems) == task.max_new_tokens


@pytest.mark.parametrize("cls", TASKS)
def test_determinism(cls) -> None:
    a = cls().problems("train", 40, seed=7)
    b = cls().problems("train", 40, seed=7)
    assert [(p.key, p.prompt, p.data) for p in a] == [(p.key, p.prompt, p.data) for p in b]
    assert [p.key for p in cls().problems("train", 10, seed=7)] == [p.key for p in a[:10]]
    c = cls().problems("train", 40, seed=8)
    assert [p.key for p in c] != [p.key for p in a]
    # same key -> same problem whatever the seed that produced it
    by_key = {p.key: p.prompt for p in a}
    for p in cls().problems("train", 400, seed=9):
        if p.key in by_key:
            assert by_key[p.key] == p.prompt
    assert [cls().reference(p, random.Random(i)) for i, p in enumerate(a)] == \
        [cls().reference(p, random.Random(0)) for p in a]


@pytest.mark.parametrize("cls", TASKS)
def test_splits_disjoint_and_distinct(cls) -> None:
    task = cls()
    sizes = {"train": 450, "validation": 50, "test": 50}
    keys = {}
    for split in SPLITS:
        problems = task.problems(split, sizes[split], seed=1)
        assert len(problems) == sizes[split]
        assert all(split_of(p.key) == split for p in problems)
        keys[split] = {p.key for p in problems}
        assert len(keys[split]) == sizes[split]
        assert len({p.prompt for p in problems}) == sizes[split]
    assert not keys["train"] & keys["test"]
    assert not keys["train"] & keys["validation"]
    assert not keys["validation"] & keys["test"]


def test_kb_has_enough_questions_and_rejects_too_many() -> None:
    task = KBTask()
    keys = [s + "".join(path) for s in "abcdefghijklmnopqrst" for n in (2, 3, 4)
            for path in product("123", repeat=n)]
    assert len(set(keys)) == 2340
    sizes = Counter(split_of(k) for k in keys)
    assert sizes["test"] >= 200 and sizes["validation"] >= 200
    for split in SPLITS:
        everything = task.problems(split, sizes[split], seed=2)
        assert {p.key for p in everything} == {k for k in keys if split_of(k) == split}
        with pytest.raises(ValueError, match="count"):
            task.problems(split, sizes[split] + 1)


def test_rules_has_enough_questions() -> None:
    task = RulesTask()
    assert len(task.problems("test", 2000, seed=0)) == 2000
    assert len({p.key for p in task.problems("test", 2000, seed=0)}) == 2000


@pytest.mark.parametrize("cls", TASKS)
def test_reference_is_correct_and_wrong_letters_score_zero(cls) -> None:
    task = cls()
    solver = kb_answer_from_facts if cls is KBTask else rules_answer_from_facts
    for p in task.problems("train", 200, seed=2) + task.problems("test", 60, seed=2):
        ref = task.reference(p, RNG)
        assert task.score(p, ref) == 1.0
        # the letter points at the value an independent solver computes from world_facts()
        assert letter_value(p) == solver(task, p.prompt)
        trace, answer = ref.split("#")
        value, letter = answer[:-1], answer[-1]
        assert letter == p.data["answer"] and value == letter_value(p)
        # the letter is the one printed right after the answer value in the prompt (format v2)
        listing = p.prompt.split("?")[1]
        assert value + letter in listing
        for wrong in "ABCD".replace(letter, ""):
            assert task.score(p, trace + "#" + value + wrong) == 0.0
            assert task.score(p, trace + "#" + wrong) == 0.0
        assert task.score(p, trace) == 0.0                      # no answer mark
        assert task.score(p, ref + "x") == 0.0                 # trailing junk
        assert task.score(p, trace + "#" + "?" * len(value) + letter) == 0.0  # malformed value
        assert task.score(p, "garbage#" + letter) == 1.0        # only the final answer counts
        assert task.score(p, trace + "#" + letter) == 1.0       # the bare letter is an answer
        assert task.score(p, ref + "  ") == 1.0                 # surrounding spaces stripped


def test_examples_by_hand() -> None:
    kb = KBTask()
    tables = kb_tables(kb)
    p = kb.problem_for_key("c21")
    x = tables["2"]["c"]
    y = tables["1"][x]
    assert kb.reference(p, RNG) == f"c2{x}1{y}#{y}" + p.data["answer"]
    listing = "".join(o + label for o, label in zip(p.data["options"], "ABCD"))
    assert p.prompt == f"kc21?{listing}:" and y in p.data["options"]

    rules = RulesTask()
    t = rules_tables(rules)
    p = rules.problem_for_key("07sz")
    mid = t["s"][0] + t["s"][7]
    end = t["z"][int(mid[0])] + t["z"][int(mid[1])]
    assert rules.reference(p, RNG) == f"07s{mid}z{end}#{end}" + p.data["answer"]
    assert p.prompt == "r07sz?" + ",".join(o + label for o, label in zip(p.data["options"], "ABCD")) + ":"


@pytest.mark.parametrize("cls", TASKS)
def test_options_are_well_formed_and_uninformative(cls) -> None:
    task = cls()
    problems = task.problems("train", 450, seed=4)
    letters = Counter(p.data["answer"] for p in problems)
    for letter in "ABCD":  # uniform order: each letter near 25%
        assert 0.15 < letters[letter] / len(problems) < 0.35
    for p in problems:
        options = list(p.data["options"])
        assert len(set(options)) == 4
        # format 2: an option's label is fixed by its value (kb: entity group a-e/f-j/k-o/p-t;
        # rules: residue mod 4), so the letter is a function of the answer, not of an ordering
        for o, label in zip(options, "ABCD"):
            group = "abcdefghijklmnopqrst".index(o) // 5 if cls is KBTask else int(o) % 4
            assert "ABCD"[group] == label
        if cls is RulesTask:
            # every option keeps the input's equal-digit pattern, like the true answer
            value = p.data["input"]
            for o in options:
                assert (o[0] == o[1]) == (value[0] == value[1])


@pytest.mark.parametrize("cls", TASKS)
def test_world_is_a_set_of_permutations(cls) -> None:
    task = cls()
    if cls is KBTask:
        tables = kb_tables(task)
        assert len(task.world_facts()) == 60
        for table in tables.values():
            assert sorted(table) == sorted(table.values()) == list("abcdefghijklmnopqrst")
    else:
        tables = rules_tables(task)
        assert len(tables) == 8 and len(set(tables.values())) == 8
        for table in tables.values():
            assert sorted(table) == list("0123456789") and table != "0123456789"


@pytest.mark.parametrize("cls", TASKS)
def test_trace_reveals_facts_and_test_facts_appear_in_training(cls) -> None:
    task = cls()
    if cls is KBTask:
        tables = kb_tables(task)
        true = {(s, r, d) for r, t in tables.items() for s, d in t.items()}
    else:
        tables = rules_tables(task)
        true = {(str(i), r, t[i]) for r, t in tables.items() for i in range(10)}
    n_train = 1850 if cls is KBTask else 2000
    train_facts: set = set()
    for p in task.problems("train", n_train, seed=0):
        facts = trace_facts(task, task.reference(p, RNG))
        assert facts <= true
        train_facts |= facts
    for p in task.problems("test", 60, seed=0):
        assert trace_facts(task, task.reference(p, RNG)) <= train_facts


@pytest.mark.parametrize("cls", TASKS)
def test_worlds_differ_and_foreign_world_is_near_chance(cls) -> None:
    w0, w1 = cls(0), cls(1)
    assert w0.world_facts() != w1.world_facts()
    assert cls(0).world_facts() == w0.world_facts()
    assert set(w0.world_facts()) != set(w1.world_facts())
    # splits do not depend on the world; the correct answers do
    p0 = w0.problems("train", 200, seed=5)
    p1 = w1.problems("train", 200, seed=5)
    assert [p.key for p in p0] == [p.key for p in p1]
    assert [p.data for p in p0] != [p.data for p in p1]
    # a model that knows only world 1 answers world-0 questions near chance (25%)
    share = sum(w0.score(p, w1.reference(p, RNG)) for p in p0) / len(p0)
    assert 0.10 <= share <= 0.45
    assert sum(w0.score(p, w0.reference(p, RNG)) for p in p0) == len(p0)


@pytest.mark.parametrize("cls", TASKS)
def test_bad_input_raises(cls) -> None:
    task = cls()
    with pytest.raises(ValueError, match="split"):
        task.problems("dev", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        task.problems("train", -1)
    with pytest.raises(ValueError, match="seed"):
        task.problems("train", 3, seed="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="world_seed"):
        cls(world_seed="a")  # type: ignore[arg-type]
    other = KBTask if cls is RulesTask else RulesTask
    foreign = other().problems("train", 1)[0]
    with pytest.raises(ValueError, match="problem.task"):
        task.score(foreign, "#A")
    with pytest.raises(ValueError, match="prompt"):
        task.solve("x123?abcd:")
    with pytest.raises(ValueError, match="prompt"):  # format 1 (options without labels)
        task.solve("ka12?abcd:" if cls is KBTask else "r45st?12,45,78,01:")
    assert task.problems("train", 0) == []
