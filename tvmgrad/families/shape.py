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
that the runtime passes (after the dims of their view; ``pair()`` tells the builder, so an index
map writes ``lambda o, j, *c: g[o, j + off, *c]`` and both parts move alike). Integer and bool
kernels compute in their own dtype; a float runtime attribute of such a kernel is passed as that
dtype (truncated toward 0, as C++'s static_cast); ``reduce_to`` sums integers wrapping, as
Paddle's kernels do, and bools as a logical OR (a count != 0).

``@alias_op(source=...)``: every output is ``source``'s data reshaped (squeeze/unsqueeze/flatten/
view grads): a Plan without a kernel (``aliases``); the runtime returns a view when the caller
passes ``alias=True`` and a copy otherwise. When an output's dtype differs from the source's
(view_dtype_grad) the builder is compiled like a ``shape_op`` instead.
"""

from __future__ import annotations

import hashlib
import math
import threading
from typing import Callable

from ..dtypes import DType
from .base import Arg, OpError, Plan, scalar_arg
from .pointwise import RUNTIME_ATTR_TYPES
from .tensor import TensorOp, builder_kwargs, call_builder, output_params

__all__ = ["shape_op", "alias_op", "ShapeOp", "AliasOp", "dt_of", "load", "zero", "total",
           "reduce_to", "pair"]

_BUILD = threading.local()


def pair() -> bool:
    """Is the kernel being built complex? Then every complex tensor has one more innermost dim of
    2 (re, im) than its view."""
    return bool(getattr(_BUILD, "pair", False))


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
        skip = self._skip(spec)

        def shapes_of(name, meta):
            if name in views:
                v = views[name]
                return [tuple(s) for s in v] if isinstance(meta, list) else tuple(v)
            return [m.shape for m in meta] if isinstance(meta, list) else meta.shape

        metas = {n: call.meta(n) for n in present}
        in_shapes = {n: shapes_of(n, metas[n]) for n in present}
        out_shapes = {o.name: (None if m is None else shapes_of(o.name, m))
                      for o, m in zip(spec.outputs, outs)}

        def unit_mask(shape):
            return tuple(d == 1 for d in shape)

        layout = []
        for n in present:
            shp, m = in_shapes[n], metas[n]
            units = n in self.unit_dims
            if isinstance(m, list):
                layout.append((n, tuple((len(s), x.dtype.name, unit_mask(s) if units else None)
                                        for s, x in zip(shp, m))))
            else:
                layout.append((n, (len(shp), m.dtype.name, unit_mask(shp) if units else None)))
        out_layout = []
        for o, m in zip(spec.outputs, outs):
            if m is None:
                out_layout.append(None)
            elif isinstance(m, list):
                out_layout.append(tuple((len(s), x.dtype.name) for s, x in zip(out_shapes[o.name], m)))
            else:
                out_layout.append((len(out_shapes[o.name]), m.dtype.name))
        f_runtime = self.float_runtime(spec)
        i_runtime = [n for n in self.runtime_ints if n in attrs]
        static = tuple((p.name, attrs[p.name]) for p in spec.attrs
                       if p.name not in f_runtime and p.name not in i_runtime)
        runtime_shape = tuple((n, len(attrs[n]) if isinstance(attrs[n], (list, tuple)) else None)
                              for n in i_runtime)
        key = ("shape", op, dt.name, tuple(layout), tuple(out_layout), static, runtime_shape,
               tuple(sorted(f_runtime)))
        digest = hashlib.sha1(repr(key).encode()).hexdigest()[:10]

        args = []
        for n in present:
            if n in skip:
                continue
            if isinstance(metas[n], list):
                args += [Arg("input", n, index=i, shape=in_shapes[n][i]) for i in range(len(metas[n]))]
            else:
                args.append(Arg("input", n, shape=in_shapes[n]))
        args += [scalar_arg(op, n, dt.compute, attrs[n])
                 for n in f_runtime]
        for n in i_runtime:
            v = attrs[n]
            if isinstance(v, (list, tuple)):
                args += [Arg("scalar", f"{n}{i}", dtype="int64", value=int(x)) for i, x in enumerate(v)]
            else:
                args.append(Arg("scalar", n, dtype="int64", value=int(v)))
        for o, m in zip(spec.outputs, outs):
            if isinstance(m, list):
                args += [Arg("output", o.name, index=i, shape=out_shapes[o.name][i])
                         for i in range(len(m))]
            elif m is not None:
                args.append(Arg("output", o.name, shape=out_shapes[o.name]))
        units = {n: [unit_mask(s) for s in _as_list(in_shapes[n])] for n in self.unit_dims
                 if n in in_shapes}
        return Plan(key=key, symbol=f"{op}_{dt.name}_{digest}",
                    make=lambda: self._build(spec, dt, metas, in_shapes, units, outs, f_runtime,
                                             i_runtime, attrs),
                    args=tuple(args), pattern=self.pattern)

    # -- TE -----------------------------------------------------------------------------------
    def _build(self, spec, dt: DType, metas, in_shapes, units, outs, f_runtime, i_runtime, attrs):
        from tvm import te, tirx

        def holder(name, shape, meta, mask):
            dims = [1 if (mask and mask[d]) else te.var(f"{name}_d{d}", "int64")
                    for d in range(len(shape))]
            if meta.dtype.lanes == 2:
                dims.append(tirx.IntImm("int64", 2))        # complex: the (re, im) pair
            return te.placeholder(dims, meta.dtype.storage, name=name)

        tensors = {}
        for n, m in metas.items():
            if isinstance(m, list):
                masks = units.get(n, [None] * len(m))
                tensors[n] = [holder(f"{n}{i}", s, x, k)
                              for i, (s, x, k) in enumerate(zip(in_shapes[n], m, masks))]
            else:
                tensors[n] = holder(n, in_shapes[n], m, units.get(n, [None])[0])
        scalars = {n: te.var(n, dt.compute) for n in f_runtime}
        ints = {}
        flat_ints = []
        for n in i_runtime:
            v = attrs[n]
            if isinstance(v, (list, tuple)):
                ints[n] = [te.var(f"{n}{i}", "int64") for i in range(len(v))]
                flat_ints += ints[n]
            else:
                ints[n] = te.var(n, "int64")
                flat_ints.append(ints[n])
        previous = getattr(_BUILD, "pair", False)
        _BUILD.pair = dt.lanes == 2
        try:
            result = call_builder(self.fn, spec, builder_kwargs(spec, tensors, scalars, ints, attrs))
        finally:
            _BUILD.pair = previous
        skip = self._skip(spec)
        params = []
        for n in metas:
            if n not in skip:
                params += tensors[n] if isinstance(tensors[n], list) else [tensors[n]]
        params += [scalars[n] for n in f_runtime] + flat_ints
        params += output_params(spec, outs, result)
        return self.prim_func(spec, params)


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

