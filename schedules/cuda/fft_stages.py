"""CUDA schedule of the FFT grads (te_defs/fft.py): one thread per butterfly, a launch per stage.

The ``tvmgrad_on_cuda`` flag is fixed to 1 first (the CUDA form of the transforms, radix-2
Stockham stages over all lines).

Inside each ``te.extern`` of an FFT the sblocks (a copy-in, and the butterflies of one stage of
every line) have their spatial loops fused and bound to THREADS-wide thread blocks; the stage loop
around them (a loop their iteration vars do not use) stays on the host, so each stage is one
kernel launch (a grid-wide barrier between stages). Other blocks: one thread per element, or the
generic reduction rule. It fits a function with te.extern units (``fits.fft_units``); every block
ends up bound (checked).
"""

from __future__ import annotations

from ..analysis import analyze, is_bound
from ..cpu.annotated_loops import target_form
from ..cpu.fft_stages import unit_loops
from ..fits import fft_units
from ..loops import outside_externs
from ..schedule_rule import ScheduleRule
from . import generic_rule
from ._threads import bind_threads
from .units_and_matmuls import check_bound

__all__ = ["schedule", "RULE"]

THREADS = 256


def schedule(sch, target=None):
    sch = target_form(sch, 1)         # the CUDA form of the transforms (te_defs/fft.py)
    for block in outside_externs(sch, _bind_units):
        info = analyze(sch, block)
        if not is_bound(sch, info.loops):
            generic_rule(sch, info)
    check_bound(sch)
    return sch.mod


def _bind_units(sch, block) -> None:
    spatial = unit_loops(sch, block)
    if not spatial:
        raise RuntimeError(f"block {sch.get(block).name_hint!r} has no loop to bind")
    bind_threads(sch, spatial, THREADS)


RULE = ScheduleRule("fft_stages", schedule, fft_units)
