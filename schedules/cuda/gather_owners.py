"""CUDA rule ``gather_owners``: gathers and owner blocks, the sampling grads (te_defs/interp.py,
roi.py, signal.py, correlation, affine_grid).

* annotated owner blocks (``tvmgrad.loops``): the ``p`` and ``i`` loops are fused and split over
  blocks of 256 threads (only ``p`` loops: the outer ones on blockIdx.y, the last one split over
  blockIdx.x × 256 threads), ``s`` loops run serially in each thread;
* gathers written as TE reductions: one thread per output element, fused over the spatial loops;
  it accumulates in a register and writes once (the cast back to half of a following
  elementwise block runs in the same thread);
* spatial blocks (tables, casts): one thread per element.

A kernel with target-specific blocks (the ``tvmgrad_on_cuda`` parameter) keeps its CUDA ones.
A policy for every block: it fits any function whose annotated blocks have one letter per loop.
Every block ends up bound to threads (an unbound block would run on the host): checked.
"""

from __future__ import annotations

from ..analysis import analyze, epilogue, is_bound, loop_letters, top_blocks
from ..cpu.annotated_loops import annotated_first, specialise
from ..fits import loop_letters_match
from ..loops import fuse, keep_in_registers
from ..schedule_rule import ScheduleRule
from . import NO_LOOP
from ._threads import bind_threads, check_all_bound

__all__ = ["schedule", "RULE"]

THREADS = 256


def schedule(sch, target):
    sch = specialise(sch, 1)
    done = []
    for block in annotated_first(sch, _annotated):
        if sch.get(block).name_hint in done:
            continue
        info = analyze(sch, block)
        if not info.loops:
            raise RuntimeError(f"block {info.name!r} has no loop to {NO_LOOP}")
        if is_bound(sch, info.loops):
            continue
        if info.is_reduction:
            epi = _gather(sch, info)
            if epi is not None:
                done.append(sch.get(epi).name_hint)
        else:
            bind_threads(sch, info.loops, THREADS)
    check_all_bound(sch, top_blocks(sch, open_externs=True))
    return sch.mod


def _gather(sch, info):
    block = info.block
    epi = _epilogue(sch, block)
    _, tx = bind_threads(sch, info.spatial_loops or [sch.add_unit_loop(block)], THREADS)
    keep_in_registers(sch, block, tx, epi)
    sch.decompose_reduction(block, info.reduce_loops[0])   # zeros even when nothing is reduced
    return epi


def _epilogue(sch, block):
    """The elementwise consumer (a cast) when it reads nothing but this gather."""
    consumer = epilogue(sch, block)
    if consumer is None or loop_letters(sch, consumer) is not None:
        return None
    if len(sch.get_producers(consumer)) != 1:
        return None
    return consumer


def _annotated(sch, block, kinds) -> None:
    """``p``/``i`` loops onto threads. Owner blocks (only ``p`` loops, e.g. one per (n, c)
    plane): the outer ones fused onto blockIdx.y and the last split over blockIdx.x ×
    threadIdx.x, so a thread finds its innermost index without 64-bit division (which TVM
    re-evaluates at every use, costing registers and spills in the long serial loops). With an
    ``i`` loop (a gather over contiguous outputs) every loop is fused and split over blocks of
    threads."""
    loops = sch.get_loops(block)
    assert len(loops) == len(kinds), (kinds, len(loops))
    par = [lp for lp, k in zip(loops, kinds) if k in "pi"]
    if not par:
        par = [sch.add_unit_loop(loops[0] if loops else block)]
    if "i" in kinds or len(par) == 1:
        bind_threads(sch, par, THREADS)
        return
    outer = fuse(sch, par[:-1])
    bx, tx = sch.split(par[-1], [None, THREADS])
    sch.bind(outer, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


RULE = ScheduleRule("gather_owners", schedule, loop_letters_match)
