"""A distillation run's settings (``DistillSettings``), the whole configuration of one run
(``RunConfig``: a grid cell plus those settings), its result (``RunResult``), and GRPO's
settings (``GRPOSettings``) and run configuration (``RLVRConfig``). No torch: the profile's
schema (``kdlab.study.config``) is built from these classes.

Each setting's default and rule are declared here, once (``kdlab.core.fields.setting``): the
profile's ``distill`` section *is* ``DistillSettings`` (``kdlab.study.config``), and a
``RunConfig`` is built from a profile by ``kdlab.study.contract.run_config`` without copying a
field by hand. A value set in code meets the same rule as one read from a profile.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.fields import LEARNING_RATE, ConfigError, check_fields, setting
from ..core.schema import DTYPES, LOSS_KINDS

POLICIES = ("off", "on", "lambda")  # a run's rollout policy: "lambda" takes lam as given
LAMBDA = dict(lo=-3.0, hi=3.0)  # the rule of a lambda-spectrum point
HIDDEN_KLS = ("forward", "reverse")  # the kinds kdlab.core.head_kl computes from the teacher's hidden states
NORMALISATIONS = ("sequence", "token")  # GRPO's loss normalisation (kdlab.engine.rlvr.grpo_loss)
KL_REFERENCES = ("start", "teacher")  # what GRPO's KL penalty pulls towards (kdlab.engine.rlvr.grpo_train)


def _compute_dtype():
    """The ``compute_dtype`` setting of a training loop (distillation, GRPO): one default, one rule."""
    return setting("auto", choices=("auto",) + DTYPES, doc="arithmetic of the student's rollouts, forward and "
                   "backward; the parameters, their updates and the optimizer stay in dtype. auto: fp32 on a CPU "
                   "(bf16 matmuls without AMX are slower there; 35x on an avx2-only CPU), dtype elsewhere")


@dataclass
class DistillSettings:
    """Distillation settings shared by every run of a study (the profile's ``distill`` section).
    The paper's training details and where kdlab's defaults differ from them:
    docs/calibration.md section 15; params/paper*.yaml set the paper's values."""
    steps: int = setting(150, lo=1, bound="steps")
    batch_size: int = setting(32, lo=1, bound="batch", doc="prompts per optimisation step (one rollout each; the paper: 32)")
    temperature: float = setting(1.0, lo=1e-3, hi=10.0, doc="rollout sampling temperature of a model whose own "
                                 "temperature (teacher_temperature / student_temperature) is null")
    teacher_temperature: float | None = setting(None, lo=1e-3, hi=10.0, doc="the teacher's temperature in sampling "
                                                "(OffPD, pi_lambda) AND in the loss; null = temperature when sampling, 1 "
                                                "in the loss (the paper's appendix as read: 0.5)")
    student_temperature: float | None = setting(None, lo=1e-3, hi=10.0, doc="the student's temperature in sampling "
                                                "(OnPD, pi_lambda) AND in the loss; null = temperature when sampling, 1 "
                                                "in the loss (the paper: 1.0)")
    fused_adamw: bool = setting(False, doc="torch.optim.AdamW(fused=True) where the device supports it, else the "
                                "default implementation (recorded per run as 'optimizer'); the paper: fused")
    grad_clip: float | None = setting(1.0, lo=0.0, doc="max grad norm; null disables clipping")
    dtype: str = setting("bf16", choices=DTYPES, doc="parameter dtype; bf16 keeps no fp32 master copy")
    compute_dtype: str = _compute_dtype()
    jsd_beta: float = setting(0.5, lo=0.0, hi=1.0)
    sampled_direction: str = setting("reverse", choices=("forward", "reverse"),
                                     doc="the KL a sampled estimator (k1/k2/k3/sf) targets")
    logratio_clip: float | None = setting(5.0, lo=0.0)
    plausibility_alpha: float | None = setting(0.1, lo=0.0, hi=1.0)
    offpd_pool: int = setting(2048, lo=1, bound="problems", doc="teacher rollouts sampled once and reused (OffPD)")
    warmup: int = setting(0, lo=0, bound="steps", doc="learning-rate schedule: linear warm-up over this many steps, "
                          "then constant (the paper: 10)")
    weight_decay: float = setting(0.0, lo=0.0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(kw_only=True)
class RunConfig(DistillSettings):
    """Everything that defines one distillation run: a grid cell (task, policy, lam, kl, lr, seed;
    no defaults: a cell is always named whole) plus the study's ``DistillSettings`` and the
    memory settings of its machine."""

    task: str = setting(doc="target task")
    policy: str = setting(choices=POLICIES, doc='"off" (lam=-1), "on" (lam=+1) or "lambda" (lam as given)')
    kl: str = setting(choices=LOSS_KINDS)
    lr: float = setting(**LEARNING_RATE)
    seed: int = setting(lo=0)
    lam: float | None = setting(None, **LAMBDA, doc="the lambda of policy 'lambda'; set from the policy otherwise")
    data_seed: int = setting(0, lo=0, doc="problem pools and the OffPD pool (the profile's data_seed)")
    micro_batch_size: int = setting(0, lo=0, bound="batch", doc="rows per forward/backward (gradient accumulation); "
                                    "0 = the whole batch")
    kl_chunk_size: int = setting(0, lo=0, doc="full-vocabulary KL over this many positions at a time (memory); 0 = at once")
    teacher_hidden: bool = setting(False, doc="keep and move the teacher's last hidden states (B, T, d) instead of its "
                                   "logits (B, T, V), and compute the full-vocabulary KL from them and the teacher's head "
                                   "chunk by chunk (kdlab.core.head_kl; the OffPD cache holds hidden states); forward / "
                                   "reverse KL only; values equal to the logits' up to float rounding")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.policy in ("off", "on"):
            lam = -1.0 if self.policy == "off" else 1.0
            if self.lam is not None and self.lam != lam:
                raise ConfigError(f"lam: {self.lam!r} with policy {self.policy!r}, which is lambda {lam:+g}; "
                                  "a point of the spectrum takes policy 'lambda'")
            self.lam = lam
        elif self.lam is None:
            raise ConfigError("lam: policy 'lambda' needs lam, a point of the spectrum in [-3, 3]")
        if self.teacher_hidden and self.kl not in HIDDEN_KLS:
            raise ConfigError(f"teacher_hidden: the KL from the teacher's hidden states is the full-vocabulary "
                              f"{' / '.join(HIDDEN_KLS)} KL; kl {self.kl!r} needs the teacher's logits")

    def sample_temperatures(self) -> tuple[float, float]:
        """(student, teacher) temperatures of rollout sampling: each model's own, else ``temperature``."""
        return (self.temperature if self.student_temperature is None else self.student_temperature,
                self.temperature if self.teacher_temperature is None else self.teacher_temperature)

    def loss_temperatures(self) -> tuple[float, float]:
        """(student, teacher) temperatures in the loss: each model's own, else 1 (kdlab's default)."""
        return (1.0 if self.student_temperature is None else self.student_temperature,
                1.0 if self.teacher_temperature is None else self.teacher_temperature)

    @property
    def run_id(self) -> str:
        pol = self.policy if self.policy != "lambda" else f"lam{self.lam:+g}"
        return f"{self.task}_{pol}_{self.kl}_lr{self.lr:g}_s{self.seed}"


@dataclass
class GRPOSettings:
    """GRPO settings a study shares (the profile's ``rlvr`` section extends this class, so each has
    one default and one rule, declared here).

    steps: optimisation rounds (each samples a fresh batch); prompts_per_step (P) problems per
    round with group_size (G) sampled responses each; lr: AdamW rate; clip_eps: PPO clip range;
    kl_coef: weight of the k3 penalty (0: no reference model is kept); kl_reference: the model the
    penalty is to, "start" (a frozen copy of the starting model, the usual GRPO penalty) or
    "teacher" (the task's teacher: a KL-to-teacher term on the student's own samples, the
    on-policy-distillation-plus-reward objective);
    temperature: sampling temperature (log-probs are taken at the same temperature);
    inner_epochs: optimiser steps per sampled batch (full batch each; >1 makes the ratio and
    clipping matter); dtype: parameter dtype, bf16 with no fp32 master copy as in
    ``kdlab.engine.distill``; compute_dtype: the arithmetic of sampling, forward and backward (as
    in distillation: fp32 on a CPU by default); grad_clip: max grad norm (None: off); collapse_window /
    collapse_drop: ``detect_collapse``.
    """

    steps: int = setting(300, lo=1, bound="steps")
    prompts_per_step: int = setting(16, lo=1, bound="batch")
    group_size: int = setting(8, lo=2, bound="samples")
    lr: float = setting(1e-5, **LEARNING_RATE)
    clip_eps: float = setting(0.2, lo=1e-3, hi=1.0)
    kl_coef: float = setting(0.0, lo=0.0)
    kl_reference: str = setting(KL_REFERENCES[0], choices=KL_REFERENCES)
    temperature: float = setting(1.0, lo=1e-3, hi=10.0)
    inner_epochs: int = setting(1, lo=1, bound="steps")
    dtype: str = setting("bf16", choices=DTYPES)
    compute_dtype: str = _compute_dtype()
    grad_clip: float | None = setting(1.0, lo=0.0)
    collapse_window: int = setting(20, lo=1, bound="steps")
    collapse_drop: float = setting(0.2, lo=0.0, hi=1.0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(kw_only=True)
class RLVRConfig(GRPOSettings):
    """One GRPO run: the shared ``GRPOSettings`` plus its seed (problems, sampling and torch),
    max_new_tokens (the response budget in tokens; None: the task's), and the loss's conventions
    normalise_std / normalisation (see ``group_advantages`` / ``grpo_loss``) and weight_decay."""

    seed: int = setting(0, lo=0)
    max_new_tokens: int | None = setting(None, lo=1, bound="tokens")
    normalise_std: bool = setting(True)
    normalisation: str = setting("sequence", choices=NORMALISATIONS)
    weight_decay: float = setting(0.0, lo=0.0)


@dataclass
class RunResult:
    history: list[dict[str, Any]]
    collapsed: bool
    collapse_step: int | None
    wall_s: float
    phase_s: dict[str, float] = field(default_factory=dict)
    optimizer: str = "adamw"  # the AdamW implementation used: "adamw" or "adamw-fused"
