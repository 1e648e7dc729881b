"""The mixed pointwise family: ``@pointwise`` for ops whose tensors do not all share one dtype.

TVM has no complex dtype: complex64/128 tensors are stored as float32/64 pairs in a trailing dim
of 2 (tvmgrad/dtypes.py). Under ``@mixed`` every tensor has its own dtype (a real dtype, or the
complex dtype of the same precision), a formula gets a real scalar or a ``Complex`` per input
and returns a real or complex value per output (its dtype is what shape inference says).
Broadcasting and the reduction of each grad back to its input's shape work as in ``@pointwise``
(whose kernel a call gets when all its tensors do share one dtype).

``dtypes``: the dtypes every tensor may have (complex ones included); all real tensors must share
one dtype and every complex tensor must have the precision of the real ones, unless
``mixed_precision`` (then everything computes in the widest precision present: float64 if any
tensor is float64/complex128, else float32). ``check(call, dts)``: extra dtype rules (dts: name
-> DType of every present tensor and every output), raising TypeError naming op and argument.
"""

from __future__ import annotations

import numbers

from ..dtypes import dtype as as_dtype, to_compute
from ..lazy import te, tirx
from .base import Plan
from .complex import Complex, lift
from .pointwise import Pointwise
from .signature import Scalar, Signature, buffers_of

__all__ = ["Mixed", "mixed", "real_dtype"]


def real_dtype(name: str) -> str:
    """The real dtype of a complex one (its precision), a real dtype itself."""
    return {"complex64": "float32", "complex128": "float64"}.get(name, name)


class Mixed(Pointwise):
    """``@pointwise`` whose tensors may differ in kind: real and complex of one precision (module
    docstring)."""

    family_kind = "pointwise"

    def __init__(self, fn, *, check=None, mixed_precision=False, **options):
        super().__init__(fn, **options)
        self.check = check
        self.mixed_precision = mixed_precision

    def dtypes_of(self, call, present, outs) -> dict:
        """name -> DType of every present input and produced output, checked (module docstring)."""
        spec, op = call.spec, call.op
        dts = {}
        for n in present:
            dt = call.meta(n).dtype
            if dt.name not in self.dtypes:
                raise TypeError(f"{op}: input {n!r} has dtype {dt.name}; {op} supports "
                                f"{', '.join(self.dtypes)}")
            dts[n] = dt
        if not self.mixed_precision:
            reals = [n for n in present if dts[n].lanes == 1]
            for n in reals[1:]:
                if dts[n] != dts[reals[0]]:
                    raise TypeError(f"{op}: input {n!r} has dtype {dts[n].name} but {reals[0]!r} has "
                                    f"{dts[reals[0]].name}; they must match")
            precision = {real_dtype(dts[n].name) for n in present}
            if len(precision) > 1:
                desc = ", ".join(f"{n}: {dts[n].name}" for n in present)
                raise TypeError(f"{op}: the inputs must share one precision (float32 with complex64, "
                                f"float64 with complex128); got {desc}")
        for o, m in zip(spec.outputs, outs):
            if m is not None:
                dts[o.name] = m.dtype
        if self.check is not None:
            self.check(call, dts)
        return dts

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present = [p.name for p in spec.tensor_args if call.tensors[p.name] is not None]
        if not present:
            raise ValueError(f"{op}: no tensor input given")
        dts = self.dtypes_of(call, present, outs)
        if len({d.name for d in dts.values()}) == 1 and dts[present[0]].name in self.dtypes:
            return super().plan(call, outs)         # one dtype: the plain pointwise kernel
        if self.validate is not None:
            self.validate(call, outs)
        wide = any(as_dtype(real_dtype(d.name)).compute == "float64" for d in dts.values())
        compute = "float64" if wide else "float32"
        out_names = [o.name for o, m in zip(spec.outputs, outs) if m is not None]
        shapes = {n: call.meta(n).shape for n in present}
        shapes.update({o.name: m.shape for o, m in zip(spec.outputs, outs) if m is not None})
        groups, masks, runtime, baked, args = self.broadcast_layout(call, shapes, present, out_names,
                                                                     compute)
        # every tensor sees the coalesced domain: dim j is the shared size n<j>, or 1 where it
        # broadcasts (a complex tensor's (re, im) pair comes on top)
        operands = list(enumerate(present + out_names))
        dims = {n: tuple(1 if m[i] else f"n{j}" for j, m in enumerate(masks)) for i, n in operands}
        views = {n: tuple(1 if m[i] else g for g, m in zip(groups, masks)) for i, n in operands}
        buffers = buffers_of(spec, {n: call.meta(n) for n in present}, outs, views=views, dims=dims)
        scalars = tuple(Scalar(a.name, a.dtype, a.value) for a in args if a.kind == "scalar")
        sig = Signature("mixed", op, dts[present[0]], buffers, scalars, (baked,))
        attrs = dict(call.attrs)
        return sig.plan(
            lambda static: self._make_mixed(spec, dts, compute, present, out_names, masks, runtime, attrs),
            pattern="generic", inplace_safe=True)

    def _make_mixed(self, spec, dts, compute, present, out_names, masks, runtime, attrs):
        k = len(masks)
        dims = [te.var(f"n{j}", "int64") for j in range(k)]
        n_in = len(present)

        def shape_of(i, name):
            return [1 if masks[j][i] else dims[j] for j in range(k)] + ([2] if dts[name].lanes == 2 else [])

        holders = {n: te.placeholder(shape_of(i, n), dts[n].storage, name=n) for i, n in enumerate(present)}
        scalars = {n: te.var(n, compute) for n in runtime}

        def formula(idx):
            """The op's outputs at point ``idx`` (loads inlined: each input is read once per
            output element, and a complex output reads its inputs for both parts)."""
            kwargs = {}
            for p in spec.args:
                name = p.name
                if name in holders:
                    i = present.index(name)
                    point = [0 if masks[j][i] else idx[j] for j in range(k)]
                    h, dt = holders[name], dts[name]
                    if dt.lanes == 2:
                        kwargs[name] = Complex(_typed(to_compute(h(*point, 0), dt), compute),
                                               _typed(to_compute(h(*point, 1), dt), compute))
                    else:
                        kwargs[name] = _typed(to_compute(h(*point), dt), compute)
                elif name in scalars:
                    kwargs[name] = scalars[name]
                elif name in attrs:
                    kwargs[name] = attrs[name]
                else:
                    kwargs[name] = None
            result = self.fn(**kwargs)
            result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            return dict(zip([o.name for o in spec.outputs], result))

        def element(idx, name):
            dt = dts[name]
            if dt.lanes == 2:
                *point, c = idx
                value = formula(point)[name]
                zero = tirx.const(0, compute)
                z = lift(value if value is not None else 0.0, Complex(zero, zero))
                return tirx.Select(c == 0, _typed(z.re, compute), _typed(z.im, compute))
            value = formula(idx)[name]
            if isinstance(value, Complex):
                raise RuntimeError(f"{spec.name}: output {name} is real but the formula gave a complex value")
            return _typed(value if value is not None else 0.0, compute)

        out_index = {n: n_in + i for i, n in enumerate(out_names)}

        def output(n):
            i, dt = out_index[n], dts[n]
            shape = shape_of(i, n)
            if not any(masks[j][i] for j in range(k)):
                return te.compute(shape, lambda *idx: element(idx, n).astype(dt.storage), name=n)
            raxes = [te.reduce_axis((0, dims[j]), name=f"r{j}") for j in range(k) if masks[j][i]]

            def body(*idx):
                it = iter(raxes)
                point = [next(it) if masks[j][i] else idx[j] for j in range(k)] + list(idx[k:])
                return te.sum(element(point, n), axis=raxes)

            if dt.storage == compute:
                return te.compute(shape, body, name=n)
            acc = te.compute(shape, body, name=f"{n}_acc")
            return te.compute(shape, lambda *idx: acc(*idx).astype(dt.storage), name=n)

        tensors = {n: output(n) for n in out_names}
        params = ([holders[n] for n in present if n not in spec.no_need_buffer]
                  + [scalars[n] for n in runtime] + [tensors[n] for n in out_names])
        return self.prim_func(spec, params)


def _typed(value, dtype):
    if isinstance(value, numbers.Number):
        return tirx.const(value, dtype)
    return value if str(value.ty) == dtype else value.astype(dtype)


def mixed(fn=None, **options):
    """Decorator: a pointwise formula over tensors of mixed real/complex dtypes (module doc)."""
    if fn is None:
        return lambda f: Mixed(f, **options)
    return Mixed(fn, **options)
