"""Interpolation and sampling grads: linear/bilinear/trilinear/bicubic/nearest_interp_grad,
grid_sample_grad and affine_grid_grad (``@sample_op`` builders, tvmgrad/families/sample.py).

Semantics are Paddle 3.3.1's CPU kernels (phi/kernels/cpu/interpolate_grad_kernel.cc,
grid_sample_grad_kernel.cc + grid_sample_utils.h, affine_grid_grad_kernel.cc), checked against
the installed binary where the source and the binary could disagree.

**Interpolation.** ``output_grad``'s rank picks 1-D/2-D/3-D and ``interp_method`` the scheme (the
op name does not: Paddle's kernels dispatch on the attribute, whose YAML default is "bilinear"
for every one of these ops). Output size precedence, as the 3.3.1 grad kernel applies it:
``size_tensor`` > ``out_size`` > ``scale_tensor`` > ``scale`` (1 value for 1-D, >= 2 for 2-D,
3 for 3-D; a single value is ignored in 2-D) > ``out_d/out_h/out_w``; a scale also sets the
coordinate ratio (1/scale) even when a size tensor overrides the size. Ratios are float32:
``align_corners``: (in-1)/(out-1); else 1/scale or in/out; 0 when out <= 1. Source coordinates
use Paddle's mixed float/double arithmetic exactly (e.g. ``int(ratio·(o+0.5) − 0.5)`` in double,
``int(ratio·o)`` in float, bicubic's ``floorf``); when every output size equals the input size
the grad is a copy of ``output_grad`` (Paddle's shortcut, whatever the ratio would be).
``data_format``: "NCHW"/"NCW"/"NCDHW" are channel-first, "NHWC"/"NWC"/"NDHWC" channel-last, for
the matching rank ("NCHW"/"NHWC" for any rank, as Paddle's kernels use them). (Paddle's C op
treats every string but "NCHW" as channel-last, "NCDHW" included, and rejects "NCW"/"NWC"; its
Python API maps those names first. tvmgrad follows the names.)

The grad is a scatter (each output pixel adds into 2/4/1 input pixels per dim); it is computed as
a gather over the inverse map, separably per dim: for input index i along a dim, the output
indices that reach it form one contiguous range [lo(i), hi(i)) (the source index is monotone in
the output index), found from the ratio and corrected by evaluating Paddle's index formula at a
few points; a table per dim holds each (i, j)'s output index lo(i)+j (−1 past hi(i)) and the sum
of the weights with which it reaches i. Then

    x_grad[n, c, i_d, i_h, i_w] = Σ_{j_d, j_h, j_w} Ω_d[i_d, j_d]·Ω_h[i_h, j_h]·Ω_w[i_w, j_w]
                                  · output_grad[n, c, o_d, o_h, o_w]

with one owner per input element (deterministic, no atomics), the taps past a range masked out
(so an inf/NaN gradient reaches exactly the inputs it reaches in Paddle). Weights are float32 for
the linear schemes (Paddle's d_w/d_e are float for every T), T for bicubic; products and sums run
in float64 for float64 data, float32 otherwise. Calls whose scale contradicts the output size so
that a source index passes the input's end (Paddle writes out of bounds) are a ValueError.

**grid_sample.** x [N, C, (D,) H, W], grid [N, (Do,) Ho, Wo, 2|3]. Paddle's CPU grad: grid
unnormalised ((g+1)·(S−1)/2, or (g+1)·S/2 − 0.5), clipped (border) or reflected (reflection) with
the clip/flip slope kept for grid_grad, corners floor/floor+1, out-of-range corners skipped;
nearest rounds half away from zero (2-D: round, then bounds; 3-D: bounds on the unrounded value,
then round, as Paddle does) and has a zero grid_grad. x_grad is a scatter with data-dependent
targets: one owner per (n, c) plane walks the output positions in order (deterministic);
grid_grad is a gather (a sum over channels per output position). A NaN grid coordinate makes
Paddle write out of bounds (``int(round(NaN))``); here it reaches no input and gives NaN in
grid_grad.

**affine_grid.** theta_grad[n] = Σ_{h,w} output_grad[n,h,w,:]ᵀ·[x_w, y_h, 1] (2-D) with Paddle's
linspace (start + i·step in T; align_corners=False scales start by (S−1)/S and uses step 2/S).
A size-1 dim with align_corners=True makes Paddle's step 2/0 = inf and its base grid NaN: here the
grid coordinate is 0 there (the centre, what the limit and PyTorch give).
"""

from __future__ import annotations

import math

import numpy as np

from tvmgrad.dtypes import to_compute
from tvmgrad.families.sample import Host, sample_op
from tvmgrad.lazy import te, tirx

from ._extern import (acc_dtype, at_least_one, cast_to, ceildiv, extern, i64, proxy, scratch,
                      within)
from ._math import cast, const, f32, f64, mul_f32, where
from ._plan import fail, host_array

# ------------------------------------------------------------------------------------------
# Interpolation: host side (exact replicas of Paddle's index arithmetic in numpy)

LAYOUTS = {
    # name -> (channel_last, ranks it may be used with)
    "NCHW": (False, (3, 4, 5)), "NHWC": (True, (3, 4, 5)),
    "NCW": (False, (3,)), "NWC": (True, (3,)),
    "NCDHW": (False, (5,)), "NDHWC": (True, (5,)),
}
METHODS = {"linear": (3,), "bilinear": (4,), "trilinear": (5,), "bicubic": (4,), "nearest": (4, 5)}
DIM_NAMES = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}


def _np_src_f(r32, o):
    """float32 r·(o + 0.5f) − 0.5f, each step rounded (no fused multiply-add)."""
    return np.float32(np.float32(r32 * np.float32(o.astype(np.float32) + np.float32(0.5)))
                      - np.float32(0.5))


def _np_base(method, o, r, S, d, align_corners, align_flag):
    """Paddle 3.3.1's source index of output indices ``o`` (int64 array) along dim ``d`` of an
    S-D interpolation: the first tap for linear (x_w), the nearest index, bicubic's floorf(x_n).
    (The linear taps use double arithmetic in 1-D and for H in 2-D, float elsewhere.)"""
    r32 = np.float32(r)
    prod = np.float32(r32 * o.astype(np.float32))
    if method == "nearest":
        if not align_corners:
            return np.trunc(prod).astype(np.int64)
        if S == 3:                                          # std::lround
            return np.floor(prod.astype(np.float64) + 0.5).astype(np.int64)
        return np.trunc(np.float32(prod + np.float32(0.5))).astype(np.int64)
    if method == "bicubic":
        xn = prod if align_corners else _np_src_f(r32, o)
        return np.floor(xn).astype(np.int64)
    if not align_flag:
        v = prod
    elif S == 1 or (S == 2 and d == 0):
        v = np.float64(r32) * (o.astype(np.float64) + 0.5) - 0.5
    else:
        v = _np_src_f(r32, o)
    return np.maximum(np.trunc(v).astype(np.int64), 0)


def _np_ranges(method, base, in_size, out):
    """[lo(i), hi(i)) of the output indices reaching input index i (numpy, from the base)."""
    i = np.arange(in_size, dtype=np.int64)

    def F(k):
        return np.searchsorted(base, k, side="left")

    if method == "nearest":
        return F(i), F(i + 1)
    if method == "bicubic":
        lo = np.where(i == 0, 0, F(i - 2))
        hi = np.where(i == in_size - 1, out, F(i + 2))
        return lo, hi
    return F(i - 1), F(i + 1)


def _np_ratio(S, i_n, o_n, scale, align_corners):
    """Paddle's float32 coordinate ratio along one dim (AreaPixelComputeScale<float>, zeroed for
    an output size <= 1 in 1-D and 2-D but not in 3-D, as 3.3.1 does)."""
    f = np.float32
    if align_corners:
        r = f(f(i_n - 1) / f(o_n - 1)) if o_n > 1 else f(0.0)
    elif scale > 0:
        r = f(1.0 / np.float64(f(scale)))
    elif o_n > 0:
        r = f(f(i_n) / f(o_n))
    else:
        r = f(0.0)
    if S < 3 and o_n <= 1:
        r = f(0.0)
    return r


def _read_ints(call, name, what):
    arr = host_array(call, name)
    vals = []
    for a in (arr if isinstance(arr, list) else [arr]):
        if a.dtype.kind not in "iu":
            fail(call.op, f"input {name!r} must hold integers ({what}), got dtype {a.dtype}")
        vals.append(a)
    return vals


def _interp_host(call, outs, dt):
    op = call.op
    a = call.attrs
    h = Host()
    h.host_only = {"out_size", "size_tensor", "scale_tensor"}
    xm, gm = call.meta("x"), call.meta("output_grad")
    if xm.dtype != gm.dtype:
        raise TypeError(f"{op}: input 'x' has dtype {xm.dtype.name} but 'output_grad' has "
                        f"{gm.dtype.name}; they must match")
    rank = gm.ndim
    if rank not in (3, 4, 5):
        fail(op, f"input 'output_grad' must be 3-D, 4-D or 5-D, got shape {list(gm.shape)}")
    if xm.ndim != rank:
        fail(op, f"input 'x' has rank {xm.ndim} but 'output_grad' has rank {rank}; they must match")
    fmt = a["data_format"]
    if fmt not in LAYOUTS:
        fail(op, f"attribute 'data_format' is {fmt!r}; expected one of {', '.join(LAYOUTS)}")
    last, ranks = LAYOUTS[fmt]
    if rank not in ranks:
        fail(op, f"attribute 'data_format' {fmt!r} does not fit a {rank}-D input")
    if a["align_mode"] not in (0, 1):
        fail(op, f"attribute 'align_mode' must be 0 or 1, got {a['align_mode']}")
    method = a["interp_method"]
    if method not in METHODS:
        fail(op, f"attribute 'interp_method' is {method!r}; expected one of {', '.join(METHODS)}")
    if rank not in METHODS[method]:
        fail(op, f"attribute 'interp_method' {method!r} needs a "
                 f"{' or '.join(f'{r}-D' for r in METHODS[method])} input, got {rank}-D "
                 f"(Paddle's kernel silently returns zeros)")
    S = rank - 2
    names = DIM_NAMES[S]
    n_c = (xm.shape[0], xm.shape[-1] if last else xm.shape[1])
    in_sizes = list(xm.shape[1:-1] if last else xm.shape[2:])
    g_nc = (gm.shape[0], gm.shape[-1] if last else gm.shape[1])
    g_sizes = list(gm.shape[1:-1] if last else gm.shape[2:])
    if g_nc != n_c:
        fail(op, f"input 'output_grad' has shape {list(gm.shape)}: its batch and channel sizes "
                 f"{list(g_nc)} differ from x's {list(n_c)} (data_format {fmt})")
    # --- output size by Paddle's precedence -------------------------------------------------
    out_attr = {"d": a["out_d"], "h": a["out_h"], "w": a["out_w"]}
    out_sizes = [out_attr[nm] for nm in names]
    source = "attributes " + ", ".join(repr(f"out_{nm}") for nm in names)
    scales = [-1.0] * S
    st = host_array(call, "scale_tensor")
    if st is not None:
        if st.dtype.kind != "f" and str(st.dtype) != "bfloat16":
            fail(op, f"input 'scale_tensor' must hold floats, got dtype {st.dtype}")
        vals = np.asarray(st, dtype=np.float32).reshape(-1)
        if vals.size == 0:
            fail(op, "input 'scale_tensor' is empty")
        if S == 1 or vals.size == 1:
            scales = [float(vals[0])] * S
        else:
            if vals.size < S:
                fail(op, f"input 'scale_tensor' holds {vals.size} values; a {S}-D "
                         f"interpolation needs 1 or {S}")
            scales = [float(v) for v in vals[:S]]
        if not all(s > 0 for s in scales):
            fail(op, f"input 'scale_tensor' holds {vals.tolist()}; scales must be > 0")
    elif len(a["scale"]) > (0 if S == 1 else 1):
        sc = [float(np.float32(v)) for v in a["scale"]]
        if len(sc) < S:
            fail(op, f"attribute 'scale' has {len(sc)} values; a {S}-D interpolation needs {S} "
                     f"(Paddle reads past its end)")
        scales = sc[:S]
        if not all(s > 0 for s in scales):
            fail(op, f"attribute 'scale' is {list(a['scale'])}; scales must be > 0")
    if all(s > 0 for s in scales):
        out_sizes = [int(np.float32(i) * np.float32(s)) for i, s in zip(in_sizes, scales)]
        source = (f"{'input scale_tensor' if st is not None else 'attribute scale'} {scales} "
                  f"times the spatial size {in_sizes} of 'x'")
    if call.tensors.get("out_size") is not None:
        (os_,) = _read_ints(call, "out_size", "the output size")
        os_ = os_.reshape(-1)
        if os_.size < S:
            fail(op, f"input 'out_size' holds {os_.size} values; a {S}-D interpolation needs {S}")
        out_sizes = [int(v) for v in os_[:S]]
        source = "input 'out_size'"
    if call.tensors.get("size_tensor") is not None and len(call.tensors["size_tensor"]) > 0:
        parts = _read_ints(call, "size_tensor", "the output size")
        for i, p in enumerate(parts):
            if p.size != 1 or p.ndim > 1:
                fail(op, f"input 'size_tensor[{i}]' must have shape [1] or [], got "
                         f"{list(p.shape)}")
        if len(parts) < S:
            fail(op, f"input 'size_tensor' holds {len(parts)} tensors; a {S}-D interpolation "
                     f"needs {S}")
        out_sizes = [int(p.reshape(-1)[0]) for p in parts[:S]]
        source = "input 'size_tensor'"
    if out_sizes != g_sizes:
        fail(op, f"input 'output_grad' has spatial size {g_sizes} but the output size given by "
                 f"{source} (Paddle's precedence: size_tensor, out_size, scale, "
                 f"out_{'/out_'.join(names)}) is {out_sizes}")
    if in_sizes == out_sizes:
        h.alias = {"x_grad": "output_grad"}       # Paddle copies output_grad
        return h
    if 0 in out_sizes or 0 in in_sizes or 0 in n_c:
        h.static = {"zero": True, "last": last, "S": S}
        return h
    align_corners = bool(a["align_corners"])
    align_flag = a["align_mode"] == 0 and not align_corners
    statics = {"method": method, "last": last, "S": S, "align_corners": align_corners,
               "align_flag": align_flag}
    for d, (nm, i_n, o_n, s) in enumerate(zip(names, in_sizes, out_sizes, scales)):
        ratio = _np_ratio(S, i_n, o_n, s, align_corners)
        o = np.arange(o_n, dtype=np.int64)
        base = _np_base(method, o, ratio, S, d, align_corners, align_flag)
        if method != "bicubic" and o_n and i_n and base[-1] > i_n - 1:
            fail(op, f"output index {o_n - 1} along {nm} maps to input index {int(base[-1])}, "
                     f"past the input size {i_n}: the scale {s} does not fit the output size "
                     f"{o_n} (Paddle writes out of bounds here)")
        if i_n:
            lo, hi = _np_ranges(method, base, i_n, o_n)
            width = int((hi - lo).max()) if i_n else 0
        else:
            width = 0
        h.scalars[f"ratio_{nm}"] = ("float32", float(ratio))
        h.scalars[f"taps_{nm}"] = ("int64", max(width, 0))
    h.static = statics
    return h


# ------------------------------------------------------------------------------------------
# Interpolation: kernel side

def _k_src_f(r, o):
    """TIR float32 r·(o + 0.5f) − 0.5f, each step rounded (see mul_f32)."""
    return mul_f32(r, f32(o) + f32(0.5)) - f32(0.5)


def _k_base(method, o, r, S, d, align_corners, align_flag):
    """TIR replica of _np_base for output index expression ``o`` (int64). (Float values are never
    let-bound or repeated in one expression: TVM 0.27's LowerIntrin crashes on a CSE'd float
    product of an index cast, so per-output-index values go through table stages.)"""
    prod = mul_f32(r, f32(o))
    if method == "nearest":
        if not align_corners:
            return i64(prod)
        if S == 3:
            return i64(tirx.floor(f64(prod) + 0.5))
        return i64(prod + f32(0.5))
    if method == "bicubic":
        raise AssertionError("bicubic bases come from the x_n table")
    if not align_flag:
        v = prod
    elif S == 1 or (S == 2 and d == 0):
        v = f64(r) * (f64(o) + 0.5) - 0.5
    else:
        v = _k_src_f(r, o)
    return tirx.max(i64(v), i64(0))


def _k_bicubic_xn(o, r, align_corners, cdt):
    """Bicubic's source coordinate: float32 arithmetic, then widened to MT (double for double)."""
    return cast(mul_f32(r, f32(o)) if align_corners else _k_src_f(r, o), cdt)


def _k_estimate(k, method, r, align_corners, align_flag):
    """floor of the real threshold t with base(o) < k  <=>  o < t (about), as int64."""
    kf = f64(k)
    rf = f64(r)
    if method == "nearest":
        t = (kf - 0.5) / rf if align_corners else kf / rf
    elif (method == "bicubic" and not align_corners) or (method != "bicubic" and align_flag):
        t = (kf + 0.5) / rf - 0.5
    else:
        t = kf / rf
    t = where(rf > 0.0, t, f64(-8.0))
    return i64(tirx.floor(tirx.min(tirx.max(t, f64(-8.0)), f64(float(2 ** 40)))))


def _k_count_below(k, est, base, method, out, r):
    """#{o in [0, out): base[o] < k}, given the estimate ``est`` of it (an int64 load, off by
    at most one): corrected exactly by reading the base table at the five indices around it."""
    last = tirx.max(i64(out) - 1, i64(0))
    c = tirx.min(tirx.max(est - 2, i64(0)), i64(out))
    cnt = c
    for j in range(5):
        oj = c + j
        ok = tirx.all(oj < i64(out), base[tirx.min(oj, last)] < k)
        cnt = cnt + where(ok, i64(1), i64(0))
    # ratio 0 (a single output, or align_corners with a single input): every base is base[0]
    cnt = where(f32(r) > f32(0.0), cnt, where(base[0] < k, i64(out), i64(0)))
    floor_k = -1 if method == "bicubic" else 0
    return where(k <= floor_k, i64(0), cnt)


def _tables(nm, S, d, method, in_size, out, r, W, align_corners, align_flag, cdt, adt):
    """Per dim: lo[i] (first output index reaching input index i), cnt[i] (how many do) and
    wt[i, j] (the summed weight with which output lo[i]+j reaches i)."""
    last_in = i64(in_size) - 1
    if method == "bicubic":
        xn = te.compute((out,), lambda o: _k_bicubic_xn(o, r, align_corners, cdt), name=f"xn_{nm}")
        base = te.compute((out,), lambda o: i64(tirx.floor(f32(xn[o]))), name=f"base_{nm}")
        A = const(-0.75, cdt)
        one = const(1.0, cdt)

        def cc1(x):
            return ((A + const(2.0, cdt)) * x - (A + const(3.0, cdt))) * x * x + one

        def cc2(x):
            return ((A * x - const(5.0, cdt) * A) * x + const(8.0, cdt) * A) * x - \
                const(4.0, cdt) * A

        def tt(o):
            return xn[o] - cast(base[o], cdt)

        coef = [te.compute((out,), lambda o: cc2(tt(o) + one), name=f"c0_{nm}"),
                te.compute((out,), lambda o: cc1(tt(o)), name=f"c1_{nm}"),
                te.compute((out,), lambda o: cc1(one - tt(o)), name=f"c2_{nm}"),
                te.compute((out,), lambda o: cc2((one - tt(o)) + one), name=f"c3_{nm}")]

        def taps(o):
            return [(tirx.min(tirx.max(base[o] - 1 + k, i64(0)), last_in), coef[k][o])
                    for k in range(4)]
    else:
        base = te.compute((out,), lambda o: _k_base(method, o, r, S, d, align_corners, align_flag),
                          name=f"base_{nm}")
        if method == "nearest":
            def taps(o):
                return [(base[o], const(1.0, "float32"))]
        else:
            if align_flag:
                def dw_f(o):
                    return tirx.max(_k_src_f(r, o), f32(0.0)) - f32(base[o])
            else:
                def dw_f(o):
                    return mul_f32(r, f32(o)) - f32(base[o])
            dw = te.compute((out,), dw_f, name=f"dw_{nm}")

            def taps(o):
                xe = where(base[o] + 1 < last_in, base[o] + 1, last_in)
                return [(base[o], f32(1.0) - dw[o]), (xe, dw[o])]

    lo_k = {"nearest": 0, "bicubic": 2}.get(method, 1)
    hi_k = {"nearest": 1, "bicubic": 2}.get(method, 1)

    est_lo = te.compute((in_size,), lambda i: _k_estimate(i - lo_k, method, r, align_corners,
                                                         align_flag), name=f"est_lo_{nm}")
    est_hi = te.compute((in_size,), lambda i: _k_estimate(i + hi_k, method, r, align_corners,
                                                         align_flag), name=f"est_hi_{nm}")

    def lo_f(i):
        v = _k_count_below(i - lo_k, est_lo[i], base, method, out, r)
        return where(i == 0, i64(0), v) if method == "bicubic" else v

    def hi_f(i):
        v = _k_count_below(i + hi_k, est_hi[i], base, method, out, r)
        return where(i == last_in, i64(out), v) if method == "bicubic" else v

    lo = te.compute((in_size,), lo_f, name=f"lo_{nm}")
    hi = te.compute((in_size,), hi_f, name=f"hi_{nm}")

    def wt_f(i, j):
        o = tirx.min(lo[i] + j, tirx.max(i64(out) - 1, i64(0)))
        total = const(0.0, adt)
        for ti, wi in taps(o):
            total = total + where(ti == i, cast(wi, adt), const(0.0, adt))
        return total

    def flag_f(i, j):
        """1 where the taps merged into wt[i, j] include a zero weight or weights of both signs:
        an infinite gradient then makes NaN in Paddle's tap-by-tap sums (inf·0, inf − inf)."""
        o = tirx.min(lo[i] + j, tirx.max(i64(out) - 1, i64(0)))
        zero, pos, neg = i64(0), i64(0), i64(0)
        for ti, wi in taps(o):
            hit = ti == i
            wi = wi.asobject() if hasattr(wi, "asobject") else wi
            zero = tirx.max(zero, where(tirx.all(hit, wi == const(0.0, str(wi.ty))), i64(1), i64(0)))
            pos = tirx.max(pos, where(tirx.all(hit, wi > const(0.0, str(wi.ty))), i64(1), i64(0)))
            neg = tirx.max(neg, where(tirx.all(hit, wi < const(0.0, str(wi.ty))), i64(1), i64(0)))
        return tirx.max(zero, pos * neg)

    cnt = te.compute((in_size,), lambda i: tirx.max(hi[i] - lo[i], i64(0)), name=f"cnt_{nm}")
    wt = te.compute((in_size, W), wt_f, name=f"wt_{nm}")
    if method == "nearest":
        return lo, cnt, wt, None
    flag = te.compute((in_size, W), flag_f, name=f"nanflag_{nm}")
    return lo, cnt, wt, flag


def _split_weights(wt, flag, nm):
    """Each merged tap's weight as two coefficients whose products with a gradient add up to
    its product with the weight, special values included, without a test per tap: (w/2, w/2)
    (exact: a halving), and (w, 0) for a flagged tap (a zero part or parts of both signs), where
    an infinite gradient then gives inf·0 = NaN as Paddle's tap-by-tap sums do."""
    adt = str(wt.dtype)
    half, zero = const(0.5, adt), const(0.0, adt)
    first = te.compute(wt.shape, lambda i, j: where(flag[i, j] > i64(0), wt[i, j], wt[i, j] * half),
                       name=f"wa_{nm}")
    second = te.compute(wt.shape, lambda i, j: where(flag[i, j] > i64(0), zero, wt[i, j] * half),
                        name=f"wb_{nm}")
    return [first, second]


def _bilinear_rows(body, ins, outs, dt, insp, when):
    """Channel-first bilinear x_grad on the CPU, in two passes per input row (n, c, i) of the
    separable map: the rows of output_grad reaching i summed with their H weights into a row of
    out_w sums (a contiguous loop LLVM vectorises), then each x_grad[n, c, i, j] gathered from
    that row with its W weights: about half the multiply-adds of the 2-D gather, most of them in
    vectors. Weights as two coefficients each (``_split_weights``): no test per tap, and an
    infinite gradient makes NaN where it does in Paddle (the H pass leaves an infinite sum where
    an infinite gradient reaches). ``ins``: output_grad, the 2-D gather's tables (lo, cnt, wt,
    flag of H, then of W), then the two coefficients of H and of W."""
    from tvm.script.ir_builder import tirx as T
    adt = acc_dtype(dt)
    G = proxy(ins[0])
    lo_h, cnt_h, _, _, lo_w, cnt_w = (proxy(b) for b in ins[1:7])
    wa_h, wb_h, wa_w, wb_w = (proxy(b) for b in ins[-4:])
    O = proxy(outs[0])
    n_, c_, _, out_w = ins[0].shape

    def row(P, _S):
        n, c, i = (T.bind(p) for p in P)
        sums = proxy(scratch((out_w,), adt))
        with T.serial(0, out_w) as o:
            sums[o] = const(0.0, adt)
        lo = T.bind(lo_h[i])
        with T.serial(0, cnt_h[i]) as a:
            wa, wb = T.bind(wa_h[i, a]), T.bind(wb_h[i, a])
            with T.serial(0, out_w) as o:
                val = T.bind(cast(to_compute(G[n, c, lo + a, o], dt), adt))
                sums[o] = sums[o] + (wa * val + wb * val)
        acc = proxy(scratch((1,), adt, word_aligned=True))
        with T.serial(0, insp[1]) as j:
            acc[0] = const(0.0, adt)
            first = T.bind(lo_w[j])
            with T.serial(0, cnt_w[j]) as b:
                val = T.bind(sums[first + b])
                acc[0] = acc[0] + (wa_w[j, b] * val + wb_w[j, b] * val)
            O[n, c, i, j] = cast(acc[0], dt.storage)

    body.block("rows", row, par=[n_, c_, insp[0]], reads=list(ins), writes=list(outs),
               when=when)


def _interp_kernel(ctx, output_grad, insp):
    """x_grad as a gather over the per-dim tables (see the module docstring): one owner per
    input element loops over the exact output ranges reaching it (channel-first bilinear on the
    CPU: per input row, ``_bilinear_rows``)."""
    st, s, dt = ctx.info, ctx.scalars, ctx.dtype
    method, last, S = st["method"], st["last"], st["S"]
    ac, af = st["align_corners"], st["align_flag"]
    adt = acc_dtype(dt)
    cdt = "float64" if dt.compute == "float64" else "float32"
    names = DIM_NAMES[S]
    g = output_grad
    gsp = list(g.shape[1:-1] if last else g.shape[2:])
    n_, c_ = (g.shape[0], g.shape[-1]) if last else (g.shape[0], g.shape[1])
    tabs = []
    for d, nm in enumerate(names):
        lo_t, cnt_t, wt_t, fl_t = _tables(nm, S, d, method, insp[d], gsp[d], s[f"ratio_{nm}"],
                                          s[f"taps_{nm}"], ac, af, cdt, adt)
        tabs += [lo_t, cnt_t, wt_t] + ([fl_t] if fl_t is not None else [])
    per = 3 if method == "nearest" else 4
    out_shape = [n_] + list(insp) + [c_] if last else [n_, c_] + list(insp)
    rows = method == "bilinear" and not last      # the CPU's two passes (_bilinear_rows)
    if rows:
        for d, nm in enumerate(names):
            tabs += _split_weights(tabs[per * d + 2], tabs[per * d + 3], nm)

    def gen(ins, outs, body):
        G = proxy(ins[0])
        tb = [proxy(b) for b in ins[1:]]
        O = proxy(outs[0])

        def blk(P, _S):
            from tvm.script.ir_builder import tirx as T
            ids = [T.bind(p) for p in P]
            if last:
                n, sp, c = ids[0], ids[1:-1], ids[-1]
            else:
                n, c, sp = ids[0], ids[1], ids[2:]
            acc = proxy(scratch((1,), adt, word_aligned=True))
            acc[0] = const(0.0, adt)
            los = [T.bind(tb[per * d][sp[d]]) for d in range(S)]
            cnts = [T.bind(tb[per * d + 1][sp[d]]) for d in range(S)]

            def nest(d, js):
                if d == S:
                    w, flag = None, None
                    for dd, j in enumerate(js):
                        wj = tb[per * dd + 2][sp[dd], j]
                        w = wj if w is None else w * wj
                        if per == 4:
                            fj = tb[per * dd + 3][sp[dd], j]
                            flag = fj if flag is None else tirx.max(flag, fj)
                    src = [los[dd] + j for dd, j in enumerate(js)]
                    gi = [n] + src + [c] if last else [n, c] + src
                    val = cast(to_compute(G[tuple(gi)], dt), adt)
                    term = w * val
                    if flag is not None:        # Paddle's inf·0 or inf − inf over the taps
                        term = where(tirx.all(flag > i64(0), tirx.isinf(val)),
                                      const(float("nan"), adt), term)
                    acc[0] = acc[0] + term
                    return
                with T.serial(0, cnts[d]) as j:
                    nest(d + 1, js + [j])

            nest(0, [])
            O[tuple(ids)] = cast(acc[0], dt.storage)

        if not rows:
            body.block("gather", blk, par=out_shape, reads=list(ins), writes=list(outs),
                       inner=True)
            return
        on_cuda = ctx.on_cuda()
        body.block("gather", blk, par=out_shape, reads=list(ins), writes=list(outs), inner=True,
                   when=on_cuda == 1)
        _bilinear_rows(body, ins, outs, dt, insp, on_cuda == 0)

    (x_grad,) = extern("x_grad", [(out_shape, dt.storage)], [g] + tabs, gen, lanes=False)
    return x_grad


def _interp_builder(ctx, output_grad):
    st = ctx.info
    # x is no_need_buffer: its spatial sizes are symbolic vars bound by the x_grad buffer
    insp = [te.var(f"in_{nm}", "int64") for nm in DIM_NAMES[st["S"]]]
    if st.get("zero"):
        g = output_grad
        shape = ([g.shape[0]] + insp + [g.shape[-1]]) if st["last"] else [g.shape[0], g.shape[1]] + insp
        return te.compute(shape, lambda *i: const(0.0, ctx.dtype.storage), name="x_grad")
    return _interp_kernel(ctx, output_grad, insp)


def _interp_op(fn):
    return sample_op(fn, host=_interp_host, float_inputs=("x", "output_grad"),
                     pattern="gather_owners")


@_interp_op
def linear_interp_grad(x, out_size, size_tensor, scale_tensor, output_grad, data_format, out_d,
                       out_h, out_w, scale, interp_method, align_corners, align_mode, ctx):
    """x_grad = (the linear-interpolation map)ᵀ · output_grad (see the module docstring)"""
    return _interp_builder(ctx, output_grad)


@_interp_op
def bilinear_interp_grad(x, out_size, size_tensor, scale_tensor, output_grad, data_format, out_d,
                         out_h, out_w, scale, interp_method, align_corners, align_mode, ctx):
    """x_grad = (the bilinear-interpolation map)ᵀ · output_grad (see the module docstring)"""
    return _interp_builder(ctx, output_grad)


@_interp_op
def trilinear_interp_grad(x, out_size, size_tensor, scale_tensor, output_grad, data_format,
                          out_d, out_h, out_w, scale, interp_method, align_corners, align_mode,
                          ctx):
    """x_grad = (the trilinear-interpolation map)ᵀ · output_grad (see the module docstring)"""
    return _interp_builder(ctx, output_grad)


@_interp_op
def bicubic_interp_grad(x, out_size, size_tensor, scale_tensor, output_grad, data_format, out_d,
                        out_h, out_w, scale, interp_method, align_corners, align_mode, ctx):
    """x_grad = (the bicubic-interpolation map, A = −0.75, clamped taps)ᵀ · output_grad"""
    return _interp_builder(ctx, output_grad)


@_interp_op
def nearest_interp_grad(x, out_size, size_tensor, scale_tensor, output_grad, data_format, out_d,
                        out_h, out_w, scale, interp_method, align_corners, align_mode, ctx):
    """x_grad = (the nearest-neighbour map)ᵀ · output_grad (see the module docstring)"""
    return _interp_builder(ctx, output_grad)


# ------------------------------------------------------------------------------------------
# grid_sample

GRID_MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border", "reflection")
RUN = 64    # output positions a CPU grid_grad task sums together, channel by channel


def _grid_host(call, outs, dt):
    op, a = call.op, call.attrs
    h = Host()
    xm, gm, om = call.meta("x"), call.meta("grid"), call.meta("out_grad")
    if xm.ndim not in (4, 5):
        fail(op, f"input 'x' must be 4-D [N, C, H, W] or 5-D [N, C, D, H, W], got shape "
                 f"{list(xm.shape)}")
    S = xm.ndim - 2
    want_grid = "[N, H_out, W_out, 2]" if S == 2 else "[N, D_out, H_out, W_out, 3]"
    if gm.ndim != S + 2 or gm.shape[-1] != S or gm.shape[0] != xm.shape[0]:
        fail(op, f"input 'grid' must be {want_grid} for x of shape {list(xm.shape)}, got "
                 f"{list(gm.shape)}")
    want = (xm.shape[0], xm.shape[1]) + tuple(gm.shape[1:-1])
    if tuple(om.shape) != want:
        fail(op, f"input 'out_grad' must have shape {list(want)} (x's [N, C] and grid's output "
                 f"size), got {list(om.shape)}")
    if a["mode"] not in GRID_MODES:
        fail(op, f"attribute 'mode' is {a['mode']!r}; expected one of {', '.join(GRID_MODES)}")
    if a["padding_mode"] not in PADDINGS:
        fail(op, f"attribute 'padding_mode' is {a['padding_mode']!r}; expected one of "
                 f"{', '.join(PADDINGS)}")
    N, C = xm.shape[:2]
    P, Q = math.prod(xm.shape[2:]), math.prod(gm.shape[1:-1])
    h.views = {"x": (N, C, P), "x_grad": (N, C, P), "out_grad": (N, C, Q), "grid": (N, Q, S),
               "grid_grad": (N, Q, S)}
    # spatial sizes, x (W) first: the views hide them
    h.scalars = {f"size{ax}": ("int64", int(xm.shape[-1 - ax])) for ax in range(S)}
    h.static = {"S": S, "mode": a["mode"], "padding": a["padding_mode"],
                "align_corners": bool(a["align_corners"])}
    return h


def _round_even(v):
    """Round half to even, as Paddle 3.3.1's grid_sample nearest does (Eigen's vectorised round):
    written out because TVM's ``round`` is half-to-even on LLVM but half-away on CUDA."""
    if hasattr(v, "asobject"):
        v = v.asobject()
    dt_ = str(v.ty)
    c = lambda x: tirx.const(x, dt_)  # noqa: E731
    r = tirx.floor(v)
    frac = v - r
    odd = (r - tirx.floor(r * c(0.5)) * c(2.0)) != c(0.0)
    up = tirx.any(frac > c(0.5), tirx.all(frac == c(0.5), odd))
    return r + where(up, c(1.0), c(0.0))


def _grid_coords(grid, dt, axis, size, pad, ac, cdt, name):
    """Paddle's unnormalised, clipped/reflected coordinate along ``axis`` (0: x/W, 1: y/H,
    2: z/D) and its slope (grid_grad scale), as tables [N, Q] in the compute dtype. Each
    rounding step of Paddle's (Eigen, unfused) arithmetic is its own stage so that no fused
    multiply-add can change a floor."""
    shape = list(grid.shape[:-1])
    mx = i64(size) - 1
    c = lambda v: const(v, cdt)  # noqa: E731
    mxf = cast(mx, "float64")
    factor = cast(mxf * 0.5 if ac else (mxf + 1.0) * 0.5, cdt)
    u = te.compute(shape, lambda n, o: (to_compute(grid[n, o, axis], dt).astype(cdt)
                                        + c(1.0)) * factor, name=f"{name}_u")
    c0 = u if ac else te.compute(shape, lambda n, o: u[n, o] - c(0.5), name=f"{name}_c0")
    if pad == "zeros":
        scale = te.compute(shape, lambda n, o: factor, name=f"{name}_s")
        return c0, scale
    if pad == "border":
        coord = te.compute(shape, lambda n, o: tirx.min(tirx.max(c0[n, o], c(0.0)), cast(mx, cdt)),
                           name=f"{name}_c")
        scale = te.compute(shape, lambda n, o: where(coord[n, o] == c0[n, o], factor, c(0.0)),
                           name=f"{name}_s")
        return coord, scale
    # reflection
    dr = cast(mxf * 2.0 if ac else (mxf + 1.0) * 2.0, cdt)
    base = c0 if ac else te.compute(shape, lambda n, o: c0[n, o] + c(0.5), name=f"{name}_b")
    q = te.compute(shape, lambda n, o: tirx.floor(tirx.abs(base[n, o]) / dr) * dr,
                   name=f"{name}_q")
    extra = te.compute(shape, lambda n, o: tirx.abs(base[n, o]) - q[n, o], name=f"{name}_e")

    def sign(n, o):
        neg = base[n, o] < c(0.0)
        flip = extra[n, o] > dr - extra[n, o]
        return where(neg, where(flip, c(1.0), c(-1.0)), where(flip, c(-1.0), c(1.0)))

    if ac:
        coord = te.compute(shape, lambda n, o: where(mx == 0, c(0.0),
                                                      tirx.min(extra[n, o], dr - extra[n, o])),
                           name=f"{name}_c")
        scale = te.compute(shape, lambda n, o: factor * sign(n, o), name=f"{name}_s")
        return coord, scale
    refl = te.compute(shape, lambda n, o: tirx.min(extra[n, o], dr - extra[n, o]) - c(0.5),
                      name=f"{name}_r")
    coord = te.compute(shape, lambda n, o: tirx.min(tirx.max(refl[n, o], c(0.0)), cast(mx, cdt)),
                       name=f"{name}_c")
    scale = te.compute(shape, lambda n, o: where(coord[n, o] == refl[n, o], factor * sign(n, o),
                                                  c(0.0)), name=f"{name}_s")
    return coord, scale


def _in_bound(vals, sizes, cdt):
    """Paddle's IsInBound (0 <= v <= size-1 for each coordinate; NaN counts as outside)."""
    conds = []
    for v, n in zip(vals, sizes):
        conds += [v >= const(0.0, cdt), v <= cast(i64(n) - 1, cdt)]
    return tirx.all(*conds)


def _corner_order(S):
    """Paddle's corner order as per-axis picks (x, y[, z]) with 0 = low, 1 = high:
    (x_w, y_n), (x_w, y_s), (x_e, y_n), (x_e, y_s) [, then the far z plane]."""
    import itertools
    out = []
    for bits in itertools.product((0, 1), repeat=S):
        if S == 2:
            out.append((bits[0], bits[1]))
        else:
            out.append((bits[1], bits[2], bits[0]))
    return out


# grid_grad terms per axis: the other axes' corner picks (0 low, 1 high) in Paddle's summation
# order, e.g. 2-D x: (v_en − v_wn)·d_s + (v_es − v_ws)·d_n
_GRAD_TERMS = {
    2: {0: [{1: 0}, {1: 1}], 1: [{0: 0}, {0: 1}]},
    3: {0: [{1: 0, 2: 0}, {1: 1, 2: 0}, {1: 0, 2: 1}, {1: 1, 2: 1}],
        1: [{0: 0, 2: 0}, {0: 1, 2: 0}, {0: 0, 2: 1}, {0: 1, 2: 1}],
        2: [{0: 0, 1: 1}, {0: 1, 1: 1}, {0: 0, 1: 0}, {0: 1, 1: 0}]},
}


@sample_op(host=_grid_host, float_inputs=("x", "grid", "out_grad"), pattern="gather_owners")
def grid_sample_grad(x, grid, out_grad, mode, padding_mode, align_corners, ctx):
    """x_grad[n, c, corner(o)] += out_grad[n, c, o]·Π weights (corners of grid(o) in range; one
    owner per (n, c) plane, output positions in order); grid_grad[n, o] = Σ_c out_grad[n, c, o]·
    ∂(interpolated value)/∂(coordinate) · (unnormalise/clip/reflect slope); 0 for nearest"""
    st, dt = ctx.info, ctx.dtype
    S, md, pad, ac = st["S"], st["mode"], st["padding"], st["align_corners"]
    adt = acc_dtype(dt)
    cdt = adt
    sizes = [ctx.scalars[f"size{ax}"] for ax in range(S)]         # W, H[, D]
    N, C, P = x.shape
    Q = grid.shape[1]
    coords, scales = [], []
    for ax in range(S):
        cc, sc = _grid_coords(grid, dt, ax, sizes[ax], pad, ac, cdt, f"g{ax}")
        coords.append(cc)
        scales.append(sc)

    def flat(pos):
        """Flat index of integral float coordinates (x, y[, z]) within a plane."""
        idx = i64(0)
        for ax in reversed(range(S)):
            idx = idx * i64(sizes[ax]) + i64(pos[ax])
        return idx

    # per corner: the flat target index (-1: out of range) and the weight
    if md == "nearest":
        def near_idx(n, o):
            r = [_round_even(coords[ax][n, o]) for ax in range(S)]
            return where(_in_bound(r, sizes, cdt), flat(r), i64(-1))
        corners = [(te.compute((N, Q), near_idx, name="cidx0"), None)]
        dlo = dhi = []
    else:
        def per_axis(ax):
            c_ = coords[ax]
            low = te.compute((N, Q), lambda n, o: tirx.floor(c_[n, o]), name=f"lo{ax}")
            d_lo = te.compute((N, Q), lambda n, o: low[n, o] + const(1.0, cdt) - c_[n, o],
                              name=f"dlo{ax}")
            d_hi = te.compute((N, Q), lambda n, o: c_[n, o] - low[n, o], name=f"dhi{ax}")
            return low, d_lo, d_hi

        lo, dlo, dhi = map(list, zip(*[per_axis(ax) for ax in range(S)]))

        def corner(k, pick):
            def cidx(n, o):
                pos = [lo[ax][n, o] + const(float(pick[ax]), cdt) for ax in range(S)]
                return where(_in_bound(pos, sizes, cdt), flat(pos), i64(-1))
            return te.compute((N, Q), cidx, name=f"cidx{k}")

        corners = [(corner(k, pick), pick) for k, pick in enumerate(_corner_order(S))]

    # ---- x_grad: one owner per (n, c) plane walks the output positions in order
    tabs = [t for t, _ in corners] + ([] if md == "nearest" else dlo + dhi)

    def gen(ins, outs, body):
        from tvm.script.ir_builder import tirx as T
        G = proxy(ins[0])
        TB = [proxy(b) for b in ins[1:]]
        O = proxy(outs[0])
        od = outs[0].dtype
        nc = len(corners)

        def plane(n, ch):
            with T.serial(0, i64(P)) as p:
                O[n, ch, p] = const(0.0, od)
            with T.serial(0, i64(Q)) as o:
                # each value loaded once (an add into the plane could alias any later load)
                g = T.bind(cast(to_compute(G[n, ch, o], dt), cdt))
                weights = [] if md == "nearest" else \
                    [(T.bind(TB[nc + ax][n, o]), T.bind(TB[nc + S + ax][n, o])) for ax in range(S)]
                for k, (_, pick) in enumerate(corners):
                    idx = T.bind(TB[k][n, o])
                    val = g
                    if pick is not None:          # out_grad·d_x·d_y[·d_z], in Paddle's order
                        for ax in range(S):
                            val = val * weights[ax][pick[ax]]
                    with T.If(idx >= i64(0)):
                        with T.Then():
                            O[n, ch, idx] = O[n, ch, idx] + cast(val, od)

        body.block("scatter", within([None, C], plane), par=[N, at_least_one(C)], reads=list(ins),
                   writes=list(outs))

    (acc,) = extern("x_grad_acc", [([N, C, P], adt)], [out_grad] + tabs, gen, lanes=False)
    x_grad = cast_to(acc, dt, "x_grad")
    if md == "nearest":
        grid_grad = te.compute(grid.shape, lambda *i: const(0.0, dt.storage), name="grid_grad")
        return x_grad, grid_grad

    # ---- grid_grad: one owner per output position sums over the channels
    cw_of = {pick: t for t, pick in corners}

    def gen2(ins, outs, body):
        from tvm.script.ir_builder import tirx as T
        X, G, GRID = proxy(ins[0]), proxy(ins[1]), proxy(ins[-1])
        TB = [proxy(b) for b in ins[2:-1]]
        O = proxy(outs[0])
        n_idx = len(cw_of)
        IDX = {pick: TB[k] for k, pick in enumerate(cw_of)}
        DLO = TB[n_idx:n_idx + S]
        DHI = TB[n_idx + S:n_idx + 2 * S]
        SC = TB[n_idx + 2 * S:n_idx + 3 * S]
        zero = const(0.0, cdt)

        def terms(n, o, k, ids):
            """This point's S partial derivatives in channel k, times out_grad."""
            g = cast(to_compute(G[n, k, o], dt), cdt)

            def corner_value(pick):
                i = ids[pick]
                return T.bind(where(i >= i64(0),
                                    cast(to_compute(X[n, k, tirx.max(i, i64(0))], dt), cdt), zero))

            vals = {pick: corner_value(pick) for pick in ids}
            weights = [(T.bind(DLO[a][n, o]), T.bind(DHI[a][n, o])) for a in range(S)]

            out = []
            for ax in range(S):
                total = None
                for picks in _GRAD_TERMS[S][ax]:     # {other axis: low/high}, Paddle's order
                    hi, lo_ = [0] * S, [0] * S
                    w = None
                    for a in sorted(picks):
                        hi[a] = lo_[a] = picks[a]
                        wa = weights[a][picks[a]]
                        w = wa if w is None else w * wa
                    hi[ax], lo_[ax] = 1, 0
                    term = (vals[tuple(hi)] - vals[tuple(lo_)]) * w
                    total = term if total is None else total + term
                out.append(total * g)
            return out

        def finish(n, o, sums):
            # a NaN coordinate reaches no corner: the whole point's grid_grad is NaN
            lost = tirx.any(*[tirx.isnan(to_compute(GRID[n, o, a], dt)) for a in range(S)])
            for ax in range(S):
                O[n, o, ax] = cast(where(lost, const(float("nan"), cdt), sums[ax] * SC[ax][n, o]),
                                   dt.storage)

        def per_point(n, o):
            """CUDA: one thread per output position sums over the channels."""
            accs = [proxy(scratch((1,), cdt, word_aligned=True)) for _ in range(S)]
            for a in accs:
                a[0] = zero
            ids = {pick: T.bind(IDX[pick][n, o]) for pick in IDX}
            with T.serial(0, i64(C)) as k:
                for a, t in zip(accs, terms(n, o, k, ids)):
                    a[0] = a[0] + t
            finish(n, o, [a[0] for a in accs])

        def per_run(Pv, _S):
            """CPU: a run of RUN output positions sums channel by channel, each channel's input
            plane (read at random corners) staying in L1 over the run; the same sums, in the same
            channel order, as ``per_point``."""
            n, r = Pv[0], Pv[1]
            start = T.bind(r * i64(RUN))
            width = T.bind(tirx.min(i64(RUN), i64(Q) - start))
            acc = proxy(scratch((S, RUN), cdt))
            with T.serial(0, width) as j:
                for ax in range(S):
                    acc[ax, j] = zero
            with T.serial(0, i64(C)) as k:
                with T.serial(0, width) as j:
                    o = start + j
                    ids = {pick: IDX[pick][n, o] for pick in IDX}
                    for ax, t in enumerate(terms(n, o, k, ids)):
                        acc[ax, j] = acc[ax, j] + t
            with T.serial(0, width) as j:
                finish(n, start + j, [acc[ax, j] for ax in range(S)])

        on_cuda = ctx.on_cuda()
        body.block("grid_grad", within([None, Q], per_point), par=[N, at_least_one(Q)],
                   reads=list(ins), writes=list(outs), when=on_cuda == 1)
        body.block("grid_grad_cpu", per_run, par=[N, at_least_one(ceildiv(Q, RUN))],
                   reads=list(ins), writes=list(outs), when=on_cuda == 0)   # (Q = 0: width 0)

    idx_tabs = list(cw_of.values())
    (grid_grad,) = extern("grid_grad", [([N, Q, S], dt.storage)],
                          [x, out_grad] + idx_tabs + dlo + dhi + scales + [grid], gen2, lanes=False)
    return x_grad, grid_grad


# ------------------------------------------------------------------------------------------
# affine_grid

def _affine_host(call, outs, dt):
    op = call.op
    h = Host()
    h.host_only = {"input"}
    shape = tuple(call.attrs["output_shape"])
    S = len(shape) - 2
    gm = call.meta("output_grad")
    im = call.meta("input")
    want = (gm.shape[0], S, S + 1)
    if tuple(im.shape) != want:
        fail(op, f"input 'input' (theta) must have shape {list(want)} for output_shape "
                 f"{list(shape)} and the batch of 'output_grad' {list(gm.shape)}, got "
                 f"{list(im.shape)}")
    if im.dtype != gm.dtype:
        raise TypeError(f"{op}: input 'input' has dtype {im.dtype.name} but 'output_grad' has "
                        f"{gm.dtype.name}; they must match")
    h.static = {"S": S, "align_corners": bool(call.attrs["align_corners"])}
    return h


def _linspace(count, ac, cdt, name):
    """Paddle's affine_grid base coordinates along one dim: start + i·step in T (step 2/(S−1),
    or 2/S with start −(S−1)/S when not align_corners); a single point is 0."""
    c = lambda v: const(v, cdt)  # noqa: E731
    cnt = cast(count, cdt)
    if ac:
        step = c(2.0) / (cnt - c(1.0))
        start = c(-1.0)
    else:
        step = c(2.0) / cnt
        start = c(-1.0) * ((cnt - c(1.0)) / cnt)
    prod = te.compute((count,), lambda i: cast(i, cdt) * step, name=f"{name}_p")
    return te.compute((count,), lambda i: where(i64(count) == 1, c(0.0), start + prod[i]),
                      name=name)


@sample_op(host=_affine_host, float_inputs=("input", "output_grad"), pattern="gather_owners",
           infer_meta=None)
def affine_grid_grad(input, output_grad, output_shape, align_corners, ctx):
    """theta_grad[n, i, j] = Σ_{(d,)h,w} output_grad[n, (d,)h, w, i]·base[(d,)h, w, j] with
    base = [x_w, y_h, (z_d,) 1] (Paddle's linspace)"""
    S, ac, dt = ctx.info["S"], ctx.info["align_corners"], ctx.dtype
    adt = acc_dtype(dt)
    g = output_grad
    N = g.shape[0]
    sp = list(g.shape[1:-1])                    # (D,) H, W
    lins = [_linspace(sp[d], ac, adt, f"lin{d}") for d in range(S)]   # (d,) h, w
    axes = [te.reduce_axis((i64(0), sp[d]), name=f"r{d}") for d in range(S)]

    def f(n, i, j):
        pos = [a.var for a in axes]
        val = cast(to_compute(g[tuple([n] + pos + [i])], dt), adt)
        base = const(1.0, adt)
        for k in range(S):              # j = k: the k-th coordinate, x = last spatial dim
            base = where(j == k, lins[S - 1 - k][pos[S - 1 - k]], base)
        return te.sum(val * base, axis=axes)

    acc = te.compute((N, S, S + 1), f, name="theta_acc")
    return cast_to(acc, dt, "input_grad")
