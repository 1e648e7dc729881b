"""CUDA rule ``red_rows``: the fused reduction kernels of the norm / softmax / loss grads.

The builders (te_defs/norm.py, softmax.py, loss.py) annotate their blocks with a role
(``rows.role``, ``te.compute(..., attrs=...)``):

* ``reduce``: a reduction whose result is consumed per *row* of an ``output`` block (a row's
  mean, sum, dot product, ...);
* ``scalar``: a per-row scalar (e.g. 1/√(var + ε)) computed once per row (per thread, in a
  register) instead of once per element;
* ``output``: a spatial output over the whole (viewed) tensor that reads ``reduce`` results;
* ``col_sum``: a column reduction that is an output of its own (scale/bias grads), possibly
  followed by its cast (``col_cast``, a spatial consumer of it);
* anything else spatial and internal is inlined into its consumers.

Each ``output`` block becomes one fused kernel together with the ``reduce`` blocks it reads (x is
streamed once per reduction, from L1/L2, and once for the output; no scratch buffer in global
memory):

* when the rows are the output block's leading loops (the reduced dims innermost in memory): one
  thread block per row; every reduction is a cross-thread (warp shuffle + shared staging)
  reduction into shared memory, and the output loop strides over the row with the block's
  threads;
* otherwise (a reduction along a middle axis, e.g. a softmax over axis 1 of (pre, n, post)): one
  thread per kept point (adjacent threads read adjacent addresses), each running its reductions
  serially into registers, then its outputs.

``col_sum`` blocks are column reductions without atomics: one thread per output column walking
the reduced rows (coalesced), the cast to half in the same thread. It fits a function with role
blocks (``fits.fused_rows``).
"""

from __future__ import annotations

from ..analysis import analyze, const_extent, is_bound, top_blocks
from ..fits import fused_rows
from ..loops import fuse, keep_in_registers, set_scopes
from ..red_rows_roles import (attach_followers, inline_internal, kept_loops, output_groups, role,
                              unpack_group)
from ..schedule_rule import ScheduleRule
from . import _elementwise, _reduction
from ._threads import bind_threads, check_all_bound

__all__ = ["schedule", "RULE"]

ROW_THREADS = 256
COL_THREADS = 256


def schedule(sch, target):
    inline_internal(sch)
    done = set()
    for group in output_groups(sch):
        done |= _fused_rows(sch, group)
    for block in top_blocks(sch):
        name = sch.get(block).name_hint
        if name in done:
            continue
        info = analyze(sch, block)
        if is_bound(sch, info.loops):
            continue
        if info.is_reduction:
            lone_reduction(sch, info)
        else:
            _elementwise.schedule(sch, info.loops)
    check_all_bound(sch)
    return sch.mod


# ------------------------------------------------------------------------------------------

def lone_reduction(sch, info) -> None:
    """A reduction on its own (its result in global memory): the generic row/column rule, which
    also takes its consumer along when that is its cast (``col_cast``) of the same shape; a
    column reduction over one loop (the scale/bias grads of the norms) goes two-stage."""
    consumers = sch.get_consumers(info.block)
    cast = consumers[0] if (len(consumers) == 1 and role(sch, consumers[0]) == "col_cast") else None
    if (not info.row and info.spatial_loops and len(info.reduce_loops) == 1
            and role(sch, info.block) == "col_sum"):
        two_stage_columns(sch, info, cast)
        return
    if cast is not None:
        _reduction.schedule(sch, info)
        return
    block, spatial, reduce = info.block, info.spatial_loops, info.reduce_loops
    if info.row or not spatial:
        if spatial:
            bind_blocks(sch, spatial)
        else:
            sch.bind(sch.add_unit_loop(block), "blockIdx.x")
        _, tx = sch.split(reduce[-1], [None, ROW_THREADS])
        sch.bind(tx, "threadIdx.x")
        return
    *outer, last = spatial
    bx, tx = sch.split(last, [None, COL_THREADS])
    sch.bind(tx, "threadIdx.x")
    if outer:
        sch.reorder(*outer, bx)
        bind_blocks(sch, outer + [bx])
    else:
        sch.bind(bx, "blockIdx.x")
    sch.decompose_reduction(block, reduce[0])


PARTS = 64      # row chunks of a two-stage column reduction


def two_stage_columns(sch, info, cast) -> None:
    """out[j] = Σ_i f(i, j), the j innermost in memory, without atomics: stage 1 sums PARTS
    chunks of rows into a (PARTS, columns) scratch buffer, one thread per (chunk, column):
    coalesced along the columns and PARTS× the parallelism of one thread per column; stage 2
    adds the PARTS partials per column (and casts, for half outputs)."""
    block = info.block
    (r,) = info.reduce_loops
    rp, _ = sch.split(r, [PARTS, None])
    rf = sch.rfactor(rp, factor_axis=0)
    # stage 1: loops (kept..., part, rest): part -> blockIdx.y, the kept ones over x/threads
    rinfo = analyze(sch, rf)
    kept = [lp for lp, k in zip(rinfo.loops, rinfo.loop_kinds) if k == "S"]
    part = kept.pop(next(i for i, lp in enumerate(kept) if const_extent(sch, lp) == PARTS))
    bx, tx = sch.split(fuse(sch, kept), [None, COL_THREADS])
    red = [lp for lp, k in zip(rinfo.loops, rinfo.loop_kinds) if k == "R"]
    sch.reorder(part, bx, tx, *red)
    sch.bind(part, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(rf, red[0])
    # stage 2: one thread per column sums the partials
    finfo = analyze(sch, block)
    _, ftx = bind_threads(sch, finfo.spatial_loops, COL_THREADS)
    if cast is not None:
        keep_in_registers(sch, block, ftx, cast)
    sch.decompose_reduction(block, finfo.reduce_loops[0])


def bind_blocks(sch, loops):
    """Bind kept loops to the grid without fusing them (a fused index of symbolic extents needs
    64-bit divisions, which CUDA implements as calls that use the stack): the innermost to
    blockIdx.x, the next to blockIdx.y, the rest fused onto blockIdx.z. Returns the innermost
    bound loop (to compute a row's reductions at)."""
    loops = list(loops)
    if len(loops) == 1:
        sch.bind(loops[0], "blockIdx.x")
        return loops[0]
    sch.bind(loops[-1], "blockIdx.x")
    sch.bind(loops[-2], "blockIdx.y")
    if len(loops) > 2:
        sch.bind(fuse(sch, loops[:-2]), "blockIdx.z")
    return loops[-1]


def _fused_rows(sch, group) -> set:
    ro, followers, rs_blocks, names = unpack_group(sch, group, _elementwise.schedule)
    if not rs_blocks:
        return names
    loops = list(sch.get_loops(ro))
    kept = kept_loops(sch, ro, rs_blocks)
    rest = [i for i in range(len(loops)) if i not in kept]
    if kept == list(range(len(kept))) and rest:
        # rows are leading: one thread block per row, cross-thread reductions
        # (only the innermost loop is split over the threads: fusing loops of symbolic extent
        # would put 64-bit divisions in every index)
        row = bind_blocks(sch, loops[: len(kept)])
        _, tx = sch.split(loops[-1], [None, ROW_THREADS])
        sch.bind(tx, "threadIdx.x")
        for rest_loops in attach_followers(sch, followers, row):
            _, ftx = sch.split(rest_loops[-1], [None, ROW_THREADS])
            sch.bind(ftx, "threadIdx.x")
        for rs in rs_blocks:
            sch.compute_at(rs, row, preserve_unit_loops=True)
            info = analyze(sch, rs)
            red = [lp for lp, k in zip(info.loops, info.loop_kinds) if k == "R"]
            if not red:       # a row scalar: per row, computed by every thread into a register
                set_scopes(sch, rs, "local")
                continue
            _, rtx = sch.split(red[-1], [None, ROW_THREADS])
            sch.bind(rtx, "threadIdx.x")
            set_scopes(sch, rs, "shared")
        return names
    # kept dims are not leading (or nothing is reduced): one thread per kept point
    order = [loops[i] for i in kept] + [loops[i] for i in rest]
    sch.reorder(*order)
    _, tx = bind_threads(sch, order[: len(kept)], COL_THREADS)
    attach_followers(sch, followers, tx)
    for rs in rs_blocks:
        sch.compute_at(rs, tx, preserve_unit_loops=True)
        set_scopes(sch, rs, "local")
    return names


RULE = ScheduleRule("red_rows", schedule, fused_rows)
