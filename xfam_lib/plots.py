"""Figures in one house style: attention heatmaps, mask panels, loss curves, shape tables.

Every function draws from arrays it is given and returns the matplotlib ``Figure`` so that
widgets can redraw it; nothing here computes a model.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

__all__ = ["STYLE", "use_style", "attention_heatmap", "heatmaps", "loss_curves", "shape_table"]

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.frameon": False,
    "image.cmap": "viridis",
}


def use_style() -> None:
    """Apply the book's matplotlib style (called by every chapter's setup cell)."""
    plt.rcParams.update(STYLE)


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float32).numpy()
    return np.asarray(x)


def attention_heatmap(weights, ax=None, *, title: str | None = None, xlabels: Sequence[str] | None = None,
                      ylabels: Sequence[str] | None = None, vmin: float | None = 0.0, vmax: float | None = None,
                      cmap: str = "viridis", colorbar: bool = True, annotate: bool = False):
    """Draw a ``(Lq, Lk)`` matrix (attention weights or a mask) with queries as rows and keys as columns."""
    w = _to_numpy(weights).astype(float)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (Lq, Lk), got shape {w.shape}")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(3.2, 3.0))
    im = ax.imshow(w, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.grid(False)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), xlabels, rotation=90, fontsize=8)
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), ylabels, fontsize=8)
    if annotate:
        for (i, j), val in np.ndenumerate(w):
            ax.text(j, i, f"{val:.2f}", ha="center", va="center", fontsize=7, color="w" if val < 0.5 else "k")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return fig if fig is not None else ax.figure


def heatmaps(panels: dict, *, ncols: int | None = None, size: float = 2.6, suptitle: str | None = None, **kwargs):
    """Several `attention_heatmap` panels side by side: ``panels`` maps title → ``(Lq, Lk)`` matrix."""
    n = len(panels)
    ncols = ncols or n
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols + 0.4, size * nrows + 0.3), squeeze=False)
    for ax, (title, w) in zip(axes.flat, panels.items()):
        attention_heatmap(w, ax=ax, title=title, colorbar=False, **kwargs)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig


def loss_curves(curves: dict, *, ax=None, title: str | None = None, logy: bool = False,
                reference: dict | None = None, smooth: int = 1):
    """Plot named loss curves (name → list of per-step losses); ``reference`` adds labelled horizontal lines."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 3))
    for name, losses in curves.items():
        y = np.asarray(losses, dtype=float)
        if smooth > 1 and len(y) >= smooth:
            y = np.convolve(y, np.ones(smooth) / smooth, mode="valid")
        ax.plot(np.arange(len(y)) + (smooth - 1 if smooth > 1 else 0), y, label=name)
    for name, value in (reference or {}).items():
        ax.axhline(value, ls="--", c="gray", lw=1)
        ax.annotate(name, (0, value), textcoords="offset points", xytext=(2, 3), fontsize=8, color="gray")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if logy:
        ax.set_yscale("log")
    if title:
        ax.set_title(title)
    ax.legend()
    return fig if fig is not None else ax.figure


def shape_table(module: torch.nn.Module, *inputs, **kwargs) -> list[tuple[str, str, tuple]]:
    """Run ``module(*inputs, **kwargs)`` once and list ``(name, class, output shape)`` for every submodule.

    Only submodules that return a single tensor are listed, in call order.
    """
    rows: list[tuple[str, str, tuple]] = []
    hooks = []
    for name, sub in module.named_modules():
        if name:
            def hook(mod, args, out, name=name):
                if isinstance(out, torch.Tensor):
                    rows.append((name, type(mod).__name__, tuple(out.shape)))
            hooks.append(sub.register_forward_hook(hook))
    try:
        with torch.no_grad():
            module(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return rows
