"""Plan -> scheduled IRModule -> compiled TVM module (a streamed CPU plan's stores then made
non-temporal: tvmgrad/streaming.py). Knows no op semantics."""

from __future__ import annotations

from .families.base import Plan
from .targets import Resolved

__all__ = ["lower", "compile_plan", "compile_plans", "compile_lowered", "element_aligned",
           "BUFFER_ALIGNMENT"]

# What a CPU kernel assumes of its buffers' addresses: "element" (each buffer starts on a multiple
# of its element size, as every numpy/torch array does) instead of TVM's default 64 bytes. TVM
# declares every buffer 64-byte aligned (``align 64`` on the LLVM parameters and an
# ``llvm.assume``), so LLVM may emit aligned vector moves, and a caller had to copy each ordinary
# (16-byte aligned) numpy array into an aligned buffer first; ``element_aligned`` declares the
# element size instead, so vector loads are unaligned ones (``vmovups``: as fast on aligned data)
# and arrays are passed as they are. CUDA kernels keep TVM's 64 bytes (their vectorised loads
# need the vector's alignment; device allocations are aligned anyway, and the runtime copies a
# misaligned device view).
BUFFER_ALIGNMENT = {"llvm": "element"}


def lower(plan: Plan, target: Resolved):
    """The scheduled IRModule of a plan for a target (a tuned trace, else the schedule rules)."""
    from .te_defs._extern import scratch_scope
    with scratch_scope(target.kind):
        return _lower(plan, target)


def _lower(plan: Plan, target: Resolved):
    from . import schedules
    if plan.trace is not None:
        from .tuned import apply_trace
        # the exact function meta_schedule measured (loads inlined: TVM's vectoriser mishandles
        # let-bound scalars under an explicit vectorize)
        func = plan.make_static(inline=True).with_attr("global_symbol", plan.symbol)
        return _realign(apply_trace(func, plan.trace), target)
    func = _made(plan, target).with_attr("global_symbol", plan.symbol)
    if plan.narrow_index:
        import tvm
        func = tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))["main"]
    # a streamed kernel's outputs keep TVM's 64 bytes: its non-temporal stores are aligned
    # vectors (the runtime calls it only on aligned outputs: streaming.Streaming)
    keep = {i for i, a in enumerate(plan.args) if a.kind == "output"} if plan.stream else set()
    return _realign(schedules.apply(func, target.target, plan.pattern), target, keep)


def _made(plan: Plan, target: Resolved):
    """The plan's function for the target's schedule rules: on a CPU, contractions padded for
    its micro-kernel's rows (te_defs/_dense.row_tiles), attention's dQ in the dK/dV pass
    (te_defs/attention.one_pass) and the FFT's butterflies a vector register wide
    (te_defs/fft.butterfly_vectors)."""
    if target.kind != "llvm":
        return plan.make()
    from .schedules.cpu._isa import vector_unit
    from .schedules.cpu.gemm_dense import tile_rows
    from .te_defs._dense import row_tiles
    from .te_defs.attention import one_pass
    from .te_defs.fft import butterfly_vectors
    with (row_tiles(tile_rows(target.target)), one_pass(),
          butterfly_vectors(vector_unit(target.target).bits // 8)):
        return plan.make()


def _realign(mod, target: Resolved, keep=frozenset()):
    """The scheduled module with its buffers declared as the target's runtime guarantees them
    (``BUFFER_ALIGNMENT``), but the parameters at the positions in ``keep``."""
    if BUFFER_ALIGNMENT.get(target.kind) != "element":
        return mod
    import tvm
    return tvm.IRModule({gv.name_hint: element_aligned(f, keep) for gv, f in mod.functions.items()})


def element_aligned(func, keep=frozenset()):
    """``func`` with every buffer parameter (but those at the positions in ``keep``) aligned to its
    element size only (TVM declares 64 bytes): its code then takes any array whose address is a
    multiple of the element size (``llvm.assume``/``align`` attributes and aligned vector moves
    disappear from the IR).

    In TVM 0.27 a buffer is a ``Var`` whose ``BufferType`` carries ``data_alignment``; the
    parameters are such vars, so the function is rebuilt with new ones and every use in the body
    substituted (``BufferReplacer``)."""
    import tvm_ffi
    from tvm import tirx
    from tvm.tirx.buffer import decl_buffer, is_buffer_var
    from tvm.tirx.transform.common import BufferReplacer
    mapping, params = {}, []
    for i, p in enumerate(func.params):
        if not is_buffer_var(p):
            params.append(p)
            continue
        t = p.ty
        dt = t.dtype.dtype if hasattr(t.dtype, "dtype") else t.dtype
        d = tvm_ffi.dtype(str(dt))
        element = max(1, d.bits * d.lanes // 8)
        if t.data_alignment <= element:
            params.append(p)
            continue
        # a kept parameter is declared anew as well (with its own alignment): a body whose
        # buffers were substituted but for one no longer finds that one's definition
        align = t.data_alignment if i in keep else element
        new = decl_buffer(list(t.shape), str(dt), p.name, None, list(t.strides), t.elem_offset,
                          t.storage_scope, align, t.offset_factor, layout=t.layout)
        if list(t.allocated_addr):
            new = new.with_allocated_addr(list(t.allocated_addr))
        mapping[p] = new
        params.append(new)
    if not mapping:
        return func
    return tirx.PrimFunc(params, BufferReplacer(mapping)(func.body), func.ret_type, func.attrs)


def compile_plan(plan: Plan, target: Resolved):
    """Compile one plan into its own module."""
    return compile_plans([plan], target)


def compile_plans(plans: list[Plan], target: Resolved):
    """Compile plans (distinct symbols) into one module."""
    funcs = {}
    for plan in plans:
        if plan.symbol not in funcs:
            funcs[plan.symbol] = lower(plan, target)["main"]
    streams = {p.symbol for p in plans if p.stream}
    if not streams or target.kind != "llvm":
        return compile_lowered(funcs, target)
    if len(funcs) > 1:
        raise ValueError(f"streamed kernels {sorted(streams)} are compiled each on its own (their "
                         f"IR is rewritten whole), not with {sorted(set(funcs) - streams)}")
    from .streaming import recompile
    (plan,) = {p.symbol: p for p in plans}.values()
    params = funcs[plan.symbol].params
    outputs = [params[i].name for i, a in enumerate(plan.args) if a.kind == "output"]
    return recompile(compile_lowered(funcs, target).mod, outputs)


def compile_lowered(funcs: dict, target: Resolved):
    """Compile scheduled PrimFuncs (symbol -> func) into one module; for CUDA, check that every
    kernel really runs on the device (an unscheduled block would silently become host code)."""
    import tvm
    if target.kind == "llvm":
        from .fastmath import install
        install()
    with tvm.transform.PassContext(opt_level=3), target.target:    # the target: fastmath's rules
        ex = tvm.compile(tvm.IRModule(funcs), target=target.target)
    if target.is_gpu:
        device = ex.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
        source = "\n".join(m.inspect_source() for m in device)
        missing = [s for s in funcs if f"{s}_kernel" not in source]
        if missing:
            raise RuntimeError(f"CUDA build left no device kernel for {missing} (a block was left "
                               f"unscheduled and would run on the host)")
    return ex
