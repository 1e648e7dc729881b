"""Grads of elementary functions against Paddle 3.3.1 (te_defs/elementary.py).

Every op runs in every dtype on a cross product of special values (zeros, domain edges, ±inf,
NaN) of its main input with special values of its cotangent, and on ordinary values in odd,
size-1, rank-0 and empty shapes. Where Paddle cannot answer (an optional input its autograd never
leaves out) the oracle is a numpy transcription of Paddle's kernel, noted at the test.

Paddle's CPU kernels are Eigen-vectorised, and in full 4/8-element packets some special values come
out differently from the scalar tail: sqrt(+inf) = NaN in float32 (so acosh_grad/asinh_grad give NaN
at x = ±inf), exp clamps (exp(-900) = 6.3e-309 in float64, 3.3e-39 in float32, so erf_grad times an
infinite cotangent is ±inf instead of NaN) and pow(-0, odd negative integer) = +inf instead of -inf.
Paddle's answer then depends on an element's position. Our kernels give the IEEE (scalar) value
everywhere, so the special-value checks run Paddle one element at a time (``one_by_one``).

Near |x| = 1 the float32 kernels of asin/acos/atanh/acosh are *more* accurate than Paddle's
(LLVM contracts ``1 - x·x`` into an FMA), so the special values there are chosen with exact squares.
"""

import ctypes
import ctypes.util
import math

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, autograd_oracle, c_ops, cast, check, from_paddle, leaf, rng, to_paddle

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")

INF, NAN = np.inf, np.nan
SHAPES = [(), (0,), (2, 0, 3), (1,), (7,), (3, 1, 5), (2, 3, 1, 4)]
# cotangent specials, crossed with every special of the main input
G_SPECIALS = [1.25, 0.0, -2.0, INF, -INF, NAN]


def one_by_one(oracle=None, op=None):
    """An oracle that runs Paddle (``oracle``, else ``_C_ops.<op>``) on one element at a time, so
    that every element takes Eigen's scalar path (see the module docstring)."""
    def run(inputs, attrs):
        base = next(np.asarray(v) for v in inputs.values() if v is not None)
        n, shape = base.size, base.shape
        outs = {}
        for i in range(n):
            one = {k: None if v is None else np.asarray(v).reshape(-1)[i:i + 1] for k, v in inputs.items()}
            got = oracle(one, attrs) if oracle is not None else c_ops(op, one, attrs)
            for k, v in got.items():
                if v is None:
                    outs[k] = None
                    continue
                if k not in outs:
                    outs[k] = np.empty(n, dtype=v.dtype)
                outs[k][i] = v.reshape(-1)[0]
        return {k: None if v is None else v.reshape(shape) for k, v in outs.items()}
    return run


def cross(specials, g_specials=G_SPECIALS):
    """(x, g): every x special paired with every g special."""
    xs, gs = np.meshgrid(np.asarray(specials, float), np.asarray(g_specials, float), indexing="ij")
    return xs.ravel(), gs.ravel()


def domain_values(domain, shape, seed=0):
    """Ordinary values of ``shape`` from ``domain``: ("normal", scale) or ("uniform", lo, hi)
    or a callable of a Generator and a shape."""
    r = rng(seed)
    if callable(domain):
        return domain(r, shape)
    if domain[0] == "normal":
        return r.standard_normal(shape) * domain[1]
    return r.uniform(domain[1], domain[2], size=shape)


def _two_sided(lo, hi):
    """|x| uniform in [lo, hi], random sign."""
    return lambda r, shape: r.uniform(lo, hi, size=shape) * np.where(r.random(shape) < 0.5, -1.0, 1.0)


# op -> (main input, domain of ordinary values, special values of the main input)
UNARY = {
    "abs_grad": ("x", ("normal", 2.0), [0.0, -0.0, 3.0, -1e-30, INF, -INF, NAN]),
    "sin_grad": ("x", ("normal", 3.0), [0.0, -0.0, math.pi / 2, 100.0, INF, -INF, NAN]),
    "cos_grad": ("x", ("normal", 3.0), [0.0, -0.0, math.pi, -100.0, INF, -INF, NAN]),
    "tan_grad": ("x", ("uniform", -1.4, 1.4), [0.0, math.pi / 2, -math.pi / 2, 3.0, INF, -INF, NAN]),
    "sinh_grad": ("x", ("normal", 3.0), [0.0, 100.0, -100.0, 1000.0, INF, -INF, NAN]),
    "cosh_grad": ("x", ("normal", 3.0), [0.0, -0.0, 100.0, -1000.0, INF, -INF, NAN]),
    "asin_grad": ("x", ("uniform", -0.95, 0.95), [0.0, 1.0, -1.0, 0.75, 1.5, -1.0009765625, INF, NAN]),
    "acos_grad": ("x", ("uniform", -0.95, 0.95), [0.0, 1.0, -1.0, -0.75, 1.5, 1.0009765625, -INF, NAN]),
    "atan_grad": ("x", ("normal", 3.0), [0.0, 1.0, -1e20, 1e-20, INF, -INF, NAN]),
    "asinh_grad": ("x", ("normal", 3.0), [0.0, -1.0, 1e20, 1e-20, INF, -INF, NAN]),
    "acosh_grad": ("x", _two_sided(1.05, 4.0), [1.0, -1.0, 0.5, 0.0, 1.5, -2.0, INF, -INF, NAN]),
    "atanh_grad": ("x", ("uniform", -0.95, 0.95), [0.0, 1.0, -1.0, 0.5, 2.0, -3.0, INF, NAN]),
    "exp_grad": ("out", lambda r, s: np.exp(r.standard_normal(s)), [0.0, 1.0, 1e30, INF, NAN]),
    "expm1_grad": ("out", lambda r, s: np.expm1(r.standard_normal(s)), [-1.0, 0.0, 2.5, 1e30, INF, NAN]),
    "log_grad": ("x", ("uniform", 0.1, 5.0), [0.0, -0.0, 1.0, -1.0, 1e-30, INF, -INF, NAN]),
    "log2_grad": ("x", ("uniform", 0.1, 5.0), [0.0, -0.0, 1.0, -2.0, 1e-30, INF, -INF, NAN]),
    "log10_grad": ("x", ("uniform", 0.1, 5.0), [0.0, -0.0, 10.0, -3.0, 1e-30, INF, -INF, NAN]),
    "log1p_grad": ("x", ("uniform", -0.9, 5.0), [-1.0, 0.0, -2.0, -0.5, INF, -INF, NAN]),
    "erf_grad": ("x", ("normal", 2.0), [0.0, -0.0, 10.0, -30.0, INF, -INF, NAN]),
    "sqrt_grad": ("out", ("uniform", 0.1, 3.0), [0.0, -0.0, 1.0, 1e-30, -1.0, INF, NAN]),
    "rsqrt_grad": ("out", ("uniform", 0.1, 3.0), [0.0, 1.0, 1e20, -2.0, INF, NAN]),
    "square_grad": ("x", ("normal", 2.0), [0.0, -0.0, 1e20, -3.0, INF, -INF, NAN]),
    "reciprocal_grad": ("out", ("normal", 2.0), [0.0, -0.0, 1e20, -3.0, INF, -INF, NAN]),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.sweep
def test_unary_grad(op, dtype):
    name, domain, specials = UNARY[op]
    x, g = cross(specials)
    check(op, {name: x, "out_grad": g}, dtype=dtype, oracle=one_by_one(op=op))
    for i, shape in enumerate(SHAPES):
        check(op, {name: domain_values(domain, shape, i), "out_grad": rng(50 + i).standard_normal(shape)},
              dtype=dtype)


# ------------------------------------------------------------------------------------------
# out_grad only: zero grads (some NaN where out_grad is not finite)

ZERO_GRADS = {
    # op -> attrs to try besides the defaults
    "floor_grad": [{}], "ceil_grad": [{}], "round_grad": [{}], "trunc_grad": [{}],
    "poisson_grad": [{}], "sign_grad": [{}],
    "gaussian_inplace_grad": [{}, {"mean": 1.5, "std": 0.25, "seed": 7}],
    "uniform_inplace_grad": [{}, {"min": -3.0, "max": 5.0, "seed": 3, "diag_num": 2, "diag_step": 5,
                                  "diag_val": 7.0}],
}


def _out_grad_values(shape, seed):
    g = rng(seed).standard_normal(shape)
    flat = g.reshape(-1)
    for i, v in enumerate([0.0, -0.0, INF, -INF, NAN, -3.5]):
        flat[i::11] = v
    return g


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(ZERO_GRADS))
def test_zero_like_grads(op, dtype):
    for attrs in ZERO_GRADS[op]:
        for i, shape in enumerate(SHAPES + [(4, 12)]):
            check(op, {"out_grad": _out_grad_values(shape, i)}, attrs, dtype=dtype)
    # what Paddle computes, spelled out: 0·out_grad for floor/ceil/round and sign (scale by 0),
    # plain zeros for the rest
    g = cast(np.array([1.0, INF, NAN]), dtype)
    out = next(iter(tvmgrad.run(op, {"out_grad": g}).values())).astype(np.float64)
    nan_at_inf = op in ("floor_grad", "ceil_grad", "round_grad", "sign_grad")
    np.testing.assert_array_equal(out, [0.0, NAN, NAN] if nan_at_inf else [0.0, 0.0, 0.0])


# ------------------------------------------------------------------------------------------
# scale_grad: invoke scale(out_grad, scale, 0, true)

def _scale_oracle(inputs, attrs):
    import paddle
    out = paddle._C_ops.scale(to_paddle(inputs["out_grad"]), attrs.get("scale", 1.0), 0.0, True)
    return {"x_grad": from_paddle(out)}


@pytest.mark.parametrize("dtype", FLOATS)
def test_scale_grad(dtype):
    g = _out_grad_values((5, 7), 1)
    for attrs in [{}, {"scale": 2.5}, {"scale": -0.75}, {"scale": 0.0}, {"scale": INF}, {"scale": NAN}]:
        check("scale_grad", {"out_grad": g}, attrs, dtype=dtype, oracle=_scale_oracle)
    for shape in SHAPES:
        check("scale_grad", {"out_grad": rng(2).standard_normal(shape)}, {"scale": 3.0}, dtype=dtype,
              oracle=_scale_oracle)


# ------------------------------------------------------------------------------------------
# pow_grad and its double/triple grads (y: Scalar, a runtime argument)

POW_Y = [0.0, 1.0, 2.0, 3.0, 0.5, -1.0, -0.5, 2.5, 0.1, -2.0]
POW_X = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, INF, -INF, NAN]


@pytest.mark.parametrize("dtype", FLOATS)
def test_pow_grad(dtype):
    x, g = cross(POW_X)
    for y in POW_Y:
        check("pow_grad", {"x": x, "out_grad": g}, {"y": y}, dtype=dtype, oracle=one_by_one(op="pow_grad"))
    for i, shape in enumerate(SHAPES):
        check("pow_grad", {"x": rng(i).uniform(-3, 3, shape), "out_grad": rng(9).standard_normal(shape)},
              {"y": 3.0}, dtype=dtype)
    # the default y = -1
    check("pow_grad", {"x": rng(1).uniform(0.5, 3, (4, 5)), "out_grad": rng(2).standard_normal((4, 5))},
          dtype=dtype)


def test_pow_grad_y_is_float32_in_paddle():
    # Paddle reads y with factor.to<float>(): for float64 x, y = 0.1 acts as float32(0.1)
    x = np.array([0.5, 2.0, 3.0])
    got = tvmgrad.run("pow_grad", {"x": x, "out_grad": np.ones(3)}, {"y": 0.1})["x_grad"]
    y32 = float(np.float32(0.1))
    np.testing.assert_allclose(got, y32 * x ** (y32 - 1), rtol=1e-14)
    assert not np.allclose(got, 0.1 * x ** (0.1 - 1), rtol=1e-10, atol=0)


def _pow_chain_inputs(seed):
    """x (with specials) and the cotangents of the pow grad chain, as a flat cross product."""
    r = rng(seed)
    x = np.repeat(np.asarray(POW_X), 3)
    n = x.size
    others = [r.standard_normal(n) for _ in range(4)]
    for k, o in enumerate(others):
        o[k::13] = [INF, NAN, 0.0][k % 3]
    return np.concatenate([x, r.uniform(0.2, 3, 10)]), [np.concatenate([o, r.standard_normal(10)])
                                                       for o in others]


@pytest.mark.parametrize("dtype", FLOATS)
def test_pow_double_grad(dtype):
    x, (go, ddx, _, _) = _pow_chain_inputs(0)
    oracle = autograd_oracle("pow_double_grad")
    for y in POW_Y:
        check("pow_double_grad", {"x": x, "grad_out": go, "grad_x_grad": ddx}, {"y": y}, dtype=dtype,
              oracle=one_by_one(oracle))
    for i, shape in enumerate(SHAPES):
        r = rng(i)
        check("pow_double_grad", {"x": r.uniform(0.2, 3, shape), "grad_out": r.standard_normal(shape),
                                  "grad_x_grad": r.standard_normal(shape)}, {"y": 2.5}, dtype=dtype,
              oracle=oracle)


@pytest.mark.parametrize("dtype", FLOATS)
def test_pow_triple_grad(dtype):
    # all inputs finite here: Paddle's autograd fills an absent grad_grad_out_grad with zeros,
    # which agrees with the kernel's "absent" (terms dropped) only for finite values
    r = rng(4)
    x = np.concatenate([[0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5], r.uniform(0.2, 3, 12)])
    go, ddx, d_dx, d_ddout = (r.standard_normal(x.shape) for _ in range(4))
    oracle = autograd_oracle("pow_triple_grad")
    for y in POW_Y:
        for present in (True, False):
            check("pow_triple_grad", {"x": x, "grad_out": go, "grad_grad_x": ddx, "grad_x_grad": d_dx,
                                      "grad_grad_out_grad": d_ddout if present else None},
                  {"y": y}, dtype=dtype, oracle=one_by_one(oracle))
    for i, shape in enumerate(SHAPES):
        r = rng(i)
        check("pow_triple_grad", {"x": r.uniform(0.2, 3, shape), "grad_out": r.standard_normal(shape),
                                  "grad_grad_x": r.standard_normal(shape),
                                  "grad_x_grad": r.standard_normal(shape),
                                  "grad_grad_out_grad": r.standard_normal(shape)}, {"y": 3.5}, dtype=dtype,
              oracle=oracle)


_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.pow.restype, _libm.pow.argtypes = ctypes.c_double, (ctypes.c_double, ctypes.c_double)


def _c_pow(x, e):
    """C's pow (what Paddle's scalar path calls); numpy differs at e.g. (-inf) ** 0.5."""
    return np.array([_libm.pow(float(v), e) for v in np.ravel(x)]).reshape(np.shape(x))


def _pow_triple_kernel(inputs, attrs):
    """numpy transcription of Paddle's PowTripleGradKernel (its optional input may be None)."""
    x, dout, ddx, d_dx = (inputs[k] for k in ("x", "grad_out", "grad_grad_x", "grad_x_grad"))
    d_ddout = inputs["grad_grad_out_grad"]
    e = np.float32(attrs["y"])
    with np.errstate(all="ignore"):
        def p(k):
            return _c_pow(x, float(np.float32(e - np.float32(k))))

        def c(k):
            out = np.float32(e)
            for j in range(1, k):
                out = np.float32(out * np.float32(e - np.float32(j)))
            return np.float64(out)

        if e == 2:
            dx = d_ddout * ddx * (p(2) * c(2)) if d_ddout is not None else np.zeros_like(x)
            d_dout = d_dx * ddx * (p(2) * c(2))
        elif e == 1:
            dx = d_dx * ddx * dout * (p(3) * c(3))
            d_dout = np.zeros_like(x)
        else:
            dx = d_dx * ddx * dout * (p(3) * c(3))
            if d_ddout is not None:
                dx = dx + d_ddout * ddx * (p(2) * c(2))
            d_dout = d_dx * ddx * (p(2) * c(2))
        if e == 1:
            d_ddx = d_ddout * (p(1) * c(1)) if d_ddout is not None else np.zeros_like(x)
        else:
            d_ddx = d_dx * dout * (p(2) * c(2))
            if d_ddout is not None:
                d_ddx = d_ddx + d_ddout * (p(1) * c(1))
    return {"x_grad": dx, "grad_out_grad": d_dout, "grad_grad_x_grad": d_ddx}


def test_pow_triple_grad_specials():
    # inf/NaN everywhere, incl. an absent grad_grad_out_grad: against Paddle's kernel, transcribed
    # (Paddle's autograd would hand the kernel zeros instead of "absent": 0·inf = NaN there)
    x, (go, ddx, d_dx, d_ddout) = _pow_chain_inputs(1)
    for y in POW_Y:
        for present in (True, False):
            check("pow_triple_grad", {"x": x, "grad_out": go, "grad_grad_x": ddx, "grad_x_grad": d_dx,
                                      "grad_grad_out_grad": d_ddout if present else None},
                  {"y": y}, dtype="float64", oracle=_pow_triple_kernel)


def test_pow_triple_grad_matches_paddle_autograd_with_specials():
    # every input present, inf/NaN included: ours is Paddle (so the transcription above, which
    # agrees with ours, agrees with Paddle wherever Paddle can be asked)
    x, (go, ddx, d_dx, d_ddout) = _pow_chain_inputs(2)
    inputs = {"x": x, "grad_out": go, "grad_grad_x": ddx, "grad_x_grad": d_dx, "grad_grad_out_grad": d_ddout}
    for y in POW_Y:
        check("pow_triple_grad", inputs, {"y": y}, dtype="float64",
              oracle=one_by_one(autograd_oracle("pow_triple_grad")))


def test_pow_higher_grads_reject_broadcasting():
    # Paddle aborts (heap corruption) on mismatched shapes here; pow is unary, so shapes must match
    with pytest.raises(ValueError):
        tvmgrad.run("pow_double_grad", {"x": np.ones((3, 1)), "grad_out": np.ones((3, 4)),
                                        "grad_x_grad": np.ones((3, 4))}, {"y": 3.0})


# ------------------------------------------------------------------------------------------
# clip

CLIP_X = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, INF, -INF, NAN]


@pytest.mark.parametrize("dtype", FLOATS)
def test_clip_grad(dtype):
    x, g = cross(CLIP_X)
    for attrs in [{}, {"min": -1.0, "max": 1.0}, {"min": 0.5, "max": 0.5}, {"min": 1.0, "max": -1.0},
                  {"min": -INF, "max": 0.0}, {"min": 0.25, "max": INF}]:
        check("clip_grad", {"x": x, "out_grad": g}, attrs, dtype=dtype)
        check("clip_double_grad", {"x": x, "grad_x_grad": g}, attrs, dtype=dtype, oracle=_clip_double_oracle)
    for i, shape in enumerate(SHAPES):
        inputs = {"x": rng(i).standard_normal(shape), "out_grad": rng(20 + i).standard_normal(shape)}
        check("clip_grad", inputs, {"min": -0.5, "max": 0.75}, dtype=dtype)
        check("clip_double_grad", {"x": inputs["x"], "grad_x_grad": inputs["out_grad"]},
              {"min": -0.5, "max": 0.75}, dtype=dtype, oracle=_clip_double_oracle)


def test_clip_grad_bounds_not_exact_in_float32():
    # min = 0.1 is float32(0.1) for float32 x and exactly 0.1 for float64 x, as in Paddle
    for dtype in ("float32", "float64"):
        x = np.array([0.1, 0.2, 0.30000001192092896], dtype=dtype)
        check("clip_grad", {"x": x, "out_grad": np.ones(3, dtype)}, {"min": 0.1, "max": 0.3}, dtype=dtype)


def _clip_double_oracle(inputs, attrs):
    # clip_double_grad's cotangent input is grad_x_grad; grad_out is not used (extra)
    return autograd_oracle("clip_double_grad", extra=lambda i, a: {"grad_out": np.ones_like(i["x"])})(
        inputs, attrs)


# ------------------------------------------------------------------------------------------
# double grads through Paddle's autograd

def _ones_for(*names):
    return lambda inputs, attrs: {n: np.ones_like(inputs["x"]) for n in names}


DOUBLE = {
    # op -> (main input, domain, specials of it, extra for the oracle)
    "sin_double_grad": ("x", ("normal", 3.0), [0.0, math.pi / 2, 100.0, INF, -INF, NAN], None),
    "cos_double_grad": ("x", ("normal", 3.0), [0.0, math.pi, -100.0, INF, -INF, NAN], None),
    "exp_double_grad": ("out", lambda r, s: np.exp(r.standard_normal(s)), [0.0, 1.0, 1e30, INF, NAN], None),
    "log_double_grad": ("x", ("uniform", 0.1, 5.0), [0.0, -0.0, 1.0, -1.0, 1e-30, INF, -INF, NAN], None),
    "square_double_grad": ("x", ("normal", 2.0), [0.0, 1e20, -3.0, INF, -INF, NAN], None),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(DOUBLE))
def test_double_grad(op, dtype):
    name, domain, specials, extra = DOUBLE[op]
    a, b = "grad_out", "grad_x_grad"
    x, g = cross(specials)
    # the second cotangent: the cotangent specials in another order, so that pairs vary
    h = np.roll(g, 3)
    oracle = autograd_oracle(op, extra)
    check(op, {name: x, a: g, b: h}, dtype=dtype, oracle=one_by_one(oracle))
    for i, shape in enumerate(SHAPES):
        r = rng(30 + i)
        check(op, {name: domain_values(domain, shape, i), a: r.standard_normal(shape),
                   b: r.standard_normal(shape)}, dtype=dtype, oracle=oracle)


@pytest.mark.parametrize("dtype", FLOATS)
def test_abs_double_and_triple_grad(dtype):
    x, g = cross([0.0, -0.0, 3.0, -1e-30, INF, -INF, NAN])
    # abs_double_grad does not read grad_out; Paddle's autograd needs one
    check("abs_double_grad", {"x": x, "grad_x_grad": g}, dtype=dtype,
          oracle=one_by_one(autograd_oracle("abs_double_grad", _ones_for("grad_out"))))
    check("abs_triple_grad", {"x": x, "grad_out_grad_grad": g}, dtype=dtype, oracle=one_by_one(_abs_triple_oracle))
    for i, shape in enumerate(SHAPES):
        xs, gs = domain_values(("normal", 2.0), shape, i), rng(40 + i).standard_normal(shape)
        check("abs_double_grad", {"x": xs, "grad_x_grad": gs}, dtype=dtype,
              oracle=autograd_oracle("abs_double_grad", _ones_for("grad_out")))
        check("abs_triple_grad", {"x": xs, "grad_out_grad_grad": gs}, dtype=dtype, oracle=_abs_triple_oracle)


def _abs_triple_oracle(inputs, attrs):
    """Paddle's autograd three levels down from abs_grad (the harness's oracle cannot supply the
    unused grad_out and grad_x_grad primals of the intermediate levels)."""
    import paddle
    x = leaf(inputs["x"])
    go, ddx = leaf(np.ones_like(inputs["x"])), leaf(np.ones_like(inputs["x"]))
    dx = paddle._C_ops.abs_grad(x, go)
    (ddout,) = paddle.grad([dx], [go], [ddx], create_graph=True)
    (res,) = paddle.grad([ddout], [ddx], [to_paddle(inputs["grad_out_grad_grad"])])
    return {"grad_x_grad_grad": from_paddle(res)}


def test_abs_grads_at_the_edges():
    # spelled out: 0 at x = ±0 even for a NaN cotangent; x/|x| is NaN at ±inf (grad and double
    # grad), while the triple grad uses sign(x) (±1 at ±inf, NaN at NaN)
    x = np.array([0.0, -0.0, INF, -INF, NAN, -2.0])
    g = np.array([NAN, INF, 1.0, 1.0, 1.0, 3.0])
    np.testing.assert_array_equal(tvmgrad.run("abs_grad", {"x": x, "out_grad": g})["x_grad"],
                                  [0, 0, NAN, NAN, NAN, -3])
    np.testing.assert_array_equal(tvmgrad.run("abs_double_grad", {"x": x, "grad_x_grad": g})["grad_out_grad"],
                                  [0, 0, NAN, NAN, NAN, -3])
    np.testing.assert_array_equal(
        tvmgrad.run("abs_triple_grad", {"x": x, "grad_out_grad_grad": g})["grad_x_grad_grad"],
        [NAN, NAN, 1, -1, NAN, -3])


SQRTS = {
    # op -> grad_out that makes the first-order grad equal grad_x (the op takes grad_x, its
    # forward's output; Paddle's autograd needs the forward's input grad_out)
    "sqrt_double_grad": lambda i, a: {"grad_out": 2.0 * i["out"] * i["grad_x"]},
    "rsqrt_double_grad": lambda i, a: {"grad_out": -2.0 * i["grad_x"] / i["out"] ** 3},
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(SQRTS))
def test_sqrt_rsqrt_double_grad(op, dtype):
    # out and grad_x powers of two: the oracle's recomputed grad_x is exact
    out, gx = cross([0.25, 1.0, 4.0, 0.5], [1.0, -2.0, 0.0, 0.5])
    ddx = np.resize([1.5, -0.5, 0.0, INF, NAN, 2.0, -INF], out.shape)
    oracle = autograd_oracle(op, SQRTS[op])
    check(op, {"out": out, "grad_x": gx, "grad_x_grad": ddx}, dtype=dtype, oracle=one_by_one(oracle))
    for i, shape in enumerate(SHAPES):
        r = rng(60 + i)
        check(op, {"out": r.uniform(0.3, 3, shape), "grad_x": r.standard_normal(shape),
                   "grad_x_grad": r.standard_normal(shape)}, dtype=dtype, oracle=oracle)


def _sqrt_double_kernel(op):
    """Paddle's SqrtGradGradFunctor / RsqrtGradGradFunctor, transcribed (numpy float64)."""
    def oracle(inputs, attrs):
        out, dx, ddx = inputs["out"], inputs["grad_x"], inputs["grad_x_grad"]
        with np.errstate(all="ignore"):
            if op == "sqrt_double_grad":
                return {"out_grad": dx * ddx * -1.0 / out, "grad_out_grad": ddx * 0.5 / out}
            return {"out_grad": (3.0 / out) * dx * ddx, "grad_out_grad": ddx * -0.5 * out * out * out}
    return oracle


@pytest.mark.parametrize("op", sorted(SQRTS))
def test_sqrt_rsqrt_double_grad_edges(op):
    # out = 0, ±inf, NaN: Paddle's autograd cannot produce a given grad_x there (it recomputes
    # grad_x from grad_out), so the oracle is the kernel's formula, transcribed
    out, gx = cross([0.0, -0.0, INF, NAN, 2.0], [1.0, 0.0, INF, NAN])
    ddx = np.resize([1.5, 0.0, -INF, NAN, 2.0, 1.0], out.shape)
    check(op, {"out": out, "grad_x": gx, "grad_x_grad": ddx}, dtype="float64", oracle=_sqrt_double_kernel(op))


# ------------------------------------------------------------------------------------------
# sin/cos triple grads (three optional inputs)

TRIPLE_INPUTS = ("grad_out_forward", "grad_x_grad_forward", "grad_x_grad", "grad_out_grad_grad")
OPTIONAL = ("grad_out_forward", "grad_x_grad_forward", "grad_out_grad_grad")


def _triple_inputs(seed, specials, finite=False):
    """x: each special 4 times, then ordinary values; the other inputs normals with an inf, NaN,
    0 or -inf (one kind per input) at every 5th place among the specials unless ``finite``."""
    r = rng(seed)
    x = np.repeat(np.asarray(specials), 4)
    n = x.size
    ins = {"x": np.concatenate([x, r.normal(0, 3, 12)])}
    for k, name in enumerate(TRIPLE_INPUTS):
        v = r.standard_normal(n + 12)
        if not finite:
            v[k:n:5] = [INF, NAN, 0.0, -INF][k]
        ins[name] = v
    return ins


def _trig_triple_kernel(op):
    """numpy transcription of Paddle's Sin/CosTripleGradFunctor, branches for absent inputs
    included: a term that reads an absent input is dropped; an output left with no term is 0·x."""
    def oracle(inputs, attrs):
        x = inputs["x"]
        d1y, d2d1x, d3d2x, d3 = (inputs[k] for k in TRIPLE_INPUTS)
        with np.errstate(all="ignore"):
            s, c = np.sin(x), np.cos(x)
            zero = 0.0 * x
            if op == "sin":
                t_dx = [(lambda: -c * d1y * d2d1x * d3d2x, (d1y, d2d1x)), (lambda: -s * d2d1x * d3, (d2d1x, d3))]
                t_dout = [(lambda: -s * d2d1x * d3d2x, (d2d1x,))]
                t_ddx = [(lambda: -s * d1y * d3d2x, (d1y,)), (lambda: c * d3, (d3,))]
            else:
                t_dx = [(lambda: s * d1y * d2d1x * d3d2x, (d1y, d2d1x)), (lambda: -c * d2d1x * d3, (d2d1x, d3))]
                t_dout = [(lambda: -c * d2d1x * d3d2x, (d2d1x,))]
                t_ddx = [(lambda: -c * d1y * d3d2x, (d1y,)), (lambda: -s * d3, (d3,))]

            def total(terms):
                kept = [t() for t, needs in terms if all(n is not None for n in needs)]
                return sum(kept[1:], kept[0]) if kept else zero
            return {"x_grad": total(t_dx), "grad_out_forward_grad": total(t_dout),
                    "grad_x_grad_forward_grad": total(t_ddx) if d2d1x is not None else None}
    return oracle


TRIG_X = [0.0, math.pi / 2, -1.0, INF, -INF, NAN]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["sin_triple_grad", "cos_triple_grad"])
def test_trig_triple_grad(op, dtype):
    oracle = autograd_oracle(op)
    ins = _triple_inputs(0, TRIG_X)
    check(op, ins, dtype=dtype, oracle=one_by_one(oracle))
    # grad_out_grad_grad absent: Paddle's autograd passes zeros, which is the kernel's "absent"
    # only where the other inputs are finite
    finite = _triple_inputs(1, [0.0, 1.0, -2.0, 0.5], finite=True)
    check(op, {**finite, "grad_out_grad_grad": None}, dtype=dtype, oracle=oracle)
    for i, shape in enumerate(SHAPES):
        r = rng(70 + i)
        check(op, {"x": r.normal(0, 3, shape), **{k: r.standard_normal(shape) for k in TRIPLE_INPUTS}},
              dtype=dtype, oracle=oracle)


@pytest.mark.parametrize("op", ["sin_triple_grad", "cos_triple_grad"])
@pytest.mark.parametrize("absent", [(), ("grad_out_forward",), ("grad_x_grad_forward",), ("grad_out_grad_grad",),
                                    ("grad_out_forward", "grad_x_grad_forward"),
                                    ("grad_out_forward", "grad_out_grad_grad"),
                                    ("grad_x_grad_forward", "grad_out_grad_grad"), OPTIONAL])
def test_trig_triple_grad_absent_inputs(op, absent):
    ins = _triple_inputs(2, TRIG_X)
    ins.update({k: None for k in absent})
    got = check(op, ins, dtype="float64", oracle=_trig_triple_kernel(op.split("_")[0]))
    # grad_x_grad_forward_grad is not produced without grad_x_grad_forward
    assert (got["grad_x_grad_forward_grad"] is None) == ("grad_x_grad_forward" in absent)


def test_trig_triple_grad_kernel_transcription_is_paddle():
    # all inputs present, specials included: the transcription agrees with Paddle's autograd
    for op in ("sin", "cos"):
        ins = _triple_inputs(3, TRIG_X)
        want = one_by_one(autograd_oracle(f"{op}_triple_grad"))(ins, {})
        mine = _trig_triple_kernel(op)(ins, {})
        for k in want:
            np.testing.assert_allclose(mine[k], want[k], rtol=1e-12, atol=1e-14, equal_nan=True)


def test_trig_triple_grad_rejects_mismatched_shapes():
    ins = {"x": np.ones((3, 1)), **{k: np.ones((3, 4)) for k in TRIPLE_INPUTS}}
    with pytest.raises(ValueError):
        tvmgrad.run("sin_triple_grad", ins)


# ------------------------------------------------------------------------------------------
# in-place (YAML ``inplace`` pairs): the aliased input is often read by another output too

INPLACE = {
    # op -> attrs; inputs are uniform in [0.5, 2] (inside every op's domain except acos/asin/atanh,
    # which get [-0.9, 0.9])
    "acos_grad": {}, "atanh_grad": {}, "exp_grad": {}, "clip_grad": {"min": 0.8, "max": 1.5},
    "sin_double_grad": {}, "cos_double_grad": {}, "exp_double_grad": {}, "log_double_grad": {},
    "square_double_grad": {}, "sqrt_double_grad": {}, "rsqrt_double_grad": {},
    "pow_grad": {"y": 2.5}, "pow_double_grad": {"y": 2.5},
    "sin_triple_grad": {}, "cos_triple_grad": {}, "floor_grad": {}, "uniform_inplace_grad": {},
}


@pytest.mark.parametrize("dtype", ["float64", "float16"])
@pytest.mark.parametrize("op", sorted(INPLACE))
def test_inplace(op, dtype):
    spec = tvmgrad.registry.get(op).spec
    assert spec.inplace, op
    lo, hi = (-0.9, 0.9) if op in ("acos_grad", "atanh_grad") else (0.5, 2.0)
    r = rng(5)
    inputs = {p.name: cast(r.uniform(lo, hi, (3, 5)), dtype) for p in spec.tensor_args}
    want = tvmgrad.run(op, {k: v.copy() for k, v in inputs.items()}, INPLACE[op])
    given = {k: v.copy() for k, v in inputs.items()}
    got = tvmgrad.run(op, given, INPLACE[op], inplace=True)
    for src, dst in spec.inplace:
        assert got[dst] is given[src]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{op}.{k}")
