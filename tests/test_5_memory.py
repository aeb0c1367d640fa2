"""Chapter 5, long-context memory (METHODS M5.x): Transformer-XL recurrence, compressive memory,
kNN memories and the Titans-style neural memory.

Each mechanism is checked against an independent form: one forward over the concatenated context,
a Python loop or list simulation, brute-force distances, the linear-attention state of Chapter 8,
or lucidrains' x-transformers / compressive-transformer-pytorch / memorizing-transformers-pytorch
(test-only pins). Equalities run in fp64, so their tolerances are fp64 round-off, except against an
oracle that computes in fp32 (x-transformers' softmax, faiss).
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.linear import linear_attention, retention
from xfam_lib.memory import (
    CompressiveMemory,
    ConvCompressor,
    FIFOKVMemory,
    MemorizingAttention,
    NeuralMemory,
    SpalmGate,
    TransformerXL,
    attention_reconstruction_loss,
    compress_most_used,
    compress_pool,
    exact_knn,
    knn_augmented_attention,
    knn_distribution,
    knn_lm_interpolate,
    temporal_range,
    update_memories,
    update_xl_memory,
    xl_attention,
)
from xfam_lib.positional import XLRelativeAttention
from xfam_lib.testing import assert_close, randn

F64 = torch.float64
HYP = settings(max_examples=20, deadline=None, derandomize=True)


def xl_layer(d=16, heads=4, kv_heads=None, seed=0):
    """An fp64 XLRelativeAttention with non-zero global biases u, v (they start at zero)."""
    torch.manual_seed(seed)
    attn = XLRelativeAttention(d, heads, kv_heads).double()
    with torch.no_grad():
        attn.u.normal_()
        attn.v.normal_()
    return attn


# ============================================================================= M5.1, M5.2 Transformer-XL
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_xl_attention_equals_full_attention_over_memory_and_segment_M5_1(gen, kv_heads):
    """One layer: attending from the segment over [mem; h] ≡ XLRelativeAttention over the concatenation,
    last L rows, in outputs and in the gradients of h and of every weight; the memory gets none."""
    attn = xl_layer(kv_heads=kv_heads)
    mem, h = randn(2, 7, 16, gen=gen, requires_grad=True), randn(2, 5, 16, gen=gen, requires_grad=True)
    w = randn(2, 5, 16, gen=gen)
    ours = xl_attention(h, mem, attn)
    (ours * w).sum().backward()
    grads = {"h": h.grad.clone(), **{n: p.grad.clone() for n, p in attn.named_parameters()}}
    assert mem.grad is None                                         # stop-gradient memory
    attn.zero_grad()
    h2 = h.detach().clone().requires_grad_(True)
    full = attn(torch.cat([mem.detach(), h2], dim=1))[:, -5:]
    (full * w).sum().backward()
    assert_close(ours, full, name="segment output")
    assert_close(grads["h"], h2.grad, name="grad h")
    for n, p in attn.named_parameters():
        assert_close(grads[n], p.grad, name=f"grad {n}")


def test_xl_mask_at_segment_boundaries_M5_1(gen):
    """The L x (m+L) mask is bottom-right causal: the first query of a segment sees every memory slot and
    itself but not its successor; the last query sees everything. Checked on the weights and by perturbation."""
    attn = xl_layer()
    m, L = 6, 4
    mem, h = randn(1, m, 16, gen=gen), randn(1, L, 16, gen=gen)
    out, weights = xl_attention(h, mem, attn, return_weights=True)
    assert weights.shape == (1, 4, L, m + L)
    visible = weights[0] > 0                                        # (H, L, m + L)
    assert visible[:, 0, :m + 1].all()                              # oldest memory .. the query itself
    assert not visible[:, 0, m + 1:].any()                          # nothing later in the segment
    for i in range(L):
        assert visible[:, i, :m + i + 1].all() and not visible[:, i, m + i + 1:].any()
    assert_close(weights.sum(-1), torch.ones(1, 4, L, dtype=F64))
    # perturbations: the oldest memory slot moves query 0; a later token of the segment does not
    mem2 = mem.clone()
    mem2[:, 0] += 1.0
    assert (xl_attention(h, mem2, attn)[:, 0] - out[:, 0]).abs().max() > 1e-6
    h2 = h.clone()
    h2[:, 1:] += 1.0
    assert torch.equal(xl_attention(h2, mem, attn)[:, 0], out[:, 0])


def test_update_xl_memory_keeps_the_last_mem_len_rows_detached_M5_1(gen):
    mem, h = randn(2, 5, 3, gen=gen, requires_grad=True), randn(2, 4, 3, gen=gen, requires_grad=True)
    new = update_xl_memory(mem, h, 6)
    assert torch.equal(new, torch.cat([mem, h], 1)[:, -6:].detach()) and not new.requires_grad
    assert torch.equal(update_xl_memory(None, h, 10), h.detach())            # shorter than mem_len: all of it
    assert update_xl_memory(mem, h, 0).shape == (2, 0, 3)


@given(n_seg=st.integers(1, 4), seg=st.integers(1, 5), n_layers=st.integers(1, 2), seed=st.integers(0, 3))
@settings(max_examples=6, deadline=None, derandomize=True)
def test_transformer_xl_segments_equal_one_forward_when_memory_covers_M5_1(n_seg, seg, n_layers, seed):
    """Segment-level recurrence with a memory covering the whole past ≡ one causal forward over the
    concatenated context, for any depth (memories hold each layer's *input*, ERRATA E5.1)."""
    torch.manual_seed(seed)
    model = TransformerXL(vocab=11, d_model=16, n_layers=n_layers, n_heads=2, d_ff=24, mem_len=n_seg * seg).double()
    for layer in model.layers:
        torch.nn.init.normal_(layer.attn.u)
        torch.nn.init.normal_(layer.attn.v)
    ids = torch.randint(0, 11, (2, n_seg * seg), generator=torch.Generator().manual_seed(seed))
    full, _ = model(ids)
    mems, outs = None, []
    for s in range(n_seg):
        out, mems = model(ids[:, s * seg:(s + 1) * seg], mems)
        outs.append(out)
    assert_close(torch.cat(outs, 1), full)
    h0 = model.embed(ids)
    assert torch.equal(mems[0], h0[:, -mems[0].shape[1]:])           # layer 0 remembers its input, the embeddings


def test_short_memory_changes_later_segments_and_temporal_range_is_N_times_m_M5_1_M5_2():
    """With mem_len = L = m, the first token of a segment depends on the token N*m positions back
    (`temporal_range`) and not on the one before it, measured by perturbing tokens in a stream."""
    torch.manual_seed(0)
    n_layers, m = 2, 3
    model = TransformerXL(vocab=13, d_model=16, n_layers=n_layers, n_heads=2, d_ff=24, mem_len=m).double()
    ids = torch.randint(0, 13, (1, 6 * m), generator=torch.Generator().manual_seed(0))

    def stream(tokens):
        mems, outs = None, []
        for s in range(tokens.shape[1] // m):
            out, mems = model(tokens[:, s * m:(s + 1) * m], mems)
            outs.append(out)
        return torch.cat(outs, 1)

    base = stream(ids)
    target = 5 * m                                                   # first token of the last segment
    reach = temporal_range(m, n_layers)

    def moved(pos):
        ids2 = ids.clone()
        ids2[0, pos] = (ids2[0, pos] + 1) % 13
        return (stream(ids2)[0, target] - base[0, target]).abs().max().item()

    assert moved(target - reach) > 1e-8
    assert moved(target - reach - 1) == 0.0
    full, _ = model(ids)                                             # full context: differs once memory is short
    assert_close(full[:, :m], base[:, :m])
    assert (full[:, -m:] - base[:, -m:]).abs().max() > 1e-6
    assert temporal_range(4, 3, cmem_len=2, ratio=3) == 3 * (4 + 3 * 2)


def test_xl_attention_matches_x_transformers_memory_attention_M5_1(gen):
    """Independent oracle: with the position terms switched off (W_kR = 0, u = v = 0), our XL layer is
    content attention over [mem; h] with the bottom-right causal mask, as x-transformers' `Attention(mem=)`.
    In fp32: x-transformers takes its softmax in fp32 whatever the input dtype."""
    xt = pytest.importorskip("x_transformers.x_transformers", reason="x-transformers is pinned in requirements.txt")
    torch.manual_seed(0)
    theirs = xt.Attention(16, heads=4, dim_head=4, causal=True).eval()
    attn = XLRelativeAttention(16, 4)
    with torch.no_grad():
        for ours_p, their_p in ((attn.q_proj, theirs.to_q), (attn.k_proj, theirs.to_k), (attn.v_proj, theirs.to_v),
                                (attn.out_proj, theirs.to_out)):
            ours_p.weight.copy_(their_p.weight)
        attn.r_proj.weight.zero_()
    mem, h = randn(2, 6, 16, gen=gen, dtype=torch.float32), randn(2, 5, 16, gen=gen, dtype=torch.float32)
    assert_close(xl_attention(h, mem, attn), theirs(h, mem=mem))


# ============================================================================= M5.3, M5.4 Compressive Transformer
def test_compress_pool_and_conv_against_loops_M5_3(gen):
    """⌊n/c⌋ slots from the newest whole groups (ERRATA E5.3); mean/max/conv equal explicit loops."""
    x = randn(2, 11, 4, gen=gen)
    c = 3                                                            # 11 = 2 (dropped, oldest) + 3 groups
    mean, mx = compress_pool(x, c, "mean"), compress_pool(x, c, "max")
    assert mean.shape == (2, 11 // c, 4)
    for j in range(3):
        group = x[:, 2 + j * c:2 + (j + 1) * c]
        assert_close(mean[:, j], group.mean(1))
        assert_close(mx[:, j], group.max(1).values)
    assert torch.equal(compress_pool(x, 1), x)
    conv = ConvCompressor(4, c).double()
    out = conv(x)
    W, b = conv.conv.weight, conv.conv.bias                         # (d_out, d_in, c), (d_out,)
    for j in range(3):
        expected = b + sum(x[:, 2 + j * c + r] @ W[:, :, r].T for r in range(c))
        assert_close(out[:, j], expected)


def test_compress_most_used_keeps_most_attended_in_time_order_M5_3(gen):
    x = randn(1, 8, 2, gen=gen)
    usage = torch.tensor([[0.1, 0.9, 0.2, 0.8, 0.0, 0.3, 0.7, 0.05]], dtype=F64)
    kept = compress_most_used(x, usage, 2)                           # 4 slots: rows 1, 3, 5, 6
    assert torch.equal(kept, x[:, [1, 3, 5, 6]])


@given(m=st.integers(0, 6), L=st.integers(1, 6), mem_len=st.integers(0, 7), cmem_len=st.integers(0, 5),
       ratio=st.integers(1, 3), steps=st.integers(1, 4))
@HYP
def test_update_memories_is_a_two_band_fifo_M5_3(m, L, mem_len, cmem_len, ratio, steps):
    """Against a list simulation: mem keeps the newest mem_len rows; evicted rows are mean-pooled in
    whole groups (oldest remainder dropped) and appended to cmem, which keeps its newest cmem_len slots."""
    gen = torch.Generator().manual_seed(m * 100 + L)
    mem, cmem = (randn(1, m, 2, gen=gen) if m else None), None
    rows = [] if mem is None else list(mem[0])
    crows = []
    for _ in range(steps):
        h = randn(1, L, 2, gen=gen)
        mem, cmem, old = update_memories(mem, cmem, h, mem_len, cmem_len, lambda t: compress_pool(t, ratio))
        rows += list(h[0])
        n_old = max(0, len(rows) - mem_len)
        evicted, rows = rows[:n_old], rows[n_old:]
        if evicted and cmem_len:
            usable = evicted[len(evicted) % ratio:]
            crows += [torch.stack(usable[i:i + ratio]).mean(0) for i in range(0, len(usable), ratio)]
            crows = crows[max(0, len(crows) - cmem_len):]
        assert mem.shape[1] == len(rows) and cmem.shape[1] == len(crows) and old.shape[1] == len(evicted)
        if rows:
            assert torch.equal(mem[0], torch.stack(rows))
        if crows:
            assert_close(cmem[0], torch.stack(crows))


def test_compressive_with_rate_1_and_identity_reduces_to_xl_M5_3(gen):
    """Ratio 1 with the identity compressor: attending over [cmem; mem] ≡ XL with mem_len + cmem_len,
    segment after segment; and the attention-reconstruction loss is 0 (M5.4)."""
    attn = xl_layer()
    memory = CompressiveMemory(mem_len=5, cmem_len=4, ratio=1, compressor=lambda t: t)
    mem = cmem = xl_mem = None
    for _ in range(5):
        h = randn(2, 3, 16, gen=gen)
        out_c = xl_attention(h, CompressiveMemory.context(mem, cmem), attn)
        out_xl = xl_attention(h, xl_mem, attn)
        assert_close(out_c, out_xl)
        mem, cmem, old = memory.update(mem, cmem, h)
        xl_mem = update_xl_memory(xl_mem, h, 9)
        assert torch.equal(CompressiveMemory.context(mem, cmem), xl_mem)
        if old.shape[1]:
            assert attention_reconstruction_loss(h, old, memory.compress(old), attn).item() == 0.0


def test_attention_reconstruction_loss_trains_only_the_compressor_M5_4(gen):
    """L_ar > 0 for a lossy compressor; its gradient reaches the conv compressor but not the layer's
    weights or h (stop-gradient inputs)."""
    attn = xl_layer()
    memory = CompressiveMemory(4, 4, 2, "conv", d_model=16).double()
    h = randn(2, 3, 16, gen=gen, requires_grad=True)
    old = randn(2, 4, 16, gen=gen)
    loss = attention_reconstruction_loss(h, old, memory.compress(old), attn)
    loss.backward()
    assert loss.item() > 0
    assert memory.conv.conv.weight.grad.abs().sum() > 0
    assert h.grad is None and all(p.grad is None for p in attn.parameters())


def test_compressive_matches_lucidrains_compressive_transformer_M5_3_M5_4(gen):
    """Independent oracle (compressive-transformer-pytorch): attention over [cmem; mem; x], the new mem,
    the new cmem from a strided conv, and the attention-reconstruction loss, with copied weights.
    Their loss attends over the whole memory before the update, so the segment is as long as the
    memory (L = m): then all of it is evicted and the two definitions coincide."""
    ct = pytest.importorskip("compressive_transformer_pytorch.compressive_transformer_pytorch",
                             reason="compressive-transformer-pytorch is pinned in requirements.txt")
    torch.manual_seed(0)
    d, L, m, cm, c = 16, 8, 8, 6, 2
    theirs = ct.SelfAttention(d, seq_len=L, mem_len=m, cmem_len=cm, cmem_ratio=c, heads=4).double()
    attn = XLRelativeAttention(d, 4).double()
    memory = CompressiveMemory(m, cm, c, "conv", d_model=d).double()
    with torch.no_grad():
        attn.q_proj.weight.copy_(theirs.to_q.weight)
        k_w, v_w = theirs.to_kv.weight.chunk(2, dim=0)
        attn.k_proj.weight.copy_(k_w)
        attn.v_proj.weight.copy_(v_w)
        attn.out_proj.weight.copy_(theirs.to_out.weight)
        theirs.to_out.bias.zero_()
        attn.r_proj.weight.zero_()
        memory.conv.conv.load_state_dict(theirs.compress_mem_fn.conv.state_dict())
    x, mem, cmem = randn(2, L, d, gen=gen), randn(2, m, d, gen=gen), randn(2, 3, d, gen=gen)
    theirs.eval()
    out, (new_mem, new_cmem), _ = theirs(x, memories=(mem, cmem))
    assert_close(xl_attention(x, torch.cat([cmem, mem], 1), attn), out)
    ours_mem, ours_cmem, old = memory.update(mem, cmem, x)
    assert_close(ours_mem, new_mem)
    assert_close(ours_cmem, new_cmem)
    theirs.train()                                                   # the aux loss is computed in training mode
    _, _, aux = theirs(x, memories=(mem, cmem))
    assert_close(attention_reconstruction_loss(x, old, memory.compress(old), attn), aux.reshape(()))


# ============================================================================= M5.5 kNN search and kNN-LM
def brute_force(q, keys, k, metric):
    if metric == "l2":
        scores = ((q.unsqueeze(-2) - keys.unsqueeze(-3)) ** 2).sum(-1)
        return scores.topk(k, dim=-1, largest=False)
    return (q @ keys.transpose(-2, -1)).topk(k, dim=-1)


@given(n=st.integers(1, 300), k=st.integers(1, 40), block=st.integers(1, 130), metric=st.sampled_from(["l2", "ip"]),
       batched=st.booleans())
@HYP
def test_exact_knn_full_and_streaming_equal_brute_force_M5_5(n, k, block, metric, batched):
    """Both paths ≡ brute-force distances then top-k (squared L2 ascending / inner product descending),
    for ragged blocks, blocks smaller than k, and per-batch or shared keys."""
    k = min(k, n)
    gen = torch.Generator().manual_seed(n * 7 + k)
    q = randn(2, 5, 6, gen=gen)
    keys = randn(2, n, 6, gen=gen) if batched else randn(n, 6, gen=gen)
    expected_s, expected_i = brute_force(q, keys, k, metric)
    for block_size in (None, block):
        scores, idx = exact_knn(q, keys, k, metric=metric, block_size=block_size)
        assert torch.equal(idx, expected_i), block_size
        assert_close(scores, expected_s)


def test_exact_knn_streaming_same_neighbours_as_full_topk_fp32(gen):
    q, keys = randn(64, 32, gen=gen, dtype=torch.float32), randn(20000, 32, gen=gen, dtype=torch.float32)
    full_s, full_i = exact_knn(q, keys, 16)
    s, i = exact_knn(q, keys, 16, block_size=4096)
    assert torch.equal(i, full_i)
    assert_close(s, full_s)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_exact_knn_half_inputs_computed_in_fp32(gen, dtype):
    q, keys = randn(4, 8, gen=gen).to(dtype), randn(50, 8, gen=gen).to(dtype)
    s, i = exact_knn(q, keys, 5, block_size=16)
    ref_s, ref_i = exact_knn(q.float(), keys.float(), 5)
    assert s.dtype == dtype and torch.equal(i, ref_i)
    assert_close(s, ref_s.to(dtype))


def test_knn_distribution_weights_near_keys_and_aggregates_tokens_M5_5(gen):
    """p(w) = sum over neighbours with token w of softmax(-d/T): rows sum to 1, duplicates add up, and
    the nearest key weighs most (the minus of ERRATA E5.5)."""
    keys = randn(30, 4, gen=gen)
    vals = torch.randint(0, 5, (30,), generator=gen)
    q = randn(3, 4, gen=gen)
    p = knn_distribution(q, keys, vals, k=6, vocab=5, temp=2.0)
    assert_close(p.sum(-1), torch.ones(3, dtype=F64))
    for row in range(3):
        d = ((keys - q[row]) ** 2).sum(-1)
        near = d.argsort()[:6]
        w = torch.softmax(-d[near] / 2.0, 0)
        expected = torch.zeros(5, dtype=F64)
        for j, idx in enumerate(near):
            expected[vals[idx]] += w[j]
        assert_close(p[row], expected)
    keys2 = torch.tensor([[0.0], [1.0], [3.0]], dtype=F64)              # two near keys share token 2
    p2 = knn_distribution(torch.tensor([[0.0]], dtype=F64), keys2, torch.tensor([2, 2, 0]), k=3, vocab=3)
    w = torch.softmax(-torch.tensor([0.0, 1.0, 9.0], dtype=F64), 0)
    assert_close(p2[0], torch.stack([w[2], torch.zeros((), dtype=F64), w[0] + w[1]]))
    assert p2[0, 2] > p2[0, 0]


def test_knn_lm_datastore_of_the_same_text_lowers_loss_M5_5(gen):
    """kNN-LM in direction (Khandelwal et al. 2020): a datastore built from the text being predicted
    lowers its loss under the interpolation; one from unrelated text helps much less."""
    vocab, d = 20, 8
    emb = randn(vocab, d, gen=gen)
    text = torch.randint(0, vocab, (200,), generator=gen)
    other = torch.randint(0, vocab, (200,), generator=gen)
    ctx = lambda t: emb[t[:-1]] + 0.5 * emb[torch.roll(t, 1)[:-1]]     # a context vector of the last 2 tokens
    p_lm = torch.full((199, vocab), 1.0 / vocab, dtype=F64)            # an uninformed LM
    nll = lambda p: -torch.log(p[torch.arange(199), text[1:]]).mean().item()
    p_same = knn_distribution(ctx(text), ctx(text), text[1:], k=4, vocab=vocab)
    p_other = knn_distribution(ctx(text), ctx(other), other[1:], k=4, vocab=vocab)
    assert torch.equal(knn_lm_interpolate(p_lm, p_same, 0.0), p_lm)
    same, shifted = nll(knn_lm_interpolate(p_lm, p_same, 0.5)), nll(knn_lm_interpolate(p_lm, p_other, 0.5))
    assert same < nll(p_lm) - 0.3 and same < shifted


# ============================================================================= M5.7 SPALM
def test_spalm_gate_extremes_and_gradients_M5_7(gen):
    """g → 1 returns h, g → 0 returns the memory summary softmax(mem h) mem; gradients reach the
    embedding W and w_g but not the datastore keys used for retrieval."""
    d, vocab = 6, 12
    W = randn(vocab, d, gen=gen, requires_grad=True)
    keys = randn(40, d, gen=gen, requires_grad=True)
    vals = torch.randint(0, vocab, (40,), generator=gen)
    h = randn(3, d, gen=gen)
    _, idx = exact_knn(h, keys, 5)
    mem = W[vals[idx]]                                               # (3, 5, d): neighbours' next-token embeddings
    gate = SpalmGate(d).double()
    summary = torch.stack([torch.softmax(mem[i] @ h[i], 0) @ mem[i] for i in range(3)])
    with torch.no_grad():
        gate.w_g.weight.zero_()
        gate.w_g.bias.fill_(1e3)
    assert_close(gate(h, mem), h)
    with torch.no_grad():
        gate.w_g.bias.fill_(-1e3)
    assert_close(gate(h, mem), summary)
    with torch.no_grad():
        gate.w_g.bias.zero_()
        gate.w_g.weight.normal_()
    g = gate.gate(h)
    z = gate(h, mem)
    assert_close(z, (1 - g) * summary + g * h)
    F.cross_entropy(z @ W.T, torch.tensor([1, 2, 3])).backward()
    assert W.grad.abs().sum() > 0 and gate.w_g.weight.grad.abs().sum() > 0
    assert keys.grad is None


# ============================================================================= M5.8, M5.9 Memorizing Transformer
def test_knn_attention_with_topk_equal_to_memory_is_full_attention_M5_8(gen):
    """topk = M ≡ full attention over the memory; gate extremes give pure kNN / pure local attention;
    a smaller topk ≡ attention over the explicitly chosen largest-logit memories."""
    q, k, v = (randn(2, 3, 5, 4, gen=gen) for _ in range(3))
    mem_k, mem_v = randn(2, 3, 9, 4, gen=gen), randn(2, 3, 9, 4, gen=gen)
    inf = torch.full((3,), math.inf, dtype=F64)
    local = scaled_dot_product_attention(q, k, v, causal=True)
    assert_close(knn_augmented_attention(q, k, v, mem_k, mem_v, 9, inf), scaled_dot_product_attention(q, mem_k, mem_v))
    assert_close(knn_augmented_attention(q, k, v, mem_k, mem_v, 9, -inf), local)
    half = knn_augmented_attention(q, k, v, mem_k, mem_v, 9, torch.zeros(3, dtype=F64))
    assert_close(half, 0.5 * local + 0.5 * scaled_dot_product_attention(q, mem_k, mem_v))
    got = knn_augmented_attention(q, k, v, mem_k, mem_v, 3, inf)
    logits = q @ mem_k.transpose(-2, -1)
    top = logits.topk(3, dim=-1).indices
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, top, True)
    assert_close(got, scaled_dot_product_attention(q, mem_k, mem_v, keep))


def test_knn_attention_gradients_reach_queries_not_memory_M5_8_M5_9(gen):
    q = randn(1, 2, 4, 4, gen=gen, requires_grad=True)
    k, v = randn(1, 2, 4, 4, gen=gen), randn(1, 2, 4, 4, gen=gen)
    mem_k, mem_v = randn(1, 2, 6, 4, gen=gen, requires_grad=True), randn(1, 2, 6, 4, gen=gen, requires_grad=True)
    knn_augmented_attention(q, k, v, mem_k, mem_v, 2, torch.zeros(2, dtype=F64)).sum().backward()
    assert q.grad.abs().sum() > 0 and mem_k.grad is None and mem_v.grad is None


def test_fifo_memory_evicts_oldest_and_stores_detached_M5_8_M5_9(gen):
    memory = FIFOKVMemory(5)
    chunks = [randn(1, 3, 2, gen=gen, requires_grad=True) for _ in range(3)]
    for c in chunks:
        memory.add(c, 2 * c)
    assert len(memory) == 5 and not memory.keys.requires_grad
    assert torch.equal(memory.keys, torch.cat(chunks, 1)[:, -5:].detach())
    assert torch.equal(memory.values, 2 * memory.keys)
    with pytest.raises(ValueError, match="reset"):
        memory.add(randn(2, 1, 2, gen=gen), randn(2, 1, 2, gen=gen))


def test_memorizing_attention_normalises_keys_and_reads_its_memory_M5_8(gen):
    """Stored keys are unit vectors (queries and keys are normalised, ERRATA E5.8); the second segment
    reads the first through the kNN path, so its output differs from a layer with an empty memory."""
    torch.manual_seed(0)
    layer = MemorizingAttention(16, 4, capacity=8, topk=3).double()
    x1, x2 = randn(2, 5, 16, gen=gen), randn(2, 5, 16, gen=gen)
    layer(x1)
    assert len(layer.memory) == 5
    assert_close(layer.memory.keys.norm(dim=-1), torch.ones(2, 4, 5, dtype=F64))
    with_memory = layer(x2)
    assert len(layer.memory) == 8                                    # capacity reached: the oldest 2 evicted
    layer.memory.reset()
    without = layer(x2)
    assert (with_memory - without).abs().max() > 1e-6


def test_memorizing_gate_is_learned_per_head_M5_8(gen):
    """The per-head gate is a trained parameter: d out / d b_h = g_h (1 - g_h) (A_mem - A_local) on head h
    only; the first segment (empty memory) gives it no gradient, the second does."""
    q, k, v = (randn(2, 3, 5, 4, gen=gen) for _ in range(3))
    mem_k, mem_v = randn(2, 3, 7, 4, gen=gen), randn(2, 3, 7, 4, gen=gen)
    inf = torch.full((3,), math.inf, dtype=F64)
    a_mem = knn_augmented_attention(q, k, v, mem_k, mem_v, 3, inf)
    a_local = knn_augmented_attention(q, k, v, mem_k, mem_v, 3, -inf)
    logit = randn(3, gen=gen, requires_grad=True)
    w = randn(2, 3, 5, 4, gen=gen)
    (knn_augmented_attention(q, k, v, mem_k, mem_v, 3, logit) * w).sum().backward()
    g = torch.sigmoid(logit.detach())
    assert_close(logit.grad, g * (1 - g) * (w * (a_mem - a_local)).sum((0, 2, 3)))

    torch.manual_seed(0)
    layer = MemorizingAttention(8, 2, capacity=16, topk=2).double()
    layer(randn(1, 4, 8, gen=gen)).sum().backward()
    assert layer.gate_logit.grad is None                          # nothing to mix with yet
    layer(randn(1, 4, 8, gen=gen)).sum().backward()
    assert layer.gate_logit.grad is not None and (layer.gate_logit.grad.abs() > 0).all()


def test_fifo_knn_search_matches_memorizing_transformers_knn_memory_M5_8(gen, tmp_path):
    """Independent oracle (memorizing-transformers-pytorch 0.4.1's `KNNMemory`: a faiss HNSW inner-product
    index per batch row over a memmap ring buffer): `exact_knn(metric="ip")` over a `FIFOKVMemory` returns the
    same keys and values, best first, for several k and batch rows, also after the FIFO has wrapped. With at
    most 16 keys HNSW's default efSearch (16) visits the whole graph, so its search is exact here.

    Their overflow rule is not a FIFO's. The `add` that takes the count past max_memories clears the index and
    indexes only that chunk, but marks the index untrained, so the next search finds nothing. Their count then
    lags one chunk: the index holds the newest 2, 3, ... chunks, and grows to max_memories + chunk rows before the
    next clear. Rows come back from the ring buffer at slot = label % max_memories, so labels past max_memories,
    and every label after a clear when the chunk does not divide max_memories, return rows other than the ones
    ranked. Hence: chunk | max_memories, and the comparison is with the newest `live` rows of our FIFO (the whole
    FIFO, wrapped, at t = 8); at t = 5 their empty answer is asserted."""
    mt = pytest.importorskip("memorizing_transformers_pytorch",
                             reason="memorizing-transformers-pytorch is pinned in requirements-nodeps.txt")
    b, d, cap, n = 3, 8, 16, 4
    theirs = mt.KNNMemory(dim=d, max_memories=cap, num_indices=b, memmap_filename=str(tmp_path / "knn.memmap"),
                          multiprocessing=False)
    ours = FIFOKVMemory(cap)
    # rows their index can see after t chunks; at t = 8 that is our whole FIFO, which holds the newest 16 of 32
    live = {1: 4, 2: 8, 3: 12, 4: 16, 5: 0, 6: 8, 7: 12, 8: 16}
    for t in range(9):
        q = F.normalize(randn(b, 6, d, gen=gen, dtype=torch.float32), dim=-1)
        if t:
            if live[t] == 0:                                          # just cleared: nothing, though we hold cap rows
                _, mask = theirs.search(q, 3)
                assert len(ours) == cap and not mask.any()
            for k in (1, 3, 8):
                if not 0 < k <= live[t]:
                    continue
                got, mask = theirs.search(q, k)                       # (b, 6, k, 2, d): key | value
                keys, vals = ours.keys[:, -live[t]:], ours.values[:, -live[t]:]
                scores, idx = exact_knn(q, keys, k, metric="ip")
                pick = lambda m: m.gather(1, idx.reshape(b, -1, 1).expand(-1, -1, d)).reshape(b, 6, k, d)
                assert mask.all()
                assert torch.equal(got[..., 0, :], pick(keys)), (t, k)   # stored rows come back unchanged
                assert torch.equal(got[..., 1, :], pick(vals)), (t, k)
                assert_close((q.unsqueeze(-2) * got[..., 0, :]).sum(-1), scores)
        kv = F.normalize(randn(b, n, 2, d, gen=gen, dtype=torch.float32), dim=-1)
        theirs.add(kv)
        ours.add(kv[:, :, 0], kv[:, :, 1])


def test_memorizing_attention_with_a_per_query_gate_matches_memorizing_transformers_knn_attention_M5_8(gen, tmp_path):
    """Independent oracle (memorizing-transformers-pytorch 0.4.1's `KNNAttention`): cosine logits with a learned
    per-head scale, one shared k/v head, read the kNN memory then write the segment. It does not gate: it takes
    one softmax over [retrieved; local] logits. That joint softmax is the gate of eq. (memorizing) with g chosen
    per query, g = sigmoid(log Z_mem - log Z_local) (Z: the two softmax denominators). So two `MemorizingAttention`
    layers with their gates at +inf and -inf (pure kNN, pure local), weights copied (their k/v head repeated over
    our heads, their scale as our log_scale, identity out_proj), mixed with that g and projected by their to_out,
    equal its output, segment after segment (the first with an empty memory). fp32: faiss is fp32 only."""
    mt = pytest.importorskip("memorizing_transformers_pytorch",
                             reason="memorizing-transformers-pytorch is pinned in requirements-nodeps.txt")
    torch.manual_seed(0)
    b, seg, heads, dh, topk, cap = 2, 4, 2, 8, 3, 16
    dm = heads * dh
    theirs = mt.KNNAttention(dim=dm, heads=heads, dim_head=dh, num_retrieved_memories=topk).eval()
    knn_memory = mt.KNNMemory(dim=dh, max_memories=cap, num_indices=b, memmap_filename=str(tmp_path / "knn.memmap"),
                              multiprocessing=False)
    with torch.no_grad():
        theirs.scale.copy_(torch.tensor([0.5, 1.5]).view(heads, 1, 1))     # distinct per-head log-scales
    k_w, v_w = theirs.to_kv.weight.chunk(2, dim=0)
    layers = {}
    for name, gate in (("mem", math.inf), ("local", -math.inf)):
        layer = MemorizingAttention(dm, heads, capacity=cap, topk=topk)
        with torch.no_grad():
            layer.q_proj.weight.copy_(theirs.to_q.weight)
            layer.k_proj.weight.copy_(k_w.repeat(heads, 1))
            layer.v_proj.weight.copy_(v_w.repeat(heads, 1))
            layer.out_proj.weight.copy_(torch.eye(dm))
            layer.log_scale.copy_(theirs.scale.view(heads))
            layer.gate_logit.fill_(gate)
        layers[name] = layer
    scale = theirs.scale.detach().exp()                                      # (heads, 1, 1)
    for s in range(5):                                                       # 5 x 4 rows: no overflow (see above)
        x = randn(b, seg, dm, gen=gen, dtype=torch.float32)
        with torch.no_grad():
            q = F.normalize(theirs.to_q(x).view(b, seg, heads, dh).transpose(1, 2), dim=-1) * scale
            k = F.normalize(theirs.to_kv(x)[..., :dh], dim=-1).unsqueeze(1)   # (b, 1, seg, dh)
            local_logits = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(seg, seg, dtype=torch.bool).tril(), -math.inf)
            mem = layers["mem"].memory
            log_z_mem = (torch.full((b, heads, seg), -math.inf) if mem.keys is None
                         else exact_knn(q, mem.keys, topk, metric="ip")[0].logsumexp(-1))
            g = torch.sigmoid(log_z_mem - local_logits.logsumexp(-1)).transpose(1, 2).unsqueeze(-1)   # (b, seg, h, 1)
            a_mem, a_local = (layers[name](x).view(b, seg, heads, dh) for name in ("mem", "local"))
            ours = theirs.to_out((g * a_mem + (1 - g) * a_local).reshape(b, seg, dm))
            expected, _ = theirs(x, knn_memory=knn_memory)
        assert_close(ours, expected, name=f"segment {s}")
        if s:                                    # g varies across the queries of a head: no per-head gate fits
            assert (g.amax((0, 1)) - g.amin((0, 1)) > 0.2).all()


# ============================================================================= M5.11 Titans neural memory
def test_neural_memory_one_delta_step_by_hand_M5_11(gen):
    """One step from a non-zero state ≡ M - lr·2kᵀ(kM - v) (row form of M - θ·2(Mk - v)kᵀ, ERRATA E5.9)."""
    mem = NeuralMemory(3, "delta", lr=0.1)
    k0, v0, k, v = randn(3, gen=gen), randn(3, gen=gen), randn(3, gen=gen), randn(3, gen=gen)
    mem.write(k0, v0)
    M = mem.M.clone()
    surprise = mem.write(k, v)
    grad = 2 * torch.outer(k, k @ M - v)
    assert_close(mem.M, M - 0.1 * grad)
    assert_close(surprise, grad.norm())
    assert_close(mem.read(k), k @ (M - 0.1 * grad))


@given(d=st.integers(1, 6), seed=st.integers(0, 50))
@HYP
def test_delta_step_with_lr_half_inverse_norm_stores_the_pair_exactly_M5_11(d, seed):
    """The delta rule with lr = 1/(2|k|²) makes read(k) = v after one write, whatever was stored."""
    gen = torch.Generator().manual_seed(seed)
    k, v = randn(d, gen=gen), randn(d, gen=gen)
    mem = NeuralMemory(d, "delta", lr=1 / (2 * float(k @ k)))
    mem.write(randn(d, gen=gen), randn(d, gen=gen))
    mem.write(k, v)
    assert_close(mem.read(k), v)


def test_hebbian_memory_equals_linear_attention_state_M5_11(gen):
    """Hebbian writes with lr 1 ≡ causal linear attention (identity features, no normaliser, Chapter 8),
    in outputs and gradients; with forgetting alpha ≡ retention with gamma = 1 - alpha."""
    q, k, v = (randn(2, 3, 7, 4, gen=gen, requires_grad=True) for _ in range(3))
    ours = NeuralMemory(4, "hebbian", lr=1.0).scan(q, k, v)
    ref = linear_attention(q, k, v, feature_map="identity", causal=True, normalize=False, mode="recurrent")
    assert_close(ours, ref)
    w = randn(2, 3, 7, 4, gen=gen)
    g_ours = torch.autograd.grad((ours * w).sum(), (q, k, v))
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(g_ours, g_ref):
        assert_close(a, b)
    forget = NeuralMemory(4, "hebbian", lr=1.0, decay=0.2).scan(q, k, v)
    assert_close(forget, retention(q, k, v, 0.8))


def test_momentum_and_forgetting_follow_the_titans_recursion_M5_11(gen):
    """S_t = eta S_{t-1} - lr grad_t, M_t = (1 - alpha) M_{t-1} + S_t, against an explicit loop."""
    eta, alpha, lr = 0.7, 0.1, 0.05
    ks, vs = randn(6, 3, gen=gen), randn(6, 2, gen=gen)
    mem = NeuralMemory(3, "delta", lr=lr, momentum=eta, decay=alpha, d_value=2)
    M, S = torch.zeros(3, 2, dtype=F64), torch.zeros(3, 2, dtype=F64)
    for k, v in zip(ks, vs):
        mem.write(k, v)
        S = eta * S - lr * 2 * torch.outer(k, k @ M - v)
        M = (1 - alpha) * M + S
        assert_close(mem.M, M)


# ============================================================================= argument checks
@pytest.mark.parametrize("call, exc, words", [
    (lambda: update_xl_memory(torch.zeros(2, 3, 4), torch.zeros(2, 3), 4), ValueError, "h"),
    (lambda: update_xl_memory(None, torch.zeros(1, 2, 4), -1), ValueError, "mem_len"),
    (lambda: xl_attention(torch.zeros(1, 2, 16), torch.zeros(2, 3, 16), XLRelativeAttention(16, 4)), ValueError, "mem"),
    (lambda: xl_attention(torch.zeros(1, 2, 16), None, torch.nn.Linear(2, 2)), TypeError, "XLRelativeAttention"),
    (lambda: compress_pool(torch.zeros(2, 4, 3), 0), ValueError, "ratio"),
    (lambda: compress_pool(torch.zeros(2, 4, 3), 2, "median"), ValueError, "kind"),
    (lambda: compress_most_used(torch.zeros(1, 4, 3), torch.zeros(1, 5), 2), ValueError, "usage"),
    (lambda: CompressiveMemory(2, 2, 2, "conv"), ValueError, "d_model"),
    (lambda: CompressiveMemory(2, 2, 2, "zip"), ValueError, "compressor"),
    (lambda: exact_knn(torch.zeros(3, 4), torch.zeros(10, 5), 2), ValueError, "d"),
    (lambda: exact_knn(torch.zeros(3, 4), torch.zeros(10, 4), 11), ValueError, "k=11"),
    (lambda: exact_knn(torch.zeros(2, 3, 4), torch.zeros(3, 10, 4), 2), ValueError, "leading dims"),
    (lambda: exact_knn(torch.zeros(3, 4), torch.zeros(10, 4), 2, metric="cos"), ValueError, "metric"),
    (lambda: exact_knn(torch.zeros(3, 4), torch.zeros(10, 4), 2, block_size=0), ValueError, "block_size"),
    (lambda: knn_distribution(torch.zeros(4), torch.zeros(5, 4), torch.arange(5), 2, vocab=3), ValueError, "vocab"),
    (lambda: knn_distribution(torch.zeros(4), torch.zeros(5, 4), torch.zeros(5), 2, vocab=3), TypeError, "vals"),
    (lambda: knn_lm_interpolate(torch.ones(3), torch.ones(3), 1.5), ValueError, "lam"),
    (lambda: knn_augmented_attention(*(torch.zeros(1, 2, 3, 4),) * 3, torch.zeros(1, 2, 5, 4),
                                     torch.zeros(1, 2, 5, 4), 2, torch.zeros(3)), ValueError, "gate_logit"),
    (lambda: NeuralMemory(4, "oja"), ValueError, "kind"),
    (lambda: NeuralMemory(4, momentum=1.5), ValueError, "momentum"),
    (lambda: NeuralMemory(4).write(torch.zeros(3), torch.zeros(4)), ValueError, "k must be"),
])
def test_bad_arguments_raise_naming_them(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_conv_compressor_with_fewer_rows_than_the_ratio_keeps_no_slot_M5_3(gen):
    """Evicting fewer rows than the ratio adds no compressed slot with the conv compressor too (the mean
    and max compressors already did); it used to call conv1d on a length-0 input and crash."""
    torch.manual_seed(0)
    memory = CompressiveMemory(8, 6, 3, "conv", d_model=16)
    h = torch.randn(2, 10, 16, generator=gen)
    with torch.no_grad():
        mem, cmem, old = memory.update(None, torch.zeros(2, 0, 16), h)
    assert old.shape == (2, 2, 16) and cmem.shape == (2, 0, 16)
    assert_close(mem, h[:, -8:])
