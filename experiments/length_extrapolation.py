"""Train short, test long: one small decoder-only LM per positional encoding (M4.15, FIGURES F4.9).

Every arm is the same `xfam_lib.transformer.TransformerLM` (pre-norm, RMSNorm, SwiGLU, causal attention)
trained with the same seed, batches and learning-rate schedule on `LaggedTopicLanguage` sequences of
length ``train_len``; only ``positional=`` differs (none, sinusoidal, learned, RoPE, ALiBi, T5 bias, Shaw,
Transformer-XL). Each model is then evaluated on fresh sequences 1x, 2x, 4x and 8x as long, with the
mean next-token loss over every position (the protocol of Press et al. 2022). Results, averaged over
seeds and per seed, go to ``experiments/results/length_extrapolation.json``; chapter 4 plots them.

Usage: ``python experiments/length_extrapolation.py [--seeds 0 1] [--steps 1000] [--train-len 64]``
(about 10 minutes per seed on one CPU core with the defaults; ``--quick`` runs a 1-minute version).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from xfam_lib.experiments import length_extrapolation

KINDS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5", "shaw", "xl")
OUT = Path(__file__).resolve().parent / "results" / "length_extrapolation.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--train-len", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1 is fastest for models this small)")
    parser.add_argument("--quick", action="store_true", help="a short run (fewer steps, one seed) to try the script")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.train_len, args.d_model = args.seeds[:1], 150, 32, 32
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    runs = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        res = length_extrapolation(KINDS, train_len=args.train_len, factors=(1, 2, 4, 8), steps=args.steps,
                                   batch=32, d_model=args.d_model, n_layers=2, n_heads=4, lr=3e-3, seed=seed,
                                   eval_tokens=16384, progress=False)
        res["train_loss"] = {k: [round(statistics.fmean(v[i:i + 10]), 4) for i in range(0, len(v), 10)]
                             for k, v in res["train_loss"].items()}            # mean of every 10 steps
        runs.append(res)
        row = "  ".join(f"{k} {res['loss'][k][args.train_len]:.3f}->{res['loss'][k][8 * args.train_len]:.3f}"
                        for k in KINDS)
        print(f"seed {seed} ({time.perf_counter() - t0:.0f} s): {row}", flush=True)

    lengths = [args.train_len * f for f in (1, 2, 4, 8)]
    summary = {
        "description": "Mean next-token loss (nats) over all positions of sequences of each length, for small "
                       "decoder-only LMs trained at train_len that differ only in positional encoding; "
                       "'oracle' is the true process's loss given each sequence's topic.",
        "config": {**{k: v for k, v in runs[0]["config"].items() if k != "seed"}, "seeds": args.seeds},
        "lengths": lengths,
        "loss": {k: {L: statistics.fmean(r["loss"][k][L] for r in runs) for L in lengths} for k in KINDS},
        "loss_per_seed": {k: {L: [r["loss"][k][L] for r in runs] for L in lengths} for k in KINDS},
        "oracle": {L: statistics.fmean(r["oracle"][L] for r in runs) for L in lengths},
        "per_position": {k: [statistics.fmean(p) for p in zip(*(r["per_position"][k] for r in runs))] for k in KINDS},
        "train_loss_every_10_steps": {k: runs[0]["train_loss"][k] for k in KINDS},
        "wall_time_s": round(time.perf_counter() - start, 1),
        "machine": {"torch": torch.__version__, "threads": args.threads, "python": platform.python_version(),
                    "cpu": platform.processor() or platform.machine()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out} ({summary['wall_time_s']} s)")
    for k in KINDS:
        print(f"{k:>11}: " + "  ".join(f"{L}: {summary['loss'][k][L]:.3f}" for L in lengths))
    print(f"{'oracle':>11}: " + "  ".join(f"{L}: {summary['oracle'][L]:.3f}" for L in lengths))


if __name__ == "__main__":
    main()
