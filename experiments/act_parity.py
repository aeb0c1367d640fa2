"""ACT on Graves's parity task: ponder cost against input difficulty (M6.3, FIGURES F6.1).

A GRU cell pondering over one parity vector (`xfam_lib.tasks.parity_task`) with
`xfam_lib.adaptive.act_halting`: at every step it reads the vector again (with a flag set on the first
step, as in Graves 2016), proposes a new state and a halting probability. The loss is the parity
cross-entropy plus ``tau`` times the mean ponder cost N + R. After training, the mean ponder cost and
the accuracy are measured for every difficulty (number of nonzero entries), per seed. Results go to
``experiments/results/act_parity.json``; chapter 6 plots them.

Usage: ``python experiments/act_parity.py [--seeds 0 1 2] [--steps 3000] [--n-bits 8] [--tau 1e-3] [--lr 3e-3] [--out PATH]``
(about 1-3 minutes per seed on one CPU core). The longer run saved to
``experiments/results/act_parity_long.json`` is ``--steps 8000 --tau 1e-4 --lr 1e-3 --out experiments/results/act_parity_long.json``
(about 5 minutes per seed).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from tqdm import tqdm

from xfam_lib.ablations import train_parity

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "act_parity.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--n-bits", type=int, default=8)
    ap.add_argument("--tau", type=float, default=1e-3)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = {"n_bits": args.n_bits, "hidden": 128, "max_steps": 12, "tau": args.tau, "steps": args.steps,
              "batch": 128, "lr": args.lr, "threshold": 0.99, "seeds": args.seeds}
    start, per_seed = time.perf_counter(), []
    for seed in tqdm(args.seeds, desc="parity (ACT), seeds", unit="run"):
        per_seed.append(train_parity(args.n_bits, config["hidden"], config["max_steps"], args.tau, args.steps,
                                     config["batch"], config["lr"], seed))
        print(f"seed {seed}: ponder by difficulty " + " ".join(f"{p:.2f}" for p in per_seed[-1]["ponder"])
              + " | accuracy " + " ".join(f"{a:.2f}" for a in per_seed[-1]["accuracy"]), flush=True)
    save_result(args.out, {"config": config, "difficulty": list(range(1, args.n_bits + 1)),
                           **{key: [r[key] for r in per_seed] for key in ("ponder", "n_updates", "accuracy")}},
                threads=1, start=start)


if __name__ == "__main__":
    main()
