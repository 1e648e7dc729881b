"""CUDA rule for gathers that sum a few sources per output element (col2im, overlap-add of
frames/windows, overlapping as_strided views): one thread per output element, the (short)
reduction loops run serially in that thread, the cast back to a half type stays in a register.

Spatial blocks get the elementwise rule. Several top-level blocks (one per output) each become a
kernel; no block is left unbound.
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from . import _check_all_bound
from ._reduction import _epilogue

THREADS = 256


def schedule(sch, target):
    done = []
    for block in top_blocks(sch):
        if any(sch.get_sref(block).same_as(d) for d in done):
            continue
        info = analyze(sch, block)
        if not info.loops:
            raise RuntimeError(f"block {info.name!r} has no loop to bind to CUDA threads")
        spatial = info.spatial_loops
        fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        bx, tx = sch.split(fused, [None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if info.is_reduction:
            epilogue = _epilogue(sch, block)
            if epilogue is not None:
                sch.reverse_compute_at(epilogue, tx)
                sch.set_scope(block, 0, "local")
                done.append(sch.get_sref(epilogue))
            sch.decompose_reduction(block, info.reduce_loops[0])
    _check_all_bound(sch)
    return sch.mod
