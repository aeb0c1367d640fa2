"""Shared helpers for the benchmark scripts: the device, timing, and result files.

Every ``bench_*.py`` writes ``results/<name>.json`` (numbers, target, machine) and ``results/<name>.png``.
The scripts that take ``--device cuda`` write to ``results/cuda/`` instead, with the GPU's name and the
torch, Triton and fla-core versions in ``machine``; ``--device cpu`` is the default, so the saved CPU
results keep their meaning. ``XFAM_BENCH_RESULTS=<folder>`` writes under another folder (a dry run, or
a GPU session that must bring its files back).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import torch

from xfam_lib.bench import time_ratios
from xfam_lib.utils import machine_record

RESULTS = Path(__file__).resolve().parent / "results"


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where to run (default cpu; cuda writes results/cuda/<name>.json)")


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)``; exit with a clear message when CUDA is asked for and absent."""
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    return torch.device(name)


def bench_device(description: str | None = None, argv: list[str] | None = None) -> torch.device:
    """The device of a script whose only option is ``--device cpu|cuda``."""
    parser = argparse.ArgumentParser(description=description)
    add_device_arg(parser)
    return resolve_device(parser.parse_args(argv).device)


def device_label(device: torch.device | str) -> str:
    """``"CPU"``, or the GPU's name, for plot titles."""
    device = torch.device(device)
    return "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)


def interleaved_times(fns: dict[str, Callable[[], object]], *, repeats: int = 9,
                      warmup: int = 1) -> dict[str, list[float]]:
    """Wall times of each function, run in turn (a, b, a, b, ...; the order flips every round) so that
    drifts in machine load hit every function alike (`xfam_lib.bench.time_ratios`). On CUDA each
    interval ends with a synchronize."""
    device = "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return time_ratios(fns, repeats=repeats, warmup=warmup, device=device).times


def cuda_ms(fn: Callable[[], object], *, warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of ``fn()`` on the GPU by `triton.testing.do_bench` (CUDA events, the L2 cache
    flushed before every run)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def fastest_chunk_size(run: Callable[[int], object], sizes) -> tuple[int, dict[int, float]]:
    """Time ``run(size)`` for every size in three interleaved rounds (one warm-up round); return the
    size with the lowest median and ``{size: median seconds}``."""
    medians = time_ratios({size: (lambda size=size: run(size)) for size in sizes}, repeats=3).median
    return min(medians, key=medians.get), medians


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of ``time[num] / time[den]`` (each round's two runs were back to back)."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine(device: torch.device | str = "cpu") -> dict:
    """`xfam_lib.utils.machine_record` of ``device``, with the logical CPUs and the 1-minute load average
    when the result is saved (other work slows timings); on CUDA also the CUDA, Triton and fla-core versions."""
    out = {**machine_record(device), "cpus": os.cpu_count(),
           "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    if torch.device(device).type == "cuda":
        out.update(cuda=torch.version.cuda, triton=_version("triton"), fla=_version("fla-core"))
    return out


def results_dir(device: torch.device | str = "cpu") -> Path:
    """``results/`` (or ``$XFAM_BENCH_RESULTS``) for the CPU, its ``cuda/`` folder for a GPU."""
    root = Path(os.environ.get("XFAM_BENCH_RESULTS") or RESULTS)
    return root / "cuda" if torch.device(device).type == "cuda" else root


def save(name: str, result: dict, fig=None, device: torch.device | str = "cpu") -> Path:
    """Write ``<results_dir>/<name>.json`` (and the figure as ``<name>.png``); print a one-line summary
    per check."""
    folder = results_dir(device)
    folder.mkdir(parents=True, exist_ok=True)
    result = {"name": name, **result, "machine": machine(device)}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if fig is not None:
        fig.savefig(folder / f"{name}.png", dpi=100, bbox_inches="tight")   # the book's dpi (plots.STYLE)
    for check in result.get("checks", []):
        print(f"{name}: {check['what']} = {check['value']:.3g} (target {check['target']}) "
              f"{'OK' if check['ok'] else 'MISSED'}")
    return path
