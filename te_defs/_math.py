"""Scalar helpers for formulas: typed constants, casts, select, the basics TVM lacks, and
elementary functions that take real or complex scalars alike (``tvmgrad.families.complex.Complex``),
so one formula serves both (Paddle's complex grads are out_grad · conj(f'(x)))."""

from __future__ import annotations

import numbers

import numpy as np

from tvmgrad.lazy import tirx

from tvmgrad.dtypes import is_integer
from tvmgrad.families.complex import Complex

__all__ = ["dtype_of", "is_int", "const", "cast", "f32", "f64", "mul_f32", "float_attr", "where", "sign",
           "square", "conj", "real", "imag", "cabs", "exp", "log", "sin", "cos", "tan", "sinh",
           "cosh", "tanh", "sqrt", "reciprocal"]


def dtype_of(expr) -> str:
    """The dtype of a scalar expr (TVM 0.27 keeps it in ``expr.ty``); a Complex's component dtype."""
    return expr.dtype if isinstance(expr, Complex) else str(expr.ty)


def is_int(expr) -> bool:
    """An integer or bool scalar (not a Complex): its formula follows C++ integer arithmetic."""
    return not isinstance(expr, Complex) and is_integer(dtype_of(expr))


def const(value, like):
    """A constant of ``like``'s dtype (``like`` an expr or a dtype string)."""
    return tirx.const(value, like if isinstance(like, str) else dtype_of(like))


def cast(v, dtype: str):
    """``v`` (a Python number, a TIR expression or a te.Tensor element) as ``dtype``."""
    if isinstance(v, (int, float)):
        return tirx.const(v, dtype)
    if hasattr(v, "asobject"):
        v = v.asobject()
    return v if str(v.ty) == dtype else v.astype(dtype)


def f32(v):
    """``v`` as float32 (``cast``)."""
    return cast(v, "float32")


def f64(v):
    """``v`` as float64 (``cast``)."""
    return cast(v, "float64")


def mul_f32(a, b):
    """The IEEE float32 product of two float32 values, immune to FMA contraction with a following
    add (LLVM and nvcc fuse a·b+c): the float64 product of float32 values is exact, rounding it
    to float32 is the float32 product, and the rounding step cannot be fused."""
    return f32(f64(a) * f64(b))


def float_attr(v, dtype: str | None = None):
    """A ``float`` attribute ``v`` (a scalar in the compute dtype) as Paddle's kernels see it: a
    C++ float, i.e. rounded to float32 (a no-op unless ``v`` is float64), in ``dtype`` (default:
    v's own). A constant is rounded here: TVM folds cast(float32, FloatImm) without rounding the
    value it keeps."""
    own = dtype_of(v)
    dtype = dtype or own
    if own != "float64":
        return v if dtype == own else v.astype(dtype)
    if isinstance(v, tirx.FloatImm):
        return tirx.const(float(np.float32(v.value)), dtype)
    return v.astype("float32").astype(dtype)


def _typed(a, b):
    if isinstance(a, numbers.Number) and not isinstance(b, numbers.Number):
        a = const(a, b)
    if isinstance(b, numbers.Number) and not isinstance(a, numbers.Number):
        b = const(b, a)
    return a, b


def where(cond, a, b):
    """``a`` where ``cond`` else ``b`` (a select; both sides are cheap scalars here)."""
    a, b = _typed(a, b)
    return tirx.Select(cond, a, b)


def sign(x):
    """-1, 0 or 1; 0 for NaN (note: Paddle's own ``sign`` gives NaN for NaN)."""
    one, zero = const(1, x), const(0, x)
    return tirx.Select(x > zero, one, tirx.Select(x < zero, -one, zero))


def square(x):
    return x * x


# -- real or complex -------------------------------------------------------------------------

def conj(z):
    return z.conj() if isinstance(z, Complex) else z


def real(z):
    return z.re if isinstance(z, Complex) else z


def imag(z):
    return z.im if isinstance(z, Complex) else const(0.0, z)


def cabs(z):
    """|z| (a real scalar)."""
    return tirx.hypot(z.re, z.im) if isinstance(z, Complex) else tirx.abs(z)


def exp(z):
    if not isinstance(z, Complex):
        return tirx.exp(z)
    r = tirx.exp(z.re)
    return Complex(r * tirx.cos(z.im), r * tirx.sin(z.im))


def log(z):
    if not isinstance(z, Complex):
        return tirx.log(z)
    return Complex(tirx.log(tirx.hypot(z.re, z.im)), tirx.atan2(z.im, z.re))


def _int_of_double(fn, x):
    """C++ ``fn(x)`` for an integer x as Paddle's Sine<T>/Cosine<T> give it: computed in double,
    converted back to x's type (truncated toward 0)."""
    return fn(f64(x)).astype(dtype_of(x))


def sin(z):
    if is_int(z):
        return _int_of_double(tirx.sin, z)
    if not isinstance(z, Complex):
        return tirx.sin(z)
    return Complex(tirx.sin(z.re) * tirx.cosh(z.im), tirx.cos(z.re) * tirx.sinh(z.im))


def cos(z):
    if is_int(z):
        return _int_of_double(tirx.cos, z)
    if not isinstance(z, Complex):
        return tirx.cos(z)
    return Complex(tirx.cos(z.re) * tirx.cosh(z.im), -(tirx.sin(z.re) * tirx.sinh(z.im)))


def tan(z):
    return tirx.tan(z) if not isinstance(z, Complex) else sin(z) / cos(z)


def sinh(z):
    if not isinstance(z, Complex):
        return tirx.sinh(z)
    return Complex(tirx.sinh(z.re) * tirx.cos(z.im), tirx.cosh(z.re) * tirx.sin(z.im))


def cosh(z):
    if not isinstance(z, Complex):
        return tirx.cosh(z)
    return Complex(tirx.cosh(z.re) * tirx.cos(z.im), tirx.sinh(z.re) * tirx.sin(z.im))


def tanh(z):
    return tirx.tanh(z) if not isinstance(z, Complex) else sinh(z) / cosh(z)


def sqrt(z):
    """Principal square root."""
    if not isinstance(z, Complex):
        return tirx.sqrt(z)
    r = tirx.hypot(z.re, z.im)
    half = const(0.5, z.re)
    re = tirx.sqrt((r + z.re) * half)
    im = tirx.sqrt((r - z.re) * half)
    return Complex(re, where(z.im < 0, -im, im))


def reciprocal(z):
    if not isinstance(z, Complex):
        return const(1.0, z) / z
    den = z.re * z.re + z.im * z.im
    return Complex(z.re / den, -z.im / den)


# -- complex helpers (linear algebra / complex issue) ------------------------------------------

def is_cplx(z) -> bool:
    return isinstance(z, Complex)


def cselect(cond, a, b):
    """``a`` where ``cond`` else ``b`` for real or complex scalars (a Complex if either is)."""
    if isinstance(a, Complex) or isinstance(b, Complex):
        like = a if isinstance(a, Complex) else b
        a, b = like._lift(a) if not isinstance(a, Complex) else a, like._lift(b) if not isinstance(b, Complex) else b
        return Complex(where(cond, a.re, b.re), where(cond, a.im, b.im))
    return where(cond, a, b)


def cpow(z, e):
    """z ** e for complex z and a real exponent e: exp(e · log z) evaluated as polar(exp(e·log|z|),
    e·arg z), as Paddle does (so 0 ** e is 0 for e > 0, NaN for e <= 0)."""
    if not isinstance(z, Complex):
        return tirx.pow(z, e)
    r = tirx.exp(e * tirx.log(tirx.hypot(z.re, z.im)))
    t = e * tirx.atan2(z.im, z.re)
    return Complex(r * tirx.cos(t), r * tirx.sin(t))


def cdiv(a, b):
    """a / b for real or complex scalars; a complex divisor by Smith's algorithm (no overflow of
    |b|², and x / inf = 0 as std::complex division, which Paddle uses; x / 0 is NaN + NaN·i, as
    Paddle's kernels give)."""
    if not isinstance(b, Complex):
        return a / b
    if not isinstance(a, Complex):
        a = b._lift(a)
    big = tirx.abs(b.re) >= tirx.abs(b.im)
    one = const(1.0, b.re)
    # |re| >= |im|: r = im/re, den = re + im·r;  else r = re/im, den = im + re·r
    r = where(big, b.im / where(b.re == const(0.0, b.re), one, b.re), b.re / where(b.im == const(0.0, b.im), one, b.im))
    den = where(big, b.re + b.im * r, b.im + b.re * r)
    re = where(big, a.re + a.im * r, a.re * r + a.im) / den
    im = where(big, a.im - a.re * r, a.im * r - a.re) / den
    nan = const(float("nan"), b.re)
    zero = tirx.And(b.re == const(0.0, b.re), b.im == const(0.0, b.im))
    return Complex(where(zero, nan, re), where(zero, nan, im))       # x / 0: NaN, as Paddle
