"""Induction heads need two attention layers (M11.4, chapter 11 Figure 11.5; Olsson et al. 2022).

The library's plain decoder `xfam_lib.transformer.TransformerLM` (no token shift) with one and with two
layers is trained on `xfam_lib.tasks.induction_heads` for each seed and tested on 512 fresh sequences.
Every data position of the test sequences gets its own label before scoring, so the only repeated token
is the trigger, and `attention.induction_score` of a head is the attention from the second trigger to the
answer. Saved per (layers, seed): the accuracy, the best head's induction score per layer and the
previous-token score (the answer's attention on the trigger before it); for the two-layer model of the
first seed also the previous-token head's and the induction head's weights on the first test sequence.
Results go to ``experiments/results/induction_layers.json``; chapter 11 plots them.

Usage: ``python experiments/induction_layers.py`` (about 30 seconds on one CPU core; ``--quick``: one
seed, 30 steps).
"""
from __future__ import annotations

import time

import torch

from xfam_lib.attention import induction_score
from xfam_lib.tasks import BOS, N_SPECIAL, PAD, induction_heads
from xfam_lib.train import cross_entropy, train_loop
from xfam_lib.transformer import TransformerLM, attention_weights

from common import RESULTS, parser, quick, save_result   # experiments/common.py

OUT = RESULTS / "induction_layers.json"
DEFAULTS = {"length": 16, "vocab": 10, "steps": 250, "seeds": [0, 1, 2], "d_model": 32, "n_heads": 2,
            "batch": 32, "lr": 3e-3, "test_batch": 512, "test_seed": 30_000}


def train_induction(cfg: dict, n_layers: int, seed: int, test_x: torch.Tensor, test_y: torch.Tensor) -> tuple:
    """Train one `TransformerLM`; return its accuracy on the last position and its attention weights."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TransformerLM(cfg["vocab"], cfg["d_model"], n_layers, cfg["n_heads"], max_len=cfg["length"])

    def loss_fn(m, step):
        x, y = induction_heads(cfg["batch"], cfg["length"], cfg["vocab"], generator=gen)
        return cross_entropy(m(x), y, ignore_index=PAD)

    train_loop(model, loss_fn, steps=cfg["steps"], lr=cfg["lr"], warmup=cfg["steps"] // 10)
    with torch.no_grad():
        weights = attention_weights(model, test_x)
        acc = (model(test_x)[:, -1].argmax(-1) == test_y[:, -1]).float().mean().item()
    return acc, weights


def main() -> None:
    args = parser(__doc__, OUT).parse_args()
    cfg = quick(DEFAULTS) if args.quick else dict(DEFAULTS)
    torch.set_num_threads(args.threads)
    L = cfg["length"]
    test_x, test_y = induction_heads(cfg["test_batch"], L, cfg["vocab"],
                                     generator=torch.Generator().manual_seed(cfg["test_seed"]))
    # every data position its own label: the only repeated token is the trigger
    labels = torch.where(test_x == BOS, BOS, N_SPECIAL + torch.arange(L).expand_as(test_x))[:, None]
    first = (test_x == BOS).long().argmax(-1)              # the first trigger; the answer follows it
    rows = torch.arange(len(test_x))
    start, runs, maps = time.perf_counter(), [], {}
    for n_layers in (1, 2):
        for seed in cfg["seeds"]:
            acc, weights = train_induction(cfg, n_layers, seed, test_x, test_y)
            induction = {k: [induction_score(w[:, h: h + 1], labels).item() for h in range(w.shape[1])]
                         for k, w in weights.items()}
            prev = {k: [w[rows, h, first + 1, first].mean().item() for h in range(w.shape[1])]
                    for k, w in weights.items()}
            runs.append({"n_layers": n_layers, "seed": seed, "accuracy": acc,
                         "induction": {k: max(v) for k, v in induction.items()},
                         "prev_token": {k: max(v) for k, v in prev.items()}})
            if n_layers == 2 and seed == cfg["seeds"][0]:
                (name1, p1), (name2, s2) = next(iter(prev.items())), list(induction.items())[1]
                h1, h2 = max(range(len(p1)), key=p1.__getitem__), max(range(len(s2)), key=s2.__getitem__)
                maps = {"tokens": test_x[0].tolist(), "first": int(first[0]),
                        "prev_head": h1, "prev_weights": weights[name1][0, h1].tolist(),
                        "induction_head": h2, "induction_weights": weights[name2][0, h2].tolist()}
            print(f"{n_layers} layer(s), seed {seed}: accuracy {acc:.3f}; induction "
                  + ", ".join(f"{v:.3f}" for v in runs[-1]["induction"].values())
                  + f" ({time.perf_counter() - start:.0f} s)", flush=True)
    save_result(args.out, {"name": "induction_layers", "task": "induction_heads", "config": cfg,
                           "chance": 1 / (cfg["vocab"] - N_SPECIAL), "runs": runs, "maps": maps},
                threads=args.threads, start=start)


if __name__ == "__main__":
    main()
