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
                detail = verdict.message() if verdict.violations else (test.message or "; ".join(report.errors))
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


def otter_notebook(*args, **kwargs):
    """otter's ``Notebook`` for the student's notebook, with failure messages trimmed to what the check says."""
    import otter

    class Feedback(otter.Notebook):
        def check(self, question, global_env=None):
            result = super().check(question, sys._getframe(1).f_globals if global_env is None else global_env)
            for outcome in getattr(result, "test_case_results", []):
                outcome.message = trim_otter_message(outcome.message)
            return result

    return Feedback(*args, **kwargs)
