"""Device choice, seeding, size presets, argument checks, `show_source` and the machine record of a
saved result.

This is the bottom of the library: it imports nothing from the rest of `xfam_lib`.
"""
from __future__ import annotations

import inspect
import math
import numbers
import os
import platform
import random
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "pick_device",
    "seed_everything",
    "SizePreset",
    "size_preset",
    "show_source",
    "check_tensor",
    "check_positive_int",
    "check_int",
    "check_real",
    "check_bool",
    "check_token_ids",
    "check_instance",
    "check_same_dtype",
    "check_qkv",
    "resolve_scale",
    "broadcasts_to",
    "check_broadcasts_to_scores",
    "check_bias",
    "BlockSizeError",
    "check_block_size",
    "glue",
    "compute_dtype",
    "machine_record",
    "same_machine",
]


def pick_device(prefer: str | None = None) -> torch.device:
    """The device chapters run on: ``prefer`` if given, else CUDA when available, else CPU.

    The environment variable ``XFAM_DEVICE`` overrides both (e.g. ``XFAM_DEVICE=cpu``).
    """
    choice = os.environ.get("XFAM_DEVICE") or prefer
    if choice:
        return torch.device(choice)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); returns a CPU ``torch.Generator`` with that seed.

    ``seed`` is a non-negative int (a NumPy integer too)."""
    seed = check_int("seed", seed, low=0)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True)
class SizePreset:
    """One size knob for a chapter: ``scale`` multiplies every demo size.

    ``scale`` is 1 on a CPU and larger on a GPU; use ``n(x)`` to scale an integer size.
    """

    name: str
    scale: int

    def __post_init__(self):
        check_positive_int("scale", self.scale)

    def n(self, base: int, multiple: int = 1) -> int:
        """``base * scale``, rounded down to a multiple of ``multiple`` (at least ``multiple``)."""
        base, multiple = check_positive_int("base", base), check_positive_int("multiple", multiple)
        return max(multiple, (base * int(self.scale)) // multiple * multiple)


def size_preset(device: torch.device | str | None = None) -> SizePreset:
    """``SizePreset("cpu", 1)`` on a CPU, ``SizePreset("gpu", 4)`` on CUDA.

    ``XFAM_SIZE_SCALE`` overrides the scale (e.g. to try GPU sizes on a big CPU).
    """
    device = torch.device(device) if device is not None else pick_device()
    scale = 4 if device.type == "cuda" else 1
    override = os.environ.get("XFAM_SIZE_SCALE")
    if override:
        scale = int(override)
        if scale < 1:
            raise ValueError(f"XFAM_SIZE_SCALE must be a positive integer, got {override!r}")
    return SizePreset("gpu" if device.type == "cuda" else "cpu", scale)


def show_source(obj) -> None:
    """Display the source code of a library function or class with syntax highlighting.

    In a notebook this renders highlighted HTML/Markdown; elsewhere it prints the source.
    Chapters use it so that the code the reader sees *is* the library's code.
    """
    source = inspect.getsource(obj)
    try:
        from IPython.display import Markdown, display

        display(Markdown(f"```python\n{source}```"))
    except ImportError:  # pragma: no cover - IPython is always there in notebooks
        print(source)


# ----------------------------------------------------------------------------- argument checks
# The library's one set of validators (the error contract in the README): each raises
# ``TypeError`` for a value of the wrong type and ``ValueError`` for a value out of range, with a
# message that names the public argument and shows the value or shape it got.
def check_tensor(name: str, x, *, min_rank: int = 0, rank: int | None = None, floating: bool = False) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``name`` unless ``x`` is a tensor of the asked rank/kind."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if rank is not None and x.dim() != rank:
        raise ValueError(f"{name} must have {rank} dims, got shape {tuple(x.shape)}")
    if x.dim() < min_rank:
        raise ValueError(f"{name} must have at least {min_rank} dims, got shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_int(name: str, value, *, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an ``int`` if it is an integer (Python or NumPy, never a bool) in
    ``[low, high]`` (either bound may be None); otherwise raise naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else (f"<= {high}" if low is None else f"in [{low}, {high}]")
        raise ValueError(f"{name} must be an int {bounds}, got {value}")
    return int(value)


def check_positive_int(name: str, value) -> int:
    """Return ``value`` if it is a positive ``int``; otherwise raise naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)


def check_real(name: str, value, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False) -> float:
    """Return ``value`` as a ``float`` if it is a finite real number (Python, NumPy or a one-element
    tensor; never a bool) in the interval from ``low`` to ``high`` (None: unbounded; ``*_open``
    excludes the bound). NaN and infinities fail, whatever the bounds."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not (value.is_complex() or value.dtype == torch.bool):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    value = float(value)
    inside = math.isfinite(value)
    inside = inside and (low is None or (value > low if low_open else value >= low))
    inside = inside and (high is None or (value < high if high_open else value <= high))
    if not inside:
        left = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
        right = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
        raise ValueError(f"{name} must be in {left}, {right} (a finite number), got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    """Return ``value`` if it is a bool (Python or NumPy); otherwise raise ``TypeError`` naming ``name``
    (a string or a number is not taken as a truth value)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} of type {type(value).__name__}")
    return bool(value)


def check_token_ids(name: str, ids, vocab: int | None, *, rank: int | None = None, vocab_name: str = "vocab",
                    ignore_index: int | None = None) -> None:
    """``ids`` must be an integer tensor (of ``rank`` dims, when given) whose values lie in
    ``[0, vocab)`` (``vocab=None``: only ``>= 0``), except those equal to ``ignore_index``. One
    ``aminmax`` and one host sync per call: check a whole prompt or batch once, never token by token
    inside a decoding loop."""
    check_tensor(name, ids, rank=rank)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be integer token ids, got dtype {ids.dtype}")
    kept = ids if ignore_index is None else ids[ids != ignore_index]
    if kept.numel():
        lo, hi = (int(t) for t in torch.aminmax(kept))
        if lo < 0 or (vocab is not None and hi >= vocab):
            valid = "non-negative" if vocab is None else f"in [0, {vocab_name}={vocab})"
            ignored = "" if ignore_index is None else f" (or equal ignore_index={ignore_index})"
            raise ValueError(f"{name} must be {valid}{ignored}, got ids in [{lo}, {hi}]")


def check_instance(name: str, value, cls) -> None:
    """Raise ``TypeError`` naming ``name`` unless ``value`` is an instance of ``cls`` (a class or a tuple)."""
    if not isinstance(value, cls):
        names = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise TypeError(f"{name} must be an instance of {names}, got {type(value).__name__}")


def check_same_dtype(**tensors: torch.Tensor) -> None:
    """Raise ``TypeError`` listing the dtypes if the named tensors do not share one dtype."""
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        seen = ", ".join(f"{n}={d}" for n, d in dtypes.items())
        raise TypeError(f"dtypes must match, got {seen}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, same_length: bool = False) -> None:
    """Validate attention inputs ``q (..., Lq, d_k)``, ``k (..., Lk, d_k)``, ``v (..., Lk, d_v)``.

    Floating tensors of rank >= 2 and one dtype, with the same leading dims; ``q`` and ``k`` share
    ``d_k``; ``k`` and ``v`` share the key length. ``same_length=True`` (the recurrent forms, where
    query ``t`` reads the state after key ``t``) also asks ``Lq == Lk > 0``. Errors name the shapes.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, min_rank=2, floating=True)
    check_same_dtype(q=q, k=k, v=v)
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if not q.dim() == k.dim() == v.dim():
        raise ValueError(f"q, k, v must have the same rank (..., L, d), got {shapes}")
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"q, k, v must share their leading dims (e.g. batch, heads), got {shapes}")
    if same_length:
        if not q.shape[-2] == k.shape[-2] == v.shape[-2]:
            raise ValueError(f"q, k, v must share the sequence length L (dim -2), got {shapes}")
        if q.shape[-2] == 0:
            raise ValueError(f"the sequence length L (dim -2) must be positive, got {shapes}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size d_k (dim -1), got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the key length (dim -2), got {shapes}")


def resolve_scale(scale, d_k: int) -> float:
    """The score scale: ``1/sqrt(d_k)`` for ``None``, else ``scale``, a positive finite real number."""
    if scale is None:
        d_k = check_positive_int("d_k (the feature size of q and k)", d_k)
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return float(scale)


def broadcasts_to(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without enlarging it (no extra or larger dims)."""
    try:
        return torch.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except RuntimeError:
        return False


def check_broadcasts_to_scores(name: str, t: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
    """``t`` must broadcast to the scores ``(..., Lq, Lk)`` without enlarging them (no extra or larger batch dims)."""
    scores = tuple(q.shape[:-2]) + (q.shape[-2], k.shape[-2])
    if not broadcasts_to(t.shape, scores):
        raise ValueError(f"{name} of shape {tuple(t.shape)} must broadcast to the scores {scores} (q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}) without enlarging them")


def check_bias(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> None:
    """``bias`` is None or a floating tensor that broadcasts to the scores of ``q`` and ``k``."""
    if bias is not None:
        check_tensor("bias", bias, floating=True)
        check_broadcasts_to_scores("bias", bias, q, k)


class BlockSizeError(ValueError, TypeError):
    """A bad block size: raised for non-positive *and* non-integer sizes (like NumPy's ``AxisError``,
    it is both a ``ValueError`` and a ``TypeError``, so either ``except`` catches it)."""


def check_block_size(name: str, value) -> int:
    """Return ``value`` if it is a positive int; otherwise raise `BlockSizeError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise BlockSizeError(f"{name} must be a positive int, got {value!r} of type {type(value).__name__}")
    if value <= 0:
        raise BlockSizeError(f"{name} must be a positive int, got {value}")
    return int(value)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an algorithm computes in: fp32 for fp16/bf16 inputs (accumulate in fp32), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


GLUE_PREFIX = "application/papermill.record/"


def glue(**values) -> None:
    """Make computed values available to a chapter's prose as ``{glue:text}`name```.

    Emits, for each ``name=value``, the hidden output that ``myst_nb.glue(name, value,
    display=False)`` emits (the book build copies it into the text; a notebook frontend shows
    nothing), without importing myst-nb, which costs seconds per chapter and is absent on Colab.
    NumPy and torch scalars are glued as Python numbers. tests/test_0_core.py checks the output
    equals myst-nb's.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    for name, value in values.items():
        value = value.item() if isinstance(value, (np.generic, torch.Tensor)) else value
        bundle, metadata = format_display_data(value)
        metadata["scrapbook"] = {"name": name, "mime_prefix": GLUE_PREFIX}
        display({GLUE_PREFIX + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)


# What decides whether a rerun repeats a saved run bit for bit. PyTorch promises no bitwise equality
# across versions, CPU kernel sets (ATEN_CPU_CAPABILITY), thread counts, CPU models or devices.
MACHINE_KEYS = ("torch", "cpu_capability", "threads", "cpu", "device")


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_record(device: torch.device | str = "cpu", *, threads: int | None = None) -> dict:
    """The machine a result is computed on, as saved results record it: torch version, the CPU kernel
    set PyTorch dispatches to (``torch.backends.cpu.get_cpu_capability()``, e.g. ``AVX512``), intra-op
    threads (``threads``, default ``torch.get_num_threads()``), CPU model, device (``cpu`` or the
    GPU's name), Python and platform."""
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": int(threads if threads is not None else torch.get_num_threads()),
            "cpu": _cpu_model(), "device": name, "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}"}


def same_machine(record: dict | None, device: torch.device | str = "cpu") -> bool:
    """Whether a run here on ``device`` would repeat, bit for bit, a saved run made on ``record``'s
    machine: the same torch version, CPU kernel set, thread count, CPU model and device. A record that
    lacks any of these (older saved results) never matches, so it is compared within its seeds'
    spread instead (`xfam_lib.testing.assert_within_seed_spread`)."""
    if not isinstance(record, dict):
        return False
    here = machine_record(device)
    return all(key in record and record[key] == here[key] for key in MACHINE_KEYS)
