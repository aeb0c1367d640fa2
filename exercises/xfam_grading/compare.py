"""Comparing a submission's outputs with the expected ones: every difference, with its place."""
from __future__ import annotations

import math
from typing import Any

import torch

from xfam_lib.testing import assert_close, tolerance_for

_MAX_PROBLEMS = 12           # problems listed per case before "... and N more"


# ============================================================================= comparisons
def _index(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(out))


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _child(path: str, key: Any) -> str:
    if not path:
        return str(key) if isinstance(key, str) else f"item {key}"
    return f"{path}[{key!r}]"


def _collect(got: Any, expected: Any, path: str, out: list[str]) -> None:
    where = path or "the result"
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            out.append(f"{where}: expected a tensor of shape {tuple(expected.shape)} and dtype {expected.dtype}, "
                       f"got {_describe(got)}")
        elif got.layout != torch.strided:
            out.append(f"{where}: expected a dense tensor, got layout {got.layout}")
        elif got.shape != expected.shape:
            out.append(f"{where}: expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}")
        elif got.dtype != expected.dtype:
            out.append(f"{where}: expected dtype {expected.dtype}, got dtype {got.dtype} (shape {tuple(got.shape)})")
        elif expected.is_floating_point() or expected.is_complex():
            try:
                assert_close(got, expected, name=where)
            except AssertionError as exc:
                out.append(str(exc))
        else:
            differ = got != expected
            if bool(differ.any()):
                first = _index(int(differ.flatten().nonzero()[0]), got.shape)
                out.append(f"{where}: {int(differ.sum())} of {got.numel()} entries differ; first at index {first}: "
                           f"got {got[first].item()}, expected {expected[first].item()} "
                           f"(shape {tuple(got.shape)}, dtype {got.dtype})")
        return
    if (isinstance(expected, (bool, int, float)) and isinstance(got, torch.Tensor) and got.dim() == 0
            and not got.is_complex()):
        got = got.item()                      # a 0-dim tensor where a Python number was asked for
    if isinstance(expected, bool):
        if not isinstance(got, bool) or got != expected:
            out.append(f"{where}: expected {expected}, got {got!r}")
    elif isinstance(expected, int):
        if isinstance(got, bool) or not isinstance(got, int):
            out.append(f"{where}: expected the integer {expected}, got {_describe(got)}")
        elif got != expected:
            out.append(f"{where}: expected {expected}, got {got} (off by {got - expected})")
    elif isinstance(expected, float):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            out.append(f"{where}: expected a number close to {expected!r}, got {_describe(got)}")
        elif math.isnan(expected):
            if not (isinstance(got, float) and math.isnan(got)):
                out.append(f"{where}: expected NaN, got {got!r}")
        elif not math.isfinite(got) or abs(got - expected) > 1e-10 + 1e-8 * abs(expected):
            out.append(f"{where}: expected {expected!r}, got {got!r}")
    elif isinstance(expected, dict):
        if not isinstance(got, dict):
            out.append(f"{where}: expected a dict with keys {sorted(map(str, expected))}, got {_describe(got)}")
            return
        for key in expected:
            if key not in got:
                out.append(f"{_child(path, key) if path else key}: missing from the result")
            else:
                _collect(got[key], expected[key], _child(path, key), out)
    elif isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            out.append(f"{where}: expected a {type(expected).__name__} of length {len(expected)}, got {_describe(got)}")
        elif len(got) != len(expected):
            out.append(f"{where}: expected {len(expected)} items, got {len(got)}")
        else:
            for i, (g, e) in enumerate(zip(got, expected)):
                _collect(g, e, f"{path}[{i}]" if path else f"item {i}", out)
    elif expected is None or isinstance(expected, str):
        if got != expected:
            out.append(f"{where}: expected {expected!r}, got {got!r}")
    else:
        raise TypeError(f"output_problems: unsupported expected type {type(expected).__name__}")


# ============================================================================= hints: the shape of a mistake
def _constant_name(c: float) -> str:
    """``2.83`` -> ``2.83 (about √8)``: a ratio named when it is a small integer, its inverse or a square root."""
    for value, name in ((c, ""), (1 / c, "1/")):
        for n in range(2, 4097):
            if abs(value - n) <= 1e-3 * n and n <= 64:
                return f"{c:.4g} (about {name}{n})"
            if abs(value * value - n) <= 1e-3 * n and abs(value - round(value)) > 1e-3:
                return f"{c:.4g} (about {name}√{n})"
    return f"{c:.4g}"


def _constant_factor(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    e, g = expected.detach().double().flatten(), got.detach().double().flatten()
    if e.numel() < 2 or not (torch.isfinite(e).all() and torch.isfinite(g).all()):
        return None
    big = e.abs() > 0.1 * e.abs().max()
    if int(big.sum()) < 2 or float(e.abs().max()) == 0:
        return None
    ratio = g[big] / e[big]
    c = float(ratio.median())
    if abs(c) < 1e-12 or abs(c - 1) < 1e-3 or float((ratio - c).abs().max()) > 1e-4 * abs(c):
        return None
    if float((g - c * e).abs().max()) > 1e-4 * abs(c) * float(e.abs().max()):
        return None
    return (f"hint: your output is the expected one times the same constant everywhere, {_constant_name(c)}: "
            f"look for a scale or a normaliser applied once too often or not at all")


def _sequence_length(case: Any) -> int | None:
    """The sequence length of a case's input: ``q`` or ``x`` with positions on dim -2, or ``u`` on dim -1."""
    if isinstance(case, dict):
        for key, dim in (("q", -2), ("x", -2), ("u", -1)):
            value = case.get(key)
            if isinstance(value, torch.Tensor) and value.dim() >= -dim:
                return value.shape[dim]
    return None


def _position_hint(got: torch.Tensor, expected: torch.Tensor, case: Any, chunk: int | None) -> str | None:
    length = _sequence_length(case)
    dims = [d for d in (-2, -1) if got.dim() >= -d and got.shape[d] == length]
    if length is None or not dims:
        return None
    atol, rtol = tolerance_for(got, expected)
    g, e = got.detach().double().movedim(dims[0], 0), expected.detach().double().movedim(dims[0], 0)
    wrong = ((g - e).abs() > atol + rtol * e.abs()).reshape(length, -1).any(dim=1)
    if not bool(wrong.any()):
        return None
    first = int(wrong.nonzero()[0])
    if first == 0 and bool((g[0] == 0).all()) and bool((e[0] != 0).any()):
        return ("hint: at position 0 (t = 0) your output is 0 where it should not be: token t must see itself, so "
                "include position t in its own sum")
    if chunk is not None and 1 < chunk < length and first == chunk:
        return (f"hint: the first chunk (positions 0 to {chunk - 1}) is right and the error starts at position "
                f"{chunk}, the first of the second chunk: look at what one chunk passes to the next")
    if first == 1:
        return ("hint: position 0 is right and the error starts at position 1, the second step: look at what one "
                "step passes to the next")
    return None


def _tensor_pairs(got: Any, expected: Any):
    if isinstance(expected, torch.Tensor):
        if (isinstance(got, torch.Tensor) and got.shape == expected.shape and expected.is_floating_point()
                and got.is_floating_point()):
            yield got, expected
    elif isinstance(expected, dict) and isinstance(got, dict):
        for key in expected:
            if key in got:
                yield from _tensor_pairs(got[key], expected[key])
    elif isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(got) == len(expected):
        for g, e in zip(got, expected):
            yield from _tensor_pairs(g, e)


def mistake_hints(got: Any, expected: Any, case: Any = None) -> list[str]:
    """Hints for the common shapes of a wrong output, without the answer: a constant factor between
    ``got`` and ``expected``; an output that is 0 at t = 0; an error that starts at the second step
    or at the second chunk (``case["chunk_size"]``). Only tensors that fail the comparison are read."""
    chunk = case.get("chunk_size") if isinstance(case, dict) else None
    chunk = chunk if isinstance(chunk, int) and not isinstance(chunk, bool) else None
    hints = []
    for g, e in _tensor_pairs(got, expected):
        if not output_problems(g, e) or g.numel() == 0:
            continue
        try:
            hint = _constant_factor(g, e) or _position_hint(g, e, case, chunk)
        except RuntimeError:              # a shape the hints cannot read: the problems above still stand
            hint = None
        if hint and hint not in hints:
            hints.append(hint)
    return hints


def chunk_hint(params: list[dict], failing: list[dict]) -> str | None:
    """A hint when every case with ``chunk_size=1`` passes and every failing case has larger chunks."""
    sizes = [p.get("chunk_size") for p in params]
    if not failing or not all(isinstance(s, int) for s in sizes) or 1 not in sizes:
        return None
    if all(p.get("chunk_size", 1) > 1 for p in failing):
        return ("hint: the cases with chunk_size=1 pass and only larger chunks fail: look at the work inside a "
                "chunk (the part between tokens of the same chunk)")
    return None


def output_problems(got: Any, expected: Any, where: str = "") -> list[str]:
    """Every way ``got`` differs from ``expected``; empty when they match.

    Tensors must have the expected shape and dtype; integer and boolean tensors must be equal;
    floating tensors pass `xfam_lib.testing.assert_close` (element-wise, dtype-aware tolerances,
    NaN and inf where expected only). Python floats use the fp64 tolerance, ints and bools must
    be equal. Dicts, lists and tuples are compared item by item, and every item that differs is
    listed (the first twelve, then a count). Messages start with the name of the item.
    """
    problems: list[str] = []
    _collect(got, expected, where, problems)
    if len(problems) > _MAX_PROBLEMS:
        problems = problems[:_MAX_PROBLEMS] + [f"... and {len(problems) - _MAX_PROBLEMS} more"]
    return problems


def compare_outputs(got: Any, expected: Any, *, where: str = "") -> None:
    """Raise ``AssertionError`` listing every problem `output_problems` finds (for ``compare=`` functions)."""
    problems = output_problems(got, expected, where)
    if problems:
        raise AssertionError("; ".join(problems))



def _all_finite(value: Any) -> bool:
    """True when no tensor or number inside ``value`` is NaN or infinite."""
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex()) or bool(torch.isfinite(value).all())
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_all_finite(v) for v in value)
    return True


def nonfinite_problems(got: Any, expected: Any, where: str = "") -> list[str]:
    """Non-finite values in ``got`` where ``expected`` has finite ones.

    Item by item where the structures match (a tensor of the expected shape: element by element);
    elsewhere (a property check returns more than the reference) any NaN or infinity in ``got``
    is a problem when ``expected`` holds none. A check that reads ``if error > tol: fail`` passes
    on NaN; the judge runs this before every comparison, so such a check cannot be passed with NaN.
    """
    name = where or "the result"
    if isinstance(got, torch.Tensor) and (got.is_floating_point() or got.is_complex()):
        bad = ~torch.isfinite(got)
        if isinstance(expected, torch.Tensor) and expected.shape == got.shape and (
                expected.is_floating_point() or expected.is_complex()):
            bad &= torch.isfinite(expected)
        elif not _all_finite(expected):
            return []
        if bool(bad.any()):
            return [f"{name}: {int(bad.sum())} of {got.numel()} entries are NaN or infinite; expected finite "
                    f"values there, as in the reference"]
        return []
    if isinstance(got, float):
        finite = math.isfinite(got) or not _all_finite(expected)
        return [] if finite else [f"{name}: got {got!r}, expected a finite value (the reference is finite)"]
    if isinstance(got, dict):
        same = isinstance(expected, dict)
        return [p for k, v in got.items() for p in nonfinite_problems(
            v, expected[k] if same and k in expected else expected, f"{where}[{k!r}]" if where else str(k))]
    if isinstance(got, (list, tuple)):
        same = isinstance(expected, (list, tuple)) and len(expected) == len(got)
        return [p for i, v in enumerate(got) for p in nonfinite_problems(
            v, expected[i] if same else expected, f"{where}[{i}]" if where else f"item {i}")]
    return []
