"""Positional encodings against an independent implementation: lucidrains' x-transformers (M4.8, M4.9, M4.10).

x-transformers is pinned in requirements.txt and installs without CUDA. Its T5 bucket function
ports Mesh TensorFlow's; its ALiBi slopes follow Press et al.'s reference code; its rotary
embedding pairs dims ``(2i, 2i+1)``, which is our ``interleaved=True``.
"""
import math

import pytest
import torch

from xfam_lib.positional import alibi_bias, alibi_slopes, apply_rope, t5_relative_position_bucket
from xfam_lib.testing import assert_close

xt = pytest.importorskip("x_transformers.x_transformers", reason="x-transformers is pinned in requirements.txt")


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 64), (64, 256), (8, 20)])
def test_t5_buckets_equal_x_transformers_M4_8(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-3 * max_distance, 3 * max_distance + 1)[None, :]   # key_pos - query_pos
    ours = t5_relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                       max_distance=max_distance)
    theirs = xt.RelativePositionBias._relative_position_bucket(rel, causal=not bidirectional,
                                                               num_buckets=num_buckets, max_distance=max_distance)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("n_heads", [1, 2, 5, 6, 8, 12, 16, 20])
def test_alibi_slopes_and_bias_equal_x_transformers_M4_10(n_heads):
    assert_close(alibi_slopes(n_heads, dtype=torch.float64), torch.tensor(xt.AlibiPositionalBias._get_slopes(n_heads),
                                                                          dtype=torch.float64))
    for q_len, k_len in [(7, 7), (3, 9)]:          # bottom-right aligned: queries are the last q_len positions
        theirs = xt.AlibiPositionalBias(n_heads)(q_len, k_len)
        assert_close(alibi_bias(n_heads, q_len, k_len), theirs)


@pytest.mark.parametrize("d, base", [(16, 10000.0), (64, 500000.0)])
def test_rope_interleaved_equals_x_transformers_M4_9(d, base):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, d)                     # fp32: x-transformers computes its frequencies in fp32
    rotary = xt.RotaryEmbedding(d, base=base)
    positions = torch.arange(11)
    freqs, scale = rotary(positions)                 # (1, 11, d), angles repeated per pair
    theirs = xt.apply_rotary_pos_emb(x, freqs, scale)
    assert_close(apply_rope(x, positions, base=base, interleaved=True), theirs)
    assert math.isclose(float(freqs[0, 1, 2]), base ** (-2 / d), rel_tol=1e-6)   # pair 1 at position 1: theta_1
