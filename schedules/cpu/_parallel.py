"""Parallel loop nests on the CPU: the steps every CPU rule builds on."""

from __future__ import annotations

from ..loops import fuse

__all__ = ["parallel", "spatial", "serial_reduction"]


def parallel(sch, loops):
    """Fuse ``loops`` into one parallel loop (one contiguous chunk per worker); -> that loop."""
    fused = fuse(sch, loops)
    sch.parallel(fused)
    return fused


def spatial(sch, loops) -> None:
    """The elementwise rule: the innermost loop stays a plain contiguous loop (LLVM vectorises
    it; fusing it with the others would put a div/mod in every element's index), the others
    run in parallel. A 1-D nest is parallel as a whole."""
    parallel(sch, loops[:-1] if len(loops) > 1 else loops)


def serial_reduction(sch, info) -> None:
    """A reduction parallel over its kept loops, each output reduced serially inside (its
    init split off, so that an empty reduction still writes zeros)."""
    if info.spatial_loops:
        parallel(sch, info.spatial_loops)
    sch.decompose_reduction(info.block, info.reduce_loops[0])
