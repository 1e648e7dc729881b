"""The block roles of the fused reduction kernels ("red_rows": the norm / softmax / loss grads)
and what both targets' schedules read from them: which row outputs share which row reductions,
and which of an output's loops are the rows. The builders name a block's role by its
``rows.role`` annotation (``fits.ROW_ROLE``; see schedules/cuda/red_rows.py): ``reduce`` a
per-row reduction, ``scalar`` a per-row scalar, ``output`` an output reading them, ``col_sum`` a
column reduction, ``col_cast`` its cast; other internal spatial blocks are inlined."""

from __future__ import annotations

from tvm import tirx

from .analysis import iter_bindings, analyze, annotations, top_blocks
from .fits import ROW_ROLE

__all__ = ["role", "inline_internal", "output_groups", "unpack_group", "attach_followers",
           "kept_loops"]


def role(sch, block) -> str | None:
    """A block's ``rows.role`` (None for a block without one)."""
    value = annotations(sch, block).get(ROW_ROLE)
    return None if value is None else str(value)


def unpack_group(sch, group, spatial):
    """(first output block, the group's other outputs, the row reductions and scalars they
    read, nearest first, the names of all of them). A group that reads no reduction is plain
    elementwise: each of its blocks gets ``spatial(sch, loops)`` here, and the list is empty."""
    ro, followers = group[0], group[1:]
    rs_blocks = _row_producers(sch, ro)
    names = {sch.get(b).name_hint for b in rs_blocks} | {sch.get(b).name_hint for b in group}
    if not rs_blocks:
        for b in group:
            spatial(sch, sch.get_loops(b))
    return ro, followers, rs_blocks, names


def inline_internal(sch) -> None:
    """Inline spatial blocks that only feed other blocks (per-row scalars such as rstd)."""
    changed = True
    while changed:
        changed = False
        for block in top_blocks(sch):
            if role(sch, block) is not None:
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


def _row_producers(sch, block):
    """The row reductions and scalars ``block`` depends on, nearest first (transitively through
    them)."""
    order, seen = [], set()
    frontier = [block]
    while frontier:
        nxt = []
        for b in frontier:
            for p in sch.get_producers(b):
                name = sch.get(p).name_hint
                if role(sch, p) in ("reduce", "scalar") and name not in seen:
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


def output_groups(sch):
    """The output blocks grouped by the row reductions they read (a multi-output compute gives
    one block per output; they share their reductions, so they are scheduled together)."""
    groups = {}
    for block in top_blocks(sch):
        if role(sch, block) == "output":
            key = frozenset(sch.get(b).name_hint for b in _row_producers(sch, block))
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
    """Indices of the output block's loops that index the row results (the 'row' loops)."""
    blk = sch.get(ro)
    rs_bufs = [w.source for b in rs_blocks for w in sch.get(b).writes]
    used = set()
    for region in blk.reads:
        if any(region.source.same_as(b) for b in rs_bufs):
            for r in region.region:
                used |= {v.name for v in tirx.analysis.undefined_vars(r.min)}
    bindings = iter_bindings(sch, ro)
    loops = list(sch.get_loops(ro))
    kept = []
    for idx, lp in enumerate(loops):
        var = sch.get(lp).loop_var
        for iv, value in bindings:
            if iv.var.name in used and any(v.same_as(var) for v in tirx.analysis.undefined_vars(value)):
                kept.append(idx)
                break
    return kept
