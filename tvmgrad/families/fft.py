"""The fft family: the planner of the FFT grads (their transforms are in te_defs/fft.py).

``@fft_op(kind=...)`` (``kind``: "c2c", "r2c" or "c2r") checks a call as Paddle's FFT grad kernels
do and describes its kernel: the signal's dims are the shared size symbols ``d0``, ``d1``, ...
(r2c's out_grad has its own last dim ``g_last``); the direction and the normalisation factor are
runtime scalars (``fft_sign``, ``fft_scale``), and so are the per-axis sizes the transform needs
(``l2_<axis>``: log2 L of a power-of-two axis; ``m_<axis>``, ``l2m_<axis>``: Bluestein's
power-of-two M >= 2L - 1 and its log2), so that one kernel serves every size whose "power of two"
pattern over the axes matches. The builder reads that pattern as ``ctx.info`` (an ``FFTInfo``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import dtype as as_dtype
from .base import OpImpl, Plan
from .signature import Scalar, Signature, buffers_of

__all__ = ["FFTOp", "FFTInfo", "fft_op"]

# the complex dtype whose transform a real (c2r) out_grad takes
_CPLX = {"float32": "complex64", "float64": "complex128", "float16": "complex64", "bfloat16": "complex64"}


@dataclass(frozen=True)
class FFTInfo:
    """What an FFT builder reads from ``ctx.info``."""

    rank: int
    axes: tuple             # the transform axes, normalised, in transform order
    pow2: tuple             # per axis: is its length a power of two (Stockham) or not (Bluestein)
    real: str               # the float dtype of the transform's (re, im) pairs


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _log2(n: int) -> int:
    return max(n, 1).bit_length() - 1


def _norm(normalization: str, forward: bool) -> str:
    """Paddle's get_norm_from_string: "none", "by_n" or "by_sqrt_n"."""
    if normalization == "backward":
        return "none" if forward else "by_n"
    if normalization == "forward":
        return "by_n" if forward else "none"
    return "by_sqrt_n"


class FFTOp(OpImpl):
    """An FFT grad (module docstring)."""

    family_kind = "tensor"

    def __init__(self, fn, *, kind: str, **options):
        super().__init__(fn, **options)
        self.kind = kind

    def _axes(self, call, rank: int) -> list[int]:
        op, axes = call.op, []
        for a in call.attrs["axes"]:
            if not -rank <= a < rank:
                raise ValueError(f"{op}: attribute 'axes' holds {a}, out of range for out_grad of rank {rank}")
            axes.append(a % rank)
        if not axes:
            raise ValueError(f"{op}: attribute 'axes' must not be empty")
        if len(set(axes)) != len(axes):
            raise ValueError(f"{op}: attribute 'axes' has repeated axes {list(call.attrs['axes'])}")
        return axes

    def _signal(self, call, g, axes) -> tuple:
        """The shape of the signal the grad transforms (x's for r2c, out_grad's otherwise)."""
        op, attrs, rank = call.op, call.attrs, g.ndim
        if self.kind == "r2c":
            x = call.meta("x")
            if x.ndim != rank:
                raise ValueError(f"{op}: x has rank {x.ndim} but out_grad has rank {rank}")
            last = axes[-1]
            expect = [x.shape[i] // 2 + 1 if (i == last and attrs["onesided"]) else x.shape[i]
                      for i in range(rank)]
            if list(g.shape) != expect:
                raise ValueError(f"{op}: out_grad has shape {list(g.shape)}; for x of shape "
                                 f"{list(x.shape)} (onesided={attrs['onesided']}) it must be {expect}")
            if not x.dtype.is_float:
                raise TypeError(f"{op}: input 'x' has dtype {x.dtype.name}; it must be a float dtype "
                                f"(x_grad gets it)")
            if _CPLX.get(x.dtype.name) != g.dtype.name:
                raise TypeError(f"{op}: input 'x' has dtype {x.dtype.name} but out_grad has "
                                f"{g.dtype.name}; they must be of one precision (float16, "
                                f"bfloat16 and float32 go with complex64, float64 with complex128)")
            return tuple(x.shape)
        if self.kind == "c2r":
            if attrs["last_dim_size"] > 0 and g.shape[axes[-1]] != attrs["last_dim_size"]:
                raise ValueError(f"{op}: out_grad has size {g.shape[axes[-1]]} along axis {axes[-1]} but "
                                 f"last_dim_size is {attrs['last_dim_size']}; they must match")
            for a in axes:
                if g.shape[a] == 0:
                    raise ValueError(f"{op}: out_grad has size 0 along transform axis {a}: a c2r "
                                     f"transform of 0 points is undefined (Paddle: invalid fft "
                                     f"n-point 0)")
        return tuple(g.shape)

    def plan(self, call, outs) -> Plan:
        spec, op, attrs = call.spec, call.op, call.attrs
        g = call.meta("out_grad")
        if g.dtype.name not in self.dtypes:
            raise TypeError(f"{op}: input 'out_grad' has dtype {g.dtype.name}; {op} supports "
                            f"{', '.join(self.dtypes)}")
        if attrs["normalization"] not in ("backward", "forward", "ortho"):
            raise ValueError(f"{op}: attribute 'normalization' is {attrs['normalization']!r}; it must be "
                             f"'backward', 'forward' or 'ortho'")
        rank = g.ndim
        axes = self._axes(call, rank)
        signal = self._signal(call, g, axes)
        if math.prod(outs[0].shape) == 0:
            # an empty grad (a size-0 dim, on a transform axis or not): nothing to compute, as
            # Paddle (the kernels' index math would divide by the zero size)
            return Plan(key=("fft", op, g.dtype.name, outs[0].dtype.name, "empty"),
                        symbol=f"{op}_{g.dtype.name}_empty", make=None, args=())
        pow2 = tuple(_pow2(signal[a]) for a in axes)
        n_sig = math.prod(signal[a] for a in axes)
        scale = {"none": 1.0, "by_n": 1.0 / max(n_sig, 1),
                 "by_sqrt_n": 1.0 / math.sqrt(max(n_sig, 1))}[_norm(attrs["normalization"], attrs["forward"])]
        real = as_dtype(g.dtype.name if self.kind != "c2r" else _CPLX[g.dtype.name]).storage
        scalars = []
        for a, p in zip(axes, pow2):
            n = signal[a]
            if p:
                scalars.append(Scalar(f"l2_{a}", "int64", _log2(n)))
            else:
                m = 1 << (2 * n - 2).bit_length() if n > 1 else 1
                scalars += [Scalar(f"m_{a}", "int64", m), Scalar(f"l2m_{a}", "int64", _log2(m))]
        # direction and normalization are runtime arguments: one kernel serves all of them
        scalars += [Scalar("fft_sign", real, 1.0 if attrs["forward"] else -1.0),  # the grad runs the other way
                    Scalar("fft_scale", real, scale)]
        sym = tuple(f"d{i}" for i in range(rank))
        metas = {"out_grad": g}
        dims = {"out_grad": sym, "x_grad": sym}
        if self.kind == "r2c":
            metas = {"x": call.meta("x"), "out_grad": g}
            dims.update(x=sym, out_grad=sym[:axes[-1]] + ("g_last",) + sym[axes[-1] + 1:])
        elif self.kind == "c2r":        # x_grad keeps n // 2 + 1 bins of the last axis (the builder sizes it)
            dims["x_grad"] = sym[:axes[-1]] + (None,) + sym[axes[-1] + 1:]
        info = FFTInfo(rank, tuple(axes), pow2, real)
        sig = Signature("fft", op, g.dtype, buffers_of(spec, metas, outs, dims=dims), tuple(scalars), (info,))
        attrs = dict(attrs)
        return sig.plan(lambda static: sig.build(self, spec, attrs, info=info), pattern="fft_stages")


fft_op = FFTOp.decorator  # @fft_op(kind=...): an FFT grad's builder (module docstring)
