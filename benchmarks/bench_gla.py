"""Gated linear attention: chunk vs recurrent mode at L = 4096 (M8.13).

``gated_linear_attention`` at (1, 8, 4096, 64) fp32 on the CPU with data-independent log gates drawn
in [-0.1, 0] (a typical forget rate). Target: the chunk form is at least 10x faster than the step
loop. The chunk sizes 8 to 256 are timed in three interleaved rounds (after a warm-up round); the one with the lowest median is then
compared with the recurrent mode over seven interleaved pairs (median ratio), on one thread on the CPU. Both modes give the same output and final state.
Plot: time per chunk size, with the recurrent time as a line.
``--device cuda`` runs the same measurement on a GPU and writes ``results/cuda/gla.json``.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import bench_device, device_label, fastest_chunk_size, interleaved_times, paired_ratio, save
from xfam_lib.linear import gated_linear_attention
from xfam_lib.testing import assert_close

TARGET = 10.0
B, H, L, D = 1, 8, 4096, 64
CHUNKS = [8, 16, 32, 64, 128, 256]


@torch.no_grad()
def main(device: torch.device):
    if device.type == "cpu":
        torch.set_num_threads(1)             # the 2-core machine is shared: one thread gives stable ratios
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=gen).to(device) for _ in range(3))
    log_g = (-0.1 * torch.rand(B, H, L, D, generator=gen)).to(device)

    def run(mode, chunk_size=64):
        return gated_linear_attention(q, k, v, log_g, mode=mode, chunk_size=chunk_size, return_final_state=True)

    best, per_chunk = fastest_chunk_size(lambda c: run("chunk", c), CHUNKS)
    (out_c, state_c), (out_r, state_r) = run("chunk", best), run("recurrent")
    assert_close(out_c, out_r, name="GLA chunk vs recurrent output")
    assert_close(state_c, state_r, name="GLA chunk vs recurrent final state")
    times = interleaved_times({"chunk": lambda: run("chunk", best), "recurrent": lambda: run("recurrent")},
                              repeats=7, warmup=0)
    speedup = paired_ratio(times, "recurrent", "chunk")
    checks = [{"what": f"GLA chunk ({best}) vs recurrent, (1,8,{L},64) fp32", "value": speedup,
               "target": f">= {TARGET}", "ok": speedup >= TARGET}]

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([str(c) for c in CHUNKS], [per_chunk[c] for c in CHUNKS], label="chunk mode (median of 3)")
    ax.axhline(statistics.median(times["recurrent"]), color="C3", label="recurrent mode")
    ax.set_xlabel("chunk size")
    ax.set_ylabel("seconds")
    ax.set_title(f"GLA, L={L}, {device_label(device)}: chunk {speedup:.1f}x faster than recurrent")
    ax.legend(fontsize=8)
    save("gla", {"shape": [B, H, L, D], "log_gate_range": [-0.1, 0.0], "seconds_per_chunk_size": per_chunk,
                 "best_chunk_size": best, "times_s": times, "speedup": speedup, "checks": checks}, fig, device)


if __name__ == "__main__":
    main(bench_device(__doc__.split("\n")[0]))
