"""Tests for xfam_lib.text (chapter 1's character language model, M1.25): the shipped corpus and its
split, batching, CharGPT's causality and initialisation, the AdamW parameter groups, and the trainer."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from xfam_lib.testing import check_causal
from xfam_lib.text import (DATA, CharGPT, decay_groups, estimate_loss, get_batch, gpt2_init, sample_text,
                           tiny_shakespeare, train_char_lm)


@pytest.fixture(scope="module")
def corpus():
    return tiny_shakespeare()


def test_M1_25_corpus_size_vocab_and_split(corpus):
    """1,115,394 characters, 65 of them distinct; the last 10 % are the validation split, in order."""
    assert len(corpus.text) == 1_115_394
    assert len(corpus.vocab) == 65 and list(corpus.vocab) == sorted(set(corpus.text))
    assert len(corpus.train) + len(corpus.val) == len(corpus.text)
    assert len(corpus.val) == len(corpus.text) - int(0.9 * len(corpus.text))
    assert corpus.decode(corpus.train[:200]) == corpus.text[:200]
    assert corpus.decode(corpus.val[-200:]) == corpus.text[-200:]
    assert corpus.text.startswith("First Citizen:\nBefore we proceed any further")


def test_M1_25_encode_decode_round_trip_and_errors(corpus):
    s = "ROMEO:\nBut, soft! what light?"
    ids = corpus.encode(s)
    assert ids.dtype == torch.long and corpus.decode(ids) == s
    assert corpus.vocab[ids[0]] == "R"
    with pytest.raises(ValueError, match=r"s contains characters outside the vocabulary: \['é'\]"):
        corpus.encode("café")
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 65\), got \[65\]"):
        corpus.decode([3, 65])
    with pytest.raises(ValueError, match="val_fraction"):
        tiny_shakespeare(val_fraction=1.0)


def test_M1_25_corpus_is_package_data():
    """The gzipped text sits inside the package, and pyproject ships it (so a wheel / Colab has it)."""
    assert DATA.exists() and DATA.parent.parent.name == "xfam_lib"
    pyproject = DATA.parents[2] / "pyproject.toml"
    if pyproject.exists():  # a source checkout
        assert 'xfam_lib = ["data/*.txt.gz"]' in pyproject.read_text()


def test_M1_25_get_batch_windows_and_targets():
    ids = torch.arange(100, 1100)
    x, y = get_batch(ids, 8, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 16)
    assert torch.equal(y, x + 1)                              # targets: the next id
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(8, 15, dtype=torch.long))  # contiguous windows
    assert x.min() >= 100 and y.max() <= 1099
    with pytest.raises(ValueError, match="too short for block=20"):
        get_batch(torch.arange(20), 2, 20)
    with pytest.raises(ValueError, match="ids"):
        get_batch(torch.zeros(4, 50, dtype=torch.long), 2, 8)


def test_M1_25_char_gpt_is_causal_and_checks_length():
    torch.manual_seed(0)
    net = CharGPT(11, 16, 2, 4, 12).double().eval()
    ids = torch.randint(0, 11, (2, 12))
    assert net(ids).shape == (2, 12, 11)
    assert check_causal(net, ids, position=5, dim=1) == 0.0
    with pytest.raises(ValueError, match=r"ids of shape \(2, 13\) are longer than block=12"):
        net(torch.zeros(2, 13, dtype=torch.long))
    for kwargs, match in (({"dropout": 1.0}, "dropout"), ({"init": "xavier"}, "init")):
        with pytest.raises(ValueError, match=match):
            CharGPT(11, 16, 2, 4, 12, **kwargs)


def test_M1_25_gpt2_init_scales_and_initial_loss(corpus):
    """N(0, 0.02²) weights, residual projections 0.02 / sqrt(2N), zero biases; the initial loss is ln|V|."""
    torch.manual_seed(0)
    n_layers = 4
    net = CharGPT(65, 64, n_layers, 4, 32)
    w = net.blocks[0].self_attn.q_proj.weight
    out = torch.cat([torch.cat([b.self_attn.out_proj.weight.flatten(), b.ff.linear2.weight.flatten()])
                     for b in net.blocks])
    # sampling error of a std estimated from n values: about std / sqrt(2n)
    assert abs(w.std().item() - 0.02) < 5 * 0.02 / math.sqrt(2 * w.numel())
    expected = 0.02 / math.sqrt(2 * n_layers)
    assert abs(out.std().item() - expected) < 5 * expected / math.sqrt(2 * out.numel())
    assert all(b.self_attn.q_proj.bias.abs().max() == 0 for b in net.blocks)
    assert torch.equal(net.norm.weight, torch.ones(64))
    loss = estimate_loss(net, corpus.val, block=32, batches=2, batch=16)
    assert abs(loss - math.log(65)) < 0.05
    net_torch = CharGPT(65, 64, n_layers, 4, 32, init="torch")
    assert estimate_loss(net_torch, corpus.val, block=32, batches=2, batch=16) - math.log(65) > 0.05
    gpt2_init(net_torch)
    assert abs(net_torch.blocks[-1].ff.linear2.weight.std().item() - expected) < 0.1 * expected


def test_M1_25_decay_groups_split():
    """Linear weight matrices decay; biases, LayerNorms, token and position tables do not."""
    net = CharGPT(11, 16, 2, 4, 12)
    decay, keep = decay_groups(net, 0.1)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    names = {id(p): n for n, p in net.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in keep["params"]}
    linear = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "ff.linear1",
              "ff.linear2"}
    assert decayed == {f"blocks.{i}.{m}.weight" for i in range(2) for m in linear} | {"head.weight"}
    assert {"tok.weight", "pos.weight", "norm.weight", "norm.bias", "blocks.0.norm1.weight",
            "blocks.1.ff.linear2.bias"} <= kept
    assert decayed | kept == set(names.values()) and not decayed & kept


@pytest.mark.slow
def test_M1_25_train_char_lm_learns_and_bf16_tracks_fp32(corpus):
    """Thirty steps lower the validation loss; under bf16 autocast the losses track fp32's."""
    losses = {}
    for amp in (None, torch.bfloat16):
        torch.manual_seed(0)
        net = CharGPT(65, 32, 1, 4, 16)
        out = train_char_lm(net, corpus, steps=30, batch=8, lr=1e-2, seed=0, warmup=5, amp_dtype=amp,
                            eval_every=15, eval_batches=2, progress=False)
        losses[amp] = out["loss"]
    assert [s for s, _ in out["val"]] == [0, 15, 30]
    assert out["val"][-1][1] < out["val"][0][1] - 0.5
    rel = max(abs(a / b - 1) for a, b in zip(losses[torch.bfloat16], losses[None]))
    assert rel < 4 * 2.0 ** -8


def test_M1_25_train_char_lm_clips_and_records_the_norm_before(corpus):
    """grad_norm is the norm before clipping; the gradients the optimiser used have norm grad_clip."""
    torch.manual_seed(0)
    net = CharGPT(65, 16, 1, 2, 8)
    net.head.weight.register_hook(lambda g: g * 1e6)                      # a gradient spike
    spike = train_char_lm(net, corpus, steps=1, batch=4, lr=1e-3, seed=0, grad_clip=1.0, progress=False)
    clipped = torch.cat([p.grad.flatten() for p in net.parameters()]).norm().item()
    assert spike["grad_norm"][0] > 1e3 and clipped == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError, match="lr"):
        train_char_lm(net, corpus, steps=1, batch=4, lr=0.0, seed=0)


def test_M1_25_sample_text(corpus):
    torch.manual_seed(0)
    net = CharGPT(65, 16, 1, 2, 8)
    text = sample_text(net, corpus, "ROMEO:", 20, generator=torch.Generator().manual_seed(0))
    assert text.startswith("ROMEO:") and len(text) == 26
    assert text == sample_text(net, corpus, "ROMEO:", 20, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="temperature"):
        sample_text(net, corpus, "A", 2, temperature=0.0)
