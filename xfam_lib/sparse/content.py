"""Content-based sparsity (chapter 7): LSH attention as in Reformer and the
Routing Transformer's k-means clusters."""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from ..attention import causal_mask, merge_partials
from ..utils import check_block_size, check_positive_int, check_qkv, check_tensor, compute_dtype, resolve_scale


def lsh_rotations(d: int, n_buckets: int, n_rounds: int, seed: int, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """The random rotations ``(n_rounds, d, n_buckets/2)`` of `lsh_hash`: i.i.d. N(0, 1) entries drawn from a
    CPU ``torch.Generator`` seeded with ``seed`` (same seed, same rotations, on any device)."""
    d = check_positive_int("d", d)
    n_buckets = check_positive_int("n_buckets", n_buckets)
    if n_buckets % 2:
        raise ValueError(f"n_buckets must be even (the hash is argmax over [xR, -xR]), got {n_buckets}")
    n_rounds = check_positive_int("n_rounds", n_rounds)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r}")
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(n_rounds, d, n_buckets // 2, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)


def lsh_hash(x: torch.Tensor, n_buckets: int, n_rounds: int = 1, seed: int = 0) -> torch.Tensor:
    """Angular LSH by random rotations (Andoni et al. 2015 as used by Kitaev et al. 2020).

    ``x (..., L, d)`` → bucket ids ``(..., n_rounds, L)`` in ``[0, n_buckets)``:
    ``h(x) = argmax([xR; -xR])`` with ``R`` of `lsh_rotations` (one per round, shared by all leading
    dims). Nearby directions tend to share a bucket; the chance falls with the angle between them.
    ``n_buckets`` must be even.
    """
    check_tensor("x", x, min_rank=2, floating=True)
    rot = lsh_rotations(x.shape[-1], n_buckets, n_rounds, seed, device=x.device,
                        dtype=compute_dtype(x.dtype))
    proj = torch.einsum("...ld,rdb->...rlb", x.to(rot.dtype), rot)                   # (..., R, L, b/2)
    return torch.cat([proj, -proj], dim=-1).argmax(dim=-1)


def lsh_collision_rate(theta: float, n_buckets: int, *, n_pairs: int = 2000, d: int = 16, n_rounds: int = 8,
                       seed: int = 0) -> float:
    """Fraction of unit-vector pairs at angle ``theta`` (radians) that `lsh_hash` puts in the same bucket,
    over ``n_pairs`` random pairs in ``d`` dimensions and ``n_rounds`` rounds of rotations.

    With 2 buckets the hash is the side of a random hyperplane, so the rate estimates ``1 - theta / pi``.
    """
    n_pairs, d = check_positive_int("n_pairs", n_pairs), check_positive_int("d", d)
    if d < 2:
        raise ValueError(f"d must be >= 2 to hold two directions at an angle, got {d}")
    gen = torch.Generator().manual_seed(int(seed))
    a = F.normalize(torch.randn(n_pairs, d, generator=gen, dtype=torch.float64), dim=-1)
    b = torch.randn(n_pairs, d, generator=gen, dtype=torch.float64)
    b = F.normalize(b - (b * a).sum(-1, keepdim=True) * a, dim=-1)                  # unit, orthogonal to a
    c = math.cos(theta) * a + math.sin(theta) * b                                   # at angle theta from a
    rot_seed = int(seed) + 1
    return (lsh_hash(a, n_buckets, n_rounds, rot_seed) == lsh_hash(c, n_buckets, n_rounds, rot_seed)).double().mean().item()


SELF_LOGIT = -1e5          # shared QK: a query's own logit (HF Reformer's value); finite, so a lone query still attends itself


def _check_shared_qk(qk, v) -> None:
    check_tensor("qk", qk, min_rank=2, floating=True)
    check_tensor("v", v, min_rank=2, floating=True)
    if qk.shape[:-1] != v.shape[:-1] or qk.dtype != v.dtype or qk.device != v.device:
        raise ValueError(f"qk and v must agree in every dim but the last, dtype and device, got qk {tuple(qk.shape)} "
                         f"{qk.dtype} and v {tuple(v.shape)} {v.dtype}")


def _lse_attention(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax(scores) @ v and the rows' logsumexp; a row of ``-inf`` gives zeros and ``-inf``."""
    m = scores.detach().amax(dim=-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    e = torch.exp(scores - m)
    total = e.sum(dim=-1, keepdim=True)
    has_key = total > 0
    total = torch.where(has_key, total, torch.ones_like(total))
    lse = torch.where(has_key, m + torch.log(total), float("-inf")).squeeze(-1)
    return torch.matmul(e / total, v), lse


def _lsh_buckets(qk, n_buckets, n_rounds, seed, buckets):
    if buckets is None:
        return lsh_hash(qk, n_buckets, n_rounds, seed)
    check_tensor("buckets", buckets)
    if buckets.dtype.is_floating_point or buckets.dtype == torch.bool or \
            tuple(buckets.shape) != tuple(qk.shape[:-2]) + (n_rounds, qk.shape[-2]):
        raise ValueError(f"buckets must be integer ids of shape {tuple(qk.shape[:-2]) + (n_rounds, qk.shape[-2])} "
                         f"(..., n_rounds, L) for qk {tuple(qk.shape)}, got {tuple(buckets.shape)} {buckets.dtype}")
    return buckets.to(qk.device).long()


def lsh_attention(qk: torch.Tensor, v: torch.Tensor, n_buckets: int, chunk_len: int, n_rounds: int = 1,
                  seed: int = 0, causal: bool = False, *, scale: float | None = None,
                  buckets: torch.Tensor | None = None) -> torch.Tensor:
    """Reformer LSH attention (Kitaev et al. 2020): shared QK, sort by bucket, attend in chunks.

    ``qk (..., L, d)``, ``v (..., L, d_v)`` → ``(..., L, d_v)``. Keys are ``qk / ||qk||``.
    Each round hashes ``qk`` (`lsh_hash`, or the given ``buckets (..., n_rounds, L)``), sorts the
    positions by (bucket, position), cuts the sorted order into chunks of ``chunk_len`` (the last
    padded), and lets every chunk attend to itself and the chunk before it (cyclically), as the
    reference implementations do (keys of another bucket inside that window are not masked). A
    query's own key gets the logit `SELF_LOGIT`, so it is used only when nothing else is allowed;
    ``causal`` forbids later positions. The rounds are combined with their logsumexps,
    ``out = Σ_r exp(lse_r - lse) out_r`` (a key found in several rounds counts in each). With one
    chunk holding the whole sequence this is full shared-QK attention with self-masking.
    fp16/bf16 computed in fp32. `lsh_attention_reference` is the same computation with dense masks.
    """
    _check_shared_qk(qk, v)
    chunk_len = check_block_size("chunk_len", chunk_len)
    n_rounds = check_positive_int("n_rounds", n_rounds)
    bk = _lsh_buckets(qk, n_buckets, n_rounds, seed, buckets)
    length, d_v = qk.shape[-2], v.shape[-1]
    scale = resolve_scale(scale, qk.shape[-1])
    in_dtype = qk.dtype
    work = compute_dtype(in_dtype)
    qk, v = qk.to(work), v.to(work)
    keys = F.normalize(qk, dim=-1)

    pos = torch.arange(length, device=qk.device)
    order = torch.argsort(bk * length + pos, dim=-1)                                   # (..., R, L)
    n_chunks = -(-length // chunk_len)
    pad = n_chunks * chunk_len - length

    def sort_chunk(t):                                                                  # (..., R, n, c, d)
        t = t.unsqueeze(-3).expand(*t.shape[:-2], n_rounds, length, t.shape[-1])
        t = t.gather(-2, order.unsqueeze(-1).expand(*order.shape, t.shape[-1]))
        return F.pad(t, (0, 0, 0, pad)).unflatten(-2, (n_chunks, chunk_len))

    def with_previous(t):                                                               # keys of chunk and chunk-1
        return t if n_chunks == 1 else torch.cat([t, t.roll(1, dims=-3)], dim=-2)

    sq, sk, sv = sort_chunk(qk), with_previous(sort_chunk(keys)), with_previous(sort_chunk(v))
    pq = F.pad(order, (0, pad), value=-1).unflatten(-1, (n_chunks, chunk_len))        # positions, -1 = padding
    pk = with_previous(pq.unsqueeze(-1)).squeeze(-1)
    scores = torch.matmul(sq, sk.transpose(-2, -1)) * scale                             # (..., R, n, c, c or 2c)
    same = pq.unsqueeze(-1) == pk.unsqueeze(-2)
    scores = scores.masked_fill(same, SELF_LOGIT)
    banned = (pk < 0).unsqueeze(-2).expand_as(scores)
    if causal:
        banned = banned | (pk.unsqueeze(-2) > pq.unsqueeze(-1))
    out, lse = _lse_attention(scores.masked_fill(banned, float("-inf")), sv)

    undo = torch.argsort(order, dim=-1)                                                 # back to positions
    out = out.flatten(-3, -2)[..., :length, :].gather(-2, undo.unsqueeze(-1).expand(*undo.shape, d_v))
    lse = lse.flatten(-2, -1)[..., :length].gather(-1, undo)
    out, _ = merge_partials(out.unbind(-3), lse.unbind(-2))
    return out.to(in_dtype)


def lsh_pairs(buckets: torch.Tensor, chunk_len: int, causal: bool = False) -> torch.Tensor:
    """The (query, key) pairs `lsh_attention` scores, as a boolean mask ``(..., L, L)``, from the
    bucket ids ``buckets (..., n_rounds, L)``: the union over rounds of "the key sits in the query's
    chunk of the sorted order or in the chunk before it (cyclically)", and ``j <= i`` if ``causal``.
    ``nnz / L²`` of this mask is LSH attention's density, to set against a fixed pattern's."""
    check_tensor("buckets", buckets, min_rank=2)
    if buckets.dtype.is_floating_point or buckets.dtype == torch.bool:
        raise ValueError(f"buckets must be integer ids (..., n_rounds, L), got {buckets.dtype}")
    chunk_len = check_block_size("chunk_len", chunk_len)
    length = buckets.shape[-1]
    pos = torch.arange(length, device=buckets.device)
    order = torch.argsort(buckets.long() * length + pos, dim=-1)
    chunk = torch.argsort(order, dim=-1) // chunk_len                                  # (..., R, L)
    n_chunks = -(-length // chunk_len)
    ci, cj = chunk.unsqueeze(-1), chunk.unsqueeze(-2)
    allowed = ((ci == cj) | (cj == (ci - 1) % n_chunks)).any(dim=-3)
    if causal:
        allowed = allowed & (pos[None, :] <= pos[:, None])
    return allowed


def lsh_attention_reference(qk: torch.Tensor, v: torch.Tensor, buckets: torch.Tensor, chunk_len: int,
                            causal: bool = False, *, scale: float | None = None) -> torch.Tensor:
    """`lsh_attention` written with dense masks, for reading and testing: ``qk (L, d)``, ``v (L, d_v)``,
    ``buckets (n_rounds, L)``. Per round, a Python loop marks which (query, key) pairs share a chunk or
    sit in neighbouring chunks of the sorted order; dense attention with that mask, the self logit and
    causality gives ``(out_r, lse_r)``, and the rounds are merged by logsumexp."""
    check_tensor("qk", qk, rank=2, floating=True)
    check_tensor("buckets", buckets, rank=2)
    length = qk.shape[0]
    scale = resolve_scale(scale, qk.shape[-1])
    scores = (qk @ F.normalize(qk, dim=-1).T) * scale
    scores = scores.masked_fill(torch.eye(length, dtype=torch.bool, device=qk.device), SELF_LOGIT)
    n_chunks = -(-length // chunk_len)
    outs, lses = [], []
    for round_buckets in buckets.tolist():
        order = sorted(range(length), key=lambda i: (round_buckets[i], i))
        chunk = {pos: rank // chunk_len for rank, pos in enumerate(order)}
        allowed = torch.zeros(length, length, dtype=torch.bool)
        for i in range(length):
            for j in range(length):
                allowed[i, j] = chunk[j] in (chunk[i], (chunk[i] - 1) % n_chunks) and not (causal and j > i)
        out, lse = _lse_attention(scores.masked_fill(~allowed.to(qk.device), float("-inf")), v)
        outs.append(out)
        lses.append(lse)
    return merge_partials(outs, lses)[0]


def _check_centroids(x, centroids):
    check_tensor("centroids", centroids, rank=2, floating=True)
    if centroids.shape[-1] != x.shape[-1]:
        raise ValueError(f"centroids (k, d) must have d = {x.shape[-1]} like x {tuple(x.shape)}, got "
                         f"{tuple(centroids.shape)}")


def routing_assign(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Cluster of each vector ``x (..., L, d)`` → ``(..., L)``: the centroid ``(k, d)`` of largest cosine
    similarity, ``argmax_c <x/|x|, mu_c/|mu_c|>`` (nearest centroid on the unit sphere)."""
    check_tensor("x", x, min_rank=1, floating=True)
    _check_centroids(x, centroids)
    work = compute_dtype(x.dtype)
    sim = F.normalize(x.to(work), dim=-1) @ F.normalize(centroids.to(work), dim=-1).T
    return sim.argmax(dim=-1)


def routing_mask(q: torch.Tensor, k: torch.Tensor, centroids: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Routing Transformer mask ``(..., Lq, Lk)`` (Roy et al. 2021): query ``i`` may attend key ``j``
    iff both are routed to the same centroid (and ``j <= i`` with ``causal``, bottom-right aligned)."""
    check_tensor("q", q, min_rank=2, floating=True)
    check_tensor("k", k, min_rank=2, floating=True)
    mask = routing_assign(q, centroids).unsqueeze(-1) == routing_assign(k, centroids).unsqueeze(-2)
    if causal:
        mask = mask & causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    return mask


def kmeans_ema_update(centroids: torch.Tensor, x: torch.Tensor, assignments: torch.Tensor,
                      decay: float = 0.999) -> torch.Tensor:
    """One online k-means step: ``mu_c <- decay mu_c + (1 - decay) mean{x_i : a_i = c}``.

    ``centroids (k, d)``, ``x (N, d)`` (any leading dims are flattened), ``assignments`` the matching
    cluster ids. A cluster with no member keeps its centroid. Returns new centroids, no gradient.
    """
    check_tensor("x", x, min_rank=1, floating=True)
    _check_centroids(x, centroids)
    if not 0.0 <= float(decay) <= 1.0:
        raise ValueError(f"decay must lie in [0, 1], got {decay}")
    if tuple(assignments.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"assignments must have shape {tuple(x.shape[:-1])} (x without its last dim) for x "
                         f"{tuple(x.shape)}, got {tuple(assignments.shape)}")
    with torch.no_grad():
        n_c = centroids.shape[0]
        a = assignments.reshape(-1).long()
        if a.numel() and (int(a.min()) < 0 or int(a.max()) >= n_c):
            raise ValueError(f"assignments must lie in [0, {n_c}) for {n_c} centroids")
        flat = x.detach().reshape(-1, x.shape[-1]).to(centroids.dtype)
        sums = torch.zeros_like(centroids).index_add(0, a, flat)
        counts = torch.zeros(n_c, dtype=centroids.dtype, device=centroids.device).index_add(
            0, a, torch.ones_like(a, dtype=centroids.dtype))
        means = sums / counts.clamp(min=1).unsqueeze(-1)
        updated = decay * centroids + (1 - decay) * means
        return torch.where((counts > 0).unsqueeze(-1), updated, centroids)


def routing_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, centroids: torch.Tensor, window: int, *,
                      scale: float | None = None) -> torch.Tensor:
    """Balanced routing attention as the Routing Transformer code runs it: ``q (..., Lq, d)``,
    ``k (..., Lk, d)``, ``v (..., Lk, d_v)``, ``centroids (C, d)`` → ``(..., Lq, d_v)``, non-causal.

    Cluster ``c`` takes the ``window`` queries and the ``window`` keys most similar to it (cosine, as in
    `routing_assign`), so every cluster has the same size; its queries attend its keys (``window x
    window`` scores per cluster, ``C · window²`` in all). A query routed to several clusters gets the
    mean of its outputs, one routed to none gets zeros. Equals, per cluster, `dense_masked_attention`
    with the mask "query in the cluster and key in the cluster", averaged.
    """
    check_qkv(q, k, v)
    _check_centroids(q, centroids)
    window = check_positive_int("window", window)
    if window > min(q.shape[-2], k.shape[-2]):
        raise ValueError(f"window={window} must be <= both lengths, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    scale = resolve_scale(scale, q.shape[-1])
    in_dtype = q.dtype
    work = compute_dtype(in_dtype)
    q, k, v = (t.to(work) for t in (q, k, v))
    mu = F.normalize(centroids.to(work), dim=-1)
    n_c = mu.shape[0]

    def members(x):                                                     # (..., C, window) token ids per cluster
        return (F.normalize(x, dim=-1) @ mu.T).topk(window, dim=-2).indices.transpose(-2, -1)

    def select(x, idx):                                                 # (..., C, window, d)
        x = x.unsqueeze(-3).expand(*x.shape[:-2], n_c, *x.shape[-2:])
        return x.gather(-2, idx.unsqueeze(-1).expand(*idx.shape, x.shape[-1]))

    qi, ki = members(q), members(k)
    weights = torch.softmax(torch.matmul(select(q, qi), select(k, ki).transpose(-2, -1)) * scale, dim=-1)
    per_cluster = torch.matmul(weights, select(v, ki)).flatten(-3, -2)                # (..., C * window, d_v)
    flat = qi.flatten(-2, -1)
    index = flat.unsqueeze(-1).expand_as(per_cluster)
    total = per_cluster.new_zeros(*q.shape[:-1], v.shape[-1]).scatter_add(-2, index, per_cluster)
    count = per_cluster.new_zeros(q.shape[:-1]).scatter_add(-1, flat, torch.ones_like(flat, dtype=work))
    return (total / count.clamp(min=1).unsqueeze(-1)).to(in_dtype)
