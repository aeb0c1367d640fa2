"""The Triton kernels of `xfam_lib.kernels` against the library's PyTorch forms:
`flash_attention` against `scaled_dot_product_attention`, `chunk_simple_gla` against
`gated_linear_attention` with its gate broadcast over ``d_k``, `chunk_gla` against
`gated_linear_attention` with one gate per key dimension.

Without CUDA the kernels run in Triton's CPU interpreter: tests/conftest.py sets
``TRITON_INTERPRET=1`` for the whole test process, because the variable must be set before
anything imports Triton (Triton builds its own helpers at import, and other test modules'
oracles import it), which a setting here would not guarantee; no subprocess is needed. With
CUDA the variable is left alone: the same tests then run the compiled kernels on the GPU, and
the ``gpu`` tests add sizes the interpreter would take minutes over.

Pattern (as in tests/test_gpu.py): inputs are drawn in fp64 on the CPU, rounded once to the
dtype under test; the reference (the library's PyTorch form) runs in fp64 on those rounded
values, so the comparison measures the kernel alone, within `assert_close`'s tolerance for the
dtype. Gradients are compared the same way, for one random cotangent (per result).
"""
import importlib
import sys

import pytest
import torch

if sys.platform != "linux":
    pytest.skip("Triton is pinned and tested on Linux only", allow_module_level=True)
import triton  # pinned: a missing Triton fails here, it is not skipped

from xfam_lib import kernels
from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.kernels import chunk_gla, chunk_simple_gla, flash_attention
from xfam_lib.linear import gated_linear_attention
from xfam_lib.testing import assert_close, assert_close_terms, grads, randn, tolerance_for

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check_flash_attention(lead, len_q, len_k, d_k, d_v, causal, dtype, scale=None,
                          device=DEVICE, seed=0):
    """Output and gradients of `flash_attention` against the fp64 reference."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(*lead, len_q, d_k), (*lead, len_k, d_k), (*lead, len_k, d_v), (*lead, len_q, d_v)]
    q, k, v, cot = (randn(*s, gen=gen).to(dtype).double() for s in shapes)
    ref_in = [t.requires_grad_() for t in (q, k, v)]
    ref = scaled_dot_product_attention(*ref_in, causal=causal, scale=scale)
    ref_grads = grads(ref, ref_in, cot)

    ker_in = [t.detach().to(device, dtype).requires_grad_() for t in (q, k, v)]
    out = flash_attention(*ker_in, causal=causal, scale=scale)
    assert out.dtype == dtype and out.device.type == torch.device(device).type
    assert_close(out.cpu(), ref, name="output")
    ker_grads = grads(out, ker_in, cot.to(device, dtype))
    for name, got, want in zip(("dq", "dk", "dv"), ker_grads, ref_grads):
        assert got.dtype == dtype
        assert_close(got.cpu(), want, name=name)
    return out, ker_grads


# (leading dims, Lq, Lk, d_k, d_v, causal, scale): one tile and several, ragged ends, Lq < Lk and
# Lq > Lk (the first Lq - Lk queries see no key), head sizes padded to a power of two.
CASES = [
    ((2,), 17, 17, 16, 16, False, 0.5),
    ((1, 2), 100, 100, 32, 32, True, None),
    ((), 64, 100, 64, 32, True, None),
    ((), 100, 64, 16, 16, True, None),
    ((), 1, 1, 8, 8, True, None),
    ((), 100, 17, 24, 40, False, None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-{c[1:6]}")
def test_flash_attention_fp32(case):
    """The Triton form of tiled attention with online softmax (M3.11)."""
    check_flash_attention(*case[:6], torch.float32, scale=case[6])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [((), 80, 80, 32, 32, True, None), CASES[3]],
                         ids=lambda c: f"{c[1:6]}")
def test_flash_attention_half(case, dtype):
    check_flash_attention(*case[:6], dtype, scale=case[6])


def test_rows_that_see_no_key_are_zero():
    """Causal with Lq > Lk: the first Lq - Lk rows return exact zeros and get zero gradient;
    with no key at all (Lk = 0), every row does."""
    out, (dq, _, _) = check_flash_attention((2,), 80, 30, 16, 16, True, torch.float32)
    assert out[:, :50].eq(0).all() and dq[:, :50].eq(0).all() and out[:, 50:].ne(0).all()
    q = torch.randn(2, 5, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 0, 16, device=DEVICE, requires_grad=True)
    out = flash_attention(q, k, k, causal=True)
    (dq,) = torch.autograd.grad(out.sum(), q)
    assert out.shape == (2, 5, 16) and out.eq(0).all() and dq.eq(0).all()


def test_bad_inputs_raise_clear_errors():
    q = torch.randn(1, 4, 16)
    with pytest.raises(ValueError, match="float64"):
        flash_attention(q.double(), q.double(), q.double())
    big = torch.randn(1, 4, 160)
    with pytest.raises(ValueError, match="d_k=160"):
        flash_attention(big, big, q)
    with pytest.raises(ValueError, match=r"share the feature size.*\(1, 4, 8\)"):
        flash_attention(q, q[..., :8], q)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attention(q, q, q, causal=1)
    with pytest.raises(ValueError, match="scale must be a positive"):
        flash_attention(q, q, q, scale=-1.0)
    meta = torch.empty(1, 4, 16, device="meta")
    with pytest.raises(ValueError, match="got tensors on meta"):
        flash_attention(meta, meta, meta)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    """Kernels built for the GPU refuse CPU tensors, saying how to run them."""
    flash = kernels._import_kernels("_flash")
    monkeypatch.setattr(flash, "INTERPRETED", False)
    q = torch.randn(1, 4, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        flash_attention(q, q, q)


def test_interpreter_switched_after_import_is_named(monkeypatch):
    """TRITON_INTERPRET changed after Triton was imported: a clear error, not Triton's own."""
    mode = importlib.import_module("xfam_lib.kernels._mode")
    monkeypatch.setenv("TRITON_INTERPRET", "0" if mode.interpreted() else "1")
    with pytest.raises(RuntimeError, match="before anything imports triton"):
        mode.interpreted()


def test_missing_triton_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)     # `import triton` now fails
    monkeypatch.delitem(sys.modules, "xfam_lib.kernels._flash", raising=False)
    q = torch.randn(1, 4, 16)
    with pytest.raises(ImportError, match="pip install triton"):
        flash_attention(q, q, q)


def test_importing_the_library_does_not_import_triton(monkeypatch):
    """With ``import triton`` made to fail, ``xfam_lib`` and ``xfam_lib.kernels`` still import
    (afresh); only a kernel call needs Triton."""
    monkeypatch.setitem(sys.modules, "triton", None)
    for name in ("xfam_lib", "xfam_lib.kernels", "xfam_lib.kernels._flash"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    fresh = importlib.import_module("xfam_lib.kernels")
    assert fresh is not kernels and callable(fresh.flash_attention)



def flash_module():
    return kernels._import_kernels("_flash")


def block_pairs():
    """Every (BLOCK_M, BLOCK_N) that a GPU's autotuning may choose, for any kernel."""
    flash = flash_module()
    configs = flash.QUERY_CONFIGS + flash.KEY_CONFIGS
    return sorted({(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in configs})


@pytest.mark.parametrize("len_q, len_k", [(130, 201), (201, 130)], ids=str)
@pytest.mark.parametrize("blocks", block_pairs(), ids=str)
def test_flash_attention_at_every_tuned_block_size(blocks, len_q, len_k):
    """The causal two-stage key loop (`_key_range`) and the backward's loop bounds hold for
    each block-size pair autotuning may pick (BLOCK_M below, equal to and above BLOCK_N),
    with Lq < Lk and Lq > Lk and lengths no block size divides: outputs and gradients of
    the kernels launched at those sizes against the fp64 reference."""
    flash = flash_module()
    config = triton.Config({"BLOCK_M": blocks[0], "BLOCK_N": blocks[1]})
    gen = torch.Generator().manual_seed(1)
    q, k, v, cot = (randn(1, n, 16, gen=gen).float().double()
                    for n in (len_q, len_k, len_k, len_q))
    ref_in = [t.requires_grad_() for t in (q, k, v)]
    ref = scaled_dot_product_attention(*ref_in, causal=True)
    ref_grads = grads(ref, ref_in, cot)

    ker_in = [t.detach().to(DEVICE, torch.float32) for t in (q, k, v)]
    out, lse = flash.flash_forward(*ker_in, True, 0.25, config=config)
    assert_close(out.cpu(), ref.detach(), name=f"output at {blocks}")
    ker_grads = flash.flash_backward(*ker_in, out, lse, cot.to(DEVICE, torch.float32), True,
                                     0.25, config=config)
    for name, got, want in zip(("dq", "dk", "dv"), ker_grads, ref_grads):
        assert_close(got.cpu(), want, name=f"{name} at {blocks}")


def kept(configs, held, streamed, gpu, block_d, elem, length=4096):
    """(held block, streamed block, stages) of the configs `_fitting` keeps on ``gpu``."""
    flash = flash_module()
    return [(c.kwargs[held], c.kwargs[streamed], c.num_stages)
            for c in flash._fitting(configs, held, streamed, length, length, block_d, block_d,
                                    elem, *gpu)]


# (compute capability, bytes of shared memory one program may use: the CUDA guide's limits)
T4, A100, H100 = (75, 65_536), (80, 166_912), (90, 232_448)


def test_flash_configs_that_fit_shared_memory():
    """fp32 at head size 128 (tiles of 2 x 128 columns, 4 bytes) leaves on an A100 only the
    two small configs, in the kernels owning queries and in the one owning keys; on a T4,
    where Triton stages fp16 operands as fp32 and pipelines nothing, fp16 at head size 128
    leaves only the smallest; bf16 at head size 64 keeps every config on an H100; with no
    room at all the prune says so; short sequences drop the blocks longer than they are."""
    flash = flash_module()
    queries, keys = flash.QUERY_CONFIGS, flash.KEY_CONFIGS
    assert kept(queries, "BLOCK_M", "BLOCK_N", A100, 128, 4) == [(64, 32, 2), (32, 16, 1)]
    assert kept(keys, "BLOCK_N", "BLOCK_M", A100, 128, 4) == [(64, 32, 2), (32, 16, 1)]
    assert kept(queries, "BLOCK_M", "BLOCK_N", T4, 128, 2) == [(32, 16, 1)]
    assert len(kept(queries, "BLOCK_M", "BLOCK_N", H100, 64, 2)) == len(queries)
    with pytest.raises(ValueError, match="more than the 0 of this GPU"):
        kept(queries, "BLOCK_M", "BLOCK_N", (90, 0), 64, 2)
    assert kept(queries, "BLOCK_M", "BLOCK_N", H100, 64, 2, length=100) == [
        (64, 64, 2), (64, 64, 3), (64, 32, 2), (32, 16, 1)]


def test_flash_autotuning_is_wired_to_the_kernels(monkeypatch):
    """The GPU's autotuned launchers build here too (Triton checks that the tuning key names
    kernel arguments), and their prune functions read the dtype, head sizes and lengths of
    the launch and the GPU: fp32 at head size 128 on an A100 keeps the two small configs."""
    flash = flash_module()
    monkeypatch.setattr(flash, "_device_limits", lambda device: A100)
    tuned = flash._autotuned()
    named = {"Q": torch.empty(1, 300, 128), "len_q": 300, "len_k": 300}
    meta = {"BLOCK_DK": 128, "BLOCK_DV": 128}
    for kernel, held in [(flash._fwd_kernel, "BLOCK_M"), (flash._bwd_dq_kernel, "BLOCK_M"),
                         (flash._bwd_dkdv_kernel, "BLOCK_N")]:
        tuner = tuned[kernel.fn]
        configs = tuner.early_config_prune(tuner.configs, named, **meta)
        assert [(c.kwargs[held], c.num_stages) for c in configs] == [(64, 2), (32, 1)], kernel
    assert set(tuned) == {k.fn for k in (flash._fwd_kernel, flash._bwd_dq_kernel,
                                         flash._bwd_dkdv_kernel, flash._bwd_delta_kernel)}


def test_flash_autotuned_launch_path(monkeypatch):
    """The GPU's launch path (on a CPU, in the interpreter) with every timing equal:
    outputs and gradients through the autotuned kernels are right, each kernel tunes once
    per key, and a new key length tunes the kernels keyed on it again."""
    flash = flash_module()
    monkeypatch.setattr(flash, "_device_limits", lambda device: H100)
    tuned = flash._autotuned()
    for tuner in tuned.values():
        tuner.do_bench = lambda run, quantiles: (run(), [1.0, 1.0, 1.0])[1]
    monkeypatch.setattr(flash, "AUTOTUNE", True)
    monkeypatch.setattr(flash, "_TUNED", tuned)
    for len_k in (70, 40):
        check_flash_attention((), 40, len_k, 16, 16, True, torch.float32)
    tiled = (flash._fwd_kernel, flash._bwd_dq_kernel, flash._bwd_dkdv_kernel)
    assert [len(tuned[kernel.fn].cache) for kernel in tiled] == [2, 2, 2]
    assert len(tuned[flash._bwd_delta_kernel.fn].cache) == 1     # keyed on len_q, d_v only
    q, k = torch.randn(1, 40, 16), torch.randn(1, 70, 16)
    flash.flash_forward(q, k, k, True, 0.25)                # a shape seen before: no tuning
    assert len(tuned[flash._fwd_kernel.fn].cache) == 2

def check_gated_kernel(kernel, inputs, dtype, device, gen, per_key, cotangent=(1.0, 0.0)):
    """Output, final state and all gradients of a chunked kernel (`chunk_simple_gla`,
    `chunk_gla`) against `gated_linear_attention`'s chunk form in fp64 (tests/test_8_linear.py
    holds that to the recurrence). ``inputs``: fp64 ``[q, k, v, log_g]`` and optionally the
    initial state, already rounded to ``dtype``; ``per_key``: ``log_g`` has one gate per key
    dimension, else one per step (broadcast over ``d_k`` for the reference); ``cotangent``:
    the output's cotangent is ``scale * z + offset`` for standard normal ``z``, the final
    state's ``scale * z``.

    Every result is a sum of products whose operands the kernels round to ``dtype`` (fp16/bf16
    tiles on tensor cores), so its error follows the dtype's tolerance relative to the sizes
    of the terms summed, not to the sum (`assert_close_terms`); in fp32 the products are exact."""
    with_state = len(inputs) == 5

    def reference(tensors, cotangents):
        q, k, v, log_g = tensors[:4]
        gate = log_g if per_key else log_g[..., None].expand_as(k)
        out, state = gated_linear_attention(q, k, v, gate, mode="chunk",
                                            initial_state=tensors[4] if with_state else None,
                                            return_final_state=True)
        loss = (out * cotangents[0]).sum() + (state * cotangents[1]).sum()
        return out, state, torch.autograd.grad(loss, tensors)

    ref_in = [t.requires_grad_() for t in inputs]
    shape_out = (*inputs[2].shape[:-1], inputs[2].shape[-1])
    shape_state = (*inputs[0].shape[:-2], inputs[0].shape[-1], inputs[2].shape[-1])
    cot_scale, cot_offset = cotangent
    cot = (cot_scale * randn(*shape_out, gen=gen) + cot_offset).to(dtype)
    cot_state = cot_scale * randn(*shape_state, gen=gen)
    ref, ref_state, ref_grads = reference(ref_in, (cot, cot_state))
    # the same sums on absolute values: the sizes of their terms (every decay is positive)
    sizes_in = [t.detach().abs().requires_grad_() for t in inputs]
    sizes_in[3] = inputs[3].detach().requires_grad_()                     # the gates as they are
    size_out, size_state, size_grads = reference(sizes_in, (cot.abs(), cot_state.abs()))

    ker_in = [t.detach().to(device, dtype).requires_grad_() for t in inputs[:4]]
    if with_state:
        ker_in.append(inputs[4].detach().to(device, torch.float32).requires_grad_())
    out, state = kernel(*ker_in[:4], initial_state=ker_in[4] if with_state else None,
                        return_final_state=True)
    assert out.dtype == dtype and state.dtype == torch.float32
    assert_close_terms(out, ref, size_out, dtype=dtype, name="output")
    assert_close_terms(state, ref_state, size_state, dtype=dtype, name="final state")
    loss = (out * cot.to(device)).sum() + (state * cot_state.to(device, torch.float32)).sum()
    ker_grads = torch.autograd.grad(loss, ker_in)
    for name, got, want, size in zip(("dq", "dk", "dv", "dlog_g", "d_initial_state"),
                                     ker_grads, ref_grads, size_grads):
        assert got.dtype == (torch.float32 if name == "d_initial_state" else dtype), name
        if name != "dlog_g":
            assert_close_terms(got, want, size, dtype=dtype, name=name)
    q, k = ref_in[:2]
    dq, dk = ref_grads[:2]
    with torch.no_grad():
        terms = (q * dq).abs() + (k * dk).abs()           # per step and key dimension
    if per_key:
        assert_close_d_log_g(ker_grads[3], ref_grads[3], terms, time_dim=-2)
    else:
        assert_close_d_log_g(ker_grads[3], ref_grads[3], terms.sum(-1), time_dim=-1)


def check_simple_gla(lead, length, d_k, d_v, max_decay, with_state, dtype, device=DEVICE,
                     seed=0):
    """Output, final state and all gradients of `chunk_simple_gla` against the fp64 reference;
    log gates uniform in ``[-max_decay, 0]``."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(*lead, length, d_k), (*lead, length, d_k), (*lead, length, d_v)]
    q, k, v = (randn(*s, gen=gen).to(dtype).double() for s in shapes)
    log_g = (-max_decay * torch.rand(*lead, length, generator=gen, dtype=torch.float64))
    log_g = log_g.to(dtype).double()
    h0 = randn(*lead, d_k, d_v, gen=gen).float().double() if with_state else None
    inputs = [q, k, v, log_g] + ([h0] if with_state else [])
    check_gated_kernel(chunk_simple_gla, inputs, dtype, device, gen, per_key=False)


def assert_close_d_log_g(got, want, sizes, time_dim):
    """``dlog_g_s`` sums, over ``t >= s`` (along ``time_dim``), ``q_t * dq_t - k_t * dk_t``:
    terms that cancel, so its rounding error follows the sum of their ``sizes``, not the size
    of the result."""
    sizes = sizes.flip(time_dim).cumsum(time_dim).flip(time_dim)
    atol, rtol = tolerance_for(got)
    error = (got.cpu().double() - want).abs()
    allowed = atol + rtol * (want.abs() + sizes)
    assert (error <= allowed).all(), f"dlog_g: worst error/allowed {(error / allowed).max():.3g}"


# (leading dims, L, d_k, d_v, largest log decay per step, initial state): one chunk and
# several, ragged ends, gates near 1 and strong decays.
GLA_CASES = [
    ((2,), 17, 16, 16, 0.5, False),
    ((1, 2), 100, 32, 24, 0.5, True),
    ((), 64, 16, 40, 20.0, True),
    ((), 1, 16, 16, 0.5, False),
]


@pytest.mark.parametrize("case", GLA_CASES, ids=str)
def test_chunk_simple_gla_fp32(case):
    """The Triton chunk form of gated linear attention with scalar gates (M8.13)."""
    check_simple_gla(*case, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_chunk_simple_gla_half(dtype):
    check_simple_gla((2,), 70, 32, 32, 0.5, True, dtype)


def test_chunk_simple_gla_bad_inputs():
    q = torch.randn(2, 6, 16)
    with pytest.raises(ValueError, match=r"log_g must have shape \(..., L\) = \(2, 6\)"):
        chunk_simple_gla(q, q, q, torch.zeros(2, 6, 16))
    with pytest.raises(ValueError, match="finite and <= 0"):
        chunk_simple_gla(q, q, q, torch.full((2, 6), 0.1))
    with pytest.raises(ValueError, match=r"initial_state must have shape.*\(2, 16, 16\)"):
        chunk_simple_gla(q, q, q, torch.zeros(2, 6), initial_state=torch.zeros(16, 16))
    with pytest.raises(ValueError, match="float64"):
        chunk_simple_gla(q.double(), q.double(), q.double(), torch.zeros(2, 6).double())
    with pytest.raises(ValueError, match="sequence length"):
        chunk_simple_gla(q, q[:, :5], q, torch.zeros(2, 6))


def check_gla(lead, length, d_k, d_v, gates, with_state, dtype, device=DEVICE, seed=0):
    """Output, final state and all gradients of `chunk_gla` against the fp64 reference; log
    gates uniform in ``gates = (low, high)``, drawn per step and key dimension."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(*lead, length, d_k), (*lead, length, d_k), (*lead, length, d_v)]
    q, k, v = (randn(*s, gen=gen).to(dtype).double() for s in shapes)
    low, high = gates
    log_g = low + (high - low) * torch.rand(*lead, length, d_k, generator=gen,
                                            dtype=torch.float64)
    log_g = log_g.to(dtype).double()
    h0 = randn(*lead, d_k, d_v, gen=gen).float().double() if with_state else None
    inputs = [q, k, v, log_g] + ([h0] if with_state else [])
    check_gated_kernel(chunk_gla, inputs, dtype, device, gen, per_key=True)


# (leading dims, L, d_k, d_v, log gates' range, initial state): one chunk (64 steps, in
# sub-chunks of 16) and several, ragged ends, head sizes that are not powers of two.
GLA_KEY_CASES = [
    ((2,), 17, 16, 16, (-0.5, 0.0), False),
    ((), 100, 32, 24, (-0.5, 0.0), True),
    ((), 1, 16, 16, (-0.5, 0.0), True),
    ((), 40, 128, 72, (-0.5, 0.0), False),
]


@pytest.mark.parametrize("case", GLA_KEY_CASES, ids=str)
def test_chunk_gla_fp32(case):
    """The Triton chunk form of gated linear attention with a gate per key dimension (M8.13)."""
    check_gla(*case, torch.float32)


@pytest.mark.parametrize("gates", [(-6.0, -4.0), (-20.0, 0.0)], ids=str)
def test_chunk_gla_strong_gates(gates):
    """log_g near -5 per step: over a 64-step chunk ``e^{-b}`` reaches ``e^{320}``, far past
    fp32's largest number, so the plain factoring ``(q e^{b}) . (k e^{-b})`` would give
    ``inf * 0 = nan``; the sub-chunks' references keep every exponent <= 0. Strong and weak
    gates mixed: decays near 1 between cumulative gates of hundreds, which fp32 alone would
    round to a few digits."""
    check_gla((), 70, 16, 16, gates, True, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_chunk_gla_half(dtype):
    check_gla((), 70, 32, 32, (-0.5, 0.0), True, dtype)


# fp16 tiles past fp16's largest number (65504) inside the kernels, though every result
# stays within it; (scale, offset) of the draws of q, k, v and of the output's cotangent, and
# the length. Large states: k, v near 40 add about 1600 to every state entry per step.
# Large state gradients: q and the cotangent near 100, summed over the 66 steps after the
# first chunk. Large scores: q . k near 80000 at d_k = 32 (chunk_gla sums its scores
# unscaled; chunk_simple_gla scales them before rounding).
FP16_RANGE = {
    "state": ([(0.01, 0.0), (1.0, 40.0), (1.0, 40.0)], (1e-3, 0.0), 70),
    "state_gradient": ([(1.0, 100.0), (0.01, 0.0), (0.01, 0.0)], (1.0, 100.0), 130),
    "scores": ([(1.0, 50.0), (1.0, 50.0), (0.01, 0.0)], (1e-3, 0.0), 70),
}


@pytest.mark.parametrize(("kernel", "case"), [
    (chunk_simple_gla, "state"), (chunk_simple_gla, "state_gradient"), (chunk_gla, "state"),
    (chunk_gla, "state_gradient"), (chunk_gla, "scores")],
    ids=lambda x: getattr(x, "__name__", x))
def test_chunked_fp16_tiles_past_fp16_range(kernel, case):
    """A state, a state gradient or a tile of scores past 65504 is rounded to fp16 for its
    tensor-core product only after each row and column is divided by a power of two
    (`_mode.dot_rescaled`); rounded as it is, it would be ``inf``. Weak gates (log gates
    in [-0.01, 0]), so the states grow with the length."""
    gen = torch.Generator().manual_seed(0)
    draws, cotangent, length = FP16_RANGE[case]
    d, per_key = 32, kernel is chunk_gla
    inputs = [(scale * randn(length, d, gen=gen) + offset).half().double()
              for scale, offset in draws]
    gate_shape = (length, d) if per_key else (length,)
    log_g = (-0.01 * torch.rand(*gate_shape, generator=gen, dtype=torch.float64))
    inputs.append(log_g.half().double())
    check_gated_kernel(kernel, inputs, torch.float16, DEVICE, gen, per_key, cotangent)


def test_chunk_gla_bad_inputs():
    q = torch.randn(2, 6, 16)
    with pytest.raises(ValueError, match=r"shape of k.*\(2, 6, 16\), got \(2, 6\)"):
        chunk_gla(q, q, q, torch.zeros(2, 6))
    with pytest.raises(ValueError, match="finite and <= 0"):
        chunk_gla(q, q, q, torch.full((2, 6, 16), 0.1))
    with pytest.raises(ValueError, match="finite and <= 0"):
        chunk_gla(q, q, q, torch.full((2, 6, 16), float("nan")))
    with pytest.raises(TypeError, match="log_g must have dtype"):
        chunk_gla(q, q, q, torch.zeros(2, 6, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"initial_state must have shape.*\(2, 16, 16\)"):
        chunk_gla(q, q, q, torch.zeros(2, 6, 16), initial_state=torch.zeros(16, 16))
    with pytest.raises(ValueError, match="float64"):
        chunk_gla(q.double(), q.double(), q.double(), torch.zeros(2, 6, 16).double())
    big = torch.randn(2, 6, 160)
    with pytest.raises(ValueError, match="d_k=160"):
        chunk_gla(big, big, q, torch.zeros(2, 6, 160))
    with pytest.raises(ValueError, match="sequence length"):
        chunk_gla(q, q[:, :5], q, torch.zeros(2, 6, 16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [((2, 4), 1024, 1024, 64, 64, True),
                                   ((2, 4), 1000, 1500, 128, 128, False),
                                   ((3,), 700, 300, 80, 48, True)], ids=str)
def test_flash_attention_gpu_sizes(shape, dtype):
    check_flash_attention(*shape, dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_chunk_simple_gla_gpu_sizes(dtype):
    check_simple_gla((2, 4), 1000, 64, 128, 0.5, True, dtype, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_chunk_gla_gpu_sizes(dtype):
    check_gla((2, 16), 4096, 64, 64, (-0.5, 0.0), True, dtype, device="cuda")


@pytest.mark.gpu
def test_chunk_gla_gpu_strong_gates():
    check_gla((2, 4), 1000, 128, 128, (-6.0, -4.0), True, torch.float32, device="cuda")


@pytest.mark.parametrize("kernel", [chunk_simple_gla, chunk_gla], ids=lambda f: f.__name__)
def test_chunked_flags_and_sizes(kernel):
    """A flag of another type is refused, not taken as truthy; head size 0 is named before
    the default scale divides by it; batch 0 gives empty results and gradients."""
    per_key = kernel is chunk_gla

    def gates(*lead_and_length, d_k):
        return torch.zeros(*lead_and_length, d_k) if per_key else torch.zeros(*lead_and_length)

    q = torch.randn(2, 6, 16)
    for flag in ("yes", 1):
        with pytest.raises(TypeError, match="return_final_state must be a bool"):
            kernel(q, q, q, gates(2, 6, d_k=16), return_final_state=flag)
    empty = torch.randn(2, 6, 0)
    with pytest.raises(ValueError, match="d_k=0"):
        kernel(empty, empty, q, gates(2, 6, d_k=0))
    q0, k0, v0 = (torch.randn(0, 3, 6, 16, requires_grad=True) for _ in range(3))
    log_g = gates(0, 3, 6, d_k=16).requires_grad_()
    out, state = kernel(q0, k0, v0, log_g, return_final_state=True)
    assert out.shape == (0, 3, 6, 16) and state.shape == (0, 3, 16, 16)
    grads_0 = torch.autograd.grad(out.sum() + state.sum(), (q0, k0, v0, log_g))
    assert [g.shape for g in grads_0] == [q0.shape, k0.shape, v0.shape, log_g.shape]


def test_flash_attention_head_size_zero_is_named():
    q = torch.randn(1, 4, 0)
    with pytest.raises(ValueError, match="d_k=0"):
        flash_attention(q, q, q)
