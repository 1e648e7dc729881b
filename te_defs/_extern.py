"""Kernel bodies for sequential algorithms: ``te.extern`` over annotated blocks.

Shared by the indexing/scan/sort grads (schedule ``annotated_loops``) and the
interpolation/sampling/ROI grads (schedule ``gather_owners``): both write bodies of spatial
blocks whose ``tvmgrad.loops`` annotation (one letter per loop) tells their schedule which loops
run in parallel, which stay serial in one thread and which are vector lanes; and both sum in an
accumulation dtype (``acc_dtype``) that their results are cast back from.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

from tvmgrad.dtypes import to_compute
from tvmgrad.lazy import te, tirx

CW = 64   # columns per chunk of a vector ("v") loop: CUDA threads per block, CPU vector strip


def i64(v):
    """``v`` (a Python int, a TIR expression or a te.Tensor element) as int64 (lanes kept)."""
    if isinstance(v, int):
        return tirx.IntImm("int64", v)
    if hasattr(v, "asobject"):          # a te.Tensor element (TensorSlice)
        v = v.asobject()
    ty = str(v.ty)
    lanes = ty.partition("x")[2]
    if ty.partition("x")[0] == "int64":
        return v
    return tirx.Cast(f"int64x{lanes}", v) if lanes else v.astype("int64")


def ceildiv(a, b):
    return tirx.truncdiv(i64(a) + i64(b) - 1, i64(b))


def at_least_one(extent):
    """A parallel extent of at least 1, for a unit loop whose one step does nothing when the
    real extent is 0 (it skips itself, or its inner loops are empty): TVM sizes the buffers a
    kernel allocates through the fused parallel index divided by the inner extents, at the
    kernel's entry, before any guard (a size-0 extent: SIGFPE)."""
    return tirx.max(i64(extent), i64(1))


def within(extents, fn):
    """A block body (for a Body made with ``lanes=False``) running ``fn(*par_vars)`` only where
    each par var is below its extent (None: no bound): the one step that ``at_least_one`` gives an
    empty extent then does nothing."""
    def body(Pv, _S):
        from tvm.script.ir_builder import tirx as T
        with T.If(tirx.all(*[p < i64(e) for p, e in zip(Pv, extents) if e is not None])):
            with T.Then():
                fn(*Pv)
    return body


def region(buf):
    """The whole of ``buf`` as a BufferRegion (a block's declared read/write set)."""
    from tvm import ir
    return tirx.BufferRegion(buf, [ir.Range.from_min_extent(i64(0), i64(d)) for d in buf.shape])


# The scope of a kernel body's scratch buffers (``scratch``), set per target by
# tvmgrad.build.lower (``scratch_scope``): the CPU build keeps a small "global" buffer declared in
# a body as a stack array (LLVM then holds it in registers), where a "local" one becomes a
# TVMBackendAllocWorkspace/FreeWorkspace pair each time the body runs; CUDA allows no global
# allocation in a kernel, and its "local" is registers.
_SCRATCH = contextvars.ContextVar("tvmgrad_scratch_scope", default="local")
STACK_BYTES = 1024      # the most TVM's LowerTVMBuiltin puts on the stack (kMaxStackAlloca)


@contextlib.contextmanager
def scratch_scope(target_kind: str):
    """Kernel bodies built inside are for ``target_kind`` ("llvm", "cuda")."""
    token = _SCRATCH.set("global" if target_kind == "llvm" else "local")
    try:
        yield
    finally:
        _SCRATCH.reset(token)


def scratch(shape, dtype: str, word_aligned: bool = False):
    """A buffer private to one run of a block body (accumulators, a butterfly's registers): on
    the stack on the CPU when its size is static and small, else "local". ``word_aligned``:
    aligned to 8 bytes for a 64-bit dtype, else 4 (the scalar accumulators)."""
    from tvm.script.ir_builder import tirx as T
    import tvm
    bits = tvm.DataType(dtype).bits
    static = all(isinstance(d, int) for d in shape)
    nbytes = math.prod(shape) * bits // 8 if static else None
    scope = _SCRATCH.get() if nbytes is not None and nbytes <= STACK_BYTES else "local"
    return T.alloc_buffer(tuple(shape), dtype=dtype, scope=scope,
                          **({"align": 8 if bits == 64 else 4} if word_aligned else {}))


def proxy(buf):
    """``buf`` indexable with ``[...]`` inside a block body (loads and stores)."""
    from tvm.script.ir_builder import tirx as T
    return T.buffer_proxy(buf)


class Body:
    """The statements of a ``te.extern`` body, made of annotated blocks.

    ``block(name, body, par=, ser=, vec=, inner=)`` emits loops ``par... [vec chunks] ser...
    [vec lanes]`` around one block whose iter vars are all spatial, and annotates it with one
    letter per loop: ``p`` parallel (CPU: fused and parallel; CUDA: fused onto blocks/threads),
    ``s`` serial in one thread, ``v`` vector lanes (CUDA threads / a CPU vector), ``i`` (with
    ``inner=True``: the last par loop) one more thread dimension on CUDA, a plain contiguous inner
    loop on the CPU. ``body(P, S, C)`` (``body(P, S)`` when the Body was made with
    ``lanes=False``) gets the iter vars (C: the vector position, or None) and emits the block's
    statements with the TVMScript IR builder.
    ``strip="main"|"tail"`` (a CPU form of a vector block): the strip is a loop inside the block
    instead, over the whole strips (vectorised, no predicate; values that do not depend on C stay
    scalars) or over the last partial one. ``when``: a condition guarding the whole block.
    Reads and writes are declared as whole buffers (a scatter's write set is data-dependent).
    """

    def __init__(self, lanes: bool = True):
        self.stmts = []
        self.lanes = lanes

    def block(self, name, body, *, par=(), ser=(), vec=None, reads=(), writes=(), when=None,
              strip=None, inner=False):
        from tvm.script.ir_builder import IRBuilder
        from tvm.script.ir_builder import tirx as T
        with IRBuilder() as ib:
            with contextlib.ExitStack() as stack:
                if when is not None:
                    stack.enter_context(T.If(when))
                    stack.enter_context(T.Then())
                kinds = "p" * len(par)
                if inner and par:
                    kinds = "p" * (len(par) - 1) + "i"
                pv = [stack.enter_context(T.serial(0, i64(e))) for e in par]
                n_chunks = None if vec is None else (
                    ceildiv(vec, CW) if not strip else
                    tirx.truncdiv(i64(vec), i64(CW)) if strip == "main" else i64(1))
                if vec is not None:
                    cb = stack.enter_context(T.serial(0, n_chunks))
                    kinds += "p"
                sv = [stack.enter_context(T.serial(0, i64(e))) for e in ser]
                kinds += "s" * len(ser)
                if vec is not None and not strip:
                    cc = stack.enter_context(T.serial(0, i64(CW)))
                    kinds += "v"
                stack.enter_context(T.sblock(name))
                P = [T.axis.spatial(i64(e), v, dtype="int64") for e, v in zip(par, pv)]
                S = [T.axis.spatial(i64(e), v, dtype="int64") for e, v in zip(ser, sv)]
                C = None
                if vec is not None and not strip:
                    pos = cb * i64(CW) + cc
                    C = T.axis.spatial(i64(vec), pos, dtype="int64")
                    T.where(pos < i64(vec))
                if vec is not None and strip:
                    chunk = T.axis.spatial(n_chunks, cb, dtype="int64")
                T.reads(*[region(b) for b in reads])
                T.writes(*[region(b) for b in writes])
                T.sblock_attr({"tvmgrad.loops": kinds})
                if strip == "main":
                    C = tirx.Ramp(chunk * i64(CW), i64(1), CW)
                elif strip == "tail":
                    start = tirx.truncdiv(i64(vec), i64(CW)) * i64(CW)
                    lane = stack.enter_context(T.serial(0, i64(vec) - start))
                    C = start + lane
                if self.lanes:
                    body(P, S, C)
                else:
                    body(P, S)
        self.stmts.append(ib.get())

    def stmt(self):
        if not self.stmts:
            return tirx.Evaluate(0)
        return self.stmts[0] if len(self.stmts) == 1 else tirx.SeqStmt(self.stmts)


def atomic_add(buf_load, value):
    """``atomicAdd(&buf[...], value)`` (CUDA; the CPU schedule turns it into a plain add)."""
    return tirx.call_intrin(str(value.ty), "tirx.cuda.atomic_add", tirx.address_of(buf_load), value)


def zero_fill(body: Body, buf, name="init", when=None):
    """A block writing 0 to every element of ``buf`` (``when``: only where that holds)."""
    shape = list(buf.shape)
    b = proxy(buf)
    zero = tirx.const(0, buf.dtype)
    if not shape:
        shape = [1]

        def fill(P, S, C):
            b[()] = zero
    else:
        def fill(P, S, C):
            b[tuple(P)] = zero
    body.block(name, fill, par=shape, writes=[buf], when=when)


def scatter_body(ins, outs, body: Body, *, assign=False, zero_when=None):
    """The opening of a scatter's ``gen``: -> (input proxies, the output buffer, ``put``). The
    output is zero-filled first (slots nothing lands on stay 0; ``zero_when``: only where that
    holds, the caller zeroes the rest itself); ``put(d, v, use_atomic)`` adds v
    at out[d]: atomically where one CUDA thread runs per element, else as a plain read-add-write
    (a serial walk owns the slot), or overwrites it with ``assign`` (the last write wins)."""
    from tvm.script.ir_builder import tirx as T
    out = outs[0]
    inputs = [proxy(b) for b in ins]
    dest = proxy(out)
    zero_fill(body, out, when=zero_when)

    def put(d, v, use_atomic):
        if use_atomic:
            T.evaluate(atomic_add(dest[d], v))
        elif assign:
            dest[d] = v
        else:
            dest[d] = dest[d] + v
    return inputs, out, put


def extern(name, outputs, inputs, gen, *, lanes: bool = True):
    """``te.extern`` over ``inputs`` (te.Tensors) producing ``outputs`` [(shape, dtype)], whose body
    ``gen(ins, outs, body: Body)`` fills with blocks (``lanes``: see ``Body``); -> list of
    te.Tensors."""
    in_bufs = [tirx.decl_buffer(t.shape, t.dtype, f"{t.op.name}_b") for t in inputs]
    out_bufs = [tirx.decl_buffer(s, d, f"{name}{i}") for i, (s, d) in enumerate(outputs)]

    def fcompute(ins, outs):
        body = Body(lanes)
        gen(ins, outs, body)
        return body.stmt()

    res = te.extern([s for s, _ in outputs], list(inputs), fcompute, name=name,
                    in_buffers=in_bufs, out_buffers=out_bufs)
    return list(res) if isinstance(res, (list, tuple)) else [res]


def units(name: str, extents):
    """``with units(name, extents) as vs:`` one spatial sblock per point of ``extents`` (a grid of
    serial loops, inside an IRBuilder body); yields the block's axis vars."""
    from tvm.script.ir_builder import tirx as T

    @contextlib.contextmanager
    def ctx():
        with T.grid(*extents) as lv:
            lv = [lv] if isinstance(lv, tirx.Var) else list(lv)
            with T.sblock(name):
                vs = [T.axis.spatial(e, v, dtype="int64") for e, v in zip(extents, lv)]
                yield vs
    return ctx()


# -- values in kernel bodies: the compute dtype of loads, the accumulation dtype of sums ----------

def tc(value, dt):
    """``to_compute`` for scalars and vectors (a CPU strip loads whole vectors): the element in
    the compute dtype, bfloat16 widened by bit shift."""
    if hasattr(value, "asobject"):
        value = value.asobject()
    ty = str(value.ty)
    lanes = int(ty.split("x")[1]) if "x" in ty else 1
    if lanes == 1:
        return to_compute(value, dt)
    if dt.storage == dt.compute:
        return value
    if dt.name == "bfloat16":
        bits = tirx.reinterpret(f"uint16x{lanes}", value).astype(f"uint32x{lanes}")
        bits = bits << tirx.Broadcast(tirx.const(16, "uint32"), lanes)
        return tirx.reinterpret(f"float32x{lanes}", bits)
    return tirx.Cast(f"{dt.compute}x{lanes}", value)


def cast_to(t, dt, name):
    """te.compute casting an accumulated tensor (``acc_dtype``) to dt's storage (identity when
    they agree; a bool is the accumulated count != 0)."""
    if str(t.dtype) == dt.storage:
        return t
    return te.compute(t.shape, lambda *i: store_as(t(*i), dt), name=name)


def acc_dtype(dt) -> str:
    """The dtype sums of ``dt`` run in: its compute dtype; int32 for bool (a count: the sum of
    bools is their OR, as Paddle's ``bool +=``; a TIR add of bools would wrap to XOR)."""
    return "int32" if dt.name == "bool" else dt.compute


def to_acc(value, dt):
    """A compute-dtype value (scalar or vector) in ``acc_dtype(dt)``."""
    acc = acc_dtype(dt)
    if acc == dt.compute:
        return value
    if hasattr(value, "asobject"):          # a te.Tensor element
        value = value.asobject()
    ty = str(value.ty)
    lanes = ty.partition("x")[2]
    return tirx.Cast(f"{acc}x{lanes}" if lanes else acc, value)


def store_as(value, dt):
    """An accumulated value (``acc_dtype``) in dt's storage dtype (bool: != 0)."""
    if hasattr(value, "asobject"):          # a te.Tensor element
        value = value.asobject()
    if dt.name == "bool" and str(value.ty) != "bool":
        return value != tirx.const(0, str(value.ty))
    return value if str(value.ty) == dt.storage else value.astype(dt.storage)
