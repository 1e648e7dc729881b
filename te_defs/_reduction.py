"""Element and view helpers shared by the reduction grads (norm.py, softmax.py, loss.py): placeholder
elements in their compute dtype and results in their storage dtype, the (pre, n[, post]) view of
a shape around its reduced axis, shape agreement checks."""

from __future__ import annotations

from tvmgrad.dtypes import dtype as as_dtype, to_compute
from tvmgrad.families.base import OpError
from tvmgrad.infer_meta import same_shape

from ._plan import split_axis

__all__ = ["cdtype", "ld", "store", "axis_view", "need_same_shape"]


def cdtype(t) -> str:
    """The compute dtype of a placeholder's elements (float32 for half types)."""
    return as_dtype(str(t.dtype)).compute


def ld(t, *idx, to=None):
    """Element ``t[idx]`` in its compute dtype (bf16 widened exactly), optionally cast to ``to``."""
    v = to_compute(t(*idx), as_dtype(str(t.dtype)))
    return v if to is None or str(v.ty) == to else v.astype(to)


def store(t_like, value):
    """``value`` cast to the storage dtype of placeholder ``t_like`` (or a dtype name)."""
    storage = t_like if isinstance(t_like, str) else as_dtype(str(t_like.dtype)).storage
    return value if str(value.ty) == storage else value.astype(storage)


def axis_view(shape, axis):
    """(template, sizes) of the (pre, n) or (pre, n, post) view of ``shape`` around ``axis``
    (post = 1 drops)."""
    pre, n, post = split_axis(tuple(shape), axis)
    sizes = {"pre": pre, "n": n, "post": post}
    return (("pre", "n") if post == 1 else ("pre", "n", "post")), sizes


def need_same_shape(op, call, a, b):
    sa, sb = call.meta(a).shape, call.meta(b).shape
    if not same_shape(sa, sb):
        raise OpError(f"{op}: input {b!r} has shape {list(sb)}, expected {list(sa)} (the shape of {a!r})")
