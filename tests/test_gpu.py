"""Every efficient form and every decode step of the library on the accelerator, against its fp64 CPU reference.

Pattern: inputs are drawn on the CPU in fp64 from a seeded generator and rounded once to the dtype under
test; the reference runs the library's naive form in fp64 on the CPU from those *rounded* values (and,
for modules, from the rounded weights), so the comparison measures the device computation alone, not the
rounding of the inputs. The efficient form (and its step/decode form) runs on the device in fp32 and in
bf16; its result must be on the device, in the expected dtype, and within `xfam_lib.testing.assert_close`'s
tolerance for that dtype. Gradients are compared the same way where the library differentiates the form.

All tests are marked ``gpu``: they run on CUDA (``python -m pytest tests -m gpu``) and are skipped without
it. ``XFAM_GPU_TESTS_ON=cpu`` runs them on the CPU instead (a dry run of this module; tests/conftest.py).
Sizes are small (L <= 256, d <= 64).
"""
import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F

from xfam_lib.arena import BASELINES, FAMILIES, ArenaLM, init_decode_state, mixer_step
from xfam_lib.attention import (CrossKVCache, MultiHeadAttention, attention_reference, padding_mask,
                                scaled_dot_product_attention, tiled_attention)
from xfam_lib.linear import (gated_linear_attention, linear_attention, orthogonal_gaussian, performer_attention,
                             retention)
from xfam_lib.memory import (CompressiveMemory, MemorizingAttention, NeuralMemory, TransformerXL, compress_pool,
                             exact_knn, knn_augmented_attention, xl_attention)
from xfam_lib.positional import (AlibiBias, RotaryEmbedding, T5RelativeBias, XLRelativeAttention, alibi_bias,
                                 alibi_slopes, apply_rope, apply_rope_reference, t5_relative_position_bucket,
                                 to_half_split, to_interleaved, xl_relative_scores, xl_relative_scores_reference)
from xfam_lib.sparse import (block_sparse_attention, blockwise_attention, blockwise_mask, dca_attention,
                             dca_attention_reference, expand_layout, longformer_attention, longformer_mask,
                             lsh_attention, lsh_attention_reference, lsh_hash, routing_attention,
                             sliding_window_attention, sliding_window_mask)
from xfam_lib.ssm import (H3Layer, MambaBlock, S4DLayer, discretize, h3_mix, s4d_kernel, selective_scan,
                          ssd_attention_form, ssd_chunked, ssd_scan, ssm_convolve, ssm_recurrence)
from xfam_lib.testing import assert_close
from xfam_lib.transformer import TransformerLM, generate

from test_9_more import h3_loop

pytestmark = pytest.mark.gpu

F64 = torch.float64
BF16 = torch.bfloat16
DTYPES = [torch.float32, BF16]
ON_CPU = os.environ.get("XFAM_GPU_TESTS_ON") == "cpu"


# ----------------------------------------------------------------------------- device and helpers
@pytest.fixture(scope="module")
def device():
    """CUDA, or the CPU for a dry run (``XFAM_GPU_TESTS_ON=cpu``). fp32 runs in true fp32: TF32 off, since
    the fp32 tolerances (1e-5) assume it and TF32 rounds products to 10 mantissa bits (about 1e-3)."""
    if ON_CPU:
        yield torch.device("cpu")
        return
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def draw(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen, dtype=F64) * scale


def split(x, device, dtype, *, grad=False):
    """``x`` rounded to ``dtype``: on the device, and as the fp64 CPU reference input (the same values)."""
    dev = x.to(dtype).to(device)
    ref = x.to(dtype).to(F64)
    if grad:
        dev.requires_grad_()
        ref.requires_grad_()
    return dev, ref


def splits(xs, device, dtype, *, grad=False):
    pairs = [split(x, device, dtype, grad=grad) for x in xs]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def twins(module, device, dtype):
    """``module`` on the device in ``dtype``, and its fp64 CPU twin holding the same rounded weights."""
    dev = copy.deepcopy(module).to(device=device, dtype=dtype)
    ref = copy.deepcopy(dev).to(device="cpu", dtype=F64)
    return dev, ref


def check(out, expected, device, dtype, name, **tol):
    """``out`` lives on ``device`` with ``dtype`` and matches the fp64 ``expected`` (tolerance of ``dtype``)."""
    assert out.device.type == device.type, f"{name}: on {out.device}, expected {device}"
    assert out.dtype == dtype, f"{name}: dtype {out.dtype}, expected {dtype}"
    assert_close(out, expected, name=name, **tol)


def check_grads(out, inputs, out_ref, inputs_ref, device, dtype, name, gen, **tol):
    """Gradients of ``<out, cot>`` for one random cotangent ``cot``, device against reference."""
    cot, cot_ref = split(draw(gen, *out.shape), device, dtype)
    got = torch.autograd.grad(out, inputs, cot, allow_unused=True, materialize_grads=True)
    want = torch.autograd.grad(out_ref, inputs_ref, cot_ref, allow_unused=True, materialize_grads=True)
    for i, (g, w, x) in enumerate(zip(got, want, inputs)):
        check(g, w, device, x.dtype, f"{name}: grad {i}", **tol)


def bottom_right(lq, lk):
    """Causal mask for any lengths: query ``i`` at position ``i + lk - lq`` sees keys ``j <= i + lk - lq``."""
    return torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)


# One-op functions keep the default bf16 tolerance (1e-2, 2e-2): they compute in fp32 and round the result
# once. A module in bf16 rounds in sequence (input projections, the mixer's output, the output projection,
# norms and residual sums), each an error of up to u = 2^-8 = 3.9e-3 of an O(1) value, with sums of
# d <= 64 rounded terms between them: twice the default covers that. (Worst seen on the CPU: 2.4e-2 at
# |y| = 0.48, relative RMS 8e-3 = 2u, the arena GLA step form.)
BF16_MODULE = dict(atol=2e-2, rtol=4e-2)


def module_tol(dtype):
    return BF16_MODULE if dtype == BF16 else {}


# ============================================================================= attention
SDPA_CASES = {                       # (Lq, Lk, causal, mask kind, with bias)
    "plain": (48, 48, False, None, False),
    "causal": (48, 48, True, None, False),
    "causal Lq<Lk": (8, 48, True, None, False),
    "causal Lq>Lk": (40, 24, True, None, False),
    "padding mask": (48, 48, False, "padding", False),
    "bias, causal": (48, 48, True, None, True),
    "padding and bias, Lq<Lk": (16, 40, False, "padding", True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SDPA_CASES)
def test_sdpa_fused_equals_reference(case, dtype, device, gen):
    """`scaled_dot_product_attention` (the fused kernel) ≡ `attention_reference` in fp64: masks, bias,
    bottom-right causal with Lq != Lk (empty rows give zeros), outputs and gradients of q, k, v."""
    lq, lk, causal, mask_kind, with_bias = SDPA_CASES[case]
    B, H, d = 2, 2, 32
    (q, k, v), (qr, kr, vr) = splits([draw(gen, B, H, lq, d), draw(gen, B, H, lk, d), draw(gen, B, H, lk, d)],
                                     device, dtype, grad=True)
    mask = padding_mask([lk, lk - 11], lk) if mask_kind == "padding" else None
    bias = alibi_bias(H, lq, lk, dtype=F64) if with_bias else None
    ref_mask = mask
    if causal:
        ref_mask = bottom_right(lq, lk) if mask is None else mask & bottom_right(lq, lk)
    out = scaled_dot_product_attention(q, k, v, None if mask is None else mask.to(device),
                                       bias=None if bias is None else bias.to(device, dtype), causal=causal)
    ref_bias = None if bias is None else bias.to(dtype).to(F64)
    expected, _ = attention_reference(qr, kr, vr, ref_mask, bias=ref_bias, scale=d ** -0.5)
    check(out, expected, device, dtype, case)
    check_grads(out, (q, k, v), expected, (qr, kr, vr), device, dtype, case, gen)


TILED_CASES = {"plain": (70, 70, False), "causal": (70, 70, True), "causal Lq<Lk": (20, 70, True),
               "causal Lq>Lk": (60, 40, True), "Lq!=Lk": (30, 70, False)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILED_CASES)
def test_tiled_attention_equals_reference(case, dtype, device, gen):
    """`tiled_attention` (online softmax, ragged 32x24 blocks) ≡ `attention_reference` in fp64, with its
    hand-written backward against autograd of the reference; the log-sum-exp too."""
    lq, lk, causal = TILED_CASES[case]
    (q, k, v), (qr, kr, vr) = splits([draw(gen, 2, 2, lq, 32), draw(gen, 2, 2, lk, 32), draw(gen, 2, 2, lk, 32)],
                                     device, dtype, grad=True)
    out, lse = tiled_attention(q, k, v, causal=causal, block_q=32, block_k=24, return_lse=True)
    mask = bottom_right(lq, lk) if causal else None
    expected, _ = attention_reference(qr, kr, vr, mask, scale=32 ** -0.5)
    check(out, expected, device, dtype, case)
    scores = (qr @ kr.transpose(-2, -1)) * 32 ** -0.5
    lse_ref = torch.logsumexp(scores if mask is None else scores.masked_fill(~mask, -math.inf), dim=-1)
    check(lse, lse_ref.detach(), device, torch.float32 if dtype == BF16 else dtype, f"{case}: lse")
    check_grads(out, (q, k, v), expected, (qr, kr, vr), device, dtype, case, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_multi_head_attention_gqa_with_rope(n_kv_heads, dtype, device, gen):
    """`MultiHeadAttention` with MHA/GQA/MQA heads and RoPE, causal, on the device ≡ its fp64 CPU twin."""
    torch.manual_seed(0)
    dev, ref = twins(MultiHeadAttention(64, 4, n_kv_heads, rope=RotaryEmbedding()), device, dtype)
    x, xr = split(draw(gen, 2, 40, 64), device, dtype)
    with torch.no_grad():
        check(dev(x, causal=True), ref(xr, causal=True), device, dtype, f"kv heads {n_kv_heads}",
              **module_tol(dtype))


# ============================================================================= positions
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("positions", ["default", "offset", "scattered"])
def test_rope_equals_reference(positions, interleaved, dtype, device, gen):
    """`apply_rope` (cached tables, fused rotation) ≡ `apply_rope_reference` (rotate_half) in fp64, both
    layouts, at positions 0..L-1, at an offset (a decode step) and at scattered positions."""
    L, d = 33, 64
    pos = {"default": None, "offset": torch.arange(200, 200 + L),
           "scattered": torch.randperm(500, generator=gen)[:L]}[positions]
    x, xr = split(draw(gen, 2, 3, L, d), device, dtype)
    out = apply_rope(x, None if pos is None else pos.to(device), interleaved=interleaved)
    if interleaved:
        expected = to_interleaved(apply_rope_reference(to_half_split(xr), pos))
    else:
        expected = apply_rope_reference(xr, pos)
    check(out, expected, device, dtype, f"rope {positions}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads", [8, 6])
def test_alibi_bias_and_table_equal_the_formula(n_heads, dtype, device):
    """`alibi_bias` and the sliced `AlibiBias` table on the device ≡ ``-m_h |i + Lk - Lq - j|`` in fp64."""
    lq, lk = 7, 50
    slopes = alibi_slopes(n_heads, dtype=F64)
    dist = (torch.arange(lq)[:, None] + lk - lq - torch.arange(lk)[None, :]).abs().to(F64)
    expected = -slopes[:, None, None] * dist
    check(alibi_bias(n_heads, lq, lk, dtype=dtype, device=device), expected, device, dtype, "alibi_bias")
    table = AlibiBias(n_heads)
    table(60, 90, device=device, dtype=dtype)                       # a larger table first: the next call slices it
    check(table(lq, lk, device=device, dtype=dtype), expected, device, dtype, "AlibiBias")


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_equal_cpu(bidirectional, device):
    """T5 bucket ids computed on the device are exactly those computed on the CPU (they pass through fp32
    logs, so a device whose log differs in the last bit would move a distance to the next bucket)."""
    rel = torch.arange(-300, 301)
    cpu = t5_relative_position_bucket(rel, bidirectional=bidirectional)
    got = t5_relative_position_bucket(rel.to(device), bidirectional=bidirectional)
    assert got.device.type == device.type
    assert torch.equal(got.cpu(), cpu)


@pytest.mark.parametrize("dtype", DTYPES)
def test_t5_relative_bias_module(dtype, device):
    """`T5RelativeBias` on the device (after a longer call, so the table is sliced) ≡ its fp64 CPU twin."""
    torch.manual_seed(0)
    module = T5RelativeBias(4, bidirectional=False)
    torch.nn.init.normal_(module.bias.weight)
    dev, ref = twins(module, device, dtype)
    dev(30, 80)
    check(dev(5, 40), ref(5, 40).detach(), device, dtype, "t5 bias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lq, lk", [(24, 24), (6, 24)])
def test_xl_relative_scores_equal_the_loop(lq, lk, dtype, device, gen):
    """`xl_relative_scores` (the rel_shift trick) ≡ `xl_relative_scores_reference` (pair by pair) in fp64."""
    inputs = [draw(gen, 2, 3, lq, 16), draw(gen, 2, 3, lk, 16), draw(gen, 3, lk, 16), draw(gen, 3, 16),
              draw(gen, 3, 16)]
    dev, ref = splits(inputs, device, dtype)
    expected = xl_relative_scores_reference(*ref)
    check(xl_relative_scores(*dev), expected, device, dtype, "xl scores")


@pytest.mark.parametrize("dtype", DTYPES)
def test_xl_relative_attention_module_full_and_cached(dtype, device, gen):
    """`XLRelativeAttention` on the device ≡ its fp64 CPU twin; decoding with a KV cache (prefill 6, then one
    token at a time) ≡ the full causal forward."""
    torch.manual_seed(0)
    module = XLRelativeAttention(32, 4, 2)
    torch.nn.init.normal_(module.u)
    torch.nn.init.normal_(module.v)
    dev, ref = twins(module, device, dtype)
    x, xr = split(draw(gen, 2, 14, 32), device, dtype)
    with torch.no_grad():
        expected = ref(xr)
        check(dev(x), expected, device, dtype, "xl attention", **module_tol(dtype))
        cache = dev.make_cache(2, 14)
        pieces = [dev(x[:, :6], cache=cache)] + [dev(x[:, t:t + 1], cache=cache) for t in range(6, 14)]
    check(torch.cat(pieces, 1), expected, device, dtype, "xl attention, cached", **module_tol(dtype))


# ============================================================================= sparse
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_equals_masked_reference(causal, dtype, device, gen):
    """`sliding_window_attention` (banded chunks, ragged last chunk) ≡ dense attention with the band mask."""
    L, window = 70, 9
    dev, ref = splits([draw(gen, 2, 2, L, 16) for _ in range(3)], device, dtype, grad=True)
    out = sliding_window_attention(*dev, window, causal=causal, block_size=16)
    expected, _ = attention_reference(*ref, sliding_window_mask(L, window, causal), scale=16 ** -0.5)
    check(out, expected, device, dtype, "sliding window")
    check_grads(out, dev, expected, ref, device, dtype, "sliding window", gen)


@pytest.mark.parametrize("dtype", DTYPES)
def test_longformer_equals_masked_reference(dtype, device, gen):
    """`longformer_attention` (band + global keys merged by log-sum-exp + global rows) ≡ dense masked attention."""
    L = 64
    dev, ref = splits([draw(gen, 2, 2, L, 16) for _ in range(3)], device, dtype)
    out = longformer_attention(*dev, 4, (0, 31))
    expected, _ = attention_reference(*ref, longformer_mask(L, 4, 1, (0, 31)), scale=16 ** -0.5)
    check(out, expected, device, dtype, "longformer")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_head", [False, True])
def test_block_sparse_equals_masked_reference(per_head, dtype, device, gen):
    """`block_sparse_attention` (gathered tiles, ragged last block, a query block with no key block)
    ≡ dense attention with the expanded layout."""
    lq, lk, bs, H = 45, 60, 16, 2
    n_q, n_k = -(-lq // bs), -(-lk // bs)
    layout = torch.rand(H if per_head else 1, n_q, n_k, generator=gen) < 0.5
    layout[:, 0] = False                                             # query block 0 sees no key: zeros
    layout[:, 1, 0] = True
    layout = layout if per_head else layout[0]
    (q, k, v), (qr, kr, vr) = splits([draw(gen, 2, H, lq, 16), draw(gen, 2, H, lk, 16), draw(gen, 2, H, lk, 16)],
                                     device, dtype)
    out = block_sparse_attention(q, k, v, layout.to(device), bs)
    mask = expand_layout(layout, bs)[..., :lq, :lk]
    expected, _ = attention_reference(qr, kr, vr, mask, scale=16 ** -0.5)
    check(out, expected, device, dtype, "block sparse")


@pytest.mark.parametrize("dtype", DTYPES)
def test_blockwise_equals_masked_reference(dtype, device, gen):
    """`blockwise_attention` (reshaped blocks, permuted) ≡ dense attention with `blockwise_mask`."""
    perm = [2, 0, 3, 1]
    dev, ref = splits([draw(gen, 2, 2, 64, 16) for _ in range(3)], device, dtype)
    out = blockwise_attention(*dev, 4, perm)
    expected, _ = attention_reference(*ref, blockwise_mask(64, 4, perm), scale=16 ** -0.5)
    check(out, expected, device, dtype, "blockwise")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_lsh_attention_equals_reference(causal, dtype, device, gen):
    """`lsh_attention` (sort by bucket, chunked, rounds merged) ≡ `lsh_attention_reference` (dense masks) in
    fp64, with the buckets hashed once on the CPU from the rounded inputs (so both sort the same way)."""
    L, n_rounds = 40, 2
    (qk, v), (qkr, vr) = splits([draw(gen, L, 16), draw(gen, L, 16)], device, dtype)
    buckets = lsh_hash(qkr, 4, n_rounds, seed=1)
    out = lsh_attention(qk, v, 4, 8, n_rounds, causal=causal, buckets=buckets.to(device))
    check(out, lsh_attention_reference(qkr, vr, buckets, 8, causal), device, dtype, "lsh")


@pytest.mark.parametrize("dtype", DTYPES)
def test_routing_attention_equals_cluster_masks(dtype, device, gen):
    """`routing_attention` (balanced clusters, gathered) ≡ the mean over clusters of dense attention with the
    mask "query and key in the cluster" (members chosen by cosine to the centroids, in fp64)."""
    L, window, n_c = 48, 12, 4
    (q, k, v, mu), (qr, kr, vr, mur) = splits([draw(gen, 2, L, 16) for _ in range(3)] + [draw(gen, n_c, 16)],
                                              device, dtype)
    out = routing_attention(q, k, v, mu, window)
    cos = lambda x: F.normalize(x, dim=-1) @ F.normalize(mur, dim=-1).T             # (2, L, C)
    q_in = torch.zeros(2, n_c, L, dtype=torch.bool).scatter_(-1, cos(qr).topk(window, dim=-2).indices.mT, True)
    k_in = torch.zeros(2, n_c, L, dtype=torch.bool).scatter_(-1, cos(kr).topk(window, dim=-2).indices.mT, True)
    total, count = torch.zeros(2, L, 16, dtype=F64), torch.zeros(2, L, 1, dtype=F64)
    for c in range(n_c):
        mask = q_in[:, c, :, None] & k_in[:, c, None, :]
        o, _ = attention_reference(qr, kr, vr, mask, scale=16 ** -0.5)
        total += o * q_in[:, c, :, None]
        count += q_in[:, c, :, None]
    check(out, total / count.clamp(min=1), device, dtype, "routing")


@pytest.mark.parametrize("dtype", DTYPES)
def test_dca_attention_equals_reference(dtype, device, gen):
    """`dca_attention` (three rotated query copies merged by log-sum-exp) ≡ `dca_attention_reference`."""
    dev, ref = splits([draw(gen, 2, 40, 16) for _ in range(3)], device, dtype)
    out = dca_attention(*dev, 24, 10, 4)
    check(out, dca_attention_reference(*ref, 24, 10, 4), device, dtype, "dca")


# ============================================================================= linear attention and relatives
LINEAR_MODES = ["parallel", "recurrent", "chunk"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", LINEAR_MODES)
@pytest.mark.parametrize("causal, feature_map, normalize", [(True, "elu", True), (False, "elu", True),
                                                            (True, "identity", False), (True, "relu", True)])
def test_linear_attention_modes_equal_reference(causal, feature_map, normalize, mode, dtype, device, gen):
    """`linear_attention` in every mode on the device ≡ the quadratic form in fp64 (chunk of 16 over L = 50:
    a ragged tail); gradients for the chunk form."""
    dev, ref = splits([draw(gen, 2, 2, 50, 16, scale=0.5) for _ in range(3)], device, dtype, grad=True)
    kw = dict(feature_map=feature_map, causal=causal, normalize=normalize)
    out = linear_attention(*dev, mode=mode, chunk_size=16, **kw)
    expected = linear_attention(*ref, mode="parallel", **kw)
    check(out, expected, device, dtype, mode)
    if mode == "chunk":
        check_grads(out, dev, expected, ref, device, dtype, mode, gen)


def gla_inputs(gen, strength, L=70, d=16):
    """q, k, v, log_g: gates ``logsigmoid`` of N(0, 1) scaled by ``strength`` (1/16: mild; 4: the chunk's
    total log decay falls far below -20 and the chunk form takes its log-space path)."""
    q, k, v = (draw(gen, 2, 2, L, d) for _ in range(3))
    return [q, k, v, F.logsigmoid(draw(gen, 2, 2, L, d)) * strength]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["recurrent", "parallel", "chunk"])
@pytest.mark.parametrize("strength", [1 / 16, 4.0])
def test_gla_modes_equal_reference(strength, mode, dtype, device, gen):
    """`gated_linear_attention` in every mode on the device, from an initial state, ≡ the recurrent loop in
    fp64: outputs and the final state (fp32 for bf16 inputs); gradients for the chunk form."""
    inputs = gla_inputs(gen, strength)
    s0 = draw(gen, 2, 2, 16, 16)
    (q, k, v, g), (qr, kr, vr, gr) = splits(inputs, device, dtype, grad=True)
    state_dtype = torch.float32 if dtype == BF16 else dtype
    s0_dev, s0_ref = s0.to(device, state_dtype), s0.to(state_dtype).to(F64)
    out, state = gated_linear_attention(q, k, v, g, mode=mode, chunk_size=16, initial_state=s0_dev,
                                        return_final_state=True)
    expected, state_ref = gated_linear_attention(qr, kr, vr, gr, mode="recurrent", initial_state=s0_ref,
                                                 return_final_state=True)
    check(out, expected, device, dtype, mode)
    check(state, state_ref.detach(), device, state_dtype, f"{mode}: final state")
    if mode == "chunk":
        check_grads(out, (q, k, v, g), expected, (qr, kr, vr, gr), device, dtype, mode, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_retention_equals_decay_matrix_formula(mode, dtype, device, gen):
    """`retention` (one decay per head) ≡ ``(Q K^T ⊙ D) V`` with ``D[n, m] = gamma^(n - m)``, written in fp64."""
    L = 40
    gamma = torch.tensor([0.5, 0.9, 0.99], dtype=F64)
    (q, k, v), (qr, kr, vr) = splits([draw(gen, 2, 3, L, 16, scale=0.5) for _ in range(3)], device, dtype)
    n = torch.arange(L, dtype=F64)
    decay = gamma[:, None, None] ** (n[:, None] - n[None, :]).clamp(min=0) * bottom_right(L, L)
    expected = ((qr @ kr.mT) * decay) @ vr
    out = retention(q, k, v, gamma.to(device, torch.float32), mode=mode, chunk_size=16)
    check(out, expected, device, dtype, mode)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
@pytest.mark.parametrize("causal", [False, True])
def test_performer_equals_fp64_with_the_same_features(causal, mode, dtype, device, gen):
    """`performer_attention` with features ``W`` drawn on the CPU (orthogonal, fp64): every mode on the
    device ≡ the parallel form in fp64 with the same ``W`` (rounded to the dtype)."""
    W = orthogonal_gaussian(64, 16, seed=3, dtype=F64)
    (q, k, v, Wd), (qr, kr, vr, Wr) = splits([draw(gen, 2, 2, 50, 16) for _ in range(3)] + [W], device, dtype)
    out = performer_attention(q, k, v, 64, W=Wd, causal=causal, mode=mode, chunk_size=16)
    expected = performer_attention(qr, kr, vr, 64, W=Wr, causal=causal, mode="parallel")
    check(out, expected, device, dtype, mode)


# ============================================================================= state-space models
def scan_inputs(gen, bc, strong=False, batch=2, dim=8, L=70, N=4):
    """Selective-scan arguments; ``strong`` makes ``delta * A`` so negative that the chunked scan leaves its
    closed-form path for the step loop inside chunks."""
    u, delta, z = draw(gen, batch, dim, L), draw(gen, batch, dim, L, scale=0.5), draw(gen, batch, dim, L)
    A = -torch.exp(draw(gen, dim, N, scale=0.5)) * (40.0 if strong else 1.0)
    shapes = {"fixed": (dim, N), "input": (batch, N, L), "grouped": (batch, 2, N, L)}[bc]
    B, C = draw(gen, *shapes), draw(gen, *shapes)
    return [u, delta, A, B, C, draw(gen, dim), z, draw(gen, dim, scale=0.1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["sequential", "chunk", "scan"])
@pytest.mark.parametrize("bc, strong", [("input", False), ("fixed", False), ("grouped", False), ("input", True)])
def test_selective_scan_modes_equal_reference(bc, strong, mode, dtype, device, gen):
    """`selective_scan` in every mode (D, z, delta_bias, softplus, last state) on the device ≡ the sequential
    loop in fp64; gradients of every input for the chunk form."""
    dev, ref = splits(scan_inputs(gen, bc, strong), device, dtype, grad=True)
    y, last = selective_scan(*dev, delta_softplus=True, return_last_state=True, mode=mode, chunk_size=16)
    y_ref, last_ref = selective_scan(*ref, delta_softplus=True, return_last_state=True, mode="sequential")
    check(y, y_ref, device, dtype, mode)
    check(last, last_ref.detach(), device, torch.float32, f"{mode}: last state")
    if mode == "chunk":
        check_grads(y, dev, y_ref, ref, device, dtype, mode, gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["chunked", "attention"])
@pytest.mark.parametrize("groups", [1, 2])
def test_ssd_forms_equal_the_scan(groups, form, dtype, device, gen):
    """`ssd_chunked` (from an initial state, ragged tail) and `ssd_attention_form` on the device ≡ `ssd_scan`
    in fp64; the chunked form's final state and gradients too."""
    b, L, H, P, N = 2, 45, 4, 8, 6
    x, a = draw(gen, b, L, H, P), -torch.exp(draw(gen, b, L, H, scale=0.5)) * 0.3
    B, C = draw(gen, b, L, groups, N), draw(gen, b, L, groups, N)
    dev, ref = splits([x, a, B, C], device, dtype, grad=True)
    if form == "attention":
        check(ssd_attention_form(*dev), ssd_scan(*ref), device, dtype, "attention form")
        return
    h0, h0r = split(draw(gen, b, H, P, N), device, torch.float32)
    y, h = ssd_chunked(*dev, chunk_size=16, initial_state=h0, return_final_state=True)
    y_ref, h_ref = ssd_scan(*ref, initial_state=h0r, return_final_state=True)
    check(y, y_ref, device, dtype, "chunked")
    check(h, h_ref.detach(), device, torch.float32, "chunked: final state")
    check_grads(y, dev, y_ref, ref, device, dtype, "chunked", gen)


def s4d_reference_kernel(log_dt, A_re, A_im, C, L):
    """The kernel of state-spaces/s4 ``s4d.py``: ``2 Re sum_n C_n (e^{dt A_n} - 1) / A_n e^{k dt A_n}``."""
    dt = torch.exp(log_dt)
    A = A_re + 1j * A_im
    dtA = A * dt[:, None]
    return 2 * torch.einsum("hn,hnl->hl", C * (torch.exp(dtA) - 1.0) / A,
                            torch.exp(dtA[..., None] * torch.arange(L, dtype=log_dt.dtype))).real


@pytest.mark.parametrize("dtype", DTYPES)
def test_s4d_kernel_and_fft_convolution(dtype, device, gen):
    """`s4d_kernel` on the device ≡ the s4d.py formula in fp64; `ssm_convolve` (FFT) with it ≡ the recurrence
    of the same diagonal system in fp64."""
    H, half, L = 4, 8, 128
    log_dt = torch.empty(H, dtype=F64).uniform_(math.log(1e-3), math.log(1e-1), generator=gen)
    A_re, A_im = -torch.exp(draw(gen, H, half, scale=0.3)), math.pi * torch.arange(half, dtype=F64).repeat(H, 1)
    C = torch.complex(draw(gen, H, half), draw(gen, H, half))
    (ld, ar, ai), (ldr, arr, air) = splits([log_dt, A_re, A_im], device, dtype)
    K = s4d_kernel(ld, ar, ai, C.to(device, torch.complex64), L)
    K_ref = s4d_reference_kernel(ldr, arr, air, C.to(torch.complex64).to(torch.complex128), L)
    # C has no bf16 complex type (complex64): the kernel takes the promoted dtype, fp32, for bf16 parameters
    check(K, K_ref, device, torch.float32, "s4d kernel")
    u, ur = split(draw(gen, 2, H, L), device, dtype)
    K, Kr = K.to(dtype), K.to(dtype).cpu().to(F64)
    y = ssm_convolve(u, K)
    lag = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    toeplitz = torch.where(lag >= 0, Kr[:, lag.clamp(min=0)], 0.0)                  # (H, L, L): K_{t-j}, j <= t
    check(y, (toeplitz @ ur[..., None])[..., 0], device, dtype, "fft convolution")
    if dtype == torch.float32:                      # kernel and convolution together ≡ the SSM run step by step
        A = torch.complex(arr, air)
        A_bar, B_bar = discretize(A, torch.ones_like(A), torch.exp(ldr), "zoh")
        C_ref = C.to(torch.complex64).to(torch.complex128)
        y_ref = 2 * ssm_recurrence(A_bar, B_bar, C_ref, ur.to(torch.complex128)).real
        check(y, y_ref, device, dtype, "convolution vs recurrence")


@pytest.mark.parametrize("dtype", DTYPES)
def test_s4d_layer(dtype, device, gen):
    """`S4DLayer` (FFT convolution with its kernel, then GLU) on the device ≡ its fp64 CPU twin."""
    torch.manual_seed(0)
    dev, ref = twins(S4DLayer(16, 8), device, dtype)
    x, xr = split(draw(gen, 2, 60, 16), device, dtype)
    with torch.no_grad():
        check(dev(x), ref(xr), device, dtype, "s4d layer", **module_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_h3_mix_equals_double_loop(dtype, device, gen):
    """`h3_mix` (two FFT convolutions) on the device ≡ the double loop over positions in fp64."""
    b, L, H, dh = 2, 20, 2, 3
    inputs = [draw(gen, b, L, H, dh) for _ in range(3)]
    inputs += [draw(gen, H, dh, L, scale=0.5), draw(gen, H, dh, dh, L, scale=0.2), draw(gen, H, dh, dh)]
    dev, ref = splits(inputs, device, dtype)
    check(h3_mix(*dev), h3_loop(*ref), device, dtype, "h3_mix")


@pytest.mark.parametrize("dtype", DTYPES)
def test_h3_layer(dtype, device, gen):
    """`H3Layer` (projections, shift and S4D kernels, `h3_mix`) on the device ≡ its fp64 CPU twin."""
    torch.manual_seed(0)
    layer, layer_ref = twins(H3Layer(8, d_state=4, head_dim=2), device, dtype)
    x, xr = split(draw(gen, 2, 30, 8), device, dtype)
    with torch.no_grad():
        check(layer(x), layer_ref(xr), device, dtype, "h3 layer", **module_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["sequential", "chunk", "scan"])
def test_mamba_block_forward_and_step(mode, dtype, device, gen):
    """`MambaBlock` full forward in every scan mode, and its `step` loop from `init_state`, on the device
    ≡ the fp64 CPU twin's sequential forward."""
    torch.manual_seed(0)
    dev, ref = twins(MambaBlock(16, d_state=8), device, dtype)
    x, xr = split(draw(gen, 2, 28, 16), device, dtype)
    with torch.no_grad():
        expected = ref(xr, mode="sequential")
        check(dev(x, mode=mode, chunk_size=8), expected, device, dtype, mode, **module_tol(dtype))
        state, ys = dev.init_state(2, device=device), []
        for t in range(28):
            y_t, state = dev.step(x[:, t], state)
            ys.append(y_t)
    check(torch.stack(ys, 1), expected, device, dtype, "step loop", **module_tol(dtype))


# ============================================================================= memory
@pytest.mark.parametrize("dtype", DTYPES)
def test_transformer_xl_segments_equal_one_forward(dtype, device):
    """`TransformerXL` fed 3 segments of 8 with a memory covering the past, on the device, ≡ one forward of
    its fp64 twin over all 24 tokens; `xl_attention` over a memory ≡ the attention module over [mem; h]."""
    torch.manual_seed(0)
    model = TransformerXL(vocab=20, d_model=32, n_layers=2, n_heads=4, d_ff=48, mem_len=16)
    for layer in model.layers:
        torch.nn.init.normal_(layer.attn.u)
        torch.nn.init.normal_(layer.attn.v)
    dev, ref = twins(model, device, dtype)
    ids = torch.randint(0, 20, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = ref(ids)
        mems, pieces = None, []
        for s in range(3):
            logits, mems = dev(ids[:, 8 * s:8 * s + 8].to(device), mems)
            pieces.append(logits)
        check(torch.cat(pieces, 1), expected, device, dtype, "segments", **module_tol(dtype))
        attn, attn_ref = dev.layers[0].attn, ref.layers[0].attn
        g = torch.Generator().manual_seed(2)
        (mem, h), (mem_r, h_r) = splits([draw(g, 2, 10, 32), draw(g, 2, 6, 32)], device, dtype)
        expected = attn_ref(torch.cat([mem_r, h_r], 1))[:, -6:]
        check(xl_attention(h, mem, attn), expected, device, dtype, "xl_attention", **module_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compressor", ["mean", "max", "conv"])
def test_compressive_memory_update(compressor, dtype, device, gen):
    """`CompressiveMemory.update` over 4 segments of 6 on the device ≡ its fp64 twin (bands and evicted rows);
    `compress_pool` ≡ the mean/max over groups written out."""
    torch.manual_seed(0)
    dev, ref = twins(CompressiveMemory(8, 6, 3, compressor, d_model=16), device, dtype)
    mem = cmem = mem_r = cmem_r = None
    with torch.no_grad():
        for s in range(4):
            h, hr = split(draw(gen, 2, 6, 16), device, dtype)
            mem, cmem, old = dev.update(mem, cmem, h)
            mem_r, cmem_r, old_r = ref.update(mem_r, cmem_r, hr)
            for name, got, want in (("mem", mem, mem_r), ("cmem", cmem, cmem_r), ("old", old, old_r)):
                check(got, want, device, dtype, f"segment {s}: {name}")
    x, xr = split(draw(gen, 2, 3, 14, 16), device, dtype)
    groups = xr[..., 2:, :].unflatten(-2, (4, 3))                        # 14 % 3 = 2 oldest rows dropped
    expected = groups.mean(-2) if compressor != "max" else groups.amax(-2)
    check(compress_pool(x, 3, "max" if compressor == "max" else "mean"), expected, device, dtype, "compress_pool")


@pytest.mark.parametrize("compressor", ["mean", "conv"])
def test_compressive_memory_evicting_fewer_rows_than_the_ratio(compressor, device, gen):
    """A segment that pushes out fewer rows than the compression ratio adds no compressed slot (the
    ``n % ratio`` oldest rows are dropped, ERRATA E5.3), whichever compressor: 2 evicted rows, ratio 3."""
    torch.manual_seed(0)
    memory = CompressiveMemory(8, 6, 3, compressor, d_model=16).to(device)
    h = draw(gen, 2, 10, 16).to(device, torch.float32)
    with torch.no_grad():
        mem, cmem, old = memory.update(None, torch.zeros(2, 0, 16, device=device), h)
    assert old.shape == (2, 2, 16) and cmem.shape == (2, 0, 16) and mem.device.type == device.type


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("block_size", [None, 48])
def test_exact_knn_equals_brute_force(block_size, metric, dtype, device, gen):
    """`exact_knn` (full top-k or streamed over blocks of keys) on the device ≡ brute force in fp64:
    the same neighbours, the same scores."""
    (q, keys), (qr, keys_r) = splits([draw(gen, 2, 3, 10, 16), draw(gen, 200, 16)], device, dtype)
    scores, idx = exact_knn(q, keys, 5, metric=metric, block_size=block_size)
    full = ((qr[..., :, None, :] - keys_r) ** 2).sum(-1) if metric == "l2" else qr @ keys_r.T
    want, want_idx = full.topk(5, dim=-1, largest=metric == "ip")
    check(scores, want, device, dtype, "scores")
    assert idx.device.type == device.type
    assert torch.equal(idx.cpu(), want_idx)


@pytest.mark.parametrize("dtype", DTYPES)
def test_knn_augmented_attention(dtype, device, gen):
    """`knn_augmented_attention` on the device ≡ the gate-mixed sum of local causal attention and attention over
    the ``topk`` largest-logit memories (chosen in fp64), per head gate."""
    (q, k, v, mk, mv), (qr, kr, vr, mkr, mvr) = splits(
        [draw(gen, 2, 3, 10, 16) for _ in range(3)] + [draw(gen, 2, 3, 30, 16) for _ in range(2)], device, dtype)
    gate = torch.tensor([-1.0, 0.0, 2.0], dtype=F64)
    out = knn_augmented_attention(q, k, v, mk, mv, 4, gate.to(device, dtype))
    logits = qr @ mkr.mT
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, logits.topk(4, dim=-1).indices, True)
    from_mem, _ = attention_reference(qr, mkr, mvr, keep, scale=16 ** -0.5)
    local, _ = attention_reference(qr, kr, vr, bottom_right(10, 10), scale=16 ** -0.5)
    g = torch.sigmoid(gate.to(dtype).to(F64))[:, None, None]
    check(out, g * from_mem + (1 - g) * local, device, dtype, "knn attention")


@pytest.mark.parametrize("dtype", DTYPES)
def test_memorizing_attention_over_segments(dtype, device, gen):
    """`MemorizingAttention` over three segments (its FIFO memory filling up) on the device ≡ its fp64 twin.
    ``topk`` covers the whole memory, so rounding cannot change which memories are retrieved."""
    torch.manual_seed(0)
    dev, ref = twins(MemorizingAttention(32, 4, capacity=16, topk=16), device, dtype)
    with torch.no_grad():
        for s in range(3):
            x, xr = split(draw(gen, 2, 8, 32), device, dtype)
            check(dev(x), ref(xr), device, dtype, f"segment {s}", **module_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["delta", "hebbian"])
def test_neural_memory_scan(kind, dtype, device, gen):
    """`NeuralMemory.scan` (write then read, momentum and forgetting) on the device ≡ the fp64 CPU scan; the
    memory state is kept in fp32 for bf16 inputs."""
    (q, k, v), (qr, kr, vr) = splits([draw(gen, 2, 30, 16, scale=0.25) for _ in range(3)], device, dtype)
    make = lambda: NeuralMemory(16, kind, lr=0.1, momentum=0.5, decay=0.05)
    mem, mem_ref = make(), make()
    check(mem.scan(q, k, v), mem_ref.scan(qr, kr, vr), device, dtype, kind)
    assert mem.M.dtype == (torch.float32 if dtype == BF16 else dtype)


# ============================================================================= arena mixers and their steps
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES + BASELINES)
def test_arena_mixer_full_and_step(family, dtype, device, gen):
    """Each arena mixer's full-sequence forward (chunked, FFT or scanned) and its `mixer_step` decode loop
    from `init_decode_state`, on the device, ≡ the fp64 CPU twin's full forward (L = 37: a ragged chunk)."""
    torch.manual_seed(0)
    model = ArenaLM(family, 12, 32, 1, d_state=8, window=5, n_features=16, max_len=40, seed=3)
    dev, ref = twins(model.mixers[0], device, dtype)
    L = 37
    x, xr = split(draw(gen, 2, L, 32), device, dtype)
    with torch.no_grad():
        expected = ref(xr)
        check(dev(x), expected, device, dtype, "full", **module_tol(dtype))
        state, ys = init_decode_state(dev, 2, L, device=device, dtype=dtype), []
        for t in range(L):
            y, state = mixer_step(dev, x[:, t], state)
            ys.append(y)
    check(torch.stack(ys, 1), expected, device, dtype, "steps", **module_tol(dtype))


# ============================================================================= KV caches and the decoder LM
@pytest.mark.parametrize("dtype", DTYPES)
def test_mha_kv_cache_decode_equals_full(dtype, device, gen):
    """`MultiHeadAttention` with GQA and RoPE decoding through a `KVCache` (prefill 7, single tokens, a chunk
    of 3) ≡ the full causal forward of its fp64 twin; with a `CrossKVCache` (no RoPE, as in the encoder-decoder)
    ≡ cross-attention recomputed."""
    torch.manual_seed(0)
    dev, ref = twins(MultiHeadAttention(32, 4, 2, rope=RotaryEmbedding()), device, dtype)
    x, xr = split(draw(gen, 2, 16, 32), device, dtype)
    mem, mem_r = split(draw(gen, 2, 9, 32), device, dtype)
    with torch.no_grad():
        cache = dev.make_cache(2, 16)
        assert cache.k.device.type == device.type and cache.k.dtype == dtype
        pieces = [dev(x[:, :7], causal=True, cache=cache)]
        pieces += [dev(x[:, t:t + 1], causal=True, cache=cache) for t in range(7, 13)]
        pieces.append(dev(x[:, 13:], causal=True, cache=cache))
        check(torch.cat(pieces, 1), ref(xr, causal=True), device, dtype, "self-attention, cached",
              **module_tol(dtype))
        dev, ref = twins(MultiHeadAttention(32, 4, 2), device, dtype)
        cross = CrossKVCache()
        got = torch.cat([dev(x[:, t:t + 1], kv=mem, cache=cross) for t in range(4)], 1)
        check(got, ref(xr[:, :4], kv=mem_r), device, dtype, "cross-attention, cached", **module_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positional", ["rope", "alibi", "t5", "xl", "shaw", "learned"])
def test_lm_cached_decoding_equals_full_forward(positional, dtype, device):
    """`TransformerLM` (GQA) decoding with its KV caches on the device (prefill 5, single tokens, a chunk of 3)
    ≡ the full forward of its fp64 twin, for each positional option; greedy `generate` with the cache gives
    the twin's tokens (fp32: bf16 rounding may legitimately flip a near-tie)."""
    torch.manual_seed(0)
    clip = 20 if positional == "t5" else 6
    model = TransformerLM(20, 32, 2, 4, 2, positional=positional, max_len=24, relative_max_distance=clip)
    with torch.no_grad():                                            # make every positional parameter matter
        for name, p in model.named_parameters():
            if any(key in name for key in ("pos", "rel_k", "rel_v", ".u", ".v")) and "proj" not in name:
                p.normal_()
    dev, ref = twins(model.eval(), device, dtype)
    ids = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(1))
    ids_dev = ids.to(device)
    with torch.no_grad():
        cache = dev.make_cache(2, 12)
        pieces = [dev(ids_dev[:, :5], cache=cache)] + [dev(ids_dev[:, t:t + 1], cache=cache) for t in range(5, 9)]
        pieces.append(dev(ids_dev[:, 9:], cache=cache))
        check(torch.cat(pieces, 1), ref(ids), device, dtype, positional, **module_tol(dtype))
        if dtype == torch.float32:
            tokens = generate(dev, ids_dev[:, :5], 4)
            assert tokens.device.type == device.type
            assert torch.equal(tokens.cpu(), generate(ref, ids[:, :5], 4))


# ============================================================================= no host sync per decoded token
def _decode_steps_without_sync(step, warmup, n_steps):
    """Run ``step`` once (warm-up: first calls may sync), then ``n_steps`` times with CUDA's sync debug mode
    set to "error", so any host synchronisation raises."""
    warmup()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(n_steps):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(ON_CPU, reason="host synchronisation is a CUDA notion (no sync debug mode on the CPU)")
def test_lm_decode_step_has_no_host_sync(device):
    """A decode step of the RoPE LM through its KV cache syncs with the host nowhere."""
    torch.manual_seed(0)
    model = TransformerLM(20, 32, 2, 4, 2, positional="rope", max_len=32).to(device).eval()
    cache = model.make_cache(1, 32)
    tok = torch.zeros(1, 1, dtype=torch.long, device=device)

    def step():
        nonlocal tok
        tok = model(tok, cache=cache)[:, -1].argmax(-1, keepdim=True)

    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long, device=device), cache=cache)           # prefill
        _decode_steps_without_sync(step, step, 4)


@pytest.mark.skipif(ON_CPU, reason="host synchronisation is a CUDA notion (no sync debug mode on the CPU)")
@pytest.mark.parametrize("family", FAMILIES + BASELINES)
def test_arena_mixer_step_has_no_host_sync(family, device):
    """`mixer_step` of each arena family syncs with the host nowhere."""
    torch.manual_seed(0)
    mixer = ArenaLM(family, 12, 32, 2, d_state=8, window=5, n_features=16, max_len=40).mixers[0].to(device)
    box = {"state": init_decode_state(mixer, 1, 16, device=device), "x": torch.randn(1, 32, device=device)}

    def step():
        y, box["state"] = mixer_step(mixer, box["x"], box["state"])
        box["x"] = y

    with torch.no_grad():
        _decode_steps_without_sync(step, step, 4)
