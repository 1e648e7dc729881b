"""Activation grads.

Semantics follow Paddle 3.3.1's CPU kernels (``phi/kernels/funcs/activation_functor.h``):

* Paddle multiplies the cotangent by a 0/1 mask (``dout * (out > 0)``) rather than selecting, so a
  NaN or infinite cotangent gives NaN where the local derivative is 0. TVM folds ``g * 0.0`` to
  ``0``, so masks here are ``g * Select(cond, 1, 0)`` (which it keeps).
* Paddle's ``float`` attributes reach most of these kernels as C++ ``float``: a float64 kernel
  computes with the attribute rounded to float32 (``_f32``). Those whose kernels take ``double``
  (leaky_relu, softplus, logit) use the value as given.
* Where Paddle's expression overflows on inputs whose gradient is finite (``exp(x)`` of a large
  ``x`` multiplied by a zero mask, ``1 + exp(-x)`` overflowing in silu, celu's unused masked
  terms), the formula here avoids the overflow and gives the gradient (its limit at x = ±inf);
  elsewhere it is Paddle's expression.
"""

import math

import numpy as np
from tvmgrad.lazy import tirx

from tvmgrad.dtypes import COMPLEX, FLOATS
from tvmgrad.families import OpError, pointwise, tensor_op
from tvmgrad.families.complex import Complex

from ._math import conj, const, cselect, dtype_of, exp, float_attr, is_cplx, tanh, where

# Ops for which Paddle 3.3.1 registers complex kernels take complex64/128 too (Paddle's convention
# x_grad = out_grad · conj(f'(x)); checked in tests/test_complex.py). Paddle's complex exp is only
# accurate to ~1e-7 even in complex128, so its silu/logsigmoid/softplus grads are too.
CPLX = FLOATS + COMPLEX


# ------------------------------------------------------------------------------------------
# helpers

def _mask(cond, like):
    """1.0 where ``cond`` else 0.0, in ``like``'s dtype (to multiply by, as Paddle does)."""
    return where(cond, const(1.0, like), const(0.0, like))


def _nonpos(x):
    """x where x <= 0 (or NaN), else 0: the argument of an ``exp`` used only where x <= 0."""
    return where(x > 0, const(0.0, x), x)


def _expm1(y):
    """exp(y) - 1 without cancellation near 0 (Kahan: (u - 1) · y / log(u) with u = exp(y))."""
    u = tirx.exp(y)
    um1 = u - const(1.0, y)
    return where(u == const(1.0, y), y,
                 where(um1 == const(-1.0, y), um1,
                       where(tirx.isinf(u), u, um1 * y / tirx.log(u))))


def _tanh(x):
    """tanh accurate to a few ulp everywhere (TVM's llvm tanh is (1 - e^-2x)/(1 + e^-2x), which
    loses all precision for |x| ≪ 1: tanh(1e-8) = 0 in float32)."""
    em = _expm1(const(-2.0, x) * tirx.abs(x))          # in (-1, 0]
    t = -em / (const(2.0, x) + em)
    return tirx.copysign(t, x)


def _sigmoid(x):
    """1 / (1 + exp(-x)), as Paddle writes it."""
    one = const(1.0, x)
    return one / (one + tirx.exp(-x))


# ------------------------------------------------------------------------------------------
# relu family

@pointwise
def relu_grad(out, out_grad):
    """x_grad = out_grad · [out > 0]"""
    return out_grad * _mask(out > 0, out)


@pointwise
def relu_double_grad(out, grad_x_grad):
    """grad_out_grad = grad_x_grad · [out > 0]"""
    return grad_x_grad * _mask(out > 0, out)


@pointwise
def relu6_grad(out, out_grad):
    """x_grad = out_grad · [0 < out < 6]"""
    return out_grad * _mask(tirx.And(out > 0, out < 6.0), out)


@pointwise
def leaky_relu_grad(x, out_grad, negative_slope):
    """x_grad = out_grad · (x ≥ 0 ? 1 : negative_slope)   (NaN x: out_grad · 0)"""
    one, zero = const(1.0, x), const(0.0, x)
    return out_grad * (negative_slope * where(x < zero, one, zero) + where(x >= zero, one, zero))


@pointwise
def leaky_relu_double_grad(x, grad_x_grad, negative_slope):
    """grad_out_grad = grad_x_grad · (x > 0 ? 1 : negative_slope)   (x = 0 takes the slope here)"""
    one, zero = const(1.0, x), const(0.0, x)
    return grad_x_grad * (where(x > zero, one, zero) + negative_slope * where(x <= zero, one, zero))


@pointwise
def thresholded_relu_grad(x, out_grad, threshold):
    """x_grad = out_grad · [x > threshold]"""
    return out_grad * _mask(x > float_attr(threshold), x)


# ------------------------------------------------------------------------------------------
# exponential linear units

@pointwise
def elu_grad(x, out, out_grad, alpha):
    """x_grad = alpha > 0 ? (out > 0 ? out_grad : out_grad · (out + alpha))
                          : (x > 0 ? out_grad : out_grad · alpha · exp(x))"""
    a = float_attr(alpha)
    pos_alpha = where(out > 0, out_grad, out_grad * (out + a))
    neg_alpha = where(x > 0, out_grad, out_grad * a * tirx.exp(x))
    return where(a > 0, pos_alpha, neg_alpha)


@pointwise
def elu_double_grad(x, grad_out, grad_x_grad, alpha):
    """x_grad = grad_x_grad · grad_out · alpha · exp(x) · [x ≤ 0],
    grad_out_grad = grad_x_grad · ([x > 0] + alpha · exp(x) · [x ≤ 0])"""
    a = float_attr(alpha)
    e = tirx.exp(_nonpos(x))
    neg = _mask(x <= 0, x)
    return (grad_x_grad * grad_out * a * e * neg,
            grad_x_grad * (_mask(x > 0, x) + a * e * neg))


@pointwise
def celu_grad(x, out_grad, alpha):
    """x_grad = out_grad · (x > 0 ? 1 : exp(x / alpha))"""
    a = float_attr(alpha)
    return out_grad * where(x > 0, const(1.0, x), tirx.exp(x / a))


@pointwise
def celu_double_grad(x, grad_out, grad_x_grad, alpha):
    """x_grad = grad_x_grad · grad_out / alpha · exp(x / alpha) · [x ≤ 0],
    grad_out_grad = grad_x_grad · ([x > 0] + exp(x / alpha) · [x ≤ 0])"""
    a = float_attr(alpha)
    e = tirx.exp(_nonpos(x) / a)
    neg = _mask(x <= 0, x)
    return (grad_x_grad * grad_out / a * e * neg,
            grad_x_grad * (_mask(x > 0, x) + e * neg))


@pointwise
def selu_grad(out, out_grad, scale, alpha):
    """x_grad = out_grad · (out ≤ 0 ? out + scale · alpha : scale)"""
    s = float_attr(scale)
    la = float_attr(float_attr(scale) * float_attr(alpha))      # Paddle forms scale · alpha in float
    return out_grad * where(out <= 0, out + la, s)


# ------------------------------------------------------------------------------------------
# gelu, silu, swiglu

_GELU_C = 0.044715
_M_2_SQRTPI = 1.1283791670955126         # 2/√π
_SQRT1_2 = 0.7071067811865476            # 1/√2
_SQRT_2_OVER_PI = _M_2_SQRTPI * _SQRT1_2  # √(2/π), formed in double as Paddle does


@pointwise
def gelu_grad(x, out_grad, approximate):
    """approximate: y = tanh(√(2/π)·(x + 0.044715·x³)),
                    x_grad = ½·out_grad·(1 + y + (x − x·y²)·(√(2/π) + 3·0.044715·√(2/π)·x²));
    exact: x_grad = out_grad · (½·(1 + erf(x/√2)) + x·exp(−x²/2)/√(2π))"""
    dt = dtype_of(x)
    half, one = const(0.5, dt), const(1.0, dt)
    if approximate:
        np_dt = np.float64 if dt == "float64" else np.float32
        k_alpha = np_dt(_SQRT_2_OVER_PI)
        k_beta = k_alpha * np_dt(_GELU_C) * np_dt(3)          # formed in the kernel's type
        y = _tanh(const(float(k_alpha), dt) * (const(_GELU_C, dt) * (x * x * x) + x))
        return half * out_grad * (one + y + (x - x * (y * y))
                                  * (const(float(k_alpha), dt) + const(float(k_beta), dt) * (x * x)))
    first = half * (one + tirx.erf(x * const(_SQRT1_2, dt)))
    second = tirx.exp(x * x * const(-0.5, dt)) * x * const(0.5 * _M_2_SQRTPI * _SQRT1_2, dt)
    return out_grad * (first + second)


@pointwise(dtypes=CPLX)
def silu_grad(x, out, out_grad):
    """x_grad = out_grad · s · (1 + x · (1 − s)),  s = sigmoid(x)   (`out` is not used);
    the limits 1 and 0 at x = +inf and −inf. Complex: out_grad · conj(s · (1 + x · (1 − s)))"""
    if is_cplx(x):
        s = 1.0 / (1.0 + exp(-x))
        return out_grad * conj(s * (1.0 + x * (1.0 - s)))
    s = _sigmoid(x)
    one = const(1.0, x)
    # x held finite: at ±inf the product x · (1 − s) would be inf · 0; at ±max it is 0 · max,
    # and d the limits 1 and (−)0 (NaN still passes through s)
    big = tirx.max_value(dtype_of(x))
    xf = tirx.max(tirx.min(x, big), -big)
    return out_grad * (s * (one + xf * (one - s)))


@pointwise
def silu_double_grad(x, out, grad_out, grad_x_grad):
    """s = sigmoid(x): x_grad = s · grad_x_grad · grad_out · (2 + (1 − s)·x − out) · (1 − s),
    grad_out_grad = grad_x_grad · s · (1 + (1 − s)·x)"""
    s = _sigmoid(x)
    one = const(1.0, x)
    tmp1 = one - s
    tmp2 = one + tmp1 * x
    return (s * grad_x_grad * grad_out * (one + (tmp2 - out)) * tmp1,
            grad_x_grad * s * tmp2)


def _swiglu_validate(call, outs):
    x = call.meta("x")
    y = call.tensors.get("y")
    g = call.meta("out_grad")
    if y is not None:
        ys = call.meta("y").shape
        if tuple(ys) != tuple(x.shape):
            raise OpError(f"swiglu_grad: y has shape {list(ys)}, it must equal x's {list(x.shape)}")
        if tuple(g.shape) != tuple(x.shape):
            raise OpError(f"swiglu_grad: out_grad has shape {list(g.shape)}, expected {list(x.shape)} "
                          f"(the shape of x and y)")
        return
    if x.ndim == 0:
        raise OpError("swiglu_grad: without y, x must have at least one dim (its last holds both halves)")
    if x.shape[-1] % 2:
        raise OpError(f"swiglu_grad: without y, x's last dim must be even, got {list(x.shape)}")
    want = tuple(x.shape[:-1]) + (x.shape[-1] // 2,)
    if tuple(g.shape) != want:
        raise OpError(f"swiglu_grad: out_grad has shape {list(g.shape)}, expected {list(want)} "
                      f"(half of x's last dim: without y, x holds both halves)")


def _swiglu_terms(a, b, g):
    """(d/da, d/db) of g · a·sigmoid(a)·b, as Paddle's SwiGLUGradFunctor forms them."""
    one = const(1.0, a)
    s = one / (one + tirx.exp(-a))
    t = a * s
    return g * b * s * (one + a - t), g * t


@tensor_op(validate=_swiglu_validate)
def swiglu_grad(x, y, out_grad):
    """out = silu(x)·y:  x_grad = out_grad · y · s · (1 + x − x·s),  y_grad = out_grad · x · s
    (s = sigmoid(x)); without y, x = [a, b] along its last axis and x_grad = [a_grad, b_grad]"""
    from tvm import te

    from tvmgrad.dtypes import dtype as as_dtype, to_compute

    dt = as_dtype(str(x.dtype))

    def load(t, *idx):
        return to_compute(t(*idx), dt)

    if y is not None:
        def body_x(*i):
            return _swiglu_terms(load(x, *i), load(y, *i), load(out_grad, *i))[0].astype(dt.storage)

        def body_y(*i):
            return _swiglu_terms(load(x, *i), load(y, *i), load(out_grad, *i))[1].astype(dt.storage)

        return (te.compute(x.shape, body_x, name="x_grad"),
                te.compute(y.shape, body_y, name="y_grad"))

    n = x.shape[-1] // 2

    def body(*i):
        lead, j = i[:-1], i[-1]
        first = j < n
        j1 = where(first, j, j - n)
        a, b = load(x, *lead, j1), load(x, *lead, j1 + n)
        da, db = _swiglu_terms(a, b, load(out_grad, *lead, j1))
        return where(first, da, db).astype(dt.storage)

    return te.compute(x.shape, body, name="x_grad"), None


# ------------------------------------------------------------------------------------------
# sigmoid family

@pointwise(dtypes=CPLX)
def sigmoid_grad(out, out_grad):
    """x_grad = out_grad · out · (1 − out)   (complex: out_grad · conj(out · (1 − out)))"""
    if is_cplx(out):
        return out_grad * conj(out * (1.0 - out))
    return out_grad * out * (const(1.0, out) - out)


@pointwise(broadcast=(), dtypes=CPLX)
def sigmoid_double_grad(out, fwd_grad_out, grad_x_grad):
    """out_grad = (1 − 2·out) · fwd_grad_out · grad_x_grad,
    fwd_grad_out_grad = (1 − out) · out · grad_x_grad
    (complex: the same expressions, no conjugation, as Paddle's complex kernel)"""
    one, two = const(1.0, out), const(2.0, out)
    return ((one - two * out) * fwd_grad_out * grad_x_grad,
            (one - out) * out * grad_x_grad)


@pointwise(broadcast=(), dtypes=CPLX)
def sigmoid_triple_grad(out, fwd_grad_out, grad_grad_x, grad_out_grad, grad_grad_out_grad):
    """with dout = fwd_grad_out, ddx = grad_grad_x, d_dout = grad_out_grad, d_ddout = grad_grad_out_grad
    (absent: 0):  out_grad = −2·dout·ddx·d_dout + (ddx − 2·out·ddx)·d_ddout,
    fwd_grad_out_grad = (1 − 2·out)·ddx·d_dout,
    grad_grad_x_grad = (1 − 2·out)·dout·d_dout + (1 − out)·out·d_ddout
    (complex: the same expressions, no conjugation, as Paddle's complex kernel)"""
    one, two = const(1.0, out), const(2.0, out)
    dout, ddx, d_dout_new, d_ddout = fwd_grad_out, grad_grad_x, grad_out_grad, grad_grad_out_grad
    d_out_new = -two * dout * ddx * d_dout_new
    d_ddx = (one - two * out) * dout * d_dout_new
    if d_ddout is not None:
        d_out_new = (ddx - two * out * ddx) * d_ddout + d_out_new
        d_ddx = d_ddx + (one - out) * out * d_ddout
    return d_out_new, (one - two * out) * ddx * d_dout_new, d_ddx


@pointwise(dtypes=CPLX)
def logsigmoid_grad(x, out_grad):
    """x_grad = out_grad · exp(−x − m) / (exp(−m) + exp(−x − m)),  m = max(−x, 0)
    (complex: out_grad · conj(1 / (1 + exp(x))))"""
    if is_cplx(x):
        return out_grad * conj(1.0 / (1.0 + exp(x)))
    zero = const(0.0, x)
    m = where(-x > zero, -x, zero)
    e = tirx.exp(-x - m)
    return out_grad * (e / (tirx.exp(-m) + e))


@pointwise
def hardsigmoid_grad(out, out_grad, slope, offset):
    """x_grad = out_grad · [0 < out < 1] · slope"""
    return out_grad * _mask(tirx.And(out > 0, out < 1.0), out) * float_attr(slope)


# ------------------------------------------------------------------------------------------
# shrinks, clips, soft functions

@pointwise
def hardshrink_grad(x, out_grad, threshold):
    """x_grad = out_grad · [x ≤ −threshold or x ≥ threshold]"""
    t = float_attr(threshold)
    return out_grad * _mask(tirx.Or(x <= -t, x >= t), x)


@pointwise
def softshrink_grad(x, out_grad, threshold):
    """x_grad = out_grad · ([x > threshold] + [x < −threshold])"""
    t = float_attr(threshold)
    return out_grad * (_mask(x > t, x) + _mask(x < -t, x))


@pointwise
def hardtanh_grad(x, out_grad, t_min, t_max):
    """x_grad = out_grad · [t_min < x < t_max]"""
    return out_grad * _mask(tirx.And(x > float_attr(t_min), x < float_attr(t_max)), x)


@pointwise(dtypes=CPLX)
def softplus_grad(x, out_grad, beta, threshold):
    """x_grad = beta·x > threshold ? out_grad : out_grad / (1 + exp(−beta·x))
    (complex: Re(beta·x) > threshold ? out_grad : out_grad / conj(1 + exp(−beta·x)))"""
    if is_cplx(x):
        xb = x * beta
        d = out_grad / conj(1.0 + exp(-xb))
        big = xb.re > threshold
        return Complex(where(big, out_grad.re, d.re), where(big, out_grad.im, d.im))
    xb = beta * x
    return where(xb > threshold, out_grad, out_grad / (const(1.0, x) + tirx.exp(-xb)))


@pointwise(dtypes=CPLX)
def softplus_double_grad(x, grad_out, grad_x_grad, beta, threshold):
    """xb = beta·x:  x_grad = xb > threshold ? 0 : grad_x_grad·grad_out·beta·e^xb / (1 + e^xb)²,
    grad_out_grad = xb > threshold ? grad_x_grad : grad_x_grad / (1 + e^−xb)
    (complex: Re(xb) > threshold selects; complex arithmetic, no conjugation, as Paddle)"""
    if is_cplx(x):
        xb = x * beta
        e = exp(xb)
        d = 1.0 + e
        big = xb.re > threshold
        return (cselect(big, 0.0, grad_x_grad * grad_out * beta * e / (d * d)),
                cselect(big, grad_x_grad, grad_x_grad / (1.0 + exp(-xb))))
    one = const(1.0, x)
    xb = beta * x
    e = tirx.exp(where(xb > 0, -xb, xb))        # e^xb / (1 + e^xb)² is even in xb; no overflow
    d = one + e
    return (where(xb > threshold, const(0.0, x), grad_x_grad * grad_out * beta * e / (d * d)),
            where(xb > threshold, grad_x_grad, grad_x_grad / (one + tirx.exp(-xb))))


@pointwise(dtypes=CPLX)
def softsign_grad(x, out_grad):
    """x_grad = out_grad / (1 + |x|)²
    complex: softsign(x) = x / (1 + |x|) is not holomorphic; with a = |x| the grad is
    out_grad · ∂f/∂x + conj(out_grad) · ∂f/∂x̄ = (out_grad · (1 + a/2) − conj(out_grad) · x²/(2a))
    / (1 + a)² (the VJP in Paddle's convention; Paddle 3.3.1 multiplies both terms by out_grad,
    which is not a gradient; NaN at x = 0 as in Paddle)"""
    if is_cplx(x):
        a = tirx.hypot(x.re, x.im)
        d = 1.0 + a
        d2 = d * d
        t1 = out_grad * ((1.0 + 0.5 * a) / d2)
        t2 = conj(out_grad) * (x * x) * (0.5 / (a * d2))
        return t1 - t2
    one = const(1.0, x)
    d = one + tirx.abs(x)
    return out_grad * (one / (d * d))


@pointwise
def logit_grad(x, out_grad, eps):
    """eps = 0: x_grad = x ∉ [0, 1] ? NaN : out_grad / (x·(1 − x));
    else:   x_grad = x ∉ [eps, 1 − eps] ? 0 : out_grad / (x·(1 − x))"""
    one, zero = const(1.0, x), const(0.0, x)
    g = out_grad * (one / ((one - x) * x))
    no_eps = where(tirx.Or(x < zero, x > one), const(float("nan"), x), g)
    with_eps = where(tirx.Or(x < eps, x > one - eps), zero, g)
    return where(eps == zero, no_eps, with_eps)


# ------------------------------------------------------------------------------------------
# tanh family

@pointwise(dtypes=CPLX)
def stanh_grad(x, out_grad, scale_a, scale_b):
    """x_grad = out_grad · a · b · (1 − tanh(a·x)²)   (a, b as float32; complex: out_grad ·
    conj(a · b · (1 − tanh(a·x)²)))"""
    if is_cplx(x):
        a, b = float_attr(scale_a), float_attr(scale_b)
        t = tanh(x * a)
        return out_grad * conj((1.0 - t * t) * (a * b))
    a, b = float_attr(scale_a), float_attr(scale_b)
    t = _tanh(a * x)
    return out_grad * a * b * (const(1.0, x) - t * t)


@pointwise(dtypes=CPLX)
def tanh_grad(out, out_grad):
    """x_grad = out_grad · (1 − out²)   (complex: out_grad · conj(1 − out²))"""
    if is_cplx(out):
        return out_grad * conj(1.0 - out * out)
    return out_grad * (const(1.0, out) - out * out)


@pointwise(dtypes=CPLX)
def tanh_double_grad(out, grad_out, grad_x_grad):
    """out_grad = −2 · grad_out · out · grad_x_grad,  grad_out_grad = (1 − out²) · grad_x_grad
    (complex: the same expressions, no conjugation, as Paddle's complex kernel)"""
    if is_cplx(out):
        return -2.0 * grad_out * out * grad_x_grad, (1.0 - out * out) * grad_x_grad
    return (const(-1.0, out) * grad_out * const(2.0, out) * out * grad_x_grad,
            (const(1.0, out) - out * out) * grad_x_grad)


@pointwise(broadcast=(), dtypes=CPLX)
def tanh_triple_grad(out, grad_out_forward, grad_x_grad_forward, grad_out_new_grad, grad_out_grad_grad):
    """dout = grad_out_forward, ddx = grad_x_grad_forward, d_dout = grad_out_new_grad,
    d_ddout = grad_out_grad_grad (absent: 0):
    out_grad = −2·out·ddx·d_ddout − 2·dout·ddx·d_dout,  grad_out_forward_grad = −2·out·ddx·d_dout,
    grad_x_grad_forward_grad = (1 − out²)·d_ddout − 2·out·dout·d_dout
    (complex: the same expressions, no conjugation, as Paddle's complex kernel)"""
    one, two, m2 = const(1.0, out), const(2.0, out), const(-2.0, out)
    dout, ddx, d_dout_new, d_ddout = grad_out_forward, grad_x_grad_forward, grad_out_new_grad, grad_out_grad_grad
    if is_cplx(out):
        one, two, m2 = 1.0, 2.0, -2.0
        nan_of = lambda v: _mask(tirx.Or(tirx.isnan(v.re), tirx.isnan(v.im)), v.re)  # noqa: E731
        zero_mask = nan_of(out)
    else:
        nan_of = lambda v: _mask(tirx.isnan(v), v)  # noqa: E731
        zero_mask = nan_of(out)    # out · this = Paddle's 0 · out (NaN for inf/NaN)

    if d_ddout is not None and d_dout_new is not None:
        d_out_new = m2 * out * ddx * d_ddout - two * dout * ddx * d_dout_new
        d_ddx = (one - out * out) * d_ddout - two * out * dout * d_dout_new
    elif d_ddout is not None:
        d_out_new = m2 * out * ddx * d_ddout
        d_ddx = (one - out * out) * d_ddout
    elif d_dout_new is not None:
        d_out_new = -(two * dout * ddx * d_dout_new)
        d_ddx = m2 * out * dout * d_dout_new
    else:
        d_out_new = out * zero_mask
        d_ddx = ddx * nan_of(ddx)
    d_dout = m2 * out * ddx * d_dout_new if d_dout_new is not None else out * zero_mask
    return d_out_new, d_dout, d_ddx


@pointwise
def tanh_shrink_grad(x, out_grad):
    """x_grad = out_grad · tanh(x)²"""
    t = _tanh(x)
    return out_grad * (t * t)


# ------------------------------------------------------------------------------------------
# prelu, logit

def _prelu_views(shapes, attrs):
    """alpha (and its grad) viewed so that it broadcasts against x: mode "all" one value,
    "channel" one per channel (axis 1 for NCHW, else the last axis, as Paddle's kernel decides),
    "element" one per element of x[0]. alpha must have exactly that many elements."""
    x, alpha = shapes["x"], shapes["alpha"]
    if attrs["mode"] == "channel":
        if len(x) < 2:
            raise OpError(f"prelu_grad: mode 'channel' needs x of rank >= 2, got {list(x)}")
        c_axis = 1 if attrs["data_format"] == "NCHW" else len(x) - 1
        view = tuple(x[c_axis] if d == c_axis else 1 for d in range(len(x)))
    elif attrs["mode"] == "element":
        view = (1,) + tuple(x[1:]) if x else ()
    else:
        view = (1,) * len(x)
    if math.prod(alpha) != math.prod(view):
        raise OpError(f"prelu_grad: mode {attrs['mode']!r} with x of shape {list(x)} needs alpha of "
                      f"{math.prod(view)} element(s), got shape {list(alpha)}")
    return {"alpha": view, "alpha_grad": view}


@pointwise(broadcast=("alpha",), views=_prelu_views)
def prelu_grad(x, alpha, out_grad, data_format, mode):
    """x_grad = out_grad · (x > 0 ? 1 : alpha),  alpha_grad = Σ out_grad · (x > 0 ? 0 : x)"""
    return where(x > 0, out_grad, alpha * out_grad), where(x > 0, 0.0, x * out_grad)
