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

from xfam_lib.experiments import train_spans

OUT = Path(__file__).resolve().parent / "results" / "adaptive_span.json"


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
