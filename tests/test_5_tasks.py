"""Synthetic tasks of chapter 5: the long-range (delayed) copy used for Transformer-XL (M5.1)."""
import pytest
import torch

from xfam_lib.tasks import N_SPECIAL, PAD, delayed_copy


def test_delayed_copy_targets_are_the_tokens_delay_steps_back_M5_1():
    g = torch.Generator().manual_seed(0)
    ids, tgt = delayed_copy(3, 40, 10, 24, generator=g)
    for b in range(3):
        for i in range(40):
            expected = PAD if i < 24 else ids[b, i - 24].item()
            assert tgt[b, i].item() == expected
    assert ids.min() >= N_SPECIAL and ids.max() < 10                      # data tokens only, never PAD
    again, _ = delayed_copy(3, 40, 10, 24, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ids, again)


def test_delayed_copy_is_unpredictable_from_the_recent_window_M5_1():
    """Targets are independent of the last `delay` tokens: a copy of the current token is right only at
    chance, 1 / (vocab - N_SPECIAL)."""
    ids, tgt = delayed_copy(256, 64, 10, 16, generator=torch.Generator().manual_seed(1))
    hit = (ids[:, 16:] == tgt[:, 16:]).double().mean().item()
    assert abs(hit - 1 / (10 - N_SPECIAL)) < 0.02                         # 12288 draws: std 0.003


@pytest.mark.parametrize("delay, exc", [(0, ValueError), (40, ValueError), (2.5, TypeError)])
def test_delayed_copy_rejects_bad_delay(delay, exc):
    with pytest.raises(exc, match="delay"):
        delayed_copy(2, 40, 10, delay)
