"""A kernel's signature: the one description a family's planner makes of a call's kernel.

A planner says what the kernel sees (``Buffer``: each tensor's dims, dtype and this call's view
of it; ``Scalar``: runtime parameters) and which other facts change its code (``facts``); this
module derives everything else from that one value, so none of it can disagree: the cache key,
the symbol, the argument list the runtime passes, the placeholders the builder gets, the
parameter order of the PrimFunc, and the sizes a static (tuning) build bakes in.

A dim of a buffer is one of:

* ``None``: a size of this buffer alone (a var ``<buffer>_d<i>``);
* a ``str``: a size symbol shared by every buffer (and ``shared`` scalar) naming it;
* an ``int``: a size baked into the code;
* ``(symbol, k)``: ``k`` times a shared symbol.

A complex buffer (dtype lanes 2) gets one more innermost dim of 2 (re, im) that ``dims`` leaves out.

The builder gets its tensors by YAML name and, if it has a parameter ``ctx``, the
``BuildContext``: the family's build information, the scalar vars, the index dtype and the CUDA
flag, explicitly — never through module state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

from ..dtypes import DType
from .base import TARGET_FLAG, Arg, Plan, scalar_arg

__all__ = ["Buffer", "Scalar", "attr_scalars", "Signature", "BuildContext", "PrimFuncResult",
           "buffers_of",
           "builder_kwargs", "builder_outputs", "output_params"]


@dataclass(frozen=True)
class Buffer:
    """A tensor parameter of a kernel (or a no_need_buffer input: ``param`` False)."""

    role: str                       # "input" | "output"
    name: str                       # the YAML name
    dtype: DType
    dims: tuple                     # the dims the kernel sees (module docstring)
    index: int | None = None        # the element of a Tensor[]
    view: tuple | None = None       # the shape this call passes, None for the array's own shape
    sizes: tuple | None = None      # this call's sizes of ``dims`` (a static build bakes them in)
    param: bool = True              # False: the kernel does not take it (YAML no_need_buffer)

    @property
    def var(self) -> str:
        """The placeholder's name: the YAML name, with the element number for a Tensor[]."""
        return self.name if self.index is None else f"{self.name}{self.index}"

    @property
    def layout(self) -> tuple:
        return (self.role, self.var, self.dims, self.dtype.name, self.param)

    def arg(self) -> Arg:
        return Arg(self.role, self.name, index=self.index, shape=self.view)


@dataclass(frozen=True)
class Scalar:
    """A runtime scalar parameter; ``shared``: an int that is also the size symbol of that name."""

    name: str
    dtype: str
    value: Any = None
    shared: bool = False

    def arg(self) -> Arg:
        return Arg("scalar", self.name, dtype=self.dtype, value=self.value)


def attr_scalars(op: str, names, dtype: str, attrs: dict) -> list[Scalar]:
    """The runtime scalars of the float attributes ``names`` in a kernel computing in ``dtype``
    (their values as ``families.base.scalar_arg`` passes them)."""
    args = (scalar_arg(op, n, dtype, attrs[n]) for n in names)
    return [Scalar(a.name, a.dtype, a.value) for a in args]


@dataclass(frozen=True)
class Signature:
    """Everything that identifies one kernel and how this call maps onto its parameters."""

    family: str
    op: str
    dtype: DType                    # the kernel's data dtype (names the symbol)
    buffers: tuple                  # Buffer, inputs then outputs, in parameter order
    scalars: tuple = ()             # Scalar, in parameter order (after the inputs)
    facts: tuple = ()               # hashable code-changing facts the builder reads (ctx.facts)
    index: str = "int64"            # the dtype of size symbols and index arithmetic

    @property
    def key(self) -> tuple:
        return (self.family, self.op, self.dtype.name, tuple(b.layout for b in self.buffers),
                tuple((s.name, s.dtype, s.shared) for s in self.scalars), self.facts, self.index)

    @property
    def symbol(self) -> str:
        digest = hashlib.sha1(repr(self.key).encode()).hexdigest()[:10]
        return f"{self.op}_{self.dtype.name}_{digest}"

    @property
    def inputs(self) -> list[Buffer]:
        return [b for b in self.buffers if b.role == "input"]

    @property
    def outputs(self) -> list[Buffer]:
        return [b for b in self.buffers if b.role == "output"]

    def args(self) -> tuple[Arg, ...]:
        """The runtime's argument list: the order ``build`` gives the PrimFunc's parameters."""
        ins = [b.arg() for b in self.inputs if b.param]
        return tuple(ins + [s.arg() for s in self.scalars] + [b.arg() for b in self.outputs])

    def plan(self, make: Callable[..., Any] | None, *, pattern: str, static: bool = False,
             **fields) -> Plan:
        """The Plan of this kernel; ``make(static=False)`` builds it (``static``: the plan also
        gets ``make_static``, the same kernel with this call's sizes baked in)."""
        make_static = None
        if static and make is not None:
            make_static = lambda inline=False: make(static=True)  # noqa: E731
        return Plan(key=self.key, symbol=self.symbol,
                    make=None if make is None else (lambda: make(static=False)),
                    make_static=make_static, args=self.args(), pattern=pattern, **fields)

    def build(self, impl, spec, attrs: dict, *, static: bool = False, info=None, values=None):
        """The PrimFunc: ``impl.fn`` called with the placeholders, scalar vars and attributes by
        YAML name (and ``ctx`` if it takes one), its outputs as the trailing parameters.
        ``values(ctx) -> {name: value}``: builder arguments the family makes from the context
        (ahead of the scalar vars and attributes)."""
        ctx = BuildContext(self, static=static, info=info)
        tensors: dict = {}
        for b in self.inputs:
            holder = ctx.placeholder(b)
            if b.index is None:
                tensors[b.name] = holder
            else:
                tensors.setdefault(b.name, []).append(holder)
        kwargs = builder_kwargs(spec, tensors, values(ctx) if values else {}, ctx.scalars, attrs)
        if "ctx" in impl.params:
            kwargs["ctx"] = ctx
        result = impl.fn(**kwargs)
        if isinstance(result, PrimFuncResult):    # a kernel written whole (TVMScript)
            return result.func
        params = []
        for b in self.inputs:
            if b.param:
                params.append(ctx.placeholder(b))
        params += [ctx.scalars[s.name] for s in self.scalars]
        produced = []           # per YAML output: None, its Buffer, or a Tensor[]'s list of them
        for o in spec.outputs:
            mine = [b for b in self.outputs if b.name == o.name]
            produced.append(None if not mine else mine if mine[0].index is not None else mine[0])
        params += output_params(spec, produced, builder_outputs(spec, result))
        if ctx.target_flag is not None:
            params.append(ctx.target_flag)
        return impl.prim_func(spec, params, self.index)


class BuildContext:
    """What a builder may know of the kernel it builds beyond its tensors (its ``ctx``)."""

    def __init__(self, sig: Signature, *, static: bool = False, info=None):
        from tvm import te
        self.signature = sig
        self.static = static
        self.info = info                    # the family's own build information, if any
        self.symbols: dict = {}
        self._holders: dict = {}
        self.target_flag = None
        self.scalars = {s.name: (self.symbol(s.name) if s.shared else te.var(s.name, s.dtype))
                        for s in sig.scalars}

    @property
    def facts(self) -> tuple:
        return self.signature.facts

    @property
    def dtype(self) -> DType:
        return self.signature.dtype

    @property
    def pair(self) -> bool:
        """Complex data: every float tensor has one more innermost dim of 2 (re, im)."""
        return self.signature.dtype.lanes == 2

    @property
    def index(self) -> str:
        return self.signature.index

    def const(self, value: int):
        """An index constant in the kernel's index dtype."""
        from tvm import tirx
        return tirx.const(int(value), self.index)

    def symbol(self, name: str):
        """The size var shared by every dim and scalar of that name."""
        if name not in self.symbols:
            from tvm import te
            self.symbols[name] = te.var(name, self.index)
        return self.symbols[name]

    def dim(self, d, buffer: Buffer, i: int):
        from tvm import te, tirx
        if d is None:
            if self.static and buffer.sizes is not None:
                return tirx.IntImm(self.index, int(buffer.sizes[i]))
            return te.var(f"{buffer.var}_d{i}", self.index)
        if isinstance(d, str):
            return self.symbol(d)
        if isinstance(d, tuple):
            return self.symbol(d[0]) * tirx.const(d[1], self.index)
        return tirx.const(int(d), self.index)

    def placeholder(self, b: Buffer):
        """The te placeholder of buffer ``b`` (one per buffer)."""
        if b.var not in self._holders:
            from tvm import te, tirx
            shape = [self.dim(d, b, i) for i, d in enumerate(b.dims)]
            if b.dtype.lanes == 2:
                shape.append(tirx.IntImm(self.index, 2))
            self._holders[b.var] = te.placeholder(shape, b.dtype.storage, name=b.var)
        return self._holders[b.var]

    def on_cuda(self):
        """An int64 expression that is 1 when the kernel is built for CUDA and 0 otherwise (a
        scalar parameter the schedule rules specialise away before scheduling)."""
        if self.target_flag is None:
            from tvm import te
            self.target_flag = te.var(TARGET_FLAG, "int64")
        return self.target_flag


@dataclass
class PrimFuncResult:
    """What a builder returns for a kernel written as a whole PrimFunc (TVMScript) instead of TE:
    its parameters must be the signature's, in order."""

    func: Any = field(repr=False)


def buffers_of(spec, metas: dict, outs, *, views=None, dims=None) -> tuple:
    """The Buffers of a call: every present input (``metas``, YAML order) then every produced
    output (``outs``, YAML output order; None: not produced), a Tensor[] as one Buffer per
    element. ``views``: name -> the shape the kernel sees (a list for a Tensor[]; default the
    array's own); ``dims``: name -> the dims template (default: one own size var per dim)."""
    views, dims = views or {}, dims or {}

    def one(role, name, meta, index, view, tpl):
        shape = tuple(meta.shape) if view is None else tuple(view)
        kernel_dims = tuple(tpl) if tpl is not None else (None,) * len(shape)
        return Buffer(role, name, meta.dtype, kernel_dims,
                      index=index, view=view, sizes=shape,
                      param=not (role == "input" and name in spec.no_need_buffer))

    def of(role, name, meta):
        view, tpl = views.get(name), dims.get(name)
        if isinstance(meta, list):
            return [one(role, name, m, i, None if view is None else view[i],
                        None if tpl is None else tpl[i]) for i, m in enumerate(meta)]
        return [one(role, name, meta, None, view, tpl)]

    out = []
    for name, meta in metas.items():
        if meta is not None:
            out += of("input", name, meta)
    for o, meta in zip(spec.outputs, outs):
        if meta is not None:
            out += of("output", o.name, meta)
    return tuple(out)


def builder_kwargs(spec, *sources) -> dict:
    """A builder's keyword arguments, one per YAML arg: its value from the first of ``sources``
    (dicts: placeholders, scalar vars, attribute values, ...) that has it, else None."""
    kwargs = {}
    for p in spec.args:
        kwargs[p.name] = next((src[p.name] for src in sources if p.name in src), None)
    return kwargs


def output_params(spec, outs, result) -> list:
    """The builder's output tensors as kernel parameters, in YAML order: outputs this call does not
    produce (None) are skipped, a Tensor[] output (a list) gives each element."""
    params = []
    for o, m, r in zip(spec.outputs, outs, result):
        if m is None:
            continue
        if r is None:
            raise RuntimeError(f"{spec.name}: output {o.name} is expected but the builder gave "
                               "None")
        params += list(r) if isinstance(m, list) else [r]
    return params


def builder_outputs(spec, result, *, multi=None) -> list:
    """A builder's return value as one result per YAML output. A single-output op's builder returns
    the tensor itself; ``multi`` overrides that (an op whose builder always returns a tuple)."""
    many = len(spec.outputs) > 1 if multi is None else multi
    result = list(result) if many and isinstance(result, (tuple, list)) else [result]
    if len(result) != len(spec.outputs):
        raise RuntimeError(f"{spec.name}: builder returned {len(result)} outputs for "
                           f"{spec.output_names}")
    return result
