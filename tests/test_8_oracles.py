"""Chapter 8 against maintained outside implementations (test-only dependencies, pinned in requirements.txt):

* flash-linear-attention (``fla-core``): its pure-PyTorch ``naive.py`` references, loaded by file path
  because ``import fla.ops.<op>`` pulls in triton, which does not run on a CPU. They compute in fp32.
* ``performer-pytorch``: its ``softmax_kernel`` (FAVOR+ positive features) and ``linear_attention``,
  with ``eps=0`` (its default 1e-4 is added to every feature and does not cancel).

M8.7, M8.9, M8.13, M8.14, M8.15, M8.21. Both sides run in fp32 here, so the fp32 tolerance applies.
"""
import importlib.util
import pathlib

import pytest
import torch

from xfam_lib.linear import (
    delta_rule,
    elu_feature_map,
    gated_linear_attention,
    linear_attention,
    make_log_gate,
    orthogonal_gaussian,
    performer_attention,
    retention,
)
from xfam_lib.testing import assert_close

fla = pytest.importorskip("fla")


def fla_naive(op):
    """``fla/ops/<op>/naive.py`` as a module, without importing the triton-backed ``fla.ops`` package."""
    path = pathlib.Path(fla.__file__).parent / "ops" / op / "naive.py"
    spec = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bthd(x):
    """(B, H, T, D) → fla's (B, T, H, D)."""
    return x.transpose(1, 2)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_causal_linear_attention_vs_fla_naive_M8_9(mode, normalize, gen):
    """fla ``naive_recurrent_linear_attn`` (q scaled by D^-1/2, no feature map, 1e-10 in the denominator)
    ≡ causal `linear_attention` on elu+1 features with ``q`` pre-scaled, every mode; and fla's
    ``naive_chunk_linear_attn`` for the unnormalised form."""
    naive = fla_naive("linear_attn")
    q, k, v = (torch.randn(2, 3, 128, 8, generator=gen) for _ in range(3))    # fla's chunk form: T % 64 == 0
    fq, fk = elu_feature_map(q), elu_feature_map(k)
    scale = 8 ** -0.5
    want, _ = naive.naive_recurrent_linear_attn(bthd(fq), bthd(fk), bthd(v), normalize=normalize)
    got = linear_attention(fq * scale, fk, v, feature_map="identity", causal=True, normalize=normalize,
                           mode=mode, chunk_size=23, eps=1e-10)
    if normalize:
        assert_close(got, bthd(want), name=f"linear_attention {mode} vs fla naive recurrent")
        return
    # Unnormalised outputs are sums of up to L + d fp32 products that cancel: two fp32 summation orders differ
    # by at most gamma_n sum|terms| (Higham's bound, gamma_n ~ n u, u = 2^-24), elementwise.
    terms = scale * (fq @ fk.transpose(-2, -1)).tril() @ v.abs()              # fq, fk > 0: sum of |terms|
    bound = 2 * (q.shape[-2] + q.shape[-1]) * 2.0 ** -24 * terms
    want_chunk = naive.naive_chunk_linear_attn(bthd(fq), bthd(fk), bthd(v))       # chunk 64, returns o only
    for name, ref in (("naive recurrent", want), ("naive chunk", want_chunk)):
        err = (got - bthd(ref)).abs()
        assert (err <= bound).all(), f"{mode} vs fla {name}: max error / bound {(err / bound).max():.3g}"


@pytest.mark.parametrize("mode", ["recurrent", "parallel", "chunk"])
@pytest.mark.parametrize("offset", [2.0, -4.0])
def test_gla_vs_fla_naive_recurrent_gla_M8_13(mode, offset, gen):
    """fla ``naive_recurrent_gla`` (scale K^-1/2, per-channel log gates) with an initial state: outputs and
    the final state. Mild gates (``logsigmoid(z + 2)``, near 0.88) keep every chunk in the factored form;
    strong ones (``logsigmoid(z - 4)``, near 0.02) push a chunk's log decay below ``-_SAFE_LOG_DECAY``, so the
    chunk form takes its log-space path (sub-chunks of 8 inside chunks of 16) and is checked there too."""
    from xfam_lib import linear
    naive = fla_naive("gla")
    B, H, T, K, V = 2, 2, 45, 8, 6
    q, k = (torch.randn(B, H, T, K, generator=gen) for _ in range(2))
    v = torch.randn(B, H, T, V, generator=gen)
    log_g = torch.nn.functional.logsigmoid(torch.randn(B, H, T, K, generator=gen) + offset)
    chunk_decay = log_g[..., :16, :].sum(-2)
    assert bool((chunk_decay >= -linear._SAFE_LOG_DECAY).all()) == (offset > 0)   # which path the chunk form takes
    s0 = torch.randn(B, H, K, V, generator=gen)
    want, want_state = naive.naive_recurrent_gla(bthd(q), bthd(k), bthd(v), bthd(log_g), initial_state=s0,
                                                 output_final_state=True)
    got, state = gated_linear_attention(q, k, v, log_g, mode=mode, chunk_size=16, initial_state=s0,
                                        return_final_state=True)
    assert_close(got, bthd(want), name=f"GLA {mode} vs fla")
    assert_close(state, want_state, name=f"GLA {mode} final state vs fla")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_scalar_gate_vs_fla_simple_gla_M8_14(mode, gen):
    """A scalar gate of GLA's Table 1 (Mamba-2's, from `make_log_gate`) expanded over d_k ≡ fla
    ``naive_recurrent_simple_gla`` (one log decay per head and step)."""
    naive = fla_naive("simple_gla")
    B, H, T, K, V, d_model = 1, 2, 24, 8, 4, 5
    q, k = (torch.randn(B, H, T, K, generator=gen) for _ in range(2))
    v = torch.randn(B, H, T, V, generator=gen)
    x = torch.randn(B, H, T, d_model, generator=gen)
    log_g = make_log_gate("mamba2", x, {"W": torch.randn(d_model, 1, generator=gen), "a": -1.0})   # (B, H, T, 1)
    want, _ = naive.naive_recurrent_simple_gla(bthd(q), bthd(k), bthd(v), bthd(log_g[..., 0]))
    got = gated_linear_attention(q, k, v, log_g.expand(q.shape), mode=mode, chunk_size=5)
    assert_close(got, bthd(want), name=f"scalar-gate GLA {mode} vs fla simple_gla")


@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_retention_vs_fla_naive_retention_M8_15(mode, gen):
    """fla ``naive_retention`` ((B, H, T, D), gamma_h = 1 - 2^(-5-h), q scaled by D^-1/2, no GroupNorm)."""
    naive = fla_naive("retention")
    B, H, T, D = 2, 4, 40, 8
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    gamma = 1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32))
    got = retention(q * D ** -0.5, k, v, gamma, mode=mode, chunk_size=16)
    assert_close(got, naive.naive_retention(q, k, v), name=f"retention {mode} vs fla")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_delta_rule_vs_fla_delta_rule_recurrence_M8_21(mode, gen):
    """fla ``delta_rule_recurrence`` ((B, H, T, D), beta (B, H, T), q scaled by D^-1/2, k used as given, so
    l2-normalised here as DeltaNet does) from an initial state ≡ `delta_rule`, outputs and final state."""
    naive = fla_naive("delta_rule")
    B, H, T, K, V = 2, 2, 37, 8, 6
    q, v = torch.randn(B, H, T, K, generator=gen), torch.randn(B, H, T, V, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, K, generator=gen), dim=-1)
    beta = torch.rand(B, H, T, generator=gen)
    s0 = torch.randn(B, H, K, V, generator=gen)
    want, want_state = naive.delta_rule_recurrence(q, k, v, beta, initial_state=s0.clone())
    got, state = delta_rule(q, k, v, beta, mode=mode, chunk_size=16, initial_state=s0, return_final_state=True)
    assert_close(got, want, name=f"delta_rule {mode} vs fla")
    assert_close(state, want_state, name=f"delta_rule {mode} final state vs fla")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_gated_delta_rule_vs_fla_naive_recurrent_gated_delta_rule_M8_21(mode, gen):
    """fla ``naive_recurrent_gated_delta_rule`` ((B, T, H, D), log gates g (B, T, H), scale K^-1/2) from an
    initial state ≡ `delta_rule` with ``log_g``: Gated DeltaNet, outputs and final state."""
    naive = fla_naive("gated_delta_rule")
    B, H, T, K, V = 2, 2, 37, 8, 6
    q, v = torch.randn(B, H, T, K, generator=gen), torch.randn(B, H, T, V, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, K, generator=gen), dim=-1)
    beta = torch.rand(B, H, T, generator=gen)
    log_g = torch.nn.functional.logsigmoid(torch.randn(B, H, T, generator=gen) + 2.0)
    s0 = torch.randn(B, H, K, V, generator=gen)
    bth = lambda x: x.transpose(1, 2)
    want, want_state = naive.naive_recurrent_gated_delta_rule(bthd(q), bthd(k), bthd(v), bth(beta), bth(log_g),
                                                               initial_state=s0, output_final_state=True)
    got, state = delta_rule(q, k, v, beta, log_g=log_g, mode=mode, chunk_size=16, initial_state=s0,
                            return_final_state=True)
    assert_close(got, bthd(want), name=f"gated delta_rule {mode} vs fla")
    assert_close(state, want_state, name=f"gated delta_rule {mode} final state vs fla")


# ----------------------------------------------------------------------------- performer-pytorch
pp = pytest.importorskip("performer_pytorch.performer_pytorch")


@pytest.mark.parametrize("orthogonal", [False, True])
def test_performer_vs_performer_pytorch_M8_7(orthogonal, gen):
    """Non-causal FAVOR+ with the same W: performer-pytorch's ``softmax_kernel`` (data scaled by d^-1/4,
    eps=0) and ``linear_attention`` ≡ `performer_attention` (its own stabilisers differ but cancel)."""
    B, H, T, d, m = 2, 2, 24, 16, 64
    q, k, v = (torch.randn(B, H, T, d, generator=gen) * 0.7 for _ in range(3))
    W = orthogonal_gaussian(m, d, seed=2) if orthogonal else torch.randn(m, d, generator=gen)
    fq = pp.softmax_kernel(q, projection_matrix=W, is_query=True, eps=0.0)
    fk = pp.softmax_kernel(k, projection_matrix=W, is_query=False, eps=0.0)
    want = pp.linear_attention(fq, fk, v)
    got = performer_attention(q, k, v, m, W=W)
    assert_close(got, want, name="performer_attention vs performer-pytorch")
