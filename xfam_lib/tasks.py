"""Synthetic sequence tasks, generated on the fly (nothing is downloaded).

Token ids 0 and 1 are reserved: ``PAD = 0`` and ``BOS = 1``; data tokens are ``2 .. vocab-1``.
Every function takes a ``torch.Generator`` so batches are reproducible.
"""
from __future__ import annotations

import torch

from .utils import check_positive_int

__all__ = ["PAD", "BOS", "N_SPECIAL", "copy_task", "reverse_task", "associative_recall"]

PAD, BOS = 0, 1
N_SPECIAL = 2


def _tokens(batch: int, length: int, vocab: int, generator, device) -> torch.Tensor:
    check_positive_int("batch", batch)
    check_positive_int("length", length)
    check_positive_int("vocab", vocab)
    if vocab <= N_SPECIAL:
        raise ValueError(f"vocab must exceed the {N_SPECIAL} reserved ids (PAD, BOS), got {vocab}")
    return torch.randint(N_SPECIAL, vocab, (batch, length), generator=generator).to(device)


def copy_task(batch: int, length: int, vocab: int, *, generator: torch.Generator | None = None,
              device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, tgt)`` of shape ``(batch, length)`` with ``tgt == src``."""
    src = _tokens(batch, length, vocab, generator, device)
    return src, src.clone()


def reverse_task(batch: int, length: int, vocab: int, *, generator: torch.Generator | None = None,
                 device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, tgt)`` of shape ``(batch, length)`` with ``tgt`` the source read backwards."""
    src = _tokens(batch, length, vocab, generator, device)
    return src, src.flip(-1)


def associative_recall(batch: int, n_pairs: int, vocab: int, *, generator: torch.Generator | None = None,
                       device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-value recall: ``seq (batch, 2*n_pairs + 1)`` = ``k1 v1 k2 v2 ... kn vn q``, target ``(batch,)``.

    Keys within a sequence are distinct; the query ``q`` is one of them and the target is its value.
    Keys are drawn from the lower half of the data tokens and values from the upper half.
    """
    check_positive_int("n_pairs", n_pairs)
    n_data = vocab - N_SPECIAL
    n_keys = n_data // 2
    if n_keys < n_pairs or n_data - n_keys < 1:
        raise ValueError(f"vocab={vocab} leaves {n_keys} key tokens, fewer than n_pairs={n_pairs}")
    keys = torch.stack([torch.randperm(n_keys, generator=generator)[:n_pairs] for _ in range(batch)]) + N_SPECIAL
    values = torch.randint(N_SPECIAL + n_keys, vocab, (batch, n_pairs), generator=generator)
    which = torch.randint(0, n_pairs, (batch,), generator=generator)
    rows = torch.arange(batch)
    seq = torch.stack([keys, values], dim=-1).flatten(1)
    seq = torch.cat([seq, keys[rows, which][:, None]], dim=1)
    return seq.to(device), values[rows, which].to(device)
