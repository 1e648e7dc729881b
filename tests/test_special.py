"""Special-function grads against Paddle 3.3.1 (te_defs/special.py, te_defs/_special.py).

Where Paddle 3.3.1 is numerically wrong the oracle is a correct value computed with Paddle
itself (each place says why):

* digamma_grad, float32 (and the half types, which Paddle's GPU kernels compute in float32):
  Eigen's float ζ(2, x) stops after 9 direct terms, so for x < -7 it runs Euler–Maclaurin from a
  point below 2 (or a negative one) and returns garbage: ψ′(-8.257) = -1.4e8 (true 18.8),
  ψ′(-8.793) = inf (true 26.9), ψ′(-9.5) = 2.85e12 (true 9.77), ψ′(-20.5) = -0.048 (true 9.82).
  Oracle there: Paddle in float64, rounded.
* polygamma_grad for negative x: Paddle sums ζ(n+2, x) term by term from x up to 9, so the
  ±2^(n+2)-sized terms around the poles cancel: float64 ψ⁽⁴⁾(-1000.5) = -6.018e-12 (true
  -5.976e-12); float32 loses digits already on (-10, 0) (ψ⁽⁶⁾(-6.5) = 3.99e-3, true -9.85e-4)
  and is wrong by factors further out. Oracles: float64 Paddle on (-10, 0); beyond, the
  reflection formula
  ψ⁽ᵐ⁾(x) = (-1)^m ψ⁽ᵐ⁾(1-x) - π^(m+1) cot⁽ᵐ⁾(πx) with ψ⁽ᵐ⁾(1-x) from Paddle (float64).
* gammaln_grad next to negative poles: Paddle's own digamma evaluates tan(π·frac(x)) without
  reducing about the nearest integer, so ψ(-1+1e-9) is off by 1e-7 relative (lgamma_grad, through
  Eigen, is right). Oracle there: Paddle's lgamma_grad.
"""

import numpy as np
import pytest

from harness import FLOATS, c_ops, cast, check, rng

HALF = ("float16", "bfloat16")


def gamma_points(seed=0, lo=-30.0):
    """Arguments for ψ-type grads: random spread, near 0, large, half-integers, near poles,
    the root of ψ, signed zeros, poles, ±inf, NaN."""
    r = rng(seed)
    return np.concatenate([
        r.uniform(lo, 30, 60), r.uniform(0, 3, 20), 10.0 ** r.uniform(-8, 8, 20),
        [0.0, -0.0, 1.0, 2.0, 0.5, 9.99, 10.0, 1.4616321449683622, 1e-30, 1e30,
         -0.5, -1.5, -2.5, -1.0, -2.0, -7.0, -1 + 1e-6, -2 - 1e-5, -3 + 0.25,
         np.inf, -np.inf, np.nan],
    ])


def with_grad(x, seed=1):
    g = rng(seed).standard_normal(np.shape(x))
    return g


def f64_oracle(op):
    """Paddle in float64 on the (already rounded) inputs, cast back to their dtype."""
    def oracle(inputs, attrs):
        dt = next(v.dtype for v in inputs.values())
        out = c_ops(op, {k: np.asarray(v, np.float64) for k, v in inputs.items()}, attrs)
        return {k: v.astype(dt) for k, v in out.items()}
    return oracle


# ---------------------------------------------------------------------------------------------
# ψ, ψ′: lgamma_grad, gammaln_grad, digamma_grad

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["lgamma_grad", "gammaln_grad"])
def test_digamma_family(op, dtype):
    x = gamma_points()
    x = x[~((x > -1.001) & (x < -0.999) & (op == "gammaln_grad"))]   # see near-pole test
    check(op, {"x": x, "out_grad": with_grad(x)}, dtype=dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gammaln_grad_near_poles(dtype):
    # Paddle's gammaln_grad loses ~1e-7 relative here; lgamma_grad (Eigen) is accurate
    x = np.array([-1 + 1e-9, -1 - 1e-9, -2 + 1e-7, -3 - 1e-8, -10 + 1e-6, -0.999999, 1e-9])
    oracle = lambda inputs, attrs: {"x_grad": c_ops("lgamma_grad", inputs, attrs)["x_grad"]}
    check("gammaln_grad", {"x": x, "out_grad": with_grad(x)}, dtype=dtype, oracle=oracle)


@pytest.mark.parametrize("dtype", FLOATS)
def test_digamma_grad(dtype):
    x = gamma_points(lo=-6.99)
    check("digamma_grad", {"x": x, "out_grad": with_grad(x)}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_digamma_grad_very_negative(dtype):
    # float32 Paddle (Eigen's float zeta) is wrong below -7: compare with float64 Paddle
    x = np.concatenate([rng(3).uniform(-60, -7, 30),
                        [-8.257075, -8.793472, -9.5, -10.5, -20.5, -25.9986, -100.25]])
    oracle = None if dtype == "float64" else f64_oracle("digamma_grad")
    check("digamma_grad", {"x": x, "out_grad": with_grad(x)}, dtype=dtype, oracle=oracle)


# ---------------------------------------------------------------------------------------------
# ψ⁽ⁿ⁺¹⁾: polygamma_grad

def cot_derivative(m, c):
    """dᵐ/dyᵐ cot y as a polynomial in c = cot y (P₀ = c, P_{k+1} = -(1+c²)·P_k′)."""
    p = np.polynomial.Polynomial([0.0, 1.0])
    for _ in range(m):
        p = -np.polynomial.Polynomial([1.0, 0.0, 1.0]) * p.deriv()
    return p(c)


def reflection_oracle(inputs, attrs):
    """ψ⁽ᵐ⁾(x) = (-1)^m ψ⁽ᵐ⁾(1-x) - π^(m+1) cot⁽ᵐ⁾(πx), m = n+1, with ψ⁽ᵐ⁾(1-x) from Paddle."""
    x = np.asarray(inputs["x"], np.float64)
    g = np.asarray(inputs["out_grad"], np.float64)
    n = attrs["n"]
    m = n + 1
    pos = c_ops("polygamma_grad", {"x": 1.0 - x, "out_grad": np.ones_like(x)}, {"n": n})["x_grad"]
    r = x - np.round(x)
    pole = r == 0                       # (rounded half inputs); Paddle's ζ gives +inf there
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(np.abs(r) == 0.5, 0.0, 1.0 / np.tan(np.pi * r))
        val = (-1.0) ** m * pos - np.pi ** (m + 1) * cot_derivative(m, c)
    val = np.where(pole, (-1.0) ** (m + 1) * np.inf, val)
    return {"x_grad": (g * val).astype(inputs["x"].dtype)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_polygamma_grad(n, dtype):
    x = gamma_points(lo=0.0)
    x = x[~(x < 0) | (x == np.floor(x))]           # negative non-integers: next test
    check("polygamma_grad", {"x": x, "out_grad": with_grad(x)}, {"n": n}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_polygamma_grad_negative(n, dtype):
    # float32 Paddle sums ζ(n+2, x) term by term and loses digits to cancellation at negative
    # x (ψ⁽⁶⁾(-6.5): Paddle 3.99e-3, true -9.85e-4): float32 and the half types compare with
    # float64 Paddle, which is accurate on (-10, 0)
    r = rng(12)
    x = np.concatenate([r.uniform(-9.9, 0, 40), [-0.5, -1.5, -2.5, -6.5, -0.25, -4.75, -1.0,
                                                 -3.0, -1 + 1e-6, -2 - 1e-5]])
    # float64 Paddle itself keeps only ~1e-8 of ψ⁽⁶⁾(-6.5) (terms up to 2⁷·6! cancel): from
    # n = 5 on, float64 compares with the reflection oracle
    oracle = f64_oracle("polygamma_grad") if dtype != "float64" else (
        reflection_oracle if n >= 5 else None)
    check("polygamma_grad", {"x": x, "out_grad": with_grad(x)}, {"n": n}, dtype=dtype,
          oracle=oracle)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("n", [0, 1, 3])
def test_polygamma_grad_very_negative(n, dtype):
    x = np.concatenate([rng(4).uniform(-200, -10, 20), [-1000.5, -123.25, -10.5, -55.75]])
    check("polygamma_grad", {"x": x, "out_grad": with_grad(x)}, {"n": n}, dtype=dtype,
          oracle=reflection_oracle)


def test_polygamma_grad_rejects_negative_order():
    import tvmgrad
    # Paddle's binding takes n = -1 (giving -inf everywhere); the op's order must be >= 0
    with pytest.raises(Exception):
        tvmgrad.run("polygamma_grad", {"x": np.ones(3), "out_grad": np.ones(3)}, {"n": -1})


def test_polygamma_grad_matches_digamma_grad():
    import tvmgrad
    x = gamma_points()
    g = with_grad(x)
    a = tvmgrad.run("polygamma_grad", {"x": x, "out_grad": g}, {"n": 0})["x_grad"]
    b = tvmgrad.run("digamma_grad", {"x": x, "out_grad": g})["x_grad"]
    np.testing.assert_allclose(a, b, rtol=1e-14, atol=0, equal_nan=True)


# ---------------------------------------------------------------------------------------------
# gammaincc_grad (x: the shape a > 0, y: the argument), erfinv_grad

def gammaincc_points():
    r = rng(6)
    a = np.concatenate([r.uniform(0.05, 20, 40), 10 ** r.uniform(-3, 2, 20),
                        [1.0, 0.5, 3.0, 1.0, 171.0, 172.0, 35.5, 1e-5, 2.0, 1.0, 1.0, np.nan, 5.0,
                         1.0]])
    y = np.concatenate([r.uniform(0, 30, 40), 10 ** r.uniform(-3, 2.5, 20),
                        [0.0, 0.0, 0.0, 1e-300, 40.0, 1.0, 20.0, 1.0, 750.0, np.inf, -1.0, 1.0,
                         np.nan, 700.0]])
    return a, y


@pytest.mark.parametrize("dtype", FLOATS)
def test_gammaincc_grad(dtype):
    a, y = gammaincc_points()
    ours = check("gammaincc_grad", {"x": a, "y": y, "out_grad": with_grad(a)}, dtype=dtype)
    assert ours["y_grad"].shape == a.shape


def test_gammaincc_grad_does_not_broadcast():
    import tvmgrad
    with pytest.raises(Exception):
        tvmgrad.run("gammaincc_grad", {"x": np.ones((3,)), "y": np.ones((2, 3)),
                                       "out_grad": np.ones((2, 3))})


@pytest.mark.parametrize("dtype", FLOATS)
def test_erfinv_grad(dtype):
    out = np.concatenate([rng(8).uniform(-3, 3, 40),
                          [0.0, -0.0, 4.0, -5.0, 9.3, 26.0, 27.0, -27.0, np.inf, -np.inf, np.nan]])
    g = with_grad(out)
    g[:3] = [0.0, np.inf, np.nan]
    check("erfinv_grad", {"out": out, "out_grad": g}, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Modified Bessel I0, I1 (and their exponentially scaled forms)

def bessel_points():
    return np.concatenate([
        rng(9).uniform(-30, 30, 60), rng(10).uniform(-9, 9, 30),
        [0.0, -0.0, 8.0, -8.0, 8.000001, 7.999999, 1e-30, -1e-30, 1e-7, 1.2e-7, 2.2e-16,
         -2.2e-16, 3e-16, 0.5, 85.0, 700.0, -710.0, 1e5, 1e300, np.inf, -np.inf, np.nan],
    ])


def forward(op, x):
    """Paddle's forward output (float64) for the grads that take ``out``."""
    import paddle
    with np.errstate(all="ignore"):
        return getattr(paddle._C_ops, op)(paddle.to_tensor(np.asarray(x, np.float64))).numpy()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["i0_grad", "i0e_grad", "i1_grad", "i1e_grad"])
def test_bessel_grads(op, dtype):
    x = bessel_points()
    inputs = {"x": x, "out_grad": with_grad(x)}
    if op != "i0_grad":
        # out as the forward gives it in this dtype (forward of the rounded x, rounded)
        xr = cast(x, dtype).astype(np.float64)
        inputs["out"] = forward(op[:-len("_grad")], xr)
    check(op, inputs, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# shapes: rank 0, size-1 dims, empty

@pytest.mark.parametrize("shape", [(), (3, 1, 5), (2, 0, 3)])
@pytest.mark.parametrize("op", ["lgamma_grad", "digamma_grad", "i1_grad", "gammaincc_grad",
                                "erfinv_grad", "polygamma_grad"])
def test_special_shapes(op, shape):
    r = rng(11)
    x = r.uniform(0.5, 6, shape)
    inputs = {"x": x, "out_grad": r.standard_normal(shape)}
    if op == "i1_grad":
        inputs["out"] = forward("i1", x)
    if op == "gammaincc_grad":
        inputs["y"] = r.uniform(0, 5, shape)
    if op == "erfinv_grad":
        inputs = {"out": x - 3.0, "out_grad": inputs["out_grad"]}
    attrs = {"n": 2} if op == "polygamma_grad" else None
    for dtype in ("float32", "float64"):
        ours = check(op, inputs, attrs, dtype=dtype)
        assert next(iter(ours.values())).shape == shape
