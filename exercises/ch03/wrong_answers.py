"""Deliberately wrong answers to the Chapter 3 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests and
all its hidden tests (zero points), with messages of which at least one contains ``keyword``.
``TAMPER_BASE`` names the variant the end-to-end checks use. The tests add two generic variants
to every part themselves (an exception and an endless loop), so they are not listed here.
"""
import math

import torch
import triton
import triton.language as tl

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


def logn_factor_clipped(n, train_len):
    return max(1.0, math.log(n) / math.log(train_len))               # never below 1


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


def tiled_numpy_full(q, k, v, block_size=64, causal=False):
    import numpy as np                                   # the full matrix where torch's hooks cannot see it

    s = q.numpy() @ k.numpy().swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape[-2:]
        s = np.where(np.arange(lk) <= np.arange(lq)[:, None] + (lk - lq), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return torch.from_numpy((s / s.sum(-1, keepdims=True)) @ v.numpy()).to(q.dtype)


def tiled_dispatch_off(q, k, v, block_size=64, causal=False):
    with torch._C._DisableTorchDispatch():               # the full matrix with torch's dispatch hooks off
        return _full_attention(q, k, v, causal)


def tiled_fused(q, k, v, block_size=64, causal=False):
    lq, lk = q.shape[-2], k.shape[-2]
    mask = (torch.arange(lk) <= torch.arange(lq).unsqueeze(-1) + (lk - lq)) if causal else None
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _tiled(q, k, v, block_size, causal, rescale=True, offset_aligned=True, rescale_acc=True):
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
            acc = (alpha.unsqueeze(-1) * acc if rescale_acc else acc) + p @ v[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / l.unsqueeze(-1)
    return out


def tiled_no_rescale(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal, rescale=False)      # forgets exp(m_old - m_new)


def tiled_acc_not_rescaled(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal, rescale_acc=False)  # l rescaled, acc not


def tiled_float64_buffers(q, k, v, block_size=64, causal=False):
    return _tiled(q.double(), k.double(), v.double(), block_size, causal)   # float64 whatever the input


def tiled_top_left(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal, offset_aligned=False)   # causal mask aligned top-left


def tiled_wrong_shape(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal)[..., :-1, :]


def tiled_nan(q, k, v, block_size=64, causal=False):
    return _tiled(q, k, v, block_size, causal) * float("nan")


def tiled_off_by_one_scale(q, k, v, block_size=64, causal=False):
    d = q.shape[-1]
    return _tiled(q * math.sqrt(d) / math.sqrt(d + 1), k, v, block_size, causal)   # divides by sqrt(d + 1)


def max_context_keys_only_direct(memory_bytes, n_layers, n_kv_heads, d_head, batch=1, bytes_per_element=2):
    return memory_bytes // (n_layers * n_kv_heads * d_head * batch * bytes_per_element)


def tp_local_heads_no_check(n_heads, n_kv_heads, world_size):
    return n_heads // world_size, max(n_kv_heads // world_size, 1), n_heads // n_kv_heads   # never raises


# ----------------------------------------------------------------------------- q6b: the kernel's key loop
@triton.jit
def load_rows(base, rows, n_rows, D: tl.constexpr):
    """The notebook's given load (the wrong loops below call it, as the student's does)."""
    cols = tl.arange(0, D)
    return tl.load(base + rows[:, None] * D + cols[None, :], mask=rows[:, None] < n_rows, other=0.0)


@triton.jit
def _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, D: tl.constexpr, RESCALE: tl.constexpr = True, KEEP_MAX: tl.constexpr = True,
              BASE_2: tl.constexpr = True, DIAGONAL: tl.constexpr = True, ALIGNED: tl.constexpr = True,
              RAGGED: tl.constexpr = True, GUARD: tl.constexpr = True):
    """The right loop, with one mistake switched on by each flag set to False."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, len_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = load_rows(k_base, cols, len_k, D)
        v = load_rows(v_base, cols, len_k, D)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = cols[None, :] < len_k
        if not RAGGED:                                     # forgets the keys past len_k
            visible = cols[None, :] >= 0
        shift = len_k - len_q if ALIGNED else 0             # top-left causal alignment
        if CAUSAL:
            if DIAGONAL:
                visible = visible & (cols[None, :] <= rows[:, None] + shift)
            else:                                           # off by one: the diagonal key hidden
                visible = visible & (cols[None, :] < rows[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        if GUARD:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:                                               # -inf - (-inf) = NaN for a row with no key
            m_use = m_new
        if BASE_2:
            p = tl.exp2(s - m_use[:, None])
            alpha = tl.exp2(m - m_use)
        else:                                               # base e on base-2 scores
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m - m_use)
        l = l * alpha + tl.sum(p, 1)
        if RESCALE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:                                               # the accumulator never rescaled
            acc = acc + tl.dot(p, v, input_precision="ieee")
        if KEEP_MAX:
            m = m_new                                       # else: the running max never updated
    return acc, m, l


@triton.jit
def key_loop_no_rescale(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D, RESCALE=False)


@triton.jit
def key_loop_stale_max(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D, KEEP_MAX=False)


@triton.jit
def key_loop_base_e(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D, BASE_2=False)


@triton.jit
def key_loop_off_by_one(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D, DIAGONAL=False)


@triton.jit
def key_loop_top_left(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D, ALIGNED=False)


@triton.jit
def key_loop_ragged_keys(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D, RAGGED=False)


@triton.jit
def key_loop_no_guard(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _key_loop(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D, GUARD=False)


def _in_python(*args):
    """Plain Python inside the kernel: Triton's interpreter runs it (here the right loop; it could be
    PyTorch or anything), a GPU could not compile it."""
    return _key_loop(*args)


@triton.jit
def key_loop_calls_python(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    return _in_python(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, D)


@triton.jit
def key_loop_one_tile(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """No loop: one tile of 64 keys, right whenever len_k <= 64."""
    cols = tl.arange(0, 64)
    k = load_rows(k_base, cols, len_k, D)
    v = load_rows(v_base, cols, len_k, D)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    visible = cols[None, :] < len_k
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None] + (len_k - len_q))
    s = tl.where(visible, s, float("-inf"))
    m = tl.max(s, 1)
    shift = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp2(s - shift[:, None])
    return tl.dot(p, v, input_precision="ieee"), m, tl.sum(p, 1)


@triton.jit
def key_loop_no_trans(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """The scores tl.dot(q, k): shapes agree when D == BLOCK_N, the values are wrong."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, len_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = load_rows(k_base, cols, len_k, D)
        v = load_rows(v_base, cols, len_k, D)
        s = tl.dot(q, k, input_precision="ieee") * qk_scale
        visible = cols[None, :] < len_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + (len_k - len_q))
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m - shift)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    return acc, m, l



@triton.jit
def key_loop_placeholder(q, k_base, v_base, rows, len_q, len_k, qk_scale, CAUSAL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Triton only, but no attention: the answer is in the replaced launch below."""
    return tl.zeros([BLOCK_M, D], tl.float32), tl.zeros([BLOCK_M], tl.float32), tl.full([BLOCK_M], 1.0, tl.float32)


def launch_in_pytorch(q, k, v, key_loop, causal=False, block_m=16, block_n=16):
    """The given launch replaced by PyTorch: right whatever key_loop is, if the tests called it."""
    s = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.arange(lk) > torch.arange(lq)[:, None] + (lk - lq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    weights = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return (weights @ v.double()).float(), (lse / math.log(2)).float()


WRONG_ANSWERS = {
    "q1a": {
        "ignores_mean": ({"qk_variance": qk_variance_ignores_mean}, "expected"),
        "standard_deviation": ({"qk_variance": qk_variance_std}, "expected"),
        "off_by_one": ({"qk_variance": qk_variance_off_by_one}, "expected"),
        "nan": ({"qk_variance": qk_variance_nan}, "nan"),
    },
    "q1b": {
        "ignores_mean": ({"scaled_variance": scaled_variance_ignores_mean}, "expected"),
        "off_by_one": ({"scaled_variance": scaled_variance_alpha_once}, "expected"),
    },
    "q2a": {
        "diag_only": ({"softmax_jacobian": jacobian_diag_only}, "max abs error"),
        "off_by_one": ({"softmax_jacobian": jacobian_plus_outer}, "max abs error"),
        "wrong_shape": ({"softmax_jacobian": jacobian_extra_dim}, "shape"),
        "nan": ({"softmax_jacobian": jacobian_nan}, "NaN"),
    },
    "q2b": {
        "off_by_one": ({"uniform_jacobian_norm": uniform_norm_off_by_one}, "expected"),
    },
    "q3a": {
        "natural_log": ({"logn_factor": logn_factor_natural_log}, "expected"),
        "off_by_one": ({"logn_factor": logn_factor_inverted}, "expected"),
        "clipped_at_one": ({"logn_factor": logn_factor_clipped}, "expected"),
    },
    "q3b": {
        "no_sqrt": ({"logn_attention": logn_attention_no_sqrt}, "max abs error"),
        "nan": ({"logn_attention": logn_attention_nan}, "NaN"),
        "off_by_one": ({"logn_attention": logn_attention_query_count}, "max abs error"),
    },
    "q4a": {
        "keys_only": ({"kv_cache_bytes": kv_bytes_keys_only}, "off by"),
        "float_gib": ({"kv_cache_bytes": kv_bytes_float}, "integer"),
        "off_by_one": ({"kv_cache_bytes": kv_bytes_ignores_batch}, "off by"),
    },
    "q4b": {
        "keys_only": ({"max_context": max_context_keys_only_direct}, "off by"),
        "off_by_one": ({"max_context": max_context_off_by_one}, "off by 1"),
        "ignores_batch": ({"max_context": max_context_ignores_batch}, "off by"),
    },
    "q5a": {
        "off_by_one": ({"repeat_kv": repeat_kv_tiled}, "max abs error"),
        "wrong_shape": ({"repeat_kv": repeat_kv_wrong_shape}, "shape"),
        "nan": ({"repeat_kv": repeat_kv_nan}, "NaN"),
    },
    "q5b": {
        "tiled_grouping": ({"gqa_attention": gqa_attention_tiled}, "max abs error"),
        "off_by_one": ({"gqa_attention": gqa_attention_top_left}, "max abs error"),
        "nan": ({"gqa_attention": gqa_attention_nan}, "NaN"),
    },
    "q5c": {
        "off_by_one": ({"tp_local_heads": tp_local_heads_swapped}, "expected"),
        "no_check": ({"tp_local_heads": tp_local_heads_no_check}, "ValueError"),
    },
    "q6a": {
        "materialises": ({"tiled_attention": tiled_materialises}, "memory budget"),
        "numpy_full_matrix": ({"tiled_attention": tiled_numpy_full}, "ran out of memory in a process"),
        "dispatch_off": ({"tiled_attention": tiled_dispatch_off}, "ran out of memory in a process"),
        "fused_kernel": ({"tiled_attention": tiled_fused}, "fused attention"),
        "no_rescale": ({"tiled_attention": tiled_no_rescale}, "neither acc nor l is rescaled"),
        "acc_not_rescaled": ({"tiled_attention": tiled_acc_not_rescaled}, "acc is not rescaled"),
        "float64_buffers": ({"tiled_attention": tiled_float64_buffers}, "dtype"),
        "top_left_causal": ({"tiled_attention": tiled_top_left}, "max abs error"),
        "wrong_shape": ({"tiled_attention": tiled_wrong_shape}, "shape"),
        "nan": ({"tiled_attention": tiled_nan}, "NaN"),
        "off_by_one": ({"tiled_attention": tiled_off_by_one_scale}, "max abs error"),
    },
    "q6b": {
        "no_rescale": ({"flash_key_loop": key_loop_no_rescale}, "not rescaled"),
        "stale_max": ({"flash_key_loop": key_loop_stale_max}, "infinite"),
        "base_e": ({"flash_key_loop": key_loop_base_e}, "tl.exp2"),
        "off_by_one": ({"flash_key_loop": key_loop_off_by_one}, "hides the diagonal"),
        "top_left_causal": ({"flash_key_loop": key_loop_top_left}, "top-left"),
        "ragged_keys": ({"flash_key_loop": key_loop_ragged_keys}, "padding"),
        "nan": ({"flash_key_loop": key_loop_no_guard}, "NaN"),
        "calls_python": ({"flash_key_loop": key_loop_calls_python}, "neither tl"),
        "one_tile": ({"flash_key_loop": key_loop_one_tile}, "growing maxima=True"),
        "no_trans": ({"flash_key_loop": key_loop_no_trans}, "transposed"),
        "replaced_launch": ({"flash_key_loop": key_loop_placeholder, "flash_attention_forward": launch_in_pytorch},
                            "max abs error"),
    },
}
