"""Do deep Post-LN, Pre-LN and GRU-gated stacks train at a large constant learning rate? (M10.2, M10.3)

A 12-layer `xfam_lib.rl.CueRecallNet` learns `xfam_lib.rl.cue_recall_batch` (remember the first token
across 10 distractors; chance 1/4) with Adam, no warm-up, at two learning rates, via
`xfam_lib.rl.train_cue_recall`. The stacks: Post-LN (the canonical block), Pre-LN (identity-map
reordering without ReLU), GTrXL with the GRU gate at b_g = 2 (the paper's gated identity
initialisation) and at b_g = 0. This is the small, supervised analogue of Parisotto et al. (2020):
canonical TrXL fails where reordered and gated stacks learn (Table 1, Figure 4), and b_g = 2 learns faster
than b_g = 0 (Figure 7).

Results go to ``experiments/results/gtrxl_cue_recall.json``; chapter 10 plots them. Usage:
``python experiments/gtrxl_cue_recall.py [--seeds 0 1 2] [--lrs 0.001 0.005]`` (a few minutes of CPU on one
core; ``--quick``: one seed, one learning rate, 40 steps).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from xfam_lib.rl import train_cue_recall

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "gtrxl_cue_recall.json"
STACKS = {"Post-LN": dict(gate="residual", reorder=False),
          "Pre-LN": dict(gate="residual", relu=False),
          "GTrXL b_g=2": dict(gate="gru", bias_init=2.0),
          "GTrXL b_g=0": dict(gate="gru", bias_init=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 5e-3])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.lrs, args.steps = args.seeds[:1], args.lrs[-1:], 40
    torch.set_num_threads(args.threads)
    start, cpu_start = time.perf_counter(), time.process_time()
    runs = {str(lr): {name: [] for name in STACKS} for lr in args.lrs}
    for lr in args.lrs:
        for name, kw in STACKS.items():
            for seed in args.seeds:
                out = train_cue_recall(kw, depth=args.depth, steps=args.steps, lr=lr, seed=seed)
                runs[str(lr)][name].append({"seed": seed, "accuracy": out["accuracy"],
                                            "loss_every_10_steps": out["losses"][::10]})
                print(f"lr {lr:g} {name:12s} seed {seed}: accuracy {out['accuracy']:.3f} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {
        "config": {"depth": args.depth, "d_model": 32, "n_heads": 4, "steps": args.steps, "batch": 32,
                   "n_cues": 4, "n_distractors": 8, "length": 12, "seeds": args.seeds, "lrs": args.lrs,
                   "optimizer": "Adam, constant learning rate, no warm-up", "stacks": STACKS},
        "chance": 1 / 4,
        "runs": runs,
        "cpu_time_s": round(time.process_time() - cpu_start, 1),
    }, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
