"""Coalescing broadcast dims: one kernel per *broadcast pattern*.

Adjacent dims that every operand broadcasts alike (all kept, or the same ones broadcast) merge into
one, and size-1 dims of the broadcast domain go, so a kernel over the coalesced views serves every
rank and shape with that pattern (all same-shape calls: one flat 1-D kernel).
"""

from __future__ import annotations

from ..infer_meta import is_one, same_dim
from .base import OpError

__all__ = ["coalesce"]


def coalesce(domain, shapes, names, op: str):
    """Merge adjacent dims of the broadcast ``domain`` that every operand (``shapes``, right-
    aligned, numpy broadcasting; ``names`` for errors) broadcasts alike; drop size-1 dims.

    -> (group sizes, per group a tuple of "operand is broadcast here" flags): operand k seen with
    the shape ``1 if flags[k] else size`` per group has the same elements in C order. No dims
    left: one group of 1. OpError (naming ``op``) for a shape that does not broadcast."""
    rank = len(domain)
    aligned = []
    for name, s in zip(names, shapes):
        if len(s) > rank:
            raise OpError(f"{op}: {name!r} has rank {len(s)}, more than the broadcast rank {rank}")
        aligned.append((1,) * (rank - len(s)) + tuple(s))
    groups: list[int] = []
    masks: list[tuple[bool, ...]] = []
    for d in range(rank):
        if is_one(domain[d]):
            continue
        mask = []
        for name, s in zip(names, aligned):
            if not (is_one(s[d]) or same_dim(s[d], domain[d]) or not isinstance(s[d], int)
                    or not isinstance(domain[d], int)):
                raise OpError(f"{op}: {name!r} has shape {list(s)}, which does not broadcast to "
                              f"{list(domain)}")
            mask.append(is_one(s[d]))
        mask = tuple(mask)
        if masks and masks[-1] == mask:
            groups[-1] *= domain[d]
        else:
            groups.append(domain[d])
            masks.append(mask)
    if not groups:
        groups, masks = [1], [tuple(False for _ in names)]
    return groups, masks
