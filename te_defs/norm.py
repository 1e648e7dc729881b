"""Normalisation and norm grads: layer/group/instance/RMS norm, p-norms, renorm, spectral norm.

The reduction grads are ``@view_op`` builders (tvmgrad/families/view.py): their arrays are viewed
with shapes chosen per call, e.g. ``(rows, cols)`` for a layer norm, so that one kernel serves
every rank and axis.

Semantics follow Paddle 3.3.1 (``phi/kernels/cpu/*``, ``gpu/*``); half types compute in float32
and accumulate in float32 (as Paddle's GPU kernels do); float64 computes in float64.
"""

from __future__ import annotations

import math

import numpy as np

from tvmgrad.lazy import te, tirx

from tvmgrad.dtypes import FLOATS, HALF, dtype as as_dtype
from tvmgrad.families import OpError, pointwise
from tvmgrad.families.view import view_op
from tvmgrad.infer_meta import norm_axis, same_dim

from ._math import const, float_attr, where
from ._plan import split_axis
from ._reduction import cdtype, ld, need_same_shape, store

# ------------------------------------------------------------------------------------------
# helpers of the norm grads

def out_storage(dtype_name: str) -> str:
    return as_dtype(dtype_name).storage


def prod(dims):
    r = tirx.const(1, "int64")
    for d in dims:
        r = r * d
    return r


def check_param_dtype(op, call, names, x="x"):
    """Norm parameters: the data's dtype, or float32 for half data."""
    xm = call.meta(x)
    for n in names:
        m = call.meta(n)
        if m is None:
            continue
        ok = m.dtype == xm.dtype or (xm.dtype.name in HALF and m.dtype.name == "float32")
        if not ok:
            allowed = f"{xm.dtype.name} or float32" if xm.dtype.name in HALF else xm.dtype.name
            raise TypeError(f"{op}: input {n!r} has dtype {m.dtype.name}, expected {allowed} "
                            f"(the dtype of {x!r} is {xm.dtype.name})")


def _sum2():
    return te.comm_reducer(lambda a, b: (a[0] + b[0], a[1] + b[1]),
                           lambda t0, t1: (tirx.const(0, t0), tirx.const(0, t1)), name="sum2")


def colsum(name, shape, body, axes_extents, acc, out_dtype):
    """A column reduction output: out[i...] = Σ over ``axes_extents`` of body(i..., r...), accumulated
    in ``acc``, stored in ``out_dtype`` (a separate cast block when they differ)."""
    raxes = [te.reduce_axis((0, e), name=f"{name}_r{j}") for j, e in enumerate(axes_extents)]
    red = te.compute(shape, lambda *i: te.sum(body(*i, *raxes).astype(acc), axis=raxes),
                     name=f"cs_{name}", attrs={"rows.role": "col_sum"})
    if acc == out_dtype:
        return red
    return te.compute(shape, lambda *i: red(*i).astype(out_dtype), name=f"cc_{name}",
                      attrs={"rows.role": "col_cast"})


# ------------------------------------------------------------------------------------------
# layer_norm

def _rows_cols(call, cols_of, rows_of):
    """(rows, cols) of x split at ``begin_norm_axis`` (checked), and the element counts of the
    per-column (``cols_of``) and per-row (``rows_of``) parameters present (ValueError otherwise)."""
    shape = call.meta("x").shape
    b = call.attrs["begin_norm_axis"]
    if not 0 <= b < max(len(shape), 1):
        raise OpError(f"{call.op}: attribute 'begin_norm_axis' = {b} must lie in [0, {len(shape)}) "
                      f"for x of rank {len(shape)}")
    rows, cols = math.prod(shape[:b]), math.prod(shape[b:])
    for names, size, what in ((cols_of, cols, "the normalised size"), (rows_of, rows, "one per row")):
        for n in names:
            m = call.meta(n)
            if m is not None and not same_dim(math.prod(m.shape), size):
                raise OpError(f"{call.op}: input {n!r} has shape {list(m.shape)}, expected {size} "
                              f"elements ({what}: x is {list(shape)} with begin_norm_axis={b})")
    return rows, cols


def _ln_views(call, outs):
    rows, cols = _rows_cols(call, cols_of=("scale", "bias"), rows_of=("mean", "variance"))
    need_same_shape(call.op, call, "x", "out_grad")
    check_param_dtype(call.op, call, ("scale", "bias", "mean", "variance"))
    rc = ("rows", "cols")
    return ({"x": rc, "out_grad": rc, "x_grad": rc, "scale": ("cols",), "bias": ("cols",),
             "mean": ("rows",), "variance": ("rows",), "scale_grad": ("cols",),
             "bias_grad": ("cols",)}, {"rows": rows, "cols": cols})


@view_op(views=_ln_views, float_inputs=("x", "out_grad"), index_dtypes=FLOATS,
         pattern="red_rows")
def layer_norm_grad(x, scale, bias, mean, variance, out_grad, epsilon, begin_norm_axis):
    """x viewed as (rows, cols) at begin_norm_axis; x̂ = (x − mean)/√(var + ε), t = out_grad·scale:
    x_grad = (t − mean_row(t) − x̂·mean_row(t·x̂))/√(var + ε);
    scale_grad = Σ_rows x̂·out_grad, bias_grad = Σ_rows out_grad (absent without scale / bias).
    ε is a float32 in Paddle's kernels. The two row sums share one pass (a tuple reduction)."""
    dt = cdtype(x)
    eps = float_attr(epsilon)
    rows, cols = x.shape
    one = const(1.0, dt)

    rs = te.compute((rows,), lambda i: one / tirx.sqrt(ld(variance, i, to=dt) + eps), name="rv_rstd",
                    attrs={"rows.role": "scalar"})

    def rstd(i):
        return rs[i]

    def xhat(i, j):
        return (ld(x, i, j) - ld(mean, i, to=dt)) * rstd(i)

    def xhat_col(i, j):     # the column reductions recompute 1/√(var + ε) (rv_rstd is per row),
        # a factor constant along a row (LLVM hoists it; a division would stay per element)
        return (ld(x, i, j) - ld(mean, i, to=dt)) * (one / tirx.sqrt(ld(variance, i, to=dt) + eps))

    def t(i, j):
        g = ld(out_grad, i, j)
        return g * ld(scale, j, to=dt) if scale is not None else g

    k = te.reduce_axis((0, cols), name="k")
    s1, s2 = te.compute((rows,), lambda i: _sum2()((t(i, k), t(i, k) * xhat(i, k)), axis=k),
                        name="rs_sums", attrs={"rows.role": "reduce"})
    inv_n = one / cols.astype(dt)
    dx = te.compute((rows, cols), lambda i, j: store(
        x, (t(i, j) - s1[i] * inv_n - xhat(i, j) * (s2[i] * inv_n)) * rstd(i)), name="ro_x_grad",
        attrs={"rows.role": "output"})
    dscale = dbias = None
    if scale is not None:
        dscale = colsum("scale_grad", (cols,), lambda j, r: xhat_col(r, j) * ld(out_grad, r, j),
                        (rows,), dt, out_storage(str(scale.dtype)))
    if bias is not None:
        dbias = colsum("bias_grad", (cols,), lambda j, r: ld(out_grad, r, j), (rows,), dt,
                       out_storage(str(bias.dtype)))
    return dx, dscale, dbias


# ------------------------------------------------------------------------------------------
# rms_norm (the fused RMSNorm of the YAML: optional bias/residual added before the norm)

def _rms_views(call, outs):
    op = call.op
    if call.attrs["quant_scale"] > 0:
        raise NotImplementedError(
            f"{op}: quant_scale > 0 (the int8-quantised forward) has no gradient: its output is "
            f"rounded to integers, so the grad is zero almost everywhere; Paddle 3.3.1 raises "
            f"Unimplemented here too. Use quant_scale <= 0 (the float path).")
    rows, cols = _rows_cols(call, cols_of=("norm_weight", "norm_bias", "bias"), rows_of=("inv_var",))
    need_same_shape(op, call, "x", "out_grad")
    if call.meta("residual") is not None:
        need_same_shape(op, call, "x", "residual")
    check_param_dtype(op, call, ("norm_weight", "norm_bias", "inv_var"))
    for n in ("bias", "residual"):
        m = call.meta(n)
        if m is not None and m.dtype != call.meta("x").dtype:
            raise TypeError(f"{op}: input {n!r} has dtype {m.dtype.name}, expected "
                            f"{call.meta('x').dtype.name} (the dtype of 'x')")
    rc = ("rows", "cols")
    return ({"x": rc, "residual": rc, "out_grad": rc, "x_grad": rc, "bias": ("cols",),
             "norm_weight": ("cols",), "norm_bias": ("cols",), "norm_weight_grad": ("cols",),
             "inv_var": ("rows",)}, {"rows": rows, "cols": cols})


@view_op(views=_rms_views, float_inputs=("x", "out_grad"), index_dtypes=FLOATS,
         pattern="red_rows")
def rms_norm_grad(x, bias, residual, norm_weight, norm_bias, inv_var, out_grad, epsilon,
                  begin_norm_axis, quant_scale):
    """h = x (+ bias + residual), viewed (rows, cols); r = inv_var = 1/√(mean(h²) + ε) per row:
    out = h·r·w (+ norm_bias);  x_grad = r·(g·w) − r³·h·mean_row(g·w·h),
    norm_weight_grad = Σ_rows g·h·r   (g = out_grad). Paddle's GPU kernel covers the case without
    bias/residual/norm_bias only (it raises otherwise); with them this is the exact gradient
    w.r.t. x (norm_bias does not enter it)."""
    dt = cdtype(x)
    rows, cols = x.shape

    def h(i, j):
        v = ld(x, i, j)
        if bias is not None:
            v = v + ld(bias, j, to=dt)
        if residual is not None:
            v = v + ld(residual, i, j, to=dt)
        return v

    def gw(i, j):
        return ld(out_grad, i, j) * ld(norm_weight, j, to=dt)

    k = te.reduce_axis((0, cols), name="k")
    s = te.compute((rows,), lambda i: te.sum(gw(i, k) * h(i, k), axis=k), name="rs_dot",
                   attrs={"rows.role": "reduce"})
    inv_n = const(1.0, dt) / cols.astype(dt)

    def dx(i, j):
        r = ld(inv_var, i, to=dt)
        return store(x, r * gw(i, j) - r * r * r * h(i, j) * (s[i] * inv_n))

    dxt = te.compute((rows, cols), dx, name="ro_x_grad", attrs={"rows.role": "output"})
    dw = colsum("norm_weight_grad", (cols,),
                lambda j, rr: ld(out_grad, rr, j) * h(rr, j) * ld(inv_var, rr, to=dt), (rows,), dt,
                out_storage(str(norm_weight.dtype)))
    return dxt, dw


# ------------------------------------------------------------------------------------------
# group_norm

def _gn_views(call, outs):
    op = call.op
    shape = call.meta("x").shape
    fmt = call.attrs["data_format"]
    if fmt not in ("NCHW", "NHWC", "NCL", "NLC", "NCDHW", "NDHWC"):
        raise OpError(f"{op}: attribute 'data_format' must be 'NCHW' or 'NHWC' (or NCL/NLC/"
                      f"NCDHW/NDHWC), got {fmt!r}")
    if len(shape) < 2:
        raise OpError(f"{op}: x must have rank >= 2 (N, C, ...), got {list(shape)}")
    channel_last = fmt in ("NHWC", "NLC", "NDHWC")
    c = shape[-1] if channel_last else shape[1]
    g = call.attrs["groups"]
    if g <= 0 or c % g:
        raise OpError(f"{op}: attribute 'groups' = {g} must be positive and divide the {c} "
                      f"channels")
    n = shape[0]
    hw = math.prod(shape[1:-1]) if channel_last else math.prod(shape[2:])
    for name in ("y", "y_grad"):
        need_same_shape(op, call, "x", name)
    for name, size in (("scale", c), ("bias", c), ("mean", n * g), ("variance", n * g)):
        m = call.meta(name)
        if m is not None and not same_dim(math.prod(m.shape), size):
            raise OpError(f"{op}: input {name!r} has shape {list(m.shape)}, expected {size} "
                          f"elements (x is {list(shape)}, groups={g}, {fmt})")
    check_param_dtype(op, call, ("scale", "bias", "mean", "variance"))
    xv = ("n", "hw", "g", "gs") if channel_last else ("n", "g", "gs", "hw")
    return ({"x": xv, "y": xv, "y_grad": xv, "x_grad": xv, "scale": ("g", "gs"),
             "bias": ("g", "gs"), "scale_grad": ("g", "gs"), "bias_grad": ("g", "gs"),
             "mean": ("n", "g"), "variance": ("n", "g")},
            {"n": n, "g": g, "gs": c // g, "hw": hw})


@view_op(views=_gn_views, float_inputs=("x", "y", "y_grad"), index_dtypes=FLOATS,
         pattern="red_rows")
def group_norm_grad(x, scale, bias, y, mean, variance, y_grad, epsilon, groups, data_format):
    """Per (sample, group) of M = (C/G)·HW elements: x̂ = (x − mean)·r, r = 1/√(var + ε),
    t = y_grad·scale (scale = 1 when absent):
    x_grad = r·(t − (Σt + x̂·Σ t·x̂)/M);  scale_grad = Σ_{N,HW} y_grad·x̂;  bias_grad = Σ_{N,HW} y_grad.
    x̂ is formed from x and the saved mean/variance (as Paddle's GPU kernel does for NCHW).
    Paddle's CPU kernel instead recovers x̂ from y as (y − bias)/scale: without scale it drops the
    mean of t (Σt = 0, wrong), and for channels with scale = 0 it cannot recover x̂ (wrong x_grad
    and scale_grad); the formula here is the exact gradient in every case."""
    dt = cdtype(x)
    eps = float_attr(epsilon)
    one = const(1.0, dt)
    channel_last = data_format in ("NHWC", "NLC", "NDHWC")
    if channel_last:
        n_, hw_, g_, gs_ = x.shape
    else:
        n_, g_, gs_, hw_ = x.shape

    def at(t, n, g, c, m):
        return ld(t, n, m, g, c, to=dt) if channel_last else ld(t, n, g, c, m, to=dt)

    rs = te.compute((n_, g_), lambda n, g: one / tirx.sqrt(ld(variance, n, g, to=dt) + eps),
                    name="rv_rstd", attrs={"rows.role": "scalar"})

    def rstd(n, g):
        return rs[n, g]

    def xhat(n, g, c, m):
        return (at(x, n, g, c, m) - ld(mean, n, g, to=dt)) * rstd(n, g)

    def xhat_col(n, g, c, m):   # the column reductions recompute 1/√(var + ε) (a factor)
        return (at(x, n, g, c, m) - ld(mean, n, g, to=dt)) * (
            one / tirx.sqrt(ld(variance, n, g, to=dt) + eps))

    def tt(n, g, c, m):
        d = at(y_grad, n, g, c, m)
        return d * ld(scale, g, c, to=dt) if scale is not None else d

    kc = te.reduce_axis((0, gs_), name="kc")
    km = te.reduce_axis((0, hw_), name="km")
    axes = [km, kc] if channel_last else [kc, km]
    s1, s2 = te.compute((n_, g_), lambda n, g: _sum2()(
        (tt(n, g, kc, km), tt(n, g, kc, km) * xhat(n, g, kc, km)), axis=axes), name="rs_sums",
        attrs={"rows.role": "reduce"})
    inv_m = one / (gs_ * hw_).astype(dt)

    def dx(n, g, c, m):
        return store(x, rstd(n, g) * (tt(n, g, c, m) - (s1[n, g] + xhat(n, g, c, m) * s2[n, g]) * inv_m))

    if channel_last:
        dxt = te.compute(x.shape, lambda n, m, g, c: dx(n, g, c, m), name="ro_x_grad",
                         attrs={"rows.role": "output"})
    else:
        dxt = te.compute(x.shape, dx, name="ro_x_grad", attrs={"rows.role": "output"})
    dscale = dbias = None
    if scale is not None:
        dscale = colsum("scale_grad", (g_, gs_),
                        lambda g, c, rn, rm: at(y_grad, rn, g, c, rm) * xhat_col(rn, g, c, rm),
                        (n_, hw_), dt, out_storage(str(scale.dtype)))
    if bias is not None:
        dbias = colsum("bias_grad", (g_, gs_), lambda g, c, rn, rm: at(y_grad, rn, g, c, rm),
                       (n_, hw_), dt, out_storage(str(bias.dtype)))
    return dxt, dscale, dbias


# ------------------------------------------------------------------------------------------
# instance_norm (saved_variance holds 1/√(var + ε), as Paddle saves it)

def _in_views(grad_names):
    def views(call, outs):
        op = call.op
        shape = call.meta("x").shape
        n, c = shape[0], shape[1]
        hw = math.prod(shape[2:])
        for name in grad_names:
            if call.meta(name) is not None and name not in ("grad_scale_grad", "grad_bias_grad"):
                need_same_shape(op, call, "x", name)
        names = [a for a in ("scale", "fwd_scale", "saved_mean", "saved_variance",
                             "grad_scale_grad", "grad_bias_grad") if a in call.tensors]
        check_param_dtype(op, call, names)
        v = ("n", "c", "m")
        tpl = {name: v for name in ("x", "x_grad", "grad_y_grad") + tuple(grad_names)}
        tpl.update({"saved_mean": ("n", "c"), "saved_variance": ("n", "c")})
        return tpl, {"n": n, "c": c, "m": hw}
    return views


@view_op(views=_in_views(("y_grad",)), float_inputs=("x", "y_grad"), index_dtypes=FLOATS,
         pattern="red_rows")
def instance_norm_grad(x, scale, saved_mean, saved_variance, y_grad, epsilon):
    """Per (n, c) over M = H·W: x̂ = (x − mean)·r (r = saved_variance, the inverse std):
    x_grad = scale·r·(dy − mean(dy) − x̂·mean(dy·x̂)) (scale = 1 when absent);
    scale_grad = Σ_{N,HW} dy·x̂ (absent without scale), bias_grad = Σ_{N,HW} dy (float32 for
    half x; epsilon unused)."""
    dt = cdtype(x)
    n_, c_, m_ = x.shape
    one = const(1.0, dt)

    def xhat(n, c, m):
        return (ld(x, n, c, m) - ld(saved_mean, n, c, to=dt)) * ld(saved_variance, n, c, to=dt)

    k = te.reduce_axis((0, m_), name="k")
    s1, s2 = te.compute((n_, c_), lambda n, c: _sum2()(
        (ld(y_grad, n, c, k), ld(y_grad, n, c, k) * xhat(n, c, k)), axis=k), name="rs_sums",
        attrs={"rows.role": "reduce"})
    inv_m = one / m_.astype(dt)

    def dx(n, c, m):
        s = ld(scale, c, to=dt) if scale is not None else one
        return store(x, s * ld(saved_variance, n, c, to=dt) * (
            ld(y_grad, n, c, m) - s1[n, c] * inv_m - xhat(n, c, m) * (s2[n, c] * inv_m)))

    dxt = te.compute(x.shape, dx, name="ro_x_grad", attrs={"rows.role": "output"})
    pdt = "float32" if str(x.dtype) in HALF else str(x.dtype)
    dscale = None if scale is None else colsum(
        "scale_grad", (c_,), lambda c, rn, rm: ld(y_grad, rn, c, rm) * xhat(rn, c, rm), (n_, m_), dt,
        out_storage(pdt))
    dbias = colsum("bias_grad", (c_,), lambda c, rn, rm: ld(y_grad, rn, c, rm), (n_, m_), dt,
                   out_storage(pdt))
    return dxt, dscale, dbias


@view_op(views=_in_views(("grad_y", "grad_x_grad")), float_inputs=("x", "grad_y", "grad_x_grad"),
         index_dtypes=FLOATS, pattern="red_rows")
def instance_norm_double_grad(x, fwd_scale, saved_mean, saved_variance, grad_y, grad_x_grad,
                              grad_scale_grad, grad_bias_grad, epsilon):
    """Paddle's InstanceNormDoubleGradKernel formulas (dy = grad_y, ddx = grad_x_grad, per (n, c)
    over M = HW with x̂ = (x − mean)·r, sums S_a = Σ_HW a):
    x_grad = s·[x̂·r²/M·(S_ddx·S_dy/M − S_dy·ddx + 3·S_dy·x̂·S_ddx·x̂/M) + S_ddx·x̂/M·r²·(S_dy/M − dy)
             + S_dy·x̂/M·r²·(S_ddx/M − ddx)] + ddscale·r·(dy − S_dy/M − x̂·S_dy·x̂/M);
    fwd_scale_grad = Σ_N r·(S_dy·ddx − S_dy·S_ddx/M − S_dy·x̂·S_ddx·x̂/M);
    grad_y_grad = s·r·(ddx − S_ddx/M − x̂·S_ddx·x̂/M) + x̂·ddscale + ddbias.
    An absent ddx / ddscale / ddbias counts as zero (Paddle's CPU kernel dereferences a missing
    ddx, and drops ddscale unless ddbias is given too and vice versa)."""
    dt = cdtype(x)
    n_, c_, m_ = x.shape
    one, zero = const(1.0, dt), const(0.0, dt)
    inv_m = one / m_.astype(dt)

    def r(n, c):
        return ld(saved_variance, n, c, to=dt)

    def xh(n, c, m):
        return (ld(x, n, c, m) - ld(saved_mean, n, c, to=dt)) * r(n, c)

    def dy(n, c, m):
        return ld(grad_y, n, c, m)

    def ddx(n, c, m):
        return ld(grad_x_grad, n, c, m) if grad_x_grad is not None else zero

    def sc(c):
        return ld(fwd_scale, c, to=dt) if fwd_scale is not None else one

    def dds(c):
        return ld(grad_scale_grad, c, to=dt) if grad_scale_grad is not None else zero

    def ddb(c):
        return ld(grad_bias_grad, c, to=dt) if grad_bias_grad is not None else zero

    def sums(name, attrs=None):
        """Σ_HW of dy, ddx, dy·ddx, dy·x̂, ddx·x̂ per (n, c): five plain sums (TVM's cross-thread
        reduction matches no 5-tuple reducer)."""
        terms = (lambda n, c, k: dy(n, c, k), lambda n, c, k: ddx(n, c, k),
                 lambda n, c, k: dy(n, c, k) * ddx(n, c, k), lambda n, c, k: dy(n, c, k) * xh(n, c, k),
                 lambda n, c, k: ddx(n, c, k) * xh(n, c, k))
        def one(j, f):
            k = te.reduce_axis((0, m_), name=f"{name}{j}_k")
            return te.compute((n_, c_), lambda n, c: te.sum(f(n, c, k), axis=k), name=f"{name}{j}",
                              attrs=attrs)

        return [one(j, f) for j, f in enumerate(terms)]

    def parts(S, n, c, m):
        sdy, sddx, sdyddx, sdyxh, sddxxh = (S[j][n, c] for j in range(5))
        return sdy, sddx, sdyddx, sdyxh, sddxxh, r(n, c), xh(n, c, m), dy(n, c, m), ddx(n, c, m)

    # each output recomputes its row sums (one fused kernel per output)
    Sa = sums("rs_sums_dx", {"rows.role": "reduce"})

    def dx_body(n, c, m):
        sdy, sddx, sdyddx, sdyxh, sddxxh, rr, x_, d, dd = parts(Sa, n, c, m)
        r2 = rr * rr
        v = (x_ * r2 * inv_m * (sddx * sdy * inv_m - sdyddx + const(3.0, dt) * sdyxh * sddxxh * inv_m)
             + sddxxh * inv_m * r2 * (sdy * inv_m - d) + sdyxh * inv_m * r2 * (sddx * inv_m - dd))
        v = sc(c) * v + (d * rr - sdy * inv_m * rr - x_ * rr * sdyxh * inv_m) * dds(c)
        return store(x, v)

    dx = te.compute(x.shape, dx_body, name="ro_x_grad", attrs={"rows.role": "output"})
    Sb = sums("rs_sums_ddy", {"rows.role": "reduce"})

    def ddy_body(n, c, m):
        sdy, sddx, sdyddx, sdyxh, sddxxh, rr, x_, d, dd = parts(Sb, n, c, m)
        return store(x, sc(c) * rr * (dd - sddx * inv_m - x_ * sddxxh * inv_m) + x_ * dds(c) + ddb(c))

    ddy = te.compute(x.shape, ddy_body, name="ro_grad_y_grad", attrs={"rows.role": "output"})
    # fwd_scale_grad needs the same per-(n, c) sums: a second set, reduced over N afterwards
    S2 = sums("ps_sums")
    pdt = "float32" if str(x.dtype) in HALF else str(x.dtype)
    rn = te.reduce_axis((0, n_), name="rn")

    def dscale_term(n, c):
        sdy, sddx, sdyddx, sdyxh, sddxxh = (S2[j][n, c] for j in range(5))
        return r(n, c) * (sdyddx - sdy * sddx * inv_m - sdyxh * sddxxh * inv_m)

    red = te.compute((c_,), lambda c: te.sum(dscale_term(rn, c), axis=rn), name="cs_dscale",
                     attrs={"rows.role": "col_sum"})
    dscale = red if pdt == dt else te.compute((c_,), lambda c: red[c].astype(out_storage(pdt)),
                                              name="cc_dscale", attrs={"rows.role": "col_cast"})
    return dx, dscale, ddy


# ------------------------------------------------------------------------------------------
# norms of a whole tensor / along an axis (pointwise: out and out_grad broadcast)

def _sign(x):
    """Eigen's sign: −1, 0, 1 (NaN for NaN)."""
    return where(x > 0, const(1.0, x), where(x < 0, const(-1.0, x), where(tirx.isnan(x), x, const(0.0, x))))


def _scalar_grad_views(call, outs):
    n = math.prod(call.meta("x").shape)
    g = call.meta("out_grad")
    if math.prod(g.shape) != 1 or len(g.shape) > 1:
        raise OpError(f"{call.op}: input 'out_grad' has shape {list(g.shape)}, expected [] or [1]")
    return {"x": ("n",), "x_grad": ("n",), "out_grad": (1,)}, {"n": n}


@view_op(views=_scalar_grad_views)
def l1_norm_grad(x, out_grad):
    """x_grad = sign(x)·out_grad (sign(0) = 0, NaN for NaN)"""
    (n,) = x.shape
    return te.compute((n,), lambda i: store(x, _sign(ld(x, i)) * ld(out_grad, 0)), name="x_grad")


@view_op(views=_scalar_grad_views)
def squared_l2_norm_grad(x, out_grad):
    """x_grad = 2·x·out_grad"""
    (n,) = x.shape
    dt = cdtype(x)
    return te.compute((n,), lambda i: store(x, const(2.0, dt) * ld(x, i) * ld(out_grad, 0)),
                      name="x_grad")


def _p_norm_views(call, outs):
    x = tuple(call.meta("x").shape)
    attrs = call.attrs
    if attrs["asvector"] or not x:
        pre, n, post = 1, math.prod(x), 1
        kept = ()
    else:
        ax = norm_axis(attrs["axis"], len(x), of="x", op=call.op, zero_d_axis=True)
        pre, n, post = split_axis(x, ax)
        kept = x[:ax] + ((1,) if attrs["keepdim"] else ()) + x[ax + 1:]
    for name in ("out", "out_grad"):
        m = call.meta(name)
        if math.prod(m.shape) != pre * post:
            raise OpError(f"{call.op}: input {name!r} has shape {list(m.shape)}, expected the "
                          f"norm's shape {list(kept)} (the norm of 'x' {list(x)} over the axis)")
    v = ("pre", "n", "post")
    return ({"x": v, "x_grad": v, "out": ("pre", 1, "post"), "out_grad": ("pre", 1, "post")},
            {"pre": pre, "n": n, "post": post})


@view_op(views=_p_norm_views)
def p_norm_grad(x, out, out_grad, porder, axis, epsilon, keepdim, asvector):
    """p = 0: 0; p = ±inf: out_grad·sign(x)·[|x| = out] (every tied element gets the full grad);
    else out_grad·sign(x)·|x|^(p−1)/(out^(p−1) + ε). porder and ε are float32 in Paddle."""
    dt = cdtype(x)
    p, eps = float_attr(porder), float_attr(epsilon)
    one, zero = const(1.0, dt), const(0.0, dt)

    def body(i, j, k):
        xv, nv, g = ld(x, i, j, k), ld(out, i, 0, k), ld(out_grad, i, 0, k)
        ax = tirx.abs(xv)
        general = tirx.power(ax, p - one) / (tirx.power(nv, p - one) + eps) * g * _sign(xv)
        inf = _mask(ax == nv, xv) * _sign(xv) * g
        return store(x, where(p == zero, zero, where(tirx.isinf(p), inf, general)))

    return te.compute(x.shape, body, name="x_grad")


def _dist_check(call, outs):
    for n in ("out", "out_grad"):
        m = call.meta(n)
        if m.ndim > 1 or math.prod(m.shape) != 1:
            raise OpError(f"{call.op}: input {n!r} has shape {list(m.shape)}; dist's output is a "
                          f"scalar (shape [] or [1])")


@pointwise(broadcast=("x", "y", "out", "out_grad"), validate=_dist_check)
def dist_grad(x, y, out, out_grad, p):
    """d = x − y (broadcast): p = 0: 0; p = ±inf: [|d| = out]·sign(d)·g; else
    (|d|/(out + 1e-10))^(p−1)·sign(d)·g (Paddle's formula; p is a float32);
    x_grad = Σ_broadcast, y_grad = −Σ_broadcast"""
    pp = float_attr(p)
    d = x - y
    ad = tirx.abs(d)
    one = const(1.0, x)
    sgn = where(d > 0, one, where(d < 0, -one, const(0.0, x)))
    eps = const(float(np.float32(1e-10)), x)
    general = tirx.power(ad / (out + eps), pp - one) * sgn * out_grad
    inf = _mask(ad == out, x) * sgn * out_grad
    g = where(pp == const(0.0, x), const(0.0, x), where(tirx.isinf(pp), inf, general))
    return g, -g


def _mask(cond, like):
    return where(cond, const(1.0, like), const(0.0, like))


# ------------------------------------------------------------------------------------------
# renorm: slices along axis rescaled to norm ≤ max_norm

def _renorm_views(call, outs):
    shape = call.meta("x").shape
    need_same_shape(call.op, call, "x", "out_grad")
    if not shape:
        raise OpError(f"{call.op}: x must have rank >= 1")
    ax = norm_axis(call.attrs["axis"], len(shape), of="x", op=call.op, zero_d_axis=True)
    if call.attrs["p"] <= 0:
        raise OpError(f"{call.op}: attribute 'p' must be positive, got {call.attrs['p']}")
    pre, n, post = split_axis(tuple(shape), ax)
    v = ("pre", "n", "post")
    return {"x": v, "out_grad": v, "x_grad": v}, {"pre": pre, "n": n, "post": post}


@view_op(views=_renorm_views, pattern="red_rows")
def renorm_grad(x, out_grad, p, axis, max_norm):
    """Per slice s along axis: P = Σ|x|^p, N = P^(1/p); if N > max_norm: c = max_norm/N,
    k = −max_norm·P^(−1−1/p), else c = 1, k = 0; W = Σ x·out_grad:
    x_grad = c·out_grad + W·k·|x|^(p−1)·(x ≥ 0 ? 1 : −1). p and max_norm are float32."""
    dt = cdtype(x)
    pre, n, post = x.shape
    pp, mx = float_attr(p), float_attr(max_norm)
    one = const(1.0, dt)
    k1 = te.reduce_axis((0, pre), name="k1")
    k2 = te.reduce_axis((0, post), name="k2")
    P, W = te.compute((n,), lambda c: _sum2()(
        (tirx.power(tirx.abs(ld(x, k1, c, k2)), pp), ld(x, k1, c, k2) * ld(out_grad, k1, c, k2)),
        axis=[k1, k2]), name="rs_sums", attrs={"rows.role": "reduce"})

    def coeffs(c):
        nrm = tirx.power(P[c], one / pp)
        big = nrm > mx
        return [where(big, mx / nrm, one),
                where(big, tirx.power(P[c], -one - one / pp) * (-mx), const(0.0, dt))]

    sc_ = te.compute((n,), lambda c: coeffs(c)[0], name="rv_scale", attrs={"rows.role": "scalar"})
    kk_ = te.compute((n,), lambda c: coeffs(c)[1], name="rv_k", attrs={"rows.role": "scalar"})

    def body(a, c, b):
        scale, kk = sc_[c], kk_[c]
        xv = ld(x, a, c, b)
        sg = where(xv >= 0, one, -one)
        return store(x, scale * ld(out_grad, a, c, b)
                     + W[c] * kk * tirx.power(tirx.abs(xv), pp - one) * sg)

    return te.compute(x.shape, body, name="ro_x_grad", attrs={"rows.role": "output"})


# ------------------------------------------------------------------------------------------
# spectral_norm

def _sn_views(call, outs):
    shape = call.meta("weight").shape
    need_same_shape(call.op, call, "weight", "out_grad")
    if not 2 <= len(shape) <= 5:
        raise OpError(f"{call.op}: weight must have rank 2 to 5, got {list(shape)}")
    dim = call.attrs["dim"]
    if dim == 0:
        a, h, r = 1, shape[0], math.prod(shape[1:])
        wt = (1, "h", "r")
    else:
        a, h, r = shape[0], shape[1], math.prod(shape[2:])
        wt = ("a", "h", "r")
    vt = (wt[0], "r")
    return ({"weight": wt, "out_grad": wt, "weight_grad": wt, "u": ("h",), "v": vt},
            {"a": a, "h": h, "r": r})


@view_op(views=_sn_views, pattern="red_rows")
def spectral_norm_grad(weight, u, v, out_grad, dim, power_iters, eps):
    """W: weight as an (h, w) matrix (dim moved first). power_iters steps of v = Wᵀu/(‖Wᵀu‖ + ε),
    u = Wv/(‖Wv‖ + ε) from the given u, v; σ = uᵀWv; out = W/σ. With u, v held constant (the
    usual convention; exact at a converged power iteration):
    weight_grad = (G − ⟨G, W/σ⟩·u vᵀ)/σ.
    Paddle 3.3.1's kernel computes G ⊙ (1 − u vᵀ·ΣW/σ)/σ instead (an elementwise product with
    the *sum of the normalised weight*), which is not the gradient of its forward."""
    dt = cdtype(weight)
    A, h, r = weight.shape
    e = float_attr(eps)

    def W(a, i, k):
        return ld(weight, a, i, k)

    def power_step(it, uu):
        """One iteration: the new (v, u) tensors from the current u (a function of i)."""
        ki = te.reduce_axis((0, h), name=f"ki{it}")
        vt = te.compute((A, r), lambda a, k: te.sum(W(a, ki, k) * uu(ki), axis=ki), name=f"vt{it}")
        ka = te.reduce_axis((0, A), name=f"ka{it}")
        kr = te.reduce_axis((0, r), name=f"kr{it}")
        vn = te.compute((1,), lambda _: te.sum(vt[ka, kr] * vt[ka, kr], axis=[ka, kr]), name=f"vn{it}")
        vinv = te.compute((1,), lambda _: const(1.0, dt) / (tirx.sqrt(vn[0]) + e), name=f"rv_vinv{it}",
                          attrs={"rows.role": "scalar"})
        vnew = te.compute((A, r), lambda a, k: vt[a, k] * vinv[0], name=f"v{it}")
        ka2 = te.reduce_axis((0, A), name=f"kb{it}")
        kr2 = te.reduce_axis((0, r), name=f"ks{it}")
        ut = te.compute((h,), lambda i: te.sum(W(ka2, i, kr2) * vnew[ka2, kr2], axis=[ka2, kr2]),
                        name=f"ut{it}")
        ki2 = te.reduce_axis((0, h), name=f"kh{it}")
        un = te.compute((1,), lambda _: te.sum(ut[ki2] * ut[ki2], axis=ki2), name=f"un{it}")
        uinv = te.compute((1,), lambda _: const(1.0, dt) / (tirx.sqrt(un[0]) + e), name=f"rv_uinv{it}",
                          attrs={"rows.role": "scalar"})
        unew = te.compute((h,), lambda i: ut[i] * uinv[0], name=f"u{it}")
        return vnew, unew

    def loaded(t):                  # an input's element in the compute dtype
        return lambda *i: ld(t, *i)

    def element(t):                 # an iterate's element
        return lambda *i: t[i]

    uu, vv = loaded(u), loaded(v)
    for it in range(power_iters):
        vnew, unew = power_step(it, uu)
        uu, vv = element(unew), element(vnew)          # the current iterates

    ka = te.reduce_axis((0, A), name="wa")
    kr = te.reduce_axis((0, r), name="wr")
    wv = te.compute((h,), lambda i: te.sum(W(ka, i, kr) * vv(ka, kr), axis=[ka, kr]), name="wv")
    ki = te.reduce_axis((0, h), name="si")
    sigma = te.compute((1,), lambda _: te.sum(uu(ki) * wv[ki], axis=ki), name="sigma")
    ga = te.reduce_axis((0, A), name="ga")
    gi = te.reduce_axis((0, h), name="gi")
    gr = te.reduce_axis((0, r), name="gr")
    gw = te.compute((1,), lambda _: te.sum(ld(out_grad, ga, gi, gr) * W(ga, gi, gr), axis=[ga, gi, gr]),
                    name="gw")

    coef = te.compute((2,), lambda t: where(t == 0, const(1.0, dt) / sigma[0],
                                            gw[0] / (sigma[0] * sigma[0])), name="rv_coef",
                    attrs={"rows.role": "scalar"})

    def body(a, i, k):
        return store(weight, ld(out_grad, a, i, k) * coef[0] - coef[1] * uu(i) * vv(a, k))

    return te.compute(weight.shape, body, name="weight_grad")
