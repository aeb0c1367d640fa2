"""State space models: discretisation, the LTI kernel and its FFT convolution, the selective scan.

Conventions (see the book's conventions page and ``shared/API.md``):

* **LTI systems** (`discretize`, `ssm_kernel`, `ssm_recurrence`) are single-input single-output:
  ``B`` and ``C`` are vectors ``(..., N)``. ``A`` is either **diagonal**, given as its diagonal
  ``(..., N)``, or **dense** ``(..., N, N)``. The two are told apart by rank, relative to ``B``:
  ``A.dim() == B.dim()`` means diagonal, ``A.dim() == B.dim() + 1`` means dense; any other
  ranks raise. Leading dims ``...`` are batch dims and broadcast; because the rank decides the
  layout, ``A`` and ``B`` carry the same number of batch dims (use size-1 dims, e.g. ``B[None]``,
  to share one across a batch); ``C`` and ``u`` broadcast freely. Complex ``A, B, C`` are allowed
  (S4D); the kernel is then complex and the caller takes ``2 * K.real``.
* Sequences run along the **last** dim: ``u (..., L)``, kernel ``K (..., L)``.
* The **selective scan** uses the layout of the Mamba reference ``selective_scan_ref``
  (state-spaces/mamba): ``u, delta, z (batch, d_inner, L)``, ``A (d_inner, N)``,
  ``B, C`` fixed ``(d_inner, N)`` or input-dependent ``(batch, N, L)`` (or grouped
  ``(batch, G, N, L)``). Its discretisation is ``A_bar = exp(delta * A)`` but ``B_bar = delta * B``
  (Euler), not full ZOH (ERRATA E9.6); full ZOH is in `discretize`.
* fp16/bf16 are computed in fp32 and returned in their dtype; fp64 stays fp64 (mamba's reference
  computes fp64 inputs in fp32; here fp64 is kept so that checks can be tight).
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from .utils import check_positive_int, check_tensor

__all__ = [
    "discretize",
    "ssm_kernel",
    "ssm_recurrence",
    "ssm_convolve",
    "segsum",
    "associative_scan",
    "selective_scan",
    "s4d_init",
    "s4d_kernel",
    "S4DKernel",
    "S4DLayer",
    "shift_ssm_kernel",
    "h3_mix",
    "H3Layer",
    "MambaBlock",
    "ssd_scan",
    "ssd_matrix",
    "ssd_attention_form",
    "ssd_chunked",
]

_METHODS = ("zoh", "bilinear", "euler")
_SCAN_MODES = ("sequential", "chunk", "scan")
_SCAN_METHODS = ("hillis_steele", "blelloch")


# ----------------------------------------------------------------------------- helpers
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


# ----------------------------------------------------------------------------- discretisation (M9.2)
def discretize(A: torch.Tensor, B: torch.Tensor, delta, method: str = "zoh"):
    """Discretise ``x'(t) = A x(t) + B u(t)`` with step ``delta``: returns ``(A_bar, B_bar)``.

    Shapes (single input): ``B (..., N)``; ``A`` diagonal ``(..., N)`` (``A.dim() == B.dim()``) or
    dense ``(..., N, N)`` (``A.dim() == B.dim() + 1``); ``delta`` a number or a tensor broadcastable
    to the batch dims ``...`` (one step per system, ``>= 0``). ``A_bar`` has ``A``'s layout and
    ``B_bar (..., N)``, with the batch dims broadcast. Then ``x_k = A_bar x_{k-1} + B_bar u_k``.

    * ``"zoh"`` (exact for an input held constant over each step):
      ``A_bar = exp(dA)``, ``B_bar = A^{-1}(exp(dA) - I) B`` with ``dA = delta * A``. Diagonal:
      ``B_bar = delta * phi1(delta A) * B``, ``phi1(x) = (e^x - 1)/x``, which is exact at ``A = 0``.
      Dense: ``torch.linalg.matrix_exp`` and a solve, so a dense ``A`` must be invertible (a
      singular one raises), and ``exp(dA) - I`` costs ``~eps / |delta A|`` relative accuracy in B_bar
      for tiny steps; the diagonal form has neither limitation.
    * ``"bilinear"`` (Tustin, used by S4): ``A_bar = (I - dA/2)^{-1}(I + dA/2)``,
      ``B_bar = (I - dA/2)^{-1} delta B``.
    * ``"euler"`` (forward Euler): ``A_bar = I + dA``, ``B_bar = delta B``.

    Mamba's `selective_scan` mixes them: ``exp(dA)`` with the Euler ``B_bar = delta B`` (E9.6).
    Real or complex inputs; fp16/bf16 are computed in fp32 and returned in their dtype.
    """
    fn = "discretize"
    if method not in _METHODS:
        raise ValueError(f"{fn}: method must be one of {_METHODS}, got {method!r}")
    _check_numeric("A", A, min_rank=1)
    _check_numeric("B", B, min_rank=1)
    delta_is_number = not isinstance(delta, torch.Tensor)
    if not delta_is_number:
        _check_numeric("delta", delta)
        if delta.is_complex():
            raise TypeError(f"{fn}: delta must be real, got dtype {delta.dtype}")
    elif isinstance(delta, numbers.Real) and not isinstance(delta, bool):
        delta = torch.tensor(float(delta), dtype=_real_dtype(_work_dtype(A.dtype, B.dtype)), device=A.device)
    else:
        raise TypeError(f"{fn}: delta must be a real number or a tensor, got {type(delta).__name__}")
    diagonal = _is_diagonal(fn, A, B)
    batch_a = A.shape[:-1] if diagonal else A.shape[:-2]
    batch = _broadcast_batch(fn, A=batch_a, B=B.shape[:-1], delta=delta.shape)
    if bool((delta.detach() < 0).any()):
        raise ValueError(f"{fn}: delta must be >= 0, got min {float(delta.detach().min()):.3g} "
                         f"(delta shape {tuple(delta.shape)})")
    out = _out_dtype(A.dtype, B.dtype) if delta_is_number else _out_dtype(A.dtype, B.dtype, delta.dtype)
    work = _work_dtype(A.dtype, B.dtype, delta.dtype)
    A, B = A.to(work), B.to(work)
    delta = delta.to(_real_dtype(work))

    if diagonal:
        dA = delta[..., None] * A
        dB = delta[..., None] * B
        if method == "zoh":
            A_bar, B_bar = torch.exp(dA), _phi1(dA) * dB
        elif method == "bilinear":
            if bool((dA == 2).any()):
                raise ValueError(f"{fn}(method='bilinear') needs delta * A != 2 (the pole of the bilinear map, "
                                 f"where 1 - delta A / 2 = 0); got it for A {tuple(A.shape)}")
            A_bar, B_bar = (1 + dA / 2) / (1 - dA / 2), dB / (1 - dA / 2)
        else:
            A_bar, B_bar = 1 + dA, dB
        n = A.shape[-1]
        return A_bar.expand(batch + (n,)).contiguous().to(out), B_bar.expand(batch + (n,)).contiguous().to(out)

    n = A.shape[-1]
    eye = torch.eye(n, dtype=work, device=A.device)
    dA = delta[..., None, None] * A
    dB = delta[..., None] * B
    if method == "zoh":
        A_bar = torch.linalg.matrix_exp(dA)
        try:                                                         # solve broadcasts the batch dims
            B_bar = torch.linalg.solve(A, (A_bar - eye) @ B[..., None])[..., 0]
        except torch.linalg.LinAlgError as err:
            raise ValueError(f"{fn}(method='zoh') with a dense A needs A invertible (B_bar = A^-1 (e^(dA) - I) B); "
                             f"A {tuple(A.shape)} is singular. Use a diagonal A (exact at A = 0) or another "
                             f"method. ({err})") from None
    elif method == "bilinear":
        left = eye - dA / 2
        try:
            A_bar = torch.linalg.solve(left, eye + dA / 2)
            B_bar = torch.linalg.solve(left, dB[..., None])[..., 0]
        except torch.linalg.LinAlgError as err:
            raise ValueError(f"{fn}(method='bilinear') needs I - delta A / 2 invertible; for A {tuple(A.shape)} it "
                             f"is singular (delta A has an eigenvalue 2, the pole of the bilinear map). "
                             f"({err})") from None
    else:
        A_bar, B_bar = eye + dA, dB
    return A_bar.expand(batch + (n, n)).contiguous().to(out), B_bar.expand(batch + (n,)).contiguous().to(out)


# ----------------------------------------------------------------------------- LTI kernel, recurrence, conv (M9.1, M9.3)
def _check_length(fn: str, u: torch.Tensor) -> None:
    if u.shape[-1] == 0:
        raise ValueError(f"{fn}: u must have a positive length L (last dim), got shape {tuple(u.shape)}")


def _check_lti(fn: str, A_bar, B_bar, C) -> bool:
    _check_numeric("A_bar", A_bar, min_rank=1)
    _check_numeric("B_bar", B_bar, min_rank=1)
    _check_numeric("C", C, min_rank=1)
    if C.shape[-1] != B_bar.shape[-1]:
        raise ValueError(f"{fn}: C (..., N) and B_bar (..., N) must share N, got C {tuple(C.shape)} and "
                         f"B_bar {tuple(B_bar.shape)}")
    diagonal = _is_diagonal(fn, A_bar, B_bar)
    batch_a = A_bar.shape[:-1] if diagonal else A_bar.shape[:-2]
    _broadcast_batch(fn, A_bar=batch_a, B_bar=B_bar.shape[:-1], C=C.shape[:-1])
    return diagonal


def ssm_kernel(A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor, length: int) -> torch.Tensor:
    """The length-``L`` convolution kernel ``K_k = C A_bar^k B_bar``, ``k = 0 .. L-1``, shape ``(..., L)``.

    ``B_bar, C (..., N)``; ``A_bar`` diagonal ``(..., N)`` or dense ``(..., N, N)`` (see the module
    docstring). Diagonal: a Vandermonde sum ``K_k = sum_n C_n B_n A_n^k``, with ``k = j m + i``
    (``m = ceil(sqrt(L))``) so that ``A^k = A^(jm) A^i``: two small tables of powers (each computed
    directly, never by repeated products) and one matrix product over the states. Dense: the Krylov vectors
    ``A^j B`` by doubling (``[V, A^m V]``, then ``A^m -> A^2m``), ``O(log L)`` matrix products.
    Then ``y = ssm_convolve(u, K)`` equals ``ssm_recurrence(A_bar, B_bar, C, u)``.
    """
    fn = "ssm_kernel"
    length = check_positive_int("length", length)
    diagonal = _check_lti(fn, A_bar, B_bar, C)
    out = _out_dtype(A_bar.dtype, B_bar.dtype, C.dtype)
    work = _work_dtype(A_bar.dtype, B_bar.dtype, C.dtype)
    A_bar, B_bar, C = A_bar.to(work), B_bar.to(work), C.to(work)
    if diagonal:                                                         # k = j m + i: A^k = A^(jm) A^i
        m = math.isqrt(length - 1) + 1                                   # m >= sqrt(L), m * m >= L
        steps = torch.arange(m, device=A_bar.device, dtype=A_bar.real.dtype)
        inner = torch.pow(A_bar[..., None], steps)                       # (..., N, m): A^i
        outer = (C * B_bar)[..., None] * torch.pow(A_bar[..., None], steps * m)   # (..., N, m): C B A^(jm)
        K = outer.transpose(-1, -2) @ inner                              # (..., j, i): sum over the N states
        return K.flatten(-2)[..., :length].to(out)
    n = A_bar.shape[-1]
    batch = torch.broadcast_shapes(A_bar.shape[:-2], B_bar.shape[:-1])
    power = A_bar.expand(batch + (n, n))
    krylov = B_bar.expand(batch + (n,))[..., None]                       # (..., N, m): A^j B, j < m
    while krylov.shape[-1] < length:
        krylov = torch.cat([krylov, power @ krylov], dim=-1)
        power = power @ power
    return (C[..., None] * krylov[..., :length]).sum(-2).to(out)


def ssm_recurrence(A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Loop reference (M9.1): ``x_k = A_bar x_{k-1} + B_bar u_k``, ``y_k = C x_k``, ``x_{-1} = 0``.

    ``u (..., L)`` → ``y (..., L)``; ``B_bar, C (..., N)``; ``A_bar`` diagonal ``(..., N)`` or dense
    ``(..., N, N)``. The system's batch dims broadcast against ``u``'s.
    """
    fn = "ssm_recurrence"
    diagonal = _check_lti(fn, A_bar, B_bar, C)
    _check_numeric("u", u, min_rank=1)
    _check_length(fn, u)
    out = _out_dtype(A_bar.dtype, B_bar.dtype, C.dtype, u.dtype)
    work = _work_dtype(A_bar.dtype, B_bar.dtype, C.dtype, u.dtype)
    A_bar, B_bar, C, u = A_bar.to(work), B_bar.to(work), C.to(work), u.to(work)
    batch_a = A_bar.shape[:-1] if diagonal else A_bar.shape[:-2]
    batch = _broadcast_batch(fn, A_bar=batch_a, B_bar=B_bar.shape[:-1], C=C.shape[:-1], u=u.shape[:-1])
    x = torch.zeros(batch + (B_bar.shape[-1],), dtype=work, device=u.device)
    ys = []
    for k in range(u.shape[-1]):
        decayed = A_bar * x if diagonal else (A_bar @ x[..., None])[..., 0]
        x = decayed + B_bar * u[..., k, None]
        ys.append((C * x).sum(-1))
    return torch.stack(ys, dim=-1).to(out)


def ssm_convolve(u: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Causal convolution ``y_k = sum_{j <= k} K_{k-j} u_j`` over the last dim, via FFT.

    ``u (..., L)`` and ``K (..., L)`` (batch dims broadcast) → ``y (..., L)``. Both are zero-padded
    to ``2L`` before the FFT, so the circular convolution has no wrap-around: ``O(L log L)``.
    A complex ``u`` or ``K`` uses the complex FFT and returns a complex ``y``.
    """
    fn = "ssm_convolve"
    _check_numeric("u", u, min_rank=1)
    _check_numeric("K", K, min_rank=1)
    _check_length(fn, u)
    if K.shape[-1] != u.shape[-1]:
        raise ValueError(f"{fn}: u (..., L) and K (..., L) must have the same length L, got u {tuple(u.shape)} "
                         f"and K {tuple(K.shape)}")
    _broadcast_batch(fn, u=u.shape[:-1], K=K.shape[:-1])
    length = u.shape[-1]
    out = _out_dtype(u.dtype, K.dtype)
    work = _work_dtype(u.dtype, K.dtype)
    u, K = u.to(work), K.to(work)
    n = 2 * length
    if work.is_complex:
        y = torch.fft.ifft(torch.fft.fft(u, n=n) * torch.fft.fft(K, n=n), n=n)
    else:
        y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(K, n=n), n=n)
    return y[..., :length].to(out)


# ----------------------------------------------------------------------------- scans (M9.9)
def segsum(x: torch.Tensor) -> torch.Tensor:
    """Segment sums ``S[..., t, s] = x_{s+1} + ... + x_t`` for ``s <= t`` (0 on the diagonal), ``-inf`` above.

    ``x (..., T)`` → ``(..., T, T)``; ``exp(S)`` is the lower-triangular decay matrix
    ``prod_{s<r<=t} exp(x_r)``. Each entry is summed directly (no difference of two cumulative sums),
    so large ``|x|`` loses no precision, and nothing above the diagonal is ever exponentiated.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    t = x.shape[-1]
    rows = torch.arange(t, device=x.device)
    strict = rows[:, None] > rows[None, :]                               # (t, s): s < t
    terms = x[..., :, None].expand(*x.shape, t).masked_fill(~strict, 0)  # [r, s] = x_r if r > s
    sums = terms.cumsum(dim=-2)                                          # [t, s] = sum_{s < r <= t} x_r
    return sums.masked_fill(rows[:, None] < rows[None, :], float("-inf"))


def associative_scan(a: torch.Tensor, b: torch.Tensor, method: str = "hillis_steele") -> torch.Tensor:
    """Solve ``x_t = a_t x_{t-1} + b_t`` (``x_{-1} = 0``) along the last dim with a parallel scan.

    ``a, b (..., L)`` (broadcast together) → ``x (..., L)``. The elements ``(a, b)`` are affine maps
    ``x -> a x + b``; composing "first ``(a1, b1)``, then ``(a2, b2)``" gives ``(a2 a1, a2 b1 + b2)``,
    which is associative, so prefixes combine in any grouping.

    * ``"hillis_steele"``: ``ceil(log2 L)`` steps, each combining every position with the one
      ``2^k`` before it; work ``O(L log L)``.
    * ``"blelloch"``: the work-efficient up-sweep / down-sweep on a tree (length padded to a power
      of two with the identity ``(1, 0)``); ``2 log2 L`` steps, work ``O(L)``.
    """
    if method not in _SCAN_METHODS:
        raise ValueError(f"associative_scan: method must be one of {_SCAN_METHODS}, got {method!r}")
    _check_numeric("a", a, min_rank=1)
    _check_numeric("b", b, min_rank=1)
    try:
        a, b = torch.broadcast_tensors(a, b)
    except RuntimeError:
        raise ValueError(f"associative_scan: a {tuple(a.shape)} and b {tuple(b.shape)} do not broadcast") from None
    work = _work_dtype(a.dtype, b.dtype)
    out = _out_dtype(a.dtype, b.dtype)
    a, b = a.to(work), b.to(work)
    scan = _hillis_steele if method == "hillis_steele" else _blelloch
    return scan(a, b).to(out)


def _hillis_steele(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    length, step = a.shape[-1], 1
    while step < length:
        a_prev = F.pad(a[..., :-step], (step, 0), value=1.0)             # identity before the start
        b_prev = F.pad(b[..., :-step], (step, 0), value=0.0)
        a, b = a * a_prev, a * b_prev + b                                # (prev, then current); old a in both
        step *= 2
    return b


def _blelloch(a0: torch.Tensor, b0: torch.Tensor) -> torch.Tensor:
    length = a0.shape[-1]
    size = 1 << max(0, (length - 1).bit_length())
    a = F.pad(a0, (0, size - length), value=1.0)
    b = F.pad(b0, (0, size - length), value=0.0)
    lead = a.shape[:-1]
    stride = 2
    while stride <= size:                                                # up-sweep: node = (left, then right)
        half = stride // 2
        av, bv = a.reshape(*lead, size // stride, stride), b.reshape(*lead, size // stride, stride)
        al, bl, ar, br = av[..., half - 1], bv[..., half - 1], av[..., stride - 1], bv[..., stride - 1]
        a = torch.cat([av[..., :stride - 1], (ar * al)[..., None]], -1).reshape(*lead, size)
        b = torch.cat([bv[..., :stride - 1], (ar * bl + br)[..., None]], -1).reshape(*lead, size)
        stride *= 2
    a = torch.cat([a[..., :-1], torch.ones_like(a[..., :1])], -1)        # root <- identity
    b = torch.cat([b[..., :-1], torch.zeros_like(b[..., :1])], -1)
    stride = size
    while stride >= 2:                                                   # down-sweep: exclusive prefixes
        half = stride // 2
        av, bv = a.reshape(*lead, size // stride, stride), b.reshape(*lead, size // stride, stride)
        al, bl, ap, bp = av[..., half - 1], bv[..., half - 1], av[..., stride - 1], bv[..., stride - 1]
        # left child gets the parent's prefix p; right child gets (p, then the left segment)
        new_l = (ap, bp)
        new_r = (al * ap, al * bp + bl)
        a = torch.cat([av[..., :half - 1], new_l[0][..., None], av[..., half:stride - 1], new_r[0][..., None]],
                      -1).reshape(*lead, size)
        b = torch.cat([bv[..., :half - 1], new_l[1][..., None], bv[..., half:stride - 1], new_r[1][..., None]],
                      -1).reshape(*lead, size)
        stride //= 2
    return a0 * b[..., :length] + b0                                     # inclusive = exclusive, then own element


# ----------------------------------------------------------------------------- selective scan (M9.8, M9.9)
def _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias):
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                    ("delta_bias", delta_bias)):
        if t is None:
            continue
        check_tensor(name, t)
        if t.is_complex():
            raise TypeError(f"selective_scan: {name} must be real (complex A, S4D-style, is not supported), "
                            f"got dtype {t.dtype}")
        if not t.is_floating_point():
            raise TypeError(f"selective_scan: {name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.device != u.device:
            raise ValueError(f"selective_scan: {name} is on {t.device} but u is on {u.device}")
    if u.dim() != 3:
        raise ValueError(f"selective_scan: u must be (batch, d_inner, L), got shape {tuple(u.shape)}")
    batch, dim, length = u.shape
    if length == 0 or dim == 0:
        raise ValueError(f"selective_scan: u must have d_inner >= 1 and L >= 1, got shape {tuple(u.shape)}")
    if delta.shape != u.shape:
        raise ValueError(f"selective_scan: delta must have u's shape (batch, d_inner, L) = {tuple(u.shape)}, "
                         f"got {tuple(delta.shape)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"selective_scan: z must have u's shape (batch, d_inner, L) = {tuple(u.shape)}, "
                         f"got {tuple(z.shape)}")
    if A.dim() != 2 or A.shape[0] != dim:
        raise ValueError(f"selective_scan: A must be (d_inner, N) with d_inner = {dim} (from u "
                         f"{tuple(u.shape)}), got {tuple(A.shape)}")
    n = A.shape[1]
    for name, t in (("B", B), ("C", C)):
        ok = ((t.dim() == 2 and tuple(t.shape) == (dim, n))
              or (t.dim() == 3 and tuple(t.shape) == (batch, n, length))
              or (t.dim() == 4 and t.shape[0] == batch and t.shape[1] > 0 and dim % t.shape[1] == 0
                  and tuple(t.shape[2:]) == (n, length)))
        if not ok:
            raise ValueError(f"selective_scan: {name} must be fixed (d_inner, N) = {(dim, n)}, input-dependent "
                             f"(batch, N, L) = {(batch, n, length)} or grouped (batch, G, N, L) with G dividing "
                             f"d_inner = {dim}; got {tuple(t.shape)} (u {tuple(u.shape)}, A {tuple(A.shape)})")
    for name, t in (("D", D), ("delta_bias", delta_bias)):
        if t is not None and tuple(t.shape) != (dim,):
            raise ValueError(f"selective_scan: {name} must be (d_inner,) = ({dim},), got {tuple(t.shape)}")


def _bc_layout(X: torch.Tensor, dim: int) -> torch.Tensor:
    """``B`` or ``C`` in the internal layout ``(batch|1, d_inner|1, L|1, N)``."""
    if X.dim() == 2:                                                     # fixed (d_inner, N)
        return X[None, :, None, :]
    if X.dim() == 3:                                                     # (batch, N, L), shared by all channels
        return X.transpose(1, 2)[:, None]
    groups = X.shape[1]                                                  # (batch, G, N, L): channel d uses group
    return X.repeat_interleave(dim // groups, dim=1).transpose(2, 3)     # d // (d_inner / G)


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False, *, mode: str = "sequential", chunk_size: int = 64):
    """The selective (time-varying) SSM of Mamba, with the arguments of its ``selective_scan_ref``.

    Shapes: ``u, delta, z (batch, d_inner, L)``; ``A (d_inner, N)`` real (negative for a stable
    scan); ``B, C`` fixed ``(d_inner, N)``, input-dependent ``(batch, N, L)`` shared by all channels,
    or grouped ``(batch, G, N, L)`` (channel ``d`` uses group ``d // (d_inner / G)``); ``D,
    delta_bias (d_inner,)``. Per channel ``d`` and state ``n``, with ``delta <- softplus(delta +
    delta_bias)`` (each step only if asked):

        x_t = exp(delta_t A) * x_{t-1} + delta_t B_t u_t,   y_t = <x_t, C_t> + D u_t,   y_t *= silu(z_t)

    Returns ``y (batch, d_inner, L)`` in ``u``'s dtype, and ``(y, last_state)`` with ``last_state
    (batch, d_inner, N)`` in the compute dtype when ``return_last_state``. The compute dtype is the
    promotion of all inputs and fp32 (halves run in fp32, fp64 stays fp64). Gradients flow to every
    input, through ``last_state`` too.

    ``mode``: ``"sequential"`` is the step loop (the reference); ``"chunk"`` splits ``L`` into
    chunks of ``chunk_size`` (the last may be shorter), computes every chunk from a zero state at
    once, then carries the state from chunk to chunk (``L / chunk_size`` sequential steps). Inside a
    chunk the recurrence is unrolled in closed form (a cumulative sum, `_factored_chunk_scan`) when
    its decay factors fit the dtype, with the chunk halved (down to 4) until they do; decays too strong
    for that run the step loop inside all chunks at once instead (`_chunk_scan`, ``chunk_size + L /
    chunk_size`` steps, exponents ``<= 0`` for ``A <= 0``: no overflow). ``"scan"`` runs the
    Hillis–Steele `associative_scan` over ``L``. All modes agree in outputs, last state and gradients.
    """
    _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias)
    if mode not in _SCAN_MODES:
        raise ValueError(f"selective_scan: mode must be one of {_SCAN_MODES}, got {mode!r}")
    chunk_size = check_positive_int("chunk_size", chunk_size)
    batch, dim, length = u.shape
    work = _work_dtype(*(t.dtype for t in (u, delta, A, B, C, D, z, delta_bias) if t is not None))

    dt = delta.to(work)
    if delta_bias is not None:
        dt = dt + delta_bias.to(work)[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    uw = u.to(work)
    A_w, B_l = A.to(work), _bc_layout(B.to(work), dim)                  # B_l (batch|1, d|1, L|1, N)
    C_l = _bc_layout(C.to(work), dim)                                    # (batch|1, d|1, L|1, N)
    factored = _factored_chunk_size(dt, A_w, chunk_size) if mode == "chunk" else None
    if factored is not None:
        y, x = _factored_chunk_scan(dt, dt * uw, A_w, B_l, C_l, factored)
    else:
        C_l = C_l.expand(-1, -1, length, -1)
        log_decay = dt[..., None] * A_w[:, None, :]                      # (batch, d, L, N): delta_t A
        drive = (dt * uw)[..., None] * B_l                               # (batch, d, L, N): delta_t B_t u_t
        if mode == "sequential":
            decay = torch.exp(log_decay)
            x = torch.zeros(batch, dim, A.shape[1], dtype=work, device=u.device)
            ys = []
            for t in range(length):
                x = decay[:, :, t] * x + drive[:, :, t]
                ys.append((x * C_l[:, :, t]).sum(-1))
            y = torch.stack(ys, dim=-1)
        elif mode == "scan":
            states = associative_scan(torch.exp(log_decay).transpose(-1, -2), drive.transpose(-1, -2))  # (b, d, N, L)
            y = (states.transpose(-1, -2) * C_l).sum(-1)
            x = states[..., -1]
        else:
            y, x = _chunk_scan(log_decay, drive, C_l, chunk_size)

    if D is not None:
        y = y + uw * D.to(work)[:, None]
    if z is not None:
        y = y * F.silu(z.to(work))
    y = y.to(u.dtype)
    return (y, x) if return_last_state else y


def _chunk_scan(log_decay, drive, C_l, chunk_size):
    """Two-level chunked scan, ``(y, last_state)``; all inputs ``(batch, d, L, N)`` (``C_l`` may broadcast).

    1. every chunk's zero-state response, all chunks at once: a loop of ``chunk_size`` steps;
    2. the states entering the chunks: a loop over the ``L / chunk_size`` chunks,
       ``x_in[c+1] = exp(sum of the chunk's delta A) x_in[c] + (chunk c's zero-state end state)``;
    3. ``x_t = (zero-state response)_t + exp(cum_t) x_in`` with ``cum_t`` the sum of ``delta A``
       from the chunk's start to ``t`` (a sum of its own terms, ``<= 0`` for ``A <= 0``: no overflow).

    About ``chunk_size + L / chunk_size`` sequential steps instead of ``L``. A ragged last chunk is
    padded with ``delta A = 0`` and zero drive, which changes neither the outputs nor the state.
    """
    batch, dim, length, n = log_decay.shape
    chunk_size = min(chunk_size, length)                                 # never pad a short sequence up to a chunk
    pad = (-length) % chunk_size
    n_chunks = (length + pad) // chunk_size
    if pad:
        log_decay, drive = F.pad(log_decay, (0, 0, 0, pad)), F.pad(drive, (0, 0, 0, pad))
    log_decay, drive = (t.reshape(batch, dim, n_chunks, chunk_size, n) for t in (log_decay, drive))
    decay = torch.exp(log_decay)
    local, h = [], drive.new_zeros(batch, dim, n_chunks, n)
    for t in range(chunk_size):                                          # 1. all chunks side by side
        h = decay[:, :, :, t] * h + drive[:, :, :, t]
        local.append(h)
    local = torch.stack(local, dim=3)                                    # (b, d, c, T, N)
    chunk_decay = torch.exp(log_decay.sum(3))                            # (b, d, c, N)
    x, entering = drive.new_zeros(batch, dim, n), []
    for c in range(n_chunks):                                            # 2. carry the state across chunks
        entering.append(x)
        x = chunk_decay[:, :, c] * x + local[:, :, c, -1]
    entering = torch.stack(entering, dim=2)                              # (b, d, c, N)
    states = local + torch.exp(log_decay.cumsum(3)) * entering[:, :, :, None]    # 3.
    states = states.reshape(batch, dim, n_chunks * chunk_size, n)[:, :, :length]
    return (states * C_l).sum(-1), x


_FACTOR_LIMIT = {torch.float32: 40.0, torch.float64: 300.0}   # largest |log| of a decay factor, per dtype
_MIN_FACTORED_CHUNK = 4
_GROUP_ELEMENTS = {"cpu": 2 ** 19, "gpu": 2 ** 26}             # state entries per group of chunks (2 / 256 MiB fp32)


def _chunk_cumsum(dt: torch.Tensor, size: int) -> torch.Tensor:
    """``(..., L)`` → ``(..., ceil(L / size), size)``: sums of ``dt`` from each chunk's start (padded with 0)."""
    return F.pad(dt, (0, -dt.shape[-1] % size)).unflatten(-1, (-1, size)).cumsum(-1)


def _factored_chunk_size(dt: torch.Tensor, A: torch.Tensor, chunk_size: int) -> int | None:
    """The chunk size for `_factored_chunk_scan`, or None when even short chunks decay too strongly.

    ``chunk_size`` (capped at ``L``), halved while some chunk breaks the dtype's limit S (40 in fp32),
    down to 4. With ``c_t`` the sums of delta from the chunk start and ``m`` the middle of their range,
    every factor ``exp(A (c_t - m))`` must lie within ``e^±S`` (their squares in the backward pass stay
    normal numbers) and every ``exp(A c_t)`` within ``e^±2S``. NaN inputs never pass the check.
    """
    length = dt.shape[-1]
    size, smallest = min(chunk_size, length), min(_MIN_FACTORED_CHUNK, length)
    if dt.numel() == 0:                                                 # a batch of 0: any size is safe
        return size
    a_max, limit = A.abs().amax(-1)[:, None], _FACTOR_LIMIT[dt.dtype]   # (d, 1)
    while size >= smallest:
        cum = _chunk_cumsum(dt, size)
        high, low = cum.amax(-1), cum.amin(-1)
        if bool(((high - low) / 2 * a_max).amax() <= limit) and bool((cum.abs().amax(-1) * a_max).amax() <= 2 * limit):
            return size
        size //= 2
    return None


def _factored_chunk_scan(dt, dtu, A, B_l, C_l, size: int):
    """Chunked scan with every chunk in closed form, ``(y, last_state)``.

    ``dt, dtu (batch, d, L)`` (``delta`` and ``delta * u``), ``A (d, N)``, ``B_l, C_l`` in the layout of
    `_bc_layout`. Inside a chunk, with ``c_t`` the sum of ``delta`` from the chunk start through ``t``,
    ``m`` the middle of the range of ``c`` and ``E_t = exp(A (c_t - m))``, the recurrence unrolls to

        x_t = E_t * (exp(A m) x_in + sum_{s <= t} delta_s B_s u_s / E_s),

    a cumulative sum; only the states entering the chunks are carried in a loop of ``L / size``
    steps (``x_out = exp(A c_end) x_in + E_end * sum``). Centring on ``m`` halves the largest exponent,
    so `_factored_chunk_size` allows chunks twice as long. Memory traffic, not arithmetic, bounds this on
    a CPU, so the work is laid out for it: states as ``(b, d, N, chunk, step)``, time innermost, so
    that every broadcast runs along long contiguous rows, and, on a CPU only, the chunks taken in
    groups of about ``_GROUP_ELEMENTS["cpu"]`` state entries whose buffers stay in cache while they
    are updated in place. A GPU takes groups 128 times larger, only to bound the memory: each group
    costs a kernel launch per operation there. A ragged last chunk is padded with ``delta = 0`` and
    zero drive.
    """
    batch, dim, length = dt.shape
    n, pad = A.shape[-1], -length % size
    n_chunks = (length + pad) // size

    def chunked(t):                                                      # (..., L|1) -> (..., c|1, size|1)
        if t.shape[-1] == 1:
            return t[..., None]
        return (F.pad(t, (0, pad)) if pad else t).unflatten(-1, (n_chunks, size))

    cum = _chunk_cumsum(dt, size)                                        # (b, d, c, size)
    middle = (cum.amax(-1, keepdim=True) + cum.amin(-1, keepdim=True)) / 2
    rate = A[:, :, None] * math.log2(math.e)                             # (d, N, 1); exp(y) = 2^(y log2 e), and
    chunk_decay = torch.exp2(cum[:, :, None, :, -1] * rate)              # exp2 is cheaper. (b, d, N, c): exp(A c_end)
    entry_scale = torch.exp2(middle[:, :, None, :, 0] * rate)            # (b, d, N, c): exp(A m)
    centred, dtu_c = (cum - middle)[:, :, None], chunked(dtu)[:, :, None]   # (b, d, 1, c, size)
    B_c, C_c = (chunked(t.transpose(-1, -2)) for t in (B_l, C_l))      # (b|1, d|1, N, c|1, size|1)
    on_cpu = dt.device.type == "cpu"
    group = max(1, _GROUP_ELEMENTS["cpu" if on_cpu else "gpu"] // (max(batch, 1) * dim * size * n))
    # On a CPU without autograd the two group buffers are allocated once and reused: a fresh megabyte
    # costs its page faults, more than the arithmetic on it. With autograd every group keeps its own.
    reuse = on_cpu and not (torch.is_grad_enabled() and any(t.requires_grad for t in (dt, dtu, A, B_l, C_l)))
    buffers = [dt.new_empty(batch, dim, n, group, size) for _ in range(2)] if reuse else None
    y = dt.new_empty(batch, dim, n_chunks, size) if reuse else None

    x, ys = dt.new_zeros(batch, dim, n), []
    for c0 in range(0, n_chunks, group):
        part = slice(c0, c0 + group)
        full = reuse and min(group, n_chunks - c0) == group

        def product(a, b, i):                                            # a * b, into buffer i when reusing
            return torch.mul(a, b, out=buffers[i]) if full else a * b

        B_g, C_g = (t if t.shape[-2] == 1 else t[..., part, :] for t in (B_c, C_c))
        E = product(centred[..., part, :], rate[..., None], 0).exp2_()   # (b, d, N, g, size)
        G = product(B_g, dtu_c[..., part, :], 1).div_(E).cumsum_(-1)     # sum_{s <= t} delta_s B_s u_s / E_s
        own = E[..., -1] * G[..., -1].clone()                            # (b, d, N, g): end state from x_in = 0
        decay, entering = chunk_decay[..., part], []
        for c in range(E.shape[-2]):
            entering.append(x)
            x = torch.addcmul(own[..., c], decay[..., c], x)
        x_in = torch.stack(entering, dim=-1) * entry_scale[..., part]
        states = G.add_(x_in[..., None]).mul_(E).mul_(C_g)
        if reuse:
            torch.sum(states, 2, out=y[:, :, part])                      # (b, d, g, size), written in place
        else:
            ys.append(states.sum(2))
    y = y if reuse else torch.cat(ys, dim=2)
    return y.reshape(batch, dim, n_chunks * size)[:, :, :length], x


# ----------------------------------------------------------------------------- S4D (M9.5)
_S4D_INITS = ("lin", "inv")


def s4d_init(d_model: int, d_state: int, init: str = "lin") -> tuple[torch.Tensor, torch.Tensor]:
    """The S4D initial eigenvalues ``A = A_re + i A_im``, each ``(d_model, d_state // 2)`` (Gu et al. 2022).

    Only one of each conjugate pair is kept (``d_state`` must be even); the kernel adds the other
    half as ``2 * Re``. Mode ``n = 0 .. N/2-1``, all with ``A_re = -1/2``:

    * ``"lin"`` (S4D-Lin): ``A_im = pi n`` (frequencies on a linear grid, like a Fourier basis);
    * ``"inv"`` (S4D-Inv): ``A_im = (N / pi) (N / (2n + 1) - 1)`` (an approximation of S4's HiPPO-LegS spectrum).
    """
    d_model = check_positive_int("d_model", d_model)
    d_state = check_positive_int("d_state", d_state)
    if d_state % 2:
        raise ValueError(f"s4d_init: d_state must be even (conjugate pairs), got {d_state}")
    if init not in _S4D_INITS:
        raise ValueError(f"s4d_init: init must be one of {_S4D_INITS}, got {init!r}")
    n = torch.arange(d_state // 2, dtype=torch.float32)
    A_im = math.pi * n if init == "lin" else d_state / math.pi * (d_state / (2 * n + 1) - 1)
    return torch.full((d_model, d_state // 2), -0.5), A_im.expand(d_model, -1).clone()


def s4d_kernel(log_dt: torch.Tensor, A_re: torch.Tensor, A_im: torch.Tensor, C: torch.Tensor,
               length: int) -> torch.Tensor:
    """The real S4D convolution kernel ``(H, L)``: ``K_k = 2 Re sum_n C_n Bbar_n exp(dt A_n)^k``.

    ``log_dt (H,)``; ``A_re, A_im, C (H, N/2)`` with ``C`` complex (``B = 1`` is folded into ``C``,
    as in S4D); ``A_re <= 0`` for a decaying kernel. ZOH: ``Bbar_n = (exp(dt A_n) - 1) / A_n``
    (computed as ``dt * phi1(dt A_n)``, so ``A_n = 0`` is fine). The ``N/2`` modes stand for ``N``
    in conjugate pairs; their sum is real, hence ``2 Re``. The powers are ``exp(k dt A_n)`` (a
    Vandermonde matrix), never repeated products, so the kernel stays accurate at any length.
    """
    length = check_positive_int("length", length)
    for name, t in (("log_dt", log_dt), ("A_re", A_re), ("A_im", A_im)):
        check_tensor(name, t, floating=True)
    _check_numeric("C", C, min_rank=2)
    if log_dt.dim() != 1 or A_re.dim() != 2 or A_re.shape[0] != log_dt.shape[0] \
            or A_im.shape != A_re.shape or C.shape != A_re.shape:
        raise ValueError(f"s4d_kernel: need log_dt (H,) and A_re, A_im, C (H, N/2); got log_dt "
                         f"{tuple(log_dt.shape)}, A_re {tuple(A_re.shape)}, A_im {tuple(A_im.shape)}, "
                         f"C {tuple(C.shape)}")
    real = _real_dtype(_work_dtype(log_dt.dtype, A_re.dtype, A_im.dtype, C.dtype))
    cplx = torch.complex128 if real == torch.float64 else torch.complex64
    dt = torch.exp(log_dt.to(real))[:, None]                             # (H, 1)
    dtA = dt * torch.complex(A_re.to(real), A_im.to(real))               # (H, N/2)
    C_bar = C.to(cplx) * dt * _phi1(dtA)                                 # C * B_bar, ZOH
    k = torch.arange(length, device=dtA.device, dtype=real)
    K = (C_bar[..., None] * torch.exp(dtA[..., None] * k)).sum(-2)       # (H, L)
    return (2 * K.real).to(_out_dtype(log_dt.dtype, A_re.dtype, A_im.dtype, _real_dtype(C.dtype)))


def _check_sequence(name: str, x: torch.Tensor, d_model: int) -> None:
    check_tensor(name, x, floating=True)
    if x.dim() != 3 or x.shape[-1] != d_model or x.shape[1] == 0:
        raise ValueError(f"{name} must be (batch, L, d_model) with d_model = {d_model} and L >= 1, "
                         f"got {tuple(x.shape)}")


def _long_conv(u: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Per-channel causal FFT convolution of ``u (batch, L, H)`` with ``K (H, L)``."""
    return ssm_convolve(u.transpose(1, 2), K).transpose(1, 2)


class S4DKernel(torch.nn.Module):
    """The trainable S4D kernel of ``H`` channels: ``forward(length)`` → `s4d_kernel` ``(H, length)``.

    Parameters: ``log_dt (H,)`` drawn log-uniformly in ``[dt_min, dt_max]``; ``log_A_re`` (so that
    ``A_re = -exp(log_A_re) < 0``) and ``A_im`` from `s4d_init`; complex ``C`` stored as ``(H, N/2, 2)``
    reals (``torch.view_as_real``), as in the reference ``s4d.py``.
    """

    def __init__(self, channels: int, d_state: int = 64, init: str = "lin", dt_min: float = 1e-3,
                 dt_max: float = 1e-1):
        super().__init__()
        A_re, A_im = s4d_init(channels, d_state, init)
        self.log_dt = torch.nn.Parameter(torch.rand(channels) * (math.log(dt_max) - math.log(dt_min))
                                         + math.log(dt_min))
        self.log_A_re = torch.nn.Parameter(torch.log(-A_re))
        self.A_im = torch.nn.Parameter(A_im)
        self.C = torch.nn.Parameter(torch.view_as_real(torch.randn(channels, d_state // 2, dtype=torch.cfloat)))

    def modes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_dt (H,), A (H, N/2), C (H, N/2))``, ``A`` and ``C`` complex; fp16/bf16 parameters are
        taken in fp32 (complex numbers have no half-precision form here)."""
        work = _work_dtype(self.C.dtype)
        log_dt, log_A_re, A_im, C = (t.to(work) for t in (self.log_dt, self.log_A_re, self.A_im, self.C))
        return log_dt, torch.complex(-torch.exp(log_A_re), A_im), torch.view_as_complex(C)

    def forward(self, length: int) -> torch.Tensor:
        """The kernel ``(H, L)``, in fp32 for fp16/bf16 parameters."""
        log_dt, A, C = self.modes()
        return s4d_kernel(log_dt, A.real, A.imag, C, length)


class S4DLayer(torch.nn.Module):
    """One S4D layer (Gu et al. 2022): ``d_model`` independent diagonal SSMs, one per channel.

    ``x (batch, L, d_model)`` → ``(batch, L, d_model)``: ``y = K * x + D x`` per channel (``K`` from
    the `S4DKernel` ``ssm``, FFT convolution), then GELU and a position-wise linear map to
    ``2 d_model`` followed by a GLU, as in the reference ``s4d.py``.
    """

    def __init__(self, d_model: int, d_state: int = 64, init: str = "lin", dt_min: float = 1e-3,
                 dt_max: float = 1e-1):
        super().__init__()
        self.d_model = d_model
        self.ssm = S4DKernel(d_model, d_state, init, dt_min, dt_max)
        self.D = torch.nn.Parameter(torch.randn(d_model))
        self.out = torch.nn.Linear(d_model, 2 * d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_sequence("S4DLayer: x", x, self.d_model)
        y = _long_conv(x, self.ssm(x.shape[1]).to(x.dtype)) + self.D * x
        return F.glu(self.out(F.gelu(y)), dim=-1)


# ----------------------------------------------------------------------------- H3 (M9.7)
def shift_ssm_kernel(c: torch.Tensor, length: int) -> torch.Tensor:
    """Kernel of H3's shift SSM: ``A`` the ``N x N`` shift matrix, ``B = e_0``, ``C = c``.

    ``c (..., N)`` → ``K (..., L)``: ``K_k = c A^k e_0 = c_k`` for ``k < N`` and 0 after (``A^N = 0``),
    a finite impulse response: ``y_t = sum_{k < N} c_k u_{t-k}``, a short causal convolution.
    """
    length = check_positive_int("length", length)
    check_tensor("c", c, min_rank=1, floating=True)
    n = c.shape[-1]
    return F.pad(c, (0, length - n)) if length >= n else c[..., :length]


def h3_mix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shift_K: torch.Tensor, diag_K: torch.Tensor,
           D: torch.Tensor | None = None) -> torch.Tensor:
    """H3's core (Fu et al. 2023): ``O = Q ⊙ SSM_diag(SSM_shift(K) ⊙ V)``, per head, with outer products.

    ``q, k, v (batch, L, H, d_h)``; ``shift_K (H, d_h, L)`` one kernel per key channel; ``diag_K
    (H, d_h, d_h, L)`` one kernel per entry of the ``d_h x d_h`` state ``k̄_t v_t^T``; ``D (H, d_h, d_h)``
    the diagonal SSM's skip. Returns ``(batch, L, H, d_h)``:
    ``o_t[j] = sum_i q_t[i] (sum_{s<=t} diag_K[i, j, t-s] k̄_s[i] v_s[j] + D[i, j] k̄_t[i] v_t[j])``.
    With ``shift_K = e_0`` (identity), ``diag_K = 1`` (no decay) and ``D = 0`` this is causal linear
    attention ``o_t = q_t sum_{s<=t} k_s^T v_s`` per head.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"h3_mix: q, k, v must all be (batch, L, H, d_h), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    _, length, heads, dh = q.shape
    if tuple(shift_K.shape) != (heads, dh, length) or tuple(diag_K.shape) != (heads, dh, dh, length) \
            or (D is not None and tuple(D.shape) != (heads, dh, dh)):
        raise ValueError(f"h3_mix: need shift_K (H, d_h, L) = {(heads, dh, length)}, diag_K (H, d_h, d_h, L) = "
                         f"{(heads, dh, dh, length)}, D (H, d_h, d_h); got shift_K {tuple(shift_K.shape)}, "
                         f"diag_K {tuple(diag_K.shape)}, D {None if D is None else tuple(D.shape)}")
    out = q.dtype
    q, k, v = (t.to(_work_dtype(t.dtype)) for t in (q, k, v))
    k_bar = ssm_convolve(k.permute(0, 2, 3, 1), shift_K.to(k.dtype))             # (b, H, d_h, L)
    kv = k_bar[:, :, :, None] * v.permute(0, 2, 3, 1)[:, :, None]                # (b, H, i, j, L)
    state = ssm_convolve(kv, diag_K.to(kv.dtype))
    if D is not None:
        state = state + D.to(kv.dtype)[..., None] * kv
    return torch.einsum("blhi,bhijl->blhj", q, state).to(out)


class H3Layer(torch.nn.Module):
    """The H3 layer (Fu et al. 2023): SSM-built linear attention with a shift SSM and a diagonal SSM.

    ``x (batch, L, d_model)`` → ``(batch, L, d_model)``. ``q, k, v`` are three linear projections of
    ``x`` (ERRATA E9.3), split into ``H = d_model / head_dim`` heads; then `h3_mix` with a learnt
    shift kernel (`shift_ssm_kernel` of ``c (H, d_h, d_state)``) on ``k`` and an S4D diagonal SSM
    (S4D-Lin, one per entry of the ``d_h x d_h`` state) on ``k̄ ⊙ v``, and an output projection.
    """

    def __init__(self, d_model: int, d_state: int = 64, head_dim: int = 1, dt_min: float = 1e-3,
                 dt_max: float = 1e-1):
        super().__init__()
        if d_model % head_dim:
            raise ValueError(f"H3Layer: head_dim must divide d_model, got d_model {d_model}, head_dim {head_dim}")
        self.d_model, self.head_dim, self.heads = d_model, head_dim, d_model // head_dim
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.out = torch.nn.Linear(d_model, d_model)
        self.shift_c = torch.nn.Parameter(torch.randn(self.heads, head_dim, d_state) / math.sqrt(d_state))
        self.diag = S4DKernel(self.heads * head_dim * head_dim, d_state, "lin", dt_min, dt_max)
        self.D = torch.nn.Parameter(torch.randn(self.heads, head_dim, head_dim))

    def kernels(self, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(shift_K (H, d_h, L), diag_K (H, d_h, d_h, L), D (H, d_h, d_h))`` for `h3_mix`."""
        shape = (self.heads, self.head_dim, self.head_dim)
        return shift_ssm_kernel(self.shift_c, length), self.diag(length).reshape(*shape, length), self.D

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_sequence("H3Layer: x", x, self.d_model)
        b, length, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, length, 3, self.heads, self.head_dim).unbind(2)
        return self.out(h3_mix(q, k, v, *self.kernels(length)).reshape(b, length, self.d_model))


# ----------------------------------------------------------------------------- Mamba block (M9.10)
class MambaBlock(torch.nn.Module):
    """The Mamba mixer (Gu & Dao 2023), with the parameter names of the reference ``mamba_simple.Mamba``.

    ``x (batch, L, d_model)`` → ``(batch, L, d_model)``, with ``E = expand * d_model`` inner channels:

    1. ``in_proj``: ``x -> (u, z)``, each ``(batch, E, L)``;
    2. ``conv1d``: a causal depthwise convolution of width ``d_conv`` on ``u``, then SiLU;
    3. ``x_proj``: ``u -> (dt (dt_rank), B (N), C (N))`` per position, and ``dt_proj`` lifts ``dt``
       to ``E`` channels: the step ``delta = softplus(dt_proj(dt))`` is input dependent;
    4. `selective_scan` with ``A = -exp(A_log) (E, N)``, ``D``, and the gate ``z``: ``y * silu(z)``;
    5. ``out_proj``: ``E -> d_model``.

    ``dt_rank="auto"`` is ``ceil(d_model / 16)``. Initialisation as the reference: ``A = -(1..N)``
    (S4D-Real), ``D = 1``, ``dt_proj.bias`` the inverse softplus of steps log-uniform in
    ``[dt_min, dt_max]``. `step` decodes one token from a fixed-size state (`init_state`).
    """

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2, dt_rank="auto",
                 dt_min: float = 1e-3, dt_max: float = 1e-1, dt_init_floor: float = 1e-4, conv_bias: bool = True,
                 bias: bool = False):
        super().__init__()
        for name, val in (("d_model", d_model), ("d_state", d_state), ("d_conv", d_conv), ("expand", expand)):
            check_positive_int(name, val)
        self.d_model, self.d_state, self.d_conv = d_model, d_state, d_conv
        self.d_inner = expand * d_model
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else check_positive_int("dt_rank", dt_rank)
        e = self.d_inner
        self.in_proj = torch.nn.Linear(d_model, 2 * e, bias=bias)
        self.conv1d = torch.nn.Conv1d(e, e, d_conv, groups=e, padding=d_conv - 1, bias=conv_bias)
        self.x_proj = torch.nn.Linear(e, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = torch.nn.Linear(self.dt_rank, e, bias=True)
        self.A_log = torch.nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(e, 1))
        self.D = torch.nn.Parameter(torch.ones(e))
        self.out_proj = torch.nn.Linear(e, d_model, bias=bias)
        with torch.no_grad():
            std = self.dt_rank ** -0.5
            self.dt_proj.weight.uniform_(-std, std)
            dt = torch.exp(torch.rand(e) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            dt = dt.clamp(min=dt_init_floor)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def _A(self) -> torch.Tensor:
        """``A = -exp(A_log) (E, N)``, in at least fp32 (a half ``A_log`` is exponentiated in fp32)."""
        return -torch.exp(self.A_log.to(_work_dtype(self.A_log.dtype)))

    def _ssm_params(self, u: torch.Tensor):
        """``u (..., E)`` → ``dt (..., E)`` (before bias and softplus), ``B, C (..., N)``."""
        dt, B, C = self.x_proj(u).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return dt @ self.dt_proj.weight.T, B, C

    def forward(self, x: torch.Tensor, *, mode: str = "chunk", chunk_size: int = 64, return_state: bool = False):
        """``x (batch, L, d_model)`` → ``y``, or ``(y, state)`` for `step` to continue from."""
        _check_sequence("MambaBlock: x", x, self.d_model)
        length = x.shape[1]
        u, z = self.in_proj(x).transpose(1, 2).chunk(2, dim=1)                      # (b, E, L) each
        uc = F.silu(self.conv1d(u)[..., :length])                                    # causal: drop the tail
        dt, B, C = self._ssm_params(uc.transpose(1, 2))
        y, ssm_state = selective_scan(uc, dt.transpose(1, 2), self._A(), B.transpose(1, 2), C.transpose(1, 2),
                                      self.D, z, self.dt_proj.bias, True, True, mode=mode, chunk_size=chunk_size)
        out = self.out_proj(y.transpose(1, 2))
        if not return_state:
            return out
        conv_state = F.pad(u, (max(0, self.d_conv - length), 0))[..., -self.d_conv:]  # last d_conv inputs
        return out, (conv_state, ssm_state)

    def init_state(self, batch: int, device=None, dtype=torch.float32):
        """Zero state ``(conv_state (batch, E, d_conv), ssm_state (batch, E, N))``; its size is fixed in ``L``."""
        return (torch.zeros(batch, self.d_inner, self.d_conv, device=device, dtype=dtype),
                torch.zeros(batch, self.d_inner, self.d_state, device=device, dtype=dtype))

    def step(self, x_t: torch.Tensor, state):
        """One token ``x_t (batch, d_model)`` → ``(y_t (batch, d_model), new state)``; O(1) in the position.

        The recurrence of the full forward: the conv window shifts by one, and
        ``h = exp(delta A) h + delta B u``, ``y = <h, C> + D u``, ``y *= silu(z)``. The state is not
        modified in place.
        """
        check_tensor("x_t", x_t, floating=True)
        if x_t.dim() != 2 or x_t.shape[-1] != self.d_model:
            raise ValueError(f"MambaBlock.step: x_t must be (batch, d_model) with d_model = {self.d_model}, "
                             f"got {tuple(x_t.shape)}")
        conv_state, h = state
        expect = ((x_t.shape[0], self.d_inner, self.d_conv), (x_t.shape[0], self.d_inner, self.d_state))
        if (tuple(conv_state.shape), tuple(h.shape)) != expect:
            raise ValueError(f"MambaBlock.step: state must be (conv_state {expect[0]}, ssm_state {expect[1]}), "
                             f"got ({tuple(conv_state.shape)}, {tuple(h.shape)})")
        u, z = self.in_proj(x_t).chunk(2, dim=-1)                                    # (b, E)
        conv_state = torch.cat([conv_state[..., 1:], u[..., None].to(conv_state.dtype)], dim=-1)
        uc = (conv_state * self.conv1d.weight[:, 0]).sum(-1)
        if self.conv1d.bias is not None:
            uc = uc + self.conv1d.bias
        uc = F.silu(uc).to(x_t.dtype)
        dt, B, C = self._ssm_params(uc)
        delta = F.softplus(dt + self.dt_proj.bias)
        h = torch.exp(delta[..., None] * self._A()) * h + (delta * uc)[..., None] * B[:, None].to(h.dtype)
        y = (h * C[:, None]).sum(-1) + self.D * uc
        y = y * F.silu(z)
        return self.out_proj(y.to(x_t.dtype)), (conv_state, h)


# ----------------------------------------------------------------------------- Mamba-2 / SSD (M9.11)
def _check_ssd(fn: str, x, a, B, C):
    """``x (batch, L, H, P)``, ``a (batch, L, H)``, ``B, C (batch, L, G, N)`` with ``G`` dividing ``H``."""
    for name, t in (("x", x), ("a", a), ("B", B), ("C", C)):
        check_tensor(name, t, floating=True)
    if x.dim() != 4 or x.shape[1] == 0:
        raise ValueError(f"{fn}: x must be (batch, L, H, P) with L >= 1, got {tuple(x.shape)}")
    batch, length, heads, _ = x.shape
    if tuple(a.shape) != (batch, length, heads):
        raise ValueError(f"{fn}: a must be (batch, L, H) = {(batch, length, heads)} (x {tuple(x.shape)}), "
                         f"got {tuple(a.shape)}")
    for name, t in (("B", B), ("C", C)):
        if t.dim() != 4 or tuple(t.shape[:2]) != (batch, length) or t.shape[2] == 0 or heads % t.shape[2] \
                or t.shape[-1] != B.shape[-1]:
            raise ValueError(f"{fn}: {name} must be (batch, L, G, N) with (batch, L) = {(batch, length)}, G dividing "
                             f"H = {heads} and N shared by B and C; got B {tuple(B.shape)}, C {tuple(C.shape)}")
    work = _work_dtype(x.dtype, a.dtype, B.dtype, C.dtype)
    rep = heads // B.shape[2]
    return (x.to(work), a.to(work), B.to(work).repeat_interleave(rep, dim=2),
            C.to(work).repeat_interleave(heads // C.shape[2], dim=2))


def _ssd_initial_state(fn: str, h0, x: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``h0 (batch, H, P, N)`` in the compute dtype, zeros if ``None``."""
    shape = (x.shape[0], x.shape[2], x.shape[-1], B.shape[-1])
    if h0 is None:
        return x.new_zeros(shape)
    check_tensor("initial_state", h0, floating=True)
    if tuple(h0.shape) != shape:
        raise ValueError(f"{fn}: initial_state must be (batch, H, P, N) = {shape}, got {tuple(h0.shape)}")
    return h0.to(x.dtype)


def ssd_scan(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, initial_state=None,
             return_final_state: bool = False):
    """Loop reference for the scalar-decay SSM of Mamba-2 (SSD), one step at a time.

    ``x (batch, L, H, P)``, log decays ``a (batch, L, H)`` (``a = delta * A <= 0``), ``B, C (batch, L,
    G, N)`` (``G`` groups shared by ``H / G`` heads each). Per head, with a ``(P, N)`` state:
    ``h_t = exp(a_t) h_{t-1} + x_t B_t^T``, ``y_t = h_t C_t``. Returns ``y (batch, L, H, P)`` in ``x``'s
    dtype, and the final state ``(batch, H, P, N)`` if asked. (Mamba-2's ``x`` here is ``delta * x``.)
    """
    out = x.dtype
    x, a, B, C = _check_ssd("ssd_scan", x, a, B, C)
    batch, length, heads, p = x.shape
    h = _ssd_initial_state("ssd_scan", initial_state, x, B)
    ys = []
    for t in range(length):
        h = torch.exp(a[:, t])[..., None, None] * h + x[:, t, :, :, None] * B[:, t, :, None, :]
        ys.append((h * C[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, dim=1).to(out)
    return (y, h) if return_final_state else y


def ssd_matrix(a: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """The semiseparable matrix ``M = (C B^T) ∘ L``, ``L[t, s] = exp(a_{s+1} + ... + a_t)`` for ``s <= t``.

    ``a (batch, L, H)``, ``B, C (batch, L, H, N)`` → ``M (batch, H, L, L)``, lower triangular: the SSD
    "attention" matrix (Dao & Gu 2024), so that ``y = M x``.
    """
    decay = torch.exp(segsum(a.transpose(1, 2)))                                # (b, H, L, L)
    return torch.einsum("bthn,bshn->bhts", C, B) * decay


def ssd_attention_form(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """SSD as masked attention: ``y = ((C B^T) ∘ L) x`` per head, the quadratic form (see `ssd_matrix`).

    Shapes as in `ssd_scan`; equal to it (with a zero initial state). Queries are ``C``, keys ``B``,
    values ``x``, and the causal mask carries the decays ``L``: linear attention with a scalar gate.
    """
    out = x.dtype
    x, a, B, C = _check_ssd("ssd_attention_form", x, a, B, C)
    return torch.einsum("bhts,bshp->bthp", ssd_matrix(a, B, C), x).to(out)


def ssd_chunked(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int = 64,
                initial_state=None, return_final_state: bool = False):
    """The SSD chunked algorithm (Dao & Gu 2024, after ``ssd_minimal.py``); shapes as in `ssd_scan`.

    ``L`` is cut into chunks of ``chunk_size`` (a ragged tail is padded with ``a = 0``, ``x = B = C = 0``,
    which changes neither the outputs nor the final state). Four steps:

    1. inside each chunk, the attention form (`ssd_matrix` on the chunk);
    2. each chunk's own end state ``sum_s exp(a_{s+1} + ... + a_end) x_s B_s^T``;
    3. a recurrence over chunks passing states from chunk to chunk (scalar decays per chunk);
    4. each position reads the state that entered its chunk, decayed to it, through ``C_t``.

    Cost ``O(L T (N + P))`` for chunk length ``T`` instead of ``O(L^2)``; equal to `ssd_scan`.
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    out = x.dtype
    x, a, B, C = _check_ssd("ssd_chunked", x, a, B, C)
    init = _ssd_initial_state("ssd_chunked", initial_state, x, B)[:, None]   # (b, 1, H, P, N)
    batch, length, heads, p = x.shape
    pad = (-length) % chunk_size
    x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
    a = F.pad(a, (0, 0, 0, pad))
    n_chunks = (length + pad) // chunk_size
    x, a, B, C = (t.reshape(batch, n_chunks, chunk_size, *t.shape[2:]) for t in (x, a, B, C))
    a = a.permute(0, 3, 1, 2)                                                    # (b, H, c, T)

    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, torch.exp(segsum(a)), x)        # step 1
    to_end = F.pad(a.flip(-1).cumsum(-1)[..., :-1], (1, 0)).flip(-1)           # a_{s+1} + ... + a_{T-1}
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, torch.exp(to_end), x)                    # step 2
    states = torch.cat([init, states], dim=1)                                    # (b, c+1, H, P, N)
    chunk_decay = torch.exp(segsum(F.pad(a.sum(-1), (1, 0))))                  # (b, H, c+1, c+1)
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)                              # step 3
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states[:, :-1], torch.exp(a.cumsum(-1)))  # step 4
    y = (y_diag + y_off).reshape(batch, n_chunks * chunk_size, heads, p)[:, :length].to(out)
    return (y, states[:, -1]) if return_final_state else y
