"""InferMetas of the complex-number, linear-algebra and FFT grads (Paddle's phi/infermeta/*.cc).

Dtypes follow Paddle's kernels: real_grad/imag_grad make a complex grad from a real one, eig_grad
is complex even for a real forward input, fft_c2r_grad is complex, fft_r2c_grad real.
"""

from __future__ import annotations

from . import MetaError, TensorMeta, broadcast_shapes, register
from ._common import need as _need

_TO_COMPLEX = {"float32": "complex64", "float64": "complex128",
               "float16": "complex64", "bfloat16": "complex64"}   # (no complex32: half -> complex64)
_TO_REAL = {"complex64": "float32", "complex128": "float64"}


def to_complex(name: str, what: str) -> str:
    if name in _TO_REAL:
        return name
    if name not in _TO_COMPLEX:
        raise MetaError(f"{what} has dtype {name}; expected a float or complex dtype")
    return _TO_COMPLEX[name]


def to_real(name: str) -> str:
    return _TO_REAL.get(name, name)


def _matrix(meta: TensorMeta, what: str, square: bool = False, min_rank: int = 2) -> TensorMeta:
    if meta.ndim < min_rank:
        raise MetaError(f"{what} must have rank >= {min_rank} (a batch of matrices), got shape "
                        f"{list(meta.shape)}")
    if square and meta.shape[-1] != meta.shape[-2]:
        raise MetaError(f"{what} must be a batch of square matrices, got shape {list(meta.shape)}")
    return meta


def _same(a: TensorMeta, b: TensorMeta, wa: str, wb: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise MetaError(f"{wb} has shape {list(b.shape)}, expected {list(a.shape)} (the shape of {wa})")


def _same_dtype(a: TensorMeta, b: TensorMeta, wa: str, wb: str) -> None:
    if a.dtype != b.dtype:
        raise MetaError(f"{wb} has dtype {b.dtype.name} but {wa} has {a.dtype.name}; they must match")


# ------------------------------------------------------------------------------------------
# complex numbers

@register
def RealAndImagGradInferMeta(out_grad):
    """x_grad: out_grad's shape, the complex dtype of its precision."""
    g = _need(out_grad, "out_grad")
    return (TensorMeta(g.shape, to_complex(g.dtype.name, "out_grad")),)


@register
def ComplexGradInferMeta(real, imag, out_grad):
    """real_grad = real's meta, imag_grad = imag's meta (out_grad has their broadcast shape)."""
    x, y, g = _need(real, "real"), _need(imag, "imag"), _need(out_grad, "out_grad")
    shape = broadcast_shapes(x.shape, y.shape, names=("real", "imag"))
    if tuple(g.shape) != tuple(shape):
        raise MetaError(f"out_grad has shape {list(g.shape)}, expected {list(shape)} (real and imag "
                        f"broadcast)")
    return x, y


@register
def AsRealInferMeta(x):
    """out: x's shape + [2], the real dtype of x."""
    x = _need(x, "x")
    return (TensorMeta(tuple(x.shape) + (2,), to_real(x.dtype.name)),)


@register
def AsComplexInferMeta(x):
    """out: x's shape without its last dim (which must be 2), complex."""
    x = _need(x, "x")
    if x.ndim < 1 or x.shape[-1] != 2:
        raise MetaError(f"x must have a last dim of size 2 (real, imag pairs), got shape {list(x.shape)}")
    return (TensorMeta(tuple(x.shape[:-1]), to_complex(x.dtype.name, "x")),)


# ------------------------------------------------------------------------------------------
# linear algebra

@register
def InverseGradInferMeta(out, out_grad):
    """x_grad: out_grad's shape, out's dtype."""
    o, g = _need(out, "out"), _need(out_grad, "out_grad")
    _matrix(o, "out", square=True)
    _same(o, g, "out", "out_grad")
    _same_dtype(o, g, "out", "out_grad")
    return (TensorMeta(g.shape, o.dtype),)


@register
def EigGradInferMeta(out_w, out_v, out_w_grad, out_v_grad):
    """x_grad: out_v's meta (complex, even for a real forward input)."""
    w, v = _need(out_w, "out_w"), _need(out_v, "out_v")
    _matrix(v, "out_v", square=True)
    if tuple(w.shape) != tuple(v.shape[:-1]):
        raise MetaError(f"out_w has shape {list(w.shape)}, expected {list(v.shape[:-1])} (out_v's "
                        f"eigenvalues)")
    if v.dtype.name not in _TO_REAL:
        raise MetaError(f"out_v has dtype {v.dtype.name}; eig's eigenvectors are complex")
    for name, m, ref in (("out_w", w, v), ("out_w_grad", out_w_grad, w), ("out_v_grad", out_v_grad, v)):
        _need(m, name)
        if name != "out_w":
            _same(ref, m, "out_w" if ref is w else "out_v", name)
        _same_dtype(v, m, "out_v", name)
    return (TensorMeta(v.shape, v.dtype),)


@register
def EigvalshGradInferMeta(eigenvectors, eigenvalues_grad, uplo, is_test):
    """x_grad: eigenvectors' meta; uplo is 'L' or 'U' (which triangle the forward read)."""
    if uplo not in ("L", "U"):
        raise MetaError(f"attribute 'uplo' is {uplo!r}; it must be 'L' or 'U'")
    v, g = _need(eigenvectors, "eigenvectors"), _need(eigenvalues_grad, "eigenvalues_grad")
    _matrix(v, "eigenvectors", square=True)
    if tuple(g.shape) != tuple(v.shape[:-1]):
        raise MetaError(f"eigenvalues_grad has shape {list(g.shape)}, expected {list(v.shape[:-1])} "
                        f"(eigenvectors {list(v.shape)} without its last dim)")
    if g.dtype.name != to_real(v.dtype.name):
        raise MetaError(f"eigenvalues_grad has dtype {g.dtype.name}; for eigenvectors of dtype "
                        f"{v.dtype.name} it must be {to_real(v.dtype.name)}")
    return (v,)


@register
def LUGradInferMeta(x, out, pivots, out_grad, pivot):
    """x_grad: x's meta."""
    x = _need(x, "x")
    _matrix(x, "x")
    for name, m in (("out", out), ("out_grad", out_grad)):
        _same(x, _need(m, name), "x", name)
        _same_dtype(x, m, "x", name)
    p = _need(pivots, "pivots")
    k = min(x.shape[-2], x.shape[-1])
    if tuple(p.shape) != tuple(x.shape[:-2]) + (k,):
        raise MetaError(f"pivots has shape {list(p.shape)}, expected {list(x.shape[:-2]) + [k]}")
    return (x,)


@register
def LUUnpackGradInferMeta(x, pivots, l, u, pmat, l_grad, u_grad, unpack_ludata, unpack_pivots):
    """x_grad: x's meta. x [*, m, n] (k = min(m, n)); pivots [*, k] (int); l, l_grad [*, m, k];
    u, u_grad [*, k, n], in x's dtype; pmat [*, m, m] in x's dtype when unpack_pivots, else the
    empty placeholder the forward returns (any dtype: it is not read). unpack_ludata=False (no L,
    U: nothing to differentiate; Paddle 3.3.1's kernel fails on the empty grads) is refused."""
    x = _need(x, "x")
    _matrix(x, "x")
    if not unpack_ludata:
        raise MetaError("attribute 'unpack_ludata' is False: the forward returns no L and U, so "
                        "there is nothing to differentiate (Paddle 3.3.1's kernel fails on the "
                        "empty l_grad/u_grad)")
    m, n = x.shape[-2], x.shape[-1]
    k = min(m, n)
    batch = tuple(x.shape[:-2])
    for name, meta, shape in (("l_grad", l_grad, batch + (m, k)), ("u_grad", u_grad, batch + (k, n)),
                              ("l", l, batch + (m, k)), ("u", u, batch + (k, n))):
        meta = _need(meta, name)
        if tuple(meta.shape) != shape:
            raise MetaError(f"{name} has shape {list(meta.shape)}, expected {list(shape)} from x "
                            f"{list(x.shape)}")
        _same_dtype(x, meta, "x", name)
    # (the op's argument is y: the caller renames this function's parameters in messages)
    p = _need(pivots, "pivots")
    if p.dtype.name not in ("int32", "int64"):
        raise MetaError(f"pivots has dtype {p.dtype.name}; it must be int32 or int64")
    if tuple(p.shape) != batch + (k,):
        raise MetaError(f"pivots has shape {list(p.shape)}, expected {list(batch + (k,))} from x "
                        f"{list(x.shape)}")
    pm = _need(pmat, "pmat")
    full = batch + (m, m)
    if unpack_pivots:
        if tuple(pm.shape) != full:
            raise MetaError(f"pmat has shape {list(pm.shape)}, expected {list(full)} from x "
                            f"{list(x.shape)}")
        _same_dtype(x, pm, "x", "pmat")
    elif tuple(pm.shape) != full and 0 not in tuple(pm.shape):
        raise MetaError(f"pmat has shape {list(pm.shape)}; with unpack_pivots=False it is the "
                        f"forward's empty placeholder (e.g. [0]) or the full {list(full)}")
    return (x,)


# ------------------------------------------------------------------------------------------
# FFT

@register
def FFTC2RGradInferMeta(out_grad, axes, normalization, forward, last_dim_size):
    """x_grad: out_grad's shape with the last FFT axis n // 2 + 1 (n = last_dim_size if > 0, else
    out_grad's size there), complex."""
    g = _need(out_grad, "out_grad")
    if not axes:
        raise MetaError("attribute 'axes' must not be empty")
    ax = axes[-1] + g.ndim if axes[-1] < 0 else axes[-1]
    if not 0 <= ax < g.ndim:
        raise MetaError(f"attribute 'axes' = {list(axes)}: axis {axes[-1]} is out of range for "
                        f"out_grad of rank {g.ndim}")
    if last_dim_size < 0:
        raise MetaError(f"attribute 'last_dim_size' is {last_dim_size}; it must be >= 0 (0: out_grad's "
                        f"size along the last axis)")
    n = last_dim_size if last_dim_size > 0 else g.shape[ax]
    shape = list(g.shape)
    shape[ax] = n // 2 + 1
    return (TensorMeta(tuple(shape), to_complex(g.dtype.name, "out_grad")),)
