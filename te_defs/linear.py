"""Grads of joining, splitting and broadcasting: concat, stack/unstack/unbind, expand/expand_as,
broadcast_tensors, meshgrid, partial_concat/partial_sum, fill; and the forward ops their double
grads invoke (concat, stack, expand).

All are linear in the cotangent. Joins and splits are gathers over the inverted index map (no
atomics: every output element is read from exactly one place), over zero-copy views that fold
the axis away: a concat of any rank along any axis is seen as ``(outer, size·inner)`` matrices and
a stack as ``(outer, n, inner)``, so one kernel serves every rank, axis and size. Broadcast grads
sum the cotangent over the broadcast dims (accumulating half types in float32) over views that
merge adjacent dims broadcasting alike (one kernel per broadcast pattern, as ``@pointwise``).

Paddle 3.3.1 notes: ``partial_sum``'s kernels use a negative ``start_index`` unnormalised (the
forward reads before each row, the grad writes before its buffer: heap corruption); here, as in
``partial_concat``, a negative start counts from the end. Its ``expand_grad``/``expand_as_grad`` ignore the ``shape``/``target_shape``
attribute (the reduction follows x's and out_grad's shapes); here an out_grad that is not the
expansion the attribute describes is an error (it would be summed into wrong numbers). The list-output
bindings ``_C_ops.concat_grad``, ``broadcast_tensors_grad`` (both raise "Input's size should be
equal to the output's size"), ``stack_grad``, ``meshgrid_grad``, ``partial_concat_grad`` and
``partial_sum_grad`` (all segfault) are unusable; the tests take Paddle's grads through autograd.

Dtypes: each op takes what Paddle registers for it (CPU or GPU). Complex tensors carry their trailing
(re, im) dim after the dims of their view (tvmgrad.families.shape): index maps move both parts
alike (``*c`` below) and sums keep it. Integers copy and sum in their own dtype (wrapping, as
Paddle's kernels); bool sums are ORs (Paddle's bool expand_grad). concat and concat_grad also
take storage-only float8 (tvmgrad.dtypes): they only move its bits.
"""

from __future__ import annotations

import math

from tvmgrad.dtypes import COMPLEX, FLOAT8, FLOATS
from tvmgrad import infer_meta
from tvmgrad.families import pointwise
from tvmgrad.families.broadcast import coalesce
from tvmgrad.families.shape import reduce_to, shape_op, zero
from tvmgrad.infer_meta import MetaError, broadcast_shapes, is_one, norm_axis
from tvmgrad.lazy import te, tirx

from ._plan import split_axis


# ------------------------------------------------------------------------------------------
# shared pieces

CPLX = FLOATS + COMPLEX
INTS = ("int32", "int64")
ALL = CPLX + ("bool", "int8", "uint8", "int16") + INTS       # every dtype tvmgrad computes in
MOVES = ALL + FLOAT8         # and storage-only float8 (tvmgrad.dtypes): kernels that only move data


def _tail(t, rank):
    """The dims of ``t`` after its first ``rank`` (a complex pair, or none)."""
    return tuple(t.shape[rank:])

def _int_axis(call, name="axis"):
    axis = call.attrs[name]
    if isinstance(axis, float) and not axis.is_integer() or isinstance(axis, bool):
        raise TypeError(f"{call.op}: attribute {name!r} must be an integer, got {axis!r}")
    return int(axis)


def _concat_views(metas, axis, joined):
    """Views (outer, size·inner) of the concat pieces and of the joined tensor."""
    pieces = []
    for m in metas:
        o, a, i = split_axis(m.shape, axis)
        pieces.append((o, a * i))
    o, a, i = split_axis(joined, axis)
    return pieces, (o, a * i)


# ------------------------------------------------------------------------------------------
# concat

def _concat_canon(call, outs):
    return {"axis": None}


def _concat_views_fwd(call, outs):
    x = call.meta("x")
    axis = norm_axis(_int_axis(call), x[0].ndim)
    pieces, joined = _concat_views(x, axis, outs[0].shape)
    return {"x": pieces, "out": joined}


@shape_op(infer_meta="ConcatInferMeta", static=("axis",), canon=_concat_canon,
          views=_concat_views_fwd, dtypes=MOVES)
def concat(x, axis):
    """The forward ``concat`` (concat_double_grad invokes it): out = [x_0 | x_1 | ...] along
    ``axis``. Seen as (outer, n_k·inner) pieces: out[o, j] = x_k[o, j - off_k] for the k with
    off_k <= j < off_{k+1}."""
    offs = [tirx.const(0, "int64")]
    for t in x:
        offs.append(offs[-1] + t.shape[1])
    shape = (x[0].shape[0], offs[-1]) + _tail(x[0], 2)

    def body(o, j, *c):
        value = x[-1](o, j - offs[-2], *c)
        for k in range(len(x) - 2, -1, -1):
            value = te.if_then_else(j < offs[k + 1], x[k](o, j - offs[k], *c), value)
        return value

    return te.compute(shape, body, name="concat")


def _concat_grad_check(call, outs):
    x, g = call.meta("x"), call.meta("out_grad")
    _int_axis(call)
    try:
        want = infer_meta.get("ConcatInferMeta")(x, call.attrs["axis"])[0]
    except MetaError as exc:
        raise ValueError(f"{call.op}: {exc}") from None
    if g.shape != want.shape:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected "
                         f"{list(want.shape)} (the concat of x along axis {call.attrs['axis']})")


def _concat_grad_views(call, outs):
    x = call.meta("x")
    axis = norm_axis(_int_axis(call), x[0].ndim)
    pieces, joined = _concat_views(x, axis, call.meta("out_grad").shape)
    return {"x": pieces, "out_grad": joined, "x_grad": pieces}


@shape_op(static=("axis",), canon=_concat_canon, views=_concat_grad_views,
          validate=_concat_grad_check, dtypes=MOVES)
def concat_grad(x, out_grad, axis):
    """x_grad[k] = out_grad's slice of x_k along ``axis``; seen as (outer, n_k·inner) matrices:
    x_grad[k][o, j] = out_grad[o, off_k + j]. One gather per piece, no kernel reads x."""
    def piece(k, off):
        return te.compute(x[k].shape, lambda o, j, *c: out_grad(o, off + j, *c), name=f"x_grad{k}")

    outs, off = [], tirx.const(0, "int64")
    for k, t in enumerate(x):
        outs.append(piece(k, off))
        off = off + t.shape[1]
    return outs


# ------------------------------------------------------------------------------------------
# stack / unstack / unbind

def _stack_views(pieces_meta, axis, stacked_name, pieces_name, stacked_shape):
    ax = norm_axis(axis, len(pieces_meta[0].shape), extra=1)
    shape = pieces_meta[0].shape
    outer, inner = math.prod(shape[:ax]), math.prod(shape[ax:])
    n = len(pieces_meta)
    return {pieces_name: [(outer, inner)] * n, stacked_name: (outer, n, inner)}


def _stack_body(x):
    def body(o, k, i, *c):
        value = x[-1](o, i, *c)
        for m in range(len(x) - 2, -1, -1):
            value = te.if_then_else(k == m, x[m](o, i, *c), value)
        return value
    return body


@shape_op(infer_meta="StackInferMeta", canon=lambda call, outs: {"axis": None},
          views=lambda call, outs: _stack_views(call.meta("x"), call.attrs["axis"], "out", "x",
                                                outs[0].shape), dtypes=ALL)
def stack(x, axis):
    """The forward ``stack`` (stack_double_grad and unbind_grad invoke it): out[..., k, ...] =
    x_k along a new dim ``axis``; seen as out[o, k, i] = x_k[o, i]."""
    shape = (x[0].shape[0], len(x), x[0].shape[1]) + _tail(x[0], 2)
    return te.compute(shape, _stack_body(x), name="stack")


@shape_op(canon=lambda call, outs: {"axis": None},
          views=lambda call, outs: _stack_views(call.meta("out_grad"), call.attrs["axis"],
                                                "x_grad", "out_grad", None),
          dtypes=CPLX + INTS)
def unstack_grad(out_grad, axis):
    """x_grad = stack(out_grad, axis) (the grad of unstack): x_grad[o, k, i] = out_grad_k[o, i]."""
    shape = (out_grad[0].shape[0], len(out_grad), out_grad[0].shape[1]) + _tail(out_grad[0], 2)
    return te.compute(shape, _stack_body(out_grad), name="unstack_grad")


def _stack_grad_check(call, outs):
    x = call.meta("x")
    n = len(outs[0])
    if x is not None:
        if len(x) != n:
            raise ValueError(f"{call.op}: x has {len(x)} tensors but out_grad has {n} along axis "
                             f"{call.attrs['axis']}")
        for i, m in enumerate(x):
            if m.shape != outs[0][0].shape if n else False:
                raise ValueError(f"{call.op}: x[{i}] has shape {list(m.shape)}, expected "
                                 f"{list(outs[0][0].shape)} (out_grad without axis "
                                 f"{call.attrs['axis']})")


def _stack_grad_views(call, outs):
    g = call.meta("out_grad")
    ax = norm_axis(int(call.attrs["axis"]), g.ndim)
    outer, n, inner = split_axis(g.shape, ax)
    return {"out_grad": (outer, n, inner), "x": [(outer, inner)] * n,
            "x_grad": [(outer, inner)] * n}


@shape_op(canon=lambda call, outs: {"axis": None}, views=_stack_grad_views,
          validate=_stack_grad_check, dtypes=ALL)
def stack_grad(x, out_grad, axis):
    """x_grad[k] = out_grad's slice k along ``axis``; seen as x_grad[k][o, i] = out_grad[o, k, i]."""
    def piece(k):
        return te.compute((out_grad.shape[0], out_grad.shape[2]) + _tail(out_grad, 3),
                          lambda o, i, *c: out_grad(o, k, i, *c), name=f"x_grad{k}")
    return [piece(k) for k in range(len(x))]


# ------------------------------------------------------------------------------------------
# expand / expand_as / broadcast_tensors / meshgrid

def _broadcast_views(op, small, big, name="x"):
    """(small's view, big's view): the coalesced views of ``small`` broadcast to ``big``."""
    groups, masks = coalesce(big, [small], [name], op)
    return tuple(1 if m[0] else g for g, m in zip(groups, masks)), tuple(groups)


def _expand_views(call, outs):
    xs, big = _broadcast_views(call.op, call.meta("x").shape, outs[0].shape)
    return {"x": xs, "out": big}


@shape_op(infer_meta="ExpandInferMeta", unit_dims=("x",), canon=lambda call, outs: {"shape": None},
          views=_expand_views, dtypes=ALL)
def expand(x, shape):
    """The forward ``expand`` (expand_double_grad invokes it): out = x broadcast to ``shape``.
    Over coalesced views, a size-1 dim of x is a broadcast dim: out[i] = x[i with those at 0]."""
    dims = [te.var(f"out_d{d}", "int64") if is_one(x.shape[d]) else x.shape[d]
            for d in range(len(x.shape))]
    return te.compute(dims, lambda *i: x(*[0 if is_one(x.shape[d]) else i[d]
                                           for d in range(len(i))]), name="expand")


def _broadcast_check(op, small, big, what_small, what_big):
    try:
        b = broadcast_shapes(small, big, names=(what_small, what_big))
    except MetaError as exc:
        raise ValueError(f"{op}: {exc}") from None
    if b != tuple(big):
        raise ValueError(f"{op}: {what_big} of shape {list(big)} is not a broadcast of "
                         f"{what_small} of shape {list(small)}")


def _expand_grad_check(call, outs):
    """out_grad must be the expansion the attribute describes (``shape`` with -1 for x's dims,
    ``target_shape``: y's shape; empty: out_grad's own shape decides) and a broadcast of x."""
    x, g = call.meta("x"), call.meta("out_grad")
    _broadcast_check(call.op, x.shape, g.shape, "x", "out_grad")
    name = "shape" if "shape" in call.attrs else "target_shape"
    target = call.attrs[name]
    if not target:
        return
    if name == "shape":
        try:
            want = infer_meta.get("ExpandInferMeta")(x, target)[0].shape
        except MetaError as exc:
            raise ValueError(f"{call.op}: {exc}") from None
    else:
        want = tuple(target)
    if tuple(g.shape) != tuple(want):
        raise ValueError(f"{call.op}: input 'out_grad' has shape {list(g.shape)}, but expanding "
                         f"'x' {list(x.shape)} to attribute {name!r} = {list(target)} gives "
                         f"{list(want)}")


def _expand_grad_views(call, outs):
    xs, big = _broadcast_views(call.op, call.meta("x").shape, call.meta("out_grad").shape)
    return {"x": xs, "out_grad": big, "x_grad": xs}


def _sum_to_x(x, out_grad):
    keep = [not is_one(d) for d in x.shape]
    return reduce_to(out_grad, keep, "x_grad")


@shape_op(unit_dims=("x",), canon=lambda call, outs: {"shape": None}, views=_expand_grad_views,
          validate=_expand_grad_check, dtypes=ALL)
def expand_grad(x, out_grad, shape):
    """x_grad = out_grad summed over the dims that expand broadcast (x's size-1 and missing
    leading dims). ``shape`` is not read (as in Paddle): out_grad's shape decides."""
    return _sum_to_x(x, out_grad)


@shape_op(unit_dims=("x",), canon=lambda call, outs: {"target_shape": None},
          views=_expand_grad_views, validate=_expand_grad_check, dtypes=FLOATS + INTS)
def expand_as_grad(x, out_grad, target_shape):
    """x_grad = out_grad summed over the dims that expand_as broadcast (``target_shape`` is not
    read, as in Paddle)."""
    return _sum_to_x(x, out_grad)


def _bt_check(call, outs):
    inp, grads = call.meta("input"), call.meta("out_grad")
    if len(grads) != len(inp):
        raise ValueError(f"{call.op}: out_grad has {len(grads)} tensors but input has {len(inp)}")
    try:
        shape = broadcast_shapes(*(m.shape for m in inp),
                                 names=tuple(f"input[{i}]" for i in range(len(inp))))
    except MetaError as exc:
        raise ValueError(f"{call.op}: {exc}") from None
    for i, g in enumerate(grads):
        if g.shape != shape:
            raise ValueError(f"{call.op}: out_grad[{i}] has shape {list(g.shape)}, expected the "
                             f"broadcast shape {list(shape)}")


def _bt_views(call, outs):
    small, big = [], []
    for k, (m, g) in enumerate(zip(call.meta("input"), call.meta("out_grad"))):
        s, b = _broadcast_views(call.op, m.shape, g.shape, f"input[{k}]")
        small.append(s)
        big.append(b)
    return {"input": small, "out_grad": big, "input_grad": small}


@shape_op(unit_dims=("input",), views=_bt_views, validate=_bt_check,
          dtypes=CPLX + ("bool",) + INTS)
def broadcast_tensors_grad(input, out_grad):
    """input_grad[k] = out_grad[k] summed over the dims input[k] was broadcast along."""
    return [reduce_to(g, [not is_one(d) for d in x.shape], f"input_grad{k}")
            for k, (x, g) in enumerate(zip(input, out_grad))]


def _meshgrid_views(call, outs):
    inputs = call.meta("inputs")
    grid = [math.prod(m.shape) for m in inputs]
    views_g, views_x = [], []
    for k, n in enumerate(grid):
        views_g.append((math.prod(grid[:k]), n, math.prod(grid[k + 1:])))
        views_x.append((1, n, 1))
    return {"outputs_grad": views_g, "inputs": views_x, "inputs_grad": views_x}


@shape_op(views=_meshgrid_views, shape_only=("inputs",), dtypes=CPLX + INTS)
def meshgrid_grad(inputs, outputs_grad):
    """inputs_grad[k][j] = Σ of outputs_grad[k] over every dim but k (seen as (pre, n_k, post))."""
    return [reduce_to(g, (False, True, False), f"inputs_grad{k}") for k, g in enumerate(outputs_grad)]


# ------------------------------------------------------------------------------------------
# partial_concat / partial_sum

def _partial_range(call, outs):
    """Paddle's (start, length) of the column range for x of width n."""
    x = call.meta("x")
    n = x[0].shape[1]
    start, length = int(call.attrs["start_index"]), int(call.attrs["length"])
    if not -n <= start < n if n else start != 0:
        raise ValueError(f"{call.op}: attribute 'start_index' = {start} is out of range "
                         f"[{-n}, {n - 1}] for x of width {n}")
    if start < 0:
        start += n
    if length < -1:
        raise ValueError(f"{call.op}: attribute 'length' = {length} must be >= 0, or -1 (to the "
                         f"end of the row)")
    if length < 0:
        length = n - start
    if start + length > n:
        raise ValueError(f"{call.op}: attributes start_index = {call.attrs['start_index']} and "
                         f"length = {call.attrs['length']} exceed x's width {n}")
    return start, length


def _partial_check(call, outs, concat):
    x, g = call.meta("x"), call.meta("out_grad")
    start, length = _partial_range(call, outs)
    want = (x[0].shape[0], length * len(x) if concat else length)
    if g.shape != want:
        how = f"{len(x)} tensors of x times length {length}" if concat else f"length {length}"
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)} "
                         f"(the rows of x, {how})")
    if g.dtype != x[0].dtype:
        raise TypeError(f"{call.op}: out_grad has dtype {g.dtype.name} but x has {x[0].dtype.name}")


def _partial_canon(call, outs):
    start, length = _partial_range(call, outs)
    return {"start_index": start, "length": length}


@shape_op(runtime=("start_index", "length"), canon=_partial_canon, shape_only=("x",),
          validate=lambda call, outs: _partial_check(call, outs, True), dtypes=CPLX + INTS)
def partial_concat_grad(x, out_grad, start_index, length):
    """x_grad[k][b, j] = out_grad[b, k·length + j - start] for start <= j < start + length, else
    0 (start/length normalised as Paddle's: a negative start counts from the end, a negative
    length means to the end)."""
    def piece(k, t):
        def body(b, j, *c):
            inside = tirx.all(j >= start_index, j < start_index + length)
            return te.if_then_else(inside, out_grad(b, k * length + j - start_index, *c), zero(out_grad))
        return te.compute(t.shape, body, name=f"x_grad{k}")
    return [piece(k, t) for k, t in enumerate(x)]


@shape_op(runtime=("start_index", "length"), canon=_partial_canon, shape_only=("x",),
          validate=lambda call, outs: _partial_check(call, outs, False), dtypes=FLOATS + INTS)
def partial_sum_grad(x, out_grad, start_index, length):
    """x_grad[k][b, j] = out_grad[b, j - start] for start <= j < start + length, else 0."""
    def piece(k, t):
        def body(b, j, *c):
            inside = tirx.all(j >= start_index, j < start_index + length)
            return te.if_then_else(inside, out_grad(b, j - start_index, *c), zero(out_grad))
        return te.compute(t.shape, body, name=f"x_grad{k}")
    return [piece(k, t) for k, t in enumerate(x)]


# ------------------------------------------------------------------------------------------
# fill

@pointwise(dtypes=FLOATS + ("bool",) + INTS)
def fill_grad(out_grad, value):
    """x_grad = 0 (fill overwrites x; Paddle's kernel writes zeros, whatever out_grad holds)."""
    return 0.0
