"""Train short, test long: one small decoder-only LM per positional encoding (M4.15, FIGURES F4.9).

Every arm is the same `xfam_lib.transformer.TransformerLM` (pre-norm, RMSNorm, SwiGLU, causal attention)
trained with the same seed, batches and learning-rate schedule on `LaggedTopicLanguage` sequences of
length ``train_len``; only ``positional=`` differs (none, sinusoidal, learned, RoPE, ALiBi, T5 bias, Shaw,
Transformer-XL). Each model is then evaluated on fresh sequences 1x, 2x, 4x and 8x as long, with the
mean next-token loss over every position (the protocol of Press et al. 2022). Results, averaged over
seeds and per seed, go to ``experiments/results/length_extrapolation.json``; chapter 4 plots them.

Usage: ``python experiments/length_extrapolation.py [--seeds 0 1 2] [--steps 1000] [--train-len 64]``
(about 13 minutes per seed on one CPU core with the defaults; ``--quick`` runs a 1-minute version).
``--add-seeds`` runs only the given seeds and merges them into the saved results (same configuration
and same machine required, the machine checked before training): per-seed losses are appended and the
seed means recomputed, so a saved run can gain seeds without redoing the old ones. The wall time of
every call is kept in ``runs``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from xfam_lib.ablations import length_extrapolation
from xfam_lib.utils import machine_record

from common import check_same_machine   # experiments/common.py

KINDS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5", "shaw", "xl")
OUT = Path(__file__).resolve().parent / "results" / "length_extrapolation.json"


def merge(old: dict, new: dict) -> dict:
    """Results of ``old["config"]["seeds"] + new["config"]["seeds"]``: per-seed values appended, means
    recomputed (per-position and oracle means weighted by the number of seeds), wall times summed. Both must
    have the same configuration but for the seeds, no seed in common, and the same machine (`check_same_machine`:
    the keys that decide whether a rerun repeats a run bit for bit)."""
    same = {k: v for k, v in old["config"].items() if k != "seeds"} == \
        {k: v for k, v in new["config"].items() if k != "seeds"}
    overlap = set(old["config"]["seeds"]) & set(new["config"]["seeds"])
    if not same or overlap:
        raise ValueError(f"cannot merge: configurations differ, or seeds repeat ({sorted(overlap)})")
    check_same_machine(old.get("machine"), new["machine"], action="merge")
    n_old, n_new = len(old["config"]["seeds"]), len(new["config"]["seeds"])

    def weighted(a, b):
        return (n_old * a + n_new * b) / (n_old + n_new)

    per_seed = {k: {L: old["loss_per_seed"][k][L] + new["loss_per_seed"][k][L] for L in old["loss_per_seed"][k]}
                for k in old["loss_per_seed"]}
    old_runs = old.get("runs", [{"seeds": old["config"]["seeds"], "wall_time_s": old["wall_time_s"]}])
    return {**old,
            "config": {**old["config"], "seeds": old["config"]["seeds"] + new["config"]["seeds"]},
            "loss": {k: {L: statistics.fmean(v) for L, v in per_l.items()} for k, per_l in per_seed.items()},
            "loss_per_seed": per_seed,
            "oracle": {L: weighted(old["oracle"][L], new["oracle"][L]) for L in old["oracle"]},
            "per_position": {k: [weighted(a, b) for a, b in zip(old["per_position"][k], new["per_position"][k])]
                             for k in old["per_position"]},
            "wall_time_s": round(old["wall_time_s"] + new["wall_time_s"], 1),
            "runs": old_runs + new["runs"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--train-len", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1 is fastest for models this small)")
    parser.add_argument("--quick", action="store_true", help="a short run (fewer steps, one seed) to try the script")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--add-seeds", action="store_true",
                        help="merge the new seeds into the results already saved at --out")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.train_len, args.d_model = args.seeds[:1], 150, 32, 32
    torch.set_num_threads(args.threads)
    machine = machine_record("cpu", threads=args.threads)
    saved = json.loads(args.out.read_text()) if args.add_seeds else None
    if saved is not None:                                                   # refuse before training, not after
        check_same_machine(saved.get("machine"), machine, action=f"add seeds to {args.out}")

    start = time.perf_counter()
    runs = []
    for seed in tqdm(args.seeds, desc="length extrapolation, seeds", unit="run"):
        t0 = time.perf_counter()
        res = length_extrapolation(KINDS, train_len=args.train_len, factors=(1, 2, 4, 8), steps=args.steps,
                                   batch=32, d_model=args.d_model, n_layers=2, n_heads=4, lr=3e-3, seed=seed,
                                   eval_tokens=16384, progress=False)
        res["train_loss"] = {k: [round(statistics.fmean(v[i:i + 10]), 4) for i in range(0, len(v), 10)]
                             for k, v in res["train_loss"].items()}            # mean of every 10 steps
        runs.append(res)
        row = "  ".join(f"{k} {res['loss'][k][args.train_len]:.3f}->{res['loss'][k][8 * args.train_len]:.3f}"
                        for k in KINDS)
        print(f"seed {seed} ({time.perf_counter() - t0:.0f} s): {row}", flush=True)

    lengths = [args.train_len * f for f in (1, 2, 4, 8)]
    wall = round(time.perf_counter() - start, 1)
    summary = {
        "description": "Mean next-token loss (nats) over all positions of sequences of each length, for small "
                       "decoder-only LMs trained at train_len that differ only in positional encoding; "
                       "'oracle' is the true process's loss given each sequence's topic.",
        "config": {**{k: v for k, v in runs[0]["config"].items() if k != "seed"}, "seeds": args.seeds},
        "lengths": lengths,
        "loss": {k: {L: statistics.fmean(r["loss"][k][L] for r in runs) for L in lengths} for k in KINDS},
        "loss_per_seed": {k: {L: [r["loss"][k][L] for r in runs] for L in lengths} for k in KINDS},
        "oracle": {L: statistics.fmean(r["oracle"][L] for r in runs) for L in lengths},
        "per_position": {k: [statistics.fmean(p) for p in zip(*(r["per_position"][k] for r in runs))] for k in KINDS},
        "train_loss_every_10_steps": {k: runs[0]["train_loss"][k] for k in KINDS},
        "wall_time_s": wall,
        "runs": [{"seeds": args.seeds, "wall_time_s": wall}],
        "machine": machine,
    }
    summary = json.loads(json.dumps(summary))                               # lengths as string keys, as saved
    if args.add_seeds:
        summary = merge(saved, summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out} ({summary['wall_time_s']} s)")
    for k in KINDS:
        print(f"{k:>11}: " + "  ".join(f"{L}: {summary['loss'][k][str(L)]:.3f}" for L in lengths))
    print(f"{'oracle':>11}: " + "  ".join(f"{L}: {summary['oracle'][str(L)]:.3f}" for L in lengths))


if __name__ == "__main__":
    main()
