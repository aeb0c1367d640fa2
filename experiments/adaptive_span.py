"""Adaptive attention span: which spans do the heads learn? (M6.4, FIGURES F6.2)

A small causal LM whose attention layers are `xfam_lib.adaptive.AdaptiveSpanAttention` (Pre-LN blocks,
sinusoidal positions), trained on `xfam_lib.tasks.LaggedTopicLanguage` (a token is a fixed permutation of
the token ``lag`` places back with probability ``p_rule``, otherwise drawn from the sequence's topic)
with the L1 span penalty ``coef * sum of the layers' mean spans`` added to the next-token loss, as in
Sukhbaatar et al. 2019. Every span starts at ``init_span``; the learned span of every head of every
layer is saved per seed to ``experiments/results/adaptive_span.json``; chapter 6 plots them.

Usage: ``python experiments/adaptive_span.py [--seeds 0 1 2] [--steps 2000] [--layers 2] [--heads 4]``
(about 3 minutes per seed on one CPU core; ``--out`` writes elsewhere).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from xfam_lib.adaptive import AdaptiveSpanAttention
from xfam_lib.positional import sinusoidal_encoding
from xfam_lib.tasks import LaggedTopicLanguage

OUT = Path(__file__).resolve().parent / "results" / "adaptive_span.json"


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
        h = self.embed(ids) + sinusoidal_encoding(ids.shape[1], self.embed.embedding_dim).to(ids.device)
        for attn, norm, ffn in zip(self.attn, self.norms, self.ffn):
            h = h + attn(norm(h))
            h = h + ffn(h)
        return self.out(h)

    def span_penalty(self):
        return sum(a.span_penalty() for a in self.attn)


def train_spans(*, vocab=32, lag=12, p_rule=0.7, topic_size=6, d_model=32, n_heads=4, n_layers=2, length=32,
                ramp=4, init_span=16.0, coef=3e-3, steps=2000, batch=32, lr=3e-3, span_lr=2e-2, seed=0,
                device=None) -> dict:
    """Train one `SpanLM`; return its spans ``(n_layers, n_heads)`` and the last 50 steps' mean loss."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    lang = LaggedTopicLanguage(vocab, lag=lag, p_rule=p_rule, topic_size=topic_size, seed=seed)
    model = SpanLM(vocab, d_model, n_heads, n_layers, length, ramp, init_span).to(device)
    spans = [p for n, p in model.named_parameters() if n.endswith("span_logit")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("span_logit")]
    opt = torch.optim.Adam([{"params": rest}, {"params": spans, "lr": span_lr}], lr=lr)
    losses = []
    for _ in range(steps):
        ids, _ = lang.sample(batch, length + 1, generator=gen, device=device)
        ce = F.cross_entropy(model(ids[:, :-1]).reshape(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        (ce + coef * model.span_penalty()).backward()
        opt.step()
        losses.append(ce.item())
    return {"spans": [a.spans.detach().cpu().tolist() for a in model.attn],
            "final_loss": sum(losses[-50:]) / len(losses[-50:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lag", type=int, default=12)
    ap.add_argument("--span-lr", type=float, default=2e-2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = {"vocab": 32, "lag": args.lag, "p_rule": 0.7, "topic_size": 6, "d_model": 32, "n_heads": args.heads, "n_layers": args.layers,
              "length": 32, "ramp": 4, "init_span": 16.0, "coef": 3e-3, "steps": args.steps, "batch": 32,
              "lr": 3e-3, "span_lr": args.span_lr}
    start, runs = time.time(), []
    for seed in args.seeds:
        runs.append(train_spans(**config, seed=seed))
        print(f"seed {seed}: spans " + " | ".join(" ".join(f"{z:.1f}" for z in layer) for layer in runs[-1]["spans"])
              + f"  loss {runs[-1]['final_loss']:.3f}", flush=True)
    result = {"config": {**config, "seeds": args.seeds}, "spans": [r["spans"] for r in runs],
              "final_loss": [r["final_loss"] for r in runs], "wall_time_s": round(time.time() - start, 1),
              "threads": 1, "machine": f"{platform.system()} {platform.machine()}", "torch": torch.__version__}
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} in {result['wall_time_s']:.0f} s")


if __name__ == "__main__":
    main()
