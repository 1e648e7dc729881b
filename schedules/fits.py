"""Whether a pattern's rule fits a PrimFunc: the analysis its CPU and its CUDA form share.

Each ``misfit`` function takes a schedule of the unscheduled function and returns None when the
rule fits it, else why not. A rule built around particular blocks (its *anchor*: the contraction
of ``gemm_dense``, the ``attn.main`` blocks of ``attn_flash``, the te.extern units of
``fft_stages``, ...) needs them, found by their block annotations (set by the TE definitions,
``te.compute(..., attrs=...)``) or by the block structure; a function whose blocks are all
elementwise fits such a rule as well (a variant with nothing to reduce, e.g. a zero grad when an
optional input is absent: every rule gives its blocks the elementwise rule). Rules that are a
policy for every block (``red_rows`` for blocks without a role, ``annotated_loops``,
``gather_owners``, ``gather_sums``, ``separate_stages``) check what that policy needs (known
roles, one loop letter per loop, loops to bind).
"""

from __future__ import annotations

from .analysis import analyze, by_role, const_extent, loop_letters, top_blocks

__all__ = ["attention", "contraction", "streamable_elementwise", "fused_rows", "fft_units",
           "units_or_matmuls", "extern_units", "annotated_bodies", "per_plane_form",
           "loop_letters_match", "plane_loops", "loops_to_bind", "ROW_ROLES",
           "ROW_ROLE"]

# The block annotation by which the red_rows builders (te_defs/norm.py, softmax.py, loss.py)
# name a block's role, and the roles (schedules/red_rows_roles.py).
ROW_ROLE = "rows.role"
ROW_ROLES = ("reduce", "scalar", "output", "col_sum", "col_cast")
ATTENTION_ROLES = ("kv", "q", "bias")


def _name(sch, block) -> str:
    return sch.get(block).name_hint


def _elementwise(sch) -> bool:
    """Is every block a loop nest without reduction (no te.extern units either)?"""
    for block in top_blocks(sch):
        info = analyze(sch, block)
        if not info.loops or info.is_reduction or sch.get_child_blocks(block):
            return False
    return True


def _anchored(sch, found: bool, needs: str):
    if found or _elementwise(sch):
        return None
    return f"it schedules {needs}, and the function has none (nor is it elementwise only)"


def _units(sch) -> list:
    """The sblocks inside the function's loop-less te.extern wrappers (sequential units)."""
    out = []
    for block in top_blocks(sch):
        if not sch.get_loops(block):
            out += list(sch.get_child_blocks(block))
    return out


def streamable_elementwise(sch):
    """Elementwise blocks, each over one loop (a flat pointwise kernel) or over rows of a
    constant length (a streamed shape kernel, its rows' length baked in: tvmgrad/streaming.py)."""
    if not _elementwise(sch):
        return "it schedules elementwise blocks only, and the function has others"
    for block in top_blocks(sch):
        loops = analyze(sch, block).loops
        if len(loops) > 1 and const_extent(sch, loops[-1]) is None:
            return (f"it schedules flat blocks or rows of a constant length, and "
                    f"{_name(sch, block)!r} is neither")
    return None


def attention(sch):
    roles = by_role(sch, "attn.main")
    odd = [f"{_name(sch, b)!r} = {role!r}" for b, role in roles if role not in ATTENTION_ROLES]
    if odd:
        return f"attn.main {', '.join(odd)} is none of {', '.join(ATTENTION_ROLES)}"
    return _anchored(sch, bool(roles), "the attention blocks annotated 'attn.main' (kv, q, bias)")


def contraction(sch):
    """Tiled contractions, or (a dense op's per-plane form, te_defs/_conv_planes.py) annotated
    te.extern blocks, which the ``gather_owners`` rule schedules."""
    if per_plane_form(sch):
        return loop_letters_match(sch)
    return _anchored(sch, bool(by_role(sch, "dense.main")),
                     "tiled contractions (blocks annotated 'dense.main')")


def per_plane_form(sch) -> bool:
    """Is this a dense op's per-plane form (te_defs/_conv_planes.py): annotated te.extern bodies
    and no tiled contraction? The dense rules hand it to ``gather_owners``."""
    return not by_role(sch, "dense.main") and annotated_bodies(sch)


def annotated_bodies(sch) -> bool:
    """Has the function blocks written as annotated bodies (``tvmgrad.loops``)?"""
    return any(loop_letters(sch, b) is not None for b in top_blocks(sch, open_externs=True))


def fused_rows(sch):
    """Every ``rows.role`` is a known role (blocks without one are inlined, reduced on their
    own, or elementwise: a variant without rows fits)."""
    roles = by_role(sch, ROW_ROLE)
    odd = [f"{_name(sch, b)!r} = {role!r}" for b, role in roles if role not in ROW_ROLES]
    if odd:
        return f"{ROW_ROLE} {', '.join(odd)} is none of {', '.join(ROW_ROLES)}"
    return None


def fft_units(sch):
    return _anchored(sch, bool(_units(sch)), "butterfly stages (sblocks inside te.extern blocks)")


def extern_units(sch):
    return _anchored(sch, bool(_units(sch)), "sequential units (sblocks inside te.extern blocks)")


def units_or_matmuls(sch):
    matmuls = [b for b, kind in by_role(sch, "la.kind") if kind == "matmul"]
    return _anchored(sch, bool(_units(sch) or matmuls),
                     "sequential units (sblocks inside te.extern blocks) and matrix products "
                     "(blocks annotated la.kind = 'matmul')")


def loop_letters_match(sch):
    """Every block annotated ``tvmgrad.loops`` has one letter per surrounding loop."""
    for block in top_blocks(sch, open_externs=True):
        letters = loop_letters(sch, block)
        if letters is not None and len(letters) != len(sch.get_loops(block)):
            return (f"block {_name(sch, block)!r} is annotated tvmgrad.loops = {letters!r} but "
                    f"has {len(sch.get_loops(block))} loops")
    return None


def plane_loops(sch):
    """Every top-level block a spatial loop nest (its outermost loop: the planes)."""
    for block in top_blocks(sch):
        info = analyze(sch, block)
        if not info.loops or info.is_reduction:
            why = "is a reduction" if info.loops else "has no loop"
            return f"it runs each block's outermost loop over planes, and block {info.name!r} {why}"
    return None


def loops_to_bind(sch):
    """(CUDA) every top-level block has a loop to bind to threads."""
    for block in top_blocks(sch):
        if not sch.get_loops(block):
            return f"block {_name(sch, block)!r} has no loop to bind to CUDA threads"
    return None

