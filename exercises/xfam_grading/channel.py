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


