"""The off-policy (OffPD) pool of teacher rollouts and the cache of the teacher's logits (or last
hidden states, ``teacher_hidden``) on it."""
from __future__ import annotations

import random
from typing import Any, Callable

import torch

from .batching import pad_left, pad_right, response_hidden, response_logits
from ..models.codec import CHAR
from .rollout import sample
from ..tasks.base import Problem, Task
from .ranks import _world


OFFPD_CHUNK = 512  # teacher prompts per OffPD sampling batch


def offpd_rollouts(teacher: torch.nn.Module, task: Task, pool, n: int, temperature: float,
                   seed: int, max_new_tokens: int, batch_size: int = OFFPD_CHUNK,
                   teacher_prompt: Callable[[Problem], str] | None = None, codec=CHAR,
                   teacher_system: str | None = None) -> tuple[list[Problem], list[list[int]]]:
    """Sample ``n`` teacher responses (token ids incl. the stop id) to pool problems, once.

    Chunk c of ``batch_size`` prompts is sampled with its own generator (seeded from ``seed`` and
    c) by rank c % world, then the chunks are gathered in order: the pool is the same whatever
    the number of processes. ``teacher_system``: a system turn only the teacher sees."""
    import torch.distributed as dist

    rng = random.Random(f"offpd:{seed}")
    # distinct problems while the pool has enough, then with replacement
    problems = rng.sample(pool.problems, n) if n <= len(pool.problems) else [rng.choice(pool.problems) for _ in range(n)]
    tp = teacher_prompt or (lambda p: p.prompt)
    rank, world = _world()
    stop_early = world == 1
    chunks = list(range(0, n, batch_size))
    local: list[tuple[int, list[list[int]]]] = []
    for c in range(rank, len(chunks), world):
        chunk = problems[chunks[c]:chunks[c] + batch_size]
        gen = torch.Generator(device=next(teacher.parameters()).device).manual_seed(seed * 1_000_003 + c)
        ro = sample(None, [codec.prompt(p.prompt) for p in chunk], max_new_tokens, lam=-1.0, teacher=teacher,
                    teacher_prompts=[codec.prompt(tp(p), teacher_system) for p in chunk], temperature=temperature,
                    generator=gen, codec=codec, stop_early=stop_early)
        local.append((c, ro.token_lists()))
    if world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, local)
        local = sorted((item for part in gathered for item in part), key=lambda x: x[0])
    responses = [r for _, part in local for r in part]
    return problems, responses


# Largest OffPD teacher-logit cache kept in memory (bytes); bigger pools are scored per batch.
TEACHER_CACHE_BYTES = 1 << 30


class _OffPDTeacherLogits:
    """Teacher logits of each OffPD pool response, computed the first time a batch draws it; with
    ``hidden``, the teacher's last hidden states instead (``response_hidden``: d values a token
    instead of V, what ``kdlab.core.head_kl`` turns into the KL with the teacher's head).

    The teacher is frozen and a response's logits depend only on its own prompt and tokens
    (left padding is skipped by the position ids and masked out), so a row drawn again reuses
    them. One (pool, longest response, V or d) tensor in the teacher's output dtype, on the
    teacher's device (a GPU's steps then never copy logits through the host), holds them, zero
    past each response's end; it is allocated uninitialised, so only rows written take memory.
    """

    def __init__(self, teacher: torch.nn.Module, problems: list[Problem], responses: list[list[int]],
                 teacher_prompts: list[list[int]], codec=CHAR, hidden: bool = False):
        self.teacher, self.problems, self.responses, self.tp = teacher, problems, responses, teacher_prompts
        self.codec, self.hidden = codec, hidden
        self.store: torch.Tensor | None = None
        self.filled = torch.zeros(len(responses), dtype=torch.bool)

    @staticmethod
    def fits(teacher: torch.nn.Module, responses: list[list[int]], hidden: bool = False) -> bool:
        """Whether the cache for the whole pool stays under ``TEACHER_CACHE_BYTES``."""
        head = teacher.get_output_embeddings() if hasattr(teacher, "get_output_embeddings") else None
        if head is None or not responses or _world()[1] > 1:  # sharded: every rank must run the same forwards
            return False
        width = head.weight.shape[1 if hidden else 0]  # d or V values per token
        item = next(teacher.parameters()).element_size()
        return len(responses) * max(1, max(len(r) for r in responses)) * width * item <= TEACHER_CACHE_BYTES

    def fill(self, chunk: int = OFFPD_CHUNK) -> torch.Tensor:
        """Every pool row's logits, computed in chunks of ``chunk`` rows in pool order (the same
        shapes, so the same values, whoever calls it); returns the (pool, longest, V) store, to
        be shared by every run that trains on this pool (``preloaded``)."""
        for start in range(0, len(self.responses), chunk):
            self.batch(list(range(start, min(start + chunk, len(self.responses)))), 1)
        return self.store

    def preload(self, store: torch.Tensor) -> None:
        """Take a store that ``fill`` made for this pool (on another run's teacher and pool)."""
        longest = max(1, max(len(x) for x in self.responses))
        if store.shape[:2] != (len(self.responses), longest):
            raise ValueError(f"teacher-logit store of shape {tuple(store.shape)} does not fit a pool of "
                             f"{len(self.responses)} responses of at most {longest} tokens")
        self.store = store.to(next(self.teacher.parameters()).device)
        self.filled[:] = True

    def batch(self, idx: list[int], width: int) -> tuple[torch.Tensor, int]:
        """(B, width, V) teacher logits (``hidden``: (B, width, d) hidden states) of pool rows ``idx``
        (zeros past a row's end) and how many
        rows reused logits (cached before, or computed once for an earlier row of this batch)."""
        missing = sorted({i for i in idx if not self.filled[i]})
        if missing:
            tp, tpm = pad_left([self.tp[i] for i in missing], self.codec.pad_id)
            r, rm = pad_right([self.responses[i] for i in missing], pad_id=self.codec.pad_id)
            with torch.no_grad():
                logits = (response_hidden(self.teacher, tp, tpm, r, rm) if self.hidden  # (M, R, d)
                          else response_logits(self.teacher, tp, tpm, r, rm, self.codec.vocab_size))  # (M, R, V), on its device
            if self.store is None:
                longest = max(1, max(len(x) for x in self.responses))
                self.store = logits.new_empty((len(self.responses), longest, logits.shape[-1]))
            for j, i in enumerate(missing):
                n = len(self.responses[i])
                self.store[i, :n] = logits[j, :n]
                self.store[i, n:] = 0
            self.filled[missing] = True
        return self.store[torch.tensor(idx), :width], len(idx) - len(missing)


def offpd_teacher_logits(teacher: torch.nn.Module, offpd: tuple[list[Problem], list[list[int]]],
                         teacher_prompt: Callable[[Problem], str] | None = None, codec=CHAR,
                         teacher_system: str | None = None, hidden: bool = False) -> torch.Tensor | None:
    """The frozen teacher's logits of every OffPD pool response, (pool, longest, V), zero past
    each response's end (``hidden``: its last hidden states, (pool, longest, d)): what every
    OffPD run on this pool (any KL, rate or seed: the teacher, pool and prompts fix them) reads
    instead of running the teacher. None when the store would exceed ``TEACHER_CACHE_BYTES``
    (runs then compute the rows they draw)."""
    problems, responses = offpd
    if not _OffPDTeacherLogits.fits(teacher, responses, hidden):
        return None
    tp = teacher_prompt or (lambda p: p.prompt)
    cache = _OffPDTeacherLogits(teacher, problems, responses, [codec.prompt(tp(p), teacher_system) for p in problems],
                                codec, hidden)
    return cache.fill()
