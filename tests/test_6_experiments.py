"""Chapter 6 experiment models (M6.3): `PermutationACT`'s cell reads the start item once, so its states
cannot depend on ``k``; only the halting unit sees ``k``."""
import torch

from xfam_lib.experiments import PermutationACT


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
