"""Interactive figures that still show something without a kernel.

`interactive_figure` draws the default state as an ordinary image output (so the HTML book
and non-interactive runs show a real figure), then shows the controls; moving a control
redraws that same output in place (``display_id`` updates, supported by Jupyter and Colab).

The controls only work where a kernel runs. Their output carries a Markdown alternative (a note
saying where to move them), and the book's ``_config.yml`` tells MyST-NB never to render widget
views in HTML, so the static page shows the figure and that note instead of controls that look
alive but do nothing.
"""
from __future__ import annotations

from typing import Callable

import matplotlib.pyplot as plt

__all__ = ["interactive_figure", "widget_bundle"]


def widget_bundle(widget) -> dict:
    """The display data of ``widget`` (a dict for ``display(..., raw=True)``), in ipywidgets 7 and 8.

    ipywidgets 8 has ``_repr_mimebundle_``; ipywidgets 7 (Colab's 7.7.1) displays itself through
    ``_ipython_display_``, which ignores ``display_id``, so the same data is built here. As raw data
    it can carry a Markdown alternative and be replaced later through a display handle.
    """
    if hasattr(widget, "_repr_mimebundle_"):
        return widget._repr_mimebundle_()
    view = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return {"text/plain": repr(widget)[:110], "application/vnd.jupyter.widget-view+json": view}


def interactive_figure(draw: Callable[..., "plt.Figure"], **controls):
    """Show ``draw(**defaults)`` now and redraw it whenever a control changes.

    ``controls`` map each keyword of ``draw`` to an ``ipywidgets`` widget or an ``interact``
    abbreviation (``(lo, hi, step)``, a list of options, a bool). ``draw`` must return a
    ``matplotlib.figure.Figure``. Returns None (the controls are already displayed, so a call as a
    cell's last line shows them once).
    """
    import ipywidgets as widgets
    from IPython.display import DisplayHandle, display

    built = widgets.interactive(lambda **kw: None, **controls)
    controls_by_name = {w.description: w for w in built.kwargs_widgets}
    if set(controls_by_name) != set(controls):
        raise ValueError(f"could not build widgets for {sorted(set(controls) - set(controls_by_name))}")

    def current():
        return {name: w.value for name, w in controls_by_name.items()}

    fig = draw(**current())
    handle = DisplayHandle()
    handle.display(fig)
    plt.close(fig)

    def redraw(_change=None):
        new = draw(**current())
        handle.update(new)
        plt.close(new)

    for w in controls_by_name.values():
        w.observe(redraw, names="value")
    box = widgets.VBox(list(controls_by_name.values()))
    names = ", ".join(f"`{name}`" for name in controls_by_name)
    bundle = widget_bundle(box)
    bundle["text/markdown"] = STATIC_NOTE.format(names=names)
    display(bundle, raw=True)


STATIC_NOTE = ("*Interactive figure: run this notebook (Colab button at the top of the page, or locally) "
               "to move the controls {names}; the figure above shows their default values.*")
