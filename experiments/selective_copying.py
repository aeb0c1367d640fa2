"""Selective copying: a time-invariant SSM against a selective one (Gu & Dao 2023, Table 1; M11.3, M9.8, M9.10).

Every arm is `xfam_lib.ablations.selective_copying_run`: the same small `SSMLM` (embedding, two
pre-norm residual layers, read-out; d_model 16, state 8) with S4D layers (time-invariant) or Mamba blocks
(selective); ``--kinds s4d h3 mamba`` adds H3 (time-invariant kernels with multiplicative gates). Trained on the same
batches of `xfam_lib.tasks.selective_copying` (4 data tokens at random positions among 64, then 4
markers asking for them in order). Accuracy is over the answer positions of 256 fresh sequences.

Results (per seed, and loss curves) go to ``experiments/results/selective_copying.json``; chapter 9 plots
them. Usage: ``python experiments/selective_copying.py [--seeds 0 1 2] [--steps 1000]`` (about 6 minutes of CPU time on
one core with the defaults; ``--quick`` runs a short version to try the script).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from itertools import product

import torch
from tqdm import tqdm

from xfam_lib.ablations import selective_copying_run

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "selective_copying.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--kinds", nargs="+", default=["s4d", "mamba"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one seed, 40 steps")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 40
    torch.set_num_threads(args.threads)
    cfg = dict(length=64, n_tokens=4, vocab=10, d_model=16, n_layers=2, d_state=8, steps=args.steps, batch=16, lr=1e-2)
    every = 10
    start = time.perf_counter()
    acc = {k: [] for k in args.kinds}
    curves = {k: [] for k in args.kinds}
    chance = None
    for kind, seed in tqdm(list(product(args.kinds, args.seeds)), desc="selective copying", unit="run"):
        r = selective_copying_run(kind, seed=seed, **cfg)
        acc[kind].append(r["accuracy"])
        curves[kind].append([sum(r["losses"][i:i + every]) / every for i in range(0, cfg["steps"], every)])
        chance = r["chance"]
        print(f"{kind:5s} seed {seed}: accuracy {r['accuracy']:.3f} ({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {
        "config": {**cfg, "kinds": args.kinds, "seeds": args.seeds, "eval_batch": 256},
        "chance": chance,
        "accuracy": acc,
        "mean_accuracy": {k: sum(v) / len(v) for k, v in acc.items()},
        "loss_curves": curves,
        "curve_every": every,
    }, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
