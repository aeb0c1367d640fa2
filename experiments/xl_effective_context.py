"""How far back can a model copy? Vanilla (no memory) vs Transformer-XL memories (M5.1, M5.2, FIGURES F5.1).

Every arm is `xfam_lib.ablations.xl_delayed_copy`: the same `xfam_lib.memory.TransformerXL` (same
parameters, same seed, same batches); only ``mem_len`` differs: 0 is the vanilla segment-by-segment model, which sees nothing before its segment.
The task is `xfam_lib.tasks.delayed_copy`: output the token read ``delay`` steps back. Streams of
``n_segments`` segments of ``segment_len`` tokens are processed one segment at a time, carrying the
memories across segments (gradient stopped, as in the paper). After training, accuracy is measured on
fresh streams of 8 segments over the positions that have a target. Chance is ``1 / (vocab - 2)``.

Results (per seed and the mean) go to ``experiments/results/xl_effective_context.json``; chapter 5 plots
them. Usage: ``python experiments/xl_effective_context.py [--seeds 0 1 2] [--steps 150]`` (about 7 minutes
on one CPU core with the defaults; ``--quick`` runs a short version to try the script).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from itertools import product

import torch
from tqdm import tqdm

from xfam_lib.ablations import xl_delayed_copy
from xfam_lib.memory import temporal_range

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "xl_effective_context.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--mem-lens", type=int, nargs="+", default=[0, 16, 32])
    parser.add_argument("--delays", type=int, nargs="+", default=[8, 24, 40])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one seed, 40 steps")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 40
    torch.set_num_threads(args.threads)
    cfg = dict(steps=args.steps, vocab=18, d_model=32, n_layers=2, segment_len=16, n_segments=5, batch=16, lr=3e-3)
    start = time.perf_counter()
    acc = {str(m): {str(dl): [] for dl in args.delays} for m in args.mem_lens}
    curves = {str(m): {str(dl): [] for dl in args.delays} for m in args.mem_lens}
    settings = list(product(args.mem_lens, args.delays, args.seeds))
    for m, dl, seed in tqdm(settings, desc="XL effective context", unit="run"):
        a, losses = xl_delayed_copy(m, dl, seed=seed, **cfg)
        acc[str(m)][str(dl)].append(a)
        curves[str(m)][str(dl)].append(losses[::10])
        print(f"mem_len {m:3d} delay {dl:3d} seed {seed}: accuracy {a:.3f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {
        "config": {**cfg, "n_heads": 2, "seeds": args.seeds, "mem_lens": args.mem_lens, "delays": args.delays,
                   "eval_segments": 8, "eval_batch": 64},
        "chance": 1 / (cfg["vocab"] - 2),
        "temporal_range": {str(m): temporal_range(m, cfg["n_layers"]) for m in args.mem_lens},
        "accuracy_per_seed": acc,
        "accuracy": {m: {dl: statistics.fmean(v) for dl, v in per.items()} for m, per in acc.items()},
        "loss_every_10_steps": curves,
    }, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
