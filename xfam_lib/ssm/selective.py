"""Selective SSMs (chapter 9): parallel scans, the selective scan in its sequential,
chunked and scan forms, and the Mamba block."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..utils import check_positive_int, check_tensor
from ._common import _check_numeric, _check_sequence, _out_dtype, _work_dtype

_SCAN_MODES = ("sequential", "chunk", "scan")
_SCAN_METHODS = ("hillis_steele", "blelloch")


# ----------------------------------------------------------------------------- scans
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


# ----------------------------------------------------------------------------- selective scan
def _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias):
    for name, t in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                    ("delta_bias", delta_bias)):
        if t is None and name in ("D", "z", "delta_bias"):             # the optional ones
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
    for that run the step loop inside all chunks at once instead (`_chunk_scan` with chunks of
    ``T = min(chunk_size, ceil(sqrt(L)))``, ``T + L / T`` steps, exponents ``<= 0`` for ``A <= 0``: no
    overflow), as do, off the CPU, chunks halved so far that this takes fewer steps (`_chunk_plan`).
    ``"scan"`` runs the Hillis–Steele `associative_scan` over ``L``. All modes agree in outputs, last
    state and gradients.
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
    factored, loop_chunk = None, None
    if mode == "chunk":
        factored, loop_chunk = _chunk_plan(dt, A_w, chunk_size, count_steps=u.device.type != "cpu")
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
            y, x = _chunk_scan(log_decay, drive, C_l, loop_chunk)

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


def _chunk_plan(dt: torch.Tensor, A: torch.Tensor, chunk_size: int, count_steps: bool):
    """``(factored, loop)``: the chunk of `_factored_chunk_scan` (None: use `_chunk_scan`) and the
    chunk of `_chunk_scan`.

    The loop form's chunk is ``T = ceil(sqrt(L))``, at most ``chunk_size``: it takes ``T + L / T``
    sequential steps, the fewest at ``T = sqrt(L)``. The factored form takes ``L / s`` steps with
    ``s`` from `_factored_chunk_size`. With ``count_steps`` (a GPU, where every step costs kernel
    launches) the form with fewer steps is taken: Mamba's decays (``A = -(1..16)``, ``delta`` from a
    softplus) halve ``s`` to 4 at ``L = 1024``, 256 steps against the loop's 32 + 32. On a CPU passes
    over memory cost more than steps, and the factored form is kept whenever it fits (at batch 2,
    ``d_inner`` 256, ``L`` 1024, ``N`` 16 on one core: chunks of 4 in 0.22 s, the loop form in
    0.59 s, the step loop in 0.52 s).
    """
    length = dt.shape[-1]
    loop = min(chunk_size, math.isqrt(length - 1) + 1)                  # ceil(sqrt(L))
    factored = _factored_chunk_size(dt, A, chunk_size)
    if count_steps and factored is not None and math.ceil(length / factored) > loop + math.ceil(length / loop):
        factored = None
    return factored, loop


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



def _factored_chunk_reference(dt, dtu, A, B_l, C_l, size: int):
    """`_factored_chunk_scan` as the algorithm reads: one chunk after another, ``(y, last_state)``.

    The same arguments, results and closed form per chunk (``c_t`` the sum of ``delta`` from the
    chunk's start, ``m`` the middle of its range, ``E_t = exp(A (c_t - m))``):
    ``x_t = E_t * (exp(A m) x_in + sum_{s <= t} delta_s B_s u_s / E_s)``, and the chunk's last state
    enters the next. None of the tuning (groups of chunks, reused buffers, time innermost): for
    reading and for tests, not for speed. ``size`` must keep every factor in range (`_chunk_plan`).
    """
    batch, dim, length = dt.shape
    B_l, C_l = (t.expand(batch, dim, length, -1) for t in (B_l, C_l))    # (b, d, L, N)
    x, ys = dt.new_zeros(batch, dim, A.shape[-1]), []
    for start in range(0, length, size):
        part = slice(start, start + size)
        c = dt[:, :, part, None].cumsum(-2)                              # (b, d, T, 1)
        m = (c.amax(-2, keepdim=True) + c.amin(-2, keepdim=True)) / 2   # (b, d, 1, 1)
        E = torch.exp(A[:, None, :] * (c - m))                           # (b, d, T, N)
        drive = dtu[:, :, part, None] * B_l[:, :, part]                  # delta_t u_t B_t: (b, d, T, N)
        states = E * (torch.exp(A[:, None, :] * m) * x[:, :, None] + (drive / E).cumsum(-2))
        ys.append((states * C_l[:, :, part]).sum(-1))
        x = states[:, :, -1]
    return torch.cat(ys, dim=-1), x


# ----------------------------------------------------------------------------- Mamba block
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
