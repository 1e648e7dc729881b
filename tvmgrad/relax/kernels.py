"""Kernels that tvmgrad.relax builds itself (no backward.yaml op has them): TE functions wrapped
in ``Plan`` objects, so that ``tvmgrad.build.lower`` schedules them like every tvmgrad kernel
(by loop-nest shape, or by the plan's pattern).

* ``batch_norm_grad``: the gradient of ``relax.nn.batch_norm`` over a (P, C, S) view of the data
  (channel axis C, everything before it P, everything after it S; S = 1 is left out, which makes
  the per-channel sums column reductions): in training mode the batch statistics are recomputed
  (two passes: the mean, then the centred sums), in eval mode the moving statistics are constants;
* ``matmul``: a forward (batched) matrix product on the dense family's tiled contraction
  (``te_defs._dense.gemm``, scheduled by ``gemm_dense``), optionally reading its right operand
  transposed (``x @ wᵀ`` of a linear layer without materialising ``wᵀ``);
* ``conv2d``: a forward 2-D convolution (NCHW or NHWC data, OIHW filters, groups, strides,
  dilations, per-side paddings) on the dense family's direct convolution (``te_defs.conv``).

``emit_plan(bb, plan, args, out_types)`` adds such a kernel to the function ``bb`` builds (a
``call_tir`` whose PrimFunc carries the ``tvmgrad.op`` / ``tvmgrad.pattern`` attributes that
``schedule_kernels`` and the tvmgrad pipeline look for).
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

from ..families.base import Plan

__all__ = ["emit_plan", "batch_norm_grad_plan", "matmul_plan", "conv2d_plan", "dims_of"]


def _digest(key) -> str:
    return hashlib.sha1(repr(key).encode()).hexdigest()[:10]


def dims_of(shape) -> tuple:
    """A Relax shape as plan-time dims: ints where static, None where symbolic."""
    out = []
    for d in shape:
        value = getattr(d, "value", d)
        out.append(int(value) if isinstance(value, int) else None)
    return tuple(out)


def _te_dims(names, dims):
    """TE dims (int64): a constant where static, a fresh variable where symbolic."""
    from tvm import te, tirx
    return [tirx.const(d, "int64") if d is not None else te.var(n, "int64") for n, d in zip(names, dims)]


def _prim_func(params):
    """The PrimFunc over ``params``, int64 throughout as Relax calls it (``te.create_prim_func``
    alone starts every iteration domain at an int32 0, which schedule primitives such as
    ``transform_layout`` reject next to int64 extents)."""
    from tvm import te
    return te.create_prim_func(params, index_dtype_override="int64")


def _plan(op, key, make, pattern):
    return Plan(key=key, symbol=f"{op}_{_digest(key)}", make=make, args=(), pattern=pattern)


def emit_plan(bb, op: str, plan: Plan, args, out_types, *, target=None):
    """Emit ``plan``'s kernel into ``bb``'s dataflow block: -> the call's output (a tuple var for
    several outputs). With ``target`` it is scheduled now (``tvmgrad.build.lower``); without,
    it is left for ``schedule_kernels`` / the tvmgrad pipeline."""
    from tvm import relax

    from .emit import EMITTED_PLANS, lowered
    if target is not None:
        func = lowered(plan, target)
    else:
        func = plan.make()
        EMITTED_PLANS[plan.symbol] = plan
    func = (func.with_attr("global_symbol", plan.symbol).with_attr("tvmgrad.op", op)
            .with_attr("tvmgrad.pattern", plan.pattern).with_attr("op_pattern", 8))
    gvar = bb.add_func(func, plan.symbol)
    out = out_types if len(out_types) > 1 else out_types[0]
    return bb.emit(relax.call_tir(gvar, list(args), out))


# ------------------------------------------------------------------------------------------
# batch_norm backward

def batch_norm_grad_plan(view, dtype: str, param_dtype: str, *, training: bool, epsilon: float,
                         scale: bool) -> Plan:
    """(dx, dgamma, dbeta) of ``batch_norm`` over ``view`` = (P, C, S) or (P, C) (ints or None
    for symbolic dims). Kernel parameters: x, out_grad, gamma, [moving_mean, moving_var when
    not training], dx, dgamma, dbeta.

    Training: mean = Σx/M, inv = 1/√(Σ(x−mean)²/M + ε), x̂ = (x−mean)·inv,
    dβ = Σg, dγ = Σg·x̂, dx = γ·inv·(g − dβ/M − x̂·dγ/M) (γ = 1 without ``scale``): two
    passes over x for the statistics, one over (g, x) for the sums, one writing dx.
    Eval: inv = 1/√(var_moving + ε), dγ = Σg·(x−mean_moving)·inv, dβ = Σg, dx = γ·inv·g."""
    key = ("relax.batch_norm_grad", tuple(view), dtype, param_dtype, training, float(epsilon), scale)

    def make():
        from tvm import te, tirx

        from ..dtypes import dtype as as_dtype
        from ..dtypes import to_compute
        dt = as_dtype(dtype)
        acc = dt.compute
        names = ("P", "C", "S")[:len(view)]
        shape = _te_dims(names, view)
        C = shape[1]
        x = te.placeholder(shape, dt.storage, name="x")
        g = te.placeholder(shape, dt.storage, name="out_grad")
        gamma = te.placeholder((C,), param_dtype, name="gamma")
        pdt = as_dtype(param_dtype)
        count = shape[0] * shape[2] if len(shape) == 3 else shape[0]
        inv_m = tirx.const(1.0, acc) / count.astype(acc)
        eps = tirx.const(epsilon, acc)
        red = [te.reduce_axis((0, shape[0]), name="rp")]
        if len(shape) == 3:
            red.append(te.reduce_axis((0, shape[2]), name="rs"))

        def at(t, c):
            idx = (red[0], c, red[1]) if len(red) == 2 else (red[0], c)
            return to_compute(t[idx], dt).astype(acc)

        def param(t, c):
            return to_compute(t[c], pdt).astype(acc)

        inputs = [x, g, gamma]
        if training:
            s_x = te.compute((C,), lambda c: te.sum(at(x, c), axis=red), name="bn_sum_x")
            mean = te.compute((C,), lambda c: s_x[c] * inv_m, name="bn_mean")
            s_xx = te.compute((C,), lambda c: te.sum((at(x, c) - mean[c]) * (at(x, c) - mean[c]), axis=red),
                              name="bn_sum_xx")
            inv = te.compute((C,), lambda c: tirx.rsqrt(s_xx[c] * inv_m + eps), name="bn_inv")
        else:
            mm = te.placeholder((C,), param_dtype, name="moving_mean")
            mv = te.placeholder((C,), param_dtype, name="moving_var")
            inputs += [mm, mv]
            mean = te.compute((C,), lambda c: param(mm, c), name="bn_mean")
            inv = te.compute((C,), lambda c: tirx.rsqrt(param(mv, c) + eps), name="bn_inv")
        # (each reduction's consumers are either several or one cast of it alone: the CPU
        # rules compute such a cast in the reduction's loop)
        s_g = te.compute((C,), lambda c: te.sum(at(g, c), axis=red), name="bn_sum_g")
        s_gxh = te.compute((C,), lambda c: te.sum(at(g, c) * (at(x, c) - mean[c]) * inv[c], axis=red),
                           name="bn_sum_gxhat")
        one = tirx.const(1.0, acc)

        def gam(c):
            return param(gamma, c) if scale else one

        # per channel: dx = a·g + b·(x − mean) + d
        a = te.compute((C,), lambda c: gam(c) * inv[c], name="bn_a")
        if training:
            b = te.compute((C,), lambda c: -a[c] * inv[c] * s_gxh[c] * inv_m, name="bn_b")
            d = te.compute((C,), lambda c: -a[c] * s_g[c] * inv_m, name="bn_d")

            def dx_f(*i):
                c = i[1]
                v = (a[c] * to_compute(g[i], dt).astype(acc)
                     + b[c] * (to_compute(x[i], dt).astype(acc) - mean[c]) + d[c])
                return v.astype(dt.storage)
        else:
            def dx_f(*i):
                c = i[1]
                return (a[c] * to_compute(g[i], dt).astype(acc)).astype(dt.storage)
        dx = te.compute(shape, dx_f, name="x_grad")
        dgamma = te.compute((C,), lambda c: s_gxh[c].astype(param_dtype), name="scale_grad")
        dbeta = te.compute((C,), lambda c: s_g[c].astype(param_dtype), name="bias_grad")
        return _prim_func(inputs + [dx, dgamma, dbeta])

    return _plan("batch_norm_grad", key, make, "generic")


# ------------------------------------------------------------------------------------------
# forward contractions on the dense family

def matmul_plan(B, M, K, N, dtype: str, *, trans_x: bool = False, trans_y: bool = False) -> Plan:
    """out[b, m, n] = Σ_k x[b, m, k] · y[b, k, n] (``trans_x``: x given as [b, k, m];
    ``trans_y``: y given as [b, n, k]); dims are ints or None (symbolic). Parameters: x, y, out."""
    key = ("relax.matmul", B, M, K, N, dtype, trans_x, trans_y)

    def make():
        from tvm import te

        from ..te_defs._dense import gemm, load, store
        from ..dtypes import dtype as as_dtype
        dt = as_dtype(dtype)
        b_, m_, k_, n_ = _te_dims("BMKN", (B, M, K, N))
        x = te.placeholder((b_, k_, m_) if trans_x else (b_, m_, k_), dt.storage, name="x")
        y = te.placeholder((b_, n_, k_) if trans_y else (b_, k_, n_), dt.storage, name="y")
        gm, gn = _grain_of(M), _grain_of(N)
        main = gemm("mm", (b_,), m_, n_, k_,
                    lambda bi, m, k: load(x, (*bi, k, m) if trans_x else (*bi, m, k), dt),
                    lambda bi, n, k: load(y, (*bi, n, k) if trans_y else (*bi, k, n), dt), dt, gm, gn)
        cast = store(dt)
        out = te.compute((b_, m_, n_), lambda b, m, n: cast(main[b, m, n]), name="out")
        return _prim_func([x, y, out])

    return _plan("matmul", key, make, "gemm_dense")


def _grain_of(n):
    """The dense family's padding grain of an extent (a symbolic one counts as long: 64)."""
    from ..te_defs._dense import grain
    return 64 if n is None else grain(n)


def conv2d_plan(xshape, wshape, *, strides, padding, dilation, groups: int, layout: str,
                dtype: str):
    """A forward conv2d: x (N, C, H, W) or (N, H, W, C), w (O, C/groups, kh, kw) (static dims),
    padding (top, left, bottom, right) as Relax gives it. Kernel parameters: x viewed as
    (N, G, Cg, H, W) / (N, H, W, G, Cg), w as (G, Og, Cg, kh, kw), out as (N, G, Og, OH, OW) /
    (N, OH, OW, G, Og). -> (plan, x view, w view, out view)."""
    last = layout == "NHWC"
    N = xshape[0]
    C, H, W = (xshape[3], xshape[1], xshape[2]) if last else xshape[1:]
    O, Cg, kh, kw = wshape
    G = groups
    s, d = tuple(strides), tuple(dilation)
    lo, hi = (padding[0], padding[1]), (padding[2], padding[3])
    OH = (H + lo[0] + hi[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    OW = (W + lo[1] + hi[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    key = ("relax.conv2d", tuple(xshape), tuple(wshape), s, tuple(padding), d, G, layout, dtype)
    out_view = (N, OH, OW, G, O // G) if last else (N, G, O // G, OH, OW)

    def make():
        from tvm import te, tirx

        from ..te_defs.conv import Act, Filt, Geom, _act_out, _roles, forward
        from ..dtypes import dtype as as_dtype
        dt = as_dtype(dtype)
        geom = Geom(2, last, G, (kh, kw), s, d, lo, hi)
        sz = dict(N=N, Cg=Cg, Og=O // G, I=(H, W), O=(OH, OW))
        gm, gn, gk, dwise = _roles(geom, sz, ("forward",))["forward"]
        i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
        xv = (N, H, W, G, Cg) if last else (N, G, Cg, H, W)
        x = te.placeholder(tuple(map(i64, xv)), dt.storage, name="x")
        w = te.placeholder(tuple(map(i64, (G, O // G, Cg, kh, kw))), dt.storage, name="w")
        main, idx = forward("conv", [(Act(x, last, dt), Filt(w, dt))], geom, dt, [i64(OH), i64(OW)],
                            gm, gn, gk, dwise, index="int64")
        like = SimpleNamespace(shape=tuple(map(i64, out_view)))
        out = _act_out("out", like, main, idx, dt, last, 2)
        return _prim_func([x, w, out])

    plan = _plan("conv2d", key, make, "gemm_dense")
    return plan, (xshape[0],) + ((H, W, G, Cg) if last else (G, Cg, H, W)), (G, O // G, Cg, kh, kw), out_view


# ------------------------------------------------------------------------------------------
# conv2d backward as two kernels (each one dropped when its gradient is not needed)

def _conv_geometry(xshape, wshape, strides, padding, dilation, groups, layout):
    last = layout == "NHWC"
    N = xshape[0]
    C, H, W = (xshape[3], xshape[1], xshape[2]) if last else xshape[1:]
    O, Cg, kh, kw = wshape
    s, d = tuple(strides), tuple(dilation)
    lo, hi = (padding[0], padding[1]), (padding[2], padding[3])
    OH = (H + lo[0] + hi[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    OW = (W + lo[1] + hi[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    G = groups
    xv = (N, H, W, G, Cg) if last else (N, G, Cg, H, W)
    ov = (N, OH, OW, G, O // G) if last else (N, G, O // G, OH, OW)
    wv = (G, O // G, Cg, kh, kw)
    return SimpleNamespace(last=last, N=N, C=C, H=H, W=W, O=O, Cg=Cg, Og=O // G, kh=kh, kw=kw, s=s, d=d,
                           lo=lo, hi=hi, OH=OH, OW=OW, G=G, xv=xv, ov=ov, wv=wv)


def conv2d_data_grad_plan(xshape, wshape, *, strides, padding, dilation, groups: int, layout: str,
                          dtype: str):
    """dx of a conv2d (``te_defs.conv.data_grad``: a transposed convolution as a direct
    contraction). Parameters: out_grad (out view), w (w view), dx (x view). -> (plan, views)."""
    g = _conv_geometry(xshape, wshape, strides, padding, dilation, groups, layout)
    key = ("relax.conv2d_data_grad", tuple(xshape), tuple(wshape), g.s, tuple(padding), g.d, g.G, layout, dtype)

    def make():
        from tvm import te, tirx

        from ..dtypes import dtype as as_dtype
        from ..te_defs.conv import Act, Filt, Geom, _act_out, _roles, data_grad
        dt = as_dtype(dtype)
        geom = Geom(2, g.last, g.G, (g.kh, g.kw), g.s, g.d, g.lo, g.hi)
        sz = dict(N=g.N, Cg=g.Cg, Og=g.Og, I=(g.H, g.W), O=(g.OH, g.OW))
        gm, gn, gk, dwise, cl = _roles(geom, sz, ("data",))["data"]
        i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
        dy = te.placeholder(tuple(map(i64, g.ov)), dt.storage, name="out_grad")
        w = te.placeholder(tuple(map(i64, g.wv)), dt.storage, name="w")
        main, idx = data_grad("conv_dx", Act(dy, g.last, dt), Filt(w, dt), geom, dt, [i64(g.H), i64(g.W)],
                              gm, gn, gk, dwise, index="int64", last=cl)
        like = SimpleNamespace(shape=tuple(map(i64, g.xv)))
        dx = _act_out("x_grad", like, main, idx, dt, g.last, 2)
        return _prim_func([dy, w, dx])

    return _plan("conv2d_data_grad", key, make, "gemm_dense"), g


def conv2d_filter_grad_plan(xshape, wshape, *, strides, padding, dilation, groups: int, layout: str,
                            dtype: str):
    """dw of a conv2d as one GEMM per group over the unfolded input (im2col):
    dw[g, o, (c, kh, kw)] = Σ_{(n, oh, ow)} dy[n, g, o, oh, ow] · x[n, g, c, oh·s + kh·d − lo, ...],
    the samples and output positions forming one reduction axis (long whatever the spatial size:
    a small late-layer feature map with many channels is a wide, shallow GEMM instead of one
    partial filter per sample). Parameters: x (x view), out_grad (out view), dw as
    (G, O/G, C/G·kh·kw)."""
    g = _conv_geometry(xshape, wshape, strides, padding, dilation, groups, layout)
    key = ("relax.conv2d_filter_grad", tuple(xshape), tuple(wshape), g.s, tuple(padding), g.d, g.G, layout, dtype)

    def make():
        from tvm import te, tirx

        from ..dtypes import dtype as as_dtype
        from ..te_defs._dense import gemm, grain, load, store
        dt = as_dtype(dtype)
        i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
        x = te.placeholder(tuple(map(i64, g.xv)), dt.storage, name="x")
        dy = te.placeholder(tuple(map(i64, g.ov)), dt.storage, name="out_grad")
        P = g.OH * g.OW
        KK = g.kh * g.kw
        Mn, Nn, Kn = g.Og, g.Cg * KK, g.N * P

        def dy_at(gi, o, k):
            n, oh, ow = _col_index(g, k, i64)
            return load(dy, (n, oh, ow, gi, o) if g.last else (n, gi, o, oh, ow), dt)

        main = gemm("conv_dw", (i64(g.G),), i64(Mn), i64(Nn), i64(Kn),
                    lambda bi, m, k: dy_at(bi[0], m, k), lambda bi, n, k: _x_col(g, x, dt, bi[0], k, n, i64), dt,
                    grain(Mn), grain(Nn))
        cast = store(dt)
        # (the crop reads the contraction affinely: (c, kh, kw) stays one axis, unflattened by a
        # reshape outside; the CPU schedule computes it per tile from registers)
        dw = te.compute((i64(g.G), i64(Mn), i64(Nn)), lambda gi, o, col: cast(main[gi, o, col]), name="w_grad")
        return _prim_func([x, dy, dw])

    return _plan("conv2d_filter_grad", key, make, "gemm_dense"), g


def _col_index(g, k, i64):
    """(n, oh, ow) of a flattened (sample, output position) index."""
    P = g.OH * g.OW
    n, p = k // i64(P), k % i64(P)
    return n, p // i64(g.OW), p % i64(g.OW)


def _x_col(g, x, dt, gi, m, col, i64):
    """The unfolded input: element (m = (n, oh, ow), col = (c, kh, kw)) of group gi, 0 in the
    padding."""
    from tvm import tirx

    from ..te_defs._dense import load
    KK = g.kh * g.kw
    n, oh, ow = _col_index(g, m, i64)
    c, r = col // i64(KK), col % i64(KK)
    kh, kw = r // i64(g.kw), r % i64(g.kw)
    ih = oh * i64(g.s[0]) + kh * i64(g.d[0]) - i64(g.lo[0])
    iw = ow * i64(g.s[1]) + kw * i64(g.d[1]) - i64(g.lo[1])
    ok = tirx.all(ih >= 0, ih < i64(g.H), iw >= 0, iw < i64(g.W))
    ihc = tirx.max(tirx.min(ih, i64(g.H - 1)), i64(0))
    iwc = tirx.max(tirx.min(iw, i64(g.W - 1)), i64(0))
    idx = (n, ihc, iwc, gi, c) if g.last else (n, gi, c, ihc, iwc)
    return tirx.Select(ok, load(x, idx, dt), tirx.const(0, dt.compute))


def _w_col(g, w, dt, gi, o, col, i64):
    from ..te_defs._dense import load
    KK = g.kh * g.kw
    c, r = col // i64(KK), col % i64(KK)
    return load(w, (gi, o, c, r // i64(g.kw), r % i64(g.kw)), dt)


def conv2d_gemm_plan(xshape, wshape, *, strides, padding, dilation, groups: int, layout: str,
                     dtype: str):
    """A forward conv2d as one GEMM per group over the unfolded input (im2col), the samples and
    output positions as the rows, the output channels vectorised: for small feature maps with
    many channels. Parameters as ``conv2d_plan``'s."""
    g = _conv_geometry(xshape, wshape, strides, padding, dilation, groups, layout)
    key = ("relax.conv2d_gemm", tuple(xshape), tuple(wshape), g.s, tuple(padding), g.d, g.G, layout, dtype)

    def make():
        from tvm import te, tirx

        from ..dtypes import dtype as as_dtype
        from ..te_defs._dense import gemm, grain, store
        dt = as_dtype(dtype)
        i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
        x = te.placeholder(tuple(map(i64, g.xv)), dt.storage, name="x")
        w = te.placeholder(tuple(map(i64, g.wv)), dt.storage, name="w")
        P, KK = g.OH * g.OW, g.kh * g.kw
        Mn, Nn, Kn = g.N * P, g.Og, g.Cg * KK
        main = gemm("conv_f", (i64(g.G),), i64(Mn), i64(Nn), i64(Kn),
                    lambda bi, m, k: _x_col(g, x, dt, bi[0], m, k, i64),
                    lambda bi, o, k: _w_col(g, w, dt, bi[0], o, k, i64), dt, grain(Mn), grain(Nn))
        cast = store(dt)
        # the crop reads the contraction affinely (per tile, from registers); the rows are then
        # unflattened into the layout by a plain copy
        rows = te.compute((i64(g.G), i64(Mn), i64(Nn)), lambda gi, m, o: cast(main[gi, m, o]), name="conv_rows")

        def out_f(*i):
            if g.last:
                n, oh, ow, gi, o = i
            else:
                n, gi, o, oh, ow = i
            return rows[gi, n * i64(P) + oh * i64(g.OW) + ow, o]
        out = te.compute(tuple(map(i64, g.ov)), out_f, name="out")
        return _prim_func([x, w, out])

    return _plan("conv2d_gemm", key, make, "gemm_dense"), g


def conv2d_data_grad_gemm_plan(xshape, wshape, *, strides, padding, dilation, groups: int, layout: str,
                               dtype: str):
    """dx of a conv2d as a GEMM into the unfolded input's gradient, dcol[(n, oh, ow), (c, kh, kw)]
    = Σ_o dy[n, o, oh, ow] · w[o, c, kh, kw], then folded back (col2im, as a gather: each input
    element sums the kernel taps that read it). Parameters as ``conv2d_data_grad_plan``'s."""
    g = _conv_geometry(xshape, wshape, strides, padding, dilation, groups, layout)
    key = ("relax.conv2d_data_grad_gemm", tuple(xshape), tuple(wshape), g.s, tuple(padding), g.d, g.G,
           layout, dtype)

    def make():
        from tvm import te, tirx

        from ..dtypes import dtype as as_dtype
        from ..te_defs._dense import gemm, grain, load, store
        dt = as_dtype(dtype)
        acc = dt.compute
        i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
        dy = te.placeholder(tuple(map(i64, g.ov)), dt.storage, name="out_grad")
        w = te.placeholder(tuple(map(i64, g.wv)), dt.storage, name="w")
        P, KK = g.OH * g.OW, g.kh * g.kw
        Mn, Nn, Kn = g.N * P, g.Cg * KK, g.Og

        def dy_at(gi, m, o):
            n, oh, ow = _col_index(g, m, i64)
            return load(dy, (n, oh, ow, gi, o) if g.last else (n, gi, o, oh, ow), dt)

        dcol = gemm("conv_dxc", (i64(g.G),), i64(Mn), i64(Nn), i64(Kn),
                    lambda bi, m, o: dy_at(bi[0], m, o),
                    lambda bi, col, o: _w_col(g, w, dt, bi[0], o, col, i64), dt, grain(Mn), grain(Nn))
        rh = te.reduce_axis((0, i64(g.kh)), name="rh")
        rw = te.reduce_axis((0, i64(g.kw)), name="rw")

        def fold(*i):
            if g.last:
                n, ih, iw, gi, c = i
            else:
                n, gi, c, ih, iw = i
            th = ih + i64(g.lo[0]) - rh * i64(g.d[0])
            tw = iw + i64(g.lo[1]) - rw * i64(g.d[1])
            oh, ow = tirx.floordiv(th, i64(g.s[0])), tirx.floordiv(tw, i64(g.s[1]))
            conds = [th >= 0, tw >= 0, oh < i64(g.OH), ow < i64(g.OW)]
            if g.s[0] > 1:
                conds.append(tirx.floormod(th, i64(g.s[0])) == 0)
            if g.s[1] > 1:
                conds.append(tirx.floormod(tw, i64(g.s[1])) == 0)
            ohc = tirx.max(tirx.min(oh, i64(g.OH - 1)), i64(0))
            owc = tirx.max(tirx.min(ow, i64(g.OW - 1)), i64(0))
            v = dcol[gi, n * i64(P) + ohc * i64(g.OW) + owc, c * i64(KK) + rh * i64(g.kw) + rw]
            return te.sum(tirx.Select(tirx.all(*conds), v, tirx.const(0, acc)), axis=[rh, rw])
        folded = te.compute(tuple(map(i64, g.xv)), fold, name="conv_dx_fold")
        cast = store(dt)
        dx = te.compute(tuple(map(i64, g.xv)), lambda *i: cast(folded[i]), name="x_grad")
        return _prim_func([dy, w, dx])

    return _plan("conv2d_data_grad_gemm", key, make, "gemm_dense"), g


# ------------------------------------------------------------------------------------------
# slicing and pooling backward (gathers: each input element reads the grads that depend on it)

def strided_slice_grad_plan(xshape, outshape, slices, dtype: str) -> Plan:
    """dx of ``strided_slice``: dx[i] = g[j] where, along each sliced axis a, i_a = b_a + j_a·s_a
    (0 ≤ j_a < out_a), else 0. ``slices``: {axis: (normalised begin, stride)}; static shapes.
    Parameters: out_grad, dx."""
    key = ("relax.strided_slice_grad", tuple(xshape), tuple(outshape), tuple(sorted(slices.items())), dtype)

    def make():
        from tvm import te, tirx
        i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
        g = te.placeholder(tuple(map(i64, outshape)), dtype, name="out_grad")

        def f(*i):
            idx, conds = [], []
            for a, v in enumerate(i):
                if a not in slices:
                    idx.append(v)
                    continue
                b, s = slices[a]
                t = v - i64(b)
                j = tirx.floordiv(t, i64(s))
                conds += [tirx.floormod(t, i64(s)) == 0, j >= 0, j < i64(outshape[a])]
                idx.append(tirx.max(tirx.min(j, i64(outshape[a] - 1)), i64(0)))
            return tirx.Select(tirx.all(*conds), g[tuple(idx)], tirx.const(0, dtype))
        dx = te.compute(tuple(map(i64, xshape)), f, name="x_grad")
        return _prim_func([g, dx])

    return _plan("strided_slice_grad", key, make, "generic")


def adaptive_avg_pool2d_grad_plan(xshape, outshape, layout: str, dtype: str) -> Plan:
    """dx of ``adaptive_avg_pool2d``: output cell (i, j) averages rows [⌊i·H/oh⌋, ⌈(i+1)·H/oh⌉)
    and the columns alike; each input element sums g/area over the cells covering it (a
    reduction over the cells whose windows may hold it, from ⌊v·oh/H⌋: at most ⌈oh/H⌉ + 1 per
    axis). Static shapes. Parameters: out_grad, dx."""
    key = ("relax.adaptive_avg_pool2d_grad", tuple(xshape), tuple(outshape), layout, dtype)
    last = layout == "NHWC"
    H, W = (xshape[1], xshape[2]) if last else (xshape[2], xshape[3])
    OH, OW = (outshape[1], outshape[2]) if last else (outshape[2], outshape[3])

    def span(n, o):
        # the cells holding input index v are ⌊v·o/n⌋ ... ⌈(v+1)·o/n⌉ − 1: at most ⌈o/n⌉ + 1
        return min(o, -(-o // n) + 1)

    def make():
        from tvm import te, tirx

        from ..dtypes import dtype as as_dtype
        from ..dtypes import to_compute
        dt = as_dtype(dtype)
        acc = dt.compute
        i64 = lambda v: tirx.const(v, "int64")  # noqa: E731
        g = te.placeholder(tuple(map(i64, outshape)), dt.storage, name="out_grad")
        kh, kw = span(H, OH), span(W, OW)
        rh = te.reduce_axis((0, i64(kh)), name="rh")
        rw = te.reduce_axis((0, i64(kw)), name="rw")

        def first(v, n, o):      # the first cell whose window holds index v
            return tirx.floordiv(v * i64(o), i64(n))

        def f(*i):
            if last:
                nn, h, w, c = i
            else:
                nn, c, h, w = i
            ci = first(h, H, OH) + rh
            cj = first(w, W, OW) + rw
            hs, he = tirx.floordiv(ci * i64(H), i64(OH)), tirx.floordiv((ci + 1) * i64(H) + i64(OH - 1), i64(OH))
            ws, we = tirx.floordiv(cj * i64(W), i64(OW)), tirx.floordiv((cj + 1) * i64(W) + i64(OW - 1), i64(OW))
            ok = tirx.all(ci < i64(OH), cj < i64(OW), hs <= h, h < he, ws <= w, w < we)
            cic = tirx.min(ci, i64(OH - 1))
            cjc = tirx.min(cj, i64(OW - 1))
            idx = (nn, cic, cjc, c) if last else (nn, c, cic, cjc)
            area = ((he - hs) * (we - ws)).astype(acc)
            v = to_compute(g[idx], dt).astype(acc) / area
            return te.sum(tirx.Select(ok, v, tirx.const(0, acc)), axis=[rh, rw])
        red = te.compute(tuple(map(i64, xshape)), f, name="pool_grad")
        dx = te.compute(tuple(map(i64, xshape)), lambda *i: red[i].astype(dt.storage), name="x_grad")
        return _prim_func([g, dx])

    return _plan("adaptive_avg_pool2d_grad", key, make, "generic")
