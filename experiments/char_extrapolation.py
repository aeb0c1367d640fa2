"""Train short, test long on real text: character LMs on Tiny Shakespeare (chapter 4).

Chapter 1's corpus and a small `xfam_lib.transformer.TransformerLM` per positional encoding
(sinusoidal, RoPE, ALiBi; `xfam_lib.ablations.char_length_extrapolation`), trained on windows of
``train_len`` characters and scored at every position of validation windows four times as long.
Three seeds, each in its own process with one thread. Results (per seed and kind: the loss at each
position) go to ``experiments/results/char_extrapolation.json`` with the machine; chapter 4 plots
them. Usage: ``python experiments/char_extrapolation.py`` (``--quick``: one seed, 30 steps).
"""
from __future__ import annotations

import multiprocessing
import time

import torch

import common
from xfam_lib.ablations import char_length_extrapolation

OUT = common.RESULTS / "char_extrapolation.json"
CONFIG = dict(kinds=["sinusoidal", "rope", "alibi"], train_len=64, factor=4, steps=600, batch=32,
              d_model=64, n_layers=2, n_heads=4, lr=3e-3, eval_windows=64, seeds=[0, 1, 2])


def run_seed(cfg: dict, seed: int) -> dict:
    """All kinds for one seed, on one thread."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    keys = ("train_len", "factor", "steps", "batch", "d_model", "n_layers", "n_heads", "lr", "eval_windows")
    res = char_length_extrapolation(cfg["kinds"], seed=seed, **{k: cfg[k] for k in keys})
    n = cfg["train_len"]
    print(f"seed {seed} ({time.perf_counter() - start:.0f} s): " + ", ".join(
        f"{k} {sum(p[:n]) / n:.3f} -> {sum(p[n:]) / len(p[n:]):.3f}" for k, p in res["per_position"].items()),
        flush=True)
    return {"seed": seed, "per_position": res["per_position"],
            "final_train_loss": {k: sum(v[-20:]) / 20 for k, v in res["train_loss"].items()}}


def main() -> None:
    args = common.parser(__doc__, OUT).parse_args()
    cfg = common.quick(CONFIG) if args.quick else CONFIG
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(len(cfg["seeds"])) as pool:
        runs = pool.starmap(run_seed, [(cfg, seed) for seed in cfg["seeds"]])
    result = {"description": "Mean next-character loss (nats) at each position of Tiny Shakespeare validation "
                             "windows factor x train_len long, for character LMs trained on train_len windows "
                             "that differ only in positional encoding.",
              "config": cfg, "runs": runs}
    common.save_result(args.out, result, threads=len(cfg["seeds"]), start=start)


if __name__ == "__main__":
    main()
