"""Activation grads against Paddle 3.3.1 (te_defs/activation.py).

Every op runs in every dtype on values that include the op's kinks/thresholds (exactly), 0, ±inf
and NaN in the primal and ±inf/NaN in the cotangents; Paddle must agree everywhere (NaN positions
included) except where the comments say Paddle is wrong, which have their own tests.
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, autograd_oracle, cast, check, from_paddle, rng, to_paddle
from tvmgrad.families import OpError
from tvmgrad.spec import load_specs

VALUES = (5, 8)            # shape of the value tests (room for kinks and special values)
SHAPES = [(), (1,), (3, 1, 5), (2, 0, 3)]
SPECIALS = (0.0, np.inf, -np.inf, np.nan)


def primal(kinks=(), specials=True, scale=2.0, shape=VALUES, seed=0):
    """Normals·scale with each kink (and 0, ±inf, NaN, or the given ``specials``) at a few random
    places."""
    x = rng(seed).standard_normal(shape) * scale
    flat = x.reshape(-1)
    specials = SPECIALS if specials is True else (specials or ())
    vals = [v for v in kinks for _ in range(2)] + list(specials)
    if flat.size:
        flat[rng(seed + 100).permutation(flat.size)[:len(vals)]] = vals[:flat.size]
    return x


def cotangent(shape=VALUES, seed=1, specials=True):
    """Normals with +inf, -inf and NaN (or the given ``specials``) at random places."""
    g = rng(seed).standard_normal(shape)
    flat = g.reshape(-1)
    specials = (np.inf, -np.inf, np.nan) if specials is True else (specials or ())
    if flat.size >= len(specials):
        flat[rng(seed + 100).permutation(flat.size)[:len(specials)]] = specials
    return g


def np_sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def np_silu(x):
    with np.errstate(invalid="ignore"):
        return x * np_sigmoid(x)


def thresholded_relu_oracle(inputs, attrs):
    """Paddle 3.3.1's binding is thresholded_relu_grad(x, out_grad, threshold, value): called with
    the YAML's three args it segfaults, so pass value (unused by the grad) too."""
    import paddle
    r = paddle._C_ops.thresholded_relu_grad(to_paddle(inputs["x"]), to_paddle(inputs["out_grad"]),
                                            attrs["threshold"], 0.0)
    return {"x_grad": from_paddle(r)}


ORACLES = {"thresholded_relu_grad": thresholded_relu_oracle}


def elu(x, alpha):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x < 0, alpha * (np.exp(np.minimum(x, 0)) - 1), x)


# Special values left out of the Paddle comparison where Paddle is wrong (tests further down):
NO_POS_INF = (0.0, -np.inf, np.nan)      # x = +inf: exp(x) = inf times a 0 mask
FINITE = (0.0, np.nan)                   # x = ±inf: silu's 1 + exp(-x) overflows
# name -> (op, inputs besides out_grad as a function of the primal x, attrs, kinks of x[, options])
# options: x_specials / g_specials replace the special values put in x / out_grad.
FIRST_ORDER = {
    "relu": ("relu_grad", lambda x: {"out": np.maximum(x, 0)}, {}, (0.0,)),
    "relu6": ("relu6_grad", lambda x: {"out": np.clip(x * 3, 0, 6)}, {}, (0.0, 2.0)),
    "leaky_relu": ("leaky_relu_grad", lambda x: {"x": x}, {"negative_slope": 0.02}, (0.0,)),
    "leaky_relu_neg": ("leaky_relu_grad", lambda x: {"x": x}, {"negative_slope": -0.3}, (0.0,)),
    "leaky_relu_big": ("leaky_relu_grad", lambda x: {"x": x}, {"negative_slope": 1.7}, (0.0,)),
    "thresholded_relu": ("thresholded_relu_grad", lambda x: {"x": x}, {"threshold": 0.5}, (0.5,)),
    "thresholded_relu_neg": ("thresholded_relu_grad", lambda x: {"x": x}, {"threshold": -1.25}, (-1.25,)),
    "elu": ("elu_grad", lambda x: {"x": x, "out": elu(x, 1.0)}, {"alpha": 1.0}, (0.0,)),
    "elu_small": ("elu_grad", lambda x: {"x": x, "out": elu(x, 0.3)}, {"alpha": 0.3}, (0.0,)),
    # alpha ≤ 0: Paddle switches to the formula in x (out is not read)
    "elu_neg_alpha": ("elu_grad", lambda x: {"x": x, "out": elu(x, -0.4)}, {"alpha": -0.4}, (0.0,)),
    "elu_zero_alpha": ("elu_grad", lambda x: {"x": x, "out": elu(x, 0.0)}, {"alpha": 0.0}, (0.0,)),
    "celu": ("celu_grad", lambda x: {"x": x}, {"alpha": 1.0}, (0.0,),
             {"x_specials": NO_POS_INF, "g_specials": (np.nan,)}),
    "celu_small": ("celu_grad", lambda x: {"x": x}, {"alpha": 0.7}, (0.0,),
                   {"x_specials": NO_POS_INF, "g_specials": (np.nan,)}),
    "selu": ("selu_grad", lambda x: {"out": 1.0507009873554805 * elu(x, 1.6732632423543772)}, {}, (0.0,)),
    "selu_attrs": ("selu_grad", lambda x: {"out": 1.5 * elu(x, 0.5)}, {"scale": 1.5, "alpha": 0.5}, (0.0,)),
    "gelu_tanh": ("gelu_grad", lambda x: {"x": x}, {"approximate": True}, (0.0,)),
    "gelu_erf": ("gelu_grad", lambda x: {"x": x}, {"approximate": False}, (0.0,)),
    "silu": ("silu_grad", lambda x: {"x": x, "out": np_silu(x)}, {}, (0.0,),
             {"x_specials": FINITE}),
    "sigmoid": ("sigmoid_grad", lambda x: {"out": np_sigmoid(x)}, {}, (0.0,)),
    "logsigmoid": ("logsigmoid_grad", lambda x: {"x": x * 20}, {}, (0.0,)),
    "hardshrink": ("hardshrink_grad", lambda x: {"x": x}, {"threshold": 0.5}, (0.5, -0.5)),
    "hardshrink_zero": ("hardshrink_grad", lambda x: {"x": x}, {"threshold": 0.0}, (0.0,)),
    "softshrink": ("softshrink_grad", lambda x: {"x": x}, {"threshold": 0.5}, (0.5, -0.5)),
    "softshrink_zero": ("softshrink_grad", lambda x: {"x": x}, {"threshold": 0.0}, (0.0,)),
    "hardsigmoid": ("hardsigmoid_grad", lambda x: {"out": np.clip(x / 6 + 0.5, 0, 1)},
                    {"slope": 1 / 6, "offset": 0.5}, (3.0, -3.0)),
    "hardsigmoid_attrs": ("hardsigmoid_grad", lambda x: {"out": np.clip(x * 0.25 + 0.5, 0, 1)},
                          {"slope": 0.25, "offset": 0.5}, (2.0, -2.0)),
    "hardtanh": ("hardtanh_grad", lambda x: {"x": x * 10}, {}, (0.0, 2.4)),    # defaults t_min=0, t_max=24
    "hardtanh_attrs": ("hardtanh_grad", lambda x: {"x": x}, {"t_min": -1.0, "t_max": 1.0}, (1.0, -1.0)),
    "softplus": ("softplus_grad", lambda x: {"x": x * 10}, {"beta": 1.0, "threshold": 20.0}, (2.0,)),
    "softplus_attrs": ("softplus_grad", lambda x: {"x": x}, {"beta": 2.0, "threshold": 3.0}, (1.5,)),
    "softplus_inexact": ("softplus_grad", lambda x: {"x": x}, {"beta": 1.3, "threshold": 3.3}, (0.0,)),
    "softplus_neg_beta": ("softplus_grad", lambda x: {"x": x}, {"beta": -0.5, "threshold": 1.0}, (-2.0,)),
    "softsign": ("softsign_grad", lambda x: {"x": x}, {}, (0.0,)),
    "stanh": ("stanh_grad", lambda x: {"x": x}, {"scale_a": 0.67, "scale_b": 1.7159}, (0.0,)),
    "stanh_attrs": ("stanh_grad", lambda x: {"x": x}, {"scale_a": -2.0, "scale_b": 0.5}, (0.0,)),
    "tanh": ("tanh_grad", lambda x: {"out": np.tanh(x)}, {}, (0.0,)),
    "tanh_shrink": ("tanh_shrink_grad", lambda x: {"x": x}, {}, (0.0,)),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", sorted(FIRST_ORDER))
@pytest.mark.sweep
def test_first_order_values(case, dtype):
    op, make, attrs, kinks, *opts = FIRST_ORDER[case]
    opts = opts[0] if opts else {}
    inputs = make(primal(kinks, specials=opts.get("x_specials", True)))
    inputs["out_grad"] = cotangent(specials=opts.get("g_specials", True))
    check(op, inputs, attrs, dtype, oracle=ORACLES.get(op))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", ["relu", "leaky_relu", "elu", "celu", "gelu_erf", "silu", "sigmoid",
                                  "logsigmoid", "softplus", "stanh", "tanh_shrink", "hardsigmoid",
                                  "thresholded_relu", "selu"])
def test_first_order_shapes(case, shape, dtype):
    op, make, attrs, kinks, *_ = FIRST_ORDER[case]
    inputs = make(primal(kinks, specials=False, shape=shape))
    inputs["out_grad"] = cotangent(shape, specials=False)
    out = check(op, inputs, attrs, dtype, oracle=ORACLES.get(op))
    assert out["x_grad"].shape == shape


def test_float_attrs_are_rounded_like_paddle():
    """Paddle's float32 attribute rounding shows in float64: x just above 0.1 but below
    float32(0.1) is not past a threshold of 0.1 (softshrink), while logit's eps is a double."""
    v = 0.1
    mid = (v + float(np.float32(v))) / 2
    x = np.array([mid, -mid, 0.5])
    g = np.ones(3)
    got = tvmgrad.run("softshrink_grad", {"x": x, "out_grad": g}, {"threshold": v})["x_grad"]
    np.testing.assert_array_equal(got, [0.0, 0.0, 1.0])
    check("softshrink_grad", {"x": x, "out_grad": g}, {"threshold": v}, "float64")
    check("hardshrink_grad", {"x": x, "out_grad": g}, {"threshold": v}, "float64")
    check("thresholded_relu_grad", {"x": x, "out_grad": g}, {"threshold": v}, "float64",
          oracle=thresholded_relu_oracle)
    check("hardtanh_grad", {"x": x, "out_grad": g}, {"t_min": v, "t_max": 0.4}, "float64")
    check("logit_grad", {"x": np.array([mid, 0.5, 0.09]), "out_grad": g}, {"eps": v}, "float64")
    check("softplus_grad", {"x": x, "out_grad": g}, {"beta": 1.0, "threshold": v}, "float64")
    check("leaky_relu_grad", {"x": -x, "out_grad": g}, {"negative_slope": v}, "float64")
    check("selu_grad", {"out": np.array([-0.3, 0.0, 2.0]), "out_grad": g}, {}, "float64")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_tanh_accurate_near_zero(dtype):
    """TVM's own llvm tanh is (1 − e^−2x)/(1 + e^−2x): tanh(1e-8) = 0 in float32. The kernels use
    an expm1-based tanh, accurate in relative terms like Paddle's (checked with atol = 0)."""
    x = np.array([1e-30, 1e-8, -3e-6, 1e-4, -0.01, 0.3, 2.0, -9.0, 30.0])
    g = np.linspace(0.5, 2.0, x.size)
    check("tanh_shrink_grad", {"x": x, "out_grad": g}, None, dtype, atol=0)
    # (1 − tanh² cancels for large |x| in Paddle's formula and ours alike: compare where it does not)
    check("stanh_grad", {"x": x[:6], "out_grad": g[:6]}, {"scale_a": 0.67, "scale_b": 1.7159}, dtype, atol=0)
    check("gelu_grad", {"x": x, "out_grad": g}, {"approximate": True}, dtype, atol=0)


# ------------------------------------------------------------------------------------------
# Where Paddle is wrong: an intermediate overflows (exp of a large x times a zero mask) and gives
# NaN where the gradient is finite; at x = ±inf we give the gradient's limit.

def _x_grad(op, inputs, attrs, dtype="float32"):
    return tvmgrad.run(op, {k: v.astype(dtype) for k, v in inputs.items()}, attrs)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_silu_grad_large_negative_x(dtype):
    """Paddle forms 1 + exp(-x), which overflows for x < -88 (float32) / -709 (float64) and gives
    NaN; the gradient s·(1 + x·(1 − s)) there is ≈ x·e^x → 0. At x = ±inf we give the limits 1
    and 0 (Paddle: ±inf at +inf, from its exp(-inf) being a denormal rather than 0, NaN at -inf)."""
    x = np.array([-100.0, -800.0, -1e30, 100.0, 1e30, np.inf, -np.inf])
    out = _x_grad("silu_grad", {"x": x, "out": np_silu(x), "out_grad": np.full(7, 2.0)}, {}, dtype)
    np.testing.assert_allclose(out["x_grad"].astype(np.float64), [0, 0, 0, 2, 2, 2, 0], atol=1e-30)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_celu_grad_no_spurious_nan(dtype):
    """Paddle sums four masked terms, dout·exp(x/α)·[x ≤ 0] among them: exp(x/α) = inf for a large
    positive x (α > 0) gives inf·0 = NaN, and so does an infinite dout (inf·0 in the unused
    terms). The gradient is dout for x > 0 (and x = +inf) and dout·exp(x/α) for x ≤ 0."""
    x = np.array([1000.0, 5.0, -1.0, 0.0, 3.0, np.inf])
    g = np.array([1.5, np.inf, np.inf, -np.inf, np.nan, 2.0])
    got = _x_grad("celu_grad", {"x": x, "out_grad": g}, {"alpha": 0.01}, dtype)["x_grad"]
    np.testing.assert_allclose(got.astype(np.float64), [1.5, np.inf, np.inf, -np.inf, np.nan, 2.0],
                               rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_elu_celu_double_grad_large_x(dtype):
    """Paddle's x_grad = ddx·dout·α·exp(x)·[x ≤ 0] is inf·0 = NaN once exp(x) overflows (x > 88 in
    float32; at x = +inf too); it is 0 there, and grad_out_grad is ddx."""
    x = np.array([1000.0, 100.0, -1.0, np.inf])
    ins = {"x": x, "grad_out": np.array([2.0, 3.0, 4.0, 5.0]), "grad_x_grad": np.array([0.5, -1.0, 2.0, 6.0])}
    elu = _x_grad("elu_double_grad", ins, {"alpha": 1.0}, dtype)
    np.testing.assert_allclose(elu["x_grad"].astype(np.float64), [0, 0, 8 * np.exp(-1), 0], rtol=1e-6)
    np.testing.assert_allclose(elu["grad_out_grad"].astype(np.float64), [0.5, -1.0, 2 * np.exp(-1), 6],
                               rtol=1e-6)
    celu = _x_grad("celu_double_grad", ins, {"alpha": 0.5}, dtype)
    np.testing.assert_allclose(celu["x_grad"].astype(np.float64), [0, 0, 16 * np.exp(-2), 0], rtol=1e-6)
    np.testing.assert_allclose(celu["grad_out_grad"].astype(np.float64), [0.5, -1.0, 2 * np.exp(-2), 6],
                               rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softplus_double_grad_large_threshold(dtype):
    """With threshold above the overflow point Paddle's e^xb / (e^xb + 1)² is inf/inf = NaN for a
    large xb; the value is e^-xb / (1 + e^-xb)² → 0."""
    x = np.array([200.0, 1000.0, -1000.0, 0.0])
    ins = {"x": x, "grad_out": np.full(4, 2.0), "grad_x_grad": np.full(4, 3.0)}
    out = _x_grad("softplus_double_grad", ins, {"beta": 1.0, "threshold": 1e4}, dtype)
    np.testing.assert_allclose(out["x_grad"].astype(np.float64), [0, 0, 0, 1.5], atol=1e-30)
    np.testing.assert_allclose(out["grad_out_grad"].astype(np.float64), [3, 3, 0, 1.5])


# ------------------------------------------------------------------------------------------
# logit

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("eps", [1e-6, 0.1, 0.0])
def test_logit_grad(eps, dtype):
    """eps = 0 is Paddle's 'no clipping': NaN outside [0, 1]; otherwise 0 outside [eps, 1 − eps].
    Values exactly at 0, 1, eps, 1 − eps; outside the domain; ±inf and NaN."""
    x = rng(0).uniform(-0.5, 1.5, VALUES)
    flat = x.reshape(-1)
    flat[:10] = [0.0, 1.0, eps, 1 - eps, -0.0, -1e-3, 1.001, np.inf, -np.inf, np.nan]
    check("logit_grad", {"x": x, "out_grad": cotangent()}, {"eps": eps}, dtype)


def test_logit_grad_default_eps():
    x = np.array([0.0, 5e-7, 2e-6, 0.5, 1.0])
    out = check("logit_grad", {"x": x, "out_grad": np.ones(5)}, None, "float64")
    assert out["x_grad"][0] == 0 and out["x_grad"][1] == 0 and out["x_grad"][4] == 0


# ------------------------------------------------------------------------------------------
# prelu

def _alpha_shape(x_shape, mode, data_format):
    if mode == "all":
        return (1,)
    if mode == "channel":
        return (x_shape[1] if data_format == "NCHW" else x_shape[-1],)
    return (1,) + tuple(x_shape[1:])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode,data_format", [("all", "NCHW"), ("channel", "NCHW"), ("channel", "NHWC"),
                                              ("element", "NCHW"), ("element", "NHWC")])
@pytest.mark.parametrize("x_shape", [(2, 3), (2, 3, 5), (2, 3, 4, 5), (2, 3, 1, 2, 4)])
def test_prelu_grad(x_shape, mode, data_format, dtype):
    x = primal((0.0,), specials=False, shape=x_shape)
    alpha = rng(2).standard_normal(_alpha_shape(x_shape, mode, data_format))
    check("prelu_grad", {"x": x, "alpha": alpha, "out_grad": rng(3).standard_normal(x_shape)},
          {"data_format": data_format, "mode": mode}, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_prelu_grad_specials(dtype):
    """NaN x: x_grad = alpha·g, and alpha_grad sums x·g = NaN into its channel."""
    x = primal((0.0,), shape=(2, 4, 5))
    check("prelu_grad", {"x": x, "alpha": np.array([0.25, -1.0, 0.0, 2.0]), "out_grad": cotangent((2, 4, 5))},
          {"data_format": "NCHW", "mode": "channel"}, dtype)


def test_prelu_grad_default_attrs():
    check("prelu_grad", {"x": primal(shape=(3, 4)), "alpha": np.array([0.2]),
                         "out_grad": rng(3).standard_normal((3, 4))}, None, "float32")


@pytest.mark.parametrize("x_shape,alpha_shape,mode,data_format", [
    ((2, 3, 4), (), "all", "NCHW"),                 # 0-d alpha
    ((7,), (1,), "all", "NCHW"),                    # 1-d x
    ((2, 3, 4), (12,), "element", "NCHW"),          # flat alpha: only its size matters
    ((2, 3, 4), (3, 4), "element", "NHWC"),
    ((2, 3, 4), (3, 1), "channel", "NCHW"),
    ((2, 4, 3), (3,), "channel", "NLC"),            # Paddle's kernel: any format but NCHW is channel-last
])
def test_prelu_grad_alpha_layouts(x_shape, alpha_shape, mode, data_format):
    check("prelu_grad", {"x": primal((0.0,), specials=False, shape=x_shape),
                         "alpha": rng(2).standard_normal(alpha_shape),
                         "out_grad": rng(3).standard_normal(x_shape)},
          {"data_format": data_format, "mode": mode}, "float64")


@pytest.mark.parametrize("x_shape,alpha_shape,mode", [
    ((2, 3, 4), (1,), "channel"), ((2, 3, 4), (5,), "channel"), ((2, 3, 4), (3,), "element"),
    ((2, 3, 4), (2,), "all"), ((5,), (5,), "channel"),
])
def test_prelu_grad_bad_alpha(x_shape, alpha_shape, mode):
    """An alpha whose size does not match the mode is refused (not read or written out of bounds)."""
    x = np.ones(x_shape, np.float32)
    with pytest.raises(OpError, match="prelu_grad"):
        tvmgrad.run("prelu_grad", {"x": x, "alpha": np.ones(alpha_shape, np.float32), "out_grad": x},
                    {"mode": mode})


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode", ["all", "channel", "element"])
def test_prelu_grad_empty(mode, dtype):
    """No elements: alpha_grad is all zeros (Paddle fills it), even in a buffer holding garbage."""
    x = np.zeros((0, 3, 2))
    alpha = np.full(_alpha_shape(x.shape, mode, "NCHW"), 0.5)
    out = check("prelu_grad", {"x": x, "alpha": alpha, "out_grad": x}, {"mode": mode}, dtype)
    assert out["x_grad"].shape == (0, 3, 2)
    xs, al = cast(x, dtype), cast(alpha, dtype)
    garbage = np.full(al.shape, 7.0).astype(al.dtype)
    launch = tvmgrad.prepare("prelu_grad", {"x": xs, "alpha": al, "out_grad": xs}, {"mode": mode})
    assert not np.any(launch(out={"alpha_grad": garbage})["alpha_grad"].astype(np.float32))


# ------------------------------------------------------------------------------------------
# swiglu

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(5, 8), (3, 1, 4), (6,), (2, 0, 4)])
def test_swiglu_grad(shape, dtype):
    x, y = primal(shape=shape), primal(shape=shape, seed=5)
    check("swiglu_grad", {"x": x, "y": y, "out_grad": cotangent(shape)}, None, dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(5, 8), (3, 1, 6), (2,), (4, 0), (0, 6)])
def test_swiglu_grad_packed(shape, dtype):
    """Without y, x = [a, b] along its last axis; y_grad is not produced."""
    g_shape = shape[:-1] + (shape[-1] // 2,)
    x = primal(shape=shape)
    out = check("swiglu_grad", {"x": x, "y": None, "out_grad": cotangent(g_shape)}, None, dtype,
                outputs=["x_grad"])
    assert out["y_grad"] is None


def test_swiglu_grad_bad_shapes():
    x = np.ones((3, 4), np.float32)
    with pytest.raises((OpError, ValueError), match="even"):
        tvmgrad.run("swiglu_grad", {"x": np.ones((3, 5), np.float32), "y": None,
                                    "out_grad": np.ones((3, 2), np.float32)})
    with pytest.raises((OpError, ValueError), match="y has shape"):
        tvmgrad.run("swiglu_grad", {"x": x, "y": np.ones((1, 4), np.float32), "out_grad": x})
    with pytest.raises((OpError, ValueError), match="out_grad"):
        tvmgrad.run("swiglu_grad", {"x": x, "y": None, "out_grad": x})


# ------------------------------------------------------------------------------------------
# Double and triple grads (Paddle's own kernels through autograd)

def _extra_grad_out(inputs, attrs):
    ref = inputs["grad_x_grad"]
    return {"grad_out": rng(9).standard_normal(ref.shape).astype(ref.dtype)}


def _extra_elu_out(inputs, attrs):
    x = inputs["x"].astype(np.float64)
    return {"out": elu(x, attrs["alpha"]).astype(inputs["x"].dtype)}


# Paddle's autograd fills an absent cotangent with zeros, which Paddle's kernel then multiplies
# (0·inf = NaN); our kernel (like Paddle's when the input is really absent) leaves the term out.
# So the absent-cotangent cases compare on finite cotangents and a finite `out`.
ABSENT = {"x_specials": (0.0, np.inf, -np.inf), "g_specials": ()}
# name -> (op, inputs as a function of (primal x, cotangents g1..g4), attrs, kinks, extra[, options])
HIGHER_ORDER = {
    "relu_double": ("relu_double_grad", lambda x, g: {"out": np.maximum(x, 0), "grad_x_grad": g[0]},
                    {}, (0.0,), _extra_grad_out),
    "leaky_relu_double": ("leaky_relu_double_grad", lambda x, g: {"x": x, "grad_x_grad": g[0]},
                          {"negative_slope": 0.1}, (0.0,), _extra_grad_out),
    "elu_double": ("elu_double_grad", lambda x, g: {"x": x, "grad_out": g[1], "grad_x_grad": g[0]},
                   {"alpha": 0.7}, (0.0,), _extra_elu_out, {"x_specials": NO_POS_INF}),
    "elu_double_neg": ("elu_double_grad", lambda x, g: {"x": x, "grad_out": g[1], "grad_x_grad": g[0]},
                       {"alpha": -0.4}, (0.0,), _extra_elu_out, {"x_specials": NO_POS_INF}),
    "celu_double": ("celu_double_grad", lambda x, g: {"x": x, "grad_out": g[1], "grad_x_grad": g[0]},
                    {"alpha": 0.7}, (0.0,), None, {"x_specials": NO_POS_INF}),
    "silu_double": ("silu_double_grad", lambda x, g: {"x": x, "out": np_silu(x), "grad_out": g[1],
                                                      "grad_x_grad": g[0]}, {}, (0.0,), None),
    "sigmoid_double": ("sigmoid_double_grad", lambda x, g: {"out": np_sigmoid(x), "fwd_grad_out": g[1],
                                                            "grad_x_grad": g[0]}, {}, (0.0,), None),
    "sigmoid_triple": ("sigmoid_triple_grad", lambda x, g: {
        "out": np_sigmoid(x), "fwd_grad_out": g[1], "grad_grad_x": g[0], "grad_out_grad": g[2],
        "grad_grad_out_grad": g[3]}, {}, (0.0,), None),
    "sigmoid_triple_no_ddout": ("sigmoid_triple_grad", lambda x, g: {
        "out": np_sigmoid(x), "fwd_grad_out": g[1], "grad_grad_x": g[0], "grad_out_grad": g[2],
        "grad_grad_out_grad": None}, {}, (0.0,), None, ABSENT),
    "softplus_double": ("softplus_double_grad", lambda x, g: {"x": x, "grad_out": g[1], "grad_x_grad": g[0]},
                        {"beta": 1.0, "threshold": 20.0}, (0.0,), None),
    "softplus_double_attrs": ("softplus_double_grad", lambda x, g: {"x": x, "grad_out": g[1],
                                                                    "grad_x_grad": g[0]},
                              {"beta": 2.0, "threshold": 3.0}, (1.5,), None),
    # beta, threshold not float32-representable: the double-grad kernel takes them as double
    "softplus_double_inexact": ("softplus_double_grad", lambda x, g: {"x": x, "grad_out": g[1],
                                                                      "grad_x_grad": g[0]},
                                {"beta": 1.3, "threshold": 3.3}, (0.0,), None),
    "tanh_double": ("tanh_double_grad", lambda x, g: {"out": np.tanh(x), "grad_out": g[1], "grad_x_grad": g[0]},
                    {}, (0.0,), None),
    "tanh_triple": ("tanh_triple_grad", lambda x, g: {
        "out": np.tanh(x), "grad_out_forward": g[1], "grad_x_grad_forward": g[0],
        "grad_out_new_grad": g[2], "grad_out_grad_grad": g[3]}, {}, (0.0,), None),
    "tanh_triple_no_dout_new": ("tanh_triple_grad", lambda x, g: {
        "out": np.tanh(x), "grad_out_forward": g[1], "grad_x_grad_forward": g[0],
        "grad_out_new_grad": None, "grad_out_grad_grad": g[3]}, {}, (0.0,), None, ABSENT),
    "tanh_triple_no_ddout": ("tanh_triple_grad", lambda x, g: {
        "out": np.tanh(x), "grad_out_forward": g[1], "grad_x_grad_forward": g[0],
        "grad_out_new_grad": g[2], "grad_out_grad_grad": None}, {}, (0.0,), None, ABSENT),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", sorted(HIGHER_ORDER))
@pytest.mark.sweep
def test_higher_order_values(case, dtype):
    op, make, attrs, kinks, extra, *opts = HIGHER_ORDER[case]
    opts = opts[0] if opts else {}
    gs = [cotangent(seed=s, specials=opts.get("g_specials", True)) for s in (1, 2, 3, 4)]
    check(op, make(primal(kinks, specials=opts.get("x_specials", True)), gs), attrs, dtype,
          oracle=autograd_oracle(op, extra))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", ["elu_double", "sigmoid_triple", "tanh_triple_no_ddout", "silu_double"])
def test_higher_order_shapes(case, shape):
    op, make, attrs, kinks, extra, *_ = HIGHER_ORDER[case]
    gs = [cotangent(shape, seed=s, specials=False) for s in (1, 2, 3, 4)]
    check(op, make(primal(kinks, specials=False, shape=shape), gs), attrs, "float32",
          oracle=autograd_oracle(op, extra))


def test_tanh_triple_grad_no_optional_cotangents():
    """Both optional cotangents absent: Paddle writes 0·out and 0·ddx (NaN where those are inf/NaN)."""
    out = np.array([0.5, np.nan, np.inf, -0.25])
    ddx = np.array([1.0, 2.0, 3.0, np.nan])
    got = tvmgrad.run("tanh_triple_grad", {"out": out, "grad_out_forward": np.ones(4),
                                           "grad_x_grad_forward": ddx, "grad_out_new_grad": None,
                                           "grad_out_grad_grad": None})
    np.testing.assert_array_equal(got["out_grad"], [0, np.nan, np.nan, 0])
    np.testing.assert_array_equal(got["grad_out_forward_grad"], [0, np.nan, np.nan, 0])
    np.testing.assert_array_equal(got["grad_x_grad_forward_grad"], [0, 0, 0, np.nan])


@pytest.mark.parametrize("op,inputs", [
    ("sigmoid_double_grad", {"out": (3, 4), "fwd_grad_out": (1, 4), "grad_x_grad": (3, 4)}),
    ("sigmoid_triple_grad", {"out": (3, 4), "fwd_grad_out": (3, 4), "grad_grad_x": (4,),
                             "grad_out_grad": (3, 4), "grad_grad_out_grad": None}),
    ("tanh_triple_grad", {"out": (3, 4), "grad_out_forward": (3, 4), "grad_x_grad_forward": (3, 1),
                          "grad_out_new_grad": (3, 4), "grad_out_grad_grad": (3, 4)}),
    ("relu_grad", {"out": (3, 4), "out_grad": (4,)}),
])
def test_no_broadcasting(op, inputs):
    """Paddle's activation kernels are elementwise over equal shapes; they never broadcast."""
    arrays = {k: None if s is None else np.ones(s, np.float32) for k, s in inputs.items()}
    with pytest.raises((OpError, ValueError)):
        tvmgrad.run(op, arrays)


@pytest.mark.parametrize("op,inputs", [
    ("sigmoid_triple_grad", {"out": np_sigmoid(primal(specials=False)), "fwd_grad_out": cotangent(seed=1),
                             "grad_grad_x": cotangent(seed=2), "grad_out_grad": cotangent(seed=3),
                             "grad_grad_out_grad": cotangent(seed=4)}),
    ("tanh_double_grad", {"out": np.tanh(primal()), "grad_out": cotangent(seed=1),
                          "grad_x_grad": cotangent(seed=2)}),
    ("elu_double_grad", {"x": primal(), "grad_out": cotangent(seed=1), "grad_x_grad": cotangent(seed=2)}),
    ("relu_grad", {"out": np.maximum(primal(), 0), "out_grad": cotangent()}),
])
def test_inplace_matches(op, inputs):
    """The YAML inplace pairs (e.g. grad_grad_x -> fwd_grad_out_grad): writing an output over an
    input that other outputs still read gives the same results."""
    attrs = {"alpha": 0.5} if op == "elu_double_grad" else None
    want = tvmgrad.run(op, {k: v.copy() for k, v in inputs.items()}, attrs)
    arrays = {k: v.copy() for k, v in inputs.items()}
    got = tvmgrad.run(op, arrays, attrs, inplace=True)
    for src, dst in load_specs()[op].inplace:
        assert got[dst] is arrays[src]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
