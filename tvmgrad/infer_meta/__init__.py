"""Shape and dtype inference: one Python function per Paddle InferMeta name.

A function takes the YAML ``infer_meta.param`` values in order (``TensorMeta`` for a tensor, a
list of them for ``Tensor[]``, ``None`` for an absent optional input, plain values for
attributes) and returns the output metas in the op's output order. It validates what it can,
raising ``MetaError`` (a ``ValueError``); the caller adds the op's name.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from ..dtypes import DType, dtype as as_dtype

__all__ = ["TensorMeta", "MetaError", "register", "get", "names", "broadcast_shapes", "is_one",
           "same_dim", "same_shape", "norm_axis", "norm_axes"]


class MetaError(ValueError):
    """Inputs that no kernel can accept, found before anything is built."""


def _dim(d):
    """A dim as a Python int, or the symbolic expression (e.g. a Relax shape var) it is."""
    if isinstance(d, int):
        return d
    if hasattr(d, "__index__"):
        return int(d)
    value = getattr(d, "value", None)                 # tirx.IntImm
    return int(value) if isinstance(value, int) else d


def is_symbolic(d) -> bool:
    """A dim known only as an expression (a Relax shape variable), not as a number."""
    return not isinstance(_dim(d), int)


def is_one(d) -> bool:
    """A dim known to be 1: the int 1, or a placeholder's constant dim 1 (a ``tirx.IntImm``)."""
    value = d if isinstance(d, int) else getattr(d, "value", None)
    return isinstance(value, int) and value == 1


def same_dim(a, b) -> bool:
    """Equal dims; symbolic dims are equal when TVM's arithmetic proves it (n·12 = n·3·4)."""
    a, b = _dim(a), _dim(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    import tvm_ffi
    if tvm_ffi.structural_equal(a, b):
        return True
    from tvm.sym import Analyzer                 # symbolic dims: a Relax graph, tvm is loaded
    return bool(Analyzer().can_prove_equal(a, b))


def same_shape(a, b) -> bool:
    return len(a) == len(b) and all(same_dim(x, y) for x, y in zip(a, b))


@dataclass(frozen=True)
class TensorMeta:
    """What shape inference knows of a tensor: its shape and dtype, not its data.

    Dims are Python ints, or symbolic expressions when planning for a graph with dynamic shapes
    (tvmgrad.relax); shape code that must work for both uses ``is_one``/``same_dim``."""

    shape: tuple
    dtype: DType

    def __init__(self, shape, dtype):
        object.__setattr__(self, "shape", tuple(_dim(d) for d in shape))
        object.__setattr__(self, "dtype", as_dtype(dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, array) -> "TensorMeta":
        return cls(array.shape, array.dtype)

    def with_dtype(self, dtype) -> "TensorMeta":
        return TensorMeta(self.shape, dtype)

    def __repr__(self) -> str:
        return f"TensorMeta({list(self.shape)}, {self.dtype.name})"


_REGISTRY: dict[str, Callable] = {}


def register(fn: Callable) -> Callable:
    """Register an InferMeta function under its own (Paddle) name."""
    if fn.__name__ in _REGISTRY:
        raise RuntimeError(f"InferMeta {fn.__name__} registered twice")
    _REGISTRY[fn.__name__] = fn
    return fn


_LOADED = False


def _load_all() -> None:
    """Import every InferMeta module once (a module imported directly earlier must not stop
    the others from loading)."""
    global _LOADED
    if _LOADED:
        return
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    _LOADED = True


def get(name: str) -> Callable | None:
    _load_all()
    return _REGISTRY.get(name)


def names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def broadcast_shapes(*shapes: tuple, names: tuple[str, ...] | None = None) -> tuple:
    """numpy/Paddle broadcasting (right-aligned); MetaError naming the arguments on mismatch.

    Symbolic dims are taken to be equal to each other and to the static dim they meet (they
    cannot be checked before the graph runs)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(-rank, 0):
        dims = [s[axis] for s in shapes if len(s) >= -axis and not is_one(s[axis])]
        static = {d for d in dims if isinstance(d, int)}
        if len(static) > 1:
            who = ", ".join(f"{n}{list(s)}" for n, s in zip(names or [f"#{i}" for i in range(len(shapes))], shapes))
            raise MetaError(f"shapes do not broadcast: {who}")
        out.append(static.pop() if static else (dims[0] if dims else 1))
    return tuple(out)


def norm_axis(axis: int, rank: int, what: str = "axis", *, extra: int = 0, of: str | None = None,
              op: str | None = None, zero_d_axis: bool = False) -> int:
    """Attribute ``what`` = ``axis``, an axis of a tensor of ``rank``, made non-negative.

    Valid axes lie in [-(rank+extra), rank+extra): ``extra`` = 1 for an axis that may be one past
    the last (stack's new axis); with ``zero_d_axis`` a 0-d tensor has the one axis 0 (as Paddle's
    reductions, scans and index ops take it). MetaError naming the attribute, the tensor ``of``
    and, for a planner (whose errors name their op; an InferMeta's caller adds it), the op ``op``.
    """
    hi = (max(rank, 1) if zero_d_axis else rank) + extra
    if not -hi <= axis < hi:
        tensor = f"{of!r} of rank {rank}" if of else f"a tensor of rank {rank}"
        raise MetaError(f"{op + ': ' if op else ''}attribute {what!r} = {axis} is out of range "
                        f"[{-hi}, {hi - 1}] for {tensor}")
    return axis + hi if axis < 0 else axis


def norm_axes(axes, rank: int, what: str = "axis", *, unique: bool = True, of: str | None = None,
              op: str | None = None) -> tuple[int, ...]:
    """Every axis of ``axes`` made non-negative (``norm_axis``); MetaError for a repeated axis
    unless ``unique`` is False."""
    out = tuple(norm_axis(a, rank, what, of=of, op=op) for a in axes)
    if unique and len(set(out)) != len(out):
        raise MetaError(f"{op + ': ' if op else ''}attribute {what!r} = {list(axes)} has duplicate axes")
    return out
