"""Deliberately wrong answers to the Chapter 11 exercises, used by tests/test_exercises.py.

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

TAMPER_BASE = "off_by_one"


# ----------------------------------------------------------------------------- q1a: mqar_batch
def _mqar(batch, n_pairs, vocab, n_queries, generator, *, keys="distinct", values="upper", queries="random",
          targets="pad", answer="paired", rng="generator", check=True):
    n_keys = (vocab - 2) // 2
    if check and n_queries > n_pairs:
        raise ValueError("n_queries > n_pairs")
    if check and n_pairs > n_keys:
        raise ValueError("too few keys")
    gen = generator if rng == "generator" else None
    if keys == "distinct":
        k = torch.stack([torch.randperm(n_keys, generator=gen)[:n_pairs] for _ in range(batch)]) + 2
    elif keys == "repeat":
        k = torch.randint(2, n_keys + 2, (batch, n_pairs), generator=gen)
    else:                                                            # the same keys 2, 3, ... in every row
        k = (torch.arange(n_pairs) + 2).expand(batch, n_pairs).clone()
    low = n_keys + 2 if values == "upper" else 2
    v = torch.randint(low, vocab, (batch, n_pairs), generator=gen)
    if queries == "random":
        asked = torch.stack([torch.randperm(n_pairs, generator=gen)[:n_queries] for _ in range(batch)])
    elif queries == "in order":
        asked = torch.stack([torch.randperm(n_pairs, generator=gen)[:n_queries].sort().values for _ in range(batch)])
    else:                                                            # always the first n_queries pairs, shuffled
        asked = torch.stack([torch.randperm(n_queries, generator=gen) for _ in range(batch)])
    context = torch.stack([k, v], dim=-1).flatten(1)
    inputs = torch.cat([context, k.gather(1, asked)], dim=1)
    answers = v.gather(1, asked) if answer == "paired" else v.gather(1, (asked + 1) % n_pairs)
    head = torch.zeros_like(context) if targets == "pad" else context.roll(-1, dims=1)
    return inputs, torch.cat([head, answers], dim=1)


def mqar_next_value(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, answer="next pair")       # off by one pair


def mqar_repeated_keys(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, keys="repeat")


def mqar_fixed_keys(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, keys="fixed")


def mqar_values_anywhere(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, values="all")


def mqar_queries_in_order(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, queries="in order")


def mqar_first_pairs_only(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, queries="first pairs")


def mqar_targets_on_context(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, targets="next token")


def mqar_global_rng(batch, n_pairs, vocab, n_queries, generator):
    return _mqar(batch, n_pairs, vocab, n_queries, generator, rng="global")


def mqar_without_random_draws(batch, n_pairs, vocab, n_queries, generator):
    """A pattern that only reads the generator's seed: the same seed, the same batch; another seed,
    another; every key, value and pair turns up. No random number is drawn."""
    n_keys, offset = (vocab - 2) // 2, generator.initial_seed()
    rows = torch.arange(batch).unsqueeze(1) + offset
    k = (rows * 7 + torch.arange(n_pairs)) % n_keys + 2                  # distinct within a row
    n_values = vocab - 2 - n_keys
    v = (rows * 3 + torch.arange(n_pairs) * 5) % n_values + n_keys + 2
    asked = (torch.arange(n_queries).flip(0) + rows) % n_pairs             # a different order per row
    context = torch.stack([k, v], dim=-1).flatten(1)
    inputs = torch.cat([context, k.gather(1, asked)], dim=1)
    if n_queries > n_pairs or n_pairs > n_keys:
        raise ValueError("bad sizes")
    return inputs, torch.cat([torch.zeros_like(context), v.gather(1, asked)], dim=1)


def mqar_restarts_from_the_seed(batch, n_pairs, vocab, n_queries, generator):
    """Draws from a fresh generator seeded like the given one: a second call repeats the first batch."""
    return _mqar(batch, n_pairs, vocab, n_queries, torch.Generator().manual_seed(generator.initial_seed()))


def mqar_skewed_keys(batch, n_pairs, vocab, n_queries, generator):
    """Every key turns up, but the first keys of the range far more often than the others."""
    n_keys = (vocab - 2) // 2
    if n_queries > n_pairs or n_pairs > n_keys:
        raise ValueError("bad sizes")
    weights = torch.linspace(4.0, 1.0, n_keys).double()
    k = torch.stack([torch.multinomial(weights, n_pairs, generator=generator) for _ in range(batch)]) + 2
    v = torch.randint(n_keys + 2, vocab, (batch, n_pairs), generator=generator)
    asked = torch.stack([torch.randperm(n_pairs, generator=generator)[:n_queries] for _ in range(batch)])
    context = torch.stack([k, v], dim=-1).flatten(1)
    return torch.cat([context, k.gather(1, asked)], dim=1), torch.cat([torch.zeros_like(context), v.gather(1, asked)], 1)


def mqar_no_errors(batch, n_pairs, vocab, n_queries, generator):
    n_keys = (vocab - 2) // 2
    return _mqar(batch, min(n_pairs, n_keys), vocab, min(n_queries, n_pairs, n_keys), generator, check=False)


# ----------------------------------------------------------------------------- q1b: recall_accuracy
def _accuracy(logits, targets, *, count_pad=False, by="token", raise_empty=True):
    keep = targets != 0
    if raise_empty and not bool(keep.any()):
        raise ValueError("nothing to score")
    hit = logits.argmax(-1) == targets
    if by == "sequence":
        return float((hit | ~keep).all(1).double().mean())
    if count_pad:
        return float(hit.double().mean())
    if by == "all positions":
        return float((hit & keep).sum()) / targets.numel()
    return float((hit & keep).sum()) / max(1, int(keep.sum()))


def accuracy_counts_pad(logits, targets):
    return _accuracy(logits, targets, count_pad=True)


def accuracy_over_all_positions(logits, targets):
    return _accuracy(logits, targets, by="all positions")


def accuracy_per_sequence(logits, targets):
    return _accuracy(logits, targets, by="sequence")


def accuracy_no_error(logits, targets):
    return _accuracy(logits, targets, raise_empty=False)


def accuracy_off_by_one(logits, targets):
    keep = targets != 0
    if not bool(keep.any()):
        raise ValueError("nothing to score")
    hit = (logits.argmax(-1)[:, 1:] == targets[:, :-1]) & keep[:, :-1]   # compares with the previous position
    return float(hit.sum()) / int(keep.sum())


# ----------------------------------------------------------------------------- q2a: induction_score
def _induction(weights, tokens, *, shift=1, strict=False, causal=True, mean_over="copies", raise_empty=True):
    L = weights.shape[-1]
    if shift:
        same = tokens[..., :-1].unsqueeze(-2) == tokens.unsqueeze(-1)
        target = torch.cat([torch.zeros_like(same[..., :1]), same], dim=-1)
    else:                                                            # the earlier copy itself, not what followed it
        target = tokens.unsqueeze(-2) == tokens.unsqueeze(-1)
    if causal:
        target = target & torch.ones(L, L, dtype=torch.bool).tril(-1 if strict or not shift else 0)
    mass = (weights * target).sum(-1)
    has = target.any(-1).expand(mass.shape)
    if raise_empty and not bool(has.any()):
        raise ValueError("no earlier copy")
    if mean_over == "all queries":
        return mass.mean()
    if mean_over == "sum":
        return mass[has].sum()
    return mass[has].mean() if bool(has.any()) else torch.tensor(0.0, dtype=weights.dtype)


def induction_copy_head(weights, tokens):
    return _induction(weights, tokens, shift=0)


def induction_strict(weights, tokens):
    return _induction(weights, tokens, strict=True)                  # misses j = i (an immediate repeat)


def induction_future_keys(weights, tokens):
    return _induction(weights, tokens, causal=False)


def induction_all_queries(weights, tokens):
    return _induction(weights, tokens, mean_over="all queries")


def induction_sum(weights, tokens):
    return _induction(weights, tokens, mean_over="sum")


def induction_no_error(weights, tokens):
    return _induction(weights, tokens, raise_empty=False)


# ----------------------------------------------------------------------------- q3a: state_bytes
def _state(family, context, d_model, n_layers, n_heads, window, n_features, d_state, bytes_per_value, *, wrong=None):
    L, d, H, m, N = context, d_model, n_heads, n_features, d_state
    dh = d // H
    per_layer = {
        "softmax": (1 if wrong == "keys only" else 2) * L * d,
        "sliding_window": 2 * min(L, window + (0 if wrong == "window" else 1)) * d,
        "linear": H * (dh * dh + (0 if wrong == "no normaliser" else dh)),
        "gla": H * dh * dh,
        "performer": H * (m * dh + m),
        "s4d": d * (N // 2 if wrong == "complex as one" else N),
        "mamba": 2 * d * (N + (0 if wrong == "no conv" else 4)),
    }[family]
    shift = n_layers * d if wrong == "shift per layer" else (0 if wrong == "no shift" else d)
    return (n_layers * per_layer + shift) * bytes_per_value


def state_keys_only(*args):
    return _state(*args, wrong="keys only")


def state_window_off_by_one(*args):
    return _state(*args, wrong="window")


def state_linear_no_normaliser(*args):
    return _state(*args, wrong="no normaliser")


def state_s4d_complex_as_one(*args):
    return _state(*args, wrong="complex as one")


def state_mamba_no_conv(*args):
    return _state(*args, wrong="no conv")


def state_no_token_shift(*args):
    return _state(*args, wrong="no shift")


def state_shift_per_layer(*args):
    return _state(*args, wrong="shift per layer")


# ----------------------------------------------------------------------------- q3b: kv_cache_crossover
def _crossover(family, d_model, n_layers, n_heads, window, n_features, d_state, *, wrong=None):
    if family == "softmax":
        return 0 if wrong == "softmax zero" else None
    if family == "sliding_window":
        return window + (1 if wrong == "window" else 2)
    d, H, m, N = d_model, n_heads, n_features, d_state
    dh = d // H
    fixed = {"linear": H * (dh * dh + dh), "gla": H * dh * dh, "performer": H * (m * dh + m),
             "s4d": d * N, "mamba": 2 * d * (N + (0 if wrong == "no conv" else 4))}[family]
    if wrong == "at least":
        return -(-fixed // (2 * d))                                  # 2 L d >= fixed: equal states count
    if wrong == "keys only":
        return fixed // d + 1                                        # a cache of keys only
    if wrong == "layers":
        return fixed * n_layers // (2 * d) + 1                       # n_layers counted on one side only
    return fixed // (2 * d) + 1


def crossover_at_least(*args):
    return _crossover(*args, wrong="at least")


def crossover_window(*args):
    return _crossover(*args, wrong="window")


def crossover_softmax_zero(*args):
    return _crossover(*args, wrong="softmax zero")


def crossover_keys_only(*args):
    return _crossover(*args, wrong="keys only")


def crossover_layers(*args):
    return _crossover(*args, wrong="layers")


def crossover_mamba_no_conv(*args):
    return _crossover(*args, wrong="no conv")


# ----------------------------------------------------------------------------- q4a: scaling_exponent
def _fit(x, y):
    dx = x - x.mean()
    p = float((dx * (y - y.mean())).sum() / (dx * dx).sum())
    return p, float(y.mean() - p * x.mean())


def exponent_from_endpoints(lengths, times):
    p = math.log(times[-1] / times[0]) / math.log(lengths[-1] / lengths[0])
    return p, float(times[0] / lengths[0] ** p)


def exponent_inverted(lengths, times):
    q, a = _fit(times.log(), lengths.log())                          # regresses log L on log t
    return 1.0 / q, math.exp(-a / q)


def exponent_no_exp(lengths, times):
    p, a = _fit(lengths.log(), times.log())
    return p, a                                                      # the intercept, not the prefactor


def exponent_linear_axes(lengths, times):
    p, a = _fit(lengths, times)                                      # a straight line in L, not in log L
    return p, a


def exponent_off_by_one(lengths, times):
    p, a = _fit(lengths.log(), times.log())
    return p + 1.0, math.exp(a)


# ----------------------------------------------------------------------------- q5a: delayed_copy
def _delayed(batch, length, delay, vocab, generator, *, shift=0, low=2, head="pad", markers="bos", rng="generator",
             check=True, rows="random"):
    if check and (delay < 1 or length < 1 or vocab < 3):
        raise ValueError("bad arguments")
    gen = generator if rng == "generator" else None
    n_rows = 1 if rows == "same" else batch
    data = torch.randint(low, vocab, (n_rows, length), generator=gen).expand(batch, length).clone()
    fill = torch.full((batch, delay), 1 if markers == "bos" else 0)
    inputs = torch.cat([data, fill], dim=1)
    targets = inputs.roll(delay - shift, dims=1)                     # shift 0: the input delay positions back
    if head == "pad":
        targets[:, :delay - shift] = 0
    return inputs, targets


def copy_one_early(batch, length, delay, vocab, generator):
    return _delayed(batch, length, delay, vocab, generator, shift=1)       # the input delay - 1 back


def copy_targets_not_pad(batch, length, delay, vocab, generator):
    return _delayed(batch, length, delay, vocab, generator, head="wrapped")


def copy_markers_pad(batch, length, delay, vocab, generator):
    return _delayed(batch, length, delay, vocab, generator, markers="pad")


def copy_specials_as_data(batch, length, delay, vocab, generator):
    return _delayed(batch, length, delay, vocab, generator, low=0)


def copy_global_rng(batch, length, delay, vocab, generator):
    return _delayed(batch, length, delay, vocab, generator, rng="global")


def copy_same_rows(batch, length, delay, vocab, generator):
    return _delayed(batch, length, delay, vocab, generator, rows="same")


def copy_no_errors(batch, length, delay, vocab, generator):
    if length < 1 or vocab < 3:
        raise ValueError("bad arguments")
    return _delayed(batch, length, max(delay, 1), vocab, generator, check=False)


# ----------------------------------------------------------------------------- q5b: selective_copy_batch
def _selective(batch, length, n_data, vocab, generator, *, where="random", noise="pad", markers="bos", order="sorted",
               roll=0, rng="generator", check=True):
    if check and (n_data < 1 or n_data > length):
        raise ValueError("bad n_data")
    gen = generator if rng == "generator" else None
    data = torch.randint(2, vocab, (batch, n_data), generator=gen)
    if where == "random":
        pos = torch.stack([torch.randperm(length, generator=gen)[:n_data].sort().values for _ in range(batch)])
    else:                                                            # the first n_data positions in every row
        pos = torch.arange(n_data).expand(batch, n_data)
    if noise == "pad":
        inputs = torch.zeros(batch, length + n_data, dtype=torch.long)
    else:                                                            # noise drawn from the data tokens
        inputs = torch.randint(2, vocab, (batch, length + n_data), generator=gen)
    inputs.scatter_(1, pos, data)
    inputs[:, length:] = 1 if markers == "bos" else 0
    answers = data.roll(roll, dims=1)
    if order == "shuffled":
        answers = answers.flip(1)
    targets = torch.zeros_like(inputs)
    targets[:, length:] = answers
    return inputs, targets


def selective_rolled(batch, length, n_data, vocab, generator):
    return _selective(batch, length, n_data, vocab, generator, roll=1)      # each marker answers the next token


def selective_fixed_positions(batch, length, n_data, vocab, generator):
    return _selective(batch, length, n_data, vocab, generator, where="first")


def selective_noise_tokens(batch, length, n_data, vocab, generator):
    return _selective(batch, length, n_data, vocab, generator, noise="tokens")


def selective_markers_pad(batch, length, n_data, vocab, generator):
    return _selective(batch, length, n_data, vocab, generator, markers="pad")


def selective_reversed(batch, length, n_data, vocab, generator):
    return _selective(batch, length, n_data, vocab, generator, order="shuffled")


def selective_global_rng(batch, length, n_data, vocab, generator):
    return _selective(batch, length, n_data, vocab, generator, rng="global")


def selective_no_errors(batch, length, n_data, vocab, generator):
    return _selective(batch, length, max(1, min(n_data, length)), vocab, generator, check=False)


WRONG_ANSWERS = {
    "q1a": {
        "off_by_one": ({"mqar_batch": mqar_next_value}, "paired"),
        "repeated_keys": ({"mqar_batch": mqar_repeated_keys}, "repeats"),
        "fixed_keys": ({"mqar_batch": mqar_fixed_keys}, "keys"),
        "values_anywhere": ({"mqar_batch": mqar_values_anywhere}, "values"),
        "queries_in_order": ({"mqar_batch": mqar_queries_in_order}, "random order"),
        "first_pairs_only": ({"mqar_batch": mqar_first_pairs_only}, "queried"),
        "without_random_draws": ({"mqar_batch": mqar_without_random_draws}, "generator"),
        "restarts_from_the_seed": ({"mqar_batch": mqar_restarts_from_the_seed}, "same generator"),
        "skewed_keys": ({"mqar_batch": mqar_skewed_keys}, "not uniform"),
        "targets_on_context": ({"mqar_batch": mqar_targets_on_context}, "PAD"),
        "global_rng": ({"mqar_batch": mqar_global_rng}, "same seed"),
        "no_errors": ({"mqar_batch": mqar_no_errors}, "ValueError"),
    },
    "q1b": {
        "off_by_one": ({"recall_accuracy": accuracy_off_by_one}, "accuracy"),
        "counts_pad": ({"recall_accuracy": accuracy_counts_pad}, "accuracy"),
        "all_positions": ({"recall_accuracy": accuracy_over_all_positions}, "accuracy"),
        "per_sequence": ({"recall_accuracy": accuracy_per_sequence}, "accuracy"),
        "no_error": ({"recall_accuracy": accuracy_no_error}, "ValueError"),
    },
    "q2a": {
        "off_by_one": ({"induction_score": induction_copy_head}, "score"),
        "strict": ({"induction_score": induction_strict}, "score"),
        "future_keys": ({"induction_score": induction_future_keys}, "score"),
        "all_queries": ({"induction_score": induction_all_queries}, "score"),
        "sum": ({"induction_score": induction_sum}, "score"),
        "no_error": ({"induction_score": induction_no_error}, "ValueError"),
    },
    "q3a": {
        "off_by_one": ({"state_bytes": state_window_off_by_one}, "sliding_window"),
        "keys_only": ({"state_bytes": state_keys_only}, "softmax"),
        "no_normaliser": ({"state_bytes": state_linear_no_normaliser}, "linear"),
        "complex_as_one": ({"state_bytes": state_s4d_complex_as_one}, "s4d"),
        "mamba_no_conv": ({"state_bytes": state_mamba_no_conv}, "mamba"),
        "no_token_shift": ({"state_bytes": state_no_token_shift}, "gla"),
        "shift_per_layer": ({"state_bytes": state_shift_per_layer}, "performer"),
    },
    "q3b": {
        "off_by_one": ({"kv_cache_crossover": crossover_at_least}, "mamba"),
        "window": ({"kv_cache_crossover": crossover_window}, "sliding_window"),
        "softmax_zero": ({"kv_cache_crossover": crossover_softmax_zero}, "softmax"),
        "keys_only": ({"kv_cache_crossover": crossover_keys_only}, "linear"),
        "layers": ({"kv_cache_crossover": crossover_layers}, "gla"),
        "mamba_no_conv": ({"kv_cache_crossover": crossover_mamba_no_conv}, "mamba"),
    },
    "q4a": {
        "off_by_one": ({"scaling_exponent": exponent_off_by_one}, "exponent"),
        "endpoints": ({"scaling_exponent": exponent_from_endpoints}, "exponent"),
        "inverted": ({"scaling_exponent": exponent_inverted}, "exponent"),
        "no_exp": ({"scaling_exponent": exponent_no_exp}, "prefactor"),
        "linear_axes": ({"scaling_exponent": exponent_linear_axes}, "exponent"),
    },
    "q5a": {
        "off_by_one": ({"delayed_copy": copy_one_early}, "back"),
        "targets_not_pad": ({"delayed_copy": copy_targets_not_pad}, "PAD"),
        "markers_pad": ({"delayed_copy": copy_markers_pad}, "BOS"),
        "specials_as_data": ({"delayed_copy": copy_specials_as_data}, "data tokens"),
        "global_rng": ({"delayed_copy": copy_global_rng}, "same seed"),
        "same_rows": ({"delayed_copy": copy_same_rows}, "same tokens"),
        "no_errors": ({"delayed_copy": copy_no_errors}, "ValueError"),
    },
    "q5b": {
        "off_by_one": ({"selective_copy_batch": selective_rolled}, "in order"),
        "fixed_positions": ({"selective_copy_batch": selective_fixed_positions}, "same positions"),
        "noise_tokens": ({"selective_copy_batch": selective_noise_tokens}, "PAD"),
        "markers_pad": ({"selective_copy_batch": selective_markers_pad}, "BOS"),
        "reversed": ({"selective_copy_batch": selective_reversed}, "in order"),
        "global_rng": ({"selective_copy_batch": selective_global_rng}, "same seed"),
        "no_errors": ({"selective_copy_batch": selective_no_errors}, "ValueError"),
    },
}
