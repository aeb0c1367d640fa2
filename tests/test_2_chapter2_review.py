"""Chapter 2 additions: half-precision attention is bounded against fp64 by the dtype's unit roundoff (M2.16),
and a shared query/key projection gives symmetric scores (M2.10)."""
import math

import pytest
import torch

from xfam_lib.attention import causal_mask, scaled_dot_product_attention, shared_qk_scores
from xfam_lib.testing import assert_close

EPS32 = torch.finfo(torch.float32).eps


def _half_case(dtype, seed, length, d, causal):
    """Rounded inputs, the fp64 result on them, and the one- and two-rounding bounds of the output."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, length, d, generator=gen).to(dtype) for _ in range(3))
    q64, k64, v64 = (t.double() for t in (q, k, v))
    exact, weights = scaled_dot_product_attention(q64, k64, v64, causal=causal, return_weights=True)
    u = torch.finfo(dtype).eps / 2                      # unit roundoff: one rounding to `dtype`
    s_max = float((q64 @ k64.transpose(-1, -2)).abs().max()) / math.sqrt(d)
    fp32_part = (d + length) * EPS32 * (1 + s_max) * float(v64.abs().max())   # fp32 sums of this length
    one = u * exact.abs() + fp32_part
    two = u * (exact.abs() + weights @ v64.abs()) + fp32_part                  # P rounded once more, before P V
    return (q, k, v), exact, one, two


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed,length,d", [(0, 32, 16), (1, 96, 32)])
def test_half_attention_is_fp32_inside_M2_16(dtype, causal, seed, length, d):
    """Explicit path: within one rounding of fp64 on the same inputs; fused path: within two (it rounds P)."""
    (q, k, v), exact, one, two = _half_case(dtype, seed, length, d, causal)
    explicit, _ = scaled_dot_product_attention(q, k, v, causal=causal, return_weights=True)
    fused = scaled_dot_product_attention(q, k, v, causal=causal)
    assert explicit.dtype == fused.dtype == dtype
    assert ((explicit.double() - exact).abs() <= one).all()
    assert ((fused.double() - exact).abs() <= two).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_throughout_breaks_the_one_rounding_bound_M2_16(dtype):
    """The bound has teeth: the same formula evaluated in the half type throughout exceeds it."""
    (q, k, v), exact, one, _ = _half_case(dtype, 2, 64, 16, True)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(16)).masked_fill(~causal_mask(64), float("-inf"))
    in_half = torch.softmax(scores, -1) @ v
    assert ((in_half.double() - exact).abs() > one).any()


def test_shared_projection_scores_are_symmetric_psd_and_not_xxt_M2_10(gen):
    """With M = W W^T the antisymmetric part M^T - M is zero, so s(a, b) = s(b, a); the scores are a Gram matrix."""
    x = torch.randn(7, 12, dtype=torch.float64, generator=gen)
    w = torch.randn(12, 6, dtype=torch.float64, generator=gen)
    shared = shared_qk_scores(x, w)
    assert_close(shared, shared.T)
    assert_close(shared, (x @ w) @ (x @ w).T)
    assert torch.linalg.eigvalsh(shared).min() >= -1e-12 * shared.abs().max()          # PSD up to fp64 round-off
    assert not torch.allclose(shared, x @ x.T)
