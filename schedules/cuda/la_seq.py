"""CUDA schedule of the linalg family (te_defs/linalg.py): batched matrix algebra with sequential
units.

* sequential units (spatial sblocks inside a ``te.extern``: a triangular solve per batch element and
  right-hand-side column, an LU factorisation per matrix, ...): one thread per unit, UNIT_THREADS
  per block;
* matrix products (sblock attr ``la.kind`` = "matmul"): a thread block per (batch, row) and strip
  of MM_THREADS columns, one thread per output element, the k loop serial in a register;
* other reductions (per-batch sums): one thread per output element, the reduction a serial loop
  accumulating in a register;
* elementwise blocks: the generic rule (one thread per element).

Every block ends up bound to threads (checked).
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from . import _elementwise as elementwise

__all__ = ["schedule", "units", "check_bound"]

UNIT_THREADS = 64
RED_THREADS = 128
MM_THREADS = 32


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
    ann = {str(k): v for k, v in sch.get(info.block).annotations.items()}
    if str(ann.get("la.kind", "")) == "matmul" and len(info.spatial_loops) >= 2 and len(info.reduce_loops) == 1:
        return _matmul(sch, info)
    block = info.block
    spatial = info.spatial_loops
    fused = sch.fuse(*spatial) if len(spatial) > 1 else (spatial[0] if spatial else sch.add_unit_loop(block))
    bx, tx = sch.split(fused, [None, RED_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tx)
    sch.decompose_reduction(block, info.reduce_loops[0])


def _matmul(sch, info) -> None:
    """C[b.., i, j(, pair)] = Σ_k: blockIdx.x = (batch.., i), blockIdx.y / threadIdx.x = the
    columns (pair included) in MM_THREADS-wide strips, the k loop serial in a register. No
    division in the k loop (a fused (b, i, j) index would need 64-bit divisions per load)."""
    block = info.block
    spatial, (k,) = info.spatial_loops, info.reduce_loops
    ext = sch.get(spatial[-1]).extent
    inner = 2 if len(spatial) >= 3 and hasattr(ext, "value") and int(ext.value) == 2 else 1
    rows = spatial[: len(spatial) - 1 - inner]
    cols = spatial[len(spatial) - 1 - inner:]
    row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    col = sch.fuse(*cols) if len(cols) > 1 else cols[0]
    co, ci = sch.split(col, [None, MM_THREADS])
    sch.reorder(row, co, ci, k)
    sch.bind(row, "blockIdx.x")
    sch.bind(co, "blockIdx.y")
    sch.bind(ci, "threadIdx.x")
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, ci)
    sch.decompose_reduction(block, k)


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
