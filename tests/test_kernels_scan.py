"""The fused selective scan `xfam_lib.kernels.selective_scan` against the step loop
`xfam_lib.ssm.selective_scan(mode="sequential")`, in outputs, last state and gradients.

As in tests/test_kernels.py: without CUDA the kernel runs in Triton's CPU interpreter
(tests/conftest.py sets ``TRITON_INTERPRET=1`` before anything imports Triton); inputs are drawn
in fp64, rounded once to the dtype under test, and the reference runs in fp64 on the rounded
values, so the comparison measures the kernel alone. The interpreter is slow, so the shapes are
small and the backward's checkpoints are taken every 4 steps instead of every 64: a sequence of
11 steps then crosses two checkpoints and ends in a ragged chunk.
"""
import sys

import pytest
import torch
import torch.nn.functional as F

if sys.platform != "linux":
    pytest.skip("Triton is pinned and tested on Linux only", allow_module_level=True)
import triton  # noqa: F401  (pinned: a missing Triton fails here, it is not skipped)

from xfam_lib import kernels, ssm
from xfam_lib.testing import assert_close, randn, tolerance_for

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


@pytest.fixture
def short_chunks(monkeypatch):
    """Checkpoints every 4 steps (the kernel's CHUNK is a compile-time constant)."""
    scan = kernels._import_kernels("_selective_scan")
    monkeypatch.setattr(scan, "CHUNK", 4)


def bc(layout, batch, d_inner, n, length, gen):
    """``B`` or ``C`` in ``layout``: "fixed", "input" (one group) or "groups<G>"."""
    if layout == "fixed":
        return randn(d_inner, n, gen=gen)
    if layout == "input":
        return randn(batch, n, length, gen=gen)
    return randn(batch, int(layout[len("groups"):]), n, length, gen=gen)


def scan_inputs(batch, d_inner, length, n, b_layout, c_layout, options, gen):
    """Inputs as Mamba draws them: ``A = -(1..N)`` per channel, ``delta`` around softplus of a
    bias (or positive), and the optional ``D, z, delta_bias`` named in ``options``."""
    u = randn(batch, d_inner, length, gen=gen)
    delta = 0.5 * randn(batch, d_inner, length, gen=gen)
    if "softplus" not in options:
        delta = F.softplus(delta - 1)
    # with softplus, a bias pushing delta down as Mamba's (softplus(-2) = 0.13); without, a
    # small positive one
    bias = randn(d_inner, gen=gen) - 2 if "softplus" in options else 0.1 * delta[0, :, 0]
    A = -torch.arange(1, n + 1, dtype=torch.float64).repeat(d_inner, 1)
    A = A * (0.5 + torch.rand(d_inner, 1, generator=gen, dtype=torch.float64))
    tensors = [u, delta, A, bc(b_layout, batch, d_inner, n, length, gen),
               bc(c_layout, batch, d_inner, n, length, gen),
               randn(d_inner, gen=gen) if "D" in options else None,
               randn(batch, d_inner, length, gen=gen) if "z" in options else None,
               bias if "bias" in options else None]
    return tensors, {"delta_softplus": "softplus" in options}


def check_scan(batch, d_inner, length, n, b_layout, c_layout, options, dtype, device=DEVICE,
               seed=0, of_max=None):
    """Output, last state and the gradients of every input against the fp64 step loop, for
    one random cotangent of ``y`` and of the last state. With ``of_max``, every comparison
    allows ``of_max`` times the largest expected value (sums of thousands of terms at full
    size), else the dtype's tolerance."""

    def close(got, want, name, tol=None):
        atol, rtol = tol or tolerance_for(got)
        if of_max is not None:
            atol = max(atol, of_max * want.abs().max().item())
        assert_close(got.cpu(), want.cpu(), atol=atol, rtol=rtol, name=name)

    gen = torch.Generator().manual_seed(seed)
    tensors, flags = scan_inputs(batch, d_inner, length, n, b_layout, c_layout, options, gen)
    present = [i for i, t in enumerate(tensors) if t is not None]
    rounded = [None if t is None else t.to(dtype).double() for t in tensors]
    ref_in = [None if t is None else t.to(device).requires_grad_() for t in rounded]
    ref, ref_last = ssm.selective_scan(*ref_in, **flags, return_last_state=True)
    cot, cot_last = randn(*ref.shape, gen=gen).to(dtype), randn(*ref_last.shape, gen=gen)
    loss = (ref * cot.to(device)).sum() + (ref_last * cot_last.to(device)).sum()
    ref_grads = torch.autograd.grad(loss, [ref_in[i] for i in present])

    ker_in = [None if t is None else t.detach().to(device, dtype).requires_grad_()
              for t in rounded]
    out, last = kernels.selective_scan(*ker_in, **flags, return_last_state=True)
    assert out.dtype == dtype and last.dtype == torch.float32
    assert out.device.type == torch.device(device).type
    close(out, ref, "y")
    close(last, ref_last, "last state", tolerance_for(out))
    loss = (out * cot.to(device)).sum() + (last * cot_last.to(device, torch.float32)).sum()
    ker_grads = torch.autograd.grad(loss, [ker_in[i] for i in present])
    for i, got, want in zip(present, ker_grads, ref_grads):
        assert got.dtype == dtype, NAMES[i]
        close(got, want, f"d{NAMES[i]}")


# (batch, d_inner, L, N, B layout, C layout, options): d_inner below, above and at a multiple
# of the 32-channel block; groups of 1, 20 (two groups in one block) and 32 channels (blocks
# within one group); L crossing checkpoints with a ragged end, and a single step; a large state
# (N = 200: blocks of 8 channels, `_selective_scan.block_d`, across groups of 10).
CASES = [
    (2, 5, 11, 4, "fixed", "fixed", ()),
    (1, 5, 11, 4, "groups5", "input", ("D", "z", "bias", "softplus")),
    (1, 40, 11, 16, "input", "groups2", ("D", "softplus")),
    (2, 40, 7, 16, "groups2", "fixed", ("z", "bias")),
    (1, 64, 6, 4, "groups2", "input", ("D", "z")),
    (2, 3, 1, 16, "input", "input", ("D", "z", "bias", "softplus")),
    (1, 20, 5, 200, "groups2", "input", ("D", "z")),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_selective_scan_fp32(case, short_chunks):
    """The fused Triton form of the selective scan (M9.9), every layout and option."""
    check_scan(*case, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_selective_scan_half(dtype, short_chunks):
    check_scan(1, 5, 11, 4, "input", "groups5", ("D", "z", "bias", "softplus"), dtype)


def test_no_grad_and_mixed_dtypes():
    """Without gradients only ``y`` is computed; an fp16 ``u`` with fp32 parameters gives an
    fp16 ``y`` and an fp32 last state, as `ssm.selective_scan`."""
    gen = torch.Generator().manual_seed(1)
    (u, delta, A, B, C, D, z, bias), flags = scan_inputs(
        1, 5, 9, 4, "input", "fixed", ("D", "z", "bias", "softplus"), gen)
    u16 = u.half()
    ker = [t.float() for t in (delta, A, B, C, D, z, bias)]
    with torch.no_grad():
        out, last = kernels.selective_scan(u16.to(DEVICE), *(t.to(DEVICE) for t in ker),
                                           **flags, return_last_state=True)
    ref, ref_last = ssm.selective_scan(u16.double(), *(t.double() for t in ker), **flags,
                                       return_last_state=True)
    assert out.dtype == torch.float16 and last.dtype == torch.float32
    assert_close(out.cpu(), ref)
    assert_close(last.cpu(), ref_last, atol=1e-5, rtol=1e-5)


def test_a_batch_of_zero():
    """No program instance runs: empty ``y`` and last state, empty gradients."""
    u = torch.randn(0, 5, 7, device=DEVICE, requires_grad=True)
    A, B = -torch.ones(5, 4, device=DEVICE), torch.randn(0, 4, 7, device=DEVICE)
    y, last = kernels.selective_scan(u, u, A, B, B, return_last_state=True)
    (du,) = torch.autograd.grad(y.sum() + last.sum(), u)
    assert y.shape == (0, 5, 7) and last.shape == (0, 5, 4) and du.shape == (0, 5, 7)


def test_bad_inputs_raise_clear_errors(monkeypatch):
    u = torch.randn(1, 4, 6)
    A, B = -torch.ones(4, 3), torch.randn(1, 3, 6)
    with pytest.raises(ValueError, match="float16, bfloat16 and float32, got u in torch.float64"):
        kernels.selective_scan(u.double(), u, A, B, B)
    with pytest.raises(ValueError, match=r"got D in torch.float64"):
        kernels.selective_scan(u, u, A, B, B, D=torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"N up to 256, got N=300"):
        kernels.selective_scan(u, u, -torch.ones(4, 300), torch.randn(4, 300), torch.randn(4, 300))
    with pytest.raises(ValueError, match=r"B must be fixed.*got \(1, 3, 5\)"):
        kernels.selective_scan(u, u, A, B[..., :5], B)
    with pytest.raises(ValueError, match=r"G dividing d_inner = 4.*got \(1, 3, 3, 6\)"):
        kernels.selective_scan(u, u, A, B, torch.randn(1, 3, 3, 6))
    with pytest.raises(TypeError, match="delta_softplus must be a bool"):
        kernels.selective_scan(u, u, A, B, B, delta_softplus=1)
    with pytest.raises(TypeError, match="return_last_state must be a bool"):
        kernels.selective_scan(u, u, A, B, B, return_last_state="yes")
    meta = torch.empty(1, 4, 6, device="meta")
    with pytest.raises(ValueError, match="got tensors on meta"):
        kernels.selective_scan(meta, meta, A.to("meta"), B.to("meta"), B.to("meta"))
    scan = kernels._import_kernels("_selective_scan")
    monkeypatch.setattr(scan, "INTERPRETED", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kernels.selective_scan(u, u, A, B, B)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_selective_scan_gpu_full_size(dtype):
    """Mamba's sizes: batch 2, 2048 channels, 1024 steps, N = 16, with the kernel's own
    checkpoints every 64 steps (reference in fp64 on the GPU). Gradients of B and C sum 2048
    channels, of A over 2048 steps: errors within 1e-3 (fp32, the book's scan tolerance) or
    2e-2 (bf16) of the largest value."""
    check_scan(2, 2048, 1024, 16, "input", "input", ("D", "z", "bias", "softplus"), dtype,
               device="cuda", of_max=1e-3 if dtype == torch.float32 else 2e-2)
