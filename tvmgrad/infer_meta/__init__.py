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

__all__ = ["TensorMeta", "MetaError", "register", "get", "names", "broadcast_shapes"]


class MetaError(ValueError):
    """Inputs that no kernel can accept, found before anything is built."""


@dataclass(frozen=True)
class TensorMeta:
    """What shape inference knows of a tensor: its shape and dtype, not its data."""

    shape: tuple[int, ...]
    dtype: DType

    def __init__(self, shape, dtype):
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
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


def _load_all() -> None:
    if _REGISTRY:
        return
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def get(name: str) -> Callable | None:
    _load_all()
    return _REGISTRY.get(name)


def names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def broadcast_shapes(*shapes: tuple[int, ...], names: tuple[str, ...] | None = None) -> tuple[int, ...]:
    """numpy/Paddle broadcasting (right-aligned); MetaError naming the arguments on mismatch."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(-rank, 0):
        dims = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(dims) > 1:
            who = ", ".join(f"{n}{list(s)}" for n, s in zip(names or [f"#{i}" for i in range(len(shapes))], shapes))
            raise MetaError(f"shapes do not broadcast: {who}")
        out.append(dims.pop() if dims else 1)
    return tuple(out)
