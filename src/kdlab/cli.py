"""The ``kdlab`` command line: ``kdlab teachers|distill|rlvr|diagnose|study ...`` (also ``python -m kdlab``)."""
from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path

import yaml

from .core.atomic import write_json_atomic
from .study.config import ConfigError, read_yaml, load_profile, dropped_values
from .core.faults import check_writable, KdlabError
from .study.building import check_models, model_paths
from .study.preflight import check_machine, check_profile
from .study.materials import is_real
from .study.teachers import model_table, model_paths as toy_paths, capacity_paths
from .study.report_tables import format_table
from .study import runs
from .study.contract import add_cell_flags, cell_contract
from .evaluation.evaluate import error_modes
from .models.toy import load_checkpoint, checkpoint_meta
from .tasks import get_task
from .tasks.base import held_out
from .study.runner import run_study
from .models.store import shipped_manifest
from .study.gpu_faults import oom_remedy


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ConfigError(f"--set expects KEY=VALUE, got {pair!r}")
        k, v = pair.split("=", 1)
        try:
            out[k] = read_yaml(v)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {pair}: the value is not valid YAML: {' '.join(str(e).split())}") from None
    return out


def _outputs_root(args) -> Path:
    """``--outputs``, resolved; ``KdlabError`` when it cannot be written."""

    return check_writable(Path(args.outputs).resolve())


def _profile(args, models: bool = True):
    """The profile of ``args.params`` with its ``--set`` overrides, validated, everything it names
    on disk checked (``kdlab.study.preflight``) and, with ``models``, its models' recorded hashes."""

    profile = load_profile(args.params, _overrides(args.set))
    try:
        check_profile(profile)
        check_machine(profile, Path(args.outputs).resolve() / "models")
    except ConfigError as e:
        raise ConfigError(f"{args.params}: {e}") from None
    if models:
        check_models(profile, _outputs_root(args) / "models", args.params)
    _use_threads(profile)
    return profile


def _use_threads(profile) -> None:
    """A one-process command's torch threads: the profile's ``threads`` (0 leaves torch's default)."""
    if profile.threads:
        import torch

        torch.set_num_threads(profile.threads)


def cmd_teachers(args) -> int:

    profile = _profile(args, models=not args.rebuild)  # (--rebuild is the remedy for a corrupt one)
    if (args.rebuild or args.capacity) and is_real(profile):
        raise ConfigError(f"--rebuild / --capacity: {args.params} names pretrained checkpoints; kdlab builds only toy models")
    if args.rebuild:
        # Train from scratch into a separate store, then compare with what the repository ships.
        paths = toy_paths(profile, _outputs_root(args) / "models-rebuild", rebuild=True)
        shipped = shipped_manifest()
        for role, path in paths.items():
            sha = checkpoint_meta(path)["sha256"]
            ref = shipped.get(path.name)
            verdict = "not shipped" if ref is None else ("identical to the shipped checkpoint" if ref == sha else "DIFFERS from the shipped checkpoint")
            print(f"{role}: {path.name} sha256 {sha[:16]}... {verdict}")
    else:
        paths = model_paths(profile, _outputs_root(args) / "models")
    rows = model_table(profile, paths, cache_root=_outputs_root(args) / "cache")
    if args.capacity:
        cap = capacity_paths(profile, _outputs_root(args) / "models")
        rows += model_table(profile, cap, label="capacity check (student preset, teacher recipe)",
                            cache_root=_outputs_root(args) / "cache")
    out = _outputs_root(args) / profile.name
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "models.json", rows)
    print(format_table(rows, ["model", "task", "accuracy", "probe_mean", "n_params", "train_s"]))
    print(f"written: {out / 'models.json'}")
    return 0


def cmd_distill(args) -> int:
    from dataclasses import asdict

    import torch

    profile = _profile(args)
    try:
        contract = cell_contract(profile, _outputs_root(args), task=args.task, policy=args.policy, lam=args.lam,
                                 kl=args.kl, lr=args.lr, seed=args.seed, out_dir=args.out, save_student=args.save_student)
    except ConfigError as e:
        raise ConfigError(str(e).replace("the profile distils", f"profile {args.params} distils")) from None
    cfg = contract.run
    out = contract.out_dir
    dropped = [d for d in dropped_values(profile) if d.startswith("eval.")]  # (the flags pick the one cell)
    if dropped:
        print(f"kdlab: note: {'; '.join(dropped)}", file=sys.stderr)
    try:
        metrics = runs.execute_run(contract)
    except torch.OutOfMemoryError as e:
        raise KdlabError(f"run {cfg.run_id}: {' '.join(str(e).split())[:200]}; {oom_remedy(asdict(cfg))}") from None
    print(json.dumps({k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}, indent=2))
    if metrics["collapsed"]:
        print(f"kdlab: run {cfg.run_id} collapsed at step {metrics['collapse_step']} (a non-finite loss or weight); "
              f"its metrics are in {out / 'metrics.json'}", file=sys.stderr)
        return 1
    return 0


def cmd_rlvr(args) -> int:

    profile = load_profile(args.params, _overrides(args.set))
    _use_threads(profile)
    name = "base" if args.start == "base" else Path(args.start).resolve().parent.name
    out = Path(args.out).resolve() if args.out else _outputs_root(args) / profile.name / "rlvr" / f"{name}_s{args.seed}"
    metrics = runs.execute_rlvr(profile, args.start, out, models_root=_outputs_root(args) / "models", seed=args.seed)
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_diagnose(args) -> int:

    profile = load_profile(args.params, _overrides(args.set))
    _use_threads(profile)
    ckpt = Path(args.checkpoint)
    if not (ckpt / "config.json").exists():
        raise ConfigError(f"checkpoint {str(ckpt)!r}: no config.json there (give a checkpoint directory)")
    if args.n < 1:
        raise ConfigError(f"--n must be >= 1, got {args.n}")
    try:
        task = get_task(args.task, trace=profile.trace)
    except ValueError as e:
        raise ConfigError(f"--task {args.task!r}: {e}") from e
    if not hasattr(task, "diagnose"):
        raise ConfigError(f"--task {args.task!r} has no error-mode diagnosis (only the countdown tasks do)")
    modes = error_modes(load_checkpoint(ckpt), task, held_out(task, args.n, seed=profile.data_seed))
    print(f"{ckpt.name} on {args.n} held-out {task.name} problems ({profile.trace} trace, greedy):")
    for mode, row in modes.items():
        print(f"  {mode:<18} {row['count']:>5}  {100 * row['share']:5.1f}%   e.g. {row['examples'][0][0]} {row['examples'][0][1]}")
    if args.json:
        write_json_atomic(args.json, modes)
        print(f"written: {args.json}")
    return 0


def cmd_study(args) -> int:

    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be at least 1")
    return run_study(args.params, outputs=_outputs_root(args), workers=args.workers, overrides=_overrides(args.set),
                     progress=not args.quiet, ray_address=args.ray_address, gpus_per_run=args.gpus_per_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kdlab", description=__doc__)
    parser.add_argument("--outputs", default="outputs", help="outputs root (default: ./outputs)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    sub = parser.add_subparsers(dest="cmd", required=True)
    # --outputs is also accepted after the subcommand (SUPPRESS: absent there, the top-level value stays)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--outputs", default=argparse.SUPPRESS, help="outputs root (default: ./outputs)")

    p = sub.add_parser("teachers", parents=[common], help="build (or reuse) the student base and task teachers; print their table")
    p.add_argument("params")
    p.add_argument("--rebuild", action="store_true",
                   help="train from scratch (ignoring shipped checkpoints) into outputs/models-rebuild and compare hashes")
    p.add_argument("--capacity", action="store_true",
                   help="also train the student preset with each teacher's recipe (the capacity check) and add it to the table")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a parameter (dotted key)")
    p.set_defaults(fn=cmd_teachers)

    p = sub.add_parser("distill", parents=[common], help="one distillation run; writes metrics.json and history")
    p.add_argument("params")
    add_cell_flags(p)
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.set_defaults(fn=cmd_distill)

    p = sub.add_parser("rlvr", parents=[common], help="GRPO with the task's verifier from a checkpoint (profile's rlvr section)")
    p.add_argument("params")
    p.add_argument("--start", default="base", help="checkpoint dir (a run's student/) or 'base'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.set_defaults(fn=cmd_rlvr)

    p = sub.add_parser("diagnose", parents=[common], help="sort a checkpoint's greedy countdown answers by error mode (false finish, arithmetic error, ...)")
    p.add_argument("params", help="profile (its trace style and data seed choose the held-out problems)")
    p.add_argument("checkpoint", help="checkpoint directory (a model in outputs/models, a run's student/)")
    p.add_argument("--task", default="countdown-3")
    p.add_argument("--n", type=int, default=200, help="held-out problems (default 200)")
    p.add_argument("--json", default=None, help="also write the modes, counts and examples to this file")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.set_defaults(fn=cmd_diagnose)

    p = sub.add_parser("study", parents=[common], help="run a whole study profile: grid of run notebooks, results table, report")
    p.add_argument("params")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--ray-address", default=None,
                   help="send the runs to this Ray cluster ('auto', 'host:port', 'local') instead of local workers")
    p.add_argument("--gpus-per-run", type=float, default=1.0, help="GPUs each run asks for on Ray (0 on CPU-only clusters)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.set_defaults(fn=cmd_study)

    args = parser.parse_args(argv)
    import transformers  # its own bars (loading, saving weights) say nothing kdlab's bars do not

    transformers.utils.logging.disable_progress_bar()
    try:
        return int(args.fn(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        line = _one_line(e)
        if line is None or args.debug:
            raise
        print(f"kdlab: {line}", file=sys.stderr)
        return 2


# Faults of the environment shown as one line: a file or directory that cannot be written.
_ENV_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR}


def _one_line(e: Exception) -> str | None:
    """The line the command line shows for a user or environment error; None for a bug."""

    if isinstance(e, ConfigError):
        return f"invalid parameters: {e}"
    if isinstance(e, (KdlabError, FileNotFoundError)):
        return str(e)
    if isinstance(e, OSError) and e.errno in _ENV_ERRNOS:
        return f"cannot write {e.filename or 'a file'}: {e.strerror}"
    return None


if __name__ == "__main__":
    sys.exit(main())
