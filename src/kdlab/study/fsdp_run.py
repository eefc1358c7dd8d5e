"""One run of a study, sharded with FSDP2 over several processes (GPUs): a launcher around the
study's own run function.

A run here is what it is everywhere in kdlab: a grid cell of a profile, built into a run contract
(``kdlab.study.contract``) from the profile, validated once, and executed by
``kdlab.study.runs.execute_run``, which loads the models, distils, evaluates and writes the same
records as any run of ``kdlab study`` (``kdlab.study.records``). This module keeps only the
sharding (``Sharded``, the placement ``execute_run`` takes): every process loads both models onto
its device, ``torch.distributed.fsdp.fully_shard`` shards each decoder layer and the rest of the
model over all processes (the teacher too, unless ``--no-shard-teacher``), gradients are averaged
by FSDP, and after training rank 0 gathers the student and evaluates it alone (the other
processes return first). ``accelerate`` sets up the process group and the device (NCCL on GPUs,
gloo with ``--cpu``).

Data parallelism (``kdlab.engine.distill``): every step draws one global batch of
``distill.batch_size`` problems (identical on all ranks) and rank r trains on its contiguous slice;
the objective is the token mean of the KL over the whole global batch, as with one process. The
OffPD pool is sampled before the models are sharded, its chunks spread over the ranks and
gathered, so it does not depend on the number of processes.

GPU (8 GPUs on one node)::

    accelerate launch --multi_gpu --num_processes 8 -m kdlab.study.fsdp_run params/paper-llama.yaml \\
        --task medreason --policy on --kl forward --lr 1e-5 --seed 0

The cell's flags are those of ``kdlab distill`` (each not given is the profile's first grid
value), ``--set KEY=VALUE`` overrides the profile, the run writes to
``<outputs>/<study>/runs/<run_id>`` (``--out`` to choose) and the models must already be in the
store (``kdlab teachers PROFILE``). Without ``accelerate launch`` the same command runs the run
in one process, unsharded, like ``kdlab distill``.

CPU check (what the tests run): ``python -m torch.distributed.run --nproc_per_node 2 -m
kdlab.study.fsdp_run PROFILE --cpu ...``. ``accelerate launch --cpu`` starts a single process
unless MPI is configured, so the CPU test uses torch's launcher, which is the one ``accelerate
launch --multi_gpu`` calls.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from ..core.atomic import write_json_atomic
from ..core.faults import KdlabError
from . import building, materials
from .config import ConfigError, load_profile, read_yaml
from .contract import RunContract, add_cell_flags, cell_contract
from .preflight import check_profile
from .runs import Placement, execute_run

# What a rank's history file keeps: the global quantities, identical on every rank (not its timings).
GLOBAL_KEYS = ("step", "loss", "forward_kl", "reverse_kl", "grad_norm", "entropy", "length", "lr")


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


class Sharded(Placement):
    """The models sharded over the ``world`` processes of ``torch.distributed`` (FSDP2); rank 0
    gathers the trained student into a plain model (``rebuild`` makes its empty architecture
    from the student base) and evaluates it; each rank writes ``rank<r>.json``, its history's
    global quantities."""

    def __init__(self, rank: int, world: int, device: torch.device, rebuild: Callable[[], torch.nn.Module],
                 shard_teacher: bool = True):
        self.rank, self.world, self.device, self.rebuild, self.shard_teacher = rank, world, device, rebuild, shard_teacher

    def snapshot(self, student: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
        return ({k: v.detach().to("cpu", dtype).clone() for k, v in student.named_parameters()}
                if self.rank == 0 else None)

    def place(self, student: torch.nn.Module, teacher: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.device.type, (self.world,))
        shard(student, mesh)
        if self.shard_teacher:
            shard(teacher, mesh)
        return student, teacher

    def gather(self, student: torch.nn.Module, result: Any, out_dir: Path) -> torch.nn.Module | None:
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        write_json_atomic(out_dir / f"rank{self.rank}.json",
                          [{k: h[k] for k in GLOBAL_KEYS if k in h} for h in result.history])
        state = get_model_state_dict(student, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        dist.barrier()
        dist.destroy_process_group()  # no collective may wait on rank 0's evaluation
        if self.rank != 0:
            return None
        plain = self.rebuild()
        plain.load_state_dict(state)
        return plain.to(self.device).eval()


def launch(contract: RunContract, cpu: bool = False, threads: int = 0, shard_teacher: bool = True) -> dict[str, Any] | None:
    """Execute ``contract`` in this process, one of the ``world`` that ``accelerate launch`` (or
    torch's launcher) started, sharded over them, or alone (unsharded, on the profile's device).
    Returns the run's metrics on rank 0, None on the other ranks."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=cpu)
    rank, world, device = acc.process_index, acc.num_processes, acc.device
    if cpu:
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
    if world == 1:
        return execute_run(contract, progress=False, train_missing=False)
    cfg, profile = contract.run, contract.profile
    if cfg.batch_size % world:
        raise ConfigError(f"distill.batch_size {cfg.batch_size} must be a multiple of the number of processes {world}")
    # every process loads both models onto its own device, then they are sharded
    pre = dataclasses.replace(profile.pretrained, device="cpu" if device.type == "cpu" else str(device))
    profile = dataclasses.replace(profile, pretrained=pre)
    contract = dataclasses.replace(contract, profile=profile)
    student_dir = building.model_paths(profile, contract.models_root, progress=False, train=False)["student"]
    rebuild = lambda: materials.load_model(profile, student_dir, cfg.dtype)[0].to("cpu")  # noqa: E731
    return execute_run(contract, progress=False, train_missing=False,
                       placement=Sharded(rank, world, device, rebuild, shard_teacher))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kdlab.study.fsdp_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("params", help="profile YAML")
    add_cell_flags(parser)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a parameter (dotted key)")
    parser.add_argument("--outputs", default="outputs", help="outputs root (models under <outputs>/models)")
    parser.add_argument("--cpu", action="store_true", help="processes on the CPU (gloo), as the tests run it")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process on the CPU (0: cores / processes)")
    parser.add_argument("--no-shard-teacher", dest="shard_teacher", action="store_false",
                        help="keep a whole teacher on every process (only the student is sharded)")
    return parser


def _launch_args(args: argparse.Namespace) -> dict[str, Any] | None:
    overrides = {}
    for pair in args.set or []:
        key, eq, value = pair.partition("=")
        if not eq:
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        overrides[key] = read_yaml(value)
    profile = load_profile(args.params, overrides)
    check_profile(profile)
    contract = cell_contract(profile, args.outputs, task=args.task, policy=args.policy, lam=args.lam, kl=args.kl,
                             lr=args.lr, seed=args.seed, out_dir=args.out, save_student=args.save_student)
    return launch(contract, cpu=args.cpu, threads=args.threads, shard_teacher=args.shard_teacher)


def run_argv(argv: list[str]) -> dict[str, Any] | None:
    """The launcher's command line as a call, raising on bad input (the call form of
    ``kdlab.study.distributed.RunSpec``: ``RunSpec(out_dir, run_argv, dict(argv=[PROFILE, "--out",
    out_dir, ...]))``); returns the run's metrics (None on ranks > 0)."""
    return _launch_args(_parser().parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        metrics = _launch_args(args)
    except (ConfigError, KdlabError, FileNotFoundError) as e:
        print(f"kdlab.study.fsdp_run: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if metrics is not None:
        print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
