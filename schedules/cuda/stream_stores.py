"""CUDA rule ``stream_stores``: a streamed kernel (tvmgrad/streaming.py) is a CPU notion, made only
for LLVM targets; should a streamed plan be built for CUDA all the same, its elementwise loops
get the elementwise rule (one thread per element), as its ordinary twin's do. It fits
what the CPU rule fits (``fits.streamable_elementwise``)."""

from __future__ import annotations

from ..analysis import top_blocks
from ..fits import streamable_elementwise
from ..loops import each_nest
from ..schedule_rule import ScheduleRule
from . import NO_LOOP
from . import _elementwise as elementwise
from ._threads import check_all_bound

__all__ = ["schedule", "RULE"]


def schedule(sch, target):
    for info in each_nest(sch, top_blocks(sch), loopless=NO_LOOP):
        elementwise.schedule(sch, info.loops)
    check_all_bound(sch)
    return sch.mod


RULE = ScheduleRule("stream_stores", schedule, streamable_elementwise)
