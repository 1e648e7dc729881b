"""Linear-algebra grads, and the batched (complex) matrix algebra in TE and TIR they are built from.

The ops are ``@linalg_op`` builders (tvmgrad/families/linalg.py: every tensor a batch of matrices
or vectors, its batch dims coalesced into broadcast groups); each takes ``ctx``, whose ``info``
(an ``LAInfo``) describes the batch layout that every helper here needs.

The builder works on ``Mx`` objects: lazy matrices indexed ``M(b, i, j)`` (``b``: the tuple of
batch group indices) that yield real scalars or ``Complex`` ones in the compute dtype; each holds
the ``ctx`` of the kernel being built and hands it on to the matrices made from it.
Transposes, conjugates, masks and elementwise combinations stay lazy; ``A @ B`` materialises a
batched product (``te.sum``); ``.m(name)`` materialises any matrix. Sequential algorithms run in
TIR through ``te.extern``: each writes one spatial sblock per independent unit (a batch element,
or a batch element and a right-hand-side column) with the sequential loops inside, so that the
``units_and_matmuls`` schedules bind the units to threads (CUDA) or parallel loops (CPU):

* ``trsm``: triangular solve op(A)·X = B, op ∈ {N, T, H}, lower/upper, unit diagonal;
* ``lu``: LU with partial pivoting (one unit per matrix), and ``lu_solve`` / ``lu_inverse``.

Complex numbers are stored as float pairs (a trailing dim of 2) and computed as ``Complex``.
"""

from __future__ import annotations

from tvmgrad.dtypes import DType, to_compute
from tvmgrad.families.complex import Complex
from tvmgrad.families.linalg import Core, linalg_op
from tvmgrad.lazy import te, tirx

from ._extern import CW, at_least_one, ceildiv, i64, scratch, units

__all__ = ["Mx", "inp", "vec", "sca", "finish", "finish_vec", "eye", "zeros", "trsm", "lu",
           "lu_solve", "scalar_of", "cmul", "cdiv", "cconj", "creal", "lift_to", "select"]


def _groups(ctx) -> list:
    """The batch groups' extents (size vars) of the kernel being built."""
    return [ctx.symbol(g) for g in ctx.info.groups]


# ------------------------------------------------------------------------------------------
# scalars

def lift_to(v, cplx: bool):
    """A scalar as Complex (``cplx``) or real."""
    if cplx and not isinstance(v, Complex):
        return Complex(v, tirx.const(0.0, str(v.ty)))
    return v


def cmul(a, b):
    if isinstance(a, Complex) or isinstance(b, Complex):
        if not isinstance(a, Complex):
            return Complex(a * b.re, a * b.im)
        return a * b
    return a * b


def cdiv(a, b):
    if isinstance(b, Complex):
        return lift_to(a, True) / b
    if isinstance(a, Complex):
        return Complex(a.re / b, a.im / b)
    return a / b


def cconj(a):
    return a.conj() if isinstance(a, Complex) else a


def creal(a):
    return a.re if isinstance(a, Complex) else a


def select(cond, a, b):
    if isinstance(a, Complex) or isinstance(b, Complex):
        a, b = lift_to(a, True), lift_to(b, True)
        return Complex(tirx.Select(cond, a.re, b.re), tirx.Select(cond, a.im, b.im))
    return tirx.Select(cond, a, b)


def _load(t, idx, dt: DType):
    if dt.lanes == 2:
        return Complex(to_compute(t(*idx, 0), dt), to_compute(t(*idx, 1), dt))
    return to_compute(t(*idx), dt)


def _bidx(b, mask):
    return [tirx.const(0, "int64") if m else bi for bi, m in zip(b, mask)]


# ------------------------------------------------------------------------------------------
# lazy matrices

class Mx:
    """A batch of ``rows`` x ``cols`` matrices: ``M(b, i, j)`` -> scalar in the compute dtype
    (``ctx``: the build context of the kernel it belongs to)."""

    def __init__(self, ctx, get, rows, cols, cplx: bool, tensor=None, cheap: bool = False,
                 direct: bool = False):
        self.ctx = ctx
        self.get, self.rows, self.cols, self.cplx, self.tensor = get, rows, cols, cplx, tensor
        self.cheap = cheap or tensor is not None     # a load (of a view): no arithmetic
        self.direct = direct or tensor is not None   # a row-major load of a buffer

    def __call__(self, b, i, j):
        return self.get(b, i, j)

    # -- views
    @property
    def T(self) -> "Mx":
        return Mx(self.ctx, lambda b, i, j: self.get(b, j, i), self.cols, self.rows, self.cplx, cheap=self.cheap)

    @property
    def H(self) -> "Mx":
        return Mx(self.ctx, lambda b, i, j: cconj(self.get(b, j, i)), self.cols, self.rows, self.cplx,
                  cheap=self.cheap)

    def conj(self) -> "Mx":
        return Mx(self.ctx, lambda b, i, j: cconj(self.get(b, i, j)), self.rows, self.cols, self.cplx,
                  cheap=self.cheap)

    def sub(self, r0, c0, rows, cols) -> "Mx":
        return Mx(self.ctx, lambda b, i, j: self.get(b, i + r0, j + c0), rows, cols, self.cplx, cheap=self.cheap)

    def band(self, lower: int | None = None, upper: int | None = None) -> "Mx":
        """Keep entries with ``j - i`` in ``[-lower, upper]`` (None: unbounded): tril(k) is
        band(upper=k), triu(k) is band(lower=-k)."""
        def get(b, i, j):
            conds = []
            if upper is not None:
                conds.append(j - i <= upper)
            if lower is not None:
                conds.append(i - j <= lower)
            v = self.get(b, i, j)
            return select(tirx.all(*conds), v, self.ctx.info.zero()) if conds else v
        return Mx(self.ctx, get, self.rows, self.cols, self.cplx)

    def tril(self, k: int = 0) -> "Mx":
        return self.band(upper=k)

    def triu(self, k: int = 0) -> "Mx":
        return self.band(lower=-k)

    def map(self, fn, cplx: bool | None = None) -> "Mx":
        """Elementwise ``fn(value, b, i, j)``."""
        return Mx(self.ctx, lambda b, i, j: fn(self.get(b, i, j), b, i, j), self.rows, self.cols,
                  self.cplx if cplx is None else cplx)

    # -- elementwise arithmetic
    def _bin(self, other, op):
        if isinstance(other, Mx):
            return Mx(self.ctx, lambda b, i, j: op(self.get(b, i, j), other.get(b, i, j)), self.rows,
                      self.cols, self.cplx or other.cplx)
        return Mx(self.ctx, lambda b, i, j: op(self.get(b, i, j), other), self.rows, self.cols,
                  self.cplx or isinstance(other, Complex))

    def __add__(self, other):
        return self._bin(other, lambda a, b: lift_to(a, isinstance(b, Complex)) + b
                         if not isinstance(a, Complex) else a + b)

    def __sub__(self, other):
        return self._bin(other, lambda a, b: lift_to(a, isinstance(b, Complex)) - b
                         if not isinstance(a, Complex) else a - b)

    def __mul__(self, other):
        return self._bin(other, cmul)

    def __neg__(self):
        return Mx(self.ctx, lambda b, i, j: -self.get(b, i, j), self.rows, self.cols, self.cplx)

    def __matmul__(self, other: "Mx") -> "Mx":
        return matmul(self, other)

    # -- materialisation
    def m(self, name: str) -> "Mx":
        """This matrix computed into a buffer (te.compute over the full batch)."""
        groups = _groups(self.ctx)
        cplx = self.cplx
        shape = groups + [self.rows, self.cols] + ([2] if cplx else [])
        nb = len(groups)

        def body(*idx):
            b, i, j = idx[:nb], idx[nb], idx[nb + 1]
            v = self.get(b, i, j)
            if cplx:
                v = lift_to(v, True)
                return tirx.Select(idx[-1] == 0, v.re, v.im)
            return v

        t = te.compute(shape, body, name=name)
        return tensor_mx(self.ctx, t, cplx)


def tensor_mx(ctx, t, cplx: bool, mask=None) -> Mx:
    """An Mx over a full-batch (or ``mask``-broadcast) compute-dtype tensor."""
    nb = len(ctx.info.groups)
    mask = mask or (False,) * nb

    def get(b, i, j):
        idx = _bidx(b, mask) + [i, j]
        return Complex(t(*idx, 0), t(*idx, 1)) if cplx else t(*idx)

    shape = t.shape
    return Mx(ctx, get, shape[nb], shape[nb + 1], cplx, tensor=t)


def inp(ctx, t, name: str) -> Mx:
    """An input matrix (a placeholder) as an Mx in the compute dtype."""
    la = ctx.info
    mask, dt = la.masks[name], la.dtypes[name]
    nb = len(la.groups)
    return Mx(ctx, lambda b, i, j: _load(t, _bidx(b, mask) + [i, j], dt), t.shape[nb], t.shape[nb + 1],
              dt.lanes == 2, cheap=True, direct=True)


def vec(ctx, t, name: str):
    """An input batch of vectors: ``(get(b, i) -> scalar, length)``."""
    la = ctx.info
    mask, dt = la.masks[name], la.dtypes[name]
    nb = len(la.groups)
    return (lambda b, i: _load(t, _bidx(b, mask) + [i], dt)), t.shape[nb]


def sca(ctx, t, name: str, lead=()):
    """An input batch of scalars (no trailing core dims; ``lead``: fixed leading indices, e.g.
    (1,) for slogdet's logabsdet row): ``get(b) -> scalar``."""
    la = ctx.info
    mask, dt = la.masks[name], la.dtypes[name]
    return lambda b: _load(t, [tirx.const(x, "int64") for x in lead] + _bidx(b, mask), dt)


def eye(ctx, n, cplx: bool = False) -> Mx:
    la = ctx.info
    return Mx(ctx, lambda b, i, j: lift_to(tirx.Select(i == j, la.one(), la.zero()), cplx), n, n, cplx)


def zeros(ctx, rows, cols, cplx: bool = False) -> Mx:
    return Mx(ctx, lambda b, i, j: lift_to(ctx.info.zero(), cplx), rows, cols, cplx)


def scalar_of(ctx, fn, name: str):
    """A per-batch scalar computed into a buffer: ``fn(b)`` -> value; returns ``get(b)``."""
    groups = _groups(ctx)
    nb = len(groups)
    probe = fn([tirx.const(0, "int64")] * nb)
    cplx = isinstance(probe, Complex)
    shape = groups + ([2] if cplx else [])

    def body(*idx):
        v = fn(idx[:nb])
        return tirx.Select(idx[-1] == 0, v.re, v.im) if cplx else v

    t = te.compute(shape if shape else [1], body if shape else (lambda _: fn([])), name=name)
    if not shape:
        return lambda b: t[0]
    return (lambda b: Complex(t(*b, 0), t(*b, 1))) if cplx else (lambda b: t(*b))


def matmul(a: Mx, b: Mx, name: str = "mm") -> Mx:
    """The batched product a @ b (a te.sum; complex products accumulate both parts). Operands that
    are not plain loads are computed into buffers first (else their arithmetic would run n times
    per element), and ``b`` always is unless it is a full-batch buffer itself, so that the
    innermost (column) loop reads it contiguously."""
    groups = _groups(a.ctx)
    if not a.cheap:
        a = a.m(f"{name}_a")
    if not b.direct:
        b = b.m(f"{name}_b")
    cplx = a.cplx or b.cplx
    nb = len(groups)
    k = te.reduce_axis((0, a.cols), name="k")
    shape = groups + [a.rows, b.cols] + ([2] if cplx else [])

    def body(*idx):
        bt, i, j = idx[:nb], idx[nb], idx[nb + 1]
        p = cmul(a(bt, i, k), b(bt, k, j))
        if cplx:
            p = lift_to(p, True)
            return te.sum(tirx.Select(idx[-1] == 0, p.re, p.im), axis=k)
        return te.sum(p, axis=k)

    t = te.compute(shape, body, name=name, attrs={"la.kind": "matmul"})
    return tensor_mx(a.ctx, t, cplx)


# ------------------------------------------------------------------------------------------
# outputs

def _finish(ctx, get, name: str):
    """The output ``name`` from ``get(b, *core_index)`` over the full batch: summed over the batch
    groups the output is broadcast along, in the output's storage dtype (complex: a trailing
    (re, im) dim)."""
    la = ctx.info
    dt = la.dtypes[name]
    mask = la.masks[name]
    groups = _groups(ctx)
    nb = len(groups)
    core = [ctx.symbol(d) if isinstance(d, str) else ctx.const(d) for d in la.out_core[name]]
    nc = len(core)
    cplx = dt.lanes == 2
    shape = [ctx.const(1) if mk else g for g, mk in zip(groups, mask)] + core \
        + ([2] if cplx else [])

    def value(b, idx):
        v = get(b, *idx[nb:nb + nc])
        if cplx:
            v = lift_to(v, True)
            return tirx.Select(idx[-1] == 0, v.re, v.im)
        return creal(v)

    if any(mask):
        raxes = {j: te.reduce_axis((0, groups[j]), name=f"rb{j}") for j in range(nb) if mask[j]}

        def body(*idx):
            b = [raxes[j] if mask[j] else idx[j] for j in range(nb)]
            return te.sum(value(b, idx), axis=list(raxes.values()))

        if dt.storage == dt.compute:
            return te.compute(shape, body, name=name)
        acc = te.compute(shape, body, name=f"{name}_acc")
        return te.compute(shape, lambda *idx: acc(*idx).astype(dt.storage), name=name)
    return te.compute(shape, lambda *idx: value(idx[:nb], idx).astype(dt.storage), name=name)


def finish(m: Mx, name: str):
    """The output ``name`` from a full-batch matrix (see ``_finish``)."""
    return _finish(m.ctx, m, name)


def finish_vec(ctx, get, name: str):
    """A vector output from ``get(b, i)`` (see ``_finish``)."""
    return _finish(ctx, get, name)


# ------------------------------------------------------------------------------------------
# sequential algorithms in TIR (te.extern + the TVMScript IR builder)

def _full(m: Mx, name: str) -> Mx:
    """``m`` as a full-batch compute-dtype buffer (materialised unless it already is one)."""
    return m if m.tensor is not None else m.m(name)


class _Buf:
    """Element access to an extern buffer (real, or complex pairs in a trailing dim)."""

    def __init__(self, buf, cplx: bool):
        from tvm.script.ir_builder import tirx as T
        self.buf, self.p, self.cplx = buf, T.buffer_proxy(buf), cplx

    def __getitem__(self, idx):
        idx = tuple(idx)
        if self.cplx:
            return Complex(self.p[idx + (0,)], self.p[idx + (1,)])
        return self.p[idx]

    def __setitem__(self, idx, v):
        idx = tuple(idx)
        if self.cplx:
            v = lift_to(v, True)
            self.p[idx + (0,)] = v.re
            self.p[idx + (1,)] = v.im
        else:
            self.p[idx] = v

    def region(self, *ranges):
        """A buffer region for T.reads/T.writes: ints/exprs are points, (lo, hi) pairs ranges."""
        sl = []
        for r in ranges:
            sl.append(slice(r[0], r[1]) if isinstance(r, tuple) else r)
        if self.cplx:
            sl.append(slice(0, 2))
        return self.buf[tuple(sl)]


class _Acc:
    """A local accumulator (real or complex) inside an sblock."""

    def __init__(self, dtype: str, cplx: bool, size: int = 1):
        from tvm.script.ir_builder import tirx as T
        self.cplx = cplx
        self.p = T.buffer_proxy(scratch((2 * size if cplx else size,), dtype))

    def get(self, i=0):
        return Complex(self.p[2 * i], self.p[2 * i + 1]) if self.cplx else self.p[i]

    def set(self, v, i=0):
        if self.cplx:
            v = lift_to(v, True)
            self.p[2 * i] = v.re
            self.p[2 * i + 1] = v.im
        else:
            self.p[i] = v


def _seq(n):
    from tvm.script.ir_builder import tirx as T
    return T.serial(tirx.const(0, "int64"), n)


def trsm(a: Mx, b: Mx, *, lower: bool, trans: str = "N", unit: bool = False, name: str = "trsm") -> Mx:
    """X with op(A)·X = B (A: n x n triangular, ``lower`` or upper, op: N, T or H; ``unit``: the
    diagonal is taken as 1). Two forms, chosen by ``ctx.on_cuda()``: on CUDA one sequential unit
    (a thread) per (batch, column of B), each walking its column; on the CPU one unit per (batch,
    strip of CW columns), whose rows are updated a whole strip at a time
    (X[i, strip] -= op(A)[i, j]·X[j, strip]: a contiguous loop that LLVM vectorises, where a
    column walk would be scalar loads strided by a row)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    ctx = a.ctx
    la, groups = ctx.info, _groups(ctx)
    cplx = a.cplx or b.cplx
    af, bf = _full(a if a.cplx == cplx else a, f"{name}_a"), _full(b, f"{name}_b")
    if cplx and not af.cplx:
        af = (a * lift_to(la.one(), True)).m(f"{name}_a")
    if cplx and not bf.cplx:
        bf = (b * lift_to(la.one(), True)).m(f"{name}_b")
    nb = len(groups)
    m_lower = lower if trans == "N" else not lower
    shape = groups + [bf.rows, bf.cols] + ([2] if cplx else [])
    on_cuda = ctx.on_cuda()

    def gen(ins, outs):
        A, B, X = _Buf(ins[0], cplx), _Buf(ins[1], cplx), _Buf(outs[0], cplx)
        n, k = ins[1].shape[nb], ins[1].shape[nb + 1]

        def m_at(bt, i, j):
            if trans == "N":
                return A[(*bt, i, j)]
            v = A[(*bt, j, i)]
            return cconj(v) if trans == "H" else v

        with IRBuilder() as cuda:
            with T.If(on_cuda == 1), T.Then():
                with units(name, list(ins[1].shape[:nb]) + [k]) as vs:
                    bt, c = vs[:nb], vs[nb]
                    T.reads(A.region(*bt, (0, n), (0, n)), B.region(*bt, (0, n), c))
                    T.writes(X.region(*bt, (0, n), c))
                    acc = _Acc(la.compute, cplx)
                    with _seq(n) as ii:
                        i = ii if m_lower else n - 1 - ii
                        acc.set(B[(*bt, i, c)])
                        with _seq(ii) as jj:
                            j = jj if m_lower else n - 1 - jj
                            acc.set(acc.get() - cmul(m_at(bt, i, j), X[(*bt, j, c)]))
                        X[(*bt, i, c)] = acc.get() if unit else cdiv(acc.get(), m_at(bt, i, i))
        with IRBuilder() as cpu:
            with T.If(on_cuda == 0), T.Then():
                strips = at_least_one(ceildiv(k, CW))    # (k = 0: one strip of width 0)
                with units(name, list(ins[1].shape[:nb]) + [strips]) as vs:
                    bt, c0 = vs[:nb], vs[nb] * i64(CW)
                    width = tirx.min(i64(CW), k - c0)
                    T.reads(A.region(*bt, (0, n), (0, n)), B.region(*bt, (0, n), (c0, c0 + width)))
                    T.writes(X.region(*bt, (0, n), (c0, c0 + width)))
                    acc = _Acc(la.compute, cplx, CW)
                    with _seq(n) as ii:
                        i = ii if m_lower else n - 1 - ii
                        with _seq(width) as cc:
                            acc.set(B[(*bt, i, c0 + cc)], cc)
                        with _seq(ii) as jj:
                            j = jj if m_lower else n - 1 - jj
                            with _seq(width) as cc:
                                x = X[(*bt, j, c0 + cc)]
                                acc.set(acc.get(cc) - cmul(m_at(bt, i, j), x), cc)
                        with _seq(width) as cc:
                            v = acc.get(cc)
                            X[(*bt, i, c0 + cc)] = v if unit else cdiv(v, m_at(bt, i, i))
        return tirx.SeqStmt([cuda.get(), cpu.get()])

    t = te.extern([shape], [af.tensor, bf.tensor], gen, name=name, dtype=[la.compute])
    return tensor_mx(ctx, t, cplx)


def _abs1(v):
    """LAPACK's pivot size: |x| (real) or |re| + |im| (complex, as izamax)."""
    if isinstance(v, Complex):
        return tirx.abs(v.re) + tirx.abs(v.im)
    return tirx.abs(v)


class LU:
    """P·A = L·U with partial pivoting (LAPACK getrf order): ``lu`` holds L (unit lower, below the
    diagonal) and U; row i of P·A is row ``perm[i]`` of A, ``iperm`` is the inverse permutation."""

    def __init__(self, ctx, lu_t, perm_t, iperm_t, cplx):
        self.lu = tensor_mx(ctx, lu_t, cplx)
        self.perm_t, self.iperm_t, self.cplx = perm_t, iperm_t, cplx

    def perm(self, b, i):
        return self.perm_t(*b, i)

    def iperm(self, b, i):
        return self.iperm_t(*b, i)


def lu(a: Mx, name: str = "lu", iperm: bool = False) -> LU:
    """LU factorisation with partial pivoting, one sequential unit per matrix (``iperm``: also the
    inverse permutation, which adjoint solves need; a buffer nothing reads must not be produced:
    TVM's buffer compaction shrinks it to nothing)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    ctx = a.ctx
    la, groups = ctx.info, _groups(ctx)
    cplx = a.cplx
    af = _full(a, f"{name}_a")
    nb = len(groups)
    n = af.rows
    shape = groups + [n, n] + ([2] if cplx else [])
    pshape = groups + [n]

    def gen(ins, outs):
        A, L = _Buf(ins[0], cplx), _Buf(outs[0], cplx)
        P = T.buffer_proxy(outs[1])
        IP = T.buffer_proxy(outs[2]) if iperm else None
        n = ins[0].shape[nb]
        with IRBuilder() as ib:
            with units(name, list(ins[0].shape[:nb])) as bt:
                T.reads(A.region(*bt, (0, n), (0, n)))
                T.writes(L.region(*bt, (0, n), (0, n)), *[o[(*bt, slice(0, n))] for o in outs[1:]])
                best = _Acc(la.compute, False)
                pidx = T.buffer_proxy(scratch((2,), "int64"))
                tmp = _Acc(la.compute, cplx)
                piv = _Acc(la.compute, cplx)
                with _seq(n) as i:
                    P[(*bt, i)] = i
                    with _seq(n) as j:
                        L[(*bt, i, j)] = A[(*bt, i, j)]
                with _seq(n) as j:
                    best.set(tirx.const(-1.0, la.compute))
                    pidx[0] = j
                    with _seq(n - j) as di:
                        v = _abs1(L[(*bt, j + di, j)])
                        with T.If(v > best.get()):
                            with T.Then():
                                best.set(v)
                                pidx[0] = j + di
                    with T.If(pidx[0] != j):
                        with T.Then():
                            with _seq(n) as c:
                                tmp.set(L[(*bt, j, c)])
                                L[(*bt, j, c)] = L[(*bt, pidx[0], c)]
                                L[(*bt, pidx[0], c)] = tmp.get()
                            pidx[1] = P[(*bt, j)]
                            P[(*bt, j)] = P[(*bt, pidx[0])]
                            P[(*bt, pidx[0])] = pidx[1]
                    piv.set(L[(*bt, j, j)])
                    with _seq(n - j - 1) as di:
                        i = j + 1 + di
                        tmp.set(cdiv(L[(*bt, i, j)], piv.get()))
                        L[(*bt, i, j)] = tmp.get()
                        with _seq(n - j - 1) as dc:
                            c = j + 1 + dc
                            L[(*bt, i, c)] = L[(*bt, i, c)] - cmul(tmp.get(), L[(*bt, j, c)])
                if iperm:
                    with _seq(n) as i:
                        IP[(*bt, P[(*bt, i)])] = i
        return ib.get()

    outs = te.extern([shape, pshape] + ([pshape] if iperm else []), [af.tensor], gen, name=name,
                     dtype=[la.compute, "int64"] + (["int64"] if iperm else []))
    return LU(ctx, outs[0], outs[1], outs[2] if iperm else None, cplx)


def lu_solve(f: LU, b: Mx, *, adjoint: bool = False, name: str = "lu_solve") -> Mx:
    """X with A·X = B (``adjoint``: A^H·X = B) from A's LU factors; one unit per (batch, column)."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    ctx = b.ctx
    la, groups = ctx.info, _groups(ctx)
    cplx = f.cplx or b.cplx
    if cplx and not b.cplx:
        b = b * lift_to(la.one(), True)
    bf = _full(b, f"{name}_b")
    nb = len(groups)
    shape = groups + [bf.rows, bf.cols] + ([2] if cplx else [])

    def gen(ins, outs):
        L, P, B, X = _Buf(ins[0], f.cplx), T.buffer_proxy(ins[1]), _Buf(ins[2], cplx), _Buf(outs[0], cplx)
        n, k = ins[2].shape[nb], ins[2].shape[nb + 1]
        with IRBuilder() as ib:
            with units(name, list(ins[2].shape[:nb]) + [k]) as vs:
                bt, c = vs[:nb], vs[nb]
                T.reads(L.region(*bt, (0, n), (0, n)), ins[1][(*bt, slice(0, n))],
                        B.region(*bt, (0, n), c))
                T.writes(X.region(*bt, (0, n), c))
                acc = _Acc(la.compute, cplx)
                if not adjoint:
                    # L y = P b (unit lower), then U x = y
                    with _seq(n) as i:
                        acc.set(B[(*bt, P[(*bt, i)], c)])
                        with _seq(i) as j:
                            acc.set(acc.get() - cmul(L[(*bt, i, j)], X[(*bt, j, c)]))
                        X[(*bt, i, c)] = acc.get()
                    with _seq(n) as ii:
                        i = n - 1 - ii
                        acc.set(X[(*bt, i, c)])
                        with _seq(ii) as jj:
                            j = n - 1 - jj
                            acc.set(acc.get() - cmul(L[(*bt, i, j)], X[(*bt, j, c)]))
                        X[(*bt, i, c)] = cdiv(acc.get(), L[(*bt, i, i)])
                else:
                    # U^H z = b (lower), L^H w = z (unit upper); x = P^T w (applied by the caller)
                    with _seq(n) as i:
                        acc.set(B[(*bt, i, c)])
                        with _seq(i) as j:
                            acc.set(acc.get() - cmul(cconj(L[(*bt, j, i)]), X[(*bt, j, c)]))
                        X[(*bt, i, c)] = cdiv(acc.get(), cconj(L[(*bt, i, i)]))
                    with _seq(n) as ii:
                        i = n - 1 - ii
                        acc.set(X[(*bt, i, c)])
                        with _seq(ii) as jj:
                            j = n - 1 - jj
                            acc.set(acc.get() - cmul(cconj(L[(*bt, j, i)]), X[(*bt, j, c)]))
                        X[(*bt, i, c)] = acc.get()
        return ib.get()

    t = te.extern([shape], [f.lu.tensor, f.perm_t, bf.tensor], gen, name=name, dtype=[la.compute])
    x = tensor_mx(ctx, t, cplx)
    if not adjoint:
        return x
    # x = P^T w: row perm[i] of x is row i of w, i.e. x[r] = w[iperm[r]]
    return Mx(ctx, lambda bt, i, j: x(bt, f.iperm(bt, i), j), x.rows, x.cols, cplx)


# ==========================================================================================
# the ops
#
# Semantics follow Paddle 3.3.1 (phi/kernels/impl/*_grad_kernel_impl.h); complex grads use
# Paddle's convention x_grad = out_grad · conj(f'(x)) (conjugate transposes where the real
# formula has transposes). Where Paddle's kernel is mathematically wrong the docstring says so and
# the correct gradient is computed (tests/test_linalg.py checks it against numpy).
# ==========================================================================================

# Paddle registers float32/64 (and complex64/128 where noted); half types are accepted too and
# computed in float32 (rounded once at the end), as everywhere in tvmgrad.
LA_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128")
REAL_DTYPES = ("float32", "float64", "float16", "bfloat16")


_SQ = ("n", "n")
_XY = ("x", "y", "x_grad", "y_grad")      # solve-like ops: x and y broadcast their batch dims


def _eps(dt) -> float:
    """Paddle's singularity threshold of det_grad: 1e-5 in single, 1e-12 in double precision."""
    return 1e-5 if dt.name in ("float32", "complex64") else 1e-12


def _inv_h(a: Mx, name: str) -> Mx:
    """A^{-H} (A^{-T} for real A) by LU: solves A^H X = I."""
    return lu_solve(lu(a, f"{name}_lu", iperm=True), eye(a.ctx, a.rows, a.cplx), adjoint=True, name=f"{name}_solve")


def _inv(a: Mx, name: str) -> Mx:
    """A^{-1} by LU: solves A X = I."""
    return lu_solve(lu(a, f"{name}_lu"), eye(a.ctx, a.rows, a.cplx), name=f"{name}_solve")


@linalg_op(dtypes=LA_DTYPES, core=lambda call, outs: {"out": _SQ, "out_grad": _SQ, "x_grad": _SQ})
def inverse_grad(out, out_grad, ctx):
    """x_grad = -out^H · out_grad · out^H"""
    o, g = inp(ctx, out, "out"), inp(ctx, out_grad, "out_grad")
    oh = o.H
    return finish(-((oh @ g) @ oh), "x_grad")


@linalg_op(dtypes=LA_DTYPES, core=lambda call, outs: {"x": _SQ, "out": (), "out_grad": (), "x_grad": _SQ})
def det_grad(x, out, out_grad, ctx):
    """x_grad = out_grad · conj(out) · x^{-H}  (real: out_grad · out · x^{-T}), by LU (no explicit
    inverse product); a batch element whose |out| is below 1e-5 (single precision) / 1e-12
    (double) gets a zero grad. (Paddle 3.3.1 zeroes the whole tensor when any element of the batch
    is below the threshold; the other elements' grads are well defined, so only the singular ones
    are zeroed here.)"""
    la = ctx.info
    a = inp(ctx, x, "x")
    d, g = sca(ctx, out, "out"), sca(ctx, out_grad, "out_grad")
    eps = tirx.const(_eps(la.dt), la.compute)
    ih = _inv_h(a, "inv")

    def small(b):
        dv = d(b)
        return (tirx.hypot(dv.re, dv.im) if isinstance(dv, Complex) else tirx.abs(dv)) < eps

    s = scalar_of(ctx, lambda b: cmul(g(b), cconj(d(b))), "scale")
    zero = lift_to(la.zero(), la.cplx)
    # a select, not a product: the LU of a singular matrix holds inf/NaN
    return finish(ih.map(lambda v, b, i, j: select(small(b), zero, cmul(s(b), v))), "x_grad")


@linalg_op(dtypes=LA_DTYPES,
           core=lambda call, outs: {"x": _SQ, "out": Core((2,), ()), "out_grad": Core((2,), ()), "x_grad": _SQ})
def slogdet_grad(x, out, out_grad, ctx):
    """x_grad = out_grad[1] · x^{-H}  (out = (sign, log|det|) stacked in front of the batch dims;
    the sign's grad is ignored; real: x^{-T}), by LU"""
    a = inp(ctx, x, "x")
    g = sca(ctx, out_grad, "out_grad", lead=(1,))
    ih = _inv_h(a, "inv")
    return finish(ih.map(lambda v, b, i, j: cmul(g(b), v)), "x_grad")


def _power_sum(p: Mx, g: Mx, n: int, name: str) -> Mx:
    """S_n = Σ_{k<n} P^k G P^(n-1-k) by binary powering of the pairs (P^a, S_a):
    (P^a, S_a)∘(P^b, S_b) = (P^(a+b), P^a S_b + S_a P^b)  — O(log n) products."""
    def combine(x, y, last):
        (pa, sa), (pb, sb) = x, y
        s = (pa @ sb) + (sa @ pb)
        return (None if last else pa @ pb), s.m(f"{name}_s")

    result, base = None, (p, g)
    bits = bin(n)[2:][::-1]
    for i, bit in enumerate(bits):
        last = i == len(bits) - 1
        if bit == "1":
            result = base if result is None else combine(result, base, last)
        if not last:
            base = combine(base, base, False)
    return result[1]


@linalg_op(dtypes=LA_DTYPES, core=lambda call, outs: {"x": _SQ, "out": _SQ, "out_grad": _SQ, "x_grad": _SQ})
def matrix_power_grad(x, out, out_grad, n, ctx):
    """n = 0: x_grad = 0;  n > 0: x_grad = Σ_{k<n} (x^H)^k · out_grad · (x^H)^(n-1-k);
    n < 0: with B = x^{-1} (LU), m = -n: x_grad = -B^H · (Σ_{k<m} (B^H)^k · out_grad · (B^H)^(m-1-k)) · B^H.
    The sums take O(log |n|) products. (Paddle 3.3.1 uses plain transposes for complex inputs,
    inconsistent with its own inverse_grad and the x_grad = out_grad · conj(f') convention; the
    conjugate transposes here are the gradient.)"""
    a, g = inp(ctx, x, "x"), inp(ctx, out_grad, "out_grad")
    if n == 0:
        return finish(zeros(ctx, a.rows, a.cols, a.cplx), "x_grad")
    if n > 0:
        return finish(_power_sum(a.H, g, n, "pw"), "x_grad")
    bi = _inv(a, "inv")
    bh = bi.H
    return finish(-((bh @ _power_sum(bh, g, -n, "pw")) @ bh), "x_grad")


def _vec_mx(ctx, get, n, cplx) -> Mx:
    """A batch of vectors as n x 1 matrices."""
    return Mx(ctx, lambda b, i, j: get(b, i), n, tirx.const(1, "int64"), cplx)


# ------------------------------------------------------------------------------------------
# solve

def _solve_vector(call) -> bool:
    """Paddle's is_vector_rhs: y is a vector (rank 1) or a batch of vectors (x.shape[:-1])."""
    x, y = call.meta("x"), call.meta("y")
    return y.ndim == 1 or (y.ndim == x.ndim - 1 and tuple(y.shape) == tuple(x.shape[:-1]))


def _solve_core(call, outs):
    if _solve_vector(call):
        v = ("n",)
        return {"x": _SQ, "y": v, "out": v, "out_grad": v, "x_grad": _SQ, "y_grad": v}
    m = ("n", "k")
    return {"x": _SQ, "y": m, "out": m, "out_grad": m, "x_grad": _SQ, "y_grad": m}


def _solve_check(call, outs):
    """out and out_grad have the forward's output shape (Paddle's SolveInferMeta): the batch dims
    of x and y broadcast, then y's core dims (a vector y: x's n)."""
    from tvmgrad.infer_meta import MetaError, broadcast_shapes
    x, y = call.meta("x"), call.meta("y")
    if x.ndim < 2 or y.ndim < 1:
        return                              # (the family names the short tensor)
    vector = _solve_vector(call)
    core = x.shape[-1:] if vector else y.shape[-2:]
    try:
        batch = broadcast_shapes(x.shape[:-2], y.shape[:-1] if vector else y.shape[:-2])
    except MetaError:
        return                              # (the family reports the batch dims)
    want = tuple(batch) + tuple(core)
    for n in ("out", "out_grad"):
        m = call.meta(n)
        if tuple(m.shape) != want:
            raise ValueError(f"{call.op}: {n!r} has shape {list(m.shape)}, expected {list(want)} "
                             f"(the solution of x {list(x.shape)} and y {list(y.shape)})")


@linalg_op(dtypes=REAL_DTYPES, core=_solve_core, extra=lambda call, outs: (_solve_vector(call),), bcast=_XY,
           check=_solve_check)
def solve_grad(x, y, out, out_grad, ctx):
    """out = x^{-1} y:  y_grad = x^{-T} out_grad (LU solve),  x_grad = -y_grad · out^T, each
    summed over the batch dims it was broadcast along; y may be a vector or a batch of vectors
    (Paddle's is_vector_rhs)."""
    (vector,) = ctx.info.extra
    a = inp(ctx, x, "x")
    if vector:
        gv, n = vec(ctx, out_grad, "out_grad")
        ov, _ = vec(ctx, out, "out")
        g, o = _vec_mx(ctx, gv, n, False), _vec_mx(ctx, ov, n, False)
    else:
        g, o = inp(ctx, out_grad, "out_grad"), inp(ctx, out, "out")
    gy = lu_solve(lu(a, "lu", iperm=True), g, adjoint=True, name="solve").m("y_grad_full")
    gx = -(gy @ o.H)
    if vector:
        return finish(gx, "x_grad"), finish_vec(ctx, lambda b, i: gy(b, i, tirx.const(0, "int64")), "y_grad")
    return finish(gx, "x_grad"), finish(gy, "y_grad")


# ------------------------------------------------------------------------------------------
# triangular solve

def _bin_core(call, outs):
    return {"x": _SQ, "y": ("n", "k"), "out": ("n", "k"), "out_grad": ("n", "k"),
            "x_grad": _SQ, "y_grad": ("n", "k")}


@linalg_op(dtypes=LA_DTYPES, core=_bin_core, bcast=_XY)
def triangular_solve_grad(x, y, out, out_grad, upper, transpose, unitriangular, ctx):
    """out = op(x)^{-1} y (op = transpose or identity):  y_grad = op(x)^{-H} out_grad (a
    triangular solve),  x_grad = -y_grad · out^H (transpose: -conj(out) · y_grad^T) restricted to x's
    triangle — strictly, when unitriangular (the diagonal is not read). Both summed over broadcast
    batch dims. (Paddle 3.3.1 keeps tril(·, 1) for lower unitriangular x: the diagonal and the
    first superdiagonal, which the forward never reads; the gradient there is 0.)"""
    a, g, o = inp(ctx, x, "x"), inp(ctx, out_grad, "out_grad"), inp(ctx, out, "out")
    lower = not upper
    if transpose:
        gy = trsm(a.conj(), g, lower=lower, trans="N", unit=unitriangular, name="solve")
        gx = -(o.conj() @ gy.T)
    else:
        gy = trsm(a, g, lower=lower, trans="H", unit=unitriangular, name="solve")
        gx = -(gy @ o.H)
    k = 1 if unitriangular else 0
    gx = gx.triu(k) if upper else gx.tril(-k)
    return finish(gx, "x_grad"), finish(gy, "y_grad")


# ------------------------------------------------------------------------------------------
# Cholesky

@linalg_op(dtypes=REAL_DTYPES, core=lambda call, outs: {"out": _SQ, "out_grad": _SQ, "x_grad": _SQ})
def cholesky_grad(out, out_grad, upper, ctx):
    """Murray (2016), as Paddle: L = out (upper: out^T), G likewise; φ = tril(L^T G) with its
    diagonal halved; S = L^{-T} φ L^{-1} (two triangular solves, no inverse);
    x_grad = (S + S^T) / 2"""
    lo, g = inp(ctx, out, "out"), inp(ctx, out_grad, "out_grad")
    if upper:
        lo, g = lo.T, g.T
    lm = lo.m("l") if upper else lo
    phi = (lm.T @ g).map(lambda v, b, i, j: tirx.Select(i == j, v * tirx.const(0.5, ctx.info.compute),
                                                        tirx.Select(j < i, v, ctx.info.zero())))
    y = trsm(lm, phi, lower=True, trans="T", name="solve1")           # L^T Y = φ
    st = trsm(lm, y.T, lower=True, trans="T", name="solve2")          # L^T S^T = Y^T
    half = tirx.const(0.5, ctx.info.compute)
    return finish((st + st.T) * half, "x_grad")


def _cholesky_solve(lf: Mx, g: Mx, upper: bool, name: str) -> Mx:
    """(F^H F)^{-1} g for upper F, (F F^H)^{-1} g for lower F."""
    if upper:
        z = trsm(lf, g, lower=False, trans="H", name=f"{name}1")      # U^H z = g
        return trsm(lf, z, lower=False, trans="N", name=f"{name}2")   # U x = z
    z = trsm(lf, g, lower=True, trans="N", name=f"{name}1")           # L z = g
    return trsm(lf, z, lower=True, trans="H", name=f"{name}2")        # L^H x = z


@linalg_op(dtypes=REAL_DTYPES,
           core=lambda call, outs: {"x": ("n", "k"), "y": _SQ, "out": ("n", "k"), "out_grad": ("n", "k"),
                                    "x_grad": ("n", "k"), "y_grad": _SQ}, bcast=_XY)
def cholesky_solve_grad(x, y, out, out_grad, upper, ctx):
    """out = (y y^T)^{-1} x (upper: (y^T y)^{-1} x):  x_grad = cholesky_solve(out_grad, y);
    C = x_grad · out^T + (x_grad · out^T)^T;  y_grad = -C·y (upper: -y·C), lower (upper) triangle;
    each summed over broadcast batch dims"""
    f, g, o = inp(ctx, y, "y"), inp(ctx, out_grad, "out_grad"), inp(ctx, out, "out")
    gx = _cholesky_solve(f, g, upper, "solve").m("x_grad_full")
    c = (gx @ o.H).m("c")
    c = c + c.H
    gy = -(f @ c) if upper else -(c @ f)
    gy = gy.triu() if upper else gy.tril()
    return finish(gx, "x_grad"), finish(gy, "y_grad")


# ------------------------------------------------------------------------------------------
# LU

def _lu_unpack_core(call, outs):
    return {"x": ("m", "n"), "l_grad": ("m", "k"), "u_grad": ("k", "n"), "x_grad": ("m", "n")}


def _lu_unpack_check(call, outs):
    _check_pivots(call, "y")


@linalg_op(dtypes=LA_DTYPES, core=_lu_unpack_core, index_dtypes=("int32", "int64"),
           float_inputs=("x", "l", "u", "pmat", "l_grad", "u_grad"), check=_lu_unpack_check,
           pattern="generic",
           dtype_exempt=lambda call: () if call.attrs["unpack_pivots"] else ("pmat",))
def lu_unpack_grad(x, y, l, u, pmat, l_grad, u_grad, unpack_ludata, unpack_pivots, ctx):
    """x_grad = tril(l_grad, -1) + triu(u_grad), each placed in x's m x n shape (the pivots and
    the permutation matrix have no grad)"""
    lg, ug = inp(ctx, l_grad, "l_grad"), inp(ctx, u_grad, "u_grad")
    k = lg.cols
    one = tirx.const(1, "int64")

    def get(b, i, j):
        lv = lg(b, i, tirx.min(j, k - one))
        uv = ug(b, tirx.min(i, k - one), j)
        z = lift_to(ctx.info.zero(), lg.cplx)
        return select(j < i, lv, select(i < k, uv, z))

    return finish(Mx(ctx, get, x.shape[len(ctx.info.groups)], x.shape[len(ctx.info.groups) + 1], lg.cplx), "x_grad")


def _pivot_iperm(ctx, piv_t, name: str, m):
    """From LAPACK's 1-based sequential row swaps (row i <-> row piv[i]-1, i < k) the permutation
    P of x = P·L·U, as ``iperm``: (P·M)[r] = M[iperm[r]]. One unit per batch element: the swaps
    applied to 0..m-1 give perm ((P^T x)[r] = x[perm[r]]), and iperm[perm[r]] = r."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    la = ctx.info
    nb = len(la.groups)
    mask = la.masks["pivots"]

    def gen(ins, outs):
        piv, pm, ip = T.buffer_proxy(ins[0]), T.buffer_proxy(outs[0]), T.buffer_proxy(outs[1])
        k = ins[0].shape[nb]
        m_ = outs[0].shape[nb]
        with IRBuilder() as ib:
            with units(name, list(outs[0].shape[:nb])) as bt:
                pb = _bidx(bt, mask)
                T.reads(ins[0][(*pb, slice(0, k))])
                T.writes(outs[0][(*bt, slice(0, m_))], outs[1][(*bt, slice(0, m_))])
                tmp = T.buffer_proxy(scratch((1,), "int64"))
                with _seq(m_) as i:
                    pm[(*bt, i)] = i
                with _seq(k) as i:
                    j = piv[(*pb, i)].astype("int64") - tirx.const(1, "int64")
                    tmp[0] = pm[(*bt, i)]
                    pm[(*bt, i)] = pm[(*bt, j)]
                    pm[(*bt, j)] = tmp[0]
                with _seq(m_) as i:
                    ip[(*bt, pm[(*bt, i)])] = i
        return ib.get()

    shape = _groups(ctx) + [m]
    _, iperm_t = te.extern([shape, shape], [piv_t], gen, name=name, dtype=["int64", "int64"])
    return iperm_t


def _lu_core(call, outs):
    return {"x": ("m", "n"), "out": ("m", "n"), "pivots": ("k",), "out_grad": ("m", "n"), "x_grad": ("m", "n")}


def _check_pivots(call, name):
    """LAPACK pivots (1-based row indices) lie in [1, m] (m = x's rows)."""
    piv = call.tensors[name]
    if piv is None or not call.has_data:
        return
    import numpy as np
    m = call.meta("x").shape[-2]
    p = np.asarray(piv)
    if p.size and (p.min() < 1 or p.max() > m):
        raise ValueError(f"{call.op}: input {name!r} holds {int(p.min())}..{int(p.max())}; LU pivots "
                         f"are 1-based row indices in [1, {m}]")


def _lu_check(call, outs):
    _check_pivots(call, "pivots")


@linalg_op(dtypes=LA_DTYPES, core=_lu_core, check=_lu_check, float_inputs=("x", "out", "out_grad"),
           extra=lambda call, outs: (call.meta("x").shape[-2] <= call.meta("x").shape[-1],))
def lu_grad(x, out, pivots, out_grad, pivot, ctx):
    """x = P·L·U (out packs L below the diagonal, U on and above it; pivots: LAPACK's 1-based row
    swaps), G = out_grad, k = min(m, n), L_k, U_k the leading k x k blocks:
    φ = tril(L_k^H G_k, -1) + triu(G_k U_k^H);
    m <= n: φ -= tril(G[:, k:] U[:, k:]^H, -1); ψ = [φ U_k^{-H} | G[:, k:]]; x_grad = P L_k^{-H} ψ;
    m > n:  φ -= triu(L[k:]^H G[k:]); ψ = [L_k^{-H} φ ; G[k:]]; x_grad = P ψ U_k^{-H};
    all solves triangular (as Paddle / PyTorch's linalg_lu_backward)."""
    (wide,) = ctx.info.extra
    la = ctx.info
    lu_m, g = inp(ctx, out, "out"), inp(ctx, out_grad, "out_grad")
    cplx = lu_m.cplx
    m_, n_ = lu_m.rows, lu_m.cols
    k = m_ if wide else n_
    zero = tirx.const(0, "int64")
    one_c = lift_to(la.one(), cplx)
    lk = lu_m.sub(zero, zero, k, k).map(lambda v, b, i, j: select(i == j, one_c, select(j < i, v, lift_to(la.zero(), cplx))))
    lk = lk.m("lk")
    uk = lu_m.sub(zero, zero, k, k).triu().m("uk")
    gk = g.sub(zero, zero, k, k)
    phi = (lk.H @ gk).tril(-1) + (gk @ uk.H).triu()
    iperm = _pivot_iperm(ctx, pivots, "perm", m_)
    if wide:
        gr = g.sub(zero, k, k, n_ - k)
        ur = lu_m.sub(zero, k, k, n_ - k)
        phi = (phi - (gr @ ur.H).tril(-1)).m("phi")
        left = trsm(uk, phi.H, lower=False, trans="N", name="solve_u").H      # φ U^{-H}
        psi = Mx(ctx, lambda b, i, j: select(j < k, left(b, i, tirx.min(j, k - 1)), g(b, i, j)), k, n_, cplx)
        psi = trsm(lk, psi, lower=True, trans="H", unit=True, name="solve_l")   # L^{-H} ψ
        res = psi
    else:
        lr = lu_m.sub(k, zero, m_ - k, k)
        gr = g.sub(k, zero, m_ - k, k)
        phi = (phi - (lr.H @ gr).triu()).m("phi")
        top = trsm(lk, phi, lower=True, trans="H", unit=True, name="solve_l")   # L^{-H} φ
        psi = Mx(ctx, lambda b, i, j: select(i < k, top(b, tirx.min(i, k - 1), j), g(b, i, j)), m_, k, cplx)
        pp = Mx(ctx, lambda b, i, j: psi(b, iperm(*b, i), j), m_, n_, cplx).m("p_psi")
        res = trsm(uk, pp.H, lower=False, trans="N", name="solve_u").H          # (Pψ) U^{-H}
        return finish(res, "x_grad")
    return finish(Mx(ctx, lambda b, i, j: res(b, iperm(*b, i), j), m_, n_, cplx), "x_grad")


# ------------------------------------------------------------------------------------------
# QR

def _qr_core(call, outs):
    return {"x": ("m", "n"), "q": ("m", "kq"), "r": ("kr", "n"), "q_grad": ("m", "kq"),
            "r_grad": ("kr", "n"), "x_grad": ("m", "n")}


def _qr_check(call, outs):
    mode = call.attrs["mode"]
    if call.meta("x").ndim < 2:
        raise ValueError(f"{call.op}: 'x' has shape {list(call.meta('x').shape)}; it needs at least 2 dims")
    m, n = call.meta("x").shape[-2:]
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"{call.op}: attribute 'mode' is {mode!r}; it must be 'reduced', 'complete' or 'r'")
    if mode == "r":
        raise ValueError(f"{call.op}: the derivative of qr is not implemented when mode='r' (no Q), as in Paddle")
    if mode == "complete" and m > n:
        raise ValueError(f"{call.op}: the derivative of qr is not implemented when mode='complete' and "
                         f"m > n ({m} > {n}), as in Paddle")
    kq = m if mode == "complete" else min(m, n)
    for name, dim in (("q", -1), ("r", -2)):
        meta = call.meta(name)
        if meta.ndim < 2 or meta.shape[dim] != kq:
            raise ValueError(f"{call.op}: {name!r} has shape {list(meta.shape)}; for x of shape "
                             f"{list(call.meta('x').shape)} (mode={mode!r}) its dim {dim} must be {kq}")


def _qr_square(dq: Mx, dr: Mx, q: Mx, r: Mx, name: str) -> Mx:
    """The m >= n case (Roberts & Roberts 2020): M = R dR^H - dQ^H Q made Hermitian from its lower
    triangle (real diagonal), rhs = dQ + Q M, dA = rhs R^{-H} (a triangular solve)."""
    mm = ((r @ dr.H) - (dq.H @ q)).m(f"{name}_m")

    def herm(b, i, j):
        lo = mm(b, i, j)
        up = cconj(mm(b, j, i))
        diag = lift_to(creal(lo), mm.cplx)
        return select(i == j, diag, select(j < i, lo, up))

    mh = Mx(mm.ctx, herm, mm.rows, mm.cols, mm.cplx)
    rhs = (dq + (q @ mh)).m(f"{name}_rhs")
    return trsm(r, rhs.H, lower=False, trans="N", name=f"{name}_solve").H


@linalg_op(dtypes=LA_DTYPES, core=_qr_core, check=_qr_check,
           extra=lambda call, outs: (call.meta("x").shape[-2] >= call.meta("x").shape[-1],))
def qr_grad(x, q, r, q_grad, r_grad, mode, ctx):
    """m >= n: dA = (dQ + Q·M) R^{-H}, M = copyltu(R dR^H - dQ^H Q) (Hermitian from the lower
    triangle, real diagonal);  m < n: with A = [X | Y], R = [U | V]: dX from the m >= n rule with
    dQ + Y dV^H and U, dY = Q dV.  mode 'r' and 'complete' with m > n raise, as in Paddle."""
    (tall,) = ctx.info.extra
    a, qm, rm, dq, dr = inp(ctx, x, "x"), inp(ctx, q, "q"), inp(ctx, r, "r"), inp(ctx, q_grad, "q_grad"), inp(ctx, r_grad, "r_grad")
    if tall:
        return finish(_qr_square(dq, dr, qm, rm, "qr"), "x_grad")
    zero = tirx.const(0, "int64")
    m_, n_ = a.rows, a.cols
    y = a.sub(zero, m_, m_, n_ - m_)
    u = rm.sub(zero, zero, m_, m_)
    dv = dr.sub(zero, m_, m_, n_ - m_)
    du = dr.sub(zero, zero, m_, m_)
    dq2 = (dq + (y @ dv.H)).m("dq2")
    dx = _qr_square(dq2, du, qm, u.m("u"), "qr")
    dy = qm @ dv
    cplx = dx.cplx
    return finish(Mx(ctx, lambda b, i, j: select(j < m_, dx(b, i, tirx.min(j, m_ - 1)),
                                            dy(b, i, tirx.max(j - m_, zero))), m_, n_, cplx), "x_grad")


# ------------------------------------------------------------------------------------------
# SVD

def _svd_core(call, outs):
    return {"x": ("m", "n"), "u": ("m", "ku"), "vh": ("kv", "n"), "s": ("k",), "u_grad": ("m", "ku"),
            "vh_grad": ("kv", "n"), "s_grad": ("k",), "x_grad": ("m", "n")}


def _real_pair_check(names):
    def check(call, outs):
        ref = next(call.meta(n) for n in call.tensors if call.tensors[n] is not None and n not in names)
        want = {"complex64": "float32", "complex128": "float64"}.get(ref.dtype.name, ref.dtype.name)
        for n in names:
            meta = call.meta(n)
            if meta is not None and meta.dtype.name != want:
                raise TypeError(f"{call.op}: input {n!r} has dtype {meta.dtype.name}; it must be {want} "
                                f"(the real dtype of the other inputs)")
    return check


def _svd_check(call, outs):
    """u [*, m, ku], vh [*, kv, n], s [*, k] with k = min(m, n): ku = kv = k, or ku = m and
    kv = n with full_matrices (the grads likewise, checked against these by the core dims)."""
    _real_pair_check(("s", "s_grad"))(call, outs)
    x = call.meta("x")
    if x.ndim < 2:
        raise ValueError(f"{call.op}: 'x' has shape {list(x.shape)}; it needs at least 2 dims")
    m, n = x.shape[-2:]
    k = min(m, n)
    full = call.attrs["full_matrices"]
    for name, dim, want in (("u", -1, m if full else k), ("vh", -2, n if full else k), ("s", -1, k)):
        meta = call.meta(name)
        if meta.ndim < (1 if name == "s" else 2) or meta.shape[dim] != want:
            raise ValueError(f"{call.op}: {name!r} has shape {list(meta.shape)}; for x of shape "
                             f"{list(x.shape)} (full_matrices={full}) its dim {dim} must be {want}")


def _svd_extra(call, outs):
    m, n = call.meta("x").shape[-2:]
    return (m > min(m, n), n > min(m, n))


@linalg_op(dtypes=LA_DTYPES, core=_svd_core, extra=_svd_extra, index_dtypes=("float32", "float64", "float16", "bfloat16"),
           float_inputs=("x", "u", "vh", "u_grad", "vh_grad"), check=_svd_check)
def svd_grad(x, u, vh, s, u_grad, vh_grad, s_grad, full_matrices, ctx):
    """With k = min(m, n), U = u[:, :k], Vh = vh[:k] (full_matrices cuts them, and their grads),
    F_ij = 1 / (s_j² - s_i²) (0 on the diagonal):
    x_grad = U diag(gS) Vh
           + (U ((U^H gU - gU^H U) ∘ F ∘ s_j) + [m > k] (gU - U U^H gU) / s_j) Vh
           + U (((Vh gVh^H - gVh Vh^H) ∘ F) Vh ∘ s_i + [n > k] (gVh - gVh Vh^H Vh) / s_i)
    (absent grads drop their terms, as Paddle; with all three absent the grad is zeros like x,
    where Paddle returns a zero tensor of shape [1]; Paddle's batched complex kernel fails, the
    formula here is its per-matrix one, which is PyTorch's for gauge-invariant cotangents)."""
    m_gt, n_gt = ctx.info.extra
    la = ctx.info
    sv, k = vec(ctx, s, "s")
    zero = tirx.const(0, "int64")
    um, vhm = inp(ctx, u, "u"), inp(ctx, vh, "vh")
    cplx = um.cplx
    m_, n_ = um.rows, vhm.cols
    U = um.sub(zero, zero, m_, k)
    VH = vhm.sub(zero, zero, k, n_)
    one = la.one()

    def fmat(b, i, j):
        si, sj = sv(b, i), sv(b, j)
        return tirx.Select(i == j, la.zero(), one / (sj * sj - si * si))

    # x_grad = (U M + [m > k] Pu) Vh + [n > k] U Pv with the k x k middle
    # M = diag(gS) + ((U^H gU - gU^H U) ∘ s_j + s_i (Vh gVh^H - gVh Vh^H)) ∘ F: two products
    # with U and Vh instead of one per term (F is 0 on the diagonal)
    if s_grad is None and u_grad is None and vh_grad is None:
        return finish(zeros(ctx, m_, n_, cplx), "x_grad")
    parts, proj_u, proj_v = [], None, None
    if u_grad is not None:
        du = inp(ctx, u_grad, "u_grad").sub(zero, zero, m_, k)
        du = du.m("duk") if full_matrices else du
        utg = (U.H @ du).m("utg")
        parts.append(lambda b, i, j: cmul(utg(b, i, j) - cconj(utg(b, j, i)), sv(b, j)))
        if m_gt:
            proj_u = (du - (U @ utg)).map(lambda v, b, i, j: cdiv(v, sv(b, j)))
    if vh_grad is not None:
        dvh = inp(ctx, vh_grad, "vh_grad").sub(zero, zero, k, n_)
        dvh = dvh.m("dvhk") if full_matrices else dvh
        a1 = (VH @ dvh.H).m("vtg")
        parts.append(lambda b, i, j: cmul(a1(b, i, j) - cconj(a1(b, j, i)), sv(b, i)))
        if n_gt:
            proj_v = (dvh - (a1.H @ VH)).map(lambda v, b, i, j: cdiv(v, sv(b, i)))
    gs = vec(ctx, s_grad, "s_grad")[0] if s_grad is not None else None
    if parts:
        def middle(b, i, j):
            off = parts[0](b, i, j)
            for p in parts[1:]:
                off = off + p(b, i, j)
            off = cmul(off, fmat(b, i, j))          # one division for both parts
            return select(i == j, lift_to(gs(b, i), cplx), off) if gs is not None else off
        left = U @ Mx(ctx, middle, k, k, cplx)
    else:
        left = U * Mx(ctx, lambda b, i, j: gs(b, j), m_, k, False)
    if proj_u is not None:
        left = left + proj_u
    total = left @ VH
    if proj_v is not None:
        total = total + U @ proj_v
    return finish(total, "x_grad")


# ------------------------------------------------------------------------------------------
# Hermitian / general eigendecompositions

def _eig_core(call, outs):
    return {"out_w": ("n",), "out_v": _SQ, "out_w_grad": ("n",), "out_v_grad": _SQ, "x_grad": _SQ}


@linalg_op(dtypes=LA_DTYPES, core=_eig_core, index_dtypes=("float32", "float64", "float16", "bfloat16"),
           float_inputs=("out_v", "out_v_grad"), check=_real_pair_check(("out_w", "out_w_grad")))
def eigh_grad(out_w, out_v, out_w_grad, out_v_grad, ctx):
    """x_grad = V (D + diag(gw)) V^H with D_ij = (½ (V^H gV - (V^H gV)^H))_ij / (w_j - w_i) off the
    diagonal (as Paddle; no symmetrisation). Paddle 3.3.1's CPU kernel is wrong for batches (only
    the first matrix is right); each matrix here gets its own gradient."""
    la = ctx.info
    wv, _ = vec(ctx, out_w, "out_w")
    gw, _ = vec(ctx, out_w_grad, "out_w_grad")
    v, gv = inp(ctx, out_v, "out_v"), inp(ctx, out_v_grad, "out_v_grad")
    r = (v.H @ gv).m("vhgv")
    half = tirx.const(0.5, la.compute)

    def mid(b, i, j):
        skew = r(b, i, j) - cconj(r(b, j, i))
        off = cdiv(cmul(skew, half), wv(b, j) - wv(b, i))
        return select(i == j, lift_to(gw(b, i), v.cplx), off)

    d = Mx(ctx, mid, v.rows, v.cols, v.cplx)
    return finish(v @ (d @ v.H).m("dvh"), "x_grad")


@linalg_op(dtypes=LA_DTYPES, core=lambda call, outs: {"eigenvectors": _SQ, "eigenvalues_grad": ("n",), "x_grad": _SQ},
           index_dtypes=("float32", "float64", "float16", "bfloat16"), float_inputs=("eigenvectors",),
           check=_real_pair_check(("eigenvalues_grad",)))
def eigvalsh_grad(eigenvectors, eigenvalues_grad, uplo, is_test, ctx):
    """x_grad = V diag(g) V^H (uplo does not matter). Paddle 3.3.1's CPU kernel is wrong for
    batches (only the first matrix is right); each matrix here gets its own gradient."""
    v = inp(ctx, eigenvectors, "eigenvectors")
    g, _ = vec(ctx, eigenvalues_grad, "eigenvalues_grad")
    return finish(v @ Mx(ctx, lambda b, i, j: cmul(g(b, i), cconj(v(b, j, i))), v.cols, v.rows, v.cplx), "x_grad")


@linalg_op(dtypes=("complex64", "complex128"), core=_eig_core)
def eig_grad(out_w, out_v, out_w_grad, out_v_grad, ctx):
    """x_grad = V^{-H} (diag(gw) + (V^H gV - V^H V diag(Re diag(V^H gV))) / conj(E)) V^H,
    E_ij = w_j - w_i (as Paddle / PyTorch; the V^{-H} by an LU solve with V^H). Paddle 3.3.1's CPU
    kernel is wrong for batches (only the first matrix is right); each matrix here gets its own."""
    wv, _ = vec(ctx, out_w, "out_w")
    gw, _ = vec(ctx, out_w_grad, "out_w_grad")
    v, gv = inp(ctx, out_v, "out_v"), inp(ctx, out_v_grad, "out_v_grad")
    vh = v.H.m("vh")
    vhgv = (vh @ gv).m("vhgv")
    vhv = (vh @ v).m("vhv")

    def mid(b, i, j):
        r = vhgv(b, i, j) - cmul(vhv(b, i, j), creal(vhgv(b, j, j)))
        return select(i == j, gw(b, i), cdiv(r, cconj(wv(b, j)) - cconj(wv(b, i))))

    rhs = Mx(ctx, mid, v.rows, v.cols, True) @ vh
    return finish(lu_solve(lu(vh, "lu"), rhs, name="solve"), "x_grad")
