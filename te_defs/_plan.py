"""Host-side pieces of planning shared by te_defs modules: the input arrays a planner validates,
value-range checks and errors that name the op, and shape splits around an axis."""

from __future__ import annotations

import math

import numpy as np

from tvmgrad.families.base import OpError

__all__ = ["fail", "host", "host_array", "check_range", "split_axis"]


def fail(op: str, msg: str):
    """Raise the planner error ``{op}: {msg}``."""
    raise OpError(f"{op}: {msg}")


def host(call, name):
    """The numpy array of input ``name`` (for validation on the host); None when the call carries
    shapes only (a graph being planned, e.g. in Relax: the values are checked nowhere then)."""
    return np.asarray(call.tensors[name]) if call.has_data else None


def host_array(call, name):
    """The numpy array of tensor input ``name`` (a list of them for a Tensor[]; None when
    absent)."""
    value = call.tensors.get(name)
    if value is None:
        return None
    if isinstance(value, list):
        return [np.asarray(v) for v in value]
    return np.asarray(value)


def check_range(op: str, name: str, values, low: int, high: int, what: str = "") -> None:
    """Every value in [low, high); ValueError naming the op, the input and the first bad value.
    ``values`` None (no data): nothing to check."""
    if values is None:
        return
    values = np.asarray(values)
    if values.size == 0:
        return
    bad = (values < low) | (values >= high)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise OpError(f"{op}: input {name!r} holds {int(values[pos])} at {list(pos)}, out of range "
                      f"{what or ''}(expected {low} <= value < {high})")


def split_axis(shape, axis: int):
    """(outer, n, inner) sizes of a static ``shape`` around ``axis`` (a 0-d shape: (1, 1, 1))."""
    shape = tuple(shape)
    return (math.prod(shape[:axis]), shape[axis] if shape else 1, math.prod(shape[axis + 1:]))
