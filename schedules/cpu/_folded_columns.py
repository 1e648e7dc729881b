"""Column sums folded into the row loop of a CPU ``red_rows`` kernel (the norms' scale / bias
grads): a ``col_sum`` block that reduces over the rows of an ``output`` group, reading the same
data, is summed while each row is still in cache instead of in a pass of its own over the
whole tensor (which costs as much memory traffic as the row pass).

Two forms, by what the column sum reduces besides the rows:

* ``per_row``: it also reduces within a row (group/instance norm: scale_grad[g, c] sums over
  N and HW; the rows are (N, G)): ``rfactor`` over its row loop gives one partial per row and
  column (``[n, g, c]``, the row's size divided by what is reduced within it), computed in the
  row loop (vector lanes when the reduced loop is contiguous); the partials are then summed;
* ``chunks``: it reduces over the rows only (layer/RMS norm: scale_grad[j] sums over the
  rows): the row loop is split into ``PARTS`` chunks, and each chunk accumulates its rows into
  its own row of partial sums (``[part, j]``, streamed with the row); the partials are then
  summed.

The partial block's loops are merged (``sch.merge``) with the row loops, so that it runs in
the same parallel iteration as the row's reductions and outputs; several folds' partials share
their pass over the row's columns (``share_columns``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm_ffi import structural_equal

from ..analysis import analyze, iter_bindings, top_blocks
from ..loops import fuse
from ..red_rows_roles import role
from ._parallel import serial_reduction

__all__ = ["ColumnFold", "column_folds", "split_rows", "fold", "merge", "share_columns"]

PARTS = 16    # row chunks of a ``chunks`` fold (>= the cores of a typical host: one per worker)


@dataclass
class ColumnFold:
    block: object         # the col_sum SBlockRV
    kind: str             # "per_row" or "chunks"
    lead: list            # positions of its loops indexing the rows, in the row loops' order
    rest: list            # positions of its other loops, in the order of the data in memory
    reduced: int          # position of its loop reduced over the rows


def column_folds(sch, ro, lead: int) -> list:
    """The ``col_sum`` blocks that can be summed inside the row loop of output block ``ro``
    (whose ``lead`` outermost loops are the rows)."""
    ro_bind = iter_bindings(sch, ro)
    ro_loops = list(sch.get_loops(ro))[:lead]
    row_vars = []
    for lp in ro_loops:
        bound = [iv.var for iv, v in ro_bind if v.same_as(sch.get(lp).loop_var)]
        if len(bound) != 1:
            return []
        row_vars.append(bound[0])
    folds = []
    for block in top_blocks(sch):
        if role(sch, block) != "col_sum":
            continue
        fold_ = _column_fold(sch, ro, block, row_vars)
        if fold_ is not None:
            folds.append(fold_)
    return folds


def _column_fold(sch, ro, cs, row_vars):
    info = analyze(sch, cs)
    if sch.get(cs).init is None or len(sch.get(cs).writes) != 1 or sch.get_producers(cs):
        return None                       # (it reads only inputs: nothing the row loop makes)
    bind = iter_bindings(sch, cs)
    loops = []                       # (iter var, position, reduced?) of each of cs's loops
    for pos, lp in enumerate(info.loops):
        bound = [iv for iv, v in bind if v.same_as(sch.get(lp).loop_var)]
        if len(bound) != 1:
            return None
        loops.append((bound[0].var, pos, int(bound[0].iter_type) == 2))
    pairs = _shared_index(sch, ro, cs)        # (ro var, cs var) per index of a buffer both read
    if pairs is None or len(pairs) != len(loops) or len(bind) != len(loops):
        return None

    def entry(cs_var):
        return next((e for e in loops if e[0].same_as(cs_var)), None)

    lead = []
    for v in row_vars:
        match = [c for r, c in pairs if r.same_as(v)]
        if len(match) != 1:
            return None
        lead.append(entry(match[0]))
    rest = [entry(c) for _, c in pairs if not any(c.same_as(e[0]) for e in lead)]
    if any(e is None for e in lead + rest) or len(lead) + len(rest) != len(loops):
        return None
    lead_red = [e for e in lead if e[2]]
    if not lead_red:
        return None                       # its kept dims are the rows: nothing to fold
    if any(e[2] for e in rest):
        if len(lead_red) != 1:
            return None
        kind = "per_row"
    elif len(lead) == 1:
        kind = "chunks"
    else:
        return None
    return ColumnFold(cs, kind, [e[1] for e in lead], [e[1] for e in rest], lead_red[0][1])


def _shared_index(sch, ro, cs):
    """[(ro iter var, cs iter var)] position by position along a buffer that both blocks read
    element by element at bare iter vars (the largest such buffer), else None."""
    best = None
    for rc in sch.get(cs).reads:
        for rr in sch.get(ro).reads:
            if not rc.source.same_as(rr.source) or len(rc.region) != len(rr.region):
                continue
            pairs = []
            for a, b in zip(rr.region, rc.region):
                if not (isinstance(a.min, tirx.Var) and isinstance(b.min, tirx.Var)):
                    break
                pairs.append((a.min, b.min))
            else:
                if best is None or len(pairs) > len(best):
                    best = pairs
    return best


def split_rows(sch, loops) -> None:
    """The row loops fused and split into ``PARTS`` chunks (a ``chunks`` fold's partial sums:
    one row of them per chunk)."""
    sch.split(fuse(sch, loops), [PARTS, None])


def fold(sch, f: ColumnFold, lane_sums):
    """Column reduction ``f`` as per-row (or per-chunk) partial sums in a parallel loop nest of
    its own, shaped as the row loops of its output group, for ``merge`` to put into them
    (made parallel here, while its reductions still hold their inits: TVM checks a parallel
    loop's blocks when it is made parallel, and the update half of a split reduction fails
    that check). ``lane_sums(sch, block, reduced, loop)`` sums a per-row partial block alone
    under ``loop`` in vector lanes where its innermost loop reduces contiguous memory.
    -> the partial block."""
    if f.kind == "chunks":
        sch.split(sch.get_loops(f.block)[f.reduced], [PARTS, None])
        rf = sch.rfactor(sch.get_loops(f.block)[f.reduced], factor_axis=0)
        loops = sch.get_loops(rf)
        rest = [loops[i if i < f.reduced else i + 1] for i in f.rest]
        sch.reorder(loops[f.reduced], loops[f.reduced + 1], *rest)
        sch.parallel(loops[f.reduced])
    else:
        rf = sch.rfactor(sch.get_loops(f.block)[f.reduced], factor_axis=0)
        loops = sch.get_loops(rf)
        sch.reorder(*[loops[i] for i in f.lead], *[loops[i] for i in f.rest])
        lead = fuse(sch, [loops[i] for i in f.lead])
        sch.parallel(lead)
        info = analyze(sch, rf)
        reduced = [lp for lp, k in zip(info.loops[1:], info.loop_kinds[1:]) if k == "R"]
        if reduced and sch.get_sref(reduced[-1]).same_as(sch.get_sref(info.loops[-1])):
            lane_sums(sch, rf, reduced, lead)    # the innermost loop reduces contiguously
    sch.decompose_reduction(rf, analyze(sch, rf).reduce_loops[0])
    return rf


def merge(sch, f: ColumnFold, partial, ro) -> None:
    """``fold``'s partial sums merged into the row loops of output block ``ro`` (the chunk
    loop and the loop over its rows for a ``chunks`` fold; ``merge`` makes a serial loop,
    made parallel again in place: ``sch.parallel`` would refuse the split reductions), then
    the sum of the partials, parallel over the columns."""
    for depth in range(2 if f.kind == "chunks" else 1):
        merged = sch.merge(sch.get_loops(partial)[depth], sch.get_loops(ro)[depth])
        if depth == 0:
            _as_parallel(sch, merged)
    serial_reduction(sch, analyze(sch, f.block))     # the sum of the partials: small


def _as_parallel(sch, loop) -> None:
    old = sch.get(loop)
    sch.state.replace(sch.get_sref(loop), tirx.For(old.loop_var, old.min, old.extent,
                                                   tirx.ForKind.PARALLEL, old.body,
                                                   old.thread_binding, old.annotations))


def share_columns(sch, folds, partials) -> None:
    """The column loops of several partial sums merged, so that one pass over a row's columns
    accumulates them all: a ``chunks`` fold's loops over the columns (the row read once for
    them); a ``per_row`` fold's per-lane partials (``lane_sums``) their loops over the row's
    channels, so that each channel's run (group norm: HW values of y_grad and x) is read by the
    next partial from L1 (group_norm_grad at 2^24, bench, 2 threads: AVX2 10.8-11.2 -> 9.9 ms,
    AVX-512 about 3 %)."""
    if len(partials) < 2:
        return
    if all(f.kind == "chunks" for f in folds):
        sch.merge(*[sch.get_loops(b)[2] for b in partials])
        return
    if any(f.kind != "per_row" for f in folds):
        return
    loops = []
    for partial in partials:
        # the per-lane partial's init and update (the producers of another buffer than the
        # partial's own), both inside its loop over the channels
        own = sch.get(partial).writes[0].source
        lane = [p for p in sch.get_producers(partial)
                if not sch.get(p).writes[0].source.same_as(own) and len(sch.get_loops(p)) > 2]
        channel = {sch.get_sref(sch.get_loops(p)[1]) for p in lane}
        if len(channel) != 1:
            return                      # not summed in lanes: nothing to share
        loops.append(sch.get_loops(lane[0])[1])
    fors = [sch.get(lp) for lp in loops]
    if all(structural_equal(fors[0].extent, f.extent) and not f.annotations
           and f.kind == tirx.ForKind.SERIAL for f in fors):
        sch.merge(*loops)
