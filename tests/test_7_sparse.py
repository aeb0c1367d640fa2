"""Chapter 7, sparse attention: the mask toolkit, sliding-window and block-sparse attention (METHODS M7.x).

References are independent of the library: every mask is compared with a Python double loop over
(i, j) that spells out the paper's definition, counts with closed forms written here, and the
attention kernels with dense attention under that mask (our SDPA and PyTorch's
``F.scaled_dot_product_attention`` with an explicit boolean mask), outputs and gradients.
"""
import math
from collections import deque

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from xfam_lib.attention import causal_mask, scaled_dot_product_attention
from xfam_lib.bench import largest_intermediate, peak_memory
from xfam_lib.sparse import (
    bigbird_layout,
    block_sparse_attention,
    dilated_mask,
    expand_layout,
    fixed_mask,
    longformer_mask,
    sink_window_mask,
    sliding_window_attention,
    sliding_window_mask,
    strided_mask,
)
from xfam_lib.testing import assert_close, check_causal, grads, randn

F64 = torch.float64
HYP = settings(max_examples=25, deadline=None, derandomize=True)


def loop_mask(n_rows, n_cols, rule):
    """The obviously-correct reference: ``rule(i, j)`` evaluated for every pair in plain Python."""
    return torch.tensor([[bool(rule(i, j)) for j in range(n_cols)] for i in range(n_rows)], dtype=torch.bool)


def band_rule(window, causal):
    return (lambda i, j: 0 <= i - j <= window) if causal else (lambda i, j: abs(i - j) <= window)


def shortest_paths(mask, source):
    """BFS over the directed graph ``i -> j`` iff ``mask[i, j]``: hop counts from ``source`` (None: unreachable)."""
    rows = mask.tolist()
    n = len(rows)
    adj = [[j for j in range(n) if rows[i][j]] for i in range(n)]
    dist = [None] * n
    dist[source] = 0
    todo = deque([source])
    while todo:
        i = todo.popleft()
        for j in adj[i]:
            if dist[j] is None:
                dist[j] = dist[i] + 1
                todo.append(j)
    return dist


def diameter(mask):
    return max(max(d for d in shortest_paths(mask, s)) for s in range(mask.shape[0]))


# ----------------------------------------------------------------------------- M7.2 band masks
@pytest.mark.parametrize("length,window", [(1, 0), (7, 0), (16, 3), (10, 9), (9, 20)])
@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_mask_equals_loop_M7_2(length, window, causal):
    mask = sliding_window_mask(length, window, causal)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, loop_mask(length, length, band_rule(window, causal)))
    if causal:
        assert torch.equal(mask, causal_mask(length, window=window))
    else:
        assert torch.equal(mask, mask.T)


def test_sliding_window_pair_counts_M7_2():
    """Closed forms: causal (w+1)L − w(w+1)/2 and two-sided (2w+1)L − w(w+1) for L > w; L=16, causal w=3 → 58."""
    for length, w in ((16, 3), (50, 7), (8, 1), (33, 0)):
        assert int(sliding_window_mask(length, w, True).sum()) == (w + 1) * length - w * (w + 1) // 2
        assert int(sliding_window_mask(length, w, False).sum()) == (2 * w + 1) * length - w * (w + 1)
    assert (3 + 1) * 16 - 3 * 4 // 2 == int(sliding_window_mask(16, 3, causal=True).sum()) == 58


def test_receptive_field_of_a_causal_window_M7_1():
    """Stacking layers composes masks (boolean matrix powers): token 63 first hears token 0 after ⌈63/3⌉ = 21
    layers of causal window 3, and the same hop count comes out of a BFS."""
    mask = sliding_window_mask(64, 3, causal=True)
    reach, layers = mask.clone(), 1
    while not reach[63, 0]:
        reach = (reach.int() @ mask.int()) > 0
        layers += 1
    assert layers == math.ceil(63 / 3) == shortest_paths(mask, 63)[0]


# ----------------------------------------------------------------------------- M7.3 dilated
@pytest.mark.parametrize("length,window,dilation", [(20, 2, 3), (17, 3, 1), (12, 0, 4), (9, 5, 2), (1, 1, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_dilated_mask_equals_loop_M7_3(length, window, dilation, causal):
    """(i−j) mod r = 0 inside the range |i−j| ≤ window·r (causal: 0 ≤ i−j); r = 1 is the plain band."""
    def rule(i, j):
        inside = 0 <= i - j <= window * dilation if causal else abs(i - j) <= window * dilation
        return inside and (i - j) % dilation == 0
    mask = dilated_mask(length, window, dilation, causal)
    assert torch.equal(mask, loop_mask(length, length, rule))
    if dilation == 1:
        assert torch.equal(mask, sliding_window_mask(length, window, causal))
    row_counts = [min(window, i // dilation) + 1 if causal else
                  min(window, i // dilation) + min(window, (length - 1 - i) // dilation) + 1 for i in range(length)]
    assert mask.sum(-1).tolist() == row_counts


def test_dilation_widens_the_receptive_field_at_equal_cost_M7_3():
    """Same 3 keys per row, but a hop covers up to window·r positions: carrying token 0 to token 60 takes
    ⌈60/2⌉ = 30 layers of plain window 2 and ⌈60/8⌉ = 8 with dilation 4; a single dilated stack only ever
    reaches keys ≡ i (mod r), which is why dilation is mixed across heads or layers."""
    plain, dilated = sliding_window_mask(64, 2, causal=True), dilated_mask(64, 2, 4, causal=True)
    assert int(plain.sum(-1).max()) == int(dilated.sum(-1).max()) == 3
    assert shortest_paths(plain, 60)[0] == math.ceil(60 / 2)
    assert shortest_paths(dilated, 60)[0] == math.ceil(60 / 8)
    assert shortest_paths(dilated, 63)[0] is None


# ----------------------------------------------------------------------------- M7.5 Sparse Transformer
def openai_strided(n, stride):
    """The strided head as openai/sparse_attention builds it (``q >= k`` and ``floormod(q - k, stride) == 0``)."""
    x = torch.arange(n).reshape(n, 1)
    q, k = x + torch.zeros(n, n, dtype=torch.long), x.T + torch.zeros(n, n, dtype=torch.long)
    return (q >= k) & (torch.remainder(q - k, stride) == 0)


def openai_local(n, bandwidth):
    """openai's ``local`` head: ``matrix_band_part(ones, min(n-1, bandwidth-1), 0)``."""
    return torch.ones(n, n).tril().triu(-min(n - 1, bandwidth - 1)) > 0


@pytest.mark.parametrize("length,stride", [(16, 4), (30, 5), (10, 1), (7, 9), (25, 3)])
def test_strided_mask_equals_paper_definition_M7_5(length, stride):
    """A⁽¹⁾ = {max(0, i−l), …, i}, A⁽²⁾ = {j ≤ i : (i−j) mod l = 0}; heads ≡ openai's ``local``/``strided``."""
    a1 = lambda i, j: max(0, i - stride) <= j <= i
    a2 = lambda i, j: j <= i and (i - j) % stride == 0
    assert torch.equal(strided_mask(length, stride), loop_mask(length, length, lambda i, j: a1(i, j) or a2(i, j)))
    assert torch.equal(strided_mask(length, stride, part="strided"), loop_mask(length, length, a2))
    assert torch.equal(strided_mask(length, stride, part="strided"), openai_strided(length, stride))
    assert torch.equal(strided_mask(length, stride, part="local"), openai_local(length, stride))


@pytest.mark.parametrize("length,stride,c", [(16, 4, 1), (16, 4, 2), (30, 6, 3), (13, 4, 4), (9, 1, 1), (20, 8, 1)])
def test_fixed_mask_equals_paper_definition_M7_5(length, stride, c):
    """A⁽¹⁾ = {j : ⌊j/l⌋ = ⌊i/l⌋}, A⁽²⁾ = {j : j mod l ∈ {l−c, …, l−1}}, both intersected with j ≤ i (E7.1)."""
    a1 = lambda i, j: j <= i and j // stride == i // stride
    a2 = lambda i, j: j <= i and stride - c <= j % stride <= stride - 1
    assert torch.equal(fixed_mask(length, stride, c), loop_mask(length, length, lambda i, j: a1(i, j) or a2(i, j)))
    assert torch.equal(fixed_mask(length, stride, c, part="local"), loop_mask(length, length, a1))
    assert torch.equal(fixed_mask(length, stride, c, part="summary"), loop_mask(length, length, a2))


@pytest.mark.parametrize("builder", [lambda n, l: strided_mask(n, l), lambda n, l: fixed_mask(n, l, 1),
                                     lambda n, l: fixed_mask(n, l, 2)], ids=["strided", "fixed c=1", "fixed c=2"])
@pytest.mark.parametrize("length,stride", [(64, 8), (50, 7), (36, 6)])
def test_sparse_transformer_is_causal_and_two_hop_M7_5(builder, length, stride):
    """No key after the query; every j ≤ i is reached in at most two hops (M ∨ M²), none in one for most pairs."""
    mask = builder(length, stride)
    assert not (mask & ~torch.ones(length, length, dtype=torch.bool).tril()).any()
    m = mask.int()
    two_hops = mask | ((m @ m) > 0)
    assert torch.equal(two_hops, torch.ones(length, length, dtype=torch.bool).tril())
    assert int(mask.sum()) < length * (length + 1) // 2                  # and strictly sparser than causal


def test_sparse_transformer_counts_M7_5():
    """Closed forms for L = n·l: strided l(l+1)/2 + (L−l)l + l·n(n−1)/2, fixed n·l(l+1)/2 + c·l·n(n−1)/2.
    With l = n = √L, fixed (c = 1) has exactly L√L entries and strided → 1.5·L√L from below: Θ(L√L)."""
    for n, l in ((4, 4), (8, 8), (5, 7), (3, 10)):
        length = n * l
        assert int(strided_mask(length, l).sum()) == l * (l + 1) // 2 + (length - l) * l + l * n * (n - 1) // 2
        for c in (1, 2, l):
            assert int(fixed_mask(length, l, c).sum()) == n * l * (l + 1) // 2 + c * l * n * (n - 1) // 2
    ratios = {}
    for length in (64, 256, 1024):
        l = math.isqrt(length)
        ratios[length] = (int(strided_mask(length, l).sum()) / length ** 1.5,
                          int(fixed_mask(length, l, 1).sum()) / length ** 1.5)
    for strided_ratio, fixed_ratio in ratios.values():
        assert 1.25 < strided_ratio < 1.5 and fixed_ratio == 1.0
    assert ratios[64][0] < ratios[256][0] < ratios[1024][0]
    assert int(strided_mask(1024, 32).sum()) / 1024 ** 2 < 0.05


# ----------------------------------------------------------------------------- M7.10 Longformer
@pytest.mark.parametrize("length,window,dilation,global_idx", [
    (32, 2, 1, [0]), (20, 1, 2, [3, 11]), (15, 3, 1, []), (10, 2, 3, [9, 0, 9]), (6, 0, 1, [5])])
def test_longformer_mask_equals_loop_M7_10(length, window, dilation, global_idx):
    gl = set(global_idx)
    rule = lambda i, j: (abs(i - j) <= window * dilation and (i - j) % dilation == 0) or i in gl or j in gl
    mask = longformer_mask(length, window, dilation, global_idx)
    assert torch.equal(mask, loop_mask(length, length, rule))
    assert torch.equal(mask, mask.T)                                    # window and global parts both symmetric
    if not global_idx:
        assert torch.equal(mask, dilated_mask(length, window, dilation, causal=False))


def test_longformer_pair_count_M7_10():
    """L=32, window ±2, one global token at 0: band (2w+1)L − w(w+1) = 154, plus row and column 0 outside
    the band, 2(L − (w+1)) = 58 → 212; the global token reaches everything in one hop and any pair in two."""
    length, w = 32, 2
    mask = longformer_mask(length, w, 1, [0])
    assert int(mask.sum()) == (2 * w + 1) * length - w * (w + 1) + 2 * (length - (w + 1)) == 212
    assert diameter(mask) == 2
    assert max(shortest_paths(mask, 0)) == 1
    for same in (0, torch.tensor([0]), (0, 0), torch.tensor(0)):          # scalar, tensor, duplicates
        assert torch.equal(longformer_mask(length, w, 1, same), mask)
    with pytest.raises(TypeError, match="global_idx"):
        longformer_mask(length, w, 1, [0.5])
    with pytest.raises(ValueError, match="global_idx"):
        longformer_mask(length, w, 1, [[0, 1]])


# ----------------------------------------------------------------------------- M7.11 BigBird
@pytest.mark.parametrize("n_blocks,n_window,n_random,n_global,seed",
                         [(12, 1, 2, 1, 0), (16, 2, 3, 2, 7), (8, 0, 0, 0, 1), (6, 1, 1, 0, 3), (10, 3, 2, 1, 5)])
def test_bigbird_layout_structure_M7_11(n_blocks, n_window, n_random, n_global, seed):
    """Window and global blocks exactly where they belong; each other row has exactly n_random more blocks, all
    outside its window and the globals; the same seed gives the same layout."""
    layout = bigbird_layout(n_blocks, n_window, n_random, n_global, seed)
    fixed = loop_mask(n_blocks, n_blocks, lambda a, b: abs(a - b) <= n_window or a < n_global or b < n_global)
    assert layout.dtype == torch.bool and layout.shape == (n_blocks, n_blocks)
    assert not (fixed & ~layout).any()
    extra = layout & ~fixed
    for a in range(n_blocks):
        assert int(extra[a].sum()) == (0 if a < n_global else n_random)
    assert torch.equal(layout, bigbird_layout(n_blocks, n_window, n_random, n_global, seed))


def test_bigbird_random_blocks_depend_on_the_seed_M7_11():
    layouts = {tuple(bigbird_layout(32, 1, 3, 1, s).flatten().tolist()) for s in range(6)}
    assert len(layouts) > 1
    with pytest.raises(ValueError, match="n_random"):                  # 8 blocks: row 4 has 8 − 3 − 1 = 4 left
        bigbird_layout(8, 1, 5, 1, 0)
    with pytest.raises(ValueError, match="n_global"):
        bigbird_layout(4, 1, 0, 5, 0)
    with pytest.raises(TypeError, match="seed"):
        bigbird_layout(4, 1, 0, 0, 1.5)


def test_bigbird_graph_diameter_M7_11():
    """Token-level graph (block size 1), L = 64: window ±1 → diameter 63; one global block → 2; random blocks only
    shorten paths."""
    assert diameter(bigbird_layout(64, 1, 0, 0, 0)) == 63
    assert diameter(bigbird_layout(64, 1, 0, 1, 0)) == 2
    assert diameter(bigbird_layout(64, 1, 2, 0, 0)) < 63


@pytest.mark.parametrize("per_head", [False, True])
def test_bigbird_block_sparse_equals_simulated_dense_M7_11(per_head, gen):
    """BigBird through ``block_sparse_attention`` ≡ dense attention with the expanded mask (the "simulated"
    form), outputs and gradients; per-head layouts use one seed per head."""
    bs, nb, heads = 4, 10, 3
    layout = (torch.stack([bigbird_layout(nb, 1, 2, 1, h) for h in range(heads)]) if per_head
              else bigbird_layout(nb, 1, 2, 1, 0))
    q, k, v = (randn(2, heads, nb * bs, 8, gen=gen, requires_grad=True) for _ in range(3))
    out = block_sparse_attention(q, k, v, layout, bs)
    ref = scaled_dot_product_attention(q, k, v, expand_layout(layout, bs))
    assert_close(out, ref)
    cot = randn(*out.shape, gen=gen)
    for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(a, b)


# ----------------------------------------------------------------------------- M7.18 sinks
@pytest.mark.parametrize("length,n_sink,window", [(16, 4, 3), (10, 0, 2), (12, 1, 0), (8, 10, 1), (20, 2, 25)])
def test_sink_window_mask_equals_loop_M7_18(length, n_sink, window):
    """Causal; keys j < n_sink or i − j ≤ window; row counts min(i, w) + 1 + max(0, min(n_sink, i − w))."""
    rule = lambda i, j: j <= i and (j < n_sink or i - j <= window)
    mask = sink_window_mask(length, n_sink, window)
    assert torch.equal(mask, loop_mask(length, length, rule))
    assert mask.sum(-1).tolist() == [min(i, window) + 1 + max(0, min(n_sink, i - window)) for i in range(length)]
    if n_sink == 0:
        assert torch.equal(mask, sliding_window_mask(length, window, causal=True))


# ----------------------------------------------------------------------------- M7.1 expand_layout
def test_expand_layout_equals_loop_M7_1(gen):
    layout = torch.rand(3, 5, generator=gen) > 0.5
    for bs in (1, 2, 4):
        mask = expand_layout(layout, bs)
        assert torch.equal(mask, loop_mask(3 * bs, 5 * bs, lambda i, j: layout[i // bs, j // bs]))
    per_head = torch.rand(2, 3, 4, generator=gen) > 0.5
    expanded = expand_layout(per_head, 3)
    assert expanded.shape == (2, 9, 12)
    for h in range(2):
        assert torch.equal(expanded[h], loop_mask(9, 12, lambda i, j: per_head[h, i // 3, j // 3]))
    with pytest.raises(TypeError, match="layout"):
        expand_layout(layout.int(), 2)
    with pytest.raises(ValueError, match="layout"):
        expand_layout(torch.ones(4, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="block_size"):
        expand_layout(layout, 0)


def test_mask_builders_reject_bad_arguments_M7_1():
    for call, name in ((lambda: sliding_window_mask(0, 1), "L"), (lambda: sliding_window_mask(8, -1), "window"),
                       (lambda: dilated_mask(8, 2, 0), "dilation"), (lambda: strided_mask(8, 0), "stride"),
                       (lambda: fixed_mask(8, 4, 5), "c"), (lambda: fixed_mask(8, 4, 0), "c"),
                       (lambda: strided_mask(8, 2, part="both"), "part"),
                       (lambda: fixed_mask(8, 2, 1, part="strided"), "part"),
                       (lambda: longformer_mask(8, 1, 1, [8]), "global_idx"),
                       (lambda: longformer_mask(8, 1, 1, [-1]), "global_idx"),
                       (lambda: sink_window_mask(8, -1, 2), "n_sink"),
                       (lambda: bigbird_layout(0, 1, 0, 0, 0), "n_blocks")):
        with pytest.raises(ValueError, match=name):
            call()
    with pytest.raises(TypeError, match="window"):
        sliding_window_mask(8, 1.5)


# ----------------------------------------------------------------------------- M7.2 sliding-window attention
SWA_CASES = [  # (L, window, block_size, causal)
    (16, 3, 4, False), (16, 3, 4, True), (37, 5, 8, False), (37, 5, 8, True), (37, 5, None, True),
    (20, 0, 6, False), (20, 0, 6, True), (9, 30, 4, False), (9, 30, None, True), (1, 2, 3, True),
    (50, 7, 1, False), (23, 4, 23, True), (23, 4, 64, False),
]


@pytest.mark.parametrize("length,window,block_size,causal", SWA_CASES)
def test_sliding_window_equals_dense_band_M7_2(length, window, block_size, causal, gen):
    """Ragged chunks, window 0, window ≥ L, one chunk or chunks of 1: outputs and gradients (q, k, v) ≡ our SDPA and
    PyTorch's SDPA with the loop-built band mask, fp64."""
    q, k = randn(2, 3, length, 8, gen=gen, requires_grad=True), randn(2, 3, length, 8, gen=gen, requires_grad=True)
    v = randn(2, 3, length, 5, gen=gen, requires_grad=True)
    band = loop_mask(length, length, band_rule(window, causal))
    out = sliding_window_attention(q, k, v, window, causal=causal, block_size=block_size)
    ref = scaled_dot_product_attention(q, k, v, band)
    torch_ref = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    assert out.shape == (2, 3, length, 5)
    assert_close(out, ref)
    assert_close(out, torch_ref)
    cot = randn(*out.shape, gen=gen)
    for a, b, c in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot), grads(torch_ref, (q, k, v), cot)):
        assert torch.isfinite(a).all()
        assert_close(a, b)
        assert_close(a, c)


@HYP
@given(length=st.integers(1, 40), window=st.integers(0, 45), block_size=st.one_of(st.none(), st.integers(1, 16)),
       causal=st.booleans(), lead=st.sampled_from([(), (2,), (1, 2)]), scale=st.sampled_from([None, 0.2, 4.0]),
       seed=st.integers(0, 2**16))
def test_sliding_window_property_M7_2(length, window, block_size, causal, lead, scale, seed):
    """Random lengths, windows, chunks, leading dims and scales: ≡ dense band reference, gradients of q, k, v too."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (randn(*lead, length, 3, gen=g, requires_grad=True) for _ in range(3))
    out = sliding_window_attention(q, k, v, window, causal=causal, scale=scale, block_size=block_size)
    ref = scaled_dot_product_attention(q, k, v, loop_mask(length, length, band_rule(window, causal)), scale=scale)
    assert_close(out, ref)
    cot = torch.randn(out.shape, generator=g, dtype=F64)
    for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(a, b)


def test_sliding_window_gradcheck_M7_2(gen):
    """Finite differences agree with the autograd backward through the padded, unfolded bands."""
    q, k, v = (randn(1, 2, 11, 3, gen=gen, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, c: sliding_window_attention(a, b, c, 2, causal=causal, block_size=4), (q, k, v))


def test_sliding_window_ignores_keys_outside_the_band_M7_2(gen):
    """Changing keys/values farther than ``window`` from query i leaves output i bit-identical (masked scores are
    exactly 0 after exp); causal also passes ``check_causal``."""
    length, w, i = 40, 3, 20
    q, k, v = randn(2, length, 4, gen=gen), randn(2, length, 4, gen=gen), randn(2, length, 4, gen=gen)
    far = (torch.arange(length) - i).abs() > w
    k2, v2 = k.clone(), v.clone()
    k2[:, far] += randn(2, int(far.sum()), 4, gen=gen)
    v2[:, far] += randn(2, int(far.sum()), 4, gen=gen)
    for bs in (None, 5, 7):
        a = sliding_window_attention(q, k, v, w, block_size=bs)[:, i]
        b = sliding_window_attention(q, k2, v2, w, block_size=bs)[:, i]
        assert torch.equal(a, b)
    x = randn(2, 33, 4, gen=gen)
    causal_fn = lambda t: sliding_window_attention(t, t, t, 4, causal=True, block_size=5)
    assert check_causal(causal_fn, x, position=17) == 0.0


def test_sliding_window_fp32_matches_torch_M7_2(gen):
    """fp32, (B, H, L, d) = (2, 4, 70, 16): outputs and gradients within the fp32 tolerance of PyTorch's SDPA."""
    for causal in (False, True):
        q, k, v = (randn(2, 4, 70, 16, gen=gen, dtype=torch.float32, requires_grad=True) for _ in range(3))
        band = loop_mask(70, 70, band_rule(6, causal))
        out = sliding_window_attention(q, k, v, 6, causal=causal, block_size=16)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
        assert out.dtype == torch.float32
        assert_close(out, ref)
        cot = randn(*out.shape, gen=gen, dtype=torch.float32)
        for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
            assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sliding_window_half_precision_M7_2(dtype, gen):
    """Half in → half out and half gradients, within the dtype's tolerance of the fp64 result (one rounding of the
    output: bf16 eps 7.8e-3, fp16 eps 9.8e-4), since scores and softmax run in fp32."""
    q, k, v = (torch.randn(2, 2, 45, 16, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    out = sliding_window_attention(q, k, v, 5, causal=True, block_size=8)
    exact_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact = scaled_dot_product_attention(*exact_inputs, loop_mask(45, 45, band_rule(5, True)))
    assert out.dtype == dtype
    assert_close(out, exact.to(dtype))
    cot = torch.randn(out.shape, generator=gen)
    for a, b in zip(grads(out, (q, k, v), cot.to(dtype)), grads(exact, exact_inputs, cot.double())):
        assert a.dtype == dtype
        assert_close(a, b.to(dtype))


def test_sliding_window_memory_is_linear_in_length_M7_2(gen):
    """Largest tensor any op allocates (forward + backward) and CPU peak memory (forward) double when L doubles,
    stay within L·(bs + 2w) per head, while dense attention's grow 4× and reach L²."""
    w, bs, d = 8, 16, 8
    largest, peaks = {}, {}
    for length in (256, 512, 1024, 2048):
        q, k, v = (randn(1, 1, length, d, gen=gen, dtype=torch.float32, requires_grad=True) for _ in range(3))

        def train_step():
            out = sliding_window_attention(q, k, v, w, block_size=bs)
            return torch.autograd.grad(out.sum(), (q, k, v))

        largest[length] = largest_intermediate(train_step)
        with torch.no_grad():
            peaks[length] = peak_memory(lambda: sliding_window_attention(q, k, v, w, block_size=bs))
        assert largest[length] <= length * (bs + 2 * w)
    for small, big in ((256, 512), (512, 1024), (1024, 2048)):
        assert largest[big] / largest[small] <= 2.05
        assert peaks[big] / peaks[small] <= 2.1
    n = 1024
    x = randn(1, 1, n, d, gen=gen, dtype=torch.float32)
    dense_step = lambda: scaled_dot_product_attention(x, x, x, sliding_window_mask(n, w), return_weights=True)
    assert largest_intermediate(dense_step) >= n * n
    with torch.no_grad():
        dense_peak = peak_memory(dense_step)
    assert peaks[n] * 8 <= dense_peak


def test_sliding_window_bad_input_M7_2(gen):
    q = randn(1, 2, 8, 4, gen=gen)
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention(q, q, q, -1)
    with pytest.raises(TypeError, match="window"):
        sliding_window_attention(q, q, q, 2.0)
    with pytest.raises(ValueError, match=r"Lq == Lk.*\(1, 2, 8, 4\).*\(1, 2, 9, 4\)"):
        k = randn(1, 2, 9, 4, gen=gen)
        sliding_window_attention(q, k, k, 2)
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="block_size"):
            sliding_window_attention(q, q, q, 2, block_size=bad)
    with pytest.raises(ValueError, match="q and k"):
        sliding_window_attention(q, randn(1, 2, 8, 3, gen=gen), q, 2)
    with pytest.raises(ValueError, match="scale"):
        sliding_window_attention(q, q, q, 2, scale=-1.0)
    with pytest.raises(TypeError, match="dtypes"):
        sliding_window_attention(q, q.float(), q, 2)


# ----------------------------------------------------------------------------- M7.1 block-sparse attention
BSA_CASES = [  # (heads, Lq, Lk, block_size, per_head)
    (3, 16, 16, 4, False), (3, 16, 16, 4, True), (2, 12, 20, 4, True), (1, 18, 6, 3, False),
    (4, 8, 8, 1, True), (2, 10, 10, 10, False), (2, 10, 10, 10, True),
]


@pytest.mark.parametrize("heads,lq,lk,bs,per_head", BSA_CASES)
def test_block_sparse_equals_dense_expanded_mask_M7_1(heads, lq, lk, bs, per_head, gen):
    """Random layouts (one query block with no active block, forced): outputs and gradients ≡ dense SDPA with the
    loop-expanded mask, fp64; the empty row gives zeros and zero gradients."""
    shape = ((heads,) if per_head else ()) + (lq // bs, lk // bs)
    layout = torch.rand(shape, generator=gen) < 0.5
    layout[..., 0, :] = False
    mask = (torch.stack([loop_mask(lq, lk, lambda i, j: layout[h, i // bs, j // bs]) for h in range(heads)])
            if per_head else loop_mask(lq, lk, lambda i, j: layout[i // bs, j // bs]))
    q = randn(2, heads, lq, 6, gen=gen, requires_grad=True)
    k, v = randn(2, heads, lk, 6, gen=gen, requires_grad=True), randn(2, heads, lk, 5, gen=gen, requires_grad=True)
    out = block_sparse_attention(q, k, v, layout, bs)
    ref = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, heads, lq, 5)
    assert_close(out, ref)
    assert bool((out[..., :bs, :] == 0).all())
    cot = randn(*out.shape, gen=gen)
    g_out, g_ref = grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)
    for a, b in zip(g_out, g_ref):
        assert torch.isfinite(a).all()
        assert_close(a, b)
    assert bool((g_out[0][..., :bs, :] == 0).all())


@pytest.mark.parametrize("per_head", [False, True])
def test_block_sparse_matches_torch_sdpa_fp32_M7_1(per_head, gen):
    """fp32 against ``F.scaled_dot_product_attention`` with the explicit boolean mask (every query block keeps
    its diagonal block, so no row is empty and PyTorch's result is defined)."""
    heads, nb, bs = 4, 6, 8
    shape = ((heads,) if per_head else ()) + (nb, nb)
    layout = (torch.rand(shape, generator=gen) < 0.3) | torch.eye(nb, dtype=torch.bool)
    q, k, v = (randn(2, heads, nb * bs, 16, gen=gen, dtype=torch.float32, requires_grad=True) for _ in range(3))
    out = block_sparse_attention(q, k, v, layout, bs)
    mask = layout.repeat_interleave(bs, -2).repeat_interleave(bs, -1)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(out, ref)
    cot = randn(*out.shape, gen=gen, dtype=torch.float32)
    for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(a, b)


@HYP
@given(n_q=st.integers(1, 5), n_k=st.integers(1, 5), bs=st.integers(1, 4), heads=st.integers(1, 3),
       per_head=st.booleans(), density=st.sampled_from([0.0, 0.3, 0.7, 1.0]), lead=st.sampled_from([(), (2,)]),
       scale=st.sampled_from([None, 0.5, 5.0]), seed=st.integers(0, 2**16))
def test_block_sparse_property_M7_1(n_q, n_k, bs, heads, per_head, density, lead, scale, seed):
    """Any block counts, sizes, densities (empty and full layouts included), leading dims and scales: ≡ dense, with
    the gradient of q, k and v."""
    g = torch.Generator().manual_seed(seed)
    shape = ((heads,) if per_head else ()) + (n_q, n_k)
    layout = torch.rand(shape, generator=g) < density
    q = randn(*lead, heads, n_q * bs, 3, gen=g, requires_grad=True)
    k, v = randn(*lead, heads, n_k * bs, 3, gen=g, requires_grad=True), randn(*lead, heads, n_k * bs, 2, gen=g,
                                                                                 requires_grad=True)
    out = block_sparse_attention(q, k, v, layout, bs, scale=scale)
    ref = scaled_dot_product_attention(q, k, v, expand_layout(layout, bs), scale=scale)
    assert_close(out, ref)
    cot = torch.randn(out.shape, generator=g, dtype=F64)
    for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(a, b)


def test_block_sparse_extreme_logits_M7_1(gen):
    """Scores of order ±1e3 stay finite: the per-row max shift spans all of a row's tiles."""
    layout = torch.rand(5, 5, generator=gen) < 0.6
    layout[:, 2] = True
    q, k, v = randn(2, 20, 8, gen=gen), randn(2, 20, 8, gen=gen), randn(2, 20, 8, gen=gen)
    for sign in (1.0, -1.0):
        out = block_sparse_attention(sign * q, k, v, layout, 4, scale=300.0)
        assert torch.isfinite(out).all()
        assert_close(out, scaled_dot_product_attention(sign * q, k, v, expand_layout(layout, 4), scale=300.0))


def test_block_sparse_computes_only_active_blocks_M7_1(gen):
    """FLOPs counted by PyTorch are exactly 2·N·P·bs²·(d_k + d_v) for P active blocks (dense: 2·N·Lq·Lk·(d_k + d_v));
    the largest tensor allocated is the (N, P, bs, bs) score tiles."""
    heads, nb, bs, d_k, d_v = 2, 16, 8, 16, 12
    layout = torch.stack([bigbird_layout(nb, 1, 1, 1, h) for h in range(heads)])
    n_active = int(layout.sum())
    q, k = randn(3, heads, nb * bs, d_k, gen=gen), randn(3, heads, nb * bs, d_k, gen=gen)
    v = randn(3, heads, nb * bs, d_v, gen=gen)
    with FlopCounterMode(display=False) as counter:
        block_sparse_attention(q, k, v, layout, bs)
    assert counter.get_total_flops() == 2 * 3 * n_active * bs * bs * (d_k + d_v)
    with FlopCounterMode(display=False) as dense_counter:
        scaled_dot_product_attention(q, k, v, expand_layout(layout, bs), return_weights=True)
    assert dense_counter.get_total_flops() == 2 * 3 * heads * (nb * bs) ** 2 * (d_k + d_v)
    assert counter.get_total_flops() < 0.5 * dense_counter.get_total_flops()
    assert largest_intermediate(lambda: block_sparse_attention(q, k, v, layout, bs)) <= \
        3 * n_active * bs * max(bs, d_k, d_v)


def test_block_sparse_half_precision_M7_1(gen):
    """bf16 in → bf16 out and gradients, within bf16 tolerance of the fp64 result."""
    layout = (torch.rand(4, 4, generator=gen) < 0.5) | torch.eye(4, dtype=torch.bool)
    q, k, v = (torch.randn(2, 2, 32, 16, generator=gen).bfloat16().requires_grad_() for _ in range(3))
    out = block_sparse_attention(q, k, v, layout, 8)
    exact_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    exact = scaled_dot_product_attention(*exact_inputs, expand_layout(layout, 8))
    assert out.dtype == torch.bfloat16
    assert_close(out, exact.bfloat16())
    cot = torch.randn(out.shape, generator=gen)
    for a, b in zip(grads(out, (q, k, v), cot.bfloat16()), grads(exact, exact_inputs, cot.double())):
        assert a.dtype == torch.bfloat16
        assert_close(a, b.bfloat16())


def test_block_sparse_bad_input_M7_1(gen):
    q = randn(2, 3, 12, 4, gen=gen)
    layout = torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"layout.*\(3, 3\).*block_size=5.*\(2, 2\)"):     # ragged: 3 blocks of 5
        block_sparse_attention(q, q, q, torch.ones(2, 2, dtype=torch.bool), 5)
    for bad in (torch.ones(3, 4, dtype=torch.bool), torch.ones(2, 3, 3, dtype=torch.bool),
                torch.ones(1, 3, 3, 3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)):
        with pytest.raises(ValueError, match=r"layout.*\(3, 3\).*\(3, 3, 3\)"):
            block_sparse_attention(q, q, q, bad, 4)
    with pytest.raises(TypeError, match="layout"):
        block_sparse_attention(q, q, q, layout.float(), 4)
    with pytest.raises(ValueError, match="block_size"):
        block_sparse_attention(q, q, q, layout, 0)
    with pytest.raises(ValueError, match="layout"):                     # per-head layout but no head dim
        x = randn(12, 4, gen=gen)
        block_sparse_attention(x, x, x, torch.ones(3, 3, 3, dtype=torch.bool), 4)


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_kernels_on_cuda_match_torch_M7_1_M7_2(dtype):
    """On a GPU: both kernels ≡ PyTorch's SDPA with the explicit mask (outputs and gradients), results stay on the
    device, and the sliding window's allocator peak stays far below dense attention's."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 32, generator=gen).to("cuda", dtype).requires_grad_()
               for _ in range(3))
    band = sliding_window_mask(256, 16, causal=True, device="cuda")
    layout = (torch.rand(4, 8, 8, generator=gen).to("cuda") < 0.4) | torch.eye(8, dtype=torch.bool, device="cuda")
    for out, mask in ((sliding_window_attention(q, k, v, 16, causal=True, block_size=48), band),
                      (block_sparse_attention(q, k, v, layout, 32), expand_layout(layout, 32))):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert out.dtype == dtype and out.device.type == "cuda"
        assert_close(out, ref)
        cot = torch.randn_like(out)
        for a, b in zip(grads(out, (q, k, v), cot), grads(ref, (q, k, v), cot)):
            assert_close(a, b)
    with torch.no_grad():
        x = torch.randn(1, 1, 8192, 64, device="cuda")
        local = peak_memory(lambda: sliding_window_attention(x, x, x, 64), "cuda")
        dense = peak_memory(lambda: scaled_dot_product_attention(x, x, x, return_weights=True), "cuda")
    assert local * 8 <= dense
