"""Plan -> scheduled IRModule -> compiled TVM module. Knows no op semantics."""

from __future__ import annotations

import functools
import hashlib
import inspect
import pathlib

from .families.base import Plan
from .targets import Resolved

__all__ = ["lower", "compile_plan", "compile_plans", "compile_lowered", "source_digest"]


def lower(plan: Plan, target: Resolved):
    """The scheduled IRModule of a plan for a target (a tuned trace, else the schedule rules)."""
    from . import schedules
    if plan.trace is not None:
        from .tune import apply_trace
        # the exact function meta_schedule measured (loads inlined: TVM's vectoriser mishandles
        # let-bound scalars under an explicit vectorize)
        func = plan.make_static(inline=True).with_attr("global_symbol", plan.symbol)
        return apply_trace(func, plan.trace)
    func = plan.make().with_attr("global_symbol", plan.symbol)
    if plan.narrow_index:
        import tvm
        func = tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
    return schedules.apply(func, target.target, plan.pattern)


def compile_plan(plan: Plan, target: Resolved):
    """Compile one plan into its own module."""
    return compile_plans([plan], target)


def compile_plans(plans: list[Plan], target: Resolved):
    """Compile plans (distinct symbols) into one module."""
    funcs = {}
    for plan in plans:
        if plan.symbol not in funcs:
            funcs[plan.symbol] = lower(plan, target)["main"]
    return compile_lowered(funcs, target)


def compile_lowered(funcs: dict, target: Resolved):
    """Compile scheduled PrimFuncs (symbol -> func) into one module; for CUDA, check that every
    kernel really runs on the device (an unscheduled block would silently become host code)."""
    import tvm
    if target.kind == "llvm":
        from .fastmath import install
        install()
    with tvm.transform.PassContext(opt_level=3):
        ex = tvm.compile(tvm.IRModule(funcs), target=target.target)
    if target.is_gpu:
        device = ex.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
        source = "\n".join(m.inspect_source() for m in device)
        missing = [s for s in funcs if f"{s}_kernel" not in source]
        if missing:
            raise RuntimeError(f"CUDA build left no device kernel for {missing} (a block was left "
                               f"unscheduled and would run on the host)")
    return ex


@functools.cache
def _file_digest(path: str) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def source_digest(impl, target_kind: str, pattern: str = "generic") -> str:
    """Hash of every source file that shapes an op's generated code for a target kind.

    The op's te_defs module and its private helpers (te_defs/_*.py), the family machinery, the
    schedule rules and this module. Editing one family recompiles that family only.
    """
    from . import schedules
    te_dir = pathlib.Path(impl.source_file).parent
    files = {impl.source_file, __file__, inspect.getsourcefile(type(impl)),
             str(pathlib.Path(__file__).parent / "families" / "base.py")}
    files.update(str(p) for p in te_dir.glob("_*.py"))
    forward = getattr(impl, "forward", None)
    if forward is not None:
        files.add(inspect.getsourcefile(type(forward.impl)))
    files.update(schedules.source_files(target_kind, pattern))
    if target_kind == "llvm":
        files.add(str(pathlib.Path(__file__).parent / "fastmath.py"))
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(_file_digest(f).encode())
    return h.hexdigest()
