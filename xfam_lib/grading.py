"""Grading for the book's exercises: checks with clear messages, and a judge that a submission cannot game.

Exercise tests call one function, `check_cases`. A test names its cases, builds each case's
inputs, calls the student's code through a small ``submission`` adapter, and says what the
answer should be::

    def test_q1a_masks(sdpa):
        import torch
        from xfam_lib.grading import check_cases

        def make_case(p):                      # inputs only: tensors, numbers, strings, lists, dicts
            return {"q": torch.randn(p["lq"], 8), ...}

        def submission(c):                     # the only place that touches the student's code
            out, weights = sdpa(c["q"], c["k"], c["v"], c["mask"])
            return {"out": out, "weights": weights}

        def reference(c):                      # the expected outputs, computed from the inputs
            ...

        check_cases("masks", params=[{"lq": 4, "lk": 6}, {"lq": 1, "lk": 1}],
                    make_case=make_case, submission=submission, reference=reference)

Where a check runs
------------------
* **In one process** (a student's ``grader.check``, which runs only the public tests, and the
  master notebook): every case is built, the student's code runs, the reference is computed and
  compared, and every failing check is listed with its case parameters. This is feedback only.
* **Under the judge** (`Judge`, used by ``make grade`` and, through the otter plugin `OtterJudge`,
  by ``otter run``, ``otter grade`` and Gradescope): the judge process runs the test functions
  with `check_cases` in *collect* mode. It builds every case and computes every expected value
  itself, and keeps the source of each ``submission`` adapter. The student's notebook then runs
  in a separate **runner** process that receives only the notebook's code, the adapters' source
  and the inputs; it sends back the outputs as data (``torch.load(weights_only=True)``). The judge
  compares and scores. The runner never holds a reference function, an expected value or a
  verdict, so looking through frames, the garbage collector or module namespaces finds nothing to
  copy, and patching the runner's torch, otter or this module changes nothing the judge computes.

The runner is sandboxed (`Limits`): limits on memory, CPU time, processes, file size and open
files, on the time of a cell, of a call and of the whole submission; a private scratch
directory; where the OS allows (root, or unprivileged user namespaces on Linux) new mount,
network and PID namespaces, so it has no network, cannot see the hidden tests or the master
notebooks, and every process it starts dies with it; as root it also runs under an
unprivileged uid of its own, so it cannot write the grader's files and the process limit is
its own. Without namespaces the judge refuses to run unless told ``isolation="basic"`` (the
otter plugin allows it: there each submission has its own container).

Two lines of defence against "not writing it yourself"
------------------------------------------------------
Each question's ``off_limits`` (in the master notebook, next to the question) lists the library
names it asks the student to write. (1) `scan_code` reads the notebook's code as a syntax tree:
an import, attribute access or ``getattr`` that reaches such a name, however it is spelled
(aliases, string concatenation, ``importlib``), scores the question 0. (2) In the runner those
names are replaced by tripwires: calling one from the student's code (however it was obtained)
raises `OffLimitsError` and scores the question 0. `scan_code` also reports **review flags**
(patching torch or otter, starting processes, reading frames, writing files, ...) for a person
to read; they are a second line, not the defence.

What this does not stop: code that copies a solution (from the public repository or from a
classmate), or that re-implements the library by reading its source file (the flags point at
the second); and properties a test measures inside the runner (a memory budget, a kernel spy)
can be forged by code that patches the measuring functions (flagged too).

This module imports only the standard library, ``torch`` and ``xfam_lib.testing`` at import time.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import ctypes
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import inspect
import io
import json
import math
import os
import re
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import symtable
import tempfile
import textwrap
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from .testing import assert_close

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "SubmissionTimeout",
    "OffLimitsError",
    "time_limit",
    "output_problems",
    "compare_outputs",
    "case_label",
    "check_cases",
    "Limits",
    "scan_code",
    "notebook_code_cells",
    "Judge",
    "Report",
    "OtterJudge",
    "otter_notebook",
]

DEFAULT_TIME_LIMIT = 20.0    # seconds one call of the student's code may take (an endless loop stops there)
PLUGIN_NAME = "xfam_lib.grading.OtterJudge"
_MAX_PROBLEMS = 12           # problems listed per case before "... and N more"
_MAX_MESSAGE = 64 * 2 ** 20  # bytes of one message from the runner


class SubmissionTimeout(BaseException):
    """Raised inside the student's code when its time is up (a ``BaseException``: ``except Exception`` misses it)."""


class OffLimitsError(BaseException):
    """Raised when the student's code calls a library function its question asks them to write."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise `SubmissionTimeout` in the block after ``seconds`` (POSIX main thread; elsewhere no limit).

    The alarm repeats every second until the block ends: an exception raised where Python ignores it
    (an at-fork handler, a ``__del__``) does not let an endless loop escape.
    """
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def _alarm(signum, frame):
        raise SubmissionTimeout(f"time limit of {seconds:g} s exceeded")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, min(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


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


# ============================================================================= cases: parameters, inputs, outputs
_SIMPLE = (bool, int, float, str, type(None))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def case_label(param: dict) -> str:
    """``{"interleaved": True, "n_heads": 12}`` -> ``interleaved=True, n_heads=12``."""
    return ", ".join(f"{key}={_short(value)}" for key, value in param.items())


def _simple(value: Any) -> bool:
    return isinstance(value, _SIMPLE) or (isinstance(value, (tuple, list)) and all(_simple(v) for v in value))


def _checked_params(label: str, params: Iterable[Any]) -> list[dict]:
    params = list(params)
    if not params:
        raise ValueError(f"check_cases({label!r}): params is empty")
    for p in params:
        if not (isinstance(p, dict) and p and all(isinstance(k, str) for k in p) and all(map(_simple, p.values()))):
            raise TypeError(f"check_cases({label!r}): each case parameter must be a dict naming its values "
                            f"(numbers, strings, tuples), e.g. {{'n_heads': 12}}; got {_short(p)}")
    return params


def _as_data(value: Any, where: str) -> Any:
    """``value`` if it is made only of CPU tensors, numbers, strings, None, dtypes, lists, tuples and str-keyed dicts."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            raise TypeError(f"{where}: a {type(value).__name__} (tensor subclass) is not plain data")
        if value.device.type != "cpu" or value.layout != torch.strided:
            raise TypeError(f"{where}: tensors passed between processes must be dense CPU tensors")
        return value.detach()
    if isinstance(value, _SIMPLE) or isinstance(value, torch.dtype):
        return value
    if isinstance(value, (list, tuple)):
        items = [_as_data(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _as_data(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{where}: make_case must return data (tensors, numbers, strings, lists, tuples, dicts); "
                    f"got {type(value).__name__}. Build objects such as modules inside submission() from the data.")


def _plain(value: Any, where: str) -> Any:
    """A copy of the student's output made only of CPU tensors, numbers, strings, None, lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu")
        if value.layout != torch.strided:
            value = value.to_dense()
        value = value.clone()
        return value if type(value) is torch.Tensor else value.as_subclass(torch.Tensor)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:   # numpy scalar
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise ValueError(f"{where}: expected tensors or numbers, got an object of type {type(value).__name__}")


@contextlib.contextmanager
def _fixed_state(seed: int):
    """Deterministic global state for building a case: seeded RNG, float32 default dtype; restored after."""
    dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_default_dtype(torch.float32)
        try:
            yield
        finally:
            torch.set_default_dtype(dtype)


def _seed_of(param: Any) -> int:
    """A stable integer seed from a case parameter."""
    return sum((i + 1) * ord(ch) for i, ch in enumerate(repr(param))) % (2 ** 31)


def _build(make_case: Callable[[dict], Any], param: dict) -> Any:
    with _fixed_state(_seed_of(param)):
        return make_case(param)


@contextlib.contextmanager
def _one_thread():
    """Run the tiny grading workloads on one intra-op thread (much faster than 2+ threads on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _student_frame_note(exc: BaseException) -> str:
    """`` (in f, line 3)`` for the innermost traceback frame in the student's code, if any."""
    skip = (str(Path(__file__).resolve().parent), str(Path(torch.__file__).resolve().parent), sys.base_prefix,
            sys.prefix, "<check ")
    note, tb = "", exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(skip) and "site-packages" not in filename:
            note = f" (in {tb.tb_frame.f_code.co_name}, line {tb.tb_lineno} of its cell)"
        tb = tb.tb_next
    return note


_TIMEOUT = "your code did not finish within the time limit"


def _call_student(fn: Callable[[Any], Any], case: Any, limit: float | None) -> tuple[bool, Any]:
    """(True, output) or (False, a message saying what went wrong)."""
    try:
        with time_limit(limit):
            return True, fn(case)
    except SubmissionTimeout:
        return False, f"{_TIMEOUT} of {limit:g} s (an endless loop?)"
    except OffLimitsError as exc:
        return False, str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:     # the student's own error (SystemExit included) is a failed check
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return False, f"your code raised {type(exc).__name__}{': ' + text if text else ''}{_student_frame_note(exc)}"


def _judge_case(compare, case: Any, got: Any, expected: Any) -> list[str]:
    if compare is None:
        return output_problems(got, expected)
    try:
        compare(case, got, expected)
    except AssertionError as exc:
        return [str(exc)]
    return []


def _format_failures(label: str, n_cases: int, failures: list[tuple[dict, list[str]]]) -> str:
    """One readable message for every failing case of one check."""
    if len(failures) == n_cases > 1 and all(f[1] == failures[0][1] for f in failures) and len(failures[0][1]) == 1:
        return f"[{label}] every case ({n_cases}): {failures[0][1][0]}"
    if len(failures) == 1 and len(failures[0][1]) == 1:
        prefix = f"[{label}] case {case_label(failures[0][0])}" + (f" ({n_cases - 1} other cases pass)" if n_cases > 1 else "")
        return f"{prefix}: {failures[0][1][0]}"
    lines = [f"[{label}] {len(failures)} of {n_cases} cases fail:" if n_cases > 1 else f"[{label}]"]
    for param, problems in failures:
        lines.append(f"  case {case_label(param)}:")
        lines += [f"    - {problem}" for problem in problems]
    return "\n".join(lines)


# ============================================================================= check_cases
_COLLECTOR: "_Collector | None" = None     # set only in the judge process, while it collects the checks


def _missing_arguments(frame) -> list[str]:
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return [name for name in names if frame.f_locals.get(name) is None]


def missing_name_message(names: list[str], why: str = "") -> str:
    """What to tell a student whose notebook does not define ``names``."""
    listed = ", ".join(f"`{n}`" for n in names)
    return (f"{listed} {'is' if len(names) == 1 else 'are'} not defined. The checks look the answer up by this name, "
            f"so keep the name and signature from the question, and run the cell that defines it (after a restart, "
            f"run the notebook from the top)." + (f" {why}" if why else ""))


def check_cases(label: str, *, params: Iterable[dict], make_case: Callable[[dict], Any],
                submission: Callable[[Any], Any], reference: Callable[[Any], Any],
                compare: Callable[[Any, Any, Any], None] | None = None, limit: float | None = None) -> None:
    """Run ``submission`` on every case and check it against ``reference``; list every failing check.

    Args:
        label: names this check in messages; unique within the calling test function.
        params: one dict per case naming its parameters (numbers, strings, tuples), e.g.
            ``{"interleaved": True, "n_heads": 12}``; messages label cases with them.
        make_case: ``param -> inputs``, data only (tensors, numbers, strings, lists, tuples, dicts).
            It runs with a seeded RNG and float32 default dtype, so it is deterministic.
        submission: ``inputs -> outputs``, the adapter that calls the student's code. It may use only
            its argument, the test function's parameters (the student's names), ``torch``, ``math``
            and what it imports itself: under the judge its source runs in the student's process.
        reference: ``inputs -> expected outputs`` (same structure as the outputs).
        compare: ``(inputs, got, expected) -> None``, raising ``AssertionError``; default
            `output_problems`. Use it for property checks.
        limit: seconds for one call of ``submission`` (default `DEFAULT_TIME_LIMIT`).

    Raises ``AssertionError`` listing every failing case and output. Under the judge it only
    records the check (see the module docstring).
    """
    params = _checked_params(label, params)
    if _COLLECTOR is not None:
        _COLLECTOR.add(label, params, make_case, submission, reference, compare, limit)
        return
    missing = _missing_arguments(sys._getframe(1))
    if missing:
        raise AssertionError(f"[{label}] " + missing_name_message(missing))
    limit = DEFAULT_TIME_LIMIT if limit is None else limit
    failures, stuck = [], None
    with _one_thread():
        for param in params:
            if stuck:                      # an endless loop would only time out again: skip the rest
                failures.append((param, [stuck]))
                continue
            ok, got = _call_student(submission, _build(make_case, param), limit)
            if not ok and got.startswith(_TIMEOUT):
                stuck = got
            if ok:
                try:
                    got = _plain(got, "output")
                except ValueError as exc:
                    ok, got = False, str(exc)
            if not ok:
                failures.append((param, [got]))
                continue
            case = _build(make_case, param)
            problems = _judge_case(compare, case, got, reference(case))
            if problems:
                failures.append((param, problems))
    if failures:
        raise AssertionError(_format_failures(label, len(params), failures))


# ============================================================================= collecting checks (judge side)
@dataclass
class Task:
    """One `check_cases` call, collected by the judge: inputs and expected outputs of every case."""

    id: int
    question: str
    test: str                      # the test function's name
    label: str
    adapter: str                   # source of the submission adapter (runs in the student's process)
    adapter_name: str
    names: list[str]               # the student's names the adapter may use
    params: list[dict]
    cases: list[Any]
    expected: list[Any]
    compare: Callable | None
    limit: float | None            # seconds per call; None: the judge's Limits.call_seconds

    def spec(self, call_seconds: float = DEFAULT_TIME_LIMIT) -> dict:
        """What the runner receives: no expected values, no reference, no compare function."""
        return {"id": self.id, "question": self.question, "label": self.label, "adapter": self.adapter,
                "adapter_name": self.adapter_name, "names": list(self.names), "cases": self.cases,
                "limit": call_seconds if self.limit is None else self.limit}


class _Placeholder:
    """Stands in for the student's object while the judge collects a test; any use is a bug in the test."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _fail(self, *args, **kwargs):
        raise RuntimeError(f"test bug: the test used the student's {self._name!r} outside submission()")

    __getattr__ = __call__ = __bool__ = __iter__ = __len__ = __getitem__ = _fail


_ADAPTER_GLOBALS = {"torch", "math"}


def _adapter_source(fn: Callable, sources: dict[str, str]) -> tuple[str, str]:
    code = getattr(fn, "__code__", None)
    if code is None or code.co_filename not in sources:
        raise RuntimeError("test bug: submission= must be a function defined in the test file")
    if code.co_name == "<lambda>":
        raise RuntimeError("test bug: write the submission adapter with def, not lambda")
    source = sources[code.co_filename]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == code.co_name and node.lineno == code.co_firstlineno:
            if node.decorator_list:
                raise RuntimeError(f"test bug: the submission adapter {node.name}() must not be decorated")
            lines = source.splitlines()[node.lineno - 1:node.end_lineno]
            return textwrap.dedent("\n".join(lines)), node.name
    raise RuntimeError(f"test bug: could not find the source of {code.co_name}()")


def adapter_outside_names(source: str, name: str, allowed: Iterable[str]) -> list[str]:
    """Names the adapter ``name`` in ``source`` takes from outside itself, other than ``allowed``, torch, math and builtins."""
    table = next(t for t in symtable.symtable(source, "<adapter>", "exec").get_children() if t.get_name() == name)
    allowed = set(allowed) | _ADAPTER_GLOBALS | set(dir(builtins))
    outside, stack = set(), [table]
    while stack:
        t = stack.pop()
        outside |= {s.get_name() for s in t.get_symbols() if s.is_referenced() and s.is_global()}
        stack += t.get_children()
    return sorted(outside - allowed)


class _Collector:
    def __init__(self, sources: dict[str, str]):
        self.sources = sources
        self.tasks: list[Task] = []
        self.current: tuple[str, str, list[str]] | None = None

    def add(self, label, params, make_case, submission, reference, compare, limit):
        question, test, names = self.current
        if any(t.test == test and t.label == label for t in self.tasks):
            raise RuntimeError(f"test bug: {test} has two checks labelled {label!r}")
        adapter, adapter_name = _adapter_source(submission, self.sources)
        outside = adapter_outside_names(adapter, adapter_name, names)
        if outside:
            raise RuntimeError(f"test bug: {test}: {adapter_name}() uses {outside} from outside itself; import "
                               "them inside it or pass them in the case")
        with _one_thread():
            cases = [_as_data(_build(make_case, p), f"{test} [{label}] case {case_label(p)}") for p in params]
            expected = [reference(_build(make_case, p)) for p in params]
        self.tasks.append(Task(len(self.tasks), question, test, label, adapter, adapter_name, list(names), params,
                               cases, expected, compare, limit))


@contextlib.contextmanager
def _collecting(collector: _Collector):
    global _COLLECTOR
    _COLLECTOR = collector
    try:
        yield collector
    finally:
        _COLLECTOR = None


# ============================================================================= reading otter test files
@dataclass
class TestSpec:
    """One test function of an otter test file."""

    question: str
    name: str
    hidden: bool
    points: float
    names: list[str]               # its parameters: the student's names it checks
    func: Callable = field(repr=False)


def load_test_file(path: Path) -> tuple[str, list[TestSpec], str]:
    """The question name, the test functions in file order, and the source of an otter exception test file."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    consts = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
              if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
              and n.targets[0].id in ("name", "points")}
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    points = consts.get("points")
    if not isinstance(points, list) or len(points) != len(defs):
        raise ValueError(f"{path.name}: points must be a list with one value per test function")
    hidden = []
    for node in defs:
        deco = next((d for d in node.decorator_list if isinstance(d, ast.Call)
                     and getattr(d.func, "id", getattr(d.func, "attr", None)) == "test_case"), None)
        if deco is None:
            raise ValueError(f"{path.name}: {node.name} is not decorated with @test_case")
        flags = {k.arg: ast.literal_eval(k.value) for k in deco.keywords}
        hidden.append(bool(flags.get("hidden", False)))
        node.decorator_list = []
    filename = f"<xfam tests {path.name}>"
    namespace: dict[str, Any] = {"__name__": "xfam_tests_" + path.stem}
    exec(compile(ast.Module(body=defs, type_ignores=[]), filename, "exec"), namespace)
    tests = [TestSpec(consts["name"], node.name, h, float(pts), [a.arg for a in node.args.args], namespace[node.name])
             for node, h, pts in zip(defs, hidden, points)]
    return consts["name"], tests, filename


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# ============================================================================= notebooks
OTTER_INIT_PREFIX = "# Initialize Otter"
_CHECK_CELL = re.compile(r"\s*grader\.check(_all)?\([^)]*\)\s*")
_MARKER = re.compile(r"#\s+(begin|end)\s+(question|solution|tests|prompt)\b", re.I)


def notebook_code_cells(nb) -> list[str]:
    """The code a notebook runs as a submission: every code cell but otter's own and the masters' test blocks."""
    cells, block = [], []
    for cell in nb["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "raw" and source.strip():
            match = _MARKER.match(source.strip().splitlines()[0])
            if match:
                block = block + [match.group(2).lower()] if match.group(1).lower() == "begin" else block[:-1]
            continue
        if (cell["cell_type"] == "code" and block[-1:] != ["tests"] and not source.startswith(OTTER_INIT_PREFIX)
                and not _CHECK_CELL.fullmatch(source)):
            cells.append(source)
    return cells


def _to_python(source: str) -> str:
    """A cell's IPython syntax (magics, ``!cmd``) as plain Python calling ``get_ipython()``."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:          # leave it as is: compiling it in the runner reports the error
        return source


def _cell_title(source: str) -> str:
    first = next((ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
    return f"the cell starting `{first[:50]}{'...' if len(first) > 50 else ''}`"


# ============================================================================= static analysis
_SENSITIVE_ROOTS = ("torch", "xfam_lib", "otter", "builtins", "sys", "os", "numpy", "math", "nbformat", "IPython")
_FLAGGED_IMPORTS = {
    "subprocess": "starts processes", "multiprocessing": "starts processes", "pty": "starts processes",
    "ctypes": "calls C functions directly", "signal": "handles signals", "resource": "changes resource limits",
    "gc": "walks the garbage collector", "inspect": "inspects frames or source", "importlib": "imports dynamically",
    "socket": "opens network connections", "urllib": "opens network connections", "requests": "opens network connections",
    "http": "opens network connections", "threading": "starts threads", "shutil": "copies, moves or deletes files",
    "pickle": "unpickles objects", "marshal": "loads code objects", "types": "builds functions or code objects",
    "otter": "uses otter's internals", "xfam_lib.grading": "uses the grader's internals", "builtins": "edits builtins",
}
_FLAGGED_CALLS = {
    "exec": "runs code from a string (exec)", "eval": "runs code from a string (eval)",
    "compile": "compiles code from a string", "__import__": "imports dynamically (__import__)",
    "breakpoint": "opens a debugger", "exit": "ends the process", "quit": "ends the process",
    "setattr": None, "delattr": None,     # flagged only on modules and library classes, below
}
_FLAGGED_OS = {"fork", "forkpty", "kill", "killpg", "_exit", "abort", "system", "popen", "setsid", "setpgid",
               "setuid", "setgid", "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace",
               "chmod", "chown", "truncate", "symlink", "link", "execv", "execve", "execl", "execlp", "execvp",
               "execvpe", "spawnl", "spawnv", "spawnve", "posix_spawn", "putenv", "chdir", "chroot"}
_FLAGGED_SYS = {"exit": "ends the process", "_getframe": "reads call frames", "settrace": "installs a tracer",
                "setprofile": "installs a profiler", "modules": "edits or reads sys.modules",
                "addaudithook": "installs an audit hook", "meta_path": "changes the import system",
                "path_hooks": "changes the import system", "stdout": None, "stderr": None}
_INTROSPECTION = {"__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__dict__",
                  "__reduce__", "__reduce_ex__", "__wrapped__", "__self__", "f_locals", "f_globals", "f_back",
                  "f_code", "tb_frame", "gi_frame", "cr_frame", "co_consts", "__traceback__", "__setstate__",
                  "__getattribute__", "__class__", "__bases__", "__mro__", "__loader__", "__spec__"}
_WRITE_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "touch", "chmod", "symlink_to", "hardlink_to",
                  "rename"}


class _Scanner(ast.NodeVisitor):
    """Walks one cell: which off-limits names it reaches, and what to flag for review."""

    def __init__(self, resolve: Callable[[str], list[str]], cell: int, title: str):
        self.resolve = resolve                 # dotted name -> off-limits entries it reaches
        self.cell, self.title = cell, title
        self.aliases: dict[str, str] = {}
        self.strings: dict[str, str] = {}
        self.reached: list[tuple[str, str, int]] = []      # (entry, how it was spelled, line)
        self.flags: list[tuple[int, str]] = []

    # ---- helpers
    def flag(self, node: ast.AST, what: str) -> None:
        self.flags.append((getattr(node, "lineno", 0), what))

    def text(self, node: ast.AST) -> str | None:
        """The value of a string expression built from constants (+, join, f-strings, known variables)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.strings.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.text(node.left), self.text(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.JoinedStr):
            parts = [self.text(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
            return "".join(parts) if all(p is not None for p in parts) else None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
                and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))):
            sep, parts = self.text(node.func.value), [self.text(e) for e in node.args[0].elts]
            return sep.join(parts) if sep is not None and all(p is not None for p in parts) else None
        return None

    def dotted(self, node: ast.AST) -> str | None:
        """The library path an expression refers to, e.g. ``A.scaled_dot_product_attention``."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            name = self.dotted(node.func) or getattr(node.func, "id", None)
            if name in ("getattr", "builtins.getattr") and len(node.args) >= 2:
                base, attr = self.dotted(node.args[0]), self.text(node.args[1])
                return f"{base}.{attr}" if base and attr else None
            if name in ("importlib.import_module", "__import__", "builtins.__import__") and node.args:
                return self.text(node.args[0])
            if name in ("vars", "builtins.vars") and node.args:
                return self.dotted(node.args[0])
        if isinstance(node, ast.Subscript):            # vars(m)["name"], m.__dict__["name"]
            value = node.value
            base = self.dotted(value.value) if isinstance(value, ast.Attribute) and value.attr == "__dict__" \
                else self.dotted(value)
            key = self.text(node.slice)
            return f"{base}.{key}" if base and key else None
        return None

    def reach(self, node: ast.AST, dotted: str | None) -> None:
        if dotted:
            for entry in self.resolve(dotted):
                self.reached.append((entry, dotted, getattr(node, "lineno", 0)))

    # ---- imports and names
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.aliases[root] = root
            self.reach(node, alias.name)
            self.flag_import(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for alias in node.names:
            if alias.name == "*":
                self.reach(node, node.module + ".*")
            else:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                self.reach(node, f"{node.module}.{alias.name}")
        self.flag_import(node, node.module)

    def flag_import(self, node: ast.AST, module: str) -> None:
        for name, what in _FLAGGED_IMPORTS.items():
            if module == name or module.startswith(name + "."):
                self.flag(node, f"imports {module} ({what})")
                return

    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.text(node.value)
        target_alias = self.dotted(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if value is not None:
                    self.strings[target.id] = value
                if target_alias:
                    self.aliases[target.id] = target_alias
            self.check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.check_target(target, "deletes")
        self.generic_visit(node)

    def check_target(self, target: ast.AST, verb: str = "replaces") -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.check_target(element, verb)
        elif isinstance(target, ast.Attribute):
            base = self.dotted(target.value)
            if base and base.split(".")[0] in _SENSITIVE_ROOTS:
                self.flag(target, f"{verb} {base}.{target.attr}")
            elif target.attr in _INTROSPECTION:
                self.flag(target, f"{verb} {target.attr}")
        elif isinstance(target, ast.Subscript):
            base = self.dotted(target.value)
            if base and base.split(".")[0] in _SENSITIVE_ROOTS:
                self.flag(target, f"{verb} an item of {base}")

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.reach(node, self.aliases.get(node.id))
            if node.id in ("__builtins__", "__loader__", "__spec__"):
                self.flag(node, f"uses {node.id}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self.dotted(node)
        self.reach(node, dotted)
        if node.attr in _INTROSPECTION:
            self.flag(node, f"reads {node.attr} (inspects objects, frames or modules)")
        if dotted:
            root, _, attr = dotted.partition(".")
            if root == "os" and attr in _FLAGGED_OS:
                self.flag(node, f"uses os.{attr}")
            elif root == "sys" and attr in _FLAGGED_SYS and _FLAGGED_SYS[attr]:
                self.flag(node, f"uses sys.{attr} ({_FLAGGED_SYS[attr]})")
        if dotted is None or not isinstance(node.value, ast.Attribute):
            self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.reach(node, self.dotted(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = self.dotted(node)
        self.reach(node, dotted)
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name in _FLAGGED_CALLS and name not in self.aliases:
            what = _FLAGGED_CALLS[name]
            if what:
                self.flag(node, what)
            elif node.args:
                base = self.dotted(node.args[0])
                if base and base.split(".")[0] in _SENSITIVE_ROOTS:
                    attr = self.text(node.args[1]) if len(node.args) > 1 else None
                    self.flag(node, f"{'replaces' if name == 'setattr' else 'deletes'} {base}.{attr or '<attribute>'} "
                                    f"with {name}")
        if name == "open" and name not in self.aliases:
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            mode_text = self.text(mode) if mode is not None else "r"
            if mode_text is None or set(mode_text) & set("wax+"):
                self.flag(node, "opens a file for writing")
        if isinstance(node.func, ast.Attribute):
            if node.func.attr in _WRITE_METHODS and not isinstance(node.func.value, ast.Constant):
                self.flag(node, f"calls .{node.func.attr}() (changes files)")
            if node.func.attr == "open" and len(node.args) >= 1:
                mode_text = self.text(node.args[0])
                if mode_text and set(mode_text) & set("wax+"):
                    self.flag(node, "opens a file for writing")
        self.generic_visit(node)


def scan_code(cells: list[str], resolve: Callable[[str], list[str]], *, skip: Iterable[str] = ()) \
        -> tuple[list[tuple[str, str]], list[str]]:
    """Read a notebook's code cells (plain Python) as syntax trees.

    Returns ``(reached, flags)``: ``reached`` pairs each off-limits entry the code reaches (via
    ``resolve``: a dotted name -> the entries it reaches) with a description of where; ``flags``
    describes code to review (patching libraries, processes, frames, files, ...). Cells equal to
    one of ``skip`` (the canonical setup cell) and cells that do not parse are left out.
    """
    skip, reached, flags, aliases, strings = set(skip), [], [], {}, {}
    for index, source in enumerate(cells):
        if source in skip:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        title = _cell_title(source)
        scanner = _Scanner(resolve, index, title)
        scanner.aliases, scanner.strings = aliases, strings       # names carry over between cells
        scanner.visit(tree)
        reached += [(entry, (f"as {spelled} " if spelled != entry else "") + f"({title}, line {line})")
                    for entry, spelled, line in scanner.reached]
        flags += [f"{what} ({title}, line {line})" for line, what in scanner.flags]
    return reached, list(dict.fromkeys(flags))


# ============================================================================= off-limits names in a live process
def resolve_live(dotted: str) -> Any:
    """The object a dotted library path names, importing the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {dotted}")


def _members(module) -> list[tuple[str, Any]]:
    """The functions and classes a library module defines itself: its public ones and its private
    functions (a module placed off limits covers the helpers that do its work, e.g. ``_linear_chunk``)."""
    return [(f"{module.__name__}.{k}", v) for k, v in vars(module).items()
            if callable(v) and getattr(v, "__module__", None) == module.__name__ and not k.startswith("__")
            and (not k.startswith("_") or inspect.isfunction(v))]


def expand_off_limits(off_limits: dict[str, list[str]]) -> dict[str, tuple[Any, list[str]]]:
    """``{question: [dotted, ...]}`` -> ``{dotted: (object, questions)}``; a module stands for all its members."""
    out: dict[str, tuple[Any, list[str]]] = {}
    for question, names in off_limits.items():
        for dotted in names:
            obj = resolve_live(dotted)
            pairs = _members(obj) if isinstance(obj, type(sys)) else [(dotted, obj)]
            for name, member in pairs:
                out.setdefault(name, (member, []))[1].append(question)
    return out


def off_limits_resolver(entries: dict[str, tuple[Any, list[str]]]) -> Callable[[str], list[str]]:
    """For `scan_code`: the off-limits entries (of `expand_off_limits`) a dotted name reaches, by identity.

    ``m.*`` (a star import) reaches every entry of module ``m``. Only ``xfam_lib`` and ``torch``
    names are imported to be resolved (in the judge, before any student code runs).
    """
    by_id = {id(obj): dotted for dotted, (obj, _) in entries.items()}

    def resolve(dotted: str) -> list[str]:
        if dotted.endswith(".*"):
            return [d for d in entries if d.rsplit(".", 1)[0] == dotted[:-2]]
        if dotted.split(".")[0] not in ("xfam_lib", "torch"):
            return []
        try:
            obj = resolve_live(dotted)
        except Exception:
            return []
        return [by_id[id(obj)]] if id(obj) in by_id else []

    return resolve


class _Guard:
    """Tripwires on off-limits library callables: a call from the student's code raises `OffLimitsError`.

    Library code that calls such a function by its own global name (``MultiHeadAttention.forward``
    calling ``scaled_dot_product_attention``) is let through; any other caller is the student's
    code. Modules imported or reloaded later get the tripwires too.
    """

    def __init__(self, off_limits: dict[str, list[str]]):
        self.entries = expand_off_limits(off_limits)
        self.library = str(Path(__file__).resolve().parent)
        self.question: str | None = None
        self.violations: dict[str, list[str]] = {}
        self.wrapped: dict[int, Callable] = {}          # id(original) -> tripwire
        self.undo: list[Callable[[], None]] = []
        self.finder: _GuardFinder | None = None

    # ---- the check
    def check(self, dotted: str, names: set[str], frame) -> None:
        code = frame.f_code
        if code.co_filename.startswith(self.library):         # the library's own call, by a name it holds
            obj = self.entries[dotted][0]
            bound = (obj, self.wrapped.get(id(obj), obj))
            held = [n for n in code.co_names if any(frame.f_globals.get(n, self) is o for o in bound)]
            if held or names & set(code.co_names) or code.co_name == "__init__":
                return
        questions = self.entries[dotted][1]
        hit = questions if self.question is None else [q for q in questions if q == self.question]
        if not hit:
            return
        for q in hit:
            self.violations.setdefault(q, [])
            if f"calls {dotted}" not in self.violations[q]:
                self.violations[q].append(f"calls {dotted}")
        raise OffLimitsError(f"{dotted} is off limits in this question: the question asks you to write it yourself")

    @contextlib.contextmanager
    def active(self, question: str):
        self.question = question
        try:
            yield
        finally:
            self.question = None

    # ---- installing
    def _tripwire(self, dotted: str, obj: Any) -> Any:
        if id(obj) in self.wrapped:
            return self.wrapped[id(obj)]
        guard, names = self, {dotted.rsplit(".", 1)[-1], getattr(obj, "__name__", "")}
        if isinstance(obj, type):
            original = obj.__dict__.get("__init__")

            def __init__(self, *args, **kwargs):
                guard.check(dotted, names, sys._getframe(1))
                (original or super(obj, self).__init__)(self, *args, **kwargs)

            obj.__init__ = __init__
            self.undo.append(lambda: setattr(obj, "__init__", original) if original else delattr(obj, "__init__"))
            self.wrapped[id(obj)] = obj
            return obj

        def tripwire(*args, **kwargs):
            guard.check(dotted, names, sys._getframe(1))
            return obj(*args, **kwargs)

        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(tripwire, attr, getattr(obj, attr))
        self.wrapped[id(obj)] = tripwire
        return tripwire

    def patch_module(self, module) -> None:
        """Point every name of a library module that holds an off-limits object to its tripwire."""
        name = getattr(module, "__name__", "")
        wires = {id(w) for w in self.wrapped.values()}
        for dotted, (obj, questions) in list(self.entries.items()):
            parent, _, leaf = dotted.rpartition(".")
            current = vars(module).get(leaf) if parent == name else None
            if current is not None and current is not obj and id(current) not in wires:
                self.entries[dotted] = (current, questions)         # a reload made a new object
                self._tripwire(dotted, current)
        for key, value in list(vars(module).items()):
            wire = self.wrapped.get(id(value))
            if wire is not None and wire is not value:
                setattr(module, key, wire)
                self.undo.append(lambda m=module, k=key, v=value: setattr(m, k, v))

    def install(self) -> "_Guard":
        for dotted, (obj, _) in list(self.entries.items()):
            wire = self._tripwire(dotted, obj)
            parent_path, _, leaf = dotted.rpartition(".")
            with contextlib.suppress(Exception):
                parent = resolve_live(parent_path)
                if isinstance(parent, type) and parent.__dict__.get(leaf) is obj and wire is not obj:
                    setattr(parent, leaf, wire)                 # a method: KVCache.update
                    self.undo.append(lambda c=parent, k=leaf, v=obj: setattr(c, k, v))
        for name, module in list(sys.modules.items()):
            if name == "xfam_lib" or name.startswith("xfam_lib."):
                self.patch_module(module)
        self.finder = _GuardFinder(self)
        sys.meta_path.insert(0, self.finder)
        return self

    def uninstall(self) -> None:
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


class _GuardLoader(importlib.abc.Loader):
    def __init__(self, inner, guard: _Guard):
        self.inner, self.guard = inner, guard

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.guard.patch_module(module)


class _GuardFinder(importlib.abc.MetaPathFinder):
    """Gives every ``xfam_lib`` module imported (or reloaded) later the tripwires too."""

    def __init__(self, guard: _Guard):
        self.guard = guard

    def find_spec(self, name, path, target=None):
        if name != "xfam_lib" and not name.startswith("xfam_lib."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _GuardLoader(spec.loader, self.guard)
        return spec


# ============================================================================= running checks on the student's code
class _NoShell:
    """``get_ipython()`` in the runner: line magics and shell commands do nothing; a few cell magics run their body."""

    def __init__(self, namespace: dict):
        self.namespace = namespace

    def run_line_magic(self, name, line, *args, **kwargs):
        return None

    def run_cell_magic(self, name, line, body):
        if name in ("time", "timeit", "capture"):
            exec(compile(body, "<cell magic>", "exec"), self.namespace)

    def system(self, *args, **kwargs):
        return None

    getoutput = system


def _reset_torch_state() -> None:
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)


def run_task(spec: dict, env: dict, guard: _Guard | None) -> dict:
    """Run one collected check's adapter on each of its cases, with the student's names from ``env``.

    Returns ``{"id", "results": [{"ok", "value" | "error"}], "violations", "missing"}``. Used by the
    runner process and, in one process, by the tests of the exercises.
    """
    missing = [n for n in spec["names"] if env.get(n) is None]
    if missing:
        return {"id": spec["id"], "results": [], "violations": [], "missing": missing}
    namespace = {n: env[n] for n in spec["names"]}
    namespace.update(torch=torch, math=math, __builtins__=builtins)
    exec(compile(spec["adapter"], f"<check {spec['label']}>", "exec"), namespace)
    adapter = namespace[spec["adapter_name"]]
    results, stuck = [], None
    context = guard.active(spec["question"]) if guard else contextlib.nullcontext()
    with context:
        for case in spec["cases"]:
            if stuck:                      # an endless loop would only time out again: skip the rest
                results.append({"ok": False, "error": stuck})
                continue
            _reset_torch_state()
            ok, value = _call_student(adapter, case, spec["limit"])
            if not ok and value.startswith(_TIMEOUT):
                stuck = value
            if ok:
                try:
                    value = _plain(value, "output")
                except ValueError as exc:
                    ok, value = False, str(exc)
            results.append({"ok": True, "value": value} if ok else {"ok": False, "error": str(value)})
    violations = list(guard.violations.get(spec["question"], [])) if guard else []
    return {"id": spec["id"], "results": results, "violations": violations, "missing": []}


def run_tasks(specs: list[dict], env: dict, guard: _Guard | None, report: Callable[[dict], None]) -> None:
    """`run_task` for every check, in order; after a time-out, the part's remaining checks are not run.

    An endless loop would cost the time limit again in every later check of its part, and could
    use up the submission's whole time. ``report`` receives each result as soon as it is ready.
    """
    stuck: dict[str, str] = {}
    for spec in specs:
        if spec["question"] in stuck:
            report({"id": spec["id"], "results": [{"ok": False, "error": stuck[spec["question"]]}] * len(spec["cases"]),
                    "violations": [], "missing": []})
            continue
        try:
            result = run_task(spec, env, guard)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:       # the adapter itself failed, e.g. the student broke torch
            result = {"id": spec["id"], "results": [], "violations": [], "missing": [],
                      "error": f"the check could not run: {type(exc).__name__}: {str(exc)[:200]}"}
        timeouts = [r["error"] for r in result.get("results", []) if not r["ok"] and r["error"].startswith(_TIMEOUT)]
        if timeouts:
            stuck[spec["question"]] = timeouts[0].split(" (")[0] + " in an earlier check of this part; not run again"
        report(result)


# ============================================================================= the runner process (untrusted side)
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


def _run_cells(cells: list[str], namespace: dict, replies: _Replies, limit: float) -> None:
    for index, source in enumerate(cells):
        replies.send({"kind": "cell", "index": index})
        try:
            code = compile(source, f"<cell {index + 1}>", "exec")
            with time_limit(limit):
                exec(code, namespace)
        except SubmissionTimeout:
            replies.send({"kind": "cell error", "index": index,
                          "error": f"did not finish within {limit:g} s and was stopped"})
        except KeyboardInterrupt:
            raise
        except BaseException as exc:       # SystemExit too: the notebook goes on, as in a kernel
            text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            replies.send({"kind": "cell error", "index": index,
                          "error": f"raised {type(exc).__name__}{': ' + text if text else ''}"})


def _runner_work(request: dict, replies: _Replies) -> None:
    """Execute the notebook's cells, then every check's adapter, reporting as it goes (the untrusted part)."""
    torch.set_num_threads(1)
    guard = _Guard(request["off_limits"]).install()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace["get_ipython"] = lambda shell=_NoShell(namespace): shell
    namespace["display"] = lambda *args, **kwargs: None
    _run_cells(request["cells"], namespace, replies, request["cell_seconds"])
    replies.send({"kind": "tasks"})
    run_tasks(request["tasks"], namespace, guard, lambda result: replies.send(dict(result, kind="task")))
    replies.send({"kind": "done"})


def _runner_main() -> None:
    """Entry point of the runner process: sandbox itself, read the request, run the student's code."""
    config = json.loads(sys.argv[1])
    _sandbox(config)
    stdin = sys.stdin.buffer
    (size,) = struct.unpack(">Q", _read_exactly(stdin, 8))
    request = _unpack(_read_exactly(stdin, size))
    os.close(0)
    _runner_work(request, _Replies(config["reply_fd"]))
    sys.stdout.flush()
    os._exit(0)


# ----------------------------------------------------------------------------- the sandbox (Linux)
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
_PR_SET_PDEATHSIG = 1


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _ok(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()       # noqa: E731
    _ok(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _traversable(libc, paths: list[str]) -> None:
    """Let an unprivileged uid reach ``paths`` through directories closed to others (e.g. /root, mode 700).

    Each closed directory on the way gets a tmpfs on top holding only bind mounts of the children
    on those paths (in this mount namespace only).
    """
    blocked: dict[str, set[str]] = {}
    for path in paths:
        parts = Path(os.path.realpath(path)).parts
        for i in range(1, len(parts)):
            directory = str(Path(*parts[:i]))
            with contextlib.suppress(OSError):
                if not os.stat(directory).st_mode & stat.S_IXOTH:
                    blocked.setdefault(directory, set()).add(parts[i])
    for directory in sorted(blocked, key=lambda d: len(Path(d).parts)):
        _tmpfs_keeping(libc, directory, blocked[directory], "size=64k,mode=0755")


def _tmpfs_keeping(libc, directory: str, children, options: str) -> None:
    """Cover ``directory`` with a fresh tmpfs that shows only the named ``children`` (bind mounts of the originals)."""
    fds = {c: os.open(os.path.join(directory, c), os.O_PATH) for c in children
           if os.path.exists(os.path.join(directory, c))}
    _mount(libc, "tmpfs", directory, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    for child, fd in fds.items():
        target = os.path.join(directory, child)
        if stat.S_ISDIR(os.stat(f"/proc/self/fd/{fd}").st_mode):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(libc, f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        os.close(fd)


def _private_tmpfs(libc, target: str, options: str, needed: list[str]) -> None:
    """A fresh tmpfs on ``target`` (e.g. /tmp) that still shows the ``needed`` paths under it (a venv in /tmp)."""
    target = os.path.realpath(target)
    keep = {Path(os.path.realpath(p)).relative_to(target).parts[0] for p in needed
            if os.path.realpath(p).startswith(target + os.sep)}
    _tmpfs_keeping(libc, target, keep, options)


def _user_processes(uid: int) -> int:
    """Threads (RLIMIT_NPROC counts threads) of all processes of ``uid``."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


def _sandbox(config: dict) -> None:
    """Confine this process before any student code runs (see `Limits` and the module docstring)."""
    import resource

    limits, mode = config["limits"], config["isolation"]
    scratch = config["scratch"]
    if mode in ("root", "userns"):
        libc = _libc()
        uid, gid = os.getuid(), os.getgid()
        nproc_base = 0 if mode == "root" else _user_processes(uid)
        flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | (_CLONE_NEWUSER if mode == "userns" else 0)
        _ok(libc.unshare(flags), "unshare")
        if mode == "userns":
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
            Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
        if mode == "root":
            _traversable(libc, config["needed"])
        size = f"size={limits['file_bytes'] * 4},mode=1777"
        for tmp in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(tmp):
                _private_tmpfs(libc, tmp, size, config["needed"])
        for hidden in config["hide"]:
            if os.path.isdir(hidden):
                _mount(libc, "tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4k,mode=0700")
            elif os.path.exists(hidden):
                _mount(libc, "/dev/null", hidden, None, _MS_BIND)
        scratch = "/tmp/submission"
        os.mkdir(scratch, 0o700)
        if mode == "root":
            os.chown(scratch, config["uid"], config["uid"])
        pid = os.fork()
        if pid:                                   # stay as the namespace's parent until its init ends
            for fd in (0, 1, 2, config["reply_fd"]):
                with contextlib.suppress(OSError):
                    os.close(fd)
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        _ok(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    else:
        nproc_base = _user_processes(os.getuid())
    for which, value in ((resource.RLIMIT_AS, limits["memory_bytes"]), (resource.RLIMIT_FSIZE, limits["file_bytes"]),
                         (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, nproc_base + limits["processes"])):
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))
    if mode == "root":
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
        _ok(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch, MPLCONFIGDIR=scratch)


# ----------------------------------------------------------------------------- the judge's side of the runner
@dataclass(frozen=True)
class Limits:
    """What one submission may use. The runner and every process it starts share the process count.

    ``memory_bytes``, ``cpu_seconds`` and ``file_bytes`` hold per process (RLIMIT_AS, RLIMIT_CPU,
    RLIMIT_FSIZE; with namespaces the private /tmp holds 4 x ``file_bytes``); ``processes`` is
    RLIMIT_NPROC (threads count too); ``wall_seconds`` bounds the whole submission, after which
    everything it started is killed; ``cell_seconds`` and ``call_seconds`` stop one notebook cell
    and one call of the student's code in a check.
    """

    memory_bytes: int = 2 * 2 ** 30
    cpu_seconds: int = 240
    processes: int = 16
    file_bytes: int = 64 * 2 ** 20
    open_files: int = 256
    wall_seconds: float = 300.0
    cell_seconds: float = 60.0
    call_seconds: float = DEFAULT_TIME_LIMIT


def _can_unshare(flags: int) -> bool:
    probe = f"import ctypes, sys; sys.exit(0 if ctypes.CDLL(None).unshare({flags}) == 0 else 1)"
    return subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True).returncode == 0


def isolation_available() -> str:
    """``root`` (namespaces and an unprivileged uid), ``userns`` (unprivileged namespaces) or ``basic``.

    Root in a container without CAP_SYS_ADMIN (Docker's default) cannot make namespaces: ``basic``.
    """
    if not sys.platform.startswith("linux"):
        return "basic"
    if os.geteuid() == 0 and _can_unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID):
        return "root"
    if _can_unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID):
        return "userns"
    return "basic"


def _needed_paths() -> list[str]:
    import xfam_lib

    paths = [sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, sys.exec_prefix,
             str(Path(xfam_lib.__file__).resolve().parent), str(Path(torch.__file__).resolve().parent)]
    paths += [p for p in sys.path if p and os.path.isdir(p)]
    return list(dict.fromkeys(paths))


class _Runner:
    """One runner process, seen from the judge: send the request, read frames until done, kill everything."""

    def __init__(self, request: dict, limits: Limits, isolation: str, uid: int, hide: list[str]):
        self.limits, self.isolation = limits, isolation
        self.tail = b""
        self.scratch = tempfile.TemporaryDirectory(prefix="xfam_runner_")
        read_fd, write_fd = os.pipe()
        config = {"reply_fd": write_fd, "isolation": isolation, "uid": uid, "hide": hide,
                  "limits": dataclasses.asdict(limits), "needed": _needed_paths(), "scratch": self.scratch.name}
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        if isolation == "basic":
            os.chmod(self.scratch.name, 0o700)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-u", "-c", "from xfam_lib.grading import _runner_main; _runner_main()", json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
            start_new_session=True, cwd=self.scratch.name, env=env)
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "rb", buffering=0)
        threading.Thread(target=self._write, args=(_pack(request),), daemon=True).start()
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _write(self, payload: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(payload)
            self.proc.stdin.close()

    def _drain(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for chunk in iter(lambda: self.proc.stdout.read(4096), b""):
                self.tail = (self.tail + chunk)[-4000:]

    def _read(self, n: int, deadline: float) -> bytes | None:
        """``n`` bytes from the reply pipe; None at its end or once the runner has exited and nothing is left."""
        data = b""
        while len(data) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.replies], [], [], min(remaining, 0.5))
            if not ready:
                if self.proc.poll() is not None and not select.select([self.replies], [], [], 0.1)[0]:
                    return None
                continue
            chunk = os.read(self.replies.fileno(), min(n - len(data), 1 << 20))
            if not chunk:
                return None
            data += chunk
        return data

    def messages(self):
        """Yield the runner's messages; stops at the end, at an unreadable frame, or raises TimeoutError."""
        deadline = time.monotonic() + self.limits.wall_seconds
        while True:
            head = self._read(8, deadline)
            if head is None:
                return
            (size,) = struct.unpack(">Q", head)
            if size > _MAX_MESSAGE:
                raise ValueError(f"a message of {size} bytes from the runner (more than {_MAX_MESSAGE})")
            data = self._read(size, deadline)
            if data is None:
                return
            message = _unpack(data)
            if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
                raise ValueError("an unreadable message from the runner")
            yield message
            if message["kind"] == "done":
                return

    def close(self) -> None:
        """Kill the runner and everything it started (its process group; with namespaces, its PID namespace)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self.drain.join(timeout=5)
        for stream in (self.replies, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        with contextlib.suppress(OSError):
            self.scratch.cleanup()


# ============================================================================= the judge
@dataclass
class TestResult:
    name: str
    hidden: bool
    points: float
    passed: bool
    message: str = ""


@dataclass
class QuestionResult:
    name: str
    tests: list[TestResult]
    violations: list[str] = field(default_factory=list)

    @property
    def possible(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def score(self) -> float:
        return 0.0 if self.violations else sum(t.points for t in self.tests if t.passed)

    def message(self) -> str:
        """Why points were lost: the off-limits names used, or each failing hidden test."""
        if self.violations:
            return "off limits, scored 0: " + "; ".join(self.violations)
        return " | ".join(t.message for t in self.tests if t.hidden and not t.passed)


@dataclass
class Report:
    """The judge's verdict on one submission."""

    questions: dict[str, QuestionResult]
    flags: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    isolation: str = ""
    seconds: float = 0.0
    output_tail: str = ""

    @property
    def total(self) -> float:
        return sum(q.score for q in self.questions.values())

    @property
    def possible(self) -> float:
        return sum(q.possible for q in self.questions.values())

    def summary(self) -> str:
        lines = [f"Score {self.total:g} / {self.possible:g}"]
        for q in self.questions.values():
            lines.append(f"{q.name}: {q.score:g} / {q.possible:g}")
            if q.violations:
                lines.append("  off limits: " + "; ".join(q.violations))
            for t in q.tests:
                if not t.passed:
                    lines.append(textwrap.indent(f"{'hidden' if t.hidden else 'public'} {t.name}: {t.message}", "  "))
        lines += [f"error: {e}" for e in self.errors]
        lines += [f"review: the code {f}" for f in self.flags]
        return "\n".join(lines)


def _plugin_config(otter_config: dict) -> dict:
    for entry in otter_config.get("plugins", []):
        if isinstance(entry, dict) and PLUGIN_NAME in entry:
            return entry[PLUGIN_NAME] or {}
    return {}


class Judge:
    """Grades notebooks against the tests of an autograder (a folder of otter test files plus a config).

    On construction it runs every test function in collect mode: it builds every case and computes
    every expected value once, here. `grade` then runs one notebook in a sandboxed runner and
    compares its outputs; `grade_namespace` runs the same checks on names given directly (tests).
    ``config`` keys (all optional): ``off_limits`` (question -> dotted library names),
    ``setup_cell`` (the canonical first cell, not scanned for flags), ``chapter``, ``release``.
    """

    def __init__(self, tests_dir: Path | str, config: dict | None = None, *, limits: Limits | None = None,
                 isolation: str = "auto", hide: Iterable[str] = (), allow_basic: bool = False):
        self.config = dict(config or {})
        self.limits = limits or Limits(**self.config.get("limits", {}))
        self.isolation = isolation_available() if isolation == "auto" else isolation
        if self.isolation not in ("root", "userns", "basic"):
            raise ValueError(f"isolation must be auto, root, userns or basic, got {isolation!r}")
        if isolation == "auto" and self.isolation == "basic" and not allow_basic:
            raise RuntimeError("no sandbox here (Linux namespaces need root or unprivileged user namespaces): the "
                               "submissions would run as you, with your files and network. Grade in a container, "
                               "or pass isolation='basic' (grade.py --isolation basic) to accept that.")
        self.hide = [str(Path(p).resolve()) for p in hide] + [str(Path(tests_dir).resolve())]
        self.off_limits: dict[str, list[str]] = {q: list(v) for q, v in self.config.get("off_limits", {}).items()}
        self.entries = expand_off_limits(self.off_limits)
        self.questions: dict[str, list[TestSpec]] = {}
        sources: dict[str, str] = {}
        for path in sorted(Path(tests_dir).glob("*.py"), key=lambda p: _natural(p.stem)):
            name, tests, filename = load_test_file(path)
            self.questions[name] = tests
            sources[filename] = path.read_text(encoding="utf-8")
        unknown = sorted(set(self.off_limits) - set(self.questions))
        if unknown:
            raise ValueError(f"off_limits names questions that have no tests: {unknown}")
        collector = _Collector(sources)
        with _collecting(collector):
            for tests in self.questions.values():
                for test in tests:
                    collector.current = (test.question, test.name, test.names)
                    test.func(**{n: _Placeholder(n) for n in test.names})
        self.tasks = collector.tasks
        for tests in self.questions.values():
            for test in tests:
                if not any(t.test == test.name for t in self.tasks):
                    raise RuntimeError(f"test bug: {test.name} calls no check_cases")
        self._lock = threading.Lock()
        self._slots: set[int] = set()

    @classmethod
    def from_autograder(cls, path: Path | str, **kwargs) -> "Judge":
        """A judge for an autograder zip (or its unpacked folder): ``tests/*.py`` and ``otter_config.json``."""
        path = Path(path)
        keep = None
        if path.is_file():
            keep = tempfile.TemporaryDirectory(prefix="xfam_autograder_")
            with zipfile.ZipFile(path) as zf:
                zf.extractall(keep.name)
            folder = Path(keep.name)
        else:
            folder = path
        otter_config = json.loads((folder / "otter_config.json").read_text(encoding="utf-8"))
        judge = cls(folder / "tests", _plugin_config(otter_config), hide=[str(path), str(folder), *kwargs.pop("hide", ())],
                    **kwargs)
        judge._keep = keep
        return judge

    # ---- names the student's code reaches
    def scan(self, cells: list[str]) -> tuple[dict[str, list[str]], list[str]]:
        """Off-limits uses per question, and review flags, from the code alone."""
        setup = self.config.get("setup_cell")
        reached, flags = scan_code(cells, off_limits_resolver(self.entries), skip=[_to_python(setup)] if setup else [])
        violations: dict[str, list[str]] = {}
        for entry, where in reached:
            for question in self.entries[entry][1]:
                text = f"uses {entry} {where}"
                violations.setdefault(question, [])
                if text not in violations[question]:
                    violations[question].append(text)
        return violations, flags

    # ---- grading
    def grade(self, notebook: Path | str | dict) -> Report:
        """Run one submitted notebook in a sandboxed runner and score it."""
        import nbformat

        start = time.perf_counter()
        try:
            nb = notebook if isinstance(notebook, dict) else nbformat.read(str(notebook), as_version=4)
            nbformat.validate(nb)
        except Exception as exc:
            report = self._score({}, {}, [f"not a valid notebook: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"])
            report.seconds = time.perf_counter() - start
            return report
        cells = [_to_python(c) for c in notebook_code_cells(nb)]
        static, flags = self.scan(cells)
        request = {"cells": cells, "tasks": [t.spec(self.limits.call_seconds) for t in self.tasks],
                   "off_limits": self.off_limits, "cell_seconds": self.limits.cell_seconds}
        slot = self._take_slot()
        results, errors, cell_errors, tail = {}, [], {}, ""
        try:
            uid = 2_000_000 + (os.getpid() % 100_000) * 64 + slot
            runner = _Runner(request, self.limits, self.isolation, uid, self.hide)
            current, stage = None, "starting"
            try:
                for message in runner.messages():
                    kind = message["kind"]
                    if kind == "cell":
                        current, stage = message.get("index"), "cell"
                    elif kind == "cell error":
                        cell_errors[int(message["index"])] = str(message.get("error"))[:300]
                    elif kind == "tasks":
                        stage = "checks"
                    elif kind == "task" and isinstance(message.get("id"), int):
                        results[message["id"]] = message
                        current = message["id"] + 1
                    elif kind == "done":
                        stage = "done"
            except TimeoutError:
                errors.append(f"grading stopped after {self.limits.wall_seconds:g} s "
                              f"({self._where(stage, current, cells)}); everything it started was killed")
            except Exception as exc:
                errors.append(f"grading stopped: {type(exc).__name__}: {str(exc)[:200]}")
            finally:
                runner.close()
                tail = runner.tail.decode("utf-8", "replace")
            if stage != "done" and not errors:
                last = tail.strip().splitlines()[-1][:200] if stage == "starting" and tail.strip() else ""
                errors.append(f"the notebook's process ended early ({self._where(stage, current, cells)}): "
                              "os._exit, a crash, or a resource limit" + (f" [{last}]" if last else ""))
        finally:
            self._free_slot(slot)
        report = self._score(results, static, errors, cell_errors, cells)
        report.flags, report.isolation = flags, self.isolation
        report.seconds, report.output_tail = time.perf_counter() - start, tail
        return report

    def grade_namespace(self, env: dict, questions: Iterable[str] | None = None) -> Report:
        """Run the checks (of ``questions``, default all) on the names in ``env`` in this process.

        The tripwires are armed while they run; there is no sandbox and no static scan. The tests
        of the exercises use it to check every part against its solution and its wrong answers.
        """
        wanted = set(self.questions if questions is None else questions)
        guard = _Guard(self.off_limits).install()
        try:
            results = {}
            specs = [dict(t.spec(self.limits.call_seconds), cases=copy.deepcopy(t.cases))
                     for t in self.tasks if t.question in wanted]
            with _one_thread():
                run_tasks(specs, env, guard, lambda result: results.__setitem__(result["id"], result))
        finally:
            guard.uninstall()
            _reset_torch_state()
        return self._score(results, {}, [])

    def _where(self, stage: str, current, cells: list[str]) -> str:
        if stage == "cell" and isinstance(current, int) and 0 <= current < len(cells):
            return f"while running {_cell_title(cells[current])}"
        if stage == "checks" and isinstance(current, int) and 0 <= current < len(self.tasks):
            task = self.tasks[current]
            return f"while checking {task.question} [{task.label}]"
        return "before the notebook ran" if stage == "starting" else "after the checks"

    def _take_slot(self) -> int:
        with self._lock:
            slot = next(i for i in range(64) if i not in self._slots)
            self._slots.add(slot)
            return slot

    def _free_slot(self, slot: int) -> None:
        with self._lock:
            self._slots.discard(slot)

    def _score(self, results: dict, static: dict[str, list[str]], errors: list[str],
               cell_errors: dict[int, str] | None = None, cells: list[str] | None = None) -> Report:
        cell_errors, cells = cell_errors or {}, cells or []
        why = "; ".join(f"{_cell_title(cells[i])} {e}" for i, e in sorted(cell_errors.items()) if i < len(cells))
        questions = {}
        for name, tests in self.questions.items():
            violations = list(static.get(name, []))
            outcomes = []
            for test in tests:
                messages = []
                for task in (t for t in self.tasks if t.test == test.name):
                    result = results.get(task.id)
                    if result is None:
                        messages.append(f"[{task.label}] not run: " + (errors[0][:200] if errors else "no result"))
                        continue
                    violations += [v for v in result.get("violations", []) if v not in violations]
                    messages += self._judge_task(task, result, why)
                outcomes.append(TestResult(test.name, test.hidden, test.points, not messages, "\n".join(messages)))
            questions[name] = QuestionResult(name, outcomes, violations)
        return Report(questions, errors=list(errors))

    @staticmethod
    def _judge_task(task: Task, result: dict, why: str) -> list[str]:
        if result.get("missing"):
            note = f"Your notebook's cells reported: {why}." if why else ""
            return [f"[{task.label}] " + missing_name_message([str(n) for n in result["missing"]], note)]
        if result.get("error"):
            return [f"[{task.label}] {result['error']}"]
        outcomes = result.get("results")
        if not isinstance(outcomes, list) or len(outcomes) != len(task.cases):
            return [f"[{task.label}] the check returned {len(outcomes) if isinstance(outcomes, list) else 'no'} "
                    f"results for {len(task.cases)} cases"]
        failures = []
        for param, case, expected, outcome in zip(task.params, task.cases, task.expected, outcomes):
            if not isinstance(outcome, dict) or not outcome.get("ok"):
                error = outcome.get("error") if isinstance(outcome, dict) else None
                failures.append((param, [str(error or "no output")[:400]]))
                continue
            try:
                problems = _judge_case(task.compare, case, outcome.get("value"), expected)
            except Exception as exc:           # the student's output broke the comparison
                problems = [f"the output could not be compared: {type(exc).__name__}: {str(exc)[:200]}"]
            if problems:
                failures.append((param, problems))
        return [_format_failures(task.label, len(task.cases), failures)] if failures else []


# ============================================================================= otter: the autograder's plugin, the student's feedback
class OtterJudge:
    """otter-grader plugin named in the autograder zip's ``otter_config.json``: grading by the `Judge`.

    ``before_execution`` hands otter an empty notebook, so none of the student's code runs in
    otter's grading kernel; ``after_grading`` runs the `Judge` (tests from the zip, student code in
    the sandboxed runner) and replaces otter's results with its verdicts. Works the same under
    ``otter run``, ``otter grade`` (one container per submission) and Gradescope.
    """

    def __init__(self, submission_path: str, submission_metadata: dict, plugin_config: dict):
        self.submission_path = submission_path
        self.config = dict(plugin_config or {})
        self.report: Report | None = None

    def before_execution(self, submission):
        import nbformat

        return nbformat.v4.new_notebook(metadata=dict(submission.get("metadata", {})))

    def after_grading(self, results) -> None:
        from otter.test_files.abstract_test import TestCaseResult

        autograder = Path(self.submission_path).resolve().parent.parent       # <ag>/submission/<file>
        judge = Judge(autograder / "source" / "tests", self.config, hide=[str(autograder)], allow_basic=True)
        if judge.isolation == "basic":
            # No namespaces in this container (one per submission): the hidden tests, already loaded,
            # are deleted so that the submission's process cannot read them.
            for tests in (autograder / "source" / "tests", autograder / "submission" / "tests"):
                shutil.rmtree(tests, ignore_errors=True)
        self.report = report = judge.grade(self.submission_path)
        for name, test_file in results.results.items():
            verdict = report.questions.get(name)
            if verdict is None:
                continue
            outcomes = []
            for case, test in zip(test_file.test_cases, verdict.tests):
                passed = test.passed and not verdict.violations
                detail = verdict.message() if verdict.violations else (test.message or "; ".join(report.errors))
                message = "✅ Test case passed" if passed else "❌ Test case failed\n" + detail
                outcomes.append(TestCaseResult(test_case=case, message=message, passed=passed))
            test_file.test_case_results = outcomes
            test_file._score = None

    def generate_report(self) -> str:
        return self.report.summary() if self.report else ""


_OTTER_NOISE = re.compile(r"Error at line \d+ in test [^\n]*:\n(?:  [^\n]*\n)?(?:AssertionError: )?")


def trim_otter_message(message: str | None) -> str | None:
    """otter's failure text without its "Error at line N in test q1:" header and the test's source line."""
    return _OTTER_NOISE.sub("", message) if message else message


def otter_notebook(*args, **kwargs):
    """otter's ``Notebook`` for the student's notebook, with failure messages trimmed to what the check says."""
    import otter

    class Feedback(otter.Notebook):
        def check(self, question, global_env=None):
            result = super().check(question, sys._getframe(1).f_globals if global_env is None else global_env)
            for outcome in getattr(result, "test_case_results", []):
                outcome.message = trim_otter_message(outcome.message)
            return result

    return Feedback(*args, **kwargs)
