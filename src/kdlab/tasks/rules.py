"""Rule application multiple choice, ``rules-mc`` (tag ``r``): the Science stand-in.

Applying hidden "laws" in sequence; only a model trained on this world knows the laws.

World
    ``world_seed`` fixes eight rules named ``s t u v w x y z``. Each rule is a hidden substitution
    of the digits 0-9 (a random permutation, never the identity, all eight distinct) applied to
    every digit of a number: 8 * 10 = 80 digit-level facts such as "rule s turns 4 into 7".

Question
    A two-digit input, a sequence of 2 or 3 rules, and four candidate results, each printed with
    its label A-D. Prompt ``r45stu?12A,45B,34C,07D:`` reads: apply s, then t, then u to 45; which
    result is right? The reference completion ``45s71t09u45#45B`` writes the value after each
    rule (so every fact used is visible to a student distilled on teacher traces), then the final
    answer: the result and its letter. The score checks the letter: the final answer is
    ``<letter>`` or ``<two digits><letter>``.

    Labels follow the value's residue mod 4 (format version 2): A = 0, B = 1, C = 2, D = 3, so
    the options are the answer plus one distractor of each other residue. Why: see
    ``kdlab.tasks.kb`` - with options in a random order tiny teachers stayed at chance on the
    letter long after their traces were right; with residue labels the letter is a fixed
    function of the result (a 100-entry table), and the task measures whether the model knows
    the rules.

Splits
    The key is input + rules (``45stu``): 100 * (8**2 + 8**3) = 57,600 distinct questions, split
    by ``split_of(key)``. Test keys are new combinations of input and rules; the facts they use
    (single-digit substitutions) are all used by many training questions. The key does not
    depend on ``world_seed``, so every world has the same splits.

Chance level and why the student base is weak
    Each distractor is the input pushed through a random digit permutation, chosen among those
    of the residue it stands for; the answer is the input pushed through the composed rules, also
    a digit permutation, so options and answer share every world-free property (equal digits stay
    equal, distinct ones stay distinct) and the answer's residue is close to uniform: without this
    world's rules the expected accuracy is about 25%. The student base is pretrained on the same
    format with another ``world_seed``: it applies its own rules and labels its own result, which
    falls in the answer's residue about one time in four.
"""
from __future__ import annotations

import random
from functools import cache
from itertools import product

from .base import ANSWER_MARK, PROMPT_END, SPLITS, Problem, Split, Task, final_answer, split_of

DIGITS = "0123456789"
RULES = "stuvwxyz"
INPUT_LEN = 2
STEPS = (2, 3)
LETTERS = "ABCD"
OPTION_SEP = ","


@cache
def _keys_by_split() -> dict[str, tuple[str, ...]]:
    """All keys (input digits + rule symbols) grouped by split; world independent."""
    groups: dict[str, list[str]] = {s: [] for s in SPLITS}
    inputs = ["".join(d) for d in product(DIGITS, repeat=INPUT_LEN)]
    for steps in STEPS:
        for seq in product(RULES, repeat=steps):
            rules = "".join(seq)
            for value in inputs:
                key = value + rules
                groups[split_of(key)].append(key)
    return {s: tuple(keys) for s, keys in groups.items()}


def label_of(value: str) -> str:
    """The letter of a value's residue mod 4: 0 -> A, 1 -> B, 2 -> C, 3 -> D."""
    return LETTERS[int(value) % len(LETTERS)]


def _pattern(value: str) -> tuple[int, ...]:
    """Which digits of ``value`` are equal: (0, 1) for 45, (0, 0) for 44."""
    return tuple(value.index(d) for d in value)


@cache
def _images(value: str) -> tuple[str, ...]:
    """Every image of ``value`` under some digit permutation: the digit strings of its length
    with the same equal-digit pattern."""
    return tuple(w for w in ("".join(t) for t in product(DIGITS, repeat=len(value)))
                 if _pattern(w) == _pattern(value))


def _check_int(value: object, name: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


def _substitute(value: str, table: str) -> str:
    """Apply a digit substitution (``table[d]`` is the image of digit d) to every digit."""
    return "".join(table[int(d)] for d in value)


class RulesTask(Task):
    """2-3 hidden digit-substitution rules applied to a 2-digit input, four options A-D."""

    name = "rules-mc"
    tag = "r"
    format_version = 2  # options labelled by residue mod 4; final answer "<value><letter>"
    # trace: input, then (rule, value) per step; then "#", the result and its letter
    max_new_tokens = INPUT_LEN + (1 + INPUT_LEN) * max(STEPS) + 2 + INPUT_LEN

    def __init__(self, world_seed: int = 0) -> None:
        self.world_seed = _check_int(world_seed, "world_seed")
        rng = random.Random(f"rules-world:{world_seed}")
        tables: list[str] = []
        while len(tables) < len(RULES):
            perm = list(DIGITS)
            rng.shuffle(perm)
            table = "".join(perm)
            if table != DIGITS and table not in tables:
                tables.append(table)
        self._tables: dict[str, str] = dict(zip(RULES, tables))

    # ----- the world -------------------------------------------------------------------------
    def world_facts(self) -> list[str]:
        """One line per rule: ``"s maps 0123456789 to 5820417369"`` (digit i -> i-th char)."""
        return [f"{r} maps {DIGITS} to {self._tables[r]}" for r in RULES]

    def values(self, value: str, rules: str) -> list[str]:
        """The value before and after each rule: length len(rules) + 1."""
        if not value or any(d not in DIGITS for d in value):
            raise ValueError(f"value must be a non-empty digit string, got {value!r}")
        if not rules or any(r not in RULES for r in rules):
            raise ValueError(f"rules must be a non-empty string over {RULES!r}, got {rules!r}")
        out = [value]
        for rule in rules:
            out.append(_substitute(out[-1], self._tables[rule]))
        return out

    def trace(self, value: str, rules: str) -> str:
        """The steps as text: ``45s71t09u33`` = 45 -s-> 71 -t-> 09 -u-> 33."""
        steps = self.values(value, rules)
        return steps[0] + "".join(r + v for r, v in zip(rules, steps[1:]))

    # ----- problems --------------------------------------------------------------------------
    def problem_for_key(self, key: str) -> Problem:
        """The problem of ``key`` = input + rules (distractors seeded by world + key)."""
        value, rules = key[:INPUT_LEN], key[INPUT_LEN:]
        if len(rules) not in STEPS:
            raise ValueError(f"key must be {INPUT_LEN} digits and {STEPS} rules, got {key!r}")
        answer = self.values(value, rules)[-1]
        rng = random.Random(f"rules-options:{self.world_seed}:{key}")
        letter = label_of(answer)
        options = [answer if label == letter else rng.choice([v for v in _images(value) if label_of(v) == label])
                   for label in LETTERS]
        listing = OPTION_SEP.join(o + label for o, label in zip(options, LETTERS))
        prompt = f"{self.tag}{value}{rules}?{listing}{PROMPT_END}"
        data = {"world_seed": self.world_seed, "input": value, "rules": rules,
                "options": options, "answer_value": answer, "answer": letter}
        return Problem(task=self.name, key=key, prompt=prompt, data=data)

    def capacity(self, split: Split) -> int:
        return len(_keys_by_split()[split])

    def problems(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        """``count`` distinct problems of ``split``, in an order fixed by ``seed``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        _check_int(count, "count", 0)
        _check_int(seed, "seed")
        keys = list(_keys_by_split()[split])
        if count > len(keys):
            raise ValueError(
                f"count={count} exceeds the {len(keys)} {split} problems of {self.name}"
            )
        random.Random(f"{self.name}:{split}:{seed}").shuffle(keys)
        return [self.problem_for_key(k) for k in keys[:count]]

    @staticmethod
    def parse_prompt(prompt: str) -> tuple[str, str, list[str]]:
        """(input, rules, options) of a ``rules-mc`` prompt such as ``r45stu?12A,45B,34C,07D:``."""
        body = prompt[1:-1] if len(prompt) >= 2 else ""
        head, _, tail = body.partition("?")
        labelled = tail.split(OPTION_SEP)
        options = [o[:-1] for o in labelled]
        value, rules = head[:INPUT_LEN], head[INPUT_LEN:]
        ok = (prompt[:1] == RulesTask.tag and prompt.endswith(PROMPT_END)
              and len(value) == INPUT_LEN and all(d in DIGITS for d in value)
              and len(rules) in STEPS and all(r in RULES for r in rules)
              and len(labelled) == 4 and "".join(o[-1:] for o in labelled) == LETTERS
              and all(len(o) == INPUT_LEN and o.isdigit() and label_of(o) == label for o, label in zip(options, LETTERS))
              and all(len(o) == INPUT_LEN and all(d in DIGITS for d in o) for o in options))
        if not ok:
            raise ValueError(f"prompt is not a {RulesTask.name} prompt: {prompt!r}")
        return value, rules, options

    def solve(self, prompt: str) -> str:
        """The completion this world's rules give for ``prompt`` (possibly another world's): the
        steps, then the result and its residue's letter (right about one time in four on another
        world's questions)."""
        value, rules, _ = self.parse_prompt(prompt)
        result = self.values(value, rules)[-1]
        return self.trace(value, rules) + ANSWER_MARK + result + label_of(result)

    def reference(self, problem: Problem, rng: random.Random) -> str:
        """Trace + "#" + result + letter under this world (``rng`` unused: deterministic)."""
        self._check_problem(problem)
        return self.solve(problem.prompt)

    def score(self, problem: Problem, completion: str) -> float:
        """1.0 when the text after the last "#" is the right letter, alone or after two digits
        (``C`` or ``33C``; the value is the model's restatement and is not judged), else 0.0."""
        self._check_problem(problem)
        ans = final_answer(completion)
        if ans is None or len(ans) not in (1, 1 + INPUT_LEN) or not all(d in DIGITS for d in ans[:-1]):
            return 0.0
        return 1.0 if ans[-1] == problem.data["answer"] else 0.0

    def _check_problem(self, problem: Problem) -> None:
        if problem.task != self.name:
            raise ValueError(f"problem.task must be {self.name!r}, got {problem.task!r}")
