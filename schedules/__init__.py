"""Schedule rules. ``apply`` picks the target's rule set; rules look at loop nests, not op names."""

from __future__ import annotations

__all__ = ["apply", "source_files"]


def apply(func, target_kind: str):
    """Schedule an unscheduled PrimFunc for ``target_kind`` ("llvm" or "cuda"); -> IRModule."""
    from tvm import s_tir
    sch = s_tir.Schedule(func)
    if target_kind == "cuda":
        from . import cuda
        cuda.schedule(sch)
    else:
        from . import cpu
        cpu.schedule(sch)
    return sch.mod


def source_files(target_kind: str) -> list[str]:
    """Files whose text decides the schedule for ``target_kind`` (part of every cache key)."""
    import pathlib
    here = pathlib.Path(__file__).parent
    files = [here / "__init__.py", here / "analysis.py"]
    files += sorted((here / "cuda").glob("*.py")) if target_kind == "cuda" else [here / "cpu.py"]
    return [str(f) for f in files]
