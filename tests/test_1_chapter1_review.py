"""Chapter 1 additions: label smoothing (M1.17), weight tying (M1.4), the warm-up ("Noam") schedule (M1.23),
and temperature sampling from the encoder-decoder (M1.19)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xfam_lib.testing import assert_close
from xfam_lib.train import cross_entropy, noam_lr
from xfam_lib.transformer import (EncoderDecoder, TransformerLM, count_params, greedy_decode, sample_decode,
                                  teacher_forcing_loss)

BOS = 1


# ----------------------------------------------------------------------------- label smoothing (M1.17)
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.35, 1.0])
@pytest.mark.parametrize("ignore_index", [None, 0])
def test_label_smoothing_matches_torch_cross_entropy_M1_17(eps, ignore_index, gen):
    """The independent oracle: ``F.cross_entropy(label_smoothing=eps)``, value and gradient, with padding ignored."""
    logits = torch.randn(3, 7, 13, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 13, (3, 7), generator=gen)
    targets[0, :3] = 0                                              # some padding when ignore_index = 0
    ours = cross_entropy(logits, targets, ignore_index=ignore_index, label_smoothing=eps)
    ref = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), label_smoothing=eps,
                          ignore_index=-100 if ignore_index is None else ignore_index)
    assert_close(ours, ref, name="loss")
    (g_ours,) = torch.autograd.grad(ours, logits)
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert_close(g_ours, g_ref, name="gradient")


def test_label_smoothing_gradient_is_p_minus_smoothed_target_M1_17(gen):
    """d loss / d z = (softmax(z) - q) / N with q = (1 - eps) one_hot + eps / V, derived by hand."""
    eps, V = 0.2, 9
    z = torch.randn(5, V, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randint(0, V, (5,), generator=gen)
    (g,) = torch.autograd.grad(cross_entropy(z, y, label_smoothing=eps), z)
    q = (1 - eps) * F.one_hot(y, V).double() + eps / V
    assert_close(g, (torch.softmax(z, -1) - q).detach() / 5)


def test_label_smoothing_optimum_is_finite_M1_17():
    """Without smoothing the loss keeps falling as the target logit grows; with it, the best gap is finite.

    For logits ``[g, 0, ..., 0]`` the minimiser satisfies ``p_target = 1 - eps + eps / V``, i.e.
    ``g* = log((1 - eps + eps/V) (V - 1) / (eps - eps/V))``.
    """
    V, eps = 10, 0.1
    gaps = torch.linspace(0, 20, 2001, dtype=torch.float64)
    logits = torch.zeros(len(gaps), V, dtype=torch.float64)
    logits[:, 0] = gaps
    y = torch.zeros(len(gaps), dtype=torch.long)
    plain = torch.stack([cross_entropy(row[None], t[None]) for row, t in zip(logits, y)])
    smooth = torch.stack([cross_entropy(row[None], t[None], label_smoothing=eps) for row, t in zip(logits, y)])
    assert (plain.diff() < 0).all()                                 # plain CE: always better to grow the gap
    g_star = math.log((1 - eps + eps / V) * (V - 1) / (eps - eps / V))
    assert abs(float(gaps[smooth.argmin()]) - g_star) <= 0.01 + 1e-12


def test_label_smoothing_bad_value():
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), label_smoothing=1.5)


# ----------------------------------------------------------------------------- weight tying (M1.4)
def _tied_untied_pair(cls, kwargs):
    """A tied model and an untied one whose every table holds the tied model's shared values."""
    tied = cls(**kwargs, tie_weights=True).double()
    untied = cls(**kwargs).double()
    untied.load_state_dict(tied.state_dict())
    return tied, untied


def test_encoder_decoder_tied_weights_are_one_parameter_M1_4(gen):
    kw = dict(vocab=11, d_model=16, n_heads=2, n_enc=1, n_dec=1, d_ff=32)
    tied, untied = _tied_untied_pair(EncoderDecoder, kw)
    assert tied.src_embed.weight is tied.tgt_embed.weight is tied.head.weight
    assert untied.src_embed.weight is not untied.head.weight
    assert count_params(untied) - count_params(tied) == 2 * 11 * 16
    assert tied.double().head.weight is tied.src_embed.weight       # a dtype change keeps the tie
    src = torch.randint(2, 11, (3, 6), generator=gen)
    tgt = torch.randint(2, 11, (3, 5), generator=gen)
    assert_close(tied(src, tgt), untied(src, tgt))                  # same function with the same values
    teacher_forcing_loss(tied, src, tgt, BOS).backward()
    teacher_forcing_loss(untied, src, tgt, BOS).backward()
    # the shared Parameter accumulates the gradients of its three uses
    expected = untied.src_embed.weight.grad + untied.tgt_embed.weight.grad + untied.head.weight.grad
    assert_close(tied.head.weight.grad, expected)
    assert untied.src_embed.weight.grad.abs().max() > 0 and untied.head.weight.grad.abs().max() > 0


def test_transformer_lm_tied_weights_are_one_parameter_M1_4(gen):
    kw = dict(vocab=13, d_model=16, n_layers=1, n_heads=2)
    tied, untied = _tied_untied_pair(TransformerLM, kw)
    assert tied.embed.weight is tied.head.weight
    assert count_params(untied) - count_params(tied) == 13 * 16
    ids = torch.randint(0, 13, (2, 7), generator=gen)
    assert_close(tied(ids), untied(ids))
    tied(ids).logsumexp(-1).sum().backward()
    untied(ids).logsumexp(-1).sum().backward()
    assert_close(tied.embed.weight.grad, untied.embed.weight.grad + untied.head.weight.grad)
    # the tied table starts at N(0, 1/d): its entries have standard deviation near d**-0.5
    fresh = TransformerLM(13, 64, 1, 2, tie_weights=True)
    assert abs(float(fresh.embed.weight.detach().std()) * 64 ** 0.5 - 1) < 0.1


# ----------------------------------------------------------------------------- warm-up schedule (M1.23)
def test_noam_schedule_formula_peak_and_lambdalr_M1_23():
    d, warmup, n = 512, 400, 3000
    curve = np.array([noam_lr(s, d, warmup) for s in range(1, n + 1)])
    steps = np.arange(1, n + 1)
    closed = d ** -0.5 * np.minimum(steps ** -0.5, steps * warmup ** -1.5)   # the paper's formula, numpy
    np.testing.assert_allclose(curve, closed, rtol=1e-14)
    assert int(steps[curve.argmax()]) == warmup                    # the peak is at step = warmup ...
    assert math.isclose(curve.max(), (d * warmup) ** -0.5, rel_tol=1e-14)   # ... with height (d * warmup)^-1/2
    np.testing.assert_allclose(curve[:warmup] / steps[:warmup], curve[0], rtol=1e-12)      # linear rise
    np.testing.assert_allclose(curve[warmup:] * steps[warmup:] ** 0.5, curve[warmup] * (warmup + 1) ** 0.5,
                               rtol=1e-12)                                                   # step^-1/2 decay
    # driven through LambdaLR: the rate SGD actually applies at update s is noam_lr(s)
    w = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
    opt = torch.optim.SGD([w], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: noam_lr(s + 1, d, warmup))
    applied = []
    for _ in range(n):
        before = float(w.detach())
        opt.zero_grad()
        w.backward(torch.ones((), dtype=torch.float64))              # gradient 1: the step equals the rate
        opt.step()
        sched.step()
        applied.append(before - float(w.detach()))
    np.testing.assert_allclose(applied, curve, rtol=1e-9)


def test_noam_bad_input():
    with pytest.raises(ValueError, match="step"):
        noam_lr(0, 512, 4000)
    with pytest.raises(ValueError, match="warmup"):
        noam_lr(1, 512, 0)


# ----------------------------------------------------------------------------- sampling from the encoder-decoder (M1.19)
@pytest.fixture
def small_seq2seq():
    torch.manual_seed(0)
    return EncoderDecoder(10, 16, 2, 1, 1, 32).double().eval()


def test_sample_decode_temperature_zero_is_greedy_and_cache_changes_nothing_M1_19(small_seq2seq, gen):
    src = torch.randint(2, 10, (6, 5), generator=gen)
    greedy = greedy_decode(small_seq2seq, src, BOS, 7)
    assert torch.equal(sample_decode(small_seq2seq, src, BOS, 7, temperature=0.0), greedy)
    cached = sample_decode(small_seq2seq, src, BOS, 7, temperature=1.3, generator=torch.Generator().manual_seed(5))
    full = sample_decode(small_seq2seq, src, BOS, 7, temperature=1.3, use_cache=False,
                         generator=torch.Generator().manual_seed(5))
    assert torch.equal(cached, full)
    assert not torch.equal(cached, greedy)                          # at temperature 1.3 some token differs


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sample_decode_draws_from_softmax_over_temperature_M1_19(small_seq2seq, temperature):
    """First tokens of many samples follow softmax(z / T): every frequency within 5 binomial standard deviations."""
    n = 20000
    src = torch.randint(2, 10, (1, 5), generator=torch.Generator().manual_seed(3)).expand(n, -1)
    first = sample_decode(small_seq2seq, src, BOS, 1, temperature=temperature,
                          generator=torch.Generator().manual_seed(4))[:, 0]
    with torch.no_grad():
        z = small_seq2seq(src[:1], torch.full((1, 1), BOS))[0, -1]
    p = torch.softmax(z / temperature, -1)
    freq = torch.bincount(first, minlength=10).double() / n
    sd = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * sd + 1e-12).all()
    other = torch.softmax(z / (4 * temperature), -1)                # a different temperature does not fit
    assert ((freq - other).abs() > 5 * (other * (1 - other) / n).sqrt()).any()


def test_sample_decode_bad_input(small_seq2seq):
    src = torch.randint(2, 10, (2, 5))
    with pytest.raises(ValueError, match="temperature"):
        sample_decode(small_seq2seq, src, BOS, 3, temperature=-1.0)
    with pytest.raises(ValueError, match="src"):
        sample_decode(small_seq2seq, src[0], BOS, 3)
    with pytest.raises(ValueError, match="max_len"):
        sample_decode(small_seq2seq, src, BOS, 0)
