"""CPU rule ``gather_sums``: gathers that sum a few sources per output element (col2im,
overlap-add of frames/windows, overlapping as_strided views, the shape grads' staged pads): the
outer output loops run in parallel, each element's short reduction loops run innermost and
serially; a cast back to a half type follows in the same parallel loop. Spatial blocks get the
generic rule, except those a builder marks ``gather_sums.rows`` (pad3d_grad: each element sums
a few whole shifted rows and row-level scalars): the loops above the row loop's parent run in
parallel, that one serially, and the innermost loop, a short contiguous row of
runtime length that LLVM would leave scalar, is split by the target's vector lanes and
vectorised, the tail step split off by loop partition. A policy for every block: it fits any
function.
"""

from __future__ import annotations

from ..analysis import annotations, const_extent, epilogue, top_blocks
from ..loops import each_nest
from ..schedule_rule import ScheduleRule
from ._isa import vector_unit
from ._parallel import parallel, spatial

__all__ = ["schedule", "RULE", "ROWS"]

ROWS = "gather_sums.rows"


def schedule(sch, target=None):
    for info in each_nest(sch, top_blocks(sch)):     # (a moved epilogue shares its loops)
        if not info.is_reduction:
            if ROWS in annotations(sch, info.block) and len(info.loops) > 1:
                _row_nest(sch, info, target)
            else:
                spatial(sch, info.loops)
            continue
        kept = info.spatial_loops
        par = parallel(sch, kept[:-1] if len(kept) > 1 else kept)
        epi = epilogue(sch, info.block)
        if epi is not None:
            sch.reverse_compute_at(epi, par)
        sch.decompose_reduction(info.block, info.reduce_loops[0])
    return sch.mod


def _row_nest(sch, info, target) -> None:
    """The loops above the rows in parallel except the row loop's parent, which stays serial
    inside each parallel step: the fused parallel index is taken apart (a div/mod per fused
    dim) once per plane, not once per row (pad3d_grad's rows are often one vector: 16³
    volumes, reflect: 16.5 -> 10.7 ms at 2^24 elements, AVX-512, 2 threads)."""
    parallel(sch, info.loops[:-2] if len(info.loops) > 2 else info.loops[:-1])
    _vector_rows(sch, info, target)


def _vector_rows(sch, info, target) -> None:
    """The row loop in vector steps of the target's lanes (a row shorter than that, e.g. a
    complex pair, stays as LLVM takes it)."""
    dtype = str(sch.get(info.block).writes[0].source.dtype)
    lanes = vector_unit(target).lanes(dtype)
    row = info.loops[-1]
    extent = const_extent(sch, row)
    if extent is not None and extent < lanes:
        return
    steps, lane = sch.split(row, [None, lanes])
    sch.vectorize(lane)
    sch.annotate(steps, "pragma_loop_partition_hint", 1)


RULE = ScheduleRule("gather_sums", schedule)
