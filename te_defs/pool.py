"""Pooling grads that route the output gradient by recorded indices: max_pool2d/3d_with_index,
fractional_max_pool2d/3d (scatter by mask) and unpool3d (gather by indices).

Paddle 3.3.1 (phi/kernels/funcs/pooling.cc, unpool_grad_kernel) adds each output gradient into
its input plane at the flat index its mask holds (index h·W + w within the (n, c) plane), in
output order; any in-range index is accepted, windows are not checked, and overlapping windows
add up. That is a scatter with repeated indices, so it runs with one owner per plane: planes in
parallel, each plane's outputs in order (deterministic, and the same summation order as Paddle's
CPU kernel), accumulating in float32 for half types. unpool3d's grad is the inverse map, a
gather: x_grad[n,c,i] = out_grad[n,c, indices[n,c,i]]. Masks and indices out of range are a
ValueError (Paddle reads/writes out of bounds).
"""

from __future__ import annotations

import math

import numpy as np

from tvmgrad.dtypes import FLOATS, dtype as as_dtype, to_compute
from tvmgrad.families.dense import View, dense_op
from tvmgrad.families.signature import PrimFuncResult
from tvmgrad.lazy import te

from ._dense import store
from ._plan import fail


def _planes(call, S, x="x", index="mask", grad="out_grad"):
    """Shapes of a pooling call: x [N, C, *S], index and grad [N, C, *S_out] -> (P, I, O)."""
    op = call.op
    xm, im, gm = call.meta(x), call.meta(index), call.meta(grad)
    if xm.ndim != S + 2:
        fail(op, f"input {x!r} must be {S + 2}-D [N, C, spatial...], got shape {list(xm.shape)}")
    if im.shape != gm.shape:
        fail(op, f"input {index!r} has shape {list(im.shape)} but {grad!r} has "
                  f"{list(gm.shape)}; they must match")
    if gm.ndim != S + 2 or gm.shape[:2] != xm.shape[:2]:
        fail(op, f"input {grad!r} has shape {list(gm.shape)}; expected [N, C] = "
                  f"{list(xm.shape[:2])} (the batch and channels of {x!r}) followed by {S} "
                  f"spatial dims")
    P = xm.shape[0] * xm.shape[1]
    return P, math.prod(xm.shape[2:]), math.prod(gm.shape[2:])


def _check_range(call, name, limit, what):
    arr = np.asarray(call.tensors[name])
    if arr.size and (arr.min() < 0 or arr.max() >= limit):
        bad = arr.min() if arr.min() < 0 else arr.max()
        fail(call.op, f"input {name!r} holds {int(bad)}, outside [0, {limit}) ({what})")


# ------------------------------------------------------------------------------------------
# scatter by mask (one owner per plane)

# the signature both forms share: planes of x/x_grad (P, I), of mask/out_grad (P, O)
_SCATTER_HEAD = '''
@T.prim_func(s_tir=True)
def main(x: T.handle, mask: T.handle, dout: T.handle, dx: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    P, I, O = T.int64(), T.int64(), T.int64()
    X = T.match_buffer(x, (P, I), "{st}")
    Mk = T.match_buffer(mask, (P, O), "{it}")
    G = T.match_buffer(dout, (P, O), "{st}")
    DX = T.match_buffer(dx, (P, I), "{st}")
'''

# float32/float64: accumulate straight into x_grad
_SCATTER_DIRECT = _SCATTER_HEAD + '''    for p in range(P):
        with T.sblock("plane"):
            vp = T.axis.spatial(P, p)
            T.reads(Mk[vp, 0:O], G[vp, 0:O])   # DX is zeroed here before it is read
            T.writes(DX[vp, 0:I])
            for i in range(I):
                DX[vp, i] = T.{st}(0)
            for o in range(O):
                DX[vp, T.Cast("int64", Mk[vp, o])] = DX[vp, T.Cast("int64", Mk[vp, o])] + G[vp, o]
'''

# half types: accumulate in a float32 scratch plane, round once
_SCATTER = _SCATTER_HEAD + '''    acc = T.alloc_buffer((P, I), "{ct}")
    for p in range(P):
        with T.sblock("plane"):
            vp = T.axis.spatial(P, p)
            T.reads(Mk[vp, 0:O], G[vp, 0:O])   # acc is written (zeroed) here before it is read
            T.writes(DX[vp, 0:I], acc[vp, 0:I])
            for i in range(I):
                acc[vp, i] = T.{ct}(0)
            for o in range(O):
                acc[vp, T.Cast("int64", Mk[vp, o])] = acc[vp, T.Cast("int64", Mk[vp, o])] + {load}
            for i in range(I):
                DX[vp, i] = {store}
'''


def _scatter_func(dt, mask_dtype):
    """The plane scatter as TVMScript (TE cannot express a scatter with repeated indices)."""
    from tvm.script import from_source
    st, ct = dt.storage, dt.compute
    if dt.name == "bfloat16":   # widen by bit shift (see dtypes.to_compute)
        load = ('T.reinterpret("float32", T.shift_left(T.Cast("uint32", '
                'T.reinterpret("uint16", G[vp, o])), T.uint32(16)))')
    elif st != ct:
        load = f'T.Cast("{ct}", G[vp, o])'
    else:
        load = "G[vp, o]"
    if st == ct:
        return from_source(_SCATTER_DIRECT.format(st=st, it=mask_dtype))
    save = f'T.Cast("{st}", acc[vp, i])'
    text = _SCATTER.format(st=st, ct=ct, it=mask_dtype, load=load, store=save)
    return from_source(text)


def _int_list(op, name, value, lengths, minimum):
    value = list(value)
    if len(value) not in lengths:
        fail(op, f"attribute {name!r} must have {' or '.join(map(str, lengths))} values, got "
                  f"{value}")
    if any(v < minimum for v in value):
        fail(op, f"attribute {name!r} must hold values >= {minimum}, got {value}")
    return value


def _check_pool_attrs(call, S):
    """The window attributes of a max_pool*_with_index / fractional_max_pool* call, against their
    documented ranges and x's spatial size (the mask alone routes the gradient, as in Paddle, but
    a window that cannot exist is an error)."""
    op, a = call.op, call.attrs
    spatial = call.meta("x").shape[2:]
    grad = call.meta("out_grad").shape[2:]
    if "output_size" in a:                                  # fractional max pool
        out = _int_list(op, "output_size", a["output_size"], (S,), 1)
        if list(grad) != out:
            fail(op, f"input 'out_grad' has spatial size {list(grad)}, but attribute "
                      f"'output_size' is {out}")
        ks = _int_list(op, "kernel_size", a["kernel_size"], (S,), 0)
        if any(k > n for k, n in zip(ks, spatial)):
            fail(op, f"attribute 'kernel_size' = {ks} is larger than the spatial size "
                      f"{list(spatial)} of 'x' (0: derived from output_size)")
        return
    ks = _int_list(op, "kernel_size", a["kernel_size"], (S,), 1)
    _int_list(op, "strides", a["strides"], (S,), 1)
    pads = _int_list(op, "paddings", a["paddings"], (S, 2 * S), 0)
    if a["global_pooling"]:
        return
    if a["adaptive"]:
        if list(grad) != ks:
            fail(op, f"input 'out_grad' has spatial size {list(grad)}, but adaptive pooling "
                      f"makes attribute 'kernel_size' = {ks} the output size")
        return
    lo, hi = (pads, pads) if len(pads) == S else (pads[0::2], pads[1::2])
    for i, (k, n) in enumerate(zip(ks, spatial)):
        if k > n + lo[i] + hi[i]:
            fail(op, f"attribute 'kernel_size' = {ks} is larger than the padded spatial size of "
                      f"'x' {list(spatial)} (paddings {pads}) in dim {i}")


def _mask_views(S):
    def views(call, outs):
        P, I, O = _planes(call, S)
        _check_pool_attrs(call, S)
        _check_range(call, "mask", I, f"the input plane has {I} elements")
        return View({"x": ("P", "I"), "x_grad": ("P", "I"), "mask": ("P", "O"),
                     "out_grad": ("P", "O")}, {"P": P, "I": I, "O": O},
                    (call.meta("mask").dtype.name,))
    return views


def _scatter(ctx, x, mask, out_grad):
    (mask_dtype,) = ctx.info
    return PrimFuncResult(_scatter_func(as_dtype(out_grad.dtype), mask_dtype))


_POOL_ATTRS = ("kernel_size", "strides", "paddings", "global_pooling", "adaptive")
_FRACTIONAL_ATTRS = ("output_size", "kernel_size", "random_u", "return_mask")


@dense_op(views=_mask_views(2), float_inputs=("x", "out_grad"), pattern="plane_scatter",
          ignore=_POOL_ATTRS)
def max_pool2d_with_index_grad(x, mask, out_grad, kernel_size, strides, paddings, global_pooling,
                               adaptive, ctx):
    """x_grad[n,c,·] = 0; x_grad[n,c, mask[n,c,o]] += out_grad[n,c,o] for every output o."""
    return _scatter(ctx, x, mask, out_grad)


@dense_op(views=_mask_views(3), float_inputs=("x", "out_grad"), pattern="plane_scatter",
          ignore=_POOL_ATTRS)
def max_pool3d_with_index_grad(x, mask, out_grad, kernel_size, strides, paddings, global_pooling,
                               adaptive, ctx):
    """max_pool2d_with_index_grad in 3-D (mask = d·H·W + h·W + w)."""
    return _scatter(ctx, x, mask, out_grad)


@dense_op(views=_mask_views(2), float_inputs=("x", "out_grad"), pattern="plane_scatter",
          ignore=_FRACTIONAL_ATTRS)
def fractional_max_pool2d_grad(x, mask, out_grad, output_size, kernel_size, random_u,
                               return_mask, ctx):
    """The scatter of max_pool2d_with_index_grad (the pseudo-random windows only decide the
    mask, which the forward recorded)."""
    return _scatter(ctx, x, mask, out_grad)


@dense_op(views=_mask_views(3), float_inputs=("x", "out_grad"), pattern="plane_scatter",
          ignore=_FRACTIONAL_ATTRS)
def fractional_max_pool3d_grad(x, mask, out_grad, output_size, kernel_size, random_u,
                               return_mask, ctx):
    """fractional_max_pool2d_grad in 3-D."""
    return _scatter(ctx, x, mask, out_grad)


# ------------------------------------------------------------------------------------------
# unpool3d: a gather

def _unpool_views(call, outs):
    op = call.op
    if call.attrs["data_format"] != "NCDHW":
        fail(op, f"attribute 'data_format' must be 'NCDHW', got {call.attrs['data_format']!r}")
    P, I, O = _planes(call, 3, x="x", index="indices", grad="x")
    om, gm = call.meta("out"), call.meta("out_grad")
    if om.shape != gm.shape:
        fail(op, f"input 'out_grad' has shape {list(gm.shape)} but 'out' has {list(om.shape)}")
    if gm.ndim != 5 or gm.shape[:2] != call.meta("x").shape[:2]:
        fail(op, f"input 'out_grad' has shape {list(gm.shape)}; expected [N, C] = "
                  f"{list(call.meta('x').shape[:2])} followed by 3 spatial dims")
    a = call.attrs
    ks = _int_list(op, "ksize", a["ksize"], (3,), 1)
    st = _int_list(op, "strides", a["strides"], (3,), 1)
    pads = _int_list(op, "paddings", a["paddings"], (3,), 0)
    spatial = list(call.meta("x").shape[2:])
    if any(a["output_size"]):                    # the default {0, 0, 0}: from the formula
        want = _int_list(op, "output_size", a["output_size"], (3,), 0)
        what = "attribute 'output_size'"
    else:
        want = [(n - 1) * s - 2 * p + k for n, s, p, k in zip(spatial, st, pads, ks)]
        what = f"the unpool of 'x' {spatial} with ksize {ks}, strides {st}, paddings {pads}"
    if list(gm.shape[2:]) != want:
        fail(op, f"input 'out_grad' has spatial size {list(gm.shape[2:])}, but {what} gives "
                  f"{want}")
    Q = math.prod(gm.shape[2:])
    _check_range(call, "indices", Q, f"the output plane has {Q} elements")
    return View({"x": ("P", "I"), "x_grad": ("P", "I"), "indices": ("P", "I"),
                 "out": ("P", "Q"), "out_grad": ("P", "Q")}, {"P": P, "I": I, "Q": Q})


@dense_op(views=_unpool_views, float_inputs=("x", "out", "out_grad"), pattern="generic",
          ignore=("ksize", "strides", "paddings", "output_size"), dtypes=FLOATS + ("int64",))
def unpool3d_grad(x, indices, out, out_grad, ksize, strides, paddings, output_size, data_format):
    """x_grad[n,c,i] = out_grad[n,c, indices[n,c,i]] (unpool put x[n,c,i] there)."""
    dt = as_dtype(out_grad.dtype)
    out_ = store(dt)
    return te.compute(x.shape, lambda p, i: out_(to_compute(
        out_grad[p, indices[p, i].astype("int64")], dt)), name="x_grad")
