"""Chapter 9, the layers: S4D, H3, the Mamba block and Mamba-2's SSD (METHODS M9.5, M9.7, M9.10, M9.11).

References are independent of the library: the S4D kernel formula of state-spaces/s4 ``models/s4/s4d.py``
(written out here), the dense shift-matrix SSM, double loops over positions, causal linear attention from
`xfam_lib.linear` (chapter 8), and Hugging Face ``transformers``' pure-PyTorch ``MambaMixer`` and
``mamba2_chunk_scan`` (test-only pin in requirements.txt) loaded with the same weights.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from xfam_lib.linear import linear_attention
from xfam_lib.ssm import (
    H3Layer,
    MambaBlock,
    S4DLayer,
    discretize,
    h3_mix,
    s4d_init,
    s4d_kernel,
    selective_scan,
    shift_ssm_kernel,
    ssd_attention_form,
    ssd_chunked,
    ssd_matrix,
    ssd_scan,
    ssm_kernel,
    ssm_recurrence,
)
from xfam_lib.testing import assert_close, check_causal, grads, randn

F64 = torch.float64
# An FFT convolution mixes every position through the transform, so a perturbation after t moves outputs
# before t by fp64 roundoff (~eps · |values| · log L, here ~1e-16); exact causality holds only in exact arithmetic.
FFT_LEAK = 1e-13


def assert_grads_close(ga, gb, **kw):
    """Gradients pairwise; complex ones as (real, imag) pairs (same dtype, same tolerance)."""
    for i, (a, b) in enumerate(zip(ga, gb)):
        if a.is_complex():
            a, b = torch.view_as_real(a), torch.view_as_real(b)
        assert_close(a, b, name=f"grad {i}", **kw)


# ----------------------------------------------------------------------------- M9.5 S4D
def s4d_reference_kernel(log_dt, A_re, A_im, C, L):
    """``S4DKernel.forward`` of state-spaces/s4 ``models/s4/s4d.py``, with its A = -exp(log_A_real) + i A_imag
    given here directly as A_re + i A_im."""
    dt = torch.exp(log_dt)
    A = A_re + 1j * A_im
    dtA = A * dt.unsqueeze(-1)
    K = dtA.unsqueeze(-1) * torch.arange(L, dtype=log_dt.dtype)
    C = C * (torch.exp(dtA) - 1.0) / A
    return 2 * torch.einsum("hn,hnl->hl", C, torch.exp(K)).real


def s4d_params(gen, H=3, half=4, requires_grad=True):
    log_dt = torch.empty(H, dtype=F64).uniform_(math.log(1e-3), math.log(1e-1), generator=gen)
    A_re = -torch.exp(randn(H, half, gen=gen))
    A_im = math.pi * torch.arange(half, dtype=F64).repeat(H, 1) + randn(H, half, gen=gen)
    C = torch.complex(randn(H, half, gen=gen), randn(H, half, gen=gen))
    return [t.requires_grad_(requires_grad) for t in (log_dt, A_re, A_im, C)]


@pytest.mark.parametrize("L", [1, 17, 300])
def test_s4d_kernel_equals_state_spaces_s4d_formula_M9_5(L, gen):
    """M9.5: `s4d_kernel` ≡ the s4d.py formula C (e^{dtA} - 1)/A · e^{dtA k}, 2 Re (fp64), outputs and gradients."""
    params = s4d_params(gen)
    K = s4d_kernel(*params, L)
    K_ref = s4d_reference_kernel(*params, L)
    assert K.dtype == F64 and not K.is_complex()
    assert_close(K, K_ref)
    cot = randn(*K.shape, gen=gen)
    assert_grads_close(grads(K, params, cot), grads(K_ref, params, cot))


def test_s4d_kernel_equals_zoh_ssm_kernel_of_the_full_conjugate_system_M9_5(gen):
    """M9.5: with both halves of every conjugate pair (N states, B = 1), `ssm_kernel(discretize(A, 1, dt, "zoh"))`
    is real (imaginary part 0: conjugate symmetry) and equals `s4d_kernel` built from one half (2 Re)."""
    log_dt, A_re, A_im, C = (t.detach() for t in s4d_params(gen))
    A_half = torch.complex(A_re, A_im)
    A_full = torch.cat([A_half, A_half.conj()], -1)
    C_full = torch.cat([C, C.conj()], -1)
    A_bar, B_bar = discretize(A_full, torch.ones_like(A_full), torch.exp(log_dt), "zoh")
    K_full = ssm_kernel(A_bar, B_bar, C_full, 64)
    assert_close(K_full.imag, torch.zeros(3, 64, dtype=F64), atol=1e-12, rtol=0)  # fp64 roundoff of a sum of ~1
    assert_close(K_full.real, s4d_kernel(log_dt, A_re, A_im, C, 64))
    # and with one half only the kernel is complex: the 2 Re is what makes it a real SSM of N states
    K_half = ssm_kernel(*discretize(A_half, torch.ones_like(A_half), torch.exp(log_dt), "zoh"), C, 64)
    assert K_half.imag.abs().max() > 1e-3
    assert_close(2 * K_half.real, K_full.real)


def test_s4d_kernel_at_A_zero_is_dt_times_C_M9_5(gen):
    """M9.5: A = 0 (a pure integrator) has the ZOH limit B̄ = dt, so K_k = 2 Re(C) dt for every k; the
    s4d.py formula (e^{dtA} - 1)/A is 0/0 there, the library's phi1 form is exact and has finite gradients."""
    log_dt = torch.tensor([-2.0, -1.0], dtype=F64, requires_grad=True)
    A_re = torch.zeros(2, 2, dtype=F64, requires_grad=True)
    A_im = torch.zeros(2, 2, dtype=F64)
    C = torch.complex(randn(2, 2, gen=gen), randn(2, 2, gen=gen))
    K = s4d_kernel(log_dt, A_re, A_im, C, 5)
    expected = (2 * C.real.sum(-1) * torch.exp(log_dt))[:, None].expand(2, 5)
    assert_close(K, expected.detach())
    assert torch.isnan(s4d_reference_kernel(log_dt, A_re, A_im, C, 5)).all()
    g_dt, g_a = torch.autograd.grad(K.sum(), (log_dt, A_re))
    assert torch.isfinite(g_dt).all() and torch.isfinite(g_a).all()
    assert_close(g_dt, (5 * 2 * C.real.sum(-1) * torch.exp(log_dt)).detach())  # d/d log_dt of 5 dt Σ 2Re C


def test_s4d_init_lin_and_inv_M9_5():
    """M9.5: S4D-Lin A_n = -1/2 + i π n; S4D-Inv A_n = -1/2 + i (N/π)(N/(2n+1) - 1) (Gu et al. 2022, §4),
    N = d_state;
    odd d_state (no conjugate pairs) and unknown inits raise."""
    A_re, A_im = s4d_init(3, 6, "lin")
    assert A_re.shape == (3, 3) and bool((A_re == -0.5).all())
    assert_close(A_im[1], torch.tensor([0.0, math.pi, 2 * math.pi]))
    _, A_im = s4d_init(2, 6, "inv")
    assert_close(A_im[0], torch.tensor([6 / math.pi * 5, 6 / math.pi * 1, 6 / math.pi * (6 / 5 - 1)]))
    with pytest.raises(ValueError, match="d_state must be even"):
        s4d_init(3, 5)
    with pytest.raises(ValueError, match="init must be one of"):
        s4d_init(3, 4, "legs")
    with pytest.raises(ValueError, match=r"log_dt \(H,\)"):
        s4d_kernel(torch.zeros(3), torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.cfloat), 4)


def test_s4d_init_real_and_random_M9_5():
    """M9.5: S4D-Real A_n = -(n+1), real (the diagonal of HiPPO-LegS, A_nn = -(n+1)); "random": per channel N/2
    eigenvalues of G/sqrt(N) - I, one of each conjugate pair (so, for a pair, the member with Im > 0), every
    real part <= -0.01, reproducible under one seed, different across channels."""
    A_re, A_im = s4d_init(2, 8, "real")
    assert_close(A_re, -torch.arange(1.0, 5.0).expand(2, -1))
    assert bool((A_im == 0).all())
    torch.manual_seed(3)
    A_re, A_im = s4d_init(3, 16, "random")
    torch.manual_seed(3)
    G = torch.randn(3, 16, 16, dtype=F64)
    ev = torch.linalg.eigvals(G / 4 - torch.eye(16, dtype=F64))
    for h in range(3):
        top = ev[h][ev[h].imag.argsort(descending=True)][:8]
        assert_close(A_im[h].double(), top.imag, atol=1e-6, rtol=1e-6)
        assert_close(A_re[h].double(), top.real.clamp_max(-1e-2), atol=1e-6, rtol=1e-6)
    assert A_re.shape == A_im.shape == (3, 8) and float(A_re.max()) < 0
    assert not torch.equal(A_im[0], A_im[1])


def test_s4d_layer_fft_equals_recurrence_and_is_causal_M9_5(gen):
    """M9.5: the S4D layer (FFT convolution with its kernel) ≡ the same layer run as N complex recurrences per
    channel with ZOH (`ssm_recurrence`), fp64, outputs and parameter gradients; and it is causal."""
    torch.manual_seed(0)
    layer = S4DLayer(4, 8, init="inv").double()
    x = randn(2, 23, 4, gen=gen)

    def by_recurrence(x):
        ssm = layer.ssm
        A = torch.complex(-torch.exp(ssm.log_A_re), ssm.A_im)
        A_full = torch.cat([A, A.conj()], -1)
        C = torch.view_as_complex(ssm.C)
        A_bar, B_bar = discretize(A_full, torch.ones_like(A_full), torch.exp(ssm.log_dt), "zoh")
        y = ssm_recurrence(A_bar, B_bar, torch.cat([C, C.conj()], -1), x.transpose(1, 2).to(A_bar.dtype))
        y = y.real.transpose(1, 2) + layer.D * x
        return F.glu(layer.out(F.gelu(y)), dim=-1)

    y, y_ref = layer(x), by_recurrence(x)
    assert_close(y, y_ref)
    params = list(layer.parameters())
    cot = randn(*y.shape, gen=gen)
    assert_grads_close(grads(y, params, cot), grads(y_ref, params, cot))
    check_causal(layer, x, dim=1, atol=FFT_LEAK)
    with pytest.raises(ValueError, match=r"\(batch, L, d_model\) with d_model = 4"):
        layer(randn(2, 5, 3, gen=gen))


# ----------------------------------------------------------------------------- M9.7 H3
def shift_matrix(n):
    return torch.diag(torch.ones(n - 1, dtype=F64), -1)                 # A e_i = e_{i+1}, A^n = 0


@pytest.mark.parametrize("L", [3, 8, 20])
def test_shift_ssm_kernel_is_fir_and_equals_dense_shift_ssm_M9_7(L, gen):
    """M9.7: the shift SSM (A = shift matrix, B = e_0, C = c) has kernel c_0 .. c_{N-1}, then zeros:
    `shift_ssm_kernel` ≡ `ssm_kernel` of the dense system (matrix powers), also for L < N."""
    N = 8
    c = randn(2, N, gen=gen)
    e0 = torch.zeros(N, dtype=F64)
    e0[0] = 1
    K_dense = ssm_kernel(shift_matrix(N), e0, c, L)
    K = shift_ssm_kernel(c, L)
    assert_close(K, K_dense)
    assert_close(K_dense[..., N:], torch.zeros(2, max(0, L - N), dtype=F64), atol=0, rtol=0)
    u = randn(2, L, gen=gen)                                             # and as a recurrence: y_t = Σ_k c_k u_{t-k}
    assert_close(ssm_recurrence(shift_matrix(N), e0, c, u), torch.stack(
        [sum(c[:, k] * u[:, t - k] for k in range(min(N, t + 1))) for t in range(L)], -1))


def h3_loop(q, k, v, shift_K, diag_K, D):
    """Double loop over positions: k̄_s = Σ_r shift_K[r] k_{s-r}; o_t[j] = Σ_i q_t[i] (Σ_{s≤t} diag_K[i,j,t-s]
    k̄_s[i] v_s[j] + D[i,j] k̄_t[i] v_t[j])."""
    b, L, H, dh = q.shape
    k_bar = torch.stack([sum(shift_K[..., r] * k[:, s - r] for r in range(s + 1)) for s in range(L)], 1)
    outs = []
    for t in range(L):
        state = sum(diag_K[..., t - s] * k_bar[:, s, :, :, None] * v[:, s, :, None, :] for s in range(t + 1))
        state = state + D * k_bar[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhi,bhij->bhj", q[:, t], state))
    return torch.stack(outs, 1)


def test_h3_mix_equals_double_loop_M9_7(gen):
    """M9.7: `h3_mix` (two FFT convolutions) ≡ the double loop over positions (fp64), outputs and gradients."""
    b, L, H, dh = 2, 11, 2, 3
    q, k, v = (randn(b, L, H, dh, gen=gen, requires_grad=True) for _ in range(3))
    shift_K = randn(H, dh, L, gen=gen, requires_grad=True)
    diag_K = randn(H, dh, dh, L, gen=gen, requires_grad=True)
    D = randn(H, dh, dh, gen=gen, requires_grad=True)
    inputs = (q, k, v, shift_K, diag_K, D)
    y, y_ref = h3_mix(*inputs), h3_loop(*inputs)
    assert_close(y, y_ref)
    cot = randn(*y.shape, gen=gen)
    assert_grads_close(grads(y, inputs, cot), grads(y_ref, inputs, cot))


@pytest.mark.parametrize("dh", [1, 4])
def test_h3_with_identity_shift_and_no_decay_is_causal_linear_attention_M9_7(dh, gen):
    """M9.7: identity shift (kernel e_0), diagonal SSM with A = 1 (kernel all ones) and D = 0 turn H3 into
    per-head causal linear attention o_t = q_t Σ_{s≤t} k_s^T v_s: ≡ chapter 8's `linear_attention`
    (identity features, no normaliser), fp64, outputs and gradients. The S4D kernel with A = 0 and
    C = 1 / (2 dt) has exactly that all-ones kernel."""
    b, L, H = 2, 13, 3
    q, k, v = (randn(b, L, H, dh, gen=gen, requires_grad=True) for _ in range(3))
    shift_K = F.pad(torch.ones(H, dh, 1, dtype=F64), (0, L - 1))
    log_dt = torch.full((H * dh * dh,), -1.5, dtype=F64)
    zeros = torch.zeros(H * dh * dh, 1, dtype=F64)
    diag_K = s4d_kernel(log_dt, zeros, zeros, torch.complex(0.5 / torch.exp(log_dt)[:, None], zeros), L)
    assert_close(diag_K, torch.ones_like(diag_K))
    y = h3_mix(q, k, v, shift_K, diag_K.reshape(H, dh, dh, L), torch.zeros(H, dh, dh, dtype=F64))
    y_ref = linear_attention(*(t.transpose(1, 2) for t in (q, k, v)), feature_map="identity", causal=True,
                             normalize=False, mode="recurrent").transpose(1, 2)
    assert_close(y, y_ref)
    cot = randn(*y.shape, gen=gen)
    assert_grads_close(grads(y, (q, k, v), cot), grads(y_ref, (q, k, v), cot))


def test_h3_layer_wiring_causality_and_errors_M9_7(gen):
    """M9.7: the H3 layer ≡ projections → `h3_loop` with its own kernels → output projection (fp64); causal."""
    torch.manual_seed(0)
    layer = H3Layer(6, d_state=4, head_dim=2).double()
    x = randn(2, 9, 6, gen=gen)
    q, k, v = layer.qkv(x).reshape(2, 9, 3, 3, 2).unbind(2)
    expected = layer.out(h3_loop(q, k, v, *layer.kernels(9)).reshape(2, 9, 6))
    assert_close(layer(x), expected)
    check_causal(layer, x, dim=1, atol=FFT_LEAK)
    with pytest.raises(ValueError, match="head_dim must divide d_model"):
        H3Layer(6, head_dim=4)
    with pytest.raises(ValueError, match=r"shift_K \(H, d_h, L\)"):
        h3_mix(q, k, v, torch.zeros(3, 2, 8, dtype=F64), *layer.kernels(9)[1:])


# ----------------------------------------------------------------------------- M9.10 Mamba block
@pytest.mark.parametrize("mode", ["sequential", "chunk", "scan"])
def test_mamba_step_loop_equals_full_forward_M9_10(mode, gen):
    """M9.10: decoding token by token with `step` from `init_state` ≡ the full forward (fp64, every scan mode);
    and continuing with `step` from the state the forward returns after a prefix (shorter and longer than
    d_conv) ≡ the full forward on the rest."""
    torch.manual_seed(0)
    block = MambaBlock(8, d_state=4, d_conv=4, expand=2).double()
    x = randn(2, 15, 8, gen=gen)
    full = block(x, mode=mode, chunk_size=4)
    state = block.init_state(2, dtype=F64)
    steps = []
    for t in range(15):
        y_t, state = block.step(x[:, t], state)
        steps.append(y_t)
    assert_close(torch.stack(steps, 1), full)
    for prefix in (2, 9):
        _, state = block(x[:, :prefix], mode=mode, chunk_size=4, return_state=True)
        rest = []
        for t in range(prefix, 15):
            y_t, state = block.step(x[:, t], state)
            rest.append(y_t)
        assert_close(torch.stack(rest, 1), full[:, prefix:], name=f"after a prefix of {prefix}")


def test_mamba_step_gradients_equal_forward_gradients_M9_10(gen):
    """M9.10: the step loop and the chunked forward give the same parameter gradients (fp64)."""
    torch.manual_seed(1)
    block = MambaBlock(4, d_state=3, d_conv=3, expand=2).double()
    x = randn(1, 7, 4, gen=gen)
    cot = randn(1, 7, 4, gen=gen)
    params = list(block.parameters())
    g_full = grads(block(x, chunk_size=3), params, cot)
    state, ys = block.init_state(1, dtype=F64), []
    for t in range(7):
        y_t, state = block.step(x[:, t], state)
        ys.append(y_t)
    assert_grads_close(grads(torch.stack(ys, 1), params, cot), g_full)


def test_mamba_block_is_causal_and_state_is_constant_size_M9_10(gen):
    """M9.10: causal by perturbation (up to fp64 rounding: the chunked scan centres each chunk's decay
    factors on the middle of that chunk's sums of δ, so later inputs of a chunk change how its earlier
    outputs are rounded, never what they are); the decoding state has the same size after 1 and after 50 tokens."""
    torch.manual_seed(0)
    block = MambaBlock(8, d_state=4).double()
    x = randn(2, 50, 8, gen=gen)
    check_causal(block, x, dim=1, atol=1e-12)
    sizes = [sum(s.numel() for s in block(x[:, :n], return_state=True)[1]) for n in (1, 50)]
    assert sizes[0] == sizes[1]
    with pytest.raises(ValueError, match=r"x_t must be \(batch, d_model\)"):
        block.step(x[:, :2], block.init_state(2, dtype=F64))
    with pytest.raises(ValueError, match="state must be"):
        block.step(x[:, 0], block.init_state(3, dtype=F64))


def test_mamba_block_bf16_forward_and_step_M9_10():
    """M9.10: a bf16 block returns bf16 from forward and from `step` (whose SSM state stays fp32), both within
    the bf16 tolerance of the fp32 block with the same (bf16-valued) weights: the projections round in bf16,
    the scan runs in fp32."""
    torch.manual_seed(0)
    block = MambaBlock(16, d_state=8).to(torch.bfloat16)
    ref = MambaBlock(16, d_state=8)
    ref.load_state_dict({k: v.float() for k, v in block.state_dict().items()})
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    expected = ref(x.float()).detach().to(torch.bfloat16)
    state, ys = block.init_state(2), []
    for t in range(10):
        y_t, state = block.step(x[:, t], state)
        ys.append(y_t)
    assert state[1].dtype == torch.float32
    for y in (block(x), torch.stack(ys, 1)):
        assert y.dtype == torch.bfloat16
        assert_close(y, expected)


transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")


def hf_mixer(block):
    cfg = transformers.MambaConfig(hidden_size=block.d_model, state_size=block.d_state, conv_kernel=block.d_conv,
                                   expand=block.d_inner // block.d_model, time_step_rank=block.dt_rank,
                                   use_bias=False, use_conv_bias=True, num_hidden_layers=1)
    from transformers.models.mamba.modeling_mamba import MambaMixer
    mixer = MambaMixer(cfg, 0)
    mixer.load_state_dict(block.state_dict())
    return mixer.eval()


def test_mamba_block_equals_hugging_face_mamba_mixer_M9_10(gen):
    """M9.10 oracle: Hugging Face's `MambaMixer` (pure-PyTorch path) with this block's state dict gives the same
    outputs and input gradients in fp32 (default fp32 tolerance); both have the same parameter count."""
    torch.manual_seed(0)
    block = MambaBlock(16, d_state=8, d_conv=4, expand=2)
    mixer = hf_mixer(block)
    x = randn(2, 33, 16, gen=gen, dtype=torch.float32, requires_grad=True)
    y, y_hf = block(x), mixer(x)
    assert_close(y, y_hf)
    cot = randn(2, 33, 16, gen=gen, dtype=torch.float32)
    assert_close(grads(y, [x], cot)[0], grads(y_hf, [x], cot)[0])
    assert sum(p.numel() for p in block.parameters()) == sum(p.numel() for p in mixer.parameters())


def test_mamba_parameter_count_closed_form_M9_10():
    """M9.10: the parameter count is d·2E (in_proj) + E(d_conv + 1) (conv) + E(r + 2N) (x_proj) + (rE + E)
    (dt_proj) + EN (A) + E (D) + Ed (out_proj), for the automatic and an explicit step rank r."""
    for d, N, k, expand, r in ((16, 8, 4, 2, "auto"), (24, 5, 3, 3, 4), (40, 6, 2, 1, "auto")):
        block = MambaBlock(d, d_state=N, d_conv=k, expand=expand, dt_rank=r)
        E, r = expand * d, math.ceil(d / 16) if r == "auto" else r
        closed = d * 2 * E + E * (k + 1) + E * (r + 2 * N) + (r * E + E) + E * N + E + E * d
        assert sum(p.numel() for p in block.parameters()) == closed


# ----------------------------------------------------------------------------- M9.11 SSD
def ssd_inputs(gen, b=2, L=13, H=4, P=3, G=2, N=5, dtype=F64, a_scale=1.0, requires_grad=True):
    x = randn(b, L, H, P, gen=gen, dtype=dtype)
    a = (-a_scale * torch.rand(b, L, H, generator=gen, dtype=F64)).to(dtype)
    B, C = randn(b, L, G, N, gen=gen, dtype=dtype), randn(b, L, G, N, gen=gen, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (x, a, B, C)]


@pytest.mark.parametrize("L,chunk,G", [(1, 4, 1), (13, 4, 2), (16, 4, 4), (13, 64, 1), (13, 1, 2)])
def test_ssd_attention_form_and_chunked_equal_the_scan_M9_11(L, chunk, G, gen):
    """M9.11: SSD's masked-attention form (C Bᵀ ∘ L) X and its chunked algorithm (chunks dividing L or not,
    larger than L, of 1) ≡ the step loop `ssd_scan` (fp64): outputs, final state and gradients."""
    x, a, B, C = inputs = ssd_inputs(gen, L=L, G=G)
    y0, h0 = ssd_scan(*inputs, return_final_state=True)
    y1 = ssd_attention_form(*inputs)
    y2, h2 = ssd_chunked(*inputs, chunk_size=chunk, return_final_state=True)
    assert_close(y1, y0)
    assert_close(y2, y0)
    assert_close(h2, h0)
    cot, cot_h = randn(*y0.shape, gen=gen), randn(*h0.shape, gen=gen)
    g0 = torch.autograd.grad((y0 * cot).sum() + (h0 * cot_h).sum(), inputs, retain_graph=True)
    assert_grads_close(grads(y1, inputs, cot), grads(y0, inputs, cot))
    assert_grads_close(torch.autograd.grad((y2 * cot).sum() + (h2 * cot_h).sum(), inputs), g0)


def test_ssd_initial_state_and_strong_decay_M9_11(gen):
    """M9.11: an initial state carries through (scan ≡ chunked); with a_t ≈ -1e4 per step (decay sums far below
    the exp underflow) the chunked form stays finite and ≡ the scan, and y_t = (x_t B_tᵀ) C_t exactly."""
    x, a, B, C = (t.detach() for t in ssd_inputs(gen, L=10))
    h_in = randn(2, 4, 3, 5, gen=gen)
    y0, h0 = ssd_scan(x, a, B, C, h_in, return_final_state=True)
    y1, h1 = ssd_chunked(x, a, B, C, 4, h_in, return_final_state=True)
    assert_close(y1, y0)
    assert_close(h1, h0)
    with pytest.raises(ValueError, match=r"initial_state must be \(batch, H, P, N\)"):
        ssd_chunked(x, a, B, C, 4, h_in[:, :2])
    strong = a * 1e4 - 1e4
    y0 = ssd_scan(x, strong, B, C)
    y1 = ssd_chunked(x, strong, B, C, chunk_size=4)
    assert torch.isfinite(y1).all()
    assert_close(y1, y0)
    Bh, Ch = B.repeat_interleave(2, 2), C.repeat_interleave(2, 2)
    assert_close(y1, x * (Bh * Ch).sum(-1, keepdim=True))


def test_ssd_equals_selective_scan_with_scalar_A_per_head_M9_11(gen):
    """M9.11: Mamba-2's SSM is Mamba's with A_h·1 shared over the state and one delta per head: `selective_scan`
    with u = x (channels = heads × P), A repeated, B, C grouped per head
    ≡ `ssd_chunked(delta·x, delta·A, B, C)`."""
    b, L, H, P, N = 2, 11, 3, 2, 4
    x = randn(b, L, H, P, gen=gen)
    delta = torch.rand(b, L, H, generator=gen, dtype=F64)
    A = -torch.exp(randn(H, gen=gen))
    B, C = randn(b, L, H, N, gen=gen), randn(b, L, H, N, gen=gen)
    y = ssd_chunked(x * delta[..., None], delta * A, B, C, chunk_size=4)
    u = x.reshape(b, L, H * P).transpose(1, 2)
    A_channels = A.repeat_interleave(P)[:, None].expand(-1, N)
    y_ms = selective_scan(u, delta.repeat_interleave(P, 2).transpose(1, 2), A_channels, B.permute(0, 2, 3, 1),
                          C.permute(0, 2, 3, 1))
    assert_close(y.reshape(b, L, H * P).transpose(1, 2), y_ms)


def test_ssd_matrix_is_semiseparable_M9_11(gen):
    """M9.11: every block of M below the diagonal (rows t ≥ k, columns s < k) has rank ≤ N (Dao & Gu 2024,
    Definition 3.1): the state of size N is all that passes from the past to the future."""
    N, L = 3, 12
    _, a, B, C = (t.detach() for t in ssd_inputs(gen, b=1, L=L, H=1, G=1, N=N))
    M = ssd_matrix(a, B, C)[0, 0]
    assert bool((M.triu(1) == 0).all())
    ranks = [int(torch.linalg.matrix_rank(M[k:, :k])) for k in range(1, L)]
    assert max(ranks) == N                                              # reached, never exceeded
    with pytest.raises(ValueError, match=r"a must be \(batch, L, H\)"):
        ssd_attention_form(randn(1, L, 1, 2, gen=gen), a[..., 0], B, C)
    with pytest.raises(ValueError, match="G dividing"):
        ssd_chunked(randn(1, L, 3, 2, gen=gen), randn(1, L, 3, gen=gen), randn(1, L, 2, N, gen=gen),
                    randn(1, L, 2, N, gen=gen))


def test_ssd_chunked_is_causal_M9_11(gen):
    """M9.11: outputs before a perturbed position do not change (chunk boundary not aligned with it)."""
    _, a, B, C = (t.detach() for t in ssd_inputs(gen, L=20))
    x = randn(2, 20, 4, 3, gen=gen)
    check_causal(lambda x: ssd_chunked(x, a, B, C, chunk_size=6), x, position=9, dim=1)


def test_ssd_chunked_equals_hugging_face_mamba2_chunk_scan_M9_11(gen):
    """M9.11 oracle: Hugging Face's `mamba2_chunk_scan` (x, dt, A, B, C grouped, D, dt_bias, softplus, ragged last
    chunk) ≡ `ssd_chunked(delta·x, delta·A, B, C) + D x` with delta = softplus(dt + dt_bias), fp32."""
    m2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    b, L, H, P, G, N = 2, 37, 4, 3, 2, 5
    f32 = torch.float32
    x = randn(b, L, H, P, gen=gen, dtype=f32)
    dt, dt_bias = randn(b, L, H, gen=gen, dtype=f32), randn(H, gen=gen, dtype=f32)
    A, D = -torch.exp(randn(H, gen=gen, dtype=f32)), randn(H, gen=gen, dtype=f32)
    B, C = randn(b, L, G, N, gen=gen, dtype=f32), randn(b, L, G, N, gen=gen, dtype=f32)
    y_hf, h_hf = m2.mamba2_chunk_scan(x, dt, A, B, C, 8, D=D, dt_bias=dt_bias, dt_softplus=True,
                                      return_final_states=True)
    delta = F.softplus(dt + dt_bias)
    y, h = ssd_chunked(x * delta[..., None], delta * A, B, C, chunk_size=8, return_final_state=True)
    assert_close(y + D[:, None] * x, y_hf)
    assert_close(h, h_hf)


# ----------------------------------------------------------------------------- M9.4 PE as a rotation SSM
def test_sinusoidal_pe_is_the_kernel_of_a_rotation_ssm_M9_4():
    """M9.4: with A_bar the 2x2 rotation by ω_i, B = (0, 1), the dense `ssm_kernel` with C = (1, 0) is
    sin(k ω_i) and with C = (0, 1) cos(k ω_i): PE columns 2i and 2i+1 of `positional.sinusoidal_encoding`
    (its fp32 table, so the fp32 tolerance)."""
    from xfam_lib.positional import sinusoidal_encoding, sinusoidal_wavelengths

    L, d = 64, 8
    omega = 2 * math.pi / sinusoidal_wavelengths(d)                      # (d/2,) fp64
    c, s = torch.cos(omega), torch.sin(omega)
    A_bar = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)   # (d/2, 2, 2)
    B = torch.tensor([0.0, 1.0], dtype=F64).expand(d // 2, 2)
    C = torch.eye(2, dtype=F64)[:, None].expand(2, d // 2, 2)            # C = e_0 (sin), e_1 (cos)
    K = ssm_kernel(A_bar, B, C, L)                                      # (2, d/2, L)
    pe = sinusoidal_encoding(L, d)
    assert_close(K[0].T.float(), pe[:, 0::2])
    assert_close(K[1].T.float(), pe[:, 1::2])


@pytest.mark.parametrize("make", [lambda: S4DLayer(4, 8), lambda: H3Layer(4, 8, head_dim=2), lambda: MambaBlock(4, 4)])
def test_every_layer_parameter_gets_a_gradient_M9_5_M9_7_M9_10(make, gen):
    """M9.5, M9.7, M9.10: every parameter of the S4D, H3 and Mamba layers takes part in the output (a nonzero
    gradient), so none is dead weight."""
    torch.manual_seed(0)
    layer = make().double()
    layer(randn(2, 6, 4, gen=gen)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_s4d_layer_runs_in_bf16_with_its_modes_in_fp32_M9_5(gen):
    """A bf16 S4D layer (the arena's s4d family in bf16) computes its complex modes in fp32 instead of
    failing in view_as_complex, and matches its fp32 twin to bf16 accuracy."""
    torch.manual_seed(0)
    layer = S4DLayer(8, 16)
    half = S4DLayer(8, 16).bfloat16()
    half.load_state_dict(layer.state_dict())
    x = torch.randn(2, 32, 8, generator=gen)
    y = half(x.bfloat16())
    assert y.dtype == torch.bfloat16
    twin = S4DLayer(8, 16)
    twin.load_state_dict({n: p.bfloat16().float() for n, p in half.state_dict().items()})
    assert_close(y.float(), twin(x.bfloat16().float()), rtol=4e-2, atol=2e-2)
