"""Which source files shape a kernel's generated code, and their digest (part of every cache key).

A kernel's code is decided by its op's te_defs module, its family's classes, the schedule rules
and every tvmgrad module those import, transitively: ``source_files`` finds them by reading the
imports from the source (``ast``), so nothing a kernel depends on can be edited without its key
changing. ``source_digest`` hashes them with the tvmgrad version.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import pathlib
import sys

from . import _version

__all__ = ["file_digest", "source_files", "source_digest"]


@functools.cache
def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (memoised: a process sees each source as it first read it)."""
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


# -- what a kernel's code depends on ---------------------------------------------------------------
#
# Modules never followed (nor hashed) when an import names them: they cannot shape a kernel's TIR.
# The package facade ``tvmgrad`` (its version is hashed instead; following it would pull in the
# runtime and so everything), the runtime and its TVM-runtime loader, the kernel cache and AOT
# packaging (they store, load and call compiled code), the front ends and tools (CLI, checks,
# benchmarks, their workloads and references, examples, Relax), tuning and tuned schedules (a tuned
# plan's trace is part of its key; the kernel cache adds tuned.py, which replays it, for such
# plans) and this module (it reads sources, it does not shape code).
_NOT_CODEGEN = ("tvmgrad.__main__", "tvmgrad.runtime", "tvmgrad.rt", "tvmgrad.cache",
                "tvmgrad.aot", "tvmgrad.cli", "tvmgrad.check", "tvmgrad.bench", "tvmgrad.workloads",
                "tvmgrad.benchrefs", "tvmgrad.examples", "tvmgrad.relax", "tvmgrad.tune",
                "tvmgrad.tuned", "tvmgrad.sources")
_PACKAGE = __name__.rpartition(".")[0]        # "tvmgrad"


def _internal(name: str) -> bool:
    """A tvmgrad module (te_defs/ and schedules/ install as tvmgrad.te_defs, tvmgrad.schedules)
    that may shape generated code."""
    if not name.startswith(_PACKAGE + "."):
        return False                         # not ours, or the package facade (see above)
    return not any(name == x or name.startswith(x + ".") for x in _NOT_CODEGEN)


@functools.cache
def _find(name: str) -> tuple[str, tuple[str, ...] | None] | None:
    """(source file, submodule search path or None) of module ``name``, found as Python's import
    system would (``sys.meta_path``: it knows the package-dir mapping of te_defs/ and schedules/)
    but without importing anything; None for a name that is no module (``from mod import fn``)."""
    import importlib.util
    parent, _, _ = name.rpartition(".")
    module = sys.modules.get(name)
    if module is not None:
        spec = getattr(module, "__spec__", None)
    elif not parent:
        spec = importlib.util.find_spec(name)
    else:
        found = _find(parent)
        if found is None or found[1] is None:
            return None                      # a name inside a module, not a submodule
        spec = None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(name, list(found[1])) if find_spec else None
            if spec is not None:
                break
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    search = spec.submodule_search_locations
    return spec.origin, None if search is None else tuple(search)


def _statements(body):
    """Every statement of a body, nested ones included (imports are statements: no need to visit
    expressions)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            sub = getattr(node, field, None)
            if isinstance(sub, list):
                yield from _statements(sub)


def _parse(path: str, digest: str):
    """The AST of a file (callers memoise on ``digest``, its content's: an edited file is parsed
    again)."""
    return ast.parse(pathlib.Path(path).read_bytes(), filename=path)


@functools.lru_cache(maxsize=None)
def _bound_names(path: str, digest: str) -> frozenset[str]:
    """Names a module binds at its top level (defs, classes, assignments, imports)."""
    names = set()
    for node in _parse(path, digest).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


@functools.lru_cache(maxsize=None)
def _import_statements(name: str, path: str, is_package: bool, digest: str):
    """A module's imports of tvmgrad modules, at any depth (function-local ones count), relative
    ones resolved: (module, names) per statement, names None for ``import module``."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in _statements(_parse(path, digest).body):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 >= len(parts):
                    continue                 # beyond the top-level package: not ours
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((module, tuple(a.name for a in node.names)))
    return tuple((m, n) for m, n in found if m == _PACKAGE or m.startswith(_PACKAGE + "."))


def _imports(name: str, path: str, is_package: bool) -> list[str]:
    """The tvmgrad modules a module imports. ``from pkg import x`` names ``pkg.x`` when that is a
    submodule (and ``pkg`` as well when its ``__init__`` binds ``x`` itself, a re-export such as
    ``tvmgrad.families.pointwise``), else ``pkg``; the parent packages that Python also runs on the
    way are not followed unless named."""
    found = []
    for module, names in _import_statements(name, path, is_package, file_digest(path)):
        if names is None:
            found.append(module)
            continue
        where = _find(module)
        if where is None:
            continue
        for alias in names:
            sub = f"{module}.{alias}"
            if where[1] is not None and alias != "*" and _find(sub) is not None:
                found.append(sub)
                if alias in _bound_names(where[0], file_digest(where[0])):
                    found.append(module)
            else:
                found.append(module)
    return [m for m in dict.fromkeys(found) if _internal(m)]


def _closure(seeds) -> dict[str, str]:
    """module name -> file of the seeds ((name, file) pairs) and every tvmgrad module they import,
    transitively (seeds are kept whatever their name: a te_defs module loaded from elsewhere)."""
    files: dict[str, str] = {}
    todo = list(reversed(seeds))             # popped from the end: the first seed of a name wins
    while todo:
        name, path = todo.pop()
        if name in files:
            continue
        if path is None:
            where = _find(name)
            if where is None:
                continue
            path = where[0]
        files[name] = path
        is_package = pathlib.Path(path).name == "__init__.py"
        todo += [(m, None) for m in _imports(name, path, is_package) if m not in files]
    return files


def _class_seeds(impl):
    """(module, file) of the implementation's class and its bases, and, for an op defined as a
    call of another (an invoke op), the same for the op it calls."""
    seeds = [(impl.module, impl.source_file)]
    for cls in type(impl).__mro__:
        if _internal(cls.__module__) or cls.__module__ == impl.module:
            try:
                seeds.append((cls.__module__, inspect.getsourcefile(cls)))
            except TypeError:                # a built-in class
                pass
    forward = getattr(impl, "forward", None)
    if forward is not None and getattr(forward, "impl", None) is not None:
        seeds += _class_seeds(forward.impl)
    return seeds


def _schedule_seeds(target_kind: str, pattern: str):
    """(module, file) of the schedules files that decide the schedule (``schedules.source_files``:
    the generic rules and the pattern's module, whose imports the AST closure follows)."""
    from . import schedules
    root = pathlib.Path(schedules.__file__).parent
    for f in schedules.source_files(target_kind, pattern):
        rel = pathlib.Path(f).relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join((schedules.__name__, *parts)), f


def source_files(impl, target_kind: str, pattern: str = "generic") -> dict[str, str]:
    """module name -> file, for every source file that shapes an op's generated code on a target
    kind (what ``source_digest`` hashes; see there)."""
    seeds = [*_class_seeds(impl), *_schedule_seeds(target_kind, pattern)]
    if target_kind == "llvm":                           # the intrinsic lowering it installs
        seeds.append((f"{_PACKAGE}.fastmath", str(pathlib.Path(__file__).parent / "fastmath.py")))
    seeds.append((f"{_PACKAGE}.build", str(pathlib.Path(__file__).parent / "build.py")))  # lowering
    return _closure(seeds)


def source_digest(impl, target_kind: str, pattern: str = "generic") -> str:
    """Hash of every source file that shapes an op's generated code for a target kind, and of
    the tvmgrad version (``tvmgrad._version``).

    The files (``source_files``): the op's te_defs module; the module of its implementation class
    and of every base class (the MRO: families/tensor.py and families/base.py under a te_defs
    ``TensorOp`` subclass, families/pointwise.py under ``Mixed``); for an invoke op the same for
    the forward op it calls; the schedule rules for the target kind (``schedules.source_files``)
    and the pattern's module; for LLVM fastmath.py (intrinsic lowering); and, transitively,
    every tvmgrad module any of those imports -- plus build.py (lowering, compilation).

    Imports are read from the source with ``ast`` (function-local ones included, relative ones
    resolved) and mapped to files as the import system would (te_defs/ and schedules/ install as
    tvmgrad.te_defs and tvmgrad.schedules). So dtypes.py, families/complex.py, infer_meta/__init__.py
    and the infer_meta and te_defs/_*.py helper modules an op's module imports are covered; a
    te_defs module that imports another (conv.py -> _dense.py, loss.py -> norm.py) depends on it,
    and editing one that no other imports changes the digest of its own ops only. Not followed:
    the modules in ``_NOT_CODEGEN``, which store, load, call or drive kernels without shaping their
    code, and modules imported by computed name (``importlib.import_module``; the schedules'
    pattern modules are named by ``schedules.source_files``).

    Not covered: the op's backward.yaml entry (its arg names, dtypes and code-changing attrs are
    in the plan key) and the CUDA compiler setup (TVM exports CUDA source; tvmgrad.cuda compiles
    it at load time and caches the cubin by source text).

    Per-file work (hash, parse, import list) is memoised, keyed on the file's digest; an edited
    file is seen after ``file_digest.cache_clear()`` (a new process sees it anyway).
    """
    h = hashlib.sha256(f"tvmgrad {_version.__version__}\n".encode())
    for f in sorted(set(source_files(impl, target_kind, pattern).values())):
        h.update(file_digest(f).encode())
    return h.hexdigest()
