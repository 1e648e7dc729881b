"""Matrix-product grads (bmm, addmm, mv, dot, multi_dot, kron, bilinear, cross, trace,
weight_only_linear) on the dense family (tvmgrad/families/dense.py: per-call views, the
grains and other build information as ``ctx.info``) and its tiled contractions (_dense.py).

Semantics follow Paddle 3.3.1 (phi/kernels/impl/*_grad_kernel_impl.h); half types compute and
accumulate in float32 and round once, as Paddle's GPU kernels do.
"""

from __future__ import annotations

import math

from tvmgrad.dtypes import COMPLEX, FLOATS, INTS, dtype as as_dtype, to_compute
from tvmgrad.families.complex import Complex
from tvmgrad.families.dense import View, dense_op
from tvmgrad.infer_meta import is_one, norm_axis
from tvmgrad.lazy import te, tirx

from ._dense import gemm, grain, load, store
from ._math import conj, float_attr
from ._plan import fail

__all__ = ["bmm_grad", "addmm_grad", "dot_grad", "mv_grad", "cross_grad", "trace_grad",
           "kron_grad", "bilinear_grad", "multi_dot_grad", "weight_only_linear_grad",
           "chain_order"]

CPLX = FLOATS + COMPLEX


def cload(ctx, t, idx, dt):
    """An element of placeholder ``t`` in the compute dtype; in a complex kernel (``ctx.pair``)
    the ``Complex`` of its (re, im) pair."""
    if ctx.pair:
        return Complex(load(t, (*idx, 0), dt), load(t, (*idx, 1), dt))
    return load(t, idx, dt)


def part(z, c):
    """The element of value ``z`` at the trailing indices ``c`` of an output: ``z`` itself in a
    real kernel (no trailing index), its re (c = (0,)) or im (c = (1,)) in a complex one."""
    if not c:
        return z
    return tirx.Select(c[0] == 0, z.re, z.im)


# ------------------------------------------------------------------------------------------
# shape checks

def _rank(call, name, ranks):
    meta = call.meta(name)
    if meta.ndim not in ranks:
        fail(call.op, f"input {name!r} must have rank {' or '.join(map(str, ranks))}, got shape "
                       f"{list(meta.shape)}")
    return meta.shape


def _same(call, what, pairs):
    """pairs: [(name, dim, value)...]: every named dim must equal the first."""
    (n0, d0, v0) = pairs[0]
    for n, d, v in pairs[1:]:
        if v != v0:
            fail(call.op, f"{what}: {n}.shape[{d}] = {v} does not match {n0}.shape[{d0}] = {v0}")


# ------------------------------------------------------------------------------------------
# bmm

def _bmm_views(call, outs):
    x = _rank(call, "x", (3,))
    y = _rank(call, "y", (3,))
    g = _rank(call, "out_grad", (3,))
    _same(call, "batch", [("x", 0, x[0]), ("y", 0, y[0]), ("out_grad", 0, g[0])])
    _same(call, "contracted dim", [("x", 2, x[2]), ("y", 1, y[1])])
    _same(call, "rows", [("x", 1, x[1]), ("out_grad", 1, g[1])])
    _same(call, "columns", [("y", 2, y[2]), ("out_grad", 2, g[2])])
    return View({"x": ("B", "M", "K"), "y": ("B", "K", "N"), "out_grad": ("B", "M", "N"),
                 "x_grad": ("B", "M", "K"), "y_grad": ("B", "K", "N")},
                {"B": x[0], "M": x[1], "K": x[2], "N": y[2]},
                (grain(x[1]), grain(x[2]), grain(y[2])))


@dense_op(views=_bmm_views)
def bmm_grad(x, y, out_grad, ctx):
    """x_grad = out_grad · yᵀ, y_grad = xᵀ · out_grad (per batch)."""
    dt = as_dtype(x.dtype)
    B, M, K = x.shape
    N = y.shape[2]
    gm, gk, gn = ctx.info
    out = store(dt)
    cx = gemm("bmm_dx", (B,), M, K, N,
              lambda bi, m, n: load(out_grad, (*bi, m, n), dt),
              lambda bi, k, n: load(y, (*bi, k, n), dt), dt, gm, gk)
    cy = gemm("bmm_dy", (B,), K, N, M,
              lambda bi, k, m: load(x, (*bi, m, k), dt),
              lambda bi, n, m: load(out_grad, (*bi, m, n), dt), dt, gk, gn)
    dx = te.compute((B, M, K), lambda b, m, k: out(cx[b, m, k]), name="x_grad")
    dy = te.compute((B, K, N), lambda b, k, n: out(cy[b, k, n]), name="y_grad")
    return dx, dy


def _mm(name, A, ta, B, tb, M, N, K, dt, gm, gn, batch=()):
    """op(A) @ op(B) (op = transpose when t*) over [*batch, M, K] x [*batch, K, N] operands given
    as index functions / tensors; -> the contraction (padded; crop with the result's shape)."""
    def at(t, trans, bi, r, c):
        idx = (*bi, c, r) if trans else (*bi, r, c)
        return t(*idx) if callable(t) and not hasattr(t, "shape") else t[idx]
    return gemm(name, batch, M, N, K,
                lambda bi, m, k: at(A, ta, bi, m, k),
                lambda bi, n, k: at(B, tb, bi, k, n), dt, gm, gn)


def _crop(name, c, shape, f=None):
    f = f or (lambda v: v)
    return te.compute(shape, lambda *i: f(c[i]), name=name)


# ------------------------------------------------------------------------------------------
# addmm

def _addmm_views(call, outs):
    inp = _rank(call, "input", (1, 2))
    x = _rank(call, "x", (2,))
    y = _rank(call, "y", (2,))
    g = _rank(call, "out_grad", (2,))
    _same(call, "contracted dim", [("x", 1, x[1]), ("y", 0, y[0])])
    _same(call, "rows", [("x", 0, x[0]), ("out_grad", 0, g[0])])
    _same(call, "columns", [("y", 1, y[1]), ("out_grad", 1, g[1])])
    i2 = (1, *inp) if len(inp) == 1 else inp
    for d, (have, want) in enumerate(zip(i2, g)):
        if have not in (1, want):
            fail(call.op, f"input 'input' of shape {list(inp)} does not broadcast to out_grad "
                           f"{list(g)}")
    rows = "M" if i2[0] != 1 else 1
    cols = "N" if i2[1] != 1 else 1
    tpl = (rows, cols)
    return View({"input": tpl, "input_grad": tpl, "x": ("M", "K"), "x_grad": ("M", "K"),
                 "y": ("K", "N"), "y_grad": ("K", "N"), "out_grad": ("M", "N")},
                {"M": x[0], "K": x[1], "N": y[1]}, (grain(x[0]), grain(x[1]), grain(y[1])))


@dense_op(views=_addmm_views)
def addmm_grad(input, x, y, out_grad, alpha, beta, ctx):
    """input_grad = beta · out_grad summed to input's (broadcast) shape, x_grad = alpha ·
    out_grad · yᵀ, y_grad = alpha · xᵀ · out_grad (alpha, beta as C++ floats)."""
    dt = as_dtype(x.dtype)
    acc = dt.compute
    M, K = x.shape
    N = y.shape[1]
    gm, gk, gn = ctx.info
    out = store(dt)
    a, b = float_attr(alpha, acc), float_attr(beta, acc)
    g = lambda *i: load(out_grad, i, dt)  # noqa: E731
    cx = _mm("addmm_dx", g, False, lambda *i: load(y, i, dt), True, M, K, N, dt, gm, gk)
    cy = _mm("addmm_dy", lambda *i: load(x, i, dt), True, g, False, K, N, M, dt, gk, gn)
    dx = _crop("x_grad", cx, (M, K), lambda v: out(a * v))
    dy = _crop("y_grad", cy, (K, N), lambda v: out(a * v))
    rows, cols = input.shape
    red = []
    if is_one(rows):
        red.append(te.reduce_axis((0, M), name="addmm_r"))
    if is_one(cols):
        red.append(te.reduce_axis((0, N), name="addmm_c"))

    def summed(i, j):
        ii = red[0] if is_one(rows) else i
        jj = red[-1] if is_one(cols) else j
        v = load(out_grad, (ii, jj), dt)
        return te.sum(v, axis=red) if red else v
    s = te.compute(input.shape, summed, name="addmm_sum")
    di = te.compute(input.shape, lambda i, j: out(b * s[i, j]), name="input_grad")
    return di, dx, dy


# ------------------------------------------------------------------------------------------
# dot, mv, cross, trace, kron

def _dot_views(call, outs):
    x = _rank(call, "x", (1, 2))
    y = _rank(call, "y", (1, 2))
    g = call.meta("out_grad").shape
    if x != y:
        fail(call.op, f"inputs 'x' {list(x)} and 'y' {list(y)} must have the same shape")
    b = x[0] if len(x) == 2 else 1
    if math.prod(g) != b or (len(x) == 1 and len(g) > 1) or (len(x) == 2 and g not in ((b,), (b, 1))):
        fail(call.op, f"input 'out_grad' has shape {list(g)}, expected "
                       f"{'[] or [1]' if len(x) == 1 else f'[{b}] or [{b}, 1]'}")
    tpl = ("B", "N")
    return View({"x": tpl, "y": tpl, "x_grad": tpl, "y_grad": tpl, "out_grad": ("B", 1)},
                {"B": b, "N": x[-1]})


@dense_op(views=_dot_views, pattern="generic", dtypes=CPLX + INTS)
def dot_grad(x, y, out_grad, ctx):
    """x_grad = out_grad · conj(y), y_grad = out_grad · conj(x) (per row for 2-D inputs; conj
    only for complex, as Paddle's)."""
    dt = as_dtype(x.dtype)
    out = store(dt)
    dx = te.compute(x.shape, lambda b, n, *c: out(part(cload(ctx, out_grad, (b, 0), dt)
                                                       * conj(cload(ctx, y, (b, n), dt)), c)),
                    name="x_grad")
    dy = te.compute(x.shape, lambda b, n, *c: out(part(cload(ctx, out_grad, (b, 0), dt)
                                                       * conj(cload(ctx, x, (b, n), dt)), c)),
                    name="y_grad")
    return dx, dy


def _mv_views(call, outs):
    x = _rank(call, "x", (2,))
    v = _rank(call, "vec", (1,))
    g = _rank(call, "out_grad", (1,))
    _same(call, "columns", [("x", 1, x[1]), ("vec", 0, v[0])])
    _same(call, "rows", [("x", 0, x[0]), ("out_grad", 0, g[0])])
    return View({"x": ("M", "N"), "x_grad": ("M", "N"), "vec": ("N",), "vec_grad": ("N",),
                 "out_grad": ("M",)}, {"M": x[0], "N": x[1]})


@dense_op(views=_mv_views, pattern="generic")
def mv_grad(x, vec, out_grad):
    """x_grad = out_grad ⊗ vec, vec_grad = xᵀ · out_grad."""
    dt = as_dtype(x.dtype)
    out = store(dt)
    M, N = x.shape
    dx = te.compute((M, N), lambda m, n: out(load(out_grad, (m,), dt) * load(vec, (n,), dt)),
                    name="x_grad")
    r = te.reduce_axis((0, M), name="mv_m")
    s = te.compute((N,), lambda n: te.sum(load(x, (r, n), dt) * load(out_grad, (r,), dt), axis=r),
                   name="mv_sum")
    dv = te.compute((N,), lambda n: out(s[n]), name="vec_grad")
    return dx, dv


def _cross_axis(call):
    shape = call.meta("x").shape
    axis = call.attrs["axis"]
    rank = len(shape)
    if axis == 9:        # Paddle's DDim::kMaxRank: the first dim of size 3
        found = [i for i, d in enumerate(shape) if d == 3]
        if not found:
            fail(call.op, f"no dimension of x {list(shape)} has size 3 (axis 9 = the first "
                           f"such dimension)")
        return found[0]
    axis = norm_axis(axis, rank, of="x", op=call.op)
    if shape[axis] != 3:
        fail(call.op, f"x.shape[{axis}] must be 3, got {shape[axis]} (x {list(shape)})")
    return axis


def _cross_views(call, outs):
    x, y, g = (call.meta(n).shape for n in ("x", "y", "out_grad"))
    if not x == y == g:
        # (Paddle 3.3.1 corrupts memory when y broadcasts: no broadcasting here)
        fail(call.op, f"x {list(x)}, y {list(y)} and out_grad {list(g)} must have the same shape")
    axis = _cross_axis(call)
    tpl = ("P", 3, "Q")
    return View({n: tpl for n in ("x", "y", "out_grad", "x_grad", "y_grad")},
                {"P": math.prod(x[:axis]), "Q": math.prod(x[axis + 1:])})


@dense_op(views=_cross_views, pattern="generic", dtypes=CPLX + INTS)
def cross_grad(x, y, out_grad, axis, ctx):
    """x_grad[j] = g[j+2]·y[j+1] − g[j+1]·y[j+2], y_grad[j] = g[j+1]·x[j+2] − g[j+2]·x[j+1]
    (indices mod 3 along the axis; Paddle's order of operations; complex: conj(y), conj(x))."""
    dt = as_dtype(x.dtype)
    out = store(dt)

    def at(t, p, j, q):
        return cload(ctx, t, (p, tirx.floormod(j, 3), q), dt)

    def other(t, p, j, q):
        return conj(at(t, p, j, q))

    dx = te.compute(x.shape, lambda p, j, q, *c: out(part(
        at(out_grad, p, j + 2, q) * other(y, p, j + 1, q)
        - at(out_grad, p, j + 1, q) * other(y, p, j + 2, q), c)), name="x_grad")
    dy = te.compute(x.shape, lambda p, j, q, *c: out(part(
        at(out_grad, p, j + 1, q) * other(x, p, j + 2, q)
        - at(out_grad, p, j + 2, q) * other(x, p, j + 1, q), c)), name="y_grad")
    return dx, dy


def _trace_views(call, outs):
    x = call.meta("x").shape
    g = call.meta("out_grad").shape
    rank = len(x)
    if rank < 2:
        fail(call.op, f"input 'x' must have rank >= 2, got shape {list(x)}")
    a1, a2 = call.attrs["axis1"], call.attrs["axis2"]
    for name, a in (("axis1", a1), ("axis2", a2)):
        if not -rank <= a < rank:
            fail(call.op, f"attribute {name!r} = {a} is out of range for 'x' of rank {rank}")
    a1, a2 = a1 % rank, a2 % rank
    if a1 == a2:
        fail(call.op, f"attributes 'axis1' and 'axis2' must differ, both are {a1}")
    rest = tuple(d for i, d in enumerate(x) if i not in (a1, a2))
    if tuple(g) != rest and not (rest == () and tuple(g) in ((), (1,))):
        fail(call.op, f"input 'out_grad' has shape {list(g)}, expected {list(rest)} (x "
                       f"{list(x)} without axes {a1} and {a2})")
    return View({"out_grad": tuple(f"r{i}" for i in range(len(rest))) or (1,)},
                {f"r{i}": d for i, d in enumerate(rest)}, (a1, a2))


@dense_op(views=_trace_views, pattern="generic", dtypes=CPLX + INTS)
def trace_grad(x, out_grad, offset, axis1, axis2, ctx):
    """x_grad = out_grad on the diagonal (offset) of axes (axis1, axis2), 0 elsewhere (a complex
    pair moves as it is)."""
    dt = as_dtype(out_grad.dtype)
    a1, a2 = ctx.info
    rank = len(x.shape) - ctx.pair

    def f(*i):
        rest = [i[k] for k in range(rank) if k not in (a1, a2)] or [0]
        on = (i[a2] - i[a1]) == offset
        return te.if_then_else(on, out_grad[(*rest, *i[rank:])], tirx.const(0, dt.storage))
    return te.compute(x.shape, f, name="x_grad")


def _kron_views(call, outs):
    x, y, g = (call.meta(n).shape for n in ("x", "y", "out_grad"))
    r = max(len(x), len(y))
    xp, yp = (1,) * (r - len(x)) + tuple(x), (1,) * (r - len(y)) + tuple(y)
    want = tuple(a * b for a, b in zip(xp, yp))
    if tuple(g) != want:
        fail(call.op, f"input 'out_grad' has shape {list(g)}, expected {list(want)} (kron of x "
                       f"{list(x)} and y {list(y)})")
    xt = tuple(f"x{i}" for i in range(r))
    yt = tuple(f"y{i}" for i in range(r))
    gt = tuple(v for pair in zip(xt, yt) for v in pair)
    sizes = {f"x{i}": xp[i] for i in range(r)}
    sizes.update({f"y{i}": yp[i] for i in range(r)})
    return View({"x": xt, "x_grad": xt, "y": yt, "y_grad": yt, "out_grad": gt}, sizes)


@dense_op(views=_kron_views, pattern="generic", dtypes=CPLX + INTS)
def kron_grad(x, y, out_grad, ctx):
    """out[i·|y| + j] = x[i]·y[j] per dim (ranks aligned with leading 1s): x_grad[i] = Σ_j
    out_grad[i, j]·y[j], y_grad[j] = Σ_i out_grad[i, j]·x[i] (out_grad viewed as (i0, j0, i1,
    j1, ...); complex: conj(y), conj(x), as Paddle's)."""
    dt = as_dtype(x.dtype)
    out = store(dt)
    r = len(x.shape) - ctx.pair
    rj = [te.reduce_axis((0, y.shape[d]), name=f"kron_j{d}") for d in range(r)]
    ri = [te.reduce_axis((0, x.shape[d]), name=f"kron_i{d}") for d in range(r)]

    def gat(i, j):
        return cload(ctx, out_grad, tuple(v for ij in zip(i, j) for v in ij), dt)
    sx = te.compute(x.shape, lambda *i: te.sum(part(gat(i[:r], rj) * conj(cload(ctx, y, rj, dt)), i[r:]),
                                               axis=rj), name="kron_sx")
    sy = te.compute(y.shape, lambda *j: te.sum(part(gat(ri, j[:r]) * conj(cload(ctx, x, ri, dt)), j[r:]),
                                               axis=ri), name="kron_sy")
    return (te.compute(x.shape, lambda *i: out(sx[i]), name="x_grad"),
            te.compute(y.shape, lambda *j: out(sy[j]), name="y_grad"))


# ------------------------------------------------------------------------------------------
# bilinear

def _bilinear_views(call, outs):
    x = _rank(call, "x", (2,))
    y = _rank(call, "y", (2,))
    w = _rank(call, "weight", (3,))
    g = _rank(call, "out_grad", (2,))
    _same(call, "batch", [("x", 0, x[0]), ("y", 0, y[0]), ("out_grad", 0, g[0])])
    _same(call, "x features", [("x", 1, x[1]), ("weight", 1, w[1])])
    _same(call, "y features", [("y", 1, y[1]), ("weight", 2, w[2])])
    _same(call, "out features", [("weight", 0, w[0]), ("out_grad", 1, g[1])])
    return View({"x": ("B", "I"), "x_grad": ("B", "I"), "y": ("B", "J"), "y_grad": ("B", "J"),
                 "weight": ("O", "I", "J"), "weight_grad": ("OI", "J"),
                 "out_grad": ("B", "O"), "bias_grad": (1, "O")},
                {"B": x[0], "I": x[1], "J": y[1], "O": w[0], "OI": w[0] * w[1]},
                (grain(x[0]), grain(x[1]), grain(y[1]), grain(w[0] * x[1])))


@dense_op(views=_bilinear_views)
def bilinear_grad(x, y, weight, out_grad, ctx):
    """out[b,o] = Σ_ij x[b,i]·W[o,i,j]·y[b,j] + bias[o]:
    x_grad[b,i] = Σ_(o,j) (g[b,o]·y[b,j])·W[o,i,j]; y_grad[b,j] = Σ_(o,i) (g[b,o]·x[b,i])·W[o,i,j];
    W_grad[(o,i),j] = Σ_b (g[b,o]·x[b,i])·y[b,j]; bias_grad[0,o] = Σ_b g[b,o] — three GEMMs whose
    broadcast operand is an outer product made in its source."""
    dt = as_dtype(x.dtype)
    out = store(dt)
    B, I = x.shape
    J = y.shape[1]
    O = weight.shape[0]
    gb, gi, gj, goi = ctx.info
    g = lambda b, o: load(out_grad, (b, o), dt)  # noqa: E731
    X = lambda b, i: load(x, (b, i), dt)  # noqa: E731
    Y = lambda b, j: load(y, (b, j), dt)  # noqa: E731
    W = lambda o, i, j: load(weight, (o, i, j), dt)  # noqa: E731
    fd = tirx.floordiv
    fm = tirx.floormod
    cx = gemm("bil_dx", (), B, I, O * J,
              lambda bi, b, k: g(b, fd(k, J)) * Y(b, fm(k, J)),
              lambda bi, i, k: W(fd(k, J), i, fm(k, J)), dt, gb, gi, exact=False)
    cy = gemm("bil_dy", (), B, J, O * I,
              lambda bi, b, k: g(b, fd(k, I)) * X(b, fm(k, I)),
              lambda bi, j, k: W(fd(k, I), fm(k, I), j), dt, gb, gj, exact=False)
    cw = gemm("bil_dw", (), O * I, J, B,
              lambda bi, oi, b: g(b, fd(oi, I)) * X(b, fm(oi, I)),
              lambda bi, j, b: Y(b, j), dt, goi, gj, exact=False)
    dx = _crop("x_grad", cx, (B, I), out)
    dy = _crop("y_grad", cy, (B, J), out)
    dw = _crop("weight_grad", cw, (O * I, J), out)     # weight_grad viewed as [O·I, J]
    rb = te.reduce_axis((0, B), name="bil_b")
    sb = te.compute((1, O), lambda z, o: te.sum(g(rb, o), axis=rb), name="bil_sum")
    db = te.compute((1, O), lambda z, o: out(sb[z, o]), name="bias_grad")
    return dx, dy, dw, db


# ------------------------------------------------------------------------------------------
# multi_dot

def chain_order(dims):
    """Matrix-chain DP: the cheapest parenthesisation of A_0 ... A_{n-1} (A_i is dims[i] x
    dims[i+1]) as a nested tuple of indices."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            best = None
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if best is None or c < best:
                    best, split[i][j] = c, k
            cost[i][j] = best

    def tree(i, j):
        if i == j:
            return i
        k = split[i][j]
        return (tree(i, k), tree(k + 1, j))
    return tree(0, n - 1)


def _multi_dot_views(call, outs):
    xs = call.meta("x")
    n = len(xs)
    if n < 2:
        fail(call.op, f"input 'x' must hold at least 2 tensors, got {n}")
    shapes = [m.shape for m in xs]
    for i, s in enumerate(shapes):
        ok = (len(s) == 2) or (len(s) == 1 and i in (0, n - 1))
        if not ok:
            fail(call.op, f"input 'x[{i}]' must be 2-D (1-D allowed first and last), got shape "
                           f"{list(s)}")
    first = (1, *shapes[0]) if len(shapes[0]) == 1 else tuple(shapes[0])
    last = (*shapes[-1], 1) if len(shapes[-1]) == 1 else tuple(shapes[-1])
    mats = [first] + [tuple(s) for s in shapes[1:-1]] + [last]
    for i in range(n - 1):
        if mats[i][1] != mats[i + 1][0]:
            fail(call.op, f"x[{i}] {list(shapes[i])} and x[{i + 1}] {list(shapes[i + 1])} cannot "
                           f"be multiplied")
    dims = [mats[0][0]] + [m[1] for m in mats]
    g = call.meta("out_grad").shape
    want = tuple(d for d, drop in ((dims[0], len(shapes[0]) == 1), (dims[-1], len(shapes[-1]) == 1))
                 if not drop)
    if tuple(g) != want:
        fail(call.op, f"input 'out_grad' has shape {list(g)}, expected {list(want)} (the "
                       f"product of x[0] {list(shapes[0])} ... x[{n - 1}] {list(shapes[-1])})")
    names = [f"d{i}" for i in range(n + 1)]
    tpls = [(names[i], names[i + 1]) for i in range(n)]
    if len(shapes[0]) == 1:
        names[0] = 1
        tpls[0] = (1, names[1])
    if len(shapes[-1]) == 1:
        names[n] = 1
        tpls[-1] = (names[n - 1], 1)
    sizes = {f"d{i}": d for i, d in enumerate(dims)}
    return View({"x": tpls, "x_grad": tpls, "out_grad": (names[0], names[n])}, sizes,
                (chain_order(dims), tuple(grain(d) for d in dims)))


@dense_op(views=_multi_dot_views)
def multi_dot_grad(x, out_grad, ctx):
    """Backpropagation through the cheapest parenthesisation of x[0]···x[n-1] (matrix-chain
    order on this call's sizes): the inner products are formed, then for a node T = L·R with
    upstream grad D: dL = D·Rᵀ, dR = Lᵀ·D. 1-D first/last inputs are 1 x K / K x 1 views."""
    dt = as_dtype(out_grad.dtype)
    out = store(dt)
    tree, grains = ctx.info
    n = len(x)
    dims = [x[0].shape[0]] + [t.shape[1] for t in x]
    ld = lambda t: (lambda *i: load(t, i, dt))  # noqa: E731
    count = [0]

    def name(tag):
        count[0] += 1
        return f"md_{tag}{count[0]}"

    memo = {}

    def forward(node):
        """(accessor, i, j) of the product of node (rows dims[i], cols dims[j+1])."""
        if isinstance(node, int):
            return ld(x[node]), node, node
        if node not in memo:
            (a, i, k), (b, _, j) = forward(node[0]), forward(node[1])
            c = _mm(name("f"), a, False, b, False, dims[i], dims[j + 1], dims[k + 1], dt,
                    grains[i], grains[j + 1])
            t = _crop(name("p"), c, (dims[i], dims[j + 1]))
            memo[node] = ((lambda r, s: t[r, s]), i, j)
        return memo[node]

    grads = [None] * n

    def backward(node, d):
        if isinstance(node, int):
            grads[node] = d
            return
        L, R = node
        (la, i, k), (ra, _, j) = forward(L), forward(R)
        # dL = D · Rᵀ (dims[i] x dims[k+1]), dR = Lᵀ · D (dims[k+1] x dims[j+1])
        cl = _mm(name("l"), d, False, ra, True, dims[i], dims[k + 1], dims[j + 1], dt,
                 grains[i], grains[k + 1])
        cr = _mm(name("r"), la, True, d, False, dims[k + 1], dims[j + 1], dims[i], dt,
                 grains[k + 1], grains[j + 1])
        tl = _crop(name("dl"), cl, (dims[i], dims[k + 1]))
        tr = _crop(name("dr"), cr, (dims[k + 1], dims[j + 1]))
        backward(L, lambda r, s: tl[r, s])
        backward(R, lambda r, s: tr[r, s])

    backward(tree, ld(out_grad))

    def result(i):
        return te.compute(x[i].shape, lambda r, s: out(grads[i](r, s)), name=f"x_grad{i}")
    return [result(i) for i in range(n)]


# ------------------------------------------------------------------------------------------
# weight_only_linear

def _wol_views(call, outs):
    op = call.op
    wd = call.attrs["weight_dtype"]
    if wd not in ("int8", "int4"):
        fail(op, f"attribute 'weight_dtype' must be 'int8' or 'int4', got {wd!r}")
    x = call.meta("x").shape
    w = _rank(call, "weight", (2,))
    s = _rank(call, "weight_scale", (1,))
    g = call.meta("out_grad").shape
    n = s[0]
    k = w[1]
    rows = n if wd == "int8" else n // 2
    if w[0] != rows or (wd == "int4" and n % 2):
        fail(op, f"input 'weight' has shape {list(w)}, expected [{rows}, {k}] for {n} "
                  f"{wd} output channels (weight_scale has {n})")
    if n % 16 or k % 64:
        fail(op, f"the arch {call.attrs['arch']} weight layout needs out_features % 16 == 0 and "
                  f"in_features % 64 == 0, got {n} and {k} (weight {list(w)})")
    if not x or x[-1] != k:
        fail(op, f"input 'x' has shape {list(x)}, its last dim must be in_features {k} (of "
                  f"'weight' {list(w)})")
    if not g or g[-1] != n or tuple(g[:-1]) != tuple(x[:-1]):
        fail(op, f"input 'out_grad' has shape {list(g)}, expected {list(x[:-1]) + [n]} (the "
                  f"leading dims of 'x' {list(x)}, out_features of 'weight_scale')")
    b = call.meta("bias")
    if b is not None and tuple(b.shape) != (n,):
        fail(op, f"input 'bias' has shape {list(b.shape)}, expected [{n}] (out_features of "
                  f"'weight_scale')")
    if call.meta("weight").dtype.name != "int8":
        raise TypeError(f"{op}: input 'weight' must be int8 (packed {wd}), got "
                        f"{call.meta('weight').dtype.name}")
    m = math.prod(g[:-1])
    return View({"x": ("M", "K"), "x_grad": ("M", "K"), "out_grad": ("M", "N"),
                 "weight": ("WB",), "weight_scale": ("N",), "bias": ("N",)},
                {"M": m, "K": k, "N": n, "WB": math.prod(w)},
                (8 if wd == "int8" else 4, grain(m), grain(k)))


def _wol_q(ctx, weight, j, i, K, bits):
    """The quantized value of logical weight element (out j, in i) from Paddle's arch-80/86
    layout (phi/kernels/impl/weight_quantize_kernel_impl.h: permute_B_rows_for_mixed_gemm,
    subbyte_transpose, interleave_column_major_tensor, add_bias_and_interleave_*, inverted)."""
    fd, fm = tirx.floordiv, tirx.floormod
    E = 32 // bits                     # elements per 32-bit word
    I = 2 if bits == 8 else 4          # columns interleaved together
    VT = 64 // E                       # words per 64-row tile
    R = 16 if bits == 8 else 32        # rows per permuted block
    s = fm(i, R)
    t = (i - s) + (4 if bits == 8 else 8) * fm(fd(s, 2), 4) + 2 * fd(s, 8) + fm(s, 2)
    vr, e = fd(t, E), fm(t, E)
    word = fd(j, I) * (fd(K, E) * I) + I * fd(vr, VT) * VT + VT * fm(j, I) + fm(vr, VT)
    if bits == 8:
        pos = word * 4 + e + tirx.Select(e == 1, ctx.const(1), ctx.const(0)) \
            - tirx.Select(e == 2, ctx.const(1), ctx.const(0))
        u = tirx.bitwise_and(weight[pos].astype("int32"), tirx.const(255, "int32"))
        return u - 128
    d = fm(e, 2) * 4 + fd(e, 2)
    u = tirx.bitwise_and(weight[word * 4 + fd(d, 2)].astype("int32"), tirx.const(255, "int32"))
    nib = tirx.bitwise_and(tirx.shift_right(u, (4 * fm(d, 2)).astype("int32")),
                           tirx.const(15, "int32"))
    return nib - 8


def _round_to(v, dt):
    """v (float32) rounded to a half storage type and back (Paddle dequantises into T)."""
    if dt.name == "float16":
        return v.astype("float16").astype("float32")
    if dt.name == "bfloat16":     # round to nearest even on the bits (exact on every target)
        bits = tirx.reinterpret("uint32", v)
        lsb = tirx.bitwise_and(tirx.shift_right(bits, tirx.const(16, "uint32")),
                               tirx.const(1, "uint32"))
        bits = tirx.bitwise_and(bits + tirx.const(0x7FFF, "uint32") + lsb,
                                tirx.const(0xFFFF0000, "uint32"))
        return tirx.reinterpret("float32", bits)
    return v


@dense_op(views=_wol_views, float_inputs=("x", "bias", "weight_scale", "out_grad"),
          index_dtypes=("int8",))
def weight_only_linear_grad(x, weight, bias, weight_scale, out_grad, weight_dtype, arch,
                            group_size, ctx):
    """x_grad = out_grad · W with W[j, i] = T(q[j, i] · scale[j]), q read from Paddle's
    int8 / packed-int4 CUTLASS layout for arch 80/86 and dequantised inside the kernel (in
    the source of the GEMM's streamed operand)."""
    dt = as_dtype(out_grad.dtype)
    acc = dt.compute
    bits, gm, gk = ctx.info
    M, N = out_grad.shape
    K = x.shape[1]

    def w(i, j):          # (in i, out j)
        q = _wol_q(ctx, weight, j, i, K, bits).astype("float32")
        v = q * to_compute(weight_scale[j], dt).astype("float32")
        return _round_to(v, dt).astype(acc)

    c = gemm("wol", (), M, K, N, lambda bi, m, j: load(out_grad, (m, j), dt),
             lambda bi, i, j: w(i, j), dt, gm, gk)
    return _crop("x_grad", c, (M, K), store(dt))
