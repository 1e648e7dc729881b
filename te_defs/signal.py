"""Signal grads: overlap_add_grad and correlation_grad (FlowNet correlation).

**overlap_add** (Paddle's phi/kernels/cpu/overlap_add_grad_kernel.cc): the forward adds frames
x[..., l, f] (axis = −1; x[f, l, ...] for axis = 0) into out[..., f·hop_length + l]; its grad is
the framing of out_grad, a gather: x_grad[..., l, f] = out_grad[..., f·hop_length + l]. One
kernel serves every rank: tensors are viewed as (batch, frame_length, n_frames) / (batch, seq)
for axis = −1 and (n_frames, frame_length, batch) / (seq, batch) for axis = 0. hop_length may
exceed frame_length here (the forward's InferMeta refuses that, the grad kernel does not).

**correlation** (FlowNet; Paddle 3.3.1 has only a CUDA kernel, phi/kernels/gpu/
correlation_kernel.cu): with k = (kernel_size − 1)/2, d = max_displacement/stride2, D = 2d + 1,
inputs zero-padded by pad_size (X1p, X2p), output position (j, i) centred at
(j·stride1 + max_displacement, i·stride1 + max_displacement) of the padded map, displacement
channel t = (tj + d)·D + (ti + d):

    out[n, t, j, i] = Σ_c Σ_{|a|,|b| <= k} X1p[n, c, h1 + a, w1 + b] · X2p[n, c, h1 + a + tj·s2,
                      w1 + b + ti·s2] / (kernel_size² · C)

Its grads are gathers: input1_grad[n, c, y, x] = Σ_t X2p[n, c, Y + tj·s2, X + ti·s2] ·
Σ_{windows (j, i) containing (Y, X)} out_grad[n, t, j, i] / (kernel_size²·C) (Y = y + pad), and
input2_grad likewise with X1p at the displaced position. Paddle's CUDA backward finds the windows
with truncating integer division, which is only right for stride1 = 1: with stride1 > 1 it adds
gradient from output positions whose window does not contain the pixel (not the derivative of
its own forward); tvmgrad computes the exact windows (they agree for stride1 = 1). Reads outside
the padded map are zero (Paddle's kernels read neighbouring memory there when kernel_size > 1).
``corr_type_multiply`` is ignored, as in Paddle.
"""

from __future__ import annotations

import math

from tvmgrad.dtypes import COMPLEX, FLOATS, INTS, to_compute
from tvmgrad.families.sample import Host, sample_op
from tvmgrad.lazy import te, tirx

from ._extern import acc_dtype, cast_to, i64
from ._math import cast, const, where
from ._plan import fail


# ------------------------------------------------------------------------------------------
# overlap_add

def _ola_host(call, outs, dt):
    a = call.attrs
    x, g = call.meta("x"), call.meta("out_grad")
    h = Host()
    if a["axis"] == -1:
        rest = math.prod(x.shape[:-2])
        h.views = {"x": (rest, x.shape[-2], x.shape[-1]), "out_grad": (rest, g.shape[-1]),
                   "x_grad": (rest, x.shape[-2], x.shape[-1])}
    else:
        rest = math.prod(x.shape[2:])
        h.views = {"x": (x.shape[0], x.shape[1], rest), "out_grad": (g.shape[0], rest),
                   "x_grad": (x.shape[0], x.shape[1], rest)}
    h.static = {"axis": a["axis"]}
    h.scalars = {"hop_length": ("int64", int(a["hop_length"]))}
    return h


@sample_op(host=_ola_host, float_inputs=("x", "out_grad"), pattern="gather_owners",
           dtypes=FLOATS + COMPLEX + INTS)
def overlap_add_grad(x, out_grad, hop_length, axis, ctx):
    """x_grad[..., l, f] = out_grad[..., f·hop_length + l] (axis −1; the mirror for axis 0; a
    complex pair moves as it is)"""
    hop = hop_length                    # a runtime scalar: one kernel for every hop
    g = out_grad
    if ctx.info["axis"] == -1:
        return te.compute(x.shape, lambda b, l, f, *c: g[(b, f * hop + l, *c)], name="x_grad")
    return te.compute(x.shape, lambda f, l, b, *c: g[(f * hop + l, b, *c)], name="x_grad")


# ------------------------------------------------------------------------------------------
# correlation

def _corr_host(call, outs, dt):
    op, a = call.op, call.attrs
    m1, m2, g = call.meta("input1"), call.meta("input2"), call.meta("out_grad")
    if m1.ndim != 4:
        fail(op, f"input 'input1' must be 4-D [N, C, H, W], got shape {list(m1.shape)}")
    if m2.shape != m1.shape:
        fail(op, f"input 'input2' has shape {list(m2.shape)} but 'input1' has "
                 f"{list(m1.shape)}; they must match")
    for name in ("kernel_size", "stride1", "stride2"):
        if a[name] <= 0:
            fail(op, f"attribute {name!r} must be > 0, got {a[name]}")
    for name in ("pad_size", "max_displacement"):
        if a[name] < 0:
            fail(op, f"attribute {name!r} must be >= 0, got {a[name]}")
    N, C, H, W = m1.shape
    k = (a["kernel_size"] - 1) // 2
    md, s1, s2, pad = a["max_displacement"], a["stride1"], a["stride2"], a["pad_size"]
    border = k + md
    oh = math.ceil((H + 2 * pad - 2 * border) / s1)
    ow = math.ceil((W + 2 * pad - 2 * border) / s1)
    dr = md // s2
    oc = (2 * dr + 1) ** 2
    if oh <= 0 or ow <= 0:
        fail(op, f"the input ({H}x{W}) padded by pad_size {pad} is smaller than the window "
                 f"border 2·((kernel_size - 1)/2 + max_displacement) = {2 * border}: the output "
                 f"would be empty")
    want = (N, oc, oh, ow)
    if tuple(g.shape) != want:
        fail(op, f"input 'out_grad' must have shape {list(want)} (from 'input1' {list(m1.shape)}, "
                 f"kernel_size {a['kernel_size']}, max_displacement {md}, stride1 {s1}, stride2 "
                 f"{s2}, pad_size {pad}), got {list(g.shape)}")
    h = Host()
    h.static = {"k": k, "ks": a["kernel_size"], "md": md, "s1": s1, "s2": s2, "pad": pad,
                "dr": dr}
    return h


@sample_op(host=_corr_host, float_inputs=("input1", "input2", "out_grad"),
           pattern="gather_owners")
def correlation_grad(input1, input2, out_grad, pad_size, kernel_size, max_displacement, stride1,
                     stride2, corr_type_multiply, ctx):
    """input1_grad[n,c,y,x] = Σ_t X2p[n,c,Y+tj·s2,X+ti·s2]·Σ_{windows ∋ (Y,X)} out_grad[n,t,j,i]
    / (kernel_size²·C); input2_grad[n,c,y,x] = Σ_t X1p[n,c,Y−tj·s2,X−ti·s2]·Σ_{windows ∋
    (Y−tj·s2, X−ti·s2)} out_grad[n,t,j,i] / (kernel_size²·C)"""
    st, dt = ctx.info, ctx.dtype
    k, ks, md, s1, s2, pad, dr = (st[n] for n in ("k", "ks", "md", "s1", "s2", "pad", "dr"))
    adt = acc_dtype(dt)
    N, C, H, W = input1.shape
    OC, OH, OW = out_grad.shape[1], out_grad.shape[2], out_grad.shape[3]
    D = 2 * dr + 1
    KJ = (2 * k) // s1 + 1                       # windows per axis that can contain a pixel
    norm = const(float(ks * ks), adt) * cast(C, adt)

    def padded(t, n, c, Y, X):
        y, x = Y - pad, X - pad
        inb = tirx.all(y >= 0, y < H, x >= 0, x < W)
        yc = tirx.min(tirx.max(y, i64(0)), H - 1)
        xc = tirx.min(tirx.max(x, i64(0)), W - 1)
        return where(inb, cast(to_compute(t[n, c, yc, xc], dt), adt), const(0.0, adt))

    def window_sum(n, t, Y, X, a, b):
        """out_grad[n, t, j, i] for the a-th/b-th window containing padded (Y, X), or 0."""
        jlo = -tirx.floordiv(-(Y - md - k), i64(s1))       # ceil((Y − md − k)/s1)
        ilo = -tirx.floordiv(-(X - md - k), i64(s1))
        j, i = jlo + a, ilo + b
        ok = tirx.all(j >= 0, j < OH, i >= 0, i < OW, j * s1 + md - k <= Y, Y <= j * s1 + md + k,
                      i * s1 + md - k <= X, X <= i * s1 + md + k)
        jc = tirx.min(tirx.max(j, i64(0)), OH - 1)
        ic = tirx.min(tirx.max(i, i64(0)), OW - 1)
        return where(ok, cast(to_compute(out_grad[n, t, jc, ic], dt), adt), const(0.0, adt))

    def grad(which):
        t = te.reduce_axis((i64(0), OC), name="t")
        a = te.reduce_axis((i64(0), i64(KJ)), name="a")
        b = te.reduce_axis((i64(0), i64(KJ)), name="b")

        def f(n, c, y, x):
            Y, X = y + pad, x + pad
            tj = tirx.floordiv(t.var, i64(D)) - dr
            ti = tirx.floormod(t.var, i64(D)) - dr
            if which == 1:
                other = padded(input2, n, c, Y + tj * s2, X + ti * s2)
                g = window_sum(n, t.var, Y, X, a.var, b.var)
            else:
                other = padded(input1, n, c, Y - tj * s2, X - ti * s2)
                g = window_sum(n, t.var, Y - tj * s2, X - ti * s2, a.var, b.var)
            return te.sum(g * other, axis=[t, a, b])

        acc = te.compute((N, C, H, W), f, name=f"g{which}_acc")
        scaled = te.compute((N, C, H, W), lambda *i: acc(*i) / norm, name=f"g{which}_s")
        return cast_to(scaled, dt, f"input{which}_grad")

    return grad(1), grad(2)
