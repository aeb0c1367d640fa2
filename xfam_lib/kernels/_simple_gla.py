"""Chunked scalar-gated linear attention (simple GLA) in Triton: forward, backward, autograd.

Imported by `xfam_lib.kernels` on first use (importing it imports Triton).

The recurrence, per (batch, head) matrix: ``S_t = g_t S_{t-1} + k_t v_t^T`` with one scalar
gate ``g_t = exp(log_g_t)`` per step, and ``o_t = scale * S_t^T q_t``. Chunks of ``BLOCK_C``
steps: inside a chunk, with ``b_t`` the cumulative log gate from the chunk's start,
``o_t = scale * (sum_{s <= t} (q_t . k_s) e^{b_t - b_s} v_s + e^{b_t} S^T q_t)``, where ``S`` is
the state entering the chunk, and the state leaving it is
``e^{B} S + sum_s e^{B - b_s} k_s v_s^T`` with ``B`` the chunk's total log gate. Every exponent
is <= 0, so nothing overflows. Tensors here are contiguous ``(B, L, d)`` stacks, ``log_g`` is
``(B, L)``, states are ``(B, d_k, d_v)`` in fp32; all products run in fp32.

The work is split as in fla's chunk kernels: a light sequential pass per matrix stores the
state entering every chunk, ``(B, NT, d_k, d_v)`` in fp32 for ``NT`` chunks, and then one
program instance per chunk and matrix does the heavy products, all chunks in parallel. The
backward does the same with the gradient of the state leaving every chunk.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ._mode import interpreted

# True when the kernels below were built for Triton's CPU interpreter.
INTERPRETED = interpreted()
# Each chunk is BLOCK_C steps: the part inside a chunk is a (BLOCK_C, BLOCK_C) matrix product.
BLOCK_C = 32


@triton.jit
def _load_f32(base, rows, n_rows, d, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows ``rows`` of a contiguous ``(n_rows, d)`` matrix as an fp32 ``(BLOCK_R, BLOCK_D)``
    tile; what lies outside the matrix reads as 0."""
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    return tl.load(base + rows[:, None] * d + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store(base, tile, rows, n_rows, d, BLOCK_D: tl.constexpr):
    """Store ``tile`` into rows ``rows`` of a contiguous ``(n_rows, d)`` matrix (inside only)."""
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    tl.store(base + rows[:, None] * d + cols[None, :], tile.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _chunk_gates(G, rows, length, BLOCK_C: tl.constexpr):
    """The gates of one chunk: ``from_start[t] = e^{b_t}``, the decays
    ``decay[t, s] = e^{b_t - b_s}`` for ``s <= t`` (0 above the diagonal), ``to_end[s] =
    e^{B - b_s}`` and ``e^{B}``. Steps past the end have gate 1 (log 0).

    ``b_t - b_s`` is summed directly, ``sum_{s < u <= t} log_g_u`` (a product of a 0/1 matrix
    and the gates), not subtracted: with strong decays ``b`` reaches hundreds and the
    difference of two such fp32 numbers would lose the digits that ``e^{b_t - b_s}`` needs.
    """
    g = tl.load(G + rows, mask=rows < length, other=0.0).to(tl.float32)
    idx = tl.arange(0, BLOCK_C)
    upto = (idx[None, :] <= idx[:, None]).to(tl.float32)                   # [t, u]: u <= t
    after = tl.where(idx[:, None] > idx[None, :], g[:, None], 0.0)          # [u, s]: g_u, u > s
    seg = tl.dot(upto, after, input_precision="ieee")                       # b_t - b_s
    decay = tl.exp(tl.where(idx[:, None] >= idx[None, :], seg, float("-inf")))
    to_end = tl.exp(tl.sum(tl.where(idx[:, None] == BLOCK_C - 1, seg, 0.0), 0))
    from_start = tl.exp(tl.cumsum(g, 0))
    return from_start, decay, to_end, tl.exp(tl.sum(g, 0))


@triton.jit
def _state_kernel(K, V, G, H0, H, HT, length, n_chunks, d_k, d_v,
                  BLOCK_C: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: the states of matrix ``b``. It walks the chunks in order from
    ``H0``, stores the state entering chunk ``c`` as ``H[b, c]`` and the final one in ``HT``;
    per chunk only one ``k^T v`` product (the heavy work is left to `_out_kernel`)."""
    b = tl.program_id(0).to(tl.int64)
    k_base, v_base = K + b * length * d_k, V + b * length * d_v
    ks = tl.arange(0, BLOCK_DK)
    state = _load_f32(H0 + b * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    for c in range(n_chunks):
        _store(H + (b * n_chunks + c) * d_k * d_v, state, ks, d_k, d_v, BLOCK_DV)
        rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
        k = _load_f32(k_base, rows, length, d_k, BLOCK_C, BLOCK_DK)
        v = _load_f32(v_base, rows, length, d_v, BLOCK_C, BLOCK_DV)
        _, _, to_end, whole = _chunk_gates(G + b * length, rows, length, BLOCK_C)
        k_to_end = k * to_end[:, None]                                           # (C, d_k)
        state = state * whole + tl.dot(tl.trans(k_to_end), v, input_precision="ieee")
    _store(HT + b * d_k * d_v, state, ks, d_k, d_v, BLOCK_DV)


@triton.jit
def _out_kernel(Q, K, V, G, H, O, length, n_chunks, d_k, d_v, scale,
                BLOCK_C: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: the outputs of chunk ``c`` of matrix ``b``, from the chunk's
    ``q, k, v``, its gates and the state entering it, ``H[b, c]``. No instance waits for
    another: all chunks of all matrices run in parallel."""
    c, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
    q = _load_f32(Q + b * length * d_k, rows, length, d_k, BLOCK_C, BLOCK_DK)
    k = _load_f32(K + b * length * d_k, rows, length, d_k, BLOCK_C, BLOCK_DK)
    v = _load_f32(V + b * length * d_v, rows, length, d_v, BLOCK_C, BLOCK_DV)
    state = _load_f32(H + (b * n_chunks + c) * d_k * d_v, tl.arange(0, BLOCK_DK), d_k, d_v,
                      BLOCK_DK, BLOCK_DV)
    from_start, decay, _, _ = _chunk_gates(G + b * length, rows, length, BLOCK_C)
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * decay            # (C, C)
    inside = tl.dot(scores, v, input_precision="ieee")
    from_state = tl.dot(q * from_start[:, None], state, input_precision="ieee")
    _store(O + b * length * d_v, (inside + from_state) * scale, rows, length, d_v, BLOCK_DV)


@triton.jit
def _d_state_kernel(Q, G, DO, DHT, DH, DH0, length, n_chunks, d_k, d_v, scale,
                    BLOCK_C: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: the state gradients of matrix ``b``. It walks the chunks in
    reverse from ``DHT``, stores ``dS``, the gradient of the state leaving chunk ``c``, as
    ``DH[b, c]``, and at the start the gradient of the initial state in ``DH0``."""
    b = tl.program_id(0).to(tl.int64)
    q_base, do_base = Q + b * length * d_k, DO + b * length * d_v
    ks = tl.arange(0, BLOCK_DK)
    d_state = _load_f32(DHT + b * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    for i in range(n_chunks):
        c = n_chunks - 1 - i
        _store(DH + (b * n_chunks + c) * d_k * d_v, d_state, ks, d_k, d_v, BLOCK_DV)
        rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
        q = _load_f32(q_base, rows, length, d_k, BLOCK_C, BLOCK_DK)
        do = _load_f32(do_base, rows, length, d_v, BLOCK_C, BLOCK_DV)
        from_start, _, _, whole = _chunk_gates(G + b * length, rows, length, BLOCK_C)
        q_from_start = q * (from_start * scale)[:, None]
        d_state = d_state * whole + tl.dot(tl.trans(q_from_start), do, input_precision="ieee")
    _store(DH0 + b * d_k * d_v, d_state, ks, d_k, d_v, BLOCK_DV)


@triton.jit
def _grad_kernel(Q, K, V, G, H, DO, DH, DQ, DK, DV, length, n_chunks, d_k, d_v, scale,
                 BLOCK_C: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: ``dq``, ``dk``, ``dv`` of chunk ``c`` of matrix ``b``, from the
    chunk's inputs, the state entering it (``H[b, c]``, for ``dq``) and the gradient of the
    state leaving it (``DH[b, c]``, for ``dk`` and ``dv``); all chunks in parallel."""
    c, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
    ks = tl.arange(0, BLOCK_DK)
    q = _load_f32(Q + b * length * d_k, rows, length, d_k, BLOCK_C, BLOCK_DK)
    k = _load_f32(K + b * length * d_k, rows, length, d_k, BLOCK_C, BLOCK_DK)
    v = _load_f32(V + b * length * d_v, rows, length, d_v, BLOCK_C, BLOCK_DV)
    do = _load_f32(DO + b * length * d_v, rows, length, d_v, BLOCK_C, BLOCK_DV)
    state = _load_f32(H + (b * n_chunks + c) * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    d_state = _load_f32(DH + (b * n_chunks + c) * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    from_start, decay, to_end, _ = _chunk_gates(G + b * length, rows, length, BLOCK_C)
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * decay * scale      # [t, s]
    d_scores = tl.dot(do, tl.trans(v), input_precision="ieee") * decay * scale
    dq = tl.dot(d_scores, k, input_precision="ieee")
    dq += from_start[:, None] * tl.dot(do, tl.trans(state), input_precision="ieee") * scale
    dk = tl.dot(tl.trans(d_scores), q, input_precision="ieee")
    dk += to_end[:, None] * tl.dot(v, tl.trans(d_state), input_precision="ieee")
    dv = tl.dot(tl.trans(scores), do, input_precision="ieee")
    dv += to_end[:, None] * tl.dot(k, d_state, input_precision="ieee")
    _store(DQ + b * length * d_k, dq, rows, length, d_k, BLOCK_DK)
    _store(DK + b * length * d_k, dk, rows, length, d_k, BLOCK_DK)
    _store(DV + b * length * d_v, dv, rows, length, d_v, BLOCK_DV)


def _blocks(q, v, block_c=BLOCK_C):
    """Chunk length and head sizes padded to a power of two (at least 16, for ``tl.dot``)."""
    return {"BLOCK_C": block_c, "BLOCK_DK": max(16, triton.next_power_of_2(q.shape[-1])),
            "BLOCK_DV": max(16, triton.next_power_of_2(v.shape[-1]))}


def _states(k, v, log_g, h0, blocks):
    """The fp32 states entering every chunk, ``(B, NT, d_k, d_v)``, and the final state."""
    (batch, length, d_k), d_v = k.shape, v.shape[-1]
    n_chunks = triton.cdiv(length, blocks["BLOCK_C"])
    h = k.new_empty(batch, n_chunks, d_k, d_v, dtype=torch.float32)
    h_t = torch.empty_like(h0)
    _state_kernel[(batch,)](k, v, log_g, h0, h, h_t, length, n_chunks, d_k, d_v, **blocks)
    return h, h_t


class ChunkSimpleGLA(torch.autograd.Function):
    """Simple GLA on contiguous ``(B, L, d)`` tensors, ``log_g (B, L)`` and an fp32 initial
    state ``(B, d_k, d_v)``; returns the output and the fp32 final state.

    Forward: `_state_kernel` (one instance per matrix) stores the state entering each chunk,
    then `_out_kernel` (one per chunk and matrix) computes the outputs. Backward: the states
    again, `_d_state_kernel` (one per matrix, in reverse) stores the gradient of the state
    leaving each chunk, then `_grad_kernel` (one per chunk and matrix) computes dq, dk, dv.
    """

    @staticmethod
    def forward(ctx, q, k, v, log_g, h0, scale: float):
        (batch, length, d_k), d_v = q.shape, v.shape[-1]
        out = torch.empty_like(v)
        h_t = torch.empty_like(h0)
        if batch:
            blocks = _blocks(q, v)
            h, h_t = _states(k, v, log_g, h0, blocks)
            _out_kernel[(h.shape[1], batch)](q, k, v, log_g, h, out, length, h.shape[1], d_k,
                                             d_v, scale, **blocks)
        ctx.save_for_backward(q, k, v, log_g, h0, h_t)
        ctx.scale = scale
        return out, h_t

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_h_t):
        q, k, v, log_g, h0, h_t = ctx.saved_tensors
        (batch, length, d_k), d_v = q.shape, v.shape[-1]
        f32 = {"dtype": torch.float32}
        dq, dk = torch.empty_like(q, **f32), torch.empty_like(k, **f32)
        dv, dh0 = torch.empty_like(v, **f32), torch.empty_like(h0)
        if batch:
            blocks = _blocks(q, v)
            h, _ = _states(k, v, log_g, h0, blocks)               # recomputed, not saved
            d_out, dh = d_out.contiguous(), torch.empty_like(h)
            n_chunks = h.shape[1]
            _d_state_kernel[(batch,)](q, log_g, d_out, d_h_t.contiguous(), dh, dh0, length,
                                      n_chunks, d_k, d_v, ctx.scale, **blocks)
            _grad_kernel[(n_chunks, batch)](q, k, v, log_g, h, d_out, dh, dq, dk, dv, length,
                                            n_chunks, d_k, d_v, ctx.scale, **blocks)
        # Every path from step t on carries e^{c_t} (c: the cumulative log gate from the start);
        # q_t multiplies terms that carry +c_t, k_t terms that carry -c_t, and the final state
        # all carry +c_L. Hence dL/dc_t = q_t.dq_t - k_t.dk_t (+ <dS_L, S_L> at t = L), and
        # log_g_s enters every c_t with t >= s: a reversed cumulative sum.
        d_cum = (q.float() * dq).sum(-1) - (k.float() * dk).sum(-1)             # (B, L)
        d_cum[:, -1] += (d_h_t * h_t).sum((-2, -1))
        d_log_g = d_cum.flip(-1).cumsum(-1).flip(-1)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_log_g.to(log_g.dtype), dh0,
                None)
