"""Elementwise CUDA rule: fuse every loop, 256 threads per block, one element per thread."""

from __future__ import annotations

from ._threads import bind_threads

THREADS = 256


def schedule(sch, loops) -> None:
    bind_threads(sch, loops, THREADS)
