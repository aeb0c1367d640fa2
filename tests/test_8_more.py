"""Chapter 8, the rest of the library: rank (M8.1), the cost model (M8.2), Linformer (M8.3), random
Fourier features and RFA (M8.5, M8.6), Performer's positive and orthogonal features (M8.7), the
recall error of a fixed state (M8.11) and the gate parameterisations of GLA's Table 1 (M8.14).

References are written here from the formulas. Monte Carlo checks use fixed seeds and compare with
the estimator's own standard error (3 SE), so a biased estimator or a wrong variance fails them.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from xfam_lib.bench import attention_flops, largest_intermediate, linear_attention_flops
from xfam_lib.linear import (
    GATE_KINDS,
    capacity_curve,
    elu_feature_map,
    reduces_to_gla,
    gated_linear_attention_per_entry,
    gated_linear_attention,
    linear_attention,
    linformer_attention,
    make_log_gate,
    orthogonal_gaussian,
    performer_attention,
    positive_random_features,
    random_feature_kernel,
    random_feature_mse,
    recall_error,
    rfa_attention,
    rff_features,
    sample_rff,
)
from xfam_lib.testing import assert_close, check_causal

F64 = torch.float64


def grads(fn, inputs, cot):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    return out.detach(), torch.autograd.grad((out * cot).sum(), leaves)


def assert_same_with_grads(fn_a, fn_b, inputs, name, gen):
    out_a, g_a = grads(fn_a, inputs, cot := torch.randn(fn_a(*inputs).shape, generator=gen, dtype=inputs[0].dtype))
    out_b, g_b = grads(fn_b, inputs, cot)
    assert_close(out_a, out_b, name=f"{name} output")
    for i, (a, b) in enumerate(zip(g_a, g_b)):
        assert_close(a, b, name=f"{name} grad {i}")


def softmax_attention(q, k, v, scale=1.0, causal=False):
    s = scale * q @ k.transpose(-2, -1)
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


# ----------------------------------------------------------------------------- M8.1 rank
def test_softmax_restores_rank_kernel_attention_stays_low_rank_M8_1(gen):
    """N=32, d=4: rank QK^T = 4, rank softmax(QK^T) = 32 (full), rank of the elu+1 attention matrix = 4.
    The elu+1 matrix is read out of `linear_attention` itself (values = identity give its weights)."""
    n, d = 32, 4
    q, k = torch.randn(2, n, d, generator=gen, dtype=F64)
    eye = torch.eye(n, dtype=F64)
    weights = linear_attention(q, k, eye, feature_map="elu", eps=0.0)
    unnormalised = elu_feature_map(q) @ elu_feature_map(k).T
    assert_close(weights, unnormalised / unnormalised.sum(-1, keepdim=True), name="elu+1 attention weights")
    ranks = tuple(int(torch.linalg.matrix_rank(m)) for m in (q @ k.T, torch.softmax(q @ k.T, -1), weights))
    assert ranks == (d, n, d)


# ----------------------------------------------------------------------------- M8.2 cost model
def test_linear_attention_flops_counted_and_crossover_M8_2(gen):
    """The formula equals torch's FLOP counter on the associative (chunk, non-causal) form; at n=4096,
    d=64 softmax attention costs 64x more; the two costs meet exactly at n = d."""
    from torch.utils.flop_counter import FlopCounterMode

    n, d_phi, d_v = 256, 16, 24
    q, k = torch.randn(2, 1, n, d_phi, generator=gen)
    v = torch.randn(1, n, d_v, generator=gen)
    with FlopCounterMode(display=False) as counter:
        linear_attention(q, k, v, feature_map="identity", normalize=False, mode="chunk", chunk_size=n)
    assert counter.get_total_flops() == linear_attention_flops(n, d_phi, d_v)
    assert attention_flops(4096, 64) // linear_attention_flops(4096, 64, 64) == 64
    d = 64
    cheaper = [m for m in range(1, 4 * d) if linear_attention_flops(m, d, d) < attention_flops(m, d)]
    equal = [m for m in range(1, 4 * d) if linear_attention_flops(m, d, d) == attention_flops(m, d)]
    assert equal == [d] and min(cheaper) == d + 1


def test_associativity_holds_without_softmax_not_with_it_M8_2(gen):
    q, k, v = torch.randn(3, 40, 8, generator=gen, dtype=F64)
    assert_close((q @ k.T) @ v, q @ (k.T @ v), name="(QK^T)V vs Q(K^T V)")
    assert (torch.softmax(q @ k.T, -1) @ v - torch.softmax(q, -1) @ (torch.softmax(k, -1).T @ v)).abs().max() > 0.1


# ----------------------------------------------------------------------------- M8.3 Linformer
def test_linformer_identity_projections_equal_full_attention_M8_3(gen):
    """r = L and E = F = I give full softmax attention (SDPA), outputs and gradients, fp64."""
    q, k, v = torch.randn(3, 2, 3, 20, 8, generator=gen, dtype=F64)
    eye = torch.eye(20, dtype=F64)
    assert_same_with_grads(lambda q, k, v: linformer_attention(q, k, v, eye, eye),
                           lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v), "linformer", gen)


def test_linformer_projected_formula_and_no_length_squared_tensor_M8_3(gen):
    """Random (r, L) projections: the per-query loop softmax_j(q . (E K)_j / sqrt d) (F V)_j; scores are L x r."""
    L, r, d = 96, 8, 16
    q, k, v = torch.randn(3, 2, L, d, generator=gen, dtype=F64)
    E, Fp = torch.randn(2, r, L, generator=gen, dtype=F64) / math.sqrt(L)
    out = linformer_attention(q, k, v, E, Fp)
    kp = torch.einsum("rl,hld->hrd", E, k)
    vp = torch.einsum("rl,hld->hrd", Fp, v)
    for i in range(L):
        w = torch.softmax((q[:, i:i + 1] * kp).sum(-1) / math.sqrt(d), -1)
        assert_close(out[:, i], (w.unsqueeze(-1) * vp).sum(-2), name=f"linformer row {i}")
    assert largest_intermediate(lambda: linformer_attention(q, k, v, E, Fp)) < L * L
    with pytest.raises(ValueError, match=r"E must be \(r, L\)"):
        linformer_attention(q, k, v, E.T, Fp)                       # (L, r) as printed in some notes: rejected


# ----------------------------------------------------------------------------- M8.5 random Fourier features
@pytest.mark.parametrize("sigma", [0.5, 2.0])
def test_rff_estimates_gaussian_kernel_within_3_se_M8_5(sigma):
    """|x - y| = 1: mean_i cos(w_i . (x - y)) with w ~ N(0, sigma^-2 I) is within 3 SE of exp(-1/(2 sigma^2)),
    and far from the value exp(-sigma^2/2) that frequencies of variance sigma^2 would give (ERRATA E8.3)."""
    D, d = 200_000, 3
    W = sample_rff(D, d, sigma, seed=1, dtype=F64)
    x = torch.tensor([0.3, -0.2, 0.5], dtype=F64)
    y = x + torch.tensor([0.6, 0.0, 0.8], dtype=F64)               # |x - y| = 1
    estimate = rff_features(x, W) @ rff_features(y, W)
    samples = torch.cos(W @ (x - y))                               # the D terms the estimate averages
    se = samples.std() / math.sqrt(D)
    target, wrong = math.exp(-1 / (2 * sigma ** 2)), math.exp(-sigma ** 2 / 2)
    assert_close(estimate, samples.mean(), name="rff_features dot product vs the cosine average")
    assert abs(estimate.item() - target) < 3 * se
    assert abs(estimate.item() - wrong) > 100 * se


def test_rff_error_falls_as_one_over_sqrt_D_M8_5(gen):
    """RMS kernel error over 40 seeds and 20 pairs: D 16x larger → error ~4x smaller (within 3..5.5)."""
    x, y = torch.randn(2, 20, 4, generator=gen, dtype=F64) * 0.5
    exact = torch.exp(-0.5 * (x - y).pow(2).sum(-1))

    def rms(D):
        errs = [(rff_features(x, W) * rff_features(y, W)).sum(-1) - exact
                for W in (sample_rff(D, 4, 1.0, seed=s, dtype=F64) for s in range(40))]
        return torch.stack(errs).pow(2).mean().sqrt().item()

    ratio = rms(64) / rms(1024)
    assert 3.0 < ratio < 5.5


# ----------------------------------------------------------------------------- M8.6 RFA
@pytest.mark.parametrize("causal", [False, True])
def test_rfa_modes_agree_and_match_the_feature_formula_M8_6(causal, gen):
    """Recurrent (the state loop) ≡ parallel (cumsum / masked form) ≡ chunk, gradients included; and
    the parallel form equals sum_j exp(|k_j|^2/2) rff(q).rff(k_j) v_j / sum_j (same weights), fp64."""
    q, k, v = torch.randn(3, 2, 19, 4, generator=gen, dtype=F64) * 0.5
    W = sample_rff(32, 4, 1.0, seed=3, dtype=F64)
    modes = {m: (lambda q, k, v, m=m: rfa_attention(q, k, v, W, causal=causal, mode=m, chunk_size=5))
             for m in ("parallel", "recurrent", "chunk")}
    assert_same_with_grads(modes["recurrent"], modes["parallel"], (q, k, v), "rfa recurrent vs parallel", gen)
    assert_same_with_grads(modes["chunk"], modes["parallel"], (q, k, v), "rfa chunk vs parallel", gen)
    proj_q, proj_k = q @ W.T, k @ W.T
    w = ((proj_q.unsqueeze(-2) - proj_k.unsqueeze(-3)).cos().mean(-1)
         * (0.5 * k.pow(2).sum(-1)).exp().unsqueeze(-2))            # (..., L, L): cos(a - b) = cos a cos b + sin a sin b
    if causal:
        w = w.tril()
    assert_close(modes["parallel"](q, k, v), (w @ v) / w.sum(-1, keepdim=True), name="rfa vs formula")


def test_rfa_error_vs_softmax_falls_with_features_M8_6(gen):
    """Mean |RFA - softmax attention| over 10 seeds: D = 4096 is below D = 16 by more than 4x."""
    q, k, v = torch.randn(3, 1, 24, 8, generator=gen, dtype=F64) * 0.4
    exact = softmax_attention(q, k, v)
    err = {D: sum((rfa_attention(q, k, v, sample_rff(D, 8, 1.0, seed=s, dtype=F64)) - exact).abs().mean().item()
                  for s in range(10)) / 10 for D in (16, 4096)}
    assert err[4096] * 4 < err[16]


def test_rfa_causal_recurrent_decoding_is_causal_M8_6(gen):
    q, k, v = torch.randn(3, 1, 16, 4, generator=gen, dtype=F64) * 0.5
    W = sample_rff(16, 4, seed=0, dtype=F64)
    fn = lambda x: rfa_attention(x, x, x, W, causal=True, mode="recurrent")
    assert check_causal(fn, q, position=9) == 0.0


# ----------------------------------------------------------------------------- M8.7 Performer
def test_positive_features_unbiased_for_exp_within_3_se_M8_7(gen):
    m, d = 200_000, 4
    W = torch.randn(m, d, generator=gen, dtype=F64)
    x = torch.tensor([0.4, -0.3, 0.2, 0.1], dtype=F64)
    y = torch.tensor([-0.2, 0.5, 0.3, -0.4], dtype=F64)
    estimate = positive_random_features(x, W) @ positive_random_features(y, W)
    samples = torch.exp(W @ (x + y) - 0.5 * (x @ x + y @ y))        # the m terms of the estimate
    assert_close(estimate, samples.mean(), name="phi+(x).phi+(y) vs the term average")
    assert (positive_random_features(x, W) > 0).all()
    assert abs(estimate.item() - math.exp(x @ y)) < 3 * samples.std().item() / math.sqrt(m)


def test_orthogonal_gaussian_blocks_and_chi_norms_M8_7():
    """Rows orthogonal within each block of d (and not across), row norms chi(d) by a KS test at 1%."""
    d, m = 8, 4000
    W = orthogonal_gaussian(m, d, seed=0, dtype=F64)
    block = W[:d]
    gram = block @ block.T
    assert_close(gram - torch.diag(torch.diagonal(gram)), torch.zeros(d, d, dtype=F64), atol=1e-10, rtol=0,
                 name="off-diagonal Gram entries inside a block")       # fp64 QR: ~1e-15 relative
    assert (W[:d] @ W[d:2 * d].T).abs().max() > 0.1                       # two blocks are independent
    r = W.norm(dim=-1).sort().values
    cdf = torch.special.gammainc(torch.tensor(d / 2, dtype=F64), r.pow(2) / 2)   # chi(d) CDF
    i = torch.arange(1, m + 1, dtype=F64)
    ks = torch.maximum(i / m - cdf, cdf - (i - 1) / m).max().item()
    assert ks < 1.63 / math.sqrt(m)
    rescaled = F.normalize(W, dim=-1) * math.sqrt(d)                      # norms all sqrt(d): must fail the test
    cdf_bad = torch.special.gammainc(torch.tensor(d / 2, dtype=F64), rescaled.norm(dim=-1).sort().values ** 2 / 2)
    assert torch.maximum(i / m - cdf_bad, cdf_bad - (i - 1) / m).max() > 1.63 / math.sqrt(m)


@pytest.mark.parametrize("m", [16, 32])
@pytest.mark.parametrize("kind, norm", [("trig", 1.0), ("positive", 0.75)])
def test_orthogonal_features_beat_iid_at_equal_count_M8_7(kind, norm, m, gen):
    """Orthogonal rows (`orthogonal_gaussian`) estimate exp(x.y) with a lower MSE than i.i.d. rows at the same m,
    for trigonometric and positive features, at m = d and m = 2d (d = 16).

    The relative error of one estimate depends on x - y only (trig) or on x + y only (positive), so its MSE has
    a closed form for i.i.d. rows: 2 sinh²(|x - y|²/2) / m (trig) and (e^{|x + y|²} - 1) / m (positive). The
    i.i.d. draws must match it within 3 SE; the orthogonal draws must sit below it by more than 3 of their own SE.
    Positive features gain little where |x + y| is small and have heavy-tailed errors where it is large (a
    squared error is about lognormal with sigma 2|x + y|), so 40 draws, as in Figure 8.6, cannot resolve their
    gain; at |x + y| = 0.75 it is about 1.2x, and 8000 draws put it 10-15 SE clear (36 runs with other seeds
    of x, y and W). Trig features gain about 6x at |x - y| = 1 (their gain shrinks as |x - y| grows: 1.0-1.2x
    at the norms of the pairs of the next test). Groups of m consecutive rows of one long draw are independent
    draws of m rows (whole blocks of d)."""
    d, draws = 16, 8000
    x, y = torch.randn(2, d, generator=gen, dtype=F64)
    width = ((x + y) if kind == "positive" else (x - y)).norm()
    x, y = x * norm / width, y * norm / width                          # |x + y| (positive) or |x - y| (trig) = norm
    kernel = torch.exp(x @ y)
    exact_iid = (math.expm1(norm ** 2) if kind == "positive" else 2 * math.sinh(norm ** 2 / 2) ** 2) / m

    def relative_sq_errors(W):
        if kind == "positive":
            terms = positive_random_features(x, W) * positive_random_features(y, W)
        else:
            both = rff_features(x, W) * rff_features(y, W)                    # cos parts, then sin parts
            terms = (both[:len(W)] + both[len(W):]) * torch.exp((x @ x + y @ y) / 2)
        est = terms.view(draws, m).sum(-1) * draws                          # features are scaled by 1/sqrt(draws m)
        assert_close(est[0], random_feature_kernel(x[None], y[None], W[:m], kind)[0, 0],
                     name="first draw vs random_feature_kernel")
        return (est / kernel - 1) ** 2

    iid = relative_sq_errors(torch.randn(draws * m, d, generator=gen, dtype=F64))
    orf = relative_sq_errors(orthogonal_gaussian(draws * m, d, seed=3, dtype=F64))
    se = lambda e: e.std().item() / math.sqrt(draws)
    assert abs(iid.mean().item() - exact_iid) < 3 * se(iid), (iid.mean().item(), exact_iid, se(iid))
    assert orf.mean().item() + 3 * se(orf) < exact_iid, (orf.mean().item(), se(orf), exact_iid)


def test_positive_beat_trig_where_kernel_small_M8_7(gen):
    """MSE of the exp(x.y) estimate over 60 i.i.d. draws at m = d = 16: positive < trigonometric features on the
    pairs with the smallest kernel values (Choromanski et al. 2021); the margin is about 10^6 over other seeds."""
    d = m = 16
    x, y = torch.randn(2, 64, d, generator=gen, dtype=F64) * 0.35
    y = torch.cat([y[:32], -x[32:] + 0.05 * y[32:]])                # half the pairs nearly opposite: small kernel
    exact = torch.exp((x * y).sum(-1))

    def mse(kind):
        errs = []
        for s in range(60):
            W = torch.randn(m, d, generator=torch.Generator().manual_seed(s), dtype=F64)
            est = torch.diagonal(random_feature_kernel(x, y, W, kind))
            errs.append((est - exact) ** 2)
        return torch.stack(errs).mean(0)

    small = exact.argsort()[:16]
    assert mse("positive")[small].mean() < 0.5 * mse("trig")[small].mean()


@pytest.mark.parametrize("kind", ["positive", "trig"])
def test_random_feature_mse_is_lemma_2_M8_7(kind, gen):
    """`random_feature_mse` (Lemma 2 of Choromanski et al. 2021) ≡ the mean squared error of
    `random_feature_kernel` over 4000 i.i.d. draws of W (m = 8) for six pairs (three with a kernel near 1,
    three nearly opposite), each within 3 standard errors; the standard error is below a tenth of the
    MSE, so a formula off by the trigonometric estimator's factor 1/2 fails."""
    d, m, draws = 6, 8, 4000
    x, y = F.normalize(torch.randn(2, 6, d, generator=gen, dtype=F64), dim=-1) * 0.35   # |x + y| <= 0.7:
    y = torch.cat([y[:3], -x[3:] + 0.05 * y[3:]])                    # tails light enough for 3 SE
    exact = torch.exp((x * y).sum(-1))
    sq = torch.stack([(torch.diagonal(random_feature_kernel(x, y, torch.randn(m, d, generator=gen, dtype=F64),
                                                            kind)) - exact) ** 2 for _ in range(draws)])
    se = sq.std(0) / math.sqrt(draws)
    want = random_feature_mse(x, y, m, kind)
    assert ((sq.mean(0) - want).abs() < 3 * se).all(), (sq.mean(0), want, se)
    assert (se < 0.1 * want).all()


@pytest.mark.parametrize("orthogonal", [False, True])
def test_performer_causal_equals_masked_quadratic_M8_7(orthogonal, gen):
    """Causal FAVOR+ (recurrent and chunk) ≡ the masked quadratic form built from phi+ by hand, with gradients."""
    q, k, v = torch.randn(3, 2, 17, 8, generator=gen, dtype=F64)
    m, scale = 32, 8 ** -0.5
    W = orthogonal_gaussian(m, 8, 5, dtype=F64) if orthogonal else torch.randn(m, 8, generator=gen, dtype=F64)

    def by_hand(q, k, v):
        phi = lambda x: torch.exp(x @ W.T * scale ** 0.5 - x.pow(2).sum(-1, keepdim=True) * scale / 2)
        A = (phi(q) @ phi(k).transpose(-2, -1)).tril()
        return A @ v / A.sum(-1, keepdim=True)

    for mode in ("recurrent", "chunk", "parallel"):
        assert_same_with_grads(lambda q, k, v: performer_attention(q, k, v, m, W=W, causal=True, mode=mode, chunk_size=4),
                               by_hand, (q, k, v), f"performer {mode}", gen)


def test_performer_future_key_cannot_change_the_past_M8_7(gen):
    """A future key with the largest possible exponent leaves earlier outputs bit-identical (the key shift
    depends on W only). Shifting by the max over all keys (performer-pytorch) scales every key feature
    by exp(-shift), so its denominator eps (1e-6 in its causal path) no longer cancels: the past changes."""
    q, k, v = torch.randn(3, 1, 12, 8, generator=gen)
    W = orthogonal_gaussian(64, 8, 0)
    k_big = k.clone()
    top = W.norm(dim=-1).argmax()
    k_big[..., 8, :] = W[top] * 8 ** 0.25                          # x = w_top: the largest exponent, |w_top|^2 / 2
    ours = [performer_attention(q, kk, v, 64, W=W, causal=True) for kk in (k, k_big)]
    assert torch.equal(ours[0][..., :8, :], ours[1][..., :8, :])

    def exponents(x):
        x = x * 8 ** -0.25
        return x @ W.T - 0.5 * x.pow(2).sum(-1, keepdim=True)

    fq = torch.exp(exponents(q) - exponents(q).amax(-1, keepdim=True))   # per-query shift, as both do
    global_shift = lambda k: torch.exp(exponents(k) - exponents(k).amax())
    pitfall = [linear_attention(fq, global_shift(kk), v, feature_map="identity", causal=True, eps=1e-6)
               for kk in (k, k_big)]
    assert (pitfall[0][..., :8, :] - pitfall[1][..., :8, :]).abs().max() > 1e-3


def test_performer_error_vs_softmax_falls_with_features_M8_7(gen):
    """Mean |FAVOR+ - softmax attention| over 5 seeds: 1024 features below 16 by more than 3x (the variance
    grows with |q|, |k|, so the inputs are kept at half the standard normal's size)."""
    q, k, v = torch.randn(3, 1, 32, 16, generator=gen, dtype=F64) * 0.5
    exact = softmax_attention(q, k, v, scale=16 ** -0.5)
    err = {m: sum((performer_attention(q, k, v, m, seed=s) - exact).abs().mean().item() for s in range(5)) / 5
           for m in (16, 1024)}
    assert err[1024] * 3 < err[16]


# ----------------------------------------------------------------------------- M8.11 capacity
def test_recall_error_is_the_crosstalk_sum_M8_11(gen):
    """`recall_error` equals the explicit per-key read (k_i.k_i) v_i + sum_{j!=i} (k_i.k_j) v_j."""
    keys, values = torch.randn(2, 3, 10, 6, generator=gen, dtype=F64)
    reads = torch.stack([sum((keys[:, i] * keys[:, j]).sum(-1, keepdim=True) * values[:, j] for j in range(10))
                         for i in range(10)], dim=1)
    want = (reads - values).flatten(1).norm(dim=-1) / values.flatten(1).norm(dim=-1)
    assert_close(recall_error(keys, values), want, name="recall error")


def test_capacity_curve_orthonormal_exact_random_grows_as_sqrt_n_over_d_M8_11():
    """Orthonormal keys recall exactly up to n = d; random unit keys at d = 32 give ≈ 0, 0.4, 1.0, 1.4, 2.0
    at n = 1, 8, 32, 64, 128, i.e. sqrt((n-1)/d) (within 10% over 40 trials)."""
    d = 32
    exact = capacity_curve(d, [1, 16, 32], orthonormal=True, trials=5)
    assert (exact < 1e-13).all()                                    # fp64 roundoff only
    ns = [1, 8, 32, 64, 128]
    err = capacity_curve(d, ns, trials=40, seed=1)
    assert err[0] < 1e-13
    theory = torch.tensor([math.sqrt((n - 1) / d) for n in ns[1:]], dtype=F64)
    assert ((err[1:] - theory).abs() < 0.1 * theory).all()
    with pytest.raises(ValueError, match="n <= d"):
        capacity_curve(4, [5], orthonormal=True)


# ----------------------------------------------------------------------------- M8.14 gate parameterisations
def _gate_params(kind, d_model, d_k, d_v, gen):
    w = lambda *s: torch.randn(*s, generator=gen, dtype=F64)
    return {"retnet": {"gamma": 0.9}, "mamba2": {"W": w(d_model, 1), "a": -0.5},
            "mlstm": {"W": w(d_model, 1)}, "gated_retention": {"W": w(d_model, 1), "tau": 16.0},
            "gla": {"W1": w(d_model, 2), "W2": w(2, d_k), "tau": 16.0},
            "hgrn2": {"W": w(d_model, d_k), "gamma": torch.linspace(0.0, 0.9, d_k, dtype=F64)},
            "rwkv6": {"W": w(d_model, d_k) * 0.3}, "gateloop": {"W": w(d_model, d_k)},
            "mamba": {"W1": w(d_model, 2), "W2": w(2, d_v), "A": w(d_k, d_v) * 0.3},
            "dfw": {"Wa": w(d_model, d_k), "Wb": w(d_model, d_v)}}[kind]


@pytest.mark.parametrize("kind", sorted(GATE_KINDS))
def test_make_log_gate_formulas_shapes_and_range_M8_14(kind, gen):
    """Each gate of GLA's Table 1 against its formula (written on the gate, not its log); scalar (L, 1),
    diagonal (L, d_k), matrix (L, d_k, d_v); exp(log gate) in (0, 1) (retnet: the constant gamma)."""
    d_model, d_k, d_v, L = 6, 4, 5, 9
    x = torch.randn(2, L, d_model, generator=gen, dtype=F64)
    p = _gate_params(kind, d_model, d_k, d_v, gen)
    gate = make_log_gate(kind, x, p).exp()
    sig = torch.sigmoid
    want = {
        "retnet": lambda: torch.full((2, L, 1), 0.9, dtype=F64),
        "mamba2": lambda: torch.exp(-torch.log1p(torch.exp(x @ p["W"])) * math.exp(p["a"])),
        "mlstm": lambda: sig(x @ p["W"]),
        "gated_retention": lambda: sig(x @ p["W"]) ** (1 / p["tau"]),
        "gla": lambda: sig(x @ p["W1"] @ p["W2"]) ** (1 / p["tau"]),
        "hgrn2": lambda: p["gamma"] + (1 - p["gamma"]) * sig(x @ p["W"]),
        "rwkv6": lambda: torch.exp(-torch.exp(x @ p["W"])),
        "gateloop": lambda: sig(x @ p["W"]),
        "mamba": lambda: torch.exp(-torch.log1p(torch.exp(x @ p["W1"] @ p["W2"])).unsqueeze(-2) * p["A"].exp()),
        "dfw": lambda: sig(x @ p["Wa"]).unsqueeze(-1) * sig(x @ p["Wb"]).unsqueeze(-2),
    }[kind]()
    assert_close(gate, want, name=f"{kind} gate")
    shape = {"scalar": (2, L, 1), "diagonal": (2, L, d_k), "outer": (2, L, d_k, d_v),
             "entry": (2, L, d_k, d_v)}[GATE_KINDS[kind]]
    assert gate.shape == shape
    assert (gate > 0).all() and (gate < 1).all()


def _gate_loop(q, k, v, log_g, d_k):
    """The gated recurrence written out, ``S_t = G_t * S_{t-1} + k_t v_t^T``, for a gate of any shape."""
    gate = log_g.exp()
    if gate.dim() == 3:                                              # (B, L, 1) or (B, L, d_k)
        gate = gate.expand(k.shape).unsqueeze(-1)
    S, outs = torch.zeros(q.shape[0], d_k, v.shape[-1], dtype=F64), []
    for t in range(q.shape[1]):
        S = gate[:, t] * S + k[:, t, :, None] * v[:, t, None, :]
        outs.append((q[:, t, :, None] * S).sum(-2) / math.sqrt(d_k))
    return torch.stack(outs, 1)


@pytest.mark.parametrize("kind", sorted(GATE_KINDS))
def test_every_table_gate_runs_chunked_M8_14(kind, gen):
    """Every gate of GLA's Table 1 has a chunk form equal to its recurrence (a loop here), in fp64:
    scalar and diagonal gates fold into q and k (one `gated_linear_attention` call); DFW's outer-product
    gate alpha beta^T folds alpha into q, k and beta into the values (v_j / B_j) and outputs (o_t B_t);
    Mamba's per-entry gate runs one value column at a time. A wrong taxonomy (e.g. "DFW does not
    factor") fails here, since the folded chunk form is checked against the loop."""
    d_model, d_k, d_v, L = 6, 4, 5, 13
    x = torch.randn(1, L, d_model, generator=gen, dtype=F64)
    q, k = torch.randn(2, 1, L, d_k, generator=gen, dtype=F64)
    v = torch.randn(1, L, d_v, generator=gen, dtype=F64)
    params = _gate_params(kind, d_model, d_k, d_v, gen)
    log_g = make_log_gate(kind, x, params)
    want = _gate_loop(q, k, v, log_g, d_k)
    assert reduces_to_gla(kind)
    structure = GATE_KINDS[kind]
    if structure in ("scalar", "diagonal"):
        got = gated_linear_attention(q, k, v, log_g.expand(k.shape), mode="chunk", chunk_size=4)
    elif structure == "outer":
        log_alpha, log_beta = F.logsigmoid(x @ params["Wa"]), F.logsigmoid(x @ params["Wb"])
        assert_close(log_g, log_alpha.unsqueeze(-1) + log_beta.unsqueeze(-2), name="dfw gate = alpha beta^T")
        B = log_beta.cumsum(-2).exp()                                # running product of beta, (1, L, d_v)
        got = gated_linear_attention(q, k, v / B, log_alpha, mode="chunk", chunk_size=4) * B
    else:
        got = gated_linear_attention_per_entry(q, k, v, log_g, mode="chunk", chunk_size=4)
        assert_close(got, gated_linear_attention_per_entry(q, k, v, log_g, mode="recurrent"), name="modes")
    assert_close(got, want, atol=1e-12, rtol=1e-12, name=f"{kind} chunk form vs recurrence")
    if structure in ("outer", "entry"):                              # the gate is not a per-key-dim one
        approx = gated_linear_attention(q, k, v, log_g.mean(-1), mode="recurrent")
        assert (approx - want).abs().max() > 1e-3


def test_reduces_to_gla_by_structure_M8_14():
    """The table's models and the elementwise structures reduce to `gated_linear_attention` (each model's route
    is checked against its loop above); a dense transition S_t = A_t S_{t-1} + k_t v_t^T (the delta rule's
    I - beta k k^T) mixes the rows of S and does not, although it has a chunk form of its own
    (tests/test_8_delta.py checks `delta_rule`'s against its loop)."""
    assert all(reduces_to_gla(k) for k in GATE_KINDS)
    assert [reduces_to_gla(s) for s in ("scalar", "diagonal", "outer", "entry", "dense")] == [True] * 4 + [False]
    with pytest.raises(ValueError, match="kind must be one of"):
        reduces_to_gla("matrix")


def test_per_entry_gate_bad_shape(gen):
    q = torch.randn(1, 5, 4, generator=gen)
    with pytest.raises(ValueError, match=r"log_g must have shape \(\.\.\., L, d_k, d_v\) = \(1, 5, 4, 3\)"):
        gated_linear_attention_per_entry(q, q, q[..., :3], torch.zeros(1, 5, 4))


@pytest.mark.parametrize("d", [16, 64, 128, 256, 512, 1024])
@pytest.mark.parametrize("causal", [False, True])
def test_performer_fp32_is_finite_and_close_to_fp64_at_every_head_size_M8_7(d, causal, gen):
    """fp32 against fp64 with the same W, head sizes up to 1024. The old key shift, the constant
    max |w|^2 / 2, grows with d: fp32 features underflowed to 0 (NaN at d = 256) and lost digits at 128
    (error 3e-4 here)."""
    q, k, v = torch.randn(3, 2, 3, 48, d, generator=gen)
    W = torch.randn(128, d, generator=gen)
    got = performer_attention(q, k, v, 128, W=W, causal=causal)
    want = performer_attention(q.double(), k.double(), v.double(), 128, W=W.double(), causal=causal)
    assert torch.isfinite(got).all()
    assert_close(got.double(), want, atol=1e-4, rtol=1e-4, name=f"performer fp32 vs fp64, d = {d}")


def test_make_log_gate_bad_input():
    x = torch.randn(3, 6)
    with pytest.raises(ValueError, match="kind must be one of"):
        make_log_gate("lstm", x, {})
    with pytest.raises(ValueError, match=r"missing \['tau'\]"):
        make_log_gate("gla", x, {"W1": torch.randn(6, 2), "W2": torch.randn(2, 4)})
    with pytest.raises(ValueError, match=r"params\['W'\] must be \(d_model"):
        make_log_gate("rwkv6", x, {"W": torch.randn(5, 4)})
    with pytest.raises(ValueError, match="must lie in"):
        make_log_gate("retnet", x, {"gamma": 1.5})


def test_random_feature_bad_input(gen):
    q = torch.randn(1, 5, 4, generator=gen)
    with pytest.raises(ValueError, match=r"W must be \(m, d\) with d = 4"):
        rfa_attention(q, q, q, torch.randn(8, 3))
    with pytest.raises(ValueError, match="n_features = 8 rows"):
        performer_attention(q, q, q, 8, W=torch.randn(9, 4))
    with pytest.raises(ValueError, match="sigma must be"):
        sample_rff(8, 4, sigma=0.0)
    with pytest.raises(ValueError, match="kind must be"):
        random_feature_kernel(q, q, torch.randn(8, 4), "cosine")


@pytest.mark.parametrize("fn", ["linformer", "rfa", "performer", "rff_features", "positive_features"])
def test_half_precision_runs_in_fp32_M8_3_M8_5_M8_6_M8_7(fn, gen):
    """bf16 inputs: computed in fp32 and rounded once on return, so the result is the fp32 result of the same
    (bf16-valued) inputs within bf16 tolerance, and comes back in bf16."""
    q, k, v = (torch.randn(1, 2, 24, 8, generator=gen) * 0.5 for _ in range(3))
    E = torch.randn(6, 24, generator=gen) / 5
    W = sample_rff(16, 8, seed=1)
    call = {"linformer": lambda q, k, v, P: linformer_attention(q, k, v, P, P),
            "rfa": lambda q, k, v, P: rfa_attention(q, k, v, W),
            "performer": lambda q, k, v, P: performer_attention(q, k, v, 32, causal=True),
            "rff_features": lambda q, k, v, P: rff_features(q, W),
            "positive_features": lambda q, k, v, P: positive_random_features(q, W)}[fn]
    half = [x.to(torch.bfloat16) for x in (q, k, v, E)]
    got = call(*half)
    assert got.dtype == torch.bfloat16
    assert_close(got, call(*[x.float() for x in half]), name=f"{fn} bf16 vs fp32")


def test_chunk_inter_update_refuses_a_copy(gen):
    """The chunk forms add the inter-chunk part with an in-place ``baddbmm_`` on ``out.flatten(0, -3)``;
    for a non-contiguous ``out`` that flatten is a copy and the update would vanish: it raises instead."""
    from xfam_lib.linear import _add_inter
    out = torch.zeros(2, 3, 4, 5, dtype=F64)
    q, S = torch.randn(2, 3, 4, 6, generator=gen, dtype=F64), torch.randn(2, 3, 6, 5, generator=gen, dtype=F64)
    _add_inter(out, q, S)
    assert_close(out, q @ S)
    with pytest.raises(RuntimeError, match="contiguous"):
        _add_inter(torch.zeros(3, 2, 4, 5, dtype=F64).transpose(0, 1), q, S)
