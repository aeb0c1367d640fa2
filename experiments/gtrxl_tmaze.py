"""Gate or reordering? Four memory policies learn the T-maze by policy gradient (M10.2, M10.3)

Each run trains one actor-critic policy on `xfam_lib.rl.TMaze` (the cue is seen only at the first
step, the reward only at the last) with `xfam_lib.rl.train_reinforce` (REINFORCE with a learned
baseline, Adam, no warm-up). The four policies have about the same number of parameters: an
`xfam_lib.rl.LSTMPolicy`; GTrXL (`xfam_lib.rl.TransformerPolicy`, reordered, GRU gates, b_g = 2);
TrXL-I, the same reordered stack without gates (plain residual sums, the paper's ReLU); and the
canonical Post-LN TrXL (no reordering, no gates). The two ungated stacks get a wider feed-forward
network until their parameter count matches GTrXL's. TrXL-I separates the gate's effect from the
reordering's, as Parisotto et al. (2020, Table 1) do. The grid is maze length x learning rate x
seed for every policy.

Results go to ``experiments/results/gtrxl_tmaze.json``, rewritten after every run; a rerun with the
same settings on the same machine skips the runs already saved (resumable). Chapter 10 plots them.
Usage: ``python experiments/gtrxl_tmaze.py [--lengths 10 30 100] [--lrs 0.001 0.003 0.01]
[--seeds 0 1 2 3 4]`` (``--quick``: one seed, one length, 2 layers, 10 updates, to a scratch file).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from common import RESULTS, check_same_machine, parser, save_result

from xfam_lib.rl import LSTMPolicy, TMaze, TransformerPolicy, count_parameters, match_parameters, train_reinforce
from xfam_lib.utils import machine_record

OUT = RESULTS / "gtrxl_tmaze.json"
ARMS = ("LSTM", "GTrXL", "TrXL-I (no gates)", "Post-LN (no gates)")


def policies(depth: int, d_model: int) -> tuple[dict, dict]:
    """Builders of the four policies (parameter counts matched to GTrXL's) and their settings."""
    gtrxl = dict(d_model=d_model, n_layers=depth, gate="gru", bias_init=2.0)
    target = count_parameters(TransformerPolicy(4, 2, **gtrxl))
    kws = {"GTrXL": gtrxl}
    for name, reorder in (("TrXL-I (no gates)", True), ("Post-LN (no gates)", False)):
        base = dict(d_model=d_model, n_layers=depth, gate="residual", reorder=reorder)
        d_ff = match_parameters(lambda f: TransformerPolicy(4, 2, **base, d_ff=f),
                                range(4, 64 * d_model, 4), target)
        kws[name] = {**base, "d_ff": d_ff}
    hidden = match_parameters(lambda h: LSTMPolicy(4, 2, h), range(4, 16 * d_model), target)
    settings = {"LSTM": dict(hidden=hidden), **kws}
    builders = {"LSTM": lambda: LSTMPolicy(4, 2, hidden),
                **{name: (lambda kw=kw: TransformerPolicy(4, 2, **kw)) for name, kw in kws.items()}}
    return {n: builders[n] for n in ARMS}, {n: settings[n] for n in ARMS}


def main() -> None:
    p = parser(__doc__, OUT, quick_help="one seed, one length, 2 layers, 10 updates")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    p.add_argument("--lengths", type=int, nargs="+", default=[10, 30, 100])
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--updates", type=int, default=150)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--merge", type=Path, nargs="+", default=[],
                   help="result files of the same sweep (e.g. seeds run in parallel with --out) to add to --out; "
                        "merges only, trains nothing")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.lrs, args.lengths, args.depth, args.updates = [0], args.lrs[-1:], [10], 2, 10
        args.out = args.out.with_name("gtrxl_tmaze_quick.json")
    torch.set_num_threads(args.threads)
    builders, settings = policies(args.depth, args.d_model)
    config = {"depth": args.depth, "d_model": args.d_model, "n_heads": 4, "updates": args.updates,
              "batch": args.batch, "eval_episodes": 64, "policies": settings,
              "optimizer": "Adam, constant learning rate, no warm-up"}
    params = {name: count_parameters(build()) for name, build in builders.items()}
    runs, cpu_before = [], 0.0
    if args.out.exists():                                    # resume: keep what a stopped sweep finished
        saved = json.loads(args.out.read_text())
        check_same_machine(saved.get("machine"), machine_record("cpu", threads=args.threads),
                           action="add runs to the saved T-maze sweep")
        if saved["config"] != config:
            raise ValueError(f"{args.out} holds another configuration; move it away or use --out")
        runs, cpu_before = saved["runs"], saved["cpu_time_s"]
    key = lambda r: (r["length"], r["lr"], r["arm"], r["seed"])  # noqa: E731
    for other in map(lambda f: json.loads(f.read_text()), args.merge):
        check_same_machine(other.get("machine"), machine_record("cpu", threads=args.threads),
                           action="merge T-maze runs from another machine")
        if other["config"] != config:
            raise ValueError("a file given to --merge holds another configuration")
        have = {key(r) for r in runs}
        runs += [r for r in other["runs"] if key(r) not in have]
        cpu_before += other["cpu_time_s"]
    if args.merge:                                           # merge only: train nothing
        save(args, config, params, runs, cpu_before, time.perf_counter())
        return
    done = {key(r) for r in runs}
    start, cpu_start = time.perf_counter(), time.process_time()
    for length in args.lengths:
        for seed in args.seeds:
            for lr in args.lrs:
                for name, build in builders.items():
                    if (length, lr, name, seed) in done:
                        continue
                    t0 = time.process_time()
                    torch.manual_seed(seed)
                    out = train_reinforce(build(), lambda: TMaze(length), updates=args.updates,
                                          batch=args.batch, lr=lr, seed=seed, eval_every=10)
                    runs.append({"length": length, "lr": lr, "arm": name, "seed": seed,
                                 "cpu_s": round(time.process_time() - t0, 1), **out})
                    print(f"L {length} lr {lr:g} seed {seed} {name:20s}: greedy return "
                          f"{out['eval_return'][-1]:+.2f} ({time.process_time() - t0:.0f} s CPU)", flush=True)
                    save(args, config, params, runs, cpu_before + time.process_time() - cpu_start, start)


def save(args, config: dict, params: dict, runs: list, cpu_s: float, start: float) -> None:
    """Write the sweep so far to ``args.out`` (with the machine, by `common.save_result`)."""
    grid = {"lengths": sorted({r["length"] for r in runs}), "lrs": sorted({r["lr"] for r in runs}),
            "seeds": sorted({r["seed"] for r in runs})}
    save_result(args.out, {"config": config, "grid": grid, "parameters": params, "chance_return": 0.0,
                           "runs": runs, "cpu_time_s": round(cpu_s, 1)}, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
