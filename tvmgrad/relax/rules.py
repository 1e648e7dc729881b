"""How each Relax op's gradient maps onto backward.yaml ops: ``GRADIENTS`` (Relax op -> rule) and
the per-op graph glue. The gradients that need more graph work live in their own modules, which
this registry imports (``conv``, ``batch_norm``, ``composite``; none imports it back); forms a rule
does not cover go to TVM's own gradient (``fallback``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from . import composite
from .batch_norm import batch_norm_grad
from .conv import conv2d_grad, inverse_permutation, layout_permutation
from .emit import emit, same_shape
from .fallback import tvm_fallback

__all__ = ["GRADIENTS", "RelaxGrad", "NO_GRAD"]


@dataclass(frozen=True)
class RelaxGrad:
    """How a Relax op's gradient maps onto a backward.yaml op.

    ``inputs(call, out, grad) -> dict`` builds the YAML op's tensor inputs from the forward call
    (its args), its output and the output gradient; ``attrs(call) -> dict`` its attributes;
    ``results`` names, per Relax tensor arg, the YAML output that is its gradient (None: not
    differentiable, a zero gradient). ``custom(ctx, call, out, grad, target) -> [grad per arg]``
    replaces all that for ops that need extra graph work (layer_norm recomputes its statistics).
    ``local``: the kernel is one tvmgrad.relax builds itself (``kernels.py``; backward.yaml has
    no such op), ``op`` names it."""

    op: str
    inputs: Callable | None
    results: tuple
    attrs: Callable = lambda call: {}
    custom: Callable | None = None
    local: bool = False

    @property
    def available(self) -> bool:
        from .. import registry
        return self.local or registry.get(self.op).available


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
    "relax.atan2": RelaxGrad("atan2_grad", None, ("x_grad", "y_grad"),
                             custom=lambda ctx, c, o, g, t: _broadcast_pair(ctx, "atan2_grad", c, o, g, t)),
    "relax.floor": RelaxGrad("floor_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.ceil": RelaxGrad("ceil_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.round": RelaxGrad("round_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.trunc": RelaxGrad("trunc_grad", lambda c, o, g: {"out_grad": g}, ("input_grad",)),
    "relax.sign": RelaxGrad("sign_grad", lambda c, o, g: {"out_grad": g}, ("x_grad",)),
    "relax.nn.log_softmax": RelaxGrad("log_softmax_grad", _out_g, ("x_grad",),
                                      lambda c: {"axis": int(c.attrs.axis)}),
}

def _conv_grad(op, layouts):
    """relax.nn.conv2d/conv3d (OI.. filters; channels-first or -last data, output alike) ->
    conv2d_grad/conv3d_grad; other layouts or an out_dtype cast: TVM's gradient (conv2d) or an
    error (conv3d)."""
    def grad_fn(ctx, call, out, grad, target):
        a = call.attrs
        data, kernel = str(a.data_layout), str(a.kernel_layout)
        if (data not in layouts or kernel != layouts[0].replace("N", "O").replace("C", "I")
                or str(a.out_layout) not in ("", data)
                or (a.out_dtype is not None and str(a.out_dtype) not in ("", "void", str(call.args[0].ty.dtype)))):
            return tvm_fallback(ctx, call, out, grad, f"layouts {data}/{kernel}/{a.out_layout}")
        pad = [int(p) for p in a.padding]
        dims = len(pad) // 2                   # Relax: all low sides, then all high sides
        attrs = {"strides": [int(v) for v in a.strides],
                 "paddings": [v for d in range(dims) for v in (pad[d], pad[dims + d])],
                 "dilations": [int(d) for d in a.dilation], "groups": int(a.groups),
                 "data_format": data, "padding_algorithm": "EXPLICIT"}
        dx, dw = emit(ctx, op, {"input": call.args[0], "filter": call.args[1], "out_grad": grad}, attrs,
                      target=target)
        return [dx, dw]
    return grad_fn




def _to_trailing(ctx, x, grad, axes):
    """x and grad permuted so that the normalised ``axes`` (in their given order: gamma's) come
    last; -> (x, grad, first normalised axis, the permutation back or None)."""
    from tvm import relax
    rank = x.ty.ndim
    axes = [int(ax) % rank for ax in axes]
    perm = [i for i in range(rank) if i not in axes] + axes
    begin = rank - len(axes)
    if perm == list(range(rank)):
        return x, grad, begin, None
    x = ctx.emit(relax.op.permute_dims(x, perm))
    grad = ctx.emit(relax.op.permute_dims(grad, perm))
    return x, grad, begin, inverse_permutation(perm)


def _layer_norm_grad(ctx, call, out, grad, target):
    """relax.nn.layer_norm -> layer_norm_grad; mean and variance recomputed. Normalised axes
    that are not the trailing ones (in order) are moved there around the kernel."""
    from tvm import relax
    x0, gamma, beta = call.args[:3]
    x, grad, begin, back = _to_trailing(ctx, x0, grad, call.attrs.axes)
    rank = x.ty.ndim
    axes = list(range(begin, rank))
    shape = list(x.ty.shape.values)
    rows = _prod(shape[:begin])
    mean = ctx.emit(relax.op.reshape(relax.op.mean(x, axis=axes, keepdims=False), [rows]))
    var = ctx.emit(relax.op.reshape(relax.op.variance(x, axis=axes, keepdims=False), [rows]))
    cols = _prod(shape[begin:])
    scale = ctx.emit(relax.op.reshape(gamma, [cols]))
    bias = ctx.emit(relax.op.reshape(beta, [cols]))
    dx, dscale, dbias = emit(ctx, "layer_norm_grad",
                             {"x": x, "scale": scale, "bias": bias, "mean": mean, "variance": var,
                              "out_grad": grad},
                             {"epsilon": float(call.attrs.epsilon), "begin_norm_axis": begin}, target=target)
    if back is not None:
        dx = ctx.emit(relax.op.permute_dims(dx, back))
    dscale = ctx.emit(relax.op.reshape(relax.op.astype(dscale, gamma.ty.dtype), gamma.ty.shape))
    dbias = ctx.emit(relax.op.reshape(relax.op.astype(dbias, beta.ty.dtype), beta.ty.shape))
    return [dx, dscale, dbias]


def _nll_loss_grad(ctx, call, out, grad, target):
    """relax.nn.nll_loss -> nll_loss_grad, with the forward's total weight recomputed. Every rank
    Relax takes: (C,) with a scalar label is batch 1, (N, C) and (N, C, H, W) go straight to the
    kernel, (N, C, d1) and (N, C, d1, ..., dk) (k > 2) are viewed as (N, C, d1·...·dk, 1) around
    it (the labels, and an unreduced output grad, alike). Labels and weights: no_grad."""
    from tvm import relax
    from tvm.relax.op.grad import no_grad
    pred, labels = call.args[0], call.args[1]
    weights = call.args[2] if len(call.args) > 2 else None
    ignore = int(call.attrs.ignore_index)
    reduction = str(call.attrs.reduction)
    dtype = pred.ty.dtype
    shape = list(pred.ty.shape.values)
    rank = len(shape)
    if rank == 1:
        view = [1, shape[0]]
    elif rank in (2, 4):
        view = None
    else:
        view = [shape[0], shape[1], _prod(shape[2:]), 1]
    if view is not None:
        pred = ctx.emit(relax.op.reshape(pred, view))
        lab_view = [view[0]] + view[2:]
        labels = ctx.emit(relax.op.reshape(labels, lab_view))
        if reduction == "none":
            grad = ctx.emit(relax.op.reshape(grad, lab_view))
    if str(labels.ty.dtype) != "int64":
        labels = ctx.emit(relax.op.astype(labels, "int64"))
    keep = relax.op.not_equal(labels, relax.const(ignore, "int64"))
    valid = ctx.emit(relax.op.astype(keep, dtype))
    if weights is not None:
        safe = ctx.emit(relax.op.where(keep, labels, relax.op.zeros_like(labels)))
        valid = ctx.emit(relax.op.multiply(valid, relax.op.take(weights, safe, axis=0)))
    total = ctx.emit(relax.op.sum(valid))
    if reduction != "none" and grad.ty.ndim != 0:
        grad = ctx.emit(relax.op.reshape(grad, []))
    dx = emit(ctx, "nll_loss_grad", {"input": pred, "label": labels, "weight": weights, "total_weight": total,
                                     "out_grad": grad},
              {"ignore_index": ignore, "reduction": reduction}, target=target)
    if view is not None:
        dx = ctx.emit(relax.op.reshape(dx, shape))
    return [dx] + [no_grad(a) for a in call.args[1:]]


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
    cond, x, y = call.args
    c, xf, yf = _at_shape(ctx, out, cond, x, y)
    from tvm.relax.op.grad import no_grad
    dx, dy = emit(ctx, "where_grad", {"condition": c, "x": xf, "y": yf, "out_grad": grad}, target=target)
    return [no_grad(cond)] + _summed_back(out, (dx, x), (dy, y))


def _broadcast_to_grad(ctx, call, out, grad, target):
    """relax.broadcast_to (leading dims may be added) -> expand_grad (sums back to x's shape);
    the target shape is not differentiable. expand_grad reads only x's and out_grad's shapes, so
    its ``shape`` attribute is given as a placeholder when the target shape is symbolic."""
    from tvm.relax.op.grad import no_grad
    shape = [int(d.value) if hasattr(d, "value") else -1 for d in out.ty.shape.values]
    dx = emit(ctx, "expand_grad", {"x": call.args[0], "out_grad": grad}, {"shape": shape}, target=target)
    return [dx, no_grad(call.args[1])]


def _concat_grad(ctx, call, out, grad, target):
    """relax.concat of a tuple -> concat_grad (one gradient per tuple field, as a tuple)."""
    from tvm import relax
    axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
    grads = emit(ctx, "concat_grad", {"x": _fields(ctx, call.args[0]), "out_grad": grad}, {"axis": axis},
                 target=target)
    return [relax.Tuple(grads)]


def _expand_dims_grad(ctx, call, out, grad, target):
    """relax.expand_dims -> unsqueeze_grad (reads xshape's shape only: x itself serves)."""
    axes = [int(a) for a in call.attrs.axis]
    return [emit(ctx, "unsqueeze_grad", {"xshape": call.args[0], "out_grad": grad}, {"axis": axes},
                 target=target)]


def _in_range(ctx, indices, size, mode: str):
    """The indices relax.take really reads for ``mode`` ('clip' clamps, 'wrap' wraps; 'fast'
    trusts them) along an axis of ``size`` (an int or a symbolic dim)."""
    from tvm import relax, tirx
    dt = indices.ty.dtype
    if mode == "clip":
        return ctx.emit(relax.op.clip(indices, relax.prim_value(tirx.const(0, "int64")),
                                      relax.prim_value(size - 1)))
    if mode == "wrap":
        n = relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([size])), [])
        return ctx.emit(relax.op.floor_mod(indices, relax.op.astype(n, dt)))
    return indices


def _take_grad(ctx, call, out, grad, target):
    """relax.take -> index_select_grad, N-d indices flattened (and the grad reshaped to match);
    axis None takes from 1-D data, i.e. axis 0. The indices are first mapped as ``mode`` does
    (TVM's own take gradient ignores ``mode`` and handles 1-D indices only). 'fast' indices must
    be in range: a graph has no data to check, as in TVM's take."""
    from tvm import relax
    from tvm.relax.op.grad import no_grad
    x, indices, a = call.args[0], call.args[1], call.attrs
    shape = list(x.ty.shape.values)
    axis = int(a.axis) % len(shape) if a.axis is not None else 0
    count = functools.reduce(lambda p, d: p * d, indices.ty.shape.values, 1)
    flat = ctx.emit(relax.op.reshape(indices, [count])) if indices.ty.ndim != 1 else indices
    taken = ctx.emit(relax.op.reshape(grad, shape[:axis] + [count] + shape[axis + 1:]))
    dx = emit(ctx, "index_select_grad",
              {"x": x, "index": _in_range(ctx, flat, shape[axis], str(a.mode)), "out_grad": taken},
              {"axis": axis}, target=target)
    return [dx, no_grad(indices)]


GRADIENTS["relax.concat"] = RelaxGrad("concat_grad", None, ("x_grad",), custom=_concat_grad)
GRADIENTS["relax.expand_dims"] = RelaxGrad("unsqueeze_grad", None, ("x_grad",), custom=_expand_dims_grad)
GRADIENTS["relax.take"] = RelaxGrad("index_select_grad", None, ("x_grad", None), custom=_take_grad)
GRADIENTS["relax.cumsum"] = RelaxGrad("cumsum_grad", None, ("x_grad",), custom=_cumsum_grad)
GRADIENTS["relax.broadcast_to"] = RelaxGrad("expand_grad", None, ("x_grad", None), custom=_broadcast_to_grad)
GRADIENTS["relax.where"] = RelaxGrad("where_grad", None, (None, "x_grad", "y_grad"), custom=_where_grad)
GRADIENTS["relax.nn.nll_loss"] = RelaxGrad("nll_loss_grad", None, ("input_grad", None, None),
                                           custom=_nll_loss_grad)
GRADIENTS["relax.nn.conv2d"] = RelaxGrad("conv2d_grad", None, ("input_grad", "filter_grad"),
                                         custom=conv2d_grad)
GRADIENTS["relax.nn.layer_norm"] = RelaxGrad("layer_norm_grad", None, ("x_grad", "scale_grad", "bias_grad"),
                                             custom=_layer_norm_grad)


# ------------------------------------------------------------------------------------------
# Shared glue: tuple fields, broadcast-then-collapse


def _fields(ctx, parts):
    from tvm import relax
    if isinstance(parts, relax.Tuple):
        return list(parts.fields)
    return [ctx.emit(relax.TupleGetItem(parts, i)) for i in range(len(parts.ty.fields))]


def _static(*exprs) -> bool:
    """Whether every dim of these tensors (or of a list of dims) is a constant."""
    dims = []
    for e in exprs:
        dims += list(e.ty.shape.values) if hasattr(e, "ty") else list(e)
    return all(isinstance(d, int) or hasattr(d, "value") for d in dims)


_SYMBOLIC = "symbolic dims (its tvmgrad planner needs static shapes here)"


def _prod(dims):
    return functools.reduce(lambda p, d: p * d, dims, 1)


def _at_shape(ctx, out, *tensors):
    """Relax broadcasts elementwise inputs; Paddle's grads take them at the output's shape."""
    from tvm import relax
    shape = out.ty.shape
    return [t if t.ty.shape.same_as(shape) else ctx.emit(relax.op.broadcast_to(t, shape)) for t in tensors]


def _summed_back(out, *pairs):
    """Each (grad at the output's shape, input) summed back to the input's shape."""
    from tvm import relax
    return [d if t.ty.shape.same_as(out.ty.shape) else relax.op.collapse_sum_to(d, t.ty.shape)
            for d, t in pairs]


def _broadcast_pair(ctx, op, call, out, grad, target):
    """Binary ops: broadcast x and y to the output's shape, run ``op``, sum the grads back."""
    x, y = call.args
    xf, yf = _at_shape(ctx, out, x, y)
    dx, dy = emit(ctx, op, {"x": xf, "y": yf, "out_grad": grad}, target=target)
    return _summed_back(out, (dx, x), (dy, y))


def _matmul_grad(ctx, call, out, grad, target):
    """relax.matmul -> bmm_grad on (B, M, K) @ (B, K, N) views: 2-D operands as batch 1, an N-D x
    times a 2-D y with x's leading dims folded into rows, equal batch dims folded into one;
    1-D operands via a unit dim; symbolic dims stay symbolic. Other broadcasting, mixed dtypes
    and out_dtype: TVM's gradient."""
    from tvm import relax
    from tvm.sym import Analyzer
    x, y = call.args
    xs, ys = list(x.ty.shape.values), list(y.ty.shape.values)
    out_dtype = call.attrs.out_dtype
    if str(x.ty.dtype) != str(y.ty.dtype) or (out_dtype is not None and str(out_dtype) not in
                                              ("", "void", str(x.ty.dtype))):
        return tvm_fallback(ctx, call, out, grad, "mixed dtypes or an out_dtype")
    x2 = xs if len(xs) > 1 else [1] + xs            # (K,) -> (1, K): a row
    y2 = ys if len(ys) > 1 else ys + [1]            # (K,) -> (K, 1): a column
    xb, yb = x2[:-2], y2[:-2]
    m, k, n = x2[-2], x2[-1], y2[-1]
    ana = Analyzer()
    if not yb:                                       # (B.., M, K) @ (K, N): rows B*M
        b, m = 1, _prod(xb) * m
    elif len(xb) == len(yb) and all(ana.can_prove_equal(p, q) for p, q in zip(xb, yb)):
        b = _prod(xb)
    else:
        return tvm_fallback(ctx, call, out, grad, "broadcast batch dims")
    x3 = ctx.emit(relax.op.reshape(x, [b, m, k]))
    y3 = ctx.emit(relax.op.reshape(y, [b, k, n]))
    g3 = ctx.emit(relax.op.reshape(grad, [b, m, n]))
    dx, dy = emit(ctx, "bmm_grad", {"x": x3, "y": y3, "out_grad": g3}, target=target)
    return [relax.op.reshape(dx, xs), relax.op.reshape(dy, ys)]


def _mean_grad(ctx, call, out, grad, target):
    """relax.mean over every axis of a static shape -> mean_all_grad (its view counts elements);
    over some axes, or symbolic shapes (where TVM's gradient fails): the grad broadcast back
    and divided by the count, in Relax."""
    from tvm import relax
    x, a = call.args[0], call.attrs
    rank = x.ty.ndim
    axes = sorted(set(range(rank)) if a.axis is None else {int(ax) % rank for ax in a.axis})
    if axes == list(range(rank)) and _static(x):
        g = grad if grad.ty.ndim == 0 else ctx.emit(relax.op.reshape(grad, []))
        return [emit(ctx, "mean_all_grad", {"x": x, "out_grad": g}, target=target)]
    shape = list(x.ty.shape.values)
    count = _prod([shape[i] for i in axes])
    dtype = str(x.ty.dtype)
    if _static([count]):
        scaled = relax.op.multiply(grad, relax.const(1.0 / int(getattr(count, "value", count)), dtype))
    else:
        n = relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([count])), [])
        scaled = relax.op.divide(grad, relax.op.astype(n, dtype))
    kept = [1 if i in axes else d for i, d in enumerate(shape)]
    g = ctx.emit(relax.op.reshape(scaled, kept))
    return [relax.op.broadcast_to(g, x.ty.shape)]


def _minmax_grad(op):
    """relax.maximum/minimum -> fmax_grad/fmin_grad (equal for non-NaN inputs; a tie sends the
    grad to x, as Paddle's fmax/fmin — TVM's maximum does too, its minimum sends it to y)."""
    def grad_fn(ctx, call, out, grad, target):
        if call.args[0].ty.dtype != call.args[1].ty.dtype or "float" not in str(call.args[0].ty.dtype):
            return tvm_fallback(ctx, call, out, grad, "non-float or mixed dtypes")
        return _broadcast_pair(ctx, op, call, out, grad, target)
    return grad_fn


def _power_grad(ctx, call, out, grad, target):
    """relax.power(x, scalar constant) -> pow_grad (the exponent gets no gradient); otherwise
    TVM's gradient."""
    import tvm
    from tvm.relax.op.grad import no_grad
    x, y = call.args
    if not (isinstance(y, tvm.ir.expr.Constant) and y.value.numpy().size == 1 and "float" in str(x.ty.dtype)
            and same_shape(out.ty.shape.values, x.ty.shape.values)):
        return tvm_fallback(ctx, call, out, grad, "exponent is not a scalar constant")
    value = float(y.value.numpy().reshape(-1)[0])
    return [emit(ctx, "pow_grad", {"x": x, "out_grad": grad}, {"y": value}, target=target), no_grad(y)]


def _squeeze_grad(ctx, call, out, grad, target):
    """relax.squeeze -> squeeze_grad (a reshape back to x's shape)."""
    x, a = call.args[0], call.attrs
    if not _static(x):
        return [_reshape_back(grad, x)]
    shape = x.ty.shape.values
    if a.axis is None:
        axes = [i for i, d in enumerate(shape) if hasattr(d, "value") and int(d.value) == 1]
    else:
        axes = [int(ax) for ax in a.axis]
    return [emit(ctx, "squeeze_grad", {"xshape": x, "out_grad": grad}, {"axis": axes}, target=target)]


def _reshape_back(grad, x):
    """What squeeze_grad/flatten_grad (alias ops, no kernel) do, for symbolic shapes that their
    planner cannot compare."""
    from tvm import relax
    return relax.op.reshape(grad, x.ty.shape)


def _flatten_grad(ctx, call, out, grad, target):
    """relax.flatten -> flatten_grad (a reshape back to x's shape)."""
    x = call.args[0]
    if not _static(x):
        return [_reshape_back(grad, x)]
    return [emit(ctx, "flatten_grad", {"xshape": x, "out_grad": grad}, target=target)]


def _flip_grad(ctx, call, out, grad, target):
    """relax.flip (one axis) -> flip_grad."""
    return [emit(ctx, "flip_grad", {"out_grad": grad}, {"axis": [int(call.attrs.axis)]}, target=target)]


def _stack_grad(ctx, call, out, grad, target):
    """relax.stack of a tuple -> stack_grad (one gradient per tuple field, as a tuple)."""
    from tvm import relax
    fields = _fields(ctx, call.args[0])
    axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
    grads = emit(ctx, "stack_grad", {"x": fields, "out_grad": grad}, {"axis": axis}, target=target)
    return [relax.Tuple(grads)]


def _cumprod_grad(ctx, call, out, grad, target):
    """relax.cumprod (inclusive; axis None: over the flattened data) -> cumprod_grad."""
    from tvm import relax
    x, a = call.args[0], call.attrs
    if bool(a.exclusive) or (a.dtype is not None and str(a.dtype) not in ("", "void", str(x.ty.dtype))):
        return tvm_fallback(ctx, call, out, grad, "exclusive or dtype-casting cumprod")
    if a.axis is None:
        if not _static(x):
            return tvm_fallback(ctx, call, out, grad, "axis None with " + _SYMBOLIC)
        flat = ctx.emit(relax.op.reshape(x, out.ty.shape))
        dx = emit(ctx, "cumprod_grad", {"x": flat, "out": out, "out_grad": grad}, {"dim": 0}, target=target)
        return [relax.op.reshape(dx, x.ty.shape)]
    return [emit(ctx, "cumprod_grad", {"x": x, "out": out, "out_grad": grad}, {"dim": int(a.axis)},
                 target=target)]


def _gather_elements_grad(ctx, call, out, grad, target):
    """relax.gather_elements -> take_along_axis_grad (repeated indices add up)."""
    from tvm.relax.op.grad import no_grad
    x, idx = call.args
    if not _static(x, idx):
        return tvm_fallback(ctx, call, out, grad, _SYMBOLIC)
    dx = emit(ctx, "take_along_axis_grad", {"arr": x, "indices": idx, "out_grad": grad},
              {"axis": int(call.attrs.axis)}, target=target)
    return [dx, no_grad(idx)]


def _gather_nd_grad(ctx, call, out, grad, target):
    """relax.gather_nd (batch_dims 0) -> gather_nd_grad (repeated addresses add up)."""
    from tvm.relax.op.grad import no_grad
    x, idx = call.args
    if int(call.attrs.batch_dims) != 0:
        return tvm_fallback(ctx, call, out, grad, "batch_dims != 0")
    return [emit(ctx, "gather_nd_grad", {"x": x, "index": idx, "out_grad": grad}, target=target), no_grad(idx)]


_SCATTER_REDUCE = {"update": "assign", "add": "add", "mul": "mul", "min": "amin", "max": "amax"}


def _scatter_elements_grad(ctx, call, out, grad, target):
    """relax.scatter_elements -> put_along_axis_grad (include_self: the data takes part).
    update/add/mul/min/max; TVM's 'mean' is a running pairwise average (out = (out + u)/2 per
    update), not a mean, and has no YAML counterpart."""
    from tvm.relax.op.grad import no_grad
    x, idx, upd = call.args
    red = str(call.attrs.reduction)
    if red not in _SCATTER_REDUCE:
        return tvm_fallback(ctx, call, out, grad, f"reduction {red!r}")
    if not _static(x, idx):
        return tvm_fallback(ctx, call, out, grad, _SYMBOLIC)
    dx, du = emit(ctx, "put_along_axis_grad",
                  {"arr": x, "indices": idx, "values": upd, "out": out, "out_grad": grad},
                  {"axis": int(call.attrs.axis), "reduce": _SCATTER_REDUCE[red], "include_self": True},
                  target=target)
    return [dx, no_grad(idx), du]


def _prelu_grad(ctx, call, out, grad, target):
    """relax.nn.prelu (one alpha per channel of ``axis``: 1 or the last) -> prelu_grad, mode
    'channel'."""
    from tvm import relax
    x, alpha = call.args
    rank, axis = x.ty.ndim, int(call.attrs.axis) % x.ty.ndim
    if rank < 2 or axis not in (1, rank - 1):
        return tvm_fallback(ctx, call, out, grad, f"channel axis {axis} of a rank-{rank} input")
    fmt = "NCHW" if axis == 1 else "NHWC"
    dx, da = emit(ctx, "prelu_grad", {"x": x, "alpha": alpha, "out_grad": grad},
                  {"data_format": fmt, "mode": "channel"}, target=target)
    return [dx, relax.op.reshape(da, alpha.ty.shape)]


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _pixel_shuffle_grad(ctx, call, out, grad, target):
    """relax.nn.pixel_shuffle (NCHW) -> pixel_shuffle_grad."""
    if call.args[0].ty.ndim != 4:
        return tvm_fallback(ctx, call, out, grad, "input is not 4-D NCHW")
    return [emit(ctx, "pixel_shuffle_grad", {"out_grad": grad},
                 {"upscale_factor": int(call.attrs.upscale_factor), "data_format": "NCHW"}, target=target)]


def _rms_norm_grad(ctx, call, out, grad, target):
    """relax.nn.rms_norm -> rms_norm_grad, 1/rms recomputed per row (normalised axes moved to
    the end when they are not there)."""
    from tvm import relax
    x0, w = call.args
    x, grad, begin, back = _to_trailing(ctx, x0, grad, call.attrs.axes)
    shape = list(x.ty.shape.values)
    rows, cols = _prod(shape[:begin]), _prod(shape[begin:])
    eps = float(call.attrs.epsilon)
    axes = list(range(begin, len(shape)))
    ms = relax.op.mean(relax.op.multiply(x, x), axis=axes, keepdims=False)
    inv = ctx.emit(relax.op.reshape(relax.op.rsqrt(relax.op.add(ms, relax.const(eps, x.ty.dtype))), [rows]))
    weight = ctx.emit(relax.op.reshape(w, [cols]))
    dx, dw = emit(ctx, "rms_norm_grad", {"x": x, "norm_weight": weight, "inv_var": inv, "out_grad": grad},
                  {"epsilon": eps, "begin_norm_axis": begin, "quant_scale": -1.0}, target=target)
    if back is not None:
        dx = ctx.emit(relax.op.permute_dims(dx, back))
    return [dx, relax.op.reshape(dw, w.ty.shape)]


_GN_FORMATS = {3: ("NCL", "NLC"), 4: ("NCHW", "NHWC"), 5: ("NCDHW", "NDHWC")}


def _norm_stats(ctx, x, groups_view, axes, eps=None):
    """(mean, variance) of ``x`` viewed as ``groups_view`` over ``axes``, flattened; with ``eps``
    the second is 1/√(variance + eps)."""
    from tvm import relax
    v = ctx.emit(relax.op.reshape(x, groups_view))
    count = _prod([d for i, d in enumerate(groups_view) if i not in axes])
    mean = ctx.emit(relax.op.reshape(relax.op.mean(v, axis=axes), [count]))
    var = relax.op.reshape(relax.op.variance(v, axis=axes), [count])
    if eps is not None:
        var = relax.op.rsqrt(relax.op.add(var, relax.const(eps, x.ty.dtype)))
    return mean, ctx.emit(var)


def _affine_grads(dscale, dbias, call, gamma, beta):
    from tvm import relax
    from tvm.relax.op.grad import no_grad
    return [relax.op.reshape(dscale, gamma.ty.shape) if bool(call.attrs.scale) else no_grad(gamma),
            relax.op.reshape(dbias, beta.ty.shape) if bool(call.attrs.center) else no_grad(beta)]


def _group_norm_grad(ctx, call, out, grad, target):
    """relax.nn.group_norm (channels at 1 with the rest reduced, or channels last) ->
    group_norm_grad, per-(sample, group) mean and variance recomputed."""
    x, gamma, beta = call.args
    a, rank = call.attrs, x.ty.ndim
    c_axis = int(a.channel_axis) % rank
    axes = sorted(int(ax) % rank for ax in a.axes)
    g = int(a.num_groups)
    if rank not in _GN_FORMATS or (c_axis, axes) not in ((1, list(range(2, rank))),
                                                         (rank - 1, list(range(1, rank - 1)))):
        return tvm_fallback(ctx, call, out, grad, f"channel_axis {c_axis} with axes {axes}")
    shape = list(x.ty.shape.values)
    last = c_axis == rank - 1
    if last:
        view, red = [shape[0], _prod(shape[1:-1]), g, shape[-1] // g], [1, 3]
    else:
        view, red = [shape[0], g, shape[1] // g, _prod(shape[2:])], [2, 3]
    mean, var = _norm_stats(ctx, x, view, red)
    dx, ds, db = emit(ctx, "group_norm_grad",
                      {"x": x, "scale": gamma if bool(a.scale) else None,
                       "bias": beta if bool(a.center) else None, "y": out, "mean": mean, "variance": var,
                       "y_grad": grad},
                      {"epsilon": float(a.epsilon), "groups": g, "data_format": _GN_FORMATS[rank][last]},
                      target=target)
    return [dx] + _affine_grads(ds, db, call, gamma, beta)


def _instance_norm_grad(ctx, call, out, grad, target):
    """relax.nn.instance_norm (channels at 1, the rest reduced) -> instance_norm_grad, per-(n, c)
    mean and 1/std recomputed."""
    x, gamma, beta = call.args
    a, rank = call.attrs, x.ty.ndim
    if int(a.channel_axis) % rank != 1 or sorted(int(ax) % rank for ax in a.axes) != list(range(2, rank)):
        return tvm_fallback(ctx, call, out, grad, "only channel_axis 1 with the rest normalised")
    shape = list(x.ty.shape.values)
    mean, inv = _norm_stats(ctx, x, [shape[0], shape[1], _prod(shape[2:])], [2], float(a.epsilon))
    dx, ds, db = emit(ctx, "instance_norm_grad",
                      {"x": x, "scale": gamma if bool(a.scale) else None, "saved_mean": mean,
                       "saved_variance": inv, "y_grad": grad}, {"epsilon": float(a.epsilon)}, target=target)
    return [dx] + _affine_grads(ds, db, call, gamma, beta)


GRADIENTS.update({
    "relax.matmul": RelaxGrad("bmm_grad", None, ("x_grad", "y_grad"), custom=_matmul_grad),
    "relax.mean": RelaxGrad("mean_all_grad", None, ("x_grad",), custom=_mean_grad),
    "relax.maximum": RelaxGrad("fmax_grad", None, ("x_grad", "y_grad"), custom=_minmax_grad("fmax_grad")),
    "relax.minimum": RelaxGrad("fmin_grad", None, ("x_grad", "y_grad"), custom=_minmax_grad("fmin_grad")),
    "relax.power": RelaxGrad("pow_grad", None, ("x_grad", None), custom=_power_grad),
    "relax.squeeze": RelaxGrad("squeeze_grad", None, ("x_grad",), custom=_squeeze_grad),
    "relax.flatten": RelaxGrad("flatten_grad", None, ("x_grad",), custom=_flatten_grad),
    "relax.flip": RelaxGrad("flip_grad", None, ("x_grad",), custom=_flip_grad),
    "relax.stack": RelaxGrad("stack_grad", None, ("x_grad",), custom=_stack_grad),
    "relax.cumprod": RelaxGrad("cumprod_grad", None, ("x_grad",), custom=_cumprod_grad),
    "relax.gather_elements": RelaxGrad("take_along_axis_grad", None, ("arr_grad", None),
                                       custom=_gather_elements_grad),
    "relax.gather_nd": RelaxGrad("gather_nd_grad", None, ("x_grad", None), custom=_gather_nd_grad),
    "relax.scatter_elements": RelaxGrad("put_along_axis_grad", None, ("arr_grad", None, "values_grad"),
                                        custom=_scatter_elements_grad),
    "relax.nn.prelu": RelaxGrad("prelu_grad", None, ("x_grad", "alpha_grad"), custom=_prelu_grad),
    "relax.nn.selu": RelaxGrad("selu_grad", _out_g, ("x_grad",),
                               lambda c: {"scale": _SELU_SCALE, "alpha": _SELU_ALPHA}),
    "relax.nn.pixel_shuffle": RelaxGrad("pixel_shuffle_grad", None, ("x_grad",), custom=_pixel_shuffle_grad),
    "relax.nn.rms_norm": RelaxGrad("rms_norm_grad", None, ("x_grad", "norm_weight_grad"),
                                   custom=_rms_norm_grad),
    "relax.nn.group_norm": RelaxGrad("group_norm_grad", None, ("x_grad", "scale_grad", "bias_grad"),
                                     custom=_group_norm_grad),
    "relax.nn.instance_norm": RelaxGrad("instance_norm_grad", None, ("x_grad", "scale_grad", "bias_grad"),
                                        custom=_instance_norm_grad),
})



def _sort_grad(ctx, call, out, grad, target):
    """relax.sort -> argsort_grad, the permutation recomputed with relax.argsort (tied values
    may swap their grads: the same values either way)."""
    from tvm import relax
    x, a = call.args[0], call.attrs
    idx = ctx.emit(relax.op.argsort(x, axis=int(a.axis), descending=bool(a.descending), dtype="int64"))
    return [emit(ctx, "argsort_grad", {"indices": idx, "x": x, "out_grad": grad},
                 {"axis": int(a.axis), "descending": bool(a.descending), "stable": True}, target=target)]


GRADIENTS.update({
    "relax.nn.conv3d": RelaxGrad("conv3d_grad", None, ("input_grad", "filter_grad"),
                                 custom=_conv_grad("conv3d_grad", ("NCDHW", "NDHWC"))),
    "relax.sort": RelaxGrad("argsort_grad", None, ("x_grad",), custom=_sort_grad),
})



_RESIZE = {("linear", "half_pixel"): ("bilinear", False, 0), ("linear", "align_corners"): ("bilinear", True, 1), ("linear", "asymmetric"): ("bilinear", False, 1),
           ("nearest_neighbor", "asymmetric", "floor"): ("nearest", False, 1),
           ("nearest_neighbor", "align_corners", "round"): ("nearest", True, 1)}


def _resize2d_grad(ctx, call, out, grad, target):
    """relax.image.resize2d -> bilinear_interp_grad (linear: half_pixel, align_corners, asymmetric)
    or nearest_interp_grad (nearest_neighbor: asymmetric + floor, align_corners + round), Paddle's
    align_corners/align_mode spelling of the same coordinate maps; static output size."""
    x, a = call.args[0], call.attrs
    method, mode = str(a.method), str(a.coordinate_transformation_mode)
    key = (method, mode) if method == "linear" else (method, mode, str(a.rounding_method))
    layout = str(a.layout)
    sizes = list(out.ty.shape.values)[2:] if layout == "NCHW" else list(out.ty.shape.values)[1:3]
    if key not in _RESIZE or layout not in ("NCHW", "NHWC") or not _static(sizes) or (
            a.out_dtype is not None and str(a.out_dtype) not in ("", "void", str(x.ty.dtype))):
        return tvm_fallback(ctx, call, out, grad, f"{method}/{mode}/{a.rounding_method} in {layout}")
    interp, align_corners, align_mode = _RESIZE[key]
    from tvm.relax.op.grad import no_grad
    dx = emit(ctx, f"{interp}_interp_grad", {"x": x, "output_grad": grad},
              {"data_format": layout, "out_d": 0, "out_h": int(sizes[0]), "out_w": int(sizes[1]),
               "scale": [], "interp_method": interp, "align_corners": align_corners,
               "align_mode": align_mode}, target=target)
    return [dx, no_grad(call.args[1])]


def _grid_sample_grad(ctx, call, out, grad, target):
    """relax.image.grid_sample (NCHW, grid (N, 2, H, W)) -> grid_sample_grad, whose grid is
    (N, H, W, 2): permuted there and back. bilinear/nearest; zeros/border/reflection padding."""
    from tvm import relax
    x, grid = call.args
    a = call.attrs
    if str(a.layout) != "NCHW" or str(a.method) not in ("bilinear", "nearest") or x.ty.ndim != 4:
        return tvm_fallback(ctx, call, out, grad, f"method {a.method} in {a.layout}")
    g = ctx.emit(relax.op.permute_dims(grid, [0, 2, 3, 1]))
    dx, dg = emit(ctx, "grid_sample_grad", {"x": x, "grid": g, "out_grad": grad},
                  {"mode": str(a.method), "padding_mode": str(a.padding_mode),
                   "align_corners": bool(a.align_corners)}, target=target)
    return [dx, relax.op.permute_dims(dg, [0, 3, 1, 2])]


GRADIENTS.update({
    "relax.image.resize2d": RelaxGrad("bilinear_interp_grad", None, ("x_grad", None), custom=_resize2d_grad),
    "relax.image.grid_sample": RelaxGrad("grid_sample_grad", None, ("x_grad", "grid_grad"),
                                         custom=_grid_sample_grad),
})



def _topk_grad(ctx, call, out, grad, target):
    """relax.topk -> topk_grad: ret_type 'both' passes a (values, indices) tuple grad and has the
    indices in its output; 'values' recomputes them; 'indices' is not differentiable."""
    from tvm import relax
    x, a = call.args[0], call.attrs
    kind = str(a.ret_type)
    if kind == "indices":
        from tvm.relax.op.grad import no_grad
        return [no_grad(x)]
    opts = {"k": int(a.k), "axis": int(a.axis), "largest": bool(a.largest)}
    if kind == "both":
        grad = ctx.emit(relax.TupleGetItem(grad, 0))
        idx = ctx.emit(relax.TupleGetItem(out, 1))
    else:
        idx = ctx.emit(relax.op.topk(x, ret_type="indices", dtype="int64", **opts))
    if str(idx.ty.dtype) != "int64":
        idx = ctx.emit(relax.op.astype(idx, "int64"))
    return [emit(ctx, "topk_grad", {"x": x, "indices": idx, "out_grad": grad}, {**opts, "sorted": True},
                 target=target)]


GRADIENTS["relax.topk"] = RelaxGrad("topk_grad", None, ("x_grad",), custom=_topk_grad)


GRADIENTS["relax.nn.batch_norm"] = RelaxGrad("batch_norm_grad", None, ("x_grad", "scale_grad", "bias_grad", None, None),
                                             custom=batch_norm_grad, local=True)


# Ops whose results are integers or booleans, or constants (arange, eye): every argument is
# ``no_grad``, so that the Gradient pass stops there instead of failing for want of a gradient
# (TVM registers the same for its comparison ops). Only those TVM has no gradient for.
NO_GRAD = ("relax.logical_not", "relax.logical_and", "relax.logical_or", "relax.logical_xor",
           "relax.bitwise_not", "relax.bitwise_and", "relax.bitwise_or", "relax.bitwise_xor",
           "relax.left_shift", "relax.right_shift", "relax.argmax", "relax.argmin", "relax.argsort",
           "relax.isnan", "relax.isinf", "relax.isfinite", "relax.one_hot", "relax.shape_of",
           "relax.shape_to_tensor", "relax.tensor_to_shape", "relax.nonzero", "relax.unique",
           "relax.bucketize", "relax.floor_divide", "relax.arange", "relax.eye", "relax.eye_like")


def _conv1d_grad(ctx, call, out, grad, target):
    """relax.nn.conv1d -> the conv2d gradient with a unit height (NCW/NWC data, OIW filters;
    other permutations of them through permute_dims)."""
    from tvm import relax
    a = call.attrs
    x, w = call.args
    data, kernel = str(a.data_layout), str(a.kernel_layout)
    out_layout = str(a.out_layout) or data
    if a.out_dtype is not None and str(a.out_dtype) not in ("", "void", str(x.ty.dtype)):
        raise NotImplementedError(f"tvmgrad conv1d gradient: out_dtype {a.out_dtype} (TVM has no conv1d gradient)")
    px, pw, po = (layout_permutation(data, "NCW"), layout_permutation(kernel, "OIW"),
                  layout_permutation(out_layout, "NCW"))
    if px is None or pw is None or po is None:
        raise NotImplementedError(f"tvmgrad conv1d gradient: layouts {data}/{kernel}/{out_layout}")
    xc = ctx.emit(relax.op.permute_dims(x, px)) if px != [0, 1, 2] else x
    wc = ctx.emit(relax.op.permute_dims(w, pw)) if pw != [0, 1, 2] else w
    gc = ctx.emit(relax.op.permute_dims(grad, po)) if po != [0, 1, 2] else grad
    x4 = ctx.emit(relax.op.expand_dims(xc, [2]))
    w4 = ctx.emit(relax.op.expand_dims(wc, [2]))
    g4 = ctx.emit(relax.op.expand_dims(gc, [2]))
    pad = [int(v) for v in a.padding]
    call2 = ctx.normalize(relax.op.nn.conv2d(x4, w4, strides=[1, int(a.strides[0])], padding=[0, pad[0], 0, pad[1]],
                                             dilation=[1, int(a.dilation[0])], groups=int(a.groups)))
    dx4, dw4 = conv2d_grad(ctx, call2, None, g4, target)
    dx = ctx.emit(relax.op.squeeze(dx4, [2]))
    dw = ctx.emit(relax.op.squeeze(dw4, [2]))
    if px != [0, 1, 2]:
        dx = ctx.emit(relax.op.permute_dims(dx, inverse_permutation(px)))
    if pw != [0, 1, 2]:
        dw = ctx.emit(relax.op.permute_dims(dw, inverse_permutation(pw)))
    return [dx, dw]


GRADIENTS["relax.nn.conv1d"] = RelaxGrad("conv2d_grad", None, ("input_grad", "filter_grad"), custom=_conv1d_grad)


# gradients no backward.yaml op has: Relax ops around tvmgrad.relax kernels (composite.py)
GRADIENTS.update({
    "relax.strided_slice": RelaxGrad("strided_slice_grad", None, ("x_grad",), custom=composite.strided_slice_grad,
                                     local=True),
    "relax.nn.pad": RelaxGrad("pad_grad", None, ("x_grad",), custom=composite.pad_grad, local=True),
    "relax.tile": RelaxGrad("tile_grad", None, ("x_grad",), custom=composite.tile_grad, local=True),
    "relax.nn.adaptive_avg_pool2d": RelaxGrad("adaptive_avg_pool2d_grad", None, ("x_grad",),
                                              custom=composite.adaptive_avg_pool2d_grad, local=True),
    "relax.max": RelaxGrad("max_grad", None, ("x_grad",), custom=composite.extreme_grad, local=True),
    "relax.min": RelaxGrad("min_grad", None, ("x_grad",), custom=composite.extreme_grad, local=True),
    "relax.tril": RelaxGrad("tril_grad", None, ("x_grad", None), custom=composite.tril_grad, local=True),
    "relax.nn.conv2d_transpose": RelaxGrad("conv2d_transpose_grad", None, ("x_grad", "filter_grad"),
                                           custom=composite.conv2d_transpose_grad, local=True),
})
