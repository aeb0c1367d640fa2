"""The kernels that make masks pay (chapter 7), each beside its dense reference: sliding-window
and Longformer attention, block-sparse attention, factorised heads,
blockwise attention and Dual Chunk Attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import attention_with_lse, merge_partials, scaled_dot_product_attention
from ..positional import apply_rope
from ..utils import (check_block_size, check_int, check_positive_int, check_qkv, check_tensor, compute_dtype,
                     resolve_scale)
from .masks import (_blockwise_size, _check_dca, _check_perm, _check_square_mask, _dca_parts, _dca_query_positions,
                    _global_indices, dca_position_matrix)


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
    window = check_int("window", window, low=0)
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
    """Longformer attention without the L x L matrix: equals `dense_masked_attention` with
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
    window = check_int("window", window, low=0)
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


class FactorizedSparseAttention(nn.Module):
    """Multi-head self-attention with several sparse masks combined one of three ways (Child et al. 2019).

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
        self.n_heads, self.layer = n_heads, check_int("layer", layer, low=0)
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


def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, *,
                           scale: float | None = None) -> torch.Tensor:
    """The reference every sparse kernel is checked against: softmax attention over the full ``L x L``
    scores with ``mask`` (True = may attend); a row with no allowed key returns zeros."""
    check_tensor("mask", mask, min_rank=2)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    return scaled_dot_product_attention(q, k, v, mask, scale=scale)


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_blocks: int, perm=None, *,
                        scale: float | None = None) -> torch.Tensor:
    """Blockwise attention by reshaping: ``q, k (..., L, d_k)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``.

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


def dca_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pretrain_len: int, chunk: int,
                  local_window: int, *, base: float = 10000.0, scale: float | None = None) -> torch.Tensor:
    """Causal Dual Chunk Attention with RoPE: ``q, k (..., L, d_k)`` (unrotated, even ``d_k``),
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
