"""Gradients of Relax ops that real models emit and neither TVM nor backward.yaml differentiates:
Relax ops around tvmgrad.relax kernels (``kernels.py``).

* ``strided_slice`` (``x[:, 1:5, ::2]``; any strides, negative too; static shapes): a gather
  kernel writing every element of dx once;
* ``nn.pad`` (constant mode): a slice of the grad;
* ``tile`` (``x.repeat``): the grad summed over the repeats;
* ``nn.adaptive_avg_pool2d`` (NCHW/NHWC; any output size, windows overlapping or not): the
  broadcast of g / window area when the sizes divide, else a gather kernel;
* ``max`` / ``min`` reductions (float): the grad split evenly among the tied extremes (as
  torch's ``amax`` / ``amin``);
* ``tril``: the grad's lower triangle (TVM has ``triu``'s only);
* ``nn.conv2d_transpose`` (NCHW data, IOHW filters; static shapes): dx is the forward conv2d of
  the grad with the same filter, dw a conv2d filter grad with the roles of x and g swapped.
"""

from __future__ import annotations

from .conv import choose
from .kernels import (adaptive_avg_pool2d_grad_plan, conv2d_filter_grad_plan, conv2d_gemm_plan,
                      conv2d_plan, dims_of, emit_plan, strided_slice_grad_plan)

__all__ = ["strided_slice_grad", "pad_grad", "tile_grad", "adaptive_avg_pool2d_grad", "extreme_grad",
           "conv2d_transpose_grad", "tril_grad"]


def _ints(expr) -> list:
    from tvm import relax
    if isinstance(expr, relax.Tuple):
        return [int(getattr(f, "value", f)) for f in expr.fields]
    if isinstance(expr, relax.ShapeExpr):
        return [int(getattr(f, "value", f)) for f in expr.values]
    return [int(getattr(f, "value", f)) for f in expr]


def _unsupported(call, why):
    return NotImplementedError(f"tvmgrad gradient of {call.op.name}: {why} (and TVM has no gradient for it)")


def strided_slice_grad(ctx, call, out, grad, target):
    from tvm import relax
    from tvm.relax.op.grad import no_grad
    x = call.args[0]
    xs, os_ = dims_of(x.ty.shape.values), dims_of(out.ty.shape.values)
    try:
        axes, begin, end = (_ints(a) for a in call.args[1:4])
        strides = _ints(call.args[4]) if len(call.args) > 4 and call.args[4] is not None else [1] * len(axes)
    except (TypeError, ValueError) as exc:
        raise _unsupported(call, "symbolic begin/end/strides") from exc
    if None in xs or None in os_:
        raise _unsupported(call, "symbolic shapes")
    rank = len(xs)
    slices = {}
    for a, b, s in zip(axes, begin, strides):
        a %= rank
        n = xs[a]
        if s == 0:
            raise _unsupported(call, "stride 0")
        if b < 0:
            b += n
        b = min(max(b, 0), n) if s > 0 else min(max(b, -1), n - 1)
        slices[a] = (b, s)
    plan = strided_slice_grad_plan(xs, os_, slices, str(x.ty.dtype))
    dx = emit_plan(ctx, "strided_slice_grad", plan, [grad], [relax.TensorType(list(xs), str(x.ty.dtype))],
                   target=target)
    return [dx] + [no_grad(a) for a in call.args[1:]]


def pad_grad(ctx, call, out, grad, target):
    from tvm import relax
    from tvm.relax.op.grad import no_grad
    x = call.args[0]
    a = call.attrs
    if str(a.pad_mode) != "constant":
        raise _unsupported(call, f"pad_mode {a.pad_mode!r}")
    widths = [int(v) for v in a.pad_width]
    rank = x.ty.ndim
    shape = list(x.ty.shape.values)
    axes = list(range(rank))
    begin = [widths[2 * i] for i in range(rank)]
    end = [widths[2 * i] + shape[i] for i in range(rank)]
    dx = relax.op.strided_slice(grad, axes, begin, end, assume_inbound=True)
    return [dx] + [no_grad(v) for v in call.args[1:]]


def tile_grad(ctx, call, out, grad, target):
    from tvm import relax
    x = call.args[0]
    reps = [int(r) for r in call.attrs.repeats]
    shape = list(x.ty.shape.values)
    lead = len(reps) - len(shape)
    if lead < 0:
        reps = [1] * (-lead) + reps
        lead = 0
    dims = [1] * lead + shape
    view, axes = [], []
    for i, (r, d) in enumerate(zip(reps, dims)):
        axes.append(len(view))
        view += [r, d]
    g = ctx.emit(relax.op.reshape(grad, view))
    s = ctx.emit(relax.op.sum(g, axis=axes))
    return [relax.op.reshape(s, shape)]


def adaptive_avg_pool2d_grad(ctx, call, out, grad, target):
    from tvm import relax
    x = call.args[0]
    a = call.attrs
    layout = str(a.layout)
    if layout not in ("NCHW", "NHWC") or str(a.out_layout) not in ("", layout):
        raise _unsupported(call, f"layout {layout}/{a.out_layout}")
    xs, os_ = dims_of(x.ty.shape.values), dims_of(out.ty.shape.values)
    if None in xs or None in os_:
        raise _unsupported(call, "symbolic shapes")
    last = layout == "NHWC"
    H, W = (xs[1], xs[2]) if last else (xs[2], xs[3])
    OH, OW = (os_[1], os_[2]) if last else (os_[2], os_[3])
    dtype = str(x.ty.dtype)
    if H % OH == 0 and W % OW == 0:
        kh, kw = H // OH, W // OW
        N, C = xs[0], (xs[3] if last else xs[1])
        if last:
            view, full = [N, OH, 1, OW, 1, C], [N, OH, kh, OW, kw, C]
        else:
            view, full = [N, C, OH, 1, OW, 1], [N, C, OH, kh, OW, kw]
        g = relax.op.broadcast_to(relax.op.reshape(grad, view), full)
        g = ctx.emit(relax.op.reshape(g, xs))
        return [relax.op.multiply(g, relax.const(1.0 / (kh * kw), dtype))]
    plan = adaptive_avg_pool2d_grad_plan(xs, os_, layout, dtype)
    return [emit_plan(ctx, "adaptive_avg_pool2d_grad", plan, [grad], [relax.TensorType(list(xs), dtype)],
                      target=target)]


def extreme_grad(ctx, call, out, grad, target):
    """relax.max / relax.min over ``axis``: g / (number of ties) at the extremes."""
    from tvm import relax
    x = call.args[0]
    a = call.attrs
    rank = x.ty.ndim
    axes = list(range(rank)) if a.axis is None else sorted(int(v) % rank for v in a.axis)
    dtype = str(x.ty.dtype)
    if not bool(a.keepdims):
        kept = [1 if i in axes else d for i, d in enumerate(x.ty.shape.values)]
        ext = ctx.emit(relax.op.reshape(out, kept))
        g = ctx.emit(relax.op.reshape(grad, kept))
    else:
        ext, g = out, grad
    hit = ctx.emit(relax.op.astype(relax.op.equal(x, ext), dtype))
    count = ctx.emit(relax.op.sum(hit, axis=axes, keepdims=True))
    return [relax.op.multiply(hit, relax.op.divide(g, count))]


def conv2d_transpose_grad(ctx, call, out, grad, target):
    from tvm import relax
    x, w = call.args
    a = call.attrs
    if (str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "IOHW"
            or str(a.out_layout) not in ("", "NCHW")):
        raise _unsupported(call, f"layouts {a.data_layout}/{a.kernel_layout}/{a.out_layout}")
    dtype = str(x.ty.dtype)
    if a.out_dtype is not None and str(a.out_dtype) not in ("", "void", dtype):
        raise _unsupported(call, f"out_dtype {a.out_dtype}")
    gs, ws, xs = dims_of(out.ty.shape.values), dims_of(w.ty.shape.values), dims_of(x.ty.shape.values)
    if None in gs or None in ws:
        raise _unsupported(call, "symbolic shapes")
    kw = dict(strides=[int(v) for v in a.strides], padding=[int(v) for v in a.padding],
              dilation=[int(v) for v in a.dilation], groups=int(a.groups), layout="NCHW", dtype=dtype)
    # dx: conv2d(g, w) with w read as OIHW (O = C_in, I = C_out / groups)
    if choose(gs, ws, a, "NCHW") == "gemm":
        plan, geo = conv2d_gemm_plan(gs, ws, **kw)
        xv, wv, ov = geo.xv, geo.wv, geo.ov
    else:
        plan, xv, wv, ov = conv2d_plan(gs, ws, **kw)
    if tuple(d for d in (ov[0], ov[1] * ov[2], ov[3], ov[4])) != tuple(xs):
        raise _unsupported(call, "output_padding beyond what the strides allow")
    gr = ctx.emit(relax.op.reshape(grad, list(xv)))
    wr = ctx.emit(relax.op.reshape(w, list(wv)))
    dx = emit_plan(ctx, "conv2d", plan, [gr, wr], [relax.TensorType(list(ov), dtype)], target=target)
    dx = ctx.emit(relax.op.reshape(dx, x.ty.shape))
    # dw: the filter grad of conv2d(input = g, out_grad = x)
    pw, geo = conv2d_filter_grad_plan(gs, ws, **kw)
    xr = ctx.emit(relax.op.reshape(x, list(geo.ov)))
    dw = emit_plan(ctx, "conv2d_filter_grad", pw, [gr if list(geo.xv) == list(xv) else
                                                  ctx.emit(relax.op.reshape(grad, list(geo.xv))), xr],
                   [relax.TensorType([geo.G, geo.Og, geo.Cg * geo.kh * geo.kw], dtype)], target=target)
    return [dx, relax.op.reshape(dw, w.ty.shape)]


def tril_grad(ctx, call, out, grad, target):
    from tvm import relax
    from tvm.relax.op.grad import no_grad
    return [relax.op.tril(grad, call.args[1]), no_grad(call.args[1])]
