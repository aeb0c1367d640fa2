"""A memory budget held by the operating system: the student's call in a child process under an
address-space limit, so that no allocation (torch with its dispatch hooks disabled, numpy, a C
extension) escapes it."""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import select
import signal
import struct
import sys
import time
from typing import Any, Callable

from .checks import DEFAULT_TIME_LIMIT, _describe

_OUT_OF_MEMORY = ("can't allocate memory", "not enough memory", "out of memory", "cannot allocate memory")


def _address_space() -> int | None:
    """This process's mapped address space in bytes (``VmSize``), None where /proc does not say."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    return None


def memory_budget_available() -> bool:
    """Whether `run_with_memory_budget` can hold a budget here (Linux: ``fork`` and /proc)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux") and _address_space() is not None


def _limit_this_process(budget_bytes: int) -> None:
    """In the child: one thread, one malloc arena, and an address space of at most what is mapped now
    plus ``budget_bytes`` (soft and hard, so the student's code cannot raise it)."""
    import ctypes

    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None)
        libc.mallopt(-8, 1)                              # M_ARENA_MAX: no new arena's reserved 64 MiB
        # M_MMAP_THRESHOLD, fixed (which also stops glibc from raising it after a free): every block of
        # 128 KiB or more gets its own mapping and gives it back when freed. Otherwise such blocks can
        # come from the heap, where a freed one need not fit the next aligned request, and a loop over
        # blocks grows the address space by one block per step until a correct answer hits the limit.
        libc.mallopt(-3, 128 * 1024)
    limit = _address_space() + budget_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child(fn: Callable[[], Any], budget_bytes: int, write_fd: int) -> None:
    reply: dict[str, Any]
    try:
        _limit_this_process(budget_bytes)
        try:
            value = fn()
            reply = {"value": value, "over": False, "error": ""}
        except MemoryError as exc:
            reply = {"value": None, "over": True, "error": _describe(exc)}
        except Exception as exc:
            over = isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in _OUT_OF_MEMORY)
            reply = {"value": None, "over": over, "error": _describe(exc)}
        from .guard import installed_guard

        guard = installed_guard()
        reply["violations"] = dict(getattr(guard, "violations", {}) or {})
        reply["flags"] = list(getattr(guard, "flags", []) or [])
        buffer = io.BytesIO(b"T")
        buffer.seek(1)
        import torch

        torch.save(reply, buffer)
        data = buffer.getvalue()
    except BaseException as exc:                          # the reply itself did not fit: over the budget
        data = b"J" + json.dumps({"over": isinstance(exc, MemoryError), "error": _describe(exc)}).encode()
    with contextlib.suppress(Exception):
        os.write(write_fd, struct.pack("<Q", len(data)))
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]
    os._exit(0)


def run_with_memory_budget(fn: Callable[[], Any], budget_bytes: int, *,
                           seconds: float = DEFAULT_TIME_LIMIT) -> dict[str, Any]:
    """Call ``fn()`` in a child process whose address space may grow by at most ``budget_bytes``.

    Returns ``{"value": what fn returned, "over": bool, "error": str}``: ``over`` when an allocation
    failed for the limit (torch's RuntimeError or a MemoryError), ``error`` what the call raised
    (``"your code raised ..."``); a call over ``seconds`` is killed. The limit is the kernel's
    (RLIMIT_AS), so it holds whatever allocates. Off-limits uses and review flags the child's
    tripwires record are added to this process's. Linux only (`memory_budget_available`).
    """
    if not memory_budget_available():
        raise RuntimeError("a memory budget needs Linux (fork and /proc); run the check on Linux or Colab")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:                                          # the child
        os.close(read_fd)
        try:
            _child(fn, budget_bytes, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return {"value": None, "over": False, "error": "your code did not finish within the time limit"}
            ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(read_fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read_fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    data = b"".join(chunks)
    if len(data) < 8 or len(data) != 8 + struct.unpack("<Q", data[:8])[0]:
        return {"value": None, "over": False, "error": "your code ended its process before it returned"}
    tag, body = data[8:9], data[9:]
    try:
        import torch

        reply = torch.load(io.BytesIO(body), weights_only=True) if tag == b"T" else json.loads(body)
    except Exception as exc:
        reply = {"error": f"its reply could not be read ({type(exc).__name__})"}
    from .guard import installed_guard

    guard = installed_guard()
    if guard is not None:
        for question, found in (reply.get("violations") or {}).items():
            seen = guard.violations.setdefault(question, [])
            seen += [v for v in found if v not in seen]
        guard.flags += [f for f in reply.get("flags") or [] if f not in guard.flags]
    return {"value": reply.get("value"), "over": bool(reply.get("over")), "error": str(reply.get("error") or "")}
