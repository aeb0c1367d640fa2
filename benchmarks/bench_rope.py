"""`apply_rope` vs the arithmetic RoPE cannot avoid (M4.9).

Shape (4, 8, 4096, 128), fp32, CPU. The floor is ``x * cos + y * sin`` on tensors that are already
of the full shape (``y`` the pair-swapped input, ``cos``/``sin`` the broadcast tables): two products
and a sum per element. `apply_rope` must also split the pairs and look up its cached (L, d/2)
tables; target: at most 1.5x the floor. For contrast the script also times the common
"rotate_half" formulation (``x * cos + rotate_half(x) * sin`` with (L, d) tables, as in many LLaMA
ports) and the interleaved layout. Repeats are interleaved and the ratio is the median of the
per-round ratios. Single-threaded, so that other load on the machine perturbs every variant alike.
"""
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import interleaved_times, paired_ratio, save
from xfam_lib.positional import apply_rope, rope_frequencies

TARGET = 1.5
SHAPE = (4, 8, 4096, 128)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def main():
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    B, H, L, d = SHAPE
    x = torch.randn(SHAPE, generator=gen)
    angles = torch.arange(L, dtype=torch.float32)[:, None] * rope_frequencies(d)          # (L, d/2)
    cos_full = torch.cat((angles.cos(), angles.cos()), -1)                                 # (L, d)
    sin_full = torch.cat((angles.sin(), angles.sin()), -1)
    # the floor: every operand already materialised at the full shape
    y = rotate_half(x)
    cos_big, sin_big = cos_full.expand(SHAPE).contiguous(), sin_full.expand(SHAPE).contiguous()

    expected = x * cos_big + y * sin_big
    assert torch.allclose(apply_rope(x), expected, atol=1e-4), "apply_rope disagrees with the floor's formula"
    assert torch.allclose(x * cos_full + rotate_half(x) * sin_full, expected, atol=1e-4)

    fns = {"floor: x*cos + y*sin": lambda: x * cos_big + y * sin_big,
           "apply_rope": lambda: apply_rope(x),
           "apply_rope, interleaved": lambda: apply_rope(x, interleaved=True),
           "rotate_half form": lambda: x * cos_full + rotate_half(x) * sin_full}
    apply_rope(x)                                                   # builds the cached tables once
    times = interleaved_times(fns, repeats=11, warmup=1)
    ratio = paired_ratio(times, "apply_rope", "floor: x*cos + y*sin")
    ratios = {name: paired_ratio(times, name, "floor: x*cos + y*sin") for name in fns}
    medians_ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    checks = [{"what": "apply_rope / (x*cos + y*sin), (4,8,4096,128) fp32", "value": ratio,
               "target": f"<= {TARGET}", "ok": ratio <= TARGET}]

    fig, ax = plt.subplots(figsize=(5.5, 2.8))
    names = list(fns)
    ax.barh(names[::-1], [medians_ms[n] for n in names[::-1]], color=["C2", "C1", "C0", "C7"])
    for i, n in enumerate(names[::-1]):
        ax.annotate(f"{ratios[n]:.2f}x", (medians_ms[n], i), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_xlabel("median time per call (ms), 1 CPU thread")
    ax.set_title(f"RoPE on {SHAPE} fp32: apply_rope = {ratio:.2f}x the floor")
    save("rope", {"shape": list(SHAPE), "dtype": "float32", "device": "cpu", "median_ms": medians_ms,
                  "ratio_to_floor": ratios, "times_s": times, "ratio": ratio, "checks": checks}, fig)


if __name__ == "__main__":
    main()
