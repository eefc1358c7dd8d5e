"""Helpers for ``torch.distributed``: this rank, the world size, sums over ranks."""
from __future__ import annotations


import torch



def _world() -> tuple[int, int]:
    """(rank, world size) under ``torch.distributed``; (0, 1) in one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _sum_over_ranks(values: list[float], device: torch.device) -> list[float]:
    """Elementwise sum over all processes (the values themselves in one process)."""
    import torch.distributed as dist

    rank, world = _world()
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
