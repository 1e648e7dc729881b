"""Sample calls of the complex-number, linear-algebra and FFT grads (te_defs/complex_ops.py,
linalg.py, fft.py) for the generic tests (CUDA builds, AOT, check --build).

Float inputs are float64 (the generic tests cast them); complex inputs stay complex128 (casting
leaves them alone), index inputs int32. Every call is valid: factors come from numpy's
decompositions of well-conditioned matrices.
"""

import numpy as np

from . import factory


def _c(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _r(rng, *shape):
    return rng.standard_normal(shape)


def _wellcond(rng, *shape):
    n = shape[-1]
    return rng.standard_normal(shape) + n * np.eye(n)


# -- complex numbers ---------------------------------------------------------------------------

@factory("complex_grad")
def _(rng):
    return {"real": _r(rng, 4, 6), "imag": _r(rng, 4, 6), "out_grad": _c(rng, 4, 6)}, {}


@factory("angle_grad")
def _(rng):
    return {"x": _c(rng, 4, 6), "out_grad": _r(rng, 4, 6)}, {}


@factory("as_complex_grad")
def _(rng):
    return {"out_grad": _c(rng, 4, 6)}, {}


@factory("as_real_grad")
def _(rng):
    return {"out_grad": _r(rng, 4, 6, 2)}, {}


@factory("conj_grad")
def _(rng):
    return {"out_grad": _c(rng, 4, 6)}, {}


# -- linear algebra ----------------------------------------------------------------------------

@factory("inverse_grad")
def _(rng):
    x = _wellcond(rng, 3, 5, 5)
    return {"out": np.linalg.inv(x), "out_grad": _r(rng, 3, 5, 5)}, {}


@factory("det_grad")
def _(rng):
    x = _wellcond(rng, 3, 5, 5)
    return {"x": x, "out": np.linalg.det(x), "out_grad": _r(rng, 3)}, {}


@factory("slogdet_grad")
def _(rng):
    x = _wellcond(rng, 3, 5, 5)
    return {"x": x, "out": np.stack(np.linalg.slogdet(x)), "out_grad": _r(rng, 2, 3)}, {}


@factory("matrix_power_grad")
def _(rng):
    x = _wellcond(rng, 3, 4, 4) / 4
    return {"x": x, "out": np.linalg.matrix_power(x, -3), "out_grad": _r(rng, 3, 4, 4)}, {"n": -3}


@factory("solve_grad")
def _(rng):
    x, y = _wellcond(rng, 3, 4, 4), _r(rng, 3, 4, 2)
    return {"x": x, "y": y, "out": np.linalg.solve(x, y), "out_grad": _r(rng, 3, 4, 2)}, {}


@factory("triangular_solve_grad")
def _(rng):
    x, y = np.triu(_wellcond(rng, 3, 4, 4)), _r(rng, 3, 4, 2)
    return {"x": x, "y": y, "out": np.linalg.solve(x, y), "out_grad": _r(rng, 3, 4, 2)}, \
        {"upper": True, "transpose": False, "unitriangular": False}


def _chol(rng, *shape):
    b = rng.standard_normal(shape)
    return np.linalg.cholesky(b @ np.swapaxes(b, -1, -2) + shape[-1] * np.eye(shape[-1]))


@factory("cholesky_grad")
def _(rng):
    return {"out": _chol(rng, 3, 5, 5), "out_grad": _r(rng, 3, 5, 5)}, {"upper": False}


@factory("cholesky_solve_grad")
def _(rng):
    lo, x = _chol(rng, 3, 4, 4), _r(rng, 3, 4, 2)
    out = np.linalg.solve(lo @ np.swapaxes(lo, -1, -2), x)
    return {"x": x, "y": lo, "out": out, "out_grad": _r(rng, 3, 4, 2)}, {"upper": False}


def lu_factor(x):
    """LAPACK-style packed LU with partial pivoting and 1-based int32 pivots (getrf, what
    ``scipy.linalg.lu_factor`` returns, plus one), batched over the leading axes, in numpy: row
    ``j`` swaps with row ``pivots[j] - 1``, the largest at or below it in column ``j`` by LAPACK's
    measure (``|x|``; ``|re| + |im|`` for complex x, as i?amax)."""
    a = np.array(x, copy=True, order="C")
    *batch, m, n = a.shape
    k = min(m, n)
    a = a.reshape(-1, m, n)
    every = np.arange(a.shape[0])
    pivots = np.empty((a.shape[0], k), np.int32)
    for j in range(k):
        col = a[:, j:, j]
        size = np.abs(col.real) + np.abs(col.imag) if np.iscomplexobj(col) else np.abs(col)
        p = j + np.argmax(size, axis=1)
        pivots[:, j] = p + 1
        row = a[every, j].copy()
        a[every, j] = a[every, p]
        a[every, p] = row
        a[:, j + 1:, j] /= a[:, j, j][:, None]
        a[:, j + 1:, j + 1:] -= a[:, j + 1:, j, None] * a[:, j, None, j + 1:]
    return a.reshape(x.shape), pivots.reshape(*batch, k)


@factory("lu_grad")
def _(rng):
    x = _r(rng, 3, 4, 4)
    lu, piv = lu_factor(x)
    return {"x": x, "out": lu, "pivots": piv, "out_grad": _r(rng, 3, 4, 4)}, {"pivot": True}


@factory("lu_unpack_grad")
def _(rng):
    x = _r(rng, 3, 4, 5)
    lu, piv = lu_factor(x[..., :4])
    lu = np.concatenate([lu, x[..., 4:]], axis=-1)
    return {"x": lu, "y": piv, "l": _r(rng, 3, 4, 4), "u": _r(rng, 3, 4, 5), "pmat": _r(rng, 3, 4, 4),
            "l_grad": _r(rng, 3, 4, 4), "u_grad": _r(rng, 3, 4, 5)}, {"unpack_ludata": True, "unpack_pivots": True}


@factory("qr_grad")
def _(rng):
    x = _r(rng, 3, 5, 4)
    q, r = np.linalg.qr(x)
    return {"x": x, "q": q, "r": r, "q_grad": _r(rng, 3, 5, 4), "r_grad": _r(rng, 3, 4, 4)}, {"mode": "reduced"}


@factory("svd_grad")
def _(rng):
    x = _r(rng, 3, 5, 4)
    u, s, vh = np.linalg.svd(x, full_matrices=False)
    return {"x": x, "u": u, "vh": vh, "s": s, "u_grad": _r(rng, 3, 5, 4), "vh_grad": _r(rng, 3, 4, 4),
            "s_grad": _r(rng, 3, 4)}, {"full_matrices": False}


@factory("eigh_grad")
def _(rng):
    b = _r(rng, 3, 4, 4)
    w, v = np.linalg.eigh(b + np.swapaxes(b, -1, -2))
    return {"out_w": w, "out_v": v, "out_w_grad": _r(rng, 3, 4), "out_v_grad": _r(rng, 3, 4, 4)}, {}


@factory("eigvalsh_grad")
def _(rng):
    b = _r(rng, 3, 4, 4)
    _, v = np.linalg.eigh(b + np.swapaxes(b, -1, -2))
    return {"eigenvectors": v, "eigenvalues_grad": _r(rng, 3, 4)}, {"uplo": "L", "is_test": False}


@factory("eig_grad")
def _(rng):
    w, v = np.linalg.eig(_r(rng, 3, 4, 4) + 0j)
    return {"out_w": w, "out_v": v, "out_w_grad": _c(rng, 3, 4), "out_v_grad": _c(rng, 3, 4, 4)}, {}


# -- FFT -----------------------------------------------------------------------------------------

@factory("fft_c2c_grad")
def _(rng):
    return {"out_grad": _c(rng, 4, 6, 8)}, {"axes": [1, 2], "normalization": "ortho", "forward": True}


@factory("fft_r2c_grad")
def _(rng):
    return {"x": _r(rng, 4, 8), "out_grad": _c(rng, 4, 5)}, \
        {"axes": [1], "normalization": "backward", "forward": True, "onesided": True}


@factory("fft_c2r_grad")
def _(rng):
    return {"out_grad": _r(rng, 4, 6)}, \
        {"axes": [1], "normalization": "backward", "forward": False, "last_dim_size": 6}
