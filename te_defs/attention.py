"""Attention grads: FlashAttention-2 style backward (flash_attn and its qkvpacked / unpadded /
varlen-qkvpacked / sparse-mask variants) and memory_efficient_attention (xformers / cutlass).

Math (per batch b, query head h, kv head kh = h // G with G = H / Hk, softmax scale s):

    P[i, j]  = exp(s·(q_i·k_j) + bias[i, j] − lse[i])     (0 where masked; lse: the forward's
    dP[i, j] = dO_i·v_j                                      float32 row logsumexp)
    Δ[i]     = dO_i·O_i
    dS[i, j] = P[i, j]·(dP[i, j] − Δ[i])
    dV_j = Σ_{g, i} P[i, j]·dO_i     dK_j = s·Σ_{g, i} dS[i, j]·q_i     dQ_i = s·Σ_j dS[i, j]·k_j
    (bias_grad = dS summed over bias's broadcast dims, memory_efficient_attention only)

How it is computed (never materialising an S x S matrix): float32 copies of q, dO (head-major,
[B, H, S, D]), K^T, V^T ([B, Hk, D, S]) and K ([B, Hk, S, D]), zero-padded to a multiple of 64
rows (GRAIN), plus Δ and lse per row. Then, in one of two forms:

* two passes (CUDA, and any function made outside ``one_pass``):
  - dK/dV: one tile of 64 keys per (b, kh) at a time; for every query head of the group and every
    block of query rows, the S, P, dP and dS tiles are recomputed from q, K and lse (never
    stored beyond the tile) and dK/dV accumulate in registers: one multi-output reduction over
    (g, i);
  - dQ: one tile of query rows per (b, h); for every block of keys the tiles are recomputed and
    dQ accumulates. Deterministic, no atomics, at the price of recomputing S and dP once more
    (7 tile products instead of 5).
* one pass (the CPU's: ``one_pass``, entered by tvmgrad.build for LLVM targets): the dK/dV
  kernel's own dS tiles also feed dQ (5 tile products, as FA2). FA2 adds them into dQ with
  atomics; here each (b, kh) worker runs every key tile of its kv head and so owns every dQ
  row of the group's query heads, which accumulate in place, in key order: deterministic, no
  atomics, no partial buffers. Its parallelism is B·Hk items (the two-pass form's is
  B·Hk·Sk/64): fewer (b, kv head) pairs than threads leave threads idle. Splitting the keys
  into chunks with a dQ partial each would lift that; shape-derived chunk counts made TVM
  hoist a division by a zero divisor (CSE) and, with symbolic sizes, build for minutes.

The schedules (schedules/{cpu,cuda}/attn_flash.py) tile these stages: on CUDA the q/dO tiles
and the P/dS tiles live in shared memory, S and dP in registers, the dK/dV/dQ accumulators in
registers; on the CPU every tile loop is vectorised along the contiguous axis and the (b, head,
tile) or (b, kv head) loop runs in parallel. Half types are read as float32
(accumulation in float32) and rounded once.
The TFLOP/s convention of FlashAttention: 2.5 · 4·B·S²·H·D flops per backward (5 products).

Semantics (Paddle 3.3.1 and its FlashAttention fork, PaddlePaddle/flash-attention; Paddle's CPU
build has no flash attention, the tests use an independent float64 reference of these rules):

* softmax scale: 1/sqrt(D) in float32 for flash_attn / qkvpacked / sparse-mask; the ``scale``
  attribute for the unpadded ops; memory_efficient_attention: ``scale``, or 1/sqrt(D) when it is
  negative.
* causal: key j is visible from query i iff j <= i (top-left aligned: the fork's
  apply_mask_causal uses col < row + 1 also when seqlen_q != seqlen_k); xformers'
  LowerTriangularMask likewise. Causal tiles are masked, not skipped.
* attn_mask (additive, the input's dtype, rank >= 4 with leading dims flattened into the batch):
  [B or 1, H or 1, Sq or 1, Sk]; added after scaling. memory_efficient_attention's bias:
  [Mq, Mk] or [B or 1, H or 1, Mq, Mk].
* flash_attn_with_sparse_mask: attn_mask_start_row_indices [B, Hm, Sk] (int32, Hm | H, mask head
  h // (H/Hm)): query row i does not see key j when i >= start[j]; with causal also when j > i,
  and the diagonal is never masked (the fork's apply_sparse_mask_causal). attn_mask_start_row
  is the kernel's promise that no start index is below it (checked).
* GQA: kv head = h // (H/Hk). flash_attn_qkvpacked: qkv [B, S, H/Hk + 2, Hk, D], Paddle views
  the query part as [B, S, H, D] with head h at group h // Hk, slot h % Hk, so query head h uses
  kv head h // (H/Hk) — exactly what Paddle's kernel computes.
* varlen (cu_seqlens, int32 [B + 1]): sequence b has len = cu[b+1] − cu[b] rows starting at row
  cu[b] (flash_attn_varlen_qkvpacked with varlen_padded: at b·max_seqlen); the padded rows'
  grads are zero. softmax_lse is [B, H, >= max_seqlen_q] or, for unpadded lse, [H, total_q].
* lse: a row whose lse is −inf counts as 0 (the fork treats a −inf max that way); rows or keys
  beyond the sequence get P = 0.
* dropout: not supported (ValueError): Paddle regenerates the forward's dropout mask inside its
  kernel from (seed, offset) with a Philox stream laid out along the fork's MMA tiles; reproducing
  it bit-exactly is not attempted. Dropout-free attention (and is_test) is fully supported;
  ``seed_offset`` is accepted and ignored.
* memory_efficient_attention's bias_grad when bias broadcasts: the sum over the broadcast dims
  (Paddle's kernel writes full-size strides into the smaller buffer).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass

import numpy as np

from tvmgrad.dtypes import FLOATS, dtype as as_dtype, to_compute
from tvmgrad.families.attention import Desc, attn_op, index_dtype
from tvmgrad.infer_meta import is_one
from tvmgrad.lazy import te, tirx

from ._plan import fail

__all__ = ["flash_attn_grad", "flash_attn_qkvpacked_grad", "flash_attn_unpadded_grad",
           "flash_attn_varlen_qkvpacked_grad", "flash_attn_with_sparse_mask_grad",
           "memory_efficient_attention_grad", "GRAIN", "MAX_HEAD_DIM"]

GRAIN = 64          # sequence dims of the tile stages are padded to a multiple of this
MAX_HEAD_DIM = 256  # FlashAttention's limit (and the CUDA tiles')

_ONE_PASS = contextvars.ContextVar("tvmgrad_attention_one_pass", default=False)


@contextlib.contextmanager
def one_pass():
    """Within: dQ is computed from the dK/dV kernel's own dS tiles (one pass, 5 tile products)
    rather than in a second kernel that recomputes them (7): for a target whose schedule runs
    the two reductions in one loop nest, each worker owning a (batch, kv head) and with it every
    dQ row of its query heads (the CPU's, schedules/cpu/attn_flash.py; CUDA keeps two passes)."""
    token = _ONE_PASS.set(True)
    try:
        yield
    finally:
        _ONE_PASS.reset(token)


# ------------------------------------------------------------------------------------------
# call checks shared by the variants

def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _call_sizes(call):
    """Element counts of every tensor of the call."""
    out = []
    for name, value in call.tensors.items():
        m = call.meta(name)
        for x in (m if isinstance(m, list) else [m]):
            if x is not None:
                out.append(_size(x.shape))
    return out


def _shape(call, name):
    m = call.meta(name)
    return None if m is None else tuple(m.shape)


def _float_dtype(call, names):
    """The one float dtype of ``names`` (present ones)."""
    first = None
    for n in names:
        m = call.meta(n) if n in call.tensors else None
        if m is None:
            continue
        if m.dtype.name not in FLOATS:
            raise TypeError(f"{call.op}: input {n!r} has dtype {m.dtype.name}; {call.op} supports "
                            f"{', '.join(FLOATS)}")
        if first is None:
            first = (n, m.dtype)
        elif m.dtype != first[1]:
            raise TypeError(f"{call.op}: input {n!r} has dtype {m.dtype.name} but {first[0]!r} has "
                            f"{first[1].name}; they must match")
    return first[1]


def _expect(call, name, shape, what=""):
    """``name`` must have ``shape``; ``what`` says where it comes from (the inputs it is read off)."""
    got = _shape(call, name)
    if got != tuple(shape):
        fail(call.op, f"input {name!r} must have shape {list(shape)}{what}, got {list(got)}")


def _seed(call, name):
    """The forward's (seed, offset) pair: int64 (or int32) of shape [2]; its values are not read."""
    _index_input(call, name, ("int64", "int32"))
    if _shape(call, name) != (2,):
        fail(call.op, f"input {name!r} must have shape [2] (the forward's seed and offset), got "
                       f"{list(_shape(call, name))}")


def _index_input(call, name, dtypes=("int32",)):
    m = call.meta(name)
    if m.dtype.name not in dtypes:
        raise TypeError(f"{call.op}: input {name!r} has dtype {m.dtype.name}; it must be "
                        f"{' or '.join(dtypes)}")
    return np.asarray(call.tensors[name]).astype(np.int64)


def _no_dropout(call, attr):
    p = float(call.attrs[attr])
    if p != 0.0:
        fail(call.op, f"attribute {attr!r} = {p} is not supported: the grad needs the forward's "
                       f"dropout mask, which Paddle regenerates inside its fused kernel from "
                       f"(seed, offset) with a tile-layout-dependent Philox stream; run the "
                       f"forward with dropout 0 (or is_test) to use tvmgrad's grad")


def _head_dim(call, name, d):
    if not 1 <= d <= MAX_HEAD_DIM:
        fail(call.op, f"input {name!r} has head_dim {d}; supported: 1..{MAX_HEAD_DIM}")


def _lse(call, name, B, H, rows, total=None, dt=None, dims="batch, num_heads, seqlen_q",
         data="q"):
    """lse view: [B, H, >= rows] (3-D) or [H, total] (2-D, unpadded lse). Its dtype: float32 (as
    Paddle's kernels store it) or the data's dtype ``dt``."""
    m = call.meta(name)
    allowed = ("float32",) if dt is None or dt.name == "float32" else ("float32", dt.name)
    if m.dtype.name not in allowed:
        raise TypeError(f"{call.op}: input {name!r} has dtype {m.dtype.name}; it must be "
                        f"{' or '.join(allowed)} (the forward's logsumexp of {data!r}, which is "
                        f"{dt.name if dt else 'float'})")
    s = tuple(m.shape)
    if len(s) == 3 and s[0] == B and s[1] == H and s[2] >= rows:
        return 3
    if total is not None and len(s) == 2 and s == (H, total):
        return 2
    alt = f" or [{H}, {total}] (unpadded lse)" if total is not None else ""
    fail(call.op, f"input {name!r} must be [{B}, {H}, >= {rows}]{alt} ({dims} of {data!r}), got "
                   f"{list(s)}")


def _mask_view(call, name, B, H, Sq, Sk):
    """Static broadcast pattern and view template of an additive mask [B|1, H|1, Sq|1, Sk]."""
    m = call.meta(name)
    if m is None:
        return None, None
    s = tuple(m.shape)
    if len(s) < 4:
        fail(call.op, f"input {name!r} must have rank >= 4 ([batch, heads, seqlen_q, seqlen_k], "
                       f"leading dims flattened into the batch), got {list(s)}")
    b = _size(s[:-3])
    h, q, k = s[-3:]
    if b not in (1, B) or h not in (1, H) or q not in (1, Sq) or k != Sk:
        fail(call.op, f"input {name!r} must be [{B} or 1, {H} or 1, {Sq} or 1, {Sk}], got "
                       f"{list(s)}")
    return (b != 1 or B == 1, h != 1 or H == 1, q != 1 or Sq == 1), (b, h, q, k)


def _cu(call, name, batch=None, like="cu_seqlens_q"):
    cu = _index_input(call, name)
    if cu.ndim != 1 or cu.shape[0] < 1:
        fail(call.op, f"input {name!r} must be 1-D [batch + 1], got {list(cu.shape)}")
    if batch is not None and cu.shape[0] != batch + 1:
        fail(call.op, f"input {name!r} must have {batch + 1} entries (as many as {like!r}), got "
                       f"{cu.shape[0]}")
    if (np.diff(cu) < 0).any() or (cu.size and cu[0] < 0):
        fail(call.op, f"input {name!r} must be non-decreasing and non-negative, got {cu.tolist()}")
    return cu


def _varlen_rows(call, cu_name, cu, max_len, rows, padded, what):
    lens = np.diff(cu)
    if lens.size and lens.max() > max_len:
        fail(call.op, f"input {cu_name!r} has a sequence of {int(lens.max())} rows, more than "
                       f"{what} = {max_len}")
    if padded:
        if (cu.shape[0] - 1) * max_len > rows:
            fail(call.op, f"varlen_padded needs batch·{what} = {(cu.shape[0] - 1) * max_len} "
                           f"rows, the packed input has {rows}")
    elif cu.size and cu[-1] > rows:
        fail(call.op, f"input {cu_name!r} ends at row {int(cu[-1])} but the packed input has "
                       f"{rows} rows")
    elif max_len > rows:
        fail(call.op, f"attribute {what!r} = {max_len} exceeds the {rows} rows of the packed "
                       f"input (no sequence can be longer)")


# ------------------------------------------------------------------------------------------
# the core: sources, the dK/dV kernel, the dQ kernel

@dataclass
class Core:
    """Accessors of one attention problem in padded (b, i, h, d) space; every accessor returns
    the compute dtype and is only called with in-range indices (or under a validity guard)."""

    B: object
    H: object            # query heads = Hk·G
    Hk: object
    G: int
    D: int               # q/k head dim
    Dv: int              # v head dim
    Sq: object           # rows per sequence (padded space extent)
    Sk: object
    cdt: str
    q: object            # (b, i, h, d) -> value
    k: object            # (b, j, kh, d)
    v: object            # (b, j, kh, d)
    o: object            # (b, i, h, d)
    do: object           # (b, i, h, d)
    lse: object          # (b, h, i) -> lse (compute dtype)
    scale: object        # expression
    len_q: object = None  # (b) -> rows of sequence b (None: Sq)
    len_k: object = None
    mask_add: object = None   # (b, h, i, j) -> additive term (clamped indices)
    masked: object = None     # (b, h, i, j) -> bool: hidden (causal / sparse)


def _ceil(ctx, x, g=GRAIN):
    return (x + ctx.const(g - 1)) // ctx.const(g) * ctx.const(g)


def _exp(x, cdt):
    """exp(x). float32: a vectorisable Cephes-style expf (range reduction by ln 2, degree-6
    polynomial, 2^n by exponent bits; about 1 ulp; values below ~1.2e-38 flush to 0, above ~2.4e38 give inf, ±inf and NaN
    as expf) — LLVM would otherwise call libm's expf once per lane; float64: tirx.exp."""
    if cdt != "float32":
        return tirx.exp(x)
    c = lambda v: tirx.const(v, "float32")  # noqa: E731
    hi, lo = 88.3762626647949, -87.3365447505531
    xc = tirx.max(tirx.min(x, c(hi)), c(lo))
    n = tirx.floor(xc * c(1.44269504088896341) + c(0.5))
    r = xc - n * c(0.693359375) + n * c(2.12194440e-4)
    p = c(1.9875691500e-4)
    for coef in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                 5.0000001201e-1):
        p = p * r + c(coef)
    y = p * r * r + r + c(1.0)
    two_n = tirx.reinterpret("float32", (n.astype("int32") + tirx.const(127, "int32"))
                             << tirx.const(23, "int32"))
    y = y * two_n
    # NaN by its bits (exponent all ones, mantissa not zero): tirx.isnan makes TVM's vectoriser
    # scalarise the whole loop, and ``x != x`` is simplified to false
    magnitude = tirx.reinterpret("int32", x) & tirx.const(0x7FFFFFFF, "int32")
    nan = magnitude > tirx.const(0x7F800000, "int32")
    return tirx.Select(x > c(hi), c(float("inf")),
                       tirx.Select(x < c(lo), c(0.0), tirx.Select(nan, x, y)))


def _clamp(ctx, i, n):
    """i clamped into [0, n) (0 when n == 0; the value is then guarded anyway)."""
    return tirx.max(tirx.min(i, n - ctx.const(1)), ctx.const(0))


def _core(ctx, c: Core, want_dq=True, want_dkv=True, bias_grad=None):
    """Returns dQ [B, H, Sqp, D], dK [B, Hk, Skp, D], dV [B, Hk, Skp, Dv] (compute dtype, padded
    rows zero) and, with ``bias_grad = (shape, bcast_b, bcast_h, out_dtype)``, the bias grad."""
    cdt = c.cdt
    f0 = tirx.const(0, cdt)
    G, D, Dv = c.G, c.D, c.Dv
    Gc = ctx.const(G)
    Sqp, Skp = _ceil(ctx, c.Sq), _ceil(ctx, c.Sk)
    fused = want_dq and want_dkv and _ONE_PASS.get()
    len_q = c.len_q or (lambda b: c.Sq)
    len_k = c.len_k or (lambda b: c.Sk)
    ok_q = lambda b, i: i < len_q(b)  # noqa: E731
    ok_k = lambda b, j: j < len_k(b)  # noqa: E731

    def guard(ok, value):
        return tirx.if_then_else(ok, value, f0)

    qs = te.compute((c.B, c.H, Sqp, ctx.const(D)), lambda b, h, i, d: guard(
        ok_q(b, i), c.q(b, i, h, d)), name="attn_qs", attrs={"attn.src": "q"})
    dos = te.compute((c.B, c.H, Sqp, ctx.const(Dv)), lambda b, h, i, d: guard(
        ok_q(b, i), c.do(b, i, h, d)), name="attn_dos", attrs={"attn.src": "do"})
    rd = te.reduce_axis((ctx.const(0), ctx.const(Dv)), name="rd")
    delta = te.compute((c.B, c.H, Sqp), lambda b, h, i: te.sum(
        dos[b, h, i, rd] * guard(ok_q(b, i), c.o(b, i, h, rd)), axis=rd), name="attn_delta",
        attrs={"attn.src": "delta"})
    inf = tirx.const(float("inf"), cdt)
    ninf = tirx.const(float("-inf"), cdt)

    def lse_row(b, h, i):
        v = c.lse(b, h, i)
        return tirx.if_then_else(ok_q(b, i), tirx.Select(v == ninf, f0, v), inf)

    lset = te.compute((c.B, c.H, Sqp), lse_row, name="attn_lse", attrs={"attn.src": "lse"})
    kT = te.compute((c.B, c.Hk, ctx.const(D), Skp), lambda b, h, d, j: guard(
        ok_k(b, j), c.k(b, j, h, d)), name="attn_kT", attrs={"attn.src": "kT"})
    vT = te.compute((c.B, c.Hk, ctx.const(Dv), Skp), lambda b, h, d, j: guard(
        ok_k(b, j), c.v(b, j, h, d)), name="attn_vT", attrs={"attn.src": "vT"})

    def probs(S, b, h, i, j):
        z = S * c.scale
        if c.mask_add is not None:
            z = z + c.mask_add(b, h, i, j)
        visible = tirx.all(ok_k(b, j), ok_q(b, i))
        if c.masked is not None:
            visible = tirx.all(visible, tirx.Not(c.masked(b, h, i, j)))
        return tirx.Select(visible, _exp(z - lset[b, h, i], cdt), f0)

    def tiles(tag):
        """S, dP (reductions over the head dims), P and dS for one kernel (tagged stages)."""
        r1 = te.reduce_axis((ctx.const(0), ctx.const(D)), name=f"rs_{tag}")
        r2 = te.reduce_axis((ctx.const(0), ctx.const(Dv)), name=f"rp_{tag}")
        shape = (c.B, c.H, Sqp, Skp)
        S = te.compute(shape, lambda b, h, i, j: te.sum(qs[b, h, i, r1] * kT[b, h // Gc, r1, j],
                                                        axis=r1),
                       name=f"attn_S_{tag}", attrs={"attn.tile": "S"})
        dP = te.compute(shape, lambda b, h, i, j: te.sum(dos[b, h, i, r2] * vT[b, h // Gc, r2, j],
                                                         axis=r2),
                        name=f"attn_dP_{tag}", attrs={"attn.tile": "dP"})
        P = te.compute(shape, lambda b, h, i, j: probs(S[b, h, i, j], b, h, i, j),
                       name=f"attn_P_{tag}", attrs={"attn.tile": "P"})
        dS = te.compute(shape, lambda b, h, i, j: P[b, h, i, j] * (dP[b, h, i, j] - delta[b, h, i]),
                        name=f"attn_dS_{tag}", attrs={"attn.tile": "dS"})
        return P, dS

    out = {}
    if want_dkv:
        P, dS = tiles("kv")
        out["dk"], out["dv"] = _dkv(ctx, c, P, dS, qs, dos, Sqp, Skp)
    if want_dq:
        ks = te.compute((c.B, c.Hk, Skp, ctx.const(D)), lambda b, h, j, d: guard(
            ok_k(b, j), c.k(b, j, h, d)), name="attn_ks", attrs={"attn.src": "k"})
        if not fused:          # one pass: the dK/dV kernel's own dS tiles
            P, dS = tiles("q")
        rj = te.reduce_axis((ctx.const(0), Skp), name="rj")
        dq_acc = te.compute((c.B, c.H, Sqp, ctx.const(D)), lambda b, h, i, d: te.sum(
            dS[b, h, i, rj] * ks[b, h // Gc, rj, d], axis=rj), name="attn_dq",
            attrs={"attn.main": "q", "attn.d": D, "attn.dv": Dv, "attn.one_pass": int(fused)})
        out["dq"] = te.compute((c.B, c.H, Sqp, ctx.const(D)),
                               lambda b, h, i, d: dq_acc[b, h, i, d] * c.scale,
                               name="attn_dq_out", attrs={"attn.epilogue": "q"})
    if bias_grad is not None:
        out["bias"] = _bias_grad(ctx, c, qs, dos, kT, vT, delta, probs, bias_grad)
    return out


def _dkv(ctx, c: Core, P, dS, qs, dos, Sqp, Skp):
    """(dK, dV) [B, Hk, Skp, D / Dv]: one multi-output reduction over (g, i) per key."""
    D, Dv = c.D, c.Dv
    Dm = max(D, Dv)
    Gc = ctx.const(c.G)
    rg = te.reduce_axis((ctx.const(0), Gc), name="rg")
    ri = te.reduce_axis((ctx.const(0), Sqp), name="ri")
    pair = te.comm_reducer(lambda x, y: (x[0] + y[0], x[1] + y[1]),
                           lambda t0, t1: (tirx.const(0, t0), tirx.const(0, t1)),
                           name="pair_sum")

    def kv(b, kh, j, d):
        h = kh * Gc + rg
        dq_ = d if D == Dm else tirx.min(d, ctx.const(D - 1))
        dv_ = d if Dv == Dm else tirx.min(d, ctx.const(Dv - 1))
        return pair((dS[b, h, ri, j] * qs[b, h, ri, dq_], P[b, h, ri, j] * dos[b, h, ri, dv_]),
                    axis=[rg, ri])

    dk_acc, dv_acc = te.compute((c.B, c.Hk, Skp, ctx.const(Dm)), kv, name="attn_dkv",
                                attrs={"attn.main": "kv", "attn.d": D, "attn.dv": Dv})
    dk = te.compute((c.B, c.Hk, Skp, ctx.const(D)), lambda b, h, j, d: dk_acc[b, h, j, d] * c.scale,
                    name="attn_dk", attrs={"attn.epilogue": "kv"})
    dv = te.compute((c.B, c.Hk, Skp, ctx.const(Dv)), lambda b, h, j, d: dv_acc[b, h, j, d],
                    name="attn_dv", attrs={"attn.epilogue": "kv"})
    return dk, dv


def _bias_grad(ctx, c: Core, qs, dos, kT, vT, delta, probs, spec):
    """bias_grad[bb, hb, i, j] = Σ dS[b, h, i, j] over the bias's broadcast batch/head dims."""
    shape, bcast_b, bcast_h, storage = spec
    D, Dv = c.D, c.Dv
    r1 = te.reduce_axis((ctx.const(0), ctx.const(D)), name="rs_b")
    r2 = te.reduce_axis((ctx.const(0), ctx.const(Dv)), name="rp_b")
    Sqp, Skp = _ceil(ctx, c.Sq), _ceil(ctx, c.Sk)
    full = (c.B, c.H, Sqp, Skp)
    Gc = ctx.const(c.G)
    S = te.compute(full, lambda b, h, i, j: te.sum(qs[b, h, i, r1] * kT[b, h // Gc, r1, j], axis=r1),
                   name="attn_S_b", attrs={"attn.tile": "S"})
    dP = te.compute(full, lambda b, h, i, j: te.sum(dos[b, h, i, r2] * vT[b, h // Gc, r2, j], axis=r2),
                    name="attn_dP_b", attrs={"attn.tile": "dP"})
    dS = te.compute(full, lambda b, h, i, j: probs(S[b, h, i, j], b, h, i, j)
                    * (dP[b, h, i, j] - delta[b, h, i]), name="attn_dS_b", attrs={"attn.tile": "dS"})
    rb = te.reduce_axis((ctx.const(0), c.B if bcast_b else ctx.const(1)), name="rb")
    rh = te.reduce_axis((ctx.const(0), c.H if bcast_h else ctx.const(1)), name="rh")
    lead = len(shape) - 2

    def body(*idx):
        i, j = idx[-2], idx[-1]
        if lead == 2:
            b = rb if bcast_b else idx[0] + rb
            h = rh if bcast_h else idx[1] + rh
        else:
            b, h = rb, rh
        return te.sum(dS[b, h, i, j], axis=[rb, rh])

    acc = te.compute(shape, body, name="attn_dbias", attrs={"attn.main": "bias"})
    return te.compute(shape, lambda *i: acc(*i).astype(storage), name="bias_grad",
                      attrs={"attn.epilogue": "bias"})


# ------------------------------------------------------------------------------------------
# accessors of the layouts

def _dtype(e) -> str:
    return str(e.ty)


def _as(e, dt: str):
    return e if _dtype(e) == dt else e.astype(dt)


def _loader(t, dt):
    return lambda *idx: to_compute(t[tuple(idx)], dt)


def _mask_add(ctx, mask, bcast, dt, Sk):
    """(b, h, i, j) -> the additive mask's value (indices clamped into its view)."""
    if mask is None:
        return None
    keep_b, keep_h, keep_q = bcast
    ld = _loader(mask, dt)
    z = ctx.const(0)

    def add(b, h, i, j):
        return ld(b if keep_b else z, h if keep_h else z, _clamp(ctx, i, mask.shape[2]) if keep_q else z,
                  _clamp(ctx, j, Sk))
    return add


def _causal(b, h, i, j):
    return j > i


# ------------------------------------------------------------------------------------------
# flash_attn_grad

def _check_flash_padded(call, q_name="q", k_name="k", v_name="v", packed=False):
    op = call.op
    if packed:
        qkv = _shape(call, "qkv")
        if len(qkv) != 5:
            fail(op, f"input 'qkv' must be 5-D [batch, seqlen, num_heads/num_heads_k + 2, "
                      f"num_heads_k, head_dim], got {list(qkv)}")
        B, S, ng, Hk, D = qkv
        G = ng - 2
        Sq = Sk = S
        H = G * Hk
    else:
        q, k, v = _shape(call, q_name), _shape(call, k_name), _shape(call, v_name)
        for n, s in ((q_name, q), (k_name, k), (v_name, v)):
            if len(s) != 4:
                fail(op, f"input {n!r} must be 4-D [batch, seqlen, num_heads, head_dim], got "
                          f"{list(s)}")
        B, Sq, H, D = q
        Sk, Hk = k[1], k[2]
        _expect(call, k_name, (B, Sk, Hk, D), f" ({q_name!r}'s batch and head_dim)")
        _expect(call, v_name, (B, Sk, Hk, D), f" ({k_name!r}'s shape)")
        if Hk == 0 or H == 0 or H % Hk:      # (each kv head serves G >= 1 query heads)
            fail(op, f"q's num_heads {H} must be a positive multiple of k's num_heads {Hk}")
        G = H // Hk
    _head_dim(call, "qkv" if packed else q_name, D)
    src = "'qkv'" if packed else repr(q_name)
    _expect(call, "out", (B, Sq, H, D), f" (the shape of the query {src})")
    _expect(call, "out_grad", (B, Sq, H, D), f" (the shape of the query {src})")
    return B, Sq, Sk, H, Hk, G, D


def _describe_padded(call, outs, packed=False, sparse=False):
    names = (["qkv"] if packed else ["q", "k", "v"]) + ["out", "out_grad", "attn_mask"]
    dt = _float_dtype(call, names)
    _no_dropout(call, "dropout")
    B, Sq, Sk, H, Hk, G, D = _check_flash_padded(call, packed=packed)
    lse_rank = _lse(call, "softmax_lse", B, H, Sq, dt=dt, data="qkv" if packed else "q")
    _seed(call, "seed_offset")
    Hs = ("Hk", G)
    if packed:
        templates = {"qkv": ("B", "S", G + 2, "Hk", D), "out": ("B", "S", Hs, D)}
        sq, sk = "S", "S"
    else:
        templates = {"q": ("B", "Sq", Hs, D), "k": ("B", "Sk", "Hk", D), "v": ("B", "Sk", "Hk", D),
                     "out": ("B", "Sq", Hs, D)}
        sq, sk = "Sq", "Sk"
    templates["softmax_lse"] = ("B", Hs, "Lq")
    mask_info = None
    if not sparse:
        bcast, view = _mask_view(call, "attn_mask", B, H, Sq, Sk)
        if view is not None:
            templates["attn_mask"] = ("B" if bcast[0] else 1, Hs if bcast[1] else 1,
                                      sq if bcast[2] else 1, sk)
            mask_info = bcast
    else:
        templates["attn_mask_start_row_indices"] = _sparse_view(call, B, H, Sk, G)
        mask_info = ("sparse", templates["attn_mask_start_row_indices"][:2])
    templates["out_grad"] = templates["out"]
    scale = float(np.float32(1.0 / math.sqrt(D)))
    info = (("G", G), ("D", D), ("causal", bool(call.attrs["causal"])), ("mask", mask_info),
            ("scale", scale), ("lse_rank", lse_rank))
    idx = index_dtype(*_call_sizes(call), B * H * (Sq + GRAIN) * D, B * H * (Sq + GRAIN) * (Sk + GRAIN))
    return Desc(dt, templates, [], info, idx)


def _padded_core(ctx, dt, q, k, v, out, lse, out_grad, mask=None, sparse=None, packed=None):
    """Core of the padded layouts ([B, S, H, D] tensors, or packed qkv)."""
    info = ctx.info
    G, D = info["G"], info["D"]
    if packed is not None:
        B, S, _, Hk, _ = packed.shape
        Sq = Sk = S
        Gc = ctx.const(G)
        ld = _loader(packed, dt)
        qa = lambda b, i, h, d: ld(b, i, h // Hk, h % Hk, d)  # noqa: E731
        ka = lambda b, j, h, d: ld(b, j, Gc, h, d)  # noqa: E731
        va = lambda b, j, h, d: ld(b, j, Gc + ctx.const(1), h, d)  # noqa: E731
    else:
        B, Sq, _, _ = q.shape
        Sk, Hk = k.shape[1], k.shape[2]
        qa, ka, va = _loader(q, dt), _loader(k, dt), _loader(v, dt)
    H = Hk * ctx.const(G)
    cdt = dt.compute
    lse_ld = _loader(lse, as_dtype(str(lse.dtype)))
    masked = _causal if info["causal"] else None
    if sparse is not None:
        masked = _sparse_mask(ctx, sparse, H, Sk, info["causal"])
    core = Core(B=B, H=H, Hk=Hk, G=G, D=D, Dv=D, Sq=Sq, Sk=Sk, cdt=cdt, q=qa, k=ka, v=va,
                o=_loader(out, dt), do=_loader(out_grad, dt),
                lse=lambda b, h, i: lse_ld(b, h, i).astype(cdt),
                scale=tirx.const(info["scale"], cdt),
                mask_add=_mask_add(ctx, mask, info["mask"], dt, Sk) if mask is not None else None,
                masked=masked)
    return core, _core(ctx, core)


def _to_bshd(t, shape, storage, name):
    """[B, H, Sp, D] (padded rows) -> [B, S, H, D] in the output dtype."""
    return te.compute(shape, lambda b, i, h, d: t[b, h, i, d].astype(storage), name=name)


@attn_op(describe=_describe_padded)
def flash_attn_grad(q, k, v, out, softmax_lse, seed_offset, attn_mask, out_grad, dropout, causal,
                    ctx):
    """FlashAttention-2 backward, [B, S, H, D] layout (see the module docstring)"""
    dt = as_dtype(str(q.dtype))
    _, g = _padded_core(ctx, dt, q, k, v, out, softmax_lse, out_grad, mask=attn_mask)
    st = dt.storage
    return (_to_bshd(g["dq"], q.shape, st, "q_grad"), _to_bshd(g["dk"], k.shape, st, "k_grad"),
            _to_bshd(g["dv"], v.shape, st, "v_grad"))


@attn_op(describe=lambda call, outs: _describe_padded(call, outs, packed=True))
def flash_attn_qkvpacked_grad(qkv, out, softmax_lse, seed_offset, attn_mask, out_grad,
                              dropout, causal, ctx):
    """FlashAttention-2 backward on a packed qkv [B, S, H/Hk + 2, Hk, D]"""
    info = ctx.info
    dt = as_dtype(str(qkv.dtype))
    _, g = _padded_core(ctx, dt, None, None, None, out, softmax_lse, out_grad, mask=attn_mask,
                        packed=qkv)
    G = info["G"]
    Hk = qkv.shape[3]
    st = dt.storage

    def assemble(b, s, grp, kh, d):
        gq = g["dq"][b, tirx.min(grp, ctx.const(G - 1)) * Hk + kh, s, d]
        return tirx.Select(grp < ctx.const(G), gq, tirx.Select(
            grp == ctx.const(G), g["dk"][b, kh, s, d], g["dv"][b, kh, s, d])).astype(st)

    return te.compute(qkv.shape, assemble, name="qkv_grad")


# ------------------------------------------------------------------------------------------
# flash_attn_with_sparse_mask_grad

def _sparse_view(call, B, H, Sk, G):
    op = call.op
    m = call.meta("attn_mask_start_row_indices")
    if m.dtype.name != "int32":
        raise TypeError(f"{op}: input 'attn_mask_start_row_indices' has dtype {m.dtype.name}; it "
                        f"must be int32")
    s = tuple(m.shape)
    if len(s) < 3:
        fail(op, f"input 'attn_mask_start_row_indices' must have rank >= 3 ([batch, heads, "
                  f"seqlen_k]), got {list(s)}")
    b, hm, k = _size(s[:-2]), s[-2], s[-1]
    if b not in (1, B) or k != Sk or hm < 1 or H % hm:
        fail(op, f"input 'attn_mask_start_row_indices' must be [{B} or 1, heads dividing {H}, "
                  f"{Sk}], got {list(s)}")
    start = int(call.attrs["attn_mask_start_row"])
    if start < 0:
        fail(op, f"attribute 'attn_mask_start_row' must be >= 0, got {start}")
    idx = np.asarray(call.tensors["attn_mask_start_row_indices"])
    Sq = _shape(call, "q")[1]
    if idx.size and idx.max() > Sq:
        fail(op, f"input 'attn_mask_start_row_indices' holds {int(idx.max())}, out of range "
                  f"[0, {Sq}] (a start row of the {Sq} query rows of 'q', or {Sq}: none hidden)")
    if start > Sq:
        fail(op, f"attribute 'attn_mask_start_row' = {start} is out of range [0, {Sq}] (the "
                  f"query rows of 'q')")
    if idx.size and idx.min() < start:
        fail(op, f"attribute 'attn_mask_start_row' = {start} promises no start row below it, but "
                  f"'attn_mask_start_row_indices' holds {int(idx.min())}")
    return ("B" if b != 1 or B == 1 else 1, hm, "Sk")


def _sparse_mask(ctx, sm, H, Sk, causal):
    Bm, Hm = sm.shape[0], sm.shape[1]
    one_b = is_one(Bm)

    def masked(b, h, i, j):
        # int32 division: a 64-bit division by a runtime value is a GPU subroutine call
        hm = (h.astype("int32") // (H // Hm).astype("int32")).astype(ctx.index)
        start = sm[ctx.const(0) if one_b else b, hm, _clamp(ctx, j, Sk)].astype(ctx.index)
        below = i >= start
        if causal:
            return tirx.any(j > i, tirx.all(j < i, below))
        return below
    return masked


@attn_op(describe=lambda call, outs: _describe_padded(call, outs, sparse=True))
def flash_attn_with_sparse_mask_grad(q, k, v, attn_mask_start_row_indices, out, softmax_lse,
                                     seed_offset, out_grad, dropout, causal, attn_mask_start_row,
                                     ctx):
    """FlashAttention-2 backward with a row-start sparse mask (see the module docstring)"""
    dt = as_dtype(str(q.dtype))
    _, g = _padded_core(ctx, dt, q, k, v, out, softmax_lse, out_grad,
                        sparse=attn_mask_start_row_indices)
    st = dt.storage
    return (_to_bshd(g["dq"], q.shape, st, "q_grad"), _to_bshd(g["dk"], k.shape, st, "k_grad"),
            _to_bshd(g["dv"], v.shape, st, "v_grad"))


# ------------------------------------------------------------------------------------------
# varlen: flash_attn_unpadded_grad, flash_attn_varlen_qkvpacked_grad

def _describe_varlen(call, outs, packed=False):
    op = call.op
    names = (["qkv"] if packed else ["q", "k", "v"]) + ["out", "out_grad", "attn_mask"]
    dt = _float_dtype(call, names)
    _no_dropout(call, "dropout")
    mq, mk = int(call.attrs["max_seqlen_q"]), int(call.attrs["max_seqlen_k"])
    if mq < 0 or mk < 0:
        fail(op, f"attributes 'max_seqlen_q' and 'max_seqlen_k' must be >= 0, got {mq}, {mk}")
    padded = bool(call.attrs.get("varlen_padded", False))
    if packed:
        qkv = _shape(call, "qkv")
        if len(qkv) != 4:
            fail(op, f"input 'qkv' must be 4-D [total, num_heads/num_heads_k + 2, num_heads_k, "
                      f"head_dim], got {list(qkv)}")
        Tq, ng, Hk, D = qkv
        G = ng - 2
        H, Tk = G * Hk, Tq
        _head_dim(call, "qkv", D)
    else:
        q, k, v = _shape(call, "q"), _shape(call, "k"), _shape(call, "v")
        for n, s in (("q", q), ("k", k), ("v", v)):
            if len(s) != 3:
                fail(op, f"input {n!r} must be 3-D [total, num_heads, head_dim], got {list(s)}")
        Tq, H, D = q
        Tk, Hk = k[0], k[1]
        _expect(call, "k", (Tk, Hk, D), " ('q's head_dim)")
        _expect(call, "v", (Tk, Hk, D), " ('k's shape)")
        if Hk == 0 or H == 0 or H % Hk:      # (each kv head serves G >= 1 query heads)
            fail(op, f"q's num_heads {H} must be a positive multiple of k's num_heads {Hk}")
        G = H // Hk
        _head_dim(call, "q", D)
    src = "'qkv'" if packed else "'q'"
    _expect(call, "out", (Tq, H, D), f" (the shape of the query {src})")
    _expect(call, "out_grad", (Tq, H, D), f" (the shape of the query {src})")
    cq = _cu(call, "cu_seqlens_q")
    ck = _cu(call, "cu_seqlens_k", cq.shape[0] - 1)
    B = cq.shape[0] - 1
    _varlen_rows(call, "cu_seqlens_q", cq, mq, Tq, padded, "max_seqlen_q")
    _varlen_rows(call, "cu_seqlens_k", ck, mk, Tk, padded, "max_seqlen_k")
    lse_rank = _lse(call, "softmax_lse", B, H, mq, total=Tq, dt=dt,
                    dims="sequences, num_heads, max_seqlen_q", data="qkv" if packed else "q")
    _seed(call, "seed_offset")
    Hs = ("Hk", G)
    if packed:
        templates = {"qkv": ("Tq", G + 2, "Hk", D)}
    else:
        templates = {"q": ("Tq", Hs, D), "k": ("Tk", "Hk", D), "v": ("Tk", "Hk", D)}
    templates["cu_seqlens_q"] = ("Bp1",)
    templates["cu_seqlens_k"] = ("Bp1",)
    templates["out"] = ("Tq", Hs, D)
    templates["softmax_lse"] = ("Bl", Hs, "Lq") if lse_rank == 3 else (Hs, "Tq")
    mask_info = None
    bcast, view = _mask_view(call, "attn_mask", B, H, mq, mk)
    if view is not None:
        templates["attn_mask"] = ("Bl" if bcast[0] else 1, Hs if bcast[1] else 1,
                                  "max_seqlen_q" if bcast[2] else 1, "max_seqlen_k")
        mask_info = bcast
    templates["out_grad"] = templates["out"]
    scalars = [("max_seqlen_q", "int64", mq), ("max_seqlen_k", "int64", mk),
               ("scale", "float32" if dt.compute != "float64" else "float64",
                float(call.attrs["scale"]))]
    info = (("G", G), ("D", D), ("causal", bool(call.attrs["causal"])), ("mask", mask_info),
            ("lse_rank", lse_rank), ("padded", padded))
    idx = index_dtype(*_call_sizes(call), B * H * (mq + GRAIN) * D, B * H * (mq + GRAIN) * (mk + GRAIN),
                      B * Hk * (mk + GRAIN) * D)
    return Desc(dt, templates, scalars, info, idx)


def _varlen_core(ctx, dt, q, k, v, cu_q, cu_k, out, lse, out_grad, mask, mq, mk, scale,
                 packed=None):
    info = ctx.info
    G, D = info["G"], info["D"]
    cdt = dt.compute
    B = cu_q.shape[0] - ctx.const(1)
    padded = info["padded"]
    if packed is not None:
        Tq, _, Hk, _ = packed.shape
        Tk = Tq
        Gc = ctx.const(G)
        ld = _loader(packed, dt)
        qrow = lambda r, h, d: ld(r, h // Hk, h % Hk, d)  # noqa: E731
        krow = lambda r, h, d: ld(r, Gc, h, d)  # noqa: E731
        vrow = lambda r, h, d: ld(r, Gc + ctx.const(1), h, d)  # noqa: E731
    else:
        Tq, Tk, Hk = q.shape[0], k.shape[0], k.shape[1]
        qrow, krow, vrow = _loader(q, dt), _loader(k, dt), _loader(v, dt)
    H = Hk * ctx.const(G)
    cu = lambda t, b: t[b].astype(ctx.index)  # noqa: E731
    if padded:
        off_q = lambda b: b * mq  # noqa: E731
        off_k = lambda b: b * mk  # noqa: E731
    else:
        off_q = lambda b: cu(cu_q, b)  # noqa: E731
        off_k = lambda b: cu(cu_k, b)  # noqa: E731
    len_q = lambda b: cu(cu_q, b + ctx.const(1)) - cu(cu_q, b)  # noqa: E731
    len_k = lambda b: cu(cu_k, b + ctx.const(1)) - cu(cu_k, b)  # noqa: E731
    rq = lambda b, i: _clamp(ctx, off_q(b) + i, Tq)  # noqa: E731
    rk = lambda b, j: _clamp(ctx, off_k(b) + j, Tk)  # noqa: E731
    od, dod = _loader(out, dt), _loader(out_grad, dt)
    lse_ld = _loader(lse, as_dtype(str(lse.dtype)))
    if info["lse_rank"] == 3:
        lse_at = lambda b, h, i: lse_ld(b, h, _clamp(ctx, i, lse.shape[2])).astype(cdt)  # noqa: E731
    else:
        lse_at = lambda b, h, i: lse_ld(h, rq(b, i)).astype(cdt)  # noqa: E731
    core = Core(B=B, H=H, Hk=Hk, G=G, D=D, Dv=D, Sq=mq, Sk=mk, cdt=cdt,
                q=lambda b, i, h, d: qrow(rq(b, i), h, d),
                k=lambda b, j, h, d: krow(rk(b, j), h, d),
                v=lambda b, j, h, d: vrow(rk(b, j), h, d),
                o=lambda b, i, h, d: od(rq(b, i), h, d),
                do=lambda b, i, h, d: dod(rq(b, i), h, d),
                lse=lse_at, scale=_as(scale, cdt),
                len_q=len_q, len_k=len_k,
                mask_add=_mask_add(ctx, mask, info["mask"], dt, mk) if mask is not None else None,
                masked=_causal if info["causal"] else None)
    grads = _core(ctx, core)
    return grads, (Tq, Tk, B, off_q, off_k, len_q, len_k, padded, mq, mk)


def _unpack(ctx, grad, T, heads, D, B, off, length, padded, max_len, cu_t, storage, name):
    """Packed-layout grad [T, heads, D] from a padded [B, heads, Sp, D] one; rows in no
    sequence are zero."""
    zero = tirx.const(0, str(grad.dtype))
    if padded:
        def body(r, h, d):
            ml = tirx.max(max_len, ctx.const(1))
            b = r // ml
            i = r - b * ml
            bb = tirx.min(b, tirx.max(B - ctx.const(1), ctx.const(0)))
            ok = tirx.all(b < B, i < length(bb))
            return tirx.if_then_else(ok, grad[bb, h, tirx.min(i, grad.shape[2] - ctx.const(1)), d],
                                     zero).astype(storage)
        return te.compute((T, heads, ctx.const(D)), body, name=name)
    rb = te.reduce_axis((ctx.const(1), B + ctx.const(1)), name=f"{name}_seg")
    seg = te.compute((T,), lambda r: te.sum(
        tirx.Select(cu_t[rb].astype(ctx.index) <= r, ctx.const(1), ctx.const(0)), axis=rb), name=f"{name}_owner")

    def body(r, h, d):
        b = tirx.min(seg[r], tirx.max(B - ctx.const(1), ctx.const(0)))
        i = r - off(b)
        ok = tirx.all(seg[r] < B + ctx.const(1), r >= off(b), i < length(b), B > ctx.const(0))
        return tirx.if_then_else(ok, grad[b, h, _clamp(ctx, i, grad.shape[2]), d], zero).astype(storage)
    return te.compute((T, heads, ctx.const(D)), body, name=name)


@attn_op(describe=_describe_varlen)
def flash_attn_unpadded_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, out, softmax_lse, seed_offset,
                             attn_mask, out_grad, max_seqlen_q, max_seqlen_k, scale, dropout,
                             causal, ctx):
    """FlashAttention-2 varlen backward: q [total_q, H, D], k/v [total_k, Hk, D], sequences by
    cu_seqlens (see the module docstring)"""
    info = ctx.info
    dt = as_dtype(str(q.dtype))
    g, (Tq, Tk, B, off_q, off_k, len_q, len_k, padded, mq, mk) = _varlen_core(
        ctx, dt, q, k, v, cu_seqlens_q, cu_seqlens_k, out, softmax_lse, out_grad, attn_mask,
        max_seqlen_q, max_seqlen_k, scale)
    D = info["D"]
    st = dt.storage
    H, Hk = q.shape[1], k.shape[1]
    return (_unpack(ctx, g["dq"], Tq, H, D, B, off_q, len_q, padded, mq, cu_seqlens_q, st, "q_grad"),
            _unpack(ctx, g["dk"], Tk, Hk, D, B, off_k, len_k, padded, mk, cu_seqlens_k, st, "k_grad"),
            _unpack(ctx, g["dv"], Tk, Hk, D, B, off_k, len_k, padded, mk, cu_seqlens_k, st, "v_grad"))


@attn_op(describe=lambda call, outs: _describe_varlen(call, outs, packed=True))
def flash_attn_varlen_qkvpacked_grad(qkv, cu_seqlens_q, cu_seqlens_k, out, softmax_lse,
                                     seed_offset, attn_mask, out_grad, max_seqlen_q, max_seqlen_k,
                                     scale, dropout, causal, varlen_padded, ctx):
    """FlashAttention-2 varlen backward on a packed qkv [total, H/Hk + 2, Hk, D]"""
    info = ctx.info
    dt = as_dtype(str(qkv.dtype))
    g, (Tq, Tk, B, off_q, off_k, len_q, len_k, padded, mq, mk) = _varlen_core(
        ctx, dt, None, None, None, cu_seqlens_q, cu_seqlens_k, out, softmax_lse, out_grad,
        attn_mask, max_seqlen_q, max_seqlen_k, scale, packed=qkv)
    G, D = info["G"], info["D"]
    Hk = qkv.shape[2]
    H = Hk * ctx.const(G)
    cdt = dt.compute
    dq = _unpack(ctx, g["dq"], Tq, H, D, B, off_q, len_q, padded, mq, cu_seqlens_q, cdt, "dq_packed")
    dk = _unpack(ctx, g["dk"], Tk, Hk, D, B, off_k, len_k, padded, mk, cu_seqlens_k, cdt, "dk_packed")
    dv = _unpack(ctx, g["dv"], Tk, Hk, D, B, off_k, len_k, padded, mk, cu_seqlens_k, cdt, "dv_packed")

    def assemble(r, grp, kh, d):
        gq = dq[r, tirx.min(grp, ctx.const(G - 1)) * Hk + kh, d]
        return tirx.Select(grp < ctx.const(G), gq, tirx.Select(
            grp == ctx.const(G), dk[r, kh, d], dv[r, kh, d])).astype(dt.storage)

    return te.compute(qkv.shape, assemble, name="qkv_grad")


def _rows_to_batch1(flat):
    return lambda b, r, h, d: flat[r, h, d]


# ------------------------------------------------------------------------------------------
# memory_efficient_attention_grad

def _describe_mea(call, outs):
    op = call.op
    dt = _float_dtype(call, ["query", "key", "value", "bias", "output", "output_grad"])
    _no_dropout(call, "dropout_p")
    q, k, v = _shape(call, "query"), _shape(call, "key"), _shape(call, "value")
    B, Mq, H, D = q
    Mk = k[1]
    Dv = v[3]
    _expect(call, "key", (B, Mk, H, D), " ('query's batch, heads and head_dim)")
    _expect(call, "value", (B, Mk, H, Dv), " ('key's batch, seqlen and heads)")
    _expect(call, "output", (B, Mq, H, Dv), " ('query's batch, seqlen, heads; 'value's head_dim)")
    _expect(call, "output_grad", (B, Mq, H, Dv), " (the shape of 'output')")
    _head_dim(call, "query", D)
    _head_dim(call, "value", Dv)
    cu_given = [call.tensors[n] is not None for n in ("cu_seqlens_q", "cu_seqlens_k")]
    if cu_given[0] != cu_given[1]:
        fail(op, "inputs 'cu_seqlens_q' and 'cu_seqlens_k' must be given together")
    varlen = cu_given[0]
    bias = call.meta("bias")
    if varlen and bias is not None:
        fail(op, "input 'bias' cannot be combined with cu_seqlens (as in Paddle)")
    scale = float(call.attrs["scale"])
    if scale < 0:
        scale = 1.0 / math.sqrt(D)
    sdt = "float64" if dt.compute == "float64" else "float32"
    templates = {"query": ("B", "Mq", "H", D), "key": ("B", "Mk", "H", D),
                 "value": ("B", "Mk", "H", Dv), "output": ("B", "Mq", "H", Dv)}
    scalars = [("scale", sdt, scale)]
    bias_info = None
    if varlen:
        if B != 1:
            fail(op, f"with cu_seqlens the batch of 'query' must be 1 (sequences are packed "
                      f"along dim 1), got {B}")
        cq = _cu(call, "cu_seqlens_q")
        ck = _cu(call, "cu_seqlens_k", cq.shape[0] - 1)
        mq, mk = int(call.attrs["max_seqlen_q"]), int(call.attrs["max_seqlen_k"])
        if mq <= 0 or mk <= 0:
            fail(op, f"attributes 'max_seqlen_q' and 'max_seqlen_k' must be positive with "
                      f"cu_seqlens, got {mq}, {mk}")
        _varlen_rows(call, "cu_seqlens_q", cq, mq, Mq, False, "max_seqlen_q")
        _varlen_rows(call, "cu_seqlens_k", ck, mk, Mk, False, "max_seqlen_k")
        nb = cq.shape[0] - 1
        _lse(call, "logsumexp", nb, H, mq, dt=dt, dims="sequences, num_heads, max_seqlen_q",
             data="query")
        templates["cu_seqlens_q"] = ("Bp1",)
        templates["cu_seqlens_k"] = ("Bp1",)
        templates["logsumexp"] = ("Bl", "H", "Lq")
        scalars += [("max_seqlen_q", "int64", mq), ("max_seqlen_k", "int64", mk)]
    else:
        _lse(call, "logsumexp", B, H, Mq, dt=dt, dims="batch, num_heads, seqlen", data="query")
        templates["logsumexp"] = ("B", "H", "Lq")
        if bias is not None:
            s = tuple(bias.shape)
            if len(s) == 2:
                if s != (Mq, Mk):
                    fail(op, f"input 'bias' must be [{Mq}, {Mk}] or [{B} or 1, {H} or 1, {Mq}, "
                              f"{Mk}], got {list(s)}")
                templates["bias"] = ("Mq", "Mk")
                bias_info = (True, True, 2)
            elif len(s) == 4 and s[0] in (1, B) and s[1] in (1, H) and s[2:] == (Mq, Mk):
                bb, bh = s[0] == 1 and B != 1, s[1] == 1 and H != 1
                templates["bias"] = (1 if s[0] == 1 else "B", 1 if s[1] == 1 else "H", "Mq", "Mk")
                bias_info = (bb, bh, 4)
            else:
                fail(op, f"input 'bias' must be [{Mq}, {Mk}] or [{B} or 1, {H} or 1, {Mq}, {Mk}], "
                          f"got {list(s)}")
    _seed(call, "seed_and_offset")
    templates["output_grad"] = templates["output"]
    info = (("D", D), ("Dv", Dv), ("causal", bool(call.attrs["causal"])), ("varlen", varlen),
            ("bias", bias_info))
    rows_q = int(call.attrs["max_seqlen_q"]) if varlen else Mq
    rows_k = int(call.attrs["max_seqlen_k"]) if varlen else Mk
    nbat = (call.meta("cu_seqlens_q").shape[0] - 1) if varlen else B
    idx = index_dtype(*_call_sizes(call), nbat * H * (rows_q + GRAIN) * max(D, Dv),
                      nbat * H * (rows_k + GRAIN) * max(D, Dv),
                      nbat * H * (rows_q + GRAIN) * (rows_k + GRAIN))
    if bias_info is not None:
        # int32 indices + the CPU tiling of the bias-grad tiles (splits with bounds predicates
        # under a fused parallel loop) computed wrong values in TVM 0.27; int64 is right
        idx = "int64"
    return Desc(dt, templates, scalars, info, idx)


@attn_op(describe=_describe_mea)
def memory_efficient_attention_grad(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, output,
                                    logsumexp, seed_and_offset, output_grad, max_seqlen_q,
                                    max_seqlen_k, causal, dropout_p, scale, ctx):
    """xformers memory-efficient attention backward: [B, M, H, K] layout, optional additive bias
    (its grad summed over broadcast dims) or cu_seqlens varlen packing (see the module docstring)"""
    info = ctx.info
    dt = as_dtype(str(query.dtype))
    cdt = dt.compute
    D, Dv = info["D"], info["Dv"]
    B, Mq, H, _ = query.shape
    Mk = key.shape[1]
    st = dt.storage
    sc = _as(scale, cdt)
    lse_ld = _loader(logsumexp, as_dtype(str(logsumexp.dtype)))
    ld = {n: _loader(t, dt) for n, t in (("q", query), ("k", key), ("v", value), ("o", output),
                                          ("do", output_grad))}
    masked = _causal if info["causal"] else None
    if not info["varlen"]:
        mask_add = None
        bias_spec = None
        if bias is not None:
            bb, bh, rank = info["bias"]
            bld = _loader(bias, dt)
            z = ctx.const(0)
            if rank == 2:
                mask_add = lambda b, h, i, j: bld(_clamp(ctx, i, Mq), _clamp(ctx, j, Mk))  # noqa: E731
            else:
                kb, kh = not is_one(bias.shape[0]), not is_one(bias.shape[1])
                mask_add = lambda b, h, i, j: bld(b if kb else z, h if kh else z,  # noqa: E731
                                                  _clamp(ctx, i, Mq), _clamp(ctx, j, Mk))
            bias_spec = (bias.shape, bb if rank == 4 else True, bh if rank == 4 else True, st)
        core = Core(B=B, H=H, Hk=H, G=1, D=D, Dv=Dv, Sq=Mq, Sk=Mk, cdt=cdt, q=ld["q"], k=ld["k"],
                    v=ld["v"], o=ld["o"], do=ld["do"],
                    lse=lambda b, h, i: lse_ld(b, h, i).astype(cdt), scale=sc,
                    mask_add=mask_add, masked=masked)
        g = _core(ctx, core, bias_grad=bias_spec)
        outs = (_to_bshd(g["dq"], query.shape, st, "query_grad"),
                _to_bshd(g["dk"], key.shape, st, "key_grad"),
                _to_bshd(g["dv"], value.shape, st, "value_grad"))
        return outs + (g.get("bias"),)
    # varlen: batch 1, sequences packed along dim 1
    nb = cu_seqlens_q.shape[0] - ctx.const(1)
    cu = lambda t, b: t[b].astype(ctx.index)  # noqa: E731
    off_q, off_k = (lambda b: cu(cu_seqlens_q, b)), (lambda b: cu(cu_seqlens_k, b))
    len_q = lambda b: cu(cu_seqlens_q, b + ctx.const(1)) - cu(cu_seqlens_q, b)  # noqa: E731
    len_k = lambda b: cu(cu_seqlens_k, b + ctx.const(1)) - cu(cu_seqlens_k, b)  # noqa: E731
    z = ctx.const(0)
    rq = lambda b, i: _clamp(ctx, off_q(b) + i, Mq)  # noqa: E731
    rk = lambda b, j: _clamp(ctx, off_k(b) + j, Mk)  # noqa: E731
    core = Core(B=nb, H=H, Hk=H, G=1, D=D, Dv=Dv, Sq=max_seqlen_q, Sk=max_seqlen_k, cdt=cdt,
                q=lambda b, i, h, d: ld["q"](z, rq(b, i), h, d),
                k=lambda b, j, h, d: ld["k"](z, rk(b, j), h, d),
                v=lambda b, j, h, d: ld["v"](z, rk(b, j), h, d),
                o=lambda b, i, h, d: ld["o"](z, rq(b, i), h, d),
                do=lambda b, i, h, d: ld["do"](z, rq(b, i), h, d),
                lse=lambda b, h, i: lse_ld(b, h, _clamp(ctx, i, logsumexp.shape[2])).astype(cdt),
                scale=sc, len_q=len_q, len_k=len_k, masked=masked)
    g = _core(ctx, core)
    parts = []
    for name, grad, T, heads, Dd, off, length, mx, cu_t, shape in (
            ("query_grad", g["dq"], Mq, H, D, off_q, len_q, max_seqlen_q, cu_seqlens_q, query.shape),
            ("key_grad", g["dk"], Mk, H, D, off_k, len_k, max_seqlen_k, cu_seqlens_k, key.shape),
            ("value_grad", g["dv"], Mk, H, Dv, off_k, len_k, max_seqlen_k, cu_seqlens_k, value.shape)):
        flat = _unpack(ctx, grad, T, heads, Dd, nb, off, length, False, mx, cu_t, st, f"{name}_rows")
        parts.append(te.compute(shape, _rows_to_batch1(flat), name=name))
    return parts[0], parts[1], parts[2], None
