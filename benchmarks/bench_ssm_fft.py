"""LTI SSM: FFT convolution vs the step-by-step recurrence at L = 8192 (M9.1, M9.3).

A diagonal LTI SSM (64 channels, N = 16 states each, ZOH-discretised with steps in [1e-3, 1e-1])
applied to a length-8192 input, in fp32 on the CPU. Fast path: the kernel `ssm_kernel`
(Vandermonde sum) and the causal `ssm_convolve` (FFT, padded to 2L), timed together. Slow path:
`ssm_recurrence`, the step loop that decoding would use. Both are checked against an fp64 run of the
FFT path with the scan tolerance of the book's conventions (fp32, 1e-3 relative: 8192 accumulated
steps). Target: at least 10x. The plot shows both times vs L. Single-threaded, as the other
benchmarks on this shared CPU.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import interleaved_times, paired_ratio, save
from xfam_lib.ssm import discretize, ssm_convolve, ssm_kernel, ssm_recurrence
from xfam_lib.testing import assert_close

TARGET = 10.0
H, N, L = 64, 16, 8192
SCAN_RTOL = 1e-3


def system(dtype):
    g = torch.Generator().manual_seed(0)
    A = -torch.exp(torch.randn(H, N, generator=g, dtype=torch.float64))
    B = torch.randn(H, N, generator=g, dtype=torch.float64)
    C = torch.randn(H, N, generator=g, dtype=torch.float64) / N ** 0.5
    dt = torch.exp(torch.empty(H, dtype=torch.float64).uniform_(-6.9, -2.3, generator=g))
    A_bar, B_bar = discretize(A, B, dt, "zoh")
    u = torch.randn(H, L, generator=g, dtype=torch.float64)
    return [t.to(dtype) for t in (A_bar, B_bar, C, u)]


def fft_path(A_bar, B_bar, C, u):
    return ssm_convolve(u, ssm_kernel(A_bar, B_bar, C, u.shape[-1]))


@torch.no_grad()
def main():
    torch.set_num_threads(1)
    args = system(torch.float32)
    reference = fft_path(*system(torch.float64)).float()
    tol = dict(atol=SCAN_RTOL * reference.abs().max().item(), rtol=SCAN_RTOL)
    y_fft, y_rec = fft_path(*args), ssm_recurrence(*args)
    assert_close(y_fft, reference, name="FFT path vs fp64", **tol)
    assert_close(y_rec, reference, name="recurrence vs fp64", **tol)
    times = interleaved_times({"fft": lambda: fft_path(*args), "recurrence": lambda: ssm_recurrence(*args)},
                              repeats=5, warmup=1)
    speedup = paired_ratio(times, "recurrence", "fft")
    checks = [{"what": f"LTI SSM FFT conv vs recurrence (L={L})", "value": speedup, "target": f">= {TARGET}",
               "ok": speedup >= TARGET}]

    lengths = [512, 1024, 2048, 4096, 8192]
    sweep = {}
    for length in lengths:
        a = [t[..., :length] if t.shape[-1] == L else t for t in args]
        t = interleaved_times({"fft": lambda: fft_path(*a), "recurrence": lambda: ssm_recurrence(*a)},
                              repeats=3, warmup=1)
        sweep[length] = {name: statistics.median(v) for name, v in t.items()}

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, label in (("recurrence", "recurrence (step loop)"), ("fft", "kernel + FFT convolution")):
        ax.plot(lengths, [1e3 * sweep[n][name] for n in lengths], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("L")
    ax.set_ylabel("ms")
    ax.set_title(f"LTI SSM ({H} channels, N={N}): FFT {speedup:.0f}x faster at L={L}")
    ax.legend()
    save("ssm_fft", {"shape": dict(channels=H, N=N, L=L), "threads": 1,
                     "median_s": {n: statistics.median(t) for n, t in times.items()}, "times_s": times,
                     "speedup": speedup, "max_abs_error_vs_fp64": {"fft": (y_fft - reference).abs().max().item(),
                                                                  "recurrence": (y_rec - reference).abs().max().item()},
                     "sweep_median_s": sweep, "checks": checks}, fig)


if __name__ == "__main__":
    main()
