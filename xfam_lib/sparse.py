"""Sparse attention (Chapter 7): the mask toolkit, the kernels that make masks pay, and content-based sparsity.

* Pattern builders (boolean masks / block layouts): sliding window, dilated, Sparse Transformer strided
  and fixed, Image Transformer 1-D/2-D local, blockwise, Longformer, ETC, BigBird, sinks, DCA positions.
* The graph view: `nnz`, `receptive_field`, `hop_distances`, `graph_diameter`.
* Kernels, each beside its dense or loop reference: `sliding_window_attention`, `longformer_attention`,
  `block_sparse_attention`, `blockwise_attention`, `lsh_attention`, `routing_attention`, `dca_attention`.
* Memory: `RevBlock` / `reversible_sequence`, `chunked_ff`, `checkpointed_sequence`.

Conventions (as in `xfam_lib.attention` and ``shared/API.md``):

* ``q, k, v`` are ``(..., L, d)``, usually ``(B, H, L, d)``; the sequence is dim -2.
* Every mask builder returns a boolean ``(L, L)`` tensor, **True = may attend**; row ``i`` is the
  query, column ``j`` the key.
* ``window`` counts neighbours on each side: the two-sided band is ``|i - j| <= window``, the causal
  band ``0 <= i - j <= window`` (the query and the ``window`` keys before it). This is what
  ``attention.causal_mask(L, window=...)`` means too.
* A block ``layout`` is boolean ``(ceil(Lq/bs), ceil(Lk/bs))``, or ``(H, ...)`` per head;
  `expand_layout` turns it into the token mask it stands for.
* Each efficient form has a dense reference: `scaled_dot_product_attention` with the mask the
  builders here return. A query row with no allowed key returns zeros.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import (attention_with_lse, causal_mask,
                        merge_partials, scaled_dot_product_attention)
from .positional import apply_rope
from .utils import check_block_size, check_positive_int, check_qkv, check_tensor, compute_dtype, resolve_scale

__all__ = [
    "sliding_window_mask",
    "dilated_mask",
    "strided_mask",
    "fixed_mask",
    "fixed_layout",
    "longformer_mask",
    "sink_window_mask",
    "bigbird_layout",
    "expand_layout",
    "sliding_window_attention",
    "block_sparse_attention",
    "longformer_attention",
    "dense_masked_attention",
    "FactorizedSparseAttention",
    "nnz",
    "receptive_field",
    "hop_distances",
    "graph_diameter",
    "local1d_mask",
    "local2d_mask",
    "blockwise_layout",
    "blockwise_mask",
    "blockwise_attention",
    "etc_masks",
    "mask_to_bias",
    "lsh_rotations",
    "lsh_hash",
    "lsh_collision_rate",
    "lsh_attention",
    "lsh_attention_reference",
    "RevBlock",
    "reversible_sequence",
    "chunked_ff",
    "checkpointed_sequence",
    "routing_assign",
    "routing_mask",
    "kmeans_ema_update",
    "routing_attention",
    "dca_position_matrix",
    "dca_attention",
    "dca_attention_reference",
    "GALLERY",
    "pattern_mask",
    "masked_attention_flops",
    "tile_occupancy",
]


# ----------------------------------------------------------------------------- argument checks
def _check_nonneg_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int, got {value!r} of type {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return int(value)


def _offsets(length: int, device) -> torch.Tensor:
    """``(L, L)`` integer matrix of ``i - j`` (query minus key position)."""
    pos = torch.arange(length, device=device)
    return pos[:, None] - pos[None, :]


def _check_part(part: str, allowed: tuple[str, ...]) -> str:
    if part not in allowed:
        raise ValueError(f"part must be one of {allowed}, got {part!r}")
    return part


# ----------------------------------------------------------------------------- mask builders
def sliding_window_mask(L: int, window: int, causal: bool = False, *,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """Band mask ``(L, L)``: ``|i - j| <= window``, or ``0 <= i - j <= window`` with ``causal=True`` (M7.2).

    The dense reference for `sliding_window_attention`. Each row has at most ``2 window + 1``
    (causal: ``window + 1``) True entries, so the mask has O(L · window) of them.
    """
    L = check_positive_int("L", L)
    window = _check_nonneg_int("window", window)
    lower = causal_mask(L, window=window, device=device)             # 0 <= i - j <= window
    return lower if causal else lower | lower.T


def dilated_mask(L: int, window: int, dilation: int, causal: bool = True, *,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Dilated (atrous) band ``(L, L)`` (M7.3): key ``j`` is allowed iff ``(i - j) % dilation == 0`` and
    ``|i - j| <= window * dilation`` (causal: ``0 <= i - j <= window * dilation``).

    ``window`` counts the dilated neighbours on each side, so a row keeps ``window + 1`` (causal) or
    ``2 window + 1`` keys whatever the dilation, while its span grows to ``window * dilation``.
    ``dilation = 1`` is `sliding_window_mask`.
    """
    L = check_positive_int("L", L)
    window = _check_nonneg_int("window", window)
    dilation = check_positive_int("dilation", dilation)
    rel = _offsets(L, device)
    span = rel if causal else rel.abs()
    return (span >= 0) & (span <= window * dilation) & (rel % dilation == 0)


def strided_mask(L: int, stride: int, *, part: str = "union",
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Sparse Transformer *strided* pattern ``(L, L)``, causal (M7.5, Child et al. 2019).

    Two factorised heads, both inside ``j <= i``:

    * ``part="local"``: the ``stride`` most recent positions, ``0 <= i - j < stride``;
    * ``part="strided"``: every ``stride``-th position back, ``(i - j) % stride == 0``;
    * ``part="union"`` (default): both, the set a query can use in one merged head.

    The paper writes the local head as ``{max(0, i - l), ..., i}``; its extra key ``i - l`` is also
    in the strided head, so the union is the same. Every ``j <= i`` is reachable in two hops, and
    with ``stride ≈ √L`` the union has about ``1.5 L√L`` entries.
    """
    L = check_positive_int("L", L)
    stride = check_positive_int("stride", stride)
    _check_part(part, ("union", "local", "strided"))
    rel = _offsets(L, device)
    past = rel >= 0
    local = past & (rel < stride)
    every = past & (rel % stride == 0)
    return {"local": local, "strided": every, "union": local | every}[part]


def fixed_mask(L: int, stride: int, c: int, *, part: str = "union",
               device: torch.device | str | None = None) -> torch.Tensor:
    """Sparse Transformer *fixed* pattern ``(L, L)``, causal (M7.5, Child et al. 2019; ERRATA E7.1).

    Positions are cut into blocks of ``stride``; the last ``c`` positions of each block are its
    summary cells. Both heads are intersected with ``j <= i``:

    * ``part="local"``: the query's own block, ``j // stride == i // stride``;
    * ``part="summary"``: every summary cell, ``j % stride >= stride - c``;
    * ``part="union"`` (default): both.

    ``1 <= c <= stride``. Every ``j <= i`` is reachable in two hops (through the last cell of ``j``'s
    block), and with ``stride ≈ √L`` the union has O(L√L) entries.
    """
    L = check_positive_int("L", L)
    stride = check_positive_int("stride", stride)
    c = check_positive_int("c", c)
    if c > stride:
        raise ValueError(f"c must be <= stride (the summary cells are part of a block), got c={c}, stride={stride}")
    _check_part(part, ("union", "local", "summary"))
    pos = torch.arange(L, device=device)
    past = pos[:, None] >= pos[None, :]
    local = past & ((pos[:, None] // stride) == (pos[None, :] // stride))
    summary = past & (pos[None, :] % stride >= stride - c)
    return {"local": local, "summary": summary, "union": local | summary}[part]


def fixed_layout(n_blocks: int, stride_blocks: int, c_blocks: int, *,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """The *fixed* pattern on blocks, a layout ``(n_blocks, n_blocks)`` for `block_sparse_attention` (M7.5).

    `fixed_mask` applied to block indices: query block ``a`` sees key block ``b <= a`` in its own group of
    ``stride_blocks`` blocks or among the last ``c_blocks`` blocks of every group. A diagonal block is
    computed whole, so add ``causal_mask`` inside it for autoregressive use:
    ``expand_layout(layout, bs) & causal_mask(L)`` equals ``fixed_mask(L, stride_blocks * bs, c_blocks * bs)``.
    """
    return fixed_mask(n_blocks, stride_blocks, c_blocks, device=device)


def _global_indices(global_idx, L: int, device) -> torch.Tensor:
    """A boolean ``(L,)`` vector, True at the global positions; each index must lie in ``[0, L)``."""
    idx = torch.as_tensor(global_idx)
    if idx.dim() > 1:
        raise ValueError(f"global_idx must be a 1-D sequence of positions, got shape {tuple(idx.shape)}")
    if idx.numel() and (idx.dtype.is_floating_point or idx.is_complex() or idx.dtype == torch.bool):
        raise TypeError(f"global_idx must hold integer positions, got dtype {idx.dtype}")
    idx = idx.reshape(-1).long().cpu()
    if ((idx < 0) | (idx >= L)).any():
        raise ValueError(f"global_idx must lie in [0, {L}) for L={L}, got {idx.tolist()}")
    is_global = torch.zeros(L, dtype=torch.bool)
    is_global[idx] = True
    return is_global.to(device)


def longformer_mask(L: int, window: int, dilation: int = 1, global_idx=(), *,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """Longformer pattern ``(L, L)`` (M7.10, Beltagy et al. 2020): a two-sided (dilated) window plus
    global tokens.

    Allowed iff ``dilated_mask(L, window, dilation, causal=False)[i, j]``, or ``i`` or ``j`` is in
    ``global_idx`` (a global token attends everywhere and is attended from everywhere, so the global
    part is symmetric). L=32, window 2, one global token at 0 gives 212 allowed pairs.
    """
    band = dilated_mask(L, window, dilation, causal=False, device=device)
    is_global = _global_indices(global_idx, band.shape[0], band.device)
    return band | is_global[:, None] | is_global[None, :]


def sink_window_mask(L: int, n_sink: int, window: int, *,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """Attention sinks plus a recent window ``(L, L)``, causal (M7.18, Xiao et al. 2024).

    Query ``i`` may attend key ``j <= i`` iff ``j < n_sink`` (the first tokens, the "sinks") or
    ``i - j <= window`` (itself and the ``window`` previous tokens).
    """
    L = check_positive_int("L", L)
    n_sink = _check_nonneg_int("n_sink", n_sink)
    window = _check_nonneg_int("window", window)
    sinks = causal_mask(L, device=device) & (torch.arange(L, device=device) < n_sink)
    return causal_mask(L, window=window, device=device) | sinks


def bigbird_layout(n_blocks: int, n_window: int, n_random: int, n_global: int, seed: int, *,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """BigBird block layout ``(n_blocks, n_blocks)`` for `block_sparse_attention` (M7.11, Zaheer et al. 2020).

    * window: query block ``a`` sees key blocks ``|a - b| <= n_window``;
    * global: the first ``n_global`` blocks attend to every block and every block attends to them;
    * random: each other query block also sees ``n_random`` key blocks drawn uniformly, without
      replacement, from those it does not already see, using a CPU ``torch.Generator`` seeded
      with ``seed`` (same seed, same layout).

    There is no fallback to dense attention: if a query block has fewer than ``n_random`` blocks
    left to draw from, a ``ValueError`` says so.
    """
    n_blocks = check_positive_int("n_blocks", n_blocks)
    n_window = _check_nonneg_int("n_window", n_window)
    n_random = _check_nonneg_int("n_random", n_random)
    n_global = _check_nonneg_int("n_global", n_global)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if n_global > n_blocks:
        raise ValueError(f"n_global must be <= n_blocks, got n_global={n_global}, n_blocks={n_blocks}")
    blocks = torch.arange(n_blocks)
    is_global = blocks < n_global
    layout = ((blocks[:, None] - blocks[None, :]).abs() <= n_window) | is_global[:, None] | is_global[None, :]
    if n_random:
        gen = torch.Generator().manual_seed(int(seed))
        for row in range(n_global, n_blocks):                         # global rows are already full
            candidates = (~layout[row]).nonzero().flatten()
            if candidates.numel() < n_random:
                raise ValueError(
                    f"n_random={n_random} random blocks do not fit: query block {row} has only "
                    f"{candidates.numel()} blocks outside its window and the global blocks "
                    f"(n_blocks={n_blocks}, n_window={n_window}, n_global={n_global})")
            pick = candidates[torch.randperm(candidates.numel(), generator=gen)[:n_random]]
            layout[row, pick] = True
    return layout.to(device)


def expand_layout(layout: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block layout ``(..., nq, nk)`` → token mask ``(..., nq * block_size, nk * block_size)``.

    ``mask[..., i, j] = layout[..., i // block_size, j // block_size]``.
    """
    check_tensor("layout", layout, min_rank=2)
    if layout.dtype != torch.bool:
        raise TypeError(f"layout must be boolean (True = block is computed), got dtype {layout.dtype}")
    block_size = check_block_size("block_size", block_size)
    return layout.repeat_interleave(block_size, dim=-2).repeat_interleave(block_size, dim=-1)


# ----------------------------------------------------------------------------- sliding-window attention (M7.2)
def _band_masks(length: int, n_chunks: int, chunk: int, window: int, causal: bool, device):
    """Which (query, key) slots of a chunk's band are *not* allowed, as two broadcastable masks.

    Query ``t*chunk + a`` meets key ``t*chunk - window + b``. ``outside`` ``(chunk, width)``: ``i - j``
    is off the band, the same in every chunk; ``padding`` ``(n_chunks, 1, width)``: the key is a
    zero-padded position (``j < 0`` or ``j >= length``).
    """
    width = chunk + window + (0 if causal else window)
    a = torch.arange(chunk, device=device)[:, None]
    b = torch.arange(width, device=device)[None, :]
    rel = a + window - b                                               # i - j, the same in every chunk
    outside = (rel > window) | (rel < (0 if causal else -window))
    j = (torch.arange(n_chunks, device=device) * chunk)[:, None, None] - window + b
    return outside, (j < 0) | (j >= length)


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *,
                             causal: bool = False, scale: float | None = None,
                             block_size: int | None = None) -> torch.Tensor:
    """Local attention: query ``i`` sees keys ``|i - j| <= window`` (``causal``: ``0 <= i - j <= window``).

    ``q (..., L, d_k)``, ``k (..., L, d_k)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``; self-attention
    only (``Lq == Lk``). Equals `scaled_dot_product_attention` with `sliding_window_mask`.

    The queries are cut into chunks of ``block_size`` rows (default ``max(32, window // 4)``, at most
    ``L``). Chunk ``t`` attends only to the keys of its band, ``[t*bs - window, (t+1)*bs + window)``
    (causal: up to ``(t+1)*bs``), taken as a strided view of the zero-padded keys, so its scores are
    ``(..., bs, bs + 2 window)``. Chunks are processed in groups of about 1024 query rows, so the
    forward pass holds O(1024 · window) scores at a time and the backward pass keeps O(L · window)
    weights, never O(L²). Off-band slots get the dtype's lowest finite value (its exponential
    is 0 next to any real key; every real query has at least itself). A length that is not a
    multiple of ``block_size`` is padded and cut back. fp16/bf16 computed in fp32, returned in their dtype.
    """
    check_qkv(q, k, v)
    if k.shape[-2] != q.shape[-2]:
        raise ValueError(f"sliding_window_attention is self-attention and needs Lq == Lk, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    window = _check_nonneg_int("window", window)
    scale = resolve_scale(scale, q.shape[-1])
    chunk = None if block_size is None else check_block_size("block_size", block_size)
    in_dtype = q.dtype
    work = compute_dtype(in_dtype)
    out, _ = _sliding_window(*(t.to(work) for t in (q, k, v)), window, bool(causal), scale, chunk, with_lse=False)
    return out.to(in_dtype)


def _sliding_window(q, k, v, window: int, causal: bool, scale: float, chunk: int | None, *, with_lse: bool):
    """The chunked band computation of `sliding_window_attention` on checked inputs in the compute dtype;
    returns ``(out, lse)`` with the rows' logsumexp ``(..., L)`` when ``with_lse`` (else ``None``)."""
    length = q.shape[-2]
    w = min(window, length - 1)                                       # a wider band allows nothing more
    chunk = min(max(32, w // 4) if chunk is None else chunk, length)
    n_chunks = -(-length // chunk)
    pad = n_chunks * chunk - length
    right = 0 if causal else w
    width = chunk + w + right
    q_chunks = F.pad(q * scale, (0, 0, 0, pad)).unflatten(-2, (n_chunks, chunk))         # (..., n, bs, d_k)

    def bands(t: torch.Tensor) -> torch.Tensor:                                          # (..., n, width, d)
        return F.pad(t, (0, 0, w, pad + right)).unfold(-2, width, chunk).transpose(-2, -1)

    k_bands, v_bands = bands(k), bands(v)
    outside, padding = _band_masks(length, n_chunks, chunk, w, causal, q.device)
    group = max(1, 1024 // chunk)
    outs, lses = [], []
    for g in range(0, n_chunks, group):
        part = slice(g, g + group)
        scores = torch.matmul(q_chunks[..., part, :, :], k_bands[..., part, :, :].transpose(-2, -1))
        lowest = torch.finfo(scores.dtype).min                                           # bf16 under autocast
        scores.masked_fill_(outside, lowest)                                             # (..., G, bs, width)
        if padding[part].any():                                                          # edge chunks only
            scores.masked_fill_(padding[part], lowest)
        if with_lse:
            lse = torch.logsumexp(scores, dim=-1)
            weights = torch.exp(scores - lse.unsqueeze(-1))
            lses.append(lse)
        else:
            weights = torch.softmax(scores, dim=-1)
        outs.append(torch.matmul(weights, v_bands[..., part, :, :]))
    out = torch.cat(outs, dim=-3).flatten(-3, -2)[..., :length, :]
    lse = torch.cat(lses, dim=-2).flatten(-2, -1)[..., :length] if with_lse else None
    return out, lse


def longformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, global_idx=(), *,
                         scale: float | None = None) -> torch.Tensor:
    """Longformer attention without the L x L matrix (M7.10): equals `dense_masked_attention` with
    ``longformer_mask(L, window, 1, global_idx)``. ``q, k (..., L, d_k)``, ``v (..., L, d_v)``.

    Three parts: the band, by `sliding_window_attention`'s chunks (with its logsumexp); the global keys
    that lie outside a query's band, ``(L, G)`` scores; the two merged exactly with `merge_partials`.
    Then the ``G`` global queries' rows are replaced by full attention over all keys. Memory
    O(L · (window + G)). fp16/bf16 computed in fp32.
    """
    check_qkv(q, k, v)
    length = q.shape[-2]
    if k.shape[-2] != length:
        raise ValueError(f"longformer_attention is self-attention and needs Lq == Lk, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    window = _check_nonneg_int("window", window)
    g = _global_indices(global_idx, length, q.device).nonzero().flatten()
    scale = resolve_scale(scale, q.shape[-1])
    in_dtype = q.dtype
    work = compute_dtype(in_dtype)
    q, k, v = (t.to(work) for t in (q, k, v))
    out, lse = _sliding_window(q, k, v, window, False, scale, None, with_lse=True)
    if g.numel():
        off_band = (torch.arange(length, device=q.device)[:, None] - g[None, :]).abs() > window      # (L, G)
        out_g, lse_g = attention_with_lse(q, k.index_select(-2, g), v.index_select(-2, g), off_band, scale=scale)
        out, _ = merge_partials([out, out_g], [lse, lse_g])
        rows = scaled_dot_product_attention(q.index_select(-2, g), k, v, scale=scale)
        out = out.index_copy(-2, g, rows)
    return out.to(in_dtype)


# ----------------------------------------------------------------------------- block-sparse attention (M7.1)
def _check_layout(layout, q: torch.Tensor, n_q: int, n_k: int, block_size: int) -> None:
    check_tensor("layout", layout)
    if layout.dtype != torch.bool:
        raise TypeError(f"layout must be boolean (True = block is computed), got dtype {layout.dtype}")
    expected = [(n_q, n_k)]
    if q.dim() >= 3:
        expected.append((q.shape[-3], n_q, n_k))
    if tuple(layout.shape) not in expected:
        options = " or ".join(str(e) for e in expected)
        raise ValueError(f"layout must have shape {options} (query blocks x key blocks, optionally per head) for "
                         f"q {tuple(q.shape)} and block_size={block_size}, got layout {tuple(layout.shape)}")


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: torch.Tensor,
                           block_size: int, *, scale: float | None = None) -> torch.Tensor:
    """Attention computed only on the key blocks a boolean block ``layout`` names.

    ``q (..., Lq, d_k)``, ``k (..., Lk, d_k)``, ``v (..., Lk, d_v)`` → ``(..., Lq, d_v)``. ``layout`` is
    ``(ceil(Lq/block_size), ceil(Lk/block_size))``, shared by all heads, or ``(H, ...)`` with ``H = q.shape[-3]``:
    query block ``a`` attends key block ``b`` iff ``layout[a, b]``. Equals
    `scaled_dot_product_attention` with ``mask=expand_layout(layout, block_size)``; a query block
    with no active key block returns zeros. A length that is not a multiple of ``block_size`` has a
    ragged last block: the layout has ``ceil(L / block_size)`` blocks on that side, the inputs are
    zero-padded and the padded keys masked, and the reference is ``expand_layout(...)[..., :Lq, :Lk]``.

    The active ``(a, b)`` pairs are gathered into one batch of ``block_size x block_size`` score
    tiles (memory and FLOPs proportional to the number of active blocks), and the softmax is
    taken per query row across its tiles: a per-row max (no gradient needed, the softmax is
    shift-invariant), then the exponentials' sums and the weighted values are added into their
    query block with ``index_add``. fp16/bf16 are computed in fp32 and returned in their dtype.
    """
    check_qkv(q, k, v)
    block_size = check_block_size("block_size", block_size)
    l_q, l_k = q.shape[-2], k.shape[-2]
    n_q, n_k = -(-l_q // block_size), -(-l_k // block_size)
    _check_layout(layout, q, n_q, n_k, block_size)
    scale = resolve_scale(scale, q.shape[-1])
    in_dtype = q.dtype
    work = compute_dtype(in_dtype)
    d_k, d_v = q.shape[-1], v.shape[-1]
    layout = layout.to(q.device)

    # Rows of blocks: (N, R, bs, d) with R = n_q (shared layout) or H * n_q (per head, head-major).
    per_head = layout.dim() == 3
    heads = layout.shape[0] if per_head else 1
    pad_q, pad_k = n_q * block_size - l_q, n_k * block_size - l_k
    qb = F.pad(q.to(work), (0, 0, 0, pad_q)).reshape(-1, heads * n_q, block_size, d_k)
    kb = F.pad(k.to(work), (0, 0, 0, pad_k)).reshape(-1, heads * n_k, block_size, d_k)
    vb = F.pad(v.to(work), (0, 0, 0, pad_k)).reshape(-1, heads * n_k, block_size, d_v)
    pairs = layout.reshape(heads, n_q, n_k).nonzero()                                     # (P, 3): head, a, b
    q_idx = pairs[:, 0] * n_q + pairs[:, 1]
    k_idx = pairs[:, 0] * n_k + pairs[:, 2]

    scores = torch.matmul(qb.index_select(1, q_idx), kb.index_select(1, k_idx).transpose(-2, -1)) * scale
    if pad_k:                                                                             # padded keys of the last block
        key_pos = pairs[:, 2, None] * block_size + torch.arange(block_size, device=q.device)
        scores = scores.masked_fill((key_pos >= l_k)[:, None, :], float("-inf"))
    n, rows = qb.shape[0], qb.shape[1]                                                    # scores (N, P, bs, bs)
    with torch.no_grad():                                                                 # per-row max over its tiles
        tile_max = scores.amax(dim=-1)                                                    # (N, P, bs)
        row_max = tile_max.new_zeros(n, rows, block_size).scatter_reduce(
            1, q_idx.view(1, -1, 1).expand_as(tile_max), tile_max, "amax", include_self=False)
        row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)                      # only padded keys
    p = torch.exp(scores - row_max.index_select(1, q_idx).unsqueeze(-1))
    denom = scores.new_zeros(n, rows, block_size).index_add(1, q_idx, p.sum(dim=-1))
    numer = scores.new_zeros(n, rows, block_size, d_v).index_add(1, q_idx, torch.matmul(p, vb.index_select(1, k_idx)))
    has_key = denom > 0                                                                   # False: no active block
    out = numer / torch.where(has_key, denom, torch.ones_like(denom)).unsqueeze(-1)
    out = out.reshape(q.shape[:-2] + (n_q * block_size, d_v))[..., :l_q, :]
    return out.to(in_dtype)


# ----------------------------------------------------------------------------- combining factorised patterns (M7.6)
class FactorizedSparseAttention(nn.Module):
    """Multi-head self-attention with several sparse masks combined one of three ways (M7.6, Child et al. 2019).

    ``masks`` is a sequence of boolean ``(L, L)`` masks (e.g. ``strided_mask(L, s, part="local")`` and
    ``part="strided"``). ``mode``:

    * ``"merged"``: every head uses the union of the masks;
    * ``"per_head"``: head ``h`` uses ``masks[h % len(masks)]``;
    * ``"interleaved"``: all heads use ``masks[layer % len(masks)]``, so a stack alternates patterns.

    ``forward(x (..., L, d_model))`` → ``(..., L, d_model)``; `head_masks` gives the ``(H, L, L)``
    masks used, so a test or a figure can check them against `dense_masked_attention`.
    """

    def __init__(self, d_model: int, n_heads: int, masks, mode: str = "merged", layer: int = 0):
        super().__init__()
        d_model, n_heads = check_positive_int("d_model", d_model), check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        if mode not in ("merged", "per_head", "interleaved"):
            raise ValueError(f"mode must be 'merged', 'per_head' or 'interleaved', got {mode!r}")
        self.mode = mode
        masks = list(masks)
        if not masks:
            raise ValueError("masks must be a non-empty sequence of boolean (L, L) masks")
        for i, m in enumerate(masks):
            _check_square_mask(m)
            if m.shape != masks[0].shape:
                raise ValueError(f"masks[{i}] has shape {tuple(m.shape)}, masks[0] {tuple(masks[0].shape)}")
        self.register_buffer("masks", torch.stack(masks), persistent=False)
        self.n_heads, self.layer = n_heads, _check_nonneg_int("layer", layer)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def head_masks(self) -> torch.Tensor:
        """The ``(H, L, L)`` mask each head uses."""
        n = self.masks.shape[0]
        if self.mode == "merged":
            chosen = self.masks.any(dim=0).expand(self.n_heads, -1, -1)
        elif self.mode == "per_head":
            chosen = self.masks[torch.arange(self.n_heads) % n]
        else:
            chosen = self.masks[self.layer % n].expand(self.n_heads, -1, -1)
        return chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, min_rank=2, floating=True)
        if x.shape[-2] != self.masks.shape[-1]:
            raise ValueError(f"x has length {x.shape[-2]} but the masks are {tuple(self.masks.shape[-2:])}")
        q, k, v = self.qkv(x).unflatten(-1, (3, self.n_heads, -1)).movedim(-3, 0).transpose(-3, -2)   # (..., H, L, dh)
        out = dense_masked_attention(q, k, v, self.head_masks())                          # (..., H, L, d_head)
        return self.out(out.movedim(-3, -2).flatten(-2, -1))


# ----------------------------------------------------------------------------- graph view of a mask (M7.1)
def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                           scale: float | None = None) -> torch.Tensor:
    """The reference every sparse kernel is checked against: softmax attention over the full ``L x L``
    scores with ``mask`` (True = may attend); a row with no allowed key returns zeros (M7.1)."""
    check_tensor("mask", mask, min_rank=2)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    return scaled_dot_product_attention(q, k, v, mask, scale=scale)


def nnz(mask: torch.Tensor) -> int:
    """Number of allowed (query, key) pairs: the True entries of a boolean mask or layout."""
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean, got dtype {mask.dtype}")
    return int(mask.sum())


def _check_square_mask(mask) -> torch.Tensor:
    check_tensor("mask", mask, rank=2)
    if mask.dtype != torch.bool or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"mask must be a square boolean (L, L) matrix, got shape {tuple(mask.shape)} "
                         f"and dtype {mask.dtype}")
    return mask


def receptive_field(mask: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Which inputs can reach each output after ``n_layers`` attention layers with this mask ``(L, L)``.

    A layer with a residual connection lets ``i`` hear ``j`` if ``i == j`` or ``mask[i, j]``, so the
    field after ``n`` layers is the boolean power ``(I | mask)^n``: ``reach[i, j]`` is True iff a path
    ``i -> ... -> j`` of at most ``n`` mask edges exists. ``n_layers = 0`` is the identity.
    """
    mask = _check_square_mask(mask)
    n_layers = _check_nonneg_int("n_layers", n_layers)
    step = (mask | torch.eye(mask.shape[0], dtype=torch.bool, device=mask.device)).float()
    reach = torch.eye(mask.shape[0], device=mask.device)
    for _ in range(n_layers):
        reach = ((reach @ step) > 0).float()
    return reach.bool()


def hop_distances(mask: torch.Tensor) -> torch.Tensor:
    """Shortest path lengths ``(L, L)`` (float; ``inf`` if unreachable) in the graph ``i -> j`` iff ``mask[i, j]``.

    Breadth-first search for all sources at once: hop ``h`` adds the pairs first reached by
    ``reach @ mask``. ``hops[i, j]`` is the number of layers before output ``i`` first hears input ``j``.
    """
    mask = _check_square_mask(mask)
    length = mask.shape[0]
    step = mask.float()
    reach = torch.eye(length, dtype=torch.bool, device=mask.device)
    hops = torch.full((length, length), float("inf"), device=mask.device)
    hops[reach] = 0.0
    for h in range(1, length):
        new = ((reach.float() @ step) > 0) & ~reach
        if not new.any():
            break
        hops[new] = float(h)
        reach |= new
    return hops


def graph_diameter(mask: torch.Tensor) -> float:
    """Longest shortest path over all ordered pairs of `hop_distances`; ``inf`` if some pair is unreachable
    (a causal mask, whose early tokens never hear later ones, has infinite diameter)."""
    return float(hop_distances(mask).max())


# ----------------------------------------------------------------------------- Image Transformer local attention (M7.4)
def local1d_mask(L: int, q_block: int, mem_len: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Image Transformer 1-D local attention ``(L, L)``, causal in raster order (M7.4, Parmar et al. 2018).

    The flattened image is cut into query blocks of ``q_block`` positions; every query in the block
    starting at ``s`` sees the ``mem_len`` positions before the block and the earlier positions of its
    own block: ``s - mem_len <= j <= i``. A ragged last block is allowed.
    """
    L = check_positive_int("L", L)
    q_block = check_positive_int("q_block", q_block)
    mem_len = _check_nonneg_int("mem_len", mem_len)
    pos = torch.arange(L, device=device)
    start = (pos // q_block) * q_block
    return (pos[None, :] <= pos[:, None]) & (pos[None, :] >= (start - mem_len)[:, None])


def local2d_mask(H: int, W: int, q_h: int, q_w: int, ext_h: int, ext_w: int, *,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Image Transformer 2-D local attention ``(H*W, H*W)`` over pixels in raster order (M7.4).

    The image is tiled into ``q_h x q_w`` query blocks. A block's memory is the block extended by
    ``ext_h`` rows above and ``ext_w`` columns left and right; pixel ``i`` sees the pixels ``j`` of
    its memory that come no later in raster order (``j <= i``), so generation stays causal.
    """
    H, W = check_positive_int("H", H), check_positive_int("W", W)
    q_h, q_w = check_positive_int("q_h", q_h), check_positive_int("q_w", q_w)
    ext_h, ext_w = _check_nonneg_int("ext_h", ext_h), _check_nonneg_int("ext_w", ext_w)
    pos = torch.arange(H * W, device=device)
    row, col = pos // W, pos % W
    top, left = (row // q_h) * q_h, (col // q_w) * q_w                 # corner of the query's block
    in_rows = (row[None, :] >= (top - ext_h)[:, None]) & (row[None, :] < (top + q_h)[:, None])
    in_cols = (col[None, :] >= (left - ext_w)[:, None]) & (col[None, :] < (left + q_w + ext_w)[:, None])
    return in_rows & in_cols & (pos[None, :] <= pos[:, None])


# ----------------------------------------------------------------------------- blockwise attention (M7.8)
def _check_perm(perm, n_blocks: int) -> torch.Tensor:
    if perm is None:
        return torch.arange(n_blocks)
    p = torch.as_tensor(perm)
    if p.dim() != 1 or p.dtype.is_floating_point or p.dtype == torch.bool or p.numel() != n_blocks \
            or not torch.equal(p.sort().values.cpu(), torch.arange(n_blocks)):
        raise ValueError(f"perm must be a permutation of range(n_blocks={n_blocks}), got {p.tolist()}")
    return p.long().cpu()


def _blockwise_size(L: int, n_blocks: int) -> int:
    n_blocks = check_positive_int("n_blocks", n_blocks)
    if L % n_blocks:
        raise ValueError(f"n_blocks={n_blocks} must divide the sequence length L={L} (blockwise attention cuts "
                         f"it into n equal blocks)")
    return L // n_blocks


def blockwise_layout(n_blocks: int, perm=None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Permutation-matrix layout ``(n, n)``: query block ``a`` attends key block ``perm[a]`` (M7.8)."""
    n_blocks = check_positive_int("n_blocks", n_blocks)
    p = _check_perm(perm, n_blocks)
    layout = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    layout[torch.arange(n_blocks), p] = True
    return layout.to(device)


def blockwise_mask(L: int, n_blocks: int, perm=None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Blockwise (BlockBERT) token mask ``(L, L)`` (M7.8, Qiu et al. 2020; ERRATA E7.3): the sequence is
    cut into ``n_blocks`` blocks of ``L / n_blocks`` and query block ``a`` sees key block ``perm[a]``
    (default: the identity, each block sees itself). ``L % n_blocks != 0`` raises ``ValueError``."""
    L = check_positive_int("L", L)
    size = _blockwise_size(L, n_blocks)
    return expand_layout(blockwise_layout(n_blocks, perm, device=device), size)


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_blocks: int, perm=None, *,
                        scale: float | None = None) -> torch.Tensor:
    """Blockwise attention by reshaping (M7.8): ``q, k (..., L, d_k)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``.

    ``q`` becomes ``(..., n, L/n, d_k)``, the key and value blocks are reordered by ``perm``, and each
    query block attends only its key block, so the scores are ``(..., n, L/n, L/n)``: ``L²/n``
    entries. Equals `dense_masked_attention` with `blockwise_mask`. fp16/bf16 computed in fp32.
    """
    check_qkv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"blockwise_attention needs Lq == Lk, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    size = _blockwise_size(q.shape[-2], n_blocks)
    p = _check_perm(perm, n_blocks).to(q.device)
    scale = resolve_scale(scale, q.shape[-1])
    in_dtype = q.dtype
    work = compute_dtype(in_dtype)
    qb, kb, vb = (t.to(work).unflatten(-2, (n_blocks, size)) for t in (q, k, v))      # (..., n, L/n, d)
    kb, vb = kb.index_select(-3, p), vb.index_select(-3, p)
    weights = torch.softmax(torch.matmul(qb, kb.transpose(-2, -1)) * scale, dim=-1)    # (..., n, L/n, L/n)
    return torch.matmul(weights, vb).flatten(-3, -2).to(in_dtype)


# ----------------------------------------------------------------------------- ETC global-local (M7.9)
def etc_masks(segment_ids, radius: int, *, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """ETC's four attention pieces for structured input (M7.9, Ainslie et al. 2020), boolean, True = may attend.

    ``segment_ids`` ``(n_l,)`` gives the segment (e.g. sentence) of each long token, as integers
    ``0 .. n_g - 1``; there is one global token per segment, so ``n_g = max + 1``. Returns

    * ``"g2g"`` ``(n_g, n_g)``: all True, the globals see each other;
    * ``"g2l"`` ``(n_g, n_l)``: a global sees the long tokens of its own segment (ETC's hard mask for
      structured input);
    * ``"l2g"`` ``(n_l, n_g)``: all True, a long token sees every global;
    * ``"l2l"`` ``(n_l, n_l)``: the band ``|i - j| <= radius``;
    * ``"full"`` ``((n_g + n_l), (n_g + n_l))``: the four pieces assembled, globals first.
    """
    seg = torch.as_tensor(segment_ids)
    if seg.dim() != 1 or seg.numel() == 0 or seg.dtype.is_floating_point or seg.dtype == torch.bool:
        raise ValueError(f"segment_ids must be a non-empty 1-D integer tensor, got shape {tuple(seg.shape)} "
                         f"and dtype {seg.dtype}")
    if int(seg.min()) < 0:
        raise ValueError(f"segment_ids must be >= 0, got min {int(seg.min())}")
    seg = seg.long().to(device)
    radius = _check_nonneg_int("radius", radius)
    n_g = int(seg.max()) + 1
    g2l = torch.arange(n_g, device=seg.device)[:, None] == seg[None, :]
    parts = {"g2g": torch.ones(n_g, n_g, dtype=torch.bool, device=seg.device), "g2l": g2l,
             "l2g": torch.ones(seg.numel(), n_g, dtype=torch.bool, device=seg.device),
             "l2l": sliding_window_mask(seg.numel(), radius, device=seg.device)}
    parts["full"] = torch.cat([torch.cat([parts["g2g"], parts["g2l"]], 1),
                               torch.cat([parts["l2g"], parts["l2l"]], 1)], 0)
    return parts


def mask_to_bias(mask: torch.Tensor, C: float = 1e4) -> torch.Tensor:
    """The additive form ETC (and BERT) use instead of a boolean mask: ``0`` where allowed, ``-C`` elsewhere
    (float32). Equal to boolean masking up to ``exp(-C + spread of the logits)``; a fully masked row
    becomes uniform instead of zero."""
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    return (~mask).float() * -float(C)


# ----------------------------------------------------------------------------- LSH and Reformer attention (M7.12, M7.13)
def lsh_rotations(d: int, n_buckets: int, n_rounds: int, seed: int, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """The random rotations ``(n_rounds, d, n_buckets/2)`` of `lsh_hash`: i.i.d. N(0, 1) entries drawn from a
    CPU ``torch.Generator`` seeded with ``seed`` (same seed, same rotations, on any device)."""
    d = check_positive_int("d", d)
    n_buckets = check_positive_int("n_buckets", n_buckets)
    if n_buckets % 2:
        raise ValueError(f"n_buckets must be even (the hash is argmax over [xR, -xR]), got {n_buckets}")
    n_rounds = check_positive_int("n_rounds", n_rounds)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r}")
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(n_rounds, d, n_buckets // 2, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def lsh_hash(x: torch.Tensor, n_buckets: int, n_rounds: int = 1, seed: int = 0) -> torch.Tensor:
    """Angular LSH by random rotations (M7.12, Andoni et al. 2015 as used by Kitaev et al. 2020).

    ``x (..., L, d)`` → bucket ids ``(..., n_rounds, L)`` in ``[0, n_buckets)``:
    ``h(x) = argmax([xR; -xR])`` with ``R`` of `lsh_rotations` (one per round, shared by all leading
    dims). Nearby directions tend to share a bucket; the chance falls with the angle between them.
    ``n_buckets`` must be even.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    rot = lsh_rotations(x.shape[-1], n_buckets, n_rounds, seed, device=x.device,
                        dtype=compute_dtype(x.dtype))
    proj = torch.einsum("...ld,rdb->...rlb", x.to(rot.dtype), rot)                   # (..., R, L, b/2)
    return torch.cat([proj, -proj], dim=-1).argmax(dim=-1)


def lsh_collision_rate(theta: float, n_buckets: int, *, n_pairs: int = 2000, d: int = 16, n_rounds: int = 8,
                       seed: int = 0) -> float:
    """Fraction of unit-vector pairs at angle ``theta`` (radians) that `lsh_hash` puts in the same bucket
    (M7.12), over ``n_pairs`` random pairs in ``d`` dimensions and ``n_rounds`` rounds of rotations.

    With 2 buckets the hash is the side of a random hyperplane, so the rate estimates ``1 - theta / pi``.
    """
    n_pairs, d = check_positive_int("n_pairs", n_pairs), check_positive_int("d", d)
    if d < 2:
        raise ValueError(f"d must be >= 2 to hold two directions at an angle, got {d}")
    gen = torch.Generator().manual_seed(int(seed))
    a = F.normalize(torch.randn(n_pairs, d, generator=gen, dtype=torch.float64), dim=-1)
    b = torch.randn(n_pairs, d, generator=gen, dtype=torch.float64)
    b = F.normalize(b - (b * a).sum(-1, keepdim=True) * a, dim=-1)                  # unit, orthogonal to a
    c = math.cos(theta) * a + math.sin(theta) * b                                   # at angle theta from a
    rot_seed = int(seed) + 1
    return (lsh_hash(a, n_buckets, n_rounds, rot_seed) == lsh_hash(c, n_buckets, n_rounds, rot_seed)).double().mean().item()


SELF_LOGIT = -1e5          # shared QK: a query's own logit (HF Reformer's value); finite, so a lone query still attends itself


def _check_shared_qk(qk, v) -> None:
    check_tensor("qk", qk, min_rank=2, floating=True)
    check_tensor("v", v, min_rank=2, floating=True)
    if qk.shape[:-1] != v.shape[:-1] or qk.dtype != v.dtype or qk.device != v.device:
        raise ValueError(f"qk and v must agree in every dim but the last, dtype and device, got qk {tuple(qk.shape)} "
                         f"{qk.dtype} and v {tuple(v.shape)} {v.dtype}")


def _lse_attention(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax(scores) @ v and the rows' logsumexp; a row of ``-inf`` gives zeros and ``-inf``."""
    m = scores.detach().amax(dim=-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    e = torch.exp(scores - m)
    total = e.sum(dim=-1, keepdim=True)
    has_key = total > 0
    total = torch.where(has_key, total, torch.ones_like(total))
    lse = torch.where(has_key, m + torch.log(total), float("-inf")).squeeze(-1)
    return torch.matmul(e / total, v), lse


def _lsh_buckets(qk, n_buckets, n_rounds, seed, buckets):
    if buckets is None:
        return lsh_hash(qk, n_buckets, n_rounds, seed)
    check_tensor("buckets", buckets)
    if buckets.dtype.is_floating_point or buckets.dtype == torch.bool or \
            tuple(buckets.shape) != tuple(qk.shape[:-2]) + (n_rounds, qk.shape[-2]):
        raise ValueError(f"buckets must be integer ids of shape {tuple(qk.shape[:-2]) + (n_rounds, qk.shape[-2])} "
                         f"(..., n_rounds, L) for qk {tuple(qk.shape)}, got {tuple(buckets.shape)} {buckets.dtype}")
    return buckets.to(qk.device).long()


def lsh_attention(qk: torch.Tensor, v: torch.Tensor, n_buckets: int, chunk_len: int, n_rounds: int = 1,
                  seed: int = 0, causal: bool = False, *, scale: float | None = None,
                  buckets: torch.Tensor | None = None) -> torch.Tensor:
    """Reformer LSH attention (M7.13, Kitaev et al. 2020): shared QK, sort by bucket, attend in chunks.

    ``qk (..., L, d)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``. Keys are ``qk / ||qk||`` (ERRATA E7.4).
    Each round hashes ``qk`` (`lsh_hash`, or the given ``buckets (..., n_rounds, L)``), sorts the
    positions by (bucket, position), cuts the sorted order into chunks of ``chunk_len`` (the last
    padded), and lets every chunk attend to itself and the chunk before it (cyclically), as the
    reference implementations do (keys of another bucket inside that window are not masked). A
    query's own key gets the logit `SELF_LOGIT`, so it is used only when nothing else is allowed;
    ``causal`` forbids later positions. The rounds are combined with their logsumexps,
    ``out = Σ_r exp(lse_r - lse) out_r`` (a key found in several rounds counts in each). With one
    chunk holding the whole sequence this is full shared-QK attention with self-masking.
    fp16/bf16 computed in fp32. `lsh_attention_reference` is the same computation with dense masks.
    """
    _check_shared_qk(qk, v)
    chunk_len = check_block_size("chunk_len", chunk_len)
    n_rounds = check_positive_int("n_rounds", n_rounds)
    bk = _lsh_buckets(qk, n_buckets, n_rounds, seed, buckets)
    length, d_v = qk.shape[-2], v.shape[-1]
    scale = resolve_scale(scale, qk.shape[-1])
    in_dtype = qk.dtype
    work = compute_dtype(in_dtype)
    qk, v = qk.to(work), v.to(work)
    keys = F.normalize(qk, dim=-1)

    pos = torch.arange(length, device=qk.device)
    order = torch.argsort(bk * length + pos, dim=-1)                                   # (..., R, L)
    n_chunks = -(-length // chunk_len)
    pad = n_chunks * chunk_len - length

    def sort_chunk(t):                                                                  # (..., R, n, c, d)
        t = t.unsqueeze(-3).expand(*t.shape[:-2], n_rounds, length, t.shape[-1])
        t = t.gather(-2, order.unsqueeze(-1).expand(*order.shape, t.shape[-1]))
        return F.pad(t, (0, 0, 0, pad)).unflatten(-2, (n_chunks, chunk_len))

    def with_previous(t):                                                               # keys of chunk and chunk-1
        return t if n_chunks == 1 else torch.cat([t, t.roll(1, dims=-3)], dim=-2)

    sq, sk, sv = sort_chunk(qk), with_previous(sort_chunk(keys)), with_previous(sort_chunk(v))
    pq = F.pad(order, (0, pad), value=-1).unflatten(-1, (n_chunks, chunk_len))        # positions, -1 = padding
    pk = with_previous(pq.unsqueeze(-1)).squeeze(-1)
    scores = torch.matmul(sq, sk.transpose(-2, -1)) * scale                             # (..., R, n, c, c or 2c)
    same = pq.unsqueeze(-1) == pk.unsqueeze(-2)
    scores = scores.masked_fill(same, SELF_LOGIT)
    banned = (pk < 0).unsqueeze(-2).expand_as(scores)
    if causal:
        banned = banned | (pk.unsqueeze(-2) > pq.unsqueeze(-1))
    out, lse = _lse_attention(scores.masked_fill(banned, float("-inf")), sv)

    undo = torch.argsort(order, dim=-1)                                                 # back to positions
    out = out.flatten(-3, -2)[..., :length, :].gather(-2, undo.unsqueeze(-1).expand(*undo.shape, d_v))
    lse = lse.flatten(-2, -1)[..., :length].gather(-1, undo)
    out, _ = merge_partials(out.unbind(-3), lse.unbind(-2))
    return out.to(in_dtype)


def lsh_attention_reference(qk: torch.Tensor, v: torch.Tensor, buckets: torch.Tensor, chunk_len: int,
                            causal: bool = False, *, scale: float | None = None) -> torch.Tensor:
    """`lsh_attention` written with dense masks, for reading and testing: ``qk (L, d)``, ``v (L, d_v)``,
    ``buckets (n_rounds, L)``. Per round, a Python loop marks which (query, key) pairs share a chunk or
    sit in neighbouring chunks of the sorted order; dense attention with that mask, the self logit and
    causality gives ``(out_r, lse_r)``, and the rounds are merged by logsumexp."""
    check_tensor("qk", qk, rank=2, floating=True)
    check_tensor("buckets", buckets, rank=2)
    length = qk.shape[0]
    scale = resolve_scale(scale, qk.shape[-1])
    scores = (qk @ F.normalize(qk, dim=-1).T) * scale
    scores = scores.masked_fill(torch.eye(length, dtype=torch.bool, device=qk.device), SELF_LOGIT)
    n_chunks = -(-length // chunk_len)
    outs, lses = [], []
    for round_buckets in buckets.tolist():
        order = sorted(range(length), key=lambda i: (round_buckets[i], i))
        chunk = {pos: rank // chunk_len for rank, pos in enumerate(order)}
        allowed = torch.zeros(length, length, dtype=torch.bool)
        for i in range(length):
            for j in range(length):
                allowed[i, j] = chunk[j] in (chunk[i], (chunk[i] - 1) % n_chunks) and not (causal and j > i)
        out, lse = _lse_attention(scores.masked_fill(~allowed.to(qk.device), float("-inf")), v)
        outs.append(out)
        lses.append(lse)
    return merge_partials(outs, lses)[0]


# ----------------------------------------------------------------------------- reversible layers, chunking, recompute (M7.14, M7.15, M7.7)
class RevBlock(nn.Module):
    """Reversible residual block (M7.14, Gomez et al. 2017): ``y1 = x1 + F(x2)``, ``y2 = x2 + G(y1)``.

    `inverse` recovers ``x2 = y2 - G(y1)``, ``x1 = y1 - F(x2)`` from the outputs alone, so a stack of
    them need not store its activations (`reversible_sequence`). ``F`` and ``G`` must be deterministic
    (no dropout) and map ``(..., d)`` to ``(..., d)``.
    """

    def __init__(self, F: nn.Module, G: nn.Module):
        super().__init__()
        self.F, self.G = F, G

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y1 = x1 + self.F(x2)
        return y1, x2 + self.G(y1)

    def inverse(self, y1: torch.Tensor, y2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = y2 - self.G(y1)
        return y1 - self.F(x2), x2


class _Reversible(torch.autograd.Function):
    """Runs the blocks without a graph; backward rebuilds each block's input with `RevBlock.inverse`,
    recomputes that block with a graph and backpropagates through it, one block at a time."""

    @staticmethod
    def forward(ctx, x1, x2, blocks, *params):
        with torch.no_grad():
            for block in blocks:
                x1, x2 = block(x1, x2)
        ctx.blocks = blocks
        ctx.save_for_backward(x1, x2)
        return x1, x2

    @staticmethod
    def backward(ctx, dy1, dy2):
        y1, y2 = ctx.saved_tensors
        grads = []
        for block in reversed(ctx.blocks):
            with torch.no_grad():
                x1, x2 = block.inverse(y1, y2)
            with torch.enable_grad():
                a, b = x1.detach().requires_grad_(), x2.detach().requires_grad_()
                params = [p for p in block.parameters() if p.requires_grad]
                out = block(a, b)
                g = torch.autograd.grad(out, [a, b] + params, (dy1, dy2), allow_unused=True)
            dy1, dy2 = g[0], g[1]
            grads = list(g[2:]) + grads
            y1, y2 = x1, x2
        return (dy1, dy2, None, *grads)


def reversible_sequence(blocks, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply `RevBlock` s in order, storing only the final outputs: activation memory does not grow with
    depth, and the backward pass recomputes each block from its reconstructed input (M7.14). Outputs
    and gradients equal the plain ``for block in blocks: x1, x2 = block(x1, x2)`` up to rounding."""
    blocks = list(blocks)
    if not blocks or not all(isinstance(b, RevBlock) for b in blocks):
        raise TypeError(f"blocks must be a non-empty sequence of RevBlock, got {[type(b).__name__ for b in blocks]}")
    check_tensor("x1", x1, floating=True)
    check_tensor("x2", x2, floating=True)
    if x1.shape != x2.shape:
        raise ValueError(f"x1 and x2 must have the same shape, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    params = [p for b in blocks for p in b.parameters() if p.requires_grad]
    return _Reversible.apply(x1, x2, blocks, *params)


def chunked_ff(ff, x: torch.Tensor, n_chunks: int) -> torch.Tensor:
    """Position-wise feed-forward ``ff`` applied to ``n_chunks`` slices of the sequence (dim -2) in turn
    (M7.15, Reformer): the hidden ``(..., L, d_ff)`` activation exists for ``L / n_chunks`` rows at a
    time. Equal to ``ff(x)`` because ``ff`` acts on each position separately; a ragged last chunk is fine."""
    check_tensor("x", x, min_rank=2)
    n_chunks = check_positive_int("n_chunks", n_chunks)
    return torch.cat([ff(part) for part in torch.tensor_split(x, n_chunks, dim=-2)], dim=-2)


def checkpointed_sequence(blocks, x: torch.Tensor) -> torch.Tensor:
    """Apply ``blocks`` in order, keeping only each block's input for backward and recomputing its inside
    (gradient checkpointing, M7.7, Chen et al. 2016). Gradients equal the plain loop's."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("blocks must be a non-empty sequence of modules")
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x


# ----------------------------------------------------------------------------- Routing Transformer (M7.16)
def _check_centroids(x, centroids):
    check_tensor("centroids", centroids, rank=2, floating=True)
    if centroids.shape[-1] != x.shape[-1]:
        raise ValueError(f"centroids (k, d) must have d = {x.shape[-1]} like x {tuple(x.shape)}, got "
                         f"{tuple(centroids.shape)}")


def routing_assign(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Cluster of each vector ``x (..., L, d)`` → ``(..., L)``: the centroid ``(k, d)`` of largest cosine
    similarity, ``argmax_c <x/|x|, mu_c/|mu_c|>`` (nearest centroid on the unit sphere, M7.16)."""
    check_tensor("x", x, min_rank=1, floating=True)
    _check_centroids(x, centroids)
    work = compute_dtype(x.dtype)
    sim = F.normalize(x.to(work), dim=-1) @ F.normalize(centroids.to(work), dim=-1).T
    return sim.argmax(dim=-1)


def routing_mask(q: torch.Tensor, k: torch.Tensor, centroids: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Routing Transformer mask ``(..., Lq, Lk)`` (M7.16, Roy et al. 2021): query ``i`` may attend key ``j``
    iff both are routed to the same centroid (and ``j <= i`` with ``causal``, bottom-right aligned)."""
    check_tensor("q", q, min_rank=2, floating=True)
    check_tensor("k", k, min_rank=2, floating=True)
    mask = routing_assign(q, centroids).unsqueeze(-1) == routing_assign(k, centroids).unsqueeze(-2)
    if causal:
        mask = mask & causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    return mask


def kmeans_ema_update(centroids: torch.Tensor, x: torch.Tensor, assignments: torch.Tensor,
                      decay: float = 0.999) -> torch.Tensor:
    """One online k-means step (M7.16): ``mu_c <- decay mu_c + (1 - decay) mean{x_i : a_i = c}``.

    ``centroids (k, d)``, ``x (N, d)`` (any leading dims are flattened), ``assignments`` the matching
    cluster ids. A cluster with no member keeps its centroid. Returns new centroids, no gradient.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    _check_centroids(x, centroids)
    if not 0.0 <= float(decay) <= 1.0:
        raise ValueError(f"decay must lie in [0, 1], got {decay}")
    if tuple(assignments.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"assignments must have shape {tuple(x.shape[:-1])} (x without its last dim) for x "
                         f"{tuple(x.shape)}, got {tuple(assignments.shape)}")
    with torch.no_grad():
        n_c = centroids.shape[0]
        a = assignments.reshape(-1).long()
        if a.numel() and (int(a.min()) < 0 or int(a.max()) >= n_c):
            raise ValueError(f"assignments must lie in [0, {n_c}) for {n_c} centroids")
        flat = x.detach().reshape(-1, x.shape[-1]).to(centroids.dtype)
        sums = torch.zeros_like(centroids).index_add(0, a, flat)
        counts = torch.zeros(n_c, dtype=centroids.dtype, device=centroids.device).index_add(
            0, a, torch.ones_like(a, dtype=centroids.dtype))
        means = sums / counts.clamp(min=1).unsqueeze(-1)
        updated = decay * centroids + (1 - decay) * means
        return torch.where((counts > 0).unsqueeze(-1), updated, centroids)


def routing_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, centroids: torch.Tensor, window: int, *,
                      scale: float | None = None) -> torch.Tensor:
    """Balanced routing attention as the Routing Transformer code runs it (M7.16): ``q (..., Lq, d)``,
    ``k (..., Lk, d)``, ``v (..., Lk, d_v)``, ``centroids (C, d)`` → ``(..., Lq, d_v)``, non-causal.

    Cluster ``c`` takes the ``window`` queries and the ``window`` keys most similar to it (cosine, as in
    `routing_assign`), so every cluster has the same size; its queries attend its keys (``window x
    window`` scores per cluster, ``C · window²`` in all). A query routed to several clusters gets the
    mean of its outputs, one routed to none gets zeros. Equals, per cluster, `dense_masked_attention`
    with the mask "query in the cluster and key in the cluster", averaged.
    """
    check_qkv(q, k, v)
    _check_centroids(q, centroids)
    window = check_positive_int("window", window)
    if window > min(q.shape[-2], k.shape[-2]):
        raise ValueError(f"window={window} must be <= both lengths, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    scale = resolve_scale(scale, q.shape[-1])
    in_dtype = q.dtype
    work = compute_dtype(in_dtype)
    q, k, v = (t.to(work) for t in (q, k, v))
    mu = F.normalize(centroids.to(work), dim=-1)
    n_c = mu.shape[0]

    def members(x):                                                     # (..., C, window) token ids per cluster
        return (F.normalize(x, dim=-1) @ mu.T).topk(window, dim=-2).indices.transpose(-2, -1)

    def select(x, idx):                                                 # (..., C, window, d)
        x = x.unsqueeze(-3).expand(*x.shape[:-2], n_c, *x.shape[-2:])
        return x.gather(-2, idx.unsqueeze(-1).expand(*idx.shape, x.shape[-1]))

    qi, ki = members(q), members(k)
    weights = torch.softmax(torch.matmul(select(q, qi), select(k, ki).transpose(-2, -1)) * scale, dim=-1)
    per_cluster = torch.matmul(weights, select(v, ki)).flatten(-3, -2)                # (..., C * window, d_v)
    flat = qi.flatten(-2, -1)
    index = flat.unsqueeze(-1).expand_as(per_cluster)
    total = per_cluster.new_zeros(*q.shape[:-1], v.shape[-1]).scatter_add(-2, index, per_cluster)
    count = per_cluster.new_zeros(q.shape[:-1]).scatter_add(-1, flat, torch.ones_like(flat, dtype=work))
    return (total / count.clamp(min=1).unsqueeze(-1)).to(in_dtype)


# ----------------------------------------------------------------------------- Dual Chunk Attention (M7.17)
def _check_dca(pretrain_len, chunk, local_window):
    pretrain_len = check_positive_int("pretrain_len", pretrain_len)
    chunk = check_positive_int("chunk", chunk)
    local_window = _check_nonneg_int("local_window", local_window)
    if local_window > chunk or chunk + local_window > pretrain_len:
        raise ValueError(f"need local_window <= chunk and chunk + local_window <= pretrain_len (so every relative "
                         f"position stays below pretrain_len), got pretrain_len={pretrain_len}, chunk={chunk}, "
                         f"local_window={local_window}")
    return pretrain_len, chunk, local_window


def _dca_query_positions(L, pretrain_len, chunk, local_window, device):
    """Query position ids of the three parts, each ``(L,)``; keys always use ``j mod chunk``."""
    inner = torch.arange(L, device=device) % chunk
    intra = inner
    successive = torch.where(inner < local_window, chunk + inner, torch.full_like(inner, pretrain_len - 1))
    inter = torch.full_like(inner, pretrain_len - 1)
    return intra, successive, inter


def _dca_parts(L, chunk, device):
    """Boolean ``(L, L)`` masks of the intra-chunk, successive-chunk and inter-chunk pairs (all causal)."""
    c = torch.arange(L, device=device) // chunk
    gap = c[:, None] - c[None, :]
    causal = causal_mask(L, device=device)
    return causal & (gap == 0), gap == 1, gap > 1


def dca_position_matrix(L: int, pretrain_len: int, chunk: int, local_window: int, *, part: str = "all",
                        device: torch.device | str | None = None) -> torch.Tensor:
    """Dual Chunk Attention relative positions ``(L, L)`` (M7.17, An et al. 2024; ERRATA E7.6), ``-1`` where
    not attended. Keys sit at ``j mod chunk``; queries at

    * ``part="intra"`` (same chunk): ``i mod chunk``, so ``M = i - j``;
    * ``part="successive"`` (the previous chunk): ``chunk + (i mod chunk)`` for the first
      ``local_window`` queries of a chunk, ``pretrain_len - 1`` for the rest;
    * ``part="inter"`` (older chunks): ``pretrain_len - 1``;
    * ``part="all"``: the three together, covering every ``j <= i`` (no sparsity).

    Every entry is at most ``pretrain_len - 1``.
    """
    L = check_positive_int("L", L)
    pretrain_len, chunk, local_window = _check_dca(pretrain_len, chunk, local_window)
    _check_part(part, ("all", "intra", "successive", "inter"))
    key = torch.arange(L, device=device) % chunk
    out = torch.full((L, L), -1, dtype=torch.long, device=device)
    for name, qpos, mask in zip(("intra", "successive", "inter"),
                                _dca_query_positions(L, pretrain_len, chunk, local_window, device),
                                _dca_parts(L, chunk, device)):
        if part in ("all", name):
            out = torch.where(mask, qpos[:, None] - key[None, :], out)
    return out


def dca_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pretrain_len: int, chunk: int,
                  local_window: int, *, base: float = 10000.0, scale: float | None = None) -> torch.Tensor:
    """Causal Dual Chunk Attention with RoPE (M7.17): ``q, k (..., L, d_k)`` (unrotated, even ``d_k``),
    ``v (..., L, d_v)`` → ``(..., L, d_v)``.

    Keys are rotated once to ``j mod chunk``; the queries are rotated three times, to the intra,
    successive and inter positions of `dca_position_matrix`, each copy attends only its part
    (`attention_with_lse`), and the three partial results are combined exactly with `merge_partials`.
    `dca_attention_reference` builds every score ``q_i · R(M_ij) k_j`` in a loop instead.
    """
    check_qkv(q, k, v)
    length = q.shape[-2]
    if k.shape[-2] != length:
        raise ValueError(f"dca_attention is causal self-attention and needs Lq == Lk, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    if q.shape[-1] % 2:
        raise ValueError(f"dca_attention rotates q and k by RoPE, which needs an even head size d_k; got q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)}")
    pretrain_len, chunk, local_window = _check_dca(pretrain_len, chunk, local_window)
    in_dtype = q.dtype
    work = compute_dtype(in_dtype)
    q, k, v = (t.to(work) for t in (q, k, v))
    k_rot = apply_rope(k, torch.arange(length, device=k.device) % chunk, base=base)
    outs, lses = [], []
    for qpos, mask in zip(_dca_query_positions(length, pretrain_len, chunk, local_window, q.device),
                          _dca_parts(length, chunk, q.device)):
        o, lse = attention_with_lse(apply_rope(q, qpos, base=base), k_rot, v, mask, scale=scale)
        outs.append(o)
        lses.append(lse)
    return merge_partials(outs, lses)[0].to(in_dtype)


def dca_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pretrain_len: int, chunk: int,
                            local_window: int, *, base: float = 10000.0, scale: float | None = None) -> torch.Tensor:
    """`dca_attention` the slow way: for each query ``i``, rotate ``q_i`` by every relative position
    ``M[i, j]`` of `dca_position_matrix` and dot it with the unrotated ``k_j``
    (``<R(m) q, R(n) k> = <R(m - n) q, k>``), then causal softmax."""
    check_qkv(q, k, v)
    length = q.shape[-2]
    rel = dca_position_matrix(length, pretrain_len, chunk, local_window, device=q.device)
    scale = resolve_scale(scale, q.shape[-1])
    rows = []
    for i in range(length):
        q_i = q[..., i:i + 1, :].expand(k.shape)                         # q_i repeated for every key
        rows.append((apply_rope(q_i, rel[i].clamp(min=0), base=base) * k).sum(-1) * scale)
    scores = torch.stack(rows, dim=-2)
    return torch.softmax(scores.masked_fill(rel < 0, float("-inf")), dim=-1) @ v


# ----------------------------------------------------------------------------- the gallery (M7.1)
GALLERY = ("sliding window", "dilated", "strided", "fixed", "blockwise", "Image 1-D local", "Longformer",
           "BigBird", "sinks + window", "LSH buckets", "routing clusters")


def pattern_mask(name: str, L: int, size: int, *, seed: int = 0) -> torch.Tensor:
    """One pattern of `GALLERY` as a boolean ``(L, L)`` mask, with one width knob ``size`` (M7.1).

    ``size`` is the window (sliding window, Longformer, sinks), the dilated window (dilation 2), the
    stride (strided, fixed with ``c = 1``), the block length (blockwise with identity permutation,
    Image 1-D local with memory ``size``, BigBird: window ±1 block, one global and one random block),
    or the number of buckets / clusters (LSH, routing: same-bucket / same-cluster pairs of ``L`` random
    shared query-key vectors, ``d = 16``, seeded). Blockwise and BigBird need ``L % size == 0``.
    """
    _check_part(name, GALLERY)
    L, size = check_positive_int("L", L), check_positive_int("size", size)
    if name in ("blockwise", "BigBird") and L % size:
        raise ValueError(f"{name} needs L % size == 0 (size is the block length), got L={L}, size={size}")
    if name == "sliding window":
        return sliding_window_mask(L, size, causal=True)
    if name == "dilated":
        return dilated_mask(L, size, 2, causal=True)
    if name == "strided":
        return strided_mask(L, size)
    if name == "fixed":
        return fixed_mask(L, size, 1)
    if name == "blockwise":
        return blockwise_mask(L, L // size)
    if name == "Image 1-D local":
        return local1d_mask(L, size, size)
    if name == "Longformer":
        return longformer_mask(L, size, 1, [0])
    if name == "BigBird":
        return expand_layout(bigbird_layout(L // size, 1, 1, 1, seed), size)
    if name == "sinks + window":
        return sink_window_mask(L, 1, size)
    x = torch.randn(L, 16, generator=torch.Generator().manual_seed(int(seed)))
    if name == "LSH buckets":
        n_buckets = size + size % 2                                     # lsh_hash needs an even count
        ids = lsh_hash(x, n_buckets, 1, seed)[0]
    else:
        ids = routing_assign(x, torch.randn(size, 16, generator=torch.Generator().manual_seed(int(seed) + 1)))
    return ids[:, None] == ids[None, :]


def masked_attention_flops(mask: torch.Tensor, d_k: int, d_v: int | None = None) -> int:
    """FLOPs of attention computed only on the allowed pairs of ``mask``: ``2 nnz (d_k + d_v)`` (M7.1).

    Each allowed pair costs one ``d_k`` dot product for the score and one ``d_v`` multiply-add for the
    output (2 FLOPs per multiply-add, as `bench.attention_flops`, which is the full mask's value).
    """
    d_k = check_positive_int("d_k", d_k)
    d_v = d_k if d_v is None else check_positive_int("d_v", d_v)
    return 2 * nnz(mask) * (d_k + d_v)


def tile_occupancy(mask: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which ``block_size x block_size`` tiles of a boolean ``(..., Lq, Lk)`` mask a tiled kernel visits.

    Returns ``(partial, full)``, boolean ``(..., ceil(Lq / b), ceil(Lk / b))``: ``full`` tiles are all
    allowed (no mask needed inside), ``partial`` tiles mix allowed and forbidden pairs (the mask is
    applied inside), every other tile is skipped. This is how FlexAttention's ``BlockMask`` splits
    a mask (its ``full_kv_num_blocks`` and ``kv_num_blocks``). A ragged edge is padded with forbidden
    pairs, so an edge tile is never full.
    """
    check_tensor("mask", mask, min_rank=2)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean, got dtype {mask.dtype}")
    b = check_block_size("block_size", block_size)
    n_q, n_k = -(-mask.shape[-2] // b), -(-mask.shape[-1] // b)
    padded = F.pad(mask, (0, n_k * b - mask.shape[-1], 0, n_q * b - mask.shape[-2]), value=False)
    tiles = padded.unflatten(-1, (n_k, b)).unflatten(-3, (n_q, b))              # (..., n_q, b, n_k, b)
    any_, all_ = tiles.any(-1).any(-2), tiles.all(-1).all(-2)
    return any_ & ~all_, all_
