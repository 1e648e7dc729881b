"""TE helpers the scatter-type grads share (indexing, sort, scan): a scatter along an axis whose
repeated indices add up in index order, and a blocked parallel scan; kernel bodies are
``te.extern`` blocks (``Body``/``extern`` from _extern) that the ``annotated_loops`` schedules bind.
A body may hold a CUDA form and a CPU form of a block (``two_forms``), chosen by ``ctx.on_cuda()``."""

from __future__ import annotations

import contextlib
import math

from tvmgrad.lazy import tirx

from ._extern import CW, acc_dtype, cast_to, extern, i64, proxy, scatter_body, scratch, tc, to_acc

__all__ = ["two_forms", "scatter_along", "blocked_scan", "scan_host", "scan_scalars", "wrap", "div",
           "is_vector", "zeros_like", "T_"]

# ------------------------------------------------------------------------------------------
# Kernel bodies: te.extern with annotated blocks (``Body``/``extern`` from _extern)


def two_forms(ctx, body, name, fn, cpu=None, **kw):
    """A block with a vector strip in its CUDA form (lanes on threads) and its CPU form (a plain
    loop inside the block), each kept for its own target; one block when there is no strip and
    no ``cpu`` body (the CPU forms' own body, where it differs from ``fn``)."""
    cpu = cpu or fn
    if kw.get("vec") is None and cpu is fn:
        body.block(name, fn, **kw)
        return
    cuda = ctx.on_cuda()
    body.block(name, fn, when=cuda == 1, **kw)
    if kw.get("vec") is None:
        body.block(f"{name}_cpu", cpu, when=cuda == 0, **kw)
        return
    body.block(f"{name}_cpu", cpu, when=cuda == 0, strip="main", **kw)
    body.block(f"{name}_tail", cpu, when=cuda == 0, strip="tail", **kw)


def T_():
    from tvm.script.ir_builder import tirx as T
    return T


def wrap(r, n):
    """A possibly negative index r (Python semantics: -n <= r < n) in [0, n)."""
    r = i64(r)
    return tirx.Select(r < i64(0), r + i64(n), r)


def div(a, b):
    """a / b: truncating for integers (C++'s, as Paddle's integer kernels), else true division."""
    if str(getattr(a, "ty", getattr(a, "dtype", "float32"))).startswith(("int", "uint")):
        return tirx.truncdiv(a, b)
    return a / b


def is_vector(expr) -> bool:
    return "x" in str(expr.ty)


def zeros_like(expr):
    """0 of expr's type (a broadcast for a vector)."""
    ty = str(expr.ty)
    scalar, _, lanes = ty.partition("x")
    zero = tirx.const(0, scalar)
    return tirx.Broadcast(zero, int(lanes)) if lanes else zero


# ------------------------------------------------------------------------------------------
# Scatter along an axis (the core of gather/index_select/take_along_axis/sort grads)

def scatter_along(ctx, src, axis, dest_shape, dt, name, row, inputs, *, assign=False, value=None,
                  own_columns=False):
    """out[c with c[axis] := row(L, c)] (+)= value(L, c) for every coordinate c of ``src``.

    ``inputs``: te.Tensors the body reads (``src`` first); ``L`` their buffer proxies in that
    order; ``row`` gives the destination index along ``axis`` (in range: validated on the host);
    ``value`` the compute-dtype value (default: src[c]). ``out`` has ``dest_shape`` (dims other
    than ``axis`` at least src's) and is 0 where nothing lands. ``assign``: the last element (in
    axis order) landing on a slot wins, as Paddle's CPU kernels; else contributions add up in
    axis order. Deterministic: one thread per column (every coordinate but the axis) walks the
    axis serially; with ``deterministic=False`` (adds only) one CUDA thread per element adds
    atomically. Half types accumulate in float32, rounded once; bool as a count (``acc_dtype``).
    Complex data (``ctx.pair``): src's last dim is the (re, im) pair; every column (pairs
    included) is a parallel unit, without a vector strip (a strip must be the innermost index).
    ``own_columns`` (``dest_shape`` is src's on every dim but ``axis``): a deterministic CPU
    column zeroes its own destination column at its first step, while it is in cache, instead of
    a zero-fill pass over the whole output first (one pass over the output instead of two).
    """
    det = ctx.info.deterministic or assign
    rank = len(src.shape)
    dims = list(src.shape)
    n = dims[axis]
    # the vector strip: the innermost dim when it follows the axis (none for complex data)
    v = rank - 1 if axis < rank - 1 and not ctx.pair else None
    pdims = [d for d in range(rank) if d not in (axis, v)]
    vec = dims[v] if v is not None else None
    acc = acc_dtype(dt)
    value = value or (lambda L, c: tc(L[0][tuple(c)], dt))

    own = own_columns and det
    m = dest_shape[axis]

    def gen(ins, outs, body):
        # with own columns the CPU fills only an output nothing is scattered into (n == 0)
        zero_when = tirx.Or(ctx.on_cuda() == 1, i64(n) == i64(0)) if own else None
        L, out, put = scatter_body(ins, outs, body, assign=assign, zero_when=zero_when)
        dest = proxy(out)
        T = T_()

        def zero_column(c):
            """0 into the whole destination column of c (a strip's lanes at once) at its first
            step."""
            lanes = str(c[v].ty).partition("x")[2] if v is not None else ""
            zero = tirx.const(0, acc)
            zero = tirx.Broadcast(zero, int(lanes)) if lanes else zero
            with T.If(c[axis] == i64(0)):
                with T.Then():
                    with T.serial(0, i64(m)) as k:
                        dest[tuple(c[:axis] + [k] + c[axis + 1:])] = zero

        def store(c, use_atomic):
            c = list(c)
            r = i64(row(L, c))
            if is_vector(r):
                # a CPU strip whose destination rows differ per lane: one lane at a time
                ramp = c[v]
                with T.serial(0, i64(CW)) as lane:
                    store(c[:v] + [ramp.base + lane] + c[v + 1:], use_atomic)
                return
            r = T.Bind(r)
            val = T.Bind(to_acc(value(L, c), dt))
            put(tuple(c[:axis] + [r] + c[axis + 1:]), val, use_atomic)

        if det:
            unit = not pdims

            def column(P, S, C):
                P = P[1:] if unit else P
                c = [None] * rank
                for d, p in zip(pdims, P):
                    c[d] = p
                c[axis] = S[0]
                if v is not None:
                    c[v] = C
                return c

            def col(P, S, C):
                store(column(P, S, C), False)

            def own_col(P, S, C):
                c = column(P, S, C)
                zero_column(c)
                store(c, False)
            two_forms(ctx, body, f"{name}_cols", col, cpu=own_col if own else None,
                      par=([1] if unit else [dims[d] for d in pdims]),
                      ser=[n], vec=vec, reads=list(ins), writes=[out])
        else:
            cuda = ctx.on_cuda()
            body.block(f"{name}_atomic", lambda P, S, C: store(P, True), par=dims,
                       reads=list(ins), writes=[out], when=cuda == 1)
            body.block(f"{name}_serial", lambda P, S, C: store(S, False), ser=dims,
                       reads=list(ins), writes=[out], when=cuda == 0)

    (res,) = extern(f"{name}_scatter", [(list(dest_shape), acc)], list(inputs), gen)
    return cast_to(res, dt, name)


# ------------------------------------------------------------------------------------------
# gather / index_select

# ------------------------------------------------------------------------------------------
# Blocked parallel scan (shared with te_defs/scan.py)

SCAN_MIN_CHUNK = 32


def scan_scalars(n: int) -> dict:
    """Host-computed scan parameters for an axis of n elements: chunk length max(32, ceil(sqrt n))
    and the number of chunks, so that both a chunk and the chunk totals a column walks serially
    are about sqrt(n) long."""
    chunk = max(SCAN_MIN_CHUNK, math.isqrt(max(n - 1, 0)) + 1)
    return {"scan_chunk": chunk, "scan_blocks": -(-n // chunk)}


def blocked_scan(ctx, name, n, cols, inputs, outputs, state, identity, combine, element, emit, *,
                 reverse=False, exclusive=False, coupled=False):
    """A scan along an axis of length ``n`` for every column (``cols``: the column extents).

    The state is a tuple of scalars (dtypes ``state``) combined by the associative ``combine``
    (``identity``: its unit). ``element(L, col, i)`` gives the state of element i (the axis
    index, 0..n-1) of column ``col`` from the input proxies ``L``; ``emit(L, O, col, i, s)``
    stores the outputs (proxies ``O``) of element i from its scan value s (inclusive, or
    exclusive: the elements strictly before it; ``reverse``: scanning from the end).
    ``coupled``: a combined component reads another component of the running state (a complex
    product), so the combined values are bound before any is stored.

    The op passes ``host_scalars=scan_host(view_name)`` (chunk length and count as parameters).
    Three phases, each parallel: (1) every chunk of every column reduces its elements; (2) every
    column scans its chunk totals (serially: about sqrt(n) of them) into carries; (3) every
    chunk rescans its elements from its carry and emits. A long axis is as parallel as many short
    ones (sqrt(n) chunks per column), and the work is about twice a serial scan.
    """
    cols = list(cols)
    scalars = ctx.scalars
    ch, nb = scalars["scan_chunk"], scalars["scan_blocks"]
    part_shape = cols[:-1] + [nb] + cols[-1:] if cols else [nb]

    def split(P):
        """(col, chunk) from the phase-1/3 iteration vars."""
        if not cols:
            return [], P[0]
        return P[:len(cols) - 1] + P[len(cols):], P[len(cols) - 1]

    def part_at(col, b):
        return tuple(col[:-1]) + (b,) + tuple(col[-1:]) if cols else (b,)

    def gen(ins, outs, body):
        L = [proxy(b) for b in ins]
        nout = len(outputs)
        O = [proxy(b) for b in outs[:nout]]
        parts, carries = outs[nout:nout + len(state)], outs[nout + len(state):]
        Q = [proxy(b) for b in parts]
        K = [proxy(b) for b in carries]
        T = T_()

        def local(vals):
            bufs = [scratch((1,), d, word_aligned=True) for d in state]
            for b, v in zip(bufs, vals):
                proxy(b)[0] = v
            return bufs

        def get(bufs):
            return tuple(proxy(b)[0] for b in bufs)

        def put(bufs, vals):
            if coupled:
                vals = tuple(T.Bind(v) for v in vals)
            for b, v in zip(bufs, vals):
                proxy(b)[0] = v

        def positions(stack, b):
            """Opens a serial loop over the chunk's scan positions; -> the axis index."""
            t = stack.enter_context(T.serial(0, ch))
            p = b * ch + t
            stack.enter_context(T.If(p < i64(n)))
            stack.enter_context(T.Then())
            return (i64(n) - i64(1) - p) if reverse else p

        def reduce_chunk(P, S, C):
            col, b = split(P)
            acc = local(identity)
            with contextlib.ExitStack() as stack:
                i = positions(stack, b)
                put(acc, combine(get(acc), element(L, col, i)))
            for q, v in zip(Q, get(acc)):
                q[part_at(col, b)] = v

        body.block(f"{name}_reduce", reduce_chunk, par=part_shape, reads=list(ins),
                   writes=list(parts))

        def carry(P, S, C):
            col = list(P)
            run = local(identity)
            with T.serial(0, nb) as b:
                at = part_at(col, b)
                for q, v in zip(K, get(run)):
                    q[at] = v
                put(run, combine(get(run), tuple(q[at] for q in Q)))
        body.block(f"{name}_carry", carry, par=cols or [1], reads=list(parts),
                   writes=list(carries))

        def apply_chunk(P, S, C):
            col, b = split(P)
            run = local(tuple(q[part_at(col, b)] for q in K))
            with contextlib.ExitStack() as stack:
                i = positions(stack, b)
                e = tuple(T.Bind(v) for v in element(L, col, i))
                if exclusive:
                    emit(L, O, col, i, get(run))
                    put(run, combine(get(run), e))
                else:
                    put(run, combine(get(run), e))
                    emit(L, O, col, i, get(run))
        body.block(f"{name}_apply", apply_chunk, par=part_shape, reads=list(ins) + list(carries),
                   writes=list(outs[:nout]))

    res = extern(name, list(outputs) + [(part_shape, d) for d in state] * 2, list(inputs), gen)
    return res[:len(outputs)]


def scan_host(name):
    """``host_scalars`` of a scan along dim 1 of the view of ``name``."""
    return lambda call, views: scan_scalars(views[name][1])


# ------------------------------------------------------------------------------------------
# masked_select: out_grad[k] goes back to the k-th selected element (a scan of the mask)

