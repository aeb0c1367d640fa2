"""Does a Decision Transformer's achieved return follow the return it is asked for? (M10.5, FIGURES F10.2)

Every seed collects its own offline dataset with `xfam_lib.rl.collect_offline_dataset` on a
`xfam_lib.rl.ChainMDP` (12 cells, 10 steps; scripted policies that move right with probability 0.1,
0.3 or 0.5, so the data hold no episode near the best possible return), trains a fresh
`xfam_lib.rl.DecisionTransformer` on it with `xfam_lib.rl.train_decision_transformer`, and plays one
greedy episode per target return with `xfam_lib.rl.rollout` (environment and policy are deterministic,
so one episode per target is exact). Targets run from 0 to ``max_return + 2``: beyond the dataset's best
return and beyond what the chain allows, the region where Chen et al. (2021, Figure 4) see the
achieved return saturate.

Results (per seed) go to ``experiments/results/decision_transformer.json``; chapter 10 plots them.
Usage: ``python experiments/decision_transformer.py [--seeds 0 1 2 3 4] [--steps 300]`` (about a minute of
CPU on one core with the defaults; ``--quick`` runs one seed for 60 steps).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from xfam_lib.rl import ChainMDP, DecisionTransformer, collect_offline_dataset, rollout, train_decision_transformer

OUT = Path(__file__).resolve().parent / "results" / "decision_transformer.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one seed, 60 steps")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 60
    torch.set_num_threads(args.threads)
    env_cfg = dict(n_states=12, horizon=10)
    data_cfg = dict(n_episodes=300, p_right=[0.1, 0.3, 0.5])
    model_cfg = dict(d_model=32, n_layers=2, n_heads=2)
    train_cfg = dict(steps=args.steps, batch=64, lr=3e-3)
    env = ChainMDP(**env_cfg)
    targets = list(range(env.max_return + 3))
    start, cpu_start = time.perf_counter(), time.process_time()
    per_seed = []
    for seed in args.seeds:
        data = collect_offline_dataset(env, data_cfg["n_episodes"], p_right=tuple(data_cfg["p_right"]), seed=seed)
        torch.manual_seed(seed)
        model = DecisionTransformer(env.n_states, env.n_actions, max_timestep=env.horizon, **model_cfg)
        losses = train_decision_transformer(model, data, seed=seed, **train_cfg)
        achieved = [rollout(model, env, target) for target in targets]
        per_seed.append({"seed": seed, "achieved": achieved, "dataset_best_return": float(data.returns.max()),
                         "dataset_mean_return": float(data.returns.mean()),
                         "dataset_return_counts": torch.bincount(data.returns.long(), minlength=env.max_return + 1).tolist(),
                         "final_loss": losses[-1], "loss_every_10_steps": losses[::10]})
        print(f"seed {seed}: dataset best {float(data.returns.max()):.0f}, achieved {achieved} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    result = {
        "config": {"env": env_cfg, "data": data_cfg, "model": {**model_cfg, "max_timestep": env.horizon},
                   "train": train_cfg, "seeds": args.seeds},
        "max_return": env.max_return,
        "targets": targets,
        "per_seed": per_seed,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "cpu_time_s": round(time.process_time() - cpu_start, 1),
        "machine": {"torch": torch.__version__, "threads": args.threads, "python": platform.python_version(),
                    "cpu": platform.machine()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} in {result['wall_time_s']} s ({result['cpu_time_s']} s of CPU)")


if __name__ == "__main__":
    main()
