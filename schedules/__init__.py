"""Schedule rules per target: ``schedules/cpu/`` (LLVM) and ``schedules/cuda/``.

``apply(func, kind, pattern)`` schedules an unscheduled PrimFunc. A family may name a *pattern*
(``gemm``, ``scan``, ...); if ``schedules/<kind>/<pattern>.py`` exists its ``schedule(sch)`` is used,
otherwise the target's generic rules, which pick a rule per block by loop-nest shape (elementwise,
row/column reduction). Rules never look at op names. Adding a pattern is adding a file.
"""

from __future__ import annotations

import importlib
import pathlib

__all__ = ["apply", "source_files", "pattern_module", "TARGET_FLAG"]

# The scalar parameter by which a kernel with a CPU and a CUDA form picks one (1 on CUDA); the
# target's rules fix it before scheduling.
TARGET_FLAG = "tvmgrad_on_cuda"

_HERE = pathlib.Path(__file__).parent
_KINDS = {"llvm": "cpu", "cuda": "cuda"}   # TVM target kind -> rule directory


def _dir(target_kind: str) -> str:
    if target_kind not in _KINDS:
        raise ValueError(f"no schedules for target kind {target_kind!r} (have {sorted(_KINDS)})")
    return _KINDS[target_kind]


def pattern_module(target_kind: str, pattern: str):
    """The module scheduling ``pattern`` on ``target_kind`` (the generic rules if none)."""
    sub = _dir(target_kind)
    if pattern and (_HERE / sub / f"{pattern}.py").exists():
        return importlib.import_module(f"{__name__}.{sub}.{pattern}")
    return importlib.import_module(f"{__name__}.{sub}")


def apply(func, target, pattern: str = "generic"):
    """Schedule an unscheduled PrimFunc for a ``tvm.target.Target``; -> IRModule.

    A rule module's ``schedule(sch, target)`` schedules in place and returns the IRModule (it may
    return another one, e.g. from dlight)."""
    from tvm import s_tir
    sch = s_tir.Schedule(func)
    return pattern_module(target.kind.name, pattern).schedule(sch, target)


def source_files(target_kind: str, pattern: str = "generic") -> list[str]:
    """The rule files that decide a schedule: the generic rules and their helpers, and the
    pattern's module. (What those import is followed by ``tvmgrad.sources``, from the source
    text: a module's globals would depend on which modules the process happened to import.)"""
    sub = _HERE / _dir(target_kind)
    files = [_HERE / "__init__.py", _HERE / "analysis.py", _HERE / "loops.py", sub / "__init__.py"]
    files += [p for p in sorted(sub.glob("_*.py")) if p.name != "__init__.py"]   # generic helpers
    if pattern and (sub / f"{pattern}.py").exists():
        files.append(sub / f"{pattern}.py")
    return [str(f) for f in dict.fromkeys(files)]
