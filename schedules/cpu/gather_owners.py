"""CPU rule ``gather_owners``: gathers and owner blocks, the sampling grads (te_defs/interp.py,
roi.py, signal.py, correlation, affine_grid).

Blocks are of three kinds, told apart by their loop nests (never by op name):

* annotated owner blocks (``tvmgrad.loops``, one letter per loop: ``p`` loops are fused and run
  in parallel, an ``i`` loop stays a plain inner loop, ``s`` loops stay serial inside one
  worker);
* gathers written as TE reductions (one output element sums its contributors): the spatial loops
  but the innermost are fused and parallel; the reduction runs inside the innermost spatial loop
  (per element, in registers), or, when the block is annotated ``tvmgrad.vec_inner``, outside it
  so that a contiguous run of outputs (channels) accumulates together; the init is split off so
  that an empty reduction still writes zeros;
* spatial blocks (tables, casts): parallel outer loops, the innermost left contiguous.

A kernel with target-specific blocks (the ``tvmgrad_on_cuda`` parameter) keeps its CPU ones.
A policy for every block: it fits any function whose annotated blocks have one letter per loop.
"""

from __future__ import annotations

from ..fits import loop_letters_match
from ..schedule_rule import ScheduleRule
from ._parallel import parallel, spatial
from .annotated_loops import specialise, with_annotated

__all__ = ["schedule"]


def schedule(sch, target=None):
    return with_annotated(specialise(sch, 0), _annotated, _gather)


def _gather(sch, info) -> None:
    block = info.block
    spatial_loops, reduce = info.spatial_loops, info.reduce_loops
    vec_inner = "tvmgrad.vec_inner" in sch.get(block).annotations
    if vec_inner and len(spatial_loops) > 1:
        *outer, inner = spatial_loops
        sch.reorder(*reduce, inner)
        parallel(sch, outer)
        sch.decompose_reduction(block, reduce[0])
        return
    if spatial_loops:
        spatial(sch, spatial_loops)
    sch.decompose_reduction(block, reduce[0])


def _annotated(sch, block, kinds) -> None:
    """Fused parallel ``p`` loops; an ``i`` loop stays a plain inner loop (the index arithmetic
    of the outer loops is hoisted out of it, and it walks contiguous memory); ``s`` serial."""
    loops = sch.get_loops(block)
    assert len(loops) == len(kinds), (kinds, len(loops))
    par = [lp for lp, k in zip(loops, kinds) if k == "p"]
    if not par:
        inner = [lp for lp, k in zip(loops, kinds) if k == "i"]
        if inner:
            sch.parallel(inner[0])
        return
    parallel(sch, par)


RULE = ScheduleRule("gather_owners", schedule, loop_letters_match)
