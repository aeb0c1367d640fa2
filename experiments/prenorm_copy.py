"""Pre-LN versus Post-LN on chapter 1's copy task, with depth and warm-up varied (chapter 1, M1.22).

Each run trains `xfam_lib.transformer.EncoderStackLM` (d_model 32, 4 heads, d_ff 64) on
`xfam_lib.tasks.lm_copy_task` (6 tokens out of 15, then the same 6 again) with `train_loop`
(AdamW, learning rate 1e-2, 40 steps of 16 sequences), exactly as the chapter's live cell does. Five
configurations, three seeds each: 8 layers Post-LN and Pre-LN without warm-up, 2 layers in both
placements, and 8 layers Post-LN with a 20-step warm-up. The chapter trains the first two live and
checks that they equal the saved ones.

Results (per-step losses, per configuration and seed) go to ``experiments/results/prenorm_copy.json``.
Usage: ``python experiments/prenorm_copy.py`` (about a minute on one core; ``--quick`` runs one seed
for 30 steps).
"""
from __future__ import annotations

import time

import torch

import common
from xfam_lib.tasks import PAD, lm_copy_task
from xfam_lib.train import cross_entropy, train_loop
from xfam_lib.transformer import EncoderStackLM
from xfam_lib.utils import seed_everything

OUT = common.RESULTS / "prenorm_copy.json"
CONFIG = dict(vocab=17, d_model=32, n_heads=4, d_ff=64, seq=6, batch=16, steps=40, lr=1e-2, seeds=[0, 1, 2],
              deep=8, shallow=2, warmup=20)


def copy_run(cfg: dict, norm_first: bool, n_layers: int, seed: int, warmup: int = 0) -> list[float]:
    """Per-step losses of one `EncoderStackLM` learning `lm_copy_task`."""
    gen = seed_everything(seed)
    net = EncoderStackLM(cfg["vocab"], cfg["d_model"], cfg["n_heads"], cfg["d_ff"], n_layers,
                         norm_first=norm_first, max_len=16)

    def loss_fn(m, step):
        inputs, targets = lm_copy_task(cfg["batch"], cfg["seq"], cfg["vocab"], generator=gen)
        return cross_entropy(m(inputs), targets, ignore_index=PAD)

    return train_loop(net, loss_fn, steps=cfg["steps"], lr=cfg["lr"], warmup=warmup, progress=False)


def main() -> None:
    args = common.parser(__doc__, OUT).parse_args()
    cfg = common.quick(CONFIG) if args.quick else CONFIG
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    deep, shallow, warm = cfg["deep"], cfg["shallow"], cfg["warmup"]
    arms = {"Post-LN": (False, deep, 0), "Pre-LN": (True, deep, 0),
            f"Post-LN, {shallow} layers": (False, shallow, 0), f"Pre-LN, {shallow} layers": (True, shallow, 0),
            f"Post-LN, warm-up {warm}": (False, deep, warm)}
    curves = {name: [copy_run(cfg, *arm[:2], seed, arm[2]) for seed in cfg["seeds"]] for name, arm in arms.items()}
    for name, runs in curves.items():
        print(f"{name:>22}: last loss per seed {[round(r[-1], 3) for r in runs]}")
    common.save_result(args.out, {"config": cfg, "curves": curves}, threads=args.threads, start=start)


if __name__ == "__main__":
    main()
