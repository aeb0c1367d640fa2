"""Mamba's selective scan in Triton, fused as in its CUDA kernel: forward, backward, autograd.

Imported by `xfam_lib.kernels` on first use (importing it imports Triton).

One program instance owns one batch element and a block of ``BLOCK_D`` channels; their states,
a ``(BLOCK_D, N)`` tile in fp32, live in registers for the whole sequence. Each step reads
``u_t``, ``delta_t`` (and ``z_t``) for its channels and the ``N`` numbers of ``B_t`` and ``C_t``
once, and writes ``y_t`` once:

    delta_t <- softplus(delta_t + delta_bias)       (each only if asked)
    x_t = exp(delta_t A) * x_{t-1} + delta_t u_t B_t
    y_t = <x_t, C_t> + D u_t,    y_t *= silu(z_t)

so the ``(batch, d_inner, L, N)`` states, ``N`` times the size of ``u``, never reach memory.
The kernel is sequential in time: each program instance walks its ``L`` steps one after another,
parallel only across its channels and states (and across program instances). Mamba's CUDA
kernel fuses the same loop but is also parallel in time: a thread block per channel splits a
chunk of the sequence among its threads and combines their stretches with a block-wide prefix
scan of the ``(exp(delta A), delta B u)`` pairs, carrying the state between chunks; this one
does no such scan.
``u, delta, z`` are contiguous ``(batch, d_inner, L)``; ``B`` and ``C`` keep their layout
(fixed, input-dependent or grouped) and are addressed through strides: channel ``d`` reads
row ``d // per_group`` of its batch's ``(groups, N, L)`` block. Everything runs in fp32.

The backward runs the recurrence in reverse, carrying the gradient of the state. It needs each
``x_{t-1}``, which cannot be recovered from ``x_t`` by dividing by ``exp(delta_t A)`` (that
factor underflows for strong decays). So the forward saves the state every ``CHUNK`` steps
(``N / CHUNK`` times the size of ``u``), and the backward, chunk by chunk from the end,
recomputes the chunk's states from its checkpoint into a scratch buffer of ``CHUNK`` steps per
channel, then walks the chunk backwards reading them: ``N (L / CHUNK + CHUNK)`` numbers per
channel and one extra forward pass of arithmetic, instead of all ``N L`` states.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ._mode import interpreted

# True when the kernels below were built for Triton's CPU interpreter.
INTERPRETED = interpreted()
# Steps between the states the forward saves; channels per program instance (`block_d`).
CHUNK = 64
TILE = 2048             # state numbers per program instance: (channels, padded N)


def block_d(n: int) -> int:
    """Channels per program instance at state size ``n``: 32, fewer for large states, so that
    a ``(BLOCK_D, N)`` tile stays within ``TILE`` numbers (the backward keeps several such
    tiles in registers; at N = 256 and 32 channels they spill)."""
    return min(32, max(1, TILE // max(2, triton.next_power_of_2(n))))


@triton.jit
def _softplus(x):
    """``log(1 + e^x)`` as torch's ``F.softplus`` (``x`` itself above 20), accurate where the
    result is tiny: ``log1p(w)`` as ``log(1 + w) * w / ((1 + w) - 1)`` (Kahan)."""
    w = tl.exp(-tl.abs(x))
    one_w = 1.0 + w
    log1p = tl.where(one_w == 1.0, w, tl.log(one_w) * w / (one_w - 1.0))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)


@triton.jit
def _fwd_kernel(U, DELTA, A, B, C, D, Z, BIAS, Y, LAST, CKPT,
                d_inner, n, length, b_batch, b_group, b_n, b_l, b_per_group,
                c_batch, c_group, c_n, c_l, c_per_group,
                HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                SOFTPLUS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                CHUNK: tl.constexpr):
    """One program instance: batch ``b``, channels ``ch``, all ``L`` steps in order."""
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ns = tl.arange(0, BLOCK_N)
    in_d, in_n = ch < d_inner, ns < n
    tile = in_d[:, None] & in_n[None, :]
    row = (b * d_inner + ch) * length                                    # (BLOCK_D,) into u, y
    A_ = tl.load(A + ch[:, None] * n + ns[None, :], mask=tile, other=0.0)   # fp32
    D_ = tl.load(D + ch, mask=in_d, other=0.0) if HAS_D else 0.0
    bias = tl.load(BIAS + ch, mask=in_d, other=0.0) if HAS_BIAS else 0.0
    b_at = b * b_batch + (ch // b_per_group)[:, None] * b_group + ns[None, :] * b_n
    c_at = b * c_batch + (ch // c_per_group)[:, None] * c_group + ns[None, :] * c_n
    B_rows, C_rows = B + b_at, C + c_at                                  # + t * (step stride)
    chan = (b * d_inner + ch)[:, None]
    states = chan * n + ns[None, :]                                      # into (b, d, N)
    n_chunks = tl.cdiv(length, CHUNK)
    x = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    for t in range(length):
        if t % CHUNK == 0:                                               # checkpoint x_{t-1}
            tl.store(CKPT + (chan * n_chunks + t // CHUNK) * n + ns[None, :], x, mask=tile)
        at = row + t
        u = tl.load(U + at, mask=in_d, other=0.0).to(tl.float32)
        dt = tl.load(DELTA + at, mask=in_d, other=0.0).to(tl.float32) + bias
        if SOFTPLUS:
            dt = _softplus(dt)
        B_t = tl.load(B_rows + t * b_l, mask=tile, other=0.0).to(tl.float32)
        C_t = tl.load(C_rows + t * c_l, mask=tile, other=0.0).to(tl.float32)
        x = tl.exp(dt[:, None] * A_) * x + (dt * u)[:, None] * B_t
        y = tl.sum(x * C_t, 1) + D_ * u
        if HAS_Z:
            z = tl.load(Z + at, mask=in_d, other=0.0).to(tl.float32)
            y *= z / (1.0 + tl.exp(-z))                                  # silu(z)
        tl.store(Y + at, y.to(Y.dtype.element_ty), mask=in_d)
    tl.store(LAST + states, x, mask=tile)


@triton.jit
def _bwd_kernel(U, DELTA, A, B, C, D, Z, BIAS, CKPT, SCRATCH, DY, DLAST,
                DU, DDELTA, DZ, DA, DB, DC, DD,
                d_inner, n, length, b_batch, b_group, b_n, b_l, b_per_group,
                c_batch, c_group, c_n, c_l, c_per_group,
                HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                SOFTPLUS: tl.constexpr, B_VARIES: tl.constexpr, C_VARIES: tl.constexpr,
                B_ONE_ROW: tl.constexpr, C_ONE_ROW: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr):
    """One program instance: the gradients of batch ``b``, channels ``ch``, steps from last to
    first, carrying ``g``, the gradient of the state ``x_t`` from steps after ``t``.

    Per chunk: recompute its states from the checkpoint into ``SCRATCH`` (``x_{t-1}`` at
    ``t - start``), then walk it backwards. ``u, delta, z`` get per-step gradients; ``A, D`` and
    a fixed ``B, C`` sum theirs in registers and write them once, per batch element
    (``DA, DD, DB, DC`` as ``(batch, d_inner, N)``); a time-varying ``B_t, C_t``, shared by the
    channels of a group, is summed into the fp32 ``DB, DC`` of its layout by atomic adds, first
    over the block (``*_ONE_ROW``: all its channels read one row) when it can.
    """
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ns = tl.arange(0, BLOCK_N)
    in_d, in_n = ch < d_inner, ns < n
    tile = in_d[:, None] & in_n[None, :]
    row = (b * d_inner + ch) * length
    A_ = tl.load(A + ch[:, None] * n + ns[None, :], mask=tile, other=0.0)
    D_ = tl.load(D + ch, mask=in_d, other=0.0) if HAS_D else 0.0
    bias = tl.load(BIAS + ch, mask=in_d, other=0.0) if HAS_BIAS else 0.0
    b_at = b * b_batch + (ch // b_per_group)[:, None] * b_group + ns[None, :] * b_n
    c_at = b * c_batch + (ch // c_per_group)[:, None] * c_group + ns[None, :] * c_n
    B_rows, C_rows = B + b_at, C + c_at                                  # + t * (step stride)
    chan = (b * d_inner + ch)[:, None]
    states = chan * n + ns[None, :]
    scratch = chan * (CHUNK * n) + ns[None, :]                           # + (t - start) * n
    b_row = b * b_batch + (tl.program_id(1) * BLOCK_D // b_per_group) * b_group + ns * b_n
    c_row = b * c_batch + (tl.program_id(1) * BLOCK_D // c_per_group) * c_group + ns * c_n
    n_chunks = tl.cdiv(length, CHUNK)

    g = tl.load(DLAST + states, mask=tile, other=0.0)
    dA = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dB = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dC = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    dD = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for i in range(n_chunks):
        i_chunk = n_chunks - 1 - i
        start = i_chunk * CHUNK
        end = tl.minimum(start + CHUNK, length)
        x = tl.load(CKPT + (chan * n_chunks + i_chunk) * n + ns[None, :], mask=tile, other=0.0)
        for t in range(start, end):                                      # 1. recompute
            tl.store(SCRATCH + scratch + (t - start) * n, x, mask=tile)
            at = row + t
            u = tl.load(U + at, mask=in_d, other=0.0).to(tl.float32)
            dt = tl.load(DELTA + at, mask=in_d, other=0.0).to(tl.float32) + bias
            if SOFTPLUS:
                dt = _softplus(dt)
            B_t = tl.load(B_rows + t * b_l, mask=tile, other=0.0).to(tl.float32)
            x = tl.exp(dt[:, None] * A_) * x + (dt * u)[:, None] * B_t
        tl.debug_barrier()
        for j in range(end - start):                                     # 2. walk backwards
            t = end - 1 - j
            x_prev = tl.load(SCRATCH + scratch + (t - start) * n, mask=tile, other=0.0)
            at = row + t
            u = tl.load(U + at, mask=in_d, other=0.0).to(tl.float32)
            pre = tl.load(DELTA + at, mask=in_d, other=0.0).to(tl.float32) + bias
            dt = _softplus(pre) if SOFTPLUS else pre
            B_t = tl.load(B_rows + t * b_l, mask=tile, other=0.0).to(tl.float32)
            C_t = tl.load(C_rows + t * c_l, mask=tile, other=0.0).to(tl.float32)
            decay = tl.exp(dt[:, None] * A_)
            x = decay * x_prev + (dt * u)[:, None] * B_t
            dy = tl.load(DY + at, mask=in_d, other=0.0).to(tl.float32)
            if HAS_Z:                                                    # out = y silu(z)
                z = tl.load(Z + at, mask=in_d, other=0.0).to(tl.float32)
                gate = 1.0 / (1.0 + tl.exp(-z))                          # sigmoid(z)
                y = tl.sum(x * C_t, 1) + D_ * u
                tl.store(DZ + at, dy * y * gate * (1.0 + z * (1.0 - gate)), mask=in_d)
                dy *= z * gate
            g += dy[:, None] * C_t                                       # dL/dx_t
            dC_t = dy[:, None] * x
            dB_t = g * (dt * u)[:, None]
            g_B = tl.sum(g * B_t, 1)
            d_decay = g * x_prev * decay                                 # dL/d(delta_t A)
            du = g_B * dt + dy * D_
            ddt = g_B * u + tl.sum(d_decay * A_, 1)
            if SOFTPLUS:
                ddt = tl.where(pre > 20.0, ddt, ddt / (1.0 + tl.exp(-pre)))
            tl.store(DU + at, du, mask=in_d)
            tl.store(DDELTA + at, ddt, mask=in_d)
            dA += d_decay * dt[:, None]
            dD += dy * u
            if B_VARIES:
                if B_ONE_ROW:
                    tl.atomic_add(DB + b_row + t * b_l, tl.sum(dB_t, 0), mask=in_n)
                else:
                    tl.atomic_add(DB + b_at + t * b_l, dB_t, mask=tile)
            else:
                dB += dB_t
            if C_VARIES:
                if C_ONE_ROW:
                    tl.atomic_add(DC + c_row + t * c_l, tl.sum(dC_t, 0), mask=in_n)
                else:
                    tl.atomic_add(DC + c_at + t * c_l, dC_t, mask=tile)
            else:
                dC += dC_t
            g *= decay                                                   # to x_{t-1}
        tl.debug_barrier()
    tl.store(DA + states, dA, mask=tile)
    if HAS_D:
        tl.store(DD + b * d_inner + ch, dD, mask=in_d)
    if not B_VARIES:
        tl.store(DB + states, dB, mask=tile)
    if not C_VARIES:
        tl.store(DC + states, dC, mask=tile)


def _layout(X: torch.Tensor, d_inner: int):
    """``B`` or ``C`` as the kernels address it: ``(strides of batch, group, N, step; channels
    per group)`` and whether it varies in time."""
    if X.dim() == 2:                                                     # fixed (d_inner, N)
        return (0, X.shape[1], 1, 0, 1), False
    if X.dim() == 3:                                                     # (batch, N, L): one group
        return (X.stride(0), 0, X.stride(1), X.stride(2), d_inner), True
    return (*X.stride(), d_inner // X.shape[1]), True                    # (batch, G, N, L)


def _one_row(per_group: int, d_inner: int, block: int) -> bool:
    """Whether every block of ``block`` channels reads a single row of ``B`` (or ``C``)."""
    return all(start // per_group == (min(start + block, d_inner) - 1) // per_group
               for start in range(0, d_inner, block))


class SelectiveScan(torch.autograd.Function):
    """The fused scan on contiguous ``u, delta, z (batch, d_inner, L)``, fp32 ``A (d_inner,
    N)``, ``D`` and ``delta_bias``, and contiguous ``B, C`` in any layout; returns ``y`` (in
    ``u``'s dtype) and the fp32 last state ``(batch, d_inner, N)``."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus: bool):
        batch, d_inner, length = u.shape
        n = A.shape[1]
        n_chunks = triton.cdiv(length, CHUNK)
        y = torch.empty_like(u)
        last = u.new_empty(batch, d_inner, n, dtype=torch.float32)
        ckpt = u.new_empty(batch, d_inner, n_chunks, n, dtype=torch.float32)
        b_layout, _ = _layout(B, d_inner)
        c_layout, _ = _layout(C, d_inner)
        flags = _flags(D, z, delta_bias, softplus, n)
        if batch:
            _fwd_kernel[(batch, triton.cdiv(d_inner, flags["BLOCK_D"]))](
                u, delta, A, B, C, _or(D, A), _or(z, u), _or(delta_bias, A), y, last, ckpt,
                d_inner, n, length, *b_layout, *c_layout, **flags)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, ckpt)
        ctx.softplus = softplus
        return y, last

    @staticmethod
    @once_differentiable
    def backward(ctx, d_y, d_last):
        u, delta, A, B, C, D, z, delta_bias, ckpt = ctx.saved_tensors
        batch, d_inner, length = u.shape
        n = A.shape[1]
        (b_layout, b_varies), (c_layout, c_varies) = _layout(B, d_inner), _layout(C, d_inner)
        f32 = {"dtype": torch.float32}
        du, d_delta = torch.empty_like(u, **f32), torch.empty_like(u, **f32)
        dz = torch.empty_like(u, **f32) if z is not None else None
        per_batch = u.new_zeros(batch, d_inner, n, **f32)
        dA, dD = torch.zeros_like(per_batch), u.new_zeros(batch, d_inner, **f32)
        dB = torch.zeros_like(B, **f32) if b_varies else torch.zeros_like(per_batch)
        dC = torch.zeros_like(C, **f32) if c_varies else torch.zeros_like(per_batch)
        if batch:
            scratch = u.new_empty(batch, d_inner, CHUNK, n, **f32)
            _bwd_kernel[(batch, triton.cdiv(d_inner, block_d(n)))](
                u, delta, A, B, C, _or(D, A), _or(z, u), _or(delta_bias, A), ckpt, scratch,
                d_y.contiguous(), d_last.contiguous(), du, d_delta, _or(dz, du), dA, dB, dC, dD,
                d_inner, n, length, *b_layout, *c_layout,
                B_VARIES=b_varies, C_VARIES=c_varies,
                B_ONE_ROW=_one_row(b_layout[-1], d_inner, block_d(n)),
                C_ONE_ROW=_one_row(c_layout[-1], d_inner, block_d(n)),
                **_flags(D, z, delta_bias, ctx.softplus, n))
        if not b_varies:                                                 # summed over the batch
            dB = dB.sum(0)
        if not c_varies:
            dC = dC.sum(0)
        return (du.to(u.dtype), d_delta.to(delta.dtype), dA.sum(0), dB.to(B.dtype),
                dC.to(C.dtype), dD.sum(0) if D is not None else None,
                dz.to(z.dtype) if z is not None else None,
                d_delta.sum((0, 2)) if delta_bias is not None else None, None)


def _or(tensor, stand_in):
    """``tensor``, or for an absent optional input a pointer the kernel never reads."""
    return stand_in if tensor is None else tensor


def _flags(D, z, delta_bias, softplus, n):
    return {"HAS_D": D is not None, "HAS_Z": z is not None, "HAS_BIAS": delta_bias is not None,
            "SOFTPLUS": softplus, "BLOCK_D": block_d(n),
            "BLOCK_N": max(2, triton.next_power_of_2(n)), "CHUNK": CHUNK}
