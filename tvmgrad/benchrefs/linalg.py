"""PyTorch references for the linear-algebra and FFT grads, with the issue's benchmark inputs
(``INPUTS``): svd_grad and cholesky_grad on a batch of 64 matrices of 64 x 64, fft_c2c_grad on
2**20 points. The PyTorch timings are of the backward only (the forward runs once, outside)."""

from __future__ import annotations

import numpy as np

from ..examples import np_dtype

BATCH, N = 64, 64
FFT_POINTS = 2 ** 20


def _svd_inputs(size, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, N, N))
    u, s, vh = np.linalg.svd(x, full_matrices=False)
    d = np_dtype(dtype)
    g = lambda *shape: rng.standard_normal(shape).astype(d)  # noqa: E731
    return ({"x": x.astype(d), "u": u.astype(d), "vh": vh.astype(d), "s": s.astype(d),
             "u_grad": g(BATCH, N, N), "vh_grad": g(BATCH, N, N), "s_grad": g(BATCH, N)},
            {"full_matrices": False})


def _cholesky_inputs(size, dtype):
    rng = np.random.default_rng(0)
    b = rng.standard_normal((BATCH, N, N))
    lo = np.linalg.cholesky(b @ np.swapaxes(b, -1, -2) + N * np.eye(N))
    d = np_dtype(dtype)
    return {"out": lo.astype(d), "out_grad": rng.standard_normal((BATCH, N, N)).astype(d)}, {"upper": False}


def _fft_inputs(size, dtype):
    rng = np.random.default_rng(0)
    cd = "complex128" if dtype == "float64" else "complex64"
    g = (rng.standard_normal(FFT_POINTS) + 1j * rng.standard_normal(FFT_POINTS)).astype(cd)
    return {"out_grad": g}, {"axes": [0], "normalization": "backward", "forward": True}


INPUTS = {"svd_grad": _svd_inputs, "cholesky_grad": _cholesky_inputs, "fft_c2c_grad": _fft_inputs}


def _svd(t, a):
    import torch
    x = t["x"].detach().requires_grad_()
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    grads = [t["u_grad"], t["s_grad"], t["vh_grad"]]
    return lambda: torch.autograd.grad([u, s, vh], [x], grads, retain_graph=True)


def _cholesky(t, a):
    import torch
    lo = t["out"]
    lo = lo.transpose(-1, -2) if a.get("upper") else lo
    x = (lo @ lo.transpose(-1, -2)).detach().requires_grad_()
    out = torch.linalg.cholesky(x, upper=bool(a.get("upper")))
    return lambda: torch.autograd.grad(out, [x], t["out_grad"], retain_graph=True)


def _fft_c2c(t, a):
    import torch
    g = t["out_grad"]
    if not torch.is_complex(g):
        g = g.to(torch.complex64)
    axes = list(a["axes"])
    # the adjoint of fft (norm "backward") is the unnormalised inverse transform
    if a["forward"]:
        norm = {"backward": "forward", "forward": "backward", "ortho": "ortho"}[a["normalization"]]
        return lambda: torch.fft.ifftn(g, dim=axes, norm=norm)
    return lambda: torch.fft.fftn(g, dim=axes, norm={"backward": "forward", "forward": "backward",
                                                     "ortho": "ortho"}[a["normalization"]])


TORCH = {"svd_grad": _svd, "cholesky_grad": _cholesky, "fft_c2c_grad": _fft_c2c}


# ------------------------------------------------------------------------------------------
# small valid inputs for every other op of the family (``tvmgrad check --build`` calls the
# makers with a tiny size; the generic flat-array inputs are not valid for these ops)

def _cast(value, dtype):
    """Real arrays to ``dtype``; complex ones to the complex dtype of its precision."""
    value = np.asarray(value)
    if value.dtype.kind == "c":
        return value.astype("complex128" if dtype == "float64" else "complex64")
    if value.dtype.kind == "f":
        return value.astype(np_dtype(dtype))
    return value


def _small(fn):
    def make(size, dtype):
        inputs, attrs = fn(np.random.default_rng(0))
        return {k: _cast(v, dtype) for k, v in inputs.items()}, attrs
    return make


def _c(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _wc(rng, *shape):
    return rng.standard_normal(shape) + shape[-1] * np.eye(shape[-1])


def _chol(rng, *shape):
    b = rng.standard_normal(shape)
    return np.linalg.cholesky(b @ np.swapaxes(b, -1, -2) + shape[-1] * np.eye(shape[-1]))


def _lu(x):
    from ..examples.linalg import lu_factor   # numpy getrf (packed LU, 1-based int32 pivots)
    return lu_factor(x)


def _inv(r):
    x = _wc(r, 3, 4, 4)
    return {"out": np.linalg.inv(x), "out_grad": r.standard_normal((3, 4, 4))}, {}


def _det(r):
    x = _wc(r, 3, 4, 4)
    return {"x": x, "out": np.linalg.det(x), "out_grad": r.standard_normal(3)}, {}


def _slogdet(r):
    x = _wc(r, 3, 4, 4)
    return {"x": x, "out": np.stack(np.linalg.slogdet(x)), "out_grad": r.standard_normal((2, 3))}, {}


def _mpow(r):
    x = _wc(r, 3, 4, 4) / 4
    return {"x": x, "out": np.linalg.matrix_power(x, 3), "out_grad": r.standard_normal((3, 4, 4))}, {"n": 3}


def _solve(r):
    x, y = _wc(r, 3, 4, 4), r.standard_normal((3, 4, 2))
    return {"x": x, "y": y, "out": np.linalg.solve(x, y), "out_grad": r.standard_normal((3, 4, 2))}, {}


def _tri(r):
    x, y = np.triu(_wc(r, 3, 4, 4)), r.standard_normal((3, 4, 2))
    return ({"x": x, "y": y, "out": np.linalg.solve(x, y), "out_grad": r.standard_normal((3, 4, 2))},
            {"upper": True, "transpose": False, "unitriangular": False})


def _chol_small(r):
    return {"out": _chol(r, 3, 4, 4), "out_grad": r.standard_normal((3, 4, 4))}, {"upper": False}


def _chol_solve(r):
    lo, x = _chol(r, 3, 4, 4), r.standard_normal((3, 4, 2))
    return ({"x": x, "y": lo, "out": np.linalg.solve(lo @ np.swapaxes(lo, -1, -2), x),
             "out_grad": r.standard_normal((3, 4, 2))}, {"upper": False})


def _lu_grad(r):
    x = r.standard_normal((3, 4, 4))
    lu, piv = _lu(x)
    return {"x": x, "out": lu, "pivots": piv, "out_grad": r.standard_normal((3, 4, 4))}, {"pivot": True}


def _lu_unpack(r):
    x = r.standard_normal((3, 4, 4))
    lu, piv = _lu(x)
    return ({"x": lu, "y": piv, "l": x, "u": x, "pmat": x, "l_grad": r.standard_normal((3, 4, 4)),
             "u_grad": r.standard_normal((3, 4, 4))}, {"unpack_ludata": True, "unpack_pivots": True})


def _qr(r):
    x = r.standard_normal((3, 5, 4))
    q, rr = np.linalg.qr(x)
    return ({"x": x, "q": q, "r": rr, "q_grad": r.standard_normal((3, 5, 4)), "r_grad": r.standard_normal((3, 4, 4))},
            {"mode": "reduced"})


def _svd_small(r):
    x = r.standard_normal((3, 5, 4))
    u, s, vh = np.linalg.svd(x, full_matrices=False)
    return ({"x": x, "u": u, "vh": vh, "s": s, "u_grad": r.standard_normal((3, 5, 4)),
             "vh_grad": r.standard_normal((3, 4, 4)), "s_grad": r.standard_normal((3, 4))}, {"full_matrices": False})


def _eigh(r):
    b = r.standard_normal((3, 4, 4))
    w, v = np.linalg.eigh(b + np.swapaxes(b, -1, -2))
    return {"out_w": w, "out_v": v, "out_w_grad": r.standard_normal((3, 4)), "out_v_grad": r.standard_normal((3, 4, 4))}, {}


def _eigvalsh(r):
    b = r.standard_normal((3, 4, 4))
    _, v = np.linalg.eigh(b + np.swapaxes(b, -1, -2))
    return {"eigenvectors": v, "eigenvalues_grad": r.standard_normal((3, 4))}, {"uplo": "L", "is_test": False}


def _eig(r):
    w, v = np.linalg.eig(r.standard_normal((3, 4, 4)) + 0j)
    return {"out_w": w, "out_v": v, "out_w_grad": _c(r, 3, 4), "out_v_grad": _c(r, 3, 4, 4)}, {}


def _fft_small(r):
    return {"out_grad": _c(r, 4, 6, 8)}, {"axes": [1, 2], "normalization": "ortho", "forward": True}


def _r2c(r):
    return ({"x": r.standard_normal((4, 8)), "out_grad": _c(r, 4, 5)},
            {"axes": [1], "normalization": "backward", "forward": True, "onesided": True})


def _c2r(r):
    return ({"out_grad": r.standard_normal((4, 6))},
            {"axes": [1], "normalization": "backward", "forward": False, "last_dim_size": 6})


def _complex_grad(r):
    return {"real": r.standard_normal((4, 6)), "imag": r.standard_normal((4, 6)), "out_grad": _c(r, 4, 6)}, {}


def _angle(r):
    return {"x": _c(r, 4, 6), "out_grad": r.standard_normal((4, 6))}, {}


SMALL = {"inverse_grad": _inv, "det_grad": _det, "slogdet_grad": _slogdet, "matrix_power_grad": _mpow,
         "solve_grad": _solve, "triangular_solve_grad": _tri, "cholesky_solve_grad": _chol_solve,
         "lu_grad": _lu_grad, "lu_unpack_grad": _lu_unpack, "qr_grad": _qr, "eigh_grad": _eigh,
         "eigvalsh_grad": _eigvalsh, "eig_grad": _eig, "fft_r2c_grad": _r2c, "fft_c2r_grad": _c2r,
         "complex_grad": _complex_grad, "angle_grad": _angle,
         "as_complex_grad": lambda r: ({"out_grad": _c(r, 4, 6)}, {}),
         "as_real_grad": lambda r: ({"out_grad": r.standard_normal((4, 6, 2))}, {}),
         "conj_grad": lambda r: ({"out_grad": _c(r, 4, 6)}, {})}
INPUTS.update({op: _small(fn) for op, fn in SMALL.items()})


def _bench_or_small(big, small):
    """The issue's benchmark inputs for a benchmark-sized request, small ones for a check."""
    def make(size, dtype):
        return big(size, dtype) if size >= 4096 else _small(small)(size, dtype)
    return make


INPUTS["svd_grad"] = _bench_or_small(_svd_inputs, _svd_small)
INPUTS["cholesky_grad"] = _bench_or_small(_cholesky_inputs, _chol_small)
INPUTS["fft_c2c_grad"] = _bench_or_small(_fft_inputs, _fft_small)
