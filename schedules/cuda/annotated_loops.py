"""CUDA rule ``annotated_loops``: blocks written with a ``tvmgrad.loops`` annotation
(te_defs/indexing.py ``Body``: the indexing, sort and blocked-scan grads) bound loop by loop as
the letters say, the generic elementwise rule for every other block of the same function
(reductions: one thread per output).

An annotated block carries ``tvmgrad.loops``, one letter per surrounding loop. With a ``v`` loop
(a strip of contiguous columns) the fused ``p`` loops become ``blockIdx.x`` and the strip's lanes
``threadIdx.x`` (coalesced; the ``s`` loops between them run in every thread); without one, the
fused ``p`` loops are split over blocks of 256 threads. ``s`` loops stay serial in a thread. A
kernel with target-specific parts takes the scalar parameter ``tvmgrad_on_cuda``: it is fixed to
1 here and the CPU-only parts drop out before scheduling. A policy for every block: it fits any
function whose annotated blocks have one letter per loop. Every block ends up bound to threads
(an unbound block would run on the host): checked.
"""

from __future__ import annotations

from ..analysis import is_bound, top_blocks
from ..cpu.annotated_loops import annotated_first, specialise
from ..fits import loop_letters_match
from ..loops import each_nest, fuse
from ..schedule_rule import ScheduleRule
from . import NO_LOOP
from . import _elementwise as elementwise
from ._threads import bind_threads, check_all_bound, thread_per_output

__all__ = ["schedule", "RULE"]

THREADS = 256


def schedule(sch, target):
    sch = specialise(sch, 1)
    for info in each_nest(sch, annotated_first(sch, _annotated), loopless=NO_LOOP):
        if info.is_reduction:
            thread_per_output(sch, info, THREADS)
        elif not is_bound(sch, info.loops):
            elementwise.schedule(sch, info.loops)
    check_all_bound(sch, top_blocks(sch, open_externs=True))
    return sch.mod


def _annotated(sch, block, kinds) -> None:
    loops = sch.get_loops(block)
    assert len(loops) == len(kinds), (kinds, len(loops))
    par = [lp for lp, k in zip(loops, kinds) if k == "p"]
    vec = [lp for lp, k in zip(loops, kinds) if k == "v"]
    if vec:
        sch.bind(fuse(sch, par), "blockIdx.x")
        sch.bind(vec[0], "threadIdx.x")
        return
    bind_threads(sch, par or [sch.add_unit_loop(loops[0] if loops else block)], THREADS)


RULE = ScheduleRule("annotated_loops", schedule, loop_letters_match)
