"""Mamba-2's SSD: chunked algorithm vs the step loop vs the quadratic attention form, as L grows (M9.11).

One layer's scalar-decay SSM (batch 1, 4 heads of width P 32, N 32, chunk 64), fp32 on the CPU:
`ssd_scan` (L sequential steps), `ssd_attention_form` (the L x L masked matrix, up to L = 2048) and
`ssd_chunked` (Dao & Gu 2024: matrices inside chunks, states passed between them). Outputs are
checked against an fp64 `ssd_scan` at L = 1024 with the scan tolerance of the book's conventions
(fp32, 1e-3 relative). Check, in the direction of Dao & Gu 2024: the chunked algorithm beats the
sequential scan at the largest L, by more than at the smallest. Single-threaded.
``--device cuda`` runs the same measurement on a GPU and writes ``results/cuda/ssd.json``.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import bench_device, interleaved_times, save
from xfam_lib.ssm import ssd_attention_form, ssd_chunked, ssd_scan
from xfam_lib.testing import assert_close

H, P, N, CHUNK = 4, 32, 32, 64
LENGTHS = [128, 256, 512, 1024, 2048, 4096]
ATTENTION_MAX = 2048
SCAN_RTOL = 1e-3


def inputs(length, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, length, H, P, generator=g)
    a = -0.1 * torch.rand(1, length, H, generator=g)
    B = torch.randn(1, length, H, N, generator=g) / N ** 0.5
    C = torch.randn(1, length, H, N, generator=g) / N ** 0.5
    return [t.to(device, dtype) for t in (x, a, B, C)]


@torch.no_grad()
def main(device: torch.device):
    torch.set_num_threads(1)
    reference = ssd_scan(*inputs(1024, torch.float64, device)).float()
    tol = dict(atol=SCAN_RTOL * reference.abs().max().item(), rtol=SCAN_RTOL)
    args = inputs(1024, device=device)
    for name, fn in (("scan", ssd_scan), ("attention", ssd_attention_form),
                     ("chunked", lambda *a: ssd_chunked(*a, chunk_size=CHUNK))):
        assert_close(fn(*args), reference, name=f"{name} vs fp64 scan", **tol)
    medians = {}
    for length in LENGTHS:
        a = inputs(length, device=device)
        fns = {"scan": lambda: ssd_scan(*a), "chunked": lambda: ssd_chunked(*a, chunk_size=CHUNK)}
        if length <= ATTENTION_MAX:
            fns["attention"] = lambda: ssd_attention_form(*a)
        times = interleaved_times(fns, repeats=3, warmup=1)
        medians[length] = {name: statistics.median(t) for name, t in times.items()}
    ratio = {n: medians[n]["scan"] / medians[n]["chunked"] for n in LENGTHS}
    first, last = LENGTHS[0], LENGTHS[-1]
    checks = [{"what": f"SSD chunked vs sequential scan (L={last})", "value": ratio[last], "target": "> 1",
               "ok": ratio[last] > 1},
              {"what": f"SSD chunked gain grows, L={last} / L={first}", "value": ratio[last] / ratio[first],
               "target": "> 1", "ok": ratio[last] > ratio[first]}]

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, label in (("scan", "sequential scan"), ("attention", "attention form (L x L)"),
                        ("chunked", f"chunked (chunk {CHUNK})")):
        xs = [n for n in LENGTHS if name in medians[n]]
        ax.plot(xs, [1e3 * medians[n][name] for n in xs], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("L")
    ax.set_ylabel("ms")
    ax.set_title(f"SSD, {H} heads, P={P}, N={N}: chunked {ratio[last]:.0f}x faster at L={last}")
    ax.legend()
    save("ssd", {"shape": dict(heads=H, P=P, N=N, chunk=CHUNK), "threads": 1, "median_s": medians,
                 "chunked_speedup_vs_scan": ratio, "checks": checks}, fig, device)


if __name__ == "__main__":
    main(bench_device(__doc__.split("\n")[0]))
