"""CPU rule ``red_rows``: the fused reduction kernels of the norm / softmax / loss grads (block
roles, the ``rows.role`` annotation, as in schedules/cuda/red_rows.py: ``reduce`` per-row
reductions read by an ``output``, ``col_sum`` column reductions, other internal spatial blocks
inlined).

* rows leading (reduced dims innermost in memory): the rows run in parallel; each row's
  reductions (and per-row scalars, ``scalar``) are computed right before its outputs (the row
  stays in cache), each in vector lanes (``_lane_sums``: a serial sum of a row is bound by the
  add latency, ~2 GB/s), and its outputs in vector lanes too (``_lane_outputs``);
* reduced axis in the middle (e.g. softmax over axis 1 of (pre, n, post)): parallel over
  ``pre``; per ``pre`` the reductions sweep the (n, post) slab row by row into a ``post``-long
  vector of partial results (contiguous, vectorisable), then the outputs;
* column reductions (``col_sum``) over the rows of such a group, reading its data (the norms'
  scale/bias grads): summed in the same row loop, while the row is in cache (_folded_columns.py:
  partial sums per row or per chunk of rows, then their sum); other column reductions: the
  generic CPU rule (parallel partial sums streaming whole rows, then a sum of the partials);
  other reductions parallel over their kept dims; spatial blocks: the generic rule.

It fits a function with role blocks (``fits.fused_rows``).
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import analyze, called_ops, const_extent, top_blocks
from ..fits import fused_rows
from ..loops import each_nest, fuse, set_scopes
from ..red_rows_roles import (attach_followers, inline_internal, kept_loops, output_groups, role,
                              unpack_group)
from ..schedule_rule import ScheduleRule
from ._folded_columns import column_folds, fold, merge, share_columns, split_rows
from ._isa import vector_unit
from ._parallel import serial_reduction, spatial

__all__ = ["schedule", "RULE"]

# The scope of a row's reductions and lane partials, allocated inside the parallel row loop:
# "global", which TVM's LowerTVMBuiltin keeps as a stack array (LLVM then holds it in
# registers); it turns a "local" one into a TVMBackendAllocWorkspace / FreeWorkspace pair, i.e.
# two runtime calls per buffer per row.
ROW_SCOPE = "global"
# Intrinsics that the LLVM path expands into a polynomial (tvmgrad/fastmath.py), and the vectors
# an output step runs of a body with one on a narrow vector unit (``_lane_outputs``).
POLYNOMIAL_CALLS = {"tirx.exp", "tirx.erf"}
POLYNOMIAL_CHAINS = 4


def schedule(sch, target=None):
    inline_internal(sch)
    done = set()
    for group in output_groups(sch):
        done |= _fused_rows(sch, group, target)
    blocks = [b for b in top_blocks(sch) if sch.get(b).name_hint not in done]
    for info in each_nest(sch, blocks):
        if int(sch.get(info.loops[0]).kind) != 0:
            continue                    # already parallel (shares loops with a scheduled block)
        if info.is_reduction:
            consumers = sch.get_consumers(info.block)
            cast_only = len(consumers) == 1 and role(sch, consumers[0]) == "col_cast"
            if role(sch, info.block) == "col_sum" or cast_only:
                generic._reduction(sch, info)    # column reductions: parallel partial sums
            else:
                serial_reduction(sch, info)      # its result read from memory by other blocks
        else:
            spatial(sch, info.loops)
    return sch.mod


def _fused_rows(sch, group, target) -> set:
    ro, followers, rs_blocks, names = unpack_group(sch, group, spatial)
    if not rs_blocks:
        return names
    loops = list(sch.get_loops(ro))
    kept = kept_loops(sch, ro, rs_blocks)
    lead = 0
    while lead < len(kept) and kept[lead] == lead:
        lead += 1
    if lead == 0:
        # the rows are not outer loops (a reduction over the leading dims, e.g. renorm's slices
        # along axis 1): the reductions run on their own into a small buffer first
        for rs in rs_blocks:
            info = analyze(sch, rs)
            if info.is_reduction:
                serial_reduction(sch, info)
            else:
                spatial(sch, info.loops)
        for b in group:
            spatial(sch, sch.get_loops(b))
        return names
    folds = column_folds(sch, ro, lead) if target is not None else []
    chunks = any(f.kind == "chunks" for f in folds)
    if chunks:
        folds = [f for f in folds if f.kind == "chunks"]
        split_rows(sch, loops[:lead])
    else:
        fuse(sch, loops[:lead])
    sch.parallel(sch.get_loops(ro)[0])
    depth = 2 if chunks else 1          # the loops over the rows (chunks, then rows in one)
    outer = sch.get_loops(ro)[depth - 1]
    partials = [fold(sch, f, lambda s, b, red, lp: _lane_sums(s, b, red, lp, target))
                for f in folds]
    attach_followers(sch, followers, outer)
    if target is not None:
        rs_blocks = _one_reduction(sch, rs_blocks)
    acc = str(sch.get(rs_blocks[0]).writes[0].source.dtype)
    # each row's reductions run right before its outputs (the row is still in cache); consumers
    # first, each placed before its producers, and each scheduled as soon as it is placed (while
    # it is the row loop's first child, as rfactor requires)
    for rs in rs_blocks:
        sch.compute_at(rs, outer, preserve_unit_loops=False)
        info = analyze(sch, rs)
        inner = [(lp, k) for lp, k in zip(info.loops[depth:], info.loop_kinds[depth:])
                 if const_extent(sch, lp) != 1]
        red = [lp for lp, k in inner if k == "R"]
        spat = [lp for lp, k in inner if k == "S"]
        if red and spat:
            # the reduced loops go outside the kept ones: whole contiguous rows per step
            sch.reorder(*red, *spat)
        elif red and target is not None and len(rs_blocks) == 1:
            moved = _lane_sums(sch, rs, red, outer, target, depth)
            if moved is not None:
                outer = moved
                red = analyze(sch, rs).reduce_loops   # now the loop over the lanes
        if red:
            sch.decompose_reduction(rs, red[0])
        set_scopes(sch, rs, ROW_SCOPE)
    for f, partial in zip(folds, partials):
        merge(sch, f, partial, ro)
    share_columns(sch, folds, partials)
    if target is not None:
        for block in [ro, *followers]:
            _lane_outputs(sch, block, depth, acc, target)
    return names


def _one_reduction(sch, rs_blocks) -> list:
    """A row's blocks with its per-row scalars inlined where that leaves it one reduction (what
    ``_lane_sums`` needs: its partial block lands in a loop of its own, and the blocks after it
    can follow it there only if none reads a block still outside). LLVM hoists a scalar so
    inlined out of the loop over the row."""
    reductions = [b for b in rs_blocks if role(sch, b) == "reduce"]
    scalars = [b for b in rs_blocks if role(sch, b) != "reduce"]
    # a scalar of reduced values stays a block: computed once per row
    if len(reductions) != 1 or not scalars or any(sch.get_producers(b) for b in scalars):
        return rs_blocks
    for block in scalars:
        sch.compute_inline(block)
    return reductions


def _lane_sums(sch, rs, red, outer, target, depth=1):
    """A row reduction whose innermost reduced loop walks contiguous memory summed in vector
    lanes: that loop split by ``2 x`` the accumulator's lanes (two independent vector chains) and
    factored out (``rfactor``) into a per-lane partial block, vectorised over the lanes, which
    the reduction then sums. -> the row loop the row's blocks now share (None: not applied).

    rfactor puts the partial block in a copy of ``outer`` (the parallel row loop) ahead of it;
    the blocks already in ``outer`` are moved after it into that copy (``reverse_compute_at``)
    rather than the partial block into ``outer``: a block moved by ``compute_at`` loses the
    split's bound predicate (TVM 0.27), i.e. reads past the row. It runs right after ``rs`` is
    placed, while it is ``outer``'s first child (as rfactor requires). The loop-partition hint
    splits the vector steps that never meet that predicate from the tail that does, so the
    main loop is branch-free vector code (without it the predicate stays in the loop: no faster
    than the serial sum)."""
    acc = str(sch.get(rs).writes[0].source.dtype)
    lanes = 2 * vector_unit(target).lanes(acc)
    extent = const_extent(sch, red[-1])
    if extent is not None and extent < 2 * lanes:
        return None                   # a short row: the serial sum is as fast
    _, lane = sch.split(red[-1], [None, lanes])
    partial = sch.rfactor(lane, len(sch.get(rs).writes[0].region))
    loops = sch.get_loops(partial)     # [rows, the reduced loops, the vector steps, the lanes]
    row = loops[depth - 1]
    for block in sch.get_child_blocks(outer):
        sch.reverse_compute_at(block, row, preserve_unit_loops=True)
    sch.vectorize(loops[-1])
    sch.annotate(loops[-2], "pragma_loop_partition_hint", 1)
    sch.decompose_reduction(partial, loops[-1 - len(red)])
    sch.set_scope(partial, 0, ROW_SCOPE)
    return row


def _lane_outputs(sch, block, depth, acc, target) -> None:
    """An output's innermost loop (contiguous in memory) split by the vector lanes of ``acc``
    (the type its arithmetic runs in) and vectorised, with the loop-partition hint that keeps
    the main loop branch-free (as in ``_lane_sums``), rather than left to LLVM's
    auto-vectoriser (which, with the exp polynomial in the body, reloaded its pointers from the
    stack every step).

    A body that runs a polynomial (exp, erf: ~20 dependent operations per vector) on a vector
    unit of 256 bits or less steps ``POLYNOMIAL_CHAINS`` vectors at a time: independent chains
    that the core overlaps, where one chain per step leaves the row compute-bound (AVX2
    log_softmax_grad 4096^2: 8.4-8.6 -> 7.5-8.1 ms). A 512-bit unit already keeps such a row at
    memory speed, and wider steps measured 10-20 % slower there."""
    loops = sch.get_loops(block)
    unit = vector_unit(target)
    lanes = unit.lanes(acc)
    extent = const_extent(sch, loops[-1])
    if len(loops) <= depth or (extent is not None and extent < lanes):
        return                        # no loop within the row, or a row shorter than a vector
    wide = lanes * POLYNOMIAL_CHAINS
    if (unit.bits <= 256 and acc == "float32" and called_ops(sch, block) & POLYNOMIAL_CALLS
            and (extent is None or extent >= wide)):
        lanes = wide
    steps, lane = sch.split(loops[-1], [None, lanes])
    sch.vectorize(lane)
    sch.annotate(steps, "pragma_loop_partition_hint", 1)


RULE = ScheduleRule("red_rows", schedule, fused_rows)
