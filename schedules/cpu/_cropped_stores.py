"""Cropping stores bounded by their loop instead of guarded per element.

A contraction's epilogue writes a tile of a padded extent back into the real output: its
innermost loop (``for ax in range(nb)``) carries the crop as the block predicate
``base + ax < bound``. LLVM vectorises such a loop with masked stores, which cost nothing with
AVX-512's mask registers but are slow AVX2 instructions (``vmaskmovps``: measured at 18 % of
an AVX2 depthwise conv2d grad on a Zen 4, almost twice its micro-kernel). Running the loop to
``min(nb, bound - base)`` without that test is the same computation, and LLVM vectorises it with
plain stores and a scalar remainder."""

from __future__ import annotations

import contextlib

import tvm_ffi
from tvm import ir, tirx
from tvm.s_tir import SBlockRealize
from tvm.sym import Analyzer, ProofStrength

from ..analysis import uses

__all__ = ["bound_cropped_stores"]


def bound_cropped_stores(sch, blocks, lanes):
    """``sch.mod`` with the innermost loop of each of ``blocks`` bounded by its crop: a serial
    loop from 0 of a constant extent above one vector (``lanes(dtype)`` of the block's output) whose
    block predicate has a conjunct ``base + loop_var < bound`` (base, bound free of the loop
    var) runs to ``max(0, min(extent, bound - base))``, that conjunct dropped, when what remains
    of the predicate is then free of the loop var (a test left per element would be vectorised
    with masks all the same). A loop of one vector keeps its test: a single masked store per
    row, where a loop of unknown trip count would add a runtime check and a scalar remainder."""
    shape_vars = _shape_vars(sch.mod[sch.func_working_on or "main"])
    bounded = []
    for block in blocks:
        loops = [sch.get(lp) for lp in sch.get_loops(block)]
        vector = lanes(str(sch.get(block).writes[0].source.dtype))
        if loops and (new := _bounded(loops, shape_vars, vector)) is not None:
            bounded.append(new)
    if not bounded:
        return sch.mod

    def replace(loop):
        return next((b for b in bounded if b.loop_var.same_as(loop.loop_var)), loop)

    return ir.IRModule({gv: tvm_ffi.structural_map(f, [(tirx.For, replace)], order="post")
                        for gv, f in sch.mod.functions.items()})


def _bounded(loops, shape_vars, vector: int):
    """The innermost of ``loops`` (outermost first) bounded by its crop, or None."""
    *outer, loop = loops
    realize = loop.body
    if (loop.kind != tirx.ForKind.SERIAL or not isinstance(loop.extent, tirx.IntImm)
            or loop.extent.value <= vector or not _is_zero(loop.min)
            or not isinstance(realize, SBlockRealize)):
        return None
    var = loop.loop_var
    with _inside(outer, shape_vars) as analyzer:
        terms = _conjuncts(realize.predicate)
        for k, term in enumerate(terms):
            if not isinstance(term, tirx.LT):
                continue
            base = analyzer.simplify(term.a - var)
            if uses(base, var) or uses(term.b, var):
                continue
            extent = analyzer.simplify(tirx.max(tirx.min(loop.extent, term.b - base), 0))
            analyzer.bind(var, ir.Range.from_min_extent(loop.min, extent))
            rest = [analyzer.simplify(t) for t in terms[:k] + terms[k + 1:]
                    if not _holds(analyzer, t)]
            if any(uses(t, var) for t in rest):
                return None
            body = SBlockRealize(realize.iter_values, _conjunction(rest), realize.block)
            return tirx.For(var, loop.min, extent, loop.kind, body, loop.thread_binding,
                            loop.annotations)
    return None


@contextlib.contextmanager
def _inside(loops, shape_vars):
    """An Analyzer that knows what holds inside ``loops``: each loop var in its range, each
    loop's extent at least 1 and so each of its nonnegative factors (a fused loop over
    ``n * ((w + 7) // 8)`` runs only if ``(w + 7) // 8 >= 1``), shape vars nonnegative."""
    analyzer = Analyzer()
    with contextlib.ExitStack() as stack:
        for v in shape_vars:
            stack.enter_context(analyzer.constraint_scope(v >= 0))
        for lp in loops:
            analyzer.bind(lp.loop_var, ir.Range.from_min_extent(lp.min, lp.extent))
            for factor in _factors(lp.extent):
                if analyzer.can_prove(factor >= 0):
                    stack.enter_context(analyzer.constraint_scope(factor >= 1))
        yield analyzer


def _holds(analyzer, term) -> bool:
    """Is ``term`` provably true (a disjunction: one of its terms), symbolic bounds allowed?"""
    if isinstance(term, tirx.Or):
        return _holds(analyzer, term.a) or _holds(analyzer, term.b)
    return analyzer.can_prove(term, ProofStrength.SYMBOLIC_BOUND)


def _shape_vars(func) -> list:
    """The symbolic dims of ``func``'s buffer parameters."""
    from tvm.tirx.buffer import is_buffer_var
    out = []
    for p in func.params:
        if is_buffer_var(p):
            for dim in p.ty.shape:
                if isinstance(dim, tirx.Var) and not any(dim.same_as(v) for v in out):
                    out.append(dim)
    return out


def _is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == 0


def _factors(expr) -> list:
    if isinstance(expr, tirx.Mul):
        return _factors(expr.a) + _factors(expr.b)
    return [expr]


def _conjuncts(expr) -> list:
    if isinstance(expr, tirx.And):
        return _conjuncts(expr.a) + _conjuncts(expr.b)
    return [expr]


def _conjunction(terms):
    if not terms:
        return tirx.const(True, "bool")
    out = terms[0]
    for term in terms[1:]:
        out = tirx.And(out, term)
    return out
