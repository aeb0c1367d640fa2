"""ACT on a task whose number of sequential steps is explicit: apply a fixed permutation k times (M6.3).

The companion of ``act_parity.py``. `xfam_lib.tasks.permutation_steps` gives a start item and a
difficulty ``k``; the target is the start moved ``k`` times by a fixed one-cycle permutation
(`xfam_lib.tasks.cyclic_permutation`). `xfam_lib.ablations.PermutationACT` reads the start at the
first step only, so its state can only move the item along step by step, and its halting unit sees
``k``. The loss is the cross-entropy plus ``tau`` times the ponder cost N + R. After training, the
mean ponder cost and the accuracy are measured for every ``k``, per seed. Results go to
``experiments/results/act_permutation.json``; chapter 6 plots them.

Usage: ``python experiments/act_permutation.py [--seeds 0 1 2] [--steps 1500] [--out PATH]``
(about 1 minute per seed on one CPU core).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm

from xfam_lib.ablations import train_permutation_act

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "act_permutation.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--tau", type=float, default=1e-2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = {"n_items": 16, "max_k": 6, "hidden": 32, "max_steps": 12, "tau": args.tau, "steps": args.steps,
              "batch": 128, "lr": 3e-3}
    start, per_seed = time.perf_counter(), []
    for seed in tqdm(args.seeds, desc="permutation (ACT), seeds", unit="run"):
        per_seed.append(train_permutation_act(**config, seed=seed))
        print(f"seed {seed}: ponder by k " + " ".join(f"{p:.2f}" for p in per_seed[-1]["ponder"])
              + " | accuracy " + " ".join(f"{a:.2f}" for a in per_seed[-1]["accuracy"]), flush=True)
    save_result(args.out, {"config": {**config, "threshold": 0.99, "seeds": args.seeds},
                           "k": list(range(1, config["max_k"] + 1)),
                           **{key: [r[key] for r in per_seed] for key in ("ponder", "n_updates", "accuracy")}},
                threads=1, start=start)


if __name__ == "__main__":
    main()
