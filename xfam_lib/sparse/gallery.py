"""The chapter's gallery of patterns: one width knob per pattern, the FLOPs of a masked
product, and how a mask falls into the tiles a fused kernel skips or computes."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..utils import check_block_size, check_positive_int, check_tensor
from ._checks import _check_part
from .content import lsh_hash, routing_assign
from .masks import (bigbird_layout, blockwise_mask, dilated_mask, expand_layout, fixed_mask, local1d_mask, longformer_mask,
                    nnz, sink_window_mask, sliding_window_mask, strided_mask)


GALLERY = ("sliding window", "dilated", "strided", "fixed", "blockwise", "Image 1-D local", "Longformer",
           "BigBird", "sinks + window", "LSH buckets", "routing clusters")


def pattern_mask(name: str, L: int, size: int, *, seed: int = 0) -> torch.Tensor:
    """One pattern of `GALLERY` as a boolean ``(L, L)`` mask, with one width knob ``size``.

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
    """FLOPs of attention computed only on the allowed pairs of ``mask``: ``2 nnz (d_k + d_v)``.

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
