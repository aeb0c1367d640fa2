"""Sparse kernels vs dense masked attention: sliding window (M7.2, issue 10) and block-sparse (M7.11).

L = 8192, window w = 256 on each side, d = 64, B = H = 1, fp32. Dense: `scaled_dot_product_attention`
with the `sliding_window_mask` band (L x L scores). Sliding: `sliding_window_attention`, chunked, with
O(L·w) scores. Targets: at least 5x faster and at least 10x less peak memory, equal outputs.
Also L = 1024 ... 8192 for the figure. Peak memory is `xfam_lib.bench.peak_memory` (live tensor storage
on a CPU, the allocator on a GPU); times are interleaved medians (benchmarks/common.py), single-threaded on
a CPU like bench_tiled_memory.py.

Block-sparse: `block_sparse_attention` with a BigBird layout (blocks of 64; a window of +-2 blocks,
2 random blocks per row, the first block global; seed 0) against dense attention with the expanded
layout as its mask, at the same lengths. It has no target: the script records its time and memory
ratios and checks that the outputs agree.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import interleaved_times, paired_ratio, save
from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.bench import peak_memory
from xfam_lib.sparse import (bigbird_layout, block_sparse_attention, expand_layout, sliding_window_attention,
                             sliding_window_mask)
from xfam_lib.testing import assert_close
from xfam_lib.utils import pick_device

LENGTHS = (1024, 2048, 4096, 8192)
WINDOW, D = 256, 64
BLOCK, BB_WINDOW, BB_RANDOM, BB_GLOBAL = 64, 2, 2, 1
TARGET_SPEED, TARGET_MEMORY = 5.0, 10.0


def main():
    device = pick_device()
    if device.type == "cpu":
        torch.set_num_threads(1)             # the 2-core machine is shared: one thread gives stable ratios
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in LENGTHS:
        q, k, v = (torch.randn(1, 1, n, D, generator=gen).to(device) for _ in range(3))
        mask = sliding_window_mask(n, WINDOW, device=device)
        layout = bigbird_layout(n // BLOCK, BB_WINDOW, BB_RANDOM, BB_GLOBAL, seed=0, device=device)
        block_mask = expand_layout(layout, BLOCK)
        dense = lambda: scaled_dot_product_attention(q, k, v, mask)
        sliding = lambda: sliding_window_attention(q, k, v, WINDOW)
        dense_bb = lambda: scaled_dot_product_attention(q, k, v, block_mask)
        block = lambda: block_sparse_attention(q, k, v, layout, BLOCK)
        with torch.no_grad():
            repeats = 5 if n == LENGTHS[-1] else 3
            times = interleaved_times({"dense": dense, "sliding": sliding}, repeats=repeats)
            row = {"L": n, "dense_s": statistics.median(times["dense"]), "sliding_s": statistics.median(times["sliding"]),
                   "speedup": paired_ratio(times, "dense", "sliding"),
                   "dense_peak_bytes": peak_memory(dense, device), "sliding_peak_bytes": peak_memory(sliding, device)}
            row["memory_ratio"] = row["dense_peak_bytes"] / row["sliding_peak_bytes"]
            times = interleaved_times({"dense": dense_bb, "block": block}, repeats=repeats)
            row.update(block_density=layout.float().mean().item(),
                       dense_bigbird_s=statistics.median(times["dense"]), block_s=statistics.median(times["block"]),
                       block_speedup=paired_ratio(times, "dense", "block"),
                       dense_bigbird_peak_bytes=peak_memory(dense_bb, device), block_peak_bytes=peak_memory(block, device))
            row["block_memory_ratio"] = row["dense_bigbird_peak_bytes"] / row["block_peak_bytes"]
            assert_close(sliding(), dense(), name=f"sliding vs dense at L={n}")
            assert_close(block(), dense_bb(), name=f"block-sparse vs dense at L={n}")
        rows.append(row)
        print(row, flush=True)

    last = rows[-1]
    checks = [{"what": f"speed-up dense/sliding, L={last['L']}, w={WINDOW}", "value": last["speedup"],
               "target": f">= {TARGET_SPEED}", "ok": last["speedup"] >= TARGET_SPEED},
              {"what": f"peak memory dense/sliding, L={last['L']}, w={WINDOW}", "value": last["memory_ratio"],
               "target": f">= {TARGET_MEMORY}", "ok": last["memory_ratio"] >= TARGET_MEMORY},
              {"what": f"speed-up dense/block-sparse (BigBird, density {last['block_density']:.3f}), L={last['L']}",
               "value": last["block_speedup"], "target": "measured", "ok": True},
              {"what": f"peak memory dense/block-sparse (BigBird), L={last['L']}", "value": last["block_memory_ratio"],
               "target": "measured", "ok": True}]

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(9, 3.2))
    ls = [r["L"] for r in rows]
    for ax, key, label in ((ax_t, "_s", "time (s)"), (ax_m, "_peak_bytes", "peak memory (MiB)")):
        scale = 1 if key == "_s" else 2 ** -20
        ax.loglog(ls, [r["dense" + key] * scale for r in rows], "o-", label="dense masked")
        ax.loglog(ls, [r["sliding" + key] * scale for r in rows], "s-", label=f"sliding window (w={WINDOW})")
        ax.loglog(ls, [r["block" + key] * scale for r in rows], "^-", label=f"block-sparse (BigBird, block {BLOCK})")
        ax.set_xticks(ls, [str(n) for n in ls])
        ax.minorticks_off()
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(label)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"Sparse kernels vs dense attention, d={D}, fp32, {device.type}")
    save("sliding_window", {"device": device.type, "d": D, "window": WINDOW, "dtype": "float32", "rows": rows,
                            "bigbird": {"block": BLOCK, "window_blocks": BB_WINDOW, "random_blocks": BB_RANDOM,
                                        "global_blocks": BB_GLOBAL, "seed": 0},
                            "checks": checks}, fig)


if __name__ == "__main__":
    main()
