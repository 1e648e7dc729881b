"""CPU schedule of the FFT grads (te_defs/fft.py): the transforms' units in parallel.

The ``tvmgrad_on_cuda`` flag is fixed to 0 first (the CPU form: the four-step passes, each an
sblock over units of lines that run all their stages inside). Inside each ``te.extern`` of an FFT
the sblocks have their spatial loops fused and run in parallel; a stage loop around them (a loop
their iteration vars do not use, CUDA form only) stays serial. Other blocks (chirps, products, the final scaling)
get the generic CPU rules. It fits a function with te.extern units (``fits.fft_units``).
"""

from __future__ import annotations

from .. import cpu as generic
from ..analysis import analyze, annotations
from ..fits import fft_units
from ..loops import outside_externs
from ..schedule_rule import ScheduleRule
from ._parallel import parallel
from .annotated_loops import specialise

__all__ = ["schedule", "unit_loops", "RULE"]


def schedule(sch, target=None):
    sch = specialise(sch, 0)          # the CPU form of the transforms (te_defs/fft.py)
    for _block in outside_externs(sch, _parallel_units):
        pass                          # the blocks outside the externs: the generic rules, below
    return generic.schedule(sch, target)


def _parallel_units(sch, block) -> None:
    spatial = unit_loops(sch, block)
    if spatial:
        parallel(sch, spatial)


def unit_loops(sch, block):
    """The loops over independent units: the block's spatial loops, less the serial stage loop of
    a paired butterfly stage (sblock attr ``fft.stage`` = 1: its first loop)."""
    spatial = analyze(sch, block).spatial_loops
    ann = annotations(sch, block)
    stage = int(ann["fft.stage"]) if "fft.stage" in ann else 0
    return spatial[stage:]


RULE = ScheduleRule("fft_stages", schedule, fft_units)
