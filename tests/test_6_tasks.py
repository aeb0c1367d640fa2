"""Chapter 6 synthetic tasks: Graves's parity vectors (M6.3)."""
import pytest
import torch

from xfam_lib.tasks import parity_task


def test_parity_task_counts_plus_ones_and_reports_difficulty_M6_3():
    gen = torch.Generator().manual_seed(0)
    x, target, k = parity_task(2000, 10, min_nonzero=2, generator=gen)
    assert set(x.unique().tolist()) == {-1.0, 0.0, 1.0}
    assert torch.equal((x != 0).sum(-1), k)                                       # k nonzero entries per row
    assert k.min().item() == 2 and k.max().item() == 10                           # every difficulty drawn
    by_hand = torch.tensor([sum(1 for v in row if v == 1) % 2 for row in x.tolist()])
    assert torch.equal(target, by_hand)
    assert 0.4 < target.float().mean().item() < 0.6                               # both classes
    assert 0.3 < (x == -1).sum().item() / (x != 0).sum().item() < 0.7             # both signs


def test_parity_task_is_reproducible_and_validates():
    a = parity_task(8, 6, generator=torch.Generator().manual_seed(3))
    b = parity_task(8, 6, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    with pytest.raises(ValueError, match="min_nonzero"):
        parity_task(8, 6, min_nonzero=7)
    with pytest.raises(TypeError, match="n_bits"):
        parity_task(8, 6.0)
