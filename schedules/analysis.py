"""What schedule rules need to know about a block, read from the loop nest (never the op name)."""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import ir, tirx

__all__ = ["BlockInfo", "analyze", "top_blocks", "root_block", "annotations", "as_int",
           "const_extent", "loop_letters", "epilogue", "is_scheduled", "is_bound", "by_role",
           "indexed_by", "called_ops", "uses", "iter_bindings"]

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


def top_blocks(sch, open_externs: bool = False):
    """The root block's children. With ``open_externs`` the loop-less wrapper block of a
    te.extern is replaced by its children (recursively; a wrapper annotated with loop letters
    is itself a block to schedule): the sblocks a rule binds or parallelises."""
    blocks = list(sch.get_child_blocks(root_block(sch)))
    if not open_externs:
        return blocks
    out = []
    while blocks:
        block = blocks.pop(0)
        children = list(sch.get_child_blocks(block))
        if not sch.get_loops(block) and children and loop_letters(sch, block) is None:
            blocks[:0] = children
        else:
            out.append(block)
    return out


def annotations(sch, block) -> dict:
    """A block's annotations keyed by plain strings (the builders' ``attrs`` on te.compute)."""
    return {str(k): v for k, v in sch.get(block).annotations.items()}


def by_role(sch, key: str) -> list:
    """(block, role) of the top-level blocks annotated with ``key`` (a family's way of naming
    the blocks its schedule treats specially, e.g. ``attn.main`` = "kv"), in block order."""
    return [(b, str(annotations(sch, b)[key])) for b in top_blocks(sch) if key in annotations(sch, b)]


def as_int(value) -> int:
    """An integer annotation value (an IntImm, or a Python int)."""
    return int(value.value) if hasattr(value, "value") else int(value)


def const_extent(sch, loop):
    """A loop's extent as an int when it is a constant, else None (a symbolic size)."""
    ext = sch.get(loop).extent
    return int(ext.value) if hasattr(ext, "value") else None


def loop_letters(sch, block):
    """The ``tvmgrad.loops`` annotation (one letter per surrounding loop: ``p`` parallel, ``s``
    serial, ``v``/``i`` inner) of a block written as an annotated body, else None."""
    value = sch.get(block).annotations.get("tvmgrad.loops")
    return None if value is None else str(value)


def epilogue(sch, block):
    """The single non-reduction consumer of a block (e.g. the cast back to half of a
    reduction's float32 result), which a rule computes in the same loop, else None."""
    consumers = sch.get_consumers(block)
    if len(consumers) != 1 or analyze(sch, consumers[0]).is_reduction:
        return None
    return consumers[0]


def is_scheduled(sch, loops) -> bool:
    """Has a loop nest been scheduled already (parallel, vectorised, unrolled or bound)?"""
    return any(int(sch.get(lp).kind) != 0 for lp in loops)


def is_bound(sch, loops) -> bool:
    """Is a loop of the nest bound to a CUDA thread axis?"""
    return any(sch.get(lp).thread_binding is not None for lp in loops)


def analyze(sch, block) -> BlockInfo:
    """Loop kinds from the block's iter-var bindings; whether a reduction reads rows."""
    blk = sch.get(block)
    loops = list(sch.get_loops(block))
    bindings = iter_bindings(sch, block)
    kinds = []
    for lp in loops:
        var = sch.get(lp).loop_var
        kind = "O"
        for iv, value in bindings:
            if uses(value, var):
                kind = _KIND.get(int(iv.iter_type), "O")
                break
        kinds.append(kind)
    row = False
    if "R" in kinds:
        reduce_vars = [iv.var for iv, _ in bindings if int(iv.iter_type) == 2]
        row = _last_index_uses(blk, reduce_vars)
    return BlockInfo(block, blk.name_hint, loops, kinds, row)


_get_realize = tvm_ffi.get_global_func("s_tir.schedule.GetSBlockRealize")


def iter_bindings(sch, block):
    """(IterVar, bound value) pairs of a block, from its SBlockRealize."""
    realize = _get_realize(sch, block)
    return list(zip(realize.block.iter_vars, realize.iter_values))


# the fields that hold sub-expressions, across TIR's expression and store nodes
_OPERANDS = ("a", "b", "value", "args", "indices", "condition", "true_value", "false_value",
             "body", "base")


def called_ops(sch, block) -> set[str]:
    """Names of the intrinsics (``tirx.exp``, ...) that a block's body calls: what its
    arithmetic costs beyond loads, stores and plain operators."""
    names, stack = set(), [sch.get(block).body]
    while stack:
        node = stack.pop()
        if isinstance(node, ir.Call) and isinstance(node.op, ir.Op):
            names.add(node.op.name)
        for field in _OPERANDS:
            child = getattr(node, field, None)
            if isinstance(child, (list, tuple, tvm_ffi.Array)):
                stack.extend(child)
            elif child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
    return names


def uses(expr, var) -> bool:
    """Does ``var`` appear in ``expr``?"""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def indexed_by(region, var) -> bool:
    """Does ``var`` (e.g. a block iter var) appear in a buffer region's indices?"""
    return any(uses(r.min, var) for r in region.region)


def _last_index_uses(blk, reduce_vars) -> bool:
    """Does a reduce var index the last dim of the biggest-rank buffer the block reads?"""
    regions = [r for r in blk.reads if len(r.region)]
    if not regions:
        return False
    best = max(regions, key=lambda r: len(r.region))
    last = best.region[-1].min
    return any(uses(last, v) for v in reduce_vars)
