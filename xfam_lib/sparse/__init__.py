"""Sparse attention (chapter 7), one module per topic: `masks` (patterns and the graph view), `kernels`
(the kernels that make masks pay), `content` (LSH and routing), `reversible` (memory for depth) and
`gallery` (the chapter's patterns side by side). Every public name imports from ``xfam_lib.sparse``.

* Pattern builders (boolean masks / block layouts): sliding window, dilated, Sparse Transformer strided
  and fixed, Image Transformer 1-D/2-D local, blockwise, Longformer, ETC, BigBird, sinks, DCA positions.
* The graph view: `nnz`, `receptive_field`, `hop_distances`, `graph_diameter`.
* Kernels, each beside its dense or loop reference: `sliding_window_attention`, `longformer_attention`,
  `block_sparse_attention`, `blockwise_attention`, `lsh_attention`, `routing_attention`, `dca_attention`.
* Memory for depth: `RevBlock` / `reversible_sequence`, `chunked_ff`, `checkpointed_sequence`.

Conventions (as in `xfam_lib.attention` and ``shared/API.md``):

* ``q, k, v`` are ``(..., L, d)``, usually ``(B, H, L, d)``; the sequence is dim -2.
* Every mask builder returns a boolean ``(L, L)`` tensor, **True = may attend**; row ``i`` is the
  query, column ``j`` the key.
* ``window`` counts neighbours on each side: the two-sided band is ``|i - j| <= window``, the causal
  band ``0 <= i - j <= window`` (the query and the ``window`` keys before it). This is what
  ``attention.causal_mask(L, window=...)`` means too.
* A block ``layout`` is boolean ``(ceil(Lq/bs), ceil(Lk/bs))``, or ``(H, ...)`` per head;
  `expand_layout` turns it into the token mask it stands for.
* Each efficient form has a dense reference: `scaled_dot_product_attention` with the mask the
  builders here return. A query row with no allowed key returns zeros.
"""
from .content import (SELF_LOGIT, kmeans_ema_update, lsh_attention, lsh_attention_reference, lsh_collision_rate,
                      lsh_hash, lsh_pairs, lsh_rotations, routing_assign, routing_attention, routing_mask)
from .gallery import (GALLERY, masked_attention_flops, pattern_mask, tile_occupancy)
from .kernels import (FactorizedSparseAttention, block_sparse_attention, blockwise_attention, dca_attention,
                      dca_attention_reference, dense_masked_attention, longformer_attention,
                      sliding_window_attention)
from .masks import (bigbird_layout, blockwise_layout, blockwise_mask, dca_position_matrix, dilated_mask,
                    etc_masks, expand_layout, fixed_layout, fixed_mask, graph_diameter, hop_distances,
                    local1d_mask, local2d_mask, longformer_mask, mask_to_bias, nnz, receptive_field,
                    sink_window_mask, sliding_window_mask, strided_mask)
from .reversible import (RevBlock, checkpointed_sequence, chunked_ff, reversible_sequence)

__all__ = [
    "sliding_window_mask",
    "dilated_mask",
    "strided_mask",
    "fixed_mask",
    "fixed_layout",
    "longformer_mask",
    "sink_window_mask",
    "bigbird_layout",
    "expand_layout",
    "sliding_window_attention",
    "block_sparse_attention",
    "longformer_attention",
    "dense_masked_attention",
    "FactorizedSparseAttention",
    "nnz",
    "receptive_field",
    "hop_distances",
    "graph_diameter",
    "local1d_mask",
    "local2d_mask",
    "blockwise_layout",
    "blockwise_mask",
    "blockwise_attention",
    "etc_masks",
    "mask_to_bias",
    "lsh_rotations",
    "lsh_hash",
    "lsh_collision_rate",
    "lsh_attention",
    "lsh_attention_reference",
    "lsh_pairs",
    "SELF_LOGIT",
    "RevBlock",
    "reversible_sequence",
    "chunked_ff",
    "checkpointed_sequence",
    "routing_assign",
    "routing_mask",
    "kmeans_ema_update",
    "routing_attention",
    "dca_position_matrix",
    "dca_attention",
    "dca_attention_reference",
    "GALLERY",
    "pattern_mask",
    "masked_attention_flops",
    "tile_occupancy",
]
