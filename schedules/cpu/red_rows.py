"""LLVM (CPU) schedule of the fused reduction kernels of the norm / softmax / loss grads
("red_rows"; block roles as in schedules/cuda/red_rows.py: ``rs_*`` per-row reductions read by
an ``ro_*`` output, ``cs_*`` column reductions, other internal spatial blocks inlined).

* rows leading (reduced dims innermost in memory): the rows run in parallel; each row's
  reductions (and per-row scalars ``rv_*``) are computed right before its outputs (the row
  stays in cache);
* reduced axis in the middle (e.g. softmax over axis 1 of (pre, n, post)): parallel over
  ``pre``; per ``pre`` the reductions sweep the (n, post) slab row by row into a ``post``-long
  vector of partial results (contiguous, vectorisable), then the outputs;
* column reductions (``cs_*``): the generic CPU rule (parallel partial sums streaming whole
  rows, then a sum of the partials); other reductions parallel over their kept dims; spatial
  blocks: the generic rule.
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from ..cuda.red_rows import _inline_internal, _producers_rs, attach_followers, kept_loops, ro_groups
from .. import cpu as generic

def schedule(sch, target=None):
    _inline_internal(sch)
    done = set()
    for group in ro_groups(sch):
        done |= _fused_rows(sch, group)
    seen = []
    for block in top_blocks(sch):
        if sch.get(block).name_hint in done:
            continue
        info = analyze(sch, block)
        if not info.loops:
            continue
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen) or int(sch.get(info.loops[0]).kind) != 0:
            continue              # shares loops with a scheduled block, or already parallel
        if info.is_reduction:
            consumers = sch.get_consumers(block)
            cast_only = len(consumers) == 1 and sch.get(consumers[0]).name_hint.startswith("cc_")
            if info.name.startswith("cs_") or cast_only:
                generic._reduction(sch, info)    # column reductions: parallel partial sums
            else:
                _lone_reduction(sch, info)
        else:
            generic._spatial(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))
    return sch.mod


def _unit(sch, loop) -> bool:
    ext = sch.get(loop).extent
    return hasattr(ext, "value") and ext.value == 1


def _lone_reduction(sch, info) -> None:
    """A reduction whose result other blocks read from memory: parallel over its kept dims,
    reduced loops outside the innermost kept one when that is the contiguous one."""
    spatial, reduce = info.spatial_loops, info.reduce_loops
    if spatial:
        sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])
    sch.decompose_reduction(info.block, reduce[0])


def _fused_rows(sch, group) -> set:
    ro, followers = group[0], group[1:]
    rs_blocks = _producers_rs(sch, ro)
    names = {sch.get(b).name_hint for b in rs_blocks} | {sch.get(b).name_hint for b in group}
    loops = list(sch.get_loops(ro))
    if not rs_blocks:
        generic._spatial(sch, loops)
        for f in followers:
            generic._spatial(sch, sch.get_loops(f))
        return names
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
                _lone_reduction(sch, info)
            else:
                generic._spatial(sch, info.loops)
        for b in group:
            generic._spatial(sch, sch.get_loops(b))
        return names
    outer = sch.fuse(*loops[:lead]) if lead > 1 else loops[0]
    sch.parallel(outer)
    row_like = lead == len(kept)
    attach_followers(sch, followers, outer)
    # each row's reductions run right before its outputs (the row is still in cache). (They
    # stay scalar loops: TVM 0.27's rfactor into vector partial sums drops the split's bound
    # predicate for a symbolic extent, i.e. reads out of bounds.)
    for rs in rs_blocks:                 # consumers first: each one is placed before its producers
        sch.compute_at(rs, outer, preserve_unit_loops=False)
    for rs in rs_blocks:
        info = analyze(sch, rs)
        inner = [(lp, k) for lp, k in zip(info.loops[1:], info.loop_kinds[1:])
                 if not _unit(sch, lp)]
        red = [lp for lp, k in inner if k == "R"]
        spat = [lp for lp, k in inner if k == "S"]
        if red and spat:
            # the reduced loops go outside the kept ones: whole contiguous rows per step
            sch.reorder(*red, *spat)
        if red:
            sch.decompose_reduction(rs, red[0])
        for w in range(len(sch.get(rs).writes)):
            sch.set_scope(rs, w, "local")
    return names
