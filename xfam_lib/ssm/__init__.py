"""State space models (chapter 9), one module per part of the chapter:

* `lti`: discretisation, the LTI kernel, recurrence and FFT convolution; S4D; H3;
* `selective`: parallel scans, the selective scan and the Mamba block;
* `ssd`: Mamba-2's state space duality and the Mamba-2 block.

Every public name is importable from ``xfam_lib.ssm`` itself.

Conventions (see the book's conventions page and ``shared/API.md``):

* **LTI systems** (`discretize`, `ssm_kernel`, `ssm_recurrence`) are single-input single-output:
  ``B`` and ``C`` are vectors ``(..., N)``. ``A`` is either **diagonal**, given as its diagonal
  ``(..., N)``, or **dense** ``(..., N, N)``. The two are told apart by rank, relative to ``B``:
  ``A.dim() == B.dim()`` means diagonal, ``A.dim() == B.dim() + 1`` means dense; any other
  ranks raise. Leading dims ``...`` are batch dims and broadcast; because the rank decides the
  layout, ``A`` and ``B`` carry the same number of batch dims (use size-1 dims, e.g. ``B[None]``,
  to share one across a batch); ``C`` and ``u`` broadcast freely. Complex ``A, B, C`` are allowed
  (S4D); the kernel is then complex and the caller takes ``2 * K.real``.
* Sequences run along the **last** dim: ``u (..., L)``, kernel ``K (..., L)``.
* The **selective scan** uses the layout of the Mamba reference ``selective_scan_ref``
  (state-spaces/mamba): ``u, delta, z (batch, d_inner, L)``, ``A (d_inner, N)``,
  ``B, C`` fixed ``(d_inner, N)`` or input-dependent ``(batch, N, L)`` (or grouped
  ``(batch, G, N, L)``). Its discretisation is ``A_bar = exp(delta * A)`` but ``B_bar = delta * B``
  (Euler), not full ZOH; full ZOH is in `discretize`.
* fp16/bf16 are computed in fp32 and returned in their dtype; fp64 stays fp64 (mamba's reference
  computes fp64 inputs in fp32; here fp64 is kept so that checks can be tight).
"""
from .lti import (H3Layer, S4DKernel, S4DLayer, discretize, h3_mix, s4d_init, s4d_kernel, shift_ssm_kernel,
                  ssm_convolve, ssm_kernel, ssm_recurrence)
from .selective import MambaBlock, associative_scan, segsum, selective_scan
from .ssd import Mamba2Block, ssd_attention_form, ssd_chunked, ssd_matrix, ssd_scan

__all__ = [
    "discretize",
    "ssm_kernel",
    "ssm_recurrence",
    "ssm_convolve",
    "segsum",
    "associative_scan",
    "selective_scan",
    "s4d_init",
    "s4d_kernel",
    "S4DKernel",
    "S4DLayer",
    "shift_ssm_kernel",
    "h3_mix",
    "H3Layer",
    "MambaBlock",
    "Mamba2Block",
    "ssd_scan",
    "ssd_matrix",
    "ssd_attention_form",
    "ssd_chunked",
]
