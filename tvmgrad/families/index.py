"""The index family: whole-tensor TE builders whose tensors are passed as views.

``@index_op`` is ``@tensor_op`` (tensor.py) for data movement and scatter: the op's ``view(call,
metas, outs) -> (views, variant)`` maps input/output names to the shapes the kernel sees (same
element count; usually (outer, axis, inner); a list of shapes for a Tensor[]) and gives a tuple of
code-changing facts, ``variant``; the builder reads it and the deterministic/atomic switch from
its ``ctx.info`` (an ``IndexInfo``), and ``ctx.pair`` for complex data.

Attributes are baked into the code, except ``int_runtime`` ones (int64 scalar parameters: one
kernel serves every value); ``code_attrs`` names the baked ones that change the code (default:
all; those a view folds into the shapes should be left out so that one kernel serves them all).
``atomic``: the op has a racy variant for ``deterministic=False``. ``alias``: outputs equal to an
input (no kernel work; a view of it when the caller passes ``alias=True``). ``out_dtype``:
outputs whose dtype is the float inputs' whatever shape inference says (Paddle's kernels allocate
them as T). ``host_scalars(call, views) -> {name: int}``: int64 scalar parameters computed on the
host (e.g. a scan's chunk size); the builder gets them as vars in ``ctx.scalars``.
``rewrite(call)``: replaces input arrays of the call on the host before anything else is planned
(index_put_grad's bool masks become their nonzero() index tensors, as in Paddle).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..infer_meta import TensorMeta
from .base import Plan
from .signature import Scalar, Signature, buffers_of
from .tensor import TensorOp, view_shape

__all__ = ["IndexOp", "IndexInfo", "index_op", "ATOMIC_DTYPES"]

ATOMIC_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class IndexInfo:
    """What an index builder reads from ``ctx.info``."""

    variant: tuple          # the op's code-changing facts (its ``view`` gives them)
    deterministic: bool     # False: the racy (atomic) variant


class IndexOp(TensorOp):
    """A whole-tensor TE builder whose tensors are passed as views (module docstring)."""

    def __init__(self, fn, *, view=None, atomic=False, alias=None, code_attrs=None,
                 int_runtime=(), out_dtype=(), host_scalars=None, rewrite=None, **options):
        options.setdefault("pattern", "annotated_loops")
        super().__init__(fn, **options)
        self.view = view
        self.atomic = atomic
        self.alias = dict(alias or {})
        self.code_attrs = None if code_attrs is None else tuple(code_attrs)
        self.int_runtime = tuple(int_runtime)
        self.out_dtype = tuple(out_dtype)
        self.host_scalars = host_scalars
        self.rewrite = rewrite

    def runtime_attrs(self, spec) -> list[str]:
        return []

    def _fix_outputs(self, call, outs, dt) -> None:
        """Tensor[] outputs sized by the YAML ``{x.size()}``; outputs allocated in the float dtype.
        (Shape inference sees neither; ``outs`` is the list the runtime allocates from.)"""
        for i, o in enumerate(call.spec.outputs):
            m = outs[i]
            if m is None:
                continue
            if isinstance(m, list) and o.size and o.size.endswith(".size()"):
                src = call.tensors.get(o.size[: -len(".size()")])
                if isinstance(src, list) and m:
                    outs[i] = m = [m[0]] * len(src)
            if o.name in self.out_dtype:
                outs[i] = ([TensorMeta(x.shape, dt) for x in m] if isinstance(m, list)
                           else TensorMeta(m.shape, dt))

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        if self.rewrite is not None:
            self.rewrite(call)
        present, dt, metas = self.checked_inputs(call)
        self._fix_outputs(call, outs, dt)
        if self.validate is not None:
            self.validate(call, outs)
        views, variant = self.view(call, metas, outs) if self.view else ({}, ())
        every = dict(metas, **{o.name: m for o, m in zip(spec.outputs, outs) if m is not None})
        for name, shape in views.items():       # a view holds exactly the tensor's elements
            if name in every:
                meta = every[name]
                for m, v in (zip(meta, shape) if isinstance(meta, list) else [(meta, shape)]):
                    view_shape(op, name, v, {}, m)
        views = {n: ([tuple(v) for v in s] if isinstance(every[n], list) else tuple(s))
                 for n, s in views.items() if n in every}
        kept = [None if o.name in self.alias else m for o, m in zip(spec.outputs, outs)]
        det = (not self.atomic or bool(call.options.get("deterministic", True))
               or dt.name not in ATOMIC_DTYPES)
        names = (self.code_attrs if self.code_attrs is not None
                 else [p.name for p in spec.attrs if p.name not in self.int_runtime])
        static = tuple((n, call.attrs[n]) for n in names)
        extra = self.host_scalars(call, views) if self.host_scalars else {}
        scalars = [Scalar(n, "int64", int(call.attrs[n])) for n in self.int_runtime]
        scalars += [Scalar(n, "int64", int(v)) for n, v in sorted(extra.items())]
        info = IndexInfo(tuple(variant), det)
        sig = Signature("index", op, dt, buffers_of(spec, metas, kept, views=views),
                        tuple(scalars), (static, info))
        aliases = {o.name: (self.alias[o.name], m.shape) for o, m in zip(spec.outputs, outs)
                   if o.name in self.alias and m is not None}
        attrs = dict(call.attrs)
        make = None
        if any(m is not None for m in kept):
            make = lambda static: sig.build(self, spec, attrs, info=info)  # noqa: E731
        return sig.plan(make, pattern=self.pattern, aliases=aliases)


index_op = IndexOp.decorator  # @index_op: an ``IndexOp`` builder (see the class)
