"""Recall against state size inside one family: the arena's state knobs turned on MQAR (M11.6, F11.2).

Based (Arora et al. 2024, Figure 2) draws its recall-state frontier by dialling the state of one
architecture. `benchmarks/arena_sweep.py` gives each family one point per size; this script turns each
family's own state knob at the largest number of pairs, at the sweep's matched parameter budget and
recipe (steps, batch, learning rate, seeds, read from the sweep's saved config): the sliding window's
``window`` (keys back), the Performer's ``n_features`` and Mamba's ``d_state``. The width is re-matched
to the budget for every setting (`width_for_budget`), so only the state changes, not the parameter count.
Results go to ``experiments/results/state_frontier.json``; chapter 11 plots them.

Usage: ``python experiments/state_frontier.py`` (about 4 minutes on one CPU core; ``--quick``: one seed,
30 steps).
"""
from __future__ import annotations

import time

import torch
from tqdm import tqdm

from xfam_lib.arena import TASKS, train_arena, width_for_budget

from common import RESULTS, arena_recipe, parser, quick, recipe_from, save_result   # experiments/common.py

OUT = RESULTS / "state_frontier.json"
DEFAULTS = {"pairs": 16, "seeds": [0, 1, 2], "steps": 300, "batch": 32, "budget": 20_000, "lr": 3e-3}
KNOBS = {"sliding_window": ("window", [2, 4, 8, 16, 32, 47]),
         "performer": ("n_features", [8, 16, 32, 64, 128]),
         "mamba": ("d_state", [4, 8, 16, 32])}


def main() -> None:
    args = parser(__doc__, OUT).parse_args()
    cfg, saved = arena_recipe(DEFAULTS)                  # the sweep's recipe, so the runs are comparable
    if saved is not None:
        cfg["pairs"] = max(saved.get("sizes", [cfg["pairs"]]))   # the sweep's largest number of pairs
    if args.quick:
        cfg = quick(cfg)
    torch.set_num_threads(args.threads)
    pairs, vocab = cfg["pairs"], 4 * cfg["pairs"] + 2
    seq_len = TASKS["mqar"](1, pairs, vocab, torch.Generator().manual_seed(0), "cpu")[0].shape[1]
    start, runs = time.perf_counter(), []
    settings = [(seed, family, knob, value) for seed in cfg["seeds"]
                for family, (knob, values) in KNOBS.items() for value in values]
    for seed, family, knob, value in tqdm(settings, desc="state frontier", unit="run"):
        width = width_for_budget(family, cfg["budget"], vocab=vocab, max_len=seq_len, **{knob: value})
        r = train_arena(family, "mqar", pairs, vocab=vocab, d_model=width, steps=cfg["steps"],
                        batch=cfg["batch"], lr=cfg["lr"], seed=seed, **{knob: value})
        runs.append({"family": family, "knob": knob, "value": value, "seed": seed, "d_model": width, **r})
        print(f"{family:15s} {knob} {value:4d} seed {seed}: accuracy {r['accuracy']:.3f}, {r['params']} params, "
              f"state {r['state_bytes']} B ({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {"name": "state_frontier", "task": "mqar", "config": {**cfg, "knobs": KNOBS}, "runs": runs,
                           "recipe_from": recipe_from(),
                           "seq_len": seq_len},
                threads=args.threads, start=start)


if __name__ == "__main__":
    main()
