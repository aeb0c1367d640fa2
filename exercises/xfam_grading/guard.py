"""Off-limits library names in a live process: resolving them and the tripwires that catch a call."""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import inspect
import pkgutil
import sys
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
    """``{question: [dotted, ...]}`` -> ``{dotted: (object, questions)}``; a module stands for all its members."""
    out: dict[str, tuple[Any, list[str]]] = {}
    for question, names in off_limits.items():
        for dotted in names:
            obj = resolve_live(dotted)
            pairs = _members(obj) if isinstance(obj, type(sys)) else [(dotted, obj)]
            for name, member in pairs:
                out.setdefault(name, (member, []))[1].append(question)
    return out


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


class _Guard:
    """Tripwires on off-limits library callables: a call from the student's code raises `OffLimitsError`.

    Library code that calls such a function by its own global name (``MultiHeadAttention.forward``
    calling ``scaled_dot_product_attention``) is let through; any other caller is the student's
    code. Modules imported or reloaded later get the tripwires too.
    """

    def __init__(self, off_limits: dict[str, list[str]]):
        self.entries = expand_off_limits(off_limits)
        self.library = _library_code()
        self.question: str | None = None
        self.violations: dict[str, list[str]] = {}
        self.wrapped: dict[int, Callable] = {}          # id(original) -> tripwire
        self.undo: list[Callable[[], None]] = []
        self.finder: _GuardFinder | None = None

    # ---- the check
    def check(self, dotted: str, names: set[str], frame) -> None:
        code = frame.f_code
        if id(code) in self.library:        # the library's own code (by identity), calling by a name it holds
            obj = self.entries[dotted][0]
            bound = (obj, self.wrapped.get(id(obj), obj))
            held = [n for n in code.co_names if any(frame.f_globals.get(n, self) is o for o in bound)]
            if held or names & set(code.co_names) or code.co_name == "__init__":
                return
        questions = self.entries[dotted][1]
        hit = questions if self.question is None else [q for q in questions if q == self.question]
        if not hit:
            return
        for q in hit:
            seen = self.violations.setdefault(q, [])
            if not any(v.startswith(f"calls {dotted} ") for v in seen):
                seen.append(f"calls {dotted} (first from {code.co_name}() while {q}'s checks ran)")
        raise OffLimitsError(f"{dotted} is off limits in this question: the question asks you to write it yourself")

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
                (original or super(obj, self).__init__)(self, *args, **kwargs)

            obj.__init__ = __init__
            self.undo.append(lambda: setattr(obj, "__init__", original) if original else delattr(obj, "__init__"))
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
        self.finder = _GuardFinder(self)
        sys.meta_path.insert(0, self.finder)
        return self

    def uninstall(self) -> None:
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


