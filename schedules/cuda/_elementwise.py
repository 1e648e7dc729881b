"""Elementwise CUDA rule: fuse every loop, 256 threads per block, one element per thread."""

from __future__ import annotations

THREADS = 256


def schedule(sch, loops) -> None:
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
