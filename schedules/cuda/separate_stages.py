"""CUDA rule ``separate_stages``: every stage (top-level block) of a multi-stage kernel is its
own launch, its data passed on through global scratch buffers (te_defs/detection.py's per-box
table, the sparse table merges of te_defs/distributed.py; attn_flash uses it for the assembly
stages of the attention kernels): one thread per element (spatial blocks) or per output
(reductions, the reduced loops serial in the thread — they are short in these kernels). Unlike
the generic rules it never hands such kernels to dlight. It fits any function whose top-level
blocks all have a loop; every block ends up bound (checked)."""

from __future__ import annotations

from ..analysis import analyze, is_bound, top_blocks
from ..fits import loops_to_bind
from ..schedule_rule import ScheduleRule
from . import _elementwise as elementwise
from ._threads import check_all_bound

__all__ = ["schedule", "per_element", "RULE"]

RED_THREADS = 128


def schedule(sch, target=None):
    per_element(sch)
    check_all_bound(sch)
    return sch.mod


def per_element(sch) -> None:
    """Bind every not yet bound top-level block: one thread per element / per reduced output."""
    seen = []
    for block in top_blocks(sch):
        info = analyze(sch, block)
        if not info.loops:
            raise RuntimeError(f"block {info.name!r} has no loop to bind to CUDA threads")
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen) or is_bound(sch, info.loops):
            seen.append(outer)
            continue
        if info.is_reduction:
            thread_per_output(sch, info)
        else:
            elementwise.schedule(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))


def thread_per_output(sch, info) -> None:
    block = info.block
    spatial = info.spatial_loops
    if spatial:
        sch.reorder(*spatial, *info.reduce_loops)
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    else:
        fused = sch.add_unit_loop(info.loops[0])
    bx, tx = sch.split(fused, [None, RED_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(block, info.reduce_loops[0])


RULE = ScheduleRule("separate_stages", schedule, loops_to_bind)
