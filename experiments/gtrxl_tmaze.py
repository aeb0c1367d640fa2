"""Which memory policies learn the T-maze by policy gradient? LSTM, GTrXL and the ungated stack (M10.2, M10.3)

Each seed trains three actor-critic policies with about the same number of parameters on
`xfam_lib.rl.TMaze` (the cue is seen only at the first step, the reward only at the last) with
`xfam_lib.rl.train_reinforce` (REINFORCE with a learned baseline, Adam, no warm-up): an
`xfam_lib.rl.LSTMPolicy`, a GTrXL `xfam_lib.rl.TransformerPolicy` (GRU gates, b_g = 2) and the same
stack without gates or reordering (the canonical Post-LN TrXL), whose feed-forward width is raised
until its parameter count matches GTrXL's. This is the small analogue of Parisotto et al. (2020,
Table 1 and Figure 4): canonical TrXL fails to learn where GTrXL learns, and GTrXL is at least as
good as an LSTM.

Results go to ``experiments/results/gtrxl_tmaze.json`` (rewritten after every run, so a stopped sweep
keeps what it finished); chapter 10 plots them. Usage:
``python experiments/gtrxl_tmaze.py [--depth 4] [--length 10] [--lrs 0.001 0.005] [--seeds 0 1 2]``
(``--quick``: one seed, 2 layers, 10 updates).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from common import RESULTS, parser, save_result

from xfam_lib.rl import LSTMPolicy, TMaze, TransformerPolicy, count_parameters, match_parameters, train_reinforce

OUT = RESULTS / "gtrxl_tmaze.json"


def policies(depth: int, d_model: int) -> tuple[dict, dict]:
    """Builders of the three policies (parameter counts matched to GTrXL's) and their settings."""
    gtrxl = dict(d_model=d_model, n_layers=depth, gate="gru", bias_init=2.0)
    target = count_parameters(TransformerPolicy(4, 2, **gtrxl))
    base = dict(d_model=d_model, n_layers=depth, gate="residual", reorder=False)
    d_ff = match_parameters(lambda f: TransformerPolicy(4, 2, **base, d_ff=f), range(4, 64 * d_model, 4), target)
    hidden = match_parameters(lambda h: LSTMPolicy(4, 2, h), range(4, 16 * d_model), target)
    settings = {"LSTM": dict(hidden=hidden), "GTrXL": gtrxl, "Post-LN (no gates)": {**base, "d_ff": d_ff}}
    builders = {"LSTM": lambda: LSTMPolicy(4, 2, hidden), "GTrXL": lambda: TransformerPolicy(4, 2, **gtrxl),
                "Post-LN (no gates)": lambda: TransformerPolicy(4, 2, **base, d_ff=d_ff)}
    return builders, settings


def main() -> None:
    p = parser(__doc__, OUT, quick_help="one seed, 2 layers, 10 updates")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 5e-3])
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--length", type=int, default=10)
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    if args.quick:
        args.seeds, args.lrs, args.depth, args.updates = args.seeds[:1], args.lrs[-1:], 2, 10
    torch.set_num_threads(args.threads)
    builders, settings = policies(args.depth, args.d_model)
    params = {name: count_parameters(build()) for name, build in builders.items()}
    start, cpu_start = time.perf_counter(), time.process_time()
    runs = {str(lr): {name: [] for name in builders} for lr in args.lrs}
    for lr in args.lrs:
        for seed in args.seeds:
            for name, build in builders.items():
                torch.manual_seed(seed)
                out = train_reinforce(build(), lambda: TMaze(args.length), updates=args.updates, batch=args.batch,
                                      lr=lr, seed=seed, eval_every=10)
                runs[str(lr)][name].append({"seed": seed, **out})
                print(f"lr {lr:g} seed {seed} {name:20s}: greedy return {out['eval_return'][-1]:+.2f} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
                result = save_result(args.out, {
                    "config": {"depth": args.depth, "d_model": args.d_model, "n_heads": 4, "length": args.length,
                               "updates": args.updates, "batch": args.batch, "lrs": args.lrs, "seeds": args.seeds,
                               "eval_episodes": 64, "policies": settings,
                               "optimizer": "Adam, constant learning rate, no warm-up"},
                    "parameters": params,
                    "chance_return": 0.0,
                    "runs": runs,
                    "cpu_time_s": round(time.process_time() - cpu_start, 1),
                }, threads=args.threads, start=start)
    print(f"{result['cpu_time_s']} s of CPU")


if __name__ == "__main__":
    main()
