"""CPU schedule of the linalg family (te_defs/linalg.py): batched matrix algebra with sequential
units.

* sequential units (the spatial sblocks inside a ``te.extern``: a triangular solve per batch and
  right-hand-side column, an LU factorisation per matrix, ...): their loops are fused and run in
  parallel, each unit's sequential loops inside;
* matrix products (sblock attr ``la.kind`` = "matmul", loops batch.., i, j, (pair), k): the
  reduction moves between i and j — parallel over (batch.., i), then for k: for j: C[i, j] +=
  A[i, k]·B[k, j] with the j loop contiguous in C and B (LLVM vectorises it);
* other reductions (per-batch sums): the kept loops fused and parallel, the reduction inner;
* elementwise blocks: the generic CPU rule (parallel outer loops, contiguous inner loop).
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import analyze, top_blocks

__all__ = ["schedule"]


def schedule(sch, target=None):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            for child in sch.get_child_blocks(block):
                units(sch, child)
            continue
        info = analyze(sch, block)
        if info.is_reduction:
            ann = {str(k): v for k, v in sch.get(block).annotations.items()}
            if str(ann.get("la.kind", "")) == "matmul":
                _matmul(sch, info)
                continue
            spatial = info.spatial_loops
            if spatial:
                sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])
            sch.decompose_reduction(block, info.reduce_loops[0])
        else:
            generic._spatial(sch, loops)
    return sch.mod


def _matmul(sch, info) -> None:
    spatial, (k,) = info.spatial_loops, info.reduce_loops
    # spatial: batch groups.., i, j (, pair)
    inner = 2 if len(spatial) >= 3 and _extent(sch, spatial[-1]) == 2 else 1
    outer = spatial[: len(spatial) - 1 - inner]
    cols = spatial[len(spatial) - 1 - inner:]
    sch.reorder(*outer, k, *cols)
    par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(par)
    sch.decompose_reduction(info.block, k)


def _extent(sch, loop):
    ext = sch.get(loop).extent
    return int(ext.value) if hasattr(ext, "value") else None


def units(sch, block) -> None:
    """The independent units of a sequential sblock, in parallel."""
    loops = sch.get_loops(block)
    if loops:
        sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])
