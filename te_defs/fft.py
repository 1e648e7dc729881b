"""FFT grads (fft_c2c_grad, fft_r2c_grad, fft_c2r_grad): real O(n log n) FFTs in TIR.

A grad of an FFT is an FFT in the other direction with the same normalisation factor (Paddle's
fft_grad_kernel_impl.h): ``norm`` = none / 1/N / 1/√N from (normalization, forward) as
``get_norm_from_string`` (N = the product of the signal's sizes along ``axes``):

* fft_c2c_grad: x_grad = norm · DFT_{+ if forward else -}(out_grad) over ``axes``;
* fft_r2c_grad: out_grad zero-padded along the last axis to x's size (onesided), the c2c
  transform, the real part;
* fft_c2r_grad: the r2c transform of the real out_grad (the first n // 2 + 1 bins along the last
  axis), the bins 1 .. n - n//2 - 1 doubled (they stand for their conjugate twins).

The transform runs one axis at a time on flat complex buffers seen as (outer, L, inner):

* L a power of two: Stockham radix-2 autosort, log2 L stages, each a TIR sblock over the L/2
  butterflies of every line (parallel / one CUDA thread per butterfly), ping-ponging between the
  two halves of a work buffer; the stage loop runs on the host (a kernel launch per stage on CUDA);
* other L: Bluestein's chirp-z algorithm, a convolution done with three power-of-two FFTs of
  size M >= 2L - 1 (the chirp angles π·(j² mod 2L)/L stay exact).

One kernel serves every size whose "power of two" pattern over the axes matches (log2 L, M, log2 M
are runtime arguments; the planner, tvmgrad/families/fft.py, computes them and hands the builders
the pattern as ``ctx.info``). Complex numbers are float pairs (a trailing dim of 2).

Size-0 dims: an empty grad needs no kernel (none runs: the stage index math would divide by the
zero size, SIGFPE); fft_c2r_grad over a transform axis of size 0 is a ValueError, as in Paddle
("Invalid fft n-point (0)"), while c2c and r2c give the empty grad as Paddle does.
"""

from __future__ import annotations

import math

from tvmgrad.dtypes import COMPLEX, FLOATS, to_compute
from tvmgrad.families.complex import Complex
from tvmgrad.families.fft import fft_op
from tvmgrad.lazy import te, tirx

from ._extern import units

__all__ = ["fft_c2c_grad", "fft_r2c_grad", "fft_c2r_grad"]


def _transform(ctx, z0):
    """The grad's transform over ``ctx.info.axes`` of the complex signal ``z0(*idx, c)`` (shape:
    the signal dims ``d0``, ... and a trailing (re, im) dim of 2), one axis at a time."""
    info = ctx.info
    dims = [ctx.symbol(f"d{i}") for i in range(info.rank)]
    sign = ctx.scalars["fft_sign"]                  # +1: e^{+2πi jk/n}, -1: e^{-2πi jk/n}
    z = te.compute(dims + [2], z0, name="z0")
    for a, p in zip(info.axes, info.pow2):
        if p:
            z = _fft_pow2(z, a, ctx.scalars[f"l2_{a}"], sign, info.real, f"fft{a}")
        else:
            z = _bluestein(z, a, ctx.scalars[f"m_{a}"], ctx.scalars[f"l2m_{a}"], sign, info.real, f"bs{a}")
    return z, dims


def _prod(xs):
    p = tirx.const(1, "int64")
    for x in xs:
        p = p * x
    return p


def _flat(idx, shape):
    f = tirx.const(0, "int64")
    for i, d in zip(idx, shape):
        f = f * d + i
    return f


def _fft_pow2(src, axis: int, l2, sign, real: str, name: str):
    """Stockham radix-2 FFT along ``axis`` (length L = 2**l2) of a complex tensor ``src`` (shape
    [..., 2]): X_k = Σ_j x_j e^{sign·2πi jk/L}; returns a tensor of src's shape.

    The data is copied into a flat buffer A seen as (outer, L, inner); stages ping-pong between A
    and B: a host loop runs pairs of stages (A -> B, then B -> A), then a last stage A -> B when l2
    is odd; the result is in A (l2 even) or B. Each stage is a spatial sblock over the
    (outer, inner, L/2) butterflies; in the paired ones the pair index is a block axis too (sblock
    attr ``fft.stage`` = 1: its first loop is the serial stage loop). Index math is multiply-add
    only (TVM's buffer compaction trips over divisions by products of shape vars)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    shape = list(src.shape[:-1])
    outer, length, inner = _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1:])
    n_total = _prod(shape)
    one64 = tirx.const(1, "int64")
    two64 = tirx.const(2, "int64")
    half = tirx.shift_right(length, one64)

    def butterfly(t, o, i, j, R, Wr, TW):
        s = tirx.shift_left(one64, t)
        m = tirx.shift_right(length, t + one64)
        p = tirx.shift_right(j, t)
        q = tirx.bitwise_and(j, s - one64)
        base = o * length * inner + i
        ia = base + (q + s * p) * inner
        ib_ = base + (q + s * (p + m)) * inner
        oa = base + (q + s * (p * two64)) * inner
        ob = base + (q + s * (p * two64 + one64)) * inner
        u = Complex(R[ia, 0], R[ia, 1])
        v = Complex(R[ib_, 0], R[ib_, 1])
        d = (u - v) * Complex(TW[p * s, 0], TW[p * s, 1])    # e^{sign·iπ p/m} = table[p·s]
        Wr[oa, 0] = u.re + v.re
        Wr[oa, 1] = u.im + v.im
        Wr[ob, 0] = d.re
        Wr[ob, 1] = d.im

    def gen(ins, outs):
        s_buf, tw_buf, a_buf, b_buf = ins[0], ins[1], outs[0], outs[1]
        S, A, B = T.buffer_proxy(s_buf), T.buffer_proxy(a_buf), T.buffer_proxy(b_buf)
        TW = T.buffer_proxy(tw_buf)
        sshape = list(s_buf.shape[:-1])
        with IRBuilder() as ib, T.seq_scope():
            with units(f"{name}_in", sshape) as idx:
                f = _flat(idx, sshape)
                T.reads(s_buf[tuple(idx) + (slice(0, 2),)])
                T.writes(a_buf[f, 0:2])
                A[f, 0] = S[tuple(idx) + (0,)]
                A[f, 1] = S[tuple(idx) + (1,)]
            pairs = tirx.shift_right(l2, one64)
            with T.serial(tirx.const(0, "int64"), pairs) as tp:
                for step, (sb, db, R, Wr) in enumerate(((a_buf, b_buf, A, B), (b_buf, a_buf, B, A))):
                    with T.grid(outer, inner, half) as (lo, li, lj):
                        with T.sblock(f"{name}_pair{step}"):
                            t2 = T.axis.spatial(pairs, tp, dtype="int64")
                            o = T.axis.spatial(outer, lo, dtype="int64")
                            i = T.axis.spatial(inner, li, dtype="int64")
                            j = T.axis.spatial(half, lj, dtype="int64")
                            T.reads(sb[0:n_total, 0:2], tw_buf[0:half, 0:2])
                            T.writes(db[0:n_total, 0:2])
                            T.sblock_attr({"fft.stage": 1})
                            butterfly(t2 * two64 + step, o, i, j, R, Wr, TW)
            with T.If(tirx.floormod(l2, two64) == one64):
                with T.Then():
                    with units(f"{name}_last", [outer, inner, half]) as (o, i, j):
                        T.reads(a_buf[0:n_total, 0:2], tw_buf[0:half, 0:2])
                        T.writes(b_buf[0:n_total, 0:2])
                        T.sblock_attr({"fft.stage": 0})
                        butterfly(l2 - one64, o, i, j, A, B, TW)
        return ib.get()

    # twiddles e^{sign·2πi r/L}, r < L/2 (one sincos per entry instead of per butterfly)
    two_pi = tirx.const(2 * math.pi, real)
    tw = te.compute((half, 2), lambda r, c: tirx.Select(
        c == 0, tirx.cos(two_pi * r.astype(real) / length.astype(real)),
        _signed(sign, real) * tirx.sin(two_pi * r.astype(real) / length.astype(real))), name=f"{name}_tw")
    a, b = te.extern([(n_total, 2), (n_total, 2)], [src, tw], gen, name=name, dtype=[real, real])
    odd = tirx.floormod(l2, two64) == one64

    def out(*idx):
        *idx, c = idx
        f = _flat(idx, shape)
        return tirx.Select(odd, b[f, c], a[f, c])

    return te.compute(shape + [2], out, name=f"{name}_out")


def _signed(sign, real):
    """The direction sign (a runtime var, or ±1) as a real scalar."""
    return tirx.const(float(sign), real) if isinstance(sign, (int, float)) else sign


def _chirp(j, length, sign, real):
    """e^{sign·iπ j²/L} with j² reduced mod 2L (exact angles)."""
    jj = tirx.floormod(j * j, length * 2)
    ang = tirx.const(math.pi, real) * jj.astype(real) / length.astype(real)
    return Complex(tirx.cos(ang), _signed(sign, real) * tirx.sin(ang))


def _bluestein(src, axis: int, m, l2m, sign, real: str, name: str):
    """The DFT along ``axis`` of any length L by Bluestein's algorithm:
    X_k = w_k Σ_j (x_j w_j) conj(w_{k-j}), w_j = e^{sign·iπ j²/L}, the circular convolution
    (size M >= 2L - 1, a power of two) by power-of-two FFTs."""
    zero = tirx.const(0.0, real)
    shape = list(src.shape[:-1])
    length = shape[axis]
    pshape = list(shape)
    pshape[axis] = m

    def a0(*idx):
        *idx, c = idx
        j = idx[axis]
        jc = tirx.min(j, length - 1)
        at = list(idx)
        at[axis] = jc
        x = Complex(src(*at, 0), src(*at, 1)) * _chirp(jc, length, sign, real)
        return tirx.Select(j < length, tirx.Select(c == 0, x.re, x.im), zero)

    a = te.compute(pshape + [2], a0, name=f"{name}_a")

    def b0(f, c):
        j = tirx.Select(f < length, f, m - f)
        inside = tirx.any(f < length, f > m - length)
        jc = tirx.max(tirx.min(j, length - 1), tirx.const(0, "int64"))
        w = _chirp(jc, length, sign, real).conj()
        return tirx.Select(inside, tirx.Select(c == 0, w.re, w.im), zero)

    b = te.compute((m, 2), b0, name=f"{name}_b")
    fa = _fft_pow2(a, axis, l2m, -1, real, f"{name}_fa")
    fb = _fft_pow2(b, 0, l2m, -1, real, f"{name}_fb")

    def prod(*idx):
        *idx, c = idx
        v = Complex(fa(*idx, 0), fa(*idx, 1)) * Complex(fb[idx[axis], 0], fb[idx[axis], 1])
        return tirx.Select(c == 0, v.re, v.im)

    cc = te.compute(pshape + [2], prod, name=f"{name}_c")
    conv = _fft_pow2(cc, axis, l2m, 1, real, f"{name}_conv")

    def out(*idx):
        *idx, c = idx
        v = Complex(conv(*idx, 0), conv(*idx, 1)) * _chirp(idx[axis], length, sign, real)
        v = v / m.astype(real)
        return tirx.Select(c == 0, v.re, v.im)

    return te.compute(shape + [2], out, name=f"{name}_out")


# ------------------------------------------------------------------------------------------
# the ops

@fft_op(kind="c2c", dtypes=COMPLEX)
def fft_c2c_grad(out_grad, axes, normalization, forward, ctx):
    """x_grad = norm · DFT_{+ if forward else -}(out_grad) over axes"""
    z, dims = _transform(ctx, lambda *idx: out_grad(*idx))
    scale = ctx.scalars["fft_scale"]
    return te.compute(dims + [2], lambda *i: (z(*i) * scale).astype(ctx.dtype.storage), name="x_grad")


@fft_op(kind="r2c", dtypes=COMPLEX)
def fft_r2c_grad(x, out_grad, axes, normalization, forward, onesided, ctx):
    """x_grad = Re(norm · DFT_{+ if forward else -}(out_grad zero-padded to x's size)) over axes"""
    last, real = ctx.info.axes[-1], ctx.info.real
    n_g = out_grad.shape[last]

    def z0(*idx):                                   # zero-padded to x's size
        *idx, c = idx
        safe = list(idx)
        safe[last] = tirx.min(idx[last], n_g - 1)
        return tirx.Select(idx[last] < n_g, out_grad(*safe, c), tirx.const(0.0, real))

    z, dims = _transform(ctx, z0)
    scale = ctx.scalars["fft_scale"]
    return te.compute(dims, lambda *i: (z(*i, 0) * scale).astype(x.dtype), name="x_grad")


@fft_op(kind="c2r", dtypes=FLOATS)
def fft_c2r_grad(out_grad, axes, normalization, forward, last_dim_size, ctx):
    """x_grad = norm · DFT_{+ if forward else -}(out_grad) over axes, the first n//2 + 1 bins along
    the last axis, bins 1 .. n - n//2 - 1 doubled"""
    last, real = ctx.info.axes[-1], ctx.info.real

    def z0(*idx):                                   # the real signal
        *idx, c = idx
        return tirx.Select(c == 0, to_compute(out_grad(*idx), ctx.dtype), tirx.const(0.0, real))

    z, dims = _transform(ctx, z0)
    scale = ctx.scalars["fft_scale"]
    n_last = dims[last]
    oshape = list(dims)
    oshape[last] = tirx.floordiv(n_last, 2) + 1
    double_end = n_last - tirx.floordiv(n_last, 2)        # bins 1 .. double_end - 1

    def c2r(*i):
        k = i[last]
        twice = tirx.all(k > 0, k < double_end)
        f = tirx.Select(twice, tirx.const(2.0, real), tirx.const(1.0, real)) * scale
        return (z(*i) * f).astype(real)

    return te.compute(oshape + [2], c2r, name="x_grad")
