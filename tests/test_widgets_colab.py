"""The widget code in a real kernel, with the pinned packages and with Colab's own versions.

Colab keeps its ipywidgets 7.7.1 (and IPython 7.34, ipykernel 6.17) whatever a notebook installs;
the pins have ipywidgets 8. Each case runs a small notebook through nbclient: an
``interactive_figure`` whose control is then moved, and ``train_loop``'s progress bar (drawn
once a run has lasted ``PROGRESS_DELAY_S``, then removed). The Colab
case installs Colab's versions of the display packages (``COLAB_DISPLAY``, read from Colab's
listing ``requirements-colab.txt``) with ``pip install --no-deps --target`` and puts that folder
first on the kernel's path (this Python may not be Colab's; ``make colab-twin`` runs the whole
book under Colab's Python and versions).
"""
from __future__ import annotations

import base64
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
COLAB_PINS = ROOT / "requirements-colab.txt"
# the packages that drive a notebook's widgets and displays, with what IPython 7 and ipywidgets 7 import
COLAB_DISPLAY = ("ipywidgets", "widgetsnbextension", "jupyterlab-widgets", "ipython-genutils", "ipykernel",
                 "ipython", "backcall", "pickleshare", "nest-asyncio", "decorator")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

CELLS = [
    """\
import ipywidgets, IPython, ipykernel
print("versions", ipywidgets.__version__, IPython.__version__, ipykernel.__version__)""",
    """\
import ipywidgets as widgets
import matplotlib.pyplot as plt
from xfam_lib.widgets import interactive_figure

drawn = []

def draw(n, mode, flag):
    drawn.append((n, mode, flag))
    fig, ax = plt.subplots(figsize=(n, 2), dpi=50)  # its width in pixels tells which n drew it
    ax.plot(range(n), color="red" if flag else "blue")
    return fig

slider = widgets.IntSlider(value=3, min=1, max=9, description="n")
interactive_figure(draw, n=slider, mode=["a", "b"], flag=False)""",
    """\
slider.value = 7  # moving the control redraws the figure above in place
print("drawn", drawn)""",
    """\
import time
import torch
import xfam_lib.train
from xfam_lib.train import train_loop

xfam_lib.train.PROGRESS_DELAY_S = 0.3  # the bar appears once a run has lasted this long
w = torch.nn.Linear(2, 1)

def slow_loss(m, step):
    time.sleep(0.05)
    return m(torch.ones(4, 2)).pow(2).mean()

losses = train_loop(w, slow_loss, steps=30, lr=0.01)
print("losses", len(losses))""",
    """\
quick = train_loop(w, lambda m, step: m(torch.ones(4, 2)).pow(2).mean(), steps=5, lr=0.01)
print("quick", len(quick))""",
]


@pytest.fixture(scope="session")
def colab_site(tmp_path_factory) -> Path:
    """A folder holding Colab's versions of the display packages (``requirements-colab.txt``)."""
    site = tmp_path_factory.mktemp("colab-site")
    pins = [line.strip() for line in COLAB_PINS.read_text(encoding="utf-8").splitlines()
            if re.sub(r"[-_.]+", "-", line.split("==")[0].lower()) in COLAB_DISPLAY]
    assert len(pins) == len(COLAB_DISPLAY), f"{COLAB_PINS.name} lacks some of {COLAB_DISPLAY}: {pins}"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
           "--target", str(site), *pins]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"could not install {COLAB_PINS.name}:\n{result.stderr[-2000:]}"
    return site


def run_notebook(extra_path: Path | None) -> list:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    paths = [str(p) for p in (extra_path, ROOT) if p is not None]
    env_path = os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path  # the kernel inherits it
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    return nb.cells


def stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.mark.parametrize("where", ["pins", "colab"])
def test_interactive_figure_and_progress_bar(where, request):
    site = request.getfixturevalue("colab_site") if where == "colab" else None
    versions, figure, move, train, quick = run_notebook(site)
    ipywidgets_version = stdout(versions).split()[1]
    assert ipywidgets_version.startswith("7.7.1" if where == "colab" else "8."), stdout(versions)

    # the figure (an image, later replaced in place), then the controls with their static note
    images = [o for o in figure.outputs if "image/png" in o.get("data", {})]
    controls = [o for o in figure.outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(images) == 1 and len(controls) == 1, [list(o.get("data", {})) for o in figure.outputs]
    assert controls[0]["data"][WIDGET_VIEW]["model_id"], controls[0]["data"]
    assert "`n`, `mode`, `flag`" in controls[0]["data"]["text/markdown"]

    # moving the slider redrew the figure through its display handle
    assert stdout(move).strip() == "drawn [(3, 'a', False), (7, 'a', False)]"
    png = base64.b64decode(images[0]["data"]["image/png"])
    width = struct.unpack(">I", png[16:20])[0]  # the PNG header's IHDR width
    # 7 in at 50 dpi, less the tight crop; the default n=3 drawing is under 150 px
    assert 5 * 50 < width <= 7 * 50, f"the figure is {width} px wide: not redrawn for n=7"

    # the progress bar was drawn as a widget and replaced by nothing when it closed
    assert stdout(train).strip() == "losses 30"
    assert not any(WIDGET_VIEW in o.get("data", {}) for o in train.outputs), train.outputs
    shown = [o for o in train.outputs if o.output_type == "display_data"]
    assert shown and all(o["data"].get("text/html") == "" for o in shown), train.outputs
    # a run shorter than the delay draws no bar at all
    assert [o.output_type for o in quick.outputs] == ["stream"] and stdout(quick).strip() == "quick 5"

