"""The gradient of ``relax.nn.conv2d``, and how a conv2d is computed on tvmgrad's contractions.

Every layout Relax writes as a permutation of NCHW (data, output) and OIHW (filter) is covered:
NCHW/NHWC data with OIHW filters directly, any other permutation (HWIO filters, CHWN data...)
through ``permute_dims`` around the kernels. An ``out_dtype`` cast: TVM's gradient.

Which kernels (static shapes; ``choose``):

* dx and dw as two kernels, so that the one nobody needs is dropped (the first layer's dx, the
  gradient of the input images): dw one GEMM over the unfolded input (``conv2d_filter_grad``),
  dx a direct transposed convolution (``conv2d_data_grad``) or, on small feature maps (at most
  ``GEMM_POSITIONS`` output positions: the late layers of a CNN, many channels on a few
  pixels, where the direct form vectorises along a short spatial row), a GEMM into the unfolded
  input's gradient folded back (``conv2d_data_grad_gemm``);
* while the unfolded input fits in ``UNFOLD_LIMIT`` elements; beyond it (large batches or
  feature maps), Paddle's ``conv2d_grad`` (one kernel: per-sample partial filters, no unfolded
  copy); symbolic shapes too.

The forward (``forward_conv2d``, used by the tvmgrad pipeline): the direct convolution, or the
GEMM form on small feature maps.
"""

from __future__ import annotations

from .emit import emit
from .fallback import tvm_fallback
from .kernels import (conv2d_data_grad_gemm_plan, conv2d_data_grad_plan, conv2d_filter_grad_plan,
                      conv2d_gemm_plan, conv2d_plan, dims_of, emit_plan)

__all__ = ["conv2d_grad", "forward_conv2d", "choose", "layout_permutation", "inverse_permutation",
           "GEMM_POSITIONS", "UNFOLD_LIMIT"]

GEMM_POSITIONS = 16            # output positions (OH·OW) up to which convs run as GEMMs
UNFOLD_LIMIT = 1 << 22         # elements of the unfolded input (N·OH·OW · C/G·kh·kw) per kernel


def layout_permutation(layout: str, canon: str):
    """Axes taking ``layout`` to ``canon`` (None if it is not a permutation of it)."""
    if sorted(layout) != sorted(canon) or len(set(layout)) != len(layout):
        return None
    return [layout.index(c) for c in canon]


def inverse_permutation(axes):
    """The axes that undo the permutation ``axes``."""
    inv = [0] * len(axes)
    for i, a in enumerate(axes):
        inv[a] = i
    return inv


def _positions(xshape, wshape, attrs, layout):
    s, p, d = [int(v) for v in attrs.strides], [int(v) for v in attrs.padding], [int(v) for v in attrs.dilation]
    H, W = (xshape[1], xshape[2]) if layout == "NHWC" else (xshape[2], xshape[3])
    kh, kw = wshape[2], wshape[3]
    OH = (H + p[0] + p[2] - d[0] * (kh - 1) - 1) // s[0] + 1
    OW = (W + p[1] + p[3] - d[1] * (kw - 1) - 1) // s[1] + 1
    return OH * OW


def choose(xshape, wshape, attrs, layout) -> str:
    """'gemm' (small feature maps), 'direct', or 'paddle' (the unfolded input is too large, or
    symbolic shapes: Paddle's conv2d_grad)."""
    if None in xshape or None in wshape:
        return "paddle"
    P = _positions(xshape, wshape, attrs, layout)
    unfold = xshape[0] * P * wshape[1] * wshape[2] * wshape[3]
    if unfold > UNFOLD_LIMIT:
        return "paddle"
    return "gemm" if P <= GEMM_POSITIONS else "direct"


def _kw(a, layout, dtype):
    return dict(strides=[int(v) for v in a.strides], padding=[int(v) for v in a.padding],
                dilation=[int(v) for v in a.dilation], groups=int(a.groups), layout=layout, dtype=dtype)


def _canonical(ctx, call, grad=None):
    """(x, w, grad, layout, undo_x, undo_w): the operands as NCHW/NHWC data and OIHW filters,
    permuted when the call's layouts are other permutations; None if they are not."""
    from tvm import relax
    a = call.attrs
    data, kernel = str(a.data_layout), str(a.kernel_layout)
    out = str(a.out_layout) or data
    x, w = call.args
    if data in ("NCHW", "NHWC") and kernel == "OIHW" and out == data:
        return x, w, grad, data, None, None
    px, pw, po = (layout_permutation(data, "NCHW"), layout_permutation(kernel, "OIHW"),
                  layout_permutation(out, "NCHW"))
    if px is None or pw is None or po is None:
        return None
    x = ctx.emit(relax.op.permute_dims(x, px))
    w = ctx.emit(relax.op.permute_dims(w, pw))
    if grad is not None:
        grad = ctx.emit(relax.op.permute_dims(grad, po))
    return x, w, grad, "NCHW", inverse_permutation(px), inverse_permutation(pw)


def conv2d_grad(ctx, call, out, grad, target):
    """[dx, dw] of a relax.nn.conv2d (see the module doc)."""
    from tvm import relax
    a = call.attrs
    x0 = call.args[0]
    if a.out_dtype is not None and str(a.out_dtype) not in ("", "void", str(x0.ty.dtype)):
        return tvm_fallback(ctx, call, out, grad, f"out_dtype {a.out_dtype}")
    canon = _canonical(ctx, call, grad)
    if canon is None:
        return tvm_fallback(ctx, call, out, grad,
                            f"layouts {a.data_layout}/{a.kernel_layout}/{a.out_layout}")
    x, w, g, layout, undo_x, undo_w = canon
    dtype = str(x.ty.dtype)
    xs, ws = dims_of(x.ty.shape.values), dims_of(w.ty.shape.values)
    how = choose(xs, ws, a, layout)
    if how == "paddle":
        pad = [int(p) for p in a.padding]
        attrs = {"strides": [int(v) for v in a.strides], "paddings": [pad[0], pad[2], pad[1], pad[3]],
                 "dilations": [int(d) for d in a.dilation], "groups": int(a.groups),
                 "data_format": layout, "padding_algorithm": "EXPLICIT"}
        dx, dw = emit(ctx, "conv2d_grad", {"input": x, "filter": w, "out_grad": g}, attrs, target=target)
    else:
        kw = _kw(a, layout, dtype)
        data_plan = conv2d_data_grad_gemm_plan if how == "gemm" else conv2d_data_grad_plan
        pd, geo = data_plan(xs, ws, **kw)
        pw, _ = conv2d_filter_grad_plan(xs, ws, **kw)
        gv = ctx.emit(relax.op.reshape(g, list(geo.ov)))
        wv = ctx.emit(relax.op.reshape(w, list(geo.wv)))
        xv = ctx.emit(relax.op.reshape(x, list(geo.xv)))
        dx = emit_plan(ctx, pd.symbol.rsplit("_", 1)[0], pd, [gv, wv],
                       [relax.TensorType(list(geo.xv), dtype)], target=target)
        dw = emit_plan(ctx, "conv2d_filter_grad", pw, [xv, gv],
                       [relax.TensorType([geo.G, geo.Og, geo.Cg * geo.kh * geo.kw], dtype)], target=target)
        dx = ctx.emit(relax.op.reshape(dx, x.ty.shape))
        dw = ctx.emit(relax.op.reshape(dw, w.ty.shape))
    if undo_x is not None:
        dx = ctx.emit(relax.op.permute_dims(dx, undo_x))
        dw = ctx.emit(relax.op.permute_dims(dw, undo_w))
    return [dx, dw]


def forward_conv2d(bb, call, emit_kernel):
    """The forward conv2d on tvmgrad's contractions (NCHW/NHWC, OIHW, static shapes), or None.
    ``emit_kernel(op, plan, args, out_type)`` adds the kernel."""
    from tvm import relax
    a = call.attrs
    x, w = call.args
    layout = str(a.data_layout)
    if layout not in ("NCHW", "NHWC") or str(a.kernel_layout) != "OIHW" or str(a.out_layout) not in ("", layout):
        return None
    xs, ws = dims_of(x.ty.shape.values), dims_of(w.ty.shape.values)
    if None in xs or None in ws:
        return None
    kw = _kw(a, layout, str(x.ty.dtype))
    if choose(xs, ws, a, layout) == "gemm":
        plan, geo = conv2d_gemm_plan(xs, ws, **kw)
        xv, wv, ov = geo.xv, geo.wv, geo.ov
        op = "conv2d_gemm"
    else:
        plan, xv, wv, ov = conv2d_plan(xs, ws, **kw)
        op = "conv2d"
    xr = bb.emit(relax.op.reshape(x, list(xv)))
    wr = bb.emit(relax.op.reshape(w, list(wv)))
    out = emit_kernel(op, plan, [xr, wr], relax.TensorType(list(ov), str(x.ty.dtype)))
    return relax.op.reshape(out, call.ty.shape)
