"""Special functions TVM lacks, as pure functions of TIR scalar expressions.

Every function takes scalar expressions in a float compute dtype (float32 or float64; the dtype
of the argument picks the coefficient set) and returns one scalar expression of that dtype:

    digamma(x)          ψ(x)  (Eigen's algorithm, as Paddle's lgamma_grad; ψ(±0) = ∓inf)
    polygamma(m, x)     ψ⁽ᵐ⁾(x) for a Python int m ≥ 0 (Cephes Hurwitz ζ for x > 0, reflection
                        for x < 0; poles and -inf give ±inf like Paddle's zeta, +inf gives NaN)
    hurwitz_zeta(s, q)  ζ(s, q) for a Python int s ≥ 2 and q > 0 (Cephes / Paddle's zeta)
    tgamma(x)
    i0(x), i0e(x), i1(x), i1e(x)   (Cephes Chebyshev series, Paddle's coefficient sets)

**No deep recurrences.** TVM's analyzer (``IRMutatorWithAnalyzer``, run by several lowering
passes) substitutes each let-bound var by its value, so a chain of lets in which every step uses
the previous ones more than once (Clenshaw, a loop unrolled with selects) is walked as a tree:
exponential compile time (a 20-step Clenshaw already costs seconds, 30 steps minutes). So:
Chebyshev series are evaluated as (well-conditioned, checked) monomials by Horner, recurrences
are written in closed form (a fixed shift Σ 1/(x+k), a fixed number of ζ terms), and a let is
only used for a value a few uses deep. Results are self-contained expressions; bind them
(``Seq.let``) before using one twice.
"""

from __future__ import annotations

import math
from fractions import Fraction

from tvmgrad.lazy import tirx

from ._math import const, dtype_of, where

__all__ = ["Seq", "digamma", "polygamma", "hurwitz_zeta", "tgamma", "i0", "i0e", "i1", "i1e",
           "signbit"]

PI = math.pi


# ---------------------------------------------------------------------------------------------
# plumbing

class Seq:
    """Straight-line scalar code: ``let`` binds a value to a fresh var; ``done`` wraps the lets."""

    def __init__(self, prefix="t"):
        self.binds = []
        self.prefix = prefix

    def let(self, value):
        if isinstance(value, (tirx.Var, tirx.FloatImm, tirx.IntImm)):
            return value
        v = tirx.Var(f"{self.prefix}{len(self.binds)}", dtype_of(value))
        self.binds.append((v, value))
        return v

    def done(self, result):
        for v, value in reversed(self.binds):
            result = tirx.Let(v, value, result)
        return result


def _inf(x):
    return const(math.inf, x)


def _nan(x):
    return const(math.nan, x)


def signbit(x):
    """True for negative numbers and -0."""
    return tirx.copysign(const(1.0, x), x) < 0


_FLOAT_MAX = {"float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}


def _fc(value, like):
    """A constant of ``like``'s dtype from a Python number (an exact int or Fraction included),
    saturating to ±inf where the dtype overflows (float32 constants of high-order terms)."""
    try:
        v = float(value)
    except OverflowError:
        v = math.inf if value > 0 else -math.inf
    if math.isfinite(v) and abs(v) > _FLOAT_MAX[dtype_of(like)]:
        v = math.copysign(math.inf, v)
    return const(v, like)


def _horner(z, coeffs):
    """coeffs[0]·zⁿ + … + coeffs[n]."""
    acc = _fc(coeffs[0], z)
    for c in coeffs[1:]:
        acc = acc * z + _fc(c, z)
    return acc


def _bernoulli(n: int) -> Fraction:
    """Bernoulli number B_n (B_1 = -1/2), exact."""
    b = [Fraction(1)]
    for m in range(1, n + 1):
        b.append(-sum(math.comb(m + 1, k) * b[k] for k in range(m)) / (m + 1))
    return b[n]


# ---------------------------------------------------------------------------------------------
# ψ (digamma)

# ψ(u) = ln u - 1/(2u) - Σ B_2k / (2k u^2k), u ≥ 10 (Eigen's digamma_impl_maybe_poly terms)
_DIGAMMA_A = {
    "float64": [float(_bernoulli(2 * k) / (2 * k)) for k in range(7, 0, -1)],
    "float32": [float(_bernoulli(2 * k) / (2 * k)) for k in range(4, 0, -1)],
}
_DIGAMMA_BIG = {"float64": 1.0e17, "float32": 1.0e8}


def _psi_positive(seq, t):
    """ψ(t) for t > 0: ψ(t) = ψ(t+10) - Σₖ₌₀⁹ 1/(t+k) when t < 10, then the asymptotic series
    (Eigen steps one at a time up to 10; the fixed shift avoids a recurrence)."""
    dt = dtype_of(t)
    small = seq.let(t < 10)
    u = seq.let(where(small, t + 10.0, t))
    w = 1.0 / t
    for k in range(1, 10):
        w = w + 1.0 / (t + float(k))
    z = seq.let(1.0 / (u * u))
    poly = where(u < _DIGAMMA_BIG[dt], z * _horner(z, _DIGAMMA_A[dt]), 0.0)
    return tirx.log(u) - 0.5 / u - poly - where(small, w, 0.0)


def digamma(x):
    """ψ(x): Eigen's digamma (reflection about the nearest integer for x ≤ 0), except that
    ψ(+0) = -inf and ψ(-0) = +inf as Paddle gives; NaN at negative integers and -inf."""
    seq = Seq("dg")
    neg = seq.let(x <= 0)
    p = seq.let(tirx.floor(x))
    nz0 = seq.let(x - p)
    nz = seq.let(where(nz0 > 0.5, x - (p + 1.0), nz0))
    refl = where(nz == 0.5, 0.0, PI / tirx.tan(PI * nz))
    t = seq.let(where(neg, 1.0 - x, x))
    y = seq.let(_psi_positive(seq, t))
    res = where(neg, y - refl, y)
    res = where(tirx.And(neg, x == p), _nan(x), res)
    res = where(x == 0, where(signbit(x), _inf(x), -_inf(x)), res)
    return seq.done(res)


# ---------------------------------------------------------------------------------------------
# ζ(s, q) and ψ⁽ᵐ⁾

# Cephes zeta.c: A[i] = (2i+2)! / B_{2i+2}
_ZETA_A = [Fraction(math.factorial(2 * i + 2)) / _bernoulli(2 * i + 2) for i in range(12)]


def _zeta_em_coeffs(s: int) -> list[float]:
    """Euler–Maclaurin tail coefficients cᵢ = s(s+1)…(s+2i) / A[i], highest i first."""
    out, fa = [], Fraction(1)
    for i in range(12):
        fa *= s + 2 * i
        out.append(fa / _ZETA_A[i])
        fa *= s + 2 * i + 1
    return list(reversed(out))


def hurwitz_zeta(s: int, q):
    """ζ(s, q) = Σₖ (q+k)^-s for a Python int s ≥ 2 and q > 0: Paddle's (Cephes') zeta, ten
    direct terms then 12 Euler–Maclaurin terms at w = q + 9, in closed form (Paddle stops early
    once a term is below 1.1e-16 of the sum; the terms left out here are as small).
    ζ(s, +inf) is NaN (0·inf) as in Paddle."""
    if int(s) != s or s < 2:
        raise ValueError(f"hurwitz_zeta: s must be an integer >= 2, got {s}")
    seq = Seq("hz")
    ms = const(-float(s), q)
    w = seq.let(q + 9.0)
    b = seq.let(tirx.pow(w, ms))
    direct = tirx.pow(q, ms)
    for k in range(1, 9):
        direct = direct + tirx.pow(q + float(k), ms)
    direct = direct + b
    iw = seq.let(1.0 / w)
    tail = w / float(s - 1) - 0.5 + iw * _horner(iw * iw, _zeta_em_coeffs(s))
    return seq.done(direct + b * tail)


def _cot_derivative_poly(m: int) -> list[int]:
    """Integer coefficients (highest degree first) of P_m with dᵐ/dyᵐ cot y = P_m(cot y)."""
    p = [0, 1]                                     # ascending: P_0(c) = c
    for _ in range(m):
        d = [i * p[i] for i in range(1, len(p))]   # P'
        n = [0] * (len(d) + 2)                     # -(1 + c²)·P'
        for i, c in enumerate(d):
            n[i] -= c
            n[i + 2] -= c
        while len(n) > 1 and n[-1] == 0:
            n.pop()
        p = n
    return list(reversed(p))


def polygamma(m: int, x):
    """ψ⁽ᵐ⁾(x) for a Python int m ≥ 0.

    m = 0 is ``digamma``. For m ≥ 1: x > 0 is (-1)^(m+1)·m!·ζ(m+1, x) (``hurwitz_zeta``);
    x < 0 (non-integer) uses the reflection ψ⁽ᵐ⁾(x) = (-1)^m ψ⁽ᵐ⁾(1-x) - π^(m+1)·cot⁽ᵐ⁾(πx)
    with the cotangent taken about the nearest integer (Paddle sums the series directly there,
    losing accuracy for very negative x and, in Eigen's float32 version, failing below -9).
    x = 0, negative integers and -inf give (-1)^(m+1)·inf (Paddle's ζ returns +inf there).
    """
    m = int(m)
    if m < 0:
        raise ValueError(f"polygamma: order must be >= 0, got {m}")
    if m == 0:
        return digamma(x)
    seq = Seq("pg")
    sign = 1 if m % 2 else -1                       # (-1)^(m+1)
    scale = _fc(sign * math.factorial(m), x)
    q = seq.let(where(x > 0, x, 1.0 - x))
    pos = seq.let(scale * hurwitz_zeta(m + 1, q))   # ψ⁽ᵐ⁾(q)
    r = seq.let(x - tirx.nearbyint(x))
    c = seq.let(where(tirx.abs(r) == 0.5, 0.0, 1.0 / tirx.tan(PI * r)))
    cot_m = _horner(c, _cot_derivative_poly(m))
    refl = (-1.0) ** m * pos - _fc(PI ** (m + 1) if m < 600 else math.inf, x) * cot_m
    res = where(x > 0, pos, refl)
    res = where(tirx.And(x <= 0, x == tirx.floor(x)), const(sign * math.inf, x), res)
    return seq.done(res)


# ---------------------------------------------------------------------------------------------
# Γ and log Γ

# Stirling: ln Γ(t) = (t-½)ln t - t + ½ln 2π + Σ B_2k / (2k(2k-1) t^(2k-1)),  t ≥ 10
_STIRLING = {
    "float64": [float(_bernoulli(2 * k) / (2 * k * (2 * k - 1))) for k in range(8, 0, -1)],
    "float32": [float(_bernoulli(2 * k) / (2 * k * (2 * k - 1))) for k in range(4, 0, -1)],
}
_GAMMA_MAX = {"float64": 171.62437695630272, "float32": 35.04010009765625}


def _stirling_series(seq, t):
    w = seq.let(1.0 / t)
    return w * _horner(w * w, _STIRLING[dtype_of(t)])


def _shift(seq, t):
    """(t ≥ 10 ? t : t + 10, the product t(t+1)…(t+9), whether shifted)."""
    small = seq.let(t < 10)
    prod = t
    for k in range(1, 10):
        prod = prod * (t + float(k))
    return seq.let(where(small, t + 10.0, t)), prod, small


def _sinpi(seq, x):
    """sin(πx), reduced about the nearest integer."""
    n = seq.let(tirx.nearbyint(x))
    odd = (n - 2.0 * tirx.floor(n * 0.5)) != 0
    s = seq.let(tirx.sin(PI * (x - n)))
    return where(odd, -s, s)


def tgamma(x):
    """Γ(x) (C's tgamma): ±inf at ±0, NaN at negative integers and -inf, inf beyond overflow.
    Relative error about 1e-14 (float64) / 1e-6 (float32)."""
    seq = Seq("tg")
    neg = seq.let(x < 0)
    t = seq.let(where(neg, 1.0 - x, x))
    u, prod, small = _shift(seq, t)
    v = seq.let(tirx.pow(u, 0.5 * u - 0.25))
    g = seq.let(math.sqrt(2 * PI) * v * (v * tirx.exp(-u)) * tirx.exp(_stirling_series(seq, u)))
    g = seq.let(where(t > _GAMMA_MAX[dtype_of(x)], _inf(x), where(small, g / prod, g)))
    res = where(neg, PI / (_sinpi(seq, x) * g), g)
    res = where(tirx.And(neg, x == tirx.floor(x)), _nan(x), res)
    return seq.done(res)


# ---------------------------------------------------------------------------------------------
# Modified Bessel functions I0, I1 (Cephes Chebyshev series, as Paddle's bessel kernels)

# exp(-x) I0(x) on [0, 8]
_I0E_A = [
    -4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16,
    1.71539128555513303061E-15, -1.16853328779934516808E-14, 7.67618549860493561688E-14,
    -4.85644678311192946090E-13, 2.95505266312963983461E-12, -1.72682629144155570723E-11,
    9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
    -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7,
    1.11738753912010371815E-6, -4.41673835845875056359E-6, 1.64484480707288970893E-5,
    -5.75419501008210370398E-5, 1.88502885095841655729E-4, -5.76375574538582365885E-4,
    1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
    -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2,
    1.71620901522208775349E-1, -3.04682672343198398683E-1, 6.76795274409476084995E-1,
]
# exp(-x) sqrt(x) I0(x) on [8, inf]
_I0E_B = [
    -7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17,
    3.46122286769746109310E-17, -2.82762398051658348494E-16, -3.42548561967721913462E-16,
    1.77256013305652638360E-15, 3.81168066935262242075E-15, -9.55484669882830764870E-15,
    -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
    7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11,
    -3.14991652796324136454E-11, 1.18891471078464383424E-11, 4.94060238822496958910E-10,
    3.39623202570838634515E-9, 2.26666899049817806459E-8, 2.04891858946906374183E-7,
    2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
    8.04490411014108831608E-1,
]
# exp(-x) I1(x) / x on [0, 8]; Paddle's float32 kernels keep the last 17 terms
_I1E_A = [
    2.77791411276104639959E-18, -2.11142121435816608115E-17, 1.55363195773620046921E-16,
    -1.10559694773538630805E-15, 7.60068429473540693410E-15, -5.04218550472791168711E-14,
    3.22379336594557470981E-13, -1.98397439776494371520E-12, 1.17361862988909016308E-11,
    -6.66348972350202774223E-11, 3.62559028155211703701E-10, -1.88724975172282928790E-9,
    9.38153738649577178388E-9, -4.44505912879632808065E-8, 2.00329475355213526229E-7,
    -8.56872026469545474066E-7, 3.47025130813767847674E-6, -1.32731636560394358279E-5,
    4.78156510755005422638E-5, -1.61760815825896745588E-4, 5.12285956168575772895E-4,
    -1.51357245063125314899E-3, 4.15642294431288815669E-3, -1.05640848946261981558E-2,
    2.47264490306265168283E-2, -5.29459812080949914269E-2, 1.02643658689847095384E-1,
    -1.76416518357834055153E-1, 2.52587186443633654823E-1,
]
# exp(-x) sqrt(x) I1(x) on [8, inf]; Paddle's float32 kernels keep the last 7 terms
_I1E_B = [
    7.51729631084210481353E-18, 4.41434832307170791151E-18, -4.65030536848935832153E-17,
    -3.20952592199342395980E-17, 2.96262899764595013876E-16, 3.30820231092092828324E-16,
    -1.88035477551078244854E-15, -3.81440307243700780478E-15, 1.04202769841288027642E-14,
    4.27244001671195135429E-14, -2.10154184277266431302E-14, -4.08355111109219731823E-13,
    -7.19855177624590851209E-13, 2.03562854414708950722E-12, 1.41258074366137813316E-11,
    3.25260358301548823856E-11, -1.89749581235054123450E-11, -5.58974346219658380687E-10,
    -3.83538038596423702205E-9, -2.63146884688951950684E-8, -2.51223623787020892529E-7,
    -3.88256480887769039346E-6, -1.10588938762623716291E-4, -9.76109749136146840777E-3,
    7.78576235018280120474E-1,
]


def _cheb_to_monomial(coeffs) -> list[float]:
    """Cephes ``chbevl(y, coeffs)`` = 0.5·(b₀ - b₂) (Clenshaw) as a polynomial in y, highest
    degree first, computed exactly. On y ∈ [-2, 2] these monomial forms are well conditioned
    (Σ|aₖ|2ᵏ ≈ max |series|; Horner agrees with Clenshaw to 2e-15)."""
    def lin(p, q, a=1, b=1):
        n = max(len(p), len(q))
        return [a * (p[i] if i < len(p) else 0) + b * (q[i] if i < len(q) else 0) for i in range(n)]
    b0, b1, b2 = [Fraction(coeffs[0])], [Fraction(0)], [Fraction(0)]
    for c in coeffs[1:]:
        b2, b1 = b1, b0
        b0 = lin(lin([Fraction(0)] + b1, b2, 1, -1), [Fraction(c)])
    res = lin(b0, b2, Fraction(1, 2), Fraction(-1, 2))
    return [float(v) for v in reversed(res)]


def _series(name, table, f32_len=None):
    full = _cheb_to_monomial(table)
    short = _cheb_to_monomial(table[-f32_len:]) if f32_len else full
    return {"float64": full, "float32": short}


# Paddle's float32 kernels keep the last 17 (I1e A) and 7 (I1e B) Chebyshev terms.
_SERIES = {
    "i0e_a": _series("i0e_a", _I0E_A),
    "i0e_b": _series("i0e_b", _I0E_B),
    "i1e_a": _series("i1e_a", _I1E_A, 17),
    "i1e_b": _series("i1e_b", _I1E_B, 7),
}


def _bessel(x, kind, scaled=True):
    """Paddle's |x| ≤ 8 / |x| > 8 split: A-series at |x|/2 - 2, B-series at 32/|x| - 2 over √|x|
    (the I1 A-series times |x|); I1 is odd; the unscaled functions multiply by exp(|x|)."""
    seq = Seq("bs")
    dt = dtype_of(x)
    ax = seq.let(tirx.abs(x))
    a = _horner(ax * 0.5 - 2.0, _SERIES[f"i{kind}e_a"][dt])
    b = _horner(32.0 / ax - 2.0, _SERIES[f"i{kind}e_b"][dt]) / tirx.sqrt(ax)
    if kind == 1:
        a = a * ax
    val = seq.let(where(ax <= 8.0, a, b))
    if not scaled:
        val = seq.let(tirx.exp(ax) * val)
    if kind == 1:
        val = where(x < 0, -val, val)
    return seq.done(val)


def i0e(x):
    """exp(-|x|)·I0(x)."""
    return _bessel(x, 0)


def i0(x):
    """I0(x) = exp(|x|)·i0e(x)."""
    return _bessel(x, 0, scaled=False)


def i1e(x):
    """exp(-|x|)·I1(x) (float32 uses Paddle's shortened coefficient sets)."""
    return _bessel(x, 1)


def i1(x):
    """I1(x) = exp(|x|)·i1e(x)."""
    return _bessel(x, 1, scaled=False)
