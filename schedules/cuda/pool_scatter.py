"""CUDA schedule of a per-plane scatter (te_defs/pool.py): one thread per plane (its outputs in
order: deterministic, no atomics), 128 planes per thread block."""

from __future__ import annotations

from ..analysis import top_blocks

__all__ = ["schedule"]

THREADS = 128


def schedule(sch, target):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            raise RuntimeError(f"block {sch.get(block).name_hint!r} has no loop to bind")
        bx, tx = sch.split(loops[0], [None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return sch.mod
