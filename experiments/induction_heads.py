"""Induction heads: train at one length, test at longer ones (Gu & Dao 2023, Table 2; M11.4, M9.8, M9.10).

Every arm is `xfam_lib.ablations.induction_heads_run`: the same small `SSMLM` (embedding, two pre-norm
residual layers, read-out; d_model 16, state 8) with S4D layers (time-invariant) or Mamba blocks
(selective), trained on the same batches of `xfam_lib.tasks.induction_heads` at length 32 (a trigger
token, the answer after it, random tokens, the trigger again: predict the answer), then tested on 256
fresh sequences at each test length.

Results (per seed and loss curves) go to ``experiments/results/induction_heads.json``; chapter 9 plots
them. Usage: ``python experiments/induction_heads.py [--seeds 0 1 2] [--steps 250]`` (about 2 minutes of CPU time on
one core; ``--quick`` runs a short version to try the script).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from itertools import product

import torch
from tqdm import tqdm

from xfam_lib.ablations import induction_heads_run

from common import save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "induction_heads.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--kinds", nargs="+", default=["s4d", "mamba"])
    parser.add_argument("--test-lens", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one seed, 30 steps")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 30
    torch.set_num_threads(args.threads)
    cfg = dict(train_len=32, vocab=10, d_model=16, n_layers=2, d_state=8, steps=args.steps, batch=32, lr=1e-2)
    every = 10
    start = time.perf_counter()
    acc = {k: {str(L): [] for L in args.test_lens} for k in args.kinds}
    curves = {k: [] for k in args.kinds}
    chance = None
    for kind, seed in tqdm(list(product(args.kinds, args.seeds)), desc="induction heads", unit="run"):
        r = induction_heads_run(kind, test_lens=args.test_lens, seed=seed, **cfg)
        for L, a in r["accuracy"].items():
            acc[kind][str(L)].append(a)
        curves[kind].append([sum(r["losses"][i:i + every]) / every for i in range(0, cfg["steps"], every)])
        chance = r["chance"]
        print(f"{kind:5s} seed {seed}: " + ", ".join(f"L={L}: {a:.3f}" for L, a in r["accuracy"].items())
              + f" ({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {
        "config": {**cfg, "kinds": args.kinds, "seeds": args.seeds, "test_lens": args.test_lens, "eval_batch": 256},
        "chance": chance,
        "accuracy": acc,
        "loss_curves": curves,
        "curve_every": every,
    }, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
