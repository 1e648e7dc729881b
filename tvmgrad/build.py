"""Plan -> scheduled IRModule -> compiled TVM module. Knows no op semantics."""

from __future__ import annotations

from .families.base import Plan
from .targets import Resolved

__all__ = ["lower", "compile_plan", "compile_plans", "compile_lowered"]


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
