"""ALiBi (M4.12), ALiBi as a decay mask (M4.13) and DA-Transformer reweighting (M4.14); ERRATA E4.15, E4.16, E4.18."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.attention import causal_mask, scaled_dot_product_attention
from xfam_lib.positional import AlibiBias, alibi_bias, alibi_slopes, da_attention, da_attention_reference, da_weight
from xfam_lib.testing import assert_close


def press_get_slopes(n):
    """The slope rule as written in the ALiBi paper's code, re-typed independently (log2-based)."""
    def power_of_2(m):
        start = 2 ** (-2 ** -(math.log2(m) - 3))
        return [start * start ** i for i in range(m)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_get_slopes(2 * closest)[0::2][: n - closest]


# ----------------------------------------------------------------------------- slopes (M4.12, E4.16)
def test_slopes_for_8_heads_M4_12_E4_16():
    assert alibi_slopes(8).tolist() == [1 / 2 ** h for h in range(1, 9)]


def test_slopes_for_12_heads_follow_the_paper_rule_M4_12():
    # 8 heads' slopes 2^-1..2^-8, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...) for the 4 extra heads
    expected = [2.0 ** -h for h in range(1, 9)] + [2.0 ** -(h - 0.5) for h in range(1, 5)]
    assert_close(alibi_slopes(12, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 7, 12, 16, 20, 24, 48, 96])
def test_slopes_match_the_papers_code_M4_12(n):
    assert_close(alibi_slopes(n, dtype=torch.float64), torch.tensor(press_get_slopes(n), dtype=torch.float64))
    assert alibi_slopes(n).dtype == torch.float32


@pytest.mark.parametrize("n,err", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)])
def test_slopes_bad_heads_M4_12(n, err):
    with pytest.raises(err, match="n_heads"):
        alibi_slopes(n)


# ----------------------------------------------------------------------------- bias (M4.12, E4.15)
@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 12), lq=st.integers(1, 9), extra=st.integers(0, 5))
def test_bias_equals_its_formula_M4_12(h, lq, extra):
    lk = lq + extra
    bias = alibi_bias(h, lq, lk, dtype=torch.float64)
    slopes = press_get_slopes(h)
    assert bias.shape == (h, lq, lk)
    for head in range(h):
        for i in range(lq):
            for j in range(lk):
                assert bias[head, i, j].item() == pytest.approx(-slopes[head] * abs(i + lk - lq - j), rel=1e-12)


def test_bias_under_causal_mask_equals_paper_form_and_row_shift_M4_12(gen):
    """Symmetric -m|i-j|, the paper's -m(i-j), and +m*j (a per-row constant away) give the same attention."""
    H, L, d = 4, 10, 8
    q, k, v = (torch.randn(1, H, L, d, dtype=torch.float64, generator=gen) for _ in range(3))
    m = alibi_slopes(H, dtype=torch.float64)[:, None, None]
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    ours = scaled_dot_product_attention(q, k, v, bias=alibi_bias(H, L, dtype=torch.float64), causal=True)
    paper = scaled_dot_product_attention(q, k, v, bias=-m * (i - j), causal=True)
    plus_mj = scaled_dot_product_attention(q, k, v, bias=m * j.double(), causal=True)
    assert_close(ours, paper)
    assert_close(ours, plus_mj)


def test_newest_key_gets_most_weight_E4_15():
    """With equal content scores the weight grows towards the query (the seeds' printed vector, m * [0, -1, ...,
    -(i-1)] over keys in order, would put the most weight on the oldest key)."""
    L = 10
    w = torch.softmax(alibi_bias(2, L, dtype=torch.float64)[0, -1], -1)                  # head slope 1/16
    assert torch.equal(w.argsort(), torch.arange(L))                                     # strictly increasing to j = i


def test_bottom_right_alignment_matches_the_last_rows_M4_12():
    full = alibi_bias(4, 9)
    assert torch.equal(alibi_bias(4, 3, 9), full[:, -3:])
    # k_len < q_len, as SDPA allows: query i sits at i + k_len - q_len (negative for the first rows)
    i = torch.arange(5)[:, None] - 2
    assert_close(alibi_bias(4, 5, 3, dtype=torch.float64),
                 -alibi_slopes(4, dtype=torch.float64)[:, None, None] * (i - torch.arange(3)).abs())


def test_alibi_module_slices_one_table_while_decoding_M4_12():
    """Prefill then one key more per step: every bias equals `alibi_bias`, and the module keeps one table per
    (device, dtype), a vector over the offsets per head grown by doubling, instead of one per (q_len, k_len)
    or a square (H, n, n) table."""
    mod = AlibiBias(6)
    assert torch.equal(mod(5, 8), alibi_bias(6, 5, 8))
    assert torch.equal(mod(4), alibi_bias(6, 4))
    for k_len in range(9, 70):
        assert torch.equal(mod(1, k_len), alibi_bias(6, 1, k_len))
    assert_close(mod(3, 40, dtype=torch.float64), alibi_bias(6, 3, 40, dtype=torch.float64))
    assert len(mod._tables) == 2                                          # fp32 and fp64, not one per length
    table = mod._tables[("cpu", torch.float32)]
    assert table.shape[0] == 6 and 2 * 69 - 1 <= table.shape[-1] <= 4 * 69   # O(n) offsets, not (n, n)
    assert torch.equal(mod(5, 3), alibi_bias(6, 5, 3))                       # k_len < q_len, as in SDPA


def test_alibi_and_t5_tables_are_linear_in_the_length_M4_12():
    """A prefill of n tokens and one decode step keep O(n) numbers per head: a square (H, n, n) table would
    hold 32 heads x 8192^2 fp32 = 8 GiB after a 4,096-token prefill (it doubles to 8,192)."""
    from xfam_lib.positional import T5RelativeBias
    n, heads = 1024, 32
    alibi, t5 = AlibiBias(heads), T5RelativeBias(heads, bidirectional=False)
    for q_len, k_len in ((n, n), (1, n + 1)):
        alibi(q_len, k_len)
        t5.buckets(q_len, k_len)
    (a_table,), (t_table,) = alibi._tables.values(), t5._tables.values()
    assert a_table.numel() <= heads * 4 * (n + 1) and t_table.numel() <= 4 * (n + 1)
    assert torch.equal(alibi(1, n + 1), alibi_bias(heads, 1, n + 1))


# ----------------------------------------------------------------------------- M4.13
def test_alibi_is_an_exponential_decay_mask_M4_13(gen):
    """Causal attention with the library's ALiBi bias ≡ exp(scores) times the decay γ^(i-j), γ = e^(-m), normalised."""
    H, L, d = 3, 12, 4
    q, k, v = (torch.randn(H, L, d, dtype=torch.float64, generator=gen) for _ in range(3))
    _, alibi = scaled_dot_product_attention(q, k, v, bias=alibi_bias(H, L, dtype=torch.float64), causal=True,
                                            return_weights=True)
    i, j = torch.arange(L, dtype=torch.float64)[:, None], torch.arange(L, dtype=torch.float64)[None, :]
    gamma = torch.exp(-alibi_slopes(H, dtype=torch.float64))[:, None, None]
    decay = torch.exp(q @ k.transpose(-2, -1) / 2.0) * gamma ** (i - j).clamp_min(0) * causal_mask(L)
    assert_close(alibi, decay / decay.sum(-1, keepdim=True))


# ----------------------------------------------------------------------------- DA-Transformer (M4.14, E4.18)
def test_da_weight_properties_M4_14():
    dist = torch.linspace(0, 50, 201, dtype=torch.float64)
    for alpha in (-1.0, -0.1, 0.1, 1.0):
        for beta in (0.0, 2.0):
            f = da_weight(dist, alpha, beta)
            assert f[0].item() == pytest.approx(1.0)
            steps = f.diff()
            assert (steps <= 0).all() if alpha < 0 else (steps >= 0).all()          # monotone
    big = torch.tensor([1e4], dtype=torch.float64)
    assert da_weight(big, -1.0, 2.0).item() == pytest.approx(0.0, abs=1e-300)            # limit 0
    assert da_weight(big, 1.0, 2.0).item() == pytest.approx(1 + math.exp(2.0))           # bounded by 1 + e^beta
    raw = (1 + math.exp(0.7)) / (1 + math.exp(0.7 - (-0.3) * 4.0))
    assert da_weight(torch.tensor(4.0, dtype=torch.float64), -0.3, 0.7).item() == pytest.approx(raw)


@pytest.mark.parametrize("per_head,causal,lq,lk", [(False, False, 6, 6), (True, True, 6, 6), (True, True, 3, 7)])
def test_da_attention_equals_loop_outputs_and_grads_M4_14(per_head, causal, lq, lk, gen):
    H = 3
    q = torch.randn(2, H, lq, 4, dtype=torch.float64, generator=gen).requires_grad_()
    k = torch.randn(2, H, lk, 4, dtype=torch.float64, generator=gen).requires_grad_()
    v = torch.randn(2, H, lk, 5, dtype=torch.float64, generator=gen).requires_grad_()
    alpha = torch.tensor([-1.0, 0.1, 0.5], dtype=torch.float64) if per_head else -0.2
    beta = torch.tensor([0.0, 2.0, 1.0], dtype=torch.float64) if per_head else 1.0
    out, w = da_attention(q, k, v, alpha, beta, causal=causal, return_weights=True)
    ref, w_ref = da_attention_reference(q, k, v, alpha, beta, causal=causal)
    assert_close(out, ref)
    assert_close(w.sum(-1), torch.ones(2, H, lq, dtype=torch.float64))
    g = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    for a, b in zip(torch.autograd.grad((out * g).sum(), (q, k, v)), torch.autograd.grad((ref * g).sum(), (q, k, v))):
        assert_close(a, b)


def test_da_relu_comes_before_the_reweighting_E4_18():
    """A negative logit is clipped to 0 first, so a head that up-weights distance cannot push it further down."""
    q = torch.tensor([[0.0, 1.0]], dtype=torch.float64).repeat(3, 1)
    k = torch.tensor([[0.0, -1.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)        # key 0: negative score
    _, w = da_attention(q, k, k, 1.0, 2.0, scale=1.0, return_weights=True)
    assert_close(w[2], torch.full((3,), 1 / 3, dtype=torch.float64))                      # all scores are 0 after ReLU


def test_da_bad_per_head_shape_M4_14(gen):
    q = torch.randn(1, 2, 4, 3, dtype=torch.float64, generator=gen)
    with pytest.raises(ValueError, match="alpha"):
        da_attention(q, q, q, torch.ones(3), 0.0)
