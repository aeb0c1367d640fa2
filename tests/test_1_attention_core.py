"""Scaled dot-product attention, masks and multi-head attention (M1.3, M1.11–M1.15, M2.2, M2.7)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from xfam_lib.attention import (CrossKVCache, MultiHeadAttention, causal_mask, document_mask, padding_mask,
                                scaled_dot_product_attention, tiled_attention)
from xfam_lib.testing import assert_close, check_causal, copy_from_torch_mha


def rand(*shape, dtype=torch.float64, gen=None):
    return torch.randn(*shape, dtype=dtype, generator=gen)


# ----------------------------------------------------------------------------- masks (M1.3, M1.12, M1.13, M1.15)
def test_causal_mask_square_is_lower_triangle_M1_12():
    assert torch.equal(causal_mask(7), torch.ones(7, 7, dtype=torch.bool).tril())


def test_causal_mask_allowed_pairs_closed_form_M1_3():
    for n in range(1, 9):
        assert int(causal_mask(n).sum()) == n * (n + 1) // 2          # 21 at n = 6
    assert int(causal_mask(6).sum()) == 21


@pytest.mark.parametrize("lq,lk", [(1, 5), (3, 7), (4, 4), (2, 9), (5, 3), (7, 1)])
def test_causal_mask_bottom_right_matches_torch_M1_12(lq, lk):
    expected = causal_lower_right(lq, lk)._materialize()
    assert torch.equal(causal_mask(lq, lk), expected)


def test_causal_mask_with_cache_offset_matches_llama_construction_M1_12():
    # Llama builds the mask of new tokens at start_pos as hstack(zeros(L, start_pos), triu(-inf, 1)).
    start_pos, seqlen = 5, 3
    llama = torch.hstack([torch.zeros(seqlen, start_pos), torch.full((seqlen, seqlen), float("-inf")).triu(1)])
    assert torch.equal(causal_mask(seqlen, start_pos + seqlen), llama == 0)


def test_causal_mask_window():
    m = causal_mask(6, window=2)
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(m, (i - j >= 0) & (i - j <= 2))


def test_padding_mask_broadcasts_and_combines_M1_13():
    pad = padding_mask([3, 5], 5)
    assert pad.shape == (2, 1, 1, 5)
    tgt = pad & causal_mask(5)
    # Harvard-style construction: (tgt != pad).unsqueeze(-2) & subsequent_mask
    ids = torch.tensor([[4, 5, 6, 0, 0], [4, 5, 6, 7, 8]])
    harvard = (ids != 0).unsqueeze(-2) & (torch.triu(torch.ones(1, 5, 5), diagonal=1) == 0)
    assert torch.equal(tgt[:, 0], harvard)


def test_document_mask_M1_15():
    m = document_mask([3, 2, 4])
    assert int(m.sum()) == 19                                  # 6 + 3 + 10 causal pairs
    docs = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    cross_doc = docs[:, None] != docs[None, :]
    assert not (m & cross_doc).any()
    assert int(document_mask([3, 2, 4], causal=False).sum()) == 9 + 4 + 16


@pytest.mark.parametrize("bad", [dict(q_len=0), dict(q_len=3, k_len=0), dict(q_len=3, window=-1)])
def test_causal_mask_bad_input(bad):
    with pytest.raises((ValueError, TypeError)):
        causal_mask(**bad)


def test_padding_and_document_mask_bad_input():
    with pytest.raises(ValueError, match="max_len"):
        padding_mask([3, 6], 5)
    with pytest.raises(ValueError, match="doc_lengths"):
        document_mask([3, 0])


# ----------------------------------------------------------------------------- SDPA (M2.2, M1.14)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_mask", [False, True])
def test_sdpa_matches_torch_M2_2(causal, use_mask, gen):
    q, k, v = rand(2, 3, 6, 8, gen=gen), rand(2, 3, 6, 8, gen=gen), rand(2, 3, 6, 5, gen=gen)
    mask = torch.rand(2, 1, 6, 6, generator=gen) > 0.3 if use_mask else None
    mask_t = mask
    if use_mask:
        mask = mask | torch.eye(6, dtype=torch.bool)          # keep every row non-empty for torch
        mask_t = mask & causal_mask(6) if causal else mask
    ours = scaled_dot_product_attention(q, k, v, mask, causal=causal)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_t, is_causal=causal and not use_mask)
    assert_close(ours, ref)
    out_w, weights = scaled_dot_product_attention(q, k, v, mask, causal=causal, return_weights=True)
    assert_close(out_w, ref)
    assert_close(weights.sum(-1), torch.ones(2, 3, 6, dtype=torch.float64))


def test_sdpa_bottom_right_causal_for_kv_cache(gen):
    q, k, v = rand(1, 2, 3, 4, gen=gen), rand(1, 2, 7, 4, gen=gen), rand(1, 2, 7, 4, gen=gen)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 7)._materialize())
    assert_close(scaled_dot_product_attention(q, k, v, causal=True), ref)
    assert_close(scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)[0], ref)


def test_sdpa_is_the_formula(gen):
    q, k, v = rand(4, 3, gen=gen), rand(5, 3, gen=gen), rand(5, 2, gen=gen)
    weights = torch.softmax(q @ k.T / math.sqrt(3), dim=-1)
    assert_close(scaled_dot_product_attention(q, k, v), weights @ v)
    out, w = scaled_dot_product_attention(q, k, v, scale=0.7, return_weights=True)
    assert_close(w, torch.softmax(q @ k.T * 0.7, dim=-1))


def test_sdpa_bias_and_mask(gen):
    q, k, v = rand(2, 5, 4, gen=gen), rand(2, 6, 4, gen=gen), rand(2, 6, 4, gen=gen)
    bias = rand(5, 6, gen=gen)
    mask = torch.rand(2, 5, 6, generator=gen) > 0.2
    mask[:, :, 0] = True
    logits = (q @ k.transpose(-1, -2)) / 2 + bias
    expected = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v
    assert_close(scaled_dot_product_attention(q, k, v, mask, bias=bias), expected)
    assert_close(scaled_dot_product_attention(q, k, v, mask, bias=bias, return_weights=True)[0], expected)


@pytest.mark.parametrize("return_weights", [False, True])
def test_fully_masked_row_gives_zeros_and_finite_grads_M1_14(return_weights, gen):
    q, k, v = (rand(1, 2, 4, 8, gen=gen).requires_grad_() for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    res = scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = res[0] if return_weights else res
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert torch.isfinite(out).all()
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))
    # naive -inf masking gives NaN on that row: the hazard the library avoids
    naive = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf")), -1)
    assert torch.isnan(naive[:, :, 2]).all()


def test_minus_1e9_vs_minus_inf_numerics_M1_14():
    assert torch.exp(torch.tensor(-1e9, dtype=torch.float32)) == 0
    with pytest.raises(RuntimeError):
        torch.zeros(2, dtype=torch.float16).masked_fill_(torch.tensor([True, False]), -1e9)


@pytest.mark.parametrize("fused", [True, False])
def test_sdpa_gradients_match_torch(fused, gen):
    q, k, v = (rand(2, 2, 5, 4, gen=gen).requires_grad_() for _ in range(3))
    if fused:
        out = scaled_dot_product_attention(q, k, v, causal=True)
    else:
        out = scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)[0]
    g_ours = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(g_ours, g_ref):
        assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_half_precision_returns_input_dtype(dtype, gen):
    q, k, v = (rand(1, 2, 16, 8, gen=gen, dtype=torch.float32) for _ in range(3))
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    for return_weights in (False, True):
        res = scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), return_weights=return_weights)
        out = res[0] if return_weights else res
        assert out.dtype == dtype
        # inputs rounded to the half type (rel. error eps/2 each) and the output rounded once:
        assert_close(out, exact.to(dtype))


@pytest.mark.parametrize("lq,lk", [(5, 3), (4, 1), (7, 7)])
def test_sdpa_causal_with_more_queries_than_keys_agrees_with_tiled(lq, lk, gen):
    """API: bottom-right alignment puts query i at Lk - Lq + i, so with Lq > Lk the first Lq - Lk rows see no key
    and return zeros; both SDPA paths and tiled attention agree, gradients included."""
    q = rand(2, lq, 4, gen=gen).requires_grad_()
    k, v = rand(2, lk, 4, gen=gen).requires_grad_(), rand(2, lk, 3, gen=gen).requires_grad_()
    tiled = tiled_attention(q, k, v, causal=True, block_q=2, block_k=2)
    fused = scaled_dot_product_attention(q, k, v, causal=True)
    formula, w = scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)
    empty = max(lq - lk, 0)
    assert torch.equal(fused[:, :empty], torch.zeros(2, empty, 3, dtype=torch.float64))
    assert torch.equal(w[:, :empty], torch.zeros(2, empty, lk, dtype=torch.float64))
    # the rows that do see keys: row i sees keys j <= i - (Lq - Lk), checked against torch's causal_lower_right
    ref = F.scaled_dot_product_attention(q[:, empty:], k, v, attn_mask=causal_lower_right(lq - empty, lk)._materialize())
    assert_close(fused[:, empty:], ref)
    cot = rand(2, lq, 3, gen=gen)
    g_tiled = torch.autograd.grad((tiled * cot).sum(), (q, k, v))
    for out in (fused, formula):
        assert_close(out, tiled)
        for a, b in zip(torch.autograd.grad((out * cot).sum(), (q, k, v)), g_tiled):
            assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_half_precision_bias_is_not_rounded_on_either_path(dtype, gen):
    """An fp32 bias with fine detail on a large offset (ALiBi-like: -m|i-j| grows with distance) is used as given
    by both paths: they agree with the fp64 formula on the half-rounded inputs within the half tolerance, while
    rounding the bias to the half type first moves the output far more than that."""
    q, k, v = (rand(2, 3, 6, 8, gen=gen, dtype=torch.float32).to(dtype) for _ in range(3))
    bias = 200.0 + torch.rand(3, 6, 6, generator=gen) * 3.0               # half spacing near 200: 1 (bf16), 0.125 (fp16)
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(), bias=bias.double())
    rounded = scaled_dot_product_attention(q.double(), k.double(), v.double(), bias=bias.to(dtype).double())
    with pytest.raises(AssertionError):
        assert_close(rounded.to(dtype), exact)
    fused = scaled_dot_product_attention(q, k, v, bias=bias)
    formula = scaled_dot_product_attention(q, k, v, bias=bias, return_weights=True)[0]
    for out in (fused, formula):
        assert out.dtype == dtype
        assert_close(out, exact)


@given(lq=st.integers(1, 6), extra=st.integers(0, 5), d=st.integers(1, 6), seed=st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_sdpa_causality_property(lq, extra, d, seed):
    """Perturbing keys/values at positions after a query's position never changes that query's output."""
    g = torch.Generator().manual_seed(seed)
    lk = lq + extra
    q, k, v = rand(lq, d, gen=g), rand(lk, d, gen=g), rand(lk, d, gen=g)
    out = scaled_dot_product_attention(q, k, v, causal=True)
    i = torch.randint(0, lq, (1,), generator=g).item()
    pos = i + extra                                  # absolute position of query i
    k2, v2 = k.clone(), v.clone()
    k2[pos + 1:] = rand(lk - pos - 1, d, gen=g)
    v2[pos + 1:] = rand(lk - pos - 1, d, gen=g)
    out2 = scaled_dot_product_attention(q, k2, v2, causal=True)
    assert_close(out2[: i + 1], out[: i + 1])


@pytest.mark.parametrize("args,kwargs,match", [
    ((rand(3), rand(3, 2), rand(3, 2)), {}, "q must have at least 2 dims"),
    ((rand(2, 3), rand(4, 5), rand(4, 5)), {}, "d_k"),
    ((rand(2, 3), rand(4, 3), rand(5, 3)), {}, "key length"),
    ((rand(2, 2, 3), rand(3, 4, 3), rand(3, 4, 3)), {}, "leading dims"),
    ((rand(2, 3), rand(4, 3), rand(4, 3)), {"mask": torch.ones(2, 4)}, "boolean"),
    ((rand(2, 3), rand(4, 3), rand(4, 3)), {"mask": torch.ones(3, 4, dtype=torch.bool)}, "broadcast"),
    ((rand(2, 3), rand(4, 3), rand(4, 3)), {"scale": -1.0}, "scale"),
    ((rand(2, 3), rand(4, 3).float(), rand(4, 3)), {}, "dtypes"),
    # a mask or bias may broadcast against the scores (2, 4) but never enlarge the output
    ((rand(2, 3), rand(4, 3), rand(4, 3)), {"mask": torch.ones(3, 2, 4, dtype=torch.bool)}, r"mask of shape \(3, 2, 4\)"),
    ((rand(1, 2, 3), rand(1, 4, 3), rand(1, 4, 3)), {"mask": torch.ones(5, 1, 4, dtype=torch.bool)}, "enlarging"),
    ((rand(2, 3), rand(4, 3), rand(4, 3)), {"bias": rand(2, 2, 4)}, r"bias of shape \(2, 2, 4\)"),
    ((rand(2, 3), rand(4, 3), rand(4, 3)), {"bias": rand(3, 4)}, "bias"),
])
def test_sdpa_bad_input_names_the_argument(args, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        scaled_dot_product_attention(*args, **kwargs)


# ----------------------------------------------------------------------------- multi-head attention (M2.7, M1.11)
def _mha_pair(d=16, h=4):
    torch.manual_seed(0)
    ours = MultiHeadAttention(d, h).double()
    theirs = nn.MultiheadAttention(d, h, batch_first=True).double()
    copy_from_torch_mha(ours, theirs)
    return ours, theirs


def test_mha_matches_torch_self_attention_with_padding_M2_7(gen):
    ours, theirs = _mha_pair()
    x = rand(2, 7, 16, gen=gen)
    lengths = torch.tensor([7, 4])
    ours_out = ours(x, mask=padding_mask(lengths, 7))
    # nn.MultiheadAttention's key_padding_mask means True = ignore: the opposite convention.
    ref, _ = theirs(x, x, x, key_padding_mask=~padding_mask(lengths, 7)[:, 0, 0], need_weights=False)
    assert_close(ours_out, ref)


def test_mha_matches_torch_causal_and_weights(gen):
    ours, theirs = _mha_pair()
    x = rand(2, 6, 16, gen=gen)
    ours_out, w = ours(x, causal=True, return_weights=True)
    ref, ref_w = theirs(x, x, x, attn_mask=~causal_mask(6), need_weights=True, average_attn_weights=False)
    assert_close(ours_out, ref)
    assert_close(w, ref_w)


def test_cross_kv_cache_projects_again_for_a_different_memory_M1_11(gen):
    """A CrossKVCache reuses the projected memory while it is fed the same tensor, and notices a different memory
    (or the same one changed in place): the result always equals attention without a cache."""
    mha = MultiHeadAttention(16, 4).double()
    dec, enc_a, enc_b = rand(2, 3, 16, gen=gen), rand(2, 9, 16, gen=gen), rand(2, 7, 16, gen=gen)
    cache = CrossKVCache()
    with torch.no_grad():
        assert_close(mha(dec, kv=enc_a, cache=cache), mha(dec, kv=enc_a))
        k_a = cache.k
        assert_close(mha(dec[:, :1], kv=enc_a, cache=cache), mha(dec[:, :1], kv=enc_a))
        assert cache.k is k_a                                                # same memory: not projected again
        assert_close(mha(dec, kv=enc_b, cache=cache), mha(dec, kv=enc_b))  # a different memory
        enc_b.mul_(2.0)                                                      # the same tensor, changed in place
        assert_close(mha(dec, kv=enc_b, cache=cache), mha(dec, kv=enc_b))
    with pytest.raises(ValueError, match="CrossKVCache needs kv="):
        mha(dec, cache=cache)


def test_cross_attention_matches_torch_M1_11(gen):
    ours, theirs = _mha_pair()
    dec, enc = rand(2, 5, 16, gen=gen), rand(2, 9, 16, gen=gen)
    out, w = ours(dec, kv=enc, return_weights=True)
    assert w.shape == (2, 4, 5, 9)
    assert_close(w.sum(-1), torch.ones(2, 4, 5, dtype=torch.float64))
    assert_close(out, theirs(dec, enc, enc, need_weights=False)[0])


def test_mha_is_causal_when_asked(gen):
    mha = MultiHeadAttention(8, 2).double()
    assert check_causal(lambda x: mha(x, causal=True), rand(1, 6, 8, gen=gen)) == 0.0
    with pytest.raises(AssertionError, match="not causal"):
        check_causal(lambda x: mha(x), rand(1, 6, 8, gen=gen))


def test_mha_gqa_shapes_and_bad_config():
    mha = MultiHeadAttention(32, 8, 2)
    assert mha.k_proj.weight.shape == (2 * 4, 32)
    assert mha(torch.randn(2, 5, 32)).shape == (2, 5, 32)
    with pytest.raises(ValueError, match="n_kv_heads"):
        MultiHeadAttention(32, 8, 3)
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(30, 8)
    with pytest.raises(ValueError, match="d_model"):
        mha(torch.randn(2, 5, 16))


def test_mha_keep_weights_stores_last_weights(gen):
    mha = MultiHeadAttention(8, 2).double()
    mha.keep_weights = True
    x = rand(1, 4, 8, gen=gen)
    out = mha(x, causal=True)
    assert mha.last_weights.shape == (1, 2, 4, 4)
    assert torch.equal(mha.last_weights.triu(1), torch.zeros(1, 2, 4, 4, dtype=torch.float64))
    mha.keep_weights = False
    assert_close(mha(x, causal=True), out)
