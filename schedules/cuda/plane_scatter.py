"""CUDA rule ``plane_scatter``: a per-plane scatter (te_defs/pool.py's max-pool grads): one
thread per plane (its outputs in order: deterministic, no atomics), 128 planes per thread block.
It fits a function of spatial blocks (``fits.plane_loops``)."""

from __future__ import annotations

from ..analysis import top_blocks
from ..fits import plane_loops
from ..schedule_rule import ScheduleRule
from ._threads import bind_threads

__all__ = ["schedule", "RULE"]

THREADS = 128


def schedule(sch, target):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            raise RuntimeError(f"block {sch.get(block).name_hint!r} has no loop to bind")
        bind_threads(sch, loops[:1], THREADS)
    return sch.mod


RULE = ScheduleRule("plane_scatter", schedule, plane_loops)
