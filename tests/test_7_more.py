"""Chapter 7, the rest of the sparse toolkit (METHODS M7.1, M7.4, M7.7-M7.9, M7.12-M7.17).

Each pattern is compared with a Python double loop that spells out the paper's rule, each efficient
form with its dense (masked) or loop reference, outputs and gradients; closed forms are written here.
Independent packages (local-attention, reformer-pytorch, routing-transformer, Hugging Face) are in
tests/test_7_oracles.py.
"""
import math

import pytest
import torch
from torch import nn

from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.bench import largest_intermediate, peak_memory
from xfam_lib.sparse import (
    SELF_LOGIT, FactorizedSparseAttention, RevBlock, block_sparse_attention, blockwise_attention, blockwise_layout, blockwise_mask,
    checkpointed_sequence, chunked_ff, dca_attention, dca_attention_reference, dca_position_matrix,
    dense_masked_attention, etc_masks, expand_layout, fixed_layout, fixed_mask, graph_diameter, hop_distances, kmeans_ema_update,
    local1d_mask, local2d_mask, longformer_attention, longformer_mask, lsh_attention, lsh_attention_reference,
    lsh_collision_rate, lsh_hash, mask_to_bias,
    nnz, receptive_field, reversible_sequence, routing_assign, routing_attention, routing_mask, sliding_window_mask, strided_mask,
)
from xfam_lib.testing import assert_close, grads, randn

from test_7_sparse import loop_mask, shortest_paths

F64 = torch.float64


# ----------------------------------------------------------------------------- M7.1 graph tools
@pytest.mark.parametrize("mask_fn", [lambda: sliding_window_mask(20, 2, causal=True), lambda: strided_mask(20, 4),
                                     lambda: longformer_mask(20, 1, global_idx=[5])])
def test_receptive_field_and_hops_equal_bfs_M7_1(mask_fn):
    """receptive_field (boolean matrix powers) and hop_distances agree with a plain BFS from every token."""
    mask = mask_fn()
    bfs = torch.tensor([[math.inf if d is None else d for d in shortest_paths(mask, s)] for s in range(20)])
    assert torch.equal(hop_distances(mask), bfs.float())
    for n in (0, 1, 2, 5):
        assert torch.equal(receptive_field(mask, n), bfs <= n)
    assert graph_diameter(mask) == float(bfs.max())


def test_bigbird_style_diameters_M7_1():
    """METHODS: diameter at L=64 of window ±1 is 63; one global token brings it to 2; causal masks are infinite."""
    assert graph_diameter(sliding_window_mask(64, 1)) == 63
    assert graph_diameter(longformer_mask(64, 1, global_idx=[0])) == 2
    assert graph_diameter(sliding_window_mask(64, 1, causal=True)) == math.inf
    assert nnz(sliding_window_mask(16, 3, causal=True)) == 58


def test_dense_masked_attention_is_masked_softmax_M7_1(gen):
    q, k, v = (randn(2, 9, 4, gen=gen) for _ in range(3))
    mask = torch.rand(9, 9, generator=gen) < 0.4
    mask[3] = False                                                     # a row with no key
    scores = (q @ k.mT / 2).masked_fill(~mask, -math.inf)
    ref = torch.nan_to_num(torch.softmax(scores, -1)) @ v
    assert_close(dense_masked_attention(q, k, v, mask), ref)
    with pytest.raises(TypeError, match="mask"):
        dense_masked_attention(q, k, v, mask.float())


@pytest.mark.parametrize("lq,lk,bs,per_head", [(13, 13, 4, False), (10, 7, 3, True), (5, 9, 8, False), (9, 9, 1, True)])
def test_block_sparse_ragged_lengths_equal_dense_M7_1(lq, lk, bs, per_head, gen):
    """Lengths that are not multiples of block_size: ceil(L/bs) blocks, the last one ragged; equals dense
    attention with the expanded layout cut to (Lq, Lk), outputs and gradients (empty rows give zeros)."""
    nq, nk = -(-lq // bs), -(-lk // bs)
    layout = torch.rand((3, nq, nk) if per_head else (nq, nk), generator=gen) < 0.5
    layout[..., -1, -1] = True                                          # the ragged corner is used
    layout[..., 0, :] = False                                           # and one query block has no key block
    q, k = randn(2, 3, lq, 4, gen=gen, requires_grad=True), randn(2, 3, lk, 4, gen=gen, requires_grad=True)
    v, cot = randn(2, 3, lk, 5, gen=gen, requires_grad=True), randn(2, 3, lq, 5, gen=gen)
    ours = block_sparse_attention(q, k, v, layout, bs)
    ref = dense_masked_attention(q, k, v, expand_layout(layout, bs)[..., :lq, :lk])
    assert_close(ours, ref)
    assert not ours[..., :bs, :].any()
    for g1, g2 in zip(grads(ours, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(g1, g2)


@pytest.mark.parametrize("L,window,global_idx", [(40, 3, [0]), (37, 5, [0, 4, 36]), (20, 2, []), (9, 20, [3]),
                                                 (70, 4, [10, 11, 69])])
def test_longformer_attention_equals_dense_M7_10(L, window, global_idx, gen):
    """Band (chunked) + global keys off the band, merged by logsumexp, + full global rows ≡ dense attention
    with longformer_mask, outputs and gradients."""
    q, k, v = (randn(2, L, 6, gen=gen, requires_grad=True) for _ in range(3))
    cot = randn(2, L, 6, gen=gen)
    ours = longformer_attention(q, k, v, window, global_idx)
    ref = dense_masked_attention(q, k, v, longformer_mask(L, window, 1, global_idx))
    assert_close(ours, ref)
    for g1, g2 in zip(grads(ours, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(g1, g2)


@pytest.mark.parametrize("mode", ["merged", "per_head", "interleaved"])
def test_factorized_sparse_attention_modes_M7_6(mode, gen):
    """Each mode ≡ a per-head loop of dense masked attention with the mask the mode names (union of the
    Sparse Transformer's local and strided heads, head h alternating, or layer 1's pattern for all heads)."""
    L, d, H = 12, 8, 4
    local, strided = strided_mask(L, 3, part="local"), strided_mask(L, 3, part="strided")
    torch.manual_seed(0)
    layer = FactorizedSparseAttention(d, H, [local, strided], mode, layer=1).double()
    x = randn(2, L, d, gen=gen)
    expected_masks = {"merged": [local | strided] * H, "per_head": [local, strided] * 2, "interleaved": [strided] * H}[mode]
    w_q, w_k, w_v = layer.qkv.weight.split(d)
    b_q, b_k, b_v = layer.qkv.bias.split(d)
    heads = []
    for h in range(H):
        cols = slice(h * 2, h * 2 + 2)
        q, k, v = (x @ w[cols].T + b[cols] for w, b in ((w_q, b_q), (w_k, b_k), (w_v, b_v)))
        scores = (q @ k.mT / math.sqrt(2)).masked_fill(~expected_masks[h], -math.inf)
        heads.append(torch.softmax(scores, -1) @ v)
    ref = layer.out(torch.cat(heads, -1))
    assert_close(layer(x), ref)
    with pytest.raises(ValueError, match="mode"):
        FactorizedSparseAttention(d, H, [local], "both")


@pytest.mark.parametrize("n,s,c,bs", [(8, 4, 1, 4), (9, 3, 2, 2), (6, 6, 3, 3)])
def test_fixed_layout_through_block_sparse_M7_5(n, s, c, bs, gen):
    """The block layout of the fixed pattern, made token-causal, is fixed_mask at stride s·bs with c·bs
    summary cells; block_sparse_attention with it ≡ dense masked attention with its expansion."""
    layout = fixed_layout(n, s, c)
    L = n * bs
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    assert torch.equal(expand_layout(layout, bs) & causal, fixed_mask(L, s * bs, c * bs))
    q, k, v = (randn(2, L, 4, gen=gen) for _ in range(3))
    assert_close(block_sparse_attention(q, k, v, layout, bs), dense_masked_attention(q, k, v, expand_layout(layout, bs)))


# ----------------------------------------------------------------------------- M7.4 Image Transformer
@pytest.mark.parametrize("L,q_block,mem_len", [(16, 4, 4), (23, 5, 3), (12, 12, 0), (9, 2, 7)])
def test_local1d_mask_equals_loop_and_closed_form_M7_4(L, q_block, mem_len):
    mask = local1d_mask(L, q_block, mem_len)
    rule = lambda i, j: (i // q_block) * q_block - mem_len <= j <= i
    assert torch.equal(mask, loop_mask(L, L, rule))
    assert not mask.triu(1).any()                                       # causal in raster order
    # closed form: a block starting at s with r rows sees min(s, mem_len) memory + r(r+1)/2 own pairs
    count = sum(min(s, mem_len) * min(q_block, L - s) + min(q_block, L - s) * (min(q_block, L - s) + 1) // 2
                for s in range(0, L, q_block))
    assert nnz(mask) == count


@pytest.mark.parametrize("H,W,q_h,q_w,ext_h,ext_w", [(16, 16, 4, 4, 2, 2), (6, 9, 2, 3, 1, 2), (5, 7, 3, 2, 0, 1)])
def test_local2d_mask_equals_loop_M7_4(H, W, q_h, q_w, ext_h, ext_w):
    mask = local2d_mask(H, W, q_h, q_w, ext_h, ext_w)

    def rule(i, j):
        (ri, ci), (rj, cj) = divmod(i, W), divmod(j, W)
        top, left = ri // q_h * q_h, ci // q_w * q_w
        return j <= i and top - ext_h <= rj < top + q_h and left - ext_w <= cj < left + q_w + ext_w

    assert torch.equal(mask, loop_mask(H * W, H * W, rule))
    assert not mask.triu(1).any()


def test_local2d_interior_block_count_M7_4():
    """An interior query block (16x16 image, 4x4 blocks, extension 2): pixel (a, c) of the block sees
    ext_h full memory rows, a earlier rows, and ext_w + c + 1 pixels of its own row."""
    mask = local2d_mask(16, 16, 4, 4, 2, 2)
    width = 4 + 2 * 2
    for a in range(4):
        for c in range(4):
            pixel = (8 + a) * 16 + (4 + c)
            assert nnz(mask[pixel]) == 2 * width + a * width + 2 + c + 1
    assert nnz(mask) < 16 ** 4 / 8                                      # far below the dense L^2


# ----------------------------------------------------------------------------- M7.8 blockwise
@pytest.mark.parametrize("perm", [None, [2, 0, 3, 1], [3, 2, 1, 0]])
def test_blockwise_three_forms_agree_M7_8(perm, gen):
    """Reshape form ≡ block_sparse_attention with the permutation layout ≡ dense masked, outputs and gradients."""
    q, k, v = (randn(2, 3, 20, 6, gen=gen, requires_grad=True) for _ in range(3))
    cot = randn(2, 3, 20, 6, gen=gen)
    mask = blockwise_mask(20, 4, perm)
    p = list(range(4)) if perm is None else perm
    assert torch.equal(mask, loop_mask(20, 20, lambda i, j: j // 5 == p[i // 5]))
    ours = blockwise_attention(q, k, v, 4, perm)
    for other in (block_sparse_attention(q, k, v, blockwise_layout(4, perm), 5), dense_masked_attention(q, k, v, mask)):
        assert_close(ours, other)
        for g1, g2 in zip(grads(ours, (q, k, v), cot), grads(other, (q, k, v), cot)):
            assert_close(g1, g2)


def test_blockwise_scores_have_L2_over_n_entries_M7_8(gen):
    q, k, v = (randn(1, 64, 8, gen=gen, dtype=torch.float32) for _ in range(3))
    for n in (1, 2, 4, 8):
        assert largest_intermediate(lambda: blockwise_attention(q, k, v, n)) == 64 * 64 // n


def test_blockwise_bad_input_M7_8(gen):
    q = randn(1, 10, 4, gen=gen)
    with pytest.raises(ValueError, match="n_blocks=3.*L=10"):
        blockwise_attention(q, q, q, 3)
    with pytest.raises(ValueError, match="perm"):
        blockwise_mask(10, 2, [0, 0])


# ----------------------------------------------------------------------------- M7.9 ETC
def test_etc_masks_M7_9():
    seg = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    m = etc_masks(seg, radius=1)
    assert m["g2g"].all() and m["g2g"].shape == (3, 3)
    assert torch.equal(m["g2l"], loop_mask(3, 9, lambda g, j: seg[j] == g))        # each global sees its segment
    assert m["l2g"].all() and m["l2g"].shape == (9, 3)                             # every long sees every global
    # so any two long tokens are two hops apart (via the global of the reader's target segment)
    assert hop_distances(m["full"])[3:, 3:].max() == 2
    assert torch.equal(m["l2l"], loop_mask(9, 9, lambda i, j: abs(i - j) <= 1))     # banded
    assert nnz(m["full"]) == sum(nnz(m[p]) for p in ("g2g", "g2l", "l2g", "l2l"))
    assert torch.equal(m["full"][3:, :3], m["l2g"]) and torch.equal(m["full"][:3, 3:], m["g2l"])


def test_etc_additive_offset_equals_boolean_mask_M7_9(gen):
    """The −C offset (C = 1e4) equals boolean masking at O(1) logits: the masked weights are
    exp(−1e4) = 0 in fp64, so the results agree to fp64 rounding; C = 10 leaks visibly."""
    mask = etc_masks(torch.tensor([0, 0, 1, 1, 1, 2]), 1)["full"]
    q, k, v = (randn(2, 9, 4, gen=gen) for _ in range(3))
    ref = scaled_dot_product_attention(q, k, v, mask)
    assert_close(scaled_dot_product_attention(q, k, v, bias=mask_to_bias(mask).double()), ref)
    leak = (scaled_dot_product_attention(q, k, v, bias=mask_to_bias(mask, C=10).double()) - ref).abs().max()
    assert leak > 1e-6


# ----------------------------------------------------------------------------- M7.12 LSH
def test_lsh_hash_ids_and_seed_M7_12(gen):
    x = randn(2, 3, 50, 8, gen=gen)
    ids = lsh_hash(x, 6, n_rounds=4, seed=1)
    assert ids.shape == (2, 3, 4, 50) and ids.min() >= 0 and ids.max() < 6
    assert len(ids.unique()) == 6                                       # all buckets used on 1200 random points
    assert torch.equal(ids, lsh_hash(x, 6, 4, seed=1))
    assert not torch.equal(ids, lsh_hash(x, 6, 4, seed=2))
    assert torch.equal(lsh_hash(3.7 * x, 6, 4, seed=1), ids)            # depends only on the direction
    with pytest.raises(ValueError, match="n_buckets must be even"):
        lsh_hash(x, 5)


def _pairs_at_angle(theta, n, d, gen):
    a = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, dtype=F64), dim=-1)
    b = torch.randn(n, d, generator=gen, dtype=F64)
    b = torch.nn.functional.normalize(b - (b * a).sum(-1, keepdim=True) * a, dim=-1)     # orthogonal to a
    return a, math.cos(theta) * a + math.sin(theta) * b


def test_lsh_collision_probability_falls_with_angle_M7_12(gen):
    """With 2 buckets the hash is a random hyperplane: P(collision) = 1 − θ/π exactly (Goemans–Williamson);
    with more buckets the probability is lower and still falls with θ. 4000 pairs × 8 rounds per angle:
    the binomial standard error is below 0.008, so 0.03 is ~4 sigma."""
    thetas = [0.2, 0.6, 1.0, 1.6, 2.4]
    prob = {b: [] for b in (2, 8)}
    for theta in thetas:
        a, c = _pairs_at_angle(theta, 4000, 16, gen)
        for b in prob:
            prob[b].append((lsh_hash(a, b, 8, seed=3) == lsh_hash(c, b, 8, seed=3)).double().mean().item())
    for theta, p in zip(thetas, prob[2]):
        assert abs(p - (1 - theta / math.pi)) < 0.03
    for b in prob:
        assert all(x > y for x, y in zip(prob[b], prob[b][1:]))
    assert all(p8 < p2 for p8, p2 in zip(prob[8], prob[2]))


def test_lsh_collision_rate_helper_M7_12():
    """The chapter's helper: 2 buckets estimate 1 − θ/π (2000 pairs × 8 rounds, standard error < 0.006, so
    0.03 is 5 sigma); 8 buckets collide less and the rate falls with θ."""
    thetas = [0.3, 1.0, 2.0]
    two = [lsh_collision_rate(t, 2, seed=5) for t in thetas]
    eight = [lsh_collision_rate(t, 8, seed=5) for t in thetas]
    for t, p in zip(thetas, two):
        assert abs(p - (1 - t / math.pi)) < 0.03
    assert eight[0] > eight[1] > eight[2] and all(e < p for e, p in zip(eight, two))


# ----------------------------------------------------------------------------- M7.13 LSH attention
def full_shared_qk(qk, v, scale):
    scores = qk @ torch.nn.functional.normalize(qk, dim=-1).mT * scale
    eye = torch.eye(qk.shape[-2], dtype=torch.bool)
    return torch.softmax(scores.masked_fill(eye, SELF_LOGIT), -1) @ v


@pytest.mark.parametrize("n_rounds", [1, 3])
def test_lsh_one_chunk_equals_full_shared_qk_M7_13(n_rounds, gen):
    """A chunk covering the sequence: every round is full shared-QK attention with self-masking, and
    their logsumexp combination is that same attention (outputs and gradients)."""
    qk, v = randn(2, 2, 12, 4, gen=gen, requires_grad=True), randn(2, 2, 12, 5, gen=gen, requires_grad=True)
    cot = randn(2, 2, 12, 5, gen=gen)
    ours = lsh_attention(qk, v, n_buckets=4, chunk_len=12, n_rounds=n_rounds, seed=0)
    ref = full_shared_qk(qk, v, 0.5)
    assert_close(ours, ref)
    for g1, g2 in zip(grads(ours, (qk, v), cot), grads(ref, (qk, v), cot)):
        assert_close(g1, g2)


@pytest.mark.parametrize("L,chunk_len,n_rounds,causal", [(16, 4, 1, False), (13, 3, 2, True), (10, 4, 3, False),
                                                         (8, 4, 2, True)])
def test_lsh_sorted_chunks_equal_dense_loop_reference_M7_13(L, chunk_len, n_rounds, causal, gen):
    qk, v = randn(3, L, 6, gen=gen, requires_grad=True), randn(3, L, 5, gen=gen, requires_grad=True)
    cot = randn(3, L, 5, gen=gen)
    buckets = lsh_hash(qk.detach(), 4, n_rounds, seed=7)
    ours = lsh_attention(qk, v, 4, chunk_len, n_rounds, seed=7, causal=causal)
    assert torch.equal(ours, lsh_attention(qk, v, 4, chunk_len, n_rounds, causal=causal, buckets=buckets))
    for h in range(3):
        ref = lsh_attention_reference(qk[h], v[h], buckets[h], chunk_len, causal)
        assert_close(ours[h], ref)
        assert_close(grads(ours[h], (qk, v), cot[h])[0], grads(ref, (qk, v), cot[h])[0])


def test_lsh_attention_self_only_when_alone_and_half_precision_M7_13(gen):
    qk, v = randn(1, 8, 4, gen=gen), randn(1, 8, 3, gen=gen)
    out = lsh_attention(qk, v, 2, 4, causal=True, seed=0)
    assert_close(out[:, 0], v[:, 0])                                    # the first token has only itself
    half = lsh_attention(qk.to(torch.bfloat16), v.to(torch.bfloat16), 2, 4, causal=True, seed=0)
    assert half.dtype == torch.bfloat16
    assert_close(half, lsh_attention(qk.to(torch.bfloat16).double(), v.to(torch.bfloat16).double(), 2, 4,
                                     causal=True, seed=0))
    with pytest.raises(ValueError, match="buckets"):
        lsh_attention(qk, v, 2, 4, buckets=torch.zeros(1, 2, 8, dtype=torch.long))


# ----------------------------------------------------------------------------- M7.14 reversible
def make_blocks(n, d, seed):
    torch.manual_seed(seed)
    mlp = lambda: nn.Sequential(nn.Linear(d, 2 * d), nn.Tanh(), nn.Linear(2 * d, d))
    return nn.ModuleList([RevBlock(mlp(), mlp()) for _ in range(n)]).double()


def test_revblock_inverse_M7_14(gen):
    """inverse ∘ forward = id to fp64 rounding over 8 blocks."""
    blocks = make_blocks(8, 6, 0)
    x1, x2 = randn(4, 6, gen=gen), randn(4, 6, gen=gen)
    y1, y2 = x1, x2
    with torch.no_grad():
        for b in blocks:
            y1, y2 = b(y1, y2)
        for b in reversed(blocks):
            y1, y2 = b.inverse(y1, y2)
    assert_close(y1, x1)
    assert_close(y2, x2)


def test_reversible_sequence_gradients_equal_autograd_M7_14(gen):
    blocks = make_blocks(4, 6, 1)
    x1, x2 = randn(3, 5, 6, gen=gen, requires_grad=True), randn(3, 5, 6, gen=gen, requires_grad=True)
    c1, c2 = randn(3, 5, 6, gen=gen), randn(3, 5, 6, gen=gen)
    params = list(blocks.parameters())
    y1, y2 = x1, x2
    for b in blocks:
        y1, y2 = b(y1, y2)
    ref = torch.autograd.grad((y1 * c1).sum() + (y2 * c2).sum(), [x1, x2] + params)
    r1, r2 = reversible_sequence(blocks, x1, x2)
    assert_close(r1, y1)
    assert_close(r2, y2)
    ours = torch.autograd.grad((r1 * c1).sum() + (r2 * c2).sum(), [x1, x2] + params)
    for g1, g2 in zip(ours, ref):
        assert_close(g1, g2)


def test_reversible_memory_flat_in_depth_M7_14(gen):
    """Peak memory of forward + backward (input gradients): the plain stack's stored activations grow with
    depth, the reversible one's do not (its backward holds one block's graph at a time)."""
    x = randn(128, 32, gen=gen, dtype=torch.float32)

    def peak(depth, reversible):
        blocks = make_blocks(depth, 32, 0).float().requires_grad_(False)   # activations only, no weight gradients

        def step():
            a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
            if reversible:
                y1, y2 = reversible_sequence(blocks, a, b)
            else:
                y1, y2 = a, b
                for blk in blocks:
                    y1, y2 = blk(y1, y2)
            return torch.autograd.grad(y1.sum() + y2.sum(), (a, b))
        return peak_memory(step)

    plain, rev = [peak(n, False) for n in (2, 16)], [peak(n, True) for n in (2, 16)]
    assert plain[1] > 3 * plain[0]                                     # 8x the blocks: stored tanh outputs grow
    assert rev[1] < 1.2 * rev[0]
    assert rev[1] < plain[1] / 2


# ----------------------------------------------------------------------------- M7.15 chunked FF, M7.7 checkpointing
@pytest.mark.parametrize("n_chunks", [1, 3, 7])
def test_chunked_ff_equals_unchunked_M7_15(n_chunks, gen):
    torch.manual_seed(0)
    ff = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)).double()
    x = randn(2, 20, 8, gen=gen, requires_grad=True)
    cot = randn(2, 20, 8, gen=gen)
    assert_close(chunked_ff(ff, x, n_chunks), ff(x))
    assert_close(grads(chunked_ff(ff, x, n_chunks), (x,), cot)[0], grads(ff(x), (x,), cot)[0])


def test_chunked_ff_lowers_the_largest_activation_M7_15(gen):
    ff = nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 8))
    x = randn(1, 256, 8, gen=gen, dtype=torch.float32)
    with torch.no_grad():
        assert largest_intermediate(lambda: chunked_ff(ff, x, 1)) == 256 * 64
        assert largest_intermediate(lambda: chunked_ff(ff, x, 8)) == 256 * 8     # the output, not the 32 x 64 hidden


def test_checkpointed_sequence_gradients_identical_M7_7(gen):
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8)).double() for _ in range(3)]
    x = randn(4, 8, gen=gen, requires_grad=True)
    ref = x
    for b in blocks:
        ref = b(ref)
    params = [p for b in blocks for p in b.parameters()]
    g_ref = torch.autograd.grad(ref.square().sum(), [x] + params)
    g = torch.autograd.grad(checkpointed_sequence(blocks, x).square().sum(), [x] + params)
    for a, b in zip(g, g_ref):
        assert torch.equal(a, b)                                        # the same ops recomputed: bit-identical


# ----------------------------------------------------------------------------- M7.16 routing
def test_routing_mask_consistent_with_argmax_M7_16(gen):
    q, k = randn(2, 12, 5, gen=gen), randn(2, 12, 5, gen=gen)
    mu = randn(3, 5, gen=gen)

    def nearest(x):                                                     # closest unit centroid to the unit vector
        u, m = x / x.norm(), [c / c.norm() for c in mu]
        return min(range(3), key=lambda c: (u - m[c]).norm().item())

    for b in range(2):
        aq, ak = [nearest(x) for x in q[b]], [nearest(x) for x in k[b]]
        assert routing_assign(q[b], mu).tolist() == aq
        mask = routing_mask(q[b], k[b], mu)
        assert torch.equal(mask, loop_mask(12, 12, lambda i, j: aq[i] == ak[j]))
        assert torch.equal(routing_mask(q[b], k[b], mu, causal=True), mask.tril())


def test_kmeans_ema_update_closed_form_M7_16(gen):
    mu = randn(4, 3, gen=gen)
    x = randn(10, 3, gen=gen)
    a = torch.tensor([0, 0, 1, 2, 2, 2, 0, 1, 1, 0])                   # cluster 3 gets nothing
    new = kmeans_ema_update(mu, x, a, decay=0.9)
    for c in range(3):
        assert_close(new[c], 0.9 * mu[c] + 0.1 * x[a == c].mean(0))
    assert torch.equal(new[3], mu[3])
    with pytest.raises(ValueError, match="assignments"):
        kmeans_ema_update(mu, x, a[:5])


def test_routing_attention_equals_per_cluster_dense_M7_16(gen):
    """Balanced routing ≡ for each cluster, dense masked attention with "query among the cluster's top-w
    queries and key among its top-w keys", averaged over the clusters that hold the query (outputs and gradients)."""
    q, k, v = (randn(2, 14, 6, gen=gen, requires_grad=True) for _ in range(3))
    mu, cot = randn(3, 6, gen=gen), randn(2, 14, 6, gen=gen)
    w = 5
    ours = routing_attention(q, k, v, mu, w)
    outs, counts = torch.zeros(2, 14, 6, dtype=F64), torch.zeros(2, 14, 1, dtype=F64)
    for b in range(2):
        for c in range(3):
            cos = lambda x: [(x[b, i] @ mu[c] / x[b, i].norm()).item() for i in range(14)]
            top_q = set(sorted(range(14), key=lambda i: -cos(q)[i])[:w])
            top_k = set(sorted(range(14), key=lambda j: -cos(k)[j])[:w])
            mask = loop_mask(14, 14, lambda i, j: i in top_q and j in top_k)
            rows = torch.tensor([i in top_q for i in range(14)], dtype=F64)[:, None]
            outs[b] = outs[b] + dense_masked_attention(q[b], k[b], v[b], mask) * rows
            counts[b] += rows
    ref = outs / counts.clamp(min=1)
    assert_close(ours, ref)
    for g1, g2 in zip(grads(ours, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(g1, g2)
    with pytest.raises(ValueError, match="window"):
        routing_attention(q, k, v, mu, 15)


# ----------------------------------------------------------------------------- M7.17 DCA
def test_dca_positions_M7_17():
    """Max relative position c − 1; the parts cover every causal pair exactly once (no sparsity, E7.6)."""
    c, s, w, L = 16, 12, 4, 64
    full = dca_position_matrix(L, c, s, w)
    assert int(full.max()) == c - 1
    assert torch.equal(full >= 0, torch.ones(L, L, dtype=torch.bool).tril())
    parts = [dca_position_matrix(L, c, s, w, part=p) >= 0 for p in ("intra", "successive", "inter")]
    assert sum(int(p.sum()) for p in parts) == L * (L + 1) // 2
    intra = dca_position_matrix(L, c, s, w, part="intra")
    assert torch.equal(intra, loop_mask(L, L, lambda i, j: i // s == j // s and j <= i).long() * 0
                       + torch.tensor([[i - j if i // s == j // s and j <= i else -1 for j in range(L)]
                                       for i in range(L)]))
    succ = torch.tensor([[(s + i % s if i % s < w else c - 1) - j % s if i // s == j // s + 1 else -1
                          for j in range(L)] for i in range(L)])
    assert torch.equal(dca_position_matrix(L, c, s, w, part="successive"), succ)
    with pytest.raises(ValueError, match="pretrain_len"):
        dca_position_matrix(L, 10, 8, 4)


@pytest.mark.parametrize("L", [24, 29])
def test_dca_attention_equals_loop_M7_17(L, gen):
    """Three rotated query copies merged by merge_partials ≡ the loop over q_iᵀ R(M_ij) k_j (fp32: the RoPE
    angle tables are fp32 in both, so fp32 tolerance)."""
    q, k, v = (randn(2, L, 8, gen=gen, dtype=torch.float32, requires_grad=True) for _ in range(3))
    cot = randn(2, L, 8, gen=gen, dtype=torch.float32)
    ours = dca_attention(q, k, v, 16, 8, 4)
    ref = dca_attention_reference(q, k, v, 16, 8, 4)
    assert_close(ours, ref)
    for g1, g2 in zip(grads(ours, (q, k, v), cot), grads(ref, (q, k, v), cot)):
        assert_close(g1, g2)


# ----------------------------------------------------------------------------- half precision and bad input
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_new_kernels_half_precision_M7_8_M7_10_M7_13_M7_16_M7_17(dtype, gen):
    """fp16/bf16 inputs are computed in fp32 and returned in their dtype: equal, within one rounding to the
    half type (the dtype's tolerance), to fp64 on the same rounded inputs."""
    q, k, v = (randn(2, 16, 8, gen=gen).to(dtype) for _ in range(3))
    mu = randn(3, 8, gen=gen)
    kernels = {"blockwise": lambda a, b, c: blockwise_attention(a, b, c, 4, [1, 0, 3, 2]),
               "lsh": lambda a, b, c: lsh_attention(a, c, 4, 4, 2, seed=0),
               "routing": lambda a, b, c: routing_attention(a, b, c, mu.to(a.dtype), 6),
               "dca": lambda a, b, c: dca_attention(a, b, c, 8, 6, 2),
               "longformer": lambda a, b, c: longformer_attention(a, b, c, 2, [0, 9])}
    for name, fn in kernels.items():
        out = fn(q, k, v)
        assert out.dtype == dtype, name
        assert_close(out, fn(q.double(), k.double(), v.double()), name=name)


def test_new_builders_reject_bad_arguments_M7_1(gen):
    x = randn(8, 4, gen=gen)
    cases = [(ValueError, "q_block", lambda: local1d_mask(8, 0, 2)),
             (ValueError, "mem_len", lambda: local1d_mask(8, 2, -1)),
             (ValueError, "ext_w", lambda: local2d_mask(4, 4, 2, 2, 1, -1)),
             (ValueError, "segment_ids", lambda: etc_masks(torch.tensor([0.5, 1.0]), 1)),
             (ValueError, "chunk_len", lambda: lsh_attention(x, x, 2, 0)),
             (ValueError, "qk and v", lambda: lsh_attention(x, x[:5], 2, 4)),
             (TypeError, "RevBlock", lambda: reversible_sequence([nn.Identity()], x, x)),
             (ValueError, "n_chunks", lambda: chunked_ff(nn.Identity(), x, 0)),
             (ValueError, "centroids", lambda: routing_assign(x, randn(3, 5, gen=gen))),
             (ValueError, "decay", lambda: kmeans_ema_update(randn(3, 4, gen=gen), x, torch.zeros(8), 1.5)),
             (ValueError, "local_window", lambda: dca_attention(x, x, x, 16, 4, 6)),
             (ValueError, "square", lambda: graph_diameter(torch.ones(3, 4, dtype=torch.bool)))]
    for err, text, call in cases:
        with pytest.raises(err, match=text):
            call()
