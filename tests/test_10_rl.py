"""Chapter 10, Transformers for RL (METHODS M10.2-M10.5): GTrXL's reordering and GRU gate, and the
Decision Transformer's tokens, model, toy environment and return-conditioned rollout.

The reordered block with a plain residual is checked against the library's Pre-LN encoder layer,
the unreordered one against the Post-LN layer, the Decision Transformer against Hugging Face
`transformers`' ``DecisionTransformerModel`` (a test-only pin) with the same weights, and the gate,
returns-to-go and token layout against hand-written loops and limits. Equalities run in fp64.
"""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xfam_lib.attention import causal_mask
from xfam_lib.rl import (
    best_episodes,
    CueRecallNet,
    DecisionTransformer,
    GRUGate,
    GTrXLBlock,
    ChainMDP,
    GambleChain,
    LSTMPolicy,
    TMaze,
    TransformerPolicy,
    collect_offline_dataset,
    count_parameters,
    cue_recall_batch,
    dt_action_token_index,
    gate_deviation,
    interleave_trajectory,
    layer_gradient_norms,
    markovian_share,
    match_parameters,
    play_episodes,
    position_influence,
    reinforce_loss,
    returns_to_go,
    rollout,
    train_cue_recall,
    train_decision_transformer,
    train_reinforce,
)
from xfam_lib.testing import assert_close
from xfam_lib.transformer import EncoderLayer

F64 = torch.float64


def _randn(*shape, gen):
    return torch.randn(*shape, generator=gen, dtype=F64)


# ----------------------------------------------------------------------------- M10.3 the GRU gate
def test_gru_gate_equals_its_equations_M10_7(gen):
    """g = (1−z)x + zĥ with r, z, ĥ written out from the gate's own weight blocks, per position."""
    d = 6
    gate = GRUGate(d, bias_init=0.5).double()
    with torch.no_grad():
        gate.b_g.copy_(_randn(d, gen=gen))
    x, y = _randn(2, 5, d, gen=gen), _randn(2, 5, d, gen=gen)
    W_r, W_z, W_g = gate.W.weight.split(d)
    U_r, U_z = gate.U_rz.weight.split(d)
    want = torch.empty_like(x)
    for b in range(2):
        for t in range(5):
            xi, yi = x[b, t], y[b, t]
            r = torch.sigmoid(W_r @ yi + U_r @ xi)
            z = torch.sigmoid(W_z @ yi + U_z @ xi - gate.b_g)
            h = torch.tanh(W_g @ yi + gate.U_g.weight @ (r * xi))
            want[b, t] = (1 - z) * xi + z * h
    assert_close(gate(x, y), want)


def test_gru_gate_large_bias_is_identity_and_deviation_falls_with_bias_M10_7(gen):
    """b_g → ∞ closes the update gate: g(x, y) = x. At initialisation ||g − x||/||x|| falls as b_g grows
    (0, 1, 2, 4): the block starts nearer the identity map."""
    d = 16
    x, y = _randn(4, 8, d, gen=gen), _randn(4, 8, d, gen=gen)
    torch.manual_seed(0)
    closed = GRUGate(d, bias_init=60.0).double()
    assert_close(closed(x, y), x)
    deviations = []
    for b_g in (0.0, 1.0, 2.0, 4.0):
        torch.manual_seed(0)
        deviations.append(gate_deviation(GRUGate(d, bias_init=b_g).double(), x, y))
    assert all(a > b for a, b in zip(deviations, deviations[1:])), deviations
    assert deviations[-1] < 0.1 < deviations[0], deviations


def test_gru_gate_rejects_bad_input():
    gate = GRUGate(4)
    with pytest.raises(ValueError, match="y must have x's shape"):
        gate(torch.randn(2, 4), torch.randn(2, 5))
    with pytest.raises(TypeError, match="d must be a positive int"):
        GRUGate(4.0)


# ----------------------------------------------------------------------------- M10.2 reordering
def _copy_into_encoder(block: GTrXLBlock, layer: EncoderLayer) -> None:
    layer.self_attn.load_state_dict(block.attn.state_dict())
    layer.ff.load_state_dict(block.ff.state_dict())
    layer.norm1.load_state_dict(block.norm1.state_dict())
    layer.norm2.load_state_dict(block.norm2.state_dict())


@pytest.mark.parametrize("reorder", [True, False], ids=["pre_ln", "post_ln"])
def test_gtrxl_block_with_residual_gate_is_the_encoder_layer_M10_2(reorder, gen):
    """reorder + residual gate + no ReLU ≡ the Pre-LN `EncoderLayer`; reorder=False ≡ the Post-LN one
    (same weights, causal mask)."""
    torch.manual_seed(1)
    block = GTrXLBlock(12, 3, 24, gate="residual", reorder=reorder, relu=False).double()
    layer = EncoderLayer(12, 3, 24, norm_first=reorder).double()
    _copy_into_encoder(block, layer)
    x = _randn(2, 7, 12, gen=gen)
    assert_close(block(x), layer(x, mask=causal_mask(7)))


def test_gtrxl_block_relu_and_gate_change_the_output_M10_2(gen):
    """The paper's reordered block applies a ReLU to each sub-layer output; the GRU gate replaces the sum.
    Written out with the block's own modules, each variant matches its equations."""
    torch.manual_seed(2)
    x = _randn(2, 6, 8, gen=gen)
    res = GTrXLBlock(8, 2, gate="residual").double()                 # relu=None → ReLU with reordering
    mask = causal_mask(6)
    h = x + torch.relu(res.attn(res.norm1(x), mask=mask))
    assert_close(res(x), h + torch.relu(res.ff(res.norm2(h))))
    gru = GTrXLBlock(8, 2, gate="gru").double()
    h = gru.gate1(x, torch.relu(gru.attn(gru.norm1(x), mask=mask)))
    assert_close(gru(x), gru.gate2(h, torch.relu(gru.ff(gru.norm2(h)))))


@pytest.mark.parametrize("gate", ["residual", "gru"])
def test_gtrxl_block_is_causal_and_memory_equals_longer_context_M10_2(gate, gen):
    """Perturbing token t changes no output before t. With memory M, the outputs for x equal the last L
    rows of one forward over [M, x]; and no gradient reaches the memory (stop-gradient)."""
    torch.manual_seed(3)
    block = GTrXLBlock(8, 2, gate=gate).double()
    x = _randn(1, 9, 8, gen=gen)
    y = block(x)
    x2 = x.clone()
    x2[0, 5] += 1.0
    y2 = block(x2)
    assert_close(y2[0, :5], y[0, :5])
    assert (y2[0, 5:] - y[0, 5:]).abs().max() > 1e-3
    mem = _randn(1, 4, 8, gen=gen).requires_grad_()
    out = block(x, memory=mem)
    assert_close(out, block(torch.cat([mem.detach(), x], dim=1))[:, 4:])
    out.sum().backward()
    assert mem.grad is None


def test_gtrxl_block_rejects_bad_arguments():
    with pytest.raises(ValueError, match="gate must be one of"):
        GTrXLBlock(8, 2, gate="lstm")
    with pytest.raises(ValueError, match="reorder=False"):
        GTrXLBlock(8, 2, gate="gru", reorder=False)
    with pytest.raises(ValueError, match="memory must be"):
        GTrXLBlock(8, 2)(torch.randn(2, 3, 8), memory=torch.randn(1, 3, 8))


def test_gradient_reaching_the_input_through_24_layers_M10_2():
    """F10.1's measurement in small, with the same fixed read-out gradient at the top of every stack, at
    initialisation, over 3 seeds: the reordered (Pre-LN) stack delivers more of it to the input than the
    Post-LN stack, and the b_g = 2 gated stack the least: each of its 48 gates starts with z ≈ σ(−2) ≈ 0.12 and
    carries only (1 − z) of the stream, so the block is near the identity but the gradient shrinks gate by
    gate. (A loss read after a final LayerNorm, such as ||h||², would give ≈ 0 gradient whatever the stack.)"""
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x, w = torch.randn(2, 8, 16, generator=gen), torch.randn(2, 8, 16, generator=gen)
        reach = {}
        for name, kw in (("post", dict(gate="residual", reorder=False)), ("pre", dict(gate="residual", relu=False)),
                         ("gated", dict(gate="gru"))):
            torch.manual_seed(seed)
            states, _ = layer_gradient_norms([GTrXLBlock(16, 2, **kw) for _ in range(24)], x, w)
            reach[name] = float(states[0] / states[-1])
        assert reach["pre"] > reach["post"] > reach["gated"], (seed, reach)


def test_layer_gradient_norms_equal_a_manual_backward_M10_2(gen):
    """F10.1's helper against an ordinary backward with retained activation gradients and per-block
    parameter .grad (fp64), for a Post-LN, a Pre-LN and a GRU-gated stack."""
    x, w = _randn(2, 5, 8, gen=gen), _randn(2, 5, 8, gen=gen)
    for kw in (dict(gate="residual", reorder=False), dict(gate="residual", relu=False), dict(gate="gru")):
        torch.manual_seed(4)
        blocks = [GTrXLBlock(8, 2, **kw).double() for _ in range(3)]
        states, params = layer_gradient_norms(blocks, x, w)
        hs = [x.clone().requires_grad_()]
        for blk in blocks:
            hs.append(blk(hs[-1]))
            hs[-1].retain_grad()
        (w * hs[-1]).sum().backward()
        assert_close(states, torch.stack([h.grad.norm() for h in hs]))
        want = [torch.cat([q.grad.flatten() for q in blk.parameters() if q.grad is not None]).norm() for blk in blocks]
        assert_close(params, torch.stack(want))


def _identity_blocks(n):
    """``n`` Pre-LN blocks (d = 8, fp64) whose sub-layers output zero: the stack is the identity map."""
    blocks = [GTrXLBlock(8, 2, gate="residual", relu=False).double() for _ in range(n)]
    for blk in blocks:
        for lin in (blk.attn.out_proj, blk.ff.linear2):
            torch.nn.init.zeros_(lin.weight)
            torch.nn.init.zeros_(lin.bias)
    return blocks


def test_layer_gradient_norms_identity_limits_M10_2_M10_7(gen):
    """Where a stack is exactly the identity map, every layer receives the top gradient unchanged:
    Pre-LN blocks whose sub-layers output zero, and GRU gates closed by a huge b_g."""
    x, w = _randn(2, 4, 8, gen=gen), _randn(2, 4, 8, gen=gen)
    torch.manual_seed(5)
    pre = _identity_blocks(4)
    closed = [GTrXLBlock(8, 2, gate="gru", bias_init=60.0).double() for _ in range(4)]
    for blocks in (pre, closed):
        states, _ = layer_gradient_norms(blocks, x, w)
        assert_close(states, w.norm().expand(5))
    with pytest.raises(ValueError, match="weight must have x's shape"):
        layer_gradient_norms(pre, x, w[:, :3])
    with pytest.raises(ValueError, match="at least one block"):
        layer_gradient_norms([], x, w)


def test_position_influence_equals_one_nudged_pass_per_position_M10_2(gen):
    """Entry p is the change of the last output when position p alone is nudged, checked against a
    separate forward per position (fp64); a stack that copies its input (zeroed sub-layers) moves only
    with the current position, so its share is exactly 1; the past positions of a causal stack never
    see a later nudge."""
    x, nudge = _randn(2, 6, 8, gen=gen), 1e-3 * _randn(2, 8, gen=gen)
    torch.manual_seed(6)
    blocks = [GTrXLBlock(8, 2, gate="gru", bias_init=1.0).double() for _ in range(3)]

    def last(h):
        for blk in blocks:
            h = blk(h)
        return h[:, -1]

    with torch.no_grad():
        want = []
        for p in range(6):
            h = x.clone()
            h[:, p] += nudge
            want.append((last(h) - last(x)).norm())
    assert_close(position_influence(blocks, x, nudge), torch.stack(want))
    torch.manual_seed(6)
    copy = _identity_blocks(2)
    influence = position_influence(copy, x, nudge)
    assert torch.equal(influence[:-1], torch.zeros(5, dtype=F64))
    assert markovian_share(influence) == 1.0
    assert markovian_share(torch.tensor([3.0, 1.0, 1.0])) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="nudge must be"):
        position_influence(blocks, x, nudge[:1])
    with pytest.raises(ValueError, match="at least two positions"):
        markovian_share(torch.tensor([1.0]))


def test_gate_bias_gives_the_most_markovian_start_M10_3():
    """Parisotto et al.'s hypothesis for b_g > 0, measured at initialisation over 3 seeds, at the
    paper's 12 layers and at the policies' 4: the current position's share of the last output
    (against the mean of the past positions) is largest for GTrXL with b_g = 2, next for the
    reordered stack without gates (TrXL-I), and smallest for the gate at b_g = 0."""
    stacks = {"gtrxl": dict(gate="gru", bias_init=2.0), "trxl_i": dict(gate="residual"),
              "post": dict(gate="residual", reorder=False), "b0": dict(gate="gru", bias_init=0.0)}
    for depth in (12, 4):
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x, nudge = torch.randn(2, 12, 16, generator=g), 1e-3 * torch.randn(2, 16, generator=g)
            share = {}
            for name, kw in stacks.items():
                torch.manual_seed(seed)
                blocks = [GTrXLBlock(16, 2, **kw) for _ in range(depth)]
                share[name] = markovian_share(position_influence(blocks, x, nudge))
            assert share["gtrxl"] > share["trxl_i"] > share["b0"], (depth, seed, share)
            assert share["post"] > share["b0"], (depth, seed, share)


def test_cue_recall_batch_and_net_M10_2():
    """The answer is token 0, distractors sit strictly between cue and query ids, the query closes every
    sequence; seeded. The net's prediction depends on the cue and (causal stack, last-position read-out)
    reads the whole sequence."""
    tokens, cue = cue_recall_batch(64, n_cues=3, n_distractors=5, length=9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(tokens[:, 0], cue) and (cue < 3).all() and len(set(cue.tolist())) == 3
    assert ((tokens[:, 1:-1] >= 3) & (tokens[:, 1:-1] < 8)).all() and (tokens[:, -1] == 8).all()
    again, _ = cue_recall_batch(64, n_cues=3, n_distractors=5, length=9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, tokens)
    torch.manual_seed(0)
    net = CueRecallNet(9, 3, 9, depth=2, d_model=8, n_heads=2, gate="gru")
    other = tokens.clone()
    other[:, 0] = (other[:, 0] + 1) % 3
    assert (net(other) - net(tokens)).abs().max() > 1e-6
    with pytest.raises(ValueError, match="length must be at least 2"):
        cue_recall_batch(4, length=1)


def test_train_cue_recall_learns_with_a_pre_ln_stack_M10_2():
    """A 2-layer reordered stack learns the one-step memory in 150 steps (far above chance 1/4), and the
    run is seeded."""
    out = train_cue_recall(dict(gate="residual", relu=False), depth=2, steps=150, lr=3e-3, seed=0)
    assert out["accuracy"] > 0.9, out["accuracy"]
    assert out["losses"] == train_cue_recall(dict(gate="residual", relu=False), depth=2, steps=150, lr=3e-3,
                                             seed=0)["losses"]


# ----------------------------------------------------------------------------- M10.4 tokens
@given(T=st.integers(1, 12), gamma=st.sampled_from([1.0, 0.9, 0.5]), seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_returns_to_go_is_the_discounted_tail_sum_M10_4(T, gamma, seed):
    """R_t = Σ_{t'≥t} γ^{t'−t} r_t', from a double loop."""
    r = torch.randn(2, T, generator=torch.Generator().manual_seed(seed), dtype=F64)
    want = torch.zeros_like(r)
    for t in range(T):
        for u in range(t, T):
            want[:, t] += gamma ** (u - t) * r[:, u]
    assert_close(returns_to_go(r, gamma), want)


def test_interleave_order_and_action_token_index_M10_4(gen):
    """Tokens run R_1, s_1, a_1, R_2, …; index 3t + 1 (0-based) holds s_t, where a_t is read out."""
    T, d = 4, 3
    R, s, a = (_randn(2, T, d, gen=gen) for _ in range(3))
    tokens = interleave_trajectory(R, s, a)
    for t in range(T):
        assert torch.equal(tokens[:, 3 * t], R[:, t])
        assert torch.equal(tokens[:, 3 * t + 1], s[:, t])
        assert torch.equal(tokens[:, 3 * t + 2], a[:, t])
    assert torch.equal(tokens[:, dt_action_token_index(T)], s)
    with pytest.raises(ValueError, match="share one"):
        interleave_trajectory(R, s, a[:, :3])
    with pytest.raises(ValueError, match="gamma"):
        returns_to_go(torch.ones(3), gamma=0.0)


# ----------------------------------------------------------------------------- M10.5 the model
def _dt(discrete=True, seed=0):
    torch.manual_seed(seed)
    return DecisionTransformer(5, 3, d_model=16, n_layers=2, n_heads=2, max_timestep=20, discrete=discrete).double()


def _batch(model, T, gen, discrete=True):
    rtg = _randn(2, T, gen=gen)
    states = _randn(2, T, 5, gen=gen)
    actions = torch.randint(3, (2, T), generator=gen) if discrete else torch.rand(2, T, 3, generator=gen, dtype=F64)
    return rtg, states, actions, torch.arange(T).expand(2, T)


def test_decision_transformer_action_reads_only_the_past_M10_4(gen):
    """The prediction for a_t depends on R_≤t, s_≤t and a_<t: changing a_t leaves it unchanged and moves
    a_{t+1}'s; changing R_{t+1} or s_{t+1} leaves it unchanged."""
    model = _dt()
    rtg, states, actions, ts = _batch(model, 6, gen)
    base = model(rtg, states, actions, ts)
    a2 = actions.clone()
    a2[:, 3] = (a2[:, 3] + 1) % 3
    moved = model(rtg, states, a2, ts)
    assert_close(moved[:, :4], base[:, :4])
    assert (moved[:, 4] - base[:, 4]).abs().max() > 1e-6
    r2, s2 = rtg.clone(), states.clone()
    r2[:, 4] += 1.0
    s2[:, 4] += 1.0
    assert_close(model(r2, s2, actions, ts)[:, :4], base[:, :4])


def test_decision_transformer_matches_hugging_face_M10_5(gen):
    """Our continuous-action Decision Transformer with Hugging Face's weights equals
    `transformers.DecisionTransformerModel` (GPT-2 backbone, exact GELU, no dropout). HF adds a position
    embedding at position 0 to every token; it is zeroed, as the model's own comment says positions
    come from the timestep embedding."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DecisionTransformerConfig(state_dim=5, act_dim=3, hidden_size=16, n_layer=2, n_head=2,
                                                 max_ep_len=20, activation_function="gelu", action_tanh=True,
                                                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, n_positions=64)
    torch.manual_seed(5)
    hf = transformers.DecisionTransformerModel(cfg).double().eval()
    ours = _dt(discrete=False)
    d = 16
    with torch.no_grad():
        hf.encoder.wpe.weight.zero_()
        for name in ("embed_timestep", "embed_return", "embed_state", "embed_action", "embed_ln"):
            getattr(ours, name).load_state_dict(getattr(hf, name).state_dict())
        ours.final_ln.load_state_dict(hf.encoder.ln_f.state_dict())
        ours.predict_action.load_state_dict(hf.predict_action[0].state_dict())
        for layer, h in zip(ours.layers, hf.encoder.h):
            w, b = h.attn.c_attn.weight, h.attn.c_attn.bias               # Conv1D: (in, 3 out), q|k|v
            for i, proj in enumerate((layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj)):
                proj.weight.copy_(w[:, i * d:(i + 1) * d].T)
                proj.bias.copy_(b[i * d:(i + 1) * d])
            layer.attn.out_proj.weight.copy_(h.attn.c_proj.weight.T)
            layer.attn.out_proj.bias.copy_(h.attn.c_proj.bias)
            layer.ff.linear1.weight.copy_(h.mlp.c_fc.weight.T)
            layer.ff.linear1.bias.copy_(h.mlp.c_fc.bias)
            layer.ff.linear2.weight.copy_(h.mlp.c_proj.weight.T)
            layer.ff.linear2.bias.copy_(h.mlp.c_proj.bias)
            layer.norm1.load_state_dict(h.ln_1.state_dict())
            layer.norm2.load_state_dict(h.ln_2.state_dict())
    rtg, states, actions, ts = _batch(ours, 7, gen, discrete=False)
    want = hf(states=states, actions=actions, rewards=None, returns_to_go=rtg.unsqueeze(-1), timesteps=ts,
              return_dict=True).action_preds
    assert_close(ours(rtg, states, actions, ts), want)


def test_decision_transformer_rejects_bad_input(gen):
    model = _dt()
    rtg, states, actions, ts = _batch(model, 4, gen)
    with pytest.raises(ValueError, match="states must be"):
        model(rtg, states[..., :4], actions, ts)
    with pytest.raises(ValueError, match="actions must be integer ids"):
        model(rtg, states, actions.double(), ts)
    with pytest.raises(ValueError, match="timesteps must lie in"):
        model(rtg, states, actions, ts + 30)


# ----------------------------------------------------------------------------- M10.5 environment, data, rollout
def test_lock_chain_rules_and_offline_dataset_M10_5():
    """Only the key bit of the current cell moves on and earns 1; the state shows the cell and that bit;
    R̂_1 is each episode's return; a scripted policy that always plays the key earns max_return and one
    that never does earns 0; seeded."""
    env = ChainMDP(n_states=6, horizon=4)
    keys = torch.tensor([[1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    cells = torch.tensor([0, 5])
    nxt, reward = env.step(cells, keys, torch.tensor([1, 0]))
    assert nxt.tolist() == [1, 5] and reward.tolist() == [1.0, 0.0]           # the last cell earns nothing
    nxt, reward = env.step(cells, keys, torch.tensor([0, 1]))
    assert nxt.tolist() == [0, 5] and reward.tolist() == [0.0, 0.0]
    obs = env.observe(torch.tensor([2, 1]), keys)
    assert obs[0].tolist() == [0, 0, 1, 0, 0, 0, 0, 1] and obs[1].tolist() == [0, 1, 0, 0, 0, 0, 1, 0]
    data = collect_offline_dataset(env, 60, p_open=(0.0, 0.5, 1.0), seed=3)
    assert torch.equal(data.rtg[:, 0], data.returns)
    assert (data.returns[0::3] == 0).all() and (data.returns[2::3] == env.max_return).all()
    key_bit = data.states[..., env.n_states:].argmax(-1)
    assert torch.equal((data.actions == key_bit).float(), data.rewards)        # reward = "played the key"
    assert torch.equal(collect_offline_dataset(env, 60, p_open=(0.0, 0.5, 1.0), seed=3).actions, data.actions)
    with pytest.raises(ValueError, match="actions must be 0 or 1"):
        env.step(cells, keys, torch.tensor([2, 0]))


def test_lock_chain_no_fixed_action_sequence_solves_it_M10_5():
    """The reward depends on the state: over 256 combinations, the best fixed action sequence (all 2^6
    tried; alternating is best, about 1.5 steps per lock) earns at most 70 % of the maximum on average,
    while reading the key bit always earns it."""
    import itertools
    env = ChainMDP(n_states=8, horizon=6)
    cells, keys = env.reset(256, torch.Generator().manual_seed(0))
    best = 0.0
    for seq in itertools.product((0, 1), repeat=env.horizon):
        c, total = cells, torch.zeros(256)
        for action in seq:
            c, reward = env.step(c, keys, torch.full((256,), action))
            total += reward
        best = max(best, float(total.mean()))
    assert best < 0.7 * env.max_return, best
    c, total = cells, torch.zeros(256)
    for _ in range(env.horizon):
        c, reward = env.step(c, keys, keys.gather(1, c[:, None])[:, 0])
        total += reward
    assert (total == env.max_return).all()


def test_decision_transformer_controls_ignore_returns_or_states(gen):
    """use_returns=False (behaviour cloning) makes the output independent of the returns-to-go,
    use_states=False of the states; the full model depends on both."""
    rtg, states = _randn(2, 5, gen=gen), _randn(2, 5, 5, gen=gen)
    actions, ts = torch.randint(3, (2, 5), generator=gen), torch.arange(5).expand(2, 5)
    for flags, moved in (({}, None), ({"use_returns": False}, "rtg"), ({"use_states": False}, "states")):
        torch.manual_seed(0)
        model = DecisionTransformer(5, 3, d_model=16, n_layers=1, n_heads=2, max_timestep=8, **flags).double()
        base = model(rtg, states, actions, ts)
        by_rtg = (model(rtg + 3.0, states, actions, ts) - base).abs().max()
        by_states = (model(rtg, states + 1.0, actions, ts) - base).abs().max()
        assert (by_rtg == 0) == (moved == "rtg") and (by_states == 0) == (moved == "states"), flags


def test_rollout_tracks_the_target_on_the_lock_chain_M10_5():
    """A small DT trained offline on mixed scripted policies achieves more when asked for more, and asked
    for 0 it avoids the keys: mean achieved return rises over targets 0, 2, 4 and spans at least 3
    (one seed, 16 episodes per target)."""
    torch.manual_seed(0)
    env = ChainMDP(n_states=8, horizon=6)
    data = collect_offline_dataset(env, 300, p_open=(0.2, 0.5, 0.8), seed=0)
    model = DecisionTransformer(env.obs_dim, 2, d_model=16, n_layers=1, n_heads=2, max_timestep=env.horizon)
    train_decision_transformer(model, data, steps=100, batch=64, lr=3e-3, seed=0)
    achieved = rollout(model, env, torch.tensor([0, 2, 4]).repeat_interleave(16)).view(3, 16).mean(1)
    assert (achieved.diff() > 0).all() and achieved[-1] - achieved[0] >= 3, achieved
    assert_close(rollout(model, env, 4.0, episodes=16), rollout(model, env, torch.full((16,), 4.0)))
    with pytest.raises(ValueError, match="target_return must have 1 dims"):
        rollout(model, env, torch.zeros(2, 2))


def test_best_episodes_keeps_the_top_fraction_in_order_M10_5():
    """%BC's data: ceil(fraction * N) episodes, every kept return at least every dropped one, the kept
    episodes in their original order with all their fields; bad fractions are refused."""
    env = ChainMDP(n_states=6, horizon=5)
    data = collect_offline_dataset(env, 40, p_open=(0.1, 0.5, 0.9), seed=2)
    top = best_episodes(data, 0.25)
    assert len(top.returns) == 10
    kept = [i for i in range(40) if any(torch.equal(data.states[i], s) and torch.equal(data.actions[i], a)
                                        for s, a in zip(top.states, top.actions))]
    assert len(kept) == 10 and torch.equal(data.returns[kept], top.returns)
    dropped = [i for i in range(40) if i not in kept]
    assert top.returns.min() >= data.returns[dropped].max()
    assert torch.equal(top.rtg[:, 0], top.returns) and len(best_episodes(data, 0.01).returns) == 1
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            best_episodes(data, bad)


def test_gamble_chain_hides_its_coins_and_logs_fair_actions_M10_5():
    """Safe earns `safe`, gamble earns the hidden coin of that step; the state is the timestep alone;
    with p_open=(0.5,) the logged actions are independent of the coins (frequencies near 1/2 whatever
    the coin), so an episode's top return comes only from winning gambles."""
    env = GambleChain(horizon=3, safe=0.6)
    keys = torch.tensor([[1, 0, 1], [0, 0, 1]])
    t = torch.tensor([0, 2])
    nxt, reward = env.step(t, keys, torch.tensor([1, 1]))
    assert nxt.tolist() == [1, 3] and reward.tolist() == [1.0, 1.0]
    assert env.step(t, keys, torch.tensor([0, 0]))[1].tolist() == pytest.approx([0.6, 0.6])
    assert env.step(torch.tensor([1, 0]), keys, torch.tensor([1, 1]))[1].tolist() == [0.0, 0.0]
    assert torch.equal(env.observe(t, keys), torch.eye(3)[[0, 2]])
    data = collect_offline_dataset(env, 4000, p_open=(0.5,), seed=0)
    gambled = data.actions == 1
    won = data.rewards == 1
    assert abs(gambled.float().mean() - 0.5) < 0.03
    assert gambled[won].all()                                                   # reward 1 only from gambles
    top = data.returns == env.max_return
    assert top.any() and gambled[top].all()
    with pytest.raises(ValueError, match="0 \\(safe\\) or 1"):
        env.step(t, keys, torch.tensor([2, 0]))


def test_rollout_samples_when_not_greedy_M10_5():
    """``greedy=False`` draws each action from the softmax of the logits: seeded, and for a model
    whose two logits are equal, about half of each action, where the greedy path always plays the first."""
    env = GambleChain(horizon=4, safe=0.0)
    torch.manual_seed(0)
    model = DecisionTransformer(env.obs_dim, 2, d_model=8, n_layers=1, n_heads=2, max_timestep=env.horizon)
    torch.nn.init.zeros_(model.predict_action.weight)
    torch.nn.init.zeros_(model.predict_action.bias)
    sampled = rollout(model, env, 4.0, episodes=2000, seed=1, greedy=False)
    assert torch.equal(sampled, rollout(model, env, 4.0, episodes=2000, seed=1, greedy=False))
    assert abs(float(sampled.mean()) - 1.0) < 0.1             # each step gambles w.p. 1/2 and wins w.p. 1/2
    assert torch.equal(rollout(model, env, 4.0, episodes=8), torch.zeros(8))  # argmax of a tie: safe, 0


# ----------------------------------------------------------------------------- M10.2, M10.3: a memory task trained by policy gradient
def test_t_maze_passes_gymnasium_check_env_and_needs_the_cue_M10_3():
    """gymnasium's own checker accepts the environment. The cue appears only in the first observation,
    the junction only in the last; the reward is +1 for the cue's turn and -1 otherwise; seeded."""
    from gymnasium.utils.env_checker import check_env
    env = TMaze(5)
    check_env(env, skip_render_check=True)
    cues = set()
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        cue, seen = info["cue"], [obs]
        cues.add(cue)
        for _ in range(4):
            obs, reward, terminated, truncated, _ = env.step(1 - cue)
            assert reward == 0.0 and not terminated and not truncated
            seen.append(obs)
        assert [o.argmax() for o in seen] == [cue, 2, 2, 2, 3] and env.step(cue)[1:3] == (1.0, True)
        env.reset(seed=seed)
        for _ in range(5):
            last = env.step(1 - cue)
        assert last[1] == -1.0 and last[2]
        assert env.reset(seed=seed)[1]["cue"] == cue
    assert cues == {0, 1}
    with pytest.raises(ValueError, match="action must be 0"):
        env.step(2)
    with pytest.raises(ValueError, match="length must be at least 2"):
        TMaze(1)


def test_reinforce_loss_equals_its_formula_and_the_baseline_adds_no_bias_M10_7(gen):
    """(M10.7) The loss written out by hand; and over a one-step bandit, the exact expected policy gradient
    (every action weighted by its probability) is the same with a baseline of 0 or of 5."""
    logits, values = _randn(3, 4, 2, gen=gen), _randn(3, 4, gen=gen)
    actions, rewards = torch.randint(2, (3, 4), generator=gen), _randn(3, 4, gen=gen)
    logp = logits.log_softmax(-1)
    g = torch.stack([rewards[:, t:].sum(1) for t in range(4)], 1)
    chosen = logp.gather(-1, actions[..., None])[..., 0]
    entropy = -(logp.exp() * logp).sum(-1)
    want = -(chosen * (g - values)).mean() + 0.5 * ((g - values) ** 2).mean() - 0.01 * entropy.mean()
    assert_close(reinforce_loss(logits, values, actions, rewards), want)
    arm_rewards = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    expected = []
    for b in (0.0, 5.0):
        theta = _randn(3, gen=torch.Generator().manual_seed(1)).requires_grad_()
        probs = theta.softmax(-1).detach()
        total = 0
        for a in range(3):
            loss = reinforce_loss(theta.view(1, 1, 3), torch.full((1, 1), b, dtype=F64), torch.tensor([[a]]),
                                  arm_rewards[a].view(1, 1), value_coef=0.0, entropy_coef=0.0)
            total = total + probs[a] * torch.autograd.grad(loss, theta)[0]
        expected.append(total)
    assert_close(expected[0], expected[1])
    assert expected[0].abs().max() > 1e-3
    with pytest.raises(ValueError, match="values must be"):
        reinforce_loss(logits, values[:, :3], actions, rewards)


def test_play_episodes_is_seeded_and_feeds_the_policy_the_past_M10_7():
    """Same seed, same episodes; the observations are the environments' own; greedy play is
    deterministic; episodes of different lengths are refused."""
    torch.manual_seed(0)
    policy = LSTMPolicy(4, 2, 8)
    envs = [TMaze(4) for _ in range(6)]
    one, two = play_episodes(policy, envs, seed=3), play_episodes(policy, envs, seed=3)
    assert torch.equal(one.actions, two.actions) and torch.equal(one.obs, two.obs)
    assert one.obs.shape == (6, 4, 4) and one.rewards.shape == (6, 4)
    cues = [env.reset(seed=3 + i)[1]["cue"] for i, env in enumerate(envs)]
    assert one.obs[:, 0].argmax(-1).tolist() == cues and (one.obs[:, -1, 3] == 1).all()
    assert (one.rewards[:, :-1] == 0).all() and set(one.rewards[:, -1].tolist()) <= {-1.0, 1.0}
    greedy = play_episodes(policy, envs, seed=5, greedy=True)
    assert torch.equal(greedy.actions, play_episodes(policy, envs, seed=5, greedy=True).actions)
    with pytest.raises(ValueError, match="all end at the same step"):
        play_episodes(policy, [TMaze(3), TMaze(4)], seed=0)


def test_match_parameters_and_policies_M10_3():
    """The matched size is the closest of all candidates (brute force); both policies map (B, T, obs)
    to logits and values, and the Transformer policy is causal."""
    target = count_parameters(TransformerPolicy(4, 2, d_model=16, n_layers=2, gate="gru"))
    sizes = range(4, 200)
    got = match_parameters(lambda h: LSTMPolicy(4, 2, h), sizes, target)
    assert got == min(sizes, key=lambda h: abs(count_parameters(LSTMPolicy(4, 2, h)) - target))
    torch.manual_seed(0)
    policy = TransformerPolicy(4, 2, d_model=16, n_layers=2, gate="gru")
    obs = torch.rand(3, 5, 4)
    logits, values = policy(obs)
    assert logits.shape == (3, 5, 2) and values.shape == (3, 5)
    later = obs.clone()
    later[:, 3:] += 1.0
    assert_close(policy(later)[0][:, :3], logits[:, :3])
    with pytest.raises(ValueError, match="obs must have 3 dims"):
        policy(obs[0])


def test_train_reinforce_solves_a_short_t_maze_with_an_lstm_M10_7():
    """Policy gradient with a baseline learns the cue-to-turn memory of a 3-step T-maze: greedy return
    from chance (about 0) to 1 (all held-out episodes right), in every one of 2 seeds."""
    for seed in range(2):
        torch.manual_seed(seed)
        out = train_reinforce(LSTMPolicy(4, 2, 16), lambda: TMaze(3), updates=60, batch=16, lr=1e-2, seed=seed,
                              eval_every=60)
        assert out["eval_return"][0] < 0.5 and out["eval_return"][-1] == 1.0, (seed, out["eval_return"])
