"""The dense family: ``@tensor_op`` for tiled contractions (te_defs/matmul.py, conv.py, pool.py).

``@dense_op(views=...)``: ``views(call, outs) -> View`` gives per-call zero-copy views of the
inputs/outputs (each dim a symbol name shared by every tensor that names it, or an int baked into
the kernel: a conv's kernel size) and ``info``, hashable values derived from the call (resolved
paddings, an association order, padding grains) that go into the kernel key; the builder reads
them as ``ctx.info`` and builds its index arithmetic in ``ctx.index`` (int32 when every tensor
of the call is small, see ``SMALL``). ``ignore``: attributes the kernel never reads (not in the
key). The ``gemm_dense`` schedules tile the contractions (te_defs/_dense.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..infer_meta import is_symbolic
from .base import Plan
from .signature import Signature, attr_scalars, buffers_of
from .tensor import TensorOp, view_shape

__all__ = ["dense_op", "DenseOp", "View", "SMALL"]

# tensors below this many elements get int32 index arithmetic (with room for padded operand
# copies; int32 offsets halve the registers of CUDA index arithmetic)
SMALL = 1 << 26


@dataclass
class View:
    """How a call's arrays are seen by the kernel (see the module docstring)."""

    templates: dict = field(default_factory=dict)   # name -> tuple of symbol names / ints (or list)
    sizes: dict = field(default_factory=dict)       # symbol -> this call's value
    info: tuple = ()                                # hashable, in the key, the builder's ctx.info


class DenseOp(TensorOp):
    """``tensor_op`` with per-call views and build info; schedules ``gemm_dense`` by default."""

    def __init__(self, fn, *, views=None, check=None, pattern="gemm_dense", ignore=(), **options):
        super().__init__(fn, validate=check, pattern=pattern, **options)
        self.views = views
        self.ignore = tuple(ignore)

    def runtime_attrs(self, spec) -> list[str]:
        return [n for n in super().runtime_attrs(spec) if n not in self.ignore]

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present, dt, metas = self.checked_inputs(call)
        if self.validate is not None:
            self.validate(call, outs)
        view = self.views(call, outs) if self.views else View()
        every = dict(metas, **{o.name: m for o, m in zip(spec.outputs, outs) if m is not None})
        dims, shapes = {}, {}
        for name, tpl in view.templates.items():
            if name not in every or tpl is None:
                continue
            meta = every[name]
            if isinstance(meta, list):
                dims[name] = [tuple(t) for t in tpl]
                shapes[name] = [view_shape(op, name, t, view.sizes, m) for t, m in zip(tpl, meta)]
            else:
                dims[name] = tuple(tpl)
                shapes[name] = view_shape(op, name, tpl, view.sizes, meta)
        sizes = [math.prod(m.shape) for m in every.values()
                 for m in (m if isinstance(m, list) else [m])]
        small = not any(map(is_symbolic, sizes)) and max(sizes, default=0) < SMALL
        runtime = self.runtime_attrs(spec)
        static = tuple((p.name, call.attrs[p.name]) for p in spec.attrs
                       if p.name not in runtime and p.name not in self.ignore)
        sig = Signature("dense", op, dt, buffers_of(spec, metas, outs, views=shapes, dims=dims),
                        tuple(attr_scalars(op, runtime, dt.compute, call.attrs)),
                        (static, view.info), "int32" if small else "int64")
        attrs, info = dict(call.attrs), view.info
        return sig.plan(lambda static: sig.build(self, spec, attrs, info=info),
                        pattern=self.pattern)


dense_op = DenseOp.decorator  # @dense_op: a ``DenseOp`` (see the module docstring)
