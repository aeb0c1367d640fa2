"""Linear attention (Chapter 8): kernel linear attention in its parallel, recurrent and chunkwise
forms, gated linear attention (GLA), retention, and the Taylor-2 feature map.

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

from .utils import check_positive_int, check_same_dtype, check_tensor

__all__ = [
    "FEATURE_MAPS",
    "elu_feature_map",
    "linear_attention",
    "gated_linear_attention",
    "retention",
    "taylor2_features",
]

_LINEAR_MODES = ("parallel", "recurrent", "chunk")
_GLA_MODES = ("recurrent", "parallel", "chunk")


# ----------------------------------------------------------------------------- feature maps
def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1`` (Katharopoulos et al. 2020): ``x + 1`` for ``x > 0``, ``exp(x)`` otherwise; always > 0."""
    return F.elu(x) + 1.0


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


FEATURE_MAPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu": elu_feature_map,
    "relu": F.relu,
    "identity": _identity,
}


def taylor2_features(x: torch.Tensor) -> torch.Tensor:
    """Second-order Taylor feature map ``[1, x, vec(x x^T) / sqrt(2)]`` (M8.10).

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
def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, min_rank=2, floating=True)
    check_same_dtype(q=q, k=k, v=v)
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if not q.dim() == k.dim() == v.dim():
        raise ValueError(f"q, k, v must have the same rank (..., L, d), got {shapes}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"q, k, v must share their leading dims (e.g. batch, heads), got {shapes}")
    if not q.shape[-2] == k.shape[-2] == v.shape[-2]:
        raise ValueError(f"q, k, v must share the sequence length L (dim -2), got {shapes}")
    if q.shape[-2] == 0:
        raise ValueError(f"the sequence length L (dim -2) must be positive, got {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size d_k (dim -1), got {shapes}")


def _check_mode(mode, allowed: tuple[str, ...]) -> str:
    if not isinstance(mode, str) or mode not in allowed:
        raise ValueError(f"mode must be one of {allowed}, got {mode!r}")
    return mode


def _check_nonneg(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half types (accumulate in fp32), otherwise the dtype itself."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


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
    return x.reshape(x.shape[:-2] + (-1, chunk_size, x.shape[-1]))


def _from_chunks(x: torch.Tensor, length: int) -> torch.Tensor:
    """``(..., n, C, d)`` → ``(..., L, d)``, dropping the padding."""
    return x.reshape(x.shape[:-3] + (-1, x.shape[-1]))[..., :length, :]


def _causal(n: int, device: torch.device) -> torch.Tensor:
    """Boolean ``(n, n)`` lower-triangular mask, True where ``i >= j``."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


# ----------------------------------------------------------------------------- linear attention (M8.8, M8.9)
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
    """Chunkwise form: the state entering each chunk (inter) plus a masked product inside it (intra)."""
    length = fq.shape[-2]
    chunk_size = min(chunk_size, length)                             # one chunk never needs padding past L
    qc, kc, vc = (_to_chunks(x, chunk_size) for x in (fq, fk, v))   # (..., n, C, d); padded keys are 0
    kv = kc.transpose(-2, -1) @ vc                                   # (..., n, d_phi, d_v): chunk's share of S
    ksum = kc.sum(-2)                                                # (..., n, d_phi): chunk's share of z
    if causal:
        # exclusive prefix sums over chunks: the state before chunk c holds chunks 0 .. c-1
        S = torch.cat([torch.zeros_like(kv[..., :1, :, :]), kv[..., :-1, :, :]], dim=-3).cumsum(-3)
        z = torch.cat([torch.zeros_like(ksum[..., :1, :]), ksum[..., :-1, :]], dim=-2).cumsum(-2)
        intra = (qc @ kc.transpose(-2, -1)).tril()                   # (..., n, C, C)
        num = qc @ S + intra @ vc
        den = (qc * z.unsqueeze(-2)).sum(-1) + intra.sum(-1)
    else:
        S = kv.sum(-3, keepdim=True)                                 # full sums, accumulated chunk by chunk
        z = ksum.sum(-2, keepdim=True)
        num = qc @ S
        den = (qc * z.unsqueeze(-2)).sum(-1)
    return _from_chunks(num, length), _from_chunks(den.unsqueeze(-1), length).squeeze(-1)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, feature_map="elu", causal: bool = False,
                     normalize: bool = True, mode: str = "parallel", chunk_size: int = 64,
                     eps: float = 1e-6) -> torch.Tensor:
    """Kernel linear attention (Katharopoulos et al. 2020), M8.8 and M8.9.

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
    _check_qkv(q, k, v)
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


# ----------------------------------------------------------------------------- gated linear attention (M8.13)
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


def _gla_chunk(q, k, v, log_g, state, chunk_size: int):
    """Chunkwise form: log-space parallel inside each chunk, the state carried across chunks.

    Cumulative sums restart in every chunk, so their size stays bounded by ``C * max|log_g|``.
    Padding (zero keys, zero log gates) leaves the state unchanged.
    """
    length = q.shape[-2]
    chunk_size = min(chunk_size, length)
    qc, kc, vc, gc = (_to_chunks(x, chunk_size) for x in (q, k, v, log_g))   # (..., n, C, d)
    b = gc.cumsum(-2)                                                # log decay from chunk start to i
    intra = _decay_scores(qc, kc, gc) @ vc                           # (..., n, C, d_v)
    b_end = b[..., -1:, :]                                           # (..., n, 1, d_k): whole-chunk decay
    q_in = qc * b.exp()                                              # query reads the entering state decayed to i
    k_out = kc * (b_end - b).exp()                                   # key j decayed to the chunk end
    chunk_decay = b_end.transpose(-2, -1).exp()                      # (..., n, d_k, 1)
    entering = []
    for c in range(qc.shape[-3]):
        entering.append(state)
        state = chunk_decay[..., c, :, :] * state + k_out[..., c, :, :].transpose(-2, -1) @ vc[..., c, :, :]
    inter = q_in @ torch.stack(entering, dim=-3)                     # (..., n, C, d_v)
    return _from_chunks(intra + inter, length), state


def _resolve_scale(scale, d_k: int) -> float:
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return float(scale)


def gated_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor, *,
                           mode: str = "recurrent", chunk_size: int = 64, scale: float | None = None,
                           initial_state: torch.Tensor | None = None, return_final_state: bool = False):
    """Gated linear attention (GLA, Yang et al. 2024) with per-key-dim forget gates, M8.13.

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)``, ``log_g (..., L, d_k)`` (the shape of ``k``) →
    ``out (..., L, d_v)``, and ``(out, final_state (..., d_k, d_v))`` with ``return_final_state``:
    ``S_t = diag(exp(log_g_t)) S_{t-1} + k_t v_t^T`` from ``S_0 = initial_state`` (default 0),
    ``o_t = (scale * q_t)^T S_t``. ``scale=None`` means ``1/sqrt(d_k)``; pass ``scale=1.0`` for none.

    ``log_g`` must be finite and ``<= 0`` (gates in ``(0, 1]``); anything else raises ``ValueError``.
    ``mode``: ``"recurrent"`` (the step loop, the reference), ``"parallel"`` (log-space, an
    ``(L, L, d_k)`` temporary), ``"chunk"`` (log-space inside chunks, the state across them).
    fp16/bf16 run in fp32; ``out`` has the input dtype and the final state stays fp32.
    ``initial_state`` may have ``q``'s dtype, or fp32 for half inputs.
    """
    _check_qkv(q, k, v)
    check_tensor("log_g", log_g, floating=True)
    if log_g.shape != k.shape:
        raise ValueError(f"log_g must have the shape of k (..., L, d_k) = {tuple(k.shape)}, got {tuple(log_g.shape)}")
    _check_aux_dtype("log_g", log_g, q)
    _check_mode(mode, _GLA_MODES)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    scale = _resolve_scale(scale, q.shape[-1])
    ok = torch.isfinite(log_g) & (log_g <= 0)
    if not bool(ok.all()):
        bad = log_g.detach()[~ok]
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
    q = q.to(cdtype) * scale
    k, v, log_g = k.to(cdtype), v.to(cdtype), log_g.to(cdtype)
    if mode == "recurrent":
        out, state = _gla_recurrent(q, k, v, log_g, state)
    elif mode == "parallel":
        out, state = _gla_parallel(q, k, v, log_g, state)
    else:
        out, state = _gla_chunk(q, k, v, log_g, state, chunk_size)
    out = out.to(in_dtype)
    return (out, state) if return_final_state else out


# ----------------------------------------------------------------------------- retention (M8.15)
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
    _check_qkv(q, k, v)
    lead = q.shape[:-2]
    cdtype = _compute_dtype(q.dtype)
    if isinstance(gamma, torch.Tensor):
        check_tensor("gamma", gamma, floating=True)
        try:
            ok_shape = torch.broadcast_shapes(gamma.shape, lead) == lead
        except RuntimeError:
            ok_shape = False
        if not ok_shape:
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
