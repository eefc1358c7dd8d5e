"""A distillation run's configuration (``RunConfig``) and its result (``RunResult``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


from ..core.schema import LOSS_KINDS
from ..core.dtypes import DTYPES


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
