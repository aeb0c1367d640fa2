"""Proofs for the graded exercises of every chapter under ``exercises/`` (DESIGN.md, "Exercises").

For every question of every master notebook ``exercises/chNN/chNN_exercises.ipynb``:

* the solution passes all of the question's tests, public and hidden;
* the untouched student stub fails all of them cleanly (``NotImplementedError``), scoring 0;
* every wrong answer in ``exercises/chNN/wrong_answers.py`` (wrong shape, NaN, off by one, ...)
  and two generic ones made here for every question (an exception; an endless loop, stopped by
  the time limit) fails every hidden test with a clear message and scores 0;
* tampering earns nothing: with the comparison functions or the tensor comparison operators
  patched (in a subprocess, so this process stays clean), off-by-one answers still score 0.

These run a question's test file the way otter does (``ExceptionTestFile.run`` on the answer's
namespace), in this process, which keeps them fast. End to end, ``exercises/grade.py`` grades
four files with ``otter run``: the master notebook (full marks), the untouched student notebook
(0), a tampering notebook (0, flagged for review) and a file that is not a notebook (0).

Also checked: the committed student folder equals a fresh build, nothing hidden reaches the
student folder, and each master follows the grading policy (`build.validate_master`). Everything
is built into pytest's temporary directory, so a fresh clone without ``_build/`` works.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.filterwarnings("ignore:Traits should be given as instances:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent
ENDLESS_LOOP_LIMIT = 0.3          # seconds: the time limit used to stop the endless-loop answers quickly
CRASH_SIGNS = ("test bug", "could not be judged", "grading oracle", "Traceback")


def _load(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


build = _load("xfam_exercises_build", ROOT / "exercises" / "build.py")
CHAPTERS = build.chapters()
QUESTIONS = {ch: build.parse_master(build.master_path(ch)) for ch in CHAPTERS}


def wrong_answers(chapter: str):
    path = ROOT / "exercises" / chapter / "wrong_answers.py"
    return _load(f"xfam_{chapter}_wrong_answers", path) if path.exists() else None


def _variants():
    for ch in CHAPTERS:
        module = wrong_answers(ch)
        for q in QUESTIONS[ch]:
            listed = list(module.WRONG_ANSWERS.get(q.name, {})) if module else []
            for variant in ["solution", "stub", "exception", "endless_loop", *listed]:
                yield pytest.param(ch, q.name, variant, id=f"{ch}-{q.name}-{variant}")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """``built(chapter)``: otter assign of that chapter into a temporary folder (once per session)."""
    done = {}

    def get(chapter):
        if chapter not in done:
            done[chapter] = build.assign(chapter, tmp_path_factory.mktemp(chapter) / "out")
        return done[chapter]

    return get


_namespaces: dict[tuple[str, str], dict] = {}


def namespace(chapter: str, which: str, built) -> dict:
    """The globals of the master's answers (``solution``) or the student notebook's (``stub``, needs ``built``)."""
    key = (chapter, which)
    if key not in _namespaces:
        path = build.master_path(chapter) if which == "solution" else built(chapter).student_dir / f"{chapter}_exercises.ipynb"
        env = {"__name__": f"xfam_{chapter}_{which}"}
        for source in build.program_cells(path, chapter):
            exec(compile(source, f"<{chapter} {which}>", "exec"), env)
        _namespaces[key] = env
    return dict(_namespaces[key])


def _generic(question, env: dict, kind: str) -> dict:
    """Replace every function and class the answer defines by one that raises or never returns."""
    def misbehave(*args, **kwargs):
        if kind == "exception":
            raise RuntimeError("deliberate failure in a wrong submission")
        while True:
            pass

    replaced = {}
    for name in build.answer_names(question):
        original = env[name]
        replaced[name] = type(name, (original,), {"__init__": misbehave}) if isinstance(original, type) else misbehave
    return replaced


def run_tests(test_file: Path, env: dict):
    """Run one question's test file on ``env`` as otter does; returns otter's ExceptionTestFile."""
    from otter.test_files import ExceptionTestFile

    tests = ExceptionTestFile.from_file(str(test_file))
    tests.run(env)
    return tests


def _summary(tests) -> str:
    return "\n".join(f"{'PASS' if r.passed else 'FAIL'} {r.test_case.name} (hidden={r.test_case.hidden}): "
                     f"{(r.message or '').splitlines()[-1]}" for r in tests.test_case_results)


# ----------------------------------------------------------------------------- the comparison messages
@pytest.mark.parametrize("got, expected, words", [
    ("torch.zeros(2, 3)", "torch.zeros(2, 4)", ["expected shape (2, 4)", "got shape (2, 3)"]),
    ("torch.zeros(2, dtype=torch.float32)", "torch.zeros(2, dtype=torch.float64)", ["expected dtype torch.float64"]),
    ("torch.tensor([0.0, float('nan')])", "torch.zeros(2)", ["NaN or inf", "index (1,)"]),
    ("torch.tensor([True, True])", "torch.tensor([True, False])", ["1 of 2 entries differ", "index (1,)", "got True"]),
    ("torch.tensor([1.0, 2.5])", "torch.tensor([1.0, 2.0])", ["max abs error", "got 2.5", "expected 2"]),
    ("4950", "5050", ["expected 5050, got 4950 (off by -100)"]),
    ("{'a': torch.zeros(1)}", "{'a': torch.zeros(1), 'b': 1}", ["missing 'b'"]),
    ("None", "torch.zeros(3)", ["expected a tensor of shape (3,)", "got NoneType"]),
])
def test_compare_outputs_says_what_was_expected_and_what_came(got, expected, words):
    import torch

    from xfam_lib.grading import compare_outputs
    with pytest.raises(AssertionError) as info:
        compare_outputs(eval(got, {"torch": torch}), eval(expected, {"torch": torch}), where="out")
    assert str(info.value).startswith("out") and all(w in str(info.value) for w in words), str(info.value)


# ----------------------------------------------------------------------------- the master and the built folders
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_master_follows_the_grading_policy(chapter):
    """Public tests worth 0 and hidden tests judged in the oracle; canonical setup cell; no outputs."""
    master = build.master_path(chapter)
    questions = build.validate_master(master)
    assert 3 <= len(questions) <= 6, f"{chapter}: DESIGN.md asks for 3-6 graded questions, found {len(questions)}"
    nb = nbformat.read(master, as_version=4)
    assert nb.cells[0].source == build.setup_cell_source(chapter), "run exercises/build.py to refresh the setup cell"
    stored = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not stored, f"{master.name} is stored with outputs in cells {stored}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_committed_student_folder_is_up_to_date(chapter, built):
    committed = ROOT / "exercises" / chapter / "student"
    diffs = build.folder_differences(committed, built(chapter).student_dir)
    assert not diffs, f"exercises/{chapter}/student is stale ({diffs}); run `make exercises` and commit it"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_hidden_tests_and_solutions_stay_out_of_the_student_folder(chapter, built):
    b = built(chapter)
    student_text = "\n".join(p.read_text(encoding="utf-8") for p in b.student_dir.rglob("*") if p.is_file())
    assert not re.search(r"^\s*#\s*HIDDEN\b", student_text, flags=re.M | re.I), "a # HIDDEN test reached the students"
    assert "hidden=True" not in student_text, "a hidden test case reached the student tests"
    for q in QUESTIONS[chapter]:
        for test in q.tests:
            in_autograder = test.function in (b.autograder_dir / "tests" / f"{q.name}.py").read_text(encoding="utf-8")
            assert in_autograder, f"{test.function} is missing from the autograder tests"
            if test.hidden:
                assert test.function not in student_text, f"hidden test {test.function} leaked to the student folder"
        solution_lines = _solution_lines(q)
        leaked = [line for line in solution_lines if line in student_text]
        assert not leaked, f"{q.name}: solution lines in the student notebook: {leaked}"


def _solution_lines(question) -> list[str]:
    """Distinctive code lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` in the answer cells."""
    lines, inside = [], False
    for source in question.answers:
        for line in source.splitlines():
            stripped = line.strip()
            if stripped.startswith("# BEGIN SOLUTION"):
                inside = True
            elif stripped.startswith("# END SOLUTION"):
                inside = False
            elif inside and len(stripped) > 20 and not stripped.startswith("#"):
                lines.append(stripped)
    return lines


# ----------------------------------------------------------------------------- every question against good and bad answers
@pytest.mark.parametrize("chapter, question, variant", list(_variants()))
def test_question_grades_correctly(chapter, question, variant, built, monkeypatch):
    q = next(q for q in QUESTIONS[chapter] if q.name == question)
    test_file = built(chapter).autograder_dir / "tests" / f"{question}.py"
    env = namespace(chapter, "stub" if variant == "stub" else "solution", built)
    keyword = {"stub": "NotImplementedError", "exception": "RuntimeError", "endless_loop": "time limit"}.get(variant)
    if variant in ("exception", "endless_loop"):
        env.update(_generic(q, env, variant))
    elif variant not in ("solution", "stub"):
        replacements, keyword = wrong_answers(chapter).WRONG_ANSWERS[question][variant]
        assert set(replacements) <= set(build.answer_names(q)), f"{variant} replaces names the answer does not define"
        env.update(replacements)
    if variant == "endless_loop":
        import xfam_lib.grading
        monkeypatch.setattr(xfam_lib.grading, "DEFAULT_TIME_LIMIT", ENDLESS_LOOP_LIMIT)

    tests = run_tests(test_file, env)
    results = tests.test_case_results
    failures = [r.message for r in results if not r.passed]
    assert not any(sign in m for m in failures for sign in CRASH_SIGNS), _summary(tests)
    if variant == "solution":
        assert not failures and tests.score == tests.possible > 0, _summary(tests)
        return
    hidden = [r for r in results if r.test_case.hidden]
    assert hidden and not any(r.passed for r in hidden) and tests.score == 0, _summary(tests)
    assert all("] case " in r.message for r in hidden), _summary(tests)   # names the check and the case
    if variant in ("stub", "exception", "endless_loop"):
        assert not any(r.passed for r in results), _summary(tests)
        assert all(keyword in r.message for r in results), _summary(tests)
    else:
        assert any(keyword in r.message for r in hidden), f"no message mentions {keyword!r}:\n{_summary(tests)}"


# ----------------------------------------------------------------------------- tampering
TAMPER_KINDS = ("comparison functions", "tensor comparison operators")


def _tamper_patches(kind: str):
    """(object, attribute, replacement) triples of one kind of tampering with the checks."""
    import torch
    import torch.testing

    import xfam_lib.grading
    import xfam_lib.testing

    def shape_of(a, b):
        return torch.broadcast_shapes(a.shape, getattr(b, "shape", ()))

    if kind == "comparison functions":
        return [(torch, "allclose", lambda *a, **k: True), (torch, "equal", lambda *a, **k: True),
                (torch, "isclose", lambda a, b, *x, **k: torch.ones(shape_of(a, b), dtype=torch.bool)),
                (torch.testing, "assert_close", lambda *a, **k: None),
                (xfam_lib.testing, "assert_close", lambda *a, **k: None),
                (xfam_lib.grading, "compare_outputs", lambda *a, **k: None)]
    return [(torch.Tensor, "__eq__", lambda self, other: torch.ones(shape_of(self, other), dtype=torch.bool)),
            (torch.Tensor, "__ne__", lambda self, other: torch.zeros(shape_of(self, other), dtype=torch.bool)),
            (torch.Tensor, "__bool__", lambda self: True)]


def _tamper_driver(chapter: str, tests_dir: str) -> None:
    """Subprocess body: grade the TAMPER_BASE wrong answers under each kind of tampering; print JSON."""
    import torch

    env = namespace(chapter, "solution", built=None)
    module = wrong_answers(chapter)
    for q in QUESTIONS[chapter]:
        variants = module.WRONG_ANSWERS[q.name]
        env.update(variants.get(module.TAMPER_BASE, next(iter(variants.values())))[0])
    report = {}
    for kind in TAMPER_KINDS:
        patches = _tamper_patches(kind)
        originals = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        try:
            active = bool(torch.zeros(2) == torch.ones(2)) if kind != "comparison functions" \
                else torch.allclose(torch.zeros(2), torch.ones(2))
            per_question = {}
            for q in QUESTIONS[chapter]:
                tests = run_tests(Path(tests_dir) / f"{q.name}.py", env)
                first = next((r.message for r in tests.test_case_results if r.test_case.hidden and not r.passed), "")
                per_question[q.name] = {
                    "score": tests.score,
                    "public_passed": sum(r.passed for r in tests.test_case_results if not r.test_case.hidden),
                    "hidden_passed": sum(r.passed for r in tests.test_case_results if r.test_case.hidden),
                    "message": " ".join(first.splitlines()[-2:]),
                }
        finally:
            for obj, attr, value in originals:
                setattr(obj, attr, value)
        report[kind] = {"patches_active": active, "questions": per_question}
    print(json.dumps(report))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_tampering_with_the_checks_earns_nothing(chapter, built):
    b = built(chapter)
    proc = subprocess.run([sys.executable, __file__, "tamper", chapter, str(b.autograder_dir / "tests")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for kind, result in report.items():
        assert result["patches_active"], f"{kind}: the tampering did not take effect"
        for question, r in result["questions"].items():
            assert r["score"] == 0 and r["hidden_passed"] == 0, f"{kind}: {question} earned points: {r}"
        judged = [r for r in result["questions"].values() if "Note: this notebook replaced" in r["message"]]
        assert judged, f"{kind}: no hidden check reached the oracle and reported the tampering: {result}"


# ----------------------------------------------------------------------------- end to end with otter run
TAMPER_CELL = """\
# A tampering submission: make every comparison in this kernel succeed.
import torch, torch.testing, xfam_lib.testing, xfam_lib.grading
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
xfam_lib.testing.assert_close = lambda *args, **kwargs: None
xfam_lib.grading.compare_outputs = lambda *args, **kwargs: None
torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)
torch.Tensor.__ne__ = lambda self, other: torch.zeros_like(self, dtype=torch.bool)
"""


def tampering_notebook(chapter: str, student_nb: Path, out: Path) -> None:
    """The student notebook with its answers replaced by off-by-one answers and a tampering cell first."""
    nb = nbformat.read(student_nb, as_version=4)
    module_path = ROOT / "exercises" / chapter / "wrong_answers.py"
    module = wrong_answers(chapter)
    answer_cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    owners = [q for q in QUESTIONS[chapter] for _ in q.answers]
    assert len(answer_cells) == len(owners)
    seen = set()
    for cell, q in zip(answer_cells, owners):
        if q.name in seen:
            cell.source = "pass"
            continue
        seen.add(q.name)
        variants = module.WRONG_ANSWERS[q.name]
        variant = module.TAMPER_BASE if module.TAMPER_BASE in variants else next(iter(variants))
        names = list(variants[variant][0])
        cell.source = (
            "import importlib.util as _util\n"
            f"_spec = _util.spec_from_file_location('wrong_answers', {str(module_path)!r})\n"
            "_wrong = _util.module_from_spec(_spec)\n_spec.loader.exec_module(_wrong)\n"
            f"{', '.join(names)}, = (_wrong.WRONG_ANSWERS[{q.name!r}][{variant!r}][0][n] for n in {names!r})"
        )
    nb.cells.insert(2, nbformat.v4.new_code_cell(TAMPER_CELL))
    nbformat.write(nb, out)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_grading_end_to_end(chapter, built, tmp_path):
    """grade.py with otter run: master full marks; stub, tampering and broken files 0, without crashing."""
    b = built(chapter)
    subs = tmp_path / "submissions"
    subs.mkdir()
    (subs / "master_solution.ipynb").write_bytes(build.master_path(chapter).read_bytes())
    (subs / "student_untouched.ipynb").write_bytes((b.student_dir / f"{chapter}_exercises.ipynb").read_bytes())
    (subs / "not_a_notebook.ipynb").write_text("{ this is not json", encoding="utf-8")
    if wrong_answers(chapter):
        tampering_notebook(chapter, b.student_dir / f"{chapter}_exercises.ipynb", subs / "tampering.ipynb")
    out = tmp_path / f"grades_{chapter}.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "exercises" / "grade.py"), chapter, str(subs), "--out", str(out),
                           "--autograder", str(b.zip_path), "--jobs", "2", "--timeout", "600", "--cell-timeout", "120"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {row["file"]: row for row in csv.DictReader(out.open(encoding="utf-8"))}
    questions = [q.name for q in QUESTIONS[chapter]]
    assert list(next(iter(rows.values()))) == ["file", *questions, "total", "message"]
    possible = sum(sum(q.points) for q in QUESTIONS[chapter])
    master = rows["master_solution.ipynb"]
    assert float(master["total"]) == possible and not master["message"], master
    student = rows["student_untouched.ipynb"]
    assert float(student["total"]) == 0 and "NotImplementedError" in student["message"], student
    broken = rows["not_a_notebook.ipynb"]
    assert float(broken["total"]) == 0 and "not a valid notebook" in broken["message"], broken
    if "tampering.ipynb" in rows:
        tamper = rows["tampering.ipynb"]
        assert float(tamper["total"]) == 0, tamper
        review = tamper["message"].split("review: the code replaced ")[-1]
        assert "torch.allclose" in review and "in the grading kernel" in review, tamper


if __name__ == "__main__" and sys.argv[1:2] == ["tamper"]:
    _tamper_driver(*sys.argv[2:4])
