"""CUDA schedule of the LSTM grad (te_defs/rnn.py).

* sequential units (the spatial sblocks inside its te.externs: one batch row's forward or
  backward recurrence, the time loop inside): one thread per unit, UNIT_THREADS per block;
* reductions (the input projection, the weight / bias grads over (time, batch), the input
  grads): one thread per output element, the reduced loops serial, accumulating in a register;
* elementwise blocks: the generic rule (one thread per element).

Every block ends up bound to threads (checked).
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from . import _elementwise as elementwise

__all__ = ["schedule"]

UNIT_THREADS = 32
RED_THREADS = 128


def schedule(sch, target=None):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            for child in sch.get_child_blocks(block):
                _units(sch, child)
            continue
        if _bound(sch, loops):
            continue
        info = analyze(sch, block)
        if info.is_reduction:
            _reduction(sch, info)
        else:
            elementwise.schedule(sch, loops)
    _check_bound(sch)
    return sch.mod


def _bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)


def _check_bound(sch) -> None:
    """Every block bound to threads, the units inside te.extern wrappers included (an unbound
    block would run on the host)."""
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        inner = [block] if loops else list(sch.get_child_blocks(block))
        for b in inner:
            if not _bound(sch, sch.get_loops(b)):
                raise RuntimeError(f"block {sch.get(b).name_hint!r} is not bound to CUDA threads")


def _units(sch, block) -> None:
    loops = sch.get_loops(block)
    if not loops:
        raise RuntimeError(f"sequential block {sch.get(block).name_hint!r} has no unit loop")
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, UNIT_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _reduction(sch, info) -> None:
    block = info.block
    spatial = info.spatial_loops
    sch.reorder(*spatial, *info.reduce_loops)
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(fused, [None, RED_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tx)
    sch.decompose_reduction(block, info.reduce_loops[0])
