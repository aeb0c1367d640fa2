"""Does the initial spectrum of an S4D model matter on real text? S4D-Lin, S4D-Inv, S4D-Real and a random
spectrum, three seeds each (chapter 9, M9.5).

A character-level language model on Tiny Shakespeare (`xfam_lib.text.tiny_shakespeare`): an embedding, two
pre-norm residual `S4DLayer`s (d_model 16, state 16, the library's ZOH kernel and FFT convolution) and a
read-out, trained for 300 steps on batches of 16 windows of 64 characters. The four arms differ only in `s4d_init`'s spectrum ("lin",
"inv", "real", "random": the eigenvalues of G / sqrt(N) - I); for a given seed every arm sees the same
weights elsewhere (only the eigenvalues are swapped in), the same batches and the same validation
windows. Adam, learning rate 3e-3 (1e-3 for the SSM's step and eigenvalues, as S4's recipe lowers it),
gradient clipping at 1. The validation loss (nats per character) is measured every ``eval_every`` steps on
fixed windows from the last 10% of the text.

Results (per arm and seed: the validation curve and the final loss) go to ``experiments/results/s4d_init.json``
with the machine; chapter 9 reports them against the seeds' spread. Usage: ``python experiments/s4d_init.py``
(four processes, one thread each; ``--quick`` runs one seed for 30 steps to try the script).
"""
from __future__ import annotations

import multiprocessing
import time
from itertools import product

import torch
import torch.nn.functional as F

import common
from xfam_lib.ssm import S4DLayer
from xfam_lib.text import tiny_shakespeare

OUT = common.RESULTS / "s4d_init.json"
CONFIG = dict(d_model=16, n_layers=2, d_state=16, block=64, batch=16, steps=300, lr=3e-3, ssm_lr=1e-3,
              grad_clip=1.0, eval_every=100, eval_windows=64, inits=["lin", "inv", "real", "random"],
              seeds=[0, 1, 2])
SSM_PARAMS = ("log_dt", "log_A_re", "A_im")
PROCESSES = 4


class S4DCharLM(torch.nn.Module):
    """Embedding, ``n_layers`` pre-norm residual `S4DLayer`s of one initial spectrum, read-out."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, d_state: int, init: str):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.norms = torch.nn.ModuleList([torch.nn.LayerNorm(d_model) for _ in range(n_layers)])
        self.layers = torch.nn.ModuleList([S4DLayer(d_model, d_state, init) for _ in range(n_layers)])
        self.norm_f = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for norm, layer in zip(self.norms, self.layers):
            h = h + layer(norm(h))
        return self.head(self.norm_f(h))


def windows(ids: torch.Tensor, starts: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-character targets ``(len(starts), block)`` from the windows at ``starts``."""
    idx = starts[:, None] + torch.arange(block + 1)
    chunk = ids[idx]
    return chunk[:, :-1], chunk[:, 1:]


def run(args: tuple[dict, str, int]) -> dict:
    """Train one (init, seed) arm; return its validation curve and final validation loss."""
    cfg, init, seed = args
    torch.set_num_threads(1)
    start = time.perf_counter()
    corpus = tiny_shakespeare()
    torch.manual_seed(seed)
    model = S4DCharLM(len(corpus.vocab), cfg["d_model"], cfg["n_layers"], cfg["d_state"], "lin")
    if init != "lin":
        # every arm of a seed shares the weights above; only the eigenvalues change
        torch.manual_seed(20_000 + seed)
        spectral = S4DCharLM(len(corpus.vocab), cfg["d_model"], cfg["n_layers"], cfg["d_state"], init)
        theirs = dict(spectral.named_parameters())
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("log_A_re", "A_im")):
                    p.copy_(theirs[name])
    ssm = [p for n, p in model.named_parameters() if n.endswith(SSM_PARAMS)]
    rest = [p for n, p in model.named_parameters() if not n.endswith(SSM_PARAMS)]
    opt = torch.optim.Adam([{"params": rest, "lr": cfg["lr"]}, {"params": ssm, "lr": cfg["ssm_lr"]}])
    data = torch.Generator().manual_seed(seed)
    val_starts = torch.randint(len(corpus.val) - cfg["block"] - 1, (cfg["eval_windows"],),
                               generator=torch.Generator().manual_seed(12345))
    val_x, val_y = windows(corpus.val, val_starts, cfg["block"])

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            out = F.cross_entropy(model(val_x).flatten(0, 1), val_y.flatten()).item()
        model.train()
        return out

    curve = []
    for step in range(1, cfg["steps"] + 1):
        starts = torch.randint(len(corpus.train) - cfg["block"] - 1, (cfg["batch"],), generator=data)
        x, y = windows(corpus.train, starts, cfg["block"])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            curve.append([step, val_loss()])
    print(f"{init:6s} seed {seed}: validation loss {curve[-1][1]:.4f} ({time.perf_counter() - start:.0f} s)",
          flush=True)
    return {"init": init, "seed": seed, "curve": curve, "val_loss": curve[-1][1]}


def main() -> None:
    args = common.parser(__doc__, OUT).parse_args()
    cfg = common.quick(CONFIG) if args.quick else dict(CONFIG)
    start = time.perf_counter()
    jobs = [(cfg, init, seed) for seed, init in product(cfg["seeds"], cfg["inits"])]
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        runs = pool.map(run, jobs)
    val = {i: [r["val_loss"] for s in cfg["seeds"] for r in runs if r["init"] == i and r["seed"] == s]
           for i in cfg["inits"]}
    curves = {i: [r["curve"] for s in cfg["seeds"] for r in runs if r["init"] == i and r["seed"] == s]
              for i in cfg["inits"]}
    common.save_result(args.out, {"config": cfg, "val_loss": val, "curves": curves,
                                  "processes": PROCESSES}, threads=1, start=start)


if __name__ == "__main__":
    main()
