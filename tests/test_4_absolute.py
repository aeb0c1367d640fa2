"""Absolute positions: sinusoids, wavelengths, the shift-is-a-rotation property, learned tables and the
four-term logit expansion (M4.1–M4.5; ERRATA E4.1–E4.3, E4.7)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.positional import (LearnedPositionalEmbedding, absolute_pe_logit_terms, sinusoidal_encoding,
                                 sinusoidal_shift_matrix, sinusoidal_wavelengths)
from xfam_lib.testing import assert_close


def annotated_transformer_pe(length, d):
    """The annotated-transformer / d2l construction (exp-log form of the divisor), in fp64."""
    pe = torch.zeros(length, d, dtype=torch.float64)
    position = torch.arange(length, dtype=torch.float64)[:, None]
    div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


# ----------------------------------------------------------------------------- M4.1
def test_sinusoid_spot_values_M4_1_E4_1():
    pe = sinusoidal_encoding(4, 8)
    assert round(pe[1, 0].item(), 6) == 0.841471          # sin 1 (0-based: dim 0 is a sine)
    assert round(pe[1, 1].item(), 6) == 0.540302          # cos 1
    assert_close(pe[1, 2], torch.tensor(math.sin(1 / 10000 ** (2 / 8)), dtype=torch.float32))
    assert_close(pe[0], torch.tensor([0.0, 1.0] * 4))


@pytest.mark.parametrize("length,d", [(1, 2), (32, 128), (50, 6), (7, 512)])
def test_sinusoid_matches_annotated_transformer_M4_1(length, d):
    pe = sinusoidal_encoding(length, d)
    assert pe.shape == (length, d) and pe.dtype == torch.float32
    assert_close(pe, annotated_transformer_pe(length, d).float())


@pytest.mark.parametrize("args,err", [((4, 7), ValueError), ((0, 8), ValueError), ((4.0, 8), TypeError),
                                      ((4, -2), ValueError)])
def test_sinusoid_bad_inputs_M4_1(args, err):
    with pytest.raises(err, match="length|d_model"):
        sinusoidal_encoding(*args)


# ----------------------------------------------------------------------------- M4.2
def test_wavelengths_closed_form_M4_2_E4_2():
    w = sinusoidal_wavelengths(512)
    assert w.shape == (256,)
    assert_close(w[0], torch.tensor(2 * math.pi, dtype=torch.float64))
    assert_close(w[-1], torch.tensor(2 * math.pi * 10000 ** (510 / 512), dtype=torch.float64))
    assert round(w[-1].item()) == 60611                   # below 20000*pi = 62832 (E4.3)
    assert (w[1:] / w[:-1]).allclose(torch.full((255,), 10000 ** (2 / 512), dtype=torch.float64))


def test_pe_does_not_repeat_at_longest_wavelength_E4_3():
    """Only the slowest pair completes a turn at p = 60611 (d = 512): the library's PE(60611), reached with its
    shift matrix, equals the hand-built formula and is 23.5 away from PE(0), whose norm is 16."""
    d, p = 512, 60611
    assert round(sinusoidal_wavelengths(d)[-1].item()) == p
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    by_hand = torch.zeros(d, dtype=torch.float64)
    by_hand[0::2], by_hand[1::2] = torch.sin(p * theta), torch.cos(p * theta)
    pe0 = sinusoidal_encoding(1, d)[0].double()
    pe_far = sinusoidal_shift_matrix(p, d) @ pe0
    assert_close(pe_far, by_hand, atol=1e-9)                  # angles of ~6e4 rad: fp64 round-off ~1e-11
    assert pe0.norm().item() == pytest.approx(16.0)
    assert (pe0 - pe_far).norm().item() == pytest.approx(23.5, abs=0.05)


def test_gram_matrix_is_toeplitz_M4_2():
    d, length = 64, 40
    pe = sinusoidal_encoding(length, d).double()
    gram = pe @ pe.T
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    delta = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    expected = torch.cos(delta[..., None] * theta).sum(-1)                 # sum_i cos(delta theta_i)
    assert_close(gram, expected, atol=1e-5)


# ----------------------------------------------------------------------------- M4.3
@settings(max_examples=30, deadline=None)
@given(delta=st.integers(-200, 200), half=st.integers(1, 40))
def test_shift_is_a_fixed_rotation_M4_3(delta, half):
    d = 2 * half
    M = sinusoidal_shift_matrix(delta, d)
    pe = annotated_transformer_pe(300, d)
    lo = max(0, -delta)
    p = torch.arange(lo, lo + 50)
    assert_close(pe[p] @ M.T, pe[p + delta])                               # same M for every p
    assert_close(M @ M.T, torch.eye(d, dtype=torch.float64))              # a rotation


def test_shift_dot_product_depends_only_on_delta_M4_3():
    d, delta = 32, 7
    pe = annotated_transformer_pe(200, d)
    dots = (pe[:-delta] * pe[delta:]).sum(-1)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert_close(dots, torch.cos(delta * theta).sum().expand_as(dots))


def test_shift_matrix_composes_M4_3():
    assert_close(sinusoidal_shift_matrix(3, 16) @ sinusoidal_shift_matrix(4, 16), sinusoidal_shift_matrix(7, 16))


# ----------------------------------------------------------------------------- M4.4
def test_learned_table_raises_beyond_max_len_M4_4():
    emb = LearnedPositionalEmbedding(8, 4)
    assert torch.equal(emb(8), emb.weight)
    with pytest.raises(ValueError, match="max_len=8"):
        emb(9)
    with pytest.raises(ValueError, match="max_len=8"):
        emb(torch.tensor([0, 8]))
    with pytest.raises(TypeError, match="integer"):
        emb(torch.tensor([0.0, 1.0]))


def test_learned_table_only_used_rows_get_gradient_M4_4():
    emb = LearnedPositionalEmbedding(10, 3)
    emb(torch.tensor([1, 4, 4])).sum().backward()
    used = emb.weight.grad.abs().sum(-1) > 0
    assert used.tolist() == [i in (1, 4) for i in range(10)]
    assert_close(emb.weight.grad[4], torch.full((3,), 2.0))


# ----------------------------------------------------------------------------- M4.5
def test_four_terms_sum_to_full_logits_M4_5(gen):
    L, d, dk = 12, 16, 8
    x = torch.randn(L, d, dtype=torch.float64, generator=gen)
    p = sinusoidal_encoding(L, d).double()
    W_q, W_k = (torch.randn(d, dk, dtype=torch.float64, generator=gen) for _ in range(2))
    terms = absolute_pe_logit_terms(x, p, W_q, W_k)
    assert list(terms) == ["content-content", "content-position", "position-content", "position-position"]
    full = ((x + p) @ W_q) @ ((x + p) @ W_k).T
    assert_close(sum(terms.values()), full)


def test_position_term_is_not_toeplitz_with_random_weights_E4_7(gen):
    L, d = 30, 16
    p = sinusoidal_encoding(L, d).double()
    gram = p @ p.T
    # p_i . p_j is Toeplitz (the table is fp32: 16 products of rounding ~6e-8 each)
    assert gram[2, 5].item() == pytest.approx(gram[20, 23].item(), abs=1e-6)
    assert gram[2, 5].item() == pytest.approx(5.5431, abs=1e-4)
    W_q, W_k = (torch.randn(d, d, dtype=torch.float64, generator=gen) for _ in range(2))
    pp = absolute_pe_logit_terms(torch.zeros(L, d, dtype=torch.float64), p, W_q, W_k)["position-position"]
    assert abs(pp[2, 5].item() - pp[20, 23].item()) > 1e-2                              # p W_q W_k^T p^T is not
    eye = torch.eye(d, dtype=torch.float64)
    pp_eye = absolute_pe_logit_terms(torch.zeros(L, d, dtype=torch.float64), p, eye, eye)["position-position"]
    assert_close(pp_eye, gram)


def test_four_terms_bad_shapes_M4_5():
    with pytest.raises(ValueError, match="W_q"):
        absolute_pe_logit_terms(torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(6, 2), torch.zeros(6, 2))
