"""Chapter 11's recall comparison trained to convergence: every family on Zoology's two axes, three seeds.

`benchmarks/arena_sweep.py --protocol` stops every run after its preset's steps (100 on the CPU preset),
where most families still sit on the plateau every MQAR run starts on. Here each run is trained by
`xfam_lib.arena.train_arena` with early stopping instead: up to ``max_steps`` steps of ``batch`` sequences,
the loss on a validation batch every ``eval_every`` steps, a stop after ``patience`` evaluations without a
better one, and the test accuracy of the best evaluation's model. The points are the protocol's: the number
of pairs at width ``d_fixed`` (the state does not change along it) and the width at ``pairs_fixed`` pairs
(Zoology's Figure 2). The learning rate is chosen on validation, never on the test draw: at every point
seed 0 is trained at each rate of ``lrs`` and the rate with the lowest best validation loss is the point's;
the other seeds train at that rate only. The GRU baseline (``BASELINES``) runs beside the families.

Every run is saved when it ends (``experiments/results/arena_converged.json``), with the machine it ran on;
``--resume`` keeps the saved runs and trains the rest, so the sweep can run in pieces, on other machines too
(a run's ``machine`` says where it ran; the file's own ``machine`` is the last one that added runs). ``--procs N`` spreads whole runs over N processes.
``--estimate`` trains one run per family at the smallest point and prints the projected time of the sweep.

Usage: ``python experiments/arena_converged.py [--procs 2] [--resume]`` (``--quick``: two seeds, 30 steps,
one point per axis).
"""
from __future__ import annotations

import functools
import json
import time

import torch

from xfam_lib.arena import BASELINES, FAMILIES, train_arena
from xfam_lib.utils import machine_record

from common import RESULTS, parser, save_result   # experiments/common.py

OUT = RESULTS / "arena_converged.json"
DEFAULTS = {"pairs": [4, 8, 16], "d_fixed": 32, "widths": [16, 32, 64], "pairs_fixed": 4,
            "lrs": [1e-3, 3e-3, 1e-2], "seeds": [0, 1, 2], "batch": 32, "max_steps": 6000,
            "eval_every": 100, "patience": 10, "min_delta": 1e-2}
TRAINING = ("batch", "max_steps", "eval_every", "patience", "min_delta")   # what makes two runs the same


def points(cfg: dict) -> list[tuple[int, int]]:
    """The (pairs, width) points of both axes, the shared one once."""
    return list(dict.fromkeys([(p, cfg["d_fixed"]) for p in cfg["pairs"]]
                              + [(cfg["pairs_fixed"], d) for d in cfg["widths"]]))


def run_one(spec: tuple, cfg: dict) -> dict:
    """Train ``spec = (family, pairs, d_model, lr, seed)`` with early stopping; its record."""
    family, pairs, d_model, lr, seed = spec
    start = time.perf_counter()
    r = train_arena(family, "mqar", pairs, d_model=d_model, steps=cfg["max_steps"], batch=cfg["batch"],
                    lr=lr, seed=seed, patience=cfg["patience"], eval_every=cfg["eval_every"],
                    min_delta=cfg["min_delta"])
    return {"family": family, "pairs": pairs, "d_model": d_model, "lr": lr, "seed": seed,
            "accuracy": r["accuracy"], "val": r["val"], "best_step": r["best_step"],
            "steps_run": r["steps_run"], "params": r["params"], "state_bytes": r["state_bytes"],
            "wall_s": round(time.perf_counter() - start, 2),
            "machine": machine_record("cpu", threads=torch.get_num_threads())}


def chosen_lr(runs: list[dict], family: str, point: tuple[int, int], seed0: int) -> float | None:
    """The rate whose seed-0 run reached the lowest validation loss at ``point`` (None until all ran)."""
    tried = [r for r in runs if (r["family"], r["pairs"], r["d_model"], r["seed"]) == (family, *point, seed0)]
    return min(tried, key=lambda r: min(v[1] for v in r["val"]))["lr"] if tried else None


def key(r) -> tuple:
    return tuple(r[k] for k in ("family", "pairs", "d_model", "lr", "seed"))


def _init(threads: int) -> None:
    torch.set_num_threads(threads)


def run_all(specs: list[tuple], cfg: dict, procs: int, threads: int, on_result) -> None:
    """Train ``specs`` in ``procs`` processes (1: here), handing each record to ``on_result`` as it ends."""
    if procs == 1:
        _init(threads)
        for spec in specs:
            on_result(run_one(spec, cfg))
        return
    import torch.multiprocessing as mp
    with mp.get_context("spawn").Pool(procs, initializer=_init, initargs=(threads,)) as pool:
        for rec in pool.imap_unordered(functools.partial(run_one, cfg=cfg), specs):
            on_result(rec)


def main() -> None:
    p = parser(__doc__, OUT, quick_help="two seeds, 30 steps, the smallest point of each axis")
    p.add_argument("--families", nargs="+", default=list(FAMILIES + BASELINES), choices=FAMILIES + BASELINES)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--estimate", action="store_true")
    args = p.parse_args()
    cfg = {**DEFAULTS, "families": args.families}
    if args.quick:
        cfg.update(seeds=cfg["seeds"][:2], max_steps=30, eval_every=10, pairs=cfg["pairs"][:1],
                   widths=cfg["widths"][:1])
    torch.set_num_threads(args.threads)
    start, runs = time.perf_counter(), []
    if args.estimate:
        p0 = points(cfg)[0]
        for family in cfg["families"]:
            r = run_one((family, *p0, cfg["lrs"][1], 99), cfg)
            print(f"{family:15s} {r['steps_run']:5d} steps, {r['wall_s']:6.1f} s, accuracy {r['accuracy']:.3f}")
            runs.append(r)
        n = len(points(cfg)) * (len(cfg["lrs"]) + len(cfg["seeds"]) - 1)
        print(f"projected: {n} runs per family, about {n * sum(r['wall_s'] for r in runs) / 3600:.1f} h on one "
              "core at this point's cost (larger points cost more)")
        return
    if args.resume and args.out.exists():
        saved = json.loads(args.out.read_text())
        if any(saved["config"][k] != cfg[k] for k in TRAINING):
            raise ValueError(f"cannot resume: the saved runs were trained with {saved['config']}")
        runs = saved["runs"]
        for r in runs:   # runs saved before runs carried their own record ran where the file did
            r.setdefault("machine", saved["machine"])
        start -= saved["wall_time_s"]
    seed0, rest = cfg["seeds"][0], cfg["seeds"][1:]
    first = [(f, *pt, lr, seed0) for pt in points(cfg) for lr in cfg["lrs"] for f in cfg["families"]]
    n_runs = len(first) + len(points(cfg)) * len(rest) * len(cfg["families"])

    def save(rec: dict | None = None) -> None:
        if rec is not None:
            runs.append(rec)
            print(f"{rec['family']:15s} pairs {rec['pairs']:2d} d {rec['d_model']:3d} lr {rec['lr']:.0e} seed "
                  f"{rec['seed']}: accuracy {rec['accuracy']:.3f}, best step {rec['best_step']} of "
                  f"{rec['steps_run']}, {rec['wall_s']:.0f} s ({len(runs)} runs)", flush=True)
        save_result(args.out, {"name": "arena_converged", "task": "mqar", "config": cfg, "runs": runs,
                               "complete": len(runs) == n_runs}, threads=args.threads, start=start)

    done = {key(r) for r in runs}
    run_all([s for s in first if s not in done], cfg, args.procs, args.threads, save)
    done = {key(r) for r in runs}
    chosen = [(f, *pt, chosen_lr(runs, f, pt, seed0), s) for pt in points(cfg) for s in rest
              for f in cfg["families"]]
    run_all([s for s in chosen if s not in done], cfg, args.procs, args.threads, save)
    save()


if __name__ == "__main__":
    main()
