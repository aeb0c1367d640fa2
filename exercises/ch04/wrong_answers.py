"""Deliberately wrong answers to the Chapter 4 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests and
all its hidden tests (zero points), with messages of which at least one contains ``keyword``.
``TAMPER_BASE`` names the variant the end-to-end checks use. Most are the mistakes chapter 4's
pitfalls list (ERRATA E4.1, E4.11, E4.12, E4.15, E4.18, E4.19). They are written out here
rather than built on ``xfam_lib.positional``, whose functions the questions put off limits.
"""
import math

import torch

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1: sinusoids and the shift matrix
def pe(length, d_model, base=10000.0, *, start=0, dtype=torch.float64):
    theta = base ** (-torch.arange(0, d_model, 2, dtype=dtype) / d_model)
    angle = torch.arange(start, start + length, dtype=dtype)[:, None] * theta
    return torch.stack((torch.sin(angle), torch.cos(angle)), dim=-1).flatten(1).float()


def pe_wrong_shape(length, d_model, base=10000.0):
    return pe(length, d_model, base)[:, :-1]


def pe_nan(length, d_model, base=10000.0):
    return pe(length, d_model, base) * float("nan")


def pe_one_based(length, d_model, base=10000.0):
    return pe(length, d_model, base, start=1)                     # positions counted from 1 (E4.1)


def pe_cos_first(length, d_model, base=10000.0):
    table = pe(length, d_model, base)
    return torch.stack((table[:, 1::2], table[:, 0::2]), -1).flatten(1)   # cos at even dims


def pe_float32_angles(length, d_model, base=10000.0):
    return pe(length, d_model, base, dtype=torch.float32)         # angles rounded to float32 at large positions


def shift(delta, d_model, base=10000.0):
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        b = delta * base ** (-2 * i / d_model)
        M[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[math.cos(b), math.sin(b)], [-math.sin(b), math.cos(b)]],
                                                               dtype=torch.float64)
    return M


def shift_transposed(delta, d_model, base=10000.0):
    return shift(delta, d_model, base).T                          # rotates the other way


def shift_by_one_more(delta, d_model, base=10000.0):
    return shift(delta + 1, d_model, base)


def shift_float32(delta, d_model, base=10000.0):
    return shift(delta, d_model, base).float()


# ----------------------------------------------------------------------------- q2: RoPE
def rope(x, positions, base=10000.0, interleaved=False, *, sign=1.0):
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = sign * positions.to(torch.float64)[:, None] * theta
    cos, sin = torch.cos(angle), torch.sin(angle)
    xd = x.to(torch.float64)
    if interleaved:
        x1, x2 = xd[..., 0::2], xd[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        x1, x2 = xd[..., : d // 2], xd[..., d // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


def rope_wrong_shape(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions, base, interleaved)[..., : x.shape[-1] // 2]


def rope_nan(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions, base, interleaved) + float("nan")


def rope_positions_plus_one(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions + 1, base, interleaved)


def rope_other_layout(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions, base, not interleaved)              # pairs (2i, 2i+1) vs (i, i + d/2) mixed up (E4.12)


def rope_wrong_direction(x, positions, base=10000.0, interleaved=False):
    return rope(x, positions, base, interleaved, sign=-1.0)       # rotates by -angle (E4.11)


def rope_always_float64(x, positions, base=10000.0, interleaved=False):
    return rope(x.double(), positions, base, interleaved)


def turns(train_len, d, base=10000.0):
    return sum(1 for i in range(d // 2) if train_len * base ** (-2 * i / d) < 2 * math.pi)


def turns_off_by_one(train_len, d, base=10000.0):
    return turns(train_len, d, base) + 1


def turns_counts_full_turns(train_len, d, base=10000.0):
    return sum(1 for i in range(d // 2) if train_len * base ** (-2 * i / d) >= 2 * math.pi)   # the complement


def turns_as_float(train_len, d, base=10000.0):
    return float(turns(train_len, d, base))


# ----------------------------------------------------------------------------- q3: ALiBi
def slopes(n_heads):
    def power_of_two(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    def rule(n):
        if n & (n - 1) == 0:
            return power_of_two(n)
        p = 2 ** int(math.floor(math.log2(n)))
        return power_of_two(p) + rule(2 * p)[0::2][: n - p]

    return torch.tensor(rule(n_heads), dtype=torch.float32)


def slopes_wrong_shape(n_heads):
    return slopes(n_heads)[None]


def slopes_nan(n_heads):
    return slopes(n_heads) * float("nan")


def slopes_off_by_one(n_heads):
    return torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(n_heads)], dtype=torch.float32)   # h = 0..H-1


def slopes_simple_formula(n_heads):
    """2^(-8h/H) for every H: right for powers of two, wrong for 12 heads."""
    return torch.tensor([2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)], dtype=torch.float32)


def bias(n_heads, length):
    pos = torch.arange(length)
    return -slopes(n_heads)[:, None, None] * (pos[:, None] - pos[None, :]).abs().to(torch.float32)


def bias_reversed(n_heads, length):
    """The vector m * [0, -1, ..., -(i-1)] read as keys in order: penalises the newest keys (E4.15)."""
    pos = torch.arange(length, dtype=torch.float32)
    return -slopes(n_heads)[:, None, None] * pos[None, None, :].expand(n_heads, length, length)


def bias_simple_slopes(n_heads, length):
    pos = torch.arange(length)
    return -slopes_simple_formula(n_heads)[:, None, None] * (pos[:, None] - pos[None, :]).abs().to(torch.float32)


def bias_positive(n_heads, length):
    return -bias(n_heads, length)                                 # rewards distance instead of penalising it


# ----------------------------------------------------------------------------- q4: T5 buckets
def buckets(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    rel = relative_position.long()
    bucket = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        bucket += (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        n = (-rel).clamp(min=0)
    n_exact = num_buckets // 2
    large = n_exact + (torch.log(n.float().clamp(min=1) / n_exact) / math.log(max_distance / n_exact)
                       * (num_buckets - n_exact)).long()
    return bucket + torch.where(n < n_exact, n, large.clamp(max=num_buckets - 1))


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
    return (1 + math.exp(beta)) * torch.sigmoid(alpha * dist - beta)


def f_wrong_shape(dist, alpha, beta):
    return f(dist, alpha, beta).flatten()[:-1]


def f_nan(dist, alpha, beta):
    return f(dist, alpha, beta) * float("nan")


def f_sign_flipped(dist, alpha, beta):
    return (1 + math.exp(beta)) * torch.sigmoid(-alpha * dist - beta)     # e^(beta + alpha dist) in the denominator


def f_without_numerator(dist, alpha, beta):
    return torch.sigmoid(alpha * dist - beta)                            # forgets the (1 + e^beta)


def _attention(q, k, v, alpha, beta, *, offset=0, relu=True, matmul=False):
    L = q.shape[-2]
    pos = torch.arange(L, dtype=q.dtype)
    weight = f((pos[:, None] - pos[None, :]).abs() + offset, alpha, beta)
    dots = q @ k.transpose(-2, -1)
    dots = torch.relu(dots) if relu else dots
    scores = (dots @ weight if matmul else dots * weight) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def attn(q, k, v, alpha, beta):
    return _attention(q, k, v, alpha, beta)


def attn_distance_plus_one(q, k, v, alpha, beta):
    return _attention(q, k, v, alpha, beta, offset=1)


def attn_no_relu(q, k, v, alpha, beta):
    return _attention(q, k, v, alpha, beta, relu=False)


def attn_matrix_product(q, k, v, alpha, beta):
    """ReLU(QK^T) f(R) as a matrix product instead of element-wise (E4.18)."""
    return _attention(q, k, v, alpha, beta, matmul=True)


WRONG_ANSWERS = {
    "q1a": {
        "wrong_shape": ({"sinusoidal_pe": pe_wrong_shape}, "shape"),
        "nan": ({"sinusoidal_pe": pe_nan}, "NaN"),
        "off_by_one": ({"sinusoidal_pe": pe_one_based}, "max abs error"),
        "cos_first": ({"sinusoidal_pe": pe_cos_first}, "max abs error"),
        "float32_angles": ({"sinusoidal_pe": pe_float32_angles}, "max abs error"),
    },
    "q1b": {
        "off_by_one": ({"shift_matrix": shift_by_one_more}, "max abs error"),
        "transposed": ({"shift_matrix": shift_transposed}, "max abs error"),
        "float32": ({"shift_matrix": shift_float32}, "dtype"),
    },
    "q2a": {
        "wrong_shape": ({"rope": rope_wrong_shape}, "shape"),
        "nan": ({"rope": rope_nan}, "NaN"),
        "off_by_one": ({"rope": rope_positions_plus_one}, "max abs error"),
        "other_layout": ({"rope": rope_other_layout}, "max abs error"),
        "wrong_direction": ({"rope": rope_wrong_direction}, "max abs error"),
        "wrong_dtype": ({"rope": rope_always_float64}, "dtype"),
    },
    "q2b": {
        "off_by_one": ({"pairs_short_of_one_turn": turns_off_by_one}, "off by 1"),
        "complement": ({"pairs_short_of_one_turn": turns_counts_full_turns}, "off by"),
        "float": ({"pairs_short_of_one_turn": turns_as_float}, "integer"),
    },
    "q3a": {
        "wrong_shape": ({"alibi_slopes": slopes_wrong_shape}, "shape"),
        "nan": ({"alibi_slopes": slopes_nan}, "NaN"),
        "off_by_one": ({"alibi_slopes": slopes_off_by_one}, "max abs error"),
        "simple_formula": ({"alibi_slopes": slopes_simple_formula}, "max abs error"),
    },
    "q3b": {
        "off_by_one": ({"alibi_bias": bias_reversed}, "max abs error"),
        "simple_slopes": ({"alibi_bias": bias_simple_slopes}, "max abs error"),
        "positive": ({"alibi_bias": bias_positive}, "max abs error"),
    },
    "q4": {
        "wrong_shape": ({"relative_position_bucket": buckets_wrong_shape}, "shape"),
        "float_ids": ({"relative_position_bucket": buckets_float}, "dtype"),
        "off_by_one": ({"relative_position_bucket": buckets_off_by_one}, "differ"),
        "query_minus_key": ({"relative_position_bucket": buckets_query_minus_key}, "differ"),
    },
    "q5a": {
        "wrong_shape": ({"da_weight": f_wrong_shape}, "shape"),
        "nan": ({"da_weight": f_nan}, "NaN"),
        "off_by_one": ({"da_weight": f_sign_flipped}, "max abs error"),
        "no_numerator": ({"da_weight": f_without_numerator}, "max abs error"),
    },
    "q5b": {
        "off_by_one": ({"da_attention": attn_distance_plus_one}, "max abs error"),
        "no_relu": ({"da_attention": attn_no_relu}, "max abs error"),
        "matrix_product": ({"da_attention": attn_matrix_product}, "max abs error"),
    },
}
