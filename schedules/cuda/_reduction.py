"""Reduction CUDA rules.

* row (the reduced dims are innermost in memory): one thread block per output element; the
  block's threads stride over the reduced elements and combine with warp shuffles
  (TVM's cross-thread allreduce);
* column (the kept dims are innermost): one thread per output element; each thread walks the
  reduced dims, and neighbouring threads read neighbouring addresses (coalesced);
* an elementwise epilogue (the cast back to half) runs in the same thread, from a register.
"""

from __future__ import annotations

from ..analysis import epilogue as _epilogue
from ..loops import fuse, keep_in_registers
from ._threads import bind_threads

ROW_THREADS = 256
COL_THREADS = 256


def schedule(sch, info) -> None:
    block = info.block
    epilogue = _epilogue(sch, block)
    spatial, reduce = info.spatial_loops, info.reduce_loops
    if info.row or not spatial:
        bx = fuse(sch, spatial) if spatial else sch.add_unit_loop(block)
        _, tx = sch.split(fuse(sch, reduce), [None, ROW_THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if epilogue is not None:
            keep_in_registers(sch, block, bx, epilogue)
            _bind_epilogue_threads(sch, epilogue, bx)
        return
    _, tx = bind_threads(sch, spatial, COL_THREADS)
    if epilogue is not None:
        keep_in_registers(sch, block, tx, epilogue)
    sch.decompose_reduction(block, reduce[0])   # zero the output even when nothing is reduced


def _bind_epilogue_threads(sch, epilogue, bx) -> None:
    """Spread a row epilogue's loops (under the row's block) over the block's threads, striding
    when the epilogue has more elements than threads (a full-row epilogue, not just a cast)."""
    loops = sch.get_loops(epilogue)
    rest = [lp for lp in loops if not sch.get_sref(lp).same_as(sch.get_sref(bx))
            and sch.get(lp).thread_binding is None]
    if rest:
        _, tx = sch.split(fuse(sch, rest), [None, ROW_THREADS])
        sch.bind(tx, "threadIdx.x")
