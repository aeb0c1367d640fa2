"""Far retrieval: train short, then ask for a token far back (chapter 4, beside M4.15's length study).

Every arm is the same small `xfam_lib.transformer.TransformerLM` as in ``length_extrapolation.py``
(2 layers, 4 heads), trained with the same seed and batches on `xfam_lib.tasks.induction_heads` at
length ``train_len``: random tokens, a trigger token (``BOS``) at a random position, the token after
it, more random tokens, and the trigger again at the end; the model must output the token that
followed the first trigger. Only ``positional=`` differs. Each model is then tested on sequences of
``8 * train_len`` tokens with the first trigger placed at a chosen distance from the end (a passkey
test: the answer lies that far back), and the ALiBi arm also on much longer sequences with the
trigger three quarters of the way back, to find where its distance penalty wins over the match.

Results (accuracy per seed and distance) go to ``experiments/results/far_retrieval.json``; chapter 4
plots them next to the saved ``length_extrapolation.json``. Usage:
``python experiments/far_retrieval.py [--seeds 0 1 2] [--steps 500] [--jobs 2]`` (a single-seed try
with batch 64 and 400 steps took about 14 minutes on a lightly loaded core; the saved run, three seeds
at once on a shared, heavily loaded machine, took 35 minutes; ``--quick`` runs a short version).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

from xfam_lib.tasks import BOS, N_SPECIAL, induction_heads
from xfam_lib.train import train_loop
from xfam_lib.transformer import TransformerLM
from xfam_lib.utils import machine_record

KINDS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5", "shaw", "xl")
OUT = Path(__file__).resolve().parent / "results" / "far_retrieval.json"


def passkey_batch(batch: int, length: int, distance: int, vocab: int, generator: torch.Generator):
    """`induction_heads` sequences whose first trigger sits ``distance`` tokens before the last
    position: ``(inputs (batch, length), answers (batch,))``."""
    if not 2 <= distance <= length - 1:
        raise ValueError(f"distance must be in 2 .. length-1 = {length - 1}, got {distance}")
    inputs, _ = induction_heads(batch, length, vocab, generator=generator)
    body = inputs[:, :-1]
    stray = body == BOS                                  # the trigger induction_heads placed
    body[stray] = torch.randint(N_SPECIAL, vocab, (int(stray.sum()),), generator=generator)
    where = length - 1 - distance
    inputs[:, where] = BOS
    return inputs, inputs[:, where + 1].clone()


@torch.no_grad()
def accuracy_at(model, length, distance, vocab, n, generator, chunk=128):
    """Share of ``n`` passkey sequences whose answer is the model's top guess at the last position."""
    hits = 0
    for start in range(0, n, chunk):
        inputs, answers = passkey_batch(min(chunk, n - start), length, distance, vocab, generator)
        hits += int((model(inputs)[:, -1].argmax(-1) == answers).sum())
    return hits / n


def run_seed(cfg: dict, seed: int) -> dict:
    torch.set_num_threads(cfg["threads"])
    t0 = time.perf_counter()
    long_len = cfg["train_len"] * cfg["factor"]
    out = {"accuracy": {}, "train_accuracy": {}, "alibi_reach": {}, "train_loss": {}}
    for kind in cfg["kinds"]:
        torch.manual_seed(seed)
        model = TransformerLM(cfg["vocab"], cfg["d_model"], cfg["n_layers"], cfg["n_heads"], positional=kind,
                              max_len=max([long_len] + cfg["reach_lengths"]),
                              relative_max_distance=3 * cfg["train_len"] // 4)
        gen = torch.Generator().manual_seed(seed)

        def loss_fn(m, step):
            inputs, targets = induction_heads(cfg["batch"], cfg["train_len"], cfg["vocab"], generator=gen)
            return F.cross_entropy(m(inputs)[:, -1], targets[:, -1])

        losses = train_loop(model, loss_fn, steps=cfg["steps"], lr=cfg["lr"], warmup=cfg["steps"] // 10,
                            progress=False)
        out["train_loss"][kind] = [round(statistics.fmean(losses[i:i + 10]), 4) for i in range(0, len(losses), 10)]
        test_gen = torch.Generator().manual_seed(10_000 + seed)
        inputs, targets = induction_heads(cfg["eval_n"], cfg["train_len"], cfg["vocab"], generator=test_gen)
        with torch.no_grad():
            out["train_accuracy"][kind] = float((model(inputs)[:, -1].argmax(-1) == targets[:, -1]).float().mean())
        out["accuracy"][kind] = [accuracy_at(model, long_len, d, cfg["vocab"], cfg["eval_n"], test_gen)
                                 for d in cfg["distances"]]
        if kind == "alibi":
            out["alibi_reach"] = {L: accuracy_at(model, L, 3 * L // 4, cfg["vocab"], cfg["reach_n"], test_gen,
                                                 chunk=4) for L in cfg["reach_lengths"]}
        print(f"seed {seed} {kind:>10}: train-length accuracy {out['train_accuracy'][kind]:.2f}, at "
              f"{long_len} tokens by distance " + " ".join(f"{a:.2f}" for a in out["accuracy"][kind]), flush=True)
    out["wall_time_s"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--quick", action="store_true", help="one seed, 40 steps, three arms")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    cfg = dict(kinds=list(KINDS), vocab=16, train_len=32, factor=8, d_model=32, n_layers=2, n_heads=4,
               batch=32, steps=args.steps, lr=3e-3, eval_n=128, threads=args.threads,
               distances=[2, 8, 16, 31, 48, 64, 96, 128, 192, 247],
               reach_lengths=[1024], reach_n=8)
    if args.quick:
        args.seeds = args.seeds[:1]
        cfg.update(steps=40, kinds=["rope", "alibi", "t5"], reach_lengths=[512], reach_n=4)

    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(run_seed, [cfg] * len(args.seeds), args.seeds))
    kinds = cfg["kinds"]
    summary = {
        "description": "Passkey-style retrieval: accuracy of the answer at the last position, for small decoder-only "
                       "models trained at train_len that differ only in positional encoding, tested at "
                       "factor * train_len tokens with the answer `distance` tokens back; alibi_reach: the ALiBi "
                       "arm at longer lengths with the answer 3/4 of the length back.",
        "config": {**cfg, "seeds": args.seeds},
        "chance": 1 / (cfg["vocab"] - N_SPECIAL),
        "train_accuracy": {k: [r["train_accuracy"][k] for r in runs] for k in kinds},
        "accuracy_per_seed": {k: [r["accuracy"][k] for r in runs] for k in kinds},
        "accuracy": {k: [statistics.fmean(a) for a in zip(*(r["accuracy"][k] for r in runs))] for k in kinds},
        "alibi_reach_per_seed": {str(L): [r["alibi_reach"].get(L) for r in runs] for L in cfg["reach_lengths"]},
        "train_loss_every_10_steps": {k: runs[0]["train_loss"][k] for k in kinds},
        "wall_time_s": round(time.perf_counter() - start, 1),
        "seed_wall_time_s": round(sum(r["wall_time_s"] for r in runs), 1),   # the seeds' wall times added up
        "machine": machine_record("cpu", threads=args.threads),             # the threads of each process
        "jobs": args.jobs,                                                   # processes, one seed each
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out} ({summary['wall_time_s']} s)")


if __name__ == "__main__":
    main()
