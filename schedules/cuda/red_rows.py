"""CUDA schedule of the fused reduction kernels of the norm / softmax / loss grads ("red_rows").

The builders (te_defs/norm.py, softmax.py, loss.py) name their blocks by role:

* ``rs_*``: a reduction whose result is consumed per *row* of an ``ro_*`` block (a row's mean,
  sum, dot product, ...);
* ``rv_*``: a per-row scalar (e.g. 1/√(var + ε)) computed once per row (per thread, in a
  register) instead of once per element;
* ``ro_*``: a spatial output over the whole (viewed) tensor that reads ``rs_*`` results;
* ``cs_*``: a column reduction that is an output of its own (scale/bias grads), possibly
  followed by a cast block (a spatial consumer of it);
* anything else spatial and internal is inlined into its consumers.

Each ``ro_*`` block becomes one fused kernel together with the ``rs_*`` blocks it reads (x is
streamed once per reduction, from L1/L2, and once for the output; no scratch buffer in global
memory):

* when the rows are the ``ro`` block's leading loops (the reduced dims innermost in memory): one
  thread block per row; every reduction is a cross-thread (warp shuffle + shared staging)
  reduction into shared memory, and the output loop strides over the row with the block's
  threads;
* otherwise (a reduction along a middle axis, e.g. a softmax over axis 1 of (pre, n, post)): one
  thread per kept point (adjacent threads read adjacent addresses), each running its reductions
  serially into registers, then its outputs.

``cs_*`` blocks are column reductions without atomics: one thread per output column walking
the reduced rows (coalesced), the cast to half in the same thread.
"""

from __future__ import annotations

from tvm import tirx

from ..analysis import analyze, top_blocks
from . import _reduction
from . import _elementwise

ROW_THREADS = 256
COL_THREADS = 256


def schedule(sch, target):
    _inline_internal(sch)
    done = set()
    for group in ro_groups(sch):
        done |= _fused_rows(sch, group)
    for block in top_blocks(sch):
        name = sch.get(block).name_hint
        if name in done:
            continue
        info = analyze(sch, block)
        if _bound(sch, info.loops):
            continue
        if info.is_reduction:
            lone_reduction(sch, info)
        else:
            _elementwise.schedule(sch, info.loops)
    for block in top_blocks(sch):
        if not _bound(sch, sch.get_loops(block)):
            raise RuntimeError(f"block {sch.get(block).name_hint!r} is not bound to CUDA threads")
    return sch.mod


# ------------------------------------------------------------------------------------------

def lone_reduction(sch, info) -> None:
    """A reduction on its own (its result in global memory): the generic row/column rule, which
    also takes its consumer along when that is a cast (``cc_*``) of the same shape; a column
    reduction over one loop (the scale/bias grads of the norms) goes two-stage."""
    consumers = sch.get_consumers(info.block)
    cast = consumers[0] if (len(consumers) == 1 and
                            sch.get(consumers[0]).name_hint.startswith("cc_")) else None
    if (not info.row and info.spatial_loops and len(info.reduce_loops) == 1
            and info.name.startswith("cs_")):
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
    part = kept.pop(next(i for i, lp in enumerate(kept) if _const_extent(sch, lp) == PARTS))
    inner = sch.fuse(*kept) if len(kept) > 1 else kept[0]
    bx, tx = sch.split(inner, [None, COL_THREADS])
    red = [lp for lp, k in zip(rinfo.loops, rinfo.loop_kinds) if k == "R"]
    sch.reorder(part, bx, tx, *red)
    sch.bind(part, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.decompose_reduction(rf, red[0])
    # stage 2: one thread per column sums the partials
    finfo = analyze(sch, block)
    sp = sch.fuse(*finfo.spatial_loops) if len(finfo.spatial_loops) > 1 else finfo.spatial_loops[0]
    fbx, ftx = sch.split(sp, [None, COL_THREADS])
    sch.bind(fbx, "blockIdx.x")
    sch.bind(ftx, "threadIdx.x")
    if cast is not None:
        sch.reverse_compute_at(cast, ftx)
        sch.set_scope(block, 0, "local")
    sch.decompose_reduction(block, finfo.reduce_loops[0])


def _const_extent(sch, loop):
    ext = sch.get(loop).extent
    return ext.value if hasattr(ext, "value") else None


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
        z = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
        sch.bind(z, "blockIdx.z")
    return loops[-1]


def _inline_internal(sch) -> None:
    """Inline spatial blocks that only feed other blocks (per-row scalars such as rstd)."""
    changed = True
    while changed:
        changed = False
        for block in top_blocks(sch):
            name = sch.get(block).name_hint
            if name.startswith(("ro_", "rs_", "rv_", "cs_", "cc_")):
                continue
            info = analyze(sch, block)
            if info.is_reduction or not sch.get_consumers(block):
                continue
            try:
                sch.compute_inline(block)
                changed = True
                break
            except Exception:  # noqa: BLE001 - not inlinable: scheduled on its own
                continue


def _bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)


def _producers_rs(sch, block):
    """The rs_* blocks ``block`` depends on, nearest first (transitively through rs blocks)."""
    order, seen = [], set()
    frontier = [block]
    while frontier:
        nxt = []
        for b in frontier:
            for p in sch.get_producers(b):
                name = sch.get(p).name_hint
                if name.startswith(("rs_", "rv_")) and name not in seen:
                    seen.add(name)
                    order.append(p)
                    nxt.append(p)
        frontier = nxt
    # compute_at needs every consumer placed first: sort so that consumers precede producers
    names = [sch.get(b).name_hint for b in order]
    deps = {n: {sch.get(p).name_hint for p in sch.get_producers(b)} for n, b in zip(names, order)}
    ordered = []
    remaining = dict(zip(names, order))
    while remaining:
        for n in list(remaining):
            # n may go once no other remaining block consumes it
            if not any(n in deps[m] for m in remaining if m != n):
                ordered.append(remaining.pop(n))
                break
        else:  # pragma: no cover - a cycle cannot happen in a PrimFunc
            ordered += list(remaining.values())
            break
    return ordered


def ro_groups(sch):
    """The ro_* blocks grouped by the rs_* blocks they read (a multi-output compute gives one
    block per output; they share their reductions, so they are scheduled together)."""
    groups = {}
    for block in top_blocks(sch):
        if sch.get(block).name_hint.startswith("ro_"):
            key = frozenset(sch.get(b).name_hint for b in _producers_rs(sch, block))
            groups.setdefault(key, []).append(block)
    return [names for names in groups.values()]


def attach_followers(sch, followers, loop):
    """Move the other outputs of a group under ``loop`` of the first; their remaining loops."""
    out = []
    for f in followers:
        sch.reverse_compute_at(f, loop, preserve_unit_loops=True)
        n_outer = len([lp for lp in sch.get_loops(f) if _is_ancestor_or_same(sch, lp, loop)])
        out.append(sch.get_loops(f)[n_outer:])
    return out


def _is_ancestor_or_same(sch, lp, loop):
    a, b = sch.get_sref(lp), sch.get_sref(loop)
    node = b
    while node is not None:
        if node.same_as(a):
            return True
        node = node.parent
    return False


def kept_loops(sch, ro, rs_blocks):
    """Indices of the ro block's loops that index the rs results (the 'row' loops)."""
    blk = sch.get(ro)
    rs_bufs = [w.source for b in rs_blocks for w in sch.get(b).writes]
    used = set()
    for region in blk.reads:
        if any(region.source.same_as(b) for b in rs_bufs):
            for r in region.region:
                used |= {v.name for v in tirx.analysis.undefined_vars(r.min)}
    from ..analysis import _bindings
    bindings = _bindings(sch, ro)
    loops = list(sch.get_loops(ro))
    kept = []
    for idx, lp in enumerate(loops):
        var = sch.get(lp).loop_var
        for iv, value in bindings:
            if iv.var.name in used and any(v.same_as(var) for v in tirx.analysis.undefined_vars(value)):
                kept.append(idx)
                break
    return kept


def _fused_rows(sch, group) -> set:
    ro, followers = group[0], group[1:]
    rs_blocks = _producers_rs(sch, ro)
    names = {sch.get(b).name_hint for b in rs_blocks} | {sch.get(b).name_hint for b in group}
    loops = list(sch.get_loops(ro))
    if not rs_blocks:
        _elementwise.schedule(sch, loops)
        for f in followers:
            _elementwise.schedule(sch, sch.get_loops(f))
        return names
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
            rloops = [lp for lp in sch.get_loops(rs)[1:]]
            info = analyze(sch, rs)
            red = [lp for lp, k in zip(info.loops, info.loop_kinds) if k == "R"]
            if not red:       # rv_*: a per-row scalar, computed by every thread into a register
                for w in range(len(sch.get(rs).writes)):
                    sch.set_scope(rs, w, "local")
                continue
            _, rtx = sch.split(red[-1], [None, ROW_THREADS])
            sch.bind(rtx, "threadIdx.x")
            for w in range(len(sch.get(rs).writes)):
                sch.set_scope(rs, w, "shared")
            del rloops
        return names
    # kept dims are not leading (or nothing is reduced): one thread per kept point
    order = [loops[i] for i in kept] + [loops[i] for i in rest]
    sch.reorder(*order)
    point = sch.fuse(*order[: len(kept)]) if len(kept) > 1 else order[0]
    bx, tx = sch.split(point, [None, COL_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    attach_followers(sch, followers, tx)
    for rs in rs_blocks:
        sch.compute_at(rs, tx, preserve_unit_loops=True)
        for w in range(len(sch.get(rs).writes)):
            sch.set_scope(rs, w, "local")
    return names
