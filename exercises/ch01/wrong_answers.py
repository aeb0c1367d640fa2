"""Deliberately wrong answers to the Chapter 1 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests and
all its hidden tests (zero points), with messages of which at least one contains ``keyword``.
``TAMPER_BASE`` names the variant the end-to-end checks use. They are written out here rather
than built on the library's `EncoderLayer`, `DecoderLayer`, `causal_mask`, `shift_right` or
`KVCache.update`, which the questions put off limits.
"""
import torch
import torch.nn.functional as F
from torch import nn

from xfam_lib.attention import KVCache as LibraryKVCache
from xfam_lib.attention import MultiHeadAttention
from xfam_lib.transformer import FeedForward

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1: EncoderLayer + parameter count
class Encoder(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False, eps=1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x, mask=None, *, swap=False, use_mask=True):
        mask = mask if use_mask else None
        if self.norm_first != swap:
            x = x + self.self_attn(self.norm1(x), mask=mask)
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.self_attn(x, mask=mask))
        return self.norm2(x + self.ff(x))


class EncoderWrongShape(Encoder):
    def forward(self, x, mask=None):
        return super().forward(x, mask)[:, :-1]          # drops the last position


class EncoderNaN(Encoder):
    def forward(self, x, mask=None):
        return torch.full_like(x, float("nan"))


class EncoderSwappedPlacement(Encoder):
    def forward(self, x, mask=None):
        return super().forward(x, mask, swap=True)       # Post-LN where Pre-LN was asked and back


class EncoderNormsSwapped(Encoder):
    def forward(self, x, mask=None):
        self.norm1, self.norm2 = self.norm2, self.norm1   # the FFN's norm around the attention
        try:
            return super().forward(x, mask)
        finally:
            self.norm1, self.norm2 = self.norm2, self.norm1


def param_count(d_model, d_ff):
    return 4 * d_model * d_model + 4 * d_model + 2 * d_model * d_ff + d_ff + d_model + 4 * d_model


def param_count_one_bias_short(d_model, d_ff):
    return param_count(d_model, d_ff) - d_model          # forgets the FFN's output bias


def param_count_no_norms(d_model, d_ff):
    return param_count(d_model, d_ff) - 4 * d_model


# ----------------------------------------------------------------------------- q2: DecoderLayer
class Decoder(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, norm_first=False, eps=1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.norm3 = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x, memory, memory_mask=None, *, self_mask="causal"):
        t = x.shape[1]
        if self_mask == "causal":
            def self_block(h):
                return self.self_attn(h, causal=True)
        else:
            mask = None if self_mask == "none" else torch.arange(t)[None, :] <= torch.arange(t)[:, None] + 1

            def self_block(h):
                return self.self_attn(h, mask=mask)

        def cross_block(h):
            return self.cross_attn(h, kv=memory, mask=memory_mask)

        if self.norm_first:
            x = x + self_block(self.norm1(x))
            x = x + cross_block(self.norm2(x))
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + self_block(x))
        x = self.norm2(x + cross_block(x))
        return self.norm3(x + self.ff(x))


class DecoderWrongShape(Decoder):
    def forward(self, x, memory, memory_mask=None):
        return super().forward(x, memory, memory_mask).sum(-1)      # (B, T) instead of (B, T, d)


class DecoderNaN(Decoder):
    def forward(self, x, memory, memory_mask=None):
        return super().forward(x, memory, memory_mask) * float("nan")


class DecoderSeesOneAhead(Decoder):
    def forward(self, x, memory, memory_mask=None):
        return super().forward(x, memory, memory_mask, self_mask="one ahead")    # position t also sees t + 1


class DecoderNotCausal(Decoder):
    def forward(self, x, memory, memory_mask=None):
        return super().forward(x, memory, memory_mask, self_mask="none")


# ----------------------------------------------------------------------------- q3: causal_mask
def mask(seqlen, start_pos):
    return torch.arange(start_pos + seqlen) <= start_pos + torch.arange(seqlen).unsqueeze(1)


def mask_wrong_shape(seqlen, start_pos):
    return mask(seqlen, start_pos).unsqueeze(0)


def mask_nan(seqlen, start_pos):
    return torch.full((seqlen, start_pos + seqlen), float("nan"))


def mask_off_by_one(seqlen, start_pos):
    return torch.arange(start_pos + seqlen) <= start_pos + torch.arange(seqlen).unsqueeze(1) + 1


def mask_top_left(seqlen, start_pos):
    return torch.arange(start_pos + seqlen) <= torch.arange(seqlen).unsqueeze(1)   # forgets the offset start_pos


def mask_inverted(seqlen, start_pos):
    return ~mask(seqlen, start_pos)                                  # True = ignore


# ----------------------------------------------------------------------------- q4: teacher forcing
def shift(y, bos_id):
    return torch.cat([torch.full_like(y[:, :1], bos_id), y[:, :-1]], dim=1)


def shift_wrong_shape(y, bos_id):
    return torch.cat([torch.full_like(y[:, :1], bos_id), y], dim=1)  # keeps y_{T-1}: (B, T + 1)


def shift_off_by_one(y, bos_id):
    return torch.cat([torch.full_like(y[:, :1], bos_id), y[:, 1:]], dim=1)   # position t reads y_t


def shift_no_bos(y, bos_id):
    return torch.cat([torch.zeros_like(y[:, :1]), y[:, :-1]], dim=1)          # 0 instead of bos_id


def _loss(model, src, tgt, bos_id, shifted=shift, reduction="mean"):
    logits = model(src, shifted(tgt, bos_id))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction=reduction)


def loss_off_by_one(model, src, tgt, bos_id):
    return _loss(model, src, tgt, bos_id, shift_off_by_one)


def loss_nan(model, src, tgt, bos_id):
    return _loss(model, src, tgt, bos_id) * float("nan")


def loss_sum_not_mean(model, src, tgt, bos_id):
    return _loss(model, src, tgt, bos_id, reduction="sum")


def sequential_first_position(model, src, tgt, bos_id):
    """Takes the logits of the first position of each pass instead of the last."""
    tgt_in = shift(tgt, bos_id)
    losses = [F.cross_entropy(model(src, tgt_in[:, : t + 1])[:, 0], tgt[:, t], reduction="none")
              for t in range(tgt.shape[1])]
    return torch.stack(losses, dim=1).mean()


def sequential_prefix_too_short(model, src, tgt, bos_id):
    """Pass t sees only [bos, y_0, ..., y_{t-2}] (length t): it predicts y_t from one token less."""
    tgt_in = shift(tgt, bos_id)
    losses = [F.cross_entropy(model(src, tgt_in[:, : max(t, 1)])[:, -1], tgt[:, t], reduction="none")
              for t in range(tgt.shape[1])]
    return torch.stack(losses, dim=1).mean()


# ----------------------------------------------------------------------------- q5: KV cache
class Cache(LibraryKVCache):
    def update(self, k, v, start_pos):
        b, _, n_new, _ = k.shape
        end = start_pos + n_new
        if end > self.max_len:
            raise ValueError("cache overflow")
        self.k[:b, :, start_pos:end] = k
        self.v[:b, :, start_pos:end] = v
        self.length = end
        return self.k[:b, :, :end], self.v[:b, :, :end]


class CacheWrongShape(Cache):
    def update(self, k, v, start_pos):
        super().update(k, v, start_pos)
        return self.k[: k.shape[0]], self.v[: k.shape[0]]            # the whole buffer, max_len long


class CacheNaN(Cache):
    def update(self, k, v, start_pos):
        k_all, v_all = super().update(k, v, start_pos)
        return k_all * float("nan"), v_all


class CacheLengthOffByOne(Cache):
    def update(self, k, v, start_pos):
        k_all, v_all = super().update(k, v, start_pos)
        self.length -= 1                                             # the next token overwrites the last one
        return k_all, v_all


class CacheDropsNewest(Cache):
    def update(self, k, v, start_pos):
        k_all, v_all = super().update(k, v, start_pos)
        return k_all[:, :, :-1], v_all[:, :, :-1]                    # returns positions 0..end-2


class CacheNoOverflowCheck(Cache):
    def update(self, k, v, start_pos):
        b, _, n_new, _ = k.shape
        end = min(start_pos + n_new, self.max_len)                   # silently truncates instead of raising
        self.k[:b, :, start_pos:end] = k[:, :, : end - start_pos]
        self.v[:b, :, start_pos:end] = v[:, :, : end - start_pos]
        self.length = end
        return self.k[:b, :, :end], self.v[:b, :, :end]


def counts(T):
    return sum(range(1, T + 1)), sum(t * t for t in range(1, T + 1))


def counts_off_by_one(T):
    return sum(range(T)), sum(t * t for t in range(T))             # steps 0..T-1 instead of 1..T


def counts_swapped(T):
    return counts(T)[::-1]


WRONG_ANSWERS = {
    "q1a": {
        "wrong_shape": ({"EncoderLayer": EncoderWrongShape}, "shape"),
        "nan": ({"EncoderLayer": EncoderNaN}, "NaN"),
        "off_by_one": ({"EncoderLayer": EncoderNormsSwapped}, "max abs error"),
        "swapped_placement": ({"EncoderLayer": EncoderSwappedPlacement}, "max abs error"),
    },
    "q1b": {
        "off_by_one": ({"encoder_layer_param_count": param_count_one_bias_short}, "off by -"),
        "no_norms": ({"encoder_layer_param_count": param_count_no_norms}, "off by -"),
    },
    "q2": {
        "wrong_shape": ({"DecoderLayer": DecoderWrongShape}, "shape"),
        "nan": ({"DecoderLayer": DecoderNaN}, "NaN"),
        "off_by_one": ({"DecoderLayer": DecoderSeesOneAhead}, "not causal"),
        "not_causal": ({"DecoderLayer": DecoderNotCausal}, "not causal"),
    },
    "q3": {
        "wrong_shape": ({"causal_mask": mask_wrong_shape}, "shape"),
        "nan": ({"causal_mask": mask_nan}, "dtype"),
        "off_by_one": ({"causal_mask": mask_off_by_one}, "entries differ"),
        "top_left_aligned": ({"causal_mask": mask_top_left}, "entries differ"),
        "inverted": ({"causal_mask": mask_inverted}, "entries differ"),
    },
    "q4a": {
        "wrong_shape": ({"shift_right": shift_wrong_shape}, "shape"),
        "off_by_one": ({"shift_right": shift_off_by_one}, "entries differ"),
        "no_bos": ({"shift_right": shift_no_bos}, "entries differ"),
    },
    "q4b": {
        "nan": ({"teacher_forcing_loss": loss_nan}, "NaN"),
        "off_by_one": ({"teacher_forcing_loss": loss_off_by_one}, "max abs error"),
        "sum_not_mean": ({"teacher_forcing_loss": loss_sum_not_mean}, "max abs error"),
    },
    "q4c": {
        "off_by_one": ({"sequential_loss": sequential_prefix_too_short}, "max abs error"),
        "first_position": ({"sequential_loss": sequential_first_position}, "max abs error"),
    },
    "q5a": {
        "wrong_shape": ({"KVCache": CacheWrongShape}, "shape"),
        "nan": ({"KVCache": CacheNaN}, "NaN"),
        "off_by_one": ({"KVCache": CacheLengthOffByOne}, "off by -1"),
        "drops_newest": ({"KVCache": CacheDropsNewest}, "shape"),
        "no_overflow_check": ({"KVCache": CacheNoOverflowCheck}, "ValueError"),
    },
    "q5b": {
        "off_by_one": ({"score_dot_products": counts_off_by_one}, "off by -"),
        "swapped": ({"score_dot_products": counts_swapped}, "off by"),
    },
}
