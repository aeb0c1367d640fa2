"""Argument checks shared by the sparse-attention modules."""
from __future__ import annotations

import torch


def _offsets(length: int, device) -> torch.Tensor:
    """``(L, L)`` integer matrix of ``i - j`` (query minus key position)."""
    pos = torch.arange(length, device=device)
    return pos[:, None] - pos[None, :]


def _check_part(part: str, allowed: tuple[str, ...]) -> str:
    if part not in allowed:
        raise ValueError(f"part must be one of {allowed}, got {part!r}")
    return part
