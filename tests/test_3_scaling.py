"""Chapter 3, scaling attention: variance and saturation, Jacobian, log-n scaling, cost models, KV-cache
sizes, GQA/MQA, tiled (FlashAttention-style) attention, log-sum-exp merging (METHODS M3.x).

References are independent: closed forms, loops, ``torch.utils.flop_counter``, ``nbytes`` of real
buffers, and PyTorch's ``scaled_dot_product_attention`` (``enable_gqa``, ``causal_lower_right``).
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right
from torch.utils.flop_counter import FlopCounterMode

from xfam_lib.attention import (
    BlockSizeError,
    KVCache,
    MultiHeadAttention,
    attention_entropy,
    attention_reference,
    causal_mask,
    attention_with_lse,
    logn_scale,
    merge_partials,
    repeat_kv,
    scaled_dot_product_attention,
    softmax_jacobian,
    softmax_safe,
    tiled_attention,
)
from xfam_lib.bench import (
    adaptive_softmax_cost,
    attention_flops,
    attention_io_bytes,
    contiguous_waste,
    conv_flops,
    kv_cache_bytes,
    largest_intermediate,
    paged_waste,
    path_length,
    peak_memory,
    rnn_flops,
    roofline,
    simulate_tensor_parallel,
)
from xfam_lib.positional import RotaryEmbedding
from xfam_lib.testing import assert_close, check_causal, copy_from_torch_mha, grads, mc_variance, randn
from xfam_lib.transformer import TransformerLM

F64 = torch.float64
HYP = settings(max_examples=25, deadline=None, derandomize=True)


def bottom_right_mask(lq, lk):
    """Query i at absolute position lk - lq + i may see keys j <= that position (built by hand)."""
    return torch.tensor([[j <= lk - lq + i for j in range(lk)] for i in range(lq)])


# ----------------------------------------------------------------------------- M3.1–M3.4 variance, saturation, Jacobian
def test_dot_product_variance_grows_as_dk_M3_1(gen):
    """Var(q·k) ≈ d_k for d_k = 4 … 1024 (within 10%), ≈ 1 after 1/√d_k; μ=1, σ²=1, d=10 → d(σ⁴+2σ²μ²) = 30;
    Var(q·k/d^α) = d^(1−2α), flat in d only at α = ½ (M3.4)."""
    for d in (4, 16, 64, 256, 1024):
        assert abs(mc_variance(d, 4000, generator=gen) / d - 1) < 0.1
        assert abs(mc_variance(d, 4000, scale=d ** -0.5, generator=gen) - 1) < 0.1
    assert abs(mc_variance(10, 8000, mean=1.0, generator=gen) / (10 * (1 + 2)) - 1) < 0.1
    assert abs(mc_variance(64, 4000, std=0.5 ** 0.5, generator=gen) / (64 * 0.25) - 1) < 0.1
    for alpha in (0.0, 0.5, 1.0):
        small, large = (mc_variance(d, 4000, scale=d ** -alpha, generator=gen) for d in (16, 256))
        assert abs(math.log(large / small) / math.log(16) - (1 - 2 * alpha)) < 0.1
    with pytest.raises(ValueError, match="d_k"):
        mc_variance(0)


def test_softmax_saturates_without_scaling_M3_2(gen):
    """M3.2: 16 keys: unscaled mean max-probability ≈ 0.42 at d_k=4 and ≈ 0.96 at d_k=1024; scaled ≈ 0.24 at both;
    for logits [0, −Δ, −Δ] the max-probability is 1/(1 + 2e^−Δ), so it reaches 0.99 exactly at Δ = ln 198."""
    def mean_max_prob(d, scale):
        q, k = randn(1000, 1, d, gen=gen, dtype=torch.float32), randn(1000, 16, d, gen=gen, dtype=torch.float32)
        return float(softmax_safe((q @ k.transpose(-2, -1)) * scale).amax(-1).mean())
    assert abs(mean_max_prob(4, 1.0) - 0.42) < 0.03
    assert abs(mean_max_prob(1024, 1.0) - 0.96) < 0.03
    for d in (4, 1024):
        assert abs(mean_max_prob(d, d ** -0.5) - 0.24) < 0.02
    delta = math.log(198)
    p = softmax_safe(torch.tensor([0.0, -delta, -delta], dtype=F64))
    assert_close(p[0], torch.tensor(0.99, dtype=F64))
    assert softmax_safe(torch.tensor([0.0, -delta + 1e-3, -delta + 1e-3], dtype=F64))[0] < 0.99


def test_softmax_jacobian_M3_3(gen):
    """diag(y) − yyᵀ ≡ autograd Jacobian of ``torch.softmax`` (batched); J(one-hot) = 0;
    ‖J‖_F(uniform n) = √(n−1)/n → 0.43301 at n=4."""
    x = randn(3, 5, gen=gen)
    J = softmax_jacobian(torch.softmax(x, -1))
    for b in range(3):
        assert_close(J[b], torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), x[b]))
    assert_close(J.sum(-1), torch.zeros(3, 5, dtype=F64))              # softmax is shift invariant
    assert_close(J, J.transpose(-2, -1))
    assert bool((softmax_jacobian(torch.tensor([0.0, 1.0, 0.0])) == 0).all())
    for n in (2, 4, 9):
        norm = float(torch.linalg.matrix_norm(softmax_jacobian(torch.full((n,), 1.0 / n, dtype=F64))))
        assert abs(norm - math.sqrt(n - 1) / n) < 1e-12
    assert round(float(torch.linalg.matrix_norm(softmax_jacobian(torch.full((4,), 0.25)))), 5) == 0.43301


# ----------------------------------------------------------------------------- M3.5–M3.6 dispersion and log-n scaling
@HYP
@given(n=st.integers(2, 200), a=st.floats(-5, 0), width=st.floats(0, 5), seed=st.integers(0, 2**16))
def test_softmax_dispersion_bound_M3_5(n, a, width, seed):
    """Logits in [a, b] ⇒ every weight ≤ e^b / (e^b + (n−1) e^a), which → 0 as n grows."""
    b = a + width
    x = a + width * torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    bound = math.exp(b) / (math.exp(b) + (n - 1) * math.exp(a))
    assert float(softmax_safe(x).max()) <= bound + 1e-12


def test_dispersion_bound_value_M3_5():
    """The bound e^b / (e^b + (n-1) e^a) for a = -1, b = 1, n = 100 is 0.069453, and softmax attains it."""
    x = torch.tensor([1.0] + [-1.0] * 99, dtype=F64)                    # the bound is attained
    assert abs(float(softmax_safe(x)[0]) - 0.069453) < 1e-6


def test_logn_scale_M3_6(gen):
    """log_m n: 1 at n = m, 4/3 for m = 512, n = 4096; with Gaussian q, k (d 64, m 64) it slows entropy growth
    at n = 4096 without stopping it (E3.3)."""
    assert logn_scale(64, 64) == 1.0
    assert abs(logn_scale(4096, 512) - 12 / 9) < 1e-12
    assert round(logn_scale(4096, 512), 4) == 1.3333
    assert_close(logn_scale(torch.arange(1, 6), 4), torch.log(torch.arange(1, 6, dtype=F64)) / math.log(4))
    q, k = randn(64, 64, gen=gen), randn(4096, 64, gen=gen)
    def entropy(n, factor):
        return float(attention_entropy(softmax_safe(q @ k[:n].T * factor / 8.0)).mean())
    h_train, h_std, h_logn = entropy(64, 1.0), entropy(4096, 1.0), entropy(4096, logn_scale(4096, 64))
    assert h_train < h_logn < h_std < math.log(4096)
    with pytest.raises(ValueError, match="train_len"):
        logn_scale(10, 1)
    with pytest.raises(ValueError, match="n must"):
        logn_scale(torch.tensor([0, 3]), 8)


# ----------------------------------------------------------------------------- M3.7–M3.9 cost models
def test_flop_formulas_match_the_flop_counter_M3_7(gen):
    """attention 4n²d, RNN 4nd², conv 2knd² ≡ ``torch.utils.flop_counter`` on the real ops; crossover at n = d."""
    n, d = 48, 16
    x, W = randn(n, d, gen=gen), randn(d, d, gen=gen)
    with FlopCounterMode(display=False) as counter:
        torch.softmax(x @ x.T, -1) @ x
    assert counter.get_total_flops() == attention_flops(n, d)
    with FlopCounterMode(display=False) as counter:
        h = torch.zeros(1, d, dtype=F64)
        for t in range(n):
            h = torch.tanh(x[t:t + 1] @ W + h @ W)
    assert counter.get_total_flops() == rnn_flops(n, d)
    with FlopCounterMode(display=False) as counter:
        F.conv1d(x.T[None], randn(d, d, 5, gen=gen), padding=2)
    assert counter.get_total_flops() == conv_flops(n, d, 5)
    with FlopCounterMode(display=False) as counter:
        q, k, v = x @ W, x @ W, x @ W
        (torch.softmax(q @ k.T, -1) @ v) @ W
    assert counter.get_total_flops() == attention_flops(n, d, projections=True)
    assert attention_flops(512, 512) == rnn_flops(512, 512)
    assert attention_flops(2048, 512) / rnn_flops(2048, 512) == 4.0
    assert (path_length("attention", 50), path_length("rnn", 50), path_length("conv", 80, 3)) == (1, 50, 40)
    with pytest.raises(ValueError, match="kind"):
        path_length("lstm", 3)
    with pytest.raises(ValueError, match="n must"):
        attention_flops(0, 4)


def test_attention_io_bytes_and_roofline_M3_8():
    """M3.8: the materialised path moves S and P once each way: 4n² elements more than the fused lower bound, ≡ the
    nbytes of real S and P tensors; 4096 tokens in fp16 → 134217728 bytes. Roofline: min(peak, intensity × bandwidth)."""
    for n, dtype in ((256, torch.float32), (4096, torch.float16)):
        s = torch.empty(n, n, dtype=dtype)
        p = torch.empty(n, n, dtype=dtype)
        extra = attention_io_bytes(n, 64, dtype) - attention_io_bytes(n, 64, dtype, materialize=False)
        assert extra == 2 * (s.nbytes + p.nbytes)
        assert attention_io_bytes(n, 64, dtype, materialize=False) == 4 * torch.empty(n, 64, dtype=dtype).nbytes
    fp16_extra = attention_io_bytes(4096, 64, torch.float16) - attention_io_bytes(4096, 64, torch.float16,
                                                                                   materialize=False)
    assert fp16_extra == 134217728                                    # METHODS M3.8's worked answer
    r = roofline(flops=1e9, bytes_moved=1e8, peak_flops=1e12, bandwidth=1e9)
    assert (r.intensity, r.attainable, r.bound) == (10.0, 1e10, "memory")
    assert roofline(1e12, 1e6, 1e12, 1e9).bound == "compute"
    with pytest.raises(TypeError, match="dtype"):
        attention_io_bytes(4, 4, "fp16")


def _flash_algorithm1_elements(n, d, block):
    """Loads and stores of Dao et al.'s Algorithm 1, counted by walking its loops (j over K/V blocks,
    i over query blocks of `d` rows); O, l and m are read back only once an earlier pass wrote them."""
    moved = 0
    for j in range(0, n, block):
        kv_rows = min(block, n - j)
        moved += 2 * kv_rows * d                                  # load K_j, V_j
        for i in range(0, n, d):
            rows = min(d, n - i)
            moved += rows * d                                     # load Q_i
            if j > 0:
                moved += rows * d + 2 * rows                      # load O_i, l_i, m_i
            moved += rows * d + 2 * rows                          # write O_i, l_i, m_i
    return moved


@pytest.mark.parametrize("n, d, sram, dtype", [(100, 8, 4096, torch.float32), (1000, 16, 16384, torch.float16),
                                               (37, 4, 10 ** 6, torch.float32), (513, 32, 6000, torch.float16)])
def test_fused_io_with_on_chip_memory_counts_flash_algorithm1_M3_8(n, d, sram, dtype):
    """With `sram_bytes` the fused count equals a walk over Algorithm 1's loops (blocks of M // (4 d b) keys);
    when one block holds every key it is the 4nd floor plus the row statistics."""
    b = dtype.itemsize
    block = sram // (4 * d * b)
    got = attention_io_bytes(n, d, dtype, materialize=False, sram_bytes=sram)
    assert got == _flash_algorithm1_elements(n, d, block) * b
    if block >= n:
        assert got == attention_io_bytes(n, d, dtype, materialize=False) + 2 * n * b


def test_fused_io_grows_as_n_squared_for_fixed_on_chip_memory_theorem2_M3_8():
    """Dao et al.'s Theorem 2: Theta(n^2 d^2 / M) HBM accesses. For a fixed M, doubling n (well past one
    key block) multiplies the bytes by about 4, so the intensity levels off instead of growing like n;
    bytes * M / (n^2 d^2) stays within constant bounds across M, d and n."""
    d, sram = 64, 192 * 1024
    moved = [attention_io_bytes(n, d, torch.float16, False, sram_bytes=sram) for n in (2 ** 14, 2 ** 15)]
    assert 3.9 < moved[1] / moved[0] < 4.01
    intensity = [attention_flops(n, d) / attention_io_bytes(n, d, torch.float16, False, sram_bytes=sram)
                 for n in (2 ** 12, 2 ** 16, 2 ** 20)]
    block = sram // (4 * d * 2)
    limit = 4 * block * d / (2 * (3 * d + 4))                    # 4 n^2 d FLOPs over 3 n/B_c passes
    assert intensity[0] < intensity[1] < intensity[2] < limit < 1.01 * intensity[2]
    b = 4                                                        # fp32; M in elements is sram_bytes / b
    ratios = [attention_io_bytes(n, dd, torch.float32, False, sram_bytes=m) / b / (n * n * dd * dd / (m / b))
              for n in (2 ** 12, 2 ** 14) for dd in (32, 128) for m in (2 ** 16, 2 ** 18)]
    assert 12.0 <= min(ratios) and max(ratios) < 13.0           # about 12 n^2 d^2 / M elements
    with pytest.raises(ValueError, match="sram_bytes"):
        attention_io_bytes(64, 64, torch.float16, False, sram_bytes=100)       # not one row of Q, K, V, O
    with pytest.raises(ValueError, match="materialize"):
        attention_io_bytes(64, 64, torch.float16, True, sram_bytes=2 ** 16)


def _flash2_forward_bytes(n, d, block_q, b):
    """HBM bytes of FlashAttention-2's forward loop, counted by walking it (i over query blocks of
    `block_q` rows, j over key blocks of 64): Q_i read, every K_j and V_j read, O_i written once,
    and the fp32 log-sum-exp of each row written once."""
    moved = 0
    for i in range(0, n, block_q):
        rows = min(block_q, n - i)
        moved += rows * d * b                                     # load Q_i
        for j in range(0, n, 64):
            moved += 2 * min(64, n - j) * d * b                   # load K_j, V_j
        moved += rows * d * b + rows * 4                          # write O_i and L_i
    return moved


@pytest.mark.parametrize("n, d, block_q, dtype", [(100, 8, 16, torch.float32), (1000, 64, 128, torch.float16),
                                                  (37, 4, 64, torch.float32), (513, 128, 64, torch.bfloat16)])
def test_fused_io_with_query_blocks_counts_flash2_forward_M3_8(n, d, block_q, dtype):
    """With `block_q` the fused count equals a walk over FlashAttention-2's forward loop; one query
    block holding every query moves the 4nd floor plus the log-sum-exp."""
    got = attention_io_bytes(n, d, dtype, materialize=False, block_q=block_q)
    assert got == _flash2_forward_bytes(n, d, block_q, dtype.itemsize)
    assert attention_io_bytes(n, d, dtype, False, block_q=n) == attention_io_bytes(n, d, dtype, False) + 4 * n


def test_flash2_intensity_levels_off_at_twice_the_query_block_M3_8():
    """K and V pass every query block, so for a fixed block the bytes grow as n^2 and the intensity
    4 n^2 d / bytes approaches 2 B_r / b from below, whatever the head width."""
    for d in (64, 128):
        for block_q in (64, 128):
            limit = 2 * block_q / 2                                # fp16: b = 2
            intensity = [attention_flops(n, d) / attention_io_bytes(n, d, torch.float16, False, block_q=block_q)
                         for n in (2 ** 10, 2 ** 14, 2 ** 20)]
            assert intensity[0] < intensity[1] < intensity[2] < limit < 1.01 * intensity[2]
    with pytest.raises(ValueError, match="block_q"):
        attention_io_bytes(64, 64, torch.float16, False, block_q=0)
    with pytest.raises(ValueError, match="not both"):
        attention_io_bytes(64, 64, torch.float16, False, block_q=64, sram_bytes=2 ** 16)
    with pytest.raises(ValueError, match="materialize"):
        attention_io_bytes(64, 64, torch.float16, True, block_q=64)


def test_kv_cache_bytes_equal_real_buffers_M3_9():
    """kv_cache_bytes ≡ Σ nbytes of the KVCache buffers of a GQA TransformerLM; 32 layers × 8 kv heads × 128, bf16:
    131072 B/token; MHA (32 heads) 524288; 8192 tokens of GQA = 1 GiB."""
    model = TransformerLM(vocab=11, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2)
    caches = model.make_cache(batch=2, max_len=10)
    assert kv_cache_bytes(3, 2, 8, 10, 2, torch.float32) == sum(c.k.nbytes + c.v.nbytes for c in caches)
    cache = KVCache(1, 1, 8, 128, dtype=torch.bfloat16)
    per_token = kv_cache_bytes(32, 8, 128, 1, 1, torch.bfloat16)
    assert per_token == 32 * (cache.k.nbytes + cache.v.nbytes) == 131072
    assert kv_cache_bytes(32, 32, 128, 1, 1, torch.bfloat16) == 4 * per_token == 524288
    assert kv_cache_bytes(32, 8, 128, 8192, 1, torch.bfloat16) == 2 ** 30
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache_bytes(32, 8, 128, 0)


# ----------------------------------------------------------------------------- M3.10 GQA / MQA
@pytest.mark.parametrize("n_rep", [1, 2, 3])
def test_repeat_kv_equals_repeat_interleave_M3_10(n_rep, gen):
    x = randn(2, 3, 5, 4, gen=gen)
    out = repeat_kv(x, n_rep)
    assert torch.equal(out, torch.repeat_interleave(x, n_rep, dim=-3))
    for h in range(3 * n_rep):
        assert torch.equal(out[:, h], x[:, h // n_rep])               # query head h uses kv head h // n_rep
    with pytest.raises(ValueError, match="n_rep"):
        repeat_kv(x, 0)
    with pytest.raises(ValueError, match="x"):
        repeat_kv(x[0], 2)


@HYP
@given(shape=st.sampled_from([(8, 8), (8, 4), (8, 2), (8, 1), (6, 3), (3, 1), (1, 1)]), length=st.integers(1, 9),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_gqa_matches_torch_enable_gqa_M3_10(shape, length, causal, seed):
    """MultiHeadAttention(n_heads, n_kv_heads) ≡ its projections + ``F.scaled_dot_product_attention(enable_gqa=True)`` +
    W^O, outputs and input gradients (n_kv = 1 is MQA); with n_kv = n_heads it is MHA ≡ ``nn.MultiheadAttention``."""
    n_heads, n_kv = shape
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d_model, dh = 4 * n_heads, 4
    mha = MultiHeadAttention(d_model, n_heads, n_kv).double()
    x = randn(2, length, d_model, gen=g, requires_grad=True)
    out = mha(x, causal=causal)
    split = lambda t, h: t.view(2, length, h, dh).transpose(1, 2)
    ref = F.scaled_dot_product_attention(split(mha.q_proj(x), n_heads), split(mha.k_proj(x), n_kv),
                                         split(mha.v_proj(x), n_kv), is_causal=causal, enable_gqa=True)
    ref = mha.out_proj(ref.transpose(1, 2).reshape(2, length, d_model))
    assert_close(out, ref)
    cot = randn(2, length, d_model, gen=g)
    assert_close(grads(out, (x,), cot)[0], grads(ref, (x,), cot)[0])
    if n_kv == n_heads:
        torch_mha = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=F64)
        copy_from_torch_mha(mha, torch_mha)
        mask = torch.ones(length, length, dtype=torch.bool).triu(1) if causal else None    # torch: True = ignore
        with torch.no_grad():
            assert_close(mha(x, causal=causal), torch_mha(x, x, x, attn_mask=mask, need_weights=False)[0])


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_gqa_equals_mha_with_copied_kv_weights_M3_10(n_kv_heads, gen):
    """A GQA/MQA layer ≡ an MHA layer whose key/value heads are explicit copies (kv head h // n_rep)."""
    torch.manual_seed(1)
    gqa = MultiHeadAttention(24, 6, n_kv_heads).double()
    mha = MultiHeadAttention(24, 6).double()
    n_rep, dh = 6 // n_kv_heads, 4
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(mha, name)
            dst.weight.copy_(src.weight.view(n_kv_heads, dh, 24).repeat_interleave(n_rep, 0).reshape(24, 24))
            dst.bias.copy_(src.bias.view(n_kv_heads, dh).repeat_interleave(n_rep, 0).reshape(24))
        x = randn(3, 5, 24, gen=gen)
        assert_close(gqa(x), mha(x))


def test_tensor_parallel_simulation_equals_mha_M3_14(gen):
    """Sum of per-rank partial outputs (column-split QKV, row-split W^O) ≡ single-device MHA (GQA, RoPE, causal)."""
    torch.manual_seed(2)
    mha = MultiHeadAttention(32, 8, 4, rope=RotaryEmbedding()).double()
    x = randn(2, 6, 32, gen=gen)
    with torch.no_grad():
        for world in (1, 2, 4):
            out, partials = simulate_tensor_parallel(mha, x, world, causal=True)
            assert len(partials) == world
            assert_close(out, mha(x, causal=True))
        with pytest.raises(ValueError, match="world_size"):
            simulate_tensor_parallel(mha, x, 8)


# ----------------------------------------------------------------------------- M3.11 tiled attention
TILED_CASES = [  # (Lq, Lk, block_q, block_k, causal)
    (16, 16, 4, 4, False), (16, 16, 4, 4, True), (37, 37, 8, 16, True), (37, 37, 64, 64, True),
    (23, 41, 5, 7, True), (23, 41, 5, 7, False), (41, 23, 6, 4, True), (1, 30, 3, 8, True),
    (30, 1, 7, 1, True), (13, 13, 1, 1, True), (20, 33, 128, 3, True),
]


@pytest.mark.parametrize("lq,lk,block_q,block_k,causal", TILED_CASES)
def test_tiled_attention_equals_reference_with_gradients_M3_11(lq, lk, block_q, block_k, causal, gen):
    """Ragged blocks, Lq ≠ Lk, bottom-right causal (Lq > Lk: the first rows see no key → zeros): outputs, lse and
    gradients ≡ the explicit formula with a hand-built mask (fp64). Gradients come from the custom tiled backward."""
    q, k = randn(2, 3, lq, 8, gen=gen, requires_grad=True), randn(2, 3, lk, 8, gen=gen, requires_grad=True)
    v = randn(2, 3, lk, 5, gen=gen, requires_grad=True)
    mask = bottom_right_mask(lq, lk) if causal else None
    out, lse = tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k, return_lse=True)
    ref, ref_lse = attention_with_lse(q, k, v, mask)
    ref2 = scaled_dot_product_attention(q, k, v, mask, return_weights=True)[0]
    assert_close(out, ref)
    assert_close(out, ref2)
    assert_close(lse, ref_lse)
    cot = randn(*out.shape, gen=gen)
    for a, b in zip(grads(out, (q, k, v), cot), grads(ref2, (q, k, v), cot)):
        assert torch.isfinite(a).all()
        assert_close(a, b)
    if causal and lq > lk:
        assert bool((out[..., : lq - lk, :] == 0).all())
        assert bool(torch.isneginf(lse[..., : lq - lk]).all())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(64, 64), (24, 70)])
def test_tiled_attention_matches_torch_sdpa_fp32_M3_11(causal, lq, lk, gen):
    """fp32 vs ``F.scaled_dot_product_attention`` (``causal_lower_right`` for Lq ≠ Lk), outputs and gradients."""
    q, k = randn(2, 4, lq, 16, gen=gen, dtype=torch.float32, requires_grad=True), \
        randn(2, 4, lk, 16, gen=gen, dtype=torch.float32, requires_grad=True)
    v = randn(2, 4, lk, 16, gen=gen, dtype=torch.float32, requires_grad=True)
    out = tiled_attention(q, k, v, causal=causal, block_q=16, block_k=24)
    if not causal:
        ref = F.scaled_dot_product_attention(q, k, v)
    elif lq == lk:
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(lq, lk))
    assert_close(out, ref)
    cot = randn(*out.shape, gen=gen, dtype=torch.float32)
    for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(a, b)


def test_tiled_attention_gradcheck_including_lse_M3_11(gen):
    """Finite differences confirm the hand-written backward, for the output and the returned log-sum-exp."""
    q, k, v = (randn(1, 2, n, 3, gen=gen, requires_grad=True) for n in (5, 7, 7))
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, c: tiled_attention(a, b, c, causal=causal, block_q=2, block_k=3, return_lse=True),
            (q, k, v))


@HYP
@given(lq=st.integers(1, 20), lk=st.integers(1, 20), d=st.integers(1, 6), block_q=st.integers(1, 9),
       block_k=st.integers(1, 9), causal=st.booleans(), lead=st.sampled_from([(), (2,), (1, 2)]),
       scale=st.sampled_from([None, 0.1, 3.0]), seed=st.integers(0, 2**16))
def test_tiled_attention_property_M3_11(lq, lk, d, block_q, block_k, causal, lead, scale, seed):
    """Random shapes, leading dims, blocks and scales: tiled ≡ reference (fp64), gradient of q included."""
    g = torch.Generator().manual_seed(seed)
    q = randn(*lead, lq, d, gen=g, requires_grad=True)
    k, v = randn(*lead, lk, d, gen=g), randn(*lead, lk, d + 1, gen=g)
    out = tiled_attention(q, k, v, causal=causal, scale=scale, block_q=block_q, block_k=block_k)
    ref, _ = attention_with_lse(q, k, v, bottom_right_mask(lq, lk) if causal else None, scale=scale)
    assert_close(out, ref)
    cot = torch.randn(out.shape, generator=g, dtype=F64)
    assert_close(grads(out, (q,), cot)[0], grads(ref, (q,), cot)[0])


def test_tiled_attention_extreme_logits_and_causality_M3_11(gen):
    """Scores of order ±1e3 stay finite (online max shift); perturbing future tokens never moves earlier outputs."""
    q, k, v = randn(1, 40, 8, gen=gen), randn(1, 40, 8, gen=gen), randn(1, 40, 8, gen=gen)
    for sign in (1.0, -1.0):
        out = tiled_attention(sign * q, k, v, scale=300.0, block_q=8, block_k=8)
        assert_close(out, attention_with_lse(sign * q, k, v, scale=300.0)[0])
    x = randn(2, 33, 8, gen=gen)
    assert check_causal(lambda t: tiled_attention(t, t, t, causal=True, block_q=5, block_k=4), x, position=17) == 0.0


@HYP
@given(length=st.integers(2, 24), extra_keys=st.integers(0, 6), block_q=st.integers(1, 8), block_k=st.integers(1, 8),
       seed=st.integers(0, 2**16))
def test_tiled_attention_causality_property_M3_11(length, extra_keys, block_q, block_k, seed):
    """Causal tiled attention (with a cached prefix of ``extra_keys``): changing the keys and values of future
    positions never changes an earlier query's output."""
    g = torch.Generator().manual_seed(seed)
    q = randn(1, length, 4, gen=g)
    k, v = randn(1, length + extra_keys, 4, gen=g), randn(1, length + extra_keys, 3, gen=g)
    cut = int(torch.randint(1, length, (), generator=g))                # queries < cut must not see keys >= cut
    k2, v2 = k.clone(), v.clone()
    k2[:, extra_keys + cut:] += randn(1, length - cut, 4, gen=g)
    v2[:, extra_keys + cut:] += randn(1, length - cut, 3, gen=g)
    run = lambda kk, vv: tiled_attention(q, kk, vv, causal=True, block_q=block_q, block_k=block_k)[:, :cut]
    assert torch.equal(run(k, v), run(k2, v2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_attention_half_precision_M3_11(dtype, gen):
    """Half in → half out and half gradients, within the dtype's tolerance of the fp64 result (accumulated in fp32)."""
    q, k, v = (torch.randn(2, 2, 45, 16, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    out = tiled_attention(q, k, v, causal=True, block_q=16, block_k=16)
    exact_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact = scaled_dot_product_attention(*exact_inputs, causal=True)
    assert out.dtype == dtype
    assert_close(out, exact.to(dtype))
    cot = torch.randn(out.shape, generator=gen)
    for a, b in zip(grads(out, (q, k, v), cot.to(dtype)), grads(exact, exact_inputs, cot.double())):
        assert a.dtype == dtype
        assert_close(a, b.to(dtype))


def test_tiled_attention_never_builds_the_score_matrix_M3_11(gen):
    """Largest tensor any op allocates: block_q × block_k-sized for tiled (forward and backward), ≥ L² for the formula;
    CPU peak memory of the tiled forward is under 1/8 of the naive one."""
    n, d, b = 512, 16, 64
    q, k, v = (randn(1, 1, n, d, gen=gen, dtype=torch.float32, requires_grad=True) for _ in range(3))

    def tiled_train_step():
        out = tiled_attention(q, k, v, causal=True, block_q=b, block_k=b)
        return torch.autograd.grad(out.sum(), (q, k, v))

    largest_tiled = largest_intermediate(tiled_train_step)
    assert largest_tiled <= max(b * b, n * d)
    naive_step = lambda: scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)
    assert largest_intermediate(naive_step) >= n * n
    with torch.no_grad():
        naive = peak_memory(naive_step)
        tiled = peak_memory(lambda: tiled_attention(q, k, v, causal=True, block_q=b, block_k=b))
    assert naive >= 2 * n * n * 4                                      # scores and weights, fp32
    assert tiled * 8 <= naive


def test_tiled_attention_bad_input_M3_11(gen):
    q = randn(1, 4, 8, gen=gen)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="block_q"):
            tiled_attention(q, q, q, block_q=bad)
    for bad in (2.5, "64", True, None):
        with pytest.raises(ValueError, match="block_k"):
            tiled_attention(q, q, q, block_k=bad)
        with pytest.raises(TypeError, match="block_k"):             # BlockSizeError is both
            tiled_attention(q, q, q, block_k=bad)
    assert issubclass(BlockSizeError, ValueError) and issubclass(BlockSizeError, TypeError)
    with pytest.raises(ValueError, match="q and k"):
        tiled_attention(q, randn(1, 4, 7, gen=gen), q)
    with pytest.raises(ValueError, match="scale"):
        tiled_attention(q, q, q, scale=0.0)
    with pytest.raises(TypeError, match="dtypes"):
        tiled_attention(q, q.float(), q)


# ----------------------------------------------------------------------------- M3.12 merging partial attentions
def test_attention_with_lse_M3_12(gen):
    """lse ≡ ``torch.logsumexp`` of the masked scaled scores; out ≡ SDPA; a row with no key gives out 0 and lse −inf."""
    q, k, v = randn(2, 5, 4, gen=gen), randn(2, 6, 4, gen=gen), randn(2, 6, 3, gen=gen)
    mask = torch.rand(2, 5, 6, generator=gen) > 0.4
    mask[0, 1] = False
    out, lse = attention_with_lse(q, k, v, mask, scale=0.3)
    scores = (q @ k.transpose(-2, -1) * 0.3).masked_fill(~mask, float("-inf"))
    assert_close(lse, torch.logsumexp(scores, -1))
    assert lse[0, 1] == float("-inf") and bool((out[0, 1] == 0).all())
    assert_close(out, scaled_dot_product_attention(q, k, v, mask, scale=0.3))
    q.requires_grad_()
    out, lse = attention_with_lse(q, k, v, mask)
    (g_q,) = torch.autograd.grad(out.sum() + lse.masked_fill(torch.isinf(lse), 0.0).sum(), (q,))
    assert torch.isfinite(g_q).all() and bool((g_q[0, 1] == 0).all())
    lse32 = attention_with_lse(q.bfloat16(), k.bfloat16(), v.bfloat16())[1]
    assert lse32.dtype == torch.float32


@pytest.mark.parametrize("causal", [False, True])
def test_merge_key_chunks_equals_full_attention_M3_12(causal, gen):
    """Attention over ragged key chunks merged by log-sum-exp ≡ attention over all keys, outputs and gradients (fp64);
    chunks that a row cannot see (causal) contribute nothing; merges nest; tiled chunks merge the same way."""
    lq, lk = 6, 11
    q, k, v = randn(2, lq, 4, gen=gen, requires_grad=True), randn(2, lk, 4, gen=gen, requires_grad=True), \
        randn(2, lk, 3, gen=gen, requires_grad=True)
    full_mask = bottom_right_mask(lq, lk) if causal else torch.ones(lq, lk, dtype=torch.bool)
    full_mask = full_mask & (torch.rand(2, lq, lk, generator=gen) > 0.2)
    full_mask[..., 0] = True
    bounds = [0, 3, 4, 9, 11]
    parts = [attention_with_lse(q, k[:, a:b], v[:, a:b], full_mask[..., a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    merged, lse = merge_partials([o for o, _ in parts], [l for _, l in parts])
    ref, ref_lse = attention_with_lse(q, k, v, full_mask)
    assert_close(merged, ref)
    assert_close(lse, ref_lse)
    cot = randn(*ref.shape, gen=gen)
    for a, b in zip(grads(merged, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert torch.isfinite(a).all()
        assert_close(a, b)
    left = merge_partials([o for o, _ in parts[:2]], [l for _, l in parts[:2]])
    right = merge_partials([o for o, _ in parts[2:]], [l for _, l in parts[2:]])
    nested, _ = merge_partials([left[0], right[0]], [left[1], right[1]])
    assert_close(nested, ref)
    tiled_parts = [tiled_attention(q, k[:, a:b], v[:, a:b], block_q=4, block_k=2, return_lse=True)
                   for a, b in zip(bounds[:-1], bounds[1:])]
    assert_close(merge_partials(*zip(*tiled_parts))[0], attention_with_lse(q, k, v)[0])


def test_merge_partials_edge_cases_M3_12(gen):
    out, lse = randn(3, 2, gen=gen), randn(3, gen=gen)
    assert_close(merge_partials([out], [lse])[0], out)
    empty = torch.full((3,), float("-inf"), dtype=F64)
    merged, merged_lse = merge_partials([out, torch.zeros(3, 2, dtype=F64)], [lse, empty])
    assert_close(merged, out)
    assert_close(merged_lse, lse)
    none, none_lse = merge_partials([out, out], [empty, empty])
    assert bool((none == 0).all()) and bool(torch.isneginf(none_lse).all())
    with pytest.raises(ValueError, match="equal length"):
        merge_partials([out], [])
    with pytest.raises(ValueError, match="lses"):
        merge_partials([out, out], [lse, lse[:2]])


# ----------------------------------------------------------------------------- M3.13, M3.18 allocation and softmax cost
def test_paged_vs_contiguous_waste_M3_13():
    """Lengths [5, 17, 32, 33]: paged blocks of 16 waste Σ(⌈l/16⌉·16 − l) = 41 slots;
    contiguous L_max = 64 wastes 169."""
    lengths = [5, 17, 32, 33]
    assert paged_waste(lengths, 16) == 41 and contiguous_waste(lengths, 64) == 169
    for block, max_len in ((1, 40), (7, 33), (64, 100)):
        assert paged_waste(lengths, block) == sum(math.ceil(n / block) * block - n for n in lengths)
        assert contiguous_waste(lengths, max_len) == sum(max_len - n for n in lengths)
    assert paged_waste(lengths, 1) == 0
    with pytest.raises(ValueError, match="max_len"):
        contiguous_waste(lengths, 32)
    with pytest.raises(ValueError, match="lengths"):
        paged_waste([3, -1], 4)


def test_adaptive_softmax_cost_M3_18():
    """Zipf(1), V = 10k, one tail from 1000: p_tail = (H_10000 − H_1000)/H_10000 and
    cost (1001 + 9000 p_tail)/10000 → 0.31179; tail width d/4 → 0.15302."""
    harmonic = lambda n: math.fsum(1 / r for r in range(1, n + 1))
    p_tail = (harmonic(10000) - harmonic(1000)) / harmonic(10000)
    assert abs(adaptive_softmax_cost([1000], 1.0, 10000) - (1001 + 9000 * p_tail) / 10000) < 1e-12
    assert round(adaptive_softmax_cost([1000], 1.0, 10000), 5) == 0.31179
    assert round(adaptive_softmax_cost([1000], 1.0, 10000, div_value=4.0), 5) == 0.15302
    with pytest.raises(ValueError, match="cutoffs"):
        adaptive_softmax_cost([2000, 1000], 1.0, 10000)


# ----------------------------------------------------------------------------- measurement tools
def test_peak_memory_tracks_storages_not_tensor_objects():
    """The CPU tracker counts a storage until it is freed (a detached alias keeps it alive) and never counts
    views of tensors that existed before the call."""
    n = 100_000
    def alias_outlives_its_tensor():
        big = torch.ones(n)
        keep = big.detach()
        del big
        return keep, torch.ones(n)
    assert peak_memory(alias_outlives_its_tensor) == 2 * 4 * n
    x = torch.randn(n)
    assert peak_memory(lambda: x[:10].clone()) == 40
    one_at_a_time = peak_memory(lambda: [float(torch.ones(n).sum()) for _ in range(3)])
    assert 4 * n <= one_at_a_time < 2 * 4 * n                                     # each freed before the next


def test_largest_intermediate_ignores_views(gen):
    x = randn(300, gen=gen)
    assert largest_intermediate(lambda: x[:, None].expand(300, 300)) == 0
    numel, shape, op = largest_intermediate(lambda: x[:, None] * x[None, :], detail=True)
    assert (numel, shape) == (90000, (300, 300)) and "mul" in op


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tiled_attention_on_cuda_matches_torch_M3_11(dtype):
    """On a GPU: tiled ≡ PyTorch's SDPA (outputs and gradients) and its allocator peak stays far below L²."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 64, generator=gen).to("cuda", dtype).requires_grad_()
               for _ in range(3))
    out = tiled_attention(q, k, v, causal=True, block_q=64, block_k=48)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == dtype and out.device.type == "cuda"
    assert_close(out, ref)
    cot = torch.randn_like(out)
    for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(a, b)
    with torch.no_grad():
        x = torch.randn(1, 1, 4096, 64, device="cuda")
        tiled = peak_memory(lambda: tiled_attention(x, x, x), "cuda")
        naive = peak_memory(lambda: scaled_dot_product_attention(x, x, x, return_weights=True), "cuda")
    assert tiled * 8 <= naive


@pytest.mark.parametrize("d_k,d_v", [(14, 14), (12, 20), (5, 8)])
def test_zero_padded_head_size_changes_nothing(d_k, d_v, gen):
    """The CUDA path pads head sizes to a multiple of 8 so the fused kernels accept them: padding q, k
    and v with zero columns, with the scale of the unpadded size, gives the same output once the
    extra columns of the result are sliced off (outputs and gradients, fp64, causal and masked)."""
    from xfam_lib.attention import _pad_head_dim
    q, k = (torch.randn(2, 3, 9, d_k, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    v = torch.randn(2, 3, 9, d_v, generator=gen, dtype=torch.float64).requires_grad_()
    mask = torch.rand(2, 1, 9, 9, generator=gen) < 0.7
    for kw in (dict(is_causal=True), dict(attn_mask=mask | torch.eye(9, dtype=torch.bool))):
        ref = F.scaled_dot_product_attention(q, k, v, scale=d_k ** -0.5, **kw)
        padded = F.scaled_dot_product_attention(*(_pad_head_dim(t) for t in (q, k, v)), scale=d_k ** -0.5,
                                                **kw)
        assert padded.shape[-1] % 8 == 0
        out = padded[..., :d_v]
        assert_close(out, ref)
        cot = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
        for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
            assert_close(a, b)


@pytest.mark.gpu
def test_cuda_attention_memory_is_linear_for_any_head_size():
    """On a GPU, head size 14 (the arena's softmax model) gets a fused kernel, not SDPA's math path
    that stores the (L, L) scores: the peak at L = 8192 stays far below the 256 MiB of fp32 scores."""
    gen = torch.Generator().manual_seed(0)
    for d in (14, 16):
        x = torch.randn(1, 1, 8192, d, generator=gen).to("cuda").requires_grad_()
        with torch.no_grad():
            peak = peak_memory(lambda: scaled_dot_product_attention(x, x, x, causal=True), "cuda")
        assert peak < 32 * 2**20, f"head size {d}: {peak / 2**20:.0f} MiB"
        out = scaled_dot_product_attention(x, x, x, causal=True)
        x64 = x.detach().double().cpu()                              # the last 64 queries, against fp64
        ref, _ = attention_reference(x64[..., -64:, :], x64, x64, causal_mask(64, 8192), scale=d ** -0.5)
        assert_close(out[..., -64:, :].detach().cpu().double(), ref, rtol=1e-4, atol=1e-5)
