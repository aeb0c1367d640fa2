"""The capstone sweep (M11.2, M11.6, M11.7): recall accuracy against decoding-state size, and training
throughput, for every family.

Every family of `xfam_lib.arena.FAMILIES` is trained on a recall task (default: MQAR) at several sizes
(numbers of key-value pairs) and seeds, at a matched parameter budget (`width_for_budget`). Results go
to ``benchmarks/results/arena.json`` (accuracy, parameters and decoding-state bytes per run, wall time,
machine); chapter 11 plots them. After the runs, one training step (forward, cross-entropy, backward,
AdamW) of each family's model is timed at a few sequence lengths (``--lengths``; one sequence per step,
the families interleaved round by round) and saved as throughput ratios to softmax attention at each
length (``throughput``). ``checks`` holds the sweep's wall time (runs plus throughput) against the
issue's 20-minute target and the throughput report; the book's benchmarks page lists them.

The other tasks (chapter 11, Figure 11.3b), saved under their own names: ``--task selective_copying --no-throughput
--out benchmarks/results/arena_selective_copying.json`` and ``--task induction_heads --sizes 16 32 64
--no-throughput --out benchmarks/results/arena_induction_heads.json``.

Throughput only: ``python benchmarks/arena_sweep.py --throughput-only [--threads 1]`` (well under a minute)
measures it alone, with the saved runs' task, sizes and budget, and merges it into the saved file,
keeping its runs.

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
import torch.nn.functional as F
from tqdm import tqdm

from common import interleaved_times, paired_ratio
from xfam_lib.arena import FAMILIES, TASKS, ArenaLM, train_arena, width_for_budget
from xfam_lib.tasks import N_SPECIAL

OUT = Path(__file__).resolve().parent / "results" / "arena.json"
TARGET_MINUTES = 20.0                   # issue 13: the full sweep within 20 minutes on a 2-core CPU


def measure_throughput(families, *, lengths, budget: int, vocab: int, seq_len: int, batch: int, rounds: int,
                       lr: float, device) -> dict:
    """Tokens per second of one training step of every family at each length, and its ratio to softmax's.

    Widths as the sweep's at its largest size (``vocab``, learned positions up to ``seq_len``), the model
    built with positions up to the longest length. Per length the families are timed in turn, ``rounds``
    times (`common.interleaved_times`); the ratio is the median over rounds of softmax's step time over the
    family's, so a drift in machine load hits both alike.
    """
    start = time.time()
    gen = torch.Generator().manual_seed(0)
    widths = {f: width_for_budget(f, budget, vocab=vocab, max_len=seq_len) for f in families}
    models = {f: ArenaLM(f, vocab, widths[f], max_len=max(lengths)).to(device) for f in families}
    opts = {f: torch.optim.AdamW(m.parameters(), lr=lr) for f, m in models.items()}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    tokens_per_s, ratio = {f: [] for f in families}, {f: [] for f in families}
    for L in lengths:
        ids = torch.randint(N_SPECIAL, vocab, (batch, L + 1), generator=gen).to(device)

        def step(f, x=ids[:, :-1], y=ids[:, 1:]):
            loss = F.cross_entropy(models[f](x).flatten(0, 1), y.flatten())
            opts[f].zero_grad()
            loss.backward()
            opts[f].step()
            sync()

        times = interleaved_times({f: (lambda f=f: step(f)) for f in families}, repeats=rounds, warmup=1)
        for f in families:
            tokens_per_s[f].append(batch * L / sorted(times[f])[len(times[f]) // 2])
            ratio[f].append(paired_ratio(times, "softmax", f) if "softmax" in families else None)
        print(f"L={L}: " + ", ".join(f"{f} {r:.2f}" for f, r in ((f, ratio[f][-1]) for f in families) if r), flush=True)
    return {"lengths": list(lengths), "batch": batch, "rounds": rounds, "widths": widths, "vocab": vocab,
            "params": {f: sum(p.numel() for p in m.parameters()) for f, m in models.items()},
            "step": "forward, cross-entropy, backward, AdamW step; one process",
            "tokens_per_s": tokens_per_s, "ratio_to_softmax": ratio, "threads": torch.get_num_threads(),
            "device": str(device), "wall_time_s": round(time.time() - start, 1)}


def checks(result: dict) -> list[dict]:
    """The benchmarks page's entries: the full sweep's wall time against the target, and the throughput report."""
    out = []
    if "wall_time_s" in result:
        minutes = (result["wall_time_s"] + result.get("throughput", {}).get("wall_time_s", 0.0)) / 60
        n_runs = len(result.get("runs", []))
        out.append({"what": f"full sweep wall time, minutes ({n_runs} training runs"
                            + (" + throughput" if "throughput" in result else "") + f", {result.get('processes', 1)} "
                            f"process(es), {result.get('threads', '?')} thread(s)"
                            + ("" if result.get("complete", True) else ", incomplete") + ")",
                    "value": round(minutes, 2), "target": f"<= {TARGET_MINUTES:g}",
                    "ok": bool(result.get("complete", True)) and minutes <= TARGET_MINUTES})
    tp = result.get("throughput")
    if tp:
        ratios = tp["ratio_to_softmax"]
        expected = len(ratios) * len(tp["lengths"])
        got = sum(r is not None and r > 0 and r == r for rs in ratios.values() for r in rs)
        out.append({"what": f"training throughput ratios to softmax, {len(ratios)} families x L = "
                            + ", ".join(map(str, tp["lengths"])) + " (in 'throughput')",
                    "value": got, "target": f"= {expected} (every family at every length)", "ok": got == expected})
    return out


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
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048],
                    help="sequence lengths of the throughput measurement")
    ap.add_argument("--throughput-batch", type=int, default=1, help="sequences per timed training step")
    ap.add_argument("--throughput-rounds", type=int, default=5, help="timed rounds per length")
    ap.add_argument("--throughput-only", action="store_true",
                    help="measure the throughput only and merge it into --out, keeping its saved runs")
    ap.add_argument("--no-throughput", action="store_true", help="train the runs only")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per process (default: torch's own)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    def throughput() -> dict:
        vocab = 4 * max(args.sizes) + 2 if args.task == "mqar" else 16
        seq_len = TASKS[args.task](1, max(args.sizes), vocab, torch.Generator().manual_seed(0), "cpu")[0].shape[1]
        return measure_throughput(args.families, lengths=args.lengths, budget=args.budget, vocab=vocab,
                                  seq_len=seq_len, batch=args.throughput_batch, rounds=args.throughput_rounds,
                                  lr=args.lr, device=torch.device(args.device))

    if args.throughput_only:            # one process; merge into the saved sweep, never dropping its runs
        result = json.loads(args.out.read_text()) if args.out.exists() else {}
        result.setdefault("name", "arena")
        for k in ("task", "sizes", "budget", "lr"):      # the saved runs' settings, so the widths are theirs
            if k in result.get("config", {}):
                setattr(args, k, result["config"][k])
        result["throughput"] = throughput()
        result["checks"] = checks(result)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        for c in result["checks"]:
            print(f"{c['what']}: {c['value']} (target {c['target']}) {'OK' if c['ok'] else 'MISSED'}")
        print(f"merged the throughput into {args.out} ({len(result.get('runs', []))} saved runs kept)")
        return

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = torch.device(args.device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
    rank = dist.get_rank() if distributed else 0
    start, runs, extra, runs_wall = time.time(), [], {}, []
    run_keys = ("families", "task", "sizes", "seeds", "steps", "batch", "budget", "lr")

    def save() -> None:                 # after every run, so an interrupted sweep keeps what it finished
        result = {"name": "arena" if args.task == "mqar" else f"arena_{args.task}", "task": args.task, "config": {k: getattr(args, k) for k in run_keys},
                  "processes": dist.get_world_size() if distributed else 1, "runs": runs,
                  "complete": len(runs) == len(args.seeds) * len(args.families) * len(args.sizes),
                  "wall_time_s": runs_wall[0] if runs_wall else round(time.time() - start, 1),   # the runs' time
                  "threads": torch.get_num_threads(),
                  "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
                  "device": str(device), "torch": torch.__version__, **extra}
        result["checks"] = checks(result)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))

    # seeds outermost: a partial sweep still covers every family; the bar estimates the time left
    grid = [(seed, family, size) for seed in args.seeds for family in args.families for size in args.sizes]
    bar = tqdm(grid, desc="arena runs", unit="run", disable=rank != 0, leave=False)
    for seed, family, size in bar:
        vocab = 4 * size + 2 if args.task == "mqar" else 16
        seq_len = TASKS[args.task](1, size, vocab, torch.Generator().manual_seed(0), "cpu")[0].shape[1]
        # count the learned positions train_arena builds (max_len = the sequence length), not 512
        width = width_for_budget(family, args.budget, vocab=vocab, max_len=seq_len)
        r = train_arena(family, args.task, size, vocab=vocab, d_model=width, steps=args.steps,
                        batch=args.batch, lr=args.lr, seed=seed, device=device)
        runs.append({"family": family, "size": size, "seed": seed, "d_model": width, **r})
        if rank == 0:
            bar.write(f"{family:15s} size {size:3d} seed {seed}: accuracy {r['accuracy']:.3f}, "
                      f"{r['params']} params, state {r['state_bytes']} B ({time.time() - start:.0f} s)")
            save()
    if rank == 0 and not args.no_throughput:
        runs_wall.append(round(time.time() - start, 1))
        extra["throughput"] = throughput()
        save()
    if rank == 0:
        print(f"wrote {args.out} in {time.time() - start:.0f} s")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
