"""How far back: MQAR accuracy against the delay from a key to its query (M11.1, chapter 11 Figure 11.4).

One-layer arena models of two families, full causal softmax attention and a sliding window reaching
``window`` keys back, are trained on MQAR (`xfam_lib.arena.train_arena`) and scored on the same 1024 fresh
sequences; every query's answer is sorted by its delay (the distance from where its key sits to where it
is asked), so one trained model gives the whole accuracy-against-delay curve. Results (accuracy per seed
and delay) go to ``experiments/results/recall_reach.json``; chapter 11 plots them.

Usage: ``python experiments/recall_reach.py`` (about 20 seconds on one CPU core; ``--quick``: one seed,
30 steps).
"""
from __future__ import annotations

import time

import torch

from xfam_lib.arena import train_arena
from xfam_lib.tasks import mqar

from common import RESULTS, parser, quick, save_result   # experiments/common.py

OUT = RESULTS / "recall_reach.json"
DEFAULTS = {"pairs": 8, "window": 4, "steps": 200, "seeds": [0, 1, 2], "d_model": 32, "n_layers": 1, "batch": 32,
            "lr": 3e-3, "test_batch": 1024, "test_seed": 20_000}
FAMILIES = ("softmax", "sliding_window")


def delays(ids: torch.Tensor, pairs: int) -> torch.Tensor:
    """``(B, pairs)``: for every query of MQAR sequences ``ids``, positions from its key to the query."""
    key_pos = 2 * (ids[:, 2 * pairs: 3 * pairs, None] == ids[:, None, 0: 2 * pairs: 2]).long().argmax(-1)
    return torch.arange(2 * pairs, 3 * pairs) - key_pos


def main() -> None:
    args = parser(__doc__, OUT).parse_args()
    cfg = quick(DEFAULTS) if args.quick else dict(DEFAULTS)
    torch.set_num_threads(args.threads)
    n = cfg["pairs"]
    ids, targets = mqar(cfg["test_batch"], n, 4 * n + 2, generator=torch.Generator().manual_seed(cfg["test_seed"]))
    queries = slice(2 * n, 3 * n)
    delay = delays(ids, n)
    values = delay.unique().tolist()
    start, accuracy = time.perf_counter(), {}
    for f in FAMILIES:
        accuracy[f] = []
        for seed in cfg["seeds"]:
            r = train_arena(f, "mqar", n, vocab=4 * n + 2, d_model=cfg["d_model"], n_layers=cfg["n_layers"],
                            window=cfg["window"], steps=cfg["steps"], batch=cfg["batch"], lr=cfg["lr"], seed=seed,
                            eval_batch=32, return_model=True)
            with torch.no_grad():
                hit = r["model"](ids).argmax(-1)[:, queries] == targets[:, queries]
            accuracy[f].append([hit[delay == d].float().mean().item() for d in values])
            print(f"{f:15s} seed {seed}: accuracy by delay "
                  + " ".join(f"{a:.2f}" for a in accuracy[f][-1]) + f" ({time.perf_counter() - start:.0f} s)",
                  flush=True)
    save_result(args.out, {"name": "recall_reach", "task": "mqar", "config": cfg, "delays": values,
                           "accuracy": accuracy, "chance": 1 / (2 * n)},
                threads=args.threads, start=start)


if __name__ == "__main__":
    main()
