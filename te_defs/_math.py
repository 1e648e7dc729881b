"""Scalar helpers for formulas: typed constants, select, the basics TVM lacks, and elementary
functions that take real or complex scalars alike (``tvmgrad.families.complex.Complex``), so one
formula serves both (Paddle's complex grads are out_grad · conj(f'(x)))."""

from __future__ import annotations

import numbers

from tvmgrad.lazy import tirx

from tvmgrad.families.complex import Complex

__all__ = ["dtype_of", "const", "where", "sign", "square", "conj", "real", "imag", "cabs",
           "exp", "log", "sin", "cos", "tan", "sinh", "cosh", "tanh", "sqrt", "reciprocal"]


def dtype_of(expr) -> str:
    """The dtype of a scalar expr (TVM 0.27 keeps it in ``expr.ty``); a Complex's component dtype."""
    return expr.dtype if isinstance(expr, Complex) else str(expr.ty)


def const(value, like):
    """A constant of ``like``'s dtype (``like`` an expr or a dtype string)."""
    return tirx.const(value, like if isinstance(like, str) else dtype_of(like))


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


def sin(z):
    if not isinstance(z, Complex):
        return tirx.sin(z)
    return Complex(tirx.sin(z.re) * tirx.cosh(z.im), tirx.cos(z.re) * tirx.sinh(z.im))


def cos(z):
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
