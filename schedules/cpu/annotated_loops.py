"""CPU rule ``annotated_loops``: blocks written with a ``tvmgrad.loops`` annotation
(te_defs/indexing.py ``Body``: the indexing, sort and blocked-scan grads) scheduled loop by loop
as the letters say, the generic elementwise rule for every other block of the same function
(reductions: parallel over the kept dims, serial within).

An annotated block carries ``tvmgrad.loops``, one letter per surrounding loop: ``p`` loops are
fused and run in parallel, ``v`` (a strip of contiguous columns) is vectorised, ``s`` stays a
serial loop. A kernel with target-specific parts takes the scalar parameter ``tvmgrad_on_cuda``:
it is fixed to 0 here and the CUDA-only parts (atomics) drop out before scheduling. A policy for
every block: it fits any function whose annotated blocks have one letter per loop.
"""

from __future__ import annotations

from tvmgrad.families.base import TARGET_FLAG
from ..analysis import loop_letters, top_blocks
from ..fits import loop_letters_match
from ..loops import each_nest
from ..schedule_rule import ScheduleRule
from ._parallel import parallel, spatial

__all__ = ["schedule", "specialise", "target_form", "annotated_first", "with_annotated", "RULE"]


def schedule(sch, target=None):
    return with_annotated(specialise(sch, 0), _annotated, _reduction)


def with_annotated(sch, annotated, reduction):
    """The CPU rules of kernels with annotated blocks: ``annotated(sch, block, letters)`` for
    those, ``reduction(sch, info)`` per reduction nest, the generic elementwise rule for the
    rest."""
    for info in each_nest(sch, annotated_first(sch, annotated)):
        if info.is_reduction:
            reduction(sch, info)
        else:
            spatial(sch, info.loops)
    return sch.mod


def annotated_first(sch, rule):
    """The blocks to schedule (te.extern wrappers opened), less the annotated ones, which
    ``rule(sch, block, letters)`` schedules on the way (in block order)."""
    for block in top_blocks(sch, open_externs=True):
        letters = loop_letters(sch, block)
        if letters is None:
            yield block
        else:
            rule(sch, block, letters)


def specialise(sch, on_cuda: int):
    """Fix the ``tvmgrad_on_cuda`` parameter (if any) and drop the other target's blocks."""
    from tvm import s_tir
    return _fix_target(sch, on_cuda, s_tir.transform.StmtSimplify())


def target_form(sch, on_cuda: int):
    """``specialise`` with no simplification beyond dropping the other target's blocks: the
    rest of the function stays as it was (a loop of extent 1 keeps its iter var binding, which
    a schedule that fuses a block's loops relies on)."""
    from tvm import tirx
    return _fix_target(sch, on_cuda, tirx.transform.RemoveNoOp())


def _fix_target(sch, on_cuda: int, cleanup):
    """The function with ``tvmgrad_on_cuda`` = ``on_cuda``, then the ``cleanup`` pass (which
    drops the blocks whose guard became false); ``sch`` itself where it has no such parameter."""
    import tvm
    from tvm import s_tir, tirx
    func = sch.mod["main"]
    flag = [p for p in func.params if p.name == TARGET_FLAG]
    if not flag:
        return sch
    func = func.specialize({flag[0]: tirx.IntImm("int64", on_cuda)})
    return s_tir.Schedule(cleanup(tvm.IRModule({"main": func}))["main"])


def _reduction(sch, info) -> None:
    """A reduction (the sums over broadcast dims in these kernels): parallel over the kept dims,
    each output reduced serially (the generic column rule's rfactor fails next to te.extern
    blocks)."""
    if not info.spatial_loops:
        return
    sch.reorder(*info.spatial_loops, *info.reduce_loops)
    parallel(sch, info.spatial_loops)


def _annotated(sch, block, kinds) -> None:
    loops = sch.get_loops(block)
    assert len(loops) == len(kinds), (kinds, len(loops))
    par = [lp for lp, k in zip(loops, kinds) if k == "p"]
    vec = [lp for lp, k in zip(loops, kinds) if k == "v"]
    if not par:
        return
    if "s" not in kinds and not vec:
        spatial(sch, par)
        return
    parallel(sch, par)
    for lp in vec:
        sch.vectorize(lp)


RULE = ScheduleRule("annotated_loops", schedule, loop_letters_match)
