"""Deliberately wrong answers to the Chapter 7 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests (every
requirement a question states is in a public check) and all its hidden tests (zero points),
with messages of which at least one contains ``keyword``. ``TAMPER_BASE`` names the variant
the tampering checks use (wrong values of the right shape). The tests add two generic variants
to every part themselves (an exception and an endless loop), so they are not listed here.
"""
import math

import torch

TAMPER_BASE = "off_by_one"


def _rel(L):
    pos = torch.arange(L)
    return pos[:, None] - pos[None, :]                             # i - j


# ----------------------------------------------------------------------------- q1a: strided_pattern
def _strided(L, stride, *, local_width=None, two_sided=False, absolute=False):
    rel = _rel(L)
    span = rel.abs() if two_sided else rel
    local = (span >= 0) & (span < (stride if local_width is None else local_width))
    strided = (span >= 0) & ((torch.arange(L)[None, :].expand(L, L) if absolute else rel) % stride == 0)
    return {"local": local, "strided": strided, "union": local | strided}


def strided_local_one_too_wide(L, stride):
    return _strided(L, stride, local_width=stride + 1)             # the paper's {i - l, ..., i}: one key too many


def strided_two_sided(L, stride):
    return _strided(L, stride, two_sided=True)                     # not causal


def strided_from_position_zero(L, stride):
    return _strided(L, stride, absolute=True)                      # j % stride == 0 instead of (i - j) % stride


def strided_float_masks(L, stride):
    return {k: m.float() for k, m in _strided(L, stride).items()}


# ----------------------------------------------------------------------------- q1b: fixed_pattern
def _fixed(L, stride, c, *, first_cells=False, causal_summary=True, sliding_local=False):
    pos = torch.arange(L)
    past = pos[:, None] >= pos[None, :]
    if sliding_local:
        local = past & (_rel(L) < stride)                           # a sliding window, not the query's block
    else:
        local = past & (pos[:, None] // stride == pos[None, :] // stride)
    cells = (pos % stride < c) if first_cells else (pos % stride >= stride - c)
    summary = cells[None, :].expand(L, L) & (past if causal_summary else True)
    return {"local": local, "summary": summary, "union": local | summary}


def fixed_first_cells(L, stride, c):
    return _fixed(L, stride, c, first_cells=True)                  # the first c cells of each block


def fixed_summary_not_causal(L, stride, c):
    return _fixed(L, stride, c, causal_summary=False)              # ERRATA E7.1 taken literally


def fixed_sliding_local(L, stride, c):
    return _fixed(L, stride, c, sliding_local=True)


def fixed_float_masks(L, stride, c):
    return {k: m.float() for k, m in _fixed(L, stride, c).items()}


# ----------------------------------------------------------------------------- q2a: band_mask
def band_strict(L, window, causal=False):
    rel = _rel(L)
    return (rel < window) & (rel >= (0 if causal else -window))    # |i - j| < window: one neighbour short


def band_future(L, window, causal=False):
    rel = _rel(L)
    return (rel <= (0 if causal else window)) & (rel >= -window)   # causal band on the wrong side (j >= i)


def band_ignores_causal(L, window, causal=False):
    return _rel(L).abs() <= window


def band_float(L, window, causal=False):
    rel = _rel(L)
    return ((rel <= window) & (rel >= (0 if causal else -window))).float()


# ----------------------------------------------------------------------------- q2b: local_attention
def _local(q, k, v, window, causal=False, block_size=16, *, strict=False, use_causal=True, overlap=True,
           scale=None):
    length = q.shape[-2]
    causal = causal and use_causal
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    outs = []
    for start in range(0, length, block_size):
        stop = min(start + block_size, length)
        lo, hi = max(0, start - window), stop if causal else min(length, stop + window)
        if not overlap:
            lo, hi = start, stop                                   # each chunk sees only its own keys
        scores = q[..., start:stop, :] @ k[..., lo:hi, :].transpose(-2, -1) * scale
        rel = torch.arange(start, stop)[:, None] - torch.arange(lo, hi)[None, :]
        outside = ((rel >= window) if strict else (rel > window)) | (rel < (0 if causal else -window))
        outs.append(torch.softmax(scores.masked_fill(outside, float("-inf")), dim=-1) @ v[..., lo:hi, :])
    return torch.cat(outs, dim=-2)


def local_strict_band(q, k, v, window, causal=False, block_size=16):
    return _local(q, k, v, window, causal, block_size, strict=True)


def local_ignores_causal(q, k, v, window, causal=False, block_size=16):
    return _local(q, k, v, window, causal, block_size, use_causal=False)


def local_no_overlap(q, k, v, window, causal=False, block_size=16):
    return _local(q, k, v, window, causal, block_size, overlap=False)


def local_unscaled(q, k, v, window, causal=False, block_size=16):
    return _local(q, k, v, window, causal, block_size, scale=1.0)


def local_dense(q, k, v, window, causal=False, block_size=16):
    """Right values, but through the full L x L scores: over the memory budget."""
    rel = _rel(q.shape[-2])
    allowed = (rel <= window) & (rel >= (0 if causal else -window))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v



def local_numpy_full(q, k, v, window, causal=False, block_size=16):
    """Right values through the full L x L scores built in numpy, which no torch dispatch hook sees."""
    import numpy as np

    length = q.shape[-2]
    s = (q.numpy() @ np.swapaxes(k.numpy(), -1, -2)) / math.sqrt(q.shape[-1])
    rel = np.arange(length)[:, None] - np.arange(length)[None, :]
    s = np.where((rel <= window) & (rel >= (0 if causal else -window)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return torch.from_numpy((w / w.sum(-1, keepdims=True)) @ v.numpy()).to(q.dtype)


def local_dispatch_off(q, k, v, window, causal=False, block_size=16):
    with torch._C._DisableTorchDispatch():               # the full matrix with torch's dispatch hooks off
        return local_dense(q, k, v, window, causal, block_size)


# ----------------------------------------------------------------------------- q3a: lsh_buckets
def _lsh(x, rotations, *, negate_first=False, negate=True):
    proj = torch.einsum("...ld,rdb->...rlb", x, rotations)
    if not negate:
        return proj.argmax(dim=-1)                                 # only b/2 buckets used
    both = [-proj, proj] if negate_first else [proj, -proj]
    return torch.cat(both, dim=-1).argmax(dim=-1)


def lsh_negated_first(x, rotations):
    return _lsh(x, rotations, negate_first=True)                   # ids shifted by b/2


def lsh_no_negation(x, rotations):
    return _lsh(x, rotations, negate=False)


def lsh_rounds_last(x, rotations):
    return _lsh(x, rotations).transpose(-2, -1)                    # (..., L, n_rounds)


def lsh_float_ids(x, rotations):
    return _lsh(x, rotations).double()


# ----------------------------------------------------------------------------- q4a: rev_forward
def rev_forward_g_of_x1(F, G, x1, x2):
    return x1 + F(x2), x2 + G(x1)                                   # G reads the old half


def rev_forward_f_of_x1(F, G, x1, x2):
    y1 = x1 + F(x1)
    return y1, x2 + G(y1)


def rev_forward_swapped(F, G, x1, x2):
    y1 = x1 + F(x2)
    return x2 + G(y1), y1


# ----------------------------------------------------------------------------- q4b: rev_inverse
def rev_inverse_f_of_y2(F, G, y1, y2):
    return y1 - F(y2), y2 - G(y1)                                   # F needs the rebuilt x2, not y2


def rev_inverse_plus(F, G, y1, y2):
    x2 = y2 + G(y1)
    return y1 + F(x2), x2


def rev_inverse_swapped(F, G, y1, y2):
    x2 = y2 - G(y1)
    return x2, y1 - F(x2)


# ----------------------------------------------------------------------------- q5a: blockwise
def _blockwise(q, k, v, n_blocks, perm=None, *, inverse=False, scale=True, check=True, vague=False):
    length = q.shape[-2]
    if check and length % n_blocks:
        raise ValueError("the length is wrong" if vague else f"n_blocks={n_blocks} must divide L={length}")
    order = torch.arange(n_blocks) if perm is None else torch.as_tensor(perm)
    if inverse:
        order = torch.argsort(order)                               # key block a goes to query block perm[a]
    qb, kb, vb = (t.unflatten(-2, (n_blocks, length // n_blocks)) for t in (q, k, v))
    kb, vb = kb[..., order, :, :], vb[..., order, :, :]
    scores = qb @ kb.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    return (torch.softmax(scores, dim=-1) @ vb).flatten(-3, -2)


def blockwise_inverse_perm(q, k, v, n_blocks, perm=None):
    return _blockwise(q, k, v, n_blocks, perm, inverse=True)


def blockwise_unscaled(q, k, v, n_blocks, perm=None):
    return _blockwise(q, k, v, n_blocks, perm, scale=False)


def blockwise_vague_error(q, k, v, n_blocks, perm=None):
    return _blockwise(q, k, v, n_blocks, perm, vague=True)


def blockwise_no_error(q, k, v, n_blocks, perm=None):
    """Ragged blocks instead of an error: right where n_blocks divides L, silent elsewhere."""
    if q.shape[-2] % n_blocks == 0:
        return _blockwise(q, k, v, n_blocks, perm)
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)


def blockwise_dense(q, k, v, n_blocks, perm=None):
    """Right values through the full L x L scores and a block mask: over the memory budget."""
    length = q.shape[-2]
    if length % n_blocks:
        raise ValueError(f"n_blocks={n_blocks} must divide L={length}")
    order = torch.arange(n_blocks) if perm is None else torch.as_tensor(perm)
    block = torch.arange(length) // (length // n_blocks)
    allowed = order[block][:, None] == block[None, :]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


# ----------------------------------------------------------------------------- q6a: dca_positions
def _dca(L, pretrain_len, chunk, local_window, *, window_le=False, inter_true=False, last_window=False,
         by_distance=False, fill=-1, dtype=torch.int64):
    pos = torch.arange(L)
    inner, block = pos % chunk, pos // chunk
    gap = block[:, None] - block[None, :]
    if by_distance:                                                # "previous chunk" = within chunk tokens back
        dist = pos[:, None] - pos[None, :]
        gap = torch.where(gap == 0, 0, torch.where(dist < chunk, 1, 2))
    near = inner >= chunk - local_window if last_window else (
        inner <= local_window if window_le else inner < local_window)
    successive = torch.where(near, chunk + inner, pretrain_len - 1)
    query = torch.where(gap == 0, inner[:, None], torch.where(gap == 1, successive[:, None], pretrain_len - 1))
    rel = query - inner[None, :]
    if inter_true:
        rel = torch.where(gap > 1, pos[:, None] - pos[None, :], rel)
    return torch.where(pos[:, None] >= pos[None, :], rel, fill).to(dtype)


def dca_window_inclusive(L, pretrain_len, chunk, local_window):
    return _dca(L, pretrain_len, chunk, local_window, window_le=True)      # local_window + 1 queries keep it


def dca_inter_true_distance(L, pretrain_len, chunk, local_window):
    return _dca(L, pretrain_len, chunk, local_window, inter_true=True)     # no re-mapping for older chunks


def dca_last_queries_window(L, pretrain_len, chunk, local_window):
    return _dca(L, pretrain_len, chunk, local_window, last_window=True)    # the last w queries, not the first


def dca_previous_by_distance(L, pretrain_len, chunk, local_window):
    return _dca(L, pretrain_len, chunk, local_window, by_distance=True)    # "previous chunk" by distance


def dca_zero_above(L, pretrain_len, chunk, local_window):
    return _dca(L, pretrain_len, chunk, local_window, fill=0)              # 0, not -1, where j > i


def dca_int32(L, pretrain_len, chunk, local_window):
    return _dca(L, pretrain_len, chunk, local_window, dtype=torch.int32)



WRONG_ANSWERS = {
    "q1a": {
        "off_by_one": ({"strided_pattern": strided_local_one_too_wide}, "differ"),
        "two_sided": ({"strided_pattern": strided_two_sided}, "differ"),
        "from_position_zero": ({"strided_pattern": strided_from_position_zero}, "differ"),
        "float_masks": ({"strided_pattern": strided_float_masks}, "dtype"),
    },
    "q1b": {
        "off_by_one": ({"fixed_pattern": fixed_first_cells}, "differ"),
        "summary_not_causal": ({"fixed_pattern": fixed_summary_not_causal}, "differ"),
        "sliding_local": ({"fixed_pattern": fixed_sliding_local}, "differ"),
        "float_masks": ({"fixed_pattern": fixed_float_masks}, "dtype"),
    },
    "q2a": {
        "off_by_one": ({"band_mask": band_strict}, "differ"),
        "future": ({"band_mask": band_future}, "differ"),
        "ignores_causal": ({"band_mask": band_ignores_causal}, "differ"),
        "float_mask": ({"band_mask": band_float}, "dtype"),
    },
    "q2b": {
        "off_by_one": ({"local_attention": local_strict_band}, "output"),
        "ignores_causal": ({"local_attention": local_ignores_causal}, "max abs error"),
        "no_overlap": ({"local_attention": local_no_overlap}, "max abs error"),
        "unscaled": ({"local_attention": local_unscaled}, "max abs error"),
        "dense": ({"local_attention": local_dense}, "memory budget"),
        "numpy_full_matrix": ({"local_attention": local_numpy_full}, "ran out of memory in a process"),
        "dispatch_off": ({"local_attention": local_dispatch_off}, "ran out of memory in a process"),
    },
    "q3a": {
        "off_by_one": ({"lsh_buckets": lsh_negated_first}, "differ"),
        "no_negation": ({"lsh_buckets": lsh_no_negation}, "differ"),
        "rounds_last": ({"lsh_buckets": lsh_rounds_last}, "shape"),
        "float_ids": ({"lsh_buckets": lsh_float_ids}, "dtype"),
    },
    "q4a": {
        "off_by_one": ({"rev_forward": rev_forward_g_of_x1}, "max abs error"),
        "f_of_x1": ({"rev_forward": rev_forward_f_of_x1}, "max abs error"),
        "swapped": ({"rev_forward": rev_forward_swapped}, "max abs error"),
    },
    "q4b": {
        "off_by_one": ({"rev_inverse": rev_inverse_f_of_y2}, "max abs error"),
        "plus_signs": ({"rev_inverse": rev_inverse_plus}, "max abs error"),
        "swapped": ({"rev_inverse": rev_inverse_swapped}, "max abs error"),
    },
    "q5a": {
        "off_by_one": ({"blockwise": blockwise_inverse_perm}, "max abs error"),
        "unscaled": ({"blockwise": blockwise_unscaled}, "max abs error"),
        "vague_error": ({"blockwise": blockwise_vague_error}, "message names n_blocks"),
        "no_error": ({"blockwise": blockwise_no_error}, "expected 'ValueError'"),
        "dense": ({"blockwise": blockwise_dense}, "memory budget"),
    },
    "q6a": {
        "off_by_one": ({"dca_positions": dca_window_inclusive}, "entries differ"),
        "inter_true_distance": ({"dca_positions": dca_inter_true_distance}, "entries differ"),
        "last_queries": ({"dca_positions": dca_last_queries_window}, "entries differ"),
        "previous_by_distance": ({"dca_positions": dca_previous_by_distance}, "entries differ"),
        "zero_above": ({"dca_positions": dca_zero_above}, "entries differ"),
        "int32": ({"dca_positions": dca_int32}, "dtype"),
    },
}
