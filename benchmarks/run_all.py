"""Run every ``benchmarks/bench_*.py`` (each in its own process) and summarise their checks.

Usage: ``python benchmarks/run_all.py [name-filter]``. Results: ``benchmarks/results/*.json`` and ``*.png``.
Exit status 1 if a script fails; a missed target is reported but is not a failure (timings vary by machine).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    pattern = argv[1] if len(argv) > 1 else ""
    scripts = sorted(p for p in HERE.glob("bench_*.py") if pattern in p.stem)
    failed = []
    for script in scripts:
        print(f"=== {script.name}", flush=True)
        start = time.perf_counter()
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode != 0:
            failed.append(script.name)
        print(f"    ({time.perf_counter() - start:.1f} s)", flush=True)
    print("\n=== summary")
    for path in sorted((HERE / "results").glob("*.json")):
        result = json.loads(path.read_text())
        for check in result.get("checks", []):
            print(f"{result['name']:<22} {check['what']:<48} {check['value']:>8.3g}  target {check['target']:<8} "
                  f"{'OK' if check['ok'] else 'MISSED'}")
    if failed:
        print("failed scripts:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
