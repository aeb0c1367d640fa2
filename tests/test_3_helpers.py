"""Chapter 3 helpers in `xfam_lib.hsoftmax`: Huffman trees and hierarchical softmax (M3.17)."""
import heapq
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.hsoftmax import HuffmanTree, hsoftmax_logprob, hsoftmax_prob_loop, huffman_tree
from xfam_lib.testing import assert_close


def _merge_cost(freqs):
    """Expected Huffman code length computed without any tree: the sum of the weights of all merges
    (each merge adds one bit to every word below it), for frequencies normalised to sum to 1."""
    total = float(sum(freqs))
    heap = [f / total for f in freqs]
    heapq.heapify(heap)
    cost = 0.0
    while len(heap) > 1:
        merged = heapq.heappop(heap) + heapq.heappop(heap)
        cost += merged
        heapq.heappush(heap, merged)
    return cost


def _expected_length(freqs, tree):
    total = float(sum(freqs))
    return sum(f / total * depth for f, depth in zip(freqs, tree.depths()))


def test_expected_code_length_of_the_worked_example_M3_17():
    """[0.4, 0.2, 0.2, 0.1, 0.1] gives an expected code length of 2.2 bits (entropy 2.122 bits)."""
    freqs = [0.4, 0.2, 0.2, 0.1, 0.1]
    tree = huffman_tree(freqs)
    assert _expected_length(freqs, tree) == pytest.approx(2.2, abs=1e-12)
    entropy = -sum(p * math.log2(p) for p in freqs)
    assert entropy < _expected_length(freqs, tree) < entropy + 1   # Shannon's bound, strict: not dyadic
    assert tree.n_internal == 4 and sorted(tree.depths()) == [2, 2, 2, 3, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=2, max_size=40))
def test_huffman_tree_is_an_optimal_prefix_code_M3_17(freqs):
    """Kraft equality (a full binary tree), the merge-cost identity and the entropy bound H <= L < H + 1."""
    tree = huffman_tree(freqs)
    depths = tree.depths()
    assert sum(2.0 ** -d for d in depths) == pytest.approx(1.0, abs=1e-12)
    length = _expected_length(freqs, tree)
    assert length == pytest.approx(_merge_cost(freqs), rel=1e-9, abs=1e-12)
    total = sum(freqs)
    entropy = -sum(f / total * math.log2(f / total) for f in freqs)
    assert entropy - 1e-9 <= length < entropy + 1 + 1e-9
    # every internal node is used, and each path starts at the root
    assert {n for p in tree.paths for n in p} == set(range(tree.n_internal))
    assert all(p[0] == tree.n_internal - 1 for p in tree.paths)


def test_frequent_words_get_short_codes_M3_17():
    """Zipf frequencies over 16 words: code length never decreases with frequency rank."""
    depths = huffman_tree([1.0 / r for r in range(1, 17)]).depths()
    assert depths == sorted(depths)
    assert depths[0] < math.log2(16) < depths[-1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hierarchical_softmax_sums_to_one_M3_17(dtype):
    gen = torch.Generator().manual_seed(0)
    freqs = torch.rand(23, generator=gen, dtype=torch.float64) + 0.01
    tree = huffman_tree(freqs)
    h = torch.randn(4, 3, 8, generator=gen, dtype=torch.float64).to(dtype)
    nodes = torch.randn(tree.n_internal, 8, generator=gen, dtype=torch.float64).to(dtype)
    logp = hsoftmax_logprob(h, tree, nodes)
    assert logp.shape == (4, 3, 23) and logp.dtype == dtype
    assert_close(logp.exp().sum(-1), torch.ones(4, 3, dtype=dtype))


def test_vectorised_equals_the_path_product_in_values_and_gradients_M3_17():
    """`hsoftmax_logprob` (one matmul + gather) equals the loop over each word's path, and so do the gradients."""
    gen = torch.Generator().manual_seed(1)
    tree = huffman_tree([5, 1, 1, 2, 8, 3, 1, 1, 4])
    h = torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    nodes = torch.randn(tree.n_internal, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    fast = hsoftmax_logprob(h, tree, nodes)
    slow = torch.stack([hsoftmax_prob_loop(h, tree, nodes, w).log() for w in range(9)], dim=-1)
    assert_close(fast, slow)
    weights = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    g_fast = torch.autograd.grad((fast * weights).sum(), (h, nodes))
    g_slow = torch.autograd.grad((slow * weights).sum(), (h, nodes))
    for a, b in zip(g_fast, g_slow):
        assert_close(a, b)


def test_two_word_tree_is_a_logistic_regression_M3_17():
    """With two words the tree has one node: p(w0 | h) = sigmoid(v . h), p(w1 | h) = sigmoid(-v . h)."""
    tree = huffman_tree([1.0, 3.0])
    assert tree == HuffmanTree(paths=((0,), (0,)), signs=((1,), (-1,)))
    h = torch.tensor([[0.5, -1.0]], dtype=torch.float64)
    v = torch.tensor([[2.0, 0.25]], dtype=torch.float64)
    z = float(h @ v[0])
    expected = torch.tensor([[math.log(1 / (1 + math.exp(-z))), math.log(1 / (1 + math.exp(z)))]], dtype=torch.float64)
    assert_close(hsoftmax_logprob(h, tree, v), expected)


def test_half_precision_returns_the_input_dtype_M3_17():
    gen = torch.Generator().manual_seed(2)
    tree = huffman_tree([3, 1, 4, 1, 5, 9, 2, 6])
    h = torch.randn(5, 16, generator=gen)
    nodes = torch.randn(tree.n_internal, 16, generator=gen)
    out = hsoftmax_logprob(h.bfloat16(), tree, nodes.bfloat16())
    assert out.dtype == torch.bfloat16
    assert_close(out, hsoftmax_logprob(h.bfloat16().float(), tree, nodes.bfloat16().float()).bfloat16())


def test_bad_input_names_the_argument_M3_17():
    with pytest.raises(ValueError, match="freqs"):
        huffman_tree([1.0])
    with pytest.raises(ValueError, match="freqs"):
        huffman_tree([1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="freqs"):
        huffman_tree([[1.0, 2.0], [3.0, 4.0]])
    tree = huffman_tree([1, 2, 3])
    h = torch.randn(2, 4)
    with pytest.raises(ValueError, match="node_vectors"):
        hsoftmax_logprob(h, tree, torch.randn(3, 4))
    with pytest.raises(TypeError, match="h"):
        hsoftmax_logprob(torch.ones(2, 4, dtype=torch.long), tree, torch.randn(2, 4))
    with pytest.raises(ValueError, match="word"):
        hsoftmax_prob_loop(h, tree, torch.randn(2, 4), 3)
