"""`check_cases`: the one function an exercise test calls; cases, time limits, collection by the judge."""
from __future__ import annotations

import ast
import builtins
import contextlib
import re
import signal
import symtable
import sys
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch._dynamo  # noqa: F401  (imported lazily by torch otherwise: an import cut by a time limit breaks it)

import xfam_lib

from .compare import _MAX_PROBLEMS, chunk_hint, mistake_hints, nonfinite_problems, output_problems

_LIBRARY = str(Path(xfam_lib.__file__).resolve().parent)

DEFAULT_TIME_LIMIT = 20.0    # seconds one call of the student's code may take (an endless loop stops there)



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


MAX_OUTPUT_ELEMENTS = 2 ** 24    # tensor elements (and values) of one call's output, in all


class NotPlainData(ValueError):
    """The student's output is not made of tensors, numbers and strings, or is too large."""


def _plain(value: Any, where: str, budget: list[int] | None = None) -> Any:
    """A copy of the student's output made only of CPU tensors, numbers, strings, None, lists, tuples and
    dicts, of at most `MAX_OUTPUT_ELEMENTS` elements in all (``budget``: what is left of them).

    Every tensor is copied into storage of its own size (an expanded view counts all its elements),
    and a NumPy scalar becomes a Python number only if its ``item()`` is one.
    """
    budget = [MAX_OUTPUT_ELEMENTS] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlainData(f"{where}: the output holds more than {MAX_OUTPUT_ELEMENTS} values")
    if isinstance(value, torch.Tensor):
        numel = int(torch.Tensor.numel(value))
        budget[0] -= numel
        if budget[0] < 0:
            raise NotPlainData(f"{where}: the output holds more than {MAX_OUTPUT_ELEMENTS} tensor elements")
        value = torch.Tensor.detach(value).as_subclass(torch.Tensor).to("cpu")
        if value.layout != torch.strided:
            value = value.to_dense()
        return value.clone(memory_format=torch.contiguous_format)
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (bool, int, float, str)):            # a subclass: its plain value
        return next(t for t in (bool, int, float, str) if isinstance(value, t))(value)
    import numpy

    if isinstance(value, numpy.generic):
        item = value.item()
        if type(item) not in (bool, int, float, complex, str):
            raise NotPlainData(f"{where}: a NumPy value whose item() is a {type(item).__name__}, not a number")
        return item
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]", budget) for i, v in enumerate(list(value))]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}[{k!r}]", budget) for k, v in list(value.items())}
    raise NotPlainData(f"{where}: expected tensors or numbers, got an object of type {type(value).__name__}")


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


_TEST_FILES: set[str] = set()      # the files of the tests that called check_cases: their frames are not the student's


def _student_frame_note(exc: BaseException) -> str:
    """`` (in f, line 3)`` (``EncoderLayer.forward`` for a method) for the innermost traceback frame in the student's code, if any (not the
    grader's, the library's, torch's, a test's, e.g. a test's dispatch spy that the error passed through, or
    another part's reference answer)."""
    skip = (str(Path(__file__).resolve().parent), _LIBRARY, str(Path(torch.__file__).resolve().parent), sys.base_prefix,
            sys.prefix, "<check ", "<reference ", *_TEST_FILES)
    note, tb = "", exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(skip) and "site-packages" not in filename:
            note = f" (in {tb.tb_frame.f_code.co_qualname}, line {tb.tb_lineno} of its cell)"
        tb = tb.tb_next
    return note


_TIMEOUT = "your code did not finish within the time limit"


def _describe(exc: BaseException, prefix: str = "your code raised") -> str:
    """``your code raised X: first line (in f, line 3 of its cell)``; never raises."""
    try:
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    except Exception:
        text = "(its message could not be printed)"
    return f"{prefix} {type(exc).__name__}{': ' + text if text else ''}{_student_frame_note(exc)}"


def _call_student(fn: Callable[[Any], Any], case: Any, limit: float | None) -> tuple[bool, Any]:
    """(True, the output as plain data) or (False, a message saying what went wrong).

    Everything that runs the student's code runs inside the time limit: the call, copying its
    output (`_plain`) and formatting an exception it raised (its ``__str__`` is the student's).
    """
    try:
        with time_limit(limit):
            try:
                return True, _plain(fn(case), "output")
            except NotPlainData as exc:
                return False, f"{exc}"
            except (SubmissionTimeout, OffLimitsError, KeyboardInterrupt):
                raise
            except BaseException as exc:     # the student's own error (SystemExit included) is a failed check
                return False, _describe(exc)
    except SubmissionTimeout:
        return False, f"{_TIMEOUT} of {limit:g} s (an endless loop?)"
    except OffLimitsError as exc:
        return False, f"{exc.args[0] if exc.args and type(exc.args[0]) is str else 'an off-limits call'}"


def _student_output(fn: Callable[[Any], Any], case: Any, limit: float | None) -> tuple[bool, Any, bool]:
    """``(ok, output as plain data or a message, timed out)`` of one call of the student's code."""
    ok, got = _call_student(fn, case, limit)
    return ok, got, not ok and got.startswith(_TIMEOUT)


def _judge_case(compare, case: Any, got: Any, expected: Any) -> list[str]:
    """Problems of one case's output: non-finite values where the reference is finite, then the comparison."""
    problems = nonfinite_problems(got, expected)
    if problems:
        return problems[:_MAX_PROBLEMS]
    if compare is None:
        problems = output_problems(got, expected)
        return problems + mistake_hints(got, expected, case) if problems else []
    try:
        compare(case, got, expected)
    except AssertionError as exc:
        return [str(exc)]
    return []


def _format_failures(label: str, n_cases: int, failures: list[tuple[dict, list[str]]],
                     params: list[dict] | None = None) -> str:
    """One readable message for every failing case of one check (with a hint when only larger chunks fail)."""
    hints = [h for h in failures[0][1] if h.startswith("hint: ") and all(h in f[1] for f in failures)]
    hint = chunk_hint(params or [], [p for p, _ in failures])
    hints += [hint] if hint else []
    if len(failures) > 1:              # a hint every failing case shares is said once, after them
        failures = [(p, [x for x in problems if x not in hints]) for p, problems in failures]
    text = _format_failure_lines(label, n_cases, failures)
    return "\n".join([text, *(h for h in hints if h not in text)])


def _format_failure_lines(label: str, n_cases: int, failures: list[tuple[dict, list[str]]]) -> str:
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
    _TEST_FILES.add(sys._getframe(1).f_code.co_filename)
    if missing:
        raise AssertionError(f"[{label}] " + missing_name_message(missing))
    limit = DEFAULT_TIME_LIMIT if limit is None else limit
    failures, stuck = [], None
    with _one_thread():
        for param in params:
            if stuck:                      # an endless loop would only time out again: skip the rest
                failures.append((param, [stuck]))
                continue
            ok, got, timed_out = _student_output(submission, _build(make_case, param), limit)
            if timed_out:
                stuck = got
            if not ok:
                failures.append((param, [got]))
                continue
            case = _build(make_case, param)
            problems = _judge_case(compare, case, got, reference(case))
            if problems:
                failures.append((param, problems))
    if failures:
        message = _format_failures(label, len(params), failures, params)
        # otter shows str(exc).strip("'"): a newline keeps a closing quote of the message
        raise AssertionError(message + "\n" if message.endswith("'") else message)


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



# ============================================================================= Triton kernels a student writes
_KERNEL_BUILTINS = ("range", "float", "int", "min", "max", "NotImplementedError")   # the last: an untouched stub
_TENSOR_ATTRIBUTES = ("to", "dtype", "shape", "T")


def jit_body_problems(fn: Any, what: str = "the function") -> list[str]:
    """Why ``fn`` is not a Triton kernel function made only of Triton: ``[]`` when it is.

    ``fn`` must be a ``@triton.jit`` function (a ``JITFunction``, or an ``InterpretedFunction`` under
    ``TRITON_INTERPRET=1``) whose code reads only ``tl`` (``triton.language``) and its public
    functions and types, ``range``, ``float``, ``int``, ``min``, ``max``, number constants and other
    ``@triton.jit`` functions that pass this check themselves; of its local values it may read only
    ``.to``, ``.dtype``, ``.shape`` and ``.T``. It may not import, use variables of an enclosing
    function or call any other Python (which Triton's CPU interpreter would run, but a GPU cannot
    compile).
    """
    import dis
    import types

    import triton
    import triton.language as tl

    kinds = tuple(k for k in (getattr(triton.runtime.jit, "JITFunction", None),
                              getattr(getattr(triton.runtime, "interpreter", None), "InterpretedFunction", None))
                  if isinstance(k, type))
    tl_names = {n for n in dir(tl) if not n.startswith("_") and not isinstance(getattr(tl, n), types.ModuleType)}
    problems: list[str] = []
    todo, seen = [(fn, what)], set()
    while todo:
        jit, label = todo.pop()
        func = getattr(jit, "fn", None)
        if not (isinstance(jit, kinds) and isinstance(func, types.FunctionType)):
            problems.append(f"{label} is not a @triton.jit function")
            continue
        if id(func) in seen:
            continue
        seen.add(id(func))
        name, scope = func.__name__, func.__globals__
        if scope.get("tl", tl) is not tl:
            problems.append(f"{name}: its `tl` is not triton.language")
        codes = [func.__code__]
        while codes:
            code = codes.pop()
            if code.co_freevars:
                problems.append(f"{name} uses variables of an enclosing function ({', '.join(code.co_freevars)})")
            for ins in dis.get_instructions(code):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    glob, value = ins.argval, scope.get(ins.argval, getattr(builtins, ins.argval, None))
                    if glob == "tl" or (glob in _KERNEL_BUILTINS and value is getattr(builtins, glob)):
                        continue
                    if isinstance(value, kinds):
                        todo.append((value, f"{glob} (called by {name})"))
                    elif type(value) not in (int, float, bool):
                        problems.append(f"{name} uses {glob}, which is neither tl, range nor a @triton.jit "
                                        f"function: write the loop with Triton's operations only")
                elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR", "STORE_GLOBAL"):
                    if ins.opname == "STORE_GLOBAL" or (ins.argval not in tl_names
                                                        and ins.argval not in _TENSOR_ATTRIBUTES):
                        problems.append(f"{name} uses .{ins.argval}, which is not a Triton operation")
                elif ins.opname.startswith("IMPORT"):
                    problems.append(f"{name} imports {ins.argval}")
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return list(dict.fromkeys(problems))
