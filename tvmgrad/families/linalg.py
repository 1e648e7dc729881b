"""The linalg family: ``@tensor_op`` for tensors that are batches of matrices (or vectors).

Every tensor is seen as ``(lead core dims..., batch groups..., trailing core dims...)``. The op
declares the core dims of each tensor by symbol (``core(call, outs) -> {name: ("n", "k")}``, or a
``Core`` for dims in front of the batch dims; one runtime size per symbol, shared by every tensor
that names it; an int is baked in); the batch dims of every tensor broadcast against each other
(numpy rules, as Paddle's solve/triangular_solve/cholesky_solve do) and are coalesced into
*groups*: the shared size symbols ``g0``, ``g1``, ..., or the int 1 where a tensor is broadcast.
One kernel serves every size of a given broadcast pattern, dtype and code-changing attribute set.

The builder reads the batch layout as ``ctx.info`` (an ``LAInfo``); the lazy matrix algebra it
is written in is in te_defs/linalg.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..infer_meta import MetaError, broadcast_shapes, same_shape
from .base import Plan
from .broadcast import coalesce
from .tensor import TensorOp

__all__ = ["linalg_op", "LinalgOp", "Core", "LAInfo"]


@dataclass(frozen=True)
class Core:
    """Core dims of a tensor around its batch dims: ``lead`` dims before them (slogdet's (sign,
    logabsdet) pair), ``trail`` dims after (a matrix, a vector). A plain tuple means ``trail``."""

    lead: tuple = ()
    trail: tuple = ()


def _core(t) -> Core:
    return t if isinstance(t, Core) else Core((), tuple(t))


@dataclass(frozen=True)
class LAInfo:
    """What a linalg builder reads from ``ctx.info``."""

    dt: DType                       # the op's float dtype (complex: pairs)
    groups: tuple                   # the batch groups' size symbols ("g0", "g1", ...)
    masks: dict                     # tensor name -> per group: broadcast (size 1) there?
    dtypes: dict                    # tensor name -> DType
    out_core: dict                  # output name -> its trailing core dims (symbols, ints)
    extra: tuple = ()               # the op's own build info (its ``extra``; in the key)

    @property
    def cplx(self) -> bool:
        return self.dt.lanes == 2

    @property
    def compute(self) -> str:
        return self.dt.compute

    def zero(self):
        from tvm import tirx
        return tirx.const(0.0, self.compute)

    def one(self):
        from tvm import tirx
        return tirx.const(1.0, self.compute)


class LinalgOp(TensorOp):
    """``tensor_op`` over batches of matrices (module docstring).

    ``core(call, outs) -> {name: tuple}``: the core dims of every tensor input/output (symbol
    names, or ints baked into the kernel); ``extra(call, outs) -> tuple``: hashable build info the
    builder reads as ``ctx.info.extra`` (goes into the key); ``check(call, outs)``: validation that
    shape inference cannot do. ``bcast``: the tensors whose batch dims broadcast against each
    other (solve's x and y, and their grads); every other tensor's batch dims must be exactly
    theirs (without ``bcast``: those of the first tensor), as Paddle's kernels assume.
    ``dtype_exempt(call) -> names``: float inputs whose dtype ``check`` judges instead (an input
    that is not read).
    """

    family_kind = "tensor"

    def __init__(self, fn, *, core, extra=None, check=None, pattern="units_and_matmuls", bcast=(),
                 dtype_exempt=None, **options):
        super().__init__(fn, validate=check, pattern=pattern, **options)
        self.core = core
        self.extra = extra
        self.bcast = tuple(bcast)
        self.dtype_exempt = dtype_exempt

    def _batches(self, op, names, every, core) -> tuple[dict, dict]:
        """(symbol -> size, name -> batch dims): each tensor's core dims checked against its
        template and the other tensors' sizes of the same symbols."""
        sizes: dict[str, int] = {}
        origin: dict[str, str] = {}             # symbol -> the tensor that set its size
        batches = {}
        for n in names:
            shape, c = tuple(every[n].shape), core[n]
            nl, nt = len(c.lead), len(c.trail)
            if len(shape) < nl + nt:
                raise ValueError(f"{op}: {n!r} has shape {list(shape)}; it needs at least "
                                 f"{nl + nt} dims")
            where = list(range(nl)) + list(range(len(shape) - nt, len(shape)))
            for sym, d, at in zip(c.lead + c.trail, shape[:nl] + shape[len(shape) - nt:], where):
                if isinstance(sym, str):
                    origin.setdefault(sym, n)
                    if sizes.setdefault(sym, d) != d:
                        o = origin[sym]
                        raise ValueError(f"{op}: {n!r} has shape {list(shape)}, which does not match "
                                         f"{o!r} of shape {list(every[o].shape)} (dim {sym} is "
                                         f"{sizes[sym]} in {o!r}, {d} in {n!r})")
                elif sym != d:
                    raise ValueError(f"{op}: {n!r} has shape {list(shape)}; its dim {at} must be "
                                     f"{sym}, got {d}")
            batches[n] = shape[nl: len(shape) - nt]
        return sizes, batches

    def plan(self, call, outs) -> Plan:
        spec, op = call.spec, call.op
        exempt = tuple(self.dtype_exempt(call)) if self.dtype_exempt else ()
        present, dt, metas = self.checked_inputs(call, exclude=exempt)
        if self.validate is not None:
            self.validate(call, outs)
        core = {n: _core(t) for n, t in self.core(call, outs).items()}
        ins = {n: m for n, m in metas.items() if n in core and n not in exempt}
        every = dict(ins, **{o.name: m for o, m in zip(spec.outputs, outs) if m is not None})
        names = list(every)
        sizes, batches = self._batches(op, names, every, core)
        free = [n for n in names if n in self.bcast] or names[:1]
        try:
            domain = broadcast_shapes(*(batches[n] for n in free), names=tuple(free))
        except MetaError as exc:
            raise ValueError(f"{op}: batch dims: {exc}") from None
        for n in names:
            if n not in free and not same_shape(batches[n], domain):
                raise ValueError(f"{op}: {n!r} has shape {list(every[n].shape)}: its batch dims "
                                 f"{list(batches[n])} must be {list(domain)} (those of "
                                 f"{' and '.join(repr(f) for f in free)})")
        groups, masks = coalesce(domain, [batches[n] for n in names], names, op)
        symbols = tuple(f"g{j}" for j in range(len(groups)))
        mask_of = {n: tuple(m[i] for m in masks) for i, n in enumerate(names)}
        dims = {n: core[n].lead + tuple(1 if b else g for g, b in zip(symbols, mask_of[n]))
                + core[n].trail for n in names}
        sizes.update(zip(symbols, groups))
        views = {n: tuple(sizes[d] if isinstance(d, str) else d for d in dims[n]) for n in names}
        extra = tuple(self.extra(call, outs)) if self.extra else ()
        info = LAInfo(dt, symbols, mask_of, {n: every[n].dtype for n in names},
                      {o.name: core[o.name].trail for o, m in zip(spec.outputs, outs) if m is not None},
                      extra)
        sig = self.signature(call, dt, ins, outs, family="linalg", facts=(extra,), views=views, dims=dims)
        attrs = dict(call.attrs)
        return sig.plan(lambda static: sig.build(self, spec, attrs, info=info), pattern=self.pattern)


linalg_op = LinalgOp.decorator  # @linalg_op: a linalg-family builder (module docstring)
