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

A streamed shape kernel (concat_grad's pieces, ...) has blocks over rows whose length its
variant bakes in: their rows run in parallel, each in vectors of a width that divides the row,
so that every vector starts a whole number of vectors from the buffer's start again.
It fits such elementwise blocks (``fits.streamable_elementwise``).
"""

from __future__ import annotations

import math

from ..analysis import const_extent, top_blocks
from ..fits import streamable_elementwise
from ..loops import each_nest, fuse
from ..schedule_rule import ScheduleRule
from ._isa import vector_unit

__all__ = ["schedule", "RULE", "STEPS"]

STEPS = 64       # vectors per parallel chunk (4 KiB of float32 on AVX-512)


def schedule(sch, target):
    unit = vector_unit(target)
    for info in each_nest(sch, top_blocks(sch)):
        lanes = min(unit.lanes("float32"),
                    *(unit.lanes(str(w.source.dtype)) for w in sch.get(info.block).writes))
        if len(info.loops) == 1:
            chunk, steps, lane = sch.split(info.loops[0], [None, STEPS, lanes])
            sch.parallel(chunk)
            sch.annotate(steps, "pragma_loop_partition_hint", 1)
        else:
            # rows of a constant length: vectors that divide it, so each starts a whole number
            # of vectors from its row's start (the row's length is one as well)
            *rows, row = info.loops
            _, lane = sch.split(row, [None, math.gcd(lanes, const_extent(sch, row))])
            sch.parallel(fuse(sch, rows))
        sch.vectorize(lane)
    return sch.mod


RULE = ScheduleRule("stream_stores", schedule, streamable_elementwise)
