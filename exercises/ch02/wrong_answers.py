"""Deliberately wrong answers to the Chapter 2 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests (every
requirement a question states is in a public check) and all its hidden tests (zero points),
with messages of which at least one contains ``keyword``. ``TAMPER_BASE`` names the variant
the tampering checks use (wrong values of the right shape, what a broken comparison would let
through). The tests add two generic variants to every part themselves (an exception and an
endless loop), so they are not listed here.
"""
import math

import torch
from torch import nn

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1a: sdpa
def _sdpa(q, k, v, mask=None, *, scale=None, fix_empty_rows=True, shift=True):
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if not fix_empty_rows:
        weights = torch.softmax(scores, dim=-1)                   # an all-masked row becomes 0/0 = NaN
        return weights @ v, weights
    m = scores.amax(-1, keepdim=True) if shift else torch.zeros_like(scores[..., :1])
    e = torch.exp(scores - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    total = e.sum(-1, keepdim=True)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    return weights @ v, weights


def sdpa_wrong_shape(q, k, v, mask=None):
    out, weights = _sdpa(q, k, v, mask)
    return out[..., :-1, :], weights                              # drops the last query


def sdpa_nan(q, k, v, mask=None):
    return _sdpa(q, k, v, mask, fix_empty_rows=False)


def sdpa_scale_by_d(q, k, v, mask=None):
    return _sdpa(q, k, v, mask, scale=1 / q.shape[-1])           # 1/d_k instead of 1/sqrt(d_k)


def sdpa_mask_inverted(q, k, v, mask=None):
    return _sdpa(q, k, v, None if mask is None else ~mask)        # True = ignore


def sdpa_no_max_shift(q, k, v, mask=None):
    return _sdpa(q, k, v, mask, shift=False)                      # exp of large scores overflows


# ----------------------------------------------------------------------------- q1b: misplaced_weights
def misplaced_but_normalised(q, k):
    return torch.softmax(q @ k.transpose(-2, -1), -1)             # "fixes" the formula: rows sum to 1


def misplaced_overflows(q, k):
    e = torch.exp(q @ k.transpose(-2, -1))                        # no shift: inf / inf for large scores
    return e / (math.sqrt(q.shape[-1]) * e.sum(-1, keepdim=True))


def misplaced_scale_by_d(q, k):
    return torch.softmax(q @ k.transpose(-2, -1), -1) / q.shape[-1]


# ----------------------------------------------------------------------------- q2a: equivariance_error
def error_nan(f, x, perm):
    return float("nan")


def error_of_invariance(f, x, perm):
    with torch.no_grad():
        return float((f(x[:, perm]) - f(x)).abs().max())          # compares with the unshuffled output


def error_inverse_permutation(f, x, perm):
    with torch.no_grad():
        return float((f(x[:, perm]) - f(x)[:, torch.argsort(perm)]).abs().max())


# ----------------------------------------------------------------------------- q2b: PooledReadout
class ReadoutWrongShape(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x)                                        # no pooling: (B, L, d_out)


class ReadoutOffByOne(ReadoutWrongShape):
    def forward(self, x):
        return self.body(x).sum(dim=1) / max(x.shape[1] - 1, 1)    # divides by L - 1


class ReadoutFirstToken(ReadoutWrongShape):
    def forward(self, x):
        return self.body(x)[:, 0]                                  # not invariant


# ----------------------------------------------------------------------------- q3: mha_loop, mha_reshape
def _heads(x, W_q, W_k, W_v, b_q, b_k, b_v, n_heads, mask, scale):
    b, length, d = x.shape
    d_h = d // n_heads

    def split(t):
        return t.view(b, length, n_heads, d_h).transpose(1, 2)

    q, k, v = split(x @ W_q + b_q), split(x @ W_k + b_k), split(x @ W_v + b_v)
    scores = q @ k.transpose(-2, -1) * scale(d, d_h)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v                           # (B, H, L, d_h)


def mha(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None, *, scale=lambda d, d_h: d_h ** -0.5):
    heads = _heads(x, W_q, W_k, W_v, b_q, b_k, b_v, n_heads, mask, scale)
    return heads.transpose(1, 2).reshape(x.shape) @ W_o + b_o


def mha_wrong_shape(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None):
    return _heads(x, W_q, W_k, W_v, b_q, b_k, b_v, n_heads, mask, lambda d, d_h: d_h ** -0.5)   # no concat, no W^O


def mha_nan(*args, **kwargs):
    return mha(*args, **kwargs) * float("nan")


def mha_scale_by_d(*args, **kwargs):
    return mha(*args, **kwargs, scale=lambda d, d_h: d ** -0.5)    # 1/sqrt(d) instead of 1/sqrt(d_h)


def mha_mask_ignored(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None):
    return mha(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads)


def mha_input_chunks(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None):
    """E2.3: head h reads only input chunk h, through the diagonal block of each projection."""
    d_h = x.shape[-1] // n_heads
    heads = []
    for h in range(n_heads):
        s = slice(h * d_h, (h + 1) * d_h)
        xh = x[..., s]
        q, k, v = xh @ W_q[s, s] + b_q[s], xh @ W_k[s, s] + b_k[s], xh @ W_v[s, s] + b_v[s]
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_h)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v)
    return torch.cat(heads, -1) @ W_o + b_o


def mha_reshape_no_transpose(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None):
    heads = _heads(x, W_q, W_k, W_v, b_q, b_k, b_v, n_heads, mask, lambda d, d_h: d_h ** -0.5)
    return heads.reshape(x.shape) @ W_o + b_o                     # (B, H, L, d_h) read as (B, L, d): mixed up


# ----------------------------------------------------------------------------- q4: online softmax
def normaliser(values):
    m, d, maxes, denominators = float("-inf"), 0.0, [], []
    for x in values:
        m_new = max(m, x)
        d = d * math.exp(m - m_new) + math.exp(x - m_new)
        m = m_new
        maxes.append(m)
        denominators.append(d)
    return maxes, denominators


def normaliser_no_rescale(values):
    m, d, maxes, denominators = float("-inf"), 0.0, [], []
    for x in values:
        m = max(m, x)
        d = d + math.exp(x - m)                                    # forgets exp(m_old - m_new) on the old sum
        maxes.append(m)
        denominators.append(d)
    return maxes, denominators


def normaliser_last_only(values):
    maxes, denominators = normaliser(values)
    return maxes[-1:], denominators[-1:]                           # only the final m and d


def normaliser_naive(values):
    m, total, maxes, denominators = float("-inf"), 0.0, [], []
    for x in values:
        m = max(m, x)
        total += float(torch.exp(torch.tensor(x, dtype=torch.float64)))    # e^x itself overflows in the thousands
        maxes.append(m)
        denominators.append(total * float(torch.exp(torch.tensor(-m, dtype=torch.float64))))
    return maxes, denominators


def softmax_from(values, normalise=normaliser):
    seen = list(values)
    maxes, denominators = normalise(iter(seen))
    return torch.tensor([math.exp(x - maxes[-1]) / denominators[-1] for x in seen], dtype=torch.float64)


def softmax_wrong_shape(values):
    return softmax_from(values)[:, None]                           # (n, 1)


def softmax_naive(values):
    e = torch.exp(torch.tensor(list(values), dtype=torch.float64))  # no max shift: overflows or underflows
    return e / e.sum()


def softmax_no_rescale(values):
    return softmax_from(values, normaliser_no_rescale)


def softmax_two_passes(values):
    m = max(values)                                                # the first pass empties the generator...
    e = [math.exp(x - m) for x in values]                          # ...so this one sees nothing
    return torch.tensor(e, dtype=torch.float64) / max(sum(e), 1e-300)


def softmax_float32(values):
    return softmax_from(values).float()


# ----------------------------------------------------------------------------- q5: scores that cannot do the job
def checks(x, W):
    h = x @ W
    S = h @ h.T
    return bool(torch.linalg.eigvalsh(S).min() >= -1e-8), not torch.allclose(S, x @ x.T)


def checks_without_W(x, W):
    S = x @ x.T                                                    # forgets the projection
    return bool(torch.linalg.eigvalsh(S).min() >= -1e-8), not torch.allclose(S, x @ x.T)


def asymmetry(x, W_q, W_k):
    S = (x @ W_q) @ (x @ W_k).T
    return float(torch.linalg.norm(S - S.T))


def asymmetry_max_abs(x, W_q, W_k):
    S = (x @ W_q) @ (x @ W_k).T
    return float((S - S.T).abs().max())                            # not the Frobenius norm


def concat(q, k, w, dim=-1):
    d = q.shape[-1]
    return torch.softmax((q @ w[:d])[:, None] + (k @ w[d:])[None, :], dim=dim)


def concat_transposed(q, k, w):
    return concat(q, k, w).T                                       # (Lk, Lq)


def concat_nan(q, k, w):
    return concat(q, k, w) * float("nan")


def concat_over_queries(q, k, w):
    return concat(q, k, w, dim=0)                                  # normalises the columns


def concat_halves_swapped(q, k, w):
    d = q.shape[-1]
    return torch.softmax((q @ w[d:])[:, None] + (k @ w[:d])[None, :], dim=-1)


def flops_projection_once(L, d, d_h):
    return 2 * L * L * d, 2 * L * d * d_h + 2 * L * L * d_h        # projects only the queries


def flops_multiply_add_as_one(L, d, d_h):
    return L * L * d, 2 * L * d * d_h + L * L * d_h


WRONG_ANSWERS = {
    "q1a": {
        "wrong_shape": ({"sdpa": sdpa_wrong_shape}, "shape"),
        "nan": ({"sdpa": sdpa_nan}, "NaN"),
        "off_by_one": ({"sdpa": sdpa_scale_by_d}, "max abs error"),
        "mask_inverted": ({"sdpa": sdpa_mask_inverted}, "max abs error"),
        "no_max_shift": ({"sdpa": sdpa_no_max_shift}, "NaN"),
    },
    "q1b": {
        "off_by_one": ({"misplaced_weights": misplaced_scale_by_d}, "max abs error"),
        "normalised_misprint": ({"misplaced_weights": misplaced_but_normalised}, "max abs error"),
        "overflows": ({"misplaced_weights": misplaced_overflows}, "NaN"),
    },
    "q2a": {
        "nan": ({"equivariance_error": error_nan}, "nan"),
        "off_by_one": ({"equivariance_error": error_inverse_permutation}, "equivariant"),
        "invariance_instead": ({"equivariance_error": error_of_invariance}, "equivariant"),
    },
    "q2b": {
        "wrong_shape": ({"PooledReadout": ReadoutWrongShape}, "shape"),
        "off_by_one": ({"PooledReadout": ReadoutOffByOne}, "max abs error"),
        "first_token": ({"PooledReadout": ReadoutFirstToken}, "max abs error"),
    },
    "q3a": {
        "wrong_shape": ({"mha_loop": mha_wrong_shape}, "shape"),
        "nan": ({"mha_loop": mha_nan}, "NaN"),
        "off_by_one": ({"mha_loop": mha_scale_by_d}, "max abs error"),
        "mask_ignored": ({"mha_loop": mha_mask_ignored}, "max abs error"),
        "input_chunks": ({"mha_loop": mha_input_chunks}, "max abs error"),
    },
    "q3b": {
        "wrong_shape": ({"mha_reshape": mha_wrong_shape}, "shape"),
        "off_by_one": ({"mha_reshape": mha_scale_by_d}, "max abs error"),
        "mask_ignored": ({"mha_reshape": mha_mask_ignored}, "max abs error"),
        "reshape_without_transpose": ({"mha_reshape": mha_reshape_no_transpose}, "max abs error"),
    },
    "q4a": {
        "off_by_one": ({"online_normaliser": normaliser_no_rescale}, "denominators"),
        "last_only": ({"online_normaliser": normaliser_last_only}, "expected"),
        "overflows": ({"online_normaliser": normaliser_naive}, "expected"),
    },
    "q4b": {
        "wrong_shape": ({"online_softmax": softmax_wrong_shape}, "shape"),
        "nan": ({"online_softmax": softmax_naive}, "NaN"),
        "off_by_one": ({"online_softmax": softmax_no_rescale}, "max abs error"),
        "two_passes": ({"online_softmax": softmax_two_passes}, "shape"),
        "float32": ({"online_softmax": softmax_float32}, "dtype"),
    },
    "q5a": {
        "checks_without_W": ({"shared_qk_checks": checks_without_W, "asymmetry": asymmetry}, "expected True, got False"),
        "off_by_one": ({"shared_qk_checks": checks, "asymmetry": asymmetry_max_abs}, "asymmetry"),
    },
    "q5b": {
        "wrong_shape": ({"linear_concat_weights": concat_transposed}, "shape"),
        "nan": ({"linear_concat_weights": concat_nan}, "NaN"),
        "off_by_one": ({"linear_concat_weights": concat_halves_swapped}, "max abs error"),
        "softmax_over_queries": ({"linear_concat_weights": concat_over_queries}, "max abs error"),
    },
    "q5c": {
        "off_by_one": ({"score_flops": flops_projection_once}, "off by -"),
        "multiply_add_as_one": ({"score_flops": flops_multiply_add_as_one}, "off by -"),
    },
}
