"""Grade a folder of submitted notebooks with the judge into a CSV.

    python exercises/grade.py ch01 path/to/submissions --out grades_ch01.csv --jobs 2

Every ``*.ipynb`` in the folder is graded against the chapter's autograder zip
(``_build/exercises/chNN/autograder/``, built first if missing) by `xfam_grading.Judge`,
the same judge the zip's otter plugin runs under ``otter grade`` and on Gradescope:

* the judge (this process) reads the hidden tests and computes every case's inputs and expected
  outputs once, before any submission runs;
* each submission runs in its own sandboxed runner process (limits on memory, CPU time,
  processes, file size and time; no network; a file system built from an allowlist: Python, the
  grading environment's packages, xfam_lib and xfam_grading, read-only, a fresh /proc and a
  private /tmp; an unprivileged uid that owns nothing when graded as root), which gets only the
  inputs and returns only the outputs; ``--jobs`` runners run at once;
* a file that is not a notebook, a crash, ``os._exit``, a fork or memory bomb, a timeout, a
  forged message or any error while grading it costs only that submission's points, with a
  message; the run never stops, and the CSV has a row for every file.

The CSV has one row per file: ``file``; one column per graded part, headed with its possible
points (``q1a (max 2)``), holding the points earned or ``not attempted`` (the answer cell still
raises the stub's ``NotImplementedError``); ``total`` and ``max`` (possible points); ``flags``
(code to review: patching torch or otter, starting processes, reading frames, writing files,
...; a second line of defence, never a score); one ``q1a why`` column per part (why it lost
points: the off-limits names it used beside its own failing checks); and ``message`` (what
stopped grading: not a notebook, a crash, a timeout).
Each submission's full report (it shows the hidden cases and their expected values: read it before passing it on) goes to ``--feedback`` (default
``_build/exercises/CHAPTER/feedback/<file>.txt``).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import shutil
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


def ensure_autograder(chapter: str) -> Path:
    """The chapter's autograder zip, built (without touching the repository) if missing."""
    zip_path = build.autograder_zip(chapter)
    if not zip_path.exists():
        with tempfile.TemporaryDirectory(prefix=f"xfam_{chapter}_") as tmp:
            built = build.assign(chapter, Path(tmp) / "out")
            zip_path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built.zip_path, zip_path)
    return zip_path


def _fmt(points: float) -> str:
    return str(int(points)) if float(points).is_integer() else f"{points:.3g}"


NOT_ATTEMPTED = "not attempted"
_WHY_LIMIT = 2000            # characters of one part's reason in the CSV (the feedback file has it all)


def columns(parts: dict[str, float]) -> list[str]:
    """The CSV header: ``file``, one column per part with its possible points, ``total``, ``max``,
    ``flags``, one reason column per part, ``message``."""
    return ["file", *(f"{q} (max {_fmt(p)})" for q, p in parts.items()), "total", "max", "flags",
            *(f"{q} why" for q in parts), "message"]


def csv_row(name: str, report) -> dict:
    """One CSV row: points per part ("not attempted" for an untouched stub), total, possible points,
    review flags, why each part lost points (its off-limits names beside its own failing checks) and
    the errors that stopped grading."""
    row = {"file": name}
    for q, r in report.questions.items():
        row[f"{q} (max {_fmt(r.possible)})"] = _fmt(r.score) if r.attempted or report.errors else NOT_ATTEMPTED
    row.update({"total": _fmt(report.total), "max": _fmt(report.possible), "flags": " | ".join(report.flags)})
    for q, r in report.questions.items():
        why = "" if r.score == r.possible else r.message() if r.attempted else \
            f"{NOT_ATTEMPTED}: the answer still raises the stub's NotImplementedError"
        row[f"{q} why"] = why if len(why) <= _WHY_LIMIT else why[:_WHY_LIMIT] + " [... cut; the feedback file has it all]"
    row["message"] = " | ".join(report.errors)
    return row


def _copy(path: Path):
    """The notebook at ``path``, parsed in memory, so no submission graded earlier can change it; the path
    itself when it does not parse (the judge then says why)."""
    import nbformat

    try:
        return nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    except Exception:
        return path


def grade_folder(chapter: str, folder: Path, out_csv: Path, *, autograder: Path | None = None, jobs: int = 1,
                 limits=None, isolation: str = "auto", feedback: Path | None = None, verbose: bool = True) -> list[dict]:
    """Grade every ``*.ipynb`` in ``folder``, write ``out_csv`` and the feedback files; returns the rows."""
    from xfam_grading import Judge

    zip_path = autograder.resolve() if autograder else ensure_autograder(chapter)
    start = time.perf_counter()
    judge = Judge.from_autograder(zip_path, limits=limits, isolation=isolation,
                                  hide=[str(ROOT / "exercises"), str(ROOT / "_build")])
    if verbose:
        print(f"{chapter}: {len(judge.tasks)} checks collected in {time.perf_counter() - start:.1f} s; "
              f"sandbox: {judge.isolation}")
    notebooks = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    feedback = feedback or build.BUILD / chapter / "feedback"
    feedback.mkdir(parents=True, exist_ok=True)
    parts = {q: sum(t.points for t in tests) for q, tests in judge.questions.items()}
    possible = _fmt(sum(parts.values()))
    rows = {}
    copies = {nb: _copy(nb) for nb in notebooks}          # read before any submission runs
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(judge.grade, copies[nb]): nb for nb in notebooks}
        for future in concurrent.futures.as_completed(futures):
            nb = futures[future]
            try:
                report = future.result()
                rows[nb.name] = csv_row(nb.name, report)
                (feedback / f"{nb.stem}.txt").write_text(report.summary() + "\n", encoding="utf-8")
            except Exception as exc:           # one submission never costs the others their grades
                rows[nb.name] = {"file": nb.name, **{f"{q} (max {_fmt(p)})": "0" for q, p in parts.items()},
                                 "total": "0", "max": possible, "flags": "",
                                 "message": f"grading failed: {type(exc).__name__}: {str(exc)[:200]}"}
                continue
            if verbose:
                message = rows[nb.name]["message"] or " | ".join(
                    f"{q}: {rows[nb.name][f'{q} why']}" for q in parts if rows[nb.name].get(f"{q} why"))
                print(f"{nb.name}: {rows[nb.name]['total']}/{possible} in {report.seconds:.1f} s"
                      + (f" — {message[:150]}" if message else "")
                      + (" [flagged for review]" if report.flags else ""))
    rows = [rows[nb.name] for nb in notebooks]
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with out_csv.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns(parts), restval="")
        writer.writeheader()
        writer.writerows(rows)
    if verbose:
        print(f"graded {len(rows)} notebooks in {time.perf_counter() - start:.1f} s with {jobs} jobs")
    return rows


def main(argv: list[str] | None = None) -> int:
    from xfam_grading import Limits

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chapter", help="e.g. ch01")
    parser.add_argument("submissions", type=Path, help="folder holding the submitted .ipynb files")
    parser.add_argument("--out", type=Path, help="CSV to write (default grades_CHAPTER.csv)")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel")
    parser.add_argument("--timeout", type=float, default=Limits.wall_seconds, help="seconds per submission")
    parser.add_argument("--cell-timeout", type=float, default=Limits.cell_seconds, help="seconds per notebook cell")
    parser.add_argument("--call-timeout", type=float, default=Limits.call_seconds,
                        help="seconds per call of the student's code in a check")
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_bytes // 2 ** 20,
                        help="address space per process of a submission, MiB")
    parser.add_argument("--isolation", choices=["auto", "root", "userns", "basic"], default="auto",
                        help="sandbox (auto: namespaces where available; basic: rlimits only, must be asked for)")
    parser.add_argument("--autograder", type=Path, help="autograder zip to use instead of _build/exercises/CHAPTER/")
    parser.add_argument("--feedback", type=Path, help="folder for one feedback file per submission "
                                                      "(default _build/exercises/CHAPTER/feedback)")
    args = parser.parse_args(argv)
    if args.chapter not in build.chapters():
        parser.error(f"unknown chapter {args.chapter!r}; have {', '.join(build.chapters())}")
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder")
    limits = Limits(wall_seconds=args.timeout, cell_seconds=args.cell_timeout, call_seconds=args.call_timeout,
                    memory_bytes=args.memory_mb * 2 ** 20)
    out = args.out or Path(f"grades_{args.chapter}.csv")
    rows = grade_folder(args.chapter, args.submissions, out, autograder=args.autograder, jobs=args.jobs,
                        limits=limits, isolation=args.isolation, feedback=args.feedback)
    print(f"wrote {out} ({len(rows)} submissions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
