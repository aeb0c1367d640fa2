"""Linear attention (Chapter 8): kernel linear attention in its parallel, recurrent and chunkwise
forms, gated linear attention (GLA), retention, the delta rule (DeltaNet, Gated DeltaNet) and the
Taylor-2 feature map; Linformer; random features (Fourier/RFA, Performer's positive and orthogonal
features, and their closed-form errors); the recall error of a fixed state; the gate
parameterisations of GLA's Table 1 as log gates.

Conventions (see ``shared/API.md``):

* ``q, k, v`` are ``(..., L, d)``, usually ``(B, H, L, d)``: sequence dim -2, features dim -1.
  They share every leading dim and the length ``L`` (query ``t`` reads the state after key ``t``).
* `linear_attention` never rescales ``q``; `gated_linear_attention` multiplies ``q`` by ``scale``
  (default ``1/sqrt(d_k)``); `retention` uses no scale.
* Gates are passed as **log** gates ``log_g <= 0``; the state decays by ``exp(log_g)``.
* Every mode agrees with every other, in outputs and gradients. ``chunk_size`` need not divide
  ``L`` (the last chunk is padded internally).
* fp16/bf16 are computed in fp32 and the output is returned in the input dtype; fp32/fp64 stay
  as they are. Nothing moves between devices.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import torch
import torch.nn.functional as F

from .utils import broadcasts_to, check_positive_int, check_qkv, check_tensor, resolve_scale
from .utils import compute_dtype as _compute_dtype

__all__ = [
    "FEATURE_MAPS",
    "elu_feature_map",
    "linear_attention",
    "gated_linear_attention",
    "delta_rule",
    "retention",
    "taylor2_features",
    "linformer_attention",
    "sample_rff",
    "rff_features",
    "positive_random_features",
    "orthogonal_gaussian",
    "random_feature_kernel",
    "rfa_attention",
    "performer_attention",
    "recall_error",
    "capacity_curve",
    "random_feature_mse",
    "GATE_KINDS",
    "reduces_to_gla",
    "gated_linear_attention_per_entry",
    "make_log_gate",
]

_LINEAR_MODES = ("parallel", "recurrent", "chunk")
_GLA_MODES = ("recurrent", "parallel", "chunk")
_DELTA_MODES = ("recurrent", "chunk")


# ----------------------------------------------------------------------------- feature maps
def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1`` (Katharopoulos et al. 2020): ``x + 1`` for ``x > 0``, ``exp(x)`` otherwise; always > 0."""
    return F.elu(x).add_(1.0)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


FEATURE_MAPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu": elu_feature_map,
    "relu": F.relu,
    "identity": _identity,
}


def taylor2_features(x: torch.Tensor) -> torch.Tensor:
    """Second-order Taylor feature map ``[1, x, vec(x x^T) / sqrt(2)]``.

    ``x (..., d)`` → ``(..., 1 + d + d^2)``, so that ``phi(q) . phi(k) = 1 + q.k + (q.k)^2 / 2``,
    the first three terms of ``exp(q.k)``. The full ``exp`` would need infinitely many features.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    d = x.shape[-1]
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).reshape(x.shape[:-1] + (d * d,))
    return torch.cat([x.new_ones(x.shape[:-1] + (1,)), x, outer / math.sqrt(2.0)], dim=-1)


def _resolve_feature_map(feature_map) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(feature_map, str):
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {tuple(FEATURE_MAPS)} or a callable, got {feature_map!r}")
        return FEATURE_MAPS[feature_map]
    if callable(feature_map):
        return feature_map
    raise TypeError(f"feature_map must be a string or a callable, got {type(feature_map).__name__}")


def _apply_feature_map(phi, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``phi(q), phi(k)``, checked: same leading dims and length as the inputs, one feature size."""
    fq, fk = phi(q), phi(k)
    for name, out, x in (("phi(q)", fq, q), ("phi(k)", fk, k)):
        if not isinstance(out, torch.Tensor) or out.shape[:-1] != x.shape[:-1]:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"feature_map must map (..., L, d) to (..., L, d_phi); {name} has shape {got} "
                             f"for input {tuple(x.shape)}")
    if fq.shape[-1] != fk.shape[-1]:
        raise ValueError(f"feature_map gave different feature sizes for q and k: phi(q) {tuple(fq.shape)}, "
                         f"phi(k) {tuple(fk.shape)}")
    return fq.to(q.dtype), fk.to(k.dtype)


# ----------------------------------------------------------------------------- argument checks
def _check_mode(mode, allowed: tuple[str, ...]) -> str:
    if not isinstance(mode, str) or mode not in allowed:
        raise ValueError(f"mode must be one of {allowed}, got {mode!r}")
    return mode


def _check_nonneg(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_aux_dtype(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    """``t`` must have ``q``'s dtype, or fp32 when ``q`` is half precision."""
    allowed = {q.dtype, _compute_dtype(q.dtype)}
    if t.dtype not in allowed:
        raise TypeError(f"{name} must have dtype {' or '.join(sorted(str(a) for a in allowed))} (from q), "
                        f"got {t.dtype}")


# ----------------------------------------------------------------------------- chunk helpers
def _to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``(..., L, d)`` → ``(..., n, C, d)`` with ``n = ceil(L / C)``; the ragged tail is zero-padded."""
    length = x.shape[-2]
    pad = -length % chunk_size
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(x.shape[:-2] + (x.shape[-2] // chunk_size, chunk_size, x.shape[-1]))


def _from_chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """``(..., n, C, d)`` → ``(..., L, d)``, dropping the padding."""
    return x.reshape(x.shape[:-3] + (x.shape[-3] * x.shape[-2], x.shape[-1]))[..., :length, :]


def _causal(n: int, device: torch.device) -> torch.Tensor:
    """Boolean ``(n, n)`` lower-triangular mask, True where ``i >= j``."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


_LOOP_SLICE = 4096   # slices at least this large are summed by the loop of adds in `_exclusive_cumsum`


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sums of the entries before each index along ``dim`` (index 0 gets exactly 0).

    No later entry ever enters an earlier sum, not even as a rounding residue (an inclusive sum minus
    the entry itself would leak one). Without autograd, on a CPU, large slices are summed by a loop
    of adds written in place: torch's ``cumsum`` along a middle dimension was 3.5x slower on a 2-core
    CPU (4.2 ms against 1.2 ms for 64 slices of 8 x 64 x 64). On a GPU the loop would be one kernel
    launch per slice, so ``cumsum`` is used there.
    """
    n = x.shape[dim]
    if x.requires_grad and torch.is_grad_enabled():                   # autograd has no out=: one concatenation
        return torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), x.narrow(dim, 0, n - 1).cumsum(dim)], dim)
    out = torch.empty_like(x)
    out.narrow(dim, 0, 1).zero_()
    if x.device.type == "cpu" and x.numel() // n >= _LOOP_SLICE:
        for i in range(1, n):
            torch.add(out.select(dim, i - 1), x.select(dim, i - 1), out=out.select(dim, i))
    else:
        torch.cumsum(x.narrow(dim, 0, n - 1), dim, out=out.narrow(dim, 1, n - 1))
    return out


def _add_inter(out: torch.Tensor, q: torch.Tensor, S: torch.Tensor, scale: float = 1.0) -> None:
    """``out = scale * (out + q @ S)`` in place, as one batched ``baddbmm_`` on ``out.flatten(0, -3)``.

    ``flatten`` returns a view only for a contiguous ``out``; on a copy the in-place update would be
    lost silently, so anything else is made an error here rather than a wrong result.
    """
    flat = out.flatten(0, -3)
    if flat.data_ptr() != out.data_ptr() or not out.is_contiguous():
        raise RuntimeError(f"_add_inter needs a contiguous out to update in place, got strides {out.stride()}")
    flat.baddbmm_(q.flatten(0, -3), S.flatten(0, -3), beta=scale, alpha=scale)


# ----------------------------------------------------------------------------- linear attention
def _linear_parallel(fq, fk, v, causal: bool):
    """Quadratic form: ``A = phi(Q) phi(K)^T`` (lower-triangular if causal); ``num = A V``, ``den = A 1``."""
    scores = fq @ fk.transpose(-2, -1)                     # (..., L, L)
    if causal:
        scores = scores.tril()
    return scores @ v, scores.sum(-1)


def _linear_recurrent(fq, fk, v, causal: bool):
    """State loop ``S_t = S_{t-1} + phi(k_t) v_t^T``, ``z_t = z_{t-1} + phi(k_t)``; read ``phi(q_t)^T S_t``.

    Non-causal: every query reads the final state ``S_L`` (the full sums).
    """
    length = fq.shape[-2]
    S = fq.new_zeros(fq.shape[:-2] + (fq.shape[-1], v.shape[-1]))   # (..., d_phi, d_v)
    z = fq.new_zeros(fq.shape[:-2] + (fq.shape[-1],))               # (..., d_phi)
    nums, dens = [], []
    for t in range(length):
        S = S + fk[..., t, :, None] * v[..., t, None, :]
        z = z + fk[..., t, :]
        if causal:
            nums.append(torch.einsum("...f,...fe->...e", fq[..., t, :], S))
            dens.append((fq[..., t, :] * z).sum(-1))
    if causal:
        return torch.stack(nums, dim=-2), torch.stack(dens, dim=-1)
    return fq @ S, (fq @ z.unsqueeze(-1)).squeeze(-1)


def _linear_chunk(fq, fk, v, causal: bool, chunk_size: int):
    """Chunkwise form: a masked product inside each chunk (intra), plus the state entering it (inter).

    Causal: the state entering chunk ``c`` is the sum of the chunks before it,
    ``S_c = sum_{c' < c} K_{c'}^T V_{c'}`` (likewise ``z_c`` for the normaliser): one batched product
    for all chunks and an exclusive cumulative sum over them (`_exclusive_cumsum`).
    The normaliser is the row sum of the masked scores plus ``phi(q)^T z_c``.
    Non-causal: every query reads the full sums, accumulated chunk by chunk.
    `_linear_chunk_reference` is the same algorithm one chunk at a time, for reading. This form issues
    the same operations whatever the number of chunks (on a GPU each is one kernel launch), where the
    reference issues four per chunk; on a 2-core CPU the reference was as fast (0.6 to 1.0 times this
    form's time over five shapes from (1, 4, 1024, 64) to (1, 8, 8192, 64), load about 9).
    """
    length = fq.shape[-2]
    chunk_size = min(chunk_size, length)                             # one chunk never needs padding past L
    qc, kc, vc = (_to_chunks(x, chunk_size) for x in (fq, fk, v))    # (..., n, C, d); padded keys are 0
    if not causal:
        S = (kc.transpose(-2, -1) @ vc).sum(-3, keepdim=True)        # (..., 1, d_phi, d_v)
        z = kc.sum((-3, -2))                                         # (..., d_phi)
        return _from_chunks(qc @ S, length), (fq * z.unsqueeze(-2)).sum(-1)
    scores = (qc @ kc.transpose(-2, -1)).tril_()                     # (..., n, C, C), i >= j inside a chunk
    num = scores @ vc                                                # intra: (..., n, C, d_v)
    den = scores.sum(-1)                                             # (..., n, C)
    S = _exclusive_cumsum(kc.transpose(-2, -1) @ vc, -3)             # (..., n, d_phi, d_v)
    z = _exclusive_cumsum(kc.sum(-2), -2)                            # (..., n, d_phi)
    _add_inter(num, qc, S)                                           # + inter, in place
    den.add_((qc @ z.unsqueeze(-1)).squeeze(-1))
    return _from_chunks(num, length), den.flatten(-2)[..., :length]


def _linear_chunk_reference(fq, fk, v, chunk_size: int):
    """The causal chunk form as the algorithm reads, one chunk after another → ``(num, den)``.

    For each chunk ``c`` in order: ``O_c = Q_c S + tril(Q_c K_c^T) V_c`` (the state of the earlier
    chunks, then the masked product inside the chunk), then ``S = S + K_c^T V_c``. The normaliser
    is the same sum with a column of ones appended to ``V``. ``mode="chunk"`` runs `_linear_chunk`,
    the same sums for all chunks at once.
    """
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)          # (..., L, d_v + 1)
    S = fq.new_zeros(fq.shape[:-2] + (fq.shape[-1], v1.shape[-1]))   # (..., d_phi, d_v + 1)
    outs = []
    for start in range(0, fq.shape[-2], chunk_size):
        q_c, k_c, v_c = (x[..., start:start + chunk_size, :] for x in (fq, fk, v1))
        inside = (q_c @ k_c.transpose(-2, -1)).tril() @ v_c          # keys j <= i of this chunk
        outs.append(q_c @ S + inside)                                # + every key of the earlier chunks
        S = S + k_c.transpose(-2, -1) @ v_c                          # the state after this chunk
    out = torch.cat(outs, dim=-2)
    return out[..., :-1], out[..., -1]


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, feature_map="elu", causal: bool = False,
                     normalize: bool = True, mode: str = "parallel", chunk_size: int = 64,
                     eps: float = 1e-6) -> torch.Tensor:
    """Kernel linear attention (Katharopoulos et al. 2020).

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``. With ``S_t = sum_j phi(k_j) v_j^T``
    and ``z_t = sum_j phi(k_j)`` over ``j <= t`` (``causal``) or over all ``j``:
    ``o_t = phi(q_t)^T S_t / (phi(q_t)^T z_t + eps)`` if ``normalize``, else ``phi(q_t)^T S_t``.
    No scaling of ``q``.

    ``feature_map``: ``"elu"`` (elu+1), ``"relu"``, ``"identity"``, or a callable mapping
    ``(..., L, d_k)`` to ``(..., L, d_phi)`` (e.g. `taylor2_features`).
    ``mode``: ``"parallel"`` (the ``L x L`` masked product), ``"recurrent"`` (the state loop; non-causal
    reads the final state), ``"chunk"`` (state across chunks of ``chunk_size``, masked product inside).
    With ``"identity"`` or ``"relu"`` the normaliser can be 0 or negative; ``eps`` only guards 0.
    """
    check_qkv(q, k, v, same_length=True)
    _check_mode(mode, _LINEAR_MODES)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    eps = _check_nonneg("eps", eps)
    phi = _resolve_feature_map(feature_map)
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    q, k, v = q.to(cdtype), k.to(cdtype), v.to(cdtype)
    fq, fk = _apply_feature_map(phi, q, k)
    if mode == "parallel":
        num, den = _linear_parallel(fq, fk, v, bool(causal))
    elif mode == "recurrent":
        num, den = _linear_recurrent(fq, fk, v, bool(causal))
    else:
        num, den = _linear_chunk(fq, fk, v, bool(causal), chunk_size)
    out = num / (den + eps).unsqueeze(-1) if normalize else num
    return out.to(in_dtype)


# ----------------------------------------------------------------------------- gated linear attention
def _decay_scores(q, k, log_g):
    """Causal log-space scores ``P[i, j] = sum_f q_if k_jf exp(sum_{j<t<=i} log_g_tf)`` for ``i >= j``, else 0.

    The log decay from key ``j`` to query ``i`` is summed directly over its own terms (a masked
    cumulative sum, the "segment sum"), not taken as a difference ``b_i - b_j`` of running sums:
    over a long sequence those reach hundreds, and their fp32 difference loses digits. ``exp`` only
    sees non-positive numbers; masked entries become ``exp(-inf) = 0`` (zero gradient too).
    """
    length = q.shape[-2]
    mask = _causal(length, q.device)
    strict = torch.ones(length, length, dtype=torch.bool, device=q.device).tril(-1)      # j < i
    terms = log_g.unsqueeze(-2).expand(*log_g.shape[:-1], length, log_g.shape[-1])       # [i, j] = log_g_i
    log_decay = terms.masked_fill(~strict.unsqueeze(-1), 0.0).cumsum(-3)                 # sum over j < t <= i
    decay = log_decay.masked_fill(~mask.unsqueeze(-1), float("-inf")).exp()             # (..., T, T, d_k)
    return (q.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)                          # (..., T, T)


def _gla_recurrent(q, k, v, log_g, state):
    """``S_t = diag(exp(log_g_t)) S_{t-1} + k_t v_t^T``, ``o_t = q_t^T S_t`` (``q`` already scaled)."""
    gate = log_g.exp()
    outs = []
    for t in range(q.shape[-2]):
        state = gate[..., t, :, None] * state + k[..., t, :, None] * v[..., t, None, :]
        outs.append(torch.einsum("...f,...fe->...e", q[..., t, :], state))
    return torch.stack(outs, dim=-2), state


def _gla_parallel(q, k, v, log_g, state):
    """Log-space parallel form: ``O = P V + (Q * exp(b)) S_0`` with ``b = cumsum(log_g)``; ``P`` from `_decay_scores`."""
    b = log_g.cumsum(-2)                                             # (..., L, d_k): decay from the start to i
    out = _decay_scores(q, k, log_g) @ v + (q * b.exp()) @ state
    after = log_g.flip(-2).cumsum(-2).flip(-2) - log_g               # decay from j to the end, summed directly
    final = (k * after.exp()).transpose(-2, -1) @ v + b[..., -1:, :].transpose(-2, -1).exp() * state
    return out, final


_SUB_CHUNK = 8       # chunks longer than this may compute their own part chunkwise too, in sub-chunks of this size
_SAFE_LOG_DECAY = 20.0   # a chunk whose total log decay stays above -this uses the factored form


def _gla_chunk(q, k, v, log_g, state, chunk_size: int, scale: float = 1.0):
    """Chunkwise form: the part inside each chunk, plus the state carried across chunks.

    Cumulative sums ``b`` restart in every chunk. Inside a chunk the decay from key ``j`` to query
    ``i`` is ``exp(b_i - b_j) = exp(b_i) * exp(-b_j)``; when the chunk's total log decay is at least
    ``-_SAFE_LOG_DECAY`` both factors stay within ``e^20`` of 1, so this factored form (two matrix
    products) is exact up to rounding. Chunks with stronger decay instead get their part from this same
    function (all chunks at once, from a zero state, in sub-chunks of ``_SUB_CHUNK``), down to the
    log-space `_decay_scores`, so nothing ever overflows. Padding (zero keys, zero log gates) leaves the
    state unchanged. ``q`` comes unscaled: ``scale`` is applied by the last matrix product, which
    scales the intra part too (``beta``), saving a pass over ``q``. This is the form tuned for
    speed; `_gla_chunk_reference` is the same algorithm as it reads, one chunk at a time.
    """
    length = q.shape[-2]
    chunk_size = min(chunk_size, length)
    qc, kc, vc, gc = (_to_chunks(x, chunk_size) for x in (q, k, v, log_g))   # (..., n, C, d)
    b = gc.cumsum(-2)                                                # log decay from chunk start to i
    b_end = b[..., -1:, :].clone()                                   # (..., n, 1, d_k): whole-chunk decay
    chunk_decay = b_end.exp()                                        # (..., n, 1, d_k)
    factored = bool((b_end >= -_SAFE_LOG_DECAY).all())
    # On a CPU without autograd the factored form reuses its buffers (exp, divide, scale in place): each
    # fresh temporary of this size costs page faults on first touch, up to a third of the time on a
    # 2-core CPU. A GPU's caching allocator hands out memory already touched, so there is no reuse there.
    reuse = factored and q.device.type == "cpu" and not (
        torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, log_g, state)))
    decayed = b.exp_() if reuse else b.exp()                         # exp(b_i) <= 1
    q_in = qc * decayed                                              # query reads decayed from the chunk start
    if factored:
        above = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
        k_back = torch.div(kc, decayed, out=decayed) if reuse else kc / decayed   # key j back at the chunk start
        intra = (q_in @ k_back.transpose(-2, -1)).masked_fill_(above, 0.0) @ vc
        k_out = k_back.mul_(chunk_decay) if reuse else k_back * chunk_decay      # key j decayed to the chunk end
    else:
        if chunk_size > _SUB_CHUNK:
            zero = qc.new_zeros(qc.shape[:-2] + state.shape[-2:])   # (..., n, d_k, d_v)
            intra, _ = _gla_chunk(qc, kc, vc, gc, zero, _SUB_CHUNK)  # (..., n, C, d_v)
        else:
            intra = _decay_scores(qc, kc, gc) @ vc                   # (..., n, C, d_v)
        k_out = kc * (b_end - b).exp()
    chunk_decay = chunk_decay.transpose(-2, -1)                      # (..., n, d_k, 1)
    states = k_out.transpose(-2, -1) @ vc                            # (..., n, d_k, d_v): each chunk's own state
    for c in range(qc.shape[-3]):                                    # elementwise only: decay, then add
        entering, state = state, torch.addcmul(states[..., c, :, :], chunk_decay[..., c, :, :], state)
        states[..., c, :, :] = entering                              # slot c, used, now holds the state entering c
    intra = intra.contiguous()                                       # (..., n, C, d_v)
    _add_inter(intra, q_in, states, scale)                           # + inter
    return _from_chunks(intra, length), state


def _gla_chunk_reference(q, k, v, log_g, state, chunk_size: int):
    """The GLA chunk form as the algorithm reads, one chunk after another → ``(out, final_state)``.

    ``q`` comes scaled. In each chunk, with ``b_i`` the log decay from the chunk's start to step
    ``i`` (a running sum of ``log_g`` that restarts in every chunk) and ``S`` the state entering it:
    ``o_i = (q_i * exp(b_i))^T S + sum_{j <= i} (sum_f q_if k_jf exp(b_if - b_jf)) v_j`` (the second
    term `_decay_scores`, in log space), then ``S = exp(b_end) * S + sum_j (k_j * exp(b_end - b_j)) v_j^T``.
    Every exponent is ``<= 0``. ``mode="chunk"`` runs `_gla_chunk`, the same algorithm with the
    factored product where it is safe: 35 times faster than this one at (1, 8, 4096, 64), chunk 64,
    gates near 0.98, on one CPU thread, where this one's ``(C, C, d_k)`` decays dominate.
    """
    outs = []
    for start in range(0, q.shape[-2], chunk_size):
        q_c, k_c, v_c, g_c = (x[..., start:start + chunk_size, :] for x in (q, k, v, log_g))
        b = g_c.cumsum(-2)                                           # (..., C, d_k): decay from the chunk start
        b_end = b[..., -1:, :]                                       # (..., 1, d_k): the whole chunk's decay
        inside = _decay_scores(q_c, k_c, g_c) @ v_c                  # keys j <= i of this chunk
        outs.append((q_c * b.exp()) @ state + inside)                # + the state entering the chunk
        k_end = k_c * (b_end - b).exp()                              # key j decayed to the chunk's end
        state = b_end.transpose(-2, -1).exp() * state + k_end.transpose(-2, -1) @ v_c
    return torch.cat(outs, dim=-2), state


def gated_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor, *,
                           mode: str = "recurrent", chunk_size: int = 64, scale: float | None = None,
                           initial_state: torch.Tensor | None = None, return_final_state: bool = False):
    """Gated linear attention (GLA, Yang et al. 2024) with per-key-dim forget gates.

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)``, ``log_g (..., L, d_k)`` (the shape of ``k``) →
    ``out (..., L, d_v)``, and ``(out, final_state (..., d_k, d_v))`` with ``return_final_state``:
    ``S_t = diag(exp(log_g_t)) S_{t-1} + k_t v_t^T`` from ``S_0 = initial_state`` (default 0),
    ``o_t = (scale * q_t)^T S_t``. ``scale=None`` means ``1/sqrt(d_k)``; pass ``scale=1.0`` for none.

    ``log_g`` must be finite and ``<= 0`` (gates in ``(0, 1]``); anything else raises ``ValueError``.
    ``mode``: ``"recurrent"`` (the step loop, the reference), ``"parallel"`` (log-space, an
    ``(L, L, d_k)`` temporary), ``"chunk"`` (the state across chunks; inside a chunk the factored
    product ``(Q exp(b)) (K exp(-b))^T`` when the chunk's total log decay is at least ``-20``, log
    space in sub-chunks otherwise; `_gla_chunk_reference` is the same algorithm written plainly).
    fp16/bf16 run in fp32; ``out`` has the input dtype and the final state stays fp32.
    ``initial_state`` may have ``q``'s dtype, or fp32 for half inputs.
    """
    check_qkv(q, k, v, same_length=True)
    check_tensor("log_g", log_g, floating=True)
    if log_g.shape != k.shape:
        raise ValueError(f"log_g must have the shape of k (..., L, d_k) = {tuple(k.shape)}, got {tuple(log_g.shape)}")
    _check_aux_dtype("log_g", log_g, q)
    _check_mode(mode, _GLA_MODES)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    scale = resolve_scale(scale, q.shape[-1])
    low, high = torch.aminmax(log_g.detach()) if log_g.numel() else (log_g.new_zeros(()),) * 2   # NaN: both NaN
    if not (bool(low > float("-inf")) and bool(high <= 0)):
        bad = log_g.detach()[~(torch.isfinite(log_g) & (log_g <= 0))]
        raise ValueError(f"log_g must be finite and <= 0 (log forget gates), got {bad.numel()} bad entries "
                         f"(e.g. {bad[0].item():.4g}) in log_g of shape {tuple(log_g.shape)}")
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    state_shape = q.shape[:-2] + (q.shape[-1], v.shape[-1])
    if initial_state is None:
        state = q.new_zeros(state_shape, dtype=cdtype)
    else:
        check_tensor("initial_state", initial_state, floating=True)
        if initial_state.shape != state_shape:
            raise ValueError(f"initial_state must have shape (..., d_k, d_v) = {tuple(state_shape)} for q "
                             f"{tuple(q.shape)} and v {tuple(v.shape)}, got {tuple(initial_state.shape)}")
        _check_aux_dtype("initial_state", initial_state, q)
        state = initial_state.to(cdtype)
    q, k, v, log_g = q.to(cdtype), k.to(cdtype), v.to(cdtype), log_g.to(cdtype)
    if mode != "chunk":
        q = q * scale
    if mode == "recurrent":
        out, state = _gla_recurrent(q, k, v, log_g, state)
    elif mode == "parallel":
        out, state = _gla_parallel(q, k, v, log_g, state)
    else:
        out, state = _gla_chunk(q, k, v, log_g, state, chunk_size, scale)
    out = out.to(in_dtype)
    return (out, state) if return_final_state else out


# ----------------------------------------------------------------------------- the delta rule
def _delta_recurrent(q, k, v, beta, log_g, state):
    """``S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T``, ``o_t = q_t^T S_t`` (``q`` already scaled).

    ``a_t = exp(log_g_t)``; the correction ``v_t - a_t S_{t-1}^T k_t`` is the value ``v_t`` minus what the
    decayed state already returns for ``k_t``.
    """
    gate = log_g.exp()
    outs = []
    for t in range(q.shape[-2]):
        decayed = gate[..., t, None, None] * state                           # (..., d_k, d_v)
        k_t = k[..., t, :]
        error = v[..., t, :] - torch.einsum("...f,...fe->...e", k_t, decayed)    # (..., d_v)
        state = decayed + beta[..., t, None, None] * k_t[..., :, None] * error[..., None, :]
        outs.append(torch.einsum("...f,...fe->...e", q[..., t, :], state))
    return torch.stack(outs, dim=-2), state


def _delta_chunk(q, k, v, beta, log_g, state, chunk_size: int):
    """The chunk form of the delta rule in the WY/UT representation (Yang et al. 2024), one chunk at a time.

    Inside a chunk, with ``S`` the state entering it, ``b_i`` the log decay from its start to step
    ``i`` and ``D[i, j] = exp(b_i - b_j)`` for ``j <= i`` (else 0), the state after step ``i`` is
    ``exp(b_i) S + sum_{j <= i} D[i, j] k_j u_j^T``, where the corrections ``u_j`` solve the
    triangular system ``(I + A) U = diag(beta) (V - diag(exp(b)) K S)`` with
    ``A = strictly_lower(diag(beta) (K K^T * D))``. With ``T = (I + A)^{-1}`` (the UT transform)
    that is ``U = T diag(beta) V - W S``, ``W = T diag(beta exp(b)) K``: every product is a matrix
    product, and the loop runs over chunks, not steps. Outputs ``O = diag(exp(b)) Q S + (Q K^T * D) U``;
    the state leaving the chunk is ``exp(b_end) S + (K * exp(b_end - b))^T U``. ``b_i - b_j`` is a
    difference of running sums: exact enough in fp64 and for mild gates, but in fp32 a chunk of
    strong gates (sums in the hundreds) loses digits there, as `_decay_scores` explains.
    """
    outs = []
    for start in range(0, q.shape[-2], chunk_size):
        q_c, k_c, v_c = (x[..., start:start + chunk_size, :] for x in (q, k, v))
        beta_c, b = beta[..., start:start + chunk_size, None], log_g[..., start:start + chunk_size].cumsum(-1)
        n = q_c.shape[-2]
        causal = _causal(n, q.device)
        decay = (b[..., :, None] - b[..., None, :]).masked_fill(~causal, float("-inf")).exp()   # D, (..., C, C)
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        A = (beta_c * (k_c @ k_c.transpose(-2, -1)) * decay).tril(-1)
        T = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
        from_start = b.exp()[..., None]                                        # (..., C, 1)
        W = T @ (beta_c * from_start * k_c)                                    # (..., C, d_k)
        U = T @ (beta_c * v_c) - W @ state                                     # (..., C, d_v): the corrections
        outs.append((q_c * from_start) @ state + ((q_c @ k_c.transpose(-2, -1)) * decay) @ U)
        to_end = (b[..., -1:] - b).exp()[..., None]                           # (..., C, 1)
        state = b[..., -1, None, None].exp() * state + (k_c * to_end).transpose(-2, -1) @ U
    return torch.cat(outs, dim=-2), state


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
               log_g: torch.Tensor | None = None, mode: str = "recurrent", chunk_size: int = 64,
               scale: float | None = None, initial_state: torch.Tensor | None = None,
               return_final_state: bool = False):
    """The delta rule (DeltaNet: Schlag et al. 2021, Yang et al. 2024), gated with ``log_g`` (Gated DeltaNet).

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)``, ``beta (..., L)`` (one write strength per step),
    ``log_g (..., L)`` (one log forget gate ``<= 0`` per step; default 0, no forgetting) → ``out (..., L, d_v)``,
    and ``(out, final_state (..., d_k, d_v))`` with ``return_final_state``. From ``S_0 = initial_state``
    (default 0), with ``a_t = exp(log_g_t)``:
    ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, i.e. the state moves the value it
    returns for ``k_t`` towards ``v_t`` by ``beta_t``; ``o_t = (scale * q_t)^T S_t``, ``scale=None``
    meaning ``1/sqrt(d_k)``. Keys are used as given: DeltaNet l2-normalises them, and with unit keys
    and ``0 <= beta <= 2`` no step enlarges the state.

    ``mode``: ``"recurrent"`` (the step loop, the reference) or ``"chunk"`` (the WY/UT chunk form of
    `_delta_chunk`, chunks of ``chunk_size``). The transition ``I - beta_t k_t k_t^T`` is a full
    matrix, so this does not reduce to `gated_linear_attention` (see `reduces_to_gla`); its chunk
    form solves a triangular system per chunk instead. fp16/bf16 run in fp32 (the output in the
    input dtype, the state fp32), like `gated_linear_attention`.
    """
    check_qkv(q, k, v, same_length=True)
    _check_mode(mode, _DELTA_MODES)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    scale = resolve_scale(scale, q.shape[-1])
    steps = q.shape[:-1]
    for name, t in (("beta", beta), ("log_g", log_g)):
        if t is None:
            continue
        check_tensor(name, t, floating=True)
        if t.shape != steps:
            raise ValueError(f"{name} must have shape (..., L) = {tuple(steps)} (one number per step of q "
                             f"{tuple(q.shape)}), got {tuple(t.shape)}")
        _check_aux_dtype(name, t, q)
    if log_g is not None and log_g.numel() and not bool(((log_g <= 0) & torch.isfinite(log_g)).all()):
        bad = log_g.detach()[~((log_g <= 0) & torch.isfinite(log_g))]
        raise ValueError(f"log_g must be finite and <= 0 (log forget gates), got {bad.numel()} bad entries "
                         f"(e.g. {bad[0].item():.4g}) in log_g of shape {tuple(log_g.shape)}")
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    state_shape = q.shape[:-2] + (q.shape[-1], v.shape[-1])
    if initial_state is None:
        state = q.new_zeros(state_shape, dtype=cdtype)
    else:
        check_tensor("initial_state", initial_state, floating=True)
        if initial_state.shape != state_shape:
            raise ValueError(f"initial_state must have shape (..., d_k, d_v) = {tuple(state_shape)} for q "
                             f"{tuple(q.shape)} and v {tuple(v.shape)}, got {tuple(initial_state.shape)}")
        _check_aux_dtype("initial_state", initial_state, q)
        state = initial_state.to(cdtype)
    q, k, v, beta = (x.to(cdtype) for x in (q, k, v, beta))
    log_g = torch.zeros_like(beta) if log_g is None else log_g.to(cdtype)
    q = q * scale
    if mode == "recurrent":
        out, state = _delta_recurrent(q, k, v, beta, log_g, state)
    else:
        out, state = _delta_chunk(q, k, v, beta, log_g, state, chunk_size)
    out = out.to(in_dtype)
    return (out, state) if return_final_state else out


# ----------------------------------------------------------------------------- retention
def retention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma, *, mode: str = "parallel",
              chunk_size: int = 64) -> torch.Tensor:
    """Retention (RetNet, Sun et al. 2023): ``O = (Q K^T ⊙ D) V`` with ``D[n, m] = gamma^(n - m)`` for ``n >= m``.

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``. ``gamma`` in ``(0, 1]``: a number, or a
    tensor broadcastable to the leading dims ``q.shape[:-2]`` (e.g. ``(H,)`` for one decay per head).
    Computed as `gated_linear_attention` with the constant gate ``log_g = log(gamma)`` and
    ``scale=1.0``; ``mode`` and ``chunk_size`` are passed through (``"chunk"`` is Lightning attention's
    left-product-inside, right-product-across scheme). No scaling of ``q``: RetNet-style code scales
    by ``d_k**-0.5``, so pass ``q * d_k**-0.5`` for that.
    """
    check_qkv(q, k, v, same_length=True)
    lead = q.shape[:-2]
    cdtype = _compute_dtype(q.dtype)
    if isinstance(gamma, torch.Tensor):
        check_tensor("gamma", gamma, floating=True)
        if not broadcasts_to(gamma.shape, lead):
            raise ValueError(f"gamma must broadcast to the leading dims of q {tuple(lead)} (e.g. (H,) per head), "
                             f"got shape {tuple(gamma.shape)} for q {tuple(q.shape)}")
        if not bool(((gamma > 0) & (gamma <= 1)).all()):
            raise ValueError(f"gamma must lie in (0, 1], got values in [{gamma.min().item():.4g}, "
                             f"{gamma.max().item():.4g}] of shape {tuple(gamma.shape)}")
        log_gamma = gamma.to(cdtype).log()
    elif isinstance(gamma, numbers.Real) and not isinstance(gamma, bool):
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1], got {gamma!r}")
        log_gamma = torch.tensor(math.log(gamma), dtype=cdtype, device=q.device)
    else:
        raise TypeError(f"gamma must be a number or a tensor, got {type(gamma).__name__}")
    log_g = log_gamma[..., None, None].expand(k.shape)               # the same gate on every step and key dim
    return gated_linear_attention(q, k, v, log_g, mode=mode, chunk_size=chunk_size, scale=1.0)


# ----------------------------------------------------------------------------- Linformer
def linformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, E: torch.Tensor, F: torch.Tensor, *,
                        scale: float | None = None) -> torch.Tensor:
    """Linformer (Wang et al. 2020): softmax attention over ``r`` projected keys and values, non-causal.

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)``; ``E, F (r, L)`` (or ``(..., r, L)``, one per head) mix
    the ``L`` positions into ``r``: ``K' = E K``, ``V' = F V``, ``out = softmax(scale Q K'^T) V'``,
    ``(..., L, d_v)``. The scores are ``L x r``, not ``L x L``. With ``r = L`` and ``E = F = I``
    this is full attention. ``scale=None`` means ``1/sqrt(d_k)``. Half precision runs in fp32.
    """
    check_qkv(q, k, v, same_length=True)
    length = k.shape[-2]
    for name, P in (("E", E), ("F", F)):
        check_tensor(name, P, min_rank=2, floating=True)
        if P.shape[-1] != length:
            raise ValueError(f"{name} must be (r, L) with L = {length} (the length of k {tuple(k.shape)}), "
                             f"got {tuple(P.shape)}")
        _check_aux_dtype(name, P, q)
    if E.shape[-2] != F.shape[-2]:
        raise ValueError(f"E and F must project to the same r, got E {tuple(E.shape)} and F {tuple(F.shape)}")
    scale = resolve_scale(scale, q.shape[-1])
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    q, k, v, E, F = (x.to(cdtype) for x in (q, k, v, E, F))
    k_proj, v_proj = E @ k, F @ v                                    # (..., r, d_k), (..., r, d_v)
    weights = torch.softmax(scale * q @ k_proj.transpose(-2, -1), dim=-1)   # (..., L, r)
    return (weights @ v_proj).to(in_dtype)


# ----------------------------------------------------------------------------- random features
def _generator(seed) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return torch.Generator().manual_seed(int(seed))


def sample_rff(D: int, d: int, sigma: float = 1.0, seed: int = 0, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``D`` random frequencies ``w ~ N(0, sigma^-2 I_d)`` as a ``(D, d)`` matrix (CPU; move it with ``.to``).

    With `rff_features`, ``E[phi(x) . phi(y)] = exp(-|x - y|^2 / (2 sigma^2))`` (the Gaussian kernel of
    width ``sigma``; note the frequencies' variance is ``1/sigma^2``, not ``sigma^2``).
    """
    D, d = check_positive_int("D", D), check_positive_int("d", d)
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"sigma must be a positive finite number, got {sigma!r}")
    return torch.randn(D, d, generator=_generator(seed), dtype=dtype) / sigma


def _check_features_W(x: torch.Tensor, W: torch.Tensor) -> None:
    check_tensor("x", x, min_rank=1, floating=True)
    check_tensor("W", W, rank=2, floating=True)
    if W.shape[1] != x.shape[-1]:
        raise ValueError(f"W must be (m, d) with d = {x.shape[-1]} (the last dim of x {tuple(x.shape)}), "
                         f"got {tuple(W.shape)}")


def rff_features(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Random Fourier features (Rahimi & Recht 2007): ``x (..., d)``, ``W (D, d)`` → ``(..., 2D)``,
    ``phi(x) = [cos(W x), sin(W x)] / sqrt(D)``, so ``phi(x) . phi(y) = mean_i cos(w_i . (x - y))``."""
    _check_features_W(x, W)
    cdtype = _compute_dtype(x.dtype)
    proj = x.to(cdtype) @ W.to(cdtype).T
    return (torch.cat([proj.cos(), proj.sin()], dim=-1) / math.sqrt(W.shape[0])).to(x.dtype)


def positive_random_features(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Performer's positive features (FAVOR+, Choromanski et al. 2021): ``x (..., d)``, ``W (m, d)`` → ``(..., m)``,
    ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)``; with ``w ~ N(0, I)``, ``E[phi(x) . phi(y)] = exp(x . y)``."""
    _check_features_W(x, W)
    x32 = x.to(_compute_dtype(x.dtype))
    out = torch.exp(x32 @ W.to(x32.dtype).T - 0.5 * x32.pow(2).sum(-1, keepdim=True)) / math.sqrt(W.shape[0])
    return out.to(x.dtype)


def orthogonal_gaussian(m: int, d: int, seed: int = 0, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(m, d)`` Gaussian rows, orthogonal within each block of ``d`` rows (Performer's ORF).

    Each block is the ``Q`` of the QR decomposition of a ``d x d`` Gaussian matrix (sign-fixed, so
    Haar-distributed); row ``i`` is then rescaled to the norm of an independent ``N(0, I_d)`` vector
    (chi with ``d`` degrees of freedom), so every row is marginally ``N(0, I_d)`` like i.i.d. draws.
    The last block is cut to ``m mod d`` rows.
    """
    m, d = check_positive_int("m", m), check_positive_int("d", d)
    gen = _generator(seed)
    blocks = []
    for _ in range(-(-m // d)):
        Q, R = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
        blocks.append((Q * torch.sign(torch.diagonal(R))).T)        # rows orthonormal
    rows = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=gen, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (rows * norms).to(dtype)


_FEATURES: dict[tuple, torch.Tensor] = {}


def _performer_features(m: int, d: int, seed: int, orthogonal: bool, device, dtype) -> torch.Tensor:
    """Performer's ``W (m, d)`` for ``seed``, drawn on the CPU once and kept on ``device``: a model
    calls `performer_attention` with the same seed at every step, and a QR on the CPU plus a copy
    to the GPU at every step would stall it. Built outside inference mode, as it outlives the call."""
    key = (m, d, seed, orthogonal, str(device), dtype)
    if key not in _FEATURES:
        with torch.inference_mode(False):
            W = orthogonal_gaussian(m, d, seed) if orthogonal else torch.randn(m, d, generator=_generator(seed))
            _FEATURES[key] = W.to(device=device, dtype=dtype)
    return _FEATURES[key]


def random_feature_kernel(x: torch.Tensor, y: torch.Tensor, W: torch.Tensor, kind: str = "positive") -> torch.Tensor:
    """Random-feature estimate of the softmax kernel ``exp(x . y)``: ``x (..., n, d)``, ``y (..., n', d)`` → ``(..., n, n')``.

    ``kind="positive"``: ``phi+(x) . phi+(y)`` (`positive_random_features`; every estimate > 0).
    ``kind="trig"``: ``exp(|x|^2/2) exp(|y|^2/2) rff(x) . rff(y)`` (`rff_features` with ``sigma = 1``;
    may be negative). Both are unbiased for ``w ~ N(0, I)``; their variances differ.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    check_tensor("y", y, min_rank=2, floating=True)
    if kind == "positive":
        return positive_random_features(x, W) @ positive_random_features(y, W).transpose(-2, -1)
    if kind == "trig":
        gx = (0.5 * x.pow(2).sum(-1, keepdim=True)).exp() * rff_features(x, W)
        gy = (0.5 * y.pow(2).sum(-1, keepdim=True)).exp() * rff_features(y, W)
        return gx @ gy.transpose(-2, -1)
    raise ValueError(f"kind must be 'positive' or 'trig', got {kind!r}")


def random_feature_mse(x: torch.Tensor, y: torch.Tensor, m: int, kind: str = "positive") -> torch.Tensor:
    """The closed-form mean squared error of `random_feature_kernel`'s estimate of ``exp(x . y)`` with ``m``
    i.i.d. ``N(0, I)`` rows of ``W`` (Choromanski et al. 2021, Lemma 2): ``x, y (..., d)`` → ``(...)``.

    With ``z = x + y``: ``"positive"``: ``exp(|z|^2) exp(x . y)^2 (1 - exp(-|z|^2)) / m``;
    ``"trig"``: ``exp(|z|^2) exp(x . y)^-2 (1 - exp(-|x - y|^2))^2 / (2 m)``. The positive one is small
    where the kernel is small, the trigonometric one where ``x`` and ``y`` are close.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    check_tensor("y", y, min_rank=1, floating=True)
    m = check_positive_int("m", m)
    z2 = (x + y).pow(2).sum(-1)
    dot = (x * y).sum(-1)
    if kind == "positive":
        return z2.exp() * (2 * dot).exp() * -torch.expm1(-z2) / m
    if kind == "trig":
        return z2.exp() * (-2 * dot).exp() * torch.expm1(-(x - y).pow(2).sum(-1)).pow(2) / (2 * m)
    raise ValueError(f"kind must be 'positive' or 'trig', got {kind!r}")


def rfa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, W: torch.Tensor, *, causal: bool = False,
                  mode: str = "parallel", chunk_size: int = 64, eps: float = 0.0) -> torch.Tensor:
    """Random Feature Attention (Peng et al. 2021): softmax attention ``softmax(Q K^T) V`` estimated with
    trigonometric random features.

    ``q, k (..., L, d)``, ``v (..., L, d_v)``, ``W (D, d)`` with rows ``~ N(0, I)`` (`sample_rff` with
    ``sigma=1``) → ``(..., L, d_v)``. ``exp(q . k) = exp(|q|^2/2) exp(|k|^2/2) exp(-|q - k|^2/2)``: the last
    factor is ``E[rff(q) . rff(k)]``, the query factor cancels in the normalisation and is left out,
    the key factor multiplies ``rff(k)``. No scaling of ``q`` (pass ``q, k`` times ``d**-0.25`` for
    ``1/sqrt(d)``). ``causal`` and ``mode`` (``"parallel"``, ``"recurrent"``: the constant-size state,
    ``"chunk"``) are those of `linear_attention`. The kernel estimate is unbiased but the ratio is not,
    and the estimated denominator can be ``<= 0`` (trigonometric features are not positive).
    """
    check_qkv(q, k, v, same_length=True)
    _check_features_W(q, W)
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    q, k, v, W = q.to(cdtype), k.to(cdtype), v.to(cdtype), W.to(cdtype)
    fq = rff_features(q, W)
    fk = (0.5 * k.pow(2).sum(-1, keepdim=True)).exp() * rff_features(k, W)
    out = linear_attention(fq, fk, v, feature_map="identity", causal=causal, mode=mode, chunk_size=chunk_size, eps=eps)
    return out.to(in_dtype)


_PERFORMER_HEADROOM = 80.0     # keys' features stay below e^80: fp32 holds e^88, and m of them are summed


def performer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_features: int = 256, *,
                        causal: bool = False, orthogonal: bool = True, seed: int = 0, W: torch.Tensor | None = None,
                        scale: float | None = None, mode: str = "parallel", chunk_size: int = 64) -> torch.Tensor:
    """Performer's FAVOR+ (Choromanski et al. 2021): ``softmax(scale Q K^T) V`` estimated with positive
    random features.

    ``q, k (..., L, d)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``. Features: `positive_random_features` of
    ``x sqrt(scale)`` (``scale=None`` means ``1/sqrt(d)``) with ``W (n_features, d)`` from
    `orthogonal_gaussian` (``orthogonal=True``) or i.i.d. ``N(0, I)``, drawn from ``seed``; pass ``W``
    to fix it. ``causal``, ``mode``, ``chunk_size`` as in `linear_attention` (``eps = 0``: the features are
    positive). Range guard: each query's exponents are shifted by their own maximum, and every key's
    by one constant per sequence; both cancel in the ratio. Non-causal: the largest key exponent.
    Causal: the largest exponent of the *first* key, which is in every query's past, raised to the
    largest exponent of all keys minus 80 only where a later key would otherwise pass ``e^80`` (fp32
    overflows at ``e^88``); so a later key changes no earlier output unless it would overflow it. The
    data-independent bound ``max_i |w_i|^2 / 2`` (``w . x - |x|^2/2 <= |w|^2/2``) is no shift: it
    grows with ``d`` (about 165 at ``d = 256``) while typical exponents stay near 0, so every fp32
    feature underflowed to 0 and the output was NaN.
    """
    check_qkv(q, k, v, same_length=True)
    n_features = check_positive_int("n_features", n_features)
    d = q.shape[-1]
    scale = resolve_scale(scale, d)
    in_dtype = q.dtype
    cdtype = _compute_dtype(in_dtype)
    if W is None:
        W = _performer_features(n_features, d, seed, orthogonal, q.device, cdtype)
    else:
        _check_features_W(q, W)
        if W.shape[0] != n_features:
            raise ValueError(f"W must have n_features = {n_features} rows, got W {tuple(W.shape)}")
        W = W.to(cdtype)
    root = math.sqrt(scale)
    q, k, v = q.to(cdtype) * root, k.to(cdtype) * root, v.to(cdtype)

    def exponents(x):                                                # w . x - |x|^2 / 2, (..., L, m)
        return x @ W.T - 0.5 * x.pow(2).sum(-1, keepdim=True)

    eq = exponents(q)
    fq = torch.exp(eq - eq.amax(-1, keepdim=True).detach())
    ek = exponents(k)
    top = ek.detach().amax((-2, -1), keepdim=True)                  # (..., 1, 1)
    first = ek.detach()[..., :1, :].amax(-1, keepdim=True)         # the first key's largest exponent
    shift = torch.maximum(first, top - _PERFORMER_HEADROOM) if causal else top
    fk = torch.exp(ek - shift)
    out = linear_attention(fq, fk, v, feature_map="identity", causal=causal, mode=mode, chunk_size=chunk_size, eps=0.0)
    return out.to(in_dtype)


# ----------------------------------------------------------------------------- fixed-state capacity
_RULES = ("additive", "delta")


def recall_error(keys: torch.Tensor, values: torch.Tensor, *, rule: str = "additive") -> torch.Tensor:
    """Relative recall error of a fixed state that stores ``n`` key-value pairs.

    ``keys (..., n, d_k)``, ``values (..., n, d_v)`` → ``(...)``: the pairs are written in order into a
    ``(d_k, d_v)`` state ``S``, each key reads ``k_i^T S``, and the error is ``|K S - V|_F / |V|_F``.
    ``rule="additive"``: ``S = sum_j k_j v_j^T`` (the state of non-causal `linear_attention` with the
    identity map, no normalisation), so ``k_i^T S = (k_i . k_i) v_i + sum_{j != i} (k_i . k_j) v_j`` (the
    crosstalk): zero for orthonormal keys (so ``n <= d_k``), about ``sqrt((n - 1) / d_k)`` for random
    unit keys. ``rule="delta"``: the final state of `delta_rule` with ``beta = 1``, each write replacing
    what the state returned for its key (exact for the last key written; with unit keys).
    """
    if rule not in _RULES:
        raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")
    if rule == "additive":
        read = linear_attention(keys, keys, values, feature_map="identity", normalize=False)
    else:
        check_qkv(keys, keys, values, same_length=True)
        beta = keys.new_ones(keys.shape[:-1])
        _, S = delta_rule(keys, keys, values, beta, scale=1.0, return_final_state=True)
        read = keys @ S
    return (read - values).flatten(-2).norm(dim=-1) / values.flatten(-2).norm(dim=-1)


def capacity_curve(d: int, ns, *, trials: int = 20, orthonormal: bool = False, seed: int = 0,
                   rule: str = "additive") -> torch.Tensor:
    """Mean `recall_error` (with ``rule``) over ``trials`` draws of ``n`` pairs in dimension ``d``, for each ``n`` in ``ns`` → ``(len(ns),)``.

    Keys are random unit vectors, or (``orthonormal=True``, needs ``n <= d``) orthonormal ones; values
    are standard Gaussian ``(n, d)``. fp64 on the CPU. The same ``seed`` draws the same pairs for
    either rule.
    """
    d, trials = check_positive_int("d", d), check_positive_int("trials", trials)
    ns = [check_positive_int("each n in ns", n) for n in ns]
    if rule not in _RULES:
        raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")
    gen = _generator(seed)
    errors = []
    for n in ns:
        if orthonormal:
            if n > d:
                raise ValueError(f"orthonormal keys need n <= d, got n = {n} and d = {d}")
            keys = torch.linalg.qr(torch.randn(trials, d, n, generator=gen, dtype=torch.float64))[0].transpose(-2, -1)
        else:
            keys = F.normalize(torch.randn(trials, n, d, generator=gen, dtype=torch.float64), dim=-1)
        values = torch.randn(trials, n, d, generator=gen, dtype=torch.float64)
        errors.append(recall_error(keys, values, rule=rule).mean())
    return torch.stack(errors)


# ----------------------------------------------------------------------------- gate parameterisations
# How each gate of GLA's Table 1 (Yang et al. 2024) decays the (d_k, d_v) state: one number per step
# ("scalar"), one per key dim ("diagonal", the gate GLA uses), an outer product alpha beta^T of a key
# and a value gate ("outer", DFW), or one number per state entry ("entry", Mamba). RetNet's constant
# gamma (Sun et al. 2023) is not a row of that table (its rows are data-dependent); it is here as the
# constant case of a scalar gate.
GATE_KINDS: dict[str, str] = {
    "retnet": "scalar", "mamba2": "scalar", "mlstm": "scalar", "gated_retention": "scalar",
    "gla": "diagonal", "hgrn2": "diagonal", "rwkv6": "diagonal", "gateloop": "diagonal",
    "dfw": "outer", "mamba": "entry",
}
_GATE_STRUCTURES = ("scalar", "diagonal", "outer", "entry", "dense")


def reduces_to_gla(kind: str) -> bool:
    """True if the recurrence ``S_t = G_t * S_{t-1} + k_t v_t^T`` is computed by `gated_linear_attention` (and so by its chunk form).

    ``kind`` is a model of `GATE_KINDS` or a structure: ``"scalar"``, ``"diagonal"``, ``"outer"``,
    ``"entry"`` (``G_t * S`` elementwise) or ``"dense"`` (``S_t = A_t S_{t-1} + k_t v_t^T``, a full matrix).
    Every gate of the table reduces; they differ in what it costs. A scalar or per-key-dim gate folds
    into ``q`` (times ``exp(b_i)``) and ``k`` (times ``exp(-b_j)``): one `gated_linear_attention` call.
    An outer-product gate is ``(alpha beta^T) * S = diag(alpha) S diag(beta)``: ``alpha`` folds into
    ``q, k`` as before, ``beta`` into the values (``v_j / B_j``) and outputs (``o_t B_t``), with ``B`` the
    running product of ``beta``. A per-entry gate leaves each value column its own per-key-dim gate:
    ``d_v`` heads of one call, one value column each (`gated_linear_attention_per_entry`, ``d_v`` times
    the decay work), as chapter 9 runs Mamba's selective scan. A dense transition mixes the rows of
    ``S``: False, it does not reduce to `gated_linear_attention`. That says nothing against chunking
    it: the delta rule's ``A_t = I - beta_t k_t k_t^T`` is dense and has a chunk form of its own
    (`delta_rule` with ``mode="chunk"``).
    """
    if kind in GATE_KINDS:
        kind = GATE_KINDS[kind]
    if kind not in _GATE_STRUCTURES:
        raise ValueError(f"kind must be one of {tuple(GATE_KINDS)} or a structure {_GATE_STRUCTURES}, got {kind!r}")
    return kind != "dense"


def gated_linear_attention_per_entry(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor,
                                     **kwargs) -> torch.Tensor:
    """`gated_linear_attention` with a gate per state entry, ``log_g (..., L, d_k, d_v)``, one value column at a time.

    Column ``e`` of the state, ``S[:, e]``, obeys ``S_t[:, e] = g_t[:, e] * S_{t-1}[:, e] + k_t v_{t,e}``, a
    per-key-dim gated recurrence of its own, so the ``d_v`` columns run as ``d_v`` heads of one
    `gated_linear_attention` call (``kwargs``: ``mode``, ``chunk_size``, ``scale``) → ``(..., L, d_v)``.
    """
    check_qkv(q, k, v, same_length=True)
    check_tensor("log_g", log_g, floating=True)
    if log_g.shape != k.shape + (v.shape[-1],):
        raise ValueError(f"log_g must have shape (..., L, d_k, d_v) = {tuple(k.shape + (v.shape[-1],))} for "
                         f"k {tuple(k.shape)} and v {tuple(v.shape)}, got {tuple(log_g.shape)}")
    d_v = v.shape[-1]
    heads = lambda x: x.unsqueeze(-3).expand(x.shape[:-2] + (d_v,) + x.shape[-2:])   # (..., d_v, L, d)
    out = gated_linear_attention(heads(q), heads(k), v.movedim(-1, -2).unsqueeze(-1), log_g.movedim(-1, -3),
                                 **kwargs)                          # (..., d_v, L, 1)
    return out.squeeze(-1).movedim(-2, -1)


def make_log_gate(kind: str, x: torch.Tensor, params: dict) -> torch.Tensor:
    """Log forget gates (all ``< 0``, or ``<= 0`` for ``"retnet"``) of GLA's Table 1, and RetNet's, from inputs ``x (..., L, d_model)``.

    ``kind`` and ``params`` (weights as tensors, ``tau``/``gamma`` as numbers or tensors):

    * scalar, ``(..., L, 1)`` (expand to ``k``'s shape for `gated_linear_attention`):
      ``"retnet"`` ``{gamma}``: ``log gamma``; ``"mamba2"`` ``{W (d_model, 1), a}``: ``-softplus(x W) exp(a)``;
      ``"mlstm"`` ``{W}``: ``log sigmoid(x W)``; ``"gated_retention"`` ``{W, tau}``: ``log sigmoid(x W) / tau``.
    * diagonal, ``(..., L, d_k)``: ``"gla"`` ``{W1 (d_model, r), W2 (r, d_k), tau}``: ``log sigmoid(x W1 W2) / tau``;
      ``"hgrn2"`` ``{W (d_model, d_k), gamma (d_k,)}``: ``log(gamma + (1 - gamma) sigmoid(x W))``;
      ``"rwkv6"`` ``{W}``: ``-exp(x W)``; ``"gateloop"`` ``{W}``: ``log sigmoid(x W)`` (the gate's magnitude;
      GateLoop's complex phase is left out).
    * per state entry, ``(..., L, d_k, d_v)`` (computed by the routes of `reduces_to_gla`):
      ``"mamba"`` ``{W1 (d_model, r), W2 (r, d_v), A (d_k, d_v)}``: ``-softplus(x W1 W2)[j] exp(A[i, j])``;
      ``"dfw"`` ``{Wa (d_model, d_k), Wb (d_model, d_v)}``: ``log sigmoid(x Wa)[i] + log sigmoid(x Wb)[j]``
      (an outer product ``alpha beta^T`` of the gates).
    """
    if kind not in GATE_KINDS:
        raise ValueError(f"kind must be one of {tuple(GATE_KINDS)}, got {kind!r}")
    check_tensor("x", x, min_rank=2, floating=True)
    needed = {"retnet": ("gamma",), "mamba2": ("W", "a"), "mlstm": ("W",), "gated_retention": ("W", "tau"),
              "gla": ("W1", "W2", "tau"), "hgrn2": ("W", "gamma"), "rwkv6": ("W",), "gateloop": ("W",),
              "mamba": ("W1", "W2", "A"), "dfw": ("Wa", "Wb")}[kind]
    missing = [name for name in needed if name not in params]
    if missing:
        raise ValueError(f"make_log_gate({kind!r}) needs params {needed}, missing {missing}")
    p = {name: params[name] for name in needed}
    for name in ("W", "W1", "Wa", "Wb"):
        if name in p and (not isinstance(p[name], torch.Tensor) or p[name].dim() != 2 or p[name].shape[0] != x.shape[-1]):
            got = tuple(p[name].shape) if isinstance(p[name], torch.Tensor) else type(p[name]).__name__
            raise ValueError(f"params[{name!r}] must be (d_model, ...) with d_model = {x.shape[-1]} (x {tuple(x.shape)}), "
                             f"got {got}")
    if "tau" in p and not bool(torch.all(torch.as_tensor(p["tau"]) > 0)):
        raise ValueError(f"params['tau'] must be > 0, got {p['tau']!r}")
    if kind == "retnet":
        gamma = torch.as_tensor(p["gamma"], dtype=x.dtype, device=x.device)
        if not bool(((gamma > 0) & (gamma <= 1)).all()):
            raise ValueError(f"params['gamma'] must lie in (0, 1], got {p['gamma']!r}")
        return gamma.log().expand(x.shape[:-1] + (1,))
    if kind == "mamba2":
        return -F.softplus(x @ p["W"]) * torch.as_tensor(p["a"], dtype=x.dtype, device=x.device).exp()
    if kind in ("mlstm", "gateloop"):
        return F.logsigmoid(x @ p["W"])
    if kind == "gated_retention":
        return F.logsigmoid(x @ p["W"]) / p["tau"]
    if kind == "gla":
        return F.logsigmoid(x @ p["W1"] @ p["W2"]) / p["tau"]
    if kind == "hgrn2":
        gamma = torch.as_tensor(p["gamma"], dtype=x.dtype, device=x.device)
        if not bool(((gamma >= 0) & (gamma < 1)).all()):
            raise ValueError(f"params['gamma'] (the lower bound) must lie in [0, 1), got {p['gamma']!r}")
        return torch.log(gamma + (1 - gamma) * torch.sigmoid(x @ p["W"]))
    if kind == "rwkv6":
        return -torch.exp(x @ p["W"])
    if kind == "mamba":
        return -F.softplus(x @ p["W1"] @ p["W2"]).unsqueeze(-2) * p["A"].exp()
    return F.logsigmoid(x @ p["Wa"]).unsqueeze(-1) + F.logsigmoid(x @ p["Wb"]).unsqueeze(-2)   # dfw
