"""Deliberately wrong answers to the Chapter 6 exercises, used by tests/test_exercises.py.

``WRONG_ANSWERS[part][variant] = (replacements, keyword)``: ``replacements`` maps the names a
part's answer defines to wrong implementations. Each must fail the part's **public** tests and
all its hidden tests (zero points), with messages of which at least one contains ``keyword``.
``TAMPER_BASE`` names the variant the tampering checks use. The tests add two generic variants
to every part themselves (an exception and an endless loop), so they are not listed here.
"""
import torch


# ----------------------------------------------------------------------------- q1a: halting_weights
def _halting(p, threshold, *, strict=False, remainder=True, ponder_remainder=True):
    steps = torch.arange(p.shape[-1])
    cum = p.cumsum(-1)
    reached = cum > threshold if strict else cum >= threshold
    reached[..., -1] = True
    halt = reached.to(torch.uint8).argmax(-1, keepdim=True)
    before = steps < halt
    rest = 1.0 - (p * before).sum(-1, keepdim=True)
    last = rest if remainder else p.gather(-1, halt)
    weights = torch.where(before, p, torch.zeros_like(p)) + (steps == halt) * last
    return weights, (halt + 1 + (rest if ponder_remainder else 0.0)).squeeze(-1).to(p.dtype)


def halting_strict(p, threshold):
    return _halting(p, threshold, strict=True)                    # reaching the threshold exactly does not halt


def halting_no_remainder(p, threshold):
    return _halting(p, threshold, remainder=False)                # p_N instead of R at the halting step


def halting_ponder_steps(p, threshold):
    return _halting(p, threshold, ponder_remainder=False)         # ponder = N, without R


def halting_wrong_shape(p, threshold):
    weights, ponder = _halting(p, threshold)
    return weights[..., :-1], ponder


# ----------------------------------------------------------------------------- q1b: act
def _act(step_fn, state, threshold, max_steps, *, freeze=True, force_last=True, remainder=True, stop_early=True):
    tokens = state.shape[:-1]
    cum, ponder, n_updates = state.new_zeros(tokens), state.new_zeros(tokens), state.new_zeros(tokens)
    output = torch.zeros_like(state)
    running = torch.ones(tokens, dtype=torch.bool)
    for n in range(max_steps):
        new_state, p = step_fn(state, n)
        halt = running & ((cum + p >= threshold) | ((n == max_steps - 1) & force_last))
        weight = torch.where(halt, 1.0 - cum, torch.where(running, p, torch.zeros_like(p)))
        output = output + weight.unsqueeze(-1) * new_state
        ponder = torch.where(halt, n + 1 + (1.0 - cum if remainder else 0.0), ponder)
        cum = cum + torch.where(running & ~halt, p, torch.zeros_like(p))
        n_updates = n_updates + running.to(state.dtype)
        state = torch.where(running.unsqueeze(-1), new_state, state) if freeze else new_state
        running = running & ~halt
        if stop_early and not bool(running.any()):
            break
    if not force_last:
        ponder = torch.where(running, n_updates + 1.0 - cum, ponder)
    return output, ponder, n_updates


def act_no_freeze(step_fn, state, threshold, max_steps):
    return _act(step_fn, state, threshold, max_steps, freeze=False)     # halted tokens keep changing


def act_no_remainder(step_fn, state, threshold, max_steps):
    return _act(step_fn, state, threshold, max_steps, remainder=False)  # ponder = N


def act_last_step_not_forced(step_fn, state, threshold, max_steps):
    return _act(step_fn, state, threshold, max_steps, force_last=False) # weights < 1 at max_steps


def act_runs_every_step(step_fn, state, threshold, max_steps):
    return _act(step_fn, state, threshold, max_steps, stop_early=False)


# ----------------------------------------------------------------------------- q2a: span_mask
def mask_ramp_before_span(dist, z, ramp):
    return ((z - dist) / ramp).clamp(0.0, 1.0)                   # reaches 0 at z, not z + R


def mask_hard(dist, z, ramp):
    return (dist <= z).to(dist.dtype)                            # no gradient for z


def mask_no_clamp(dist, z, ramp):
    return (ramp + z - dist) / ramp


# ----------------------------------------------------------------------------- q2b: span_weights
def _weights(scores, z, ramp, *, causal=True, renormalise=True, shift=True, offset=0):
    length = scores.shape[-1]
    pos = torch.arange(length)
    dist = (pos[:, None] - pos[None, :] + offset).to(scores.dtype)
    allowed = (pos[:, None] >= pos[None, :]) if causal else torch.ones(length, length, dtype=torch.bool)
    soft = ((ramp + z - dist) / ramp).clamp(0.0, 1.0) * allowed
    masked = scores.masked_fill(~allowed, float("-inf"))
    e = torch.exp(masked - (masked.amax(-1, keepdim=True) if shift else 0.0))
    if not renormalise:
        return e / e.sum(-1, keepdim=True) * soft
    e = e * soft
    return e / e.sum(-1, keepdim=True)


def weights_off_by_one(scores, z, ramp):
    return _weights(scores, z, ramp, offset=1)                   # distance i - j + 1


def weights_not_causal(scores, z, ramp):
    return _weights(scores, z, ramp, causal=False)


def weights_not_renormalised(scores, z, ramp):
    return _weights(scores, z, ramp, renormalise=False)


def weights_overflow(scores, z, ramp):
    return _weights(scores, z, ramp, shift=False)                # exp of large scores: inf / inf


# ----------------------------------------------------------------------------- q3a: geometric_exit
def geometric_uses_last_chi(chi):
    survive = torch.cumprod(torch.cat([torch.ones_like(chi[..., :1]), 1.0 - chi[..., :-1]], -1), -1)
    return survive * chi                                         # the last exit gets chi_{N-1} * ..., not the rest


def geometric_off_by_one(chi):
    q = torch.cumprod(1.0 - chi, -1) * chi                       # prod over m <= n instead of m < n
    q[..., -1] = 1.0 - q[..., :-1].sum(-1)
    return q


def geometric_wrong_shape(chi):
    survive = torch.cumprod(torch.cat([torch.ones_like(chi[..., :1]), 1.0 - chi[..., :-1]], -1), -1)
    return (survive * chi)[..., :-1]


# ----------------------------------------------------------------------------- q4a: softmax_margin, saturation
def margin(logits):
    top2 = torch.softmax(logits, -1).topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def cosine(h_prev, h_next):
    return (h_prev * h_next).sum(-1) / (h_prev.norm(dim=-1) * h_next.norm(dim=-1))


def margin_top1_only(logits):
    return torch.softmax(logits, -1).amax(-1)                   # the top probability, not the margin


def margin_of_logits(logits):
    top2 = logits.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def saturation_dot(h_prev, h_next):
    return (h_prev * h_next).sum(-1)                             # not normalised


# ----------------------------------------------------------------------------- q4b: exit_index
def exit_at_or_above(conf, threshold):
    above = conf >= threshold                                    # a tie exits
    above[..., -1] = True
    return above.to(torch.uint8).argmax(-1)


def exit_none_is_first(conf, threshold):
    return (conf > threshold).to(torch.uint8).argmax(-1)         # no exit above: 0 instead of N - 1


def exit_one_based(conf, threshold):
    above = conf > threshold
    above[..., -1] = True
    return above.to(torch.uint8).argmax(-1) + 1


# ----------------------------------------------------------------------------- q5a: universal_encoder
def _universal(x, layer, n_steps, *, first_step=1, step_signal=True, every_step=True, tied=True, extra=0):
    import copy

    from xfam_lib.positional import sinusoidal_encoding

    length, d = x.shape[1], x.shape[2]
    positions = sinusoidal_encoding(length, d, dtype=x.dtype)
    steps = sinusoidal_encoding(n_steps + 2, d, dtype=x.dtype)
    for n, t in enumerate(range(first_step, first_step + n_steps + extra)):
        signal = positions + (steps[t] if step_signal else 0.0)
        x = (layer if tied else copy.deepcopy(layer))(x + signal if every_step or n == 0 else x)
    return x


def ut_steps_from_zero(x, layer, n_steps):
    return _universal(x, layer, n_steps, first_step=0)             # adds PE(0) .. PE(T - 1)


def ut_positions_only(x, layer, n_steps):
    return _universal(x, layer, n_steps, step_signal=False)        # no timestep signal


def ut_signal_once(x, layer, n_steps):
    return _universal(x, layer, n_steps, every_step=False)         # adds the coordinates before step 1 only


def ut_copy_per_step(x, layer, n_steps):
    return _universal(x, layer, n_steps, tied=False)               # right outputs, but the layer is not shared


def ut_one_step_too_many(x, layer, n_steps):
    return _universal(x, layer, n_steps, extra=1)                  # T + 1 applications


TAMPER_BASE = "off_by_one"

WRONG_ANSWERS = {
    "q1a": {
        "off_by_one": ({"halting_weights": halting_strict}, "max abs error"),
        "no_remainder": ({"halting_weights": halting_no_remainder}, "max abs error"),
        "ponder_steps_only": ({"halting_weights": halting_ponder_steps}, "ponder"),
        "wrong_shape": ({"halting_weights": halting_wrong_shape}, "shape"),
    },
    "q1b": {
        "off_by_one": ({"act": act_no_remainder}, "ponder"),
        "no_freeze": ({"act": act_no_freeze}, "max abs error"),
        "last_step_not_forced": ({"act": act_last_step_not_forced}, "max abs error"),
        "runs_every_step": ({"act": act_runs_every_step}, "steps called"),
    },
    "q2a": {
        "off_by_one": ({"span_mask": mask_ramp_before_span}, "max abs error"),
        "hard_mask": ({"span_mask": mask_hard}, "grad"),
        "no_clamp": ({"span_mask": mask_no_clamp}, "max abs error"),
    },
    "q2b": {
        "off_by_one": ({"span_weights": weights_off_by_one}, "max abs error"),
        "not_causal": ({"span_weights": weights_not_causal}, "max abs error"),
        "not_renormalised": ({"span_weights": weights_not_renormalised}, "max abs error"),
        "overflow": ({"span_weights": weights_overflow}, "NaN"),
    },
    "q3a": {
        "off_by_one": ({"geometric_exit": geometric_off_by_one}, "max abs error"),
        "uses_last_chi": ({"geometric_exit": geometric_uses_last_chi}, "max abs error"),
        "wrong_shape": ({"geometric_exit": geometric_wrong_shape}, "shape"),
    },
    "q4a": {
        "off_by_one": ({"softmax_margin": margin_top1_only, "saturation": cosine}, "margin"),
        "margin_of_logits": ({"softmax_margin": margin_of_logits, "saturation": cosine}, "margin"),
        "saturation_dot": ({"softmax_margin": margin, "saturation": saturation_dot}, "saturation"),
    },
    "q4b": {
        "off_by_one": ({"exit_index": exit_one_based}, "expected"),
        "tie_exits": ({"exit_index": exit_at_or_above}, "expected"),
        "none_is_first": ({"exit_index": exit_none_is_first}, "expected"),
    },
    "q5a": {
        "off_by_one": ({"universal_encoder": ut_steps_from_zero}, "max abs error"),
        "positions_only": ({"universal_encoder": ut_positions_only}, "max abs error"),
        "signal_once": ({"universal_encoder": ut_signal_once}, "max abs error"),
        "untied": ({"universal_encoder": ut_copy_per_step}, "grad"),
        "extra_step": ({"universal_encoder": ut_one_step_too_many}, "max abs error"),
    },
}
