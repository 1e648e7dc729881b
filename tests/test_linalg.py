"""Linear-algebra grads (te_defs/linalg.py) against Paddle 3.3.1, numpy and finite differences.

Paddle is the oracle except where its kernel is wrong (each case has its own test and says so):
* eig_grad / eigh_grad / eigvalsh_grad: Paddle's CPU kernels get only the first matrix of a batch
  right; the oracle is Paddle called on each matrix alone;
* svd_grad with a batch of complex matrices fails in Paddle ("Broadcast dimension mismatch"); the
  oracle is Paddle per matrix (with gauge-invariant cotangents: the complex SVD grad is only
  defined for them) and PyTorch;
* triangular_solve_grad with unitriangular and lower x: Paddle keeps tril(dx, 1) (the diagonal and
  first superdiagonal, never read by the forward); the gradient is strictly lower (numpy + finite
  differences);
* det_grad: Paddle zeroes the whole grad when any matrix of the batch has |det| below 1e-5
  (float32) / 1e-12 (float64); tvmgrad zeroes only those matrices;
* matrix_power_grad with complex x: Paddle uses plain transposes (inconsistent with its own
  inverse_grad); the gradient uses conjugate transposes (numpy + finite differences).
Half types (not registered by Paddle for these grads) compute in float32 and are checked against
Paddle in float32 on the rounded inputs.
"""

import itertools

import ml_dtypes
import numpy as np
import pytest

import tvmgrad
from adjoint import inner
from harness import c_ops, in_child_process, rng

RTOL = {"float32": 2e-4, "float64": 1e-9, "complex64": 2e-4, "complex128": 1e-9,
        "float16": 2e-2, "bfloat16": 8e-2}
ALL = ("float32", "float64", "complex64", "complex128")
REAL = ("float32", "float64")


def sweep(names, values, keep):
    """pytest params for every combination in ``values``: those ``keep(*combo)`` accepts run by
    default, the others only under ``-m slow`` (kernels are size-generic: single precision and
    the rarer attribute combinations need fewer cases by default)."""
    out = []
    for combo in itertools.product(*values):
        out.append(pytest.param(*combo) if keep(*combo) else pytest.param(*combo, marks=pytest.mark.slow))
    return names, out


def H(a):
    return np.conj(np.swapaxes(a, -1, -2))


def close(name, got, want, rtol=None, atol=None):
    """Same shape and dtype; real/imag parts within rtol of the largest |want| (NaN positions
    equal)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    rtol = RTOL[np.dtype(want.dtype).name] if rtol is None else rtol
    def parts(a):
        a = np.asarray(a)
        return np.stack([a.real, a.imag]).astype(np.float64) if np.iscomplexobj(a) else a.astype(np.float64)
    g, w = parts(got), parts(want)
    fin = np.isfinite(w)
    scale = np.abs(w[fin]).max() if fin.any() else 1.0
    np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale if atol is None else atol,
                               equal_nan=True, err_msg=name)


def rand(shape, dtype, seed=0, scale=1.0):
    r = rng(seed)
    a = r.standard_normal(shape)
    if dtype.startswith("complex"):
        a = a + 1j * r.standard_normal(shape)
    return (a * scale).astype(dtype)


def wellcond(shape, dtype, seed=0):
    n = shape[-1]
    return (rand(shape, dtype, seed) + n * np.eye(n)).astype(dtype)


def real_of(dtype):
    return {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)


def check(op, inputs, attrs=None, dtype="float64", rtol=None, oracle=None):
    """tvmgrad vs ``oracle`` (default: Paddle's _C_ops.<op>) on the same inputs."""
    ours = tvmgrad.run(op, inputs, attrs)
    want = (oracle or (lambda i, a: c_ops(op, i, a)))(inputs, attrs or {})
    for k, w in want.items():
        close(f"{op}.{k}[{dtype}]", ours[k], w, rtol=rtol)
    return ours


def per_matrix(op, batch_names, nb=1):
    """An oracle calling Paddle on each matrix of the batch alone (``batch_names``: the inputs
    with the batch dims; ``nb`` batch dims)."""
    def oracle(inputs, attrs):
        shape = np.asarray(inputs[batch_names[0]]).shape[:nb]
        outs = {}
        for idx in np.ndindex(*shape):
            one = {k: (v[idx] if k in batch_names and v is not None else v) for k, v in inputs.items()}
            for k, v in c_ops(op, one, attrs).items():
                outs.setdefault(k, np.empty(shape + v.shape, v.dtype))[idx] = v
        return outs
    return oracle


def half_oracle(op, dt):
    """Paddle in float32 on the rounded half inputs, rounded back (what a GPU kernel computes)."""
    def oracle(inputs, attrs):
        f32 = {k: (v.astype(np.float32) if v is not None and v.dtype == dt else v) for k, v in inputs.items()}
        return {k: v.astype(dt) for k, v in c_ops(op, f32, attrs).items()}
    return oracle


# ------------------------------------------------------------------------------------------
# inverse / det / slogdet / matrix_power

@pytest.mark.parametrize(*sweep("dtype,shape", [ALL, [(4, 4), (2, 3, 5, 5), (1, 1)]],
                                  lambda d, s: d in ("float64", "complex128") or s == (2, 3, 5, 5)))
def test_inverse_grad(dtype, shape):
    x = wellcond(shape, dtype)
    check("inverse_grad", {"out": np.linalg.inv(x).astype(dtype), "out_grad": rand(shape, dtype, 1)}, dtype=dtype)


def test_inverse_grad_empty_batch():
    out = tvmgrad.run("inverse_grad", {"out": np.zeros((0, 3, 3)), "out_grad": np.zeros((0, 3, 3))})["x_grad"]
    assert out.shape == (0, 3, 3)


@pytest.mark.parametrize("dtype", ALL)
def test_det_grad(dtype):
    x = wellcond((2, 3, 4, 4), dtype)
    det = np.linalg.det(x).astype(dtype)
    check("det_grad", {"x": x, "out": det, "out_grad": rand((2, 3), dtype, 2)}, dtype=dtype)
    if dtype in REAL:    # (0-d complex arrays: tvmgrad/runtime.py cannot view them as float pairs)
        x2 = wellcond((3, 3), dtype, 3)
        check("det_grad", {"x": x2, "out": np.linalg.det(x2).astype(dtype), "out_grad": rand((), dtype, 4)},
              dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
def test_det_grad_singular_batch_elements(dtype):
    """|det| below 1e-5 (single) / 1e-12 (double) zeroes that matrix's grad. Paddle zeroes the
    whole batch's grad then; the other matrices get their (well-defined) grads here, equal to
    Paddle's on each matrix alone."""
    x = wellcond((3, 3, 3), dtype)
    x[1] = np.array([[1, 2, 3], [2, 4, 6], [1, 0, 1]], dtype=dtype)           # singular
    det = np.linalg.det(x).astype(dtype)
    det[1] = 1e-13 if dtype == "float64" else 1e-6
    g = rand((3,), dtype, 5)
    ours = tvmgrad.run("det_grad", {"x": x, "out": det, "out_grad": g})["x_grad"]
    assert not ours[1].any()
    ok = [0, 2]
    want = per_matrix("det_grad", ("x", "out", "out_grad"))({"x": x[ok], "out": det[ok], "out_grad": g[ok]}, {})["x_grad"]
    close("det_grad", ours[ok], want)
    batched = c_ops("det_grad", {"x": x, "out": det, "out_grad": g}, {})["x_grad"]
    assert not batched.any()                 # Paddle: everything zeroed


@pytest.mark.parametrize("dtype", ALL)
def test_slogdet_grad(dtype):
    x = wellcond((3, 4, 4), dtype)
    sign, logabs = np.linalg.slogdet(x)
    out = np.stack([sign, logabs]).astype(dtype)
    check("slogdet_grad", {"x": x, "out": out, "out_grad": rand((2, 3), dtype, 6)}, dtype=dtype)
    if dtype == "float64":
        x2 = x[0]
        out2 = np.array(np.linalg.slogdet(x2)).astype(dtype)
        check("slogdet_grad", {"x": x2, "out": out2, "out_grad": rand((2,), dtype, 7)}, dtype=dtype)


def _mp_ref(a, g, n):
    """Σ_k (a^H)^k g (a^H)^(n-1-k) (n > 0); n < 0 through B = a^{-1}."""
    mp = np.linalg.matrix_power
    if n == 0:
        return np.zeros_like(a)
    if n > 0:
        return sum(H(mp(a, k)) @ g @ H(mp(a, n - 1 - k)) for k in range(n))
    b = np.linalg.inv(a)
    return -H(b) @ _mp_ref(b, g, -n) @ H(b)


@pytest.mark.parametrize(*sweep("n,dtype", [[0, 1, 2, 3, 7, -1, -2], REAL],
                                  lambda n, d: d == "float64" or n in (3, -2)))
def test_matrix_power_grad_real(n, dtype):
    x = (wellcond((2, 4, 4), dtype) / 4).astype(dtype)
    check("matrix_power_grad", {"x": x, "out": np.linalg.matrix_power(x, n), "out_grad": rand((2, 4, 4), dtype, 8)},
          {"n": n}, dtype=dtype)


@pytest.mark.parametrize("n", [2, 5, -3])
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_matrix_power_grad_complex_uses_conjugate_transposes(n, dtype):
    x = (wellcond((2, 3, 3), dtype) / 3).astype(dtype)
    g = rand((2, 3, 3), dtype, 9)
    inputs = {"x": x, "out": np.linalg.matrix_power(x, n), "out_grad": g}
    ours = tvmgrad.run("matrix_power_grad", inputs, {"n": n})["x_grad"]
    close("matrix_power_grad", ours, _mp_ref(x.astype("complex128"), g.astype("complex128"), n).astype(dtype))
    paddle = c_ops("matrix_power_grad", inputs, {"n": n})["x_grad"]
    assert np.abs(paddle - ours).max() > 1e-2 * np.abs(ours).max()     # Paddle's transposes differ


def _fd(f, x, g, eps=1e-6):
    """∂L/∂Re x + i ∂L/∂Im x for L = Re Σ conj(g)·f(x) (central differences)."""
    out = np.zeros(x.shape, dtype=complex if np.iscomplexobj(x) else float)
    parts = (1, 1j) if np.iscomplexobj(x) else (1,)
    for k in range(x.size):
        for p in parts:
            d = np.zeros(x.shape, dtype=out.dtype)
            d.flat[k] = eps * p
            diff = np.real(np.sum(np.conj(g) * (f(x + d) - f(x - d)))) / (2 * eps)
            out.flat[k] += diff * (1 if p == 1 else 1j)
    return out if np.iscomplexobj(x) else out.real


def test_complex_grads_are_finite_difference_gradients():
    x = wellcond((3, 3), "complex128", 10) / 3
    g = rand((3, 3), "complex128", 11)
    for n in (3, -2):
        ours = tvmgrad.run("matrix_power_grad", {"x": x, "out": x, "out_grad": g}, {"n": n})["x_grad"]
        close(f"matrix_power_grad n={n}", ours, _fd(lambda a: np.linalg.matrix_power(a, n), x, g), rtol=1e-6)
    gd = rand((1,), "complex128", 12)
    ours = tvmgrad.run("det_grad", {"x": x[None], "out": np.linalg.det(x)[None], "out_grad": gd})["x_grad"][0]
    close("det_grad", ours, _fd(np.linalg.det, x, gd[0]), rtol=1e-6)
    ours = tvmgrad.run("inverse_grad", {"out": np.linalg.inv(x), "out_grad": g})["x_grad"]
    close("inverse_grad", ours, _fd(np.linalg.inv, x, g), rtol=1e-6)


# ------------------------------------------------------------------------------------------
# solve / triangular_solve / cholesky / cholesky_solve

@pytest.mark.parametrize(*sweep("case,dtype", [[((2, 4, 4), (2, 4, 3)), ((2, 4, 4), (4,)), ((2, 4, 4), (2, 4)),
                                                ((2, 4, 4), (4, 3)), ((4, 4), (2, 4, 3)), ((2, 1, 4, 4), (3, 4, 2)),
                                                ((4, 4), (4,))], REAL],
                                  lambda c, d: d == "float64" or c[0] == (2, 1, 4, 4)))
def test_solve_grad(case, dtype):
    """y may be a matrix, a vector or a batch of vectors (Paddle's is_vector_rhs); batch dims
    broadcast and the grads are summed back."""
    xs, ys = case
    import paddle
    x, y = wellcond(xs, dtype), rand(ys, dtype, 13)
    out = paddle.linalg.solve(paddle.to_tensor(x), paddle.to_tensor(y)).numpy()
    check("solve_grad", {"x": x, "y": y, "out": out, "out_grad": rand(out.shape, dtype, 14)}, dtype=dtype)


def _tri_solve(x, y, upper, transpose, unit):
    a = np.triu(x) if upper else np.tril(x)
    if unit:
        a = a - np.eye(x.shape[-1]) * np.diagonal(a, axis1=-2, axis2=-1)[..., None, :] + np.eye(x.shape[-1])
    a = np.swapaxes(a, -1, -2) if transpose else a
    return np.linalg.solve(a, y)


@pytest.mark.parametrize(*sweep("upper,transpose,unit,dtype", [[True, False], [False, True], [False, True],
                                                               ["float64", "complex128"]],
                                  lambda u, t, n, d: d == "float64" or (t and (u or n))))
def test_triangular_solve_grad(upper, transpose, unit, dtype):
    x, y = wellcond((2, 4, 4), dtype), rand((2, 4, 3), dtype, 15)
    out = _tri_solve(x, y, upper, transpose, unit).astype(dtype)
    g = rand((2, 4, 3), dtype, 16)
    attrs = {"upper": upper, "transpose": transpose, "unitriangular": unit}
    inputs = {"x": x, "y": y, "out": out, "out_grad": g}
    if unit and not upper:
        # Paddle keeps tril(dx, 1) here; the gradient is strictly lower: compare y_grad with
        # Paddle, x_grad with Paddle's strictly lower part and with finite differences
        ours = tvmgrad.run("triangular_solve_grad", inputs, attrs)
        want = c_ops("triangular_solve_grad", inputs, attrs)
        close("y_grad", ours["y_grad"], want["y_grad"])
        close("x_grad", ours["x_grad"], np.tril(want["x_grad"], -1).astype(dtype))
        assert np.abs(np.triu(want["x_grad"])).max() > 0 and not np.triu(ours["x_grad"]).any()
        fd = _fd(lambda a: _tri_solve(a, y[0], upper, transpose, unit), x[0], g[0])
        close("x_grad fd", ours["x_grad"][0], fd.astype(dtype), rtol=1e-6)
        return
    check("triangular_solve_grad", inputs, attrs, dtype=dtype)


@pytest.mark.parametrize(*sweep("case,dtype", [[((4, 4), (2, 4, 3)), ((2, 4, 4), (4, 3)), ((2, 1, 4, 4), (3, 4, 2))],
                                                ["float32", "complex64", "float64"]],
                                  lambda c, d: d == "float64" or c[0] == (2, 1, 4, 4)))
def test_triangular_solve_grad_broadcast(case, dtype):
    xs, ys = case
    x, y = wellcond(xs, dtype), rand(ys, dtype, 17)
    out = _tri_solve(x, y, True, False, False).astype(dtype)
    check("triangular_solve_grad", {"x": x, "y": y, "out": out, "out_grad": rand(out.shape, dtype, 18)},
          {"upper": True, "transpose": False, "unitriangular": False}, dtype=dtype)


def chol(shape, dtype, seed=0, upper=False):
    b = rand(shape, dtype, seed)
    lo = np.linalg.cholesky(b @ H(b) + shape[-1] * np.eye(shape[-1])).astype(dtype)
    return H(lo).astype(dtype) if upper else lo


@pytest.mark.parametrize(*sweep("shape,dtype,upper", [[(2, 3, 5, 5), (1, 1)], REAL, [False, True]],
                                  lambda s, d, u: d == "float64" or s != (1, 1)))
def test_cholesky_grad(shape, dtype, upper):
    check("cholesky_grad", {"out": chol(shape, dtype, 19, upper), "out_grad": rand(shape, dtype, 20)},
          {"upper": upper}, dtype=dtype)


def test_cholesky_grad_is_symmetric_and_a_gradient():
    lo = chol((4, 4), "float64", 21)
    a = lo @ lo.T
    g = rand((4, 4), "float64", 22)
    ours = tvmgrad.run("cholesky_grad", {"out": lo, "out_grad": g}, {"upper": False})["x_grad"]
    np.testing.assert_allclose(ours, ours.T, atol=1e-12)
    # directional derivative along a symmetric direction
    d = rand((4, 4), "float64", 23)
    d = d + d.T
    eps = 1e-6
    lhs = np.sum(g * (np.linalg.cholesky(a + eps * d) - np.linalg.cholesky(a - eps * d))) / (2 * eps)
    assert np.isclose(lhs, np.sum(ours * d), rtol=1e-6)


@pytest.mark.parametrize(*sweep("case,dtype,upper", [[((2, 4, 3), (2, 4, 4)), ((4, 3), (2, 4, 4)), ((2, 4, 3), (4, 4))],
                                                      REAL, [False, True]],
                                  lambda c, d, u: d == "float64" or c[0] == (4, 3)))
def test_cholesky_solve_grad(case, dtype, upper):
    xs, ys = case
    import paddle
    f, x = chol(ys, dtype, 24, upper), rand(xs, dtype, 25)
    out = paddle.linalg.cholesky_solve(paddle.to_tensor(x), paddle.to_tensor(f), upper=upper).numpy()
    check("cholesky_solve_grad", {"x": x, "y": f, "out": out, "out_grad": rand(out.shape, dtype, 26)},
          {"upper": upper}, dtype=dtype)


# ------------------------------------------------------------------------------------------
# LU

def lu_factor(x):
    import paddle
    lu, piv = paddle.linalg.lu(paddle.to_tensor(x))[:2]
    return lu.numpy(), piv.numpy()


@pytest.mark.parametrize(*sweep("shape,dtype", [[(2, 4, 4), (2, 3, 5), (2, 5, 3), (4, 4)], ALL],
                                  lambda s, d: d in ("float64", "complex128") or s in ((2, 3, 5), (2, 5, 3))))
@pytest.mark.sweep
def test_lu_grad(shape, dtype):
    x = rand(shape, dtype, 27)
    lu, piv = lu_factor(x)
    check("lu_grad", {"x": x, "out": lu, "pivots": piv, "out_grad": rand(shape, dtype, 28)}, {"pivot": True},
          dtype=dtype)


def _lu_nopivot(a):
    """Doolittle LU without pivoting, packed (Paddle's CPU lu has no pivot=False)."""
    a = a.copy()
    n = a.shape[-1]
    for j in range(n):
        a[j + 1:, j] /= a[j, j]
        a[j + 1:, j + 1:] -= np.outer(a[j + 1:, j], a[j, j + 1:])
    return a


def test_lu_grad_without_pivoting_and_inplace():
    x = wellcond((3, 3), "float64", 29)
    g = rand((3, 3), "float64", 30)
    inputs = {"x": x, "out": _lu_nopivot(x), "pivots": np.arange(1, 4, dtype=np.int32), "out_grad": g.copy()}
    want = c_ops("lu_grad", inputs, {"pivot": False})["x_grad"]
    ours = tvmgrad.run("lu_grad", inputs, {"pivot": False}, inplace=True)["x_grad"]
    assert np.shares_memory(ours, inputs["out_grad"])
    close("lu_grad", ours, want)


def test_lu_grad_bad_pivots():
    x = rand((3, 3), "float64")
    lu, piv = lu_factor(x)
    with pytest.raises(ValueError, match=r"lu_grad: input 'pivots' holds 0\.\.0; LU pivots are 1-based"):
        tvmgrad.run("lu_grad", {"x": x, "out": lu, "pivots": piv * 0, "out_grad": x})
    with pytest.raises(ValueError, match=r"lu_grad: input 'pivots' holds \d+\.\.4; LU pivots are 1-based"):
        tvmgrad.run("lu_grad", {"x": x, "out": lu, "pivots": piv * 0 + 4, "out_grad": x})
    with pytest.raises(ValueError, match=r"lu_grad: pivots has shape \[2\], expected \[3\]"):
        tvmgrad.run("lu_grad", {"x": x, "out": lu, "pivots": piv[:2], "out_grad": x})
    with pytest.raises(TypeError, match=r"lu_grad: input 'pivots' has dtype float64"):
        tvmgrad.run("lu_grad", {"x": x, "out": lu, "pivots": piv.astype(float), "out_grad": x})


@pytest.mark.parametrize("m,n", [(4, 4), (3, 5), (5, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128"])
def test_lu_unpack_grad(m, n, dtype):
    import paddle
    k = min(m, n)
    x = rand((2, m, n), dtype, 31)
    lu, piv = lu_factor(x)
    p, lo, up = (t.numpy() for t in paddle.linalg.lu_unpack(paddle.to_tensor(lu), paddle.to_tensor(piv)))
    inputs = {"x": lu, "y": piv, "l": lo, "u": up, "pmat": p, "l_grad": rand((2, m, k), dtype, 32),
              "u_grad": rand((2, k, n), dtype, 33)}
    check("lu_unpack_grad", inputs, {"unpack_ludata": True, "unpack_pivots": True}, dtype=dtype)


@pytest.mark.parametrize("m,n", [(4, 4), (3, 5), (5, 3)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "float16", "bfloat16"])
def test_lu_unpack_grad_without_pivots(m, n, dtype):
    """unpack_pivots=False: Paddle's forward returns an empty float32 pmat whatever x's dtype (it
    is not read); the grad takes it as it is. Half types: Paddle in float32 on the rounded
    inputs."""
    import paddle
    k = min(m, n)
    half = dtype in ("float16", "bfloat16")
    base = "float64" if half else dtype
    lu, piv = lu_factor(rand((2, m, n), base, 61))
    p, lo, up = (t.numpy() for t in paddle._C_ops.lu_unpack(paddle.to_tensor(lu), paddle.to_tensor(piv),
                                                            True, False))
    assert p.shape == (0,) and p.dtype == np.float32
    inputs = {"x": lu, "y": piv, "l": lo, "u": up, "pmat": p, "l_grad": rand((2, m, k), base, 62),
              "u_grad": rand((2, k, n), base, 63)}
    attrs = {"unpack_ludata": True, "unpack_pivots": False}
    if not half:
        check("lu_unpack_grad", inputs, attrs, dtype=dtype)
        return
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    inputs = {k_: (v.astype(dt) if k_ not in ("y", "pmat") else v) for k_, v in inputs.items()}
    ours = tvmgrad.run("lu_unpack_grad", inputs, attrs)["x_grad"]
    want = half_oracle("lu_unpack_grad", dt)(inputs, attrs)["x_grad"]
    assert ours.dtype == dt
    close("lu_unpack_grad", ours.astype(np.float32), want.astype(np.float32), rtol=RTOL[dtype])


def test_lu_unpack_grad_checks_every_input():
    """l, u, pmat and the pivots y are checked against x as l_grad and u_grad are (Paddle's
    InferMeta checks nothing; wrong shapes there read garbage)."""
    x = rand((2, 3, 4), "float64", 64)
    lu, piv = lu_factor(x)
    good = {"x": lu, "y": piv, "l": rand((2, 3, 3), "float64"), "u": rand((2, 3, 4), "float64"),
            "pmat": rand((2, 3, 3), "float64"), "l_grad": rand((2, 3, 3), "float64"),
            "u_grad": rand((2, 3, 4), "float64")}
    both = {"unpack_ludata": True, "unpack_pivots": True}
    run = lambda attrs=both, **kw: tvmgrad.run("lu_unpack_grad", {**good, **kw}, attrs)  # noqa: E731
    run()
    for name, bad, msg in (("l", rand((2, 3, 4), "float64"), r"l has shape \[2, 3, 4\], expected \[2, 3, 3\]"),
                           ("u", rand((1, 3, 4), "float64"), r"u has shape \[1, 3, 4\], expected \[2, 3, 4\]"),
                           ("pmat", rand((2, 4, 4), "float64"), r"pmat has shape \[2, 4, 4\], expected \[2, 3, 3\]"),
                           ("y", piv[:, :2], r"(y|pivots) has shape \[2, 2\], expected \[2, 3\]")):
        with pytest.raises(ValueError, match=rf"lu_unpack_grad: {msg}"):
            run(**{name: bad})
    with pytest.raises(ValueError, match=r"lu_unpack_grad: pmat has dtype float32 but x has float64"):
        run(pmat=good["pmat"].astype(np.float32))
    with pytest.raises(ValueError, match=r"lu_unpack_grad: l has dtype float32 but x has float64"):
        run(l=good["l"].astype(np.float32))
    with pytest.raises(ValueError, match=r"lu_unpack_grad: (y|pivots) has dtype float64"):
        run(y=piv.astype(np.float64))
    with pytest.raises(ValueError, match=r"lu_unpack_grad: input 'y' holds 0\.\.0; LU pivots are 1-based"):
        run(y=piv * 0)
    no_piv = {"unpack_ludata": True, "unpack_pivots": False}
    run(no_piv, pmat=np.zeros((0,), np.float32))             # the forward's placeholder, any dtype
    run(no_piv, pmat=np.zeros((0,), np.int64))
    run(no_piv)                                             # or the full matrix
    with pytest.raises(ValueError, match=r"lu_unpack_grad: pmat has shape \[2, 2\]; with unpack_pivots=False"):
        run(no_piv, pmat=np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"lu_unpack_grad: attribute 'unpack_ludata' is False"):
        run({"unpack_ludata": False, "unpack_pivots": True})


BATCH_CASES = {
    # op: (inputs builder given a batch shape, the inputs that carry the batch)
    "det_grad": (lambda b: (lambda x: {"x": x, "out": np.linalg.det(x), "out_grad": rand(b, "float64", 2)})(
        wellcond(b + (3, 3), "float64")), ("out", "out_grad")),
    "slogdet_grad": (lambda b: (lambda x: {"x": x, "out": np.stack(np.linalg.slogdet(x)),
                                           "out_grad": rand((2,) + b, "float64", 2)})(wellcond(b + (3, 3), "float64")),
                     ("out", "out_grad")),
    "inverse_grad": (lambda b: {"out": wellcond(b + (3, 3), "float64"), "out_grad": rand(b + (3, 3), "float64", 1)},
                     ("out_grad",)),
    "matrix_power_grad": (lambda b: {"x": wellcond(b + (3, 3), "float64"), "out": rand(b + (3, 3), "float64"),
                                     "out_grad": rand(b + (3, 3), "float64", 1)}, ("x", "out", "out_grad")),
    "cholesky_grad": (lambda b: {"out": chol(b + (3, 3), "float64"), "out_grad": rand(b + (3, 3), "float64", 1)},
                      ("out_grad",)),
    "eigh_grad": (lambda b: {"out_w": rand(b + (3,), "float64"), "out_v": rand(b + (3, 3), "float64"),
                             "out_w_grad": rand(b + (3,), "float64"), "out_v_grad": rand(b + (3, 3), "float64")},
                  ("out_w", "out_v", "out_w_grad", "out_v_grad")),
    "eigvalsh_grad": (lambda b: {"eigenvectors": rand(b + (3, 3), "float64"), "eigenvalues_grad": rand(b + (3,), "float64")},
                      ("eigenvalues_grad",)),
    "qr_grad": (lambda b: {"x": rand(b + (4, 3), "float64"), "q": rand(b + (4, 3), "float64"), "r": rand(b + (3, 3), "float64"),
                           "q_grad": rand(b + (4, 3), "float64"), "r_grad": rand(b + (3, 3), "float64")},
                ("x", "q", "r", "q_grad", "r_grad")),
    "svd_grad": (lambda b: svd_inputs(b + (4, 3), "float64", False), ("x", "u", "vh", "s", "u_grad", "vh_grad", "s_grad")),
    "lu_grad": (lambda b: (lambda lu_piv: {"x": lu_piv[0], "out": lu_piv[0], "pivots": lu_piv[1],
                                           "out_grad": rand(b + (3, 3), "float64", 1)})(lu_factor(rand(b + (3, 3), "float64"))),
                ("out", "pivots", "out_grad")),
    "solve_grad": (lambda b: {"x": wellcond(b + (3, 3), "float64"), "y": rand(b + (3, 2), "float64"),
                              "out": rand(b + (3, 2), "float64"), "out_grad": rand(b + (3, 2), "float64", 1)},
                   ("out", "out_grad")),
    "triangular_solve_grad": (lambda b: {"x": wellcond(b + (3, 3), "float64"), "y": rand(b + (3, 2), "float64"),
                                         "out": rand(b + (3, 2), "float64"), "out_grad": rand(b + (3, 2), "float64", 1)},
                              ("out", "out_grad")),
    "cholesky_solve_grad": (lambda b: {"x": rand(b + (3, 2), "float64"), "y": chol(b + (3, 3), "float64"),
                                       "out": rand(b + (3, 2), "float64"), "out_grad": rand(b + (3, 2), "float64", 1)},
                            ("out", "out_grad")),
}
BATCH_ATTRS = {"matrix_power_grad": {"n": 2}, "cholesky_grad": {"upper": False}, "qr_grad": {"mode": "reduced"},
               "svd_grad": {"full_matrices": False}, "lu_grad": {"pivot": True}, "cholesky_solve_grad": {"upper": False},
               "triangular_solve_grad": {"upper": True, "transpose": False, "unitriangular": False},
               "eigvalsh_grad": {"uplo": "L", "is_test": False}}


SOLVES = (("solve_grad", "x_grad", "y_grad"), ("triangular_solve_grad", "x_grad", "y_grad"),
          ("cholesky_solve_grad", "y_grad", "x_grad"))      # (op, the matrix's grad, the rhs's)


def _no_rhs_results():
    """{op: {output: [shape, any nonzero]}} of each solve with 0 right-hand sides."""
    out = {}
    for op, _, _ in SOLVES:
        inputs = {k: np.ascontiguousarray(v[..., :0]) if v.shape[-1] == 2 else v
                  for k, v in BATCH_CASES[op][0]((2,)).items()}
        res = tvmgrad.run(op, inputs, BATCH_ATTRS.get(op, {}))
        out[op] = {k: [list(v.shape), bool(v.any())] for k, v in res.items()}
    return out


def test_solves_with_no_right_hand_sides_in_a_child_process():
    """Solves of a system with 0 right-hand sides: the matrix's grad is 0 (an empty sum) and the
    right-hand side's is empty. In a child process: cholesky_solve_grad once divided by its
    0 column strips sizing its buffers (SIGFPE)."""
    got = in_child_process("test_linalg", "_no_rhs_results")
    for op, matrix, rhs in SOLVES:
        assert got[op] == {matrix: [[2, 3, 3], False], rhs: [[2, 3, 0], False]}, (op, got[op])


@pytest.mark.parametrize("op", sorted(BATCH_CASES))
@pytest.mark.sweep
def test_batch_dims_must_match(op):
    """Every tensor's batch dims are checked against the others' (Paddle's kernels assume them
    equal): an extra, missing or size-1 batch dim that would broadcast is a ValueError naming the
    input, before any build. Only solve-like ops broadcast x against y; their out/out_grad must
    have the broadcast batch."""
    make, carriers = BATCH_CASES[op]
    attrs = BATCH_ATTRS.get(op, {})
    good = make((2,))
    tvmgrad.prepare(op, good, attrs)
    lead = {"slogdet_grad": 1}.get(op, 0)
    for name in carriers:
        a = good[name]
        for bad in (np.stack([a, a], axis=lead),                    # an extra batch dim
                    np.take(a, 0, axis=lead),                       # a missing one
                    np.take(a, [0], axis=lead)):                    # size 1 (would broadcast)
            with pytest.raises(ValueError, match=rf"{op}: .*{name}"):
                tvmgrad.prepare(op, {**good, name: bad}, attrs)


def test_solve_like_ops_still_broadcast_x_and_y():
    x, y = wellcond((1, 3, 3), "float64"), rand((4, 3, 2), "float64")
    out = np.linalg.solve(x, y)
    g = rand((4, 3, 2), "float64", 1)
    got = tvmgrad.run("solve_grad", {"x": x, "y": y, "out": out, "out_grad": g})
    want = c_ops("solve_grad", {"x": np.broadcast_to(x, (4, 3, 3)).copy(), "y": y, "out": out, "out_grad": g}, {})
    close("solve_grad x_grad", got["x_grad"], want["x_grad"].sum(0, keepdims=True))
    close("solve_grad y_grad", got["y_grad"], want["y_grad"])


def test_eigvalsh_grad_uplo_and_shapes_checked():
    v = rand((2, 3, 3), "float64")
    g = rand((2, 3), "float64")
    for uplo in ("L", "U"):
        tvmgrad.run("eigvalsh_grad", {"eigenvectors": v, "eigenvalues_grad": g}, {"uplo": uplo, "is_test": False})
    for uplo in ("bogus", "l", ""):
        with pytest.raises(ValueError, match=r"eigvalsh_grad: attribute 'uplo' is .*; it must be 'L' or 'U'"):
            tvmgrad.run("eigvalsh_grad", {"eigenvectors": v, "eigenvalues_grad": g}, {"uplo": uplo, "is_test": False})


def test_svd_qr_factor_shapes_checked():
    inputs = svd_inputs((2, 4, 3), "float64", False)
    with pytest.raises(ValueError, match=r"svd_grad: 'u' has shape \[2, 4, 4\]; .*full_matrices=False\) its dim -1 must be 3"):
        tvmgrad.run("svd_grad", {**inputs, "u": rand((2, 4, 4), "float64"), "u_grad": rand((2, 4, 4), "float64")},
                    {"full_matrices": False})
    full = svd_inputs((2, 4, 3), "float64", True)
    with pytest.raises(ValueError, match=r"svd_grad: 'u' has shape \[2, 4, 4\]; .*full_matrices=False"):
        tvmgrad.run("svd_grad", full, {"full_matrices": False})
    qr = BATCH_CASES["qr_grad"][0]((2,))
    with pytest.raises(ValueError, match=r"qr_grad: 'q' has shape \[2, 4, 3\]; .*mode='complete'\) its dim -1 must be 4"):
        tvmgrad.run("qr_grad", {**qr, "x": rand((2, 4, 5), "float64")[..., :4, :4]}, {"mode": "complete"})
    with pytest.raises(ValueError, match=r"qr_grad: 'x' has shape \[3\]; it needs at least 2 dims"):
        tvmgrad.run("qr_grad", {**qr, "x": rand((3,), "float64")}, {"mode": "reduced"})


def test_linear_grads_adjoint_identity():
    """⟨A x, y⟩ = ⟨x, Aᵀ y⟩ in float64 for the parts of the forwards that are linear: lu_unpack
    in the packed factors, solve / triangular_solve in y, cholesky_solve in x."""
    m, n = 4, 6
    x = rand((m, n), "complex128", 34)
    dl, du = rand((m, m), "complex128", 35), rand((m, n), "complex128", 36)
    grad = tvmgrad.run("lu_unpack_grad", {"x": x, "y": np.arange(1, m + 1, dtype=np.int32), "l": dl, "u": du,
                                          "pmat": dl, "l_grad": dl, "u_grad": du})["x_grad"]
    assert np.isclose(inner(np.tril(x[:, :m], -1), dl) + inner(np.triu(x), du), inner(x, grad))
    a, y, g = wellcond((2, 4, 4), "float64", 37), rand((2, 4, 3), "float64", 38), rand((2, 4, 3), "float64", 39)
    out = np.linalg.solve(a, y)
    gy = tvmgrad.run("solve_grad", {"x": a, "y": y, "out": out, "out_grad": g})["y_grad"]
    assert np.isclose(inner(np.linalg.solve(a, y), g), inner(y, gy))
    for upper, tr, unit in ((True, False, False), (False, True, True), (False, False, True)):
        gy = tvmgrad.run("triangular_solve_grad", {"x": a, "y": y, "out": out, "out_grad": g},
                         {"upper": upper, "transpose": tr, "unitriangular": unit})["y_grad"]
        assert np.isclose(inner(_tri_solve(a, y, upper, tr, unit), g), inner(y, gy))
    f = chol((2, 4, 4), "float64", 40)
    gx = tvmgrad.run("cholesky_solve_grad", {"x": y, "y": f, "out": out, "out_grad": g}, {"upper": False})["x_grad"]
    assert np.isclose(inner(np.linalg.solve(f @ H(f), y), g), inner(y, gx))


# ------------------------------------------------------------------------------------------
# QR, SVD, eigendecompositions

@pytest.mark.parametrize(*sweep("case,dtype", [[((2, 5, 3), "reduced"), ((2, 3, 5), "reduced"), ((2, 3, 5), "complete"),
                                                ((2, 4, 4), "reduced"), ((4, 4), "complete")], ALL],
                                  lambda c, d: d in ("float64", "complex128") or c == ((2, 3, 5), "reduced")))
@pytest.mark.sweep
def test_qr_grad(case, dtype):
    shape, mode = case
    x = rand(shape, dtype, 41)
    q, r = np.linalg.qr(x, mode=mode)
    check("qr_grad", {"x": x, "q": q.astype(dtype), "r": r.astype(dtype), "q_grad": rand(q.shape, dtype, 42),
                      "r_grad": rand(r.shape, dtype, 43)}, {"mode": mode}, dtype=dtype)


def test_qr_grad_modes_paddle_does_not_differentiate():
    x = rand((5, 3), "float64")
    q, r = np.linalg.qr(x, mode="complete")
    with pytest.raises(ValueError, match=r"qr_grad: the derivative of qr is not implemented when mode='complete' and m > n"):
        tvmgrad.run("qr_grad", {"x": x, "q": q, "r": r, "q_grad": q, "r_grad": r}, {"mode": "complete"})
    with pytest.raises(ValueError, match=r"qr_grad: the derivative of qr is not implemented when mode='r'"):
        tvmgrad.run("qr_grad", {"x": x, "q": q[:, :3], "r": r[:3], "q_grad": q[:, :3], "r_grad": r[:3]}, {"mode": "r"})
    with pytest.raises(ValueError, match=r"qr_grad: attribute 'mode' is 'full'"):
        tvmgrad.run("qr_grad", {"x": x, "q": q, "r": r, "q_grad": q, "r_grad": r}, {"mode": "full"})


def gauge_fix(u, gu):
    """Cotangents whose loss does not depend on the phases of the singular vectors (the complex
    SVD grad is only defined for those): Im diag(U^H gU) = 0."""
    d = np.imag(np.diagonal(H(u) @ gu, axis1=-2, axis2=-1))
    return gu - u * (1j * d)[..., None, :]


def svd_inputs(shape, dtype, full, seed=44):
    x = rand(shape, dtype, seed)
    u, s, vh = np.linalg.svd(x, full_matrices=full)
    u, s, vh = u.astype(dtype), s.astype(real_of(dtype)), vh.astype(dtype)
    gu, gs, gvh = rand(u.shape, dtype, seed + 1), rand(s.shape, real_of(dtype), seed + 2), rand(vh.shape, dtype, seed + 3)
    if dtype.startswith("complex"):
        k = s.shape[-1]
        gu[..., :k] = gauge_fix(u[..., :k], gu[..., :k])
        gvh[..., :k, :] = H(gauge_fix(H(vh[..., :k, :]), H(gvh[..., :k, :])))
    return {"x": x, "u": u, "vh": vh, "s": s, "u_grad": gu, "vh_grad": gvh, "s_grad": gs}


@pytest.mark.parametrize(*sweep("shape,full,dtype", [[(2, 5, 3), (2, 3, 5), (3, 3)], [False, True], ALL],
                                  lambda s, f, d: (d == "float64" or (s == (2, 5, 3) and not f))
                                  and (d != "complex128" or not f)))
@pytest.mark.sweep
def test_svd_grad(shape, full, dtype):
    inputs = svd_inputs(shape, dtype, full)
    oracle = per_matrix("svd_grad", tuple(inputs), nb=1) if dtype.startswith("complex") and len(shape) == 3 else None
    check("svd_grad", inputs, {"full_matrices": full}, dtype=dtype, oracle=oracle)


@pytest.mark.parametrize("absent", [("u_grad",), ("vh_grad",), ("s_grad",), ("u_grad", "vh_grad"),
                                    ("u_grad", "vh_grad", "s_grad")])
def test_svd_grad_optional_grads(absent):
    inputs = svd_inputs((2, 4, 3), "float64", False, 48)
    for a in absent:
        inputs[a] = None
    if len(absent) == 3:     # Paddle returns a zero tensor of shape [1]; the grad is zeros like x
        out = tvmgrad.run("svd_grad", inputs, {"full_matrices": False})["x_grad"]
        assert out.shape == (2, 4, 3) and not out.any()
        return
    check("svd_grad", inputs, {"full_matrices": False})


def test_svd_grad_complex_matches_torch():
    """An independent check of the complex gauge handling (Paddle is the oracle in test_svd_grad);
    PyTorch comes with the ``bench`` extra."""
    torch = pytest.importorskip("torch")
    x = rand((4, 3), "complex128", 49)
    xt = torch.tensor(x, requires_grad=True)
    u, s, vh = torch.linalg.svd(xt, full_matrices=False)
    inputs = {"x": x, "u": u.detach().numpy(), "vh": vh.detach().numpy(), "s": s.detach().numpy()}
    gu = gauge_fix(inputs["u"], rand((4, 3), "complex128", 50))
    gvh = H(gauge_fix(H(inputs["vh"]), H(rand((3, 3), "complex128", 51))))
    gs = rand((3,), "float64", 52)
    loss = (torch.real((torch.tensor(gu).conj() * u).sum()) + (torch.tensor(gs) * s).sum()
            + torch.real((torch.tensor(gvh).conj() * vh).sum()))
    loss.backward()
    ours = tvmgrad.run("svd_grad", {**inputs, "u_grad": gu, "vh_grad": gvh, "s_grad": gs}, {"full_matrices": False})
    close("svd_grad vs torch", ours["x_grad"], xt.grad.numpy())


@pytest.mark.parametrize("dtype", ALL)
def test_eigh_eigvalsh_grad(dtype):
    """Paddle's batched CPU kernels are right for the first matrix only: the oracle is Paddle per
    matrix (and the batched call is shown to differ)."""
    b = rand((3, 4, 4), dtype, 53)
    w, v = np.linalg.eigh(b + H(b))
    w, v = w.astype(real_of(dtype)), v.astype(dtype)
    inputs = {"out_w": w, "out_v": v, "out_w_grad": rand((3, 4), real_of(dtype), 54), "out_v_grad": rand((3, 4, 4), dtype, 55)}
    ours = check("eigh_grad", inputs, dtype=dtype, oracle=per_matrix("eigh_grad", tuple(inputs)))["x_grad"]
    if dtype == "float64":
        batched = c_ops("eigh_grad", inputs, {})["x_grad"]
        close("eigh_grad first matrix", ours[0], batched[0])
        assert np.abs(batched[1:] - ours[1:]).max() > 1e-3
    ev = {"eigenvectors": v, "eigenvalues_grad": inputs["out_w_grad"]}
    for uplo in ("L", "U"):
        check("eigvalsh_grad", ev, {"uplo": uplo, "is_test": False}, dtype=dtype,
              oracle=per_matrix("eigvalsh_grad", tuple(ev)))


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_eig_grad(dtype):
    w, v = np.linalg.eig(rand((3, 4, 4), "float64", 56))
    w, v = w.astype(dtype), v.astype(dtype)
    inputs = {"out_w": w, "out_v": v, "out_w_grad": rand((3, 4), dtype, 57), "out_v_grad": rand((3, 4, 4), dtype, 58)}
    check("eig_grad", inputs, dtype=dtype, oracle=per_matrix("eig_grad", tuple(inputs)))
    if dtype == "complex128":
        batched = c_ops("eig_grad", inputs, {})["x_grad"]
        assert np.abs(batched[1:] - tvmgrad.run("eig_grad", inputs)["x_grad"][1:]).max() > 1e-3


# ------------------------------------------------------------------------------------------
# half types (tvmgrad computes them in float32; Paddle has no half kernels for these grads)

HALF_CASES = {
    "inverse_grad": lambda dt: {"out": np.linalg.inv(wellcond((2, 3, 3), "float64")), "out_grad": rand((2, 3, 3), "float64", 1)},
    "det_grad": lambda dt: (lambda x: {"x": x, "out": np.linalg.det(x), "out_grad": rand((2,), "float64", 2)})(wellcond((2, 3, 3), "float64")),
    "cholesky_grad": lambda dt: {"out": chol((2, 4, 4), "float64"), "out_grad": rand((2, 4, 4), "float64", 3)},
    "svd_grad": lambda dt: svd_inputs((2, 4, 3), "float64", False),
    "triangular_solve_grad": lambda dt: (lambda x, y: {"x": x, "y": y, "out": _tri_solve(x, y, True, False, False),
                                                       "out_grad": rand((2, 3, 2), "float64", 4)})(wellcond((2, 3, 3), "float64"), rand((2, 3, 2), "float64", 5)),
    "lu_unpack_grad": lambda dt: {"x": rand((3, 4), "float64"), "y": np.array([1, 2, 3], np.int32), "l": rand((3, 3), "float64"),
                                  "u": rand((3, 4), "float64"), "pmat": rand((3, 3), "float64"),
                                  "l_grad": rand((3, 3), "float64", 6), "u_grad": rand((3, 4), "float64", 7)},
}
HALF_ATTRS = {"cholesky_grad": {"upper": False}, "svd_grad": {"full_matrices": False},
              "triangular_solve_grad": {"upper": True, "transpose": False, "unitriangular": False}}


@pytest.mark.parametrize(*sweep("op,dtype", [sorted(HALF_CASES), ["float16", "bfloat16"]],
                                  lambda o, d: d == "float16" or o in ("inverse_grad", "svd_grad")))
def test_half_types(op, dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    inputs = {k: (v.astype(dt) if v.dtype.kind == "f" else v) for k, v in HALF_CASES[op](dtype).items()}
    attrs = HALF_ATTRS.get(op, {})
    ours = tvmgrad.run(op, inputs, attrs)
    want = half_oracle(op, dt)(inputs, attrs)
    for k, w in want.items():
        assert ours[k].dtype == dt
        close(f"{op}.{k}[{dtype}]", ours[k].astype(np.float32), w.astype(np.float32),
              rtol=RTOL[dtype] * (4 if op == "svd_grad" else 1))


# ------------------------------------------------------------------------------------------
# bad input

def test_errors_name_op_and_argument():
    x = rand((3, 4), "float64")
    with pytest.raises(ValueError, match=r"inverse_grad: out must be a batch of square matrices"):
        tvmgrad.run("inverse_grad", {"out": x, "out_grad": x})
    with pytest.raises(ValueError, match=r"det_grad: 'x' has shape \[3, 4\], which does not match"):
        tvmgrad.run("det_grad", {"x": x, "out": np.ones(()), "out_grad": np.ones(())})
    sq = wellcond((2, 3, 3), "float64")
    with pytest.raises(ValueError, match=r"solve_grad: batch dims: shapes do not broadcast"):
        tvmgrad.run("solve_grad", {"x": sq, "y": rand((3, 3, 2), "float64"), "out": rand((3, 3, 2), "float64"),
                                   "out_grad": rand((3, 3, 2), "float64")})
    with pytest.raises(TypeError, match=r"solve_grad: input 'y' has dtype complex128"):
        tvmgrad.run("solve_grad", {"x": sq, "y": sq + 0j, "out": sq, "out_grad": sq})
    with pytest.raises(TypeError, match=r"svd_grad: input 's' has dtype float32; it must be float64"):
        inputs = svd_inputs((4, 3), "float64", False)
        inputs["s"] = inputs["s"].astype(np.float32)
        tvmgrad.run("svd_grad", inputs, {"full_matrices": False})
    with pytest.raises(ValueError, match=r"eig_grad: out_v has dtype float64; eig's eigenvectors are complex"):
        tvmgrad.run("eig_grad", {"out_w": sq[:, 0], "out_v": sq, "out_w_grad": sq[:, 0], "out_v_grad": sq})
    with pytest.raises(ValueError, match=r"eigvalsh_grad: eigenvalues_grad has shape \[2, 2\], expected \[2, 3\]"):
        tvmgrad.run("eigvalsh_grad", {"eigenvectors": sq, "eigenvalues_grad": sq[:, 0, :2]})
    with pytest.raises(ValueError, match=r"lu_unpack_grad: l_grad has shape \[3, 4\], expected \[3, 3\]"):
        tvmgrad.run("lu_unpack_grad", {"x": x, "y": np.ones(3, np.int32), "l": x, "u": x, "pmat": x,
                                       "l_grad": x, "u_grad": x})
    with pytest.raises(ValueError, match=r"cholesky_solve_grad: 'y' has shape \[2, 4, 4\], which does not match"):
        tvmgrad.run("cholesky_solve_grad", {"x": rand((2, 3, 2), "float64"), "y": rand((2, 4, 4), "float64"),
                                            "out": rand((2, 3, 2), "float64"), "out_grad": rand((2, 3, 2), "float64")},
                    {"upper": False})
