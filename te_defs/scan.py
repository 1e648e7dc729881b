"""Scan grads: cumsum, logcumsumexp, cumprod (a blocked parallel scan) and cummax/cummin (a
scatter of the cotangent into the forward's indices).

Every scan runs ``indexing.blocked_scan``: chunks of about sqrt(n) elements reduce in parallel,
each column scans its chunk totals, then every chunk rescans from its carry. One kernel serves
every rank and axis (tensors are viewed as (outer, n[, inner])); ``flatten`` views the tensor as
one row. The schedules are ``annotated_loops`` (as the indexing grads').

Integer data (where Paddle registers it) scans and scatters in its own dtype, wrapping as Paddle's
(sums and products are exact modulo 2^bits in any order: the blocked scan matches Paddle's loop).
"""

from __future__ import annotations

import math

from tvmgrad.dtypes import ALL_INTS, COMPLEX, FLOATS, INTS
from tvmgrad.families.base import OpError
from tvmgrad.families.complex import Complex
from tvmgrad.families.shape import dt_of
from tvmgrad.infer_meta import norm_axis
from tvmgrad.lazy import tirx

from ._extern import i64, tc
from ._plan import check_range, host, split_axis
from tvmgrad.families.index import index_op

from ._scatter import blocked_scan, scan_host, scatter_along

CPLX = FLOATS + COMPLEX
MAXMIN_DTYPES = FLOATS + INTS

PATTERN = "annotated_loops"


def _scan_view(names, axis_attr="axis"):
    """Views of ``names`` as (outer, n[, inner]) around the axis, or (1, numel) with flatten."""
    def view(call, metas, outs):
        op = call.op
        x = call.meta("x")
        flat = bool(call.attrs.get("flatten"))
        numel = math.prod(x.shape)
        for n in names:
            m = call.meta(n)
            if m is not None and m.shape != x.shape and not (flat and m.shape == (numel,)):
                raise OpError(f"{op}: {n} has shape {list(m.shape)}, expected x's "
                              f"{list(x.shape)}{f' or [{numel}] (flatten)' if flat else ''}")
        if flat or x.ndim == 0:
            shape = (1, math.prod(x.shape))
        else:
            axis = norm_axis(int(call.attrs[axis_attr]), x.ndim, axis_attr, op=op, zero_d_axis=True)
            outer, n, inner = split_axis(x.shape, axis)
            shape = (outer, n, inner) if inner != 1 else (outer, n)
        return {n: shape for n in tuple(names) + ("x", "x_grad")}, ()
    return view


def _cols(t, rank=None):
    """Column extents and (col, i) -> coordinates of a scan view (outer, n[, inner]) of its first
    ``rank`` dims (default: all; a complex pair dim left in is one more column)."""
    shape = list(t.shape[:rank])
    return [shape[0], *shape[2:]], lambda col, i: (col[0], i, *col[1:])


def _lowest(dtype):
    return tirx.const(-1.7976931348623157e308 if dtype == "float64" else -3.4028234663852886e38,
                      dtype)


def logaddexp(a, b):
    """log(e^a + e^b), stable: max + log1p(e^-|a-b|); equal arguments (±inf too) give a + log 2;
    NaN propagates."""
    big = tirx.Select(a > b, a, b)
    diff = tirx.abs(a - b)
    ln2 = tirx.const(math.log(2.0), str(a.ty))
    return tirx.Select(a == b, a + ln2, big + tirx.log1p(tirx.exp(-diff)))


# ------------------------------------------------------------------------------------------
# cumsum

@index_op(view=_scan_view(("out_grad",)), code_attrs=("exclusive", "reverse"), pattern=PATTERN,
          host_scalars=scan_host("out_grad"), dtypes=CPLX + ALL_INTS)
def cumsum_grad(x, out_grad, axis, flatten, exclusive, reverse, ctx):
    """x_grad = cumsum(out_grad) in the opposite direction (same exclusive; flatten: over the
    flattened tensor, reshaped back; complex: the (re, im) pair is one more column)."""
    dt = dt_of(out_grad)
    cols, at = _cols(out_grad)
    zero = tirx.const(0, dt.compute)

    def element(L, col, i):
        return (tc(L[0][at(col, i)], dt),)

    def emit(L, O, col, i, s):
        O[0][at(col, i)] = s[0].astype(dt.storage)

    (res,) = blocked_scan(ctx, "x_grad", out_grad.shape[1], cols, [out_grad],
                          [(list(out_grad.shape), dt.storage)], (dt.compute,), (zero,),
                          lambda a, b: (a[0] + b[0],), element, emit,
                          reverse=not reverse, exclusive=exclusive)
    return res


# ------------------------------------------------------------------------------------------
# logcumsumexp

@index_op(view=_scan_view(("out", "out_grad")), code_attrs=("exclusive", "reverse"),
          pattern=PATTERN, host_scalars=scan_host("out_grad"))
def logcumsumexp_grad(x, out, out_grad, axis, flatten, exclusive, reverse, ctx):
    """out = logcumsumexp(x): with the positive and negative parts of out_grad apart (Paddle's
    formula, stable for any magnitude):  x_grad = exp(x + S(log g⁺ − out)) − exp(x + S(log g⁻ −
    out)), S = logcumsumexp in the opposite direction (same exclusive; its empty sum is the
    lowest finite value, as Paddle's), log 0 = −inf."""
    dt = dt_of(out_grad)
    cd = dt.compute
    cols, at = _cols(out_grad)
    low = _lowest(cd)
    ninf = tirx.const(-math.inf, cd)
    zero = tirx.const(0, cd)

    def element(L, col, i):
        c = at(col, i)
        g = tc(L[1][c], dt)
        o = tc(L[0][c], dt)
        pos = tirx.Select(g > zero, tirx.log(g), ninf) - o
        neg = tirx.Select(g < zero, tirx.log(-g), ninf) - o
        return pos, neg

    def emit(L, O, col, i, s):
        c = at(col, i)
        xv = tc(L[2][c], dt)
        O[0][c] = (tirx.exp(s[0] + xv) - tirx.exp(s[1] + xv)).astype(dt.storage)

    (res,) = blocked_scan(ctx, "x_grad", out_grad.shape[1], cols, [out, out_grad, x],
                          [(list(out_grad.shape), dt.storage)], (cd, cd), (low, low),
                          lambda a, b: (logaddexp(a[0], b[0]), logaddexp(a[1], b[1])),
                          element, emit, reverse=not reverse, exclusive=exclusive)
    return res


# ------------------------------------------------------------------------------------------
# cumprod

@index_op(view=_scan_view(("out", "out_grad"), axis_attr="dim"), code_attrs=(), pattern=PATTERN,
          host_scalars=scan_host("out_grad"), dtypes=CPLX + INTS)
def cumprod_grad(x, out, out_grad, dim, ctx):
    """out[j] = Π_{k<=j} x[k]:  x_grad[j] = out[j-1] · R[j] (out[-1] = 1) with R[j] = Σ_{p>=j}
    out_grad[p] · Π_{j<m<=p} x[m] — Paddle's product formula, exact with zeros in x (no division).
    R is the reverse affine recurrence R[j] = out_grad[j] + x[j+1]·R[j+1], scanned in parallel
    as compositions of maps v -> a·v + b. Complex: conj(out), conj(x), as Paddle's."""
    if ctx.pair:
        return _cumprod_complex(x, out, out_grad, ctx)
    dt = dt_of(out_grad)
    cd = dt.compute
    cols, at = _cols(out_grad)
    n = out_grad.shape[1]
    one, zero = tirx.const(1, cd), tirx.const(0, cd)

    def element(L, col, i):
        g = tc(L[1][at(col, i)], dt)
        nxt = tirx.min(i + i64(1), i64(n) - i64(1))
        a = tirx.Select(i + i64(1) < i64(n), tc(L[2][at(col, nxt)], dt), zero)
        return a, g

    def emit(L, O, col, i, s):
        prev = tirx.max(i - i64(1), i64(0))
        before = tirx.Select(i > i64(0), tc(L[0][at(col, prev)], dt), one)
        O[0][at(col, i)] = (before * s[1]).astype(dt.storage)

    # state (A, B): "then v -> A·v + B"; applying (A1, B1) then (A2, B2) is (A1·A2, A2·B1 + B2)
    (res,) = blocked_scan(ctx, "x_grad", n, cols, [out, out_grad, x],
                          [(list(out_grad.shape), dt.storage)], (cd, cd), (one, zero),
                          lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]), element, emit,
                          reverse=True)
    return res


def _cumprod_complex(x, out, out_grad, ctx):
    """cumprod_grad of complex data: x_grad[j] = conj(out[j-1]) · R[j], R[j] = out_grad[j] +
    conj(x[j+1])·R[j+1]; the scan state is the complex map (A, B) as four reals."""
    dt = dt_of(out_grad)
    cd = dt.compute
    rank = len(out_grad.shape) - 1
    cols, at = _cols(out_grad, rank)
    n = out_grad.shape[1]
    one, zero = tirx.const(1, cd), tirx.const(0, cd)

    def ld(buf, idx):
        return Complex(tc(buf[(*idx, i64(0))], dt), tc(buf[(*idx, i64(1))], dt))

    def element(L, col, i):
        g = ld(L[1], at(col, i))
        nxt = tirx.min(i + i64(1), i64(n) - i64(1))
        a = ld(L[2], at(col, nxt)).conj()
        last = i + i64(1) < i64(n)
        return tirx.Select(last, a.re, zero), tirx.Select(last, a.im, zero), g.re, g.im

    def emit(L, O, col, i, s):
        prev = tirx.max(i - i64(1), i64(0))
        o = ld(L[0], at(col, prev)).conj()
        first = i > i64(0)
        before = Complex(tirx.Select(first, o.re, one), tirx.Select(first, o.im, zero))
        v = before * Complex(s[2], s[3])
        c = at(col, i)
        O[0][(*c, i64(0))] = v.re.astype(dt.storage)
        O[0][(*c, i64(1))] = v.im.astype(dt.storage)

    def combine(p, q):
        """(A1, B1) then (A2, B2) = (A1·A2, A2·B1 + B2)"""
        a1, b1, a2, b2 = Complex(p[0], p[1]), Complex(p[2], p[3]), Complex(q[0], q[1]), Complex(q[2], q[3])
        a, b = a1 * a2, a2 * b1 + b2
        return a.re, a.im, b.re, b.im

    (res,) = blocked_scan(ctx, "x_grad", n, cols, [out, out_grad, x],
                          [(list(out_grad.shape), dt.storage)], (cd,) * 4, (one, zero, zero, zero),
                          combine, element, emit, reverse=True, coupled=True)
    return res


# ------------------------------------------------------------------------------------------
# cummax / cummin: the forward's indices say where each output came from

def _cum_maxmin_view(call, metas, outs):
    op = call.op
    x, idx, g = call.meta("x"), call.meta("indices"), call.meta("out_grad")
    for n, m in (("indices", idx), ("out_grad", g)):
        if m.shape != x.shape:
            raise OpError(f"{op}: {n} has shape {list(m.shape)}, expected x's {list(x.shape)}")
    if x.ndim == 0:
        shape = (1, 1)
        m = 1
    else:
        axis = norm_axis(int(call.attrs["axis"]), x.ndim, op=op, zero_d_axis=True)
        outer, m, inner = split_axis(x.shape, axis)
        shape = (outer, m, inner) if inner != 1 else (outer, m)
    check_range(op, "indices", host(call, "indices"), 0, m, f"for an axis of size {m} ")
    return {n: shape for n in ("x", "indices", "out_grad", "x_grad")}, ()


def _cum_maxmin(x, indices, out_grad, ctx):
    dt = dt_of(out_grad)
    return scatter_along(ctx, out_grad, 1, x.shape, dt, "x_grad", lambda L, c: L[1][tuple(c)],
                         [out_grad, indices])


@index_op(view=_cum_maxmin_view, atomic=True, code_attrs=(), float_inputs=("x", "out_grad"),
          dtypes=MAXMIN_DTYPES)
def cummax_grad(x, indices, out_grad, axis, dtype, ctx):
    """x_grad[.., indices[.., j, ..], ..] += out_grad[.., j, ..] along ``axis`` (the forward's
    indices: where each running max came from, the latest on ties); 0 <= indices < n."""
    return _cum_maxmin(x, indices, out_grad, ctx)


@index_op(view=_cum_maxmin_view, atomic=True, code_attrs=(), float_inputs=("x", "out_grad"),
          dtypes=MAXMIN_DTYPES)
def cummin_grad(x, indices, out_grad, axis, dtype, ctx):
    """x_grad[.., indices[.., j, ..], ..] += out_grad[.., j, ..] along ``axis`` (the forward's
    indices: where each running min came from, the latest on ties); 0 <= indices < n."""
    return _cum_maxmin(x, indices, out_grad, ctx)
