"""CPU schedule for kernels written as annotated blocks (te_defs/indexing.py ``Body``), and the
generic elementwise rule for every other block of the same function (reductions: parallel over
the kept dims, serial within).

An annotated block carries ``tvmgrad.loops``, one letter per surrounding loop: ``p`` loops are
fused and run in parallel, ``v`` (a strip of contiguous columns) is vectorised, ``s`` stays a
serial loop. A kernel with target-specific parts takes the scalar parameter ``tvmgrad_on_cuda``:
it is fixed to 0 here and the CUDA-only parts (atomics) drop out before scheduling.
"""

from __future__ import annotations

from ..analysis import analyze
from . import _spatial

__all__ = ["schedule", "specialise", "top_blocks"]

TARGET_FLAG = "tvmgrad_on_cuda"


def schedule(sch, target=None):
    sch = specialise(sch, 0)
    seen = []
    for block in top_blocks(sch):
        kinds = _kinds(sch, block)
        if kinds is not None:
            _annotated(sch, block, kinds)
            continue
        info = analyze(sch, block)
        if not info.loops:
            continue
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        if info.is_reduction:
            _reduction(sch, info)
        else:
            _spatial(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))
    return sch.mod


def specialise(sch, on_cuda: int):
    """Fix the ``tvmgrad_on_cuda`` parameter (if any) and drop the other target's blocks."""
    import tvm
    from tvm import s_tir, tirx
    func = sch.mod["main"]
    flag = [p for p in func.params if p.name == TARGET_FLAG]
    if not flag:
        return sch
    func = func.specialize({flag[0]: tirx.IntImm("int64", on_cuda)})
    mod = s_tir.transform.StmtSimplify()(tvm.IRModule({"main": func}))
    return s_tir.Schedule(mod["main"])


def top_blocks(sch):
    """The blocks to schedule: the children of the root block (whatever its name: a te.extern-only
    function's root block is named after the extern), with the loop-less wrapper block of a
    te.extern replaced by its children."""
    root = sch.mod["main"].body.block.name_hint
    out = []
    todo = list(sch.get_child_blocks(sch.get_sblock(root)))
    while todo:
        block = todo.pop(0)
        children = list(sch.get_child_blocks(block))
        if not sch.get_loops(block) and children and _kinds(sch, block) is None:
            todo[:0] = children
        else:
            out.append(block)
    return out


def _reduction(sch, info) -> None:
    """A reduction (the sums over broadcast dims in these kernels): parallel over the kept dims,
    each output reduced serially (the generic column rule's rfactor fails next to te.extern
    blocks)."""
    spatial = info.spatial_loops
    if not spatial:
        return
    sch.reorder(*spatial, *info.reduce_loops)
    sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])


def _kinds(sch, block):
    value = sch.get(block).annotations.get("tvmgrad.loops")
    return None if value is None else str(value)


def _annotated(sch, block, kinds) -> None:
    loops = sch.get_loops(block)
    assert len(loops) == len(kinds), (kinds, len(loops))
    par = [lp for lp, k in zip(loops, kinds) if k == "p"]
    vec = [lp for lp, k in zip(loops, kinds) if k == "v"]
    if not par:
        return
    if "s" not in kinds and not vec:
        _spatial(sch, par)
        return
    sch.parallel(sch.fuse(*par) if len(par) > 1 else par[0])
    for lp in vec:
        sch.vectorize(lp)
