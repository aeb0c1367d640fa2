"""Deliberately wrong answers to the Chapter 4 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[question][variant] = (replacements, keyword)``: ``replacements`` maps the names a
question's answer defines to wrong implementations; the question's hidden tests must all fail on
them (zero points) with messages of which at least one contains ``keyword``. ``TAMPER_BASE``
names the variant that the tampering checks combine with patched comparison functions.
Most wrong answers are the mistakes chapter 4's pitfalls list (ERRATA E4.1, E4.11, E4.12, E4.15,
E4.18, E4.19).
"""
import math

import torch

from xfam_lib.positional import (alibi_bias, alibi_slopes, apply_rope, da_attention, da_weight,
                                 rope_turns, sinusoidal_encoding, sinusoidal_shift_matrix,
                                 t5_relative_position_bucket)

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1: sinusoids and the shift matrix
def pe(length, d_model, base=10000.0):
    return sinusoidal_encoding(length, d_model, base)


def shift(delta, d_model, base=10000.0):
    return sinusoidal_shift_matrix(delta, d_model, base)


def pe_wrong_shape(length, d_model, base=10000.0):
    return pe(length, d_model, base)[:, :-1]


def pe_nan(length, d_model, base=10000.0):
    return pe(length, d_model, base) * float("nan")


def pe_one_based(length, d_model, base=10000.0):
    return pe(length + 1, d_model, base)[1:]                      # positions counted from 1 (E4.1)


def pe_cos_first(length, d_model, base=10000.0):
    table = pe(length, d_model, base)
    return torch.stack((table[:, 1::2], table[:, 0::2]), -1).flatten(1)   # cos at even dims


def shift_transposed(delta, d_model, base=10000.0):
    return shift(delta, d_model, base).T                          # rotates the other way


# ----------------------------------------------------------------------------- q2: RoPE
def rope(x, positions, base=10000.0, interleaved=False):
    return apply_rope(x, positions, base=base, interleaved=interleaved)


def turns(train_len, d, base=10000.0):
    return int((rope_turns(train_len, d, base) < 1).sum())


def rope_wrong_shape(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions, base, interleaved)[..., : x.shape[-1] // 2]


def rope_nan(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions, base, interleaved) + float("nan")


def rope_positions_plus_one(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions + 1, base, interleaved)


def rope_other_layout(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions, base, not interleaved)              # pairs (2i, 2i+1) vs (i, i + d/2) mixed up (E4.12)


def rope_wrong_direction(x, positions, base=10000.0, interleaved=False):
    """Rotates by -angle: still a rotation, still relative, but not the asked one (E4.11)."""
    flip = torch.ones(x.shape[-1], dtype=x.dtype)
    if interleaved:
        flip[1::2] = -1
    else:
        flip[x.shape[-1] // 2:] = -1
    return rope(x * flip, positions, base, interleaved) * flip


def turns_off_by_one(train_len, d, base=10000.0):
    return turns(train_len, d, base) + 1


# ----------------------------------------------------------------------------- q3: ALiBi
def slopes(n_heads):
    return alibi_slopes(n_heads)


def bias(n_heads, length):
    return alibi_bias(n_heads, length)


def slopes_wrong_shape(n_heads):
    return slopes(n_heads)[None]


def slopes_nan(n_heads):
    return slopes(n_heads) * float("nan")


def slopes_off_by_one(n_heads):
    return torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(n_heads)], dtype=torch.float32)   # h = 0..H-1


def slopes_simple_formula(n_heads):
    """2^(-8h/H) for every H: right for powers of two, wrong for 12 heads."""
    return torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)], dtype=torch.float32)


def bias_reversed(n_heads, length):
    """The vector m * [0, -1, ..., -(i-1)] read as keys in order: penalises the newest keys (E4.15)."""
    pos = torch.arange(length, dtype=torch.float32)
    return -slopes(n_heads)[:, None, None] * pos[None, None, :].expand(n_heads, length, length)


# ----------------------------------------------------------------------------- q4: T5 buckets
def buckets(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    return t5_relative_position_bucket(relative_position, bidirectional=bidirectional, num_buckets=num_buckets,
                                       max_distance=max_distance)


def buckets_wrong_shape(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    return buckets(relative_position, bidirectional, num_buckets, max_distance).flatten()[:-1]


def buckets_float(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    return buckets(relative_position, bidirectional, num_buckets, max_distance).float()


def buckets_off_by_one(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """Every offset shifted by one (key - query - 1)."""
    return buckets(relative_position - 1, bidirectional, num_buckets, max_distance)


def buckets_query_minus_key(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    return buckets(-relative_position, bidirectional, num_buckets, max_distance)    # sign convention swapped (E4.19)


# ----------------------------------------------------------------------------- q5: DA-Transformer
def f(dist, alpha, beta):
    return da_weight(dist, alpha, beta)


def attn(q, k, v, alpha, beta):
    return da_attention(q, k, v, alpha, beta)


def f_wrong_shape(dist, alpha, beta):
    return f(dist, alpha, beta)[:-1]


def f_nan(dist, alpha, beta):
    return f(dist, alpha, beta) * float("nan")


def attn_distance_plus_one(q, k, v, alpha, beta):
    L = q.shape[-2]
    pos = torch.arange(L, dtype=q.dtype)
    dist = (pos[:, None] - pos[None, :]).abs() + 1
    scores = torch.relu(q @ k.transpose(-2, -1)) * da_weight(dist, alpha, beta) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def attn_no_relu(q, k, v, alpha, beta):
    L = q.shape[-2]
    pos = torch.arange(L, dtype=q.dtype)
    dist = (pos[:, None] - pos[None, :]).abs()
    scores = (q @ k.transpose(-2, -1)) * da_weight(dist, alpha, beta) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def attn_matrix_product(q, k, v, alpha, beta):
    """ReLU(QK^T) f(R) as a matrix product instead of element-wise (E4.18)."""
    L = q.shape[-2]
    pos = torch.arange(L, dtype=q.dtype)
    dist = (pos[:, None] - pos[None, :]).abs()
    scores = torch.relu(q @ k.transpose(-2, -1)) @ da_weight(dist, alpha, beta) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


WRONG_ANSWERS = {
    "q1": {
        "wrong_shape": ({"sinusoidal_pe": pe_wrong_shape, "shift_matrix": shift}, "shape"),
        "nan": ({"sinusoidal_pe": pe_nan, "shift_matrix": shift}, "NaN"),
        "off_by_one": ({"sinusoidal_pe": pe_one_based, "shift_matrix": shift}, "max abs error"),
        "cos_first": ({"sinusoidal_pe": pe_cos_first, "shift_matrix": shift}, "max abs error"),
        "shift_transposed": ({"sinusoidal_pe": pe, "shift_matrix": shift_transposed}, "max abs error"),
    },
    "q2": {
        "wrong_shape": ({"rope": rope_wrong_shape, "pairs_short_of_one_turn": turns}, "shape"),
        "nan": ({"rope": rope_nan, "pairs_short_of_one_turn": turns}, "NaN"),
        "off_by_one": ({"rope": rope_positions_plus_one, "pairs_short_of_one_turn": turns_off_by_one}, "max abs error"),
        "other_layout": ({"rope": rope_other_layout, "pairs_short_of_one_turn": turns}, "max abs error"),
        "wrong_direction": ({"rope": rope_wrong_direction, "pairs_short_of_one_turn": turns}, "max abs error"),
    },
    "q3": {
        "wrong_shape": ({"alibi_slopes": slopes_wrong_shape, "alibi_bias": bias}, "shape"),
        "nan": ({"alibi_slopes": slopes_nan, "alibi_bias": bias}, "NaN"),
        "off_by_one": ({"alibi_slopes": slopes_off_by_one, "alibi_bias": bias}, "max abs error"),
        "simple_formula": ({"alibi_slopes": slopes_simple_formula, "alibi_bias": bias}, "max abs error"),
        "reversed_bias": ({"alibi_slopes": slopes, "alibi_bias": bias_reversed}, "max abs error"),
    },
    "q4": {
        "wrong_shape": ({"relative_position_bucket": buckets_wrong_shape}, "shape"),
        "float_ids": ({"relative_position_bucket": buckets_float}, "dtype"),
        "off_by_one": ({"relative_position_bucket": buckets_off_by_one}, "differ"),
        "query_minus_key": ({"relative_position_bucket": buckets_query_minus_key}, "differ"),
    },
    "q5": {
        "wrong_shape": ({"da_weight": f_wrong_shape, "da_attention": attn}, "shape"),
        "nan": ({"da_weight": f_nan, "da_attention": attn}, "NaN"),
        "off_by_one": ({"da_weight": f, "da_attention": attn_distance_plus_one}, "max abs error"),
        "no_relu": ({"da_weight": f, "da_attention": attn_no_relu}, "max abs error"),
        "matrix_product": ({"da_weight": f, "da_attention": attn_matrix_product}, "max abs error"),
    },
}
