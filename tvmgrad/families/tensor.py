"""The tensor family: a grad written in TE over whole tensors.

``@tensor_op`` hands the builder one ``te.Tensor`` per input (symbolic sizes, one per dim; a
list for ``Tensor[]``; None for an absent optional), float attributes as runtime scalar vars and
the rest as Python values; it returns one ``te.Tensor`` per output in YAML order (a list for a
``Tensor[]`` output, None for an output that is not produced). One kernel serves every size of a
given rank, dtype and set of code-changing attributes.

Builders load with ``tvmgrad.dtypes.to_compute`` and store in the output dtype themselves. A complex
tensor (complex64/128, stored as float32/64 pairs) arrives with a trailing dim of 2 (re, im); its
outputs must have one too.

Options: ``dtypes`` (of the float inputs), ``float_inputs`` (which inputs carry that dtype; the
rest are index tensors of ``index_dtypes``), ``static`` (float attributes to bake in), ``validate``
(``fn(call, outs)`` raising ValueError for inputs shape inference cannot judge; run on calls with
data, and on every call with ``validate_always``: it checks ``call.has_data`` before reading
values), ``pattern`` (the schedule module to use, ``schedules/<target>/<pattern>.py``; default:
the generic rules).
"""

from __future__ import annotations

import math
from typing import Callable

from ..dtypes import FLOATS, DType
from ..infer_meta import is_symbolic, same_dim
from .base import OpImpl, Plan
from .pointwise import RUNTIME_ATTR_TYPES
from .signature import Signature, attr_scalars, buffers_of

__all__ = ["tensor_op", "TensorOp", "view_shape"]


class TensorOp(OpImpl):
    family_kind = "tensor"

    def __init__(self, fn: Callable, *, dtypes=FLOATS, infer_meta=None, static=(),
                 index_dtypes=("int32", "int64"), float_inputs=None, validate=None,
                 validate_always=False, pattern="generic"):
        super().__init__(fn, dtypes=dtypes, infer_meta=infer_meta)
        self.pattern = pattern
        self.static = tuple(static)
        self.index_dtypes = tuple(index_dtypes)
        self.float_inputs = None if float_inputs is None else tuple(float_inputs)
        self.validate = validate
        self.validate_always = validate_always

    def runtime_attrs(self, spec) -> list[str]:
        return [p.name for p in spec.attrs
                if p.base_type in RUNTIME_ATTR_TYPES and p.name not in self.static]

    def _float_names(self, spec, present):
        if self.float_inputs is not None:
            return [n for n in present if n in self.float_inputs]
        return present

    def checked_inputs(self, call, exclude=()):
        """(present input names, compute dtype, metas): the float inputs share one supported dtype,
        the others are index tensors of ``index_dtypes``; ``exclude`` names inputs judged elsewhere."""
        present = [p.name for p in call.spec.tensor_args if call.tensors[p.name] is not None]
        data = [n for n in present if n not in exclude]
        floats = self._float_names(call.spec, data)
        dt = self.check_dtype(call, floats)
        self.check_index_dtypes(call, [n for n in data if n not in floats], self.index_dtypes)
        return present, dt, {n: call.meta(n) for n in present}

    def signature(self, call, dt: DType, metas: dict, outs, *, family="tensor", facts=(),
                  views=None, dims=None, scalars=None, index="int64"):
        """The Signature of this call's kernel: ``metas``' inputs and ``outs``' outputs (their
        own shapes unless ``views``/``dims`` say otherwise), the runtime float attributes as
        scalars (or ``scalars``), the baked attributes and ``facts`` as its facts."""
        runtime = self.runtime_attrs(call.spec)
        if scalars is None:
            scalars = attr_scalars(call.op, runtime, dt.compute, call.attrs)
        static = tuple((p.name, call.attrs[p.name]) for p in call.spec.attrs
                       if p.name not in runtime)
        return Signature(family, call.op, dt, buffers_of(call.spec, metas, outs, views=views, dims=dims),
                         tuple(scalars), (static,) + tuple(facts), index)

    def plan(self, call, outs) -> Plan:
        present, dt, metas = self.checked_inputs(call)
        if self.validate is not None and (call.has_data or self.validate_always):
            self.validate(call, outs)
        sig = self.signature(call, dt, metas, outs)
        spec, attrs = call.spec, dict(call.attrs)
        return sig.plan(lambda static: sig.build(self, spec, attrs, static=static),
                        pattern=self.pattern, static=True)


tensor_op = TensorOp.decorator  # @tensor_op: a whole-tensor TE builder (module docstring)


def view_shape(op: str, name: str, template, sizes: dict, meta) -> tuple:
    """The shape a kernel sees ``name`` with: ``template``'s dims resolved (names from ``sizes``,
    numbers as they are; symbolic dims of a Relax graph stay symbolic). A view must hold exactly
    the tensor's elements; a mismatch is a planner bug, not a user error."""
    shape = tuple(sizes[d] if isinstance(d, str) else d for d in template)
    shape = tuple(d if is_symbolic(d) else int(d) for d in shape)
    if not same_dim(math.prod(shape), math.prod(meta.shape)):
        raise RuntimeError(f"{op}: view {list(shape)} of {name} {list(meta.shape)}")
    return shape
