"""Grads of special functions: gamma family, polygamma, erfinv, modified Bessel I0/I1.

The special functions themselves live in ``_special`` (TVM has none of them). Where Paddle's
kernels are exact copies of a known algorithm (Cephes Bessel series, Paddle's zeta) they are
mirrored, coefficient set per dtype included; edge values (poles, ±0, ±inf, NaN) follow what
Paddle 3.3.1 returns. Paddle's half-precision kernels compute in float32, as these do.
"""

import math

from tvmgrad.lazy import tirx

from tvmgrad.families import pointwise

from ._math import const, dtype_of, where
from ._special import Seq, digamma, i0e, i1, i1e, polygamma, tgamma


@pointwise
def digamma_grad(x, out_grad):
    """x_grad = out_grad · ψ′(x)  (trigamma; +inf at 0, negative integers and -inf; NaN at +inf)"""
    return out_grad * polygamma(1, x)


@pointwise
def lgamma_grad(x, out_grad):
    """x_grad = out_grad · ψ(x)  (ψ(+0) = -inf, ψ(-0) = +inf, NaN at negative integers)"""
    return out_grad * digamma(x)


@pointwise
def gammaln_grad(x, out_grad):
    """x_grad = out_grad · ψ(x)  (ψ(+0) = -inf, ψ(-0) = +inf, NaN at negative integers)"""
    return out_grad * digamma(x)


MAX_POLYGAMMA_ORDER = 1000   # ψ⁽ⁿ⁾ is built as a degree-n expression: beyond this, no kernel


def _polygamma_check(call, outs):
    n = call.attrs["n"]
    if not 0 <= n <= MAX_POLYGAMMA_ORDER:
        raise ValueError(f"{call.op}: attribute 'n' = {n} is out of range [0, "
                         f"{MAX_POLYGAMMA_ORDER}] (the order of the derivative; ψ⁽ⁿ⁺¹⁾ is "
                         f"generated as an expression of degree n, and overflows float64 for "
                         f"n > 170 except at very large x)")


@pointwise(validate=_polygamma_check)
def polygamma_grad(x, out_grad, n):
    """x_grad = out_grad · ψ⁽ⁿ⁺¹⁾(x)  (±inf at 0, negative integers and -inf; NaN at +inf)"""
    return out_grad * polygamma(n + 1, x)


@pointwise
def gammaincc_grad(x, y, out_grad):
    """y_grad = -out_grad · exp(-y) · y^(x-1) / Γ(x)   (x: the shape a, y: the argument)"""
    return out_grad * -tirx.exp(-y) * tirx.pow(y, x - 1.0) / tgamma(x)


@pointwise
def erfinv_grad(out, out_grad):
    """x_grad = √π/2 · out_grad · exp(out²)"""
    return (0.5 * math.sqrt(math.pi)) * out_grad * tirx.exp(out * out)


@pointwise
def i0_grad(x, out_grad):
    """x_grad = out_grad · I1(x)"""
    return i1(x) * out_grad


@pointwise
def i0e_grad(x, out, out_grad):
    """x_grad = out_grad · (i1e(x) - sign(x) · out)   (sign(±0) = ±1)"""
    return (i1e(x) - tirx.copysign(const(1.0, x), x) * out) * out_grad


def _eps(x):
    """Machine epsilon of the compute dtype (Paddle's I1 grads return out_grad/2 for |x| ≤ eps)."""
    return 2.220446049250313e-16 if dtype_of(x) == "float64" else 1.1920928955078125e-07


@pointwise
def i1_grad(x, out, out_grad):
    """x_grad = out_grad · (I0(x) - out / x)   (out_grad / 2 for |x| ≤ machine epsilon)"""
    seq = Seq("i1g")
    ax = seq.let(tirx.abs(x))
    d = tirx.exp(ax) * i0e(x) - out / x
    return seq.done(where(ax <= _eps(x), 0.5 * out_grad, d * out_grad))


@pointwise
def i1e_grad(x, out, out_grad):
    """x_grad = out_grad · (i0e(x) - out · (sign(x) + 1/x))   (out_grad / 2 for |x| ≤ epsilon)"""
    sgn = tirx.copysign(const(1.0, x), x)
    d = i0e(x) - out * (sgn + 1.0 / x)
    return where(tirx.abs(x) <= _eps(x), 0.5 * out_grad, d * out_grad)
