"""tvmgrad's Relax build pipeline: every kernel of a training step scheduled for the target the
module is compiled for.

* ``schedule_tvmgrad(target=None)``: a module pass scheduling the tvmgrad kernels (the
  gradients' kernels, and the forward ones below) with ``tvmgrad.build.lower`` for ``target``
  (default: the target ``tvm.compile`` is building for, ``Target.current()``);
* ``dense_forward()``: a module pass that drops ``broadcast_to`` to the same shape (a copy the
  torch frontend emits), and computes the forward ``relax.matmul`` (2-D, batched
  with equal batch dims, or an N-D left operand times a 2-D right one; a right operand that is
  ``permute_dims`` of a matrix is read transposed in place: a linear layer's ``x @ wᵀ``) and
  ``relax.nn.conv2d`` (NCHW/NHWC data, OIHW filters, static shapes) on tvmgrad's tiled
  contractions instead of TVM's unscheduled TOPI kernels. Other forms are left as they are;
* ``prune_gradients()``: dead code removed, then a weight grad that the Gradient pass
  transposes back (a linear layer's ``permute_dims``) computed transposed instead, and a
  two-output ``bmm_grad`` of which one gradient is unused (a first layer's input) reduced to
  one product computing the other;
* ``schedule_legalized(target=None)``: after ``LegalizeOps`` (and, with ``fuse``,
  ``FuseOps``/``FuseTIR``),
  schedules TVM's own kernels that nothing scheduled with tvmgrad's CPU rules (chosen by
  loop-nest shape: elementwise, row and column reductions); a kernel the rules cannot take is
  left as it was (CPU targets only: on CUDA TVM's pipeline runs dlight on them);
* ``pipeline(target=None, *, forward=True)``: all of it followed by TVM's own pipeline for the
  target, for ``tvm.compile(mod, target, relax_pipeline=tvmgrad.relax.pipeline())``.

``install()`` (called by ``register_gradients``) puts the same steps in front of the pipeline
``tvm.compile`` uses by default (``relax_pipeline="default"``), for modules that hold tvmgrad
kernels: registering the gradients is all it takes for a training step to compile scheduled.
``configure(forward=..., fuse=...)`` says whether that default also runs ``dense_forward`` and
``schedule_legalized`` (on by default; the tvmgrad kernels are always scheduled) and fuses TVM's
kernels first (off); ``uninstall()`` restores TVM's pipeline. ``$TVMGRAD_RELAX_DEBUG`` makes a
forward rewrite that fails raise instead of leaving TVM's kernel.
"""

from __future__ import annotations

import functools

__all__ = ["schedule_tvmgrad", "dense_forward", "prune_gradients", "schedule_legalized", "pipeline",
           "install", "uninstall", "configure", "has_tvmgrad_kernels"]

_CONFIG = {"forward": True, "fuse": False}
_DEBUG = bool(__import__("os").environ.get("TVMGRAD_RELAX_DEBUG"))


def configure(*, forward: bool | None = None, fuse: bool | None = None) -> dict:
    """Options of the tvmgrad steps (the default pipeline hook's, and ``pipeline()``'s unless
    given there): ``forward`` (also the forward contractions and TVM's legalized kernels, on
    CPU targets), ``fuse`` (TVM's kernels fused by FuseOps/FuseTIR before they are scheduled;
    off by default).
    -> the current options."""
    if forward is not None:
        _CONFIG["forward"] = bool(forward)
    if fuse is not None:
        _CONFIG["fuse"] = bool(fuse)
    return dict(_CONFIG)


def _current(target):
    import tvm
    if target is not None:
        from ..targets import resolve
        return resolve(target)
    cur = tvm.target.Target.current(allow_none=True)
    if cur is None:
        raise ValueError("tvmgrad.relax pipeline: no target given and none is current")
    from ..targets import Resolved
    return Resolved(cur)


def has_tvmgrad_kernels(mod) -> bool:
    from tvm import tirx
    return any(isinstance(f, tirx.PrimFunc) and f.attrs is not None and "tvmgrad.op" in f.attrs
               for f in mod.functions.values())


def schedule_tvmgrad(target=None):
    """Module pass: every unscheduled tvmgrad kernel scheduled for ``target`` (default: the
    current target)."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tvmgrad.ScheduleKernels")
    def _pass(mod, _ctx):
        from .emit import schedule_kernels, tvmgrad_kernels
        if not tvmgrad_kernels(mod):
            return mod
        return schedule_kernels(mod, _current(target))
    return _pass


# ------------------------------------------------------------------------------------------
# forward matmul / conv2d on tvmgrad's contractions

def _static(dims) -> bool:
    return all(isinstance(getattr(d, "value", d), int) for d in dims)


def _int(d):
    value = getattr(d, "value", d)
    return int(value) if isinstance(value, int) else None


def _same_dtype(call, *exprs) -> str | None:
    dts = {str(e.ty.dtype) for e in exprs}
    if len(dts) != 1:
        return None
    dt = dts.pop()
    out_dtype = getattr(call.attrs, "out_dtype", None)
    if "float" not in dt or (out_dtype is not None and str(out_dtype) not in ("", "void", dt)):
        return None
    return dt


def _same_shape(a, b) -> bool:
    sa, sb = getattr(a.ty, "shape", None), getattr(b.ty, "shape", None)
    if sa is None or sb is None or not hasattr(sa, "values") or not hasattr(sb, "values"):
        return False
    va, vb = list(sa.values), list(sb.values)
    return len(va) == len(vb) and all(_int(p) is not None and _int(p) == _int(q) for p, q in zip(va, vb))


def _prod(dims):
    out = 1
    for d in dims:
        out = out * d
    return out


def _make_mutator():
    from tvm import relax

    from .kernels import matmul_plan

    @relax.expr_functor.mutator
    class DenseForward(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)

        def _emit_kernel(self, op, plan, args, out_ty):
            from .emit import EMITTED_PLANS
            func = (plan.make().with_attr("global_symbol", plan.symbol).with_attr("tvmgrad.op", op)
                    .with_attr("tvmgrad.pattern", plan.pattern).with_attr("op_pattern", 8))
            EMITTED_PLANS[plan.symbol] = plan
            gvar = self.builder_.add_func(func, plan.symbol)
            return self.builder_.emit(relax.call_tir(gvar, list(args), out_ty))

        def _reshape(self, expr, shape):
            return self.builder_.emit(relax.op.reshape(expr, list(shape)))

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = getattr(call.op, "name", None)
            try:
                new = None
                if name == "relax.broadcast_to" and _same_shape(call.args[0], call):
                    return call.args[0]          # the frontend's broadcast to the same shape: a copy
                if name == "relax.matmul":
                    new = self._matmul(call)
                elif name == "relax.nn.conv2d":
                    new = self._conv2d(call)
                return call if new is None else new
            except Exception:  # noqa: BLE001 - a form the contraction cannot take: TVM's kernel
                if _DEBUG:
                    raise
                return call
            return call

        def _transposed(self, y):
            """W when y = permute_dims(W) of a matrix, else None."""
            if not isinstance(y, relax.Var):
                return None
            try:
                value = self.lookup_binding(y)
            except Exception:  # noqa: BLE001
                return None
            if (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.permute_dims"
                    and value.args[0].ty.ndim == 2):
                axes = value.attrs.axes
                if axes is None or [int(a) for a in axes] == [1, 0]:
                    return value.args[0]
            return None

        def _matmul(self, call):
            x, y = call.args
            dt = _same_dtype(call, x, y)
            if dt is None or x.ty.ndim < 1 or y.ty.ndim < 1:
                return None
            xs, ys = list(x.ty.shape.values), list(y.ty.shape.values)
            x2 = xs if len(xs) > 1 else [1] + xs
            y2 = ys if len(ys) > 1 else ys + [1]
            xb, yb = x2[:-2], y2[:-2]
            m, k, n = x2[-2], x2[-1], y2[-1]
            trans = None
            if not yb:                          # (..., M, K) @ (K, N): rows fold
                b, m = 1, _prod(xb) * m
                trans = self._transposed(y) if len(ys) == 2 else None
            elif len(xb) == len(yb) and all(_int(p) is not None and _int(p) == _int(q) for p, q in zip(xb, yb)):
                b = _prod(xb)
            else:
                return None
            B, M, K, N = (_int(v) for v in (b, m, k, n))
            if None in (B, K, N):               # symbolic rows only
                return None
            x3 = self._reshape(x, [b, m, k])
            if trans is not None:
                y3 = self._reshape(trans, [1, n, k])
            else:
                y3 = self._reshape(y, [b, k, n])
            plan = matmul_plan(B, M, K, N, dt, trans_y=trans is not None)
            out = self._emit_kernel("matmul", plan, [x3, y3], relax.TensorType([b, m, n], dt))
            return relax.op.reshape(out, call.ty.shape)

        def _conv2d(self, call):
            from .conv import forward_conv2d
            if _same_dtype(call, *call.args) is None:
                return None
            return forward_conv2d(self.builder_, call, self._emit_kernel)

    return DenseForward


def _analyse(func):
    """Use-def facts of a Relax function: {var: bound value}, {var: number of uses}."""
    from tvm import relax
    values: dict = {}
    uses: dict = {}

    def use(e):
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    def visit(e):
        if isinstance(e, relax.Call):
            for a in e.args:
                use(a)
                if isinstance(a, relax.Tuple):
                    for f in a.fields:
                        use(f)
        elif isinstance(e, relax.Tuple):
            for f in e.fields:
                use(f)
        elif isinstance(e, relax.TupleGetItem):
            use(e.tuple_value)
        elif isinstance(e, relax.SeqExpr):
            use(e.body)
            for block in e.blocks:
                for b in block.bindings:
                    values[b.var] = b.value
                    if isinstance(b.value, relax.Var):
                        use(b.value)
    relax.analysis.post_order_visit(func.body, visit)
    return values, uses


def _kernel_op(mod, call):
    """(tvmgrad op, plan) of a call_tir to a tvmgrad kernel, else (None, None)."""
    from .emit import EMITTED_PLANS
    if getattr(call.op, "name", "") != "relax.call_tir":
        return None, None
    gvar = call.args[0]
    try:
        func = mod[gvar]
    except Exception:  # noqa: BLE001
        return None, None
    if func.attrs is None or "tvmgrad.op" not in func.attrs:
        return None, None
    return str(func.attrs["tvmgrad.op"]), EMITTED_PLANS.get(str(gvar.name_hint))


def _is_transpose2d(value) -> bool:
    from tvm import relax
    if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.permute_dims"):
        return False
    axes = value.attrs.axes
    return value.args[0].ty.ndim == 2 and (axes is None or [int(a) for a in axes] == [1, 0])


def _make_pruner(mod, func):
    """A mutator for the adjoint's matrix products (see ``prune_gradients``)."""
    from tvm import relax

    from .kernels import dims_of, matmul_plan
    values, uses = _analyse(func)

    def single_use(v):
        return isinstance(v, relax.Var) and uses.get(v, 0) == 1

    # (1) products whose result is only transposed back: W's grad of a linear layer, x @ wᵀ with
    # wᵀ = permute_dims(w), is permute_dims(reshape(xᵀ·g)); computing gᵀ·x gives it directly.
    # {product var: (transposing var, 2-D shape)} for a tvmgrad matmul or bmm_grad's y_grad.
    transposed: dict = {}
    for pvar, value in values.items():
        if not _is_transpose2d(value) or not single_use(value.args[0]):
            continue
        rvar = value.args[0]
        rval = values.get(rvar)
        if not (isinstance(rval, relax.Call) and getattr(rval.op, "name", "") == "relax.reshape"
                and single_use(rval.args[0])):
            continue
        src = rval.args[0]
        sval = values.get(src)
        if isinstance(sval, relax.TupleGetItem) and int(sval.index) == 1:
            call = values.get(sval.tuple_value)
            if isinstance(call, relax.Call) and _kernel_op(mod, call)[0] == "bmm_grad":
                transposed[sval.tuple_value] = (pvar, rvar, src)
        elif isinstance(sval, relax.Call) and _kernel_op(mod, sval)[0] == "matmul":
            transposed[src] = (pvar, None, rvar)

    # (2) bmm_grad calls of which one output is unused: {var: the used index}
    fields: dict = {}
    item_uses: dict = {}
    for v, value in values.items():
        if isinstance(value, relax.TupleGetItem):
            fields.setdefault(value.tuple_value, set()).add(int(value.index))
            item_uses[value.tuple_value] = item_uses.get(value.tuple_value, 0) + 1
    whole = {v for v, n in uses.items() if n > item_uses.get(v, 0)}     # used other than by items

    @relax.expr_functor.mutator
    class Pruner(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.changed = False
            self.remap = {}          # old var -> new expr (TupleGetItem / product vars)
            self.skip = set()

        def _product(self, B, M, K, N, dt, x, y, *, trans_x=False, trans_y=False):
            """out[b] = op(x)·op(y) as a tvmgrad matmul; an operand that is a reshaped
            permute_dims of a matrix is read in place, its transpose flag flipped."""
            x, fx = self._untransposed(x)
            y, fy = self._untransposed(y)
            plan = matmul_plan(B, M, K, N, dt, trans_x=trans_x != fx, trans_y=trans_y != fy)
            shape = (B, M, N)
            return self._kernel(plan, [x, y], shape, dt)

        def _untransposed(self, e):
            """(w reshaped to e's shape transposed, True) when e = reshape(permute_dims(w)) of a
            matrix with a unit batch, else (e, False)."""
            val = values.get(e)
            if not (isinstance(val, relax.Call) and getattr(val.op, "name", "") == "relax.reshape"):
                return e, False
            t = values.get(val.args[0])
            if not _is_transpose2d(t) or e.ty.ndim != 3 or _int(e.ty.shape.values[0]) != 1:
                return e, False
            w = t.args[0]
            rows, cols = w.ty.shape.values
            return self.builder_.emit(relax.op.reshape(self.visit_expr(w), [1, rows, cols])), True

        def _kernel(self, plan, args, shape, dt):
            from .emit import EMITTED_PLANS
            f = (plan.make().with_attr("global_symbol", plan.symbol).with_attr("tvmgrad.op", "matmul")
                 .with_attr("tvmgrad.pattern", plan.pattern).with_attr("op_pattern", 8))
            EMITTED_PLANS[plan.symbol] = plan
            gvar = self.builder_.add_func(f, plan.symbol)
            return self.builder_.emit(relax.call_tir(gvar, [self.visit_expr(a) for a in args],
                                                     relax.TensorType(list(shape), dt)))

        def _bmm_dims(self, call):
            x3, y3, g3 = call.args[1].fields
            B, M, K = dims_of(x3.ty.shape.values)
            N = dims_of(y3.ty.shape.values)[2]
            return (x3, y3, g3), (B, M, K, N), str(x3.ty.dtype)

        def visit_var_binding_(self, binding):
            var, value = binding.var, binding.value
            if var in self.skip:
                return
            if var in self.remap:
                self.set_var_remap(var, self.remap[var])
                return
            if isinstance(value, relax.Call) and var in transposed:
                op, plan = _kernel_op(self.builder_.get(), value)
                pvar, rvar, src = transposed[var]
                if op == "bmm_grad":
                    (x3, y3, g3), (B, M, K, N), dt = self._bmm_dims(value)
                    if None not in (B, M, K, N):
                        used = fields.get(var, set())
                        if 0 in used:                               # dx = g·yᵀ
                            dx = self._product(B, M, N, K, dt, g3, y3, trans_y=True)
                            for v, val in values.items():
                                if isinstance(val, relax.TupleGetItem) and val.tuple_value.same_as(var) \
                                        and int(val.index) == 0:
                                    self.remap[v] = dx
                        dwt = self._product(B, N, M, K, dt, g3, x3, trans_x=True)
                        self.remap[pvar] = self.builder_.emit(relax.op.reshape(dwt, pvar.ty.shape))
                        self.skip |= {rvar, src}
                        self.changed = True
                        return
                elif op == "matmul" and plan is not None:
                    _, B, M, K, N, dt, tx, ty = plan.key
                    x, y = value.args[1].fields
                    out = self._product(B, N, K, M, dt, y, x, trans_x=not ty, trans_y=not tx)
                    self.remap[pvar] = self.builder_.emit(relax.op.reshape(out, pvar.ty.shape))
                    self.skip.add(src)
                    self.changed = True
                    return
            used = fields.get(var)
            if (isinstance(value, relax.Call) and used is not None and len(used) == 1 and var not in whole
                    and _kernel_op(self.builder_.get(), value)[0] == "bmm_grad"):
                (x3, y3, g3), (B, M, K, N), dt = self._bmm_dims(value)
                if None not in (B, M, K, N):
                    if used == {0}:          # dx = g · yᵀ
                        nv = self._product(B, M, N, K, dt, g3, y3, trans_y=True)
                    else:                    # dy = xᵀ · g
                        nv = self._product(B, K, M, N, dt, x3, g3, trans_x=True)
                    idx = next(iter(used))
                    for v, val in values.items():
                        if isinstance(val, relax.TupleGetItem) and val.tuple_value.same_as(var) \
                                and int(val.index) == idx:
                            self.remap[v] = nv
                    self.changed = True
                    return
            super().visit_var_binding_(binding)

    return Pruner(mod)


def prune_gradients():
    """Module pass on the adjoint's matrix products, after dead-code elimination:

    * a product only transposed back (the weight grad of a linear layer ``x @ wᵀ``, whose
      ``wᵀ`` is a ``permute_dims`` the Gradient pass differentiates with another one) computed
      transposed: gᵀ·x instead of permute_dims(xᵀ·g), no transpose kernel;
    * a two-output ``bmm_grad`` of which one gradient is unused (a first layer's input) replaced
      by one product computing the other (the Gradient pass asks every rule for all its
      inputs' gradients; a two-output kernel would compute the unused one anyway)."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="tvmgrad.PruneGradients")
    def _pass(mod, _ctx):
        mod = relax.transform.DeadCodeElimination()(mod)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                pruner = _make_pruner(mod, func)
                new = pruner.visit_expr(func)
                if pruner.changed:
                    pruner.builder_.update_func(gvar, new)
                    mod = relax.transform.DeadCodeElimination()(pruner.builder_.get())
        return mod
    return _pass


def dense_forward():
    """Module pass: forward matmul / conv2d on tvmgrad's contractions (see the module doc)."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="tvmgrad.DenseForward")
    def _pass(mod, _ctx):
        mutator = _make_mutator()(mod)
        for gvar, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mutator.builder_.update_func(gvar, mutator.visit_expr(func))
        out = mutator.builder_.get()
        return relax.transform.DeadCodeElimination()(out)
    return _pass


# ------------------------------------------------------------------------------------------
# TVM's legalized kernels on tvmgrad's CPU rules

def schedule_legalized(target=None):
    """Module pass (after LegalizeOps): TVM's unscheduled PrimFuncs scheduled with tvmgrad's CPU
    rules; one the rules cannot take stays as it was. No-op on non-CPU targets."""
    import tvm
    from tvm import tirx

    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="tvmgrad.ScheduleLegalized")
    def _pass(mod, _ctx):
        from .. import schedules
        tgt = _current(target)
        if tgt.kind != "llvm":
            return mod
        updates = {}
        for gvar, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc) or (func.attrs is not None and (
                    "tirx.is_scheduled" in func.attrs or "tvmgrad.op" in func.attrs)):
                continue
            if relax.analysis.has_reshape_pattern(func):
                continue        # left for RewriteDataflowReshape: a free view, not a copy
            try:
                scheduled = schedules.apply(func, tgt.target, "generic")["main"]
            except Exception:  # noqa: BLE001 - a nest the rules do not know: TVM's default
                continue
            updates[gvar] = scheduled.with_attr("tirx.is_scheduled", True)
        from .emit import with_functions
        return with_functions(mod, updates)
    return _pass


# ------------------------------------------------------------------------------------------
# pipelines

def _tvmgrad_steps(target, forward: bool):
    from tvm import relax
    steps = []
    if forward:
        steps += [relax.transform.RemoveRedundantReshape(), dense_forward()]
    steps += [prune_gradients(), schedule_tvmgrad(target)]
    if forward:
        # TVM's own kernels: legalized, optionally fused (fewer kernels and VM instructions, but
        # fused nests that tvmgrad's rules schedule less well: measured slower on the
        # transformer layer, so off by default), then scheduled by tvmgrad's CPU rules
        steps.append(relax.transform.LegalizeOps())
        if _CONFIG["fuse"]:
            steps += [relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
                      relax.transform.FuseOps(), relax.transform.FuseTIR()]
        steps.append(schedule_legalized(target))
    return steps


def pipeline(target=None, *, forward: bool = True):
    """A ``relax_pipeline`` for ``tvm.compile``: the tvmgrad steps (``forward``: also the forward
    contractions and TVM's legalized kernels, on CPU targets), then TVM's default pipeline for
    the target (``target``: default the one being compiled for)."""
    import tvm

    _remember()

    @tvm.transform.module_pass(opt_level=0, name="tvmgrad.Pipeline")
    def _pass(mod, ctx):
        tgt = _current(target)
        with tgt.target:
            for step in _tvmgrad_steps(tgt, forward and tgt.kind == "llvm"):
                mod = step(mod)
            return _tvm_default(tgt.target)(mod)
    return _pass


def _tvm_default(target):
    """TVM's own default pipeline for ``target``, as tvm.compile would pick it."""
    if "gpu" in target.keys:
        try:
            return _ORIGINAL["get_default_pipeline"](target)
        except (ValueError, AttributeError):
            pass
    return _ORIGINAL["default"]()


_ORIGINAL: dict = {}


def _remember():
    from tvm import relax
    from tvm.relax import pipeline as rp
    if not _ORIGINAL:
        _ORIGINAL["default"] = rp.PIPELINE_MAP["default"]
        _ORIGINAL["get_default_pipeline"] = relax.get_default_pipeline


def _hooked(make_original):
    """The default pipeline with the tvmgrad steps first, for modules holding tvmgrad kernels."""
    import tvm

    @functools.wraps(make_original)
    def make(*args, **kwargs):
        original = make_original(*args, **kwargs)

        @tvm.transform.module_pass(opt_level=0, name="tvmgrad.DefaultPipeline")
        def _pass(mod, ctx):
            if has_tvmgrad_kernels(mod) and tvm.target.Target.current(allow_none=True) is not None:
                tgt = _current(None)
                for step in _tvmgrad_steps(tgt, _CONFIG["forward"] and tgt.kind == "llvm"):
                    mod = step(mod)
            return original(mod)
        return _pass
    make.__tvmgrad_hook__ = True
    return make


def install() -> None:
    """Put the tvmgrad steps in front of ``tvm.compile``'s default pipeline (idempotent)."""
    from tvm import relax
    from tvm.relax import pipeline as rp
    _remember()
    if not getattr(rp.PIPELINE_MAP["default"], "__tvmgrad_hook__", False):
        rp.PIPELINE_MAP["default"] = _hooked(_ORIGINAL["default"])
    if not getattr(relax.get_default_pipeline, "__tvmgrad_hook__", False):
        relax.get_default_pipeline = _hooked(_ORIGINAL["get_default_pipeline"])


def uninstall() -> None:
    """TVM's default pipeline as it was before ``install``."""
    from tvm import relax
    from tvm.relax import pipeline as rp
    if _ORIGINAL:
        rp.PIPELINE_MAP["default"] = _ORIGINAL["default"]
        relax.get_default_pipeline = _ORIGINAL["get_default_pipeline"]
