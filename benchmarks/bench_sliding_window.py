"""Sliding-window attention vs dense masked attention (M7.2, issue 10).

L = 8192, window w = 256 on each side, d = 64, B = H = 1, fp32. Dense: `scaled_dot_product_attention`
with the `sliding_window_mask` band (L x L scores). Sliding: `sliding_window_attention`, chunked, with
O(L·w) scores. Targets: at least 5x faster and at least 10x less peak memory, equal outputs.
Also L = 1024 ... 8192 for the figure. Peak memory is `xfam_lib.bench.peak_memory` (live tensor storage
on a CPU, the allocator on a GPU); times are interleaved medians (benchmarks/common.py), single-threaded on
a CPU like bench_tiled_memory.py.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import interleaved_times, paired_ratio, save
from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.bench import peak_memory
from xfam_lib.sparse import sliding_window_attention, sliding_window_mask
from xfam_lib.testing import assert_close
from xfam_lib.utils import pick_device

LENGTHS = (1024, 2048, 4096, 8192)
WINDOW, D = 256, 64
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
        dense = lambda: scaled_dot_product_attention(q, k, v, mask)
        sliding = lambda: sliding_window_attention(q, k, v, WINDOW)
        with torch.no_grad():
            times = interleaved_times({"dense": dense, "sliding": sliding}, repeats=5 if n == LENGTHS[-1] else 3)
            row = {"L": n, "dense_s": statistics.median(times["dense"]), "sliding_s": statistics.median(times["sliding"]),
                   "speedup": paired_ratio(times, "dense", "sliding"),
                   "dense_peak_bytes": peak_memory(dense, device), "sliding_peak_bytes": peak_memory(sliding, device)}
            row["memory_ratio"] = row["dense_peak_bytes"] / row["sliding_peak_bytes"]
            if n == LENGTHS[-1]:
                assert_close(sliding(), dense(), name=f"sliding vs dense at L={n}")
        rows.append(row)
        print(row, flush=True)

    last = rows[-1]
    checks = [{"what": f"speed-up dense/sliding, L={last['L']}, w={WINDOW}", "value": last["speedup"],
               "target": f">= {TARGET_SPEED}", "ok": last["speedup"] >= TARGET_SPEED},
              {"what": f"peak memory dense/sliding, L={last['L']}, w={WINDOW}", "value": last["memory_ratio"],
               "target": f">= {TARGET_MEMORY}", "ok": last["memory_ratio"] >= TARGET_MEMORY}]

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(9, 3.2))
    ls = [r["L"] for r in rows]
    for ax, key, label in ((ax_t, "_s", "time (s)"), (ax_m, "_peak_bytes", "peak memory (MiB)")):
        scale = 1 if key == "_s" else 2 ** -20
        ax.loglog(ls, [r["dense" + key] * scale for r in rows], "o-", label="dense masked")
        ax.loglog(ls, [r["sliding" + key] * scale for r in rows], "s-", label=f"sliding window (w={WINDOW})")
        ax.set_xticks(ls, [str(n) for n in ls])
        ax.minorticks_off()
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(label)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"Sliding-window vs dense attention, d={D}, fp32, {device.type}")
    save("sliding_window", {"device": device.type, "d": D, "window": WINDOW, "dtype": "float32", "rows": rows,
                            "checks": checks}, fig)


if __name__ == "__main__":
    main()
