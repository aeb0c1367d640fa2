"""FlashAttention-2 in Triton: forward and backward kernels and the autograd Function.

Imported by `xfam_lib.kernels` on first use (importing it imports Triton). Whether the kernels
run compiled on a GPU or in Triton's CPU interpreter is fixed here, at import (`_mode`).

Layout: the caller flattens the leading dims, so every tensor here is a contiguous
``(B, L, d)`` stack of ``B`` independent ``(L, d)`` matrices, one per (batch, head) pair.
Scores are kept in base 2: ``s = (q . k) * scale * log2(e)``, so ``exp(x) = 2 ** (x log2 e)``
becomes one ``exp2``. The log-sum-exp saved for the backward, ``lse``, is in the same units.
Query row ``i`` sits at key position ``i + Lk - Lq`` (bottom-right causal alignment).
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from ._mode import INTERPRETED, dot

# Tile sizes: each program instance owns BLOCK_M query rows (forward, dQ) or BLOCK_N key
# rows (dK/dV) and walks over the other side in steps of the other block size. These are the
# interpreter's (and the fallback's) sizes; on a GPU the launch settings are autotuned, below.
BLOCK_M = 64
BLOCK_N = 64
LOG2_E = 1 / math.log(2)

# The one switch: on a GPU every kernel is launched through `triton.autotune`, which on the
# first call at a new key (lengths, head sizes, causal, dtypes) compiles and times each config
# that fits and keeps the fastest. Triton's CPU interpreter runs programs with NumPy, where a
# config's speed means nothing, so there each kernel runs the one fixed `INTERPRETER_CONFIG`.
# Cost of a new key on a GPU (an estimate, not measured here): up to 10 configs for each tiled
# kernel and 3 for delta, 33 compilations of a second or two each plus ~0.1 s of timing each,
# so 30-90 s before the first forward+backward at a new shape. Compiled kernels stay in
# Triton's disk cache: a later process at the same shape pays mostly the timing.
AUTOTUNE = not INTERPRETED
INTERPRETER_CONFIG = triton.Config({"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N})


@triton.jit
def _visible(rows, cols, len_q, len_k, CAUSAL: tl.constexpr):
    """Which (query row, key column) pairs of a tile take part: both inside their sequences
    and, when causal, the key not after the query's position ``row + len_k - len_q``."""
    ok = (rows[:, None] < len_q) & (cols[None, :] < len_k)
    if CAUSAL:
        ok = ok & (cols[None, :] <= rows[:, None] + (len_k - len_q))
    return ok


@triton.jit
def _load_tile(base, rows, n_rows, d, BLOCK_D: tl.constexpr):
    """Load rows ``rows`` of a contiguous ``(n_rows, d)`` matrix as a ``(len(rows), BLOCK_D)``
    tile; rows past the end and the columns that pad ``d`` to ``BLOCK_D`` read as 0."""
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    return tl.load(base + rows[:, None] * d + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _store_tile(base, tile, rows, n_rows, d, BLOCK_D: tl.constexpr):
    """Store a ``(len(rows), BLOCK_D)`` tile into rows ``rows`` of a ``(n_rows, d)`` matrix,
    leaving out the padding rows and columns."""
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    tl.store(base + rows[:, None] * d + cols[None, :], tile, mask=mask)


@triton.jit
def _key_range(row0, len_q, len_k, CAUSAL: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query block starting at row ``row0``: the keys ``[0, full)`` every row of the
    block may see (whole key blocks, no mask needed) and the end ``stop`` of the keys any row
    may see. Keys ``[full, stop)`` need the mask (causal diagonal, ragged end)."""
    if CAUSAL:
        shift = len_k - len_q
        full = tl.minimum(len_k, row0 + shift + 1)
        stop = tl.minimum(len_k, row0 + BLOCK_M + shift)
    else:
        full = len_k
        stop = len_k
    full = tl.maximum(full, 0) // BLOCK_N * BLOCK_N
    stop = tl.maximum(stop, 0)
    return full, stop


@triton.jit
def _fwd_key_loop(acc, m_i, l_i, q, k_base, v_base, rows, start, stop,
                  len_q, len_k, d_k, d_v, qk_scale,
                  CAUSAL: tl.constexpr, MASKED: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The online softmax over key blocks ``start, start + BLOCK_N, ... < stop``.

    Carries, per query row: ``m_i`` the largest score seen so far, ``l_i`` the sum of
    ``2 ** (s - m_i)`` over the keys seen, ``acc`` the same weights times the values.
    A new block with a larger maximum rescales the old sums by ``alpha = 2 ** (m_old - m_new)``.
    """
    for start_n in range(start, stop, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, cols, len_k, d_k, BLOCK_DK)          # (BLOCK_N, BLOCK_DK)
        v = _load_tile(v_base, cols, len_k, d_v, BLOCK_DV)          # (BLOCK_N, BLOCK_DV)
        s = dot(q, tl.trans(k), None, q.dtype) * qk_scale
        if MASKED:
            s = tl.where(_visible(rows, cols, len_q, len_k, CAUSAL), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; subtract 0 there instead, so that
        # its weights come out 2 ** -inf = 0 rather than 2 ** (-inf + inf) = NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])                             # (BLOCK_M, BLOCK_N)
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = dot(p, v, acc * alpha[:, None], v.dtype)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, len_q, len_k, d_k, d_v, qk_scale,
                CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: query rows ``[row0, row0 + BLOCK_M)`` of matrix ``b``.

    It keeps its query tile, loops over the key blocks it may see, and writes its rows of the
    output and their log-sum-exp. Causal attention is done in two stages: the key blocks every
    row sees in full (no mask), then the blocks on the diagonal and the ragged end (masked).
    """
    row0 = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1).to(tl.int64)
    rows = row0 + tl.arange(0, BLOCK_M)
    q = _load_tile(Q + b * len_q * d_k, rows, len_q, d_k, BLOCK_DK)  # (BLOCK_M, BLOCK_DK)
    k_base = K + b * len_k * d_k
    v_base = V + b * len_k * d_v

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    full, stop = _key_range(row0, len_q, len_k, CAUSAL, BLOCK_M, BLOCK_N)
    acc, m_i, l_i = _fwd_key_loop(acc, m_i, l_i, q, k_base, v_base, rows, 0, full,
                                  len_q, len_k, d_k, d_v, qk_scale, CAUSAL, False,
                                  BLOCK_N, BLOCK_DK, BLOCK_DV)
    acc, m_i, l_i = _fwd_key_loop(acc, m_i, l_i, q, k_base, v_base, rows, full, stop,
                                  len_q, len_k, d_k, d_v, qk_scale, CAUSAL, True,
                                  BLOCK_N, BLOCK_DK, BLOCK_DV)

    # A row that saw no key (causal, Lq > Lk) has l = 0: its output is 0 and its lse -inf.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))
    _store_tile(O + b * len_q * d_v, out.to(O.dtype.element_ty), rows, len_q, d_v, BLOCK_DV)
    tl.store(LSE + b * len_q + rows, lse, mask=rows < len_q)


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, len_q, d_v,
                      BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``delta_i = sum_c dO_ic O_ic`` for rows ``[row0, row0 + BLOCK_M)`` of matrix ``b``.

    It equals ``sum_j P_ij dP_ij``, the term the softmax's backward subtracts:
    ``dS_ij = P_ij (dP_ij - delta_i)``.
    """
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    b = tl.program_id(1).to(tl.int64)
    o = _load_tile(O + b * len_q * d_v, rows, len_q, d_v, BLOCK_DV).to(tl.float32)
    do = _load_tile(DO + b * len_q * d_v, rows, len_q, d_v, BLOCK_DV).to(tl.float32)
    tl.store(DELTA + b * len_q + rows, tl.sum(o * do, 1), mask=rows < len_q)


@triton.jit
def _weights(q, k, lse, rows, cols, len_q, len_k, qk_scale,
             CAUSAL: tl.constexpr):
    """Recompute the attention weights ``P = 2 ** (s - lse)`` of one tile from the saved
    log-sum-exp; pairs that do not take part get 0. (A row that saw no key has lse = -inf
    and weights 2 ** inf here, but none of its pairs takes part, so they all become 0.)"""
    s = dot(q, tl.trans(k), None, q.dtype) * qk_scale
    p = tl.exp2(s - lse[:, None])
    return tl.where(_visible(rows, cols, len_q, len_k, CAUSAL), p, 0.0)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, len_q, len_k, d_k, d_v, scale, qk_scale,
                     CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: key rows ``[col0, col0 + BLOCK_N)`` of matrix ``b``.

    It keeps its key and value tiles and loops over the query blocks that may see them,
    summing ``dV = P^T dO`` and ``dK = scale * dS^T Q`` over those blocks.
    """
    col0 = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1).to(tl.int64)
    cols = col0 + tl.arange(0, BLOCK_N)
    k = _load_tile(K + b * len_k * d_k, cols, len_k, d_k, BLOCK_DK)
    v = _load_tile(V + b * len_k * d_v, cols, len_k, d_v, BLOCK_DV)
    q_base = Q + b * len_q * d_k
    do_base = DO + b * len_q * d_v

    dk = tl.zeros([BLOCK_N, BLOCK_DK], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    start = 0
    if CAUSAL:  # the first query row that sees key col0 is col0 - (len_k - len_q)
        start = tl.maximum(col0 - (len_k - len_q), 0) // BLOCK_M * BLOCK_M
    for row0 in range(start, len_q, BLOCK_M):
        rows = row0 + tl.arange(0, BLOCK_M)
        q = _load_tile(q_base, rows, len_q, d_k, BLOCK_DK)
        do = _load_tile(do_base, rows, len_q, d_v, BLOCK_DV)
        lse = tl.load(LSE + b * len_q + rows, mask=rows < len_q, other=0.0)
        delta = tl.load(DELTA + b * len_q + rows, mask=rows < len_q, other=0.0)
        p = _weights(q, k, lse, rows, cols, len_q, len_k, qk_scale, CAUSAL)
        dv = dot(tl.trans(p), do, dv, do.dtype)
        dp = dot(do, tl.trans(v), None, do.dtype)   # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dk = dot(tl.trans(ds), q, dk, q.dtype)
    _store_tile(DK + b * len_k * d_k, (dk * scale).to(DK.dtype.element_ty), cols, len_k, d_k,
                BLOCK_DK)
    _store_tile(DV + b * len_k * d_v, dv.to(DV.dtype.element_ty), cols, len_k, d_v, BLOCK_DV)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, len_q, len_k, d_k, d_v, scale, qk_scale,
                   CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One program instance: query rows ``[row0, row0 + BLOCK_M)`` of matrix ``b``.

    It keeps its query and output-gradient tiles and loops over the key blocks they may see,
    summing ``dQ = scale * dS K``.
    """
    row0 = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1).to(tl.int64)
    rows = row0 + tl.arange(0, BLOCK_M)
    q = _load_tile(Q + b * len_q * d_k, rows, len_q, d_k, BLOCK_DK)
    do = _load_tile(DO + b * len_q * d_v, rows, len_q, d_v, BLOCK_DV)
    lse = tl.load(LSE + b * len_q + rows, mask=rows < len_q, other=0.0)
    delta = tl.load(DELTA + b * len_q + rows, mask=rows < len_q, other=0.0)
    k_base = K + b * len_k * d_k
    v_base = V + b * len_k * d_v

    dq = tl.zeros([BLOCK_M, BLOCK_DK], tl.float32)
    _, stop = _key_range(row0, len_q, len_k, CAUSAL, BLOCK_M, BLOCK_N)
    for col0 in range(0, stop, BLOCK_N):
        cols = col0 + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, cols, len_k, d_k, BLOCK_DK)
        v = _load_tile(v_base, cols, len_k, d_v, BLOCK_DV)
        p = _weights(q, k, lse, rows, cols, len_q, len_k, qk_scale, CAUSAL)
        dp = dot(do, tl.trans(v), None, do.dtype)
        ds = p * (dp - delta[:, None])
        dq = dot(ds, k, dq, k.dtype)
    _store_tile(DQ + b * len_q * d_k, (dq * scale).to(DQ.dtype.element_ty), rows, len_q, d_k,
                BLOCK_DK)


def _tile_configs(held: str, streamed: str) -> list[triton.Config]:
    """The configs autotuning times, for a kernel whose programs own ``held`` rows (the
    block-size name, ``"BLOCK_M"`` or ``"BLOCK_N"``) and loop over ``streamed`` rows.

    - held block 64 or 128: 128 reads the streamed side from main memory half as often;
      64 makes twice as many programs (short sequences, few heads) and halves the fp32
      accumulator's registers at head size 128.
    - streamed block 64 or 128: bigger tiles make fewer loop steps and larger ``tl.dot``s,
      smaller ones less shared memory per stage and less masked work on the diagonal.
    - num_stages 2 or 3: how many streamed tiles are loaded ahead of the one in use (hides
      the memory latency; each stage costs one more streamed tile of shared memory).
    - num_warps follows the held block, 16 rows per warp (4 warps for 64 rows, 8 for 128).
    - one small config (64 held, 32 streamed, 2 stages), the only one whose tiles fit an
      A100's shared memory in fp32 at head size 128 (`_shared_memory`), and one smaller
      still (32 held, 16 streamed, 1 stage, 2 warps), the only one that fits a T4's at head
      size 128, where Triton stages every operand as fp32.
    """
    tiles = [(h, s, stages) for h in (64, 128) for s in (64, 128) for stages in (2, 3)]
    return [triton.Config({held: h, streamed: s}, num_stages=stages, num_warps=max(2, h // 16))
            for h, s, stages in [*tiles, (64, 32, 2), (32, 16, 1)]]


def _shared_memory(held: int, streamed: int, stages: int, block_dk: int, block_dv: int,
                   elem: int, cc: int) -> int:
    """Estimated shared memory (bytes) of one program on a GPU of compute capability ``cc``
    (75 for 7.5): the held tiles (``held`` rows of both head sizes, staged once for
    ``tl.dot``), ``stages`` buffers of the streamed tiles, and one ``held x streamed`` tile
    of weights passed between the two products, for ``elem``-byte inputs.

    Before sm_80 (a T4) Triton pipelines no loads (one buffer whatever ``num_stages``) and
    stages fp16 operands as fp32 (4 bytes), as its products there run on the FMA units.
    Meant to err high; `xfam_lib.kernels._aot` checks it against compiled sizes."""
    if cc < 80:
        stages, elem = 1, 4
    return elem * ((held + stages * streamed) * (block_dk + block_dv) + held * streamed)


def _fitting(configs, held: str, streamed: str, len_held: int, len_streamed: int,
             block_dk: int, block_dv: int, elem: int, cc: int, limit: int) -> list[triton.Config]:
    """The configs worth timing: tiles within ``limit`` bytes of shared memory on a GPU of
    compute capability ``cc``, and blocks no longer than their sequences (a longer one
    computes mostly padding; blocks of 64 held and 32 streamed rows always pass). Raises
    ``ValueError`` naming the GPU's limit if no config fits."""
    def need(c):
        return _shared_memory(c.kwargs[held], c.kwargs[streamed], c.num_stages, block_dk,
                              block_dv, elem, cc)

    fit = [c for c in configs if need(c) <= limit]
    if not fit:
        raise ValueError(f"flash_attention at head sizes padded to {block_dk} and {block_dv} "
                         f"({elem}-byte inputs) needs at least {min(map(need, configs))} bytes "
                         f"of shared memory per program, more than the {limit} of this GPU "
                         f"(compute capability {cc / 10:.1f})")
    return [c for c in fit if c.kwargs[held] <= max(64, len_held)
            and c.kwargs[streamed] <= max(32, len_streamed)]


@functools.cache
def _device_limits(device: int) -> tuple[int, int]:
    """Compute capability of CUDA device ``device`` (75 for 7.5) and the shared memory one
    program may use there (bytes)."""
    major, minor = torch.cuda.get_device_capability(device)
    properties = triton.runtime.driver.active.utils.get_device_properties(device)
    return 10 * major + minor, properties["max_shared_mem"]


def _prune(held: str, streamed: str, len_held: str, len_streamed: str):
    """`triton.autotune`'s ``early_config_prune`` for a kernel holding ``held`` rows of the
    sequence whose length is the kernel argument ``len_held``."""
    def prune(configs, named_args, **kwargs):
        q = named_args["Q"]
        cc, limit = _device_limits(q.device.index)
        return _fitting(configs, held, streamed, named_args[len_held], named_args[len_streamed],
                        kwargs["BLOCK_DK"], kwargs["BLOCK_DV"], q.element_size(), cc, limit)
    return prune


# A new key retunes: the lengths and head sizes (and, added by Triton, every tensor's dtype).
TUNE_KEY = ["len_q", "len_k", "d_k", "d_v", "CAUSAL"]
QUERY_CONFIGS = _tile_configs("BLOCK_M", "BLOCK_N")          # forward and dQ: own queries
KEY_CONFIGS = _tile_configs("BLOCK_N", "BLOCK_M")            # dK/dV: own keys
# delta reads two (BLOCK_M, d_v) tiles and sums: no loop, no shared memory to budget.
DELTA_CONFIGS = [triton.Config({"BLOCK_M": m}, num_warps=w) for m, w in ((64, 4), (128, 4),
                                                                        (128, 8))]


def _autotuned() -> dict:
    """Each kernel wrapped in `triton.autotune`, looked up by its Python function. Nothing
    is reset between the timed runs: every program writes its own rows with plain stores (no
    atomics, no read-modify-write), so a run leaves the same results whatever ran before."""
    def tune(kernel, configs, prune):
        return triton.autotune(configs, key=TUNE_KEY,
                               prune_configs_by={"early_config_prune": prune})(kernel)

    by_query = _prune("BLOCK_M", "BLOCK_N", "len_q", "len_k")
    by_key = _prune("BLOCK_N", "BLOCK_M", "len_k", "len_q")
    return {_fwd_kernel.fn: tune(_fwd_kernel, QUERY_CONFIGS, by_query),
            _bwd_dq_kernel.fn: tune(_bwd_dq_kernel, QUERY_CONFIGS, by_query),
            _bwd_dkdv_kernel.fn: tune(_bwd_dkdv_kernel, KEY_CONFIGS, by_key),
            _bwd_delta_kernel.fn: triton.autotune(DELTA_CONFIGS, key=["len_q", "d_v"])(
                _bwd_delta_kernel)}


_TUNED = _autotuned() if AUTOTUNE else {}


def _launch(kernel, grid, args, meta: dict, config: triton.Config | None) -> None:
    """Launch ``kernel(*args, **meta)`` on ``grid(block sizes)`` programs: with ``config``
    when given, else autotuned (GPU) or with `INTERPRETER_CONFIG` (interpreter)."""
    if config is None and AUTOTUNE:
        _TUNED[kernel.fn][grid](*args, **meta)
        return
    config = config or INTERPRETER_CONFIG
    tiles = {n: b for n, b in config.kwargs.items() if n in kernel.arg_names}  # delta: no N
    kernel[grid(tiles)](*args, **meta, **tiles, num_warps=config.num_warps,
                        num_stages=config.num_stages)


def _launch_args(q: torch.Tensor, v: torch.Tensor, causal: bool) -> dict:
    """The compile-time arguments shared by the tiled kernels: the mask and the head sizes,
    padded to a power of two (at least 16, the smallest ``tl.dot`` accepts). Products follow
    the input dtype (`_mode.dot`): fp32 inputs in full fp32, fp16/bf16 on tensor cores."""
    return {"CAUSAL": causal,
            "BLOCK_DK": max(16, triton.next_power_of_2(q.shape[-1])),
            "BLOCK_DV": max(16, triton.next_power_of_2(v.shape[-1]))}


def flash_forward(q, k, v, causal: bool, scale: float, config: triton.Config | None = None):
    """Output ``(B, Lq, d_v)`` and base-2 log-sum-exp ``(B, Lq)`` (fp32) of contiguous inputs.

    ``config`` fixes the block sizes and launch settings; by default they are autotuned."""
    (batch, len_q, d_k), len_k, d_v = q.shape, k.shape[1], v.shape[-1]
    out = torch.empty((batch, len_q, d_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, len_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:                                            # no program to launch
        return out, lse

    def grid(meta):                                     # one program per query block
        return (triton.cdiv(len_q, meta["BLOCK_M"]), batch)

    _launch(_fwd_kernel, grid, (q, k, v, out, lse, len_q, len_k, d_k, d_v, scale * LOG2_E),
            _launch_args(q, v, causal), config)
    return out, lse


def flash_backward(q, k, v, out, lse, d_out, causal: bool, scale: float,
                   config: triton.Config | None = None):
    """Gradients ``(dq, dk, dv)`` of contiguous inputs: delta, then dK/dV, then dQ.

    ``config`` fixes the block sizes and launch settings of all three; by default they are
    autotuned, each kernel on its own."""
    (batch, len_q, d_k), len_k, d_v = q.shape, k.shape[1], v.shape[-1]
    if q.numel() == 0 or k.numel() == 0:                            # nothing flows back
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    meta = _launch_args(q, v, causal)

    def by_query(tiles):
        return (triton.cdiv(len_q, tiles["BLOCK_M"]), batch)

    def by_key(tiles):
        return (triton.cdiv(len_k, tiles["BLOCK_N"]), batch)

    delta = torch.empty((batch, len_q), dtype=torch.float32, device=q.device)
    _launch(_bwd_delta_kernel, by_query, (out, d_out, delta, len_q, d_v),
            {"BLOCK_DV": meta["BLOCK_DV"]}, config)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = (q, k, v, d_out, lse, delta)
    sizes = (len_q, len_k, d_k, d_v, scale, scale * LOG2_E)
    _launch(_bwd_dkdv_kernel, by_key, (*args, dk, dv, *sizes), meta, config)
    _launch(_bwd_dq_kernel, by_query, (*args, dq, *sizes), meta, config)
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Attention on contiguous ``(B, L, d)`` tensors; saves only ``q, k, v``, the output and
    the log-sum-exp, and recomputes the weights in the backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float):
        out, lse = flash_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, out, lse, d_out.contiguous(), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None

