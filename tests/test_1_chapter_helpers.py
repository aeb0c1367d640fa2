"""Tests for the helpers Chapter 1 adds: EncoderStackLM, sequence_log_prob, attention_weights (transformer),
lm_copy_task and accuracy (tasks), module_tree and architecture_diagram (plots).

Rows: M1.2 (architecture drawing), M1.3 (BERT vs GPT masks), M1.19 (beam vs greedy scores), M1.22 (Pre/Post-LN stack).
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn

from xfam_lib import plots, tasks
from xfam_lib.attention import MultiHeadAttention
from xfam_lib.testing import assert_close, check_causal, copy_from_torch_layer
from xfam_lib.train import cross_entropy
from xfam_lib.transformer import (EncoderDecoder, EncoderStackLM, attention_weights, beam_search, count_params,
                                  greedy_decode, sequence_log_prob, shift_right)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- EncoderStackLM (M1.3, M1.22)
def test_M1_3_encoder_stack_lm_causal_flag():
    """causal=True (GPT-style) ignores future tokens exactly; causal=False (BERT-style) does not."""
    torch.manual_seed(0)
    ids = torch.randint(2, 11, (2, 9), generator=_gen())
    gpt = EncoderStackLM(11, 16, 2, 32, 2, causal=True).eval()
    assert gpt(ids).shape == (2, 9, 11)
    assert check_causal(gpt, ids, position=4, dim=1) == 0.0
    bert = EncoderStackLM(11, 16, 2, 32, 2, causal=False).eval()
    with pytest.raises(AssertionError, match="not causal"):
        check_causal(bert, ids, position=4, dim=1)


@pytest.mark.parametrize("norm_first", [False, True])
def test_M1_22_encoder_stack_lm_equals_torch_layers(norm_first):
    """The stack equals the same computation with nn.TransformerEncoderLayer (copied weights, dropout 0)."""
    torch.manual_seed(1)
    d, h, d_ff, n = 16, 4, 32, 3
    model = EncoderStackLM(13, d, h, d_ff, n, norm_first=norm_first, max_len=32).double().eval()
    theirs = [nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first).double()
              for _ in range(n)]
    for ours, ref in zip(model.encoder.layers, theirs):
        copy_from_torch_layer(ours, ref)
    ids = torch.randint(0, 13, (2, 7), generator=_gen(1))
    x = model.embed(ids) * math.sqrt(d) + model.pos[:7]
    future = torch.triu(torch.ones(7, 7, dtype=torch.bool), diagonal=1)      # True = ignore (torch convention)
    for ref in theirs:
        x = ref(x, src_mask=future)
    if norm_first:
        x = model.encoder.norm(x)
    assert_close(model(ids), model.head(x), name="EncoderStackLM vs nn.TransformerEncoderLayer")


def test_encoder_stack_lm_rejects_bad_input():
    model = EncoderStackLM(11, 16, 2, 32, 1, max_len=8)
    with pytest.raises(ValueError, match="ids must have 2 dims"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab must be positive"):
        EncoderStackLM(0, 16, 2, 32, 1)


# ----------------------------------------------------------------------------- sequence_log_prob (M1.19)
def _tiny_seq2seq(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return EncoderDecoder(9, 16, 2, 1, 1, 32).to(dtype).eval()


def test_M1_19_sequence_log_prob_equals_stepwise_sum():
    """One teacher-forced pass equals the sum of per-step log-probabilities from growing prefixes."""
    model = _tiny_seq2seq()
    src, tgt = tasks.reverse_task(3, 5, 9, generator=_gen(2))
    got = sequence_log_prob(model, src, tgt, tasks.BOS)
    tgt_in = shift_right(tgt, tasks.BOS)
    expected = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for t in range(5):
            logp = torch.log_softmax(model(src, tgt_in[:, :t + 1])[:, -1], dim=-1)
            expected += logp[torch.arange(3), tgt[:, t]]
    assert got.dtype == torch.float64 and got.shape == (3,)
    assert_close(got, expected, name="sequence_log_prob")
    assert (got < 0).all()


def test_M1_19_beam_score_matches_and_beats_greedy():
    """beam_search's score is the log-probability of its tokens; beam 1 is greedy; a beam as wide as the
    vocabulary is exact for two steps (equal to brute force over all 81 sequences), hence >= greedy."""
    model = _tiny_seq2seq(seed=3)
    src, _ = tasks.reverse_task(4, 6, 9, generator=_gen(3))
    greedy = greedy_decode(model, src, tasks.BOS, 6)
    for b in range(4):
        tokens, score = beam_search(model, src[b:b + 1], tasks.BOS, 6, beam_size=4)
        assert_close(torch.tensor(score, dtype=torch.float64),
                     sequence_log_prob(model, src[b:b + 1], tokens[None], tasks.BOS)[0])
        one, _ = beam_search(model, src[b:b + 1], tasks.BOS, 6, beam_size=1)
        assert torch.equal(one, greedy[b])
    all_pairs = torch.cartesian_prod(torch.arange(9), torch.arange(9))                  # (81, 2)
    greedy2 = greedy_decode(model, src, tasks.BOS, 2)
    for b in range(4):
        brute = sequence_log_prob(model, src[b:b + 1].expand(81, -1), all_pairs, tasks.BOS)
        tokens, score = beam_search(model, src[b:b + 1], tasks.BOS, 2, beam_size=9)
        assert torch.equal(tokens, all_pairs[brute.argmax()])
        assert abs(score - brute.max().item()) < 1e-10
        assert score >= sequence_log_prob(model, src[b:b + 1], greedy2[b:b + 1], tasks.BOS).item() - 1e-12


def test_sequence_log_prob_rejects_bad_shapes():
    model = _tiny_seq2seq()
    with pytest.raises(ValueError, match="same batch size"):
        sequence_log_prob(model, torch.ones(2, 4, dtype=torch.long), torch.ones(3, 4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="tgt must have 2 dims"):
        sequence_log_prob(model, torch.ones(2, 4, dtype=torch.long), torch.ones(4, dtype=torch.long), 1)


# ----------------------------------------------------------------------------- attention_weights (M1.2)
def test_M1_2_attention_weights_match_return_weights_and_restore_flags():
    model = _tiny_seq2seq(seed=4)
    src, tgt = tasks.reverse_task(2, 6, 9, generator=_gen(4))
    tgt_in = shift_right(tgt, tasks.BOS)
    maps = attention_weights(model, src, tgt_in)
    assert list(maps) == ["encoder.layers.0.self_attn", "decoder.layers.0.self_attn", "decoder.layers.0.cross_attn"]
    assert maps["decoder.layers.0.cross_attn"].shape == (2, 2, 6, 6)
    for w in maps.values():
        assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    # decoder self-attention is causal: nothing above the diagonal
    assert maps["decoder.layers.0.self_attn"].triu(1).abs().max() == 0
    # the encoder's map equals a direct call with return_weights=True
    enc_attn = model.encoder.layers[0].self_attn
    x = model._embed(model.src_embed, src)
    _, direct = enc_attn(x, mask=model.source_mask(src), return_weights=True)
    assert_close(maps["encoder.layers.0.self_attn"], direct)
    assert all("keep_weights" not in m.__dict__ for m in model.modules() if isinstance(m, MultiHeadAttention))
    with pytest.raises(ValueError, match="no MultiHeadAttention"):
        attention_weights(nn.Linear(2, 2), torch.zeros(1, 2))


# ----------------------------------------------------------------------------- tasks
def test_lm_copy_task_layout_and_chance_loss():
    inputs, targets = tasks.lm_copy_task(5, 4, 12, generator=_gen(5))
    assert inputs.shape == targets.shape == (5, 7)
    x = inputs[:, :4]
    assert torch.equal(inputs[:, 4:], x[:, :3])
    assert (targets[:, :3] == tasks.PAD).all() and torch.equal(targets[:, 3:], x)
    assert (x >= tasks.N_SPECIAL).all()
    # a model that is uniform over the 10 data tokens scores ln(10) on the kept positions
    logits = torch.full((5, 7, 12), -1e4)
    logits[..., tasks.N_SPECIAL:] = 0.0
    loss = cross_entropy(logits, targets, ignore_index=tasks.PAD)
    assert abs(loss.item() - math.log(10)) < 1e-6


def test_accuracy_modes_by_hand():
    pred = torch.tensor([[2, 3, 4], [2, 9, 4]])
    tgt = torch.tensor([[2, 3, 4], [2, 3, 5]])
    assert tasks.accuracy(pred, tgt) == 4 / 6                  # the exact ratio of the counts, not fp32's
    assert tasks.accuracy(pred, tgt, by="sequence") == 0.5
    eleven = torch.arange(12).reshape(1, 12)
    assert tasks.accuracy(eleven, eleven.where(eleven != 5, 99)) == 11 / 12
    assert torch.equal(tasks.accuracy(pred, tgt, by="position"), torch.tensor([1.0, 0.5, 0.5], dtype=torch.float64))
    tgt_pad = torch.tensor([[2, 3, 0], [2, 3, 0]])
    assert tasks.accuracy(pred, tgt_pad, ignore_index=0) == 3 / 4
    assert tasks.accuracy(pred, tgt_pad, by="sequence", ignore_index=0) == 0.5
    with pytest.raises(ValueError, match="both be"):
        tasks.accuracy(pred, tgt[:, :2])
    with pytest.raises(ValueError, match="by must be"):
        tasks.accuracy(pred, tgt, by="word")
    with pytest.raises(TypeError):
        tasks.accuracy(pred.tolist(), tgt)


# ----------------------------------------------------------------------------- plots (M1.1, M1.2)
def test_M1_2_module_tree_rows():
    model = EncoderDecoder(9, 16, 2, 2, 1, 32).eval()
    src = torch.randint(2, 9, (2, 5), generator=_gen(6))
    tgt_in = torch.randint(2, 9, (2, 4), generator=_gen(7))
    rows = plots.module_tree(model, src, tgt_in)
    by_name = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows if r["depth"] == 1] == ["src_embed", "encoder", "tgt_embed", "decoder", "head"]
    assert by_name["encoder"]["shape"] == (2, 5, 16)                   # one vector per source token (E1.4)
    assert by_name["decoder.layers.0.cross_attn"]["shape"] == (2, 4, 16)
    assert by_name["head"]["shape"] == (2, 4, 9)
    assert by_name["encoder.layers.1"]["depth"] == 2                   # the uncalled ModuleList does not count
    assert by_name["encoder.layers.1.self_attn.q_proj"]["depth"] == 4
    assert sum(r["params"] for r in rows if r["depth"] == 1) == count_params(model)
    names = [r["name"] for r in rows]
    assert names.index("decoder.layers.0.self_attn") < names.index("decoder.layers.0.cross_attn")


def test_M1_2_architecture_diagram_draws_and_checks_names():
    model = EncoderDecoder(9, 16, 2, 2, 2, 32).eval()
    src = torch.randint(2, 9, (2, 5), generator=_gen(8))
    tgt_in = torch.randint(2, 9, (2, 4), generator=_gen(9))
    cols = {"Encoder": ["src_embed", "encoder"], "Decoder": ["tgt_embed", "decoder", "head"]}
    fig = plots.architecture_diagram(model, src, tgt_in, columns=cols, links=[("encoder", "cross_attn", "memory")])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("layers.1: EncoderLayer  (same structure, own weights)" in t for t in texts)
    assert any("cross_attn: MultiHeadAttention" in t for t in texts)
    assert "(2, 5, 16)  " + f"{count_params(model.encoder):,} p" in texts
    assert not any("layers.1.self_attn" in t for t in texts)          # the repeat is collapsed
    assert len(fig.axes[0].patches) > 10
    # two 5.2 in columns are wider than the book's figures: drawn smaller, text included
    assert fig.get_figwidth() == pytest.approx(plots.MAX_WIDTH)
    one = plots.architecture_diagram(model, src, tgt_in)
    assert one.get_figwidth() == pytest.approx(5.2)                   # one column fits: full size
    shrink = plots.MAX_WIDTH / (2 * 5.2 + 0.6)
    sizes = {t.get_fontsize() for t in fig.axes[0].texts if t.get_text()}
    assert sizes == {f * shrink for f in (7, 7.5, 8, 11)}                # shape, label, link, column title
    plt.close(one)
    plt.close(fig)
    with pytest.raises(ValueError, match="max_depth must be a positive int"):
        plots.architecture_diagram(model, src, tgt_in, max_depth=0)
    with pytest.raises(ValueError, match="not called children"):
        plots.architecture_diagram(model, src, tgt_in, columns={"x": ["nope"]})
    with pytest.raises(ValueError, match="no drawn module ends with"):
        plots.architecture_diagram(model, src, tgt_in, links=[("encoder", "missing", "")])
