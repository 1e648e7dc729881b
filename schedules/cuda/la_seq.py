"""CUDA schedule of the linalg family (te_defs/linalg.py): batched matrix algebra with sequential
units.

* sequential units (spatial sblocks inside a ``te.extern``: a triangular solve per batch element and
  right-hand-side column, an LU factorisation per matrix, ...): one thread per unit, UNIT_THREADS
  per block;
* reductions (batched matrix products, per-batch sums): one thread per output element, the
  reduction a serial loop accumulating in a register;
* elementwise blocks: the generic rule (one thread per element).

Every block ends up bound to threads (checked).
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from . import _elementwise as elementwise

__all__ = ["schedule", "units", "check_bound"]

UNIT_THREADS = 64
RED_THREADS = 128


def schedule(sch, target=None):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            for child in sch.get_child_blocks(block):
                units(sch, child)
            continue
        if _bound(sch, loops):
            continue
        info = analyze(sch, block)
        if info.is_reduction:
            reduction(sch, info)
        else:
            elementwise.schedule(sch, loops)
    check_bound(sch)
    return sch.mod


def units(sch, block, threads: int = UNIT_THREADS) -> None:
    loops = sch.get_loops(block)
    if not loops:
        raise RuntimeError(f"sequential block {sch.get(block).name_hint!r} has no unit loop")
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def reduction(sch, info) -> None:
    block = info.block
    spatial = info.spatial_loops
    fused = sch.fuse(*spatial) if len(spatial) > 1 else (spatial[0] if spatial else sch.add_unit_loop(block))
    bx, tx = sch.split(fused, [None, RED_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tx)
    sch.decompose_reduction(block, info.reduce_loops[0])


def _bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)


def check_bound(sch) -> None:
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            kids = sch.get_child_blocks(block)
            if not kids:
                raise RuntimeError(f"block {sch.get(block).name_hint!r} has no loop to bind")
            for child in kids:
                if not _bound(sch, sch.get_loops(child)):
                    raise RuntimeError(f"block {sch.get(child).name_hint!r} is not bound to CUDA threads")
        elif not _bound(sch, loops):
            raise RuntimeError(f"block {sch.get(block).name_hint!r} is not bound to CUDA threads")
