"""Scalar helpers for formulas: typed constants, select, and the basics TVM lacks."""

from __future__ import annotations

import numbers

from tvmgrad.lazy import tirx

__all__ = ["dtype_of", "const", "where", "sign", "square"]


def dtype_of(expr) -> str:
    """The dtype of a scalar expr (TVM 0.27 keeps it in ``expr.ty``)."""
    return str(expr.ty)


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
    """-1, 0 or 1 (0 for NaN, like Paddle's sign)."""
    one, zero = const(1, x), const(0, x)
    return tirx.Select(x > zero, one, tirx.Select(x < zero, -one, zero))


def square(x):
    return x * x
