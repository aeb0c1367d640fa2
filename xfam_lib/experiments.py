"""Experiments that train several small models which differ in one component and compare them.

`length_extrapolation` (chapter 4, M4.15): decoder-only LMs that differ only in positional encoding,
trained at one length and evaluated at multiples of it.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from .tasks import LaggedTopicLanguage
from .train import cross_entropy, train_loop
from .transformer import TransformerLM


def length_extrapolation(kinds: Sequence[str] = ("none", "sinusoidal", "learned", "rope", "alibi", "t5"), *,
                         train_len: int = 32, factors: Sequence[int] = (1, 2, 4, 8), steps: int = 300,
                         batch: int = 32, d_model: int = 32, n_layers: int = 2, n_heads: int = 4,
                         lr: float = 3e-3, seed: int = 0, eval_tokens: int = 16384,
                         relative_max_distance: int | None = None, language: LaggedTopicLanguage | None = None,
                         device: torch.device | str = "cpu", progress: bool = False) -> dict:
    """Train one small `TransformerLM` per positional encoding at ``train_len``, evaluate at ``f * train_len``.

    Every arm sees the same initial seed, the same training batches and the same evaluation data; only
    ``positional`` differs. Relative encodings with a distance limit (T5 ``max_distance``, Shaw's
    clip) get ``relative_max_distance`` (default ``3 * train_len // 4``): distances beyond it share
    the last bucket, which training then sees often, as in the papers' settings. Returns a JSON-ready dict with
    ``loss[kind][L]`` (mean next-token loss over every position of length-``L`` sequences),
    ``oracle[L]`` (the same average of the true process's loss given the topic), ``per_position[kind]``
    (loss at each position of the longest length), ``train_loss[kind]`` (per step) and ``config``.
    """
    language = language or LaggedTopicLanguage()
    relative_max_distance = relative_max_distance or 3 * train_len // 4
    lengths = [train_len * f for f in factors]
    eval_gen = torch.Generator().manual_seed(10_000 + seed)
    eval_sets = {L: language.sample(max(1, eval_tokens // L), L + 1, generator=eval_gen, device=device)
                 for L in lengths}
    result = {"config": dict(kinds=list(kinds), train_len=train_len, factors=list(factors), steps=steps, batch=batch,
                             d_model=d_model, n_layers=n_layers, n_heads=n_heads, lr=lr, seed=seed,
                             eval_tokens=eval_tokens, relative_max_distance=relative_max_distance,
                             vocab=language.vocab, lag=language.lag,
                             p_rule=language.p_rule, topic_size=language.topic_size),
              "oracle": {L: float(-eval_sets[L][1][:, 1:].mean()) for L in lengths},
              "loss": {}, "per_position": {}, "train_loss": {}}
    for kind in kinds:
        torch.manual_seed(seed)
        model = TransformerLM(language.vocab, d_model, n_layers, n_heads, positional=kind, max_len=max(lengths),
                              relative_max_distance=relative_max_distance).to(device)
        train_gen = torch.Generator().manual_seed(seed)

        def loss_fn(m, step):
            seq, _ = language.sample(batch, train_len + 1, generator=train_gen, device=device)
            return cross_entropy(m(seq[:, :-1]), seq[:, 1:])

        result["train_loss"][kind] = train_loop(model, loss_fn, steps=steps, lr=lr, warmup=steps // 10,
                                                progress=progress, desc=kind)
        result["loss"][kind], result["per_position"][kind] = {}, None
        with torch.no_grad():
            for L in lengths:
                seq, _ = eval_sets[L]
                logits = model(seq[:, :-1])
                nll = F.cross_entropy(logits.transpose(1, 2).float(), seq[:, 1:], reduction="none")   # (n, L)
                result["loss"][kind][L] = float(nll.mean())
                if L == max(lengths):
                    result["per_position"][kind] = nll.mean(0).tolist()
    return result
