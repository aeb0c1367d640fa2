"""Chapter 8, linear attention: kernel linear attention in its three modes, gated linear attention,
retention, the Taylor-2 feature map and the reference chunk forms the chapter shows (METHODS M8.8, M8.9,
M8.10, M8.13, M8.15).

Every reference is written here, independently of ``xfam_lib.linear``: a per-timestep loop over the
explicit kernel-weighted sums for linear attention (feature maps re-derived from their formulas), the
step-by-step state recurrence of API.md and the unrolled product form for GLA, the decay matrix
``D[n, m] = gamma^(n-m)`` for retention, and the polynomial kernel ``1 + s + s²/2`` for Taylor-2.
flash-linear-attention's pure-PyTorch references (fla-core 0.6.0, loaded by path because ``fla.ops``
imports triton) are the outside cross-check, in ``test_8_oracles.py``.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.bench import largest_intermediate
from xfam_lib.linear import (
    FEATURE_MAPS,
    elu_feature_map,
    gated_linear_attention,
    linear_attention,
    retention,
    taylor2_features,
)
from xfam_lib.testing import assert_close, check_causal, randn

F64 = torch.float64
HYP = settings(max_examples=25, deadline=None, derandomize=True)
MODES = ("parallel", "recurrent", "chunk")
GLA_MODES = ("recurrent", "parallel", "chunk")

# The feature maps from their definitions, not from the library.
PHI = {
    "elu": lambda x: torch.where(x > 0, x + 1, torch.exp(x)),
    "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "identity": lambda x: x,
    "softplus": lambda x: torch.log1p(torch.exp(x)),
}


def log_gates(*shape, gen, low, high, dtype=F64):
    """Log forget gates drawn uniformly from [low, high] (both <= 0)."""
    return low + (high - low) * torch.rand(*shape, generator=gen, dtype=dtype)


def outputs_and_grads(fn, inputs, cots):
    """Run ``fn(*inputs)`` on fresh leaves; return its outputs (a tuple) and d(sum_i <out_i, cot_i>)/d inputs."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * c).sum() for o, c in zip(outs, cots))
    return tuple(o.detach() for o in outs), torch.autograd.grad(loss, leaves)


def assert_same(got, want, name):
    (g_out, g_grads), (w_out, w_grads) = got, want
    for i, (a, b) in enumerate(zip(g_out, w_out)):
        assert_close(a, b, name=f"{name} output {i}")
    for i, (a, b) in enumerate(zip(g_grads, w_grads)):
        assert_close(a, b, name=f"{name} grad {i}")


# ----------------------------------------------------------------------------- references
def ref_linear_attention(q, k, v, phi, *, causal, normalize, eps=1e-6):
    """One timestep at a time: o_t = Σ_{j∈J(t)} (φ(q_t)·φ(k_j)) v_j, divided by
    Σ_{j∈J(t)} φ(q_t)·φ(k_j) + eps when normalising; J(t) = {0..t} (causal) or every j."""
    fq, fk = phi(q), phi(k)
    length = q.shape[-2]
    outs = []
    for t in range(length):
        stop = t + 1 if causal else length
        w = (fq[..., t:t + 1, :] * fk[..., :stop, :]).sum(-1)               # (..., stop) kernel values
        num = (w.unsqueeze(-1) * v[..., :stop, :]).sum(-2)
        outs.append(num / (w.sum(-1, keepdim=True) + eps) if normalize else num)
    return torch.stack(outs, dim=-2)


def ref_gla(q, k, v, log_g, scale, initial_state=None):
    """API.md, step by step: S_t = diag(exp(log_g_t)) S_{t-1} + k_t v_t^T, o_t = (scale q_t)^T S_t."""
    S = torch.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]), dtype=q.dtype)
    if initial_state is not None:
        S = S + initial_state
    outs = []
    for t in range(q.shape[-2]):
        S = torch.exp(log_g[..., t, :]).unsqueeze(-1) * S + torch.einsum("...a,...b->...ab", k[..., t, :], v[..., t, :])
        outs.append(torch.einsum("...a,...ab->...b", scale * q[..., t, :], S))
    return torch.stack(outs, dim=-2), S


def ref_decay_mask(gamma, length):
    """D[n, m] = gamma^(n-m) for n >= m, else 0, entry by entry."""
    return torch.tensor([[gamma ** (n - m) if n >= m else 0.0 for m in range(length)] for n in range(length)],
                        dtype=F64)


# ----------------------------------------------------------------------------- M8.8 feature maps, non-causal form
def test_feature_maps_match_their_formulas_M8_8(gen):
    """elu+1 is x+1 for x>0 and e^x otherwise (so always > 0); relu and identity are what they say."""
    x = randn(1000, gen=gen) * 4
    assert set(FEATURE_MAPS) == {"elu", "relu", "identity"}
    assert_close(elu_feature_map(x), PHI["elu"](x))
    assert_close(FEATURE_MAPS["elu"](x), PHI["elu"](x))
    assert_close(FEATURE_MAPS["relu"](x), PHI["relu"](x))
    assert torch.equal(FEATURE_MAPS["identity"](x), x)
    assert bool((elu_feature_map(torch.tensor([-30.0, -1.0, 0.0, 2.0], dtype=F64)) > 0).all())


def test_linear_attention_associativity_M8_8(gen):
    """Without a softmax, (Q Kᵀ) V = Q (Kᵀ V): identity features, no normaliser, non-causal, every mode."""
    q, k, v = randn(2, 3, 29, 6, gen=gen), randn(2, 3, 29, 6, gen=gen), randn(2, 3, 29, 4, gen=gen)
    left = (q @ k.transpose(-2, -1)) @ v                                    # builds the 29 x 29 matrix
    right = q @ (k.transpose(-2, -1) @ v)                                   # builds only 6 x 4
    assert_close(left, right)
    for mode in MODES:
        out = linear_attention(q, k, v, feature_map="identity", normalize=False, mode=mode, chunk_size=8)
        assert_close(out, left, name=mode)


def test_linear_attention_builds_no_length_squared_tensor_M8_8(gen):
    """The recurrent and chunk forms never allocate an L x L tensor (``bench.largest_intermediate``);
    the parallel form does."""
    length, chunk = 256, 16
    q, k, v = (randn(1, 1, length, 8, gen=gen) for _ in range(3))
    for causal in (False, True):
        parallel = largest_intermediate(lambda: linear_attention(q, k, v, causal=causal, mode="parallel"))
        assert parallel >= length * length
        for mode in ("recurrent", "chunk"):
            numel = largest_intermediate(
                lambda: linear_attention(q, k, v, causal=causal, mode=mode, chunk_size=chunk))
            assert numel <= length * chunk, (mode, causal, numel)


# ----------------------------------------------------------------------------- M8.9 the three modes
CASES = [("elu", True), ("elu", False), ("relu", True), ("relu", False), ("identity", False), ("softplus", True)]


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("feature_map,normalize", CASES)
def test_linear_attention_modes_agree_M8_9(feature_map, normalize, causal, gen):
    """parallel ≡ recurrent ≡ chunk (C ∈ {1, 7, 16, L}, L = 23 is a multiple of none but 1 and L) ≡ the
    per-timestep loop, outputs and gradients, fp64 (M8.8 for the non-causal half). A callable
    (softplus) goes through the same path as the named maps."""
    shape = (2, 3, 23)
    q, k, v = randn(*shape, 4, gen=gen), randn(*shape, 4, gen=gen), randn(*shape, 5, gen=gen)
    cot = (randn(*shape, 5, gen=gen),)
    fmap = PHI["softplus"] if feature_map == "softplus" else feature_map
    want = outputs_and_grads(
        lambda q, k, v: ref_linear_attention(q, k, v, PHI[feature_map], causal=causal, normalize=normalize),
        (q, k, v), cot)
    for mode, chunk in [("parallel", 64), ("recurrent", 64), ("chunk", 1), ("chunk", 7), ("chunk", 16),
                        ("chunk", 23)]:
        got = outputs_and_grads(
            lambda q, k, v: linear_attention(q, k, v, feature_map=fmap, causal=causal, normalize=normalize,
                                             mode=mode, chunk_size=chunk), (q, k, v), cot)
        assert_same(got, want, f"{mode}(C={chunk})")


@HYP
@given(length=st.integers(1, 40), chunk=st.integers(1, 45), d=st.integers(1, 5), dv=st.integers(1, 5),
       causal=st.booleans(), normalize=st.booleans(), seed=st.integers(0, 2**16))
def test_linear_attention_modes_agree_random_lengths_M8_9(length, chunk, d, dv, causal, normalize, seed):
    """Any L, any chunk size (dividing L or not, larger than L or not): the three modes agree."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = randn(2, length, d, gen=gen), randn(2, length, d, gen=gen), randn(2, length, dv, gen=gen)
    kw = dict(causal=causal, normalize=normalize, chunk_size=chunk)
    want = ref_linear_attention(q, k, v, PHI["elu"], causal=causal, normalize=normalize)
    for mode in MODES:
        assert_close(linear_attention(q, k, v, mode=mode, **kw), want, name=mode)


@pytest.mark.parametrize("mode", MODES)
def test_linear_attention_causal_ignores_the_future_M8_9(mode, gen):
    """Perturbing q, k, v at positions >= 9 leaves outputs 0..8 unchanged (exactly, causal=True);
    the non-causal form does change them, so the check has teeth."""
    x = randn(3, 2, 2, 20, 4, gen=gen)                                       # stacked q, k, v

    def run(causal):
        return lambda x: linear_attention(x[0], x[1], x[2], causal=causal, mode=mode, chunk_size=6)
    check_causal(run(True), x, position=9)
    with pytest.raises(AssertionError, match="not causal"):
        check_causal(run(False), x, position=9)


def test_linear_attention_fp32_and_bf16_M8_9(gen):
    """fp32 keeps the fp32 tolerance against the fp64 loop (outputs and gradients, every mode). bf16 is
    computed in fp32 and rounded once on return, so it is held to bf16's tolerance (eps 2^-8)."""
    q, k, v = randn(2, 2, 33, 8, gen=gen), randn(2, 2, 33, 8, gen=gen), randn(2, 2, 33, 8, gen=gen)
    cot = (randn(2, 2, 33, 8, gen=gen),)
    for causal in (False, True):
        want = outputs_and_grads(
            lambda q, k, v: ref_linear_attention(q, k, v, PHI["elu"], causal=causal, normalize=True), (q, k, v), cot)
        for mode in MODES:
            got = outputs_and_grads(
                lambda q, k, v: linear_attention(q, k, v, causal=causal, mode=mode, chunk_size=10),
                (q.float(), k.float(), v.float()), tuple(c.float() for c in cot))
            assert got[0][0].dtype == torch.float32
            assert_same(got, want, f"fp32 {mode}")
            qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
            out = linear_attention(qb, kb, vb, causal=causal, mode=mode, chunk_size=10)
            assert out.dtype == torch.bfloat16
            ref = ref_linear_attention(qb.double(), kb.double(), vb.double(), PHI["elu"], causal=causal,
                                       normalize=True)
            assert_close(out, ref, name=f"bf16 {mode}")


# ----------------------------------------------------------------------------- M8.10 Taylor-2
@HYP
@given(d=st.integers(1, 8), n=st.integers(1, 6), scale=st.floats(0.1, 3.0), seed=st.integers(0, 2**16))
def test_taylor2_kernel_identity_M8_10(d, n, scale, seed):
    """φ(q)·φ(k) = 1 + q·k + (q·k)²/2 for every pair (fp64, to round-off); φ has 1 + d + d² features."""
    gen = torch.Generator().manual_seed(seed)
    q, k = scale * randn(n, d, gen=gen), scale * randn(n + 1, d, gen=gen)
    fq, fk = taylor2_features(q), taylor2_features(k)
    assert fq.shape == (n, 1 + d + d * d)
    s = q @ k.T
    assert_close(fq @ fk.T, 1 + s + s * s / 2)


def test_taylor2_linear_attention_is_polynomial_kernel_attention_M8_10(gen):
    """linear_attention with taylor2 features ≡ attention with weights 1 + s + s²/2 (s = q·k), normalised
    by their row sums, causal and not, every mode (the feature size 1 + d + d² differs from d)."""
    q, k, v = (randn(2, 17, 3, gen=gen) for _ in range(3))
    w = 1 + q @ k.transpose(-2, -1) + (q @ k.transpose(-2, -1)) ** 2 / 2     # > 0: 1 + s + s²/2 has no real root
    for causal in (False, True):
        wc = torch.tril(w) if causal else w
        want = (wc @ v) / (wc.sum(-1, keepdim=True) + 1e-6)
        for mode in MODES:
            out = linear_attention(q, k, v, feature_map=taylor2_features, causal=causal, mode=mode, chunk_size=5)
            assert_close(out, want, name=f"{mode} causal={causal}")


# ----------------------------------------------------------------------------- M8.13 gated linear attention
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_gla_modes_agree_with_loop_M8_13(with_state, scale, gen):
    """recurrent ≡ log-space parallel ≡ chunk (C ∈ {1, 5, 16, L}) ≡ the step loop: outputs, final state and
    gradients (q, k, v, log_g, initial_state). ``scale=None`` means 1/√d_k."""
    shape, d_k, d_v = (2, 3, 21), 4, 5
    q, k, v = randn(*shape, d_k, gen=gen), randn(*shape, d_k, gen=gen), randn(*shape, d_v, gen=gen)
    log_g = log_gates(*shape, d_k, gen=gen, low=-1.5, high=0.0)
    inputs = (q, k, v, log_g) + ((randn(2, 3, d_k, d_v, gen=gen),) if with_state else ())
    cots = (randn(*shape, d_v, gen=gen), randn(2, 3, d_k, d_v, gen=gen))
    ref_scale = d_k ** -0.5 if scale is None else scale
    want = outputs_and_grads(lambda q, k, v, g, *s0: ref_gla(q, k, v, g, ref_scale, *s0), inputs, cots)
    for mode, chunk in [("recurrent", 64), ("parallel", 64), ("chunk", 1), ("chunk", 5), ("chunk", 16),
                        ("chunk", 21)]:
        def run(q, k, v, g, *s0):
            return gated_linear_attention(q, k, v, g, mode=mode, chunk_size=chunk, scale=scale,
                                          initial_state=s0[0] if s0 else None, return_final_state=True)
        assert_same(outputs_and_grads(run, inputs, cots), want, f"{mode}(C={chunk})")


def test_gla_unrolled_product_form_M8_13(gen):
    """o_t = Σ_{j≤t} Σ_f (s q_tf) k_jf (Π_{m=j+1..t} g_mf) v_j + Σ_f (s q_tf)(Π_{m≤t} g_mf) S0[f], with the
    gates multiplied out explicitly (no cumulative sums, no recurrence), against every mode."""
    length, d_k, d_v = 9, 3, 2
    q, k, v = randn(length, d_k, gen=gen), randn(length, d_k, gen=gen), randn(length, d_v, gen=gen)
    g = torch.rand(length, d_k, generator=gen, dtype=F64) * 0.9 + 0.05        # gates in (0.05, 0.95)
    s0 = randn(d_k, d_v, gen=gen)
    s = 0.5
    want = torch.zeros(length, d_v, dtype=F64)
    for t in range(length):
        for j in range(t + 1):
            decay = torch.prod(g[j + 1:t + 1], dim=0)                          # (d_k,); empty product = 1
            want[t] += (s * q[t] * k[j] * decay).sum() * v[j]
        want[t] += (s * q[t] * torch.prod(g[:t + 1], dim=0)) @ s0
    for mode in GLA_MODES:
        out = gated_linear_attention(q, k, v, g.log(), mode=mode, chunk_size=4, scale=s, initial_state=s0)
        assert_close(out, want, name=mode)


@HYP
@given(length=st.integers(1, 40), chunk=st.integers(1, 45), d_k=st.integers(1, 4), d_v=st.integers(1, 4),
       strength=st.floats(0.0, 4.0), seed=st.integers(0, 2**16))
def test_gla_modes_agree_random_lengths_M8_13(length, chunk, d_k, d_v, strength, seed):
    """Any L and chunk size, gates from none (log g = 0) to strong: outputs and final states agree with the loop."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = randn(2, length, d_k, gen=gen), randn(2, length, d_k, gen=gen), randn(2, length, d_v, gen=gen)
    log_g = log_gates(2, length, d_k, gen=gen, low=-strength, high=0.0)
    s0 = randn(2, d_k, d_v, gen=gen)
    want_out, want_state = ref_gla(q, k, v, log_g, d_k ** -0.5, s0)
    for mode in GLA_MODES:
        out, state = gated_linear_attention(q, k, v, log_g, mode=mode, chunk_size=chunk, initial_state=s0,
                                            return_final_state=True)
        assert_close(out, want_out, name=f"{mode} out")
        assert_close(state, want_state, name=f"{mode} state")


@pytest.mark.parametrize("mode", GLA_MODES)
def test_gla_state_carries_across_calls_M8_13(mode, gen):
    """Running [0, 13) and then [13, 30) from the returned state ≡ one run over [0, 30) (chunked prefill)."""
    q, k, v = randn(2, 30, 4, gen=gen), randn(2, 30, 4, gen=gen), randn(2, 30, 3, gen=gen)
    log_g = log_gates(2, 30, 4, gen=gen, low=-1.0, high=0.0)
    full, full_state = gated_linear_attention(q, k, v, log_g, mode=mode, chunk_size=8, return_final_state=True)
    first, state = gated_linear_attention(q[:, :13], k[:, :13], v[:, :13], log_g[:, :13], mode=mode, chunk_size=8,
                                          return_final_state=True)
    second, end_state = gated_linear_attention(q[:, 13:], k[:, 13:], v[:, 13:], log_g[:, 13:], mode=mode,
                                               chunk_size=8, initial_state=state, return_final_state=True)
    assert_close(torch.cat([first, second], dim=1), full)
    assert_close(end_state, full_state)


@pytest.mark.parametrize("mode", GLA_MODES)
def test_gla_decoding_one_token_at_a_time_equals_the_full_call_M8_13(mode, gen):
    """Decoding: one call per position, each from the previous call's final state (starting from a random
    S_0), concatenated ≡ one call over the whole sequence in the same mode ≡ the step loop, outputs and final
    state. Chunk mode pads every one-token call to its chunk (C = 8 > 1) and splits the full call into
    chunks that do not divide L = 19."""
    shape, d_k, d_v = (2, 3, 19), 4, 5
    q, k, v = randn(*shape, d_k, gen=gen), randn(*shape, d_k, gen=gen), randn(*shape, d_v, gen=gen)
    log_g = log_gates(*shape, d_k, gen=gen, low=-2.0, high=0.0)
    s0 = randn(2, 3, d_k, d_v, gen=gen)
    full, full_state = gated_linear_attention(q, k, v, log_g, mode=mode, chunk_size=8, initial_state=s0,
                                              return_final_state=True)
    state, steps = s0, []
    for t in range(shape[-1]):
        one = slice(t, t + 1)
        out, state = gated_linear_attention(q[..., one, :], k[..., one, :], v[..., one, :], log_g[..., one, :],
                                            mode=mode, chunk_size=8, initial_state=state, return_final_state=True)
        steps.append(out)
    decoded = torch.cat(steps, dim=-2)
    assert_close(decoded, full, name=f"{mode}: decoded one token at a time vs the full call")
    assert_close(state, full_state, name=f"{mode}: final state after decoding vs the full call")
    want_out, want_state = ref_gla(q, k, v, log_g, d_k ** -0.5, s0)
    assert_close(decoded, want_out, name=f"{mode}: decoded vs the step loop")
    assert_close(state, want_state, name=f"{mode}: decoded final state vs the step loop")


def test_gla_without_decay_is_causal_linear_attention_M8_13(gen):
    """log g = 0 and scale = 1: GLA is unnormalised causal linear attention with identity features."""
    q, k, v = randn(2, 2, 19, 4, gen=gen), randn(2, 2, 19, 4, gen=gen), randn(2, 2, 19, 3, gen=gen)
    want = ref_linear_attention(q, k, v, PHI["identity"], causal=True, normalize=False)
    zeros = torch.zeros_like(k)
    for mode in GLA_MODES:
        assert_close(gated_linear_attention(q, k, v, zeros, mode=mode, chunk_size=6, scale=1.0), want, name=mode)
    assert_close(linear_attention(q, k, v, feature_map="identity", causal=True, normalize=False), want)


def test_gla_strong_gates_stay_finite_M8_13(gen):
    """log g ≈ −5 per step over 256 steps (cumulative sums reach ≈ −1280, e^−1280 underflows even fp64):
    the log-space parallel and chunk forms stay finite in fp32, forward and backward, and match the fp64
    loop to fp32 tolerance; the only exponents they take are ≤ 0."""
    shape, d_k = (1, 2, 256), 8
    q, k, v = randn(*shape, d_k, gen=gen), randn(*shape, d_k, gen=gen), randn(*shape, d_k, gen=gen)
    log_g = log_gates(*shape, d_k, gen=gen, low=-5.5, high=-4.5)
    assert float(log_g.sum(-2).max()) < -1100
    cots = (randn(*shape, d_k, gen=gen), randn(1, 2, d_k, d_k, gen=gen))
    want = outputs_and_grads(lambda q, k, v, g: ref_gla(q, k, v, g, d_k ** -0.5), (q, k, v, log_g), cots)
    f32 = tuple(x.float() for x in (q, k, v, log_g))
    for mode, chunk in [("parallel", 64), ("chunk", 64), ("chunk", 48)]:
        got = outputs_and_grads(
            lambda q, k, v, g: gated_linear_attention(q, k, v, g, mode=mode, chunk_size=chunk,
                                                      return_final_state=True),
            f32, tuple(c.float() for c in cots))
        for t in got[0] + got[1]:
            assert bool(torch.isfinite(t).all()), mode
        assert_same(got, want, f"fp32 {mode}(C={chunk})")


def test_gla_naive_cumprod_form_overflows_log_space_does_not_M8_13(gen):
    """The textbook factorisation ((Q ⊙ B)(K / B)ᵀ ⊙ M) V with B = cumprod(g) breaks in fp32 at L = 2000,
    g ≈ 0.88: B underflows to 0, 1/B to inf, and the output fills with NaN/inf. The log-space parallel and
    the chunk forms stay finite and match the fp64 loop to fp32 tolerance."""
    length, d_k = 2000, 2
    q, k, v = (randn(1, length, d_k, gen=gen) for _ in range(3))
    log_g = log_gates(1, length, d_k, gen=gen, low=math.log(0.86), high=math.log(0.90))
    q32, k32, v32, g32 = (x.float() for x in (q, k, v, log_g))
    b = torch.cumprod(g32.exp(), dim=-2)
    naive = torch.tril((q32 * b) @ (k32 / b).transpose(-2, -1)) @ v32
    assert float(b.min()) == 0.0 and not bool(torch.isfinite(naive).all())
    want, _ = ref_gla(q, k, v, log_g, 1.0)
    for mode in ("parallel", "chunk"):
        out = gated_linear_attention(q32, k32, v32, g32, mode=mode, scale=1.0)
        assert bool(torch.isfinite(out).all())
        assert_close(out, want, name=mode)


def test_gla_dtypes_M8_13(gen):
    """fp32 meets the fp32 tolerance against the fp64 loop. bf16: output bf16 within bf16 tolerance (fp32 inside,
    one rounding on return); the final state comes back in fp32; an fp32 initial state is accepted."""
    q, k, v = randn(2, 2, 27, 8, gen=gen), randn(2, 2, 27, 8, gen=gen), randn(2, 2, 27, 8, gen=gen)
    log_g = log_gates(2, 2, 27, 8, gen=gen, low=-1.0, high=0.0)
    s0 = randn(2, 2, 8, 8, gen=gen)
    want_out, want_state = ref_gla(q, k, v, log_g, 8 ** -0.5, s0)
    for mode in GLA_MODES:
        out, state = gated_linear_attention(q.float(), k.float(), v.float(), log_g.float(), mode=mode, chunk_size=10,
                                            initial_state=s0.float(), return_final_state=True)
        assert out.dtype == state.dtype == torch.float32
        assert_close(out, want_out, name=f"fp32 {mode}")
        assert_close(state, want_state, name=f"fp32 {mode} state")
        qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
        out, state = gated_linear_attention(qb, kb, vb, log_g.float(), mode=mode, chunk_size=10,
                                            initial_state=s0.float(), return_final_state=True)
        assert out.dtype == torch.bfloat16 and state.dtype == torch.float32
        ref_out, ref_state = ref_gla(*(x.double() for x in (qb, kb, vb, log_g.float())), 8 ** -0.5,
                                     s0.float().double())
        assert_close(out, ref_out, name=f"bf16 {mode}")
        assert_close(state, ref_state, name=f"bf16 {mode} state (fp32, so fp32 tolerance)")


# ----------------------------------------------------------------------------- M8.15 retention
def test_retention_matches_decay_mask_M8_15(gen):
    """(Q Kᵀ ⊙ D) V with D[n, m] = γ^(n−m) (n ≥ m), one γ per head, every mode, gradients included
    (γ too)."""
    gammas = (0.5, 0.9, 0.99)
    q, k, v = randn(2, 3, 26, 4, gen=gen), randn(2, 3, 26, 4, gen=gen), randn(2, 3, 26, 5, gen=gen)
    gamma = torch.tensor(gammas, dtype=F64)
    cot = (randn(2, 3, 26, 5, gen=gen),)

    n = torch.arange(26, dtype=F64)
    powers, lower = (n[:, None] - n[None, :]).clamp_min(0), n[:, None] >= n[None, :]
    for g in gammas:                                      # the differentiable D below ≡ the entry-by-entry table
        assert_close(g ** powers * lower, ref_decay_mask(g, 26))

    def ref(q, k, v, gamma):
        D = torch.stack([g ** powers * lower for g in gamma])              # (H, L, L)
        return ((q @ k.transpose(-2, -1)) * D) @ v
    want = outputs_and_grads(ref, (q, k, v, gamma), cot)
    for mode, chunk in [("parallel", 64), ("recurrent", 64), ("chunk", 7), ("chunk", 26)]:
        got = outputs_and_grads(lambda q, k, v, g: retention(q, k, v, g, mode=mode, chunk_size=chunk),
                                (q, k, v, gamma), cot)
        assert_same(got, want, f"{mode}(C={chunk})")


def test_retention_scalar_gamma_and_no_decay_M8_15(gen):
    """A Python float γ gives the same D on every head; γ = 1 is plain causal (QKᵀ ⊙ M) V."""
    q, k, v = randn(2, 12, 3, gen=gen), randn(2, 12, 3, gen=gen), randn(2, 12, 2, gen=gen)
    D = ref_decay_mask(0.8, 12)
    for mode in MODES:
        assert_close(retention(q, k, v, 0.8, mode=mode, chunk_size=5), ((q @ k.transpose(-2, -1)) * D) @ v)
        assert_close(retention(q, k, v, 1.0, mode=mode, chunk_size=5), torch.tril(q @ k.transpose(-2, -1)) @ v)


@pytest.mark.parametrize("mode", GLA_MODES)
def test_retention_decoded_one_token_at_a_time_M8_15(mode, gen):
    """`retention` takes no state (its signature has none), so a decoder carries the state of the equivalent
    `gated_linear_attention` call (log g = log γ on every key dim, scale 1): one token per call from the previous
    call's final state ≡ retention over the whole sequence, one γ per head."""
    q, k, v = randn(2, 3, 17, 4, gen=gen), randn(2, 3, 17, 4, gen=gen), randn(2, 3, 17, 5, gen=gen)
    gamma = torch.tensor((0.5, 0.9, 0.99), dtype=F64)
    log_g = gamma.log()[:, None, None].expand(2, 3, 1, 4)             # one token's constant gate per head
    state, steps = None, []
    for t in range(17):
        one = slice(t, t + 1)
        out, state = gated_linear_attention(q[..., one, :], k[..., one, :], v[..., one, :], log_g, mode=mode,
                                            chunk_size=8, scale=1.0, initial_state=state, return_final_state=True)
        steps.append(out)
    assert_close(torch.cat(steps, dim=-2), retention(q, k, v, gamma, mode=mode, chunk_size=8),
                 name=f"{mode}: retention decoded one token at a time vs the full call")


# ----------------------------------------------------------------------------- bad input
def test_linear_bad_input_names_the_argument(gen):
    q = randn(2, 3, 10, 4, gen=gen)
    v = randn(2, 3, 10, 5, gen=gen)
    g = torch.zeros(2, 3, 10, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"same rank.*\(3, 10, 4\)"):
        linear_attention(q, q[0], v)
    with pytest.raises(ValueError, match=r"leading dims.*\(1, 3, 10, 4\)"):
        linear_attention(q, q[:1], v)
    with pytest.raises(ValueError, match=r"sequence length L.*\(2, 3, 9, 4\)"):
        linear_attention(q, q[:, :, :9], v)
    with pytest.raises(ValueError, match=r"d_k.*\(2, 3, 10, 3\)"):
        linear_attention(q, q[..., :3], v)
    with pytest.raises(ValueError, match="at least 2 dims"):
        linear_attention(q[0, 0, 0], q[0, 0, 0], v[0, 0, 0])
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        linear_attention(q.tolist(), q, v)
    with pytest.raises(TypeError, match="dtypes must match"):
        linear_attention(q, q.float(), v)
    with pytest.raises(ValueError, match="feature_map must be one of"):
        linear_attention(q, q, v, feature_map="softmax")
    with pytest.raises(TypeError, match="feature_map must be a string or a callable"):
        linear_attention(q, q, v, feature_map=3)
    with pytest.raises(ValueError, match=r"feature_map must map.*phi\(q\)"):
        linear_attention(q, q, v, feature_map=lambda x: x[..., :5, :])
    with pytest.raises(ValueError, match="mode must be one of"):
        linear_attention(q, q, v, mode="fast")
    for bad in (0, -3):
        with pytest.raises(ValueError, match="chunk_size must be positive"):
            linear_attention(q, q, v, mode="chunk", chunk_size=bad)
    with pytest.raises(TypeError, match="chunk_size"):
        linear_attention(q, q, v, mode="chunk", chunk_size=2.5)
    with pytest.raises(ValueError, match="eps"):
        linear_attention(q, q, v, eps=-1e-6)

    with pytest.raises(ValueError, match=r"log_g must have the shape of k.*\(2, 3, 10, 1\)"):
        gated_linear_attention(q, q, v, g[..., :1])
    with pytest.raises(ValueError, match=r"log_g must have the shape of k.*\(3, 10, 4\)"):
        gated_linear_attention(q, q, v, g[0])
    with pytest.raises(ValueError, match=r"log_g must be finite and <= 0.*0.5"):
        gated_linear_attention(q, q, v, g.index_fill(-2, torch.tensor([3]), 0.5))
    for bad in (float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="log_g must be finite"):
            gated_linear_attention(q, q, v, g.index_fill(-2, torch.tensor([3]), bad))
    with pytest.raises(TypeError, match="log_g must have dtype"):
        gated_linear_attention(q, q, v, g.float())
    with pytest.raises(ValueError, match="mode must be one of"):
        gated_linear_attention(q, q, v, g, mode="scan")
    with pytest.raises(ValueError, match="chunk_size must be positive"):
        gated_linear_attention(q, q, v, g, mode="chunk", chunk_size=0)
    with pytest.raises(ValueError, match="scale must be a positive"):
        gated_linear_attention(q, q, v, g, scale=0.0)
    with pytest.raises(ValueError, match=r"initial_state must have shape.*\(2, 3, 4, 5\).*\(2, 3, 5, 4\)"):
        gated_linear_attention(q, q, v, g, initial_state=torch.zeros(2, 3, 5, 4, dtype=F64))

    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        retention(q, q, v, 1.5)
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        retention(q, q, v, torch.tensor([0.5, 0.0, 0.9], dtype=F64))
    with pytest.raises(ValueError, match=r"gamma must broadcast.*\(4,\)"):
        retention(q, q, v, torch.full((4,), 0.5, dtype=F64))
    with pytest.raises(TypeError, match="gamma must be a number or a tensor"):
        retention(q, q, v, "0.9")
    with pytest.raises(ValueError, match="mode must be one of"):
        retention(q, q, v, 0.9, mode="fast")

    with pytest.raises(TypeError, match="x must be a floating-point"):
        taylor2_features(torch.tensor([1, 2]))


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_and_gla_on_cuda_M8_9_M8_13(dtype):
    """On a GPU: every mode runs where the inputs live, keeps the dtype, and agrees with the CPU fp64 loop."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 32, generator=gen).to("cuda", dtype) for _ in range(3))
    log_g = -torch.rand(2, 4, 300, 32, generator=gen).to("cuda", dtype)
    cpu = [x.double().cpu() for x in (q, k, v, log_g)]
    want = ref_linear_attention(*cpu[:3], PHI["elu"], causal=True, normalize=True)
    want_gla, _ = ref_gla(*cpu, 32 ** -0.5)
    for mode in MODES:
        out = linear_attention(q, k, v, causal=True, mode=mode, chunk_size=64)
        assert out.device.type == "cuda" and out.dtype == dtype
        assert_close(out, want, name=f"linear {mode}")
        out = gated_linear_attention(q, k, v, log_g, mode=mode, chunk_size=64)
        assert out.device.type == "cuda" and out.dtype == dtype
        assert_close(out, want_gla, name=f"gla {mode}")


@pytest.mark.parametrize("low, factored", [(-1.0, True), (-5.0, False)], ids=["mild_gates", "strong_gates"])
def test_gla_chunk_factored_and_log_space_paths_M8_13(low, factored, gen, monkeypatch):
    """Chunk 16: gates of at most −1 per step keep a chunk's total log decay above −_SAFE_LOG_DECAY, so the
    part inside a chunk is the factored product exp(b_i)·exp(−b_j) and the log-space scores are never
    built; gates near −5 per step would need e^80 factors, so the chunk falls back to log-space sub-chunks.
    Both paths match the fp64 loop in fp32, outputs and gradients."""
    import xfam_lib.linear as lin
    calls = []
    real = lin._decay_scores
    monkeypatch.setattr(lin, "_decay_scores", lambda *a: calls.append(1) or real(*a))
    shape, d_k = (1, 2, 64), 8
    q, k, v = randn(*shape, d_k, gen=gen), randn(*shape, d_k, gen=gen), randn(*shape, d_k, gen=gen)
    log_g = log_gates(*shape, d_k, gen=gen, low=low, high=low / 5)
    cots = (randn(*shape, d_k, gen=gen), randn(1, 2, d_k, d_k, gen=gen))
    want = outputs_and_grads(lambda q, k, v, g: ref_gla(q, k, v, g, d_k ** -0.5), (q, k, v, log_g), cots)
    got = outputs_and_grads(
        lambda q, k, v, g: gated_linear_attention(q, k, v, g, mode="chunk", chunk_size=16, return_final_state=True),
        tuple(x.float() for x in (q, k, v, log_g)), tuple(c.float() for c in cots))
    assert_same(got, want, f"chunk, gates >= {low}")
    assert (not calls) == factored, len(calls)


@pytest.mark.parametrize("loop_slice", [1, 10**9], ids=["loop_of_adds", "torch_cumsum"])
def test_linear_chunk_exclusive_state_sums_both_branches_M8_9(loop_slice, gen, monkeypatch):
    """The states entering the chunks are exclusive sums over the chunks before; without autograd large
    slices take a loop of in-place adds, small ones ``torch.cumsum`` (the tests' sizes alone would only
    reach the second). Both branches: the sums equal a Python sum written out, chunk 0 gets exactly 0,
    and causal chunk mode equals the fp64 reference and stays exactly causal."""
    import xfam_lib.linear as lin
    monkeypatch.setattr(lin, "_LOOP_SLICE", loop_slice)
    x = randn(2, 3, 7, 4, 5, gen=gen)
    got = lin._exclusive_cumsum(x, -3)
    for c in range(7):
        want = sum((x[:, :, j] for j in range(c)), torch.zeros_like(x[:, :, 0]))
        assert_close(got[:, :, c], want, name=f"chunk {c}")
    assert torch.equal(got[:, :, 0], torch.zeros_like(got[:, :, 0]))
    q, k, v = randn(2, 3, 29, 4, gen=gen), randn(2, 3, 29, 4, gen=gen), randn(2, 3, 29, 5, gen=gen)
    want = ref_linear_attention(q, k, v, PHI["elu"], causal=True, normalize=True)
    assert_close(linear_attention(q, k, v, causal=True, mode="chunk", chunk_size=6), want, name="chunk")
    check_causal(lambda x: linear_attention(x[0], x[1], x[2], causal=True, mode="chunk", chunk_size=6),
                 torch.stack([q, k, q]), position=13)


@pytest.mark.parametrize("chunk", [1, 6, 29, 64])
def test_reference_chunk_forms_equal_the_loops_M8_9_M8_13(chunk, gen):
    """The chunk forms the chapter shows (`_linear_chunk_reference`, `_gla_chunk_reference`, one chunk after
    another) ≡ the per-timestep references of this file in fp64: causal linear attention's numerator and
    normaliser, and GLA's outputs and final state from a random initial state, with log gates drawn from
    [-3, 0] per step, for chunks that divide L = 29 or not, C = 1 and C >= L."""
    import xfam_lib.linear as lin
    shape, d_k, d_v = (2, 3, 29), 4, 5
    q, k, v = randn(*shape, d_k, gen=gen), randn(*shape, d_k, gen=gen), randn(*shape, d_v, gen=gen)
    fq, fk = PHI["elu"](q), PHI["elu"](k)
    num, den = lin._linear_chunk_reference(fq, fk, v, chunk)
    want_num = ref_linear_attention(q, k, v, PHI["elu"], causal=True, normalize=False)
    want_den = ref_linear_attention(q, k, torch.ones_like(v[..., :1]), PHI["elu"], causal=True, normalize=False)
    assert_close(num, want_num, name=f"linear attention reference chunk {chunk}: numerator")
    assert_close(den, want_den[..., 0], name=f"linear attention reference chunk {chunk}: normaliser")
    log_g = log_gates(*shape, d_k, gen=gen, low=-3.0, high=0.0)
    s0 = randn(2, 3, d_k, d_v, gen=gen)
    out, state = lin._gla_chunk_reference(q * 0.5, k, v, log_g, s0, chunk)
    want_out, want_state = ref_gla(q, k, v, log_g, 0.5, s0)
    assert_close(out, want_out, name=f"GLA reference chunk {chunk}: output")
    assert_close(state, want_state, name=f"GLA reference chunk {chunk}: final state")
