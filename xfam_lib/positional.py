"""Positional encodings: sinusoidal tables and rotary position embeddings (RoPE).

Conventions: ``PE[p, 2i] = sin(p * theta_i)``, ``PE[p, 2i+1] = cos(p * theta_i)`` with
``theta_i = base^(-2i/d)``. RoPE rotates queries and keys (never values); the default layout
pairs dims ``(i, i + d/2)`` ("rotate_half"), ``interleaved=True`` pairs ``(2i, 2i+1)``.
"""
from __future__ import annotations

import torch
from torch import nn

from .utils import check_positive_int, check_tensor

__all__ = ["sinusoidal_encoding", "rope_frequencies", "apply_rope", "RotaryEmbedding"]


def sinusoidal_encoding(length: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """Sinusoidal table ``(length, d_model)``: ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(...)``."""
    length = check_positive_int("length", length)
    d_model = check_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even for sin/cos pairs, got {d_model}")
    if base <= 0:
        raise ValueError(f"base must be positive, got {base}")
    angles = torch.arange(length, dtype=torch.float64)[:, None] * rope_frequencies(d_model, base, dtype=torch.float64)
    pe = torch.empty(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.float()


def rope_frequencies(d: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """The ``d/2`` frequencies ``theta_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``."""
    return base ** (-torch.arange(0, d, 2, dtype=dtype, device=device) / d)


_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _cos_sin(n_positions: int, d: int, base: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin tables ``(n, d/2)`` for positions ``0 .. n-1``, cached per (d, base, device) and grown on demand."""
    key = (d, float(base), str(device))
    cached = _TABLES.get(key)
    if cached is None or cached[0].shape[0] < n_positions:
        n = max(n_positions, 2 * cached[0].shape[0] if cached is not None else 0)
        angles = torch.arange(n, dtype=torch.float32, device=device)[:, None] * rope_frequencies(d, base, device=device)
        cached = (torch.cos(angles), torch.sin(angles))
        _TABLES[key] = cached
    return cached


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, *, base: float = 10000.0,
               interleaved: bool = False) -> torch.Tensor:
    """Rotate ``x (..., L, d)`` by RoPE at ``positions`` (1-D integer tensor of length L, default ``arange(L)``).

    Pair ``i`` is rotated by the angle ``positions * base^(-2i/d)``; the pairs are ``(i, i + d/2)``
    (default) or ``(2i, 2i+1)`` (``interleaved=True``). Angles are computed in fp32; the result
    has the dtype of ``x``.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    length, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope needs an even feature size d, got x of shape {tuple(x.shape)}")
    if positions is None:
        positions = torch.arange(length, device=x.device)
    check_tensor("positions", positions, rank=1)
    if positions.is_floating_point() or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    if positions.numel() != length:
        raise ValueError(f"positions must have length L={length} (dim -2 of x), got {positions.numel()}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError("positions must be non-negative")
    n_needed = int(positions.max()) + 1 if positions.numel() else 1
    cos, sin = _cos_sin(n_needed, d, base, x.device)
    cos, sin = cos[positions], sin[positions]                                    # (L, d/2)
    xf = x.float()
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """`apply_rope` as a module with fixed ``base`` and layout, for `attention.MultiHeadAttention(rope=...)`."""

    def __init__(self, base: float = 10000.0, *, interleaved: bool = False):
        super().__init__()
        self.base, self.interleaved = base, interleaved

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, positions, base=self.base, interleaved=self.interleaved)
