"""Reading a submitted notebook: its code cells, and what a syntax-tree scan finds in them."""
from __future__ import annotations

import ast
import re
from typing import Callable, Iterable


# ============================================================================= notebooks
OTTER_INIT_PREFIX = "# Initialize Otter"
_CHECK_CELL = re.compile(r"\s*grader\.check(_all)?\([^)]*\)\s*")
_MARKER = re.compile(r"#\s+(begin|end)\s+(question|solution|tests|prompt)\b", re.I)


def notebook_code_cells(nb) -> list[str]:
    """The code a notebook runs as a submission: every code cell but otter's own and the masters' test blocks."""
    return [source for source, _ in notebook_cell_parts(nb)]


_QUESTION_NAME = re.compile(r"^name:\s*(q\w+)\s*$", re.M)
_CHECK_NAME = re.compile(r"\s*grader\.check\(\s*['\"](\w+)['\"]\s*\)\s*")


def notebook_cell_parts(nb) -> list[tuple[str, str | None]]:
    """`notebook_code_cells`, each with the graded part it belongs to (None: no part).

    In a master, a part's cells are those inside its ``# BEGIN QUESTION`` block. In a student
    notebook, a code cell belongs to the part whose ``grader.check("q1a")`` cell comes next,
    unless a Markdown heading (``# ...``) comes first: the cells at the top of the notebook and
    at the top of a question belong to no part.
    """
    cells, block, part, pending = [], [], None, []

    def settle(owner: str | None) -> None:
        for index in pending:
            cells[index] = (cells[index][0], owner)
        pending.clear()

    for cell in nb["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "raw" and source.strip():
            match = _MARKER.match(source.strip().splitlines()[0])
            if match:
                begin, kind = match.group(1).lower() == "begin", match.group(2).lower()
                block = block + [kind] if begin else block[:-1]
                if kind == "question":
                    name = _QUESTION_NAME.search(source) if begin else None
                    part = name.group(1) if name else None
            continue
        if cell["cell_type"] == "markdown" and source.lstrip().startswith("#"):
            settle(None)
        elif cell["cell_type"] == "code" and _CHECK_CELL.fullmatch(source):
            check = _CHECK_NAME.fullmatch(source)
            settle(check.group(1) if check else None)
        elif (cell["cell_type"] == "code" and block[-1:] != ["tests"]
              and not source.startswith(OTTER_INIT_PREFIX)):
            cells.append((source, part))
            if part is None:
                pending.append(len(cells) - 1)
    settle(None)
    return cells


NOT_ALLOWED = "not allowed"                       # the entry `scan_code` reports for a name off the allowlist
_RUN_BODY = ("time", "timeit", "capture")            # cell magics whose body is the cell's own Python
_LINE_TIMING = re.compile(r"^([ \t]*)%(?:time|timeit)(?:[ \t]+-\S+)*[ \t]+", re.M)


def _to_python(source: str) -> str:
    """A cell's IPython syntax as plain Python: what the grader scans is what the runner runs.

    ``%%time``, ``%%timeit`` and ``%%capture`` cells become their body and ``%time stmt`` lines
    their statement, so that code is scanned like any other. Other magics and ``!cmd`` become
    ``get_ipython()`` calls, which do nothing in the runner (their text is never run).
    """
    from IPython.core.inputtransformer2 import TransformerManager

    stripped = source.lstrip("\n")
    if stripped.startswith("%%"):
        first, _, body = stripped.partition("\n")
        if first[2:].split(" ")[0].strip() in _RUN_BODY:
            return _to_python(body)
    try:
        return TransformerManager().transform_cell(_LINE_TIMING.sub(r"\1", source))
    except Exception:          # leave it as is: compiling it in the runner reports the error
        return source


def _cell_title(source: str) -> str:
    first = next((ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
    return f"the cell starting `{first[:50]}{'...' if len(first) > 50 else ''}`"


# ============================================================================= static analysis
_SENSITIVE_ROOTS = ("torch", "xfam_lib", "otter", "builtins", "sys", "os", "numpy", "math", "nbformat", "IPython",
                    "xfam_grading")
_FLAGGED_IMPORTS = {
    "subprocess": "starts processes", "multiprocessing": "starts processes", "pty": "starts processes",
    "ctypes": "calls C functions directly", "signal": "handles signals", "resource": "changes resource limits",
    "gc": "walks the garbage collector", "inspect": "inspects frames or source", "importlib": "imports dynamically",
    "socket": "opens network connections", "urllib": "opens network connections", "requests": "opens network connections",
    "http": "opens network connections", "threading": "starts threads", "shutil": "copies, moves or deletes files",
    "pickle": "unpickles objects", "marshal": "loads code objects", "types": "builds functions or code objects",
    "pkgutil": "resolves or reads modules by name", "runpy": "runs modules by name",
    "code": "runs code from a string (an interpreter)", "codeop": "compiles code from a string",
    "otter": "uses otter's internals", "xfam_grading": "uses the grader's internals", "builtins": "edits builtins",
}
_FLAGGED_CALLS = {
    "exec": "runs code from a string (exec)", "eval": "runs code from a string (eval)",
    "compile": "compiles code from a string", "__import__": "imports dynamically (__import__)",
    "breakpoint": "opens a debugger", "exit": "ends the process", "quit": "ends the process",
    "setattr": None, "delattr": None,     # flagged only on modules and library classes, below
}
_FLAGGED_OS = {"fork", "forkpty", "kill", "killpg", "_exit", "abort", "system", "popen", "setsid", "setpgid",
               "setuid", "setgid", "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace",
               "chmod", "chown", "truncate", "symlink", "link", "execv", "execve", "execl", "execlp", "execvp",
               "execvpe", "spawnl", "spawnv", "spawnve", "posix_spawn", "putenv", "chdir", "chroot"}
_FLAGGED_SYS = {"exit": "ends the process", "_getframe": "reads call frames", "settrace": "installs a tracer",
                "setprofile": "installs a profiler", "modules": "edits or reads sys.modules",
                "addaudithook": "installs an audit hook", "meta_path": "changes the import system",
                "path_hooks": "changes the import system", "stdout": None, "stderr": None}
_INTROSPECTION = {"__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__dict__",
                  "__reduce__", "__reduce_ex__", "__wrapped__", "__self__", "f_locals", "f_globals", "f_back",
                  "f_code", "tb_frame", "gi_frame", "cr_frame", "co_consts", "__traceback__", "__setstate__",
                  "__getattribute__", "__class__", "__bases__", "__mro__", "__loader__", "__spec__"}
# Dunder attributes a submission may name; reading any other (``__closure__``, ``__globals__``, ...) or
# building an attribute name at run time is flagged.
_DUNDER_OK = {"__init__", "__name__", "__qualname__", "__doc__", "__call__", "__len__", "__iter__", "__next__",
              "__getitem__", "__setitem__", "__contains__", "__repr__", "__str__", "__eq__", "__hash__", "__enter__",
              "__exit__", "__version__", "__add__", "__mul__", "__matmul__", "__post_init__"}
# What a submission may import: the standard library and the packages of the grading environment.
# Names of xfam_lib are allowed one by one (`allowlist`); these are always allowed.
PACKAGES = ("torch", "numpy", "matplotlib", "mpl_toolkits", "tqdm", "ipywidgets", "IPython", "triton", "xfam_lib",
            "xfam_grading", "otter")
LIBRARY_ALWAYS = ("xfam_lib.utils", "xfam_lib.plots", "xfam_lib.testing")


def _suspicious(attr: str) -> bool:
    return attr in _INTROSPECTION or (attr.startswith("__") and attr.endswith("__") and attr not in _DUNDER_OK)


def allowlist(library: Iterable[str] = ()) -> Callable[[str], str | None]:
    """For `scan_code`: a dotted name -> why a submission may not use it (None when it may).

    Allowed: the standard library, `PACKAGES`, and of ``xfam_lib`` only `LIBRARY_ALWAYS` and the
    names in ``library`` (what the handed-out notebook imports), with their public attributes. A
    private helper, another module's version of the same computation, a package installed only
    for the book's own tests: none is on the list.
    """
    import sys

    names = tuple(LIBRARY_ALWAYS) + tuple(library)

    def why(dotted: str) -> str | None:
        root = dotted.split(".")[0]
        if root == "xfam_lib":
            private = [p for p in dotted.split(".") if p.startswith("_") and not p.endswith("__")]
            if private:
                return f"{dotted} is a private name of the library"
            if any(dotted == n or dotted.startswith(n + ".") or n.startswith(dotted + ".") for n in names):
                home = _home(dotted)              # an allowed module may hold another module's function
                if home is None or any(home == n or home.startswith(n + ".") for n in names):
                    return None
                return f"{dotted} is {home}, which is not among the library names this notebook may use"
            return f"{dotted} is not among the library names this notebook may use ({', '.join(names)})"
        if root in sys.stdlib_module_names or root in PACKAGES:
            return None
        return (f"{root} is not in the grading environment (a submission may import the standard library, "
                f"{', '.join(p for p in PACKAGES if p != 'xfam_lib')} and the library names it was given)")

    return why


def _home(dotted: str) -> str | None:
    """Where the library function or class a dotted name reaches is defined (``module.qualname``), if it is one."""
    from .guard import resolve_live

    try:
        obj = resolve_live(dotted)
    except Exception:
        return None
    module = getattr(obj, "__module__", None)
    if not (callable(obj) and isinstance(module, str) and module.startswith("xfam_lib")):
        return None
    return f"{module}.{getattr(obj, '__qualname__', '')}"


def library_imports(cells: list[str]) -> list[str]:
    """The ``xfam_lib`` names a notebook's cells import (``from xfam_lib.m import a`` -> ``xfam_lib.m.a``)."""
    found = []
    for source in cells:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("xfam_lib"):
                found += [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
            elif isinstance(node, ast.Import):
                found += [a.name for a in node.names if a.name.startswith("xfam_lib.")]
    return sorted(set(found))


# Library functions that write a file (by their dotted name, however imported)
_SAVE_FUNCTIONS = {"torch.save", "torch.jit.save", "torch.onnx.export", "numpy.save", "numpy.savez",
                   "numpy.savez_compressed", "numpy.savetxt", "numpy.ndarray.tofile", "pickle.dump", "json.dump",
                   "matplotlib.pyplot.savefig"}
_WRITE_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "touch", "chmod", "symlink_to", "hardlink_to",
                  "rename"}


class _Scanner(ast.NodeVisitor):
    """Walks one cell: which off-limits names it reaches, and what to flag for review."""

    def __init__(self, resolve: Callable[[str], list[str]], cell: int, title: str,
                 allowed: Callable[[str], str | None] | None = None):
        self.resolve = resolve                 # dotted name -> off-limits entries it reaches
        self.allowed = allowed                 # dotted name -> why it is not allowed (None: allowed)
        self.refused: list[tuple[str, int]] = []           # (why, line)
        self.cell, self.title = cell, title
        self.aliases: dict[str, str] = {}
        self.strings: dict[str, str] = {}
        self.reached: list[tuple[str, str, int]] = []      # (entry, how it was spelled, line)
        self.flags: list[tuple[int, str]] = []

    # ---- helpers
    def flag(self, node: ast.AST, what: str) -> None:
        self.flags.append((getattr(node, "lineno", 0), what))

    def text(self, node: ast.AST) -> str | None:
        """The value of a string expression built from constants (+, join, f-strings, known variables)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.strings.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.text(node.left), self.text(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.JoinedStr):
            parts = [self.text(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
            return "".join(parts) if all(p is not None for p in parts) else None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"
                and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple))):
            sep, parts = self.text(node.func.value), [self.text(e) for e in node.args[0].elts]
            return sep.join(parts) if sep is not None and all(p is not None for p in parts) else None
        return None

    def dotted(self, node: ast.AST) -> str | None:
        """The library path an expression refers to, e.g. ``A.scaled_dot_product_attention``."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            name = self.dotted(node.func) or getattr(node.func, "id", None)
            if name in ("getattr", "builtins.getattr") and len(node.args) >= 2:
                base, attr = self.dotted(node.args[0]), self.text(node.args[1])
                return f"{base}.{attr}" if base and attr else None
            if name in ("importlib.import_module", "__import__", "builtins.__import__") and node.args:
                return self.text(node.args[0])
            if name in ("vars", "builtins.vars") and node.args:
                return self.dotted(node.args[0])
        if isinstance(node, ast.Subscript):            # vars(m)["name"], m.__dict__["name"]
            value = node.value
            base = self.dotted(value.value) if isinstance(value, ast.Attribute) and value.attr == "__dict__" \
                else self.dotted(value)
            key = self.text(node.slice)
            return f"{base}.{key}" if base and key else None
        return None

    def reach(self, node: ast.AST, dotted: str | None) -> None:
        if dotted:
            entries = self.resolve(dotted)
            for entry in entries:
                self.reached.append((entry, dotted, getattr(node, "lineno", 0)))
            why = self.allowed(dotted) if self.allowed and not entries else None   # off limits: its part only
            if why:
                self.refused.append((why, getattr(node, "lineno", 0)))

    # ---- imports and names
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.aliases[root] = root
            self.reach(node, alias.name)
            self.flag_import(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for alias in node.names:
            if alias.name == "*":
                self.reach(node, node.module + ".*")
            else:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                self.reach(node, f"{node.module}.{alias.name}")
        self.flag_import(node, node.module)

    def flag_import(self, node: ast.AST, module: str) -> None:
        for name, what in _FLAGGED_IMPORTS.items():
            if module == name or module.startswith(name + "."):
                self.flag(node, f"imports {module} ({what})")
                return

    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.text(node.value)
        target_alias = self.dotted(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if value is not None:
                    self.strings[target.id] = value
                if target_alias:
                    self.aliases[target.id] = target_alias
            self.check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.check_target(target, "deletes")
        self.generic_visit(node)

    def check_target(self, target: ast.AST, verb: str = "replaces") -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.check_target(element, verb)
        elif isinstance(target, ast.Attribute):
            base = self.dotted(target.value)
            if base and base.split(".")[0] in _SENSITIVE_ROOTS:
                self.flag(target, f"{verb} {base}.{target.attr}")
            elif _suspicious(target.attr):
                self.flag(target, f"{verb} {target.attr}")
        elif isinstance(target, ast.Subscript):
            base = self.dotted(target.value)
            if base and base.split(".")[0] in _SENSITIVE_ROOTS:
                self.flag(target, f"{verb} an item of {base}")

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.reach(node, self.aliases.get(node.id))
            if node.id in ("__builtins__", "__loader__", "__spec__"):
                self.flag(node, f"uses {node.id}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self.dotted(node)
        self.reach(node, dotted)
        if _suspicious(node.attr):
            self.flag(node, f"reads {node.attr} (inspects objects, frames or modules)")
        if dotted:
            root, _, attr = dotted.partition(".")
            if root == "os" and attr in _FLAGGED_OS:
                self.flag(node, f"uses os.{attr}")
            elif root == "sys" and attr in _FLAGGED_SYS and _FLAGGED_SYS[attr]:
                self.flag(node, f"uses sys.{attr} ({_FLAGGED_SYS[attr]})")
        if dotted is None or not isinstance(node.value, ast.Attribute):
            self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.reach(node, self.dotted(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        dotted = self.dotted(node)
        self.reach(node, dotted)
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name in ("getattr", "setattr", "delattr", "hasattr") and name not in self.aliases and len(node.args) >= 2:
            attr = self.text(node.args[1])
            if attr is None:
                self.flag(node, f"{name} with an attribute name built at run time")
            elif _suspicious(attr):
                self.flag(node, f"reads {attr} with {name} (inspects objects, frames or modules)")
        if name in ("vars", "globals", "locals") and name not in self.aliases:
            self.flag(node, f"reads a namespace ({name})")
        if isinstance(node.func, ast.Attribute) and node.func.attr == "run_cell_magic":
            magic = self.text(node.args[0]) if node.args else None
            self.flag(node, f"has a %%{magic or '?'} cell, which the grader does not run")
        if name in _FLAGGED_CALLS and name not in self.aliases:
            what = _FLAGGED_CALLS[name]
            if what:
                self.flag(node, what)
            elif node.args:
                base = self.dotted(node.args[0])
                if base and base.split(".")[0] in _SENSITIVE_ROOTS:
                    attr = self.text(node.args[1]) if len(node.args) > 1 else None
                    self.flag(node, f"{'replaces' if name == 'setattr' else 'deletes'} {base}.{attr or '<attribute>'} "
                                    f"with {name}")
        if name == "open" and name not in self.aliases:
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            mode_text = self.text(mode) if mode is not None else "r"
            if mode_text is None or set(mode_text) & set("wax+"):
                self.flag(node, "opens a file for writing")
        called = self.dotted(node.func)
        if called in _SAVE_FUNCTIONS:
            self.flag(node, f"writes a file ({called})")
        if isinstance(node.func, ast.Attribute):
            if node.func.attr in _WRITE_METHODS and not isinstance(node.func.value, ast.Constant):
                self.flag(node, f"calls .{node.func.attr}() (changes files)")
            if node.func.attr == "open" and len(node.args) >= 1:
                mode_text = self.text(node.args[0])
                if mode_text and set(mode_text) & set("wax+"):
                    self.flag(node, "opens a file for writing")
        self.generic_visit(node)


def scan_code(cells: list[str], resolve: Callable[[str], list[str]], *, skip: Iterable[str] = (),
              allowed: Callable[[str], str | None] | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """Read a notebook's code cells (plain Python) as syntax trees.

    Returns ``(reached, flags)``: ``reached`` pairs each off-limits entry the code reaches (via
    ``resolve``: a dotted name -> the entries it reaches) with a description of where, and, with
    ``allowed`` (see `allowlist`), each name it may not use as ``("not allowed", why)``; ``flags``
    describes code to review (patching libraries, processes, frames, files, ...). Cells equal to
    one of ``skip`` (the canonical setup cell) and cells that do not parse are left out.
    """
    reached, flags = scan_cells(cells, resolve, skip=skip, allowed=allowed)
    return [(entry, where) for entry, where, _ in reached], flags


def scan_cells(cells: list[str], resolve: Callable[[str], list[str]], *, skip: Iterable[str] = (),
               allowed: Callable[[str], str | None] | None = None) -> tuple[list[tuple[str, str, int]], list[str]]:
    """`scan_code`, with the index of the cell each entry was reached in: ``(entry, where, cell)``."""
    skip, reached, flags, aliases, strings = set(skip), [], [], {}, {}
    for index, source in enumerate(cells):
        if source in skip:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        title = _cell_title(source)
        scanner = _Scanner(resolve, index, title, allowed)
        scanner.aliases, scanner.strings = aliases, strings       # names carry over between cells
        scanner.visit(tree)
        reached += [(entry, (f"as {spelled} " if spelled != entry else "") + f"({title}, line {line})", index)
                    for entry, spelled, line in scanner.reached]
        reached += [(NOT_ALLOWED, f"{why} ({title}, line {line})", index) for why, line in scanner.refused]
        flags += [f"{what} ({title}, line {line})" for line, what in scanner.flags]
    return list(dict.fromkeys(reached)), list(dict.fromkeys(flags))


