"""One run, end to end: load the models, distil, evaluate, write ``metrics.json`` + history.

Used by ``kdlab distill``, by the run notebook (``notebooks/10_run.ipynb``) and so by the study
runner. Every file is written atomically (temp file + rename), metrics last, so a run directory
holding ``metrics.json`` is a complete run.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable

import torch

from . import building, materials
from ..models.codec import CHAR
from .config import Profile
from .contract import RunContract
from ..engine.data import ProblemPool
from ..core.dtypes import DTYPE_NAMES, DTYPES
from ..engine.run_config import GRPOSettings, RunConfig
from ..engine.trainer import compute_dtype_of, upcast
from ..engine.distill import distill
from ..engine.offpd import offpd_rollouts, offpd_teacher_logits
from ..evaluation.evaluate import accuracy, pass_at_ks
from ..core.atomic import write_atomic, write_json_atomic, write_dir_atomic
from ..core.schema import SAMPLED_KINDS
from ..core.metrics import update_sparsity
from ..models.toy import save_checkpoint
from ..tasks.base import Problem, held_out
from ..evaluation.style import style_report, teacher_prompt as instructed_prompt
from ..engine.rlvr import RLVRConfig, grpo_train
from .style_teacher import style_teacher_path

TRAIN_POOL = 5000  # distinct training problems a run draws its prompts from


def training_details(cfg: RunConfig, optimizer: str) -> dict[str, Any]:
    """The paper's training details as this run used them (columns of results.parquet; see
    docs/calibration.md section 15): each model's temperature in sampling and in the loss, the
    learning-rate schedule (linear warm-up steps, then constant), prompts per step, the AdamW
    implementation actually used, and the sampled-KL estimator (kl k1/k2/k3/sf)."""
    (s_sample, t_sample), (s_loss, t_loss) = cfg.sample_temperatures(), cfg.loss_temperatures()
    return {"teacher_sample_temperature": t_sample, "student_sample_temperature": s_sample,
            "teacher_loss_temperature": t_loss, "student_loss_temperature": s_loss,
            "lr_schedule": "constant", "warmup": cfg.warmup, "prompts_per_step": cfg.batch_size,
            "optimizer": optimizer, "sampled_estimator": cfg.kl if cfg.kl in SAMPLED_KINDS else None}


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def evaluate_model(model: torch.nn.Module, profile: Profile, task_name: str, seed: int = 0,
                   codec=CHAR) -> dict[str, float]:
    """Held-out accuracy, pass@k, harder variants and forgetting-set scores of one model (fractions).

    Keys: ``accuracy`` (greedy pass@1 on ``eval.n_test`` test problems), ``pass_at_<k>`` for each
    k of ``eval.pass_ks`` up to ``eval.pass_n`` (unbiased estimator from ``pass_n`` samples on the
    first ``pass_problems`` of them), per harder variant ``<variant>_accuracy`` (on ``eval.n_harder``
    problems, default ``n_test``) and, with
    ``eval.harder_pass``, ``<variant>_pass_at_<k>``; ``probe_<name>`` for each member of the
    forgetting set (``kdlab.study.materials.forgetting_sets``: the toy probes or the benchmark files)
    and ``probe_mean``."""
    ev = profile.eval
    task, test = materials.test_set(profile, task_name, ev.n_test)
    out: dict[str, float] = {}
    out["accuracy"] = accuracy(model, task, test, codec=codec)
    ks = tuple(sorted({k for k in ev.pass_ks if k <= ev.pass_n}))
    pk = pass_at_ks(model, task, test[:ev.pass_problems], n=ev.pass_n, ks=ks, temperature=ev.temperature, seed=seed,
                    codec=codec)
    for k, v in pk.items():
        out[f"pass_at_{k}"] = v
    for h in ev.harder:
        if h != task_name and task_name.startswith("countdown"):
            ht, hard_test = materials.test_set(profile, h, ev.n_test if ev.n_harder is None else ev.n_harder)
            out[f"{h}_accuracy"] = accuracy(model, ht, hard_test, codec=codec)
            if ev.harder_pass:
                hk = pass_at_ks(model, ht, hard_test[:ev.pass_problems], n=ev.pass_n, ks=ks,
                                temperature=ev.temperature, seed=seed, codec=codec)
                out.update({f"{h}_pass_at_{k}": v for k, v in hk.items()})
    scores = []
    for name, ptask, problems in materials.forgetting_sets(profile):
        s = accuracy(model, ptask, problems, codec=codec)
        out[f"probe_{name}"] = s
        scores.append(s)
    out["probe_mean"] = sum(scores) / len(scores) if scores else float("nan")
    return out


def base_evaluation(profile: Profile, student_dir: Path, task_name: str, cache_root: Path) -> dict[str, float]:
    """The student base's evaluation, computed once per (base, task, eval settings) and cached."""
    # what of a real profile's models and forgetting set the scores depend on (not its training
    # memory settings, nor where runs are scheduled)
    training_only = ("micro_batch_size", "kl_chunk_size", "teacher_hidden", "gradient_checkpointing", "ray_address",
                     "gpus_per_run")
    forgetting = ({k: v for k, v in asdict(profile.pretrained).items() if k not in training_only}
                  if materials.is_real(profile) else None)
    path = cache_root / "base_eval" / (f"{task_name}-" + _key(materials.model_id(student_dir), task_name,
                                                              asdict(profile.eval), profile.trace, profile.data_seed,
                                                              *([forgetting] if forgetting else [])) + ".json")
    if path.exists():
        return json.loads(path.read_text())
    model, codec = materials.load_model(profile, student_dir, profile.distill.dtype if materials.is_real(profile) else "fp32")
    result = evaluate_model(model, profile, task_name, codec=codec)
    write_json_atomic(path, result)
    return result


def offpd_cache(profile: Profile, cfg: RunConfig, teacher: torch.nn.Module, teacher_dir: Path, task, pool: ProblemPool,
                cache_root: Path, teacher_prompt: Callable[[Problem], str] | None = None, codec=CHAR):
    """Teacher rollouts for OffPD, sampled once per (teacher, task, data seed, size, the teacher's
    sampling temperature, instructed or not). ``teacher_prompt`` maps a problem to the teacher's prompt (the style
    experiment's instruction); the student trains on the rollouts under its own prompt."""
    teacher_temperature = cfg.sample_temperatures()[1]  # = cfg.temperature unless teacher_temperature is set
    parts = (materials.model_id(teacher_dir), cfg.task, cfg.data_seed, cfg.offpd_pool, teacher_temperature, profile.trace,
             TRAIN_POOL)
    parts += ("instructed",) if teacher_prompt is not None else ()
    system = materials.teacher_system(profile)
    parts += (("system", system),) if system else ()
    path = cache_root / "offpd" / f"{cfg.task}-{_key(*parts)}.pt"
    keys = {p.key: p for p in pool.problems}
    if path.exists():
        blob = torch.load(path, weights_only=False)
        return [keys[k] for k in blob["keys"]], blob["responses"]
    problems, responses = offpd_rollouts(teacher, task, pool, cfg.offpd_pool, teacher_temperature, seed=cfg.data_seed,
                                         max_new_tokens=task.max_new_tokens, teacher_prompt=teacher_prompt, codec=codec,
                                         teacher_system=system,
                                         batch_size=512 if codec is CHAR else codec.eval_batch_size)
    write_atomic(path, lambda tmp: torch.save({"keys": [p.key for p in problems], "responses": responses}, tmp))
    return problems, responses


def offpd_logits_cache(profile: Profile, cfg: RunConfig, teacher: torch.nn.Module, teacher_dir: Path,
                       offpd: tuple[list[Problem], list[list[int]]], cache_root: Path,
                       teacher_prompt: Callable[[Problem], str] | None = None, codec=CHAR) -> torch.Tensor | None:
    """The teacher's logits (with ``teacher_hidden``, its last hidden states) of the whole OffPD pool
    (``kdlab.engine.offpd.offpd_teacher_logits``), computed
    once per pool and teacher arithmetic and read by every OffPD run on that pool: in the quick
    grid, the 4 KL x rate runs of each seed and all seeds share one pool per task, so 12 runs
    read what one computes. None where the store is too large to keep (runs then compute the
    rows they draw)."""
    dtype = DTYPE_NAMES[next(teacher.parameters()).dtype]
    teacher_temperature = cfg.sample_temperatures()[1]
    kind = "hidden" if cfg.teacher_hidden else "logits"  # what the store holds per response token
    parts = (materials.model_id(teacher_dir), cfg.task, cfg.data_seed, cfg.offpd_pool, teacher_temperature, profile.trace,
             TRAIN_POOL, dtype, kind, "instructed" if teacher_prompt is not None else "plain",
             materials.teacher_system(profile) or "")
    path = cache_root / "offpd" / f"{cfg.task}-{kind}-{_key(*parts)}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    store = offpd_teacher_logits(teacher, offpd, teacher_prompt=teacher_prompt, codec=codec,
                                 teacher_system=materials.teacher_system(profile), hidden=cfg.teacher_hidden)
    if store is not None:
        write_atomic(path, lambda tmp: torch.save(store.cpu(), tmp))
    return store


def style_metrics(model: torch.nn.Module, profile: Profile, codec=CHAR) -> dict[str, float]:
    """``style_*`` metrics of a model on the student's own (uninstructed) prompts of
    ``style.n_test`` test problems of ``style.task`` (``kdlab.evaluation.style.style_report``, greedy, through
    ``codec``; the task as the profile's models read it, ``materials.target_task``):
    ``style_adoption`` (share of styled outputs in the teacher's alt notation; NaN when none is
    styled), ``style_styled_share``, ``style_accuracy`` and the counts ``style_plain`` /
    ``style_alt`` / ``style_none``."""

    task = materials.target_task(profile, profile.style.task)
    rep = style_report(model, task, held_out(task, profile.style.n_test, seed=profile.data_seed), codec=codec)
    return {"style_adoption": rep["adoption"], "style_styled_share": rep["styled_share"],
            "style_accuracy": rep["accuracy"], **{f"style_{k}": rep[k] for k in ("plain", "alt", "none")}}


class Placement:
    """Where a run's models live while it trains: on the profile's device, in this process (what
    every run does, unless a launcher shards it: ``kdlab.study.fsdp_run.Sharded``)."""

    def snapshot(self, student: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
        """The student's weights before training, in ``dtype`` (for update sparsity)."""
        return {k: v.detach().to(dtype).clone() for k, v in student.named_parameters()}

    def place(self, student: torch.nn.Module, teacher: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
        return student, teacher

    def gather(self, student: torch.nn.Module, result: Any, out_dir: Path) -> torch.nn.Module | None:
        """The trained student as one plain model where the run is evaluated and recorded, else None."""
        return student


def execute_run(contract: RunContract, progress: bool = True, train_missing: bool = True,
                placement: Placement = Placement()) -> dict[str, Any] | None:
    """Run one distillation end to end, as its ``contract`` says (``kdlab.study.contract``), and write
    ``out_dir/{history.json,metrics.json,config.json}`` (and ``out_dir/student/`` with ``save_student``).

    A style run (``contract.style``) is an incidental-style-transfer run: the teacher is the profile's
    style teacher (``kdlab.study.style_teacher``), it sees the instructed prompt
    (``kdlab.evaluation.style.teacher_prompt``) while the student sees its usual one, and the
    metrics add ``style_*`` (``style_metrics``) for the distilled student and ``base_style_*`` for
    the student base. ``train_missing``: build a model the store lacks (else a clear error).
    ``placement``: where the models train (``Placement``: this process, the profile's device); a
    sharded run returns None on every process but the one that evaluates it."""
    t0 = time.perf_counter()
    profile, cfg, out_dir, models_root = contract.profile, contract.run, contract.out_dir, contract.models_root
    style, save_student = contract.style, contract.save_student
    cache_root = models_root.parent / "cache"
    paths = building.model_paths(profile, models_root, progress=progress, train=train_missing)
    task = materials.target_task(profile, cfg.task)
    teacher_prompt = None
    if style:
        teacher_prompt = instructed_prompt
        if cfg.task != profile.style.task:
            raise ValueError(f"a style run distils style.task {profile.style.task!r}, got task {cfg.task!r}")
        teacher_dir = style_teacher_path(profile, models_root, progress=progress, train=train_missing)
    else:
        teacher_dir = paths[cfg.task]
    student, teacher, codec = materials.load_pair(profile, paths["student"], teacher_dir, cfg.dtype)
    # the run's arithmetic (fp32 on a CPU by default): the teacher samples the OffPD pool and the
    # distilled student is judged in it, as the toy base is (``base_evaluation``: fp32)
    arith = compute_dtype_of(cfg, next(student.parameters()).device)
    teacher = upcast(teacher, arith)
    base_style = {f"base_{k}": v for k, v in style_metrics(student, profile, codec).items()} if style else {}
    pool = ProblemPool(task, "train", TRAIN_POOL, seed=cfg.data_seed)
    t_off0 = time.perf_counter()
    offpd = (offpd_cache(profile, cfg, teacher, teacher_dir, task, pool, cache_root, teacher_prompt=teacher_prompt,
                         codec=codec) if cfg.policy == "off" else None)
    logits = (offpd_logits_cache(profile, cfg, teacher, teacher_dir, offpd, cache_root, teacher_prompt=teacher_prompt,
                                 codec=codec) if cfg.policy == "off" else None)
    offpd_s = time.perf_counter() - t_off0
    dtype = DTYPES[cfg.dtype]
    before = placement.snapshot(student, dtype)
    student, teacher = placement.place(student, teacher)
    result = distill(student, teacher, task, cfg, offpd=offpd, pool=pool, teacher_prompt=teacher_prompt,
                     progress=progress, codec=codec, teacher_system=materials.teacher_system(profile),
                     offpd_teacher_logits=logits)
    del teacher
    student = placement.gather(student, result, out_dir)
    if student is None:  # another process of a sharded run: the main one evaluates and records it
        return None
    t_ev = time.perf_counter()
    base = base_evaluation(profile, paths["student"], cfg.task, cache_root)
    judged = upcast(student, arith)
    after = evaluate_model(judged, profile, cfg.task, seed=cfg.seed, codec=codec)
    if style:
        after.update(style_metrics(judged, profile, codec))
    del judged
    eval_s = time.perf_counter() - t_ev
    probes = [k for k in after if k.startswith("probe_") and k != "probe_mean"]
    metrics: dict[str, Any] = {
        "run_id": cfg.run_id, "task": cfg.task, "policy": cfg.policy, "lam": cfg.lam, "kl": cfg.kl, "lr": cfg.lr,
        "grid_lr": profile.grid.role(cfg.task, cfg.lr), "seed": cfg.seed, "dtype": cfg.dtype, "compute_dtype": DTYPE_NAMES[arith], "grad_clip": cfg.grad_clip,
        "steps": cfg.steps,
        "sampled_direction": cfg.sampled_direction if cfg.kl in SAMPLED_KINDS else None, "jsd_beta": cfg.jsd_beta,
        "batch_size": cfg.batch_size, "temperature": cfg.temperature, **training_details(cfg, result.optimizer),
        "experiment": "style" if style else "grid",
        **materials.describe(profile, {**paths, cfg.task: teacher_dir}, cfg.task),
        "micro_batch_size": cfg.micro_batch_size, "kl_chunk_size": cfg.kl_chunk_size, "teacher_hidden": cfg.teacher_hidden,
        **after,
        **{f"base_{k}": v for k, v in base.items()}, **base_style,
        "forgetting": after["probe_mean"] - base["probe_mean"],
        **{f"forgetting_{k.removeprefix('probe_')}": after[k] - base[k] for k in probes},
        "sparsity": update_sparsity(before, student),
        "sparsity_dtype": cfg.dtype,
        "collapsed": result.collapsed, "collapse_step": result.collapse_step,
        "steps_done": len(result.history),
        "final_loss": result.history[-1]["loss"] if result.history else float("nan"),
        "wall_s": time.perf_counter() - t0,
        "time_rollout_s": result.phase_s.get("rollout", 0.0) + offpd_s, "time_step_s": result.phase_s.get("step", 0.0),
        "time_eval_s": eval_s,
    }
    write_json_atomic(out_dir / "history.json", result.history)
    if save_student:
        if materials.is_real(profile):

            write_dir_atomic(out_dir / "student", lambda d: (student.save_pretrained(str(d)),
                                                             codec.tokenizer.save_pretrained(str(d))))
        else:
            save_checkpoint(student, out_dir / "student", {"run": asdict(cfg)})
    write_json_atomic(out_dir / "config.json", asdict(cfg))
    write_json_atomic(out_dir / "metrics.json", metrics)
    return metrics


def execute_rlvr(profile: Profile, start: str | Path, out_dir: str | Path, models_root: str | Path, seed: int = 0,
                 progress: bool = True, info: dict[str, Any] | None = None,
                 settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """GRPO (``kdlab.engine.rlvr``) from a checkpoint with ``profile.rlvr`` settings; writes
    ``out_dir/{history.json,metrics.json}`` (metrics last). ``start`` is a checkpoint directory
    (e.g. a distilled run's ``student/``, saved with ``kdlab distill --save-student``) or "base"
    for the profile's student base. ``info`` (e.g. the start's label, policy, kl, lr) is merged
    into the metrics. ``final_reward`` / ``final_length`` are the mean reward and response length
    (tokens) over the last tenth of the steps (at least one). ``settings``: GRPO settings other than
    ``rlvr``'s (a pipeline's steps and KL-to-teacher term, ``kdlab.study.followups.pipeline_settings``).
    With ``pipelines.enabled`` the run also reads the forgetting set at its end: ``probe_mean``,
    ``base_probe_mean`` (the student base's) and ``forgetting``, their difference."""

    out_dir = Path(out_dir)
    r = profile.rlvr
    start_dir = (building.model_paths(profile, models_root, progress=progress)["student"] if str(start) == "base"
                 else Path(start))
    model, codec = materials.load_model(profile, start_dir, "fp32", train=True)  # grpo_train casts to rlvr.dtype
    task = materials.target_task(profile, r.task)
    pool = ProblemPool(task, "train", TRAIN_POOL, seed=profile.data_seed)
    cfg = RLVRConfig(**{**{f.name: getattr(r, f.name) for f in fields(GRPOSettings)}, **(settings or {})}, seed=seed)
    eval_problems = held_out(task, r.n_eval, seed=profile.data_seed)
    reference = None
    if cfg.kl_coef > 0 and cfg.kl_reference == "teacher":  # the task's teacher (config: rlvr.task has one)
        teacher_dir = building.model_paths(profile, models_root, progress=progress)[r.task]
        reference, _ = materials.load_model(profile, teacher_dir, "fp32")
        info = {**(info or {}), "kl_teacher_sha256": materials.model_id(teacher_dir)}
    result = grpo_train(model, task, cfg, pool, eval_fn=lambda m: accuracy(m, task, eval_problems, codec=codec),
                        eval_every=r.eval_every, progress=progress, codec=codec, reference=reference)
    evals = [h["accuracy"] for h in result["history"] if h.get("accuracy") is not None]
    metrics = {"start": str(start), "task": r.task, "seed": seed, "steps_done": len(result["history"]),
               "initial_accuracy": result["initial_accuracy"], "final_accuracy": result["final_accuracy"],
               "best_accuracy": max(evals) if evals else result["final_accuracy"],
               "collapsed": result["collapsed"], "collapse_step": result["collapse_step"], "nan": result["nan"],
               "wall_s": result["wall_s"], "start_sha256": materials.model_id(start_dir),
               "kl_coef": cfg.kl_coef, "kl_reference": cfg.kl_reference, "grpo_steps": cfg.steps, **(info or {})}
    if profile.pipelines.enabled:  # the pipelines' cost in forgetting, against the student base
        sets = materials.forgetting_sets(profile)
        base_dir = building.model_paths(profile, models_root, progress=progress)["student"]
        base, _ = materials.load_model(profile, base_dir, "fp32")
        model.float()  # evaluated in fp32 as the base is (the run's bf16 parameters are exact in fp32)
        end = [accuracy(model, t, problems, codec=codec) for _, t, problems in sets]
        begin = [accuracy(base, t, problems, codec=codec) for _, t, problems in sets]
        metrics["probe_mean"] = sum(end) / len(end) if end else float("nan")
        metrics["base_probe_mean"] = sum(begin) / len(begin) if begin else float("nan")
        metrics["forgetting"] = metrics["probe_mean"] - metrics["base_probe_mean"]
    tail = result["history"][-max(1, len(result["history"]) // 10):]
    metrics["final_reward"] = sum(h["reward_mean"] for h in tail) / len(tail) if tail else float("nan")
    metrics["final_length"] = sum(h["length"] for h in tail) / len(tail) if tail else float("nan")
    write_json_atomic(out_dir / "history.json", result["history"])
    write_json_atomic(out_dir / "metrics.json", metrics)
    return metrics
