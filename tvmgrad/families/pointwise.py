"""The pointwise family: a grad written as a scalar function of scalars.

``@pointwise`` turns ``def relu_grad(out, out_grad): return where(out > 0, out_grad, 0.0)`` into a
kernel over broadcast inputs. The op's code is the scalar formula only; this module

* broadcasts the inputs (numpy rules) and reduces each output back to its own shape (a sum over the
  broadcast dims, accumulated in the compute dtype);
* coalesces adjacent dims that broadcast alike, so one kernel per *broadcast pattern* serves every
  shape and rank (all same-shape calls hit one flat 1-D kernel);
* loads each input once into a let-bound scalar in the compute dtype (float32 for half types), so
  ``Select`` stays a select (TVM rewrites selects over loads into branches that do not vectorise);
* passes float attributes as runtime scalars (one kernel for every alpha), bakes the rest in;
* writes in-place targets last, so the YAML ``inplace`` pairs may alias safely.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Callable

from ..dtypes import FLOATS, DType, to_compute
from ..infer_meta import MetaError, broadcast_shapes, same_shape
from .base import Arg, OpError, OpImpl, Plan, scalar_arg
from .broadcast import coalesce

__all__ = ["pointwise", "Pointwise", "RUNTIME_ATTR_TYPES"]

RUNTIME_ATTR_TYPES = ("float", "double", "Scalar")


class Pointwise(OpImpl):
    family_kind = "pointwise"

    def __init__(self, fn: Callable, *, broadcast=None, views=None, dtypes=FLOATS,
                 infer_meta=None, static=(), validate=None):
        super().__init__(fn, dtypes=dtypes, infer_meta=infer_meta)
        self.broadcast = None if broadcast is None else tuple(broadcast)
        self.views = views
        self.static = tuple(static)
        # validate(call, outs): attribute/shape rules the formula relies on, raising ValueError
        # naming op and argument before anything is built
        self.validate = validate

    # -- planning ------------------------------------------------------------------------------
    def broadcasting_inputs(self, spec) -> set[str]:
        """Inputs allowed to differ from the broadcast shape: declared, else the distinct tensors
        shape inference is given (two or more means a broadcasting binary op)."""
        if self.broadcast is not None:
            return set(self.broadcast)
        params = spec.infer_meta.param if spec.infer_meta and spec.infer_meta.param else ()
        tensors = {p.name for p in spec.tensor_args}
        named = {p for p in params if p in tensors}
        return named if len(named) > 1 else set()

    def runtime_attrs(self, spec) -> list[str]:
        return [p.name for p in spec.attrs
                if p.base_type in RUNTIME_ATTR_TYPES and p.name not in self.static]

    def broadcast_layout(self, call, shapes, present, out_names, scalar_dtype):
        """The kernel layout of a pointwise call (shared with the mixed-dtype planner): the inputs'
        broadcast domain (only the broadcasting inputs may differ from it), coalesced into groups
        of dims that broadcast alike. ``shapes``: name -> shape of every present input and
        output. -> (groups, masks, runtime attr names, static attrs, kernel Args)."""
        spec, op = call.spec, call.op
        free = self.broadcasting_inputs(spec)
        # the domain is what the forward's inputs span (x and y of atan2, x and alpha of prelu):
        # out_grad, out, ... may not widen it (a larger out_grad would be summed into the grads
        # silently); those not allowed to broadcast must have exactly its shape
        if not free:
            # every input has one shape: compare each with the first (naming both)
            ref = present[0]
            for n in present[1:]:
                if not same_shape(tuple(shapes[n]), tuple(shapes[ref])):
                    raise OpError(f"{op}: input {n!r} has shape {list(shapes[n])}, expected "
                                  f"{list(shapes[ref])} (the shape of {ref!r})")
        forward = {p.name for p in spec.forward.params if p.is_tensor} if spec.forward else set()
        spanning = [n for n in present if n in forward] if free else []
        spanning = spanning or present
        try:
            domain = broadcast_shapes(*(shapes[n] for n in spanning), names=tuple(spanning))
        except MetaError as exc:
            raise OpError(f"{op}: {exc}") from None
        for n in present:
            if n in free and n not in spanning:
                try:
                    widened = broadcast_shapes(domain, shapes[n])
                except MetaError:
                    widened = None
                if widened is None or not same_shape(tuple(widened), tuple(domain)):
                    raise OpError(f"{op}: input {n!r} has shape {list(shapes[n])}, which does not "
                                  f"broadcast to {list(domain)} (the broadcast of "
                                  + ", ".join(f"{m}{list(shapes[m])}" for m in spanning) + ")")
        for n in present:
            if n not in free and not same_shape(tuple(shapes[n]), domain):
                why = "the broadcast of " + ", ".join(f"{m}{list(shapes[m])}" for m in spanning)
                raise OpError(f"{op}: input {n!r} has shape {list(shapes[n])}, expected "
                              f"{list(domain)} ({why})")
        operands = present + out_names
        groups, masks = coalesce(domain, [shapes[n] for n in operands], operands, op)
        view = {n: tuple(1 if m[i] else g for g, m in zip(groups, masks)) for i, n in enumerate(operands)}
        runtime = self.runtime_attrs(spec)
        static = tuple((p.name, call.attrs[p.name]) for p in spec.attrs if p.name not in runtime)
        args = ([Arg("input", n, shape=view[n]) for n in present if n not in spec.no_need_buffer]
                + [scalar_arg(op, n, scalar_dtype, call.attrs[n]) for n in runtime]
                + [Arg("output", n, shape=view[n]) for n in out_names])
        return groups, masks, runtime, static, args

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present = [p.name for p in spec.tensor_args if call.tensors[p.name] is not None]
        dt = self.check_dtype(call, present)
        if self.validate is not None:
            self.validate(call, outs)
        shapes = {n: call.meta(n).shape for n in present}
        out_names = [o.name for o, m in zip(spec.outputs, outs) if m is not None]
        shapes.update({o.name: m.shape for o, m in zip(spec.outputs, outs) if m is not None})
        if self.views:
            shapes.update(self.views(dict(shapes), call.attrs))
        groups, masks, runtime, static, args = self.broadcast_layout(call, shapes, present, out_names,
                                                                     dt.compute)
        mask_key = tuple(tuple(m) for m in masks)
        # 32-bit index math when every extent fits (cheaper div/mod, notably on CUDA); int64 for
        # larger tensors and for symbolic sizes
        total = 1
        for g in groups:
            total = total * g if isinstance(g, int) and isinstance(total, int) else None
        index = "int32" if total is not None and total < 2**31 - 1 else "int64"
        key = ("pointwise", op, dt.name, tuple(present), tuple(out_names), mask_key, static, index)
        digest = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
        attrs = dict(call.attrs)
        # a flat kernel writing every output whole (no sum over broadcast dims) stores contiguous
        # vectors and nothing else: a candidate for streaming stores (tvmgrad/streaming.py)
        flat = (len(groups) == 1 and total is not None and dt.is_float
                and not any(masks[0][len(present) + i] for i in range(len(out_names))))
        stream_bytes = total * dt.numpy.itemsize * len(out_names) if flat else None
        return Plan(
            key=key, symbol=f"{op}_{dt.name}_{digest}",
            make=lambda: self._make(spec, dt, present, out_names, masks, runtime, attrs, index=index),
            make_static=lambda inline=False: self._make(spec, dt, present, out_names, masks, runtime,
                                                        attrs, sizes=groups, inline=inline, index=index),
            args=tuple(args), pattern="generic",
            inplace_safe=True,     # every element is read before it is written; aliases go last
            stream_bytes=stream_bytes,
        )

    # -- TE -----------------------------------------------------------------------------------
    def _make(self, spec, dt: DType, present, out_names, masks, runtime, attrs, sizes=None,
              inline=False, index="int64"):
        from tvm import te, tirx

        from .complex import Complex, lift

        k = len(masks)
        dims = ([te.var(f"n{j}", index) for j in range(k)] if sizes is None
                else [tirx.IntImm(index, int(g)) for g in sizes])
        n_in = len(present)
        cplx = dt.lanes == 2            # complex: a trailing (re, im) dim in every buffer
        pair = [2] if cplx else []

        def shape_of(i):
            return [1 if masks[j][i] else dims[j] for j in range(k)]

        holders = {n: te.placeholder(shape_of(i) + pair, dt.storage, name=n) for i, n in enumerate(present)}
        scalars = {n: te.var(n, dt.compute) for n in runtime}
        n_outputs = len(spec.outputs)
        formula_args = [p.name for p in spec.args]

        def formula(idx, part=None):
            """Fresh let-bound loads, the op's scalar formula, and the lets to wrap each output.

            ``part`` picks the real (0) or imaginary (1) part of complex results. ``inline`` puts
            the loads in place of the let-bound vars (meta_schedule cannot analyse lets)."""
            def load(i, n, c):
                point = [0 if masks[j][i] else idx[j] for j in range(k)]
                return to_compute(holders[n](*point, c) if cplx else holders[n](*point), dt)

            if inline:
                loads = {n: [load(i, n, c) for c in range(2 if cplx else 1)] for i, n in enumerate(present)}
            else:
                loads = {n: ([tirx.Var(f"{n}_re", dt.compute), tirx.Var(f"{n}_im", dt.compute)] if cplx
                             else [tirx.Var(f"{n}_v", dt.compute)]) for n in present}
            kwargs = {}
            for name in formula_args:
                if name in loads:
                    kwargs[name] = Complex(*loads[name]) if cplx else loads[name][0]
                elif name in scalars:
                    kwargs[name] = scalars[name]
                elif name in attrs:
                    kwargs[name] = attrs[name]
                else:
                    kwargs[name] = None        # an absent optional input
            result = self.fn(**kwargs)
            result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            if len(result) != n_outputs:
                raise RuntimeError(f"{spec.name}: formula returns {len(result)} values for "
                                   f"{n_outputs} outputs {spec.output_names}")

            def bind(expr):
                if cplx:
                    zero = tirx.const(0, dt.compute)
                    expr = lift(expr if expr is not None else 0.0, Complex(zero, zero))
                    expr = expr.re if part == 0 else expr.im
                if isinstance(expr, numbers.Number) or expr is None:
                    return tirx.const(expr or 0, dt.compute)
                if str(expr.ty) != dt.compute:
                    expr = expr.astype(dt.compute)
                if inline:
                    return expr
                used = _free_vars(expr)
                for i, n in reversed(list(enumerate(present))):
                    for c, var in reversed(list(enumerate(loads[n]))):
                        if any(v.same_as(var) for v in used):
                            expr = tirx.Let(var, load(i, n, c), expr)
                return expr

            return {o.name: bind(r) for o, r in zip(spec.outputs, result)}

        def element(idx, name):
            """An output element: for complex, select the part by the trailing index."""
            if not cplx:
                return formula(idx)[name]
            *point, c = idx
            return tirx.Select(c == 0, formula(point, 0)[name], formula(point, 1)[name])

        out_index = {n: n_in + i for i, n in enumerate(out_names)}
        full = [n for n in out_names if not any(masks[j][out_index[n]] for j in range(k))]
        reduced = [n for n in out_names if n not in full]
        inplace_targets = {dst for _, dst in spec.inplace}
        full.sort(key=lambda n: n in inplace_targets)       # aliased outputs are written last

        acc_dtype = "int32" if dt.compute == "bool" else dt.compute   # a bool sum counts: any != 0

        def reduction(n, i):
            raxes = [te.reduce_axis((0, dims[j]), name=f"r{j}") for j in range(k) if masks[j][i]]

            def body(*idx):
                it = iter(raxes)
                point = [next(it) if masks[j][i] else idx[j] for j in range(k)] + list(idx[k:])
                value = element(point, n)
                return te.sum(value if acc_dtype == dt.compute else value.astype(acc_dtype), axis=raxes)

            if dt.storage == acc_dtype:
                return te.compute(shape_of(i) + pair, body, name=n)
            acc = te.compute(shape_of(i) + pair, body, name=f"{n}_acc")
            return te.compute(shape_of(i) + pair, lambda *idx: acc(*idx).astype(dt.storage), name=n)

        tensors = {n: reduction(n, out_index[n]) for n in reduced}   # reductions read inputs first
        if full:
            res = te.compute(
                dims + pair, lambda *idx: [element(idx, n).astype(dt.storage) for n in full],
                name=spec.name)
            res = res if isinstance(res, (list, tuple)) else [res]
            tensors.update(zip(full, res))

        params = ([holders[n] for n in present if n not in spec.no_need_buffer]
                  + [scalars[n] for n in runtime] + [tensors[n] for n in out_names])
        return self.prim_func(spec, params)


def _free_vars(expr) -> list:
    from tvm import tirx
    return tirx.analysis.undefined_vars(expr)


def pointwise(fn=None, **options):
    """Decorator: register a scalar formula as a pointwise op (see module docstring)."""
    if fn is None:
        return lambda f: Pointwise(f, **options)
    return Pointwise(fn, **options)
