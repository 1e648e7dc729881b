"""CUDA schedule of the FFT grads (te_defs/fft.py): one thread per butterfly, a launch per stage.

Inside each ``te.extern`` of an FFT the sblocks (a copy-in, and the butterflies of one stage of
every line) have their spatial loops fused and bound to THREADS-wide thread blocks; the stage loop
around them (a loop their iteration vars do not use) stays on the host, so each stage is one
kernel launch (a grid-wide barrier between stages). Other blocks: one thread per element, or the
generic reduction rule. Every block ends up bound (checked).
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from . import _elementwise as elementwise
from . import _reduction as reduction

__all__ = ["schedule"]

THREADS = 256


def schedule(sch, target=None):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            for child in sch.get_child_blocks(block):
                spatial = _unit_loops(sch, child)
                if not spatial:
                    raise RuntimeError(f"block {sch.get(child).name_hint!r} has no loop to bind")
                fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
                bx, tx = sch.split(fused, [None, THREADS])
                sch.bind(bx, "blockIdx.x")
                sch.bind(tx, "threadIdx.x")
            continue
        if any(sch.get(lp).thread_binding is not None for lp in loops):
            continue
        info = analyze(sch, block)
        if info.is_reduction:
            reduction.schedule(sch, info)
        else:
            elementwise.schedule(sch, loops)
    _check(sch)
    return sch.mod


def _bound(sch, loops) -> bool:
    return any(sch.get(lp).thread_binding is not None for lp in loops)


def _check(sch) -> None:
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        kids = sch.get_child_blocks(block) if not loops else []
        for b in ([block] if loops else kids):
            if not _bound(sch, sch.get_loops(b)):
                raise RuntimeError(f"block {sch.get(b).name_hint!r} is not bound to CUDA threads")
        if not loops and not kids:
            raise RuntimeError(f"block {sch.get(block).name_hint!r} has no loop to bind")


def _unit_loops(sch, block):
    """The loops over independent units: the block's spatial loops, less the serial stage loop of
    a paired butterfly stage (sblock attr ``fft.stage`` = 1: its first loop)."""
    spatial = analyze(sch, block).spatial_loops
    ann = {str(k): v for k, v in sch.get(block).annotations.items()}
    stage = int(ann["fft.stage"]) if "fft.stage" in ann else 0
    return spatial[stage:]
