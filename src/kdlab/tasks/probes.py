"""Seven probe skills: the "prior skills" on which forgetting is measured.

The paper measures forgetting as the change of the mean score over seven out-of-distribution
benchmarks. Here the student base is pretrained on these seven small skills (it should master
each, >= 90%) and the same probes are scored before and after distillation.

Every probe is direct: the completion is ``"#" + answer`` with no trace, the answer is fully
determined by the prompt and checked by exact string match. All texts are short printable ASCII.

=========  ===  ======================  ==============  ==============================
skill      tag  prompt example          completion      distinct problems
=========  ===  ======================  ==============  ==============================
add        a    ``a47+38:``             ``#85``         90 * 90 = 8,100
compare    m    ``m347,291:``           ``#347``        990 * 989 (ordered, unequal)
sort       s    ``s53819:``             ``#13589``      10**4 + 10**5 (digits ascending)
reverse    v    ``vhouse:``             ``#esuoh``      26**4 + 26**5 + 26**6
copy       y    ``ytrains:``            ``#trains``     26**5 + 26**6 + 26**7
count      n    ``nabcaab:``            ``#3``          3**6 + ... + 3**9 (count of 'a')
successor  u    ``u1999:``              ``#2000``       9,999 (n in 0..9998, answer n+1)
=========  ===  ======================  ==============  ==============================

The key is the prompt body (tag and ":" removed), so it is canonical and splits come from
``split_of(key)``; every skill has well over 100 distinct test problems.
"""
from __future__ import annotations

import random
from abc import abstractmethod
import string

from .base import ANSWER_MARK, PROMPT_END, SPLITS, Problem, Split, Task, final_answer, split_of

_LOWER = string.ascii_lowercase


def _check_int(value: object, name: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value


class ProbeTask(Task):
    """Shared machinery of the probes: subclasses set ``skill``, ``tag``, ``max_new_tokens``,
    ``space_size`` (number of distinct keys) and implement ``sample_key`` and ``answer``."""

    skill: str = ""
    space_size: int = 0

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = f"probe-{cls.skill}"

    @abstractmethod
    def sample_key(self, rng: random.Random) -> str:
        """One random key (the prompt body) drawn with ``rng``."""
        ...

    @abstractmethod
    def answer(self, key: str) -> str:
        """The correct answer for ``key``."""
        ...

    def problem_for_key(self, key: str) -> Problem:
        """The problem whose prompt body is ``key``."""
        prompt = f"{self.tag}{key}{PROMPT_END}"
        return Problem(task=self.name, key=key, prompt=prompt, data={"answer": self.answer(key)})

    def capacity(self, split: Split) -> int:
        """A safe count: 70% of the split's expected share of the key space (``problems`` finds
        keys by rejection sampling, which needs slack)."""
        share = {"train": 0.8, "validation": 0.1, "test": 0.1}[split]
        return int(0.7 * share * self.space_size)

    def problems(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        """``count`` distinct problems of ``split`` (rejection sampling of keys, seeded).

        Raises ValueError when the split cannot supply ``count`` distinct problems (detected by
        an attempt budget that is ample for any count up to ~80% of the split).
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        _check_int(count, "count", 0)
        _check_int(seed, "seed")
        if count > self.space_size:
            raise ValueError(f"count={count} exceeds the {self.space_size} problems of {self.name}")
        rng = random.Random(f"{self.name}:{split}:{seed}")
        seen: set[str] = set()
        out: list[Problem] = []
        attempts, budget = 0, 200 * count + 20_000
        while len(out) < count:
            attempts += 1
            if attempts > budget:
                raise ValueError(
                    f"count={count} is more than the distinct {split} problems "
                    f"{self.name} can supply"
                )
            key = self.sample_key(rng)
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            out.append(self.problem_for_key(key))
        return out

    def reference(self, problem: Problem, rng: random.Random) -> str:
        """``"#" + answer`` (``rng`` unused: probes are deterministic and have no trace)."""
        self._check_problem(problem)
        return ANSWER_MARK + problem.data["answer"]

    def score(self, problem: Problem, completion: str) -> float:
        """1.0 when the text after the last "#" equals the answer exactly, else 0.0."""
        self._check_problem(problem)
        return 1.0 if final_answer(completion) == problem.data["answer"] else 0.0

    def _check_problem(self, problem: Problem) -> None:
        if problem.task != self.name:
            raise ValueError(f"problem.task must be {self.name!r}, got {problem.task!r}")


def _two_or_three_digit(rng: random.Random) -> int:
    """A number whose digit count (2 or 3) is chosen first, uniformly, then its value."""
    return rng.randint(10, 99) if rng.random() < 0.5 else rng.randint(100, 999)


class AddProbe(ProbeTask):
    """Sum of two 2-digit numbers: ``a47+38:`` -> ``#85``."""

    skill, tag, max_new_tokens, space_size = "add", "a", 4, 90 * 90

    def sample_key(self, rng: random.Random) -> str:
        return f"{rng.randint(10, 99)}+{rng.randint(10, 99)}"

    def answer(self, key: str) -> str:
        a, b = key.split("+")
        return str(int(a) + int(b))


class CompareProbe(ProbeTask):
    """Larger of two different 2-3 digit numbers: ``m347,291:`` -> ``#347``."""

    skill, tag, max_new_tokens, space_size = "compare", "m", 4, 990 * 989

    def sample_key(self, rng: random.Random) -> str:
        a = _two_or_three_digit(rng)
        b = a
        while b == a:
            b = _two_or_three_digit(rng)
        return f"{a},{b}"

    def answer(self, key: str) -> str:
        return str(max(int(x) for x in key.split(",")))


class SortProbe(ProbeTask):
    """Digits sorted ascending, 4-5 digits: ``s53819:`` -> ``#13589``."""

    skill, tag, max_new_tokens, space_size = "sort", "s", 6, 10**4 + 10**5

    def sample_key(self, rng: random.Random) -> str:
        return "".join(rng.choice(string.digits) for _ in range(rng.randint(4, 5)))

    def answer(self, key: str) -> str:
        return "".join(sorted(key))


class ReverseProbe(ProbeTask):
    """4-6 lowercase letters reversed: ``vhouse:`` -> ``#esuoh``."""

    skill, tag, max_new_tokens, space_size = "reverse", "v", 7, 26**4 + 26**5 + 26**6

    def sample_key(self, rng: random.Random) -> str:
        return "".join(rng.choice(_LOWER) for _ in range(rng.randint(4, 6)))

    def answer(self, key: str) -> str:
        return key[::-1]


class CopyProbe(ProbeTask):
    """5-7 lowercase letters copied: ``ytrains:`` -> ``#trains``."""

    skill, tag, max_new_tokens, space_size = "copy", "y", 8, 26**5 + 26**6 + 26**7

    def sample_key(self, rng: random.Random) -> str:
        return "".join(rng.choice(_LOWER) for _ in range(rng.randint(5, 7)))

    def answer(self, key: str) -> str:
        return key


class CountProbe(ProbeTask):
    """How many 'a' in 6-9 letters from {a, b, c}: ``nabcaab:`` -> ``#3``."""

    skill, tag, max_new_tokens, space_size = "count", "n", 2, sum(3**n for n in range(6, 10))

    def sample_key(self, rng: random.Random) -> str:
        return "".join(rng.choice("abc") for _ in range(rng.randint(6, 9)))

    def answer(self, key: str) -> str:
        return str(key.count("a"))


class SuccessorProbe(ProbeTask):
    """The next integer, n in 0..9998: ``u1999:`` -> ``#2000``."""

    skill, tag, max_new_tokens, space_size = "successor", "u", 5, 9999

    def sample_key(self, rng: random.Random) -> str:
        return str(rng.randint(0, 9998))

    def answer(self, key: str) -> str:
        return str(int(key) + 1)


PROBES: dict[str, type[ProbeTask]] = {
    cls.skill: cls
    for cls in (AddProbe, CompareProbe, SortProbe, ReverseProbe, CopyProbe, CountProbe,
                SuccessorProbe)
}


def probe_tasks() -> list[ProbeTask]:
    """One instance of each probe, in the fixed order of ``PROBES``."""
    return [cls() for cls in PROBES.values()]


NATURAL_PROMPTS = {
    "add": "What is {0}? Answer with the number only.",
    "compare": "Which number is larger: {0}? Answer with the number only.",
    "sort": "Sort the digits of {0} in ascending order. Answer with the digits only.",
    "reverse": "Write the word \"{0}\" backwards. Answer with the reversed word only.",
    "copy": "Repeat this word exactly: {0}",
    "count": "How many times does the letter a appear in \"{0}\"? Answer with the number only.",
    "successor": "What number comes right after {0}? Answer with the number only.",
}


class NaturalProbe(Task):
    """A probe skill asked in natural language, for models with a real tokenizer (the forgetting
    set of a pretrained profile, ``pretrained.probes``). Same problems, keys and answers as the
    toy probe; the prompt is a plain question (``NATURAL_PROMPTS``) and the score reads the last
    number or word of the completion's first non-empty line (quotes and punctuation stripped),
    so "47 + 38 = 85" and "85" both answer ``add`` 47+38."""

    def __init__(self, probe: ProbeTask, max_new_tokens: int = 24):
        self.probe, self.skill = probe, probe.skill
        self.name, self.tag, self.max_new_tokens = f"{probe.name}-nl", probe.tag, max_new_tokens

    def _natural(self, p: Problem) -> Problem:
        body = p.key.replace(",", " or ") if self.skill == "compare" else p.key
        return Problem(task=self.name, key=p.key, prompt=NATURAL_PROMPTS[self.skill].format(body), data=p.data)

    def capacity(self, split: Split) -> int:
        return self.probe.capacity(split)

    def problems(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        return [self._natural(p) for p in self.probe.problems(split, count, seed)]

    def reference(self, problem: Problem, rng: random.Random) -> str:
        return problem.data["answer"]

    def score(self, problem: Problem, completion: str) -> float:
        lines = [ln for ln in completion.splitlines() if ln.strip()]
        words = lines[0].replace("'", " ").replace('"', " ").split() if lines else []
        last = words[-1].strip(".,;:!?()[]*`") if words else ""
        return 1.0 if last == problem.data["answer"] else 0.0


def natural_probes() -> list[NaturalProbe]:
    """The seven probe skills as natural-language questions, in the order of ``PROBES``."""
    return [NaturalProbe(p) for p in probe_tasks()]
