"""CPU schedule of a per-plane scatter (te_defs/pool.py): planes in parallel, each plane's
sequential scatter inside one block."""

from __future__ import annotations

from ..analysis import top_blocks

__all__ = ["schedule"]


def schedule(sch, target=None):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if loops:
            sch.parallel(loops[0])
    return sch.mod
