"""Relative positions: Shaw et al. (M4.6), Transformer-XL scores and the relative shift (M4.7), T5 buckets (M4.8);
ERRATA E4.5, E4.6, E4.19."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from xfam_lib.positional import (ShawRelativeAttention, T5RelativeBias, XLRelativeAttention, rel_shift,
                                 rel_shift_reference, shaw_relative_attention, shaw_relative_attention_reference,
                                 shaw_relative_positions, t5_relative_position_bucket, xl_relative_scores,
                                 xl_relative_scores_reference)
from xfam_lib.testing import assert_close, check_causal, randn


# ----------------------------------------------------------------------------- Shaw (M4.6)
def test_shaw_index_matrix_M4_6():
    idx = shaw_relative_positions(4, 4, 2)
    expected = torch.tensor([[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]])    # clip(j - i, -2, 2) + 2
    assert torch.equal(idx, expected)
    assert torch.equal(shaw_relative_positions(2, 4, 2), expected[2:])                 # bottom-right aligned


def test_shaw_zero_tables_is_vanilla_attention_M4_6_E4_5(gen):
    q, k, v = randn(2, 3, 7, 8, gen=gen), randn(2, 3, 7, 8, gen=gen), randn(2, 3, 7, 5, gen=gen)
    zeros_k, zeros_v = torch.zeros(9, 8, dtype=torch.float64), torch.zeros(9, 5, dtype=torch.float64)
    for causal in (False, True):
        assert_close(shaw_relative_attention(q, k, v, zeros_k, zeros_v, 4, causal=causal),
                     scaled_dot_product_attention(q, k, v, causal=causal))


@pytest.mark.parametrize("lq,lk,K,causal,keys_only", [(6, 6, 2, False, False), (6, 6, 3, True, False),
                                                     (3, 8, 2, True, False), (5, 5, 10, False, True)])
def test_shaw_efficient_equals_explicit_form_outputs_and_grads_M4_6(lq, lk, K, causal, keys_only, gen):
    q, k, v = randn(2, 2, lq, 4, gen=gen, requires_grad=True), randn(2, 2, lk, 4, gen=gen, requires_grad=True), randn(2, 2, lk, 3, gen=gen, requires_grad=True)
    rel_k, rel_v = randn(2 * K + 1, 4, gen=gen, requires_grad=True), (None if keys_only else randn(2 * K + 1, 3, gen=gen, requires_grad=True))
    mask = torch.randn(lq, lk, generator=gen) > 0.3
    out = shaw_relative_attention(q, k, v, rel_k, rel_v, K, mask=mask, causal=causal)
    ref, _ = shaw_relative_attention_reference(q, k, v, rel_k, rel_v, K, mask=mask, causal=causal)
    assert_close(out, ref)
    g = randn(*out.shape, gen=gen)
    inputs = [t for t in (q, k, v, rel_k, rel_v) if t is not None]
    grads = torch.autograd.grad((out * g).sum(), inputs)
    grads_ref = torch.autograd.grad((ref * g).sum(), inputs)
    for a, b in zip(grads, grads_ref):
        assert_close(a, b)


def test_shaw_logits_invariant_to_a_joint_shift_M4_6(gen):
    """Place the same q/k pattern at two offsets inside longer sequences: its logits do not move."""
    K, n = 3, 5
    pattern_q, pattern_k = randn(n, 4, gen=gen), randn(n, 4, gen=gen)
    rel_k, rel_v = randn(2 * K + 1, 4, gen=gen), randn(2 * K + 1, 4, gen=gen)
    logits = []
    for offset in (0, 9):
        q, k = randn(16, 4, gen=gen), randn(16, 4, gen=gen)
        q[offset:offset + n], k[offset:offset + n] = pattern_q, pattern_k
        idx = shaw_relative_positions(16, 16, K)
        full = (q @ k.T + (q[:, None, :] * rel_k[idx]).sum(-1))
        _, w = shaw_relative_attention(q, k, k, rel_k, rel_v, K, return_weights=True)
        assert_close(torch.log(w) - torch.log(w).mean(-1, keepdim=True),
                     full / 2 - (full / 2).mean(-1, keepdim=True))                       # the logits are these
        logits.append(full[offset:offset + n, offset:offset + n])
    assert_close(logits[0], logits[1])


def test_shaw_module_runs_at_unseen_lengths_and_is_causal_M4_6(gen):
    torch.manual_seed(0)
    attn = ShawRelativeAttention(16, 2, max_distance=3).double()
    x = randn(2, 50, 16, gen=gen)                     # distances up to 49 >> K = 3: all clipped to the end rows
    out = attn(x, causal=True)
    assert out.shape == x.shape and torch.isfinite(out).all()
    check_causal(lambda t: attn(t, causal=True), x, atol=1e-12)
    with pytest.raises(TypeError, match="KVCache"):
        attn(x, cache=object())


def test_shaw_module_is_multi_head_attention_with_relative_scores_M4_6(gen):
    """Zero tables: the same weights give MultiHeadAttention's output, cache and kept weights."""
    torch.manual_seed(0)
    shaw = ShawRelativeAttention(16, 4, max_distance=3, n_kv_heads=2).double()
    torch.nn.init.zeros_(shaw.rel_k), torch.nn.init.zeros_(shaw.rel_v)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2, bias=False).double()
    mha.load_state_dict({k: v for k, v in shaw.state_dict().items() if not k.startswith("rel_")})
    x = randn(2, 7, 16, gen=gen)
    shaw.keep_weights = mha.keep_weights = True
    assert_close(shaw(x, causal=True), mha(x, causal=True))
    assert_close(shaw.last_weights, mha.last_weights)
    c_shaw, c_mha = shaw.make_cache(2, 7), mha.make_cache(2, 7)
    for t in range(7):                                   # decoding one token at a time
        assert_close(shaw(x[:, t:t + 1], cache=c_shaw), mha(x[:, t:t + 1], cache=c_mha))


def test_xl_module_keeps_causal_weights_that_make_its_output_M4_7(gen):
    torch.manual_seed(0)
    attn = XLRelativeAttention(16, 4).double()
    attn.keep_weights = True
    x = randn(2, 9, 16, gen=gen)
    out = attn(x)
    w = attn.last_weights                                                  # (B, H, L, L)
    assert_close(w.sum(-1), torch.ones(2, 4, 9, dtype=torch.float64))
    assert (w.triu(1) == 0).all()
    v = attn._split(attn.v_proj(x), attn.n_kv_heads)
    assert_close(out, attn._merge(w @ v))


def test_shaw_bad_tables_M4_6(gen):
    q = randn(1, 4, 8, gen=gen)
    with pytest.raises(ValueError, match="rel_k"):
        shaw_relative_attention(q, q, q, torch.zeros(4, 8, dtype=torch.float64), None, 2)
    with pytest.raises(ValueError, match="max_distance"):
        shaw_relative_positions(3, 3, -1)


# ----------------------------------------------------------------------------- Transformer-XL (M4.7)
@settings(max_examples=30, deadline=None)
@given(lq=st.integers(1, 9), extra=st.integers(0, 6), batch=st.integers(1, 3))
def test_rel_shift_equals_naive_gather_on_the_causal_region_M4_7(lq, extra, batch):
    lk = lq + extra
    x = torch.randn(batch, 2, lq, lk, dtype=torch.float64)
    valid = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    shifted, ref = rel_shift(x), rel_shift_reference(x)
    assert torch.equal(shifted.masked_fill(~valid, 0.0), ref)
    # independently: entry (i, j) is the score for distance i' - j, stored in column Lk - 1 - (i' - j)
    i, j = lq - 1, 0
    assert shifted[0, 0, i, j] == x[0, 0, i, lk - 1 - (i + lk - lq - j)]


def test_rel_shift_needs_lk_at_least_lq():
    with pytest.raises(ValueError, match="Lk >= Lq"):
        rel_shift(torch.zeros(5, 3))


@pytest.mark.parametrize("lq,lk", [(6, 6), (3, 7)])
def test_xl_scores_equal_pairwise_reference_outputs_and_grads_M4_7(lq, lk, gen):
    H, d = 2, 4
    q, k = randn(2, H, lq, d, gen=gen, requires_grad=True), randn(2, H, lk, d, gen=gen, requires_grad=True)
    r = randn(H, lk, d, gen=gen, requires_grad=True)
    u, v = randn(H, d, gen=gen, requires_grad=True), randn(H, d, gen=gen, requires_grad=True)
    s, ref = xl_relative_scores(q, k, r, u, v), xl_relative_scores_reference(q, k, r, u, v)
    assert_close(s, ref)
    g = randn(*s.shape, gen=gen)
    for a, b in zip(torch.autograd.grad((s * g).sum(), (q, k, r, u, v)),
                    torch.autograd.grad((ref * g).sum(), (q, k, r, u, v))):
        assert_close(a, b)
    terms = xl_relative_scores(q, k, r, u, v, terms=True)
    assert list(terms) == ["a: content", "b: content-position", "c: global content", "d: global position"]
    assert_close(sum(terms.values()), s)


def test_xl_without_position_is_content_only_M4_7(gen):
    q, k = randn(5, 4, gen=gen), randn(5, 4, gen=gen)
    zero = torch.zeros(4, dtype=torch.float64)
    s = xl_relative_scores(q, k, torch.zeros(5, 4, dtype=torch.float64), zero, zero)
    assert_close(s, (q @ k.T).tril())


def test_xl_global_position_term_depends_only_on_offset_M4_7_E4_6(gen):
    q, k, r = randn(7, 4, gen=gen), randn(7, 4, gen=gen), randn(7, 4, gen=gen)
    v = randn(4, gen=gen)
    d_term = xl_relative_scores(q, k, r, torch.zeros(4, dtype=torch.float64), v, terms=True)["d: global position"]
    for offset in range(0, 7):
        diag = torch.diagonal(d_term, -offset)                     # i - j = offset
        assert_close(diag, (r[offset] @ v).expand_as(diag))      # v . r_{i-j}


def test_xl_module_is_causal_and_rejects_bidirectional_M4_7(gen):
    torch.manual_seed(0)
    attn = XLRelativeAttention(16, 4).double()
    x = randn(2, 12, 16, gen=gen)
    check_causal(lambda t: attn(t), x, atol=1e-12)
    out, terms = attn(x, return_terms=True)
    assert out.shape == x.shape and terms["a: content"].shape == (2, 4, 12, 12)
    with pytest.raises(ValueError, match="causal"):
        attn(x, causal=False)


# ----------------------------------------------------------------------------- T5 (M4.8)
def t5_bucket_loop(rel, bidirectional=True, num_buckets=32, max_distance=128):
    """The published bucketing, one Python int at a time (float64 logs)."""
    bucket, n = 0, -rel
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


def test_t5_bucket_table_M4_8_E4_19():
    rel = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 50, 100, 200])
    assert t5_relative_position_bucket(rel).tolist() == [0, 17, 18, 19, 20, 21, 22, 23, 24, 24, 24, 26, 29, 31, 31]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 32), (8, 20), (32, 48), (64, 256)])
def test_t5_buckets_equal_a_loop_over_the_formula_M4_8(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-400, 401)
    got = t5_relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                      max_distance=max_distance)
    expected = [t5_bucket_loop(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    assert got.tolist() == expected
    assert got.min() >= 0 and got.max() == num_buckets - 1


def test_t5_unidirectional_sends_future_keys_to_bucket_zero_M4_8():
    b = t5_relative_position_bucket(torch.arange(-5, 6), bidirectional=False)
    assert b.tolist() == [5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0]


def test_t5_module_bias_values_cache_and_gradient_M4_8():
    mod = T5RelativeBias(3, num_buckets=8, max_distance=16, bidirectional=False)
    with torch.no_grad():
        mod.bias.weight.copy_(torch.arange(24.0).view(8, 3))
    bias = mod(4, 6)
    assert bias.shape == (3, 4, 6)
    for h in range(3):
        for i in range(4):
            for j in range(6):
                rel = j - (i + 2)
                assert bias[h, i, j] == mod.bias.weight[t5_bucket_loop(rel, False, 8, 16), h]
    mod(3).sum().backward()                                               # distances 0..2 only
    assert (mod.bias.weight.grad.abs().sum(-1) > 0).tolist() == [True, True, True] + [False] * 5


def test_t5_module_slices_one_bucket_table_while_decoding_M4_8():
    """Prefill then one key more per step: bucket ids equal the bucket function of j - i', and the module keeps
    one table (grown by doubling), not one per (q_len, k_len)."""
    from xfam_lib.positional import relative_positions

    mod = T5RelativeBias(2, num_buckets=8, max_distance=16, bidirectional=False)
    for q_len, k_len in [(5, 5)] + [(1, n) for n in range(6, 60)] + [(3, 40)]:
        expected = t5_relative_position_bucket(relative_positions(q_len, k_len), bidirectional=False,
                                               num_buckets=8, max_distance=16)
        assert torch.equal(mod.buckets(q_len, k_len), expected)
    assert list(mod._tables) == ["cpu"] and 2 * 59 - 1 <= mod._tables["cpu"].shape[0] <= 4 * 59   # O(n) offsets
    expected = t5_relative_position_bucket(relative_positions(5, 3), bidirectional=False, num_buckets=8,
                                           max_distance=16)
    assert torch.equal(mod.buckets(5, 3), expected)                                  # k_len < q_len, as in SDPA


@pytest.mark.parametrize("call,err,match", [
    (lambda: t5_relative_position_bucket(torch.tensor([1.0])), TypeError, "integer"),
    (lambda: t5_relative_position_bucket(torch.tensor([1]), num_buckets=0), ValueError, "num_buckets"),
    (lambda: t5_relative_position_bucket(torch.tensor([1]), num_buckets=32, max_distance=8), ValueError, "max_distance"),
    (lambda: T5RelativeBias(0), ValueError, "n_heads"),
    (lambda: T5RelativeBias(2)(5, 0), ValueError, "k_len"),
])
def test_t5_bad_inputs_M4_8(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_xl_relative_scores_accumulate_half_inputs_in_fp32_M4_13(gen):
    """bf16 inputs: the two products are added in fp32 and rounded once, so the scores are the fp64
    scores of the same (rounded) inputs to within one bf16 rounding, not two."""
    q, k, r = (torch.randn(2, 6, 9, 16, generator=gen).bfloat16() for _ in range(3))
    u, v = (torch.randn(2, 1, 16, generator=gen).bfloat16() for _ in range(2))
    got = xl_relative_scores(q, k[..., :9, :], r[..., :9, :], u, v)
    want = xl_relative_scores_reference(*(t.double() for t in (q, k[..., :9, :], r[..., :9, :], u, v)))
    assert got.dtype == torch.bfloat16
    assert_close(got.double(), want, rtol=2 ** -8, atol=1e-6)
