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
  finishes, files outside the sandbox are unchanged and no process is left behind.
* The autograder zip's otter plugin grades under ``otter run`` as the judge does.
"""
from __future__ import annotations

import csv
import importlib.util
import os
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


def test_trim_otter_message_keeps_only_what_the_check_says():
    raw = ("❌ Test case failed\nError at line 30 in test q1a:\n      check_cases(\"masks\", params=[...])\n"
           "AssertionError: [masks] case n=2: out: expected shape (2,), got shape (3,)")
    assert trim_otter_message(raw) == "❌ Test case failed\n[masks] case n=2: out: expected shape (2,), got shape (3,)"


# ----------------------------------------------------------------------------- what the runner receives
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
    ("exec('print(1)')", "runs code from a string"),
    ("import sys\nsys.exit(0)", "ends the process"),
])
def test_scan_flags_tampering(cell, flag):
    _, flags = _scan(cell)
    assert any(flag in f for f in flags), flags


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
        assert guard.violations == {"q1a": ["calls xfam_lib.attention.scaled_dot_product_attention"]}
    finally:
        guard.uninstall()
        importlib.reload(A)
    assert A.scaled_dot_product_attention.__module__ == original.__module__ and sys.meta_path[0] is not guard.finder


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


def test_without_a_sandbox_the_judge_must_be_told(monkeypatch):
    from xfam_grading import Judge

    monkeypatch.setattr(judge_module, "isolation_available", lambda: "basic")
    with pytest.raises(RuntimeError, match="isolation='basic'"):
        Judge(ROOT / "exercises" / "ch02" / "student" / "tests")


# ----------------------------------------------------------------------------- attacks, end to end
def _solution_notebook(ch02) -> nbformat.NotebookNode:
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
    "network": ("""
import socket
try:
    socket.create_connection(("pypi.org", 443), timeout=5).close()
    print("NETWORK REACHABLE")
except OSError as exc:
    print("no network:", exc)
""", "before", None),
}


@pytest.fixture(scope="module")
def attack_run(ch02, tmp_path_factory):
    """One grading run (two jobs) over the control notebook and every attack."""
    built, _ = ch02
    tmp = tmp_path_factory.mktemp("attacks")
    subs = tmp / "submissions"
    subs.mkdir()
    zip_path = tmp / "hidden" / "ch02-autograder.zip"
    zip_path.parent.mkdir()
    zip_path.write_bytes(built.zip_path.read_bytes())
    sentinel = tmp / "sentinel.txt"
    sentinel.write_text("untouched\n")
    os.chmod(sentinel, 0o644)
    base = _solution_notebook(ch02)
    nbformat.write(base, subs / "control.ipynb")
    for name, (source, how, _) in ATTACKS.items():
        source = source.replace("SENTINEL", repr(str(sentinel))).replace("AUTOGRADER", repr(str(zip_path)))
        nb = _with_cell(base, source, replace="def sdpa") if how == "replace" else _with_cell(base, source, before="def sdpa")
        nbformat.write(nb, subs / f"{name}.ipynb")
    before = {p: p.read_bytes() for p in (zip_path, sentinel)}
    out = tmp / "grades.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "exercises" / "grade.py"), "ch02", str(subs), "--out", str(out),
                           "--autograder", str(zip_path), "--jobs", "2", "--timeout", "40", "--call-timeout", "5",
                           "--feedback", str(tmp / "feedback")],
                          capture_output=True, text=True, timeout=600, cwd=tmp)
    # this run's runners: their command line carries the judge's config, which names this run's zip
    runners = subprocess.run(["pgrep", "-af", "_runner_main"], capture_output=True, text=True).stdout.splitlines()
    leftovers = [line.split()[0] for line in runners if str(zip_path.resolve()) in line]
    rows = {row["file"].removesuffix(".ipynb"): row for row in csv.DictReader(out.open(encoding="utf-8"))} \
        if out.exists() else {}
    return {"proc": proc, "rows": rows, "before": before, "leftovers": leftovers, "feedback": tmp / "feedback"}


def test_the_grading_run_finishes_and_leaves_nothing_behind(attack_run):
    proc = attack_run["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert set(attack_run["rows"]) == {"control", *ATTACKS}, attack_run["rows"].keys()
    assert attack_run["leftovers"] == [], f"runner processes left behind: {attack_run['leftovers']}"
    for path, data in attack_run["before"].items():
        assert path.read_bytes() == data, f"{path} was changed by a submission"
    control = attack_run["rows"]["control"]
    parts = [q.name for q in _build().parse_master(_build().master_path("ch02"))]
    assert all(control[p] != "0" for p in parts) and not control["message"] and not control["flags"], control


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_attack_scores_nothing_on_its_part_or_is_flagged(attack, attack_run):
    row = attack_run["rows"][attack]
    part = ATTACKS[attack][2]
    feedback = (attack_run["feedback"] / f"{attack}.txt").read_text(encoding="utf-8")
    if part:
        assert row[part] == "0", row
    else:
        assert row["flags"], f"{attack} was not flagged: {row}"
    if attack in ("library_sdpa", "library_sdpa_built_at_run_time"):
        assert "off limits" in row["message"] and "scaled_dot_product_attention" in row["message"], row
        assert row["q1b"] != "0", row                      # the other parts keep their points
    if attack in ("reference_lookup", "patch_the_grader", "patch_torch", "patch_otter", "fork_bomb",
                  "writes_to_the_tests", "network", "library_sdpa_built_at_run_time"):
        assert row["flags"], f"{attack} was not flagged: {row}"
    if attack in ("memory_bomb", "fork_bomb", "fill_the_disk", "sys_exit", "writes_to_the_tests", "network"):
        assert row["q2a"] != "0" and row["q5c"] != "0", f"{attack} cost more than the part it attacked: {row}"
    if attack == "os_exit":
        assert "ended early" in row["message"], row
    if attack == "endless_loop_without_alarm":
        assert "grading stopped after 40 s" in row["message"], row
    if attack == "network":
        assert "NETWORK REACHABLE" not in feedback


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
