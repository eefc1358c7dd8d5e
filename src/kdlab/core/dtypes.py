"""The parameter dtypes of every kdlab loop, by name (``kdlab.core.schema.DTYPES``) and back."""
from __future__ import annotations

import torch

from .schema import DTYPES as DTYPE_CHOICES

DTYPES = {name: {"bf16": torch.bfloat16, "fp32": torch.float32}[name] for name in DTYPE_CHOICES}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
