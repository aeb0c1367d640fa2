"""The length-extrapolation set-up (M4.15): the synthetic language, the positional options of TransformerLM
(ALiBi and T5 biases through MultiHeadAttention's bias=, Shaw and XL attention) and the experiment driver."""
import math

import pytest
import torch

from xfam_lib.attention import MultiHeadAttention, scaled_dot_product_attention
from xfam_lib.ablations import length_extrapolation
from xfam_lib.positional import alibi_bias
from xfam_lib.tasks import LaggedTopicLanguage
from xfam_lib.testing import assert_close, check_causal
from xfam_lib.transformer import TransformerLM, generate


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: one intra-op thread is faster, and much faster on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- the language
def test_language_follows_its_rule_M4_15():
    lang = LaggedTopicLanguage(vocab=16, lag=3, p_rule=0.6, topic_size=4, seed=1)
    a, logp_a = lang.sample(64, 50, generator=torch.Generator().manual_seed(5))
    assert a.shape == (64, 50) and a.min() >= 0 and a.max() < 16
    hits = (a[:, 3:] == lang.perm[a[:, :-3]]).double().mean().item()
    assert 0.6 < hits < 0.6 + 0.4 / 4 + 0.05              # the rule, plus topic draws that happen to match it
    assert (logp_a <= 0).all() and torch.isfinite(logp_a).all()


def test_language_oracle_probabilities_M4_15():
    """Check the oracle log-probability by enumerating the process's cases for each token."""
    lang = LaggedTopicLanguage(vocab=8, lag=2, p_rule=0.5, topic_size=3, seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens, logp = lang.sample(4, 12, generator=gen)
    # re-draw the same topics: the first call on a fresh generator with the same seed
    topic = torch.rand(4, 8, generator=torch.Generator().manual_seed(0)).argsort(-1)[:, :3]
    for b in range(4):
        topic_set = set(topic[b].tolist())
        for t in range(12):
            x = int(tokens[b, t])
            p_topic = (1 / 3) if x in topic_set else 0.0
            if t < 2:
                p = p_topic
            else:
                p = 0.5 * p_topic + 0.5 * float(x == int(lang.perm[tokens[b, t - 2]]))
            assert logp[b, t].item() == pytest.approx(math.log(p))


def test_language_without_rule_has_entropy_log_topic_size_M4_15():
    lang = LaggedTopicLanguage(vocab=20, p_rule=0.0, topic_size=5)
    _, logp = lang.sample(8, 30)
    assert_close(-logp, torch.full((8, 30), math.log(5), dtype=torch.float64))


def test_language_bad_arguments_M4_15():
    with pytest.raises(ValueError, match="topic_size"):
        LaggedTopicLanguage(vocab=4, topic_size=5)
    with pytest.raises(ValueError, match="p_rule"):
        LaggedTopicLanguage(p_rule=1.0)


# ----------------------------------------------------------------------------- bias= through attention and the LM
def test_multihead_attention_passes_an_additive_bias_M4_12(gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64, generator=gen)
    bias = alibi_bias(4, 7, dtype=torch.float64)
    q = mha.q_proj(x).view(2, 7, 4, 4).transpose(1, 2)
    k = mha.k_proj(x).view(2, 7, 4, 4).transpose(1, 2)
    v = mha.v_proj(x).view(2, 7, 4, 4).transpose(1, 2)
    expected = mha.out_proj(scaled_dot_product_attention(q, k, v, bias=bias, causal=True).transpose(1, 2).reshape(2, 7, 16))
    assert_close(mha(x, causal=True, bias=bias), expected)
    assert not torch.allclose(mha(x, causal=True), expected)


@pytest.mark.parametrize("kind", ["alibi", "t5", "shaw", "xl"])
def test_cached_decoding_equals_recomputation_M4_15(kind):
    torch.manual_seed(0)
    model = TransformerLM(20, 32, 2, 4, 2, positional=kind, max_len=64, relative_max_distance=24).double().eval()
    with torch.no_grad():                                         # make every positional parameter matter
        for name, p in model.named_parameters():
            if any(key in name for key in ("pos_bias", "rel_k", "rel_v", ".u", ".v")) and "proj" not in name:
                p.normal_()
    prompt = torch.randint(0, 20, (2, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(generate(model, prompt, 8, use_cache=True), generate(model, prompt, 8, use_cache=False))
    ids = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(2))
    cache = model.make_cache(2, 9)
    chunks = torch.cat([model(ids[:, :4], cache=cache), model(ids[:, 4:5], cache=cache), model(ids[:, 5:], cache=cache)], 1)
    assert_close(chunks, model(ids))


@pytest.mark.parametrize("kind", ["none", "sinusoidal", "learned", "rope", "alibi", "t5", "shaw", "xl"])
def test_every_positional_option_is_causal_M4_15(kind):
    torch.manual_seed(0)
    model = TransformerLM(20, 32, 2, 4, positional=kind, max_len=40, relative_max_distance=24).double().eval()
    ids = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(2))
    embed = model.embed
    check_causal(lambda e: _forward_from_embeddings(model, e), embed(ids).detach(), atol=1e-10)


def _forward_from_embeddings(model, x):
    """TransformerLM.forward after the token lookup (so check_causal can perturb continuous inputs)."""
    L = x.shape[1]
    if model.positional in ("sinusoidal", "learned"):
        x = x + model.pos[:L]
    bias = None
    if model.positional == "alibi":
        bias = model.pos_bias(L, device=x.device, dtype=x.dtype)
    elif model.positional == "t5":
        bias = model.pos_bias(L).to(x.dtype)
    for block in model.blocks:
        x = block(x, None, bias=bias)
    return model.head(model.norm(x))


def test_bad_positional_option_and_cache_type_M4_15():
    with pytest.raises(ValueError, match="positional"):
        TransformerLM(20, 32, 1, 4, positional="alibi2")
    model = TransformerLM(20, 32, 1, 4, positional="shaw", max_len=40, relative_max_distance=8)
    with pytest.raises(TypeError, match="KVCache"):
        model.blocks[0].attn(torch.zeros(1, 3, 32), cache=object())


# ----------------------------------------------------------------------------- a window as a baseline (M4.16)
@pytest.mark.parametrize("length", [16, 64])
def test_window_truncation_ignores_everything_outside_the_window_M4_16(length):
    """M4.16: causal attention restricted by `causal_mask(L, window=3)` gives query i the keys i-3..i (query 10:
    [7, 8, 9, 10]); perturbing any key/value outside that band leaves its output exactly unchanged at every
    length, while full causal attention moves. Checked by perturbing one position at a time."""
    from xfam_lib.attention import causal_mask

    window = causal_mask(length, window=3)
    assert window[10].nonzero().flatten().tolist() == [7, 8, 9, 10]
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, 2, length, 8, dtype=torch.float64, generator=gen) for _ in range(3))
    for mask, must_ignore in ((window, ~window), (causal_mask(length), None)):
        base = scaled_dot_product_attention(q, k, v, mask)
        moved = torch.zeros(length, length, dtype=torch.bool)             # moved[i, j]: perturbing key j moved query i
        for j in range(length):
            k2, v2 = k.clone(), v.clone()
            k2[..., j, :] += 1.0
            v2[..., j, :] += 1.0
            moved[:, j] = (scaled_dot_product_attention(q, k2, v2, mask) != base).any(-1).any(0).any(0)
        if must_ignore is not None:
            assert not (moved & must_ignore).any() and torch.equal(moved, window)
        else:
            assert torch.equal(moved, causal_mask(length))                  # full attention: every earlier key matters


# ----------------------------------------------------------------------------- the driver
def test_length_extrapolation_smoke_M4_15():
    res = length_extrapolation(("alibi", "learned"), train_len=24, factors=(1, 2), steps=3, batch=4, d_model=16,
                               n_layers=1, n_heads=2, eval_tokens=96, seed=3)
    assert set(res["loss"]) == {"alibi", "learned"} and set(res["loss"]["alibi"]) == {24, 48}
    assert all(math.isfinite(v) for arm in res["loss"].values() for v in arm.values())
    assert len(res["per_position"]["alibi"]) == 48 and len(res["train_loss"]["learned"]) == 3
    assert 0 < res["oracle"][24] < math.log(32)
    assert res["config"]["relative_max_distance"] == 18


def test_char_length_extrapolation_scores_every_position_of_the_long_windows():
    """Tiny Shakespeare, two steps: one loss per position of windows factor x train_len long for each
    kind, every arm from the same seed (two calls agree exactly), and unknown kinds are refused."""
    from xfam_lib.ablations import char_length_extrapolation
    kw = dict(train_len=8, factor=3, steps=2, batch=2, d_model=8, n_layers=1, n_heads=2, eval_windows=2)
    a = char_length_extrapolation(("sinusoidal", "alibi"), **kw)
    b = char_length_extrapolation(("sinusoidal", "alibi"), **kw)
    assert {k: len(v) for k, v in a["per_position"].items()} == {"sinusoidal": 24, "alibi": 24}
    assert a["per_position"] == b["per_position"]
    assert a["per_position"]["sinusoidal"] != a["per_position"]["alibi"]
    with pytest.raises(ValueError, match="kinds"):
        char_length_extrapolation(("rotary",), **kw)
