"""A character-level language model on Tiny Shakespeare, three seeds (chapter 1).

`xfam_lib.text.CharGPT` (GPT-2-style Pre-LN blocks built from chapter 1's parts) trained with
`xfam_lib.text.train_char_lm`: GPT-2 initialisation, AdamW (betas 0.9, 0.95; weight decay 0.1 on
matrices only), linear warm-up then cosine decay, gradient clipping at 1, no dropout (600 steps of
2,048 characters see the training text about 1.2 times, too little to overfit: the saved train and
validation losses differ by less than 0.1). The validation loss is measured every ``eval_every`` steps on the same
windows of the last 10 % of the text. The seeds train in parallel processes, one thread each.

Results (per seed: validation curve, final train/validation loss, clipped fraction, a sample) go to
``experiments/results/char_lm.json``; chapter 1 shows them. Usage: ``python experiments/char_lm.py``
(26 minutes for the saved run, three processes on two cores shared with other work; ``--quick`` runs
one seed for 30 steps to try the script).
"""
from __future__ import annotations

import math
import multiprocessing
import time

import torch

import common
from xfam_lib.text import CharGPT, estimate_loss, sample_text, tiny_shakespeare, train_char_lm

OUT = common.RESULTS / "char_lm.json"
CONFIG = dict(d_model=64, n_layers=3, n_heads=4, block=64, dropout=0.0, batch=32, steps=600, lr=3e-3,
              warmup=100, weight_decay=0.1, grad_clip=1.0, eval_every=200, eval_batches=10,
              seeds=[0, 1, 2], sample_chars=200, prompt="ROMEO:\n")


def run_seed(cfg: dict, seed: int) -> dict:
    """Train one seed; return its validation curve, final losses, clipped fraction and a sample."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    corpus = tiny_shakespeare()
    torch.manual_seed(seed)
    model = CharGPT(len(corpus.vocab), cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["block"],
                    dropout=cfg["dropout"])
    out = train_char_lm(model, corpus, steps=cfg["steps"], batch=cfg["batch"], lr=cfg["lr"], seed=seed,
                        warmup=cfg["warmup"], weight_decay=cfg["weight_decay"], grad_clip=cfg["grad_clip"],
                        eval_every=cfg["eval_every"], eval_batches=cfg["eval_batches"], progress=False)
    train_loss = estimate_loss(model, corpus.train, block=cfg["block"], batches=cfg["eval_batches"],
                               batch=cfg["batch"])
    sample = sample_text(model, corpus, cfg["prompt"], cfg["sample_chars"],
                         generator=torch.Generator().manual_seed(seed))
    clipped = sum(n > cfg["grad_clip"] for n in out["grad_norm"]) / len(out["grad_norm"])
    print(f"seed {seed}: val {out['val'][-1][1]:.3f}, train {train_loss:.3f}, clipped {clipped:.2f} "
          f"({time.perf_counter() - start:.0f} s)", flush=True)
    return {"seed": seed, "val": out["val"], "train_loss": train_loss, "clipped_fraction": clipped,
            "sample": sample, "params": sum(p.numel() for p in model.parameters())}


def main() -> None:
    args = common.parser(__doc__, OUT).parse_args()
    cfg = common.quick(CONFIG) if args.quick else CONFIG
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(len(cfg["seeds"])) as pool:
        runs = pool.starmap(run_seed, [(cfg, seed) for seed in cfg["seeds"]])
    vocab = len(tiny_shakespeare().vocab)
    result = {"config": cfg, "params": runs[0].pop("params"), "vocab": vocab, "ln_vocab": math.log(vocab),
              "runs": [{k: v for k, v in r.items() if k != "params"} for r in runs]}
    common.save_result(args.out, result, threads=len(cfg["seeds"]), start=start)


if __name__ == "__main__":
    main()
