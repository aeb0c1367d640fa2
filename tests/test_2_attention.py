"""Chapter 2, self-attention: softmax numerics, scoring functions, soft lookup, heads (METHODS M2.x).

Every library form is checked against an independent reference: a Python loop, the closed form,
or PyTorch's own implementation. Expected numbers are recomputed here, not pasted.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.attention import (
    MultiHeadAttention,
    additive_score,
    attention_entropy,
    bilinear_score,
    cosine_score,
    dot_score,
    head_via_kron,
    log_softmax_lse,
    normalized_relu_attention,
    scaled_dot_product_attention,
    shared_qk_scores,
    soft_lookup,
    softmax_jacobian,
    softmax_naive,
    softmax_online,
    softmax_safe,
    tiled_attention,
)
from xfam_lib.positional import sinusoidal_encoding
from xfam_lib.testing import assert_close, check_permutation_equivariance, randn

F64 = torch.float64
HYP = settings(max_examples=25, deadline=None, derandomize=True)


# ----------------------------------------------------------------------------- M2.1 projections
def test_projections_act_token_by_token_M2_1(gen):
    """Per-row loop ≡ matrix form; perturbing token 2 leaves q_1 unchanged (E2.6);
    W^{Q,K,V,O} at d=512 without bias has 4·512² parameters."""
    mha = MultiHeadAttention(16, 4).double()
    x = randn(5, 16, gen=gen)
    q = mha.q_proj(x)
    rows = torch.stack([x[i] @ mha.q_proj.weight.T + mha.q_proj.bias for i in range(5)])
    assert_close(q, rows)
    x2 = x.clone()
    x2[2] += 1.0
    assert torch.equal(mha.q_proj(x2)[1], q[1])
    assert not torch.equal(mha.q_proj(x2)[2], q[2])
    n_params = sum(p.numel() for p in MultiHeadAttention(512, 8, bias=False).parameters())
    assert n_params == 4 * 512 * 512


# ----------------------------------------------------------------------------- M2.2 scaled dot-product attention
def test_sdpa_equals_harvard_attention_and_rows_sum_to_one_M2_2(gen):
    """Library weights ≡ the Harvard ``attention()`` (−1e9 fill, dropout off); rows sum to 1,
    unlike the seed formula (E2.1)."""
    d = 64
    q, k, v = randn(2, 3, 6, d, gen=gen), randn(2, 3, 6, d, gen=gen), randn(2, 3, 6, d, gen=gen)
    mask = torch.rand(2, 1, 6, 6, generator=gen) > 0.3
    mask[..., 0] = True                                              # every row keeps a key
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    p_harvard = torch.softmax(scores.masked_fill(mask == 0, -1e9), dim=-1)
    out, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert_close(weights, p_harvard)
    assert_close(out, p_harvard @ v)
    assert_close(scaled_dot_product_attention(q, k, v, mask), out)  # fused path ≡ formula path
    assert_close(weights.sum(-1), torch.ones(2, 3, 6, dtype=F64))


@HYP
@given(lq=st.integers(1, 9), lk=st.integers(1, 9), d=st.integers(1, 8), dv=st.integers(1, 8),
       p_keep=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_sdpa_random_shapes_and_masks_match_torch_M2_2(lq, lk, d, dv, p_keep, seed):
    """Property: fused ≡ formula ≡ ``F.scaled_dot_product_attention`` on rows with a key;
    empty rows → 0 (fp64, gradients included)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = randn(2, lq, d, gen=g, requires_grad=True), randn(2, lk, d, gen=g, requires_grad=True), \
        randn(2, lk, dv, gen=g, requires_grad=True)
    mask = torch.rand(2, lq, lk, generator=g) < p_keep
    has_key = mask.any(-1, keepdim=True)
    fused = scaled_dot_product_attention(q, k, v, mask)
    formula, _ = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key).masked_fill(~has_key, 0.0)
    assert_close(fused, ref)
    assert_close(formula, ref)
    cot = torch.randn(fused.shape, generator=g, dtype=F64)
    ref_grads = torch.autograd.grad((ref * cot).sum(), (q, k, v))
    for out in (fused, formula):
        for a, b in zip(torch.autograd.grad((out * cot).sum(), (q, k, v)), ref_grads):
            assert torch.isfinite(a).all()
            assert_close(a, b)


# ----------------------------------------------------------------------------- M2.3 soft lookup
def test_soft_lookup_limits_M2_3(gen):
    """tau → 0 returns the value of the best key; tau → ∞ the mean of the values; batched ≡ one query at a time."""
    K, V = randn(7, 4, gen=gen), randn(7, 3, gen=gen)
    q = randn(4, gen=gen)
    best = int(torch.argmax(K @ q))
    assert_close(soft_lookup(q, K, V, tau=1e-3), V[best], atol=1e-4, rtol=0)
    assert_close(soft_lookup(q, K, V, tau=1e6), V.mean(0), atol=1e-4, rtol=0)
    out, w = soft_lookup(q, K, V, tau=0.7, return_weights=True)
    assert_close(w, torch.softmax(K @ q / 0.7, dim=0))
    assert_close(out, w @ V)
    Q = randn(5, 4, gen=gen)
    assert_close(soft_lookup(Q, K, V, tau=0.7), torch.stack([soft_lookup(Q[i], K, V, tau=0.7) for i in range(5)]))
    with pytest.raises(ValueError, match="tau"):
        soft_lookup(q, K, V, tau=0.0)
    with pytest.raises(ValueError, match="K and V"):
        soft_lookup(q, K, V[:5])


# ----------------------------------------------------------------------------- M2.4 contextual re-embedding
def test_contextual_reembedding_and_renormalised_weights_M2_4():
    """M2.4: with identity projections each token's new vector is Σ_j a_ij x_j (≡ a loop), so an ambiguous token
    moves toward the cluster its context comes from; the often-quoted weights 0.2/0.1/0.5/0.3 sum to 1.1, and
    logits log(w) + c of the renormalised [2,1,5,3]/11 reproduce it through the library's softmax (any c)."""
    emb = {"transformer": [0.0, 0.6], "pole": [-2.0, 1.5], "fallen": [-1.6, 2.1], "wires": [-2.3, 0.8],
           "model": [2.0, 1.5], "language": [2.4, 0.8], "image": [1.7, 2.1]}
    new_x = {}
    for context in (["pole", "fallen", "wires"], ["model", "language", "image"]):
        X = torch.tensor([emb["transformer"]] + [emb[w] for w in context], dtype=F64)
        Y, A = scaled_dot_product_attention(X, X, X, scale=1.0, return_weights=True)
        loop = torch.stack([sum(torch.softmax(X @ X[i], 0)[j] * X[j] for j in range(4)) for i in range(4)])
        assert_close(Y, loop)
        new_x[context[0]] = Y[0]
    assert new_x["pole"][0] < emb["transformer"][0] < new_x["model"][0]      # pulled toward its context's sense
    stated = torch.tensor([0.2, 0.1, 0.5, 0.3], dtype=F64)                 # E2.14: sums to 1.1, not a distribution
    target = torch.tensor([2.0, 1.0, 5.0, 3.0], dtype=F64) / 11
    for c in (0.0, 3.0, -40.0):
        logits = torch.log(stated) + c                                       # log of the unnormalised weights
        _, w = scaled_dot_product_attention(torch.zeros(1, 1, dtype=F64), torch.zeros(4, 1, dtype=F64),
                                            torch.zeros(4, 1, dtype=F64), bias=logits[None], return_weights=True)
        assert_close(w[0], target, atol=1e-6, rtol=0)
        assert_close(softmax_safe(logits), target, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- M2.5 permutation equivariance
@HYP
@given(length=st.integers(2, 12), seed=st.integers(0, 2**16))
def test_self_attention_is_permutation_equivariant_M2_5(length, seed):
    """SA(PX) ≡ P·SA(X) in fp64 (E2.2: equivariant, not invariant); adding sinusoidal positions breaks it."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, 2).double()
    x = randn(1, length, 8, gen=g)
    with torch.no_grad():
        assert check_permutation_equivariance(mha, x, generator=g) < 1e-12
        perm = torch.roll(torch.arange(length), 1)                    # a permutation that moves every token
        assert not torch.allclose(mha(x[:, perm]), mha(x))            # equivariant, so not invariant
        pe = sinusoidal_encoding(length, 8).double()
        with_pos = mha(x[:, perm] + pe)
        assert (with_pos - mha(x + pe)[:, perm]).abs().max() > 1e-6


# ----------------------------------------------------------------------------- M2.7 multi-head attention
@pytest.mark.parametrize("n_heads", [1, 4])
def test_mha_equals_per_head_loop_M2_7(n_heads, gen):
    """Vectorised MHA ≡ a loop over heads, each projecting the full input (E2.3); h=1 ≡ SDPA followed by W^O."""
    d = 16
    mha = MultiHeadAttention(d, n_heads).double()
    x = randn(2, 5, d, gen=gen)
    dh = d // n_heads
    heads = []
    for h in range(n_heads):
        rows = slice(h * dh, (h + 1) * dh)
        q = x @ mha.q_proj.weight[rows].T + mha.q_proj.bias[rows]
        k = x @ mha.k_proj.weight[rows].T + mha.k_proj.bias[rows]
        v = x @ mha.v_proj.weight[rows].T + mha.v_proj.bias[rows]
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dh), dim=-1)
        heads.append(w @ v)
    expected = torch.cat(heads, dim=-1) @ mha.out_proj.weight.T + mha.out_proj.bias
    with torch.no_grad():
        assert_close(mha(x), expected)
        if n_heads == 1:
            sdpa = scaled_dot_product_attention(mha.q_proj(x), mha.k_proj(x), mha.v_proj(x))
            assert_close(mha(x), mha.out_proj(sdpa))


# ----------------------------------------------------------------------------- M2.8 QK / OV circuits
def test_head_via_kron_M2_8(gen):
    """(A ⊗ (W_V W_O)ᵀ) vec(X) ≡ A X W_V W_O (fp64); a head's W_Q^h W_K^hᵀ, cut from a library MHA layer with
    d = 64 and 8 heads, has rank d_h = 8 (scores of one head are a rank-d_h bilinear form)."""
    L, d, dh, d_out = 5, 6, 3, 4
    X, A = randn(L, d, gen=gen), torch.softmax(randn(L, L, gen=gen), dim=-1)
    W_V, W_O = randn(d, dh, gen=gen), randn(dh, d_out, gen=gen)
    assert_close(head_via_kron(X, A, W_V, W_O), A @ X @ W_V @ W_O)
    mha = MultiHeadAttention(64, 8).double()
    for h in (0, 7):
        rows = slice(h * mha.d_head, (h + 1) * mha.d_head)                # head h's slice of the projections
        qk = mha.q_proj.weight[rows].T @ mha.k_proj.weight[rows]          # (64, 64): x W_Q^h (y W_K^h)^T = x QK y^T
        assert int(torch.linalg.matrix_rank(qk)) == mha.d_head == 8
    with pytest.raises(ValueError, match="W_O"):
        head_via_kron(X, A, W_V, randn(dh + 1, d_out, gen=gen))
    with pytest.raises(ValueError, match="A"):
        head_via_kron(X, A[:-1], W_V, W_O)


# ----------------------------------------------------------------------------- M2.10 shared projection
def test_shared_qk_scores_symmetric_psd_M2_10(gen):
    """XWWᵀXᵀ is symmetric PSD but ≠ XXᵀ (E2.7); W = I gives exactly XXᵀ; separate W^Q ≠ W^K is asymmetric."""
    x, W = randn(7, 5, gen=gen), randn(5, 5, gen=gen)
    s = shared_qk_scores(x, W)
    assert_close(s, s.T)
    assert float(torch.linalg.eigvalsh(s).min()) >= -1e-8
    assert not torch.allclose(s, x @ x.T)
    assert_close(shared_qk_scores(x, torch.eye(5, dtype=F64)), x @ x.T)
    separate = (x @ W) @ (x @ randn(5, 5, gen=gen)).T
    assert float(torch.linalg.matrix_norm(separate - separate.T)) > 0
    with pytest.raises(ValueError, match="W"):
        shared_qk_scores(x, randn(4, 5, gen=gen))


# ----------------------------------------------------------------------------- M2.11 scoring functions
def test_additive_score_equals_loop_with_gradients_M2_11(gen):
    """w_vᵀ tanh(q_i W_q + k_j W_k) ≡ an explicit double loop, outputs and gradients (fp64), with d_q ≠ d_k."""
    q, k = randn(2, 3, 5, gen=gen, requires_grad=True), randn(2, 4, 6, gen=gen, requires_grad=True)
    W_q, W_k, w_v = (randn(5, 7, gen=gen, requires_grad=True), randn(6, 7, gen=gen, requires_grad=True),
                     randn(7, gen=gen, requires_grad=True))
    fast = additive_score(q, k, W_q, W_k, w_v)
    loop = torch.stack([torch.stack([torch.stack([w_v @ torch.tanh(q[b, i] @ W_q + k[b, j] @ W_k)
                                                  for j in range(4)]) for i in range(3)]) for b in range(2)])
    assert fast.shape == (2, 3, 4)
    assert_close(fast, loop)
    params = (q, k, W_q, W_k, w_v)
    for a, b in zip(torch.autograd.grad(fast.sum(), params), torch.autograd.grad(loop.sum(), params)):
        assert_close(a, b)
    with pytest.raises(ValueError, match="W_k"):
        additive_score(q, k, W_q, randn(5, 7, gen=gen), w_v)


def test_bilinear_dot_cosine_scores_M2_11(gen):
    """bilinear ≡ loop and ≡ dot for W = I; dot·(1/√d) then softmax ≡ SDPA weights;
    cosine ≡ ``F.cosine_similarity``/τ."""
    q, k = randn(3, 4, gen=gen), randn(5, 4, gen=gen)
    W = randn(4, 4, gen=gen)
    assert_close(bilinear_score(q, k, W), torch.tensor([[float(q[i] @ W @ k[j]) for j in range(5)] for i in range(3)],
                                                       dtype=F64))
    assert_close(bilinear_score(q, k, torch.eye(4, dtype=F64)), dot_score(q, k))
    _, weights = scaled_dot_product_attention(q, k, k, return_weights=True)
    assert_close(softmax_safe(dot_score(q, k, scale=0.5)), weights)
    cos = F.cosine_similarity(q[:, None, :], k[None, :, :], dim=-1)
    assert_close(cosine_score(q, k, tau=0.1), cos / 0.1)
    assert float(cosine_score(q, 3.0 * k).sub(cosine_score(q, k)).abs().max()) < 1e-12   # norms are dropped
    with pytest.raises(ValueError, match="q and k"):
        dot_score(q, randn(5, 3, gen=gen))
    with pytest.raises(ValueError, match="tau"):
        cosine_score(q, k, tau=-1.0)


def test_linear_concat_score_ignores_the_query_M2_11(gen):
    """E2.8: w₁ᵀq + w₂ᵀk is constant along a row in its query term, so two different queries get identical weights."""
    k = randn(6, 4, gen=gen)
    w1, w2 = randn(4, gen=gen), randn(4, gen=gen)
    q_a, q_b = randn(4, gen=gen), randn(4, gen=gen)
    weights = [softmax_safe(q @ w1 + k @ w2, dim=0) for q in (q_a, q_b)]
    assert float((weights[0] - weights[1]).abs().max()) < 1e-12
    Wq, Wk = randn(4, 8, gen=gen), randn(4, 8, gen=gen)
    wv = randn(8, gen=gen)
    with_tanh = [softmax_safe(additive_score(q[None], k, Wq, Wk, wv)[0], dim=0) for q in (q_a, q_b)]
    assert float((with_tanh[0] - with_tanh[1]).abs().max()) > 1e-3


# ----------------------------------------------------------------------------- M2.12 norm × cosine
def test_query_norm_is_an_inverse_temperature_M2_12(gen):
    """Scaling q by α ∈ {0.5, 1, 2, 4} keeps every row's argmax and strictly lowers its entropy."""
    q, K = randn(6, 8, gen=gen), randn(10, 8, gen=gen)
    weights = [softmax_safe(dot_score(alpha * q, K, scale=8 ** -0.5)) for alpha in (0.5, 1, 2, 4)]
    argmaxes = [w.argmax(-1) for w in weights]
    assert all(torch.equal(a, argmaxes[0]) for a in argmaxes)
    entropies = torch.stack([attention_entropy(w) for w in weights])
    assert bool((entropies[1:] < entropies[:-1]).all())


# ----------------------------------------------------------------------------- M2.13–M2.15 softmax numerics
def test_softmax_safe_large_logits_closed_form_M2_13():
    """softmax([1000, 1001, 1002]) = [1, e, e²]/(1 + e + e²) → [0.09003, 0.24473, 0.66524]; naive overflows to NaN."""
    x = torch.tensor([1000.0, 1001.0, 1002.0])
    e = math.e
    expected = torch.tensor([1.0, e, e * e]) / (1 + e + e * e)
    assert_close(softmax_safe(x), expected)
    assert [round(float(p), 5) for p in softmax_safe(x)] == [0.09003, 0.24473, 0.66524]
    assert torch.isnan(softmax_naive(torch.tensor([1000.0, 999.0]))).all()       # E2.11: inf / inf
    assert_close(softmax_naive(torch.tensor([1.0, 2.0])), torch.softmax(torch.tensor([1.0, 2.0]), 0))


@HYP
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), dim=st.integers(-1, 0),
       shift=st.floats(-1e3, 1e3), seed=st.integers(0, 2**16))
def test_softmax_safe_matches_torch_and_is_shift_invariant_M2_13(shape, dim, shift, seed):
    """softmax_safe ≡ ``torch.softmax`` (values and gradients), and softmax(x + c) = softmax(x)."""
    g = torch.Generator().manual_seed(seed)
    x = (10 * torch.randn(*shape, generator=g, dtype=F64)).requires_grad_()
    ours, ref = softmax_safe(x, dim), torch.softmax(x, dim)
    assert_close(ours, ref)
    assert_close(softmax_safe(x + shift, dim), ours)
    cot = torch.randn(shape, generator=g, dtype=F64)
    assert_close(torch.autograd.grad((ours * cot).sum(), x)[0], torch.autograd.grad((ref * cot).sum(), x)[0])


@HYP
@given(values=st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=40), chunk=st.integers(1, 7))
def test_softmax_online_matches_safe_and_torch_M2_14(values, chunk):
    """One pass over a generator (scalars or chunks) ≡ softmax_safe ≡ ``torch.softmax``; the running
    denominator satisfies the induction invariant d_j = Σ_{i≤j} exp(x_i − m_j) at every step."""
    x = torch.tensor(values, dtype=F64)
    expected = torch.softmax(x, 0)
    assert_close(softmax_online(v for v in values), expected)
    chunks = [x[i:i + chunk] for i in range(0, len(values), chunk)]
    probs, maxes, denoms = softmax_online(iter(chunks), trace=True)
    assert_close(probs, expected)
    assert_close(probs, softmax_safe(x))
    for j, (m_j, d_j) in enumerate(zip(maxes, denoms)):
        prefix = x[:min((j + 1) * chunk, len(values))]
        assert float(m_j) == float(prefix.max())
        assert_close(d_j, torch.exp(prefix - prefix.max()).sum())


def test_softmax_online_dtypes_and_errors_M2_14():
    probs = softmax_online([torch.tensor([1000.0, 999.0], dtype=torch.bfloat16)])
    assert probs.dtype == torch.bfloat16
    assert_close(probs, torch.softmax(torch.tensor([1000.0, 999.0], dtype=torch.bfloat16).double(), 0).bfloat16())
    assert softmax_online([1, 2, 3]).dtype == F64
    with pytest.raises(ValueError, match="at least one"):
        softmax_online(iter([]))
    with pytest.raises(TypeError, match="one dtype"):
        softmax_online([torch.tensor([1.0]), torch.tensor([1.0], dtype=F64)])
    # -inf entries get probability 0; a stream of only -inf has no distribution: NaN, as in torch
    ninf = float("-inf")
    assert_close(softmax_online([[ninf, 0.0], [ninf]]), torch.softmax(torch.tensor([ninf, 0.0, ninf], dtype=F64), 0))
    assert torch.isnan(softmax_online([[ninf, ninf]])).all() and torch.isnan(torch.softmax(torch.full((2,), ninf), 0)).all()


def test_log_softmax_lse_M2_15():
    """≡ ``torch.log_softmax`` at ±1000 (finite, gradients equal); fp32 log(softmax([0,−200])) = −inf
    but LSE gives −200 (E2.13); ``F.cross_entropy`` ≡ NLL of log_softmax_lse."""
    x = torch.tensor([[1000.0, -1000.0, 0.0], [-1000.0, -999.0, -1001.0]], dtype=F64, requires_grad=True)
    ours = log_softmax_lse(x)
    assert torch.isfinite(ours).all()
    assert_close(ours, torch.log_softmax(x, -1))
    cot = torch.tensor([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0]], dtype=F64)
    assert_close(torch.autograd.grad((ours * cot).sum(), x)[0],
                 torch.autograd.grad((torch.log_softmax(x, -1) * cot).sum(), x)[0])
    x32 = torch.tensor([0.0, -200.0])
    assert torch.log(torch.softmax(x32, 0))[1] == float("-inf")
    assert_close(log_softmax_lse(x32), torch.tensor([0.0, -200.0]))
    logits, target = torch.randn(4, 5, dtype=F64), torch.tensor([0, 3, 1, 4])
    assert_close(F.cross_entropy(logits, target), F.nll_loss(log_softmax_lse(logits), target))


# ----------------------------------------------------------------------------- M2.16 low precision
def test_upcast_softmax_beats_direct_bf16_M2_16(gen):
    """bf16 in → bf16 out; both within bf16 tolerance of fp64, and computing in fp32 then rounding once is more
    accurate than computing in bf16 (row-sum error and max error)."""
    x = (4 * torch.randn(64, 1024, generator=gen)).bfloat16()
    exact = torch.softmax(x.double(), dim=-1)
    upcast, direct = softmax_safe(x), softmax_safe(x, upcast=False)
    assert upcast.dtype == direct.dtype == torch.bfloat16
    assert_close(upcast, exact)
    err_up, err_direct = (upcast.double() - exact).abs().max(), (direct.double() - exact).abs().max()
    assert err_direct > err_up
    sum_up, sum_direct = (upcast.double().sum(-1) - 1).abs().mean(), (direct.double().sum(-1) - 1).abs().mean()
    assert sum_direct > sum_up


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_attention_returns_input_dtype_M2_16(dtype, gen):
    """SDPA (both paths), tiled attention and normalised-ReLU attention: half in → half out, close to fp64."""
    q, k, v = (torch.randn(2, 2, 37, 16, generator=gen).to(dtype) for _ in range(3))
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(), causal=True)
    for out in (scaled_dot_product_attention(q, k, v, causal=True),
                scaled_dot_product_attention(q, k, v, causal=True, return_weights=True)[0],
                tiled_attention(q, k, v, causal=True, block_q=16, block_k=8)):
        assert out.dtype == dtype
        assert_close(out, exact.to(dtype))
    relu_out = normalized_relu_attention(q, k, v)
    assert relu_out.dtype == dtype
    assert_close(relu_out, normalized_relu_attention(q.double(), k.double(), v.double()).to(dtype))


# ----------------------------------------------------------------------------- M2.17 entropy
def test_attention_entropy_values_M2_17(gen):
    """H([0.5, 0.25, 0.25]) = 1.5 ln 2 → 1.03972; uniform → log n; one-hot → 0;
    ≡ ``torch.distributions.Categorical``."""
    h = attention_entropy(torch.tensor([0.5, 0.25, 0.25], dtype=F64))
    assert_close(h, torch.tensor(1.5 * math.log(2), dtype=F64))
    assert round(float(h), 5) == 1.03972
    assert_close(attention_entropy(torch.full((7,), 1 / 7, dtype=F64)), torch.tensor(math.log(7), dtype=F64))
    assert float(attention_entropy(torch.tensor([0.0, 1.0, 0.0]))) == 0.0
    w = torch.softmax(randn(4, 6, gen=gen), dim=-1)
    assert_close(attention_entropy(w), torch.distributions.Categorical(probs=w).entropy())


@HYP
@given(n=st.integers(1, 30), temperature=st.floats(0.01, 100.0), seed=st.integers(0, 2**16))
def test_attention_entropy_bounds_M2_17(n, temperature, seed):
    """0 ≤ H ≤ log n for any softmax row."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    h = float(attention_entropy(softmax_safe(x / temperature)))
    assert -1e-12 <= h <= math.log(n) + 1e-12


# ----------------------------------------------------------------------------- M2.18 normalised ReLU
def test_normalized_relu_attention_M2_18(gen):
    """relu(s)/(Σ relu(s) + ε) ≡ the loop; rows sum to 1 except all-negative rows, which give 0,
    and NaN with ε = 0 (E2.17)."""
    q, k, v = randn(5, 4, gen=gen), randn(6, 4, gen=gen).abs(), randn(6, 3, gen=gen)
    q[2] = -q[2].abs()                                     # every score of row 2 is negative ...
    q[3] = 0.0                                             # ... and every score of row 3 is zero
    out, w = normalized_relu_attention(q, k, v, eps=1e-6, return_weights=True)
    s = q @ k.T / 2.0
    loop = torch.stack([torch.relu(s[i]) / (torch.relu(s[i]).sum() + 1e-6) for i in range(5)])
    assert_close(w, loop)
    assert_close(out, loop @ v)
    empty = (s <= 0).all(-1)
    assert empty[2] and empty[3]
    relu_sums = torch.relu(s).sum(-1)[~empty]
    assert_close(w.sum(-1)[~empty], relu_sums / (relu_sums + 1e-6))          # = 1 up to eps
    assert bool((w[empty] == 0).all()) and bool((out[empty] == 0).all())
    assert torch.isnan(normalized_relu_attention(q, k, v, eps=0.0)[empty]).all()
    with pytest.raises(ValueError, match="eps"):
        normalized_relu_attention(q, k, v, eps=-1.0)


def test_softmax_family_bad_input_names_the_argument():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        softmax_safe([1.0, 2.0])
    with pytest.raises(TypeError, match="x must be a floating-point"):
        log_softmax_lse(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="x must have at least 1 dims"):
        softmax_naive(torch.tensor(1.0))
    with pytest.raises(TypeError, match="y must be a floating-point"):
        softmax_jacobian(torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="weights must be a torch.Tensor"):
        attention_entropy([0.5, 0.5])
    with pytest.raises(TypeError, match="real numbers"):
        softmax_online([True, False])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_reach_the_fused_kernel_in_their_dtype_unless_a_bias_is_given(dtype, monkeypatch, gen):
    """The docstring's promise on halves: without a bias the fused path hands the half tensors to
    PyTorch's kernel; with a bias it computes in fp32 so the bias is not rounded. Both return the
    input dtype."""
    seen = []
    kernel = F.scaled_dot_product_attention

    def recording_kernel(q, k, v, **kwargs):
        seen.append((q.dtype, None if kwargs.get("attn_mask") is None else kwargs["attn_mask"].dtype))
        return kernel(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording_kernel)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=gen).to(dtype) for _ in range(3))
    bias = torch.randn(5, 5, generator=gen)
    assert scaled_dot_product_attention(q, k, v).dtype == dtype
    assert scaled_dot_product_attention(q, k, v, bias=bias).dtype == dtype
    assert seen == [(dtype, None), (torch.float32, torch.float32)]
