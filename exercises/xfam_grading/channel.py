"""The runner's reply channel: length-prefixed frames of plain data (tensors, numbers, strings)."""
from __future__ import annotations

import io
import os
import struct
from typing import Any

import torch

_MAX_MESSAGE = 64 * 2 ** 20  # bytes of one message from the runner


def _pack(message: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    data = buffer.getvalue()
    return struct.pack(">Q", len(data)) + data


def _unpack(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


class _Replies:
    """Frames written by the runner on its reply pipe."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, message: dict) -> None:
        data = memoryview(_pack(message))
        while data:
            data = data[os.write(self.fd, data):]


def _read_exactly(stream, n: int) -> bytes:
    chunks, remaining = [], n
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            raise EOFError("the request ended early")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)




# ----------------------------------------------------------------------------- what the judge accepts
_MAX_TOTAL = 256 * 2 ** 20       # bytes of all messages of one submission
_MAX_TEXT = 4000                 # characters of one message string
_MAX_ITEMS = 100_000             # values inside one output
_MAX_ELEMENTS = 2 ** 24          # tensor elements in one task's outputs, in all
_MAX_DEPTH = 32


def _is_data(value: Any, budget: list[int], depth: int = 0) -> bool:
    """Plain data only: dense CPU tensors, numbers, strings, None, lists, tuples, str-keyed dicts (bounded:
    ``budget`` is ``[values, tensor elements]`` left; every tensor has storage for all its elements)."""
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        return False
    if type(value) is torch.Tensor:
        if value.device.type != "cpu" or value.layout != torch.strided:
            return False
        if any(stride == 0 and n > 1 for n, stride in zip(value.shape, value.stride())):
            return False                          # a stride-0 view stands for more elements than it holds
        if value.numel():
            needed = value.storage_offset() + sum((n - 1) * st for n, st in zip(value.shape, value.stride())) + 1
            if value.untyped_storage().nbytes() < needed * value.element_size():
                return False
        budget[1] -= value.numel()                 # elements: what comparing them costs the judge
        return budget[1] >= 0
    if value is None or type(value) in (bool, int, float, str):
        return not isinstance(value, str) or len(value) <= _MAX_TEXT * 100
    if type(value) in (list, tuple):
        return all(_is_data(v, budget, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _is_data(v, budget, depth + 1) for k, v in value.items())
    return False


def _texts(value: Any, limit: int = 200) -> bool:
    return type(value) is list and len(value) <= limit and all(type(v) is str and len(v) <= _MAX_TEXT for v in value)


def _index_in(value: Any, n: int) -> bool:
    return type(value) is int and 0 <= value < n


def message_problem(message: Any, n_cells: int, tasks: list, seen: set[int]) -> str | None:
    """Why the judge rejects a message from the runner, or None: every field is checked.

    ``tasks``: the judge's tasks (``id``, ``names``, ``cases``); ``seen``: task ids already
    accepted (each is accepted once).
    """
    if type(message) is not dict or type(message.get("kind")) is not str:
        return "a message that is not a dict with a kind"
    kind, keys = message["kind"], set(message)
    if kind in ("tasks", "done"):
        return None if keys == {"kind"} else f"a {kind!r} message with other fields"
    if kind == "cell":
        return None if keys == {"kind", "index"} and _index_in(message["index"], n_cells) else "a malformed 'cell'"
    if kind == "cell error":
        ok = (keys == {"kind", "index", "error"} and _index_in(message["index"], n_cells)
              and type(message["error"]) is str and len(message["error"]) <= _MAX_TEXT)
        return None if ok else "a malformed 'cell error'"
    if kind == "flags":
        return None if keys == {"kind", "flags"} and _texts(message["flags"], 20) else "a malformed 'flags'"
    if kind != "task":
        return f"a message of unknown kind {kind[:40]!r}"
    if not keys <= {"kind", "id", "results", "violations", "missing", "error"} or \
            not {"id", "results", "violations", "missing"} <= keys:
        return "a 'task' message with missing or unknown fields"
    if not _index_in(message["id"], len(tasks)):
        return "a 'task' message for no task"
    if message["id"] in seen:
        return f"a second result for task {message['id']}"
    task = tasks[message["id"]]
    if not (_texts(message["violations"]) and _texts(message["missing"])
            and set(message["missing"]) <= set(task.names)):
        return f"malformed violations or missing names for task {message['id']}"
    if "error" in message and not (type(message["error"]) is str and len(message["error"]) <= _MAX_TEXT):
        return f"a malformed error for task {message['id']}"
    results = message["results"]
    if type(results) is not list or len(results) not in (0, len(task.cases)):
        return f"a result count that is not the case count for task {message['id']}"
    budget = [_MAX_ITEMS * max(1, len(results)), _MAX_ELEMENTS]
    for result in results:
        if type(result) is not dict or type(result.get("ok")) is not bool:
            return f"a malformed case result for task {message['id']}"
        if result["ok"]:
            if set(result) != {"ok", "value"} or not _is_data(result["value"], budget):
                return f"a case output that is not plain data for task {message['id']}"
        elif set(result) != {"ok", "error"} or type(result["error"]) is not str or len(result["error"]) > _MAX_TEXT:
            return f"a malformed case error for task {message['id']}"
    return None
