"""Run every ``benchmarks/bench_*.py`` (each in its own process) and summarise their checks.

Usage: ``python benchmarks/run_all.py [name-filter] [--device cuda]``. Results: ``benchmarks/results/*.json``
and ``*.png``; with ``--device cuda`` only the scripts that take ``--device`` run, into ``results/cuda/``.
Exit status 1 if a script fails; a missed target is reported but is not a failure (timings vary by machine).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pattern", nargs="?", default="", help="run the scripts whose name holds this")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv[1:])
    scripts = sorted(p for p in HERE.glob("bench_*.py") if args.pattern in p.stem)
    if args.device == "cuda":          # the scripts wired for a GPU (common.add_device_arg / bench_device)
        scripts = [p for p in scripts if "bench_device" in p.read_text() or "add_device_arg" in p.read_text()]
    failed = []
    for script in scripts:
        print(f"=== {script.name}", flush=True)
        start = time.perf_counter()
        cmd = [sys.executable, str(script)] + (["--device", "cuda"] if args.device == "cuda" else [])
        if subprocess.run(cmd, cwd=HERE.parent).returncode != 0:
            failed.append(script.name)
        print(f"    ({time.perf_counter() - start:.1f} s)", flush=True)
    print("\n=== summary")
    folder = HERE / "results" / ("cuda" if args.device == "cuda" else "")
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        for check in result.get("checks", []):
            print(f"{result['name']:<22} {check['what']:<48} {check['value']:>8.3g}  target {check['target']:<8} "
                  f"{'OK' if check['ok'] else 'MISSED'}")
    if failed:
        print("failed scripts:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
