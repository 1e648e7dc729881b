"""tvmgrad kernels inside TVM Relax graphs.

* ``emit(bb, op, inputs, attrs)`` adds one tvmgrad op to the function a ``BlockBuilder`` is
  building: a ``call_tir`` to the op's PrimFunc, with the output types from our InferMeta. Dims that
  are Relax shape variables stay symbolic (one kernel serves every size, as in ``tvmgrad.run``).
* ``register_gradients()`` makes ``relax.transform.Gradient`` differentiate Relax ops with tvmgrad
  kernels: for each Relax op in ``GRADIENTS`` whose backward.yaml op is implemented, a gradient
  is registered above TVM's own (level 11; TVM registers at 10). Ops TVM has no gradient for
  (gelu, erf, rsqrt, square, clip, ...) become differentiable.
* ``coverage()``: which Relax ops get tvmgrad gradients, next to the ones TVM differentiates itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from . import registry, schedules
from .call import bind
from .infer_meta import TensorMeta

__all__ = ["emit", "register_gradients", "schedule_kernels", "coverage", "GRADIENTS", "RelaxGrad"]


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


def _same(a, b) -> bool:
    from .infer_meta import same_shape
    return same_shape(tuple(a), tuple(b))


def emit(bb, op: str, inputs: dict, attrs: dict | None = None, *, target=None):
    """Emit ``op`` into the dataflow block ``bb`` is building; returns the output expr (a tuple of
    them, in YAML output order, for several outputs; None for an output that is not produced).

    ``target`` (optional) schedules the kernel with tvmgrad's rules for that target; without it
    the kernel is left to the Relax pipeline (dlight on CUDA, default lowering on CPU)."""
    from tvm import relax, tirx

    from .fastmath import install
    install()          # float32 exp/erf on LLVM as vectorisable polynomials (process-wide rule)
    entry = registry.get(op)
    if not entry.available:
        raise NotImplementedError(f"{op}: not implemented")
    call = bind(entry.spec, {k: _metas(v) for k, v in inputs.items()}, attrs, metas_only=True)
    outs = registry.infer_outputs(entry, call)
    plan = entry.impl.plan(call, outs)
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
        if target is not None:
            from .targets import resolve
            func = schedules.apply(func, resolve(target).target, plan.pattern)["main"]
            func = func.with_attr("tirx.is_scheduled", True)
        gvar = bb.add_func(func, plan.symbol)
        args, out_tys, out_names = [], [], []
        for a in plan.args:
            if a.kind == "scalar":
                args.append(relax.prim_value(tirx.const(a.value, a.dtype)))
            elif a.kind == "input":
                expr = exprs[a.name] if a.index is None else exprs[a.name][a.index]
                meta = _meta(expr)
                if a.shape is not None and not _same(a.shape, meta.shape):
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
            if not _same(_meta(item).shape, meta.shape):
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


# ------------------------------------------------------------------------------------------
# Relax gradients backed by tvmgrad kernels

@dataclass(frozen=True)
class RelaxGrad:
    """How a Relax op's gradient maps onto a backward.yaml op.

    ``inputs(call, out, grad) -> dict`` builds the YAML op's tensor inputs from the forward call
    (its args), its output and the output gradient; ``attrs(call) -> dict`` its attributes;
    ``results`` names, per Relax tensor arg, the YAML output that is its gradient (None: not
    differentiable, a zero gradient). ``custom(ctx, call, out, grad, target) -> [grad per arg]``
    replaces all that for ops that need extra graph work (layer_norm recomputes its statistics)."""

    op: str
    inputs: Callable | None
    results: tuple
    attrs: Callable = lambda call: {}
    custom: Callable | None = None


def _x_g(call, out, grad):
    return {"x": call.args[0], "out_grad": grad}


def _out_g(call, out, grad):
    return {"out": out, "out_grad": grad}


def _unary(op, uses="x"):
    return RelaxGrad(op, _x_g if uses == "x" else _out_g, ("x_grad",))


def _prim(expr) -> float:
    value = getattr(expr, "value", expr)
    value = getattr(value, "value", value)
    return float(value)


GRADIENTS: dict[str, RelaxGrad] = {
    "relax.nn.relu": _unary("relu_grad", uses="out"),
    "relax.sigmoid": _unary("sigmoid_grad", uses="out"),
    "relax.tanh": _unary("tanh_grad", uses="out"),
    "relax.exp": _unary("exp_grad", uses="out"),
    "relax.sqrt": _unary("sqrt_grad", uses="out"),
    "relax.rsqrt": _unary("rsqrt_grad", uses="out"),
    "relax.log": _unary("log_grad"),
    "relax.sin": _unary("sin_grad"), "relax.cos": _unary("cos_grad"), "relax.tan": _unary("tan_grad"),
    "relax.asin": _unary("asin_grad"), "relax.acos": _unary("acos_grad"), "relax.atan": _unary("atan_grad"),
    "relax.sinh": _unary("sinh_grad"), "relax.cosh": _unary("cosh_grad"),
    "relax.asinh": _unary("asinh_grad"), "relax.acosh": _unary("acosh_grad"), "relax.atanh": _unary("atanh_grad"),
    "relax.abs": _unary("abs_grad"), "relax.square": _unary("square_grad"), "relax.erf": _unary("erf_grad"),
    "relax.nn.gelu": RelaxGrad("gelu_grad", _x_g, ("x_grad",), lambda c: {"approximate": False}),
    "relax.nn.gelu_tanh": RelaxGrad("gelu_grad", _x_g, ("x_grad",), lambda c: {"approximate": True}),
    "relax.nn.silu": RelaxGrad("silu_grad", lambda c, o, g: {"x": c.args[0], "out": o, "out_grad": g},
                               ("x_grad",)),
    "relax.nn.leakyrelu": RelaxGrad("leaky_relu_grad", _x_g, ("x_grad",),
                                    lambda c: {"negative_slope": float(c.attrs.alpha)}),
    "relax.nn.softplus": RelaxGrad("softplus_grad", _x_g, ("x_grad",),
                                   lambda c: {"beta": float(c.attrs.beta), "threshold": float(c.attrs.threshold)}),
    "relax.clip": RelaxGrad("clip_grad", _x_g, ("x_grad", None, None),
                            lambda c: {"min": _prim(c.args[1]), "max": _prim(c.args[2])}),
    "relax.atan2": RelaxGrad("atan2_grad", lambda c, o, g: {"x": c.args[0], "y": c.args[1], "out_grad": g},
                             ("x_grad", "y_grad")),
    "relax.floor": RelaxGrad("floor_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.ceil": RelaxGrad("ceil_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.round": RelaxGrad("round_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.trunc": RelaxGrad("trunc_grad", lambda c, o, g: {"out_grad": g}, ("input_grad",)),
    "relax.sign": RelaxGrad("sign_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.nn.log_softmax": RelaxGrad("log_softmax_grad", _out_g, ("x_grad",),
                                      lambda c: {"axis": int(c.attrs.axis)}),
}

def _conv2d_grad(ctx, call, out, grad, target):
    """relax.nn.conv2d (OIHW filters, NCHW/NHWC data) -> conv2d_grad."""
    a = call.attrs
    if str(a.kernel_layout) != "OIHW" or str(a.data_layout) not in ("NCHW", "NHWC"):
        raise NotImplementedError(f"tvmgrad conv2d gradient: layouts {a.data_layout}/{a.kernel_layout}")
    top, left, bottom, right = (int(p) for p in a.padding)
    attrs = {"strides": [int(s) for s in a.strides], "paddings": [top, bottom, left, right],
             "dilations": [int(d) for d in a.dilation], "groups": int(a.groups),
             "data_format": str(a.data_layout), "padding_algorithm": "EXPLICIT"}
    dx, dw = emit(ctx, "conv2d_grad", {"input": call.args[0], "filter": call.args[1], "out_grad": grad},
                  attrs, target=target)
    return [dx, dw]


def _layer_norm_grad(ctx, call, out, grad, target):
    """relax.nn.layer_norm over trailing axes -> layer_norm_grad; mean and variance recomputed."""
    from tvm import relax
    x, gamma, beta = call.args[:3]
    rank = len(x.ty.shape.values)
    axes = sorted(int(ax) % rank for ax in call.attrs.axes)
    if axes != list(range(rank - len(axes), rank)):
        raise NotImplementedError("tvmgrad layer_norm gradient: normalised axes must be trailing")
    begin = axes[0]
    shape = list(x.ty.shape.values)
    rows = 1
    for d in shape[:begin]:
        rows = rows * d
    mean = ctx.emit(relax.op.reshape(relax.op.mean(x, axis=axes, keepdims=False), [rows]))
    var = ctx.emit(relax.op.reshape(relax.op.variance(x, axis=axes, keepdims=False), [rows]))
    cols = 1
    for d in shape[begin:]:
        cols = cols * d
    scale = ctx.emit(relax.op.reshape(gamma, [cols]))
    bias = ctx.emit(relax.op.reshape(beta, [cols]))
    dx, dscale, dbias = emit(ctx, "layer_norm_grad",
                             {"x": x, "scale": scale, "bias": bias, "mean": mean, "variance": var,
                              "out_grad": grad},
                             {"epsilon": float(call.attrs.epsilon), "begin_norm_axis": begin}, target=target)
    dscale = ctx.emit(relax.op.reshape(relax.op.astype(dscale, gamma.ty.dtype), gamma.ty.shape))
    dbias = ctx.emit(relax.op.reshape(relax.op.astype(dbias, beta.ty.dtype), beta.ty.shape))
    return [dx, dscale, dbias]


def _nll_loss_grad(ctx, call, out, grad, target):
    """relax.nn.nll_loss -> nll_loss_grad, with the forward's total weight recomputed."""
    from tvm import relax, tirx
    pred, labels = call.args[0], call.args[1]
    weights = call.args[2] if len(call.args) > 2 else None
    ignore = int(call.attrs.ignore_index)
    dtype = pred.ty.dtype
    valid = ctx.emit(relax.op.astype(relax.op.not_equal(labels, relax.const(ignore, labels.ty.dtype)), dtype))
    if weights is not None:
        safe = ctx.emit(relax.op.where(relax.op.not_equal(labels, relax.const(ignore, labels.ty.dtype)),
                                       labels, relax.op.zeros_like(labels)))
        valid = ctx.emit(relax.op.multiply(valid, relax.op.take(weights, safe, axis=0)))
    total = ctx.emit(relax.op.sum(valid))
    dx = emit(ctx, "nll_loss_grad", {"input": pred, "label": labels, "weight": weights, "total_weight": total,
                                     "out_grad": grad},
              {"ignore_index": ignore, "reduction": str(call.attrs.reduction)}, target=target)
    grads = [dx, relax.op.zeros_like(labels)]
    if weights is not None:
        grads.append(relax.op.zeros_like(weights))
    del tirx
    return grads


def _cumsum_grad(ctx, call, out, grad, target):
    """relax.cumsum (axis None: over the flattened data) -> cumsum_grad."""
    from tvm import relax
    x, a = call.args[0], call.attrs
    if str(grad.ty.dtype) != str(x.ty.dtype):            # cumsum's dtype= is a cast: undo it
        grad = ctx.emit(relax.op.astype(grad, x.ty.dtype))
    flatten = a.axis is None
    if flatten:
        grad = ctx.emit(relax.op.reshape(grad, x.ty.shape))
    attrs = {"axis": -1 if flatten else int(a.axis), "flatten": flatten,
             "exclusive": bool(a.exclusive), "reverse": False}
    return [emit(ctx, "cumsum_grad", {"x": x, "out_grad": grad}, attrs, target=target)]


def _where_grad(ctx, call, out, grad, target):
    """relax.where broadcasts its three inputs; Paddle's where_grad takes them at the output's
    shape: broadcast, then sum the grads back to each input's shape."""
    from tvm import relax
    cond, x, y = call.args
    shape = out.ty.shape

    def full(t):
        return t if t.ty.shape.same_as(shape) else ctx.emit(relax.op.broadcast_to(t, shape))

    dx, dy = emit(ctx, "where_grad", {"condition": full(cond), "x": full(x), "y": full(y), "out_grad": grad},
                  target=target)
    back = [relax.op.collapse_sum_to(d, t.ty.shape) if not t.ty.shape.same_as(shape) else d
            for d, t in ((dx, x), (dy, y))]
    return [relax.op.zeros_like(cond)] + back


def _broadcast_to_grad(ctx, call, out, grad, target):
    """relax.broadcast_to (leading dims may be added) -> expand_grad (sums back to x's shape);
    the target shape is not differentiable. expand_grad reads only x's and out_grad's shapes, so
    its ``shape`` attribute is given as a placeholder when the target shape is symbolic."""
    from tvm.relax.op.grad import no_grad
    shape = [int(d.value) if hasattr(d, "value") else -1 for d in out.ty.shape.values]
    dx = emit(ctx, "expand_grad", {"x": call.args[0], "out_grad": grad}, {"shape": shape}, target=target)
    return [dx, no_grad(call.args[1])]


GRADIENTS["relax.cumsum"] = RelaxGrad("cumsum_grad", None, ("x_grad",), custom=_cumsum_grad)
GRADIENTS["relax.broadcast_to"] = RelaxGrad("expand_grad", None, ("x_grad", None), custom=_broadcast_to_grad)
GRADIENTS["relax.where"] = RelaxGrad("where_grad", None, (None, "x_grad", "y_grad"), custom=_where_grad)
GRADIENTS["relax.nn.nll_loss"] = RelaxGrad("nll_loss_grad", None, ("input_grad", None, None),
                                           custom=_nll_loss_grad)
GRADIENTS["relax.nn.conv2d"] = RelaxGrad("conv2d_grad", None, ("input_grad", "filter_grad"),
                                         custom=_conv2d_grad)
GRADIENTS["relax.nn.layer_norm"] = RelaxGrad("layer_norm_grad", None, ("x_grad", "scale_grad", "bias_grad"),
                                             custom=_layer_norm_grad)

LEVEL = 11            # above TVM's own gradients (registered at level 10)
_registered: dict[str, str] = {}


def _make_gradient(relax_op: str, rule: RelaxGrad, target):
    def gradient(orig_var, orig_call, output_grad, ctx):
        from tvm import relax
        if rule.custom is not None:
            return rule.custom(ctx, orig_call, orig_var, output_grad, target)
        grads = emit(ctx, rule.op, rule.inputs(orig_call, orig_var, output_grad), rule.attrs(orig_call),
                     target=target)
        grads = grads if isinstance(grads, tuple) else (grads,)
        by_name = dict(zip(registry.get(rule.op).spec.output_names, grads))
        out = []
        for arg, name in zip(orig_call.args, rule.results):
            if name is None:
                out.append(relax.op.zeros_like(arg) if isinstance(arg.ty, relax.TensorType)
                           else relax.op.zeros(relax.ShapeExpr([]), "float32"))
            else:
                out.append(by_name[name])
        return out
    gradient.__name__ = f"tvmgrad_{relax_op.replace('.', '_')}_grad"
    return gradient


def register_gradients(target=None) -> dict[str, str]:
    """Register tvmgrad-backed gradients for every mapped Relax op whose backward.yaml op is
    implemented; returns {relax op: backward op}. Idempotent (TVM allows one override)."""
    from tvm.relax.op.base import register_gradient
    _tvm_differentiable()                 # remember TVM's own set before shadowing it
    for relax_op, rule in GRADIENTS.items():
        if relax_op in _registered or not registry.get(rule.op).available:
            continue
        register_gradient(relax_op, _make_gradient(relax_op, rule, target), level=LEVEL)
        _registered[relax_op] = rule.op
    return dict(_registered)


def schedule_kernels(mod, target):
    """Schedule every unscheduled tvmgrad kernel of a Relax module with tvmgrad's rules for
    ``target`` (the Relax pipeline then leaves them alone and schedules TVM's own kernels)."""
    from tvm import tirx

    from .targets import resolve
    tgt = resolve(target)
    updates = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or "tvmgrad.op" not in func.attrs:
            continue
        if "tirx.is_scheduled" in func.attrs:
            continue
        scheduled = schedules.apply(func, tgt.target, str(func.attrs["tvmgrad.pattern"]))["main"]
        updates[gvar] = scheduled.with_attr("tirx.is_scheduled", True)
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def coverage() -> list[tuple[str, str | None, bool]]:
    """(relax op, tvmgrad backward op or None, has TVM's own gradient) for every Relax op that
    either tvmgrad or TVM differentiates."""
    rows = []
    for name in sorted({*GRADIENTS, *_tvm_differentiable()}):
        rule = GRADIENTS.get(name)
        ours = rule.op if rule is not None and registry.get(rule.op).available else None
        rows.append((name, ours, name in _tvm_differentiable()))
    return rows


@functools.cache
def _tvm_differentiable() -> frozenset[str]:
    """Relax ops for which TVM itself registers a gradient; read once, before ours shadow them."""
    import tvm
    from tvm.relax.op import _op_gradient  # noqa: F401 - registers TVM's gradients
    found = set()
    for name in _all_relax_ops():
        try:
            op = tvm.ir.Op.get(name)
        except Exception:  # noqa: BLE001 - a global function that is not an op
            continue
        if op.get_attr("FPrimalGradient") is not None:
            found.add(name)
    return frozenset(found)


def _all_relax_ops() -> list[str]:
    import tvm_ffi
    return sorted({"relax." + n[len("relax.op."):] for n in tvm_ffi.registry.list_global_func_names()
                   if n.startswith("relax.op.")})
