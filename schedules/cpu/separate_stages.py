"""CPU rule ``separate_stages``: every stage (top-level block) of a multi-stage kernel scheduled
on its own, its data passed on through scratch buffers (te_defs/detection.py's per-box table,
the sparse table merges of te_defs/distributed.py; attn_flash uses it for the plain stages of the
attention kernels): the outer loops fused and parallel, the innermost left contiguous;
reductions keep their reduced loops serial inside (no epilogue fusion, which the generic rules
attempt and which fails when an elementwise stage reads several producers). A policy for every
block: it fits any function."""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from ..schedule_rule import ScheduleRule

__all__ = ["schedule", "plain", "per_block", "RULE"]


def schedule(sch, target=None):
    per_block(sch)
    return sch.mod


def per_block(sch) -> None:
    seen = []
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops or any(int(sch.get(lp).kind) != 0 for lp in loops):
            continue
        outer = sch.get_sref(loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        plain(sch, block)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))


def plain(sch, block) -> None:
    """Parallel outer loops (fused), the innermost loop left contiguous for LLVM; a reduction
    keeps its reduced loops serial inside."""
    info = analyze(sch, block)
    spatial = info.spatial_loops
    if not spatial:
        return
    if info.is_reduction:
        sch.reorder(*spatial, *info.reduce_loops)
        sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])
        sch.decompose_reduction(block, info.reduce_loops[0])
        return
    outer = spatial[:-1] if len(spatial) > 1 else spatial
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


RULE = ScheduleRule("separate_stages", schedule)
