"""Chapter 6 experiment models: `PermutationACT`'s cell reads the start item once, so its states cannot
depend on ``k`` and only the halting unit sees ``k`` (M6.3); `ParityACTGraves` is Graves's tanh RNN (M6.3);
`UTSeq2Seq`'s tied and untied cores differ only in weight sharing (M6.1)."""
import pytest
import torch

from xfam_lib.ablations import ParityACTGraves, PermutationACT, UTSeq2Seq, train_parity, train_ut_seq2seq
from xfam_lib.testing import assert_close
from xfam_lib.transformer import EncoderLayer, count_params


def test_permutation_act_states_ignore_k_and_halting_sees_it_M6_3():
    torch.manual_seed(0)
    model = PermutationACT(n_items=8, max_k=4, hidden=16, max_steps=5).double()
    start = torch.arange(8).repeat(4)
    k = torch.arange(1, 5).repeat_interleave(8)
    with torch.no_grad():
        model.halt.weight.zero_()
        model.halt.bias.fill_(-50.0)                                      # p = 0: never halt before the limit
        logits, ponder, n = model(start.long(), k)
        assert torch.equal(n, torch.full_like(n, 5.0)) and torch.allclose(ponder, torch.full_like(ponder, 6.0))
        # every k gives the same output for the same start: the state trajectory does not see k
        assert torch.equal(logits.view(4, 8, -1), logits[:8].expand(4, 8, -1))
        model.halt.weight[0, 16:] = torch.tensor([100.0, 0.0, 0.0, 0.0])  # halting unit: stop at once iff k = 1
        _, _, n = model(start.long(), k)
        assert torch.equal(n, torch.where(k == 1, 1.0, 5.0).double())


def test_parity_act_graves_is_a_tanh_rnn_reading_input_and_first_step_flag_M6_3():
    """`ParityACTGraves` (Graves 2016, Sec. 3.1): a tanh RNN cell that reads [x, flag] at every ponder
    step, the flag 1 on the first step only; with the halting unit switched off it takes exactly
    ``max_steps`` steps and its state is the tanh recurrence written out by hand."""
    torch.manual_seed(0)
    model = ParityACTGraves(n_bits=6, hidden=5, max_steps=3).double()
    assert isinstance(model.cell, torch.nn.RNNCell) and model.cell.nonlinearity == "tanh"
    assert model.halt.bias.item() == 1.0
    x = torch.randint(-1, 2, (4, 6)).double()
    with torch.no_grad():
        model.halt.weight.zero_()
        model.halt.bias.fill_(-50.0)                     # p ~ 0: run to the step limit, weight 1 on the last state
        logit, ponder, n = model(x)
        W, U, b = model.cell.weight_ih, model.cell.weight_hh, model.cell.bias_ih + model.cell.bias_hh
        h = torch.zeros(4, 5, dtype=torch.float64)
        for step in range(3):
            flag = torch.full((4, 1), 1.0 if step == 0 else 0.0, dtype=torch.float64)
            h = torch.tanh(torch.cat([x, flag], -1) @ W.T + h @ U.T + b)
        assert_close(logit, model.out(h).squeeze(-1))
        assert torch.equal(n, torch.full_like(n, 3.0))
        assert_close(ponder, torch.full_like(ponder, 4.0))              # N + R = 3 + 1
    res = train_parity(n_bits=4, hidden=8, max_steps=5, steps=2, batch=8, seed=0, eval_batch=200, cell="tanh")
    assert len(res["ponder"]) == 4 and all(1.0 <= p <= 6.0 for p in res["ponder"])


def test_ut_seq2seq_tied_vs_untied_differ_only_in_sharing_M6_1():
    """`UTSeq2Seq`: the tied model's parameters do not grow with depth, the untied stack's grow by one
    layer per step; untied layers loaded with the tied layer's weights give the same logits (same
    coordinate embedding before every layer), and at ``n_steps=1`` the two are the same model."""
    layer_params = count_params(EncoderLayer(16, 2, 32))
    tied = {T: count_params(UTSeq2Seq(10, 16, 2, 32, T, tied=True)) for T in (1, 2, 5)}
    untied = {T: count_params(UTSeq2Seq(10, 16, 2, 32, T, tied=False)) for T in (1, 2, 5)}
    assert len(set(tied.values())) == 1
    assert untied[1] == tied[1] and untied[5] - untied[2] == 3 * layer_params

    torch.manual_seed(0)
    ut = UTSeq2Seq(10, 16, 2, 32, 3, tied=True).double().eval()
    stack = UTSeq2Seq(10, 16, 2, 32, 3, tied=False).double().eval()
    stack.embed.load_state_dict(ut.embed.state_dict())
    stack.head.load_state_dict(ut.head.state_dict())
    for layer in stack.core:
        layer.load_state_dict(ut.core.layer.state_dict())
    ids = torch.randint(0, 10, (2, 7))
    with torch.no_grad():
        assert_close(stack(ids), ut(ids))
        stack.core[1].ff.linear1.weight.mul_(1.5)
        assert not torch.allclose(ut(ids), stack(ids), atol=1e-6)      # the layers really are separate

    a = train_ut_seq2seq("reverse", 1, tied=True, steps=3, batch=4, eval_batch=16)
    b = train_ut_seq2seq("reverse", 1, tied=False, steps=3, batch=4, eval_batch=16)
    assert a == b
    with pytest.raises(ValueError, match="task"):
        train_ut_seq2seq("sort", 2, tied=True)
    with pytest.raises(TypeError, match="ids must be integer token ids"):     # float ids: a wrong type
        ut(torch.zeros(2, 7))
