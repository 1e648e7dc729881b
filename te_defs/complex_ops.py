"""Grads that move between real and complex numbers, and the *mixed* pointwise family they use.

TVM has no complex dtype: complex64/128 tensors are stored as float32/64 pairs in a trailing dim
of 2 (tvmgrad/dtypes.py). The ``@mixed`` family is ``@pointwise`` for ops whose tensors do not all
share one dtype: every tensor has its own dtype (a real dtype, or the complex dtype of the same
precision), a formula gets a real scalar or a ``Complex`` per input and returns a real or complex
value per output (its dtype is what shape inference says). Broadcasting and the reduction of each
grad back to its input's shape work as in ``@pointwise``.

Semantics follow Paddle 3.3.1 (phi/kernels/impl/complex_grad_kernel_impl.h, angle_grad_kernel_impl.h,
as_real/as_complex kernels, conj kernel):

* ``real_grad``: x_grad = out_grad + 0i;  ``imag_grad``: x_grad = 0 + out_grad·i.
* ``complex_grad``: real_grad = Re(out_grad), imag_grad = Im(out_grad), each summed over the dims
  ``real``/``imag`` were broadcast along.
* ``angle_grad``: complex x: x_grad = out_grad · (-Im x, Re x) / |x|²  (0 where x = 0);
  real x: x_grad = 0 (zeros even for inf/NaN out_grad, as Paddle).
* ``as_real`` / ``as_complex`` (forwards of as_complex_grad / as_real_grad): reinterpret complex
  as a trailing pair of reals and back (a copy: Paddle returns a new tensor).
* ``conj`` (forward of conj_grad): (re, -im); a real tensor is copied.
"""

from __future__ import annotations

import hashlib
import numbers

from tvmgrad.dtypes import COMPLEX, FLOATS, dtype as as_dtype, to_compute
from tvmgrad.families.base import Arg, OpImpl, Plan
from tvmgrad.families.complex import Complex, lift
from tvmgrad.families.pointwise import Pointwise
from tvmgrad.lazy import tirx

from ._math import conj as _conj, const

__all__ = ["mixed", "Mixed", "real_dtype"]


def real_dtype(name: str) -> str:
    """The real dtype of a complex one (its precision), a real dtype itself."""
    return {"complex64": "float32", "complex128": "float64"}.get(name, name)


# ------------------------------------------------------------------------------------------
# the mixed pointwise family

class Mixed(Pointwise):
    """``@pointwise`` whose tensors may differ in kind: real and complex of one precision.

    ``dtypes``: the dtypes every tensor may have (complex ones included); all real tensors must
    share one dtype and every complex tensor must have the precision of the real ones, unless
    ``mixed_precision`` (then everything computes in the widest precision present: float64 if any
    tensor is float64/complex128, else float32).
    ``check(call, dts)``: extra dtype rules (dts: name -> DType of every present tensor and every
    output), raising TypeError naming op and argument.
    """

    family_kind = "pointwise"

    def __init__(self, fn, *, check=None, mixed_precision=False, **options):
        super().__init__(fn, **options)
        self.check = check
        self.mixed_precision = mixed_precision

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        present = [p.name for p in spec.tensor_args if call.tensors[p.name] is not None]
        if not present:
            raise ValueError(f"{op}: no tensor input given")
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
        out_names = [o.name for o, m in zip(spec.outputs, outs) if m is not None]
        for o, m in zip(spec.outputs, outs):
            if m is not None:
                dts[o.name] = m.dtype
        if self.check is not None:
            self.check(call, dts)
        if len({d.name for d in dts.values()}) == 1 and dts[present[0]].name in self.dtypes:
            return super().plan(call, outs)         # one dtype: the plain pointwise kernel
        if self.validate is not None:
            self.validate(call, outs)
        wide = any(as_dtype(real_dtype(d.name)).compute == "float64" for d in dts.values())
        compute = "float64" if wide else "float32"
        shapes = {n: call.meta(n).shape for n in present}
        shapes.update({o.name: m.shape for o, m in zip(spec.outputs, outs) if m is not None})
        groups, masks, runtime, static, args = self.broadcast_layout(call, shapes, present, out_names,
                                                                     compute)
        mask_key = tuple(tuple(m) for m in masks)
        kinds = tuple((n, dts[n].name) for n in present + out_names)
        key = ("mixed", op, kinds, mask_key, static)
        digest = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
        attrs = dict(call.attrs)
        return Plan(
            key=key, symbol=f"{op}_{'_'.join(sorted({d.name for d in dts.values()}))}_{digest}",
            make=lambda: self._make_mixed(spec, dts, compute, present, out_names, masks, runtime, attrs),
            args=tuple(args), pattern="generic",
            inplace_safe=True,
        )

    def _make_mixed(self, spec, dts, compute, present, out_names, masks, runtime, attrs):
        from tvm import te

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


# ------------------------------------------------------------------------------------------
# the ops

@mixed(dtypes=FLOATS, infer_meta="RealAndImagGradInferMeta")
def real_grad(out_grad):
    """x_grad = out_grad + 0i   (half out_grad: a complex64 x_grad; Paddle has no complex32)"""
    return Complex(out_grad, const(0.0, out_grad))


@mixed(dtypes=FLOATS, infer_meta="RealAndImagGradInferMeta")
def imag_grad(out_grad):
    """x_grad = 0 + out_grad·i   (half out_grad: a complex64 x_grad)"""
    return Complex(const(0.0, out_grad), out_grad)


def complex_of(name: str) -> str:
    """The complex dtype a real dtype makes (Paddle has no complex32: half types give complex64)."""
    return "complex128" if name == "float64" else "complex64"


def _complex_grad_check(call, dts):
    for n in ("real", "imag"):
        if dts[n].lanes != 1:
            raise TypeError(f"{call.op}: input {n!r} has dtype {dts[n].name}; it must be real")
    if dts["imag"] != dts["real"]:
        raise TypeError(f"{call.op}: input 'imag' has dtype {dts['imag'].name} but 'real' has "
                        f"{dts['real'].name}; they must match")
    want = complex_of(dts["real"].name)
    if dts["out_grad"].name != want:
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {dts['out_grad'].name}; it must be "
                        f"{want}, the complex dtype of real/imag ({dts['real'].name})")


@mixed(dtypes=FLOATS + COMPLEX, check=_complex_grad_check, broadcast=("real", "imag", "out_grad"),
       mixed_precision=True)
def complex_grad(real, imag, out_grad):
    """real_grad = Re(out_grad), imag_grad = Im(out_grad), each summed over the dims real/imag
    were broadcast along (in real's / imag's dtype)"""
    return out_grad.re, out_grad.im


def _angle_check(call, dts):
    x, g = dts["x"], dts["out_grad"]
    if g.lanes != 1:
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {g.name}; it must be real (the "
                        f"dtype of angle(x))")
    if x.lanes == 1 and x != g:
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {g.name} but 'x' has {x.name}; "
                        f"they must match")
    if x.lanes == 2 and g.name != real_dtype(x.name):
        raise TypeError(f"{call.op}: input 'out_grad' has dtype {g.name}; for 'x' of dtype {x.name} "
                        f"it must be {real_dtype(x.name)} (the dtype of angle(x))")


@mixed(dtypes=FLOATS + COMPLEX, check=_angle_check, mixed_precision=True)
def angle_grad(x, out_grad):
    """complex x: x_grad = x == 0 ? 0 : out_grad · (-Im x + i Re x) / |x|²
    real x: x_grad = 0 (even where out_grad is inf/NaN, as Paddle)"""
    if not isinstance(x, Complex):
        return 0.0
    den = x.re * x.re + x.im * x.im
    zero = const(0.0, x.re)
    nz = den != zero
    safe = tirx.Select(nz, den, const(1.0, x.re))
    re = tirx.Select(nz, -(out_grad * x.im) / safe, zero)
    im = tirx.Select(nz, out_grad * x.re / safe, zero)
    return Complex(re, im)


@mixed(dtypes=FLOATS + COMPLEX, infer_meta="UnchangedInferMeta")
def conj(x):
    """out = Re x - i·Im x; a real tensor is copied"""
    return _conj(x)


# ------------------------------------------------------------------------------------------
# as_real / as_complex: the same memory seen as complex or as pairs of reals

class Reinterpret(OpImpl):
    """A copy between a complex tensor and a real one with a trailing dim of 2: in storage both
    are the same pairs of reals, so the kernel copies an (n, 2) buffer (one kernel for every
    shape)."""

    family_kind = "tensor"

    def __init__(self, fn, *, source, **options):
        super().__init__(fn, **options)
        self.source = source            # "complex" (as_real) or "real" (as_complex)

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        meta = call.meta("x")
        if meta is None:
            raise ValueError(f"{op}: missing input 'x'")
        if meta.dtype.name not in self.dtypes:
            raise TypeError(f"{op}: input 'x' has dtype {meta.dtype.name}; {op} supports "
                            f"{', '.join(self.dtypes)}")
        out = outs[0]
        pairs = 1
        for d in (meta.shape if self.source == "complex" else out.shape):
            pairs *= d
        src, dst = meta.dtype, out.dtype
        key = ("reinterpret", op, meta.dtype.name)
        digest = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
        in_shape = (pairs,) if self.source == "complex" else (pairs, 2)
        out_shape = (pairs, 2) if self.source == "complex" else (pairs,)

        def make():
            from tvm import te
            n = te.var("n", "int64")
            x = te.placeholder((n, 2), src.storage, name="x")
            y = te.compute((n, 2), lambda i, c: to_compute(x[i, c], src).astype(dst.storage), name="out")
            return self.prim_func(spec, [x, y])

        return Plan(key=key, symbol=f"{op}_{meta.dtype.name}_{digest}", make=make,
                    args=(Arg("input", "x", shape=in_shape), Arg("output", "out", shape=out_shape)),
                    inplace_safe=True)


def _as_real(x):
    """out[..., 0] = Re x, out[..., 1] = Im x (a copy; Paddle returns a new tensor)"""


def _as_complex(x):
    """out = x[..., 0] + x[..., 1]·i (a copy)"""


_as_real.__name__, _as_complex.__name__ = "as_real", "as_complex"
_as_real.__qualname__, _as_complex.__qualname__ = "as_real", "as_complex"
as_real = Reinterpret(_as_real, source="complex", dtypes=COMPLEX, infer_meta="AsRealInferMeta")
as_complex = Reinterpret(_as_complex, source="real", dtypes=FLOATS,
                         infer_meta="AsComplexInferMeta")
