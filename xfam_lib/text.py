"""Character-level language modelling on real text (chapter 1): the Tiny Shakespeare corpus, a small
GPT-style model built from the chapter's parts, and its training recipe.

The recipe is nanoGPT's ``shakespeare_char`` at toy size: N(0, 0.02) weights with the residual
output projections scaled by ``1/sqrt(2 n_layers)`` (GPT-2), AdamW with betas (0.9, 0.95) and weight
decay on the matrices of linear layers only, dropout on the embeddings and on each residual branch,
optional bf16 autocast, gradient clipping, linear warm-up then cosine decay.
"""
from __future__ import annotations

import gzip
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .train import progress_range
from .transformer import EncoderLayer
from .utils import check_bool, check_instance, check_int, check_positive_int, check_real, check_token_ids

__all__ = ["CharCorpus", "tiny_shakespeare", "get_batch", "CharGPT", "gpt2_init", "decay_groups",
           "estimate_loss", "train_char_lm", "sample_text"]

DATA = Path(__file__).parent / "data" / "tinyshakespeare.txt.gz"


@dataclass(frozen=True)
class CharCorpus:
    """A text, its sorted character vocabulary, and its ids split into ``train`` (first part) and ``val``."""

    text: str
    vocab: str
    train: torch.Tensor
    val: torch.Tensor

    def encode(self, s: str) -> torch.Tensor:
        """The ids ``(len(s),)`` of a string; characters outside the vocabulary raise a ValueError."""
        index = {c: i for i, c in enumerate(self.vocab)}
        unknown = sorted(set(s) - index.keys())
        if unknown:
            raise ValueError(f"s contains characters outside the vocabulary: {unknown}")
        return torch.tensor([index[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        """The string of a sequence of ids (a 1-D tensor or list)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in ids if not 0 <= i < len(self.vocab)]
        if bad:
            raise ValueError(f"ids must lie in [0, {len(self.vocab)}), got {bad[:5]}")
        return "".join(self.vocab[i] for i in ids)


def tiny_shakespeare(val_fraction: float = 0.1) -> CharCorpus:
    """Tiny Shakespeare (1,115,394 characters, from Karpathy's char-rnn), shipped with the library.

    The vocabulary is every character of the text, sorted (65). The last ``val_fraction`` of the
    characters is the validation split, as in nanoGPT's ``shakespeare_char``.
    """
    check_real("val_fraction", val_fraction, low=0.0, high=1.0, low_open=True, high_open=True)
    text = gzip.decompress(DATA.read_bytes()).decode("utf-8")
    vocab = "".join(sorted(set(text)))
    lookup = torch.full((max(map(ord, vocab)) + 1,), -1, dtype=torch.long)
    lookup[torch.tensor([ord(c) for c in vocab])] = torch.arange(len(vocab))
    ids = lookup[torch.tensor([ord(c) for c in text])]
    n_train = int(len(ids) * (1.0 - val_fraction))
    return CharCorpus(text, vocab, ids[:n_train], ids[n_train:])


def get_batch(ids: torch.Tensor, batch: int, block: int, generator: torch.Generator | None = None,
              device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``block`` ids and their next-character targets, each ``(batch, block)``."""
    check_token_ids("ids", ids, None, rank=1)
    check_positive_int("batch", batch)
    check_positive_int("block", block)
    if len(ids) <= block:
        raise ValueError(f"ids of length {len(ids)} are too short for block={block}")
    starts = torch.randint(len(ids) - block, (batch,), generator=generator)
    windows = ids[starts[:, None] + torch.arange(block + 1)]
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


class CharGPT(nn.Module):
    """A GPT-2-style decoder-only LM from chapter 1's parts: token plus learned position embeddings,
    ``n_layers`` causal Pre-LN `EncoderLayer` blocks (GELU feed-forward of width ``4 d``), a final
    LayerNorm and a linear head. Dropout ``dropout`` acts on the summed embeddings and on the output of
    every attention and FFN branch (not on the attention weights). ``init="gpt2"`` applies
    `gpt2_init`; ``init="torch"`` keeps PyTorch's defaults. ``forward(ids (B, L)) -> logits (B, L, vocab)``
    with ``L <= block``.
    """

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, block: int, *,
                 dropout: float = 0.0, init: str = "gpt2"):
        super().__init__()
        for name, value in (("vocab", vocab), ("d_model", d_model), ("n_layers", n_layers), ("block", block)):
            check_positive_int(name, value)
        check_real("dropout", dropout, low=0.0, high=1.0, high_open=True)
        if init not in ("gpt2", "torch"):
            raise ValueError(f"init must be 'gpt2' or 'torch', got {init!r}")
        self.block, self.vocab = block, vocab
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(block, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            EncoderLayer(d_model, n_heads, 4 * d_model, norm_first=True, activation="gelu", dropout=dropout)
            for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        if init == "gpt2":
            gpt2_init(self)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids("ids", ids, self.vocab, rank=2)
        if ids.shape[1] > self.block:
            raise ValueError(f"ids of shape {tuple(ids.shape)} are longer than block={self.block}")
        x = self.drop(self.tok(ids) + self.pos.weight[: ids.shape[1]])
        for blk in self.blocks:
            x = blk(x, causal=True)
        return self.head(self.norm(x))


def gpt2_init(model: CharGPT, std: float = 0.02) -> None:
    """GPT-2's initialisation: every linear and embedding weight N(0, std²), biases 0, and the two
    projections that write into the residual stream in each block (attention ``out_proj``, the FFN's
    ``linear2``) N(0, (std / sqrt(2 n_layers))²). LayerNorms keep weight 1, bias 0."""
    check_instance("model", model, CharGPT)
    std = check_real("std", std, low=0.0, low_open=True)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    residual_std = std / math.sqrt(2 * len(model.blocks))
    for blk in model.blocks:
        nn.init.normal_(blk.self_attn.out_proj.weight, std=residual_std)
        nn.init.normal_(blk.ff.linear2.weight, std=residual_std)


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: the weight matrices of ``nn.Linear`` layers decay by ``weight_decay``;
    biases, norm parameters and embedding tables (token and position) do not. ``weight_decay >= 0``."""
    check_instance("model", model, nn.Module)
    weight_decay = check_real("weight_decay", weight_decay, low=0.0)
    matrices = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay, keep = [], []
    for p in model.parameters():
        (decay if id(p) in matrices else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


@torch.no_grad()
def estimate_loss(model: nn.Module, ids: torch.Tensor, *, block: int, batches: int, batch: int,
                  seed: int = 0, amp_dtype: torch.dtype | None = None) -> float:
    """Mean next-character loss of ``model`` (in eval mode) on ``batches`` batches of windows of
    ``ids`` drawn with ``seed``: the same windows for every model given the same arguments."""
    check_instance("model", model, nn.Module)
    check_positive_int("batches", batches)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        x, y = get_batch(ids, batch, block, gen, device)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(x)
        total += nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item()
    model.train(was_training)
    return total / batches


def train_char_lm(model: nn.Module, corpus: CharCorpus, *, steps: int, batch: int, lr: float, seed: int,
                  warmup: int = 0, betas: tuple[float, float] = (0.9, 0.95), weight_decay: float = 0.1,
                  grad_clip: float | None = 1.0, amp_dtype: torch.dtype | None = None, eval_every: int = 0,
                  eval_batches: int = 10, progress: bool = True, desc: str = "char LM") -> dict[str, list]:
    """Train ``model`` on random windows of ``corpus.train`` for ``steps`` AdamW steps.

    The learning rate rises linearly over ``warmup`` steps, then follows a cosine down to ``lr / 10``.
    ``amp_dtype`` (e.g. ``torch.bfloat16``) runs the forward pass under ``torch.autocast``.
    Returns the per-step ``loss`` and the gradient norm before clipping, ``grad_norm``; with
    ``eval_every > 0`` also ``val``, the pairs ``(step, validation loss)`` every ``eval_every`` steps
    and at the end (`estimate_loss` on ``eval_batches`` batches of ``corpus.val``).
    """
    check_instance("model", model, CharGPT)
    check_instance("corpus", corpus, CharCorpus)
    check_positive_int("steps", steps)
    check_positive_int("batch", batch)
    lr, warmup = check_real("lr", lr, low=0.0, low_open=True), check_int("warmup", warmup, low=0)
    if grad_clip is not None:
        grad_clip = check_real("grad_clip", grad_clip, low=0.0, low_open=True)
    eval_every = check_int("eval_every", eval_every, low=0)
    eval_batches = check_positive_int("eval_batches", eval_batches)
    if len(betas) != 2 or not all(0.0 <= check_real("betas", b) < 1.0 for b in betas):
        raise ValueError(f"betas must be a pair of numbers in [0, 1), got {betas!r}")
    check_bool("progress", progress)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(decay_groups(model, weight_decay), lr=lr, betas=betas)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    losses, norms, val = [], [], []
    for step in progress_range(steps, desc) if progress else range(steps):
        if eval_every and step % eval_every == 0:
            val.append((step, estimate_loss(model, corpus.val, block=model.block, batches=eval_batches,
                                            batch=batch, amp_dtype=amp_dtype)))
        x, y = get_batch(corpus.train, batch, model.block, gen, device)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss became {loss.item()} at step {len(losses)}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = grad_clip if grad_clip is not None else math.inf
        norms.append(nn.utils.clip_grad_norm_(model.parameters(), max_norm).item())
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    if eval_every:
        val.append((steps, estimate_loss(model, corpus.val, block=model.block, batches=eval_batches,
                                         batch=batch, amp_dtype=amp_dtype)))
        return {"loss": losses, "grad_norm": norms, "val": val}
    return {"loss": losses, "grad_norm": norms}


@torch.no_grad()
def sample_text(model: CharGPT, corpus: CharCorpus, prompt: str, n_chars: int, *, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> str:
    """``prompt`` continued by ``n_chars`` characters sampled at ``temperature`` (context cropped to
    the model's ``block``)."""
    check_instance("model", model, CharGPT)
    check_instance("corpus", corpus, CharCorpus)
    check_positive_int("n_chars", n_chars)
    temperature = check_real("temperature", temperature, low=0.0, low_open=True)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    unknown = sorted(set(prompt) - set(corpus.vocab))
    if unknown:
        raise ValueError(f"prompt contains characters outside the corpus's vocabulary: {unknown}")
    device = next(model.parameters()).device
    ids = corpus.encode(prompt)[None].to(device)
    for _ in range(n_chars):
        logits = model(ids[:, -model.block:])[:, -1].float() / temperature
        nxt = torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=generator).to(device)
        ids = torch.cat([ids, nxt], dim=1)
    return corpus.decode(ids[0].cpu())
