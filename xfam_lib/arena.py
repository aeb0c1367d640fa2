"""The capstone arena (chapter 11): one small language model, one token mixer per family, matched budgets.

`ArenaLM` is embedding + a width-2 causal token shift (each position also sees the previous token,
as the short convolutions of Zoology's models do) + ``n_layers`` pre-norm blocks of (token mixer,
MLP) + read-out. Only the mixer changes between families, so differences in recall and cost come
from the mixer. Every mixer calls the library's own implementation:

==================  ====================================================================
``softmax``         `attention.scaled_dot_product_attention`, causal
``sliding_window``  `sparse.sliding_window_attention`, causal, ``window`` keys back
``linear``          `linear.linear_attention`, elu+1 features, causal, chunk mode
``gla``             `linear.gated_linear_attention`, data-dependent log gates ``logsigmoid(x W)/16``
``performer``       `linear.performer_attention`, FAVOR+ with ``n_features`` orthogonal features, causal
``s4d``             `ssm.S4DLayer` (time-invariant diagonal SSM)
``mamba``           `ssm.MambaBlock` (selective SSM)
``h3``              `ssm.H3Layer` (chapter 9: a shift SSM on the keys, a diagonal SSM on ``k̄ v^T``;
                    head dimension 1, as chapter 9's layer)
``based``           Based (Arora et al. 2024): `linear.linear_attention` with `linear.taylor2_features` on
                    ``feature_dim``-dimensional projections of q and k, plus a causal
                    `sparse.sliding_window_attention` over ``window`` keys back, summed. Based alternates
                    the two as separate layers; here both sit side by side in every mixer.
==================  ====================================================================

`BASELINES` are mixers outside the family that the chapter compares against; they are not in `FAMILIES`
(the sweep's default): ``gru`` is `torch.nn.GRU`, the recurrent network whose whole memory is
one ``d``-vector per layer.

`init_decode_state` and `mixer_step` decode one token at a time through one mixer of an `ArenaLM`, each
family in its step form: a KV cache (softmax), a cache of the last ``window + 1`` keys (sliding window),
the library's recurrent `gated_linear_attention` (GLA; and, with gate 1 and a column of ones for the
normaliser, linear attention and the Performer on their features), S4D's diagonal recurrence,
`MambaBlock.step`, H3's window of past keys and diagonal recurrence, and Based's linear-attention state
with its window's cache.

`train_arena` trains one model on a recall task and runs data-parallel under ``torchrun`` unchanged:
when ``torch.distributed`` is initialised, every rank draws the same global batch, takes its own
slice and DDP averages the gradients, so the loss curve equals the one-process run with the same
global batch. That holds because every slice has the same number of answer positions (each rank's
loss is a mean over its own answers); `check_equal_answer_counts` checks it at every step.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .attention import KVCache, scaled_dot_product_attention
from .linear import (_gla_recurrent, _performer_features, elu_feature_map, gated_linear_attention, linear_attention,
                     performer_attention, positive_random_features, taylor2_features)
from .sparse import sliding_window_attention
from .ssm import H3Layer, MambaBlock, S4DKernel, S4DLayer
from .tasks import PAD, induction_heads, mqar, selective_copying
from .utils import check_instance, check_positive_int, check_real, check_tensor, check_token_ids

__all__ = ["FAMILIES", "BASELINES", "ArenaLM", "count_params", "decode_state_bytes", "init_decode_state", "mixer_step",
           "width_for_budget", "TASKS", "train_arena", "check_equal_answer_counts"]

FAMILIES = ("softmax", "sliding_window", "linear", "gla", "performer", "s4d", "mamba", "h3", "based")
BASELINES = ("gru",)
_ATTENTION_LIKE = ("softmax", "sliding_window", "linear", "gla", "performer", "based")   # learned positions
_GLA_TEMPERATURE = 16.0          # the GLA paper's normaliser: log gates logsigmoid(x W) / 16


class _AttentionMixer(nn.Module):
    """``(B, L, d) -> (B, L, d)``: project to heads, apply one attention-like family, project back."""

    def __init__(self, family: str, d_model: int, n_heads: int, *, window: int, n_features: int, seed: int,
                 gate_bias: float = 0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got d_model={d_model}, n_heads={n_heads}")
        self.family, self.n_heads, self.window, self.n_features, self.seed = family, n_heads, window, n_features, seed
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.gate = nn.Linear(d_model, d_model) if family == "gla" else None
        if self.gate is not None:
            nn.init.constant_(self.gate.bias, gate_bias)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        heads = lambda t: t.view(B, L, self.n_heads, D // self.n_heads).transpose(1, 2)   # (B, H, L, d_h)
        q, k, v = (heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        if self.family == "softmax":
            y = scaled_dot_product_attention(q, k, v, causal=True)
        elif self.family == "sliding_window":
            y = sliding_window_attention(q, k, v, self.window, causal=True)
        elif self.family == "linear":
            y = linear_attention(q, k, v, feature_map="elu", causal=True, mode="chunk", chunk_size=32)
        elif self.family == "gla":
            log_g = heads(F.logsigmoid(self.gate(x)) / _GLA_TEMPERATURE)
            y = gated_linear_attention(q, k, v, log_g, mode="chunk", chunk_size=32)
        else:
            y = performer_attention(q, k, v, self.n_features, causal=True, seed=self.seed, mode="chunk", chunk_size=32)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


class _BasedMixer(nn.Module):
    """``(B, L, d) -> (B, L, d)``: Based's two parts on the same input, summed, then projected back.

    Taylor-2 linear attention (normalised, `linear.taylor2_features` of ``q, k`` projected to
    ``feature_dim`` per head and scaled by ``feature_dim^(-1/4)``, so ``phi(q).phi(k) = 1 + s + s^2/2``
    with ``s = q.k / sqrt(feature_dim)``) and causal softmax over the last ``window`` keys; both read
    the same values.
    """

    def __init__(self, d_model: int, n_heads: int, *, feature_dim: int, window: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got d_model={d_model}, n_heads={n_heads}")
        self.n_heads, self.feature_dim, self.window = n_heads, feature_dim, window
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.qk_features = nn.Linear(d_model, 2 * n_heads * feature_dim)
        self.out = nn.Linear(d_model, d_model)

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Taylor-2 features of the linear branch's queries and keys, ``(B, H, L, 1 + f + f^2)`` each."""
        B, L, _ = x.shape
        qf, kf = (t.view(B, L, self.n_heads, self.feature_dim).transpose(1, 2)
                  for t in self.qk_features(x).chunk(2, dim=-1))
        root = self.feature_dim ** -0.25
        return taylor2_features(qf * root), taylor2_features(kf * root)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        heads = lambda t: t.view(B, L, self.n_heads, D // self.n_heads).transpose(1, 2)
        q, k, v = (heads(t) for t in self.qkv(x).chunk(3, dim=-1))
        fq, fk = self.features(x)
        y = linear_attention(fq, fk, v, feature_map="identity", causal=True, mode="chunk", chunk_size=32)
        y = y + sliding_window_attention(q, k, v, self.window, causal=True)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


class _GRUMixer(nn.Module):
    """``(B, L, d) -> (B, L, d)``: a one-layer `torch.nn.GRU` with hidden size ``d``."""

    def __init__(self, d_model: int):
        super().__init__()
        self.gru = nn.GRU(d_model, d_model, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0]


class ArenaLM(nn.Module):
    """A causal token model whose mixer is one of `FAMILIES` (or `BASELINES`): ``ids (B, L) -> logits (B, L, vocab)``.

    ``window`` (sliding_window and based: keys up to ``window`` back), ``n_features`` (performer),
    ``d_state`` (s4d, mamba, h3) and ``feature_dim`` (based: the Taylor map's input size, ``1 + f + f^2``
    features) are the families' state knobs; the attention-like families and Based use learned positions up
    to ``max_len`` (the SSMs need none). ``gate_bias`` (gla) initialises the bias of the gate projection:
    at 0 the log gates start near ``logsigmoid(0) / 16``, a gate of 0.958 per token; larger values start
    the gates nearer 1.
    """

    def __init__(self, family: str, vocab: int, d_model: int = 32, n_layers: int = 2, *, n_heads: int = 2,
                 d_state: int = 16, window: int = 8, n_features: int = 32, feature_dim: int = 4,
                 gate_bias: float = 0.0, max_len: int = 512, seed: int = 0):
        super().__init__()
        if family not in FAMILIES + BASELINES:
            raise ValueError(f"family must be one of {FAMILIES + BASELINES}, got {family!r}")
        for name, val in (("vocab", vocab), ("d_model", d_model), ("n_layers", n_layers), ("n_heads", n_heads),
                          ("d_state", d_state), ("window", window), ("n_features", n_features), ("feature_dim", feature_dim),
                          ("max_len", max_len)):
            check_positive_int(name, val)
        gate_bias = check_real("gate_bias", gate_bias)
        self.vocab = vocab
        self.family, self.d_model, self.n_heads = family, d_model, n_heads
        self.d_state, self.window, self.n_features, self.feature_dim = d_state, window, n_features, feature_dim
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02) if family in _ATTENTION_LIKE else None
        self.shift = nn.Linear(2 * d_model, d_model)
        if family == "based":
            make = lambda i: _BasedMixer(d_model, n_heads, feature_dim=feature_dim, window=window)
        elif family in _ATTENTION_LIKE:
            make = lambda i: _AttentionMixer(family, d_model, n_heads, window=window, n_features=n_features,
                                             seed=seed + i, gate_bias=gate_bias)
        elif family == "s4d":
            make = lambda i: S4DLayer(d_model, d_state)
        elif family == "h3":
            make = lambda i: H3Layer(d_model, d_state)
        elif family == "gru":
            make = lambda i: _GRUMixer(d_model)
        else:
            make = lambda i: MambaBlock(d_model, d_state)
        self.mixers = nn.ModuleList(make(i) for i in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(2 * n_layers))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(),
                                                nn.Linear(2 * d_model, d_model)) for _ in range(n_layers))
        self.norm_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("ids", ids, self.vocab, rank=2)
        x = self.embed(ids)
        if self.pos is not None:
            if ids.shape[1] > self.pos.shape[0]:
                raise ValueError(f"sequence length {ids.shape[1]} exceeds max_len={self.pos.shape[0]}")
            x = x + self.pos[: ids.shape[1]]
        prev = F.pad(x, (0, 0, 1, 0))[:, :-1]                             # the previous token's embedding
        x = self.shift(torch.cat([x, prev], dim=-1))
        for i, mixer in enumerate(self.mixers):
            x = x + mixer(self.norms[2 * i](x))
            x = x + self.mlps[i](self.norms[2 * i + 1](x))
        return self.head(self.norm_f(x))


def count_params(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def decode_state_bytes(model: ArenaLM, context: int, *, bytes_per_value: int = 4) -> int:
    """Bytes a decoder of ``model`` keeps between tokens after ``context`` tokens, summed over its layers.

    softmax: the KV cache, ``2 L d``; sliding window: ``2 min(L, window + 1) d``; linear: ``S`` and ``z``,
    ``H (d_h^2 + d_h)``; GLA: ``H d_h^2``; performer: ``H (m d_h + m)`` with ``m = n_features``; s4d: the
    complex diagonal state, ``d N`` complex numbers (``N/2`` conjugate pairs, 2 reals each); mamba: the
    SSM state ``E N`` plus the convolution's window of inputs, ``E d_conv`` (the reference
    implementation's buffer, as `MambaBlock.init_state`; ``d_conv - 1`` would suffice); h3: the diagonal
    SSM's ``N/2`` complex modes for every entry of each head's ``d_h x d_h`` state, ``d d_h N``, plus the
    shift SSM's last ``N - 1`` keys, ``d (N - 1)``; based: the Taylor state ``S`` and ``z``,
    ``H (D d_h + D)`` with ``D = 1 + f + f^2``, plus the window's ``2 min(L, window + 1) d``; gru: the hidden
    state, ``d``. Values (not the learned parameters); the token shift adds one ``d``-vector to every family.
    """
    check_instance("model", model, ArenaLM)
    L, d, H = check_positive_int("context", context), model.d_model, model.n_heads
    check_positive_int("bytes_per_value", bytes_per_value)
    dh = d // H
    per_layer = {
        "softmax": 2 * L * d,
        "sliding_window": 2 * min(L, model.window + 1) * d,
        "linear": H * (dh * dh + dh),
        "gla": H * dh * dh,
        "performer": H * (model.n_features * dh + model.n_features),
        "s4d": d * model.d_state,
        "gru": d,
    }
    if model.family == "h3":
        dh_h3 = model.mixers[0].head_dim
        per_layer["h3"] = d * dh_h3 * model.d_state + d * (model.d_state - 1)
    if model.family == "based":
        n_feat = 1 + model.feature_dim + model.feature_dim ** 2
        per_layer["based"] = H * (n_feat * dh + n_feat) + 2 * min(L, model.window + 1) * d
    if model.family == "mamba":
        block = model.mixers[0]
        per_layer["mamba"] = block.d_inner * (block.d_state + block.d_conv)
    return (len(model.mixers) * per_layer[model.family] + d) * bytes_per_value


def init_decode_state(mixer: nn.Module, batch: int, max_len: int, *, device=None, dtype=torch.float32):
    """The empty decoding state of one mixer of an `ArenaLM` (``model.mixers[i]``), for `mixer_step`.

    softmax: ``(KVCache of max_len positions, 0 filled)``; sliding window: the cached keys and values,
    ``(B, H, 0, d_h)`` each, at most ``window + 1`` kept; linear and Performer: ``S (B, H, d_phi, d_h + 1)``
    (the last column is the normaliser ``z``); GLA: ``S (B, H, d_h, d_h)``; S4D: the complex diagonal state
    ``(B, d, N/2)`` (complex64, or complex128 for float64); Mamba: `MambaBlock.init_state`; GRU: ``h (B, d)``;
    H3: ``(the last N - 1 keys (B, H, d_h, N - 1), the complex diagonal state (B, H d_h d_h, N/2))``; Based:
    ``(S (B, H, D, d_h + 1), the window's keys, values (B, H, 0, d_h))``. Sizes as `decode_state_bytes`
    counts them.
    """
    batch, max_len = check_positive_int("batch", batch), check_positive_int("max_len", max_len)
    if isinstance(mixer, MambaBlock):
        return mixer.init_state(batch, device=device, dtype=dtype)
    if isinstance(mixer, _GRUMixer):
        return torch.zeros(batch, mixer.gru.hidden_size, device=device, dtype=dtype)
    cplx = torch.complex128 if dtype == torch.float64 else torch.complex64
    if isinstance(mixer, S4DLayer):
        return torch.zeros(batch, mixer.d_model, mixer.ssm.A_im.shape[1], dtype=cplx, device=device)
    if isinstance(mixer, H3Layer):
        H, dh, N = mixer.shift_c.shape
        return (torch.zeros(batch, H, dh, N - 1, device=device, dtype=dtype),
                torch.zeros(batch, H * dh * dh, mixer.diag.A_im.shape[1], dtype=cplx, device=device))
    if isinstance(mixer, _BasedMixer):
        H, dh = mixer.n_heads, mixer.out.in_features // mixer.n_heads
        n_feat = 1 + mixer.feature_dim + mixer.feature_dim ** 2
        return (torch.zeros(batch, H, n_feat, dh + 1, device=device, dtype=dtype),
                *(torch.zeros(batch, H, 0, dh, device=device, dtype=dtype) for _ in range(2)))
    if not isinstance(mixer, _AttentionMixer):
        raise TypeError(f"mixer must be one of an ArenaLM's mixers, got {type(mixer).__name__}")
    H, dh = mixer.n_heads, mixer.out.in_features // mixer.n_heads
    if mixer.family == "softmax":
        return KVCache(batch, max_len, H, dh, dtype=dtype, device=device), 0
    if mixer.family == "sliding_window":
        return tuple(torch.zeros(batch, H, 0, dh, device=device, dtype=dtype) for _ in range(2))
    d_phi = {"linear": dh, "gla": dh, "performer": mixer.n_features}[mixer.family]
    return torch.zeros(batch, H, d_phi, dh + (mixer.family != "gla"), device=device, dtype=dtype)


# The one-token steps call GLA's recurrence (`linear._gla_recurrent`) directly, not
# `gated_linear_attention`: the inputs come from the model itself, and checking the gates' values
# would make the host wait for a GPU at every token (the public function checks whole sequences).
def _linear_step(fq, fk, v, S, eps: float):
    """Linear attention's recurrent step on features: GLA's step with gate 1, ``v`` extended by a 1."""
    v1 = torch.cat([v, v.new_ones(v.shape[:-1] + (1,))], dim=-1)
    out, S = _gla_recurrent(fq, fk, v1, torch.zeros_like(fk), S)
    return out[..., :-1] / (out[..., -1:] + eps), S


def _diagonal_step(kernel: S4DKernel, u: torch.Tensor, h: torch.Tensor):
    """One step of the `S4DKernel`'s channels: ``h = exp(dt A) h + u``, ``y = 2 Re <C dt phi1(dt A), h>``."""
    log_dt, A, C = kernel.modes()
    dtA = torch.exp(log_dt)[:, None] * A
    C_bar = C * (torch.exp(dtA) - 1) / A                                         # C * B_bar (ZOH), B = 1
    h = torch.exp(dtA) * h + u[..., None]
    return (2 * (C_bar * h).sum(-1).real).to(u.dtype), h


def mixer_step(mixer: nn.Module, x_t: torch.Tensor, state):
    """One token ``x_t (B, d)`` through one mixer of an `ArenaLM`: ``(y_t (B, d), new state)``.

    Equals ``mixer(x)[:, t]`` for the ``t``-th token after ``t`` earlier steps from `init_decode_state`
    (tests/test_11_arena.py). Every state but the KV cache has a size fixed in ``t``; the KV cache is
    written in place.
    """
    if not isinstance(mixer, _MIXERS):
        raise TypeError(f"mixer must be one of an ArenaLM's mixers (model.mixers[i]), got {type(mixer).__name__}")
    width = mixer.gru.input_size if isinstance(mixer, _GRUMixer) else (
        mixer.d_model if isinstance(mixer, (MambaBlock, S4DLayer, H3Layer)) else mixer.qkv.in_features)
    check_tensor("x_t", x_t, rank=2, floating=True)
    if x_t.shape[1] != width:
        raise ValueError(f"x_t must be one token (B, d={width}) for this mixer, got shape {tuple(x_t.shape)}")
    if isinstance(mixer, MambaBlock):
        return mixer.step(x_t, state)
    if isinstance(mixer, _GRUMixer):
        _, h = mixer.gru(x_t[:, None], state[None])
        return h[0], h[0]
    if isinstance(mixer, S4DLayer):
        y, state = _diagonal_step(mixer.ssm, x_t, state)
        return F.glu(mixer.out(F.gelu(y + mixer.D * x_t)), dim=-1), state
    B, D = x_t.shape
    if isinstance(mixer, H3Layer):                      # k_bar = sum_j c_j k_{t-j};  diagonal SSM on k_bar v^T
        keys, h = state
        H, dh, _ = mixer.shift_c.shape
        q, k, v = mixer.qkv(x_t).view(B, 3, H, dh).unbind(1)
        keys = torch.cat([keys, k[..., None]], dim=-1)                          # (B, H, d_h, N), newest last
        k_bar = (keys * mixer.shift_c.flip(-1)).sum(-1)
        kv = k_bar[..., :, None] * v[..., None, :]                              # (B, H, d_h, d_h)
        y, h = _diagonal_step(mixer.diag, kv.reshape(B, -1), h)
        o = torch.einsum("bhi,bhij->bhj", q, y.view(B, H, dh, dh) + mixer.D * kv)
        return mixer.out(o.reshape(B, D)), (keys[..., 1:], h)
    if isinstance(mixer, _BasedMixer):
        S, K, V = state
        q, k, v = (t.view(B, mixer.n_heads, 1, D // mixer.n_heads) for t in mixer.qkv(x_t).chunk(3, dim=-1))
        fq, fk = mixer.features(x_t[:, None])
        y, S = _linear_step(fq, fk, v, S, 1e-6)
        K, V = (torch.cat([c, n], dim=-2)[..., -(mixer.window + 1):, :] for c, n in zip((K, V), (k, v)))
        y = y + scaled_dot_product_attention(q, K, V)
        return mixer.out(y.reshape(B, D)), (S, K, V)
    q, k, v = (t.view(B, mixer.n_heads, 1, D // mixer.n_heads) for t in mixer.qkv(x_t).chunk(3, dim=-1))
    if mixer.family == "softmax":
        cache, pos = state
        K, V = cache.update(k, v, pos)
        y, state = scaled_dot_product_attention(q, K, V), (cache, pos + 1)
    elif mixer.family == "sliding_window":
        K, V = (torch.cat([c, n], dim=-2)[..., -(mixer.window + 1):, :] for c, n in zip(state, (k, v)))
        y, state = scaled_dot_product_attention(q, K, V), (K, V)
    elif mixer.family == "linear":
        y, state = _linear_step(elu_feature_map(q), elu_feature_map(k), v, state, 1e-6)
    elif mixer.family == "gla":
        log_g = (F.logsigmoid(mixer.gate(x_t)) / _GLA_TEMPERATURE).view(B, mixer.n_heads, 1, -1)
        y, state = _gla_recurrent(q * q.shape[-1] ** -0.5, k, v, log_g, state)
    else:                                       # FAVOR+ features of q, k scaled by d_h^(-1/4), as performer_attention
        W = _performer_features(mixer.n_features, q.shape[-1], mixer.seed, True, q.device, q.dtype)
        root = q.shape[-1] ** -0.25
        y, state = _linear_step(positive_random_features(q * root, W), positive_random_features(k * root, W), v,
                                state, 0.0)
    return mixer.out(y.reshape(B, D)), state


_MIXERS = (MambaBlock, _GRUMixer, S4DLayer, H3Layer, _BasedMixer, _AttentionMixer)


def width_for_budget(family: str, budget: int, *, vocab: int, n_layers: int = 2, n_heads: int = 2,
                     multiple: int = 4, **kwargs) -> int:
    """The width ``d_model`` (a multiple of ``multiple`` and of ``n_heads``) whose `ArenaLM` has the
    parameter count closest to ``budget``."""
    budget = check_positive_int("budget", budget)
    step = math.lcm(multiple, n_heads)
    best, best_gap = step, None
    for d in range(step, 64 * step + 1, step):
        n = count_params(ArenaLM(family, vocab, d, n_layers, n_heads=n_heads, **kwargs))
        if best_gap is None or abs(n - budget) < best_gap:
            best, best_gap = d, abs(n - budget)
        if n > budget:
            break
    return best


TASKS: dict[str, Callable] = {
    "mqar": lambda batch, size, vocab, gen, device: mqar(batch, size, vocab, generator=gen, device=device),
    "selective_copying": lambda batch, size, vocab, gen, device: selective_copying(batch, 4 * size, size, vocab,
                                                                                   generator=gen, device=device),
    "induction_heads": lambda batch, size, vocab, gen, device: induction_heads(batch, size, vocab, generator=gen,
                                                                               device=device),
}


def check_equal_answer_counts(targets: torch.Tensor, world: int) -> None:
    """Raise unless each of the ``world`` equal slices of the batch has the same number of answer positions.

    DDP averages the ranks' gradients, each the gradient of its slice's mean loss over its own answer
    positions; that average equals the gradient of the mean over the whole batch only when every slice
    holds the same number of answers (tests/test_11_arena.py). ``world`` must divide the batch.
    """
    check_tensor("targets", targets, min_rank=1)
    world = check_positive_int("world", world)
    if targets.shape[0] % world:
        raise ValueError(f"world={world} must divide the batch of targets {tuple(targets.shape)}")
    counts = (targets != PAD).reshape(world, -1).sum(-1)
    if not bool((counts == counts[0]).all()):
        raise ValueError(f"data-parallel training needs the same number of answer positions on every rank; the "
                         f"{world} slices of targets {tuple(targets.shape)} have {counts.tolist()}")


def _score(model: ArenaLM, ids: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` (put in eval mode) over the answer positions."""
    with torch.no_grad():
        logits = model.eval()(ids)
    keep = targets != PAD
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=PAD)
    accuracy = ((logits.argmax(-1) == targets) & keep).sum().item() / keep.sum().item()
    return loss.item(), accuracy


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def train_arena(family: str, task: str = "mqar", size: int = 8, *, vocab: int | None = None, d_model: int = 32,
                n_layers: int = 2, steps: int = 200, batch: int = 32, lr: float = 3e-3, seed: int = 0,
                eval_batch: int = 256, device: torch.device | str = "cpu", return_model: bool = False,
                patience: int | None = None, eval_every: int = 100, min_delta: float = 1e-3,
                warmup: int | None = None, **model_kwargs) -> dict:
    """Train an `ArenaLM` of ``family`` on ``task`` (a key of `TASKS`; ``size`` is the number of pairs
    for mqar, of data tokens for selective copying, the length for induction heads).

    AdamW with a linear warm-up over the first tenth of the steps; loss and accuracy count only the
    answer positions. ``batch`` is the global batch: under ``torchrun`` each of the ``W`` ranks trains on
    its ``batch / W`` slice of the same global batch and DDP averages gradients. Returns ``{"accuracy"
    (fresh sequences, seed 10_000 + seed), "losses" (global mean per step), "params", "state_bytes"
    (after the eval sequence length), "seq_len"}``, plus ``"model"`` (the trained `ArenaLM`, in eval mode)
    when ``return_model`` is true.

    Early stopping: with ``patience``, ``steps`` is a cap. Every ``eval_every`` steps the model is scored
    on a fixed validation batch of ``eval_batch`` sequences (seed 20_000 + seed, apart from the training
    and test draws); training stops after ``patience`` evaluations that do not lower the best validation
    loss by more than ``min_delta`` (nats), and the model of the best evaluation is tested and returned. The result then also holds
    ``"val"`` (one ``(step, loss, accuracy)`` per evaluation), ``"best_step"`` and ``"steps_run"``.
    ``warmup`` (default: a tenth of ``steps``) is the length of the linear learning-rate warm-up.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    batch, steps = check_positive_int("batch", batch), check_positive_int("steps", steps)
    size, eval_batch = check_positive_int("size", size), check_positive_int("eval_batch", eval_batch)
    lr = check_real("lr", lr, low=0.0, low_open=True)
    eval_every = check_positive_int("eval_every", eval_every)
    min_delta = check_real("min_delta", min_delta, low=0.0)
    if patience is not None:
        patience = check_positive_int("patience", patience)
    warmup = max(1, steps // 10) if warmup is None else check_positive_int("warmup", warmup)
    rank, world = _rank_and_world()
    if batch % world:
        raise ValueError(f"batch={batch} must be divisible by the number of processes ({world})")
    vocab = vocab or (4 * size + 2 if task == "mqar" else 16)
    gen = torch.Generator().manual_seed(seed)
    probe, _ = TASKS[task](1, size, vocab, torch.Generator().manual_seed(0), "cpu")
    torch.manual_seed(seed)
    model = ArenaLM(family, vocab, d_model, n_layers, max_len=probe.shape[1], seed=seed, **model_kwargs).to(device)
    trained = model
    if world > 1:
        trained = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    local = batch // world
    losses, val, best = [], [], None
    if patience is not None:
        val_ids, val_targets = TASKS[task](eval_batch, size, vocab, torch.Generator().manual_seed(20_000 + seed),
                                           device)
    for step in range(1, steps + 1):
        ids, targets = TASKS[task](batch, size, vocab, gen, device)            # the same global batch on every rank
        if world > 1:
            check_equal_answer_counts(targets, world)
        ids, targets = ids[rank * local:(rank + 1) * local], targets[rank * local:(rank + 1) * local]
        logits = trained(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        mean = loss.detach().clone()
        if world > 1:
            import torch.distributed as dist
            dist.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
        if patience is not None and (step % eval_every == 0 or step == steps):
            val_loss, val_acc = _score(model, val_ids, val_targets)
            model.train()
            val.append((step, val_loss, val_acc))
            if best is None or val_loss < best[1] - min_delta:
                best, since_best = (step, val_loss, copy.deepcopy(model.state_dict())), 0
            else:
                since_best += 1
                if since_best == patience:
                    break
    if best is not None:
        model.load_state_dict(best[2])
    ids, targets = TASKS[task](eval_batch, size, vocab, torch.Generator().manual_seed(10_000 + seed), device)
    _, accuracy = _score(model, ids, targets)
    result = {"accuracy": accuracy, "losses": losses, "params": count_params(model),
              "state_bytes": decode_state_bytes(model, ids.shape[1]), "seq_len": ids.shape[1]}
    if best is not None:
        result.update(val=val, best_step=best[0], steps_run=len(losses))
    if return_model:
        result["model"] = model
    return result
