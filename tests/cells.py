"""A grid cell for tests that build a ``RunConfig`` by hand: a cell is always named whole (task,
policy, kl, lr, seed have no defaults), so tests start from this one and override what they vary."""
from __future__ import annotations

from kdlab.engine.run_config import RunConfig

CELL = dict(task="countdown-3", policy="off", kl="forward", lr=1e-4, seed=0)


def cell(**kw) -> RunConfig:
    """``RunConfig`` of ``CELL`` with ``kw`` on top (``lam`` only counts for policy 'lambda')."""
    kw = {**CELL, **kw}
    if kw["policy"] != "lambda":
        kw.pop("lam", None)
    return RunConfig(**kw)
