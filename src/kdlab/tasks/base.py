"""The one small interface every kdlab task implements.

A task generates problems deterministically from a seed and a split, renders the prompt the
student sees, gives a reference completion (reasoning trace then final answer) for teacher
training, and scores a completion with a verifier (never with a model).

Text conventions (the tokenizer is character level, see ``kdlab.models.tokenizer``):
- prompts and completions use printable ASCII only (no newline, no tab);
- a prompt starts with the task's one-character ``tag`` and ends with ``PROMPT_END`` (":");
- a completion is the reasoning trace, then ``ANSWER_MARK`` ("#"), then the final answer;
  the verifier reads only what follows the last ``ANSWER_MARK``. End-of-sequence is a token,
  not a character, so completions never contain it.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
import random
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "validation", "test"]
SPLITS: tuple[str, ...] = ("train", "validation", "test")
PROMPT_END = ":"
ANSWER_MARK = "#"


@dataclass(frozen=True)
class Problem:
    """One problem instance.

    ``key`` is the canonical identity of the problem (same problem -> same key, whatever the
    seed that produced it); splits are assigned from it, so they never overlap.
    ``data`` holds what the verifier needs (JSON-serialisable).
    """

    task: str
    key: str
    prompt: str
    data: dict[str, Any] = field(compare=False, hash=False)


def split_of(key: str, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> str:
    """Deterministic split of a problem key: a hash bucket, independent of any seed."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    if h < fractions[0]:
        return "train"
    if h < fractions[0] + fractions[1]:
        return "validation"
    return "test"


def final_answer(completion: str) -> str | None:
    """The text after the last ANSWER_MARK, stripped; None when there is no mark."""
    if ANSWER_MARK not in completion:
        return None
    return completion.rsplit(ANSWER_MARK, 1)[1].strip()


class Task(ABC):
    """Base class: subclasses set ``name``, ``tag``, ``max_new_tokens`` and implement the four
    methods. ``problems`` must be deterministic in (split, count, seed) and only return
    problems whose ``split_of(key)`` equals ``split``; problems within one call are distinct."""

    name: str = ""
    tag: str = ""
    max_new_tokens: int = 64  # completion budget, in characters (= tokens)
    format_version: int = 1  # bump when prompts or references change; part of every model key

    @abstractmethod
    def problems(self, split: Split, count: int, seed: int = 0) -> list[Problem]:
        ...

    def capacity(self, split: Split) -> int | None:
        """How many distinct problems ``problems(split, ...)`` can return (None: effectively
        unbounded). Pools of training problems are capped at this."""
        return None

    @abstractmethod
    def reference(self, problem: Problem, rng: random.Random) -> str:
        """A correct completion (trace + ANSWER_MARK + answer) for teacher training."""
        ...

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> float:
        """1.0 if the completion's final answer is verified correct, else 0.0."""
        ...


def held_out(task: Task, count: int, seed: int = 0, split: Split = "test") -> list[Problem]:
    """Up to ``count`` evaluation problems of ``split``: all of them when the task has fewer
    (a task with 150 test questions evaluates on those 150 when asked for 200)."""
    cap = task.capacity(split)
    return task.problems(split, count if cap is None else min(count, cap), seed=seed)
