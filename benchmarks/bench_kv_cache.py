"""KV-cache greedy decoding vs recomputing the whole prefix at every step (M1.20, M3.9).

A 4-layer `TransformerLM` (d_model 256, 4 heads, 2 KV heads) generates 256 new tokens after a
16-token prompt with `generate(..., use_cache=True)` and `use_cache=False`; both must produce the
same tokens. Target: the cache is at least 3x faster in total. Batch-1 decoding is a stream of small
ops, so the CPU run is single-threaded (thread wake-ups would dominate on a busy machine); the
ratio is the median over interleaved pairs. The plot shows the time per generated token vs position.
"""
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import interleaved_times, paired_ratio, save
from xfam_lib.transformer import TransformerLM, generate

TARGET = 3.0
NEW_TOKENS, PROMPT = 256, 16
CONFIG = dict(vocab=128, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, max_len=512)


@torch.no_grad()
def per_token_ms(model, prompt, use_cache):
    """Milliseconds spent producing each new token (greedy), by position."""
    ids, times = prompt, []
    cache = model.make_cache(1, PROMPT + NEW_TOKENS) if use_cache else None
    step_input = prompt
    for _ in range(NEW_TOKENS):
        start = time.perf_counter()
        logits = model(step_input, cache=cache) if use_cache else model(ids)
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        times.append(1e3 * (time.perf_counter() - start))
        ids = torch.cat([ids, nxt], dim=1)
        step_input = nxt
    return times, ids


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TransformerLM(**CONFIG).eval()
    prompt = torch.randint(0, CONFIG["vocab"], (1, PROMPT), generator=torch.Generator().manual_seed(1))
    cached = generate(model, prompt, NEW_TOKENS, use_cache=True)
    recomputed = generate(model, prompt, NEW_TOKENS, use_cache=False)
    identical = torch.equal(cached, recomputed)
    assert identical, "cached and recomputed decoding disagree"

    times = interleaved_times({"cache": lambda: generate(model, prompt, NEW_TOKENS, use_cache=True),
                               "recompute": lambda: generate(model, prompt, NEW_TOKENS, use_cache=False)},
                              repeats=3, warmup=0)
    speedup = paired_ratio(times, "recompute", "cache")
    curves = {name: per_token_ms(model, prompt, use_cache)[0]
              for name, use_cache in (("cache", True), ("recompute", False))}
    checks = [{"what": "decode speed-up, cache vs recompute (256 tokens)", "value": speedup,
               "target": f">= {TARGET}", "ok": speedup >= TARGET and identical}]

    fig, ax = plt.subplots(figsize=(5, 3.2))
    positions = range(PROMPT, PROMPT + NEW_TOKENS)
    for name, label in (("recompute", "recompute the prefix"), ("cache", "KV cache")):
        ax.plot(positions, curves[name], label=label, lw=1)
    ax.set_xlabel("position of the generated token")
    ax.set_ylabel("ms per token")
    ax.set_title(f"Greedy decoding, 4-layer LM, CPU: {speedup:.1f}x faster with the cache")
    ax.legend()
    save("kv_cache", {"config": CONFIG, "prompt": PROMPT, "new_tokens": NEW_TOKENS, "identical_tokens": identical,
                      "median_s": {n: statistics.median(t) for n, t in times.items()}, "times_s": times,
                      "speedup": speedup, "per_token_ms": curves, "checks": checks}, fig)


if __name__ == "__main__":
    main()
