"""Based's state dial (Arora et al. 2024, Figure 2): MQAR recall against decoding state for Based alone.

Based's state is the Taylor-2 linear attention's ``H (D d_h + D)`` values, ``D = 1 + f + f^2`` for feature
dimension ``f``, plus its sliding window's ``2 (window + 1) d``. This script turns the two dials of the
arena's ``based`` family one at a time around the default (``feature_dim`` 4, ``window`` 8), at the arena
sweep's largest number of pairs, budget and recipe (read from its saved config), re-matching the width to
the budget at every setting (`width_for_budget`) so that only the state changes. The seeds, steps, batch,
budget and learning rate are the sweep's (`common.arena_recipe`). Results go to
``experiments/results/based_frontier.json``; chapter 11 plots them over Figure 11.2b's frontier.

Usage: ``python experiments/based_frontier.py`` (about 8 minutes on one quiet CPU core; ``--quick``: one
seed, 30 steps).
"""
from __future__ import annotations

import time

import torch

from xfam_lib.arena import TASKS, train_arena, width_for_budget

from common import RESULTS, arena_recipe, parser, quick, recipe_from, save_result   # experiments/common.py

OUT = RESULTS / "based_frontier.json"
DEFAULTS = {"pairs": 16, "seeds": [0, 1, 2], "steps": 300, "batch": 32, "budget": 20_000, "lr": 3e-3}
BASE = {"feature_dim": 4, "window": 8}
DIALS = {"feature_dim": [1, 2, 4], "window": [2, 4, 8, 16]}


def main() -> None:
    args = parser(__doc__, OUT).parse_args()
    cfg, saved = arena_recipe(DEFAULTS)
    if saved is not None:
        cfg["pairs"] = max(saved.get("sizes", [cfg["pairs"]]))
    if args.quick:
        cfg = quick(cfg)
    torch.set_num_threads(args.threads)
    pairs, vocab = cfg["pairs"], 4 * cfg["pairs"] + 2
    seq_len = TASKS["mqar"](1, pairs, vocab, torch.Generator().manual_seed(0), "cpu")[0].shape[1]
    settings = list(dict.fromkeys(tuple({**BASE, dial: v}.items()) for dial, values in DIALS.items() for v in values))
    start, runs = time.perf_counter(), []
    for seed in cfg["seeds"]:
        for setting in settings:
            knobs = dict(setting)
            width = width_for_budget("based", cfg["budget"], vocab=vocab, max_len=seq_len, **knobs)
            r = train_arena("based", "mqar", pairs, vocab=vocab, d_model=width, steps=cfg["steps"],
                            batch=cfg["batch"], lr=cfg["lr"], seed=seed, **knobs)
            runs.append({**knobs, "seed": seed, "d_model": width, **r})
            print(f"based {knobs} seed {seed}: accuracy {r['accuracy']:.3f}, {r['params']} params, "
                  f"state {r['state_bytes']} B ({time.perf_counter() - start:.0f} s)", flush=True)
            save_result(args.out, {"name": "based_frontier", "task": "mqar", "runs": runs,
                                   "config": {**cfg, "base": BASE, "dials": DIALS},
                                   "complete": len(runs) == len(settings) * len(cfg["seeds"]),
                                   "recipe_from": recipe_from(), "seq_len": seq_len},
                        threads=args.threads, start=start)


if __name__ == "__main__":
    main()
