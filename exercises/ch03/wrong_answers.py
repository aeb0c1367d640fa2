"""Deliberately wrong answers to the Chapter 3 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[question][variant] = (replacements, keyword)``: ``replacements`` maps the names a
question's answer defines to wrong implementations; the question's hidden tests must all fail on
them (zero points) with messages of which at least one contains ``keyword``. ``TAMPER_BASE``
names the variant that the tampering checks combine with patched comparison functions (wrong
values of the right shape, the case a broken comparison would let through).

The tests add two generic variants to every question themselves (an exception and an endless
loop), so they are not listed here.
"""
import math

import torch

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1: variance of q . k
def qk_variance(d_k, mean=0.0, var=1.0):
    return float(d_k * (var * var + 2 * var * mean * mean))


def scaled_variance(d_k, alpha, mean=0.0, var=1.0):
    return qk_variance(d_k, mean, var) / float(d_k) ** (2 * alpha)


def qk_variance_ignores_mean(d_k, mean=0.0, var=1.0):
    return float(d_k * var * var)                        # the (E q)^2 and (E k)^2 terms dropped


def scaled_variance_ignores_mean(d_k, alpha, mean=0.0, var=1.0):
    return qk_variance_ignores_mean(d_k, mean, var) / float(d_k) ** (2 * alpha)


def qk_variance_std(d_k, mean=0.0, var=1.0):
    return math.sqrt(qk_variance(d_k, mean, var))       # the standard deviation, not the variance


def scaled_variance_alpha_once(d_k, alpha, mean=0.0, var=1.0):
    return qk_variance(d_k, mean, var) / float(d_k) ** alpha      # forgets to square the scale


def qk_variance_off_by_one(d_k, mean=0.0, var=1.0):
    return float((d_k - 1) * (var * var + 2 * var * mean * mean))  # sums over d_k - 1 components


def scaled_variance_off_by_one(d_k, alpha, mean=0.0, var=1.0):
    return qk_variance_off_by_one(d_k, mean, var) / float(d_k) ** (2 * alpha)


def qk_variance_nan(d_k, mean=0.0, var=1.0):
    return float("nan")


# ----------------------------------------------------------------------------- q2: softmax Jacobian
def jacobian(y):
    return torch.diag_embed(y) - y.unsqueeze(-1) * y.unsqueeze(-2)


def uniform_norm(n):
    return math.sqrt(n - 1) / n


def jacobian_diag_only(y):
    return torch.diag_embed(y)                           # forgets - y y^T


def jacobian_plus_outer(y):
    return torch.diag_embed(y) + y.unsqueeze(-1) * y.unsqueeze(-2)


def jacobian_extra_dim(y):
    return jacobian(y).unsqueeze(0)                      # (1, ..., n, n): an extra leading dimension


def jacobian_nan(y):
    return jacobian(y) * float("nan")


def uniform_norm_off_by_one(n):
    return math.sqrt(n) / n                              # sqrt(n) instead of sqrt(n - 1)


# ----------------------------------------------------------------------------- q3: log-n scaling
def logn_factor(n, train_len):
    return math.log(n) / math.log(train_len)


def logn_attention(q, k, v, train_len):
    scale = logn_factor(k.shape[-2], train_len) / math.sqrt(q.shape[-1])
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def logn_factor_natural_log(n, train_len):
    return math.log(n)


def logn_factor_inverted(n, train_len):
    return math.log(train_len) / math.log(n) if n > 1 else 0.0


def logn_attention_no_sqrt(q, k, v, train_len):
    scale = logn_factor(k.shape[-2], train_len)          # forgets 1/sqrt(d)
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def logn_attention_query_count(q, k, v, train_len):
    scale = logn_factor(q.shape[-2], train_len) / math.sqrt(q.shape[-1])   # n = Lq instead of Lk
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def logn_attention_nan(q, k, v, train_len):
    return logn_attention(q, k, v, train_len) * float("nan")


# ----------------------------------------------------------------------------- q4: KV-cache bytes
def kv_bytes(n_layers, n_kv_heads, d_head, seq_len, batch=1, bytes_per_element=2):
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch * bytes_per_element


def max_context(memory_bytes, n_layers, n_kv_heads, d_head, batch=1, bytes_per_element=2):
    return memory_bytes // kv_bytes(n_layers, n_kv_heads, d_head, 1, batch, bytes_per_element)


def kv_bytes_keys_only(n_layers, n_kv_heads, d_head, seq_len, batch=1, bytes_per_element=2):
    return n_layers * n_kv_heads * d_head * seq_len * batch * bytes_per_element    # forgets the values


def max_context_keys_only(memory_bytes, n_layers, n_kv_heads, d_head, batch=1, bytes_per_element=2):
    return memory_bytes // kv_bytes_keys_only(n_layers, n_kv_heads, d_head, 1, batch, bytes_per_element)


def kv_bytes_float(n_layers, n_kv_heads, d_head, seq_len, batch=1, bytes_per_element=2):
    return kv_bytes(n_layers, n_kv_heads, d_head, seq_len, batch, bytes_per_element) / 2 ** 30   # GiB, a float


def max_context_off_by_one(memory_bytes, n_layers, n_kv_heads, d_head, batch=1, bytes_per_element=2):
    return max_context(memory_bytes, n_layers, n_kv_heads, d_head, batch, bytes_per_element) + 1


def kv_bytes_ignores_batch(n_layers, n_kv_heads, d_head, seq_len, batch=1, bytes_per_element=2):
    return kv_bytes(n_layers, n_kv_heads, d_head, seq_len, 1, bytes_per_element)


def max_context_ignores_batch(memory_bytes, n_layers, n_kv_heads, d_head, batch=1, bytes_per_element=2):
    return max_context(memory_bytes, n_layers, n_kv_heads, d_head, 1, bytes_per_element)


# ----------------------------------------------------------------------------- q5: repeat_kv, GQA, tensor parallel
def repeat_kv(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)


def _gqa(q, k, v, causal, repeat):
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat(k, n_rep), repeat(v, n_rep)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(~(torch.arange(lk) <= torch.arange(lq).unsqueeze(-1) + (lk - lq)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def gqa_attention(q, k, v, causal=False):
    return _gqa(q, k, v, causal, repeat_kv)


def tp_local_heads(n_heads, n_kv_heads, world_size):
    if n_heads % world_size or n_kv_heads % world_size or n_heads % n_kv_heads:
        raise ValueError("cannot split the heads evenly")
    return n_heads // world_size, n_kv_heads // world_size, n_heads // n_kv_heads


def repeat_kv_tiled(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)                      # heads 0, 1, ..., 0, 1, ...: the wrong grouping


def gqa_attention_tiled(q, k, v, causal=False):
    return _gqa(q, k, v, causal, repeat_kv_tiled)


def repeat_kv_wrong_shape(x, n_rep):
    return x.repeat_interleave(n_rep, dim=2)             # repeats positions, not heads


def gqa_attention_top_left(q, k, v, causal=False):
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(~(torch.arange(lk) <= torch.arange(lq).unsqueeze(-1)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def tp_local_heads_swapped(n_heads, n_kv_heads, world_size):
    a, b, c = tp_local_heads(n_heads, n_kv_heads, world_size)
    return a, c, b                                        # n_rep and the local kv heads swapped


def repeat_kv_nan(x, n_rep):
    return repeat_kv(x, n_rep) * float("nan")


def gqa_attention_nan(q, k, v, causal=False):
    return gqa_attention(q, k, v, causal) * float("nan")


# ----------------------------------------------------------------------------- q6: tiled attention
def _full_attention(q, k, v, causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(~(torch.arange(lk) <= torch.arange(lq).unsqueeze(-1) + (lk - lq)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def tiled_materialises(q, k, v, block_size=64, causal=False):
    return _full_attention(q, k, v, causal)              # right values, but builds the Lq x Lk matrix


def tiled_fused(q, k, v, block_size=64, causal=False):
    lq, lk = q.shape[-2], k.shape[-2]
    mask = (torch.arange(lk) <= torch.arange(lq).unsqueeze(-1) + (lk - lq)) if causal else None
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _tiled(q, k, v, block_size, causal, rescale=True, offset_aligned=True):
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    offset = lk - lq if offset_aligned else 0
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    for i0 in range(0, lq, block_size):
        i1 = min(i0 + block_size, lq)
        q_blk = q[..., i0:i1, :] / math.sqrt(d)
        m = q.new_full(q_blk.shape[:-1], float("-inf"))
        l = q.new_zeros(q_blk.shape[:-1])
        acc = q.new_zeros(q_blk.shape[:-1] + (v.shape[-1],))
        for j0 in range(0, lk, block_size):
            j1 = min(j0 + block_size, lk)
            s = q_blk @ k[..., j0:j1, :].transpose(-2, -1)
            if causal:
                allowed = torch.arange(j0, j1) <= torch.arange(i0, i1).unsqueeze(-1) + offset
                s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            shift = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - shift.unsqueeze(-1))
            alpha = torch.exp(m - shift) if rescale else torch.ones_like(m)
            l = alpha * l + p.sum(dim=-1)
            acc = alpha.unsqueeze(-1) * acc + p @ v[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / l.unsqueeze(-1)
    return out


def tiled_no_rescale(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal, rescale=False)      # forgets exp(m_old - m_new)


def tiled_top_left(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal, offset_aligned=False)   # causal mask aligned top-left


def tiled_wrong_shape(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal)[..., :-1, :]


def tiled_nan(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal) * float("nan")


def tiled_off_by_one_scale(q, k, v, block_size=64, causal=False):
    d = q.shape[-1]
    return _tiled(q * math.sqrt(d) / math.sqrt(d + 1), k, v, block_size, causal)   # divides by sqrt(d + 1)


WRONG_ANSWERS = {
    "q1": {
        "ignores_mean": ({"qk_variance": qk_variance_ignores_mean, "scaled_variance": scaled_variance_ignores_mean},
                         "expected"),
        "standard_deviation": ({"qk_variance": qk_variance_std, "scaled_variance": scaled_variance}, "expected"),
        "scale_not_squared": ({"qk_variance": qk_variance, "scaled_variance": scaled_variance_alpha_once}, "expected"),
        "off_by_one": ({"qk_variance": qk_variance_off_by_one, "scaled_variance": scaled_variance_off_by_one},
                       "expected"),
        "nan": ({"qk_variance": qk_variance_nan, "scaled_variance": scaled_variance_ignores_mean}, "nan"),
    },
    "q2": {
        "diag_only": ({"softmax_jacobian": jacobian_diag_only, "uniform_jacobian_norm": uniform_norm}, "max abs error"),
        "plus_outer": ({"softmax_jacobian": jacobian_plus_outer, "uniform_jacobian_norm": uniform_norm},
                       "max abs error"),
        "wrong_shape": ({"softmax_jacobian": jacobian_extra_dim, "uniform_jacobian_norm": uniform_norm}, "shape"),
        "nan": ({"softmax_jacobian": jacobian_nan, "uniform_jacobian_norm": uniform_norm}, "NaN"),
        "off_by_one": ({"softmax_jacobian": jacobian_plus_outer, "uniform_jacobian_norm": uniform_norm_off_by_one},
                       "expected"),
    },
    "q3": {
        "natural_log": ({"logn_factor": logn_factor_natural_log, "logn_attention": logn_attention_no_sqrt},
                        "expected"),
        "inverted": ({"logn_factor": logn_factor_inverted, "logn_attention": logn_attention_query_count}, "expected"),
        "no_sqrt": ({"logn_factor": logn_factor, "logn_attention": logn_attention_no_sqrt}, "max abs error"),
        "nan": ({"logn_factor": logn_factor, "logn_attention": logn_attention_nan}, "NaN"),
        "off_by_one": ({"logn_factor": logn_factor_inverted, "logn_attention": logn_attention_query_count},
                       "expected"),
    },
    "q4": {
        "keys_only": ({"kv_cache_bytes": kv_bytes_keys_only, "max_context": max_context_keys_only}, "off by"),
        "float_gib": ({"kv_cache_bytes": kv_bytes_float, "max_context": max_context}, "integer"),
        "off_by_one": ({"kv_cache_bytes": kv_bytes_ignores_batch, "max_context": max_context_off_by_one}, "off by"),
        "ignores_batch": ({"kv_cache_bytes": kv_bytes_ignores_batch, "max_context": max_context_ignores_batch},
                          "off by"),
    },
    "q5": {
        "tiled_grouping": ({"repeat_kv": repeat_kv_tiled, "gqa_attention": gqa_attention_tiled,
                            "tp_local_heads": tp_local_heads}, "max abs error"),
        "wrong_shape": ({"repeat_kv": repeat_kv_wrong_shape, "gqa_attention": gqa_attention,
                         "tp_local_heads": tp_local_heads}, "shape"),
        "off_by_one": ({"repeat_kv": repeat_kv, "gqa_attention": gqa_attention_top_left,
                        "tp_local_heads": tp_local_heads_swapped}, "expected"),
        "nan": ({"repeat_kv": repeat_kv_nan, "gqa_attention": gqa_attention_nan, "tp_local_heads": tp_local_heads},
                "NaN"),
    },
    "q6": {
        "materialises": ({"tiled_attention": tiled_materialises}, "memory budget"),
        "fused_kernel": ({"tiled_attention": tiled_fused}, "fused attention"),
        "no_rescale": ({"tiled_attention": tiled_no_rescale}, "max abs error"),
        "top_left_causal": ({"tiled_attention": tiled_top_left}, "max abs error"),
        "wrong_shape": ({"tiled_attention": tiled_wrong_shape}, "shape"),
        "nan": ({"tiled_attention": tiled_nan}, "NaN"),
        "off_by_one": ({"tiled_attention": tiled_off_by_one_scale}, "max abs error"),
    },
}
