"""Schedule rules per target: ``schedules/cpu/`` (LLVM) and ``schedules/cuda/``.

``apply(func, target, pattern)`` schedules an unscheduled PrimFunc. A family names its *pattern*:
``generic``, the target's generic rules (``schedules/<kind>/__init__.py``: an ordered list, the
first that fits schedules; per loop nest they pick elementwise, row or column reduction rules by
the nest's shape), or the rule of ``schedules/<kind>/<pattern>.py`` (its ``RULE``, a
``schedule_rule.ScheduleRule``). A named rule first says whether it fits the function, from its block
structure and the block annotations its TE definition sets (``schedules/fits.py``); an unknown
pattern, or one that does not fit, is an error naming the kernel, the pattern and why: nothing
falls back to another schedule. Rules never look at op names. Adding a pattern is adding a file.
"""

from __future__ import annotations

import importlib
import pathlib

__all__ = ["apply", "rule", "patterns", "pattern_module", "source_files", "PatternError",
           "GENERIC"]

GENERIC = "generic"          # the pattern of the target's generic rules

_HERE = pathlib.Path(__file__).parent
_KINDS = {"llvm": "cpu", "cuda": "cuda"}   # TVM target kind -> rule directory


class PatternError(ValueError):
    """A family names a schedule pattern that does not exist, or that does not fit its kernel."""


def _dir(target_kind: str) -> str:
    if target_kind not in _KINDS:
        raise ValueError(f"no schedules for target kind {target_kind!r} (have {sorted(_KINDS)})")
    return _KINDS[target_kind]


def patterns(target_kind: str) -> list[str]:
    """The patterns a target has rules for: ``generic`` and one per module of its directory."""
    sub = _HERE / _dir(target_kind)
    return [GENERIC] + sorted(p.stem for p in sub.glob("*.py") if not p.stem.startswith("_"))


def _path(target_kind: str, pattern: str) -> pathlib.Path:
    """The file of a pattern's rule (PatternError for an unknown pattern)."""
    sub = _HERE / _dir(target_kind)
    if pattern == GENERIC:
        return sub / "__init__.py"
    if pattern not in patterns(target_kind):
        raise PatternError(f"no schedule pattern {pattern!r} for {target_kind} (no file "
                           f"schedules/{sub.name}/{pattern}.py); the patterns are "
                           f"{', '.join(patterns(target_kind))}")
    return sub / f"{pattern}.py"


def pattern_module(target_kind: str, pattern: str):
    """The module holding ``pattern``'s rule on ``target_kind`` (PatternError if none)."""
    _path(target_kind, pattern)
    sub = _dir(target_kind)
    return importlib.import_module(f"{__name__}.{sub}" if pattern == GENERIC
                                   else f"{__name__}.{sub}.{pattern}")


def rule(target_kind: str, pattern: str):
    """``pattern``'s ``ScheduleRule`` on ``target_kind`` (PatternError if there is none)."""
    return pattern_module(target_kind, pattern).RULE


def apply(func, target, pattern: str = GENERIC):
    """Schedule an unscheduled PrimFunc for a ``tvm.target.Target`` by ``pattern``'s rule;
    -> IRModule. PatternError, naming the kernel (its ``global_symbol``), when the pattern is
    unknown or its rule does not fit the function."""
    from tvm import s_tir
    kind = target.kind.name
    symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
    kernel = f"kernel {str(symbol)!r}" if symbol is not None else "a kernel"
    try:
        chosen = rule(kind, pattern)
    except PatternError as exc:
        raise PatternError(f"{kernel}: {exc}") from None
    sch = s_tir.Schedule(func)
    why = chosen.why_not(sch)
    if why is None:
        mod = chosen.schedule(sch, target)
        if mod is not None:
            return mod
        why = "it gave up part way"
    raise PatternError(f"{kernel}: schedule pattern {pattern!r} does not fit it on {kind}: {why}")


def source_files(target_kind: str, pattern: str = GENERIC) -> list[str]:
    """The files that decide a schedule: this dispatcher and the pattern's rule module (for
    ``generic``, the target's package). What they import is followed by ``tvmgrad.sources``,
    from the source text (a module's globals would depend on which modules the process happened
    to import); these two are named here because the dispatcher imports the rule by computed
    name. PatternError for an unknown pattern."""
    return [str(_HERE / "__init__.py"), str(_path(target_kind, pattern))]
