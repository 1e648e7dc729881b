"""Scan grads against Paddle 3.3.1 (te_defs/scan.py): cumsum, logcumsumexp, cumprod (a blocked
parallel scan: chunks of about sqrt(n), their carries, a rescan) and cummax/cummin (scatters of
out_grad into the forward's indices).

Long axes walk many chunks and carries; short and empty ones none; every direction/exclusive
combination and dtype is compared with Paddle, cumsum also by its adjoint identity.
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, cast, check, from_paddle, rng, to_paddle

COMBOS = [(False, False), (True, False), (False, True), (True, True)]   # (exclusive, reverse)


def normal(*shape, seed=0):
    return rng(seed).standard_normal(shape)


def run(op, inputs, attrs=None, dtype="float64", **options):
    return tvmgrad.run(op, {k: cast(v, dtype) for k, v in inputs.items()}, attrs, **options)


def _paddle():
    import paddle
    return paddle


# ------------------------------------------------------------------------------------------
# cumsum

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("exclusive,reverse", COMBOS)
def test_cumsum_dtypes(exclusive, reverse, dtype):
    attrs = {"axis": 1, "flatten": False, "exclusive": exclusive, "reverse": reverse}
    check("cumsum_grad", {"x": normal(3, 37, 2), "out_grad": normal(3, 37, 2, seed=1)}, attrs, dtype)


CUMSUM_SHAPES = [((5,), 0), ((4, 6), -1), ((4, 6), 0), ((2, 3, 4), 1), ((1, 1), 1), ((3, 0), 1),
                 ((0, 4), -1), ((), 0)]


@pytest.mark.parametrize("shape,axis", CUMSUM_SHAPES)
def test_cumsum_shapes(shape, axis):
    attrs = {"axis": axis, "flatten": False, "exclusive": True, "reverse": False}
    inputs = {"x": normal(*shape), "out_grad": normal(*shape, seed=1)}
    if int(np.prod(shape)) != 1:
        check("cumsum_grad", inputs, attrs)
        return
    # Paddle 3.3.1's cumsum (and its grad) copies a one-element tensor even when exclusive; the
    # exclusive sum of nothing is 0 (what cumsum_grad gives for any longer axis)
    got = run("cumsum_grad", inputs, attrs)["x_grad"]
    np.testing.assert_array_equal(got, np.zeros(shape))


@pytest.mark.parametrize("exclusive,reverse", COMBOS)
def test_cumsum_flatten(exclusive, reverse):
    attrs = {"axis": 0, "flatten": True, "exclusive": exclusive, "reverse": reverse}
    check("cumsum_grad", {"x": normal(3, 4, 5), "out_grad": normal(60, seed=1)}, attrs)


def _cumsum(a, axis, exclusive, reverse):
    a = np.flip(a, axis) if reverse else a
    out = np.cumsum(a, axis=axis)
    if exclusive:
        out = out - a
    return np.flip(out, axis) if reverse else out


@pytest.mark.parametrize("exclusive,reverse", COMBOS)
def test_cumsum_long_axis_adjoint(exclusive, reverse):
    """A long row (about sqrt(n) chunks and carries) in float64: <cumsum x, y> = <x, cumsum_grad y>."""
    n = 100003
    x, y = normal(2, n), normal(2, n, seed=1)
    attrs = {"axis": 1, "flatten": False, "exclusive": exclusive, "reverse": reverse}
    got = run("cumsum_grad", {"x": x, "out_grad": y}, attrs)["x_grad"]
    lhs, rhs = float(np.sum(_cumsum(x, 1, exclusive, reverse) * y)), float(np.sum(x * got))
    assert abs(lhs - rhs) <= 1e-9 * (1 + abs(lhs))
    np.testing.assert_allclose(got, _cumsum(y, 1, exclusive, not reverse), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n", [31, 32, 33, 1023, 1024, 1025, 4097])
def test_cumsum_chunk_boundaries(n):
    """Lengths around the chunk sizes (32 minimum, ceil(sqrt(n)) beyond), one row and many."""
    attrs = {"axis": -1, "flatten": False, "exclusive": False, "reverse": False}
    g = np.ones((3, n))
    got = run("cumsum_grad", {"x": g, "out_grad": g}, attrs)["x_grad"]
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(n, 0, -1), (3, n)))


def test_cumsum_float32_long():
    n = 65537
    g = normal(n).astype("float32")
    attrs = {"axis": 0, "flatten": False, "exclusive": False, "reverse": True}
    got = run("cumsum_grad", {"x": g, "out_grad": g}, attrs, "float32")["x_grad"]
    np.testing.assert_allclose(got, np.cumsum(g.astype("float64")), rtol=1e-4, atol=2e-3)


def test_cumsum_bad_input():
    with pytest.raises(ValueError, match=r"cumsum_grad: out_grad has shape \[3\], expected x's \[4\]"):
        run("cumsum_grad", {"x": normal(4), "out_grad": normal(3)}, {"axis": 0})
    with pytest.raises(ValueError, match=r"cumsum_grad: attribute 'axis' = 2 is out of range"):
        run("cumsum_grad", {"x": normal(4, 3), "out_grad": normal(4, 3)}, {"axis": 2})


# ------------------------------------------------------------------------------------------
# logcumsumexp

def _logcumsumexp_inputs(x, axis, exclusive, reverse, seed=1, flatten=False):
    paddle = _paddle()
    out = paddle._C_ops.logcumsumexp(to_paddle(x), axis, flatten, exclusive, reverse).numpy()
    return {"x": x, "out": out, "out_grad": normal(*out.shape, seed=seed)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("exclusive,reverse", COMBOS)
def test_logcumsumexp_dtypes(exclusive, reverse, dtype):
    x = normal(3, 41) * 3
    attrs = {"axis": 1, "flatten": False, "exclusive": exclusive, "reverse": reverse}
    inputs = _logcumsumexp_inputs(cast(x, dtype).astype("float64"), 1, exclusive, reverse)
    check("logcumsumexp_grad", inputs, attrs, dtype, rtol=None if dtype != "float32" else 1e-4,
          atol=None if dtype != "float32" else 1e-5)


def test_logcumsumexp_extremes():
    """Huge and tiny magnitudes (the two-sided log formulation keeps them finite), zero grads."""
    x = np.array([[1e3, -1e3, 500.0, 0.0, -50.0, 700.0], [-1e4, -1e4, -1e4, 3.0, 2.0, 1.0]])
    for exclusive, reverse in COMBOS:
        inputs = _logcumsumexp_inputs(x, 1, exclusive, reverse)
        inputs["out_grad"][0, 1] = 0.0
        attrs = {"axis": 1, "flatten": False, "exclusive": exclusive, "reverse": reverse}
        got = check("logcumsumexp_grad", inputs, attrs)
        assert np.isfinite(got["x_grad"]).all()


@pytest.mark.parametrize("shape,axis,flatten", [((2, 3, 4), 0, False), ((2, 3, 4), -2, False),
                                                ((5,), 0, False), ((2, 3, 4), 0, True),
                                                ((3, 0), 1, False)])
def test_logcumsumexp_shapes(shape, axis, flatten):
    inputs = _logcumsumexp_inputs(normal(*shape), axis, False, False, flatten=flatten)
    check("logcumsumexp_grad", inputs, {"axis": axis, "flatten": flatten, "exclusive": False,
                                        "reverse": False})


def test_logcumsumexp_long():
    x = normal(2, 5000)
    inputs = _logcumsumexp_inputs(x, 1, False, True)
    check("logcumsumexp_grad", inputs, {"axis": 1, "flatten": False, "exclusive": False,
                                        "reverse": True}, "float64", rtol=1e-9)


# ------------------------------------------------------------------------------------------
# cumprod

def cumprod_oracle(inputs, attrs):
    """Paddle 3.3.1's binding is cumprod_grad(x, out, out_grad, dim, exclusive, reverse): called
    with the YAML's four args it segfaults; exclusive = reverse = False."""
    paddle = _paddle()
    r = paddle._C_ops.cumprod_grad(to_paddle(inputs["x"]), to_paddle(inputs["out"]),
                                   to_paddle(inputs["out_grad"]), attrs["dim"], False, False)
    return {"x_grad": from_paddle(r)}


def _cumprod_inputs(x, dim, seed=1):
    x = np.asarray(x, dtype="float64")
    out = np.cumprod(x, axis=dim) if x.ndim else x
    return {"x": x, "out": out, "out_grad": normal(*x.shape, seed=seed)}


@pytest.mark.parametrize("dtype", FLOATS)
def test_cumprod_dtypes(dtype):
    x = rng(0).uniform(0.5, 1.5, (3, 40))
    x[0, 5] = 0.0                       # one zero
    x[1, 3] = x[1, 30] = 0.0            # two zeros
    inputs = _cumprod_inputs(cast(x, dtype).astype("float64"), 1)
    check("cumprod_grad", inputs, {"dim": 1}, dtype, oracle=cumprod_oracle)


@pytest.mark.parametrize("where", [[0], [-1], [0, -1], [2, 3], []])
def test_cumprod_zeros(where):
    """Zeros anywhere: Paddle's grad is the exact product formula (no division by x)."""
    x = normal(2, 9)
    for w in where:
        x[:, w] = 0.0
    check("cumprod_grad", _cumprod_inputs(x, 1), {"dim": 1}, oracle=cumprod_oracle)


@pytest.mark.parametrize("shape,dim", [((2, 3, 4), 0), ((2, 3, 4), -2), ((5,), 0), ((1, 1), 1),
                                       ((), 0), ((0, 3), 1)])
def test_cumprod_shapes(shape, dim):
    check("cumprod_grad", _cumprod_inputs(normal(*shape), dim), {"dim": dim}, oracle=cumprod_oracle)


def test_cumprod_long():
    """A long row, values near 1 so that the products stay finite; the reference is the product
    formula in float64 (Paddle's CPU kernel is O(n^2) here)."""
    n = 3000
    x = rng(3).uniform(0.999, 1.001, n)
    x[1234] = 0.0
    inputs = _cumprod_inputs(x, 0)
    got = run("cumprod_grad", inputs, {"dim": 0})["x_grad"]
    g, out = inputs["out_grad"], inputs["out"]
    r = np.zeros(n)
    acc = 0.0
    for j in range(n - 1, -1, -1):
        acc = g[j] + (x[j + 1] * acc if j + 1 < n else 0.0)
        r[j] = acc
    want = np.concatenate([[1.0], out[:-1]]) * r
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------
# cummax / cummin

def _cum_inputs(op, x, axis):
    paddle = _paddle()
    fwd = paddle._C_ops.cummax if op == "cummax_grad" else paddle._C_ops.cummin
    _, idx = fwd(to_paddle(x), axis, "int64")
    return {"x": x, "indices": idx.numpy(), "out_grad": normal(*x.shape, seed=2)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["cummax_grad", "cummin_grad"])
def test_cummax_cummin_dtypes(op, dtype):
    x = np.round(normal(4, 9) * 2)                    # ties: the forward keeps the latest index
    check(op, _cum_inputs(op, x, 1), {"axis": 1, "dtype": "int64"}, dtype)


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), 0), ((2, 3, 4), -2), ((7,), 0), ((1, 1), -1)])
@pytest.mark.parametrize("op", ["cummax_grad", "cummin_grad"])
def test_cummax_cummin_shapes(op, shape, axis):
    x = np.round(normal(*shape))
    check(op, _cum_inputs(op, x, axis), {"axis": axis, "dtype": "int64"})


@pytest.mark.parametrize("op", ["cummax_grad", "cummin_grad"])
def test_cummax_cummin_atomic_and_errors(op):
    inputs = _cum_inputs(op, np.round(normal(3, 50)), 1)
    det = run(op, inputs, {"axis": 1, "dtype": "int64"}, "float32")["x_grad"]
    racy = run(op, inputs, {"axis": 1, "dtype": "int64"}, "float32", deterministic=False)["x_grad"]
    np.testing.assert_allclose(racy, det, rtol=1e-5, atol=1e-6)
    check(op, dict(inputs, indices=inputs["indices"].astype("int32")),
          {"axis": 1, "dtype": "int32"})
    # Paddle 3.3.1 writes outside x_grad for a negative index; rejected here
    bad = dict(inputs, indices=inputs["indices"] - 1)
    with pytest.raises(ValueError, match=rf"{op}: input 'indices' holds -1"):
        run(op, bad, {"axis": 1, "dtype": "int64"})
    with pytest.raises(ValueError, match=rf"{op}: indices has shape \[3, 49\], expected x's"):
        run(op, dict(inputs, indices=inputs["indices"][:, 1:]), {"axis": 1, "dtype": "int64"})
