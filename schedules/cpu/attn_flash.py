"""CPU schedule of the attention grads (te_defs/attention.py): tiled, never an S x S buffer.

Every tile product is a register-blocked micro-kernel of gemm_dense's size for the target
(``micro_kernel``'s power-of-two tile, which divides the 64-wide tiles: mb rows x nb lanes of
accumulators, AVX2 4 x 16; the dK/dV pair mb/2 rows, since it keeps two accumulators per
element): per reduction step mb broadcasts, nb/lanes vector loads and mb·nb/lanes FMAs, the
accumulators in registers across the whole reduction.

* dK/dV main block (``attn.main`` = kv; loops b, kh, j, d | reduce g, i):

      parallel for (b, kh, 64-key tile):
          acc_dk, acc_dv [64, D] = 0
          for g, 64-row tile:
              S, dP [64, 64] = q·K^T, dO·V^T     for (row, key) blocks: for d: mb x nb FMAs
              P, dS [64, 64]                     (vectorised along the keys)
              for d block, key pair, row: acc[keys, d block] += dS/P[row, keys] · q/dO[row, d block]

  the d block outermost so that the q/dO columns it reads stay in L1 across all key pairs
  (key-outer read the whole q, dO, P and dS tiles, 64 KiB, per pair: L2 traffic).
* dQ main block (``attn.main`` = q): parallel over (b, h, 64-row tile), tiles recomputed per
  64-key block, for (row, d) blocks: for key: acc[rows, d block] += dS[rows, key]·K[key, d block].
* the one-pass form (``attn.one_pass`` on the dQ block, te_defs/attention.one_pass): both main
  blocks tiled as above, their loops merged so that dQ takes the dK/dV pass's own dS tiles
  (``_one_pass``); parallel over (b, kh), each worker owning its query heads' dQ rows.
* bias grad (``attn.main`` = bias): parallel over 64 x 64 output tiles, the tile stages per
  (broadcast batch, head).
* the tile stages (``attn.tile``) are computed at the tile loops above; the sources, Δ, lse and the
  output assembly are plain parallel loops; K^T and V^T are stored tile by tile
  (``_key_tiles_contiguous``).

All sequence extents of the tile stages are multiples of 64 (te_defs/attention.GRAIN), so the
tiles need no bounds checks (the bias grad's, over the unpadded output, have them). It fits a
function with ``attn.main`` blocks (``fits.attention``).
"""

from __future__ import annotations

from ..analysis import analyze, annotations, by_role, const_extent
from ..fits import attention
from ..schedule_rule import ScheduleRule
from ._isa import vector_unit
from .gemm_dense import micro_kernel
from ._parallel import parallel
from .separate_stages import per_block

__all__ = ["schedule", "RULE"]

TILE = 64     # te_defs/attention.GRAIN: every tiled sequence extent is a multiple


def schedule(sch, target):
    unit = vector_unit(target)
    rules = {"kv": _kv, "q": _q, "bias": _bias}
    _key_tiles_contiguous(sch)
    roles = {role: block for block, role in by_role(sch, "attn.main")}
    if "q" in roles and annotations(sch, roles["q"]).get("attn.one_pass"):
        _one_pass(sch, roles.pop("kv"), roles.pop("q"), unit)
    for role, block in roles.items():
        rules[role](sch, block, unit)
    per_block(sch)
    return sch.mod


def _key_tiles_contiguous(sch) -> None:
    """K^T and V^T ([.., D, Sk]) stored tile by tile, [.., Sk / 64, D, 64]: the rows of one key
    tile are then one contiguous block instead of D rows a whole sequence apart, which (at a
    power-of-two stride) all fall into the same few L1 sets and evict each other between the
    tile's reuses."""
    from tvm import tirx
    for block, role in by_role(sch, "attn.src"):
        if role not in ("kT", "vT"):
            continue
        index_dtype = str(sch.get(block).writes[0].source.shape[-1].ty)

        def tiled(*i):
            *lead, d, j = i
            return [*lead, tirx.floordiv(j, TILE), d, tirx.floormod(j, TILE)]
        sch.transform_layout(block, ("write", 0),
                             tirx.IndexMap.from_func(tiled, ndim=4, index_dtype=index_dtype),
                             assume_injective_transform=True)


def _dtype(sch, block) -> str:
    return str(sch.get(block).writes[0].source.dtype)


def _width(sch, loop) -> int:
    """A vectorised loop's extent (a tile's width where it is symbolic)."""
    return const_extent(sch, loop) or TILE


def _tiles_under(sch, mains, loop, unit) -> None:
    """compute_at every tile stage feeding the ``mains`` at ``loop`` (consumers first), then give
    each its loop order: S/dP as micro-kernels (row block, key block, d, rows unrolled, keys
    vectorised), P/dS vectorised along the keys."""
    placed = {_key(sch, main) for main in mains}
    pending = list({_key(sch, p): p for main in mains for p in _tile_producers(sch, main)}.values())
    done = []
    while pending:
        for blk in pending:
            if all(_key(sch, c) in placed for c in sch.get_consumers(blk)):
                sch.compute_at(blk, loop)
                placed.add(_key(sch, blk))
                done.append(_name(sch, blk))
                pending = [b for b in pending if _key(sch, b) != _key(sch, blk)]
                for p in _tile_producers(sch, blk):
                    if _key(sch, p) not in placed and all(_key(sch, p) != _key(sch, q) for q in pending):
                        pending.append(p)
                break
        else:
            raise RuntimeError(f"attention tiles: cannot place {[_name(sch, b) for b in pending]}")
    for name in done:
        blk = sch.get_sblock(name)
        loops = sch.get_loops(blk)
        info = analyze(sch, blk)
        if info.is_reduction:
            r, c, d = loops[-3:]
            rows, cols = _micro(sch, blk, unit, c)
            ro, ri = _split_in(sch, r, rows)
            co, ci = _split_in(sch, c, cols)
            sch.reorder(*_present(ro, co, d, ri, ci))
            sch.unroll(ri)
            sch.vectorize(ci)
            sch.decompose_reduction(blk, d)
        elif _dtype(sch, blk) == "float32":
            # float64: tirx.exp stays a libm call; an explicitly vectorised float64 exp does not
            # lower since tvmgrad.fastmath's rule (it returns non-float32 calls unchanged)
            sch.vectorize(loops[-1])


def _micro(sch, block, unit, lanes_loop, pair=False):
    """(rows, lanes) of a register tile: gemm_dense's micro-kernel for the target (rows sharing one
    vector load, lanes a run of vectors), rows halved for a two-output reduction (dK and dV
    accumulate side by side), neither above the tile."""
    rows, lanes = micro_kernel(unit, _dtype(sch, block), power_of_two=True)    # _split_in
    if pair:
        rows = max(1, rows // 2)
    return rows, min(lanes, _width(sch, lanes_loop))


def _split_in(sch, loop, factor):
    """(outer, inner): inner runs ``factor`` iterations, or the largest power-of-two fraction of it
    that divides the loop's constant extent; (None, loop) when that is the whole loop or nothing
    divides (a symbolic extent, an odd head dim)."""
    ext = const_extent(sch, loop)
    if ext is None:
        return None, loop
    while factor > 1 and ext % factor:
        factor //= 2
    if factor <= 1 and ext > 1 or factor >= ext:
        return None, loop
    return tuple(sch.split(loop, [None, factor]))


def _present(*loops):
    return [lp for lp in loops if lp is not None]


def _tile_producers(sch, block):
    return [p for p in sch.get_producers(block) if "attn.tile" in annotations(sch, p)]


def _key(sch, block):
    return _name(sch, block)


def _name(sch, block) -> str:
    return sch.get(block).name_hint


def _epilogues(sch, main):
    return [c for c in sch.get_consumers(main) if "attn.epilogue" in annotations(sch, c)]


def _accumulate(sch, block, outer, tiles_at, init_at, unit) -> None:
    """A main block's common tail: its ``outer`` loops fused and parallel (each worker owns its
    output tile), its tile stages computed at ``tiles_at``, its epilogues per output tile and
    its init split off at ``init_at``."""
    par = parallel(sch, outer)
    _tiles_under(sch, [block], tiles_at, unit)
    for ep in _epilogues(sch, block):
        sch.reverse_compute_at(ep, par)
    sch.decompose_reduction(block, init_at)


def _kv(sch, block, unit) -> None:
    b, kh, jb, g, ib = _kv_tiles(sch, block, unit)
    _accumulate(sch, block, [b, kh, jb], ib, g, unit)


def _kv_tiles(sch, block, unit):
    """The dK/dV block's loops tiled (key tile, g, row tile, then the micro-kernel); -> its
    outer loops (b, kh, key tile, g, row tile)."""
    b, kh, j, d, g, i = sch.get_loops(block)
    keys, lanes = _micro(sch, block, unit, d, pair=True)
    jb, jc = sch.split(j, [None, TILE])
    ib, ir = sch.split(i, [None, TILE])
    jco, jci = sch.split(jc, [None, keys])
    do, di = _split_in(sch, d, lanes)
    sch.reorder(b, kh, jb, g, ib, *_present(do, jco, ir, jci, di))
    sch.unroll(jci)
    sch.vectorize(di)
    return b, kh, jb, g, ib


def _q(sch, block, unit) -> None:
    b, h, ib, jb = _q_tiles(sch, block, unit)
    _accumulate(sch, block, [b, h, ib], jb, jb, unit)


def _q_tiles(sch, block, unit, group=None):
    """The dQ block's loops tiled (row tile, key tile, then the micro-kernel); -> its outer
    loops (b, h, row tile, key tile), or with ``group`` (the one-pass form: G query heads per kv
    head) the heads split and the key tile outside g, as _kv_tiles orders them: (b, kh, key
    tile, g, row tile)."""
    b, h, i, d, j = sch.get_loops(block)
    rows, lanes = _micro(sch, block, unit, d)
    ib, ir = sch.split(i, [None, TILE])
    jb, jc = sch.split(j, [None, TILE])
    iro, iri = sch.split(ir, [None, rows])
    do, di = _split_in(sch, d, lanes)
    if group is None:
        outer = [b, h, ib, jb]
    else:
        kh, g = sch.split(h, [None, group])
        outer = [b, kh, jb, g, ib]
    sch.reorder(*outer, iro, *_present(do, jc, iri, di))
    sch.unroll(iri)
    sch.vectorize(di)
    return outer


def _one_pass(sch, kv, q, unit) -> None:
    """dK/dV and dQ in one loop nest over the same tiles (te_defs/attention.one_pass):

        parallel for (b, kh):
            dQ rows of the group's heads = 0
            for 64-key tile:
                acc_dk, acc_dv [64, D] = 0
                for g, 64-row tile:
                    S, dP, P, dS [64, 64]                                  (as in _kv)
                    acc_dk, acc_dv += ...                                  (as in _kv)
                    dQ[rows, d block] += dS[rows, key]·K[key, d block]     (as in _q)
                dK, dV = s·acc_dk, acc_dv
            dQ *= s

    Each (b, kh) worker owns every dQ row its query heads have, so dQ accumulates in place, in
    key order, without atomics. Both nests are tiled as _kv and _q tile them, then their
    (b, kh, key tile, g, row tile) loops merged."""
    b, kh, jb, g, ib = _kv_tiles(sch, kv, unit)
    qb, qkh, qjb, qg, qib = _q_tiles(sch, q, unit, group=const_extent(sch, g))
    pairs = ((b, qb), (kh, qkh), (jb, qjb), (g, qg), (ib, qib))
    b, kh, jb, g, ib = (sch.merge(x, y) for x, y in pairs)
    par = parallel(sch, [b, kh])
    _tiles_under(sch, [kv, q], ib, unit)
    for ep in _epilogues(sch, kv):
        sch.reverse_compute_at(ep, jb)
    for ep in _epilogues(sch, q):
        sch.reverse_compute_at(ep, par)
    sch.decompose_reduction(kv, g)
    sch.decompose_reduction(q, jb)


def _bias(sch, block, unit) -> None:
    info = analyze(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    *lead, i, j = spatial
    ib, ir = sch.split(i, [None, TILE])
    jb, jc = sch.split(j, [None, TILE])
    sch.reorder(*lead, ib, jb, *reduce, ir, jc)
    _accumulate(sch, block, [*lead, ib, jb], reduce[-1], reduce[0], unit)


RULE = ScheduleRule("attn_flash", schedule, attention)
