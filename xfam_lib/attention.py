"""Attention: scaled dot-product attention, masks, multi-head attention (MHA/GQA/MQA), softmax
numerics, scoring functions, log-sum-exp merging and tiled (FlashAttention-style) attention.

Conventions (see the book's conventions page and ``shared/API.md``):

* ``q, k, v`` are ``(..., L, d)``; the sequence is dim -2.
* Masks are boolean, **True = may attend**, broadcastable to ``(..., Lq, Lk)``.
* Causal masks are bottom-right aligned: query row ``i`` sits at absolute position ``Lk - Lq + i``.
* A query row whose keys are all masked returns zeros, never NaN.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .utils import (BlockSizeError, check_bias, check_block_size, check_broadcasts_to_scores,
                    check_positive_int, check_qkv, check_same_dtype, check_tensor, resolve_scale)
from .utils import compute_dtype as _compute_dtype

__all__ = [
    "induction_score",
    "causal_mask",
    "padding_mask",
    "document_mask",
    "scaled_dot_product_attention",
    "attention_reference",
    "repeat_kv",
    "KVCache",
    "CrossKVCache",
    "MultiHeadAttention",
    "softmax_naive",
    "softmax_safe",
    "softmax_online",
    "log_softmax_lse",
    "softmax_jacobian",
    "attention_entropy",
    "logn_scale",
    "dot_score",
    "additive_score",
    "bilinear_score",
    "cosine_score",
    "soft_lookup",
    "shared_qk_scores",
    "head_via_kron",
    "normalized_relu_attention",
    "attention_with_lse",
    "merge_partials",
    "BlockSizeError",
    "tiled_attention",
]


# ----------------------------------------------------------------------------- masks
def causal_mask(q_len: int, k_len: int | None = None, *, window: int | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``(q_len, k_len)`` causal mask, bottom-right aligned (True = may attend).

    Query ``i`` sits at absolute position ``i' = i + k_len - q_len`` and may attend key ``j`` iff
    ``j <= i'`` and, when ``window`` is given, ``i' - j <= window`` (the sliding-window band).
    With ``k_len < q_len`` the first ``q_len - k_len`` rows see no key, as in PyTorch's SDPA
    (``torch.nn.attention.bias.causal_lower_right``).
    """
    q_len = check_positive_int("q_len", q_len)
    k_len = q_len if k_len is None else check_positive_int("k_len", k_len)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    return _bottom_right(q_len, k_len, window, device)


def _bottom_right(q_len: int, k_len: int, window: int | None, device) -> torch.Tensor:
    """The bottom-right causal rule for any lengths: query ``i`` at ``i' = i + k_len - q_len`` sees keys
    ``j <= i'`` (and ``i' - j <= window``). With ``q_len > k_len`` the first ``q_len - k_len`` rows see no key."""
    i = torch.arange(q_len, device=device).unsqueeze(-1) + (k_len - q_len)
    j = torch.arange(k_len, device=device)
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) <= window
    return allowed


def padding_mask(lengths, max_len: int | None = None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Key-padding mask ``(B, 1, 1, max_len)``: True at the first ``lengths[b]`` positions of row ``b``.

    Broadcasts against scores ``(B, H, Lq, Lk)``; combine with a causal mask using ``&``.
    """
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer sequence, got shape {tuple(lengths.shape)} "
                         f"and dtype {lengths.dtype}")
    if lengths.numel() == 0 and max_len is None:
        raise ValueError("lengths is empty (a batch of 0): pass max_len, the mask's key length")
    if (lengths < 0).any():
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    max_len = int(lengths.max()) if max_len is None else check_positive_int("max_len", max_len)
    if (lengths > max_len).any():
        raise ValueError(f"every length must be <= max_len={max_len}, got {lengths.tolist()}")
    valid = torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(-1)
    return valid[:, None, None, :]


def document_mask(doc_lengths, *, causal: bool = True, device: torch.device | str | None = None) -> torch.Tensor:
    """Mask ``(L, L)`` for documents packed into one sequence: tokens attend only within their document.

    ``doc_lengths`` lists the documents' lengths in order (``L = sum(doc_lengths)``); with
    ``causal=True`` each document is also causal (block-diagonal lower-triangular).
    """
    lengths = torch.as_tensor(doc_lengths, device=device)
    if lengths.dim() != 1 or lengths.numel() == 0 or (lengths <= 0).any() or lengths.dtype.is_floating_point:
        raise ValueError(f"doc_lengths must be a non-empty 1-D sequence of positive ints, got {doc_lengths!r}")
    doc_id = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    allowed = doc_id.unsqueeze(-1) == doc_id.unsqueeze(0)
    if causal:
        allowed &= causal_mask(doc_id.numel(), device=lengths.device)
    return allowed


# ----------------------------------------------------------------------------- scaled dot-product attention
def _combined_mask(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor | None:
    """Validate ``mask`` and fold the bottom-right causal mask into it; None when nothing is masked."""
    if mask is not None:
        check_tensor("mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
                            f"pass additive float biases as bias=")
        check_broadcasts_to_scores("mask", mask, q, k)
    if causal:
        cmask = _bottom_right(q.shape[-2], k.shape[-2], None, q.device)
        mask = cmask if mask is None else mask & cmask
    return mask


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Row softmax of ``scores (..., Lq, Lk)`` over the keys ``mask`` allows (True = may attend); a row
    with no allowed key gets zero weights (not NaN), and a zero gradient."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    row_has_key = mask.any(dim=-1, keepdim=True)                    # (..., Lq, 1)
    scores = scores.masked_fill(~mask, float("-inf"))
    scores = scores.masked_fill(~row_has_key, 0.0)                  # keep softmax finite on empty rows
    return torch.softmax(scores, dim=-1) * row_has_key              # ... and then zero them


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                        bias: torch.Tensor | None = None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula, step by step: ``softmax(q k^T * scale + bias, masked) v``. Returns ``(out, weights)``.

    Inputs must already be validated; fully masked rows get zero weights. Computes in the
    input dtype (callers upcast half precision).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale          # (..., Lq, Lk)
    if bias is not None:
        scores = scores + bias
    weights = _masked_softmax(scores, mask)
    return torch.matmul(weights, v), weights


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                                 *, bias: torch.Tensor | None = None, causal: bool = False,
                                 scale: float | None = None, return_weights: bool = False):
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d_k) + bias) v`` with boolean masks.

    Shapes: ``q (..., Lq, d_k)``, ``k (..., Lk, d_k)``, ``v (..., Lk, d_v)`` → ``out (..., Lq, d_v)``;
    with ``return_weights=True`` also ``weights (..., Lq, Lk)``.
    ``mask`` (boolean, True = may attend) and ``bias`` must broadcast to the scores ``(..., Lq, Lk)``
    without enlarging them. ``causal`` is bottom-right aligned: query ``i`` sits at position
    ``Lk - Lq + i``, so with ``Lq > Lk`` the first ``Lq - Lk`` queries see no key. Rows with no allowed
    key return zeros; otherwise a NaN in a query makes its output row NaN, on every path.
    ``scale`` defaults to ``1/sqrt(d_k)``. fp16/bf16 inputs come back in their own dtype. The
    explicit path (``return_weights=True``) and the fused path with a ``bias`` compute in fp32
    (the bias is never rounded to the half type); the fused path without a bias hands the half
    tensors to PyTorch's kernel, which rounds the weights ``P`` to the half type before ``P v``.

    Without ``return_weights`` the result comes from PyTorch's fused kernel
    (``torch.nn.functional.scaled_dot_product_attention``) with the conventions above enforced
    around it; with it, from `attention_reference`, the explicit formula. Tests check the two agree.
    """
    check_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    check_bias(bias, q, k)
    in_dtype = q.dtype
    work = _compute_dtype(in_dtype)                                 # fp32 for halves
    if bias is not None:
        bias = bias.to(work)
    # Plain causal self-attention goes straight to the fused kernel's own causal path (top-left and
    # bottom-right alignment coincide when Lq == Lk), so no (L, L) mask is built.
    fused_causal = causal and mask is None and bias is None and not return_weights and q.shape[-2] == k.shape[-2]
    mask = None if fused_causal else _combined_mask(q, k, mask, causal)

    if return_weights:
        q, k, v = q.to(work), k.to(work), v.to(work)
        out, weights = attention_reference(q, k, v, mask, bias=bias, scale=scale)
        return out.to(in_dtype), weights.to(in_dtype)

    # Fused path. Rows with no allowed key are opened up (so the kernel never sees an empty row)
    # and their output is zeroed afterwards; this keeps outputs and gradients finite. Done for
    # every row without asking first whether any row is empty: that question would cost a host
    # synchronisation on a GPU at every call.
    empty_rows = None
    if mask is not None:
        empty_rows = ~mask.any(dim=-1, keepdim=True)                # (..., Lq, 1)
        mask = mask | empty_rows
    attn_mask = mask
    if bias is not None:
        # the kernel wants the mask in q's dtype: with a bias, run it in fp32 so the bias is not rounded
        q, k, v = q.to(work), k.to(work), v.to(work)
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    d_v = v.shape[-1]
    if q.is_cuda:
        q, k, v = _pad_head_dim(q), _pad_head_dim(k), _pad_head_dim(v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=fused_causal, scale=scale)
    # A NaN query makes its row NaN, as in the formula; PyTorch's fused CPU kernel returns 0 there instead.
    out = out[..., :d_v].masked_fill(q.isnan().any(-1, keepdim=True), float("nan"))
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out.to(in_dtype)


def _pad_head_dim(t: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """Zero-pad the head size (dim -1) to a multiple of ``multiple``, for CUDA only.

    PyTorch's fused CUDA kernels (FlashAttention, memory-efficient) accept head sizes that are a
    multiple of 8; for any other size SDPA silently takes its math path, which stores the
    ``(Lq, Lk)`` scores (1.4 GiB at L = 8192 for head size 14). Zero columns change neither
    ``q k^T`` nor, once sliced off, ``P v``; the caller passes the scale of the unpadded size.
    """
    extra = -t.shape[-1] % multiple
    return F.pad(t, (0, extra)) if extra else t


# ----------------------------------------------------------------------------- GQA helper
def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``(B, H_kv, L, d)`` → ``(B, H_kv * n_rep, L, d)``; query head ``h`` uses kv head ``h // n_rep``."""
    check_tensor("x", x, rank=4)
    n_rep = check_positive_int("n_rep", n_rep)
    if n_rep == 1:
        return x
    b, h_kv, length, d = x.shape
    return x[:, :, None].expand(b, h_kv, n_rep, length, d).reshape(b, h_kv * n_rep, length, d)


# ----------------------------------------------------------------------------- KV caches
class KVCache(nn.Module):
    """Preallocated key/value cache of one attention layer: buffers ``(max_batch, n_kv_heads, max_len, d_head)``.

    ``update(k, v, start_pos)`` writes the new ``(B, n_kv_heads, L_new, d_head)`` keys and values at
    positions ``start_pos .. start_pos + L_new - 1`` and returns all cached keys and values up to
    there. ``length`` is the number of positions filled so far.
    """

    def __init__(self, max_batch: int, max_len: int, n_kv_heads: int, d_head: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__()
        for name, val in (("max_batch", max_batch), ("max_len", max_len), ("n_kv_heads", n_kv_heads), ("d_head", d_head)):
            check_positive_int(name, val)
        shape = (max_batch, n_kv_heads, max_len, d_head)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        self.length = 0

    def update(self, k: torch.Tensor, v: torch.Tensor, start_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v`` ``(B, n_kv_heads, L_new, d_head)`` at ``start_pos``; return keys/values ``[:start_pos + L_new]``."""
        check_tensor("k", k, rank=4)
        check_tensor("v", v, rank=4)
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        b, h, n_new, d = k.shape
        if b > self.k.shape[0] or h != self.k.shape[1] or d != self.k.shape[3]:
            raise ValueError(f"k of shape {tuple(k.shape)} does not fit a cache of shape {tuple(self.k.shape)} "
                             f"(batch <= max_batch, same n_kv_heads and d_head)")
        if not 0 <= start_pos <= self.length:
            raise ValueError(f"start_pos must be in [0, {self.length}] (the filled length), got {start_pos}")
        end = start_pos + n_new
        if end > self.max_len:
            raise ValueError(f"cache overflow: start_pos {start_pos} + {n_new} new positions > max_len {self.max_len}")
        self.k[:b, :, start_pos:end] = k.to(self.k.dtype)
        self.v[:b, :, start_pos:end] = v.to(self.v.dtype)
        self.length = end
        return self.k[:b, :, :end], self.v[:b, :, :end]


class CrossKVCache:
    """The projected keys/values of a fixed memory (the encoder output) for cross-attention.

    `MultiHeadAttention` projects ``kv`` once and reuses ``k, v`` while it is fed the same memory
    tensor, unchanged (same object, same in-place version). Fed a different memory, or the same one
    modified in place, it projects again, so the cache never answers for a memory it has not seen.
    """

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.memory: torch.Tensor | None = None
        self._version: int | None = None

    def holds(self, memory: torch.Tensor) -> bool:
        """Whether ``k, v`` were projected from ``memory`` as it is now."""
        return self.k is not None and memory is self.memory and memory._version == self._version

    def store(self, memory: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep ``k, v`` projected from ``memory`` (and a reference to it, so it is recognised later)."""
        self.memory, self._version, self.k, self.v = memory, memory._version, k, v


# ----------------------------------------------------------------------------- multi-head attention
class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional grouped-query (GQA) or multi-query (MQA) keys/values.

    ``n_kv_heads`` (default ``n_heads``) key/value heads are shared by groups of
    ``n_heads // n_kv_heads`` query heads: ``n_kv_heads == 1`` is MQA. Per-head width
    ``d_head = d_model // n_heads``; scores are scaled by ``1/sqrt(d_head)``.

    ``forward(x (B, Lq, d_model), kv=None, mask=None, causal=False, cache=None)`` → ``(B, Lq, d_model)``.
    ``kv`` (B, Lk, d_model) gives cross-attention; ``mask`` is boolean, broadcastable to
    ``(B, n_heads, Lq, Lk)``. ``cache`` is a `KVCache` (self-attention: new keys are appended
    at ``cache.length``) or a `CrossKVCache` (memory keys projected once). ``rope``, a callable
    ``rope(x (B, H, L, d_head), positions (L,)) -> same shape`` such as
    ``positional.RotaryEmbedding``, rotates queries and keys (never values) at their absolute positions.

    Set ``keep_weights = True`` to store the last attention weights ``(B, n_heads, Lq, Lk)`` in
    ``last_weights`` (computed by the explicit formula; used for plots).
    """

    keep_weights: bool = False

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *, bias: bool = True,
                 rope: nn.Module | None = None):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("n_heads", n_heads)
        n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.rope = rope
        self.q_proj = nn.Linear(d_model, n_heads * self.d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.out_proj = nn.Linear(n_heads * self.d_head, d_model, bias=bias)

    def _split(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, n, self.d_head).transpose(1, 2)          # (B, n, L, d_head)

    def _rope(self, x: torch.Tensor, start: int) -> torch.Tensor:
        if self.rope is None:
            return x
        return self.rope(x, torch.arange(start, start + x.shape[-2], device=x.device))

    def make_cache(self, max_batch: int, max_len: int, *, dtype: torch.dtype | None = None) -> KVCache:
        """An empty `KVCache` sized for this layer."""
        weight = self.k_proj.weight
        return KVCache(max_batch, max_len, self.n_kv_heads, self.d_head, dtype=dtype or weight.dtype,
                       device=weight.device)

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                causal: bool = False, cache: KVCache | CrossKVCache | None = None, *,
                return_weights: bool = False, bias: torch.Tensor | None = None):
        q, k, v = self._project(x, kv, cache)
        want_weights = return_weights or self.keep_weights
        result = self.attend(q, k, v, mask=mask, bias=bias, causal=causal, return_weights=want_weights)
        out, weights = result if want_weights else (result, None)
        if self.keep_weights:
            self.last_weights = weights.detach()
        out = self._merge(out)
        return (out, weights) if return_weights else out

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None,
               bias: torch.Tensor | None, causal: bool, return_weights: bool):
        """The attention step on split heads: ``q (B, H, Lq, d_head)``, ``k, v (B, H, Lk, d_head)``
        → ``(B, H, Lq, d_head)`` (and the weights). A subclass overrides it to score differently
        (relative positions, `positional.ShawRelativeAttention`)."""
        return scaled_dot_product_attention(q, k, v, mask, bias=bias, causal=causal, return_weights=return_weights)

    def _project(self, x: torch.Tensor, kv: torch.Tensor | None,
                 cache: KVCache | CrossKVCache | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``(B, H, Lq, d_head)`` and every key and value so far, repeated to ``H`` heads."""
        check_tensor("x", x, rank=3, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have d_model={self.d_model} features, got shape {tuple(x.shape)}")
        if kv is not None:
            check_tensor("kv", kv, rank=3, floating=True)
            if kv.shape[0] != x.shape[0] or kv.shape[-1] != self.d_model:
                raise ValueError(f"kv must be (B={x.shape[0]}, Lk, {self.d_model}), got {tuple(kv.shape)}")
            if self.rope is not None:
                raise ValueError("rope= is for self-attention: queries and the keys of kv= are positions of two "
                                 "different sequences (and a CrossKVCache keeps its keys unrotated)")
        start = cache.length if isinstance(cache, KVCache) else 0
        q = self._rope(self._split(self.q_proj(x), self.n_heads), start)

        if isinstance(cache, CrossKVCache):
            if kv is None:
                raise ValueError("a CrossKVCache needs kv= (the memory it caches) on every call")
            if not cache.holds(kv):
                cache.store(kv, self._split(self.k_proj(kv), self.n_kv_heads), self._split(self.v_proj(kv), self.n_kv_heads))
            k, v = cache.k, cache.v
        else:
            source = x if kv is None else kv
            k = self._rope(self._split(self.k_proj(source), self.n_kv_heads), start)
            v = self._split(self.v_proj(source), self.n_kv_heads)
            if isinstance(cache, KVCache):
                if kv is not None:
                    raise ValueError("a KVCache is for self-attention; use CrossKVCache with kv=")
                k, v = cache.update(k, v, start)
            elif cache is not None:
                raise TypeError(f"cache must be a KVCache or CrossKVCache, got {type(cache).__name__}")
        n_rep = self.n_heads // self.n_kv_heads
        return q, repeat_kv(k, n_rep), repeat_kv(v, n_rep)

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        """Heads ``(B, H, L, d_head)`` back to ``(B, L, d_model)`` through the output projection."""
        b, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, length, self.n_heads * self.d_head))


# ------------------------------------------------------------------ softmax numerics
def softmax_naive(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``exp(x) / sum(exp(x))`` exactly as written, in ``x``'s dtype.

    Overflows for large logits: ``exp(1000)`` is ``inf`` in fp32 and fp64, so ``[1000, 999]`` gives
    ``inf / inf = nan``. Kept as the cautionary reference for `softmax_safe`.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def softmax_safe(x: torch.Tensor, dim: int = -1, *, upcast: bool = True) -> torch.Tensor:
    """Softmax with the max subtracted first: ``exp(x - m) / sum(exp(x - m))``, ``m = max(x)``.

    Shift invariance (``softmax(x + c) = softmax(x)``) makes the result exact while every exponent
    is ``<= 0``, so nothing overflows. A slice of only ``-inf`` gives NaN, like `torch.softmax`. ``m`` is detached: its gradient contribution is exactly zero.
    ``upcast=True`` (default) computes fp16/bf16 inputs in fp32 and rounds once at the end;
    ``upcast=False`` computes in the input dtype (the lossy way, for comparison). Same shape out.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    in_dtype = x.dtype
    if upcast:
        x = x.to(_compute_dtype(in_dtype))
    e = torch.exp(x - x.detach().amax(dim=dim, keepdim=True))
    return (e / e.sum(dim=dim, keepdim=True)).to(in_dtype)


def softmax_online(values, *, trace: bool = False):
    """Softmax of a stream, reading each value once (Milakov & Gimelshein's online normaliser).

    ``values`` is any iterable (a generator is fine) of numbers or 1-D tensor chunks. One pass keeps
    a running max ``m`` and a denominator ``l`` rescaled whenever the max grows (``j = 0, 1, ...``)::

        m_j = max(m_{j-1}, x_j)        l_j = l_{j-1} * exp(m_{j-1} - m_j) + exp(x_j - m_j)

    so after the last value, ``j = n - 1``, ``l_j = sum_i exp(x_i - m_j)`` (the safe denominator). The
    values are kept as they stream past and the probabilities ``exp(x_i - m_j) / l_j`` are formed at
    the end. Returns a 1-D tensor (the chunks' dtype, accumulated in fp32 for halves; float64 for
    Python numbers); with ``trace=True`` returns ``(probs, maxes, denominators)``, the running
    ``m_j`` and ``l_j`` after each element or chunk (float64 tensors). A stream of only ``-inf`` has no
    distribution and gives NaN, as `torch.softmax` and `softmax_safe` do (attention treats fully
    masked rows separately).
    """
    seen, maxes, denoms = [], [], []
    out_dtype = None
    m = d = None
    for chunk in values:
        c = torch.as_tensor(chunk)
        if not c.is_floating_point():
            if c.dtype == torch.bool or c.is_complex():
                raise TypeError(f"values must hold real numbers, got a chunk of dtype {c.dtype}")
            c = c.to(torch.float64)
        if out_dtype is None:
            out_dtype = c.dtype
            m = torch.tensor(float("-inf"), dtype=_compute_dtype(out_dtype), device=c.device)
            d = torch.zeros((), dtype=m.dtype, device=c.device)
        elif c.dtype != out_dtype:
            raise TypeError(f"every chunk of values must have one dtype, got {out_dtype} then {c.dtype}")
        c = c.reshape(-1).to(m.dtype)
        if c.numel():
            m_new = torch.maximum(m, c.max())
            if m_new > float("-inf"):                    # rescale the old sum to the new max, add the chunk
                d = d * torch.exp(m - m_new) + torch.exp(c - m_new).sum()
            m = m_new
            seen.append(c)
        maxes.append(float(m))
        denoms.append(float(d))
    if not seen:
        raise ValueError("values must contain at least one number")
    probs = (torch.exp(torch.cat(seen) - m) / d).to(out_dtype)
    if trace:
        return probs, torch.tensor(maxes, dtype=torch.float64), torch.tensor(denoms, dtype=torch.float64)
    return probs


def log_softmax_lse(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``log softmax(x) = x - LSE(x)`` with ``LSE(x) = c + log sum exp(x - c)``, ``c = max(x)``.

    Finite wherever the log-probability is finite: fp32 ``log(softmax([0, -200]))`` is ``[0, -inf]``
    (``exp(-200)`` underflows) while this gives ``[0, -200]``. Halves are computed in fp32.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    in_dtype = x.dtype
    x = x.to(_compute_dtype(in_dtype))
    c = x.detach().amax(dim=dim, keepdim=True)
    lse = c + torch.log(torch.exp(x - c).sum(dim=dim, keepdim=True))
    return (x - lse).to(in_dtype)


def softmax_jacobian(y: torch.Tensor) -> torch.Tensor:
    """Jacobian of softmax at output ``y`` ``(..., n)``: ``J = diag(y) - y y^T`` ``(..., n, n)``.

    ``J_ij = dy_i/dx_j = y_i (delta_ij - y_j)``; it vanishes for a one-hot ``y`` (saturation).
    """
    check_tensor("y", y, min_rank=1, floating=True)
    return torch.diag_embed(y) - y.unsqueeze(-1) * y.unsqueeze(-2)


def attention_entropy(weights: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Entropy in nats of each attention row: ``H = -sum_j a_j log a_j`` (with ``0 log 0 = 0``).

    ``0 <= H <= log n``: 0 for a one-hot row, ``log n`` for a uniform row over ``n`` keys. The shape
    is ``weights``'s without ``dim``; halves are computed in fp32 and returned in their dtype.
    """
    check_tensor("weights", weights, min_rank=1, floating=True)
    w = weights.to(_compute_dtype(weights.dtype))
    return (-torch.special.xlogy(w, w).sum(dim=dim)).to(weights.dtype)


def induction_score(weights: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """How much of its attention each query puts on the tokens that followed earlier copies of its own
    token (Olsson et al. 2022), averaged over the queries that have an earlier copy: a scalar, 1 for a
    perfect induction head.

    ``weights (..., L, L)`` (rows sum to 1), ``tokens (..., L)`` broadcastable to ``weights``'s leading
    dims. Key ``j`` is an induction target of query ``i`` when ``j <= i`` and ``tokens[j - 1] == tokens[i]``.
    Raises if no query has an earlier copy of its token.
    """
    check_tensor("weights", weights, min_rank=2, floating=True)
    check_tensor("tokens", tokens, min_rank=1)
    L = weights.shape[-1]
    if weights.shape[-2] != L or tokens.shape[-1] != L:
        raise ValueError(f"weights must be (..., L, L) and tokens (..., L), got {tuple(weights.shape)} and "
                         f"{tuple(tokens.shape)}")
    follows_copy = tokens[..., :-1].unsqueeze(-2) == tokens.unsqueeze(-1)   # [i, j-1]: token j-1 equals token i
    pos = torch.arange(L, device=weights.device)
    target = F.pad(follows_copy, (1, 0)) & (pos <= pos.unsqueeze(-1))      # (..., L, L); key 0 follows nothing
    mass = (weights * target).sum(-1)                                       # (..., L) attention on the targets
    has = target.any(-1).expand(mass.shape)
    if not bool(has.any()):
        raise ValueError("induction_score: no query has an earlier copy of its token")
    return mass[has].mean()


def logn_scale(n, train_len: int):
    """Log-n attention factor ``log_m n = log n / log m`` (m = ``train_len``): multiply ``scale=`` by it.

    Equals 1 at ``n = m`` and grows slowly beyond, sharpening the softmax as the context grows
    (Su 2021). ``n`` is a positive int (returns a float) or an integer tensor of key counts, e.g.
    ``arange(1, L + 1)`` for causal rows (returns a float tensor).
    """
    train_len = check_positive_int("train_len", train_len)
    if train_len < 2:
        raise ValueError(f"train_len must be >= 2 (log 1 = 0), got {train_len}")
    if isinstance(n, torch.Tensor):
        if n.is_floating_point() or n.dtype == torch.bool or (n < 1).any():
            raise ValueError(f"n must hold positive integers, got dtype {n.dtype} and shape {tuple(n.shape)}")
        return torch.log(n.double()) / math.log(train_len)
    return math.log(check_positive_int("n", n)) / math.log(train_len)


# ------------------------------------------------------------------ scoring functions
def _check_qk(q: torch.Tensor, k: torch.Tensor, *, same_d: bool = True) -> None:
    check_tensor("q", q, min_rank=2, floating=True)
    check_tensor("k", k, min_rank=2, floating=True)
    check_same_dtype(q=q, k=k)
    if same_d and q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size (dim -1), got q {tuple(q.shape)} and k {tuple(k.shape)}")


def _check_matrix(name: str, w: torch.Tensor, shape: tuple[int | None, ...]) -> None:
    check_tensor(name, w, rank=len(shape), floating=True)
    if any(want is not None and got != want for got, want in zip(w.shape, shape)):
        want = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{name} must have shape {want}, got {tuple(w.shape)}")


def dot_score(q: torch.Tensor, k: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
    """Dot-product scores ``scale * q k^T``: ``q (..., Lq, d)``, ``k (..., Lk, d)`` → ``(..., Lq, Lk)``."""
    _check_qk(q, k)
    return torch.matmul(q, k.transpose(-2, -1)) * scale


def additive_score(q: torch.Tensor, k: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor,
                   w_v: torch.Tensor) -> torch.Tensor:
    """Additive (Bahdanau) scores ``s_ij = w_v^T tanh(q_i W_q + k_j W_k)`` → ``(..., Lq, Lk)``.

    ``q (..., Lq, d_q)``, ``k (..., Lk, d_k)``, ``W_q (d_q, d_h)``, ``W_k (d_k, d_h)``, ``w_v (d_h,)``.
    Builds the ``(..., Lq, Lk, d_h)`` tensor of hidden activations (its memory cost is the point).
    """
    _check_qk(q, k, same_d=False)
    _check_matrix("W_q", W_q, (q.shape[-1], None))
    _check_matrix("W_k", W_k, (k.shape[-1], W_q.shape[1]))
    _check_matrix("w_v", w_v, (W_q.shape[1],))
    hidden = torch.tanh((q @ W_q).unsqueeze(-2) + (k @ W_k).unsqueeze(-3))    # (..., Lq, Lk, d_h)
    return hidden @ w_v


def bilinear_score(q: torch.Tensor, k: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Bilinear ("general", Luong) scores ``q W k^T``: ``W (d_q, d_k)`` → ``(..., Lq, Lk)``."""
    _check_qk(q, k, same_d=False)
    _check_matrix("W", W, (q.shape[-1], k.shape[-1]))
    return torch.matmul(q @ W, k.transpose(-2, -1))


def cosine_score(q: torch.Tensor, k: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Cosine scores ``cos(q_i, k_j) / tau`` in ``[-1/tau, 1/tau]`` → ``(..., Lq, Lk)``; norms are dropped."""
    _check_qk(q, k)
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    return torch.matmul(F.normalize(q, dim=-1), F.normalize(k, dim=-1).transpose(-2, -1)) / tau


def soft_lookup(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, tau: float = 1.0, *,
                return_weights: bool = False):
    """Attention as a soft dictionary lookup: ``softmax(q K^T / tau) V``.

    ``q (d,)`` or ``(..., n_q, d)``, keys ``K (n, d)``, values ``V (n, d_v)`` → ``(d_v,)`` or
    ``(..., n_q, d_v)``. As ``tau → 0`` it returns the value of the best-matching key (hard
    lookup); as ``tau → inf`` the mean of the values. ``return_weights`` adds the ``(..., n)`` weights.
    """
    check_tensor("q", q, min_rank=1, floating=True)
    check_tensor("V", V, rank=2, floating=True)
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    check_tensor("K", K, rank=2, floating=True)
    if V.shape[0] != K.shape[0]:
        raise ValueError(f"K and V must have one row per key, got K {tuple(K.shape)} and V {tuple(V.shape)}")
    single = q.dim() == 1
    scores = dot_score(q.unsqueeze(0) if single else q, K) / tau
    weights = softmax_safe(scores)
    out = weights @ V
    if single:
        out, weights = out[0], weights[0]
    return (out, weights) if return_weights else out


def shared_qk_scores(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Scores with one projection for queries and keys: ``(x W)(x W)^T`` ``(..., L, L)``.

    ``x (..., L, d)``, ``W (d, d_k)``. The result is symmetric positive semi-definite: ``i → j``
    scores exactly like ``j → i``, which is why attention uses separate ``W^Q`` and ``W^K``.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    _check_matrix("W", W, (x.shape[-1], None))
    h = x @ W
    return torch.matmul(h, h.transpose(-2, -1))


def head_via_kron(X: torch.Tensor, A: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """One attention head's output ``A X W_V W_O`` written as a single linear map ``A ⊗ (W_V W_O)^T``.

    With row-major flattening, ``vec(A X B) = (A ⊗ B^T) vec(X)``: the QK circuit (``A``, mixing
    positions) and the OV circuit (``B = W_V W_O``, mixing features) act on separate factors.
    ``X (L, d)``, ``A (L, L)``, ``W_V (d, d_h)``, ``W_O (d_h, d_out)`` → ``(L, d_out)``. Builds the
    ``(L d_out, L d)`` Kronecker matrix, so it is for small demos.
    """
    check_tensor("X", X, rank=2, floating=True)
    length, d = X.shape
    _check_matrix("A", A, (length, length))
    _check_matrix("W_V", W_V, (d, None))
    _check_matrix("W_O", W_O, (W_V.shape[1], None))
    ov_t = W_O.T @ W_V.T                        # (W_V W_O)^T, (d_out, d); kron needs contiguous factors
    return (torch.kron(A, ov_t) @ X.reshape(-1)).reshape(length, ov_t.shape[0])


def normalized_relu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6, *,
                              scale: float | None = None, return_weights: bool = False):
    """Softmax replaced by normalised ReLU: ``a_ij = relu(s_ij) / (sum_j relu(s_ij) + eps)``.

    ``s = scale * q k^T`` (default ``1/sqrt(d_k)``). Rows sum to 1 unless every score is ``<= 0``:
    such a row gets all-zero weights, and with ``eps = 0`` it is ``0/0 = nan``. Shapes as in
    `scaled_dot_product_attention`; halves are computed in fp32.
    """
    check_qkv(q, k, v)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    scale = resolve_scale(scale, q.shape[-1])
    in_dtype = q.dtype
    q, k, v = (t.to(_compute_dtype(in_dtype)) for t in (q, k, v))
    r = torch.relu(torch.matmul(q, k.transpose(-2, -1)) * scale)
    weights = r / (r.sum(dim=-1, keepdim=True) + eps)
    out = (weights @ v).to(in_dtype)
    return (out, weights.to(in_dtype)) if return_weights else out


# ----------------------------------------------------------------------------- log-sum-exp merging
def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                       causal: bool = False, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention plus each query's log-sum-exp of scores: ``(out (..., Lq, d_v), lse (..., Lq))``.

    ``lse_i = log sum_{j allowed} exp(scale * q_i . k_j)``, the log of the softmax denominator;
    ``-inf`` for a row with no allowed key (whose output is zero). ``mask``, ``causal`` and ``scale``
    as in `scaled_dot_product_attention`. Halves: computed in fp32, ``out`` returned in the input
    dtype and ``lse`` in fp32. `merge_partials` combines results over disjoint key sets.
    """
    check_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    mask = _combined_mask(q, k, mask, causal)
    in_dtype = q.dtype
    q, k, v = (t.to(_compute_dtype(in_dtype)) for t in (q, k, v))
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.detach().amax(dim=-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)                     # rows with no key
    e = torch.exp(scores - m)
    total = e.sum(dim=-1, keepdim=True)
    has_key = total > 0
    total = torch.where(has_key, total, torch.ones_like(total))
    out = torch.matmul(e / total, v)
    lse = torch.where(has_key, m + torch.log(total), float("-inf")).squeeze(-1)
    return out.to(in_dtype), lse


def merge_partials(outs, lses) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention results over disjoint key sets into the attention over their union.

    With ``lse = log sum_c exp(lse_c)``: ``out = sum_c exp(lse_c - lse) * out_c``. ``outs`` is a
    sequence of ``(..., Lq, d_v)`` tensors and ``lses`` the matching ``(..., Lq)`` from
    `attention_with_lse` (or `tiled_attention(..., return_lse=True)`). Returns ``(out, lse)`` in
    the same convention, so merges nest; a row with no key in any part gives zeros and ``-inf``.
    """
    outs, lses = list(outs), list(lses)
    if not outs or len(outs) != len(lses):
        raise ValueError(f"outs and lses must be non-empty and of equal length, got {len(outs)} and {len(lses)}")
    for i, (o, l) in enumerate(zip(outs, lses)):
        check_tensor(f"outs[{i}]", o, min_rank=2, floating=True)
        check_tensor(f"lses[{i}]", l, min_rank=1, floating=True)
        if o.shape != outs[0].shape or l.shape != o.shape[:-1]:
            raise ValueError(f"outs[{i}] {tuple(o.shape)} and lses[{i}] {tuple(l.shape)} must match "
                             f"outs[0] {tuple(outs[0].shape)} and its shape without the last dim")
    out_dtype = outs[0].dtype
    work = _compute_dtype(out_dtype)
    lse_c = torch.stack([l.to(work) for l in lses])                   # (C, ..., Lq)
    out_c = torch.stack([o.to(work) for o in outs])                   # (C, ..., Lq, d_v)
    m = lse_c.detach().amax(dim=0)
    m = m.masked_fill(m == float("-inf"), 0.0)
    w = torch.exp(lse_c - m)                                           # 0 for parts with no key
    total = w.sum(dim=0)
    has_key = total > 0
    total = torch.where(has_key, total, torch.ones_like(total))
    out = (w.unsqueeze(-1) * out_c).sum(dim=0) / total.unsqueeze(-1)
    lse = torch.where(has_key, m + torch.log(total), float("-inf"))
    return out.to(out_dtype), lse


# ----------------------------------------------------------------------------- tiled attention
def _key_blocks(i0: int, i1: int, lk: int, offset: int, block_k: int, causal: bool, device):
    """Key blocks ``(j0, j1, allowed)`` that query rows ``i0 .. i1-1`` can see.

    Non-causal: every block, ``allowed = None``. Causal (query ``i`` at absolute position
    ``i + offset``): blocks entirely in the future of the whole query block are skipped, blocks
    entirely in the past get ``allowed = None``, and the diagonal blocks a boolean ``(i1-i0, j1-j0)`` mask.
    """
    first, last = i0 + offset, i1 - 1 + offset                          # positions of the first/last query
    stop = min(lk, last + 1) if causal else lk
    for j0 in range(0, max(stop, 0), block_k):
        j1 = min(j0 + block_k, lk)
        if not causal or j1 - 1 <= first:
            yield j0, j1, None
        else:
            pos = torch.arange(first, last + 1, device=device).unsqueeze(-1)
            yield j0, j1, torch.arange(j0, j1, device=device) <= pos


def _tiled_forward(q, k, v, scale, causal, block_q, block_k):
    """Online-softmax forward pass; returns ``out (..., Lq, d_v)`` and ``lse (..., Lq)`` in q's dtype."""
    lq, lk = q.shape[-2], k.shape[-2]
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    lse = q.new_empty(q.shape[:-1])
    for i0 in range(0, lq, block_q):
        i1 = min(i0 + block_q, lq)
        q_blk = q[..., i0:i1, :]
        m = q.new_full(q_blk.shape[:-1], float("-inf"))                 # running row max
        l = q.new_zeros(q_blk.shape[:-1])                               # running denominator (at max m)
        acc = q.new_zeros(q_blk.shape[:-1] + (v.shape[-1],))            # running numerator (at max m)
        for j0, j1, allowed in _key_blocks(i0, i1, lk, lk - lq, block_k, causal, q.device):
            s = torch.matmul(q_blk, k[..., j0:j1, :].transpose(-2, -1)) * scale
            if allowed is not None:
                s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            shift = m_new.masked_fill(m_new == float("-inf"), 0.0)     # rows with no key yet: any finite shift
            p = torch.exp(s - shift.unsqueeze(-1))
            alpha = torch.exp(m - shift)                                # rescales the old sums to the new max
            l = alpha * l + p.sum(dim=-1)
            acc = alpha.unsqueeze(-1) * acc + torch.matmul(p, v[..., j0:j1, :])
            m = m_new
        has_key = l > 0
        l = torch.where(has_key, l, torch.ones_like(l))
        out[..., i0:i1, :] = acc / l.unsqueeze(-1)
        lse[..., i0:i1] = torch.where(has_key, m + torch.log(l), float("-inf"))
    return out, lse


def _tiled_backward(q, k, v, out, lse, d_out, d_lse, scale, causal, block_q, block_k):
    """FlashAttention's backward: recompute each block of P from the saved ``lse``, never all of it.

    With ``P = exp(S - lse)``, ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - D)`` where
    ``D_i = sum_c dO_ic O_ic`` (minus ``dlse_i`` when lse itself has a gradient),
    ``dQ = scale * dS K`` and ``dK = scale * dS^T Q``.
    """
    lq, lk = q.shape[-2], k.shape[-2]
    delta = (d_out * out).sum(dim=-1)
    if d_lse is not None:
        delta = delta - d_lse
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))          # rows with no key: P = 0
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i0 in range(0, lq, block_q):
        i1 = min(i0 + block_q, lq)
        q_blk, do_blk = q[..., i0:i1, :], d_out[..., i0:i1, :]
        lse_blk, delta_blk = lse[..., i0:i1].unsqueeze(-1), delta[..., i0:i1].unsqueeze(-1)
        for j0, j1, allowed in _key_blocks(i0, i1, lk, lk - lq, block_k, causal, q.device):
            k_blk, v_blk = k[..., j0:j1, :], v[..., j0:j1, :]
            s = torch.matmul(q_blk, k_blk.transpose(-2, -1)) * scale
            if allowed is not None:
                s = s.masked_fill(~allowed, float("-inf"))
            p = torch.exp(s - lse_blk)
            dv[..., j0:j1, :] += torch.matmul(p.transpose(-2, -1), do_blk)
            ds = p * (torch.matmul(do_blk, v_blk.transpose(-2, -1)) - delta_blk)
            dq[..., i0:i1, :] += torch.matmul(ds, k_blk) * scale
            dk[..., j0:j1, :] += torch.matmul(ds.transpose(-2, -1), q_blk) * scale
    return dq, dk, dv


class _TiledAttention(torch.autograd.Function):
    """Tiled attention with an O(L)-memory backward: saves only q, k, v, out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, block_q, block_k):
        work = _compute_dtype(q.dtype)
        out, lse = _tiled_forward(q.to(work), k.to(work), v.to(work), scale, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (scale, causal, block_q, block_k)
        ctx.set_materialize_grads(False)
        return out.to(q.dtype), lse

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        work = out.dtype
        d_out = torch.zeros_like(out) if d_out is None else d_out.to(work)
        d_lse = None if d_lse is None else d_lse.to(work)
        dq, dk, dv = _tiled_backward(q.to(work), k.to(work), v.to(work), out, lse, d_out, d_lse, *ctx.config)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None, block_q: int = 64, block_k: int = 64, return_lse: bool = False):
    """Exact attention computed block by block with an online softmax (the FlashAttention algorithm).

    Same result as `scaled_dot_product_attention` (``q (..., Lq, d_k)``, ``k (..., Lk, d_k)``,
    ``v (..., Lk, d_v)`` → ``(..., Lq, d_v)``), but the ``Lq x Lk`` score matrix never exists: each
    ``block_q`` rows of queries sweep the keys ``block_k`` at a time, keeping per row a running max
    ``m``, a denominator ``l`` and an output accumulator, rescaled by ``exp(m_old - m_new)`` whenever
    the max grows. The largest temporary is ``block_q x block_k``.

    ``causal`` is bottom-right aligned (query ``i`` at position ``Lk - Lq + i``); key blocks wholly
    in a query block's future are skipped. If ``Lq > Lk`` the first ``Lq - Lk`` queries see no key
    and return zeros. Block sizes need not divide the lengths (the last block is ragged).
    fp16/bf16 are computed in fp32 and returned in their dtype. The backward pass recomputes score
    blocks from the saved log-sum-exp, so training memory is also O(L). ``return_lse=True`` also
    returns ``lse (..., Lq)`` (fp32 for halves), as `attention_with_lse` does.
    """
    check_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    block_q = check_block_size("block_q", block_q)
    block_k = check_block_size("block_k", block_k)
    out, lse = _TiledAttention.apply(q, k, v, scale, bool(causal), block_q, block_k)
    return (out, lse) if return_lse else out
