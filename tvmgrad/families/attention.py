"""The attention family: ``@tensor_op`` whose planner fixes the kernel's view of every input
(te_defs/attention.py).

``@attn_op(describe=...)``: ``describe(call, outs) -> Desc`` validates the call and says which
inputs the kernel reads and how (each dim a shared size symbol, ``(symbol, k)``, or an int baked
in: head dims, group sizes, broadcast dims; a mask of rank > 4 has its leading dims flattened into
the first), the runtime scalars (an int64 one is also the size symbol of its name: the max
sequence lengths), the build information the builder reads as ``ctx.info`` (a dict) and the
index dtype (``index_dtype``). Inputs a ``Desc`` leaves out are not kernel parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..dtypes import DType
from .base import Plan
from .signature import Scalar, Signature, buffers_of
from .tensor import TensorOp

__all__ = ["attn_op", "AttnOp", "Desc", "index_dtype", "SMALL"]

SMALL = 1 << 30     # every tensor and padded intermediate below this many elements: int32 indices


def index_dtype(*sizes) -> str:
    """int32 when every given element count (inputs, outputs, padded intermediates) is below
    SMALL (int32 halves the registers of CUDA index arithmetic), else int64."""
    return "int32" if all(int(n) < SMALL for n in sizes) else "int64"


@dataclass
class Desc:
    """What a call means for its kernel (built by an op's ``describe``)."""

    dtype: DType                                     # of the data
    templates: dict = field(default_factory=dict)    # input -> dims (symbol str, int, or (sym, k))
    scalars: list = field(default_factory=list)      # (name, tvm dtype, value): runtime args
    info: tuple = ()                                 # hashable (name, value) pairs: ctx.info
    index: str = "int64"                             # index arithmetic dtype (int32 if it fits)


class AttnOp(TensorOp):
    """``tensor_op`` whose ``describe`` fixes the kernel's view of every input it reads."""

    def __init__(self, fn, *, describe, pattern="attn_flash", **options):
        super().__init__(fn, pattern=pattern, **options)
        self.describe = describe

    def plan(self, call, outs) -> Plan:
        spec = call.spec
        desc: Desc = self.describe(call, outs)
        metas = {p.name: call.meta(p.name) for p in spec.tensor_args if p.name in desc.templates}
        sizes = _symbol_sizes(metas, desc)
        views = {}
        for name, meta in metas.items():
            shape = tuple(_dim_value(d, sizes) for d in desc.templates[name])
            if shape != tuple(meta.shape):
                views[name] = shape
        scalars = tuple(Scalar(n, d, v, shared=d == "int64") for n, d, v in desc.scalars)
        sig = Signature("attn", call.op, desc.dtype,
                        buffers_of(spec, metas, outs, views=views, dims=desc.templates),
                        scalars, (desc.info,), desc.index)
        attrs, info = dict(call.attrs), dict(desc.info)
        return sig.plan(lambda static: sig.build(self, spec, attrs, info=info),
                        pattern=self.pattern)


def attn_op(**options):
    """``@attn_op(describe=...)``: an ``AttnOp`` builder (see the module docstring)."""
    return lambda fn: AttnOp(fn, **options)


def _symbol_sizes(metas: dict, desc: Desc) -> dict:
    """symbol -> this call's value, from the first tensor dim that names it (consistency of the
    others was checked by describe)."""
    sizes = {n: v for n, d, v in desc.scalars if d == "int64"}
    for name, tpl in desc.templates.items():
        shape = tuple(metas[name].shape)
        if len(shape) != len(tpl):     # leading dims flattened into the first view dim
            lead = len(shape) - len(tpl) + 1
            shape = (math.prod(shape[:lead]),) + shape[lead:]
        for d, v in zip(tpl, shape):
            if isinstance(d, str):
                sizes.setdefault(d, v)
            elif isinstance(d, tuple):
                sizes.setdefault(d[0], v // d[1])
    return sizes


def _dim_value(d, sizes):
    if isinstance(d, str):
        return sizes[d]
    if isinstance(d, tuple):
        return sizes[d[0]] * d[1]
    return int(d)
