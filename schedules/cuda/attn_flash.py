"""CUDA schedule of the attention grads (te_defs/attention.py): FlashAttention-2 style tiles in
shared memory, accumulators in registers, no S x S buffer, no atomics.

dK/dV kernel (block ``attn.main`` = kv; loops b, kh, j, d | reduce g, i), one thread block per
(BC keys, kh, b) on blockIdx.x/y/z (so batch and heads are limited to 65535), TY x TX threads, thread (ty, tx) owning a (BC/TY) x (Dm/TX) register tile of
both dK and dV:

    for g, BR query rows:                        # serial
        q, dO tiles [BR, D] -> shared            (all threads, vectorised loads)
        P  [BR, BC] -> shared: each thread computes its elements: S = q·K^T (a D-long dot in a
                      register, K^T read through L1), P = exp(s·S + mask − lse) or 0
        dS [BR, BC] -> shared: dP = dO·V^T likewise, dS = P·(dP − Δ)
        acc_dv[key, :] += P[row, key]·dO[row, :];  acc_dk[key, :] += dS[row, key]·q[row, :]
    dK = s·acc_dk, dV = acc_dv                   (the epilogue, from registers)

dQ kernel (``attn.main`` = q): one thread block per (b, h, BRQ rows); the q and dO tiles are
loaded once, per BCQ keys the P/dS tiles and a K tile go to shared memory, acc_dq[row, :] +=
dS[row, key]·K[key, :]. Tile sizes follow the head dims so that the shared tiles fit in 48 KiB
(static shared memory; dynamic shared memory would need a launch attribute TVM's runtime sets
only above 48 KiB on some versions). Bias grad (``attn.main`` = bias): one thread per output
element, the tile stages in registers. Every other block (sources, Δ, lse, output assembly):
one thread per element / per reduced output. Every block ends up bound (checked).

The tile stages are computed with ``compute_at`` *after* their scope is set, so that TVM relaxes
the thread loops when it sizes a shared tile; their own loops are then bound to the same thread
axes (the standard cooperative-load pattern). Tensor cores are not used: the tile products are
fp32 FMAs (half inputs are widened when the sources are built). It fits a function with
``attn.main`` blocks (``fits.attention``).
"""

from __future__ import annotations

from ..analysis import analyze, annotations, by_role, as_int, top_blocks
from ..fits import attention
from ..loops import fuse, set_scopes
from ..schedule_rule import ScheduleRule
from ._threads import bind_threads, check_all_bound
from .separate_stages import per_element

__all__ = ["schedule", "RULE"]

TY = 16
SMEM = 48 * 1024
ELEMWISE = 256
RED_THREADS = 128


def schedule(sch, target):
    rules = {"kv": _kv, "q": _q, "bias": _bias}
    for block, role in by_role(sch, "attn.main"):
        rules[role](sch, block)
    for block in top_blocks(sch):
        if "attn.src" in annotations(sch, block):
            _source(sch, block)
    per_element(sch)
    check_all_bound(sch)
    return sch.mod


def _source(sch, block) -> None:
    """A source stage ([B, heads, rows, D] copies, Δ and lse rows): batch on blockIdx.z, heads on
    .y, the rest fused over 256-thread blocks — no division by a symbolic extent per element
    (64-bit divisions are subroutine calls that cost registers and stack); reductions (Δ) keep
    their reduced loop serial in the thread."""
    info = analyze(sch, block)
    spatial = info.spatial_loops
    if len(spatial) < 3:
        return
    b, h, *rest = spatial
    if info.is_reduction:
        sch.reorder(*spatial, *info.reduce_loops)
    bind_threads(sch, rest, ELEMWISE)
    sch.bind(h, "blockIdx.y")
    sch.bind(b, "blockIdx.z")
    if info.is_reduction:
        sch.decompose_reduction(block, info.reduce_loops[0])


def _tx(dim: int) -> int:
    for t in (16, 8, 4, 2):
        if dim % t == 0:
            return t
    return 1


def _name(sch, block) -> str:
    return sch.get(block).name_hint


def _tiles(sch, main):
    """{role: block} of the tile stages feeding ``main`` (S, dP, P, dS)."""
    out = {}
    todo = list(sch.get_producers(main))
    while todo:
        blk = todo.pop()
        role = annotations(sch, blk).get("attn.tile")
        if role is None or str(role) in out:
            continue
        out[str(role)] = blk
        todo += list(sch.get_producers(blk))
    return out


def _epilogues(sch, main):
    return [c for c in sch.get_consumers(main) if "attn.epilogue" in annotations(sch, c)]


def _read_index(sch, block, source):
    """Which of ``block``'s reads is the source stage annotated ``attn.src`` = ``source``."""
    written = [w.source for p in sch.get_producers(block)
               if str(annotations(sch, p).get("attn.src", "")) == source for w in sch.get(p).writes]
    for k, region in enumerate(sch.get(block).reads):
        if any(region.source.same_as(buf) for buf in written):
            return k
    raise RuntimeError(f"block {_name(sch, block)} reads no attn.src = {source!r} stage")


def _place_tiles(sch, main, loop, threads_y, threads_x):
    """P and dS in shared memory at ``loop``, computed cooperatively; S and dP per element in
    registers."""
    t = _tiles(sch, main)
    for role in ("dS", "P"):
        sch.set_scope(t[role], 0, "shared")
        sch.compute_at(t[role], loop)
    for role in ("S", "dP"):
        sch.set_scope(t[role], 0, "local")
    for role, inner in (("P", "S"), ("dS", "dP")):
        blk = t[role]
        own = sch.get_loops(blk)[-2:]
        fused = sch.fuse(*own)
        _, ty, tx = sch.split(fused, [None, threads_y, threads_x])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.compute_at(t[inner], tx)
        red = t[inner]
        sch.decompose_reduction(red, sch.get_loops(red)[-1])
    return t


def _cooperative(sch, cache, threads_y, threads_x) -> None:
    """Bind a shared tile copy's loops to the block's threads (vectorised by 4 when even)."""
    loops = sch.get_loops(cache)
    own = [lp for lp in loops if sch.get(lp).thread_binding is None
           and int(sch.get(lp).kind) == 0][-2:]
    fused = fuse(sch, own)
    ext = sch.get(fused).extent
    vec = 4 if hasattr(ext, "value") and int(ext.value) % (threads_y * threads_x * 4) == 0 else 1
    if vec > 1:
        _, ty, tx, v = sch.split(fused, [None, threads_y, threads_x, vec])
        sch.vectorize(v)
    else:
        _, ty, tx = sch.split(fused, [None, threads_y, threads_x])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def _shared_tile(sch, consumers, source, loop, threads_y, threads_x) -> None:
    cache = sch.cache_read(consumers[0], _read_index(sch, consumers[0], source), "shared",
                           consumer_blocks=consumers)
    sch.compute_at(cache, loop)
    _cooperative(sch, cache, threads_y, threads_x)


def _dims(sch, main):
    ann = annotations(sch, main)
    return as_int(ann["attn.d"]), as_int(ann["attn.dv"])


def _bytes(sch, main) -> int:
    """Bytes of a tile element (the compute dtype: float32, or float64 for float64 data)."""
    return 8 if str(sch.get(main).writes[0].source.dtype) == "float64" else 4


def _fit(smem, sizes) -> int:
    """The first (largest) tile size whose shared tiles fit in SMEM bytes (else the smallest)."""
    for size in sizes:
        if smem(size) <= SMEM:
            return size
    return sizes[-1]


def _grid(sch, main, x, y, z, ty, tx) -> None:
    """Tiles on blockIdx.x, heads on .y, batch on .z: each index stays a plain variable, so TVM
    can size the shared tiles (a fused index's div/mod hides e.g. the kv head h // G). The
    thread's register tile: its epilogues (the outputs) at ``tx``, the accumulators local."""
    sch.bind(x, "blockIdx.x")
    sch.bind(y, "blockIdx.y")
    sch.bind(z, "blockIdx.z")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    for ep in _epilogues(sch, main):
        sch.reverse_compute_at(ep, tx)
    set_scopes(sch, main, "local")


def _kv(sch, main) -> None:
    D, Dv = _dims(sch, main)
    b, kh, j, d, g, i = sch.get_loops(main)
    Dm = max(D, Dv)
    BC = 64 if Dm <= 128 else 32
    TX = _tx(Dm)
    BR = _fit(lambda br: _bytes(sch, main) * (br * D + br * Dv + 2 * br * BC), (32, 16, 8, 4))
    jb, jt, jr = sch.split(j, [None, TY, BC // TY])
    dr, dt = sch.split(d, [Dm // TX, TX])      # d = dr·TX + tx: neighbouring threads, neighbouring words
    ib, ir = sch.split(i, [None, BR])
    sch.reorder(b, kh, jb, jt, dt, g, ib, ir, jr, dr)
    _grid(sch, main, jb, kh, b, jt, dt)
    t = _place_tiles(sch, main, ib, TY, TX)
    _shared_tile(sch, [t["S"], main], "q", ib, TY, TX)
    _shared_tile(sch, [t["dP"], main], "do", ib, TY, TX)
    sch.decompose_reduction(main, g)


def _q(sch, main) -> None:
    D, Dv = _dims(sch, main)
    b, h, i, d, j = sch.get_loops(main)
    TX = _tx(D)
    nb = _bytes(sch, main)
    BCQ = _fit(lambda bc: nb * (TY * D + TY * Dv + bc * D + 2 * TY * bc), (32, 16, 8))
    BRQ = _fit(lambda br: nb * (br * D + br * Dv + BCQ * D + 2 * br * BCQ), (64, 32, 16))
    ib, it, ir = sch.split(i, [None, TY, BRQ // TY])
    dr, dt = sch.split(d, [D // TX, TX])
    jb, jc = sch.split(j, [None, BCQ])
    sch.reorder(b, h, ib, it, dt, jb, jc, ir, dr)
    _grid(sch, main, ib, h, b, it, dt)
    t = _place_tiles(sch, main, jb, TY, TX)
    _shared_tile(sch, [t["S"]], "q", dt, TY, TX)
    _shared_tile(sch, [t["dP"]], "do", dt, TY, TX)
    _shared_tile(sch, [main], "k", jb, TY, TX)
    sch.decompose_reduction(main, jb)


def _bias(sch, main) -> None:
    info = analyze(sch, main)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    sch.reorder(*spatial, *reduce)
    _, tx = bind_threads(sch, spatial, RED_THREADS)
    for ep in _epilogues(sch, main):
        sch.reverse_compute_at(ep, tx)
    sch.set_scope(main, 0, "local")
    t = _tiles(sch, main)
    for role in ("dS", "S", "dP"):
        sch.set_scope(t[role], 0, "local")
    sch.compute_at(t["dS"], reduce[-1])
    ds_inner = sch.get_loops(t["dS"])[-1]
    for role in ("S", "dP"):
        sch.compute_at(t[role], ds_inner)
    # no decompose_reduction here: the fused output index is not quasi-affine; the inits stay
    # in the loops (a per-iteration test, fine for this rarely used output)


RULE = ScheduleRule("attn_flash", schedule, attention)
