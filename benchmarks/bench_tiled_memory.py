"""Peak memory of `tiled_attention` vs the naive formula (M3.11, E3.4).

B = H = 1, d = 64, fp32. The naive path (`scaled_dot_product_attention(..., return_weights=True)`,
the explicit formula) builds the L x L scores and weights; tiled attention keeps one
block_q x block_k tile. Target at L = 8192: tiled peak <= 1/8 of naive, with equal outputs.
Also reported: a training step (forward + backward) and the largest single tensor, for L = 512 ... 8192.

Peak memory is the CUDA allocator's on a GPU and, on a CPU, `xfam_lib.bench.peak_memory`'s count of
live tensor storage. Memory does not depend on threads, so on a CPU the run is single-threaded
(small tile ops are much faster that way on a busy machine).
"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import save
from xfam_lib.attention import scaled_dot_product_attention, tiled_attention
from xfam_lib.bench import largest_intermediate, peak_memory
from xfam_lib.testing import assert_close
from xfam_lib.utils import pick_device

TARGET = 1 / 8
LENGTHS = (512, 1024, 2048, 4096, 8192)
D = 64
TRAIN_BLOCK = 256          # the training-step comparison uses bigger tiles to keep the run short


def naive(q, k, v):
    return scaled_dot_product_attention(q, k, v, return_weights=True)[0]


def train_step(attn, q, k, v):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(attn(q, k, v).sum(), (q, k, v))


def main():
    device = pick_device()
    if device.type == "cpu":
        torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in LENGTHS:
        q, k, v = (torch.randn(1, 1, n, D, generator=gen).to(device) for _ in range(3))
        with torch.no_grad():
            row = {"L": n,
                   "naive_peak_bytes": peak_memory(lambda: naive(q, k, v), device),
                   "tiled_peak_bytes": peak_memory(lambda: tiled_attention(q, k, v), device)}
            if n <= 2048:
                row["naive_largest_numel"] = largest_intermediate(lambda: naive(q, k, v))
                row["tiled_largest_numel"] = largest_intermediate(lambda: tiled_attention(q, k, v))
        rows.append(row)
        print(row, flush=True)

    with torch.no_grad():
        out_tiled, out_naive = tiled_attention(q, k, v), naive(q, k, v)
    assert_close(out_tiled, out_naive, name="tiled vs naive at L=8192")
    forward_ratio = rows[-1]["tiled_peak_bytes"] / rows[-1]["naive_peak_bytes"]
    tiled_train = lambda a, b, c: tiled_attention(a, b, c, block_q=TRAIN_BLOCK, block_k=TRAIN_BLOCK)
    train = {"naive_peak_bytes": peak_memory(lambda: train_step(naive, q, k, v), device),
             "tiled_peak_bytes": peak_memory(lambda: train_step(tiled_train, q, k, v), device),
             "block": TRAIN_BLOCK}
    train_ratio = train["tiled_peak_bytes"] / train["naive_peak_bytes"]
    checks = [{"what": "peak memory tiled/naive, forward, L=8192", "value": forward_ratio,
               "target": f"<= {TARGET:.3f}", "ok": forward_ratio <= TARGET},
              {"what": "peak memory tiled/naive, train step, L=8192", "value": train_ratio,
               "target": f"<= {TARGET:.3f}", "ok": train_ratio <= TARGET}]

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ls = [r["L"] for r in rows]
    ax.loglog(ls, [r["naive_peak_bytes"] / 2**20 for r in rows], "o-", label="naive formula")
    ax.loglog(ls, [r["tiled_peak_bytes"] / 2**20 for r in rows], "s-", label="tiled (64 x 64 tiles)")
    ax.loglog(ls, [2 * n * n * 4 / 2**20 for n in ls], ":", color="grey", label="2 L² fp32 (scores + weights)")
    ax.set_xticks(ls, [str(n) for n in ls])
    ax.minorticks_off()
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title(f"Attention forward, d={D}, fp32, {device.type}")
    ax.legend(fontsize=8)
    save("tiled_memory", {"device": device.type, "d": D, "dtype": "float32", "rows": rows, "train_step_L8192": train,
                          "checks": checks}, fig)


if __name__ == "__main__":
    main()
