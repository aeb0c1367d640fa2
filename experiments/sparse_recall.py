"""What does a sparse attention pattern cost in quality, at equal numbers of kept pairs? (M7.2, M7.10, M7.11, M7.13)

`xfam_lib.ablations.train_sparse_recall` trains the same small model (`StackedRecallNet`: `RecallNet`'s
architecture, 2 layers, d = 32, 2 heads), attending in both directions, on multi-query associative recall
(`tasks.mqar`, 16 pairs, preceded by 2 global tokens: length 50) with five attention patterns: dense, a
sliding window, the window plus global tokens (Longformer), BigBird (window, global and random blocks)
and LSH (Reformer bucketing, shared QK). The four sparse patterns are set to keep about the same share of
the 50 x 50 pairs (window 6; window 4 + global; BigBird blocks of 2 with one window, one global and one
random block; LSH chunks of 6 in one round), so they differ in where their edges go, not in how many
there are; the saved ``density`` gives each one's share (LSH's measured on the evaluation sequences).
Every arm has the same parameters, initial weights and batches per seed; only the pattern differs.
Accuracy is split by whether the query's value lies beyond the reach of the window stack.

Results (per seed; the chapter shows each seed and the mean) go to
``experiments/results/sparse_recall.json``; chapter 7 plots them, and runs a small live version when the
file is not there. Usage: ``python experiments/sparse_recall.py [--seeds 0 1 2] [--steps 600]``
(``--quick`` runs one seed for 30 steps to try the script; the saved run's wall time is in the file).
The seeds are independent, so they may run as separate processes (``--seeds 0 --out part0.json`` ...) and
be joined with ``--merge part0.json part1.json part2.json``; the saved file was made that way, each seed
in its own process on one core, and records the longest process's wall time.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from common import RESULTS, parser, quick, save_result

from xfam_lib.ablations import SPARSE_RECALL_EQUAL_PAIRS, train_sparse_recall

OUT = RESULTS / "sparse_recall.json"


def merge(paths: list[Path], out: Path) -> None:
    """Join per-seed result files of the same config and machine into one, seeds in the order given."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    for part in parts[1:]:
        same = {k: v for k, v in part["config"].items() if k != "seeds"} == \
            {k: v for k, v in first["config"].items() if k != "seeds"}
        if not same or part["machine"] != first["machine"]:
            raise ValueError(f"cannot merge: {paths[0]} and another part differ in config or machine")
    merged = {**first, "config": {**first["config"], "seeds": [s for p in parts for s in p["config"]["seeds"]]}}
    for key in ("accuracy", "accuracy_far", "accuracy_near", "loss_every_10_steps"):
        merged[key] = {name: [x for p in parts for x in p[key][name]] for name in first[key]}
    merged["density"] = {name: statistics.fmean(p["density"][name] for p in parts) for name in first["density"]}
    merged["far_share"] = statistics.fmean(p["far_share"] for p in parts)
    merged["wall_time_s"] = max(p["wall_time_s"] for p in parts)
    merged["processes"] = len(parts)
    out.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"merged {len(parts)} parts into {out}")


def main() -> None:
    p = parser(__doc__, OUT)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--merge", type=Path, nargs="+", help="per-seed result files to join into --out")
    args = p.parse_args()
    if args.merge:
        merge(args.merge, args.out)
        return
    cfg = {"seeds": args.seeds, "steps": args.steps, **SPARSE_RECALL_EQUAL_PAIRS, "d_model": 32, "n_heads": 2, "n_layers": 2,
           "batch": 32, "lr": 3e-3}
    if args.quick:
        cfg = quick(cfg)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    result = train_sparse_recall(**cfg)
    for name, accs in result["accuracy_far"].items():
        print(f"{name:16s} beyond the window: " + " ".join(f"{a:.3f}" for a in accs))
    result["loss_every_10_steps"] = {
        name: [[round(x, 4) for x in curve[::10]] for curve in curves] for name, curves in result.pop("loss").items()
    }
    save_result(args.out, {"config": cfg, **result}, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
