"""Binding loop nests to CUDA threads, and the check that nothing is left unbound (an unbound
block would silently run on the host)."""

from __future__ import annotations

from ..analysis import is_bound, top_blocks
from ..loops import fuse

__all__ = ["bind_threads", "thread_per_output", "check_all_bound"]


def bind_threads(sch, loops, threads: int):
    """Fuse ``loops`` and split the result over thread blocks of ``threads`` threads
    (blockIdx.x × threadIdx.x); -> (block loop, thread loop)."""
    bx, tx = sch.split(fuse(sch, loops), [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    return bx, tx


def thread_per_output(sch, info, threads: int):
    """A reduction with one thread per output, each reducing serially (the reduced loops are
    short, or too few outputs for anything else to pay); -> (block loop, thread loop)."""
    spatial = info.spatial_loops
    if spatial:
        sch.reorder(*spatial, *info.reduce_loops)
    return bind_threads(sch, spatial or [sch.add_unit_loop(info.loops[0])], threads)


def check_all_bound(sch, blocks=None) -> None:
    """Raise unless every one of ``blocks`` (default: the top-level blocks) is bound."""
    for block in top_blocks(sch) if blocks is None else blocks:
        loops = sch.get_loops(block)
        if not is_bound(sch, loops):
            why = "is not bound to CUDA threads" if loops else "has no loop to bind"
            raise RuntimeError(f"block {sch.get(block).name_hint!r} {why}")
