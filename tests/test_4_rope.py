"""RoPE (M4.9) and its frequency coverage (M4.10); ERRATA E4.8–E4.14."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.attention import MultiHeadAttention
from xfam_lib.positional import (LearnedPositionalEmbedding, RotaryEmbedding, apply_rope, apply_rope_reference,
                                 rope_matrix, rope_permutation, rope_turns, to_half_split, to_interleaved)
from xfam_lib.testing import assert_close, randn


def rope_complex(x, positions, base=10000.0):
    """Independent reference: adjacent pairs as complex numbers, multiplied by exp(i p theta) (torch.polar)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * theta
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = z * torch.polar(torch.ones_like(angle), angle)
    return torch.view_as_real(rotated).reshape(x.shape)


# ----------------------------------------------------------------------------- the relative property
@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 300), n=st.integers(0, 300), shift=st.integers(0, 500), interleaved=st.booleans(),
       half=st.integers(1, 16))
def test_score_depends_only_on_offset_M4_9(m, n, shift, interleaved, half):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    q, k = randn(1, 2 * half, gen=gen), randn(1, 2 * half, gen=gen)

    def score(a, b):
        qa = apply_rope(q, torch.tensor([a]), interleaved=interleaved)
        kb = apply_rope(k, torch.tensor([b]), interleaved=interleaved)
        return (qa * kb).sum()

    # fp32 angles: positions up to 800 carry an absolute angle error of ~800 * 6e-8 (see the docstring)
    assert score(m + shift, n + shift).item() == pytest.approx(score(m, n).item(), abs=2e-4 * 2 * half)


def test_score_matrix_is_constant_along_diagonals_M4_9(gen):
    d, L = 16, 24
    q, k = randn(1, d, gen=gen).expand(L, d), randn(1, d, gen=gen).expand(L, d)      # same content everywhere
    s = apply_rope(q) @ apply_rope(k).T
    for offset in range(-L + 1, L):
        diag = torch.diagonal(s, offset)
        assert_close(diag, diag[:1].expand_as(diag), atol=1e-5)     # fp32 angles: ~L * 6e-8 per pair


def test_shift_by_100_leaves_scores_unchanged_seed_check_M4_9(gen):
    q, k = randn(1, 8, gen=gen), randn(1, 8, gen=gen)

    def score(a, b):
        return (apply_rope(q, torch.tensor([a])) * apply_rope(k, torch.tensor([b]))).sum().item()

    assert score(112, 105) == pytest.approx(score(12, 5), abs=1e-5)     # fp32 angles at position ~100


# ----------------------------------------------------------------------------- norms, layouts, references
@pytest.mark.parametrize("interleaved", [False, True])
def test_norm_is_preserved_M4_9(interleaved, gen):
    x = randn(2, 3, 40, 32, gen=gen)
    y = apply_rope(x, interleaved=interleaved)
    # the rotation is exact for its cos/sin, which come from fp32 tables (API: angles in fp32): cos^2 + sin^2 = 1
    # only to about one fp32 rounding, so the norm is kept to a relative 2 eps(fp32), not to fp64 precision
    assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=0.0, rtol=2 * torch.finfo(torch.float32).eps)
    assert not torch.allclose(y[..., 1:, :], x[..., 1:, :])                 # it does rotate


def test_interleaved_equals_half_split_after_permutation_M4_9_E4_12(gen):
    x = randn(2, 5, 16, gen=gen)
    inter = apply_rope(x, interleaved=True)
    half = apply_rope(to_half_split(x), interleaved=False)
    assert_close(half, to_half_split(inter))
    assert_close(to_interleaved(half), inter)
    assert torch.equal(rope_permutation(8), torch.tensor([0, 2, 4, 6, 1, 3, 5, 7]))
    assert torch.equal(to_interleaved(to_half_split(torch.arange(10.0))), torch.arange(10.0))
    # scores do not care which layout was used, as long as q and k share it
    q, k = randn(6, 16, gen=gen), randn(6, 16, gen=gen)
    s_inter = apply_rope(q, interleaved=True) @ apply_rope(k, interleaved=True).T
    s_half = apply_rope(to_half_split(q)) @ apply_rope(to_half_split(k)).T
    assert_close(s_half, s_inter)


@pytest.mark.parametrize("interleaved", [True, False])
def test_matches_explicit_rotation_matrix_M4_9(interleaved, gen):
    d, positions = 12, torch.tensor([0, 1, 5, 17, 40])
    x = randn(len(positions), d, gen=gen)
    got = apply_rope(x, positions, interleaved=interleaved)
    expected = torch.stack([x[r] @ rope_matrix(int(p), d, interleaved=interleaved).T for r, p in enumerate(positions)])
    assert_close(got, expected, atol=1e-5)          # tables hold fp32 angles; the matrix uses fp64 angles


def test_matches_complex_form_M4_9(gen):
    x, positions = randn(3, 7, 10, gen=gen), torch.tensor([3, 0, 9, 2, 50, 6, 1])
    assert_close(apply_rope(x, positions, interleaved=True), rope_complex(x, positions), atol=1e-5)
    assert_close(rope_matrix(5, 10) @ x[0, 0], rope_complex(x[:1, :1], torch.tensor([5]))[0, 0])


def test_rope_matrix_blocks_and_composition_M4_9_E4_10_E4_11():
    d, theta = 8, 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    R = rope_matrix(3, d)
    for i in range(d // 2):                                 # block i uses theta_i (E4.10), R(a) = [[c, -s], [s, c]]
        a = 3 * theta[i]
        expected = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
        assert_close(R[2 * i:2 * i + 2, 2 * i:2 * i + 2], expected)
    for m, n in [(2, 9), (9, 2), (0, 4)]:
        assert_close(rope_matrix(m, d).T @ rope_matrix(n, d), rope_matrix(n - m, d))      # R_m^T R_n = R_{n-m}
    assert_close(R @ R.T, torch.eye(d, dtype=torch.float64))


def test_row_form_of_the_score_E4_9(gen):
    """q_i = x_i W_Q R_i^T, k_j = x_j W_K R_j^T => q_i k_j^T = x_i W_Q R_{j-i} W_K^T x_j^T; the seeds' form is wrong."""
    d = 4
    x_i, x_j = randn(d, gen=gen), randn(d, gen=gen)
    W_Q, W_K = randn(d, d, gen=gen), randn(d, d, gen=gen)
    i, j = 3, 7
    direct = (x_i @ W_Q @ rope_matrix(i, d).T) @ (x_j @ W_K @ rope_matrix(j, d).T)
    corrected = x_i @ W_Q @ rope_matrix(j - i, d) @ W_K.T @ x_j
    seeds = x_i @ W_Q @ rope_matrix(j - i, d) @ W_K @ x_j              # missing transpose (E4.9)
    assert_close(corrected, direct)
    assert abs(seeds - direct).item() > 1e-3


def test_values_are_not_rotated_E4_8(gen):
    """With W_q = W_k = 0 every weight is uniform, so the output is the mean of v: unchanged by RoPE iff v is not rotated."""
    torch.manual_seed(0)
    plain = MultiHeadAttention(16, 2).double()
    rotary = MultiHeadAttention(16, 2, rope=RotaryEmbedding()).double()
    rotary.load_state_dict(plain.state_dict())
    with torch.no_grad():
        for m in (plain, rotary):
            m.q_proj.weight.zero_(); m.q_proj.bias.zero_(); m.k_proj.weight.zero_(); m.k_proj.bias.zero_()
    x = randn(2, 9, 16, gen=gen)
    assert_close(rotary(x), plain(x))


# ----------------------------------------------------------------------------- positions, dtypes, gradients
def test_positions_argument_and_table_growth_M4_9(gen):
    x = randn(2, 6, 8, gen=gen)
    assert_close(apply_rope(x, torch.arange(6)), apply_rope(x))
    far = torch.arange(5000, 5006)                          # forces the cached tables to grow
    y = apply_rope(x, far)
    assert_close(y, torch.stack([x[:, r] @ rope_matrix(int(p), 8, interleaved=False).T for r, p in enumerate(far)], 1),
                 atol=1e-3)
    assert_close(apply_rope(x[:, :3], torch.tensor([7, 7, 7])),
                 x[:, :3] @ rope_matrix(7, 8, interleaved=False).T, atol=1e-5)


def test_fractional_positions_as_position_interpolation_uses_M4_11(gen):
    """Position interpolation passes positions * L_train / L_test: the rotation by a fractional angle."""
    x = randn(2, 5, 8, gen=gen, dtype=torch.float64)
    frac = torch.tensor([0.0, 0.25, 1.5, 7.75, 300.5], dtype=torch.float64)
    expected = torch.stack([x[:, r] @ rope_matrix(float(p), 8, interleaved=False).T for r, p in enumerate(frac)], 1)
    assert_close(apply_rope(x, frac), expected, atol=1e-5)
    assert_close(apply_rope_reference(x, frac), expected, atol=1e-5)
    assert_close(apply_rope(x, torch.arange(5).double()), apply_rope(x, torch.arange(5)))
    with pytest.raises(TypeError, match="integer"):                 # a learned table still needs whole rows
        LearnedPositionalEmbedding(8, 4)(torch.tensor([0.5]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_computes_in_fp32_and_returns_input_dtype_M4_9(dtype, gen):
    x = randn(3, 20, 16, gen=gen)
    y = apply_rope(x.to(dtype))
    assert y.dtype == dtype
    assert_close(y, apply_rope(x).to(dtype))


def test_gradient_is_the_inverse_rotation_M4_9(gen):
    x = randn(2, 7, 6, gen=gen).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, interleaved=True), (x,))
    assert torch.autograd.gradgradcheck(lambda t: apply_rope(t), (x,))
    g = randn(2, 7, 6, gen=gen)
    (apply_rope(x) * g).sum().backward()
    explicit = torch.stack([g[:, r] @ rope_matrix(r, 6, interleaved=False) for r in range(7)], 1)   # R^T g
    assert_close(x.grad, explicit, atol=1e-5)


@pytest.mark.parametrize("call,err,match", [
    (lambda: apply_rope(torch.zeros(4, 7)), ValueError, "even"),
    (lambda: apply_rope(torch.zeros(4, 8), torch.tensor([True, False, True, False])), TypeError, "integer or floating"),
    (lambda: apply_rope(torch.zeros(4, 8), torch.arange(5)), ValueError, "length"),
    (lambda: apply_rope(torch.zeros(4, 8), torch.tensor([0, 1, -1, 2])), ValueError, "non-negative"),
    (lambda: apply_rope(torch.zeros(4, 8, dtype=torch.long)), TypeError, "floating"),
    (lambda: apply_rope(torch.zeros(8)), ValueError, "dims"),
    (lambda: rope_matrix(1, 5), ValueError, "even"),
    (lambda: rope_permutation(0), ValueError, "positive"),
])
def test_bad_inputs_M4_9(call, err, match):
    with pytest.raises(err, match=match):
        call()


# ----------------------------------------------------------------------------- M4.10
def test_pairs_that_never_complete_a_turn_M4_10_E4_14():
    turns = rope_turns(2048, 128)
    assert turns.shape == (64,)
    assert int((turns < 1).sum()) == 23
    theta = 10000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert int((2048 * theta < 2 * math.pi).sum()) == 23                  # the same count from the definition
    assert int((rope_turns(2048, 128, base=500000.0) < 1).sum()) > 23      # a larger base: more slow pairs


@pytest.mark.gpu
def test_cuda_matches_cpu_M4_9(gen):
    x = randn(2, 4, 33, 64, gen=gen, dtype=torch.float32)
    assert_close(apply_rope(x.cuda()).cpu(), apply_rope(x))
    assert_close(apply_rope(x.cuda().bfloat16(), interleaved=True).cpu(), apply_rope(x, interleaved=True).bfloat16())
