"""Chapter 9, the Mamba-2 block (METHODS M9.11) against Hugging Face ``transformers``' ``Mamba2Mixer``
(its pure-PyTorch path, test-only pin in requirements.txt) loaded with the same weights."""
import pytest
import torch

from xfam_lib.ssm import Mamba2Block, ssd_chunked
from xfam_lib.testing import assert_close, check_causal, grads, randn

transformers = pytest.importorskip("transformers", reason="transformers is pinned in requirements.txt")


def hf_mamba2_mixer(block):
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    cfg = transformers.Mamba2Config(
        hidden_size=block.d_model, state_size=block.d_state, num_heads=block.heads, head_dim=block.head_dim,
        expand=block.d_inner // block.d_model, n_groups=block.n_groups, conv_kernel=block.conv1d.kernel_size[0],
        chunk_size=block.chunk_size, use_bias=False, use_conv_bias=True, layer_norm_epsilon=block.norm.eps,
        num_hidden_layers=1)
    mixer = Mamba2Mixer(cfg, 0)
    mixer.load_state_dict(block.state_dict())
    return mixer.eval()


def moved_off_init(block, gen):
    """A, D, dt_bias and the norm's weight away from their initial values, so that each one matters."""
    with torch.no_grad():
        for p in (block.A_log, block.D, block.dt_bias, block.norm.weight):
            p.add_(0.3 * randn(*p.shape, gen=gen, dtype=p.dtype))
    return block


@pytest.mark.parametrize("n_groups,chunk", [(1, 8), (2, 8), (4, 64)])
def test_mamba2_block_equals_hugging_face_mamba2_mixer_M9_11(n_groups, chunk, gen):
    """M9.11 oracle: `Mamba2Block` with Hugging Face's `Mamba2Mixer` (eval, torch path) holding the same state
    dict gives the same outputs and input gradients in fp32 (default fp32 tolerance), with groups of B, C
    shared by several heads, a ragged last chunk and a chunk longer than L; same parameter count."""
    torch.manual_seed(0)
    block = moved_off_init(Mamba2Block(16, d_state=8, head_dim=4, n_groups=n_groups, chunk_size=chunk), gen)
    mixer = hf_mamba2_mixer(block)
    x = randn(2, 37, 16, gen=gen, dtype=torch.float32, requires_grad=True)
    y, y_hf = block(x), mixer(x)
    assert_close(y, y_hf)
    cot = randn(2, 37, 16, gen=gen, dtype=torch.float32)
    assert_close(grads(y, [x], cot)[0], grads(y_hf, [x], cot)[0])
    assert sum(p.numel() for p in block.parameters()) == sum(p.numel() for p in mixer.parameters())


def test_mamba2_block_is_causal_and_its_ssm_is_ssd_chunked_M9_11(gen):
    """M9.11: the block is causal by perturbation (fp64, a perturbation inside a chunk), and with the
    projections, the convolution and the norm taken out, what it computes per head is `ssd_chunked` of
    (delta x, delta A) plus D x: the block's SSM is SSD."""
    torch.manual_seed(0)
    block = moved_off_init(Mamba2Block(8, d_state=4, head_dim=4, n_groups=2, chunk_size=6), gen).double()
    x = randn(2, 20, 8, gen=gen)
    check_causal(block, x, position=9, dim=1, atol=1e-12)
    with torch.no_grad():
        e, g, n = block.d_inner, block.n_groups, block.d_state
        z, xbc, dt = block.in_proj(x).split([e, e + 2 * g * n, block.heads], dim=-1)
        xbc = torch.nn.functional.silu(block.conv1d(xbc.transpose(1, 2))[..., :20]).transpose(1, 2)
        u, B, C = xbc.split([e, g * n, g * n], dim=-1)
        u = u.reshape(2, 20, block.heads, block.head_dim)
        delta = torch.nn.functional.softplus(dt + block.dt_bias)
        A = -torch.exp(block.A_log)
        # the SSM as a step loop over the (P, N) state of each head, independent of ssd_chunked
        Bh = B.reshape(2, 20, g, n).repeat_interleave(block.heads // g, 2)
        Ch = C.reshape(2, 20, g, n).repeat_interleave(block.heads // g, 2)
        h = torch.zeros(2, block.heads, block.head_dim, n, dtype=torch.float64)
        ys = []
        for t in range(20):
            h = torch.exp(delta[:, t] * A)[..., None, None] * h \
                + (delta[:, t, :, None] * u[:, t])[..., None] * Bh[:, t, :, None, :]
            ys.append((h * Ch[:, t, :, None, :]).sum(-1) + block.D[:, None] * u[:, t])
        y_loop = torch.stack(ys, 1).reshape(2, 20, e)
        assert_close(block(x), block.out_proj(block.norm(y_loop, z)))
        y_ssd = ssd_chunked(u * delta[..., None], delta * A, B.reshape(2, 20, g, n), C.reshape(2, 20, g, n), 6)
        assert_close(y_ssd + block.D[:, None] * u, y_loop.reshape(2, 20, block.heads, block.head_dim))


def test_mamba2_block_bad_inputs_M9_11(gen):
    """M9.11: a head size that does not divide the inner width, groups that do not divide the heads, and an
    input of the wrong width are refused with the sizes seen."""
    with pytest.raises(ValueError, match="head_dim must divide expand"):
        Mamba2Block(10, head_dim=3)
    with pytest.raises(ValueError, match="n_groups the number of heads"):
        Mamba2Block(8, head_dim=4, n_groups=3)
    with pytest.raises(ValueError, match=r"Mamba2Block: x must be \(batch, L, d_model\)"):
        Mamba2Block(8, head_dim=4)(randn(1, 5, 6, gen=gen, dtype=torch.float32))
