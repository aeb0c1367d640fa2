"""Chapter 7 against independent, maintained implementations (test-only dependencies, pinned in
requirements.txt; see shared/notes/oracles.md): `local-attention` for windowed attention,
`reformer-pytorch` and Hugging Face's `LSHSelfAttention` for Reformer LSH attention, Hugging Face's
`LongformerSelfAttention` for Longformer's window + global pattern, `BigBirdBlockSparseAttention` for
block-sparse attention with a BigBird layout, `routing-transformer` for balanced k-means routing attention
(M7.2, M7.10, M7.11, M7.13, M7.16).
All in fp32, so the fp32 tolerance of `assert_close`.
"""
import pytest
import torch

from xfam_lib.sparse import (block_sparse_attention, dense_masked_attention, longformer_mask, lsh_attention,
                             routing_attention, sliding_window_attention)
from xfam_lib.testing import assert_close

local_attention = pytest.importorskip("local_attention")
reformer_pytorch = pytest.importorskip("reformer_pytorch")
routing_transformer = pytest.importorskip("routing_transformer")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("causal,T,W", [(True, 12, 4), (False, 12, 4), (True, 32, 8), (False, 30, 5)])
def test_sliding_window_vs_local_attention_package_M7_2(causal, T, W):
    """LocalAttention with exact_windowsize keeps |i − j| <= W (causal: 0 <= i − j <= W) inside its
    blocks of W, the same band; it needs T % W == 0 unless autopad."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, T, 8) for _ in range(3))
    theirs = local_attention.LocalAttention(W, causal=causal, look_forward=0 if causal else 1,
                                            exact_windowsize=True, autopad=True)(q, k, v)
    assert_close(sliding_window_attention(q, k, v, W, causal=causal), theirs)


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_attention_vs_reformer_pytorch_M7_13(causal):
    """reformer-pytorch's LSHAttention with one hash round, fed its own bucket ids: the same sort by
    (bucket, position), chunks of bucket_size that see themselves and the previous chunk (cyclically),
    keys q/|q|, scale d^-1/2, and a finite self logit. (With several rounds it chunks the rounds'
    concatenated order, so its first chunk of a round looks back into the previous round: a different
    window, not compared.)"""
    T, d, bs = 32, 4, 4
    torch.manual_seed(0)
    qk, v = torch.randn(2, T, d), torch.randn(2, T, d)
    torch.manual_seed(123)
    theirs, _, buckets = reformer_pytorch.LSHAttention(bucket_size=bs, n_hashes=1, causal=causal)(qk, v)
    ours = lsh_attention(qk, v, T // bs, bs, 1, causal=causal, buckets=buckets.view(2, 1, T))
    assert_close(ours, theirs)


def test_lsh_attention_vs_hugging_face_reformer_M7_13():
    """HF LSHSelfAttention with one chunk covering the sequence and 2 hash rounds: full shared-QK attention
    with self-masking, rounds merged by logsumexp. HF's logits have no 1/sqrt(d) (scale=1) and its keys
    are x / sqrt(mean(x²) + 1e-6) / sqrt(d), which differs from x/|x| by ~1e-6 relative: within fp32."""
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    L, H, dh = 16, 2, 4
    cfg = ReformerConfig(hidden_size=8, num_attention_heads=H, attention_head_size=dh, num_buckets=4, num_hashes=2,
                         lsh_attn_chunk_length=L, lsh_num_chunks_before=0, lsh_num_chunks_after=0, is_decoder=False,
                         hash_seed=0, lsh_attention_probs_dropout_prob=0.0)
    rng_state = torch.get_rng_state()                                  # hash_seed reseeds the global RNG
    torch.manual_seed(0)
    layer = LSHSelfAttention(cfg).eval()
    x = torch.randn(1, L, 8)
    with torch.no_grad():
        theirs = layer(x).hidden_states
        qk = (x @ layer.query_key.weight.T).view(1, L, H, dh).transpose(1, 2)
        v = (x @ layer.value.weight.T).view(1, L, H, dh).transpose(1, 2)
        ours = lsh_attention(qk, v, 4, L, 2, scale=1.0).transpose(1, 2).reshape(1, L, H * dh)
    torch.set_rng_state(rng_state)
    assert_close(ours, theirs)


def test_longformer_vs_hugging_face_M7_10():
    """HF LongformerSelfAttention (attention_window = 2w): local rows ≡ sliding_window_attention without
    globals and ≡ dense attention with longformer_mask with a global token; the global token's own row
    uses Longformer's separate global projections over every key."""
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    w, L, H, dh = 2, 16, 2, 4
    torch.manual_seed(0)
    layer = LongformerSelfAttention(LongformerConfig(hidden_size=H * dh, num_attention_heads=H, attention_window=[2 * w],
                                                     attention_probs_dropout_prob=0.0), layer_id=0).eval()
    x = torch.randn(1, L, H * dh)
    heads = lambda lin: lin(x).view(1, L, H, dh).transpose(1, 2)
    merge = lambda t: t.transpose(1, 2).reshape(1, L, H * dh)
    with torch.no_grad():
        q, k, v = heads(layer.query), heads(layer.key), heads(layer.value)
        flags = torch.zeros(1, L)
        theirs = layer(x, attention_mask=flags, is_index_masked=flags < 0, is_index_global_attn=flags > 0,
                       is_global_attn=False)[0]
        assert_close(merge(sliding_window_attention(q, k, v, w)), theirs)

        flags[0, 0] = 10000                                             # token 0 is global
        theirs = layer(x, attention_mask=flags, is_index_masked=flags < 0, is_index_global_attn=flags > 0,
                       is_global_attn=True)[0]
        ours = merge(dense_masked_attention(q, k, v, longformer_mask(L, w, global_idx=[0])))
        assert_close(ours[:, 1:], theirs[:, 1:])
        qg, kg, vg = heads(layer.query_global), heads(layer.key_global), heads(layer.value_global)
        row0 = dense_masked_attention(qg[..., :1, :], kg, vg, torch.ones(1, L, dtype=torch.bool))
        assert_close(merge_row(row0), theirs[:, :1])


def merge_row(t):
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


def test_routing_attention_vs_routing_transformer_M7_16():
    """routing-transformer's KmeansAttention (eval, fixed unit centroids, non-causal, no memory keys): each
    cluster's top-window queries and keys by cosine, outputs averaged over clusters as sum / (count + 1e-5).
    That 1e-5 is undone here with the counts recomputed from the centroids (a 1e-5 relative bias, the
    size of the fp32 tolerance itself)."""
    b, h, t, d, n_c, w = 2, 1, 16, 8, 4, 4
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    mu = torch.nn.functional.normalize(torch.randn(h, n_c, d), dim=-1)
    layer = routing_transformer.KmeansAttention(n_c, w, h, d).eval()
    layer.kmeans.means.copy_(mu)
    layer.kmeans.initted.fill_(True)
    with torch.no_grad():
        theirs, _ = layer(q, k, v)
    top = (torch.nn.functional.normalize(q, dim=-1) @ mu[0].T).topk(w, dim=-2).indices        # (b, h, w, C)
    count = torch.zeros(b, h, t).scatter_add(-1, top.flatten(-2), torch.ones(b, h, w * n_c))
    assert_close(routing_attention(q, k, v, mu[0], w), theirs * ((count + 1e-5) / count.clamp(min=1)).unsqueeze(-1))


def test_block_sparse_vs_hugging_face_bigbird_M7_11():
    """HF BigBirdBlockSparseAttention (ITC: first and last block global, window ±1 block, r random blocks per
    middle query block and head) against `block_sparse_attention` with the per-head layout it used. In eval
    mode HF's random block ids are all 0 (block 0 then counts 1 + r times in a row's softmax), so the layer
    runs in train mode, which seeds numpy with the layer's seed; the random ids are drawn again with HF's
    own `_bigbird_block_rand_mask_with_head` after reseeding. The module has no dropout."""
    import numpy as np
    from transformers import BigBirdConfig
    from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdModel

    bs, nb, H, dh, r = 4, 16, 2, 4, 2
    L = bs * nb
    cfg = BigBirdConfig(hidden_size=H * dh, num_attention_heads=H, block_size=bs, num_random_blocks=r,
                        attention_type="block_sparse", max_position_embeddings=L)
    torch.manual_seed(0)
    layer = BigBirdBlockSparseAttention(cfg, seed=3).train()
    x = torch.randn(1, L, H * dh)
    blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(torch.ones(1, L), bs)
    np_state = np.random.get_state()
    with torch.no_grad():
        theirs, _ = layer(x, band_mask=band, from_mask=from_mask, to_mask=to_mask, from_blocked_mask=blocked,
                          to_blocked_mask=blocked)
        np.random.seed(3)
        plan, plan_r = layer._get_rand_attn_plan(L, bs, r)
        rand = torch.as_tensor(np.stack(layer._bigbird_block_rand_mask_with_head(L, L, bs, bs, H, plan, plan_r))).long()
    np.random.set_state(np_state)
    blocks = torch.arange(nb)
    layout = (blocks[:, None] - blocks[None, :]).abs() <= 1
    layout[[0, -1], :] = True
    layout[:, [0, -1]] = True
    layout = layout.repeat(H, 1, 1)
    for h in range(H):
        for row in range(1, nb - 1):
            assert not layout[h, row, rand[h, row - 1]].any()       # random blocks are new: no multiplicity
            layout[h, row, rand[h, row - 1]] = True
    heads = lambda lin: lin(x).view(1, L, H, dh).transpose(1, 2)
    with torch.no_grad():
        ours = block_sparse_attention(heads(layer.query), heads(layer.key), heads(layer.value), layout, bs)
    assert_close(ours.transpose(1, 2).reshape(1, L, H * dh), theirs)
