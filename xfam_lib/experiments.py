"""Experiments that train several small models which differ in one component and compare them.

`length_extrapolation` (chapter 4, M4.15): decoder-only LMs that differ only in positional encoding,
trained at one length and evaluated at multiples of it.

`xl_delayed_copy` (chapter 5, M5.1): Transformer-XL models that differ only in memory length, trained
to copy the token read ``delay`` steps back while reading a stream one segment at a time.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from .memory import TransformerXL
from .tasks import PAD, LaggedTopicLanguage, delayed_copy
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


def stream_logits(model: TransformerXL, ids: torch.Tensor, segment_len: int) -> torch.Tensor:
    """Run ``ids (B, T)`` through ``model`` one segment at a time, carrying the memories: ``(B, T, vocab)``."""
    mems, outs = None, []
    for start in range(0, ids.shape[1], segment_len):
        out, mems = model(ids[:, start:start + segment_len], mems)
        outs.append(out)
    return torch.cat(outs, dim=1)


def xl_delayed_copy(mem_len: int, delay: int, *, seed: int = 0, steps: int = 150, vocab: int = 18,
                    d_model: int = 32, n_layers: int = 2, n_heads: int = 2, segment_len: int = 16,
                    n_segments: int = 5, batch: int = 16, lr: float = 3e-3, eval_segments: int = 8,
                    eval_batch: int = 64, device: torch.device | str = "cpu") -> tuple[float, list[float]]:
    """Train a `TransformerXL` with ``mem_len`` on `delayed_copy`; return (test accuracy, loss per step).

    Training streams ``n_segments`` segments of ``segment_len`` tokens, carrying the memories (gradient
    stopped, as in Dai et al. 2019); the loss is the mean cross-entropy over the positions with a
    target. ``mem_len=0`` is the vanilla segment-by-segment model. Accuracy is the share of target
    positions whose argmax is right, on fresh streams of ``eval_segments`` segments (seed ``10_000 + seed``).
    """
    torch.manual_seed(seed)
    model = TransformerXL(vocab, d_model, n_layers, n_heads=n_heads, d_ff=4 * d_model, mem_len=mem_len).to(device)
    opt = torch.optim.Adam(model.parameters(), lr)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        ids, targets = delayed_copy(batch, segment_len * n_segments, vocab, delay, generator=gen, device=device)
        logits = stream_logits(model, ids, segment_len)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    ids, targets = delayed_copy(eval_batch, segment_len * eval_segments, vocab, delay,
                                generator=torch.Generator().manual_seed(10_000 + seed), device=device)
    with torch.no_grad():
        hits = (stream_logits(model, ids, segment_len).argmax(-1) == targets) & (targets != PAD)
    return hits.sum().item() / (targets != PAD).sum().item(), losses
