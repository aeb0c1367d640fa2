"""Shared helpers for the experiment scripts: their common options, the arena sweep's recipe, writing a
result file with its wall time and machine, and refusing to add runs to a result saved on another machine.

The scripts run as ``python experiments/<name>.py``, so this module is imported as ``common``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from xfam_lib.utils import MACHINE_KEYS, machine_record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
SWEEP = ROOT / "benchmarks" / "results" / "arena.json"


def parser(doc: str, out: Path, *, quick_help: str = "one seed, 30 steps") -> argparse.ArgumentParser:
    """An argument parser with the options every script has: ``--threads``, ``--quick``, ``--out``."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", type=Path, default=out)
    return p


def quick(cfg: dict) -> dict:
    """``cfg`` cut to one seed and 30 steps (the scripts' ``--quick``)."""
    return {**cfg, "seeds": cfg["seeds"][:1], "steps": 30}


def arena_recipe(defaults: dict) -> tuple[dict, dict | None]:
    """``defaults`` updated with the arena sweep's saved config (the keys they share), so that a script's
    runs are comparable with the sweep's; also returns that saved config (None if the sweep file is absent)."""
    if not SWEEP.exists():
        return dict(defaults), None
    saved = json.loads(SWEEP.read_text())["config"]
    return {**defaults, **{k: saved[k] for k in defaults if k in saved}}, saved


def recipe_from() -> str:
    """Where `arena_recipe` took its numbers from, for the result file."""
    return str(SWEEP.relative_to(ROOT)) if SWEEP.exists() else "defaults"


def save_result(path: Path, result: dict, *, threads: int, start: float) -> dict:
    """Add ``wall_time_s`` (since ``start``, a ``time.perf_counter()`` value) and ``machine``
    (`xfam_lib.utils.machine_record`: what a chapter needs to tell whether a rerun here repeats it bit for
    bit) to ``result``, write it to ``path`` as JSON (creating the folder) and return it."""
    result = {**result, "wall_time_s": round(time.perf_counter() - start, 1),
              "machine": machine_record("cpu", threads=threads)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path} in {result['wall_time_s']:.0f} s")
    return result


def check_same_machine(saved, here: dict, *, action: str) -> None:
    """Raise a ``ValueError`` unless ``saved`` (the ``machine`` entry of a saved result) and ``here`` (a
    `machine_record`) agree on every key of `xfam_lib.utils.MACHINE_KEYS`, as `xfam_lib.utils.same_machine`
    asks: runs added to a saved result must repeat its machine. ``action`` names what is refused. A record
    without these keys (saved before `machine_record`, or a bare string) never agrees."""
    record = saved if isinstance(saved, dict) else {}
    differ = [f"{key}: saved {record[key]!r}, here {here[key]!r}" if key in record else
              f"{key}: not in the saved record, here {here[key]!r}" for key in MACHINE_KEYS
              if key not in record or record[key] != here[key]]
    if differ:
        raise ValueError(f"cannot {action}: the saved results come from another machine, or their record "
                         f"predates machine_record ({'; '.join(differ)})")
