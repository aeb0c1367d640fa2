"""Chapter 7 notebook helpers: the pattern gallery, mask FLOPs, `plots.plot_mask` (M7.1) and the memory and
attention-by-distance measurements the chapter plots (M7.7, M7.14, M7.18)."""
import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from xfam_lib import sparse
from xfam_lib.bench import attention_flops
from xfam_lib.ablations import activation_memory, attention_by_distance
from xfam_lib.plots import plot_mask
from xfam_lib.transformer import TransformerLM


@pytest.mark.parametrize("name,expected", [
    ("sliding window", lambda: sparse.sliding_window_mask(32, 4, causal=True)),
    ("dilated", lambda: sparse.dilated_mask(32, 4, 2)),
    ("strided", lambda: sparse.strided_mask(32, 4)),
    ("fixed", lambda: sparse.fixed_mask(32, 4, 1)),
    ("blockwise", lambda: sparse.blockwise_mask(32, 8)),
    ("Image 1-D local", lambda: sparse.local1d_mask(32, 4, 4)),
    ("Longformer", lambda: sparse.longformer_mask(32, 4, 1, [0])),
    ("BigBird", lambda: sparse.expand_layout(sparse.bigbird_layout(8, 1, 1, 1, 0), 4)),
    ("sinks + window", lambda: sparse.sink_window_mask(32, 1, 4)),
])
def test_pattern_mask_is_the_named_builder_M7_1(name, expected):
    assert torch.equal(sparse.pattern_mask(name, 32, 4), expected())


def test_pattern_mask_content_based_patterns_are_equivalence_classes_M7_1():
    """LSH buckets / routing clusters: same-id pairs, so reflexive, symmetric and transitive (M @ M ⊆ M),
    with as many classes as ids used, at most ``size`` (LSH: the next even count)."""
    for name, size in (("LSH buckets", 3), ("routing clusters", 5)):
        m = sparse.pattern_mask(name, 48, size, seed=1)
        assert m.diagonal().all() and torch.equal(m, m.T)
        assert torch.equal((m.float() @ m.float()) > 0, m)
        n_classes = len({tuple(row.tolist()) for row in m})
        assert 2 <= n_classes <= size + size % 2
        assert torch.equal(m, sparse.pattern_mask(name, 48, size, seed=1))           # seeded
        assert not torch.equal(m, sparse.pattern_mask(name, 48, size, seed=2))


def test_pattern_mask_rejects_bad_arguments_M7_1():
    with pytest.raises(ValueError, match="part must be one of"):
        sparse.pattern_mask("dense", 32, 4)
    with pytest.raises(ValueError, match="L % size"):
        sparse.pattern_mask("blockwise", 30, 4)
    with pytest.raises(TypeError, match="size"):
        sparse.pattern_mask("strided", 32, 2.5)


def test_masked_attention_flops_M7_1():
    """Full mask = `bench.attention_flops`; a block layout = what torch's FLOP counter measures for
    `block_sparse_attention`, which multiplies only the active tiles."""
    assert sparse.masked_attention_flops(torch.ones(64, 64, dtype=torch.bool), 16) == attention_flops(64, 16)
    layout = sparse.bigbird_layout(8, 1, 1, 1, 0)
    q, k, v = (torch.randn(1, 1, 64, 16) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        sparse.block_sparse_attention(q, k, v, layout, 8)
    assert counter.get_total_flops() == sparse.masked_attention_flops(sparse.expand_layout(layout, 8), 16)
    assert sparse.masked_attention_flops(torch.eye(4, dtype=torch.bool), 3, 5) == 2 * 4 * 8


def test_plot_mask_density_in_title_M7_1():
    mask = sparse.strided_mask(40, 6)
    fig = plot_mask(mask, title="strided")
    title = fig.axes[0].get_title()
    assert title.startswith("strided") and f"{mask.float().mean().item():.3f}" in title
    with pytest.raises(ValueError, match="boolean"):
        plot_mask(mask.float())


def test_activation_memory_M7_7_M7_14():
    """Held activations: plain grows with depth, reversible does not, checkpointed keeps one input per block
    (less than plain); the peaks follow."""
    r = activation_memory((1, 4), d=16, n_tokens=32)
    held, peak = r["held"], r["peak"]
    assert held["plain"][1] >= 3 * held["plain"][0]                   # one block: 3 units, four: 9 (+output)
    assert held["reversible"][1] == held["reversible"][0]
    assert held["checkpointed"][1] == 4 * held["checkpointed"][0] < held["plain"][1]
    assert peak["reversible"][1] < peak["plain"][1] and peak["checkpointed"][1] < peak["plain"][1]


def test_attention_by_distance_M7_18():
    torch.manual_seed(0)
    model = TransformerLM(11, 16, 1, 2)
    ids = torch.randint(0, 11, (3, 16))
    r = attention_by_distance(model, ids)
    w = torch.tensor(r["mean_weights"])
    assert torch.allclose(w.sum(-1), torch.ones(16), atol=1e-5) and torch.equal(w.triu(1), torch.zeros(16, 16))
    rows = torch.arange(8, 16)
    assert r["by_distance"][3] == pytest.approx(float(w[rows, rows - 3].mean()))
    assert r["first_token"] == pytest.approx(float(w[rows, 0].mean()))
    assert r["first_token_max_head"] >= r["first_token"]


@pytest.mark.parametrize("kernel", ["sliding", "longformer", "block_sparse", "lsh"])
def test_sparse_kernels_run_under_bf16_autocast_M7_7(kernel):
    """Under torch.autocast(bfloat16) the band's scores are bf16: the off-band fill value must fit bf16
    (it used float32's lowest value and raised). Results stay within bf16 rounding of fp32, in fp32."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))
    fn = {"sliding": lambda: sparse.sliding_window_attention(q, k, v, 8, causal=True),
          "longformer": lambda: sparse.longformer_attention(q, k, v, 8, [0, 50]),
          "block_sparse": lambda: sparse.block_sparse_attention(q, k, v, sparse.bigbird_layout(6, 1, 1, 1, 0), 16),
          "lsh": lambda: sparse.lsh_attention(q, v, 4, 16, 2)}[kernel]
    ref = fn()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn()
    assert out.dtype == torch.float32
    err = (out - ref).abs().max().item()
    assert 0 < err < 0.05                                      # bf16 matmuls: 8-bit mantissa, O(1) values


def test_train_sink_lm_learns_the_lag_M7_18():
    """A short run already puts the attention peak on i - j = lag - 1 (the token that predicts the next one
    under the lag rule), well above the uniform share; before training there is no such peak."""
    from xfam_lib.ablations import train_sink_lm

    threads = torch.get_num_threads()
    torch.set_num_threads(1)                                   # a tiny model: threads only contend
    try:
        r = train_sink_lm(steps=120, length=16, batch=16, lag=2, seed=1)
    finally:
        torch.set_num_threads(threads)
    before, after = r["before"]["by_distance"], r["after"]["by_distance"]
    assert max(range(len(after)), key=after.__getitem__) == 1
    assert after[1] > 3 * r["after"]["uniform"] and before[1] < 2 * r["before"]["uniform"]
