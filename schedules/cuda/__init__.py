"""CUDA schedule rules, chosen per block by loop-nest shape.

* elementwise (``_elementwise``): spatial blocks, one thread per element;
* reduction (``_reduction``): row reductions (one thread block per output, warp shuffles) and
  column reductions (one thread per output, walking the reduced dim with coalesced loads).

Kernels whose stages pass data through scratch buffers (a reduction feeding an elementwise
epilogue other than a plain cast, chains of reductions) need those buffers in shared memory or
registers: they go to TVM's dlight rules (GeneralReduction fuses softmax/norm-like chains into one
kernel per row; Fallback covers the rest). ``RULE`` is that ordered list: the rules per loop nest,
which do not fit a function that leaves a scratch buffer in global memory, then dlight's. Every
block must end up bound to threads: an unbound block would silently run on the host, so both
raise if one is left over.
"""

from __future__ import annotations

from ..analysis import is_bound, root_block, top_blocks
from ..loops import each_nest
from ..schedule_rule import FirstFit, ScheduleRule
from . import _elementwise as elementwise
from . import _reduction as reduction
from ._threads import check_all_bound

__all__ = ["generic_rule", "NO_LOOP", "RULE"]

NO_LOOP = "bind to CUDA threads"     # each_nest's reason: a CUDA block needs a loop


def _per_nest(sch, target):
    """The rules per loop nest; None when a scratch buffer is left in global memory."""
    for info in each_nest(sch, top_blocks(sch), loopless=NO_LOOP):
        generic_rule(sch, info)
    if _global_scratch(sch):
        return None
    check_all_bound(sch)
    return sch.mod


def generic_rule(sch, info) -> None:
    """The rule for one loop nest: the row/column reduction rules, or one thread per element
    (a spatial nest already bound is left alone)."""
    if info.is_reduction:
        reduction.schedule(sch, info)
    elif not is_bound(sch, info.loops):
        elementwise.schedule(sch, info.loops)


def _global_scratch(sch) -> bool:
    """Does a scratch buffer stay in global memory (which a CUDA kernel cannot allocate)?"""
    root = sch.get(root_block(sch))
    return any(buf.scope() == "global" for buf in root.alloc_buffers)


def _dlight(sch, target):
    from tvm.s_tir import dlight as dl
    with target:
        scheduled = dl.ApplyDefaultSchedule(dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                            dl.gpu.Fallback())(sch.mod)
    from tvm import s_tir
    sch = s_tir.Schedule(scheduled)
    check_all_bound(sch)
    return scheduled


RULE = FirstFit("generic", (ScheduleRule("per_nest", _per_nest), ScheduleRule("dlight", _dlight)))
