"""Chapter 6 synthetic tasks: Graves's parity vectors and a permutation applied k times (M6.3), easy and hard tokens for early exit (M6.9), a language with one long-range dependency (M6.4)."""
import math

import pytest
import torch

from xfam_lib.tasks import ModeBigramLanguage, copy_or_recall, cyclic_permutation, parity_task, permutation_steps


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


def test_cyclic_permutation_is_one_cycle_M6_3():
    perm = cyclic_permutation(9, seed=4)
    seen, item = [], 0
    for _ in range(9):                                   # follow the cycle from item 0
        seen.append(item)
        item = perm[item].item()
    assert item == 0 and sorted(seen) == list(range(9))  # back at the start after exactly 9 moves, all visited
    assert torch.equal(perm, cyclic_permutation(9, seed=4))


def test_permutation_steps_applies_perm_k_times_M6_3():
    perm = cyclic_permutation(7, seed=1)
    start, k, target = permutation_steps(500, perm, 5, generator=torch.Generator().manual_seed(0))
    assert k.min().item() == 1 and k.max().item() == 5
    for s, kk, t in zip(start.tolist(), k.tolist(), target.tolist()):
        for _ in range(kk):
            s = perm[s].item()
        assert s == t
    with pytest.raises(ValueError, match="perm"):
        permutation_steps(4, torch.tensor([0, 0, 1]), 2)


def test_copy_or_recall_targets_M6_9():
    inputs, targets, hard = copy_or_recall(300, 3, 14, generator=torch.Generator().manual_seed(0))
    assert torch.equal(targets[~hard], inputs[~hard])                       # easy tokens: the token itself
    for row_in, row_t in zip(inputs.tolist(), targets.tolist()):
        pairs = dict(zip(row_in[0:6:2], row_in[1:6:2]))
        assert len(pairs) == 3                                              # distinct keys
        assert sorted(row_in[6:]) == sorted(pairs)                          # every key queried once
        assert row_t[6:] == [pairs[q] for q in row_in[6:]]                  # the value paired with the query
    assert hard[:, 6:].all() and not hard[:, :6].any()
    with pytest.raises(ValueError, match="n_pairs"):
        copy_or_recall(2, 7, 14)


def test_mode_bigram_language_rule_and_oracle_M6_4():
    lang = ModeBigramLanguage(12, n_modes=3, p_rule=0.8, seed=2)
    tokens, logp = lang.sample(400, 20, generator=torch.Generator().manual_seed(0))
    mode = tokens[:, 0]
    assert mode.max().item() < 3 and tokens[:, 1:].min().item() >= 3           # a mode token, then data tokens
    n_data = 12 - 3
    for row, lp in zip(tokens[:5].tolist(), logp[:5].tolist()):                 # the oracle, token by token
        m = row[0]
        for t in range(2, 20):
            hit = lang.perms[m, row[t - 1] - 3].item() == row[t]
            assert abs(lp[t] - math.log(0.2 / n_data + 0.8 * hit)) < 1e-12
    hits = (tokens[:, 2:] == lang.perms[mode[:, None], tokens[:, 1:-1] - 3]).double().mean().item()
    assert abs(hits - (0.8 + 0.2 / n_data)) < 0.02                             # the rule's share (4 s.e. of 7200 draws)
    with pytest.raises(ValueError, match="p_rule"):
        ModeBigramLanguage(12, p_rule=1.0)
