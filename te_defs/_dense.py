"""TE helpers of tiled contractions, shared by the dense grads (matmul.py, conv.py) and the
Relax forward kernels (tvmgrad/relax/kernels.py).

A contraction stage ``C[..., m, ..., n] = sum_k A(.., m, k) * B(.., n, k)`` has one *M* axis
(the broadcast operand's rows, unrolled in the CPU micro-kernel) and one *N* axis (the vectorised
axis; its operand reads must be contiguous along it). Both are computed over extents padded to a
*grain* (``grain``: 64 for long axes, less for short ones; chosen when planning, in the key) and
every operand is read through a zero-padded copy (a *source*, marked ``SRC_ROOT`` / ``SRC_TILE``)
valid on the padded domain, so that no tile of any schedule needs a bounds check. The one
consumer of a contraction crops the padding and casts (its *epilogue*). The contraction stage
carries ``main_attrs``; the ``gemm_dense`` schedules tile it (register-blocked micro-kernel on
the CPU, shared-memory tiles on CUDA), see schedules/cpu/gemm_dense.py and
schedules/cuda/gemm_dense.py.

One thing the math takes from the target: a CPU micro-kernel of 6 rows (wherever they fit the
registers: AVX2, AVX-512, SSE) tiles a long M axis padded to a multiple of 6, not of 64
(``tile_row_grain``: ``gemm`` here, conv.py's channel-blocked data and filter grads). The build
says so while it makes a function for a CPU target's rules (``row_tiles``, entered by
tvmgrad.build.lower, which Relax's scheduling pass uses too); the plan and its key do not change
(the kernel cache keys the target), and a function made outside it (the one a tuning trace was
recorded on) keeps the grain, which the schedule then tiles with 4 rows.
"""

from __future__ import annotations

import contextlib
import contextvars

from tvmgrad.dtypes import to_compute
from tvmgrad.infer_meta import is_symbolic
from tvmgrad.lazy import te, tirx

__all__ = ["SRC_ROOT", "SRC_TILE", "PAD_K", "grain", "row_tiles", "tile_row_grain", "main_attrs",
           "ceil_to", "zero", "load", "store", "source", "gemm"]

SRC_ROOT = {"dense.src": "root"}    # an operand copy made once, before the contraction
SRC_TILE = {"dense.src": "tile"}    # an operand copy made per outer tile (a packed panel on CPU)

GRAINS = (4, 8, 16, 32, 64)
PAD_K = 16     # padding of a contraction's first reduction axis (the CUDA staging step)


def grain(n: int) -> int:
    """The padding granularity of a tiled axis of extent n (known when planning): 64 (the
    largest tile of any schedule) for long axes, the smallest grain holding n for short ones,
    so that a short axis is not computed 64 wide (a symbolic extent counts as long). Part of the
    kernel key."""
    if is_symbolic(n):
        return 64
    return next((g for g in GRAINS if g >= n), 64) if n < 48 else 64


_TILE_ROWS = contextvars.ContextVar("tvmgrad_dense_tile_rows", default=None)


@contextlib.contextmanager
def row_tiles(rows_of):
    """Within: contractions pad a long M axis (grain 64) to a multiple of ``rows_of(acc_dtype)``,
    the rows of the micro-kernel that will tile it, where that does not divide 64."""
    token = _TILE_ROWS.set(rows_of)
    try:
        yield
    finally:
        _TILE_ROWS.reset(token)


def tile_row_grain(gm: int, acc: str) -> int:
    """The padding grain of a contraction's M axis: ``gm``, or the rows of the micro-kernel
    the build announced (``row_tiles``) for a long axis that they do not divide."""
    rows_of = _TILE_ROWS.get()
    if rows_of is None or gm != max(GRAINS):
        return gm
    rows = rows_of(acc)
    return rows if gm % rows else gm


def main_attrs(m: int, n: int, gm: int, gn: int, order: str = "nm", gk: int = PAD_K,
               halo: tuple = ()) -> dict:
    """Block annotations of a contraction: its M and N axes (indices among its spatial axes),
    their padding grains (the extents are multiples; schedules tile within them), and which of
    the two tile loops is outer on the CPU (``nm``: each N panel once, its M tiles inside), and
    the padding grain of the reduction axis the CUDA schedule stages (its step divides it), and
    the outer spatial axes whose operand rows carry a halo (a conv's leading spatial dims: the
    CUDA grid indexes them directly so that TVM can bound the staged halo)."""
    return {"dense.main": 1, "dense.m": m, "dense.n": n, "dense.gm": gm, "dense.gn": gn,
            "dense.order": order, "dense.gk": gk, "dense.halo": list(halo)}


def ceil_to(x, t: int):
    """x rounded up to a multiple of the constant t (an index expr)."""
    if t == 1:
        return x
    return tirx.floordiv(x + (t - 1), t) * t


def zero(dt):
    return tirx.const(0, dt.compute)


def load(t, idx, dt):
    """An element of placeholder ``t`` in the compute dtype."""
    return to_compute(t[tuple(idx)], dt)


def store(dt, out_dtype=None):
    """The cast of a compute value to the storage dtype of the output."""
    target = out_dtype or dt.storage

    def cast(v):
        if not hasattr(v, "ty"):
            v = v.asobject()
        return v if str(v.ty) == target else v.astype(target)
    return cast


def source(name, shape, value, valid, acc, where="root"):
    """A zero-padded operand copy: ``value(idx)`` where ``valid(idx)``, else 0."""
    return te.compute(shape, lambda *i: te.if_then_else(valid(i), value(i), tirx.const(0, acc)),
                      name=name, attrs=SRC_TILE if where == "tile" else SRC_ROOT)


def gemm(name, batch, M, N, K, a, b, dt, gm, gn, *, b_src="tile", order="nm", acc=None,
         exact=True):
    """``C[*batch, m, n] = sum_k a(bi, m, k) · b(bi, n, k)``, M and N padded to their grains
    (``grain``; M to the micro-kernel's rows under ``row_tiles``), K to PAD_K.

    Both operands are read through zero-padded copies (sources): ``{name}_a[*batch, M', K']``
    (made once) and ``{name}_b[*batch, K', N']`` (contiguous along n; per N panel with
    ``b_src="tile"``, else once). Returns the contraction (compute dtype, shape
    ``(*batch, M', N')``); its one consumer crops and casts.

    With ``exact`` (the operands are float16 values, not products or sums of them) float16
    sources stay float16 and the contraction is annotated ``dense.tc``: the CUDA schedule runs
    it on tensor cores (WMMA 16x16x16, float32 accumulation) when its grains allow."""
    acc = acc or dt.compute
    gm = tile_row_grain(gm, acc)
    nbat = len(batch)
    Mp, Np, Kp = ceil_to(M, gm), ceil_to(N, gn), ceil_to(K, PAD_K)
    tc = exact and dt.name == "float16" and acc == "float32"
    sdt = "float16" if tc else acc
    asrc = source(f"{name}_a", (*batch, Mp, Kp),
                  lambda i: a(i[:nbat], i[-2], i[-1]).astype(sdt),
                  lambda i: tirx.all(i[-2] < M, i[-1] < K), sdt)
    bsrc = source(f"{name}_b", (*batch, Kp, Np),
                  lambda i: b(i[:nbat], i[-1], i[-2]).astype(sdt),
                  lambda i: tirx.all(i[-1] < N, i[-2] < K), sdt, where=b_src)
    k = te.reduce_axis((0, Kp), name=f"{name}_k")
    attrs = main_attrs(nbat, nbat + 1, gm, gn, order)
    if tc:
        attrs["dense.tc"] = 1
    return te.compute(
        (*batch, Mp, Np),
        lambda *i: te.sum(asrc[(*i[:nbat], i[-2], k)].astype(acc)
                          * bsrc[(*i[:nbat], k, i[-1])].astype(acc), axis=k),
        name=name, attrs=attrs)
