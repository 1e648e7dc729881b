"""Vectorisable float32 ``exp`` and ``erf`` for the LLVM target.

TVM lowers ``exp``/``erf`` on LLVM to calls of libm's ``expf``/``erff``, one element at a time: a loop
with such a call does not vectorise, and a pointwise grad like gelu's runs at a fraction of memory
bandwidth. These rules replace the calls, for float32 on LLVM only (CUDA keeps its native
functions, float64 keeps libm), by branch-free polynomials that LLVM vectorises (and, in a loop
that TVM vectorises explicitly, the same polynomials on its vectors):

* exp: Cephes' expf range reduction (by ln 2 in two parts), a degree-6 polynomial in 6 FMAs, then
  the scaling by 2ⁿ with one rounding (so that results in the subnormal range are right); ≤ 1 ulp;
  overflow to inf and underflow to 0 where the polynomial's own result rounds there (the argument
  clamped just past both, no select), NaN passes through (the clamp keeps it: ``_clamp``).
* erf: Eigen's float rational approximation (what Paddle's CPU kernels compute through Eigen), exact
  ±1 beyond |x| ≥ 4, NaN passes through.

The scaling by 2ⁿ depends on the target being built for (``Target.current()``: tvmgrad builds
inside ``with target:``): with AVX-512 it is ``llvm.ldexp``, which LLVM lowers to one ``vscalefps``
(3 instructions with n's conversions, for 8); elsewhere LLVM expands ldexp into a long select
chain, so it is two multiplies by 2^(n/2) and 2^(n - n/2) built from exponent bits. No current
target (a Relax module compiled outside ``with target:``): that portable form. With the 6-FMA
polynomial, silu_grad's loop went from 38 to 31 instructions per 16 elements on AVX-512 (42 -> 40
per 8 on AVX2); in-process A/B at 2^24 elements, 2 threads: silu_grad -10 %, gelu_grad -15 %,
log_softmax_grad -14 % on AVX-512; -5 %, -7 %, -1 % on AVX2.

Registered once, before the first LLVM build; part of every LLVM kernel's cache key.
"""

from __future__ import annotations

import functools

__all__ = ["install"]

LEVEL = 200        # above TVM's own rules (99)


def _lanes(x) -> int:
    import tvm
    return tvm.DataType(str(x.ty)).lanes


def _element(x) -> str:
    """The scalar type of ``x``'s lanes (``float32`` of ``float32x16``)."""
    import tvm
    return str(tvm.DataType(str(x.ty)).with_lanes(1))


def _typed(dtype: str, lanes: int) -> str:
    return dtype if lanes == 1 else f"{dtype}x{lanes}"


def _f(value, lanes=1, dtype="float32"):
    """A constant, broadcast to ``lanes`` (a vector operand: an explicitly vectorised loop)."""
    from tvm import tirx
    c = tirx.const(value, dtype)
    return c if lanes == 1 else tirx.Broadcast(c, lanes)


def _horner(x, coefficients):
    acc = _f(coefficients[0], _lanes(x))
    for c in coefficients[1:]:
        acc = acc * x + _f(c, _lanes(x))
    return acc


def _pow2_bits(n):
    """2**n for an int32 n in [-126, 127], as exponent bits."""
    from tvm import tirx
    lanes = _lanes(n)
    return tirx.reinterpret(_typed("float32", lanes),
                            (n + _f(127, lanes, "int32")) << _f(23, lanes, "int32"))


# The clamp of exp's argument: past it the polynomial's result itself rounds to inf (2**128 times
# at least e**0.27) or to +0 (below half the least subnormal), so no select is needed for either.
_EXP_HI, _EXP_LO = 89.0, -104.0


def _clamp(x, lo: float, hi: float):
    """x clamped to [lo, hi], a NaN passing through as it is: TVM's LLVM min(a, b) is
    ``a < b ? a : b`` and max(a, b) ``a > b ? a : b``, so with x second a NaN fails both
    comparisons and comes out (x86's minps/maxps return their second operand on NaN, the same).
    Everything computed from a NaN is NaN: no select for it (two or three vector uops an
    element, ~10 % of gelu_grad's AVX2 loop)."""
    from tvm import tirx
    lanes = _lanes(x)
    return tirx.max(_f(lo, lanes), tirx.min(_f(hi, lanes), x))


# A degree-4 minimax fit of (e^r - 1 - r) / r² on |r| <= ln2/2 (Lawson's iteration on the
# relative error of 1 + r + r²q, 3.1e-9; float32 coefficients): within 1 ulp of e^r there with
# FMAs, in 6 FMAs where Cephes' form, 1 + r + r²·P5(r), takes 8 instructions.
_EXP_Q = [0.0013814539415761828, 0.00836874544620514, 0.04166838899254799, 0.1666652113199234,
          0.4999999403953552]


def exp32(x):
    from tvm import tirx
    lanes = _lanes(x)
    xc = _clamp(x, _EXP_LO, _EXP_HI)
    n = tirx.floor(xc * _f(1.44269504088896341, lanes) + _f(0.5, lanes))
    r = xc - n * _f(0.693359375, lanes) - n * _f(-2.12194440e-4, lanes)
    q = _horner(r, _EXP_Q)                                     # (e^r - 1 - r) / r²
    p = (q * r + _f(1.0, lanes)) * r + _f(1.0, lanes)        # 1 + r + r²q: two FMAs
    return _scaled(p, n.astype(_typed("int32", lanes)))        # NaN: p is NaN


def _scaled(p, n):
    """p · 2ⁿ for n in [-151, 128], rounded once (so that results in the subnormal range are
    right): ``vscalefps`` where the target has it, else 2^half · 2^(n - half), both normal."""
    from tvm import tirx
    lanes = _lanes(p)
    if _has_scalef():
        return tirx.call_llvm_pure_intrin(_typed("float32", lanes), "llvm.ldexp", p, n)
    half = n >> _f(1, lanes, "int32")
    return p * _pow2_bits(half) * _pow2_bits(n - half)


def _has_scalef() -> bool:
    import tvm
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "llvm":
        return False
    from .schedules.cpu._isa import features
    return "avx512f" in features(target)


_ERF_ALPHA = [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02]
_ERF_BETA = [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02]


def erf32(x):
    xc = _clamp(x, -4.0, 4.0)
    x2 = xc * xc
    return _horner(x2, _ERF_ALPHA) * xc / _horner(x2, _ERF_BETA)      # NaN: NaN


def _rule(fn):
    def lower(op):
        if _element(op) == "float32":              # float32, scalar or vector
            return fn(op.args[0])
        if _lanes(op.args[0]) > 1:                 # other vectors: libm's, lane by lane
            return _per_lane(op)
        return op                                  # float64 keeps libm
    return lower


def _per_lane(op):
    """A vector call as the vector of its scalar calls (TVM lowers those to libm's)."""
    from tvm import tirx
    x = op.args[0]
    parts = [tirx.call_intrin(_element(x), op.op, tirx.Shuffle([x], [tirx.const(i, "int32")]))
             for i in range(_lanes(x))]
    return tirx.Shuffle(parts, [tirx.const(i, "int32") for i in range(len(parts))])


@functools.cache
def install() -> None:
    from tvm.tirx.op import register_intrin_lowering
    register_intrin_lowering("tirx.exp", target="llvm", f=_rule(exp32), level=LEVEL)
    register_intrin_lowering("tirx.erf", target="llvm", f=_rule(erf32), level=LEVEL)
