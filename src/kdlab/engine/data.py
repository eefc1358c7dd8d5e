"""Task problems -> token ids: prompts with <s>, completions with </s>."""
from __future__ import annotations

import random

from ..tasks.base import Problem, Task
from ..models.tokenizer import BOS_ID, EOS_ID, encode


def prompt_ids(prompt: str) -> list[int]:
    return [BOS_ID] + encode(prompt)


def completion_ids(completion: str) -> list[int]:
    return encode(completion) + [EOS_ID]


_POOLS: dict[tuple, list[Problem]] = {}


class ProblemPool:
    """A fixed pool of a task's problems of one split, sampled with replacement.

    The pool is drawn once (deterministic in ``seed``); ``batch`` returns (task, problem) pairs.
    """

    def __init__(self, task: Task, split: str, size: int, seed: int):
        self.task = task
        cap = task.capacity(split)
        count = size if cap is None else min(size, cap)
        key = (task.name, str(getattr(task, "path", "")), getattr(task, "world_seed", None), split, count, seed)
        if key not in _POOLS:  # problem generation can be slow (countdown solves every draw)
            _POOLS[key] = task.problems(split, count, seed=seed)
        self.problems: list[Problem] = _POOLS[key]
        if not self.problems:
            raise ValueError(f"task {task.name!r} produced no {split} problems")

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self.problems) for _ in range(n)]
