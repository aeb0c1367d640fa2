"""Attention: scaled dot-product attention, mask builders, multi-head attention (MHA/GQA/MQA).

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

from .utils import check_positive_int, check_same_dtype, check_tensor

__all__ = [
    "causal_mask",
    "padding_mask",
    "document_mask",
    "scaled_dot_product_attention",
    "attention_reference",
    "repeat_kv",
    "KVCache",
    "CrossKVCache",
    "MultiHeadAttention",
]


# ----------------------------------------------------------------------------- masks
def causal_mask(q_len: int, k_len: int | None = None, *, window: int | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``(q_len, k_len)`` causal mask, bottom-right aligned (True = may attend).

    Query ``i`` sits at absolute position ``i' = i + k_len - q_len`` and may attend key ``j`` iff
    ``j <= i'`` and, when ``window`` is given, ``i' - j <= window`` (the sliding-window band).
    """
    q_len = check_positive_int("q_len", q_len)
    k_len = q_len if k_len is None else check_positive_int("k_len", k_len)
    if k_len < q_len:
        raise ValueError(f"causal_mask needs k_len >= q_len (queries are the last q_len positions), "
                         f"got q_len={q_len}, k_len={k_len}")
    i = torch.arange(q_len, device=device).unsqueeze(-1) + (k_len - q_len)
    j = torch.arange(k_len, device=device)
    allowed = j <= i
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be a non-negative int, got {window!r}")
        allowed &= (i - j) <= window
    return allowed


def padding_mask(lengths, max_len: int | None = None, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Key-padding mask ``(B, 1, 1, max_len)``: True at the first ``lengths[b]`` positions of row ``b``.

    Broadcasts against scores ``(B, H, Lq, Lk)``; combine with a causal mask using ``&``.
    """
    lengths = torch.as_tensor(lengths, device=device)
    if lengths.dim() != 1 or lengths.dtype.is_floating_point:
        raise ValueError(f"lengths must be a 1-D integer sequence, got shape {tuple(lengths.shape)} "
                         f"and dtype {lengths.dtype}")
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
def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, min_rank=2, floating=True)
    check_same_dtype(q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size d_k (dim -1), got q {tuple(q.shape)} and "
                         f"k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the key length (dim -2), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q, k, v must share their leading dims, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")


def _combined_mask(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor | None:
    """Validate ``mask`` and fold the causal mask into it; None when nothing is masked."""
    lq, lk = q.shape[-2], k.shape[-2]
    if mask is not None:
        check_tensor("mask", mask)
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}; "
                            f"pass additive float biases as bias=")
        try:
            torch.broadcast_shapes(mask.shape, q.shape[:-2] + (lq, lk))
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to scores "
                             f"{tuple(q.shape[:-2]) + (lq, lk)}") from None
    if causal:
        cmask = causal_mask(lq, lk, device=q.device)
        mask = cmask if mask is None else mask & cmask
    return mask


def _check_bias(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> None:
    if bias is None:
        return
    check_tensor("bias", bias, floating=True)
    scores_shape = q.shape[:-2] + (q.shape[-2], k.shape[-2])
    try:
        torch.broadcast_shapes(bias.shape, scores_shape)
    except RuntimeError:
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to scores {tuple(scores_shape)}") from None


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                        bias: torch.Tensor | None = None, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula, step by step: ``softmax(q k^T * scale + bias, masked) v``. Returns ``(out, weights)``.

    Inputs must already be validated; fully masked rows get zero weights. Computes in the
    input dtype (callers upcast half precision).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale          # (..., Lq, Lk)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        row_has_key = mask.any(dim=-1, keepdim=True)                # (..., Lq, 1)
        scores = scores.masked_fill(~mask, float("-inf"))
        scores = scores.masked_fill(~row_has_key, 0.0)             # keep softmax finite on empty rows
        weights = torch.softmax(scores, dim=-1) * row_has_key       # ... and then zero them
    else:
        weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v), weights


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                                 *, bias: torch.Tensor | None = None, causal: bool = False,
                                 scale: float | None = None, return_weights: bool = False):
    """Scaled dot-product attention ``softmax(q k^T / sqrt(d_k) + bias) v`` with boolean masks.

    Shapes: ``q (..., Lq, d_k)``, ``k (..., Lk, d_k)``, ``v (..., Lk, d_v)`` → ``out (..., Lq, d_v)``;
    with ``return_weights=True`` also ``weights (..., Lq, Lk)``.
    ``mask`` is boolean (True = may attend) and ``causal`` is bottom-right aligned.
    ``scale`` defaults to ``1/sqrt(d_k)``. fp16/bf16 inputs are computed in fp32 and returned in
    their own dtype. Rows with no allowed key return zeros.

    Without ``return_weights`` the result comes from PyTorch's fused kernel
    (``torch.nn.functional.scaled_dot_product_attention``) with the conventions above enforced
    around it; with it, from `attention_reference`, the explicit formula. Tests check the two agree.
    """
    _check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    _check_bias(bias, q, k)
    if bias is not None and bias.dtype != q.dtype and not (q.dtype in (torch.float16, torch.bfloat16)):
        bias = bias.to(q.dtype)
    mask = _combined_mask(q, k, mask, causal)
    in_dtype = q.dtype
    half = in_dtype in (torch.float16, torch.bfloat16)

    if return_weights:
        if half:
            q, k, v = q.float(), k.float(), v.float()
        out, weights = attention_reference(q, k, v, mask, bias=None if bias is None else bias.to(q.dtype), scale=scale)
        return out.to(in_dtype), weights.to(in_dtype)

    # Fused path. Rows with no allowed key are opened up (so the kernel never sees an empty row)
    # and their output is zeroed afterwards; this keeps outputs and gradients finite.
    empty_rows = None
    if mask is not None:
        row_has_key = mask.any(dim=-1, keepdim=True)
        if not bool(row_has_key.all()):
            empty_rows = ~row_has_key
            mask = mask | empty_rows
    attn_mask = mask
    if bias is not None:
        bias = bias.to(in_dtype)
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    is_causal = causal and attn_mask is None and q.shape[-2] == k.shape[-2]
    if is_causal:
        attn_mask = None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    return out


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
    """Holds the projected keys/values of a fixed memory (the encoder output) for cross-attention."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None


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
                return_weights: bool = False):
        check_tensor("x", x, rank=3, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have d_model={self.d_model} features, got shape {tuple(x.shape)}")
        if kv is not None:
            check_tensor("kv", kv, rank=3, floating=True)
            if kv.shape[0] != x.shape[0] or kv.shape[-1] != self.d_model:
                raise ValueError(f"kv must be (B={x.shape[0]}, Lk, {self.d_model}), got {tuple(kv.shape)}")
        start = cache.length if isinstance(cache, KVCache) else 0
        q = self._rope(self._split(self.q_proj(x), self.n_heads), start)

        if isinstance(cache, CrossKVCache):
            if kv is None:
                raise ValueError("a CrossKVCache needs kv= (the memory) on the first call")
            if cache.k is None:
                cache.k = self._split(self.k_proj(kv), self.n_kv_heads)
                cache.v = self._split(self.v_proj(kv), self.n_kv_heads)
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
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        want_weights = return_weights or self.keep_weights
        result = scaled_dot_product_attention(q, k, v, mask, causal=causal, return_weights=want_weights)
        out, weights = result if want_weights else (result, None)
        if self.keep_weights:
            self.last_weights = weights.detach()
        b, _, lq, _ = out.shape
        out = self.out_proj(out.transpose(1, 2).reshape(b, lq, self.n_heads * self.d_head))
        return (out, weights) if return_weights else out
