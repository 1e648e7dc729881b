"""CUDA rule ``gather_sums``: gathers that sum a few sources per output element (col2im,
overlap-add of frames/windows, overlapping as_strided views, the shape grads' staged pads): one
thread per output element, the (short) reduction loops run serially in that thread, the cast
back to a half type stays in a register.

Spatial blocks get the elementwise rule. Several top-level blocks (one per output) each become a
kernel; no block is left unbound. It fits any function whose top-level blocks all have a loop.
"""

from __future__ import annotations

from ..analysis import epilogue, top_blocks
from ..fits import loops_to_bind
from ..loops import each_nest, keep_in_registers
from ..schedule_rule import ScheduleRule
from . import NO_LOOP
from ._threads import bind_threads, check_all_bound

__all__ = ["schedule", "RULE"]

THREADS = 256


def schedule(sch, target):
    for info in each_nest(sch, top_blocks(sch), loopless=NO_LOOP):   # (a moved epilogue
        _, tx = bind_threads(sch, info.spatial_loops, THREADS)      # shares its loops)
        if info.is_reduction:
            epi = epilogue(sch, info.block)
            if epi is not None:
                keep_in_registers(sch, info.block, tx, epi)
            sch.decompose_reduction(info.block, info.reduce_loops[0])
    check_all_bound(sch)
    return sch.mod


RULE = ScheduleRule("gather_sums", schedule, loops_to_bind)
