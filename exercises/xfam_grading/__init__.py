"""Grading for the book's exercises: checks with clear messages, and a judge that a submission cannot game.

Exercise tests call one function, `check_cases`. A test names its cases, builds each case's
inputs, calls the student's code through a small ``submission`` adapter, and says what the
answer should be::

    def test_q1a_masks(sdpa):
        import torch
        from xfam_grading import check_cases

        def make_case(p):                      # inputs only: tensors, numbers, strings, lists, dicts
            return {"q": torch.randn(p["lq"], 8), ...}

        def submission(c):                     # the only place that touches the student's code
            out, weights = sdpa(c["q"], c["k"], c["v"], c["mask"])
            return {"out": out, "weights": weights}

        def reference(c):                      # the expected outputs, computed from the inputs
            ...

        check_cases("masks", params=[{"lq": 4, "lk": 6}, {"lq": 1, "lk": 1}],
                    make_case=make_case, submission=submission, reference=reference)

Where a check runs
------------------
* **In one process** (a student's ``grader.check``, which runs only the public tests, and the
  master notebook): every case is built, the student's code runs, the reference is computed and
  compared, and every failing check is listed with its case parameters. This is feedback only.
* **Under the judge** (`Judge`, used by ``make grade`` and, through the otter plugin `OtterJudge`,
  by ``otter run``, ``otter grade`` and Gradescope): the judge process runs the test functions
  with `check_cases` in *collect* mode. It builds every case and computes every expected value
  itself, and keeps the source of each ``submission`` adapter. The student's notebook then runs
  in a separate **runner** process that receives only the notebook's code, the adapters' source
  and the inputs; it sends back the outputs as data (``torch.load(weights_only=True)``). The judge
  compares and scores. The runner never holds a test's reference function, an expected value or a
  verdict, so looking through frames, the garbage collector or module namespaces finds nothing to
  copy, and patching the runner's torch, otter or this package changes nothing the judge computes.

Each part is graded on its own: while a part's checks run, the names the parts before it define
are the master's answers of those parts (`runner.References`), its own names the student's, so a
right ``q1b`` that calls a wrong ``q1a`` keeps its points. The judge sends a part's master answer to
the runner only once it holds every result of that part's checks, so no part's own checks can
reach its answer.

The judge trusts nothing the runner sends: every field of every message is checked (each task
answered once, one result per case, plain data, bounded sizes), and a NaN or infinity where the
reference is finite fails every kind of check before the check runs. Whatever goes wrong while
grading one submission costs only that submission.

The runner is sandboxed (`Limits`): limits on memory, CPU time, processes, file size and open
files, on the time of a cell, of a call and of the whole submission. Where the OS allows (root,
or unprivileged user namespaces on Linux) it gets new mount, network and PID namespaces and a
root file system built from an allowlist: read-only Python, the grading environment's packages,
``xfam_lib`` and this package; a fresh ``/proc``; a private ``/tmp``. The repository, the tests,
the masters and the other submissions are not in it, it has no network, and every process it
starts dies with it. As root it runs under a uid that owns nothing; under user namespaces its
mounts are locked. Without namespaces the judge refuses to run unless told
``isolation="basic"`` (the otter plugin allows it: there each submission has its own container).

What a submission may use, and "not writing it yourself"
--------------------------------------------------------
`scan_code` reads the notebook's code as a syntax tree (cell magics that run their body are
read as that body). (1) It may reach only an allowlist (`scanner.allowlist`): the standard
library, the grading environment's packages and the ``xfam_lib`` names the handed-out notebook
imports; anything else scores every question 0. (2) Each question's ``off_limits`` (in the
master notebook, next to the question) lists the library names it asks the student to write,
and the private helpers that would do its work; an import, attribute access or ``getattr``
that reaches one, however it is spelled, in a cell of that question (`notebook_cell_parts`)
scores that question 0; in a cell of no question, every question that lists it; the build closes
each list under the library's own calls (``implied_off_limits``). (3) In the runner those names,
and every library function, class and class method off the allowlist, are replaced by tripwires:
a call from code that is not the library's (known by the identity of its code objects) while a
question's checks run raises `OffLimitsError` and scores that question 0. An audit hook refuses
the student's code reading the library's files and compiling or running copies of its code. ``grader.check`` (`otter_notebook`) runs the
same scan on the student's notebook, so the student is told before handing in. `scan_code` also reports **review flags** (patching torch or otter,
starting processes, reading frames or double-underscore attributes, names built at run time,
writing files, ...) for a person to read; the tripwires still hold the original functions, so
code that digs them out is caught by these flags, not by the tripwires.

What this does not stop: code that copies a solution (from the public repository or from a
classmate), or that re-implements the library by reading its source file (the flags point at
the second); and properties a test measures inside the runner (a kernel spy) can be forged by
code that patches the measuring functions (flagged too). A memory budget is held by the
operating system instead (`run_with_memory_budget`: the call in a child process under an
address-space limit), so numpy or torch with its dispatch hooks off cannot build what does not fit.

Modules: `compare` (outputs against expected values), `checks` (`check_cases`, cases, collection),
`scanner` (a notebook's cells and the syntax-tree scan), `guard` (off-limits names and tripwires),
`budget` (memory budgets in a child process), `channel` (the runner's reply frames), `runner` (the untrusted process), `sandbox` (its
confinement and the judge's handle on it), `judge` (`Judge`, `Report`), `otter_plugin`
(`OtterJudge`, `otter_notebook`). It is installed with the exercises (``exercises/pyproject.toml``),
not with ``xfam_lib``.
"""
from .budget import memory_budget_available, run_with_memory_budget
from .checks import (DEFAULT_TIME_LIMIT, OffLimitsError, SubmissionTimeout, case_label, check_cases, jit_body_problems,
                     time_limit)
from .compare import compare_outputs, output_problems
from .judge import Judge, Report
from .otter_plugin import OtterJudge, otter_notebook
from .sandbox import Limits
from .scanner import notebook_cell_parts, notebook_code_cells, scan_code

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "SubmissionTimeout",
    "OffLimitsError",
    "time_limit",
    "output_problems",
    "compare_outputs",
    "case_label",
    "check_cases",
    "jit_body_problems",
    "run_with_memory_budget",
    "memory_budget_available",
    "Limits",
    "scan_code",
    "notebook_code_cells",
    "notebook_cell_parts",
    "Judge",
    "Report",
    "OtterJudge",
    "otter_notebook",
]
