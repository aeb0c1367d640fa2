"""The capstone sweep (M11.2, M11.6): recall accuracy against decoding-state size for every family.

Every family of `xfam_lib.arena.FAMILIES` is trained on a recall task (default: MQAR) at several sizes
(numbers of key-value pairs) and seeds, at a matched parameter budget (`width_for_budget`). Results go
to ``benchmarks/results/arena.json`` (accuracy, parameters and decoding-state bytes per run, wall time,
machine); chapter 11 plots them.

One process:  ``python benchmarks/arena_sweep.py [--families softmax mamba] [--sizes 4 8 16] [--seeds 0 1 2]``
Data-parallel: ``torchrun --standalone --nproc_per_node=N benchmarks/arena_sweep.py ...`` (gloo on CPUs,
NCCL on GPUs). ``--batch`` is the global batch; each rank trains on its slice, so the loss curves equal
the one-process run's (tests/test_11_arena.py checks this with 2 processes).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.distributed as dist

from xfam_lib.arena import FAMILIES, TASKS, train_arena, width_for_budget

OUT = Path(__file__).resolve().parent / "results" / "arena.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--task", default="mqar", choices=sorted(TASKS))
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32, help="global batch (split over the processes)")
    ap.add_argument("--budget", type=int, default=20_000, help="parameter budget per model")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = torch.device(args.device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
    rank = dist.get_rank() if distributed else 0
    start, runs = time.time(), []

    def save() -> None:                 # after every run, so an interrupted sweep keeps what it finished
        result = {"task": args.task, "config": {k: v for k, v in vars(args).items() if k not in ("out", "device")},
                  "processes": dist.get_world_size() if distributed else 1, "runs": runs,
                  "complete": len(runs) == len(args.seeds) * len(args.families) * len(args.sizes),
                  "wall_time_s": round(time.time() - start, 1), "threads": torch.get_num_threads(),
                  "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
                  "device": str(device), "torch": torch.__version__}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))

    for seed in args.seeds:             # seeds outermost: a partial sweep still covers every family
        for family in args.families:
            for size in args.sizes:
                vocab = 4 * size + 2 if args.task == "mqar" else 16
                seq_len = TASKS[args.task](1, size, vocab, torch.Generator().manual_seed(0), "cpu")[0].shape[1]
                # count the learned positions train_arena builds (max_len = the sequence length), not 512
                width = width_for_budget(family, args.budget, vocab=vocab, max_len=seq_len)
                r = train_arena(family, args.task, size, vocab=vocab, d_model=width, steps=args.steps,
                                batch=args.batch, lr=args.lr, seed=seed, device=device)
                runs.append({"family": family, "size": size, "seed": seed, "d_model": width, **r})
                if rank == 0:
                    print(f"{family:15s} size {size:3d} seed {seed}: accuracy {r['accuracy']:.3f}, "
                          f"{r['params']} params, state {r['state_bytes']} B ({time.time() - start:.0f} s)", flush=True)
                    save()
    if rank == 0:
        print(f"wrote {args.out} in {time.time() - start:.0f} s")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
