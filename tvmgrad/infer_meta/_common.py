"""Argument checks every InferMeta module uses."""

from __future__ import annotations

from . import MetaError, TensorMeta


def need(meta: TensorMeta | None, what: str) -> TensorMeta:
    """``meta``, or a MetaError saying that the tensor ``what`` is required."""
    if meta is None:
        raise MetaError(f"{what} is required")
    return meta
