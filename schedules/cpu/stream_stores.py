"""CPU schedule of a streamed kernel (tvmgrad/streaming.py): a flat elementwise loop whose
vector stores are all aligned to their own size, so that its non-temporal stores are whole
aligned vectors (``vmovntps``).

The one loop is split into parallel chunks of ``STEPS`` vectors of the target's lanes: every
vector then starts at a multiple of its lanes from the buffer's start, and with the output
buffers declared 64-byte aligned (``build`` keeps TVM's alignment on a streamed kernel's
outputs) LLVM knows each store's alignment. The loop-partition hint splits the chunk's steps
that never meet the bound from the tail that does, so the main loop is branch-free vector code
(as in ``red_rows``). Lanes: the target's vector of 32-bit values (64-bit for float64 outputs),
so that a float16 or bfloat16 output is stored half a register at a time, still aligned.
It fits a function of one elementwise block over one loop (``fits.flat_elementwise``).
"""

from __future__ import annotations

from ..analysis import top_blocks
from ..fits import flat_elementwise
from ..loops import each_nest
from ..schedule_rule import ScheduleRule
from ._isa import vector_unit

__all__ = ["schedule", "RULE", "STEPS"]

STEPS = 64       # vectors per parallel chunk (4 KiB of float32 on AVX-512)


def schedule(sch, target):
    unit = vector_unit(target)
    for info in each_nest(sch, top_blocks(sch)):
        (loop,) = info.loops
        lanes = min(unit.lanes("float32"),
                    *(unit.lanes(str(w.source.dtype)) for w in sch.get(info.block).writes))
        chunk, steps, lane = sch.split(loop, [None, STEPS, lanes])
        sch.parallel(chunk)
        sch.vectorize(lane)
        sch.annotate(steps, "pragma_loop_partition_hint", 1)
    return sch.mod


RULE = ScheduleRule("stream_stores", schedule, flat_elementwise)
