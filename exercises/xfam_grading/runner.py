"""The runner process (the untrusted side): runs the notebook's cells, then each check's adapter."""
from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import struct
import sys
from typing import Any, Callable

import torch

from .channel import _MAX_TEXT, _Replies, _read_exactly, _unpack
from .checks import _TIMEOUT, SubmissionTimeout, _describe, _student_output, time_limit
from .guard import _Guard, allowed_homes, audit_with
from .sandbox import _sandbox

# ============================================================================= running checks on the student's code
class _NoShell:
    """``get_ipython()`` in the runner: magics and shell commands do nothing.

    The bodies of ``%%time``, ``%%timeit`` and ``%%capture`` cells were made plain Python before
    the scan (`xfam_grading.scanner._to_python`), so no text is ever run here unscanned.
    """

    def run_line_magic(self, *args, **kwargs):
        return None

    run_cell_magic = system = getoutput = run_line_magic


def _reset_torch_state() -> None:
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)


def run_task(spec: dict, env: dict, guard: _Guard | None) -> dict:
    """Run one collected check's adapter on each of its cases, with the student's names from ``env``.

    Returns ``{"id", "results": [{"ok", "value" | "error"}], "violations", "missing"}``. Used by the
    runner process and, in one process, by the tests of the exercises.
    """
    missing = [n for n in spec["names"] if env.get(n) is None]
    if missing:
        return {"id": spec["id"], "results": [], "violations": [], "missing": missing}
    namespace = {n: env[n] for n in spec["names"]}
    namespace.update(torch=torch, math=math, __builtins__=builtins)
    exec(compile(spec["adapter"], f"<check {spec['label']}>", "exec"), namespace)
    adapter = namespace[spec["adapter_name"]]
    results, stuck = [], None
    context = guard.active(spec["question"]) if guard else contextlib.nullcontext()
    with context:
        for case in spec["cases"]:
            if stuck:                      # an endless loop would only time out again: skip the rest
                results.append({"ok": False, "error": stuck})
                continue
            _reset_torch_state()
            ok, value, timed_out = _student_output(adapter, case, spec["limit"])
            if timed_out:
                stuck = value
            results.append({"ok": True, "value": value} if ok else {"ok": False, "error": str(value)})
    violations = list(guard.violations.get(spec["question"], [])) if guard else []
    return {"id": spec["id"], "results": results, "violations": violations, "missing": []}


def run_tasks(specs: list[dict], env: dict, guard: _Guard | None, report: Callable[[dict], None],
              references: "References | None" = None) -> None:
    """`run_task` for every check, in order; after a time-out, the part's remaining checks are not run.

    An endless loop would cost the time limit again in every later check of its part, and could
    use up the submission's whole time. ``report`` receives each result as soon as it is ready.
    With ``references``, each part is graded on its own: while its checks run, the names that the
    parts before it define resolve, in ``env``, to those parts' reference answers (`References`);
    its own names stay the student's.
    """
    stuck: dict[str, str] = {}
    for spec in specs:
        if spec["question"] in stuck:
            report({"id": spec["id"], "results": [{"ok": False, "error": stuck[spec["question"]]}] * len(spec["cases"]),
                    "violations": [], "missing": []})
            continue
        given = references.before(spec["question"], env) if references else {}
        try:
            with _names_in(env, given):
                result = run_task(spec, env, guard)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:       # the adapter itself failed, e.g. the student broke torch
            result = {"id": spec["id"], "results": [], "violations": [], "missing": [],
                      "error": f"the check could not run: {type(exc).__name__}: {str(exc)[:200]}"}
        timeouts = [r["error"] for r in result.get("results", []) if not r["ok"] and r["error"].startswith(_TIMEOUT)]
        if timeouts:
            stuck[spec["question"]] = timeouts[0].split(" (")[0] + " in an earlier check of this part; not run again"
        report(result)


@contextlib.contextmanager
def _names_in(env: dict, names: dict):
    """``env`` with ``names`` set for the block, then as it was (a name it did not have is removed)."""
    missing = object()
    saved = {n: env.get(n, missing) for n in names}
    env.update(names)
    try:
        yield
    finally:
        for n, value in saved.items():
            if value is missing:
                env.pop(n, None)
            else:
                env[n] = value


class References:
    """The reference answers of the parts before the one being checked, so that each part is graded on its own.

    ``parts``: every part, in the order its checks run; ``answers``: the names each part's answer
    defines; ``fetch(part)``: that part's reference answer (the master's code of its answer cells)
    or ``None``. A part's reference is fetched only once the checks of every part up to it have
    run (in the runner, the judge sends it only once it holds all of that part's results), and is
    run once, in a copy of the student's namespace (its imports and given code), under the file
    name ``<reference q1a>``. A reference that fails to run is left out: the part's names stay the
    student's.
    """

    def __init__(self, parts: list[str], answers: dict[str, list[str]], fetch: Callable[[str], str | None]):
        self.parts, self.answers, self.fetch = list(parts), answers, fetch
        self.namespace: dict | None = None
        self.done: list[str] = []                     # parts whose reference was fetched (and run)
        self.objects: dict[str, Any] = {}             # name -> its reference object

    def before(self, part: str, env: dict) -> dict[str, Any]:
        """The reference objects of the names of the parts before ``part``, except ``part``'s own names."""
        if part not in self.parts:
            return {}
        earlier = self.parts[:self.parts.index(part)]
        for other in earlier[len(self.done):]:
            self.done.append(other)
            source = self.fetch(other)
            if not source:
                continue
            if self.namespace is None:
                self.namespace = dict(env)
            try:
                exec(compile(source, f"<reference {other}>", "exec"), self.namespace)
            except Exception:
                continue
            self.objects.update({n: self.namespace[n] for n in self.answers.get(other, []) if n in self.namespace})
        own = set(self.answers.get(part, []))
        return {n: obj for p in earlier for n in self.answers.get(p, []) if n not in own
                for obj in [self.objects.get(n)] if obj is not None}


def _run_cells(cells: list[str], namespace: dict, replies: _Replies, limit: float) -> None:
    for index, source in enumerate(cells):
        replies.send({"kind": "cell", "index": index})
        error = None
        try:
            code = compile(source, f"<cell {index + 1}>", "exec")
            with time_limit(limit):
                try:
                    exec(code, namespace)
                except (SubmissionTimeout, KeyboardInterrupt):
                    raise
                except BaseException as exc:   # SystemExit too: the notebook goes on, as in a kernel
                    error = _describe(exc, "raised")     # formatted inside the limit
        except SubmissionTimeout:
            error = f"did not finish within {limit:g} s and was stopped"
        except KeyboardInterrupt:
            raise
        except BaseException as exc:            # a syntax error
            error = f"raised {type(exc).__name__}"
        if error:
            replies.send({"kind": "cell error", "index": index, "error": error[:_MAX_TEXT]})


def _runner_work(request: dict, replies: _Replies, request_more: Callable[[str], str | None] | None = None) -> None:
    """Execute the notebook's cells, then every check's adapter, reporting as it goes (the untrusted part).

    ``request_more(part)``: the reference answer of ``part``, which the judge sends once it holds
    every result of that part's checks (`References`)."""
    torch.set_num_threads(1)
    parts = list(dict.fromkeys(t["question"] for t in request["tasks"]))
    guard = _Guard(request["off_limits"], allowed_homes(request["library"]), parts).install()
    audit_with(guard)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace["get_ipython"] = lambda shell=_NoShell(): shell
    namespace["display"] = lambda *args, **kwargs: None
    sent: list[str] = []

    def send_flags() -> None:
        new = [f for f in guard.flags if f not in sent][:20 - len(sent)]
        if new:
            sent.extend(new)
            replies.send({"kind": "flags", "flags": [str(f)[:500] for f in new]})

    _run_cells(request["cells"], namespace, replies, request["cell_seconds"])
    send_flags()
    replies.send({"kind": "tasks"})
    references = References(request["parts"], request.get("answers", {}), request_more) \
        if request_more and request.get("parts") else None
    run_tasks(request["tasks"], namespace, guard, lambda result: (send_flags(), replies.send(dict(result, kind="task"))),
              references)
    send_flags()
    replies.send({"kind": "done"})


def _runner_main() -> None:
    """Entry point of the runner process: sandbox itself, read the request, run the student's code.

    After the request, the judge sends on the same pipe, part by part, ``{"part", "source"}`` with
    the reference answer of a part whose checks have all been answered (`References`)."""
    config = json.loads(sys.argv[1])
    _sandbox(config)
    stdin = os.fdopen(os.dup(0), "rb")          # the judge's pipe; fd 0 itself is closed for the notebook
    os.close(0)
    (size,) = struct.unpack(">Q", _read_exactly(stdin, 8))
    request = _unpack(_read_exactly(stdin, size))
    received: dict[str, str] = {}

    def request_more(part: str) -> str | None:
        while part not in received:
            try:
                (size,) = struct.unpack(">Q", _read_exactly(stdin, 8))
                frame = _unpack(_read_exactly(stdin, size))
            except Exception:                      # the judge sent no more: the part's names stay the student's
                return None
            if isinstance(frame, dict) and isinstance(frame.get("part"), str) and isinstance(frame.get("source"), str):
                received[frame["part"]] = frame["source"]
        return received[part]

    _runner_work(request, _Replies(config["reply_fd"]), request_more)
    sys.stdout.flush()
    os._exit(0)
