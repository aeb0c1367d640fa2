"""Deliberately wrong answers to the Chapter 1 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[question][variant] = (replacements, keyword)``: ``replacements`` maps the names a
question's answer defines to wrong implementations; the question's hidden tests must all fail on
them (zero points) with messages of which at least one contains ``keyword``. ``TAMPER_BASE``
names the variant that the tampering checks combine with patched comparison functions (wrong
values of the right shape, the case a broken comparison would let through).

The tests add two generic variants to every question themselves (an exception and an endless
loop), so they are not listed here.
"""
import torch
import torch.nn.functional as F

from xfam_lib.attention import KVCache as LibraryKVCache
from xfam_lib.attention import causal_mask as library_causal_mask
from xfam_lib.transformer import DecoderLayer as LibraryDecoderLayer
from xfam_lib.transformer import EncoderLayer as LibraryEncoderLayer
from xfam_lib.transformer import shift_right as library_shift_right

TAMPER_BASE = "off_by_one"


def _param_count(d_model, d_ff):
    return 4 * d_model * d_model + 4 * d_model + 2 * d_model * d_ff + d_ff + d_model + 4 * d_model


# ----------------------------------------------------------------------------- q1: EncoderLayer + parameter count
class EncoderWrongShape(LibraryEncoderLayer):
    def forward(self, x, mask=None):
        return super().forward(x, mask)[:, :-1]          # drops the last position


class EncoderNaN(LibraryEncoderLayer):
    def forward(self, x, mask=None):
        return torch.full_like(x, float("nan"))


class EncoderSwappedPlacement(LibraryEncoderLayer):
    def forward(self, x, mask=None):
        self.norm_first = not self.norm_first            # Post-LN where Pre-LN was asked and back
        try:
            return super().forward(x, mask)
        finally:
            self.norm_first = not self.norm_first


def param_count_one_bias_short(d_model, d_ff):
    return _param_count(d_model, d_ff) - d_model         # forgets the FFN's output bias


# ----------------------------------------------------------------------------- q2: DecoderLayer
class DecoderWrongShape(LibraryDecoderLayer):
    def forward(self, x, memory, memory_mask=None):
        return super().forward(x, memory, memory_mask).sum(-1)      # (B, T) instead of (B, T, d)


class DecoderNaN(LibraryDecoderLayer):
    def forward(self, x, memory, memory_mask=None):
        return super().forward(x, memory, memory_mask) * float("nan")


class DecoderSeesOneAhead(LibraryDecoderLayer):
    """Causal mask shifted by one: position t also attends to t + 1."""

    def forward(self, x, memory, memory_mask=None):
        t = x.shape[1]
        one_ahead = library_causal_mask(t, t + 1)[:, :t]              # j <= i + 1
        original = self.self_attn.forward

        def leaky_self_attention(h, kv=None, mask=None, causal=False, cache=None):
            return original(h, mask=one_ahead)

        self.self_attn.forward = leaky_self_attention
        try:
            return super().forward(x, memory, memory_mask)
        finally:
            del self.self_attn.forward


class DecoderNotCausal(LibraryDecoderLayer):
    def forward(self, x, memory, memory_mask=None):
        original = self.self_attn.forward
        self.self_attn.forward = lambda h, kv=None, mask=None, causal=False, cache=None: original(h)
        try:
            return super().forward(x, memory, memory_mask)
        finally:
            del self.self_attn.forward


# ----------------------------------------------------------------------------- q3: causal_mask
def mask_wrong_shape(seqlen, start_pos):
    return library_causal_mask(seqlen, start_pos + seqlen).unsqueeze(0)


def mask_nan(seqlen, start_pos):
    return torch.full((seqlen, start_pos + seqlen), float("nan"))


def mask_off_by_one(seqlen, start_pos):
    i = torch.arange(seqlen).unsqueeze(1)
    return torch.arange(start_pos + seqlen) <= start_pos + i + 1


def mask_top_left(seqlen, start_pos):
    i = torch.arange(seqlen).unsqueeze(1)
    return torch.arange(start_pos + seqlen) <= i      # forgets the offset start_pos


def mask_inverted(seqlen, start_pos):
    return ~library_causal_mask(seqlen, start_pos + seqlen)          # True = ignore


# ----------------------------------------------------------------------------- q4: teacher forcing
def shift_wrong_shape(y, bos_id):
    return torch.cat([torch.full_like(y[:, :1], bos_id), y], dim=1)  # keeps y_{T-1}: (B, T + 1)


def shift_off_by_one(y, bos_id):
    return torch.cat([torch.full_like(y[:, :1], bos_id), y[:, 1:]], dim=1)   # position t reads y_t


def _loss(model, src, tgt, bos_id, shift):
    logits = model(src, shift(tgt, bos_id))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def loss_off_by_one(model, src, tgt, bos_id):
    return _loss(model, src, tgt, bos_id, shift_off_by_one)


def loss_nan(model, src, tgt, bos_id):
    return _loss(model, src, tgt, bos_id, library_shift_right) * float("nan")


def sequential_nan(model, src, tgt, bos_id):
    return loss_nan(model, src, tgt, bos_id)


def sequential_off_by_one(model, src, tgt, bos_id):
    return loss_off_by_one(model, src, tgt, bos_id)


def loss_sum_not_mean(model, src, tgt, bos_id):
    logits = model(src, library_shift_right(tgt, bos_id))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="sum")


# ----------------------------------------------------------------------------- q5: KV cache
class CacheWrongShape(LibraryKVCache):
    def update(self, k, v, start_pos):
        LibraryKVCache.update(self, k, v, start_pos)
        return self.k[: k.shape[0]], self.v[: k.shape[0]]            # the whole buffer, max_len long


class CacheNaN(LibraryKVCache):
    def update(self, k, v, start_pos):
        k_all, v_all = LibraryKVCache.update(self, k, v, start_pos)
        return k_all * float("nan"), v_all


class CacheLengthOffByOne(LibraryKVCache):
    def update(self, k, v, start_pos):
        k_all, v_all = LibraryKVCache.update(self, k, v, start_pos)
        self.length -= 1                                             # the next token overwrites the last one
        return k_all, v_all


class CacheDropsNewest(LibraryKVCache):
    def update(self, k, v, start_pos):
        k_all, v_all = LibraryKVCache.update(self, k, v, start_pos)
        return k_all[:, :, :-1], v_all[:, :, :-1]                    # returns positions 0..end-2


def counts(T):
    return sum(range(1, T + 1)), sum(t * t for t in range(1, T + 1))


def counts_off_by_one(T):
    return sum(range(T)), sum(t * t for t in range(T))             # steps 0..T-1 instead of 1..T


WRONG_ANSWERS = {
    "q1": {
        "wrong_shape": ({"EncoderLayer": EncoderWrongShape, "encoder_layer_param_count": _param_count}, "shape"),
        "nan": ({"EncoderLayer": EncoderNaN, "encoder_layer_param_count": _param_count}, "NaN"),
        "off_by_one": ({"EncoderLayer": LibraryEncoderLayer,
                        "encoder_layer_param_count": param_count_one_bias_short}, "off by -"),
        "swapped_placement": ({"EncoderLayer": EncoderSwappedPlacement,
                               "encoder_layer_param_count": _param_count}, "max abs error"),
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
    "q4": {
        "wrong_shape": ({"shift_right": shift_wrong_shape, "teacher_forcing_loss": loss_off_by_one,
                         "sequential_loss": sequential_off_by_one}, "shape"),
        "nan": ({"shift_right": library_shift_right, "teacher_forcing_loss": loss_nan,
                 "sequential_loss": sequential_nan}, "NaN"),
        "off_by_one": ({"shift_right": shift_off_by_one, "teacher_forcing_loss": loss_off_by_one,
                        "sequential_loss": sequential_off_by_one}, "entries differ"),
        "sum_not_mean": ({"shift_right": library_shift_right, "teacher_forcing_loss": loss_sum_not_mean,
                          "sequential_loss": loss_sum_not_mean}, "max abs error"),
    },
    "q5": {
        "wrong_shape": ({"KVCache": CacheWrongShape, "score_dot_products": counts}, "shape"),
        "nan": ({"KVCache": CacheNaN, "score_dot_products": counts}, "NaN"),
        "off_by_one": ({"KVCache": CacheLengthOffByOne, "score_dot_products": counts_off_by_one}, "max abs error"),
        "drops_newest": ({"KVCache": CacheDropsNewest, "score_dot_products": counts}, "shape"),
    },
}
