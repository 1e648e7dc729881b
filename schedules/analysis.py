"""What schedule rules need to know about a block, read from the loop nest (never the op name)."""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import tirx

__all__ = ["BlockInfo", "analyze", "top_blocks", "root_block"]

_KIND = {0: "S", 2: "R"}   # tirx.IterVar kinds: kDataPar, kCommReduce


@dataclass
class BlockInfo:
    block: object            # SBlockRV
    name: str
    loops: list              # LoopRVs, outermost first
    loop_kinds: list[str]    # "S" (spatial), "R" (reduction) or "O" per loop
    row: bool                # a reduction whose innermost reduce loop walks contiguous memory

    @property
    def is_reduction(self) -> bool:
        return "R" in self.loop_kinds

    @property
    def spatial_loops(self):
        return [lp for lp, k in zip(self.loops, self.loop_kinds) if k == "S"]

    @property
    def reduce_loops(self):
        return [lp for lp, k in zip(self.loops, self.loop_kinds) if k == "R"]


def root_block(sch):
    """The function's root block (named "root" by TE, but after a lone te.extern stage)."""
    return sch.get_sblock(sch.mod[sch.func_working_on or "main"].body.block.name_hint)


def top_blocks(sch):
    return list(sch.get_child_blocks(root_block(sch)))


def analyze(sch, block) -> BlockInfo:
    """Loop kinds from the block's iter-var bindings; whether a reduction reads rows."""
    blk = sch.get(block)
    loops = list(sch.get_loops(block))
    bindings = _bindings(sch, block)
    kinds = []
    for lp in loops:
        var = sch.get(lp).loop_var
        kind = "O"
        for iv, value in bindings:
            if _uses(value, var):
                kind = _KIND.get(int(iv.iter_type), "O")
                break
        kinds.append(kind)
    row = False
    if "R" in kinds:
        reduce_vars = [iv.var for iv, _ in bindings if int(iv.iter_type) == 2]
        row = _last_index_uses(blk, reduce_vars)
    return BlockInfo(block, blk.name_hint, loops, kinds, row)


_get_realize = tvm_ffi.get_global_func("s_tir.schedule.GetSBlockRealize")


def _bindings(sch, block):
    """(IterVar, bound value) pairs of a block, from its SBlockRealize."""
    realize = _get_realize(sch, block)
    return list(zip(realize.block.iter_vars, realize.iter_values))


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _last_index_uses(blk, reduce_vars) -> bool:
    """Does a reduce var index the last dim of the biggest-rank buffer the block reads?"""
    regions = [r for r in blk.reads if len(r.region)]
    if not regions:
        return False
    best = max(regions, key=lambda r: len(r.region))
    last = best.region[-1].min
    return any(_uses(last, v) for v in reduce_vars)
