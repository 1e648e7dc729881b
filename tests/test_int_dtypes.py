"""Integer and bool kernels of pointwise, scan and sort/select grads, checked exactly against Paddle
3.3.1's CPU kernels.

Paddle registers these grads for int32/int64 (copysign_grad, scale and the rounding grads also for
int8/uint8/int16 and bool); its kernels compute in the integer type with C++'s wrapping arithmetic
and truncate float attributes toward 0. Each case runs Paddle's kernel (``paddle._C_ops`` or its
autograd) on the same arrays, extremes included, and demands identical values and dtype. The
sin/cos double and triple grads have no Paddle entry point for integers (sin_grad/cos_grad are
float-only, so autograd never reaches them): their oracle is the functor's C++ in numpy. The scan
grads (cumsum int8..int64, cumprod and cummax/cummin int32/int64) sum and multiply wrapping; the
sort/select grads (argsort also uint8/int16) move out_grad to the forward's indices, nanmedian's
shares truncated. reduce_as (bool too), segment_pool, cross/dot/kron/trace, unpool3d (int64),
roi_align/roi_pool (int32) and overlap_add gather, broadcast and contract in the integer type; MEAN
pooling and roi_align divide truncating. The pow grads raise x to T(y) - 1 (pow_grad, against
Paddle) and to T(y - k) (the double and triple grads, against their kernel's statements in Python
integers) by square and multiply, wrapping; exponents below 0, where Paddle never returns, are
refused.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import tvmgrad

from harness import autograd_oracle

paddle = pytest.importorskip("paddle")
paddle.set_device("cpu")
warnings.filterwarnings("ignore")

C = paddle._C_ops


def _ints(dtype, shape=(3, 5), seed=0, small=False):
    """Random values of ``dtype`` with its extremes and 0 among them (``small``: |v| <= 9)."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    lo, hi = (max(info.min, -9), 9) if small else (info.min, info.max)
    a = rng.integers(lo, hi, shape, dtype=dtype, endpoint=True)
    flat = a.reshape(-1)
    flat[:3] = (0, lo, hi)
    return a


def _t(a):
    return paddle.to_tensor(a)


def _same(got: dict, want: dict):
    for name, w in want.items():
        w = np.asarray(w.numpy() if hasattr(w, "numpy") else w)
        g = np.asarray(got[name])
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w, err_msg=name)


ALL = ("bool", "int8", "uint8", "int16", "int32", "int64")
NARROW = ("int8", "uint8", "int16", "int32", "int64")
WIDE = ("int32", "int64")


@pytest.mark.parametrize("dtype", ALL)
def test_copysign_grad(dtype):
    x, y, g = _ints(dtype, seed=1), _ints(dtype, seed=2), _ints(dtype, seed=3)
    want = C.copysign_grad(_t(x), _t(y), _t(g))
    _same(tvmgrad.run("copysign_grad", {"x": x, "y": y, "out_grad": g}),
          {"x_grad": want[0], "y_grad": want[1]})
    # broadcast y: the x grad is per element, y's sums to zeros
    yb = y[0]
    want = C.copysign_grad(_t(x), _t(yb), _t(g))
    _same(tvmgrad.run("copysign_grad", {"x": x, "y": yb, "out_grad": g}),
          {"x_grad": want[0], "y_grad": want[1]})


@pytest.mark.parametrize("op", ["fmax_grad", "fmin_grad", "heaviside_grad"])
@pytest.mark.parametrize("dtype", WIDE)
def test_binary_masks(op, dtype):
    x, g = _ints(dtype, seed=1, small=True), _ints(dtype, seed=3)
    y = _ints(dtype, (5,), seed=2, small=True)                  # broadcast: y's grad is summed
    want = getattr(C, op)(_t(x), _t(y), _t(g))
    _same(tvmgrad.run(op, {"x": x, "y": y, "out_grad": g}), {"x_grad": want[0], "y_grad": want[1]})


@pytest.mark.parametrize("dtype", WIDE)
def test_unary_grads(dtype):
    x, g = _ints(dtype, seed=1), _ints(dtype, seed=3)
    _same(tvmgrad.run("abs_grad", {"x": x, "out_grad": g}), {"x_grad": C.abs_grad(_t(x), _t(g))})
    _same(tvmgrad.run("exp_grad", {"out": x, "out_grad": g}), {"x_grad": C.exp_grad(_t(x), _t(g))})
    _same(tvmgrad.run("square_grad", {"x": x, "out_grad": g}), {"x_grad": C.square_grad(_t(x), _t(g))})
    _same(tvmgrad.run("conj_grad", {"out_grad": g}), {"x_grad": C.conj(_t(g))})
    for op in ("round_grad", "trunc_grad"):
        _same(tvmgrad.run(op, {"out_grad": g}), {next(iter(tvmgrad.run(op, {"out_grad": g}))): getattr(C, op)(_t(g))})
    for lo, hi in ((-1.5, 1.7), (0.5, 1.7), (-1.7, -0.5), (-3.0, 4.0)):
        xs = _ints(dtype, seed=1, small=True)
        want = C.clip_grad(_t(xs), _t(g), lo, hi)              # truncated bounds: min 0 for 0.5
        _same(tvmgrad.run("clip_grad", {"x": xs, "out_grad": g}, {"min": lo, "max": hi}), {"x_grad": want})
        _same(tvmgrad.run("clip_double_grad", {"x": xs, "grad_x_grad": g}, {"min": lo, "max": hi}),
              {"grad_out_grad": want})                          # Paddle runs clip_grad's kernel


@pytest.mark.parametrize("dtype", NARROW)
def test_floor_ceil_grads(dtype):
    g = _ints(dtype, seed=3)
    for op in ("floor_grad", "ceil_grad"):
        _same(tvmgrad.run(op, {"out_grad": g}), {"x_grad": getattr(C, op)(_t(g))})


@pytest.mark.parametrize("dtype", ALL)
def test_scale_and_sign_grads(dtype):
    g = _ints(dtype, seed=3)
    for scale in (2.5, -2.5, 0.7, 3.0):
        want = C.scale(_t(g), scale, 0.0, True)                 # scale truncated toward 0
        _same(tvmgrad.run("scale_grad", {"out_grad": g}, {"scale": scale}), {"x_grad": want})
    _same(tvmgrad.run("sign_grad", {"out_grad": g}), {"x_grad": C.scale(_t(g), 0.0, 0.0, True)})


@pytest.mark.parametrize("dtype", WIDE)
def test_double_grads_by_autograd(dtype):
    x, g, dd = _ints(dtype, seed=1), _ints(dtype, seed=3), _ints(dtype, seed=4)
    # abs_double_grad does not read grad_out; Paddle's autograd needs one
    for op, inputs, extra in (("abs_double_grad", {"x": x, "grad_x_grad": dd}, lambda i, a: {"grad_out": g}),
                              ("square_double_grad", {"x": x, "grad_out": g, "grad_x_grad": dd}, None)):
        want = autograd_oracle(op, extra)(inputs, {})
        _same(tvmgrad.run(op, inputs), {k: v for k, v in want.items() if v is not None})


def _trig(fn, x):
    """Paddle's Sine<T>/Cosine<T> for an integer T: the double result converted back (truncated)."""
    return fn(x.astype(np.float64)).astype(x.dtype)


@pytest.mark.parametrize("dtype", WIDE)
def test_sin_cos_higher_grads(dtype):
    x = _ints(dtype, seed=1, small=True)
    d1y, d2d1x, d3d2x, d3d2d1y = (_ints(dtype, seed=s) for s in (3, 4, 5, 6))
    s, c = _trig(np.sin, x), _trig(np.cos, x)
    with np.errstate(over="ignore"):
        _same(tvmgrad.run("sin_double_grad", {"x": x, "grad_out": d1y, "grad_x_grad": d2d1x}),
              {"x_grad": -d2d1x * s * d1y, "grad_out_grad": d2d1x * c})
        _same(tvmgrad.run("cos_double_grad", {"x": x, "grad_out": d1y, "grad_x_grad": d2d1x}),
              {"x_grad": -d2d1x * c * d1y, "grad_out_grad": -d2d1x * s})
        ins = {"x": x, "grad_out_forward": d1y, "grad_x_grad_forward": d2d1x, "grad_x_grad": d3d2x,
               "grad_out_grad_grad": d3d2d1y}
        _same(tvmgrad.run("sin_triple_grad", ins),
              {"x_grad": -c * d1y * d2d1x * d3d2x - s * d2d1x * d3d2d1y,
               "grad_out_forward_grad": -s * d2d1x * d3d2x,
               "grad_x_grad_forward_grad": -s * d1y * d3d2x + c * d3d2d1y})
        _same(tvmgrad.run("cos_triple_grad", ins),
              {"x_grad": s * d1y * d2d1x * d3d2x - c * d2d1x * d3d2d1y,
               "grad_out_forward_grad": -c * d2d1x * d3d2x,
               "grad_x_grad_forward_grad": -c * d1y * d3d2x - s * d3d2d1y})


# ------------------------------------------------------------------------------------------
# scan and sort/select grads: integer sums and products wrap; the rest is data movement

def _run(op, inputs, attrs, **options):
    return tvmgrad.run(op, inputs, attrs, **options)


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, False), (False, True)])
@pytest.mark.sweep
def test_cumsum_grad(dtype, exclusive, reverse):
    g = _ints(dtype, (3, 70), seed=3)                          # several scan chunks, wrapping sums
    x = np.zeros_like(g)
    for axis, flatten in ((1, False), (0, False), (0, True)):
        gv = g.reshape(-1) if flatten else g                   # flatten: out is 1-D
        want = C.cumsum_grad(_t(x), _t(gv), axis, flatten, exclusive, reverse)
        attrs = {"axis": axis, "flatten": flatten, "exclusive": exclusive, "reverse": reverse}
        _same(_run("cumsum_grad", {"x": x, "out_grad": gv}, attrs), {"x_grad": want})


@pytest.mark.parametrize("dtype", WIDE)
def test_cumprod_grad(dtype):
    x = _ints(dtype, (3, 40), seed=1, small=True)              # zeros and wrapping products
    x[1, 7] = 0
    g = _ints(dtype, (3, 40), seed=3)
    for dim in (1, 0):
        out = C.cumprod(_t(x), dim, False, False)
        want = C.cumprod_grad(_t(x), out, _t(g), dim, False, False)
        _same(_run("cumprod_grad", {"x": x, "out": out.numpy(), "out_grad": g}, {"dim": dim}),
              {"x_grad": want})


@pytest.mark.parametrize("op", ["cummax_grad", "cummin_grad"])
@pytest.mark.parametrize("dtype", WIDE)
def test_cummax_cummin_grad(op, dtype):
    x, g = _ints(dtype, (4, 9), seed=1, small=True), _ints(dtype, (4, 9), seed=3)
    for axis in (1, 0):
        _, idx = getattr(C, op[:-5])(_t(x), axis, "int64")
        want = getattr(C, op)(_t(x), idx, _t(g), axis, "int64")
        for det in (True, False):
            _same(_run(op, {"x": x, "indices": idx.numpy(), "out_grad": g},
                       {"axis": axis, "dtype": "int64"}, deterministic=det), {"x_grad": want})


@pytest.mark.parametrize("dtype", ("uint8", "int16") + WIDE)
def test_argsort_grad(dtype):
    x, g = _ints(dtype, (4, 9), seed=1, small=True), _ints(dtype, (4, 9), seed=3)
    for axis, descending in ((1, False), (0, True)):
        # Paddle's argsort has no uint8/int16 kernel: numpy's stable sort gives the indices
        idx = np.argsort(-x if descending else x, axis=axis, kind="stable")
        attrs = {"axis": axis, "descending": descending, "stable": True}
        want = C.argsort_grad(_t(idx), _t(x), _t(g), axis, descending, True)
        _same(_run("argsort_grad", {"indices": idx, "x": x, "out_grad": g}, attrs),
              {"x_grad": want})
    idx = np.array([[1, 1, 0, 2] + [3] * 5] * 4)               # repeated: the last one wins
    want = C.argsort_grad(_t(idx), _t(x), _t(g), 1, False, False)
    _same(_run("argsort_grad", {"indices": idx, "x": x, "out_grad": g},
               {"axis": 1, "descending": False, "stable": False}), {"x_grad": want})


@pytest.mark.parametrize("dtype", WIDE)
def test_topk_kthvalue_mode_grads(dtype):
    x = _ints(dtype, (4, 9), seed=1, small=True)
    for axis in (1, 0):
        out, idx = C.topk(_t(x), 3, axis, True, True)
        g = _ints(dtype, out.shape, seed=3)
        want = C.topk_grad(_t(x), idx, _t(g), 3, axis, True, True)
        _same(_run("topk_grad", {"x": x, "indices": idx.numpy(), "out_grad": g},
                   {"k": 3, "axis": axis, "largest": True, "sorted": True}), {"x_grad": want})
        for keepdim in (False, True):
            out, idx = C.kthvalue(_t(x), 2, axis, keepdim)
            g = _ints(dtype, out.shape, seed=4)
            want = C.kthvalue_grad(_t(x), idx, _t(g), 2, axis, keepdim)
            _same(_run("kthvalue_grad", {"x": x, "indices": idx.numpy(), "out_grad": g},
                       {"k": 2, "axis": axis, "keepdim": keepdim}), {"x_grad": want})
            out, idx = C.mode(_t(x), axis, keepdim)
            want = C.mode_grad(_t(x), idx, _t(g), axis, keepdim)
            _same(_run("mode_grad", {"x": x, "indices": idx.numpy(), "out_grad": g},
                       {"axis": axis, "keepdim": keepdim}), {"x_grad": want})


@pytest.mark.parametrize("mode", ["avg", "min"])
@pytest.mark.parametrize("dtype", WIDE)
def test_nanmedian_grad(dtype, mode):
    """The integer median is (a + b) / 2 in the type (wrapping, truncated: it may equal neither
    middle, or other elements); the shares divide truncating."""
    info = np.iinfo(dtype)
    x = _ints(dtype, (6, 6), seed=1, small=True)
    x[0] = (-3, -4, 10, -10, -20, 20)                          # -3.5 truncates to -3: x[0, 0]
    x[1] = (info.max, info.max - 1, info.max - 2, info.max, info.max, info.max - 1)
    x[2] = (info.min, info.min + 1, info.min + 2, info.min, info.min + 2, info.min + 1)
    x[3] = (1, 1, 2, 2, 5, -5)                                 # 1.5 -> 1: shared by two elements
    x[4] = (3, 5, 1, 9, 0, 8)                                  # 4 is no element: halved
    for axis, keepdim in (([1], False), ([0], True), ([], False), ([0, 1], False), ([-1, 0], True)):
        out, med = C.nanmedian(_t(x), axis, keepdim, mode)
        g = np.random.default_rng(3).integers(-9, 9, out.shape, dtype=dtype, endpoint=True)
        want = C.nanmedian_grad(_t(x), out, med, _t(g), axis, keepdim, mode)
        _same(_run("nanmedian_grad", {"x": x, "medians": med.numpy(), "out_grad": g},
                   {"axis": axis, "keepdim": keepdim, "mode": mode}), {"x_grad": want})


# ------------------------------------------------------------------------------------------
# gathers, broadcasts and small contractions: integer sums wrap, MEAN and roi_align divide
# truncating

@pytest.mark.parametrize("dtype", ALL)
def test_reduce_as_grad(dtype):
    x, g = _ints(dtype, (3, 4, 5), seed=1), _ints(dtype, (4, 1), seed=3)
    want = C.reduce_as_grad(_t(x), _t(g), _t(g))
    _same(tvmgrad.run("reduce_as_grad", {"x": x, "target": g, "out_grad": g}), {"x_grad": want})


@pytest.mark.parametrize("dtype", WIDE)
def test_segment_pool_grad(dtype):
    x = _ints(dtype, (6, 3), seed=1, small=True)
    x[1] = x[0]                                                # a tie in segment 0
    ids = np.array([0, 0, 0, 2, 2, 3], "int32")                # segment 1 is empty
    g = _ints(dtype, (4, 3), seed=3)
    counts = np.array([3, 0, 2, 1], dtype)
    for pool in ("SUM", "MEAN", "MAX", "MIN"):
        out = C.segment_pool(_t(x), _t(ids), pool)
        for summed in ((None, counts) if pool == "MEAN" else (None,)):
            want = C.segment_pool_grad(_t(x), _t(ids), out, None if summed is None else _t(summed),
                                       _t(g), pool)
            _same(tvmgrad.run("segment_pool_grad", {"x": x, "segment_ids": ids, "out": out.numpy(),
                                                    "summed_ids": summed, "out_grad": g},
                              {"pooltype": pool}), {"x_grad": want})


@pytest.mark.parametrize("dtype", WIDE)
def test_dot_cross_trace_kron_grads(dtype):
    x, y, g = _ints(dtype, (4, 5), seed=1), _ints(dtype, (4, 5), seed=2), _ints(dtype, (4,), seed=3)
    want = C.dot_grad(_t(x), _t(y), _t(g))
    _same(tvmgrad.run("dot_grad", {"x": x, "y": y, "out_grad": g}),
          {"x_grad": want[0], "y_grad": want[1]})
    x, y, g = (_ints(dtype, (2, 3, 4), seed=s) for s in (1, 2, 3))
    want = C.cross_grad(_t(x), _t(y), _t(g), 1)
    _same(tvmgrad.run("cross_grad", {"x": x, "y": y, "out_grad": g}, {"axis": 1}),
          {"x_grad": want[0], "y_grad": want[1]})
    x, g = _ints(dtype, (3, 4, 5), seed=1), _ints(dtype, (5,), seed=3)
    want = C.trace_grad(_t(x), _t(g), 1, 0, 1)
    _same(tvmgrad.run("trace_grad", {"x": x, "out_grad": g}, {"offset": 1, "axis1": 0, "axis2": 1}),
          {"x_grad": want})
    x, y = _ints(dtype, (2, 3), seed=1), _ints(dtype, (3, 2, 2), seed=2)
    g = _ints(dtype, (3, 4, 6), seed=3)
    want = C.kron_grad(_t(x), _t(y), _t(g))
    _same(tvmgrad.run("kron_grad", {"x": x, "y": y, "out_grad": g}),
          {"x_grad": want[0], "y_grad": want[1]})


def test_unpool3d_grad_int64():
    pooled, idx = C.max_pool3d_with_index(_t(np.random.default_rng(0).standard_normal(
        (2, 3, 4, 4, 4)).astype("float32")), [2, 2, 2], [2, 2, 2], [0, 0, 0], False, False, False)
    x, g = _ints("int64", (2, 3, 2, 2, 2), seed=1), _ints("int64", (2, 3, 4, 4, 4), seed=3)
    geometry = ([2, 2, 2], [2, 2, 2], [0, 0, 0], [4, 4, 4], "NCDHW")
    out = C.unpool3d(_t(x), idx, *geometry)
    want = C.unpool3d_grad(_t(x), idx, out, _t(g), *geometry)
    attrs = dict(zip(("ksize", "strides", "paddings", "output_size", "data_format"), geometry))
    _same(tvmgrad.run("unpool3d_grad", {"x": x, "indices": idx.numpy(), "out": out.numpy(),
                                        "out_grad": g}, attrs), {"x_grad": want})


def test_roi_align_and_roi_pool_grads_int32():
    """int32 feature maps and boxes (Paddle's CPU kernels with T = int): truncated box corners,
    bins and sample offsets; each sample adds out_grad / samples to its low corner."""
    x = np.zeros((2, 3, 9, 11), "int32")
    boxes = np.array([[0, 0, 8, 8], [1, 2, 10, 7], [3, 1, 4, 9], [2, 2, 3, 3], [0, 0, 11, 9]],
                     "int32")
    num = np.array([2, 3], "int32")
    g = np.random.default_rng(3).integers(-1000, 1000, (5, 3, 2, 3)).astype("int32")
    ins = {"x": x, "boxes": boxes, "boxes_num": num, "out_grad": g}
    for scale, ratio, aligned in ((1.0, -1, False), (0.5, 2, False), (0.7, -1, True),
                                  (1.3, 1, False), (2.0, -1, False)):
        want = C.roi_align_grad(_t(x), _t(boxes), _t(num), _t(g), 2, 3, scale, ratio, aligned)
        _same(tvmgrad.run("roi_align_grad", ins, {"pooled_height": 2, "pooled_width": 3,
                                                  "spatial_scale": scale, "sampling_ratio": ratio,
                                                  "aligned": aligned}), {"x_grad": want})
    arg_max = np.random.default_rng(4).integers(-1, 99, (5, 3, 2, 3))
    want = C.roi_pool_grad(_t(x), _t(boxes), _t(num), _t(arg_max), _t(g), 2, 3, 1.0)
    _same(tvmgrad.run("roi_pool_grad", {**ins, "arg_max": arg_max},
                      {"pooled_height": 2, "pooled_width": 3, "spatial_scale": 1.0}),
          {"x_grad": want})


@pytest.mark.parametrize("dtype", WIDE)
def test_overlap_add_grad(dtype):
    for axis, xshape, gshape in ((-1, (2, 4, 3), (2, 10)), (0, (3, 4, 2), (10, 2))):
        x, g = np.zeros(xshape, dtype), _ints(dtype, gshape, seed=3)
        want = C.overlap_add_grad(_t(x), _t(g), 3, axis)
        _same(tvmgrad.run("overlap_add_grad", {"x": x, "out_grad": g},
                          {"hop_length": 3, "axis": axis}), {"x_grad": want})


# ------------------------------------------------------------------------------------------
# integer powers by a runtime exponent: square and multiply in a loop per element, wrapping

def _wrapped(values, dtype):
    """Python ints reduced to ``dtype``'s two's-complement range."""
    bits = np.iinfo(dtype).bits
    return np.array([(int(v) + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
                     for v in np.ravel(values)], dtype).reshape(np.shape(values))


def _pow_kernel_oracle(op, x, dtype, ins, y):
    """Paddle's PowDoubleGradKernel/PowTripleGradKernel for an integer T (impl/
    activation_grad_impl.h), statement by statement in Python integers: ``Pow(x, e)`` is
    x^T(e) (e formed in float32, truncated), ``Scale(v, c)`` is v·T(c) (c a float32 product)."""
    f = np.float32(y)
    T = lambda v: int(np.trunc(np.float64(v)))                          # noqa: E731
    xs = [int(v) for v in np.ravel(x)]
    P = lambda k: np.array([pow(v, T(np.float32(f - np.float32(k))), 1 << 64) for v in xs],  # noqa: E731
                           object).reshape(x.shape)
    c1, c2 = T(f), T(np.float32(f * np.float32(f - 1)))
    c3 = T(np.float32(np.float32(f * np.float32(f - 1)) * np.float32(f - 2)))
    I = {k: np.asarray(v).astype(object) for k, v in ins.items() if v is not None}  # noqa: E741
    if op == "pow_double_grad":
        dout, ddx = I["grad_out"], I["grad_x_grad"]
        dx = 0 * dout if f == 1 else dout * ddx * P(2) * c2
        return {"x_grad": _wrapped(dx, dtype), "grad_out_grad": _wrapped(ddx * P(1) * c1, dtype)}
    dout, ddx, d_dx, d_ddout = (I.get(k) for k in ("grad_out", "grad_grad_x", "grad_x_grad",
                                                   "grad_grad_out_grad"))
    assert f != 1                                   # Paddle raises x to y - 3 < 0: never returns
    part2 = 0 * dout if d_ddout is None else d_ddout * ddx * (P(2) * c2)
    dx = part2 if f == 2 else d_dx * ddx * dout * (P(3) * c3) + part2
    d_dout = d_dx * ddx * (P(2) * c2)
    d_ddx = d_dx * dout * (P(2) * c2) + (0 if d_ddout is None else d_ddout * (P(1) * c1))
    return {"x_grad": _wrapped(dx, dtype), "grad_out_grad": _wrapped(d_dout, dtype),
            "grad_grad_x_grad": _wrapped(d_ddx, dtype)}


# y = 0 (Paddle's zero grad), 1 (x^0, also at x = 0), fractions truncated (2.5 -> 2; in the higher
# grads T(y - k) of the float32 difference: 2.5 - 3 -> 0), a long exponent (40: x^39 wraps, even x
# give 0) and one of 30 bits
POW_YS = (0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 40.0, 1073741825.0)


@pytest.mark.parametrize("dtype", WIDE)
def test_pow_grad(dtype):
    x, g = _ints(dtype, (4, 6), seed=1), _ints(dtype, (4, 6), seed=3)
    x.reshape(-1)[3:8] = (1, -1, 2, -3, 7)
    for y in POW_YS:
        want = C.pow_grad(_t(x), _t(g), y)
        _same(tvmgrad.run("pow_grad", {"x": x, "out_grad": g}, {"y": y}), {"x_grad": want})


@pytest.mark.parametrize("op", ["pow_double_grad", "pow_triple_grad"])
@pytest.mark.parametrize("dtype", WIDE)
def test_pow_higher_grads(op, dtype):
    x = _ints(dtype, (3, 5), seed=1)
    x.reshape(-1)[3:8] = (1, -1, 2, -3, 7)
    ins = {"x": x, "grad_out": _ints(dtype, (3, 5), seed=2)}
    if op == "pow_double_grad":
        ins["grad_x_grad"] = _ints(dtype, (3, 5), seed=3)
        cases = [(y, ins) for y in POW_YS if y >= 1]
    else:
        ins.update(grad_grad_x=_ints(dtype, (3, 5), seed=3), grad_x_grad=_ints(dtype, (3, 5), seed=4))
        full = dict(ins, grad_grad_out_grad=_ints(dtype, (3, 5), seed=5))
        cases = [(y, i) for y in POW_YS if y >= 2 for i in (ins, full)]
    order = 2 if op == "pow_double_grad" else 3
    for y, inputs in cases + [(1025.0, cases[-1][1])]:
        if math.prod(y - j for j in range(order)) > np.iinfo(dtype).max:
            continue                    # the coefficient does not fit: refused (test below)
        _same(tvmgrad.run(op, inputs, {"y": y}), _pow_kernel_oracle(op, x, dtype, inputs, y))


@pytest.mark.parametrize("op, y, why", [
    ("pow_grad", 0.5, "exponent -1"), ("pow_grad", -2.0, "exponent -3"),
    ("pow_grad", 3e9, "does not fit int32"), ("pow_grad", float("nan"), "has no int32 value"),
    ("pow_double_grad", 0.5, "exponent -1"), ("pow_triple_grad", 1.0, "exponent -2"),
    ("pow_triple_grad", 1.5, "exponent -1"), ("pow_double_grad", 50000.0, "does not fit int32")])
def test_pow_grads_refuse_negative_exponents(op, y, why):
    """Where Paddle's integer pow would loop forever (a negative exponent) or cast a float that T
    cannot hold, a ValueError naming the op and y, before anything is built."""
    x = np.arange(6, dtype="int32").reshape(2, 3)
    names = {"pow_grad": ("out_grad",), "pow_double_grad": ("grad_out", "grad_x_grad"),
             "pow_triple_grad": ("grad_out", "grad_grad_x", "grad_x_grad")}[op]
    with pytest.raises(ValueError, match=rf"^{op}: attribute 'y' = .*{why}"):
        tvmgrad.run(op, {"x": x, **{n: x for n in names}}, {"y": y})
