"""Where does a small trained LM look? Mean attention by relative position, before and after training (M7.18, F7.8).

Each seed is `xfam_lib.ablations.train_sink_lm`: a 2-layer `TransformerLM` (RoPE, 4 heads, d = 32)
trained on a `LaggedTopicLanguage` whose rule copies (a permutation of) the token ``lag`` steps back,
sequences of 64 tokens. `attention_by_distance` averages the attention weights of every head on a
held-out batch by ``i - j``, and records the weight on token 0 (an "attention sink") against the uniform
share. Results go to ``experiments/results/sink_attention.json``; chapter 7 plots them.
Usage: ``python experiments/sink_attention.py [--seeds 0 1 2] [--steps 300]`` (3.8 minutes on one shared
core under heavy load; ``--quick`` runs one seed for 40 steps).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

from xfam_lib.ablations import train_sink_lm
from xfam_lib.utils import machine_record

OUT = Path(__file__).resolve().parent / "results" / "sink_attention.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one seed, 40 steps")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], 40
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    seeds = tqdm(args.seeds, desc="attention sinks, seeds", unit="run")
    runs = [train_sink_lm(seed=s, steps=args.steps) for s in seeds]
    result = {"seeds": args.seeds, "runs": runs, "minutes": (time.perf_counter() - start) / 60,
              "machine": machine_record("cpu", threads=args.threads)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result))
    for r in runs:
        a = r["after"]
        peak = max(range(len(a["by_distance"])), key=a["by_distance"].__getitem__)
        print(f"seed {r['config']['seed']}: loss {r['final_loss']:.3f}, peak at i-j={peak} "
              f"({a['by_distance'][peak]:.3f}), token 0 {a['first_token']:.4f} (max head "
              f"{a['first_token_max_head']:.4f}, uniform {a['uniform']:.4f})")
    print(f"wrote {args.out} in {result['minutes']:.1f} min")


if __name__ == "__main__":
    main()
