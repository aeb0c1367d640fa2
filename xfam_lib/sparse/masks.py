"""Sparse attention patterns as boolean masks and block layouts, and the graph view of a mask
(chapter 7): sliding window and dilated window, Sparse Transformer strided and fixed, Longformer,
attention sinks and BigBird, Image Transformer local blocks, blockwise, ETC, Dual Chunk Attention's
positions; `nnz`, `receptive_field`, `hop_distances`, `graph_diameter`."""
from __future__ import annotations

import numbers

import torch

from ..attention import causal_mask
from ..utils import check_block_size, check_int, check_positive_int, check_tensor
from ._checks import _check_part, _offsets


def sliding_window_mask(L: int, window: int, causal: bool = False, *,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """Band mask ``(L, L)``: ``|i - j| <= window``, or ``0 <= i - j <= window`` with ``causal=True``.

    The dense reference for `sliding_window_attention`. Each row has at most ``2 window + 1``
    (causal: ``window + 1``) True entries, so the mask has O(L · window) of them.
    """
    L = check_positive_int("L", L)
    window = check_int("window", window, low=0)
    lower = causal_mask(L, window=window, device=device)             # 0 <= i - j <= window
    return lower if causal else lower | lower.T


def dilated_mask(L: int, window: int, dilation: int, causal: bool = True, *,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Dilated (atrous) band ``(L, L)``: key ``j`` is allowed iff ``(i - j) % dilation == 0`` and
    ``|i - j| <= window * dilation`` (causal: ``0 <= i - j <= window * dilation``).

    ``window`` counts the dilated neighbours on each side, so a row keeps ``window + 1`` (causal) or
    ``2 window + 1`` keys whatever the dilation, while its span grows to ``window * dilation``.
    ``dilation = 1`` is `sliding_window_mask`.
    """
    L = check_positive_int("L", L)
    window = check_int("window", window, low=0)
    dilation = check_positive_int("dilation", dilation)
    rel = _offsets(L, device)
    span = rel if causal else rel.abs()
    return (span >= 0) & (span <= window * dilation) & (rel % dilation == 0)


def strided_mask(L: int, stride: int, *, part: str = "union",
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Sparse Transformer *strided* pattern ``(L, L)``, causal (Child et al. 2019).

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
    """Sparse Transformer *fixed* pattern ``(L, L)``, causal (Child et al. 2019).

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
    """The *fixed* pattern on blocks, a layout ``(n_blocks, n_blocks)`` for `block_sparse_attention`.

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
    """Longformer pattern ``(L, L)`` (Beltagy et al. 2020): a two-sided (dilated) window plus
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
    """Attention sinks plus a recent window ``(L, L)``, causal (Xiao et al. 2024).

    Query ``i`` may attend key ``j <= i`` iff ``j < n_sink`` (the first tokens, the "sinks") or
    ``i - j <= window`` (itself and the ``window`` previous tokens).
    """
    L = check_positive_int("L", L)
    n_sink = check_int("n_sink", n_sink, low=0)
    window = check_int("window", window, low=0)
    sinks = causal_mask(L, device=device) & (torch.arange(L, device=device) < n_sink)
    return causal_mask(L, window=window, device=device) | sinks


def bigbird_layout(n_blocks: int, n_window: int, n_random: int, n_global: int, seed: int, *,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """BigBird block layout ``(n_blocks, n_blocks)`` for `block_sparse_attention` (Zaheer et al. 2020).

    * window: query block ``a`` sees key blocks ``|a - b| <= n_window``;
    * global: the first ``n_global`` blocks attend to every block and every block attends to them;
    * random: each other query block also sees ``n_random`` key blocks drawn uniformly, without
      replacement, from those it does not already see, using a CPU ``torch.Generator`` seeded
      with ``seed`` (same seed, same layout).

    There is no fallback to dense attention: if a query block has fewer than ``n_random`` blocks
    left to draw from, a ``ValueError`` says so.
    """
    n_blocks = check_positive_int("n_blocks", n_blocks)
    n_window = check_int("n_window", n_window, low=0)
    n_random = check_int("n_random", n_random, low=0)
    n_global = check_int("n_global", n_global, low=0)
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
    n_layers = check_int("n_layers", n_layers, low=0)
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


def local1d_mask(L: int, q_block: int, mem_len: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Image Transformer 1-D local attention ``(L, L)``, causal in raster order (Parmar et al. 2018).

    The flattened image is cut into query blocks of ``q_block`` positions; every query in the block
    starting at ``s`` sees the ``mem_len`` positions before the block and the earlier positions of its
    own block: ``s - mem_len <= j <= i``. A ragged last block is allowed.
    """
    L = check_positive_int("L", L)
    q_block = check_positive_int("q_block", q_block)
    mem_len = check_int("mem_len", mem_len, low=0)
    pos = torch.arange(L, device=device)
    start = (pos // q_block) * q_block
    return (pos[None, :] <= pos[:, None]) & (pos[None, :] >= (start - mem_len)[:, None])


def local2d_mask(H: int, W: int, q_h: int, q_w: int, ext_h: int, ext_w: int, *,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Image Transformer 2-D local attention ``(H*W, H*W)`` over pixels in raster order.

    The image is tiled into ``q_h x q_w`` query blocks. A block's memory is the block extended by
    ``ext_h`` rows above and ``ext_w`` columns left and right; pixel ``i`` sees the pixels ``j`` of
    its memory that come no later in raster order (``j <= i``), so generation stays causal.
    """
    H, W = check_positive_int("H", H), check_positive_int("W", W)
    q_h, q_w = check_positive_int("q_h", q_h), check_positive_int("q_w", q_w)
    ext_h, ext_w = check_int("ext_h", ext_h, low=0), check_int("ext_w", ext_w, low=0)
    pos = torch.arange(H * W, device=device)
    row, col = pos // W, pos % W
    top, left = (row // q_h) * q_h, (col // q_w) * q_w                 # corner of the query's block
    in_rows = (row[None, :] >= (top - ext_h)[:, None]) & (row[None, :] < (top + q_h)[:, None])
    in_cols = (col[None, :] >= (left - ext_w)[:, None]) & (col[None, :] < (left + q_w + ext_w)[:, None])
    return in_rows & in_cols & (pos[None, :] <= pos[:, None])


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
    """Permutation-matrix layout ``(n, n)``: query block ``a`` attends key block ``perm[a]``."""
    n_blocks = check_positive_int("n_blocks", n_blocks)
    p = _check_perm(perm, n_blocks)
    layout = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    layout[torch.arange(n_blocks), p] = True
    return layout.to(device)


def blockwise_mask(L: int, n_blocks: int, perm=None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Blockwise (BlockBERT) token mask ``(L, L)`` (Qiu et al. 2020): the sequence is
    cut into ``n_blocks`` blocks of ``L / n_blocks`` and query block ``a`` sees key block ``perm[a]``
    (default: the identity, each block sees itself). ``L % n_blocks != 0`` raises ``ValueError``."""
    L = check_positive_int("L", L)
    size = _blockwise_size(L, n_blocks)
    return expand_layout(blockwise_layout(n_blocks, perm, device=device), size)


def etc_masks(segment_ids, radius: int, *, device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """ETC's four attention pieces for structured input (Ainslie et al. 2020), boolean, True = may attend.

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
    radius = check_int("radius", radius, low=0)
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


def _check_dca(pretrain_len, chunk, local_window):
    pretrain_len = check_positive_int("pretrain_len", pretrain_len)
    chunk = check_positive_int("chunk", chunk)
    local_window = check_int("local_window", local_window, low=0)
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
    """Dual Chunk Attention relative positions ``(L, L)`` (An et al. 2024), ``-1`` where
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
