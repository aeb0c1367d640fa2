"""Chapter 9, state space models: discretisation, the LTI kernel and FFT convolution, the selective scan,
parallel scans (METHODS M9.1, M9.2, M9.3, M9.8, M9.9; ERRATA E9.1, E9.6).

References are independent of the library: the matrix exponential of the augmented block matrix, a
fine-step RK4 integration of the ODE, explicit inverses, matrix powers, an O(L²) double-loop
convolution, and a per-(batch, channel, step) loop following the semantics of mamba's
``selective_scan_ref`` (written here, not imported; mamba_ssm needs CUDA to install).
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.ssm import (
    associative_scan,
    discretize,
    segsum,
    selective_scan,
    ssm_convolve,
    ssm_kernel,
    ssm_recurrence,
)
from xfam_lib.testing import assert_close, check_causal, grads, randn

F64 = torch.float64
HYP = settings(max_examples=20, deadline=None, derandomize=True)


def stable_matrix(n, gen, *, batch=()):
    """A random dense A with eigenvalues in the open left half-plane (A = M - (|M|_2 + 0.5) I)."""
    m = torch.randn(*batch, n, n, generator=gen, dtype=F64)
    shift = torch.linalg.matrix_norm(m, ord=2)[..., None, None] + 0.5
    return m - shift * torch.eye(n, dtype=F64)


def close(actual, expected, **kw):
    """`assert_close`, also for complex tensors (compared as (real, imag) pairs with the fp64 tolerance)."""
    if actual.is_complex() or expected.is_complex():
        actual = torch.view_as_real(actual.to(torch.complex128))
        expected = torch.view_as_real(expected.to(torch.complex128))
    assert_close(actual, expected, **kw)


# ----------------------------------------------------------------------------- independent references
def direct_conv(u, K):
    """Naive O(L²) causal convolution y_k = Σ_{j≤k} K_{k-j} u_j."""
    L = u.shape[-1]
    return torch.stack([sum(K[..., k - j] * u[..., j] for j in range(k + 1)) for k in range(L)], dim=-1)


def augmented_zoh(A, B, delta):
    """ZOH by Van Loan's block exponential: expm(Δ[[A, B], [0, 0]]) = [[A_bar, B_bar], [0, 1]]."""
    n = A.shape[-1]
    M = torch.zeros(n + 1, n + 1, dtype=A.dtype)
    M[:n, :n], M[:n, n] = A, B
    E = torch.linalg.matrix_exp(delta * M)
    return E[:n, :n], E[:n, n]


def rk4_piecewise_constant(A, B, u, delta, substeps=200):
    """Integrate x' = A x + B u(t) with u(t) = u_k on [kΔ, (k+1)Δ) by classical RK4; states at (k+1)Δ."""
    x, h, states = torch.zeros(A.shape[-1], dtype=A.dtype), delta / substeps, []
    for uk in u:
        f = lambda s: A @ s + B * uk  # noqa: E731
        for _ in range(substeps):
            k1 = f(x)
            k2 = f(x + h / 2 * k1)
            k3 = f(x + h / 2 * k2)
            k4 = f(x + h * k3)
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        states.append(x)
    return torch.stack(states)


def ref_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Per-(batch, channel, step) loop with the semantics of mamba's ``selective_scan_ref``.

    Returns ``(y, last_state)``; computes in fp64 for fp64 inputs, else in fp32.
    """
    work = F64 if u.dtype == F64 else torch.float32
    u, delta, A, B, C = (t.to(work) for t in (u, delta, A, B, C))
    batch, dim, L = u.shape
    N = A.shape[1]
    if delta_bias is not None:
        delta = delta + delta_bias.to(work).reshape(1, dim, 1)
    if delta_softplus:
        delta = torch.log1p(torch.exp(delta))

    def vec(X, b, d, t):
        if X.dim() == 2:                                    # fixed (d_inner, N)
            return X[d]
        if X.dim() == 3:                                    # (batch, N, L)
            return X[b, :, t]
        return X[b, d // (dim // X.shape[1]), :, t]          # grouped (batch, G, N, L)

    ys, last = [], []
    for b in range(batch):
        rows, lasts = [], []
        for d in range(dim):
            x, row = torch.zeros(N, dtype=work), []
            for t in range(L):
                x = torch.exp(delta[b, d, t] * A[d]) * x + delta[b, d, t] * vec(B, b, d, t) * u[b, d, t]
                y = (x * vec(C, b, d, t)).sum()
                if D is not None:
                    y = y + D[d].to(work) * u[b, d, t]
                if z is not None:
                    zt = z[b, d, t].to(work)
                    y = y * zt * torch.sigmoid(zt)
                row.append(y)
            rows.append(torch.stack(row))
            lasts.append(x)
        ys.append(torch.stack(rows))
        last.append(torch.stack(lasts))
    return torch.stack(ys), torch.stack(last)


def scan_inputs(gen, batch=2, dim=4, L=9, N=3, bc="variable", groups=2, dtype=F64, delta_scale=1.0,
                requires_grad=True):
    """Random selective-scan inputs; ``bc`` in {"fixed", "variable", "grouped"}."""
    shapes = {"fixed": (dim, N), "variable": (batch, N, L), "grouped": (batch, groups, N, L)}
    u = randn(batch, dim, L, gen=gen, dtype=dtype)
    delta = (delta_scale * torch.rand(batch, dim, L, generator=gen, dtype=F64)).to(dtype)
    A = -torch.exp(randn(dim, N, gen=gen)).to(dtype)
    B = randn(*shapes[bc], gen=gen, dtype=dtype)
    C = randn(*shapes[bc], gen=gen, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (u, delta, A, B, C)]


# ----------------------------------------------------------------------------- M9.2 discretisation
def test_discretize_zoh_equals_augmented_matrix_exponential_M9_2(gen):
    """Dense ZOH ≡ expm of the block matrix [[A, B], [0, 0]] (Van Loan), per system of a batch and per Δ;
    the diagonal form ≡ the same route on diag(A); both reproduce the ODE under piecewise-constant input (RK4)."""
    A, B = stable_matrix(4, gen, batch=(3,)), randn(3, 4, gen=gen)
    delta = torch.tensor([0.05, 0.3, 1.7], dtype=F64)
    A_bar, B_bar = discretize(A, B, delta, "zoh")
    assert A_bar.shape == (3, 4, 4) and B_bar.shape == (3, 4)
    for i in range(3):
        ref_A, ref_B = augmented_zoh(A[i], B[i], float(delta[i]))
        assert_close(A_bar[i], ref_A)
        assert_close(B_bar[i], ref_B)
    a = -torch.exp(randn(5, gen=gen))
    a[2] = 0.0                                                        # an integrator: exact in the diagonal form
    b = randn(5, gen=gen)
    da_bar, db_bar = discretize(a, b, 0.4, "zoh")
    ref_A, ref_B = augmented_zoh(torch.diag(a), b, 0.4)
    assert_close(torch.diag_embed(da_bar), ref_A)
    assert_close(db_bar, ref_B)
    # the discrete recurrence hits the continuous solution at the sample times
    u = randn(6, gen=gen)
    x, states = torch.zeros(4, dtype=F64), []
    for uk in u:
        x = A_bar[1] @ x + B_bar[1] * uk
        states.append(x)
    assert_close(torch.stack(states), rk4_piecewise_constant(A[1], B[1], u, float(delta[1])), atol=1e-10, rtol=0)


def test_discretize_bilinear_and_euler_closed_forms_M9_2(gen):
    """Bilinear ≡ (I - ΔA/2)⁻¹(I + ΔA/2), B̄ = (I - ΔA/2)⁻¹ΔB via explicit inverses; Euler ≡ I + ΔA, ΔB."""
    A, B, delta = stable_matrix(3, gen), randn(3, gen=gen), 0.37
    eye = torch.eye(3, dtype=F64)
    inv = torch.linalg.inv(eye - delta * A / 2)
    A_bar, B_bar = discretize(A, B, delta, "bilinear")
    assert_close(A_bar, inv @ (eye + delta * A / 2))
    assert_close(B_bar, inv @ (delta * B))
    A_bar, B_bar = discretize(A, B, delta, "euler")
    assert_close(A_bar, eye + delta * A)
    assert_close(B_bar, delta * B)


@pytest.mark.parametrize("method", ["zoh", "bilinear", "euler"])
def test_discretize_diagonal_equals_dense_M9_2(method, gen):
    """A diagonal A given as a vector (..., N) ≡ the dense route on diag_embed(A), real and complex (S4D);
    the diagonal ZOH B̄ is the S4D formula (e^{ΔA} − 1)/A · B."""
    a = -torch.exp(randn(2, 5, gen=gen))
    b = randn(2, 5, gen=gen)
    delta = torch.tensor([0.1, 0.9], dtype=F64)
    A_bar, B_bar = discretize(a, b, delta, method)
    dA_bar, dB_bar = discretize(torch.diag_embed(a), b, delta, method)
    assert A_bar.shape == (2, 5) and B_bar.shape == (2, 5)
    assert_close(torch.diag_embed(A_bar), dA_bar)
    assert_close(B_bar, dB_bar)
    ac = torch.complex(-0.5 * torch.ones(4, dtype=F64), math.pi * torch.arange(4, dtype=F64))   # S4D-Lin
    bc = torch.complex(randn(4, gen=gen), randn(4, gen=gen))
    cA_bar, cB_bar = discretize(ac, bc, 0.2, method)
    assert cA_bar.dtype == torch.complex128
    ref_A, ref_B = discretize(torch.diag_embed(ac), bc, 0.2, method)
    close(torch.diag_embed(cA_bar), ref_A)
    close(cB_bar, ref_B)
    if method == "zoh":
        assert_close(B_bar, (torch.exp(delta[:, None] * a) - 1) / a * b)
        close(cB_bar, (torch.exp(0.2 * ac) - 1) / ac * bc)


def test_discretize_convergence_orders_M9_2(gen):
    """Measured orders as Δ → 0: one-step difference from ZOH is O(Δ³) for bilinear, O(Δ²) for Euler;
    the global error of the step response at a fixed time T is O(Δ²) and O(Δ) (ZOH is exact there)."""
    A, B = stable_matrix(3, gen), randn(3, gen=gen)
    deltas = [0.1 / 2 ** i for i in range(5)]

    def slope(errors):
        x = torch.log(torch.tensor(deltas, dtype=F64))
        y = torch.log(torch.tensor(errors, dtype=F64))
        xc = x - x.mean()
        return float((xc * (y - y.mean())).sum() / (xc * xc).sum())

    local = {m: [] for m in ("bilinear", "euler")}
    glob = {m: [] for m in ("bilinear", "euler")}
    T = 0.8
    for d in deltas:
        zA, zB = discretize(A, B, d, "zoh")
        steps = round(T / d)
        exact = torch.linalg.solve(A, (torch.linalg.matrix_exp(steps * d * A) - torch.eye(3, dtype=F64)) @ B)
        for m in local:
            mA, mB = discretize(A, B, d, m)
            local[m].append(float(torch.linalg.norm(mA - zA) + torch.linalg.norm(mB - zB)))
            x = torch.zeros(3, dtype=F64)
            for _ in range(steps):
                x = mA @ x + mB                                       # unit step input
            glob[m].append(float(torch.linalg.norm(x - exact)))
    assert abs(slope(local["bilinear"]) - 3) < 0.15
    assert abs(slope(local["euler"]) - 2) < 0.15
    assert abs(slope(glob["bilinear"]) - 2) < 0.15
    assert abs(slope(glob["euler"]) - 1) < 0.15


def test_discretize_gradients_near_zero_A_M9_2():
    """Diagonal ZOH near A = 0 (the Taylor branch of (e^x − 1)/x): gradcheck passes on both sides of the
    branch point, and at A = 0 the derivative of B̄ = Δ·φ₁(ΔA)·B is Δ²B/2."""
    a = torch.tensor([0.0, 1e-6, -0.05, -0.1, -0.3, 0.2], dtype=F64, requires_grad=True)
    b = torch.linspace(0.5, 1.5, 6, dtype=F64, requires_grad=True)
    delta = torch.tensor(0.7, dtype=F64, requires_grad=True)
    for method in ("zoh", "bilinear", "euler"):
        assert torch.autograd.gradcheck(lambda a_, b_, d_: discretize(a_, b_, d_, method), (a, b, delta))
    _, B_bar = discretize(a, b, delta, "zoh")
    g = torch.autograd.grad(B_bar[0], a)[0]
    assert_close(g[0], 0.7 ** 2 * b[0].detach() / 2)


@pytest.mark.parametrize("method", ["zoh", "bilinear", "euler"])
def test_discretize_broadcasts_batch_dims_and_keeps_half_dtypes_M9_2(method, gen):
    """A (2, 1, 3, 3), B (1, 4, 3), δ (4,) → A_bar (2, 4, 3, 3), B_bar (2, 4, 3) for every method, each entry ≡
    its own unbatched call; bf16 in → bf16 out (computed in fp32), ≡ the fp32 result rounded once."""
    A, B = stable_matrix(3, gen, batch=(2, 1)), randn(1, 4, 3, gen=gen)
    delta = torch.tensor([0.1, 0.2, 0.5, 1.0], dtype=F64)
    A_bar, B_bar = discretize(A, B, delta, method)
    assert A_bar.shape == (2, 4, 3, 3) and B_bar.shape == (2, 4, 3)
    for i in range(2):
        for j in range(4):
            one_A, one_B = discretize(A[i, 0], B[0, j], float(delta[j]), method)
            assert_close(A_bar[i, j], one_A)
            assert_close(B_bar[i, j], one_B)
    a, b = -torch.rand(5, generator=gen), torch.randn(5, generator=gen)
    for half in (torch.bfloat16, torch.float16):
        h_A, h_B = discretize(a.to(half), b.to(half), 0.3, method)
        f_A, f_B = discretize(a.to(half).float(), b.to(half).float(), 0.3, method)
        assert h_A.dtype == h_B.dtype == half
        assert_close(h_A, f_A.to(half))
        assert_close(h_B, f_B.to(half))


def test_discretize_bad_inputs_M9_2(gen):
    """Unknown method, mismatched or ambiguous ranks, singular dense A under ZOH, negative δ, bad dtypes raise."""
    A, B = stable_matrix(3, gen), randn(3, gen=gen)
    with pytest.raises(ValueError, match="method"):
        discretize(A, B, 0.1, "rk4")
    with pytest.raises(ValueError, match=r"A.*\(3, 3\).*B.*\(4,\)"):
        discretize(A, randn(4, gen=gen), 0.1)
    with pytest.raises(ValueError, match="diagonal A"):
        discretize(randn(4, gen=gen), B, 0.1)
    with pytest.raises(ValueError, match="A must be diagonal"):
        discretize(randn(2, 3, 3, gen=gen), B, 0.1)
    with pytest.raises(ValueError, match="singular"):
        discretize(torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=F64), B[:2], 0.1, "zoh")
    with pytest.raises(ValueError, match="delta must be >= 0"):
        discretize(A, B, -0.1)
    with pytest.raises(ValueError, match="broadcast"):
        discretize(stable_matrix(3, gen, batch=(2,)), B[None], torch.ones(5, dtype=F64))
    with pytest.raises(TypeError, match="A must be a floating-point"):
        discretize(torch.ones(3, 3, dtype=torch.int64), B, 0.1)
    with pytest.raises(TypeError, match="delta"):
        discretize(A, B, "0.1")


# ----------------------------------------------------------------------------- M9.1 / M9.3 kernel ≡ recurrence ≡ conv
@HYP
@given(L=st.integers(1, 23), N=st.integers(1, 5), dense=st.booleans(), seed=st.integers(0, 2**16))
def test_recurrence_equals_direct_and_fft_convolution_M9_1_M9_3(L, N, dense, seed):
    """recurrence ≡ naive O(L²) conv with K ≡ FFT conv (padded to 2L), odd and even L, fp64, with gradients
    w.r.t. A_bar, B_bar, C and u."""
    g = torch.Generator().manual_seed(seed)
    if dense:
        A_bar = (0.9 * torch.linalg.matrix_exp(0.3 * stable_matrix(N, g))).requires_grad_()
    else:
        A_bar = (2 * torch.rand(N, generator=g, dtype=F64) - 1).requires_grad_()
    B_bar, C = randn(N, gen=g, requires_grad=True), randn(N, gen=g, requires_grad=True)
    u = randn(2, L, gen=g, requires_grad=True)
    params = (A_bar, B_bar, C, u)
    rec = ssm_recurrence(A_bar, B_bar, C, u)
    K = ssm_kernel(A_bar, B_bar, C, L)
    direct, fft = direct_conv(u, K), ssm_convolve(u, K)
    assert rec.shape == fft.shape == (2, L)
    assert_close(direct, rec)
    assert_close(fft, rec)
    cot = randn(2, L, gen=g)
    ref = grads(rec, params, cot)
    for out in (direct, fft):
        for a, b in zip(grads(out, params, cot), ref):
            assert_close(a, b)


def test_ssm_kernel_equals_matrix_powers_M9_3(gen):
    """K_k = C A^k B with ``torch.linalg.matrix_power`` (dense, batched, L not a power of two), and the
    diagonal Vandermonde kernel ≡ Σ_n C_n B_n a_n^k for a batch of real and complex systems."""
    A, B, C = 0.3 * randn(2, 4, 4, gen=gen), randn(2, 4, gen=gen), randn(4, gen=gen)
    K = ssm_kernel(A, B, C, 13)
    ref = torch.stack([torch.stack([C @ torch.linalg.matrix_power(A[i], k) @ B[i] for k in range(13)])
                       for i in range(2)])
    assert_close(K, ref)
    for dtype in (F64, torch.complex128):
        a = torch.rand(3, 5, generator=gen, dtype=F64).to(dtype)
        if dtype.is_complex:
            a = a * torch.exp(1j * randn(3, 5, gen=gen))                  # inside the unit disc
        b, c = randn(3, 5, gen=gen).to(dtype), randn(5, gen=gen).to(dtype)
        K = ssm_kernel(a, b, c, 7)
        ref = torch.stack([torch.stack([sum(c[n] * b[i, n] * a[i, n] ** k for n in range(5)) for k in range(7)])
                           for i in range(3)])
        close(K, ref)


def test_ssm_convolve_is_causal_without_wraparound_M9_3(gen):
    """Perturbing u at positions ≥ p leaves y_{<p} unchanged (odd length 15); an impulse at the last position
    appears only at the last output, where a circular (unpadded) FFT would wrap it to the front."""
    L = 15
    K = randn(L, gen=gen)
    for p in (1, 7, 14):
        assert check_causal(lambda x: ssm_convolve(x, K), randn(3, L, gen=gen), position=p, dim=-1, atol=1e-12) \
            <= 1e-12
    impulse = torch.zeros(L, dtype=F64)
    impulse[-1] = 1.0
    y = ssm_convolve(impulse, K)
    assert_close(y[-1], K[0])
    assert float(y[:-1].abs().max()) < 1e-12
    circular = torch.fft.irfft(torch.fft.rfft(impulse) * torch.fft.rfft(K), n=L)
    assert float(circular[:-1].abs().max()) > 0.1                      # what padding to 2L avoids


def test_ssm_convolve_dtypes_and_complex_M9_3(gen):
    """bf16/fp16 in → same dtype out, computed in fp32; a complex kernel uses the complex FFT (≡ direct conv)."""
    u, K = randn(2, 11, gen=gen, dtype=torch.float32), randn(11, gen=gen, dtype=torch.float32)
    for half in (torch.bfloat16, torch.float16):
        y = ssm_convolve(u.to(half), K.to(half))
        assert y.dtype == half
        assert_close(y, direct_conv(u.to(half).double(), K.to(half).double()).to(half))
    Kc = torch.complex(randn(11, gen=gen), randn(11, gen=gen))
    uc = u.double()
    close(ssm_convolve(uc, Kc), direct_conv(uc.to(Kc.dtype), Kc))


def test_lti_bad_inputs_M9_3(gen):
    """Bad length, mismatched N, a non-square dense A, non-broadcasting batches, L mismatch, L = 0 raise."""
    a, b, c = randn(4, gen=gen), randn(4, gen=gen), randn(4, gen=gen)
    with pytest.raises(ValueError, match="length"):
        ssm_kernel(a, b, c, 0)
    with pytest.raises(ValueError, match=r"C .*\(3,\).*B_bar.*\(4,\)"):
        ssm_kernel(a, b, c[:3], 5)
    with pytest.raises(ValueError, match="dense A"):
        ssm_kernel(randn(4, 3, gen=gen), b, c, 5)
    with pytest.raises(ValueError, match="batch dims"):
        ssm_recurrence(randn(2, 4, gen=gen), randn(3, 4, gen=gen), c, randn(7, gen=gen))
    with pytest.raises(ValueError, match=r"same length.*\(2, 7\).*\(6,\)"):
        ssm_convolve(randn(2, 7, gen=gen), randn(6, gen=gen))
    with pytest.raises(TypeError, match="u must be a torch.Tensor"):
        ssm_convolve([1.0, 2.0], randn(2, gen=gen))
    with pytest.raises(ValueError, match=r"positive length.*\(2, 0\)"):
        ssm_convolve(randn(2, 0, gen=gen), randn(0, gen=gen))
    with pytest.raises(ValueError, match=r"positive length"):
        ssm_recurrence(a, b, c, randn(3, 0, gen=gen))


# ----------------------------------------------------------------------------- M9.8 selective scan
def test_reference_loop_matches_scalar_triple_loop_M9_8():
    """The test's per-timestep reference ≡ plain Python floats and ``math.exp`` (batch 1, one channel,
    N = 2, input-dependent B and C, D, z, delta_bias, softplus): the oracle itself is checked by hand."""
    u, dl, z = [0.5, -1.0, 2.0], [0.3, -0.2, 1.1], [0.7, -0.4, 1.5]
    A, bias, D = [-1.0, -0.25], 0.1, 0.6
    B, C = [[1.0, 0.5, -2.0], [0.3, -1.0, 0.8]], [[0.2, 1.0, -0.5], [1.5, 0.1, 0.4]]
    x, want = [0.0, 0.0], []
    for t in range(3):
        d = math.log1p(math.exp(dl[t] + bias))
        x = [math.exp(d * A[n]) * x[n] + d * B[n][t] * u[t] for n in range(2)]
        y = sum(x[n] * C[n][t] for n in range(2)) + D * u[t]
        want.append(y * z[t] / (1 + math.exp(-z[t])))
    T = lambda v: torch.tensor(v, dtype=F64)  # noqa: E731
    args = (T(u).view(1, 1, 3), T(dl).view(1, 1, 3), T(A).view(1, 2), T(B).view(1, 2, 3), T(C).view(1, 2, 3))
    kw = dict(D=T([D]), z=T(z).view(1, 1, 3), delta_bias=T([bias]), delta_softplus=True)
    y_ref, last_ref = ref_selective_scan(*args, **kw)
    assert_close(y_ref.flatten(), T(want))
    assert_close(last_ref.flatten(), T(x))
    for mode in ("sequential", "chunk", "scan"):
        y, last = selective_scan(*args, **kw, return_last_state=True, mode=mode, chunk_size=2)
        assert_close(y.flatten(), T(want))
        assert_close(last.flatten(), T(x))


@pytest.mark.parametrize("bc", ["fixed", "variable", "grouped"])
@pytest.mark.parametrize("extras", ["none", "D", "z", "D+z+bias+softplus"])
def test_selective_scan_sequential_equals_reference_M9_8(bc, extras, gen):
    """mode="sequential" ≡ the per-step reference in outputs, last state and gradients of every input (fp64),
    for fixed (d_inner, N), input-dependent (batch, N, L) and grouped (batch, G, N, L) B and C, with and
    without D, z and delta_bias + softplus."""
    u, delta, A, B, C = scan_inputs(gen, bc=bc)
    kw = {}
    if "D" in extras:
        kw["D"] = randn(4, gen=gen, requires_grad=True)
    if "z" in extras:
        kw["z"] = randn(2, 4, 9, gen=gen, requires_grad=True)
    if "bias" in extras:
        kw["delta_bias"] = randn(4, gen=gen, requires_grad=True)
        kw["delta_softplus"] = True
    y, last = selective_scan(u, delta, A, B, C, **kw, return_last_state=True)
    y_ref, last_ref = ref_selective_scan(u, delta, A, B, C, **kw)
    assert y.shape == (2, 4, 9) and last.shape == (2, 4, 3)
    assert_close(y, y_ref)
    assert_close(last, last_ref)
    assert torch.equal(selective_scan(u, delta, A, B, C, **kw), y)       # return_last_state=False: y alone
    params = [u, delta, A, B, C] + [v for v in kw.values() if isinstance(v, torch.Tensor)]
    cot_y, cot_x = randn(2, 4, 9, gen=gen), randn(2, 4, 3, gen=gen)
    loss = (y * cot_y).sum() + (last * cot_x).sum()
    loss_ref = (y_ref * cot_y).sum() + (last_ref * cot_x).sum()
    for a, b in zip(torch.autograd.grad(loss, params), torch.autograd.grad(loss_ref, params)):
        assert_close(a, b)


@HYP
@given(batch=st.integers(1, 2), dim=st.sampled_from([2, 4]), L=st.integers(1, 40), N=st.integers(1, 4),
       chunk=st.integers(1, 48), bc=st.sampled_from(["fixed", "variable", "grouped"]), use_dz=st.booleans(),
       seed=st.integers(0, 2**16))
def test_selective_scan_chunk_and_scan_equal_sequential_M9_9(batch, dim, L, N, chunk, bc, use_dz, seed):
    """Property (fp64): mode="chunk" (any chunk size, dividing L or not, larger than L or 1) and mode="scan"
    ≡ mode="sequential" in outputs, last state and gradients."""
    g = torch.Generator().manual_seed(seed)
    u, delta, A, B, C = scan_inputs(g, batch=batch, dim=dim, L=L, N=N, bc=bc, delta_scale=2.0)
    kw = {}
    if use_dz:
        kw = dict(D=randn(dim, gen=g, requires_grad=True), z=randn(batch, dim, L, gen=g, requires_grad=True),
                  delta_bias=randn(dim, gen=g, requires_grad=True), delta_softplus=True)
    params = [u, delta, A, B, C] + [v for v in kw.values() if isinstance(v, torch.Tensor)]
    cot_y, cot_x = randn(batch, dim, L, gen=g), randn(batch, dim, N, gen=g)
    outs = {}
    for mode in ("sequential", "chunk", "scan"):
        y, last = selective_scan(u, delta, A, B, C, **kw, return_last_state=True, mode=mode, chunk_size=chunk)
        loss = (y * cot_y).sum() + (last * cot_x).sum()                  # L = 1: scan mode never touches A
        outs[mode] = (y, last, torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True))
    y0, x0, g0 = outs["sequential"]
    for mode in ("chunk", "scan"):
        y, x, gr = outs[mode]
        assert_close(y, y0, name=f"{mode} y")
        assert_close(x, x0, name=f"{mode} last_state")
        for i, (a, b) in enumerate(zip(gr, g0)):
            assert_close(a, b, name=f"{mode} grad {i}")


def test_selective_scan_chunk_equals_sequential_M9_8(gen):
    """The default chunk_size=64 on L = 150 (two full chunks and a ragged one), fp32, with every option."""
    u, delta, A, B, C = scan_inputs(gen, batch=2, dim=4, L=150, N=8, bc="variable", dtype=torch.float32)
    kw = dict(D=torch.randn(4, generator=gen), z=torch.randn(2, 4, 150, generator=gen),
              delta_bias=torch.randn(4, generator=gen), delta_softplus=True)
    y0, x0 = selective_scan(u, delta, A, B, C, **kw, return_last_state=True)
    y1, x1 = selective_scan(u, delta, A, B, C, **kw, return_last_state=True, mode="chunk")
    assert_close(y1, y0)
    assert_close(x1, x0)
    y_ref, x_ref = ref_selective_scan(u.double(), delta.double(), A.double(), B.double(), C.double(),
                                      **{k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert_close(y1, y_ref.float())
    assert_close(x1, x_ref.float())


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_selective_scan_strong_decay_does_not_overflow_M9_9(dtype, gen):
    """δ·|A| up to ~1e4 per step (cumulative sums of δA reach −1e5 inside a chunk): chunk and scan modes
    stay finite and ≡ sequential, gradients included; the state forgets everything but the last input."""
    batch, dim, L, N = 1, 3, 40, 4
    u = randn(batch, dim, L, gen=gen, dtype=dtype, requires_grad=True)
    delta = (50.0 + 50.0 * torch.rand(batch, dim, L, generator=gen, dtype=F64)).to(dtype).requires_grad_()
    A = (-torch.logspace(0, 2, N, dtype=F64).repeat(dim, 1)).to(dtype).requires_grad_()
    B = randn(batch, N, L, gen=gen, dtype=dtype, requires_grad=True)
    C = randn(batch, N, L, gen=gen, dtype=dtype, requires_grad=True)
    params = (u, delta, A, B, C)
    cot = randn(batch, dim, L, gen=gen, dtype=dtype)
    y0, x0 = selective_scan(*params, return_last_state=True)
    g0 = torch.autograd.grad((y0 * cot).sum(), params)
    # with exp(δA) ≈ 0 the state is just the current drive: x_t = δ_t B_t u_t
    assert_close(x0, (delta[..., -1:] * B[:, None, :, -1] * u[..., -1:]).detach())
    for mode in ("chunk", "scan"):
        y, x = selective_scan(*params, return_last_state=True, mode=mode, chunk_size=16)
        gr = torch.autograd.grad((y * cot).sum(), params)
        assert torch.isfinite(y).all() and torch.isfinite(x).all()
        assert_close(y, y0)
        assert_close(x, x0)
        for a, b in zip(gr, g0):
            assert torch.isfinite(a).all()
            assert_close(a, b)


@pytest.mark.parametrize("bc", ["fixed", "variable", "grouped"])
@pytest.mark.parametrize("group_elements", [1, 240])
def test_selective_scan_factored_chunks_in_groups_M9_9(bc, group_elements, gen, monkeypatch):
    """The closed-form chunks are processed in cache-sized groups of chunks: with groups of one chunk, or of
    two chunks with a shorter last group (5 chunks of 5, the last one ragged), the result still ≡ the step
    loop, gradients included (fp64); without autograd (group buffers reused) too."""
    import xfam_lib.ssm.selective as ssm
    monkeypatch.setitem(ssm._GROUP_ELEMENTS, "cpu", group_elements)   # 240 // (2 * 4 * 5 * 3) = 2 chunks
    u, delta, A, B, C = scan_inputs(gen, L=23, bc=bc, delta_scale=0.5)
    params = (u, delta, A, B, C)
    assert ssm._factored_chunk_size(delta.detach(), A.detach(), 5) == 5
    cot = randn(2, 4, 23, gen=gen)
    outs = [selective_scan(*params, return_last_state=True, mode=m, chunk_size=5) for m in ("sequential", "chunk")]
    grads_ = [torch.autograd.grad((y * cot).sum() + x.sum(), params) for y, x in outs]
    assert_close(outs[1][0], outs[0][0])
    assert_close(outs[1][1], outs[0][1])
    for i, (a, b) in enumerate(zip(grads_[1], grads_[0])):
        assert_close(a, b, name=f"grad {i}")
    with torch.no_grad():
        y, x = selective_scan(*params, return_last_state=True, mode="chunk", chunk_size=5)
    assert_close(y, outs[0][0].detach())
    assert_close(x, outs[0][1].detach())


def test_selective_scan_chunk_plan_counts_sequential_steps_M9_9(gen):
    """mode="chunk" picks its form by sequential steps off the CPU. Mamba's decays (A = -(1..16),
    delta = softplus(x - 2)) at L = 1024 halve the factored chunk to s <= 8, L / s >= 128 steps: the
    loop inside chunks of ceil(sqrt(L)) = 32 takes 32 + 32 = 64 and replaces it (on the CPU, where
    passes over memory cost more, the factored form stays). Weak decays keep factored chunks of 64
    (16 steps) everywhere; decays no factored chunk holds take the loop form; chunk_size caps T."""
    from xfam_lib.ssm.selective import _chunk_plan
    L, N = 1024, 16
    A = -torch.arange(1, N + 1, dtype=torch.float32).repeat(8, 1)
    delta = torch.nn.functional.softplus(torch.randn(2, 8, L, generator=gen) - 2)
    factored, loop = _chunk_plan(delta, A, 64, count_steps=False)
    assert loop == 32 and factored is not None and math.ceil(L / factored) >= 128
    assert _chunk_plan(delta, A, 64, count_steps=True) == (None, 32)
    for count_steps in (False, True):
        assert _chunk_plan(delta / 100, A, 64, count_steps) == (64, 32)
        assert _chunk_plan(delta * 100, A, 64, count_steps) == (None, 32)
    assert _chunk_plan(delta, A, 16, count_steps=True)[1] == 16
    assert _chunk_plan(delta[..., :1], A, 64, count_steps=True)[1] == 1


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_selective_scan_factored_chunks_shrink_to_fit_M9_9(dtype, gen):
    """mode="chunk" computes each chunk in closed form, x_t = E_t (e^{Am} x_in + sum_s δ_s B_s u_s / E_s) with
    E_t = exp(A (c_t - m)) centred on the middle m of the chunk's sums of δ, only while every factor stays
    within the dtype's limit (e^±40 in fp32, e^±80 uncentred): a chunk of 64 whose decay reaches
    |A| Σδ = 2 · 64 is halved until it fits (to 32 in fp32; fp64's limit, 300, keeps 64), and the result
    still ≡ the step loop in outputs, last state and gradients; decays no chunk of 4 can hold go to the
    loop inside chunks (None)."""
    from xfam_lib.ssm.selective import _FACTOR_LIMIT, _factored_chunk_size
    batch, dim, L, N = 2, 3, 150, 4
    u = randn(batch, dim, L, gen=gen, dtype=dtype, requires_grad=True)
    delta = torch.full((batch, dim, L), 1.0, dtype=dtype).requires_grad_()
    A = -torch.linspace(0.5, 2.0, N, dtype=F64).repeat(dim, 1).to(dtype).requires_grad_()
    B, C = (randn(batch, N, L, gen=gen, dtype=dtype, requires_grad=True) for _ in range(2))
    limit = _FACTOR_LIMIT[dtype]
    # sums of delta = 1 run 1 .. s in a chunk of s: centred exponents reach |A| (s - 1) / 2, plain ones |A| s
    want = next(s for s in (64, 32, 16, 8, 4) if 2.0 * (s - 1) / 2 <= limit and 2.0 * s <= 2 * limit)
    assert _factored_chunk_size(delta.detach(), A.detach(), 64) == want
    assert _factored_chunk_size(delta.detach() * 1e3, A.detach(), 64) is None
    params = (u, delta, A, B, C)
    cot = randn(batch, dim, L, gen=gen, dtype=dtype)
    outs = {}
    for mode in ("sequential", "chunk"):
        y, x = selective_scan(*params, return_last_state=True, mode=mode, chunk_size=64)
        outs[mode] = (y, x, torch.autograd.grad((y * cot).sum() + x.sum(), params))
    (y0, x0, g0), (y1, x1, g1) = outs["sequential"], outs["chunk"]
    assert_close(y1, y0)
    assert_close(x1, x0)
    for i, (a, b) in enumerate(zip(g1, g0)):
        assert_close(a, b, name=f"grad {i}")


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["sequential", "chunk"])
def test_selective_scan_half_inputs_compute_in_fp32_M9_8(half, mode, gen):
    """bf16/fp16 inputs → y in that dtype, last_state in fp32; the result ≡ the fp32 reference on the same
    (rounded) inputs, rounded once. fp64 inputs stay fp64 (checked in the other tests)."""
    u, delta, A, B, C = (t.detach().to(half) for t in scan_inputs(gen, bc="variable", dtype=torch.float32))
    D, z = torch.randn(4, generator=gen).to(half), torch.randn(2, 4, 9, generator=gen).to(half)
    y, last = selective_scan(u, delta, A, B, C, D, z, return_last_state=True, mode=mode, chunk_size=4)
    assert y.dtype == half and last.dtype == torch.float32
    y_ref, last_ref = ref_selective_scan(*(t.float() for t in (u, delta, A, B, C)), D=D.float(), z=z.float())
    assert_close(y, y_ref.to(half))
    assert_close(last, last_ref, atol=1e-5, rtol=1e-5)
    # mamba's layout mixes dtypes (fp32 A and D with half activations): allowed, y keeps u's dtype
    y_mixed = selective_scan(u, delta, A.float(), B, C, D.float(), z, mode=mode)
    assert y_mixed.dtype == half
    assert_close(y_mixed, y)


@pytest.mark.parametrize("mode", ["sequential", "chunk", "scan"])
def test_selective_scan_is_causal_M9_8(mode, gen):
    """Perturbing u, δ, B, C and z at positions ≥ p leaves y_{<p} unchanged (up to fp64 round-off)."""
    u, delta, A, B, C = scan_inputs(gen, L=12, requires_grad=False)
    z = randn(2, 4, 12, gen=gen)
    for p in (1, 5, 11):
        check_causal(lambda x: selective_scan(x, delta, A, B, C, z=z, mode=mode, chunk_size=5), u, position=p,
                     dim=-1, atol=1e-12)
        for name in ("delta", "B", "C", "z"):
            base = dict(u=u, delta=delta, A=A, B=B, C=C, z=z)

            def run(x, name=name, base=base):
                args = dict(base, **{name: x.abs() if name == "delta" else x})
                return selective_scan(**args, mode=mode, chunk_size=5)

            check_causal(run, base[name], position=p, dim=-1, atol=1e-12)


def test_selective_scan_lti_case_is_a_convolution_with_euler_B_E9_6(gen):
    """Constant δ and fixed B, C make the scan LTI: channel d ≡ ssm_convolve(u, ssm_kernel(exp(δA), δB, C)),
    i.e. Mamba's B̄ = δB (Euler), not the ZOH B̄ of ``discretize`` — the two differ at large δ (E9.6)."""
    batch, dim, L, N = 2, 3, 17, 4
    u = randn(batch, dim, L, gen=gen)
    step = torch.tensor([0.05, 0.5, 2.0], dtype=F64)
    A, B, C = -torch.exp(randn(dim, N, gen=gen)), randn(dim, N, gen=gen), randn(dim, N, gen=gen)
    y = selective_scan(u, step[None, :, None].expand(batch, dim, L), A, B, C)
    A_bar, B_zoh = discretize(A, B, step, "zoh")                          # one step per channel
    K_euler = ssm_kernel(A_bar, step[:, None] * B, C, L)                  # (dim, L)
    assert_close(y, ssm_convolve(u, K_euler))
    mismatch = (ssm_convolve(u, ssm_kernel(A_bar, B_zoh, C, L)) - y).abs().amax(dim=(0, 2))
    assert float(mismatch[2]) > 10 * float(mismatch[0])                  # the gap grows with δ
    assert float(mismatch[2]) > 1e-2


def test_no_fixed_kernel_reproduces_a_selective_scan_E9_1(gen):
    """Least squares over all length-L kernels: an LTI scan (constant δ, fixed B, C) is fitted exactly,
    a selective one (δ, B, C varying with time) leaves a residual (E9.1)."""
    batch, L, N = 24, 10, 3
    u = randn(batch, 1, L, gen=gen)
    A = -torch.exp(randn(1, N, gen=gen))
    toeplitz = torch.stack([torch.stack([u[:, 0, t - k] if k <= t else torch.zeros(batch, dtype=F64)
                                         for k in range(L)], dim=-1) for t in range(L)], dim=1)  # (batch, L, L)
    design = toeplitz.reshape(batch * L, L)

    def residual(y):
        target = y.reshape(batch * L, 1)
        K = torch.linalg.lstsq(design, target).solution
        return float(torch.linalg.norm(design @ K - target) / torch.linalg.norm(target))

    lti = selective_scan(u, torch.full((batch, 1, L), 0.4, dtype=F64), A, randn(1, N, gen=gen), randn(1, N, gen=gen))
    u_dep = (0.1 + torch.rand(batch, 1, L, generator=gen, dtype=F64)) * (1 + u.abs())
    selective = selective_scan(u, u_dep, A, randn(batch, N, L, gen=gen), randn(batch, N, L, gen=gen))
    assert residual(lti) < 1e-12
    assert residual(selective) > 0.1


# ----------------------------------------------------------------------------- bad inputs
def _good(gen):
    u, delta, A, B, C = scan_inputs(gen, batch=2, dim=4, L=6, N=3, requires_grad=False)
    return dict(u=u, delta=delta, A=A, B=B, C=C)


@pytest.mark.parametrize("change, error, pattern", [
    (dict(u=torch.zeros(2, 4)), ValueError, r"u must be \(batch, d_inner, L\), got shape \(2, 4\)"),
    (dict(u=torch.zeros(2, 4, 0, dtype=F64)), ValueError, r"u must have d_inner >= 1 and L >= 1.*\(2, 4, 0\)"),
    (dict(delta=torch.zeros(2, 4, 5, dtype=F64)), ValueError, r"delta must have u's shape .*\(2, 4, 6\).*\(2, 4, 5\)"),
    (dict(A=torch.zeros(3, 3, dtype=F64)), ValueError, r"A must be \(d_inner, N\) with d_inner = 4.*\(3, 3\)"),
    (dict(B=torch.zeros(2, 3, 5, dtype=F64)), ValueError, r"B must be fixed.*\(2, 3, 6\).*got \(2, 3, 5\)"),
    (dict(C=torch.zeros(4, 2, dtype=F64)), ValueError, r"C must be fixed \(d_inner, N\) = \(4, 3\).*got \(4, 2\)"),
    (dict(B=torch.zeros(2, 3, 3, 6, dtype=F64)), ValueError, r"B must be .*G dividing d_inner = 4; got \(2, 3, 3, 6\)"),
    (dict(D=torch.zeros(3, dtype=F64)), ValueError, r"D must be \(d_inner,\) = \(4,\), got \(3,\)"),
    (dict(delta_bias=torch.zeros(4, 1, dtype=F64)), ValueError, r"delta_bias must be \(d_inner,\)"),
    (dict(z=torch.zeros(2, 4, 7, dtype=F64)), ValueError, r"z must have u's shape"),
    (dict(u=torch.zeros(2, 4, 6, dtype=torch.int64)), TypeError, r"u must be a floating-point"),
    (dict(A=torch.zeros(4, 3, dtype=torch.complex64)), TypeError, r"A must be real"),
    (dict(B=[[0.0] * 3] * 4), TypeError, r"B must be a torch.Tensor"),
    (dict(mode="parallel"), ValueError, r"mode must be one of"),
    (dict(chunk_size=0), ValueError, r"chunk_size must be positive"),
    (dict(chunk_size=2.5), TypeError, r"chunk_size must be a positive int"),
])
def test_selective_scan_bad_inputs_M9_8(change, error, pattern, gen):
    """Every bad argument raises naming the argument and the shapes (or dtype) it saw."""
    with pytest.raises(error, match=pattern):
        selective_scan(**dict(_good(gen), **change))


# ----------------------------------------------------------------------------- M9.9 parallel scans
def loop_scan(a, b):
    x, out = torch.zeros_like(b[..., 0]), []
    for t in range(b.shape[-1]):
        x = a[..., t] * x + b[..., t]
        out.append(x)
    return torch.stack(out, dim=-1)


@HYP
@given(L=st.integers(1, 70), method=st.sampled_from(["hillis_steele", "blelloch"]), seed=st.integers(0, 2**16))
def test_associative_scan_equals_loop_M9_9(L, method, seed):
    """Hillis–Steele and Blelloch ≡ the sequential loop x_t = a_t x_{t-1} + b_t (fp64, any L, not only powers
    of two), outputs and gradients; ``a`` broadcasts against ``b``."""
    g = torch.Generator().manual_seed(seed)
    a = (2 * torch.rand(3, L, generator=g, dtype=F64) - 1).requires_grad_()
    b = randn(2, 3, L, gen=g, requires_grad=True)
    x = associative_scan(a, b, method=method)
    ref = loop_scan(a.expand_as(b), b)
    assert_close(x, ref)
    cot = randn(2, 3, L, gen=g)
    for p, q in zip(grads(x, (a, b), cot), grads(ref, (a, b), cot)):
        assert_close(p, q)


def test_segsum_and_scan_errors_M9_9(gen):
    """segsum[t, s] = x_{s+1} + … + x_t below the diagonal (a double loop), 0 on it, −inf above;
    an unknown scan method and non-broadcasting shapes raise."""
    x = randn(2, 6, gen=gen)
    S = segsum(x)
    for t in range(6):
        for s in range(6):
            if s <= t:
                assert_close(S[:, t, s], x[:, s + 1:t + 1].sum(-1))
            else:
                assert bool((S[:, t, s] == float("-inf")).all())
    with pytest.raises(ValueError, match="method"):
        associative_scan(x, x, method="kogge_stone")
    with pytest.raises(ValueError, match=r"a \(2, 6\) and b \(2, 5\)"):
        associative_scan(x, x[:, :5])
