"""CPU schedule of the sampling grads (te_defs/interp.py, roi.py, signal.py).

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
"""

from __future__ import annotations

from ..analysis import analyze

__all__ = ["schedule", "top_blocks"]


def schedule(sch, target=None):
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
            _gather(sch, info)
        else:
            _spatial(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))
    return sch.mod


def top_blocks(sch):
    """The blocks to schedule: the root's children (whatever the root block is called), with
    the loop-less wrapper block of a te.extern replaced by its children."""
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


def _kinds(sch, block):
    value = sch.get(block).annotations.get("tvmgrad.loops")
    return None if value is None else str(value)


def _spatial(sch, loops) -> None:
    if len(loops) == 1:
        sch.parallel(loops[0])
        return
    *outer, _ = loops
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def _gather(sch, info) -> None:
    block = info.block
    spatial, reduce = info.spatial_loops, info.reduce_loops
    vec_inner = "tvmgrad.vec_inner" in sch.get(block).annotations
    if vec_inner and len(spatial) > 1:
        *outer, inner = spatial
        sch.reorder(*reduce, inner)
        par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        sch.parallel(par)
        sch.decompose_reduction(block, reduce[0])
        return
    if len(spatial) > 1:
        *outer, _ = spatial
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    elif spatial:
        sch.parallel(spatial[0])
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
    sch.parallel(sch.fuse(*par) if len(par) > 1 else par[0])
