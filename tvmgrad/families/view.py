"""The view family: ``@tensor_op`` builders whose arrays are viewed (zero-copy) with shapes chosen
per call, e.g. ``(rows, cols)`` for a layer norm or ``(pre, n, post)`` for a softmax along any
axis, so that one kernel serves every rank and axis and the schedules see plain row/column
reductions (the reduction grads of te_defs/norm.py, softmax.py and loss.py).

``views(call, outs) -> (templates, sizes)``: ``templates[name]`` is the shape the input or output
``name`` is seen with (same elements, C order), each dim a size symbol (a runtime size shared by
every tensor that names it) or an int (baked into the kernel, e.g. the 1 of a label along the
class axis); ``sizes[symbol]`` is this call's value. Tensors without a template keep their own
shape, one size var per dim. The kernel key holds the templates, never the sizes.

A row kernel (``pattern="red_rows"``) whose largest output has rows of a whole number of
``streaming.ROW_MULTIPLE`` elements may stream its stores on a large call: its variant bakes
that row length in (tvmgrad/streaming.py).

``check(call, outs)`` validates what shape inference cannot (label values, ...), raising
ValueError/TypeError naming op and argument; it runs on calls with data.
"""

from __future__ import annotations

import dataclasses
import math

from ..streaming import ROW_MULTIPLE, output_bytes
from .base import Plan
from .tensor import TensorOp, view_shape

__all__ = ["ViewOp", "view_op"]


class ViewOp(TensorOp):
    """``tensor_op`` with per-call views (module docstring)."""

    def __init__(self, fn, *, views=None, check=None, **options):
        super().__init__(fn, validate=check, **options)
        self.views = views

    def plan(self, call, outs) -> Plan:
        present, dt, metas = self.checked_inputs(call)
        if self.validate is not None and call.has_data:
            self.validate(call, outs)
        templates, sizes = self.views(call, outs) if self.views else ({}, {})
        every = dict(metas, **{o.name: m for o, m in zip(call.spec.outputs, outs) if m is not None})
        templates = {n: tuple(t) for n, t in templates.items() if n in every}
        plan = self._plan(call, outs, dt, metas, every, templates, sizes)
        rows = (self._row_length(call, outs, templates, sizes) if self.pattern == "red_rows"
                else None)
        if rows is None:
            return plan
        baked = {n: tuple(sizes[d] if d == rows else d for d in t) for n, t in templates.items()}

        def variant() -> Plan:
            own = self._plan(call, outs, dt, metas, every, baked, sizes)
            dims = tuple((i, axis, sizes[rows]) for i, a in enumerate(own.args)
                         if a.kind != "scalar" and a.index is None
                         for axis, d in enumerate(templates.get(a.name, ())) if d == rows)
            return dataclasses.replace(own, baked=dims)

        return dataclasses.replace(plan, stream_bytes=output_bytes(outs),
                                   stream_variant=variant)

    def _plan(self, call, outs, dt, metas, every, templates, sizes) -> Plan:
        views = {n: view_shape(call.op, n, t, sizes, every[n]) for n, t in templates.items()}
        sig = self.signature(call, dt, metas, outs, family="view", views=views, dims=templates)
        spec, attrs = call.spec, dict(call.attrs)
        return sig.plan(lambda static: sig.build(self, spec, attrs), pattern=self.pattern)

    @staticmethod
    def _row_length(call, outs, templates, sizes) -> str | None:
        """The size symbol of the rows of the largest float output, where its length is a
        multiple of ``ROW_MULTIPLE`` (else None): what a streamed variant bakes in (so that
        LLVM proves every vector store of a row aligned: tvmgrad/streaming.py)."""
        floats = [(math.prod(m.shape), o.name) for o, m in zip(call.spec.outputs, outs)
                  if m is not None and m.dtype.is_float and o.name in templates]
        static = all(isinstance(d, int) for m in outs if m is not None for d in m.shape)
        if not floats or not static:
            return None
        last = templates[max(floats)[1]][-1]
        if not isinstance(last, str) or not isinstance(sizes.get(last), int):
            return None
        return last if sizes[last] % ROW_MULTIPLE == 0 else None


view_op = ViewOp.decorator  # @view_op: a ``ViewOp`` builder (module docstring)
