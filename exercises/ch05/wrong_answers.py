"""Deliberately wrong answers to the Chapter 5 exercises, used by tests/test_exercises.py.

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

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1a: xl_memory_update
def _xl(mem, h, mem_len, *, keep_oldest=False, extra=0, detach=True):
    both = h if mem is None else torch.cat([mem, h], dim=1)
    keep = min(mem_len + extra, both.shape[1])
    out = both[:, :keep] if keep_oldest else both[:, both.shape[1] - keep:]
    return out.detach() if detach else out


def xl_one_row_too_many(mem, h, mem_len):
    return _xl(mem, h, mem_len, extra=1)                           # keeps mem_len + 1 rows


def xl_keeps_oldest(mem, h, mem_len):
    return _xl(mem, h, mem_len, keep_oldest=True)                  # the first mem_len rows, not the last


def xl_no_stop_gradient(mem, h, mem_len):
    return _xl(mem, h, mem_len, detach=False)                      # backpropagates into the past segment


# ----------------------------------------------------------------------------- q2a: compressive_update
def _compressive(mem, cmem, h, mem_len, cmem_len, ratio, *, drop_newest=False, pool="mean", evicted=True,
                 cmem_oldest=False):
    queue = torch.cat([mem, h], dim=1)
    n_old = max(0, queue.shape[1] - mem_len)
    old, new_mem = queue[:, :n_old], queue[:, n_old:]
    if not evicted:
        old = h                                                    # compresses the new segment instead
    n = old.shape[1]
    old = old[:, :n - n % ratio] if drop_newest else old[:, n % ratio:]
    groups = old.reshape(old.shape[0], n // ratio, ratio, old.shape[-1])
    pooled = groups.mean(2) if pool == "mean" else groups.amax(2)
    both = torch.cat([cmem, pooled], dim=1)
    keep = min(cmem_len, both.shape[1])
    return new_mem, (both[:, :keep] if cmem_oldest else both[:, both.shape[1] - keep:])


def compressive_drops_newest(mem, cmem, h, mem_len, cmem_len, ratio):
    return _compressive(mem, cmem, h, mem_len, cmem_len, ratio, drop_newest=True)


def compressive_max_pool(mem, cmem, h, mem_len, cmem_len, ratio):
    return _compressive(mem, cmem, h, mem_len, cmem_len, ratio, pool="max")


def compressive_of_segment(mem, cmem, h, mem_len, cmem_len, ratio):
    return _compressive(mem, cmem, h, mem_len, cmem_len, ratio, evicted=False)


def compressive_keeps_oldest_cmem(mem, cmem, h, mem_len, cmem_len, ratio):
    return _compressive(mem, cmem, h, mem_len, cmem_len, ratio, cmem_oldest=True)


# ----------------------------------------------------------------------------- q3a: knn_next_token
def _knn(q, keys, vals, k, vocab, temp=1.0, *, sign=-1.0, squared=True, add=True, use_temp=True):
    dists = (q[:, None, :] - keys[None, :, :]).square().sum(-1)
    near, idx = dists.topk(k, dim=-1, largest=False)
    if not squared:
        near = near.sqrt()
    weights = torch.softmax(sign * near / (temp if use_temp else 1.0), dim=-1)
    p = torch.zeros(q.shape[0], vocab, dtype=q.dtype)
    return p.scatter_add(1, vals[idx], weights) if add else p.scatter(1, vals[idx], weights)


def knn_plus_sign(q, keys, vals, k, vocab, temp=1.0):
    return _knn(q, keys, vals, k, vocab, temp, sign=1.0)           # far keys weigh more (ERRATA E5.5)


def knn_not_squared(q, keys, vals, k, vocab, temp=1.0):
    return _knn(q, keys, vals, k, vocab, temp, squared=False)


def knn_overwrites(q, keys, vals, k, vocab, temp=1.0):
    return _knn(q, keys, vals, k, vocab, temp, add=False)          # same-token neighbours do not add up


def knn_ignores_temp(q, keys, vals, k, vocab, temp=1.0):
    return _knn(q, keys, vals, k, vocab, temp, use_temp=False)


# ----------------------------------------------------------------------------- q3b: knn_lm_mix
def mix_swapped(p_lm, p_knn, lam):
    return lam * p_lm + (1.0 - lam) * p_knn                        # lam weighs the model instead


def mix_unnormalised(p_lm, p_knn, lam):
    return lam * p_knn + p_lm                                      # forgets 1 - lam


# ----------------------------------------------------------------------------- q4a: titans_write
def _titans(M, S, k, v, lr, momentum, decay, *, factor=2.0, transpose=False, sign=-1.0, use_momentum=True,
            decay_all=False):
    err = k @ M - v
    grad = factor * (torch.outer(err, k) if transpose else torch.outer(k, err))
    S_new = (momentum * S if use_momentum else 0.0) + sign * lr * grad
    return ((1.0 - decay) * (M + S_new) if decay_all else (1.0 - decay) * M + S_new), S_new


def titans_no_factor_two(M, S, k, v, lr, momentum, decay):
    return _titans(M, S, k, v, lr, momentum, decay, factor=1.0)          # the gradient of |kM - v|^2 / 2


def titans_transposed(M, S, k, v, lr, momentum, decay):
    return _titans(M, S, k, v, lr, momentum, decay, transpose=True)      # (kM - v)^T k: the column convention


def titans_ascent(M, S, k, v, lr, momentum, decay):
    return _titans(M, S, k, v, lr, momentum, decay, sign=1.0)            # climbs the loss


def titans_no_momentum(M, S, k, v, lr, momentum, decay):
    return _titans(M, S, k, v, lr, momentum, decay, use_momentum=False)  # drops eta S


def titans_forgets_update(M, S, k, v, lr, momentum, decay):
    return _titans(M, S, k, v, lr, momentum, decay, decay_all=True)      # (1 - alpha)(M + S'): forgets the new step too


# ----------------------------------------------------------------------------- q4b: hebbian_reads
def _hebbian(q, k, v, *, read_first=False, normalise=False, causal=True):
    M = torch.zeros(k.shape[1], v.shape[1], dtype=k.dtype)
    z = torch.zeros(k.shape[1], dtype=k.dtype)
    total = k.T @ v
    reads = []
    for t in range(k.shape[0]):
        if read_first:
            reads.append(q[t] @ M)
        M, z = M + torch.outer(k[t], v[t]), z + k[t]
        if not read_first:
            state = M if causal else total
            reads.append(q[t] @ state / (q[t] @ z if normalise else 1.0))
    return torch.stack(reads)


def hebbian_reads_before_write(q, k, v):
    return _hebbian(q, k, v, read_first=True)                            # o_t = q_t M_{t-1}


def hebbian_normalised(q, k, v):
    return _hebbian(q, k, v, normalise=True)                             # divides by q_t . sum k_s


def hebbian_not_causal(q, k, v):
    return _hebbian(q, k, v, causal=False)                               # reads the final state: sees the future


# ----------------------------------------------------------------------------- q5a: xl_mask
def _mask(seg_len, mem_len, window=None, *, top_left=False, self_too=True, window_extra=0, inverted=False,
          as_float=False):
    pos = torch.arange(seg_len).unsqueeze(1) + (0 if top_left else mem_len)
    j = torch.arange(mem_len + seg_len)
    allowed = j <= pos if self_too else j < pos
    if window is not None:
        allowed &= pos - j <= window + window_extra
    allowed = ~allowed if inverted else allowed
    return allowed.float() if as_float else allowed


def mask_top_left(seg_len, mem_len, window=None):
    return _mask(seg_len, mem_len, window, top_left=True)                # query i at position i: ignores the memory


def mask_excludes_self(seg_len, mem_len, window=None):
    return _mask(seg_len, mem_len, window, self_too=False)


def mask_window_too_wide(seg_len, mem_len, window=None):
    return _mask(seg_len, mem_len, window, window_extra=1)               # w + 2 keys


def mask_inverted(seg_len, mem_len, window=None):
    return _mask(seg_len, mem_len, window, inverted=True)                # True = masked out


def mask_float(seg_len, mem_len, window=None):
    return _mask(seg_len, mem_len, window, as_float=True)                # 0/1 floats, not booleans


# ----------------------------------------------------------------------------- q6a: knn_memory_attention
def _knn_attention(q, k, v, mem_k, mem_v, topk, gate_logit, *, gate_swapped=False, largest=True, l2=False,
                   every_entry=False, causal=True, sigmoid=True):
    scale = 1.0 / math.sqrt(q.shape[-1])
    length = q.shape[-2]
    scores = q @ k.transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), float("-inf"))
    local = torch.softmax(scores, dim=-1) @ v
    mem_scores = q @ mem_k.transpose(-1, -2)
    rank = -torch.cdist(q, mem_k) if l2 else mem_scores
    _, idx = rank.topk(mem_k.shape[-2] if every_entry else topk, dim=-1, largest=largest)
    weights = torch.softmax(mem_scores.gather(-1, idx) * scale, dim=-1)
    picked = mem_v.unsqueeze(-3).expand(*idx.shape[:-1], *mem_v.shape[-2:])
    picked = picked.gather(-2, idx.unsqueeze(-1).expand(*idx.shape, mem_v.shape[-1]))
    from_memory = (weights.unsqueeze(-2) @ picked).squeeze(-2)
    g = (torch.sigmoid(gate_logit) if sigmoid else gate_logit)[:, None, None]
    return (g * local + (1 - g) * from_memory) if gate_swapped else (g * from_memory + (1 - g) * local)


def knn_gate_swapped(q, k, v, mem_k, mem_v, topk, gate_logit):
    return _knn_attention(q, k, v, mem_k, mem_v, topk, gate_logit, gate_swapped=True)   # g weighs the local part


def knn_smallest(q, k, v, mem_k, mem_v, topk, gate_logit):
    return _knn_attention(q, k, v, mem_k, mem_v, topk, gate_logit, largest=False)     # the worst matches


def knn_by_l2(q, k, v, mem_k, mem_v, topk, gate_logit):
    return _knn_attention(q, k, v, mem_k, mem_v, topk, gate_logit, l2=True)           # nearest in L2, not by q . m


def knn_every_entry(q, k, v, mem_k, mem_v, topk, gate_logit):
    return _knn_attention(q, k, v, mem_k, mem_v, topk, gate_logit, every_entry=True)  # ignores topk


def knn_local_not_causal(q, k, v, mem_k, mem_v, topk, gate_logit):
    return _knn_attention(q, k, v, mem_k, mem_v, topk, gate_logit, causal=False)      # sees later tokens


def knn_gate_without_sigmoid(q, k, v, mem_k, mem_v, topk, gate_logit):
    return _knn_attention(q, k, v, mem_k, mem_v, topk, gate_logit, sigmoid=False)     # the logit as the gate


WRONG_ANSWERS = {
    "q1a": {
        "wrong_shape": ({"xl_memory_update": xl_one_row_too_many}, "shape"),
        "off_by_one": ({"xl_memory_update": xl_keeps_oldest}, "max abs error"),
        "no_stop_gradient": ({"xl_memory_update": xl_no_stop_gradient}, "expected True, got False"),
    },
    "q2a": {
        "off_by_one": ({"compressive_update": compressive_drops_newest}, "max abs error"),
        "max_pool": ({"compressive_update": compressive_max_pool}, "max abs error"),
        "compresses_segment": ({"compressive_update": compressive_of_segment}, "cmem"),
        "cmem_keeps_oldest": ({"compressive_update": compressive_keeps_oldest_cmem}, "max abs error"),
    },
    "q3a": {
        "off_by_one": ({"knn_next_token": knn_plus_sign}, "max abs error"),
        "not_squared": ({"knn_next_token": knn_not_squared}, "max abs error"),
        "overwrites": ({"knn_next_token": knn_overwrites}, "max abs error"),
        "ignores_temp": ({"knn_next_token": knn_ignores_temp}, "max abs error"),
    },
    "q3b": {
        "off_by_one": ({"knn_lm_mix": mix_swapped}, "max abs error"),
        "unnormalised": ({"knn_lm_mix": mix_unnormalised}, "max abs error"),
    },
    "q4a": {
        "off_by_one": ({"titans_write": titans_no_factor_two}, "max abs error"),
        "transposed": ({"titans_write": titans_transposed}, "max abs error"),
        "ascent": ({"titans_write": titans_ascent}, "max abs error"),
        "no_momentum": ({"titans_write": titans_no_momentum}, "S_new"),
        "forgets_update": ({"titans_write": titans_forgets_update}, "M_new"),
    },
    "q4b": {
        "off_by_one": ({"hebbian_reads": hebbian_reads_before_write}, "max abs error"),
        "normalised": ({"hebbian_reads": hebbian_normalised}, "max abs error"),
        "not_causal": ({"hebbian_reads": hebbian_not_causal}, "max abs error"),
    },
    "q5a": {
        "off_by_one": ({"xl_mask": mask_excludes_self}, "got False, expected True"),
        "top_left": ({"xl_mask": mask_top_left}, "got False, expected True"),
        "window_too_wide": ({"xl_mask": mask_window_too_wide}, "got True, expected False"),
        "inverted": ({"xl_mask": mask_inverted}, "entries differ"),
        "float_mask": ({"xl_mask": mask_float}, "dtype"),
    },
    "q6a": {
        "off_by_one": ({"knn_memory_attention": knn_gate_swapped}, "max abs error"),
        "smallest": ({"knn_memory_attention": knn_smallest}, "max abs error"),
        "by_l2": ({"knn_memory_attention": knn_by_l2}, "max abs error"),
        "every_entry": ({"knn_memory_attention": knn_every_entry}, "max abs error"),
        "not_causal": ({"knn_memory_attention": knn_local_not_causal}, "max abs error"),
        "no_sigmoid": ({"knn_memory_attention": knn_gate_without_sigmoid}, "max abs error"),
    },
}
