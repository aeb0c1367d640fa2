"""Mamba decoding with `MambaBlock.step`: memory constant in L (M9.10).

A `MambaBlock` (d_model 64, N 16, d_conv 4, expand 2) decodes 4096 tokens one at a time from
`init_state`. After L tokens we record the bytes of the decoding state (the conv window and the SSM
state: everything `step` carries) and the time per token, at L = 16 ... 4096. For comparison, the
bytes an attention layer of the same width would hold in its KV cache (keys and values for L
positions, fp32). The first 64 step outputs are checked against the full forward on the same tokens.
Targets: state bytes at L = 4096 / at L = 16 = 1 (constant), and time per token late / early <= 1.5
(medians over windows of 64 tokens). Single-threaded.
"""
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from common import save
from xfam_lib.ssm import MambaBlock
from xfam_lib.testing import assert_close

D_MODEL, D_STATE, D_CONV, EXPAND = 64, 16, 4, 2
TOKENS, WINDOW = 4096, 64
MARKS = [16, 64, 256, 1024, 4096]
TIME_TARGET = 1.5


def state_bytes(state):
    return sum(t.numel() * t.element_size() for t in state)


@torch.no_grad()
def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    block = MambaBlock(D_MODEL, D_STATE, D_CONV, EXPAND).eval()
    x = torch.randn(1, TOKENS, D_MODEL, generator=torch.Generator().manual_seed(1))
    state, ys, secs, bytes_at = block.init_state(1), [], [], {}
    for t in range(TOKENS):
        start = time.perf_counter()
        y, state = block.step(x[:, t], state)
        secs.append(time.perf_counter() - start)
        if t < WINDOW:
            ys.append(y)
        if t + 1 in MARKS:
            bytes_at[t + 1] = state_bytes(state)
    assert_close(torch.stack(ys, 1), block(x[:, :WINDOW]), name="step outputs vs the full forward")
    early = statistics.median(secs[WINDOW:2 * WINDOW])
    late = statistics.median(secs[-WINDOW:])
    memory_ratio = bytes_at[MARKS[-1]] / bytes_at[MARKS[0]]
    kv_bytes = {n: 2 * n * D_MODEL * 4 for n in MARKS}
    checks = [{"what": f"Mamba step state bytes, L={MARKS[-1]} / L={MARKS[0]}", "value": memory_ratio,
               "target": "== 1", "ok": memory_ratio == 1.0},
              {"what": f"Mamba step time/token, last {WINDOW} / tokens {WINDOW}-{2 * WINDOW}", "value": late / early,
               "target": f"<= {TIME_TARGET}", "ok": late / early <= TIME_TARGET}]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    ax1.plot(MARKS, [bytes_at[n] / 1024 for n in MARKS], "o-", label="Mamba decoding state")
    ax1.plot(MARKS, [kv_bytes[n] / 1024 for n in MARKS], "o--", label="KV cache, one attention layer")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("tokens decoded L")
    ax1.set_ylabel("KiB")
    ax1.legend()
    ax1.set_title("memory carried between tokens")
    windows = range(0, TOKENS, WINDOW)
    ax2.plot([w + WINDOW for w in windows], [1e3 * statistics.median(secs[w:w + WINDOW]) for w in windows], ".-")
    ax2.set_xlabel("token position")
    ax2.set_ylabel(f"ms per token (median of {WINDOW})")
    ax2.set_ylim(bottom=0)
    ax2.set_title("time per step")
    save("mamba_step", {"config": dict(d_model=D_MODEL, d_state=D_STATE, d_conv=D_CONV, expand=EXPAND),
                        "threads": 1, "tokens": TOKENS, "state_bytes": bytes_at, "kv_cache_bytes_fp32": kv_bytes,
                        "ms_per_token_early": 1e3 * early, "ms_per_token_late": 1e3 * late,
                        "ms_per_token_windows": [1e3 * statistics.median(secs[w:w + WINDOW]) for w in windows],
                        "checks": checks}, fig)


if __name__ == "__main__":
    main()
