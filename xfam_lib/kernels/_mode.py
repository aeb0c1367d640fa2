"""Whether Triton runs the kernels compiled or in its CPU interpreter (imports Triton)."""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


def interpreted() -> bool:
    """True when ``triton.jit`` builds kernels for Triton's CPU interpreter.

    ``triton.jit`` reads ``TRITON_INTERPRET`` each time it builds a function, and Triton's own
    helpers (``tl.zeros``, ...) are built when ``triton`` is first imported; so the variable
    must be set before that import, or the kernels and the helpers they call disagree (and
    fail with "Cannot call @triton.jit'd outside of the scope of a kernel").
    """
    now = bool(triton.knobs.runtime.interpret)
    at_import = isinstance(tl.zeros, InterpretedFunction)
    if now != at_import:
        raise RuntimeError(
            f"TRITON_INTERPRET is {os.environ.get('TRITON_INTERPRET')!r} now but was "
            f"{'' if at_import else 'not '}set when triton was first imported: set it before "
            f"anything imports triton (at the start of the process or notebook)")
    return now
