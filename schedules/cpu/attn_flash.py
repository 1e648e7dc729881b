"""CPU schedule of the attention grads (te_defs/attention.py): tiled, never an S x S buffer.

* dK/dV main block (``attn.main`` = kv; loops b, kh, j, d | reduce g, i):

      parallel for (b, kh, 64-key tile):
          acc_dk, acc_dv [64, D] = 0
          for g, 64-row tile:
              S, dP [64, 64] = q·K^T, dO·V^T      (row, d, key: the key axis vectorised)
              P, dS [64, 64]                      (vectorised along the keys)
              for key, row: acc[key, :] += dS/P[row, key] · q/dO[row, :]   (d vectorised)
          epilogue: dK = s·acc_dk, dV = acc_dv (64 x D)

* dQ main block (``attn.main`` = q): parallel over (b, h, 64-row tile), tiles recomputed per
  64-key block, acc[row, :] += dS[row, key]·K[key, :].
* bias grad (``attn.main`` = bias): parallel over 64 x 64 output tiles, the tile stages per
  (broadcast batch, head).
* the tile stages (``attn.tile``) are computed at the tile loops above; the sources, Δ, lse and the
  output assembly are plain parallel loops.

All sequence extents of the tile stages are multiples of 64 (te_defs/attention.GRAIN), so the
tiles need no bounds checks (the bias grad's, over the unpadded output, have them). It fits a
function with ``attn.main`` blocks (``fits.attention``).
"""

from __future__ import annotations

from ..analysis import analyze, annotations, by_role, const_extent
from ..fits import attention
from ..schedule_rule import ScheduleRule
from ._isa import register_rows, vector_unit
from ._parallel import parallel
from .separate_stages import per_block

__all__ = ["schedule", "RULE"]

TILE = 64     # te_defs/attention.GRAIN: every tiled sequence extent is a multiple
ROWS = 4      # at most this many tile rows share one load of a K^T / V^T row (register blocking;
              # fewer where the target's vector registers cannot hold their accumulators)


def schedule(sch, target):
    unit = vector_unit(target)
    rules = {"kv": _kv, "q": _q, "bias": _bias}
    for block, role in by_role(sch, "attn.main"):
        rules[role](sch, block, unit)
    per_block(sch)
    return sch.mod


def _dtype(sch, block) -> str:
    return str(sch.get(block).writes[0].source.dtype)


def _width(sch, loop) -> int:
    """A vectorised loop's extent (a tile's width where it is symbolic)."""
    return const_extent(sch, loop) or TILE


def _tiles_under(sch, main, loop, unit) -> None:
    """compute_at every tile stage feeding ``main`` at ``loop`` (consumers first), then give each
    its loop order: S/dP as (row, d, key) with the key axis vectorised, P/dS vectorised."""
    placed = {_key(sch, main)}
    pending = _tile_producers(sch, main)
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
            rows = register_rows(unit, _width(sch, c), _dtype(sch, blk), most=ROWS)
            ro, ri = _split_div(sch, r, rows)
            sch.reorder(ro, d, ri, c)
            if ri is not None:
                sch.unroll(ri)
            sch.vectorize(c)
            sch.decompose_reduction(blk, d)
        elif _dtype(sch, blk) == "float32":
            # float64: tirx.exp stays a libm call; an explicitly vectorised float64 exp does not
            # lower since tvmgrad.fastmath's rule (it returns non-float32 calls unchanged)
            sch.vectorize(loops[-1])


def _split_div(sch, loop, factor):
    """(outer, inner) with inner = factor when it divides the loop's constant extent, else
    (loop, None)."""
    ext = const_extent(sch, loop)
    if ext is not None and ext % factor == 0 and ext > factor:
        return tuple(sch.split(loop, [None, factor]))
    return loop, None


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
    _tiles_under(sch, block, tiles_at, unit)
    for ep in _epilogues(sch, block):
        sch.reverse_compute_at(ep, par)
    sch.decompose_reduction(block, init_at)


def _kv(sch, block, unit) -> None:
    b, kh, j, d, g, i = sch.get_loops(block)
    keys = register_rows(unit, _width(sch, d), _dtype(sch, block), most=2)
    jb, jc = sch.split(j, [None, TILE])
    ib, ir = sch.split(i, [None, TILE])
    jco, jci = sch.split(jc, [None, keys])
    sch.reorder(b, kh, jb, g, ib, jco, ir, jci, d)
    sch.unroll(jci)
    sch.vectorize(d)
    _accumulate(sch, block, [b, kh, jb], ib, g, unit)


def _q(sch, block, unit) -> None:
    b, h, i, d, j = sch.get_loops(block)
    rows = register_rows(unit, _width(sch, d), _dtype(sch, block), most=ROWS)
    ib, ir = sch.split(i, [None, TILE])
    jb, jc = sch.split(j, [None, TILE])
    iro, iri = sch.split(ir, [None, rows])
    sch.reorder(b, h, ib, jb, iro, jc, iri, d)
    sch.unroll(iri)
    sch.vectorize(d)
    _accumulate(sch, block, [b, h, ib], jb, jb, unit)


def _bias(sch, block, unit) -> None:
    info = analyze(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    *lead, i, j = spatial
    ib, ir = sch.split(i, [None, TILE])
    jb, jc = sch.split(j, [None, TILE])
    sch.reorder(*lead, ib, jb, *reduce, ir, jc)
    _accumulate(sch, block, [*lead, ib, jb], reduce[-1], reduce[0], unit)


RULE = ScheduleRule("attn_flash", schedule, attention)
