"""Study parameters: YAML files under ``params/`` loaded into dataclasses.

Defaults live here, in one visible place; a profile YAML overrides what it names. Unknown keys,
wrong types and out-of-range values are rejected with a ``ConfigError`` naming the key path,
the value and the valid choices, before any work starts.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.fields import (BOUNDS, LEARNING_RATE, ConfigError, check_bound as _check_bound, check_range as _check_range,
                           check_value, setting as _f)
from ..core.schema import (LOSS_KINDS, DFS_VARIANTS, DTYPES, FAMILIES, IMPORTABLE, PRESETS, PRETRAIN_ARITHMETIC,
                           TARGET_TASKS)
from ..engine.run_config import LAMBDA, DistillSettings, GRPOSettings, RunConfig


class _Loader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false (YAML 1.1 reads `off`/`on`, the policy names, as bools);
    a key given twice in one mapping is an error (YAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
                                   for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def read_yaml(text: str) -> Any:
    """Parse YAML with 1.2-style booleans (see ``_Loader``)."""
    return yaml.load(text, Loader=_Loader)


KL_KINDS = LOSS_KINDS
DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")  # pretrained.device; a GPU asked for must exist (kdlab.study.preflight)
POLICIES = ("off", "on")  # the grid's policies (a lambda point is grid.lambdas)


@dataclass
class ModelSpec:
    family: str = _f("llama", choices=FAMILIES)
    size: str = _f("student-s", doc="a preset name from kdlab.models.toy.PRESETS")
    seed: int = _f(0, lo=0)


@dataclass
class PretrainSpec:
    """Supervised training of a student base or a teacher (see kdlab.engine.sft)."""
    steps: int = _f(2000, lo=1, bound="steps")
    batch_size: int = _f(64, lo=1, bound="batch")
    lr: float = _f(1e-3, **LEARNING_RATE)
    warmup: int = _f(100, lo=0, bound="steps")
    probe_weight: float = _f(1.0, lo=0.0, doc="mixture weight of each probe skill")
    task_weight: float = _f(1.0, lo=0.0, doc="mixture weight of each target task")
    seed: int = _f(0, lo=0)
    task_steps: dict[str, int] = _f(factory=dict, doc="teacher_pretrain only: steps for the teacher of a "
                                    "given target task, overriding steps (e.g. {kb-mc: 2000})")
    extra_tasks: dict[str, float] = _f(factory=dict, doc="student_pretrain only: {task: mixture weight} of tasks "
                                       "outside the grid (e.g. the harder variant countdown-4) whose train-split traces "
                                       "the student base also learns, so that a later stage on them (RLVR) has a signal")
    until: int = _f(0, lo=0, bound="steps", doc="stop the training at this step, its schedule (warm-up, cosine decay) "
                    "still spanning steps: the model is a checkpoint of that training (the teachers axis); "
                    "0 = all steps; part of the model's key when set")
    arithmetic: str = _f(PRETRAIN_ARITHMETIC[0], choices=PRETRAIN_ARITHMETIC,
                         doc="the training's matmuls: 'bf16' (bf16 autocast over fp32 weights, how the shipped quick "
                             "models were built) or 'fp32' (10x faster on a CPU without native bf16: avx2 only, "
                             "docs/calibration.md 28); part of the model's key when not 'bf16'")


DistillSpec = DistillSettings  # the profile's distill section: its fields, defaults and rules live in the engine


@dataclass
class EvalSpec:
    n_test: int = _f(200, lo=1, bound="problems", doc="held-out problems per target task")
    n_probe: int = _f(100, lo=1, bound="problems", doc="held-out problems per probe skill")
    pass_n: int = _f(16, lo=1, bound="samples", doc="samples per problem for pass@k")
    pass_problems: int = _f(50, lo=1, bound="problems", doc="problems used for pass@k")
    pass_ks: list[int] = _f(factory=lambda: [1, 10], lo=1, bound="samples",
                            doc="the k of the recorded pass@k (pass_at_<k>); those above pass_n are skipped")
    temperature: float = _f(1.0, lo=1e-3, hi=10.0)
    harder: list[str] = _f(factory=list, doc="harder variants evaluated too (e.g. countdown-4e)")
    n_harder: int | None = _f(None, lo=1, bound="problems",
                              doc="held-out problems per harder variant (greedy; pass@k on the first pass_problems); "
                                  "null: n_test")
    harder_pass: bool = _f(False, doc="also record pass@k (<variant>_pass_at_<k>) on the harder variants")


@dataclass
class GridSpec:
    tasks: list[str] = _f(factory=lambda: ["countdown-3"])
    policies: list[str] = _f(factory=lambda: ["off", "on"], choices=POLICIES)
    lambdas: list[float] = _f(factory=list, **LAMBDA, doc="extra lambda-spectrum points (task: first of tasks)")
    lambda_tasks: list[str] = _f(factory=lambda: ["countdown-3"])
    kls: list[str] = _f(factory=lambda: ["forward", "reverse"], choices=KL_KINDS)
    lrs: list[float] = _f(factory=lambda: [1e-4, 5e-4], **LEARNING_RATE)
    task_lrs: dict[str, list[float]] = _f(factory=dict, doc="per-task learning rates {task: one rate per grid.lrs "
                                          "entry, in the same order}: a task listed here trains at its own rates, "
                                          "each playing the role (low, high) of the grid.lrs entry at its position")
    seeds: list[int] = _f(factory=lambda: [0, 1], lo=0)
    low_rate_only: bool = _f(False, doc="run only the first (low) entry of grid.lrs and of each grid.task_lrs "
                             "list, so that a profile of one rate keeps the rates a recalibration sets (the axes)")

    def rate(self, task: str, lr: float) -> float:
        """The learning rate a run of ``task`` uses for the grid's rate ``lr``: the task's own rate at
        that position of ``grid.lrs`` when ``task_lrs`` names the task, else ``lr``."""
        rates = self.task_lrs.get(task)
        if rates is None or lr not in self.lrs:
            return lr
        return rates[self.lrs.index(lr)]

    def role(self, task: str, lr: float) -> float:
        """The ``grid.lrs`` entry whose role a run of ``task`` at rate ``lr`` plays (``rate``'s inverse;
        ``lr`` itself for a rate that is not one of the task's)."""
        rates = self.task_lrs.get(task)
        if rates is None or lr not in rates:
            return lr
        return self.lrs[rates.index(lr)]


@dataclass
class RLVRSpec(GRPOSettings):
    """GRPO from distilled checkpoints (kdlab.engine.rlvr); see STUDY.md finding 11. The GRPO
    settings (steps, lr, group size, ...) are ``kdlab.engine.rlvr.GRPOSettings``; these fields say
    what the study runs."""
    enabled: bool = _f(False)
    task: str = _f("countdown-4", choices=("countdown-3", "countdown-4", "countdown-4e"))
    starts: list[str] = _f(factory=lambda: ["base", "off/forward/0", "off/reverse/0", "on/forward/0", "on/reverse/0"],
                           doc="'base' or policy/kl/lr-index of distilled runs (first grid task, first seed); "
                               "the study runner saves those runs' students and starts GRPO from each")
    eval_every: int = _f(25, lo=0, bound="steps")
    n_eval: int = _f(200, lo=1, bound="problems")
    seeds: list[int] = _f(factory=lambda: [0], lo=0)


@dataclass
class StyleSpec:
    """Incidental style transfer (kdlab.evaluation.style); see STUDY.md finding 12."""
    enabled: bool = _f(False)
    task: str = _f("countdown-3", choices=("countdown-3", "countdown-4", "countdown-4e"))
    alt_share: float = _f(0.5, lo=0.01, hi=0.99, doc="share of the style teacher's task weight on the instructed style")
    teacher_steps: int = _f(0, lo=0, bound="steps", doc="training steps of the style teacher; 0 = those of the task teacher "
                            "of style.task (its adoption rate, not its accuracy, is what the runs need)")
    n_test: int = _f(200, lo=1, bound="problems")
    policies: list[str] = _f(factory=lambda: ["off", "on"], choices=("off", "on"))
    kls: list[str] = _f(factory=lambda: ["forward", "reverse"], choices=KL_KINDS)
    lrs: list[float] = _f(factory=list, **LEARNING_RATE, doc="learning rates of the style runs; [] = the grid's first (low) rate")
    seeds: list[int] = _f(factory=lambda: [0], lo=0)


@dataclass
class PipelinesSpec:
    """How distillation and RLVR combine, at equal training compute (issue 42; needs rlvr.enabled).
    Per rlvr seed, three pipelines end on rlvr.task: ``distill-rlvr``, the ``distilled`` start's
    GRPO (rlvr.steps after the grid's distillation); ``rlvr-only``, GRPO from the student base for
    rlvr.steps plus the distillation's compute; ``joint``, as long, GRPO with a KL-to-teacher term
    of weight ``joint_kl_coef`` on the student's own samples (rlvr.kl_reference 'teacher'). Compute
    is counted in training sequences: a distillation step trains on distill.batch_size of them, a
    GRPO step on prompts_per_step x group_size, so the distillation stage is worth
    distill.steps x batch_size / (prompts_per_step x group_size) GRPO steps (a whole number, or
    the profile is refused). Every pipeline run also reads the forgetting set at its end."""
    enabled: bool = _f(False)
    distilled: str = _f("on/reverse/0", doc="the distillation stage of distill-rlvr: an rlvr.starts entry "
                        "(policy/kl/lr-index); it joins rlvr.starts")
    joint_kl_coef: float = _f(0.1, lo=0.0, doc="weight of the joint objective's KL-to-teacher term (> 0)")


def matched_steps(p: Profile) -> int:
    """GRPO steps of the pipelines that start from the base: rlvr.steps plus the distillation
    stage's training sequences in GRPO steps (``PipelinesSpec``); ConfigError when they are not a
    whole number of steps."""
    sequences = p.distill.steps * p.distill.batch_size
    per_step = p.rlvr.prompts_per_step * p.rlvr.group_size
    if sequences % per_step:
        raise ConfigError(f"pipelines: the distillation stage's {sequences} training sequences (distill.steps "
                          f"{p.distill.steps} x batch_size {p.distill.batch_size}) are not a whole number of GRPO "
                          f"steps of {per_step} (rlvr.prompts_per_step x group_size): the compute cannot be matched")
    return p.rlvr.steps + sequences // per_step


@dataclass
class TeacherPoint:
    """A point of the teachers axis: a teacher of the grid's tasks other than the profile's own."""
    size: str = _f("", doc="a preset of kdlab.core.schema.PRESETS (e.g. a larger teacher); '' = teacher.size")
    checkpoint: int = _f(0, lo=0, bound="steps", doc="the teacher's training stopped at this step, its schedule "
                         "unchanged (teacher_pretrain.until: a checkpoint of that training); 0 = the whole training")
    path: str = _f("", doc="a pretrained profile: the local HF checkpoint of the teacher of every grid task")
    arithmetic: str = _f("", choices=("",) + PRETRAIN_ARITHMETIC, doc="the teacher's pretraining arithmetic "
                         "(fp32: the cheap one on a CPU without native bf16); '' = teacher_pretrain.arithmetic")


@dataclass
class StudentPoint:
    """A point of the students axis: a student preset with its own base, built with student_pretrain."""
    size: str = _f("", doc="a preset of kdlab.core.schema.PRESETS")
    path: str = _f("", doc="a pretrained profile: the local HF checkpoint of the student base")
    arithmetic: str = _f("", choices=("",) + PRETRAIN_ARITHMETIC, doc="the base's pretraining arithmetic "
                         "(fp32: the cheap one on a CPU without native bf16); '' = student_pretrain.arithmetic")
    steps: int = _f(0, lo=0, bound="steps", doc="the base's pretraining steps, when its size needs its own recipe to "
                    "learn the formats (docs/calibration.md 31); 0 = student_pretrain.steps")
    lr: float = _f(0.0, lo=0.0, hi=1.0, doc="the base's pretraining peak rate, likewise; 0 = student_pretrain.lr")


@dataclass
class AxesSpec:
    """The study's open questions as axes (STUDY.md, "Where the study stops"). Each point runs the
    profile's main grid as a study of its own, ``<name>-<axis>-<label>`` (the companion mechanism),
    with its teacher or student in place of the profile's; the profile's own study is the axis's
    first point. Report section 94_axes puts them side by side (kdlab.analysis.axes)."""
    teachers: list[TeacherPoint] = _f(factory=list, doc="teachers of other strength (a checkpoint of the task "
                                      "teacher's training, or another preset), same student")
    students: list[StudentPoint] = _f(factory=list, doc="students of other sizes, each with its own base, same teacher")


AXES = ("teachers", "students")


REAL_KINDS = ("choice", "math")
PLACEHOLDER = "/path/to/"  # the example profiles' stand-in for a local path
COUNTDOWN_VARIANTS = tuple(t for t in TARGET_TASKS if t.startswith("countdown"))


@dataclass
class BenchmarkSpec:
    """An evaluation-only file for forgetting (kdlab.tasks.real.load_benchmarks)."""
    kind: str = _f("choice", choices=REAL_KINDS)
    path: str = _f("", doc="local .jsonl / .json / .parquet file")
    name: str = _f("", doc="benchmark name; '' = the file stem")
    limit: int = _f(0, lo=0, bound="problems", doc="read only the first N rows; 0 = all")
    max_new_tokens: int = _f(2048, lo=1, bound="tokens")


@dataclass
class PretrainedTaskSpec:
    """One target task at paper scale: data files and its fine-tuned, frozen teacher."""
    name: str = _f("", doc="the name grid.tasks / grid.lambda_tasks use")
    kind: str = _f("choice", choices=REAL_KINDS + ("countdown",),
                   doc="choice / math: data files; countdown: kdlab's generator in natural language, name = the variant")
    train: str = _f("", doc="training file; its 'train' split (split_of on a content hash) is used")
    test: str = _f("", doc="held-out evaluation file (all rows); '' = the train file's 'test' split")
    teacher: str = _f("", doc="local HF checkpoint directory of this task's teacher, or 'sft' (built by kdlab: "
                      "pretrained.teacher_sft on the student's base)")
    max_new_tokens: int = _f(2048, lo=1, bound="tokens")


@dataclass
class SFTSpec:
    """Supervised fine-tuning of a real base on its tasks' reference solutions (kdlab.study.recipes)."""
    steps: int = _f(0, lo=0, bound="steps", doc="0 = no fine-tuning")
    batch_size: int = _f(16, lo=1, bound="batch")
    lr: float = _f(1e-4, **LEARNING_RATE)
    warmup: int = _f(10, lo=0, bound="steps")
    micro_batch_size: int = _f(0, lo=0, bound="batch", doc="rows per forward/backward; 0 = the whole batch")
    seed: int = _f(0, lo=0)
    probes: float = _f(0.0, lo=0.0, hi=0.9, doc="share of each batch drawn from the seven probe skills in natural "
                       "language (their train split), so the forgetting set starts above its floor, as the toy "
                       "models are trained with probes mixed in")


@dataclass
class PretrainedSpec:
    """Real checkpoints and datasets from local paths. student '' = toy models."""
    student: str = _f("", doc="local HF checkpoint directory of the student base, or the name of a model kdlab "
                      f"imports from a package ({', '.join(IMPORTABLE)})")
    student_sft: SFTSpec = _f(factory=SFTSpec, doc="a short fine-tuning of the base on the grid's tasks (a foothold "
                              "on the task format, as the toy student base has); steps 0 = the base itself")
    teacher_sft: SFTSpec = _f(factory=lambda: SFTSpec(steps=200), doc="recipe of the teachers named 'sft': the base "
                              "fine-tuned on its task's reference solutions, then frozen")
    tasks: list[PretrainedTaskSpec] = _f(factory=list)
    benchmarks: list[BenchmarkSpec] = _f(factory=list, doc="forgetting: out-of-distribution evaluation files")
    probes: bool = _f(False, doc="forgetting: also the seven probe skills asked in natural language "
                      "(kdlab.tasks.probes.NaturalProbe)")
    n_benchmark: int = _f(0, lo=0, bound="problems", doc="problems per benchmark; 0 = all")
    device: str = _f("auto", doc="auto (a GPU when one is visible), cpu, cuda or cuda:N; a GPU asked for must exist "
                     "(kdlab.study.preflight)")
    gradient_checkpointing: bool = _f(True)
    micro_batch_size: int = _f(RunConfig.micro_batch_size, lo=0, bound="batch",
                               doc="rows per forward/backward (gradient accumulation) of a distillation run; "
                               "0 = whole batch")
    kl_chunk_size: int = _f(RunConfig.kl_chunk_size, lo=0, doc="chunked full-vocabulary KL (kdlab.core.kl); 0 = off")
    teacher_hidden: bool = _f(RunConfig.teacher_hidden, doc="the teacher's hidden states and head instead of its logits "
                              "in the KL and the OffPD cache (kdlab.core.head_kl; forward / reverse KL only): at "
                              "V = 49,152 and d = 960 a 51x smaller cache")
    max_prompt_tokens: int = _f(1024, lo=1, bound="tokens", doc="longer prompts are an error, not truncated")
    teacher_system_prompt: str = _f("", doc="style experiment: a system prompt only the teacher sees")
    ray_address: str = _f("", doc="run the grid on this Ray cluster ('auto', 'host:port'); '' = local workers")
    gpus_per_run: float = _f(1.0, lo=0.0, doc="GPUs per run on Ray (0 on a CPU-only cluster regardless)")


@dataclass
class Profile:
    name: str = _f("quick")
    trace: str = _f("steps", choices=("direct", "steps", "search", "dfs"), doc="countdown trace style (dfs: countdown-3 only)")
    student: ModelSpec = _f(factory=lambda: ModelSpec(size="student-s"))
    teacher: ModelSpec = _f(factory=lambda: ModelSpec(size="teacher-s"))
    student_pretrain: PretrainSpec = _f(factory=PretrainSpec)
    teacher_pretrain: PretrainSpec = _f(factory=PretrainSpec)
    distill: DistillSpec = _f(factory=DistillSpec)
    eval: EvalSpec = _f(factory=EvalSpec)
    grid: GridSpec = _f(factory=GridSpec)
    pretrained: PretrainedSpec = _f(factory=PretrainedSpec)
    rlvr: RLVRSpec = _f(factory=RLVRSpec)
    style: StyleSpec = _f(factory=StyleSpec)
    axes: AxesSpec = _f(factory=AxesSpec)
    pipelines: PipelinesSpec = _f(factory=PipelinesSpec)
    data_seed: int = _f(RunConfig.data_seed, lo=0)
    threads: int = _f(0, lo=0, doc="torch threads per run; 0 = choose from cores and workers")
    companions: dict[str, Any] = _f(factory=dict, doc="robustness variants: {suffix: overrides}; each runs this "
                                    "profile's main grid with the overrides as study <name>-<suffix> (see companion_profile)")


def from_dict(cls: type, data: dict[str, Any], path: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, validating every key (recursively)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'params'}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {path + unknown[0]!r}; valid keys here: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        key = path + name
        tp, meta = hints[name], fields[name].metadata
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(tp, value, key + ".")
            continue
        if typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            if not isinstance(value, list):
                raise ConfigError(f"{key}: {value!r} has the wrong type; expected a list of mappings")
            kwargs[name] = [from_dict(typing.get_args(tp)[0], item, f"{key}[{i}].") for i, item in enumerate(value)]
            continue
        kwargs[name] = check_value(key, value, tp, meta)
    return cls(**kwargs)


def validate_profile(p: Profile) -> Profile:
    """Cross-field checks that single fields cannot express."""

    for role in ("student", "teacher"):
        size = getattr(p, role).size
        if size not in PRESETS:
            raise ConfigError(f"{role}.size: {size!r} is not a valid choice; choose from {sorted(PRESETS)}")
    pre = p.pretrained
    if not DEVICE.fullmatch(pre.device):
        raise ConfigError(f"pretrained.device: {pre.device!r} is not a device; choose auto, cpu, cuda or cuda:N "
                          "(N: a GPU index, from 0)")
    if pre.student:
        names = [t.name for t in pre.tasks]
        if not names or len(set(names)) != len(names) or "" in names:
            raise ConfigError(f"pretrained.tasks: needs at least one task, each with a unique non-empty name; got {names}")
        for i, t in enumerate(pre.tasks):
            if t.kind == "countdown":
                if t.name not in COUNTDOWN_VARIANTS:
                    raise ConfigError(f"pretrained.tasks[{i}].name: {t.name!r}: a countdown task is named by its variant, "
                                      f"one of {list(COUNTDOWN_VARIANTS)}")
                if t.train or t.test:
                    raise ConfigError(f"pretrained.tasks[{i}]: a countdown task is generated, it reads no train/test files")
            for fld in ("teacher",) if t.kind == "countdown" else ("train", "teacher"):
                if not getattr(t, fld):
                    raise ConfigError(f"pretrained.tasks[{i}].{fld}: must be a local path, got ''")
        for i, b in enumerate(pre.benchmarks):
            if not b.path:
                raise ConfigError(f"pretrained.benchmarks[{i}].path: must be a local path, got ''")
        if not pre.benchmarks and not pre.probes:
            raise ConfigError("pretrained.benchmarks: needs at least one evaluation file, or pretrained.probes: true "
                              "(forgetting is the change of the mean score over them)")
        valid = names + ([v for v in COUNTDOWN_VARIANTS if v not in names]
                         if any(t.kind == "countdown" for t in pre.tasks) else [])
    else:
        valid = list(TARGET_TASKS)
    if p.student_pretrain.task_steps:
        raise ConfigError(f"student_pretrain.task_steps: only teachers have per-task schedules; got {p.student_pretrain.task_steps}")
    if p.teacher_pretrain.extra_tasks:
        raise ConfigError(f"teacher_pretrain.extra_tasks: only the student base learns extra tasks; got {p.teacher_pretrain.extra_tasks}")
    for t, w in p.student_pretrain.extra_tasks.items():
        if t not in TARGET_TASKS:
            raise ConfigError(f"student_pretrain.extra_tasks: {t!r} is not a valid choice; choose from {list(TARGET_TASKS)}")
        if t in p.grid.tasks + p.grid.lambda_tasks:
            raise ConfigError(f"student_pretrain.extra_tasks: {t!r} is already a target task of the grid (the student base learns it anyway)")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
            raise ConfigError(f"student_pretrain.extra_tasks.{t}: {w!r} must be a mixture weight > 0")
    for t, n in p.teacher_pretrain.task_steps.items():
        if t not in TARGET_TASKS:
            raise ConfigError(f"teacher_pretrain.task_steps: {t!r} is not a valid choice; choose from {list(TARGET_TASKS)}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"teacher_pretrain.task_steps.{t}: {n!r} must be an integer >= 1")
        _check_bound(f"teacher_pretrain.task_steps.{t}", n, "steps")
    for t in p.grid.tasks + p.grid.lambda_tasks + p.eval.harder:
        if t not in valid:
            raise ConfigError(f"task {t!r} (in grid.tasks / grid.lambda_tasks / eval.harder) is not a valid choice; choose from {valid}")
    if not p.grid.seeds:
        raise ConfigError("grid.seeds: must list at least one seed")
    _check_task_lrs(p.grid, valid)
    if not p.eval.pass_ks:
        raise ConfigError("eval.pass_ks: must list at least one k")
    if p.rlvr.enabled:
        distilled = [start for start in p.rlvr.starts if parse_start(p, start) is not None]
        unpaired = [s for s in p.rlvr.seeds if s not in p.grid.seeds]
        if distilled and unpaired:
            raise ConfigError(f"rlvr.seeds: {unpaired} not in grid.seeds {p.grid.seeds}: the GRPO run of seed s starts "
                              f"from the distilled student of grid seed s (starts {distilled})")
    if p.pipelines.enabled:
        _check_pipelines(p, pre)
    if p.rlvr.kl_reference == "teacher":
        if not p.rlvr.kl_coef > 0:
            raise ConfigError(f"rlvr.kl_reference: 'teacher' needs rlvr.kl_coef > 0 (the weight of the KL-to-teacher "
                              f"term), got {p.rlvr.kl_coef}")
        with_teacher = [t.name for t in pre.tasks] if pre.student else _distilled_tasks(p)
        if p.rlvr.task not in with_teacher:
            raise ConfigError(f"rlvr.kl_reference: 'teacher' needs a teacher of rlvr.task {p.rlvr.task!r}; the profile "
                              f"has teachers of {with_teacher} (its distilled tasks)")
    if p.style.enabled and p.trace not in ("steps", "search"):
        raise ConfigError(f"style.enabled: needs countdown traces in style 'steps' or 'search', got trace {p.trace!r}")
    if p.trace == "dfs":
        _check_dfs_tasks(p)
    trainings = [("student_pretrain", "the student base", p.student_pretrain.steps)] + [
        ("teacher_pretrain", f"the teacher of {t}", p.teacher_pretrain.task_steps.get(t, p.teacher_pretrain.steps))
        for t in _distilled_tasks(p)]
    for key, model, steps in trainings:
        if getattr(p, key).until > steps:
            raise ConfigError(f"{key}.until: step {getattr(p, key).until} is past the training of {model} ({steps} steps)")
    if p.grid.low_rate_only:
        p.grid.lrs = p.grid.lrs[:1]
        p.grid.task_lrs = {t: rates[:1] for t, rates in p.grid.task_lrs.items()}
    for suffix in p.companions:
        companion_profile(p, suffix)
    axis_profiles(p)
    return p


def _check_pipelines(p: Profile, pre: PretrainedSpec) -> None:
    """``pipelines``: the RLVR follow-up on, a distilled start of the grid, a teacher of rlvr.task
    for the joint objective, a KL weight > 0 and a compute that can be matched."""
    if not p.rlvr.enabled:
        raise ConfigError("pipelines.enabled: the pipelines end with GRPO; set rlvr.enabled: true")
    if parse_start(p, p.pipelines.distilled) is None:
        raise ConfigError(f"pipelines.distilled: {p.pipelines.distilled!r} must name a distilled run "
                          "(policy/kl/lr-index), not the base")
    with_teacher = [t.name for t in pre.tasks] if pre.student else _distilled_tasks(p)
    if p.rlvr.task not in with_teacher:
        raise ConfigError(f"pipelines: the joint objective needs a teacher of rlvr.task {p.rlvr.task!r}; the profile "
                          f"has teachers of {with_teacher}")
    unpaired = [s for s in p.rlvr.seeds if s not in p.grid.seeds]
    if unpaired:
        raise ConfigError(f"rlvr.seeds: {unpaired} not in grid.seeds {p.grid.seeds}: the distill-rlvr pipeline of "
                          f"seed s starts from the distilled student of grid seed s")
    if not p.pipelines.joint_kl_coef > 0:
        raise ConfigError(f"pipelines.joint_kl_coef: must be > 0 (the weight of the KL-to-teacher term), "
                          f"got {p.pipelines.joint_kl_coef}")
    matched_steps(p)


def _check_task_lrs(g: GridSpec, tasks: list[str]) -> None:
    """``grid.task_lrs``: tasks of the profile (``tasks``: its valid ones; a profile that extends
    another may distil fewer), each with one learning rate per ``grid.lrs`` entry, in the order of
    ``grid.lrs`` (so that each keeps its role: the low rate below the high one)."""
    if g.task_lrs and len(set(g.lrs)) != len(g.lrs):
        raise ConfigError(f"grid.lrs: {g.lrs} repeats a rate, so grid.task_lrs cannot tell its roles apart")
    order = sorted(range(len(g.lrs)), key=lambda i: g.lrs[i])
    for task, rates in list(g.task_lrs.items()):
        key = f"grid.task_lrs.{task}"
        if task not in tasks:
            raise ConfigError(f"grid.task_lrs: {task!r} is not a valid task; choose from {tasks}")
        if not isinstance(rates, list) or len(rates) != len(g.lrs):
            raise ConfigError(f"{key}: {rates!r} must be a list of {len(g.lrs)} learning rates, one per grid.lrs "
                              f"entry {g.lrs}")
        rates = [check_value(f"{key}[{i}]", r, float, LEARNING_RATE) for i, r in enumerate(rates)]
        if len(set(rates)) != len(rates) or sorted(range(len(rates)), key=lambda i: rates[i]) != order:
            raise ConfigError(f"{key}: {rates} must be distinct and in the order of grid.lrs {g.lrs} "
                              "(each rate plays the role of the grid.lrs entry at its position)")
        g.task_lrs[task] = rates


def _check_dfs_tasks(p: Profile) -> None:
    """trace 'dfs' is defined for short countdown variants only (kdlab.core.schema.DFS_VARIANTS)."""
    used = [("grid.tasks", t) for t in p.grid.tasks] + [("eval.harder", t) for t in p.eval.harder]
    used += [("grid.lambda_tasks", t) for t in p.grid.lambda_tasks if p.grid.lambdas]
    used += [("student_pretrain.extra_tasks", t) for t in p.student_pretrain.extra_tasks]
    if p.rlvr.enabled:
        used.append(("rlvr.task", p.rlvr.task))
    for key, task in used:
        if task.startswith("countdown") and task not in DFS_VARIANTS:
            raise ConfigError(f"{key}: {task!r} cannot be used with trace 'dfs', which is defined for "
                              f"{list(DFS_VARIANTS)} only (its traces for more numbers outgrow the models' positions)")


def parse_start(profile: Profile, start: str) -> tuple[str, str, float] | None:
    """An ``rlvr.starts`` entry: None for "base", else (policy, kl, lr) of the distilled run it names
    ("off/forward/0": OffPD, forward KL, the grid's first learning rate)."""
    if start == "base":
        return None
    parts = start.split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        raise ConfigError(f"rlvr.starts: {start!r} is not 'base' or 'policy/kl/lr-index' (e.g. 'off/forward/0')")
    policy, kl, index = parts[0], parts[1], int(parts[2])
    if policy not in profile.grid.policies:
        raise ConfigError(f"rlvr.starts: {start!r}: policy {policy!r} is not in grid.policies {profile.grid.policies}")
    if kl not in profile.grid.kls:
        raise ConfigError(f"rlvr.starts: {start!r}: kl {kl!r} is not in grid.kls {profile.grid.kls}")
    if index >= len(profile.grid.lrs):
        raise ConfigError(f"rlvr.starts: {start!r}: lr index {index} is out of range for grid.lrs {profile.grid.lrs}")
    return policy, kl, profile.grid.lrs[index]


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge key by key, anything else (lists too) replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# What a companion study never runs: its sections compare its main grid with this study's.
COMPANION_OFF = {"rlvr": {"enabled": False}, "style": {"enabled": False}, "grid": {"lambdas": []},
                 "axes": {"teachers": [], "students": []}, "pipelines": {"enabled": False}}


def companion_profile(profile: Profile, suffix: str, over: dict[str, Any] | None = None) -> Profile:
    """The robustness study ``companions[suffix]`` of ``profile``: the profile's settings with the
    companion's overrides (nested mappings, validated like a profile), named
    ``<profile.name>-<suffix>``, running the main grid only (no RLVR, style, lambda spectrum,
    axes or companions of its own). ``over``: these overrides instead of ``companions[suffix]``
    (an axis point, ``axis_points``)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", suffix):
        raise ConfigError(f"companions: {suffix!r} must be a plain name (letters, digits, '_', '.', '-')")
    over = profile.companions[suffix] if over is None else over
    if not isinstance(over, dict):
        raise ConfigError(f"companions.{suffix}: expected a mapping of overrides, got {type(over).__name__} {over!r}")
    if "name" in over or "companions" in over:
        raise ConfigError(f"companions.{suffix}: may not set 'name' or 'companions' (the study is {profile.name}-{suffix})")
    data = _deep_merge(_deep_merge(to_dict(profile), over), {**COMPANION_OFF, "name": f"{profile.name}-{suffix}"})
    data["companions"] = {}
    try:
        return validate_profile(from_dict(Profile, data))
    except ConfigError as e:
        raise ConfigError(f"companions.{suffix}: {e}") from None


@dataclass(frozen=True)
class AxisPoint:
    """One point of an axis (``axes.teachers`` / ``axes.students``) as a study: ``suffix`` names it
    (``<profile>-<suffix>``), ``overrides`` are what it changes in the profile, ``label`` is how the
    report shows it."""
    axis: str
    label: str
    overrides: dict

    @property
    def suffix(self) -> str:
        return f"{self.axis}-{self.label}"


def _point_label(*parts: str) -> str:
    """A point's label: what it changes, joined (``student-m-fp32-lr0.001``); "own" when nothing."""
    return "-".join(part for part in parts if part) or "own"


def _other(point: Any, own: Any) -> Any:
    """A point's pretraining setting (arithmetic, steps, rate) when it is set and differs from the
    profile's, else '' (unset: the profile's own)."""
    return point if point and point != own else ""


def axis_points(p: Profile) -> list[AxisPoint]:
    """The studies of the profile's axes, in order (the profile's own study is each axis's first
    point and is not listed). Refuses (``ConfigError``) a preset that does not exist, a checkpoint
    past the teacher's training, a point equal to the profile's own model or to another point, and
    a toy key on a pretrained profile (or the reverse)."""
    out: list[AxisPoint] = []
    real = bool(p.pretrained.student)
    for i, t in enumerate(p.axes.teachers):
        key = f"axes.teachers[{i}]"
        if real:
            if t.size or t.checkpoint or t.arithmetic or not t.path:
                raise ConfigError(f"{key}: a pretrained profile's teacher is a checkpoint directory: give its path "
                                  f"(size, checkpoint and arithmetic are for kdlab's toy teachers)")
            tasks = [{**dataclasses.asdict(task), "teacher": t.path} for task in p.pretrained.tasks]
            out.append(AxisPoint("teachers", _path_label(t.path), {"pretrained": {"tasks": tasks}}))
            continue
        if t.path:
            raise ConfigError(f"{key}.path: {t.path!r}: a toy profile's teachers are built by kdlab (size, "
                              "checkpoint); a path is for a pretrained profile")
        size = t.size or p.teacher.size
        if size not in PRESETS:
            raise ConfigError(f"{key}.size: {t.size!r} is not a valid choice; choose from {sorted(PRESETS)}")
        for task in _distilled_tasks(p):
            steps = p.teacher_pretrain.task_steps.get(task, p.teacher_pretrain.steps)
            if t.checkpoint > steps:
                raise ConfigError(f"{key}.checkpoint: step {t.checkpoint} is past the teacher's training of {task} "
                                  f"({steps} steps, teacher_pretrain)")
        over: dict[str, Any] = {}
        if size != p.teacher.size:
            over["teacher"] = {"size": size}
        arith = _other(t.arithmetic, p.teacher_pretrain.arithmetic)
        pre = {**({"until": t.checkpoint} if t.checkpoint else {}), **({"arithmetic": arith} if arith else {})}
        if pre:
            over["teacher_pretrain"] = pre
        out.append(AxisPoint("teachers", _point_label(size if size != p.teacher.size else "",
                                                          f"step{t.checkpoint}" if t.checkpoint else "", arith), over))
    for i, st in enumerate(p.axes.students):
        key = f"axes.students[{i}]"
        if real:
            if st.size or st.arithmetic or st.steps or st.lr or not st.path:
                raise ConfigError(f"{key}: a pretrained profile's student is a checkpoint directory: give its path "
                                  "(size, arithmetic, steps and lr are for kdlab's toy students)")
            out.append(AxisPoint("students", _path_label(st.path), {"pretrained": {"student": st.path}}))
            continue
        if st.path:
            raise ConfigError(f"{key}.path: {st.path!r}: a toy profile's students are built by kdlab (size); "
                              "a path is for a pretrained profile")
        if st.size not in PRESETS:
            raise ConfigError(f"{key}.size: {st.size!r} is not a valid choice; choose from {sorted(PRESETS)}")
        over = {"student": {"size": st.size}} if st.size != p.student.size else {}
        sp = p.student_pretrain
        arith, steps, lr = _other(st.arithmetic, sp.arithmetic), _other(st.steps, sp.steps), _other(st.lr, sp.lr)
        pre = {**({"arithmetic": arith} if arith else {}), **({"steps": steps} if steps else {}),
               **({"lr": lr} if lr else {})}
        if pre:
            over["student_pretrain"] = pre
        label = _point_label(st.size if st.size != p.student.size else "", arith, f"steps{steps}" if steps else "",
                             f"lr{lr:g}" if lr else "")
        out.append(AxisPoint("students", label, over))
    seen: dict[str, int] = {}
    for point in out:
        same = (point.overrides == {"pretrained": {"student": p.pretrained.student}} or point.overrides ==
                {"pretrained": {"tasks": [dataclasses.asdict(t) for t in p.pretrained.tasks]}})
        if not point.overrides or same:
            raise ConfigError(f"axes.{point.axis}: a point equal to the profile's own {point.axis[:-1]} "
                              f"(the profile's study is the axis's first point)")
        if point.suffix in seen:
            raise ConfigError(f"axes.{point.axis}: {point.label!r} is listed twice")
        seen[point.suffix] = 1
    return out


def _path_label(path: str) -> str:
    """A checkpoint directory's name as a point label (plain characters only)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(path.rstrip("/")).name).strip("-.") or "checkpoint"


def _distilled_tasks(p: Profile) -> list[str]:
    return sorted(set(p.grid.tasks + (p.grid.lambda_tasks if p.grid.lambdas else [])))


def axis_profiles(p: Profile) -> list[tuple[AxisPoint, Profile]]:
    """Each axis point with its study's profile (``companion_profile`` with the point's overrides)."""
    out = []
    for point in axis_points(p):
        try:
            out.append((point, companion_profile(p, point.suffix, point.overrides)))
        except ConfigError as e:
            raise ConfigError(f"axes.{point.axis} ({point.label}): {e}") from None
    return out


def _check_written_axes(data: dict[str, Any]) -> None:
    """An axis the profile names must list a point (an empty list is a mistake, not "no axis")."""
    axes = data.get("axes")
    if isinstance(axes, dict):
        for name in AXES:
            if name in axes and isinstance(axes[name], list) and not axes[name]:
                raise ConfigError(f"axes.{name}: the list is empty; list at least one point, or leave the key out")


def read_profile_data(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of a profile file, with ``extends: OTHER.yaml`` resolved.

    ``extends`` names another profile file (relative to this file's folder); this file's keys are
    merged on top of it (mappings key by key, lists and values replace), recursively. The merged
    mapping is validated as a whole by ``load_profile``, so an unknown key in either file fails.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"parameter file {path} does not exist")
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.yaml"))
        raise ConfigError(f"parameter file {path} is a directory; give a profile file"
                          + (f" in it: {', '.join(inside[:8])}{', ...' if len(inside) > 8 else ''}" if inside else ""))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"parameter file {path} cannot be read ({e.strerror or e}); check its permissions") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"parameter file {path} is not UTF-8 text (byte {e.start}); give a YAML profile") from None
    try:
        data = read_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        raise ConfigError(f"{path}: the profile is empty (a study needs at least its name)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"{path}: extends: {parent!r} must be the path of another profile file")
    parent_path = (path.parent / parent).resolve()
    if parent_path in _seen or parent_path == path.resolve():
        raise ConfigError(f"{path}: extends: {parent!r} makes a cycle ({' -> '.join(str(p) for p in (*_seen, parent_path))})")
    try:
        base = read_profile_data(parent_path, (*_seen, path.resolve()))
    except ConfigError as e:
        raise ConfigError(f"{path}: extends: {parent!r}: {e}") from None
    return _deep_merge(base, data)


def load_profile(path: str | Path, overrides: dict[str, Any] | None = None) -> Profile:
    """Load and validate a profile YAML (``extends`` resolved, plus dotted-key ``overrides``)."""
    path = Path(path)
    data = read_profile_data(path)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, last = dotted.split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{path}: --set {dotted}: {'.'.join(parents[:i + 1])} is not a mapping "
                                  f"(it holds {node!r}); set it whole, e.g. --set {'.'.join(parents[:i + 1])}=[...]")
        node[last] = value
    try:
        _check_written_axes(data)
        return validate_profile(from_dict(Profile, data))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def dropped_values(p: Profile) -> list[str]:
    """What the study drops or collapses from the profile as written, one phrase each: a value a
    list names twice (its runs or evaluations happen once) and the ``eval.pass_ks`` above
    ``eval.pass_n`` (no pass@k is recorded for them). The profile stays valid; the study says it."""
    out = []
    for key, values in _lists(p):
        twice = list(dict.fromkeys(values[values.index(v)] for i, v in enumerate(values) if v in values[:i]))
        if twice:
            out.append(f"{key} lists {', '.join(repr(v) for v in twice)} more than once (done once)")
    above = [k for k in dict.fromkeys(p.eval.pass_ks) if k > p.eval.pass_n]
    if above:
        out.append(f"eval.pass_ks {above} {'is' if len(above) == 1 else 'are'} above eval.pass_n {p.eval.pass_n} "
                   f"(no {', '.join(f'pass@{k}' for k in above)} recorded)")
    return out


def _lists(obj: Any, path: str = "") -> list[tuple[str, list]]:
    """(dotted key, value) of every list of plain values in a profile (lists of mappings excluded)."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _lists(value, f"{path}{f.name}.")
        elif isinstance(value, list) and not any(dataclasses.is_dataclass(v) for v in value):
            out.append((path + f.name, value))
    return out


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)
