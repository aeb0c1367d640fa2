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
        A_bar = torch.linalg.solve(left, eye + dA / 2)
        B_bar = torch.linalg.solve(left, dB[..., None])[..., 0]
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
    docstring). Diagonal: a Vandermonde sum ``K_k = sum_n C_n B_n A_n^k``. Dense: the Krylov vectors
    ``A^j B`` by doubling (``[V, A^m V]``, then ``A^m -> A^2m``), ``O(log L)`` matrix products.
    Then ``y = ssm_convolve(u, K)`` equals ``ssm_recurrence(A_bar, B_bar, C, u)``.
    """
    fn = "ssm_kernel"
    length = check_positive_int("length", length)
    diagonal = _check_lti(fn, A_bar, B_bar, C)
    out = _out_dtype(A_bar.dtype, B_bar.dtype, C.dtype)
    work = _work_dtype(A_bar.dtype, B_bar.dtype, C.dtype)
    A_bar, B_bar, C = A_bar.to(work), B_bar.to(work), C.to(work)
    if diagonal:
        k = torch.arange(length, device=A_bar.device, dtype=A_bar.real.dtype)
        powers = torch.pow(A_bar[..., None], k)                           # (..., N, L)
        return ((C * B_bar)[..., None] * powers).sum(-2).to(out)
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
    chunks of ``chunk_size`` (the last may be shorter), solves each chunk in parallel through the
    decay matrix ``exp(segsum(delta A))`` (exponents ``<= 0`` for ``A <= 0``: no overflow at any
    decay) and carries the state from chunk to chunk; ``"scan"`` runs the Hillis–Steele
    `associative_scan` over ``L``. All modes agree in outputs, last state and gradients.
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
    log_decay = dt[..., None] * A.to(work)[:, None, :]                   # (batch, d, L, N): delta_t A
    drive = (dt * uw)[..., None] * _bc_layout(B.to(work), dim)           # (batch, d, L, N): delta_t B_t u_t
    C_l = _bc_layout(C.to(work), dim).expand(-1, -1, length, -1)         # (batch|1, d|1, L, N)

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
    """Chunked form: inside a chunk ``x_t = exp(cum_t) x_in + sum_{s<=t} exp(segsum_{t,s}) drive_s``."""
    batch, dim, length, n = log_decay.shape
    x = log_decay.new_zeros(batch, dim, n)                               # state entering the chunk
    ys = []
    for s0 in range(0, length, chunk_size):
        s1 = min(s0 + chunk_size, length)
        a = log_decay[:, :, s0:s1].transpose(-1, -2)                     # (b, d, N, T)
        w = drive[:, :, s0:s1].transpose(-1, -2)                         # (b, d, N, T)
        inner = (torch.exp(segsum(a)) @ w[..., None])[..., 0]            # zero-state response (b, d, N, T)
        states = inner + torch.exp(a.cumsum(-1)) * x[..., None]          # plus the carried state, decayed
        ys.append((states.transpose(-1, -2) * C_l[:, :, s0:s1]).sum(-1))
        x = states[..., -1]
    return torch.cat(ys, dim=-1), x
