"""CPU rule ``extern_units``: sequential units in te.extern blocks and the stages around them
(the LSTM grad, te_defs/rnn.py).

* sequential units (the spatial sblocks inside the te.externs: e.g. one batch row's forward or
  backward recurrence, the time loop inside): the unit loop runs in parallel;
* reductions (the input projection, the weight / bias grads over (time, batch), the input grads):
  the kept loops fused and parallel, the reduced loops serial inside;
* elementwise blocks (casts, slices, the layer outputs, the assembled grads): the outer loops
  fused and parallel, the innermost left contiguous for LLVM to vectorise.

It fits a function with te.extern units (``fits.extern_units``).
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from ..fits import extern_units
from ..schedule_rule import ScheduleRule

__all__ = ["schedule", "RULE"]


def schedule(sch, target=None):
    for block in top_blocks(sch):
        loops = sch.get_loops(block)
        if not loops:
            for child in sch.get_child_blocks(block):
                unit_loops = sch.get_loops(child)
                if unit_loops:
                    sch.parallel(sch.fuse(*unit_loops) if len(unit_loops) > 1 else unit_loops[0])
            continue
        info = analyze(sch, block)
        if info.is_reduction:
            spatial = info.spatial_loops
            sch.reorder(*spatial, *info.reduce_loops)
            if spatial:
                sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])
            sch.decompose_reduction(block, info.reduce_loops[0])
        else:
            outer = loops[:-1] if len(loops) > 1 else loops
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return sch.mod


RULE = ScheduleRule("extern_units", schedule, extern_units)
