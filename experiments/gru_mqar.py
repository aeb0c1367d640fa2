"""A GRU baseline on MQAR at the arena's parameter budget (M11.5, F11.1).

`benchmarks/arena_sweep.py` trains the families of `xfam_lib.arena.FAMILIES`; this script trains
the arena's GRU baseline (`ArenaLM("gru", ...)`: the same embedding, token shift, MLPs and read-out, with
`torch.nn.GRU` as the mixer) with exactly the sweep's recipe — the same budget, numbers of pairs, seeds,
steps, batch and learning rate, read from the sweep's saved config — so chapter 11 can draw it in
Figure 11.1 beside the families. Results go to ``experiments/results/gru_mqar.json``.

Usage: ``python experiments/gru_mqar.py`` (about a minute on one CPU core; ``--quick``: one seed, 30 steps).
"""
from __future__ import annotations

import time
from itertools import product

import torch
from tqdm import tqdm

from xfam_lib.arena import TASKS, train_arena, width_for_budget

from common import RESULTS, arena_recipe, parser, quick, recipe_from, save_result   # experiments/common.py

OUT = RESULTS / "gru_mqar.json"
DEFAULTS = {"sizes": [4, 8, 16], "seeds": [0, 1, 2], "steps": 300, "batch": 32, "budget": 20_000, "lr": 3e-3}


def main() -> None:
    args = parser(__doc__, OUT).parse_args()
    cfg, _ = arena_recipe(DEFAULTS)                      # the sweep's recipe, so the runs are comparable
    if args.quick:
        cfg = quick(cfg)
    torch.set_num_threads(args.threads)
    start, runs = time.perf_counter(), []
    for seed, size in tqdm(list(product(cfg["seeds"], cfg["sizes"])), desc="GRU on MQAR", unit="run"):
        vocab = 4 * size + 2
        seq_len = TASKS["mqar"](1, size, vocab, torch.Generator().manual_seed(0), "cpu")[0].shape[1]
        width = width_for_budget("gru", cfg["budget"], vocab=vocab, max_len=seq_len)
        r = train_arena("gru", "mqar", size, vocab=vocab, d_model=width, steps=cfg["steps"], batch=cfg["batch"],
                        lr=cfg["lr"], seed=seed)
        runs.append({"family": "gru", "size": size, "seed": seed, "d_model": width, **r})
        print(f"gru size {size:3d} seed {seed}: accuracy {r['accuracy']:.3f}, {r['params']} params, "
              f"state {r['state_bytes']} B ({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {"name": "gru_mqar", "task": "mqar", "config": {**cfg, "family": "gru"}, "runs": runs,
                           "recipe_from": recipe_from()},
                threads=args.threads, start=start)


if __name__ == "__main__":
    main()
