"""Chapter 11's tasks and measures (METHODS M11.1, M11.4): the copy tasks' answers by construction, and the
induction score on attention patterns built by hand from positions."""
import pytest
import torch

from xfam_lib.attention import induction_score
from xfam_lib.tasks import N_SPECIAL, PAD, copy_task, delayed_copy


def test_copy_and_delayed_copy_answers_by_construction_M11_1():
    """copy: the target is the source; delayed copy: position i asks for the token read `delay` steps earlier,
    nothing before that; both seeded."""
    src, tgt = copy_task(3, 9, 12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(src, tgt) and int(src.min()) >= N_SPECIAL and int(src.max()) < 12
    ids, targets = delayed_copy(3, 9, 12, 4, generator=torch.Generator().manual_seed(0))
    for i in range(9):
        want = ids[:, i - 4] if i >= 4 else torch.full((3,), PAD)
        assert torch.equal(targets[:, i], want)
    again, _ = delayed_copy(3, 9, 12, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again, ids)


def _repeated(n):
    """A sequence of n distinct tokens, then the same n tokens again: (2n,)."""
    first = torch.randperm(20, generator=torch.Generator().manual_seed(n))[:n] + N_SPECIAL
    return torch.cat([first, first])


@pytest.mark.parametrize("n", [3, 5, 8])
def test_induction_score_of_hand_built_heads_M11_4(n):
    """On x_1..x_n x_1..x_n: a head whose query n+t attends only to position t+1 (the token after the first
    copy) scores 1; a previous-token head scores 0; uniform causal attention scores the mean of
    1/(n+t+1) over the second half's queries (one target each among n+t+1 keys)."""
    tokens = _repeated(n)
    L = 2 * n
    induction, previous = torch.zeros(L, L), torch.zeros(L, L)
    induction[0, 0] = previous[0, 0] = 1.0
    for i in range(1, L):
        previous[i, i - 1] = 1.0
        induction[i, i - n + 1 if i >= n else i - 1] = 1.0
    uniform = torch.tril(torch.ones(L, L)) / torch.arange(1, L + 1).unsqueeze(-1)
    assert induction_score(induction, tokens).item() == 1.0
    assert induction_score(previous, tokens).item() == 0.0
    want = sum(1 / (n + t + 1) for t in range(n)) / n
    assert abs(induction_score(uniform, tokens).item() - want) < 1e-6


def test_induction_score_broadcasts_heads_and_rejects_bad_input():
    """(B, H, L, L) weights with (B, 1, L) tokens: the mean over every head's queries."""
    tokens = _repeated(4)
    heads = torch.stack([torch.eye(8), torch.tril(torch.ones(8, 8)) / torch.arange(1, 9).unsqueeze(-1)])[None]
    both = induction_score(heads, tokens[None, None])
    separate = [induction_score(heads[0, h], tokens) for h in range(2)]
    assert abs(both.item() - sum(s.item() for s in separate) / 2) < 1e-6
    with pytest.raises(ValueError, match="no query has an earlier copy"):
        induction_score(torch.eye(4), torch.arange(4))
    with pytest.raises(ValueError, match="weights must be"):
        induction_score(torch.eye(4), torch.arange(5))
