"""Sort/select grads: argsort, topk, kthvalue, mode, nanmedian.

The forward's indices say where each selected value came from; the grad puts out_grad back there,
following Paddle 3.3.1's CPU kernels: argsort/topk assign along the axis (a repeated index keeps
the last element's grad, one thread per column walking the axis in order, so runs are
bit-identical), kthvalue/mode put each output's grad at its single index (a gather-formulated
elementwise kernel), nanmedian spreads it evenly over the elements equal to the median (or halves
it between the two middles). Indices are checked on the host: 0 <= index < n (Paddle 3.3.1
corrupts memory on a negative one). Integer data (where Paddle registers it) moves as the floats
do; nanmedian's integer median is the forward's ``(a + b) / 2`` in the integer type (wrapping,
truncated, as Paddle's) and its grad shares divide truncating, as C++'s.
"""

from __future__ import annotations

import math

from tvmgrad.dtypes import FLOATS, INTS
from tvmgrad.families.base import OpError
from tvmgrad.families.shape import dt_of
from tvmgrad.infer_meta import norm_axis
from tvmgrad.lazy import te, tirx

from ._extern import i64, tc
from ._plan import check_range, host, split_axis
from tvmgrad.families.index import index_op

from ._scatter import div, scatter_along

# Paddle's registrations beyond the floats (CPU and GPU together)
SELECT_DTYPES = FLOATS + INTS
ARGSORT_DTYPES = FLOATS + ("uint8", "int16") + INTS


def _along(op, call, x, idx, g, axis_attr="axis"):
    """Checks of an index along an axis with x's other dims; -> views (outer, n[, inner])."""
    if x.ndim == 0:
        x_shape, axis = (1,), 0
    else:
        x_shape = x.shape
        axis = norm_axis(int(call.attrs[axis_attr]), x.ndim, of="x", op=op, zero_d_axis=True)
    want = idx.shape
    if idx.ndim != x.ndim or any(a != b for d, (a, b) in enumerate(zip(idx.shape, x.shape))
                                 if d != axis):
        raise OpError(f"{op}: indices has shape {list(idx.shape)}; it must match x "
                      f"{list(x.shape)} on every dim but axis {axis}")
    if g.shape != want:
        raise OpError(f"{op}: out_grad has shape {list(g.shape)}, expected indices' {list(want)}")
    n = x_shape[axis]
    check_range(op, "indices", host(call, "indices"), 0, n, f"for axis {axis} of size {n} ")
    outer, m, inner = split_axis(x_shape, axis)
    k = idx.shape[axis] if idx.ndim else 1
    tail = (inner,) if inner != 1 else ()
    return {"x": (outer, m) + tail, "x_grad": (outer, m) + tail,
            "indices": (outer, k) + tail, "out_grad": (outer, k) + tail}, ()


def _assign(x, indices, out_grad, ctx):
    dt = dt_of(out_grad)
    return scatter_along(ctx, out_grad, 1, x.shape, dt, "x_grad", lambda L, c: L[1][tuple(c)],
                         [out_grad, indices], assign=True)


def _argsort_view(call, metas, outs):
    x, idx, g = call.meta("x"), call.meta("indices"), call.meta("out_grad")
    if idx.shape != x.shape:
        raise OpError(f"{call.op}: indices has shape {list(idx.shape)}, expected x's "
                      f"{list(x.shape)}")
    return _along(call.op, call, x, idx, g)


@index_op(view=_argsort_view, code_attrs=(), float_inputs=("x", "out_grad"),
          dtypes=ARGSORT_DTYPES)
def argsort_grad(indices, x, out_grad, axis, descending, stable, ctx):
    """x_grad[.., indices[.., i, ..], ..] = out_grad[.., i, ..] along ``axis`` (a permutation;
    for a repeated index the last i wins, as Paddle's CPU kernel)."""
    return _assign(x, indices, out_grad, ctx)


def _topk_view(call, metas, outs):
    x, idx = call.meta("x"), call.meta("indices")
    views = _along(call.op, call, x, idx, call.meta("out_grad"))
    k = call.attrs["k"]
    want = 1
    if x.ndim:
        want = idx.shape[norm_axis(int(call.attrs["axis"]), x.ndim, of="x", op=call.op)]
    if k != want:
        raise OpError(f"{call.op}: attribute 'k' = {k}, but 'indices' holds {want} along the axis "
                      f"(k must be the forward's, 1 <= k <= the axis size of 'x')")
    return views


@index_op(view=_topk_view, code_attrs=(), float_inputs=("x", "out_grad"), dtypes=SELECT_DTYPES)
def topk_grad(x, indices, out_grad, k, axis, largest, sorted, ctx):
    """x_grad = 0 except x_grad[.., indices[.., i, ..], ..] = out_grad[.., i, ..] along ``axis``
    (for a repeated index the last i wins, as Paddle's CPU kernel)."""
    return _assign(x, indices, out_grad, ctx)


# ------------------------------------------------------------------------------------------
# kthvalue / mode: one index per output

def _select_view(call, metas, outs):
    op = call.op
    x, idx, g = call.meta("x"), call.meta("indices"), call.meta("out_grad")
    if x.ndim == 0:
        x_shape, axis = (1,), 0
    else:
        x_shape = x.shape
        axis = norm_axis(int(call.attrs["axis"]), x.ndim, of="x", op=op, zero_d_axis=True)
    kept = x_shape[:axis] + x_shape[axis + 1:]
    keep = x_shape[:axis] + (1,) + x_shape[axis + 1:]
    allowed = {kept, keep} if x.ndim else {(), (1,)}
    for n, m in (("indices", idx), ("out_grad", g)):
        if m.shape not in allowed:
            raise OpError(f"{op}: {n} has shape {list(m.shape)}, expected {list(kept)}"
                          f"{' or ' + str(list(keep)) if x.ndim else ''} (the shape of 'x' "
                          f"{list(x.shape)} without axis {axis}, or with 1 there)")
    n = x_shape[axis]
    if "k" in call.attrs and not 1 <= call.attrs["k"] <= max(n, 1):
        raise OpError(f"{op}: attribute 'k' = {call.attrs['k']} is out of range [1, {n}] (the "
                      f"size of axis {axis} of 'x')")
    check_range(op, "indices", host(call, "indices"), 0, n, f"for axis {axis} of size {n} ")
    outer, m, inner = split_axis(x_shape, axis)
    return {"x": (outer, m, inner), "x_grad": (outer, m, inner), "indices": (outer, inner),
            "out_grad": (outer, inner)}, ()


def _select(x, indices, out_grad):
    dt = dt_of(out_grad)
    zero = tirx.const(0, dt.storage)
    return te.compute(x.shape, lambda o, j, c: tirx.Select(
        i64(indices[o, c]) == j, out_grad[o, c], zero), name="x_grad")


@index_op(view=_select_view, code_attrs=(), float_inputs=("x", "out_grad"),
          dtypes=SELECT_DTYPES)
def kthvalue_grad(x, indices, out_grad, k, axis, keepdim):
    """x_grad = 0 except x_grad[.., indices[..], ..] = out_grad[..] along ``axis`` (the index the
    forward picked among ties)."""
    return _select(x, indices, out_grad)


@index_op(view=_select_view, code_attrs=(), float_inputs=("x", "out_grad"),
          dtypes=SELECT_DTYPES)
def mode_grad(x, indices, out_grad, axis, keepdim):
    """x_grad = 0 except x_grad[.., indices[..], ..] = out_grad[..] along ``axis`` (the forward's
    index: the last occurrence of the mode)."""
    return _select(x, indices, out_grad)


# ------------------------------------------------------------------------------------------
# nanmedian

def _median_axes(op, axis, rank):
    if rank <= 1 or not axis:
        return tuple(range(rank))
    out = sorted({norm_axis(int(a), rank, of="x", op=op, zero_d_axis=True) for a in axis})
    return tuple(out)


def _nanmedian_view(call, metas, outs):
    op = call.op
    x, med, g = call.meta("x"), call.meta("medians"), call.meta("out_grad")
    mode = call.attrs["mode"]
    if mode not in ("avg", "min"):
        raise OpError(f"{op}: attribute 'mode' is {mode!r}; expected 'avg' or 'min'")
    axes = _median_axes(op, call.attrs["axis"], x.ndim)
    reduced = [x.shape[a] for a in axes]
    kept_n = math.prod(x.shape[a] for a in range(x.ndim) if a not in axes)
    r = math.prod(reduced)
    per = 2 if mode == "avg" else 1
    if math.prod(g.shape) != kept_n:
        raise OpError(f"{op}: out_grad has {math.prod(g.shape)} elements, expected {kept_n} (one "
                      f"per median of 'x' {list(x.shape)} over axis {list(axes)})")
    if math.prod(med.shape) != kept_n * per or (mode == "avg" and med.shape[-1:] != (2,)):
        raise OpError(f"{op}: medians has shape {list(med.shape)}, expected {kept_n} "
                      f"{'pairs of ' if per == 2 else ''}indices (one per median of 'x' "
                      f"{list(x.shape)})")
    check_range(op, "medians", host(call, "medians"), -1, max(r, 0),
                f"for {r} reduced elements ")
    evenly = len(call.attrs["axis"]) != 1 or mode == "avg"
    xs = x.shape if x.ndim else (1,)
    return ({"x": xs, "x_grad": xs, "medians": (kept_n, per), "out_grad": (kept_n,)},
            (axes if x.ndim else (0,), mode, evenly))


def _lin(coords, dims):
    out = i64(0)
    for c, d in zip(coords, dims):
        out = out * i64(d) + i64(c)
    return out


def _unlin(index, dims):
    out, rest = [], i64(index)
    for d in reversed(dims):
        out.append(tirx.truncmod(rest, i64(d)))
        rest = tirx.truncdiv(rest, i64(d))
    return list(reversed(out))


@index_op(view=_nanmedian_view, code_attrs=(), float_inputs=("x", "out_grad"),
          index_dtypes=("int64",), dtypes=SELECT_DTYPES)
def nanmedian_grad(x, medians, out_grad, axis, keepdim, mode, ctx):
    """Per median (the reduced dims flattened in order, medians: their indices, -1 when every
    element is NaN), as Paddle 3.3.1's CPU kernel: with v the median value (the average of the
    two middles for avg, truncated for integers; NaN for -1, which no integer matches), if
    ``axis`` names one dim and mode is min, x_grad[m] = out_grad; otherwise out_grad is split
    evenly over the elements equal to v (NaN matching NaN), or, when none is (avg of two
    different middles), halved between the two indices (integer shares truncated)."""
    dt = dt_of(out_grad)
    axes, mode_, evenly = ctx.info.variant
    rank = len(x.shape)
    kept_ax = [a for a in range(rank) if a not in axes]
    kdims = [x.shape[a] for a in kept_ax]
    rdims = [x.shape[a] for a in axes]
    avg = mode_ == "avg"
    cd = dt.compute

    def full(kc, rc):
        c = [None] * rank
        for a, v in zip(kept_ax, kc):
            c[a] = v
        for a, v in zip(axes, rc):
            c[a] = v
        return tuple(c)

    def at(k, m):
        """x at reduced flat index m of median k (m >= 0)."""
        return tc(x[full(_unlin(k, kdims), _unlin(tirx.max(m, i64(0)), rdims))], dt)

    integer = dt.kind == "int"
    # no median (index -1): NaN, which only NaN matches; integers have none, so nothing matches
    missing = tirx.const(0 if integer else math.nan, cd)

    def value(k):
        m0 = medians[k, 0]
        v0 = at(k, m0)
        v = div(v0 + at(k, medians[k, 1]), tirx.const(2, cd)) if avg else v0
        return tirx.Select(m0 >= i64(0), v, missing)

    val = te.compute((_kn(kdims),), value, name="median_value")

    def match(xv, k):
        v = val[k]
        if integer:
            return tirx.And(medians[k, 0] >= i64(0), xv == v)
        return tirx.Or(xv == v, tirx.And(tirx.isnan(v), tirx.isnan(xv)))

    if evenly:
        raxes = [te.reduce_axis((0, d), name=f"r{i}") for i, d in enumerate(rdims)]

        def count(k):
            xv = tc(x[full(_unlin(k, kdims), raxes)], dt)
            return te.sum(tirx.Select(match(xv, k), i64(1), i64(0)), axis=raxes)

        cnt = te.compute((_kn(kdims),), count, name="median_count")

    zero = tirx.const(0, cd)

    def grad(*c):
        k = _lin([c[a] for a in kept_ax], kdims)
        j = _lin([c[a] for a in axes], rdims)
        g = tc(out_grad[k], dt)
        m0 = medians[k, 0]
        if not evenly:
            return tirx.Select(j == m0, g, zero).astype(dt.storage)
        m1 = medians[k, 1] if avg else m0
        n = cnt[k]
        xv = tc(x[c], dt)
        spread = tirx.Select(match(xv, k), div(g, n.astype(cd)), zero)
        half = tirx.Select(m0 == m1, tirx.Select(j == m0, g, zero),
                           tirx.Select(tirx.Or(j == m0, j == m1), div(g, tirx.const(2, cd)), zero))
        return tirx.Select(n > i64(0), spread, half).astype(dt.storage)

    return te.compute(x.shape, grad, name="x_grad")


def _kn(kdims):
    out = i64(1)
    for d in kdims:
        out = out * i64(d)
    return out
