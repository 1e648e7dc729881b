"""What every op family hands the runtime: a Plan per call, naming one compiled kernel.

A family turns a validated call into a ``Plan``: the kernel's identity (``key``: everything that
changes the generated code, never a size), how to build it (``make``: an unscheduled PrimFunc with
symbolic sizes) and how this call's arrays map onto its parameters (``args``, with zero-copy view
shapes). The runtime, the cache, AOT libraries and Relax all consume Plans and nothing else.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..dtypes import FLOATS, DType

__all__ = ["Arg", "Plan", "OpImpl", "OpError", "scalar_arg", "TARGET_FLAG"]

# The scalar parameter by which a kernel with a CPU and a CUDA form picks one (1 on CUDA): the TE
# definition declares it, the target's schedule rules fix it before scheduling.
TARGET_FLAG = "tvmgrad_on_cuda"


class OpError(ValueError):
    """Bad input found by a family's planner (shapes that no kernel variant accepts)."""


@dataclass(frozen=True)
class Arg:
    """One kernel parameter.

    kind: ``input`` / ``output`` (a buffer; ``index`` picks an element of a Tensor[]; ``shape`` is
    the view this call passes, None for the array's own shape) or ``scalar`` (a runtime attribute
    value of TVM dtype ``dtype``).
    """

    kind: str
    name: str
    index: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    value: Any = None


def scalar_arg(op: str, name: str, dtype: str, value) -> Arg:
    """The kernel parameter of a runtime attribute: a float attribute of a float kernel as it is;
    of an integer/bool kernel truncated toward 0 (as C++'s static_cast; TVM refuses a Python float
    for an integer parameter), an error where the value has no such integer (inf, NaN)."""
    value = float(value)
    if dtype.startswith(("int", "uint", "bool")):
        if not math.isfinite(value):
            raise ValueError(f"{op}: attribute {name!r} = {value} has no {dtype} value")
        value = bool(value) if dtype == "bool" else int(value)
        if dtype.startswith("uint"):               # a negative value wraps, as x86 converts it
            value %= 1 << int(dtype[4:])
    return Arg("scalar", name, dtype=dtype, value=value)


@dataclass
class Plan:
    key: tuple
    symbol: str
    make: Callable[[], Any] | None = field(repr=False)   # None: every output is an alias
    args: tuple[Arg, ...] = ()
    pattern: str = "generic"      # the schedule module (schedules/<target>/<pattern>.py) if any
    # output -> (input, shape): an output that is the input's data reshaped (a view when the
    # caller allows aliasing, else a copy; no kernel either way)
    aliases: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    # may a YAML inplace output share its input's buffer inside the kernel? (else the runtime
    # computes into scratch and copies back)
    inplace_safe: bool = False
    # the same PrimFunc with this call's sizes baked in (for tuning; None if the family has none);
    # make_static(inline=True): an equivalent form without let-bound scalars, for meta_schedule
    make_static: Callable[..., Any] | None = field(default=None, repr=False)
    # a tuned schedule (meta_schedule trace as Python) replacing the rules; only with make_static
    trace: str | None = field(default=None, repr=False)
    # every index of this call fits 32 bits: the kernel's index math is narrowed to int32 before
    # scheduling (no 64-bit division, which CUDA runs as a call that spills); part of the key
    narrow_index: bool = False
    # a tuned variant: the key of the plan its family made, which the tuning record is filed
    # under (set by ``planning`` when a record replaces the plan); None for that plan itself
    tuned_from: tuple | None = None
    # a candidate for streaming stores (tvmgrad/streaming.py): the bytes of output of a kernel
    # that writes each output element once by contiguous vector stores and stores nothing else
    # in its body (or, with ``stream_variant``, nothing else into its outputs); None for every
    # other kernel
    stream_bytes: int | None = None
    # a streamed plan (its outputs written by non-temporal stores, CPU): the ordinary plan it was
    # made from (``streaming.streamed``), whose key is its ``variant_key``
    plain: "Plan | None" = field(default=None, repr=False)
    # a family's own streamed kernel: -> its Plan (a view or shape op's, its rows' lengths baked
    # in so that LLVM proves its output vectors aligned); None: this kernel under the
    # stream_stores schedule
    stream_variant: "Callable[[], Plan] | None" = field(default=None, repr=False)
    # sizes the kernel was built for beyond its key's symbols: (arg position, axis, size) per
    # baked dim (a streamed view kernel's rows); a call of other sizes runs its ordinary twin
    baked: tuple = ()

    @property
    def stream(self) -> bool:
        return self.plain is not None

    @property
    def variant_key(self) -> tuple:
        """The key of the kernel variant, which decides which calls it serves: a streamed plan's
        is its ordinary twin's (it computes the same for every size)."""
        return self.key if self.plain is None else self.plain.key

    @property
    def base_key(self) -> tuple:
        """The kernel's identity without tuning: the key its family gave it (a tuned variant's
        own key adds the record's sizes and trace digest)."""
        return self.key if self.tuned_from is None else self.tuned_from


class OpImpl:
    """Base of every family's implementation object; ``te_defs`` modules create them by decorator.

    ``name`` is the op (a backward.yaml op, or a forward op that an ``invoke`` names).
    """

    family_kind = "generic"

    def __init__(self, fn: Callable, *, dtypes=FLOATS, infer_meta: str | None = None):
        self.fn = fn
        self.name = fn.__name__
        self.doc = inspect.getdoc(fn) or ""
        self.dtypes = tuple(dtypes)
        self.infer_meta = infer_meta
        self.source_file = inspect.getsourcefile(fn)
        self.module = fn.__module__
        self.params = tuple(inspect.signature(fn).parameters)

    @classmethod
    def decorator(cls, fn=None, **options):
        """``@name`` or ``@name(**options)`` over a builder: this family's op object for it."""
        if fn is None:
            return lambda f: cls(f, **options)
        return cls(fn, **options)

    @property
    def family(self) -> str:
        return self.module.rsplit(".", 1)[-1]

    def plan(self, call, outs) -> Plan:  # pragma: no cover - interface
        raise NotImplementedError

    def check_dtype(self, call, names) -> DType:
        """The one dtype shared by the tensors ``names`` (Tensor[] elements included), which must
        be one this op supports; TypeError naming the offending input otherwise."""
        pairs = []
        for name in names:
            meta = call.meta(name)
            if isinstance(meta, list):
                pairs += [(f"{name}[{i}]", m) for i, m in enumerate(meta)]
            elif meta is not None:
                pairs.append((name, meta))
        if not pairs:
            raise ValueError(f"{call.op}: no tensor input given")
        first_name, first = pairs[0]
        for name, meta in pairs:
            if meta.dtype.name not in self.dtypes:
                raise TypeError(f"{call.op}: input {name!r} has dtype {meta.dtype.name}; "
                                f"{call.op} supports {', '.join(self.dtypes)}")
            if meta.dtype != first.dtype:
                raise TypeError(f"{call.op}: input {name!r} has dtype {meta.dtype.name} but "
                                f"{first_name!r} has {first.dtype.name}; they must match")
        return first.dtype

    @staticmethod
    def check_index_dtypes(call, names, allowed) -> None:
        """Index tensors (Tensor[] elements included) must hold one of the ``allowed`` integer
        dtypes; TypeError naming the offending input otherwise."""
        for name in names:
            meta = call.meta(name)
            for m in (meta if isinstance(meta, list) else [meta]):
                if m is not None and m.dtype.name not in allowed:
                    raise TypeError(f"{call.op}: input {name!r} has dtype {m.dtype.name}; it must be "
                                    f"one of {', '.join(allowed)}")

    @staticmethod
    def prim_func(spec, params, index=None):
        """``te.create_prim_func`` over the kernel's parameters, which leave out the YAML
        ``no_need_buffer`` inputs: a builder that reads one fails here (it may use its shape).
        ``index``: the kernel's index dtype, given to every loop and block variable (TE makes each
        iteration domain start at an int32 0 whatever its extent's dtype, and schedule primitives
        such as ``transform_layout`` then fail on int64 kernels: int32 vs. int64)."""
        from tvm import te
        try:
            return te.create_prim_func(params, index_dtype_override=index)
        except Exception as exc:  # noqa: BLE001 - TVM reports a missing placeholder obscurely
            if spec.no_need_buffer:
                raise RuntimeError(f"{spec.name}: the kernel reads an input the YAML marks "
                                   f"no_need_buffer ({', '.join(sorted(spec.no_need_buffer))}); "
                                   f"only its shape may be used") from exc
            raise

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.family})>"
