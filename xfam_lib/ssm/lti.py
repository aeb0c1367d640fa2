"""Linear time-invariant SSMs (chapter 9): discretisation, the kernel, the
recurrence and the FFT convolution; S4D's diagonal layer; H3, linear attention built from SSMs."""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from ..utils import check_positive_int, check_tensor
from ._common import (_broadcast_batch, _check_numeric, _check_sequence, _is_diagonal, _out_dtype, _phi1,
                      _real_dtype, _work_dtype)

_METHODS = ("zoh", "bilinear", "euler")


# ----------------------------------------------------------------------------- discretisation
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

    Mamba's `selective_scan` mixes them: ``exp(dA)`` with the Euler ``B_bar = delta B``.
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


# ----------------------------------------------------------------------------- LTI kernel, recurrence, conv
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
    """Loop reference: ``x_k = A_bar x_{k-1} + B_bar u_k``, ``y_k = C x_k``, ``x_{-1} = 0``.

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
    if u.numel() == 0 or K.numel() == 0:     # an empty batch: FFT backends reject it; the (empty) direct sum
        return (u[..., :, None] * K[..., None, :]).sum(-1).to(out)
    n = 2 * length
    if work.is_complex:
        y = torch.fft.ifft(torch.fft.fft(u, n=n) * torch.fft.fft(K, n=n), n=n)
    else:
        y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(K, n=n), n=n)
    return y[..., :length].to(out)


# ----------------------------------------------------------------------------- S4D
_S4D_INITS = ("lin", "inv", "real", "random")


def s4d_init(d_model: int, d_state: int, init: str = "lin") -> tuple[torch.Tensor, torch.Tensor]:
    """The S4D initial eigenvalues ``A = A_re + i A_im``, each ``(d_model, d_state // 2)`` (Gu et al. 2022).

    Only one of each conjugate pair is kept (``d_state`` must be even); the kernel adds the other
    half as ``2 * Re``. Mode ``n = 0 .. N/2-1``:

    * ``"lin"`` (S4D-Lin): ``A_re = -1/2``, ``A_im = pi n`` (frequencies on a linear grid, like a Fourier basis);
    * ``"inv"`` (S4D-Inv): ``A_re = -1/2``, ``A_im = (N / pi) (N / (2n + 1) - 1)`` (an approximation of the
      imaginary parts of S4D-LegS, the eigenvalues of HiPPO-LegS's normal part);
    * ``"real"`` (S4D-Real): ``A = -(n + 1)``, real (HiPPO-LegS's own diagonal; Mamba's initial ``A``);
    * ``"random"``: per channel, the ``N/2`` eigenvalues with the largest imaginary parts (one of each
      conjugate pair) of the stable random matrix ``G / sqrt(N) - I``, ``G`` standard normal drawn from
      torch's global generator; real parts capped at ``-0.01`` so that every mode decays.
    """
    d_model = check_positive_int("d_model", d_model)
    d_state = check_positive_int("d_state", d_state)
    if d_state % 2:
        raise ValueError(f"s4d_init: d_state must be even (conjugate pairs), got {d_state}")
    if init not in _S4D_INITS:
        raise ValueError(f"s4d_init: init must be one of {_S4D_INITS}, got {init!r}")
    n = torch.arange(d_state // 2, dtype=torch.float32)
    if init == "random":
        G = torch.randn(d_model, d_state, d_state, dtype=torch.float64)
        ev = torch.linalg.eigvals(G / math.sqrt(d_state) - torch.eye(d_state, dtype=torch.float64))
        ev = ev.gather(-1, ev.imag.argsort(dim=-1, descending=True))[:, : d_state // 2]
        return ev.real.clamp_max(-1e-2).float(), ev.imag.float()
    if init == "real":
        return -(n + 1).expand(d_model, -1).clone(), torch.zeros(d_model, d_state // 2)
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


# ----------------------------------------------------------------------------- H3
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
    ``x``, split into ``H = d_model / head_dim`` heads; then `h3_mix` with a learnt
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
