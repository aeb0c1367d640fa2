"""Timing and peak memory on any device, and the cost models of Chapter 3 (FLOPs, bytes, caches).

`time_fn` reports the median of repeats after warm-up (synchronising CUDA); `time_ratios` times
several candidates in interleaved rounds, so that their ratios come from runs that saw the same
machine state. `peak_memory`
uses the CUDA allocator's statistics on a GPU and, on a CPU, counts the bytes of the storages
that ops allocate while the function runs, each until it is freed (a dispatch-level tracker:
exact for tensor storage, blind to allocator overhead, to scratch buffers inside fused kernels
and to memory outside torch). `largest_intermediate` reports the largest tensor any op allocates.
"""
from __future__ import annotations

import functools
import math
import numbers
import statistics
import time
import weakref
from typing import Callable, Hashable, NamedTuple

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .attention import repeat_kv, scaled_dot_product_attention

__all__ = [
    "time_fn", "time_ratios", "Timings", "peak_memory", "largest_intermediate", "memory_traffic", "measure_matmul_flops", "measure_bandwidth",
    "attention_flops", "linear_attention_flops", "rnn_flops", "conv_flops", "path_length", "attention_io_bytes", "Roofline", "roofline",
    "kv_cache_bytes", "paged_waste", "contiguous_waste", "adaptive_softmax_cost", "simulate_tensor_parallel",
]


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1,
            device: torch.device | str | None = None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Timings(NamedTuple):
    """Interleaved wall times in seconds: ``times[name]`` has one run per round."""
    median: dict[Hashable, float]     # median seconds of each candidate
    spread: dict[Hashable, float]     # (slowest - fastest) / median of each candidate's runs
    times: dict[Hashable, list[float]]

    def ratio(self, num: Hashable, den: Hashable) -> float:
        """Median over rounds of ``times[num] / times[den]`` (> 1: ``num`` was slower)."""
        for arg, name in (("num", num), ("den", den)):
            if name not in self.times:
                raise ValueError(f"{arg} must be one of {list(self.times)}, got {name!r}")
        return statistics.median(a / b for a, b in zip(self.times[num], self.times[den]))


def time_ratios(fns: dict[Hashable, Callable[[], object]], *, repeats: int = 5, warmup: int = 1,
                number: int = 1, device: torch.device | str | None = None) -> Timings:
    """Time every ``fns[name]()`` in ``repeats`` interleaved rounds after ``warmup`` rounds.

    Each round times every candidate once, the order reversing from round to round (A B C,
    C B A, A B C, ...), so a change of machine load hits all candidates alike; `Timings.ratio`
    then compares them round by round. A timed sample is ``number`` calls in a row (times are
    per call): samples much longer than the operating system's time slice see a busy machine's
    share of the CPU evenly, where one short call is either untouched or pre-empted.
    """
    if not isinstance(fns, dict) or not fns or not all(callable(f) for f in fns.values()):
        raise TypeError(f"fns must be a non-empty dict of callables, got {fns!r}")
    for name, value, least in (("repeats", repeats, 1), ("warmup", warmup, 0), ("number", number, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    _sync(device)
    times: dict[Hashable, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            for _ in range(number):
                fns[name]()
            _sync(device)
            times[name].append((time.perf_counter() - start) / number)
    median = {name: statistics.median(t) for name, t in times.items()}
    spread = {name: (max(t) - min(t)) / median[name] if median[name] > 0 else 0.0
              for name, t in times.items()}
    return Timings(median, spread, times)


class _LiveTensorBytes(TorchDispatchMode):
    """Tracks the bytes of storages created by ops while active, and their peak."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, tuple[weakref.ref, int]] = {}    # data_ptr -> (watcher, nbytes)

    def _release(self, key: int) -> None:
        entry = self._storages.pop(key, None)
        if entry is not None:
            self.live -= entry[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _returns_alias(func):            # views, in-place and out= ops allocate no new storage
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in self._storages:
                    # Watch the storage, not the tensor: a view or a detached alias can keep the
                    # storage alive after the tensor that created it is gone.
                    watcher = weakref.ref(storage, lambda _, key=key: self._release(key))
                    self._storages[key] = (watcher, nbytes)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
        return out


@functools.lru_cache(maxsize=None)
def _returns_alias(func) -> bool:
    """True for ops whose outputs alias an input (views, in-place and ``out=`` variants)."""
    schema = getattr(func, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes of tensor memory allocated while ``fn()`` runs, above what was live before.

    CUDA: ``torch.cuda.max_memory_allocated`` minus the starting allocation. CPU: the peak of
    live tensor storage created during the call (tensors returned by ``fn`` count while alive).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del result
        return int(peak)
    with _LiveTensorBytes() as tracker:
        result = fn()
    del result
    return int(tracker.peak)


# ----------------------------------------------------------------------------- largest intermediate
class _LargestNewTensor(TorchDispatchMode):
    """Records the largest tensor that any op allocates (views, in-place and ``out=`` results excluded)."""

    def __init__(self):
        super().__init__()
        self.numel, self.shape, self.op = 0, (), ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not _returns_alias(func):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                    self.numel, self.shape, self.op = t.numel(), tuple(t.shape), str(func)
        return out


def largest_intermediate(fn: Callable[[], object], *, detail: bool = False):
    """Number of elements of the largest tensor allocated while ``fn()`` runs (any device).

    Every op's fresh outputs count (temporaries included); views of existing tensors do not, since
    they allocate nothing. ``detail=True`` returns ``(numel, shape, op_name)``. Use it to show that
    tiled attention never builds an ``L x L`` tensor while the naive formula does.
    """
    with _LargestNewTensor() as tracker:
        result = fn()
    del result
    return (tracker.numel, tracker.shape, tracker.op) if detail else tracker.numel


# ----------------------------------------------------------------------------- memory traffic and machine balance
_NO_TRAFFIC = {"aten::empty", "aten::empty_like", "aten::empty_strided"}     # allocate without writing


class _Traffic(TorchDispatchMode):
    """Sums, per op, the bytes of its tensor inputs (reads) and of its outputs (writes); views move nothing."""

    def __init__(self):
        super().__init__()
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        inputs = [t for t in tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))[0]
                  if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        writes = any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)
        shared = {t.untyped_storage().data_ptr() for t in inputs}
        is_view = not writes and all(t.untyped_storage().data_ptr() in shared for t in outputs)
        if schema.name not in _NO_TRAFFIC and not is_view:
            moved = sum(t.numel() * t.element_size() for t in inputs + outputs)
            self.by_op[str(func)] = self.by_op.get(str(func), 0) + moved
        return out


def memory_traffic(fn: Callable[[], object], *, detail: bool = False):
    """Bytes read and written by the ops that ``fn()`` runs, op by op, on any device.

    Each op is charged the bytes of its tensor inputs (read) and outputs (written), as if every
    op went to main memory and back (no fusion, no cache reuse): the traffic model of
    `attention_io_bytes`, measured on a real code path. Views and bare allocations move nothing.
    ``detail=True`` returns ``(total, {op name: bytes})``.
    """
    with _Traffic() as tracker:
        result = fn()
    del result
    total = sum(tracker.by_op.values())
    return (total, dict(tracker.by_op)) if detail else total


def measure_matmul_flops(device: torch.device | str = "cpu", *, n: int = 1024, dtype: torch.dtype = torch.float32,
                         repeats: int = 5) -> float:
    """Rough peak FLOP/s of ``device``: the ``2 n^3`` FLOPs of an ``n x n`` matmul over its median time."""
    n = _positive("n", n)
    a, b = torch.randn(2, n, n, device=device).to(dtype)
    return 2 * n ** 3 / time_fn(lambda: a @ b, repeats=repeats, device=device)


def measure_bandwidth(device: torch.device | str = "cpu", *, nbytes: int = 2 ** 26, repeats: int = 5) -> float:
    """Rough main-memory bandwidth of ``device`` in bytes/s: a copy of ``nbytes`` reads and writes ``nbytes`` each.

    Take ``nbytes`` well above the caches (the default, 64 MiB, is above most CPUs' last-level cache).
    """
    src = torch.ones(_positive("nbytes", nbytes) // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / time_fn(lambda: dst.copy_(src), repeats=repeats, device=device)


# ----------------------------------------------------------------------------- cost models
def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _itemsize(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    return dtype.itemsize


def attention_flops(n: int, d: int, *, projections: bool = False) -> int:
    """FLOPs of one self-attention layer over ``n`` tokens of width ``d``: ``4 n^2 d``.

    Two matmuls, ``Q K^T`` and ``P V``, each ``2 n^2 d`` (a multiply-add is 2 FLOPs, as
    ``torch.utils.flop_counter`` counts; the softmax is not counted). ``projections=True`` adds the
    four ``d x d`` projections, ``8 n d^2``.
    """
    n, d = _positive("n", n), _positive("d", d)
    return 4 * n * n * d + (8 * n * d * d if projections else 0)


def linear_attention_flops(n: int, d_phi: int, d_v: int) -> int:
    """FLOPs of non-causal linear attention over ``n`` tokens: ``4 n d_phi d_v``.

    Two matmuls in the associative order, ``S = phi(K)^T V`` and ``phi(Q) S``, each ``2 n d_phi d_v``
    (normaliser and feature map not counted). Against `attention_flops`' ``4 n^2 d`` (with
    ``d_phi = d_v = d``) the ratio is ``n / d``: the reordering pays once ``n > d``.
    """
    n, d_phi, d_v = _positive("n", n), _positive("d_phi", d_phi), _positive("d_v", d_v)
    return 4 * n * d_phi * d_v


def rnn_flops(n: int, d: int, *, gates: int = 1) -> int:
    """FLOPs of a recurrent layer over ``n`` steps of width ``d``: ``4 gates n d^2``.

    Each gate computes ``x_t W_x + h_{t-1} W_h`` (two ``d x d`` products per step). ``gates=1`` is the
    plain ``h_t = tanh(x_t W_x + h_{t-1} W_h)``; an LSTM has 4 gates, a GRU 3.
    """
    n, d, gates = _positive("n", n), _positive("d", d), _positive("gates", gates)
    return 4 * gates * n * d * d


def conv_flops(n: int, d: int, kernel: int = 3) -> int:
    """FLOPs of a 1-D convolution, ``d`` to ``d`` channels, width ``kernel``, over ``n`` positions: ``2 k n d^2``."""
    n, d, kernel = _positive("n", n), _positive("d", d), _positive("kernel", kernel)
    return 2 * kernel * n * d * d


def path_length(kind: str, distance: int, kernel: int = 3) -> int:
    """Layers a signal needs to travel ``distance`` positions: attention 1, RNN ``distance``,
    contiguous convolution ``ceil(distance / (kernel - 1))`` (each layer widens the reach by ``kernel - 1``)."""
    if isinstance(distance, bool) or not isinstance(distance, numbers.Integral) or distance < 0:
        raise ValueError(f"distance must be a non-negative int, got {distance!r}")
    if distance == 0:
        return 0
    if kind == "attention":
        return 1
    if kind == "rnn":
        return int(distance)
    if kind == "conv":
        kernel = _positive("kernel", kernel)
        if kernel < 2:
            raise ValueError(f"kernel must be >= 2 for a convolution to reach other positions, got {kernel}")
        return -(-int(distance) // (kernel - 1))
    raise ValueError(f"kind must be 'attention', 'rnn' or 'conv', got {kind!r}")


def attention_io_bytes(n: int, d: int, dtype: torch.dtype = torch.float16, materialize: bool = True, *,
                       sram_bytes: int | None = None, block_q: int | None = None) -> int:
    """Bytes one attention head moves to and from main memory (HBM), ``n`` tokens, head width ``d``.

    ``materialize=True`` (unfused kernels): read ``Q, K, V`` and write ``O``, ``4 n d`` elements, plus
    writing and reading back the scores ``S`` and the probabilities ``P``, ``4 n^2``; the least a
    sequence of unfused kernels moves. ``materialize=False`` is a fused kernel. Without
    ``sram_bytes`` or ``block_q`` it is the floor ``4 n d``: every number moved once, as if whole rows
    of scores fit on chip.

    ``block_q=B_r`` counts the forward loop of FlashAttention-2 (Dao 2023, Algorithm 1), the loop
    `attention.tiled_attention` runs: for each of the ``T_r = ceil(n / B_r)`` query blocks, ``Q_i`` is
    read once, all of ``K`` and ``V`` are streamed past it, and ``O_i`` and its log-sum-exp (fp32,
    4 bytes a row) are written once: ``(2 n d + 2 T_r n d) b + 4 n`` bytes (``b`` bytes per number).
    No causal mask (every key block visited) and no cache reuse: each K/V re-read is charged to HBM.

    ``sram_bytes=M`` counts Algorithm 1 of Dao et al. (2022), FlashAttention-1's loop, with ``M``
    bytes of on-chip memory: ``K`` and ``V`` are read once, in blocks of ``B_c = M // (4 d b)`` rows;
    for each of the ``T_c = ceil(n / B_c)`` blocks, all of ``Q`` is read and ``O`` and the row
    statistics ``m, l`` are written, and read back on every pass after the first:
    ``2nd + T_c nd + (2 T_c - 1)(nd + 2n)`` elements, their Theorem 2's ``Theta(n^2 d^2 / M)``.
    """
    n, d, b = _positive("n", n), _positive("d", d), _itemsize(dtype)
    if sram_bytes is None and block_q is None:
        elements = 4 * n * d + (4 * n * n if materialize else 0)
        return elements * b
    if materialize:
        raise ValueError("sram_bytes and block_q model a fused kernel's tiles; pass materialize=False with "
                         f"them, got materialize=True, sram_bytes={sram_bytes!r}, block_q={block_q!r}")
    if sram_bytes is not None and block_q is not None:
        raise ValueError(f"pass sram_bytes (FlashAttention-1's loop) or block_q (FlashAttention-2's), not both; "
                         f"got sram_bytes={sram_bytes!r}, block_q={block_q!r}")
    if block_q is not None:
        passes = -(-n // _positive("block_q", block_q))
        return (2 * n * d + 2 * passes * n * d) * b + 4 * n
    block = _positive("sram_bytes", sram_bytes) // (4 * d * b)
    if block < 1:
        raise ValueError(f"sram_bytes must hold one row of Q, K, V and O (4 d b = {4 * d * b} bytes for "
                         f"d={d}, {dtype}), got {sram_bytes}")
    passes = -(-n // block)
    return (2 * n * d + passes * n * d + (2 * passes - 1) * (n * d + 2 * n)) * b


class Roofline(NamedTuple):
    intensity: float     # FLOPs per byte moved
    attainable: float    # FLOP/s: min(peak_flops, intensity * bandwidth)
    bound: str           # "memory" or "compute"


def roofline(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> Roofline:
    """The roofline model: a kernel doing ``flops`` while moving ``bytes_moved`` reaches at most
    ``min(peak_flops, (flops / bytes_moved) * bandwidth)`` FLOP/s (``bandwidth`` in bytes/s)."""
    for name, value in (("flops", flops), ("bytes_moved", bytes_moved), ("peak_flops", peak_flops),
                        ("bandwidth", bandwidth)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    intensity = flops / bytes_moved
    memory_roof = intensity * bandwidth
    return Roofline(intensity, min(peak_flops, memory_roof), "memory" if memory_roof < peak_flops else "compute")


def kv_cache_bytes(n_layers: int, n_kv_heads: int, d_head: int, seq_len: int, batch: int = 1,
                   dtype: torch.dtype = torch.float32) -> int:
    """Bytes of a KV cache: ``2 (K and V) * n_layers * n_kv_heads * d_head * seq_len * batch * itemsize``.

    Equals the ``nbytes`` of the `attention.KVCache` buffers of every layer (``TransformerLM.make_cache``).
    """
    sizes = [_positive(name, v) for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                                                 ("d_head", d_head), ("seq_len", seq_len), ("batch", batch))]
    return 2 * math.prod(sizes) * _itemsize(dtype)


def _lengths(lengths) -> list[int]:
    values = [int(x) for x in lengths]
    if not values or any(x < 0 for x in values) or any(int(x) != x for x in lengths):
        raise ValueError(f"lengths must be a non-empty sequence of non-negative ints, got {lengths!r}")
    return values


def paged_waste(lengths, block: int) -> int:
    """Cache slots reserved but unused with paged allocation in blocks of ``block`` tokens:
    ``sum_r (ceil(l_r / block) * block - l_r)`` (only each request's last block is partly empty)."""
    block = _positive("block", block)
    return sum(-(-n // block) * block - n for n in _lengths(lengths))


def contiguous_waste(lengths, max_len: int) -> int:
    """Cache slots reserved but unused when every request reserves ``max_len`` contiguous slots:
    ``sum_r (max_len - l_r)``."""
    max_len = _positive("max_len", max_len)
    values = _lengths(lengths)
    if max(values) > max_len:
        raise ValueError(f"every length must be <= max_len={max_len}, got {values}")
    return sum(max_len - n for n in values)


def adaptive_softmax_cost(cutoffs, zipf_s: float, vocab_size: int, *, div_value: float = 1.0) -> float:
    """Expected cost of an adaptive softmax relative to a full one (Grave et al. 2017), Zipf token frequencies.

    Word ``r`` (1-based rank) has probability proportional to ``r^-zipf_s``. The head scores the
    ``cutoffs[0]`` most frequent words plus one entry per tail cluster, always; tail cluster ``i``
    (words ``cutoffs[i] .. cutoffs[i+1]-1``) is scored only when the target falls in it, with width
    divided by ``div_value^(i+1)``. Cost in d-dimensional dot products, divided by ``vocab_size``.
    """
    vocab_size = _positive("vocab_size", vocab_size)
    cuts = [int(c) for c in cutoffs]
    if not cuts or cuts != sorted(set(cuts)) or cuts[0] <= 0 or cuts[-1] >= vocab_size:
        raise ValueError(f"cutoffs must be increasing ints in (0, {vocab_size}), got {list(cutoffs)!r}")
    if not div_value >= 1:
        raise ValueError(f"div_value must be >= 1, got {div_value}")
    weights = torch.arange(1, vocab_size + 1, dtype=torch.float64) ** -float(zipf_s)
    probs = weights / weights.sum()
    bounds = cuts + [vocab_size]
    cost = cuts[0] + len(cuts)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        cost += float(probs[lo:hi].sum()) * (hi - lo) / div_value ** (i + 1)
    return cost / vocab_size


# ----------------------------------------------------------------------------- tensor parallelism
def simulate_tensor_parallel(mha, x: torch.Tensor, world_size: int, *, causal: bool = False):
    """Run a `MultiHeadAttention` as ``world_size`` tensor-parallel ranks on one device.

    Rank ``r`` holds a column slice of ``W^Q, W^K, W^V`` (its own query and key/value heads) and
    the matching row slice of ``W^O``; it returns a partial output ``(B, L, d_model)`` and the
    all-reduce is their sum (plus the output bias, added once). Returns ``(out, partials)``;
    ``out`` equals ``mha(x, causal=causal)``. Needs ``n_heads`` and ``n_kv_heads`` divisible by ``world_size``.
    """
    world_size = _positive("world_size", world_size)
    if mha.n_heads % world_size or mha.n_kv_heads % world_size:
        raise ValueError(f"n_heads={mha.n_heads} and n_kv_heads={mha.n_kv_heads} must be divisible by "
                         f"world_size={world_size}")
    if x.dim() != 3 or x.shape[-1] != mha.d_model:
        raise ValueError(f"x must be (B, L, {mha.d_model}), got {tuple(x.shape)}")
    hq, hkv, dh = mha.n_heads // world_size, mha.n_kv_heads // world_size, mha.d_head
    b, length, _ = x.shape

    def local_heads(proj, n_local, r, rotate):          # rank r's column shard, as (B, n_local, L, d_head)
        cols = slice(r * n_local * dh, (r + 1) * n_local * dh)
        y = F.linear(x, proj.weight[cols], None if proj.bias is None else proj.bias[cols])
        y = y.view(b, length, n_local, dh).transpose(1, 2)
        return mha._rope(y, 0) if rotate else y

    partials = []
    for r in range(world_size):
        q = local_heads(mha.q_proj, hq, r, rotate=True)
        k = local_heads(mha.k_proj, hkv, r, rotate=True)
        v = local_heads(mha.v_proj, hkv, r, rotate=False)
        k, v = repeat_kv(k, hq // hkv), repeat_kv(v, hq // hkv)
        o = scaled_dot_product_attention(q, k, v, causal=causal).transpose(1, 2).reshape(b, length, hq * dh)
        partials.append(F.linear(o, mha.out_proj.weight[:, r * hq * dh:(r + 1) * hq * dh]))
    out = torch.stack(partials).sum(dim=0)
    if mha.out_proj.bias is not None:
        out = out + mha.out_proj.bias
    return out, partials
