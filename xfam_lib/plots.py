"""Figures in one house style: attention heatmaps, mask panels, loss curves, shape tables.

Every function draws from arrays it is given and returns the matplotlib ``Figure`` so that
widgets can redraw it; nothing here computes a model.
"""
from __future__ import annotations

import textwrap
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

__all__ = ["STYLE", "use_style", "attention_heatmap", "plot_mask", "heatmaps", "loss_curves", "shape_table", "module_tree",
           "architecture_diagram"]

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


# Inches. A captioned figure is shown 660 px wide in the book's column: 70 % of its own width is
# 943 px, 9.4 in at 100 dpi, and tight bounding boxes add the labels outside the axes on top.
MAX_WIDTH = 9.0


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


def plot_mask(mask, ax=None, title: str | None = None):
    """Draw a boolean ``(Lq, Lk)`` attention mask (dark = may attend) with its density, the fraction of
    allowed pairs, in the title. Returns the Figure."""
    m = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    if m.ndim != 2 or m.dtype != bool:
        raise ValueError(f"mask must be a boolean 2-D (Lq, Lk) array, got shape {m.shape} and dtype {m.dtype}")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(3.0, 3.0))
    ax.imshow(m, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.grid(False)
    ax.set_xticks([])
    ax.set_yticks([])
    density = f"density {m.mean():.3f}"
    ax.set_title(f"{title}\n{density}" if title else density, fontsize=9)
    return fig if fig is not None else ax.figure


def heatmaps(panels: dict, *, ncols: int | None = None, size: float = 2.6, suptitle: str | None = None, **kwargs):
    """Several `attention_heatmap` panels side by side: ``panels`` maps title → ``(Lq, Lk)`` matrix.

    Without ``ncols`` the panels form one row if it fits `MAX_WIDTH`, else balanced rows (4 panels:
    2 x 2); panels shrink below ``size`` if ``ncols`` of them would be wider than `MAX_WIDTH`.
    """
    n = len(panels)
    if ncols is None:                     # one row if it fits MAX_WIDTH, else balanced rows
        fit = max(1, int((MAX_WIDTH - 0.4) // size))
        ncols = -(-n // -(-n // fit))
    size = min(size, (MAX_WIDTH - 0.4) / ncols)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols + 0.4, size * nrows + 0.3), squeeze=False)
    for ax, (title, w) in zip(axes.flat, panels.items()):
        attention_heatmap(w, ax=ax, title=title, colorbar=False, **kwargs)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if suptitle:                          # wrapped to the figure's width (about 6.5 pt a character)
        fig.suptitle(textwrap.fill(suptitle, max(20, int(fig.get_figwidth() * 72 / 6.5))))
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


# ----------------------------------------------------------------------------- architecture drawings
_BOX_COLOURS = (  # (substring of the class name, colour); first match wins
    ("Attention", "#f6bd60"), ("FeedForward", "#90caf9"), ("SwiGLU", "#90caf9"), ("Norm", "#b9e4c9"),
    ("Embedding", "#e0e0e0"), ("Linear", "#d7bde2"),
)


def module_tree(module: torch.nn.Module, *inputs, **kwargs) -> list[dict]:
    """Run ``module(*inputs, **kwargs)`` once and describe every submodule it called, in call order.

    Each row is a dict with ``name`` (dotted path), ``cls`` (class name), ``depth`` (1 for a direct
    child; containers that are never called, like ``nn.ModuleList``, do not count), ``shape`` (the
    output shape, or None when the output is not a single tensor) and ``params`` (parameters of the
    submodule and its children). Submodules that are not called do not appear.
    """
    order: list[str] = []
    shapes: dict[str, tuple | None] = {}
    hooks = []
    for name, sub in module.named_modules():
        if not name:
            continue

        def pre(mod, args, name=name):
            if name not in shapes:
                order.append(name)
                shapes[name] = None

        def post(mod, args, out, name=name):
            shapes[name] = tuple(out.shape) if isinstance(out, torch.Tensor) else None

        hooks.append(sub.register_forward_pre_hook(pre))
        hooks.append(sub.register_forward_hook(post))
    try:
        with torch.no_grad():
            module(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    subs = dict(module.named_modules())
    called = set(order)
    rows = []
    for name in order:
        ancestors = [a for a in called if name.startswith(a + ".")]
        rows.append({"name": name, "cls": type(subs[name]).__name__, "depth": len(ancestors) + 1,
                     "shape": shapes[name], "params": sum(p.numel() for p in subs[name].parameters())})
    return rows


def _structure(rows: list[dict], name: str) -> tuple:
    """The (relative name, class) sequence of ``name``'s descendants: equal for identical repeated layers."""
    return tuple((r["name"][len(name):], r["cls"]) for r in rows if r["name"].startswith(name + "."))


def architecture_diagram(module: torch.nn.Module, *inputs, columns: dict[str, Sequence[str]] | None = None,
                         max_depth: int = 3, links: Sequence[tuple[str, str, str]] = (),
                         show_params: bool = True, title: str | None = None, **kwargs):
    """Draw ``module`` as nested boxes from its live module tree, each with the output shape of one forward pass.

    ``module(*inputs, **kwargs)`` is run once (see `module_tree`). ``columns`` maps a column title
    to the direct children drawn in it (default: one column with every child); rows go top to
    bottom in call order, indented by depth, down to ``max_depth``. A layer that repeats the
    structure of the layer before it (``layers.1`` after ``layers.0``) is drawn as one box: same
    structure, separate weights. Columns wider together than `MAX_WIDTH` are drawn smaller, text
    included. ``links`` lists ``(source, target_suffix, label)`` arrows, e.g.
    ``("encoder", "cross_attn", "memory")``. Identity modules are skipped. Returns the Figure.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise ValueError(f"max_depth must be a positive int, got {max_depth!r}")
    rows = [r for r in module_tree(module, *inputs, **kwargs) if r["cls"] != "Identity"]
    top = [r["name"] for r in rows if r["depth"] == 1]
    columns = {"": top} if columns is None else {k: list(v) for k, v in columns.items()}
    unknown = [n for names in columns.values() for n in names if n not in top]
    if unknown:
        raise ValueError(f"columns name {unknown}, which are not called children of {type(module).__name__}; "
                         f"called children: {top}")
    # choose the rows of every column: depth limit, repeated layers collapsed
    layout: dict[str, list[dict]] = {}
    for title_c, names in columns.items():
        chosen, hidden_prefixes, prev_by_parent = [], [], {}
        for r in rows:
            root = r["name"].split(".")[0]
            if root not in names or r["depth"] > max_depth:
                continue
            if any(r["name"].startswith(p + ".") for p in hidden_prefixes):
                continue
            parent, _, last = r["name"].rpartition(".")
            row = dict(r, collapsed=False)
            if last.isdigit():
                prev = prev_by_parent.get(parent)
                if prev is not None and _structure(rows, prev) == _structure(rows, r["name"]) and _structure(rows, prev):
                    row["collapsed"] = True
                    hidden_prefixes.append(r["name"])
                prev_by_parent[parent] = r["name"]
            chosen.append(row)
        layout[title_c] = chosen

    drawn = [r["name"] for chosen in layout.values() for r in chosen]
    for source, suffix, _ in links:
        if source not in drawn:
            raise ValueError(f"link source {source!r} is not drawn; drawn: {drawn}")
        if not any(n.endswith(suffix) and n != source for n in drawn):
            raise ValueError(f"no drawn module ends with {suffix!r}")

    n_rows = max(len(v) for v in layout.values())
    col_w, indent, row_h = 5.2, 0.35, 1.0
    width = col_w * len(layout) + 0.6 * (len(layout) - 1)
    shrink = min(1.0, MAX_WIDTH / width)                   # scales the drawing and its text together
    fig, ax = plt.subplots(figsize=(width * shrink, 0.3 * n_rows + 0.9))
    ax.set_xlim(-0.1, len(layout) * (col_w + 0.6) - 0.5)
    ax.set_ylim(-n_rows * row_h - 0.2, 0.8)
    ax.axis("off")
    where: dict[str, tuple[float, float, float]] = {}      # name -> (x_left, x_right, y_centre)
    for c, (title_c, chosen) in enumerate(layout.items()):
        x0 = c * (col_w + 0.6)
        if title_c:
            ax.text(x0 + col_w / 2, 0.35, title_c, ha="center", va="bottom", fontsize=11 * shrink, weight="bold")
        for i, r in enumerate(chosen):
            y = -i * row_h - 0.5
            left = x0 + (r["depth"] - 1) * indent
            colour = next((col for key, col in _BOX_COLOURS if key in r["cls"]), "#ffffff")
            ax.add_patch(plt.Rectangle((left, y - 0.4), x0 + col_w - left, 0.8, facecolor=colour,
                                       edgecolor="#555555", lw=0.8))
            parent = max((a for a in where if r["name"].startswith(a + ".")), key=len, default="")
            label = f"{r['name'][len(parent) + 1 if parent else 0:]}: {r['cls']}"
            if r["collapsed"]:
                label += "  (same structure, own weights)"
            ax.text(left + 0.08, y, label, va="center", fontsize=7.5 * shrink, family="monospace")
            right = "" if r["shape"] is None else str(r["shape"])
            if show_params:
                right = f"{right}  {r['params']:,} p" if right else f"{r['params']:,} p"
            ax.text(x0 + col_w - 0.08, y, right, va="center", ha="right", fontsize=7 * shrink, color="#333333")
            where[r["name"]] = (left, x0 + col_w, y)
    for source, suffix, label in links:
        sx, sy = where[source][1], where[source][2]
        for t in (n for n in where if n.endswith(suffix) and n != source):
            ax.annotate("", xy=(where[t][0], where[t][2]), xytext=(sx, sy),
                        arrowprops=dict(arrowstyle="->", color="#c0392b", lw=1.0, connectionstyle="arc3,rad=-0.15"))
        ax.text(sx + 0.3, sy + 0.12, label, color="#c0392b", fontsize=8 * shrink, ha="center", va="bottom")
    if title:
        ax.set_title(title, fontsize=plt.rcParams["axes.titlesize"] * shrink)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- attention as a graph
__all__ += ["attention_edges", "attention_graph"]


def attention_edges(weights, threshold: float = 0.1) -> list[tuple[int, int, float]]:
    """Edges ``(i, j, a_ij)`` of an ``(L, L)`` attention matrix with ``a_ij > threshold``, row by row.

    ``a_ij`` is what query ``i`` takes from key ``j``: information flows ``j -> i``. Self-edges
    (``i == j``) are included.
    """
    w = _to_numpy(weights).astype(float)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"weights must be a square (L, L) matrix, got shape {w.shape}")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold}")
    return [(int(i), int(j), float(w[i, j])) for i, j in zip(*np.nonzero(w > threshold))]


def attention_graph(weights, threshold: float = 0.1, *, labels: Sequence[str] | None = None, ax=None,
                    title: str | None = None):
    """Draw an ``(L, L)`` attention matrix as a weighted directed graph on a circle.

    An arrow ``j -> i`` is drawn for every ``a_ij > threshold`` (see `attention_edges`), with width
    and opacity growing with the weight; a ring around node ``i`` shows the weight it keeps for
    itself. Returns the Figure.
    """
    edges = attention_edges(weights, threshold)
    n = _to_numpy(weights).shape[0]
    if labels is not None and len(labels) != n:
        raise ValueError(f"labels must have one entry per token ({n}), got {len(labels)}")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(3.6, 3.6))
    angle = np.pi / 2 - 2 * np.pi * np.arange(n) / n
    pos = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    for i, j, w in edges:
        if i == j:
            ax.add_patch(plt.Circle(pos[i] * 0.9, 0.11, fill=False, lw=0.5 + 4 * w, color="C3", alpha=0.3 + 0.7 * w))
            continue
        ax.annotate("", xy=pos[i] * 0.9, xytext=pos[j] * 0.9,
                    arrowprops=dict(arrowstyle="-|>", lw=0.5 + 4 * w, color="C0", alpha=0.3 + 0.7 * w,
                                    shrinkA=6, shrinkB=6, connectionstyle="arc3,rad=0.15"))
    ax.scatter(pos[:, 0] * 0.9, pos[:, 1] * 0.9, s=260, c="white", edgecolors="#333333", zorder=3)
    for i in range(n):
        ax.text(*(pos[i] * 0.9), str(i), ha="center", va="center", fontsize=8, zorder=4)
        if labels is not None:
            ax.text(*(pos[i] * 1.12), labels[i], ha="center", va="center", fontsize=8)
    ax.set_xlim(-1.3, 1.3)
    ax.set_ylim(-1.3, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"{len(edges)} edges with weight > {threshold:g}", fontsize=10)
    return fig if fig is not None else ax.figure
