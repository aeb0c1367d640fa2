"""Grade a folder of submitted notebooks with ``otter run`` (no Docker) into a CSV.

    python exercises/grade.py ch01 path/to/submissions --out grades_ch01.csv

Every ``*.ipynb`` in the folder is graded against the chapter's autograder zip
(``_build/exercises/chNN/autograder/``, built first if missing), each in its own worker process:

* a cell that runs longer than ``--cell-timeout`` seconds is interrupted and grading goes on
  with the next cell (inside the tests, `xfam_lib.grading` also stops every call of student code
  after its own time limit, so an endless loop costs only the question it is in);
* a worker that exceeds ``--timeout`` seconds is killed with its kernel;
* a file that is not a valid notebook, a crash of the kernel or of otter, or a timeout gives
  zeros and a message instead of stopping the run.

The CSV has one row per file: ``file``, one column per question (points), ``total`` and
``message``: why points were lost, plus a ``review:`` note when the code contains patterns that
tamper with the grader (see `tamper_flags`), so an instructor can look at it.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_build():
    """exercises/build.py, imported under a name that cannot clash with the PyPI package ``build``."""
    import importlib.util

    name = "xfam_exercises_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name("build.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


build = _load_build()

# Code patterns that change the grader rather than solve an exercise; flagged for a human to read.
TAMPER_PATTERNS = {
    "replaces a torch comparison function": r"\btorch\.(allclose|isclose|equal|eq|all|any|testing\.\w+)\s*=(?!=)",
    "replaces a tensor method": r"\b(torch\.)?Tensor\.\w+\s*=(?!=)",
    "replaces an attribute with setattr": r"\bsetattr\s*\(\s*(torch|xfam_lib|otter|builtins)\b",
    "touches the grading helpers": r"\b(xfam_lib\.grading|check_cases|compare_outputs|assert_close)\s*=(?!=)|"
                                   r"\bgrading\.\w+\s*=(?!=)",
    "touches otter's internals": r"\botter\.(test_files|execute|run|check)\b|\bGradingResults\b|\bChecker\b",
    "uses subprocess, signals or os-level process control": r"\bsubprocess\b|\bsignal\.|\bos\.(kill|fork|_exit|system)\b",
    "edits modules or builtins": r"\bsys\.modules\b|\bbuiltins\b|__builtins__|__code__|\bimportlib\b",
    "writes to the tests folder": r"""open\([^)]*tests[/\\]|shutil\.\w+\([^)]*tests""",
}


def tamper_flags(nb, chapter: str) -> list[str]:
    """Descriptions of `TAMPER_PATTERNS` found in the student's code cells (otter's own cells skipped)."""
    code = "\n".join(build.program_cells(nb, chapter))
    return [what for what, pattern in TAMPER_PATTERNS.items() if re.search(pattern, code)]


def question_points(zip_path: Path) -> dict[str, float]:
    """Question name -> points possible, read from the autograder zip's test files."""
    import zipfile

    from otter.test_files import ExceptionTestFile

    points = {}
    with zipfile.ZipFile(zip_path) as zf:
        for name in sorted(n for n in zf.namelist() if re.fullmatch(r"tests/[^/]+\.py", n)):
            test_file = ExceptionTestFile.from_string(zf.read(name).decode(), path=name)
            points[test_file.name] = test_file.possible
    return dict(sorted(points.items(), key=lambda kv: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", kv[0])]))


def ensure_autograder(chapter: str) -> Path:
    """The chapter's autograder zip, built (without touching the repository) if missing."""
    zip_path = build.autograder_zip(chapter)
    if not zip_path.exists():
        with tempfile.TemporaryDirectory(prefix=f"xfam_{chapter}_") as tmp:
            built = build.assign(chapter, Path(tmp) / "out")
            zip_path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built.zip_path, zip_path)
    return zip_path


# ----------------------------------------------------------------------------- one submission (worker process)
def _failure_text(message: str) -> str:
    """The exception line(s) of an otter test-case failure message, on one line."""
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Timeout)\b:?", line):
            text = " ".join(lines[i:])
            return text[len("AssertionError: "):] if text.startswith("AssertionError: ") else text
    return " ".join(lines[-2:])


def grade_one(zip_path: Path, notebook: Path, chapter: str, cell_timeout: int) -> dict:
    """Grade one notebook in this process; returns {"scores": {q: points}, "messages": [...], "flags": [...]}."""
    import nbformat

    try:
        nb = nbformat.read(notebook, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:
        return {"error": f"not a valid notebook: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    flags = tamper_flags(nb, chapter)

    import nbconvert.preprocessors
    from traitlets import Bool, Integer, Unicode

    class LimitedExecutePreprocessor(nbconvert.preprocessors.ExecutePreprocessor):
        """otter's executor with a per-cell time limit (then interrupt and go on) and our own kernel."""
        timeout = Integer(cell_timeout, allow_none=True).tag(config=True)
        interrupt_on_timeout = Bool(True).tag(config=True)
        kernel_name = Unicode("python3").tag(config=True)

    nbconvert.preprocessors.ExecutePreprocessor = LimitedExecutePreprocessor   # otter imports it at call time
    from otter.run import main as otter_run

    with tempfile.TemporaryDirectory(prefix="xfam_grade_") as tmp:
        submission = Path(tmp) / "submission.ipynb"          # a plain name; otter copies it again
        shutil.copy2(notebook, submission)
        results = otter_run(str(submission), autograder=str(zip_path), output_dir=None, no_logo=True)
    if results.catastrophic_error is not None:
        return {"error": f"grading failed: {results.catastrophic_error}", "flags": flags}
    scores, messages, replaced = {}, [], set()
    for name, test_file in results.results.items():
        scores[name] = test_file.score
        failed = [r for r in test_file.test_case_results if not r.passed and r.test_case.hidden]
        if failed:
            text = _failure_text(failed[0].message)
            note = re.search(r"\s*\(Note: this notebook replaced (.*?); the hidden checks.*?\)", text)
            if note:
                replaced.update(note.group(1).split(", "))
                text = text[:note.start()] + text[note.end():]
            messages.append(f"{name}: {text}"[:300])
    if replaced:
        flags.insert(0, "replaced " + ", ".join(sorted(replaced)) + " in the grading kernel")
    return {"scores": scores, "messages": messages, "flags": flags}


def _worker_main(argv: list[str]) -> int:
    zip_path, notebook, chapter, cell_timeout, out = argv
    try:
        result = grade_one(Path(zip_path), Path(notebook), chapter, int(cell_timeout))
    except Exception as exc:                                  # otter or the kernel failed
        result = {"error": f"grading crashed: {type(exc).__name__}: {str(exc)[:300]}"}
    Path(out).write_text(json.dumps(result), encoding="utf-8")
    return 0


# ----------------------------------------------------------------------------- the grading run
def grade_file(zip_path: Path, notebook: Path, chapter: str, *, timeout: float, cell_timeout: int) -> dict:
    """Grade one notebook in a fresh worker process (own session, killed with its kernel on timeout)."""
    with tempfile.TemporaryDirectory(prefix="xfam_worker_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(zip_path), str(notebook.resolve()),
               chapter, str(cell_timeout), str(out)]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, cwd=tmp)
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)              # the worker's own session: it and its children
            proc.communicate()
            return {"error": f"grading timed out after {timeout:g} s (killed)", "seconds": time.perf_counter() - start}
        result = json.loads(out.read_text(encoding="utf-8")) if out.exists() else \
            {"error": f"grading worker died (exit code {proc.returncode}): {' '.join(log.split()[-40:])}"}
        result["seconds"] = time.perf_counter() - start
        return result


def _fmt(points: float) -> str:
    return str(int(points)) if float(points).is_integer() else f"{points:.3g}"


def grade_folder(chapter: str, folder: Path, out_csv: Path, *, autograder: Path | None = None,
                 timeout: float = 900, cell_timeout: int = 120, jobs: int = 1, verbose: bool = True) -> list[dict]:
    """Grade every ``*.ipynb`` in ``folder`` and write ``out_csv``; returns the rows.

    ``autograder`` overrides the chapter's zip in ``_build/`` (which is built if missing).
    """
    zip_path = autograder.resolve() if autograder else ensure_autograder(chapter)
    possible = question_points(zip_path)
    notebooks = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda nb: grade_file(zip_path, nb, chapter, timeout=timeout,
                                                      cell_timeout=cell_timeout), notebooks))
    rows = []
    for nb, res in zip(notebooks, results):
        scores = res.get("scores", {})
        row = {"file": nb.name}
        row.update({q: _fmt(scores.get(q, 0)) for q in possible})
        row["total"] = _fmt(sum(scores.get(q, 0) for q in possible))
        notes = ([res["error"]] if "error" in res else []) + res.get("messages", [])
        if res.get("flags"):
            notes.append("review: the code " + "; ".join(res["flags"]))
        row["message"] = " | ".join(notes)
        rows.append(row)
        if verbose:
            print(f"{nb.name}: {row['total']}/{_fmt(sum(possible.values()))} in {res['seconds']:.1f} s"
                  + (f" — {row['message'][:160]}" if row["message"] else ""))
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with out_csv.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["file", *possible, "total", "message"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapter", help="e.g. ch01")
    parser.add_argument("submissions", type=Path, help="folder holding the submitted .ipynb files")
    parser.add_argument("--out", type=Path, help="CSV to write (default grades_CHAPTER.csv)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per submission before it is killed")
    parser.add_argument("--cell-timeout", type=int, default=120, help="seconds per notebook cell before it is interrupted")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel")
    parser.add_argument("--autograder", type=Path, help="autograder zip to use instead of _build/exercises/CHAPTER/")
    args = parser.parse_args(argv)
    if args.chapter not in build.chapters():
        parser.error(f"unknown chapter {args.chapter!r}; have {', '.join(build.chapters())}")
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder")
    out = args.out or Path(f"grades_{args.chapter}.csv")
    rows = grade_folder(args.chapter, args.submissions, out, autograder=args.autograder, timeout=args.timeout,
                        cell_timeout=args.cell_timeout, jobs=args.jobs)
    print(f"wrote {out} ({len(rows)} submissions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
