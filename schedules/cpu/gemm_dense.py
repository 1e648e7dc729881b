"""CPU schedule of the dense family (te_defs/matmul.py): register-blocked contractions.

A contraction block (annotation ``dense.main``) has one M axis and one N axis, padded to their
grains ``gm`` / ``gn``; the micro-kernel tile is mb x nb (mb = 4 rows, nb = 64 float32 / 32
float64 lanes, less when the grain is smaller). It becomes:

    parallel for (outer axes..., N tile)            # order "nm" (or M tile for "mn")
        tile sources (``dense.src = tile``): the operand panel of this tile, packed
        for M tile:                                 # the other tile loop
            acc[mb][nb] = 0                         # registers
            for reduction axes...:
                for mi in mb (unrolled): for ni in nb (vectorised):
                    acc[mi][ni] += A(.., mi, k) * B(.., ni, k)
            epilogue: crop + cast acc into the output

so a micro-kernel step is mb broadcasts, nb/lanes vector loads and mb·nb/lanes FMAs on
accumulators that stay in registers. Sources marked ``root`` and every other block (reductions
over partial results, elementwise stages) get the generic CPU rules.
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import analyze, top_blocks

__all__ = ["schedule"]

MB, NB = 4, 64     # micro-kernel: 4 rows x 64 float32 lanes = 16 AVX-512 accumulators


def _ann(sch, block) -> dict:
    return {str(k): v for k, v in sch.get(block).annotations.items()}


def _int(v) -> int:
    return int(v.value) if hasattr(v, "value") else int(v)


def schedule(sch, target=None):
    mains = [b for b in top_blocks(sch) if "dense.main" in _ann(sch, b)]
    for block in mains:
        _contraction(sch, block)
    seen = []
    for block in top_blocks(sch):
        info = analyze(sch, block)
        if not info.loops:
            continue
        outer = sch.get_sref(info.loops[0])
        if any(outer.same_as(s) for s in seen):
            continue
        if _scheduled(sch, info.loops):
            seen.append(outer)
            continue
        ann = _ann(sch, block)
        if info.is_reduction:
            generic._reduction(sch, info)
        elif "dense.src" in ann:
            _source(sch, info.loops, _int(ann.get("dense.par", len(info.loops) - 1)))
        else:
            generic._spatial(sch, info.loops)
        seen.append(sch.get_sref(sch.get_loops(block)[0]))
    return sch.mod


def _contraction(sch, block) -> None:
    ann = _ann(sch, block)
    m_ax, n_ax = _int(ann["dense.m"]), _int(ann["dense.n"])
    gm, gn = _int(ann["dense.gm"]), _int(ann["dense.gn"])
    wide = str(sch.get(block).writes[0].source.dtype) == "float64"
    mb, nb = min(MB, gm), min(NB // 2 if wide else NB, gn)
    order = str(ann.get("dense.order", "nm"))
    info = analyze(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    mo, mi = sch.split(spatial[m_ax], [None, mb])
    no, ni = sch.split(spatial[n_ax], [None, nb])
    outer = [lp for i, lp in enumerate(spatial) if i not in (m_ax, n_ax)]
    first, second = (no, mo) if order == "nm" else (mo, no)
    sch.reorder(*outer, first, second, *reduce, mi, ni)
    consumers = sch.get_consumers(block)
    if len(consumers) == 1 and not analyze(sch, consumers[0]).is_reduction:
        sch.reverse_compute_at(consumers[0], second)      # the epilogue: crop + cast
        sch.set_scope(block, 0, "local")
    else:                                                  # partial results, reduced later
        sch.reverse_compute_at(sch.cache_write(block, 0, "local"), second)
    producers = [p for p in sch.get_producers(block)
                 if str(_ann(sch, p).get("dense.src", "")) == "tile"]
    for src in producers:
        sch.compute_at(src, first)
    sch.unroll(mi)
    sch.vectorize(ni)
    par = sch.fuse(*outer, first) if outer else first
    sch.parallel(par)
    if reduce:
        sch.decompose_reduction(block, reduce[0])
    for src in producers:
        inner = sch.get_loops(src)[1:]
        if inner and _const_extent(sch, inner[-1]):
            sch.vectorize(inner[-1])


def _source(sch, loops, limit) -> None:
    """An operand copy: the leading loops run in parallel, fused up to ``limit`` of them and up
    to the first with a compound extent (TVM's index analysis of a fused loop over padded,
    compound extents hits an internal check), the rest stay serial, the innermost contiguous."""
    lead = []
    for lp in loops[: max(1, min(limit, len(loops) - 1))]:
        if lead and not _plain(sch.get(lp).extent):
            break
        lead.append(lp)
    sch.parallel(sch.fuse(*lead) if len(lead) > 1 else lead[0])


def _plain(ext) -> bool:
    from tvm import tirx
    return isinstance(ext, (tirx.Var, tirx.IntImm))


def _const_extent(sch, loop) -> bool:
    return hasattr(sch.get(loop).extent, "value")


def _scheduled(sch, loops) -> bool:
    """Has a loop nest been scheduled already (parallel/vectorised/unrolled/bound)?"""
    return any(int(sch.get(lp).kind) != 0 for lp in loops)
