"""The LLVM (CPU) schedule: parallel outer loops, contiguous inner loops LLVM can vectorise.

Rules by loop-nest shape:
* spatial block: fuse every loop into one and run it in parallel (each worker gets one
  contiguous chunk; LLVM vectorises the chunk's loop);
* row reduction (the reduced dims are innermost in memory): parallel over the kept dims;
* column reduction (the kept dims are innermost): keep the innermost kept dim innermost, move the
  reduce loops outside it, so every step streams contiguous memory; parallel over the rest;
* a cast that follows a reduction is computed right after it, in registers.
"""

from __future__ import annotations

from .analysis import analyze, top_blocks

__all__ = ["schedule"]

INNER = 64   # elements per innermost column-reduction strip (a few cache lines)


def schedule(sch) -> None:
    seen = []
    for block in top_blocks(sch):
        info = analyze(sch, block)
        if not info.loops:
            continue
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen):
            continue       # loops shared with an earlier block (multi-output compute)
        if info.is_reduction:
            _reduction(sch, info)
        else:
            _spatial(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))


def _spatial(sch, loops) -> None:
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.parallel(fused)


def _reduction(sch, info) -> None:
    block = info.block
    epilogue = _epilogue(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    if info.row or not spatial:
        outer = sch.fuse(*spatial) if len(spatial) > 1 else (spatial[0] if spatial else None)
        if outer is not None:
            sch.parallel(outer)
            if epilogue is not None:
                sch.reverse_compute_at(epilogue, outer)
                sch.set_scope(block, 0, "local")
        return
    *outer_sp, last = spatial
    lo, li = sch.split(last, [None, INNER])
    sch.reorder(lo, *reduce, li)
    par = sch.fuse(*outer_sp, lo) if outer_sp else lo
    sch.parallel(par)
    sch.decompose_reduction(block, reduce[0])
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, par)


def _epilogue(sch, block):
    """The single elementwise consumer (e.g. a cast to half) of a reduction's scratch buffer."""
    consumers = sch.get_consumers(block)
    if len(consumers) != 1:
        return None
    consumer = consumers[0]
    if analyze(sch, consumer).is_reduction:
        return None
    return consumer
