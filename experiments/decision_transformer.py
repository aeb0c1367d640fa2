"""Does a Decision Transformer's achieved return follow the return it is asked for? (M10.5)

Every seed collects its own offline dataset with `xfam_lib.rl.collect_offline_dataset` on a
`xfam_lib.rl.ChainMDP` (16 cells, 12 steps; in each cell only the action equal to that cell's key bit,
drawn afresh per episode and shown in the state, moves on and earns 1). Scripted policies play the key
bit with probability 0.1, 0.25 or 0.4, so the best return in the data lies well below the chain's
maximum of 12, and every target up to 12 is reachable. Five models with the same network are trained
on the same data with `xfam_lib.rl.train_decision_transformer`: the Decision Transformer; behaviour
cloning (``use_returns=False``: the returns-to-go are zeroed) on all the data, and on only the best 10%
and 25% of the episodes (`xfam_lib.rl.best_episodes`: Chen et al.'s %BC); and a state-blind Decision
Transformer (``use_states=False``), the control that shows the rewards need the state.
`xfam_lib.rl.rollout` plays 32 episodes per target return, 0 to 12: greedy for the Decision
Transformers, both greedy and sampled from the policy for the behaviour-cloning models (greedy cloning
of these data plays the most common logged action, the wrong one, by construction). Chen et al. 2021,
Figure 4, is the published counterpart: tracking inside the data's range, saturation beyond it.

Results go to ``experiments/results/decision_transformer.json``, rewritten after every seed; chapter 10 plots them.
Usage: ``python experiments/decision_transformer.py [--seeds 0 1 2] [--steps 300]`` (``--quick``: one
seed, 30 steps).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from xfam_lib.utils import machine_record
from xfam_lib.rl import (ChainMDP, DecisionTransformer, best_episodes, collect_offline_dataset, rollout,
                         train_decision_transformer)

from common import check_same_machine, save_result   # experiments/common.py

OUT = Path(__file__).resolve().parent / "results" / "decision_transformer.json"
# name: (model flags, fraction of the best episodes it trains on, how it acts)
MODELS = {"Decision Transformer": ({}, 1.0, ("greedy",)),
          "behaviour cloning": ({"use_returns": False}, 1.0, ("greedy", "sampled")),
          "10% behaviour cloning": ({"use_returns": False}, 0.1, ("greedy", "sampled")),
          "25% behaviour cloning": ({"use_returns": False}, 0.25, ("greedy", "sampled")),
          "state-blind Decision Transformer": ({"use_states": False}, 1.0, ("greedy",))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--episodes-per-target", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one seed, 30 steps")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--merge", type=Path, nargs="+", default=[],
                        help="result files of other seeds (same settings, same machine) to join into --out; "
                             "trains nothing")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 30
    torch.set_num_threads(args.threads)
    if args.merge:
        merge(args)
        return
    env_cfg = dict(n_states=16, horizon=12)
    data_cfg = dict(n_episodes=300, p_open=[0.1, 0.25, 0.4])
    model_cfg = dict(d_model=32, n_layers=2, n_heads=2)
    train_cfg = dict(steps=args.steps, batch=64, lr=3e-3)
    env = ChainMDP(**env_cfg)
    targets = list(range(env.max_return + 1))
    per_target = torch.tensor(targets).repeat_interleave(args.episodes_per_target)
    start, cpu_start = time.perf_counter(), time.process_time()
    per_seed = []
    for seed in args.seeds:
        data = collect_offline_dataset(env, data_cfg["n_episodes"], p_open=tuple(data_cfg["p_open"]), seed=seed)
        run = {"seed": seed, "dataset_best_return": float(data.returns.max()),
               "dataset_mean_return": float(data.returns.mean()),
               "dataset_return_counts": torch.bincount(data.returns.long(), minlength=env.max_return + 1).tolist(),
               "achieved": {}, "final_loss": {}}
        for name, (flags, fraction, modes) in MODELS.items():
            torch.manual_seed(seed)
            model = DecisionTransformer(env.obs_dim, env.n_actions, max_timestep=env.horizon, **model_cfg, **flags)
            train_data = data if fraction == 1.0 else best_episodes(data, fraction)
            losses = train_decision_transformer(model, train_data, seed=seed, **train_cfg)
            for mode in modes:
                key = name if mode == "greedy" else f"{name}, sampled"
                achieved = rollout(model, env, per_target, seed=10_000 + seed,
                                   greedy=mode == "greedy").view(len(targets), -1)
                run["achieved"][key] = achieved.mean(1).tolist()
                print(f"seed {seed} {key}: dataset best {run['dataset_best_return']:.0f}, mean achieved "
                      f"{[round(a, 1) for a in run['achieved'][key]]} ({time.perf_counter() - start:.0f} s)",
                      flush=True)
            run["final_loss"][name] = losses[-1]
            run.setdefault("train_episodes", {})[name] = len(train_data.returns)
        per_seed.append(run)
        save_result(args.out, {                              # after every seed: a stopped run keeps its seeds
            "config": {"env": env_cfg, "data": data_cfg, "model": {**model_cfg, "max_timestep": env.horizon},
                       "train": train_cfg, "seeds": [r["seed"] for r in per_seed],
                       "episodes_per_target": args.episodes_per_target,
                       "models": {name: {"flags": f, "best_fraction": x, "acts": list(m)}
                                  for name, (f, x, m) in MODELS.items()}},
            "max_return": env.max_return,
            "targets": targets,
            "per_seed": per_seed,
            "cpu_time_s": round(time.process_time() - cpu_start, 1),
        }, threads=args.threads, start=start)


def merge(args) -> None:
    """Join the seeds of ``args.merge`` (one configuration, one machine) into ``args.out``."""
    parts = [json.loads(f.read_text()) for f in args.merge]
    here = machine_record("cpu", threads=args.threads)
    for part in parts:
        check_same_machine(part["machine"], here, action="merge Decision Transformer runs")
        if {k: v for k, v in part["config"].items() if k != "seeds"} != \
                {k: v for k, v in parts[0]["config"].items() if k != "seeds"}:
            raise ValueError("the files given to --merge hold different configurations")
    per_seed = sorted((r for part in parts for r in part["per_seed"]), key=lambda r: r["seed"])
    save_result(args.out, {**parts[0], "config": {**parts[0]["config"], "seeds": [r["seed"] for r in per_seed]},
                           "per_seed": per_seed, "cpu_time_s": round(sum(p["cpu_time_s"] for p in parts), 1)},
                threads=args.threads, start=time.perf_counter())


if __name__ == "__main__":
    main()
