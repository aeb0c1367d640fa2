"""Small training loops with a progress bar, and the cross-entropy objective."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from .utils import check_bool, check_instance, check_int, check_positive_int, check_real, check_tensor, check_token_ids

__all__ = ["cross_entropy", "train_loop", "noam_lr", "progress_range"]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int | None = None,
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy via log-sum-exp: ``logits (..., V)``, ``targets (...)`` -> scalar.

    The target distribution is ``q = (1 - eps) * one_hot(target) + eps / V`` with
    ``eps = label_smoothing`` (0 gives plain ``-log softmax(logits)[target]``), so the loss is
    ``logsumexp(z) - (1 - eps) * z[target] - eps * mean(z)``, as ``F.cross_entropy(label_smoothing=eps)``.
    Its gradient with respect to the logits is ``(softmax(logits) - q) / N``. Targets equal to
    ``ignore_index`` (any int, e.g. ``PAD`` or -100) are left out, and ``N`` counts the others (the
    loss is 0 when every target is ignored). Every other target must be a class in ``[0, V)``: a
    negative target is an error unless it is the declared ``ignore_index``.
    """
    check_tensor("logits", logits, min_rank=1, floating=True)
    if ignore_index is not None:
        ignore_index = check_int("ignore_index", ignore_index)
    check_tensor("targets", targets)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits (..., V) and targets (...) disagree: {tuple(logits.shape)} vs {tuple(targets.shape)}")
    check_token_ids("targets", targets, logits.shape[-1], vocab_name="V", ignore_index=ignore_index)
    label_smoothing = check_real("label_smoothing", label_smoothing, low=0.0, high=1.0)
    logits = logits.reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1)
    keep = torch.ones_like(targets, dtype=torch.bool) if ignore_index is None else targets != ignore_index
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.where(keep, 0)[:, None]).squeeze(-1)
    per_token = lse - (1.0 - label_smoothing) * picked - label_smoothing * logits.mean(-1)
    return (per_token * keep).sum() / keep.sum().clamp_min(1)


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The warm-up ("Noam") schedule of Vaswani et al.: ``factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)``.

    ``step`` counts updates from 1. The rate rises linearly for ``warmup`` steps, peaks at
    ``step == warmup`` with ``factor * (d_model * warmup)**-0.5``, then decays as ``step**-0.5``.
    To drive an optimiser whose ``lr`` is 1: ``LambdaLR(opt, lambda s: noam_lr(s + 1, d_model, warmup))``
    (``LambdaLR`` counts from 0).
    """
    step, d_model, warmup = (check_int(name, value, low=1) for name, value in
                             (("step", step), ("d_model", d_model), ("warmup", warmup)))
    factor = check_real("factor", factor, low=0.0, low_open=True)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def train_loop(model: nn.Module, loss_fn: Callable[[nn.Module, int], torch.Tensor], *, steps: int, lr: float,
               warmup: int = 0, weight_decay: float = 0.0, grad_clip: float | None = 1.0,
               progress: bool = True, desc: str = "training") -> list[float]:
    """Train ``model`` with AdamW for ``steps`` steps; ``loss_fn(model, step)`` returns the loss to minimise.

    ``warmup`` linearly ramps the learning rate from ``lr/warmup`` to ``lr`` over that many steps
    (0: constant ``lr``). Returns the loss of every step. A non-finite loss stops training with
    a ``FloatingPointError`` naming the step. With ``progress``, a run that lasts longer than
    ``PROGRESS_DELAY_S`` shows a progress bar with the time left, removed when it ends.
    ``grad_clip`` is None (no clipping) or the positive largest gradient norm.
    """
    check_instance("model", model, nn.Module)
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a callable (model, step) -> loss, got {type(loss_fn).__name__}")
    steps, lr = check_positive_int("steps", steps), check_real("lr", lr, low=0.0, low_open=True)
    warmup, weight_decay = check_int("warmup", warmup, low=0), check_real("weight_decay", weight_decay, low=0.0)
    if grad_clip is not None:
        grad_clip = check_real("grad_clip", grad_clip, low=0.0, low_open=True)
    check_bool("progress", progress)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    losses: list[float] = []
    model.train()
    bar = _progress_bar(steps, desc, enabled=progress)
    for step in bar:
        loss = loss_fn(model, step)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"loss_fn must return a one-element loss tensor, got {type(loss).__name__} "
                            f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''} at step {step}")
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
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)  # a refresh would skip the delay
    bar.close()
    model.eval()
    return losses


PROGRESS_DELAY_S = 2.0  # shorter runs draw no bar at all


def progress_range(steps: int, desc: str = "training"):
    """``range(steps)`` with the progress bar of `train_loop` (for hand-written training loops).

    The bar appears once the loop has run ``PROGRESS_DELAY_S`` seconds, shows the time left, and
    is removed when the loop ends.
    """
    return _progress_bar(check_int("steps", steps, low=0), desc, enabled=True)


def _progress_bar(steps: int, desc: str, *, enabled: bool):
    """A tqdm bar over ``range(steps)``, drawn after ``PROGRESS_DELAY_S`` and removed when closed.

    In a Jupyter kernel tqdm draws an ipywidget, and a saved notebook (so the HTML book) would keep
    a dead copy of it. There the bar is shown through a display handle whose content is replaced by
    an empty output when the bar closes. Elsewhere it is tqdm's text bar on stderr.
    """
    options = dict(desc=desc, disable=not enabled, leave=False, mininterval=0.5, delay=PROGRESS_DELAY_S)
    if not (enabled and _in_notebook()):
        from tqdm.std import tqdm
        return tqdm(range(steps), **options)
    return _notebook_bar_class()(range(steps), display=False, **options)


def _notebook_bar_class():
    """tqdm's notebook bar, displayed through a handle (ipywidgets 7 and 8) and cleared on close."""
    from IPython.display import HTML, DisplayHandle
    from tqdm.notebook import tqdm

    from .widgets import widget_bundle

    class ClearingBar(tqdm):
        def __init__(self, *args, **kwargs):
            self.handle = DisplayHandle()
            super().__init__(*args, **kwargs)

        def display(self, *args, check_delay=True, **kwargs):
            if check_delay and not self.displayed and self._time() - self.start_t >= self.delay:
                self.handle.display(widget_bundle(self.container), raw=True)
                self.displayed = True
            return super().display(*args, check_delay=False, **kwargs)

        def close(self):
            super().close()
            if getattr(self, "displayed", False):
                self.handle.update(HTML(""))

    return ClearingBar


def _in_notebook() -> bool:
    """True inside a Jupyter kernel with ipywidgets available (where a widget bar can be drawn)."""
    import importlib.util
    import sys

    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return type(shell).__name__ == "ZMQInteractiveShell" and importlib.util.find_spec("ipywidgets") is not None
