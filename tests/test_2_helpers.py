"""Tests for the helpers Chapter 2 adds: gaussian_tokens, offset_copy, seen_before (tasks) and
attention_edges, attention_graph (plots).

Rows: M2.9 (diagonal of XX^T), M2.10 and M2.7 (previous-token / neighbour tasks), M2.19 (seen_before),
M2.6 (attention as a graph). Expected values come from loops, closed forms or METHODS/ERRATA numbers
re-derived here.
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # tests draw without a display (never set for the book build)
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from xfam_lib import plots, tasks  # noqa: E402


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _diagonal_share(x):
    s = x @ x.transpose(-1, -2)
    return float((s.argmax(-1) == torch.arange(x.shape[-2])).double().mean())


# ----------------------------------------------------------------------------- gaussian_tokens (M2.9)
@pytest.mark.parametrize("d, expected", [(2, 0.38), (4, 0.67), (16, 0.996), (64, 1.0)])
def test_M2_9_diagonal_share_matches_errata_E2_5(d, expected):
    """Share of rows of XX^T (L = 10) whose argmax is the diagonal: 0.38 / 0.67 / 0.996 / 1.0 (ERRATA E2.5).

    40,000 rows: the binomial standard error is below 0.0025, so 0.015 is a 6-sigma margin.
    """
    x = tasks.gaussian_tokens(4000, 10, d, generator=_gen(d))
    assert x.shape == (4000, 10, d) and x.dtype == torch.float64
    assert abs(_diagonal_share(x) - expected) < 0.015


def test_M2_9_unequal_norms_lower_the_diagonal_share():
    """With norms uniform in [0.2, 3] the diagonal wins far fewer rows at d = 16 (about 0.81, METHODS C12)."""
    x = tasks.gaussian_tokens(4000, 10, 16, norm_spread=(0.2, 3.0), generator=_gen(1))
    norms = x.norm(dim=-1)
    assert norms.min() >= 0.2 - 1e-12 and norms.max() <= 3.0 + 1e-12
    assert abs(float(norms.mean()) - 1.6) < 0.02                   # mean of U(0.2, 3)
    assert abs(_diagonal_share(x) - 0.82) < 0.03


def test_M2_9_gaussian_tokens_moments_and_fixed_norms():
    x = tasks.gaussian_tokens(2000, 8, 4, generator=_gen(2), dtype=torch.float32)
    assert x.dtype == torch.float32
    assert abs(float(x.mean())) < 0.02 and abs(float(x.var()) - 1.0) < 0.03
    y = tasks.gaussian_tokens(1, 1, 3, norm_spread=(2.0, 2.0), generator=_gen(3))
    assert abs(float(y.norm()) - 2.0) < 1e-12


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(batch=0, length=3, d=2), ValueError, "batch"),
    (dict(batch=1, length=3, d=2.5), TypeError, "d"),
    (dict(batch=1, length=3, d=2, norm_spread=(3.0, 1.0)), ValueError, "norm_spread"),
    (dict(batch=1, length=3, d=2, norm_spread=(0.0, 1.0)), ValueError, "norm_spread"),
    (dict(batch=1, length=3, d=2, norm_spread="ab"), ValueError, "norm_spread"),
    (dict(batch=1, length=3, d=2, dtype=torch.int64), TypeError, "dtype"),
])
def test_gaussian_tokens_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        tasks.gaussian_tokens(**kwargs)


# ----------------------------------------------------------------------------- offset_copy (M2.7, M2.10)
@pytest.mark.parametrize("offsets", [(-1,), (-1, 1), (2, -3), 1])
def test_M2_10_offset_copy_matches_a_loop(offsets):
    ids, targets = tasks.offset_copy(5, 7, 9, offsets=offsets, generator=_gen(4))
    offs = (offsets,) if isinstance(offsets, int) else offsets
    assert ids.shape == (5, 7) and targets.shape == (5, 7, len(offs))
    assert ids.min() >= tasks.N_SPECIAL and ids.max() < 9
    for b in range(5):
        for i in range(7):
            for c, o in enumerate(offs):
                want = int(ids[b, i + o]) if 0 <= i + o < 7 else tasks.PAD
                assert int(targets[b, i, c]) == want


@pytest.mark.parametrize("offsets", [(), (0,), (1, 1), (7,), (-7,), (1.0,), (True,)])
def test_offset_copy_bad_offsets(offsets):
    with pytest.raises(ValueError, match="offsets"):
        tasks.offset_copy(2, 7, 9, offsets=offsets)


# ----------------------------------------------------------------------------- seen_before (M2.19)
def test_M2_19_seen_before_matches_a_loop():
    ids, labels = tasks.seen_before(6, 12, 6, generator=_gen(5))
    assert ids.shape == labels.shape == (6, 12) and labels.dtype == torch.int64
    for b in range(6):
        row = ids[b].tolist()
        assert labels[b].tolist() == [int(row[i] in row[:i]) for i in range(12)]
    assert labels[:, 0].eq(0).all()


def test_M2_19_seen_before_base_rate_closed_form():
    """P(label_i = 1) = 1 - (1 - 1/n)^i for n equally likely token types (n = vocab - 2)."""
    _, labels = tasks.seen_before(20000, 10, 10, generator=_gen(6))
    expected = 1 - (1 - 1 / 8) ** torch.arange(10, dtype=torch.float64)
    assert (labels.double().mean(0) - expected).abs().max() < 0.015


def test_seen_before_bad_arguments():
    with pytest.raises(ValueError, match="vocab"):
        tasks.seen_before(2, 5, 2)
    with pytest.raises(ValueError, match="length"):
        tasks.seen_before(2, 0, 5)


# ----------------------------------------------------------------------------- attention graph (M2.6)
def test_M2_6_attention_edges_match_a_loop():
    a = torch.softmax(torch.randn(6, 6, generator=_gen(8)) * 2, dim=-1)
    edges = plots.attention_edges(a, threshold=0.2)
    want = [(i, j, float(a[i, j])) for i in range(6) for j in range(6) if a[i, j] > 0.2]
    assert [(i, j) for i, j, _ in edges] == [(i, j) for i, j, _ in want]
    assert all(math.isclose(w, v, rel_tol=1e-6) for (_, _, w), (_, _, v) in zip(edges, want))


def test_M2_6_attention_graph_draws_one_arrow_per_edge():
    a = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.4, 0.0], [0.1, 0.3, 0.6]])
    fig = plots.attention_graph(a, threshold=0.2, labels=["a", "b", "c"])
    ax = fig.axes[0]
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    rings = [p for p in ax.patches if isinstance(p, plt.Circle)]
    assert len(arrows) == 2                     # off-diagonal edges above 0.2: (1, 0) and (2, 1)
    assert len(rings) == 3                      # self weights 1.0, 0.4, 0.6
    assert "5 edges" in ax.get_title()
    plt.close(fig)


@pytest.mark.parametrize("weights, threshold, words", [
    (torch.ones(2, 3), 0.1, "square"),
    (torch.ones(2, 2, 2), 0.1, "square"),
    (torch.eye(3), 1.0, "threshold"),
    (torch.eye(3), -0.1, "threshold"),
])
def test_attention_graph_bad_arguments(weights, threshold, words):
    with pytest.raises(ValueError, match=words):
        plots.attention_graph(weights, threshold)


def test_attention_graph_label_count_checked():
    with pytest.raises(ValueError, match="labels"):
        plots.attention_graph(torch.eye(3), 0.1, labels=["a"])
