"""Long-context memory (Chapter 5): Transformer-XL segment recurrence, the Compressive Transformer,
kNN memories (kNN-LM, SPALM, the Memorizing Transformer) and a Titans-style neural memory.

Conventions (see ``shared/API.md``):

* Hidden states are ``(B, L, d_model)``; memories are ``(B, m, d_model)``, oldest first, and are
  stored with their gradient stopped (``detach``). ``mem=None`` is an empty memory.
* Attention inputs are ``(..., L, d)``; masks are boolean with True = may attend; the queries of a
  segment are the *last* ``L`` of the ``m + L`` keys (bottom-right aligned).
* Distances for nearest-neighbour search are squared L2 (``metric="l2"``) or, for attention-style
  retrieval, inner products (``metric="ip"``).
* fp16/bf16 inputs of the functions are computed in fp32 and returned in their own dtype.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .attention import causal_mask, repeat_kv, scaled_dot_product_attention
from .positional import XLRelativeAttention, xl_relative_scores
from .transformer import FeedForward
from .utils import (broadcasts_to, check_bool, check_instance, check_int, check_positive_int, check_real, check_tensor,
                    check_token_ids)
from .utils import compute_dtype as _compute_dtype

__all__ = [
    # Transformer-XL
    "update_xl_memory", "xl_attention", "XLLayer", "TransformerXL", "temporal_range",
    # Compressive Transformer
    "compress_pool", "ConvCompressor", "compress_most_used", "update_memories", "CompressiveMemory",
    "attention_reconstruction_loss",
    # kNN memories
    "exact_knn", "knn_distribution", "knn_lm_interpolate", "SpalmGate", "FIFOKVMemory",
    "knn_augmented_attention", "MemorizingAttention",
    # test-time-learned memory
    "NeuralMemory",
]

def _check_states(name: str, x: torch.Tensor, d_model: int | None = None) -> None:
    check_tensor(name, x, rank=3, floating=True)
    if d_model is not None and x.shape[-1] != d_model:
        raise ValueError(f"{name} must be (B, L, d_model={d_model}), got shape {tuple(x.shape)}")


def _check_memory(mem: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
    """``mem`` as a ``(B, m, d)`` tensor matching ``h (B, L, d)``; None becomes an empty memory."""
    if mem is None:
        return h.new_zeros(h.shape[0], 0, h.shape[-1])
    _check_states("mem", mem)
    if mem.shape[0] != h.shape[0] or mem.shape[-1] != h.shape[-1]:
        raise ValueError(f"mem must be (B={h.shape[0]}, m, d={h.shape[-1]}) like h {tuple(h.shape)}, "
                         f"got {tuple(mem.shape)}")
    return mem


# ============================================================================= Transformer-XL
def update_xl_memory(mem: torch.Tensor | None, h: torch.Tensor, mem_len: int) -> torch.Tensor:
    """The next segment's memory: the last ``mem_len`` rows of ``[mem; h]``, gradient stopped.

    ``mem (B, m, d)`` or None, ``h (B, L, d)`` (the *input* of the layer, ``h^(n-1)``) →
    ``(B, min(m + L, mem_len), d)``, oldest first.
    """
    _check_states("h", h)
    mem_len = check_int("mem_len", mem_len, low=0)
    mem = _check_memory(mem, h)
    both = torch.cat([mem, h], dim=1)
    return both[:, both.shape[1] - min(mem_len, both.shape[1]):].detach()


def xl_attention(h: torch.Tensor, mem: torch.Tensor | None, attn: XLRelativeAttention, *,
                 return_weights: bool = False):
    """One Transformer-XL attention over the extended context ``[SG(mem); h]`` (Dai et al. 2019).

    ``h (B, L, d_model)`` is the current segment, ``mem (B, m, d_model)`` the cached states of the
    previous segments (or None); ``attn`` a `positional.XLRelativeAttention` whose projections,
    position keys and global biases ``u, v`` are used. Queries come from ``h`` only; keys and values
    from both, with the memory's gradient stopped. Query ``i`` sits at position ``m + i`` and may
    attend keys ``0 .. m + i`` (the bottom-right ``L x (m + L)`` causal mask); relative distances
    run over the whole extended context. Returns ``(B, L, d_model)``, and the attention weights
    ``(B, H, L, m + L)`` with ``return_weights=True``.
    """
    check_instance("attn", attn, XLRelativeAttention)
    _check_states("h", h, attn.d_model)
    mem = _check_memory(mem, h)
    check_bool("return_weights", return_weights)
    context = torch.cat([mem.detach(), h], dim=1)                                   # (B, m + L, d)
    b, seg_len, k_len = h.shape[0], h.shape[1], context.shape[1]
    heads = lambda x, n: x.view(b, x.shape[1], n, attn.d_head).transpose(1, 2)      # (B, n, len, d_head)
    n_rep = attn.n_heads // attn.n_kv_heads
    q = heads(attn.q_proj(h), attn.n_heads)
    k = repeat_kv(heads(attn.k_proj(context), attn.n_kv_heads), n_rep)
    v = repeat_kv(heads(attn.v_proj(context), attn.n_kv_heads), n_rep)
    r = attn.distance_keys(k_len, device=h.device, dtype=h.dtype)                  # (H, m + L, d_head)
    scores = xl_relative_scores(q, k, r, attn.u, attn.v) / math.sqrt(attn.d_head)
    allowed = causal_mask(seg_len, k_len, device=h.device)
    scores = scores.to(_compute_dtype(scores.dtype)).masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(h.dtype)
    out = weights @ v
    out = attn.out_proj(out.transpose(1, 2).reshape(b, seg_len, attn.d_model))
    return (out, weights) if return_weights else out


class XLLayer(nn.Module):
    """A Pre-LN Transformer-XL block: ``h + xl_attention(LN h, LN mem)``, then ``h + FFN(LN h)``.

    ``forward(h (B, L, d_model), mem (B, m, d_model) or None) -> (B, L, d_model)``.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, n_kv_heads: int | None = None):
        super().__init__()
        self.attn = XLRelativeAttention(d_model, n_heads, n_kv_heads)
        self.ff = FeedForward(d_model, d_ff, "gelu")
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, h: torch.Tensor, mem: torch.Tensor | None = None) -> torch.Tensor:
        _check_states("h", h, self.attn.d_model)
        if mem is not None:
            _check_states("mem", mem, self.attn.d_model)
        mem = None if mem is None else self.norm1(mem)
        h = h + xl_attention(self.norm1(h), mem, self.attn)
        return h + self.ff(self.norm2(h))


class TransformerXL(nn.Module):
    """A decoder-only language model with segment-level recurrence (Dai et al. 2019).

    ``forward(ids (B, L), mems=None) -> (logits (B, L, vocab), new_mems)``. ``mems`` is a list with
    one ``(B, m, d_model)`` memory per layer: the *inputs* of that layer on the previous segments
    (``h^(n-1)``), at most ``mem_len`` of them, gradient stopped. There is no absolute
    position embedding; positions enter through the relative attention only.
    """

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, d_ff: int, mem_len: int):
        super().__init__()
        self.vocab = check_positive_int("vocab", vocab)
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.mem_len = check_int("mem_len", mem_len, low=0)
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(XLLayer(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, ids: torch.Tensor, mems: list[torch.Tensor] | None = None):
        check_token_ids("ids", ids, self.vocab, rank=2)
        if mems is not None:
            check_instance("mems", mems, (list, tuple))
        if mems is not None and len(mems) != self.n_layers:
            raise ValueError(f"mems must hold one memory per layer ({self.n_layers}), got {len(mems)}")
        mems = [None] * self.n_layers if mems is None else mems
        h = self.embed(ids)
        new_mems = []
        for layer, mem in zip(self.layers, mems):
            new_mems.append(update_xl_memory(mem, h, self.mem_len))
            h = layer(h, mem)
        return self.head(self.norm(h)), new_mems


def temporal_range(mem_len: int, n_layers: int, cmem_len: int = 0, ratio: int = 1) -> int:
    """Longest dependency, in tokens, that information can travel through the memories of ``n_layers``
    layers: ``n_layers * (mem_len + ratio * cmem_len)`` (XL: ``N_layers L_mem``; Compressive:
    ``(L_mem + c L_cmem) N_layers``).

    Each layer attends over only ``L + mem_len (+ cmem_len)`` keys; the range grows through depth.
    """
    mem_len = check_int("mem_len", mem_len, low=0)
    n_layers = check_positive_int("n_layers", n_layers)
    cmem_len = check_int("cmem_len", cmem_len, low=0)
    ratio = check_positive_int("ratio", ratio)
    return n_layers * (mem_len + ratio * cmem_len)


# ============================================================================= Compressive Transformer
def _whole_groups(x: torch.Tensor, ratio: int) -> torch.Tensor:
    """Drop the ``n % ratio`` oldest rows of ``x (..., n, d)`` so the rest splits into groups of ``ratio``."""
    return x[..., x.shape[-2] % ratio:, :]


def compress_pool(x: torch.Tensor, ratio: int, kind: str = "mean") -> torch.Tensor:
    """Pool groups of ``ratio`` consecutive memories: ``(..., n, d) -> (..., n // ratio, d)``.

    ``kind`` is ``"mean"`` or ``"max"``. When ``ratio`` does not divide ``n`` the ``n % ratio`` oldest
    rows are dropped (the map is ``R^{n x d} -> R^{floor(n/c) x d}``). ``ratio=1`` is the identity.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    ratio = check_positive_int("ratio", ratio)
    if kind not in ("mean", "max"):
        raise ValueError(f"kind must be 'mean' or 'max', got {kind!r}")
    x = _whole_groups(x, ratio)
    groups = x.reshape(*x.shape[:-2], x.shape[-2] // ratio, ratio, x.shape[-1])
    return groups.mean(-2) if kind == "mean" else groups.amax(-2)


class ConvCompressor(nn.Module):
    """Strided 1-D convolution over time (kernel = stride = ``ratio``): ``(B, n, d) -> (B, n // ratio, d)``.

    Drops the ``n % ratio`` oldest rows first, as `compress_pool` does.
    """

    def __init__(self, d_model: int, ratio: int):
        super().__init__()
        self.ratio = check_positive_int("ratio", ratio)
        self.conv = nn.Conv1d(check_positive_int("d_model", d_model), d_model, ratio, stride=ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_states("x", x, self.conv.in_channels)
        x = _whole_groups(x, self.ratio)
        if x.shape[-2] == 0:                                    # fewer rows than one group: nothing to keep
            return x
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


def compress_most_used(x: torch.Tensor, usage: torch.Tensor, ratio: int) -> torch.Tensor:
    """Keep the ``n // ratio`` memories that received the most attention, in their time order.

    ``x (..., n, d)``, ``usage (..., n)`` (e.g. attention weights summed over queries and heads)
    → ``(..., n // ratio, d)``.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    check_tensor("usage", usage, floating=True)
    ratio = check_positive_int("ratio", ratio)
    if usage.shape != x.shape[:-1]:
        raise ValueError(f"usage must be x.shape[:-1] = {tuple(x.shape[:-1])}, got {tuple(usage.shape)}")
    keep = usage.topk(x.shape[-2] // ratio, dim=-1).indices.sort(-1).values
    return x.gather(-2, keep.unsqueeze(-1).expand(*keep.shape, x.shape[-1]))


def update_memories(mem: torch.Tensor | None, cmem: torch.Tensor | None, h: torch.Tensor, mem_len: int,
                    cmem_len: int, compress: Callable[[torch.Tensor], torch.Tensor]):
    """One Compressive-Transformer memory update (Rae et al. 2020), as a FIFO of two bands.

    ``h (B, L, d)`` joins the memory ``mem (B, m, d)``; the rows pushed out of its last ``mem_len``
    slots (``old_mem``, oldest first) are compressed by ``compress`` and appended to ``cmem``, which
    keeps its last ``cmem_len`` slots. Returns ``(new_mem, new_cmem, old_mem)``, all gradient-stopped;
    ``old_mem`` feeds `attention_reconstruction_loss`.
    """
    _check_states("h", h)
    mem, cmem = _check_memory(mem, h), _check_memory(cmem, h)
    mem_len, cmem_len = check_int("mem_len", mem_len, low=0), check_int("cmem_len", cmem_len, low=0)
    queue = torch.cat([mem, h], dim=1).detach()
    n_old = max(0, queue.shape[1] - mem_len)
    old_mem, new_mem = queue[:, :n_old], queue[:, n_old:]
    if n_old and cmem_len:
        cmem = torch.cat([cmem, compress(old_mem)], dim=1)
    new_cmem = cmem[:, cmem.shape[1] - min(cmem_len, cmem.shape[1]):].detach()
    return new_mem, new_cmem, old_mem


class CompressiveMemory(nn.Module):
    """The two memory bands of one layer and the compressor between them.

    ``compressor``: ``"mean"``/``"max"`` (pooling), ``"conv"`` (a trainable `ConvCompressor`, needs
    ``d_model``), ``"most_used"`` (keeps the most-attended slots; `update` then needs ``usage``), or a
    callable ``(B, n, d) -> (B, n // ratio, d)``. The layer attends over ``context(mem, cmem)`` =
    ``[cmem; mem]``; `update` returns ``(new_mem, new_cmem, old_mem)`` as `update_memories` does.
    """

    def __init__(self, mem_len: int, cmem_len: int, ratio: int, compressor="mean", *, d_model: int | None = None):
        super().__init__()
        self.mem_len, self.cmem_len = check_int("mem_len", mem_len, low=0), check_int("cmem_len", cmem_len, low=0)
        self.ratio = check_positive_int("ratio", ratio)
        self.kind = compressor if isinstance(compressor, str) else "callable"
        if compressor == "conv":
            if d_model is None:
                raise ValueError("compressor='conv' needs d_model")
            self.conv = ConvCompressor(d_model, ratio)
        elif isinstance(compressor, str) and compressor not in ("mean", "max", "most_used"):
            raise ValueError(f"compressor must be 'mean', 'max', 'conv', 'most_used' or a callable, got {compressor!r}")
        elif not isinstance(compressor, str) and not callable(compressor):
            raise TypeError(f"compressor must be a string or a callable, got {type(compressor).__name__}")
        self._fn = None if isinstance(compressor, str) else compressor

    def compress(self, old_mem: torch.Tensor, usage: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, n, d) -> (B, n // ratio, d)`` with this memory's compressor (``usage (B, n)`` for most-used)."""
        if self.kind in ("mean", "max"):
            return compress_pool(old_mem, self.ratio, self.kind)
        if self.kind == "conv":
            return self.conv(old_mem)
        if self.kind == "most_used":
            if usage is None:
                raise ValueError("compressor='most_used' needs usage (B, n), the attention each slot received")
            return compress_most_used(old_mem, usage, self.ratio)
        return self._fn(old_mem)

    def update(self, mem: torch.Tensor | None, cmem: torch.Tensor | None, h: torch.Tensor,
               usage: torch.Tensor | None = None):
        """Push ``h (B, L, d)``; ``usage (B, m + L)`` scores the rows of ``[mem; h]`` for ``"most_used"``."""
        evicted_usage = lambda old: None if usage is None else usage[:, :old.shape[1]]
        return update_memories(mem, cmem, h, self.mem_len, self.cmem_len,
                               lambda old: self.compress(old, evicted_usage(old)))

    @staticmethod
    def context(mem: torch.Tensor | None, cmem: torch.Tensor | None) -> torch.Tensor | None:
        """The memory a layer attends over, oldest first: ``[cmem; mem]`` (None when both are empty)."""
        parts = [t for t in (cmem, mem) if t is not None and t.shape[1] > 0]
        return torch.cat(parts, dim=1) if parts else None


def _content_attention(h: torch.Tensor, kv: torch.Tensor, attn: XLRelativeAttention) -> torch.Tensor:
    """Multi-head content attention of ``h`` over ``kv`` with ``attn``'s frozen projections, before ``out_proj``."""
    b, d_head = h.shape[0], attn.d_head
    heads = lambda x, n: x.view(b, x.shape[1], n, d_head).transpose(1, 2)
    n_rep = attn.n_heads // attn.n_kv_heads
    q = heads(F.linear(h, attn.q_proj.weight.detach()), attn.n_heads)
    k = repeat_kv(heads(F.linear(kv, attn.k_proj.weight.detach()), attn.n_kv_heads), n_rep)
    v = repeat_kv(heads(F.linear(kv, attn.v_proj.weight.detach()), attn.n_kv_heads), n_rep)
    return scaled_dot_product_attention(q, k, v)


def attention_reconstruction_loss(h: torch.Tensor, old_mem: torch.Tensor, new_cmem: torch.Tensor,
                                  attn: XLRelativeAttention) -> torch.Tensor:
    """The Compressive Transformer's attention-reconstruction loss ``L_ar``.

    Mean squared difference between content attention of ``h (B, L, d)`` over the memories about to
    be discarded ``old_mem (B, n, d)`` and over their compression ``new_cmem (B, n // c, d)``, with
    the layer's projections. Only the compressor learns from it: ``h``, ``old_mem`` and ``attn``'s
    weights are gradient-stopped, so gradients reach ``new_cmem`` alone.
    """
    check_instance("attn", attn, XLRelativeAttention)
    for name, t in (("h", h), ("old_mem", old_mem), ("new_cmem", new_cmem)):
        _check_states(name, t, attn.d_model)
    if not h.shape[0] == old_mem.shape[0] == new_cmem.shape[0]:
        raise ValueError(f"h, old_mem, new_cmem must share the batch size, got {tuple(h.shape)}, "
                         f"{tuple(old_mem.shape)}, {tuple(new_cmem.shape)}")
    h, old_mem = h.detach(), old_mem.detach()
    return F.mse_loss(_content_attention(h, new_cmem, attn), _content_attention(h, old_mem, attn))


# ============================================================================= nearest neighbours
_GROUP = 32          # keys per group in the streaming top-k (see exact_knn)


def _knn_inputs(q: torch.Tensor, keys: torch.Tensor, k) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Validate and fold to 3-D: ``(G, Lq, d)`` queries and ``(G, N, d)`` keys with the same ``G``."""
    check_tensor("q", q, min_rank=2, floating=True)
    check_tensor("keys", keys, min_rank=2, floating=True)
    if q.dtype != keys.dtype:
        raise TypeError(f"q and keys must share a dtype, got {q.dtype} and {keys.dtype}")
    d, n = q.shape[-1], keys.shape[-2]
    if keys.shape[-1] != d:
        raise ValueError(f"q (..., Lq, d) and keys (..., N, d) must share d, got q {tuple(q.shape)} and "
                         f"keys {tuple(keys.shape)}")
    k = check_positive_int("k", k)
    if k > n:
        raise ValueError(f"k={k} exceeds the number of keys N={n} (keys {tuple(keys.shape)})")
    if all(s == 1 for s in keys.shape[:-2]):                 # one shared datastore: fold q's leading dims in
        return q.reshape(1, -1, d), keys.reshape(1, n, d), k
    if keys.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"keys must be one datastore (N, d) or have q's leading dims {tuple(q.shape[:-2])}, "
                         f"got keys {tuple(keys.shape)} for q {tuple(q.shape)}")
    return q.reshape(-1, q.shape[-2], d), keys.reshape(-1, n, d), k


def _block_scores(q_scaled, k_block, k_norm_block, out=None):
    """Ranking scores, smaller = nearer: ``|k|^2 - 2 q.k`` (l2) or ``-q.k`` (ip), one batched GEMM."""
    if k_norm_block is None:
        return torch.bmm(q_scaled, k_block.transpose(1, 2), out=out)
    return torch.baddbmm(k_norm_block.unsqueeze(1), q_scaled, k_block.transpose(1, 2), out=out)


def _stream_topk(q_scaled, keys, k_norm, k, block_size):
    """Exact k smallest scores per row, streaming over key blocks and merging running top-k lists.

    The first ``max(block_size, k)`` keys give the first list by ``torch.topk``. For each later
    block only entries below the row's running k-th best can enter the list. They are found
    cheaply: minima over groups of ``_GROUP`` keys pick the few groups that hold any, and only
    those groups are searched. The new entries of each row are padded into a small table and
    merged with the running list by one ``topk`` over ``k + (new entries)`` columns.
    """
    g, lq, _ = q_scaled.shape
    n = keys.shape[1]
    init = min(n, max(block_size, k))
    kn = None if k_norm is None else k_norm[:, :init]
    best_s, best_i = _block_scores(q_scaled, keys[:, :init], kn).topk(k, dim=-1, largest=False, sorted=False)
    best_s, best_i = best_s.reshape(g * lq, k), best_i.reshape(g * lq, k)
    n_groups = -(-block_size // _GROUP)
    buf = q_scaled.new_empty(g, lq, n_groups * _GROUP)
    for start in range(init, n, block_size):
        stop = min(start + block_size, n)
        kn = None if k_norm is None else k_norm[:, start:stop]
        if stop - start == buf.shape[-1]:
            _block_scores(q_scaled, keys[:, start:stop], kn, out=buf)
        else:                                                  # a short block: pad with +inf
            buf.fill_(float("inf"))
            buf[..., :stop - start] = _block_scores(q_scaled, keys[:, start:stop], kn)
        grouped = buf.view(g * lq, n_groups, _GROUP)
        threshold = best_s.amax(-1)                             # (g * lq,) the running k-th best
        row, grp = (grouped.amin(-1) < threshold.unsqueeze(-1)).nonzero(as_tuple=True)
        if row.numel() == 0:
            continue
        vals = grouped[row, grp]                                # (P, G): the groups that hold new entries
        p, off = (vals < threshold[row].unsqueeze(-1)).nonzero(as_tuple=True)
        row, new_s, new_i = row[p], vals[p, off], start + grp[p] * _GROUP + off   # row-sorted new entries
        counts = torch.bincount(row, minlength=g * lq)
        rank = torch.arange(row.numel(), device=row.device) - (counts.cumsum(0) - counts)[row]
        width = int(counts.max())
        table_s = best_s.new_full((g * lq, width), float("inf"))
        table_i = best_i.new_zeros((g * lq, width))
        table_s[row, rank], table_i[row, rank] = new_s, new_i
        best_s, pos = torch.cat([best_s, table_s], -1).topk(k, dim=-1, largest=False, sorted=False)
        best_i = torch.cat([best_i, table_i], -1).gather(-1, pos)
    return best_s.reshape(g, lq, k), best_i.reshape(g, lq, k)


def exact_knn(q: torch.Tensor, keys: torch.Tensor, k: int, *, metric: str = "l2", block_size: int | None = None):
    """Exact k nearest keys for each query.

    ``q (..., Lq, d)``; ``keys (N, d)`` (one datastore shared by all queries) or ``(..., N, d)`` with
    ``q``'s leading dims. Returns ``(scores, idx)``, both ``(..., Lq, k)``, best first:
    ``metric="l2"`` gives squared L2 distances ``|q - key|^2`` in ascending order; ``metric="ip"``
    gives inner products ``q . key`` in descending order. ``idx`` indexes dim -2 of ``keys``.

    ``block_size=None`` builds the full ``Lq x N`` score matrix and calls ``torch.topk``.
    ``block_size=b`` streams over blocks of ``b`` keys and merges running top-k lists, so memory is
    ``O(Lq * b)`` instead of ``O(Lq * N)``; the neighbours are the same (ties aside).
    """
    if metric not in ("l2", "ip"):
        raise ValueError(f"metric must be 'l2' or 'ip', got {metric!r}")
    if block_size is not None:
        block_size = check_positive_int("block_size", block_size)
    q3, keys3, k = _knn_inputs(q, keys, k)
    lead, lq = q.shape[:-2], q.shape[-2]
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    q3, keys3 = q3.to(cdtype), keys3.to(cdtype)
    if metric == "l2":
        q_scaled, k_norm = -2.0 * q3, keys3.square().sum(-1)
    else:
        q_scaled, k_norm = -q3, None
    if block_size is None:
        scores, idx = _block_scores(q_scaled, keys3, k_norm).topk(k, dim=-1, largest=False)
    else:
        scores, idx = _stream_topk(q_scaled, keys3, k_norm, k, block_size)
        scores, order = scores.sort(-1)
        idx = idx.gather(-1, order)
    if metric == "l2":
        scores = (scores + q3.square().sum(-1, keepdim=True)).clamp_min(0.0)
    else:
        scores = -scores
    return scores.reshape(*lead, lq, k).to(in_dtype), idx.reshape(*lead, lq, k)


def knn_distribution(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, k: int, vocab: int,
                     temp: float = 1.0, *, block_size: int | None = None) -> torch.Tensor:
    """kNN-LM's next-token distribution (Khandelwal et al. 2020).

    ``q (..., d)`` are context vectors, ``keys (N, d)`` the datastore's contexts and ``vals (N,)``
    the tokens that followed them. With the ``k`` nearest keys by squared L2 distance ``d_i``,
    ``p(w) = sum_{i: vals_i = w} softmax(-d_i / temp)``: the minus makes near keys weigh more,
    and neighbours with the same token add up. Returns ``(..., vocab)``; rows sum to 1.
    """
    check_tensor("q", q, min_rank=1, floating=True)
    check_tensor("keys", keys, rank=2, floating=True)
    check_tensor("vals", vals, rank=1)
    if vals.is_floating_point() or vals.dtype == torch.bool:
        raise TypeError(f"vals must be integer token ids, got dtype {vals.dtype}")
    if vals.shape[0] != keys.shape[0]:
        raise ValueError(f"vals must have one token per key: keys {tuple(keys.shape)}, vals {tuple(vals.shape)}")
    vocab = check_positive_int("vocab", vocab)
    if vals.numel() and (int(vals.min()) < 0 or int(vals.max()) >= vocab):
        raise ValueError(f"vals must lie in [0, vocab={vocab}), got range [{int(vals.min())}, {int(vals.max())}]")
    temp = check_real("temp", temp, low=0.0, low_open=True)
    dists, idx = exact_knn(q.unsqueeze(-2), keys, k, block_size=block_size)       # (..., 1, k)
    weights = torch.softmax(-dists.squeeze(-2).to(_compute_dtype(q.dtype)) / temp, dim=-1)
    p = weights.new_zeros(*q.shape[:-1], vocab)
    return p.scatter_add_(-1, vals[idx.squeeze(-2)], weights).to(q.dtype)


def knn_lm_interpolate(p_lm: torch.Tensor, p_knn: torch.Tensor, lam: float) -> torch.Tensor:
    """kNN-LM's mixture ``lam * p_knn + (1 - lam) * p_lm`` of two ``(..., vocab)`` distributions."""
    check_tensor("p_lm", p_lm, min_rank=1, floating=True)
    check_tensor("p_knn", p_knn, min_rank=1, floating=True)
    if p_lm.shape != p_knn.shape:
        raise ValueError(f"p_lm and p_knn must have the same shape, got {tuple(p_lm.shape)} and {tuple(p_knn.shape)}")
    lam = check_real("lam", lam, low=0.0, high=1.0)
    return lam * p_knn + (1.0 - lam) * p_lm


# ============================================================================= SPALM
class SpalmGate(nn.Module):
    """SPALM's gate between the local context and the long-term memory (Yogatama et al. 2021).

    ``forward(h (..., d), mem (..., K, d)) -> z (..., d)``: ``mem`` holds the output embeddings of the
    ``K`` retrieved neighbours' next tokens, ``m = softmax(mem h) mem`` summarises them, the scalar
    gate is ``g = sigmoid(w_g . h)`` and ``z = (1 - g) m + g h``; the next-token
    distribution is ``softmax(z W^T)`` with the tied embedding ``W``.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.w_g = nn.Linear(check_positive_int("d_model", d_model), 1)

    def gate(self, h: torch.Tensor) -> torch.Tensor:
        """``g = sigmoid(w_g . h + b)``: ``(..., d) -> (..., 1)``."""
        return torch.sigmoid(self.w_g(h))

    def forward(self, h: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        check_tensor("h", h, min_rank=1, floating=True)
        check_tensor("mem", mem, min_rank=2, floating=True)
        if h.shape[-1] != self.w_g.in_features:
            raise ValueError(f"h must be (..., d_model={self.w_g.in_features}), got shape {tuple(h.shape)}")
        if mem.shape[:-2] != h.shape[:-1] or mem.shape[-1] != h.shape[-1]:
            raise ValueError(f"mem must be (..., K, d) with h's leading dims: h {tuple(h.shape)}, mem {tuple(mem.shape)}")
        summary = torch.softmax((mem @ h.unsqueeze(-1)).squeeze(-1), dim=-1).unsqueeze(-2) @ mem
        g = self.gate(h)
        return (1.0 - g) * summary.squeeze(-2) + g * h


# ============================================================================= Memorizing Transformer
class FIFOKVMemory:
    """A first-in-first-out store of past keys and values, without gradients (Wu et al. 2022).

    ``add(k, v)`` appends ``(..., n, d_k)`` / ``(..., n, d_v)`` rows, detached, and evicts the oldest
    beyond ``capacity``; ``keys``/``values`` are ``(..., size, d)`` (None while empty).
    """

    def __init__(self, capacity: int):
        self.capacity = check_positive_int("capacity", capacity)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def reset(self) -> None:
        self.keys = self.values = None

    def add(self, k: torch.Tensor, v: torch.Tensor) -> None:
        check_tensor("k", k, min_rank=2, floating=True)
        check_tensor("v", v, min_rank=2, floating=True)
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"k (..., n, d_k) and v (..., n, d_v) must agree, got {tuple(k.shape)} and {tuple(v.shape)}")
        if self.keys is not None and (k.shape[:-2] != self.keys.shape[:-2] or k.shape[-1] != self.keys.shape[-1]
                                      or v.shape[-1] != self.values.shape[-1]):
            raise ValueError(f"k {tuple(k.shape)}, v {tuple(v.shape)} do not fit the stored keys "
                             f"{tuple(self.keys.shape)} and values {tuple(self.values.shape)}; call reset() first")
        k, v = k.detach(), v.detach()
        if self.keys is not None:
            k, v = torch.cat([self.keys, k], dim=-2), torch.cat([self.values, v], dim=-2)
        self.keys, self.values = k[..., -self.capacity:, :], v[..., -self.capacity:, :]


def knn_augmented_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mem_k: torch.Tensor | None,
                            mem_v: torch.Tensor | None, topk: int, gate_logit: torch.Tensor, *,
                            causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """The Memorizing Transformer's attention: local attention mixed with attention over retrieved memories.

    ``q, k, v (..., L, d)`` are the segment's (local attention, ``causal`` bottom-right);
    ``mem_k, mem_v (..., M, d)`` the external memory. Each query retrieves its ``topk`` memories by
    inner product (the largest attention logits), attends over them alone, and a per-head gate
    mixes the two: ``g * A_mem + (1 - g) * A_local`` with ``g = sigmoid(gate_logit)`` and
    ``gate_logit`` broadcastable to the leading dims (``(H,)``, one per head). Gradients reach
    ``q`` through the retrieved scores, never the memory. With an empty memory (None or ``M = 0``)
    the result is the local attention.
    """
    topk = check_positive_int("topk", topk)
    local = scaled_dot_product_attention(q, k, v, causal=causal, scale=scale)
    if mem_k is None or mem_k.shape[-2] == 0:
        return local
    check_tensor("mem_k", mem_k, min_rank=2, floating=True)
    check_tensor("mem_v", mem_v, min_rank=2, floating=True)
    check_tensor("gate_logit", gate_logit, floating=True)
    if mem_k.shape[:-1] != mem_v.shape[:-1] or mem_k.shape[:-2] != q.shape[:-2] or mem_v.shape[-1] != v.shape[-1]:
        raise ValueError(f"mem_k (..., M, d) and mem_v (..., M, d_v) must have q's leading dims and v's d_v: "
                         f"q {tuple(q.shape)}, v {tuple(v.shape)}, mem_k {tuple(mem_k.shape)}, mem_v {tuple(mem_v.shape)}")
    lead = q.shape[:-2]
    if not broadcasts_to(gate_logit.shape, lead):
        raise ValueError(f"gate_logit must broadcast to the leading dims {tuple(lead)} (e.g. (H,)), "
                         f"got {tuple(gate_logit.shape)}")
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    qc, mk, mv = q.to(cdtype), mem_k.detach().to(cdtype), mem_v.detach().to(cdtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    _, idx = exact_knn(qc.detach(), mk, topk, metric="ip")                          # (..., L, topk)
    pick = lambda mem: mem.unsqueeze(-3).expand(*idx.shape[:-1], *mem.shape[-2:]).gather(
        -2, idx.unsqueeze(-1).expand(*idx.shape, mem.shape[-1]))                  # (..., L, topk, d)
    ret_k, ret_v = pick(mk), pick(mv)
    weights = torch.softmax((ret_k @ qc.unsqueeze(-1)).squeeze(-1) * scale, dim=-1)
    from_memory = (weights.unsqueeze(-2) @ ret_v).squeeze(-2)
    g = torch.sigmoid(gate_logit.to(cdtype))[..., None, None]
    return (g * from_memory + (1.0 - g) * local.to(cdtype)).to(in_dtype)


class MemorizingAttention(nn.Module):
    """Multi-head causal attention with a kNN memory of the past (Wu et al. 2022), for ``(B, L, d_model)``.

    Queries and keys are L2-normalised (queries and keys, not values), so cached keys
    keep a comparable scale as training moves on; logits are cosines times a learned per-head
    scale. The same projections serve local and kNN attention; a learned scalar gate per head mixes
    them (`knn_augmented_attention`). After each call the segment's keys and values are written,
    detached, into the `FIFOKVMemory` ``self.memory`` (per batch row and head).
    """

    def __init__(self, d_model: int, n_heads: int, capacity: int, topk: int = 32):
        super().__init__()
        check_positive_int("d_model", d_model)
        self.n_heads = check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.d_model, self.d_head, self.topk = d_model, d_model // n_heads, check_positive_int("topk", topk)
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.log_scale = nn.Parameter(torch.full((n_heads,), 0.5 * math.log(self.d_head)))
        self.gate_logit = nn.Parameter(torch.zeros(n_heads))
        self.memory = FIFOKVMemory(capacity)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_states("x", x, self.d_model)
        b, length, _ = x.shape
        heads = lambda t: t.view(b, length, self.n_heads, self.d_head).transpose(1, 2)
        q = F.normalize(heads(self.q_proj(x)), dim=-1) * self.log_scale.exp()[:, None, None]
        k = F.normalize(heads(self.k_proj(x)), dim=-1)
        v = heads(self.v_proj(x))
        mem = self.memory
        if len(mem) and mem.keys.shape[0] != b:
            raise ValueError(f"batch size {b} differs from the memory's {mem.keys.shape[0]}; call memory.reset()")
        topk = min(self.topk, len(mem)) if len(mem) else 1
        out = knn_augmented_attention(q, k, v, mem.keys, mem.values, topk, self.gate_logit, scale=1.0)
        mem.add(k, v)
        return self.out_proj(out.transpose(1, 2).reshape(b, length, self.d_model))


# ============================================================================= Titans neural memory
class NeuralMemory:
    """A linear associative memory ``M (..., d_k, d_v)`` trained at test time (Titans, Behrouz et al. 2025).

    ``read(q) = q M``. ``write(k, v)`` takes one step on the loss ``l(M) = |k M - v|^2``, with
    momentum ``eta`` and forgetting (weight decay) ``alpha``:
    ``S <- eta S - lr * grad``, ``M <- (1 - alpha) M + S``, where ``grad = 2 k^T (k M - v)``
    (``kind="delta"``, the delta rule) or ``grad = -k^T v`` (``kind="hebbian"``, the gradient of
    ``-<k M, v>``). Row-vector convention: the column form ``M - lr 2 (M k - v) k^T`` is the same
    step transposed. With ``kind="hebbian"``, ``lr=1`` and no momentum or forgetting,
    ``M_t = sum_s k_s^T v_s``, the linear-attention state.
    """

    def __init__(self, d: int, kind: str = "delta", lr: float = 0.1, momentum: float = 0.0, decay: float = 0.0, *,
                 d_value: int | None = None):
        if kind not in ("hebbian", "delta"):
            raise ValueError(f"kind must be 'hebbian' or 'delta', got {kind!r}")
        lr = check_real("lr", lr, low=0.0)
        momentum = check_real("momentum", momentum, low=0.0, high=1.0)
        decay = check_real("decay", decay, low=0.0, high=1.0)
        self.d_key = check_positive_int("d", d)
        self.d_value = self.d_key if d_value is None else check_positive_int("d_value", d_value)
        self.kind, self.lr, self.momentum, self.decay = kind, float(lr), float(momentum), float(decay)
        self.M: torch.Tensor | None = None
        self.S: torch.Tensor | None = None

    def reset(self) -> None:
        self.M = self.S = None

    def _state(self, like: torch.Tensor) -> None:
        if self.M is None:
            shape = like.shape[:-1] + (self.d_key, self.d_value)
            self.M = like.new_zeros(shape, dtype=_compute_dtype(like.dtype))
            self.S = torch.zeros_like(self.M)

    def read(self, q: torch.Tensor) -> torch.Tensor:
        """``q (..., d_k) -> q M (..., d_v)`` (zeros before the first write)."""
        check_tensor("q", q, min_rank=1, floating=True)
        if q.shape[-1] != self.d_key:
            raise ValueError(f"q must end in d_k={self.d_key}, got shape {tuple(q.shape)}")
        self._state(q)
        return (q.to(self.M.dtype).unsqueeze(-2) @ self.M).squeeze(-2).to(q.dtype)

    def write(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One update with ``k (..., d_k)``, ``v (..., d_v)``; returns the surprise ``|grad|_F`` ``(...)``."""
        check_tensor("k", k, min_rank=1, floating=True)
        check_tensor("v", v, min_rank=1, floating=True)
        if k.shape[-1] != self.d_key or v.shape[-1] != self.d_value or k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"k must be (..., {self.d_key}) and v (..., {self.d_value}) with the same leading dims, "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        self._state(k)
        if self.M.shape[:-2] != k.shape[:-1]:
            raise ValueError(f"k's leading dims {tuple(k.shape[:-1])} differ from the memory's {tuple(self.M.shape[:-2])}")
        k, v = k.to(self.M.dtype), v.to(self.M.dtype)
        if self.kind == "delta":
            err = (k.unsqueeze(-2) @ self.M).squeeze(-2) - v
            grad = 2.0 * k.unsqueeze(-1) * err.unsqueeze(-2)
        else:
            grad = -k.unsqueeze(-1) * v.unsqueeze(-2)
        self.S = self.momentum * self.S - self.lr * grad
        self.M = (1.0 - self.decay) * self.M + self.S
        return grad.flatten(-2).norm(dim=-1)

    def scan(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_surprise: bool = False):
        """Write ``(k_t, v_t)`` then read ``q_t``, for ``t = 0 .. L-1``: ``(..., L, d)`` → ``(..., L, d_v)``.

        Starts from the current state (call `reset` for an empty memory); with ``return_surprise``
        also the ``(..., L)`` surprises.
        """
        check_tensor("q", q, min_rank=2, floating=True)
        if not q.shape[:-1] == k.shape[:-1] == v.shape[:-1]:
            raise ValueError(f"q, k, v must share (..., L), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        outs, surprises = [], []
        for t in range(q.shape[-2]):
            surprises.append(self.write(k[..., t, :], v[..., t, :]))
            outs.append(self.read(q[..., t, :]))
        out = torch.stack(outs, dim=-2)
        return (out, torch.stack(surprises, dim=-1)) if return_surprise else out
