"""The reinterpret family: as_real / as_complex, the same memory seen as complex numbers or as
pairs of reals.

In storage a complex tensor and a real one with a trailing dim of 2 are the same pairs of reals,
so the kernel copies an (n, 2) buffer (one kernel for every shape; a copy because Paddle returns
a new tensor). ``source``: "complex" (as_real) or "real" (as_complex).
"""

from __future__ import annotations

import math

from ..dtypes import to_compute
from ..lazy import te
from .base import OpImpl, Plan
from .signature import Buffer, Signature

__all__ = ["Reinterpret"]


class Reinterpret(OpImpl):
    """A copy between a complex tensor and a real one with a trailing dim of 2 (module docstring)."""

    family_kind = "tensor"

    def __init__(self, fn, *, source, **options):
        super().__init__(fn, **options)
        self.source = source

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        meta = call.meta("x")
        if meta is None:
            raise ValueError(f"{op}: missing input 'x'")
        if meta.dtype.name not in self.dtypes:
            raise TypeError(f"{op}: input 'x' has dtype {meta.dtype.name}; {op} supports "
                            f"{', '.join(self.dtypes)}")
        out = outs[0]
        src, dst = meta.dtype, out.dtype
        pairs = math.prod(meta.shape if self.source == "complex" else out.shape)
        complex_, real = (("n",), (pairs,)), (("n", 2), (pairs, 2))
        (in_dims, in_view), (out_dims, out_view) = ((complex_, real) if self.source == "complex"
                                                    else (real, complex_))
        sig = Signature("reinterpret", op, src, (Buffer("input", "x", src, in_dims, view=in_view),
                                                 Buffer("output", "out", dst, out_dims, view=out_view)))

        def make(static):
            # written out (not ``sig.build``): the pair dim stays the int32 literal it always was
            n = te.var("n", "int64")
            x = te.placeholder((n, 2), src.storage, name="x")
            y = te.compute((n, 2), lambda i, c: to_compute(x[i, c], src).astype(dst.storage), name="out")
            return self.prim_func(spec, [x, y])

        return sig.plan(make, pattern="generic", inplace_safe=True)
