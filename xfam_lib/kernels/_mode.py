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


@triton.jit
def dot_rescaled(a, b, acc, DTYPE: tl.constexpr):
    """``acc + a @ b`` as `dot` (``acc`` a tile, not ``None``), for fp32 tiles that may exceed
    fp16's range (65504): a state, its gradient, unscaled scores. In fp16 each row of ``a``
    and each column of ``b`` is first divided by a power of two that brings its largest entry
    to at most 1, and each product multiplied back by its row's and column's factors: exact
    (powers of two), and every term of one sum shares its factor, so the error stays
    relative to the terms' sizes. bf16 and fp32 have fp32's range: `dot` as it is."""
    if DTYPE == tl.float16:
        row = _power_of_two_above(tl.max(tl.abs(a.to(tl.float32)), 1))
        col = _power_of_two_above(tl.max(tl.abs(b.to(tl.float32)), 0))
        product = dot(a / row[:, None], b / col[None, :], None, DTYPE)
        return acc + product * (row[:, None] * col[None, :])
    return dot(a, b, acc, DTYPE)


@triton.jit
def _power_of_two_above(x):
    """The least power of two ``>= x`` (finite fp32, ``x >= 0``), 1 where ``x`` is 0: the
    exponent bits of ``x`` rounded up, so the factor is exact."""
    bits = (x.to(tl.int32, bitcast=True) + 0x007FFFFF) & 0x7F800000
    return tl.where(x > 0, bits.to(tl.float32, bitcast=True), 1.0)
