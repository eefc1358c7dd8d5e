"""Tasks: target tasks (countdown variants, kb-mc, rules-mc) and the seven probe skills."""
from __future__ import annotations

from .base import ANSWER_MARK, PROMPT_END, Problem, Task, final_answer, split_of

from ..core.schema import TARGET_TASKS
from .probes import probe_tasks as _probes
from .countdown import CountdownTask
from .kb import KBTask
from .rules import RulesTask


def get_task(name: str, trace: str = "steps", world_seed: int = 0) -> Task:
    """A target task by name. ``trace`` is the countdown trace style; ``world_seed`` the hidden
    world of kb-mc / rules-mc (the teacher's world is 0; the student base learns the format on
    another world)."""
    if name.startswith("countdown"):
        return CountdownTask(name, trace=trace)
    if name == "kb-mc":
        return KBTask(world_seed=world_seed)
    if name == "rules-mc":
        return RulesTask(world_seed=world_seed)
    raise ValueError(f"unknown task {name!r}; choose from {list(TARGET_TASKS)}")


def probe_tasks() -> list[Task]:
    """The seven probe skills (forgetting is measured on them), in a fixed order."""
    return _probes()


__all__ = ["ANSWER_MARK", "PROMPT_END", "Problem", "Task", "TARGET_TASKS", "final_answer", "get_task",
           "probe_tasks", "split_of"]
