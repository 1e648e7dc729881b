"""CPU rule ``units_and_matmuls``: batched matrix algebra of sequential units and matrix
products (the linalg family, te_defs/linalg.py).

* sequential units (the spatial sblocks inside a ``te.extern``: a triangular solve per batch and
  right-hand-side column, an LU factorisation per matrix, ...): their loops are fused and run in
  parallel, each unit's sequential loops inside;
* matrix products (sblock attr ``la.kind`` = "matmul", loops batch.., i, j, (pair), k): the
  reduction moves between i and j — parallel over (batch.., i), then for k: for j: C[i, j] +=
  A[i, k]·B[k, j] with the j loop contiguous in C and B (LLVM vectorises it);
* other reductions (per-batch sums): the kept loops fused and parallel, the reduction inner;
* elementwise blocks: the generic CPU rule (parallel outer loops, contiguous inner loop).

It fits a function with te.extern units or matrix products (``fits.units_or_matmuls``).
"""

from __future__ import annotations

from ..analysis import analyze, annotations, const_extent
from ..fits import units_or_matmuls
from ..loops import outside_externs
from ..schedule_rule import ScheduleRule
from ._parallel import parallel, serial_reduction, spatial

__all__ = ["schedule", "units", "RULE"]


def schedule(sch, target=None):
    for block in outside_externs(sch, units):
        info = analyze(sch, block)
        if not info.is_reduction:
            spatial(sch, info.loops)
        elif str(annotations(sch, block).get("la.kind", "")) == "matmul":
            _matmul(sch, info)
        else:
            serial_reduction(sch, info)
    return sch.mod


def _matmul(sch, info) -> None:
    spatial_loops, (k,) = info.spatial_loops, info.reduce_loops
    # spatial: batch groups.., i, j (, pair)
    inner = 2 if len(spatial_loops) >= 3 and const_extent(sch, spatial_loops[-1]) == 2 else 1
    outer = spatial_loops[: len(spatial_loops) - 1 - inner]
    cols = spatial_loops[len(spatial_loops) - 1 - inner:]
    sch.reorder(*outer, k, *cols)
    parallel(sch, outer)
    sch.decompose_reduction(info.block, k)


def units(sch, block) -> None:
    """The independent units of a sequential sblock, in parallel."""
    loops = sch.get_loops(block)
    if loops:
        parallel(sch, loops)


RULE = ScheduleRule("units_and_matmuls", schedule, units_or_matmuls)
