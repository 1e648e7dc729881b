"""CUDA rule ``extern_units``: sequential units in te.extern blocks and the stages around them
(the LSTM grad, te_defs/rnn.py).

* sequential units (the spatial sblocks inside the te.externs: e.g. one batch row's forward or
  backward recurrence, the time loop inside; few of them): one thread per unit, UNIT_THREADS
  per block;
* reductions (the input projection, the weight / bias grads over (time, batch), the input
  grads): one thread per output element, the reduced loops serial, accumulating in a register;
* elementwise blocks: the generic rule (one thread per element).

It fits a function with te.extern units (``fits.extern_units``). Every block ends up bound to
threads (checked).
"""

from __future__ import annotations

from ..fits import extern_units
from ..loops import keep_in_registers
from ..schedule_rule import ScheduleRule
from ._threads import bind_threads, thread_per_output
from .units_and_matmuls import schedule_around_externs

__all__ = ["schedule", "RULE"]

UNIT_THREADS = 32
RED_THREADS = 128


def schedule(sch, target=None):
    return schedule_around_externs(sch, _units, _reduction)


def _units(sch, block) -> None:
    loops = sch.get_loops(block)
    if not loops:
        raise RuntimeError(f"sequential block {sch.get(block).name_hint!r} has no unit loop")
    bind_threads(sch, loops, UNIT_THREADS)


def _reduction(sch, info) -> None:
    _, tx = thread_per_output(sch, info, RED_THREADS)
    keep_in_registers(sch, info.block, tx, None)
    sch.decompose_reduction(info.block, info.reduce_loops[0])


RULE = ScheduleRule("extern_units", schedule, extern_units)
