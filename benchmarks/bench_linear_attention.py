"""Causal linear attention: chunk vs recurrent mode, and chunk vs causal softmax attention (M8.2, M8.9).

``linear_attention(causal=True)`` (elu+1 features) at (1, 8, L, 64) fp32 on the CPU. Targets: at
L = 4096 the chunk form is at least 20x faster than the recurrent state loop (chunk sizes 16 to 256 are
timed three times each at L = 4096 and the one with the lowest median is used throughout, as in
``bench_gla.py``), seven interleaved rounds against the recurrent form, nine against SDPA at every L (one
thread on the CPU); the chunk form
beats PyTorch's causal SDPA from a crossover length L* that this script measures (the first measured
L from which it stays faster); its peak memory grows linearly in L (peak bytes per token within 25%
of each other over the sweep). Chunk and recurrent give the same output (checked at L = 4096). Ratios
are medians over interleaved pairs. Plot: time vs L for the chunk form and SDPA, and peak memory vs L.
``--device cuda`` runs the same measurement on a GPU and writes ``results/cuda/linear_attention.json``.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from common import bench_device, device_label, fastest_chunk_size, interleaved_times, paired_ratio, save
from xfam_lib.bench import peak_memory
from xfam_lib.linear import linear_attention
from xfam_lib.testing import assert_close

TARGET_RECURRENT = 20.0
B, H, D, L_MAIN = 1, 8, 64, 4096
CHUNKS = [16, 32, 64, 128, 256]
LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192]


def inputs(length, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, length, D, generator=gen).to(device) for _ in range(3)]


def chunk(q, k, v, chunk_size=64):
    return linear_attention(q, k, v, causal=True, mode="chunk", chunk_size=chunk_size)


def recurrent(q, k, v):
    return linear_attention(q, k, v, causal=True, mode="recurrent")


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@torch.no_grad()
def main(device: torch.device):
    if device.type == "cpu":
        torch.set_num_threads(1)             # the 2-core machine is shared: one thread gives stable ratios
    q, k, v = inputs(L_MAIN, device=device)
    best, per_chunk = fastest_chunk_size(lambda c: chunk(q, k, v, c), CHUNKS)
    assert_close(chunk(q, k, v, best), recurrent(q, k, v), name="chunk vs recurrent at L=4096")
    times_main = interleaved_times({"chunk": lambda: chunk(q, k, v, best), "recurrent": lambda: recurrent(q, k, v)},
                                   repeats=7, warmup=0)
    vs_recurrent = paired_ratio(times_main, "recurrent", "chunk")

    sweep = {}
    for length in LENGTHS:
        x = inputs(length, device=device)
        t = interleaved_times({"chunk": lambda: chunk(*x, best), "sdpa": lambda: sdpa(*x)}, repeats=9)
        sweep[length] = {"chunk_s": statistics.median(t["chunk"]), "sdpa_s": statistics.median(t["sdpa"]),
                         "sdpa_over_chunk": paired_ratio(t, "sdpa", "chunk"),
                         "chunk_peak_bytes": peak_memory(lambda: chunk(*x, best), device),
                         "sdpa_peak_bytes": peak_memory(lambda: sdpa(*x), device)}
    faster = [length for length in LENGTHS if sweep[length]["sdpa_over_chunk"] > 1]
    crossover = next((length for length in LENGTHS if all(m in faster for m in LENGTHS if m >= length)), None)
    per_token = [sweep[length]["chunk_peak_bytes"] / length for length in LENGTHS]
    memory_spread = max(per_token) / min(per_token)

    checks = [
        {"what": f"causal chunk ({best}) vs recurrent, (1,8,{L_MAIN},64) fp32", "value": vs_recurrent,
         "target": f">= {TARGET_RECURRENT}", "ok": vs_recurrent >= TARGET_RECURRENT},
        {"what": "crossover L* (chunk faster than causal SDPA from here)", "value": float(crossover or 0),
         "target": "measured", "ok": crossover is not None},
        {"what": "chunk peak bytes per token, max/min over L", "value": memory_spread, "target": "<= 1.25",
         "ok": memory_spread <= 1.25},
    ]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax1.loglog(LENGTHS, [sweep[n]["chunk_s"] * 1e3 for n in LENGTHS], "o-", label=f"linear, chunk {best}")
    ax1.loglog(LENGTHS, [sweep[n]["sdpa_s"] * 1e3 for n in LENGTHS], "s-", label="softmax (SDPA, causal)")
    ax1.loglog([L_MAIN], [statistics.median(times_main["recurrent"]) * 1e3], "^", label="linear, recurrent")
    if crossover:
        ax1.axvline(crossover, color="gray", ls=":", label=f"L* = {crossover}")
    ax1.set_xlabel("sequence length L")
    ax1.set_ylabel("ms (B=1, H=8, d=64, fp32)")
    ax1.legend(fontsize=8)
    ax2.loglog(LENGTHS, [sweep[n]["chunk_peak_bytes"] / 2 ** 20 for n in LENGTHS], "o-", label="linear, chunk")
    ax2.loglog(LENGTHS, [sweep[n]["sdpa_peak_bytes"] / 2 ** 20 for n in LENGTHS], "s-", label="SDPA")
    ax2.set_xlabel("sequence length L")
    ax2.set_ylabel("peak MiB allocated")
    ax2.legend(fontsize=8)
    fig.suptitle(f"Causal linear attention on this {device_label(device)}: chunk {vs_recurrent:.0f}x faster than recurrent at L={L_MAIN}")
    save("linear_attention", {"shape": [B, H, L_MAIN, D], "seconds_per_chunk_size": {str(c): t for c, t in per_chunk.items()},
                              "chunk_size": best, "times_s": times_main,
                              "chunk_vs_recurrent": vs_recurrent, "sweep": {str(n): r for n, r in sweep.items()},
                              "crossover_length": crossover, "peak_bytes_per_token_spread": memory_spread,
                              "checks": checks}, fig, device)


if __name__ == "__main__":
    main(bench_device(__doc__.split("\n")[0]))
