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
Data-parallel: ``torchrun --standalone --nproc_per_node=N benchmarks/arena_sweep.py ...`` (one machine;
gloo on CPUs, NCCL on GPUs). ``--batch`` is the global batch; each rank trains on its slice, so the loss
curves equal the one-process run's (tests/test_11_arena.py checks this with 2 processes).

Zoology's protocol: ``python benchmarks/arena_sweep.py --protocol [--procs N]`` writes
``benchmarks/results/arena_protocol.json``. Every family is trained at every learning rate of a sweep;
the best run per (family, setting) is the reported one and every run is saved. Three axes: the number of
pairs at one fixed width (so the state does not change along it), the width at one number of pairs
(Zoology's Figure 2), and the learning rate over three seeds at one (pairs, width) point. A fourth arm trains
GLA with its gates started near 1 (``gate_bias``) and measures, for every GLA run, how much of a stored
pair's contribution the gates keep from the value to its query. The runs are independent, so whole runs
are spread over ``--procs`` worker processes (`torch.multiprocessing`, no gradient traffic; on a GPU
every process trains on the one device); ``--speedup`` first times a few short runs with one process and
with ``--procs``. The file is rewritten after every run that ends, so a sweep stopped by a time limit keeps
its finished runs, and ``--resume`` trains only the rest. On CUDA (``--device``, the default where there is
one) the default file is ``benchmarks/results/cuda/arena_protocol.json``. The sizes follow `utils.size_preset`
(``XFAM_SIZE_SCALE``): the CPU preset is small (``PRESETS["cpu"]``), a scale above 1 takes ``PRESETS["gpu"]``.
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
from xfam_lib.tasks import N_SPECIAL, PAD, mqar
from xfam_lib.utils import size_preset

OUT = Path(__file__).resolve().parent / "results" / "arena.json"
PROTOCOL_OUT = OUT.with_name("arena_protocol.json")
CUDA_PROTOCOL_OUT = OUT.parent / "cuda" / "arena_protocol.json"
# Zoology's protocol, sized per preset: pairs axis at width d_fixed, width axis at pairs_fixed, the learning-rate
# curve over seeds at (pairs_fixed, d_fixed); GLA's gate arm starts its gates near 1 (bias gate_bias)
PRESETS = {
    "cpu": {"pairs": [4, 8, 16], "d_fixed": 32, "widths": [16, 32, 64], "pairs_fixed": 4, "steps": 100,
            "lrs": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1], "seeds": [0, 1, 2], "batch": 16, "gate_bias": 4.0},
    "gpu": {"pairs": [8, 16, 32, 64], "d_fixed": 64, "widths": [32, 64, 128, 256], "pairs_fixed": 32,
            "steps": 2000, "lrs": [3e-4, 1e-3, 3e-3, 1e-2], "seeds": [0, 1, 2], "batch": 64, "gate_bias": 4.0},
}
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


def protocol_grid(cfg: dict, families) -> list[dict]:
    """Every run of the protocol once: ``{"family", "pairs", "d_model", "lr", "seed", "gate_bias"}``.

    The pairs axis (width ``d_fixed``) and the width axis (``pairs_fixed`` pairs) at the first seed, the
    learning-rate curve at (``pairs_fixed``, ``d_fixed``) for every seed, GLA with ``gate_bias`` on the
    pairs axis; a run shared by two axes is trained once.
    """
    seed0, specs = cfg["seeds"][0], []
    for lr in cfg["lrs"]:               # axis by axis, every family in each: a cut-short sweep covers them all
        specs += [(f, p, cfg["d_fixed"], lr, seed0, 0.0) for p in cfg["pairs"] for f in families]
    if "gla" in families:
        specs += [("gla", p, cfg["d_fixed"], lr, seed0, cfg["gate_bias"]) for lr in cfg["lrs"] for p in cfg["pairs"]]
    for lr in cfg["lrs"]:
        specs += [(f, cfg["pairs_fixed"], cfg["d_fixed"], lr, s, 0.0) for s in cfg["seeds"] for f in families]
    for lr in cfg["lrs"]:
        specs += [(f, cfg["pairs_fixed"], d, lr, seed0, 0.0) for d in cfg["widths"] for f in families]
    keys = ("family", "pairs", "d_model", "lr", "seed", "gate_bias")
    return [dict(zip(keys, spec)) for spec in dict.fromkeys(specs)]


def gla_retention(model: ArenaLM, pairs: int, seed: int) -> dict:
    """How much of a stored pair GLA's gates keep until its query, on fresh MQAR sequences.

    Per layer: the mean gate ``exp(log_g)`` over tokens and channels, and the mean over queries and channels
    of ``exp(sum of log_g from the value's position to the query's)``, the factor by which the gates scale
    the pair's term ``k v^T`` in the state before the query reads it.
    """
    ids, targets = mqar(64, pairs, 4 * pairs + 2, generator=torch.Generator().manual_seed(20_000 + seed))
    logs = []
    hooks = [m.gate.register_forward_hook(lambda mod, inp, out: logs.append(F.logsigmoid(out) / 16))
             for m in model.mixers]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    rows, q_pos = (targets != PAD).nonzero(as_tuple=True)
    keys = ids[:, : 2 * pairs : 2]
    v_pos = 2 * (keys[rows] == ids[rows, q_pos][:, None]).long().argmax(-1) + 1
    out = {"mean_gate": [], "kept_to_query": []}
    for log_g in logs:                                         # (B, L, d)
        cum = log_g.cumsum(1)
        kept = (cum[rows, q_pos] - cum[rows, v_pos]).exp()      # decay over (value, query]
        out["mean_gate"].append(log_g.exp().mean().item())
        out["kept_to_query"].append(kept.mean().item())
    return out


def protocol_run(spec: dict, cfg: dict, device: str = "cpu") -> dict:
    """Train one protocol run (MQAR at ``spec``'s pairs, width, learning rate and seed) on ``device`` and
    return its record."""
    start = time.perf_counter()
    kwargs = {"gate_bias": spec["gate_bias"]} if spec["family"] == "gla" else {}
    r = train_arena(spec["family"], "mqar", spec["pairs"], d_model=spec["d_model"], steps=cfg["steps"],
                    batch=cfg["batch"], lr=spec["lr"], seed=spec["seed"], device=device, return_model=True,
                    **kwargs)
    record = {**spec, **{k: r[k] for k in ("accuracy", "params", "state_bytes", "seq_len")},
              "loss_first": r["losses"][0], "loss_last": r["losses"][-1]}
    if spec["family"] == "gla":
        torch.manual_seed(spec["seed"])                        # train_arena's initial model, rebuilt
        init = ArenaLM("gla", r["model"].head.out_features, spec["d_model"], max_len=r["seq_len"],
                       seed=spec["seed"], **kwargs)
        record["gate_init"] = gla_retention(init, spec["pairs"], spec["seed"])
        record["gate_trained"] = gla_retention(r["model"].cpu(), spec["pairs"], spec["seed"])
    record["wall_s"] = round(time.perf_counter() - start, 2)
    return record


def _worker_init(threads: int) -> None:
    torch.set_num_threads(threads)


def _ready(_) -> bool:
    return True


def run_protocol(specs: list[dict], cfg: dict, procs: int, threads: int, on_result=None,
                 device: str = "cpu") -> tuple[list[dict], float]:
    """Every spec's record and the seconds spent starting the workers; whole runs are spread over ``procs``
    spawned processes (1: in this one, no start-up), each record handed to ``on_result`` as soon as its
    run ends (in the order the runs end)."""
    if procs == 1:
        _worker_init(threads)
        out = []
        for spec in specs:
            out.append(protocol_run(spec, cfg, device))
            if on_result:
                on_result(out[-1])
        return out, 0.0
    import functools
    import torch.multiprocessing as mp
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(procs, initializer=_worker_init, initargs=(threads,)) as pool:
        pool.map(_ready, range(procs))                  # every worker started and has imported torch
        startup = time.perf_counter() - t0
        out = []
        for rec in pool.imap_unordered(functools.partial(protocol_run, cfg=cfg, device=device), specs):
            out.append(rec)
            if on_result:
                on_result(rec)
    return out, startup


def best_runs(runs: list[dict], axis_keys=("family", "pairs", "d_model", "seed", "gate_bias")) -> list[dict]:
    """The best run over learning rates for every (family, pairs, width, seed, gate bias): highest accuracy,
    ties broken by the lower final loss."""
    best = {}
    for r in runs:
        key = tuple(r[k] for k in axis_keys)
        if key not in best or (r["accuracy"], -r["loss_last"]) > (best[key]["accuracy"], -best[key]["loss_last"]):
            best[key] = r
    return list(best.values())


def protocol_main(args) -> None:
    """``--protocol``: the whole grid, saved after every run; ``--speedup`` measures 1 against ``--procs``."""
    preset = size_preset(args.device)
    cfg = dict(PRESETS["cpu" if preset.scale == 1 else "gpu"])
    for k in ("steps", "lrs", "seeds"):
        if getattr(args, f"protocol_{k}") is not None:
            cfg[k] = getattr(args, f"protocol_{k}")
    families = args.families
    specs = protocol_grid(cfg, families)
    result = {"name": "arena_protocol", "task": "mqar", "preset": preset.name, "scale": preset.scale,
              "config": cfg, "families": list(families), "procs": args.procs, "threads_per_proc": args.threads or 1,
              "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
              "device": args.device, "torch": torch.__version__, "n_runs": len(specs)}
    if torch.device(args.device).type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(args.device)
    if args.resume and args.out.exists() and "speedup" in json.loads(args.out.read_text()):
        result["speedup"] = json.loads(args.out.read_text())["speedup"]   # measured when the sweep began
    elif args.speedup:               # distinct seeds: the probe's runs are not the grid's
        probe = [dict(s, seed=100 + i) for i, s in enumerate(
            [s for s in specs if s["pairs"] == cfg["pairs_fixed"] and s["d_model"] == cfg["d_fixed"]
             and s["gate_bias"] == 0.0][: 2 * args.procs])]
        short = {**cfg, "steps": max(1, cfg["steps"] // 2)}
        wall, startup = {}, {}
        for n in (1, args.procs):
            t0 = time.perf_counter()
            _, startup[n] = run_protocol(probe, short, n, args.threads or 1, device=args.device)
            wall[n] = time.perf_counter() - t0
        result["speedup"] = {"runs": len(probe), "steps": short["steps"], "procs": args.procs,
                             "wall_s": {str(n): round(t, 2) for n, t in wall.items()},
                             "startup_s": round(startup[args.procs], 2),
                             "speedup": round(wall[1] / wall[args.procs], 2),
                             "speedup_after_startup": round(wall[1] / (wall[args.procs] - startup[args.procs]), 2)}
        print(f"speed-up with {args.procs} processes over one: {result['speedup']}", flush=True)
    start, runs = time.perf_counter(), []
    if args.resume and args.out.exists():          # keep the finished runs of the same grid, train the rest
        saved = json.loads(args.out.read_text())
        same_training = all(saved.get("config", {}).get(k) == cfg[k] for k in ("steps", "batch"))
        if same_training:           # a run is its spec plus the training recipe: keep those the grid still has
            wanted = {tuple(s.values()) for s in specs}
            runs = [r for r in saved["runs"] if tuple(r[k] for k in specs[0]) in wanted]
            done = {tuple(r[k] for k in specs[0]) for r in runs}
            specs_left = [s for s in specs if tuple(s.values()) not in done]
            result["resumed_runs"] = len(runs)
            result["resumed_wall_time_s"] = saved.get("wall_time_s", 0.0) + saved.get("resumed_wall_time_s", 0.0)
            print(f"resuming: {len(runs)} runs kept, {len(specs_left)} to train", flush=True)
        else:
            specs_left = specs
    else:
        specs_left = specs

    def save(rec=None) -> None:
        if rec is not None:
            runs.append(rec)
            print(f"{len(runs)}/{len(specs)} {rec['family']:15s} pairs {rec['pairs']:3d} d {rec['d_model']:3d} "
                  f"lr {rec['lr']:.0e} seed {rec['seed']} bias {rec['gate_bias']:g}: accuracy {rec['accuracy']:.3f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        result.update(runs=runs, best=best_runs(runs), complete=len(runs) == len(specs),
                      wall_time_s=round(time.perf_counter() - start, 1))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")            # a kill while writing leaves the last save whole
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, args.out)

    run_protocol(specs_left, cfg, args.procs, args.threads or 1, on_result=save, device=args.device)
    save()
    print(f"wrote {args.out}: {len(runs)} runs in {result['wall_time_s']:.0f} s with {args.procs} process(es)")


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
    ap.add_argument("--protocol", action="store_true", help="Zoology's protocol (see the module docstring)")
    ap.add_argument("--procs", type=int, default=1, help="--protocol: worker processes, whole runs each")
    ap.add_argument("--speedup", action="store_true", help="--protocol: first time 1 process against --procs")
    ap.add_argument("--resume", action="store_true", help="--protocol: keep the runs already in --out")
    ap.add_argument("--protocol-steps", type=int, default=None, help="--protocol: override the preset's steps")
    ap.add_argument("--protocol-lrs", type=float, nargs="+", default=None, help="--protocol: learning rates")
    ap.add_argument("--protocol-seeds", type=int, nargs="+", default=None, help="--protocol: seeds")
    args = ap.parse_args()
    if args.protocol:
        if args.out == OUT:           # a GPU's sweep (the GPU preset) beside the other GPU results
            args.out = PROTOCOL_OUT if torch.device(args.device).type == "cpu" else CUDA_PROTOCOL_OUT
        protocol_main(args)
        return
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
