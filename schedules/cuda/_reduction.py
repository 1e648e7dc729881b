"""Reduction CUDA rules.

* row (the reduced dims are innermost in memory): one thread block per output element; the
  block's threads stride over the reduced elements and combine with warp shuffles
  (TVM's cross-thread allreduce);
* column (the kept dims are innermost): one thread per output element; each thread walks the
  reduced dims, and neighbouring threads read neighbouring addresses (coalesced);
* an elementwise epilogue (the cast back to half) runs in the same thread, from a register.
"""

from __future__ import annotations

from ..analysis import analyze

ROW_THREADS = 256
COL_THREADS = 256


def schedule(sch, info) -> None:
    block = info.block
    epilogue = _epilogue(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    if info.row or not spatial:
        if spatial:
            bx = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        else:
            bx = sch.add_unit_loop(block)
        r = sch.fuse(*reduce) if len(reduce) > 1 else reduce[0]
        _, tx = sch.split(r, [None, ROW_THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if epilogue is not None:
            sch.reverse_compute_at(epilogue, bx)
            sch.set_scope(block, 0, "local")
            _bind_epilogue_threads(sch, epilogue, bx)
        return
    sp = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    bx, tx = sch.split(sp, [None, COL_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if epilogue is not None:
        sch.reverse_compute_at(epilogue, tx)
        sch.set_scope(block, 0, "local")
    sch.decompose_reduction(block, reduce[0])   # zero the output even when nothing is reduced


def _bind_epilogue_threads(sch, epilogue, bx) -> None:
    """Spread a row epilogue's loops (under the row's block) over the block's threads, striding
    when the epilogue has more elements than threads (a full-row epilogue, not just a cast)."""
    loops = sch.get_loops(epilogue)
    rest = [lp for lp in loops if not sch.get_sref(lp).same_as(sch.get_sref(bx))
            and sch.get(lp).thread_binding is None]
    if rest:
        fused = sch.fuse(*rest) if len(rest) > 1 else rest[0]
        _, tx = sch.split(fused, [None, ROW_THREADS])
        sch.bind(tx, "threadIdx.x")


def _epilogue(sch, block):
    consumers = sch.get_consumers(block)
    if len(consumers) != 1 or analyze(sch, consumers[0]).is_reduction:
        return None
    return consumers[0]
