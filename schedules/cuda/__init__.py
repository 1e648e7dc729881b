"""CUDA schedule rules, chosen per block by loop-nest shape.

* elementwise (``_elementwise``): spatial blocks, one thread per element;
* reduction (``_reduction``): row reductions (one thread block per output, warp shuffles) and
  column reductions (one thread per output, walking the reduced dim with coalesced loads).

Kernels whose stages pass data through scratch buffers (a reduction feeding an elementwise
epilogue other than a plain cast, chains of reductions) need those buffers in shared memory or
registers: they go to TVM's dlight rules (GeneralReduction fuses softmax/norm-like chains into one
kernel per row; Fallback covers the rest). Every block must end up bound to threads: an unbound
block would silently run on the host, so ``schedule`` raises if one is left over.
"""

from __future__ import annotations

from ..analysis import analyze, root_block, top_blocks
from . import _elementwise as elementwise
from . import _reduction as reduction

__all__ = ["schedule"]


def schedule(sch, target):
    original = sch.mod
    seen = []
    for block in top_blocks(sch):
        info = analyze(sch, block)
        if not info.loops:
            raise RuntimeError(f"block {info.name!r} has no loop to bind to CUDA threads")
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        if info.is_reduction:
            reduction.schedule(sch, info)
        elif not _already_bound(sch, info.loops):
            elementwise.schedule(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))
    if _global_scratch(sch):
        return _dlight(original, target)
    _check_all_bound(sch)
    return sch.mod


def _global_scratch(sch) -> bool:
    """Does a scratch buffer stay in global memory (which a CUDA kernel cannot allocate)?"""
    root = sch.get(root_block(sch))
    return any(buf.scope() == "global" for buf in root.alloc_buffers)


def _dlight(mod, target):
    from tvm.s_tir import dlight as dl
    with target:
        scheduled = dl.ApplyDefaultSchedule(dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
                                            dl.gpu.Fallback())(mod)
    from tvm import s_tir
    sch = s_tir.Schedule(scheduled)
    _check_all_bound(sch)
    return scheduled


def _check_all_bound(sch) -> None:
    for block in top_blocks(sch):
        if not _already_bound(sch, sch.get_loops(block)):
            raise RuntimeError(f"block {sch.get(block).name_hint!r} is not bound to CUDA threads")


def _already_bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)
