"""The package's modules import each other one way: no cycles, function-local imports included
(a local import only hides a cycle: the modules still need each other to work, and a change to
either ripples into both). And te_defs/ (the math) imports nothing from schedules/.

The graph is read from the source with ``ast``: every ``import`` / ``from ... import`` statement
anywhere in a module of tvmgrad/, te_defs/ and schedules/, under the names they install as
(tvmgrad.te_defs..., tvmgrad.schedules...); ``from pkg import name`` is an edge to the submodule
``pkg.name`` when there is one, else to ``pkg``."""

from __future__ import annotations

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
TREES = {"tvmgrad": "tvmgrad", "te_defs": "tvmgrad.te_defs", "schedules": "tvmgrad.schedules"}


def _modules() -> dict[str, pathlib.Path]:
    """Installed module name -> source file."""
    mods = {}
    for folder, package in TREES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([package, *parts])] = path
    return mods


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a (possibly relative) ``from`` import's module."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


@functools.cache
def _graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """(module -> modules it imports, (importer, imported) -> ["file:line", ...])."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    where: dict[tuple[str, str], list[str]] = {}

    def known(name: str) -> str | None:
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else None

    for module, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.level, node.module)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in filter(None, map(known, targets)):
                if target != module:
                    edges[module].add(target)
                    lines = where.setdefault((module, target), [])
                    line = f"{path.relative_to(ROOT)}:{node.lineno}"
                    if line not in lines:
                        lines.append(line)
    return edges, where


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_top_level_function_local_and_relative_imports():
    """The reader itself: known edges of each kind are found (an empty graph has no cycles)."""
    edges, _ = _graph()
    assert "tvmgrad.cache" in edges["tvmgrad.runtime"]                      # top level, relative
    assert "tvmgrad.tuned" in edges["tvmgrad.build"]                        # function-local
    assert "tvmgrad.schedules.analysis" in edges["tvmgrad.schedules.cpu"]   # installed name, ``..``
    assert any(b.startswith("tvmgrad.te_defs.") for a in edges if a.startswith("tvmgrad.te_defs.")
               for b in edges[a])                                           # te_defs among themselves


def test_no_import_cycles():
    edges, where = _graph()
    cycles = _cycles(edges)
    report = []
    for component in cycles:
        members = set(component)
        report.append(f"cycle of {len(component)} modules: {', '.join(component)}")
        for a in component:
            for b in sorted(edges[a] & members):
                report.append(f"    {a} -> {b}   ({', '.join(where[(a, b)])})")
    assert not cycles, "import cycles (function-local imports count):\n" + "\n".join(report)


def test_te_defs_import_nothing_from_schedules():
    """te_defs is the math: how a kernel is scheduled must not reach into what it computes."""
    edges, where = _graph()
    bad = [f"{a} -> {b}   ({', '.join(where[(a, b)])})"
           for a in sorted(edges) if a.startswith("tvmgrad.te_defs")
           for b in sorted(edges[a]) if b == "tvmgrad.schedules" or b.startswith("tvmgrad.schedules.")]
    assert not bad, "te_defs modules importing schedules:\n" + "\n".join(bad)
