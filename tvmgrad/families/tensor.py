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
(``fn(call, outs)`` raising ValueError for inputs shape inference cannot judge), ``pattern`` (the
schedule module to use, ``schedules/<target>/<pattern>.py``; default: the generic rules).
"""

from __future__ import annotations

import hashlib
import math
from typing import Callable

from ..dtypes import FLOATS, DType
from ..infer_meta import is_symbolic, same_dim
from .base import Arg, OpImpl, Plan, scalar_arg
from .pointwise import RUNTIME_ATTR_TYPES

__all__ = ["tensor_op", "TensorOp", "builder_kwargs", "builder_outputs", "call_builder",
           "kernel_params", "output_params", "view_shape"]


class TensorOp(OpImpl):
    family_kind = "tensor"

    def __init__(self, fn: Callable, *, dtypes=FLOATS, infer_meta=None, static=(),
                 index_dtypes=("int32", "int64"), float_inputs=None, validate=None,
                 pattern="generic"):
        super().__init__(fn, dtypes=dtypes, infer_meta=infer_meta)
        self.pattern = pattern
        self.static = tuple(static)
        self.index_dtypes = tuple(index_dtypes)
        self.float_inputs = None if float_inputs is None else tuple(float_inputs)
        self.validate = validate

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

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present, dt, metas = self.checked_inputs(call)
        if self.validate is not None and call.has_data:
            self.validate(call, outs)
        layout = tuple((n, tuple((m.ndim, m.dtype.name) for m in metas[n]) if isinstance(metas[n], list)
                        else (metas[n].ndim, metas[n].dtype.name)) for n in present)
        out_layout = tuple(None if m is None else
                           (tuple(x.dtype.name for x in m) if isinstance(m, list) else m.dtype.name)
                           for m in outs)
        runtime = self.runtime_attrs(spec)
        static = tuple((p.name, call.attrs[p.name]) for p in spec.attrs if p.name not in runtime)
        key = ("tensor", op, dt.name, layout, out_layout, static)
        digest = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
        args = []
        for n in present:
            if n in spec.no_need_buffer:
                continue                      # the kernel gets its shape through other buffers
            if isinstance(metas[n], list):
                args += [Arg("input", n, index=i) for i in range(len(metas[n]))]
            else:
                args.append(Arg("input", n))
        args += [scalar_arg(call.op, n, dt.compute, call.attrs[n]) for n in runtime]
        for o, m in zip(spec.outputs, outs):
            if isinstance(m, list):
                args += [Arg("output", o.name, index=i) for i in range(len(m))]
            elif m is not None:
                args.append(Arg("output", o.name))
        attrs = dict(call.attrs)
        return Plan(key=key, symbol=f"{op}_{dt.name}_{digest}",
                    make=lambda: self._make(spec, dt, metas, outs, runtime, attrs),
                    make_static=lambda inline=False: self._make(spec, dt, metas, outs, runtime, attrs,
                                                                static=True),
                    args=tuple(args), pattern=self.pattern)

    def _make(self, spec, dt: DType, metas, outs, runtime, attrs, static=False):
        from tvm import te, tirx

        def holder(name, meta):
            shape = ([tirx.IntImm("int64", int(n)) for n in meta.shape] if static
                     else [te.var(f"{name}_d{d}", "int64") for d in range(meta.ndim)])
            if meta.dtype.lanes == 2:
                shape.append(2)
            return te.placeholder(shape, meta.dtype.storage, name=name)

        tensors = {}
        for n, m in metas.items():
            tensors[n] = [holder(f"{n}{i}", x) for i, x in enumerate(m)] if isinstance(m, list) else holder(n, m)
        scalars = {n: te.var(n, dt.compute) for n in runtime}
        result = call_builder(self.fn, spec, builder_kwargs(spec, tensors, scalars, attrs))
        return self.prim_func(spec, kernel_params(spec, tensors, scalars.values(), outs, result))


def builder_kwargs(spec, *sources) -> dict:
    """A builder's keyword arguments, one per YAML arg: its value from the first of ``sources``
    (dicts: placeholders, scalar vars, attribute values, ...) that has it, else None."""
    kwargs = {}
    for p in spec.args:
        kwargs[p.name] = next((src[p.name] for src in sources if p.name in src), None)
    return kwargs


def output_params(spec, outs, result) -> list:
    """The builder's output tensors as kernel parameters, in YAML order: outputs this call does not
    produce (meta None) are skipped, a Tensor[] output gives each element."""
    params = []
    for o, m, r in zip(spec.outputs, outs, result):
        if m is None:
            continue
        if r is None:
            raise RuntimeError(f"{spec.name}: output {o.name} is expected but the builder gave None")
        params += list(r) if isinstance(m, list) else [r]
    return params


def kernel_params(spec, tensors, scalars, outs, result) -> list:
    """A kernel's parameters in the order ``plan`` lists its args: the input placeholders (dict in
    plan order; a Tensor[] input gives each element) except no_need_buffer ones, then the runtime
    scalar vars, then the produced outputs (``output_params``)."""
    params = []
    for n, t in tensors.items():
        if n not in spec.no_need_buffer:
            params += t if isinstance(t, list) else [t]
    params += list(scalars)
    params += output_params(spec, outs, result)
    return params


def call_builder(fn, spec, kwargs, *, multi=None) -> list:
    """Run a builder and return one result per YAML output (``builder_outputs``)."""
    return builder_outputs(spec, fn(**kwargs), multi=multi)


def builder_outputs(spec, result, *, multi=None) -> list:
    """A builder's return value as one result per YAML output. A single-output op's builder returns
    the tensor itself; ``multi`` overrides that (an op whose builder always returns a tuple)."""
    many = len(spec.outputs) > 1 if multi is None else multi
    result = list(result) if many and isinstance(result, (tuple, list)) else [result]
    if len(result) != len(spec.outputs):
        raise RuntimeError(f"{spec.name}: builder returned {len(result)} outputs for "
                           f"{spec.output_names}")
    return result


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
