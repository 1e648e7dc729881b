"""CUDA schedule of the dense family (te_defs/_dense.py): shared-memory tiled contractions.

A contraction block (annotation ``dense.main``: one M axis, one N axis, padded to their grains
``gm`` / ``gn``) becomes one thread block per (outer index, BM x BN tile) with BM = gm, BN = gn
(at most 64; 32 for float64 and long kernel windows), TY x TX = min(16, BM) x min(16, BN)
threads, each accumulating a TM x TN register tile (4 x 4 for 64 x 64 tiles):

    blockIdx.x/y/z = outer axes, M tile, N tile (halo rows on their own grid dims)
    threadIdx.y / threadIdx.x: rows m = ... + ty·TM + tm, columns n = ... + tx·TN + tn
    for outer reduction axes:              # serial
        for ko in K / BK:                  # the staged reduction axis, in BK steps
            every operand's tile for this step -> shared memory (all threads, coalesced)
            for the window axes (a conv's kernel window), ki in BK:
                acc[tm][tn] += A_shared · B_shared
    epilogue: crop + cast acc[tm][tn] into the output

The staged axis is the last reduction axis of non-constant extent (channels, or a spatial axis
for a filter grad); BK shrinks with the window staged with it so that the tiles fit in shared
memory. Operand copies (sources) and every other block get the generic
rules: one thread per element, or the row/column reduction rules. It fits a function with
``dense.main`` blocks (``fits.contraction``), or a dense op's per-plane form (annotated
te.extern blocks, te_defs/_conv_planes.py), which it hands to ``gather_owners``.
"""

from __future__ import annotations

import math

from .. import cuda as generic
from ..analysis import (analyze, annotations, by_role, as_int, const_extent, epilogue,
                        indexed_by, is_bound, top_blocks)
from ..fits import contraction, per_plane_form
from ..loops import each_nest, fuse, keep_in_registers
from ..schedule_rule import ScheduleRule
from . import gather_owners
from ._threads import check_all_bound

__all__ = ["schedule", "RULE"]

# register tile per thread: TM x TN = (gm / TY) x (gn / TX), TY = min(16, gm), TX = min(16, gn)
STAGE = 4096             # elements of one operand's shared tile per reduction step (at most)


def schedule(sch, target):
    if per_plane_form(sch):
        return gather_owners.schedule(sch, target)
    for block, _ in by_role(sch, "dense.main"):
        _contraction(sch, block)
    for info in each_nest(sch, top_blocks(sch), loopless=generic.NO_LOOP):
        if not is_bound(sch, info.loops):
            generic.generic_rule(sch, info)
    check_all_bound(sch)
    return sch.mod


def _contraction(sch, block) -> None:
    ann = annotations(sch, block)
    m_ax, n_ax = as_int(ann["dense.m"]), as_int(ann["dense.n"])
    if _tensor_core_ok(sch, block, ann):
        _wmma(sch, block, ann)
        return
    info = analyze(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    # block tile BM x BN: the grains (64 at most), halved for float64 and for long kernel
    # windows (their unrolled taps cost registers); 16 x 16 threads at most
    wide = str(sch.get(block).writes[0].source.dtype) == "float64"
    taps = math.prod(const_extent(sch, lp) or 1 for lp in reduce)
    cap = 32 if wide or taps >= 18 else 64
    BM, BN = min(cap, as_int(ann["dense.gm"])), min(cap, as_int(ann["dense.gn"]))
    TY, TX = min(16, BM), min(16, BN)
    TM, TN = BM // TY, BN // TX
    m_o, ty, tm = sch.split(spatial[m_ax], [None, TY, TM])
    n_o, tx, tn = sch.split(spatial[n_ax], [None, TX, TN])
    outer = [lp for i, lp in enumerate(spatial) if i not in (m_ax, n_ax)]
    rest = []
    if reduce:
        # stage along the last reduction axis of non-constant extent (a channel or spatial
        # axis); the axes after it are a constant window staged whole, the ones before it
        # serial loops around the stages
        exts = [const_extent(sch, lp) for lp in reduce]
        var = [i for i, e in enumerate(exts) if e is None]
        at = var[-1] if var else 0
        window = math.prod(e or 1 for e in exts[at + 1:])
        bk = as_int(ann.get("dense.gk", 16))
        while bk > 1 and bk * window * max(BM, BN) > STAGE:
            bk //= 2
        ko, ki = sch.split(reduce[at], [None, bk])
        rest = [*reduce[:at], ko, *reduce[at + 1:], ki]
        stage_at = ko
    # grid (TVM bounds a staged halo only along a plain block index or the innermost of a
    # fused one, and shared memory must have a constant size): the outer axes whose rows carry
    # a halo (a conv's leading spatial dims, at most 2) get y (and z) to themselves; the rest
    # and the M/N tiles share x (2^31 blocks)
    sch.reorder(*outer, m_o, n_o, ty, tx, *rest, tm, tn)
    halo_idx = [as_int(v) for v in ann.get("dense.halo", [])]
    halo = [spatial[i] for i in halo_idx]
    plain = [lp for i, lp in zip([i for i in range(len(spatial)) if i not in (m_ax, n_ax)], outer)
             if i not in halo_idx]
    if len(halo) > 2:
        raise RuntimeError("at most 2 halo axes can be bound to the CUDA grid")
    if not halo:
        if plain:
            sch.bind(fuse(sch, plain), "blockIdx.x")
        sch.bind(m_o, "blockIdx.y")
        sch.bind(n_o, "blockIdx.z")
    elif len(halo) == 1:
        sch.reorder(*plain, m_o, *halo, n_o)
        sch.bind(fuse(sch, [*plain, m_o]), "blockIdx.x")
        sch.bind(halo[0], "blockIdx.y")
        sch.bind(n_o, "blockIdx.z")
    else:
        sch.reorder(*plain, m_o, n_o, *halo)
        sch.bind(sch.fuse(*plain, m_o, n_o), "blockIdx.x")
        sch.bind(halo[1], "blockIdx.y")
        sch.bind(halo[0], "blockIdx.z")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    # the epilogue (crop + cast), or partial results reduced later, from registers
    keep_in_registers(sch, block, tx, epilogue(sch, block))
    if reduce:
        ko_ref = sch.get_sref(stage_at)
        depth = 1 + next(i for i, lp in enumerate(sch.get_loops(block))
                         if sch.get_sref(lp).same_as(ko_ref))
        n_reads = len(sch.get(block).reads)
        for i in range(n_reads):
            buf = sch.get(block).reads[i].source
            if buf.scope() == "local":
                continue
            cache = sch.cache_read(block, i, "shared", consumer_blocks=[block])
            sch.compute_at(cache, stage_at)
            loops = sch.get_loops(cache)[depth:]
            _, cy, cx = sch.split(fuse(sch, loops), [None, TY, TX])
            sch.bind(cy, "threadIdx.y")
            sch.bind(cx, "threadIdx.x")
        sch.unroll(tm)
        sch.unroll(tn)
        inner = [lp for lp in rest[rest.index(stage_at) + 1:]]
        if math.prod(const_extent(sch, lp) or 64 for lp in inner) <= 64:
            for lp in inner:          # the staged step's taps: straight-line FMAs
                sch.unroll(lp)
        sch.decompose_reduction(block, rest[0])


# ------------------------------------------------------------------------------------------
# tensor cores (float16 GEMMs)

def _tensor_core_ok(sch, block, ann) -> bool:
    """A float16 GEMM (``dense.tc``: [*batch, m, n] += a[m, k]·b[k, n], one reduction) whose
    grains are multiples of 16 and whose indices are int32 (the WMMA intrinsics' strides)."""
    if not as_int(ann.get("dense.tc", 0)):
        return False
    info = analyze(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    m_ax, n_ax = as_int(ann["dense.m"]), as_int(ann["dense.n"])
    if len(reduce) != 1 or (m_ax, n_ax) != (len(spatial) - 2, len(spatial) - 1):
        return False
    if as_int(ann["dense.gm"]) % 16 or as_int(ann["dense.gn"]) % 16 or as_int(ann.get("dense.gk", 16)) % 16:
        return False
    return str(sch.get(spatial[0]).loop_var.ty) == "int32"


def _wmma(sch, block, ann) -> None:
    """WMMA 16x16x16 (float16 in, float32 accumulate): a thread block computes BM x BN with
    WY x WX warps of FM x FN fragments; per 16-deep k step both operand tiles go to shared memory
    (128-bit loads), then to fragments; the accumulators are stored to the contraction's buffer
    and the epilogue (crop + cast) runs as its own kernel."""
    from tvm.s_tir.tensor_intrin import cuda as intrin
    info = analyze(sch, block)
    spatial, (k,) = info.spatial_loops, info.reduce_loops
    *batch, m, n = spatial
    BM, BN = min(64, as_int(ann["dense.gm"])), min(64, as_int(ann["dense.gn"]))
    WY, WX = max(1, BM // 32), max(1, BN // 32)
    FM, FN = BM // (16 * WY), BN // (16 * WX)
    m0, m1, m2, m3 = sch.split(m, [None, WY, FM, 16])
    n0, n1, n2, n3 = sch.split(n, [None, WX, FN, 16])
    k0, k1 = sch.split(k, [None, 16])
    sch.reorder(*batch, m0, n0, m1, n1, k0, m2, n2, m3, n3, k1)
    if batch:
        sch.bind(fuse(sch, batch), "blockIdx.x")
    sch.bind(m0, "blockIdx.y")
    sch.bind(n0, "blockIdx.z")
    warp = sch.fuse(m1, n1)
    sch.bind(warp, "threadIdx.y")
    m_var, n_var = [iv.var for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0][-2:]

    def read_index(var, other):
        """The operand read indexed by ``var`` (A: the rows m, B: the columns n), not ``other``."""
        return next(i for i, r in enumerate(sch.get(block).reads)
                    if indexed_by(r, var) and not indexed_by(r, other))

    acc = sch.cache_write(block, 0, "wmma.accumulator")
    sch.reverse_compute_at(acc, warp)
    for var, other in ((m_var, n_var), (n_var, m_var)):
        sh = sch.cache_read(block, read_index(var, other), "shared", consumer_blocks=[block])
        sch.compute_at(sh, k0)
        fused = sch.fuse(*sch.get_loops(sh)[-2:])       # the tile's rows x 16 (or 16 x cols)
        _, ty, tx, vec = sch.split(fused, [None, WY * WX, 32, 8])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        sch.storage_align(sh, 0, axis=-2, factor=32, offset=8)
    # (fragment loads land under k0, after the shared copies, for the warp's rows / columns)
    fa = sch.cache_read(block, read_index(m_var, n_var), "wmma.matrix_a")
    fb = sch.cache_read(block, read_index(n_var, m_var), "wmma.matrix_b")
    # fragment loads: 16 x 16 tiles
    la = sch.get_loops(fa)[-2:]
    a_o, a_i = sch.split(la[0], [None, 16])
    sch.reorder(a_o, a_i, la[1])
    sch.tensorize(a_i, intrin.WMMA_LOAD_16x16x16_F16_A_INTRIN)
    lb = sch.get_loops(fb)[-2:]
    b_o, b_i = sch.split(lb[1], [None, 16])
    sch.reorder(b_o, lb[0], b_i)
    sch.tensorize(lb[0], intrin.WMMA_LOAD_16x16x16_F16_B_INTRIN)
    # accumulator store: 16 x 16 tiles into the contraction's (global) buffer
    ls = sch.get_loops(acc)[-2:]
    s_mo, s_mi = sch.split(ls[0], [None, 16])
    s_no, s_ni = sch.split(ls[1], [None, 16])
    sch.reorder(s_mo, s_no, s_mi, s_ni)
    sch.tensorize(s_mi, intrin.WMMA_STORE_16x16x16_F32_GLOBAL_INTRIN)
    init = sch.decompose_reduction(block, k0)
    sch.tensorize(sch.get_loops(init)[-2], intrin.WMMA_FILL_16x16x16_F32_INTRIN)
    sch.tensorize(m3, intrin.WMMA_SYNC_16x16x16_f16f16f32_INTRIN)


RULE = ScheduleRule("gemm_dense", schedule, contraction)
