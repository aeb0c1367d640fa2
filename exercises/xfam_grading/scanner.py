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
    cells, block = [], []
    for cell in nb["cells"]:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "raw" and source.strip():
            match = _MARKER.match(source.strip().splitlines()[0])
            if match:
                block = block + [match.group(2).lower()] if match.group(1).lower() == "begin" else block[:-1]
            continue
        if (cell["cell_type"] == "code" and block[-1:] != ["tests"] and not source.startswith(OTTER_INIT_PREFIX)
                and not _CHECK_CELL.fullmatch(source)):
            cells.append(source)
    return cells


def _to_python(source: str) -> str:
    """A cell's IPython syntax (magics, ``!cmd``) as plain Python calling ``get_ipython()``."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(source)
    except Exception:          # leave it as is: compiling it in the runner reports the error
        return source


def _cell_title(source: str) -> str:
    first = next((ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")), "")
    return f"the cell starting `{first[:50]}{'...' if len(first) > 50 else ''}`"


# ============================================================================= static analysis
_SENSITIVE_ROOTS = ("torch", "xfam_lib", "otter", "builtins", "sys", "os", "numpy", "math", "nbformat", "IPython", "xfam_grading")
_FLAGGED_IMPORTS = {
    "subprocess": "starts processes", "multiprocessing": "starts processes", "pty": "starts processes",
    "ctypes": "calls C functions directly", "signal": "handles signals", "resource": "changes resource limits",
    "gc": "walks the garbage collector", "inspect": "inspects frames or source", "importlib": "imports dynamically",
    "socket": "opens network connections", "urllib": "opens network connections", "requests": "opens network connections",
    "http": "opens network connections", "threading": "starts threads", "shutil": "copies, moves or deletes files",
    "pickle": "unpickles objects", "marshal": "loads code objects", "types": "builds functions or code objects",
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
_WRITE_METHODS = {"write_text", "write_bytes", "unlink", "rmdir", "touch", "chmod", "symlink_to", "hardlink_to",
                  "rename"}


class _Scanner(ast.NodeVisitor):
    """Walks one cell: which off-limits names it reaches, and what to flag for review."""

    def __init__(self, resolve: Callable[[str], list[str]], cell: int, title: str):
        self.resolve = resolve                 # dotted name -> off-limits entries it reaches
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
            for entry in self.resolve(dotted):
                self.reached.append((entry, dotted, getattr(node, "lineno", 0)))

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
            elif target.attr in _INTROSPECTION:
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
        if node.attr in _INTROSPECTION:
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
        if isinstance(node.func, ast.Attribute):
            if node.func.attr in _WRITE_METHODS and not isinstance(node.func.value, ast.Constant):
                self.flag(node, f"calls .{node.func.attr}() (changes files)")
            if node.func.attr == "open" and len(node.args) >= 1:
                mode_text = self.text(node.args[0])
                if mode_text and set(mode_text) & set("wax+"):
                    self.flag(node, "opens a file for writing")
        self.generic_visit(node)


def scan_code(cells: list[str], resolve: Callable[[str], list[str]], *, skip: Iterable[str] = ()) \
        -> tuple[list[tuple[str, str]], list[str]]:
    """Read a notebook's code cells (plain Python) as syntax trees.

    Returns ``(reached, flags)``: ``reached`` pairs each off-limits entry the code reaches (via
    ``resolve``: a dotted name -> the entries it reaches) with a description of where; ``flags``
    describes code to review (patching libraries, processes, frames, files, ...). Cells equal to
    one of ``skip`` (the canonical setup cell) and cells that do not parse are left out.
    """
    skip, reached, flags, aliases, strings = set(skip), [], [], {}, {}
    for index, source in enumerate(cells):
        if source in skip:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        title = _cell_title(source)
        scanner = _Scanner(resolve, index, title)
        scanner.aliases, scanner.strings = aliases, strings       # names carry over between cells
        scanner.visit(tree)
        reached += [(entry, (f"as {spelled} " if spelled != entry else "") + f"({title}, line {line})")
                    for entry, spelled, line in scanner.reached]
        flags += [f"{what} ({title}, line {line})" for line, what in scanner.flags]
    return reached, list(dict.fromkeys(flags))


