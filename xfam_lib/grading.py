"""Checks for the graded exercises: clear messages, time limits, and verdicts from a clean process.

`check_cases` is the one function the exercise tests call. A test builds a few cases, runs the
student's code on each, and compares with a reference::

    def test_q3_hidden(causal_mask):
        import torch
        from xfam_lib.grading import check_cases
        check_cases("grid", params=[(1, 0), (4, 3)],
                    make_case=lambda p: {"seqlen": p[0], "start_pos": p[1]},
                    submission=lambda c: causal_mask(c["seqlen"], c["start_pos"]),
                    reference=lambda c: reference_mask(c["seqlen"], c["start_pos"]))

Failures raise ``AssertionError`` whose message names the check, the case, what was expected and
what was received (shape, dtype, value, the first differing index).

Why the hidden checks compare in a separate process (the tamper-proofing design)
---------------------------------------------------------------------------
otter runs a submission and its tests in the *same* Python kernel, so a submission can replace
whatever a test would compare with: ``torch.allclose = lambda *a, **k: True``, a patched
``torch.Tensor.__eq__``, a no-op ``xfam_lib.testing.assert_close``. With ``isolated=True`` (the
default, used by every hidden test) `check_cases` therefore splits the work:

1. **In the kernel** it builds each case with ``make_case(param)``, runs ``submission(case)``
   under a time limit, and saves the outputs (plain tensors and numbers only) with
   ``torch.save``. Nothing is compared there.
2. **In an oracle process** — a fresh ``python -I`` (isolated mode: no ``PYTHONPATH``, no user
   site, no working directory on ``sys.path``) that the submission never ran in — the same test
   function is executed again from its source with every submission argument replaced by a
   placeholder. There `check_cases` rebuilds every case from its parameter, computes the
   reference, loads the submission's outputs with ``torch.load(weights_only=True)`` (data only,
   no code), and compares them with the unpatched functions of that process. Only the verdict
   (passed, or the failure message) goes back to the kernel.

A submission that patches functions in its kernel thus cannot change the reference, the inputs
the reference is computed from, or the comparison; if its patches corrupt the kernel-side inputs,
its outputs stop matching. One oracle is started per kernel (about two seconds, for importing
torch) and reused by every later check, over JSON lines on pipes.

Public tests use ``isolated=False`` and compare in the kernel: they only give students feedback
and are worth 0 points (``exercises/build.py`` enforces this); the hidden tests check the same
contract on these and more cases.

Outside this design's reach are attacks on the grading machinery rather than on comparisons:
code that replaces otter's result objects, this module's functions or ``subprocess`` in the
kernel, or rewrites files on disk (the tests folder, site-packages). Any code running inside the
grading kernel can do those; ``exercises/grade.py`` flags submissions whose source contains such
patterns so an instructor can look at them.

This module imports only the standard library, ``torch`` and ``xfam_lib.testing``.
"""
from __future__ import annotations

import ast
import atexit
import contextlib
import inspect
import itertools
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from .testing import assert_close

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "ORACLE_TIMEOUT",
    "SubmissionTimeout",
    "time_limit",
    "check_cases",
    "compare_outputs",
    "tampering_report",
]

DEFAULT_TIME_LIMIT = 20.0   # seconds one call of the submission may take before it counts as an endless loop
ORACLE_TIMEOUT = 300.0      # seconds the kernel waits for one verdict (includes the oracle's start-up)

# Set only inside the oracle process: which check to judge and the submission's outputs for it.
_ORACLE_STATE: dict[str, Any] | None = None


class SubmissionTimeout(BaseException):
    """Raised inside the submission when its time is up.

    A ``BaseException`` (like ``KeyboardInterrupt``), so that ``except Exception`` in student
    code does not swallow it; `check_cases` turns it into an ``AssertionError``.
    """


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise `SubmissionTimeout` in the block after ``seconds`` (POSIX main thread; else no limit).

    Uses ``SIGALRM``, which interrupts pure-Python loops such as ``while True: pass``.
    """
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def _alarm(signum, frame):
        raise SubmissionTimeout(f"time limit of {seconds:g} s exceeded")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


# ----------------------------------------------------------------------------- comparisons
def _index(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(out))


def compare_outputs(got: Any, expected: Any, *, where: str = "output") -> None:
    """Raise ``AssertionError`` unless ``got`` matches ``expected`` (tensors, numbers, dicts, lists).

    Tensors must have the expected shape and dtype. Integer and boolean tensors must be equal;
    floating tensors must be finite where ``expected`` is and then pass
    `xfam_lib.testing.assert_close` (dtype-aware tolerances). Python floats use the fp64
    tolerance; ints and bools must be equal. Every message starts with ``where``.
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{where}: expected a tensor of shape {tuple(expected.shape)} and dtype "
                                 f"{expected.dtype}, got {type(got).__name__}")
        if got.shape != expected.shape:
            raise AssertionError(f"{where}: expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}")
        if got.dtype != expected.dtype:
            raise AssertionError(f"{where}: expected dtype {expected.dtype}, got dtype {got.dtype} "
                                 f"(shape {tuple(got.shape)})")
        if expected.is_floating_point() or expected.is_complex():
            bad = ~torch.isfinite(got) & torch.isfinite(expected)
            if bool(bad.any()):
                first = _index(int(bad.flatten().nonzero()[0]), got.shape)
                raise AssertionError(f"{where}: {int(bad.sum())} of {got.numel()} values are NaN or inf where "
                                     f"finite values were expected (first at index {first}, got "
                                     f"{got[first].item()}); shape {tuple(got.shape)}")
            assert_close(got, expected, name=where)
            return
        differ = got != expected
        if bool(differ.any()):
            first = _index(int(differ.flatten().nonzero()[0]), got.shape)
            raise AssertionError(f"{where}: {int(differ.sum())} of {got.numel()} entries differ; first at index "
                                 f"{first}: got {got[first].item()}, expected {expected[first].item()} "
                                 f"(shape {tuple(got.shape)}, dtype {got.dtype})")
        return
    if (isinstance(expected, (bool, int, float)) and isinstance(got, torch.Tensor) and got.dim() == 0
            and not got.is_complex()):
        got = got.item()                     # a 0-dim tensor where a Python number was asked for
    if isinstance(expected, bool):
        if not isinstance(got, bool) or got != expected:
            raise AssertionError(f"{where}: expected {expected}, got {got!r}")
        return
    if isinstance(expected, int):
        if isinstance(got, bool) or not isinstance(got, int):
            raise AssertionError(f"{where}: expected the integer {expected}, got {got!r} ({type(got).__name__})")
        if got != expected:
            raise AssertionError(f"{where}: expected {expected}, got {got} (off by {got - expected})")
        return
    if isinstance(expected, float):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise AssertionError(f"{where}: expected a number close to {expected!r}, got {got!r} "
                                 f"({type(got).__name__})")
        atol, rtol = 1e-10, 1e-8
        if not math.isfinite(got) or abs(got - expected) > atol + rtol * abs(expected):
            raise AssertionError(f"{where}: expected {expected!r}, got {got!r}")
        return
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            raise AssertionError(f"{where}: expected a dict with keys {sorted(expected)}, got {type(got).__name__}")
        for key in expected:
            if key not in got:
                raise AssertionError(f"{where}: missing {key!r}")
            compare_outputs(got[key], expected[key], where=f"{where}[{key!r}]")
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            raise AssertionError(f"{where}: expected a {type(expected).__name__} of length {len(expected)}, "
                                 f"got {type(got).__name__}")
        if len(got) != len(expected):
            raise AssertionError(f"{where}: expected {len(expected)} items, got {len(got)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            compare_outputs(g, e, where=f"{where}[{i}]")
        return
    if expected is None or isinstance(expected, str):
        if got != expected:
            raise AssertionError(f"{where}: expected {expected!r}, got {got!r}")
        return
    raise TypeError(f"compare_outputs: unsupported expected type {type(expected).__name__}")


def _plain(value: Any, where: str) -> Any:
    """A copy of ``value`` made only of CPU tensors, numbers, strings, None, lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu").clone()
        return value if type(value) is torch.Tensor else value.as_subclass(torch.Tensor)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:  # numpy scalar
        return value.item()
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise AssertionError(f"{where}: expected tensors or numbers, got an object of type {type(value).__name__}")


# ----------------------------------------------------------------------------- running the submission
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
    """A stable integer seed from a case parameter (ints, strings, tuples of them)."""
    text = repr(param)
    return sum((i + 1) * ord(ch) for i, ch in enumerate(text)) % (2 ** 31)


def _build(make_case: Callable[[Any], Any], param: Any) -> Any:
    with _fixed_state(_seed_of(param)):
        return make_case(param)


def _warm_up() -> None:
    """Import what PyTorch imports lazily on first use (sympy, via key-padding-mask checks) before any
    time limit runs: an import cut short by the limit would leave half-initialised modules behind."""
    import torch.fx.experimental.symbolic_shapes  # noqa: F401


def _run_submission(submission: Callable[[Any], Any], case: Any, limit: float | None, prefix: str) -> Any:
    try:
        with time_limit(limit):
            return submission(case)
    except SubmissionTimeout:
        raise AssertionError(f"{prefix}your code did not finish within the time limit of {limit:g} s "
                             f"(an endless loop?)") from None
    except Exception as exc:  # the submission's own error, reported as a failed check
        raise AssertionError(f"{prefix}your code raised {type(exc).__name__}: {exc}") from None


def check_cases(label: str, *, params: Iterable[Any], make_case: Callable[[Any], Any],
                submission: Callable[[Any], Any], reference: Callable[[Any], Any],
                compare: Callable[[Any, Any, Any], None] | None = None, isolated: bool = True,
                limit: float | None = None) -> None:
    """Run ``submission`` on every case and check it against ``reference``.

    Args:
        label: names this check in messages; unique within the calling test function.
        params: one parameter per case (ints, strings or tuples of them), passed to ``make_case``.
        make_case: ``param -> case``; must be deterministic (it runs with a seeded RNG and float32
            default dtype, and in the oracle it runs again and must give the same case).
        submission: ``case -> outputs`` from the student's code (tensors, numbers, or
            dicts/lists/tuples of them). The student's objects may be used **only here**.
        reference: ``case -> expected outputs``, the same structure.
        compare: ``(case, got, expected) -> None``, raising ``AssertionError``; default
            `compare_outputs`. Use it for property checks (causality, equal results of two forms).
        isolated: compare in the oracle process (hidden tests) or in this process (public tests).
        limit: time limit in seconds for one call of ``submission`` (default `DEFAULT_TIME_LIMIT`).

    Must be called directly from the test function, whose source the oracle re-executes.
    """
    with _one_thread():
        _check_cases(label, list(params), make_case, submission, reference, compare, isolated, limit,
                     sys._getframe(1).f_code)


@contextlib.contextmanager
def _one_thread():
    """Run the tiny grading workloads on one intra-op thread (much faster than 2+ threads on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _check_cases(label, params, make_case, submission, reference, compare, isolated, limit, test_code) -> None:
    compare = compare or (lambda case, got, expected: compare_outputs(got, expected, where="output"))
    if _ORACLE_STATE is not None:                               # inside the oracle
        if label == _ORACLE_STATE["label"]:
            _judge_outputs(label, params, make_case, reference, compare, _ORACLE_STATE["outputs"])
            _ORACLE_STATE["done"] = True
        return

    limit = DEFAULT_TIME_LIMIT if limit is None else limit
    _warm_up()
    outputs = []
    for param in params:
        prefix = f"[{label}] case {param!r}: "
        case = _build(make_case, param)
        got = _run_submission(submission, case, limit, prefix)
        try:
            got = _plain(got, "output")
        except AssertionError as exc:
            raise AssertionError(prefix + str(exc)) from None
        if isolated:
            outputs.append(got)
            continue
        expected = reference(case)
        try:
            compare(case, got, expected)
        except AssertionError as exc:
            raise AssertionError(prefix + str(exc)) from None
    if isolated:
        verdict = _ask_oracle(test_code, label, outputs)
        if not verdict["ok"]:
            notes = tampering_report()
            note = ("\n(Note: this notebook replaced " + ", ".join(notes) + "; the hidden checks run in a "
                    "separate clean process, so such changes have no effect on them.)") if notes else ""
            raise AssertionError(verdict["message"] + note)


def _judge_outputs(label: str, params: list, make_case, reference, compare, outputs: list) -> None:
    if not isinstance(outputs, list) or len(outputs) != len(params):
        raise AssertionError(f"[{label}] expected outputs for {len(params)} cases, received "
                             f"{len(outputs) if isinstance(outputs, list) else type(outputs).__name__}")
    for param, got in zip(params, outputs):
        case = _build(make_case, param)
        expected = reference(case)
        try:
            compare(case, got, expected)
        except AssertionError as exc:
            raise AssertionError(f"[{label}] case {param!r}: {exc}") from None


# ----------------------------------------------------------------------------- tampering report
def tampering_report() -> list[str]:
    """Names of common comparison functions that no longer are PyTorch's or xfam_lib's originals.

    Informational only (for messages): the hidden checks do not rely on these in the kernel.
    """
    import torch.testing
    from . import testing as xfam_testing

    vf, base = torch._C._VariableFunctions, torch._C.TensorBase
    builtin_pairs = [("torch.allclose", torch.allclose, vf.allclose), ("torch.isclose", torch.isclose, vf.isclose),
                     ("torch.equal", torch.equal, vf.equal)]
    builtin_pairs += [(f"torch.Tensor.{n}", getattr(torch.Tensor, n, None), getattr(base, n, None))
                      for n in ("__eq__", "__ne__", "__bool__", "eq", "allclose", "isclose", "equal", "all", "any")]
    changed = [name for name, current, original in builtin_pairs if current is not original]
    python_level = [("torch.testing.assert_close", torch.testing.assert_close, "torch"),
                    ("xfam_lib.testing.assert_close", xfam_testing.assert_close, "xfam_lib"),
                    ("xfam_lib.grading.compare_outputs", globals()["compare_outputs"], "xfam_lib")]
    for name, fn, package in python_level:
        module = getattr(fn, "__module__", "") or ""
        if not module.startswith(package) or not hasattr(fn, "__code__"):
            changed.append(name)
    return changed


# ----------------------------------------------------------------------------- the oracle (kernel side)
class _Oracle:
    """A clean ``python -I`` process judging checks; one per kernel, started on first use."""

    _ids = itertools.count()

    def __init__(self):
        lib_root = str(Path(__file__).resolve().parent.parent)
        boot = f"import sys; sys.path.insert(0, {lib_root!r}); from xfam_lib.grading import _serve; _serve()"
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", boot], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-2000:]

    def ask(self, request: dict) -> dict:
        request = dict(request, id=next(self._ids))
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.replies.get(timeout=ORACLE_TIMEOUT)
            if line is None:
                raise RuntimeError(f"grading oracle exited unexpectedly:\n{self.log_tail()}")
            reply = json.loads(line)
            if reply.get("id") == request["id"]:
                return reply

    def close(self):
        if self.alive():
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            if self.alive():
                self.proc.kill()


_oracle: _Oracle | None = None


def _close_oracle():
    if _oracle is not None:
        _oracle.close()


atexit.register(_close_oracle)


def _ask_oracle(code, label: str, outputs: list) -> dict:
    """Send the calling test function's source and the submission's outputs; return the verdict."""
    global _oracle
    try:
        source = textwrap.dedent(inspect.getsource(code))
    except (OSError, TypeError) as exc:
        raise RuntimeError("check_cases(isolated=True) must be called directly from a test function whose "
                           f"source is available: {exc}") from None
    fd, payload = tempfile.mkstemp(suffix=".pt", prefix="xfam_outputs_")
    os.close(fd)
    try:
        torch.save(outputs, payload)
        request = {"source": source, "filename": code.co_filename, "function": code.co_name,
                   "label": label, "payload": payload}
        failure = None
        for _ in range(2):                      # an oracle that died is restarted once
            if _oracle is None or not _oracle.alive():
                _oracle = _Oracle()
            try:
                return _oracle.ask(request)
            except queue.Empty:
                _oracle.close()
                _oracle = None
                return {"ok": False, "message": f"[{label}] the grading oracle gave no verdict within "
                                                f"{ORACLE_TIMEOUT:g} s"}
            except (RuntimeError, OSError) as exc:
                _oracle, failure = None, exc
        return {"ok": False, "message": f"[{label}] the grading oracle failed: {failure}"}
    finally:
        with contextlib.suppress(OSError):
            os.remove(payload)


# ----------------------------------------------------------------------------- the oracle (its own process)
class _Placeholder:
    """Stands in for a submission object inside the oracle; any use is a bug in the test."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def _fail(self, *args, **kwargs):
        raise RuntimeError(f"test bug: the hidden test used the submission's {self._name!r} outside "
                           "submission(); the oracle cannot run student code")

    __getattr__ = __call__ = __bool__ = __iter__ = __len__ = __getitem__ = _fail


def _load_test_function(source: str, filename: str, name: str) -> Callable:
    tree = ast.parse(source)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    if len(defs) != 1:
        raise RuntimeError(f"expected one function {name!r} in the test source, found {len(defs)}")
    defs[0].decorator_list = []
    namespace: dict[str, Any] = {"__name__": "__xfam_grading_oracle__"}
    exec(compile(ast.Module(body=defs, type_ignores=[]), filename, "exec"), namespace)
    return namespace[name]


def _judge(request: dict) -> str | None:
    """Run one check in oracle mode; None when it passes, else the failure message."""
    global _ORACLE_STATE
    func = _load_test_function(request["source"], request["filename"], request["function"])
    outputs = torch.load(request["payload"], weights_only=True)
    _ORACLE_STATE = {"label": request["label"], "outputs": outputs, "done": False}
    try:
        func(**{p: _Placeholder(p) for p in inspect.signature(func).parameters})
    except AssertionError as exc:
        return str(exc)
    finally:
        done, _ORACLE_STATE = _ORACLE_STATE["done"], None
    if not done:
        return f"[{request['label']}] test bug: this check was not reached when the oracle ran the test"
    return None


def _serve() -> None:
    """Oracle main loop: one JSON request per line on stdin, one JSON verdict per line on stdout."""
    torch.set_num_threads(1)
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)              # whatever the tests print goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        try:
            message = _judge(request)
        except Exception as exc:
            message = f"[{request.get('label')}] could not be judged: {type(exc).__name__}: {exc}"
        protocol.write(json.dumps({"id": request.get("id"), "ok": message is None, "message": message or ""}) + "\n")
