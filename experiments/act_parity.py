"""ACT on Graves's parity task: ponder cost against input difficulty (M6.3, FIGURES F6.1).

A GRU cell pondering over one parity vector (`xfam_lib.tasks.parity_task`) with
`xfam_lib.adaptive.act_halting`: at every step it reads the vector again (with a flag set on the first
step, as in Graves 2016), proposes a new state and a halting probability. The loss is the parity
cross-entropy plus ``tau`` times the mean ponder cost N + R. After training, the mean ponder cost and
the accuracy are measured for every difficulty (number of nonzero entries), per seed. Results go to
``experiments/results/act_parity.json``; chapter 6 plots them.

Usage: ``python experiments/act_parity.py [--seeds 0 1 2] [--steps 3000] [--n-bits 8]``
(about 1-2 minutes per seed on one CPU core).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from xfam_lib.adaptive import act_halting
from xfam_lib.tasks import parity_task

OUT = Path(__file__).resolve().parent / "results" / "act_parity.json"


class ParityACT(nn.Module):
    """GRU cell + ACT halting unit + parity read-out. ``forward(x (B, n_bits)) -> (logit (B,), ponder (B,), N (B,))``."""

    def __init__(self, n_bits: int, hidden: int, max_steps: int, threshold: float = 0.99):
        super().__init__()
        self.cell = nn.GRUCell(n_bits + 1, hidden)
        self.halt = nn.Linear(hidden, 1)
        nn.init.constant_(self.halt.bias, 1.0)          # Graves's initial bias: start by halting early
        self.out = nn.Linear(hidden, 1)
        self.hidden, self.max_steps, self.threshold = hidden, max_steps, threshold

    def forward(self, x):
        first = torch.cat([x, torch.ones_like(x[:, :1])], -1)        # the first-step flag
        later = torch.cat([x, torch.zeros_like(x[:, :1])], -1)

        def step(h, n):
            h = self.cell(first if n == 0 else later, h)
            return h, torch.sigmoid(self.halt(h)).squeeze(-1)

        res = act_halting(step, x.new_zeros(x.shape[0], self.hidden), self.threshold, self.max_steps)
        return self.out(res.output).squeeze(-1), res.ponder, res.n_updates


def train_parity(n_bits: int = 8, hidden: int = 128, max_steps: int = 12, tau: float = 1e-3, steps: int = 3000,
                 batch: int = 128, lr: float = 3e-3, seed: int = 0, eval_batch: int = 8000) -> dict:
    """Train one `ParityACT`; return the mean ponder cost, steps N and accuracy per difficulty."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = ParityACT(n_bits, hidden, max_steps)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        x, y, _ = parity_task(batch, n_bits, generator=gen)
        logit, ponder, _ = model(x)
        loss = F.binary_cross_entropy_with_logits(logit, y.float()) + tau * ponder.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, y, k = parity_task(eval_batch, n_bits, generator=gen)
        logit, ponder, n_upd = model(x)
    correct = ((logit > 0).long() == y).double()
    per = {d: k == d for d in range(1, n_bits + 1)}
    return {"ponder": [ponder[m].mean().item() for m in per.values()],
            "n_updates": [n_upd[m].mean().item() for m in per.values()],
            "accuracy": [correct[m].mean().item() for m in per.values()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--n-bits", type=int, default=8)
    ap.add_argument("--tau", type=float, default=1e-3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = {"n_bits": args.n_bits, "hidden": 128, "max_steps": 12, "tau": args.tau, "steps": args.steps,
              "batch": 128, "lr": 3e-3, "threshold": 0.99, "seeds": args.seeds}
    start, per_seed = time.time(), []
    for seed in args.seeds:
        per_seed.append(train_parity(args.n_bits, config["hidden"], config["max_steps"], args.tau, args.steps,
                                     config["batch"], config["lr"], seed))
        print(f"seed {seed}: ponder by difficulty " + " ".join(f"{p:.2f}" for p in per_seed[-1]["ponder"])
              + " | accuracy " + " ".join(f"{a:.2f}" for a in per_seed[-1]["accuracy"]), flush=True)
    result = {"config": config, "difficulty": list(range(1, args.n_bits + 1)),
              **{key: [r[key] for r in per_seed] for key in ("ponder", "n_updates", "accuracy")},
              "wall_time_s": round(time.time() - start, 1), "threads": 1,
              "machine": f"{platform.system()} {platform.machine()}", "torch": torch.__version__}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    print(f"wrote {OUT} in {result['wall_time_s']:.0f} s")


if __name__ == "__main__":
    main()
