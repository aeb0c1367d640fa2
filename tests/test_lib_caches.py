"""Caches inside the library: position tables built in inference mode serve later training steps; the ALiBi,
T5 and Transformer-XL tables are built once and sliced while decoding; cached decoding equals recomputation at
the level of logits for every positional option of the decoder LM (M1.20, M1.21, M4.7, M4.8, M4.12)."""
import pytest
import torch

from xfam_lib import positional
from xfam_lib.positional import XLRelativeAttention, apply_rope
from xfam_lib.testing import assert_close
from xfam_lib.transformer import TransformerLM, generate


def rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- inference mode, then training
def test_rope_table_built_in_inference_mode_serves_a_training_step(monkeypatch):
    monkeypatch.setattr(positional, "_TABLES", {})                    # start from no table at all
    with torch.inference_mode():
        apply_rope(rand(2, 7, 16))                                      # the first call builds the cached table
    assert not any(t.is_inference() for pair in positional._TABLES.values() for t in pair)
    x = rand(2, 7, 16, seed=1).requires_grad_()
    (apply_rope(x) * rand(2, 7, 16, seed=2)).sum().backward()          # saves cos/sin for backward
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("kind", ["alibi", "t5", "rope", "xl"])
def test_lm_decoded_in_inference_mode_then_trained(kind):
    """generate() under inference_mode fills every position cache; a training step afterwards still works and
    its gradient equals that of a fresh copy of the model that never decoded."""
    torch.manual_seed(0)
    model = TransformerLM(20, 16, 1, 2, positional=kind, max_len=32, relative_max_distance=24)
    fresh = TransformerLM(20, 16, 1, 2, positional=kind, max_len=32, relative_max_distance=24)
    fresh.load_state_dict(model.state_dict())
    ids = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        generate(model, ids, 6)                                        # prefill at the training length, then more
    grads = []
    for m in (model, fresh):
        m.zero_grad()
        torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    assert_close(grads[0], grads[1])


# ----------------------------------------------------------------------------- one table, sliced
def test_alibi_and_t5_caches_stay_bounded_while_decoding():
    torch.manual_seed(0)
    for kind in ("alibi", "t5"):
        model = TransformerLM(20, 16, 1, 2, positional=kind, max_len=256).eval()
        generate(model, torch.randint(0, 20, (1, 4)), 100)
        tables = model.pos_bias._tables
        assert len(tables) == 1
        (table,) = tables.values()
        assert 2 * 104 - 1 <= table.shape[-1] <= 4 * 104                # one vector over offsets, doubled


def test_xl_distance_keys_are_projected_once_while_decoding(monkeypatch):
    """With a KV cache of max_len 40, decoding projects the 40 distance keys once; without grad a longer input
    grows the table; a change of r_proj's weight, in place or by a new tensor, is noticed."""
    torch.manual_seed(0)
    attn = XLRelativeAttention(16, 2).double().eval()
    calls = []
    original = XLRelativeAttention._project_distances
    monkeypatch.setattr(XLRelativeAttention, "_project_distances",
                        lambda self, n, device, dtype: calls.append(n) or original(self, n, device, dtype))
    x = rand(1, 40, 16)
    cache = attn.make_cache(1, 40)
    with torch.no_grad():
        steps = [attn(x[:, :5], cache=cache)] + [attn(x[:, t:t + 1], cache=cache) for t in range(5, 40)]
        assert calls == [40]
        assert_close(torch.cat(steps, 1), attn(x))                       # cached decoding == one full pass
        attn.r_proj.weight.mul_(1.5)                                     # in place: the version changes
        r = attn.distance_keys(12)
        assert len(calls) == 2
        assert_close(r, attn._project_distances(12, "cpu", torch.float64))
        attn.r_proj.weight = torch.nn.Parameter(attn.r_proj.weight.clone() * 2.0)   # a new tensor
        r = attn.distance_keys(12)
        assert len(calls) == 4
        assert_close(r, attn._project_distances(12, "cpu", torch.float64))
        attn.distance_keys(90)                                            # longer than the table: grown
        assert calls[-1] >= 90
    n_before = len(calls)
    attn.distance_keys(10)                                               # with grad: computed afresh, not cached
    assert len(calls) == n_before + 1


# ----------------------------------------------------------------------------- logits, every positional option
@pytest.mark.parametrize("kind", TransformerLM.POSITIONAL)
def test_cached_decoding_logits_equal_recomputation_for_every_positional_option(kind):
    """Prefill 5 tokens, then decode one token at a time and in a chunk of 3: every step's logits equal the
    full forward pass (fp64), for each positional option (M1.20, M1.21)."""
    torch.manual_seed(0)
    clip = 20 if kind == "t5" else 6                                     # T5 needs more than its 16 exact buckets
    model = TransformerLM(20, 32, 2, 4, 2, positional=kind, max_len=24, relative_max_distance=clip).double().eval()
    with torch.no_grad():                                                # make every positional parameter matter
        for name, p in model.named_parameters():
            if any(key in name for key in ("pos", "rel_k", "rel_v", ".u", ".v")) and "proj" not in name:
                p.normal_()
    ids = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = model.make_cache(2, 12)
        pieces = [model(ids[:, :5], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(5, 9)]
        pieces.append(model(ids[:, 9:], cache=cache))
    assert_close(torch.cat(pieces, 1), full, name=f"{kind}: cached vs full logits")


def test_rope_layer_refuses_cross_attention():
    """RoPE rotates positions of one sequence: a layer built with rope= attending to kv= (another
    sequence, whose CrossKVCache keeps unrotated keys) raises instead of mixing the two numberings."""
    from xfam_lib.attention import CrossKVCache, MultiHeadAttention
    from xfam_lib.positional import RotaryEmbedding
    layer = MultiHeadAttention(16, 2, rope=RotaryEmbedding())
    x, memory = torch.randn(1, 3, 16), torch.randn(1, 5, 16)
    for cache in (None, CrossKVCache()):
        with pytest.raises(ValueError, match="rope= is for self-attention"):
            layer(x, kv=memory, cache=cache)
    assert layer(x, causal=True).shape == x.shape
