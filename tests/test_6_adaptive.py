"""Chapter 6, adaptive computation (METHODS M6.x): ACT, the Universal Transformer, adaptive attention
span, the Depth-Adaptive Transformer's exits and CALM's early exit.

Each mechanism is checked for its defining invariant (halting weights sum to 1, halted tokens frozen,
span-mask bounds, exit distributions sum to 1, threshold 1 equals the full model) and against an
explicit loop or closed form. Equalities run in fp64.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.adaptive import (
    AdaptiveSpanAttention,
    ExitPredictor,
    MultiExitModel,
    UniversalTransformer,
    act_halting,
    calibrate_threshold,
    confidence_targets,
    first_exit,
    geometric_exit_dist,
    multi_exit_loss,
    multinomial_exit_dist,
    oracle_exit,
    rbf_kernel,
    rbf_smooth,
    soft_span_mask,
    softmax_response,
    state_saturation,
)
from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.bench import largest_intermediate
from xfam_lib.positional import ut_coordinate_encoding
from xfam_lib.transformer import count_params
from xfam_lib.testing import assert_close, randn

F64 = torch.float64
HYP = settings(max_examples=25, deadline=None, derandomize=True)


# ============================================================================= M6.1, M6.2 Universal Transformer
def test_ut_coordinate_encoding_spot_values_M6_2():
    """P[t-1, p, 2i] = sin(p θ_i) + sin(t θ_i), P[t-1, p, 2i+1] = cos(p θ_i) + cos(t θ_i), θ_i = 10000^(-2i/d)
    (addition, not concatenation: ERRATA E6.1)."""
    P = ut_coordinate_encoding(9, 4, 8)
    assert P.shape == (4, 9, 8)
    for t, p, i in [(1, 0, 0), (2, 5, 1), (4, 8, 3), (3, 3, 2)]:
        theta = 10000.0 ** (-2 * i / 8)
        assert math.isclose(P[t - 1, p, 2 * i].item(), math.sin(p * theta) + math.sin(t * theta), abs_tol=1e-6)
        assert math.isclose(P[t - 1, p, 2 * i + 1].item(), math.cos(p * theta) + math.cos(t * theta), abs_tol=1e-6)


def test_universal_transformer_shares_one_layer_M6_1(gen):
    """Parameters do not grow with n_steps; n_steps=1 ≡ one EncoderLayer on x + P¹ (same weights);
    n_steps=3 ≡ the layer applied three times with the step's coordinates, outputs and gradients."""
    assert count_params(UniversalTransformer(16, 4, 32, 1)) == count_params(UniversalTransformer(16, 4, 32, 12))
    torch.manual_seed(0)
    ut = UniversalTransformer(16, 4, 32, 3).double()
    x = randn(2, 5, 16, gen=gen, requires_grad=True)
    P = ut_coordinate_encoding(5, 3, 16, dtype=torch.float64)
    one = UniversalTransformer(16, 4, 32, 1).double()
    one.layer.load_state_dict(ut.layer.state_dict())
    assert_close(one(x), ut.layer(x + P[0]))
    manual = x
    for t in range(3):
        manual = ut.layer(manual + P[t])
    out = ut(x)
    assert_close(out, manual)
    w = randn(2, 5, 16, gen=gen)
    g_ut = torch.autograd.grad((out * w).sum(), (x, ut.layer.self_attn.q_proj.weight))
    g_manual = torch.autograd.grad((manual * w).sum(), (x, ut.layer.self_attn.q_proj.weight))
    for a, b in zip(g_ut, g_manual):
        assert_close(a, b)


def test_universal_transformer_with_act_ponders_per_position_M6_1_M6_3(gen):
    torch.manual_seed(0)
    ut = UniversalTransformer(16, 4, 32, 6, act=True).double()
    x = randn(2, 5, 16, gen=gen)
    out, ponder, n_updates = ut(x)
    assert out.shape == x.shape and ponder.shape == (2, 5)
    assert bool(((n_updates >= 1) & (n_updates <= 6)).all())
    assert bool((ponder > n_updates).all() & (ponder <= n_updates + 1).all())        # ponder = N + R, 0 < R <= 1
    ponder.mean().backward()
    assert ut.halt.weight.grad.abs().sum() > 0                        # the ponder cost trains the halting unit


# ============================================================================= M6.3 ACT
def act_reference(states, probs, threshold):
    """Graves's equations for one token, given its states s^1..s^T and halting probabilities p^1..p^T."""
    cum = 0.0
    for n, p in enumerate(probs, start=1):
        if cum + p >= threshold or n == len(probs):
            R = 1.0 - cum
            weights = list(probs[:n - 1]) + [R]
            return sum(w * s for w, s in zip(weights, states)), n + R, n
        cum += p


@given(T=st.integers(1, 6), threshold=st.floats(0.5, 0.999), seed=st.integers(0, 100))
@HYP
def test_act_halting_equals_graves_per_token_M6_3(T, threshold, seed):
    """Masked, batched loop ≡ per-token equations: output Σ w_n s^n, ponder N + R, N updates."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(4, T, generator=gen, dtype=F64) * 0.6
    states = randn(4, T, 3, gen=gen)
    step = lambda s, n: (states[:, n], probs[:, n])
    out, ponder, n_updates = act_halting(step, torch.zeros(4, 3, dtype=F64), threshold, T)
    for i in range(4):
        ref_out, ref_ponder, ref_n = act_reference(states[i], probs[i].tolist(), threshold)
        assert_close(out[i], ref_out)
        assert math.isclose(ponder[i].item(), ref_ponder, rel_tol=1e-12) and n_updates[i].item() == ref_n


@given(seed=st.integers(0, 100), max_steps=st.integers(1, 8))
@HYP
def test_act_halting_weights_sum_to_one_and_halted_tokens_freeze_M6_3(seed, max_steps):
    """With states of ones the output is Σ w_n = 1 exactly per token; the state a halted token passes to
    later steps never changes."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(max_steps, 2, 5, generator=gen, dtype=F64)
    seen = []

    def step(state, n):
        seen.append(state.clone())
        return state + 1.0, probs[n]

    _, _, n_updates = act_halting(step, torch.zeros(2, 5, 3, dtype=F64), 0.99, max_steps)
    for n, state in enumerate(seen):
        halted = n_updates <= n                                     # tokens that stopped before step n
        assert torch.equal(state[halted], n_updates[halted].unsqueeze(-1).expand(-1, 3))   # frozen at N updates
    ones = lambda state, n: (torch.ones_like(state), probs[n])
    out, _, _ = act_halting(ones, torch.zeros(2, 5, 3, dtype=F64), 0.99, max_steps)
    assert_close(out, torch.ones(2, 5, 3, dtype=F64))


def test_act_hand_example_and_ponder_gradient_M6_3():
    """p = 0.3, 0.5, 0.4 with 1-ε = 0.99: halts at N = 3 with R = 0.2, ponder 3.2; d ponder / d p_n = -1 for n < N."""
    p = torch.tensor([0.3, 0.5, 0.4], dtype=F64, requires_grad=True)
    s = torch.tensor([[1.0], [2.0], [4.0]], dtype=F64)
    out, ponder, n = act_halting(lambda state, i: (s[i].expand(1, 1), p[i].expand(1)), torch.zeros(1, 1, dtype=F64))
    assert n.item() == 3 and math.isclose(ponder.item(), 3.2)
    assert math.isclose(out.item(), 0.3 * 1 + 0.5 * 2 + 0.2 * 4)
    ponder.sum().backward()
    assert p.grad.tolist() == [-1.0, -1.0, 0.0]


# ============================================================================= M6.4 adaptive span
def test_soft_span_mask_values_bounds_and_gradient_M6_4():
    """m_z(x) = clamp((R + z - x)/R, 0, 1): 1 up to z, linear on the ramp, 0 from z + R (ERRATA E6.3);
    dm/dz = 1/R inside the ramp and 0 outside."""
    z = torch.tensor(5.0, dtype=F64, requires_grad=True)
    x = torch.tensor([0.0, 5.0, 7.0, 9.0, 13.0, 20.0], dtype=F64)
    m = soft_span_mask(x, z, 8.0)
    assert m.tolist() == [1.0, 1.0, 0.75, 0.5, 0.0, 0.0]
    grads = [torch.autograd.grad(m[i], z, retain_graph=True)[0].item() for i in range(6)]
    assert grads[2] == grads[3] == 1 / 8 and grads[0] == grads[5] == 0.0


def test_adaptive_span_attention_weights_M6_4(gen):
    """Rows sum to 1; no weight beyond z + R per head; ≡ the formula m·exp(s)/Σ m·exp(s) computed by hand;
    spans covering the sequence give plain causal attention."""
    torch.manual_seed(0)
    L, ramp = 12, 3
    layer = AdaptiveSpanAttention(16, 4, max_span=8, ramp=ramp).double()
    with torch.no_grad():
        layer.span_logit.copy_(torch.tensor([-2.0, -0.5, 0.5, 2.0]))
    x = randn(2, L, 16, gen=gen)
    out, weights = layer(x, return_weights=True)
    assert_close(weights.sum(-1), torch.ones(2, 4, L, dtype=F64))
    z = layer.spans
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    for h in range(4):
        beyond = (i - j) >= z[h] + ramp
        assert beyond.any() and (weights[:, h][:, beyond] == 0).all()
    q = layer.q_proj(x).view(2, L, 4, 4).transpose(1, 2)
    k = layer.k_proj(x).view(2, L, 4, 4).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1) / 2.0).exp() * (j <= i)
    m = ((ramp + z[:, None, None] - (i - j)) / ramp).clamp(0, 1)
    assert_close(weights, scores * m / (scores * m).sum(-1, keepdim=True))
    wide = AdaptiveSpanAttention(16, 4, max_span=64, ramp=ramp).double()
    wide.load_state_dict({**layer.state_dict(), "span_logit": torch.full((4,), 20.0, dtype=F64)})
    _, w_wide = wide(x, return_weights=True)
    assert_close(w_wide, scaled_dot_product_attention(q, k, q, causal=True, return_weights=True)[1])


def test_adaptive_span_gets_gradient_from_loss_and_l1_penalty_M6_4(gen):
    torch.manual_seed(0)
    layer = AdaptiveSpanAttention(16, 2, max_span=6, ramp=4).double()
    x = randn(1, 10, 16, gen=gen)
    (layer(x) ** 2).sum().backward()
    assert (layer.span_logit.grad != 0).all()                       # dL/dz ≠ 0: keys sit on the ramp
    layer.zero_grad()
    layer.span_penalty().backward()
    assert (layer.span_logit.grad > 0).all()                        # the L1 term pushes every span down


@pytest.mark.parametrize("length", [1, 5, 12, 37])
@pytest.mark.parametrize("logits", [[-2.0, -0.5, 0.5, 2.0], [20.0] * 4, [-20.0] * 4])
def test_adaptive_span_trimmed_equals_full_M6_4(gen, length, logits):
    """forward(trim=True) scores only the last ceil(max z + R) keys in blocks; it equals the full
    (L, L) form in outputs and in gradients w.r.t. the input and the spans, for short, mixed and
    sequence-covering spans and for lengths that are not multiples of the block."""
    torch.manual_seed(0)
    layer = AdaptiveSpanAttention(16, 4, max_span=8, ramp=3).double()
    with torch.no_grad():
        layer.span_logit.copy_(torch.tensor(logits))
    x = randn(2, length, 16, gen=gen, requires_grad=True)
    full, trimmed = layer(x), layer(x, trim=True)
    assert_close(trimmed, full)
    cot = randn(*full.shape, gen=gen)
    g_full = torch.autograd.grad(full, [x, layer.span_logit], cot)
    g_trim = torch.autograd.grad(trimmed, [x, layer.span_logit], cot)
    for a, b in zip(g_trim, g_full):
        assert_close(a, b)


def test_adaptive_span_trimmed_scores_only_the_band_M6_4(gen):
    """With short spans the trimmed form's largest tensor grows like L, the full form's like L²."""
    layer = AdaptiveSpanAttention(16, 2, max_span=64, ramp=4, init_span=4.0)
    sizes = {}
    with torch.no_grad():
        for L in (256, 512):
            x = randn(1, L, 16, gen=gen, dtype=torch.float32)
            sizes[L] = (largest_intermediate(lambda: layer(x)), largest_intermediate(lambda: layer(x, trim=True)))
    assert sizes[512][0] >= 3.9 * sizes[256][0]                      # (L, L): x4 when L doubles
    assert sizes[512][1] <= 2.1 * sizes[256][1]                      # (L, 2W): x2
    assert sizes[512][1] * 8 < sizes[512][0]
    with pytest.raises(ValueError, match="return_weights"):
        layer(x, return_weights=True, trim=True)


# ============================================================================= M6.6, M6.7, M6.8 Depth-Adaptive Transformer
def test_multi_exit_model_exits_and_loss_M6_6(gen):
    """Exit n ≡ the head on the state after n + 1 layers (run by hand); the loss ≡ Σ_n CE_n;
    per-exit heads add parameters, a shared head does not."""
    torch.manual_seed(0)
    model = MultiExitModel(11, 16, 4, 32, 3, causal=True).double()
    ids = torch.randint(0, 11, (2, 7), generator=gen)
    logits = model(ids)
    h = model.embed_ids(ids)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    for n, layer in enumerate(model.layers):
        h = layer(h, mask)
        assert_close(logits[n], model.heads[0](model.norms[0](h)))
    targets = torch.randint(0, 11, (2, 7), generator=gen)
    expected = sum(F.cross_entropy(logits[n].reshape(-1, 11), targets.reshape(-1)) for n in range(3))
    assert_close(multi_exit_loss(logits, targets), expected)
    assert_close(multi_exit_loss(logits, targets, [0.0, 0.0, 1.0]), F.cross_entropy(logits[2].reshape(-1, 11),
                                                                                    targets.reshape(-1)))
    separate = MultiExitModel(11, 16, 4, 32, 3, shared_head=False)
    assert count_params(separate) - count_params(MultiExitModel(11, 16, 4, 32, 3)) == 2 * (16 * 11 + 11 + 2 * 16)


@given(N=st.integers(1, 8), seed=st.integers(0, 100))
@HYP
def test_exit_distributions_sum_to_one_M6_7(N, seed):
    gen = torch.Generator().manual_seed(seed)
    chi = torch.rand(3, 4, N, generator=gen, dtype=F64)
    q = geometric_exit_dist(chi)
    assert_close(q.sum(-1), torch.ones(3, 4, dtype=F64))
    assert bool((q >= 0).all())
    assert_close(multinomial_exit_dist(randn(3, N, gen=gen)).sum(-1), torch.ones(3, dtype=F64))


def test_geometric_exit_closed_form_for_constant_halting_M6_7():
    """Constant χ: q(n) = χ(1-χ)^(n-1) for n < N and (1-χ)^(N-1) at the last exit (ERRATA E6.5)."""
    chi, N = 0.3, 5
    q = geometric_exit_dist(torch.full((N,), chi, dtype=F64))
    expected = [chi * (1 - chi) ** n for n in range(N - 1)] + [(1 - chi) ** (N - 1)]
    assert_close(q, torch.tensor(expected, dtype=F64))


def test_exit_predictor_three_kinds_M6_7(gen):
    """All three give distributions over the exits; the sequence-level one is shared by the sequence's
    tokens, the token-level one is not; the geometric one ≡ geometric_exit_dist of σ(w_n·h^n + b_n)."""
    states = randn(4, 2, 6, 8, gen=gen)
    torch.manual_seed(0)
    dists = {kind: ExitPredictor(8, 4, kind).double() for kind in ("sequence", "token", "geometric")}
    q = {kind: pred(states) for kind, pred in dists.items()}
    for kind in q:
        assert_close(q[kind].sum(-1), torch.ones(2, 6, dtype=F64))
    assert_close(q["sequence"], q["sequence"][:, :1].expand(-1, 6, -1))
    assert (q["token"][:, 0] - q["token"][:, 1]).abs().max() > 1e-6
    geo = dists["geometric"]
    chi = torch.sigmoid(torch.stack([states[n] @ geo.w[n] + geo.b[n] for n in range(4)], dim=-1))
    assert_close(q["geometric"], geometric_exit_dist(chi))


@given(seed=st.integers(0, 200), lam1=st.floats(0, 2), lam2=st.floats(0, 2))
@HYP
def test_larger_depth_penalty_never_deepens_the_oracle_exit_M6_8(seed, lam1, lam2):
    LL = -torch.rand(10, 6, generator=torch.Generator().manual_seed(seed), dtype=F64) * 3
    lo, hi = sorted((lam1, lam2))
    assert bool((oracle_exit(LL, hi) <= oracle_exit(LL, lo)).all())


def test_oracle_exit_hand_example_M6_8():
    LL = torch.tensor([-2.0, -1.0, -0.9, -0.85], dtype=F64)        # deeper is better, by less and less
    assert [oracle_exit(LL, lam).item() for lam in (0.0, 0.08, 0.5, 1.5)] == [3, 2, 1, 0]


def test_rbf_kernel_is_at_most_one_and_decays_and_smooths_M6_8(gen):
    """κ(t,t') = exp(-|t-t'|²/σ) ≤ 1, 1 on the diagonal, decreasing with distance (without the minus of
    ERRATA E6.4 it would grow); rbf_smooth ≡ the explicit sum."""
    K = rbf_kernel(7, 2.0, dtype=F64)
    assert bool((K <= 1).all()) and torch.equal(K.diagonal(), torch.ones(7, dtype=F64))
    assert bool((K[0, 1:] < K[0, :-1]).all())
    assert math.isclose(K[0, 3].item(), math.exp(-9 / 2.0))
    x = randn(3, 7, gen=gen)
    assert_close(rbf_smooth(x, 2.0), torch.stack([torch.stack([sum(K[t, s] * x[b, s] for s in range(7))
                                                               for t in range(7)]) for b in range(3)]))


# ============================================================================= M6.9, M6.10 CALM
def test_calm_confidence_measures_on_hand_built_tensors_M6_9():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.4, 0.4, 0.2]], dtype=F64))
    assert_close(softmax_response(logits), torch.tensor([0.3, 0.0], dtype=F64))
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]], dtype=F64)
    b = torch.tensor([[0.0, 3.0], [2.0, 2.0], [-1.0, 0.0]], dtype=F64)
    assert_close(state_saturation(a, b), torch.tensor([0.0, 1.0, -1.0], dtype=F64))
    conf = torch.tensor([[0.2, 0.9, 0.95], [0.5, 0.5, 0.5], [0.8, 0.1, 0.3]], dtype=F64)
    assert first_exit(conf, 0.5).tolist() == [1, 2, 0]              # strictly above; the last exit otherwise
    exit_logits = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]], [[0.2, 0.1]]], dtype=F64)   # (N=3, 1 token, C=2)
    assert confidence_targets(exit_logits).tolist() == [[False], [True], [True]]


@pytest.mark.parametrize("measure", ["softmax", "saturation", "classifier"])
def test_early_exit_with_threshold_one_equals_the_full_model_M6_9(gen, measure):
    torch.manual_seed(0)
    model = MultiExitModel(13, 16, 4, 32, 4, causal=True).double()
    ids = torch.randint(0, 13, (2, 9), generator=gen)
    logits, exits = model.early_exit(ids, measure, 1.0)
    assert torch.equal(logits, model(ids)[-1]) and bool((exits == 3).all())


def test_early_exit_uses_fewer_layers_as_the_threshold_drops_M6_9(gen):
    """Everyone exits at the first layer with a threshold below every confidence (logits = exit 0's);
    mean exit depth does not grow as the threshold falls; the classifier decides on the layer's state."""
    torch.manual_seed(0)
    model = MultiExitModel(13, 16, 4, 32, 4).double()
    ids = torch.randint(0, 13, (2, 9), generator=gen)
    logits, exits = model.early_exit(ids, "softmax", -1.0)
    assert bool((exits == 0).all()) and torch.equal(logits, model(ids)[0])
    depths = [model.early_exit(ids, "softmax", t)[1].double().mean().item() for t in (0.9, 0.5, 0.2, 0.05)]
    assert all(a >= b for a, b in zip(depths, depths[1:])) and depths[0] > depths[-1]
    conf0 = torch.sigmoid(model.confidence(model.hidden_states(ids)[0])).squeeze(-1)
    threshold = conf0.median().item()                                 # about half the tokens exit after layer 1
    mixed_logits, mixed = model.early_exit(ids, "classifier", threshold)
    first = conf0 > threshold
    assert 0 < int(first.sum()) < first.numel()
    assert torch.equal(mixed == 0, first) and bool((mixed[~first] >= 1).all())
    assert torch.equal(mixed_logits[first], model(ids)[0][first])


def test_exited_tokens_are_frozen_but_still_attended_M6_9(gen):
    """Three layers: a token that exits after layer 1 keeps its state, so a token that runs all three
    layers reads that copied state in layer 3 and its logits differ from the full model's; the exited
    token's logits are exit 0's."""
    torch.manual_seed(1)
    model = MultiExitModel(13, 16, 4, 32, 3).double()
    ids = torch.randint(0, 13, (2, 9), generator=gen)
    full = model(ids)
    conf0 = torch.sigmoid(model.confidence(model.hidden_states(ids)[0])).squeeze(-1)
    logits, exits = model.early_exit(ids, "classifier", conf0.median().item())
    early, late = exits == 0, exits == 2
    assert early.any() and late.any()
    assert torch.equal(logits[early], full[0][early])
    assert (logits[late] - full[2][late]).abs().max() > 1e-6


def test_calibrated_threshold_keeps_the_accuracy_drop_within_eps_M6_10(gen):
    """On the calibration split the chosen threshold's drop ≤ ε and the next lower grid threshold's
    exceeds it; the Hoeffding version (δ) is never less conservative."""
    n, N = 400, 4
    conf = torch.rand(n, N, generator=gen, dtype=F64).sort(-1).values
    correct = torch.rand(n, N, generator=gen, dtype=F64) < (0.5 + 0.45 * conf)     # confident exits are right more
    correct[:, -1] = torch.rand(n, generator=gen) < 0.95
    grid = torch.linspace(1, 0, 101, dtype=F64)
    drop = lambda t: (correct[:, -1].double().mean()
                      - correct.double().gather(1, first_exit(conf, t).unsqueeze(1)).mean()).item()
    for eps in (0.02, 0.1):
        lam = calibrate_threshold(conf, correct, eps, thresholds=grid)
        assert drop(lam) <= eps
        below = grid[grid < lam - 1e-12]
        assert below.numel() > 0 and drop(float(below[0])) > eps
        assert calibrate_threshold(conf, correct, eps, delta=0.1, thresholds=grid) >= lam


# ============================================================================= argument checks
@pytest.mark.parametrize("call, exc, words", [
    (lambda: act_halting(lambda s, n: (s, torch.zeros(3)), torch.zeros(2, 4)), ValueError, "p"),
    (lambda: act_halting(lambda s, n: (s, s[..., 0]), torch.zeros(2, 4), threshold=0.0), ValueError, "threshold"),
    (lambda: act_halting(lambda s, n: (s, s[..., 0]), torch.zeros(2, 4), max_steps=0), ValueError, "max_steps"),
    (lambda: soft_span_mask(torch.zeros(3), 1.0, 0.0), ValueError, "ramp"),
    (lambda: AdaptiveSpanAttention(16, 4, 8, init_span=8), ValueError, "init_span"),
    (lambda: AdaptiveSpanAttention(16, 4, 8)(torch.zeros(1, 3, 8)), ValueError, "d_model"),
    (lambda: geometric_exit_dist(torch.tensor([0.5, 1.5])), ValueError, "halt_probs"),
    (lambda: ExitPredictor(8, 3, "random"), ValueError, "kind"),
    (lambda: ExitPredictor(8, 3, "token")(torch.zeros(2, 1, 4, 8)), ValueError, "states"),
    (lambda: multi_exit_loss(torch.zeros(3, 2, 5), torch.zeros(3, dtype=torch.long)), ValueError, "targets"),
    (lambda: oracle_exit(torch.zeros(4), -0.1), ValueError, "lam"),
    (lambda: rbf_kernel(4, 0.0), ValueError, "sigma"),
    (lambda: softmax_response(torch.zeros(3, 1)), ValueError, "2 classes"),
    (lambda: state_saturation(torch.zeros(3), torch.zeros(4)), ValueError, "h_prev"),
    (lambda: calibrate_threshold(torch.zeros(5, 3), torch.zeros(5, 2), 0.1), ValueError, "correct"),
    (lambda: calibrate_threshold(torch.zeros(5, 3), torch.zeros(5, 3), 1.5), ValueError, "eps"),
    (lambda: MultiExitModel(5, 8, 2, 16, 2).early_exit(torch.zeros(1, 3, dtype=torch.long), "entropy", 0.5),
     ValueError, "measure"),
])
def test_bad_arguments_raise_naming_them(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
