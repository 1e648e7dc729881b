"""CPU rule ``red_rows``: the fused reduction kernels of the norm / softmax / loss grads (block
roles, the ``rows.role`` annotation, as in schedules/cuda/red_rows.py: ``reduce`` per-row
reductions read by an ``output``, ``col_sum`` column reductions, other internal spatial blocks
inlined).

* rows leading (reduced dims innermost in memory): the rows run in parallel; each row's
  reductions (and per-row scalars, ``scalar``) are computed right before its outputs (the row
  stays in cache);
* reduced axis in the middle (e.g. softmax over axis 1 of (pre, n, post)): parallel over
  ``pre``; per ``pre`` the reductions sweep the (n, post) slab row by row into a ``post``-long
  vector of partial results (contiguous, vectorisable), then the outputs;
* column reductions (``col_sum``): the generic CPU rule (parallel partial sums streaming whole
  rows, then a sum of the partials); other reductions parallel over their kept dims; spatial
  blocks: the generic rule.

It fits a function with role blocks (``fits.fused_rows``).
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import analyze, const_extent, top_blocks
from ..fits import fused_rows
from ..loops import each_nest, set_scopes
from ..red_rows_roles import (attach_followers, inline_internal, kept_loops, output_groups, role,
                              unpack_group)
from ..schedule_rule import ScheduleRule
from ._parallel import parallel, serial_reduction, spatial

__all__ = ["schedule", "RULE"]


def schedule(sch, target=None):
    inline_internal(sch)
    done = set()
    for group in output_groups(sch):
        done |= _fused_rows(sch, group)
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


def _fused_rows(sch, group) -> set:
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
    outer = parallel(sch, loops[:lead])
    attach_followers(sch, followers, outer)
    # each row's reductions run right before its outputs (the row is still in cache). (They
    # stay scalar loops: TVM 0.27's rfactor into vector partial sums drops the split's bound
    # predicate for a symbolic extent, i.e. reads out of bounds.)
    for rs in rs_blocks:                 # consumers first: each one is placed before its producers
        sch.compute_at(rs, outer, preserve_unit_loops=False)
    for rs in rs_blocks:
        info = analyze(sch, rs)
        inner = [(lp, k) for lp, k in zip(info.loops[1:], info.loop_kinds[1:])
                 if const_extent(sch, lp) != 1]
        red = [lp for lp, k in inner if k == "R"]
        spat = [lp for lp, k in inner if k == "S"]
        if red and spat:
            # the reduced loops go outside the kept ones: whole contiguous rows per step
            sch.reorder(*red, *spat)
        if red:
            sch.decompose_reduction(rs, red[0])
        set_scopes(sch, rs, "local")
    return names


RULE = ScheduleRule("red_rows", schedule, fused_rows)
