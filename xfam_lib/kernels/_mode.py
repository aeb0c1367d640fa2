"""Whether Triton runs the kernels compiled or in its CPU interpreter, and the matrix product
that works in both (imports Triton)."""
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


# True when the kernels were built for Triton's CPU interpreter (fixed at import).
INTERPRETED = interpreted()
_INTERPRETER = tl.constexpr(INTERPRETED)


@triton.jit
def dot(a, b, acc, DTYPE: tl.constexpr):
    """``acc + a @ b`` accumulated in fp32 (``acc=None``: start from 0), the operands first
    rounded to ``DTYPE``, the kernel's input dtype: tensor-core products for fp16 and bf16,
    exact fp32 products (``ieee``, not the GPU's default TF32) for fp32. Callers rescale a
    tile before it is rounded, so that no fp16 operand overflows.

    Triton's interpreter does not support bf16 in ``tl.dot`` (it multiplies the raw bit
    patterns, triton-lang/triton#11584), so there bf16 operands are multiplied as fp32
    copies: the same products, as the product of two bf16 numbers is exact in fp32.
    """
    a = a.to(DTYPE)
    b = b.to(DTYPE)
    if _INTERPRETER:  # noqa: SIM102  (two compile-time tests, no `and` in Triton code)
        if DTYPE == tl.bfloat16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
    if DTYPE == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)
