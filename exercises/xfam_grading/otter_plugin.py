"""otter-grader: the autograder's plugin (`OtterJudge`) and the student's feedback (`otter_notebook`)."""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from .judge import Judge, Report


class OtterJudge:
    """otter-grader plugin named in the autograder zip's ``otter_config.json``: grading by the `Judge`.

    ``before_execution`` hands otter an empty notebook, so none of the student's code runs in
    otter's grading kernel; ``after_grading`` runs the `Judge` (tests from the zip, student code in
    the sandboxed runner) and replaces otter's results with its verdicts. Works the same under
    ``otter run``, ``otter grade`` (one container per submission) and Gradescope.
    """

    def __init__(self, submission_path: str, submission_metadata: dict, plugin_config: dict):
        self.submission_path = submission_path
        self.config = dict(plugin_config or {})
        self.report: Report | None = None

    def before_execution(self, submission):
        import nbformat

        return nbformat.v4.new_notebook(metadata=dict(submission.get("metadata", {})))

    def after_grading(self, results) -> None:
        from otter.test_files.abstract_test import TestCaseResult

        autograder = Path(self.submission_path).resolve().parent.parent       # <ag>/submission/<file>
        judge = Judge(autograder / "source" / "tests", self.config, hide=[str(autograder)], allow_basic=True)
        if judge.isolation == "basic":
            # No namespaces in this container (one per submission): the hidden tests, already loaded,
            # are deleted so that the submission's process cannot read them.
            for tests in (autograder / "source" / "tests", autograder / "submission" / "tests"):
                shutil.rmtree(tests, ignore_errors=True)
        self.report = report = judge.grade(self.submission_path)
        for name, test_file in results.results.items():
            verdict = report.questions.get(name)
            if verdict is None:
                continue
            outcomes = []
            for case, test in zip(test_file.test_cases, verdict.tests):
                passed = test.passed and not verdict.violations
                detail = "\n".join(filter(None, [verdict.off_limits_message(), test.message or "; ".join(report.errors)]))
                message = "✅ Test case passed" if passed else "❌ Test case failed\n" + detail
                outcomes.append(TestCaseResult(test_case=case, message=message, passed=passed))
            test_file.test_case_results = outcomes
            test_file._score = None

    def generate_report(self) -> str:
        return self.report.summary() if self.report else ""


_OTTER_NOISE = re.compile(r"Error at line \d+ in test [^\n]*:\n(?:  [^\n]*\n)?(?:AssertionError: )?")


def trim_otter_message(message: str | None) -> str | None:
    """otter's failure text without its "Error at line N in test q1:" header and the test's source line."""
    return _OTTER_NOISE.sub("", message) if message else message


CONFIG_FILE = "grading.json"          # in the public tests folder: what the scan of grader.check needs
NOT_CHECKED = ("The off-limits names were not checked: grader.check could not read this notebook (open it from its "
               "own folder, or name it in the init cell: otter_notebook('chNN_exercises.ipynb')).")


def tests_missing_message(tests_dir: str, notebook: str | None) -> str:
    """One sentence: where ``grader.check`` looks for the public tests and how to get them."""
    chapter = re.match(r"ch\d\d", Path(notebook or "").name)
    folder = f"exercises/{chapter.group(0) if chapter else 'chNN'}/student/tests"
    return (f"grader.check needs this chapter's public tests in the folder {str(Path(tests_dir).resolve())!r}: copy "
            f"{folder} from the book's repository (at the release the first cell names) next to this notebook, "
            f"or on Colab run the notebook's first cell, which fetches it.")


def off_limits_note(question: str, nb: dict | None, config: dict, questions: list[str], saved: bool) -> str:
    """What the graders' off-limits scan of the notebook ``nb`` would cost ``question``: one sentence, '' if
    nothing (``saved``: ``nb`` is the file as last saved, not what the student sees)."""
    from .judge import scan_notebook
    from .scanner import _to_python, notebook_cell_parts

    if nb is None:
        return NOT_CHECKED
    pairs = notebook_cell_parts(nb)
    violations, _ = scan_notebook([_to_python(c) for c, _ in pairs], [p for _, p in pairs], config, questions)
    uses = violations.get(question)
    if not uses:
        return ""
    return (f"{question} would score 0 under the off-limits rule ({question} asks you to write this yourself, "
            f"without these library names){' (read from the notebook as last saved)' if saved else ''}: "
            + "; ".join(uses))


def escaped_html(result) -> str:
    """otter's HTML view of a check's result with every message escaped (``<listcomp>`` stays visible)."""
    import copy
    import dataclasses
    import html

    shown = copy.copy(result)
    shown.test_case_results = [dataclasses.replace(r, message=html.escape(r.message or ""))
                               for r in result.test_case_results]
    return type(result)._repr_html_(shown)


def otter_notebook(*args, **kwargs):
    """otter's ``Notebook`` for the student's notebook: failure messages trimmed to what the check says and
    escaped in the HTML view, the off-limits scan of the notebook added to every check, and a missing
    tests folder explained."""
    import json
    import types

    import otter
    from otter.test_files.abstract_test import TestCase, TestCaseResult

    class Feedback(otter.Notebook):
        def check(self, question, global_env=None):
            if not Path(self._tests_dir).is_dir():
                raise FileNotFoundError(tests_missing_message(self._tests_dir, self._notebook))
            result = super().check(question, sys._getframe(1).f_globals if global_env is None else global_env)
            for outcome in getattr(result, "test_case_results", []):
                outcome.message = trim_otter_message(outcome.message)
            config_path = Path(self._tests_dir) / CONFIG_FILE
            if hasattr(result, "test_case_results") and config_path.is_file():
                config = json.loads(config_path.read_text(encoding="utf-8"))
                colab = "google.colab" in sys.modules
                note = off_limits_note(question, self._notebook_json(), config, config.get("parts", [question]),
                                       saved=not colab)
                if note == NOT_CHECKED:
                    print(NOT_CHECKED)
                elif note:
                    case = TestCase("off limits", None, False, 0, None, None)
                    result.test_case_results.append(TestCaseResult(case, "❌ " + note, False))
            if hasattr(result, "_repr_html_"):
                result._repr_html_ = types.MethodType(escaped_html, result)
            return result

        def _notebook_json(self):
            """The notebook as the student sees it (Colab) or as last saved (Jupyter); None if unreadable."""
            import nbformat

            try:
                if "google.colab" in sys.modules:
                    from google.colab import _message

                    return _message.blocking_request("get_ipynb", timeout_sec=30)["ipynb"]
                if self._notebook and Path(self._notebook).is_file():
                    return nbformat.read(self._notebook, as_version=4)
            except Exception:
                return None
            return None

    return Feedback(*args, **kwargs)
