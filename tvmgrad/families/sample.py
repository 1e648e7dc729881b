"""The sample family: whole-tensor TE builders planned on the host (interpolation, grid sampling,
ROI pooling, signal grads).

``@sample_op(host=...)``: ``host(call, outs, dt) -> Host`` validates the call (it may read index
arrays on the host) and decides the kernel: its code-changing facts (``Host.static``, the
builder's ``ctx.info``), runtime scalar parameters (``ctx.scalars``; one named like an attribute
is also the builder's argument of that name), outputs that are an input's data reshaped (no
kernel work), inputs read only on the host (the builder gets None for them) and views (zero-copy
shapes the kernel sees, e.g. to serve every rank with one kernel). Attributes never enter the
key by themselves: only ``Host.static`` does. Index math is narrowed to 32 bits when every
tensor of the call is small enough.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..dtypes import FLOATS
from .base import OpImpl, Plan
from .signature import Scalar, Signature, buffers_of

__all__ = ["SampleOp", "Host", "sample_op"]


@dataclass
class Host:
    """A host planner's decisions for one call (module docstring)."""

    static: dict = field(default_factory=dict)      # fact -> hashable value (never a size)
    scalars: dict = field(default_factory=dict)     # name -> (TVM dtype, value)
    alias: dict = field(default_factory=dict)       # output -> the input it reshapes
    host_only: set = field(default_factory=set)     # inputs that are not kernel parameters
    views: dict = field(default_factory=dict)       # tensor -> the shape the kernel sees


def _fits_int32(metas, values) -> bool:
    """Every tensor of the call (and every int64 scalar) is small enough for 32-bit index math,
    with a factor-2 margin for the offsets the kernels form past an element count, and none
    holds int64 data (TVM narrows only functions without int64 parameters)."""
    limit = 2 ** 30
    try:
        for m in metas:
            for x in (m if isinstance(m, list) else [m]):
                if x is None:
                    continue
                if x.dtype.name == "int64" or math.prod(int(d) for d in x.shape) >= limit:
                    return False
        return all(abs(int(v)) < limit for v in values)
    except TypeError:               # symbolic sizes (a Relax graph): keep 64-bit indices
        return False


class SampleOp(OpImpl):
    """A whole-tensor TE builder whose kernel a host function decides (module docstring)."""

    family_kind = "tensor"

    def __init__(self, fn, *, host, dtypes=FLOATS, float_inputs=None,
                 index_dtypes=("int32", "int64"), pattern="gather_owners", infer_meta=None):
        super().__init__(fn, dtypes=dtypes, infer_meta=infer_meta)
        self.host = host
        self.float_inputs = None if float_inputs is None else tuple(float_inputs)
        self.index_dtypes = tuple(index_dtypes)
        self.pattern = pattern

    def plan(self, call, outs) -> Plan:
        spec = call.spec
        present = [p.name for p in spec.tensor_args if call.tensors[p.name] is not None]
        floats = [n for n in present if self.float_inputs is None or n in self.float_inputs]
        dt = self.check_dtype(call, floats)
        h = self.host(call, outs, dt)
        self.check_index_dtypes(call, [n for n in present if n not in floats and n not in h.host_only],
                                self.index_dtypes)
        kept = [None if o.name in h.alias else m for o, m in zip(spec.outputs, outs)]
        views = {n: tuple(int(d) for d in v) for n, v in h.views.items()}
        metas = {n: call.meta(n) for n in present if n not in h.host_only}
        narrow = _fits_int32([call.meta(n) for n in present] + kept,
                             [v for d, v in h.scalars.values() if d == "int64"])
        sig = Signature("sample", call.op, dt, buffers_of(spec, metas, kept, views=views),
                        tuple(Scalar(n, d, v) for n, (d, v) in h.scalars.items()),
                        (tuple(sorted(h.static.items())), ("narrow", narrow)))
        aliases = {o.name: (h.alias[o.name], m.shape) for o, m in zip(spec.outputs, outs)
                   if o.name in h.alias and m is not None}
        attrs, info = dict(call.attrs), dict(h.static)
        make = None
        if any(m is not None for m in kept):
            make = lambda static: sig.build(self, spec, attrs, info=info)  # noqa: E731
        return sig.plan(make, pattern=self.pattern, aliases=aliases, narrow_index=narrow)


sample_op = SampleOp.decorator  # @sample_op(host=...): a ``SampleOp`` builder (module docstring)
