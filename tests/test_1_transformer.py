"""Transformer layers, models, decoding and the KV cache (M1.2, M1.4–M1.10, M1.16–M1.22)."""
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from xfam_lib import tasks
from xfam_lib.attention import KVCache, MultiHeadAttention
from xfam_lib.testing import assert_close, check_causal, copy_from_torch_layer, jacobian
from xfam_lib.train import cross_entropy, train_loop
from xfam_lib.transformer import (Decoder, DecoderLayer, Encoder, EncoderDecoder, EncoderLayer, FeedForward,
                                  RMSNorm, SwiGLU, TransformerLM, batch_norm, beam_search, count_params,
                                  embed_onehot, ffn_hidden_size, generate, greedy_decode, layer_norm,
                                  shift_right, teacher_forcing_loss)

D, H, FF = 16, 4, 32


def rand(*shape, gen=None):
    return torch.randn(*shape, dtype=torch.float64, generator=gen)


# ----------------------------------------------------------------------------- blocks
def test_embedding_is_onehot_matmul_M1_4(gen):
    emb = nn.Embedding(11, 6).double()
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    assert_close(embed_onehot(ids, emb.weight), emb(ids))


def test_ffn_jacobian_is_block_diagonal_and_ffn_is_not_linear_M1_5(gen):
    """M1.5: the position-wise FFN mixes no tokens (off-diagonal Jacobian blocks exactly 0) and is not linear."""
    ff = FeedForward(4, 8).double()
    x = rand(3, 4, gen=gen)
    jac = jacobian(ff, x).reshape(3, 4, 3, 4)
    for i, j in itertools.product(range(3), repeat=2):
        if i != j:
            assert torch.count_nonzero(jac[i, :, j, :]) == 0
    assert not torch.allclose(ff(2 * x), 2 * ff(x))
    assert not torch.allclose(jac[0, :, 0, :], jacobian(ff, x + 1.0).reshape(3, 4, 3, 4)[0, :, 0, :])


def test_testing_jacobian_equals_the_analytic_ffn_jacobian_M1_6(gen):
    """M1.6 tool: `testing.jacobian` returns d out / d in with outputs as rows; for the ReLU FFN that is
    W2 diag(1[x W1^T + b1 > 0]) W1, written out by hand."""
    ff = FeedForward(5, 7).double()
    x = rand(5, gen=gen)
    active = (ff.linear1(x) > 0).double()
    expected = ff.linear2.weight @ torch.diag(active) @ ff.linear1.weight
    assert_close(jacobian(ff, x), expected)
    assert not torch.allclose(expected, expected.T)                      # so a transposed Jacobian would fail


def test_pre_ln_layer_jacobian_is_the_product_of_identity_plus_sublayer_jacobians_M1_6(gen):
    """M1.6: a Pre-LN EncoderLayer is h = x + A(LN1(x)), y = h + F(LN2(h)), so by the chain rule its Jacobian is
    (I + J_F(h)) (I + J_A(x)), each sublayer's Jacobian computed on its own. A misplaced or missing residual
    connection in the layer breaks the equality; the identity path keeps the Jacobian far from 0 even when the
    sublayers' output weights are tiny."""
    torch.manual_seed(0)
    layer = EncoderLayer(6, 2, 12, norm_first=True).double().eval()
    x = rand(1, 3, 6, gen=gen)
    n = x.numel()
    attn = lambda t: layer.self_attn(layer.norm1(t))
    ffn = lambda t: layer.ff(layer.norm2(t))
    with torch.no_grad():
        h = x + attn(x)
    eye = torch.eye(n, dtype=torch.float64)
    expected = (eye + jacobian(ffn, h)) @ (eye + jacobian(attn, x))
    assert_close(jacobian(layer, x), expected)
    with torch.no_grad():
        for p in (layer.self_attn.out_proj.weight, layer.ff.linear2.weight):
            p.mul_(1e-6)
    assert_close(jacobian(layer, x), eye, atol=1e-4, rtol=0)             # the residual path alone


def test_layer_norm_and_batch_norm_match_torch_M1_7(gen):
    """M1.7: the functional LayerNorm ≡ nn.LayerNorm (statistics per position over features); BatchNorm ≡
    nn.BatchNorm1d in training mode on (B·T, d) (statistics per feature over batch and time)."""
    x = rand(4, 6, 8, gen=gen)
    ln = nn.LayerNorm(8).double()
    nn.init.normal_(ln.weight), nn.init.normal_(ln.bias)
    assert_close(layer_norm(x, ln.weight, ln.bias), ln(x))
    bn = nn.BatchNorm1d(8).double().train()
    nn.init.normal_(bn.weight), nn.init.normal_(bn.bias)
    assert_close(batch_norm(x, bn.weight, bn.bias), bn(x.reshape(-1, 8)).reshape(4, 6, 8))


def test_rmsnorm_formula_and_swiglu_width_M1_8(gen):
    x = rand(3, 8, gen=gen)
    norm = RMSNorm(8).double()
    assert_close(norm(x), x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6))
    # Llama-3-8B: dim 4096, multiple_of 1024, multiplier 1.3 -> hidden 14336 (its published FFN width)
    assert ffn_hidden_size(4096, 1024, 1.3) == 14336
    # Llama-2-7B: dim 4096, multiple_of 256, no multiplier -> 11008
    assert ffn_hidden_size(4096, 256) == 11008
    sw = SwiGLU(8, 12).double()
    assert_close(sw(x), (F.silu(x @ sw.w1.weight.T) * (x @ sw.w3.weight.T)) @ sw.w2.weight.T)


# ----------------------------------------------------------------------------- layers vs torch.nn (M1.9, M1.10, M1.22)
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch_M1_9_M1_22(norm_first, gen):
    torch.manual_seed(0)
    ours = EncoderLayer(D, H, FF, norm_first=norm_first).double().eval()
    theirs = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).double().eval()
    copy_from_torch_layer(ours, theirs)
    x = rand(2, 7, D, gen=gen)
    assert_close(ours(x), theirs(x))


def test_encoder_layer_parameter_count_closed_form_M1_9():
    d, d_ff = 512, 2048
    expected = (4 * d * d + 4 * d) + (2 * d * d_ff + d_ff + d) + 4 * d
    assert count_params(EncoderLayer(d, 8, d_ff)) == expected
    assert count_params(EncoderLayer(d, 8, d_ff)) == count_params(nn.TransformerEncoderLayer(d, 8, d_ff))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch_and_is_causal_M1_10(norm_first, gen):
    torch.manual_seed(0)
    ours = DecoderLayer(D, H, FF, norm_first=norm_first).double().eval()
    theirs = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).double().eval()
    copy_from_torch_layer(ours, theirs)
    x, mem = rand(2, 6, D, gen=gen), rand(2, 9, D, gen=gen)
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    assert_close(ours(x, mem), theirs(x, mem, tgt_mask=tgt_mask))
    assert check_causal(lambda t: ours(t, mem), x) == 0.0


def test_encoder_decoder_body_matches_nn_transformer_M1_2(gen):
    torch.manual_seed(0)
    enc = Encoder(D, H, FF, 2, final_norm=True).double().eval()
    dec = Decoder(D, H, FF, 2, final_norm=True).double().eval()
    ref = nn.Transformer(D, H, 2, 2, FF, dropout=0.0, batch_first=True).double().eval()
    for ours, theirs in zip(list(enc.layers) + list(dec.layers), list(ref.encoder.layers) + list(ref.decoder.layers)):
        copy_from_torch_layer(ours, theirs)
    enc.norm.load_state_dict(ref.encoder.norm.state_dict())
    dec.norm.load_state_dict(ref.decoder.norm.state_dict())
    src, tgt = rand(2, 8, D, gen=gen), rand(2, 5, D, gen=gen)
    expected = ref(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64))
    assert_close(dec(tgt, enc(src)), expected)


def test_encoder_output_is_one_vector_per_source_token_and_decoder_is_causal(gen):
    torch.manual_seed(0)
    model = EncoderDecoder(12, D, H, 2, 2, FF).double().eval()
    src = torch.randint(2, 12, (3, 7), generator=gen)
    tgt = torch.randint(2, 12, (3, 5), generator=gen)
    assert model.encode(src).shape == (3, 7, D)
    # perturbing later target tokens leaves earlier logits unchanged
    logits = model(src, tgt)
    tgt2 = tgt.clone()
    tgt2[:, 3:] = (tgt2[:, 3:] + 1 - 2) % 10 + 2
    assert_close(model(src, tgt2)[:, :3], logits[:, :3])
    assert not torch.allclose(model(src, tgt2)[:, 3:], logits[:, 3:])


def test_padding_in_source_is_ignored(gen):
    torch.manual_seed(0)
    model = EncoderDecoder(12, D, H, 1, 1, FF, pad_id=0).double().eval()
    src = torch.tensor([[5, 6, 7, 0, 0]])
    tgt = torch.tensor([[1, 4, 3]])
    other = torch.tensor([[5, 6, 7, 0, 0, 0, 0]])
    assert_close(model(src, tgt), model(other, tgt))


# ----------------------------------------------------------------------------- teacher forcing and the loss (M1.16, M1.17)
def test_shift_right():
    assert torch.equal(shift_right(torch.tensor([[5, 6, 7]]), 1), torch.tensor([[1, 5, 6]]))


def test_teacher_forcing_parallel_equals_sequential_M1_16(gen):
    torch.manual_seed(0)
    model = EncoderDecoder(12, D, H, 2, 2, FF).double().eval()
    src, tgt = tasks.reverse_task(2, 6, 12, generator=gen)
    tgt_in = shift_right(tgt, tasks.BOS)
    parallel = model(src, tgt_in)
    sequential = torch.stack([model(src, tgt_in[:, : t + 1])[:, -1] for t in range(6)], dim=1)
    assert_close(parallel, sequential, atol=1e-10)
    loss = teacher_forcing_loss(model, src, tgt, tasks.BOS)
    assert_close(loss, F.cross_entropy(parallel.reshape(-1, 12), tgt.reshape(-1)))


def test_cross_entropy_matches_torch_and_gradient_is_p_minus_y_M1_17(gen):
    logits = rand(4, 7, gen=gen).requires_grad_()
    targets = torch.randint(0, 7, (4,), generator=gen)
    loss = cross_entropy(logits, targets)
    assert_close(loss, F.cross_entropy(logits, targets))
    (grad,) = torch.autograd.grad(loss, logits)
    assert_close(grad, (torch.softmax(logits, -1) - F.one_hot(targets, 7)).detach() / 4)
    z = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64, requires_grad=True)
    cross_entropy(z[None], torch.tensor([0])).backward()
    e = torch.exp(torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64))
    assert_close(z.grad, e / e.sum() - torch.tensor([1.0, 0, 0], dtype=torch.float64))
    ignore = cross_entropy(logits, torch.tensor([1, -100, 2, 3]), ignore_index=-100)
    assert_close(ignore, F.cross_entropy(logits, torch.tensor([1, -100, 2, 3])))


# ----------------------------------------------------------------------------- decoding and the KV cache (M1.19–M1.21)
def test_kv_cache_update_and_errors():
    cache = KVCache(2, 6, 3, 4)
    k, v = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    keys, values = cache.update(k, v, 0)
    assert torch.equal(keys, k) and torch.equal(values, v) and cache.length == 4
    keys, values = cache.update(k[:, :, :2] + 1, v[:, :, :2] + 1, 4)
    assert torch.equal(keys, torch.cat([k, k[:, :, :2] + 1], 2)) and torch.equal(values, torch.cat([v, v[:, :, :2] + 1], 2))
    with pytest.raises(ValueError, match="overflow"):
        cache.update(k[:, :, :1], k[:, :, :1], 6)
    with pytest.raises(ValueError, match="start_pos"):
        cache.update(k, k, 7)                                             # positions 0..5 are filled
    keys, _ = cache.update(k[:1, :, :1], v[:1, :, :1], 2)                  # overwrite from position 2 (re-decoding)
    assert torch.equal(keys, k[:1, :, :3].index_copy(2, torch.tensor([2]), k[:1, :, :1])) and cache.length == 3
    assert cache.k.nbytes == 2 * 3 * 6 * 4 * 4


def test_lm_prefill_plus_decode_equals_full_forward_M1_20_M1_21(gen):
    torch.manual_seed(0)
    lm = TransformerLM(20, 32, 2, 4, 2).double().eval()
    ids = torch.randint(0, 20, (2, 9), generator=gen)
    full = lm(ids)
    cache = lm.make_cache(2, 9)
    pieces = [lm(ids[:, :5], cache=cache)] + [lm(ids[:, t:t + 1], cache=cache) for t in range(5, 9)]
    assert_close(torch.cat(pieces, dim=1), full)
    # chunked prefill: the second chunk uses the bottom-right causal mask
    cache = lm.make_cache(2, 9)
    chunks = torch.cat([lm(ids[:, :4], cache=cache), lm(ids[:, 4:], cache=cache)], dim=1)
    assert_close(chunks, full)


@pytest.mark.parametrize("positional", TransformerLM.POSITIONAL)
def test_generate_cached_equals_uncached_M1_19(positional, gen):
    torch.manual_seed(0)
    lm = TransformerLM(20, 32, 2, 4, 1, positional=positional, max_len=32).eval()
    prompt = torch.randint(0, 20, (3, 4), generator=gen)
    assert torch.equal(generate(lm, prompt, 8), generate(lm, prompt, 8, use_cache=False))
    # sampling draws the same random numbers either way, so cached and uncached samples agree too
    sampled_a = generate(lm, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(1))
    sampled_b = generate(lm, prompt, 8, temperature=1.0, generator=torch.Generator().manual_seed(1), use_cache=False)
    assert torch.equal(sampled_a, sampled_b)
    assert torch.equal(generate(lm, prompt, 8, temperature=1e-6), generate(lm, prompt, 8))


def test_encoder_decoder_greedy_cached_equals_uncached_M1_20(gen):
    torch.manual_seed(0)
    model = EncoderDecoder(12, D, H, 2, 2, FF).double().eval()
    src = torch.randint(2, 12, (4, 6), generator=gen)
    assert torch.equal(greedy_decode(model, src, tasks.BOS, 6), greedy_decode(model, src, tasks.BOS, 6, use_cache=False))


def test_beam_search_is_exact_with_a_full_beam_and_greedy_with_one(gen):
    torch.manual_seed(0)
    vocab, length = 4, 3
    model = EncoderDecoder(vocab, D, H, 1, 1, FF, pad_id=None).double().eval()
    src = torch.randint(0, vocab, (1, 5), generator=gen)
    tokens, score = beam_search(model, src, 1, length, beam_size=1)
    assert torch.equal(tokens, greedy_decode(model, src, 1, length)[0])

    def log_prob(seq):
        tgt = torch.tensor([seq])
        logits = model(src, shift_right(tgt, 1))
        return torch.log_softmax(logits, -1).gather(-1, tgt[..., None]).sum().item()

    best = max(itertools.product(range(vocab), repeat=length), key=log_prob)
    tokens, score = beam_search(model, src, 1, length, beam_size=vocab ** length)
    assert tuple(tokens.tolist()) == best
    assert abs(score - log_prob(best)) < 1e-9
    assert beam_search(model, src, 1, length, beam_size=3)[1] >= log_prob(greedy_decode(model, src, 1, length)[0].tolist()) - 1e-12


def test_generate_bad_input():
    lm = TransformerLM(10, 16, 1, 2)
    with pytest.raises(ValueError, match="prompt"):
        generate(lm, torch.zeros(4, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="temperature"):
        generate(lm, torch.zeros(1, 2, dtype=torch.long), 3, temperature=-1.0)
    with pytest.raises(ValueError, match="positional"):
        TransformerLM(10, 16, 1, 2, positional="alibi-typo")


def test_gqa_cache_is_smaller():
    mha, gqa = MultiHeadAttention(64, 8), MultiHeadAttention(64, 8, 2)
    assert mha.make_cache(1, 128).k.nbytes == 4 * gqa.make_cache(1, 128).k.nbytes


# ----------------------------------------------------------------------------- tasks and training
def test_tasks(gen):
    src, tgt = tasks.reverse_task(3, 5, 9, generator=gen)
    assert torch.equal(tgt, src.flip(-1)) and src.min() >= tasks.N_SPECIAL and src.max() < 9
    src, tgt = tasks.copy_task(2, 4, 9, generator=gen)
    assert torch.equal(src, tgt)
    seq, target = tasks.associative_recall(8, 3, 20, generator=gen)
    assert seq.shape == (8, 7)
    for row, t in zip(seq, target):
        keys, values = row[0:6:2], row[1:6:2]
        assert len(set(keys.tolist())) == 3
        assert values[(keys == row[-1]).nonzero()[0, 0]] == t
    with pytest.raises(ValueError, match="vocab"):
        tasks.reverse_task(2, 3, 2)


def test_train_loop_learns_and_warms_up():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    losses = train_loop(model, lambda m, s: F.mse_loss(m(x), y), steps=200, lr=0.05, warmup=10, progress=False)
    assert losses[-1] < 1e-3 * losses[0]
    with pytest.raises(FloatingPointError, match="step 0"):
        train_loop(model, lambda m, s: m(x).sum() * float("nan"), steps=3, lr=0.1, progress=False)


def test_encoder_layer_dropout_acts_on_the_branches_in_training_only_and_causal_hides_the_future():
    torch.manual_seed(0)
    plain = EncoderLayer(16, 4, 32, norm_first=True)
    dropped = EncoderLayer(16, 4, 32, norm_first=True, dropout=0.5)
    dropped.load_state_dict(plain.state_dict())               # dropout adds no parameters
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1))
    dropped.eval()
    assert torch.equal(dropped(x), plain(x))
    dropped.train()
    assert not torch.allclose(dropped(x), plain(x))
    later = x.clone()
    later[:, 3:] = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(2))  # only 3..5
    assert torch.equal(plain(x, causal=True)[:, :3], plain(later, causal=True)[:, :3])
    assert not torch.allclose(plain(x)[:, :3], plain(later)[:, :3])
    with pytest.raises(ValueError, match="dropout must be in"):
        EncoderLayer(16, 4, 32, dropout=1.0)
