"""CUDA schedule rules, chosen per block by loop-nest shape.

* ``elementwise``: spatial blocks, one thread per element;
* ``reduction``: row reductions (one thread block per output, warp shuffles) and column
  reductions (one thread per output, walking the reduced dim with coalesced loads).

Every block of a CUDA kernel must end up bound to threads: an unbound block would silently run on
the host, so ``schedule`` raises if one is left over.
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from . import elementwise, reduction

__all__ = ["schedule"]


def schedule(sch) -> None:
    seen = []
    for block in top_blocks(sch):
        info = analyze(sch, block)
        if not info.loops:
            raise RuntimeError(f"block {info.name!r} has no loop to bind to CUDA threads")
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        if info.is_reduction:
            reduction.schedule(sch, info)
        elif not _already_bound(sch, info.loops):
            elementwise.schedule(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))
    _check_all_bound(sch)


def _check_all_bound(sch) -> None:
    for block in top_blocks(sch):
        if not _already_bound(sch, sch.get_loops(block)):
            raise RuntimeError(f"block {sch.get(block).name_hint!r} is not bound to CUDA threads")


def _already_bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)
