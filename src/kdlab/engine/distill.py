"""The distillation loop: rollout policy x KL x learning rate, from a student base to a teacher.

One loop for every model: kdlab's toy models and real Hugging Face checkpoints, on any device,
in one process or sharded over several (FSDP2, ``kdlab.study.fsdp_run``). What differs between them
is the ``codec`` (``kdlab.models.codec``: prompt rendering, pad and stop ids, vocabulary size).

The run samples training sequences under its rollout policy (OffPD: a cached pool of teacher
rollouts; OnPD: fresh student rollouts every step; lambda: fresh pi_lambda rollouts), scores
every response position with the frozen teacher over the full vocabulary (a lambda mixture reads
the teacher logits its rollout sampled from, rather than running the teacher twice), and takes one AdamW
step on the token mean of the chosen KL over the whole batch, in micro-batches when asked
(gradient accumulation, each micro-batch weighted by its share of the batch's tokens, so the
update is that of the whole batch). Parameters are bf16 with no fp32 master copy by default (an
update smaller than one bf16 step is lost, as in the paper's bf16 training), or fp32.

Under ``torch.distributed`` every rank draws the same global batch and trains on its slice;
the token mean is global (token counts are summed over ranks) and FSDP averages gradients.
"""
from __future__ import annotations

import math
import random
import time
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from .batching import output_head, pad_left, pad_right, response_hidden, response_logits
from ..models.codec import CHAR
from ..core.schema import SCORE_FUNCTION
from ..core.head_kl import token_kl_from_hidden
from ..core.kl import draw_tokens, kl_loss, token_kls
from ..core.answer import STATS, answer_positions, contested, position_stats
from .rollout import sample
from ..tasks.base import ANSWER_MARK, Problem, Task
from ..core.dtypes import DTYPES
from .offpd import _OffPDTeacherLogits
from .cpu import _fast_cpu_attention, keep_freed_heap
from .trainer import Arithmetic, Trainer, compute_dtype_of, upcast
from .ranks import _sum_over_ranks, _world
from .run_config import RunConfig, RunResult


def _hidden_kls(s_logits: torch.Tensor, t_hidden: torch.Tensor, head: tuple, mask: torch.Tensor, cfg: RunConfig,
                tau_t: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss (token mean of ``cfg.kl``, differentiable in ``s_logits``, already divided by the
    student's temperature) and the per-token (forward, reverse) KLs, from the teacher's (b, R, d)
    hidden states and its head (``kdlab.core.head_kl``): no (b, R, V) teacher logits."""
    weight, bias = head
    t_hidden = t_hidden.to(weight.device)
    kw = dict(mask=mask, teacher_bias=bias, teacher_temperature=tau_t, chunk_size=cfg.kl_chunk_size or 256)
    per_token = token_kl_from_hidden(s_logits, t_hidden, weight, cfg.kl, **kw)  # (b, R)
    loss = per_token.sum() / mask.sum().clamp(min=1).to(per_token.dtype)
    with torch.no_grad():
        other = token_kl_from_hidden(s_logits.detach(), t_hidden, weight,
                                     "reverse" if cfg.kl == "forward" else "forward", **kw)
    per_token = per_token.detach()
    return (loss, per_token, other) if cfg.kl == "forward" else (loss, other, per_token)


def _step(student: torch.nn.Module, batch: dict[str, torch.Tensor], t_logits_of: Callable, cfg: RunConfig,
          codec, n_total: float, sf_gen: Callable[[torch.device], torch.Generator] | None = None,
          mark_id: int | None = None, head: tuple | None = None) -> torch.Tensor:
    """Forward + backward of one batch slice in micro-batches; returns the summed (loss, forward
    KL, reverse KL) over its tokens, then the sums of ``kdlab.core.answer.STATS`` at the answer
    position (the token after ``mark_id``) and at the contested positions (zeros when ``mark_id``
    is None), as one float64 tensor (3 + 2 x 7,) on the student's device, read by the host once
    per step, not per micro-batch. Micro-batch m's token-mean loss is weighted by
    ``world * n_m / n_total`` (``n_total``: the global token count), so the accumulated
    gradient, averaged over ranks, is that of the global token mean. The loss compares
    ``softmax(z_S / tau_S)`` with ``softmax(z_T / tau_T)`` (``cfg.loss_temperatures()``); for
    kl "sf" one extra token per position is drawn (``sf_gen``: the generator on a device) from
    the teacher (forward) or the student (reverse). With ``cfg.teacher_hidden``, ``t_logits_of``
    gives the teacher's (b, R, d) hidden states and ``head`` its (weight, bias): the KLs come from
    ``kdlab.core.head_kl`` (the teacher's logits are made only for the diagnosis, on vocabularies
    of at most DIAGNOSIS_MAX_VOCAB). A non-finite loss is backpropagated like any other; the
    caller reads it before the optimiser step and stops the run."""
    rows = batch["r"].shape[0]
    mb = cfg.micro_batch_size or rows
    _, world = _world()
    tau_s, tau_t = cfg.loss_temperatures()
    sums = None
    for i in range(0, rows, mb):
        j = min(rows, i + mb)
        r, rm = batch["r"][i:j], batch["rm"][i:j]
        t_out = t_logits_of(i, j)  # (b, R, V) logits, or (b, R, d) hidden states with cfg.teacher_hidden
        s_logits = response_logits(student, batch["sp"][i:j], batch["spm"][i:j], r, rm, codec.vocab_size)  # (b, R, V)
        rm_d, r_d = rm.to(s_logits.device), r.to(s_logits.device)
        if tau_s != 1.0:
            s_logits = s_logits / tau_s
        if cfg.teacher_hidden:
            loss, fkl, rkl = _hidden_kls(s_logits, t_out, head, rm_d, cfg, tau_t)
            t_logits = None
            if mark_id is not None:  # a small vocabulary: the diagnosis reads the teacher's logits
                with torch.no_grad():
                    z_t = t_out.to(head[0].device) @ head[0].T + (0 if head[1] is None else head[1])
                    t_logits = (z_t / tau_t).to(s_logits.device)
        else:
            t_logits = t_out.to(s_logits.device)
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
        Trainer.backward(loss, weight)
        with torch.no_grad():
            if not cfg.teacher_hidden:
                fkl, rkl = token_kls(s_logits.detach(), t_logits, rm_d)
            if mark_id is not None:
                z_s = s_logits.detach()
                where = (answer_positions(r_d, rm_d, mark_id), contested(z_s, t_logits, rm_d))
                diag = torch.cat([position_stats(z_s, t_logits, w) for w in where]).to(s_logits.device)
            else:
                diag = torch.zeros(2 * len(STATS), dtype=torch.float64, device=s_logits.device)
            part = torch.cat([torch.stack([loss.detach().double() * n_m, fkl.sum().double(), rkl.sum().double()]), diag])
            sums = part if sums is None else sums + part
        del s_logits, t_logits, t_out
    return sums


REUSE_ROLLOUT_TEACHER = True  # a lambda-mixture step reads the rollout's teacher logits (False: runs the teacher again)
DIAGNOSIS_MAX_VOCAB = 1024  # vocabularies up to this size record the diagnosis (kdlab.core.answer)


def _diagnosis_entry(sums: list[float], batch_size: int, n_tokens: float) -> dict[str, float]:
    """The history's entries of the diagnosis from ``position_stats``' sums (answer, then contested;
    summed over ranks): ``answer_rows`` (share of the batch's rows with an answer position) and
    ``contested_share`` (share of the response tokens that are contested), then per set the means
    ``<set>_<stat>`` over its positions (NaN when it has none, or when nothing was recorded)."""
    out: dict[str, float] = {}
    for name, part, per in (("answer", sums[:len(STATS)], batch_size), ("contested", sums[len(STATS):], n_tokens)):
        n = part[0]
        out["answer_rows" if name == "answer" else "contested_share"] = n / per if n else (0.0 if any(sums) else float("nan"))
        out.update({f"{name}_{k}": (v / n if n else float("nan")) for k, v in zip(STATS[1:], part[1:])})
    return out


def distill(student: torch.nn.Module, teacher: torch.nn.Module, task: Task, cfg: RunConfig, *,
            offpd: tuple[list[Problem], list[list[int]]] | None = None, pool=None,
            teacher_prompt: Callable[[Problem], str] | None = None, progress: bool = True,
            desc: str | None = None, codec=CHAR, teacher_system: str | None = None,
            max_new_tokens: int | None = None, offpd_teacher_logits: torch.Tensor | None = None) -> RunResult:
    """Train ``student`` in place (cast to ``cfg.dtype``) by distillation from frozen ``teacher``.

    ``offpd`` (problems, teacher responses) is required for policy "off"; ``pool`` (train
    problems, ``kdlab.engine.data.ProblemPool``) for the others. ``teacher_prompt`` maps a problem to
    the teacher's prompt text (default: the student's); ``teacher_system`` is a system turn only
    the teacher sees. ``codec`` renders prompts (default: kdlab's char tokenizer). Rollouts are
    at most ``max_new_tokens`` (default: the task's). ``offpd_teacher_logits``: the OffPD pool's
    teacher logits, every row (``offpd_teacher_logits``, shared by the runs on one pool; with
    ``cfg.teacher_hidden`` its hidden states); without them a run computes the rows it draws, once each. Returns the per-step history; never
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
    arith = Arithmetic(student, compute_dtype_of(cfg, device), world)
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
    trainer = Trainer(params, cfg.lr, weight_decay=cfg.weight_decay, fused=cfg.fused_adamw, warmup=cfg.warmup,
                      grad_clip=cfg.grad_clip, world=world)
    temp_s, temp_t = cfg.sample_temperatures()
    sf_gens: dict[str, torch.Generator] = {}
    # the diagnosis of each KL at the answer and the contested positions (kdlab.core.answer): on a
    # character vocabulary, whose (B, T, V) softmaxes are small and where "#" is one token
    mark_id = codec.single_token(ANSWER_MARK) if codec.vocab_size <= DIAGNOSIS_MAX_VOCAB else None

    def sf_gen(dev: torch.device) -> torch.Generator:  # the extra tokens of kl "sf": own stream per run and rank
        if str(dev) not in sf_gens:
            sf_gens[str(dev)] = torch.Generator(device=dev).manual_seed(cfg.seed * 1_000_003 + 7919 + rank)
        return sf_gens[str(dev)]
    head = output_head(teacher, codec.vocab_size) if cfg.teacher_hidden else None  # (V, d) weight, bias
    cache = None
    if cfg.policy == "off" and (offpd_teacher_logits is not None
                                or _OffPDTeacherLogits.fits(teacher, offpd[1], cfg.teacher_hidden)):
        cache = _OffPDTeacherLogits(teacher, offpd[0], offpd[1],
                                    [codec.prompt(tp(p), teacher_system) for p in offpd[0]], codec, cfg.teacher_hidden)
        if offpd_teacher_logits is not None:  # the whole pool's, computed once for every run on it
            cache.preload(offpd_teacher_logits)
    # a lambda mixture ran the teacher at every sampled token: its logits there are the ones the loss
    # compares with, so the step reuses them instead of a second teacher forward (not with hidden
    # states, nor with micro-batches, which bound the (B, R, V) logits held at once)
    reuse_teacher = (REUSE_ROLLOUT_TEACHER and cfg.policy != "off" and cfg.lam != 1.0 and not cfg.teacher_hidden
                     and not cfg.micro_batch_size)
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
                            stop_early=world == 1, keep_teacher_logits=reuse_teacher)
                r, rm = ro.tokens, ro.mask
                ent_sum, ent_n = _sum_over_ranks([float((ro.entropy * rm).sum()), float(rm.sum())], device)
                entropy = ent_sum / max(ent_n, 1.0)
            t1 = time.perf_counter()
            sp, spm = pad_left(s_prompts, codec.pad_id)
            if cache is not None:
                cached, hits = cache.batch(idx, r.shape[1])  # (B, R, V), or (B, R, d) hidden states
                extra["teacher_cached"] = hits / len(idx)
                t_logits_of = lambda i, j: cached[i:j]  # noqa: E731
            elif reuse_teacher:
                kept = ro.teacher_logits  # (B, R, V): the teacher's logits the mixture was sampled from
                t_logits_of = lambda i, j: kept[i:j]  # noqa: E731
            else:
                tpids, tpm = pad_left(t_prompts, codec.pad_id)

                def t_logits_of(i: int, j: int) -> torch.Tensor:
                    with torch.no_grad():
                        if cfg.teacher_hidden:
                            return response_hidden(teacher, tpids[i:j], tpm[i:j], r[i:j], rm[i:j])  # (b, R, d)
                        return response_logits(teacher, tpids[i:j], tpm[i:j], r[i:j], rm[i:j], codec.vocab_size)
            trainer.set_lr(step)
            trainer.zero_grad()
            if not work.training:
                work.train()
            (n_total,) = _sum_over_ranks([float(rm.sum())], device)
            n_total = max(n_total, 1.0)
            sums = _step(work, {"r": r, "rm": rm, "sp": sp, "spm": spm}, t_logits_of, cfg, codec, n_total, sf_gen,
                         mark_id, head)
            arith.push()
            gnorm = trainer.clip()
            # the step's one read of the loss: sums and gradient norm together (clipping a
            # non-finite gradient changes nothing that is kept: the run then stops unstepped)
            *sums, gnorm_val = torch.cat([sums, gnorm.detach().double().reshape(1).to(sums.device)]).tolist()
            loss_sum, fkl_sum, rkl_sum, *diagnosis = _sum_over_ranks(sums, device)
            loss_val = loss_sum / n_total
            if not math.isfinite(loss_val):
                collapsed, collapse_step = True, step
                history.append({"step": step, "loss": loss_val})
                trainer.zero_grad()
                break
            trainer.step()
            finite = math.isfinite(gnorm_val) and trainer.params_finite()
            if world > 1:
                (bad,) = _sum_over_ranks([0.0 if finite else 1.0], device)
                finite = bad == 0.0
            t2 = time.perf_counter()
            history.append({"step": step, "loss": loss_val, "forward_kl": fkl_sum / n_total,
                            "reverse_kl": rkl_sum / n_total, "grad_norm": gnorm_val, "entropy": entropy,
                            "length": n_total / cfg.batch_size, "lr": trainer.current_lr,
                            "time_s": t2 - t0, "cpu_s": time.process_time() - c0,
                            **_diagnosis_entry(diagnosis, cfg.batch_size, n_total), **extra})
            phase["rollout"] += t1 - t0
            phase["step"] += t2 - t1
            if not finite:
                collapsed, collapse_step = True, step
                break
            bar.set_postfix(loss=f"{loss_val:.3f}")
    trainer.zero_grad()
    student.eval()
    del work, arith
    return RunResult(history=history, collapsed=collapsed, collapse_step=collapse_step,
                     wall_s=time.perf_counter() - t_start, phase_s=phase, optimizer=trainer.name)
