"""Deliberately wrong answers to the Chapter 8 exercises, used by tests/test_exercises.py.

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
import torch.nn.functional as F

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1a: linear_attention_recurrent
def _recurrent(q, k, v, eps=1e-6, *, read_first=False, normalise=True, phi=None, causal=True, transpose=False,
               fixed_eps=False):
    phi = phi or (lambda x: F.elu(x) + 1)
    eps = 1e-6 if fixed_eps else eps
    fq, fk = phi(q), phi(k)
    S = q.new_zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    z = q.new_zeros(q.shape[:-2] + (q.shape[-1],))
    outs = []
    for t in range(q.shape[-2]):
        if read_first:                                             # reads the state before writing token t
            outs.append(((fq[..., t, :, None] * S).sum(-2), (fq[..., t, :] * z).sum(-1, keepdim=True)))
        S = S + fk[..., t, :, None] * v[..., t, None, :]
        z = z + fk[..., t, :]
        if not read_first:
            outs.append(((fq[..., t, :, None] * S).sum(-2), (fq[..., t, :] * z).sum(-1, keepdim=True)))
    if not causal:                                                 # every query reads the final state
        outs = [((fq[..., t, :, None] * S).sum(-2), (fq[..., t, :] * z).sum(-1, keepdim=True))
                for t in range(q.shape[-2])]
    out = torch.stack([num / (den + eps) if normalise else num for num, den in outs], dim=-2)
    return out, (S.transpose(-2, -1) if transpose else S), z


def recurrent_reads_before_writing(q, k, v, eps=1e-6):
    return _recurrent(q, k, v, eps, read_first=True)


def recurrent_no_normaliser(q, k, v, eps=1e-6):
    return _recurrent(q, k, v, eps, normalise=False)


def recurrent_relu_features(q, k, v, eps=1e-6):
    return _recurrent(q, k, v, eps, phi=F.relu)


def recurrent_not_causal(q, k, v, eps=1e-6):
    return _recurrent(q, k, v, eps, causal=False)


def recurrent_state_transposed(q, k, v, eps=1e-6):
    return _recurrent(q, k, v, eps, transpose=True)                # S as (d_v, d_k)


def recurrent_ignores_eps(q, k, v, eps=1e-6):
    return _recurrent(q, k, v, eps, fixed_eps=True)


# ----------------------------------------------------------------------------- q1b: linear_attention_chunk
def _chunk(q, k, v, chunk_size, eps=1e-6, *, inclusive=False, mask=True, inter_norm=True, drop_tail=False):
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    length = q.shape[-2]
    S = q.new_zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    z = q.new_zeros(q.shape[:-2] + (q.shape[-1], 1))
    outs, entering = [], []
    stop = length - length % chunk_size if drop_tail and length >= chunk_size else length
    for start in range(0, stop, chunk_size):
        qc, kc, vc = (x[..., start:start + chunk_size, :] for x in (fq, fk, v))
        if inclusive:                                              # the chunk's own tokens counted in the state too
            S = S + kc.transpose(-2, -1) @ vc
            z = z + kc.sum(-2).unsqueeze(-1)
        entering.append(S)
        inside = qc @ kc.transpose(-2, -1)
        if mask:
            inside = inside.tril()
        numerator = qc @ S + inside @ vc
        denominator = (qc @ z if inter_norm else 0.0) + inside.sum(-1, keepdim=True) + eps
        outs.append(numerator / denominator)
        if not inclusive:
            S = S + kc.transpose(-2, -1) @ vc
            z = z + kc.sum(-2).unsqueeze(-1)
    return torch.cat(outs, dim=-2), torch.stack(entering, dim=-3)


def chunk_inclusive_state(q, k, v, chunk_size, eps=1e-6):
    return _chunk(q, k, v, chunk_size, eps, inclusive=True)


def chunk_unmasked_inside(q, k, v, chunk_size, eps=1e-6):
    return _chunk(q, k, v, chunk_size, eps, mask=False)


def chunk_no_inter_normaliser(q, k, v, chunk_size, eps=1e-6):
    return _chunk(q, k, v, chunk_size, eps, inter_norm=False)


def chunk_drops_tail(q, k, v, chunk_size, eps=1e-6):
    return _chunk(q, k, v, chunk_size, eps, drop_tail=True)        # the ragged last chunk is lost


# ----------------------------------------------------------------------------- q2a: positive_features
def features_no_sqrt_m(x, W):
    return torch.exp(x @ W.T - 0.5 * (x * x).sum(-1, keepdim=True))


def features_plus_norm(x, W):
    return torch.exp(x @ W.T + 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(W.shape[0])


def features_no_norm_term(x, W):
    return torch.exp(x @ W.T) / math.sqrt(W.shape[0])


def features_trig(x, W):
    return torch.cos(x @ W.T) / math.sqrt(W.shape[0])             # Fourier features, not the positive ones


# ----------------------------------------------------------------------------- q2b: orthogonal_gaussian_rows
def _rows(m, d, seed, *, orthogonal=True, lengths="chi", repeat=False, generator=True, cut=True):
    gen = torch.Generator().manual_seed(seed) if generator else None
    blocks, first = [], None
    for _ in range(-(-m // d)):
        G = torch.randn(d, d, generator=gen, dtype=torch.float64)
        if orthogonal:
            G = torch.linalg.qr(G).Q.T
            if repeat:
                first = G if first is None else first
                G = first
        blocks.append(G)
    rows = torch.cat(blocks)
    if cut:
        rows = rows[:m]
    if not orthogonal:
        return rows
    if lengths == "chi":
        return rows * torch.randn(rows.shape[0], d, generator=gen, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return rows * (math.sqrt(d) if lengths == "sqrt d" else 1.0)


def rows_iid(m, d, seed):
    return _rows(m, d, seed, orthogonal=False)                     # plain Gaussian rows: not orthogonal


def rows_zero_row(m, d, seed):
    gen = torch.Generator().manual_seed(seed)                     # not orthogonal, but a zero row in every block
    rows = torch.randn(m, d, generator=gen, dtype=torch.float64)  # makes the normalised rows NaN, and a check
    rows[::d] = 0.0                                               # written `if error > tol` passes on NaN
    return rows


def rows_unit_length(m, d, seed):
    return _rows(m, d, seed, lengths="unit")


def rows_fixed_length(m, d, seed):
    return _rows(m, d, seed, lengths="sqrt d")                     # right mean, no spread


def rows_repeated_block(m, d, seed):
    return _rows(m, d, seed, repeat=True)


def rows_global_rng(m, d, seed):
    return _rows(m, d, seed, generator=False)                      # ignores seed


def rows_seeds_global_rng(m, d, seed):
    torch.manual_seed(seed)                                        # reproducible, but resets the student's
    return _rows(m, d, seed, generator=False)                      # global random state and draws from it


def rows_not_cut(m, d, seed):
    return _rows(m, d, seed, cut=False)                            # ceil(m / d) * d rows


# ----------------------------------------------------------------------------- q3a: crosstalk_recall_error
def _crosstalk(keys, values, *, relative=True, per_row=False, pooled=False, squared=False):
    S = keys.transpose(-2, -1) @ values
    diff = keys @ S - values
    if per_row:
        return (diff.norm(dim=-1) / values.norm(dim=-1)).mean(-1)
    if pooled:                                                     # one number for every batch together
        return diff.norm() / values.norm()
    err = diff.flatten(-2).norm(dim=-1)
    if relative:
        err = err / values.flatten(-2).norm(dim=-1)
    return err ** 2 if squared else err


def crosstalk_absolute(keys, values):
    return _crosstalk(keys, values, relative=False)


def crosstalk_per_row_mean(keys, values):
    return _crosstalk(keys, values, per_row=True)


def crosstalk_pooled(keys, values):
    return _crosstalk(keys, values, pooled=True)


def crosstalk_squared(keys, values):
    return _crosstalk(keys, values, squared=True)


# ----------------------------------------------------------------------------- q3b: best_state_recall_error
def _best(keys, values, *, state="lstsq", relative=True, by_read=False):
    S = torch.linalg.pinv(keys) @ values if state == "lstsq" else keys.transpose(-2, -1) @ values
    read = keys @ S
    err = (read - values).flatten(-2).norm(dim=-1)
    if not relative:
        return err
    return err / (read if by_read else values).flatten(-2).norm(dim=-1)


def best_uses_sum_state(keys, values):
    return _best(keys, values, state="sum")


def best_absolute(keys, values):
    return _best(keys, values, relative=False)


def best_divides_by_read(keys, values):
    return _best(keys, values, by_read=True)


# ----------------------------------------------------------------------------- q4a: gla_recurrent
def _gla(q, k, v, log_g, initial_state=None, *, decay_after=False, scale=True, gate="exp", use_initial=True):
    S = q.new_zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    if initial_state is not None and use_initial:
        S = initial_state
    if scale:
        q = q / math.sqrt(q.shape[-1])
    g = log_g.exp() if gate == "exp" else 1.0 + log_g
    outs = []
    for t in range(q.shape[-2]):
        write = k[..., t, :, None] * v[..., t, None, :]
        S = g[..., t, :, None] * (S + write) if decay_after else g[..., t, :, None] * S + write
        outs.append((q[..., t, :, None] * S).sum(-2))
    return torch.stack(outs, dim=-2), S


def gla_decays_after_writing(q, k, v, log_g, initial_state=None):
    return _gla(q, k, v, log_g, initial_state, decay_after=True)


def gla_no_scale(q, k, v, log_g, initial_state=None):
    return _gla(q, k, v, log_g, initial_state, scale=False)


def gla_linearised_gate(q, k, v, log_g, initial_state=None):
    return _gla(q, k, v, log_g, initial_state, gate="1 + log g")   # g = 1 + log g instead of exp(log g)


def gla_ignores_initial_state(q, k, v, log_g, initial_state=None):
    return _gla(q, k, v, log_g, initial_state, use_initial=False)


# ----------------------------------------------------------------------------- q4b: gla_parallel
def _gla_parallel(q, k, v, log_g, *, form="log", scale=True, own_gate=False):
    length = q.shape[-2]
    if scale:
        q = q / math.sqrt(q.shape[-1])
    b = log_g.cumsum(-2)
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    if form == "cumulative product":                               # (Q e^b)(K e^-b)^T: e^-b overflows
        return ((q * b.exp()) @ (k * (-b).exp()).transpose(-2, -1)).tril() @ v
    log_decay = b.unsqueeze(-2) - b.unsqueeze(-3)
    if own_gate:                                                   # also decays key j by its own gate
        log_decay = log_decay + log_g.unsqueeze(-3)
    if form == "mask after exp":                                   # exp(+large) = inf, times 0 = NaN
        decay = log_decay.exp() * causal.unsqueeze(-1)
    else:
        decay = log_decay.masked_fill(~causal.unsqueeze(-1), float("-inf")).exp()
    return (q.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1) @ v


def gla_parallel_own_gate(q, k, v, log_g):
    return _gla_parallel(q, k, v, log_g, own_gate=True)


def gla_parallel_cumulative_product(q, k, v, log_g):
    return _gla_parallel(q, k, v, log_g, form="cumulative product")


def gla_parallel_mask_after_exp(q, k, v, log_g):
    return _gla_parallel(q, k, v, log_g, form="mask after exp")


def gla_parallel_no_scale(q, k, v, log_g):
    return _gla_parallel(q, k, v, log_g, scale=False)


WRONG_ANSWERS = {
    "q1a": {
        "off_by_one": ({"linear_attention_recurrent": recurrent_reads_before_writing}, "token t must see itself"),
        "no_normaliser": ({"linear_attention_recurrent": recurrent_no_normaliser}, "max abs error"),
        "relu_features": ({"linear_attention_recurrent": recurrent_relu_features}, "max abs error"),
        "not_causal": ({"linear_attention_recurrent": recurrent_not_causal}, "max abs error"),
        "state_transposed": ({"linear_attention_recurrent": recurrent_state_transposed}, "shape"),
        "ignores_eps": ({"linear_attention_recurrent": recurrent_ignores_eps}, "max abs error"),
    },
    "q1b": {
        "off_by_one": ({"linear_attention_chunk": chunk_inclusive_state}, "max abs error"),
        "unmasked_inside": ({"linear_attention_chunk": chunk_unmasked_inside}, "only larger chunks fail"),
        "no_inter_normaliser": ({"linear_attention_chunk": chunk_no_inter_normaliser}, "the first chunk"),
        "drops_tail": ({"linear_attention_chunk": chunk_drops_tail}, "shape"),
    },
    "q2a": {
        "off_by_one": ({"positive_features": features_no_sqrt_m}, "(about √"),
        "plus_norm": ({"positive_features": features_plus_norm}, "max abs error"),
        "no_norm_term": ({"positive_features": features_no_norm_term}, "max abs error"),
        "trig": ({"positive_features": features_trig}, "max abs error"),
    },
    "q2b": {
        "off_by_one": ({"orthogonal_gaussian_rows": rows_iid}, "not orthogonal"),
        "zero_row": ({"orthogonal_gaussian_rows": rows_zero_row}, "not orthogonal"),
        "unit_length": ({"orthogonal_gaussian_rows": rows_unit_length}, "same squared length"),
        "fixed_length": ({"orthogonal_gaussian_rows": rows_fixed_length}, "same squared length"),
        "repeated_block": ({"orthogonal_gaussian_rows": rows_repeated_block}, "repeats the directions"),
        "global_rng": ({"orthogonal_gaussian_rows": rows_global_rng}, "global random state"),
        "seeds_global_rng": ({"orthogonal_gaussian_rows": rows_seeds_global_rng}, "global random state"),
        "not_cut": ({"orthogonal_gaussian_rows": rows_not_cut}, "shape"),
    },
    "q3a": {
        "off_by_one": ({"crosstalk_recall_error": crosstalk_per_row_mean}, "max abs error"),
        "absolute": ({"crosstalk_recall_error": crosstalk_absolute}, "max abs error"),
        "pooled": ({"crosstalk_recall_error": crosstalk_pooled}, "shape"),
        "squared": ({"crosstalk_recall_error": crosstalk_squared}, "max abs error"),
    },
    "q3b": {
        "off_by_one": ({"best_state_recall_error": best_uses_sum_state}, "max abs error"),
        "absolute": ({"best_state_recall_error": best_absolute}, "max abs error"),
        "divides_by_read": ({"best_state_recall_error": best_divides_by_read}, "max abs error"),
    },
    "q4a": {
        "off_by_one": ({"gla_recurrent": gla_decays_after_writing}, "max abs error"),
        "no_scale": ({"gla_recurrent": gla_no_scale}, "same constant everywhere"),
        "linearised_gate": ({"gla_recurrent": gla_linearised_gate}, "max abs error"),
        "ignores_initial_state": ({"gla_recurrent": gla_ignores_initial_state}, "max abs error"),
    },
    "q4b": {
        "off_by_one": ({"gla_parallel": gla_parallel_own_gate}, "max abs error"),
        "cumulative_product": ({"gla_parallel": gla_parallel_cumulative_product}, "NaN"),
        "mask_after_exp": ({"gla_parallel": gla_parallel_mask_after_exp}, "NaN"),
        "no_scale": ({"gla_parallel": gla_parallel_no_scale}, "same constant everywhere"),
    },
}


# ----------------------------------------------------------------------------- q5a: linformer
def linformer_no_scale(q, k, v, E, F):
    return torch.softmax(q @ (E @ k).transpose(-2, -1), dim=-1) @ (F @ v)


def linformer_softmax_over_queries(q, k, v, E, F):
    return torch.softmax(q @ (E @ k).transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2) @ (F @ v)


def linformer_E_for_values(q, k, v, E, F):
    return torch.softmax(q @ (E @ k).transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ (E @ v)


# ----------------------------------------------------------------------------- q5b: retention_chunk
def _retention_chunk(q, k, v, gamma, chunk_size, *, read_power=1, decay_state=True):
    S = q.new_zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    outs = []
    for start in range(0, q.shape[-2], chunk_size):
        qc, kc, vc = (x[..., start:start + chunk_size, :] for x in (q, k, v))
        C = qc.shape[-2]
        i = torch.arange(C, dtype=q.dtype)
        mask = torch.where(i[:, None] >= i[None, :], gamma ** (i[:, None] - i[None, :]).clamp_min(0), 0.0)
        outs.append((qc @ kc.transpose(-2, -1) * mask) @ vc + (gamma ** (i + read_power))[:, None] * (qc @ S))
        S = (gamma ** C if decay_state else 1.0) * S + (kc * (gamma ** (C - 1 - i))[:, None]).transpose(-2, -1) @ vc
    return torch.cat(outs, dim=-2)


def retention_state_read_one_step_late(q, k, v, gamma, chunk_size):
    return _retention_chunk(q, k, v, gamma, chunk_size, read_power=0)      # gamma^i' instead of gamma^(i'+1)


def retention_state_not_decayed(q, k, v, gamma, chunk_size):
    return _retention_chunk(q, k, v, gamma, chunk_size, decay_state=False)


def retention_parallel_form(q, k, v, gamma, chunk_size):
    L = q.shape[-2]
    i = torch.arange(L, dtype=q.dtype)
    D = torch.where(i[:, None] >= i[None, :], gamma ** (i[:, None] - i[None, :]).clamp_min(0), 0.0)
    return (q @ k.transpose(-2, -1) * D) @ v                                 # right values, an L x L matrix


WRONG_ANSWERS["q5a"] = {
    "off_by_one": ({"linformer": linformer_no_scale}, "max abs error"),
    "softmax_over_queries": ({"linformer": linformer_softmax_over_queries}, "max abs error"),
    "E_for_values": ({"linformer": linformer_E_for_values}, "max abs error"),
}
WRONG_ANSWERS["q5b"] = {
    "off_by_one": ({"retention_chunk": retention_state_read_one_step_late}, "max abs error"),
    "state_not_decayed": ({"retention_chunk": retention_state_not_decayed}, "max abs error"),
    "parallel_form": ({"retention_chunk": retention_parallel_form}, "L x L"),
}


# ----------------------------------------------------------------------------- q6a: delta_rule_recurrent
def _delta(q, k, v, beta, initial_state=None, *, rule="delta", use_beta=True, read_first=False, normalise=False,
           scale=False, use_initial=True):
    S = q.new_zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    if initial_state is not None and use_initial:
        S = initial_state
    if normalise:                                                  # keys made unit, where they are used as given
        k = F.normalize(k, dim=-1)
    if scale:
        q = q / math.sqrt(q.shape[-1])
    b = beta if use_beta else torch.ones_like(beta)
    outs = []
    for t in range(q.shape[-2]):
        k_t, v_t, b_t = k[..., t, :], v[..., t, :], b[..., t, None]
        if read_first:                                             # reads the state before token t's write
            outs.append((q[..., t, :, None] * S).sum(-2))
        write = v_t if rule == "additive" else v_t - (k_t[..., :, None] * S).sum(-2)
        S = S + k_t[..., :, None] * (b_t * write)[..., None, :]
        if not read_first:
            outs.append((q[..., t, :, None] * S).sum(-2))
    return torch.stack(outs, dim=-2), S


def delta_reads_before_writing(q, k, v, beta, initial_state=None):
    return _delta(q, k, v, beta, initial_state, read_first=True)


def delta_additive(q, k, v, beta, initial_state=None):
    return _delta(q, k, v, beta, initial_state, rule="additive")     # S + beta k v^T: linear attention's sum


def delta_forgets_beta(q, k, v, beta, initial_state=None):
    return _delta(q, k, v, beta, initial_state, use_beta=False)


def delta_normalises_keys(q, k, v, beta, initial_state=None):
    return _delta(q, k, v, beta, initial_state, normalise=True)


def delta_scales_queries(q, k, v, beta, initial_state=None):
    return _delta(q, k, v, beta, initial_state, scale=True)


def delta_ignores_initial_state(q, k, v, beta, initial_state=None):
    return _delta(q, k, v, beta, initial_state, use_initial=False)


# ----------------------------------------------------------------------------- q6b: delta_chunk
def _delta_chunk(q, k, v, beta, S, *, strict_read=False, solve=True, a_diagonal=False, a_beta=True,
                 first_order=False, state_in_u=True, state="corrections"):
    C = q.shape[-2]
    eye = torch.eye(C, dtype=q.dtype)
    b = beta[..., :, None]
    gram = k @ k.transpose(-2, -1)
    A = ((b if a_beta else 1.0) * gram).tril(0 if a_diagonal else -1)
    if not solve:                                                  # each correction on its own: T = I
        T = eye.expand_as(A).clone()
    elif first_order:                                              # (I + A)^-1 ~ I - A, one term of the series
        T = eye - A
    else:
        T = torch.linalg.inv(eye + A)
    U = T @ (b * (v - k @ S)) if state_in_u else T @ (b * v)
    scores = (q @ k.transpose(-2, -1)).tril(-1 if strict_read else 0)
    out = q @ S + scores @ U
    S_next = S + k.transpose(-2, -1) @ (U if state == "corrections" else b * v)
    return out, S_next, T


def chunk_strict_read(q, k, v, beta, S):
    return _delta_chunk(q, k, v, beta, S, strict_read=True)          # token i misses its own correction


def chunk_no_solve(q, k, v, beta, S):
    return _delta_chunk(q, k, v, beta, S, solve=False)


def chunk_a_with_diagonal(q, k, v, beta, S):
    return _delta_chunk(q, k, v, beta, S, a_diagonal=True)


def chunk_a_without_beta(q, k, v, beta, S):
    return _delta_chunk(q, k, v, beta, S, a_beta=False)


def chunk_first_order_inverse(q, k, v, beta, S):
    return _delta_chunk(q, k, v, beta, S, first_order=True)


def chunk_ignores_entering_state(q, k, v, beta, S):
    return _delta_chunk(q, k, v, beta, S, state_in_u=False)          # U = T diag(beta) V, no - W S


def chunk_additive_state(q, k, v, beta, S):
    return _delta_chunk(q, k, v, beta, S, state="sum")               # S + K^T diag(beta) V


WRONG_ANSWERS["q6a"] = {
    "off_by_one": ({"delta_rule_recurrent": delta_reads_before_writing}, "token t must see itself"),
    "additive": ({"delta_rule_recurrent": delta_additive}, "added the second value"),
    "forgets_beta": ({"delta_rule_recurrent": delta_forgets_beta}, "scaled by beta"),
    "normalises_keys": ({"delta_rule_recurrent": delta_normalises_keys}, "max abs error"),
    "scales_queries": ({"delta_rule_recurrent": delta_scales_queries}, "same constant everywhere"),
    "ignores_initial_state": ({"delta_rule_recurrent": delta_ignores_initial_state}, "max abs error"),
}
WRONG_ANSWERS["q6b"] = {
    "off_by_one": ({"delta_chunk": chunk_strict_read}, "token t must see itself"),
    "no_solve": ({"delta_chunk": chunk_no_solve}, "only larger chunks fail"),
    "a_with_diagonal": ({"delta_chunk": chunk_a_with_diagonal}, "max abs error"),
    "a_without_beta": ({"delta_chunk": chunk_a_without_beta}, "max abs error"),
    "first_order_inverse": ({"delta_chunk": chunk_first_order_inverse}, "max abs error"),
    "ignores_entering_state": ({"delta_chunk": chunk_ignores_entering_state}, "max abs error"),
    "additive_state": ({"delta_chunk": chunk_additive_state}, "max abs error"),
}
