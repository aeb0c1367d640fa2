"""Independent oracles from Hugging Face ``transformers`` (a test-only pin in requirements.txt; no weights are
downloaded): the default half-split RoPE, ``repeat_kv``, Llama attention with GQA, and a whole Llama-style
decoder LM (M1.21, M3.10, M4.9).

Hugging Face's Llama pairs dims ``(i, i + d/2)`` ("rotate_half"), our default layout; its frequencies
``base^(-2i/d)`` are computed in fp32, as ours are. Weights are copied module by module. Attention runs
through Hugging Face's SDPA path (its eager path takes the softmax in fp32 even for fp64 inputs), and the
whole model is compared in fp32 because Llama's RMSNorm always computes in fp32.
"""
import pytest
import torch

from xfam_lib.attention import MultiHeadAttention, repeat_kv
from xfam_lib.positional import RotaryEmbedding, apply_rope
from xfam_lib.testing import assert_close
from xfam_lib.transformer import TransformerLM

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")
ml = pytest.importorskip("transformers.models.llama.modeling_llama")


def llama_config(d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, n_layers=2, vocab=20, base=10000.0, attn="sdpa"):
    cfg = transformers.LlamaConfig(hidden_size=d_model, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                                   intermediate_size=d_ff, num_hidden_layers=n_layers, vocab_size=vocab,
                                   rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                                   max_position_embeddings=256, rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": base})
    cfg._attn_implementation = attn
    return cfg


def causal_additive(length, dtype):
    return torch.full((length, length), float("-inf"), dtype=dtype).triu(1)[None, None]


@pytest.mark.parametrize("d, base", [(8, 10000.0), (64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_default_rope_equals_hugging_face_llama_M4_9(d, base, dtype):
    """apply_rope(x, positions) with the default (half-split) layout ≡ ``apply_rotary_pos_emb`` with the cos/sin
    of ``LlamaRotaryEmbedding``, at positions from 0 and from a cache offset of 1000."""
    cfg = llama_config(d_model=d * 2, n_heads=2, n_kv_heads=2, base=base)
    rotary = ml.LlamaRotaryEmbedding(cfg)
    x = torch.randn(2, 3, 11, d, dtype=dtype, generator=torch.Generator().manual_seed(d))
    for start in (0, 1000):
        positions = torch.arange(start, start + 11)
        cos, sin = rotary(x, positions[None])
        theirs, _ = ml.apply_rotary_pos_emb(x, x, cos, sin)
        # both rotate by fp32 cos/sin; in fp64 they agree to fp64 round-off, in fp32 to fp32's
        assert_close(apply_rope(x, positions, base=base), theirs, name=f"start {start}")


@pytest.mark.parametrize("n_rep", [1, 2, 4])
def test_repeat_kv_equals_hugging_face_M3_10(n_rep):
    x = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(n_rep))
    assert torch.equal(repeat_kv(x, n_rep), ml.repeat_kv(x, n_rep))


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_gqa_attention_with_rope_equals_llama_attention_M3_10_M4_9(n_heads, n_kv_heads):
    """MultiHeadAttention(d, H, H_kv, bias=False, rope=RotaryEmbedding()) with causal=True ≡ ``LlamaAttention``
    (MHA, GQA and MQA) with the same projection weights and Llama's rotary embedding, outputs and input gradients."""
    torch.manual_seed(0)
    d = 32
    cfg = llama_config(d_model=d, n_heads=n_heads, n_kv_heads=n_kv_heads)
    theirs = ml.LlamaAttention(cfg, layer_idx=0).double()
    ours = MultiHeadAttention(d, n_heads, n_kv_heads, bias=False, rope=RotaryEmbedding(10000.0)).double()
    with torch.no_grad():
        for mine, hf in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("out_proj", "o_proj")):
            getattr(ours, mine).weight.copy_(getattr(theirs, hf).weight)
    x = torch.randn(2, 9, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    cos, sin = ml.LlamaRotaryEmbedding(cfg)(x, torch.arange(9)[None])
    ref, _ = theirs(x, position_embeddings=(cos, sin), attention_mask=causal_additive(9, torch.float64))
    out = ours(x, causal=True)
    assert_close(out, ref)
    cot = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert_close(torch.autograd.grad((out * cot).sum(), x)[0], torch.autograd.grad((ref * cot).sum(), x)[0])


def copy_into_llama(ours: TransformerLM, theirs) -> None:
    with torch.no_grad():
        theirs.model.embed_tokens.weight.copy_(ours.embed.weight)
        for block, layer in zip(ours.blocks, theirs.model.layers):
            for mine, hf in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("out_proj", "o_proj")):
                getattr(layer.self_attn, hf).weight.copy_(getattr(block.attn, mine).weight)
            layer.mlp.gate_proj.weight.copy_(block.ff.w1.weight)
            layer.mlp.up_proj.weight.copy_(block.ff.w3.weight)
            layer.mlp.down_proj.weight.copy_(block.ff.w2.weight)
            layer.input_layernorm.weight.copy_(block.attn_norm.weight)
            layer.post_attention_layernorm.weight.copy_(block.ff_norm.weight)
        theirs.model.norm.weight.copy_(ours.norm.weight)
        theirs.lm_head.weight.copy_(ours.head.weight)


def test_transformer_lm_equals_llama_for_causal_lm_M1_21():
    """The whole decoder-only LM (RMSNorm pre-norm, GQA, RoPE, SwiGLU, final norm, head) ≡ ``LlamaForCausalLM``
    with copied weights: the logits of every position, and the logits of cached decoding (fp32, the precision
    of Llama's RMSNorm)."""
    torch.manual_seed(0)
    ours = TransformerLM(20, 32, 2, 4, 2, d_ff=48).eval()
    with torch.no_grad():                                              # norms' weights away from 1, so they count
        for block in ours.blocks:
            block.attn_norm.weight.normal_(1.0, 0.3)
            block.ff_norm.weight.normal_(1.0, 0.3)
        ours.norm.weight.normal_(1.0, 0.3)
    theirs = ml.LlamaForCausalLM(llama_config()).eval()
    copy_into_llama(ours, theirs)
    ids = torch.randint(0, 20, (2, 13), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = theirs(ids).logits
        assert_close(ours(ids), ref)
        cache = ours.make_cache(2, 13)
        steps = [ours(ids[:, :6], cache=cache)] + [ours(ids[:, t:t + 1], cache=cache) for t in range(6, 13)]
    assert_close(torch.cat(steps, 1), ref)
