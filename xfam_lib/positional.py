"""Positional encodings: absolute (sinusoidal, learned), relative (Shaw, Transformer-XL, T5),
rotary (RoPE), linear biases (ALiBi), and distance-aware reweighting (DA-Transformer).
The length-extrapolation experiment that compares them lives in `xfam_lib.ablations`.

Conventions (book-wide, see ``shared/API.md``):

* ``theta_i = base^(-2i/d)`` is the frequency of pair ``i``; ``p * theta_i`` is its angle at position ``p``.
* Sinusoid tables are interleaved: ``PE[p, 2i] = sin(p * theta_i)``, ``PE[p, 2i+1] = cos(p * theta_i)``.
* RoPE rotates queries and keys (never values). The default layout pairs dims ``(i, i + d/2)``
  ("rotate_half"); ``interleaved=True`` pairs ``(2i, 2i+1)``. ``R(a) = [[cos a, -sin a], [sin a, cos a]]``.
* Relative position is ``key_pos - query_pos`` (T5, Shaw) and distances are ``|i' - j|``.
* When ``q_len != k_len`` the queries are the *last* ``q_len`` positions (bottom-right aligned):
  query row ``i`` sits at absolute position ``i' = i + k_len - q_len``.
* Additive biases are ``(n_heads, q_len, k_len)`` and broadcast against scores ``(B, H, Lq, Lk)``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import (KVCache, MultiHeadAttention, _combined_mask, _masked_softmax, causal_mask,
                        scaled_dot_product_attention)
from .utils import broadcasts_to, check_bias, check_positive_int, check_qkv, check_tensor, compute_dtype, resolve_scale

__all__ = [
    # absolute
    "sinusoidal_encoding", "sinusoidal_wavelengths", "sinusoidal_shift_matrix", "LearnedPositionalEmbedding",
    "ut_coordinate_encoding",
    "absolute_pe_logit_terms",
    # rotary
    "rope_frequencies", "apply_rope", "apply_rope_reference", "RotaryEmbedding", "rope_matrix", "rope_permutation",
    "to_half_split", "to_interleaved", "rope_turns",
    # relative
    "relative_positions", "shaw_relative_positions", "shaw_relative_attention", "shaw_relative_attention_reference",
    "ShawRelativeAttention", "rel_shift", "rel_shift_reference", "xl_relative_scores",
    "xl_relative_scores_reference", "XLRelativeAttention", "t5_relative_position_bucket", "T5RelativeBias",
    # biases and reweighting
    "alibi_slopes", "alibi_bias", "AlibiBias", "da_weight", "da_attention", "da_attention_reference",
]


# ============================================================================= shared helpers
def _check_lengths(q_len: int, k_len: int | None) -> tuple[int, int]:
    """Validate positive lengths (``k_len`` defaults to ``q_len``) and return both. Any ``k_len`` is
    allowed, as in SDPA: query ``i`` sits at ``i' = i + k_len - q_len``, negative when ``k_len < q_len``."""
    q_len = check_positive_int("q_len", q_len)
    k_len = q_len if k_len is None else check_positive_int("k_len", k_len)
    return q_len, k_len


def _offsets(q_len: int, k_len: int, n: int, device) -> torch.Tensor:
    """Indices ``(q_len, k_len)`` of ``j - i'`` into a vector over the offsets ``-(n-1) .. n-1``."""
    return relative_positions(q_len, k_len, device=device) + (n - 1)


def relative_positions(q_len: int, k_len: int | None = None, *,
                       device: torch.device | str | None = None) -> torch.Tensor:
    """Integer matrix ``(q_len, k_len)`` of ``j - i'`` (key minus query position), bottom-right aligned."""
    q_len, k_len = _check_lengths(q_len, k_len)
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return j - i


def _check_positions(positions: torch.Tensor, length: int, *, fractional: bool = False) -> None:
    check_tensor("positions", positions, rank=1)
    if positions.is_complex() or positions.dtype == torch.bool or (positions.is_floating_point() and not fractional):
        kind = "a real (integer or floating)" if fractional else "an integer"
        raise TypeError(f"positions must be {kind} tensor, got dtype {positions.dtype}")
    if positions.numel() != length:
        raise ValueError(f"positions must have length L={length} (dim -2 of x), got {positions.numel()}")
    # The range is checked where it costs nothing: reading a GPU tensor's minimum would stop the
    # host until the GPU catches up, at every decoded token. GPU positions are not range-checked.
    if positions.device.type == "cpu" and positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be non-negative, got min {int(positions.min())}")


# ============================================================================= absolute positions
def sinusoidal_encoding(length: int, d_model: int, base: float = 10000.0, *,
                        device: torch.device | str | None = None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sinusoidal table ``(length, d_model)``: ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(...)``.

    Computed in fp64 on ``device`` (so a GPU caller gets it without a copy from the host), returned
    in ``dtype``.
    """
    length = check_positive_int("length", length)
    d_model = check_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even for sin/cos pairs, got {d_model}")
    if base <= 0:
        raise ValueError(f"base must be positive, got {base}")
    angles = (torch.arange(length, dtype=torch.float64, device=device)[:, None]
              * rope_frequencies(d_model, base, dtype=torch.float64, device=device))
    pe = torch.empty(length, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.to(dtype)


def sinusoidal_wavelengths(d_model: int, base: float = 10000.0) -> torch.Tensor:
    """Wavelength of each sin/cos pair, ``2*pi / theta_i = 2*pi * base^(2i/d)``: ``(d_model/2,)`` fp64.

    They grow geometrically from ``2*pi`` to ``2*pi * base^((d-2)/d)`` (60,611 at d=512).
    """
    d_model = check_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    return 2 * math.pi / rope_frequencies(d_model, base, dtype=torch.float64)


def sinusoidal_shift_matrix(delta: float, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed ``(d_model, d_model)`` fp64 matrix ``M`` with ``PE(p + delta) = M @ PE(p)`` for every ``p``.

    Block ``i`` acts on ``(sin a, cos a)`` with ``a = p * theta_i`` and ``b = delta * theta_i``:
    ``[[cos b, sin b], [-sin b, cos b]]`` (angle addition). For row tables use ``pe @ M.T``.
    """
    d_model = check_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    b = float(delta) * rope_frequencies(d_model, base, dtype=torch.float64)
    c, s = torch.cos(b), torch.sin(b)
    blocks = torch.stack((torch.stack((c, s), -1), torch.stack((-s, c), -1)), -2)      # (d/2, 2, 2)
    return torch.block_diag(*blocks)


def ut_coordinate_encoding(length: int, n_steps: int, d_model: int, base: float = 10000.0, *,
                           device: torch.device | str | None = None,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The Universal Transformer's coordinate embedding ``(n_steps, length, d_model)``.

    ``P[t - 1, p] = PE[p] + PE[t]`` for recurrence steps ``t = 1 .. n_steps`` and positions ``p``, with
    ``PE`` the `sinusoidal_encoding`: the position and step sinusoids are added (the "⊕" of the
    sources). Step ``t`` adds ``P[t - 1]`` to the state before the shared layer.
    Computed on ``device`` in fp64, returned in ``dtype``.
    """
    n_steps = check_positive_int("n_steps", n_steps)
    table = dict(device=device, dtype=torch.float64)
    positions = sinusoidal_encoding(length, d_model, base, **table)                 # (length, d)
    steps = sinusoidal_encoding(n_steps + 1, d_model, base, **table)[1:]             # steps 1 .. n_steps
    return (positions.unsqueeze(0) + steps.unsqueeze(1)).to(dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trainable table ``(max_len, d_model)`` of absolute position vectors (Gehring et al. 2017).

    ``forward(positions)`` takes an int length ``L`` (positions ``0..L-1``) or a 1-D integer tensor
    and returns ``(L, d_model)``. There are no rows beyond ``max_len``: asking for one raises.
    """

    def __init__(self, max_len: int, d_model: int, *, init_std: float = 0.02):
        super().__init__()
        self.max_len = check_positive_int("max_len", max_len)
        check_positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * init_std)

    def forward(self, positions: int | torch.Tensor) -> torch.Tensor:
        if isinstance(positions, torch.Tensor):
            _check_positions(positions, positions.numel())
        else:
            positions = torch.arange(check_positive_int("positions", positions), device=self.weight.device)
        if positions.device.type == "cpu" and positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} is beyond max_len={self.max_len}: a learned table "
                             f"has no row for it")
        return self.weight[positions]


def absolute_pe_logit_terms(x: torch.Tensor, p: torch.Tensor, W_q: torch.Tensor,
                            W_k: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four ``(L, L)`` terms of ``((x + p) W_q)((x + p) W_k)^T`` for inputs ``x, p (L, d)``, ``W (d, d_k)``.

    Keys: ``"content-content"`` ``x W_q W_k^T x^T``, ``"content-position"`` ``x W_q W_k^T p^T``,
    ``"position-content"`` ``p W_q W_k^T x^T``, ``"position-position"`` ``p W_q W_k^T p^T``. Their sum
    is the full (unscaled) logit matrix.
    """
    for name, t in (("x", x), ("p", p), ("W_q", W_q), ("W_k", W_k)):
        check_tensor(name, t, rank=2, floating=True)
    if x.shape != p.shape or W_q.shape != W_k.shape or W_q.shape[0] != x.shape[1]:
        raise ValueError(f"need x, p (L, d) and W_q, W_k (d, d_k); got x {tuple(x.shape)}, p {tuple(p.shape)}, "
                         f"W_q {tuple(W_q.shape)}, W_k {tuple(W_k.shape)}")
    xq, xk, pq, pk = x @ W_q, x @ W_k, p @ W_q, p @ W_k
    return {"content-content": xq @ xk.T, "content-position": xq @ pk.T,
            "position-content": pq @ xk.T, "position-position": pq @ pk.T}


# ============================================================================= RoPE
def rope_frequencies(d: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """The ``d/2`` frequencies ``theta_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``.

    Computed as ``1 / base^(2i/d)``, the form of the reference implementations (Meta's Llama, Hugging
    Face, x-transformers), so fp32 tables agree with theirs bit for bit, not only to an ulp: an ulp of
    ``theta_i`` becomes ``p`` times that in the angle at position ``p`` (1.2e-4 rad for ``theta_0`` at 1000).
    """
    return 1.0 / base ** (torch.arange(0, d, 2, dtype=dtype, device=device) / d)


_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _cos_sin(n_positions: int, d: int, base: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin tables ``(n, d/2)`` for positions ``0 .. n-1``, cached per (d, base, device) and grown on demand.

    Built outside inference mode even when called inside it: the cache outlives the call, and a table
    made of inference tensors could not be used later by a training step that records autograd.
    """
    key = (d, float(base), str(device))
    cached = _TABLES.get(key)
    if cached is None or cached[0].shape[0] < n_positions:
        n = max(n_positions, 2 * cached[0].shape[0] if cached is not None else 0)
        with torch.inference_mode(False):
            angles = torch.arange(n, dtype=torch.float32, device=device)[:, None] * rope_frequencies(d, base, device=device)
            cached = (torch.cos(angles), torch.sin(angles))
        _TABLES[key] = cached
    return cached


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)`` per pair, written straight into one output buffer."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    if interleaved:
        x1, x2, o1, o2 = x[..., 0::2], x[..., 1::2], out[..., 0::2], out[..., 1::2]
    else:
        x1, x2, o1, o2 = x[..., : d // 2], x[..., d // 2:], out[..., : d // 2], out[..., d // 2:]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-1.0)
    torch.mul(x1, sin, out=o2)
    o2.addcmul_(x2, cos)
    return out


class _RopeFunction(torch.autograd.Function):
    """RoPE as a rotation with its exact backward: the transpose of ``R(a)`` is ``R(-a)``."""

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return _rotate(x, cos, sin, interleaved)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _RopeFunction.apply(grad, cos, -sin, ctx.interleaved), None, None, None


def apply_rope_reference(x: torch.Tensor, positions: torch.Tensor | None = None, *,
                         base: float = 10000.0) -> torch.Tensor:
    """Half-split RoPE as GPT-NeoX and Hugging Face write it: ``x * cos + rotate_half(x) * sin``.

    ``x (..., L, d)`` with even ``d``; pair ``i`` is ``(x_i, x_{i+d/2})`` and ``rotate_half`` maps the
    halves ``(x1, x2)`` to ``(-x2, x1)``. The readable reference that `apply_rope` is tested against,
    computed in the dtype of ``x``; the interleaved layout is
    ``to_interleaved(apply_rope_reference(to_half_split(x)))``.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    length, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope_reference needs an even feature size d, got x of shape {tuple(x.shape)}")
    positions = torch.arange(length) if positions is None else positions
    _check_positions(positions, length, fractional=True)
    angles = positions.to(x.device, torch.float32)[:, None] * rope_frequencies(d, base, device=x.device)
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(x.dtype)       # (L, d): pair i uses angle i twice
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotate_half = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotate_half * sin


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, *, base: float = 10000.0,
               interleaved: bool = False) -> torch.Tensor:
    """Rotate ``x (..., L, d)`` by RoPE at ``positions`` (1-D tensor of length L, default ``arange(L)``).

    ``positions`` may be fractional (a floating tensor), as position interpolation needs: it runs a
    model trained on ``L_train`` tokens at ``L_test`` by passing ``arange(L_test) * L_train / L_test``.

    Pair ``i`` is rotated by the angle ``positions * base^(-2i/d)``; the pairs are ``(i, i + d/2)``
    (default) or ``(2i, 2i+1)`` (``interleaved=True``). Angles come from cached fp32 tables; the
    rotation runs in fp64 for fp64 ``x`` and in fp32 otherwise, and the result has the dtype of ``x``.
    Apply it to queries and keys, never to values.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    length, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope needs an even feature size d, got x of shape {tuple(x.shape)}")
    if base <= 0:
        raise ValueError(f"base must be positive, got {base}")
    if positions is None:
        cos, sin = _cos_sin(max(length, 1), d, base, x.device)
        cos, sin = cos[:length], sin[:length]                                    # views, no copy
    else:
        # the angles of these positions, computed as the table computes them (the same fp32 products);
        # no table lookup, which would need max(positions) on the host
        _check_positions(positions, length, fractional=True)
        angles = positions.to(x.device, torch.float32)[:, None] * rope_frequencies(d, base, device=x.device)
        cos, sin = angles.cos(), angles.sin()                                    # (L, d/2)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    return _RopeFunction.apply(x.to(compute), cos.to(compute), sin.to(compute), bool(interleaved)).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """`apply_rope` as a module with fixed ``base`` and layout, for `attention.MultiHeadAttention(rope=...)`."""

    def __init__(self, base: float = 10000.0, *, interleaved: bool = False):
        super().__init__()
        self.base, self.interleaved = base, interleaved

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, positions, base=self.base, interleaved=self.interleaved)


def rope_matrix(position: float, d: int, base: float = 10000.0, *, interleaved: bool = True) -> torch.Tensor:
    """The explicit ``(d, d)`` fp64 RoPE rotation ``R_p`` (column form: ``R_p @ x``; row form: ``x @ R_p.T``).

    Interleaved: block-diagonal ``diag(R(p theta_0), ..., R(p theta_{d/2-1}))`` with
    ``R(a) = [[cos a, -sin a], [sin a, cos a]]``. Half-split: the same matrix with rows and columns
    permuted by `rope_permutation`. ``R_m^T R_n = R_{n-m}``.
    """
    d = check_positive_int("d", d)
    if d % 2:
        raise ValueError(f"rope_matrix needs an even d, got {d}")
    a = float(position) * rope_frequencies(d, base, dtype=torch.float64)
    c, s = torch.cos(a), torch.sin(a)
    blocks = torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)     # (d/2, 2, 2)
    R = torch.block_diag(*blocks)
    if interleaved:
        return R
    perm = rope_permutation(d)
    return R[perm][:, perm]


def rope_permutation(d: int) -> torch.Tensor:
    """Index ``perm (d,)`` with ``x_half = x_interleaved[..., perm]``: ``[0, 2, ..., d-2, 1, 3, ..., d-1]``.

    Pair ``(2i, 2i+1)`` of the interleaved layout becomes pair ``(i, i + d/2)`` of the half-split one.
    """
    d = check_positive_int("d", d)
    if d % 2:
        raise ValueError(f"rope_permutation needs an even d, got {d}")
    return torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))


def to_half_split(x: torch.Tensor) -> torch.Tensor:
    """Reorder the last dim from the interleaved pairing to the half-split one (see `rope_permutation`)."""
    check_tensor("x", x, min_rank=1)
    return x[..., rope_permutation(x.shape[-1]).to(x.device)]


def to_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Inverse of `to_half_split`: reorder the last dim from the half-split pairing to the interleaved one."""
    check_tensor("x", x, min_rank=1)
    return x[..., torch.argsort(rope_permutation(x.shape[-1])).to(x.device)]


def rope_turns(train_len: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """Turns ``train_len * theta_i / (2 pi)`` each RoPE pair completes over a training window: ``(d/2,)`` fp64.

    Pairs with fewer than one turn never see their full circle in training (23 of 64 at L=2048, d=128).
    """
    check_positive_int("train_len", train_len)
    d = check_positive_int("d", d)
    if d % 2:
        raise ValueError(f"rope_turns needs an even d, got {d}")
    return train_len * rope_frequencies(d, base, dtype=torch.float64) / (2 * math.pi)


# ============================================================================= Shaw et al.
def shaw_relative_positions(q_len: int, k_len: int | None = None, max_distance: int = 16, *,
                            device: torch.device | str | None = None) -> torch.Tensor:
    """Table index ``clip(j - i', -K, K) + K`` ``(q_len, k_len)`` into Shaw's ``2K + 1`` relative embeddings."""
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 0:
        raise ValueError(f"max_distance must be a non-negative int, got {max_distance!r}")
    return relative_positions(q_len, k_len, device=device).clamp(-max_distance, max_distance) + max_distance


def _check_shaw_tables(q, v, rel_k, rel_v, max_distance):
    n = 2 * max_distance + 1
    check_tensor("rel_k", rel_k, rank=2, floating=True)
    if rel_k.shape != (n, q.shape[-1]):
        raise ValueError(f"rel_k must be (2*max_distance+1, d_k) = {(n, q.shape[-1])}, got {tuple(rel_k.shape)}")
    if rel_v is not None:
        check_tensor("rel_v", rel_v, rank=2, floating=True)
        if rel_v.shape != (n, v.shape[-1]):
            raise ValueError(f"rel_v must be (2*max_distance+1, d_v) = {(n, v.shape[-1])}, got {tuple(rel_v.shape)}")


def shaw_relative_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_k: torch.Tensor,
                            rel_v: torch.Tensor | None, max_distance: int, *, mask: torch.Tensor | None = None,
                            bias: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
                            return_weights: bool = False):
    """Shaw et al. relative attention: learned vectors are *added* to each key and value.

    ``e_ij = q_i (k_j + a^K_ij)^T * scale``, ``o_i = sum_j softmax(e)_ij (v_j + a^V_ij)`` with
    ``a_ij = rel[clip(j - i', -K, K) + K]``. ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, d_v)``,
    ``rel_k (2K+1, d)``, ``rel_v (2K+1, d_v)`` or None (keys only). Never builds the ``Lq x Lk x d``
    tensor: ``q rel_k^T`` is gathered by index, and the value term scatters the weights into ``2K+1``
    buckets. Returns ``out (..., Lq, d_v)`` (and the weights with ``return_weights=True``).
    """
    check_qkv(q, k, v)
    _check_shaw_tables(q, v, rel_k, rel_v, max_distance)
    check_bias(bias, q, k)
    scale = resolve_scale(scale, q.shape[-1])
    lq, lk = q.shape[-2], k.shape[-2]
    idx = shaw_relative_positions(lq, lk, max_distance, device=q.device)               # (Lq, Lk)
    idx = idx.expand(*q.shape[:-2], lq, lk)
    rel_scores = torch.gather(q @ rel_k.to(q.dtype).T, -1, idx) * scale                  # (..., Lq, Lk)
    if bias is not None:
        rel_scores = rel_scores + bias
    out, weights = scaled_dot_product_attention(q, k, v, mask, bias=rel_scores, causal=causal, scale=scale,
                                                return_weights=True)
    if rel_v is not None:
        buckets = weights.new_zeros(*weights.shape[:-1], rel_k.shape[0]).scatter_add_(-1, idx, weights)
        out = out + buckets @ rel_v.to(out.dtype)
    return (out, weights) if return_weights else out


def shaw_relative_attention_reference(q, k, v, rel_k, rel_v, max_distance, *, mask=None, causal=False, scale=None):
    """The paper's formula with the ``(Lq, Lk, d)`` tensors ``a^K, a^V`` built explicitly. Returns ``(out, weights)``."""
    check_qkv(q, k, v)
    _check_shaw_tables(q, v, rel_k, rel_v, max_distance)
    scale = resolve_scale(scale, q.shape[-1])
    idx = shaw_relative_positions(q.shape[-2], k.shape[-2], max_distance, device=q.device)
    a_k = rel_k[idx]                                                                     # (Lq, Lk, d)
    keys = k.unsqueeze(-3) + a_k                                                         # (..., Lq, Lk, d)
    scores = (q.unsqueeze(-2) * keys).sum(-1) * scale
    weights = _masked_softmax(scores, _combined_mask(q, k, mask, causal))
    values = v.unsqueeze(-3) + (rel_v[idx] if rel_v is not None else 0.0)               # (..., Lq, Lk, d_v)
    return (weights.unsqueeze(-1) * values).sum(-2), weights


class ShawRelativeAttention(MultiHeadAttention):
    """Multi-head self-attention with Shaw et al.'s clipped relative keys and values, shared by all heads.

    `attention.MultiHeadAttention` (projections without bias, GQA through ``n_kv_heads``, the
    `attention.KVCache`, ``keep_weights``) with its attention step replaced by
    `shaw_relative_attention`. ``forward(x (B, L, d_model), mask=None, causal=False, cache=None,
    bias=None) -> (B, L, d_model)``. Tables ``rel_k, rel_v`` are ``(2 * max_distance + 1, d_head)``.
    """

    def __init__(self, d_model: int, n_heads: int, max_distance: int = 16, n_kv_heads: int | None = None):
        super().__init__(d_model, n_heads, n_kv_heads, bias=False)
        self.max_distance = check_positive_int("max_distance", max_distance)
        self.rel_k = nn.Parameter(torch.randn(2 * max_distance + 1, self.d_head) * 0.02)
        self.rel_v = nn.Parameter(torch.randn(2 * max_distance + 1, self.d_head) * 0.02)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                cache: KVCache | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x, mask=mask, causal=causal, cache=cache, bias=bias)

    def attend(self, q, k, v, *, mask, bias, causal, return_weights):
        return shaw_relative_attention(q, k, v, self.rel_k, self.rel_v, self.max_distance, mask=mask, bias=bias,
                                       causal=causal, return_weights=return_weights)


# ============================================================================= Transformer-XL
def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's relative shift: ``(..., Lq, Lk)`` with column ``c`` for distance ``Lk - 1 - c``
    → ``y[..., i, j] = x[..., i, j + Lq - 1 - i]``, the score for distance ``i' - j``.

    Pad one zero column on the left, reinterpret the memory as ``(Lk + 1, Lq)``, drop the first row,
    reinterpret back. Exact on the causal region ``j <= i' = i + Lk - Lq``; the entries above it
    are leftovers and must be masked. Needs ``Lk >= Lq``.
    """
    check_tensor("x", x, min_rank=2)
    lq, lk = x.shape[-2], x.shape[-1]
    if lk < lq:
        raise ValueError(f"rel_shift needs Lk >= Lq, got x of shape {tuple(x.shape)}")
    padded = torch.cat((x.new_zeros(*x.shape[:-1], 1), x), dim=-1)                     # (..., Lq, Lk + 1)
    padded = padded.reshape(*x.shape[:-2], lk + 1, lq)
    return padded[..., 1:, :].reshape(x.shape)


def rel_shift_reference(x: torch.Tensor) -> torch.Tensor:
    """The naive gather ``y[..., i, j] = x[..., i, j + Lq - 1 - i]`` on ``j <= i'``, zero above it."""
    check_tensor("x", x, min_rank=2)
    lq, lk = x.shape[-2], x.shape[-1]
    if lk < lq:
        raise ValueError(f"rel_shift_reference needs Lk >= Lq, got x of shape {tuple(x.shape)}")
    y = torch.zeros_like(x)
    for i in range(lq):
        for j in range(i + lk - lq + 1):
            y[..., i, j] = x[..., i, j + lq - 1 - i]
    return y


def _check_xl(q, k, r, u, v):
    for name, t in (("q", q), ("k", k), ("r", r)):
        check_tensor(name, t, min_rank=2, floating=True)
    for name, t in (("u", u), ("v", v)):
        check_tensor(name, t, min_rank=1, floating=True)
        lead = q.shape[:-2]
        if not broadcasts_to(t.shape[:-1], lead):
            raise ValueError(f"{name}'s leading dims must broadcast to those of q {tuple(lead)} (e.g. (H, d) for one "
                             f"vector per head), got {name} {tuple(t.shape)} and q {tuple(q.shape)}")
    lq, lk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if k.shape[-1] != d or r.shape[-1] != d or u.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"q, k, r, u, v must share the feature size d={d}: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"r {tuple(r.shape)}, u {tuple(u.shape)}, v {tuple(v.shape)}")
    if r.shape[-2] != lk or lk < lq:
        raise ValueError(f"r must hold one row per distance 0..Lk-1 (Lk={lk}) and Lk >= Lq={lq}; got r {tuple(r.shape)}")


def xl_relative_scores(q: torch.Tensor, k: torch.Tensor, r: torch.Tensor, u: torch.Tensor, v: torch.Tensor, *,
                       terms: bool = False):
    """Transformer-XL relative scores (unscaled), computed with `rel_shift`.

    ``q (..., Lq, d)`` = ``x_i W_q``; ``k (..., Lk, d)`` = ``x_j W_kE``; ``r (..., Lk, d)`` with row ``t`` =
    ``R_t W_kR`` (the encoding of distance ``t = 0..Lk-1``); ``u, v (..., d)`` global biases whose leading
    dims broadcast against those of ``q`` (e.g. ``(H, d)`` for one pair per head). Score ``(i, j)`` for ``j <= i'`` is
    ``(a) q_i k_j + (b) q_i r_{i'-j} + (c) u k_j + (d) v r_{i'-j}``; entries with ``j > i'`` are zero
    (mask them). ``terms=True`` returns the dict of the four ``(..., Lq, Lk)`` maps instead of their sum.
    fp16/bf16 inputs are computed in fp32 (the two products are added before any rounding) and the
    scores returned in the input dtype.
    """
    _check_xl(q, k, r, u, v)
    in_dtype, work = q.dtype, compute_dtype(q.dtype)
    q, k, r, u, v = (t.to(work) for t in (q, k, r, u, v))
    valid = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    r_desc = r.flip(-2).transpose(-2, -1)                                                 # distances Lk-1 .. 0
    if terms:
        parts = {"a: content": q @ k.transpose(-2, -1), "b: content-position": rel_shift(q @ r_desc),
                 "c: global content": (u.unsqueeze(-2) @ k.transpose(-2, -1)).expand(*q.shape[:-1], k.shape[-2]),
                 "d: global position": rel_shift((v.unsqueeze(-2) @ r_desc).expand(*q.shape[:-1], k.shape[-2]))}
        return {name: t.masked_fill(~valid, 0.0).to(in_dtype) for name, t in parts.items()}
    scores = (q + u.unsqueeze(-2)) @ k.transpose(-2, -1) + rel_shift((q + v.unsqueeze(-2)) @ r_desc)
    return scores.masked_fill(~valid, 0.0).to(in_dtype)


def xl_relative_scores_reference(q, k, r, u, v):
    """The four terms summed pair by pair: ``(q_i + u) k_j + (q_i + v) r_{i'-j}`` for ``j <= i'``, zero above."""
    _check_xl(q, k, r, u, v)
    lq, lk = q.shape[-2], k.shape[-2]
    scores = q.new_zeros(*q.shape[:-1], lk)
    for i in range(lq):
        i_abs = i + lk - lq
        for j in range(i_abs + 1):
            scores[..., i, j] = ((q[..., i, :] + u) * k[..., j, :]).sum(-1) \
                + ((q[..., i, :] + v) * r[..., i_abs - j, :]).sum(-1)
    return scores


class XLRelativeAttention(MultiHeadAttention):
    """Causal multi-head self-attention with Transformer-XL relative scores (Dai et al. 2019).

    `attention.MultiHeadAttention`'s projections (without bias), GQA and `attention.KVCache`, with
    content keys ``W_kE`` (``k_proj``), position keys ``W_kR`` applied to a fixed sinusoid table of
    distances, and learned global biases ``u, v`` ``(n_heads, d_head)``. Only causal attention is
    defined (the relative shift is exact on the causal region). ``forward(x, mask=None, causal=True,
    cache=None, bias=None)``; with ``return_terms=True`` also the dict of the four score maps. With a
    `attention.KVCache`, cached keys keep their content projection and the distance terms are
    recomputed for the new queries.

    The distance keys ``r = W_kR R`` depend only on the weights, not on the input. Under autograd
    (training) they are computed afresh on every call. Without it (decoding, evaluation) the keys of
    distances ``0 .. n-1`` are projected once, with ``n`` the KV cache's ``max_len`` (doubled when a
    longer input comes), and sliced at every step; they are projected again when ``r_proj.weight``
    changes (in place, or replaced) or the dtype or device does.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None):
        super().__init__(d_model, n_heads, n_kv_heads, bias=False)
        self.r_proj = nn.Linear(d_model, d_model, bias=False)
        self.u = nn.Parameter(torch.zeros(n_heads, self.d_head))
        self.v = nn.Parameter(torch.zeros(n_heads, self.d_head))
        self._r_cache: tuple | None = None          # (weight alias, weight version, r (H, n, d_head))

    def _project_distances(self, n: int, device, dtype) -> torch.Tensor:
        """``W_kR`` applied to the sinusoid encodings of distances ``0 .. n-1``: ``(H, n, d_head)``."""
        table = sinusoidal_encoding(n, self.d_model, device=device, dtype=dtype)
        return self.r_proj(table).view(n, self.n_heads, self.d_head).transpose(0, 1)

    def distance_keys(self, k_len: int, *, max_len: int = 0, device=None, dtype=None) -> torch.Tensor:
        """The distance keys ``r (H, k_len, d_head)`` for distances ``0 .. k_len-1`` (cached when no grad is recorded)."""
        w = self.r_proj.weight
        device, dtype = device or w.device, dtype or w.dtype
        if torch.is_grad_enabled():
            return self._project_distances(k_len, device, dtype)
        cached = self._r_cache
        fresh = (cached is not None and cached[0].data_ptr() == w.data_ptr() and cached[1] == w._version
                 and cached[2].shape[1] >= k_len and cached[2].device == torch.device(device)
                 and cached[2].dtype == dtype)
        if not fresh:
            old_n = 0 if cached is None else cached[2].shape[1]
            n = max(k_len, max_len, old_n if old_n >= k_len else 2 * old_n)          # doubled only to grow
            # the alias shares w's storage and version counter: it keeps the storage alive, so no other
            # weight can later sit at the same address, and an in-place update shows in w._version
            self._r_cache = cached = (w.detach(), w._version, self._project_distances(n, device, dtype))
        return cached[2][:, :k_len]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = True,
                cache: KVCache | None = None, bias: torch.Tensor | None = None, *, return_terms: bool = False):
        if not causal:
            raise ValueError("XLRelativeAttention is causal only (the relative shift is exact on j <= i)")
        q, k, v = self._project(x, None, cache)
        r = self.distance_keys(k.shape[-2], max_len=0 if cache is None else cache.max_len, device=x.device,
                               dtype=x.dtype)                                               # (H, Lk, d_head)
        scores = xl_relative_scores(q, k, r, self.u, self.v) / math.sqrt(self.d_head)
        if bias is not None:
            scores = scores + bias
        weights = _masked_softmax(scores, _combined_mask(q, k, mask, True))
        if self.keep_weights:
            self.last_weights = weights.detach()
        out = self._merge(weights @ v)
        if return_terms:
            return out, xl_relative_scores(q, k, r, self.u, self.v, terms=True)
        return out


# ============================================================================= T5 bias
def t5_relative_position_bucket(relative_position: torch.Tensor, *, bidirectional: bool = True,
                                num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's bucket id for each ``relative_position = key_pos - query_pos`` (integer tensor, any shape).

    Bidirectional: half the buckets for keys after the query (``rel > 0``, ids offset by
    ``num_buckets/2``), half for the rest. Unidirectional: keys after the query share bucket 0.
    Within a half of ``n`` buckets, distances below ``n/2`` get their own bucket; larger ones are
    log-spaced up to ``max_distance`` and clipped to the last bucket. Computed in fp32, like the
    reference implementations.
    """
    check_tensor("relative_position", relative_position)
    if relative_position.is_floating_point() or relative_position.dtype == torch.bool:
        raise TypeError(f"relative_position must be an integer tensor, got dtype {relative_position.dtype}")
    num_buckets = check_positive_int("num_buckets", num_buckets)
    max_distance = check_positive_int("max_distance", max_distance)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        if num_buckets % 2 or num_buckets < 4:
            raise ValueError(f"bidirectional buckets need an even num_buckets >= 4, got {num_buckets}")
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        if num_buckets < 2:
            raise ValueError(f"num_buckets must be >= 2, got {num_buckets}")
        n = (-rel).clamp_min(0)
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance={max_distance} must exceed the {max_exact} exact buckets")
    log_ratio = torch.log(n.float().clamp_min(1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp_max(num_buckets - 1)
    return buckets + torch.where(n < max_exact, n, large)


class T5RelativeBias(nn.Module):
    """T5's learned scalar bias per (bucket, head): ``forward(q_len, k_len=None) -> (n_heads, q_len, k_len)``.

    Bucket ids depend only on the offset ``j - i'``, so the module keeps one vector of bucket ids over the
    offsets ``-(n-1) .. n-1`` (``2n - 1`` numbers, not an ``n x n`` table) and gathers the ``(q_len, k_len)``
    ids from it; the vector is built once per device and doubled when a longer input comes, so decoding
    step by step does not add one per step. The biases (initialised at zero) are looked up on every call so they train. Use
    ``bidirectional=False`` in a causal decoder.
    """

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, *, bidirectional: bool = True):
        super().__init__()
        self.n_heads = check_positive_int("n_heads", n_heads)
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        t5_relative_position_bucket(torch.zeros(1, dtype=torch.long), bidirectional=bidirectional,
                                    num_buckets=num_buckets, max_distance=max_distance)   # validate the settings
        self.bias = nn.Embedding(num_buckets, n_heads)
        nn.init.zeros_(self.bias.weight)
        self._tables: dict[str, torch.Tensor] = {}                      # device -> (2n - 1,) bucket ids

    def buckets(self, q_len: int, k_len: int | None = None) -> torch.Tensor:
        """Bucket ids ``(q_len, k_len)``, gathered from the cached vector over offsets."""
        q_len, k_len = _check_lengths(q_len, k_len)
        device = self.bias.weight.device
        table = self._tables.get(str(device))
        need = max(q_len, k_len)
        if table is None or (table.shape[0] + 1) // 2 < need:
            n = max(need, table.shape[0] + 1 if table is not None else 0)      # doubles the offsets covered
            with torch.inference_mode(False):                           # the table outlives this call
                offsets = torch.arange(-(n - 1), n, device=device)
                table = t5_relative_position_bucket(offsets, bidirectional=self.bidirectional,
                                                    num_buckets=self.num_buckets, max_distance=self.max_distance)
            self._tables[str(device)] = table
        return table[_offsets(q_len, k_len, (table.shape[0] + 1) // 2, device)]

    def forward(self, q_len: int, k_len: int | None = None) -> torch.Tensor:
        return self.bias(self.buckets(q_len, k_len)).permute(2, 0, 1)


# ============================================================================= ALiBi
def _alibi_slopes_list(n: int) -> list[float]:
    if n & (n - 1) == 0:                                               # a power of two: 2^(-8h/n), h = 1..n
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]
    closest = 2 ** int(math.floor(math.log2(n)))
    return _alibi_slopes_list(closest) + _alibi_slopes_list(2 * closest)[0::2][: n - closest]


def alibi_slopes(n_heads: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi's fixed (never learned) head slopes ``(n_heads,)`` (Press et al. 2022).

    A power of two ``H``: ``m_h = 2^(-8h/H)``, ``h = 1..H`` (8 heads: 1/2, 1/4, ..., 1/256). Otherwise
    the slopes of the closest smaller power of two ``P``, followed by every other slope of ``2P``
    heads for the remaining ``H - P`` heads.
    """
    n_heads = check_positive_int("n_heads", n_heads)
    return torch.tensor(_alibi_slopes_list(n_heads), dtype=torch.float64, device=device).to(dtype)


def alibi_bias(n_heads: int, q_len: int, k_len: int | None = None, *, dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> torch.Tensor:
    """ALiBi bias ``(n_heads, q_len, k_len)``: ``bias[h, i, j] = -slopes[h] * |(i + k_len - q_len) - j|``.

    Symmetric and bottom-right aligned; under a causal mask it is the paper's ``-m_h (i' - j)``.
    """
    q_len, k_len = _check_lengths(q_len, k_len)
    distance = relative_positions(q_len, k_len, device=device).abs().to(torch.float64)
    slopes = alibi_slopes(n_heads, dtype=torch.float64, device=device)
    return (-slopes[:, None, None] * distance).to(dtype)


class AlibiBias(nn.Module):
    """`alibi_bias` for a model: ``forward(q_len, k_len=None, *, device=None, dtype=fp32) -> (n_heads, q_len, k_len)``.

    The bias depends only on the offset ``j - i'``, so the module keeps one ``(n_heads, 2n - 1)`` table over
    the offsets ``-(n-1) .. n-1`` (O(n) memory, not O(n^2)) and gathers the ``(n_heads, q_len, k_len)``
    bias from it. It is built once per ``(device, dtype)`` and doubled when a longer input comes, so
    decoding step by step does not add a table per step.
    """

    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = check_positive_int("n_heads", n_heads)
        self._tables: dict[tuple, torch.Tensor] = {}                    # (device, dtype) -> (H, 2n - 1)

    def forward(self, q_len: int, k_len: int | None = None, *, device: torch.device | str | None = None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
        q_len, k_len = _check_lengths(q_len, k_len)
        key = (str(torch.device(device or "cpu")), dtype)
        table = self._tables.get(key)
        need = max(q_len, k_len)
        if table is None or (table.shape[-1] + 1) // 2 < need:
            n = max(need, table.shape[-1] + 1 if table is not None else 0)     # doubles the offsets covered
            with torch.inference_mode(False):                           # the table outlives this call
                distance = torch.arange(-(n - 1), n, device=device).abs().to(torch.float64)
                slopes = alibi_slopes(self.n_heads, dtype=torch.float64, device=device)
                table = (-slopes[:, None] * distance).to(dtype)          # -m_h |d| for d = -(n-1) .. n-1
            self._tables[key] = table
        idx = _offsets(q_len, k_len, (table.shape[-1] + 1) // 2, table.device)
        return table[:, idx]


# ============================================================================= DA-Transformer
def da_weight(dist: torch.Tensor, alpha, beta) -> torch.Tensor:
    """DA-Transformer's distance weight ``f(alpha * dist; beta) = (1 + e^beta) / (1 + e^(beta - alpha * dist))``.

    ``f(0) = 1``; monotone in ``dist`` (decreasing for ``alpha < 0``: a local head); tends to 0 as
    ``alpha * dist -> -inf`` and to ``1 + e^beta`` as ``alpha * dist -> +inf``. Evaluated stably as
    ``exp(softplus(beta)) * sigmoid(alpha * dist - beta)``.
    """
    check_tensor("dist", dist, floating=True)
    alpha = torch.as_tensor(alpha, dtype=dist.dtype, device=dist.device)
    beta = torch.as_tensor(beta, dtype=dist.dtype, device=dist.device)
    return torch.exp(F.softplus(beta)) * torch.sigmoid(alpha * dist - beta)


def _per_head(name: str, value, q: torch.Tensor) -> torch.Tensor:
    """A scalar, or a 1-D per-head tensor of length ``q.shape[-3]``, shaped to broadcast over ``(..., H, Lq, Lk)``."""
    t = torch.as_tensor(value, dtype=q.dtype, device=q.device)
    if t.dim() == 0:
        return t
    if t.dim() != 1 or q.dim() < 3 or t.shape[0] != q.shape[-3]:
        raise ValueError(f"{name} must be a scalar or one value per head (length q.shape[-3]); got {name} of shape "
                         f"{tuple(t.shape)} for q of shape {tuple(q.shape)}")
    return t[:, None, None]


def da_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha, beta, *,
                 mask: torch.Tensor | None = None, causal: bool = False, scale: float | None = None,
                 return_weights: bool = False):
    """Distance-aware attention (Wu et al. 2021): ``softmax(ReLU(q k^T) ⊙ f(alpha * R; beta) * scale) v``.

    ``R_ij = |i' - j|``; ``alpha, beta`` are scalars or one value per head (``q.shape[-3]``). The ReLU
    makes the scores non-negative so that ``f`` only shrinks or grows them (a negative score times
    ``f > 1`` would be pushed *down*). ``⊙`` is element-wise. Returns ``out`` (and the weights).
    """
    check_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    dist = relative_positions(q.shape[-2], k.shape[-2], device=q.device).abs().to(q.dtype)
    f = da_weight(dist, _per_head("alpha", alpha, q), _per_head("beta", beta, q))
    scores = torch.relu(q @ k.transpose(-2, -1)) * f * scale
    weights = _masked_softmax(scores, _combined_mask(q, k, mask, causal))
    out = weights @ v
    return (out, weights) if return_weights else out


def da_attention_reference(q, k, v, alpha, beta, *, mask=None, causal=False, scale=None):
    """``da_attention`` entry by entry: a loop over ``(i, j)`` for the re-weighted scores. Returns ``(out, weights)``."""
    check_qkv(q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    a, b = _per_head("alpha", alpha, q), _per_head("beta", beta, q)
    lq, lk = q.shape[-2], k.shape[-2]
    scores = q.new_zeros(*q.shape[:-1], lk)
    for i in range(lq):
        for j in range(lk):
            dist = abs(i + lk - lq - j)
            f = (1 + torch.exp(b)) / (1 + torch.exp(b - a * dist))
            s = torch.relu((q[..., i, :] * k[..., j, :]).sum(-1))
            scores[..., i, j] = (s * (f.squeeze(-1).squeeze(-1) if f.dim() else f)) * scale
    weights = _masked_softmax(scores, _combined_mask(q, k, mask, causal))
    return weights @ v, weights
