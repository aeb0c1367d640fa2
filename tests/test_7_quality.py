"""Chapter 7: what a sparse pattern costs in quality (the stacked recall models) and how a tiled kernel
sees a mask (tile occupancy against a double loop and against FlexAttention's BlockMask)."""
import pytest
import torch

from xfam_lib import sparse
from xfam_lib.ablations import StackedRecallNet, sparse_recall_mask, train_sparse_recall


def _tiles_by_loop(mask, b):
    n_q, n_k = -(-mask.shape[0] // b), -(-mask.shape[1] // b)
    partial = torch.zeros(n_q, n_k, dtype=torch.bool)
    full = torch.zeros(n_q, n_k, dtype=torch.bool)
    for a in range(n_q):
        for c in range(n_k):
            tile = mask[a * b:(a + 1) * b, c * b:(c + 1) * b]
            whole = tile.shape == (b, b) and bool(tile.all())
            full[a, c] = whole
            partial[a, c] = bool(tile.any()) and not whole
    return partial, full


@pytest.mark.parametrize("L,b", [(32, 8), (45, 8), (30, 7)])
def test_tile_occupancy_matches_a_double_loop(L, b):
    gen = torch.Generator().manual_seed(L)
    masks = [sparse.sliding_window_mask(L, 3, causal=True), sparse.strided_mask(L, 5),
             torch.rand(L, L, generator=gen) < 0.1, torch.ones(L, L, dtype=torch.bool)]
    for mask in masks:
        partial, full = sparse.tile_occupancy(mask, b)
        ref_partial, ref_full = _tiles_by_loop(mask, b)
        assert torch.equal(partial, ref_partial) and torch.equal(full, ref_full)


def test_tile_occupancy_of_an_expanded_layout_is_the_layout():
    layout = sparse.bigbird_layout(8, 1, 1, 1, seed=3)
    partial, full = sparse.tile_occupancy(sparse.expand_layout(layout, 4), 4)
    assert torch.equal(full, layout) and not partial.any()


def test_tile_occupancy_rejects_a_float_mask():
    with pytest.raises(TypeError, match="mask must be boolean"):
        sparse.tile_occupancy(torch.ones(4, 4), 2)


def test_tile_occupancy_counts_equal_flex_attention_block_mask():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    L, b = 128, 16
    for mask in (sparse.sliding_window_mask(L, 8, causal=True), sparse.strided_mask(L, 11),
                 sparse.expand_layout(sparse.bigbird_layout(L // b, 1, 1, 1, seed=0), b)):
        block_mask = flex.create_block_mask(lambda _b, _h, q, kv: mask[q, kv], None, None, L, L,
                                            device="cpu", BLOCK_SIZE=b)
        partial, full = sparse.tile_occupancy(mask, b)
        assert int(block_mask.kv_num_blocks.sum()) == int(partial.sum())
        full_count = 0 if block_mask.full_kv_num_blocks is None else int(block_mask.full_kv_num_blocks.sum())
        assert full_count == int(full.sum())
        assert torch.equal(block_mask.to_dense()[0, 0].bool(), partial | full)


def test_sparse_recall_mask_rejects_an_unknown_pattern():
    with pytest.raises(ValueError, match="pattern must be one of"):
        sparse_recall_mask("ring", 16, n_global=4, window=2, block=4)
    with pytest.raises(ValueError, match="BigBird needs length"):
        sparse_recall_mask("BigBird", 18, n_global=4, window=2, block=4)


def test_stacked_models_are_independent_and_respect_their_masks():
    """A window model's output at the last position ignores a token beyond its reach; the dense model's
    does not; and one model's loss sends no gradient into another model's weights."""
    L, window, n_layers = 24, 2, 2
    masks = torch.stack([sparse_recall_mask(p, L, n_global=4, window=window, block=4)
                         for p in ("dense", "window")])
    net = StackedRecallNet(20, L, masks, [False, False], [0, 0], d_model=16, n_heads=2, n_layers=n_layers)
    ids = torch.randint(2, 20, (2, 3, L), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    far = L - 1 - n_layers * window - 2                      # beyond the reach, with the shift
    changed[:, :, far] = (changed[:, :, far] - 2 + 1) % 18 + 2
    with torch.no_grad():
        delta = (net(ids) - net(changed))[:, :, -1].abs().amax((1, 2))
    assert delta[0] > 1e-4 and delta[1] == 0
    net(ids)[1].sum().backward()
    assert all(p.grad[0].abs().max() == 0 and p.grad[1].abs().max() > 0
               for name, p in net.p.items() if name.endswith("_w"))


def test_stacked_model_rejects_mismatched_flags():
    with pytest.raises(ValueError, match="one lsh flag and one seed per model"):
        StackedRecallNet(20, 8, torch.ones(2, 8, 8, dtype=torch.bool), [False], [0, 1])


@pytest.mark.slow
def test_window_cannot_recall_beyond_its_reach_while_dense_can():
    r = train_sparse_recall(("dense", "window"), seeds=(0,), n_pairs=4, steps=150, batch=16, eval_batch=128,
                            window=2)
    assert r["accuracy_far"]["window"][0] < 3 * r["chance"]
    assert r["accuracy_far"]["dense"][0] > 0.8


@pytest.mark.parametrize("L,chunk_len,n_rounds,causal", [(12, 3, 1, False), (13, 4, 2, False), (10, 3, 3, True)])
def test_lsh_pairs_are_the_chunk_pairs_of_a_loop(L, chunk_len, n_rounds, causal):
    buckets = torch.randint(0, 4, (2, n_rounds, L), generator=torch.Generator().manual_seed(L))
    pairs = sparse.lsh_pairs(buckets, chunk_len, causal)
    n_chunks = -(-L // chunk_len)
    for b in range(2):
        ref = torch.zeros(L, L, dtype=torch.bool)
        for r in range(n_rounds):
            order = sorted(range(L), key=lambda i: (buckets[b, r, i].item(), i))
            chunk = {pos: rank // chunk_len for rank, pos in enumerate(order)}
            for i in range(L):
                for j in range(L):
                    ref[i, j] |= chunk[j] in (chunk[i], (chunk[i] - 1) % n_chunks) and not (causal and j > i)
        assert torch.equal(pairs[b], ref)


def test_lsh_pairs_rejects_float_buckets():
    with pytest.raises(ValueError, match="buckets must be integer ids"):
        sparse.lsh_pairs(torch.zeros(1, 8), 4)


def test_stacked_lsh_model_records_the_share_of_pairs_it_scores():
    """One round: every query scores its chunk and the one before, 2 * chunk_len of L keys; two rounds
    score more, but at most twice as many."""
    L, c = 24, 4
    ids = torch.randint(2, 20, (1, 3, L), generator=torch.Generator().manual_seed(1))
    shares = []
    for rounds in (1, 2):
        net = StackedRecallNet(20, L, torch.ones(1, L, L, dtype=torch.bool), [True], [0], d_model=16, n_heads=2,
                               n_layers=2, n_buckets=4, chunk_len=c, n_rounds=rounds)
        net.lsh_density = []
        with torch.no_grad():
            net(ids)
        assert len(net.lsh_density) == 2                                  # one entry per layer
        shares.append(torch.stack(net.lsh_density))
    assert torch.allclose(shares[0], torch.tensor(2 * c / L))
    assert (shares[1] > 2 * c / L).all() and (shares[1] <= 4 * c / L).all()


def test_window_and_global_window_are_set_apart():
    r = train_sparse_recall(("window", "window + global"), seeds=(0,), n_pairs=4, steps=1, batch=2, eval_batch=2,
                            n_global=2, window=3, global_window=1)
    L = 2 + 3 * 4
    assert r["density"]["window"] == sparse.nnz(sparse.sliding_window_mask(L, 3)) / L ** 2
    assert r["density"]["window + global"] == sparse.nnz(sparse.longformer_mask(L, 1, 1, range(2))) / L ** 2
