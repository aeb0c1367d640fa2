"""Off-limits library names in a live process: resolving them and the tripwires that catch a call."""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import os
import pkgutil
import sys
import weakref
from typing import Any, Callable

from .checks import OffLimitsError


# ============================================================================= off-limits names in a live process
def resolve_live(dotted: str) -> Any:
    """The object a dotted library path names, importing the longest importable module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {dotted}")


def _members(module) -> list[tuple[str, Any]]:
    """The functions and classes a library module defines itself: its public ones and its private
    functions (a module placed off limits covers the helpers that do its work, e.g. ``_linear_chunk``).
    A package (``xfam_lib.ssm``) covers what each of its modules defines."""
    modules = [module]
    if hasattr(module, "__path__"):
        modules += [importlib.import_module(info.name)
                    for info in pkgutil.walk_packages(module.__path__, module.__name__ + ".")]
    return [(f"{m.__name__}.{k}", v) for m in modules for k, v in vars(m).items()
            if callable(v) and getattr(v, "__module__", None) == m.__name__ and not k.startswith("__")
            and (not k.startswith("_") or inspect.isfunction(v))]


def expand_off_limits(off_limits: dict[str, list[str]]) -> dict[str, tuple[Any, list[str]]]:
    """``{question: [dotted, ...]}`` -> ``{dotted: (object, questions)}``; a module stands for all its members.

    One entry per object: a second spelling of it (a re-export, ``xfam_lib.sparse.pattern_mask`` and
    ``xfam_lib.sparse.gallery.pattern_mask``) adds its questions to the entry of the first.
    """
    out: dict[str, tuple[Any, list[str]]] = {}
    by_id: dict[int, str] = {}
    for question, names in off_limits.items():
        for dotted in names:
            obj = resolve_live(dotted)
            pairs = _members(obj) if isinstance(obj, type(sys)) else [(dotted, obj)]
            for name, member in pairs:
                questions = out.setdefault(by_id.setdefault(id(member), name), (member, []))[1]
                if question not in questions:
                    questions.append(question)
    return out


def _library_members() -> dict[str, Any]:
    """Every function and class of every library module (`_module_members`), by dotted home."""
    _library_code()
    out: dict[str, Any] = {}
    for name, module in sorted(sys.modules.items()):
        if name == "xfam_lib" or name.startswith("xfam_lib."):
            out.update(_module_members(module))
    return out


def call_graph() -> dict[str, set[str]]:
    """``dotted -> the library members its code names``: a function's (and its nested functions')
    global names and the attributes of library modules it reads; a class's, over all its methods."""
    members = _library_members()
    by_id = {id(obj): dotted for dotted, obj in members.items()}
    graph: dict[str, set[str]] = {}
    for dotted, obj in members.items():
        codes: dict[int, Any] = {}
        _code_objects(obj, codes)
        module = sys.modules.get(obj.__module__)
        scope = vars(module) if module else {}
        callees = set()
        for code in codes.values():
            for name in code.co_names:
                target = scope.get(name)
                if id(target) in by_id:
                    callees.add(by_id[id(target)])
                elif name not in scope:            # module.attr: an attribute of a library module it holds
                    for held in (v for v in scope.values() if isinstance(v, type(sys))
                                 and v.__name__.startswith("xfam_lib")):
                        if id(vars(held).get(name)) in by_id:
                            callees.add(by_id[id(vars(held)[name])])
        graph[dotted] = callees - {dotted}
    return graph


def implied_off_limits(off_limits: dict[str, list[str]], library: list[str] = ()) -> dict[str, list[str]]:
    """Per part, the library functions and classes that call one of its off-limits names (directly or
    through other library code, `call_graph`): a student asked to write ``returns_to_go`` may not get it
    from ``reinforce_loss``. A private function named after an off-limits private one
    (``_linear_chunk_reference`` beside ``_linear_chunk``) is another form of it, so it is implied too.
    The names the notebook was given (``library``) stay usable."""
    graph = call_graph()
    given = allowed_homes(list(library)) if library else ()
    implied = {}
    for question, names in off_limits.items():
        targets = set(expand_off_limits({question: names}))
        homes = set()
        for dotted in targets:
            with contextlib.suppress(Exception):
                obj = resolve_live(dotted)
                homes.add(dotted if isinstance(obj, type(sys)) else f"{obj.__module__}.{obj.__qualname__}")
        forms = {d for d in graph for h in homes if h.rpartition(".")[2].startswith("_")
                 and d.startswith(h + "_") and "." not in d[len(h):]}
        reach, grew = homes | targets | forms, True
        while grew:
            callers = {d for d, callees in graph.items() if d not in reach and callees & reach}
            grew = bool(callers)
            reach |= callers
        extra = sorted(d for d in reach - homes - targets if d in graph and not _allowed(d, given) and d not in names)
        if extra:
            implied[question] = extra
    return implied


def config_off_limits(config: dict) -> dict[str, list[str]]:
    """A judge config's off-limits names per part: the master's (``off_limits``) and those they imply
    (``implied_off_limits``, written by the build with `implied_off_limits`)."""
    merged = {q: list(v) for q, v in config.get("off_limits", {}).items()}
    for q, extra in config.get("implied_off_limits", {}).items():
        merged.setdefault(q, [])
        merged[q] += [d for d in extra if d not in merged[q]]
    return merged


def off_limits_resolver(entries: dict[str, tuple[Any, list[str]]]) -> Callable[[str], list[str]]:
    """For `scan_code`: the off-limits entries (of `expand_off_limits`) a dotted name reaches, by identity.

    ``m.*`` (a star import) reaches every entry of module ``m`` (of a package, every entry below it). Only ``xfam_lib`` and ``torch``
    names are imported to be resolved (in the judge, before any student code runs).
    """
    by_id = {id(obj): dotted for dotted, (obj, _) in entries.items()}

    def resolve(dotted: str) -> list[str]:
        if dotted.endswith(".*"):
            return [d for d in entries if d.startswith(dotted[:-1])]
        if dotted.split(".")[0] not in ("xfam_lib", "torch"):
            return []
        try:
            obj = resolve_live(dotted)
        except Exception:
            return []
        return [by_id[id(obj)]] if id(obj) in by_id else []

    return resolve


def _code_objects(obj: Any, out: dict[int, Any]) -> None:
    """Every code object of a function, or of the functions, methods and properties of a class."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                _code_objects(f, out)
        return
    if isinstance(obj, type):
        for value in vars(obj).values():
            if not isinstance(value, type) or value.__qualname__.startswith(obj.__qualname__ + "."):
                _code_objects(value, out)
        return
    stack = [getattr(obj, "__code__", None)]
    if getattr(stack[0], "co_filename", None) == __file__:      # a tripwire of ours, never the library
        return
    while stack:
        code = stack.pop()
        if isinstance(code, type(_code_objects.__code__)) and id(code) not in out:
            out[id(code)] = code
            stack += [c for c in code.co_consts if isinstance(c, type(code))]


_LIBRARY: dict[int, Any] = {}          # id -> code object of the library (kept alive here)
_SOURCES: dict[str, bytes] = {}        # module name -> its source file's bytes when first seen


def _module_code(module) -> None:
    """Add a library module's code objects to `_LIBRARY`, if its file is the one first seen."""
    name, path = module.__name__, getattr(module, "__file__", None)
    try:
        source = open(path, "rb").read() if path else b""
    except OSError:
        return
    if _SOURCES.setdefault(name, source) != source:        # the file was changed since: not the library
        return
    for value in list(vars(module).values()):
        if getattr(value, "__module__", None) == name:
            _code_objects(value, _LIBRARY)


def _library_code() -> dict[int, Any]:
    """The code objects of every ``xfam_lib`` function and method, by id.

    Every library module is imported the first time, before any submission code runs; a module
    executed again (a reload) counts only if its file is unchanged since it was first read. Code with a forged file
    name, or a function built from a forged code object, is never the library's.
    """
    if not _LIBRARY:
        import xfam_lib

        for info in pkgutil.iter_modules(xfam_lib.__path__):
            with contextlib.suppress(Exception):
                importlib.import_module(f"xfam_lib.{info.name}")
    for name, module in list(sys.modules.items()):
        if name == "xfam_lib" or name.startswith("xfam_lib."):
            _module_code(module)
    return _LIBRARY


def _module_members(module) -> dict[str, Any]:
    """The functions and classes (private ones too) a library module defines itself, by dotted name."""
    name = getattr(module, "__name__", "")
    return {f"{name}.{key}": value for key, value in list(vars(module).items())
            if (inspect.isfunction(value) or isinstance(value, type)) and not key.startswith("__")
            and getattr(value, "__module__", None) == name}


def _allowed(dotted: str, allowed: tuple[str, ...]) -> bool:
    """Whether the library member ``dotted`` (its home: ``module.name``) is under an allowed name."""
    return any(dotted == n or dotted.startswith(n + ".") for n in allowed)


def allowed_homes(library: list[str] = ()) -> tuple[str, ...]:
    """The homes (``module.qualname``) of the library names a notebook may use: `scanner.LIBRARY_ALWAYS`
    and ``library`` (re-exports such as ``xfam_lib.sparse.dense_masked_attention`` resolved to their module)."""
    from .scanner import LIBRARY_ALWAYS

    homes = []
    for dotted in (*LIBRARY_ALWAYS, *library):
        try:
            obj = resolve_live(dotted)
        except Exception:
            continue
        module = getattr(obj, "__module__", None)
        homes.append(dotted if isinstance(obj, type(sys)) or not isinstance(module, str)
                     else f"{module}.{getattr(obj, '__qualname__', dotted.rsplit('.', 1)[-1])}")
    return tuple(homes)


def _wired_methods(cls: type) -> list[str]:
    """The methods of a library class that get a tripwire: ``__init__``, ``forward`` and every method
    that no base class outside the library defines (those, e.g. ``extra_repr``, torch calls itself)."""
    outside = [b for b in cls.__mro__[1:] if not str(getattr(b, "__module__", "")).startswith("xfam_lib")]
    names = []
    for key, value in list(vars(cls).items()):
        func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if not inspect.isfunction(func):
            continue
        if key in ("__init__", "forward", "__call__") or (
                not key.startswith("__") and not any(key in vars(b) for b in outside)):
            names.append(key)
    return names


@functools.lru_cache(maxsize=None)
def _neutral_roots() -> tuple[tuple[str, ...], str]:
    """Folders whose code neither is the library nor the student's (torch, the standard library, the
    installed packages, this package), and the library's own folder."""
    import sysconfig

    import torch
    import xfam_lib

    paths = {os.path.dirname(torch.__file__), os.path.dirname(__file__), sys.base_prefix, sys.prefix}
    paths |= {v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {p for p in sys.path if p.endswith("site-packages")}
    roots = tuple(sorted({os.path.realpath(p) + os.sep for p in paths if p} | {p + os.sep for p in paths if p}))
    return roots, os.path.realpath(os.path.dirname(xfam_lib.__file__)) + os.sep


@functools.lru_cache(maxsize=4096)
def is_neutral(filename: str) -> bool:
    """Code of torch, the standard library, the packages, the grader or a test's adapter (``<check ...>``)."""
    roots, library = _neutral_roots()
    if filename.startswith(("<frozen ", "<check ", "<string>")):
        return True
    if filename.startswith("<") or os.path.realpath(filename).startswith(library):
        return False          # a cell, or a file named like the library's that is not its code
    return filename.startswith(roots)


def _caller(frame, library: dict[int, Any]) -> tuple[str, Any, bool]:
    """``(kind, frame, walked)``: the first frame from ``frame`` outwards that is the library's code
    (``library``) or the student's (``student``), skipping torch, the standard library and the grader;
    ``none`` if a test's adapter comes first, or there is neither. ``walked``: frames were skipped."""
    walked = False
    while frame is not None:
        code = frame.f_code
        if id(code) in library:
            return "library", frame, walked
        if code.co_filename.startswith("<check "):      # a test's adapter: the test's own call
            return "none", None, walked
        if not is_neutral(code.co_filename):
            return "student", frame, walked
        frame, walked = frame.f_back, True
    return "none", None, walked


_GIVEN_KEY = "_xfam_given"
_INSTALLED: dict[str, Any] = {"guard": None}     # the guard whose tripwires are in place (`installed_guard`)


def installed_guard() -> "_Guard | None":
    """The guard installed in this process, if any (a child process started by a check reports to it)."""
    return _INSTALLED["guard"]


class _Given:
    """The mark an instance the tests built carries in its ``__dict__``, one per library class; a copy of
    the instance (``copy.deepcopy``, as a student's answer may make of a given layer) keeps it."""
    __slots__ = ()

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class _Guard:
    """Tripwires on library callables: a call from the student's code raises `OffLimitsError`.

    Two kinds: the part's ``off_limits`` names (closed under the library's own calls, see
    `close_off_limits`), and, given ``allowed`` (`allowed_homes`), every library function, class
    and class method that is not on the notebook's allowlist; a call of one of those costs the
    part whose checks run, or every part while the notebook's cells run. The caller is the first
    frame outwards that is the library's (by the identity of its code objects) or not torch's,
    the standard library's, the grader's or a test adapter's: a student's function handed to
    torch, or code compiled under a forged file name, is still the student's. Library code that
    calls an off-limits function by its own global name (``MultiHeadAttention.forward`` calling
    ``scaled_dot_product_attention``) is let through. Modules imported or reloaded later get the
    tripwires too.
    """

    def __init__(self, off_limits: dict[str, list[str]], allowed: tuple[str, ...] | None = None,
                 parts: list[str] = ()):
        self.entries = expand_off_limits(off_limits)
        self.library = _library_code()
        self.allowed = allowed
        self.parts = list(parts) or sorted(off_limits)
        self.outside: set[int] = set()                  # ids of the library objects off the allowlist
        self.outside_of: dict[str, int] = {}            # entry name -> id of its object
        self.question: str | None = None
        self.violations: dict[str, list[str]] = {}
        self.flags: list[str] = []
        self.given: weakref.WeakSet = weakref.WeakSet()  # instances the tests built: their methods are theirs to use
        self.marks: dict[int, _Given] = {}              # id(library class) -> the mark of its given instances
        self.wrapped: dict[int, Callable] = {}          # id(original) -> tripwire
        self.undo: list[Callable[[], None]] = []
        self.finder: _GuardFinder | None = None

    def is_given(self, instance, cls: type) -> bool:
        """Whether the tests built ``instance`` (of the library class ``cls``), or it is a copy of one they
        built (``copy.deepcopy`` keeps the mark `_Given` leaves in its ``__dict__``)."""
        with contextlib.suppress(TypeError):
            if instance in self.given:
                return True
        mark = self.marks.get(id(cls))
        return mark is not None and getattr(instance, "__dict__", {}).get(_GIVEN_KEY) is mark

    def mark_given(self, instance, cls: type) -> None:
        with contextlib.suppress(TypeError):
            self.given.add(instance)
        with contextlib.suppress(AttributeError, TypeError):
            vars(instance)[_GIVEN_KEY] = self.marks.setdefault(id(cls), _Given())

    # ---- the check
    def check(self, dotted: str, names: set[str], frame, label: str | None = None) -> None:
        kind, caller, walked = _caller(frame, self.library)
        if kind == "none":
            return
        off = dotted in self.entries
        obj = self.entries[dotted][0] if off else None
        if kind == "library":
            if not off or walked:       # off the allowlist only, or reached through torch: the library's use
                return
            code = caller.f_code
            bound = (obj, self.wrapped.get(id(obj), obj))
            held = [n for n in code.co_names if any(caller.f_globals.get(n, self) is o for o in bound)]
            if held or names & set(code.co_names) or code.co_name == "__init__":
                return
        label = label or dotted
        where = f"while {self.question}'s checks ran" if self.question else "while the notebook's cells ran"
        hits: list[tuple[str, str]] = []
        if off:
            questions = self.entries[dotted][1]
            hits += [(q, f"calls {label}") for q in questions if self.question in (None, q)]
        if self.outside_of.get(dotted) in self.outside:
            hits += [(q, f"calls {label}, which is not among the library names this notebook may use")
                     for q in ([self.question] if self.question else self.parts)]
        if not hits:
            return
        off = any(not text.endswith("may use") for _, text in hits)
        for q, text in hits:
            seen = self.violations.setdefault(q, [])
            if not any(v.startswith(text + " (") for v in seen):
                seen.append(f"{text} (first from {caller.f_code.co_name}() {where})")
        raise OffLimitsError(f"{label} is off limits in this question: the question asks you to write it yourself"
                             if off else f"{label} is not among the library names this notebook may use")

    @contextlib.contextmanager
    def active(self, question: str):
        self.question = question
        try:
            yield
        finally:
            self.question = None

    # ---- installing
    def _tripwire(self, dotted: str, obj: Any) -> Any:
        if id(obj) in self.wrapped:
            return self.wrapped[id(obj)]
        guard, names = self, {dotted.rsplit(".", 1)[-1], getattr(obj, "__name__", "")}
        if isinstance(obj, type):
            original = obj.__dict__.get("__init__")

            def __init__(self, *args, **kwargs):
                guard.check(dotted, names, sys._getframe(1))
                if not _student_frames(sys._getframe(1), guard.library):    # built by the tests: given
                    guard.mark_given(self, obj)
                (original or super(obj, self).__init__)(self, *args, **kwargs)

            with contextlib.suppress(AttributeError, TypeError):
                obj.__init__ = __init__
                self.undo.append(lambda: setattr(obj, "__init__", original) if original else delattr(obj, "__init__"))
            for key in _wired_methods(obj):                 # forward, update, ...: an instance made any other way
                if key != "__init__":
                    self._wire_method(obj, key, dotted)
            self.wrapped[id(obj)] = obj
            return obj

        def tripwire(*args, **kwargs):
            guard.check(dotted, names, sys._getframe(1))
            return obj(*args, **kwargs)

        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(tripwire, attr, getattr(obj, attr))
        self.wrapped[id(obj)] = tripwire
        return tripwire

    def _wire_method(self, cls: type, key: str, dotted: str) -> None:
        """Replace the method ``key`` of the library class ``cls`` by a tripwire for the entry ``dotted``."""
        raw = vars(cls)[key]
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        func = raw.__func__ if kind else raw
        guard, names = self, {key}

        def method(*args, **kwargs):
            if not (args and isinstance(args[0], cls) and guard.is_given(args[0], cls)):
                guard.check(dotted, names, sys._getframe(1), f"{dotted}.{key}")
            return func(*args, **kwargs)

        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            with contextlib.suppress(AttributeError, TypeError):
                setattr(method, attr, getattr(func, attr))
        with contextlib.suppress(AttributeError, TypeError):
            setattr(cls, key, kind(method) if kind else method)
            self.undo.append(lambda: setattr(cls, key, raw))

    def wire_outside(self, module) -> None:
        """Tripwires on every function and class of a library module that is not on the notebook's allowlist."""
        if self.allowed is None:
            return
        by_id = {id(obj): d for d, (obj, _) in self.entries.items()}
        for dotted, obj in _module_members(module).items():
            if _allowed(dotted, self.allowed) or id(obj) in self.outside:
                continue
            self.outside.add(id(obj))
            self.outside_of[by_id.get(id(obj), dotted)] = id(obj)   # an off-limits object keeps its entry's wire
            if id(obj) not in self.wrapped:
                self._tripwire(dotted, obj)
        self.patch_module(module)

    def patch_module(self, module) -> None:
        """Point every name of a library module that holds an off-limits object to its tripwire."""
        name = getattr(module, "__name__", "")
        wires = {id(w) for w in self.wrapped.values()}
        for dotted, (obj, questions) in list(self.entries.items()):
            parent, _, leaf = dotted.rpartition(".")
            current = vars(module).get(leaf) if parent == name else None
            if current is not None and current is not obj and id(current) not in wires:
                self.entries[dotted] = (current, questions)         # a reload made a new object
                self._tripwire(dotted, current)
        for key, value in list(vars(module).items()):
            wire = self.wrapped.get(id(value))
            if wire is not None and wire is not value:
                setattr(module, key, wire)
                self.undo.append(lambda m=module, k=key, v=value: setattr(m, k, v))

    def install(self) -> "_Guard":
        for dotted, (obj, _) in list(self.entries.items()):
            wire = self._tripwire(dotted, obj)
            parent_path, _, leaf = dotted.rpartition(".")
            with contextlib.suppress(Exception):
                parent = resolve_live(parent_path)
                if isinstance(parent, type) and parent.__dict__.get(leaf) is obj and wire is not obj:
                    setattr(parent, leaf, wire)                 # a method: KVCache.update
                    self.undo.append(lambda c=parent, k=leaf, v=obj: setattr(c, k, v))
        for name, module in list(sys.modules.items()):
            if name == "xfam_lib" or name.startswith("xfam_lib."):
                self.patch_module(module)
        for name, module in list(sys.modules.items()):
            if name == "xfam_lib" or name.startswith("xfam_lib."):
                self.wire_outside(module)
        self.finder = _GuardFinder(self)
        sys.meta_path.insert(0, self.finder)
        _INSTALLED["guard"] = self
        return self

    def uninstall(self) -> None:
        if _INSTALLED["guard"] is self:
            _INSTALLED["guard"] = None
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        for undo in reversed(self.undo):
            undo()
        self.undo.clear()


class _GuardLoader(importlib.abc.Loader):
    def __init__(self, inner, guard: _Guard):
        self.inner, self.guard = inner, guard

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _module_code(module)
        self.guard.patch_module(module)
        self.guard.wire_outside(module)


class _GuardFinder(importlib.abc.MetaPathFinder):
    """Gives every ``xfam_lib`` module imported (or reloaded) later the tripwires too."""

    def __init__(self, guard: _Guard):
        self.guard = guard

    def find_spec(self, name, path, target=None):
        if name != "xfam_lib" and not name.startswith("xfam_lib."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _GuardLoader(spec.loader, self.guard)
        return spec




# ============================================================================= the audit hook (the runner's)
FLAGGED_MODULES = ("pkgutil", "runpy", "code", "codeop")   # run or resolve code by name: flagged when imported
_AUDIT: dict[str, Any] = {"guard": None}


@functools.lru_cache(maxsize=4096)
def _library_file(path: str) -> bool:
    """Whether ``path`` is one of the library's source or byte-code files."""
    _, library = _neutral_roots()
    return path.endswith((".py", ".pyc")) and os.path.realpath(path).startswith(library)


@functools.lru_cache(maxsize=1)
def _library_lines() -> frozenset[str]:
    """The distinctive lines (30 characters or more, stripped) of the library's source files."""
    _, library = _neutral_roots()
    lines = set()
    for folder, _, files in os.walk(library):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                    lines |= {ln.strip() for ln in f if len(ln.strip()) >= 30 and not ln.strip().startswith("#")}
    return frozenset(lines)


def _library_like(source: Any) -> bool:
    """Whether source text handed to ``compile`` is largely the library's own code."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = bytes(source).decode("utf-8", "replace")
    if not isinstance(source, str):
        try:
            import ast

            source = ast.unparse(source)
        except Exception:
            return False
    lines = [ln.strip() for ln in source.splitlines() if len(ln.strip()) >= 30 and not ln.strip().startswith("#")]
    shared = sum(ln in _library_lines() for ln in lines)
    return shared >= 3 and shared >= 0.3 * len(lines)


def _student_frames(frame, library: dict[int, Any]) -> bool:
    """Whether any frame from ``frame`` outwards, up to a test's adapter, is the student's (neither the
    library's nor neutral)."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<check "):
            return False
        if id(code) not in library and not is_neutral(code.co_filename):
            return True
        frame = frame.f_back
    return False


def _student_on_stack(guard: "_Guard") -> bool:
    return _student_frames(sys._getframe(2), guard.library)


def _imported_by_student(guard: "_Guard") -> bool:
    """Whether the import being audited is the student's own statement (not torch's or Triton's import)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(("<frozen importlib", os.path.dirname(
            importlib.__file__))):
        frame = frame.f_back
    return frame is not None and id(frame.f_code) not in guard.library and not is_neutral(frame.f_code.co_filename)


def _audit(event: str, args: tuple) -> None:
    """Refuse, from the student's code, reading the library's files, compiling code under a real file
    name or code that is the library's source, and running library-named code that is not the library's;
    flag importing `FLAGGED_MODULES`."""
    guard = _AUDIT["guard"]
    if guard is None or event not in ("open", "compile", "exec", "code.__new__", "import"):
        return
    if event == "open":
        if isinstance(args[0], int):
            return
        try:
            path = os.fsdecode(args[0])
        except Exception:
            return
        if _library_file(path) and _student_on_stack(guard):
            raise PermissionError(f"a submission may not read the library's source files ({path})")
    elif event == "compile":
        try:
            filename = os.fsdecode(args[1]) if args[1] is not None else "<unknown>"
        except Exception:
            filename = "<unknown>"
        if (not filename.startswith("<") or _library_like(args[0])) and _student_on_stack(guard):
            raise PermissionError("a submission may not compile the library's code or code under a file's name "
                                  f"({filename})")
    elif event == "exec":
        code = args[0]
        if (isinstance(code, type(_audit.__code__)) and id(code) not in guard.library
                and _library_file(code.co_filename) and _student_on_stack(guard)):
            raise PermissionError(f"a submission may not run library code that is not the library's "
                                  f"({code.co_filename})")
    elif event == "code.__new__":
        filename = args[1] if len(args) > 1 and isinstance(args[1], str) else "<unknown>"
        if not filename.startswith("<") and _student_on_stack(guard):
            raise PermissionError(f"a submission may not make code objects under a file's name ({filename})")
    elif isinstance(args[0], str) and args[0].split(".")[0] in FLAGGED_MODULES and _imported_by_student(guard):
        text = f"imports {args[0]} while it runs (runs or resolves code by name)"
        if text not in guard.flags:
            guard.flags.append(text)


def audit_with(guard: "_Guard") -> None:
    """Make ``guard`` the one the process's audit hook (installed once, never removed) answers for;
    the modules of `FLAGGED_MODULES` are dropped from ``sys.modules`` so that importing them is seen."""
    import linecache

    if not _AUDIT.get("installed"):
        _library_lines()
        sys.addaudithook(_audit)
        _AUDIT["installed"] = True
    for name in list(linecache.cache):              # library source read before: not left for the student
        if isinstance(name, str) and _library_file(name):
            linecache.cache.pop(name, None)
    for name in FLAGGED_MODULES:
        sys.modules.pop(name, None)
    _AUDIT["guard"] = guard
