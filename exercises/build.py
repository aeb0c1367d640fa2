"""Build the graded exercises: student notebooks (committed) and autograder zips (never committed).

For every master notebook ``exercises/chNN/chNN_exercises.ipynb`` this runs ``otter assign`` and
writes

* ``exercises/chNN/student/``: the student notebook and its **public** tests (committed, so
  that Colab can open the notebook straight from GitHub);
* ``_build/exercises/chNN/autograder/chNN_exercises-autograder.zip``: the autograder with the
  public **and hidden** tests. It is self-sufficient: ``otter_config.json`` names the grading
  plugin `xfam_grading.OtterJudge` with this chapter's off-limits names, the zip carries the
  ``xfam_lib`` and ``xfam_grading`` wheels of this checkout, and ``environment.yml`` /
  ``requirements.txt`` pin CPU torch, those wheels and otter-grader, so ``otter grade`` and Gradescope build it unchanged.

Before assigning, it checks the master's grading policy (`validate_master`), makes its first
cell the canonical setup cell (`setup_cell_source`) and gives it Colab's GPU metadata. After
assigning, the judge collects every test once (`xfam_grading.Judge`), which proves that each
check builds its cases and its reference. In the student notebook otter's unpinned
``%pip install otter-grader`` cell is dropped (the setup cell installs the pinned one and
``xfam_lib`` at the book's release, and fetches the public tests of that release), otter's init
cell uses `xfam_grading.otter_notebook` (failure messages without otter's traceback
header, the off-limits scan; its ``tests/grading.json`` says what to scan), links to the
chapter point where students read it (`chapter_url`: the published book at ``html: baseurl:`` of
`_config.yml` once it is set, until then the chapter on GitHub at the release tag), and each
question links to its section of the chapter (`question_sections`).

Usage: ``python exercises/build.py [ch01 ...]`` (default: every chapter). ``make exercises`` runs it.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "exercises"
BUILD = ROOT / "_build" / "exercises"
OTTER_PIP_CELL = "%pip install -q otter-grader"
OTTER_INIT_PREFIX = "# Initialize Otter"
INIT_SOURCE = f"{OTTER_INIT_PREFIX}\nfrom xfam_grading import otter_notebook\ngrader = otter_notebook()"
OTTER_CHECK_ALL_TEXT = "To double-check your work, the cell below will rerun all of the autograder tests."
CHECK_ALL_TEXT = ("To double-check your work, the cell below re-runs every **public** test of this notebook. The "
                  "hidden tests, which give the points, run only when your instructor grades.")
SETUP_TAG = "hide-cell"
COLAB_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}
PLUGIN = "xfam_grading.OtterJudge"
TORCH_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
WHEEL_DEPENDENCIES = ("torch", "numpy", "matplotlib", "ipywidgets", "tqdm", "gymnasium")  # pyproject's, pinned from the lock
CONFIG_FILE = "grading.json"      # xfam_grading.otter_plugin.CONFIG_FILE: the scan grader.check runs
VOLATILE = {".OTTER_LOG", "__pycache__", ".ipynb_checkpoints"}   # made by running a notebook, never generated


# ----------------------------------------------------------------------------- chapters, release, setup cell
def chapters() -> list[str]:
    """Chapter names (``ch01``, ...) that have a master notebook ``exercises/chNN/chNN_exercises.ipynb``."""
    return sorted(p.parent.name for p in EXERCISES.glob("ch[0-9][0-9]/ch[0-9][0-9]_exercises.ipynb")
                  if p.name == f"{p.parent.name}_exercises.ipynb")


def master_path(chapter: str) -> Path:
    return EXERCISES / chapter / f"{chapter}_exercises.ipynb"


def autograder_zip(chapter: str, build_dir: Path = BUILD) -> Path:
    return build_dir / chapter / "autograder" / f"{chapter}_exercises-autograder.zip"


def _setup_cell_module():
    """scripts/setup_cell.py (the chapters' setup cell and the `_config.yml` repository values)."""
    name = "xfam_setup_cell"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "setup_cell.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def repository_url() -> str:
    return _setup_cell_module().repository_url()


def release() -> str:
    """The tag the book is built from (``repository: release:`` in `_config.yml`)."""
    return _setup_cell_module().release()


def _pin(package: str, path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.match(rf"{re.escape(package)}==", line.strip(), flags=re.I):
            return line.split("#")[0].strip()
    raise SystemExit(f"{path.name} does not pin {package}")


def otter_requirement() -> str:
    """The pinned ``otter-grader==X`` line of requirements-grading.txt."""
    return _pin("otter-grader", ROOT / "requirements-grading.txt")


# What grader.check needs besides what Colab ships (its runtime of 2026-08-19 has otter's other
# requirements, some at other versions, which the check API does not mind): installed with --no-deps,
# so that nothing Colab ships is replaced. Measured by importing otter and running Notebook.check in a
# venv of Colab's versions.
CHECK_ONLY = ("fica", "ipylab", "python-frontmatter")


def check_requirements() -> list[str]:
    """The pinned packages the exercise notebooks install on Colab for ``grader.check``."""
    lock = ROOT / "requirements-lock.txt"
    return [otter_requirement(), *(_pin(p, lock) for p in CHECK_ONLY)]


def setup_cell_source(chapter: str) -> str:
    """The first cell of a chapter's exercise notebooks.

    The chapters' canonical setup cell (scripts/setup_cell.py, which installs ``xfam_lib`` at the
    release), then on Colab the pinned otter-grader and the few packages its check API needs that Colab
    lacks (`check_requirements`) with the grading package (``xfam_grading``, from the repository's
    ``exercises`` folder at the release), all without their dependencies, so nothing Colab ships is
    replaced (one line says what was installed), then, on Colab only, a
    sparse shallow clone of the repository at the release that copies just
    ``exercises/<chapter>/student/tests`` to ``./tests`` (otter looks there).
    """
    tests = f"exercises/{chapter}/student/tests"
    pins = ",\n            ".join(f'"{pin}"' for pin in check_requirements())
    grading = (
        "\n"
        "if \"google.colab\" in sys.modules:  # grader.check, replacing nothing Colab ships\n"
        "    from importlib import metadata\n"
        "\n"
        "    def missing(pin):\n"
        "        try:\n"
        "            return metadata.version(pin.split(\"==\")[0]) != pin.split(\"==\")[1]\n"
        "        except metadata.PackageNotFoundError:\n"
        "            return True\n"
        "\n"
        f"    pins = [{pins}]\n"
        "    added = [pin for pin in pins if missing(pin)]\n"
        "    grading = f\"xfam_grading @ git+{URL}@{RELEASE}#subdirectory=exercises\"\n"
        "    pip = subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"-q\", \"--no-deps\",\n"
        "                          *added, grading], capture_output=True, text=True)\n"
        "    if pip.returncode:\n"
        "        print(pip.stderr[-3000:], file=sys.stderr)\n"
        "        raise RuntimeError(\"Installing the checks failed (pip's message is above): \"\n"
        "                           \"run this cell again.\")\n"
        "    if added:\n"
        "        print(\"installed for grader.check, without their dependencies (nothing of \"\n"
        "              f\"Colab's replaced): {', '.join(added)}\")"
    )
    fetch = (
        "\n"
        "import os\n"
        "if \"google.colab\" in sys.modules and not os.path.isdir(\"tests\"):\n"
        "    # Colab: fetch this chapter's public tests (and nothing else) at the book's release\n"
        "    import shutil, tempfile\n"
        f"    repo, tests = tempfile.mkdtemp(), \"{tests}\"\n"
        "    for cmd in ([\"git\", \"clone\", \"--quiet\", \"--depth\", \"1\", \"--branch\", RELEASE,\n"
        "                 \"--filter=blob:none\", \"--sparse\", URL, repo],\n"
        "                [\"git\", \"-C\", repo, \"sparse-checkout\", \"set\", tests]):\n"
        "        git = subprocess.run(cmd, capture_output=True, text=True)\n"
        "        if git.returncode:\n"
        "            print(git.stderr, file=sys.stderr)\n"
        "            raise RuntimeError(f\"Fetching the public tests of {RELEASE} failed (git's \"\n"
        "                               \"message is above): run this cell again.\")\n"
        "    shutil.copytree(os.path.join(repo, tests), \"tests\")"
    )
    return _setup_cell_module().setup_cell_source() + grading + fetch


def book_url() -> str:
    """The book's published HTML address: ``html: baseurl:`` of `_config.yml` ('' until the book is published)."""
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    block = re.search(r"^html:\s*\n((?:[ \t]+.*\n?)+)", text, flags=re.M)
    match = block and re.search(r"^\s+baseurl:\s*[\"']?([^\s\"'#]*)", block.group(1), flags=re.M)
    return match.group(1).rstrip("/") if match else ""


def github_anchor(title: str) -> str:
    """The anchor GitHub gives a Markdown heading (github-slugger): lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"\$([^$]*)\$", r"\1", title.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def chapter_url(notebook: str, title: str = "") -> str:
    """Where a student reads a chapter (and its section titled ``title``): the published book
    (`book_url`, anchors as the book build makes them) once ``html: baseurl:`` is set, until then the
    chapter notebook on GitHub at the release tag (anchors as GitHub makes them)."""
    if book_url():
        page = f"{book_url()}/chapters/{Path(notebook).stem}.html"
        anchor = _sphinx_anchor(title) if title else ""
    else:
        page = f"{repository_url()}/blob/{release()}/chapters/{notebook}"
        anchor = github_anchor(title) if title else ""
    return f"{page}#{anchor}" if anchor else page


def _sphinx_anchor(title: str) -> str:
    from docutils.nodes import fully_normalize_name, make_id

    return make_id(fully_normalize_name(title))


_METHOD = r"M\d+\.\d+"


def chapter_sections(notebook: str) -> list[tuple[int, str, str, str]]:
    """``(level, title, anchor, comments)`` of every heading of a chapter notebook: anchors as the book build
    makes them; ``comments``: the ``<!-- M8.9 -->`` comments of the heading's cell below it."""
    nb = nbformat.read(ROOT / "chapters" / notebook, as_version=4)
    sections, fence = [], False
    for cell in (c for c in nb.cells if c.cell_type == "markdown"):
        current = None
        for line in cell.source.splitlines():
            fence = fence != line.lstrip().startswith(("```", "~~~"))
            heading = re.match(r"(#{1,6})\s+(.+?)\s*$", line)
            if heading and not fence:
                title = heading.group(2)
                sections.append([len(heading.group(1)), title, _sphinx_anchor(title), ""])
                current = sections[-1]
            elif current is not None and "<!--" in line:
                current[3] += " " + line
    return [tuple(section) for section in sections]


def question_sections(notebook: str, prompt: str) -> list[tuple[str, str]]:
    """``(shown title, heading)`` of the chapter sections a question points at: those its comment names
    (``<!-- M10.2 section 10.7 10.8 -->``), else the one of `question_section`."""
    comment = re.search(r"<!--(.*?)-->", prompt, flags=re.S)
    named = re.search(r"\bsections?\s+((?:\d+\.\d+[\s,]*)+)", comment.group(1)) if comment else None
    if named:
        wanted = re.findall(r"\d+\.\d+", named.group(1))
        found = [(title, title) for _, title, _, _ in chapter_sections(notebook)
                 for number in wanted if title.startswith(number + " ")]
        if len(found) != len(wanted):
            raise ValueError(f"{notebook} has no section {', '.join(wanted)} (a question's comment names it)")
        return [(_shown(title), title) for title, _ in found]
    best = question_section(notebook, prompt)
    return [best] if best else []


def _shown(title: str) -> str:
    """A heading without its trailing ``(M7.5, M7.6)`` markers."""
    return re.sub(rf"\s*\({_METHOD}[^)]*\)\s*$", "", title)


def question_section(notebook: str, prompt: str) -> tuple[str, str] | None:
    """``(shown title, heading)`` of the chapter section a question's METHODS markers (``<!-- M8.8 M8.9 -->``)
    point at.

    Below the chapter's title: the heading whose title names the most markers; on a tie, the one
    naming the question's later marker, then the deepest, then the one whose comments name the most
    markers and the fewest others (the most specific), then the first.
    """
    comment = re.search(r"<!--(.*?)-->", prompt, flags=re.S)
    markers = re.findall(_METHOD, comment.group(1)) if comment else []

    def named(text: str) -> list[int]:
        return [i for i, m in enumerate(markers) if re.search(rf"{re.escape(m)}(?![\d.])", text)]

    best = None
    for index, (level, title, anchor, comments) in enumerate(chapter_sections(notebook)):
        in_title, in_comments = named(title), named(comments)
        if level > 1 and (in_title or in_comments):
            others = len(re.findall(_METHOD, title + comments))
            key = (len(in_title), max(in_title + in_comments), level, len(in_comments), -others, -index)
            if best is None or key > best[0]:
                best = (key, title)
    if best is None:
        return None
    return _shown(best[1]), best[1]


def fix_master(master: Path, chapter: str) -> bool:
    """Make the master's first cell the canonical setup cell and give it Colab's GPU metadata; True if changed."""
    nb = nbformat.read(master, as_version=4)
    source = setup_cell_source(chapter)
    first = nb.cells[0] if nb.cells else None
    changed = False
    if not (first is not None and first.cell_type == "code" and first.source == source
            and SETUP_TAG in first.metadata.get("tags", [])):
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": [SETUP_TAG]})
        if first is not None and first.cell_type == "code" and ("google.colab" in first.source
                                                                 or first.source.startswith("# Setup")):
            cell["id"] = first.get("id", cell["id"])
            nb.cells[0] = cell
        else:
            nb.cells.insert(0, cell)
        changed = True
    if any(nb.metadata.get(k) != v for k, v in COLAB_METADATA.items()):
        nb.metadata.update(COLAB_METADATA)
        changed = True
    if changed:
        nbformat.write(nb, master)
    return changed


# ----------------------------------------------------------------------------- reading a master notebook
@dataclass
class TestCell:
    source: str
    hidden: bool
    function: str
    params: list[str]


@dataclass
class Question:
    name: str
    points: object
    off_limits: list[str] = field(default_factory=list)
    prompt: str = ""                                      # the question's Markdown cells
    answers: list[str] = field(default_factory=list)      # code cells of the solution blocks
    tests: list[TestCell] = field(default_factory=list)

    @property
    def group(self) -> str:
        """The numbered question a part belongs to: ``q1a`` -> ``q1``."""
        return re.match(r"q\d+", self.name).group(0)


def _marker(cell) -> str | None:
    """'begin question', 'end tests', ... for an otter raw boundary cell, else None."""
    if cell.cell_type != "raw" or not cell.source.strip():
        return None
    first = cell.source.strip().splitlines()[0]
    match = re.match(r"#\s+(begin|end)\s+(question|solution|tests|prompt)\b", first, flags=re.I)
    return f"{match.group(1).lower()} {match.group(2).lower()}" if match else None


def parse_master(master: Path) -> list[Question]:
    """The questions (one per otter question, i.e. per graded part) of a master notebook."""
    import ast

    import yaml

    nb = nbformat.read(master, as_version=4)
    questions: list[Question] = []
    block: list[str] = []
    for cell in nb.cells:
        marker = _marker(cell)
        if marker == "begin question":
            config = yaml.safe_load("\n".join(cell.source.splitlines()[1:])) or {}
            questions.append(Question(config["name"], config.get("points"), list(config.get("off_limits") or [])))
            block = ["question"]
        elif marker and marker.startswith("begin"):
            block.append(marker.split()[1])
        elif marker and marker.startswith("end"):
            block.pop()
        elif cell.cell_type == "markdown" and block == ["question"]:
            questions[-1].prompt += cell.source + "\n"
        elif cell.cell_type == "code" and block[-1:] == ["solution"]:
            questions[-1].answers.append(cell.source)
        elif cell.cell_type == "code" and block[-1:] == ["tests"]:
            first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
            functions = [n for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef)]
            questions[-1].tests.append(TestCell(cell.source, bool(re.match(r"#\s*hidden\b", first, flags=re.I)),
                                                functions[0].name if functions else "",
                                                [a.arg for a in functions[0].args.args] if functions else []))
    return questions


def program_cells(notebook, chapter: str) -> list[str]:
    """The code cells that make up a notebook's answers, in order: no setup, otter or test cells."""
    from xfam_grading import notebook_code_cells

    nb = notebook if isinstance(notebook, nbformat.NotebookNode) else nbformat.read(notebook, as_version=4)
    setup = setup_cell_source(chapter)
    return [c for c in notebook_code_cells(nb) if c != setup]


def answer_names(question: Question) -> list[str]:
    """Top-level functions and classes the answer cells define (what the tests receive)."""
    import ast

    names = []
    for source in question.answers:
        names += [n.name for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    return names


def validate_master(master: Path) -> list[Question]:
    """Check the grading policy of a master notebook; raise ``ValueError`` listing every problem.

    Every question (one per graded part, named ``q1``, ``q1a``, ...) has a points list with one
    entry per test cell; public tests are worth 0 (they run in the student's kernel and only give
    feedback); hidden tests are worth > 0; every test calls ``check_cases`` and takes only names
    its own part's answer defines (so a stub in another part cannot cost it points); test function
    names are unique; every ``off_limits`` name imports and is named in the question's text.
    """
    from xfam_grading.guard import resolve_live

    problems, seen, names = [], set(), set()
    questions = parse_master(master)
    if not questions:
        problems.append("no questions")
    for q in questions:
        if not re.fullmatch(r"q\d+[a-z]?", q.name) or q.name in names:
            problems.append(f"{q.name}: question names are q1, q2, ... or q1a, q1b, ... and unique")
        names.add(q.name)
        if not q.answers:
            problems.append(f"{q.name}: no answer cell between BEGIN SOLUTION and END SOLUTION")
        if not any(t.hidden for t in q.tests) or not any(not t.hidden for t in q.tests):
            problems.append(f"{q.name}: needs at least one public and one hidden test cell")
        defined = set(answer_names(q))
        for name in q.off_limits:
            try:
                resolve_live(name)
            except Exception as exc:
                problems.append(f"{q.name}: off_limits name {name} does not import ({type(exc).__name__})")
            parts = name.split(".")
            if not any(f"`{'.'.join(parts[i:])}`" in q.prompt for i in range(len(parts))):
                problems.append(f"{q.name}: the question's text does not name its off-limits {name}")
        if not isinstance(q.points, list) or len(q.points) != len(q.tests):
            problems.append(f"{q.name}: points must be a list with one value per test cell "
                            f"({len(q.tests)} cells), got {q.points!r}")
            continue
        for test, pts in zip(q.tests, q.points):
            if not test.function:
                problems.append(f"{q.name}: a test cell defines no test function")
                continue
            if test.function in seen:
                problems.append(f"{q.name}: test function {test.function} is defined twice")
            seen.add(test.function)
            if test.hidden and not pts > 0:
                problems.append(f"{q.name}: hidden test {test.function} must be worth > 0 points, got {pts}")
            if not test.hidden and pts != 0:
                problems.append(f"{q.name}: public test {test.function} must be worth 0 points, got {pts}")
            if "check_cases(" not in test.source:
                problems.append(f"{q.name}: test {test.function} must judge with check_cases")
            if not set(test.params) <= defined:
                problems.append(f"{q.name}: test {test.function} takes {sorted(set(test.params) - defined)}, which "
                                f"this part's answer does not define")
    if problems:
        raise ValueError(f"{master}: " + "; ".join(problems))
    return questions


def judge_config(chapter: str, questions: list[Question], library: list[str] = ()) -> dict:
    """The grading plugin's configuration in the autograder's ``otter_config.json``.

    ``library``: the ``xfam_lib`` names the student notebook imports, which a submission may use
    (with the modules every notebook may use, `xfam_grading.scanner.LIBRARY_ALWAYS`). Each part's
    ``off_limits`` are the master's names; ``implied_off_limits`` closes them under the library's own
    calls (`xfam_grading.guard.implied_off_limits`: every library function or class that calls one of
    them, except the names the notebook was given). Each part is graded on its own: ``answers`` names
    what each part's answer defines and ``references`` holds the master's answer cells of each part,
    which the judge hands to the runner once that part's checks have run, so that a later part that
    calls it (ch03 q1b calling q1a's ``qk_variance``) is checked with the reference, not with the
    student's (`xfam_grading.runner.References`). Neither goes into the student's ``grading.json``.
    """
    from xfam_grading.guard import implied_off_limits

    off_limits = {q.name: q.off_limits for q in questions if q.off_limits}
    return {"chapter": chapter, "release": release(), "setup_cell": setup_cell_source(chapter),
            "off_limits": off_limits, "implied_off_limits": implied_off_limits(off_limits, list(library)),
            "library": list(library), "answers": {q.name: answer_names(q) for q in questions},
            "references": {q.name: "\n\n".join(q.answers) for q in questions}}


HIDDEN_CONFIG = ("answers", "references")     # judge_config keys only the autograder holds (the master's answers)


# ----------------------------------------------------------------------------- the student notebook
def _cell_ids(nb) -> None:
    """Deterministic cell ids (a hash of type and source; repeats get a suffix), so rebuilds do not churn."""
    seen: dict[str, int] = {}
    for cell in nb.cells:
        digest = hashlib.sha1(f"{cell.cell_type}\0{cell.source}".encode()).hexdigest()[:8]
        seen[digest] = seen.get(digest, 0) + 1
        cell["id"] = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"


def _student_notebook(path: Path, setup_source: str):
    """otter's student notebook, finished: setup cell first, our init cell, honest texts, release links."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if not (c.cell_type == "code" and c.source.strip() == OTTER_PIP_CELL)]
    setup = [c for c in cells if c.cell_type == "code" and c.source == setup_source]
    if len(setup) != 1:
        raise RuntimeError(f"{path}: expected the setup cell once in the student notebook, found {len(setup)}")
    cells = setup + [c for c in cells if c is not setup[0]]
    if not cells[1].source.startswith(OTTER_INIT_PREFIX):
        raise RuntimeError(f"{path}: otter's init cell should follow the setup cell")
    cells[1].source = INIT_SOURCE
    chapter = next((m.group(1) for c in cells if c.cell_type == "markdown"
                    for m in [re.search(r"\]\(\.\./\.\./chapters/([\w.-]+\.ipynb)\)", c.source)] if m), None)
    for cell in cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        elif cell.cell_type == "markdown":
            cell.source = cell.source.replace(OTTER_CHECK_ALL_TEXT, CHECK_ALL_TEXT)
            cell.source = re.sub(r"\]\(\.\./\.\./chapters/([\w.-]+\.ipynb)\)",
                                 lambda m: f"]({chapter_url(m.group(1))})", cell.source)
            sections = question_sections(chapter, cell.source) if chapter and cell.source.startswith("## Question") \
                else []
            if sections:
                cell.source = cell.source.rstrip("\n") + "\n\nIn the chapter: " + "; ".join(
                    f"[{shown}]({chapter_url(chapter, heading)})" for shown, heading in sections)
    nb.cells = cells
    nb.metadata.pop("jupytext", None)
    nb.metadata.update(COLAB_METADATA)
    _cell_ids(nb)
    return nb


# ----------------------------------------------------------------------------- the autograder zip
_WHEELS: dict[str, Path] = {}


def _wheel(package: str, project: Path) -> Path:
    """A wheel of this checkout's ``package`` (``project``: the folder with its pyproject.toml and the package),
    built once per source state, outside the repository."""
    files = sorted((project / package).glob("*.py")) + [project / "pyproject.toml"]
    digest = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()[:12]
    if digest not in _WHEELS:
        out = Path(tempfile.mkdtemp(prefix="xfam_wheel_"))
        with tempfile.TemporaryDirectory(prefix="xfam_wheel_src_") as tmp:
            src = Path(tmp)
            shutil.copytree(project / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
            for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-TEXT"):
                if (project / name).exists():
                    shutil.copy2(project / name, src / name)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "--wheel-dir", str(out), str(src)], check=True, capture_output=True)
        wheels = list(out.glob(f"{package}-*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"pip wheel made {len(wheels)} {package} wheels")
        _WHEELS[digest] = wheels[0]
    return _WHEELS[digest]


def xfam_lib_wheel() -> Path:
    """A wheel of this checkout's ``xfam_lib``."""
    return _wheel("xfam_lib", ROOT)


def grading_wheel() -> Path:
    """A wheel of this checkout's ``xfam_grading`` (exercises/pyproject.toml)."""
    return _wheel("xfam_grading", EXERCISES)


def grading_requirements(folder: str, triton: bool = False) -> list[str]:
    """The autograder's Python packages: otter with its grading extras (a kernel), CPU torch and xfam_lib's
    other dependencies pinned from the lock file, Triton (pinned too) when ``triton`` (a notebook that
    writes Triton kernels, graded in Triton's CPU interpreter), and the xfam_lib and xfam_grading wheels
    (in ``folder``)."""
    lock = ROOT / "requirements-lock.txt"
    otter = otter_requirement().replace("otter-grader==", "otter-grader[grading]==")
    wheels = [f"{folder}/{w.name}" for w in (xfam_lib_wheel(), grading_wheel())]
    kernels = [_pin("triton", lock)] if triton else []
    return [TORCH_INDEX, otter, *(_pin(p, lock) for p in WHEEL_DEPENDENCIES), *kernels, *wheels]


def imports_triton(cells: list[str]) -> bool:
    """Whether any of these code cells imports ``triton`` (then the autograder installs it)."""
    import ast

    for source in cells:
        for node in ast.walk(ast.parse(source)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] == "triton" for name in names):
                return True
    return False


def _finish_zip(zip_path: Path, autograder_dir: Path, config: dict, triton: bool = False) -> None:
    """Add the plugin, the pinned requirements and the xfam_lib and xfam_grading wheels to otter's autograder zip."""
    import yaml

    with zipfile.ZipFile(zip_path) as zf:
        files = {name: zf.read(name) for name in zf.namelist()}
    otter_config = json.loads(files["otter_config.json"])
    otter_config["plugins"] = [{PLUGIN: config}]
    files["otter_config.json"] = json.dumps(otter_config, indent=2).encode()
    (autograder_dir / "otter_config.json").write_bytes(files["otter_config.json"])
    environment = yaml.safe_load(files["environment.yml"])
    pip = next(d for d in environment["dependencies"] if isinstance(d, dict) and "pip" in d)
    pip["pip"] = [r for r in pip["pip"] if r.startswith("otter-grader")] + \
        [r for r in grading_requirements("/autograder/source", triton) if not r.startswith("otter-grader")]
    files["environment.yml"] = yaml.safe_dump(environment, sort_keys=False).encode()
    files["requirements.txt"] = ("# What environment.yml installs (otter grade and Gradescope build from that file).\n"
                                 "# For a plain venv, run pip in the unzipped folder: pip install -r requirements.txt\n"
                                 + "\n".join(grading_requirements(".", triton)) + "\n").encode()
    for wheel in (xfam_lib_wheel(), grading_wheel()):
        files[wheel.name] = wheel.read_bytes()
    tmp = zip_path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    tmp.replace(zip_path)


# ----------------------------------------------------------------------------- building
@dataclass
class Built:
    chapter: str
    student_dir: Path           # student notebook + tests/ (public tests only)
    autograder_dir: Path        # otter's autograder folder: solutions notebook + tests/ (all tests)
    zip_path: Path              # the autograder zip
    seconds: float


def assign(chapter: str, out_dir: Path, master: Path | None = None) -> Built:
    """Run ``otter assign`` on a chapter's master into ``out_dir``, finish the outputs, collect every check.

    ``out_dir/student`` and ``out_dir/autograder`` are otter's output folders; nothing in the
    repository is touched.
    """
    from otter.assign import main as otter_assign

    from xfam_grading import Judge
    from xfam_grading.scanner import library_imports

    master = master or master_path(chapter)
    questions = validate_master(master)
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
    cells = program_cells(student_nb, chapter)
    config = judge_config(chapter, questions, library_imports(cells))
    _finish_zip(zip_path, out_dir / "autograder", config, imports_triton(cells))
    student_config = {k: v for k, v in config.items() if k not in HIDDEN_CONFIG}   # for grader.check's off-limits scan
    student_config["parts"] = [q.name for q in questions]
    (out_dir / "student" / "tests" / CONFIG_FILE).write_text(json.dumps(student_config, indent=1) + "\n",
                                                              encoding="utf-8")
    Judge(out_dir / "autograder" / "tests", config, isolation="basic")   # every check builds its cases and reference
    return Built(chapter, out_dir / "student", out_dir / "autograder", zip_path, time.perf_counter() - start)


def build(chapter: str, *, write_student: bool = True, build_dir: Path = BUILD) -> Built:
    """Fix the master, assign, and install the outputs in the repository and ``build_dir``."""
    master = master_path(chapter)
    if fix_master(master, chapter):
        print(f"  updated the setup cell or metadata of {master.relative_to(ROOT)}")
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
    meta = {k: v for k, v in nb.get("metadata", {}).items() if k in ("kernelspec", "otter", *COLAB_METADATA)}
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
        print(f"{chapter}: otter assign and checks {built.seconds:.1f} s; student notebook and {len(public)} public "
              f"test files in {built.student_dir.relative_to(ROOT)}; autograder {built.zip_path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
