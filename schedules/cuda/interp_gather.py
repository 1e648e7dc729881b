"""CUDA schedule of the sampling grads (te_defs/interp.py, roi.py, signal.py).

* annotated owner blocks (``tvmgrad.loops``): the ``p`` and ``i`` loops are fused and split over
  blocks of 256 threads (only ``p`` loops: the outer ones on blockIdx.y, the last one split over
  blockIdx.x × 256 threads), ``s`` loops run serially in each thread;
* gathers written as TE reductions: one thread per output element, fused over the spatial loops;
  it accumulates in a register and writes once (the cast back to half of a following
  elementwise block runs in the same thread);
* spatial blocks (tables, casts): one thread per element.

Every block ends up bound to threads (an unbound block would run on the host): checked.
"""

from __future__ import annotations

from ..analysis import analyze
from ..cpu.interp_gather import top_blocks

__all__ = ["schedule"]

THREADS = 256


def schedule(sch, target):
    done = []
    for block in top_blocks(sch):
        name = sch.get(block).name_hint
        if name in done:
            continue
        kinds = _kinds(sch, block)
        if kinds is not None:
            _annotated(sch, block, kinds)
            continue
        info = analyze(sch, block)
        if not info.loops:
            raise RuntimeError(f"block {info.name!r} has no loop to bind to CUDA threads")
        if _bound(sch, info.loops):
            continue
        if info.is_reduction:
            epi = _gather(sch, info)
            if epi is not None:
                done.append(sch.get(epi).name_hint)
        else:
            _threads(sch, info.loops)
    for block in top_blocks(sch):
        if not _bound(sch, sch.get_loops(block)):
            raise RuntimeError(f"block {sch.get(block).name_hint!r} is not bound to CUDA threads")
    return sch.mod


def _kinds(sch, block):
    value = sch.get(block).annotations.get("tvmgrad.loops")
    return None if value is None else str(value)


def _threads(sch, loops):
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return tx


def _gather(sch, info):
    block = info.block
    spatial, reduce = info.spatial_loops, info.reduce_loops
    epilogue = _epilogue(sch, block)
    if spatial:
        tx = _threads(sch, spatial)
    else:
        tx = _threads(sch, [sch.add_unit_loop(block)])
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, tx)
        sch.set_scope(block, 0, "local")
    else:
        cached = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(cached, tx)
    sch.decompose_reduction(block, reduce[0])      # zero the output even when nothing is reduced
    return epilogue


def _epilogue(sch, block):
    consumers = sch.get_consumers(block)
    if len(consumers) != 1:
        return None
    consumer = consumers[0]
    info = analyze(sch, consumer)
    if info.is_reduction or _kinds(sch, consumer) is not None:
        return None
    if len(sch.get_producers(consumer)) != 1:
        return None
    return consumer


def _annotated(sch, block, kinds) -> None:
    """``p``/``i`` loops onto threads. Owner blocks (only ``p`` loops, e.g. one per (n, c)
    plane): the outer ones fused onto blockIdx.y and the last split over blockIdx.x ×
    threadIdx.x, so a thread finds its (n, c) without 64-bit division (which TVM re-evaluates at
    every use, costing registers and spills in the long serial loops)."""
    loops = sch.get_loops(block)
    assert len(loops) == len(kinds), (kinds, len(loops))
    par = [lp for lp, k in zip(loops, kinds) if k in "pi"]
    if not par:
        par = [sch.add_unit_loop(loops[0] if loops else block)]
    if "i" not in kinds and len(par) > 1:
        outer = sch.fuse(*par[:-1]) if len(par) > 2 else par[0]
        bx, tx = sch.split(par[-1], [None, THREADS])
        sch.bind(outer, "blockIdx.y")
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return
    _threads(sch, par)


def _bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)
