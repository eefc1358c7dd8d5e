"""The distillation loop: rollout policy x KL x learning rate, from a student base to a teacher.

One loop for every model: kdlab's toy models and real Hugging Face checkpoints, on any device,
in one process or sharded over several (FSDP2, ``kdlab.fsdp_run``). What differs between them
is the ``codec`` (``kdlab.codec``: prompt rendering, pad and stop ids, vocabulary size).

The run samples training sequences under its rollout policy (OffPD: a cached pool of teacher
rollouts; OnPD: fresh student rollouts every step; lambda: fresh pi_lambda rollouts), scores
every response position with the frozen teacher over the full vocabulary, and takes one AdamW
step on the token mean of the chosen KL over the whole batch, in micro-batches when asked
(gradient accumulation, each micro-batch weighted by its share of the batch's tokens, so the
update is that of the whole batch). Parameters are bf16 with no fp32 master copy by default (an
update smaller than one bf16 step is lost, as in the paper's bf16 training), or fp32.

Under ``torch.distributed`` every rank draws the same global batch and trains on its slice;
the token mean is global (token counts are summed over ranks) and FSDP averages gradients.
"""
from __future__ import annotations

import copy
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from tqdm.auto import tqdm

from . import schema
from .batching import pad_left, pad_right, response_logits
from .codec import CHAR
from .kl import LOSS_KINDS, SCORE_FUNCTION, draw_tokens, kl_loss, token_kls
from .rollout import sample
from .tasks.base import Problem, Task

DTYPES = {name: {"bf16": torch.bfloat16, "fp32": torch.float32}[name] for name in schema.DTYPES}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass
class RunConfig:
    """Everything that defines one distillation run (the grid varies policy, lam, kl, lr, seed)."""

    task: str = "countdown-3"
    policy: str = "off"  # "off" (lam=-1), "on" (lam=+1) or "lambda" (lam as given)
    lam: float = -1.0
    kl: str = "forward"  # forward | reverse | jsd | k1 | k2 | k3
    lr: float = 1e-4
    seed: int = 0
    steps: int = 150
    batch_size: int = 32
    temperature: float = 1.0
    grad_clip: float | None = 1.0
    dtype: str = "bf16"
    compute_dtype: str = "auto"  # the student's arithmetic (compute_dtype_of); parameters stay in dtype
    jsd_beta: float = 0.5
    sampled_direction: str = "reverse"
    logratio_clip: float | None = 5.0
    plausibility_alpha: float | None = 0.1
    offpd_pool: int = 2048
    warmup: int = 0
    weight_decay: float = 0.0
    data_seed: int = 0
    micro_batch_size: int = 0  # rows per forward/backward (gradient accumulation); 0 = the whole batch
    kl_chunk_size: int = 0  # full-vocabulary KL over this many positions at a time (memory); 0 = at once
    # The paper's training details (docs/calibration.md section 15). None / False = kdlab's toy behaviour.
    teacher_temperature: float | None = None  # the teacher's temperature in sampling AND in the loss
    student_temperature: float | None = None  # the student's temperature in sampling AND in the loss
    fused_adamw: bool = False  # torch.optim.AdamW(fused=True) where the device supports it, else the default

    def sample_temperatures(self) -> tuple[float, float]:
        """(student, teacher) temperatures of rollout sampling: each model's own, else ``temperature``."""
        return (self.temperature if self.student_temperature is None else self.student_temperature,
                self.temperature if self.teacher_temperature is None else self.teacher_temperature)

    def loss_temperatures(self) -> tuple[float, float]:
        """(student, teacher) temperatures in the loss: each model's own, else 1 (kdlab's default)."""
        return (1.0 if self.student_temperature is None else self.student_temperature,
                1.0 if self.teacher_temperature is None else self.teacher_temperature)

    def __post_init__(self) -> None:
        if self.policy not in ("off", "on", "lambda"):
            raise ValueError(f"policy must be 'off', 'on' or 'lambda', got {self.policy!r}")
        if self.policy == "off":
            self.lam = -1.0
        elif self.policy == "on":
            self.lam = 1.0
        if self.kl not in LOSS_KINDS:
            raise ValueError(f"kl must be one of {', '.join(LOSS_KINDS)}; got {self.kl!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.compute_dtype != "auto" and self.compute_dtype not in DTYPES:
            raise ValueError(f"compute_dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.compute_dtype!r}")
        if not (self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        for name in ("teacher_temperature", "student_temperature"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number or None, got {v!r}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup!r}")

    @property
    def run_id(self) -> str:
        pol = self.policy if self.policy != "lambda" else f"lam{self.lam:+g}"
        return f"{self.task}_{pol}_{self.kl}_lr{self.lr:g}_s{self.seed}"


@dataclass
class RunResult:
    history: list[dict[str, Any]]
    collapsed: bool
    collapse_step: int | None
    wall_s: float
    phase_s: dict[str, float] = field(default_factory=dict)
    optimizer: str = "adamw"  # the AdamW implementation used: "adamw" or "adamw-fused"


def make_adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float,
               fused: bool) -> tuple[torch.optim.Optimizer, str]:
    """AdamW (betas 0.9/0.999, eps 1e-8) and the name of its implementation.

    ``fused=True`` asks for ``torch.optim.AdamW(fused=True)`` (one kernel per step; the paper's
    choice) and falls back to the default implementation where the device or dtype does not
    support it (the name then says ``adamw``). Fused and default AdamW compute the same update
    up to floating-point rounding."""
    kw = dict(lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8)
    if fused:
        try:
            return torch.optim.AdamW(params, fused=True, **kw), "adamw-fused"
        except (RuntimeError, ValueError, TypeError):
            pass
    return torch.optim.AdamW(params, **kw), "adamw"


def compute_dtype_of(cfg: RunConfig, device: torch.device) -> torch.dtype:
    """The student's arithmetic dtype: ``cfg.compute_dtype``, or for "auto" fp32 on a CPU (small
    bf16 matmuls are slower there than fp32 ones without AMX; measured in docs/calibration.md 17)
    and ``cfg.dtype`` elsewhere."""
    if cfg.compute_dtype != "auto":
        return DTYPES[cfg.compute_dtype]
    return torch.float32 if device.type == "cpu" else DTYPES[cfg.dtype]


class _Arithmetic:
    """The student's parameters in ``cfg.dtype``, its arithmetic in another dtype.

    ``model`` is the module that samples and runs forward and backward: the student itself, or a
    copy in the compute dtype that ``pull`` reloads from the parameters before each step; ``push``
    rounds the copy's gradients into the parameters' ``.grad``. Clipping, the optimizer and the
    update stay on the parameters in ``cfg.dtype``: with bf16 there is still no fp32 master copy
    (an update below half a bf16 step is lost); only the forward and backward run in the wider
    type. One process only (a sharded student computes in its own dtype)."""

    def __init__(self, student: torch.nn.Module, dtype: torch.dtype, world: int):
        self.student = student
        same = next(student.parameters()).dtype == dtype or world > 1
        self.model = student if same else copy.deepcopy(student).to(dtype)
        self.pairs = [] if same else list(zip(self.model.parameters(), student.parameters()))

    def pull(self) -> None:
        with torch.no_grad():
            for w, p in self.pairs:
                w.copy_(p)

    def push(self) -> None:
        for w, p in self.pairs:
            p.grad = None if w.grad is None else w.grad.to(p.dtype)
            w.grad = None


def upcast(model: torch.nn.Module, dtype: torch.dtype, world: int = 1) -> torch.nn.Module:
    """``model`` computing in ``dtype``: a cast copy when its parameters are of a narrower type
    (bf16 values are exact in fp32), else ``model`` itself (never narrowed; a sharded model is
    left as it is). The frozen teacher and the distilled student under evaluation go through it."""
    if world > 1 or next(model.parameters()).dtype.itemsize >= dtype.itemsize:
        return model
    return copy.deepcopy(model).to(dtype)


def lr_at(step: int, lr: float, warmup: int) -> float:
    """The learning-rate schedule: linear warm-up over ``warmup`` steps (step 0 at lr / warmup),
    then constant at ``lr``; ``warmup`` 0 is constant from the first step."""
    return lr * min(1.0, (step + 1) / warmup) if warmup else lr


def _world() -> tuple[int, int]:
    """(rank, world size) under ``torch.distributed``; (0, 1) in one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sum_over_ranks(values: list[float], device: torch.device) -> list[float]:
    """Elementwise sum over all processes (the values themselves in one process)."""
    import torch.distributed as dist

    rank, world = _world()
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


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
    """Teacher logits of each OffPD pool response, computed the first time a batch draws it.

    The teacher is frozen and a response's logits depend only on its own prompt and tokens
    (left padding is skipped by the position ids and masked out), so a row drawn again reuses
    them. One (pool, longest response, V) tensor in the teacher's output dtype, on the teacher's
    device (a GPU's steps then never copy logits through the host), holds them, zero past each
    response's end; it is allocated uninitialised, so only rows written take memory.
    """

    def __init__(self, teacher: torch.nn.Module, problems: list[Problem], responses: list[list[int]],
                 teacher_prompts: list[list[int]], codec=CHAR):
        self.teacher, self.problems, self.responses, self.tp = teacher, problems, responses, teacher_prompts
        self.codec = codec
        self.store: torch.Tensor | None = None
        self.filled = torch.zeros(len(responses), dtype=torch.bool)

    @staticmethod
    def fits(teacher: torch.nn.Module, responses: list[list[int]]) -> bool:
        """Whether the cache for the whole pool stays under ``TEACHER_CACHE_BYTES``."""
        head = teacher.get_output_embeddings() if hasattr(teacher, "get_output_embeddings") else None
        if head is None or not responses or _world()[1] > 1:  # sharded: every rank must run the same forwards
            return False
        vocab = head.weight.shape[0]
        item = next(teacher.parameters()).element_size()
        return len(responses) * max(1, max(len(r) for r in responses)) * vocab * item <= TEACHER_CACHE_BYTES

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
        """(B, width, V) teacher logits of pool rows ``idx`` (zeros past a row's end) and how many
        rows reused logits (cached before, or computed once for an earlier row of this batch)."""
        missing = sorted({i for i in idx if not self.filled[i]})
        if missing:
            tp, tpm = pad_left([self.tp[i] for i in missing], self.codec.pad_id)
            r, rm = pad_right([self.responses[i] for i in missing], pad_id=self.codec.pad_id)
            with torch.no_grad():
                logits = response_logits(self.teacher, tp, tpm, r, rm, self.codec.vocab_size)  # (M, R, V), on its device
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
                         teacher_system: str | None = None) -> torch.Tensor | None:
    """The frozen teacher's logits of every OffPD pool response, (pool, longest, V), zero past
    each response's end: what every OffPD run on this pool (any KL, rate or seed: the teacher,
    pool and prompts fix them) reads instead of running the teacher. None when the store would
    exceed ``TEACHER_CACHE_BYTES`` (runs then compute the rows they draw)."""
    problems, responses = offpd
    if not _OffPDTeacherLogits.fits(teacher, responses):
        return None
    tp = teacher_prompt or (lambda p: p.prompt)
    cache = _OffPDTeacherLogits(teacher, problems, responses, [codec.prompt(tp(p), teacher_system) for p in problems],
                                codec)
    return cache.fill()


def all_finite(params: list[torch.nn.Parameter], world: int = 1) -> bool:
    """Whether every parameter value is finite: one fused max-abs pass over all of them (a
    tensor's infinity norm is finite exactly when its values are), instead of a check and a
    host sync per tensor; sharded parameters (DTensors) are checked tensor by tensor."""
    if world > 1:
        return all(bool(torch.isfinite(p).all()) for p in params)
    return bool(torch.stack(torch._foreach_norm(params, math.inf)).isfinite().all())


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt() parameters (malloc.h)
HEAP_KEEP_BYTES = 1 << 30


def keep_freed_heap() -> bool:
    """Ask glibc's allocator to serve large blocks from its heap and keep freed memory there,
    for reuse by the next step, instead of mapping fresh zeroed pages for every large tensor and
    unmapping them when freed. A step on a real model allocates and frees several (B, R, V)
    float32 tensors (100 MB each at V = 49,152); faulting their pages in again every step cost
    about a third of kdlab's step time on SmolLM2-135M (docs/calibration.md 18). The process's
    resident memory then stays near its peak. Returns whether the allocator took the setting (a
    no-op without glibc)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, HEAP_KEEP_BYTES)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, 2 * HEAP_KEEP_BYTES))
    except (OSError, AttributeError):
        return False


@contextmanager
def _fast_cpu_attention(*models: torch.nn.Module) -> Iterator[None]:
    """Run CPU models that use SDPA attention with the eager (matmul) attention instead.

    Same function; on CPU the eager path is faster at these sizes, mostly in backward (the fused
    CPU attention's bf16 backward is slow). GPU models and other implementations are untouched;
    each model's setting is restored on exit.
    """
    switched = []
    for m in models:
        cfg = getattr(m, "config", None)
        if (cfg is not None and getattr(cfg, "_attn_implementation", None) == "sdpa"
                and next(m.parameters()).device.type == "cpu" and hasattr(m, "set_attn_implementation")):
            m.set_attn_implementation("eager")
            switched.append(m)
    try:
        yield
    finally:
        for m in switched:
            m.set_attn_implementation("sdpa")


def _step(student: torch.nn.Module, batch: dict[str, torch.Tensor], t_logits_of: Callable, cfg: RunConfig,
          codec, n_total: float, sf_gen: Callable[[torch.device], torch.Generator] | None = None
          ) -> torch.Tensor:
    """Forward + backward of one batch slice in micro-batches; returns the summed (loss, forward
    KL, reverse KL) over its tokens as one float64 tensor (3,) on the student's device, read by
    the host once per step, not per micro-batch. Micro-batch m's token-mean loss is weighted by
    ``world * n_m / n_total`` (``n_total``: the global token count), so the accumulated
    gradient, averaged over ranks, is that of the global token mean. The loss compares
    ``softmax(z_S / tau_S)`` with ``softmax(z_T / tau_T)`` (``cfg.loss_temperatures()``); for
    kl "sf" one extra token per position is drawn (``sf_gen``: the generator on a device) from
    the teacher (forward) or the student (reverse). A non-finite loss is backpropagated like
    any other; the caller reads it before the optimiser step and stops the run."""
    rows = batch["r"].shape[0]
    mb = cfg.micro_batch_size or rows
    _, world = _world()
    tau_s, tau_t = cfg.loss_temperatures()
    sums = None
    for i in range(0, rows, mb):
        j = min(rows, i + mb)
        r, rm = batch["r"][i:j], batch["rm"][i:j]
        t_logits = t_logits_of(i, j)  # (b, R, V)
        s_logits = response_logits(student, batch["sp"][i:j], batch["spm"][i:j], r, rm, codec.vocab_size)  # (b, R, V)
        rm_d, r_d = rm.to(s_logits.device), r.to(s_logits.device)
        t_logits = t_logits.to(s_logits.device)
        if tau_s != 1.0:
            s_logits = s_logits / tau_s
        if tau_t != 1.0:
            t_logits = t_logits / tau_t
        samples = None
        if cfg.kl == SCORE_FUNCTION:
            source = t_logits if cfg.sampled_direction == "forward" else s_logits
            samples = draw_tokens(source, generator=sf_gen(s_logits.device) if sf_gen else None)
        loss = kl_loss(s_logits, t_logits, cfg.kl, rm_d, temperature=1.0, beta=cfg.jsd_beta, tokens=r_d,
                       sample_direction=cfg.sampled_direction, chunk_size=cfg.kl_chunk_size or None, samples=samples)
        n_m = float(rm.sum())  # rm is on the host
        weight = world * n_m / n_total
        (loss if weight == 1.0 else loss * weight).backward()
        with torch.no_grad():
            fkl, rkl = token_kls(s_logits.detach(), t_logits, rm_d)
            part = torch.stack([loss.detach().double() * n_m, fkl.sum().double(), rkl.sum().double()])
            sums = part if sums is None else sums + part
        del s_logits, t_logits
    return sums


def distill(student: torch.nn.Module, teacher: torch.nn.Module, task: Task, cfg: RunConfig, *,
            offpd: tuple[list[Problem], list[list[int]]] | None = None, pool=None,
            teacher_prompt: Callable[[Problem], str] | None = None, progress: bool = True,
            desc: str | None = None, codec=CHAR, teacher_system: str | None = None,
            max_new_tokens: int | None = None, offpd_teacher_logits: torch.Tensor | None = None) -> RunResult:
    """Train ``student`` in place (cast to ``cfg.dtype``) by distillation from frozen ``teacher``.

    ``offpd`` (problems, teacher responses) is required for policy "off"; ``pool`` (train
    problems, ``kdlab.data.ProblemPool``) for the others. ``teacher_prompt`` maps a problem to
    the teacher's prompt text (default: the student's); ``teacher_system`` is a system turn only
    the teacher sees. ``codec`` renders prompts (default: kdlab's char tokenizer). Rollouts are
    at most ``max_new_tokens`` (default: the task's). ``offpd_teacher_logits``: the OffPD pool's
    teacher logits, every row (``offpd_teacher_logits``, shared by the runs on one pool); without
    them a run computes the rows it draws, once each. Returns the per-step history; never
    raises on divergence: a non-finite loss or parameter stops the run and marks it collapsed.
    """
    t_start = time.perf_counter()
    keep_freed_heap()
    phase = {"rollout": 0.0, "step": 0.0}
    rank, world = _world()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)  # the global batch: identical on every rank
    device = next(student.parameters()).device
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 1_000_003 * rank)  # this rank's rollouts, on its device
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of the number of processes {world}")
    per_rank = cfg.batch_size // world
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    max_new = max_new_tokens or task.max_new_tokens
    if next(student.parameters()).dtype != DTYPES[cfg.dtype]:
        student.to(DTYPES[cfg.dtype])
    device = next(student.parameters()).device
    arith = _Arithmetic(student, compute_dtype_of(cfg, device), world)
    work = arith.model  # samples, forward, backward
    teacher = upcast(teacher, next(work.parameters()).dtype, world)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    if cfg.policy == "off" and offpd is None:
        raise ValueError("policy 'off' needs the cached teacher rollouts (offpd=...)")
    if cfg.policy != "off" and pool is None:
        raise ValueError(f"policy {cfg.policy!r} needs a pool of training problems (pool=...)")
    tp = teacher_prompt or (lambda p: p.prompt)
    separate_teacher_prompt = teacher_prompt is not None or bool(teacher_system)
    params = list(student.parameters())
    opt, opt_name = make_adamw(params, cfg.lr, cfg.weight_decay, cfg.fused_adamw)
    temp_s, temp_t = cfg.sample_temperatures()
    sf_gens: dict[str, torch.Generator] = {}

    def sf_gen(dev: torch.device) -> torch.Generator:  # the extra tokens of kl "sf": own stream per run and rank
        if str(dev) not in sf_gens:
            sf_gens[str(dev)] = torch.Generator(device=dev).manual_seed(cfg.seed * 1_000_003 + 7919 + rank)
        return sf_gens[str(dev)]
    cache = None
    if cfg.policy == "off" and (offpd_teacher_logits is not None or _OffPDTeacherLogits.fits(teacher, offpd[1])):
        cache = _OffPDTeacherLogits(teacher, offpd[0], offpd[1],
                                    [codec.prompt(tp(p), teacher_system) for p in offpd[0]], codec)
        if offpd_teacher_logits is not None:  # the whole pool's, computed once for every run on it
            cache.preload(offpd_teacher_logits)
    history: list[dict[str, Any]] = []
    collapsed, collapse_step = False, None
    bar = tqdm(range(cfg.steps), desc=desc or cfg.run_id, disable=not progress or rank > 0, leave=False)
    with _fast_cpu_attention(work, teacher):
        for step in bar:
            t0, c0 = time.perf_counter(), time.process_time()
            extra: dict[str, Any] = {}
            arith.pull()
            if cfg.policy == "off":
                idx = [rng.randrange(len(offpd[0])) for _ in range(cfg.batch_size)][lo:hi]
                problems = [offpd[0][i] for i in idx]
                r, rm = pad_right([offpd[1][i] for i in idx], pad_id=codec.pad_id)
                entropy = float("nan")
            else:
                problems = pool.sample(cfg.batch_size, rng)[lo:hi]
            s_prompts = [codec.prompt(p.prompt) for p in problems]
            t_prompts = [codec.prompt(tp(p), teacher_system) for p in problems] if separate_teacher_prompt else s_prompts
            if cfg.policy != "off":
                work.eval()
                ro = sample(work, s_prompts, max_new, lam=cfg.lam, teacher=teacher, teacher_prompts=t_prompts,
                            temperature=temp_s, teacher_temperature=temp_t, logratio_clip=cfg.logratio_clip,
                            plausibility_alpha=cfg.plausibility_alpha, generator=gen, codec=codec,
                            stop_early=world == 1)
                r, rm = ro.tokens, ro.mask
                ent_sum, ent_n = _sum_over_ranks([float((ro.entropy * rm).sum()), float(rm.sum())], device)
                entropy = ent_sum / max(ent_n, 1.0)
            t1 = time.perf_counter()
            sp, spm = pad_left(s_prompts, codec.pad_id)
            if cache is not None:
                cached, hits = cache.batch(idx, r.shape[1])  # (B, R, V)
                extra["teacher_cached"] = hits / len(idx)
                t_logits_of = lambda i, j: cached[i:j]  # noqa: E731
            else:
                tpids, tpm = pad_left(t_prompts, codec.pad_id)

                def t_logits_of(i: int, j: int) -> torch.Tensor:
                    with torch.no_grad():
                        return response_logits(teacher, tpids[i:j], tpm[i:j], r[i:j], rm[i:j], codec.vocab_size)
            if cfg.warmup:
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, cfg.lr, cfg.warmup)
            opt.zero_grad(set_to_none=True)
            if not work.training:
                work.train()
            (n_total,) = _sum_over_ranks([float(rm.sum())], device)
            n_total = max(n_total, 1.0)
            sums = _step(work, {"r": r, "rm": rm, "sp": sp, "spm": spm}, t_logits_of, cfg, codec, n_total, sf_gen)
            arith.push()
            gnorm = torch.nn.utils.clip_grad_norm_(params,
                                                   cfg.grad_clip if cfg.grad_clip is not None else float("inf"))
            if hasattr(gnorm, "full_tensor"):  # a DTensor under FSDP2
                gnorm = gnorm.full_tensor()
            # the step's one read of the loss: sums and gradient norm together (clipping a
            # non-finite gradient changes nothing that is kept: the run then stops unstepped)
            *sums, gnorm_val = torch.cat([sums, gnorm.detach().double().reshape(1).to(sums.device)]).tolist()
            loss_sum, fkl_sum, rkl_sum = _sum_over_ranks(sums, device)
            loss_val = loss_sum / n_total
            if not math.isfinite(loss_val):
                collapsed, collapse_step = True, step
                history.append({"step": step, "loss": loss_val})
                opt.zero_grad(set_to_none=True)
                break
            opt.step()
            finite = math.isfinite(gnorm_val) and all_finite(params, world)
            if world > 1:
                (bad,) = _sum_over_ranks([0.0 if finite else 1.0], device)
                finite = bad == 0.0
            t2 = time.perf_counter()
            history.append({"step": step, "loss": loss_val, "forward_kl": fkl_sum / n_total,
                            "reverse_kl": rkl_sum / n_total, "grad_norm": gnorm_val, "entropy": entropy,
                            "length": n_total / cfg.batch_size, "lr": opt.param_groups[0]["lr"],
                            "time_s": t2 - t0, "cpu_s": time.process_time() - c0, **extra})
            phase["rollout"] += t1 - t0
            phase["step"] += t2 - t1
            if not finite:
                collapsed, collapse_step = True, step
                break
            bar.set_postfix(loss=f"{loss_val:.3f}")
    opt.zero_grad(set_to_none=True)
    student.eval()
    del work, arith
    return RunResult(history=history, collapsed=collapsed, collapse_step=collapse_step,
                     wall_s=time.perf_counter() - t_start, phase_s=phase, optimizer=opt_name)
