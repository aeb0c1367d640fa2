"""Does linear attention fall behind softmax attention on associative recall as the pairs grow? (M8.11, M11.2)

Zoology (Arora et al. 2024) finds that efficient token mixers with a fixed-size state lose multi-query
associative recall (MQAR) accuracy to softmax attention as the number of key-value pairs grows at a
fixed model width. This script trains `xfam_lib.ablations.RecallNet` with ``mixer="softmax"`` and
``mixer="linear"`` (elu+1 linear attention: one ``d_head x d_head`` state per head) on
`xfam_lib.tasks.mqar` for several numbers of pairs; the two arms share every parameter, seed and batch
except the token mixer. Accuracy is measured over the query positions of fresh sequences.

Results (per seed and the mean) go to ``experiments/results/linear_recall.json``; chapter 8 plots them.
Usage: ``python experiments/linear_recall.py [--seeds 0 1 2] [--steps 300]`` (one thread; the saved run
took 11 minutes on a shared 2-core machine under a load average near 10; shorter trial runs suggest
about 6 minutes on a quiet core; ``--quick`` runs a short version to try the script).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from itertools import product

import torch
from tqdm import tqdm

from xfam_lib.ablations import train_recall

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "linear_recall.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one seed, 40 steps")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 40
    torch.set_num_threads(args.threads)
    cfg = dict(steps=args.steps, d_model=32, n_heads=2, n_layers=2, batch=32, lr=3e-3, eval_batch=256)
    mixers = ("softmax", "linear")
    start = time.perf_counter()
    acc = {m: {str(n): [] for n in args.pairs} for m in mixers}
    curves = {m: {str(n): [] for n in args.pairs} for m in mixers}
    for n, mixer, seed in tqdm(list(product(args.pairs, mixers, args.seeds)), desc="recall", unit="run"):
        a, losses = train_recall(mixer, n, seed=seed, **cfg)
        acc[mixer][str(n)].append(a)
        curves[mixer][str(n)].append(losses[::10])
        print(f"pairs {n:3d} {mixer:8s} seed {seed}: accuracy {a:.3f} ({time.perf_counter() - start:.0f} s)",
              flush=True)
    save_result(args.out, {
        "config": {**cfg, "seeds": args.seeds, "pairs": args.pairs, "mixers": list(mixers),
                   "d_head": cfg["d_model"] // cfg["n_heads"], "vocab": "4 * pairs + 2"},
        "chance": {str(n): 1 / (2 * n) for n in args.pairs},
        "accuracy_per_seed": acc,
        "accuracy": {m: {n: statistics.fmean(v) for n, v in per.items()} for m, per in acc.items()},
        "loss_every_10_steps": curves,
    }, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
