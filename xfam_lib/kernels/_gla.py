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
start. Everything else is fp32: tensors are contiguous ``(B, L, d)`` stacks, states
``(B, d_k, d_v)``, every decay and every accumulator. The matrix products take their operands
in the input dtype, as in `_simple_gla`: fp16/bf16 tiles on tensor cores, each tile scaled by
its decays (all <= 1) before it is rounded; the states, state gradients and the scores (summed
unscaled) through `_mode.dot_rescaled`, so that no fp16 tile overflows; fp32 tiles as exact
fp32 products.

The work is split as in `_simple_gla`: a sequential pass per ``(BLOCK_K, BLOCK_V)`` tile of
each matrix's state stores the state entering every chunk, then one program per chunk, matrix
and block of columns computes that chunk's outputs, summing over the key dimension in blocks
of ``BLOCK_K`` (at most 32, for the diagonal's ``(BLOCK_S, BLOCK_S, BLOCK_K)`` decays); the
backward stores the gradient of the state leaving every chunk, then computes ``dq, dk`` (per
block of key columns) and ``dv`` (per block of value columns).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ._mode import INTERPRETED, dot, dot_rescaled  # noqa: F401  (INTERPRETED: read by the wrappers)
from ._simple_gla import _load, _store
from ._simple_gla import launch_settings as _simple_settings

BLOCK_C = 64            # steps per chunk: the state is updated once per chunk
BLOCK_S = 16            # steps per sub-chunk: the tiles of the part inside a chunk


@triton.jit
def _load_row(base, row, cols, n_cols):
    """Row ``row`` of a contiguous ``(·, n_cols)`` matrix at columns ``cols``, as a vector."""
    return tl.load(base + row * n_cols + cols, mask=cols < n_cols, other=0.0)


@triton.jit
def _diag_decay(b, BLOCK_S: tl.constexpr):
    """``e^{b_t - b_s}`` for the steps ``t, s`` of one sub-chunk (``b`` their cumulative
    gates, from any common start): a ``(BLOCK_S, BLOCK_S, BLOCK_K)`` tile, 0 where ``t < s``.
    The exponent is formed before ``exp`` and masked, so it is never positive."""
    idx = tl.arange(0, BLOCK_S)
    causal = (idx[:, None] >= idx[None, :])[:, :, None]
    return tl.exp(tl.where(causal, b[:, None, :] - b[None, :, :], float("-inf")))


@triton.jit
def _row_products(X, rows_x, Y, rows_y, length, d, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """``X[rows_x] Y[rows_y]^T`` for two contiguous ``(length, d)`` matrices: a ``(BLOCK_S,
    BLOCK_S)`` fp32 tile, summed over ``d`` in blocks of ``BLOCK_D``."""
    acc = tl.zeros((BLOCK_S, BLOCK_S), dtype=tl.float32)
    for d0 in range(0, d, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        acc = dot(_load(X, rows_x, cols, length, d), tl.trans(_load(Y, rows_y, cols, length, d)),
                  acc, X.dtype.element_ty)
    return acc


@triton.jit
def _cross_scores(Q, K, Bc, rows_i, rows_j, t0, length, padded, d_k,
                  BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr):
    """``A[t, s] = sum_f q_tf k_sf e^{b_tf - b_sf}`` for query sub-chunk ``rows_i`` (starting
    at step ``t0``) and an earlier key sub-chunk ``rows_j``: one product per block of key
    columns, factored relative to ``r = b[t0]`` so that both sides' exponents are <= 0."""
    acc = tl.zeros((BLOCK_S, BLOCK_S), dtype=tl.float32)
    for k0 in range(0, d_k, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        ref = _load_row(Bc, t0, ks, d_k)
        q = _load(Q, rows_i, ks, length, d_k).to(tl.float32)
        k = _load(K, rows_j, ks, length, d_k).to(tl.float32)
        q_ref = q * tl.exp((_load(Bc, rows_i, ks, padded, d_k) - ref[None, :]).to(tl.float32))
        k_ref = k * tl.exp((ref[None, :] - _load(Bc, rows_j, ks, padded, d_k)).to(tl.float32))
        acc = dot(q_ref, tl.trans(k_ref), acc, Q.dtype.element_ty)
    return acc


@triton.jit
def _diag_scores(Q, K, Bc, rows, t0, length, padded, d_k,
                 BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr):
    """``A[t, s]`` of `_cross_scores` inside one sub-chunk (``s <= t``, 0 above the
    diagonal), from the decays in log space: no reference serves both sides."""
    acc = tl.zeros((BLOCK_S, BLOCK_S), dtype=tl.float32)
    for k0 in range(0, d_k, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        local = (_load(Bc, rows, ks, padded, d_k)
                 - _load_row(Bc, t0, ks, d_k)[None, :]).to(tl.float32)   # <= 0
        q = _load(Q, rows, ks, length, d_k).to(tl.float32)
        k = _load(K, rows, ks, length, d_k).to(tl.float32)
        acc += tl.sum(q[:, None, :] * k[None, :, :] * _diag_decay(local, BLOCK_S), 2)
    return acc


@triton.jit
def _state_kernel(K, V, Bc, H0, H, HT, length, padded, n_chunks, d_k, d_v,
                  BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program instance: rows ``ks``, columns ``vs`` of the states of matrix ``n``. It
    walks the chunks in order from ``H0``, stores the state entering chunk ``c`` as
    ``H[n, c]`` and the final one in ``HT``; per chunk one product of the keys, decayed to
    the chunk's end, with the values."""
    ks = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    n = tl.program_id(2).to(tl.int64)
    k_base, v_base = K + n * length * d_k, V + n * length * d_v
    b_base = Bc + n * padded * d_k
    state = _load(H0 + n * d_k * d_v, ks, vs, d_k, d_v)
    for c in range(n_chunks):
        _store(H + (n * n_chunks + c) * d_k * d_v, state, ks, vs, d_k, d_v)
        rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
        k = _load(k_base, rows, ks, length, d_k).to(tl.float32)
        v = _load(v_base, rows, vs, length, d_v)
        b = _load(b_base, rows, ks, padded, d_k)
        b_end = _load_row(b_base, c * BLOCK_C + BLOCK_C - 1, ks, d_k)       # chunk's total
        k_end = k * tl.exp((b_end[None, :] - b).to(tl.float32))            # decayed to the end
        state = dot(tl.trans(k_end), v, state * tl.exp(b_end.to(tl.float32))[:, None],
                    K.dtype.element_ty)
    _store(HT + n * d_k * d_v, state, ks, vs, d_k, d_v)


@triton.jit
def _out_kernel(Q, K, V, Bc, H, O, length, padded, n_chunks, d_k, d_v, scale,
                BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program instance: output columns ``vs`` of chunk ``c`` of matrix ``n``, from the
    chunk's inputs and the state entering it, ``H[n, c]``; all chunks of all matrices in
    parallel. One query sub-chunk at a time: from the state, from itself (in log space),
    from each earlier key sub-chunk (factored relative to the sub-chunk's start)."""
    vs = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    c, n = tl.program_id(1), tl.program_id(2).to(tl.int64)
    dtype = Q.dtype.element_ty
    q_base, k_base = Q + n * length * d_k, K + n * length * d_k
    v_base, b_base = V + n * length * d_v, Bc + n * padded * d_k
    h_base = H + (n * n_chunks + c) * d_k * d_v
    idx = tl.arange(0, BLOCK_S)
    c0 = c * BLOCK_C
    for i in range(tl.cdiv(tl.minimum(length - c0, BLOCK_C), BLOCK_S)):
        t0 = c0 + i * BLOCK_S
        rows = t0 + idx
        out = tl.zeros((BLOCK_S, BLOCK_V), dtype=tl.float32)
        for k0 in range(0, d_k, BLOCK_K):                          # from the state
            ks = k0 + tl.arange(0, BLOCK_K)
            q = _load(q_base, rows, ks, length, d_k).to(tl.float32)
            q_start = q * tl.exp(_load(b_base, rows, ks, padded, d_k).to(tl.float32))
            out = dot_rescaled(q_start, _load(h_base, ks, vs, d_k, d_v), out, dtype)
        scores = _diag_scores(q_base, k_base, b_base, rows, t0, length, padded, d_k,
                              BLOCK_K, BLOCK_S)
        out = dot_rescaled(scores, _load(v_base, rows, vs, length, d_v), out, dtype)
        for j in range(i):
            rows_j = c0 + j * BLOCK_S + idx
            scores = _cross_scores(q_base, k_base, b_base, rows, rows_j, t0, length, padded,
                                   d_k, BLOCK_K, BLOCK_S)
            out = dot_rescaled(scores, _load(v_base, rows_j, vs, length, d_v), out, dtype)
        _store(O + n * length * d_v, out * scale, rows, vs, length, d_v)


@triton.jit
def _d_state_kernel(Q, Bc, DO, DHT, DH, DH0, length, padded, n_chunks, d_k, d_v, scale,
                    BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program instance: rows ``ks``, columns ``vs`` of the state gradients of matrix
    ``n``. It walks the chunks in reverse from ``DHT``, stores ``dS``, the gradient of the
    state leaving chunk ``c``, as ``DH[n, c]``, and at the start the gradient of the initial
    state in ``DH0``."""
    ks = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    n = tl.program_id(2).to(tl.int64)
    q_base, do_base = Q + n * length * d_k, DO + n * length * d_v
    b_base = Bc + n * padded * d_k
    d_state = _load(DHT + n * d_k * d_v, ks, vs, d_k, d_v).to(tl.float32)
    for i in range(n_chunks):
        c = n_chunks - 1 - i
        _store(DH + (n * n_chunks + c) * d_k * d_v, d_state, ks, vs, d_k, d_v)
        rows = c * BLOCK_C + tl.arange(0, BLOCK_C)
        q = _load(q_base, rows, ks, length, d_k).to(tl.float32)
        do = _load(do_base, rows, vs, length, d_v)
        b = _load(b_base, rows, ks, padded, d_k)
        b_end = _load_row(b_base, c * BLOCK_C + BLOCK_C - 1, ks, d_k)
        q_start = q * tl.exp(b.to(tl.float32))                          # decayed from the start
        d_state = (d_state * tl.exp(b_end.to(tl.float32))[:, None]
                   + dot(tl.trans(q_start), do, None, Q.dtype.element_ty) * scale)
    _store(DH0 + n * d_k * d_v, d_state, ks, vs, d_k, d_v)


@triton.jit
def _grad_qk_kernel(Q, K, V, Bc, H, DO, DH, DQ, DK, length, padded, n_chunks, d_k, d_v,
                    scale, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
                    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program instance: key columns ``ks`` of ``dq`` and ``dk`` of chunk ``c`` of matrix
    ``n``, from the chunk's inputs, the state entering it (``H[n, c]``, for ``dq``) and the
    gradient of the state leaving it (``DH[n, c]``, for ``dk``); all chunks in parallel. The
    sub-chunk blocks are those of `_out_kernel`, with ``dA[t, s] = scale * do_t . v_s``, the
    gradient of the scores: ``dq`` per query sub-chunk, then ``dk`` per key sub-chunk."""
    ks = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    c, n = tl.program_id(1), tl.program_id(2).to(tl.int64)
    dtype = Q.dtype.element_ty
    q_base, k_base = Q + n * length * d_k, K + n * length * d_k
    v_base, do_base = V + n * length * d_v, DO + n * length * d_v
    b_base = Bc + n * padded * d_k
    at_chunk = (n * n_chunks + c) * d_k * d_v
    idx = tl.arange(0, BLOCK_S)
    c0 = c * BLOCK_C
    n_sub = tl.cdiv(tl.minimum(length - c0, BLOCK_C), BLOCK_S)
    b_end = _load_row(b_base, c0 + BLOCK_C - 1, ks, d_k)
    for i in range(n_sub):                                              # query sub-chunk i
        t0 = c0 + i * BLOCK_S
        rows = t0 + idx
        b = _load(b_base, rows, ks, padded, d_k)
        ref = _load_row(b_base, t0, ks, d_k)                           # b at the start of i
        local = (b - ref[None, :]).to(tl.float32)                      # <= 0
        from_state = tl.zeros((BLOCK_S, BLOCK_K), dtype=tl.float32)
        for v0 in range(0, d_v, BLOCK_V):
            vs = v0 + tl.arange(0, BLOCK_V)
            from_state = dot_rescaled(_load(do_base, rows, vs, length, d_v),
                                      tl.trans(_load(H + at_chunk, ks, vs, d_k, d_v)),
                                      from_state, dtype)
        dq_ref = tl.zeros((BLOCK_S, BLOCK_K), dtype=tl.float32)
        for j in range(i):
            rows_j = c0 + j * BLOCK_S + idx
            d_scores = _row_products(do_base, rows, v_base, rows_j, length, d_v, BLOCK_V,
                                     BLOCK_S)
            k_j = _load(k_base, rows_j, ks, length, d_k).to(tl.float32)
            k_ref = k_j * tl.exp((ref[None, :] - _load(b_base, rows_j, ks, padded, d_k))
                                 .to(tl.float32))
            dq_ref = dot_rescaled(d_scores, k_ref, dq_ref, dtype)
        d_scores = _row_products(do_base, rows, v_base, rows, length, d_v, BLOCK_V, BLOCK_S)
        k = _load(k_base, rows, ks, length, d_k).to(tl.float32)
        dq = tl.sum(d_scores[:, :, None] * k[None, :, :] * _diag_decay(local, BLOCK_S), 1)
        dq += from_state * tl.exp(b.to(tl.float32)) + dq_ref * tl.exp(local)
        _store(DQ + n * length * d_k, dq * scale, rows, ks, length, d_k)
    for j in range(n_sub):                                              # key sub-chunk j
        t0 = c0 + j * BLOCK_S
        rows = t0 + idx
        b = _load(b_base, rows, ks, padded, d_k)
        from_state = tl.zeros((BLOCK_S, BLOCK_K), dtype=tl.float32)
        for v0 in range(0, d_v, BLOCK_V):
            vs = v0 + tl.arange(0, BLOCK_V)
            from_state = dot_rescaled(_load(v_base, rows, vs, length, d_v),
                                      tl.trans(_load(DH + at_chunk, ks, vs, d_k, d_v)),
                                      from_state, dtype)
        dk = from_state * tl.exp((b_end[None, :] - b).to(tl.float32))
        for i in range(j + 1, n_sub):                                   # later query sub-chunks
            rows_i = c0 + i * BLOCK_S + idx
            ref = _load_row(b_base, c0 + i * BLOCK_S, ks, d_k)
            q_i = _load(q_base, rows_i, ks, length, d_k).to(tl.float32)
            q_ref = q_i * tl.exp((_load(b_base, rows_i, ks, padded, d_k) - ref[None, :])
                                 .to(tl.float32))
            d_scores = _row_products(do_base, rows_i, v_base, rows, length, d_v, BLOCK_V,
                                     BLOCK_S)
            dk += (dot_rescaled(tl.trans(d_scores), q_ref, tl.zeros_like(dk), dtype)
                   * tl.exp((ref[None, :] - b).to(tl.float32)) * scale)
        local = (b - _load_row(b_base, t0, ks, d_k)[None, :]).to(tl.float32)
        d_scores = _row_products(do_base, rows, v_base, rows, length, d_v, BLOCK_V, BLOCK_S)
        q = _load(q_base, rows, ks, length, d_k).to(tl.float32)
        dk += tl.sum(d_scores[:, :, None] * q[:, None, :] * _diag_decay(local, BLOCK_S),
                     0) * scale
        _store(DK + n * length * d_k, dk, rows, ks, length, d_k)


@triton.jit
def _grad_v_kernel(Q, K, Bc, DO, DH, DV, length, padded, n_chunks, d_k, d_v, scale,
                   BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program instance: value columns ``vs`` of ``dv`` of chunk ``c`` of matrix ``n``,
    from the scores (recomputed as in `_out_kernel`) and the gradient of the state leaving
    the chunk (``DH[n, c]``), one key sub-chunk at a time; all chunks in parallel."""
    vs = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    c, n = tl.program_id(1), tl.program_id(2).to(tl.int64)
    dtype = Q.dtype.element_ty
    q_base, k_base = Q + n * length * d_k, K + n * length * d_k
    do_base, b_base = DO + n * length * d_v, Bc + n * padded * d_k
    dh_base = DH + (n * n_chunks + c) * d_k * d_v
    idx = tl.arange(0, BLOCK_S)
    c0 = c * BLOCK_C
    n_sub = tl.cdiv(tl.minimum(length - c0, BLOCK_C), BLOCK_S)
    for j in range(n_sub):                                              # key sub-chunk j
        t0 = c0 + j * BLOCK_S
        rows = t0 + idx
        dv = tl.zeros((BLOCK_S, BLOCK_V), dtype=tl.float32)
        for k0 in range(0, d_k, BLOCK_K):                               # to the state
            ks = k0 + tl.arange(0, BLOCK_K)
            b_end = _load_row(b_base, c0 + BLOCK_C - 1, ks, d_k)
            k = _load(k_base, rows, ks, length, d_k).to(tl.float32)
            k_end = k * tl.exp((b_end[None, :] - _load(b_base, rows, ks, padded, d_k))
                               .to(tl.float32))
            dv = dot_rescaled(k_end, _load(dh_base, ks, vs, d_k, d_v), dv, dtype)
        scores = _diag_scores(q_base, k_base, b_base, rows, t0, length, padded, d_k,
                              BLOCK_K, BLOCK_S)
        inside = dot_rescaled(tl.trans(scores), _load(do_base, rows, vs, length, d_v),
                              tl.zeros_like(dv), dtype)
        for i in range(j + 1, n_sub):                                   # later query sub-chunks
            rows_i = c0 + i * BLOCK_S + idx
            scores = _cross_scores(q_base, k_base, b_base, rows_i, rows, c0 + i * BLOCK_S,
                                   length, padded, d_k, BLOCK_K, BLOCK_S)
            inside = dot_rescaled(tl.trans(scores), _load(do_base, rows_i, vs, length, d_v),
                                  inside, dtype)
        _store(DV + n * length * d_v, dv + inside * scale, rows, vs, length, d_v)


def chunk_cumsum(log_g: torch.Tensor) -> torch.Tensor:
    """``b``: the cumulative sums of ``log_g (B, L, d_k)`` restarting every ``BLOCK_C`` steps, in
    fp64, padded with gate 1 to ``(B, Lp, d_k)``, ``Lp`` a multiple of ``BLOCK_C``."""
    batch, length, d_k = log_g.shape
    padded = -(-length // BLOCK_C) * BLOCK_C
    g = torch.zeros(batch, padded, d_k, dtype=torch.float64, device=log_g.device)
    g[:, :length] = log_g
    return g.view(batch, padded // BLOCK_C, BLOCK_C, d_k).cumsum(2).view(batch, padded, d_k)


def launch_settings(d_k: int, d_v: int) -> dict:
    """Block sizes and launch options of every kernel here: `_simple_gla.launch_settings`
    with this module's chunks, and key blocks of at most 32 for the diagonal's decays."""
    settings = _simple_settings(d_k, d_v)
    return {**settings, "BLOCK_C": BLOCK_C, "BLOCK_K": min(32, settings["BLOCK_K"])}


def _states(k, v, b, h0, settings):
    """The fp32 states entering every chunk, ``(B, NT, d_k, d_v)``, and the final state."""
    (batch, length, d_k), d_v = k.shape, v.shape[-1]
    n_chunks = triton.cdiv(length, BLOCK_C)
    h = k.new_empty(batch, n_chunks, d_k, d_v, dtype=torch.float32)
    h_t = torch.empty_like(h0)
    grid = (triton.cdiv(d_k, settings["BLOCK_K"]), triton.cdiv(d_v, settings["BLOCK_V"]), batch)
    _state_kernel[grid](k, v, b, h0, h, h_t, length, b.shape[1], n_chunks, d_k, d_v,
                        **settings)
    return h, h_t


class ChunkGLA(torch.autograd.Function):
    """GLA on contiguous ``(B, L, d)`` tensors, ``log_g (B, L, d_k)`` and an fp32 initial state
    ``(B, d_k, d_v)``; returns the output and the fp32 final state.

    Forward: `_state_kernel` (one instance per state tile) stores the state entering each
    chunk, then `_out_kernel` (one per chunk, matrix and block of value columns) computes the
    outputs. Backward: the states again, `_d_state_kernel` (one per state tile, in reverse)
    stores the gradient of the state leaving each chunk, then `_grad_qk_kernel` and
    `_grad_v_kernel` (one per chunk, matrix and block of columns) compute dq, dk and dv.
    """

    @staticmethod
    def forward(ctx, q, k, v, log_g, h0, scale: float):
        (batch, length, d_k), d_v = q.shape, v.shape[-1]
        b = chunk_cumsum(log_g)
        out = torch.empty_like(v)
        h_t = torch.empty_like(h0)
        if batch:
            settings = launch_settings(d_k, d_v)
            h, h_t = _states(k, v, b, h0, settings)
            grid = (triton.cdiv(d_v, settings["BLOCK_V"]), h.shape[1], batch)
            _out_kernel[grid](q, k, v, b, h, out, length, b.shape[1], h.shape[1], d_k, d_v,
                              scale, BLOCK_S=BLOCK_S, **settings)
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
            settings = launch_settings(d_k, d_v)
            h, _ = _states(k, v, b, h0, settings)                 # recomputed, not saved
            d_out, dh = d_out.to(q.dtype).contiguous(), torch.empty_like(h)
            padded, n_chunks = b.shape[1], h.shape[1]
            n_k = triton.cdiv(d_k, settings["BLOCK_K"])
            n_v = triton.cdiv(d_v, settings["BLOCK_V"])
            _d_state_kernel[(n_k, n_v, batch)](q, b, d_out, d_h_t.contiguous(), dh, dh0, length,
                                               padded, n_chunks, d_k, d_v, ctx.scale,
                                               **settings)
            _grad_qk_kernel[(n_k, n_chunks, batch)](q, k, v, b, h, d_out, dh, dq, dk, length,
                                                    padded, n_chunks, d_k, d_v, ctx.scale,
                                                    BLOCK_S=BLOCK_S, **settings)
            _grad_v_kernel[(n_v, n_chunks, batch)](q, k, b, d_out, dh, dv, length, padded,
                                                   n_chunks, d_k, d_v, ctx.scale,
                                                   BLOCK_S=BLOCK_S, **settings)
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
