"""Synthetic sequence tasks, generated on the fly (nothing is downloaded).

Token ids 0 and 1 are reserved: ``PAD = 0`` and ``BOS = 1``; data tokens are ``2 .. vocab-1``.
Every function takes a ``torch.Generator`` so batches are reproducible.
"""
from __future__ import annotations

import math
import numbers

import torch

from .utils import check_int, check_positive_int, check_real, check_tensor

__all__ = ["PAD", "BOS", "N_SPECIAL", "copy_task", "reverse_task", "associative_recall", "lm_copy_task",
           "accuracy", "LaggedTopicLanguage"]

PAD, BOS = 0, 1
N_SPECIAL = 2


def _tokens(batch: int, length: int, vocab: int, generator, device) -> torch.Tensor:
    check_positive_int("batch", batch)
    check_positive_int("length", length)
    check_positive_int("vocab", vocab)
    if vocab <= N_SPECIAL:
        raise ValueError(f"vocab must exceed the {N_SPECIAL} reserved ids (PAD, BOS), got {vocab}")
    return torch.randint(N_SPECIAL, vocab, (batch, length), generator=generator).to(device)


def copy_task(batch: int, length: int, vocab: int, *, generator: torch.Generator | None = None,
              device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, tgt)`` of shape ``(batch, length)`` with ``tgt == src``."""
    src = _tokens(batch, length, vocab, generator, device)
    return src, src.clone()


def reverse_task(batch: int, length: int, vocab: int, *, generator: torch.Generator | None = None,
                 device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, tgt)`` of shape ``(batch, length)`` with ``tgt`` the source read backwards."""
    src = _tokens(batch, length, vocab, generator, device)
    return src, src.flip(-1)


def _key_value_pairs(batch: int, n_pairs: int, vocab: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``keys, values (batch, n_pairs)``: keys distinct within a row, from the lower half of the data
    tokens; values from the upper half."""
    check_positive_int("batch", batch)
    check_positive_int("n_pairs", n_pairs)
    check_positive_int("vocab", vocab)
    n_data = vocab - N_SPECIAL
    n_keys = n_data // 2
    if n_keys < n_pairs or n_data - n_keys < 1:
        raise ValueError(f"vocab={vocab} leaves {n_keys} key tokens, fewer than n_pairs={n_pairs}")
    keys = torch.stack([torch.randperm(n_keys, generator=generator)[:n_pairs] for _ in range(batch)]) + N_SPECIAL
    values = torch.randint(N_SPECIAL + n_keys, vocab, (batch, n_pairs), generator=generator)
    return keys, values


def associative_recall(batch: int, n_pairs: int, vocab: int, *, generator: torch.Generator | None = None,
                       device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-value recall: ``seq (batch, 2*n_pairs + 1)`` = ``k1 v1 k2 v2 ... kn vn q``, target ``(batch,)``.

    Keys within a sequence are distinct; the query ``q`` is one of them and the target is its value.
    Keys are drawn from the lower half of the data tokens and values from the upper half.
    """
    keys, values = _key_value_pairs(batch, n_pairs, vocab, generator)
    which = torch.randint(0, n_pairs, (batch,), generator=generator)
    rows = torch.arange(batch)
    seq = torch.stack([keys, values], dim=-1).flatten(1)
    seq = torch.cat([seq, keys[rows, which][:, None]], dim=1)
    return seq.to(device), values[rows, which].to(device)


def lm_copy_task(batch: int, length: int, vocab: int, *, generator: torch.Generator | None = None,
                 device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy task for a decoder-only model: the sequence ``x x`` with ``x`` of ``length`` random data tokens.

    Returns ``(inputs, targets)``, both ``(batch, 2*length - 1)``: ``inputs`` is ``x x`` without its
    last token, ``targets`` the next token at every position, with ``PAD`` (to be ignored) wherever
    the next token is unpredictable (inside the first ``x``). Chance loss is ``ln(vocab - 2)``.
    """
    x = _tokens(batch, length, vocab, generator, device)
    seq = torch.cat([x, x], dim=1)
    targets = seq[:, 1:].clone()
    targets[:, :length - 1] = PAD
    return seq[:, :-1], targets


def accuracy(pred: torch.Tensor, target: torch.Tensor, *, by: str = "token", ignore_index: int | None = None):
    """Agreement of predicted and target ids ``(B, L)``.

    ``by="token"``: fraction of equal tokens (float); ``by="sequence"``: fraction of rows equal at every
    position, i.e. exact match (float); ``by="position"``: per-position accuracy ``(L,)``.
    Positions whose target is ``ignore_index`` are left out. A fraction of nothing is NaN: with no
    scored token (``"token"``), no row (``"sequence"``, ``B = 0``) or, per position, no scored token
    there (``"position"``).
    """
    check_tensor("pred", pred, rank=2)
    check_tensor("target", target, rank=2)
    if pred.shape != target.shape:
        raise ValueError(f"pred and target must both be (B, L), got {tuple(pred.shape)} and {tuple(target.shape)}")
    if ignore_index is not None:
        ignore_index = check_int("ignore_index", ignore_index)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    hit = (pred == target) & keep
    fraction = lambda hits, total: hits / total if total else math.nan     # exact counts, divided in fp64
    if by == "token":
        return fraction(int(hit.sum()), int(keep.sum()))
    if by == "sequence":
        return fraction(int((hit | ~keep).all(dim=1).sum()), hit.shape[0])
    if by == "position":
        return hit.sum(0).double() / keep.sum(0)
    raise ValueError(f"by must be 'token', 'sequence' or 'position', got {by!r}")


# ----------------------------------------------------------------------------- Chapter 2 tasks
__all__ += ["gaussian_tokens", "offset_copy", "seen_before"]


def gaussian_tokens(batch: int, length: int, d: int, *, norm_spread: tuple[float, float] | None = None,
                    generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64,
                    device=None) -> torch.Tensor:
    """Random token vectors ``(batch, length, d)`` with i.i.d. standard normal entries.

    Without ``norm_spread`` the row norms concentrate around ``sqrt(d)``, so the diagonal of
    ``X X^T`` tends to win every row. ``norm_spread=(lo, hi)`` rescales each row to a norm drawn
    uniformly from ``[lo, hi]`` (``0 < lo <= hi``): unequal norms, where a long off-diagonal token
    can beat a short token's own ``||x_i||^2``.
    """
    for name, value in (("batch", batch), ("length", length), ("d", d)):
        check_positive_int(name, value)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    x = torch.randn(batch, length, d, generator=generator, dtype=dtype)
    if norm_spread is not None:
        try:
            lo, hi = (float(v) for v in norm_spread)
        except (TypeError, ValueError):
            raise ValueError(f"norm_spread must be a pair (lo, hi) of numbers, got {norm_spread!r}") from None
        if not 0 < lo <= hi:
            raise ValueError(f"norm_spread must satisfy 0 < lo <= hi, got {norm_spread!r}")
        norms = lo + (hi - lo) * torch.rand(batch, length, 1, generator=generator, dtype=dtype)
        x = x / x.norm(dim=-1, keepdim=True) * norms
    return x.to(device)


def offset_copy(batch: int, length: int, vocab: int, offsets=(-1,), *, generator: torch.Generator | None = None,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Read a neighbour: ``ids (batch, length)`` and ``targets (batch, length, len(offsets))``.

    ``targets[b, i, c] = ids[b, i + offsets[c]]``, or ``PAD`` where ``i + offsets[c]`` falls outside
    the sequence (nothing to predict there). ``offsets=(-1,)`` is the previous-token task;
    ``(-1, 1)`` asks for both neighbours at once, two relations that one attention head cannot
    serve together. Offsets are distinct non-zero ints with ``|offset| < length``.
    """
    ids = _tokens(batch, length, vocab, generator, device)
    offsets = tuple(offsets) if not isinstance(offsets, numbers.Integral) else (offsets,)
    if (not offsets or any(isinstance(o, bool) or not isinstance(o, numbers.Integral) for o in offsets)
            or len(set(offsets)) != len(offsets) or any(o == 0 or abs(o) >= length for o in offsets)):
        raise ValueError(f"offsets must be distinct non-zero ints with |offset| < length={length}, got {offsets!r}")
    offsets = tuple(int(o) for o in offsets)
    targets = torch.full((batch, length, len(offsets)), PAD, dtype=ids.dtype, device=ids.device)
    for c, o in enumerate(offsets):
        if o < 0:
            targets[:, -o:, c] = ids[:, :o]
        else:
            targets[:, :-o, c] = ids[:, o:]
    return ids, targets


def seen_before(batch: int, length: int, vocab: int, *, generator: torch.Generator | None = None,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence labelling that needs context: ``ids (batch, length)``, ``labels (batch, length)``.

    ``labels[b, i] = 1`` if the token ``ids[b, i]`` already occurred at some position ``j < i``,
    else ``0`` (so position 0 is always 0). A per-token classifier sees only ``(token, position)``
    and can do no better than the base rate at each position.
    """
    ids = _tokens(batch, length, vocab, generator, device)
    earlier = (ids[:, :, None] == ids[:, None, :]).tril(diagonal=-1)         # [b, i, j]: j < i, same token
    return ids, earlier.any(dim=-1).long()


def delayed_copy(batch: int, length: int, vocab: int, delay: int, *, generator: torch.Generator | None = None,
                 device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Long-range copy for memory models: ``ids (batch, length)``, ``targets (batch, length)``.

    At position ``i`` the model must output the token it read ``delay`` steps earlier:
    ``targets[b, i] = ids[b, i - delay]``, and ``PAD`` (nothing to predict) for ``i < delay``. A model
    that sees fewer than ``delay + 1`` tokens back is at chance, ``1 / (vocab - N_SPECIAL)``.
    """
    ids = _tokens(batch, length, vocab, generator, device)
    check_positive_int("delay", delay)
    if delay >= length:
        raise ValueError(f"delay must be below length={length}, got {delay}")
    targets = torch.full_like(ids, PAD)
    targets[:, delay:] = ids[:, :-delay]
    return ids, targets


__all__ += ["delayed_copy"]


class LaggedTopicLanguage:
    """A synthetic language with short- and long-range structure, for train-short/test-long experiments.

    Each sequence draws a hidden *topic*: a random set of ``topic_size`` of the ``vocab`` tokens.
    Token ``t`` is a fixed permutation of token ``t - lag`` with probability ``p_rule`` (short range:
    the model must find the token exactly ``lag`` steps back) and is drawn uniformly from the topic
    otherwise (long range: the more context, the better the topic is known). The permutation is
    fixed by ``seed``. Every id in ``0 .. vocab-1`` is a data token (no PAD or BOS: sequences are
    never padded). `sample` also returns the log-probability of every token under the true
    process given the topic: a floor no model can beat on average.
    """

    def __init__(self, vocab: int = 32, *, lag: int = 2, p_rule: float = 0.7, topic_size: int = 6, seed: int = 0):
        self.vocab = check_positive_int("vocab", vocab)
        self.lag = check_positive_int("lag", lag)
        self.topic_size = check_positive_int("topic_size", topic_size)
        if topic_size > vocab:
            raise ValueError(f"topic_size={topic_size} exceeds vocab={vocab}")
        self.p_rule = check_real("p_rule", p_rule, low=0.0, high=1.0, high_open=True)
        self.perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(check_int("seed", seed, low=0)))

    def sample(self, batch: int, length: int, *, generator: torch.Generator | None = None,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens (batch, length) long, oracle_logp (batch, length) fp64)``."""
        check_positive_int("batch", batch)
        check_positive_int("length", length)
        topic = torch.rand(batch, self.vocab, generator=generator).argsort(-1)[:, : self.topic_size]
        free = topic.gather(1, torch.randint(self.topic_size, (batch, length), generator=generator))
        use_rule = torch.rand(batch, length, generator=generator) < self.p_rule
        tokens = free.clone()
        for t in range(self.lag, length):
            tokens[:, t] = torch.where(use_rule[:, t], self.perm[tokens[:, t - self.lag]], free[:, t])
        in_topic = torch.zeros(batch, self.vocab, dtype=torch.bool).scatter_(1, topic, True).gather(1, tokens)
        p = in_topic.double() / self.topic_size
        rule_hit = tokens[:, self.lag:] == self.perm[tokens[:, : -self.lag]]
        p[:, self.lag:] = (1 - self.p_rule) * p[:, self.lag:] + self.p_rule * rule_hit.double()
        return tokens.to(device), p.log().to(device)


# ----------------------------------------------------------------------------- Chapter 6 tasks
__all__ += ["parity_task"]


def parity_task(batch: int, n_bits: int, *, min_nonzero: int = 1, generator: torch.Generator | None = None,
                device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Graves's (2016) parity vectors: ``(x (batch, n_bits) float, target (batch,) long, n_nonzero (batch,) long)``.

    Each row draws a difficulty ``k`` uniformly from ``min_nonzero .. n_bits``, sets ``k`` random
    entries to +1 or -1 (each with probability 1/2) and the rest to 0; the target is 1 when the
    number of +1 entries is odd, else 0. ``n_nonzero`` returns ``k``, the difficulty.
    """
    check_positive_int("batch", batch)
    check_positive_int("n_bits", n_bits)
    check_positive_int("min_nonzero", min_nonzero)
    if min_nonzero > n_bits:
        raise ValueError(f"min_nonzero={min_nonzero} exceeds n_bits={n_bits}")
    k = torch.randint(min_nonzero, n_bits + 1, (batch,), generator=generator)
    signs = torch.randint(0, 2, (batch, n_bits), generator=generator) * 2 - 1
    chosen = torch.rand(batch, n_bits, generator=generator).argsort(-1) < k[:, None]   # k random entries per row
    x = (signs * chosen).float()
    target = (x == 1).sum(-1) % 2
    return x.to(device), target.to(device), k.to(device)


__all__ += ["cyclic_permutation", "permutation_steps"]


def cyclic_permutation(n_items: int, *, seed: int = 0) -> torch.Tensor:
    """A random permutation of ``0 .. n_items-1`` made of one cycle through all items, fixed by ``seed``: ``(n_items,)``.

    One cycle means ``perm`` applied ``k`` times moves every item for ``0 < k < n_items``, so
    different ``k`` give different answers.
    """
    check_positive_int("n_items", n_items)
    order = torch.randperm(n_items, generator=torch.Generator().manual_seed(check_int("seed", seed, low=0)))
    perm = torch.empty(n_items, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def permutation_steps(batch: int, perm: torch.Tensor, max_k: int, *, generator: torch.Generator | None = None,
                      device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Apply a fixed permutation ``k`` times: ``(start (batch,), k (batch,), target (batch,))``, all long.

    ``perm (n_items,)`` (e.g. `cyclic_permutation`); each row draws a start item uniformly and a
    difficulty ``k`` uniformly from ``1 .. max_k``; the target is ``perm`` applied ``k`` times to the
    start. One application per step is the natural algorithm, so ``k`` is the number of sequential
    steps the answer needs (chapter 6's second ACT task).
    """
    check_positive_int("batch", batch)
    check_positive_int("max_k", max_k)
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or not torch.equal(perm.cpu().sort().values, torch.arange(len(perm))):
        raise ValueError(f"perm must be a permutation of 0 .. n-1 as a 1-D tensor, got "
                         f"{tuple(perm.shape) if isinstance(perm, torch.Tensor) else type(perm).__name__}")
    perm = perm.cpu()
    start = torch.randint(len(perm), (batch,), generator=generator)
    k = torch.randint(1, max_k + 1, (batch,), generator=generator)
    target = start.clone()
    for j in range(max_k):
        target = torch.where(k > j, perm[target], target)
    return start.to(device), k.to(device), target.to(device)


__all__ += ["copy_or_recall"]


def copy_or_recall(batch: int, n_pairs: int, vocab: int, *, generator: torch.Generator | None = None,
                   device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Easy and hard tokens in one sequence (chapter 6's early-exit task): ``(inputs, targets, hard)``, each ``(batch, 3*n_pairs)``.

    ``inputs`` = ``k1 v1 ... kn vn q1 ... qn``: ``n_pairs`` distinct keys (lower half of the data
    tokens) with random values (upper half), then every key once more, in random order, as a query.
    ``targets`` is the input token itself on the ``k v`` part (easy: copy the current token) and the
    paired value at each query (hard: a causal model must first attach each value to its key, then
    look the query up, two attention steps); ``hard`` marks the queries.
    """
    check_positive_int("batch", batch)
    check_positive_int("n_pairs", n_pairs)
    check_positive_int("vocab", vocab)
    n_keys = (vocab - N_SPECIAL) // 2
    if n_keys < n_pairs:
        raise ValueError(f"vocab={vocab} leaves {n_keys} key tokens, fewer than n_pairs={n_pairs}")
    keys = torch.rand(batch, n_keys, generator=generator).argsort(-1)[:, :n_pairs] + N_SPECIAL
    values = torch.randint(N_SPECIAL + n_keys, vocab, (batch, n_pairs), generator=generator)
    order = torch.rand(batch, n_pairs, generator=generator).argsort(-1)
    context = torch.stack([keys, values], dim=-1).flatten(1)
    inputs = torch.cat([context, keys.gather(1, order)], dim=1)
    targets = torch.cat([context, values.gather(1, order)], dim=1)
    hard = torch.zeros_like(inputs, dtype=torch.bool)
    hard[:, 2 * n_pairs:] = True
    return inputs.to(device), targets.to(device), hard.to(device)


__all__ += ["ModeBigramLanguage"]


class ModeBigramLanguage:
    """A language with local structure and one long-range dependency (chapter 6's adaptive-span task).

    The first token of a sequence is one of ``n_modes`` *mode* tokens (ids ``0 .. n_modes-1``); the
    rest are data tokens (``n_modes .. vocab-1``). Token ``t >= 2`` is the mode's own fixed
    permutation of token ``t - 1`` with probability ``p_rule`` and uniform over the data tokens
    otherwise. Predicting a token needs the previous token (distance 1) and the mode, which sits at
    the start, as far back as the sequence goes (the last rule-following step also hints at it).
    The permutations are fixed by ``seed``. `sample` returns ``(tokens (batch, length) long,
    oracle_logp (batch, length) fp64)``, the true process's log-probability of every token given the mode.
    """

    def __init__(self, vocab: int = 32, *, n_modes: int = 4, p_rule: float = 0.8, seed: int = 0):
        self.vocab = check_positive_int("vocab", vocab)
        self.n_modes = check_positive_int("n_modes", n_modes)
        if vocab - n_modes < 2:
            raise ValueError(f"vocab={vocab} leaves fewer than 2 data tokens after n_modes={n_modes}")
        self.p_rule = check_real("p_rule", p_rule, low=0.0, high=1.0, high_open=True)
        gen = torch.Generator().manual_seed(check_int("seed", seed, low=0))
        self.perms = torch.stack([torch.randperm(vocab - n_modes, generator=gen) for _ in range(n_modes)]) + n_modes

    def sample(self, batch: int, length: int, *, generator: torch.Generator | None = None,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens (batch, length) long, oracle_logp (batch, length) fp64)``."""
        check_positive_int("batch", batch)
        check_positive_int("length", length)
        n_data = self.vocab - self.n_modes
        mode = torch.randint(self.n_modes, (batch,), generator=generator)
        tokens = torch.randint(self.n_modes, self.vocab, (batch, length), generator=generator)
        use_rule = torch.rand(batch, length, generator=generator) < self.p_rule
        tokens[:, 0] = mode
        for t in range(2, length):
            tokens[:, t] = torch.where(use_rule[:, t], self.perms[mode, tokens[:, t - 1] - self.n_modes], tokens[:, t])
        p = torch.full((batch, length), 1.0 / n_data, dtype=torch.float64)
        p[:, 0] = 1.0 / self.n_modes
        hit = tokens[:, 2:] == self.perms[mode[:, None], tokens[:, 1:-1] - self.n_modes]
        p[:, 2:] = (1 - self.p_rule) / n_data + self.p_rule * hit.double()
        return tokens.to(device), p.log().to(device)


# ----------------------------------------------------------------------------- Chapter 8 task
__all__ += ["mqar"]


def mqar(batch: int, n_pairs: int, vocab: int, *, n_queries: int | None = None,
         generator: torch.Generator | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-query associative recall (Zoology, Arora et al. 2024).

    ``inputs (batch, 2*n_pairs + n_queries)`` = ``k1 v1 ... kn vn q1 ... qm``: ``n_pairs`` distinct keys
    (lower half of the data tokens) with random values (upper half), then ``n_queries`` keys of the
    sequence (distinct, ``n_queries <= n_pairs``, default ``n_pairs``) in random order. ``targets`` has
    the same shape: ``PAD`` everywhere except at each query, where it is the value paired with that key
    (a causal model reads the query and must output its value there).
    """
    check_positive_int("batch", batch)
    check_positive_int("n_pairs", n_pairs)
    n_queries = n_pairs if n_queries is None else check_positive_int("n_queries", n_queries)
    if n_queries > n_pairs:
        raise ValueError(f"n_queries must be <= n_pairs, got n_queries={n_queries}, n_pairs={n_pairs}")
    keys, values = _key_value_pairs(batch, n_pairs, vocab, generator)
    which = torch.stack([torch.randperm(n_pairs, generator=generator)[:n_queries] for _ in range(batch)])
    context = torch.stack([keys, values], dim=-1).flatten(1)
    inputs = torch.cat([context, keys.gather(1, which)], dim=1)
    targets = torch.cat([torch.full_like(context, PAD), values.gather(1, which)], dim=1)
    return inputs.to(device), targets.to(device)


__all__ += ["mqar_zoology"]


def mqar_zoology(batch: int, n_pairs: int, vocab: int, seq_len: int, *, power_a: float = 0.01,
                 generator: torch.Generator | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """MQAR in the form of Zoology's own generator (Arora et al. 2024, ``multiquery_ar``).

    ``inputs, targets (batch, seq_len)``: ``k1 v1 ... kn vn`` first, keys and values each distinct within
    a row (keys from the lower half of the data tokens, values from the upper half), then a stretch of
    ``seq_len - 2 n_pairs`` tokens in which every key is asked once. Query ``j`` sits at an even offset
    ``2 g_j`` into the stretch; the slots ``g`` are drawn without replacement with probability
    proportional to ``g ** (power_a - 1)`` (``g = 1, 2, ...``), so with Zoology's ``power_a = 0.01`` most
    queries come soon after the pairs and a few far later. Every other position of the stretch is a
    random token of the whole vocabulary (noise). ``targets`` is ``PAD`` except at each query, where it
    is the key's value. Zoology uses vocabularies of several thousand tokens: with a small one the noise
    repeats the keys often.
    """
    for name, value in (("batch", batch), ("n_pairs", n_pairs), ("vocab", vocab), ("seq_len", seq_len)):
        check_positive_int(name, value)
    power_a = check_real("power_a", power_a, low=0.0, low_open=True)
    slots = (seq_len - 2 * n_pairs) // 2
    if slots < n_pairs:
        raise ValueError(f"seq_len={seq_len} leaves {slots} query slots after n_pairs={n_pairs} pairs, "
                         f"fewer than the {n_pairs} queries")
    n_data = vocab - N_SPECIAL
    n_keys = n_data // 2
    if n_keys < n_pairs or n_data - n_keys < n_pairs:
        raise ValueError(f"vocab={vocab} leaves {n_keys} key and {n_data - n_keys} value tokens, fewer than "
                         f"n_pairs={n_pairs}")
    draw = lambda n, k: torch.stack([torch.randperm(n, generator=generator)[:k] for _ in range(batch)])
    keys = draw(n_keys, n_pairs) + N_SPECIAL
    values = draw(n_data - n_keys, n_pairs) + N_SPECIAL + n_keys
    weights = torch.arange(1, slots + 1, dtype=torch.float64) ** (power_a - 1)
    gaps = torch.multinomial(weights.expand(batch, slots), n_pairs, replacement=False, generator=generator)
    inputs = torch.randint(N_SPECIAL, vocab, (batch, seq_len), generator=generator)   # the noise
    targets = torch.full((batch, seq_len), PAD, dtype=torch.long)
    inputs[:, 0 : 2 * n_pairs : 2], inputs[:, 1 : 2 * n_pairs : 2] = keys, values
    where = 2 * n_pairs + 2 * gaps
    inputs.scatter_(1, where, keys)
    targets.scatter_(1, where, values)
    return inputs.to(device), targets.to(device)


# ----------------------------------------------------------------------------- Chapter 9 tasks
__all__ += ["selective_copying", "induction_heads"]


def selective_copying(batch: int, length: int, n_tokens: int, vocab: int, *,
                      generator: torch.Generator | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Selective copying (Gu & Dao 2023): ``inputs, targets (batch, length + n_tokens)``.

    The first ``length`` positions hold ``n_tokens`` random data tokens (``2 .. vocab-1``) at random,
    sorted positions and ``PAD`` (the noise/blank token) everywhere else; the last ``n_tokens``
    positions are ``BOS`` markers. ``targets`` is ``PAD`` (ignored) except at the markers, where it
    is the data tokens in order. Where the data sit varies from row to row, so no fixed
    (time-invariant) kernel can pick them out; chance accuracy is ``1 / (vocab - N_SPECIAL)``.
    """
    check_positive_int("n_tokens", n_tokens)
    check_positive_int("length", length)
    if n_tokens > length:
        raise ValueError(f"n_tokens={n_tokens} data tokens do not fit in length={length} positions")
    data = _tokens(batch, n_tokens, vocab, generator, device)
    where = torch.rand(batch, length, generator=generator).argsort(-1)[:, :n_tokens].sort(-1).values.to(device)
    inputs = torch.full((batch, length + n_tokens), PAD, dtype=torch.long, device=data.device)
    inputs.scatter_(1, where, data)
    inputs[:, length:] = BOS
    targets = torch.full_like(inputs, PAD)
    targets[:, length:] = data
    return inputs, targets


def induction_heads(batch: int, length: int, vocab: int, *, generator: torch.Generator | None = None,
                    device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Induction heads (Olsson et al. 2022; Gu & Dao 2023, Table 2): ``inputs, targets (batch, length)``.

    Random data tokens (``2 .. vocab-1``) with the trigger ``BOS`` once at a random position ``p`` in
    ``0 .. length-3`` and again at the last position; the answer is the token after the first trigger,
    ``inputs[p + 1]``. ``targets`` is ``PAD`` (ignored) except at the last position, which holds the
    answer: the model must recall "what followed the trigger last time". Chance is ``1 / (vocab - N_SPECIAL)``.
    """
    check_positive_int("length", length)
    if length < 3:
        raise ValueError(f"induction_heads: length must be >= 3 (trigger, answer, trigger), got {length}")
    inputs = _tokens(batch, length, vocab, generator, device)
    where = torch.randint(0, length - 2, (batch, 1), generator=generator).to(inputs.device)
    inputs.scatter_(1, where, BOS)
    inputs[:, -1] = BOS
    targets = torch.full_like(inputs, PAD)
    targets[:, -1] = inputs.gather(1, where + 1)[:, 0]
    return inputs, targets
