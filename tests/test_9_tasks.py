"""Chapter 9 tasks and the small SSM language model of its experiments (METHODS M11.3, M11.4; M9.5, M9.7, M9.10)."""
import pytest
import torch

from xfam_lib.ablations import SSMLM, induction_heads_run, selective_copying_run
from xfam_lib.tasks import BOS, N_SPECIAL, PAD, induction_heads, selective_copying


def test_selective_copying_targets_are_the_data_tokens_in_order_M11_3():
    """M11.3: the answers are the non-noise tokens of the first `length` positions, in order, at the markers;
    every other target is PAD (ignored); data tokens are never PAD or BOS."""
    inputs, targets = selective_copying(50, 20, 5, 12, generator=torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (50, 25)
    for b in range(50):
        body = inputs[b, :20]
        data = body[body != PAD]
        assert len(data) == 5 and bool((data >= N_SPECIAL).all()) and int(data.max()) < 12
        assert torch.equal(targets[b, 20:], data)
        assert bool((inputs[b, 20:] == BOS).all()) and bool((targets[b, :20] == PAD).all())
    again, _ = selective_copying(50, 20, 5, 12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(inputs, again)


def test_selective_copying_positions_vary_so_no_fixed_lag_finds_the_data_M11_3():
    """M11.3: where the data sit varies between rows: every one of the `length` positions holds a data token in
    some rows and noise in others (a time-invariant model cannot know where to look)."""
    inputs, _ = selective_copying(400, 16, 4, 10, generator=torch.Generator().manual_seed(1))
    share = (inputs[:, :16] != PAD).double().mean(0)                  # per position: fraction of rows with data
    assert bool((share > 0.1).all()) and bool((share < 0.5).all())   # expected 4/16 = 0.25 everywhere (400 rows)


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(length=3, n_tokens=4), ValueError, "n_tokens=4 .* length=3"),
    (dict(n_tokens=0), ValueError, "n_tokens"),
    (dict(vocab=2), ValueError, "vocab"),
    (dict(length=8.0), TypeError, "length"),
])
def test_selective_copying_rejects_bad_sizes_M11_3(kwargs, exc, pattern):
    args = {**dict(batch=2, length=8, n_tokens=2, vocab=10), **kwargs}
    with pytest.raises(exc, match=pattern):
        selective_copying(**args)


def test_induction_heads_answer_is_the_token_after_the_first_trigger_M11_4():
    """M11.4: BOS appears exactly twice (somewhere before the last two positions, and last); the only target is
    at the last position and equals the token right after the first BOS."""
    inputs, targets = induction_heads(64, 30, 10, generator=torch.Generator().manual_seed(2))
    for b in range(64):
        where = (inputs[b] == BOS).nonzero().flatten().tolist()
        assert len(where) == 2 and where[1] == 29 and where[0] <= 27
        assert targets[b, -1].item() == inputs[b, where[0] + 1].item() >= N_SPECIAL
        assert bool((targets[b, :-1] == PAD).all())
    with pytest.raises(ValueError, match="length must be >= 3"):
        induction_heads(2, 2, 10)


@pytest.mark.parametrize("kind", ["s4d", "h3", "mamba"])
def test_ssmlm_is_causal_M9_5_M9_7_M9_10(kind):
    """SSMLM (the chapter's experiment model): logits before a changed token do not move; later ones do."""
    torch.manual_seed(0)
    model = SSMLM(kind, vocab=10, d_model=8, n_layers=2, d_state=4).double().eval()
    ids = torch.randint(0, 10, (2, 20), generator=torch.Generator().manual_seed(3))
    ids2 = ids.clone()
    ids2[:, 11] = (ids[:, 11] + 1) % 10
    with torch.no_grad():
        moved = (model(ids) - model(ids2)).abs().amax(dim=(0, 2))
    assert float(moved[:11].max()) < 1e-12 and float(moved[11:].min()) > 0
    with pytest.raises(ValueError, match="kind must be one of"):
        SSMLM("lstm", 10)


def test_selective_copying_run_learns_M11_3():
    """M11.3: a short Mamba run lowers the loss and beats chance on fresh sequences (seeded, deterministic)."""
    r = selective_copying_run("mamba", length=8, n_tokens=2, vocab=6, d_model=8, d_state=4, steps=60, batch=16, lr=1e-2)
    assert sum(r["losses"][-10:]) < sum(r["losses"][:10])
    assert r["accuracy"] > 2 * r["chance"]
    again = selective_copying_run("mamba", length=8, n_tokens=2, vocab=6, d_model=8, d_state=4, steps=60, batch=16, lr=1e-2)
    assert again["accuracy"] == r["accuracy"]


def test_induction_heads_run_reports_every_test_length_M11_4():
    r = induction_heads_run("s4d", train_len=8, test_lens=(8, 16), vocab=6, d_model=8, d_state=4, steps=5, batch=4,
                            eval_batch=32)
    assert set(r["accuracy"]) == {8, 16} and all(0 <= a <= 1 for a in r["accuracy"].values())
    assert len(r["losses"]) == 5
