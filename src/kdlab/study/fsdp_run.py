"""One paper-scale distillation run on real checkpoints: one GPU, or sharded with FSDP2 over several.

Run alone (``python -m kdlab.study.fsdp_run ...``, or ``run(cfg)`` from a Ray task) it trains on one
device. Launched over N processes by ``accelerate`` it is for a run whose student (with AdamW
state) and teacher do not fit on one GPU. Every process
loads both checkpoints, then ``torch.distributed.fsdp.fully_shard`` shards each decoder layer
and the rest of the model over all processes (the teacher too, unless ``shard_teacher`` is
off); gradients are averaged over processes by FSDP. ``accelerate`` sets up the process group
and the device (NCCL on GPUs, gloo with ``--cpu``).

Data parallelism: every step draws one global batch of ``batch_size`` problems (identical on
all ranks, from ``seed`` and the step) and rank r trains on its contiguous slice of
``batch_size / world`` rows. The objective is the token mean of the KL over the whole global
batch, exactly as with one process (each rank's loss is weighted by its share of the tokens),
and the logged loss / KLs are global token means, identical on every rank.

OffPD: a pool of ``offpd_pool`` teacher rollouts is sampled once at the start, in chunks with
their own seeds spread over the ranks and then all-gathered, so the pool does not depend on the
number of processes. OnPD / lambda: fresh pi_lambda rollouts every step (each rank samples its
slice with its own generator).
Sampling through sharded models is collective, so every rank runs exactly ``max_new_tokens``
decoding steps (no early stop).

GPU (8 GPUs on one node)::

    accelerate launch --multi_gpu --num_processes 8 -m kdlab.study.fsdp_run \\
        --student /path/to/Llama-3.2-1B-Instruct --teacher /path/to/Llama-3.1-8B-medreason-teacher \\
        --task-kind choice --task-path /path/to/medreason_train.jsonl --out-dir outputs/fsdp/medreason-on-fkl \\
        --policy on --kl forward --lr 1e-5 --steps 150 --batch-size 64 --max-new-tokens 2048

After training, rank 0 gathers the student and evaluates it alone (the other processes exit):
held-out accuracy, pass@k, benchmark scores for forgetting, update sparsity, and the same scores
for the student base (cached across runs with ``base_eval_cache``).

CPU check (what the tests run): ``python -m torch.distributed.run --nproc_per_node 2 -m
kdlab.study.fsdp_run --cpu ...``. ``accelerate launch --cpu`` starts a single process unless MPI is
configured, so the CPU test uses torch's launcher, which is the one ``accelerate launch
--multi_gpu`` calls.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import typing
import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..models.codec import HFCodec
from ..engine.data import ProblemPool
from ..engine.run_config import RunConfig
from ..engine.distill import distill
from ..engine.offpd import offpd_rollouts
from ..evaluation.evaluate import accuracy, pass_at_ks
from ..models.hf import check_same_vocab, load_pretrained
from ..core.atomic import write_json_atomic
from ..core.schema import LOSS_KINDS
from ..core.metrics import update_sparsity
from ..tasks.real import EVAL_ONLY, KINDS, RealTask, load_benchmarks, real_task
from .materials import model_id


@dataclass
class FSDPRunConfig:
    """One sharded distillation run (field names are the CLI flags, ``_`` -> ``-``)."""

    student: str
    teacher: str
    task_kind: str
    task_path: str
    out_dir: str
    policy: str = "off"  # off (lam=-1) | on (lam=+1) | lambda (lam as given)
    lam: float = -1.0
    kl: str = "forward"
    lr: float = 1e-5
    steps: int = 150
    batch_size: int = 64  # global, a multiple of the number of processes
    max_new_tokens: int = 2048
    max_prompt_tokens: int = 0  # longer prompts are an error (0 = no limit)
    temperature: float = 1.0
    grad_clip: float | None = 1.0
    dtype: str = "bf16"
    seed: int = 0
    data_seed: int = 0
    offpd_pool: int = 2048  # a multiple of rollout_batch * number of processes
    rollout_batch: int = 32  # prompts per OffPD sampling chunk
    logratio_clip: float | None = 5.0
    plausibility_alpha: float | None = 0.1
    kl_chunk_size: int | None = None  # chunked full-vocabulary KL (memory), see kdlab.core.kl.kl_loss
    jsd_beta: float = 0.5
    sampled_direction: str = "reverse"  # for the sampled estimators k1 / k2 / k3 / sf
    teacher_temperature: float | None = None  # the teacher's temperature in sampling and loss (None: temperature / 1)
    student_temperature: float | None = None  # the student's temperature in sampling and loss (None: temperature / 1)
    warmup: int = 0  # linear warm-up steps, then a constant learning rate
    fused_adamw: bool = False  # torch.optim.AdamW(fused=True) where supported
    shard_teacher: bool = True
    gradient_checkpointing: bool = False
    micro_batch_size: int = 0  # rows per forward/backward on each process (0 = its whole slice)
    save_student: bool = False
    cpu: bool = False
    threads: int = 0  # torch threads per process on CPU (0: cores / processes)
    # Evaluation (rank 0, on the gathered student, after training; the other ranks exit first).
    evaluate: bool = True
    eval_path: str = ""  # held-out file, every row a test row; "" = the task file's "test" split
    n_eval: int = 200  # held-out problems (0 = all)
    pass_n: int = 0  # samples per problem for pass@1 / pass@10 (0 = off)
    pass_problems: int = 50
    benchmarks: list = field(default_factory=list)  # [{kind, path, name?, limit?, max_new_tokens?}]; CLI: JSON
    n_benchmark: int = 0  # problems per benchmark (0 = all)
    eval_batch_size: int = 16
    eval_max_new_tokens: int = 0  # 0 = max_new_tokens
    base_eval_cache: str = ""  # directory caching the student base's evaluation across runs ("" = no cache)

    def __post_init__(self) -> None:
        if self.policy not in ("off", "on", "lambda"):
            raise ValueError(f"policy must be 'off', 'on' or 'lambda', got {self.policy!r}")
        self.lam = {"off": -1.0, "on": 1.0}.get(self.policy, self.lam)
        if self.kl not in LOSS_KINDS:
            raise ValueError(f"kl must be one of {list(LOSS_KINDS)}, got {self.kl!r}")
        if self.task_kind not in KINDS:
            raise ValueError(f"task_kind must be one of {list(KINDS)}, got {self.task_kind!r}")
        for name in ("steps", "batch_size", "max_new_tokens", "offpd_pool", "rollout_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        for name in ("max_prompt_tokens", "micro_batch_size", "n_eval", "pass_n", "pass_problems", "n_benchmark", "eval_max_new_tokens", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not isinstance(self.benchmarks, list):
            raise ValueError(f"benchmarks must be a list of {{kind, path}} mappings, got {self.benchmarks!r}")


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (HF lists their class names in ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} (no _no_split_modules)")
    return layers


def shard(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """FSDP2: each decoder layer is one shard group, the rest (embeddings, norm, head) the root's."""
    from torch.distributed.fsdp import fully_shard

    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def run_config(cfg: FSDPRunConfig, task: RealTask) -> RunConfig:
    """The engine's configuration of this run (``kdlab.engine.run_config.RunConfig``)."""
    return RunConfig(task=task.name, policy=cfg.policy, lam=cfg.lam, kl=cfg.kl, lr=cfg.lr, seed=cfg.seed,
                     steps=cfg.steps, batch_size=cfg.batch_size, temperature=cfg.temperature, grad_clip=cfg.grad_clip,
                     dtype=cfg.dtype, jsd_beta=cfg.jsd_beta, sampled_direction=cfg.sampled_direction,
                     logratio_clip=cfg.logratio_clip, plausibility_alpha=cfg.plausibility_alpha,
                     offpd_pool=cfg.offpd_pool, data_seed=cfg.data_seed, micro_batch_size=cfg.micro_batch_size,
                     kl_chunk_size=cfg.kl_chunk_size or 0, teacher_temperature=cfg.teacher_temperature,
                     student_temperature=cfg.student_temperature, warmup=cfg.warmup, fused_adamw=cfg.fused_adamw)


# What a rank's history keeps: the global quantities, identical on every rank (not its timings).
GLOBAL_KEYS = ("step", "loss", "forward_kl", "reverse_kl", "grad_norm", "entropy", "length", "lr")


def run(cfg: FSDPRunConfig) -> list[dict[str, Any]]:
    """Run ``cfg`` in this process (one of ``world`` launched by accelerate / torchrun, or alone).

    Writes ``out_dir/rank{r}.json`` (this rank's history) on every rank and, on rank 0, with
    ``save_student`` ``out_dir/student/`` (an HF checkpoint of the full, gathered student),
    ``out_dir/history.json`` and, last, ``out_dir/metrics.json``: the run's settings, training
    summary and, with ``evaluate``, held-out accuracy (pass@k), benchmark scores, the same for
    the student base (``base_*``), ``forgetting`` (benchmark mean after - before) and
    ``sparsity`` (share of weights changed by less than 1e-6; in ``dtype``). Returns the history:
    per step loss, forward_kl, reverse_kl (global token means), grad_norm (before clipping, of the
    global objective) and length (mean response tokens), identical on all ranks.
    """
    from accelerate import Accelerator

    t0 = time.perf_counter()
    acc = Accelerator(cpu=cfg.cpu)
    rank, world, device = acc.process_index, acc.num_processes, acc.device
    if cfg.cpu:
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // world))
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of the number of processes {world}")
    if cfg.policy == "off" and cfg.offpd_pool % (cfg.rollout_batch * world):
        raise ValueError(f"offpd_pool {cfg.offpd_pool} must be a multiple of rollout_batch * processes = "
                         f"{cfg.rollout_batch} * {world}")
    sharded = world > 1
    torch.manual_seed(cfg.seed)

    student, tok = load_pretrained(cfg.student, cfg.dtype, "cpu", gradient_checkpointing=cfg.gradient_checkpointing)
    teacher, t_tok = load_pretrained(cfg.teacher, cfg.dtype, "cpu")
    check_same_vocab(t_tok, tok, names=("teacher", "student"))
    for p in teacher.parameters():
        p.requires_grad_(False)
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        shard(student, mesh)
        if cfg.shard_teacher:
            shard(teacher, mesh)
        else:
            teacher.to(device)
    else:
        student.to(device)
        teacher.to(device)
    teacher.eval()
    codec = HFCodec.of(tok, student, teacher, max_prompt_tokens=cfg.max_prompt_tokens or None,
                       eval_batch_size=cfg.eval_batch_size)

    task = real_task(cfg.task_kind, cfg.task_path, max_new_tokens=cfg.max_new_tokens)
    if not task.capacity("train"):
        raise ValueError(f"task_path {cfg.task_path!r} has no train-split rows")
    pool = ProblemPool(task, "train", task.capacity("train"), seed=cfg.data_seed)
    rc = run_config(cfg, task)
    offpd = (offpd_rollouts(teacher, task, pool, cfg.offpd_pool, rc.sample_temperatures()[1], seed=cfg.data_seed,
                            max_new_tokens=cfg.max_new_tokens, batch_size=cfg.rollout_batch, codec=codec)
             if cfg.policy == "off" else None)
    result = distill(student, teacher, task, rc, offpd=offpd, pool=pool, codec=codec, progress=False)
    history = [{k: h[k] for k in GLOBAL_KEYS if k in h} for h in result.history]

    out_dir = Path(cfg.out_dir)
    write_json_atomic(out_dir / f"rank{rank}.json", history)
    state = _full_state(student, sharded)  # collective when sharded; empty on ranks > 0
    acc.wait_for_everyone()
    if sharded:
        import torch.distributed as dist

        dist.destroy_process_group()  # no collective may wait on rank 0's evaluation
    if rank != 0:
        return history
    del teacher
    if sharded:
        del student
        student = _plain_model(cfg, state).to(device)
    if cfg.save_student:
        student.save_pretrained(str(out_dir / "student"), safe_serialization=True)
        tok.save_pretrained(str(out_dir / "student"))
    metrics: dict[str, Any] = {**asdict(cfg), "world_size": world, "steps_done": len(history),
                               "final_loss": history[-1]["loss"] if history else float("nan"),
                               "collapsed": result.collapsed, "train_s": time.perf_counter() - t0}
    if cfg.evaluate:
        t_eval = time.perf_counter()
        after = evaluate_student(student, codec, cfg, task)
        base = base_evaluation(cfg, task, device, codec)
        metrics.update(after)
        metrics.update({f"base_{k}": v for k, v in base.items()})
        if "benchmark_mean" in after:
            metrics["forgetting"] = after["benchmark_mean"] - base["benchmark_mean"]
        init = load_pretrained(cfg.student, cfg.dtype, "cpu")[0]
        metrics["sparsity"] = update_sparsity(_cpu_params(init), _cpu_params(student))
        metrics["sparsity_dtype"] = cfg.dtype
        metrics["eval_s"] = time.perf_counter() - t_eval
    metrics["wall_s"] = time.perf_counter() - t0
    write_json_atomic(out_dir / "history.json", history)
    write_json_atomic(out_dir / "metrics.json", metrics)
    return history


def run_kwargs(**kwargs: Any) -> list[dict[str, Any]]:
    """``run(FSDPRunConfig(**kwargs))``: the call form of ``kdlab.study.distributed.RunSpec``, e.g.
    ``RunSpec(out_dir, run_kwargs, dict(student=..., teacher=..., out_dir=out_dir, lr=1e-5, ...))``."""
    return run(FSDPRunConfig(**kwargs))


def held_out(cfg: FSDPRunConfig, task: RealTask) -> tuple[RealTask, list]:
    """The held-out task and its first ``n_eval`` problems (seed 0)."""
    max_new = cfg.eval_max_new_tokens or cfg.max_new_tokens
    test_task = (real_task(cfg.task_kind, cfg.eval_path, fractions=EVAL_ONLY, max_new_tokens=max_new)
                 if cfg.eval_path else task)
    count = test_task.capacity("test") if cfg.n_eval == 0 else cfg.n_eval
    problems = test_task.problems("test", count, seed=0)
    if not problems:
        raise ValueError(f"no held-out problems: eval_path {cfg.eval_path!r} / task_path {cfg.task_path!r} "
                         "has no test rows")
    return test_task, problems


def evaluate_student(model: torch.nn.Module, codec: HFCodec, cfg: FSDPRunConfig, task: RealTask) -> dict[str, float]:
    """Held-out greedy accuracy, pass@k (if ``pass_n``) and benchmark scores of one model."""
    max_new = cfg.eval_max_new_tokens or None
    test_task, problems = held_out(cfg, task)
    out = {"accuracy": accuracy(model, test_task, problems, codec=codec, max_new_tokens=max_new)}
    if cfg.pass_n:
        ks = tuple(k for k in (1, 10) if k <= cfg.pass_n)
        pk = pass_at_ks(model, test_task, problems[:cfg.pass_problems], cfg.pass_n, ks, temperature=cfg.temperature,
                        seed=cfg.seed, codec=codec, max_new_tokens=max_new)
        out.update({f"pass_at_{k}": v for k, v in pk.items()})
    if cfg.benchmarks:
        scores = []
        for bench in load_benchmarks(cfg.benchmarks):
            count = bench.capacity("test") if not cfg.n_benchmark else cfg.n_benchmark
            s = accuracy(model, bench, bench.problems("test", count, seed=0), codec=codec, max_new_tokens=max_new)
            out[f"bench_{bench.name}"] = s
            scores.append(s)
        out["benchmark_mean"] = sum(scores) / len(scores)
    return out


def base_evaluation(cfg: FSDPRunConfig, task: RealTask, device: torch.device, codec: HFCodec) -> dict[str, float]:
    """The student base's ``evaluate_student`` scores, cached in ``base_eval_cache`` (keyed by the
    base's weights file stamp and every evaluation setting) so a sweep evaluates it once."""

    keys = ("eval_path", "task_path", "task_kind", "n_eval", "pass_n", "pass_problems", "benchmarks", "n_benchmark",
            "eval_max_new_tokens", "max_new_tokens", "temperature", "seed", "dtype")
    key = hashlib.sha256(json.dumps([model_id(cfg.student), {k: getattr(cfg, k) for k in keys}],
                                    sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(cfg.base_eval_cache) / f"base-{key}.json" if cfg.base_eval_cache else None
    if path is not None and path.exists():
        return json.loads(path.read_text())
    base, _ = load_pretrained(cfg.student, cfg.dtype, device)
    result = evaluate_student(base, codec, cfg, task)
    del base
    if path is not None:
        write_json_atomic(path, result)
    return result


def _cpu_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> parameter on the CPU (``named_parameters``: tied weights once)."""
    return {k: v.detach().cpu() for k, v in model.named_parameters()}


def _full_state(student: torch.nn.Module, sharded: bool) -> dict[str, torch.Tensor] | None:
    """The full student state dict on the CPU on rank 0 (gathered from the shards; empty on the
    other ranks); None when not sharded (the model is used as it is)."""
    if not sharded:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(student, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _plain_model(cfg: FSDPRunConfig, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cfg.student, dtype=next(iter(state.values())).dtype)
    model.load_state_dict(state)
    return model.eval()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kdlab.study.fsdp_run", description=__doc__.split("\n\n")[0])
    hints = typing.get_type_hints(FSDPRunConfig)
    for f in dataclasses.fields(FSDPRunConfig):
        flag = "--" + f.name.replace("_", "-")
        tp = hints[f.name]
        required = f.default is dataclasses.MISSING
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
            continue
        if tp is list:
            parser.add_argument(flag, type=json.loads, default=[], help="JSON list")
            continue
        base = next((a for a in typing.get_args(tp) if a is not type(None)), tp)

        def convert(text: str, base: type = base, optional: bool = base is not tp) -> Any:
            if optional and text.lower() in ("none", "null"):
                return None
            return base(text)

        parser.add_argument(flag, type=convert, required=required, default=None if required else f.default)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run(FSDPRunConfig(**vars(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
