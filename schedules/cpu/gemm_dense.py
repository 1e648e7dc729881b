"""CPU schedule of the dense family (te_defs/_dense.py): register-blocked contractions.

A contraction block (annotation ``dense.main``) has one M axis and one N axis, padded to their
grains ``gm`` / ``gn``; the micro-kernel tile is mb x nb: mb = 4 rows, nb the most lanes (a
power-of-two number of vectors) whose mb·nb accumulators, the nb-wide operand row and a broadcast
fit the target's vector registers (AVX-512: 64 float32 lanes in 16 of 32 zmm; AVX2: 16 lanes in 8
of 16 ymm), less when the grain is smaller. It becomes:

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
over partial results, elementwise stages) get the generic CPU rules. It fits a function with
``dense.main`` blocks (``fits.contraction``).
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import (analyze, annotations, by_role, as_int, const_extent, epilogue, is_scheduled,
                        top_blocks)
from ..fits import contraction
from ..loops import each_nest, keep_in_registers
from ..schedule_rule import ScheduleRule
from ._isa import VectorUnit, vector_unit
from ._parallel import parallel, spatial

__all__ = ["schedule", "micro_kernel", "RULE"]

MB = 4             # micro-kernel rows: one broadcast each per reduction step
MAX_NB = 64        # the widest tile: the padding grain of te_defs/_dense.grain


def micro_kernel(unit: VectorUnit, dtype: str) -> tuple[int, int]:
    """(mb, nb) of the register-blocked micro-kernel for a vector unit and accumulator dtype."""
    lanes = unit.lanes(dtype)
    vectors = 1
    while (vectors * 2 * lanes <= MAX_NB
           and MB * vectors * 2 + vectors * 2 + 1 <= unit.registers):
        vectors *= 2
    return MB, min(MAX_NB, vectors * lanes)


def schedule(sch, target):
    unit = vector_unit(target)
    for block, _ in by_role(sch, "dense.main"):
        _contraction(sch, block, unit)
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


def _contraction(sch, block, unit: VectorUnit) -> None:
    ann = annotations(sch, block)
    m_ax, n_ax = as_int(ann["dense.m"]), as_int(ann["dense.n"])
    gm, gn = as_int(ann["dense.gm"]), as_int(ann["dense.gn"])
    mb, nb = micro_kernel(unit, str(sch.get(block).writes[0].source.dtype))
    mb, nb = min(mb, gm), min(nb, gn)
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


RULE = ScheduleRule("gemm_dense", schedule, contraction)
