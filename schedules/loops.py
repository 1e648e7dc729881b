"""Loop-nest steps that the rules of both targets share (what they do with the loops differs:
parallel on the CPU, thread binding on CUDA)."""

from __future__ import annotations

from .analysis import analyze, top_blocks

__all__ = ["fuse", "each_nest", "outside_externs", "keep_in_registers", "set_scopes"]


def fuse(sch, loops):
    """One loop over ``loops`` (the loop itself when there is only one: TVM's fuse wants two)."""
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def each_nest(sch, blocks, *, loopless: str | None = None):
    """The BlockInfo of each of ``blocks`` once per loop nest, for the caller to schedule.

    A block whose outermost loop belongs to a nest met before is skipped: the outputs of a
    multi-output compute share their loops, which are scheduled once. A nest is recorded after
    the caller has scheduled it (by its new outermost loop, e.g. a fused one). A block without
    loops is skipped, or, with ``loopless`` (the reason a loop is needed), an error."""
    seen = []
    for block in blocks:
        info = analyze(sch, block)
        if not info.loops:
            if loopless:
                raise RuntimeError(f"block {info.name!r} has no loop to {loopless}")
            continue
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        yield info
        seen.append(sch.get_sref(sch.get_loops(block)[0]))


def outside_externs(sch, per_unit):
    """The top-level blocks that have loops, for the caller to schedule; the sblocks inside a
    loop-less te.extern wrapper (an extern's sequential units) go to ``per_unit(sch, block)``
    on the way, in block order."""
    for block in top_blocks(sch):
        if sch.get_loops(block):
            yield block
        else:
            for child in sch.get_child_blocks(block):
                per_unit(sch, child)


def keep_in_registers(sch, block, loop, epilogue) -> None:
    """Accumulate a reduction in registers under ``loop`` (a thread, or a CPU tile) and write
    it once: its elementwise epilogue (crop, cast), if any, moves under the loop and reads a
    local buffer; else a local cache of the result is written back there."""
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, loop)
        sch.set_scope(block, 0, "local")
    else:
        sch.reverse_compute_at(sch.cache_write(block, 0, "local"), loop)


def set_scopes(sch, block, scope: str) -> None:
    """Every buffer ``block`` writes in ``scope`` ("local": registers, "shared"), for a block
    computed inside the loop that consumes it."""
    for w in range(len(sch.get(block).writes)):
        sch.set_scope(block, w, scope)
