"""The Transformer: feed-forward blocks, norms, encoder/decoder layers, models, KV-cached decoding.

Layout: token ids ``(B, L)``; activations ``(B, L, d)``. Masks follow `xfam_lib.attention`
(True = may attend). Every model that decodes step by step implements ``make_cache`` and takes
``cache=`` in its decoding call, and cached decoding is tested equal to recomputation.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import CrossKVCache, KVCache, MultiHeadAttention, causal_mask
from .positional import (AlibiBias, RotaryEmbedding, ShawRelativeAttention, T5RelativeBias, XLRelativeAttention,
                         sinusoidal_encoding)
from .utils import (check_bool, check_instance, check_int, check_positive_int, check_real, check_tensor,
                    check_token_ids)

__all__ = [
    "FeedForward", "layer_norm", "batch_norm", "RMSNorm", "SwiGLU", "ffn_hidden_size",
    "EncoderLayer", "DecoderLayer", "Encoder", "Decoder", "EncoderDecoder", "TransformerLM",
    "embed_onehot", "shift_right", "teacher_forcing_loss", "generate", "greedy_decode",
    "beam_search", "count_params", "EncoderStackLM", "sequence_log_prob", "attention_weights",
]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


# ----------------------------------------------------------------------------- building blocks
class FeedForward(nn.Module):
    """Position-wise FFN ``act(x W1 + b1) W2 + b2``, applied to every position separately: ``(..., d) -> (..., d)``."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", *, bias: bool = True):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        d_model, d_ff = check_positive_int("d_model", d_model), check_positive_int("d_ff", d_ff)
        self.linear1 = nn.Linear(d_model, d_ff, bias=check_bool("bias", bias))
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features("x", x, self.linear1.in_features)
        return self.linear2(_ACTIVATIONS[self.activation](self.linear1(x)))


def _check_features(name: str, x, d: int) -> None:
    """``x`` is a floating tensor ``(..., d)``."""
    check_tensor(name, x, min_rank=1, floating=True)
    if x.shape[-1] != d:
        raise ValueError(f"{name} must end in the feature size d={d}, got shape {tuple(x.shape)}")


def _check_norm_args(x, weight, bias, eps) -> None:
    """A real floating ``x (..., d)``, optional ``weight``/``bias`` ``(d,)`` and ``eps >= 0``."""
    check_tensor("x", x, min_rank=1, floating=True)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            _check_features(name, t, x.shape[-1])
            if t.dim() != 1:
                raise ValueError(f"{name} must be (d,) = ({x.shape[-1]},), got shape {tuple(t.shape)}")
    check_real("eps", eps, low=0.0)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm: statistics over the last dim (features) of each position, independent of the batch.

    ``x (..., d)`` real floating; ``weight``, ``bias`` ``(d,)`` or None; ``eps >= 0``."""
    _check_norm_args(x, weight, bias, eps)
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def batch_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """BatchNorm in training mode: statistics per feature over every other axis (e.g. B and T of ``(B, T, d)``).

    Arguments as `layer_norm`."""
    _check_norm_args(x, weight, bias, eps)
    dims = tuple(range(x.dim() - 1))
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


class RMSNorm(nn.Module):
    """RMSNorm: ``x / sqrt(mean(x^2) + eps) * weight`` over the last dim (no centring, no bias)."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = check_real("eps", eps, low=0.0)
        self.weight = nn.Parameter(torch.ones(check_positive_int("d", d)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features("x", x, self.weight.shape[0])
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x   # half types: statistics in fp32
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    """Gated FFN ``(silu(x W1) * (x W3)) W2`` of Llama-style models (no biases)."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        d_model, hidden = check_positive_int("d_model", d_model), check_positive_int("hidden", hidden)
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features("x", x, self.w1.in_features)
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def ffn_hidden_size(dim: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """Llama's SwiGLU width: ``4*dim*2/3``, times the multiplier, rounded up to ``multiple_of``.

    ``dim`` and ``multiple_of`` are positive ints, ``ffn_dim_multiplier`` None or a positive number."""
    dim, multiple_of = check_positive_int("dim", dim), check_positive_int("multiple_of", multiple_of)
    if ffn_dim_multiplier is not None:
        check_real("ffn_dim_multiplier", ffn_dim_multiplier, low=0.0, low_open=True)
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


# ----------------------------------------------------------------------------- layers
class EncoderLayer(nn.Module):
    """Self-attention then FFN, each wrapped in a residual connection and a LayerNorm.

    ``norm_first=False`` (Post-LN, the original): ``x = LN(x + Sublayer(x))``.
    ``norm_first=True`` (Pre-LN): ``x = x + Sublayer(LN(x))``. ``(B, L, d) -> (B, L, d)``.
    ``dropout`` acts on each sublayer's output before it is added to the residual stream;
    ``causal=True`` in ``forward`` lets each token attend only to itself and earlier tokens.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = False,
                 activation: str = "relu", eps: float = 1e-5, dropout: float = 0.0):
        super().__init__()
        check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        self.norm_first = check_bool("norm_first", norm_first)
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=check_real("eps", eps, low=0.0))
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        check_bool("causal", causal)
        if self.norm_first:
            x = x + self.drop(self.self_attn(self.norm1(x), mask=mask, causal=causal))
            return x + self.drop(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop(self.self_attn(x, mask=mask, causal=causal)))
        return self.norm2(x + self.drop(self.ff(x)))


class DecoderLayer(nn.Module):
    """Masked (causal) self-attention → cross-attention over the encoder memory → FFN.

    Each sub-layer has a residual connection and a LayerNorm, placed as in `EncoderLayer`.
    ``forward(x (B, T, d), memory (B, S, d), memory_mask=None, self_mask=None, cache=None)``;
    ``cache`` is a ``(KVCache, CrossKVCache)`` pair from `Decoder.make_cache`.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = False,
                 activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        self.norm_first = check_bool("norm_first", norm_first)
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=check_real("eps", eps, low=0.0))
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.norm3 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                self_mask: torch.Tensor | None = None,
                cache: tuple[KVCache, CrossKVCache] | None = None) -> torch.Tensor:
        _check_memory(x, memory)
        self_cache, cross_cache = cache if cache is not None else (None, None)

        def self_block(h):
            return self.self_attn(h, mask=self_mask, causal=True, cache=self_cache)

        def cross_block(h):
            return self.cross_attn(h, kv=memory, mask=memory_mask, cache=cross_cache)

        if self.norm_first:
            x = x + self_block(self.norm1(x))
            x = x + cross_block(self.norm2(x))
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + self_block(x))
        x = self.norm2(x + cross_block(x))
        return self.norm3(x + self.ff(x))


def _check_memory(x, memory) -> None:
    """``memory (B, S, d)``: the encoder's output for the decoder states ``x (B, T, d)``."""
    check_tensor("x", x, rank=3, floating=True)
    check_tensor("memory", memory, rank=3, floating=True)
    if memory.shape[0] != x.shape[0] or memory.shape[-1] != x.shape[-1]:
        raise ValueError(f"memory must be (B={x.shape[0]}, S, d={x.shape[-1]}) for x {tuple(x.shape)}, "
                         f"got {tuple(memory.shape)}")


def _check_cache(cache, n_layers: int) -> None:
    """``cache`` is None or a list with one entry per layer (from ``make_cache``)."""
    if cache is not None:
        check_instance("cache", cache, (list, tuple))
        if len(cache) != n_layers:
            raise ValueError(f"cache must hold one entry per layer ({n_layers}; use make_cache), got {len(cache)}")


class Encoder(nn.Module):
    """A stack of `EncoderLayer` on embedded inputs, with an optional final LayerNorm (needed for Pre-LN)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_layers: int, *, norm_first: bool = False,
                 final_norm: bool | None = None, activation: str = "relu"):
        super().__init__()
        check_positive_int("n_layers", n_layers)
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, norm_first=norm_first, activation=activation)
                                    for _ in range(n_layers))
        final_norm = norm_first if final_norm is None else check_bool("final_norm", final_norm)
        self.norm = nn.LayerNorm(d_model) if final_norm else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of `DecoderLayer` on embedded targets, with an optional final LayerNorm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_layers: int, *, norm_first: bool = False,
                 final_norm: bool | None = None, activation: str = "relu"):
        super().__init__()
        check_positive_int("n_layers", n_layers)
        self.layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, norm_first=norm_first, activation=activation)
                                    for _ in range(n_layers))
        final_norm = norm_first if final_norm is None else check_bool("final_norm", final_norm)
        self.norm = nn.LayerNorm(d_model) if final_norm else nn.Identity()

    def make_cache(self, batch: int, max_len: int) -> list[tuple[KVCache, CrossKVCache]]:
        """One (self-attention KVCache, cross-attention CrossKVCache) pair per layer."""
        return [(layer.self_attn.make_cache(batch, max_len), CrossKVCache()) for layer in self.layers]

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                self_mask: torch.Tensor | None = None, cache: list | None = None) -> torch.Tensor:
        _check_cache(cache, len(self.layers))
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, memory_mask, self_mask, None if cache is None else cache[i])
        return self.norm(x)


# ----------------------------------------------------------------------------- models
class EncoderDecoder(nn.Module):
    """The original Transformer for sequence-to-sequence tasks.

    Token embeddings (scaled by ``sqrt(d)``) plus sinusoidal positions, an `Encoder`, a `Decoder`
    and a linear head to ``vocab`` logits. ``forward(src (B, S), tgt_in (B, T)) -> (B, T, vocab)``.
    Source positions equal to ``pad_id`` are masked out of attention.
    ``tie_weights=True`` makes the source embedding, the target embedding and the head's weight one
    ``(vocab, d)`` Parameter, as in the original model (a shared vocabulary), initialised N(0, 1/d) so
    that the ``sqrt(d)``-scaled embeddings and the logits both start at unit scale.
    """

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_enc: int, n_dec: int, d_ff: int, *,
                 norm_first: bool = False, pad_id: int | None = 0, max_len: int = 512, tie_weights: bool = False):
        super().__init__()
        check_positive_int("vocab", vocab)
        check_positive_int("max_len", max_len)
        if pad_id is not None:
            pad_id = check_int("pad_id", pad_id, low=0, high=vocab - 1)
        check_bool("norm_first", norm_first)
        check_bool("tie_weights", tie_weights)
        self.vocab, self.d_model, self.pad_id = vocab, check_positive_int("d_model", d_model), pad_id
        self.src_embed = nn.Embedding(vocab, d_model)
        self.tgt_embed = nn.Embedding(vocab, d_model)
        self.register_buffer("pos", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_enc, norm_first=norm_first)
        self.decoder = Decoder(d_model, n_heads, d_ff, n_dec, norm_first=norm_first)
        self.head = nn.Linear(d_model, vocab)
        if tie_weights:
            nn.init.normal_(self.src_embed.weight, std=d_model ** -0.5)
            self.tgt_embed.weight = self.head.weight = self.src_embed.weight

    def _embed(self, table: nn.Embedding, ids: torch.Tensor, start: int = 0, *, name: str = "ids",
               check_ids: bool = True) -> torch.Tensor:
        if check_ids:                       # decoding loops check their first input once, not every token
            check_token_ids(name, ids, self.vocab, rank=2)
        if start + ids.shape[1] > self.pos.shape[0]:
            raise ValueError(f"{name} reaches position {start + ids.shape[1]}, beyond the model's "
                             f"max_len={self.pos.shape[0]}")
        return table(ids) * math.sqrt(self.d_model) + self.pos[start:start + ids.shape[1]]

    def source_mask(self, src: torch.Tensor) -> torch.Tensor | None:
        """``(B, 1, 1, S)`` key mask hiding padding, or None without a ``pad_id``."""
        return None if self.pad_id is None else (src != self.pad_id)[:, None, None, :]

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """Source ids ``(B, S)`` → memory ``(B, S, d)``: one contextual vector per source token."""
        return self.encoder(self._embed(self.src_embed, src, name="src"), self.source_mask(src))

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        """Target ids ``(B, T)`` → logits ``(B, T, vocab)``. With ``cache``, ``tgt_in`` holds only the new tokens."""
        check_tensor("src", src, rank=2)
        check_tensor("memory", memory, rank=3, floating=True)
        if src.shape != memory.shape[:2]:
            raise ValueError(f"memory (B, S, d) must be encode(src): src {tuple(src.shape)}, "
                             f"memory {tuple(memory.shape)}")
        return self._decode(tgt_in, memory, src, cache)

    def _decode(self, tgt_in, memory, src, cache, *, check_ids: bool = True) -> torch.Tensor:
        _check_cache(cache, len(self.decoder.layers))
        start = cache[0][0].length if cache is not None else 0
        h = self._embed(self.tgt_embed, tgt_in, start, name="tgt_in", check_ids=check_ids)
        return self.head(self.decoder(h, memory, self.source_mask(src), cache=cache))

    def make_cache(self, batch: int, max_len: int) -> list:
        return self.decoder.make_cache(batch, max_len)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        check_tensor("src", src, rank=2)
        check_tensor("tgt_in", tgt_in, rank=2)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"src (B, S) and tgt_in (B, T) must share the batch, got {tuple(src.shape)} and "
                             f"{tuple(tgt_in.shape)}")
        return self.decode(tgt_in, self.encode(src), src)


class _LMBlock(nn.Module):
    """Pre-norm decoder-only block: ``x + Attn(RMSNorm(x))`` then ``x + SwiGLU(RMSNorm(x))``."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, rope: nn.Module | None,
                 attn: nn.Module | None = None):
        super().__init__()
        self.attn_norm = RMSNorm(d_model)
        self.attn = attn if attn is not None else MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=False, rope=rope)
        self.ff_norm = RMSNorm(d_model)
        self.ff = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), causal=True, cache=cache, bias=bias)
        return x + self.ff(self.ff_norm(x))


class TransformerLM(nn.Module):
    """A Llama-style decoder-only language model: pre-norm RMSNorm blocks, GQA, SwiGLU, causal attention.

    ``positional`` is ``"rope"`` (rotary, default), ``"sinusoidal"`` or ``"learned"`` (added to the
    embeddings), ``"none"``, ``"alibi"`` or ``"t5"`` (an additive attention bias shared by all layers;
    T5 buckets up to ``relative_max_distance``), ``"shaw"`` (clipped relative keys/values, clip
    ``relative_max_distance``) or ``"xl"`` (Transformer-XL relative scores).
    ``forward(ids (B, L), cache=None) -> logits (B, L, vocab)``; with a cache from `make_cache`,
    ``ids`` holds only the new tokens. ``tie_weights=True`` makes the embedding and the head's weight
    one ``(vocab, d)`` Parameter, initialised N(0, 1/d) so that the logits start at unit scale.
    """

    POSITIONAL = ("rope", "sinusoidal", "learned", "none", "alibi", "t5", "shaw", "xl")

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int | None = None, *,
                 d_ff: int | None = None, positional: str = "rope", max_len: int = 1024, rope_base: float = 10000.0,
                 relative_max_distance: int = 128, tie_weights: bool = False):
        super().__init__()
        if positional not in self.POSITIONAL:
            raise ValueError(f"positional must be one of {self.POSITIONAL}, got {positional!r}")
        self.vocab = check_positive_int("vocab", vocab)
        check_positive_int("n_layers", n_layers)
        check_positive_int("max_len", max_len)
        check_real("rope_base", rope_base, low=0.0, low_open=True)
        check_positive_int("relative_max_distance", relative_max_distance)
        check_bool("tie_weights", tie_weights)
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        d_ff = ffn_hidden_size(d_model, multiple_of=16) if d_ff is None else check_positive_int("d_ff", d_ff)
        self.positional, self.max_len = positional, max_len
        self.embed = nn.Embedding(vocab, d_model)
        if positional == "sinusoidal":
            self.register_buffer("pos", sinusoidal_encoding(max_len, d_model), persistent=False)
        elif positional == "learned":
            self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        elif positional == "alibi":
            self.pos_bias = AlibiBias(n_heads)
        elif positional == "t5":
            self.pos_bias = T5RelativeBias(n_heads, max_distance=relative_max_distance, bidirectional=False)

        def attn():
            if positional == "shaw":
                return ShawRelativeAttention(d_model, n_heads, relative_max_distance, n_kv_heads)
            return XLRelativeAttention(d_model, n_heads, n_kv_heads) if positional == "xl" else None

        rope = RotaryEmbedding(rope_base) if positional == "rope" else None
        self.blocks = nn.ModuleList(_LMBlock(d_model, n_heads, n_kv_heads, d_ff, rope, attn()) for _ in range(n_layers))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        if tie_weights:
            nn.init.normal_(self.embed.weight, std=d_model ** -0.5)
            self.head.weight = self.embed.weight

    def make_cache(self, batch: int, max_len: int) -> list[KVCache]:
        return [block.attn.make_cache(batch, max_len) for block in self.blocks]

    def forward(self, ids: torch.Tensor, cache: list[KVCache] | None = None, *,
                _ids_checked: bool = False) -> torch.Tensor:
        if _ids_checked:                    # `generate` checks its prompt once, not every token it feeds
            check_tensor("ids", ids, rank=2)
        else:
            check_token_ids("ids", ids, self.vocab, rank=2)
        _check_cache(cache, len(self.blocks))
        start = cache[0].length if cache is not None else 0
        x = self.embed(ids)
        if self.positional in ("sinusoidal", "learned"):
            if start + ids.shape[1] > self.max_len:
                raise ValueError(f"positions up to {start + ids.shape[1]} exceed max_len={self.max_len}")
            x = x + self.pos[start:start + ids.shape[1]]
        bias = None
        if self.positional == "alibi":
            bias = self.pos_bias(ids.shape[1], start + ids.shape[1], device=ids.device)
        elif self.positional == "t5":
            bias = self.pos_bias(ids.shape[1], start + ids.shape[1])
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache[i], bias=bias)
        return self.head(self.norm(x))


# ----------------------------------------------------------------------------- training helpers
def embed_onehot(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Embedding as a matrix product: ``one_hot(ids) @ weight`` (what ``nn.Embedding`` computes by lookup).

    ``ids (...)`` integer ids in ``[0, V)``, ``weight (V, d)`` → ``(..., d)``."""
    check_tensor("weight", weight, rank=2, floating=True)
    check_token_ids("ids", ids, weight.shape[0], vocab_name="weight.shape[0]")
    return F.one_hot(ids, weight.shape[0]).to(weight.dtype) @ weight


def shift_right(y: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Decoder input for teacher forcing: ``[bos, y_0, ..., y_{T-2}]`` for targets ``y (B, T)``."""
    check_token_ids("y", y, None, rank=2)
    bos = torch.full_like(y[:, :1], check_int("bos_id", bos_id, low=0))
    return torch.cat([bos, y[:, :-1]], dim=1)


def teacher_forcing_loss(model: EncoderDecoder, src: torch.Tensor, tgt: torch.Tensor, bos_id: int,
                         ignore_index: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of predicting every target position in one causal pass on gold prefixes.

    ``src (B, S)``, ``tgt (B, T)`` ids of ``model``'s vocabulary (``tgt`` is also the decoder's input,
    shifted); target positions equal to ``ignore_index`` (e.g. padding) are not scored."""
    check_instance("model", model, EncoderDecoder)
    ignore_index = -100 if ignore_index is None else check_int("ignore_index", ignore_index)
    check_token_ids("tgt", tgt, model.vocab, rank=2)
    check_int("bos_id", bos_id, low=0, high=model.vocab - 1)
    logits = model(src, shift_right(tgt, bos_id))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=ignore_index)


def _next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Greedy at ``temperature == 0``, else a draw from ``softmax(logits / temperature)`` (checked by the caller)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: TransformerLM, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
             use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Extend ``prompt (B, P)`` by ``max_new_tokens`` tokens: greedy at ``temperature=0``, else sampled.

    With ``use_cache`` the prompt is prefilled once and each step feeds one token; without it,
    every step recomputes the whole sequence. Both give the same tokens. Returns ``(B, P + new)``
    (``(0, P + new)`` for an empty batch). ``P >= 1``: the first new token needs a context.
    """
    check_instance("model", model, TransformerLM)
    check_token_ids("prompt", prompt, model.vocab, rank=2)        # once: generated ids are in range
    if prompt.shape[1] == 0:
        raise ValueError(f"prompt must hold at least one token per row, got shape {tuple(prompt.shape)}")
    check_positive_int("max_new_tokens", max_new_tokens)
    temperature = check_real("temperature", temperature, low=0.0)
    use_cache = check_bool("use_cache", use_cache)
    if prompt.shape[0] == 0:
        return prompt.new_empty(0, prompt.shape[1] + max_new_tokens)
    ids = prompt
    cache = model.make_cache(prompt.shape[0], prompt.shape[1] + max_new_tokens) if use_cache else None
    step_input = prompt
    for _ in range(max_new_tokens):
        logits = model(step_input, cache=cache, _ids_checked=True) if use_cache else model(ids, _ids_checked=True)
        nxt = _next_token(logits[:, -1], temperature, generator)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        step_input = nxt[:, None]
    return ids


def _check_seq2seq(model, src, bos_id: int, max_len: int) -> None:
    """The arguments every `EncoderDecoder` decoder shares."""
    check_instance("model", model, EncoderDecoder)
    check_token_ids("src", src, model.vocab, rank=2)
    check_int("bos_id", bos_id, low=0, high=model.vocab - 1)
    check_positive_int("max_len", max_len)


@torch.no_grad()
def sample_decode(model: EncoderDecoder, src: torch.Tensor, bos_id: int, max_len: int, *,
                  temperature: float = 1.0, use_cache: bool = True,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Decode an `EncoderDecoder` token by token, drawing each from ``softmax(logits / temperature)``.

    ``temperature=0`` takes the argmax (greedy decoding). ``src (B, S)`` → ``(B, max_len)`` tokens
    (BOS not included; ``(0, max_len)`` for an empty batch). With ``use_cache`` each step feeds one
    token through the decoder's KV cache; without it, every step recomputes the whole prefix. Both
    give the same tokens.
    """
    _check_seq2seq(model, src, bos_id, max_len)
    temperature = check_real("temperature", temperature, low=0.0)
    use_cache = check_bool("use_cache", use_cache)
    if src.shape[0] == 0:
        return src.new_empty(0, max_len)
    memory = model.encode(src)
    out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    cache = model.make_cache(src.shape[0], max_len) if use_cache else None
    for _ in range(max_len):
        step_in = out[:, -1:] if use_cache else out
        logits = model._decode(step_in, memory, src, cache, check_ids=False)
        out = torch.cat([out, _next_token(logits[:, -1], temperature, generator)[:, None]], dim=1)
    return out[:, 1:]


__all__ += ["sample_decode"]


def greedy_decode(model: EncoderDecoder, src: torch.Tensor, bos_id: int, max_len: int, *,
                  use_cache: bool = True) -> torch.Tensor:
    """Greedy decoding of an `EncoderDecoder`: ``src (B, S)`` → ``(B, max_len)`` tokens (BOS not included).

    `sample_decode` at temperature 0: every step takes the most likely token.
    """
    return sample_decode(model, src, bos_id, max_len, temperature=0.0, use_cache=use_cache)


@torch.no_grad()
def beam_search(model: EncoderDecoder, src: torch.Tensor, bos_id: int, max_len: int, beam_size: int = 4,
                eos_id: int | None = None) -> tuple[torch.Tensor, float]:
    """Beam search for one source ``src (1, S)``: the ``(max_len,)`` sequence of highest total log-probability.

    Keeps the ``beam_size`` best prefixes at every step (a finished beam, ending in ``eos_id``,
    keeps its score and is padded with ``eos_id``). Returns ``(tokens, log_prob)``.
    ``beam_size=1`` is greedy decoding.
    """
    _check_seq2seq(model, src, bos_id, max_len)
    if src.shape[0] != 1:
        raise ValueError(f"beam_search decodes one source at a time, got src of shape {tuple(src.shape)}")
    check_positive_int("beam_size", beam_size)
    if eos_id is not None:
        eos_id = check_int("eos_id", eos_id, low=0, high=model.vocab - 1)
    memory = model.encode(src)
    beams = torch.full((1, 1), bos_id, dtype=torch.long, device=src.device)
    scores = torch.zeros(1, device=src.device, dtype=torch.float64)
    for _ in range(max_len):
        n = beams.shape[0]
        logits = model._decode(beams, memory.expand(n, -1, -1), src.expand(n, -1), None, check_ids=False)[:, -1]
        logp = torch.log_softmax(logits.double(), dim=-1)                       # (n, V)
        if eos_id is not None:
            done = beams[:, -1] == eos_id
            frozen = torch.full_like(logp, float("-inf"))
            frozen[:, eos_id] = 0.0
            logp = torch.where(done[:, None], frozen, logp)
        total = (scores[:, None] + logp).flatten()
        top = total.topk(min(beam_size, total.numel()))
        vocab = logp.shape[-1]
        beams = torch.cat([beams[top.indices // vocab], (top.indices % vocab)[:, None]], dim=1)
        scores = top.values
    best = int(scores.argmax())
    return beams[best, 1:], float(scores[best])


def count_params(module: nn.Module, by: str | None = None) -> int | dict[str, int]:
    """Number of parameters; ``by="submodule"`` gives a dict per direct child."""
    check_instance("module", module, nn.Module)
    if by is None:
        return sum(p.numel() for p in module.parameters())
    if by != "submodule":
        raise ValueError(f"by must be None or 'submodule', got {by!r}")
    return {name: sum(p.numel() for p in child.parameters()) for name, child in module.named_children()}



# ----------------------------------------------------------------------------- chapter 1 helpers
class EncoderStackLM(nn.Module):
    """A sequence model built from the original layers: token embeddings (scaled by ``sqrt(d)``) plus
    sinusoidal positions, an `Encoder` stack of `EncoderLayer` (LayerNorm, ReLU FFN) and a linear head.

    ``causal=True`` masks every self-attention causally: a GPT-style decoder-only language model
    (no cross-attention). ``causal=False`` lets every token attend to every token: a BERT-style
    encoder. ``norm_first`` chooses Pre-LN (True) or Post-LN (False, the original placement).
    ``forward(ids (B, L)) -> logits (B, L, vocab)``.
    """

    def __init__(self, vocab: int, d_model: int, n_heads: int, d_ff: int, n_layers: int, *,
                 norm_first: bool = False, causal: bool = True, max_len: int = 512):
        super().__init__()
        self.vocab = check_positive_int("vocab", vocab)
        check_positive_int("max_len", max_len)
        self.d_model, self.causal = check_positive_int("d_model", d_model), check_bool("causal", causal)
        self.embed = nn.Embedding(vocab, d_model)
        self.register_buffer("pos", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.encoder = Encoder(d_model, n_heads, d_ff, n_layers, norm_first=norm_first)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("ids", ids, self.vocab, rank=2)
        length = ids.shape[1]
        if length > self.pos.shape[0]:
            raise ValueError(f"ids of shape {tuple(ids.shape)} are longer than max_len={self.pos.shape[0]}")
        x = self.embed(ids) * math.sqrt(self.d_model) + self.pos[:length]
        mask = causal_mask(length, device=ids.device) if self.causal else None
        return self.head(self.encoder(x, mask))


def sequence_log_prob(model: EncoderDecoder, src: torch.Tensor, tgt: torch.Tensor, bos_id: int) -> torch.Tensor:
    """``log p(tgt | src) = sum_t log p(tgt_t | tgt_<t, src)`` for every row: ``src (B, S)``, ``tgt (B, T)`` → ``(B,)`` fp64.

    One teacher-forced pass; the log-softmax runs in fp64, as in `beam_search`, so its scores compare.
    """
    check_instance("model", model, EncoderDecoder)
    check_tensor("src", src, rank=2)
    check_token_ids("tgt", tgt, model.vocab, rank=2)
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(f"src and tgt must have the same batch size, got {tuple(src.shape)} and {tuple(tgt.shape)}")
    with torch.no_grad():
        logp = torch.log_softmax(model(src, shift_right(tgt, bos_id)).double(), dim=-1)   # (B, T, V)
    return logp.gather(-1, tgt[..., None]).squeeze(-1).sum(-1)


@torch.no_grad()
def attention_weights(model: nn.Module, *inputs, **kwargs) -> dict[str, torch.Tensor]:
    """Run ``model(*inputs, **kwargs)`` once; return the weights ``(B, H, Lq, Lk)`` of every `MultiHeadAttention` it called.

    Keys are module names (e.g. ``"decoder.layers.0.cross_attn"``), in call order. The weights come
    from the explicit formula (``keep_weights``); each module's ``keep_weights`` flag is restored after.
    """
    check_instance("model", model, nn.Module)
    mhas = {name: m for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    if not mhas:
        raise ValueError(f"{type(model).__name__} contains no MultiHeadAttention module")
    weights: dict[str, torch.Tensor] = {}
    had_flag = {name: "keep_weights" in m.__dict__ for name, m in mhas.items()}
    old_flag = {name: m.keep_weights for name, m in mhas.items()}
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: weights.__setitem__(name, mod.last_weights))
             for name, m in mhas.items()]
    try:
        for m in mhas.values():
            m.keep_weights = True
        model(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
        for name, m in mhas.items():
            if had_flag[name]:
                m.keep_weights = old_flag[name]
            else:
                del m.keep_weights
    return weights
