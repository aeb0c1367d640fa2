"""Deliberately wrong answers to the Chapter 10 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests (every
requirement a question states is in a public check) and all its hidden tests (zero points),
with messages of which at least one contains ``keyword``. ``TAMPER_BASE`` names the variant
the tampering checks use (wrong values of the right shape, what a broken comparison would let
through). The tests add two generic variants to every part themselves (an exception and an
endless loop), so they are not listed here.
"""
import torch

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1a: gru_gate
def _gate(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g, *, bias_sign=-1.0, swap=False, reset_after=False,
          columns=False):
    if columns:                                                # W y with W as given: the column convention
        W_r, W_z, W_g, U_r, U_z, U_g = (m.T for m in (W_r, W_z, W_g, U_r, U_z, U_g))
    r = torch.sigmoid(y @ W_r + x @ U_r)
    z = torch.sigmoid(y @ W_z + x @ U_z + bias_sign * b_g)
    h = torch.tanh(y @ W_g + (r * (x @ U_g) if reset_after else (r * x) @ U_g))
    return z * x + (1 - z) * h if swap else (1 - z) * x + z * h


def gate_adds_bias(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g):
    return _gate(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g, bias_sign=1.0)       # + b_g opens the gate


def gate_swaps_weights(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g):
    return _gate(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g, swap=True)           # z x + (1 - z) h


def gate_resets_after_U(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g):
    return _gate(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g, reset_after=True)    # r * (x U_g): the cuDNN GRU variant


def gate_column_convention(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g):
    return _gate(x, y, W_r, W_z, W_g, U_r, U_z, U_g, b_g, columns=True)


# ----------------------------------------------------------------------------- q2a: reordered_block
def _block(x, attn, ff, norm1, norm2, relu=False, *, post_ln=False, norm_stream=False, causal=True,
           use_relu=True, relu_after_sum=False, swap_norms=False):
    if swap_norms:
        norm1, norm2 = norm2, norm1
    if post_ln:
        x = norm1(x + attn(x, causal=causal))
        return norm2(x + ff(x))

    def merge(stream, y):
        if relu and relu_after_sum:
            return torch.relu(stream + y)
        return stream + (torch.relu(y) if relu and use_relu else y)

    h = norm1(x)
    x = merge(h if norm_stream else x, attn(h, causal=causal))
    h = norm2(x)
    return merge(h if norm_stream else x, ff(h))


def block_post_ln(x, attn, ff, norm1, norm2, relu=False):
    return _block(x, attn, ff, norm1, norm2, relu, post_ln=True)               # the original layer


def block_normalises_stream(x, attn, ff, norm1, norm2, relu=False):
    return _block(x, attn, ff, norm1, norm2, relu, norm_stream=True)           # LN(x) + y: no identity path


def block_not_causal(x, attn, ff, norm1, norm2, relu=False):
    return _block(x, attn, ff, norm1, norm2, relu, causal=False)               # sees the future


def block_ignores_relu(x, attn, ff, norm1, norm2, relu=False):
    return _block(x, attn, ff, norm1, norm2, relu, use_relu=False)


def block_relu_after_sum(x, attn, ff, norm1, norm2, relu=False):
    return _block(x, attn, ff, norm1, norm2, relu, relu_after_sum=True)        # relu(x + y) clips the stream


def block_swaps_norms(x, attn, ff, norm1, norm2, relu=False):
    return _block(x, attn, ff, norm1, norm2, relu, swap_norms=True)


# ----------------------------------------------------------------------------- q2b: gated_block
def _gated(x, attn, ff, norm1, norm2, gate1, gate2, *, swap_args=False, relu=True, norm_stream=False,
           second_gate=True):
    act = torch.relu if relu else (lambda t: t)
    gate2 = gate2 if second_gate else gate1

    def merge(gate, stream, h, y):
        stream = h if norm_stream else stream
        return gate(y, stream) if swap_args else gate(stream, y)

    h = norm1(x)
    x = merge(gate1, x, h, act(attn(h, causal=True)))
    h = norm2(x)
    return merge(gate2, x, h, act(ff(h)))


def gated_swaps_arguments(x, attn, ff, norm1, norm2, gate1, gate2):
    return _gated(x, attn, ff, norm1, norm2, gate1, gate2, swap_args=True)     # gate(y, x)


def gated_no_relu(x, attn, ff, norm1, norm2, gate1, gate2):
    return _gated(x, attn, ff, norm1, norm2, gate1, gate2, relu=False)


def gated_normalised_stream(x, attn, ff, norm1, norm2, gate1, gate2):
    return _gated(x, attn, ff, norm1, norm2, gate1, gate2, norm_stream=True)   # gate(LN(x), y)


def gated_one_gate(x, attn, ff, norm1, norm2, gate1, gate2):
    return _gated(x, attn, ff, norm1, norm2, gate1, gate2, second_gate=False)  # gate1 after both sub-layers


def gated_residual(x, attn, ff, norm1, norm2, gate1, gate2):
    x = x + torch.relu(attn(norm1(x), causal=True))                            # ignores the gates
    return x + torch.relu(ff(norm2(x)))


# ----------------------------------------------------------------------------- q3a: rtg_from_rewards
def _rtg(rewards, gamma=1.0, *, start=0, absolute=False, use_gamma=True):
    T = rewards.shape[-1]
    g = gamma if use_gamma else 1.0
    return torch.stack([sum(g ** (u if absolute else u - t) * rewards[..., u] for u in range(t + start, T))
                        + torch.zeros_like(rewards[..., 0]) for t in range(T)], dim=-1)


def rtg_excludes_now(rewards, gamma=1.0):
    return _rtg(rewards, gamma, start=1)                                       # sum over t' > t


def rtg_forward_sum(rewards, gamma=1.0):
    return rewards.cumsum(-1)                                                  # the reward earned so far


def rtg_absolute_discount(rewards, gamma=1.0):
    return _rtg(rewards, gamma, absolute=True)                                 # gamma^t', not gamma^(t' - t)


def rtg_no_discount(rewards, gamma=1.0):
    return _rtg(rewards, gamma, use_gamma=False)


def rtg_first_dim(rewards, gamma=1.0):
    return _rtg(rewards.movedim(0, -1), gamma).movedim(-1, 0)                  # time on dim 0


# ----------------------------------------------------------------------------- q3b: interleave, action_token_index
def interleave_concatenated(R, s, a):
    return torch.cat([R, s, a], dim=1)                                         # (R_0..R_T, s_0.., a_0..)


def interleave_mixes_features(R, s, a):
    b, t, d = R.shape
    return torch.stack([R, s, a], dim=-1).reshape(b, 3 * t, d)                 # features of three tokens in one row


def interleave_state_first(R, s, a):
    b, t, d = R.shape
    return torch.stack([s, R, a], dim=2).reshape(b, 3 * t, d)                  # (s, R, a)


def index_return_tokens(T):
    return 3 * torch.arange(T)                                                 # reads R_t


def index_action_tokens(T):
    return 3 * torch.arange(T) + 2                                             # reads a_t: the answer leaks


def index_float(T):
    return 3.0 * torch.arange(T) + 1                                           # floats cannot index


# ----------------------------------------------------------------------------- q3c: conditioning_returns
def conditioning_subtracts_now(target, rewards):
    return target - rewards.cumsum(-1)                                         # subtracts r_t before it is earned


def conditioning_ignores_target(target, rewards):
    return rewards.flip(-1).cumsum(-1).flip(-1)                                # the hindsight return-to-go


def conditioning_adds_rewards(target, rewards):
    return target + rewards.cumsum(-1) - rewards


def conditioning_first_dim(target, rewards):
    return target - (rewards.cumsum(0) - rewards)                              # time on dim 0


# ----------------------------------------------------------------------------- q4a: reinforce_loss
def _pg(logits, values, actions, rewards, *, shift=False, whole=False, detach=True, sign=1.0, baseline=True):
    g = rewards.flip(-1).cumsum(-1).flip(-1)
    if shift:                                                  # G_{t+1}: the reward of step t left out
        g = g - rewards
    if whole:                                                  # the episode's return at every step
        g = g[:, :1].expand_as(g)
    logp = logits.log_softmax(-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    advantage = g - values
    weight = (advantage.detach() if detach else advantage) if baseline else g
    return -sign * (logp * weight).mean() + 0.5 * advantage.pow(2).mean()


def pg_excludes_now(logits, values, actions, rewards):
    return _pg(logits, values, actions, rewards, shift=True)


def pg_whole_return(logits, values, actions, rewards):
    return _pg(logits, values, actions, rewards, whole=True)


def pg_no_detach(logits, values, actions, rewards):
    return _pg(logits, values, actions, rewards, detach=False)   # the policy term also moves the baseline


def pg_ascends(logits, values, actions, rewards):
    return _pg(logits, values, actions, rewards, sign=-1.0)


def pg_no_baseline(logits, values, actions, rewards):
    return _pg(logits, values, actions, rewards, baseline=False)


# ----------------------------------------------------------------------------- q4b: return_conditioned_policy
def _conditioned(actions, rewards, target, n_actions, *, first_step=False, at_least=False, whole=False,
                 counts_only=False):
    rtg = rewards.flip(-1).cumsum(-1).flip(-1)
    if whole:                                                  # the episode's return at every step
        rtg = rtg[:, :1].expand_as(rtg)
    hit = rtg >= target if at_least else rtg == target
    if first_step:
        hit = hit[:, :1]
        actions = actions[:, :1]
    counts = torch.bincount(actions[hit], minlength=n_actions).double()
    return counts if counts_only else counts / counts.sum()


def conditioned_first_step(actions, rewards, target, n_actions):
    return _conditioned(actions, rewards, target, n_actions, first_step=True)


def conditioned_at_least(actions, rewards, target, n_actions):
    return _conditioned(actions, rewards, target, n_actions, at_least=True)


def conditioned_on_episode_return(actions, rewards, target, n_actions):
    return _conditioned(actions, rewards, target, n_actions, whole=True)


def conditioned_counts(actions, rewards, target, n_actions):
    return _conditioned(actions, rewards, target, n_actions, counts_only=True)


WRONG_ANSWERS = {
    "q1a": {
        "off_by_one": ({"gru_gate": gate_adds_bias}, "max abs error"),
        "swapped_weights": ({"gru_gate": gate_swaps_weights}, "max abs error"),
        "reset_after_U": ({"gru_gate": gate_resets_after_U}, "max abs error"),
        "column_convention": ({"gru_gate": gate_column_convention}, "max abs error"),
    },
    "q2a": {
        "off_by_one": ({"reordered_block": block_post_ln}, "Post-LN"),
        "normalises_stream": ({"reordered_block": block_normalises_stream}, "max abs error"),
        "not_causal": ({"reordered_block": block_not_causal}, "not causal"),
        "ignores_relu": ({"reordered_block": block_ignores_relu}, "max abs error"),
        "relu_after_sum": ({"reordered_block": block_relu_after_sum}, "max abs error"),
        "swaps_norms": ({"reordered_block": block_swaps_norms}, "max abs error"),
    },
    "q2b": {
        "off_by_one": ({"gated_block": gated_swaps_arguments}, "arguments are swapped"),
        "no_relu": ({"gated_block": gated_no_relu}, "max abs error"),
        "normalised_stream": ({"gated_block": gated_normalised_stream}, "max abs error"),
        "one_gate": ({"gated_block": gated_one_gate}, "max abs error"),
        "residual": ({"gated_block": gated_residual}, "max abs error"),
    },
    "q3a": {
        "off_by_one": ({"rtg_from_rewards": rtg_excludes_now}, "max abs error"),
        "forward_sum": ({"rtg_from_rewards": rtg_forward_sum}, "max abs error"),
        "absolute_discount": ({"rtg_from_rewards": rtg_absolute_discount}, "max abs error"),
        "no_discount": ({"rtg_from_rewards": rtg_no_discount}, "max abs error"),
        "first_dim": ({"rtg_from_rewards": rtg_first_dim}, "max abs error"),
    },
    "q3b": {
        "off_by_one": ({"action_token_index": index_return_tokens}, "entries differ"),
        "reads_action": ({"action_token_index": index_action_tokens}, "entries differ"),
        "float_index": ({"action_token_index": index_float}, "IndexError"),
        "concatenated": ({"interleave": interleave_concatenated}, "max abs error"),
        "mixes_features": ({"interleave": interleave_mixes_features}, "max abs error"),
        "state_first": ({"interleave": interleave_state_first}, "max abs error"),
    },
    "q3c": {
        "off_by_one": ({"conditioning_returns": conditioning_subtracts_now}, "max abs error"),
        "ignores_target": ({"conditioning_returns": conditioning_ignores_target}, "max abs error"),
        "adds_rewards": ({"conditioning_returns": conditioning_adds_rewards}, "max abs error"),
        "first_dim": ({"conditioning_returns": conditioning_first_dim}, "max abs error"),
    },
    "q4a": {
        "off_by_one": ({"reinforce_loss": pg_excludes_now}, "max abs error"),
        "whole_return": ({"reinforce_loss": pg_whole_return}, "max abs error"),
        "no_detach": ({"reinforce_loss": pg_no_detach}, "max abs error"),
        "ascends": ({"reinforce_loss": pg_ascends}, "max abs error"),
        "no_baseline": ({"reinforce_loss": pg_no_baseline}, "without subtracting the baseline"),
    },
    "q4b": {
        "off_by_one": ({"return_conditioned_policy": conditioned_first_step}, "max abs error"),
        "at_least": ({"return_conditioned_policy": conditioned_at_least}, "max abs error"),
        "episode_return": ({"return_conditioned_policy": conditioned_on_episode_return}, "max abs error"),
        "counts": ({"return_conditioned_policy": conditioned_counts}, "max abs error"),
    },
}
