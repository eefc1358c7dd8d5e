"""Real datasets from local files: multiple-choice reasoning and boxed-answer maths.

Two task kinds, both ``kdlab.tasks.base.Task`` subclasses so that pools, accuracy and pass@k
code can use them:

- ``ChoiceTask`` (MedReason / MedQA style): rows with a question, options (letter -> text, a
  list, or "A. ..." lines) and the correct letter (``answer_idx``, or the answer's text);
  graded by ``kdlab.tasks.grading.grade_choice``.
- ``MathTask`` (MATH / NuminaMath style): rows with a problem, a solution and the final answer
  (taken from the solution's last \\boxed{} when there is no answer column); graded by
  ``grade_math``.

Files are read with ``datasets.load_dataset("json" | "parquet", data_files=path)``; nothing is
downloaded. Unlike the toy tasks, prompts are free text (newlines, Unicode): they are meant for
a real tokenizer, which applies its chat template (``kdlab.models.hf.render_prompt``).

Splits come from ``split_of`` on a content hash of each row, so they are stable under file
reordering and identical questions in two files land in the same split. A file used only for
evaluation (a benchmark) puts every row in "test" (``fractions=(0, 0, 1)``).
"""
from __future__ import annotations

from abc import abstractmethod

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any, Iterable

from .base import Problem, Split, SPLITS, Task, split_of
from .grading import extract_math_answer, grade_choice, grade_math

KINDS = ("choice", "math")
CHOICE_INSTRUCTION = ("Think step by step, then finish with \"The answer is X\", where X is the letter "
                      "of the correct option.")
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
SOLUTION_FIELDS = ("reasoning", "explanation", "rationale", "solution")
EVAL_ONLY = (0.0, 0.0, 1.0)
_OPTION_LINE = re.compile(r"^\s*\(?([A-Za-z])[.):]\s+(.*\S)\s*$")


def read_rows(path: str | Path, limit: int | None = None, cache_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of a local .jsonl / .json / .parquet file as dicts, in file order (first ``limit``)."""
    import datasets
    from datasets import load_dataset

    datasets.disable_progress_bars()  # a local file reads in moments; its bars would only be noise
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path {str(path)!r} is not a file")
    suffix = path.suffix.lower()
    builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)
    if builder is None:
        raise ValueError(f"path {str(path)!r}: unsupported file type {suffix!r}; use .jsonl, .json or .parquet")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit!r}")
    ds = load_dataset(builder, data_files=str(path), split="train",
                      cache_dir=str(cache_dir) if cache_dir is not None else None)
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    return ds.to_list()


def _content_key(kind: str, *parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False)
    return f"{kind}:{hashlib.sha256(blob.encode()).hexdigest()[:20]}"


def parse_options(options: Any, where: str) -> dict[str, str]:
    """Options as an ordered letter -> text dict from a dict (None values dropped: a JSON
    loader fills absent letters with None), a list (lettered A, B, ...), or "A. text" lines."""
    if isinstance(options, dict):
        out = {str(k).strip(): str(v).strip() for k, v in options.items() if v is not None}
    elif isinstance(options, (list, tuple)):
        out = {chr(ord("A") + i): str(v).strip() for i, v in enumerate(options)}
    elif isinstance(options, str):
        out = {}
        for line in options.splitlines():
            m = _OPTION_LINE.match(line)
            if m:
                out[m.group(1).upper()] = m.group(2)
    else:
        raise ValueError(f"{where}: options must be a dict, a list or 'A. text' lines, got {options!r}")
    if len(out) < 2:
        raise ValueError(f"{where}: needs at least two options, got {options!r}")
    return dict(sorted(out.items()))


class RealTask(Task):
    """A task over the rows of one local file. Subclasses implement ``_problem(row, where)``.

    Args:
        path: .jsonl / .json / .parquet file.
        name: task name (default: the file's stem).
        fractions: (train, validation, test) shares for ``split_of``; ``EVAL_ONLY`` puts every
            row in "test".
        max_new_tokens: completion budget in tokens.
        instruction: the line appended to every prompt (``None``: the kind's default).
        limit: read only the first ``limit`` rows.
        cache_dir: ``datasets`` cache directory (default: its usual one).
    """

    kind = ""
    default_instruction = ""

    def __init__(self, path: str | Path, *, name: str | None = None,
                 fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), max_new_tokens: int = 2048,
                 instruction: str | None = None, limit: int | None = None, cache_dir: str | Path | None = None):
        if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
            raise ValueError(f"fractions must be three non-negative shares summing to 1, got {fractions!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
        self.path = Path(path)
        self.name = name or self.path.stem
        self.tag = self.kind
        self.fractions = tuple(fractions)
        self.max_new_tokens = max_new_tokens
        self.instruction = self.default_instruction if instruction is None else instruction
        self.n_skipped = 0  # rows without a usable answer (maths rows with no answer anywhere)
        seen: set[str] = set()
        self.all_problems: list[Problem] = []
        for i, row in enumerate(read_rows(self.path, limit, cache_dir)):
            prob = self._problem(row, f"{self.path}: row {i}")
            if prob is None:
                self.n_skipped += 1
            elif prob.key not in seen:  # identical rows are one problem
                seen.add(prob.key)
                self.all_problems.append(prob)
        self._splits: dict[str, list[Problem]] = {s: [] for s in SPLITS}
        for prob in self.all_problems:
            self._splits[split_of(prob.key, self.fractions)].append(prob)

    @abstractmethod
    def _problem(self, row: dict[str, Any], where: str) -> Problem | None:
        ...

    def _render(self, body: str) -> str:
        return f"{body}\n\n{self.instruction}" if self.instruction else body

    def capacity(self, split: Split) -> int:
        return len(self._check_split(split))

    def _check_split(self, split: str) -> list[Problem]:
        if split not in self._splits:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        return self._splits[split]

    def problems(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        """``count`` distinct problems of ``split`` (all of them when fewer exist), chosen with
        ``seed`` and returned in file order."""
        pool = self._check_split(split)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an int >= 0, got {count!r}")
        if count >= len(pool):
            return list(pool)
        rng = random.Random(f"{self.name}:{split}:{seed}")
        return [pool[i] for i in sorted(rng.sample(range(len(pool)), count))]


def _field(row: dict[str, Any], names: Iterable[str], where: str, required: bool = True) -> Any:
    names = list(names)
    for n in names:
        value = row.get(n)
        if value is not None and (not isinstance(value, str) or value.strip()):
            return value
    if required:
        raise ValueError(f"{where}: no non-empty field among {names}; row keys: {sorted(row)}")
    return None


class ChoiceTask(RealTask):
    """Multiple-choice reasoning (MedReason / MedQA / science style). Fields read: question
    (``question``); options (``options``); the correct letter (``answer_idx``, else ``answer``
    as a letter or as an option's exact text); an optional worked solution (``solution_field``,
    else the first of ``SOLUTION_FIELDS`` present)."""

    kind = "choice"
    default_instruction = CHOICE_INSTRUCTION

    def __init__(self, path: str | Path, *, solution_field: str | None = None, **kwargs: Any):
        self.solution_fields = (solution_field,) if solution_field else SOLUTION_FIELDS
        super().__init__(path, **kwargs)

    def _problem(self, row: dict[str, Any], where: str) -> Problem:
        question = str(_field(row, ["question"], where)).strip()
        options = parse_options(_field(row, ["options"], where), where)
        letter = row.get("answer_idx")
        if letter is None:
            answer = str(_field(row, ["answer"], where)).strip()
            by_text = [k for k, v in options.items() if v == answer]
            letter = answer.upper() if answer.upper() in options else (by_text[0] if len(by_text) == 1 else None)
            if letter is None:
                raise ValueError(f"{where}: answer {answer!r} is neither an option letter nor one option's text")
        letter = str(letter).strip()
        if letter not in options:
            raise ValueError(f"{where}: answer_idx {letter!r} is not one of the options {list(options)}")
        solution = _field(row, self.solution_fields, where, required=False)
        listing = "\n".join(f"{k}. {v}" for k, v in options.items())
        return Problem(task=self.name, key=_content_key("choice", question, options),
                       prompt=self._render(f"{question}\n\n{listing}"),
                       data={"question": question, "options": options, "answer_idx": letter,
                             "solution": None if solution is None else str(solution).strip()})

    def reference(self, problem: Problem, rng: random.Random | None = None) -> str:
        """The row's solution text (when it has one), then "The answer is X."."""
        d = problem.data
        final = f"The answer is {d['answer_idx']}."
        return f"{d['solution']}\n\n{final}" if d["solution"] else final

    def score(self, problem: Problem, completion: str) -> float:
        d = problem.data
        return float(grade_choice(completion, d["options"], d["answer_idx"]))


class MathTask(RealTask):
    """Boxed-answer maths (MATH / MATH-500 / NuminaMath style). Fields read: ``problem`` (or
    ``question``), ``solution`` (optional), ``answer`` (else the solution's last \\boxed{});
    rows with no answer anywhere are skipped and counted in ``n_skipped``."""

    kind = "math"
    default_instruction = MATH_INSTRUCTION

    def _problem(self, row: dict[str, Any], where: str) -> Problem | None:
        problem = str(_field(row, ["problem", "question"], where)).strip()
        solution = _field(row, ["solution"], where, required=False)
        solution = None if solution is None else str(solution).strip()
        answer = _field(row, ["answer"], where, required=False)
        if answer is None and solution:
            answer = extract_math_answer(solution)
        if answer is None or not str(answer).strip():
            return None
        answer = str(answer).strip()
        return Problem(task=self.name, key=_content_key("math", problem), prompt=self._render(problem),
                       data={"problem": problem, "answer": answer, "solution": solution})

    def reference(self, problem: Problem, rng: random.Random | None = None) -> str:
        """The row's solution when it already boxes an answer, else the solution (if any)
        followed by "The final answer is $\\boxed{answer}$."."""
        d = problem.data
        if d["solution"] and extract_math_answer(d["solution"]) is not None and "boxed" in d["solution"]:
            return d["solution"]
        final = f"The final answer is $\\boxed{{{d['answer']}}}$."
        return f"{d['solution']}\n\n{final}" if d["solution"] else final

    def score(self, problem: Problem, completion: str) -> float:
        return float(grade_math(completion, problem.data["answer"]))


TASK_CLASSES: dict[str, type[RealTask]] = {"choice": ChoiceTask, "math": MathTask}


def real_task(kind: str, path: str | Path, **kwargs: Any) -> RealTask:
    """A ``ChoiceTask`` or ``MathTask`` by kind name."""
    if kind not in TASK_CLASSES:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    return TASK_CLASSES[kind](path, **kwargs)


def load_benchmarks(specs: list[dict[str, Any]], cache_dir: str | Path | None = None) -> list[RealTask]:
    """Evaluation-only tasks for forgetting, from ``[{kind: choice|math, path: ..., name?: ...,
    limit?: int, max_new_tokens?: int, instruction?: str}, ...]``. Every row is a test row."""
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"benchmarks must be a non-empty list of {{kind, path}} mappings, got {specs!r}")
    allowed = {"kind", "path", "name", "limit", "max_new_tokens", "instruction"}
    tasks: list[RealTask] = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or "kind" not in spec or "path" not in spec:
            raise ValueError(f"benchmarks[{i}] must be a mapping with 'kind' and 'path', got {spec!r}")
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(f"benchmarks[{i}]: unknown key {unknown[0]!r}; valid keys: {sorted(allowed)}")
        kwargs = {k: v for k, v in spec.items() if k not in ("kind", "path")}
        tasks.append(real_task(spec["kind"], spec["path"], fractions=EVAL_ONLY, cache_dir=cache_dir, **kwargs))
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"benchmark names must be unique, got {names}; set 'name' to tell them apart")
    return tasks
