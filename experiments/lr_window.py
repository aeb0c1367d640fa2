"""The learning-rate window of every arena family on MQAR after longer training (chapter 11, Figure 11.3d).

`benchmarks/arena_sweep.py --protocol` trains the families at five learning rates for its preset's steps
(100 on the CPU preset). This script redoes only the protocol's learning-rate curve — MQAR at 4 pairs,
width 32, 3 seeds — at six learning rates from 3e-4 to 1e-1 and 300 steps of 16 sequences, each run
trained by `xfam_lib.arena.train_arena` exactly as the protocol's ``protocol_run`` does, so chapter 11 can
ask whether softmax's window of good learning rates widens against the recurrent families' with longer
training. Every run is saved (accuracy, first and last loss, wall time) after it ends.
Results go to ``experiments/results/lr_window.json``.

Usage: ``python experiments/lr_window.py [--families softmax linear ...]`` (162 runs, 16 minutes on one CPU
core; ``--quick``: one seed, 30 steps).
"""
from __future__ import annotations

import time
from itertools import product

import torch

from xfam_lib.arena import FAMILIES, train_arena

from common import RESULTS, parser, quick, save_result   # experiments/common.py

OUT = RESULTS / "lr_window.json"
DEFAULTS = {"pairs": 4, "d_model": 32, "steps": 300, "batch": 16, "seeds": [0, 1, 2],
            "lrs": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1]}


def run_one(family: str, lr: float, seed: int, cfg: dict) -> dict:
    """Train one run as the protocol's ``protocol_run`` does and return its record."""
    start = time.perf_counter()
    r = train_arena(family, "mqar", cfg["pairs"], d_model=cfg["d_model"], steps=cfg["steps"],
                    batch=cfg["batch"], lr=lr, seed=seed)
    return {"family": family, "lr": lr, "seed": seed, "accuracy": r["accuracy"],
            "loss_first": r["losses"][0], "loss_last": r["losses"][-1],
            "wall_s": round(time.perf_counter() - start, 2)}


def main() -> None:
    p = parser(__doc__, OUT)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    args = p.parse_args()
    cfg = {**DEFAULTS, "steps": args.steps, "families": args.families}
    if args.quick:
        cfg = quick(cfg)
    torch.set_num_threads(args.threads)
    start, runs = time.perf_counter(), []
    grid = list(product(cfg["lrs"], cfg["seeds"], cfg["families"]))  # rate by rate: every family in each
    for lr, seed, family in grid:
        runs.append(run_one(family, lr, seed, cfg))
        r = runs[-1]
        print(f"{family:14s} lr {lr:.0e} seed {seed}: accuracy {r['accuracy']:.3f}, loss "
              f"{r['loss_last']:.3f}, {r['wall_s']:.1f} s ({len(runs)}/{len(grid)})", flush=True)
        save_result(args.out, {"name": "lr_window", "task": "mqar", "config": cfg, "runs": runs,
                               "complete": len(runs) == len(grid)}, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
