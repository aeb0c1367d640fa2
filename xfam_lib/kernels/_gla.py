"""Chunked gated linear attention with one gate per key dimension (GLA) in Triton: forward,
backward, autograd.

Imported by `xfam_lib.kernels` on first use (importing it imports Triton).

The recurrence, per (batch, head) matrix: ``S_t = diag(g_t) S_{t-1} + k_t v_t^T`` with a gate
vector ``g_t = exp(log_g_t)`` of size ``d_k``, and ``o_t = scale * S_t^T q_t``. Chunks of
``BLOCK_C`` steps; ``b_t`` is the cumulative log gate from the chunk's start (a vector), ``S``
the state entering the chunk, ``B`` the chunk's total log gate:
``o_t = scale * (sum_{s <= t} (q_t ⊙ e^{b_t - b_s}) . k_s v_s + (q_t ⊙ e^{b_t})^T S)`` and the
state leaving it is ``e^{B} ⊙ S + sum_s (k_s ⊙ e^{B - b_s}) v_s^T``.

With a scalar gate (`_simple_gla`) ``e^{b_t - b_s}`` is one number per pair, a ``(C, C)``
matrix. Here it differs per key dimension, so the part inside a chunk becomes a matrix product
only through the factoring ``(q_t ⊙ e^{b_t}) . (k_s ⊙ e^{-b_s})``. That factoring fails on
strong gates: with ``log_g = -5`` per step, ``b`` reaches -320 over a 64-step chunk, so
``e^{-b_s}`` overflows fp32 (largest ``e^{88.7}``) to ``inf`` while ``e^{b_t}`` underflows to 0,
and the product is ``inf * 0 = nan``, although every true decay ``e^{b_t - b_s}`` is <= 1.

The kernels use GLA's secondary chunking (as in fla's ``chunk_gla``): each chunk is cut into
sub-chunks of ``BLOCK_S`` steps. For a query sub-chunk ``i`` and an earlier key sub-chunk
``j``, the factors are taken relative to ``r``, the cumulative gate at the start of ``i``:
``(q_t ⊙ e^{b_t - r}) . (k_s ⊙ e^{r - b_s})``; every ``t`` lies at or after that start and every
``s`` before it, so both exponents are <= 0 and a matrix product computes the block. Inside the
diagonal block (``s`` and ``t`` in one sub-chunk) no reference serves both sides, so the decays
are formed in log space, as a ``(BLOCK_S, BLOCK_S, d_k)`` tile of ``e^{b_t - b_s}``. No exponent
anywhere is positive, so nothing overflows; a factor that underflows to 0 multiplies a true
decay smaller still. ``BLOCK_S = 16`` is the smallest size ``tl.dot`` accepts. (A reference per
chunk alone would not do: the exponents on each side of it still span half the chunk's decay.)

Every exponent is a difference of two cumulative gates, and with strong gates those reach
hundreds within a chunk: their fp32 difference would keep only about 5 correct digits of a decay
near 1 (errors of 3e-5 at log gates drawn from [-20, 0]). So ``b`` is precomputed and held in
fp64 (``(B, Lp, d_k)``, ``Lp`` a multiple of ``BLOCK_C``; padding steps have gate 1, so ``b`` is
non-increasing through every chunk, padding included), each exponent is formed in fp64 and
rounded once to fp32, and the diagonal block works from ``b`` relative to its sub-chunk's
start. Everything else runs in fp32: tensors are contiguous ``(B, L, d)`` stacks, states
``(B, d_k, d_v)``, and all products.

The work is split as in `_simple_gla`: one sequential program per matrix stores the state
entering every chunk, then one program per chunk and matrix computes that chunk's outputs
(backward: the gradient of the state leaving every chunk, then ``dq, dk, dv`` per chunk).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ._mode import interpreted
from ._simple_gla import _blocks, _load_f32, _store

# True when the kernels below were built for Triton's CPU interpreter.
INTERPRETED = interpreted()
BLOCK_C = 64            # steps per chunk: the state is updated once per chunk
BLOCK_S = 16            # steps per sub-chunk: the tiles of the part inside a chunk


@triton.jit
def _load_b(base, rows, d, BLOCK_D: tl.constexpr):
    """Rows ``rows`` of the fp64 cumulative gates ``b (Lp, d)`` (all inside: ``b`` is padded);
    columns past ``d`` read as 0."""
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] >= 0) & (cols[None, :] < d)          # the row term: a 2-D shape
    return tl.load(base + rows[:, None] * d + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _load_b_row(base, row, d, BLOCK_D: tl.constexpr):
    """Row ``row`` of ``b (Lp, d)`` as an fp64 vector."""
    cols = tl.arange(0, BLOCK_D)
    return tl.load(base + row * d + cols, mask=cols < d, other=0.0)


@triton.jit
def _diag_decay(b, BLOCK_S: tl.constexpr):
    """``e^{b_t - b_s}`` for the steps ``t, s`` of one sub-chunk (``b`` their cumulative
    gates, from any common start): a ``(BLOCK_S, BLOCK_S, BLOCK_DK)`` tile, 0 where ``t < s``.
    The exponent is formed before ``exp`` and masked, so it is never positive."""
    idx = tl.arange(0, BLOCK_S)
    causal = (idx[:, None] >= idx[None, :])[:, :, None]
    return tl.exp(tl.where(causal, b[:, None, :] - b[None, :, :], float("-inf")))


@triton.jit
def _state_kernel(K, V, Bc, H0, H, HT, length, padded, n_chunks, d_k, d_v,
                  BLOCK_C: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: the states of matrix ``n``. It walks the chunks in order from
    ``H0``, stores the state entering chunk ``c`` as ``H[n, c]`` and the final one in ``HT``;
    per chunk one product of the keys, decayed to the chunk's end, with the values."""
    n = tl.program_id(0).to(tl.int64)
    k_base, v_base = K + n * length * d_k, V + n * length * d_v
    b_base = Bc + n * padded * d_k
    ks = tl.arange(0, BLOCK_DK)
    state = _load_f32(H0 + n * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    for c in range(n_chunks):
        _store(H + (n * n_chunks + c) * d_k * d_v, state, ks, d_k, d_v, BLOCK_DV)
        rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
        k = _load_f32(k_base, rows, length, d_k, BLOCK_C, BLOCK_DK)
        v = _load_f32(v_base, rows, length, d_v, BLOCK_C, BLOCK_DV)
        b = _load_b(b_base, rows, d_k, BLOCK_DK)
        b_end = _load_b_row(b_base, c * BLOCK_C + BLOCK_C - 1, d_k, BLOCK_DK)  # chunk's total
        k_end = k * tl.exp((b_end[None, :] - b).to(tl.float32))         # decayed to the end
        state = state * tl.exp(b_end.to(tl.float32))[:, None]
        state += tl.dot(tl.trans(k_end), v, input_precision="ieee")
    _store(HT + n * d_k * d_v, state, ks, d_k, d_v, BLOCK_DV)


@triton.jit
def _out_kernel(Q, K, V, Bc, H, O, length, padded, n_chunks, d_k, d_v, scale,
                BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
                BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: the outputs of chunk ``c`` of matrix ``n``, from the chunk's
    inputs and the state entering it, ``H[n, c]``; all chunks of all matrices in parallel.
    One query sub-chunk at a time: from the state, from each earlier key sub-chunk (one
    product, factored relative to the sub-chunk's start), from itself (in log space)."""
    c, n = tl.program_id(0), tl.program_id(1).to(tl.int64)
    q_base, k_base = Q + n * length * d_k, K + n * length * d_k
    v_base, o_base = V + n * length * d_v, O + n * length * d_v
    b_base = Bc + n * padded * d_k
    ks, idx = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_S)
    c0 = c * BLOCK_C
    state = _load_f32(H + (n * n_chunks + c) * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    for i in range(tl.cdiv(tl.minimum(length - c0, BLOCK_C), BLOCK_S)):
        t0 = c0 + i * BLOCK_S
        rows = t0 + idx
        q = _load_f32(q_base, rows, length, d_k, BLOCK_S, BLOCK_DK)
        k = _load_f32(k_base, rows, length, d_k, BLOCK_S, BLOCK_DK)
        v = _load_f32(v_base, rows, length, d_v, BLOCK_S, BLOCK_DV)
        b = _load_b(b_base, rows, d_k, BLOCK_DK)
        out = tl.dot(q * tl.exp(b.to(tl.float32)), state, input_precision="ieee")
        ref = _load_b_row(b_base, t0, d_k, BLOCK_DK)               # b at the start of i
        local = (b - ref[None, :]).to(tl.float32)                      # <= 0
        q_ref = q * tl.exp(local)
        for j in range(i):
            rows_j = c0 + j * BLOCK_S + idx
            k_j = _load_f32(k_base, rows_j, length, d_k, BLOCK_S, BLOCK_DK)
            v_j = _load_f32(v_base, rows_j, length, d_v, BLOCK_S, BLOCK_DV)
            b_j = _load_b(b_base, rows_j, d_k, BLOCK_DK)
            k_ref = k_j * tl.exp((ref[None, :] - b_j).to(tl.float32))
            scores = tl.dot(q_ref, tl.trans(k_ref), input_precision="ieee")
            out += tl.dot(scores, v_j, input_precision="ieee")
        decay = _diag_decay(local, BLOCK_S)                            # (S, S, d_k)
        scores = tl.sum(q[:, None, :] * k[None, :, :] * decay, 2)
        out += tl.dot(scores, v, input_precision="ieee")
        _store(o_base, out * scale, rows, length, d_v, BLOCK_DV)


@triton.jit
def _d_state_kernel(Q, Bc, DO, DHT, DH, DH0, length, padded, n_chunks, d_k, d_v, scale,
                    BLOCK_C: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: the state gradients of matrix ``n``. It walks the chunks in
    reverse from ``DHT``, stores ``dS``, the gradient of the state leaving chunk ``c``, as
    ``DH[n, c]``, and at the start the gradient of the initial state in ``DH0``."""
    n = tl.program_id(0).to(tl.int64)
    q_base, do_base = Q + n * length * d_k, DO + n * length * d_v
    b_base = Bc + n * padded * d_k
    ks = tl.arange(0, BLOCK_DK)
    d_state = _load_f32(DHT + n * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    for i in range(n_chunks):
        c = n_chunks - 1 - i
        _store(DH + (n * n_chunks + c) * d_k * d_v, d_state, ks, d_k, d_v, BLOCK_DV)
        rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
        q = _load_f32(q_base, rows, length, d_k, BLOCK_C, BLOCK_DK)
        do = _load_f32(do_base, rows, length, d_v, BLOCK_C, BLOCK_DV) * scale
        b = _load_b(b_base, rows, d_k, BLOCK_DK)
        b_end = _load_b_row(b_base, c * BLOCK_C + BLOCK_C - 1, d_k, BLOCK_DK)
        q_start = q * tl.exp(b.to(tl.float32))                          # decayed from the start
        d_state = d_state * tl.exp(b_end.to(tl.float32))[:, None]
        d_state += tl.dot(tl.trans(q_start), do, input_precision="ieee")
    _store(DH0 + n * d_k * d_v, d_state, ks, d_k, d_v, BLOCK_DV)


@triton.jit
def _grad_kernel(Q, K, V, Bc, H, DO, DH, DQ, DK, DV, length, padded, n_chunks, d_k, d_v, scale,
                 BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
                 BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: ``dq``, ``dk``, ``dv`` of chunk ``c`` of matrix ``n``, from the
    chunk's inputs, the state entering it (``H[n, c]``, for ``dq``) and the gradient of the
    state leaving it (``DH[n, c]``, for ``dk`` and ``dv``); all chunks in parallel. The
    sub-chunk blocks are those of `_out_kernel`, with ``dA[t, s] = scale * do_t . v_s``, the
    gradient of the scores: ``dq`` per query sub-chunk, then ``dk, dv`` per key sub-chunk."""
    c, n = tl.program_id(0), tl.program_id(1).to(tl.int64)
    q_base, k_base = Q + n * length * d_k, K + n * length * d_k
    v_base, do_base = V + n * length * d_v, DO + n * length * d_v
    b_base = Bc + n * padded * d_k
    ks, idx = tl.arange(0, BLOCK_DK), tl.arange(0, BLOCK_S)
    c0 = c * BLOCK_C
    n_sub = tl.cdiv(tl.minimum(length - c0, BLOCK_C), BLOCK_S)
    state = _load_f32(H + (n * n_chunks + c) * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    for i in range(n_sub):                                              # query sub-chunk i
        t0 = c0 + i * BLOCK_S
        rows = t0 + idx
        k = _load_f32(k_base, rows, length, d_k, BLOCK_S, BLOCK_DK)
        v = _load_f32(v_base, rows, length, d_v, BLOCK_S, BLOCK_DV)
        do = _load_f32(do_base, rows, length, d_v, BLOCK_S, BLOCK_DV) * scale
        b = _load_b(b_base, rows, d_k, BLOCK_DK)
        dq = tl.dot(do, tl.trans(state), input_precision="ieee") * tl.exp(b.to(tl.float32))
        ref = _load_b_row(b_base, t0, d_k, BLOCK_DK)
        local = (b - ref[None, :]).to(tl.float32)
        dq_ref = tl.zeros((BLOCK_S, BLOCK_DK), dtype=tl.float32)
        for j in range(i):
            rows_j = c0 + j * BLOCK_S + idx
            k_j = _load_f32(k_base, rows_j, length, d_k, BLOCK_S, BLOCK_DK)
            v_j = _load_f32(v_base, rows_j, length, d_v, BLOCK_S, BLOCK_DV)
            b_j = _load_b(b_base, rows_j, d_k, BLOCK_DK)
            d_scores = tl.dot(do, tl.trans(v_j), input_precision="ieee")
            k_ref = k_j * tl.exp((ref[None, :] - b_j).to(tl.float32))
            dq_ref += tl.dot(d_scores, k_ref, input_precision="ieee")
        dq += dq_ref * tl.exp(local)
        d_scores = tl.dot(do, tl.trans(v), input_precision="ieee")
        decay = _diag_decay(local, BLOCK_S)
        dq += tl.sum(d_scores[:, :, None] * k[None, :, :] * decay, 1)
        _store(DQ + n * length * d_k, dq, rows, length, d_k, BLOCK_DK)

    d_state = _load_f32(DH + (n * n_chunks + c) * d_k * d_v, ks, d_k, d_v, BLOCK_DK, BLOCK_DV)
    b_end = _load_b_row(b_base, c0 + BLOCK_C - 1, d_k, BLOCK_DK)
    for j in range(n_sub):                                              # key sub-chunk j
        t0 = c0 + j * BLOCK_S
        rows = t0 + idx
        q = _load_f32(q_base, rows, length, d_k, BLOCK_S, BLOCK_DK)
        k = _load_f32(k_base, rows, length, d_k, BLOCK_S, BLOCK_DK)
        v = _load_f32(v_base, rows, length, d_v, BLOCK_S, BLOCK_DV)
        do = _load_f32(do_base, rows, length, d_v, BLOCK_S, BLOCK_DV) * scale
        b = _load_b(b_base, rows, d_k, BLOCK_DK)
        to_end = tl.exp((b_end[None, :] - b).to(tl.float32))
        dk = tl.dot(v, tl.trans(d_state), input_precision="ieee") * to_end
        dv = tl.dot(k * to_end, d_state, input_precision="ieee")
        for i in range(j + 1, n_sub):                                   # later query sub-chunks
            rows_i = c0 + i * BLOCK_S + idx
            q_i = _load_f32(q_base, rows_i, length, d_k, BLOCK_S, BLOCK_DK)
            do_i = _load_f32(do_base, rows_i, length, d_v, BLOCK_S, BLOCK_DV) * scale
            b_i = _load_b(b_base, rows_i, d_k, BLOCK_DK)
            ref = _load_b_row(b_base, c0 + i * BLOCK_S, d_k, BLOCK_DK)
            q_ref = q_i * tl.exp((b_i - ref[None, :]).to(tl.float32))
            k_back = tl.exp((ref[None, :] - b).to(tl.float32))
            scores = tl.dot(q_ref, tl.trans(k * k_back), input_precision="ieee")
            d_scores = tl.dot(do_i, tl.trans(v), input_precision="ieee")
            dv += tl.dot(tl.trans(scores), do_i, input_precision="ieee")
            dk += tl.dot(tl.trans(d_scores), q_ref, input_precision="ieee") * k_back
        local = (b - _load_b_row(b_base, t0, d_k, BLOCK_DK)[None, :]).to(tl.float32)
        decay = _diag_decay(local, BLOCK_S)
        scores = tl.sum(q[:, None, :] * k[None, :, :] * decay, 2)
        d_scores = tl.dot(do, tl.trans(v), input_precision="ieee")
        dk += tl.sum(d_scores[:, :, None] * q[:, None, :] * decay, 0)
        dv += tl.dot(tl.trans(scores), do, input_precision="ieee")
        _store(DK + n * length * d_k, dk, rows, length, d_k, BLOCK_DK)
        _store(DV + n * length * d_v, dv, rows, length, d_v, BLOCK_DV)


def chunk_cumsum(log_g: torch.Tensor) -> torch.Tensor:
    """``b``: the cumulative sums of ``log_g (B, L, d_k)`` restarting every ``BLOCK_C`` steps, in
    fp32, padded with gate 1 to ``(B, Lp, d_k)``, ``Lp`` a multiple of ``BLOCK_C``."""
    batch, length, d_k = log_g.shape
    padded = -(-length // BLOCK_C) * BLOCK_C
    g = torch.zeros(batch, padded, d_k, dtype=torch.float64, device=log_g.device)
    g[:, :length] = log_g
    return g.view(batch, -1, BLOCK_C, d_k).cumsum(2).view(batch, padded, d_k)


def _states(k, v, b, h0, blocks):
    """The fp32 states entering every chunk, ``(B, NT, d_k, d_v)``, and the final state."""
    (batch, length, d_k), d_v = k.shape, v.shape[-1]
    n_chunks = triton.cdiv(length, blocks["BLOCK_C"])
    h = k.new_empty(batch, n_chunks, d_k, d_v, dtype=torch.float32)
    h_t = torch.empty_like(h0)
    _state_kernel[(batch,)](k, v, b, h0, h, h_t, length, b.shape[1], n_chunks, d_k, d_v,
                            **blocks)
    return h, h_t


class ChunkGLA(torch.autograd.Function):
    """GLA on contiguous ``(B, L, d)`` tensors, ``log_g (B, L, d_k)`` and an fp32 initial state
    ``(B, d_k, d_v)``; returns the output and the fp32 final state.

    Forward: `_state_kernel` (one instance per matrix) stores the state entering each chunk,
    then `_out_kernel` (one per chunk and matrix) computes the outputs. Backward: the states
    again, `_d_state_kernel` (one per matrix, in reverse) stores the gradient of the state
    leaving each chunk, then `_grad_kernel` (one per chunk and matrix) computes dq, dk, dv.
    """

    @staticmethod
    def forward(ctx, q, k, v, log_g, h0, scale: float):
        (batch, length, d_k), d_v = q.shape, v.shape[-1]
        b = chunk_cumsum(log_g)
        out = torch.empty_like(v)
        h_t = torch.empty_like(h0)
        if batch:
            blocks = _blocks(q, v, BLOCK_C)
            h, h_t = _states(k, v, b, h0, blocks)
            _out_kernel[(h.shape[1], batch)](q, k, v, b, h, out, length, b.shape[1],
                                             h.shape[1], d_k, d_v, scale, BLOCK_S=BLOCK_S,
                                             **blocks)
        ctx.save_for_backward(q, k, v, log_g, b, h0, h_t)
        ctx.scale = scale
        return out, h_t

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_h_t):
        q, k, v, log_g, b, h0, h_t = ctx.saved_tensors
        (batch, length, d_k), d_v = q.shape, v.shape[-1]
        f32 = {"dtype": torch.float32}
        dq, dk = torch.empty_like(q, **f32), torch.empty_like(k, **f32)
        dv, dh0 = torch.empty_like(v, **f32), torch.empty_like(h0)
        if batch:
            blocks = _blocks(q, v, BLOCK_C)
            h, _ = _states(k, v, b, h0, blocks)                   # recomputed, not saved
            d_out, dh = d_out.contiguous(), torch.empty_like(h)
            padded, n_chunks = b.shape[1], h.shape[1]
            _d_state_kernel[(batch,)](q, b, d_out, d_h_t.contiguous(), dh, dh0, length, padded,
                                      n_chunks, d_k, d_v, ctx.scale, **blocks)
            _grad_kernel[(n_chunks, batch)](q, k, v, b, h, d_out, dh, dq, dk, dv, length, padded,
                                            n_chunks, d_k, d_v, ctx.scale, BLOCK_S=BLOCK_S,
                                            **blocks)
        # Per key dimension, every path from step t on carries e^{c_t} (c: the cumulative log
        # gate from the start): q_t multiplies terms that carry +c_t, k_t terms that carry -c_t,
        # and row i of the final state +c_L. Hence dL/dc_t = q_t ⊙ dq_t - k_t ⊙ dk_t (+ the rows
        # of dS_L ⊙ S_L summed at t = L), and log_g_s enters every c_t with t >= s: a reversed
        # cumulative sum.
        d_cum = q.float() * dq - k.float() * dk                                # (B, L, d_k)
        d_cum[:, -1] += (d_h_t * h_t).sum(-1)
        d_log_g = d_cum.flip(1).cumsum(1).flip(1)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_log_g.to(log_g.dtype), dh0,
                None)
