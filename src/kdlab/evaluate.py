"""Evaluation by generation and verifiers: greedy pass@1, pass@k from n samples, probe scores."""
from __future__ import annotations

import torch

from .data import prompt_ids
from .metrics import pass_at_k
from .rollout import sample
from .tasks.base import Problem, Task
from .tokenizer import decode


@torch.no_grad()
def complete(model: torch.nn.Module, prompts: list[str], max_new_tokens: int, *, greedy: bool = True,
             temperature: float = 1.0, batch_size: int = 512, generator: torch.Generator | None = None) -> list[str]:
    """Completions (text up to </s>) for ``prompts``, in order."""
    model.eval()
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        chunk = [prompt_ids(p) for p in prompts[i:i + batch_size]]
        ro = sample(model, chunk, max_new_tokens, lam=1.0, greedy=greedy, temperature=temperature, generator=generator)
        out.extend(decode(row) for row in ro.token_lists())
    return out


def accuracy(model: torch.nn.Module, task: Task, problems: list[Problem], batch_size: int = 512) -> float:
    """Greedy pass@1: the share of problems whose greedy completion the verifier accepts."""
    if not problems:
        raise ValueError(f"no problems to evaluate for task {task.name!r}")
    texts = complete(model, [p.prompt for p in problems], task.max_new_tokens, batch_size=batch_size)
    return sum(task.score(p, t) for p, t in zip(problems, texts)) / len(problems)


def error_modes(model: torch.nn.Module, task: Task, problems: list[Problem], batch_size: int = 512,
                examples: int = 3) -> dict[str, dict]:
    """Greedy completions sorted by error mode: {mode: {"count", "share", "examples"}}.

    Needs a task with a ``diagnose(problem, completion)`` method (the Countdown variants);
    ``examples``: up to this many (prompt, completion) pairs kept per mode."""
    if not hasattr(task, "diagnose"):
        raise ValueError(f"task {task.name!r} has no error-mode diagnosis (only the countdown tasks do)")
    if not problems:
        raise ValueError(f"no problems to evaluate for task {task.name!r}")
    texts = complete(model, [p.prompt for p in problems], task.max_new_tokens, batch_size=batch_size)
    out: dict[str, dict] = {}
    for p, t in zip(problems, texts):
        row = out.setdefault(task.diagnose(p, t), {"count": 0, "share": 0.0, "examples": []})
        row["count"] += 1
        if len(row["examples"]) < examples:
            row["examples"].append([p.prompt, t])
    for row in out.values():
        row["share"] = row["count"] / len(problems)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["count"]))


def pass_at_ks(model: torch.nn.Module, task: Task, problems: list[Problem], n: int, ks: tuple[int, ...] = (1, 10),
               temperature: float = 1.0, seed: int = 0, batch_size: int = 512) -> dict[int, float]:
    """Mean unbiased pass@k over problems from ``n`` samples each (temperature sampling)."""
    if any(k > n for k in ks):
        raise ValueError(f"every k in {ks} must be <= n={n}")
    gen = torch.Generator().manual_seed(seed)
    prompts = [p.prompt for p in problems for _ in range(n)]
    texts = complete(model, prompts, task.max_new_tokens, greedy=False, temperature=temperature,
                     batch_size=batch_size, generator=gen)
    result = {k: 0.0 for k in ks}
    for i, prob in enumerate(problems):
        c = int(sum(task.score(prob, t) for t in texts[i * n:(i + 1) * n]))
        for k in ks:
            result[k] += pass_at_k(n, c, k) / len(problems)
    return result
