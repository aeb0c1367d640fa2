"""Checks shared by the tests, the chapters' check cells and the exercise graders.

`assert_close` is element-wise and dtype-aware: every element must satisfy
``|actual - expected| <= atol + rtol * |expected|`` (the rule of ``torch.testing.assert_close``),
with a tolerance that follows from the *lower* precision of the two tensors, so a bf16 result is
never held to an fp32 tolerance and an fp64 check is never loose.
"""
from __future__ import annotations

from typing import Callable

import torch

from .utils import check_bool, check_instance, check_int, check_positive_int, check_real, check_tensor

__all__ = [
    "DEFAULT_TOLERANCES",
    "tolerance_for",
    "assert_close",
    "assert_close_terms",
    "check_causal",
    "check_permutation_equivariance",
    "jacobian",
    "copy_from_torch_mha",
    "copy_from_torch_layer",
    "mc_variance",
    "randn",
    "grads",
    "SPREAD_WIDENING",
    "seed_spread_bounds",
    "assert_within_seed_spread",
]

# (atol, rtol) per dtype; an element passes when |actual - expected| <= atol + rtol * |expected|.
# The unit roundoff u (the largest relative error of one rounding) is 1.1e-16 in fp64, 6.0e-8 in
# fp32, 4.9e-4 in fp16 and 3.9e-3 in bf16. A value computed from rounded inputs through a reduction
# of length n has a relative error of a few u typically and n*u at worst. Hence:
# * fp64: rtol 1e-8 is far above n*u for any length the book uses, and far below any real error;
#   atol 1e-10 absorbs cancellation noise in entries that should be (close to) zero.
# * fp32: rtol 1e-5 is n*u for reductions up to ~170 terms and a few hundred u beyond (attention
#   over ~1e3 keys stays near sqrt(n)*u); atol 1e-5 is the same scale for O(1) values cancelling to 0.
# * fp16 / bf16: the inputs and the result are each rounded to the half type (relative u each), and
#   the fp32 accumulation adds nothing comparable: a few u in all. rtol 1e-2 (fp16, 20u) and 2e-2
#   (bf16, 5u); atol is one rounding of an O(1) value: 1e-3 (fp16, 2u) and 1e-2 (bf16, 2.5u).
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-2),
    torch.bfloat16: (1e-2, 2e-2),
    torch.complex128: (1e-10, 1e-8),      # complex: the tolerance of its parts' dtype, on the modulus |a - e|
    torch.complex64: (1e-5, 1e-5),
}


def tolerance_for(*tensors: torch.Tensor) -> tuple[float, float]:
    """The (atol, rtol) of the least precise floating dtype among ``tensors`` ((0, 0) for integers: exact)."""
    worst = (0.0, 0.0)
    for t in tensors:
        check_tensor("tensors", t)
        tol = DEFAULT_TOLERANCES.get(t.dtype, (0.0, 0.0))
        worst = max(worst, tol)
    return worst


def _first(where: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in where.nonzero()[0])


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float | None = None,
                 rtol: float | None = None, name: str = "tensor") -> None:
    """Raise ``AssertionError`` unless ``actual`` matches ``expected`` element by element
    (complex tensors: by the modulus of the difference, never by their real parts alone).

    Checks, in order: both are tensors of the same shape (dtypes may differ); non-finite values
    agree position by position (NaN where ``expected`` is NaN, ``+inf``/``-inf`` with the same
    sign where ``expected`` is infinite, and nothing non-finite where ``expected`` is finite);
    then every finite element satisfies ``|a - e| <= atol + rtol * |e|``, the rule of
    ``torch.testing.assert_close`` (with NaN positions required to match, as its ``equal_nan=True``).
    Defaults come from `tolerance_for`. The message names the failing check, how many elements
    fail, the worst one (index, got, expected), the max abs error and the relative RMS error
    ``||a - e||_2 / ||e||_2`` (left out where every expected value is within 10 atol of 0).
    """
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        raise AssertionError(f"{name}: expected tensors, got {type(actual).__name__} and {type(expected).__name__}")
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    d_atol, d_rtol = tolerance_for(actual, expected)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    if not (atol >= 0 and rtol >= 0):
        raise ValueError(f"atol and rtol must be >= 0, got atol={atol}, rtol={rtol}")
    work = torch.complex128 if actual.is_complex() or expected.is_complex() else torch.float64
    a = actual.detach().to("cpu", work)
    e = expected.detach().to("cpu", work)
    where = f"shape {tuple(a.shape)}, dtypes {actual.dtype}/{expected.dtype}"

    finite = torch.isfinite(e)
    checks = (
        (torch.isnan(a) & finite, "NaN where expected is finite"),
        (torch.isinf(a) & finite, "inf where expected is finite"),
        (torch.isnan(e) & ~torch.isnan(a), "a number where expected is NaN"),
        (torch.isinf(e) & (a != e), "not the expected inf (position or sign differs)"),
    )
    for bad, what in checks:
        if bad.any():
            idx = _first(bad)
            raise AssertionError(f"{name}: {int(bad.sum())} of {a.numel()} elements are {what}; first at index "
                                 f"{idx}: got {a[idx].item():.6g}, expected {e[idx].item():.6g}; {where}")
    if a.numel() == 0:
        return
    diff = (a - e).abs()
    diff = diff.where(finite, torch.zeros_like(diff))
    allowed = atol + rtol * e.abs().where(finite, torch.zeros_like(diff))
    bad = diff > allowed
    if not bad.any():
        return
    excess = (diff - allowed).where(bad, torch.full_like(diff, -1.0))
    idx = _first(excess == excess.max())
    e_finite = e.where(finite, torch.zeros_like(e))
    if float(e_finite.abs().max()) > 10 * atol:
        relative = f"relative RMS error {float(diff.norm() / e_finite.norm()):.3e}"
    else:                                   # the norm of near-zero values would make any ratio huge
        relative = "no relative error (the expected values are all near 0)"
    raise AssertionError(
        f"{name}: {int(bad.sum())} of {a.numel()} elements differ by more than atol + rtol*|expected| "
        f"(atol={atol:.1e}, rtol={rtol:.1e}); worst at index {idx}: got {a[idx].item():.6g}, expected "
        f"{e[idx].item():.6g} (error {diff[idx].item():.3e}, allowed {allowed[idx].item():.3e}); "
        f"max abs error {float(diff.max()):.3e}, {relative}; {where}"
    )


def assert_close_terms(actual: torch.Tensor, expected: torch.Tensor, sizes: torch.Tensor, *,
                       dtype: torch.dtype | None = None, name: str = "tensor") -> None:
    """Like `assert_close`, but relative to ``|expected| + sizes``: a sum of products whose operands
    were rounded to ``dtype`` (default ``actual.dtype``; fp16/bf16 tiles on tensor cores) is accurate
    to a few units of the dtype times the sum of its terms' sizes (the classic bound for a dot
    product), which may far exceed the sum itself. ``sizes``: the same sums over absolute values,
    shaped like ``expected``."""
    atol, rtol = tolerance_for(torch.empty(0, dtype=dtype or actual.dtype))
    error = (actual.detach().cpu().double() - expected.detach().cpu().double()).abs()
    allowed = atol + rtol * (expected.detach().cpu().double().abs() + sizes.detach().cpu().double())
    if not (torch.isfinite(actual).all() and (error <= allowed).all()):
        raise AssertionError(f"{name}: worst error/allowed {(error / allowed).max():.3g}, max error "
                             f"{error.max():.3g} (tolerance relative to |expected| + the terms' sizes)")


def check_causal(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *, position: int | None = None,
                 dim: int = -2, atol: float = 0.0) -> float:
    """Perturb ``x`` at ``position`` and later along ``dim``; outputs before ``position`` must not change.

    Returns the largest change seen before ``position`` (0.0 for an exactly causal ``fn``) and
    raises ``AssertionError`` if it exceeds ``atol``. ``fn`` maps ``x`` to an output with the same
    sequence axis.
    """
    _check_fn_x(fn, x, dim)
    atol = check_real("atol", atol, low=0.0)
    length = x.shape[dim]
    if length < 2:
        raise ValueError(f"x needs at least 2 positions along dim={dim} to test causality, got shape {tuple(x.shape)}")
    position = length // 2 if position is None else check_int("position", position)
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


def _check_fn_x(fn, x, dim) -> None:
    """``fn`` a callable, ``x`` a tensor with an axis ``dim``."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable, got {type(fn).__name__}")
    check_tensor("x", x, min_rank=1)
    dim = check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is not an axis of x of shape {tuple(x.shape)}")


def check_permutation_equivariance(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, *,
                                   dim: int = -2, generator: torch.Generator | None = None) -> float:
    """Return max |fn(P x) - P fn(x)| for a random permutation P of ``dim`` (≈0 for an equivariant ``fn``)."""
    _check_fn_x(fn, x, dim)
    perm = torch.randperm(x.shape[dim], generator=generator).to(x.device)
    with torch.no_grad():
        lhs = fn(x.index_select(dim, perm))
        rhs = fn(x).index_select(dim, perm)
    return (lhs - rhs).abs().max().item()


def jacobian(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Full Jacobian of ``fn`` at ``x``, reshaped to ``(fn(x).numel(), x.numel())``."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable, got {type(fn).__name__}")
    check_tensor("x", x, floating=True)
    jac = torch.autograd.functional.jacobian(fn, x)
    return jac.reshape(-1, x.numel())


# ----------------------------------------------------------------------------- weights from torch.nn
@torch.no_grad()
def copy_from_torch_mha(ours, theirs: torch.nn.MultiheadAttention) -> None:
    """Copy an ``nn.MultiheadAttention`` (packed in_proj, batch_first) into a `MultiHeadAttention`."""
    from .attention import MultiHeadAttention
    check_instance("ours", ours, MultiHeadAttention)
    check_instance("theirs", theirs, torch.nn.MultiheadAttention)
    d = theirs.embed_dim
    if ours.d_model != d or ours.n_heads != theirs.num_heads or ours.n_kv_heads != ours.n_heads:
        raise ValueError(f"ours and theirs need the same d_model and n_heads, and no GQA: ours d_model={ours.d_model}, "
                         f"n_heads={ours.n_heads}, n_kv_heads={ours.n_kv_heads}; theirs embed_dim={d}, "
                         f"num_heads={theirs.num_heads}")
    for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
        proj.weight.copy_(theirs.in_proj_weight[i * d:(i + 1) * d])
        if proj.bias is not None:
            proj.bias.copy_(theirs.in_proj_bias[i * d:(i + 1) * d])
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if ours.out_proj.bias is not None:
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


@torch.no_grad()
def copy_from_torch_layer(ours, theirs) -> None:
    """Copy an ``nn.TransformerEncoderLayer``/``nn.TransformerDecoderLayer`` into a layer with the
    attributes of our `EncoderLayer`/`DecoderLayer` (``self_attn``, ``ff``, ``norm1``...; a decoder also
    ``cross_attn``): the library's layers, or a student's own with the same layout."""
    check_instance("theirs", theirs, (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer))
    decoder = isinstance(theirs, torch.nn.TransformerDecoderLayer)
    needed = ("self_attn", "ff", "norm1", "norm2") + (("cross_attn", "norm3") if decoder else ())
    missing = [name for name in needed if not hasattr(ours, name)]
    if not isinstance(ours, torch.nn.Module) or missing:
        raise TypeError(f"ours must be a {'decoder' if decoder else 'encoder'} layer with attributes "
                        f"{', '.join(needed)} (as EncoderLayer/DecoderLayer have), got {type(ours).__name__}"
                        + (f" without {', '.join(missing)}" if missing else ""))
    copy_from_torch_mha(ours.self_attn, theirs.self_attn)
    if hasattr(theirs, "multihead_attn"):
        copy_from_torch_mha(ours.cross_attn, theirs.multihead_attn)
    ours.ff.linear1.load_state_dict(theirs.linear1.state_dict())
    ours.ff.linear2.load_state_dict(theirs.linear2.state_dict())
    for name in ("norm1", "norm2", "norm3"):
        if hasattr(theirs, name):
            getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())


# ----------------------------------------------------------------------------- Monte-Carlo helpers
def mc_variance(d_k: int, n_samples: int = 20000, *, mean: float = 0.0, std: float = 1.0, scale: float = 1.0,
                generator: torch.Generator | None = None) -> float:
    """Empirical variance of ``scale * (q . k)`` for ``q, k`` with i.i.d. ``N(mean, std^2)`` components.

    The exact value is ``scale^2 * d_k * (std^4 + 2 std^2 mean^2)``: ``d_k`` for standard normals,
    1 after scaling by ``1/sqrt(d_k)``. Sampled in fp64 from ``generator`` (CPU).
    """
    d_k, n_samples = check_positive_int("d_k", d_k), check_int("n_samples", n_samples, low=2)
    mean, std, scale = check_real("mean", mean), check_real("std", std, low=0.0), check_real("scale", scale)
    q = mean + std * torch.randn(n_samples, d_k, dtype=torch.float64, generator=generator)
    k = mean + std * torch.randn(n_samples, d_k, dtype=torch.float64, generator=generator)
    return float((scale * (q * k).sum(dim=-1)).var())


def randn(*shape: int, gen: torch.Generator, dtype: torch.dtype = torch.float64,
          requires_grad: bool = False) -> torch.Tensor:
    """Standard normal draws of ``shape`` from the CPU generator ``gen`` (fp64 unless ``dtype``),
    optionally a leaf that records gradients."""
    return torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_(check_bool("requires_grad", requires_grad))


def grads(out: torch.Tensor, inputs, cotangent: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The vector-Jacobian product: gradients of ``(out * cotangent).sum()`` with respect to
    ``inputs``, zeros for an input ``out`` does not use; the graph is kept for further calls."""
    return torch.autograd.grad((out * cotangent).sum(), inputs, retain_graph=True, allow_unused=True,
                               materialize_grads=True)


SPREAD_WIDENING = 6     # a fresh normal draw misses 3 seeds' range widened so less than 1% of the time


def seed_spread_bounds(saved, *, floor: float = 0.0) -> tuple[float, float]:
    """The interval a rerun of a saved multi-seed result is expected in on another machine: the saved
    seeds' range widened on each side by `SPREAD_WIDENING` times its own width (at least ``floor``).
    Rounding differences between machines make a training run diverge like a fresh seed; with 3 seeds
    a fresh draw lands outside the plain range half the time (it is the smallest or the largest of
    four), and outside the widened one, for normally distributed results, less than 1% of the time."""
    values = [float(v) for v in saved]
    if len(values) < 2 or not all(v == v for v in values):
        raise ValueError(f"saved must hold at least 2 numbers without NaN, got {values}")
    if not (floor >= 0):
        raise ValueError(f"floor must be >= 0, got {floor}")
    lo, hi = min(values), max(values)
    width = SPREAD_WIDENING * max(hi - lo, floor)
    return lo - width, hi + width


def assert_within_seed_spread(name: str, live: float, saved, *, floor: float = 0.0) -> None:
    """Assert that ``live`` (this machine's run of one seed) lies in `seed_spread_bounds` of the saved
    seeds' values: how a chapter checks a saved result made on another machine (on the same machine it
    compares exactly, `xfam_lib.utils.same_machine`)."""
    lo, hi = seed_spread_bounds(saved, floor=floor)
    if not lo <= float(live) <= hi:
        raise AssertionError(f"{name}: the live run gives {float(live):.6g}, outside [{lo:.6g}, {hi:.6g}], "
                             f"the saved seeds' range {[round(float(v), 6) for v in saved]} widened "
                             f"{SPREAD_WIDENING} times its width on each side")
