"""Sparse attention (Chapter 7): sliding-window and block-sparse attention, and the mask toolkit.

Conventions (as in `xfam_lib.attention` and ``shared/API.md``):

* ``q, k, v`` are ``(..., L, d)``, usually ``(B, H, L, d)``; the sequence is dim -2.
* Every mask builder returns a boolean ``(L, L)`` tensor, **True = may attend**; row ``i`` is the
  query, column ``j`` the key.
* ``window`` counts neighbours on each side: the two-sided band is ``|i - j| <= window``, the causal
  band ``0 <= i - j <= window`` (the query and the ``window`` keys before it). This is what
  ``attention.causal_mask(L, window=...)`` means too.
* A block ``layout`` is boolean ``(Lq/bs, Lk/bs)``, or ``(H, Lq/bs, Lk/bs)`` per head;
  `expand_layout` turns it into the token mask it stands for.
* Each efficient form has a dense reference: `scaled_dot_product_attention` with the mask the
  builders here return. A query row with no allowed key returns zeros.
"""
from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from .attention import _check_block, _check_qkv, _compute_dtype, _resolve_scale, causal_mask
from .utils import check_positive_int, check_tensor

__all__ = [
    "sliding_window_mask",
    "dilated_mask",
    "strided_mask",
    "fixed_mask",
    "longformer_mask",
    "sink_window_mask",
    "bigbird_layout",
    "expand_layout",
    "sliding_window_attention",
    "block_sparse_attention",
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
    block_size = _check_block("block_size", block_size)
    return layout.repeat_interleave(block_size, dim=-2).repeat_interleave(block_size, dim=-1)


# ----------------------------------------------------------------------------- sliding-window attention (M7.2)
def _chunk_band_mask(length: int, n_chunks: int, chunk: int, window: int, causal: bool, device) -> torch.Tensor:
    """``(n_chunks, chunk, width)``: may query ``t*chunk + a`` attend key ``t*chunk - window + b``?

    Inside the band, and the key is a real position (``0 <= j < length``). Padded query rows
    (``i >= length``, discarded afterwards) keep their whole band so no row is empty.
    """
    width = chunk + window + (0 if causal else window)
    a = torch.arange(chunk, device=device)[:, None]
    b = torch.arange(width, device=device)[None, :]
    rel = a + window - b                                               # i - j, the same in every chunk
    band = (rel <= window) & (rel >= (0 if causal else -window))
    start = (torch.arange(n_chunks, device=device) * chunk)[:, None, None]
    i, j = start + a, start - window + b
    return band & (((j >= 0) & (j < length)) | (i >= length))


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *,
                             causal: bool = False, scale: float | None = None,
                             block_size: int | None = None) -> torch.Tensor:
    """Local attention: query ``i`` sees keys ``|i - j| <= window`` (``causal``: ``0 <= i - j <= window``).

    ``q (..., L, d_k)``, ``k (..., L, d_k)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``; self-attention
    only (``Lq == Lk``). Equals `scaled_dot_product_attention` with `sliding_window_mask`.

    The queries are cut into chunks of ``block_size`` rows (default ``max(32, window)``, at most
    ``L``). Chunk ``t`` attends only to the keys of its band, ``[t*bs - window, (t+1)*bs + window)``
    (causal: up to ``(t+1)*bs``), taken as a strided view of the zero-padded keys, so the score
    tensor is ``(..., L/bs, bs, bs + 2 window)``: O(L · window) memory, never O(L²), forward and
    backward (autograd). A length that is not a multiple of ``block_size`` is padded and cut back.
    fp16/bf16 are computed in fp32 and returned in their dtype.
    """
    _check_qkv(q, k, v)
    length = q.shape[-2]
    if k.shape[-2] != length:
        raise ValueError(f"sliding_window_attention is self-attention and needs Lq == Lk, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    window = _check_nonneg_int("window", window)
    scale = _resolve_scale(scale, q)
    w = min(window, length - 1)                                       # a wider band allows nothing more
    chunk = max(32, w) if block_size is None else _check_block("block_size", block_size)
    chunk = min(chunk, length)
    n_chunks = -(-length // chunk)
    pad = n_chunks * chunk - length
    right = 0 if causal else w
    width = chunk + w + right

    in_dtype = q.dtype
    work = _compute_dtype(in_dtype)
    q, k, v = (t.to(work) for t in (q, k, v))
    q_chunks = F.pad(q, (0, 0, 0, pad)).unflatten(-2, (n_chunks, chunk))                 # (..., n, bs, d_k)

    def bands(t: torch.Tensor) -> torch.Tensor:                                          # (..., n, width, d)
        return F.pad(t, (0, 0, w, pad + right)).unfold(-2, width, chunk).transpose(-2, -1)

    scores = torch.matmul(q_chunks, bands(k).transpose(-2, -1)) * scale                  # (..., n, bs, width)
    allowed = _chunk_band_mask(length, n_chunks, chunk, w, bool(causal), q.device)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)         # every row has a key
    out = torch.matmul(weights, bands(v)).flatten(-3, -2)[..., :length, :]
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
    ``(Lq/block_size, Lk/block_size)``, shared by all heads, or ``(H, ...)`` with ``H = q.shape[-3]``:
    query block ``a`` attends key block ``b`` iff ``layout[a, b]``. Equals
    `scaled_dot_product_attention` with ``mask=expand_layout(layout, block_size)``; a query block
    with no active key block returns zeros. Both lengths must be multiples of ``block_size``.

    The active ``(a, b)`` pairs are gathered into one batch of ``block_size x block_size`` score
    tiles (memory and FLOPs proportional to the number of active blocks), and the softmax is
    taken per query row across its tiles: a per-row max (no gradient needed, the softmax is
    shift-invariant), then the exponentials' sums and the weighted values are added into their
    query block with ``index_add``. fp16/bf16 are computed in fp32 and returned in their dtype.
    """
    _check_qkv(q, k, v)
    block_size = _check_block("block_size", block_size)
    l_q, l_k = q.shape[-2], k.shape[-2]
    if l_q % block_size or l_k % block_size:
        raise ValueError(f"block_size={block_size} must divide both sequence lengths, got Lq={l_q} (q "
                         f"{tuple(q.shape)}) and Lk={l_k} (k {tuple(k.shape)})")
    n_q, n_k = l_q // block_size, l_k // block_size
    _check_layout(layout, q, n_q, n_k, block_size)
    scale = _resolve_scale(scale, q)
    in_dtype = q.dtype
    work = _compute_dtype(in_dtype)
    d_k, d_v = q.shape[-1], v.shape[-1]
    layout = layout.to(q.device)

    # Rows of blocks: (N, R, bs, d) with R = n_q (shared layout) or H * n_q (per head, head-major).
    per_head = layout.dim() == 3
    heads = layout.shape[0] if per_head else 1
    qb = q.to(work).reshape(-1, heads * n_q, block_size, d_k)
    kb = k.to(work).reshape(-1, heads * n_k, block_size, d_k)
    vb = v.to(work).reshape(-1, heads * n_k, block_size, d_v)
    pairs = layout.reshape(heads, n_q, n_k).nonzero()                                     # (P, 3): head, a, b
    q_idx = pairs[:, 0] * n_q + pairs[:, 1]
    k_idx = pairs[:, 0] * n_k + pairs[:, 2]

    scores = torch.matmul(qb.index_select(1, q_idx), kb.index_select(1, k_idx).transpose(-2, -1)) * scale
    n, rows = qb.shape[0], qb.shape[1]                                                    # scores (N, P, bs, bs)
    with torch.no_grad():                                                                 # per-row max over its tiles
        tile_max = scores.amax(dim=-1)                                                    # (N, P, bs)
        row_max = tile_max.new_zeros(n, rows, block_size).scatter_reduce(
            1, q_idx.view(1, -1, 1).expand_as(tile_max), tile_max, "amax", include_self=False)
    p = torch.exp(scores - row_max.index_select(1, q_idx).unsqueeze(-1))
    denom = scores.new_zeros(n, rows, block_size).index_add(1, q_idx, p.sum(dim=-1))
    numer = scores.new_zeros(n, rows, block_size, d_v).index_add(1, q_idx, torch.matmul(p, vb.index_select(1, k_idx)))
    has_key = denom > 0                                                                   # False: no active block
    out = numer / torch.where(has_key, denom, torch.ones_like(denom)).unsqueeze(-1)
    return out.reshape(q.shape[:-1] + (d_v,)).to(in_dtype)
