"""Chapter 3 review: FLOPs with projections against a recurrent layer (M3.7), measured memory traffic and the
machine balance behind the roofline (M3.8), and hierarchical softmax in its own module (M3.17)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import xfam_lib.transformer as transformer
from xfam_lib import hsoftmax
from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.bench import (attention_flops, attention_io_bytes, measure_bandwidth, measure_matmul_flops,
                            memory_traffic, rnn_flops)


def _counted(fn):
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def _lstm_loop(x, w_x, w_h):
    d = x.shape[-1]
    h = c = torch.zeros(d)
    for t in range(len(x)):
        i, f, g, o = (x[t] @ w_x + h @ w_h).chunk(4)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)


@pytest.mark.parametrize("gates", [1, 3, 4])
def test_rnn_flops_with_gates_match_the_flop_counter_M3_7(gates, gen):
    n, d = 9, 12
    x = torch.randn(n, d, generator=gen)
    w_x, w_h = torch.randn(2, d, gates * d, generator=gen)

    def loop():
        h = torch.zeros(gates * d)
        for t in range(n):
            h = torch.tanh(x[t] @ w_x + h[:d] @ w_h)

    assert _counted(loop) == rnn_flops(n, d, gates=gates)


def test_attention_with_projections_meets_an_lstm_at_twice_the_width_M3_7(gen):
    """Counted FLOPs (not the formulas): self-attention with its four projections is cheaper than an LSTM layer
    below n = 2d, equal at 2d and dearer above; it is dearer than a plain RNN layer at every length."""
    d = 8
    w_q, w_k, w_v, w_o, w_rnn_x, w_rnn_h = torch.randn(6, d, d, generator=gen)
    w_x, w_h = torch.randn(2, d, 4 * d, generator=gen)

    def attention(x):
        out = torch.softmax((x @ w_q) @ (x @ w_k).T / math.sqrt(d), -1) @ (x @ w_v)
        return out @ w_o

    def rnn(x):
        h = torch.zeros(d)
        for t in range(len(x)):
            h = torch.tanh(x[t] @ w_rnn_x + h @ w_rnn_h)

    signs = []
    for n in (2 * d - 1, 2 * d, 2 * d + 1):
        x = torch.randn(n, d, generator=gen)
        diff = _counted(lambda: attention(x)) - _counted(lambda: _lstm_loop(x, w_x, w_h))
        signs.append((diff > 0) - (diff < 0))
        assert _counted(lambda: attention(x)) == attention_flops(n, d, projections=True)
    assert signs == [-1, 0, 1]
    for n in (1, 2, d, 4 * d):
        x = torch.randn(n, d, generator=gen)
        assert _counted(lambda: attention(x)) > _counted(lambda: rnn(x))


def test_rnn_flops_bad_gates_M3_7():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="gates"):
            rnn_flops(4, 4, gates=bad)


# ----------------------------------------------------------------------------- memory traffic (M3.8)
def test_memory_traffic_counts_reads_and_writes_per_op(gen):
    a, b = torch.randn(2, 16, 16, generator=gen)
    total, per_op = memory_traffic(lambda: a @ b, detail=True)
    assert total == 3 * a.nbytes and list(per_op) == ["aten.mm.default"]
    assert memory_traffic(lambda: a.T) == 0                                 # a view moves nothing
    assert memory_traffic(lambda: a[:, :4].reshape(-1)) == 2 * a[:, :4].nbytes   # a copying reshape reads and writes
    c = torch.zeros(16)
    assert memory_traffic(lambda: c.add_(1.0)) == 2 * c.nbytes             # in place: read and write
    assert memory_traffic(lambda: torch.empty(1000)) == 0
    out = torch.empty(16, 16)
    assert memory_traffic(lambda: torch.mul(a, b, out=out)) == 3 * a.nbytes  # out= is written, not read


@pytest.mark.parametrize("length", [128, 384])
def test_explicit_attention_traffic_lies_between_the_model_and_one_extra_pass_M3_8(length, gen):
    """`attention_io_bytes` is the least an unfused kernel sequence moves (S and P written and read once);
    the library's explicit path adds one elementwise pass over S for the scale: exactly 6 n^2 + 4 n d numbers.
    The fused path moves Q, K, V and the output, plus its NaN-query guard, whose bytes are counted exactly."""
    d = 32
    q, k, v = (torch.randn(1, 1, length, d, generator=gen) for _ in range(3))
    with torch.no_grad():
        naive = memory_traffic(lambda: scaled_dot_product_attention(q, k, v, return_weights=True))
        fused = memory_traffic(lambda: scaled_dot_product_attention(q, k, v))
    model = attention_io_bytes(length, d, torch.float32)
    assert model <= naive <= 1.5 * model
    assert naive == (6 * length * length + 4 * length * d) * 4
    lower = attention_io_bytes(length, d, torch.float32, materialize=False)
    # the NaN-query guard around the kernel, in unfused passes: isnan(q) reads 4 and writes 1 byte
    # per element, any() reads 1, masked_fill reads and writes the output (8), plus two bytes per row
    guard = 14 * length * d + 2 * length
    assert lower + guard <= fused <= lower + guard + 4 * 4 * length    # plus a few saved numbers per row


def test_measured_machine_balance_is_positive_and_checked():
    assert measure_matmul_flops("cpu", n=64, repeats=2) > 0
    assert measure_bandwidth("cpu", nbytes=2 ** 16, repeats=2) > 0
    with pytest.raises(ValueError, match="n"):
        measure_matmul_flops("cpu", n=0)
    with pytest.raises(ValueError, match="nbytes"):
        measure_bandwidth("cpu", nbytes=-4)


# ----------------------------------------------------------------------------- hierarchical softmax module (M3.17)
def test_hierarchical_softmax_lives_in_its_own_module_M3_17(gen):
    assert set(hsoftmax.__all__) == {"HuffmanTree", "huffman_tree", "hsoftmax_prob_loop", "hsoftmax_logprob"}
    assert not any(hasattr(transformer, name) for name in hsoftmax.__all__)
    tree = hsoftmax.huffman_tree([5, 1, 1, 2, 8])
    h = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    nodes = torch.randn(tree.n_internal, 6, generator=gen, dtype=torch.float64)
    logp = hsoftmax.hsoftmax_logprob(h, tree, nodes)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(F.log_softmax(logp, -1), logp)           # already normalised
