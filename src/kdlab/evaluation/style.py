"""Incidental style transfer on countdown: a teacher instructed to reason in another notation.

The paper instructs its teacher to reason in Spanish, which the student's prompt never asks for,
and measures the share of student outputs that adopt the teacher's language. Our stand-in keeps
the task and the answers and changes only how the reasoning is written:

- style ``"plain"``: the normal countdown steps trace, ``34+56=90,90-12=78#(34+56)-12``;
- style ``"alt"``: the same steps with operators written as letters (``+ - * /`` ->
  ``p m t d``), ``34p56=90,90m12=78#(34+56)-12``. Values keep their exact form (``-4``, ``7/2``),
  the trace has the same length, and the final answer after ``#`` stays a normal expression, so
  the verifier is unchanged.

The instruction is the prompt's tag in upper case: the student sees ``c12 34 56>78:``, an
instructed teacher ``C12 34 56>78:`` (``C`` is no other task's tag). A style teacher is trained on
plain traces for uninstructed prompts and alt traces for instructed ones (``style_teacher_tasks``),
so it follows the instruction; distillation then passes ``teacher_prompt`` to
``kdlab.engine.distill.distill`` and ``style_report`` measures how many student outputs (on the
student's own, uninstructed prompts) are written in the teacher's alt style.

``search`` traces (failed attempts ``...!;`` before the solution) are styled the same way, every
attempt included; ``direct`` traces have no reasoning, hence no style, and are rejected.

Real checkpoints (``natural=True``) get the same experiment on countdown in natural language
(``kdlab.tasks.countdown.NaturalCountdownTask``): the instruction is a sentence appended to the
prompt (``NL_INSTRUCTION``), a trace reads ``48m35=13, 54p13=67. Answer: 54+48-35``, and the
model sees both through its codec (``kdlab.models.codec``), in sampling, training and ``style_report``.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any, Callable

import torch

from ..models.codec import CHAR
from .evaluate import complete
from ..tasks.base import ANSWER_MARK, SPLITS, Problem, Task
from ..tasks.countdown import (NL_ANSWER, TAG, VARIANTS, CountdownTask, NaturalCountdownTask, _format_value,
                               _random_integer_path, expression_from_steps, solutions)

STYLES: tuple[str, ...] = ("plain", "alt")
ALT_OPS: dict[str, str] = {"+": "p", "-": "m", "*": "t", "/": "d"}
INSTRUCTED_TAG = TAG.upper()
FAIL_MARK = "!;"  # ends each failed attempt of a search trace
NL_PREFIX = "Using the numbers"  # how a natural-language countdown prompt begins
NL_INSTRUCTION = " In the steps, write each operator as a letter: p for +, m for -, t for *, d for /."

# One exact value as countdown writes it: 12, -4, 7/2, -7/2.
_VALUE = r"-?\d+(?:/\d+)?"
_STEP = {
    "plain": re.compile(rf"{_VALUE}[+\-*/]{_VALUE}={_VALUE}"),
    "alt": re.compile(rf"{_VALUE}[pmtd]{_VALUE}={_VALUE}"),
}


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value  # type: ignore[return-value]


def styled_steps_text(steps: list, style: str) -> str:
    """Steps ``(left, op, right, result)`` written as ``34+56=90,90-12=78`` (plain) or
    ``34p56=90,90m12=78`` (alt); exact values as in countdown (``-4``, ``7/2``)."""
    _check_choice("style", style, STYLES)
    ops = ALT_OPS if style == "alt" else {op: op for op in ALT_OPS}
    return ",".join(f"{_format_value(a)}{ops[op]}{_format_value(b)}={_format_value(r)}" for a, op, b, r in steps)


def teacher_prompt(problem: Problem) -> str:
    """The instructed prompt for ``problem``: its countdown prompt with the tag ``c`` -> ``C``, or a
    natural-language countdown prompt followed by ``NL_INSTRUCTION``.

    Accepts a problem of ``CountdownTask``, ``NaturalCountdownTask`` or ``StyledCountdownTask``
    (instructed or not); an already instructed prompt is returned unchanged."""
    prompt = problem.prompt
    if prompt.startswith(NL_PREFIX):
        return prompt if prompt.endswith(NL_INSTRUCTION) else prompt + NL_INSTRUCTION
    if prompt[:1] == INSTRUCTED_TAG:
        return prompt
    if prompt[:1] != TAG:
        raise ValueError(f"problem.prompt must be a countdown prompt starting with {TAG!r} or {NL_PREFIX!r}, "
                         f"got {prompt!r}")
    return INSTRUCTED_TAG + prompt[1:]


def student_prompt(problem: Problem) -> str:
    """The uninstructed (student) prompt for ``problem``: tag ``C`` -> ``c``, or the natural prompt
    without ``NL_INSTRUCTION``; inverse of ``teacher_prompt``."""
    prompt = problem.prompt
    if prompt.startswith(NL_PREFIX):
        return prompt.removesuffix(NL_INSTRUCTION)
    if prompt[:1] == TAG:
        return prompt
    if prompt[:1] != INSTRUCTED_TAG:
        raise ValueError(f"problem.prompt must be a countdown prompt starting with {TAG!r} or {NL_PREFIX!r}, "
                         f"got {prompt!r}")
    return TAG + prompt[1:]


def _natural_steps(completion: str) -> list[str]:
    """Steps of a natural-language trace: the text before the first ``Answer:`` (all of it when
    there is none) without its final period, cut at commas, each without surrounding spaces;
    [] for an empty trace."""
    trace = completion.split(NL_ANSWER, 1)[0].strip().removesuffix(".")
    return [s.strip() for s in trace.split(",")] if trace else []


def detect_style(completion: str, natural: bool = False) -> str:
    """``"plain"``, ``"alt"`` or ``"none"`` from the reasoning trace of ``completion``.

    ``natural``: a natural-language countdown completion (``48m35=13, 54p13=67. Answer: ...``),
    whose steps are read by ``_natural_steps``. Otherwise the trace is the text before the first
    ``#`` (all of it when there is none). It is cut into
    attempts at ``!;`` (a trailing empty piece is dropped) and attempts into steps at ``,``. The
    completion has a style exactly when every step is a well-formed step of that style,
    ``<value><op><value>=<value>`` with op in ``+ - * /`` (plain) or ``p m t d`` (alt) and values
    as countdown writes them; arithmetic is not checked. An empty trace, a malformed step or a
    mix of the two styles gives ``"none"``. The two step patterns cannot both match one step
    (the letters are not value characters), so the result is unambiguous.
    """
    if not isinstance(completion, str):
        raise ValueError(f"completion must be a str, got {type(completion).__name__}")
    if natural:
        steps = _natural_steps(completion)
    else:
        trace = completion.split(ANSWER_MARK, 1)[0]
        attempts = trace.split(FAIL_MARK)
        if len(attempts) > 1 and attempts[-1] == "":
            attempts = attempts[:-1]
        steps = [s for a in attempts for s in a.split(",")] if trace else []
    if not steps:
        return "none"
    for style, pattern in _STEP.items():
        if all(pattern.fullmatch(s) for s in steps):
            return style
    return "none"


def style_adoption(completions: list[str], natural: bool = False) -> tuple[float, dict[str, int]]:
    """Share of completions in style ``"alt"`` among those with a detectable style
    (``detect_style``; ``natural``: natural-language countdown completions).

    Returns ``(share, counts)`` with ``counts`` = {"plain": n, "alt": n, "none": n}; the share is
    NaN when no completion has a detectable style."""
    counts = Counter({s: 0 for s in (*STYLES, "none")})
    counts.update(detect_style(c, natural) for c in completions)
    styled = counts["plain"] + counts["alt"]
    share = counts["alt"] / styled if styled else float("nan")
    return share, dict(counts)


class StyledCountdownTask(Task):
    """Countdown with the reasoning trace written in ``style``, for plain or instructed prompts.

    Args:
        variant: a countdown variant (``countdown-3``, ``countdown-4``, ``countdown-4e``).
        style: ``"plain"`` or ``"alt"``, the notation of ``reference`` traces.
        instructed: prompts carry the instruction (tag ``C`` instead of ``c``).
        trace: ``"steps"`` or ``"search"`` (the countdown trace form; ``"direct"`` has no trace).
        max_failed: most failed attempts of a ``search`` trace.
        natural: countdown in natural language (``NaturalCountdownTask``, ``"steps"`` traces only),
            for real checkpoints; ``max_new_tokens`` is then its response budget (None: its default).

    Problems are the countdown problems of the variant (same keys, splits, data and number
    order) with the prompt instructed or not. ``reference`` draws exactly what
    ``CountdownTask.reference`` draws with the same ``rng`` and writes it in ``style``, so the
    plain and alt references of one problem and seed differ only in the operator characters.
    ``score`` is the countdown verifier on the final answer, whatever the style.
    ``name`` is ``<variant>-<style>`` plus ``-instr`` when instructed and ``-nl`` when natural
    (distinct names keep ``ProblemPool`` caches and model keys apart).
    """

    def __init__(self, variant: str = "countdown-3", style: str = "alt", instructed: bool = True,
                 trace: str = "steps", max_failed: int = 2, natural: bool = False,
                 max_new_tokens: int | None = None) -> None:
        _check_choice("variant", variant, tuple(VARIANTS))
        _check_choice("style", style, STYLES)
        _check_choice("trace", trace, ("steps",) if natural else ("steps", "search"))
        for name, value in (("instructed", instructed), ("natural", natural)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        if natural:
            self.base: CountdownTask = (NaturalCountdownTask(variant) if max_new_tokens is None
                                        else NaturalCountdownTask(variant, max_new_tokens=max_new_tokens))
        else:
            self.base = CountdownTask(variant, trace=trace, max_failed=max_failed)
        self.variant = variant
        self.style = style
        self.instructed = instructed
        self.trace = trace
        self.max_failed = max_failed
        self.natural = natural
        self.name = f"{variant}-{style}" + ("-instr" if instructed else "") + ("-nl" if natural else "")
        self.tag = self.base.tag if natural else (INSTRUCTED_TAG if instructed else TAG)
        self.max_new_tokens = self.base.max_new_tokens  # alt traces have the same length

    def capacity(self, split: str) -> int | None:
        return self.base.capacity(split)

    def problems(self, split: str, count: int, seed: int = 0) -> list[Problem]:
        _check_choice("split", split, SPLITS)
        out = []
        for p in self.base.problems(split, count, seed=seed):
            prompt = teacher_prompt(p) if self.instructed else p.prompt
            out.append(Problem(task=self.name, key=p.key, prompt=prompt, data=p.data))
        return out

    def teacher_prompt(self, problem: Problem) -> str:
        """The instructed prompt for ``problem`` (see the module function)."""
        return teacher_prompt(problem)

    def reference(self, problem: Problem, rng: random.Random) -> str:
        # Mirrors CountdownTask.reference step for step (same rng draws), writing in self.style.
        numbers, target = problem.data["numbers"], int(problem.data["target"])
        candidates = solutions(numbers, target, integer_only=True) or solutions(numbers, target)
        if not candidates:
            raise ValueError(f"problem {problem.key!r} has no solution")
        chosen = rng.choice(candidates)
        steps, answer = styled_steps_text(chosen, self.style), expression_from_steps(numbers, chosen)
        if self.natural:  # as NaturalCountdownTask.reference writes it
            return f"{steps.replace(',', ', ')}. {NL_ANSWER} {answer}"
        text = steps + ANSWER_MARK + answer
        if self.trace == "steps":
            return text
        failures = []
        for _ in range(rng.randint(0, self.max_failed)):
            for _attempt in range(20):
                path = _random_integer_path(numbers, rng)
                if path[-1][3] != target:
                    failures.append(styled_steps_text(path, self.style) + FAIL_MARK)
                    break
        return "".join(failures) + text

    def score(self, problem: Problem, completion: str) -> float:
        return self.base.score(problem, completion)


def style_teacher_tasks(variant: str = "countdown-3", alt_share: float = 0.5, weight: float = 1.0,
                        trace: str = "steps", natural: bool = False,
                        max_new_tokens: int | None = None) -> list[tuple[Task, float]]:
    """The target-task part of a style teacher's SFT mixture (add the probe skills yourself).

    ``weight`` is the total weight of the task, split ``1 - alt_share`` to plain traces on
    uninstructed prompts and ``alt_share`` to alt traces on instructed prompts; ``natural`` /
    ``max_new_tokens``: see ``StyledCountdownTask``."""
    if not 0.0 < alt_share < 1.0:
        raise ValueError(f"alt_share must be in (0, 1) so the teacher sees both prompt kinds, got {alt_share!r}")
    if not weight > 0:
        raise ValueError(f"weight must be > 0, got {weight!r}")
    kw = {"trace": trace, "natural": natural, "max_new_tokens": max_new_tokens}
    return [(StyledCountdownTask(variant, "plain", instructed=False, **kw), weight * (1.0 - alt_share)),
            (StyledCountdownTask(variant, "alt", instructed=True, **kw), weight * alt_share)]


def is_natural(task: Task) -> bool:
    """Whether ``task`` is countdown in natural language (plain or styled)."""
    return isinstance(getattr(task, "base", task), NaturalCountdownTask)


def style_report(model: torch.nn.Module, task: Task, problems: list[Problem],
                 prompt: Callable[[Problem], str] = student_prompt, batch_size: int | None = None,
                 codec=CHAR) -> dict[str, Any]:
    """Greedy completions of ``model`` on ``problems`` and their style.

    ``codec`` (``kdlab.models.codec``) renders the prompts and decodes the completions; ``batch_size``
    prompts per generation batch (None: the codec's). The style is read as ``task`` writes it
    (``is_natural``).

    ``prompt`` maps a problem to the prompt text given to the model: ``student_prompt`` (default;
    what a distilled student is measured on) or ``teacher_prompt`` (check that a style teacher
    follows the instruction). Returns ``adoption`` (share of alt among styled outputs, NaN when
    none is styled), ``plain`` / ``alt`` / ``none`` counts, ``styled_share`` (share of outputs with
    a detectable style), ``accuracy`` (verifier pass@1 of the same completions) and ``n``.
    """
    if not problems:
        raise ValueError("problems must not be empty")
    texts = complete(model, [prompt(p) for p in problems], task.max_new_tokens, batch_size=batch_size, codec=codec)
    share, counts = style_adoption(texts, is_natural(task))
    return {"adoption": share, **counts, "styled_share": (counts["plain"] + counts["alt"]) / len(texts),
            "accuracy": sum(task.score(p, t) for p, t in zip(problems, texts)) / len(problems), "n": len(texts)}
