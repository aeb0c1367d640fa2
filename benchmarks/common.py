"""Shared helpers for the benchmark scripts: interleaved timing and result files.

Every ``bench_*.py`` writes ``results/<name>.json`` (numbers, target, machine) and ``results/<name>.png``.
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def interleaved_times(fns: dict[str, Callable[[], object]], *, repeats: int = 9,
                      warmup: int = 1) -> dict[str, list[float]]:
    """Wall times of each function, run in turn (a, b, a, b, ...; the order flips every round) so that
    drifts in machine load hit every function alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def fastest_chunk_size(run: Callable[[int], object], sizes) -> tuple[int, dict[int, float]]:
    """Time ``run(size)`` three times for every size (one warm-up); return the size with the lowest
    median and ``{size: median seconds}``."""
    medians = {}
    for size in sizes:
        medians[size] = statistics.median(interleaved_times({"run": lambda: run(size)}, repeats=3)["run"])
    return min(medians, key=medians.get), medians


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of ``time[num] / time[den]`` (each round's two runs were back to back)."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def machine() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine()}


def save(name: str, result: dict, fig=None) -> Path:
    """Write ``results/<name>.json`` (and the figure as ``results/<name>.png``); print a one-line summary."""
    RESULTS.mkdir(exist_ok=True)
    result = {"name": name, **result, "machine": machine()}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if fig is not None:
        fig.savefig(RESULTS / f"{name}.png", dpi=100, bbox_inches="tight")   # the book's dpi (plots.STYLE)
    for check in result.get("checks", []):
        print(f"{name}: {check['what']} = {check['value']:.3g} (target {check['target']}) "
              f"{'OK' if check['ok'] else 'MISSED'}")
    return path
