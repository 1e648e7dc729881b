"""Complex numbers: the pointwise grads Paddle 3.3.1 registers complex kernels for (elementary.py,
activation.py), the grads that move between real and complex (complex_ops.py) and the
whole-tensor grads with complex kernels (mean_all, reduce_as, dot, cross, kron, trace, cumsum,
cumprod, overlap_add), against Paddle in complex64/complex128.

Paddle's convention for a holomorphic f is x_grad = out_grad · conj(f'(x)); for a real-valued or
non-holomorphic f it is the gradient of L = Re Σ conj(out_grad)·f(x) w.r.t. x written as
∂L/∂Re x + i ∂L/∂Im x (checked by finite differences below).

Where Paddle deviates (comments at the tests):
* its complex exp is only ~1e-7 accurate even in complex128, so silu/logsigmoid/softplus/stanh
  grads (built on exp) agree to ~1e-6 only;
* softsign_grad: Paddle multiplies both Wirtinger terms by out_grad, which is not a gradient; the
  gradient is computed and checked by finite differences;
* double/triple grads: Paddle registers complex kernels but computes them without conjugation
  (e.g. sin_double_grad x_grad = -ddx·g·sin x, the gradient is -conj(ddx)·g·conj(sin x)), so they
  are not extended to complex here (they raise a TypeError).
"""

import numpy as np
import pytest

import tvmgrad
from adjoint import inner
from harness import c_ops, rng, to_paddle

CPLX = ("complex64", "complex128")
RTOL = {"complex64": 3e-5, "complex128": 1e-11, "float32": 3e-5, "float64": 1e-11,
        "float16": 3e-3, "bfloat16": 2e-2}


def close(name, got, want, rtol=None, atol=None):
    """Same shape and dtype; real and imaginary parts within tolerance of the largest |want|
    (NaN positions equal)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    rtol = RTOL[want.dtype.name] if rtol is None else rtol
    g = np.stack([got.real, got.imag]).astype(np.float64) if np.iscomplexobj(got) else got.astype(np.float64)
    w = np.stack([want.real, want.imag]).astype(np.float64) if np.iscomplexobj(want) else want.astype(np.float64)
    finite = np.isfinite(w)
    scale = np.abs(w[finite]).max() if finite.any() else 1.0
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale if atol is None else atol,
                               equal_nan=True, err_msg=name)


def crand(shape, seed=0, scale=1.0):
    r = rng(seed)
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)) * scale


def check_as_given(op, inputs, attrs=None, oracle=None, rtol=None):
    """Run ``op`` on ``inputs`` as they are (complex or integer arrays: no casting) and compare
    with Paddle (``c_ops``, or ``oracle(inputs, attrs)``): complex and float outputs within
    tolerance (``close``), integer and bool outputs exactly, dtypes equal. -> our outputs."""
    attrs = attrs or {}
    ours = tvmgrad.run(op, inputs, attrs)
    want = oracle(inputs, attrs) if oracle is not None else c_ops(op, inputs, attrs)
    for name, w in want.items():
        got = ours[name]
        pairs = zip(got, w) if isinstance(w, list) else [(got, w)]
        if isinstance(w, list):
            assert len(got) == len(w), name
        for k, (g1, w1) in enumerate(pairs):
            g1, w1 = np.asarray(g1), np.asarray(w1)
            label = f"{op}.{name}[{k}]"
            if w1.dtype.kind in "biu":
                assert g1.dtype == w1.dtype and g1.shape == w1.shape, (label, g1.dtype, w1.dtype,
                                                                       g1.shape, w1.shape)
                np.testing.assert_array_equal(g1, w1, err_msg=label)
            else:
                close(label, g1, w1, rtol=rtol)
    return ours


def ints(shape, dtype, seed=0, low=-9, high=10):
    """Integer (or bool) test data of ``dtype``: small values, negative ones where signed."""
    r = rng(seed)
    if dtype == "bool":
        return r.integers(0, 2, shape).astype(bool)
    if dtype.startswith("uint"):
        low = max(low, 0)
    return r.integers(low, high, shape).astype(dtype)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def paddle_forward(op, x, *attrs):
    """A forward op of Paddle's (invoke targets have no backward.yaml entry for c_ops)."""
    import paddle
    return getattr(paddle._C_ops, op)(to_paddle(x), *attrs).numpy()


# ------------------------------------------------------------------------------------------
# Part 1: pointwise grads with complex kernels in Paddle

X_OPS = ["sin_grad", "cos_grad", "tan_grad", "sinh_grad", "cosh_grad", "asin_grad", "acos_grad",
         "atan_grad", "asinh_grad", "acosh_grad", "atanh_grad", "log_grad", "log2_grad", "log10_grad",
         "log1p_grad", "square_grad"]
OUT_OPS = {"exp_grad": np.exp, "expm1_grad": np.expm1, "sqrt_grad": np.sqrt,
           "reciprocal_grad": lambda x: 1 / x, "sigmoid_grad": sigmoid, "tanh_grad": np.tanh}
# built on Paddle's imprecise complex exp (module docstring)
EXP_BASED = {"silu_grad", "logsigmoid_grad", "softplus_grad", "stanh_grad"}


def _inputs(op, x, g):
    spec = tvmgrad.registry.get(op).spec
    inputs = {}
    for p in spec.tensor_args:
        if p.name == "x":
            inputs["x"] = x
        elif p.name == "out":
            inputs["out"] = (OUT_OPS[op](x) if op in OUT_OPS else x * sigmoid(x)).astype(x.dtype)
        else:
            inputs[p.name] = g
    return inputs


@pytest.mark.parametrize("dtype", CPLX)
@pytest.mark.parametrize("op", X_OPS + sorted(OUT_OPS) + ["silu_grad", "logsigmoid_grad"])
@pytest.mark.sweep
def test_unary_complex(op, dtype):
    x = crand((3, 5), seed=1, scale=1.5).astype(dtype)
    g = crand((3, 5), seed=2).astype(dtype)
    inputs = _inputs(op, x, g)
    ours = tvmgrad.run(op, inputs)
    want = c_ops(op, inputs, {})
    rtol = 2e-6 if op in EXP_BASED and dtype == "complex128" else None
    close(op, ours["x_grad"], want["x_grad"], rtol=rtol)


@pytest.mark.parametrize("dtype", CPLX)
@pytest.mark.parametrize("op,attrs", [
    ("pow_grad", {"y": 2.5}), ("pow_grad", {"y": -1.5}), ("pow_grad", {"y": 0.3}),
    ("softplus_grad", {"beta": 1.0, "threshold": 20.0}), ("softplus_grad", {"beta": 2.0, "threshold": 3.0}),
    ("stanh_grad", {"scale_a": 0.67, "scale_b": 1.7159})])
def test_attr_complex(op, attrs, dtype):
    x = crand((3, 5), seed=3, scale=2.0).astype(dtype)
    x.flat[0] = 25 - 30j        # softplus: Re(beta·x) above the threshold selects out_grad
    x.flat[1] = 10 + 30j
    g = crand((3, 5), seed=4).astype(dtype)
    ours = tvmgrad.run(op, {"x": x, "out_grad": g}, attrs)
    want = c_ops(op, {"x": x, "out_grad": g}, attrs)
    close(op, ours["x_grad"], want["x_grad"], rtol=2e-6 if op in EXP_BASED and dtype == "complex128" else None)


@pytest.mark.parametrize("dtype", CPLX)
def test_complex_edges_match_paddle(dtype):
    """0, ±inf and NaN primals: division by zero gives NaN pairs and x / inf gives 0 as in Paddle
    (tvmgrad divides complex numbers by Smith's algorithm); pow at 0 is 0 for y - 1 > 0 and NaN
    otherwise (Paddle evaluates polar(exp(e·log|z|), e·arg z)). (Infinite complex cotangents are
    left out: which products of inf with finite parts turn into NaN depends on the order Paddle
    multiplies in.)"""
    x = np.array([0, 1e-30j, np.inf, -2 + 1j, np.nan], dtype=dtype)
    g = np.array([1 + 1j, 2 - 1j, 1 + 0j, 3 + 0j, 1j], dtype=dtype)
    for op, attrs in (("sqrt_grad", {}), ("log_grad", {}), ("reciprocal_grad", {}), ("pow_grad", {"y": 2.5}),
                      ("pow_grad", {"y": 0.5}), ("sin_grad", {}), ("tanh_grad", {})):
        inputs = _inputs(op, x, g) if op in OUT_OPS else {"x": x, "out_grad": g}
        if op == "sqrt_grad":
            inputs["out"] = np.sqrt(x)
        ours = tvmgrad.run(op, inputs, attrs)["x_grad"]
        want = c_ops(op, inputs, attrs)["x_grad"]
        # compare the NaN/inf pattern exactly and the finite values closely
        np.testing.assert_array_equal(np.isnan(ours.real) | np.isnan(ours.imag),
                                      np.isnan(want.real) | np.isnan(want.imag), err_msg=op)
        fin = np.isfinite(want.real) & np.isfinite(want.imag)
        close(op, ours[fin], want[fin])


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_abs_grad_complex(dtype):
    """abs(complex) is real: out_grad is real, x_grad complex: out_grad · x / |x| (0 at x = 0,
    NaN at inf)."""
    x = crand((4, 5), seed=5).astype(dtype)
    x.flat[:3] = [0, np.inf, 3 + 4j]
    g = rng(6).standard_normal((4, 5)).astype("float32" if dtype == "complex64" else "float64")
    ours = tvmgrad.run("abs_grad", {"x": x, "out_grad": g})["x_grad"]
    want = c_ops("abs_grad", {"x": x, "out_grad": g}, {})["x_grad"]
    close("abs_grad", ours, want)
    assert ours.flat[0] == 0 and np.isnan(ours.flat[1].real)
    with pytest.raises(TypeError, match=r"abs_grad: input 'out_grad' has dtype complex128; for x of dtype "
                                        r"complex128 it must be float64"):
        tvmgrad.run("abs_grad", {"x": x.astype("complex128"), "out_grad": x.astype("complex128")})
    with pytest.raises(TypeError, match=r"abs_grad: the inputs must share one precision"):
        tvmgrad.run("abs_grad", {"x": x.astype("complex128"), "out_grad": g.astype("float32")})


@pytest.mark.parametrize("dtype", CPLX)
def test_zero_and_scale_complex(dtype):
    g = crand((3, 4), seed=7).astype(dtype)
    g.flat[0] = np.inf
    for op in ("round_grad", "gaussian_inplace_grad"):
        ours = tvmgrad.run(op, {"out_grad": g})["x_grad"]
        want = c_ops(op, {"out_grad": g}, {})["x_grad"]
        close(op, ours, want)
    # round_grad is 0·out_grad: NaN pairs where out_grad is not finite, as Paddle
    assert np.isnan(tvmgrad.run("round_grad", {"out_grad": g})["x_grad"].flat[0].real)
    for after in (True, False):
        attrs = {"scale": 2.0, "bias": 3.0, "bias_after_scale": after}
        ours = tvmgrad.run("scale_grad", {"out_grad": g[1:]}, {"scale": 2.0})["x_grad"]
        close("scale_grad", ours, (g[1:] * 2).astype(dtype))
        ours = tvmgrad.run("scale", {"x": g[1:]}, attrs)["out"]
        want = paddle_forward("scale", g[1:], 2.0, 3.0, after)
        close("scale", ours, want)


def test_complex_broadcasting_pointwise():
    """Complex grads reduce over broadcast dims like real ones (binary pointwise families reuse
    the same machinery; here: a unary op with inplace)."""
    x = crand((2, 3), seed=8)
    g = crand((2, 3), seed=9)
    buf = g.copy()
    ours = tvmgrad.run("sin_grad", {"x": x, "out_grad": buf}, inplace=True)["x_grad"]
    assert np.shares_memory(ours, buf)
    close("sin_grad", ours, g * np.conj(np.cos(x)))


def _fd_grad(f, x, g, eps=1e-6):
    """∂L/∂Re x + i ∂L/∂Im x for L = Re Σ conj(g)·f(x) by central differences."""
    out = np.zeros_like(x)
    for k in range(x.size):
        for part in (1, 1j):
            d = np.zeros_like(x)
            d.flat[k] = eps * part
            lp = np.real(np.sum(np.conj(g) * f(x + d)))
            lm = np.real(np.sum(np.conj(g) * f(x - d)))
            out.flat[k] += (lp - lm) / (2 * eps) * (1 if part == 1 else 1j)
    return out


def test_softsign_grad_complex_is_the_gradient():
    """softsign(x) = x / (1 + |x|) is not holomorphic. Paddle 3.3.1 returns out_grad·(∂f/∂x +
    ∂f/∂x̄), which is not a gradient; tvmgrad returns out_grad·∂f/∂x + conj(out_grad)·∂f/∂x̄
    (Paddle's convention), checked by finite differences and against Paddle on real-valued ones."""
    x = crand((2, 3), seed=10, scale=1.5)
    g = crand((2, 3), seed=11)
    ours = tvmgrad.run("softsign_grad", {"x": x, "out_grad": g})["x_grad"]
    fd = _fd_grad(lambda z: z / (1 + np.abs(z)), x, g)
    close("softsign_grad", ours, fd, rtol=1e-7)
    want = c_ops("softsign_grad", {"x": x, "out_grad": g}, {})["x_grad"]
    assert np.abs(ours - want).max() > 1e-2          # Paddle's value differs
    # where x is real-valued both conventions agree with the real derivative
    xr = np.array([0.5, -2.0, 3.0]) + 0j
    gr = np.array([1.0, -0.5, 2.0]) + 0j
    ours = tvmgrad.run("softsign_grad", {"x": xr, "out_grad": gr})["x_grad"]
    close("softsign_grad real", ours, gr / (1 + np.abs(xr)) ** 2)
    assert np.isnan(tvmgrad.run("softsign_grad", {"x": np.array([0j]), "out_grad": np.array([1 + 1j])})["x_grad"][0].real)


@pytest.mark.parametrize("op", ["sin_grad", "log_grad", "atanh_grad", "pow_grad", "tanh_grad"])
def test_holomorphic_grads_are_gradients(op):
    """x_grad = out_grad·conj(f'(x)) is the finite-difference gradient of Re Σ conj(g)·f(x)."""
    x = crand((2, 2), seed=12) * 0.7
    g = crand((2, 2), seed=13)
    fwd = {"sin_grad": np.sin, "log_grad": np.log, "atanh_grad": np.arctanh,
           "pow_grad": lambda z: z ** 2.5, "tanh_grad": np.tanh}[op]
    inputs = {"x": x, "out_grad": g} if op != "tanh_grad" else {"out": np.tanh(x), "out_grad": g}
    ours = tvmgrad.run(op, inputs, {"y": 2.5} if op == "pow_grad" else {})["x_grad"]
    close(op, ours, _fd_grad(fwd, x, g), rtol=1e-7)


@pytest.mark.parametrize("op", ["relu_grad", "sqrt_double_grad", "rsqrt_double_grad"])  # no complex kernel in Paddle
def test_complex_not_supported_names_op_and_input(op):
    spec = tvmgrad.registry.get(op).spec
    z = crand((2, 3))
    inputs = {p.name: z for p in spec.tensor_args}
    with pytest.raises(TypeError, match=rf"{op}: input '\w+' has dtype complex128"):
        tvmgrad.run(op, inputs)


# ------------------------------------------------------------------------------------------
# complex_ops.py: real/imag/complex/angle/as_real/as_complex/conj

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["real_grad", "imag_grad"])
def test_real_imag_grad(op, dtype):
    g = rng(14).standard_normal((3, 0, 2) if dtype == "float32" and op == "imag_grad" else (3, 4)).astype(dtype)
    ours = tvmgrad.run(op, {"out_grad": g})["x_grad"]
    want = c_ops(op, {"out_grad": g}, {})["x_grad"]
    close(op, ours, want)


def test_real_imag_grad_half_gives_complex64():
    """Paddle has no complex32: a half out_grad gives a complex64 x_grad (tvmgrad extension)."""
    import ml_dtypes
    for dt in (np.float16, ml_dtypes.bfloat16):
        g = np.array([1.5, -2.25, 3.0], dtype=dt)
        ours = tvmgrad.run("imag_grad", {"out_grad": g})["x_grad"]
        assert ours.dtype == np.complex64
        np.testing.assert_array_equal(ours, 1j * g.astype(np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("rshape,ishape", [((3, 4), (3, 4)), ((1, 4), (3, 4)), ((3, 4), (4,)), ((), (2, 3))])
def test_complex_grad(rshape, ishape, dtype):
    """Re/Im of out_grad, summed over the dims real/imag were broadcast along."""
    re, im = rng(15).standard_normal(rshape).astype(dtype), rng(16).standard_normal(ishape).astype(dtype)
    shape = np.broadcast_shapes(rshape, ishape)
    g = crand(shape, seed=17).astype("complex64" if dtype == "float32" else "complex128")
    ours = tvmgrad.run("complex_grad", {"real": re, "imag": im, "out_grad": g})
    want = c_ops("complex_grad", {"real": re, "imag": im, "out_grad": g}, {})
    for k in ("real_grad", "imag_grad"):
        close(k, ours[k], want[k])


def test_complex_grad_mixed_precision_and_errors():
    re = np.ones((2, 3), np.float16)
    g = crand((2, 3), seed=18).astype(np.complex64)      # half real/imag make complex64
    ours = tvmgrad.run("complex_grad", {"real": re, "imag": re, "out_grad": g})
    assert ours["real_grad"].dtype == np.float16
    np.testing.assert_allclose(ours["imag_grad"].astype(float), g.imag.astype(np.float16).astype(float))
    # the dtypes must fit each other: real and imag share one, out_grad is its complex dtype
    with pytest.raises(TypeError, match=r"complex_grad: input 'out_grad' has dtype complex128; it "
                                        r"must be complex64"):
        tvmgrad.run("complex_grad", {"real": re, "imag": re, "out_grad": g.astype(np.complex128)})
    with pytest.raises(TypeError, match=r"complex_grad: input 'imag' has dtype float32 but 'real' "
                                        r"has float64"):
        tvmgrad.run("complex_grad", {"real": g.real.astype(np.float64), "imag": g.real,
                                     "out_grad": g.astype(np.complex128)})
    g = g.astype(np.complex128)
    with pytest.raises(TypeError, match=r"complex_grad: input 'out_grad' has dtype float64; it must be "
                                        r"complex128, the complex dtype"):
        tvmgrad.run("complex_grad", {"real": g.real, "imag": g.real, "out_grad": g.real})
    with pytest.raises(ValueError, match=r"complex_grad: out_grad has shape \[2, 4\], expected \[2, 3\]"):
        tvmgrad.run("complex_grad", {"real": g.real, "imag": g.real, "out_grad": crand((2, 4))})


@pytest.mark.parametrize("dtype", ["complex64", "complex128", "float32", "float64"])
def test_angle_grad(dtype):
    x = (crand((3, 4), seed=19) if dtype.startswith("complex") else rng(19).standard_normal((3, 4))).astype(dtype)
    x.flat[0] = 0
    rdt = {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)
    g = rng(20).standard_normal((3, 4)).astype(rdt)
    g.flat[1] = np.inf
    ours = tvmgrad.run("angle_grad", {"x": x, "out_grad": g})["x_grad"]
    want = c_ops("angle_grad", {"x": x, "out_grad": g}, {})["x_grad"]
    close("angle_grad", ours, want)
    assert ours.flat[0] == 0


@pytest.mark.parametrize("dtype", CPLX)
def test_as_real_as_complex_conj(dtype):
    z = crand((2, 3, 4), seed=21).astype(dtype)
    r = np.ascontiguousarray(z.view(z.real.dtype).reshape(2, 3, 4, 2))
    ours = tvmgrad.run("as_complex_grad", {"out_grad": z})["x_grad"]     # = as_real(out_grad)
    close("as_complex_grad", ours, paddle_forward("as_real", z))
    ours = tvmgrad.run("as_real_grad", {"out_grad": r})["x_grad"]        # = as_complex(out_grad)
    close("as_real_grad", ours, paddle_forward("as_complex", r))
    ours = tvmgrad.run("conj_grad", {"out_grad": z})["x_grad"]
    close("conj_grad", ours, paddle_forward("conj", z))
    ours = tvmgrad.run("conj_grad", {"out_grad": r})["x_grad"]           # real: a copy
    close("conj_grad real", ours, r)
    # (invoke ops report errors under their own name and argument names, not the forward's)
    with pytest.raises(ValueError, match=r"^as_real_grad: out_grad must have a last dim of size 2"):
        tvmgrad.run("as_real_grad", {"out_grad": r[..., :1]})
    with pytest.raises(TypeError, match=r"^as_complex_grad: input 'out_grad' has dtype float64; "
                                        r"as_complex_grad supports complex"):
        tvmgrad.run("as_complex_grad", {"out_grad": r.astype("float64")})


def test_linear_maps_adjoint_identity():
    """⟨A x, y⟩ = ⟨x, Aᵀ y⟩ (real inner product) for the forward maps real, imag, complex, conj,
    as_real, as_complex against their grads, in float64."""
    z = crand((3, 4), seed=22)
    w = crand((3, 4), seed=23)
    r = rng(24).standard_normal((3, 4))
    # real(z)
    assert np.isclose(inner(np.real(z), r), inner(z, tvmgrad.run("real_grad", {"out_grad": r})["x_grad"]))
    assert np.isclose(inner(np.imag(z), r), inner(z, tvmgrad.run("imag_grad", {"out_grad": r})["x_grad"]))
    # complex(a, b) = a + ib
    a, b = rng(25).standard_normal((3, 4)), rng(26).standard_normal((1, 4))
    grads = tvmgrad.run("complex_grad", {"real": a, "imag": b, "out_grad": w})
    assert np.isclose(inner(a + 1j * b, w), inner(a, grads["real_grad"]) + inner(b, grads["imag_grad"]))
    assert np.isclose(inner(np.conj(z), w), inner(z, tvmgrad.run("conj_grad", {"out_grad": w})["x_grad"]))
    zr = np.ascontiguousarray(z.view(np.float64).reshape(3, 4, 2))
    wr = np.ascontiguousarray(w.view(np.float64).reshape(3, 4, 2))
    assert np.isclose(inner(zr, wr), inner(z, tvmgrad.run("as_real_grad", {"out_grad": wr})["x_grad"]))
    assert np.isclose(inner(z, w), inner(zr, tvmgrad.run("as_complex_grad", {"out_grad": w})["x_grad"]))


def test_angle_grad_is_the_gradient():
    x = crand((2, 3), seed=27)
    g = rng(28).standard_normal((2, 3)) + 0j
    ours = tvmgrad.run("angle_grad", {"x": x, "out_grad": g.real})["x_grad"]
    close("angle_grad", ours, _fd_grad(np.angle, x, g), rtol=1e-7)


@pytest.mark.cuda
def test_complex_kernels_compile_for_cuda():
    """The complex variants of the pointwise/mixed kernels compile to cubin without spills (the
    generic CUDA build test only sees real samples for pointwise ops)."""
    from cubins import assert_compiles_without_spills, plans_of
    z, r = crand((3, 4)), rng(29).standard_normal((3, 4))
    calls = [("sin_grad", {"x": z, "out_grad": z}, {}), ("pow_grad", {"x": z, "out_grad": z}, {"y": 2.5}),
             ("softsign_grad", {"x": z, "out_grad": z}, {}), ("abs_grad", {"x": z, "out_grad": r}, {}),
             ("silu_grad", {"x": z, "out": z, "out_grad": z}, {}),
             ("softplus_grad", {"x": z.astype("complex64"), "out_grad": z.astype("complex64")},
              {"beta": 1.0, "threshold": 20.0})]
    assert_compiles_without_spills(plans_of(calls))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_complex_ops_half_types(dtype):
    """Half types: real inputs keep their dtype, complex results of half inputs are complex64
    (numpy has no complex32)."""
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = rng(30).standard_normal((3, 4)).astype(dt)
    g = rng(31).standard_normal((3, 4)).astype(dt)
    g.flat[0] = np.inf
    out = tvmgrad.run("angle_grad", {"x": x, "out_grad": g})["x_grad"]
    assert out.dtype == dt and not out.astype(np.float32).any()          # real x: zeros, as Paddle
    np.testing.assert_array_equal(tvmgrad.run("conj_grad", {"out_grad": x})["x_grad"], x)
    pairs = rng(32).standard_normal((3, 2)).astype(dt)
    z = tvmgrad.run("as_real_grad", {"out_grad": pairs})["x_grad"]
    assert z.dtype == np.complex64
    np.testing.assert_array_equal(z, pairs[:, 0].astype(np.float32) + 1j * pairs[:, 1].astype(np.float32))
    # angle of a complex64 x is float32: a half cotangent is another dtype, refused
    xc = crand((3, 4), seed=33).astype("complex64")
    with pytest.raises(TypeError, match=rf"angle_grad: input 'out_grad' has dtype {dtype}; for 'x' "
                                        rf"of dtype complex64 it must be float32"):
        tvmgrad.run("angle_grad", {"x": xc, "out_grad": g})


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_zero_dim_complex_arrays(dtype):
    """A 0-d complex array is passed as its (re, im) pair like any other (numpy cannot view a 0-d
    array with another itemsize directly)."""
    z = np.array(1 + 2j, dtype)
    assert tvmgrad.run("conj_grad", {"out_grad": z})["x_grad"] == np.conj(z)
    got = tvmgrad.run("abs_grad", {"x": np.array(3 + 4j, dtype), "out_grad": np.array(2.0, z.real.dtype)})
    np.testing.assert_allclose(got["x_grad"], 2 * (3 + 4j) / 5, rtol=1e-6)


# ------------------------------------------------------------------------------------------
# Part 4: whole-tensor grads with complex kernels in Paddle (loss.py, matmul.py, scan.py,
# signal.py). Paddle conjugates the other operand of a product (dot, cross, kron) and the
# partial products of cumprod; sums, means, traces and gathers move both parts alike.

def _cumprod_oracle(inputs, attrs):
    from test_scan import cumprod_oracle
    return cumprod_oracle(inputs, attrs)


WHOLE_TENSOR = [
    ("mean_all_grad", {"x": (3, 4), "out_grad": ()}, {}),
    ("mean_all_grad", {"x": (2, 1, 5), "out_grad": ()}, {}),
    ("reduce_as_grad", {"x": (3, 4), "target": (4,), "out_grad": (4,)}, {}),
    ("reduce_as_grad", {"x": (2, 3, 4), "target": (2, 1, 4), "out_grad": (2, 1, 4)}, {}),
    ("reduce_as_grad", {"x": (1, 5), "target": (1, 5), "out_grad": (1, 5)}, {}),
    ("dot_grad", {"x": (4,), "y": (4,), "out_grad": ()}, {}),
    ("dot_grad", {"x": (3, 5), "y": (3, 5), "out_grad": (3,)}, {}),
    ("dot_grad", {"x": (1, 1), "y": (1, 1), "out_grad": (1,)}, {}),
    ("cross_grad", {"x": (3, 4), "y": (3, 4), "out_grad": (3, 4)}, {"axis": 0}),
    ("cross_grad", {"x": (2, 1, 3), "y": (2, 1, 3), "out_grad": (2, 1, 3)}, {"axis": -1}),
    ("cross_grad", {"x": (4, 3, 2), "y": (4, 3, 2), "out_grad": (4, 3, 2)}, {"axis": 9}),
    ("kron_grad", {"x": (2, 3), "y": (3, 2), "out_grad": (6, 6)}, {}),
    ("kron_grad", {"x": (3,), "y": (1, 4, 2), "out_grad": (1, 4, 6)}, {}),
    ("trace_grad", {"x": (3, 4), "out_grad": ()}, {"offset": 0, "axis1": 0, "axis2": 1}),
    ("trace_grad", {"x": (2, 3, 1, 4), "out_grad": (2, 1)}, {"offset": 1, "axis1": 1, "axis2": -1}),
    ("trace_grad", {"x": (4, 3), "out_grad": ()}, {"offset": -1, "axis1": 1, "axis2": 0}),
    ("cumsum_grad", {"x": (3, 4), "out_grad": (3, 4)}, {"axis": 1}),
    ("cumsum_grad", {"x": (2, 5, 3), "out_grad": (2, 5, 3)}, {"axis": 1, "reverse": True}),
    ("cumsum_grad", {"x": (1, 6), "out_grad": (1, 6)}, {"axis": -1, "exclusive": True}),
    ("cumsum_grad", {"x": (3, 37, 2), "out_grad": (3, 37, 2)},
     {"axis": 1, "exclusive": True, "reverse": True}),          # many chunks and carries
    ("cumsum_grad", {"x": (2, 3), "out_grad": (6,)}, {"axis": 0, "flatten": True}),
    ("cumprod_grad", {"x": (3, 4), "out_grad": (3, 4)}, {"dim": 1}),
    ("cumprod_grad", {"x": (2, 5, 3), "out_grad": (2, 5, 3)}, {"dim": -2}),
    ("cumprod_grad", {"x": (1, 6), "out_grad": (1, 6)}, {"dim": 0}),
    ("cumprod_grad", {"x": (3, 40), "out_grad": (3, 40)}, {"dim": 1}),
    ("overlap_add_grad", {"x": (3, 4), "out_grad": (9,)}, {"hop_length": 2, "axis": -1}),
    ("overlap_add_grad", {"x": (2, 5, 3), "out_grad": (2, 13)}, {"hop_length": 4, "axis": -1}),
    ("overlap_add_grad", {"x": (4, 3, 2, 1), "out_grad": (12, 2, 1)}, {"hop_length": 3, "axis": 0}),
    ("overlap_add_grad", {"x": (1, 1), "out_grad": (1,)}, {"hop_length": 1, "axis": -1}),
]


@pytest.mark.parametrize("dtype", CPLX)
@pytest.mark.parametrize("op,shapes,attrs", WHOLE_TENSOR,
                         ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(WHOLE_TENSOR)])
@pytest.mark.sweep
def test_whole_tensor_grads_complex(op, shapes, attrs, dtype):
    inputs = {k: crand(s, seed=i).astype(dtype) for i, (k, s) in enumerate(shapes.items())}
    oracle = None
    if op == "cumprod_grad":
        x = inputs["x"]
        x[(0,) * x.ndim] = 0                       # Paddle's product formula is exact with zeros
        inputs["out"] = np.cumprod(x, axis=attrs["dim"]).astype(dtype)
        oracle = _cumprod_oracle
    check_as_given(op, inputs, attrs, oracle=oracle)


@pytest.mark.cuda
def test_whole_tensor_complex_kernels_compile_for_cuda():
    """The complex kernels of the ops above compile to sm_80 cubin without spills (the generic
    CUDA build test sees their real samples only)."""
    from cubins import assert_compiles_without_spills, plans_of
    calls, seen = [], set()
    for op, shapes, attrs in WHOLE_TENSOR:
        if op in seen:
            continue
        seen.add(op)
        for dtype in CPLX:
            inputs = {k: crand(s, seed=i).astype(dtype) for i, (k, s) in enumerate(shapes.items())}
            if op == "cumprod_grad":
                inputs["out"] = inputs["x"]
            calls.append((op, inputs, attrs))
    assert_compiles_without_spills(plans_of(calls), archs=("sm_80",))
