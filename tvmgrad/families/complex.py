"""Complex scalars for formulas: a (re, im) pair of real TIR expressions.

TVM has no complex dtype; the dtype layer stores complex64/128 as float32/64 pairs in a trailing
dim of 2. The pointwise family loads such an element as a ``Complex`` and stores a ``Complex``
result back, so a formula written with ``+ - * /``, ``conj`` and the functions of te_defs/_math.py
serves real and complex inputs alike (Paddle's complex grads are out_grad · conj(f'(x))).
"""

from __future__ import annotations

import numbers

__all__ = ["Complex", "is_complex", "lift"]


def _const(value, like):
    from tvm import tirx
    return tirx.const(value, str(like.ty))


class Complex:
    __slots__ = ("re", "im")

    def __init__(self, re, im):
        self.re, self.im = re, im

    @property
    def dtype(self) -> str:
        return str(self.re.ty)

    def _lift(self, other):
        if isinstance(other, Complex):
            return other
        if isinstance(other, numbers.Complex) and not isinstance(other, numbers.Real):
            return Complex(_const(other.real, self.re), _const(other.imag, self.re))
        if isinstance(other, numbers.Number):
            return Complex(_const(other, self.re), _const(0.0, self.re))
        return Complex(other, _const(0.0, self.re))

    def __add__(self, other):
        o = self._lift(other)
        return Complex(self.re + o.re, self.im + o.im)

    __radd__ = __add__

    def __sub__(self, other):
        o = self._lift(other)
        return Complex(self.re - o.re, self.im - o.im)

    def __rsub__(self, other):
        return self._lift(other) - self

    def __mul__(self, other):
        if not isinstance(other, Complex) and not (isinstance(other, numbers.Complex)
                                                   and not isinstance(other, numbers.Real)):
            return Complex(self.re * other, self.im * other)          # real scale: no cross terms
        o = self._lift(other)
        return Complex(self.re * o.re - self.im * o.im, self.re * o.im + self.im * o.re)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if not isinstance(other, Complex) and not (isinstance(other, numbers.Complex)
                                                   and not isinstance(other, numbers.Real)):
            return Complex(self.re / other, self.im / other)
        o = self._lift(other)
        den = o.re * o.re + o.im * o.im
        return Complex((self.re * o.re + self.im * o.im) / den, (self.im * o.re - self.re * o.im) / den)

    def __rtruediv__(self, other):
        return self._lift(other) / self

    def __neg__(self):
        return Complex(-self.re, -self.im)

    def conj(self):
        return Complex(self.re, -self.im)

    def __repr__(self) -> str:
        return f"Complex({self.re}, {self.im})"


def is_complex(x) -> bool:
    return isinstance(x, Complex)


def lift(value, like) -> Complex:
    """``value`` (real expr, number or Complex) as a Complex of ``like``'s component dtype."""
    return value if isinstance(value, Complex) else like._lift(value)
