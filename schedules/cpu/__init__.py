"""The LLVM (CPU) schedule: parallel outer loops, contiguous inner loops LLVM can vectorise.

Rules by loop-nest shape:
* spatial block: the innermost loop stays a plain contiguous loop (LLVM vectorises it; fusing it
  with the others would put a div/mod in every element's index); the rest are fused and run in
  parallel, one contiguous chunk per worker. A 1-D block is parallel as a whole;
* row reduction (the reduced dims are innermost in memory): parallel over the kept dims;
* column reduction (the kept dims are innermost) with one reduced loop: the reduced loop is split
  into PARTS chunks, each chunk summed in parallel into its own row of partial sums (rfactor) while
  streaming whole contiguous rows, then the partials are added up. With several reduced loops:
  the reduce loops move outside the innermost kept loop;
* a cast that follows a reduction is computed right after it.

``RULE`` tries two forms in order: with the column reductions' rfactor, and, when TVM refuses an
rfactor (e.g. beside te.extern stages), without it (the plain column rule), from the original
function.
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from ..analysis import epilogue as _epilogue
from ..loops import each_nest
from ..schedule_rule import FirstFit, ScheduleRule
from ._parallel import parallel, spatial as _spatial

__all__ = ["schedule", "RULE"]

INNER = 64    # elements per innermost strip of a multi-loop column reduction
PARTS = 16    # parallel partial sums of a column reduction (>= the cores of a typical host)


def schedule(sch, target=None):
    """The generic rules (``RULE``) on ``sch``; -> IRModule."""
    return RULE.schedule(sch, target)


def _with_rfactor(sch, target=None):
    """None when TVM refuses a column reduction's rfactor."""
    try:
        return _schedule(sch, rfactor=True)
    except Exception:  # noqa: BLE001 - ScheduleError / InternalError from rfactor
        return None


def _without_rfactor(sch, target=None):
    return _schedule(sch, rfactor=False)


def _schedule(sch, rfactor: bool):
    for info in each_nest(sch, top_blocks(sch)):
        if info.is_reduction:
            _reduction(sch, info, rfactor)
        else:
            _spatial(sch, info.loops)
    return sch.mod


def _reduction(sch, info, rfactor: bool = True) -> None:
    block = info.block
    epilogue = _epilogue(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    if info.row or not spatial:
        if spatial:
            outer = parallel(sch, spatial)
            if epilogue is not None:
                sch.reverse_compute_at(epilogue, outer)
                sch.set_scope(block, 0, "local")
        sch.decompose_reduction(block, reduce[0])   # zero the output even when nothing is reduced
        return
    if len(reduce) == 1 and rfactor:
        _column_rfactor(sch, block, reduce[0], epilogue)
        return
    *outer_sp, last = spatial
    lo, li = sch.split(last, [None, INNER])
    sch.reorder(lo, *reduce, li)
    par = parallel(sch, [*outer_sp, lo])
    sch.decompose_reduction(block, reduce[0])
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, par)


def _column_rfactor(sch, block, r, epilogue) -> None:
    n_kept = len(sch.get_loops(block)) - 1
    rp, _ = sch.split(r, [PARTS, None])
    rf = sch.rfactor(rp, factor_axis=0)
    loops = sch.get_loops(rf)                  # the same nest: kept..., parts, rest of the reduction
    kept, parts, rest = loops[:n_kept], loops[n_kept], loops[n_kept + 1:]
    sch.reorder(parts, *rest, *kept)
    sch.parallel(parts)
    sch.decompose_reduction(rf, rest[0])
    outer = parallel(sch, analyze(sch, block).spatial_loops)
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, outer)


RULE = FirstFit("generic", (ScheduleRule("column_rfactor", _with_rfactor),
                            ScheduleRule("column_serial", _without_rfactor)))
