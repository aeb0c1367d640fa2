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
