"""Deliberately wrong answers to the Chapter 9 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests (every
requirement a question states is in a public check) and all its hidden tests (zero points),
with messages of which at least one contains ``keyword``. ``TAMPER_BASE`` names the variant
the tampering checks use (wrong values of the right shape, what a broken comparison would let
through). The tests add two generic variants to every part themselves (an exception and an
endless loop), so they are not listed here.
"""
import torch
import torch.nn.functional as F

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1a: zoh
def _zoh(A, B, delta, *, b_bar="exact", scale_A=True):
    n = A.shape[-1]
    A_bar = torch.linalg.matrix_exp(delta * A if scale_A else A)
    if b_bar == "euler":
        return A_bar, delta * B                                    # Mamba's B_bar, not ZOH (E9.6)
    if b_bar == "solve":                                           # A^-1 (e^{dA} - I) B: needs A invertible
        return A_bar, torch.linalg.solve(A, (A_bar - torch.eye(n, dtype=A.dtype)) @ B)
    block = torch.zeros(n + 1, n + 1, dtype=A.dtype)
    block[:n, :n], block[:n, n] = A, B
    return A_bar, torch.linalg.matrix_exp(delta * block)[:n, n]


def zoh_euler_B(A, B, delta):
    return _zoh(A, B, delta, b_bar="euler")


def zoh_solve(A, B, delta):
    return _zoh(A, B, delta, b_bar="solve")


def zoh_unscaled_A(A, B, delta):
    return _zoh(A, B, delta, scale_A=False)                        # e^A instead of e^{delta A}


def zoh_wrong_shape(A, B, delta):
    A_bar, B_bar = _zoh(A, B, delta)
    return A_bar, B_bar[:, None]                                   # (N, 1), not (N,)


def zoh_bilinear(A, B, delta):
    n = A.shape[-1]
    left = torch.eye(n, dtype=A.dtype) - delta * A / 2
    return torch.linalg.solve(left, torch.eye(n, dtype=A.dtype) + delta * A / 2), torch.linalg.solve(left, delta * B)


# ----------------------------------------------------------------------------- q1b: zoh_diagonal
def _zoh_diag(A, B, delta, *, expm1=True, fix_zero=True, euler=False):
    dA = delta[:, None] * A
    if euler:
        return torch.exp(dA), delta[:, None] * B
    num = torch.expm1(dA) if expm1 else torch.exp(dA) - 1.0
    if not fix_zero:
        return torch.exp(dA), num / A * B                          # 0 / 0 = NaN at A = 0
    zero = dA == 0
    phi = torch.where(zero, torch.ones_like(dA), num / torch.where(zero, torch.ones_like(dA), dA))
    return torch.exp(dA), phi * delta[:, None] * B


def zoh_diag_naive(A, B, delta):
    return _zoh_diag(A, B, delta, expm1=False, fix_zero=False)


def zoh_diag_expm1_no_zero(A, B, delta):
    return _zoh_diag(A, B, delta, fix_zero=False)


def zoh_diag_cancels(A, B, delta):
    return _zoh_diag(A, B, delta, expm1=False)                     # exp(x) - 1 loses digits for tiny x


def zoh_diag_euler(A, B, delta):
    return _zoh_diag(A, B, delta, euler=True)


def zoh_diag_wrong_shape(A, B, delta):
    A_bar, B_bar = _zoh_diag(A, B, delta)
    return A_bar, B_bar.T


# ----------------------------------------------------------------------------- q2a: ssm_kernel_loop
def _kernel(A_bar, B_bar, C, L, *, start=0, transpose=False, extra=0):
    M = A_bar.T if transpose else A_bar
    return torch.stack([C @ torch.linalg.matrix_power(M, i) @ B_bar for i in range(start, start + L + extra)])


def kernel_starts_at_one(A_bar, B_bar, C, L):
    return _kernel(A_bar, B_bar, C, L, start=1)                    # C A B, C A^2 B, ...


def kernel_transposed(A_bar, B_bar, C, L):
    return _kernel(A_bar, B_bar, C, L, transpose=True)             # powers of A^T


def kernel_wrong_shape(A_bar, B_bar, C, L):
    return _kernel(A_bar, B_bar, C, L, extra=1)                    # L + 1 entries


# ----------------------------------------------------------------------------- q2b: causal_conv_fft
def _conv(u, K, *, n=None, flip=False, keep=None):
    L = u.shape[-1]
    n = 2 * L if n is None else n
    if flip:
        K = K.flip(-1)
    y = torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(K, n=n), n=n)
    return y[..., :L if keep is None else keep]


def conv_circular(u, K):
    return _conv(u, K, n=u.shape[-1])                              # no padding: wraps around


def conv_padded_too_little(u, K):
    return _conv(u, K, n=u.shape[-1] + 1)


def conv_flipped_kernel(u, K):
    return _conv(u, K, flip=True)                                  # correlation, not convolution


def conv_wrong_shape(u, K):
    return _conv(u, K, keep=2 * u.shape[-1])                       # all 2L outputs


# ----------------------------------------------------------------------------- q3a: selective_scan_loop
def _scan(u, delta, A, B, C, D=None, z=None, *, zoh_B=False, read_before=False, gate="silu", use_D=True,
          state_layout="bdn"):
    batch, d, L = u.shape
    x = torch.zeros(batch, d, A.shape[1], dtype=u.dtype)
    ys = []
    for t in range(L):
        dt = delta[:, :, t, None]
        dA = torch.exp(dt * A)
        B_bar = torch.expm1(dt * A) / A * B[:, None, :, t] if zoh_B else dt * B[:, None, :, t]
        if read_before:
            ys.append((x * C[:, None, :, t]).sum(-1))
        x = dA * x + B_bar * u[:, :, t, None]
        if not read_before:
            ys.append((x * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1)
    if D is not None and use_D:
        y = y + D[:, None] * u
    if z is not None:
        y = y * (F.silu(z) if gate == "silu" else torch.sigmoid(z))
    return y, (x if state_layout == "bdn" else x.transpose(1, 2))


def scan_zoh_B(u, delta, A, B, C, D=None, z=None):
    return _scan(u, delta, A, B, C, D, z, zoh_B=True)              # full ZOH B_bar, not the reference's Euler one


def scan_reads_before_update(u, delta, A, B, C, D=None, z=None):
    return _scan(u, delta, A, B, C, D, z, read_before=True)        # y_t = <x_{t-1}, C_t>


def scan_sigmoid_gate(u, delta, A, B, C, D=None, z=None):
    return _scan(u, delta, A, B, C, D, z, gate="sigmoid")


def scan_ignores_D(u, delta, A, B, C, D=None, z=None):
    return _scan(u, delta, A, B, C, D, z, use_D=False)


def scan_state_transposed(u, delta, A, B, C, D=None, z=None):
    return _scan(u, delta, A, B, C, D, z, state_layout="bnd")      # last state (batch, N, d)


# ----------------------------------------------------------------------------- q4a: combine
def combine_reversed(first, then):
    (a1, b1), (a2, b2) = first, then
    return a1 * a2, a1 * b2 + b1                                   # "then, first"


def combine_adds(first, then):
    (a1, b1), (a2, b2) = first, then
    return a1 * a2, b1 + b2                                        # forgets to carry b1 through a2


# ----------------------------------------------------------------------------- q4b: hillis_steele
def _hillis(a, b, combine, *, swap=False, rounds_short=0):
    L, step, rounds = a.shape[-1], 1, 0
    total = max(0, (L - 1).bit_length() - rounds_short)
    while rounds < total:
        pad = a.shape[:-1] + (step,)
        before = (torch.cat([torch.ones(pad, dtype=a.dtype), a[..., :-step]], dim=-1),
                  torch.cat([torch.zeros(pad, dtype=b.dtype), b[..., :-step]], dim=-1))
        a, b = combine((a, b), before) if swap else combine(before, (a, b))
        step, rounds = 2 * step, rounds + 1
    return b


def hillis_one_round_short(a, b, combine):
    return _hillis(a, b, combine, rounds_short=1)


def hillis_swapped_order(a, b, combine):
    return _hillis(a, b, combine, swap=True)                       # the later map first


def hillis_sequential(a, b, combine):
    acc, xs = (a[..., 0], b[..., 0]), [b[..., 0]]                  # right values, L - 1 combine calls
    for t in range(1, a.shape[-1]):
        acc = combine(acc, (a[..., t], b[..., t]))
        xs.append(acc[1])
    return torch.stack(xs, dim=-1)


# ----------------------------------------------------------------------------- q5a: ssd_attention
def _ssd(x, a, B, C, *, include_own=False, causal=True, how="mask first", swap_qk=False, layout="blhp"):
    L = x.shape[1]
    cum = a.cumsum(dim=1)
    seg = cum[:, :, None, :] - cum[:, None, :, :]
    if include_own:
        seg = seg + a[:, None, :, :]                               # a_s + ... + a_t: one decay too many
    mask = torch.ones(L, L, dtype=torch.bool).tril()[None, :, :, None]
    if not causal:
        decay = torch.exp(seg)
    elif how == "mask first":
        decay = torch.exp(seg.masked_fill(~mask, float("-inf")))
    elif how == "mask after":
        decay = torch.exp(seg) * mask                              # inf * 0 = NaN above the diagonal
    else:                                                          # ratio of cumulative products: 0 / 0
        decay = torch.exp(cum)[:, :, None, :] / torch.exp(cum)[:, None, :, :] * mask
    scores = (torch.einsum("bthn,bshn->btsh", B, C) if swap_qk else torch.einsum("bthn,bshn->btsh", C, B)) * decay
    y = torch.einsum("btsh,bshp->bthp", scores, x)
    return y if layout == "blhp" else y.transpose(1, 2)


def ssd_includes_own_decay(x, a, B, C):
    return _ssd(x, a, B, C, include_own=True)


def ssd_not_causal(x, a, B, C):
    return _ssd(x, a, B, C, causal=False)


def ssd_mask_after_exp(x, a, B, C):
    return _ssd(x, a, B, C, how="mask after")


def ssd_ratio_of_products(x, a, B, C):
    return _ssd(x, a, B, C, how="ratio")


def ssd_queries_keys_swapped(x, a, B, C):
    return _ssd(x, a, B, C, swap_qk=True)                          # (B_t . C_s) instead of (C_t . B_s)


def ssd_wrong_shape(x, a, B, C):
    return _ssd(x, a, B, C, layout="bhlp")


WRONG_ANSWERS = {
    "q1a": {
        "off_by_one": ({"zoh": zoh_euler_B}, "max abs error"),
        "solve_needs_invertible_A": ({"zoh": zoh_solve}, "your code raised"),
        "unscaled_A": ({"zoh": zoh_unscaled_A}, "max abs error"),
        "bilinear": ({"zoh": zoh_bilinear}, "max abs error"),
        "wrong_shape": ({"zoh": zoh_wrong_shape}, "shape"),
    },
    "q1b": {
        "nan": ({"zoh_diagonal": zoh_diag_naive}, "NaN"),
        "expm1_but_nan_at_zero": ({"zoh_diagonal": zoh_diag_expm1_no_zero}, "NaN"),
        "off_by_one": ({"zoh_diagonal": zoh_diag_cancels}, "max abs error"),
        "euler": ({"zoh_diagonal": zoh_diag_euler}, "max abs error"),
        "wrong_shape": ({"zoh_diagonal": zoh_diag_wrong_shape}, "shape"),
    },
    "q2a": {
        "off_by_one": ({"ssm_kernel_loop": kernel_starts_at_one}, "max abs error"),
        "transposed": ({"ssm_kernel_loop": kernel_transposed}, "max abs error"),
        "wrong_shape": ({"ssm_kernel_loop": kernel_wrong_shape}, "shape"),
    },
    "q2b": {
        "off_by_one": ({"causal_conv_fft": conv_padded_too_little}, "max abs error"),
        "circular": ({"causal_conv_fft": conv_circular}, "max abs error"),
        "flipped": ({"causal_conv_fft": conv_flipped_kernel}, "max abs error"),
        "wrong_shape": ({"causal_conv_fft": conv_wrong_shape}, "shape"),
    },
    "q3a": {
        "zoh_B": ({"selective_scan_loop": scan_zoh_B}, "max abs error"),
        "off_by_one": ({"selective_scan_loop": scan_reads_before_update}, "(t = 0) your output is 0"),
        "sigmoid_gate": ({"selective_scan_loop": scan_sigmoid_gate}, "max abs error"),
        "ignores_D": ({"selective_scan_loop": scan_ignores_D}, "max abs error"),
        "wrong_shape": ({"selective_scan_loop": scan_state_transposed}, "shape"),
    },
    "q4a": {
        "off_by_one": ({"combine": combine_reversed}, "max abs error"),
        "adds": ({"combine": combine_adds}, "max abs error"),
    },
    "q4b": {
        "off_by_one": ({"hillis_steele": hillis_one_round_short}, "max abs error"),
        "swapped_order": ({"hillis_steele": hillis_swapped_order}, "max abs error"),
        "sequential": ({"hillis_steele": hillis_sequential}, "combine calls"),
    },
    "q5a": {
        "off_by_one": ({"ssd_attention": ssd_includes_own_decay}, "max abs error"),
        "not_causal": ({"ssd_attention": ssd_not_causal}, "max abs error"),
        "mask_after_exp": ({"ssd_attention": ssd_mask_after_exp}, "NaN"),
        "ratio_of_products": ({"ssd_attention": ssd_ratio_of_products}, "NaN"),
        "queries_keys_swapped": ({"ssd_attention": ssd_queries_keys_swapped}, "max abs error"),
        "wrong_shape": ({"ssd_attention": ssd_wrong_shape}, "shape"),
    },
}
