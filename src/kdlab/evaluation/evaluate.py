"""Evaluation by generation and verifiers: greedy pass@1, pass@k from n samples, probe and
benchmark scores. One path for every model: the ``codec`` (``kdlab.models.codec``) renders the prompts
and decodes the completions (default: kdlab's char tokenizer)."""
from __future__ import annotations

import torch

from ..models.codec import CHAR, CharCodec
from ..core.metrics import pass_at_k
from ..engine.rollout import sample
from ..tasks.base import Problem, Task


@torch.no_grad()
def complete(model: torch.nn.Module, prompts: list[str], max_new_tokens: int, *, greedy: bool = True,
             temperature: float = 1.0, batch_size: int | None = None, generator: torch.Generator | None = None,
             codec=CHAR) -> list[str]:
    """Completions (text up to the stop token) for ``prompts``, in order. Prompts are batched by
    length (``batch_size``, default the codec's) so that padding stays small; the draws of a
    sampled completion depend only on ``generator`` and the order of ``prompts``."""
    model.eval()
    batch_size = batch_size or codec.eval_batch_size
    ids = [codec.prompt(p) for p in prompts]
    # the char tokenizer's prompts of one task have near-equal lengths: keep their order (and draws)
    order = list(range(len(ids))) if isinstance(codec, CharCodec) else sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ro = sample(model, [ids[i] for i in chunk], max_new_tokens, lam=1.0, greedy=greedy, temperature=temperature,
                    generator=generator, codec=codec)
        for i, row in zip(chunk, ro.token_lists()):
            out[i] = codec.decode(row)
    return out


def accuracy(model: torch.nn.Module, task: Task, problems: list[Problem], batch_size: int | None = None,
             codec=CHAR, max_new_tokens: int | None = None) -> float:
    """Greedy pass@1: the share of problems whose greedy completion the verifier accepts."""
    if not problems:
        raise ValueError(f"no problems to evaluate for task {task.name!r}")
    texts = complete(model, [p.prompt for p in problems], max_new_tokens or task.max_new_tokens,
                     batch_size=batch_size, codec=codec)
    return sum(task.score(p, t) for p, t in zip(problems, texts)) / len(problems)


def error_modes(model: torch.nn.Module, task: Task, problems: list[Problem], batch_size: int | None = None,
                examples: int = 3, codec=CHAR) -> dict[str, dict]:
    """Greedy completions sorted by error mode: {mode: {"count", "share", "examples"}}.

    Needs a task with a ``diagnose(problem, completion)`` method (the Countdown variants);
    ``examples``: up to this many (prompt, completion) pairs kept per mode."""
    if not hasattr(task, "diagnose"):
        raise ValueError(f"task {task.name!r} has no error-mode diagnosis (only the countdown tasks do)")
    if not problems:
        raise ValueError(f"no problems to evaluate for task {task.name!r}")
    texts = complete(model, [p.prompt for p in problems], task.max_new_tokens, batch_size=batch_size, codec=codec)
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
               temperature: float = 1.0, seed: int = 0, batch_size: int | None = None, codec=CHAR,
               max_new_tokens: int | None = None) -> dict[int, float]:
    """Mean unbiased pass@k over problems from ``n`` samples each (temperature sampling). The
    generator lives on the model's device (a GPU's draws then never wait on the host), seeded
    from ``seed``."""
    if not problems:
        raise ValueError(f"no problems to evaluate for task {task.name!r}")
    if any(k > n for k in ks):
        raise ValueError(f"every k in {ks} must be <= n={n}")
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    prompts = [p.prompt for p in problems for _ in range(n)]
    texts = complete(model, prompts, max_new_tokens or task.max_new_tokens, greedy=False, temperature=temperature,
                     batch_size=batch_size, generator=gen, codec=codec)
    result = {k: 0.0 for k in ks}
    for i, prob in enumerate(problems):
        c = int(sum(task.score(prob, t) for t in texts[i * n:(i + 1) * n]))
        for k in ks:
            result[k] += pass_at_k(n, c, k) / len(problems)
    return result
