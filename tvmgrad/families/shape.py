"""Families of shape and data-movement grads: index-mapping kernels and zero-copy reshapes.

``@shape_op`` is ``@tensor_op`` (whole-tensor TE, see tensor.py) with what data movement needs so
that one kernel serves every size *and* every value of the attributes that do not change the code:

* ``canon(call, outs) -> {attr: value}``: the attribute values the kernel is built from (normalised
  axes, a shape attribute reduced to the broadcast pattern it implies, ...). They replace the
  call's values both in the kernel key and in what the builder receives; attributes the builder
  must not see can be canonicalised to None.
* ``runtime=("offsets", ...)``: int / int-list attributes passed as int64 runtime scalars (the
  builder gets a ``tirx.Var`` or a list of them); their values come from ``canon`` when it gives
  them (e.g. shifts reduced modulo the dim on the host).
* ``unit_dims=("x", ...)``: size-1 dims of these inputs are the constant 1 in their placeholders
  (part of the key), so that a builder can see which dims broadcast.
* ``views(call, outs) -> {name: shape}``: the shapes the kernel sees instead of the arrays' own
  (zero-copy reshapes, e.g. a roll over the flattened tensor is a 1-D kernel for every rank); a
  Tensor[] input or output takes a list of shapes.
* ``shape_only=("xshape", ...)``: inputs whose data is never read (besides the YAML
  no_need_buffer ones): any dtype, never passed to the kernel.

Dtypes (``dtypes=``): complex64/128 tensors reach the builder with the trailing (re, im) dim of 2
that the runtime passes (after the dims of their view; ``ctx.pair`` tells a builder that takes ``ctx``, so an index
map writes ``lambda o, j, *c: g[o, j + off, *c]`` and both parts move alike). Integer and bool
kernels compute in their own dtype; a float runtime attribute of such a kernel is passed as that
dtype (truncated toward 0, as C++'s static_cast); ``reduce_to`` sums integers wrapping, as
Paddle's kernels do, and bools as a logical OR (a count != 0).

A generic shape kernel whose outputs are float rows of a whole number of
``streaming.ROW_MULTIPLE`` elements (or flat) may stream its stores on a large call: its
variant bakes every tensor's row length in and takes the stream_stores schedule
(tvmgrad/streaming.py).

``@alias_op(source=...)``: every output is ``source``'s data reshaped (squeeze/unsqueeze/flatten/
view grads): a Plan without a kernel (``aliases``); the runtime returns a view when the caller
passes ``alias=True`` and a copy otherwise. When an output's dtype differs from the source's
(view_dtype_grad) the builder is compiled like a ``shape_op`` instead.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from .. import streaming
from ..dtypes import DType
from .base import OpError, Plan
from .pointwise import RUNTIME_ATTR_TYPES
from .signature import Scalar, Signature, attr_scalars, buffers_of
from .tensor import TensorOp

__all__ = ["shape_op", "alias_op", "ShapeOp", "AliasOp", "dt_of", "load", "zero", "total",
           "reduce_to"]

def _as_list(meta):
    return meta if isinstance(meta, list) else [meta]


class ShapeOp(TensorOp):
    family_kind = "tensor"

    def __init__(self, fn: Callable, *, canon=None, runtime=(), unit_dims=(), views=None,
                 shape_only=(), **options):
        super().__init__(fn, **options)
        self.canon = canon
        self.runtime_ints = tuple(runtime)
        self.unit_dims = tuple(unit_dims)
        self.views = views
        self.shape_only = tuple(shape_only)

    # -- planning ------------------------------------------------------------------------------
    def _skip(self, spec) -> set:
        return set(spec.no_need_buffer) | set(self.shape_only)


    def float_runtime(self, spec) -> list[str]:
        return [p.name for p in spec.attrs
                if p.base_type in RUNTIME_ATTR_TYPES and p.name not in self.static
                and p.name not in self.runtime_ints]

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present, dt, _ = self.checked_inputs(call, exclude=self.shape_only)
        if self.validate is not None:
            self.validate(call, outs)
        attrs = dict(call.attrs)
        if self.canon is not None:
            attrs.update(self.canon(call, outs))
        views = self.views(call, outs) if self.views is not None else {}
        metas = {n: call.meta(n) for n in present}
        every = dict(metas, **{o.name: m for o, m in zip(spec.outputs, outs) if m is not None})

        def unit(name, shape):    # a unit dim of a ``unit_dims`` input is baked in (a broadcast)
            return tuple(1 if name in self.unit_dims and d == 1 else None for d in shape)

        dims = {}
        for n, m in every.items():
            shapes = views.get(n, [x.shape for x in m] if isinstance(m, list) else m.shape)
            dims[n] = [unit(n, s) for s in shapes] if isinstance(m, list) else unit(n, shapes)
        f_runtime = self.float_runtime(spec)
        i_runtime = [n for n in self.runtime_ints if n in attrs]
        scalars = attr_scalars(op, f_runtime, dt.compute, attrs)
        for n in i_runtime:
            v = attrs[n]
            if isinstance(v, (list, tuple)):
                scalars += [Scalar(f"{n}{i}", "int64", int(x)) for i, x in enumerate(v)]
            else:
                scalars.append(Scalar(n, "int64", int(v)))
        static = tuple((p.name, attrs[p.name]) for p in spec.attrs
                       if p.name not in f_runtime and p.name not in i_runtime)
        skip = self._skip(spec)

        def ints(ctx):       # a list-valued runtime attribute reaches the builder as a list of vars
            return {n: [ctx.scalars[f"{n}{i}"] for i in range(len(attrs[n]))]
                    for n in i_runtime if isinstance(attrs[n], (list, tuple))}

        def planned(dims, pattern):
            buffers = tuple(replace(b, param=b.param and b.name not in skip)
                            for b in buffers_of(spec, metas, outs, views=views, dims=dims))
            sig = Signature("shape", op, dt, buffers, tuple(scalars), (static,))
            return sig.plan(lambda static: sig.build(self, spec, attrs, values=ints),
                            pattern=pattern)

        plan = planned(dims, self.pattern)
        # a generic kernel may stream (a rule of its own is kept: it was chosen over that one)
        rows = _rows(spec, every, views) if self.pattern == "generic" else None
        if rows is None:
            return plan

        def variant() -> Plan:    # rows' lengths baked in, under the stream_stores schedule
            baked = dict(dims)
            for n, lengths in rows.items():
                own = [d[:-1] + (length,) if length else d
                       for d, length in zip(_as_list(dims[n]), lengths)]
                baked[n] = own if isinstance(dims[n], list) else own[0]
            own = planned(baked, streaming.PATTERN)
            length = {(n, i): x for n, lengths in rows.items() for i, x in enumerate(lengths)}
            return replace(own, baked=tuple(
                (at, -1, length[a.name, a.index or 0]) for at, a in enumerate(own.args)
                if a.kind != "scalar" and length.get((a.name, a.index or 0))))

        return replace(plan, stream_bytes=streaming.output_bytes(outs), stream_variant=variant)


def _rows(spec, every: dict, views: dict) -> dict | None:
    """{tensor: the length of its rows (of each element of a Tensor[]), 0 where it is flat or
    its rows are not a whole number of ``streaming.ROW_MULTIPLE`` elements}: what a streamed
    variant bakes in, inputs as well (a builder shapes its outputs after its inputs), so that
    LLVM proves every vector store of a row aligned. None unless every output is a float array
    whose rows are such a length (or flat)."""
    outputs = {o.name for o in spec.outputs}
    rows = {}
    for name, m in every.items():
        pieces, view = _as_list(m), views.get(name)
        shapes = ([x.shape for x in pieces] if view is None
                  else list(view) if isinstance(m, list) else [view])
        if not all(isinstance(d, int) for shape in shapes for d in shape):
            return None
        lengths = [shape[-1] if len(shape) > 1 and shape[-1] % streaming.ROW_MULTIPLE == 0
                   else 0 for shape in shapes]
        if name in outputs and (not all(x.dtype.is_float for x in pieces) or any(
                not length and len(shape) > 1 for length, shape in zip(lengths, shapes))):
            return None
        rows[name] = lengths
    return rows


class AliasOp(ShapeOp):
    """Every output is the ``source`` input's data reshaped (see module docstring)."""

    family_kind = "tensor"

    def __init__(self, fn: Callable, *, source: str, **options):
        super().__init__(fn, **options)
        self.source = source

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present, dt, _ = self.checked_inputs(call, exclude=self.shape_only)
        if self.validate is not None:
            self.validate(call, outs)
        src = call.meta(self.source)
        produced = [(o, m) for o, m in zip(spec.outputs, outs) if m is not None]
        if any(m.dtype != src.dtype for _, m in produced):
            return super().plan(call, outs)
        for o, m in produced:
            if math.prod(m.shape) != math.prod(src.shape):
                raise OpError(f"{op}: {self.source!r} of shape {list(src.shape)} cannot be viewed "
                              f"as {o.name!r} of shape {list(m.shape)}")
        key = ("alias", op, dt.name)
        return Plan(key=key, symbol=f"{op}_{dt.name}_alias", make=None, args=(),
                    aliases={o.name: (self.source, tuple(m.shape)) for o, m in produced})


# ------------------------------------------------------------------------------------------
# helpers for builders (here so that the kernels of every module using them rebuild when they
# change: this file is part of each shape_op kernel's cache key)

def dt_of(t) -> DType:
    """The DType of a placeholder/compute's storage dtype."""
    from ..dtypes import dtype
    return dtype(str(t.dtype))


def load(t, *idx):
    """``t[idx]`` in the compute dtype (float32 for half types; bfloat16 widened exactly)."""
    from ..dtypes import to_compute
    return to_compute(t(*idx), dt_of(t))


def zero(t):
    """0 in ``t``'s storage dtype (selects between a stored element and 0 need no arithmetic)."""
    from tvm import tirx
    return tirx.const(0, str(t.dtype))


def total(values):
    """Sum of int64 exprs/ints (0 for none)."""
    from tvm import tirx
    acc = tirx.const(0, "int64")
    for v in values:
        acc = acc + v
    return acc


def reduce_to(g, keep, name, out_dtype=None):
    """``out[i] = Σ g[...]`` over the dims of ``g`` not in ``keep`` (a bool per dim of g; those
    dims have size 1 in ``out``; dims of g beyond ``keep``, a complex pair, are kept), accumulated
    in the compute dtype (integers wrap; bool: a count, stored as != 0) and stored in
    ``out_dtype`` (g's by default). Without a dim to reduce it is a plain copy."""
    from tvm import te, tirx
    dt = dt_of(g)
    storage = out_dtype or dt.storage
    keep = tuple(keep) + (True,) * (len(g.shape) - len(keep))
    if dt.name == "bool" and any(not k for k in keep):
        count = te.compute(g.shape, lambda *i: g(*i).astype("int32"), name=f"{name}_count")
        acc = reduce_to(count, keep, f"{name}_acc")
        return te.compute(acc.shape, lambda *i: acc(*i) != tirx.const(0, "int32"), name=name)
    shape = [g.shape[d] if keep[d] else 1 for d in range(len(keep))]
    red = [d for d in range(len(keep)) if not keep[d]]
    if not red:
        if storage == dt.storage:
            return te.compute(shape, lambda *i: g(*i), name=name)
        return te.compute(shape, lambda *i: load(g, *i).astype(storage), name=name)
    axes = {d: te.reduce_axis((0, g.shape[d]), name=f"r{d}") for d in red}

    def body(*i):
        point = [i[d] if keep[d] else axes[d] for d in range(len(keep))]
        return te.sum(load(g, *point), axis=list(axes.values()))

    if dt.compute == storage:
        return te.compute(shape, body, name=name)
    acc = te.compute(shape, body, name=f"{name}_acc")
    return te.compute(shape, lambda *i: acc(*i).astype(storage), name=name)


shape_op = ShapeOp.decorator  # @shape_op: a TE builder with canonical attributes (module docstring)


alias_op = AliasOp.decorator  # @alias_op: outputs that are a reshape of ``source`` (module docstring)

