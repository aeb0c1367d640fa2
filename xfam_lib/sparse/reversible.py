"""Memory for depth (chapter 7): reversible residual blocks, chunked feed-forward layers and
recomputation."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..utils import check_positive_int, check_tensor


class RevBlock(nn.Module):
    """Reversible residual block (Gomez et al. 2017): ``y1 = x1 + F(x2)``, ``y2 = x2 + G(y1)``.

    `inverse` recovers ``x2 = y2 - G(y1)``, ``x1 = y1 - F(x2)`` from the outputs alone, so a stack of
    them need not store its activations (`reversible_sequence`). ``F`` and ``G`` must be deterministic
    (no dropout) and map ``(..., d)`` to ``(..., d)``.
    """

    def __init__(self, F: nn.Module, G: nn.Module):
        super().__init__()
        self.F, self.G = F, G

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y1 = x1 + self.F(x2)
        return y1, x2 + self.G(y1)

    def inverse(self, y1: torch.Tensor, y2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x2 = y2 - self.G(y1)
        return y1 - self.F(x2), x2


class _Reversible(torch.autograd.Function):
    """Runs the blocks without a graph; backward rebuilds each block's input with `RevBlock.inverse`,
    recomputes that block with a graph and backpropagates through it, one block at a time."""

    @staticmethod
    def forward(ctx, x1, x2, blocks, *params):
        with torch.no_grad():
            for block in blocks:
                x1, x2 = block(x1, x2)
        ctx.blocks = blocks
        ctx.save_for_backward(x1, x2)
        return x1, x2

    @staticmethod
    def backward(ctx, dy1, dy2):
        y1, y2 = ctx.saved_tensors
        grads = []
        for block in reversed(ctx.blocks):
            with torch.no_grad():
                x1, x2 = block.inverse(y1, y2)
            with torch.enable_grad():
                a, b = x1.detach().requires_grad_(), x2.detach().requires_grad_()
                params = [p for p in block.parameters() if p.requires_grad]
                out = block(a, b)
                g = torch.autograd.grad(out, [a, b] + params, (dy1, dy2), allow_unused=True)
            dy1, dy2 = g[0], g[1]
            grads = list(g[2:]) + grads
            y1, y2 = x1, x2
        return (dy1, dy2, None, *grads)


def reversible_sequence(blocks, x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply `RevBlock` s in order, storing only the final outputs: activation memory does not grow with
    depth, and the backward pass recomputes each block from its reconstructed input. Outputs
    and gradients equal the plain ``for block in blocks: x1, x2 = block(x1, x2)`` up to rounding."""
    blocks = list(blocks)
    if not blocks or not all(isinstance(b, RevBlock) for b in blocks):
        raise TypeError(f"blocks must be a non-empty sequence of RevBlock, got {[type(b).__name__ for b in blocks]}")
    check_tensor("x1", x1, floating=True)
    check_tensor("x2", x2, floating=True)
    if x1.shape != x2.shape:
        raise ValueError(f"x1 and x2 must have the same shape, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    params = [p for b in blocks for p in b.parameters() if p.requires_grad]
    return _Reversible.apply(x1, x2, blocks, *params)


def chunked_ff(ff, x: torch.Tensor, n_chunks: int) -> torch.Tensor:
    """Position-wise feed-forward ``ff`` applied to ``n_chunks`` slices of the sequence (dim -2) in turn
    (Reformer): the hidden ``(..., L, d_ff)`` activation exists for ``L / n_chunks`` rows at a
    time. Equal to ``ff(x)`` because ``ff`` acts on each position separately; a ragged last chunk is fine."""
    check_tensor("x", x, min_rank=2)
    n_chunks = check_positive_int("n_chunks", n_chunks)
    return torch.cat([ff(part) for part in torch.tensor_split(x, n_chunks, dim=-2)], dim=-2)


def checkpointed_sequence(blocks, x: torch.Tensor) -> torch.Tensor:
    """Apply ``blocks`` in order, keeping only each block's input for backward and recomputing its inside
    (gradient checkpointing, Chen et al. 2016). Gradients equal the plain loop's."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("blocks must be a non-empty sequence of modules")
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return x
