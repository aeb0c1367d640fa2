"""Build the graded exercises: student notebooks (committed) and autograder zips (never committed).

For every master notebook ``exercises/chNN/chNN_exercises.ipynb`` this runs ``otter assign`` and
writes

* ``exercises/chNN/student/``: the student notebook and its **public** tests (committed, so
  that Colab can open the notebook straight from GitHub);
* ``_build/exercises/chNN/autograder/chNN_exercises-autograder.zip``: the autograder with the
  public **and hidden** tests, for ``exercises/grade.py`` and ``otter run``.

Before assigning, it checks the master's grading policy (`validate_master`) and makes its first
cell the canonical setup cell (`setup_cell_source`). In the student notebook otter's unpinned
``%pip install otter-grader`` cell is dropped: the setup cell installs the pinned otter-grader
and ``xfam_lib`` on Colab and fetches that chapter's public tests from the repository.

Usage: ``python exercises/build.py [ch01 ...]`` (default: every chapter). ``make exercises`` runs it.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "exercises"
BUILD = ROOT / "_build" / "exercises"
OTTER_PIP_CELL = "%pip install -q otter-grader"
OTTER_INIT_PREFIX = "# Initialize Otter"
SETUP_TAG = "hide-cell"
VOLATILE = {".OTTER_LOG", "__pycache__", ".ipynb_checkpoints"}   # made by running a notebook, never generated


# ----------------------------------------------------------------------------- chapters and the setup cell
def chapters() -> list[str]:
    """Chapter names (``ch01``, ...) that have a master notebook ``exercises/chNN/chNN_exercises.ipynb``."""
    return sorted(p.parent.name for p in EXERCISES.glob("ch[0-9][0-9]/ch[0-9][0-9]_exercises.ipynb")
                  if p.name == f"{p.parent.name}_exercises.ipynb")


def master_path(chapter: str) -> Path:
    return EXERCISES / chapter / f"{chapter}_exercises.ipynb"


def autograder_zip(chapter: str, build_dir: Path = BUILD) -> Path:
    return build_dir / chapter / "autograder" / f"{chapter}_exercises-autograder.zip"


def _config_value(key: str) -> str:
    """``repository: <key>:`` from ``_config.yml`` (a regex, like scripts/setup_cell.py)."""
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    block = re.search(r"^repository:\s*\n((?:[ \t]+.*\n?)+)", text, flags=re.M)
    match = block and re.search(rf"^\s+{key}:\s*(\S+)", block.group(1), flags=re.M)
    if not match:
        raise SystemExit(f"_config.yml has no repository: {key}:")
    return match.group(1)


def otter_requirement() -> str:
    """The pinned ``otter-grader==X`` line of requirements-grading.txt."""
    for line in (ROOT / "requirements-grading.txt").read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("otter-grader=="):
            return line.split("#")[0].strip()
    raise SystemExit("requirements-grading.txt does not pin otter-grader")


def setup_cell_source(chapter: str) -> str:
    """The first cell of a chapter's exercise notebooks.

    The chapters' canonical setup cell (scripts/setup_cell.py) with the pinned otter-grader added
    to its Colab install line, then, on Colab only, a sparse shallow clone of the repository
    that copies just ``exercises/<chapter>/student/tests`` to ``./tests`` (otter looks there).
    """
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from setup_cell import setup_cell_source as chapter_setup_cell
    finally:
        sys.path.pop(0)
    tests = f"exercises/{chapter}/student/tests"
    fetch = (
        "\n"
        "import os\n"
        "if \"google.colab\" in sys.modules and not os.path.isdir(\"tests\"):\n"
        "    # Colab: fetch this chapter's public tests (and nothing else) from the book's repository\n"
        "    import shutil, subprocess, tempfile\n"
        "    repo = tempfile.mkdtemp()\n"
        f"    subprocess.run([\"git\", \"clone\", \"--quiet\", \"--depth\", \"1\", \"--branch\", \"{_config_value('branch')}\",\n"
        f"                    \"--filter=blob:none\", \"--sparse\", \"{_config_value('url')}\", repo], check=True)\n"
        f"    subprocess.run([\"git\", \"-C\", repo, \"sparse-checkout\", \"set\", \"{tests}\"], check=True)\n"
        f"    shutil.copytree(os.path.join(repo, \"{tests}\"), \"tests\")"
    )
    return chapter_setup_cell(extra_pip=f'"{otter_requirement()}"') + fetch


def fix_setup_cell(master: Path, chapter: str) -> bool:
    """Make the master's first cell the canonical setup cell; True if the file changed."""
    nb = nbformat.read(master, as_version=4)
    source = setup_cell_source(chapter)
    first = nb.cells[0] if nb.cells else None
    if first is not None and first.cell_type == "code" and first.source == source \
            and SETUP_TAG in first.metadata.get("tags", []):
        return False
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [SETUP_TAG]})
    if first is not None and first.cell_type == "code" and ("google.colab" in first.source
                                                             or first.source.startswith("# setup cell")):
        cell["id"] = first.get("id", cell["id"])
        nb.cells[0] = cell
    else:
        nb.cells.insert(0, cell)
    nbformat.write(nb, master)
    return True


# ----------------------------------------------------------------------------- reading a master notebook
@dataclass
class TestCell:
    source: str
    hidden: bool
    function: str


@dataclass
class Question:
    name: str
    points: object
    answers: list[str] = field(default_factory=list)     # code cells of the solution blocks
    tests: list[TestCell] = field(default_factory=list)


def _marker(cell) -> str | None:
    """'begin question', 'end tests', ... for an otter raw boundary cell, else None."""
    if cell.cell_type != "raw" or not cell.source.strip():
        return None
    first = cell.source.strip().splitlines()[0]
    match = re.match(r"#\s+(begin|end)\s+(question|solution|tests|prompt)\b", first, flags=re.I)
    return f"{match.group(1).lower()} {match.group(2).lower()}" if match else None


def parse_master(master: Path) -> list[Question]:
    """The questions of a master notebook: name, points, answer cells and test cells."""
    import yaml
    import ast

    nb = nbformat.read(master, as_version=4)
    questions: list[Question] = []
    block: list[str] = []
    for cell in nb.cells:
        marker = _marker(cell)
        if marker == "begin question":
            config = yaml.safe_load("\n".join(cell.source.splitlines()[1:])) or {}
            questions.append(Question(config["name"], config.get("points")))
            block = ["question"]
        elif marker and marker.startswith("begin"):
            block.append(marker.split()[1])
        elif marker and marker.startswith("end"):
            block.pop()
        elif cell.cell_type == "code" and block[-1:] == ["solution"]:
            questions[-1].answers.append(cell.source)
        elif cell.cell_type == "code" and block[-1:] == ["tests"]:
            first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
            functions = [n.name for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef)]
            questions[-1].tests.append(TestCell(cell.source, bool(re.match(r"#\s*hidden\b", first, flags=re.I)),
                                                functions[0] if functions else ""))
    return questions


def program_cells(notebook, chapter: str) -> list[str]:
    """The code cells that make up a notebook's answers, in order: no setup, otter or test cells.

    ``notebook`` is a path or a notebook object. Works for a master (test blocks skipped) and for
    a student or submitted notebook (otter's init and ``grader.check`` cells skipped).
    """
    nb = notebook if isinstance(notebook, nbformat.NotebookNode) else nbformat.read(notebook, as_version=4)
    setup, cells, block = setup_cell_source(chapter), [], []
    for cell in nb.cells:
        marker = _marker(cell)
        if marker:
            block = block + [marker.split()[1]] if marker.startswith("begin") else block[:-1]
        elif (cell.cell_type == "code" and block[-1:] != ["tests"] and cell.source != setup
              and not cell.source.startswith(OTTER_INIT_PREFIX)
              and not re.fullmatch(r"\s*grader\.check(_all)?\([^)]*\)\s*", cell.source)):
            cells.append(cell.source)
    return cells


def answer_names(question: Question) -> list[str]:
    """Top-level functions and classes the answer cells define (what the tests receive)."""
    import ast

    names = []
    for source in question.answers:
        names += [n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return names


def validate_master(master: Path) -> list[Question]:
    """Check the grading policy of a master notebook; raise ``ValueError`` listing every problem.

    Every question has a points list with one entry per test cell; public tests are worth 0
    (they run in the student's kernel and can be fooled); hidden tests are worth > 0 and judge
    through ``check_cases`` in the isolated oracle; test function names are unique.
    """
    problems, seen = [], set()
    questions = parse_master(master)
    if not questions:
        problems.append("no questions")
    for q in questions:
        if not q.answers:
            problems.append(f"{q.name}: no answer cell between BEGIN SOLUTION and END SOLUTION")
        if not any(t.hidden for t in q.tests) or not any(not t.hidden for t in q.tests):
            problems.append(f"{q.name}: needs at least one public and one hidden test cell")
        if not isinstance(q.points, list) or len(q.points) != len(q.tests):
            problems.append(f"{q.name}: points must be a list with one value per test cell "
                            f"({len(q.tests)} cells), got {q.points!r}")
            continue
        for test, pts in zip(q.tests, q.points):
            if not test.function:
                problems.append(f"{q.name}: a test cell defines no test function")
            elif test.function in seen:
                problems.append(f"{q.name}: test function {test.function} is defined twice")
            seen.add(test.function)
            if test.hidden and not pts > 0:
                problems.append(f"{q.name}: hidden test {test.function} must be worth > 0 points, got {pts}")
            if not test.hidden and pts != 0:
                problems.append(f"{q.name}: public test {test.function} must be worth 0 points, got {pts}")
            if test.hidden and ("check_cases(" not in test.source or "isolated=False" in test.source):
                problems.append(f"{q.name}: hidden test {test.function} must judge with check_cases (isolated)")
    if problems:
        raise ValueError(f"{master}: " + "; ".join(problems))
    return questions


# ----------------------------------------------------------------------------- building
def _cell_ids(nb) -> None:
    """Deterministic cell ids (a hash of type and source; repeats get a suffix), so rebuilds do not churn."""
    seen: dict[str, int] = {}
    for cell in nb.cells:
        digest = hashlib.sha1(f"{cell.cell_type}\0{cell.source}".encode()).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell["id"] = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"


def _student_notebook(path: Path, setup_source: str):
    """otter's student notebook with the pip cell dropped, setup cell first, no outputs, stable ids."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if not (c.cell_type == "code" and c.source.strip() == OTTER_PIP_CELL)]
    setup = [c for c in cells if c.cell_type == "code" and c.source == setup_source]
    if len(setup) != 1:
        raise RuntimeError(f"{path}: expected the setup cell once in the student notebook, found {len(setup)}")
    cells = setup + [c for c in cells if c is not setup[0]]
    if not cells[1].source.startswith(OTTER_INIT_PREFIX):
        raise RuntimeError(f"{path}: otter's init cell should follow the setup cell")
    for cell in cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells = cells
    nb.metadata.pop("jupytext", None)
    _cell_ids(nb)
    return nb


@dataclass
class Built:
    chapter: str
    student_dir: Path           # student notebook + tests/ (public tests only)
    autograder_dir: Path        # otter's autograder folder: solutions notebook + tests/ (all tests)
    zip_path: Path              # the autograder zip
    seconds: float


def assign(chapter: str, out_dir: Path, master: Path | None = None) -> Built:
    """Run ``otter assign`` on a chapter's master into ``out_dir``; post-process the student notebook.

    ``out_dir/student`` and ``out_dir/autograder`` are otter's output folders; nothing in the
    repository is touched.
    """
    from otter.assign import main as otter_assign

    master = master or master_path(chapter)
    validate_master(master)
    setup_source = setup_cell_source(chapter)
    first = nbformat.read(master, as_version=4).cells[0]
    if first.source != setup_source:
        raise ValueError(f"{master}: the first cell is not the canonical setup cell; run exercises/build.py")
    start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        otter_assign(str(master), str(out_dir), no_pdfs=True, no_run_tests=True)
    student_nb = out_dir / "student" / master.name
    nbformat.write(_student_notebook(student_nb, setup_source), student_nb)
    zips = sorted((out_dir / "autograder").glob("*-autograder_*.zip"))
    if len(zips) != 1:
        raise RuntimeError(f"otter assign made {len(zips)} autograder zips in {out_dir / 'autograder'}")
    zip_path = zips[0].rename(out_dir / "autograder" / f"{chapter}_exercises-autograder.zip")
    return Built(chapter, out_dir / "student", out_dir / "autograder", zip_path, time.perf_counter() - start)


def build(chapter: str, *, write_student: bool = True, build_dir: Path = BUILD) -> Built:
    """Fix the master's setup cell, assign, and install the outputs in the repository and ``build_dir``."""
    master = master_path(chapter)
    if fix_setup_cell(master, chapter):
        print(f"  updated the setup cell of {master.relative_to(ROOT)}")
    with tempfile.TemporaryDirectory(prefix=f"xfam_{chapter}_") as tmp:
        built = assign(chapter, Path(tmp) / "out", master)
        zip_target = autograder_zip(chapter, build_dir)
        shutil.rmtree(zip_target.parent, ignore_errors=True)
        zip_target.parent.mkdir(parents=True)
        shutil.copy2(built.zip_path, zip_target)
        student = EXERCISES / chapter / "student"
        if write_student:
            shutil.rmtree(student, ignore_errors=True)
            shutil.copytree(built.student_dir, student)
    return Built(chapter, student, zip_target.parent, zip_target, built.seconds)


# ----------------------------------------------------------------------------- comparing generated folders
def normalized_notebook(path: Path) -> dict:
    """A notebook's content without volatile parts (outputs, counts, ids, non-essential metadata)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = []
    for cell in nb["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        meta = {k: v for k, v in cell.get("metadata", {}).items() if k in ("tags", "editable", "deletable", "otter")}
        cells.append({"cell_type": cell["cell_type"], "source": source, "metadata": meta})
    meta = {k: v for k, v in nb.get("metadata", {}).items() if k in ("kernelspec", "otter")}
    return {"cells": cells, "metadata": meta}


def folder_differences(committed: Path, fresh: Path) -> list[str]:
    """Files that differ between two generated student folders (notebooks compared normalised)."""
    def files(base: Path) -> set[str]:
        return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file() and p.name not in VOLATILE
                and not VOLATILE.intersection(p.parts)}

    have, want = files(committed), files(fresh)
    diffs = [f"missing {f}" for f in sorted(want - have)] + [f"unexpected {f}" for f in sorted(have - want)]
    for name in sorted(have & want):
        a, b = committed / name, fresh / name
        same = (normalized_notebook(a) == normalized_notebook(b)) if name.endswith(".ipynb") \
            else a.read_bytes() == b.read_bytes()
        if not same:
            diffs.append(f"differs {name}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="chapters to build (default: all)")
    args = parser.parse_args(argv)
    wanted = args.chapters or chapters()
    unknown = sorted(set(wanted) - set(chapters()))
    if unknown:
        parser.error(f"no master notebook for {', '.join(unknown)}; have {', '.join(chapters()) or 'none'}")
    for chapter in wanted:
        built = build(chapter)
        public = sorted(p.name for p in (built.student_dir / "tests").glob("*.py"))
        print(f"{chapter}: otter assign {built.seconds:.1f} s; student notebook and {len(public)} public test "
              f"files in {built.student_dir.relative_to(ROOT)}; autograder {built.zip_path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
