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

* L a power of two (``_fft_pow2``), in one of two forms chosen by the ``tvmgrad_on_cuda`` flag:
  CPU, the four-step algorithm (L = L1·L2, two passes over memory, each a parallel sblock over
  units of neighbouring lines (a 128-byte row of points) whose Stockham radix-2/4 stages all run
  in a cache-sized scratch buffer, vectorised across the lines); CUDA, Stockham radix-2 autosort
  with one sblock per stage over the butterflies of every line (a thread per butterfly, a launch
  per stage); both take their twiddles from one two-level table of ~3·√L roots;
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

import contextlib
import contextvars
import math

from tvmgrad.dtypes import COMPLEX, FLOATS, to_compute
from tvmgrad.families.complex import Complex
from tvmgrad.families.fft import fft_op
from tvmgrad.lazy import te, tirx

from ._extern import scratch, units

__all__ = ["fft_c2c_grad", "fft_r2c_grad", "fft_c2r_grad", "butterfly_vectors"]


def _transform(ctx, z0, scale=None):
    """The grad's transform over ``ctx.info.axes`` of the complex signal ``z0`` (shape: the signal
    dims ``d0``, ... and a trailing (re, im) dim of 2), one axis at a time: ``z0`` is a tensor
    that the first transform reads as it is, or a function ``z0(*idx, c)`` (computed into one
    first). ``scale``: a factor the first transform applies as it reads its input."""
    info = ctx.info
    dims = [ctx.symbol(f"d{i}") for i in range(info.rank)]
    sign = ctx.scalars["fft_sign"]                  # +1: e^{+2πi jk/n}, -1: e^{-2πi jk/n}
    z = z0 if isinstance(z0, te.Tensor) else te.compute(dims + [2], z0, name="z0")
    cuda = ctx.on_cuda()
    for a, p in zip(info.axes, info.pow2):
        if p:
            z = _fft_pow2(z, a, ctx.scalars[f"l2_{a}"], sign, info.real, f"fft{a}", cuda, scale)
        else:
            z = _bluestein(z, a, ctx.scalars[f"m_{a}"], ctx.scalars[f"l2m_{a}"], sign, info.real, f"bs{a}",
                           cuda, scale)
        scale = None
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


# A row of a CPU unit (the lines it transforms together, the vector lanes of its butterflies):
# 128 bytes, the pair of cache lines that the L2's adjacent-line prefetcher fetches together. A
# blocking factor of the algorithm and the memory, not of an ISA. 2^20 points, in-process A/B:
# complex64 rows of 16 against 8 (one line): -9 % on x86-64-v3, -4 % on AVX-512; complex128 rows of
# 16 (256 bytes) against 8: +5 %.
ROW_BYTES = 128

_VECTOR_BYTES = contextvars.ContextVar("tvmgrad_fft_vector_bytes", default=ROW_BYTES)


@contextlib.contextmanager
def butterfly_vectors(nbytes: int):
    """Within: the four-step's radix-4 butterflies take a unit's lanes ``nbytes`` of re (and of
    im) at a time, one vector register of the CPU target (entered by tvmgrad.build.lower; the
    kernel cache keys the target). Outside (CUDA, a function made outside a build): all the
    lanes at once."""
    token = _VECTOR_BYTES.set(nbytes)
    try:
        yield
    finally:
        _VECTOR_BYTES.reset(token)


def lanes_of(real: str) -> int:
    """The lines of a CPU unit for complex numbers of ``real`` pairs."""
    import tvm
    return ROW_BYTES // (2 * tvm.DataType(real).bits // 8)


def _butterfly_lanes(real: str) -> int:
    """The lanes a radix-4 butterfly takes at a time (``butterfly_vectors``): its 4 inputs are 8
    rows of that many lanes, one register each. All of a unit's 16 complex64 lanes on AVX2 (two
    ymm a row: 16 for the inputs alone, spilled) against 8 at a time: -11 % for a 2^20-point
    transform (in-process A/B, 2 threads), complex128 4 against 8: -8 %; on AVX-512 (one zmm a
    row) 8 at a time against all 16: +4 %."""
    import tvm
    width = lanes_of(real)
    return max(1, min(width, _VECTOR_BYTES.get() // (tvm.DataType(real).bits // 8)))


def _i64(v):
    return tirx.const(v, "int64")


def _twiddles(length, len1, len2, sign, real, name):
    """One table of e^{sign·2πi r/L} (computed in float64): ``lo`` (r < L2) at [0, L2), ``hi``
    (r = k·L2, k < L1: the L1-point roots) at [L2, L2 + L1), the L2-point roots (r = k·L1, k <
    L2) at [L2 + L1, 2·L2 + L1). Any root w^r, r < L, is hi[r >> log2 L2] · lo[r mod L2]."""
    def tw(f, c):
        r = tirx.Select(f < len2, f, tirx.Select(f < len2 + len1, (f - len2) * len2, (f - len2 - len1) * len1))
        ang = tirx.const(2 * math.pi, "float64") * r.astype("float64") / length.astype("float64")
        s = _signed(sign, "float64") if isinstance(sign, (int, float)) else sign.astype("float64")
        return tirx.Select(c == 0, tirx.cos(ang), s * tirx.sin(ang)).astype(real)
    return te.compute((len2 * 2 + len1, 2), tw, name=f"{name}_tw")


def _root(TB, r, h, len2):
    """w^r (r < L) from the two-level table."""
    lo = tirx.bitwise_and(r, len2 - _i64(1))
    hi = len2 + tirx.shift_right(r, h)
    return Complex(TB[hi, 0], TB[hi, 1]) * Complex(TB[lo, 0], TB[lo, 1])


def _fft_pow2(src, axis: int, l2, sign, real: str, name: str, cuda, scale=None):
    """FFT along ``axis`` (length L = 2**l2) of a complex tensor ``src`` (shape [..., 2]):
    X_k = Σ_j x_j e^{sign·2πi jk/L} (times ``scale``, if given, applied as x is read); returns a
    tensor of src's shape. Data seen as flat (outer, L, inner); the twiddles come from a
    two-level table (``_twiddles``).

    CPU (``cuda`` = 0): the four-step algorithm, L = L1·L2 (L2 = 2**ceil(l2/2)), j = j1 + L1·j2,
    k = k2 + L2·k1: (1) the L2-point FFTs over j2 of every (outer, j1, inner) line, times
    w^{j1·k2}, into a work buffer (its lines (k2, inner) in blocks: ``_four_step``); (2) the
    L1-point FFTs over j1 of every (outer, k2, inner) line into the result. Each is one parallel
    sblock over units of ``lanes_of`` neighbouring lines (neighbours in memory: a unit loads and
    stores whole rows); a unit copies its lines into a scratch buffer (rows x (re, im) x lanes,
    in cache) and runs all the Stockham radix-2 stages there, vectorised across the lanes: two
    passes over memory in all.

    CUDA (``cuda`` = 1): Stockham radix-2 over all lines, one sblock per stage (a thread per
    butterfly, the stage loop on the host: a launch per stage), ping-ponging between the result
    and the work buffer (the copy-in goes to the work buffer when l2 is odd, so that the last
    stage lands in the result). Paired stages have the pair index as a block axis too (sblock
    attr ``fft.stage`` = 1: its first loop is the serial stage loop)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    shape = list(src.shape[:-1])
    outer, length, inner = _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1:])
    n_total = _prod(shape)
    one, two = _i64(1), _i64(2)
    h = tirx.shift_right(l2 + one, one)             # log2 L2
    len2 = tirx.shift_left(one, h)
    len1 = tirx.shift_right(length, h)
    tw = _twiddles(length, len1, len2, sign, real, name)

    def gen(ins, outs):
        s_buf, tw_buf, d_buf, w_buf, lt_buf = ins[0], ins[1], outs[0], outs[1], outs[2]
        with IRBuilder() as ib, T.seq_scope():
            S = T.buffer_proxy(T.decl_buffer((n_total, 2), real, data=s_buf.data))      # flat views
            D = T.buffer_proxy(T.decl_buffer((n_total, 2), real, data=d_buf.data))
            Wk, TB = T.buffer_proxy(w_buf), T.buffer_proxy(tw_buf)
            _keep_live(T, s_buf, d_buf, w_buf, name)
            with T.If(cuda == one):
                with T.Then():
                    _stockham(T, S, D, Wk, TB, s_buf, tw_buf, d_buf, w_buf, outer, length, inner, n_total,
                              l2, h, len2, name, scale)
                with T.Else():
                    _four_step(T, S, D, Wk, TB, T.buffer_proxy(lt_buf), s_buf, tw_buf, lt_buf,
                               d_buf, w_buf, outer, length, inner, l2, h, len1, len2, sign, real,
                               name, scale)
        return ib.get()

    rows2 = tirx.min(len2, length)      # = L2, in a form whose bounds infer (a shift's do not)
    # the work buffer: the four-step's blocks of a unit's lines (_four_step), the last one
    # padded, which only L2 < lanes leaves short: by fewer than lanes lines of L1 <= L2 rows each
    lanes = lanes_of(real)
    work = n_total + outer * _i64((lanes - 1) ** 2)
    d, _, _ = te.extern([shape + [2], (work, 2), (rows2, 2, lanes)], [src, tw], gen, name=name,
                        dtype=[real, real, real])
    return d


def _scaled(v, scale):
    return v if scale is None else v * scale


def _keep_live(T, s_buf, d_buf, w_buf, name):
    """A unit that touches the source and the result directly (one element each, in their own
    shapes) before the transform: the body reaches them through flat views, which StorageRewrite
    and buffer compaction do not see; without this the work buffer could get the storage of the
    source (still being read) or the result that of a buffer still in use."""
    from ._extern import region
    zero = _i64(0)
    with units(f"{name}_live", [_i64(1)]):
        T.reads(region(s_buf))
        T.writes(region(w_buf), region(d_buf))
        first = (zero,) * len(s_buf.shape)
        w = T.buffer_proxy(w_buf)
        w[zero, zero] = T.buffer_proxy(s_buf)[first]
        T.buffer_proxy(d_buf)[(zero,) * len(d_buf.shape)] = tirx.const(0.0, d_buf.dtype)


def _stages(T, W, e, n, TB, off, sign, real):
    """The FFT of a unit's lines of n = 2**e points in scratch W (2, n, 2, lanes), in Stockham
    autosort stages: a radix-2 one when e is odd, then radix-4 ones. A stage of radix r with
    stride s (the product of the radices before it; m = n / (r·s)) maps the r inputs
    x_k = X[q + s·(p + k·m)] (p < m, q < s) to Y[q + s·(r·p + j)] = w_n^{p·s·j} Σ_k x_k w_r^{jk}.
    Stage i reads W[i mod 2] and writes W[1 - i mod 2]; the roots are TB[off + r] = w_n^r (r < n).
    -> the half of W that holds the result. Every butterfly is vectorised across the lanes (a
    radix-4 one ``_butterfly_lanes`` at a time); its inputs go through a register buffer (read
    from W once: LLVM cannot tell W's halves apart)."""
    one, two, zero = _i64(1), _i64(2), _i64(0)
    width = lanes_of(real)
    lanes = _i64(width)
    odd = tirx.bitwise_and(e, one)

    def root(r):
        return Complex(TB[off + r, 0], TB[off + r, 1])

    with T.If(odd == one):
        with T.Then():
            m = tirx.shift_right(n, one)
            with T.serial(zero, m) as p:
                w = root(p)
                R = T.buffer_proxy(scratch((4, width), real))
                with T.vectorized(zero, lanes) as b:
                    for k in range(2):
                        R[2 * k, b] = W[0, p + m * k, 0, b]
                        R[2 * k + 1, b] = W[0, p + m * k, 1, b]
                with T.vectorized(zero, lanes) as b:
                    u, v = Complex(R[0, b], R[1, b]), Complex(R[2, b], R[3, b])
                    dd = (u - v) * w
                    W[1, p * two, 0, b] = u.re + v.re
                    W[1, p * two, 1, b] = u.im + v.im
                    W[1, p * two + one, 0, b] = dd.re
                    W[1, p * two + one, 1, b] = dd.im
    si = _signed(sign, real)
    with T.serial(zero, tirx.shift_right(e, one)) as k:
        t = odd + k * two                       # log2 of the stride
        par = tirx.bitwise_and(odd + k, one)
        s = tirx.shift_left(one, t)
        m = tirx.shift_right(n, t + two)
        with T.serial(zero, tirx.shift_right(n, two)) as j:
            p = tirx.shift_right(j, t)
            q = tirx.bitwise_and(j, s - one)
            ps = p * s
            w1, w2, w3 = root(ps), root(ps * two), root(ps * _i64(3))
            step = _butterfly_lanes(real)
            with T.serial(zero, _i64(width // step)) as bo:
                R = T.buffer_proxy(scratch((8, step), real))
                with T.vectorized(zero, _i64(step)) as bi:
                    b = bo * _i64(step) + bi
                    for i in range(4):
                        R[2 * i, bi] = W[par, q + s * (p + m * i), 0, b]
                        R[2 * i + 1, bi] = W[par, q + s * (p + m * i), 1, b]
                with T.vectorized(zero, _i64(step)) as bi:
                    b = bo * _i64(step) + bi
                    a, bb, c, d = (Complex(R[2 * i, bi], R[2 * i + 1, bi]) for i in range(4))
                    apc, amc, bpd, bmd = a + c, a - c, bb + d, bb - d
                    jb = Complex(-bmd.im * si, bmd.re * si)          # sign·i·(b - d)
                    outs = (apc + bpd, (amc + jb) * w1, (apc - bpd) * w2, (amc - jb) * w3)
                    for i, y in enumerate(outs):
                        at = q + s * (p * _i64(4) + _i64(i))
                        W[one - par, at, 0, b] = y.re
                        W[one - par, at, 1, b] = y.im
    return tirx.bitwise_and(odd + tirx.shift_right(e, one), one)


def _gather(T, W, rows, lanes, at, read) -> None:
    """Copy ``rows`` points of ``lanes`` neighbouring lines into the scratch's first half:
    W[0, j, :, b] = read(at(j, b)) (a (re, im) pair). The tail unit's form (lanes clamped)."""
    with T.serial(_i64(0), rows) as j:
        with T.serial(_i64(0), lanes) as b:
            re, im = read(at(j, b))
            W[0, j, 0, b] = re
            W[0, j, 1, b] = im


def _rows_in(T, W, rows, F, start, stride, scale, real) -> None:
    """A full unit's copy-in: row j is the unit's points F[start + j·stride + b] (complex, F a flat
    float view), one contiguous load split into its re and im lanes (a shuffle, not a gather)."""
    zero, width = _i64(0), lanes_of(real)
    with T.serial(zero, rows) as j:
        R = T.buffer_proxy(scratch((2 * width,), real))
        at = (start + j * stride) * _i64(2)
        with T.vectorized(zero, _i64(2 * width)) as f:
            R[f] = _scaled(F[at + f], scale)
        with T.vectorized(zero, _i64(width)) as b:
            W[0, j, 0, b] = R[b * _i64(2)]
            W[0, j, 1, b] = R[b * _i64(2) + _i64(1)]


def _copy_in(T, W, rows, flat, pairs, first, count, point, stride, scale, real):
    """A unit's copy-in of the lines first .. first + lanes of ``count`` into the scratch's first
    half: ``_rows_in`` when they all exist (row j of line c at ``point(j, c)``, a row ``stride``
    points after the last), else ``_gather`` with the line clamped to the last one. -> the "all
    lines exist" condition (the copy-out's choice). ``flat``/``pairs``: the same buffer as flat
    floats and as (re, im) pairs."""
    lanes = _i64(lanes_of(real))
    full = first + lanes <= count
    with T.If(full):
        with T.Then():
            _rows_in(T, W, rows, flat, point(_i64(0), first), stride, scale, real)
        with T.Else():
            _gather(T, W, rows, lanes, lambda j, b: point(j, tirx.min(first + b, count - _i64(1))),
                    lambda at: (_scaled(pairs[at, 0], scale), _scaled(pairs[at, 1], scale)))
    return full


def _rows_out(T, W, res, rows, F, start, stride, real) -> None:
    """A full unit's copy-out: F[start + k·stride + b] = W[res, k, :, b], re and im lanes
    interleaved in registers, one contiguous store a row."""
    zero, width = _i64(0), lanes_of(real)
    with T.serial(zero, rows) as k:
        R = T.buffer_proxy(scratch((2 * width,), real))
        with T.vectorized(zero, _i64(width)) as b:
            R[b * _i64(2)] = W[res, k, 0, b]
            R[b * _i64(2) + _i64(1)] = W[res, k, 1, b]
        at = (start + k * stride) * _i64(2)
        with T.vectorized(zero, _i64(2 * width)) as f:
            F[at + f] = R[f]


def _line_twiddles(T, W, res, TB, LT, first, j0, inner, len1, h, len2, lanes):
    """The four-step's twiddles in the scratch: row k < L2 of lane b (line c = first + b, j1 = c
    // inner; j0 = first // inner) of W[res] times w^{j1·k}, into W[1 - res] (-> 1 - res).
    Vectorised across the lanes where their j1 are j0 + b (inner = 1: w^{j0·k} times row k of the
    lane table ``LT``, w^{b·k}) or all j0 (lanes divides inner: one root a row); lane by lane
    otherwise (j1 clamped: a tail unit's missing lines are never stored). Vectorised there, each
    root's index differs per lane: a gather on AVX-512, lane-by-lane inserts on AVX2 (~18 % of a
    2^20-point transform's samples there, when every unit took this form)."""
    zero, one = _i64(0), _i64(1)

    def scale(k, b, w):
        v = Complex(W[res, k, 0, b], W[res, k, 1, b]) * w
        W[one - res, k, 0, b] = v.re
        W[one - res, k, 1, b] = v.im

    def by_rows(lane_table):
        with T.serial(zero, len2) as k:
            w = _root(TB, j0 * k, h, len2)
            with T.vectorized(zero, lanes) as b:
                scale(k, b, w * Complex(LT[k, 0, b], LT[k, 1, b]) if lane_table else w)

    with T.If(inner == one):
        with T.Then():
            by_rows(True)
        with T.Else():
            with T.If(tirx.floormod(inner, lanes) == zero):
                with T.Then():
                    by_rows(False)
                with T.Else():
                    with T.serial(zero, lanes) as b:
                        j1 = tirx.min(tirx.floordiv(first + b, inner), len1 - one)
                        with T.serial(zero, len2) as k:
                            scale(k, b, _root(TB, j1 * k, h, len2))
    return one - res


def _shuffle(a, b, picks):
    """The lanes ``picks`` of the concatenation of vectors a and b (LLVM: shufflevector)."""
    return tirx.Shuffle([a, b], [tirx.const(i, "int32") for i in picks])


def _transposed(rows: list) -> list:
    """The transpose of a square block of vectors (rows[i] lane k = element (i, k)): log2(n)
    stages of two-vector shuffles, each exchanging the off-diagonal halves of 2h x 2h tiles
    (h = n/2 .. 1): what x86 does with unpack, shuffle and 128-bit permute instructions."""
    n = len(rows)
    rows = list(rows)
    h = n // 2
    while h:
        for i in range(n):
            if i & h:
                continue
            a, b = rows[i], rows[i + h]
            rows[i] = _shuffle(a, b, [k if not k & h else n + k - h for k in range(n)])
            rows[i + h] = _shuffle(a, b, [k + h if not k & h else n + k for k in range(n)])
        h //= 2
    return rows


def _block_out(W, res, row, F, at, width) -> None:
    """A full unit's block of ``width`` rows (from ``row``) x its ``width`` lines out of the
    scratch, transposed in registers: F[at + (b·width + kk)·2 + (0, 1)] = W[res, row + kk, :, b]
    (F a flat float view), each line's run of points one contiguous store."""
    span = tirx.Ramp(_i64(0), _i64(1), width)
    re = _transposed([W[res, row + _i64(kk), 0, span] for kk in range(width)])
    im = _transposed([W[res, row + _i64(kk), 1, span] for kk in range(width)])
    pairs = [k // 2 + (width if k % 2 else 0) for k in range(2 * width)]
    for b in range(width):
        F[tirx.Ramp(at + _i64(2 * width * b), _i64(1), 2 * width)] = _shuffle(re[b], im[b], pairs)


def _lines_out(T, W, res, Wk, first, count, inner, rows, at, lanes) -> None:
    """The unit's lines (first + b < count: line j1 = c // inner, its point i = c mod inner) out
    lane by lane, row k of each at ``at(j1, k·inner + i)``."""
    with T.serial(_i64(0), lanes) as b:
        c = first + b
        with T.If(c < count):
            with T.Then():
                j1 = tirx.floordiv(c, inner)
                i = c - j1 * inner
                with T.serial(_i64(0), rows) as k:
                    Wk[at(j1, k * inner + i), 0] = W[res, k, 0, b]
                    Wk[at(j1, k * inner + i), 1] = W[res, k, 1, b]


def _four_step(T, S, D, Wk, TB, LT, s_buf, tw_buf, lt_buf, d_buf, w_buf, outer, length, inner,
               l2, h, len1, len2, sign, real, name, scale):
    """The CPU form (``_fft_pow2``). A unit of whole lines (``lanes_of``) copies in and out
    through contiguous vector loads and stores (``_rows_in``, ``_rows_out``); the tail unit (fewer
    lines) through the clamped scalar copy. ``LT`` (L2, 2, lanes), filled first: w^{b·k}, the
    lanes' part of the twiddles (``_line_twiddles``).

    The work buffer holds the second step's lines (k2·inner + i) in blocks of a unit's lines,
    each block row by row (outer, line // lanes, j1, line % lanes): a unit of the second step
    reads its rows as one contiguous run (a row a line's stride apart, 64 bytes from every 8 KiB
    of a 2^20-point transform, was ~15 % of its samples on AVX2)."""
    from ._extern import ceildiv, region
    width = lanes_of(real)
    lanes = _i64(width)
    h1 = l2 - h
    c1, c2, li = len1 * inner, len2 * inner, length * inner
    per_outer = len1 * ceildiv(c2, lanes) * lanes
    SF, DF = (T.buffer_proxy(T.decl_buffer((outer * li * _i64(2),), real, data=b.data))
              for b in (s_buf, d_buf))
    WF = T.buffer_proxy(T.decl_buffer((outer * per_outer * _i64(2),), real, data=w_buf.data))

    def work_at(o, j1, c):                             # row j1 of the second step's line c
        return (o * per_outer + tirx.floordiv(c, lanes) * (len1 * lanes) + j1 * lanes
                + tirx.floormod(c, lanes))

    with units(f"{name}_lanes", [len2]) as (k,):       # LT[k, :, b] = w^{b·k}: _line_twiddles
        T.reads(region(tw_buf))
        T.writes(region(lt_buf))
        with T.serial(_i64(0), lanes) as b:
            w = _root(TB, tirx.bitwise_and(b * k, length - _i64(1)), h, len2)
            LT[k, 0, b] = w.re
            LT[k, 1, b] = w.im
    with units(f"{name}_rows", [outer, ceildiv(c1, lanes)]) as (o, cb):
        T.reads(region(s_buf), region(tw_buf), region(lt_buf))
        T.writes(region(w_buf))
        W = T.buffer_proxy(T.alloc_buffer((2, len2, 2, width), real))
        base, first = o * li, cb * lanes
        j0 = tirx.floordiv(first, inner)
        _copy_in(T, W, len2, SF, S, first, c1, lambda j, c: base + c + j * c1, c1, scale, real)
        res = _stages(T, W, h, len2, TB, len2 + len1, sign, real)
        res = _line_twiddles(T, W, res, TB, LT, first, j0, inner, len1, h, len2, lanes)
        # the lanes' lines out, in the forms of _line_twiddles: lines j0 + b (inner 1),
        # transposed in registers a block of lanes x lanes points at a time; points i_0 + b of
        # one line (lanes divide inner), each row one contiguous run; else lane by lane
        with T.If(tirx.all(inner == _i64(1), len2 >= lanes, first + lanes <= c1)):
            with T.Then():
                with T.serial(_i64(0), tirx.floordiv(len2, lanes)) as kb:
                    _block_out(W, res, kb * lanes, WF, work_at(o, first, kb * lanes) * _i64(2),
                               width)
            with T.Else():
                with T.If(tirx.floormod(inner, lanes) == _i64(0)):
                    with T.Then():
                        _rows_out(T, W, res, len2, WF, work_at(o, j0, first - j0 * inner),
                                  tirx.floordiv(inner, lanes) * len1 * lanes, real)
                    with T.Else():
                        _lines_out(T, W, res, Wk, first, c1, inner, len2,
                                   lambda j1, c: work_at(o, j1, c), lanes)
    with units(f"{name}_cols", [outer, ceildiv(c2, lanes)]) as (o, cb):
        T.reads(region(w_buf), region(tw_buf))
        T.writes(region(d_buf))
        W = T.buffer_proxy(T.alloc_buffer((2, len1, 2, width), real))
        base, first = o * li, cb * lanes
        full = _copy_in(T, W, len1, WF, Wk, first, c2, lambda j, c: work_at(o, j, c), lanes,
                        None, real)
        res = _stages(T, W, h1, len1, TB, len2, sign, real)
        with T.If(full):
            with T.Then():
                _rows_out(T, W, res, len1, DF, base + first, c2, real)
            with T.Else():                             # the tail unit, lane by lane
                _lines_out(T, W, res, D, first, c2, _i64(1), len1,
                           lambda c, k: base + c + k * c2, lanes)


def _stockham(T, S, A, Bw, TB, s_buf, tw_buf, d_buf, w_buf, outer, length, inner, n_total, l2, h, len2,
              name, scale):
    """The CUDA form (``_fft_pow2``): A is the result, Bw the work buffer."""
    from ._extern import region
    one, two, zero = _i64(1), _i64(2), _i64(0)
    half = tirx.shift_right(length, one)
    odd = tirx.bitwise_and(l2, one)

    def butterfly(t, o, i, j, R, Wr):
        s = tirx.shift_left(one, t)
        m = tirx.shift_right(length, t + one)
        p = tirx.shift_right(j, t)
        q = tirx.bitwise_and(j, s - one)
        base = o * length * inner + i
        ia = base + (q + s * p) * inner
        ib_ = base + (q + s * (p + m)) * inner
        oa = base + (q + s * (p * two)) * inner
        ob = base + (q + s * (p * two + one)) * inner
        u = Complex(R[ia, 0], R[ia, 1])
        v = Complex(R[ib_, 0], R[ib_, 1])
        d = (u - v) * _root(TB, p * s, h, len2)        # e^{sign·iπ p/m} = w^{p·s}
        Wr[oa, 0] = u.re + v.re
        Wr[oa, 1] = u.im + v.im
        Wr[ob, 0] = d.re
        Wr[ob, 1] = d.im

    every = [region(d_buf), region(w_buf)]
    with units(f"{name}_in", [n_total]) as (f,):
        T.reads(region(s_buf))
        T.writes(*every)
        with T.If(odd == one):
            with T.Then():
                Bw[f, 0] = _scaled(S[f, 0], scale)
                Bw[f, 1] = _scaled(S[f, 1], scale)
            with T.Else():
                A[f, 0] = _scaled(S[f, 0], scale)
                A[f, 1] = _scaled(S[f, 1], scale)
    with T.If(odd == one):
        with T.Then():
            with units(f"{name}_first", [outer, inner, half]) as (o, i, j):
                T.reads(region(w_buf), region(tw_buf))
                T.writes(region(d_buf))
                T.sblock_attr({"fft.stage": 0})
                butterfly(zero, o, i, j, Bw, A)
    pairs = tirx.shift_right(l2, one)
    with T.serial(zero, pairs) as tp:
        for step, (R, Wr, rb, wb) in enumerate(((A, Bw, d_buf, w_buf), (Bw, A, w_buf, d_buf))):
            with T.grid(outer, inner, half) as (lo, li, lj):
                with T.sblock(f"{name}_pair{step}"):
                    t2 = T.axis.spatial(pairs, tp, dtype="int64")
                    o = T.axis.spatial(outer, lo, dtype="int64")
                    i = T.axis.spatial(inner, li, dtype="int64")
                    j = T.axis.spatial(half, lj, dtype="int64")
                    T.reads(region(rb), region(tw_buf))
                    T.writes(region(wb))
                    T.sblock_attr({"fft.stage": 1})
                    butterfly(odd + t2 * two + _i64(step), o, i, j, R, Wr)


def _signed(sign, real):
    """The direction sign (a runtime var, or ±1) as a real scalar."""
    return tirx.const(float(sign), real) if isinstance(sign, (int, float)) else sign


def _chirp(j, length, sign, real):
    """e^{sign·iπ j²/L} with j² reduced mod 2L (exact angles)."""
    jj = tirx.floormod(j * j, length * 2)
    ang = tirx.const(math.pi, real) * jj.astype(real) / length.astype(real)
    return Complex(tirx.cos(ang), _signed(sign, real) * tirx.sin(ang))


def _bluestein(src, axis: int, m, l2m, sign, real: str, name: str, cuda, scale=None):
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
        if scale is not None:
            x = x * scale
        return tirx.Select(j < length, tirx.Select(c == 0, x.re, x.im), zero)

    a = te.compute(pshape + [2], a0, name=f"{name}_a")

    def b0(f, c):
        j = tirx.Select(f < length, f, m - f)
        inside = tirx.any(f < length, f > m - length)
        jc = tirx.max(tirx.min(j, length - 1), tirx.const(0, "int64"))
        w = _chirp(jc, length, sign, real).conj()
        return tirx.Select(inside, tirx.Select(c == 0, w.re, w.im), zero)

    b = te.compute((m, 2), b0, name=f"{name}_b")
    fa = _fft_pow2(a, axis, l2m, -1, real, f"{name}_fa", cuda)
    fb = _fft_pow2(b, 0, l2m, -1, real, f"{name}_fb", cuda)

    def prod(*idx):
        *idx, c = idx
        v = Complex(fa(*idx, 0), fa(*idx, 1)) * Complex(fb[idx[axis], 0], fb[idx[axis], 1])
        return tirx.Select(c == 0, v.re, v.im)

    cc = te.compute(pshape + [2], prod, name=f"{name}_c")
    conv = _fft_pow2(cc, axis, l2m, 1, real, f"{name}_conv", cuda)

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
    scale = ctx.scalars["fft_scale"]
    if ctx.dtype.storage == ctx.info.real:          # the transforms read out_grad and write x_grad
        return _transform(ctx, out_grad, scale)[0]
    z, dims = _transform(ctx, lambda *idx: out_grad(*idx))
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
