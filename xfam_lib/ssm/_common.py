"""Checks and dtype rules shared by the state space modules (`lti`, `selective`, `ssd`)."""
from __future__ import annotations

import torch

from ..utils import check_tensor


def _check_numeric(name: str, x, *, min_rank: int = 0) -> None:
    """A floating or complex tensor of at least ``min_rank`` dims, else raise naming ``name``."""
    check_tensor(name, x, min_rank=min_rank)
    if not (x.is_floating_point() or x.is_complex()):
        raise TypeError(f"{name} must be a floating-point or complex tensor, got dtype {x.dtype}")


def _work_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The promoted dtype of ``dtypes``, raised to at least fp32 (halves are computed in fp32)."""
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return torch.promote_types(out, torch.float32)


def _out_dtype(*dtypes: torch.dtype) -> torch.dtype:
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def _is_diagonal(fn: str, A: torch.Tensor, B: torch.Tensor) -> bool:
    """True for a diagonal ``A (..., N)``, False for a dense ``A (..., N, N)`` (rank relative to ``B``)."""
    n = B.shape[-1]
    if A.dim() == B.dim():
        if A.shape[-1] != n:
            raise ValueError(f"{fn}: diagonal A (..., N) and B (..., N) must share N, got A {tuple(A.shape)} "
                             f"and B {tuple(B.shape)}")
        return True
    if A.dim() == B.dim() + 1:
        if A.shape[-2:] != (n, n):
            raise ValueError(f"{fn}: dense A must be (..., N, N) with N = B.shape[-1] = {n}, got A "
                             f"{tuple(A.shape)} and B {tuple(B.shape)}")
        return False
    raise ValueError(f"{fn}: A must be diagonal (..., N) with A.dim() == B.dim(), or dense (..., N, N) with "
                     f"A.dim() == B.dim() + 1; got A {tuple(A.shape)} and B {tuple(B.shape)}")


def _broadcast_batch(fn: str, **shapes: torch.Size) -> torch.Size:
    try:
        return torch.broadcast_shapes(*shapes.values())
    except RuntimeError:
        seen = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
        raise ValueError(f"{fn}: batch dims do not broadcast: {seen}") from None


def _phi1(x: torch.Tensor) -> torch.Tensor:
    """``(exp(x) - 1) / x`` elementwise (real or complex), with the limit 1 at ``x = 0``.

    For ``|x| < 0.1`` the Taylor series through ``x^10 / 11!`` (truncation < 1e-20), which also keeps
    the gradient accurate where ``expm1(x) / x`` would cancel; elsewhere ``expm1(x) / x``. The double
    ``where`` keeps both branches' gradients finite.
    """
    small = x.abs() < 0.1
    x_big = torch.where(small, torch.ones_like(x), x)
    x_small = torch.where(small, x, torch.zeros_like(x))
    series = torch.ones_like(x)
    for k in range(10, 0, -1):                                      # Horner: sum_k x^k / (k+1)!
        series = 1 + x_small * series / (k + 1)
    return torch.where(small, series, torch.expm1(x_big) / x_big)


def _check_sequence(name: str, x: torch.Tensor, d_model: int) -> None:
    check_tensor(name, x, floating=True)
    if x.dim() != 3 or x.shape[-1] != d_model or x.shape[1] == 0:
        raise ValueError(f"{name} must be (batch, L, d_model) with d_model = {d_model} and L >= 1, "
                         f"got {tuple(x.shape)}")
