"""Convolution grads: conv2d/conv3d/depthwise_conv2d (first and double grads) and
conv3d_transpose_grad, for any strides, paddings (EXPLICIT symmetric or per-side, SAME, VALID),
dilations, groups and layouts (NCHW/NCDHW and NHWC/NDHWC; the filter is [O, C/groups, k...] in
both, as in Paddle).

Every grad is one of three direct (implicit-GEMM) contractions of the dense family
(tvmgrad/families/dense.py, te_defs/_dense.py), over zero-padded operand copies (*sources*) so that the contraction reads
contiguous, bounds-check-free rows:

* forward   out[n,g,o,p]  = Σ_{c,k} w[g,o,c,k] · x[n,g,c, p·s + k·d − lo]
  (conv3d_transpose's x_grad, the double grads' grad_out_grad). x's source is split by stride
  phase, xs[.., k·d mod s, p + k·d div s], so a row of outputs reads a contiguous row;
* data grad dx[n,g,c,i] = Σ_{o,j} w[g,o,c,K−1−j] · dyz[n,g,o, i + j·d]
  where dyz is dy with s−1 zeros between elements and (K−1)·d − lo zeros in front (a transposed
  convolution as a correlation with the flipped filter);
* filter grad dw[g,o,c,k] = Σ_n Σ_p dy[n,g,o,p] · x[n,g,c, p·s + k·d − lo]
  computed per sample n (a partial filter per sample, then summed: parallel work and cache-sized
  operands) with x in a channel-last, phase-split source.

Both grads of a channel-first 2-D conv with one input and one output channel per group (a
depthwise conv without channel multiplier) are instead one pass over each (sample, channel)
plane (te_defs/_conv_planes.py): the contraction form, its padded copies made for the whole
batch, moved each activation through memory three times for 9 multiply-adds per element.

The M axis (rows of the broadcast operand) and the vectorised N axis (contiguous in its operand)
depend on the layout: channel-first layouts vectorise along the last spatial dim and block over
channels; channel-last ones the other way round; depthwise convolutions (one channel per group)
block over groups instead of the one channel. A channel-first data grad with many channels and a
small window is computed channel-last all the same (``_channel_last_data``: exact lanes, and
spatial rows padded to ``row_grain``, 56 rather than 64). The filter grad's spatial reduction
is padded to ``sgrain`` (the least padding), and x is read in place rather than unfolded when
that pads nothing. Paddle 3.3.1 semantics (phi/kernels/impl/
conv_grad_kernel_impl.h, conv_grad_grad_kernel_impl.h, conv_transpose_grad_kernel_impl.h,
cpu/conv_util.h): paddings are [lo, hi] per dim when 2·S long; SAME makes every dilation 1 and
pads (max((ceil(I/s) − 1)·s + k − I, 0)) split low-first; a double grad whose optional
cotangent is absent has a zero contribution from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvmgrad.dtypes import dtype as as_dtype
from tvmgrad.lazy import te, tirx

from tvmgrad.families.dense import View, dense_op

from tvmgrad.infer_meta import is_symbolic

from . import _conv_planes
from ._dense import GRAINS, PAD_K, ceil_to, grain, load, main_attrs, store, tile_row_grain
from ._plan import fail

CHANNEL_FIRST = ("NCHW", "NCDHW")
CHANNEL_LAST = ("NHWC", "NDHWC")
ALGORITHMS = ("EXPLICIT", "SAME", "VALID")


# ------------------------------------------------------------------------------------------
# geometry (plan time)

@dataclass(frozen=True)
class Geom:
    """Everything static about a convolution: spatial rank, layout, groups, kernel window,
    strides, dilations, resolved paddings, and the grains / roles chosen for this call."""

    S: int
    last: bool          # channel-last layout
    G: int
    k: tuple
    s: tuple
    d: tuple
    lo: tuple
    hi: tuple
    roles: tuple = ()   # per contraction: (name, grains...) chosen at plan time


def _ints(op, name, value, n, *, minimum=None, allow=None):
    value = tuple(value)
    lens = allow or (n,)
    if len(value) not in lens:
        fail(op, f"attribute {name!r} must have {' or '.join(map(str, lens))} values for a "
                  f"{n}-D convolution, got {list(value)}")
    if minimum is not None and any(v < minimum for v in value):
        fail(op, f"attribute {name!r} must be >= {minimum}, got {list(value)}")
    return value


def resolve_padding(op, S, strides, paddings, algorithm, dilations, in_sizes, ksize):
    """(lo, hi, dilations) as Paddle's UpdatePaddingAndDilation."""
    if algorithm not in ALGORITHMS:
        fail(op, f"attribute 'padding_algorithm' must be one of {', '.join(ALGORITHMS)}, got "
                  f"{algorithm!r}")
    pads = _ints(op, "paddings", paddings, S, allow=(S, 2 * S), minimum=0)
    if len(pads) == S:
        lo, hi = pads, pads
    else:
        lo, hi = pads[0::2], pads[1::2]
    dil = tuple(dilations)
    if algorithm == "SAME":
        lo2, hi2 = [], []
        for i in range(S):
            out = (in_sizes[i] + strides[i] - 1) // strides[i]
            total = max((out - 1) * strides[i] + ksize[i] - in_sizes[i], 0)
            lo2.append(total // 2)
            hi2.append(total - total // 2)
        return tuple(lo2), tuple(hi2), (1,) * S
    if algorithm == "VALID":
        return (0,) * S, (0,) * S, dil
    return tuple(lo), tuple(hi), dil


def _layout(op, data_format, S):
    if data_format in CHANNEL_FIRST:
        return False
    if data_format in CHANNEL_LAST:
        return True
    fail(op, f"attribute 'data_format' must be one of {', '.join(CHANNEL_FIRST + CHANNEL_LAST)}, "
              f"got {data_format!r}")


def _conv_geom(call, S, *, x="input", filter="filter", out="out_grad", transpose=False):
    """Validate a conv (or, with ``transpose``, a conv_transpose) call; -> (Geom, sizes).

    sizes: N, Cg (channels per group of ``x``), Og (of ``out``), I (x's spatial), O (out's)."""
    op, a = call.op, call.attrs
    xm, wm, gm = call.meta(x), call.meta(filter), call.meta(out)
    last = _layout(op, a["data_format"], S)
    for name, m in ((x, xm), (filter, wm), (out, gm)):
        if m.ndim != S + 2:
            fail(op, f"input {name!r} must be {S + 2}-D for a {S}-D convolution, got shape "
                      f"{list(m.shape)}")
    groups = a["groups"]
    if groups < 1:
        fail(op, f"attribute 'groups' must be >= 1, got {groups}")
    strides = _ints(op, "strides", a["strides"], S, minimum=1)
    dil = _ints(op, "dilations", a["dilations"], S, minimum=1)
    N = xm.shape[0]
    C = xm.shape[-1] if last else xm.shape[1]
    I = xm.shape[1:-1] if last else xm.shape[2:]
    Oc = gm.shape[-1] if last else gm.shape[1]
    O = gm.shape[1:-1] if last else gm.shape[2:]
    k = wm.shape[2:]
    if gm.shape[0] != N:
        fail(op, f"input {out!r} has batch {gm.shape[0]} but {x!r} has {N}")
    if transpose:
        # filter [C_in, C_out/groups, k...]; x has C_in channels, out_grad C_out
        if wm.shape[0] != C:
            fail(op, f"input {filter!r} has {wm.shape[0]} input channels (dim 0) but {x!r} has "
                      f"{C} channels (data_format {a['data_format']})")
        if C % groups:
            fail(op, f"{x!r} channels ({C}) are not divisible by groups ({groups})")
        if wm.shape[1] * groups != Oc:
            fail(op, f"input {out!r} has {Oc} channels but {filter!r} gives "
                      f"{wm.shape[1]} x groups {groups} = {wm.shape[1] * groups}")
    else:
        if C % groups or wm.shape[1] * groups != C:
            fail(op, f"channel/group mismatch: {x!r} has {C} channels (data_format "
                      f"{a['data_format']}), {filter!r} has {wm.shape[1]} per group and groups "
                      f"is {groups}; need channels == filter.shape[1] x groups")
        if wm.shape[0] % groups:
            fail(op, f"{filter!r} has {wm.shape[0]} output channels, not divisible by groups "
                      f"({groups})")
        if wm.shape[0] != Oc:
            fail(op, f"input {out!r} has {Oc} channels but {filter!r} has {wm.shape[0]} "
                      f"output channels")
    lo, hi, dil = resolve_padding(op, S, strides, a["paddings"], a["padding_algorithm"], dil,
                                  I, k)
    if transpose:
        # out = conv_transpose(x): x is the forward conv of out (padding from x's sizes)
        big, small = O, I
    else:
        big, small = I, O
    for i in range(S):
        span = dil[i] * (k[i] - 1) + 1
        n_out = (big[i] + lo[i] + hi[i] - span) // strides[i] + 1
        if big[i] + lo[i] + hi[i] < span or n_out <= 0:
            if not transpose:
                fail(op, f"the filter {filter!r} (size {k[i]}, dilations {dil[i]}, span {span}) is "
                          f"larger than the padded input {x!r} ({big[i]} + paddings {lo[i]} + "
                          f"{hi[i]}) in spatial dim {i}")
        if transpose:
            # the transposed conv's output size may exceed the formula by up to stride - 1
            lo_size = (small[i] - 1) * strides[i] - lo[i] - hi[i] + span
            if not lo_size <= big[i] < lo_size + strides[i]:
                fail(op, f"input {out!r} has spatial size {big[i]} in dim {i}, but "
                          f"conv_transpose of {x!r} ({small[i]}) with {filter!r} ({k[i]}), strides "
                          f"{strides[i]}, paddings {lo[i]}+{hi[i]}, dilations {dil[i]} gives "
                          f"{lo_size} (+ output_padding < strides {strides[i]})")
        elif n_out != small[i]:
            fail(op, f"input {out!r} has spatial size {small[i]} in dim {i}, but the "
                      f"convolution gives {n_out} ({x!r} {big[i]}, {filter!r} {k[i]}, strides "
                      f"{strides[i]}, paddings {lo[i]}+{hi[i]}, dilations {dil[i]})")
    geom = Geom(S, last, groups, tuple(k), tuple(strides), tuple(dil), tuple(lo), tuple(hi))
    if transpose:
        sizes = dict(N=N, Cg=C // groups, Og=Oc // groups, I=tuple(I), O=tuple(O))
    else:
        sizes = dict(N=N, Cg=C // groups, Og=Oc // groups, I=tuple(I), O=tuple(O))
    return geom, sizes


def _tpl(S, last, G, ch, sp):
    """View template of an activation: N, spatial dims, G groups of ``ch`` channels."""
    sp_names = tuple(f"{sp}{i}" for i in range(S))
    return ("N", *sp_names, G, ch) if last else ("N", G, ch, *sp_names)


def _depthwise(ch_m, ch_n, G):
    """Block over groups rather than channels when a group has fewer than 4 channels."""
    return ch_m < 4 and G >= 4


# ------------------------------------------------------------------------------------------
# accessors of the views (logical index -> element)

class Act:
    """An activation view: element (n, g, c, spatial...) in either layout."""

    def __init__(self, t, last, dt):
        self.t, self.last, self.dt = t, last, dt
        S = len(t.shape) - 3
        self.S = S
        self.N = t.shape[0]
        if last:
            self.sp, self.C = list(t.shape[1:1 + S]), t.shape[-1]
        else:
            self.sp, self.C = list(t.shape[3:]), t.shape[2]

    def __call__(self, n, g, c, sp):
        idx = (n, *sp, g, c) if self.last else (n, g, c, *sp)
        return load(self.t, idx, self.dt)


class Filt:
    """A filter view [G, O/G, C/G, k...]: element (g, o, c, k...)."""

    def __init__(self, t, dt):
        self.t, self.dt = t, dt
        self.O, self.C = t.shape[1], t.shape[2]

    def __call__(self, g, o, c, kk):
        return load(self.t, (g, o, c, *kk), self.dt)


def _all(*conds):
    conds = [c for c in conds if c is not None and not (isinstance(c, bool) and c)]
    return tirx.all(*conds) if conds else tirx.const(True, "bool")


def _ix(index, v):
    """A Python int as a constant of the kernel's index dtype ``index`` (an expr as it is)."""
    return tirx.const(v, index) if isinstance(v, int) else v


def _atleast(index, x, v: int):
    """max(x, v): the extent of a source along a staged axis (a tile of v, plus its halo, must
    fit even when the size is 0, or TVM sizes the staged copy by the symbolic extent)."""
    return tirx.max(x, tirx.const(int(v), index))


def _sh(index, *dims):
    """A TE shape in the kernel's index dtype (int32 loop vars next to int64 sizes overflow in
    TVM's CUDA lowering)."""
    return tuple(_ix(index, d) for d in dims)


def _concat(terms, c, Cg, fn):
    """Element of channel c of terms concatenated along channels (each Cg wide)."""
    if len(terms) == 1:
        return fn(terms[0], c)
    return tirx.if_then_else(c < Cg, fn(terms[0], c), fn(terms[1], c - Cg))


# ------------------------------------------------------------------------------------------
# the three contractions

def forward(name, terms, geom, dt, O_sizes, gm, gn, gk, depthwise, *, index):
    """out[n,g,o,p] = Σ_terms Σ_{c,k} w[g,o,c,k] · x[n,g,c, p·s + k·d − lo] (padded).

    terms: [(Act x, Filt w)], concatenated along c. Returns (main, index) where index(n, g, o,
    p) is main's index of that output element."""
    S, last, G = geom.S, geom.last, geom.G
    x0, w0 = terms[0]
    N, Cg, Og = x0.N, x0.C, w0.O
    acc = dt.compute
    Ctot = Cg * len(terms)
    Cp = ceil_to(Ctot, gk)
    # padded extents of the output: the vectorised / blocked axes
    if last:
        P = list(O_sizes[:-1]) + [ceil_to(O_sizes[-1], gm)]
        Gp, Opd = (ceil_to(_ix(index, G), gn), Og) if depthwise else (_ix(index, G), ceil_to(Og, gn))
    else:
        P = list(O_sizes[:-1]) + [ceil_to(O_sizes[-1], gn)]
        Gp, Opd = (ceil_to(_ix(index, G), gm), Og) if depthwise else (_ix(index, G), ceil_to(Og, gm))
    Q = [_atleast(index, P[i], 1 if i < S - 1 else (gm if last else gn))
         + (geom.k[i] - 1) * geom.d[i] // geom.s[i] for i in range(S)]
    s, d, lo = geom.s, geom.d, geom.lo
    I = x0.sp

    def xval(n, g, c, ph, q):
        t = [q[i] * s[i] + ph[i] - lo[i] for i in range(S)]
        ok = _all(g < G, c < Ctot, *[tirx.all(t[i] >= 0, t[i] < I[i]) for i in range(S)])
        return ok, lambda: _concat(terms, c, Cg, lambda tm, cc: tm[0](n, g, cc, t))

    if last:
        xs = te.compute(
            _sh(index, N, *geom.s, *Q, Gp, Cp),
            lambda n, *r: _guard(*xval(n, r[2 * S], r[2 * S + 1], r[:S], r[S:2 * S]), acc),
            name=f"{name}_x", attrs={"dense.src": "root"})
    else:
        xs = te.compute(
            _sh(index, N, Gp, Cp, *geom.s, *Q),
            lambda n, g, c, *r: _guard(*xval(n, g, c, r[:S], r[S:]), acc),
            name=f"{name}_x", attrs={"dense.src": "root"})

    def wval(g, o, c, kk):
        ok = _all(g < G, o < Og, c < Ctot)
        return ok, lambda: _concat(terms, c, Cg, lambda tm, cc: tm[1](g, o, cc, kk))

    if last and depthwise:      # N = g: contiguous along g
        ws = te.compute(_sh(index, *geom.k, Cp, Opd, Gp),
                        lambda *r: _guard(*wval(r[-1], r[-2], r[-3], r[:S]), acc),
                        name=f"{name}_w", attrs={"dense.src": "root"})
        wat = lambda g, o, c, kk: ws[(*kk, c, o, g)]  # noqa: E731
    elif last:                  # N = o
        ws = te.compute(_sh(index, Gp, *geom.k, Cp, Opd),
                        lambda g, *r: _guard(*wval(g, r[-1], r[-2], r[:S]), acc),
                        name=f"{name}_w", attrs={"dense.src": "root"})
        wat = lambda g, o, c, kk: ws[(g, *kk, c, o)]  # noqa: E731
    else:
        ws = te.compute(_sh(index, Gp, Opd, Cp, *geom.k),
                        lambda g, o, c, *kk: _guard(*wval(g, o, c, kk), acc),
                        name=f"{name}_w", attrs={"dense.src": "root"})
        wat = lambda g, o, c, kk: ws[(g, o, c, *kk)]  # noqa: E731

    rc = te.reduce_axis((0, Cp), name=f"{name}_c")
    rk = [te.reduce_axis((0, _ix(index, geom.k[i])), name=f"{name}_k{i}") for i in range(S)]
    kk = [r.var for r in rk]
    ph = [(kk[i] * d[i]) % s[i] for i in range(S)]
    sh = [(kk[i] * d[i]) // s[i] for i in range(S)]

    if last:
        def body(n, *r):
            p, g, o = r[:S], r[S], r[S + 1]
            q = [p[i] + sh[i] for i in range(S)]
            return te.sum(xs[(n, *ph, *q, g, rc)] * wat(g, o, rc, kk), axis=[rc, *rk])
        shape = (N, *P, Gp, Opd)
        # M = last spatial (axis S), N = o (axis S+2) or g (axis S+1)
        attrs = main_attrs(S, S + 1 if depthwise else S + 2, gm, gn, gk=gk,
                           halo=tuple(1 + i for i in range(S - 1)))
        main = te.compute(_sh(index, *shape), body, name=name, attrs=attrs)
        return main, lambda n, g, o, p: (n, *p, g, o)
    else:
        def body(n, g, o, *p):
            q = [p[i] + sh[i] for i in range(S)]
            return te.sum(wat(g, o, rc, kk) * xs[(n, g, rc, *ph, *q)], axis=[rc, *rk])
        shape = (N, Gp, Opd, *P)
        attrs = main_attrs(1 if depthwise else 2, 2 + S, gm, gn, gk=gk,
                           halo=tuple(3 + i for i in range(S - 1)))
        main = te.compute(_sh(index, *shape), body, name=name, attrs=attrs)
        return main, lambda n, g, o, p: (n, g, o, *p)


def _data_extents(geom, I_sizes, Cg, gm, gn, depthwise, index, last):
    """(P, Gp, Cpd) of a data grad computed channel-last (``last``) or channel-first: its padded
    spatial extents, groups and channels."""
    G = geom.G
    if last:
        P = list(I_sizes[:-1]) + [ceil_to(I_sizes[-1], gm)]
        Gp, Cpd = (ceil_to(_ix(index, G), gn), Cg) if depthwise else (_ix(index, G), ceil_to(Cg, gn))
    else:
        P = list(I_sizes[:-1]) + [ceil_to(I_sizes[-1], gn)]
        Gp, Cpd = (ceil_to(_ix(index, G), gm), Cg) if depthwise else (_ix(index, G), ceil_to(Cg, gm))
    return P, Gp, Cpd


def zero_inserted_dy(name, dy, Og, Cg, geom, dt, I_sizes, gm, gn, gk, depthwise, *, index,
                     last=None):
    """dyz[n,g,o,t] of a data grad (see the module docstring), source ``{name}_dy``: dy with
    s−1 zeros between elements and (K−1)·d − lo in front, over the data grad's padded domain
    plus the (K−1)·d halo, channel-last when the data grad is computed so (``last``, default
    the layout's)."""
    S, G = geom.S, geom.G
    last = geom.last if last is None else last
    N = dy.N
    acc = dt.compute
    s, d, lo, K = geom.s, geom.d, geom.lo, geom.k
    Op = ceil_to(Og, gk)
    P, Gp, _ = _data_extents(geom, I_sizes, Cg, gm, gn, depthwise, index, last)
    T = [_atleast(index, P[i], 1 if i < S - 1 else (gm if last else gn)) + (K[i] - 1) * d[i]
         for i in range(S)]
    L = [(K[i] - 1) * d[i] - lo[i] for i in range(S)]
    O = dy.sp

    def dval(n, g, o, t):
        u = [t[i] - L[i] for i in range(S)]
        q = [tirx.floordiv(u[i], s[i]) for i in range(S)]
        conds = [g < G, o < Og]
        for i in range(S):
            if s[i] > 1:
                conds.append(tirx.floormod(u[i], s[i]) == 0)
            conds += [u[i] >= 0, q[i] < O[i]]
        return _all(*conds), lambda: dy(n, g, o, q)

    # (the zero insertion divides the spatial index by the stride: TVM's loop analysis fails
    # on such divisions of fused loops, so only the leading loops are fused for parallelism)
    strided = any(v > 1 for v in s)
    if last:
        dys = te.compute(_sh(index, N, *T, Gp, Op),
                         lambda n, *r: _guard(*dval(n, r[S], r[S + 1], r[:S]), acc),
                         name=f"{name}_dy",
                         attrs={"dense.src": "root", "dense.par": 1 if strided else S + 2})
    else:
        dys = te.compute(_sh(index, N, Gp, Op, *T),
                         lambda n, g, o, *t: _guard(*dval(n, g, o, t), acc),
                         name=f"{name}_dy",
                         attrs={"dense.src": "root", "dense.par": 3 if strided else S + 2})
    return dys


def data_grad(name, dy, w, geom, dt, I_sizes, gm, gn, gk, depthwise, *, index, dys=None,
              last=None):
    """dx[n,g,c,i] = Σ_{o,j} w[g,o,c,K−1−j] · dyz[n,g,o, i + j·d] (padded); -> (main, index).
    ``dys``: dyz made by ``zero_inserted_dy`` with the same arguments (shared with a depthwise
    filter grad), else made here. ``last``: compute channel-last (M = the last spatial dim,
    N = c) whatever the layout (default the layout's); the index maps either way."""
    S, G = geom.S, geom.G
    last = geom.last if last is None else last
    N, Og, Cg = dy.N, w.O, w.C
    acc = dt.compute
    if not depthwise:       # M (c, or the last spatial dim) padded for the CPU micro-kernel's rows
        gm = tile_row_grain(gm, acc)
    d, K = geom.d, geom.k
    Op = ceil_to(Og, gk)
    P, Gp, Cpd = _data_extents(geom, I_sizes, Cg, gm, gn, depthwise, index, last)
    if dys is None:
        dys = zero_inserted_dy(name, dy, Og, Cg, geom, dt, I_sizes, gm, gn, gk, depthwise,
                               index=index, last=last)

    def wval(g, o, c, jj):
        return _all(g < G, o < Og, c < Cg), lambda: w(g, o, c, [K[i] - 1 - jj[i] for i in range(S)])

    if last and depthwise:
        ws = te.compute(_sh(index, *K, Op, Cpd, Gp), lambda *r: _guard(*wval(r[-1], r[-3], r[-2], r[:S]), acc),
                        name=f"{name}_w", attrs={"dense.src": "root"})
        wat = lambda g, o, c, jj: ws[(*jj, o, c, g)]  # noqa: E731
    elif last:
        ws = te.compute(_sh(index, Gp, *K, Op, Cpd), lambda g, *r: _guard(*wval(g, r[-2], r[-1], r[:S]), acc),
                        name=f"{name}_w", attrs={"dense.src": "root"})
        wat = lambda g, o, c, jj: ws[(g, *jj, o, c)]  # noqa: E731
    else:
        ws = te.compute(_sh(index, Gp, Cpd, Op, *K), lambda g, c, o, *jj: _guard(*wval(g, o, c, jj), acc),
                        name=f"{name}_w", attrs={"dense.src": "root"})
        wat = lambda g, o, c, jj: ws[(g, c, o, *jj)]  # noqa: E731

    ro = te.reduce_axis((0, Op), name=f"{name}_o")
    rj = [te.reduce_axis((0, _ix(index, K[i])), name=f"{name}_j{i}") for i in range(S)]
    jj = [r.var for r in rj]
    if last:
        def body(n, *r):
            i, g, c = r[:S], r[S], r[S + 1]
            t = [i[a] + jj[a] * d[a] for a in range(S)]
            return te.sum(dys[(n, *t, g, ro)] * wat(g, ro, c, jj), axis=[ro, *rj])
        attrs = main_attrs(S, S + 1 if depthwise else S + 2, gm, gn, gk=gk,
                           halo=tuple(1 + i for i in range(S - 1)))
        main = te.compute(_sh(index, N, *P, Gp, Cpd), body, name=name, attrs=attrs)
        return main, lambda n, g, c, i: (n, *i, g, c)
    else:
        def body(n, g, c, *i):
            t = [i[a] + jj[a] * d[a] for a in range(S)]
            return te.sum(wat(g, ro, c, jj) * dys[(n, g, ro, *t)], axis=[ro, *rj])
        attrs = main_attrs(1 if depthwise else 2, 2 + S, gm, gn, gk=gk,
                           halo=tuple(3 + i for i in range(S - 1)))
        main = te.compute(_sh(index, N, Gp, Cpd, *P), body, name=name, attrs=attrs)
        return main, lambda n, g, c, i: (n, g, c, *i)


def filter_grad(name, dy, x, geom, dt, gm, gn, gk, depthwise, *, index, unfold=True):
    """dw[g,o,c,k] = Σ_n Σ_p dy[n,g,o,p] · x[n,g,c, p·s + k·d − lo]: the per-sample partial
    filters (main) and their sum over samples (compute dtype).

    x's source is channel-last, phase-split along the leading spatial dims and, with
    ``unfold``, unfolded along the last one (xs[.., p_last, k_last, ..] = x[.., p_last·s +
    k_last·d − lo]) so that the last reduction axis can be padded (to gk) with zeros in *both*
    operands (a zero times an infinite x would make a NaN that Paddle does not have). Without
    (the planner's choice for a last axis of stride 1 that gk divides: nothing is padded) x's
    rows are read in place at p_last + k_last·d, a copy K_last times smaller."""
    S, G = geom.S, geom.G
    N, Og, Cg = dy.N, dy.C, x.C
    acc = dt.compute
    if not depthwise:       # M = o padded for the CPU micro-kernel's rows (as in data_grad)
        gm = tile_row_grain(gm, acc)
    s, d, lo, K = geom.s, geom.d, geom.lo, geom.k
    O, I = dy.sp, x.sp
    L = S - 1
    Pl = ceil_to(O[L], gk)
    Q = [_atleast(index, O[i], 1) + (K[i] - 1) * d[i] // s[i] for i in range(L)]
    if depthwise:     # M = last kernel dim, N = g (c has one element)
        Gp, Opd, Cpd = ceil_to(_ix(index, G), gn), Og, Cg
        Kp = list(K[:-1]) + [ceil_to(_ix(index, K[-1]), gm)]
    else:             # M = o, N = c
        Gp, Opd, Cpd = _ix(index, G), ceil_to(Og, gm), ceil_to(Cg, gn)
        Kp = list(K)

    def xval(n, g, c, ph, q, pl, kl):
        t = [q[i] * s[i] + ph[i] - lo[i] for i in range(L)]
        t.append(pl * s[L] + kl * d[L] - lo[L])
        # an unfolded row's padded positions (pl >= O) are zero (see above)
        ok = _all(g < G, c < Cg, pl < O[L] if unfold else None,
                  *[tirx.all(t[i] >= 0, t[i] < I[i]) for i in range(S)])
        return ok, lambda: x(n, g, c, t)

    if unfold:
        xs = te.compute(_sh(index, N, *s[:L], *Q, _atleast(index, Pl, gk), K[L], Gp, Cpd),
                        lambda n, *r: _guard(*xval(n, r[2 * L + 2], r[2 * L + 3], r[:L],
                                                   r[L:2 * L], r[2 * L], r[2 * L + 1]), acc),
                        name=f"{name}_x", attrs={"dense.src": "root"})
        xat = lambda n, ph, q, pl, kl, g, c: xs[(n, *ph, *q, pl, kl, g, c)]  # noqa: E731
    else:             # stride 1, nothing padded: x[.., pl + kl·d − lo] read in place
        xs = te.compute(_sh(index, N, *s[:L], *Q, _atleast(index, Pl, gk) + (K[L] - 1) * d[L],
                            Gp, Cpd),
                        lambda n, *r: _guard(*xval(n, r[2 * L + 1], r[2 * L + 2], r[:L],
                                                   r[L:2 * L], r[2 * L], 0), acc),
                        name=f"{name}_x", attrs={"dense.src": "root"})
        xat = lambda n, ph, q, pl, kl, g, c: xs[(n, *ph, *q, pl + kl * d[L], g, c)]  # noqa: E731
    P = list(O[:L]) + [Pl]
    Ps = [_atleast(index, O[i], 1) for i in range(L)] + [_atleast(index, Pl, gk)]
    if geom.last or depthwise:   # channel-last: a depthwise N axis (g) is contiguous
        dys = te.compute(_sh(index, N, *Ps, Gp, Opd),
                         lambda n, *r: _guard(_all(r[S] < G, r[S + 1] < Og, r[L] < O[L]),
                                              lambda: dy(n, r[S], r[S + 1], r[:S]), acc),
                         name=f"{name}_dy", attrs={"dense.src": "root"})
        dat = lambda n, g, o, p: dys[(n, *p, g, o)]  # noqa: E731
    else:
        dys = te.compute(_sh(index, N, Gp, Opd, *Ps),
                         lambda n, g, o, *p: _guard(_all(g < G, o < Og, p[L] < O[L]),
                                                    lambda: dy(n, g, o, p), acc),
                         name=f"{name}_dy", attrs={"dense.src": "root"})
        dat = lambda n, g, o, p: dys[(n, g, o, *p)]  # noqa: E731

    rp = [te.reduce_axis((0, P[i]), name=f"{name}_p{i}") for i in range(S)]
    pp = [r.var for r in rp]

    def body(n, g, o, c, *kk):
        # a padded kernel position (depthwise M padding) reads a real x element: its partial
        # is cropped, and reading in bounds needs the kernel index clamped
        kc = [tirx.min(kk[i], K[i] - 1) for i in range(S)]
        ph = [(kc[i] * d[i]) % s[i] for i in range(L)]
        q = [pp[i] + (kc[i] * d[i]) // s[i] for i in range(L)]
        return te.sum(dat(n, g, o, pp) * xat(n, ph, q, pp[L], kc[L], g, c), axis=rp)

    # axes: n, g, o, c, k...; M/N by index among them
    if depthwise:
        attrs = main_attrs(3 + S, 1, gm, gn, gk=gk)
    else:
        attrs = main_attrs(2, 3, gm, gn, gk=gk)
    main = te.compute(_sh(index, N, Gp, Opd, Cpd, *Kp), body, name=name, attrs=attrs)
    rn = te.reduce_axis((0, N), name=f"{name}_n")
    total = te.compute(_sh(index, G, Og, Cg, *K),
                       lambda g, o, c, *kk: te.sum(main[(rn, g, o, c, *kk)], axis=rn),
                       name=f"{name}_sum")
    return total


PLANE_LANES = 16    # the vectorised run of a depthwise filter grad's rows (plane_filter_grad)


def plane_filter_grad(name, dys, x, Og, geom, dt, gm, gn, *, index):
    """The filter grad of a channel-first depthwise convolution, per channel plane, from the
    data grad's dyz (``zero_inserted_dy``, shared): x[i] meets dy[p] where i = p·s + k·d − lo,
    i.e. where dyz's index i + (K−1−k)·d is, so

        dw[g,o,c,K−1−j] = Σ_n Σ_i x[n,g,c,i] · dyz[n,g,o, i + j·d]

    over x's domain. The contraction keeps a run of ``PLANE_LANES`` of the last spatial dim i
    (padded to the data grad's grain gn, x zero-padded to it) as its vectorised N axis, the
    runs along the row reduced with the samples and the other spatial dims, and the last kernel
    dim j (padded to gm, its padded rows cropped) as M: a row of x is loaded once for gm
    shifted rows of dyz, no unfolded copy of x is made, and a tile walks its planes row after
    row, run after run: contiguous memory. (A tile per lane-wide piece of the padded row
    touched a new cache line of each operand at every step and was bound by its latency: 28 %
    of the AVX2 op, at 22 cycles a step, on a Zen 4.) The partial sums per lane are summed
    after (compute dtype)."""
    S, G = geom.S, geom.G
    N, Cg, I = x.N, x.C, x.sp
    acc = dt.compute
    d, K = geom.d, geom.k
    L = S - 1
    P = ceil_to(I[L], gn)
    xs = te.compute(_sh(index, N, G, Cg, *I[:L], P),
                    lambda n, g, c, *i: _guard(i[L] < I[L], lambda: x(n, g, c, i), acc),
                    name=f"{name}_x", attrs={"dense.src": "root", "dense.par": 3})
    W = min(PLANE_LANES, gn)        # divides gn, hence P
    rn = te.reduce_axis((0, N), name=f"{name}_n")
    ri = [te.reduce_axis((0, I[a]), name=f"{name}_i{a}") for a in range(L)]
    ii = [r.var for r in ri]
    rw = te.reduce_axis((0, tirx.floordiv(P, W)), name=f"{name}_run")

    def body(g, o, c, *r):
        jc = [tirx.min(r[a], K[a] - 1) for a in range(S)]
        i = rw.var * W + r[S]
        t = [ii[a] + jc[a] * d[a] for a in range(L)] + [i + jc[L] * d[L]]
        return te.sum(xs[(rn, g, c, *ii, i)] * dys[(rn, g, o, *t)], axis=[rn, *ri, rw])

    Kp = list(K[:-1]) + [ceil_to(_ix(index, K[-1]), gm)]
    attrs = main_attrs(2 + S, 3 + S, gm, W, gk=1, halo=tuple(3 + a for a in range(L)))
    main = te.compute(_sh(index, G, Og, Cg, *Kp, W), body, name=name, attrs=attrs)
    rl = te.reduce_axis((0, W), name=f"{name}_l")
    return te.compute(_sh(index, G, Og, Cg, *K),
                      lambda g, o, c, *k: te.sum(
                          main[(g, o, c, *(K[a] - 1 - k[a] for a in range(S)), rl)], axis=rl),
                      name=f"{name}_sum")


def _guard(ok, value, acc):
    """value() where ok, else 0 (a guarded load: the load happens only where ok)."""
    return te.if_then_else(ok, value().astype(acc), tirx.const(0, acc))


# ------------------------------------------------------------------------------------------
# planning: views, roles and grains

def kgrain(n: int) -> int:
    """Padding of a contraction's first reduction axis: the power of two >= n, at most PAD_K."""
    g = 1
    while g < min(n, PAD_K):
        g *= 2
    return g


def _least_padding(n, grains, symbolic):
    """The grain (of ``grains``) padding n least, the larger of equals; ``symbolic`` for a
    symbolic n."""
    if is_symbolic(n):
        return symbolic
    return min(grains, key=lambda g: (-(-n // g) * g, -g))


def row_grain(n) -> int:
    """Padding of a spatial M axis (the rows of a channel-last contraction): the grain padding
    it least (56 rows: 8, not 64). Rows are blocked a few at a time, so a small grain costs no
    vector lanes, while padding 56 to 64 computes 14 % more."""
    return _least_padding(n, GRAINS, grain(n))


def sgrain(n) -> int:
    """Padding of a filter grad's spatial reduction axis: the power of two from 4 to PAD_K
    padding it least (56: 8 rather than 16, which would reduce over 64)."""
    return _least_padding(n, [g for g in GRAINS if g <= PAD_K], kgrain(n))


def _channel_last_data(geom, sz, depthwise) -> bool:
    """Compute a data grad channel-last (M = the last spatial dim, N = c) even for a
    channel-first layout when the channels of a group are many (a full grain) and the window
    small (at most 3 x 3 taps): the vectorised axis is then exact while the spatial row would be
    padded to the 64 grain (56 -> 64), and the spatial rows pad to ``row_grain``; the copy of dy
    and the store of dx transpose. The row tiles share the filter panel of one vector of
    channels (taps x Og x lanes): with a larger window (3 x 3 x 3) it no longer stays in cache
    and the channel-first form, whose tiles share a few filter rows, is faster (measured on
    conv3d 64 -> 64 at 16 x 56 x 56: 401 ms against 286 ms)."""
    if geom.last:
        return True
    return not depthwise and grain(sz["Cg"]) == max(GRAINS) and math.prod(geom.k) <= 9


def _roles(geom, sz, kinds):
    """Grains of each contraction: {kind: (gm, gn, gk, depthwise)}, the data grad's with its
    compute layout (channel-last or not) fifth, the filter grad's with whether it unfolds x."""
    G, last = geom.G, geom.last
    out = {}
    for kind in kinds:
        if kind == "data":        # blocks over c (or g); vectorises I_last (NC) / c (NL)
            dw = _depthwise(sz["Cg"], None, G)
            ch = G if dw else sz["Cg"]
            sp = sz["I"][-1]
            cl = _channel_last_data(geom, sz, dw)
            gm, gn = (row_grain(sp), grain(ch)) if cl else (grain(ch), grain(sp))
            out[kind] = (gm, gn, kgrain(sz["Og"]), dw, cl)
        elif kind in ("forward", "forward2"):   # blocks over o (or g)
            dw = _depthwise(sz["Og"], None, G)
            ch = G if dw else sz["Og"]
            sp = sz["O"][-1]
            gm, gn = (row_grain(sp), grain(ch)) if last else (grain(ch), grain(sp))
            ctot = sz["Cg"] * (2 if kind == "forward2" else 1)
            out[kind] = (gm, gn, kgrain(ctot), dw)
        elif kind == "filter":    # M = o (or the last kernel dim), N = c (or g)
            dw = _depthwise(sz["Cg"], None, G)
            gk = sgrain(sz["O"][-1])
            # x unfolded along the last spatial dim unless its reduction is not padded (and
            # unstrided): then x's rows are read in place at p + k·d
            unfold = is_symbolic(sz["O"][-1]) or sz["O"][-1] % gk != 0 or geom.s[-1] != 1
            if dw:
                out[kind] = (grain(geom.k[-1]), grain(G), gk, True, unfold)
            else:
                out[kind] = (grain(sz["Og"]), grain(sz["Cg"]), gk, False, unfold)
    if "data" in kinds and "filter" in kinds:     # both grads of a depthwise conv in one pass
        out["planes"] = out["data"][3] and _conv_planes.fits(geom, sz)
    return out


def _conv_views(S, kinds, *, x="input", filter="filter", out="out_grad", transpose=False,
                extra=()):
    """views(call, outs) for a conv grad: zero-copy 5-/6-D views, the geometry and the grains
    of the contractions ``kinds`` in the key."""
    def views(call, outs):
        geom, sz = _conv_geom(call, S, x=x, filter=filter, out=out, transpose=transpose)
        last, G = geom.last, geom.G
        xt = _tpl(S, last, G, "Cg", "I")
        ot = _tpl(S, last, G, "Og", "O")
        if transpose:     # filter [C_in, C_out/G, k]: (G, C_in/G, C_out/G, k)
            ft = (G, "Cg", "Og", *geom.k)
        else:
            ft = (G, "Og", "Cg", *geom.k)
        tpl = {x: xt, filter: ft, out: ot}
        for name, like in extra:
            tpl[name] = {"x": xt, "filter": ft, "out": ot}[like]
        for o_name, meta in zip(call.spec.output_names, outs):
            if meta is None:
                continue
            src = {"input_grad": x, "x_grad": x, "filter_grad": filter,
                   "grad_out_grad": out}[o_name]
            tpl[o_name] = tpl[src]
        for name, like in extra:
            m = call.meta(name)
            if m is not None and m.shape != call.meta({"x": x, "filter": filter, "out": out}[like]).shape:
                fail(call.op, f"input {name!r} has shape {list(m.shape)}, expected the shape of "
                               f"{ {'x': x, 'filter': filter, 'out': out}[like]!r} "
                               f"{list(call.meta({'x': x, 'filter': filter, 'out': out}[like]).shape)}")
        sizes = {"N": sz["N"], "Cg": sz["Cg"], "Og": sz["Og"]}
        sizes.update({f"I{i}": v for i, v in enumerate(sz["I"])})
        sizes.update({f"O{i}": v for i, v in enumerate(sz["O"])})
        if transpose:     # the contractions see out_grad as their input, x as their output
            sz = dict(sz, Cg=sz["Og"], Og=sz["Cg"], I=sz["O"], O=sz["I"])
        roles = _roles(geom, sz, kinds)
        geom = Geom(geom.S, geom.last, geom.G, geom.k, geom.s, geom.d, geom.lo, geom.hi,
                    tuple(sorted(roles.items())))
        return View(tpl, sizes, (geom,))
    return views


def _geom(ctx):
    """The call's ``Geom`` and its contractions' roles (the build information of its views)."""
    (geom,) = ctx.info
    return geom, dict(geom.roles)


def _act_out(name, like, main, index, dt, last, S):
    """The cropped, cast output in the view layout of ``like`` from a contraction's main."""
    cast = store(dt)
    if last:
        def f(n, *r):
            return cast(main[index(n, r[S], r[S + 1], r[:S])])
    else:
        def f(n, g, c, *sp):
            return cast(main[index(n, g, c, sp)])
    return te.compute(like.shape, f, name=name)


def _filt_out(name, like, total, dt):
    cast = store(dt)
    return te.compute(like.shape, lambda *i: cast(total[i]), name=name)


def _zeros(name, like, dt):
    return te.compute(like.shape, lambda *i: tirx.const(0, dt.storage), name=name)


def _conv_grads(ctx, input, filter, out_grad, need_dx=True, need_dw=True):
    geom, roles = _geom(ctx)
    dt = as_dtype(input.dtype)
    last, S = geom.last, geom.S
    x, dy, w = Act(input, last, dt), Act(out_grad, last, dt), Filt(filter, dt)
    dx_t = dw_t = None
    if need_dx and need_dw and roles.get("planes"):
        # one channel per group, channel-first: both grads in one pass over each plane
        dx_t, total = _conv_planes.plane_grads(input, filter, out_grad, geom, dt, ctx)
        return dx_t, _filt_out("filter_grad", filter, total, dt)
    if need_dx and need_dw and not last and roles["data"][3] and roles["filter"][3]:
        # a channel-first depthwise conv: both grads read one dyz, the filter grad per plane
        gm, gn, gk, dwise, _ = roles["data"]
        dys = zero_inserted_dy("conv_dx", dy, w.O, w.C, geom, dt, x.sp, gm, gn, gk, dwise,
                               index=ctx.index)
        main, idx = data_grad("conv_dx", dy, w, geom, dt, x.sp, gm, gn, gk, dwise,
                              index=ctx.index, dys=dys)
        dx_t = _act_out("input_grad", input, main, idx, dt, last, S)
        total = plane_filter_grad("conv_dw", dys, x, w.O, geom, dt, grain(geom.k[-1]), gn,
                                  index=ctx.index)
        return dx_t, _filt_out("filter_grad", filter, total, dt)
    if need_dx:
        gm, gn, gk, dwise, cl = roles["data"]
        main, idx = data_grad("conv_dx", dy, w, geom, dt, x.sp, gm, gn, gk, dwise, index=ctx.index,
                              last=cl)
        dx_t = _act_out("input_grad", input, main, idx, dt, last, S)
    if need_dw:
        gm, gn, gk, dwise, unfold = roles["filter"]
        total = filter_grad("conv_dw", dy, x, geom, dt, gm, gn, gk, dwise, index=ctx.index,
                            unfold=unfold)
        dw_t = _filt_out("filter_grad", filter, total, dt)
    return dx_t, dw_t


# ------------------------------------------------------------------------------------------
# first-order grads

@dense_op(views=_conv_views(2, ("data", "filter")))
def conv2d_grad(input, filter, out_grad, strides, paddings, padding_algorithm, dilations, groups,
                data_format, ctx):
    """input_grad = conv_transpose(out_grad, filter), filter_grad = Σ_n corr(input, out_grad)
    (see the module docstring)."""
    return _conv_grads(ctx, input, filter, out_grad)


@dense_op(views=_conv_views(3, ("data", "filter")))
def conv3d_grad(input, filter, out_grad, strides, paddings, padding_algorithm, groups, dilations,
                data_format, ctx):
    """conv2d_grad in 3-D."""
    return _conv_grads(ctx, input, filter, out_grad)


@dense_op(views=_conv_views(2, ("data", "filter")))
def depthwise_conv2d_grad(input, filter, out_grad, strides, paddings, padding_algorithm, groups,
                          dilations, data_format, ctx):
    """conv2d_grad with groups (typically = channels: the contractions block over groups)."""
    return _conv_grads(ctx, input, filter, out_grad)


# ------------------------------------------------------------------------------------------
# conv3d_transpose_grad

@dense_op(views=_conv_views(3, ("forward", "filter"), x="x", out="out_grad", transpose=True))
def conv3d_transpose_grad(x, filter, out_grad, strides, paddings, output_padding, output_size,
                          padding_algorithm, groups, dilations, data_format, ctx):
    """out = conv_transpose(x, w) is the data grad of a conv of out with w, so
    x_grad = conv(out_grad, w) (w [C_in, C_out/G, k] read as [o = C_in, c = C_out]) and
    filter_grad = Σ_n corr(out_grad, x) (the conv filter grad with dy := x, x := out_grad).
    Paddings resolve against x's size (Paddle's UpdatePaddingAndDilation on the input);
    output_padding / output_size only shape out_grad."""
    geom, roles = _geom(ctx)
    dt = as_dtype(x.dtype)
    last, S = geom.last, geom.S
    xa, ga, w = Act(x, last, dt), Act(out_grad, last, dt), Filt(filter, dt)
    gm, gn, gk, dwise = roles["forward"]
    # forward conv of out_grad (channels C_out/G = Og) with w[g, o=C_in/G, c=C_out/G]
    main, idx = forward("c3t_dx", [(ga, w)], geom, dt, xa.sp, gm, gn, gk, dwise, index=ctx.index)
    dx_t = _act_out("x_grad", x, main, idx, dt, last, S)
    gm, gn, gk, dwise, unfold = roles["filter"]
    total = filter_grad("c3t_dw", xa, ga, geom, dt, gm, gn, gk, dwise, index=ctx.index,
                        unfold=unfold)
    dw_t = _filt_out("filter_grad", filter, total, dt)
    return dx_t, dw_t


# ------------------------------------------------------------------------------------------
# double grads

def _double(ctx, input, filter, grad_out, grad_input_grad, grad_filter_grad):
    """input_grad = data grad of (grad_out, ddW); filter_grad = filter grad of (ddX, grad_out);
    grad_out_grad = conv(ddX, W) + conv(X, ddW) (one forward contraction over both, channels
    concatenated). An absent ddX / ddW contributes zero."""
    geom, roles = _geom(ctx)
    dt = as_dtype(input.dtype)
    last, S = geom.last, geom.S
    x, dy, w = Act(input, last, dt), Act(grad_out, last, dt), Filt(filter, dt)
    ddx = None if grad_input_grad is None else Act(grad_input_grad, last, dt)
    ddw = None if grad_filter_grad is None else Filt(grad_filter_grad, dt)
    if ddw is not None:
        gm, gn, gk, dwise, cl = roles["data"]
        main, idx = data_grad("cgg_dx", dy, ddw, geom, dt, x.sp, gm, gn, gk, dwise,
                              index=ctx.index, last=cl)
        dx_t = _act_out("input_grad", input, main, idx, dt, last, S)
    else:
        dx_t = _zeros("input_grad", input, dt)
    if ddx is not None:
        gm, gn, gk, dwise, unfold = roles["filter"]
        total = filter_grad("cgg_dw", dy, ddx, geom, dt, gm, gn, gk, dwise, index=ctx.index,
                            unfold=unfold)
        dw_t = _filt_out("filter_grad", filter, total, dt)
    else:
        dw_t = _zeros("filter_grad", filter, dt)
    terms = ([(ddx, w)] if ddx is not None else []) + ([(x, ddw)] if ddw is not None else [])
    if terms:
        kind = "forward2" if len(terms) == 2 else "forward"
        gm, gn, gk, dwise = roles[kind]
        main, idx = forward("cgg_ddy", terms, geom, dt, dy.sp, gm, gn, gk, dwise, index=ctx.index)
        ddy_t = _act_out("grad_out_grad", grad_out, main, idx, dt, last, S)
    else:
        ddy_t = _zeros("grad_out_grad", grad_out, dt)
    return dx_t, dw_t, ddy_t


_DOUBLE_EXTRA = (("grad_input_grad", "x"), ("grad_filter_grad", "filter"))


def _double_views(S):
    base = _conv_views(S, ("data", "filter", "forward", "forward2"), out="grad_out",
                       extra=_DOUBLE_EXTRA)
    return base


@dense_op(views=_double_views(2))
def conv2d_grad_grad(input, filter, grad_out, grad_input_grad, grad_filter_grad, strides,
                     paddings, padding_algorithm, dilations, groups, data_format, ctx):
    """Second-order conv2d grad (see ``_double``)."""
    return _double(ctx, input, filter, grad_out, grad_input_grad, grad_filter_grad)


@dense_op(views=_double_views(3))
def conv3d_double_grad(input, filter, grad_out, grad_input_grad, grad_filter_grad, strides,
                       paddings, padding_algorithm, groups, dilations, data_format, ctx):
    """Second-order conv3d grad (see ``_double``)."""
    return _double(ctx, input, filter, grad_out, grad_input_grad, grad_filter_grad)


@dense_op(views=_double_views(2))
def depthwise_conv2d_double_grad(input, filter, grad_out, grad_input_grad, grad_filter_grad,
                                 strides, paddings, padding_algorithm, groups, dilations,
                                 data_format, ctx):
    """Second-order depthwise_conv2d grad (see ``_double``)."""
    return _double(ctx, input, filter, grad_out, grad_input_grad, grad_filter_grad)
