"""Integer powers by a runtime exponent in a pointwise formula: one serial loop per element.

Paddle's integer ``pow`` is binary exponentiation (Eigen's ``pow`` for an integer T, wrapping) by
an exponent known only at run time (``T(y)`` of a float attribute). As one TIR expression its
squares must be shared (let-bound), and TVM 0.27 cannot compile that: ``CompactBufferAllocation``
binds every let into its arithmetic analyser, which substitutes the earlier ones, so time and
stack grow as 2^squarings (13 squarings crash the process). Here each power is a loop instead::

    @int_powers(validate=...)
    @pointwise(dtypes=CPLX)
    def pow_grad(x, out_grad, y):
        ... ipow(x, e) if is_int(x) else tirx.pow(x, e) ...

The op keeps its ``@pointwise`` kernel for float and complex dtypes. For the integer ``dtypes``
the same formula runs inside one block per element of a ``te.extern`` (schedule
``annotated_loops``: parallel over the elements): every ``ipow(base, e)`` it calls becomes a
``while e > 0`` square-and-multiply loop into a local scalar, ahead of the formula's stores (a
negative exponent gives 1: ``validate`` must refuse the calls that need one, where Paddle's loop
never ends). The runtime attributes arrive as float64 scalars, so the formula rounds them as it
does for floats (``f32(y)``). Same-shape tensors only: the pow grads do not broadcast.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
import numbers

from tvmgrad.dtypes import to_compute
from tvmgrad.families.base import Arg, OpError, OpImpl, Plan, scalar_arg
from tvmgrad.lazy import te, tirx

from ._extern import extern, proxy, scratch

__all__ = ["ipow", "int_powers", "IntPowers"]

_POWERS: contextvars.ContextVar = contextvars.ContextVar("tvmgrad_int_powers", default=None)


def ipow(base, e):
    """``base ** e`` for an integer ``base`` and an exponent ``e`` >= 0 of scalars only, wrapping
    as C++ does; only inside an ``@int_powers`` kernel (module docstring)."""
    powers = _POWERS.get()
    if powers is None:
        raise RuntimeError("ipow: an integer power by a runtime exponent needs the op to be "
                           "@int_powers (te_defs/_powers.py)")
    from tvm_ffi import structural_equal
    dtype = str(base.ty)
    e = e if str(e.ty) == dtype else e.astype(dtype)
    for var, b, k in powers:            # a formula naming one power twice gets one loop
        if structural_equal(b, base) and structural_equal(k, e):
            return var
    var = tirx.Var(f"pow{len(powers)}", dtype)
    powers.append((var, base, e))
    return var


def _emit_power(base, e):
    """The statements of ``base ** e`` (square and multiply over e's bits) -> its value."""
    from tvm.script.ir_builder import tirx as T
    dtype = str(base.ty)
    one = tirx.const(1, dtype)

    def local(value):
        buf = proxy(scratch((1,), dtype, word_aligned=True))
        buf[0] = value
        return buf

    acc, sq, k = local(one), local(base), local(e)
    with T.While(k[0] > tirx.const(0, dtype)):
        with T.If(tirx.bitwise_and(k[0], one) == one):
            with T.Then():
                acc[0] = acc[0] * sq[0]
        sq[0] = sq[0] * sq[0]
        k[0] = tirx.shift_right(k[0], one)
    return acc[0]


class IntPowers(OpImpl):
    """A ``@pointwise`` op whose integer kernels compute their powers by loops (module docstring)."""

    family_kind = "pointwise"

    def __init__(self, op, *, dtypes=("int32", "int64"), validate=None):
        self.op = op
        self.int_dtypes = tuple(dtypes)
        self.validate = validate        # validate(call, dtype): refuses what the loops cannot do
        for name in ("fn", "name", "doc", "infer_meta", "source_file", "module", "params"):
            setattr(self, name, getattr(op, name))
        self.dtypes = op.dtypes + self.int_dtypes

    def broadcasting_inputs(self, spec) -> set[str]:
        return self.op.broadcasting_inputs(spec)

    def runtime_attrs(self, spec) -> list[str]:
        return self.op.runtime_attrs(spec)

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present = [p.name for p in spec.tensor_args if call.tensors[p.name] is not None]
        dt = self.check_dtype(call, present)
        if dt.name not in self.int_dtypes:
            return self.op.plan(call, outs)
        if self.op.validate is not None:
            self.op.validate(call, outs)
        if self.validate is not None:
            self.validate(call, dt)
        out_names = [o.name for o, m in zip(spec.outputs, outs) if m is not None]
        shapes = {n: call.meta(n).shape for n in present}
        shapes.update({o.name: m.shape for o, m in zip(spec.outputs, outs) if m is not None})
        groups, masks, runtime, static, _ = self.op.broadcast_layout(call, shapes, present,
                                                                     out_names, "float64")
        if any(any(m) for m in masks):
            raise OpError(f"{op}: the {dt.name} kernel takes tensors of one shape")
        size = math.prod(groups)
        loaded = [n for n in present if n not in spec.no_need_buffer]
        args = ([Arg("input", n, shape=(size,)) for n in loaded]
                + [scalar_arg(op, n, "float64", call.attrs[n]) for n in runtime]
                + [Arg("output", n, shape=(size,)) for n in out_names])
        key = ("int_powers", op, dt.name, tuple(present), tuple(out_names), static)
        digest = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
        attrs = dict(call.attrs)
        return Plan(key=key, symbol=f"{op}_{dt.name}_{digest}",
                    make=lambda: self._make(spec, dt, loaded, out_names, runtime, attrs),
                    args=tuple(args), pattern="annotated_loops",
                    inplace_safe=True)    # an element's inputs are bound before its stores

    def _make(self, spec, dt, loaded, out_names, runtime, attrs):
        n = te.var("n", "int64")
        holders = [te.placeholder((n,), dt.storage, name=name) for name in loaded]
        scalars = {name: te.var(name, "float64") for name in runtime}

        def gen(ins, outs, body):
            from tvm.script.ir_builder import tirx as T
            loads = [proxy(b) for b in ins]
            stores = [proxy(b) for b in outs]

            def element(P, _S):
                i = P[0]
                values = {name: T.bind(to_compute(L[i], dt)) for name, L in zip(loaded, loads)}
                kwargs = {p.name: values.get(p.name, scalars.get(p.name, attrs.get(p.name)))
                          for p in spec.args}
                powers = []
                token = _POWERS.set(powers)
                try:
                    result = self.fn(**kwargs)
                finally:
                    _POWERS.reset(token)
                result = result if isinstance(result, (tuple, list)) else (result,)
                by_name = dict(zip([o.name for o in spec.outputs], result))
                for var, base, e in powers:
                    T.bind(_emit_power(base, e), var=var)
                for name, S in zip(out_names, stores):
                    expr = by_name[name]
                    if isinstance(expr, numbers.Number) or expr is None:
                        expr = tirx.const(expr or 0, dt.compute)
                    S[i] = expr if str(expr.ty) == dt.storage else expr.astype(dt.storage)

            body.block("element", element, par=[n], reads=list(ins), writes=list(outs))

        res = extern(spec.name, [((n,), dt.storage)] * len(out_names), holders, gen, lanes=False)
        return self.prim_func(spec, holders + [scalars[s] for s in runtime] + res, "int64")


def int_powers(op=None, **options):
    """Decorator over a ``@pointwise`` op: its integer kernels with ``ipow`` loops (module
    docstring)."""
    if op is None:
        return lambda o: IntPowers(o, **options)
    return IntPowers(op, **options)
