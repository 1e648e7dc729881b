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
from ..analysis import (analyze, annotations, by_role, as_int, const_extent, epilogue, is_scheduled,
                        top_blocks)
from ..loops import each_nest, keep_in_registers
from ._parallel import parallel, spatial

__all__ = ["schedule"]

MB, NB = 4, 64     # micro-kernel: 4 rows x 64 float32 lanes = 16 AVX-512 accumulators


def schedule(sch, target=None):
    for block, _ in by_role(sch, "dense.main"):
        _contraction(sch, block)
    for info in each_nest(sch, top_blocks(sch)):
        if is_scheduled(sch, info.loops):
            continue
        ann = annotations(sch, info.block)
        if info.is_reduction:
            generic._reduction(sch, info)
        elif "dense.src" in ann:
            _source(sch, info.loops, as_int(ann.get("dense.par", len(info.loops) - 1)))
        else:
            spatial(sch, info.loops)
    return sch.mod


def _contraction(sch, block) -> None:
    ann = annotations(sch, block)
    m_ax, n_ax = as_int(ann["dense.m"]), as_int(ann["dense.n"])
    gm, gn = as_int(ann["dense.gm"]), as_int(ann["dense.gn"])
    wide = str(sch.get(block).writes[0].source.dtype) == "float64"
    mb, nb = min(MB, gm), min(NB // 2 if wide else NB, gn)
    order = str(ann.get("dense.order", "nm"))
    info = analyze(sch, block)
    kept, reduce = info.spatial_loops, info.reduce_loops
    mo, mi = sch.split(kept[m_ax], [None, mb])
    no, ni = sch.split(kept[n_ax], [None, nb])
    outer = [lp for i, lp in enumerate(kept) if i not in (m_ax, n_ax)]
    first, second = (no, mo) if order == "nm" else (mo, no)
    sch.reorder(*outer, first, second, *reduce, mi, ni)
    # the epilogue (crop + cast), or partial results reduced later, from registers
    keep_in_registers(sch, block, second, epilogue(sch, block))
    producers = [p for p in sch.get_producers(block)
                 if str(annotations(sch, p).get("dense.src", "")) == "tile"]
    for src in producers:
        sch.compute_at(src, first)
    sch.unroll(mi)
    sch.vectorize(ni)
    parallel(sch, [*outer, first])
    if reduce:
        sch.decompose_reduction(block, reduce[0])
    for src in producers:
        inner = sch.get_loops(src)[1:]
        if inner and const_extent(sch, inner[-1]) is not None:
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
    parallel(sch, lead)


def _plain(ext) -> bool:
    from tvm import tirx
    return isinstance(ext, (tirx.Var, tirx.IntImm))
