"""Ablations: small models that differ in one component, trained side by side and compared.

`length_extrapolation` (chapter 4): decoder-only LMs that differ only in positional encoding,
trained at one length and evaluated at multiples of it; `char_length_extrapolation` does the same
on Tiny Shakespeare, chapter 1's character corpus, reporting the loss at every position.

`xl_delayed_copy` (chapter 5): Transformer-XL models that differ only in memory length, trained
to copy the token read ``delay`` steps back while reading a stream one segment at a time.

`train_parity` (chapter 6): a GRU cell (`ParityACT`) or Graves's tanh RNN cell (`ParityACTGraves`)
with an ACT halting unit on Graves's parity;
`train_permutation_act`: the same idea (`PermutationACT`) on applying a permutation k times.
`train_spans` (chapter 6): a small decoder of adaptive-span attention layers (`SpanLM`) on a
lagged-topic language, returning the learned spans per head.
`train_ut_seq2seq` (chapter 6): a Universal Transformer (one tied layer, `UTSeq2Seq` with
``tied=True``) against ``T`` untied layers of the same width, on copy and reverse.

`train_recall` (chapter 8): a small model (`RecallNet`) whose token mixer is softmax or
linear attention, trained on multi-query associative recall (`tasks.mqar`).
`train_sparse_recall` (chapter 7): `RecallNet`'s architecture with five attention
patterns (dense, window, window + global, BigBird, LSH), trained side by side (`StackedRecallNet`) on `mqar`.
"""
from __future__ import annotations

import statistics
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .adaptive import AdaptiveSpanAttention, UniversalTransformer, act_halting
from .attention import scaled_dot_product_attention
from .linear import linear_attention
from .memory import TransformerXL
from .positional import sinusoidal_encoding, ut_coordinate_encoding
from .ssm import H3Layer, MambaBlock, S4DLayer
from .tasks import BOS, N_SPECIAL, PAD, LaggedTopicLanguage, ModeBigramLanguage, cyclic_permutation, delayed_copy, mqar, parity_task, permutation_steps
from .tasks import copy_task, induction_heads, reverse_task, selective_copying
from .train import cross_entropy, progress_range, train_loop
from .transformer import EncoderLayer, TransformerLM, count_params
from . import sparse
from .utils import check_bool, check_instance, check_positive_int, check_token_ids


def length_extrapolation(kinds: Sequence[str] = ("none", "sinusoidal", "learned", "rope", "alibi", "t5"), *,
                         train_len: int = 32, factors: Sequence[int] = (1, 2, 4, 8), steps: int = 300,
                         batch: int = 32, d_model: int = 32, n_layers: int = 2, n_heads: int = 4,
                         lr: float = 3e-3, seed: int = 0, eval_tokens: int = 16384,
                         relative_max_distance: int | None = None, language: LaggedTopicLanguage | None = None,
                         device: torch.device | str = "cpu", progress: bool = True) -> dict:
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


def char_length_extrapolation(kinds: Sequence[str] = ("sinusoidal", "rope", "alibi"), *, train_len: int = 64,
                              factor: int = 4, steps: int = 600, batch: int = 32, d_model: int = 64,
                              n_layers: int = 2, n_heads: int = 4, lr: float = 3e-3, seed: int = 0,
                              eval_windows: int = 64, device: torch.device | str = "cpu") -> dict:
    """Train one character `TransformerLM` per positional encoding on Tiny Shakespeare windows of
    ``train_len`` characters, then score windows ``factor`` times as long from the validation text.

    Every arm starts from the same seed and sees the same training windows and the same
    ``eval_windows`` validation windows; only ``positional`` differs. Returns a JSON-ready dict with
    ``per_position[kind]`` (mean next-character loss in nats at each of the ``factor * train_len``
    positions), ``train_loss[kind]`` (per step) and ``config``.
    """
    from .text import get_batch, tiny_shakespeare                 # the corpus loads only when asked for

    check_positive_int("factor", factor)
    check_positive_int("eval_windows", eval_windows)
    for kind in kinds:
        if kind not in TransformerLM.POSITIONAL:
            raise ValueError(f"kinds must hold names from {TransformerLM.POSITIONAL}, got {kind!r}")
    corpus = tiny_shakespeare()
    long_len = factor * check_positive_int("train_len", train_len)
    eval_x, eval_y = get_batch(corpus.val, eval_windows, long_len,
                               generator=torch.Generator().manual_seed(10_000 + seed), device=device)
    result = {"config": dict(kinds=list(kinds), train_len=train_len, factor=factor, steps=steps, batch=batch,
                             d_model=d_model, n_layers=n_layers, n_heads=n_heads, lr=lr, seed=seed,
                             eval_windows=eval_windows, vocab=len(corpus.vocab)),
              "per_position": {}, "train_loss": {}}
    for kind in kinds:
        torch.manual_seed(seed)
        model = TransformerLM(len(corpus.vocab), d_model, n_layers, n_heads, positional=kind,
                              max_len=long_len).to(device)
        train_gen = torch.Generator().manual_seed(seed)

        def loss_fn(m, step):
            x, y = get_batch(corpus.train, batch, train_len, generator=train_gen, device=device)
            return cross_entropy(m(x), y)

        result["train_loss"][kind] = train_loop(model, loss_fn, steps=steps, lr=lr, warmup=steps // 10,
                                                progress=False, desc=kind)
        model.eval()
        with torch.no_grad():
            nll = F.cross_entropy(model(eval_x).transpose(1, 2).float(), eval_y, reduction="none")
        result["per_position"][kind] = nll.mean(0).tolist()
    return result


def stream_logits(model: TransformerXL, ids: torch.Tensor, segment_len: int) -> torch.Tensor:
    """Run ``ids (B, T)`` through ``model`` one segment at a time, carrying the memories: ``(B, T, vocab)``."""
    check_instance("model", model, TransformerXL)
    check_token_ids("ids", ids, model.vocab, rank=2)
    segment_len = check_positive_int("segment_len", segment_len)
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
    for _ in progress_range(steps, "delayed copy"):
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


class ParityACT(nn.Module):
    """GRU cell + ACT halting unit + parity read-out. ``forward(x (B, n_bits)) -> (logit (B,), ponder (B,), N (B,))``."""

    def __init__(self, n_bits: int, hidden: int, max_steps: int, threshold: float = 0.99):
        super().__init__()
        self.cell = nn.GRUCell(n_bits + 1, hidden)
        self.halt = nn.Linear(hidden, 1)
        nn.init.constant_(self.halt.bias, 1.0)          # Graves's initial bias: start by halting early
        self.out = nn.Linear(hidden, 1)
        self.hidden, self.max_steps, self.threshold = hidden, max_steps, threshold

    def forward(self, x):
        first = torch.cat([x, torch.ones_like(x[:, :1])], -1)        # the first-step flag
        later = torch.cat([x, torch.zeros_like(x[:, :1])], -1)

        def step(h, n):
            h = self.cell(first if n == 0 else later, h)
            return h, torch.sigmoid(self.halt(h)).squeeze(-1)

        res = act_halting(step, x.new_zeros(x.shape[0], self.hidden), self.threshold, self.max_steps)
        return self.out(res.output).squeeze(-1), res.ponder, res.n_updates


class ParityACTGraves(ParityACT):
    """Graves's (2016, Sec. 3.1) parity network: a simple tanh RNN cell + ACT halting unit + one output.

    The same as `ParityACT` except for the cell: ``h' = tanh(W [x, flag] + U h + b)`` (``nn.RNNCell``)
    instead of a GRU. Each example is a sequence of length 1; at every ponder step the cell reads the
    vector again with a flag that is 1 on the first step only; the halting unit is ``sigmoid(w . h + b)``
    with ``b = 1`` at init. ``forward(x (B, n_bits)) -> (logit (B,), ponder (B,), N (B,))``.
    """

    def __init__(self, n_bits: int, hidden: int, max_steps: int, threshold: float = 0.99):
        super().__init__(n_bits, hidden, max_steps, threshold)
        self.cell = nn.RNNCell(n_bits + 1, hidden, nonlinearity="tanh")


def train_parity(n_bits: int = 8, hidden: int = 128, max_steps: int = 12, tau: float = 1e-3, steps: int = 3000,
                 batch: int = 128, lr: float = 3e-3, seed: int = 0, eval_batch: int = 8000, cell: str = "gru") -> dict:
    """Train one `ParityACT` (``cell="gru"``) or `ParityACTGraves` (``cell="tanh"``); return the mean
    ponder cost, steps N and accuracy per difficulty."""
    if cell not in ("gru", "tanh"):
        raise ValueError(f"cell must be 'gru' or 'tanh', got {cell!r}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = (ParityACT if cell == "gru" else ParityACTGraves)(n_bits, hidden, max_steps)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in progress_range(steps, "parity"):
        x, y, _ = parity_task(batch, n_bits, generator=gen)
        logit, ponder, _ = model(x)
        loss = F.binary_cross_entropy_with_logits(logit, y.float()) + tau * ponder.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, y, k = parity_task(eval_batch, n_bits, generator=gen)
        logit, ponder, n_upd = model(x)
    correct = ((logit > 0).long() == y).double()
    per = {d: k == d for d in range(1, n_bits + 1)}
    return {"ponder": [ponder[m].mean().item() for m in per.values()],
            "n_updates": [n_upd[m].mean().item() for m in per.values()],
            "accuracy": [correct[m].mean().item() for m in per.values()]}


class PermutationACT(nn.Module):
    """ACT on `tasks.permutation_steps`. ``forward(start (B,), k (B,)) -> (logits (B, n_items), ponder (B,), N (B,))``.

    A GRU cell reads the start item (one-hot) at the first step only and zeros afterwards, so its
    state after step ``n`` depends on the start alone: to answer it must carry the item and apply the
    permutation step by step. The halting unit sees the state and ``k`` (one-hot), so ACT can learn
    *when* to stop; nothing tells it to stop at step ``k``.
    """

    def __init__(self, n_items: int, max_k: int, hidden: int, max_steps: int, threshold: float = 0.99):
        super().__init__()
        self.cell = nn.GRUCell(n_items, hidden)
        self.halt = nn.Linear(hidden + max_k, 1)
        nn.init.constant_(self.halt.bias, 1.0)          # Graves's initial bias, as in `ParityACT`
        self.out = nn.Linear(hidden, n_items)
        self.n_items, self.max_k, self.hidden = n_items, max_k, hidden
        self.max_steps, self.threshold = max_steps, threshold

    def forward(self, start, k):
        dtype = self.out.weight.dtype
        first = F.one_hot(start, self.n_items).to(dtype)
        k_hot = F.one_hot(k - 1, self.max_k).to(dtype)

        def step(h, n):
            h = self.cell(first if n == 0 else torch.zeros_like(first), h)
            return h, torch.sigmoid(self.halt(torch.cat([h, k_hot], -1))).squeeze(-1)

        res = act_halting(step, first.new_zeros(len(start), self.hidden), self.threshold, self.max_steps)
        return self.out(res.output), res.ponder, res.n_updates


def train_permutation_act(n_items: int = 16, max_k: int = 6, hidden: int = 32, max_steps: int = 12,
                          tau: float = 1e-2, steps: int = 1500, batch: int = 128, lr: float = 3e-3, seed: int = 0,
                          eval_batch: int = 6000) -> dict:
    """Train one `PermutationACT` on `cyclic_permutation` (seeded by ``seed``); return the mean ponder
    cost, steps N and accuracy per difficulty ``k = 1 .. max_k``."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    perm = cyclic_permutation(n_items, seed=seed)
    model = PermutationACT(n_items, max_k, hidden, max_steps)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in progress_range(steps, "permutation"):
        start, k, y = permutation_steps(batch, perm, max_k, generator=gen)
        logits, ponder, _ = model(start, k)
        loss = F.cross_entropy(logits, y) + tau * ponder.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        start, k, y = permutation_steps(eval_batch, perm, max_k, generator=gen)
        logits, ponder, n_upd = model(start, k)
    correct = (logits.argmax(-1) == y).double()
    per = [k == d for d in range(1, max_k + 1)]
    return {"ponder": [ponder[m].mean().item() for m in per], "n_updates": [n_upd[m].mean().item() for m in per],
            "accuracy": [correct[m].mean().item() for m in per]}


class SpanLM(nn.Module):
    """Pre-LN decoder: ``n_layers`` x (AdaptiveSpanAttention + GELU FFN). ``forward(ids (B, L)) -> logits (B, L, vocab)``."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, max_span: int, ramp: int,
                 init_span: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.attn = nn.ModuleList(AdaptiveSpanAttention(d_model, n_heads, max_span, ramp, init_span=init_span)
                                  for _ in range(n_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.ffn = nn.ModuleList(nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                               nn.Linear(4 * d_model, d_model)) for _ in range(n_layers))
        self.out = nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, vocab))

    def forward(self, ids):
        check_token_ids("ids", ids, self.embed.num_embeddings, rank=2)
        h = self.embed(ids) + sinusoidal_encoding(ids.shape[1], self.embed.embedding_dim, device=ids.device)
        for attn, norm, ffn in zip(self.attn, self.norms, self.ffn):
            h = h + attn(norm(h))
            h = h + ffn(h)
        return self.out(h)

    def span_penalty(self):
        return sum(a.span_penalty() for a in self.attn)


def train_spans(*, vocab=32, lag=12, p_rule=0.7, topic_size=6, n_modes=0, d_model=32, n_heads=4, n_layers=2,
                length=32, ramp=4, init_span=16.0, coef=3e-3, steps=2000, batch=32, lr=3e-3, span_lr=2e-2, seed=0,
                device=None) -> dict:
    """Train one `SpanLM`; return its spans ``(n_layers, n_heads)``, the last 50 steps' mean loss and the
    true process's loss (``oracle_loss``, on 512 fresh sequences). The language is `LaggedTopicLanguage`
    (``lag``, ``p_rule``, ``topic_size``), or `ModeBigramLanguage` (``n_modes``, ``p_rule``) when ``n_modes > 0``."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if n_modes:
        lang = ModeBigramLanguage(vocab, n_modes=n_modes, p_rule=p_rule, seed=seed)
    else:
        lang = LaggedTopicLanguage(vocab, lag=lag, p_rule=p_rule, topic_size=topic_size, seed=seed)
    model = SpanLM(vocab, d_model, n_heads, n_layers, length, ramp, init_span).to(device)
    spans = [p for n, p in model.named_parameters() if n.endswith("span_logit")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("span_logit")]
    opt = torch.optim.Adam([{"params": rest}, {"params": spans, "lr": span_lr}], lr=lr)
    losses = []
    for _ in progress_range(steps, "adaptive span"):
        ids, _ = lang.sample(batch, length + 1, generator=gen, device=device)
        ce = F.cross_entropy(model(ids[:, :-1]).reshape(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        (ce + coef * model.span_penalty()).backward()
        opt.step()
        losses.append(ce.item())
    oracle_logp = lang.sample(512, length + 1, generator=torch.Generator().manual_seed(10_000 + seed))[1]
    return {"spans": [a.spans.detach().cpu().tolist() for a in model.attn],
            "final_loss": sum(losses[-50:]) / len(losses[-50:]), "oracle_loss": -oracle_logp[:, 1:].mean().item()}


class UTSeq2Seq(nn.Module):
    """Encoder-only token-to-token model with ``n_steps`` layers, tied (a Universal Transformer) or untied.

    ``forward(ids (B, L)) -> logits (B, L, vocab)``: an embedding scaled by ``sqrt(d_model)``, then
    ``n_steps`` applications of an `EncoderLayer` (Post-LN, no mask), then a linear head. With
    ``tied=True`` the core is `adaptive.UniversalTransformer` (one layer applied ``n_steps`` times, ACT
    off). With ``tied=False`` it is ``n_steps`` separate layers that get the *same* input treatment:
    ``ut_coordinate_encoding`` (position + step sinusoids) is added before layer ``t`` exactly as the UT
    adds it before step ``t``. The two models then differ only in whether the layers share weights (for
    untied layers the step sinusoid is redundant, each layer knowing its depth by its weights, but harmless),
    and with ``n_steps=1`` they are the same model.
    """

    def __init__(self, vocab: int, d_model: int, n_heads: int, d_ff: int, n_steps: int, *, tied: bool = True):
        super().__init__()
        check_positive_int("n_steps", n_steps)
        self.tied, self.n_steps = check_bool("tied", tied), n_steps
        self.embed = nn.Embedding(vocab, d_model)
        if self.tied:
            self.core = UniversalTransformer(d_model, n_heads, d_ff, n_steps)
        else:
            self.core = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff) for _ in range(n_steps))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("ids", ids, self.embed.num_embeddings, rank=2)
        d = self.embed.embedding_dim
        h = self.embed(ids) * d ** 0.5
        if self.tied:
            h = self.core(h)
        else:
            coords = ut_coordinate_encoding(ids.shape[1], self.n_steps, d, device=h.device, dtype=h.dtype)
            for t, layer in enumerate(self.core):
                h = layer(h + coords[t])
        return self.head(h)


def train_ut_seq2seq(task: str, n_steps: int, *, tied: bool, seed: int = 0, length: int = 12, vocab: int = 12,
                     d_model: int = 32, n_heads: int = 4, d_ff: int = 64, steps: int = 600, batch: int = 64,
                     lr: float = 1e-3, warmup: int = 50, eval_batch: int = 2000, device=None) -> dict:
    """Train one `UTSeq2Seq` on ``task`` (``"copy"``: ``tgt = src``; ``"reverse"``: ``tgt[i] = src[L-1-i]``,
    `tasks.copy_task` / `tasks.reverse_task`); return the per-token accuracy on ``eval_batch`` fresh
    sequences, the parameter count and the mean loss of the last 50 steps. The initialisation uses
    ``torch.manual_seed(seed)`` and the data a generator seeded with ``seed``; evaluation sequences come from
    a separate generator (``10_000 + seed``)."""
    tasks_ = {"copy": copy_task, "reverse": reverse_task}
    if task not in tasks_:
        raise ValueError(f"task must be one of {sorted(tasks_)}, got {task!r}")
    make = tasks_[task]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = UTSeq2Seq(vocab, d_model, n_heads, d_ff, n_steps, tied=tied).to(device)

    def loss_fn(m, step):
        src, tgt = make(batch, length, vocab, generator=gen, device=device)
        return cross_entropy(m(src), tgt)

    losses = train_loop(model, loss_fn, steps=steps, lr=lr, warmup=warmup)
    src, tgt = make(eval_batch, length, vocab, generator=torch.Generator().manual_seed(10_000 + seed), device=device)
    with torch.no_grad():
        acc = (model(src).argmax(-1) == tgt).double().mean().item()
    return {"accuracy": acc, "params": count_params(model), "final_loss": sum(losses[-50:]) / len(losses[-50:])}


# ----------------------------------------------------------------------------- chapter 7
class _PairBlock(nn.Module):
    """A `RevBlock` as a module of one tensor ``(..., 2d)`` (its two halves), for `checkpointed_sequence`."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return torch.cat(self.block(*x.chunk(2, dim=-1)), dim=-1)


def activation_memory(depths: Sequence[int] = (1, 2, 4, 8, 16), *, d: int = 64, n_tokens: int = 256,
                      seed: int = 0) -> dict:
    """Memory of a stack of `RevBlock` s (F, G: ``d -> 2d -> d`` tanh MLPs) trained three ways:
    ``plain`` (autograd keeps every block's activations), ``checkpointed`` (`checkpointed_sequence`:
    each block's input only, the inside recomputed) and ``reversible`` (`reversible_sequence`: the
    outputs only, inputs rebuilt by the inverse). The weights are frozen, so only activations count.

    For each depth: ``held`` = bytes of tensors created by the forward pass and still alive when it
    ends (what waits for backward), ``peak`` = `bench.peak_memory` of forward + backward, ``seconds``
    = wall time of one forward + backward (after a warm-up, one run). Returns ``{"depths", "held": {mode: [...]}, "peak": ..., "seconds": ...}``.
    """
    import time

    from .bench import _LiveTensorBytes, peak_memory
    from .sparse import RevBlock, checkpointed_sequence, reversible_sequence

    x = torch.randn(n_tokens, 2 * d, generator=torch.Generator().manual_seed(seed))
    modes = ("plain", "checkpointed", "reversible")
    out = {"depths": list(depths), "config": dict(d=d, n_tokens=n_tokens, seed=seed),
           "held": {m: [] for m in modes}, "peak": {m: [] for m in modes}, "seconds": {m: [] for m in modes}}
    for depth in depths:
        torch.manual_seed(seed)
        mlp = lambda: nn.Sequential(nn.Linear(d, 2 * d), nn.Tanh(), nn.Linear(2 * d, d))
        blocks = [RevBlock(mlp(), mlp()).requires_grad_(False) for _ in range(depth)]
        pairs = [_PairBlock(b) for b in blocks]

        def forward(mode, inp):
            if mode == "reversible":
                return torch.cat(reversible_sequence(blocks, *inp.chunk(2, dim=-1)), dim=-1)
            if mode == "checkpointed":
                return checkpointed_sequence(pairs, inp)
            for pb in pairs:
                inp = pb(inp)
            return inp

        for mode in modes:
            inp = x.clone().requires_grad_()
            with _LiveTensorBytes() as tracker:
                y = forward(mode, inp)
            out["held"][mode].append(int(tracker.live))
            del y

            def step():
                inp = x.clone().requires_grad_()
                return torch.autograd.grad(forward(mode, inp).square().sum(), inp)

            out["peak"][mode].append(int(peak_memory(step)))
            step()                                                      # warm-up, then time without tracking
            start = time.perf_counter()
            step()
            out["seconds"][mode].append(time.perf_counter() - start)
    return out


# ----------------------------------------------------------------------------- Chapter 8
class RecallNet(nn.Module):
    """A small causal sequence model whose token mixer is softmax or linear attention, for recall tasks.

    ``forward(ids (B, L)) -> logits (B, L, vocab)``. Embeddings plus learned positions, then a width-2
    causal token shift (each position also sees the previous token, as the short convolutions of
    Zoology's models do, so a key can be bound to the value after it in one layer), then ``n_layers``
    pre-norm blocks of ``mixer`` and an MLP. ``mixer="softmax"``: `scaled_dot_product_attention`
    (causal); ``"linear"``: `linear_attention` (elu+1, causal, chunk mode), whose state is one
    ``d_head x d_head`` matrix per head whatever the length.
    """

    MIXERS = ("softmax", "linear")

    def __init__(self, vocab: int, d_model: int = 64, n_heads: int = 2, n_layers: int = 2, *, mixer: str = "softmax",
                 max_len: int = 512):
        super().__init__()
        if mixer not in self.MIXERS:
            raise ValueError(f"mixer must be one of {self.MIXERS}, got {mixer!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got d_model={d_model}, n_heads={n_heads}")
        self.mixer, self.n_heads = mixer, n_heads
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        self.shift = nn.Linear(2 * d_model, d_model)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(2 * n_layers))
        self.qkv = nn.ModuleList(nn.Linear(d_model, 3 * d_model) for _ in range(n_layers))
        self.out = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(n_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))
                                 for _ in range(n_layers))
        self.head = nn.Linear(d_model, vocab)

    def _mix(self, i: int, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv[i](x).view(B, L, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.mixer == "softmax":
            y = scaled_dot_product_attention(q, k, v, causal=True)
        else:
            y = linear_attention(q, k, v, feature_map="elu", causal=True, mode="chunk", chunk_size=32)
        return self.out[i](y.transpose(1, 2).reshape(B, L, D))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("ids", ids, self.embed.num_embeddings, rank=2)
        if ids.shape[1] > self.pos.shape[0]:
            raise ValueError(f"ids of shape {tuple(ids.shape)} are longer than max_len={self.pos.shape[0]}")
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        prev = F.pad(x, (0, 0, 1, 0))[:, :-1]                          # the previous token's embedding
        x = self.shift(torch.cat([x, prev], dim=-1))
        for i in range(len(self.qkv)):
            x = x + self._mix(i, self.norms[2 * i](x))
            x = x + self.mlp[i](self.norms[2 * i + 1](x))
        return self.head(x)


def train_recall(mixer: str, n_pairs: int, *, seed: int = 0, steps: int = 600, vocab: int | None = None,
                 d_model: int = 64, n_heads: int = 2, n_layers: int = 2, batch: int = 32, lr: float = 3e-3,
                 eval_batch: int = 256, device: torch.device | str = "cpu") -> tuple[float, list[float]]:
    """Train a `RecallNet` with ``mixer`` on `mqar` with ``n_pairs`` pairs; return (test accuracy, loss per step).

    Every query of the sequence is a prediction (loss and accuracy over the query positions only).
    ``vocab`` defaults to ``4 n_pairs + 2``: ``2 n_pairs`` key tokens (each sequence uses half of them) and
    ``2 n_pairs`` value tokens. Accuracy is measured on fresh sequences (seed ``10_000 + seed``).
    """
    vocab = vocab or 4 * n_pairs + 2
    torch.manual_seed(seed)
    model = RecallNet(vocab, d_model, n_heads, n_layers, mixer=mixer, max_len=3 * n_pairs).to(device)
    gen = torch.Generator().manual_seed(seed)

    def loss_fn(m, step):
        ids, targets = mqar(batch, n_pairs, vocab, generator=gen, device=device)
        return cross_entropy(m(ids), targets, ignore_index=PAD)

    losses = train_loop(model, loss_fn, steps=steps, lr=lr, warmup=steps // 10)
    ids, targets = mqar(eval_batch, n_pairs, vocab, generator=torch.Generator().manual_seed(10_000 + seed), device=device)
    with torch.no_grad():
        pred = model(ids).argmax(-1)
    keep = targets != PAD
    return ((pred == targets) & keep).sum().item() / keep.sum().item(), losses



def attention_by_distance(model: nn.Module, ids: torch.Tensor) -> dict:
    """Mean causal attention weight by relative position ``i - j``, averaged over every
    `MultiHeadAttention` of ``model``, its heads, the batch and the queries ``i >= L/2`` (so every distance
    up to ``L/2`` is seen by every query counted). Returns ``{"by_distance": [L/2 + 1 values for i - j =
    0..L/2], "first_token": mean weight on key 0 of those queries, "first_token_max_head": the same for the
    head that puts most weight there, "uniform": the mean of 1 / (number of keys), "mean_weights": the
    (L, L) mean weights as nested lists}``."""
    from .transformer import attention_weights

    with torch.no_grad():
        per_head = torch.cat([w.float().mean(dim=0) for w in attention_weights(model, ids).values()])   # (heads, L, L)
    weights = per_head.mean(0)
    L = weights.shape[-1]
    rows = torch.arange(L // 2, L)
    by_distance = [float(weights[rows, rows - r].mean()) for r in range(L // 2 + 1)]
    return {"by_distance": by_distance, "first_token": float(weights[rows, 0].mean()),
            "first_token_max_head": float(per_head[:, rows, 0].mean(-1).max()),
            "uniform": float((1.0 / (rows + 1).double()).mean()), "mean_weights": weights.tolist()}


def train_sink_lm(*, seed: int = 0, steps: int = 300, length: int = 64, lag: int = 3, vocab: int = 32,
                  d_model: int = 32, n_layers: int = 2, n_heads: int = 4, batch: int = 32, lr: float = 3e-3) -> dict:
    """Train a small `TransformerLM` (RoPE) on a `LaggedTopicLanguage` with rule lag ``lag`` and measure
    `attention_by_distance` before and after training on the same held-out batch: recency shows as
    weight near ``i - j = lag``, a sink as weight on token 0 above the uniform share."""
    language = LaggedTopicLanguage(vocab, lag=lag, seed=seed)
    eval_ids, _ = language.sample(64, length, generator=torch.Generator().manual_seed(10_000 + seed))
    torch.manual_seed(seed)
    model = TransformerLM(vocab, d_model, n_layers, n_heads)
    before = attention_by_distance(model, eval_ids)
    gen = torch.Generator().manual_seed(seed)

    def loss_fn(m, step):
        seq, _ = language.sample(batch, length + 1, generator=gen)
        return cross_entropy(m(seq[:, :-1]), seq[:, 1:])

    losses = train_loop(model, loss_fn, steps=steps, lr=lr, warmup=steps // 10)
    return {"before": before, "after": attention_by_distance(model, eval_ids), "final_loss": float(sum(losses[-20:]) / 20),
            "config": dict(seed=seed, steps=steps, length=length, lag=lag, vocab=vocab, d_model=d_model,
                           n_layers=n_layers, n_heads=n_heads, batch=batch, lr=lr)}


# ----------------------------------------------------------------------------- chapter 9: LTI vs selective SSMs
_SSM_KINDS = ("s4d", "h3", "mamba")


class SSMLM(nn.Module):
    """A small token model of one SSM kind: embedding, ``n_layers`` pre-norm residual SSM layers, read-out.

    ``kind``: ``"s4d"`` (`S4DLayer`, time-invariant), ``"h3"`` (`H3Layer`, time-invariant kernels with
    multiplicative gates) or ``"mamba"`` (`MambaBlock`, selective). ``ids (B, L)`` → logits ``(B, L, vocab)``.
    The Mamba layers run the chunked scan with chunks of about ``sqrt(L)``.
    """

    def __init__(self, kind: str, vocab: int, d_model: int = 16, n_layers: int = 2, d_state: int = 8):
        super().__init__()
        if kind not in _SSM_KINDS:
            raise ValueError(f"SSMLM: kind must be one of {_SSM_KINDS}, got {kind!r}")
        make = {"s4d": lambda: S4DLayer(d_model, d_state), "h3": lambda: H3Layer(d_model, d_state),
                "mamba": lambda: MambaBlock(d_model, d_state)}[kind]
        self.kind = kind
        self.embed = nn.Embedding(vocab, d_model)
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layers)])
        self.layers = nn.ModuleList([make() for _ in range(n_layers)])
        self.norm_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("ids", ids, self.embed.num_embeddings, rank=2)
        h = self.embed(ids)
        chunk = max(4, int(ids.shape[1] ** 0.5))
        for norm, layer in zip(self.norms, self.layers):
            x = norm(h)
            h = h + (layer(x, chunk_size=chunk) if self.kind == "mamba" else layer(x))
        return self.head(self.norm_f(h))


def _train_ssm_lm(kind, sample, *, vocab, d_model, n_layers, d_state, steps, lr, seed, device):
    """Train an `SSMLM` on batches ``sample(step) -> (inputs, targets)`` (``PAD`` targets ignored)."""
    torch.manual_seed(seed)
    model = SSMLM(kind, vocab, d_model, n_layers, d_state).to(device)

    def loss_fn(m, step):
        inputs, targets = sample(step)
        return cross_entropy(m(inputs), targets, ignore_index=PAD)

    losses = train_loop(model, loss_fn, steps=steps, lr=lr, warmup=steps // 10, desc=kind)
    return model.eval(), losses


def _masked_accuracy(model, inputs, targets) -> float:
    with torch.no_grad():
        pred = model(inputs).argmax(-1)
    keep = targets != PAD
    return float(((pred == targets) & keep).sum() / keep.sum())


def selective_copying_run(kind: str, *, length: int = 16, n_tokens: int = 4, vocab: int = 10, d_model: int = 16,
                          n_layers: int = 2, d_state: int = 8, steps: int = 200, batch: int = 16, lr: float = 5e-3,
                          seed: int = 0, eval_batch: int = 256, device: torch.device | str = "cpu") -> dict:
    """Train an `SSMLM` of ``kind`` on `selective_copying` (Gu & Dao 2023, Table 1).

    Fresh batches each step (generator seeded by ``seed``); the loss and the accuracy count only the
    ``n_tokens`` answer positions. Returns ``{"accuracy": float on eval_batch fresh sequences (seed
    10_000 + seed), "losses": [per step], "chance": 1 / (vocab - 2)}``.
    """
    gen = torch.Generator().manual_seed(seed)
    sample = lambda step: selective_copying(batch, length, n_tokens, vocab, generator=gen, device=device)
    model, losses = _train_ssm_lm(kind, sample, vocab=vocab, d_model=d_model, n_layers=n_layers, d_state=d_state,
                                  steps=steps, lr=lr, seed=seed, device=device)
    test = selective_copying(eval_batch, length, n_tokens, vocab, generator=torch.Generator().manual_seed(10_000 + seed),
                             device=device)
    return {"accuracy": _masked_accuracy(model, *test), "losses": losses, "chance": 1 / (vocab - 2)}


def induction_heads_run(kind: str, *, train_len: int = 32, test_lens: Sequence[int] = (32, 64, 128, 256),
                        vocab: int = 10, d_model: int = 16, n_layers: int = 2, d_state: int = 8, steps: int = 300,
                        batch: int = 32, lr: float = 5e-3, seed: int = 0, eval_batch: int = 256,
                        device: torch.device | str = "cpu") -> dict:
    """Train an `SSMLM` on `induction_heads` at ``train_len``; test at every length of ``test_lens``.

    The length generalisation of Gu & Dao 2023, Table 2. Returns ``{"accuracy": {L: float}, "losses":
    [per step], "chance": 1 / (vocab - 2)}``; test sequences use the generator seed ``10_000 + seed``.
    """
    gen = torch.Generator().manual_seed(seed)
    sample = lambda step: induction_heads(batch, train_len, vocab, generator=gen, device=device)
    model, losses = _train_ssm_lm(kind, sample, vocab=vocab, d_model=d_model, n_layers=n_layers, d_state=d_state,
                                  steps=steps, lr=lr, seed=seed, device=device)
    test_gen = torch.Generator().manual_seed(10_000 + seed)
    acc = {int(L): _masked_accuracy(model, *induction_heads(eval_batch, L, vocab, generator=test_gen, device=device))
           for L in test_lens}
    return {"accuracy": acc, "losses": losses, "chance": 1 / (vocab - 2)}


# ----------------------------------------------------------------------------- Chapter 7
SPARSE_RECALL_PATTERNS = ("dense", "window", "window + global", "BigBird", "LSH")
# MQAR with 16 pairs after 2 global tokens (50 positions): each sparse pattern keeps about a quarter of the
# pairs (window 6; window 4 + global; BigBird blocks of 2; LSH chunks of 6, one round)
SPARSE_RECALL_EQUAL_PAIRS = {"n_pairs": 16, "n_global": 2, "window": 6, "global_window": 4, "block": 2,
                             "n_buckets": 8, "chunk_len": 6, "n_rounds": 1}


def sparse_recall_mask(pattern: str, length: int, *, n_global: int, window: int, block: int,
                       seed: int = 0) -> torch.Tensor | None:
    """The two-sided ``(length, length)`` mask of ``pattern`` for `train_sparse_recall`; None for "LSH".

    "window": `sparse.sliding_window_mask`; "window + global": `sparse.longformer_mask` with the first
    ``n_global`` positions global; "BigBird": `sparse.bigbird_layout` with blocks of ``block``, one
    window block on each side, one random block (drawn with ``seed``) and the first ``n_global //
    block`` blocks global. LSH pairs depend on the content, so it has no fixed mask.
    """
    if pattern not in SPARSE_RECALL_PATTERNS:
        raise ValueError(f"pattern must be one of {SPARSE_RECALL_PATTERNS}, got {pattern!r}")
    if pattern == "dense":
        return torch.ones(length, length, dtype=torch.bool)
    if pattern == "window":
        return sparse.sliding_window_mask(length, window)
    if pattern == "window + global":
        return sparse.longformer_mask(length, window, 1, range(n_global))
    if pattern == "BigBird":
        if length % block or n_global % block:
            raise ValueError(f"BigBird needs length and n_global multiples of block, got length={length}, "
                             f"n_global={n_global}, block={block}")
        layout = sparse.bigbird_layout(length // block, 1, 1, n_global // block, seed)
        return sparse.expand_layout(layout, block)
    return None


class StackedRecallNet(nn.Module):
    """``M`` independent models of `RecallNet`'s architecture, two-sided, each with its own attention
    pattern, run in one batched pass (every weight has a leading model dimension).

    ``forward(ids (M, B, L)) -> logits (M, B, L, vocab)``. ``masks (M, L, L)`` boolean; the models
    with ``lsh[m]`` True use `sparse.lsh_attention` (shared QK: the query projection is also the key;
    fresh rotations for each ``hash_seed``) and ignore their mask. ``seeds[m]`` seeds model ``m``'s
    initial weights, so models with the same seed start from the same weights. While ``lsh_density``
    is a list, each forward appends, per layer, the share of pairs each LSH model scored
    (`sparse.lsh_pairs`, mean over batch and heads; a tensor with one entry per LSH model).
    """

    def __init__(self, vocab: int, length: int, masks: torch.Tensor, lsh: Sequence[bool], seeds: Sequence[int], *,
                 d_model: int = 32, n_heads: int = 2, n_layers: int = 2, n_buckets: int = 4, chunk_len: int = 4,
                 n_rounds: int = 2):
        super().__init__()
        if masks.dim() != 3 or masks.shape[1:] != (length, length) or not (len(lsh) == len(seeds) == len(masks)):
            raise ValueError(f"masks must be (M, {length}, {length}) with one lsh flag and one seed per model, got "
                             f"masks {tuple(masks.shape)}, {len(lsh)} lsh flags, {len(seeds)} seeds")
        if d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads, got d_model={d_model}, n_heads={n_heads}")
        self.register_buffer("masks", masks.bool())
        self.register_buffer("lsh", torch.tensor(list(lsh), dtype=torch.bool))
        self.n_heads, self.n_layers, self.hash_seed = n_heads, n_layers, 0
        self.lsh_density: list | None = None
        self.lsh_args = dict(n_buckets=n_buckets, chunk_len=chunk_len, n_rounds=n_rounds)
        D = d_model
        shapes = {"embed": (vocab, D), "pos": (length, D), "shift_w": (2 * D, D), "shift_b": (D,),
                  "head_w": (D, vocab), "head_b": (vocab,)}
        for i in range(n_layers):
            shapes.update({f"qkv{i}_w": (D, 3 * D), f"qkv{i}_b": (3 * D,), f"out{i}_w": (D, D), f"out{i}_b": (D,),
                           f"up{i}_w": (D, 2 * D), f"up{i}_b": (2 * D,), f"down{i}_w": (2 * D, D),
                           f"down{i}_b": (D,)})
            shapes.update({f"norm{j}{i}_{p}": (D,) for j in (1, 2) for p in "gb"})

        def init(name, shape, gen):                               # as nn.Embedding, nn.Linear, nn.LayerNorm
            if name == "embed":
                return torch.randn(shape, generator=gen)
            if name == "pos":
                return 0.02 * torch.randn(shape, generator=gen)
            if name.endswith("_w"):
                return (2 * torch.rand(shape, generator=gen) - 1) * shape[0] ** -0.5
            return torch.ones(shape) if name.endswith("_g") else torch.zeros(shape)

        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.p = nn.ParameterDict({n: nn.Parameter(torch.stack([init(n, s, g) for g in gens]))
                                   for n, s in shapes.items()})

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        M, B, L, _ = x.shape
        y = torch.baddbmm(self.p[name + "_b"][:, None], x.reshape(M, B * L, -1), self.p[name + "_w"])
        return y.view(M, B, L, -1)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        g, b = self.p[name + "_g"], self.p[name + "_b"]
        return F.layer_norm(x, x.shape[-1:]) * g[:, None, None] + b[:, None, None]

    def _mix(self, i: int, x: torch.Tensor) -> torch.Tensor:
        M, B, L, D = x.shape
        qkv = self._linear(x, f"qkv{i}").view(M, B, L, 3, self.n_heads, D // self.n_heads)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5)                           # (M, B, H, L, d_head) each
        y = torch.empty_like(v)
        fixed = ~self.lsh
        if fixed.any():
            y[fixed] = scaled_dot_product_attention(q[fixed], k[fixed], v[fixed], self.masks[fixed][:, None, None])
        if self.lsh.any():
            seed = self.hash_seed + 1000 * i
            y[self.lsh] = sparse.lsh_attention(q[self.lsh], v[self.lsh], seed=seed, **self.lsh_args)
            if self.lsh_density is not None:
                a = self.lsh_args
                buckets = sparse.lsh_hash(q[self.lsh], a["n_buckets"], a["n_rounds"], seed)
                pairs = sparse.lsh_pairs(buckets, a["chunk_len"])        # (M_lsh, B, H, L, L)
                self.lsh_density.append(pairs.float().mean((1, 2, 3, 4)))
        return self._linear(y.transpose(2, 3).reshape(M, B, L, D), f"out{i}")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.stack([self.p["embed"][m][ids[m]] for m in range(ids.shape[0])]) + self.p["pos"][:, None]
        prev = F.pad(x, (0, 0, 1, 0))[:, :, :-1]                        # the previous token's embedding
        x = self._linear(torch.cat([x, prev], dim=-1), "shift")
        for i in range(self.n_layers):
            x = x + self._mix(i, self._norm(x, f"norm1{i}"))
            x = x + self._linear(F.gelu(self._linear(self._norm(x, f"norm2{i}"), f"up{i}")), f"down{i}")
        return self._linear(x, "head")


def train_sparse_recall(patterns: Sequence[str] = SPARSE_RECALL_PATTERNS, seeds: Sequence[int] = (0, 1, 2), *,
                        n_pairs: int = 8, n_global: int = 4, window: int = 4, global_window: int | None = None,
                        block: int = 4, steps: int = 300,
                        d_model: int = 32, n_heads: int = 2, n_layers: int = 2, batch: int = 32, lr: float = 3e-3,
                        eval_batch: int = 256, n_buckets: int = 4, chunk_len: int = 4, n_rounds: int = 2) -> dict:
    """Train one `StackedRecallNet` per (pattern, seed) on `mqar` after ``n_global`` BOS tokens.

    Every model has the same parameters, initial weights (per seed) and batches (per seed); only the
    attention pattern (`sparse_recall_mask`, or LSH) differs; "window + global" uses ``global_window``
    (default ``window``), so its window can be narrowed to keep as many pairs as the window alone. The
    models attend in both directions (the task is posed bidirectionally). Each model's loss is its own mean over the
    query positions, so the models train independently (AdamW is elementwise; no gradient clipping).
    Accuracy is measured on ``eval_batch`` fresh sequences (seed ``10_000 + seed``), overall and split
    by whether the query's value token is more than ``n_layers * window + 1`` positions back, out of a
    window stack's reach (the ``+ 1``: the token after the value also holds it, through the shift).
    Returns per-seed lists for ``accuracy``, ``accuracy_far``, ``accuracy_near`` and ``loss`` (every
    step), the masks' ``density`` (nnz / L², mean over seeds; for LSH the share of pairs it scored at
    evaluation, `sparse.lsh_pairs`, mean over layers, heads, sequences and seeds), ``chance`` (one over the
    number of value tokens), ``length``, ``reach`` and ``far_share`` (the share of far queries).
    """
    seeds = [int(s) for s in seeds]
    vocab = 4 * n_pairs + 2
    length = n_global + 3 * n_pairs
    runs = [(p, s) for p in patterns for s in seeds]
    global_window = window if global_window is None else global_window
    masks = [sparse_recall_mask(p, length, n_global=n_global, window=global_window if p == "window + global"
                                else window, block=block, seed=s) for p, s in runs]
    stack = torch.stack([torch.ones(length, length, dtype=torch.bool) if m is None else m for m in masks])
    model = StackedRecallNet(vocab, length, stack, [m is None for m in masks], [s for _, s in runs],
                             d_model=d_model, n_heads=n_heads, n_layers=n_layers, n_buckets=n_buckets,
                             chunk_len=chunk_len, n_rounds=n_rounds)
    which = torch.tensor([seeds.index(s) for _, s in runs])

    def sample(n, gens):
        ids, targets = zip(*(mqar(n, n_pairs, vocab, generator=g) for g in gens))
        ids, targets = torch.stack(ids)[which], torch.stack(targets)[which]
        prefix = torch.full((*ids.shape[:2], n_global), BOS)
        return torch.cat([prefix, ids], -1), torch.cat([torch.full_like(prefix, PAD), targets], -1)

    gens = [torch.Generator().manual_seed(s) for s in seeds]
    per_model = []

    def loss_fn(m, step):
        m.hash_seed = step
        ids, targets = sample(batch, gens)
        logits = m(ids)
        losses = torch.stack([cross_entropy(logits[i], targets[i], ignore_index=PAD) for i in range(len(runs))])
        per_model.append(losses.detach())
        return losses.sum()

    train_loop(model, loss_fn, steps=steps, lr=lr, warmup=steps // 10, grad_clip=None, desc="sparse recall")
    ids, targets = sample(eval_batch, [torch.Generator().manual_seed(10_000 + s) for s in seeds])
    model.eval()
    model.hash_seed = 10 ** 6
    model.lsh_density = []
    with torch.no_grad():
        correct = model(ids).argmax(-1) == targets
    lsh_density = torch.stack(model.lsh_density).mean().item() if model.lsh_density else None
    model.lsh_density = None
    first_query = n_global + 2 * n_pairs
    keys = ids[..., n_global:first_query:2]                                           # (M, B, n_pairs)
    slot = (keys[..., None, :] == ids[..., first_query:, None]).float().argmax(-1)     # pair of each query
    distance = torch.arange(first_query, length) - (n_global + 2 * slot + 1)
    far = distance > n_layers * window + 1
    hit = correct[..., first_query:]
    curve = torch.stack(per_model, -1)                                                 # (M, steps)

    def by_pattern(values):
        return {p: [values[i] for i, (q, _) in enumerate(runs) if q == p] for p in patterns}

    return {
        "accuracy": by_pattern(hit.float().mean((1, 2)).tolist()),
        "accuracy_far": by_pattern([hit[i][far[i]].float().mean().item() for i in range(len(runs))]),
        "accuracy_near": by_pattern([hit[i][~far[i]].float().mean().item() for i in range(len(runs))]),
        "loss": by_pattern(curve.tolist()),
        "density": {p: lsh_density if p == "LSH" else statistics.fmean(
            sparse.nnz(m) / length ** 2 for m, (q, _) in zip(masks, runs) if q == p) for p in patterns},
        "chance": 1 / (vocab - N_SPECIAL - (vocab - N_SPECIAL) // 2),
        "length": length, "reach": n_layers * window + 1, "far_share": far.float().mean().item(),
    }
