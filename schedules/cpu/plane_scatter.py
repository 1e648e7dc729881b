"""CPU rule ``plane_scatter``: a per-plane scatter (te_defs/pool.py's max-pool grads): planes in
parallel, each plane's sequential scatter inside one block. It fits a function of spatial blocks
(``fits.plane_loops``)."""

from __future__ import annotations

from ..analysis import top_blocks
from ..fits import plane_loops
from ..schedule_rule import ScheduleRule

__all__ = ["schedule", "RULE"]


def schedule(sch, target=None):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if loops:
            sch.parallel(loops[0])
    return sch.mod


RULE = ScheduleRule("plane_scatter", schedule, plane_loops)
