"""Emitting a tvmgrad op into a Relax function: a ``call_tir`` to its PrimFunc with output types
from our InferMeta (Relax shape variables stay symbolic), and scheduling such kernels for a target."""

from __future__ import annotations

from ..families.base import TARGET_FLAG, Plan
from ..infer_meta import TensorMeta
from ..planning import plan_call

__all__ = ["emit", "schedule_kernels", "tvmgrad_kernels", "lowered", "same_shape", "with_functions",
           "EMITTED_PLANS"]


def _meta(expr) -> TensorMeta:
    ty = expr.ty
    if not hasattr(ty, "shape") or ty.shape is None:
        raise TypeError(f"tvmgrad.relax: {expr} has no known shape ({ty})")
    return TensorMeta(list(ty.shape.values), ty.dtype)


def _metas(value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [_meta(v) for v in value]
    return _meta(value)


def same_shape(a, b) -> bool:
    """Equal shapes (Relax dims: symbolic ones equal when TVM's arithmetic proves it)."""
    from ..infer_meta import same_shape as same
    return same(tuple(a), tuple(b))


def emit(bb, op: str, inputs: dict, attrs: dict | None = None, *, target=None):
    """Emit ``op`` into the dataflow block ``bb`` is building; returns the output expr (a tuple of
    them, in YAML output order, for several outputs; None for an output that is not produced).

    ``target`` (optional) schedules the kernel for that target now (``tvmgrad.build.lower``: its
    tuned trace where the tuning database has one for these static sizes, else tvmgrad's rules);
    without it the kernel is left for ``schedule_kernels`` / the tvmgrad pipeline."""
    from tvm import relax, tirx

    from ..fastmath import install
    install()          # float32 exp/erf on LLVM as vectorisable polynomials (process-wide rule)
    planned = plan_call(op, {k: _metas(v) for k, v in inputs.items()}, attrs, metas_only=True,
                        target=target)
    entry, outs, plan = planned.entry, planned.outputs, planned.plan
    exprs = {}
    for name, value in inputs.items():
        exprs[name] = value
    results = {}
    if plan.make is not None:
        func = plan.make().with_attr("global_symbol", plan.symbol)
        func = func.with_attr("tvmgrad.op", op).with_attr("tvmgrad.pattern", plan.pattern)
        # opaque to Relax's FuseOps: our kernels take coalesced views with their own symbolic
        # dims, which FuseTIR cannot merge with a neighbour's buffers
        func = func.with_attr("op_pattern", 8)
        if plan.narrow_index:            # (for a module scheduled where EMITTED_PLANS lacks the plan)
            func = func.with_attr("tvmgrad.narrow_index", True)
        if target is not None:
            func = _with_attrs(lowered(plan, planned.target), func)
        else:
            func = _cpu_form(func)
            EMITTED_PLANS[plan.symbol] = plan
            _PLANNED[plan.symbol] = planned
        gvar = bb.add_func(func, plan.symbol)
        args, out_tys, out_names = [], [], []
        for a in plan.args:
            if a.kind == "scalar":
                args.append(relax.prim_value(tirx.const(a.value, a.dtype)))
            elif a.kind == "input":
                expr = exprs[a.name] if a.index is None else exprs[a.name][a.index]
                meta = _meta(expr)
                if a.shape is not None and not same_shape(a.shape, meta.shape):
                    expr = bb.emit(relax.op.reshape(expr, list(a.shape)))
                args.append(expr)
            else:
                meta = outs[entry.spec.output_names.index(a.name)]
                meta = meta[a.index] if a.index is not None else meta
                shape = a.shape if a.shape is not None else meta.shape
                out_tys.append(relax.TensorType(list(shape), meta.dtype.storage))
                out_names.append((a.name, a.index, meta))
        value = bb.emit(relax.call_tir(gvar, args, out_tys if len(out_tys) > 1 else out_tys[0]))
        for i, (name, index, meta) in enumerate(out_names):
            item = bb.emit(relax.TupleGetItem(value, i)) if len(out_tys) > 1 else value
            if not same_shape(_meta(item).shape, meta.shape):
                item = bb.emit(relax.op.reshape(item, list(meta.shape)))
            if index is None:
                results[name] = item
            else:
                results.setdefault(name, {})[index] = item
    for name, (src, shape) in plan.aliases.items():
        results[name] = bb.emit(relax.op.reshape(exprs[src], list(shape)))
    ordered = []
    for o in entry.spec.outputs:
        value = results.get(o.name)
        if isinstance(value, dict):
            value = [value[i] for i in sorted(value)]
        ordered.append(value)
    return ordered[0] if len(ordered) == 1 else tuple(ordered)


EMITTED_PLANS: dict = {}  # symbol -> plan of kernels emitted unscheduled (schedule_kernels remakes them)
_PLANNED: dict = {}      # symbol -> the planned call of those ``emit`` made (tuned for the target then)


def _cpu_form(func):
    """Index kernels carry a CPU and a CUDA form, picked by a scalar parameter that the schedule
    rules fix. A kernel left to the Relax pipeline gets the CPU form (what its default lowering
    can run); ``schedule_kernels`` remakes it for the target it is given."""
    from tvm import tirx
    flag = [p for p in func.params if p.name == TARGET_FLAG]
    return func.specialize({flag[0]: tirx.IntImm("int64", 0)}) if flag else func


def lowered(plan, target, symbol: str | None = None):
    """The plan's kernel scheduled for ``target`` by ``tvmgrad.build.lower`` (a tuned trace
    where the plan has one, else the schedule rules), marked scheduled; ``symbol``: the name it
    keeps in the module (a tuned variant replacing the kernel emitted under the plain one's)."""
    from .. import build
    from ..targets import resolve
    func = build.lower(plan, resolve(target))["main"].with_attr("tirx.is_scheduled", True)
    return func if symbol is None else func.with_attr("global_symbol", symbol)


def _as_plan(func) -> Plan:
    """A kernel whose plan this process does not hold (a module emitted elsewhere) as a plan
    of itself, so that ``tvmgrad.build.lower`` schedules it like every other."""
    attrs = func.attrs
    name = str(attrs["global_symbol"])
    return Plan(key=("relax.kernel", name), symbol=name, make=lambda: func,
                pattern=str(attrs["tvmgrad.pattern"]),
                narrow_index="tvmgrad.narrow_index" in attrs and bool(attrs["tvmgrad.narrow_index"]))


def _with_attrs(func, like):
    """``func`` with the attributes of ``like`` it lacks (tvmgrad.op, pattern, op_pattern...)."""
    for key in like.attrs.keys():
        if key not in ("tirx.is_scheduled",) and (func.attrs is None or key not in func.attrs):
            func = func.with_attr(key, like.attrs[key])
    return func


def tvmgrad_kernels(mod) -> dict:
    """{global var: PrimFunc} of the tvmgrad kernels in a module that are not scheduled yet."""
    from tvm import tirx
    return {gvar: func for gvar, func in mod.functions.items()
            if isinstance(func, tirx.PrimFunc) and func.attrs is not None and "tvmgrad.op" in func.attrs
            and "tirx.is_scheduled" not in func.attrs}


def schedule_kernels(mod, target):
    """Schedule every unscheduled tvmgrad kernel of a Relax module for ``target`` with
    ``tvmgrad.build.lower`` (its tuned trace, else tvmgrad's rules); the Relax pipeline then
    leaves them alone. Kernels emitted in this process are remade from their plans (their
    target-specific form, not the CPU one; ``emit``'s tuned where the database has a record for
    the call on ``target``); others are scheduled as they are."""
    from ..targets import resolve
    tgt = resolve(target)
    updates = {}
    for gvar, func in tvmgrad_kernels(mod).items():
        name = str(gvar.name_hint)
        planned = _PLANNED.get(name)
        plan = planned.tuned_for(tgt) if planned is not None else EMITTED_PLANS.get(name)
        updates[gvar] = _with_attrs(lowered(plan or _as_plan(func), tgt, name), func)
    return with_functions(mod, updates)


def with_functions(mod, updates: dict):
    """``mod`` with the functions of ``updates`` (global var -> function) replaced, in a copy
    (the module itself when there is nothing to replace)."""
    if not updates:
        return mod
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod
