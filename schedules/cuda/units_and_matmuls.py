"""CUDA rule ``units_and_matmuls``: batched matrix algebra of sequential units and matrix
products (the linalg family, te_defs/linalg.py).

* sequential units (spatial sblocks inside a ``te.extern``: a triangular solve per batch element and
  right-hand-side column, an LU factorisation per matrix, ...): one thread per unit, UNIT_THREADS
  per block (a kernel with CPU and CUDA forms of its units keeps the CUDA ones);
* matrix products (sblock attr ``la.kind`` = "matmul"): a thread block per (batch, row) and strip
  of MM_THREADS columns, one thread per output element, the k loop serial in a register;
* other reductions (per-batch sums): one thread per output element, the reduction a serial loop
  accumulating in a register;
* elementwise blocks: the generic rule (one thread per element).

It fits a function with te.extern units or matrix products (``fits.units_or_matmuls``). Every
block ends up bound to threads (checked).
"""

from __future__ import annotations

from ..analysis import analyze, annotations, const_extent, is_bound, top_blocks
from ..fits import units_or_matmuls
from ..loops import fuse, keep_in_registers, outside_externs
from ..schedule_rule import ScheduleRule
from . import _elementwise as elementwise
from ..cpu.annotated_loops import target_form
from ._threads import bind_threads, check_all_bound

__all__ = ["schedule", "schedule_around_externs", "units", "check_bound", "RULE"]

UNIT_THREADS = 64
RED_THREADS = 128
MM_THREADS = 32


def schedule(sch, target=None):
    return schedule_around_externs(target_form(sch, 1), units, reduction)


def schedule_around_externs(sch, schedule_unit, schedule_reduction):
    """Kernels of sequential extern units: ``schedule_unit`` places each extern block on the
    device; the blocks around them that are not bound yet are reductions
    (``schedule_reduction(sch, info)``) or elementwise."""
    for block in outside_externs(sch, schedule_unit):
        loops = sch.get_loops(block)
        if is_bound(sch, loops):
            continue
        info = analyze(sch, block)
        if info.is_reduction:
            schedule_reduction(sch, info)
        else:
            elementwise.schedule(sch, loops)
    check_bound(sch)
    return sch.mod


def units(sch, block, threads: int = UNIT_THREADS) -> None:
    loops = sch.get_loops(block)
    if not loops:
        raise RuntimeError(f"sequential block {sch.get(block).name_hint!r} has no unit loop")
    bind_threads(sch, loops, threads)


def reduction(sch, info) -> None:
    ann = annotations(sch, info.block)
    if (str(ann.get("la.kind", "")) == "matmul" and len(info.spatial_loops) >= 2
            and len(info.reduce_loops) == 1):
        return _matmul(sch, info)
    block = info.block
    _, tx = bind_threads(sch, info.spatial_loops or [sch.add_unit_loop(block)], RED_THREADS)
    keep_in_registers(sch, block, tx, None)
    sch.decompose_reduction(block, info.reduce_loops[0])


def _matmul(sch, info) -> None:
    """C[b.., i, j(, pair)] = Σ_k: blockIdx.x = (batch.., i), blockIdx.y / threadIdx.x = the
    columns (pair included) in MM_THREADS-wide strips, the k loop serial in a register. No
    division in the k loop (a fused (b, i, j) index would need 64-bit divisions per load)."""
    block = info.block
    spatial, (k,) = info.spatial_loops, info.reduce_loops
    inner = 2 if len(spatial) >= 3 and const_extent(sch, spatial[-1]) == 2 else 1
    row = fuse(sch, spatial[: len(spatial) - 1 - inner])
    col = fuse(sch, spatial[len(spatial) - 1 - inner:])
    co, ci = sch.split(col, [None, MM_THREADS])
    sch.reorder(row, co, ci, k)
    sch.bind(row, "blockIdx.x")
    sch.bind(co, "blockIdx.y")
    sch.bind(ci, "threadIdx.x")
    keep_in_registers(sch, block, ci, None)
    sch.decompose_reduction(block, k)


def check_bound(sch) -> None:
    """Every block bound, the units inside te.extern wrappers included."""
    check_all_bound(sch, top_blocks(sch, open_externs=True))


RULE = ScheduleRule("units_and_matmuls", schedule, units_or_matmuls)
