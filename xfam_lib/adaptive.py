"""Adaptive computation (Chapter 6): Adaptive Computation Time, the Universal Transformer, adaptive
attention span, the Depth-Adaptive Transformer's exits and CALM's early exit.

Conventions: hidden states are ``(B, L, d_model)``; per-exit tensors put the exit (layer) axis
first, ``(N, B, L, ...)``, or last for per-token distributions, ``(..., N)``. Exit and step indices
are 0-based in code (exit ``n`` is the output after ``n + 1`` layers). Masks are boolean, True =
may attend.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .attention import causal_mask
from .positional import sinusoidal_encoding, ut_coordinate_encoding
from .transformer import EncoderLayer
from .utils import check_bool, check_positive_int, check_real, check_tensor, check_token_ids

__all__ = [
    # ACT and the Universal Transformer
    "ACTOutput", "act_halting", "UniversalTransformer",
    # adaptive attention span
    "soft_span_mask", "AdaptiveSpanAttention",
    # Depth-Adaptive Transformer
    "MultiExitModel", "multi_exit_loss", "geometric_exit_dist", "multinomial_exit_dist", "ExitPredictor",
    "oracle_exit", "rbf_kernel", "rbf_smooth",
    # CALM
    "softmax_response", "state_saturation", "confidence_targets", "first_exit", "calibrate_threshold",
]


# ============================================================================= ACT
class ACTOutput(NamedTuple):
    """`act_halting`'s result: ``output (..., d)``, ``ponder (...)`` = N + R, ``n_updates (...)`` = N."""

    output: torch.Tensor
    ponder: torch.Tensor
    n_updates: torch.Tensor


def act_halting(step_fn: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]], state: torch.Tensor,
                threshold: float = 0.99, max_steps: int = 10) -> ACTOutput:
    """Adaptive Computation Time (Graves 2016), per token, as a masked loop.

    ``state (..., d)``; ``step_fn(state, n) -> (new_state (..., d), p (...))`` runs step ``n``
    (0-based) and gives each token's halting probability ``p`` in ``[0, 1]``. A token halts at the
    first step ``N`` with ``p_1 + ... + p_N >= threshold`` (``1 - eps``), or at ``max_steps``. Its
    weights are ``p_n`` for ``n < N`` and the remainder ``R = 1 - (p_1 + ... + p_{N-1})`` at ``N``,
    so they sum to 1; the output is the weighted sum of its states and the ponder cost is ``N + R``.
    A halted token's state is frozen: later steps still see it, but never change it.
    """
    if not callable(step_fn):
        raise TypeError(f"step_fn must be a callable (state, n) -> (new_state, p), got {type(step_fn).__name__}")
    check_tensor("state", state, min_rank=1, floating=True)
    threshold = check_real("threshold", threshold, low=0.0, high=1.0, low_open=True)
    max_steps = check_positive_int("max_steps", max_steps)
    tokens = state.shape[:-1]
    cum = state.new_zeros(tokens)                     # sum of p over the steps taken before halting
    remainder = state.new_zeros(tokens)
    n_updates = state.new_zeros(tokens)
    output = torch.zeros_like(state)
    running = torch.ones(tokens, dtype=torch.bool, device=state.device)
    for n in range(max_steps):
        new_state, p = step_fn(state, n)
        check_tensor("new_state (from step_fn)", new_state, floating=True)
        check_tensor("p (from step_fn)", p, floating=True)
        if p.shape != tokens or new_state.shape != state.shape:
            raise ValueError(f"step_fn must return new_state {tuple(state.shape)} and p {tuple(tokens)}, got "
                             f"{tuple(new_state.shape)} and {tuple(p.shape)}")
        if p.numel() and not bool(((p >= 0) & (p <= 1)).all()):               # NaN fails too
            raise ValueError(f"step_fn's halting probabilities p must lie in [0, 1], got range "
                             f"[{p.min().item():.4g}, {p.max().item():.4g}] at step {n}")
        halt = running & ((cum + p >= threshold) | (n == max_steps - 1))
        weight = torch.where(halt, 1.0 - cum, torch.where(running, p, torch.zeros_like(p)))
        output = output + weight.unsqueeze(-1) * new_state
        remainder = torch.where(halt, 1.0 - cum, remainder)
        cum = cum + torch.where(running & ~halt, p, torch.zeros_like(p))
        n_updates = n_updates + running.to(state.dtype)
        state = torch.where(running.unsqueeze(-1), new_state, state)
        running = running & ~halt
        if not bool(running.any()):
            break
    return ACTOutput(output, n_updates + remainder, n_updates)


# ============================================================================= Universal Transformer
class UniversalTransformer(nn.Module):
    """One `transformer.EncoderLayer` applied ``n_steps`` times with shared weights (Dehghani et al. 2019).

    Before step ``t`` the coordinate embedding ``positional.ut_coordinate_encoding`` (position +
    step sinusoids) is added to the state. ``forward(x (B, L, d_model), mask=None)`` returns
    ``(B, L, d_model)``; with ``act=True`` each position halts on its own (`act_halting`, halting
    unit ``sigmoid(w . h + b)`` with ``b = 1`` at init, Graves's choice) and the result is an
    `ACTOutput` ``(output, ponder, n_updates)``, ``n_steps`` being the most steps a token may take.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_steps: int, *, act: bool = False,
                 threshold: float = 0.99, norm_first: bool = False):
        super().__init__()
        self.n_steps = check_positive_int("n_steps", n_steps)
        self.threshold = check_real("threshold", threshold, low=0.0, high=1.0, low_open=True)
        check_bool("act", act)
        self.layer = EncoderLayer(d_model, n_heads, d_ff, norm_first=norm_first)
        self.halt = None
        if act:
            self.halt = nn.Linear(d_model, 1)
            nn.init.constant_(self.halt.bias, 1.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        check_tensor("x", x, rank=3, floating=True)
        coords = ut_coordinate_encoding(x.shape[1], self.n_steps, x.shape[2], device=x.device,
                                        dtype=x.dtype)
        if self.halt is None:
            for t in range(self.n_steps):
                x = self.layer(x + coords[t], mask)
            return x

        def step(state, t):
            new_state = self.layer(state + coords[t], mask)
            return new_state, torch.sigmoid(self.halt(new_state)).squeeze(-1)

        return act_halting(step, x, self.threshold, self.n_steps)


# ============================================================================= adaptive span
def soft_span_mask(dist: torch.Tensor, z, ramp: float) -> torch.Tensor:
    """Sukhbaatar et al.'s soft mask ``m_z(x) = clamp((R + z - x) / R, 0, 1)``.

    ``dist`` holds distances ``x = i - j >= 0``; ``z`` (a number or a tensor broadcasting against
    ``dist``) is the learned span and ``ramp = R > 0`` the width of the linear ramp: the mask is 1
    up to ``z``, falls linearly to 0 at ``z + R``, and is 0 beyond; it is differentiable in ``z``.
    """
    check_tensor("dist", dist)
    ramp = check_real("ramp", ramp, low=0.0, low_open=True)
    if isinstance(z, torch.Tensor):
        check_tensor("z", z, floating=True)
    else:
        z = check_real("z", z)
    return ((ramp + z - dist) / ramp).clamp(0.0, 1.0)


class AdaptiveSpanAttention(nn.Module):
    """Causal multi-head attention in which each head learns how far back it looks (Sukhbaatar et al. 2019).

    Head ``h`` has span ``z_h = max_span * sigmoid(theta_h)`` and weights
    ``a_ij = m_z(i - j) exp(s_ij) / sum_r m_z(i - r) exp(s_ir)`` over keys ``j <= i`` (`soft_span_mask`).
    ``span_penalty()`` is the mean span, the L1 term added to the loss. ``forward(x (B, L, d_model),
    return_weights=False) -> (B, L, d_model)`` (and the weights ``(B, H, L, L)``).

    ``forward(x, trim=True)`` is the efficient form: every key at distance ``z_h + R`` or more has
    mask 0, so only the last ``W = ceil(max_h z_h + R)`` keys of each query are scored (the paper
    keeps only as much memory as the longest span needs). Queries are cut into blocks of ``W`` rows
    and each block scores its own block and the one before, ``(B, H, L/W, W, 2W)`` scores instead of
    ``(B, H, L, L)``; the output equals the full form (outputs and gradients).
    """

    def __init__(self, d_model: int, n_heads: int, max_span: int, ramp: int = 32, *, init_span: float | None = None):
        super().__init__()
        check_positive_int("d_model", d_model)
        self.n_heads = check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.max_span, self.ramp = check_positive_int("max_span", max_span), check_positive_int("ramp", ramp)
        init_span = max_span / 2 if init_span is None else check_real("init_span", init_span, low=0.0, high=max_span,
                                                                       low_open=True, high_open=True)
        self.d_model, self.d_head = d_model, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.span_logit = nn.Parameter(torch.full((n_heads,), math.log(init_span / (max_span - init_span))))

    @property
    def spans(self) -> torch.Tensor:
        """The learned spans ``z (H,)`` in tokens."""
        return self.max_span * torch.sigmoid(self.span_logit)

    def span_penalty(self) -> torch.Tensor:
        """The L1 penalty on the spans: their mean over heads (multiply by the loss coefficient)."""
        return self.spans.mean()

    def forward(self, x: torch.Tensor, return_weights: bool = False, *, trim: bool = False):
        check_tensor("x", x, rank=3, floating=True)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, L, d_model={self.d_model}), got {tuple(x.shape)}")
        if check_bool("trim", trim) and check_bool("return_weights", return_weights):
            raise ValueError("trim=True never forms the (L, L) weights: call it with return_weights=False")
        b, length, _ = x.shape
        heads = lambda t: t.view(b, length, self.n_heads, self.d_head).transpose(1, 2)
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if trim:
            out = self._trimmed(q, k, v)
            return self.out_proj(out.transpose(1, 2).reshape(b, length, self.d_model))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)
        allowed = causal_mask(length, device=x.device)
        pos = torch.arange(length, device=x.device)
        dist = (pos[:, None] - pos[None, :]).to(x.dtype)
        soft = soft_span_mask(dist, self.spans[:, None, None], self.ramp) * allowed       # (H, L, L)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) * soft
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
        out = self.out_proj((weights @ v).transpose(1, 2).reshape(b, length, self.d_model))
        return (out, weights) if return_weights else out

    def _trimmed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Blocked form of the forward pass over the last ``W = ceil(max z + R)`` keys: ``(B, H, L, d_head)``."""
        length = q.shape[-2]
        width = max(1, min(length, math.ceil(self.spans.max().item() + self.ramp)))   # keys beyond get mask 0
        n_blocks = -(-length // width)
        pad = n_blocks * width - length
        blocks = lambda t, left: F.pad(t, (0, 0, left, pad)).unflatten(-2, (-1, width))
        qb = blocks(q, 0)                                                          # (B, H, n, W, d)
        kb, vb = blocks(k, width), blocks(v, width)                                # one block of zeros in front
        kw = torch.cat([kb[:, :, :-1], kb[:, :, 1:]], dim=-2)                      # (B, H, n, 2W, d): previous + own
        vw = torch.cat([vb[:, :, :-1], vb[:, :, 1:]], dim=-2)
        scores = (qb @ kw.transpose(-2, -1)) / math.sqrt(self.d_head)             # (B, H, n, W, 2W)
        blk = torch.arange(n_blocks, device=q.device)[:, None, None]
        row = torch.arange(width, device=q.device)[None, :, None]
        col = torch.arange(2 * width, device=q.device)[None, None, :]
        dist = width + row - col                                                   # i - j for query row, key col
        key_pos = (blk - 1) * width + col
        allowed = (dist >= 0) & (key_pos >= 0) & (key_pos < length)                # (n, W, 2W)
        soft = soft_span_mask(dist.to(q.dtype), self.spans[:, None, None, None], self.ramp) * allowed
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) * soft
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
        return (weights @ vw).flatten(2, 3)[:, :, :length]


# ============================================================================= Depth-Adaptive Transformer
class MultiExitModel(nn.Module):
    """A stack of Pre-LN `transformer.EncoderLayer` with an output head after every layer (Elbayad et al. 2020).

    ``forward(ids (B, L)) -> exit_logits (N, B, L, n_out)``: exit ``n`` reads the state after layer
    ``n + 1``. ``shared_head=True`` uses one final LayerNorm + linear head for all exits; otherwise
    each exit has its own. ``causal=True`` gives a left-to-right model. ``confidence`` is CALM's
    early-exit classifier ``sigmoid(w . h + b)`` (train it on `confidence_targets`), and
    `early_exit` runs the model token by token against a confidence threshold.
    """

    def __init__(self, vocab: int, d_model: int, n_heads: int, d_ff: int, n_layers: int, *, n_out: int | None = None,
                 shared_head: bool = True, causal: bool = False):
        super().__init__()
        self.n_layers = check_positive_int("n_layers", n_layers)
        self.vocab = check_positive_int("vocab", vocab)
        n_out = vocab if n_out is None else check_positive_int("n_out", n_out)
        check_bool("shared_head", shared_head)
        self.causal = check_bool("causal", causal)
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, norm_first=True) for _ in range(n_layers))
        n_heads_out = 1 if shared_head else n_layers
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_heads_out))
        self.heads = nn.ModuleList(nn.Linear(d_model, n_out) for _ in range(n_heads_out))
        self.confidence = nn.Linear(d_model, 1)

    def _mask(self, length: int, device) -> torch.Tensor | None:
        return causal_mask(length, device=device) if self.causal else None

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings plus sinusoid positions: ``(B, L) -> (B, L, d_model)``."""
        check_token_ids("ids", ids, self.vocab, rank=2)
        h = self.embed(ids)
        return h + sinusoidal_encoding(ids.shape[1], h.shape[-1], device=h.device, dtype=h.dtype)

    def exit_head(self, h: torch.Tensor, n: int) -> torch.Tensor:
        """The logits of exit ``n`` for states ``h (..., d_model)``."""
        i = 0 if len(self.heads) == 1 else n
        return self.heads[i](self.norms[i](h))

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The state after every layer: ``(N, B, L, d_model)``."""
        h, mask, states = self.embed_ids(ids), self._mask(ids.shape[1], ids.device), []
        for layer in self.layers:
            h = layer(h, mask)
            states.append(h)
        return torch.stack(states)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        states = self.hidden_states(ids)
        return torch.stack([self.exit_head(states[n], n) for n in range(self.n_layers)])

    def early_exit(self, ids: torch.Tensor, measure: str, threshold: float):
        """CALM-style per-token early exit (Schuster et al. 2022): ``(logits (B, L, n_out), exit (B, L))``.

        After layer ``n`` a token exits when its confidence is *above* ``threshold`` (strictly, as in
        CALM; ``threshold=1`` never exits early and equals the full model). ``measure``:
        ``"softmax"`` (`softmax_response` of the exit's logits), ``"saturation"``
        (`state_saturation` between the states before and after the layer) or ``"classifier"``
        (``self.confidence``). An exited token's state is copied upward: later layers still attend
        to it but never change it. ``exit`` is the 0-based exit index (layers used = exit + 1).
        """
        if measure not in ("softmax", "saturation", "classifier"):
            raise ValueError(f"measure must be 'softmax', 'saturation' or 'classifier', got {measure!r}")
        threshold = check_real("threshold", threshold)
        h, mask = self.embed_ids(ids), self._mask(ids.shape[1], ids.device)
        exited = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        exit_idx = torch.full(ids.shape, self.n_layers - 1, dtype=torch.long, device=ids.device)
        logits = None
        for n, layer in enumerate(self.layers):
            prev = h
            h = torch.where(exited.unsqueeze(-1), prev, layer(prev, mask))
            logits_n = self.exit_head(h, n)
            logits = logits_n if logits is None else torch.where(exited.unsqueeze(-1), logits, logits_n)
            if n == self.n_layers - 1:
                break
            if measure == "softmax":
                conf = softmax_response(logits_n)
            elif measure == "saturation":
                conf = state_saturation(prev, h)
            else:
                conf = torch.sigmoid(self.confidence(h)).squeeze(-1)
            newly = ~exited & (conf > threshold)
            exit_idx = torch.where(newly, n, exit_idx)
            exited = exited | newly
        return logits, exit_idx


def multi_exit_loss(exit_logits: torch.Tensor, targets: torch.Tensor, weights=None) -> torch.Tensor:
    """Multi-exit training loss: ``sum_n w_n CE(exit_logits[n], targets)`` (``w_n = 1`` by default).

    ``exit_logits (N, ..., C)``, ``targets (...)`` integer classes; each CE is a mean over tokens.
    """
    check_tensor("exit_logits", exit_logits, min_rank=2, floating=True)
    check_tensor("targets", targets)
    if exit_logits.shape[1:-1] != targets.shape:
        raise ValueError(f"exit_logits (N, ..., C) and targets (...) disagree: {tuple(exit_logits.shape)} vs "
                         f"{tuple(targets.shape)}")
    check_token_ids("targets", targets, exit_logits.shape[-1], vocab_name="C")
    n_exits = exit_logits.shape[0]
    weights = torch.ones(n_exits) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    if weights.shape != (n_exits,):
        raise ValueError(f"weights must have one entry per exit ({n_exits}), got shape {tuple(weights.shape)}")
    if not bool(weights.isfinite().all()):
        raise ValueError(f"weights must be finite, got {weights.tolist()}")
    flat = exit_logits.reshape(n_exits, -1, exit_logits.shape[-1])
    losses = torch.stack([F.cross_entropy(flat[n], targets.reshape(-1)) for n in range(n_exits)])
    return (weights.to(losses) * losses).sum()


def geometric_exit_dist(halt_probs: torch.Tensor) -> torch.Tensor:
    """Elbayad et al.'s geometric-like exit distribution from per-layer halting probabilities.

    ``halt_probs (..., N)`` holds ``chi_n`` in ``[0, 1]``; returns ``q (..., N)`` with
    ``q_n = chi_n * prod_{m < n} (1 - chi_m)`` for ``n < N - 1`` and the rest of the mass,
    ``prod_{m < N-1} (1 - chi_m)``, on the last exit (``chi`` of the last layer is not used). Sums to 1.
    """
    check_tensor("halt_probs", halt_probs, min_rank=1, floating=True)
    if halt_probs.numel() and not bool(((halt_probs >= 0) & (halt_probs <= 1)).all()):          # NaN fails too
        raise ValueError(f"halt_probs must lie in [0, 1], got range [{halt_probs.min().item():.4g}, "
                         f"{halt_probs.max().item():.4g}]")
    chi = halt_probs[..., :-1]
    survive = torch.cumprod(torch.cat([torch.ones_like(halt_probs[..., :1]), 1.0 - chi], dim=-1), dim=-1)
    stop = torch.cat([chi, torch.ones_like(halt_probs[..., :1])], dim=-1)
    return survive * stop


def multinomial_exit_dist(logits: torch.Tensor) -> torch.Tensor:
    """Multinomial exit distribution ``softmax(W h + b)`` over the ``N`` exits: ``(..., N) -> (..., N)``."""
    check_tensor("logits", logits, min_rank=1, floating=True)
    return torch.softmax(logits, dim=-1)


class ExitPredictor(nn.Module):
    """The Depth-Adaptive Transformer's three exit distributions, from the states ``(N, B, L, d_model)``.

    ``kind="sequence"``: one multinomial per sequence from the positions' mean of the first layer's
    states; ``"token"``: a multinomial per token from its first-layer state; ``"geometric"``: per
    layer ``n`` a halting probability ``sigmoid(w_n . h^n_t + b_n)``, then `geometric_exit_dist`.
    ``forward(states) -> q (B, L, N)``; rows sum to 1.
    """

    def __init__(self, d_model: int, n_layers: int, kind: str):
        super().__init__()
        if kind not in ("sequence", "token", "geometric"):
            raise ValueError(f"kind must be 'sequence', 'token' or 'geometric', got {kind!r}")
        self.kind, self.n_layers = kind, check_positive_int("n_layers", n_layers)
        d_model = check_positive_int("d_model", d_model)
        if kind == "geometric":
            self.w = nn.Parameter(torch.randn(n_layers, d_model) / math.sqrt(d_model))
            self.b = nn.Parameter(torch.zeros(n_layers))
        else:
            self.proj = nn.Linear(d_model, n_layers)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        check_tensor("states", states, rank=4, floating=True)
        d_model = self.w.shape[1] if self.kind == "geometric" else self.proj.in_features
        if states.shape[0] != self.n_layers or states.shape[-1] != d_model:
            raise ValueError(f"states must be (N={self.n_layers}, B, L, d_model={d_model}), got {tuple(states.shape)}")
        if self.kind == "geometric":
            chi = torch.sigmoid(torch.einsum("nbld,nd->bln", states, self.w) + self.b)
            return geometric_exit_dist(chi)
        first = states[0]
        if self.kind == "sequence":
            return multinomial_exit_dist(self.proj(first.mean(1, keepdim=True))).expand(-1, first.shape[1], -1)
        return multinomial_exit_dist(self.proj(first))


def oracle_exit(LL: torch.Tensor, lam: float) -> torch.Tensor:
    """The oracle exit ``argmax_n (LL_n - lam * (n + 1))`` (0-based; depth ``n + 1``).

    ``LL (..., N)`` holds each exit's log-likelihood of the reference token; ``lam >= 0`` charges
    each layer. Ties go to the shallower exit. A larger ``lam`` never gives a deeper exit.
    """
    check_tensor("LL", LL, min_rank=1, floating=True)
    lam = check_real("lam", lam, low=0.0)
    depth = torch.arange(1, LL.shape[-1] + 1, device=LL.device, dtype=LL.dtype)
    return (LL - lam * depth).argmax(-1)


def rbf_kernel(length: int, sigma: float, *, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """``K[t, t'] = exp(-|t - t'|^2 / sigma)``, ``(length, length)``: 1 on the diagonal, decaying away from it."""
    length = check_positive_int("length", length)
    sigma = check_real("sigma", sigma, low=0.0, low_open=True)
    t = torch.arange(length, dtype=dtype, device=device)
    return torch.exp(-(t[:, None] - t[None, :]).square() / sigma)


def rbf_smooth(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Smooth ``x (..., T)`` over time with `rbf_kernel`: ``y_t = sum_t' K[t, t'] x_t'`` (Elbayad et al.'s
    smoothing of the per-token log-likelihoods before taking oracle exits)."""
    check_tensor("x", x, min_rank=1, floating=True)
    return x @ rbf_kernel(x.shape[-1], sigma, dtype=x.dtype, device=x.device).T


# ============================================================================= CALM
def softmax_response(logits: torch.Tensor) -> torch.Tensor:
    """CALM's softmax-margin confidence: top-1 minus top-2 probability, ``(..., C) -> (...)`` in ``[0, 1]``."""
    check_tensor("logits", logits, min_rank=1, floating=True)
    if logits.shape[-1] < 2:
        raise ValueError(f"softmax_response needs at least 2 classes, got logits {tuple(logits.shape)}")
    compute = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    top2 = torch.softmax(logits.to(compute), dim=-1).topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).to(logits.dtype)


def state_saturation(h_prev: torch.Tensor, h_next: torch.Tensor) -> torch.Tensor:
    """CALM's hidden-state saturation: cosine similarity of a token's states before and after a layer,
    ``(..., d) -> (...)``, clamped to ``[-1, 1]``."""
    check_tensor("h_prev", h_prev, min_rank=1, floating=True)
    check_tensor("h_next", h_next, min_rank=1, floating=True)
    if h_prev.shape != h_next.shape:
        raise ValueError(f"h_prev and h_next must have the same shape, got {tuple(h_prev.shape)} and {tuple(h_next.shape)}")
    return F.cosine_similarity(h_prev, h_next, dim=-1).clamp(-1.0, 1.0)


def confidence_targets(exit_logits: torch.Tensor) -> torch.Tensor:
    """CALM's labels for the early-exit classifier: does exit ``n`` already predict the last exit's token?
    ``(N, ..., C) -> (N, ...)`` boolean."""
    check_tensor("exit_logits", exit_logits, min_rank=2, floating=True)
    pred = exit_logits.argmax(-1)
    return pred == pred[-1:]


def first_exit(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """First exit whose confidence is strictly above ``threshold``, else the last: ``(..., N) -> (...)`` (0-based)."""
    check_tensor("conf", conf, min_rank=1, floating=True)
    threshold = check_real("threshold", threshold)
    above = conf > threshold
    above[..., -1] = True
    return above.to(torch.uint8).argmax(-1)


def calibrate_threshold(conf: torch.Tensor, correct: torch.Tensor, eps: float, *, delta: float | None = None,
                        thresholds: torch.Tensor | None = None) -> float:
    """A simplified Learn-then-Test calibration (Angelopoulos et al. 2021) of CALM's exit threshold.

    ``conf (n, N)`` are the confidences of ``n`` held-out tokens at each exit and ``correct (n, N)``
    whether exiting there gives an acceptable prediction (e.g. equal to the full model's). The risk
    of a threshold is the accuracy drop ``mean(correct[:, -1]) - mean(correct[i, first_exit_i])``.
    Thresholds are tested from 1 (never exit early) downwards (fixed-sequence testing); the
    smallest one reached before the first failure is returned. A threshold passes when its risk is
    at most ``eps``, or, with ``delta``, when the Hoeffding upper bound
    ``risk + sqrt(2 ln(1/delta) / n)`` is (per-token drops lie in ``[-1, 1]``), which holds with
    probability ``>= 1 - delta`` for an exchangeable test set. ``thresholds`` defaults to 101
    evenly spaced values from 1 down to ``min(0, conf.min())``.
    """
    check_tensor("conf", conf, rank=2, floating=True)
    check_tensor("correct", correct, rank=2)
    if correct.shape != conf.shape:
        raise ValueError(f"correct must have conf's shape (n, N) = {tuple(conf.shape)}, got {tuple(correct.shape)}")
    if len(conf) == 0:
        raise ValueError(f"conf must hold at least one held-out token, got shape {tuple(conf.shape)}")
    if bool(conf.isnan().any()):
        raise ValueError(f"conf must not contain NaN ({int(conf.isnan().sum())} of {conf.numel()} are)")
    if correct.is_floating_point() and not bool(((correct == 0) | (correct == 1)).all()):
        raise ValueError("correct must be boolean (or 0/1): whether exiting there is acceptable")
    eps = check_real("eps", eps, low=0.0, high=1.0)
    if delta is not None:
        delta = check_real("delta", delta, low=0.0, high=1.0, low_open=True)
    slack = 0.0 if delta is None else math.sqrt(2 * math.log(1 / delta) / len(conf))
    if thresholds is None:
        thresholds = torch.linspace(1.0, min(0.0, float(conf.min())), 101)
    correct = correct.to(torch.float64)
    full = correct[:, -1].mean()
    chosen = 1.0
    for lam in sorted((float(t) for t in thresholds), reverse=True):
        exits = first_exit(conf, lam)
        risk = full - correct.gather(1, exits.unsqueeze(1)).mean()
        if float(risk) + slack > eps:
            break
        chosen = lam
    return chosen
