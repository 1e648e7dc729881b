"""Broadcasting binary grads against Paddle 3.3.1 (te_defs/binary.py).

Paddle bindings probed in throwaway subprocesses with broadcasting x/y (and weight for lerp):
copysign_grad, fmax_grad, fmin_grad, heaviside_grad and lerp_grad reduce correctly;
``_C_ops.atan2_grad`` does not broadcast at all (its CPU kernel indexes y with x's flat index:
wrong values, then heap corruption / abort), so its oracle is Paddle on inputs expanded to the
broadcast shape with the grads summed back in numpy (``expanded``).
"""

import numpy as np
import pytest

from harness import FLOATS, c_ops, check, rng

BINARY = ["atan2_grad", "copysign_grad", "fmax_grad", "fmin_grad", "heaviside_grad"]

# (x shape, y shape): same shape, each side broadcasting, both, rank 0, different ranks, empty.
SHAPES = [
    ((2, 3), (2, 3)),
    ((3, 4), (4,)),
    ((4,), (3, 4)),
    ((3, 1), (1, 4)),
    ((), (3,)),
    ((2, 3), ()),
    ((2, 3, 4), (3, 1)),
    ((1, 5), (2, 1, 1)),
    ((), ()),
    ((2, 0, 3), (3,)),
    ((0, 2), (1,)),
    ((0,), (1,)),
]


def sum_to(a, shape):
    """Sum a broadcast-shaped grad back to ``shape`` (numpy broadcasting rules)."""
    a = np.asarray(a)
    a = a.reshape(a.shape) if a.ndim else a
    while a.ndim > len(shape):
        a = a.sum(0)
    for i, s in enumerate(shape):
        if s == 1 and a.shape[i] != 1:
            a = a.sum(i, keepdims=True)
    return a


def expanded(op, tensors=("x", "y")):
    """Oracle: Paddle on the named inputs expanded to the common shape, grads reduced back."""
    def oracle(inputs, attrs):
        shape = np.broadcast_shapes(*(np.shape(inputs[n]) for n in tensors))
        full = {k: (np.ascontiguousarray(np.broadcast_to(v, shape)) if k in tensors else v)
                for k, v in inputs.items()}
        out = c_ops(op, full, attrs)
        res = {}
        for name, value in out.items():
            src = name[: -len("_grad")]
            res[name] = sum_to(value.astype(np.float64), np.shape(inputs[src])).astype(value.dtype)
        return res
    return oracle


def special_pair():
    """x, y, out_grad with ties, signed zeros, infinities and NaN in either operand and in out_grad."""
    x = np.array([1.0, 2.0, np.nan, 0.0, -0.0, np.nan, np.inf, -np.inf, 3.0, 1e-3, -2.5, 0.0,
                  np.inf, -1.0, 4.0, 0.5])
    y = np.array([1.0, np.nan, 1.0, -0.0, 0.0, np.nan, np.inf, 5.0, -np.inf, -1e-3, -2.5, 7.0,
                  -np.inf, 0.0, 4.0, -0.5])
    g = rng(5).standard_normal(x.shape)
    g[[3, 9, 13]] = np.nan
    g[[8, 11, 15]] = [np.inf, -np.inf, np.inf]
    return x, y, g


def binary_inputs(xs, ys, seed=0):
    r = rng(seed)
    x = r.standard_normal(xs)
    y = r.standard_normal(ys)
    # ties and zeros where the shapes line up elementwise
    if xs == ys and x.size:
        x.reshape(-1)[::3] = y.reshape(-1)[::3]
        x.reshape(-1)[1::5] = 0.0
    g = r.standard_normal(np.broadcast_shapes(xs, ys))
    return {"x": x, "y": y, "out_grad": g}


# every broadcast pattern is its own kernel: the half types get a representative subset
HALF_SHAPES = [SHAPES[0], SHAPES[2], SHAPES[3], SHAPES[4]]
SHAPE_CASES = ([(xs, ys, d) for xs, ys in SHAPES for d in ("float32", "float64")]
               + [(xs, ys, d) for xs, ys in HALF_SHAPES for d in ("float16", "bfloat16")])


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("xs,ys,dtype", SHAPE_CASES)
@pytest.mark.sweep
def test_binary_shapes(op, xs, ys, dtype):
    oracle = expanded(op) if op == "atan2_grad" else None
    inputs = binary_inputs(xs, ys)
    ours = check(op, inputs, dtype=dtype, oracle=oracle)
    assert ours["x_grad"].shape == tuple(xs) and ours["y_grad"].shape == tuple(ys)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", BINARY)
def test_binary_specials(op, dtype):
    x, y, g = special_pair()
    check(op, {"x": x, "y": y, "out_grad": g}, dtype=dtype)


def test_fmax_fmin_semantics():
    """Ties go to x; a NaN operand passes the grad to the other one; NaN out_grad stays NaN."""
    import tvmgrad
    x = np.array([1.0, np.nan, 2.0, np.nan, 3.0])
    y = np.array([1.0, 2.0, np.nan, np.nan, 1.0])
    g = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    mx = tvmgrad.run("fmax_grad", {"x": x, "y": y, "out_grad": g})
    np.testing.assert_array_equal(mx["x_grad"], [1.0, 0.0, 3.0, 4.0, np.nan])
    np.testing.assert_array_equal(mx["y_grad"], [0.0, 2.0, 0.0, 0.0, np.nan])
    mn = tvmgrad.run("fmin_grad", {"x": x, "y": y, "out_grad": g})
    np.testing.assert_array_equal(mn["x_grad"], [1.0, 0.0, 3.0, 4.0, np.nan])
    np.testing.assert_array_equal(mn["y_grad"], [0.0, 2.0, 0.0, 0.0, np.nan])


def test_heaviside_copysign_semantics():
    import tvmgrad
    x = np.array([0.0, -0.0, 2.0, -3.0, np.inf, 0.0])
    y = np.array([5.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    g = np.array([1.0, 2.0, 3.0, np.inf, 5.0, np.nan])
    h = tvmgrad.run("heaviside_grad", {"x": x, "y": y, "out_grad": g})
    np.testing.assert_array_equal(h["x_grad"], [0.0, 0.0, 0.0, np.nan, 0.0, np.nan])
    np.testing.assert_array_equal(h["y_grad"], [1.0, 2.0, 0.0, np.nan, 0.0, np.nan])
    c = tvmgrad.run("copysign_grad", {"x": x, "y": y, "out_grad": g})
    # copysign(x, y)/x is ±1, NaN for x = ±inf; x == 0 gives 0 whatever out_grad is
    np.testing.assert_array_equal(c["x_grad"], [0.0, 0.0, -3.0, -np.inf, np.nan, 0.0])
    np.testing.assert_array_equal(c["y_grad"], np.zeros(6))


# (x, y, weight): each of the three broadcasting, rank 0, weight of higher rank than x and y.
LERP_SHAPES = [
    ((2, 3), (2, 3), (2, 3)),
    ((3, 4), (4,), (1,)),
    ((4,), (3, 4), (3, 1)),
    ((3, 1), (1, 4), ()),
    ((), (3,), (3,)),
    ((3,), (), (2, 3)),
    ((3,), (3,), (2, 1, 3)),
    ((2, 3, 4), (3, 1), (4,)),
    ((), (), ()),
    ((2, 0, 3), (3,), (1,)),
    ((2, 0), (1,), (2, 1)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("xs,ys,ws", LERP_SHAPES)
@pytest.mark.sweep
def test_lerp_grad(xs, ys, ws, dtype):
    r = rng(7)
    x, y, w = r.standard_normal(xs), r.standard_normal(ys), r.random(ws)
    if w.size:
        w.reshape(-1)[0] = 0.0
        w.reshape(-1)[-1] = 1.0
    shape = np.broadcast_shapes(xs, ys, ws)
    out = x + np.broadcast_to(w, shape) * (y - x)
    ours = check("lerp_grad", {"x": x, "y": y, "weight": w, "out": out,
                               "out_grad": r.standard_normal(shape)}, dtype=dtype)
    assert ours["x_grad"].shape == tuple(xs) and ours["y_grad"].shape == tuple(ys)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lerp_grad_specials(dtype):
    w = np.array([0.0, 1.0, 0.5, -2.0, 3.0, np.nan, np.inf, 0.25])
    x = np.zeros(8)
    y = np.ones(8)
    g = np.array([1.0, np.nan, np.inf, 2.0, -1.0, 1.0, 1.0, -np.inf])
    check("lerp_grad", {"x": x, "y": y, "weight": w, "out": x + w * (y - x), "out_grad": g},
          dtype=dtype)


def test_empty_1d():
    ours = check("fmax_grad", {"x": np.ones((0,)), "y": np.ones((0,)), "out_grad": np.ones((0,))})
    assert ours["x_grad"].shape == (0,) and ours["y_grad"].shape == (0,)


def test_broadcast_shape_errors():
    import tvmgrad
    with pytest.raises(Exception):
        tvmgrad.run("fmax_grad", {"x": np.ones((3, 4)), "y": np.ones((3,)),
                                  "out_grad": np.ones((3, 4))})


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_copysign_grad_inplace(dtype):
    """YAML inplace (out_grad -> x_grad): x_grad written into out_grad's buffer, same values."""
    import tvmgrad
    x, y, g = special_pair()
    x, y, g = (a.astype(dtype) for a in (x, y, g))
    want = tvmgrad.run("copysign_grad", {"x": x, "y": y, "out_grad": g.copy()})
    buf = g.copy()
    got = tvmgrad.run("copysign_grad", {"x": x, "y": y, "out_grad": buf}, inplace=True)
    np.testing.assert_array_equal(got["x_grad"], want["x_grad"])
    np.testing.assert_array_equal(buf, want["x_grad"])
    np.testing.assert_array_equal(got["y_grad"], want["y_grad"])
