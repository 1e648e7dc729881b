"""LLVM rule for gathers that sum a few sources per output element (col2im, overlap-add of
frames/windows, overlapping as_strided views): the outer output loops run in parallel, each
element's short reduction loops run innermost and serially; a cast back to a half type follows
in the same parallel loop. Spatial blocks get the generic rule.
"""

from __future__ import annotations

from ..analysis import analyze, top_blocks
from . import _epilogue, _spatial


def schedule(sch, target=None):
    done = []
    for block in top_blocks(sch):
        if any(sch.get_sref(block).same_as(d) for d in done):
            continue
        info = analyze(sch, block)
        if not info.loops:
            continue
        if not info.is_reduction:
            _spatial(sch, info.loops)
            continue
        spatial = info.spatial_loops
        outer = spatial[:-1] if len(spatial) > 1 else spatial
        par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        sch.parallel(par)
        epilogue = _epilogue(sch, block)
        if epilogue is not None:
            sch.reverse_compute_at(epilogue, par)
            done.append(sch.get_sref(epilogue))
        sch.decompose_reduction(block, info.reduce_loops[0])
    return sch.mod
