"""Grads that move between real and complex numbers: ``@mixed`` formulas (tvmgrad/families/mixed.py:
pointwise over tensors of real and complex dtypes) and the as_real/as_complex copies
(tvmgrad/families/reinterpret.py).

Semantics follow Paddle 3.3.1 (phi/kernels/impl/complex_grad_kernel_impl.h, angle_grad_kernel_impl.h,
as_real/as_complex kernels, conj kernel):

* ``real_grad``: x_grad = out_grad + 0i;  ``imag_grad``: x_grad = 0 + out_grad·i.
* ``complex_grad``: real_grad = Re(out_grad), imag_grad = Im(out_grad), each summed over the dims
  ``real``/``imag`` were broadcast along.
* ``angle_grad``: complex x: x_grad = out_grad · (-Im x, Re x) / |x|²  (0 where x = 0);
  real x: x_grad = 0 (zeros even for inf/NaN out_grad, as Paddle).
* ``as_real`` / ``as_complex`` (forwards of as_complex_grad / as_real_grad): reinterpret complex
  as a trailing pair of reals and back (a copy: Paddle returns a new tensor).
* ``conj`` (forward of conj_grad): (re, -im); a real or int32/int64 tensor is copied.
"""

from __future__ import annotations

from tvmgrad.dtypes import COMPLEX, FLOATS, INTS
from tvmgrad.families.complex import Complex
from tvmgrad.families.mixed import mixed, real_dtype
from tvmgrad.families.reinterpret import Reinterpret
from tvmgrad.lazy import tirx

from ._math import conj as _conj, const


# ------------------------------------------------------------------------------------------
# the ops

@mixed(dtypes=FLOATS, infer_meta="RealAndImagGradInferMeta")
def real_grad(out_grad):
    """x_grad = out_grad + 0i   (half out_grad: a complex64 x_grad; Paddle has no complex32)"""
    return Complex(out_grad, const(0.0, out_grad))


@mixed(dtypes=FLOATS, infer_meta="RealAndImagGradInferMeta")
def imag_grad(out_grad):
    """x_grad = 0 + out_grad·i   (half out_grad: a complex64 x_grad)"""
    return Complex(const(0.0, out_grad), out_grad)


def complex_of(name: str) -> str:
    """The complex dtype a real dtype makes (Paddle has no complex32: half types give complex64)."""
    return "complex128" if name == "float64" else "complex64"


def _complex_grad_check(call, dts):
    for n in ("real", "imag"):
        if dts[n].lanes != 1:
            raise TypeError(f"{call.op}: input {n!r} has dtype {dts[n].name}; it must be real")
    if dts["imag"] != dts["real"]:
        raise TypeError(f"{call.op}: input 'imag' has dtype {dts['imag'].name} but 'real' has "
                        f"{dts['real'].name}; they must match")
    want = complex_of(dts["real"].name)
    if dts["out_grad"].name != want:
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {dts['out_grad'].name}; it must be "
                        f"{want}, the complex dtype of real/imag ({dts['real'].name})")


@mixed(dtypes=FLOATS + COMPLEX, check=_complex_grad_check, broadcast=("real", "imag", "out_grad"),
       mixed_precision=True)
def complex_grad(real, imag, out_grad):
    """real_grad = Re(out_grad), imag_grad = Im(out_grad), each summed over the dims real/imag
    were broadcast along (in real's / imag's dtype)"""
    return out_grad.re, out_grad.im


def _angle_check(call, dts):
    x, g = dts["x"], dts["out_grad"]
    if g.lanes != 1:
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {g.name}; it must be real (the "
                        f"dtype of angle(x))")
    if x.lanes == 1 and x != g:
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {g.name} but 'x' has {x.name}; "
                        f"they must match")
    if x.lanes == 2 and g.name != real_dtype(x.name):
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {g.name}; for 'x' of dtype {x.name} "
                        f"it must be {real_dtype(x.name)} (the dtype of angle(x))")


@mixed(dtypes=FLOATS + COMPLEX, check=_angle_check, mixed_precision=True)
def angle_grad(x, out_grad):
    """complex x: x_grad = x == 0 ? 0 : out_grad · (-Im x + i Re x) / |x|²
    real x: x_grad = 0 (even where out_grad is inf/NaN, as Paddle)"""
    if not isinstance(x, Complex):
        return 0.0
    den = x.re * x.re + x.im * x.im
    zero = const(0.0, x.re)
    nz = den != zero
    safe = tirx.Select(nz, den, const(1.0, x.re))
    re = tirx.Select(nz, -(out_grad * x.im) / safe, zero)
    im = tirx.Select(nz, out_grad * x.re / safe, zero)
    return Complex(re, im)


@mixed(dtypes=FLOATS + COMPLEX + INTS, infer_meta="UnchangedInferMeta")
def conj(x):
    """out = Re x - i·Im x; a real (or integer) tensor is copied"""
    return _conj(x)


# ------------------------------------------------------------------------------------------
# as_real / as_complex: the same memory seen as complex or as pairs of reals

def _as_real(x):
    """out[..., 0] = Re x, out[..., 1] = Im x (a copy; Paddle returns a new tensor)"""


def _as_complex(x):
    """out = x[..., 0] + x[..., 1]·i (a copy)"""


_as_real.__name__, _as_complex.__name__ = "as_real", "as_complex"
_as_real.__qualname__, _as_complex.__qualname__ = "as_real", "as_complex"
as_real = Reinterpret(_as_real, source="complex", dtypes=COMPLEX, infer_meta="AsRealInferMeta")
as_complex = Reinterpret(_as_complex, source="real", dtypes=FLOATS,
                         infer_meta="AsComplexInferMeta")
