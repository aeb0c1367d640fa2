"""Chapter 8's recall task: multi-query associative recall (M11.2) and the recall models trained on it."""
import pytest
import torch

from xfam_lib.tasks import N_SPECIAL, PAD, mqar, mqar_zoology


def test_mqar_answers_are_the_paired_values_M11_2():
    """M11.2: each query's target is the value that followed that key; keys never repeat in a sequence."""
    gen = torch.Generator().manual_seed(0)
    n_pairs, n_queries, vocab = 6, 4, 30
    inputs, targets = mqar(50, n_pairs, vocab, n_queries=n_queries, generator=gen)
    assert inputs.shape == targets.shape == (50, 2 * n_pairs + n_queries)
    for row, tgt in zip(inputs.tolist(), targets.tolist()):
        keys, values = row[0:2 * n_pairs:2], row[1:2 * n_pairs:2]
        assert len(set(keys)) == n_pairs
        n_keys = (vocab - N_SPECIAL) // 2
        assert all(N_SPECIAL <= k < N_SPECIAL + n_keys for k in keys)
        assert all(N_SPECIAL + n_keys <= v < vocab for v in values)
        assert tgt[:2 * n_pairs] == [PAD] * (2 * n_pairs)
        queries = row[2 * n_pairs:]
        assert len(set(queries)) == n_queries
        for q, t in zip(queries, tgt[2 * n_pairs:]):
            assert t == values[keys.index(q)]


def test_mqar_seeded_and_default_queries_M11_2():
    a = mqar(3, 5, 20, generator=torch.Generator().manual_seed(1))
    b = mqar(3, 5, 20, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[0].shape[1] == 2 * 5 + 5                        # n_queries defaults to n_pairs


def test_mqar_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="n_queries"):
        mqar(2, 3, 20, n_queries=4)
    with pytest.raises(ValueError, match="vocab"):
        mqar(2, 10, 12)
    with pytest.raises(TypeError, match="n_pairs"):
        mqar(2, 2.5, 20)


def test_mqar_zoology_layout_M11_2():
    """Zoology's form: distinct keys and distinct values, then every key asked once at an even offset of
    the stretch after the pairs, its target the paired value, PAD everywhere else."""
    n_pairs, vocab, seq_len = 5, 40, 32
    inputs, targets = mqar_zoology(200, n_pairs, vocab, seq_len, generator=torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (200, seq_len)
    n_keys = (vocab - N_SPECIAL) // 2
    noise = set()
    for row, tgt in zip(inputs.tolist(), targets.tolist()):
        keys, values = row[0:2 * n_pairs:2], row[1:2 * n_pairs:2]
        assert len(set(keys)) == len(set(values)) == n_pairs
        assert all(N_SPECIAL <= k < N_SPECIAL + n_keys <= v < vocab for k, v in zip(keys, values))
        asked = [i for i, t in enumerate(tgt) if t != PAD]
        assert len(asked) == n_pairs and all(i >= 2 * n_pairs and (i - 2 * n_pairs) % 2 == 0 for i in asked)
        assert sorted(row[i] for i in asked) == sorted(keys)
        assert all(tgt[i] == values[keys.index(row[i])] for i in asked)
        noise |= {row[i] for i in range(2 * n_pairs, seq_len) if i not in asked}
    assert noise == set(range(N_SPECIAL, vocab))          # the noise covers the whole vocabulary


def test_mqar_zoology_query_offsets_follow_the_power_law_M11_2():
    """With one pair the query's slot g (1-based) is drawn with probability g^(a-1) / sum: a chi-square
    statistic against those probabilities stays below the 0.999 quantile (about 32 for 9 degrees of
    freedom), and fails for uniform offsets."""
    slots, batch, a = 10, 20_000, 0.5
    inputs, targets = mqar_zoology(batch, 1, 12, 2 + 2 * slots, power_a=a,
                                   generator=torch.Generator().manual_seed(3))
    g = ((targets != PAD).nonzero()[:, 1] - 2) // 2
    counts = torch.bincount(g, minlength=slots).double()
    p = torch.arange(1, slots + 1, dtype=torch.float64) ** (a - 1)
    p /= p.sum()
    chi2 = lambda probs: (((counts - batch * probs) ** 2) / (batch * probs)).sum().item()
    assert chi2(p) < 32 < chi2(torch.full((slots,), 1 / slots, dtype=torch.float64))


def test_mqar_zoology_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="seq_len=12 leaves 1 query slots"):
        mqar_zoology(2, 5, 40, 12)
    with pytest.raises(ValueError, match="vocab=12"):
        mqar_zoology(2, 6, 12, 40)
    with pytest.raises(ValueError, match="power_a"):
        mqar_zoology(2, 2, 40, 20, power_a=0.0)


@pytest.mark.parametrize("mixer", ["softmax", "linear"])
def test_recall_net_is_causal_M8_9(mixer):
    """Changing token 9 leaves the logits at positions 0..8 unchanged and moves later ones (both mixers)."""
    from xfam_lib.ablations import RecallNet

    torch.manual_seed(0)
    model = RecallNet(20, d_model=16, n_heads=2, n_layers=2, mixer=mixer, max_len=24).double().eval()
    ids = torch.randint(2, 20, (2, 24), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 9] = 2 + (ids[:, 9] - 1) % 18
    with torch.no_grad():
        delta = (model(ids) - model(changed)).abs().amax((0, 2))
    assert delta[:9].max() == 0 and delta[9:].min() > 0


def test_recall_net_bad_input():
    from xfam_lib.ablations import RecallNet

    with pytest.raises(ValueError, match="mixer"):
        RecallNet(20, mixer="lstm")
    with pytest.raises(ValueError, match="n_heads"):
        RecallNet(20, d_model=10, n_heads=3)
