"""Universal Transformer: one tied layer against T untied layers, on copy and reverse (M6.1, F6.5).

Dehghani et al. (2019) report that the Universal Transformer, one layer applied T times with shared
weights, does as well as or better than a Transformer with T separate layers on algorithmic tasks
(copy, reverse, addition) with far fewer parameters. This script trains both at the same width for a
few depths T, on two tasks from `xfam_lib.tasks`: ``copy_task`` (output position i = input position i)
and ``reverse_task`` (output position i = input position L-1-i). The model is
`xfam_lib.ablations.UTSeq2Seq`: encoder only, one output token per input position (equal lengths),
an embedding, the core, a linear head. ``tied=True`` is `xfam_lib.adaptive.UniversalTransformer` (ACT
off); ``tied=False`` is T separate `xfam_lib.transformer.EncoderLayer`\\ s.

Positional treatment, the same for both: the UT adds ``ut_coordinate_encoding`` (position sinusoid +
step sinusoid) to the state before every step; the untied stack gets exactly that same vector added
before layer t. So both see the same inputs and differ only in weight sharing (for separate layers the
step sinusoid carries no extra information, but leaving it in keeps everything else equal), and at
T = 1 the two are the same model (same initialisation, same result: a check that the comparison is fair).

Every (task, T, tied, seed) run has the same fixed budget: the same steps, batch, learning rate and
warm-up. Per-token accuracy is measured on fresh sequences. Results go to
``experiments/results/ut_tied.json``; chapter 6 plots them.

Usage: ``python experiments/ut_tied.py`` (about 10 minutes on one CPU core; ``--quick``: one seed,
30 steps, written to ``--out``).
"""
from __future__ import annotations

import time
from itertools import product

import torch
from tqdm import tqdm

from xfam_lib.ablations import train_ut_seq2seq

from common import RESULTS, parser, quick, save_result   # experiments/common.py

OUT = RESULTS / "ut_tied.json"
DEFAULTS = {"tasks": ["copy", "reverse"], "depths": [1, 2, 4, 6], "seeds": [0, 1, 2], "length": 12, "vocab": 12,
            "d_model": 32, "n_heads": 4, "d_ff": 64, "steps": 500, "batch": 64, "lr": 1e-3, "warmup": 50,
            "eval_batch": 2000}


def main() -> None:
    options = parser(__doc__, OUT)
    options.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    args = options.parse_args()
    cfg = {**DEFAULTS, "steps": args.steps}
    if args.quick:
        cfg = quick(cfg)
    torch.set_num_threads(args.threads)
    train_kw = {k: cfg[k] for k in ("length", "vocab", "d_model", "n_heads", "d_ff", "steps", "batch", "lr", "warmup",
                                    "eval_batch")}
    start, runs = time.perf_counter(), []
    settings = list(product(cfg["seeds"], cfg["tasks"], cfg["depths"], (True, False)))
    for seed, task, T, tied in tqdm(settings, desc="tied vs untied depth", unit="run"):
        t0 = time.perf_counter()
        r = train_ut_seq2seq(task, T, tied=tied, seed=seed, **train_kw)
        runs.append({"task": task, "T": T, "tied": tied, "seed": seed, **r,
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(f"seed {seed} {task:7s} T={T} {'tied  ' if tied else 'untied'}: accuracy {r['accuracy']:.4f}, "
              f"{r['params']} params, final loss {r['final_loss']:.3f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {"name": "ut_tied", "config": {**cfg, "chance": 1 / (cfg["vocab"] - 2)}, "runs": runs},
                threads=args.threads, start=start)


if __name__ == "__main__":
    main()
