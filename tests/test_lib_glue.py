"""`xfam_lib.utils.glue` writes exactly the hidden output that `myst_nb.glue(..., display=False)` writes.

The chapters glue computed numbers into their prose with the library's `glue` (no myst-nb import,
which costs seconds and is absent on Colab); the book build reads those outputs with myst-nb's
own reader, so the two must stay identical. Checked with myst-nb itself as the oracle.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from xfam_lib import utils


def _captured(monkeypatch, module, attribute, call):
    seen = []
    monkeypatch.setattr(module, attribute, lambda data, **kw: seen.append((data, kw)))
    call()
    return seen


@pytest.mark.parametrize("value", [0.1234567, 3, "text", (1, 2), -2.5e-07])
def test_glue_output_equals_myst_nb(monkeypatch, value):
    import IPython.display
    import myst_nb.ext.glue as mystglue

    ours = _captured(monkeypatch, IPython.display, "display", lambda: utils.glue(answer=value))
    theirs = _captured(monkeypatch, mystglue, "ipy_display", lambda: mystglue.glue("answer", value, display=False))
    assert ours == theirs and len(ours) == 1


def test_glue_turns_array_and_tensor_scalars_into_numbers(monkeypatch):
    import IPython.display
    import myst_nb.ext.glue as mystglue

    ours = _captured(monkeypatch, IPython.display, "display",
                     lambda: utils.glue(a=np.float32(0.5), b=torch.tensor(7)))
    theirs = _captured(monkeypatch, mystglue, "ipy_display",
                       lambda: (mystglue.glue("a", 0.5, display=False), mystglue.glue("b", 7, display=False)))
    assert ours == theirs
