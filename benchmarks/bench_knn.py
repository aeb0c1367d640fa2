"""Exact kNN streamed over the keys vs the query-key product alone (M5.5, M5.8).

`memory.exact_knn(q, keys, k, block_size=B)` finds the k nearest keys (squared L2) of 4096 queries
among 2^20 keys (d = 64, k = 32, fp32) block by block, merging running top-k lists, so it never
holds the 4096 x 2^20 distance matrix (16 GiB in fp32). Targets: its peak memory is at most 1/10 of
that matrix, and its time is within 1.5x of computing Q·Kᵀ alone. Q·Kᵀ alone is timed as the same
matrix products over the same key blocks into one reused buffer: the matrix would not fit in
memory here, and no method can skip these products. A smaller case (2^16 keys, the 1 GiB matrix
fits) checks that the neighbours equal ``torch.topk`` over the full matrix, and measures how many
neighbour lists an fp64 brute force gives identically (fp32 rounding can swap near-ties).
Single-threaded, like the other decoding benchmarks: on a shared 2-core machine the many small
merge ops would otherwise pay thread wake-ups that say nothing about the algorithm. The ratio is
the median over interleaved pairs.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import interleaved_times, paired_ratio, save
from xfam_lib.bench import peak_memory
from xfam_lib.memory import exact_knn

TIME_TARGET, MEMORY_TARGET = 1.5, 0.1
CONFIG = dict(queries=4096, keys=2 ** 20, d=64, k=32, block_size=16384, check_keys=2 ** 16)


def qk_alone(q, keys, block):
    """Q·Kᵀ for every key block, into one reused buffer: the floor any exact method pays. The same
    batched product `exact_knn` calls (``bmm``), without its bias term and without any selection."""
    buf = q.new_empty(1, q.shape[0], block)
    for start in range(0, keys.shape[0], block):
        torch.bmm(q[None], keys[None, start:start + block].transpose(1, 2), out=buf)


def neighbours_check(q, keys, k, block):
    """Streamed ≡ ``torch.topk`` over the full matrix; the share of lists equal to an fp64 brute force."""
    stream_s, stream_i = exact_knn(q, keys, k, block_size=block)
    full_s, full_i = exact_knn(q, keys, k)
    same_as_full = torch.equal(stream_i, full_i)
    exact = torch.cdist(q.double(), keys.double()).square().topk(k, dim=-1, largest=False).indices
    same_sets = (stream_i.sort(-1).values == exact.sort(-1).values).all(-1).double().mean().item()
    return same_as_full, same_sets, (stream_s - full_s).abs().max().item()


def main():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    c = CONFIG
    q = torch.randn(c["queries"], c["d"], generator=gen)
    keys = torch.randn(c["keys"], c["d"], generator=gen)
    same_as_full, same_sets, max_dist_diff = neighbours_check(q, keys[:c["check_keys"]], c["k"], c["block_size"])
    assert same_as_full, "streamed neighbours differ from torch.topk over the full matrix"

    knn = lambda: exact_knn(q, keys, c["k"], block_size=c["block_size"])
    times = interleaved_times({"knn": knn, "qk": lambda: qk_alone(q, keys, c["block_size"])}, repeats=3, warmup=0)
    time_ratio = paired_ratio(times, "knn", "qk")
    peak = peak_memory(knn)
    full_bytes = c["queries"] * c["keys"] * 4
    memory_ratio = peak / full_bytes
    checks = [
        {"what": "kNN time / Q·Kᵀ time (4096 x 2^20, d 64, k 32)", "value": time_ratio,
         "target": f"<= {TIME_TARGET}", "ok": time_ratio <= TIME_TARGET},
        {"what": "kNN peak memory / full distance matrix", "value": memory_ratio,
         "target": f"<= {MEMORY_TARGET}", "ok": memory_ratio <= MEMORY_TARGET and same_as_full},
    ]

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(8, 3.2))
    medians = {name: statistics.median(t) for name, t in times.items()}
    ax_t.bar(["Q·Kᵀ alone", "streamed exact kNN"], [medians["qk"], medians["knn"]], color=["0.6", "C0"])
    ax_t.set_ylabel("seconds (1 thread)")
    ax_t.set_title(f"time: {time_ratio:.2f}x the product")
    ax_m.bar(["full distance matrix", "streamed kNN peak"], [full_bytes / 2 ** 30, peak / 2 ** 30], color=["0.6", "C0"])
    ax_m.set_yscale("log")
    ax_m.set_ylabel("GiB")
    ax_m.set_title(f"memory: {memory_ratio:.3f} of the matrix")
    fig.suptitle("Exact kNN, 4096 queries over 2^20 keys (d 64, k 32, fp32), CPU")
    fig.tight_layout()
    save("knn", {"config": CONFIG, "same_neighbours_as_full_topk": same_as_full,
                 "share_of_lists_equal_to_fp64_bruteforce": same_sets, "max_abs_distance_diff_vs_full": max_dist_diff,
                 "median_s": medians, "times_s": times, "time_ratio": time_ratio, "peak_bytes": peak,
                 "full_matrix_bytes": full_bytes, "memory_ratio": memory_ratio, "checks": checks}, fig)


if __name__ == "__main__":
    main()
