"""CPU schedule of the dense family (te_defs/_dense.py): register-blocked contractions.

A contraction block (annotation ``dense.main``) has one M axis and one N axis, padded to their
grains ``gm`` / ``gn``; the micro-kernel tile is mb x nb: mb = 6 rows where they fit, else 4
(``micro_kernel``), nb the most lanes (a power-of-two number of vectors) whose 4·nb
accumulators, the nb-wide operand row and a broadcast fit the target's vector registers (AVX-512:
6 x 64 float32 lanes in 24 of 32 zmm; AVX2: 6 x 16 lanes in 12 of 16 ymm), less when the grain is
smaller. It becomes:

    parallel for (outer axes..., N tile)            # order "nm" (or M tile for "mn")
        tile sources (``dense.src = tile``): the operand panel of this tile, packed
        for M tile:                                 # the other tile loop
            acc[mb][nb] = 0                         # registers
            for reduction axes...:
                for mi in mb (unrolled): for ni in nb (vectorised):
                    acc[mi][ni] += A(.., mi, k) * B(.., ni, k)
            epilogue: crop + cast acc into the output

so a micro-kernel step is mb broadcasts, nb/lanes vector loads and mb·nb/lanes FMAs on
accumulators that stay in registers (the tile's buffer laid out [.., M, N]). A reduction whose
outer loops run long before a long inner run (a filter grad's output positions) has its outer
loops swept around the M tile loop (``_swept_reduction``): each M tile then re-reads one
cache-resident run of the panel, not all of it, and its accumulators are reloaded per run from
the panel's own buffer (the epilogue after the sweep). Sources marked
``root`` are packed the way the micro-kernel streams them (``_pack_sources``: panel, reduced
dims, lanes) and copied in parallel, zero padding filled apart from an unguarded copy of the
in-bounds part; the epilogue's cropped stores are bounded by their loop (_cropped_stores.py).
A contraction whose rows share no operand (a depthwise data grad: each M row,
a channel, reads its own plane) runs one row of up to 64 lanes at a time instead
(``_row_contraction``). Every other block (reductions over partial results, elementwise
stages) gets the generic CPU rules. It fits a function with ``dense.main`` blocks
(``fits.contraction``), or a dense op's per-plane form (annotated te.extern blocks,
te_defs/_conv_planes.py), which it hands to ``gather_owners``.
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import (analyze, annotations, by_role, as_int, const_extent, epilogue, is_scheduled,
                        iter_bindings, top_blocks, uses)
from ..fits import contraction, per_plane_form
from ..loops import each_nest, keep_in_registers
from ..schedule_rule import ScheduleRule
from . import gather_owners
from ._isa import VectorUnit, vector_unit
from ._cropped_stores import bound_cropped_stores
from ._parallel import parallel, spatial

__all__ = ["schedule", "micro_kernel", "tile_rows", "RULE"]

ROWS = (4, 6)      # micro-kernel rows (one broadcast each per reduction step): 4, or 6 (below)
MAX_NB = 64        # the widest tile: the padding grain of te_defs/_dense.grain
MIN_CHAINS = 12    # accumulators a step wants: FMA latency (4) x FMA ports (2), and some slack
MIN_STEPS = 32     # a reduction loop this long (with those after it) is a run of its own
WALKED_VECTORS = 2  # a tile copy walking its input's rows for more vectors than this is blocked


def micro_kernel(unit: VectorUnit, dtype: str, *, power_of_two: bool = False) -> tuple[int, int]:
    """(mb, nb) of the register-blocked micro-kernel for a vector unit and accumulator dtype.

    nb: the lanes of the 4-row tile (``_lanes``). 6 rows of them where they fit the registers
    (AVX2 and SSE: 6 x 2 vectors in 16 registers; AVX-512 and NEON: 6 x 4 in 32): each
    accumulator is one chain of dependent FMAs, and per broadcast a row adds nb/lanes FMAs for
    no more vector loads. AVX2's 4-row tile has 8 chains, which keep two FMA ports of latency 4
    busy only while no load stalls (bmm_grad on x86-64-v3: 6 rows -10%). AVX-512's 4 x 4 zmm
    gained nothing from 6 rows on a Sapphire Rapids VM but 4-14% on bmm_grad and addmm_grad on
    a later Xeon VM (2 threads, in turns: stop 44); else 6 rows of fewer lanes where 4 rows hold
    fewer than MIN_CHAINS accumulators. A row count of 6 needs the M axis padded to a multiple
    of 6 (te_defs/_dense.row_tiles); ``power_of_two``: the 4-row tile, for a caller that only
    splits by powers of two."""
    nb = _lanes(unit, dtype, ROWS[0])
    if power_of_two:
        return ROWS[0], nb
    vectors = unit.vectors(nb, dtype)
    if (ROWS[1] + 1) * vectors + 1 <= unit.registers:
        return ROWS[1], nb
    if ROWS[0] * vectors < MIN_CHAINS:
        wide = _lanes(unit, dtype, ROWS[1])
        if ROWS[1] * unit.vectors(wide, dtype) > ROWS[0] * vectors:
            return ROWS[1], wide
    return ROWS[0], nb


def tile_rows(target):
    """The rows of the micro-kernel for an LLVM target, per accumulator dtype: what a contraction
    pads its M axis to (te_defs/_dense.row_tiles)."""
    unit = vector_unit(target)
    return lambda dtype: micro_kernel(unit, dtype)[0]


def _lanes(unit: VectorUnit, dtype: str, rows: int) -> int:
    """The most lanes (a power-of-two number of vectors, at most MAX_NB lanes) whose rows x lanes
    accumulators, one operand row and a broadcast fit the vector registers."""
    lanes = unit.lanes(dtype)
    vectors = 1
    while (vectors * 2 * lanes <= MAX_NB
           and rows * vectors * 2 + vectors * 2 + 1 <= unit.registers):
        vectors *= 2
    return min(MAX_NB, vectors * lanes)


def schedule(sch, target):
    if per_plane_form(sch):
        return gather_owners.schedule(sch, target)
    unit = vector_unit(target)
    epilogues = []
    for block, _ in by_role(sch, "dense.main"):
        epilogues.append(epilogue(sch, block))
        _contraction(sch, block, unit)
    for info in each_nest(sch, top_blocks(sch)):
        if is_scheduled(sch, info.loops):
            continue
        ann = annotations(sch, info.block)
        if info.is_reduction:
            generic._reduction(sch, info)
        elif "dense.src" in ann:
            _source(sch, info, as_int(ann.get("dense.par", len(info.loops) - 1)))
        else:
            spatial(sch, info.loops)
    return bound_cropped_stores(sch, [b for b in epilogues if b is not None], unit.lanes)


def _contraction(sch, block, unit: VectorUnit) -> None:
    ann = annotations(sch, block)
    m_ax, n_ax = as_int(ann["dense.m"]), as_int(ann["dense.n"])
    gm, gn = as_int(ann["dense.gm"]), as_int(ann["dense.gn"])
    dtype = str(sch.get(block).writes[0].source.dtype)
    mb, nb = micro_kernel(unit, dtype)
    if gm % mb:         # M not padded for this tile's rows (a short axis, a tuning trace's)
        mb, nb = micro_kernel(unit, dtype, power_of_two=True)
    mb, nb = min(mb, gm), min(nb, gn)
    order = str(ann.get("dense.order", "nm"))
    if not _rows_share_operand(sch, block, m_ax, n_ax):
        _row_contraction(sch, block, unit, m_ax, n_ax, gn)
        return
    _pack_sources(sch, block, m_ax, n_ax, mb, nb)
    info = analyze(sch, block)
    kept, reduce = info.spatial_loops, info.reduce_loops
    mo, mi = sch.split(kept[m_ax], [None, mb])
    no, ni = sch.split(kept[n_ax], [None, nb])
    outer = [lp for i, lp in enumerate(kept) if i not in (m_ax, n_ax)]
    first, second = (no, mo) if order == "nm" else (mo, no)
    swept, inner = _swept_reduction(sch, reduce)
    sch.reorder(*outer, first, *swept, second, *inner, mi, ni)
    if swept:
        # the panel's tiles accumulate in a buffer of this task across the swept loops (LLVM
        # holds a tile in registers over each inner run: no other access can alias a buffer of
        # its own); the epilogue, or a copy of the result, follows the last of them
        _tile_last(sch, block, m_ax, n_ax)
        tail = epilogue(sch, block)
        if tail is None:
            tail = sch.cache_write(block, 0, "global")
        sch.reverse_compute_at(tail, first)
    else:
        # the epilogue (crop + cast), or partial results reduced later, from registers
        keep_in_registers(sch, block, second, epilogue(sch, block))
        _tile_last(sch, block, m_ax, n_ax)
    producers = _tile_sources_at(sch, block, first)
    sch.unroll(mi)
    sch.vectorize(ni)
    parallel(sch, [*outer, first])
    _finish(sch, block, reduce, producers, unit)


def _swept_reduction(sch, reduce) -> tuple[list, list]:
    """(swept, inner): the reduction loops that go outside the M tile loop, and those inside.

    Each M tile of a panel streams the panel's vector operand over the whole reduction: from
    the cache while the panel fits, else once more from memory per M tile. A filter grad reduces
    over every output position: its panel is megabytes (a conv3d's 16·56·56 positions x 64
    lanes: 13 MB per kernel position), re-read by each of 16 M tiles. So the outer reduction
    loops are swept around the M tiles: an M tile reads one inner run of the panel (kilobytes,
    still in the cache for the next M tile) and stores and reloads its accumulators once per
    run. The inner run is the trailing loops up to the first long one (symbolic, or MIN_STEPS
    steps with those after it); a reduction without a long loop before its inner run (a GEMM's
    single loop, a data grad's channels x kernel window) stays whole, in registers."""
    inner = len(reduce)
    steps = 1
    while inner > 0:
        extent = const_extent(sch, reduce[inner - 1])
        inner -= 1
        if extent is None or steps * extent >= MIN_STEPS:
            break
        steps *= extent
    if inner == 0:
        return [], list(reduce)
    return list(reduce[:inner]), list(reduce[inner:])


def _rows_share_operand(sch, block, m_ax: int, n_ax: int) -> bool:
    """Do the M rows of a tile share a vector operand (a read along N that M does not index)?
    Not so in a depthwise convolution's data grad, where M is the channel: each row reads its
    own plane, and blocking rows only strides the loads across planes."""
    blk = sch.get(block)
    spatial = [iv.var for iv in blk.iter_vars if int(iv.iter_type) == 0]
    m_var, n_var = spatial[m_ax], spatial[n_ax]
    for region in blk.reads:
        index = [r.min for r in region.region]
        if any(uses(i, n_var) for i in index) and not any(uses(i, m_var) for i in index):
            return True
    return False


def row_tile(unit: VectorUnit, dtype: str) -> int:
    """Lanes of a one-row micro-kernel: the most vectors (a power of two, at most MAX_NB lanes)
    whose accumulators fit the registers beside one broadcast and one streamed operand."""
    lanes = unit.lanes(dtype)
    vectors = 1
    while vectors * 2 * lanes <= MAX_NB and vectors * 2 + 2 <= unit.registers:
        vectors *= 2
    return vectors * lanes


def _row_contraction(sch, block, unit: VectorUnit, m_ax: int, n_ax: int, gn: int) -> None:
    """A contraction whose rows share no operand: one row at a time, a wide run of N lanes in
    registers, every other axis (M included) in its own order, the leading ones in parallel, so
    that a worker walks one operand plane after another."""
    nb = min(row_tile(unit, str(sch.get(block).writes[0].source.dtype)), gn)
    _pack_sources(sch, block, m_ax, n_ax, 1, nb)
    info = analyze(sch, block)
    kept, reduce = info.spatial_loops, info.reduce_loops
    no, ni = sch.split(kept[n_ax], [None, nb])
    outer = [lp for i, lp in enumerate(kept) if i != n_ax]
    sch.reorder(*outer, no, *reduce, ni)
    keep_in_registers(sch, block, no, epilogue(sch, block))
    _tile_last(sch, block, m_ax, n_ax)
    producers = _tile_sources_at(sch, block, no)
    sch.vectorize(ni)
    parallel(sch, _constant_strides(sch, [*outer, no]))
    _finish(sch, block, reduce, producers, unit)


def _constant_strides(sch, loops) -> list:
    """The leading loops to fuse into the parallel loop: the first, and those after it while
    their extents are constants. The index of a fused loop over symbolic extents is taken apart
    by divisions, which LLVM cannot hoist out of the cropping epilogue's guarded stores (a
    divisor might be zero), so every stored element would pay for them."""
    lead = loops[:1]
    for lp in loops[1:]:
        if const_extent(sch, lp) is None:
            break
        lead.append(lp)
    return lead


def _pack_sources(sch, block, m_ax: int, n_ax: int, mb: int, nb: int) -> None:
    """Lay out each root source the contraction alone reads as the micro-kernel streams it.

    An operand read along the N axis (one of its indices the N iter var) has that dim split into
    panels of nb, an operand without the N axis (the broadcast one) its M dim into panels of mb:
    the panel index moves in front of the dims the reduction walks, the lane index last
    (``[kept dims..., panel, reduced dims..., lane]``). A micro-kernel then reads one contiguous
    stream per operand row instead of a lane-wide piece of every row of a wide matrix, and the
    copy that makes the source walks its input in blocks of lanes (a blocked transpose when the
    source is a channel-last copy of a channel-first tensor)."""
    from tvm import tirx
    from tvm.sym import Analyzer
    blk = sch.get(block)
    spatial = [iv.var for iv in blk.iter_vars if int(iv.iter_type) == 0]
    reduced = [iv.var for iv in blk.iter_vars if int(iv.iter_type) == 2]
    m_var, n_var = spatial[m_ax], spatial[n_ax]
    analyzer = Analyzer()
    for producer in sch.get_producers(block):
        ann = annotations(sch, producer)
        if str(ann.get("dense.src", "")) != "root" or "dense.par" in ann:
            continue
        if len(sch.get_consumers(producer)) != 1:
            continue
        buf = sch.get(producer).writes[0].source
        region = next((r for r in blk.reads if r.source.same_as(buf)), None)
        loops = sch.get_loops(producer)
        if region is None or len(loops) != len(buf.shape):
            continue
        index = [r.min for r in region.region]
        if any(not analyzer.can_prove_equal(r.extent, 1) for r in region.region):
            continue
        vector = any(uses(i, n_var) for i in index)
        want, lanes = (n_var, nb) if vector else (m_var, mb)
        tiled = [d for d, i in enumerate(index) if isinstance(i, tirx.Var) and i.same_as(want)]
        if len(tiled) != 1:
            continue
        (t,) = tiled
        if lanes == 1 or not analyzer.can_prove_equal(tirx.floormod(buf.shape[t], lanes), 0):
            continue
        walked = [d for d, i in enumerate(index) if d != t and any(uses(i, r) for r in reduced)]
        kept = [d for d in range(len(index)) if d != t and d not in walked]
        if not walked:
            continue

        sch.transform_layout(producer, ("write", 0),
                             _packing(len(index), t, lanes, kept, walked, index[t].ty),
                             assume_injective_transform=True)
        outer, inner = sch.split(loops[t], [None, lanes])
        sch.reorder(*(loops[d] for d in kept), outer, *(loops[d] for d in walked), inner)


def _finish(sch, block, reduce, sources, unit: VectorUnit) -> None:
    """The accumulator's zero-init split off the reduction; each tile source copy's innermost
    constant loop vectorised, or the copy transposed in blocks (``_transpose_in_blocks``)."""
    if reduce:
        sch.decompose_reduction(block, reduce[0])
    for src in sources:
        loops = sch.get_loops(src)[1:]
        if _transpose_in_blocks(sch, src, loops, unit):
            continue
        if loops and const_extent(sch, loops[-1]) is not None:
            sch.vectorize(loops[-1])


def _transpose_in_blocks(sch, src, loops, unit: VectorUnit) -> bool:
    """A tile source whose lanes (its innermost loop) walk its input across rows, e.g. x_grad's
    panel of y^T in bmm_grad, copied a block of lanes x lanes at a time: vector loads along the
    input's rows, each block's lanes unrolled (LLVM: vector loads and lane extracts). Copied
    lane by lane, each element was a load of its own, a row apart, with a zero-padding test
    (7 % of bmm_grad's time on AVX-512, scalar; 1.5 % blocked). Only a copy that walks more
    than WALKED_VECTORS vectors of rows: AVX2's 16-lane panel walks 16 rows, lane by lane 4 % of
    bmm_grad's time and blocked 4.9 % (LLVM extracts lanes rather than shuffle them in
    registers). The zero padding is filled apart (``decompose_padding``) and the row loop
    carries the loop-partition hint, which takes the row test off whole blocks. Not the block
    loop: partitioned around its unrolled lanes it stored out of bounds (TVM 0.27, x86-64-v3).
    Returns whether it did."""
    if len(loops) < 2:
        return False
    lanes = unit.lanes(str(sch.get(src).writes[0].source.dtype))
    row_loop = _loop_of_contiguous_read(sch, src, loops)
    extent = const_extent(sch, loops[-1])
    if row_loop is None or row_loop.same_as(loops[-1]) or not extent or extent % lanes:
        return False
    if extent <= WALKED_VECTORS * lanes:
        return False
    if sch.can_decompose_padding(src, loops[0]):
        fill = sch.get_loops(sch.decompose_padding(src, loops[0]))[-1]
        if const_extent(sch, fill) is not None:
            sch.vectorize(fill)
    at = next(i for i, lp in enumerate(loops) if lp.same_as(row_loop))
    between = list(loops[at + 1:])
    row_o, row_i = sch.split(row_loop, [None, lanes])
    lane_o, lane_i = sch.split(between[-1], [None, lanes])
    sch.reorder(row_o, *between[:-1], lane_o, lane_i, row_i)
    sch.unroll(lane_i)
    sch.vectorize(row_i)
    sch.annotate(row_o, "pragma_loop_partition_hint", 1)
    return True


def _loop_of_contiguous_read(sch, block, loops):
    """The loop among ``loops`` whose var indexes the last (contiguous) dim of the block's one
    read, or None."""
    blk = sch.get(block)
    if len(blk.reads) != 1:
        return None
    last = blk.reads[0].region[-1].min
    bound = [value for iv, value in iter_bindings(sch, block) if uses(last, iv.var)]
    for lp in loops:
        if any(uses(value, sch.get(lp).loop_var) for value in bound):
            return lp
    return None


def _tile_sources_at(sch, block, loop) -> list:
    """The per-tile source copies (``dense.src`` = tile), each computed inside ``loop`` one tile's
    worth at a time; returns them."""
    sources = [p for p in sch.get_producers(block)
               if str(annotations(sch, p).get("dense.src", "")) == "tile"]
    for src in sources:
        sch.compute_at(src, loop)
    return sources


def _tile_last(sch, block, m_ax: int, n_ax: int) -> None:
    """The register tile's buffer laid out [other dims..., M, N]: each of its mb rows one run of
    nb lanes (vector registers), not lanes strided by the dims after M or N."""
    from tvm import tirx
    blk = sch.get(block)
    spatial = [iv.var for iv in blk.iter_vars if int(iv.iter_type) == 0]
    index = [r.min for r in blk.writes[0].region]
    at = [next((d for d, i in enumerate(index) if isinstance(i, tirx.Var)
                and i.same_as(spatial[ax])), None) for ax in (m_ax, n_ax)]
    if None in at or at == [len(index) - 2, len(index) - 1]:
        return
    m_at, n_at = at
    rest = [d for d in range(len(index)) if d not in at]
    sch.transform_layout(block, ("write", 0),
                         tirx.IndexMap.from_func(lambda *i: [*(i[d] for d in rest), i[m_at], i[n_at]],
                                                 ndim=len(index), index_dtype=str(index[0].ty)),
                         assume_injective_transform=True)


def _packing(ndim: int, t: int, lanes: int, kept: list, walked: list, dtype: str):
    """The IndexMap ``[kept..., t // lanes, walked..., t % lanes]`` of an ndim-dim buffer."""
    from tvm import tirx

    def packed(*i):
        return [*(i[d] for d in kept), tirx.floordiv(i[t], lanes), *(i[d] for d in walked),
                tirx.floormod(i[t], lanes)]
    return tirx.IndexMap.from_func(packed, ndim=ndim, index_dtype=str(dtype))


def _source(sch, info, limit) -> None:
    """An operand copy: the leading loops run in parallel, fused up to ``limit`` of them and up
    to the first with a compound extent (TVM's index analysis of a fused loop over padded,
    compound extents hits an internal check), the rest stay serial, the innermost contiguous.
    A zero-padded copy is split, inside each parallel step, into zero fill and a copy of the
    in-bounds part without the bounds test (which keeps LLVM from vectorising the copy)."""
    loops = info.loops
    lead = []
    for lp in loops[: max(1, min(limit, len(loops) - 1))]:
        if lead and not _plain(sch.get(lp).extent):
            break
        lead.append(lp)
    rest = loops[len(lead):]
    fused = parallel(sch, lead)
    if rest and sch.can_decompose_padding(info.block, rest[0]):
        sch.decompose_padding(info.block, rest[0])
        _partition_at_crop(sch, info.block)
    del fused


def _partition_at_crop(sch, block) -> None:
    """Each serial loop of an in-bounds copy whose var its crop (the block predicate) tests
    marked for TVM's loop partitioning: the loop then runs its whole tiles without the test and
    a tail with it. Tested per element, each element was a scalar load, compare and branch
    (a packed operand's row groups: ~8 % of bmm_grad's time); untested, LLVM vectorises the
    copy."""
    from tvm import tirx
    loops = sch.get_loops(block)
    predicate = sch.get(loops[-1]).body.predicate
    for loop in loops:
        node = sch.get(loop)
        if node.kind == tirx.ForKind.SERIAL and uses(predicate, node.loop_var):
            sch.annotate(loop, "pragma_loop_partition_hint", 1)


def _plain(ext) -> bool:
    from tvm import tirx
    return isinstance(ext, (tirx.Var, tirx.IntImm))


RULE = ScheduleRule("gemm_dense", schedule, contraction)
