"""Transformers for reinforcement learning (chapter 10): GTrXL's gated blocks and the Decision Transformer.

Layout: activations ``(B, L, d)``; trajectories ``(B, T, ...)`` with time on dim 1. Masks follow
`xfam_lib.attention` (True = may attend). The toy environment `ChainMDP` and the scripted policies of
`collect_offline_dataset` exist so the chapter can train a Decision Transformer offline on a CPU in
seconds, with no download; `TMaze` (a `gymnasium.Env`), the LSTM and Transformer actor-critics and
`train_reinforce` train memory policies by policy gradient.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .attention import MultiHeadAttention, causal_mask
from .train import progress_range
from .transformer import FeedForward
from .utils import check_bool, check_instance, check_positive_int, check_real, check_tensor, check_token_ids

__all__ = [
    "GRUGate", "GTrXLBlock", "gate_deviation", "layer_gradient_norms", "position_influence", "markovian_share",
    "cue_recall_batch", "CueRecallNet", "train_cue_recall",
    "returns_to_go", "interleave_trajectory", "dt_action_token_index", "DecisionTransformer",
    "ChainMDP", "GambleChain", "OfflineDataset", "collect_offline_dataset", "best_episodes",
    "train_decision_transformer", "rollout",
    "TMaze", "LSTMPolicy", "TransformerPolicy", "count_parameters", "Episodes", "play_episodes",
    "reinforce_loss", "train_reinforce", "match_parameters",
]


# ----------------------------------------------------------------------------- GTrXL
class GRUGate(nn.Module):
    """GTrXL's GRU-style gate ``g(x, y)`` (Parisotto et al. 2020, after Chung et al. 2014).

    ``x`` is the residual stream, ``y`` the sub-layer output, both ``(..., d)``::

        r = sigmoid(W_r y + U_r x)
        z = sigmoid(W_z y + U_z x - b_g)
        h = tanh(W_g y + U_g (r * x))
        g = (1 - z) * x + z * h

    ``b_g`` (a learned ``(d,)`` bias, initialised to ``bias_init``) pushes ``z`` towards 0, so a
    block with ``bias_init > 0`` starts close to the identity map ``g = x``.
    """

    def __init__(self, d: int, bias_init: float = 2.0):
        super().__init__()
        d = check_positive_int("d", d)
        bias_init = check_real("bias_init", bias_init)
        self.W = nn.Linear(d, 3 * d, bias=False)          # W_r, W_z, W_g applied to y
        self.U_rz = nn.Linear(d, 2 * d, bias=False)       # U_r, U_z applied to x
        self.U_g = nn.Linear(d, d, bias=False)            # U_g applied to r * x
        self.b_g = nn.Parameter(torch.full((d,), float(bias_init)))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, min_rank=1, floating=True)
        check_tensor("y", y, floating=True)
        if x.shape[-1] != self.b_g.shape[0]:
            raise ValueError(f"x must be (..., d={self.b_g.shape[0]}), got shape {tuple(x.shape)}")
        if y.shape != x.shape:
            raise ValueError(f"y must have x's shape {tuple(x.shape)}, got {tuple(y.shape)}")
        wr, wz, wg = self.W(y).chunk(3, dim=-1)
        ur, uz = self.U_rz(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.b_g)
        h = torch.tanh(wg + self.U_g(r * x))
        return (1 - z) * x + z * h


def gate_deviation(gate: GRUGate, x: torch.Tensor, y: torch.Tensor) -> float:
    """``||g(x, y) - x|| / ||x||``: how far the gate is from the identity map."""
    check_instance("gate", gate, GRUGate)
    with torch.no_grad():
        return float((gate(x, y) - x).norm() / x.norm())


def layer_gradient_norms(blocks, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer gradient norms of a stack at its current weights.

    ``x (B, L, d)`` runs through ``blocks`` in order, giving ``h_0 = x, h_1, ..., h_N``; the loss is the
    fixed linear read-out ``sum(weight * h_N)`` (``weight`` shaped like ``x``), so every stack receives the
    same gradient ``weight`` at the top and only the way it carries it down differs. Returns
    ``(state_norms (N+1,), param_norms (N,))``: ``||dL/dh_l||`` for ``l = 0..N`` and, per block, the norm of
    the gradient of all its parameters (by ``torch.autograd.grad``: no ``.grad`` field is touched).
    """
    blocks = list(blocks)
    if not blocks:
        raise ValueError("blocks must hold at least one block")
    check_tensor("x", x, rank=3, floating=True)
    check_tensor("weight", weight, floating=True)
    if weight.shape != x.shape:
        raise ValueError(f"weight must have x's shape {tuple(x.shape)}, got {tuple(weight.shape)}")
    params = [[p for p in blk.parameters() if p.requires_grad] for blk in blocks]
    h = x.detach().requires_grad_()
    states = [h]
    with torch.enable_grad():
        for blk in blocks:
            h = blk(h)
            states.append(h)
        grads = torch.autograd.grad((weight * h).sum(), states + [p for ps in params for p in ps], allow_unused=True)
    state_norms = torch.stack([g.norm() for g in grads[:len(states)]])
    rest, param_norms = list(grads[len(states):]), []
    for ps in params:
        mine, rest = rest[:len(ps)], rest[len(ps):]
        sq = sum((g.pow(2).sum() for g in mine if g is not None), torch.zeros((), dtype=x.dtype, device=x.device))
        param_norms.append(sq.sqrt())
    return state_norms.detach(), torch.stack(param_norms).detach()


@torch.no_grad()
def position_influence(blocks, x: torch.Tensor, nudge: torch.Tensor) -> torch.Tensor:
    """How far each input position moves the stack's output at the last position, ``(L,)``.

    ``x (B, L, d)`` runs through ``blocks`` in order. For each position ``p`` the input ``x[:, p]`` alone
    is moved by ``nudge (B, d)`` (the same vector at every ``p``); entry ``p`` is the norm, over the
    batch, of the resulting change of the last position's output. A causal stack that ignores the
    past gives zeros everywhere but at ``p = L - 1``.
    """
    blocks = list(blocks)
    if not blocks:
        raise ValueError("blocks must hold at least one block")
    check_tensor("x", x, rank=3, floating=True)
    check_tensor("nudge", nudge, rank=2, floating=True)
    b, length, d = x.shape
    if nudge.shape != (b, d):
        raise ValueError(f"nudge must be (B={b}, d={d}) like x {tuple(x.shape)}, got {tuple(nudge.shape)}")
    moved = x.unsqueeze(0).repeat(length, 1, 1, 1)           # (L, B, L, d): copy p has position p nudged
    moved[torch.arange(length), :, torch.arange(length)] += nudge
    h = torch.cat([x.unsqueeze(0), moved]).flatten(0, 1)
    for blk in blocks:
        h = blk(h)
    last = h[:, -1].view(length + 1, b, d)
    return (last[1:] - last[0]).flatten(1).norm(dim=1)


def markovian_share(influence: torch.Tensor) -> float:
    """``I_now / (I_now + mean(I_past))`` for a `position_influence` ``influence (L,)``: 1 for a stack
    whose last output depends on the current position only, 0.5 when the current position weighs as
    much as an average past one, below 0.5 when the past weighs more."""
    check_tensor("influence", influence, rank=1, floating=True)
    if influence.shape[0] < 2:
        raise ValueError(f"influence must cover at least two positions, got shape {tuple(influence.shape)}")
    now, past = influence[-1], influence[:-1].mean()
    return float(now / (now + past))

_GATES = ("residual", "gru")


class GTrXLBlock(nn.Module):
    """One layer of the Transformer-XL family that Parisotto et al. compare, ``(B, L, d) -> (B, L, d)``:
    causal self-attention, then a feed-forward network. The defaults (``gate="gru"``, ``reorder=True``)
    give a GTrXL layer, but without the relative position encoding of the paper's layers: order reaches
    the block only through its input.

    ``reorder=True`` (identity-map reordering): each sub-layer reads ``LN(x)`` and its output ``y``
    (after a ReLU when ``relu``) is merged into the untouched stream, ``x <- gate(x, y)``:
    ``gate="residual"`` is ``x + y``, ``gate="gru"`` is a `GRUGate`. With ``gate="residual"`` and
    ``relu=False`` this is the Pre-LN layer. ``reorder=False`` is the original Post-LN layer,
    ``x <- LN(x + sublayer(x))`` (residual gate only). ``relu=None`` means the paper's choice: a ReLU
    whenever the stream is reordered.

    ``activation`` is the feed-forward network's (``"relu"`` or ``"gelu"``).
    ``forward(x, memory=None)``: ``memory (B, M, d)`` holds earlier states (Transformer-XL style,
    no gradient); queries attend causally over ``[memory, x]`` (bottom-right aligned).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *, gate: str = "gru",
                 reorder: bool = True, relu: bool | None = None, bias_init: float = 2.0, activation: str = "relu"):
        super().__init__()
        if gate not in _GATES:
            raise ValueError(f"gate must be one of {_GATES}, got {gate!r}")
        if not reorder and gate != "residual":
            raise ValueError("reorder=False is the Post-LN layer and takes only gate='residual'")
        self.gate, self.reorder = gate, check_bool("reorder", reorder)
        self.relu = self.reorder if relu is None else check_bool("relu", relu)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ff = FeedForward(d_model, 4 * d_model if d_ff is None else check_positive_int("d_ff", d_ff), activation)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        if gate == "gru":
            self.gate1, self.gate2 = GRUGate(d_model, bias_init), GRUGate(d_model, bias_init)

    def _merge(self, which: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.relu:
            y = F.relu(y)
        if self.gate == "residual":
            return x + y
        return (self.gate1 if which == 1 else self.gate2)(x, y)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        check_tensor("x", x, rank=3, floating=True)
        if x.shape[-1] != self.norm1.normalized_shape[0]:
            raise ValueError(f"x must be (B, L, d_model={self.norm1.normalized_shape[0]}), got shape {tuple(x.shape)}")
        if memory is not None:
            check_tensor("memory", memory, rank=3, floating=True)
            if memory.shape[0] != x.shape[0] or memory.shape[-1] != x.shape[-1]:
                raise ValueError(f"memory must be (B={x.shape[0]}, M, d={x.shape[-1]}), got {tuple(memory.shape)}")
        if not self.reorder:
            context = x if memory is None else torch.cat([memory.detach(), x], dim=1)
            mask = causal_mask(x.shape[1], context.shape[1], device=x.device)
            x = self.norm1(x + self.attn(x, kv=context, mask=mask))
            return self.norm2(x + self.ff(x))
        h = self.norm1(x)
        context = h if memory is None else torch.cat([self.norm1(memory.detach()), h], dim=1)
        mask = causal_mask(x.shape[1], context.shape[1], device=x.device)
        x = self._merge(1, x, self.attn(h, kv=context, mask=mask))
        return self._merge(2, x, self.ff(self.norm2(x)))


# ----------------------------------------------------------------------------- a cue-recall task for deep stacks
def cue_recall_batch(n: int, *, n_cues: int = 4, n_distractors: int = 8, length: int = 12,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A one-step memory task: ``(tokens (n, length) long, cue (n,) long)``.

    Token 0 is the cue (an id below ``n_cues``), the middle tokens are distractors (ids ``n_cues`` to
    ``n_cues + n_distractors - 1``), the last token is the query ``n_cues + n_distractors``; the answer
    at the query is the cue. Vocabulary size ``n_cues + n_distractors + 1``.
    """
    n, length = check_positive_int("n", n), check_positive_int("length", length)
    n_cues, n_distractors = check_positive_int("n_cues", n_cues), check_positive_int("n_distractors", n_distractors)
    if length < 2:
        raise ValueError(f"length must be at least 2 (cue and query), got {length}")
    cue = torch.randint(n_cues, (n,), generator=generator)
    tokens = torch.randint(n_cues, n_cues + n_distractors, (n, length), generator=generator)
    tokens[:, 0] = cue
    tokens[:, -1] = n_cues + n_distractors
    return tokens, cue


class CueRecallNet(nn.Module):
    """Token + learned position embeddings, ``depth`` `GTrXLBlock` s (``block_kwargs``), a final LayerNorm
    and a linear read-out of the last position: ``(B, L) long -> (B, n_cues)`` logits."""

    def __init__(self, vocab: int, n_cues: int, length: int, *, depth: int, d_model: int = 32, n_heads: int = 4,
                 **block_kwargs):
        super().__init__()
        self.vocab = check_positive_int("vocab", vocab)
        self.embed = nn.Embedding(vocab, check_positive_int("d_model", d_model))
        self.pos = nn.Embedding(check_positive_int("length", length), d_model)
        self.blocks = nn.ModuleList(GTrXLBlock(d_model, n_heads, **block_kwargs)
                                    for _ in range(check_positive_int("depth", depth)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, check_positive_int("n_cues", n_cues))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        check_token_ids("tokens", tokens, self.vocab, rank=2)
        if tokens.shape[1] > self.pos.num_embeddings:
            raise ValueError(f"tokens has length {tokens.shape[1]} > the {self.pos.num_embeddings} positions")
        h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h[:, -1]))


def train_cue_recall(block_kwargs: dict, *, depth: int = 12, steps: int = 200, lr: float = 5e-3, batch: int = 32,
                     seed: int = 0, n_cues: int = 4, n_distractors: int = 8, length: int = 12,
                     device: torch.device | str = "cpu") -> dict:
    """Train a `CueRecallNet` with Adam at a constant ``lr`` (no warm-up); returns ``{"accuracy", "losses"}``.

    Accuracy is measured on 512 fresh sequences (a fixed evaluation seed); chance is ``1 / n_cues``.
    """
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    vocab = n_cues + n_distractors + 1
    model = CueRecallNet(vocab, n_cues, length, depth=depth, **block_kwargs).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(check_positive_int("steps", steps)):
        tokens, cue = cue_recall_batch(batch, n_cues=n_cues, n_distractors=n_distractors, length=length, generator=gen)
        loss = F.cross_entropy(model(tokens.to(device)), cue.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tokens, cue = cue_recall_batch(512, n_cues=n_cues, n_distractors=n_distractors, length=length,
                                   generator=torch.Generator().manual_seed(10_000))
    with torch.no_grad():
        accuracy = float((model(tokens.to(device)).argmax(-1).cpu() == cue).float().mean())
    return {"accuracy": accuracy, "losses": losses}


# ----------------------------------------------------------------------------- Decision Transformer
def returns_to_go(rewards: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``R_t = sum_{t' >= t} gamma^(t' - t) r_t'`` over the last dim: ``(..., T) -> (..., T)``."""
    check_tensor("rewards", rewards, min_rank=1, floating=True)
    gamma = check_real("gamma", gamma, low=0.0, high=1.0, low_open=True)
    if gamma == 1.0:
        return rewards.flip(-1).cumsum(-1).flip(-1)
    out = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t] + gamma * running
        out[..., t] = running
    return out


def interleave_trajectory(R: torch.Tensor, s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Token sequence ``(R_1, s_1, a_1, R_2, s_2, a_2, ...)``: three ``(B, T, d)`` -> ``(B, 3T, d)``."""
    for name, t in (("R", R), ("s", s), ("a", a)):
        check_tensor(name, t, rank=3)
    if not R.shape == s.shape == a.shape:
        raise ValueError(f"R, s and a must share one (B, T, d) shape, got {tuple(R.shape)}, {tuple(s.shape)}, "
                         f"{tuple(a.shape)}")
    b, t, d = R.shape
    return torch.stack([R, s, a], dim=2).reshape(b, 3 * t, d)


def dt_action_token_index(T: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Positions of the ``s_t`` tokens, ``3t + 1`` (0-based), where action ``a_t`` is read out: ``(T,)``."""
    return torch.arange(check_positive_int("T", T), device=device) * 3 + 1


class DecisionTransformer(nn.Module):
    """Decision Transformer (Chen et al. 2021): a causal Transformer over ``(R, s, a)`` tokens.

    Each token is a linear embedding of its return-to-go, state or action plus a learned timestep
    embedding, then a LayerNorm; ``n_layers`` Pre-LN blocks (GELU) and a final LayerNorm; the action
    ``a_t`` is predicted from the ``s_t`` token. ``discrete=True``: actions are ids ``(B, T)`` and the
    output is logits ``(B, T, act_dim)``; ``discrete=False``: actions are ``(B, T, act_dim)`` and the
    output is ``tanh`` of a linear read-out.

    ``forward(rtg (B, T), states (B, T, state_dim), actions, timesteps (B, T) long)``. The action at the
    last step may be any value: causality hides ``a_t`` from the prediction of ``a_t``. Controls:
    ``use_returns=False`` zeroes the returns-to-go it reads (behaviour cloning with the same network),
    ``use_states=False`` zeroes the states (a policy blind to the state).
    """

    def __init__(self, state_dim: int, act_dim: int, *, d_model: int = 64, n_layers: int = 2, n_heads: int = 2,
                 max_timestep: int = 64, discrete: bool = True, use_returns: bool = True, use_states: bool = True):
        super().__init__()
        self.use_returns, self.use_states = check_bool("use_returns", use_returns), check_bool("use_states", use_states)
        self.state_dim, self.act_dim = check_positive_int("state_dim", state_dim), check_positive_int("act_dim", act_dim)
        self.max_timestep = check_positive_int("max_timestep", max_timestep)
        self.discrete = check_bool("discrete", discrete)
        self.embed_timestep = nn.Embedding(max_timestep, d_model)
        self.embed_return = nn.Linear(1, d_model)
        self.embed_state = nn.Linear(state_dim, d_model)
        self.embed_action = nn.Embedding(act_dim, d_model) if discrete else nn.Linear(act_dim, d_model)
        self.embed_ln = nn.LayerNorm(d_model)
        self.layers = nn.ModuleList(GTrXLBlock(d_model, n_heads, gate="residual", relu=False, activation="gelu")
                                    for _ in range(check_positive_int("n_layers", n_layers)))
        self.final_ln = nn.LayerNorm(d_model)
        self.predict_action = nn.Linear(d_model, act_dim)

    def _check(self, rtg, states, actions, timesteps) -> None:
        check_tensor("rtg", rtg, rank=2, floating=True)
        b, t = rtg.shape
        check_tensor("states", states, rank=3, floating=True)
        if states.shape != (b, t, self.state_dim):
            raise ValueError(f"states must be (B={b}, T={t}, state_dim={self.state_dim}), got {tuple(states.shape)}")
        want = (b, t) if self.discrete else (b, t, self.act_dim)
        check_tensor("actions", actions)
        if tuple(actions.shape) != want or actions.is_floating_point() == self.discrete:
            kind = "integer ids" if self.discrete else "floats"
            raise ValueError(f"actions must be {kind} of shape {want}, got {actions.dtype} {tuple(actions.shape)}")
        if self.discrete:
            check_token_ids("actions", actions, self.act_dim, vocab_name="act_dim")
        check_tensor("timesteps", timesteps)
        if timesteps.shape != (b, t) or timesteps.is_floating_point():
            raise ValueError(f"timesteps must be integer (B={b}, T={t}), got {timesteps.dtype} {tuple(timesteps.shape)}")
        if timesteps.numel() and (int(timesteps.min()) < 0 or int(timesteps.max()) >= self.max_timestep):
            raise ValueError(f"timesteps must lie in [0, {self.max_timestep}), got "
                             f"[{int(timesteps.min())}, {int(timesteps.max())}]")

    def forward(self, rtg: torch.Tensor, states: torch.Tensor, actions: torch.Tensor,
                timesteps: torch.Tensor) -> torch.Tensor:
        self._check(rtg, states, actions, timesteps)
        rtg = rtg if self.use_returns else torch.zeros_like(rtg)
        states = states if self.use_states else torch.zeros_like(states)
        time = self.embed_timestep(timesteps)
        tokens = interleave_trajectory(self.embed_return(rtg.unsqueeze(-1)) + time,
                                       self.embed_state(states) + time, self.embed_action(actions) + time)
        h = self.embed_ln(tokens)
        for layer in self.layers:
            h = layer(h)
        out = self.predict_action(self.final_ln(h)[:, dt_action_token_index(rtg.shape[1], device=h.device)])
        return out if self.discrete else torch.tanh(out)


# ----------------------------------------------------------------------------- a toy environment and offline data
class ChainMDP:
    """A chain of ``n_states`` cells with a lock in each; episodes start in cell 0 and last ``horizon`` steps.

    Every episode draws a fresh combination, one key bit per cell. In cell ``c`` the action equal to the
    key bit opens the lock: the agent moves to ``c + 1`` and earns 1; the other action keeps it in ``c``
    and earns 0 (so does any action in the last cell). The reward depends on the state: the observation
    ``(n_states + 2,)`` is the one-hot cell followed by the one-hot key bit of that cell. Without it an
    agent needs 1.5 steps per lock on average (alternating actions), so no fixed action sequence earns
    the maximum. Every return from 0 to ``max_return = min(horizon,
    n_states - 1)`` is reachable. Batched: cells ``(N,)`` long, keys ``(N, n_states)`` long.
    """

    n_actions = 2

    def __init__(self, n_states: int = 16, horizon: int = 12):
        self.n_states = check_positive_int("n_states", n_states)
        self.horizon = check_positive_int("horizon", horizon)
        self.max_return = min(self.horizon, self.n_states - 1)
        self.obs_dim = self.n_states + 2

    def reset(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cells (n,) all 0, keys (n, n_states))`` for ``n`` new episodes."""
        keys = torch.randint(2, (check_positive_int("n", n), self.n_states), generator=generator)
        return torch.zeros(n, dtype=torch.long), keys

    def observe(self, cells: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``(N, n_states + 2)``: one-hot cell, then one-hot key bit of that cell."""
        bit = keys.gather(1, cells[:, None])[:, 0]
        return torch.cat([F.one_hot(cells, self.n_states), F.one_hot(bit, 2)], dim=1).float()

    def step(self, cells: torch.Tensor, keys: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(next_cells (N,), rewards (N,))``."""
        if actions.shape != cells.shape or not ((actions == 0) | (actions == 1)).all():
            raise ValueError(f"actions must be 0 or 1, one per episode {tuple(cells.shape)}, got "
                             f"{tuple(actions.shape)} {actions.unique().tolist()}")
        opens = (actions == keys.gather(1, cells[:, None])[:, 0]) & (cells < self.n_states - 1)
        return cells + opens.long(), opens.float()


class GambleChain(ChainMDP):
    """A stochastic chain for the luck failure of return conditioning (section 10.8): ``horizon`` steps,
    two actions at each. Action 0 (*safe*) earns ``safe``; action 1 (*gamble*) earns 1 or 0 by a fair
    coin drawn at reset and never shown. The observation ``(horizon,)`` is the one-hot timestep, so
    nothing the agent sees predicts the coin. The same batched interface as `ChainMDP`: "cells" are
    the timesteps ``(N,)`` and "keys" the coins ``(N, horizon)``. With ``collect_offline_dataset(...,
    p_open=(0.5,))`` the logged actions are fair coin flips, independent of the hidden coins.
    """

    def __init__(self, horizon: int = 3, safe: float = 0.6):
        self.horizon = self.n_states = check_positive_int("horizon", horizon)
        self.safe = check_real("safe", safe, low=0.0, high=1.0)
        self.max_return = self.horizon
        self.obs_dim = self.horizon

    def observe(self, cells: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``(N, horizon)``: the one-hot timestep (the coins stay hidden)."""
        return F.one_hot(cells, self.horizon).float()

    def step(self, cells: torch.Tensor, keys: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(next timesteps (N,), rewards (N,))``."""
        if actions.shape != cells.shape or not ((actions == 0) | (actions == 1)).all():
            raise ValueError(f"actions must be 0 (safe) or 1 (gamble), one per episode {tuple(cells.shape)}, "
                             f"got {tuple(actions.shape)} {actions.unique().tolist()}")
        coin = keys.gather(1, cells[:, None])[:, 0].float()
        return cells + 1, torch.where(actions == 1, coin, torch.full_like(coin, self.safe))


@dataclass
class OfflineDataset:
    """Episodes of one `ChainMDP`: ``states (N, T, obs_dim)``, ``actions (N, T)`` long, ``rewards (N, T)``,
    ``rtg (N, T)`` (`returns_to_go` of the rewards), ``timesteps (N, T)``, ``returns (N,)``."""

    states: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    rtg: torch.Tensor
    timesteps: torch.Tensor
    returns: torch.Tensor


def collect_offline_dataset(env: ChainMDP, n_episodes: int, *, p_open=(0.1, 0.3, 0.5, 0.7, 0.9),
                            seed: int = 0) -> OfflineDataset:
    """Roll out scripted policies: episode ``i`` plays the key bit with probability ``p_open[i % len(p_open)]``.

    The scripted policies read the state; their returns are about ``p * horizon``, so the largest
    ``p_open`` sets how close the data come to ``env.max_return``.
    """
    check_instance("env", env, ChainMDP)
    n_episodes = check_positive_int("n_episodes", n_episodes)
    if not p_open or not all(0.0 <= p <= 1.0 for p in p_open):
        raise ValueError(f"p_open must be a non-empty sequence of probabilities, got {p_open!r}")
    gen = torch.Generator().manual_seed(seed)
    p = torch.tensor(p_open, dtype=torch.float)[torch.arange(n_episodes) % len(p_open)]
    cells, keys = env.reset(n_episodes, gen)
    states, actions, rewards = [], [], []
    for _ in range(env.horizon):
        states.append(env.observe(cells, keys))
        bit = keys.gather(1, cells[:, None])[:, 0]
        action = torch.where(torch.rand(n_episodes, generator=gen) < p, bit, 1 - bit)
        cells, reward = env.step(cells, keys, action)
        actions.append(action)
        rewards.append(reward)
    rewards = torch.stack(rewards, 1)
    timesteps = torch.arange(env.horizon).expand(n_episodes, env.horizon).clone()
    return OfflineDataset(torch.stack(states, 1), torch.stack(actions, 1), rewards, returns_to_go(rewards),
                          timesteps, rewards.sum(-1))


def best_episodes(data: OfflineDataset, fraction: float) -> OfflineDataset:
    """The ``ceil(fraction * N)`` episodes of ``data`` with the highest returns (ties broken by index),
    the training set of %BC (Chen et al. 2021: behaviour cloning on the best X% of the data)."""
    check_instance("data", data, OfflineDataset)
    fraction = check_real("fraction", fraction, low=0.0, low_open=True, high=1.0)
    n = len(data.returns)
    best_first = torch.argsort(data.returns, descending=True, stable=True)
    keep = torch.sort(best_first[:max(1, math.ceil(fraction * n))]).values
    return OfflineDataset(*(getattr(data, f.name)[keep] for f in fields(OfflineDataset)))


def train_decision_transformer(model: DecisionTransformer, data: OfflineDataset, *, steps: int = 300,
                               batch: int = 64, lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Fit ``model`` to the dataset's actions (cross-entropy; MSE for continuous actions); returns the losses."""
    check_instance("model", model, DecisionTransformer)
    check_instance("data", data, OfflineDataset)
    lr = check_real("lr", lr, low=0.0, low_open=True)
    steps, batch = check_positive_int("steps", steps), check_positive_int("batch", batch)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    device = next(model.parameters()).device
    losses = []
    model.train()
    for _ in progress_range(steps, "decision transformer"):
        idx = torch.randint(len(data.returns), (batch,), generator=gen)
        rtg, states, actions, ts = (x[idx].to(device) for x in (data.rtg, data.states, data.actions, data.timesteps))
        out = model(rtg, states, actions, ts)
        if model.discrete:
            loss = F.cross_entropy(out.reshape(-1, model.act_dim), actions.reshape(-1))
        else:
            loss = F.mse_loss(out, actions)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def rollout(model: DecisionTransformer, env: ChainMDP, target_return, *, episodes: int = 1,
            seed: int = 0, greedy: bool = True) -> torch.Tensor:
    """Play episodes conditioned on a target return: the achieved returns ``(N,)``.

    ``target_return`` is one number (played in ``episodes`` episodes) or one target per episode, ``(N,)``.
    At step ``t`` the model sees each episode so far: returns-to-go ``target - rewards so far``, states,
    actions (a placeholder for ``a_t``) and timesteps; it plays the argmax action read at ``s_t`` or,
    with ``greedy=False``, samples it from the softmax of the logits. The combinations (and samples)
    are drawn with a CPU generator seeded with ``seed``.
    """
    check_instance("model", model, DecisionTransformer)
    check_instance("env", env, ChainMDP)
    targets = torch.as_tensor(target_return, dtype=torch.float).cpu()
    if targets.dim() == 0:
        targets = targets.expand(check_positive_int("episodes", episodes))
    check_tensor("target_return", targets, rank=1)
    if not model.discrete:
        raise ValueError("rollout drives ChainMDP, which has discrete actions: use a discrete model")
    device = next(model.parameters()).device
    check_bool("greedy", greedy)
    n = len(targets)
    gen = torch.Generator().manual_seed(seed)
    cells, keys = env.reset(n, gen)
    achieved = torch.zeros(n)
    rtg, states, actions = [], [], []
    for t in range(env.horizon):
        rtg.append(targets - achieved)
        states.append(env.observe(cells, keys))
        actions.append(torch.zeros(n, dtype=torch.long))        # placeholder for a_t, never seen by its prediction
        logits = model(torch.stack(rtg, 1).to(device), torch.stack(states, 1).to(device),
                       torch.stack(actions, 1).to(device), torch.arange(t + 1, device=device).expand(n, t + 1))
        last = logits[:, -1].float().cpu()
        actions[-1] = last.argmax(-1) if greedy else torch.multinomial(last.softmax(-1), 1, generator=gen)[:, 0]
        cells, reward = env.step(cells, keys, actions[-1])
        achieved = achieved + reward
    return achieved


# ----------------------------------------------------------------------------- a memory task and policy gradients (section 10.7)
class TMaze(gym.Env):
    """The passive T-maze, a memory task with partial observations (a POMDP), as a `gymnasium.Env`.

    An episode lasts ``length`` steps. Step 0 shows the cue (left or right, drawn at reset); steps
    ``1 .. length - 2`` show the same corridor; step ``length - 1`` shows the junction, where action 0
    turns left and action 1 right: reward ``+1`` if the turn matches the cue, ``-1`` if not, and the
    episode ends. Actions before the junction are ignored (reward 0): the only decision is the last,
    and it needs the first observation, ``length - 1`` steps back. Observations are float32 ``(4,)``:
    ``[cue left, cue right, corridor, junction]``.
    """

    metadata = {"render_modes": []}

    def __init__(self, length: int = 8):
        self.length = check_positive_int("length", length)
        if self.length < 2:
            raise ValueError(f"length must be at least 2 (cue and junction), got {length}")
        self.observation_space = gym.spaces.Box(0.0, 1.0, (4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cue, self.t = 0, 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(4, dtype=np.float32)
        obs[self.cue if self.t == 0 else (3 if self.t == self.length - 1 else 2)] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return self._obs(), {"cue": self.cue}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0 (left) or 1 (right), got {action!r}")
        if self.t == self.length - 1:
            reward = 1.0 if int(action) == self.cue else -1.0
            return self._obs(), reward, True, False, {"cue": self.cue}
        self.t += 1
        return self._obs(), 0.0, False, False, {"cue": self.cue}


class LSTMPolicy(nn.Module):
    """A recurrent actor-critic: ``obs (B, T, obs_dim) -> (logits (B, T, n_actions), values (B, T))``.

    A linear embedding, one LSTM layer of width ``hidden`` (Hochreiter & Schmidhuber 1997) and one linear
    head for the action logits and the baseline ``V(o_<=t)``.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 32):
        super().__init__()
        self.n_actions = check_positive_int("n_actions", n_actions)
        self.embed = nn.Linear(check_positive_int("obs_dim", obs_dim), check_positive_int("hidden", hidden))
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_actions + 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_tensor("obs", obs, rank=3, floating=True)
        if obs.shape[-1] != self.embed.in_features:
            raise ValueError(f"obs must be (B, T, obs_dim={self.embed.in_features}), got shape {tuple(obs.shape)}")
        out = self.head(self.lstm(self.embed(obs))[0])
        return out[..., :self.n_actions], out[..., self.n_actions]


class TransformerPolicy(nn.Module):
    """A causal Transformer actor-critic over the episode so far: ``obs (B, T, obs_dim) -> (logits, values)``.

    A linear embedding, ``n_layers`` `GTrXLBlock` s built with ``block_kwargs`` (GTrXL: ``gate="gru"``; the
    ungated canonical stack: ``gate="residual", reorder=False``), a final LayerNorm and one linear head.
    No position encoding: the blocks attend by content, and the junction announces itself.
    """

    def __init__(self, obs_dim: int, n_actions: int, *, d_model: int = 32, n_layers: int = 2, n_heads: int = 4,
                 **block_kwargs):
        super().__init__()
        self.n_actions = check_positive_int("n_actions", n_actions)
        self.embed = nn.Linear(check_positive_int("obs_dim", obs_dim), d_model)
        self.blocks = nn.ModuleList(GTrXLBlock(d_model, n_heads, **block_kwargs)
                                    for _ in range(check_positive_int("n_layers", n_layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_actions + 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_tensor("obs", obs, rank=3, floating=True)
        if obs.shape[-1] != self.embed.in_features:
            raise ValueError(f"obs must be (B, T, obs_dim={self.embed.in_features}), got shape {tuple(obs.shape)}")
        h = self.embed(obs)
        for block in self.blocks:
            h = block(h)
        out = self.head(self.norm(h))
        return out[..., :self.n_actions], out[..., self.n_actions]


def count_parameters(model: nn.Module) -> int:
    """The number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@dataclass
class Episodes:
    """``B`` episodes of one length ``T``: ``obs (B, T, obs_dim)``, ``actions (B, T)`` long, ``rewards (B, T)``."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor


@torch.no_grad()
def play_episodes(policy: nn.Module, envs, *, seed: int, greedy: bool = False) -> Episodes:
    """Play one episode in each environment of ``envs`` (all of one fixed length), acting step by step.

    At step ``t`` the policy reads the observations ``o_0 .. o_t`` of its episode and acts: it samples
    from ``softmax(logits)`` (a CPU generator seeded with ``seed``; the environments are reset with
    ``seed, seed + 1, ...``) or takes the argmax when ``greedy``. Raises if the episodes end at
    different steps.
    """
    check_instance("policy", policy, nn.Module)
    check_bool("greedy", greedy)
    envs = list(envs)
    if not envs:
        raise ValueError("envs must hold at least one environment")
    device = next(policy.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    seen = [torch.from_numpy(np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]))]
    actions, rewards = [], []
    while True:
        logits = policy(torch.stack(seen, 1).to(device))[0][:, -1].float().cpu()
        act = logits.argmax(-1) if greedy else torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]
        steps = [env.step(int(a)) for env, a in zip(envs, act)]
        done = [terminated or truncated for _, _, terminated, truncated, _ in steps]
        actions.append(act)
        rewards.append(torch.tensor([float(r) for _, r, _, _, _ in steps]))
        if all(done):
            break
        if any(done):
            raise ValueError("the episodes must all end at the same step (fixed-length tasks only)")
        seen.append(torch.from_numpy(np.stack([ob for ob, *_ in steps])))
    return Episodes(torch.stack(seen, 1), torch.stack(actions, 1), torch.stack(rewards, 1))


def reinforce_loss(logits: torch.Tensor, values: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, *,
                   gamma: float = 1.0, value_coef: float = 0.5, entropy_coef: float = 0.01) -> torch.Tensor:
    """REINFORCE with a learned baseline (Williams 1992), averaged over ``(B, T)``.

    ``logits (B, T, A)``, ``values (B, T)``, ``actions (B, T)`` long, ``rewards (B, T)``. With the
    return-to-go ``G_t`` and the advantage ``A_t = G_t - V(o_<=t)`` (no gradient through it)::

        loss = -mean(log pi(a_t | o_<=t) * A_t) + value_coef * mean((G_t - V_t)^2) - entropy_coef * mean(H_t)

    The baseline lowers the variance of the gradient estimate without biasing it, because
    ``E[grad log pi(a_t)] = 0`` for anything that does not depend on ``a_t``.
    """
    check_tensor("logits", logits, rank=3, floating=True)
    value_coef = check_real("value_coef", value_coef, low=0.0)
    entropy_coef = check_real("entropy_coef", entropy_coef, low=0.0)
    b, t, _ = logits.shape
    for name, x in (("values", values), ("actions", actions), ("rewards", rewards)):
        check_tensor(name, x, rank=2)
        if x.shape != (b, t):
            raise ValueError(f"{name} must be (B={b}, T={t}) like logits, got {tuple(x.shape)}")
    check_token_ids("actions", actions, logits.shape[-1], vocab_name="A (logits.shape[-1])")
    logp = logits.log_softmax(-1)
    g = returns_to_go(rewards.to(logp.dtype), gamma)
    chosen = logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return (-(chosen * (g - values).detach()).mean() + value_coef * (g - values).pow(2).mean()
            - entropy_coef * entropy.mean())


def train_reinforce(policy: nn.Module, make_env, *, updates: int = 100, batch: int = 32, lr: float = 3e-3,
                    seed: int = 0, eval_every: int = 10, eval_episodes: int = 64) -> dict:
    """Train ``policy`` with `reinforce_loss` and Adam on ``batch`` fresh episodes per update.

    ``make_env()`` builds one environment. Every ``eval_every`` updates (and at the end) the greedy
    policy plays ``eval_episodes`` held-out episodes. Returns ``{"mean_return": [per update],
    "eval_updates": [...], "eval_return": [...]}``.
    """
    check_instance("policy", policy, nn.Module)
    if not callable(make_env):
        raise TypeError(f"make_env must be a callable that builds one environment, got {type(make_env).__name__}")
    updates, batch = check_positive_int("updates", updates), check_positive_int("batch", batch)
    lr = check_real("lr", lr, low=0.0, low_open=True)
    envs = [make_env() for _ in range(batch)]
    eval_envs = [make_env() for _ in range(check_positive_int("eval_episodes", eval_episodes))]
    device = next(policy.parameters()).device
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    out = {"mean_return": [], "eval_updates": [], "eval_return": []}
    for u in range(updates + 1):
        if u % check_positive_int("eval_every", eval_every) == 0 or u == updates:
            test = play_episodes(policy, eval_envs, seed=10**6 + seed * 10**4, greedy=True)
            out["eval_updates"].append(u)
            out["eval_return"].append(float(test.rewards.sum(1).mean()))
        if u == updates:
            break
        ep = play_episodes(policy, envs, seed=seed * 10**5 + u * batch)
        logits, values = policy(ep.obs.to(device))
        loss = reinforce_loss(logits, values, ep.actions.to(device), ep.rewards.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        out["mean_return"].append(float(ep.rewards.sum(1).mean()))
    return out


def match_parameters(build, sizes, target: int):
    """The size in ``sizes`` whose model ``build(size)`` has the parameter count closest to ``target``.

    ``sizes`` is sorted and the count grows with the size, so a bisection builds only a few models.
    Used to give policies of different kinds the same budget (an LSTM's width, a feed-forward width).
    """
    if not callable(build):
        raise TypeError(f"build must be a callable size -> model, got {type(build).__name__}")
    target = check_positive_int("target", target)
    sizes = sorted(sizes)
    if not sizes:
        raise ValueError("sizes must hold at least one candidate")
    lo, hi = 0, len(sizes) - 1
    while lo < hi:                                           # first size with count >= target
        mid = (lo + hi) // 2
        if count_parameters(build(sizes[mid])) < target:
            lo = mid + 1
        else:
            hi = mid
    near = sizes[max(lo - 1, 0):lo + 1]
    return min(near, key=lambda size: abs(count_parameters(build(size)) - int(target)))
