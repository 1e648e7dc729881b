"""CPU schedule of the FFT grads (te_defs/fft.py): butterfly stages in parallel.

Inside each ``te.extern`` of an FFT the sblocks (a copy-in, and the butterflies of one stage of
every line) have their spatial loops fused and run in parallel; a stage loop around them (a loop
their iteration vars do not use) stays serial. Other blocks (chirps, products, the final scaling)
get the generic CPU rules.
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import analyze, top_blocks

__all__ = ["schedule"]


def schedule(sch, target=None):
    for block in top_blocks(sch):
        if sch.get_loops(block):
            continue
        for child in sch.get_child_blocks(block):
            spatial = _unit_loops(sch, child)
            if spatial:
                sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])
    return generic.schedule(sch, target)


def _unit_loops(sch, block):
    """The loops over independent units: the block's spatial loops, less the serial stage loop of
    a paired butterfly stage (sblock attr ``fft.stage`` = 1: its first loop)."""
    spatial = analyze(sch, block).spatial_loops
    ann = {str(k): v for k, v in sch.get(block).annotations.items()}
    stage = int(ann["fft.stage"]) if "fft.stage" in ann else 0
    return spatial[stage:]
