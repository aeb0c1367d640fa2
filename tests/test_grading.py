"""Proofs for the grader itself (the xfam_grading package): messages, the judge, the sandbox, attacks.

* Messages: every failing check is listed with its labelled case; a missing name says which
  and why; otter's "Error at line N" header is trimmed.
* What the runner receives holds no expected value, reference or comparison.
* `scan_code` finds off-limits library names however they are spelled, and flags tampering.
* The tripwires stop a call of an off-limits function from the student's code, also after a
  reload, and let the library's own calls through.
* End to end, one grading run of chapter 2 (``exercises/grade.py``, two jobs) over a control
  notebook and a set of attacks: looking up the reference at run time, patching the grading
  module, torch or otter, the library's own implementation (spelled directly and built at run
  time), a memory bomb, a fork bomb, filling the disk, ``sys.exit`` and ``os._exit``, an endless
  loop that ignores the time limit, writing to the tests and the autograder, the network.
  Each scores 0 on the part it attacks or is flagged, the control gets full marks, the run
  finishes, files outside the sandbox are unchanged and no process is left behind. The run is
  made once per session, however many pytest-xdist workers run these tests.
* Each part is graded on its own: a right part that calls a wrong earlier part keeps its points
  (ch03 q1b, ch02 q3a), a wrong one still loses them, and in the sandboxed runner a part's own
  checks cannot reach its reference answer.
* The autograder zip's otter plugin grades under ``otter run`` as the judge does.
"""
from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch

from xfam_grading import OffLimitsError, case_label, check_cases, output_problems, scan_code
from xfam_grading import checks
from xfam_grading import judge as judge_module
from xfam_grading.checks import adapter_outside_names
from xfam_grading.guard import _Guard, expand_off_limits, off_limits_resolver
from xfam_grading.otter_plugin import trim_otter_message

pytestmark = [pytest.mark.filterwarnings("ignore:Traits should be given as instances:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:The inplace keyword:Warning")]
ROOT = Path(__file__).resolve().parent.parent


def _build():
    name = "xfam_exercises_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "exercises" / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ----------------------------------------------------------------------------- messages
def test_output_problems_lists_every_item_that_differs():
    got = {"a": torch.zeros(2, 3), "b": torch.tensor([1.0, float("nan")]), "n": 4950, "flags": (True, True)}
    expected = {"a": torch.zeros(2, 4), "b": torch.zeros(2), "n": 5050, "flags": (True, False), "c": 1.0}
    problems = output_problems(got, expected)
    text = "\n".join(problems)
    assert len(problems) == 5, problems
    for words in ("a: expected shape (2, 4), got shape (2, 3)", "b: 1 of 2 elements are NaN", "off by -100",
                  "flags[1]: expected False, got True", "c: missing from the result"):
        assert words in text, text
    assert output_problems({"x": torch.ones(3)}, {"x": torch.ones(3)}) == []


def test_check_cases_lists_every_failing_case_with_its_parameters():
    def make_case(p):
        return {"x": torch.arange(p["n"], dtype=torch.float64)}

    def reference(c):
        return {"double": 2 * c["x"], "length": c["x"].shape[0]}

    def wrong(x):                          # right for n = 1 only
        return {"double": 2 * x + x[1:].sum() if x.shape[0] > 1 else 2 * x, "length": 1}

    def test_double(double):
        def submission(c):
            return double(c["x"])

        check_cases("doubling", params=[{"n": 1, "kind": "short"}, {"n": 3, "kind": "long"}, {"n": 4, "kind": "long"}],
                    make_case=make_case, submission=submission, reference=reference)

    test_double(lambda x: {"double": 2 * x, "length": x.shape[0]})
    with pytest.raises(AssertionError) as info:
        test_double(wrong)
    message = str(info.value)
    assert message.startswith("[doubling] 2 of 3 cases fail:"), message
    assert "case n=3, kind='long':" in message and "case n=4, kind='long':" in message
    assert message.count("double:") == 2 and message.count("length: expected") == 2, message
    assert case_label({"interleaved": True, "n_heads": 12}) == "interleaved=True, n_heads=12"


def test_check_cases_names_a_missing_function_and_rejects_unlabelled_cases():
    def test_needs(sdpa):
        check_cases("x", params=[{"n": 1}], make_case=lambda p: p, submission=lambda c: sdpa(c), reference=lambda c: c)

    with pytest.raises(AssertionError) as info:
        test_needs(None)
    assert "`sdpa` is not defined" in str(info.value) and "keep the name" in str(info.value)
    assert "NoneType" not in str(info.value)
    with pytest.raises(TypeError, match="must be a dict"):
        check_cases("x", params=[(1, 2)], make_case=lambda p: p, submission=lambda c: c, reference=lambda c: c)


def test_an_endless_loop_is_stopped_once_per_check(monkeypatch):
    import time

    monkeypatch.setattr(checks, "DEFAULT_TIME_LIMIT", 0.2)

    def loop(c):
        while True:
            pass

    start = time.perf_counter()
    with pytest.raises(AssertionError, match=r"every case \(5\): your code did not finish within the time limit"):
        check_cases("loop", params=[{"i": i} for i in range(5)], make_case=lambda p: p, submission=loop,
                    reference=lambda c: c)
    assert time.perf_counter() - start < 1.0          # one time-out, not five


def test_an_error_is_located_in_the_students_cell_not_in_the_tests_spy():
    """An error that passes through a test's dispatch spy is reported at the student's line."""
    from torch.utils._python_dispatch import TorchDispatchMode

    student = {}
    exec(compile("import torch\ndef tiled(x):\n    y = x * 2\n    return y @ torch.ones(3, 2)\n", "<cell 4>", "exec"),
         student)

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def submission(c):
        with Spy():
            return student["tiled"](c["x"])

    with pytest.raises(AssertionError) as failed:
        check_cases("spied", params=[{"n": 4}], make_case=lambda p: {"x": torch.ones(p["n"], 4)},
                    submission=submission, reference=lambda c: c["x"], limit=300)
    assert "(in tiled, line 4 of its cell)" in str(failed.value), failed.value


def test_trim_otter_message_keeps_only_what_the_check_says():
    raw = ("❌ Test case failed\nError at line 30 in test q1a:\n      check_cases(\"masks\", params=[...])\n"
           "AssertionError: [masks] case n=2: out: expected shape (2,), got shape (3,)")
    assert trim_otter_message(raw) == "❌ Test case failed\n[masks] case n=2: out: expected shape (2,), got shape (3,)"


# ----------------------------------------------------------------------------- what the runner receives
# ----------------------------------------------------------------------------- hints: the shape of a mistake
def _sequence_case(length=8, chunk_size=None):
    case = {"q": torch.randn(2, length, 3, dtype=torch.float64)}
    if chunk_size is not None:
        case["chunk_size"] = chunk_size
    return case, torch.randn(2, length, 4, dtype=torch.float64)


def test_a_constant_factor_is_named():
    from xfam_grading.compare import mistake_hints

    case, expected = _sequence_case()
    hints = mistake_hints({"out": expected * 8 ** 0.5}, {"out": expected}, case)
    assert len(hints) == 1 and "same constant" in hints[0] and "2.828 (about √8)" in hints[0], hints
    assert "about 1/2" in mistake_hints(expected / 2, expected, case)[0]
    assert mistake_hints(expected + 0.1, expected, case) == []          # an offset is no constant factor


def test_an_output_of_zero_at_t0_says_the_token_must_see_itself():
    from xfam_grading.compare import mistake_hints

    case, expected = _sequence_case()
    got = expected.clone()
    got[:, 0] = 0.0
    got[:, 1:] += 0.5
    assert ["t = 0" in h and "see itself" in h for h in mistake_hints(got, expected, case)] == [True]
    scan = {"u": torch.randn(2, 3, 6, dtype=torch.float64)}            # Mamba's layout: positions on the last dim
    y = torch.randn(2, 3, 6, dtype=torch.float64)
    late = torch.cat([torch.zeros(2, 3, 1, dtype=torch.float64), y[..., 1:] + 0.5], dim=-1)
    assert ["t = 0" in h for h in mistake_hints(late, y, scan)] == [True]


def test_an_error_that_starts_at_the_second_chunk_or_step_is_named():
    from xfam_grading.compare import mistake_hints

    case, expected = _sequence_case(length=8, chunk_size=3)
    later = expected.clone()
    later[:, 3:] += 0.5
    assert ["the first chunk (positions 0 to 2) is right" in h for h in mistake_hints(later, expected, case)] == [True]
    step = expected.clone()
    step[:, 1:] += 0.5
    assert ["starts at position 1, the second step" in h for h in mistake_hints(step, expected, case)] == [True]
    anywhere = expected.clone()
    anywhere[:, 5] += 0.5                                  # no shape to name: no hint
    assert mistake_hints(anywhere, expected, case) == []


def test_a_check_where_only_larger_chunks_fail_says_so():
    def make_case(p):
        return {"q": torch.randn(6, 2, dtype=torch.float64), "chunk_size": p["chunk_size"]}

    def wrong(c):                                          # right for chunks of 1 only
        return c["q"] if c["chunk_size"] == 1 else c["q"] * 1.5 + 1

    with pytest.raises(AssertionError) as failed:
        check_cases("chunks", params=[{"chunk_size": 1}, {"chunk_size": 2}, {"chunk_size": 4}],
                    make_case=make_case, submission=wrong, reference=lambda c: c["q"])
    assert "chunk_size=1 pass and only larger chunks fail" in str(failed.value), failed.value


def test_no_relative_error_is_reported_where_the_expected_values_are_near_zero():
    near_zero = output_problems(torch.ones(3, dtype=torch.float64), torch.full((3,), 1e-300, dtype=torch.float64))
    assert len(near_zero) == 1 and "relative RMS error" not in near_zero[0] and "near 0" in near_zero[0], near_zero
    ordinary = output_problems(torch.ones(3, dtype=torch.float64) * 2, torch.ones(3, dtype=torch.float64))
    assert "relative RMS error 1.000e+00" in ordinary[0], ordinary


def test_a_message_ending_in_a_quote_keeps_it_under_otter(tmp_path):
    """otter shows ``str(exc).strip("'")``, which ate the closing quote of "got 'nothing raised'"."""
    from otter.test_files import ExceptionTestFile

    test_file = tmp_path / "q9.py"
    test_file.write_text(
        "from otter.test_files import test_case\n\nOK_FORMAT = False\n\nname = 'q9'\npoints = [0]\n\n"
        "@test_case(points=None, hidden=False)\ndef test_q9(f):\n    from xfam_grading import check_cases\n\n"
        "    def submission(c):\n        return {'raised': f()}\n\n"
        "    check_cases('quote', params=[{'n': 1}], make_case=lambda p: {}, submission=submission,\n"
        "                reference=lambda c: {'raised': 'ValueError'})\n", encoding="utf-8")
    tests = ExceptionTestFile.from_file(str(test_file))
    tests.run({"f": lambda: "nothing raised"})
    message = trim_otter_message(tests.test_case_results[0].message)
    assert message.rstrip().endswith("expected 'ValueError', got 'nothing raised'"), message


def test_the_html_view_of_a_check_escapes_its_messages():
    from otter.test_files.abstract_test import TestCase, TestCaseResult
    from otter.test_files.exception_test import ExceptionTestFile

    from xfam_grading.otter_plugin import escaped_html

    result = ExceptionTestFile("q1a", "q1a.py", [TestCase("test_q1a", None, False, 0, None, None)])
    message = "❌ [case] your code raised ValueError (in <listcomp>, line 3 of its cell): 'x' & y"
    result.test_case_results = [TestCaseResult(result.test_cases[0], message, False)]
    assert "(in <listcomp>, line 3" in type(result)._repr_html_(result)   # what a browser would swallow
    html = escaped_html(result)
    assert "(in &lt;listcomp&gt;, line 3" in html and "&#x27;x&#x27; &amp; y" in html, html
    assert result.test_case_results[0].message == message                 # the text view is unchanged


@pytest.fixture(scope="module")
def ch02(tmp_path_factory):
    """Chapter 2's autograder (built into a temporary folder) and its judge."""
    from xfam_grading import Judge

    built = _build().assign("ch02", tmp_path_factory.mktemp("ch02") / "out")
    return built, Judge.from_autograder(built.zip_path)


def test_the_runner_request_holds_no_reference(ch02):
    built, judge = ch02
    spec = judge.tasks[0].spec()
    assert set(spec) == {"id", "question", "label", "adapter", "adapter_name", "names", "cases", "limit"}
    sources = "\n".join(t.spec()["adapter"] for t in judge.tasks)
    assert "def reference" not in sources and "def compare" not in sources and "scaled_dot_product_attention" not in sources


def test_an_adapter_may_not_reach_outside_itself():
    source = "def submission(c):\n    return helper(sdpa(c['q']), torch.zeros(1))\n"
    assert adapter_outside_names(source, "submission", ["sdpa"]) == ["helper"]


# ----------------------------------------------------------------------------- static analysis
OFF = {"q1a": ["xfam_lib.attention.scaled_dot_product_attention"], "q3a": ["xfam_lib.attention.MultiHeadAttention"]}


def _scan(*cells):
    return scan_code(list(cells), off_limits_resolver(expand_off_limits(OFF)))


@pytest.mark.parametrize("cell", [
    "from xfam_lib.attention import scaled_dot_product_attention",
    "from xfam_lib.attention import scaled_dot_product_attention as mine",
    "import xfam_lib.attention as A\nf = A.scaled_dot_product_attention",
    "import xfam_lib\nf = xfam_lib.attention.scaled_dot_product_attention",
    "from xfam_lib import attention\nf = getattr(attention, 'scaled_dot_' + 'product_attention')",
    "import importlib\nf = getattr(importlib.import_module('xfam_lib.' + 'attention'), 'scaled_dot_product_attention')",
    "name = 'scaled_dot_product' + '_attention'\nimport xfam_lib.attention as A\nf = vars(A)[name]",
    "import xfam_lib.attention as A\nf = A.__dict__[''.join(['scaled_dot', '_product_attention'])]",
    "from xfam_lib.attention import *",
    "m = __import__('xfam_lib.attention', fromlist=['x'])\nf = getattr(m, f'scaled_dot_product_attention')",
])
def test_scan_finds_an_off_limits_name_however_spelled(cell):
    reached, _ = _scan(cell)
    assert any(entry == "xfam_lib.attention.scaled_dot_product_attention" for entry, _ in reached), reached


def test_scan_leaves_honest_code_alone():
    honest = ('import math\nimport torch\n\ndef scaled_dot_product_attention(q, k, v):\n'
              '    """My own scaled_dot_product_attention."""\n    return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), -1) @ v\n'
              'from xfam_lib.attention import MultiHeadAttention as M\nimport xfam_lib.attention')
    reached, flags = _scan(honest)
    assert [entry for entry, _ in reached] == ["xfam_lib.attention.MultiHeadAttention"] and flags == [], (reached, flags)


@pytest.mark.parametrize("cell", [
    "from xfam_lib.linear import _linear_chunk",
    "import xfam_lib.linear as L\nf = L._gla_recurrent",
    "from xfam_lib.linear import linear_attention",
])
def test_a_module_off_limits_covers_its_private_helpers(cell):
    """Placing a whole module off limits covers its private functions too: a student cannot borrow the
    helper that does the public function's work."""
    reached, _ = scan_code([cell], off_limits_resolver(expand_off_limits({"q1a": ["xfam_lib.linear"]})))
    assert [entry for entry, _ in reached] and all(e.startswith("xfam_lib.linear.") for e, _ in reached), reached


@pytest.mark.parametrize("cell, flag", [
    ("import torch\ntorch.allclose = lambda *a, **k: True", "replaces torch.allclose"),
    ("import torch as t\nt.Tensor.__eq__ = lambda s, o: True", "replaces torch.Tensor.__eq__"),
    ("import torch\nsetattr(torch, 'all' + 'close', print)", "replaces torch.allclose with setattr"),
    ("import xfam_grading as g\ng.output_problems = lambda *a: []", "replaces xfam_grading.output_problems"),
    ("import otter\notter.Notebook.check = None", "replaces otter.Notebook.check"),
    ("import gc\nobjs = gc.get_objects()", "walks the garbage collector"),
    ("import sys\nf = sys._getframe(1).f_locals", "reads call frames"),
    ("import os\nos.fork()", "uses os.fork"),
    ("import subprocess\nsubprocess.run(['ls'])", "starts processes"),
    ("open('../tests/q1a.py', 'w').write('x')", "opens a file for writing"),
    ("import torch\ntorch.save({'w': 1}, 'debug.pt')", "writes a file (torch.save)"),
    ("import numpy as np\nnp.save('x.npy', np.zeros(2))", "writes a file (numpy.save)"),
    ("import runpy", "runs modules by name"),
    ("import code\ncode.InteractiveInterpreter().runsource('1')", "an interpreter"),
    ("from pkgutil import resolve_name", "resolves or reads modules by name"),
    ("exec('print(1)')", "runs code from a string"),
    ("import sys\nsys.exit(0)", "ends the process"),
])
def test_scan_flags_tampering(cell, flag):
    _, flags = _scan(cell)
    assert any(flag in f for f in flags), flags


@pytest.mark.parametrize("cell, flag", [
    ("f = lambda: 0\ncells = getattr(f, '__clo' + 'sure__')", "reads __closure__ with getattr"),
    ("import xfam_lib.utils as U\ng = getattr(U.seed_everything, '__glo' + 'bals__')", "reads __globals__ with getattr"),
    ("def f(o, name):\n    return getattr(o, name)", "getattr with an attribute name built at run time"),
    ("f = lambda: 0\nc = f.__code__.replace(co_filename='x')", "reads __code__"),
    ("x = (1).__class__.__base__", "reads __base__"),
    ("%%bash\nls /", "cell, which the grader does not run"),
])
def test_scan_flags_introspection_however_spelled(cell, flag):
    """Names built at run time and any dunder outside a short allowlist are flagged, magics included."""
    from xfam_grading.scanner import _to_python

    _, flags = _scan(_to_python(cell))
    assert any(flag in f for f in flags), flags


def test_a_time_magic_cell_is_scanned_as_the_code_it_runs():
    """``%%time`` used to hide its body in a string the scanner never parsed, which the runner then ran."""
    from xfam_grading.scanner import _to_python

    cell = _to_python("%%time\nfrom xfam_lib.attention import scaled_dot_product_attention as f\n%time y = f(1)")
    reached, _ = _scan(cell)
    assert [e for e, _ in reached] == ["xfam_lib.attention.scaled_dot_product_attention"] * 2, (cell, reached)
    assert "run_cell_magic" not in cell and "y = f(1)" in cell


@pytest.mark.parametrize("cell, allowed", [
    ("import einops", False),                                    # installed for the book's tests, not for grading
    ("from x_transformers import Attention", False),
    ("from xfam_lib.attention import _masked_softmax", False),    # a private helper nobody named off limits
    ("from xfam_lib.sparse import dense_masked_attention", False),   # the same computation in another module
    ("import xfam_lib.attention as A\nf = A.softmax_naive", False),
    ("m = __import__('sci' + 'py')", False),
    ("import math, itertools, numpy as np, torch.nn.functional as F", True),
    ("from xfam_lib.utils import seed_everything\nimport xfam_lib.plots", True),
    ("from xfam_lib.attention import MultiHeadAttention\nm = MultiHeadAttention(4, 2)", True),   # it was given
])
def test_what_a_submission_may_import_is_an_allowlist(cell, allowed):
    from xfam_grading.scanner import NOT_ALLOWED, allowlist

    reached, _ = scan_code([cell], lambda dotted: [], allowed=allowlist(["xfam_lib.attention.MultiHeadAttention"]))
    assert (not any(e == NOT_ALLOWED for e, _ in reached)) == allowed, reached


def test_an_allowed_module_does_not_lend_another_modules_function(monkeypatch):
    """The allowlist follows the object a name reaches: a function of xfam_lib.attention is refused
    even when reached through xfam_lib.utils, which is allowed."""
    import xfam_lib.attention
    import xfam_lib.utils
    from xfam_grading.scanner import NOT_ALLOWED, allowlist

    monkeypatch.setattr(xfam_lib.utils, "borrowed", xfam_lib.attention.softmax_naive, raising=False)
    reached, _ = scan_code(["import xfam_lib.utils as U\nf = U.borrowed"], lambda dotted: [], allowed=allowlist())
    assert any(e == NOT_ALLOWED and "xfam_lib.attention.softmax_naive" in where for e, where in reached), reached
    reached, _ = scan_code(["import xfam_lib.utils as U\nf = U.seed_everything"], lambda dotted: [], allowed=allowlist())
    assert reached == [], reached


def test_non_finite_outputs_fail_every_kind_of_check():
    """NaN or inf where the reference is finite fails, whatever the check: default comparison, a
    property check written to fail open (``if error > tol``), a reference that returns None."""
    from xfam_grading.checks import _judge_case

    def fails_open(case, got, expected):
        error = float((got["rows"] @ got["rows"].T - torch.eye(2)).abs().max())
        if error > 1e-8:
            raise AssertionError(f"not orthogonal: {error}")

    nan_rows = {"rows": torch.full((2, 2), float("nan"))}
    assert fails_open(None, nan_rows, None) is None                 # the check alone lets NaN through
    assert _judge_case(fails_open, None, nan_rows, None)
    assert _judge_case(fails_open, None, nan_rows, {"rows": torch.eye(2)})
    assert _judge_case(None, None, {"x": float("inf"), "y": 1.0}, {"x": 2.0, "y": 1.0})
    assert _judge_case(None, None, [torch.tensor([1.0, float("nan")])], [torch.tensor([1.0, 2.0])])
    assert not _judge_case(None, None, torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")]))
    assert not _judge_case(fails_open, None, {"rows": torch.eye(2)}, None)


# ----------------------------------------------------------------------------- the reply channel
def _message_problem(message):
    from xfam_grading.channel import message_problem

    class Task:
        names, cases = ["sdpa"], [{}, {}]

    return message_problem(message, 3, [Task(), Task()], {1})


@pytest.mark.parametrize("message", [
    {"kind": "task", "id": 0, "results": [], "violations": 5, "missing": []},         # the TypeError of old
    {"kind": "task", "id": 1, "results": [], "violations": [], "missing": []},        # a second result for task 1
    {"kind": "task", "id": 7, "results": [], "violations": [], "missing": []},
    {"kind": "task", "id": True, "results": [], "violations": [], "missing": []},
    {"kind": "task", "id": 0, "results": [{"ok": True, "value": 1}], "violations": [], "missing": []},
    {"kind": "task", "id": 0, "results": [{"ok": True, "value": {1: 2}}] * 2, "violations": [], "missing": []},
    {"kind": "task", "id": 0, "results": [{"ok": 1, "value": 2}] * 2, "violations": [], "missing": []},
    {"kind": "task", "id": 0, "results": [], "violations": [], "missing": ["os"]},
    {"kind": "task", "id": 0, "results": [], "violations": [], "missing": [], "score": 5},
    {"kind": "cell error", "index": 9, "error": "x"},
    {"kind": "cell", "index": "0"},
    {"kind": "done", "total": 16},
    {"kind": "grade"},
    ["task"],
])
def test_the_judge_rejects_any_malformed_message(message):
    assert _message_problem(message), message


def test_the_judge_accepts_well_formed_messages():
    ok = [{"kind": "cell", "index": 2}, {"kind": "cell error", "index": 0, "error": "raised X"}, {"kind": "tasks"},
          {"kind": "task", "id": 0, "results": [{"ok": True, "value": {"out": torch.zeros(2)}},
                                                {"ok": False, "error": "raised X"}], "violations": [], "missing": []},
          {"kind": "task", "id": 0, "results": [], "violations": [], "missing": ["sdpa"]}, {"kind": "done"}]
    assert [_message_problem(m) for m in ok] == [None] * len(ok)


# ----------------------------------------------------------------------------- tripwires
def test_tripwires_stop_the_student_and_let_the_library_through():
    import importlib

    import xfam_lib.attention as A

    original = A.scaled_dot_product_attention
    guard = _Guard({"q1a": ["xfam_lib.attention.scaled_dot_product_attention"]}).install()
    student = {}
    exec(compile("import xfam_lib.attention as A\ndef sdpa(q):\n    return A.scaled_dot_product_attention(q, q, q)\n"
                 "def sdpa_reloaded(q):\n    import importlib\n    m = importlib.reload(A)\n"
                 "    return getattr(m, 'scaled_dot_product_' + 'attention')(q, q, q)\n", "<cell 1>", "exec"), student)
    q = torch.randn(1, 3, 4)
    try:
        with guard.active("q1a"):
            for fn in (student["sdpa"], student["sdpa_reloaded"]):
                with pytest.raises(OffLimitsError):
                    fn(q)
            mha = A.MultiHeadAttention(4, 2)            # its forward calls scaled_dot_product_attention itself
            assert mha(q).shape == q.shape
        with guard.active("q2a"):                        # not off limits for another part
            assert student["sdpa"](q).shape == q.shape
        assert guard.violations == {"q1a": ["calls xfam_lib.attention.scaled_dot_product_attention "
                                            "(first from sdpa() while q1a's checks ran)"]}
    finally:
        guard.uninstall()
        importlib.reload(A)
    assert A.scaled_dot_product_attention.__module__ == original.__module__ and sys.meta_path[0] is not guard.finder


def test_a_forged_file_name_does_not_make_code_the_library():
    """The guard knows the library's code objects by identity: code compiled under the library's file
    name (or a function given a code object renamed so) calling an off-limits function is stopped."""
    import xfam_lib.attention as A

    guard = _Guard({"q1a": ["xfam_lib.attention.scaled_dot_product_attention"]}).install()
    forged = str(Path(A.__file__))
    student = {"scaled_dot_product_attention": A.scaled_dot_product_attention}
    exec(compile("def call(q):\n    return scaled_dot_product_attention(q, q, q)\n", forged, "exec"), student)
    try:
        with guard.active("q1a"), pytest.raises(OffLimitsError):
            student["call"](torch.randn(1, 3, 4))
    finally:
        guard.uninstall()


def test_a_tripwire_on_a_method_stops_super():
    """KVCache.update off limits: a subclass that calls the library's update through super() is stopped."""
    import xfam_lib.attention as A

    guard = _Guard({"q5a": ["xfam_lib.attention.KVCache.update"]}).install()
    student = {"LibraryKVCache": A.KVCache}
    exec(compile("class KVCache(LibraryKVCache):\n    def update(self, k, v, start_pos):\n"
                 "        return super().update(k, v, start_pos)\n", "<cell 5>", "exec"), student)
    try:
        cache = student["KVCache"](1, 4, 1, 2)
        with guard.active("q5a"), pytest.raises(OffLimitsError):
            cache.update(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 0)
        model_cache = A.KVCache(1, 4, 1, 2)                 # the library's own class still works for the library
        with guard.active("q5a"):
            A.MultiHeadAttention(2, 1)(torch.zeros(1, 2, 2), cache=model_cache)   # calls model_cache.update itself
        assert model_cache.length == 2
    finally:
        guard.uninstall()
    assert "update" in vars(A.KVCache) and vars(A.KVCache)["update"].__module__ == "xfam_lib.attention"


def _guarded(off_limits, library=(), parts=("q1a", "q2a")):
    """A guard with the run-time allowlist of a notebook given ``library`` (as the runner installs it)."""
    from xfam_grading.guard import allowed_homes

    return _Guard(off_limits, allowed_homes(list(library)), list(parts)).install()


def test_a_library_name_off_the_allowlist_is_a_tripwire_however_reached():
    """The allowlist holds at run time: a library function reached by a string (operator.attrgetter,
    pkgutil.resolve_name) and called from the student's code costs the part whose checks run; the
    library's own use of it, and the names the notebook was given, are let through."""
    student = {}
    exec(compile("import operator, pkgutil, torch, xfam_lib, xfam_lib.sparse\n"
                 "def by_attrgetter(q, mask):\n"
                 "    return operator.attrgetter('sparse.dense_masked_attention')(xfam_lib)(q, q, q, mask)\n"
                 "def by_resolve_name(q, mask):\n"
                 "    return pkgutil.resolve_name('xfam_lib.sparse:dense_masked_attention')(q, q, q, mask)\n"
                 "def given(q):\n"
                 "    return operator.attrgetter('attention.MultiHeadAttention')(xfam_lib)(4, 2)(q)\n",
                 "<cell 1>", "exec"), student)
    q = torch.randn(1, 3, 4)
    guard = _guarded({"q1a": ["xfam_lib.attention.scaled_dot_product_attention"]},
                     library=["xfam_lib.attention.MultiHeadAttention"])
    try:
        with guard.active("q1a"):
            for name in ("by_attrgetter", "by_resolve_name"):
                with pytest.raises(OffLimitsError, match="not among the library names"):
                    student[name](q, torch.ones(3, 3, dtype=torch.bool))
            assert student["given"](q).shape == q.shape      # given; its forward calls sdpa itself
        assert guard.violations.keys() == {"q1a"} and all("dense_masked_attention" in v
                                                          for v in guard.violations["q1a"]), guard.violations
    finally:
        guard.uninstall()


def test_a_tripwire_on_a_class_covers_its_methods():
    """An instance made without calling __init__ (object.__new__, a copy) still meets the tripwire
    in forward and in every method of its own."""
    import xfam_lib.attention as A

    model = A.MultiHeadAttention(4, 2)                       # built before the tripwires are set
    guard = _guarded({"q1a": ["xfam_lib.attention.MultiHeadAttention"]},
                     library=["xfam_lib.attention.MultiHeadAttention"])
    student = {"MHA": A.MultiHeadAttention}
    exec(compile("import torch\ndef bypass(q, model):\n    fake = object.__new__(MHA)\n"
                 "    torch.nn.Module.__init__(fake)\n    fake.__dict__.update(model.__dict__)\n"
                 "    return fake.forward(q)\n", "<cell 1>", "exec"), student)
    try:
        with guard.active("q1a"), pytest.raises(OffLimitsError):
            student["bypass"](torch.randn(1, 3, 4), model)
        assert any("MultiHeadAttention.forward" in v for v in guard.violations["q1a"]), guard.violations
    finally:
        guard.uninstall()


def test_the_audit_hook_refuses_reading_or_recompiling_the_library_from_student_code():
    """The runner's audit hook: the student's code may not read a library source file, compile code under
    a real file's name, or re-run library-named code; its own import of runpy is flagged, torch's or
    Triton's imports are not. (The hook stays installed in this process; it answers for no guard after.)"""
    import xfam_lib.attention as A
    from xfam_grading import guard as guard_module

    guard = _guarded({})
    student = {"path": A.__file__}
    source = ("import runpy, importlib\n"
              "def read():\n    return open(path).read()\n"
              "def forge():\n    return compile('x = 1', path, 'exec')\n"
              "def rerun():\n    return runpy.run_path(path)\n"
              "def honest():\n    return compile('x = 1', '<mine>', 'exec')\n")
    try:
        guard_module.audit_with(guard)
        exec(compile(source, "<cell 1>", "exec"), student)
        exec(compile("import triton\n", "<cell 2>", "exec"), {})
        for name in ("read", "forge", "rerun"):
            with pytest.raises(PermissionError):
                student[name]()
        assert student["honest"]() is not None
        assert guard.flags == ["imports runpy while it runs (runs or resolves code by name)"], guard.flags
    finally:
        guard_module._AUDIT["guard"] = None
        guard.uninstall()


def test_off_limits_are_closed_under_the_librarys_own_calls():
    """reinforce_loss computes returns_to_go: with returns_to_go off limits, so is reinforce_loss,
    unless the notebook was given it; an implied name off the allowlist still costs every part."""
    from xfam_grading.guard import implied_off_limits
    from xfam_grading.judge import scan_notebook

    implied = implied_off_limits({"q3a": ["xfam_lib.rl.returns_to_go"]})
    assert "xfam_lib.rl.reinforce_loss" in implied["q3a"] and "xfam_lib.rl.returns_to_go" not in implied["q3a"]
    given = implied_off_limits({"q3a": ["xfam_lib.rl.returns_to_go"]}, library=["xfam_lib.rl.reinforce_loss"])
    assert "xfam_lib.rl.reinforce_loss" not in given.get("q3a", []), given
    config = {"off_limits": {"q3a": ["xfam_lib.rl.returns_to_go"]}, "implied_off_limits": implied,
              "library": ["xfam_lib.rl.reinforce_loss"]}
    cell = ["from xfam_lib.rl import reinforce_loss"]
    assert list(scan_notebook(cell, ["q3a"], config, ["q3a", "q3b"])[0]) == ["q3a"]     # given: q3a only
    config["library"] = []
    assert sorted(scan_notebook(cell, ["q3a"], config, ["q3a", "q3b"])[0]) == ["q3a", "q3b"]   # off the allowlist


def test_an_output_is_copied_into_bounded_plain_data():
    """A fake NumPy scalar whose item() returns stride-0 views of one tiny storage is refused; a real
    expanded view counts every element it stands for; the judge refuses a stride-0 tensor."""
    from xfam_grading.channel import message_problem
    from xfam_grading.checks import MAX_OUTPUT_ELEMENTS, NotPlainData, _plain

    class FakeScalar:
        dtype, ndim = torch.float32, 0

        def item(self):
            return [torch.zeros(1).expand(2 ** 20)] * 1000

    with pytest.raises(NotPlainData):
        _plain(FakeScalar(), "output")
    with pytest.raises(NotPlainData, match="more than"):
        _plain([torch.zeros(1).expand(MAX_OUTPUT_ELEMENTS // 4)] * 8, "output")
    copy = _plain({"x": torch.zeros(1).expand(6)}, "output")["x"]
    assert copy.stride() == (1,) and copy.untyped_storage().nbytes() == 6 * 4

    class Task:
        names, cases = ["sdpa"], [{}]

    forged = {"kind": "task", "id": 0, "results": [{"ok": True, "value": torch.zeros(1).expand(10 ** 6)}],
              "violations": [], "missing": []}
    assert message_problem(forged, 1, [Task()], set()), "a stride-0 view was accepted"


def test_an_exception_is_formatted_inside_the_time_limit():
    """str() of the student's exception is the student's code: it runs under the call's time limit."""
    import time

    class Slow(Exception):
        def __str__(self):
            time.sleep(30)
            return "never"

    def slow(c):
        raise Slow()

    start = time.perf_counter()
    with pytest.raises(AssertionError, match="did not finish within the time limit"):
        check_cases("slow message", params=[{"n": 1}], make_case=lambda p: p, submission=slow,
                    reference=lambda c: c, limit=0.5)
    assert time.perf_counter() - start < 5


def test_the_judge_stops_comparing_at_its_deadline(ch02):
    """Scoring one submission has a deadline: the cases left after it fail, the others keep their verdicts."""
    _, judge = ch02
    task = judge.tasks[0]
    result = {"id": task.id, "results": [{"ok": True, "value": e} for e in task.expected], "violations": [],
              "missing": []}
    assert judge._judge_task(task, result, "") == []
    late = judge._judge_task(task, result, "", deadline=0.0)
    assert late and "not compared" in late[0][0], late


def test_the_why_column_holds_no_hidden_case_and_names_the_part_an_error_came_from(ch02):
    """What a part's ``why`` says (the CSV column an instructor may return): which checks fail and how
    many cases, never a hidden case's parameters or expected values; an error raised in another part's
    answer is named with that part, and a part is "not attempted" only for its own untouched stub."""
    from xfam_grading.judge import QuestionResult, TestResult

    _, judge = ch02
    env = {"sdpa": lambda q, k, v, mask=None: (q * 0, None)}
    verdict = judge.grade_namespace(env, ["q1a"]).questions["q1a"]
    hidden = [t for t in verdict.tests if t.hidden]
    assert hidden and all("case " in t.message for t in hidden)                  # the feedback file: cases
    why = verdict.message()
    assert why and "case " not in why and "expected" not in why and "cases fail" in why, why
    stub_elsewhere = ("[x] every case (2): your code raised NotImplementedError: Question 1(a): write sdpa "
                      "(in sdpa, line 3 of its cell)")
    part = QuestionResult("q1b", [TestResult("t", True, 1.0, False, stub_elsewhere)], own=["misplaced_weights"])
    assert part.attempted                                   # its own answer was written; q1a's is the stub
    own = QuestionResult("q1a", [TestResult("t", True, 1.0, False, stub_elsewhere)], own=["sdpa"])
    assert not own.attempted
    assert "raised in sdpa (q1a)" in judge._raised_elsewhere("[x] 2 of 2 cases fail", stub_elsewhere, "q1b")


# ----------------------------------------------------------------------------- each part graded on its own
@pytest.fixture(scope="module")
def ch03(tmp_path_factory):
    """Chapter 3's autograder (built into a temporary folder) and its judge."""
    from xfam_grading import Judge

    built = _build().assign("ch03", tmp_path_factory.mktemp("ch03") / "out")
    return built, Judge.from_autograder(built.zip_path)


def _master_names(chapter: str, **answers: str) -> dict:
    """The globals of a chapter master's answers, with some answers replaced by the code in ``answers``."""
    env = {"__name__": f"xfam_{chapter}_submission"}
    for source in _build().program_cells(_build().master_path(chapter), chapter):
        exec(compile(source, f"<{chapter} master>", "exec"), env)
    for part, source in answers.items():
        exec(compile(source, f"<{chapter} {part} cell>", "exec"), env)
    return env


WRONG_QK_VARIANCE = "def qk_variance(d_k, mean=0.0, var=1.0):\n    return float(d_k * var * var)\n"   # no mean term
SCALED_VARIANCE_CALLS_Q1A = ("def scaled_variance(d_k, alpha, mean=0.0, var=1.0):\n"
                             "    return qk_variance(d_k, mean, var) / float(d_k) ** (2 * alpha)\n")
SCALED_VARIANCE_ALPHA_ONCE = ("def scaled_variance(d_k, alpha, mean=0.0, var=1.0):\n"     # wrong: d_k ** alpha
                              "    return qk_variance(d_k, mean, var) / float(d_k) ** alpha\n")
MHA_LOOP_CALLS_SDPA = """
def mha_loop(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None):
    d_h = x.shape[-1] // n_heads
    heads = []
    for h in range(n_heads):
        cols = slice(h * d_h, (h + 1) * d_h)
        out, _ = sdpa(x @ W_q[:, cols] + b_q[cols], x @ W_k[:, cols] + b_k[cols], x @ W_v[:, cols] + b_v[cols], mask)
        heads.append(out)
    return torch.cat(heads, dim=-1) @ W_o + b_o
"""


def _points_of(report) -> dict[str, tuple[float, float]]:
    return {name: (q.score, q.possible) for name, q in report.questions.items()}


def test_a_right_part_that_calls_a_wrong_earlier_part_earns_its_points(ch03):
    """ch03 q1b (`scaled_variance`, which may call q1a's `qk_variance`) is checked with the reference
    `qk_variance`: a right q1b beside a wrong q1a that raises nothing keeps its points, q1a loses its own."""
    _, judge = ch03
    env = _master_names("ch03", q1a=WRONG_QK_VARIANCE, q1b=SCALED_VARIANCE_CALLS_Q1A)
    points = _points_of(judge.grade_namespace(env, ["q1a", "q1b"]))
    assert points["q1a"][0] == 0 < points["q1a"][1], points
    assert points["q1b"][0] == points["q1b"][1] > 0, points
    with pytest.raises(AssertionError):           # what the reference replaced: this q1b with this q1a is wrong
        assert env["scaled_variance"](5, 0.5, 1.0, 1.0) == pytest.approx(3.0)


def test_a_wrong_part_that_calls_a_right_earlier_part_still_loses_its_points(ch03):
    _, judge = ch03
    env = _master_names("ch03", q1b=SCALED_VARIANCE_ALPHA_ONCE)
    report = judge.grade_namespace(env, ["q1a", "q1b"])
    points = _points_of(report)
    assert points["q1a"][0] == points["q1a"][1] > 0 and points["q1b"][0] == 0 < points["q1b"][1], points
    assert report.questions["q1b"].attempted


def test_a_part_of_another_chapter_that_calls_an_earlier_part_is_graded_on_its_own(ch02):
    """ch02 q3a (`mha_loop`, which may use Question 1's `sdpa`) beside a wrong `sdpa` (scaled by d, not √d)."""
    _, judge = ch02
    env = _master_names("ch02", q1a=WRONG_SDPA, q3a=MHA_LOOP_CALLS_SDPA)
    points = _points_of(judge.grade_namespace(env, ["q1a", "q3a"]))
    assert points["q1a"][0] == 0 < points["q1a"][1] and points["q3a"][0] == points["q3a"][1] > 0, points
    wrong_loop = MHA_LOOP_CALLS_SDPA.replace("@ W_o + b_o", "@ W_o")          # forgets the output bias
    env = _master_names("ch02", q3a=wrong_loop)
    points = _points_of(judge.grade_namespace(env, ["q1a", "q3a"]))
    assert points["q1a"][0] == points["q1a"][1] > 0 and points["q3a"][0] == 0, points


ISOLATION_PROBE = """
import glob, os
seen = []
for path in [REPOSITORY + "/.git/HEAD", MASTER, CLASSMATE, SUBMISSIONS]:
    if os.path.exists(path):
        seen.append(path)
for path in glob.glob("/proc/[0-9]*/cmdline"):
    if path == f"/proc/{os.getpid()}/cmdline":              # this process: its own command line is no leak
        continue
    if b"grade" in open(path, "rb").read() or b"pytest" in open(path, "rb").read():
        seen.append(path)
for path in [CLASSMATE, LIBRARY, REPOSITORY + "/pyproject.toml", "/usr/lib/os-release"]:
    try:
        with open(path, "r+") as f:                     # only a file that is there: no new file
            f.seek(0, 2)
            f.write("# tampered")
        seen.append("wrote " + path)
    except OSError:
        pass
try:
    __import__("".join(reversed("spoine")))                 # installed for the book's tests only
    seen.append("imported a package outside the grading environment")
except ImportError:
    pass
print("LEAKS:", seen, "uid:", os.getuid(), "processes:", len(glob.glob("/proc/[0-9]*")))
"""


@pytest.mark.parametrize("mode", ["root", "userns"])
def test_the_runner_sees_only_its_allowlist(ch02, tmp_path, mode):
    """Under each isolation mode the notebook's process finds no repository (.git, masters), no other
    submission and no grading process, can write no file it can see, and cannot import a package
    outside the grading environment; it runs as a uid that owns nothing."""
    from xfam_grading import Judge
    from xfam_grading.sandbox import isolation_available

    if isolation_available() == "basic" or (mode == "root" and os.geteuid() != 0):
        pytest.skip(f"no {mode} isolation on this machine")
    built, _ = ch02
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    classmate = submissions / "classmate.ipynb"
    classmate.write_text("{}")
    classmate.chmod(0o666)                                  # even a file anyone may write
    import xfam_lib

    names = {"REPOSITORY": ROOT, "MASTER": _build().master_path("ch02"), "CLASSMATE": classmate,
             "SUBMISSIONS": submissions, "LIBRARY": Path(xfam_lib.__file__)}
    probe = ISOLATION_PROBE
    for name, path in names.items():
        probe = probe.replace(name, repr(str(path)))
    judge = Judge.from_autograder(built.zip_path, isolation=mode)
    report = judge.grade(_with_cell(_solution_notebook(ch02), probe, before="def sdpa"))
    line = next((ln for ln in report.output_tail.splitlines() if ln.startswith("LEAKS:")), None)
    assert line is not None, report.output_tail[-2000:]
    assert line.startswith("LEAKS: [] uid: ") and line.endswith("processes: 1"), line
    uid = int(line.split("uid: ")[1].split()[0])
    assert uid != os.getuid() and not any(p.stat().st_uid == uid for p in (ROOT, classmate, Path(xfam_lib.__file__)))
    assert classmate.read_text() == "{}"
    assert report.total == report.possible, report.summary()      # the solution still earns everything


def test_without_a_sandbox_the_judge_must_be_told(monkeypatch):
    from xfam_grading import Judge

    monkeypatch.setattr(judge_module, "isolation_available", lambda: "basic")
    with pytest.raises(RuntimeError, match="isolation='basic'"):
        Judge(ROOT / "exercises" / "ch02" / "student" / "tests")


# ----------------------------------------------------------------------------- attacks, end to end
def _solution_notebook(ch02=None) -> nbformat.NotebookNode:
    return nbformat.read(_build().master_path("ch02"), as_version=4)


def _with_cell(nb, source: str, *, before: str | None = None, replace: str | None = None):
    """A copy of ``nb`` with a code cell added (before the cell starting with ``before``) or replacing one."""
    nb = nbformat.from_dict(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.startswith(before or replace or "\0"):
            if replace:
                cell.source = source
            else:
                nb.cells.insert(i, nbformat.v4.new_code_cell(source))
            return nb
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


WRONG_SDPA = ("def sdpa(q, k, v, mask=None):\n    s = q @ k.transpose(-2, -1) / q.shape[-1]\n"
              "    if mask is not None:\n        s = s.masked_fill(~mask, float('-inf'))\n"
              "    w = torch.nan_to_num(torch.softmax(s, -1))\n    return w @ v, w\n")

WEIGHTS = """
def _weights(scores, mask):
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))
"""
OFF_THE_ALLOWLIST = ("third_party_package", "private_helper", "same_computation_elsewhere", "time_magic_hides_the_body")

ATTACKS = {
    # attack name: (cell source, how it goes in: replace sdpa's cell or a cell before it, the part it attacks)
    "reference_lookup": ("""
import gc, sys
def sdpa(q, k, v, mask=None):
    for obj in gc.get_objects():                              # a reference function or expected values?
        if callable(obj) and getattr(obj, "__name__", "") in ("reference", "expected"):
            return obj({"q": q, "k": k, "v": v, "mask": mask})
    frame = sys._getframe(1)
    while frame is not None:
        for name in ("expected", "reference"):
            if name in frame.f_locals:
                return frame.f_locals[name]
        frame = frame.f_back
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), torch.zeros(*q.shape[:-1], k.shape[-2], dtype=q.dtype)
""", "replace", "q1a"),
    "patch_the_grader": ("""
import xfam_grading as g
from xfam_grading import checks, compare, runner
g.output_problems = compare.output_problems = lambda *args, **kwargs: []
g.compare_outputs = lambda *args, **kwargs: None
checks._judge_case = lambda *args, **kwargs: []
runner.run_task = lambda spec, env, guard: {"id": spec["id"], "results": [{"ok": True, "value": c} for c in spec["cases"]],
                                        "violations": [], "missing": []}
""" + WRONG_SDPA, "replace", "q1a"),
    "patch_torch": ("""
import torch
torch.allclose = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)
torch.Tensor.__ne__ = lambda self, other: torch.zeros_like(self, dtype=torch.bool)
""" + WRONG_SDPA, "replace", "q1a"),
    "patch_otter": ("""
import otter
from otter.test_files import abstract_test
abstract_test.TestFile.score = property(lambda self: self.possible)
abstract_test.TestFile.passed_all = property(lambda self: True)
otter.Notebook.check = lambda self, *args, **kwargs: None
""" + WRONG_SDPA, "replace", "q1a"),
    "library_sdpa": ("""
from xfam_lib.attention import scaled_dot_product_attention as _lib
def sdpa(q, k, v, mask=None):
    return _lib(q, k, v, mask, return_weights=True)
""", "replace", "q1a"),
    "library_sdpa_built_at_run_time": ("""
import importlib
def sdpa(q, k, v, mask=None):
    module = importlib.import_module("xfam_lib." + "attention")
    name = "noitnetta_tcudorp_tod_delacs"[::-1]
    return getattr(module, name)(q, k, v, mask, return_weights=True)
""", "replace", "q1a"),
    "memory_bomb": ("""
def sdpa(q, k, v, mask=None):
    hog = torch.empty(100 * 2 ** 30, dtype=torch.uint8)      # 100 GB
    return hog, hog
""", "replace", "q1a"),
    "fork_bomb": ("""
import os
def sdpa(q, k, v, mask=None):
    while True:
        try:
            if os.fork() == 0:
                import time
                time.sleep(600)
        except OSError:
            pass
""", "replace", "q1a"),
    "fill_the_disk": ("""
import os, tempfile
for folder in (os.getcwd(), tempfile.gettempdir(), "/dev/shm"):
    try:
        with open(os.path.join(folder, "filler"), "wb") as f:
            while True:
                f.write(b"0" * 2 ** 20)
    except Exception as exc:
        print("stopped:", type(exc).__name__)
""", "before", None),
    "sys_exit": ("import sys\nsys.exit('bye')", "before", None),
    "os_exit": ("""
import os
def sdpa(q, k, v, mask=None):
    os._exit(0)
""", "replace", "q1a"),
    "endless_loop_without_alarm": ("""
import signal
def sdpa(q, k, v, mask=None):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)             # the time limit's alarm no longer interrupts
    while True:
        pass
""", "replace", "q1a"),
    "writes_to_the_tests": ("""
import glob, os
targets = glob.glob("/tmp/**/tests/q1a.py", recursive=True) + glob.glob("../**/tests/*.py", recursive=True)
targets += [os.environ.get("XFAM_SENTINEL", ""), SENTINEL, AUTOGRADER]
for path in targets:
    try:
        with open(path, "a") as f:
            f.write("\\n# tampered\\n")
        print("wrote", path)
    except Exception as exc:
        print("could not write", path, type(exc).__name__)
""", "before", None),
    # the second set: answers from elsewhere, introspection the scanner could not see, a forged reply
    "third_party_package": ("""
import einops
def sdpa(q, k, v, mask=None):
    scores = einops.einsum(q, k, "... i d, ... j d -> ... i j") / q.shape[-1] ** 0.5
    return _weights(scores, mask) @ v, _weights(scores, mask)
""" + WEIGHTS, "replace", "q1a"),
    "private_helper": ("""
from xfam_lib.attention import _masked_softmax
def sdpa(q, k, v, mask=None):
    w = _masked_softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, mask)
    return w @ v, w
""", "replace", "q1a"),
    "same_computation_elsewhere": ("""
from xfam_lib.sparse import dense_masked_attention
def sdpa(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    full = torch.ones(scores.shape[-2:], dtype=torch.bool) if mask is None else mask
    return dense_masked_attention(q, k, v, full), _weights(scores, mask)
""" + WEIGHTS, "replace", "q1a"),
    "time_magic_hides_the_body": ("""%%time
from xfam_lib.attention import _masked_softmax as soft
def sdpa(q, k, v, mask=None):
    w = soft(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, mask)
    return w @ v, w
""", "replace", "q1a"),
    "closure_of_the_tripwire": ("""
import xfam_lib.utils as U
def sdpa(q, k, v, mask=None):
    load = getattr(U.seed_everything, "__glo" + "bals__")["__builtins__"]["__import__"]
    wire = getattr(load("xfam_lib.attention", fromlist=["x"]), "scaled_dot_" + "product_attention")
    cells = getattr(wire, "__clo" + "sure__") or ()
    original = [c.cell_contents for c in cells if callable(c.cell_contents)
                and getattr(c.cell_contents, "__name__", "") == wire.__name__ and c.cell_contents is not wire]
    return (original or [wire])[0](q, k, v, mask, return_weights=True)
""", "replace", None),                  # the tripwire still holds the original: this one is flagged, not stopped
    "forged_code_file_name": ("""
import os
import xfam_lib.utils as U
def _call(q, k, v, mask):
    return scaled_dot_product_attention(q, k, v, mask, return_weights=True)
_code = getattr(_call, "__co" + "de__")
_lib = os.path.join(os.path.dirname(getattr(U, "__fi" + "le__")), "attention.py")
setattr(_call, "__co" + "de__", _code.replace(co_filename=_lib))
_load = getattr(U.seed_everything, "__glo" + "bals__")["__builtins__"]["__import__"]
scaled_dot_product_attention = getattr(_load("xfam_lib.attention", fromlist=["x"]), "scaled_dot_" + "product_attention")
def sdpa(q, k, v, mask=None):
    return _call(q, k, v, mask)
""", "replace", "q1a"),
    "forged_reply": ("""
import io, json, os, struct, sys
buffer = io.BytesIO()
torch.save({"kind": "task", "id": 0, "results": [], "violations": 5, "missing": []}, buffer)
os.write(json.loads(sys.argv[1])["reply_fd"], struct.pack(">Q", len(buffer.getvalue())) + buffer.getvalue())
""", "before", "q1a"),
    "reads_a_classmate": (WRONG_SDPA + """
_wrong = sdpa
def _leaked():
    import glob, os
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            words = open(cmdline, "rb").read().split(b"\\0")
        except OSError:
            continue
        for word in words:
            if os.path.isfile(os.path.join(word.decode(errors="replace"), "control.ipynb")):
                return True                              # the judge's command line named the submissions folder
    return os.path.exists(GIT)                           # or the repository, with the masters in its history
LEAKED = _leaked()
def sdpa(q, k, v, mask=None):                            # right only if it could read what it must not
    if not LEAKED:
        return _wrong(q, k, v, mask)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return _weights(scores, mask) @ v, _weights(scores, mask)
""" + WEIGHTS, "replace", "q1a"),
    "network": ("""
import socket
try:
    socket.create_connection(("pypi.org", 443), timeout=5).close()
    print("NETWORK REACHABLE")
except OSError as exc:
    print("no network:", exc)
""", "before", None),
    # the third set: library code reached at run time, re-executed or read; outputs that cost the judge
    "attrgetter_off_the_allowlist": ("""
import operator, xfam_lib                     # xfam_lib.sparse is loaded already: no import names it
_dense = operator.attrgetter("sparse.dense_masked_attention")(xfam_lib)
def sdpa(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    full = torch.ones(scores.shape[-2:], dtype=torch.bool) if mask is None else mask
    return _dense(q, k, v, full), _weights(scores, mask)
""" + WEIGHTS, "replace", "q1a"),
    "runpy_reexecutes_the_library": ("""
import runpy
try:
    _fresh = runpy.run_module("xfam_lib.attention")["scaled_dot_product_attention"]
except Exception as exc:
    print("runpy refused:", type(exc).__name__)
    _fresh = None
def sdpa(q, k, v, mask=None):
    return _fresh(q, k, v, mask, return_weights=True)
""", "replace", "q1a"),
    "get_data_and_an_interpreter": ("""
import code, pkgutil
_ns = {"__name__": "fresh"}
try:
    _src = pkgutil.get_data("xfam_lib", "attention.py").decode()
    code.InteractiveInterpreter(_ns).runsource(_src, "<library>", "exec")
except Exception as exc:
    print("get_data refused:", type(exc).__name__)
def sdpa(q, k, v, mask=None):
    return _ns["scaled_dot_product_attention"](q, k, v, mask, return_weights=True)
""", "replace", "q1a"),
    "forged_file_name_in_compile": ("""
import os, xfam_lib.utils as U
_file = os.path.join(os.path.dirname(getattr(U, "__fi" + "le__")), "attention.py")
_ns = {}
try:
    exec(compile("import xfam_lib.attention as A\\ndef f(*a, **k):\\n    return A.attention_reference(*a, **k)\\n",
                 _file, "exec"), _ns)
except Exception as exc:
    print("compile refused:", type(exc).__name__)
def sdpa(q, k, v, mask=None):
    return _ns["f"](q, k, v, mask)
""", "replace", "q1a"),
    # each part graded on its own: q3a's mha_loop calls this sdpa, which is wrong unless it finds q1a's
    # reference answer; the runner gets that only once the judge holds q1a's results (q3a's cell: the fixture)
    "reference_of_its_own_part": ("""
import gc
def sdpa(q, k, v, mask=None):
    for obj in gc.get_objects():
        code = getattr(obj, "__code__", None)
        if getattr(code, "co_filename", "").startswith("<reference") and obj.__name__ == "sdpa":
            return obj(q, k, v, mask)
    s = q @ k.transpose(-2, -1) / q.shape[-1]
    if mask is not None:
        s = s.masked_fill(~mask, float('-inf'))
    w = torch.nan_to_num(torch.softmax(s, -1))
    return w @ v, w
""", "replace", "q1a"),
    "huge_output_from_a_tiny_storage": ("""
class _Scalar:
    dtype, ndim = torch.float32, 0
    def item(self):
        return [torch.zeros(1).expand(2 ** 22)] * 64
def sdpa(q, k, v, mask=None):
    return _Scalar(), _Scalar()
""", "replace", "q1a"),
}


def _attack_run(built, tmp: Path) -> dict:
    """grade.py (two jobs) over the control notebook and every attack, in ``tmp``: its results as JSON data."""
    import hashlib

    subs = tmp / "submissions"
    subs.mkdir()
    zip_path = tmp / "hidden" / "ch02-autograder.zip"
    zip_path.parent.mkdir()
    zip_path.write_bytes(built.zip_path.read_bytes())
    sentinel = tmp / "sentinel.txt"
    sentinel.write_text("untouched\n")
    os.chmod(sentinel, 0o644)
    base = _solution_notebook(None)
    nbformat.write(base, subs / "control.ipynb")
    for name, (source, how, _) in ATTACKS.items():
        source = source.replace("SENTINEL", repr(str(sentinel))).replace("AUTOGRADER", repr(str(zip_path)))
        source = source.replace("GIT", repr(str(ROOT / ".git")))
        nb = _with_cell(base, source, replace="def sdpa") if how == "replace" else _with_cell(base, source, before="def sdpa")
        if name == "reference_of_its_own_part":
            nb = _with_cell(nb, MHA_LOOP_CALLS_SDPA, replace="def mha_loop")
        nbformat.write(nb, subs / f"{name}.ipynb")
    before = {p: p.read_bytes() for p in (zip_path, sentinel)}
    out = tmp / "grades.csv"
    judge_tmp = tmp / "judge_tmp"                  # the runners' folders (named in their command lines) are here
    judge_tmp.mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "exercises" / "grade.py"), "ch02", str(subs), "--out", str(out),
                           "--autograder", str(zip_path), "--jobs", "2", "--timeout", "40", "--call-timeout", "5",
                           "--feedback", str(tmp / "feedback")],
                          capture_output=True, text=True, timeout=600, cwd=tmp,
                          env=dict(os.environ, TMPDIR=str(judge_tmp)))
    # this run's runners: their command line carries the judge's config, which names their folder in judge_tmp
    runners = subprocess.run(["pgrep", "-af", "_runner_main"], capture_output=True, text=True).stdout.splitlines()
    leftovers = [line.split()[0] for line in runners if str(judge_tmp.resolve()) in line]
    rows = {row["file"].removesuffix(".ipynb"): row for row in csv.DictReader(out.open(encoding="utf-8"))} \
        if out.exists() else {}
    return {"proc": {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}, "rows": rows,
            "before": {str(path): hashlib.sha256(data).hexdigest() for path, data in before.items()},
            "leftovers": leftovers, "feedback": str(tmp / "feedback")}


@pytest.fixture(scope="module")
def attack_run(ch02, tmp_path_factory):
    """One grading run over the control notebook and every attack, shared by all pytest-xdist workers of
    a session: the first worker that needs it runs it (a file lock), the others read its results (each
    worker would otherwise start its own run of 28 sandboxed submissions)."""
    import fcntl
    import json
    import types

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, result = shared / "xfam_attack_run", shared / "xfam_attack_run" / "result.json"
    with open(shared / "xfam_attack_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.is_file():
            folder.mkdir(exist_ok=True)
            result.write_text(json.dumps(_attack_run(ch02[0], folder)), encoding="utf-8")
    run = json.loads(result.read_text(encoding="utf-8"))
    run["proc"] = types.SimpleNamespace(**run["proc"])
    run["feedback"] = Path(run["feedback"])
    return run


def _points(row: dict, part: str) -> str:
    """A part's points in a CSV row (its column is headed ``q1a (max 2)``)."""
    return next(value for key, value in row.items() if key.startswith(f"{part} (max "))


def test_the_grading_run_finishes_and_leaves_nothing_behind(attack_run):
    proc = attack_run["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(attack_run["rows"]) == {"control", *ATTACKS}, attack_run["rows"].keys()
    assert attack_run["leftovers"] == [], f"runner processes left behind: {attack_run['leftovers']}"
    import hashlib

    for path, digest in attack_run["before"].items():
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest, f"{path} was changed by a submission"
    control = attack_run["rows"]["control"]
    parts = [q.name for q in _build().parse_master(_build().master_path("ch02"))]
    assert all(_points(control, p) != "0" for p in parts) and not control["message"] and not control["flags"], control


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_attack_scores_nothing_on_its_part_or_is_flagged(attack, attack_run):
    row = attack_run["rows"][attack]
    part = ATTACKS[attack][2]
    feedback = (attack_run["feedback"] / f"{attack}.txt").read_text(encoding="utf-8")
    if part:
        assert _points(row, part) == "0", row
    else:
        assert row["flags"], f"{attack} was not flagged: {row}"
    if attack == "library_sdpa":
        assert "off-limits rule" in row["q1a why"] and "scaled_dot_product_attention" in row["q1a why"], row
        assert _points(row, "q1b") != "0", row             # an off-limits name costs only its own part
    if attack == "library_sdpa_built_at_run_time":         # imports xfam_lib.attention, off the allowlist
        assert row["total"] == "0" and "off the allowlist" in row["q2a why"], row
    if attack in ("reference_lookup", "patch_the_grader", "patch_torch", "patch_otter", "fork_bomb",
                  "writes_to_the_tests", "network", "library_sdpa_built_at_run_time"):
        assert row["flags"], f"{attack} was not flagged: {row}"
    if attack in ("memory_bomb", "fork_bomb", "fill_the_disk", "sys_exit", "writes_to_the_tests", "network"):
        assert _points(row, "q2a") != "0" and _points(row, "q5c") != "0", f"{attack} cost more than its part: {row}"
    if attack == "os_exit":
        assert "ended early" in row["message"], row
    if attack == "endless_loop_without_alarm":
        assert "grading stopped after 40 s" in row["message"], row
    if attack == "network":
        assert "NETWORK REACHABLE" not in feedback
    if attack in OFF_THE_ALLOWLIST:                        # the cell may answer any part: every part scores 0
        assert row["total"] == "0" and "off the allowlist" in row["q2a why"], row
    if attack in ("closure_of_the_tripwire", "forged_code_file_name"):
        assert "__closure__" in row["flags"] or "__code__" in row["flags"], row
    if attack in ("runpy_reexecutes_the_library", "get_data_and_an_interpreter"):
        assert "runs or resolves code by name" in row["flags"], row
    if attack == "attrgetter_off_the_allowlist":
        assert "calls xfam_lib.sparse" in row["q1a why"] and _points(row, "q1b") != "0", row
    if attack == "huge_output_from_a_tiny_storage":              # refused in the runner, in little time
        seconds = re.search(rf"^{attack}.ipynb: .* in ([\d.]+) s", attack_run["proc"].stdout, flags=re.M)
        assert "got an object of type _Scalar" in row["q1a why"] and seconds and float(seconds.group(1)) < 60, row
    if attack == "reference_of_its_own_part":              # q3a calls the wrong sdpa: checked with q1a's reference
        assert _points(row, "q3a") == re.search(r"q3a \(max (\S+)\)", " ".join(row)).group(1), row
        assert "raised in" not in row["q3a why"] and not row["q3a why"], row
    if attack == "forged_reply":                           # contained: this submission only (the run went on)
        assert row["total"] == "0" and "grading stopped" in row["message"] and "violations" in row["message"], row


# ----------------------------------------------------------------------------- the autograder zip under otter run
def test_otter_run_with_the_zip_grades_through_the_judge(ch02, tmp_path):
    """The zip's plugin: none of the student's code runs in otter's kernel; the scores are the judge's."""
    from otter.run import main as otter_run

    built, _ = ch02
    with zipfile.ZipFile(built.zip_path) as zf:
        assert "xfam_grading.OtterJudge" in zf.read("otter_config.json").decode()
        requirements = zf.read("requirements.txt").decode()
    assert "torch==" in requirements and "otter-grader[grading]==" in requirements and ".whl" in requirements
    wrong = _with_cell(_solution_notebook(ch02), WRONG_SDPA + "\nimport torch\ntorch.allclose = lambda *a, **k: True",
                       replace="def sdpa")
    results = {}
    for name, nb in (("solution", _solution_notebook(ch02)), ("wrong", wrong)):
        path = tmp_path / name / "ch02_exercises.ipynb"
        path.parent.mkdir()
        nbformat.write(nb, path)
        results[name] = otter_run(str(path), autograder=str(built.zip_path), output_dir=None, no_logo=True)
    solution, wrong_result = results["solution"], results["wrong"]
    assert solution.total == solution.possible > 0, solution.summary()
    assert wrong_result.get_score("q1a") == 0 and wrong_result.get_score("q1b") > 0, wrong_result.summary()
    assert wrong_result.total < wrong_result.possible


# ----------------------------------------------------------------------------- memory budgets in a child process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the budget needs fork and /proc")
def test_a_memory_budget_holds_whatever_allocates():
    """The full 2048 x 16384 float32 matrix (128 MiB) does not fit a child allowed 32 MiB more, built by torch,
    by torch with its dispatch hooks off (blind to a TorchDispatchMode spy) or by numpy; a loop over
    64-column blocks fits and returns its value; an error and an endless call are reported, not raised."""
    from xfam_grading import run_with_memory_budget

    q, k = torch.randn(2048, 8), torch.randn(16384, 8)

    def blocks():
        return torch.stack([(q @ k[j:j + 64].T).amax(-1) for j in range(0, k.shape[0], 64)]).amax(0)

    def full_torch():
        return (q @ k.T).amax(-1)

    def full_no_dispatch():
        with torch._C._DisableTorchDispatch():
            return (q @ k.T).amax(-1)

    def full_numpy():
        return torch.from_numpy((q.numpy() @ k.numpy().T).max(-1))

    budget = 32 * 2 ** 20
    fits = run_with_memory_budget(blocks, budget)
    assert not fits["over"] and not fits["error"], fits
    torch.testing.assert_close(fits["value"], full_torch(), rtol=0, atol=0)
    for fn in (full_torch, full_no_dispatch, full_numpy):
        run = run_with_memory_budget(fn, budget)
        assert run["over"] and run["value"] is None, (fn.__name__, run)
    assert run_with_memory_budget(full_numpy, 512 * 2 ** 20)["value"].shape == (2048,)   # the limit, not numpy

    def fails():
        raise ValueError("deliberate")

    def endless():
        while True:
            pass

    failed = run_with_memory_budget(fails, budget)
    assert not failed["over"] and "raised ValueError: deliberate" in failed["error"], failed
    stopped = run_with_memory_budget(endless, budget, seconds=0.5)
    assert not stopped["over"] and "time limit" in stopped["error"], stopped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the budget needs fork and /proc")
def test_a_memory_budget_does_not_charge_freed_blocks():
    """A correct answer that frees each block before the next one fits whatever the allocator did
    before: here the parent first frees a large block (glibc then serves blocks of that size from the
    heap, where a freed 512 KiB block need not fit the next aligned one) and the child loops over 256
    such blocks, keeping 8 KiB of each, under a 32 MiB budget (128 MiB if blocks piled up)."""
    from xfam_grading import run_with_memory_budget

    q, k = torch.randn(2048, 8), torch.randn(16384, 8)
    big = torch.empty(4 * 2 ** 20)
    del big                                   # raises glibc's dynamic mmap threshold in the parent

    def blocks():
        return torch.stack([(q @ k[j:j + 64].T).amax(-1) for j in range(0, k.shape[0], 64)])

    run = run_with_memory_budget(blocks, 32 * 2 ** 20)
    assert not run["over"] and not run["error"], run
    assert run["value"].shape == (256, 2048)


def test_a_copy_of_a_layer_the_tests_built_is_theirs_too():
    """A tripwire on a library class's forward lets the tests' own instance, and a deepcopy of it (a student
    may copy a given layer), through, but not an instance the student made without its __init__."""
    import copy

    from xfam_lib.transformer import EncoderLayer

    guard = _Guard({}, allowed=("xfam_lib.utils",), parts=["q1a"]).install()
    try:
        scope = {"EncoderLayer": EncoderLayer}
        exec(compile("given = EncoderLayer(8, 2, 16)\n", "<check q1a>", "exec"), scope)
        x = torch.randn(1, 3, 8)
        student = {"copy": copy, "given": scope["given"], "x": x, "EncoderLayer": EncoderLayer}
        exec(compile("out = copy.deepcopy(given)(x)\n", "<cell>", "exec"), student)
        with pytest.raises(OffLimitsError):
            exec(compile("made = EncoderLayer.__new__(EncoderLayer)\nmade.__dict__.update(given.__dict__)\n"
                         "del made.__dict__['_xfam_given']\nmade(x)\n", "<cell>", "exec"), student)
    finally:
        guard.uninstall()


def test_one_off_limits_entry_per_object_however_many_spellings():
    """A re-export and its home are one entry with both parts' questions, so neither spelling hides the other."""
    entries = expand_off_limits({"q1a": ["xfam_lib.sparse.pattern_mask"], "q3a": ["xfam_lib.sparse.gallery.pattern_mask"]})
    assert list(entries) == ["xfam_lib.sparse.pattern_mask"] and entries["xfam_lib.sparse.pattern_mask"][1] == ["q1a", "q3a"]
    resolve = off_limits_resolver(entries)
    assert resolve("xfam_lib.sparse.gallery.pattern_mask") == resolve("xfam_lib.sparse.pattern_mask") != []
