"""Checks shared by the tests, the chapters' check cells and the exercise graders.

`assert_close` is dtype-aware: the tolerance follows from the *lower* precision of the two
tensors, so a bf16 result is never held to an fp32 tolerance and an fp64 check is never loose.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = [
    "DEFAULT_TOLERANCES",
    "tolerance_for",
    "assert_close",
    "check_causal",
    "check_permutation_equivariance",
    "jacobian",
    "copy_from_torch_mha",
    "copy_from_torch_layer",
    "mc_variance",
]

# (atol, rtol) per dtype. fp64: round-off of O(1e-16) grows with reductions of length ~1e3;
# fp32: eps ~ 1.2e-7 times reduction lengths up to ~1e3 gives ~1e-5 relative;
# half types: eps(bf16) = 7.8e-3, eps(fp16) = 9.8e-4 for a single rounding of the output.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-2),
    torch.bfloat16: (1e-2, 2e-2),
}


def tolerance_for(*tensors: torch.Tensor) -> tuple[float, float]:
    """The (atol, rtol) of the least precise floating dtype among ``tensors``."""
    worst = (0.0, 0.0)
    for t in tensors:
        tol = DEFAULT_TOLERANCES.get(t.dtype, (0.0, 0.0))
        worst = max(worst, tol)
    return worst


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float | None = None,
                 rtol: float | None = None, name: str = "tensor") -> None:
    """Raise ``AssertionError`` unless ``actual`` matches ``expected``.

    Three checks, in order: same shape; no NaN/inf where ``expected`` is finite; then either
    every element is within ``atol`` (the absolute floor), or the relative RMS error
    ``||a - e||_2 / ||e||_2`` is at most ``rtol``. Defaults come from `tolerance_for`.
    The message gives the shapes, the max abs error, its index and the relative RMS error.
    """
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        raise AssertionError(f"{name}: expected tensors, got {type(actual).__name__} and {type(expected).__name__}")
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    d_atol, d_rtol = tolerance_for(actual, expected)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    bad = ~torch.isfinite(a) & torch.isfinite(e)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(f"{name}: {int(bad.sum())} non-finite values where expected is finite, first at {idx}")
    if a.numel() == 0:
        return
    finite = torch.isfinite(e)
    if not torch.equal(a[~finite], e[~finite]):
        raise AssertionError(f"{name}: non-finite entries of expected are not reproduced")
    diff = (a - e).abs().where(finite, torch.zeros_like(a))
    max_err = float(diff.max())
    if max_err <= atol:
        return
    rel_rms = float(diff.norm() / e.where(finite, torch.zeros_like(e)).norm().clamp_min(1e-300))
    if rel_rms <= rtol:
        return
    idx = tuple(int(i) for i in (diff == diff.max()).nonzero()[0])
    raise AssertionError(
        f"{name}: max abs error {max_err:.3e} at index {idx} (got {a[idx].item():.6g}, expected "
        f"{e[idx].item():.6g}) exceeds atol={atol:.1e}, and relative RMS error {rel_rms:.3e} exceeds "
        f"rtol={rtol:.1e}; shape {tuple(a.shape)}, dtypes {actual.dtype}/{expected.dtype}"
    )


def check_causal(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *, position: int | None = None,
                 dim: int = -2, atol: float = 0.0) -> float:
    """Perturb ``x`` at ``position`` and later along ``dim``; outputs before ``position`` must not change.

    Returns the largest change seen before ``position`` (0.0 for an exactly causal ``fn``) and
    raises ``AssertionError`` if it exceeds ``atol``. ``fn`` maps ``x`` to an output with the same
    sequence axis.
    """
    length = x.shape[dim]
    position = length // 2 if position is None else position
    if not 0 < position < length:
        raise ValueError(f"position must be in (0, {length}), got {position}")
    with torch.no_grad():
        before = fn(x)
        noise = torch.randn_like(x) if x.is_floating_point() else torch.randint_like(x, 0, int(x.max()) + 1)
        keep = torch.arange(length, device=x.device) < position
        shape = [1] * x.dim()
        shape[dim] = length
        perturbed = torch.where(keep.view(shape), x, noise)
        after = fn(perturbed)
    change = (after.narrow(dim, 0, position) - before.narrow(dim, 0, position)).abs().max().item()
    if change > atol:
        raise AssertionError(f"not causal: changing positions >= {position} moved earlier outputs by {change:.3e}")
    return change


def check_permutation_equivariance(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *,
                                   dim: int = -2, generator: torch.Generator | None = None) -> float:
    """Return max |fn(P x) - P fn(x)| for a random permutation P of ``dim`` (≈0 for an equivariant ``fn``)."""
    perm = torch.randperm(x.shape[dim], generator=generator).to(x.device)
    with torch.no_grad():
        lhs = fn(x.index_select(dim, perm))
        rhs = fn(x).index_select(dim, perm)
    return (lhs - rhs).abs().max().item()


def jacobian(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Full Jacobian of ``fn`` at ``x``, reshaped to ``(fn(x).numel(), x.numel())``."""
    jac = torch.autograd.functional.jacobian(fn, x)
    return jac.reshape(-1, x.numel())


# ----------------------------------------------------------------------------- weights from torch.nn
@torch.no_grad()
def copy_from_torch_mha(ours, theirs: torch.nn.MultiheadAttention) -> None:
    """Copy an ``nn.MultiheadAttention`` (packed in_proj, batch_first) into a `MultiHeadAttention`."""
    d = theirs.embed_dim
    if ours.d_model != d or ours.n_heads != theirs.num_heads or ours.n_kv_heads != ours.n_heads:
        raise ValueError("copy_from_torch_mha needs the same d_model and n_heads, and no GQA")
    for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
        proj.weight.copy_(theirs.in_proj_weight[i * d:(i + 1) * d])
        if proj.bias is not None:
            proj.bias.copy_(theirs.in_proj_bias[i * d:(i + 1) * d])
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if ours.out_proj.bias is not None:
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def copy_from_torch_layer(ours, theirs) -> None:
    """Copy an ``nn.TransformerEncoderLayer``/``nn.TransformerDecoderLayer`` into our `EncoderLayer`/`DecoderLayer`."""
    copy_from_torch_mha(ours.self_attn, theirs.self_attn)
    if hasattr(theirs, "multihead_attn"):
        copy_from_torch_mha(ours.cross_attn, theirs.multihead_attn)
    ours.ff.linear1.load_state_dict(theirs.linear1.state_dict())
    ours.ff.linear2.load_state_dict(theirs.linear2.state_dict())
    for name in ("norm1", "norm2", "norm3"):
        if hasattr(theirs, name):
            getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())


# ----------------------------------------------------------------------------- Monte-Carlo helpers (M3.1)
def mc_variance(d_k: int, n_samples: int = 20000, *, mean: float = 0.0, std: float = 1.0, scale: float = 1.0,
                generator: torch.Generator | None = None) -> float:
    """Empirical variance of ``scale * (q . k)`` for ``q, k`` with i.i.d. ``N(mean, std^2)`` components.

    The exact value is ``scale^2 * d_k * (std^4 + 2 std^2 mean^2)``: ``d_k`` for standard normals,
    1 after scaling by ``1/sqrt(d_k)``. Sampled in fp64 from ``generator`` (CPU).
    """
    if isinstance(d_k, bool) or not isinstance(d_k, int) or d_k <= 0:
        raise ValueError(f"d_k must be a positive int, got {d_k!r}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 2:
        raise ValueError(f"n_samples must be an int >= 2, got {n_samples!r}")
    q = mean + std * torch.randn(n_samples, d_k, dtype=torch.float64, generator=generator)
    k = mean + std * torch.randn(n_samples, d_k, dtype=torch.float64, generator=generator)
    return float((scale * (q * k).sum(dim=-1)).var())
