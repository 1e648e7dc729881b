"""CUDA schedule for kernels written as annotated blocks (te_defs/indexing.py ``Body``), and the
generic elementwise rule for every other block of the same function (reductions: one thread per
output).

An annotated block carries ``tvmgrad.loops``, one letter per surrounding loop. With a ``v`` loop
(a strip of contiguous columns) the fused ``p`` loops become ``blockIdx.x`` and the strip's lanes
``threadIdx.x`` (coalesced; the ``s`` loops between them run in every thread); without one, the
fused ``p`` loops are split over blocks of 256 threads. ``s`` loops stay serial in a thread. A
kernel with target-specific parts takes the scalar parameter ``tvmgrad_on_cuda``: it is fixed to
1 here and the CPU-only parts drop out before scheduling. Every block ends up bound to threads
(an unbound block would run on the host): checked.
"""

from __future__ import annotations

from ..analysis import analyze
from ..cpu.idx_serial import specialise, top_blocks
from . import _elementwise as elementwise

__all__ = ["schedule"]

THREADS = 256


def schedule(sch, target):
    sch = specialise(sch, 1)
    seen = []
    for block in top_blocks(sch):
        kinds = _kinds(sch, block)
        if kinds is not None:
            _annotated(sch, block, kinds)
            continue
        info = analyze(sch, block)
        if not info.loops:
            raise RuntimeError(f"block {info.name!r} has no loop to bind to CUDA threads")
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        if info.is_reduction:
            _reduction(sch, info)
        elif not _bound(sch, info.loops):
            elementwise.schedule(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))
    for block in top_blocks(sch):
        if not _bound(sch, sch.get_loops(block)):
            raise RuntimeError(f"block {sch.get(block).name_hint!r} is not bound to CUDA threads")
    return sch.mod


def _reduction(sch, info) -> None:
    """A reduction (the sums over broadcast dims in these kernels): one thread per output,
    reducing serially."""
    spatial = info.spatial_loops
    if spatial:
        sch.reorder(*spatial, *info.reduce_loops)
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    else:
        fused = sch.add_unit_loop(info.loops[0])
    bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _kinds(sch, block):
    value = sch.get(block).annotations.get("tvmgrad.loops")
    return None if value is None else str(value)


def _annotated(sch, block, kinds) -> None:
    loops = sch.get_loops(block)
    assert len(loops) == len(kinds), (kinds, len(loops))
    par = [lp for lp, k in zip(loops, kinds) if k == "p"]
    vec = [lp for lp, k in zip(loops, kinds) if k == "v"]
    if vec:
        sch.bind(sch.fuse(*par) if len(par) > 1 else par[0], "blockIdx.x")
        sch.bind(vec[0], "threadIdx.x")
        return
    if not par:
        par = [sch.add_unit_loop(loops[0] if loops else block)]
    fused = sch.fuse(*par) if len(par) > 1 else par[0]
    bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)
