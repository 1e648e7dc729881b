"""CPU rule ``gather_sums``: gathers that sum a few sources per output element (col2im,
overlap-add of frames/windows, overlapping as_strided views, the shape grads' staged pads): the
outer output loops run in parallel, each element's short reduction loops run innermost and
serially; a cast back to a half type follows in the same parallel loop. Spatial blocks get the
generic rule. A policy for every block: it fits any function.
"""

from __future__ import annotations

from ..analysis import epilogue, top_blocks
from ..loops import each_nest
from ..schedule_rule import ScheduleRule
from ._parallel import parallel, spatial

__all__ = ["schedule", "RULE"]


def schedule(sch, target=None):
    for info in each_nest(sch, top_blocks(sch)):     # (a moved epilogue shares its loops)
        if not info.is_reduction:
            spatial(sch, info.loops)
            continue
        kept = info.spatial_loops
        par = parallel(sch, kept[:-1] if len(kept) > 1 else kept)
        epi = epilogue(sch, info.block)
        if epi is not None:
            sch.reverse_compute_at(epi, par)
        sch.decompose_reduction(info.block, info.reduce_loops[0])
    return sch.mod


RULE = ScheduleRule("gather_sums", schedule)
