"""Adaptive attention span: which spans do the heads learn? (M6.4, FIGURES F6.2)

A small causal LM whose attention layers are `xfam_lib.adaptive.AdaptiveSpanAttention` (Pre-LN blocks,
sinusoidal positions), trained with the L1 span penalty ``coef * sum of the layers' mean spans`` added
to the next-token loss, as in Sukhbaatar et al. 2019, on one of two languages:

- ``--modes 0``: `xfam_lib.tasks.LaggedTopicLanguage` (a token is a fixed permutation of the token
  ``lag`` places back with probability ``p_rule``, otherwise drawn from the sequence's topic); saved
  to ``experiments/results/adaptive_span.json`` with
  ``--modes 0 --lag 12 --p-rule 0.7 --steps 2000 --out experiments/results/adaptive_span.json``;
- ``--modes 4`` (the default): `xfam_lib.tasks.ModeBigramLanguage` (a mode token at the start picks
  the permutation that maps each token to the next), saved with the defaults to
  ``experiments/results/adaptive_span_modes.json``.

Every span starts at ``init_span``; the learned span of every head of every layer is saved per seed;
chapter 6 plots them.

Usage: ``python experiments/adaptive_span.py [--seeds 0 1 2] [--modes 4] [--steps 1200] [--out PATH]``
(about 1-3 minutes per seed on one CPU core).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm

from xfam_lib.ablations import train_spans

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "adaptive_span_modes.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--modes", type=int, default=4)
    ap.add_argument("--p-rule", type=float, default=0.8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lag", type=int, default=12)
    ap.add_argument("--span-lr", type=float, default=2e-2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    language = {"n_modes": args.modes} if args.modes else {"lag": args.lag, "topic_size": 6}
    config = {"vocab": 32, **language, "p_rule": args.p_rule, "d_model": 32, "n_heads": args.heads, "n_layers": args.layers,
              "length": 32, "ramp": 4, "init_span": 16.0, "coef": 3e-3, "steps": args.steps, "batch": 32,
              "lr": 3e-3, "span_lr": args.span_lr}
    start, runs = time.perf_counter(), []
    for seed in tqdm(args.seeds, desc="adaptive span, seeds", unit="run"):
        runs.append(train_spans(**config, seed=seed))
        print(f"seed {seed}: spans " + " | ".join(" ".join(f"{z:.1f}" for z in layer) for layer in runs[-1]["spans"])
              + f"  loss {runs[-1]['final_loss']:.3f}", flush=True)
    save_result(args.out, {"config": {**config, "seeds": args.seeds}, "spans": [r["spans"] for r in runs],
                           "final_loss": [r["final_loss"] for r in runs],
                           "oracle_loss": [r["oracle_loss"] for r in runs]},
                threads=1, start=start)


if __name__ == "__main__":
    main()
