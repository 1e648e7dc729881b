"""ROI pooling grads: roi_align_grad, roi_pool_grad, psroi_pool_grad.

Semantics are Paddle 3.3.1's CPU kernels (phi/kernels/cpu/roi_align_grad_kernel.cc,
roi_pool_grad_kernel.cc, psroi_pool_grad_kernel.cc):

* ``boxes`` [R, 4] holds (x1, y1, x2, y2) per ROI; ``boxes_num`` [N] how many ROIs each image
  has (in order). Without ``boxes_num`` every ROI belongs to image 0, which needs N = 1 (Paddle
  reads the boxes' LoD there, which a plain tensor does not have, and crashes). Counts that are
  negative, do not add up to R, or are not one per image are a ValueError (Paddle reads and writes
  out of bounds).
* roi_align: box·spatial_scale (− 0.5 when ``aligned``), width/height at least 1 unless
  ``aligned``, bins of (height/pooled_height) × (width/pooled_width), a ``sampling_ratio`` (or
  ceil(bin size) when <= 0) grid of samples per bin at the sub-bin centres; each sample's
  bilinear weights (samples beyond one pixel outside the map are skipped, coordinates clamped at
  the borders) times out_grad / (samples per bin) go to its 4 pixels. Paddle 3.3.1's CPU grad
  clamps the size to 1 also when ``aligned`` while its forward does not, so for boxes under a
  pixel its grad is not the derivative of its forward; tvmgrad follows the forward (as
  Detectron2/torchvision do): the two agree everywhere else. A box of size <= 0 with
  ``aligned`` and an adaptive grid has no samples (no gradient; Paddle's forward gives NaN).
* roi_pool: out_grad goes to the pixel ``arg_max`` recorded (a flat index into the H·W plane;
  a negative index means an empty bin and is skipped; an index >= H·W is a ValueError).
* psroi_pool: position-sensitive bins: output channel c's bin (i, j) pools input channel
  (c·pooled_height + i)·pooled_width + j over [floor(i·bh + y1'), ceil((i+1)·bh + y1')) ×
  (same in x), with y1' = round(y1)·scale, y2' = (round(y2) + 1)·scale, bh = max(y2' − y1', 0.1)
  / pooled_height, clipped to the map; each pixel gets out_grad / bin area.

Every grad is a scatter into the (n, c) planes of x: one owner per plane walks its image's ROIs,
bins and samples in Paddle's order (deterministic, and the same summation order as Paddle's CPU
kernel); half types accumulate in float32. Per-ROI coordinates are computed once in table stages,
each rounding step stored (no fused multiply-add can move a floor or a sample).
"""

from __future__ import annotations

import math

import numpy as np

from tvmgrad.dtypes import FLOATS, is_integer, to_compute
from tvmgrad.families.sample import Host, sample_op
from tvmgrad.lazy import te, tirx

from ._extern import acc_dtype, cast_to, extern, i64, proxy
from ._math import cast, const, f32, f64, where
from ._plan import fail, host_array
from ._scatter import div

MAX_SAMPLES = 1 << 24      # samples per bin beyond which roi_align refuses (it would run ~forever)


# ------------------------------------------------------------------------------------------
# host side

def _rois(call, grad_shape, dims="the ROIs of 'boxes', the channels of 'x', pooled_height, "
                                   "pooled_width"):
    """Shared checks: x [N, C, H, W], boxes [R, 4] finite, boxes_num, out_grad's shape."""
    op, a = call.op, call.attrs
    xm, bm, gm = call.meta("x"), call.meta("boxes"), call.meta("out_grad")
    if xm.ndim != 4:
        fail(op, f"input 'x' must be 4-D [N, C, H, W], got shape {list(xm.shape)}")
    if bm.ndim != 2 or bm.shape[1] != 4:
        fail(op, f"input 'boxes' must be [R, 4] (x1, y1, x2, y2 per ROI), got shape "
                 f"{list(bm.shape)}")
    if xm.dtype != bm.dtype:
        raise TypeError(f"{op}: input 'x' has dtype {xm.dtype.name} but 'boxes' has "
                        f"{bm.dtype.name}; they must match")
    N, R = xm.shape[0], bm.shape[0]
    for name in ("pooled_height", "pooled_width"):
        if a[name] <= 0:
            fail(op, f"attribute {name!r} must be > 0, got {a[name]}")
    if not a["spatial_scale"] > 0:
        fail(op, f"attribute 'spatial_scale' must be > 0, got {a['spatial_scale']}")
    want = (R,) + tuple(grad_shape)
    if tuple(gm.shape) != want:
        fail(op, f"input 'out_grad' must have shape {list(want)} ({dims}), got "
                 f"{list(gm.shape)}")
    boxes = host_array(call, "boxes")
    if boxes.size and not np.isfinite(boxes.astype(np.float64)).all():
        fail(op, "input 'boxes' holds non-finite coordinates")
    counts = host_array(call, "boxes_num")
    if counts is None:
        if N != 1 and R > 0:
            fail(op, f"input 'boxes_num' is required when x holds {N} images (without it "
                     f"every ROI belongs to image 0)")
    else:
        if counts.dtype.kind not in "iu":
            raise TypeError(f"{op}: input 'boxes_num' has dtype {counts.dtype}; it must be "
                            f"int32 or int64")
        counts = counts.reshape(-1).astype(np.int64)
        if counts.size != N:
            fail(op, f"input 'boxes_num' holds {counts.size} counts but x holds {N} images")
        if (counts < 0).any():
            fail(op, f"input 'boxes_num' holds a negative count: {counts.tolist()}")
        if int(counts.sum()) != R:
            fail(op, f"input 'boxes_num' counts {int(counts.sum())} ROIs in all but 'boxes' "
                     f"holds {R}")
    return N, R, boxes


def _roi_align_host(call, outs, dt):
    a = call.attrs
    xm = call.meta("x")
    N, R, boxes = _rois(call, (xm.shape[1], a["pooled_height"], a["pooled_width"]))
    h = Host()
    if a["sampling_ratio"] <= 0 and R:
        b = boxes.astype(np.float64) * np.float64(np.float32(a["spatial_scale"]))
        size = np.maximum(np.maximum(b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]), 1.0)
        per_bin = math.ceil(float(size.max()) / min(a["pooled_height"], a["pooled_width"])) ** 2
        if per_bin > MAX_SAMPLES:
            fail(call.op, f"input 'boxes' holds a box of {float(size.max()):.4g} pixels: with "
                          f"sampling_ratio <= 0 that is {per_bin} samples per bin (more than "
                          f"{MAX_SAMPLES}); pass a positive sampling_ratio")
    elif a["sampling_ratio"] ** 2 > MAX_SAMPLES:
        fail(call.op, f"attribute 'sampling_ratio' {a['sampling_ratio']} is too large")
    h.static = {"has_num": call.tensors.get("boxes_num") is not None,
                "ph": a["pooled_height"], "pw": a["pooled_width"],
                "ratio": a["sampling_ratio"], "aligned": bool(a["aligned"])}
    h.scalars = {"spatial_scale": ("float32", float(np.float32(a["spatial_scale"])))}
    return h


def _roi_pool_host(call, outs, dt):
    a = call.attrs
    xm = call.meta("x")
    N, R, _ = _rois(call, (xm.shape[1], a["pooled_height"], a["pooled_width"]))
    am = call.meta("arg_max")
    want = (R, xm.shape[1], a["pooled_height"], a["pooled_width"])
    if tuple(am.shape) != want:
        fail(call.op, f"input 'arg_max' must have shape {list(want)} (the shape of 'out_grad'), "
                      f"got {list(am.shape)}")
    idx = host_array(call, "arg_max")
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{call.op}: input 'arg_max' has dtype {idx.dtype}; it must be int64 "
                        f"or int32")
    plane = xm.shape[2] * xm.shape[3]
    if idx.size and (int(idx.max()) >= plane or int(idx.min()) < -1):
        pos = tuple(int(i) for i in np.argwhere((idx >= plane) | (idx < -1))[0])
        fail(call.op, f"input 'arg_max' holds {int(idx[pos])} at {list(pos)}, outside the "
                      f"{xm.shape[2]}x{xm.shape[3]} plane (expected -1 <= value < {plane})")
    h = Host()
    h.static = {"has_num": call.tensors.get("boxes_num") is not None,
                "ph": a["pooled_height"], "pw": a["pooled_width"]}
    return h


def _psroi_host(call, outs, dt):
    a = call.attrs
    xm = call.meta("x")
    oc = a["output_channels"]
    if oc <= 0:
        fail(call.op, f"attribute 'output_channels' must be > 0, got {oc}")
    N, R, _ = _rois(call, (oc, a["pooled_height"], a["pooled_width"]),
                    "the ROIs of 'boxes', output_channels, pooled_height, pooled_width")
    need = oc * a["pooled_height"] * a["pooled_width"]
    if xm.shape[1] != need:
        fail(call.op, f"input 'x' has {xm.shape[1]} channels; output_channels·pooled_height·"
                      f"pooled_width = {need}")
    h = Host()
    h.static = {"has_num": call.tensors.get("boxes_num") is not None,
                "ph": a["pooled_height"], "pw": a["pooled_width"]}
    h.scalars = {"spatial_scale": ("float32", float(np.float32(a["spatial_scale"])))}
    return h


# ------------------------------------------------------------------------------------------
# kernel side

def _starts(boxes_num, N):
    """First ROI of each image: Σ_{b<n} boxes_num[b] (a tiny reduction)."""
    if boxes_num is None:
        return None
    b = te.reduce_axis((i64(0), N), name="b")
    return te.compute((N,), lambda n: te.sum(where(b.var < n, i64(boxes_num[b]), i64(0)),
                                            axis=b), name="roi_start")


def _range(T, starts_p, num_p, n, R):
    """(first ROI, ROI count) of image n."""
    if starts_p is None:
        return i64(0), i64(R)
    return T.bind(starts_p[n]), T.bind(i64(num_p[n]))


def _sub_bin(i, dtype):
    """Paddle's ``static_cast<T>(i + .5f)``: the sample's offset in the bin (i for integer T)."""
    return cast(cast(i, "float32") + const(0.5, "float32"), dtype)


def _zero_plane(T, O, n, c, H, W, dtype):
    with T.serial(0, i64(H)) as y:
        with T.serial(0, i64(W)) as x:
            O[n, c, y, x] = const(0.0, dtype)


@sample_op(host=_roi_align_host, float_inputs=("x", "boxes", "out_grad"), pattern="gather_owners",
           dtypes=FLOATS + ("int32",))
def roi_align_grad(x, boxes, boxes_num, out_grad, pooled_height, pooled_width, spatial_scale,
                   sampling_ratio, aligned, ctx):
    """x_grad[n, c] += Σ_{ROIs r of image n, bins, samples} bilinear weights of the sample ·
    out_grad[r, c, bin] / samples per bin

    int32 (Paddle's CPU kernel with T = int): the box corners are the float box·spatial_scale
    truncated (the 0.5 of ``aligned`` is T(0.5) = 0), every division truncates, the sample
    offsets are (iy·bin)/grid; a sample's weights truncate to 1 at its low corner and 0 at the
    others, so each sample adds out_grad / samples per bin to one pixel."""
    st, dt = ctx.info, ctx.dtype
    ph_n, pw_n, ratio, al = st["ph"], st["pw"], st["ratio"], st["aligned"]
    adt = acc_dtype(dt)
    T_ = adt                                  # Paddle computes in T (float32 for half types)
    ints = is_integer(T_)
    # x is no_need_buffer: its sizes are vars bound by the x_grad buffer (C is out_grad's)
    N, C, H, W = x.shape[0], out_grad.shape[1], x.shape[2], x.shape[3]
    R = boxes.shape[0]
    scale = cast(spatial_scale, T_)                 # a runtime scalar (the host's float32 value)
    off = const(0.5 if al and not ints else 0, T_)

    def bx(k):
        if ints:                                    # int · float is a float, truncated to T
            return te.compute((R,), lambda r: cast(f32(boxes[r, k]) * spatial_scale, T_),
                              name=f"box{k}")
        return te.compute((R,), lambda r: cast(to_compute(boxes[r, k], dt), T_) * scale,
                          name=f"box{k}")

    raw = [bx(k) for k in range(4)]
    def shifted(k):
        return te.compute((R,), lambda r: raw[k][r] - off, name=f"roi{k}")

    lo = [shifted(k) for k in range(4)]
    def extent(a, b, name):
        if al:              # aligned: no minimum size (Paddle's forward; its grad clamps to 1)
            return te.compute((R,), lambda r: lo[b][r] - lo[a][r], name=name)
        return te.compute((R,), lambda r: tirx.max(lo[b][r] - lo[a][r], const(1.0, T_)), name=name)

    size_w = extent(0, 2, "roi_w")
    size_h = extent(1, 3, "roi_h")
    bin_w = te.compute((R,), lambda r: div(size_w[r], const(pw_n, T_)), name="bin_w")
    bin_h = te.compute((R,), lambda r: div(size_h[r], const(ph_n, T_)), name="bin_h")
    if ratio > 0:
        grid_h = te.compute((R,), lambda r: i64(ratio), name="grid_h")
        grid_w = te.compute((R,), lambda r: i64(ratio), name="grid_w")
    elif ints:                                      # ceil of an integer quotient: the quotient
        grid_h = te.compute((R,), lambda r: i64(bin_h[r]), name="grid_h")
        grid_w = te.compute((R,), lambda r: i64(bin_w[r]), name="grid_w")
    else:
        grid_h = te.compute((R,), lambda r: i64(tirx.ceil(size_h[r] / const(float(ph_n), T_))),
                            name="grid_h")
        grid_w = te.compute((R,), lambda r: i64(tirx.ceil(size_w[r] / const(float(pw_n), T_))),
                            name="grid_w")
    # the bin's first corner: roi_min + p·bin (the product stored before the add)
    py = te.compute((R, ph_n), lambda r, p: cast(p, T_) * bin_h[r], name="py")
    px = te.compute((R, pw_n), lambda r, p: cast(p, T_) * bin_w[r], name="px")
    ybase = te.compute((R, ph_n), lambda r, p: lo[1][r] + py[r, p], name="ybase")
    xbase = te.compute((R, pw_n), lambda r, p: lo[0][r] + px[r, p], name="xbase")
    starts = _starts(boxes_num, N)
    tables = [out_grad, bin_h, bin_w, grid_h, grid_w, ybase, xbase]
    if starts is not None:
        tables += [boxes_num, starts]

    def gen(ins, outs, body):
        G, BH, BW, GH, GW, YB, XB = [proxy(b) for b in ins[:7]]
        NUM, ST = (proxy(ins[7]), proxy(ins[8])) if starts is not None else (None, None)
        O = proxy(outs[0])
        from tvm.script.ir_builder import tirx as T
        od = outs[0].dtype
        Hs, Ws = outs[0].shape[2], outs[0].shape[3]
        Hf, Wf = cast(Hs, T_), cast(Ws, T_)
        one = const(1.0, T_)
        zero = const(0.0, T_)

        def blk(P, _S):
            n, c = T.bind(P[0]), T.bind(P[1])
            _zero_plane(T, O, n, c, Hs, Ws, od)
            r0, cnt = _range(T, ST, NUM, n, R)
            with T.serial(r0, r0 + cnt) as r:
                gh, gw = T.bind(GH[r]), T.bind(GW[r])
                countf = cast(gh * gw, T_)
                with T.serial(0, ph_n) as p:
                    with T.serial(0, pw_n) as q:
                        g = cast(to_compute(G[r, c, p, q], dt), T_)
                        with T.serial(0, gh) as iy:
                            y0 = YB[r, p] + div(_sub_bin(iy, T_) * BH[r], cast(gh, T_))
                            with T.serial(0, gw) as ix:
                                x0 = XB[r, q] + div(_sub_bin(ix, T_) * BW[r], cast(gw, T_))
                                valid = tirx.all(y0 >= -one, y0 <= Hf, x0 >= -one, x0 <= Wf)
                                with T.If(valid):
                                    with T.Then():
                                        y = tirx.max(y0, zero)
                                        x = tirx.max(x0, zero)
                                        yl = i64(y)
                                        xl = i64(x)
                                        ytop = yl >= i64(Hs) - 1
                                        xtop = xl >= i64(Ws) - 1
                                        ylow = where(ytop, i64(Hs) - 1, yl)
                                        xlow = where(xtop, i64(Ws) - 1, xl)
                                        yhigh = where(ytop, i64(Hs) - 1, yl + 1)
                                        xhigh = where(xtop, i64(Ws) - 1, xl + 1)
                                        yy = where(ytop, cast(ylow, T_), y)
                                        xx = where(xtop, cast(xlow, T_), x)
                                        ly = yy - cast(ylow, T_)
                                        lx = xx - cast(xlow, T_)
                                        hy = one - ly
                                        hx = one - lx
                                        for (yi, xi, w) in ((ylow, xlow, hy * hx), (ylow, xhigh, hy * lx),
                                                            (yhigh, xlow, ly * hx), (yhigh, xhigh, ly * lx)):
                                            share = cast(div(g * w, countf), od)
                                            O[n, c, yi, xi] = O[n, c, yi, xi] + share

        body.block("scatter", blk, par=[outs[0].shape[0], C], reads=list(ins), writes=list(outs))

    (acc,) = extern("x_grad_acc", [([N, C, H, W], adt)], tables, gen, lanes=False)
    return cast_to(acc, dt, "x_grad")


@sample_op(host=_roi_pool_host, float_inputs=("x", "boxes", "out_grad"), pattern="gather_owners",
           dtypes=FLOATS + ("int32",))
def roi_pool_grad(x, boxes, boxes_num, arg_max, out_grad, pooled_height, pooled_width,
                  spatial_scale, ctx):
    """x_grad[n, c, arg_max[r, c, i, j]] += out_grad[r, c, i, j] for the ROIs r of image n
    (arg_max < 0: an empty bin, skipped)"""
    st, dt = ctx.info, ctx.dtype
    ph_n, pw_n = st["ph"], st["pw"]
    adt = acc_dtype(dt)
    N, C, H, W = x.shape
    R = boxes.shape[0]
    starts = _starts(boxes_num, N)
    tables = [out_grad, arg_max] + ([boxes_num, starts] if starts is not None else [])

    def gen(ins, outs, body):
        G, AM = proxy(ins[0]), proxy(ins[1])
        NUM, ST = (proxy(ins[2]), proxy(ins[3])) if starts is not None else (None, None)
        O = proxy(outs[0])
        from tvm.script.ir_builder import tirx as T
        od = outs[0].dtype
        Ws = outs[0].shape[3]

        def blk(P, _S):
            n, c = T.bind(P[0]), T.bind(P[1])
            _zero_plane(T, O, n, c, outs[0].shape[2], Ws, od)
            r0, cnt = _range(T, ST, NUM, n, R)
            with T.serial(r0, r0 + cnt) as r:
                with T.serial(0, ph_n) as p:
                    with T.serial(0, pw_n) as q:
                        idx = T.bind(i64(AM[r, c, p, q]))
                        with T.If(idx >= i64(0)):
                            with T.Then():
                                yy = tirx.floordiv(idx, i64(Ws))
                                xx = tirx.floormod(idx, i64(Ws))
                                O[n, c, yy, xx] = O[n, c, yy, xx] + cast(to_compute(G[r, c, p, q], dt), od)

        body.block("scatter", blk, par=[N, C], reads=list(ins), writes=list(outs))

    (acc,) = extern("x_grad_acc", [([N, C, H, W], adt)], tables, gen, lanes=False)
    return cast_to(acc, dt, "x_grad")


def _round_half_away(v):
    """C ``round`` (half away from zero)."""
    dt_ = str(v.ty)
    t = tirx.trunc(v)
    frac = v - t
    return t + where(frac >= const(0.5, dt_), const(1.0, dt_),
                      where(frac <= const(-0.5, dt_), const(-1.0, dt_), const(0.0, dt_)))


@sample_op(host=_psroi_host, float_inputs=("x", "boxes", "out_grad"), pattern="gather_owners")
def psroi_pool_grad(x, boxes, boxes_num, out_grad, pooled_height, pooled_width, output_channels,
                    spatial_scale, ctx):
    """x_grad[n, (c·ph + i)·pw + j, bin(r, i, j)] += out_grad[r, c, i, j] / bin area for the
    ROIs r of image n"""
    st, dt = ctx.info, ctx.dtype
    ph_n, pw_n = st["ph"], st["pw"]
    adt = acc_dtype(dt)
    T_ = adt
    N, C, H, W = x.shape
    R = boxes.shape[0]
    scale = cast(spatial_scale, T_)                 # a runtime scalar (the host's float32 value)

    def coord(k, plus_one):
        def f(r):
            v = _round_half_away(cast(to_compute(boxes[r, k], dt), T_))
            if plus_one:
                v = cast(f64(v) + 1.0, T_)
            return v * scale
        return te.compute((R,), f, name=f"ps{k}")

    x1, y1, x2, y2 = coord(0, False), coord(1, False), coord(2, True), coord(3, True)
    tenth = const(0.1, T_)
    bh = te.compute((R,), lambda r: tirx.max(y2[r] - y1[r], tenth) / const(float(ph_n), T_),
                    name="bin_h")
    bw = te.compute((R,), lambda r: tirx.max(x2[r] - x1[r], tenth) / const(float(pw_n), T_),
                    name="bin_w")

    def edge(b, start, n_bins, size, up, name):
        prod = te.compute((R, n_bins), lambda r, p: b[r] * cast(p + (1 if up else 0), T_),
                          name=f"{name}_p")
        f = tirx.ceil if up else tirx.floor
        return te.compute((R, n_bins), lambda r, p: tirx.min(tirx.max(
            i64(f(prod[r, p] + start[r])), i64(0)), i64(size)), name=name)

    hs, he = edge(bh, y1, ph_n, H, False, "hs"), edge(bh, y1, ph_n, H, True, "he")
    ws, we = edge(bw, x1, pw_n, W, False, "ws"), edge(bw, x1, pw_n, W, True, "we")
    starts = _starts(boxes_num, N)
    tables = [out_grad, hs, he, ws, we] + ([boxes_num, starts] if starts is not None else [])

    def gen(ins, outs, body):
        G, HS, HE, WS, WE = [proxy(b) for b in ins[:5]]
        NUM, ST = (proxy(ins[5]), proxy(ins[6])) if starts is not None else (None, None)
        O = proxy(outs[0])
        from tvm.script.ir_builder import tirx as T
        od = outs[0].dtype

        def blk(P, _S):
            n, ch = T.bind(P[0]), T.bind(P[1])
            _zero_plane(T, O, n, ch, outs[0].shape[2], outs[0].shape[3], od)
            c = T.bind(tirx.floordiv(ch, i64(ph_n * pw_n)))
            i = T.bind(tirx.floormod(tirx.floordiv(ch, i64(pw_n)), i64(ph_n)))
            j = T.bind(tirx.floormod(ch, i64(pw_n)))
            r0, cnt = _range(T, ST, NUM, n, R)
            with T.serial(r0, r0 + cnt) as r:
                h0, h1 = T.bind(HS[r, i]), T.bind(HE[r, i])
                w0, w1 = T.bind(WS[r, j]), T.bind(WE[r, j])
                with T.If(tirx.all(h1 > h0, w1 > w0)):
                    with T.Then():
                        area = cast((h1 - h0) * (w1 - w0), T_)
                        with T.serial(h0, h1) as yy:
                            with T.serial(w0, w1) as xx:
                                diff = cast(to_compute(G[r, c, i, j], dt), T_) / area
                                O[n, ch, yy, xx] = O[n, ch, yy, xx] + cast(diff, od)

        body.block("scatter", blk, par=[N, C], reads=list(ins), writes=list(outs))

    (acc,) = extern("x_grad_acc", [([N, C, H, W], adt)], tables, gen, lanes=False)
    return cast_to(acc, dt, "x_grad")
