"""Grads of broadcasting binary math ops.

Paddle multiplies ``out_grad`` by a 0/1 mask (``dout * (x >= y)``) rather than selecting, so a NaN
or infinite ``out_grad`` gives NaN in the output that gets "no" gradient. TVM folds ``g * 0.0``
to ``0``, so the masks here are ``g * Select(cond, 1, 0)`` (which it keeps).
"""

from tvmgrad.lazy import tirx

from tvmgrad.families import pointwise

from ._math import const, where


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


@pointwise
def copysign_grad(x, y, out_grad):
    """x_grad = x == 0 ? 0 : out_grad · copysign(x, y) / x,  y_grad = 0"""
    return where(x == 0, 0.0, out_grad * (tirx.copysign(x, y) / x)), 0.0


@pointwise
def fmax_grad(x, y, out_grad):
    """x_grad = out_grad · [x ≥ y or isnan(y)],  y_grad = out_grad · [not (x ≥ y or isnan(y))]"""
    to_x = tirx.Or(x >= y, tirx.isnan(y))
    return out_grad * _mask(to_x, x), out_grad * _mask(to_x, x, inverted=True)


@pointwise
def fmin_grad(x, y, out_grad):
    """x_grad = out_grad · [x ≤ y or isnan(y)],  y_grad = out_grad · [not (x ≤ y or isnan(y))]"""
    to_x = tirx.Or(x <= y, tirx.isnan(y))
    return out_grad * _mask(to_x, x), out_grad * _mask(to_x, x, inverted=True)


@pointwise
def heaviside_grad(x, y, out_grad):
    """x_grad = out_grad · 0 (NaN where out_grad is not finite),  y_grad = out_grad · [x == 0]"""
    return where(tirx.isfinite(out_grad), 0.0, const(float("nan"), x)), out_grad * _mask(x == 0, x)


@pointwise(broadcast=("x", "y", "weight"))
def lerp_grad(x, y, weight, out, out_grad):
    """x_grad = Σ (1 - weight) · out_grad,  y_grad = Σ weight · out_grad  (x, y, weight broadcast)"""
    return (1.0 - weight) * out_grad, weight * out_grad
