"""Grads of elementary functions: powers, exponentials, logarithms, trigonometry, rounding.

Each formula follows Paddle 3.3.1's CPU kernel (``phi/kernels/funcs/activation_functor.h``,
``impl/activation_grad_impl.h``, ``impl/abs_grad_kernel_impl.h``, ...) including its order of
operations and its behaviour at domain edges, ±inf and NaN. Notes on where that differs from the
textbook formula are in the docstrings.
"""

import math

import numpy as np

from tvmgrad.lazy import tirx

from tvmgrad.dtypes import ALL_INTS, COMPLEX, FLOATS, INTS
from tvmgrad.families import pointwise
from tvmgrad.families.complex import Complex
from tvmgrad.families.mixed import mixed

from ._math import (cabs, cdiv, conj, const, cos, cosh, cpow, cselect, dtype_of, f32, is_cplx, is_int,
                    sign, sin, sinh, sqrt, where)
from ._powers import int_powers, ipow

# Ops for which Paddle 3.3.1 registers complex kernels take complex64/128 too: their grads follow
# Paddle's convention x_grad = out_grad · conj(f'(x)) (checked against Paddle in tests/test_complex.py).
CPLX = FLOATS + COMPLEX
# Integer kernels (the int32/int64 Paddle registers for most of these grads; every integer type and
# bool for scale and the rounding grads) compute in their own dtype with C++'s wrapping arithmetic;
# a float attribute reaches them truncated toward 0 (static_cast<T>, families.base.scalar_arg).


# ------------------------------------------------------------------------------------------
# private helpers

def _times_zero(v):
    """Paddle's ``0 * v``: 0 where v is finite, NaN where it is ±inf or NaN (complex v: both parts,
    NaN where either part is not finite, as the complex product's cross terms give).

    (``v * 0.0`` cannot be written directly: TVM folds it to the constant 0 while building.)
    An integer v has no inf/NaN: 0.
    """
    if is_int(v):
        return const(0, v)
    if is_cplx(v):
        z = where(tirx.And(tirx.isfinite(v.re), tirx.isfinite(v.im)), 0.0, const(float("nan"), v.re))
        return Complex(z, z)
    return where(tirx.isfinite(v), 0.0, const(float("nan"), v))


def _sign_nan(x):
    """Paddle's ``sign``: -1, 0, 1, and NaN for NaN (unlike ``_math.sign``, which gives 0)."""
    return where(x > 0, 1.0, where(x < 0, -1.0, where(x == 0, 0.0, x)))


def _to(v, like):
    """``static_cast<T>(v)``: v in the dtype of ``like``."""
    return v.astype(dtype_of(like))


# ------------------------------------------------------------------------------------------
# forward op invoked by scale_grad and sign_grad

@pointwise(infer_meta="UnchangedInferMeta", dtypes=CPLX + ("bool",) + ALL_INTS)
def scale(x, scale, bias, bias_after_scale):
    """The forward ``scale`` op (scale_grad and sign_grad invoke it): x·scale + bias
    (bias_after_scale) or (x + bias)·scale. sign_grad = out_grad·0 + 0, so NaN where out_grad is
    ±inf/NaN, as in Paddle. Integers: scale and bias truncated toward 0, wrapping arithmetic;
    bool: C++'s, in int (bool operands promote), the result true where nonzero."""
    if dtype_of(x) == "bool":
        x, scale, bias = (v.astype("int32") for v in (x, scale, bias))
    return x * scale + bias if bias_after_scale else (x + bias) * scale


# ------------------------------------------------------------------------------------------
# abs

def _abs_check(call, dts):
    x, g = dts["x"], dts["out_grad"]
    want = {"complex64": "float32", "complex128": "float64"}.get(x.name, x.name)
    if g.name != want:
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {g.name}; for x of dtype {x.name} it "
                        f"must be {want} (the dtype of abs(x))")


@mixed(dtypes=CPLX + INTS, check=_abs_check)
def abs_grad(x, out_grad):
    """x_grad = x == 0 ? 0 : out_grad · (x / |x|)   (NaN at x = ±inf: inf/inf, as Paddle)
    integer x: out_grad · sign(x)
    complex x (out_grad is real, the dtype of |x|): the same formula, a complex x_grad"""
    if is_cplx(x):
        zero = const(0.0, x.re)
        unit = cdiv(x, Complex(cabs(x), zero))          # complex division: NaN pairs at inf
        return cselect(tirx.And(x.re == zero, x.im == zero), 0.0, unit * out_grad)
    if is_int(x):
        return out_grad * sign(x)           # Paddle's dout · sign(x)
    return where(x == 0, 0.0, out_grad * (x / tirx.abs(x)))


@pointwise(dtypes=CPLX + INTS)
def abs_double_grad(x, grad_x_grad):
    """grad_out_grad = x == 0 ? 0 : grad_x_grad · x / |x|   (NaN at x = ±inf, as Paddle)
    integer x: the same in integer arithmetic (the product wraps, the division truncates)
    complex x: the same formula without conjugation, a complex grad_out_grad (Paddle's
    AbsGradGradFunctor<complex>; its output has x's dtype)"""
    if is_cplx(x):
        zero = const(0.0, x.re)
        return cselect(tirx.And(x.re == zero, x.im == zero), 0.0, (grad_x_grad * x) / cabs(x))
    if is_int(x):
        # Paddle's T(ddx) · x / T(|x|): the product wraps before the (truncating) division. x = 0
        # gives 0 / 1; no select around it (TVM would drop the guard inside, so divide by 0)
        return tirx.truncdiv(grad_x_grad * x, tirx.abs(where(x == 0, const(1, x), x)))
    return where(x == 0, 0.0, grad_x_grad * x / tirx.abs(x))


@pointwise
def abs_triple_grad(x, grad_out_grad_grad):
    """grad_x_grad_grad = grad_out_grad_grad · sign(x)   (Paddle's composite; sign(NaN) = NaN,
    sign(±inf) = ±1)"""
    return grad_out_grad_grad * _sign_nan(x)


# ------------------------------------------------------------------------------------------
# trigonometric and hyperbolic

@pointwise(dtypes=CPLX)
def sin_grad(x, out_grad):
    """x_grad = out_grad · cos(x)"""
    if is_cplx(x):
        return out_grad * conj(cos(x))
    return out_grad * tirx.cos(x)


@pointwise(dtypes=CPLX)
def cos_grad(x, out_grad):
    """x_grad = -out_grad · sin(x)"""
    if is_cplx(x):
        return -out_grad * conj(sin(x))
    return -out_grad * tirx.sin(x)


@pointwise(dtypes=CPLX)
def tan_grad(x, out_grad):
    """x_grad = out_grad / cos²(x)"""
    if is_cplx(x):
        return out_grad / conj(cos(x) * cos(x))
    c = tirx.cos(x)
    return out_grad / (c * c)


# The higher-order grads below take complex too: Paddle's complex double/triple-grad kernels use
# the same expressions with complex arithmetic and, unlike the first-order grads, no conjugation
# (log_double_grad is the exception; checked in tests/test_complex.py).

@pointwise(dtypes=CPLX + INTS)
def sin_double_grad(x, grad_out, grad_x_grad):
    """x_grad = -grad_x_grad · sin(x) · grad_out,  grad_out_grad = grad_x_grad · cos(x)"""
    return -grad_x_grad * sin(x) * grad_out, grad_x_grad * cos(x)


@pointwise(dtypes=CPLX + INTS)
def cos_double_grad(x, grad_out, grad_x_grad):
    """x_grad = -grad_x_grad · cos(x) · grad_out,  grad_out_grad = -grad_x_grad · sin(x)"""
    return -grad_x_grad * cos(x) * grad_out, -grad_x_grad * sin(x)


@pointwise(broadcast=(), dtypes=CPLX + INTS)
def sin_triple_grad(x, grad_out_forward, grad_x_grad_forward, grad_x_grad, grad_out_grad_grad):
    """With d1y = grad_out_forward, d2d1x = grad_x_grad_forward, d3d2x = grad_x_grad,
    d3d2d1y = grad_out_grad_grad:
    x_grad = -cos(x)·d1y·d2d1x·d3d2x - sin(x)·d2d1x·d3d2d1y
    grad_out_forward_grad = -sin(x)·d2d1x·d3d2x
    grad_x_grad_forward_grad = -sin(x)·d1y·d3d2x + cos(x)·d3d2d1y
    An absent optional drops the terms that read it; an output left with no term is 0·x
    (NaN where x is ±inf/NaN), exactly as Paddle's SinTripleGradFunctor branches.
    """
    d1y, d2d1x, d3d2x, d3d2d1y = grad_out_forward, grad_x_grad_forward, grad_x_grad, grad_out_grad_grad
    s, c = sin(x), cos(x)
    have_d1y, have_d2d1x, have_d3 = d1y is not None, d2d1x is not None, d3d2d1y is not None
    if have_d1y and have_d2d1x and have_d3:
        dx = -c * d1y * d2d1x * d3d2x - s * d2d1x * d3d2d1y
    elif have_d2d1x and have_d3:
        dx = -s * d2d1x * d3d2d1y
    elif have_d1y and have_d2d1x:
        dx = -c * d1y * d2d1x * d3d2x
    else:
        dx = _times_zero(x)
    d_dout = -s * d2d1x * d3d2x if have_d2d1x else _times_zero(x)
    if have_d1y and have_d3:
        d_ddx = -s * d1y * d3d2x + c * d3d2d1y
    elif have_d1y:
        d_ddx = -s * d1y * d3d2x
    elif have_d3:
        d_ddx = c * d3d2d1y
    else:
        d_ddx = _times_zero(x)
    return dx, d_dout, d_ddx


@pointwise(broadcast=(), dtypes=CPLX + INTS)
def cos_triple_grad(x, grad_out_forward, grad_x_grad_forward, grad_x_grad, grad_out_grad_grad):
    """With d1y = grad_out_forward, d2d1x = grad_x_grad_forward, d3d2x = grad_x_grad,
    d3d2d1y = grad_out_grad_grad:
    x_grad = sin(x)·d1y·d2d1x·d3d2x - cos(x)·d2d1x·d3d2d1y
    grad_out_forward_grad = -cos(x)·d2d1x·d3d2x
    grad_x_grad_forward_grad = -cos(x)·d1y·d3d2x - sin(x)·d3d2d1y
    An absent optional drops the terms that read it; an output left with no term is 0·x
    (NaN where x is ±inf/NaN), exactly as Paddle's CosTripleGradFunctor branches.
    """
    d1y, d2d1x, d3d2x, d3d2d1y = grad_out_forward, grad_x_grad_forward, grad_x_grad, grad_out_grad_grad
    s, c = sin(x), cos(x)
    have_d1y, have_d2d1x, have_d3 = d1y is not None, d2d1x is not None, d3d2d1y is not None
    if have_d1y and have_d2d1x and have_d3:
        dx = s * d1y * d2d1x * d3d2x - c * d2d1x * d3d2d1y
    elif have_d1y and have_d2d1x:
        dx = s * d1y * d2d1x * d3d2x
    elif have_d2d1x and have_d3:
        dx = -c * d2d1x * d3d2d1y
    else:
        dx = _times_zero(x)
    d_dout = -c * d2d1x * d3d2x if have_d2d1x else _times_zero(x)
    if have_d1y and have_d3:
        d_ddx = -c * d1y * d3d2x - s * d3d2d1y
    elif have_d3:
        d_ddx = -s * d3d2d1y
    elif have_d1y:
        d_ddx = -c * d1y * d3d2x
    else:
        d_ddx = _times_zero(x)
    return dx, d_dout, d_ddx


@pointwise(dtypes=CPLX)
def sinh_grad(x, out_grad):
    """x_grad = out_grad · cosh(x)"""
    if is_cplx(x):
        return out_grad * conj(cosh(x))
    return out_grad * tirx.cosh(x)


@pointwise(dtypes=CPLX)
def cosh_grad(x, out_grad):
    """x_grad = out_grad · sinh(x)"""
    if is_cplx(x):
        return out_grad * conj(sinh(x))
    return out_grad * tirx.sinh(x)


@pointwise(dtypes=CPLX)
def asin_grad(x, out_grad):
    """x_grad = out_grad / √(1 - x²)   (NaN for |x| > 1, ±inf at ±1)"""
    if is_cplx(x):
        return out_grad / conj(sqrt(1.0 - x * x))
    return out_grad / tirx.sqrt(1.0 - x * x)


@pointwise(dtypes=CPLX)
def acos_grad(x, out_grad):
    """x_grad = -out_grad / √(1 - x²)   (NaN for |x| > 1, ±inf at ±1)"""
    if is_cplx(x):
        return -out_grad / conj(sqrt(1.0 - x * x))
    return -out_grad / tirx.sqrt(1.0 - x * x)


@pointwise(dtypes=CPLX)
def atan_grad(x, out_grad):
    """x_grad = out_grad / (1 + x²)"""
    if is_cplx(x):
        return out_grad / conj(1.0 + x * x)
    return out_grad / (1.0 + x * x)


@pointwise(dtypes=CPLX)
def asinh_grad(x, out_grad):
    """x_grad = out_grad / √(x² + 1)"""
    if is_cplx(x):
        return out_grad / conj(sqrt(x * x + 1.0))
    return out_grad / tirx.sqrt(x * x + 1.0)


@pointwise(dtypes=CPLX)
def acosh_grad(x, out_grad):
    """x_grad = out_grad / √(x² - 1)   (NaN for |x| < 1, inf at ±1; defined for x ≤ -1 too)"""
    if is_cplx(x):
        return out_grad / conj(sqrt(x * x - 1.0))
    return out_grad / tirx.sqrt(x * x - 1.0)


@pointwise(dtypes=CPLX)
def atanh_grad(x, out_grad):
    """x_grad = out_grad / (1 - x²)   (finite, negative for |x| > 1, as Paddle)"""
    if is_cplx(x):
        return out_grad / conj(1.0 - x * x)
    return out_grad / (1.0 - x * x)


# ------------------------------------------------------------------------------------------
# exponentials and logarithms

@pointwise(dtypes=CPLX + INTS)
def exp_grad(out, out_grad):
    """x_grad = out_grad · out"""
    if is_cplx(out):
        return out_grad * conj(out)
    return out_grad * out


@pointwise
def exp_double_grad(out, grad_out, grad_x_grad):
    """out_grad = grad_x_grad · grad_out,  grad_out_grad = grad_x_grad · out"""
    return grad_x_grad * grad_out, grad_x_grad * out


@pointwise(dtypes=CPLX)
def expm1_grad(out, out_grad):
    """x_grad = out_grad · out + out_grad"""
    if is_cplx(out):
        return out_grad * conj(out) + out_grad
    return out_grad * out + out_grad


@pointwise(dtypes=CPLX)
def log_grad(x, out_grad):
    """x_grad = out_grad · (1 / x)"""
    if is_cplx(x):
        return out_grad * conj(cdiv(1.0, x))
    return out_grad * (1.0 / x)


@pointwise(dtypes=CPLX)
def log_double_grad(x, grad_out, grad_x_grad):
    """x_grad = -grad_out · grad_x_grad / x²,  grad_out_grad = grad_x_grad / x
    (complex: Paddle's kernel divides by conj(x²) and conj(x): x_grad = -grad_out · grad_x_grad /
    conj(x²), grad_out_grad = grad_x_grad / conj(x))"""
    if is_cplx(x):
        return cdiv(-grad_out * grad_x_grad, conj(x * x)), cdiv(grad_x_grad, conj(x))
    return -grad_out * grad_x_grad / (x * x), grad_x_grad / x


@pointwise(dtypes=CPLX)
def log2_grad(x, out_grad):
    """x_grad = out_grad / (x · ln 2)"""
    if is_cplx(x):
        return cdiv(out_grad, conj(x * math.log(2.0)))
    return out_grad / (x * const(math.log(2.0), x))


@pointwise(dtypes=CPLX)
def log10_grad(x, out_grad):
    """x_grad = out_grad / (x · ln 10)"""
    if is_cplx(x):
        return cdiv(out_grad, conj(x * 2.3025850929940456))
    return out_grad / (x * const(2.3025850929940456, x))


@pointwise(dtypes=CPLX)
def log1p_grad(x, out_grad):
    """x_grad = out_grad · (1 / (x + 1))"""
    if is_cplx(x):
        return cdiv(out_grad, conj(x + 1.0))
    return out_grad * (1.0 / (x + 1.0))


@pointwise
def erf_grad(x, out_grad):
    """x_grad = out_grad · 2/√π · exp(-x²)"""
    return out_grad * const(2.0 / math.sqrt(math.pi), x) * tirx.exp(-(x * x))


# ------------------------------------------------------------------------------------------
# powers

@pointwise(dtypes=CPLX)
def sqrt_grad(out, out_grad):
    """x_grad = 0.5 · out_grad / out"""
    if is_cplx(out):
        return cdiv(0.5 * out_grad, conj(out))
    return 0.5 * out_grad / out


@pointwise
def sqrt_double_grad(out, grad_x, grad_x_grad):
    """out_grad = -grad_x · grad_x_grad / out,  grad_out_grad = 0.5 · grad_x_grad / out"""
    return grad_x * grad_x_grad * -1.0 / out, grad_x_grad * 0.5 / out


@pointwise
def rsqrt_grad(out, out_grad):
    """x_grad = -0.5 · out_grad · out³"""
    return -0.5 * out_grad * out * out * out


@pointwise
def rsqrt_double_grad(out, grad_x, grad_x_grad):
    """out_grad = (3 / out) · grad_x · grad_x_grad,  grad_out_grad = -0.5 · grad_x_grad · out³"""
    return (3.0 / out) * grad_x * grad_x_grad, grad_x_grad * -0.5 * out * out * out


@pointwise(dtypes=CPLX + INTS)
def square_grad(x, out_grad):
    """x_grad = 2 · out_grad · x"""
    if is_cplx(x):
        return out_grad * conj(2.0 * x)
    return out_grad * const(2.0, x) * x            # const: an integer 2 for integer x


@pointwise(dtypes=CPLX + INTS)
def square_double_grad(x, grad_out, grad_x_grad):
    """x_grad = 2 · grad_x_grad · grad_out,  grad_out_grad = 2 · grad_x_grad · x"""
    two = const(2.0, x)                            # an integer 2 for integer x
    return grad_x_grad * two * grad_out, grad_x_grad * two * x


@pointwise(dtypes=CPLX)
def reciprocal_grad(out, out_grad):
    """x_grad = -out_grad · out²"""
    if is_cplx(out):
        return -out_grad * conj(out * out)
    return -out_grad * out * out


def _int_exponents(exponents):
    """``validate`` of an integer pow kernel (te_defs/_powers.py). ``exponents(f)`` -> (the
    exponents Paddle's kernel raises x to, the other values it casts to T), from y's float32 value
    f: every one must fit T (a float's cast outside T's range is undefined in C++), and no exponent
    may be negative: Paddle's integer pow (Eigen's square-and-multiply) never returns for one."""
    def check(call, dt):
        y = float(call.attrs["y"])
        info = np.iinfo(dt.name)
        if not math.isfinite(y):
            raise ValueError(f"{call.op}: attribute 'y' = {y} has no {dt.name} value")
        powers, casts = exponents(np.float32(y))
        for v in list(casts) + list(powers):
            if not info.min <= math.trunc(float(v)) <= info.max:
                raise ValueError(f"{call.op}: attribute 'y' = {y} makes {float(v)}, which does not "
                                 f"fit {dt.name} (the kernel casts it to the dtype of x)")
        least = min((math.trunc(float(v)) for v in powers), default=0)
        if least < 0:
            raise ValueError(f"{call.op}: attribute 'y' = {y} makes the exponent {least} for "
                             f"{dt.name} x; an integer power takes exponents >= 0 (Paddle's "
                             f"integer pow never returns for a negative one)")
    return check


def _power(x, e):
    """x ** e: a float or complex power (``cpow``), or an integer one by square and multiply
    (e >= 0, wrapping)."""
    return ipow(x, e) if is_int(x) else cpow(x, e)


@int_powers(validate=_int_exponents(lambda f: ([] if f == 0 else [math.trunc(float(f)) - 1], [f])))
@pointwise(dtypes=CPLX)
def pow_grad(x, out_grad, y):
    """x_grad = y == 0 ? 0 : out_grad · y · x^(y-1)
    y is used as float32 (Paddle's ``factor.to<float>()``), also for float64 inputs; y == 0 gives 0
    everywhere (even where x = 0 or out_grad is inf/NaN), as Paddle. Integer x: T(y) truncated,
    x^(T(y) - 1) by square and multiply, wrapping (y in (0, 1) or below 0 is refused)."""
    if is_cplx(x):                      # out_grad · conj(y · x^(y-1))
        yf = f32(y)
        e = _to(yf, x.re)
        return cselect(yf == 0.0, 0.0, out_grad * conj(cpow(x, e - 1.0) * e))
    yf = f32(y)
    e = _to(yf, x)
    return where(yf == 0.0, 0.0, out_grad * e * _power(x, e - const(1, x)))


def _pow_coef(yf, k, like):
    """Paddle's ``Scale(..., factor)`` coefficients, computed in float32: y, y(y-1), y(y-1)(y-2)."""
    c = yf
    for j in range(1, k):
        c = c * (yf - float(j))
    return _to(c, like)


def _pow_x(x, yf, k):
    """x^(y-k) with the exponent ``y - k`` formed in float32, as Paddle's Pow(x, exponent - k)
    (complex x: ``cpow``, Paddle's polar form; integer x: T(y - k), square and multiply)."""
    return _power(x, _to(yf - float(k), x.re if is_cplx(x) else x))


def _float32_terms(f, ks):
    """(y - k, y(y-1)...(y-k+1)) for the k of ``ks``, in float32 as Paddle's kernels form them."""
    exponents, coefficients = [], []
    for k in ks:
        c = f
        for j in range(1, k):
            c = np.float32(c * (f - np.float32(j)))
        exponents.append(np.float32(f - np.float32(k)))
        coefficients.append(c)
    return exponents, coefficients


@int_powers(validate=_int_exponents(lambda f: _float32_terms(f, (1,) if f == 1 else (1, 2))))
@pointwise(broadcast=(), dtypes=CPLX)
def pow_double_grad(x, grad_out, grad_x_grad, y):
    """x_grad = y == 1 ? 0 : grad_out · grad_x_grad · x^(y-2) · y(y-1)
    grad_out_grad = grad_x_grad · x^(y-1) · y
    (y and the coefficients in float32, as Paddle; same shapes only: Paddle crashes otherwise)"""
    yf = f32(y)
    x_grad = grad_out * grad_x_grad * _pow_x(x, yf, 2) * _pow_coef(yf, 2, x)
    return (cselect(yf == 1.0, 0.0, x_grad),
            grad_x_grad * _pow_x(x, yf, 1) * _pow_coef(yf, 1, x))


@int_powers(validate=_int_exponents(lambda f: _float32_terms(f, (1, 2) if f == 2 else (1, 2, 3))))
@pointwise(broadcast=(), dtypes=CPLX)
def pow_triple_grad(x, grad_out, grad_grad_x, grad_x_grad, grad_grad_out_grad, y):
    """With dout = grad_out, ddx = grad_grad_x, d_dx = grad_x_grad, d_ddout = grad_grad_out_grad
    (optional: absent drops its terms), c_k = y(y-1)…(y-k+1) in float32:
    x_grad = d_dx·ddx·dout·x^(y-3)·c_3 + d_ddout·ddx·x^(y-2)·c_2
    grad_out_grad = d_dx·ddx·x^(y-2)·c_2
    grad_grad_x_grad = d_dx·dout·x^(y-2)·c_2 + d_ddout·x^(y-1)·y
    Paddle's special cases: y = 2: x_grad has no first term (0 without d_ddout); y = 1: x_grad has
    no second term, grad_out_grad = 0, grad_grad_x_grad = d_ddout (0 without it)."""
    dout, ddx, d_dx, d_ddout = grad_out, grad_grad_x, grad_x_grad, grad_grad_out_grad
    yf = f32(y)
    c1, c2, c3 = (_pow_coef(yf, k, x) for k in (1, 2, 3))
    part1 = d_dx * ddx * dout * (_pow_x(x, yf, 3) * c3)
    d_dout = d_dx * ddx * (_pow_x(x, yf, 2) * c2)
    d_ddx = d_dx * dout * (_pow_x(x, yf, 2) * c2)
    if d_ddout is not None:
        part2 = d_ddout * ddx * (_pow_x(x, yf, 2) * c2)
        d_ddx_part2 = d_ddout * (_pow_x(x, yf, 1) * c1)
        dx_general, dx_two = part1 + part2, part2
        d_ddx_general, d_ddx_one = d_ddx + d_ddx_part2, d_ddx_part2
    else:
        dx_general, dx_two = part1, 0.0
        d_ddx_general, d_ddx_one = d_ddx, 0.0
    dx = cselect(yf == 2.0, dx_two, cselect(yf == 1.0, part1, dx_general))
    d_dout = cselect(yf == 1.0, 0.0, d_dout)
    d_ddx = cselect(yf == 2.0, d_ddx_general, cselect(yf == 1.0, d_ddx_one, d_ddx_general))
    return dx, d_dout, d_ddx


# ------------------------------------------------------------------------------------------
# piecewise constant and clipping

@pointwise(dtypes=FLOATS + ALL_INTS)
def floor_grad(out_grad):
    """x_grad = 0 · out_grad   (NaN where out_grad is ±inf/NaN, as Paddle)"""
    return _times_zero(out_grad)


@pointwise(dtypes=FLOATS + ALL_INTS)
def ceil_grad(out_grad):
    """x_grad = 0 · out_grad   (NaN where out_grad is ±inf/NaN, as Paddle)"""
    return _times_zero(out_grad)


@pointwise(dtypes=CPLX + INTS)
def round_grad(out_grad):
    """x_grad = 0 · out_grad   (NaN where out_grad is ±inf/NaN, as Paddle; complex: both parts)"""
    if is_cplx(out_grad):
        z = where(tirx.And(tirx.isfinite(out_grad.re), tirx.isfinite(out_grad.im)), 0.0,
                  const(float("nan"), out_grad.re))
        return Complex(z, z)
    return _times_zero(out_grad)


@pointwise(dtypes=FLOATS + INTS)
def trunc_grad(out_grad):
    """input_grad = 0   (zeros even where out_grad is ±inf/NaN, as Paddle)"""
    return 0.0


@pointwise(dtypes=FLOATS + INTS)
def clip_grad(x, out_grad, min, max):
    """x_grad = min ≤ x ≤ max ? out_grad : 0   (0 where x is NaN, everywhere when min > max)"""
    return where(tirx.all(x >= min, x <= max), out_grad, 0.0)


@pointwise(dtypes=FLOATS + INTS)
def clip_double_grad(x, grad_x_grad, min, max):
    """grad_out_grad = min ≤ x ≤ max ? grad_x_grad : 0   (Paddle runs clip_grad's kernel)"""
    return where(tirx.all(x >= min, x <= max), grad_x_grad, 0.0)


# ------------------------------------------------------------------------------------------
# random ops: the output does not depend on x

@pointwise(dtypes=CPLX)
def gaussian_inplace_grad(out_grad, mean, std, seed):
    """x_grad = 0   (x is overwritten by the random fill; zeros even for inf/NaN out_grad)"""
    return 0.0


@pointwise
def uniform_inplace_grad(out_grad, min, max, seed, diag_num, diag_step, diag_val):
    """x_grad = 0   (x is overwritten by the random fill, diagonal included; zeros even for
    inf/NaN out_grad)"""
    return 0.0


@pointwise
def poisson_grad(out_grad):
    """x_grad = 0   (zeros even for inf/NaN out_grad)"""
    return 0.0
