"""Library `scaled_dot_product_attention` vs `torch.nn.functional.scaled_dot_product_attention` (M2.2).

CPU, fp32, shape (B, H, L, d) = (4, 8, 1024, 64), with and without a causal mask. The library wraps
PyTorch's fused kernel with its own checks and conventions; the target is an overhead of at most 15%
(time ratio <= 1.15), measured as the median of back-to-back pairs.
``--device cuda`` runs the same measurement on a GPU and writes ``results/cuda/sdpa.json``.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from common import bench_device, device_label, interleaved_times, paired_ratio, save
from xfam_lib.attention import scaled_dot_product_attention
from xfam_lib.testing import assert_close

TARGET = 1.15
SHAPE = (4, 8, 1024, 64)


def main(device: torch.device):
    if device.type == "cpu":
        torch.set_num_threads(1)             # the 2-core machine is shared: one thread gives stable ratios
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*SHAPE, generator=gen).to(device) for _ in range(3))
    rows, checks = [], []
    with torch.no_grad():
        for causal in (False, True):
            ours = lambda: scaled_dot_product_attention(q, k, v, causal=causal)
            theirs = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            assert_close(ours(), theirs(), name=f"causal={causal}")
            times = interleaved_times({"xfam_lib": ours, "torch": theirs}, repeats=15, warmup=2)
            ratio = paired_ratio(times, "xfam_lib", "torch")
            rows.append({"causal": causal, "median_s": {n: statistics.median(t) for n, t in times.items()},
                         "ratio": ratio, "times_s": times})
            checks.append({"what": f"time ratio library/torch, causal={causal}", "value": ratio,
                           "target": f"<= {TARGET}", "ok": ratio <= TARGET})

    fig, ax = plt.subplots(figsize=(5, 3))
    for i, name in enumerate(("xfam_lib", "torch")):
        ax.bar([j + 0.38 * i for j in range(2)], [1e3 * r["median_s"][name] for r in rows], width=0.38, label=name)
    ax.set_xticks([0.19, 1.19], ["full", "causal"])
    ax.set_ylabel("median time (ms)")
    ax.set_title(f"SDPA, {device_label(device)} fp32, shape {SHAPE}")
    for j, r in enumerate(rows):
        ax.text(j + 0.19, 1e3 * max(r["median_s"].values()) * 1.02, f"{r['ratio']:.2f}x", ha="center")
    ax.set_ylim(0, 1.3e3 * max(max(r["median_s"].values()) for r in rows))
    ax.legend(loc="upper center", ncol=2)
    save("sdpa", {"shape": SHAPE, "dtype": "float32", "device": device.type, "rows": rows, "checks": checks}, fig,
         device)


if __name__ == "__main__":
    main(bench_device(__doc__.split("\n")[0]))
