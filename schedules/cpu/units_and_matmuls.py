"""CPU rule ``units_and_matmuls``: batched matrix algebra of sequential units and matrix
products (the linalg family, te_defs/linalg.py).

* sequential units (the spatial sblocks inside a ``te.extern``: a triangular solve per batch and
  strip of right-hand-side columns, an LU factorisation per matrix, ...): their loops are fused
  and run in parallel, each unit's sequential loops inside (a kernel with CPU and CUDA forms of
  its units, the ``tvmgrad_on_cuda`` parameter, keeps the CPU ones);
* real matrix products (sblock attr ``la.kind`` = "matmul", loops batch.., i, j, k): the
  register-blocked micro-kernel of the dense rule (``gemm_dense.micro_kernel``: mb rows x nb
  lanes of accumulators, sized from the target's vector registers). Rows and columns are padded
  to mb and nb (``pad_einsum``: zero-padded operand copies, into which an elementwise producer
  only they read is inlined; the product cropped into its buffer from registers), so that the
  tile loops have constant extents whatever the matrices' sizes: parallel over the first batch
  loop, for each (row tile, column tile): for k: mb broadcasts of A, nb/lanes loads of B,
  mb·nb/lanes FMAs on registers;
* complex products (loops batch.., i, j, pair, k), products of float16/bfloat16 inputs and
  products pad_einsum cannot pad: the reduction moves between i and j — parallel over the
  batch, then for k: for j: C[i, j] += A[i, k]·B[k, j] with the j loop contiguous in C and B
  (LLVM vectorises it);
* other reductions (per-batch sums): the kept loops fused and parallel, the reduction inner;
* elementwise blocks: the generic CPU rule (parallel outer loops, contiguous inner loop).

It fits a function with te.extern units or matrix products (``fits.units_or_matmuls``).
"""

from __future__ import annotations

from ..analysis import analyze, annotations, const_extent, top_blocks
from ..fits import units_or_matmuls
from ..loops import keep_in_registers, outside_externs
from ..schedule_rule import ScheduleRule
from ._isa import vector_unit
from ._parallel import parallel, serial_reduction, spatial
from .annotated_loops import target_form

__all__ = ["schedule", "units", "RULE"]


def schedule(sch, target=None):
    sch = target_form(sch, 0)
    for block in outside_externs(sch, units):
        info = analyze(sch, block)
        if not info.is_reduction:
            spatial(sch, info.loops)
        elif str(annotations(sch, block).get("la.kind", "")) == "matmul":
            if target is None or not _blocked_matmul(sch, info, target):
                _matmul(sch, info)
        else:
            serial_reduction(sch, info)
    return sch.mod


def _blocked_matmul(sch, info, target) -> bool:
    """A real product C[b.., i, j] = Σ_k A·B as register tiles on padded rows and columns (the
    module docstring); False (nothing changed) where it is not one or cannot be padded."""
    from tvm.s_tir import ScheduleError
    from .gemm_dense import micro_kernel
    block, spatial_loops = info.block, info.spatial_loops
    if len(spatial_loops) < 3 or const_extent(sch, spatial_loops[-1]) == 2:
        return False
    dtype = str(sch.get(block).writes[0].source.dtype)
    if any(str(r.source.dtype) != dtype for r in sch.get(block).reads):
        return False    # a float16/bfloat16 operand: its zero padding does not compile (LLVM)
    # 4 rows: these are small matrices (8 rows would pad to 12 for a 6-row tile)
    mb, nb = micro_kernel(vector_unit(target), dtype, power_of_two=True)
    try:
        sch.pad_einsum(block, [1] * (len(spatial_loops) - 2) + [mb, nb, 1])
    except ScheduleError:
        return False
    pads = sch.get_producers(block)
    (crop,) = sch.get_consumers(block)
    *outer, i, j, k = sch.get_loops(block)
    io, ii = sch.split(i, [None, mb])
    jo, ji = sch.split(j, [None, nb])
    sch.reorder(*outer, io, jo, k, ii, ji)
    keep_in_registers(sch, block, jo, crop)
    sch.unroll(ii)
    sch.vectorize(ji)
    # parallel over the first batch loop alone, in the product and in its operand copies: an
    # index taken apart from a fused loop by divisions would stay in every guarded load and
    # store (LLVM does not hoist a division that a branch guards: its divisor might be 0)
    parallel(sch, outer[:1])
    sch.decompose_reduction(block, k)
    for pad in pads:
        _inline_producers(sch, pad)
        parallel(sch, sch.get_loops(pad)[:1])
    return True


def _inline_producers(sch, pad) -> None:
    """The elementwise producers that only a padded operand copy reads (a copy of an input's
    view, the middle matrix of a chain of products) computed inside the copy instead of into
    buffers of their own: one pass over the operand instead of two."""
    from tvm.s_tir import ScheduleError
    blocks = top_blocks(sch, open_externs=True)
    for producer in sch.get_producers(pad):
        if analyze(sch, producer).is_reduction:
            continue
        if any(r.source.scope() == "local" for r in sch.get(producer).reads):
            continue    # the crop of a product's tile out of its registers
        buf = sch.get(producer).writes[0].source
        readers = [b for b in blocks if any(r.source.same_as(buf) for r in sch.get(b).reads)]
        if len(readers) != 1:
            continue    # (a te.extern's units declare their reads; its wrapper does not)
        try:
            sch.compute_inline(producer)
        except ScheduleError:
            pass


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
