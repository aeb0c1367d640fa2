"""What does a sparse attention pattern cost in quality? Recall beyond the window (M7.2, M7.10, M7.11, M7.13).

`xfam_lib.ablations.train_sparse_recall` trains the same small two-sided model (`StackedRecallNet`:
`RecallNet`'s architecture, 2 layers, d = 32, 2 heads) on multi-query associative recall (`tasks.mqar`,
preceded by global tokens) with five attention patterns: dense, a sliding window, the window plus global
tokens (Longformer), BigBird (window, global and random blocks) and LSH (Reformer bucketing, shared QK).
Every arm has the same parameters, initial weights and batches per seed; only the pattern differs.
Accuracy is split by whether the query's value lies beyond the reach of the window stack.

Results (per seed; the chapter shows each seed and the mean) go to
``experiments/results/sparse_recall.json``; chapter 7 plots them next to its smaller live run.
Usage: ``python experiments/sparse_recall.py [--seeds 0 1 2] [--steps 600] [--pairs 8]``
(the saved run took 589 s on one core of a shared 2-core machine under a load average near 9;
``--quick`` runs one seed for 30 steps to try the script).
"""
from __future__ import annotations

import time

import torch
from common import RESULTS, parser, quick, save_result

from xfam_lib.ablations import train_sparse_recall

OUT = RESULTS / "sparse_recall.json"


def main() -> None:
    p = parser(__doc__, OUT)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--pairs", type=int, default=8)
    args = p.parse_args()
    cfg = {"seeds": args.seeds, "steps": args.steps, "n_pairs": args.pairs, "n_global": 4, "window": 4,
           "block": 4, "d_model": 32, "n_heads": 2, "n_layers": 2, "batch": 32, "lr": 3e-3}
    if args.quick:
        cfg = quick(cfg)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    result = train_sparse_recall(**cfg)
    for name, accs in result["accuracy_far"].items():
        print(f"{name:16s} beyond the window: " + " ".join(f"{a:.3f}" for a in accs))
    result["loss_every_10_steps"] = {
        name: [[round(x, 4) for x in curve[::10]] for curve in curves] for name, curves in result.pop("loss").items()
    }
    save_result(args.out, {"config": cfg, **result}, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
