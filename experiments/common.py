"""Shared helper for the experiment scripts: write a result file with its wall time and machine.

The scripts run as ``python experiments/<name>.py``, so this module is imported as ``common``.
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch


def save_result(path: Path, result: dict, *, threads: int, start: float) -> dict:
    """Add ``wall_time_s`` (since ``start``, a ``time.perf_counter()`` value) and ``machine`` to
    ``result``, write it to ``path`` as JSON (creating the folder) and return it."""
    result = {**result, "wall_time_s": round(time.perf_counter() - start, 1),
              "machine": {"torch": torch.__version__, "threads": threads, "python": platform.python_version(),
                          "platform": f"{platform.system()} {platform.machine()}"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path} in {result['wall_time_s']:.0f} s")
    return result
