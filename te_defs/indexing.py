"""Indexing, scatter and graph grads: gather/index_select/take_along_axis/... (the scatter and
scan machinery they share with the scan and sort/select modules is in _scatter.py).

Scatter-type grads accumulate ``out_grad`` into repeated indices. The default kernels are
deterministic: one thread owns a column of the destination (every dim but the scattered one) and
walks the scattered axis serially, in index order, so repeated indices add up in a fixed order
(bit-identical runs on every target). ``deterministic=False`` (float32/float64 only) launches one
thread per source element that adds with a CUDA atomic; on the CPU that variant runs the same
per-element loop serially.

Indices are checked on the host before any kernel runs (in the plan): an out-of-range index
raises a ValueError naming the op and the input; a kernel never reads or writes out of bounds.
Half types accumulate in float32 and round once.

Data dtypes beyond the floats, where Paddle registers them: complex64/128 (tvmgrad.dtypes stores
them as float32/64 with a trailing (re, im) dim of 2, which every float tensor of the kernel
carries as one more innermost dim: data movement moves and sums both parts alike; ``ctx.pair`` tells
a builder), integers (copies and sums in their own dtype, wrapping as Paddle's; divisions
truncate as C++'s) and bool (a sum of bools is their OR, as Paddle's ``bool +=``);
index_select_strided_grad also takes storage-only float8 (tvmgrad.dtypes), which it only moves.

Kernel shapes: tensors are viewed as (outer, axis, inner) (or (outer, axis) when nothing follows
the axis) where the op allows it, so one kernel serves every rank and axis. Sequential parts are
``te.extern`` bodies of annotated blocks (``Body``) that the ``annotated_loops``
schedules bind; a body may hold a CUDA form and a CPU form of a block (``two_forms``: the column
strip's lanes on CUDA threads / one vectorised strip per CPU task), selected by the
``tvmgrad_on_cuda`` parameter that the schedules fix before scheduling (``ctx.on_cuda()``).
"""

from __future__ import annotations

import math

from tvmgrad.dtypes import COMPLEX, FLOAT8, FLOATS, dtype as as_dtype
from tvmgrad.families.base import OpError
from tvmgrad.families.index import index_op
from tvmgrad.families.shape import dt_of
from tvmgrad.infer_meta import norm_axis
from tvmgrad.lazy import te, tirx

from ._extern import acc_dtype, cast_to, extern, i64, proxy, scatter_body, store_as, tc, to_acc
from ._plan import check_range, host, split_axis
from ._scatter import T_, blocked_scan, div, scan_scalars, scatter_along, two_forms, wrap, zeros_like

__all__ = ["scatter_rows"]

# data dtypes beyond FLOATS (see the module docstring); each op lists those Paddle registers
INT_DTYPES = ("int8", "uint8", "int16", "int32", "int64")
CPLX = FLOATS + COMPLEX


def _gather_like(op, call, index_name="index", allow_2d=True):
    """(axis, M, N) of a gather-like call after checking shapes and index values; the axis is
    normalised; the index may be 0-d (the axis is dropped from out_grad), 1-d or (N, 1)."""
    x, idx, g = call.meta("x"), call.meta(index_name), call.meta("out_grad")
    axis = norm_axis(int(call.attrs["axis"]), x.ndim, of="x", op=op, zero_d_axis=True)
    if x.ndim == 0:
        raise OpError(f"{op}: x must have at least one dim")
    if not (idx.ndim <= 1 or (allow_2d and idx.ndim == 2 and idx.shape[1] == 1)):
        raise OpError(f"{op}: input {index_name!r} must be 0-d, 1-d"
                      f"{' or of shape [N, 1]' if allow_2d else ''}, got shape {list(idx.shape)}")
    n = 1 if idx.ndim == 0 else idx.shape[0]
    want = x.shape[:axis] + ((n,) if idx.ndim else ()) + x.shape[axis + 1:]
    if g.shape != want:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected {list(want)} from x "
                      f"{list(x.shape)}, axis {axis} and {index_name} {list(idx.shape)}")
    m = x.shape[axis]
    check_range(op, index_name, host(call, index_name), -m, m, f"for axis {axis} of x (size {m}) ")
    return axis, m, n


def _gather_view(call, metas, outs):
    op = call.op
    axis, m, n = _gather_like(op, call)
    x = call.meta("x")
    outer, _, inner = split_axis(x.shape, axis)
    tail = (inner,) if inner != 1 else ()
    return ({"out_grad": (outer, n) + tail, "x_grad": (outer, m) + tail, "x": (outer, m) + tail,
             "index": (n,)},
            ("flat" if not tail else "cols",))


def _index_rows(M):
    """Row of element c: index[c[1]] (a 1-d index shared by every column), wrapped."""
    return lambda L, c: wrap(L[1][c[1]], M)


@index_op(view=_gather_view, atomic=True, code_attrs=(), float_inputs=("x", "out_grad"),
          dtypes=CPLX + ("bool",) + INT_DTYPES)
def gather_grad(x, index, out_grad, axis, ctx):
    """x_grad[.., index[i], ..] += out_grad[.., i, ..] along ``axis`` (x_grad is 0 elsewhere);
    repeated indices add up in index order; negative indices count from the end (-M <= index < M,
    as Paddle 3.3.1's gather_grad); a 0-d index drops the axis from out_grad. Complex, integer
    and bool grads too (sums wrap as Paddle's; bool: OR)."""
    dt = dt_of(out_grad)
    return scatter_along(ctx, out_grad, 1, x.shape, dt, "x_grad", _index_rows(x.shape[1]),
                         [out_grad, index])


@index_op(view=_gather_view, atomic=True, code_attrs=(), float_inputs=("x", "out_grad"),
          dtypes=CPLX + ("bool", "int32", "int64"))
def index_select_grad(x, index, out_grad, axis, ctx):
    """x_grad[.., index[i], ..] += out_grad[.., i, ..] along ``axis``; repeated indices add up in
    index order; -M <= index < M (negative counts from the end). Complex, int32/int64 and bool
    (OR) grads too."""
    dt = dt_of(out_grad)
    return scatter_along(ctx, out_grad, 1, x.shape, dt, "x_grad", _index_rows(x.shape[1]),
                         [out_grad, index])


# ------------------------------------------------------------------------------------------
# index_add (x_grad = out_grad; add_value_grad gathers it)

def _index_add_view(call, metas, outs):
    op = call.op
    g, idx = call.meta("out_grad"), call.meta("index")
    axis = norm_axis(int(call.attrs["axis"]), g.ndim, of="out_grad", op=op, zero_d_axis=True)
    m = g.shape[axis]
    check_range(op, "index", host(call, "index"), -m, m, f"for axis {axis} of out_grad (size {m}) ")
    outer, _, inner = split_axis(g.shape, axis)
    n = idx.shape[0] if idx.ndim else 1
    tail = (inner,) if inner != 1 else ()
    return ({"out_grad": (outer, m) + tail, "add_value": (outer, n) + tail,
             "add_value_grad": (outer, n) + tail, "index": (n,)}, ())


@index_op(view=_index_add_view, alias={"x_grad": "out_grad"}, code_attrs=(),
          float_inputs=("add_value", "out_grad"), dtypes=FLOATS + ("int32", "int64"))
def index_add_grad(index, add_value, out_grad, axis):
    """out = x with add_value added at ``index`` along ``axis``:  x_grad = out_grad (no kernel),
    add_value_grad[.., i, ..] = out_grad[.., index[i], ..]; -M <= index < M (negative counts from
    the end, as Paddle)."""
    m = out_grad.shape[1]

    def body(o, i, *c):
        return out_grad[(o, wrap(index[i], m)) + c]

    return None, te.compute(add_value.shape, body, name="add_value_grad")


# ------------------------------------------------------------------------------------------
# index_sample

def _index_sample_view(call, metas, outs):
    op = call.op
    x, idx, g = call.meta("x"), call.meta("index"), call.meta("out_grad")
    if x.ndim != 2 or idx.ndim != 2:
        raise OpError(f"{op}: x and index must be 2-d, got {list(x.shape)} and {list(idx.shape)}")
    if idx.shape[0] != x.shape[0]:
        raise OpError(f"{op}: index has {idx.shape[0]} rows but x has {x.shape[0]}")
    if g.shape != idx.shape:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected index's "
                      f"{list(idx.shape)}")
    check_range(op, "index", host(call, "index"), 0, x.shape[1],
                f"for rows of length {x.shape[1]} ")
    return {}, ()


@index_op(view=_index_sample_view, atomic=True, float_inputs=("x", "out_grad"),
          dtypes=CPLX + ("int32", "int64"))
def index_sample_grad(x, index, out_grad, ctx):
    """x_grad[b, index[b, i]] += out_grad[b, i]  (0 <= index < x.shape[1], as Paddle; repeated
    indices add up in order)."""
    dt = dt_of(out_grad)
    return scatter_along(ctx, out_grad, 1, x.shape, dt, "x_grad", lambda L, c: L[1][tuple(c[:2])],
                         [out_grad, index])


# ------------------------------------------------------------------------------------------
# index_select_strided (one slice)

def _strided_view(call, metas, outs):
    op = call.op
    x, g = call.meta("x"), call.meta("out_grad")
    axis = norm_axis(int(call.attrs["axis"]), x.ndim, of="x", op=op, zero_d_axis=True)
    if x.ndim == 0:
        raise OpError(f"{op}: x must have at least one dim")
    want = x.shape[:axis] + x.shape[axis + 1:]
    if g.shape != want:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected {list(want)} (x "
                      f"{list(x.shape)} without axis {axis})")
    m = x.shape[axis]
    index = int(call.attrs["index"])
    if not 0 <= index < m:
        raise OpError(f"{op}: attribute 'index' is {index}, out of range for axis {axis} of size "
                      f"{m} (expected 0 <= index < {m}; Paddle 3.3.1 reads out of bounds for a "
                      f"negative index)")
    outer, _, inner = split_axis(x.shape, axis)
    return {"x": (outer, m, inner), "x_grad": (outer, m, inner), "out_grad": (outer, inner)}, ()


@index_op(view=_strided_view, int_runtime=("index",), code_attrs=(),
          dtypes=CPLX + ("bool",) + INT_DTYPES + FLOAT8)      # float8: a select, no arithmetic
def index_select_strided_grad(x, out_grad, index, axis):
    """x_grad = 0 except x_grad[.., index, ..] = out_grad  (0 <= index < x.shape[axis])."""
    dt = dt_of(out_grad)
    zero = tirx.const(0, dt.storage)

    def body(o, j, *c):
        return tirx.Select(j == index, out_grad[(o,) + c], zero)

    return te.compute(x.shape, body, name="x_grad")


# ------------------------------------------------------------------------------------------
# multiplex

def _multiplex_view(call, metas, outs):
    op = call.op
    ins, g = call.meta("inputs"), call.meta("out_grad")
    if not ins:
        raise OpError(f"{op}: inputs must hold at least one tensor")
    for i, m in enumerate(ins):
        if m.shape != g.shape:
            raise OpError(f"{op}: inputs[{i}] has shape {list(m.shape)}, expected out_grad's "
                          f"{list(g.shape)}")
    check_range(op, "index", host(call, "index"), 0, len(ins),
                f"for the {len(ins)} tensors of inputs ")
    rows = g.shape[0]
    rest = math.prod(g.shape[1:])
    return ({"inputs": [(rows, rest)] * len(ins), "inputs_grad": [(rows, rest)] * len(ins),
             "out_grad": (rows, rest), "index": (rows,)}, ())


@index_op(view=_multiplex_view, float_inputs=("inputs", "out_grad"), dtypes=CPLX + ("int32", "int64"))
def multiplex_grad(inputs, index, out_grad):
    """out[b] = inputs[index[b]][b]:  inputs_grad[k][b] = out_grad[b] where index[b] == k, else 0
    (0 <= index < len(inputs))."""
    dt = dt_of(out_grad)
    zero = tirx.const(0, dt.storage)
    def grad(k):
        return te.compute(inputs[k].shape,
                          lambda b, *c: tirx.Select(i64(index[b]) == i64(k), out_grad[(b,) + c],
                                                    zero),
                          name=f"inputs_grad{k}")

    return [grad(k) for k in range(len(inputs))]


# ------------------------------------------------------------------------------------------
# where (with numpy broadcasting of condition, x, y)

def _aligned(shape, rank):
    return (1,) * (rank - len(shape)) + tuple(shape)


def _where_view(call, metas, outs):
    op = call.op
    c, x, y, g = (call.meta(n) for n in ("condition", "x", "y", "out_grad"))
    from tvmgrad.infer_meta import MetaError, broadcast_shapes
    try:
        full = broadcast_shapes(c.shape, x.shape, y.shape, names=("condition", "x", "y"))
    except MetaError as exc:
        raise OpError(f"{op}: {exc}") from None
    if g.shape != full:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected {list(full)}, the "
                      f"broadcast of condition {list(c.shape)}, x {list(x.shape)} and y "
                      f"{list(y.shape)}")
    rank = len(full)
    views = {n: _aligned(call.meta(n).shape, rank) for n in ("condition", "x", "y")}
    views.update(x_grad=views["x"], y_grad=views["y"])
    masks = tuple(tuple(a != b for a, b in zip(views[n], full)) for n in ("condition", "x", "y"))
    return views, masks


def reduce_to(full_shape, target_shape, mask, expr, dt, name):
    """A tensor of ``target_shape`` (same rank as ``full_shape``; ``mask[d]``: dim d is broadcast
    there; dims past the mask, e.g. a complex pair, are not) summing ``expr(idx)`` (compute
    dtype) over the broadcast dims (in ``acc_dtype``: bool sums are ORs); cast to dt."""
    mask = tuple(mask) + (False,) * (len(target_shape) - len(mask))
    if not any(mask):
        return te.compute(target_shape, lambda *i: store_as(expr(i), dt), name=name)
    axes = [te.reduce_axis((0, full_shape[d]), name=f"r{d}") for d in range(len(mask)) if mask[d]]

    def body(*i):
        it = iter(axes)
        idx = tuple(next(it) if mask[d] else i[d] for d in range(len(mask)))
        return te.sum(to_acc(expr(idx), dt), axis=axes)

    acc = te.compute(target_shape, body, name=f"{name}_acc")
    return te.compute(target_shape, lambda *i: store_as(acc(*i), dt), name=name)


def bload(t, idx, mask):
    """t at the broadcast index idx (0 on the dims where ``mask`` says t is broadcast)."""
    return t[tuple(i64(0) if m else i for i, m in zip(idx, mask))]


@index_op(view=_where_view, float_inputs=("x", "y", "out_grad"), index_dtypes=("bool",),
          dtypes=CPLX + ("bool",) + INT_DTYPES)
def where_grad(condition, x, y, out_grad, ctx):
    """x_grad = Σ_bcast condition ? out_grad : 0,  y_grad = Σ_bcast condition ? 0 : out_grad
    (summed over the dims each input was broadcast along; Paddle 3.3.1 reads past the buffers
    when the shapes differ). Complex, integer and bool (the sum is an OR) grads too."""
    dt = dt_of(out_grad)
    mc, mx, my = ctx.info.variant
    full = out_grad.shape
    zero = tirx.const(0, dt.compute)

    def pick(first):
        def expr(idx):
            g = tc(out_grad[idx], dt)
            c = bload(condition, idx, mc)
            return tirx.Select(c, g, zero) if first else tirx.Select(c, zero, g)
        return expr

    return (reduce_to(full, x.shape, mx, pick(True), dt, "x_grad"),
            reduce_to(full, y.shape, my, pick(False), dt, "y_grad"))


# ------------------------------------------------------------------------------------------
# take_along_axis / put_along_axis (index with arr's rank; its other dims may be smaller)

def _along_shapes(op, arr, idx, g, axis, name="indices"):
    if idx.ndim != arr.ndim:
        raise OpError(f"{op}: {name} must have arr's rank {arr.ndim}, got shape {list(idx.shape)}")
    for d in range(arr.ndim):
        if d != axis and idx.shape[d] > arr.shape[d]:
            raise OpError(f"{op}: {name} has shape {list(idx.shape)}; dim {d} exceeds arr's "
                          f"{list(arr.shape)}")
    if g is not None and g.shape != idx.shape:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected {name}' "
                      f"{list(idx.shape)}")


def along_view(names_idx, names_arr, arr_shape, idx_shape, axis):
    """3-d views when the index covers arr on every other dim, else the full rank."""
    same = all(a == b for d, (a, b) in enumerate(zip(arr_shape, idx_shape)) if d != axis)
    if not same:
        return {}, ("full", axis)
    _, m, _ = split_axis(arr_shape, axis)
    outer, n, inner = split_axis(idx_shape, axis)
    views = {k: (outer, n, inner) for k in names_idx}
    views.update({k: (outer, m, inner) for k in names_arr})
    return views, ("3d",)


def _take_view(call, metas, outs):
    op = call.op
    arr, idx, g = call.meta("arr"), call.meta("indices"), call.meta("out_grad")
    if arr.ndim == 0:
        raise OpError(f"{op}: arr must have at least one dim")
    axis = norm_axis(int(call.attrs["axis"]), arr.ndim, of="arr", op=op, zero_d_axis=True)
    _along_shapes(op, arr, idx, g, axis)
    m = arr.shape[axis]
    check_range(op, "indices", host(call, "indices"), -m, m, f"for axis {axis} of arr (size {m}) ")
    views, variant = along_view(("indices", "out_grad"), ("arr", "arr_grad"), arr.shape,
                                idx.shape, axis)
    if variant == ("3d",) and views["out_grad"][2] == 1:
        # nothing follows the axis: rows, each walked by one tight loop (no strip of one lane)
        return {k: v[:2] for k, v in views.items()}, ("rows",)
    return views, variant


def _variant_axis(ctx):
    v = ctx.info.variant
    return 1 if v[0] in ("3d", "rows") else v[1]


@index_op(view=_take_view, atomic=True, code_attrs=(), float_inputs=("arr", "out_grad"),
          dtypes=FLOATS + ("uint8", "int16", "int32", "int64"))
def take_along_axis_grad(arr, indices, out_grad, axis, ctx):
    """arr_grad[.., indices[.., i, ..], ..] += out_grad[.., i, ..] along ``axis`` (the index's
    other dims may be shorter than arr's; the rest of arr_grad is 0); -M <= index < M."""
    dt = dt_of(out_grad)
    ax = _variant_axis(ctx)
    m = arr.shape[ax]
    return scatter_along(ctx, out_grad, ax, arr.shape, dt, "arr_grad",
                         lambda L, c: wrap(L[1][tuple(c)], m), [out_grad, indices],
                         own_columns=ctx.info.variant[0] in ("3d", "rows"))


def safe_divisor(v):
    """An integer divisor made safe (0 -> 1: a zero divisor would kill the process with SIGFPE;
    the planner rejects the data that has one); a float one as it is."""
    if str(v.ty).startswith(("int", "uint")):
        return tirx.Select(v == tirx.const(0, str(v.ty)), tirx.const(1, str(v.ty)), v)
    return v


def _put_int_check(call, axis):
    """Integer put_along_axis_grad with reduce mul divides by arr where something lands and by
    every value: a zero there is a ValueError (Paddle's kernel dies of SIGFPE). After the shape
    and range checks."""
    import numpy as np
    arr = call.meta("arr")
    if arr.dtype.kind != "int" or _PUT_REDUCE.get(call.attrs["reduce"]) != "mul" or not call.has_data:
        return
    values = host(call, "values")
    if (values == 0).any():
        pos = [int(i) for i in np.argwhere(values == 0)[0]]
        raise OpError(f"{call.op}: input 'values' holds 0 at {pos}; integer reduce 'mul' divides by "
                      f"the values (Paddle's kernel dies of SIGFPE)")
    a, idx = host(call, "arr"), host(call, "indices")
    if call.attrs["include_self"] and idx.size and a.size:
        m = arr.shape[axis]
        grid = np.indices(idx.shape)
        grid[axis] = np.where(idx < 0, idx + m, idx)
        hit = a[tuple(grid)] == 0
        if hit.any():
            pos = [int(v[tuple(np.argwhere(hit)[0])]) for v in grid]
            raise OpError(f"{call.op}: input 'arr' holds 0 at {pos}, where a value lands; integer "
                          f"reduce 'mul' divides by it (Paddle's kernel dies of SIGFPE)")


_PUT_REDUCE = {"assign": "assign", "add": "add", "mean": "mean", "mul": "mul", "multiply": "mul",
               "amin": "amin", "amax": "amax"}


def _put_view(call, metas, outs):
    op = call.op
    arr, idx, val, out, g = (call.meta(n) for n in ("arr", "indices", "values", "out", "out_grad"))
    if arr.ndim == 0:
        raise OpError(f"{op}: arr must have at least one dim")
    axis = norm_axis(int(call.attrs["axis"]), arr.ndim, of="arr", op=op, zero_d_axis=True)
    _along_shapes(op, arr, idx, None, axis)
    if val.shape != idx.shape:
        raise OpError(f"{op}: values has shape {list(val.shape)}, expected indices' "
                      f"{list(idx.shape)}")
    for n, m in (("out", out), ("out_grad", g)):
        if m.shape != arr.shape:
            raise OpError(f"{op}: {n} has shape {list(m.shape)}, expected arr's {list(arr.shape)}")
    if call.attrs["reduce"] not in _PUT_REDUCE:
        raise OpError(f"{op}: attribute 'reduce' is {call.attrs['reduce']!r}; expected one of "
                      f"{', '.join(_PUT_REDUCE)}")
    m = arr.shape[axis]
    check_range(op, "indices", host(call, "indices"), -m, m, f"for axis {axis} of arr (size {m}) ")
    _put_int_check(call, axis)
    views, variant = along_view(("indices", "values", "values_grad"),
                                ("arr", "out", "out_grad", "arr_grad"), arr.shape, idx.shape, axis)
    return views, variant + (_PUT_REDUCE[call.attrs["reduce"]], bool(call.attrs["include_self"]))


@index_op(view=_put_view, code_attrs=(), out_dtype=("values_grad",),
          float_inputs=("arr", "values", "out", "out_grad"),
          dtypes=FLOATS + ("uint8", "int16", "int32", "int64"))
def put_along_axis_grad(arr, indices, values, out, out_grad, axis, reduce, include_self, ctx):
    """out = arr with values put at indices along axis (reduce: assign/add/mean/mul/amin/amax,
    include_self). With d = the slot element p lands on and hits/eq per slot (how many land
    there / how many of those equal out), as Paddle 3.3.1's CPU kernels:
      arr_grad = out_grad where nothing lands; where something does: 0 for assign or
        include_self=False; out_grad for add; out_grad/(hits+1) for mean;
        out_grad·out/arr for mul; for amin/amax 0 if out != arr else out_grad/(eq+1).
      values_grad[p] = assign: out_grad[d] if p is the last element landing on d, else 0;
        add: out_grad[d]; mean: out_grad[d]/(hits[d] + include_self); mul: out_grad[d]·(out[d]/
        values[p]); amin/amax: 0 if values[p] != out[d], else out_grad[d]/(eq[d]+1) when
        out[d] == arr[d], out_grad[d]/eq[d] otherwise.
    -M <= index < M (negative counts from the end, as the forward; Paddle 3.3.1's grad kernel
    does not wrap and reads out of bounds). Integer dtypes: the same formulas with C++'s
    truncating divisions, in Paddle's order (g·out/arr, g·(out/values)); a zero divisor of mul
    (a 0 in arr where something lands, or in values) is a ValueError (Paddle dies of SIGFPE; a
    kernel planned without data gives 0 there)."""
    dt = dt_of(out_grad)
    variant = ctx.info.variant
    red, incl = variant[-2], variant[-1]
    ax = 1 if variant[0] == "3d" else variant[1]
    m = arr.shape[ax]
    rank = len(arr.shape)
    idims = list(indices.shape)
    n = idims[ax]

    def dest(L_idx, c):
        c = list(c)
        return tuple(c[:ax] + [wrap(L_idx[tuple(c)], m)] + c[ax + 1:])

    # one serial pass per column: hits, eq (amin/amax) and the last j landing (assign) per slot
    def gen(ins, outs_, body):
        idx_b, val_b, out_b = ins
        hits, eq, last = outs_
        L_idx, L_val, L_out = proxy(idx_b), proxy(val_b), proxy(out_b)
        H, E, J = proxy(hits), proxy(eq), proxy(last)
        shape = list(arr.shape)

        def init(P, S, C):
            H[tuple(P)] = tirx.const(0, "int32")
            E[tuple(P)] = tirx.const(0, "int32")
            J[tuple(P)] = i64(-1)
        body.block("put_init", init, par=shape, writes=[hits, eq, last])
        lead, mid = idims[:ax], idims[ax + 1:-1] if ax < rank - 1 else []
        vec = idims[-1] if ax < rank - 1 else None
        unit = not lead and not mid and vec is None

        def col(P, S, C):
            P = P[1:] if unit else P
            c = P[:len(lead)] + [S[0]] + P[len(lead):] + ([C] if vec is not None else [])
            d = dest(L_idx, c)
            H[d] = H[d] + tirx.const(1, "int32")
            same = tc(L_out[d], dt) == tc(L_val[tuple(c)], dt)
            E[d] = E[d] + tirx.Select(same, tirx.const(1, "int32"), tirx.const(0, "int32"))
            J[d] = i64(S[0])
        body.block("put_count", col, par=([1] if unit else lead + mid), ser=[n], vec=vec,
                   reads=[idx_b, val_b, out_b], writes=[hits, eq, last])

    hits, eq, last = extern("put_counts", [(list(arr.shape), "int32"), (list(arr.shape), "int32"),
                                           (list(arr.shape), "int64")],
                            [indices, values, out], gen)

    # the arithmetic runs in the compute dtype; int8/uint8/int16 in int32 (C++'s integer
    # promotion: g·out/arr does not wrap before the division, as in Paddle)
    cdt = "int32" if dt.kind == "int" and dt.numpy.itemsize < 4 else dt.compute
    zero = tirx.const(0, cdt)
    one = tirx.const(1, cdt)

    def ld(t, idx):
        v = tc(t[idx], dt)
        return v if cdt == dt.compute else v.astype(cdt)

    def arr_body(*c):
        g, h = ld(out_grad, c), hits[c]
        hit = h > 0
        if red == "assign" or not incl:
            v = tirx.Select(hit, zero, g)
        elif red == "add":
            v = g
        elif red == "mean":
            v = tirx.Select(hit, div(g, h.astype(cdt) + one), g)
        elif red == "mul":
            v = tirx.Select(hit, div(g * ld(out, c), safe_divisor(ld(arr, c))), g)
        else:
            v = tirx.Select(hit, tirx.Select(ld(out, c) != ld(arr, c), zero,
                                             div(g, eq[c].astype(cdt) + one)), g)
        return v.astype(dt.storage)

    def val_body(*c):
        d = tuple(c[:ax]) + (wrap(indices[c], m),) + tuple(c[ax + 1:])
        g = ld(out_grad, d)
        if red == "assign":
            v = tirx.Select(last[d] == i64(c[ax]), g, zero)
        elif red == "add":
            v = g
        elif red == "mean":
            v = div(g, (hits[d] + tirx.const(1 if incl else 0, "int32")).astype(cdt))
        elif red == "mul":
            v = g * div(ld(out, d), safe_divisor(ld(values, c)))
        else:
            o = ld(out, d)
            e = eq[d].astype(cdt)
            # (a Select evaluates both sides: e is 0 where the value did not win, never used)
            v = tirx.Select(o == ld(values, c),
                            tirx.Select(o == ld(arr, d), div(g, e + one), div(g, tirx.max(e, one))),
                            zero)
        return v.astype(dt.storage)

    return (te.compute(arr.shape, arr_body, name="arr_grad"),
            te.compute(indices.shape, val_body, name="values_grad"))


# ------------------------------------------------------------------------------------------
# Row scatters: gather_nd / scatter / index_put / graph grads

def scatter_rows(ctx, n, feats, dest_shape, dt, name, lead, value, inputs):
    """out[lead(L, b) + f] += value(L, b, f) for b < n and every feature coordinate f in
    ``feats`` (a list of extents, possibly empty); out has ``dest_shape`` = the lead dims +
    feats and is 0 where nothing lands. Deterministic: one thread per feature column walks b
    serially (repeated rows add up in b order); atomic (build option): one CUDA thread per
    (b, f). Complex data (``ctx.pair``): the last feature dim is the (re, im) pair; every feature
    column is a parallel unit, without a vector strip (a strip must be the innermost index)."""
    det = ctx.info.deterministic
    feats = list(feats)
    acc = acc_dtype(dt)

    def gen(ins, outs, body):
        L, out, put = scatter_body(ins, outs, body)
        T = T_()

        def store(b, f, use_atomic):
            d = tuple(T.Bind(i64(x)) for x in lead(L, b)) + tuple(f)
            put(d, T.Bind(to_acc(value(L, b, tuple(f)), dt)), use_atomic)

        if det:
            if feats and not ctx.pair:
                two_forms(ctx, body, f"{name}_cols", lambda P, S, C: store(S[0], P + [C], False),
                          par=feats[:-1], ser=[n], vec=feats[-1], reads=list(ins), writes=[out])
            elif feats:
                body.block(f"{name}_cols", lambda P, S, C: store(S[0], P, False),
                           par=feats, ser=[n], reads=list(ins), writes=[out])
            else:
                body.block(f"{name}_cols", lambda P, S, C: store(S[0], [], False),
                           par=[1], ser=[n], reads=list(ins), writes=[out])
        else:
            cuda = ctx.on_cuda()
            body.block(f"{name}_atomic", lambda P, S, C: store(P[0], P[1:], True),
                       par=[n] + feats, reads=list(ins), writes=[out], when=cuda == 1)
            body.block(f"{name}_serial", lambda P, S, C: store(S[0], S[1:], False),
                       ser=[n] + feats, reads=list(ins), writes=[out], when=cuda == 0)

    (res,) = extern(f"{name}_scatter", [(list(dest_shape), acc)], list(inputs), gen)
    return cast_to(res, dt, name)


def copy_zeroing(g, dt, name, n, R, lead, inputs):
    """out = g, then out[lead(L, b) + (r,)] = 0 for b < n, r < R (every write is a 0: any order
    gives the same result, so the zeroing runs in parallel)."""
    def gen(ins, outs, body):
        gb = ins[0]
        out = outs[0]
        L = [proxy(b) for b in ins[1:]]
        gp, op_ = proxy(gb), proxy(out)
        T = T_()

        def copy(P, S, C):
            op_[tuple(P)] = gp[tuple(P)]
        body.block(f"{name}_copy", copy, par=list(g.shape), reads=[gb], writes=[out])

        def zero(P, S, C):
            d = tuple(T.Bind(i64(x)) for x in lead(L, P[0])) + (P[1],)
            op_[d] = tirx.const(0, dt.storage)
        body.block(f"{name}_zero", zero, par=[n, R], reads=list(ins[1:]), writes=[out])

    (res,) = extern(f"{name}_zeroing", [(list(g.shape), dt.storage)], [g] + list(inputs), gen)
    return res


def _nd_check(op, call, target, target_name, index_name="index"):
    """(k, B, R, lead dims) of a gather_nd-like index over ``target``'s shape; checks values."""
    idx = call.meta(index_name)
    if idx.ndim == 0:
        raise OpError(f"{op}: {index_name} must have at least one dim")
    k = idx.shape[-1]
    if k > len(target):
        raise OpError(f"{op}: {index_name}'s last dim ({k}) exceeds the rank {len(target)} of "
                      f"{target_name}")
    values = host(call, index_name)
    values = values.reshape(-1, k) if values is not None and k else None
    for j in range(k):
        check_range(op, index_name, None if values is None else values[:, j], -target[j], target[j],
                    f"in column {j} (dim {j} of {target_name}, size {target[j]}) ")
    return k, math.prod(idx.shape[:-1]), math.prod(target[k:]), tuple(target[:k])


def _gather_nd_view(call, metas, outs):
    op = call.op
    x = call.meta("x")
    k, b, r, lead = _nd_check(op, call, x.shape, "x")
    return ({"x": lead + (r,), "x_grad": lead + (r,), "index": (b, k), "out_grad": (b, r)}, ())


def _nd_lead(index, dims):
    k = len(dims)
    return lambda L, b: [wrap(L[1][b, i64(j)], dims[j]) for j in range(k)]


@index_op(view=_gather_nd_view, atomic=True, float_inputs=("x", "out_grad"),
          dtypes=CPLX + ("bool",) + INT_DTYPES)
def gather_nd_grad(x, index, out_grad, ctx):
    """x_grad[index[b]] += out_grad[b] (index[b] addresses the leading index.shape[-1] dims of x;
    repeated addresses add up in b order; -d <= index < d, negative counts from the end)."""
    dt = dt_of(out_grad)
    k = len(x.shape) - (2 if ctx.pair else 1)          # x seen as (lead dims..., rows[, pair])
    return scatter_rows(ctx, out_grad.shape[0], list(x.shape[k:]), x.shape, dt, "x_grad",
                        _nd_lead(index, list(x.shape[:k])), lambda L, b, f: tc(L[0][(b,) + f], dt),
                        [out_grad, index])


def _scatter_nd_view(call, metas, outs):
    op = call.op
    g = call.meta("out_grad")
    k, b, r, lead = _nd_check(op, call, g.shape, "out_grad")
    return ({"out_grad": lead + (r,), "index": (b, k), "updates": (b, r),
             "updates_grad": (b, r)}, ())


@index_op(view=_scatter_nd_view, alias={"x_grad": "out_grad"}, float_inputs=("updates", "out_grad"),
          dtypes=FLOATS + ("uint8", "int32", "int64"))
def scatter_nd_add_grad(index, updates, out_grad):
    """out = x with updates added at index:  x_grad = out_grad (no kernel),
    updates_grad[b] = out_grad[index[b]] (-d <= index < d)."""
    dims = list(out_grad.shape[:-1])

    def body(b, r):
        return out_grad[tuple(wrap(index[b, i64(j)], dims[j]) for j in range(len(dims))) + (r,)]

    return None, te.compute(updates.shape, body, name="updates_grad")


def _scatter_view(call, metas, outs):
    op = call.op
    g, idx, up = call.meta("out_grad"), call.meta("index"), call.meta("updates")
    if g.ndim == 0:
        raise OpError(f"{op}: out_grad must have at least one dim")
    if not (idx.ndim <= 1 or idx.ndim == 2 and idx.shape[1] == 1):
        raise OpError(f"{op}: index must be 0-d, 1-d or of shape [N, 1], got {list(idx.shape)}")
    n = idx.shape[0] if idx.ndim else 1
    want = ((n,) if idx.ndim else ()) + g.shape[1:]
    if up.shape != want:
        raise OpError(f"{op}: updates has shape {list(up.shape)}, expected {list(want)} from "
                      f"index {list(idx.shape)} and out_grad {list(g.shape)}")
    m = g.shape[0]
    check_range(op, "index", host(call, "index"), -m, m, f"for dim 0 of out_grad (size {m}) ")
    r = math.prod(g.shape[1:])
    return ({"out_grad": (m, r), "x_grad": (m, r), "index": (n,), "updates": (n, r),
             "updates_grad": (n, r)}, ())


@index_op(view=_scatter_view, code_attrs=(), float_inputs=("updates", "out_grad"),
          dtypes=FLOATS + ("int32", "int64"))
def scatter_grad(index, updates, out_grad, overwrite):
    """x_grad = out_grad with the rows at index zeroed (in both modes: Paddle's forward zeroes
    them before adding when overwrite=False), updates_grad[i] = out_grad[index[i]] (every
    repeated index gets it, as Paddle); -M <= index < M."""
    dt = dt_of(out_grad)
    m = out_grad.shape[0]
    x_grad = copy_zeroing(out_grad, dt, "x_grad", updates.shape[0], out_grad.shape[1],
                          lambda L, b: [wrap(L[0][b], m)], [index])
    upd = te.compute(updates.shape, lambda i, r: out_grad[wrap(index[i], m), r],
                     name="updates_grad")
    return x_grad, upd


def _bcast_or_fail(op, shapes, names):
    from tvmgrad.infer_meta import MetaError, broadcast_shapes
    try:
        return broadcast_shapes(*shapes, names=tuple(names))
    except MetaError as exc:
        raise OpError(f"{op}: {exc}") from None


class _MaskIndices(list):
    """index_put_grad's indices after its bool masks were replaced by their nonzero() index
    tensors; ``empty``: some mask held no True (Paddle then returns x_grad = out_grad and a zero
    value_grad without looking at the other indices or value's shape)."""

    empty = False


def _index_put_rewrite(call):
    """Paddle's DealWithBoolIndices on the host: every bool mask of rank r (>= 1) addressing x's
    dims d..d+r-1 becomes the r int64 index tensors of its nonzero() (numpy's rule); int32/int64
    indices stay. A mask may be smaller than the dims it addresses (as in Paddle); a True outside
    x is out of range."""
    import numpy as np
    op, ind = call.op, call.tensors["indices"]
    metas = call.meta("indices")
    if not any(m.dtype.name == "bool" for m in metas):
        return
    if not call.has_data:
        raise OpError(f"{op}: a bool mask index needs its values (its True count sets the kernel's "
                      f"sizes); in a graph, convert it to integer indices with nonzero() first")
    x = call.meta("x")
    out, dim, empty = _MaskIndices(), 0, False
    for i, (a, m) in enumerate(zip(ind, metas)):
        if m.dtype.name != "bool":
            out.append(a)
            dim += 1
            continue
        a = np.asarray(a)
        if a.ndim == 0:
            raise OpError(f"{op}: input 'indices[{i}]' is a 0-d bool mask; a mask needs at least one "
                          f"dim (as in Paddle)")
        if dim + a.ndim > x.ndim:
            raise OpError(f"{op}: input 'indices[{i}]' (a bool mask of shape {list(a.shape)}) and the "
                          f"indices before it address {dim + a.ndim} dims of x, which has rank {x.ndim}")
        nz = np.nonzero(a)
        for j, (z, n) in enumerate(zip(nz, x.shape[dim:])):
            if z.size and int(z.max()) >= n:
                pos = [int(v[int(np.argmax(z >= n))]) for v in nz]
                raise OpError(f"{op}: input 'indices[{i}]' (a bool mask of shape {list(a.shape)}) is "
                              f"True at {pos}, outside x's dim {dim + j} of size {n}")
        empty = empty or nz[0].size == 0
        out += [z.astype(np.int64) for z in nz]
        dim += a.ndim
    out.empty = empty
    call.tensors["indices"] = out


def _index_put_view(call, metas, outs):
    op = call.op
    x, ind, val = call.meta("x"), call.meta("indices"), call.meta("value")
    k = len(ind)
    if k > x.ndim:
        raise OpError(f"{op}: {k} index tensors for x of rank {x.ndim}")
    acc = bool(call.attrs["accumulate"])
    if getattr(call.tensors["indices"], "empty", False):
        # a bool mask without a True: nothing is indexed (Paddle returns before broadcasting)
        return ({"value": val.shape, "value_grad": val.shape}, ("none",))
    ishape = _bcast_or_fail(op, [m.shape for m in ind], [f"indices[{i}]" for i in range(k)])
    q = len(ishape)
    pshape = tuple(ishape) + x.shape[k:]
    if len(val.shape) > len(pshape) or any(
            v not in (1, p) for v, p in zip(_aligned(val.shape, len(pshape)), pshape)):
        raise OpError(f"{op}: value has shape {list(val.shape)}, which does not broadcast to the "
                      f"indexed shape {list(pshape)}")
    for i in range(k):
        check_range(op, f"indices[{i}]", host_item(call, "indices", i), -x.shape[i],
                    x.shape[i], f"for dim {i} of size {x.shape[i]} ")
    if math.prod(pshape) == 0:
        return ({"value": val.shape, "value_grad": val.shape}, ("none",))
    iv = [_aligned(m.shape, q) for m in ind]
    vv = _aligned(val.shape, len(pshape))
    imasks = tuple(tuple(a != b for a, b in zip(v, ishape)) for v in iv)
    vmask = tuple(a != b for a, b in zip(vv, pshape))
    return ({"indices": iv, "value": vv, "value_grad": vv}, ("put", k, imasks, vmask, acc))


def host_item(call, name, i):
    """The numpy array of element ``i`` of Tensor[] input ``name`` (None without data)."""
    import numpy as np
    return np.asarray(call.tensors[name][i]) if call.has_data else None


@index_op(view=_index_put_view, code_attrs=(), float_inputs=("x", "value", "out_grad"),
          index_dtypes=("int32", "int64", "bool"), rewrite=_index_put_rewrite,
          dtypes=CPLX + ("bool",) + INT_DTYPES)
def index_put_grad(x, indices, value, out_grad, accumulate, ctx):
    """out = x with value put at x[indices] (numpy advanced indexing: the index tensors broadcast
    together and address x's leading dims; accumulate: added):  x_grad = out_grad, zeroed at the
    addressed elements unless accumulate; value_grad = out_grad[indices] summed over the dims
    value was broadcast along. -d <= index < d (negative counts from the end). A bool mask of
    rank r addresses r dims by its nonzero() indices (converted on the host, as Paddle does); a
    mask without a True, or an empty index, addresses nothing (x_grad = out_grad, value_grad = 0)."""
    dt = dt_of(out_grad)
    variant = ctx.info.variant
    if variant[0] == "none":
        xg = te.compute(x.shape, lambda *i: out_grad[i], name="x_grad")
        vg = te.compute(value.shape, lambda *i: tirx.const(0, dt.storage), name="value_grad")
        return xg, vg
    _, k, imasks, vmask, acc = variant
    q = len(imasks[0])
    idims = []
    for d in range(q):
        src = [indices[i].shape[d] for i in range(k) if not imasks[i][d]]
        idims.append(src[0] if src else i64(1))
    pdims = idims + list(x.shape[k:])

    def coords(load, p):
        ip = p[:q]
        return tuple(wrap(load(i, tuple(i64(0) if imasks[i][d] else ip[d] for d in range(q))),
                          x.shape[i]) for i in range(k)) + tuple(p[q:])

    vgrad = reduce_to(pdims, value.shape, vmask,
                      lambda p: tc(out_grad[coords(lambda i, c: indices[i][c], p)], dt),
                      dt, "value_grad")
    if acc:
        return te.compute(x.shape, lambda *i: out_grad[i], name="x_grad"), vgrad

    def gen(ins, outs, body):
        gb, ib = ins[0], ins[1:]
        out = outs[0]
        gp, op_ = proxy(gb), proxy(out)
        L = [proxy(b) for b in ib]
        T = T_()

        def copy(P, S, C):
            op_[tuple(P)] = gp[tuple(P)]
        body.block("x_grad_copy", copy, par=list(x.shape), reads=[gb], writes=[out])

        def zero(P, S, C):
            d = tuple(T.Bind(i64(v)) for v in coords(lambda i, c: L[i][c], list(P)))
            op_[d] = tirx.const(0, dt.storage)
        body.block("x_grad_zero", zero, par=pdims, reads=list(ib), writes=[out])

    (xg,) = extern("x_grad_zeroing", [(list(x.shape), dt.storage)], [out_grad] + list(indices), gen)
    return xg, vgrad


# ------------------------------------------------------------------------------------------
# Graph message passing: send_u_recv / send_ue_recv / send_uv

_REDUCE_OPS = ("SUM", "MEAN", "MIN", "MAX")
_MESSAGE_OPS = ("ADD", "MUL")


def _graph_edges(op, call, n_src, n_dst, dst_of="out_grad"):
    """The edge count; src_index must address x's rows (n_src), dst_index ``dst_of``'s (n_dst)."""
    src, dst = call.meta("src_index"), call.meta("dst_index")
    if src.ndim != 1 or dst.ndim != 1 or src.shape != dst.shape:
        raise OpError(f"{op}: src_index and dst_index must be 1-d of one length, got "
                      f"{list(src.shape)} and {list(dst.shape)}")
    check_range(op, "src_index", host(call, "src_index"), 0, n_src,
                f"for the {n_src} source nodes (rows of x) ")
    check_range(op, "dst_index", host(call, "dst_index"), 0, n_dst,
                f"for the {n_dst} destination nodes (rows of {dst_of}) ")
    return src.shape[0]


def _attr_choice(op, call, name, choices):
    value = str(call.attrs[name]).upper()
    if value not in choices:
        raise OpError(f"{op}: attribute {name!r} is {call.attrs[name]!r}; expected one of "
                      f"{', '.join(choices)}")
    return value


def _reduce_inputs(op, call, red, out_shape):
    out, cnt = call.tensors.get("out"), call.tensors.get("dst_count")
    if red in ("MIN", "MAX") and out is None:
        raise OpError(f"{op}: reduce_op {red} needs input 'out' (the forward's output)")
    if red == "MEAN" and cnt is None:
        raise OpError(f"{op}: reduce_op MEAN needs input 'dst_count' (the forward's counts)")
    if out is not None and call.meta("out").shape != tuple(out_shape):
        raise OpError(f"{op}: out has shape {list(call.meta('out').shape)}, expected "
                      f"{list(out_shape)}")
    if cnt is not None:
        if call.meta("dst_count").shape != (out_shape[0],):
            raise OpError(f"{op}: dst_count has shape {list(call.meta('dst_count').shape)}, "
                          f"expected [{out_shape[0]}]")
        counts, dst = host(call, "dst_count"), host(call, "dst_index")
        if counts is not None:
            # the forward's count of edges per destination node: exactly dst_index's histogram
            import numpy as np
            want = np.bincount(dst.reshape(-1).astype(np.int64), minlength=out_shape[0])
            bad = np.flatnonzero(counts.astype(np.int64) != want[:out_shape[0]])
            if bad.size:
                d = int(bad[0])
                raise OpError(f"{op}: input 'dst_count' holds {int(counts[d])} at [{d}], but "
                              f"{int(want[d])} edges have dst_index {d} (dst_count is the forward's "
                              f"count of edges per destination node)")


def _feature_view(names_shapes, full):
    """Views (rows,) + features left-padded to the rank of ``full`` and broadcast masks."""
    views, masks = {}, []
    for names, shape in names_shapes:
        v = (shape[0],) + _aligned(shape[1:], len(full))
        views.update({n: v for n in names})
        masks.append(tuple(a != b for a, b in zip(v[1:], full)))
    return views, tuple(masks)


def _send_u_recv_view(call, metas, outs):
    op = call.op
    x, g = call.meta("x"), call.meta("out_grad")
    red = _attr_choice(op, call, "reduce_op", _REDUCE_OPS)
    if x.ndim == 0:
        raise OpError(f"{op}: x must have at least one dim")
    if g.ndim == 0 or g.shape[1:] != x.shape[1:]:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected [M] + "
                      f"{list(x.shape[1:])} (x's feature dims, x {list(x.shape)})")
    _graph_edges(op, call, x.shape[0], g.shape[0])
    _reduce_inputs(op, call, red, g.shape)
    f = math.prod(x.shape[1:])
    views = {"x": (x.shape[0], f), "x_grad": (x.shape[0], f), "out_grad": (g.shape[0], f),
             "out": (g.shape[0], f)}
    return views, (red,)


@index_op(view=_send_u_recv_view, atomic=True, code_attrs=(), float_inputs=("x", "out", "out_grad"),
          dtypes=FLOATS + ("int32", "int64"))
def send_u_recv_grad(x, src_index, dst_index, out, dst_count, out_grad, reduce_op, ctx):
    """out[d] = reduce_{e: dst[e]=d} x[src[e]]:  x_grad[src[e]] += out_grad[dst[e]] · w(e), with
    w = 1 (SUM), 1/dst_count[dst[e]] (MEAN), [x[src[e]] == out[dst[e]]] (MIN/MAX: every tied
    edge gets the full grad, as Paddle). Edges add up in edge order. Integer dtypes: MEAN's
    division truncates per edge (as Paddle's)."""
    dt = dt_of(out_grad)
    (red,) = ctx.info.variant
    inputs = [out_grad, src_index, dst_index]
    if red == "MEAN":
        inputs.append(dst_count)
    if red in ("MIN", "MAX"):
        inputs += [x, out]

    def value(L, e, f):
        d = L[2][e]
        g = tc(L[0][(d,) + f], dt)
        if red == "MEAN":
            return div(g, L[3][d].astype(dt.compute))
        if red in ("MIN", "MAX"):
            hit = tc(L[3][(L[1][e],) + f], dt) == tc(L[4][(d,) + f], dt)
            return tirx.Select(hit, g, zeros_like(g))
        return g

    return scatter_rows(ctx, src_index.shape[0], [x.shape[1]], x.shape, dt, "x_grad",
                        lambda L, e: [L[1][e]], value, inputs)


def _message(mop, a, b):
    return a + b if mop == "ADD" else a * b


def _send_ue_recv_view(call, metas, outs):
    op = call.op
    x, y, g = call.meta("x"), call.meta("y"), call.meta("out_grad")
    mop = _attr_choice(op, call, "message_op", _MESSAGE_OPS)
    red = _attr_choice(op, call, "reduce_op", _REDUCE_OPS)
    if x.ndim == 0 or y.ndim == 0 or g.ndim == 0:
        raise OpError(f"{op}: x, y and out_grad must have at least one dim")
    feats = _bcast_or_fail(op, [x.shape[1:], y.shape[1:]], ["x features", "y features"])
    if g.shape[1:] != feats:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected [M] + {list(feats)} "
                      f"(the feature dims of x {list(x.shape)} and y {list(y.shape)} broadcast)")
    e = _graph_edges(op, call, x.shape[0], g.shape[0])
    if y.shape[0] != e:
        raise OpError(f"{op}: y has {y.shape[0]} rows, expected one per edge ({e})")
    _reduce_inputs(op, call, red, g.shape)
    views, masks = _feature_view([(("x", "x_grad"), x.shape), (("y", "y_grad"), y.shape)], feats)
    return views, (mop, red) + masks


@index_op(view=_send_ue_recv_view, atomic=True, code_attrs=(),
          float_inputs=("x", "y", "out", "out_grad"), dtypes=FLOATS + ("int32", "int64"))
def send_ue_recv_grad(x, y, src_index, dst_index, out, dst_count, out_grad, message_op, reduce_op, ctx):
    """out[d] = reduce_{e: dst[e]=d} x[src[e]] ⊙ y[e] (⊙: ADD/MUL, features broadcast): with
    G(e) = out_grad[dst[e]] · w(e) (w as send_u_recv_grad; MIN/MAX compare x[src[e]] ⊙ y[e] with
    out[dst[e]]), x_grad[src[e]] += G(e)·(y[e] for MUL), y_grad[e] = G(e)·(x[src[e]] for MUL),
    each summed over the feature dims it was broadcast along; edges add up in edge order. MEAN
    divides each product by the count (out_grad·y / count: integer dtypes truncate there, as
    Paddle's)."""
    dt = dt_of(out_grad)
    mop, red, mx, my = ctx.info.variant
    feats = list(out_grad.shape[1:])
    zero = tirx.const(0, dt.compute)

    def grad_edge(e, f, for_x):
        d = dst_index[e]
        s = src_index[e]
        g = tc(out_grad[(d,) + f], dt)
        xv = tc(bload(x, (s,) + f, (False,) + mx), dt)
        yv = tc(bload(y, (e,) + f, (False,) + my), dt)
        if red in ("MIN", "MAX"):
            g = tirx.Select(_message(mop, xv, yv) == tc(out[(d,) + f], dt), g, zero)
        if mop == "MUL":
            g = g * (yv if for_x else xv)
        if red == "MEAN":
            g = div(g, dst_count[d].astype(dt.compute))
        return g

    n_e = src_index.shape[0]
    y_grad = reduce_to([n_e] + feats, y.shape, (False,) + my,
                       lambda idx: grad_edge(idx[0], tuple(idx[1:]), False), dt, "y_grad")
    dx = as_dtype(dt.compute)
    per_edge = reduce_to([n_e] + feats, [n_e] + list(x.shape[1:]), (False,) + mx,
                         lambda idx: grad_edge(idx[0], tuple(idx[1:]), True), dx, "x_msg")
    x_grad = scatter_rows(ctx, n_e, list(x.shape[1:]), x.shape, dt, "x_grad",
                          lambda L, e: [L[1][e]], lambda L, e, f: L[0][(e,) + f],
                          [per_edge, src_index])
    return x_grad, y_grad


def _send_uv_view(call, metas, outs):
    op = call.op
    x, y, g = call.meta("x"), call.meta("y"), call.meta("out_grad")
    mop = _attr_choice(op, call, "message_op", _MESSAGE_OPS)
    if x.ndim == 0 or y.ndim == 0 or g.ndim == 0:
        raise OpError(f"{op}: x, y and out_grad must have at least one dim")
    feats = _bcast_or_fail(op, [x.shape[1:], y.shape[1:]], ["x features", "y features"])
    e = _graph_edges(op, call, x.shape[0], y.shape[0], dst_of="y")
    if g.shape != (e,) + tuple(feats):
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected [{e}] + {list(feats)}")
    views, masks = _feature_view([(("x", "x_grad"), x.shape), (("y", "y_grad"), y.shape)], feats)
    return views, (mop,) + masks


@index_op(view=_send_uv_view, atomic=True, code_attrs=(), float_inputs=("x", "y", "out_grad"),
          dtypes=FLOATS + ("int32", "int64"))
def send_uv_grad(x, y, src_index, dst_index, out_grad, message_op, ctx):
    """out[e] = x[src[e]] ⊙ y[dst[e]] (⊙: ADD/MUL, features broadcast):
    x_grad[src[e]] += out_grad[e]·(y[dst[e]] for MUL), y_grad[dst[e]] += out_grad[e]·(x[src[e]]
    for MUL), each summed over the feature dims it was broadcast along; edges add up in order."""
    dt = dt_of(out_grad)
    mop, mx, my = ctx.info.variant
    feats = list(out_grad.shape[1:])
    n_e = src_index.shape[0]
    dx = as_dtype(dt.compute)

    def grad_edge(e, f, for_x):
        g = tc(out_grad[(e,) + f], dt)
        if mop == "MUL":
            other = (bload(y, (dst_index[e],) + f, (False,) + my) if for_x
                     else bload(x, (src_index[e],) + f, (False,) + mx))
            g = g * tc(other, dt)
        return g

    grads = []
    for t, mask, idx, name, for_x in ((x, mx, src_index, "x", True), (y, my, dst_index, "y", False)):
        per_edge = reduce_to([n_e] + feats, [n_e] + list(t.shape[1:]), (False,) + mask,
                             lambda i, fx=for_x: grad_edge(i[0], tuple(i[1:]), fx), dx,
                             f"{name}_msg")
        grads.append(scatter_rows(ctx, n_e, list(t.shape[1:]), t.shape, dt, f"{name}_grad",
                                  lambda L, e: [L[1][e]], lambda L, e, f: L[0][(e,) + f],
                                  [per_edge, idx]))
    return tuple(grads)


def _masked_view(call, metas, outs):
    import numpy as np
    op = call.op
    x, mask, g = call.meta("x"), call.meta("mask"), call.meta("out_grad")
    full = _bcast_or_fail(op, [x.shape, mask.shape], ["x", "mask"])
    if g.ndim != 1:
        raise OpError(f"{op}: out_grad must be 1-d, got shape {list(g.shape)}")
    count = int(np.count_nonzero(np.broadcast_to(host(call, "mask"), full)))
    if count != g.shape[0]:
        raise OpError(f"{op}: mask selects {count} elements but out_grad has {g.shape[0]} (x "
                      f"{list(x.shape)} broadcast with mask {list(mask.shape)})")
    rank = len(full)
    xv, mv = _aligned(x.shape, rank), _aligned(mask.shape, rank)
    masks = (tuple(a != b for a, b in zip(xv, full)), tuple(a != b for a, b in zip(mv, full)))
    return {"x": xv, "x_grad": xv, "mask": mv}, masks


def _masked_scalars(call, views):
    full = _bcast_or_fail(call.op, [call.meta("x").shape, call.meta("mask").shape], ["x", "mask"])
    return scan_scalars(math.prod(full))


@index_op(view=_masked_view, float_inputs=("x", "out_grad"), index_dtypes=("bool",),
          host_scalars=_masked_scalars, dtypes=CPLX + ("bool",) + INT_DTYPES)
def masked_select_grad(x, mask, out_grad, ctx):
    """out = x[mask] (x and mask broadcast together, row-major order):  the k-th selected
    element's grad is out_grad[k], the rest 0, summed over the dims x was broadcast along. The
    position k of every element is an exclusive scan of the (broadcast) mask, walked as one flat
    row (blocked_scan). Complex: both parts of out_grad[k] move; bool: the sum is an OR."""
    dt = dt_of(out_grad)
    xm, mm = ctx.info.variant
    rank = len(xm)
    full = [mask.shape[d] if xm[d] else x.shape[d] for d in range(rank)]
    total = i64(1)
    for d in full:
        total = total * d
    direct = not any(xm)
    if any(mm):
        mask = te.compute(full, lambda *i: bload(mask, i, mm), name="mask_full")
    out_dtype = dt.storage if direct else dt.compute
    lanes = [2] if ctx.pair else []          # complex: the (re, im) pair of every element
    T = T_()

    def flat(buf, tail=()):
        return proxy(T.decl_buffer((total,) + tuple(tail), buf.dtype, data=buf.data))

    def element(L, col, i):
        return (tirx.Select(flat(L[0]._buffer)[i], i64(1), i64(0)),)

    def emit(L, O, col, i, s):
        for part in ([i64(0), i64(1)] if lanes else [None]):
            at = (s[0],) if part is None else (s[0], part)
            v = tirx.Select(flat(L[0]._buffer)[i], tc(L[1][at], dt), tirx.const(0, dt.compute))
            dest = flat(O[0]._buffer, lanes)
            dest[(i,) if part is None else (i, part)] = v.astype(dt.storage) if direct else v

    (res,) = blocked_scan(ctx, "masked", total, [], [mask, out_grad], [(full + lanes, out_dtype)], ("int64",),
                          (i64(0),), lambda a, b: (a[0] + b[0],), element, emit, exclusive=True)
    if direct:
        return res
    return reduce_to(full, x.shape, xm, lambda idx: res[idx], dt, "x_grad")


