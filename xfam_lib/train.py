"""Small training loops with a progress bar, and the cross-entropy objective."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

__all__ = ["cross_entropy", "train_loop"]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int | None = None) -> torch.Tensor:
    """Mean ``-log softmax(logits)[target]`` via log-sum-exp: ``logits (..., V)``, ``targets (...)``.

    Its gradient with respect to the logits is ``(softmax(logits) - one_hot(target)) / N``.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits (..., V) and targets (...) disagree: {tuple(logits.shape)} vs {tuple(targets.shape)}")
    logits = logits.reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1)
    keep = torch.ones_like(targets, dtype=torch.bool) if ignore_index is None else targets != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.clamp_min(0)[:, None]).squeeze(-1)
    return ((lse - picked) * keep).sum() / keep.sum().clamp_min(1)


def train_loop(model: nn.Module, loss_fn: Callable[[nn.Module, int], torch.Tensor], *, steps: int, lr: float,
               warmup: int = 0, weight_decay: float = 0.0, grad_clip: float | None = 1.0,
               progress: bool = True, desc: str = "training") -> list[float]:
    """Train ``model`` with AdamW for ``steps`` steps; ``loss_fn(model, step)`` returns the loss to minimise.

    ``warmup`` linearly ramps the learning rate from ``lr/warmup`` to ``lr`` over that many steps
    (0: constant ``lr``). Returns the loss of every step. A non-finite loss stops training with
    a ``FloatingPointError`` naming the step.
    """
    if steps <= 0 or lr <= 0 or warmup < 0:
        raise ValueError(f"need steps > 0, lr > 0, warmup >= 0; got steps={steps}, lr={lr}, warmup={warmup}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    losses: list[float] = []
    model.train()
    bar = _progress_bar(steps, desc, enabled=progress)
    for step in bar:
        loss = loss_fn(model, step)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss became {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    model.eval()
    return losses


def _progress_bar(steps: int, desc: str, *, enabled: bool):
    """A tqdm bar over ``range(steps)`` that leaves no output behind once closed.

    In a Jupyter kernel tqdm draws an ipywidget, and a saved notebook (so the HTML book) would keep
    a dead copy of it. There the bar is shown through a display handle whose content is replaced by
    an empty output when the bar closes. Elsewhere it is tqdm's text bar on stderr.
    """
    options = dict(desc=desc, disable=not enabled, leave=False, mininterval=0.5)
    if not (enabled and _in_notebook()):
        from tqdm.std import tqdm
        return tqdm(range(steps), **options)
    from IPython.display import HTML, DisplayHandle
    from tqdm.notebook import tqdm

    bar = tqdm(range(steps), display=False, **options)
    handle = DisplayHandle()
    handle.display(bar.container)
    close = bar.close

    def close_and_clear():
        close()
        handle.update(HTML(""))

    bar.close = close_and_clear
    return bar


def _in_notebook() -> bool:
    """True inside a Jupyter kernel with ipywidgets available (where a widget bar can be drawn)."""
    import importlib.util
    import sys

    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return type(shell).__name__ == "ZMQInteractiveShell" and importlib.util.find_spec("ipywidgets") is not None
