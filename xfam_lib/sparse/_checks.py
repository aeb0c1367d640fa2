"""Argument checks shared by the sparse-attention modules."""
from __future__ import annotations

import numbers

import torch



def _check_nonneg_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int, got {value!r} of type {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return int(value)


def _offsets(length: int, device) -> torch.Tensor:
    """``(L, L)`` integer matrix of ``i - j`` (query minus key position)."""
    pos = torch.arange(length, device=device)
    return pos[:, None] - pos[None, :]


def _check_part(part: str, allowed: tuple[str, ...]) -> str:
    if part not in allowed:
        raise ValueError(f"part must be one of {allowed}, got {part!r}")
    return part
