"""Transformer-XL memory cache vs recomputing the whole context at every segment (M5.1, M5.2).

A 4-layer `TransformerXL` (d_model 256, 4 heads) reads a stream of 32 segments of 16 tokens, one
segment at a time, as when decoding or evaluating a long text. With the cache, each segment attends
over the stored states of the earlier ones (``mem_len`` covers the whole stream); without it, the
model runs again over every token so far and keeps the last segment's logits. The two give the same
logits (the memory covers the context, so recurrence equals one forward over it). Target: the
cache is at least 3x faster in total. Batch-1 work is a stream of small ops, so the run is
single-threaded, like the KV-cache benchmark; the ratio is the median over interleaved pairs. The
plot shows the time per segment vs its index.
"""
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import interleaved_times, paired_ratio, save
from xfam_lib.memory import TransformerXL
from xfam_lib.testing import assert_close

TARGET = 3.0
N_SEG, SEG = 32, 16
CONFIG = dict(vocab=128, d_model=256, n_layers=4, n_heads=4, d_ff=1024, mem_len=N_SEG * SEG)


@torch.no_grad()
def cached(model, ids):
    """Logits of every segment and the seconds each took, reading the stream with the XL memory."""
    mems, logits, secs = None, [], []
    for s in range(N_SEG):
        start = time.perf_counter()
        out, mems = model(ids[:, s * SEG:(s + 1) * SEG], mems)
        secs.append(time.perf_counter() - start)
        logits.append(out)
    return torch.cat(logits, 1), secs


@torch.no_grad()
def recomputed(model, ids):
    """The same, running the model over the whole context so far at every segment."""
    logits, secs = [], []
    for s in range(N_SEG):
        start = time.perf_counter()
        out, _ = model(ids[:, :(s + 1) * SEG])
        secs.append(time.perf_counter() - start)
        logits.append(out[:, -SEG:])
    return torch.cat(logits, 1), secs


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TransformerXL(**CONFIG).eval()
    ids = torch.randint(0, CONFIG["vocab"], (1, N_SEG * SEG), generator=torch.Generator().manual_seed(1))
    with_cache, cache_secs = cached(model, ids)
    without, recompute_secs = recomputed(model, ids)
    assert_close(with_cache, without, name="logits, cached vs recomputed")
    same_argmax = torch.equal(with_cache.argmax(-1), without.argmax(-1))
    max_diff = (with_cache - without).abs().max().item()

    times = interleaved_times({"cache": lambda: cached(model, ids), "recompute": lambda: recomputed(model, ids)},
                              repeats=5, warmup=0)
    speedup = paired_ratio(times, "recompute", "cache")
    checks = [{"what": f"XL stream speed-up, cache vs recompute ({N_SEG}x{SEG} tokens)", "value": speedup,
               "target": f">= {TARGET}", "ok": speedup >= TARGET and same_argmax}]

    fig, ax = plt.subplots(figsize=(5, 3.2))
    segments = range(1, N_SEG + 1)
    ax.plot(segments, [1e3 * t for t in recompute_secs], "o-", ms=3, label="recompute the whole context")
    ax.plot(segments, [1e3 * t for t in cache_secs], "o-", ms=3, label="XL memory cache")
    ax.set_xlabel(f"segment ({SEG} tokens each)")
    ax.set_ylabel("ms per segment")
    ax.set_title(f"4-layer Transformer-XL, CPU: {speedup:.1f}x faster with the cache")
    ax.legend()
    save("xl_cache", {"config": CONFIG, "segments": N_SEG, "segment_len": SEG, "same_argmax": same_argmax,
                      "max_abs_logit_diff": max_diff, "median_s": {n: statistics.median(t) for n, t in times.items()},
                      "times_s": times, "speedup": speedup,
                      "per_segment_ms": {"cache": [1e3 * t for t in cache_secs],
                                         "recompute": [1e3 * t for t in recompute_secs]},
                      "checks": checks}, fig)


if __name__ == "__main__":
    main()
