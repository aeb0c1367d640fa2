"""The judge: collects every check of an autograder, runs a submission in a runner, scores it."""
from __future__ import annotations

import copy
import json
import os
import re
import tempfile
import textwrap
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .channel import message_problem
from .checks import (Task, TestSpec, _Collector, _collecting, _format_failures, _judge_case, _natural, _one_thread,
                     _Placeholder, load_test_file, missing_name_message)
from .guard import _Guard, allowed_homes, config_off_limits, expand_off_limits, off_limits_resolver
from .runner import References, _reset_torch_state, run_tasks
from .sandbox import Limits, _Runner, isolation_available
from .scanner import NOT_ALLOWED, _cell_title, _to_python, allowlist, notebook_cell_parts, scan_cells

PLUGIN_NAME = "xfam_grading.OtterJudge"

# ============================================================================= the static scan
def scan_notebook(cells: list[str], parts: list[str | None] | None, config: dict, questions: list[str],
                  entries: dict | None = None) -> tuple[dict[str, list[str]], list[str]]:
    """Off-limits uses per question, and review flags, from a notebook's code alone.

    ``parts`` names the graded part each cell belongs to (`notebook_cell_parts`; None: no
    part). An off-limits name costs the part whose cell holds it, if that part lists it; in a
    cell of no part it costs every part that lists it; a part that calls a name it lists from
    another cell is caught when its checks run (the tripwires). A name off the allowlist
    (`allowlist`: the standard library, the grading environment's packages, the library names
    the notebook was given) has no tripwire and may answer any part, so it costs every part.
    ``config``: the judge's (``off_limits``, ``library``, ``setup_cell``).
    """
    entries = expand_off_limits(config_off_limits(config)) if entries is None else entries
    setup = config.get("setup_cell")
    parts = list(parts) if parts is not None else [None] * len(cells)
    allowed, resolve = allowlist(config.get("library", ())), off_limits_resolver(entries)
    named = {id(obj) for obj, _ in expand_off_limits(config.get("off_limits", {})).values()}
    implied = {d for d, (obj, _) in entries.items() if id(obj) not in named}    # only implied, by no part named

    def resolve_static(dotted: str) -> list[str]:
        """A name only implied off limits and off the allowlist answers to the allowlist's rule (every part)."""
        hits = resolve(dotted)
        return [] if hits and all(h in implied for h in hits) and allowed(dotted) else hits

    reached, flags = scan_cells(cells, resolve_static, skip=[_to_python(setup)] if setup else [], allowed=allowed)
    violations: dict[str, list[str]] = {}
    for entry, where, cell in reached:
        part = parts[cell] if cell < len(parts) else None
        if entry == NOT_ALLOWED:
            hit, text = list(questions), f"uses a name off the allowlist: {where}"
        elif part is None:
            hit, text = entries[entry][1], f"uses {entry} {where}"
            if len(hit) > 1:
                text += f", a cell of no part, so it costs every part that lists it ({', '.join(hit)})"
        else:
            hit, text = [q for q in entries[entry][1] if q == part], f"uses {entry} {where}"
        for question in hit:
            violations.setdefault(question, [])
            if text not in violations[question]:
                violations[question].append(text)
    for found in violations.values():          # the off-limits names a part used first, then the allowlist's
        found.sort(key=lambda text: text.startswith("uses a name off the allowlist"))
    return violations, flags


# ============================================================================= the judge
@dataclass
class TestResult:
    name: str
    hidden: bool
    points: float
    passed: bool
    message: str = ""                 # every failing case, with its parameters and values (instructors)
    brief: str = ""                   # what failed, without a hidden case or value (safe for students)


_RAISED_IN = re.compile(r"raised (\w+)[^\n]*? \(in ([\w.<>]+), line \d+ of its cell\)")


@dataclass
class QuestionResult:
    name: str
    tests: list[TestResult]
    violations: list[str] = field(default_factory=list)
    own: list[str] = field(default_factory=list)        # the names this part's answer defines

    @property
    def possible(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def score(self) -> float:
        return 0.0 if self.violations else sum(t.points for t in self.tests if t.passed)

    @property
    def attempted(self) -> bool:
        """False when every check fails only because this part's own answer still raises the stub's
        NotImplementedError (not a stub of another part that it calls)."""
        def own_stub(message: str) -> bool:
            raised = _RAISED_IN.findall(message)
            if raised:
                return all(kind == "NotImplementedError" and where.split(".")[0] in self.own for kind, where in raised)
            return "raised NotImplementedError" in message

        return not all(not t.passed and own_stub(t.message) for t in self.tests)

    def off_limits_message(self) -> str:
        """One sentence naming the off-limits names this part used and the rule ('' when none)."""
        if not self.violations:
            return ""
        return (f"{self.name} scores 0 under the off-limits rule ({self.name} asks you to write this yourself, "
                f"without these library names): " + "; ".join(self.violations))

    def message(self) -> str:
        """Why points were lost, safe to return to the student: the off-limits names used, beside what each
        failing hidden test found (its checks and how many of their cases fail; no case, no value)."""
        failing = " | ".join(t.brief or t.message for t in self.tests if t.hidden and not t.passed)
        if self.violations:
            return self.off_limits_message() + (f". Its checks: {failing}" if failing else ". Its checks pass.")
        return failing


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
                lines.append("  " + q.off_limits_message())
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
        self.off_limits: dict[str, list[str]] = config_off_limits(self.config)
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
        # each part graded on its own: the names every part's answer defines, and its reference answer
        self.answers: dict[str, list[str]] = {q: list(self.config.get("answers", {}).get(q) or self._own_names(q))
                                              for q in self.questions}
        self.references: dict[str, str] = dict(self.config.get("references", {}))
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
    def scan(self, cells: list[str], parts: list[str | None] | None = None) -> tuple[dict[str, list[str]], list[str]]:
        """Off-limits uses per question, and review flags, from the code alone (see `scan_notebook`)."""
        return scan_notebook(cells, parts, self.config, list(self.questions), self.entries)

    # ---- grading
    def grade(self, notebook: Path | str | dict) -> Report:
        """Run one submitted notebook in a sandboxed runner and score it; never raises.

        Whatever goes wrong while grading one submission (a forged message, a comparison that
        breaks) costs only that submission, with the error in its report.
        """
        start = time.perf_counter()
        try:
            report = self._grade(notebook)
        except Exception as exc:               # contained: the other submissions keep their grades
            report = self._score({}, {}, [f"grading failed: {type(exc).__name__}: {str(exc)[:200]}"])
            report.isolation = self.isolation
        report.seconds = time.perf_counter() - start
        return report

    def _grade(self, notebook: Path | str | dict) -> Report:
        import nbformat

        try:
            nb = notebook if isinstance(notebook, dict) else nbformat.read(str(notebook), as_version=4)
            nbformat.validate(nb)
        except Exception as exc:
            return self._score({}, {}, [f"not a valid notebook: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"])
        cells, parts = [], []
        for source, part in notebook_cell_parts(nb):
            cells.append(_to_python(source))
            parts.append(part)
        static, flags = self.scan(cells, parts)
        request = {"cells": cells, "tasks": [t.spec(self.limits.call_seconds) for t in self.tasks],
                   "off_limits": self.off_limits, "library": list(self.config.get("library", [])),
                   "cell_seconds": self.limits.cell_seconds}
        if self.references:                    # each part graded on its own (`runner.References`)
            request.update(parts=list(self.questions), answers=self.answers)
        waiting = {q: {t.id for t in self.tasks if t.question == q} for q in list(self.questions)[:-1]}
        slot = self._take_slot()
        results, errors, cell_errors, tail = {}, [], {}, ""
        try:
            uid = 2_000_000 + (os.getpid() % 100_000) * 64 + slot
            runner = _Runner(request, self.limits, self.isolation, uid, self.hide)
            current, stage = None, "starting"
            try:
                for message in runner.messages():
                    problem = message_problem(message, len(cells), self.tasks, set(results))
                    if problem:
                        raise ValueError(f"the notebook's process sent {problem}; its other messages were ignored")
                    kind = message["kind"]
                    if kind == "cell":
                        current, stage = message["index"], "cell"
                    elif kind == "cell error":
                        cell_errors[message["index"]] = message["error"][:300]
                    elif kind == "tasks":
                        current, stage = 0, "checks"      # from here `current` counts checks, not cells
                    elif kind == "flags":
                        flags += [f for f in message["flags"] if f not in flags and len(flags) < 60]
                    elif kind == "task":
                        results[message["id"]] = message
                        current = message["id"] + 1
                        part = self.tasks[message["id"]].question
                        if self.references and part in waiting:
                            waiting[part].discard(message["id"])
                            if not waiting[part]:      # every result of this part is in: now its reference
                                del waiting[part]
                                runner.send({"part": part, "source": self.references.get(part, "")})
                    elif kind == "done":
                        stage = "done"
            except TimeoutError:
                errors.append(f"grading stopped after {self.limits.wall_seconds:g} s "
                              f"({self._where(stage, current, cells)}); everything it started was killed")
            except Exception as exc:
                errors.append(f"grading stopped: {type(exc).__name__}: {str(exc)[:300]}")
            finally:
                runner.close()
                tail = runner.tail.decode("utf-8", "replace")
            if stage != "done" and not errors:
                last = tail.strip().splitlines()[-1][:200] if stage == "starting" and tail.strip() else ""
                errors.append(f"the notebook's process ended early ({self._where(stage, current, cells)}): "
                              "os._exit, a crash, or a resource limit" + (f" [{last}]" if last else ""))
        finally:
            self._free_slot(slot)
        report = self._score(results, static, errors, cell_errors, cells,
                             deadline=time.monotonic() + self.limits.score_seconds)
        report.flags, report.isolation, report.output_tail = flags, self.isolation, tail
        return report

    def grade_namespace(self, env: dict, questions: Iterable[str] | None = None) -> Report:
        """Run the checks (of ``questions``, default all) on the names in ``env`` in this process.

        The tripwires are armed while they run; there is no sandbox and no static scan. The tests
        of the exercises use it to check every part against its solution and its wrong answers.
        """
        wanted = set(self.questions if questions is None else questions)
        guard = _Guard(self.off_limits, allowed_homes(self.config.get("library", [])), list(self.questions)).install()
        try:
            results = {}
            specs = [dict(t.spec(self.limits.call_seconds), cases=copy.deepcopy(t.cases))
                     for t in self.tasks if t.question in wanted]
            references = References(list(self.questions), self.answers, self.references.get) \
                if self.references else None
            with _one_thread():
                run_tasks(specs, env, guard, lambda result: results.__setitem__(result["id"], result), references)
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
               cell_errors: dict[int, str] | None = None, cells: list[str] | None = None,
               deadline: float = float("inf")) -> Report:
        """The verdict from the runner's results; comparing stops at ``deadline`` (the cases left fail)."""
        cell_errors, cells = cell_errors or {}, cells or []
        why = "; ".join(f"{_cell_title(cells[i])} {e}" for i, e in sorted(cell_errors.items()) if i < len(cells))
        questions = {}
        for name, tests in self.questions.items():
            violations = list(static.get(name, []))
            outcomes = []
            for test in tests:
                messages, briefs = [], []
                for task in (t for t in self.tasks if t.test == test.name):
                    result = results.get(task.id)
                    if result is None:
                        messages.append(f"[{task.label}] not run: " + (errors[0][:200] if errors else "no result"))
                        briefs.append(messages[-1])
                        continue
                    violations += [v for v in result.get("violations", []) if v not in violations]
                    for message, brief in self._judge_task(task, result, why, deadline):
                        messages.append(message)
                        briefs.append(self._raised_elsewhere(brief, message, name))
                outcomes.append(TestResult(test.name, test.hidden, test.points, not messages, "\n".join(messages),
                                           "; ".join(briefs)))
            questions[name] = QuestionResult(name, outcomes, violations, self._own_names(name))
        return Report(questions, errors=list(errors))

    def _own_names(self, question: str) -> list[str]:
        return sorted({n for t in self.tasks if t.question == question for n in t.names})

    def _raised_elsewhere(self, brief: str, message: str, question: str) -> str:
        """``brief``, plus where an error came from when it was raised in another part's answer."""
        owner = {n: t.question for t in self.tasks for n in t.names if t.question != question}
        own = set(self._own_names(question))
        named = {(where, where.split(".")[0]) for _, where in _RAISED_IN.findall(message)}   # a method: its class
        places = sorted({(where, owner[name]) for where, name in named if name not in own and name in owner})
        notes = [f"raised in {where} ({part})" for where, part in places]
        return brief + (f" ({'; '.join(notes)}: fix that part first)" if notes else "")

    def _judge_task(self, task: Task, result: dict, why: str,
                    deadline: float = float("inf")) -> list[tuple[str, str]]:
        """``(message, brief)`` for a failing check (none when it passes): every failing case with its
        parameters and values, and the same without a case or value of a hidden test."""
        def same(text: str) -> list[tuple[str, str]]:
            return [(text, text)]

        if result.get("missing"):
            note = f"Your notebook's cells reported: {why}." if why else ""
            return same(f"[{task.label}] " + missing_name_message([str(n) for n in result["missing"]], note))
        if result.get("error"):
            return same(f"[{task.label}] {result['error']}")
        outcomes = result.get("results")
        if not isinstance(outcomes, list) or len(outcomes) != len(task.cases):
            return same(f"[{task.label}] the check returned {len(outcomes) if isinstance(outcomes, list) else 'no'} "
                        f"results for {len(task.cases)} cases")
        failures, theirs = [], set()         # theirs: what the runner said of the student's code (no hidden value)
        for param, case, expected, outcome in zip(task.params, task.cases, task.expected, outcomes):
            if not isinstance(outcome, dict) or not outcome.get("ok"):
                error = outcome.get("error") if isinstance(outcome, dict) else None
                failures.append((param, [str(error or "no output")[:400]]))
                theirs.add(failures[-1][1][0])
                continue
            if time.monotonic() > deadline:
                failures.append((param, [f"not compared: comparing this submission's outputs took more than "
                                         f"{self.limits.score_seconds:g} s"]))
                continue
            try:
                problems = _judge_case(task.compare, case, outcome.get("value"), expected)
            except Exception as exc:           # the student's output broke the comparison
                problems = [f"the output could not be compared: {type(exc).__name__}: {str(exc)[:200]}"]
            if problems:
                failures.append((param, problems))
        if not failures:
            return []
        message = _format_failures(task.label, len(task.cases), failures, task.params)
        own = sorted(theirs | {p for _, problems in failures for p in problems if p.startswith("hint: ")})
        brief = f"[{task.label}] {len(failures)} of {len(task.cases)} cases fail" + (f": {'; '.join(own)}" if own else "")
        return [(message, brief[:1000])]


