"""Hierarchical softmax over a Huffman tree (Chapter 3).

A word's probability is the product of logistic left/right decisions along its path from the root,
so predicting one word costs its code length instead of ``|V|`` dot products; a Huffman tree puts
frequent words near the root (Morin & Bengio 2005; word2vec, Mikolov et al. 2013).
`hsoftmax_prob_loop` is the naive path product, `hsoftmax_logprob` the vectorised form.
"""
from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .utils import check_instance, check_int, check_tensor

__all__ = ["HuffmanTree", "huffman_tree", "hsoftmax_prob_loop", "hsoftmax_logprob"]


class HuffmanTree(NamedTuple):
    """A binary Huffman tree over ``V`` words, for hierarchical softmax.

    Internal nodes have ids ``0 .. V-2`` (the root is ``V-2``); each holds one vector of the
    model. ``paths[w]`` lists the internal nodes from the root down to word ``w`` and ``signs[w]``
    the branch taken at each: ``+1`` to the left child, ``-1`` to the right. ``len(paths[w])`` is
    the length of ``w``'s code: frequent words sit near the root.
    """

    paths: tuple[tuple[int, ...], ...]
    signs: tuple[tuple[int, ...], ...]

    @property
    def n_internal(self) -> int:
        return len(self.paths) - 1

    def depths(self) -> list[int]:
        """Code length (number of binary decisions) of every word."""
        return [len(p) for p in self.paths]


def huffman_tree(freqs) -> HuffmanTree:
    """Huffman tree of ``V >= 2`` positive word frequencies (any scale; they need not sum to 1).

    Repeatedly merges the two lightest subtrees (ties broken by creation order, so the tree is
    deterministic); the lighter one becomes the left child. The expected code length
    ``sum_w p_w len(paths[w])`` is the smallest any binary prefix code achieves (between the
    entropy in bits and one bit more).
    """
    weights = [float(f) for f in torch.as_tensor(freqs, dtype=torch.float64).reshape(-1)]
    if torch.as_tensor(freqs).dim() != 1 or len(weights) < 2 or not all(math.isfinite(w) and w > 0 for w in weights):
        raise ValueError(f"freqs must be a 1-D sequence of at least 2 positive finite numbers, got {freqs!r}")
    n_words = len(weights)
    heap = [(w, i, ("leaf", i)) for i, w in enumerate(weights)]
    heapq.heapify(heap)
    children: list[tuple[tuple[str, int], tuple[str, int]]] = []          # internal node id -> (left, right)
    order = n_words
    while len(heap) > 1:
        w_left, _, left = heapq.heappop(heap)
        w_right, _, right = heapq.heappop(heap)
        children.append((left, right))
        heapq.heappush(heap, (w_left + w_right, order, ("node", len(children) - 1)))
        order += 1
    paths: list[tuple[int, ...]] = [()] * n_words
    signs: list[tuple[int, ...]] = [()] * n_words
    stack = [(len(children) - 1, (), ())]                                  # (node, path so far, signs so far)
    while stack:
        node, path, sign = stack.pop()
        for child, s in zip(children[node], (1, -1)):
            kind, idx = child
            if kind == "leaf":
                paths[idx], signs[idx] = path + (node,), sign + (s,)
            else:
                stack.append((idx, path + (node,), sign + (s,)))
    return HuffmanTree(tuple(paths), tuple(signs))


def _check_hsoftmax(h: torch.Tensor, tree: HuffmanTree, node_vectors: torch.Tensor) -> None:
    check_instance("tree", tree, HuffmanTree)
    check_tensor("h", h, min_rank=1, floating=True)
    check_tensor("node_vectors", node_vectors, rank=2, floating=True)
    if node_vectors.shape != (tree.n_internal, h.shape[-1]):
        raise ValueError(f"node_vectors must be (V-1, d) = ({tree.n_internal}, {h.shape[-1]}) for this tree and h "
                         f"{tuple(h.shape)}, got {tuple(node_vectors.shape)}")


def hsoftmax_prob_loop(h: torch.Tensor, tree: HuffmanTree, node_vectors: torch.Tensor, word: int) -> torch.Tensor:
    """``p(word | h)`` as the product of the branch probabilities along the word's path (the naive form).

    ``p(w | h) = prod_j sigmoid(sign_j * v_{n_j} . h)`` over the internal nodes ``n_j`` on the path.
    ``h (..., d)``, ``node_vectors (V-1, d)`` → ``(...,)``.
    """
    _check_hsoftmax(h, tree, node_vectors)
    word = check_int("word", word, low=0, high=len(tree.paths) - 1)
    prob = torch.ones(h.shape[:-1], dtype=h.dtype, device=h.device)
    for node, sign in zip(tree.paths[word], tree.signs[word]):
        prob = prob * torch.sigmoid(sign * (h @ node_vectors[node]))
    return prob


def hsoftmax_logprob(h: torch.Tensor, tree: HuffmanTree, node_vectors: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of every word under hierarchical softmax: ``h (..., d)`` → ``(..., V)``.

    One matmul scores all ``V-1`` internal nodes, then each word sums ``log sigmoid(sign * score)``
    along its (padded) path. Because ``sigmoid(z) + sigmoid(-z) = 1`` at every node, the
    probabilities of all words sum to 1. Predicting one given word needs only its ``depth`` nodes
    (``O(log V)`` for a balanced tree) instead of all ``V`` output vectors. Halves are computed in
    fp32 and returned in their dtype. Equals `hsoftmax_prob_loop` word by word.
    """
    _check_hsoftmax(h, tree, node_vectors)
    work = torch.float32 if h.dtype in (torch.float16, torch.bfloat16) else h.dtype
    depth = max(tree.depths())
    idx = torch.zeros(len(tree.paths), depth, dtype=torch.long, device=h.device)
    sign = torch.zeros(len(tree.paths), depth, dtype=work, device=h.device)        # 0 marks padding
    for w, (path, s) in enumerate(zip(tree.paths, tree.signs)):
        idx[w, :len(path)] = torch.tensor(path, device=h.device)
        sign[w, :len(s)] = torch.tensor(s, dtype=work, device=h.device)
    scores = h.to(work) @ node_vectors.to(work).T                                 # (..., V-1)
    z = scores[..., idx] * sign                                                    # (..., V, depth)
    logp = (F.logsigmoid(z) * (sign != 0)).sum(dim=-1)
    return logp.to(h.dtype)
