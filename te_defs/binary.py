"""Grads of broadcasting binary math ops.

Paddle multiplies ``out_grad`` by a 0/1 mask (``dout * (x >= y)``) rather than selecting, so a NaN
or infinite ``out_grad`` gives NaN in the output that gets "no" gradient. TVM folds ``g * 0.0``
to ``0``, so the masks here are ``g * Select(cond, 1, 0)`` (which it keeps).

Integer kernels (the dtypes Paddle registers: int32/int64, and every integer type and bool for
copysign) follow Paddle's C++: the masks in integer arithmetic, copysign as its C++ (see copysign_grad).
"""

from tvmgrad.lazy import tirx

from tvmgrad.dtypes import ALL_INTS, FLOATS, INTS
from tvmgrad.families import pointwise

from ._math import const, dtype_of, f64, is_int, where


def _mask(cond, like, inverted=False):
    """1.0 where ``cond`` else 0.0 (the reverse if ``inverted``), in ``like``'s dtype, to multiply by
    as Paddle does. ``inverted`` swaps the arms instead of negating ``cond``: TVM rewrites
    ``not (x >= y)`` to ``x < y``, which is wrong for NaN."""
    one, zero = const(1.0, like), const(0.0, like)
    return where(cond, zero, one) if inverted else where(cond, one, zero)


@pointwise
def atan2_grad(x, y, out_grad):
    """x_grad = out_grad · y / (x² + y²),  y_grad = -out_grad · x / (x² + y²)"""
    d = x * x + y * y
    return out_grad * y / d, -out_grad * x / d


@pointwise(dtypes=FLOATS + ("bool",) + ALL_INTS)
def copysign_grad(x, y, out_grad):
    """x_grad = x == 0 ? 0 : out_grad · copysign(x, y) / x,  y_grad = 0
    integers, as Paddle's kernel: c = T(copysign(double x, double y)) (so int64 beyond 2⁵³ rounds,
    and +2³¹ converts to INT_MIN as x86 does), then out_grad · (c / x) in T (truncating division,
    wrapping product); bool: the same in int, true where nonzero."""
    if is_int(x):
        if dtype_of(x) == "bool":
            x, y, out_grad = (v.astype("int32") for v in (x, y, out_grad))
        c = tirx.copysign(f64(x), f64(y)).astype(dtype_of(x))
        # x = 0: c = 0, 0 / 1 (no select around it: TVM would drop the guard, so divide by 0)
        return out_grad * tirx.truncdiv(c, where(x == 0, const(1, x), x)), 0
    return where(x == 0, 0.0, out_grad * (tirx.copysign(x, y) / x)), 0.0


@pointwise(dtypes=FLOATS + INTS)
def fmax_grad(x, y, out_grad):
    """x_grad = out_grad · [x ≥ y or isnan(y)],  y_grad = out_grad · [not (x ≥ y or isnan(y))]"""
    to_x = tirx.Or(x >= y, tirx.isnan(y))
    return out_grad * _mask(to_x, x), out_grad * _mask(to_x, x, inverted=True)


@pointwise(dtypes=FLOATS + INTS)
def fmin_grad(x, y, out_grad):
    """x_grad = out_grad · [x ≤ y or isnan(y)],  y_grad = out_grad · [not (x ≤ y or isnan(y))]"""
    to_x = tirx.Or(x <= y, tirx.isnan(y))
    return out_grad * _mask(to_x, x), out_grad * _mask(to_x, x, inverted=True)


@pointwise(dtypes=FLOATS + INTS)
def heaviside_grad(x, y, out_grad):
    """x_grad = out_grad · 0 (NaN where out_grad is not finite),  y_grad = out_grad · [x == 0]"""
    if is_int(x):
        return 0, out_grad * _mask(x == 0, x)
    return where(tirx.isfinite(out_grad), 0.0, const(float("nan"), x)), out_grad * _mask(x == 0, x)


@pointwise(broadcast=("x", "y", "weight"))
def lerp_grad(x, y, weight, out, out_grad):
    """x_grad = Σ (1 - weight) · out_grad,  y_grad = Σ weight · out_grad  (x, y, weight broadcast)"""
    return (1.0 - weight) * out_grad, weight * out_grad
