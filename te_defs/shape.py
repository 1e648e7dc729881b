"""Grads of reshapes, views and index maps: squeeze/unsqueeze/flatten/view (zero-copy), flip/
reverse, roll, crop, pad3d, diag/diagonal, fill_diagonal(_tensor), fold/unfold, frame,
tensor_unfold, as_strided, pixel_(un)shuffle, temporal_shift; and the forward ops their double
grads invoke (flip, reverse, squeeze, unsqueeze, pad3d).

Every kernel is a gather over the inverted index map (Halide's rule): each output element reads
the cotangent elements that map to it, so there are no atomics and every element is computed in
parallel. Where a forward op reads an element several times (pad3d's reflect/replicate/circular
borders, fold/unfold, frame and tensor_unfold windows, overlapping as_strided views) the grad sums
a bounded set of sources per element. Attribute values that only change index arithmetic (offsets,
shifts, strides, window sizes, diagonal offsets, upscale factors, ...) are runtime scalars and
views fold ranks away, so one kernel serves every shape and value. Index math is int64.

Paddle 3.3.1 notes (the tests document each):
* squeeze_grad/unsqueeze_grad/flatten_grad take the forward input x itself as ``xshape`` (its dims
  are x's); the legacy XShape ``[0, *x.dims]`` is accepted too. Their forward ops (squeeze and
  unsqueeze, which the double grads invoke) return x's data as ``xshape``.
* ``as_strided``'s ``offset`` is in bytes (Paddle's DenseTensor offset); it must be a multiple of
  the element size (Paddle reads misaligned garbage otherwise).
* as_strided_grad and tensor_unfold_grad with overlapping windows: Paddle copies out_grad into
  the strided view (the last write wins), which is not the gradient; here overlapping elements
  sum their cotangents. Without overlap both agree.
* fill_diagonal_tensor_grad: Paddle's kernel uses dim1/dim2 unnormalised (negative dims reach
  uninitialised strides); here they are normalised like every axis.

Dtypes: every op takes the dtypes Paddle registers for it (CPU or GPU). Complex64/128 are stored
as float32/64 with a trailing (re, im) dim of 2 (tvmgrad.dtypes): here every complex tensor of a
kernel has that dim after the dims of its view (``ctx.pair`` tells a builder), and both parts move
(or sum) alike. Integers copy and sum in their own dtype (wrapping as Paddle's); bool sums are ORs
(overlapping windows, as a count != 0); a float attribute of an integer kernel (pad3d's
pad_value) is truncated to it, as Paddle's static_cast. float8 (storage only, tvmgrad.dtypes) is
taken by the reshapes, views, diagonal_grad, as_strided_grad and tensor_unfold_grad (Paddle's
float8 registrations), which move its bits; the last two reject it where views overlap (a sum).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tvmgrad.dtypes import COMPLEX, FLOAT8, FLOATS
from tvmgrad.families.shape import alias_op, dt_of, load, shape_op, total, zero
from tvmgrad.infer_meta import MetaError, norm_axes, norm_axis
from tvmgrad.infer_meta.shape import check_pad3d, pad3d_out_shape, squeeze_shape, unsqueeze_shape
from tvmgrad.lazy import te, tirx


def _i64(v):
    return tirx.const(int(v), "int64")


def _err(call, exc):
    raise ValueError(f"{call.op}: {exc}") from None


def _run(call, fn, *args):
    try:
        return fn(*args)
    except MetaError as exc:
        _err(call, exc)


# ------------------------------------------------------------------------------------------
# dtypes: complex pairs, integers, bool (module docstring)

CPLX = FLOATS + COMPLEX
INTS = ("int8", "uint8", "int16", "int32", "int64")
ALL = CPLX + ("bool",) + INTS            # every dtype tvmgrad's dtype layer computes in
MOVES = ALL + FLOAT8                     # and storage-only float8: for kernels that only move data



def _sum_dtype(dt) -> str:
    """The dtype a sum of ``dt`` runs in: its compute dtype; int32 for bool (a count)."""
    return "int32" if dt.name == "bool" else dt.compute


def _no_float8_sums(call, overlaps):
    """float8 is storage only (no arithmetic): a window or view whose elements share storage would
    need their cotangents summed, so it is rejected (``overlaps``: does the call have such)."""
    dt = call.meta("out_grad").dtype
    if dt.name in FLOAT8 and overlaps:
        raise TypeError(f"{call.op}: out_grad is {dt.name}, which tvmgrad only moves (it has no "
                        f"arithmetic), but elements of this call's view overlap: their grads "
                        f"would sum")


def _from_sum(value, dt):
    """A sum (``_sum_dtype``) in dt's storage dtype (bool: the count != 0)."""
    if hasattr(value, "asobject"):          # a te.Tensor element
        value = value.asobject()
    if dt.name == "bool":
        return value != tirx.const(0, str(value.ty))
    return value if str(value.ty) == dt.storage else value.astype(dt.storage)


# ------------------------------------------------------------------------------------------
# zero-copy: squeeze / unsqueeze / flatten / view_shape / view_dtype

def _copy(src, shape_like):
    """A reshape as a kernel (only built when an alias op must convert; never for equal dtypes)."""
    raise RuntimeError("a reshape never needs a kernel")


@alias_op(source="out_grad", shape_only=("xshape",), dtypes=MOVES)
def flatten_grad(xshape, out_grad):
    """x_grad = out_grad reshaped to x's shape (a view with alias=True, else a copy)."""
    return _copy(out_grad, xshape)


def _reshaped_check(fn, verb):
    """Validation of a squeeze/unsqueeze grad: out_grad must be xshape ``fn``-ed at ``axis`` (the
    forward's output), which also checks every axis against xshape's rank."""
    def check(call, outs):
        x = outs[0].shape                   # x's shape as xshape carries it (KernelWithXShapeInferMeta)
        g, axis = call.meta("out_grad"), list(call.attrs["axis"])
        want = _run(call, fn, x, axis, "xshape")
        if tuple(g.shape) != tuple(want):
            raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)}: "
                             f"x {list(x)} (from xshape {list(call.meta('xshape').shape)}) {verb} at "
                             f"axis {axis}")
    return check


@alias_op(source="out_grad", shape_only=("xshape",), dtypes=MOVES,
          validate=_reshaped_check(squeeze_shape, "squeezed"))
def squeeze_grad(xshape, out_grad, axis):
    """x_grad = out_grad reshaped to x's shape (``axis`` only checks out_grad's shape)."""
    return _copy(out_grad, xshape)


@alias_op(source="out_grad", shape_only=("xshape",), dtypes=MOVES,
          validate=_reshaped_check(unsqueeze_shape, "unsqueezed"))
def unsqueeze_grad(xshape, out_grad, axis):
    """x_grad = out_grad reshaped to x's shape (``axis`` only checks out_grad's shape)."""
    return _copy(out_grad, xshape)


@alias_op(source="x", infer_meta="SqueezeWithXShapeInferMeta", dtypes=MOVES,
          validate=lambda call, outs: _run(call, squeeze_shape, call.meta("x").shape,
                                           call.attrs["axis"]))
def squeeze(x, axis):
    """The forward ``squeeze`` (squeeze_double_grad invokes it): out = x without the size-1 dims
    named in ``axis`` (all size-1 dims for an empty ``axis``; other named dims stay); xshape = x."""
    return _copy(x, None), _copy(x, None)


@alias_op(source="x", infer_meta="UnsqueezeWithXShapeInferMeta", dtypes=MOVES)
def unsqueeze(x, axis):
    """The forward ``unsqueeze`` (unsqueeze_double_grad invokes it): out = x with size-1 dims
    inserted at ``axis`` (one by one, each relative to the rank so far); xshape = x."""
    return _copy(x, None), _copy(x, None)


def _view_shape_check(call, outs):
    inp, g = call.meta("input"), call.meta("out_grad")
    if inp.dtype != g.dtype:
        raise TypeError(f"{call.op}: out_grad has dtype {g.dtype.name} but input has "
                        f"{inp.dtype.name}; they must match")
    if math.prod(inp.shape) != math.prod(g.shape):
        raise ValueError(f"{call.op}: out_grad of shape {list(g.shape)} cannot be viewed as input's "
                         f"shape {list(inp.shape)}")
    dims = [int(d) for d in call.attrs["dims"]]
    # the forward's view: each dim as given, one -1 inferred, a 0 copying input's dim (Paddle's
    # ValidateShape); out_grad has that shape
    fits = (len(dims) == g.ndim and dims.count(-1) <= 1
            and all(d == n or d == -1 or d == 0 and i < inp.ndim and inp.shape[i] == n
                    for i, (d, n) in enumerate(zip(dims, g.shape))))
    if not fits:
        raise ValueError(f"{call.op}: attribute 'dims' = {dims} does not give out_grad's shape "
                         f"{list(g.shape)} (the forward viewed input {list(inp.shape)} as dims)")


@alias_op(source="out_grad", shape_only=("input",), validate=_view_shape_check, dtypes=MOVES)
def view_shape_grad(input, out_grad, dims):
    """input_grad = out_grad viewed with input's shape (``dims`` is not needed)."""
    return _copy(out_grad, input)


def _view_dtype_shape(shape, src_size, dst_size):
    """Paddle's view_dtype: the last dim scales by the element-size ratio (None: not viewable)."""
    if src_size == dst_size:
        return tuple(shape)
    if not shape:
        return None
    last = shape[-1] * src_size
    if last % dst_size:
        return None
    return tuple(shape[:-1]) + (last // dst_size,)


# every dtype tvmgrad handles: Paddle registers view_dtype(_grad) for all of them (float8: its bits
# are reinterpreted, never computed on)
VIEW_DTYPES = MOVES


def _view_dtype_check(call, outs):
    inp, g = call.meta("input"), call.meta("out_grad")
    for name, m in (("input", inp), ("out_grad", g)):
        if m.dtype.name not in VIEW_DTYPES:
            raise TypeError(f"{call.op}: {name} has dtype {m.dtype.name}; view_dtype_grad supports "
                            f"{', '.join(VIEW_DTYPES)}")
    expect = _view_dtype_shape(inp.shape, inp.dtype.numpy.itemsize, g.dtype.numpy.itemsize)
    if expect is None or expect != tuple(g.shape):
        why = ("none (a 0-d tensor keeps its element size)" if not inp.shape and expect is None
               else "none (its last dim does not divide)" if expect is None else list(expect))
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}; input of shape "
                         f"{list(inp.shape)} ({inp.dtype.name}) viewed as {g.dtype.name} has shape "
                         f"{why}")


_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _scalar_size(storage: str) -> int:
    """Bytes of one stored scalar (a complex number is two of its real storage scalars)."""
    return 1 if storage == "bool" else np.dtype(_np_name(storage)).itemsize


def _flat_views(call, outs):
    """Every tensor of view_dtype_grad seen flat, (elements,) (plus a complex dtype's (re, im) pair)."""
    return {"out_grad": (math.prod(call.meta("out_grad").shape),),
            "input": (math.prod(call.meta("input").shape),),
            "input_grad": (math.prod(outs[0].shape),)}


def _flat_scalar(t, j):
    """The j-th stored scalar of a flat placeholder (a complex one holds (re, im) pairs)."""
    if len(t.shape) == 2:
        return t[j // 2, j % 2]
    return t[j]


def _to_bits(v, storage):
    size = _scalar_size(storage)
    if storage == "bool":
        return v.astype("uint8")
    return v if storage == _UINT[size] else tirx.reinterpret(_UINT[size], v)


def _from_bits(bits, storage):
    if storage == "bool":
        return bits != tirx.const(0, "uint8")        # a bool holds 0 or 1 (see the builder)
    return bits if storage == _UINT[_scalar_size(storage)] else tirx.reinterpret(storage, bits)


def view_dtype_grad(input, out_grad, dtype):
    """input_grad = out_grad's bytes viewed as input's dtype (Paddle's ViewDtypeGradKernel, which
    is ViewDtypeKernel(out_grad, input.dtype)): a view when the dtypes match, else a bit-exact
    reinterpretation for every pair of dtypes (floats, complex, integers, bool; little-endian: a
    wider scalar joins the narrower ones after it, a narrower one takes its part of the wider
    one; input's last dim is out_grad's scaled by the size ratio). As in Paddle, the ``dtype``
    attribute is not read: out_grad's own dtype is what was viewed. A bool input_grad holds
    byte != 0 (a TVM bool is 0 or 1; Paddle would keep other byte values as they are)."""
    src, dst = str(out_grad.dtype), str(input.dtype)
    ss, ds = _scalar_size(src), _scalar_size(dst)
    ud = _UINT[ds]
    shape = list(input.shape)
    pair = len(shape) == 2

    def flat(i):
        return i[0] * 2 + i[1] if pair else i[0]

    if ss == ds:
        return te.compute(shape, lambda *i: _from_bits(_to_bits(_flat_scalar(out_grad, flat(i)), src), dst),
                          name="input_grad")
    if ds > ss:
        k = ds // ss

        def wide(*i):
            j = flat(i)
            bits = tirx.const(0, ud)
            for t in range(k):
                part = _to_bits(_flat_scalar(out_grad, j * k + t), src).astype(ud)
                bits = bits | (part << tirx.const(8 * ss * t, ud))
            return _from_bits(bits, dst)
        return te.compute(shape, wide, name="input_grad")
    k = ss // ds
    us = _UINT[ss]

    def narrow(*i):
        j = flat(i)
        word = _to_bits(_flat_scalar(out_grad, j // k), src)
        shift = (j % k).astype(us) * tirx.const(8 * ds, us)
        return _from_bits((word >> shift).astype(ud), dst)
    return te.compute(shape, narrow, name="input_grad")


# a view of out_grad when the dtypes match (no kernel), else the kernel that reinterprets the bytes
view_dtype_grad = alias_op(view_dtype_grad, source="out_grad", shape_only=("input",), dtypes=VIEW_DTYPES,
                           validate=_view_dtype_check, views=_flat_views)


def _np_name(tvm_dtype: str) -> str:
    return "uint16" if tvm_dtype == "bfloat16" else tvm_dtype


# ------------------------------------------------------------------------------------------
# flip / reverse

def _flip_views(shape, axes):
    """Merge adjacent dims flipped alike, drop size-1 dims -> (view, flags)."""
    flags = [d in axes for d in range(len(shape))]
    view, out = [], []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if out and out[-1] == flags[d]:
            view[-1] *= n
        else:
            view.append(n)
            out.append(flags[d])
    if not view:
        return (1,), (False,)
    return tuple(view), tuple(out)


def _flip_plan(name_in, name_out, unique):
    def views(call, outs):
        x = call.meta(name_in)
        axes = set(norm_axes(call.attrs["axis"], x.ndim, unique=unique, of=name_in, op=call.op))
        view, _ = _flip_views(x.shape, axes)
        return {name_in: view, name_out: view}

    def canon(call, outs):
        x = call.meta(name_in)
        axes = set(norm_axes(call.attrs["axis"], x.ndim, unique=unique, of=name_in, op=call.op))
        return {"axis": _flip_views(x.shape, axes)[1]}
    return views, canon


def _flip_body(x, flags, name):
    """x flipped along the dims ``flags`` marks (dims past the flags, a complex pair, stay)."""
    return te.compute(x.shape, lambda *i: x(*[x.shape[d] - 1 - i[d] if d < len(flags) and flags[d]
                                              else i[d] for d in range(len(i))]), name=name)


_fv, _fc = _flip_plan("x", "out", True)


@shape_op(infer_meta="FlipInferMeta", views=_fv, canon=_fc, dtypes=CPLX + ("bool", "int32", "int64"))
def flip(x, axis):
    """The forward ``flip`` (flip_grad invokes it: the grad of a flip is the same flip):
    out[i] = x[i with i_d -> n_d - 1 - i_d for d in axis]."""
    return _flip_body(x, axis, "flip")


_rv, _rc = _flip_plan("x", "out", False)


@shape_op(infer_meta="ReverseInferMeta", views=_rv, canon=_rc,
          dtypes=FLOATS + ("bool", "uint8", "int32", "int64"))
def reverse(x, axis):
    """The forward ``reverse`` (reverse_grad invokes it): flip along the set of ``axis`` (a
    repeated axis reverses once, as in Paddle; ``axis`` must not be empty)."""
    return _flip_body(x, axis, "reverse")


# ------------------------------------------------------------------------------------------
# roll

def _roll_parts(call):
    """(views of out_grad/x_grad, rolled flags, per-rolled-dim shift of the grad in [0, n))."""
    g = call.meta("out_grad")
    shifts, axis = list(call.attrs["shifts"]), list(call.attrs["axis"])
    if not axis:
        if len(shifts) != 1:
            raise ValueError(f"{call.op}: attribute 'shifts' = {shifts} must have one element when "
                             f"'axis' is empty (the tensor is rolled flattened)")
        size = math.prod(g.shape)
        return (max(size, 1),), (True,), [shifts[0] % size if size else 0]
    if len(shifts) != len(axis):
        raise ValueError(f"{call.op}: attributes 'shifts' = {shifts} and 'axis' = {axis} must have "
                         f"the same length")
    total_shift = [0] * g.ndim
    for s, a in zip(shifts, axis):
        d = norm_axis(int(a), g.ndim, of="out_grad", op=call.op)
        total_shift[d] += s
    rolled = [t % g.shape[d] != 0 if g.shape[d] else False for d, t in enumerate(total_shift)]
    view, flags, values = [], [], []
    for d, n in enumerate(g.shape):
        if rolled[d]:
            view.append(n)
            flags.append(True)
            values.append(total_shift[d] % n)
        elif flags and not flags[-1]:
            view[-1] *= n
        else:
            view.append(n)
            flags.append(False)
    return tuple(view), tuple(flags), values


def _roll_check(call, outs):
    x, g = call.meta("x"), call.meta("out_grad")
    if x.shape != g.shape:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)} but x has {list(x.shape)}")
    _roll_parts(call)


@shape_op(runtime=("shifts",), validate=_roll_check, dtypes=CPLX + ("int32", "int64"),
          canon=lambda call, outs: {"shifts": _roll_parts(call)[2], "axis": _roll_parts(call)[1]},
          views=lambda call, outs: {n: _roll_parts(call)[0] for n in ("x", "out_grad", "x_grad")})
def roll_grad(x, out_grad, shifts, axis):
    """x_grad = roll(out_grad, -shifts): x_grad[i] = out_grad[i with i_d -> (i_d + s_d) mod n_d]
    (s_d: the grad's shift of dim d, reduced to [0, n_d) on the host; ``axis`` empty rolls the
    flattened tensor). The wrap is a compare, not a modulo."""
    flags = axis

    def body(*i):
        point, k = [], 0
        for d, flag in enumerate(flags):
            if flag:
                j = i[d] + shifts[k]
                k += 1
                point.append(tirx.Select(j >= out_grad.shape[d], j - out_grad.shape[d], j))
            else:
                point.append(i[d])
        return out_grad(*point, *i[len(flags):])             # (a complex pair)
    return te.compute(out_grad.shape, body, name="x_grad")


# ------------------------------------------------------------------------------------------
# crop

def _inside(i, lo, n):
    return tirx.all(i >= lo, i < lo + n)


def _same_dtype_check(a, b):
    def check(call, outs):
        ma, mb = call.meta(a), call.meta(b)
        if ma.dtype != mb.dtype:
            raise TypeError(f"{call.op}: input {b!r} has dtype {mb.dtype.name} but {a!r} has "
                            f"{ma.dtype.name}; they must match")
    return check


@shape_op(runtime=("offsets",), shape_only=("x",), validate=_same_dtype_check("x", "out_grad"),
          dtypes=FLOATS + ("int32", "int64"))
def crop_grad(x, out_grad, offsets):
    """x_grad[i] = out_grad[i - offsets] inside the cropped box, else 0."""
    def body(*i):
        inside = tirx.all(*[_inside(i[d], offsets[d], out_grad.shape[d]) for d in range(len(i))])
        return te.if_then_else(inside, out_grad(*[i[d] - offsets[d] for d in range(len(i))]),
                               zero(out_grad))
    return te.compute(x.shape, body, name="x_grad")


# ------------------------------------------------------------------------------------------
# pad3d

def _pad_view(shape, data_format):
    """(N·C, D, H, W) of an NCDHW shape, (N, D, H, W, C) of an NDHWC one: dims 1-3 are D, H, W
    (W innermost in memory for NCDHW, so the inner loop is a contiguous row)."""
    if data_format == "NCDHW":
        n, c, d, h, w = shape
        return (n * c, d, h, w)
    return tuple(shape)


def _pad_pairs(paddings):
    """(front, back), (top, bottom), (left, right): the pads of D, H, W."""
    pl, pr, pt, pb, pf, pk = paddings
    return ((pf, pk), (pt, pb), (pl, pr))


def _pad_sources(mode, a, b, i, n):
    """[(valid, o)]: the padded positions o (along one dim with input size n and pads a, b) that
    pad3d's ``mode`` maps to input position i."""
    direct = [(tirx.const(True, "bool"), i + a)]
    if mode == "constant":
        return direct
    if mode == "reflect":          # a, b: runtime vars (or ints; 0 drops the term)
        out = list(direct)
        if not (isinstance(a, int) and a == 0):
            out.append((tirx.all(i >= 1, i <= a), a - i))
        if not (isinstance(b, int) and b == 0):
            out.append((tirx.all(i >= n - 1 - b, i <= n - 2), a + 2 * n - 2 - i))
        return out
    if mode == "replicate":
        return (direct + [(i == 0, _i64(r)) for r in range(a)]
                + [(i == n - 1, a + n + r) for r in range(b)])
    # circular: o = i + a + k·n for every k with 0 <= o < a + n + b
    return (direct + [(i + a - k * n >= 0, i + a - k * n) for k in range(1, a + 1)]
            + [(i + k * n < n + b, i + a + k * n) for k in range(1, b + 1)])


def _pad3d_check(call, outs):
    x, g = call.meta("x"), call.meta("out_grad")
    a = call.attrs
    try:
        check_pad3d(x, a["paddings"], a["mode"], a["data_format"])
    except MetaError as exc:
        if "empty" not in str(exc):          # the grad of an empty input is just empty
            _err(call, exc)
    want = pad3d_out_shape(x.shape, a["paddings"], a["data_format"])
    if g.shape != want:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)} "
                         f"(x padded by {list(a['paddings'])} in {a['data_format']})")
    if g.dtype != x.dtype:
        raise TypeError(f"{call.op}: out_grad has dtype {g.dtype.name} but x has {x.dtype.name}")


# the most border positions of the contiguous dim that pad3d_grad enumerates (each a row-level
# term); wider pads take the per-element form
_BORDER_TERMS = 16


def _inner_pads(call):
    """W's pads where W is the contiguous dim (NCDHW) and they are few enough to enumerate."""
    (_, _), (_, _), (pl, pr) = _pad_pairs(tuple(call.attrs["paddings"]))
    if call.attrs["data_format"] == "NCDHW" and 0 < pl + pr <= _BORDER_TERMS:
        return (pl, pr)
    return None


def _pad3d_grad_canon(call, outs):
    """constant and reflect take the pads at run time (the key holds which dims are padded and,
    for reflect, W's pads where they are enumerated); replicate and circular sum a number of
    sources that depends on the pads: static."""
    mode, pads = call.attrs["mode"], tuple(call.attrs["paddings"])
    if mode in ("constant", "reflect"):
        flags = tuple(bool(a or b) for a, b in _pad_pairs(pads))
        inner = _inner_pads(call) if mode == "reflect" else None
        return {"pad_value": None, "mode": (mode, (flags, inner))}
    return {"pad_value": None, "mode": (mode, (pads, _inner_pads(call)))}


@shape_op(static=("pad_value",), runtime=("paddings",), validate=_pad3d_check,
          pattern="gather_sums", canon=_pad3d_grad_canon, dtypes=CPLX + ("int32", "int64"),
          views=lambda call, outs: {"x": _pad_view(call.meta("x").shape, call.attrs["data_format"]),
                                    "x_grad": _pad_view(call.meta("x").shape, call.attrs["data_format"]),
                                    "out_grad": _pad_view(call.meta("out_grad").shape,
                                                          call.attrs["data_format"])})
def pad3d_grad(x, out_grad, paddings, mode, pad_value, data_format):
    """x_grad[i] = Σ out_grad[o] over the padded positions o that ``mode`` reads from i, dim by
    dim (seen as (N·C, D, H, W) or (N, D, H, W, C)): constant is a shifted copy; reflect adds at
    most two mirror images per dim; replicate adds the border rows to the edge elements;
    circular adds every wrap-around copy. One pass over x_grad: the choice of D and H sources
    is a per-row scalar (a branch: a row's mirror images are loaded only where they exist),
    and W, where it is the contiguous dim, is the shifted row plus one row-level term per
    border position o (added to the one element o maps to), so the row stays a contiguous
    vector load (no per-element gather). Replicate and
    circular pads are static (a kernel per padding), reflect's W pads too where enumerated."""
    mode, (extra, inner_pads) = mode
    if mode in ("constant", "reflect"):
        pairs, flags = _pad_pairs(paddings), extra             # runtime pads
    else:
        pairs = _pad_pairs(extra)                             # static pads
        flags = tuple(bool(a or b) for a, b in pairs)
    dt = dt_of(out_grad)
    if mode == "constant":
        (pf, _), (pt, _), (pl, _) = pairs
        return te.compute(x.shape, lambda o, d, h, w, *c: out_grad(o, d + pf, h + pt, w + pl, *c),
                          name="x_grad")
    active = [(d, a, b, x.shape[d]) for d, (a, b), f in zip((1, 2, 3), pairs, flags) if f]
    if not active:
        return te.compute(x.shape, lambda *i: out_grad(*i), name="x_grad")
    inner = None
    if inner_pads is not None:                                  # W enumerated: static pads
        inner = (3, *inner_pads, x.shape[3])
        active = [e for e in active if e[0] != 3]
    # rows in vector steps (gather_sums.rows) unless the contiguous dim's pads are per element:
    # NCDHW's W too wide to enumerate is an element-wise gather, and the row rule's loop
    # partition would split the row loop by each of its conditions in turn
    rows = len(x.shape) == 5 or all(d != 3 for d, *_ in active)
    return te.compute(x.shape, _pad_body(out_grad, active, inner, mode, dt.storage),
                      name="x_grad", attrs={"gather_sums.rows": 1} if rows else {})


def _border_sources(mode, a, b, n):
    """[(i, o)]: each border position o of one dim (input size n, static pads a, b) with the
    input position i that pad3d's ``mode`` reads it from (as pad3d_double_grad maps it)."""
    left = [(_pad_map(mode, _i64(o - a), n), _i64(o)) for o in range(a)]
    right = [(_pad_map(mode, n + r, n), a + n + r) for r in range(b)]
    return left + right


def _pad_map(mode, p, n):
    """The input position that pad3d's ``mode`` reads at padded position p (pads removed)."""
    if mode == "reflect":
        p = tirx.Select(p < 0, -p, p)
        return tirx.Select(p >= n, 2 * n - 2 - p, p)
    if mode == "replicate":
        return tirx.max(tirx.min(p, n - 1), _i64(0))
    if mode == "circular":
        return tirx.floormod(p, n)
    return p


def _pad_body(src, dims, inner, mode, out_dtype):
    """pad3d_grad's element: the sum over every combination of the sources of the padded dims
    ``dims`` = [(d, a, b, n)] (loads clamped into bounds; the always-valid one let-bound, each
    other a branch on its row-level validity, so a row loads no mirror image it lacks), taken
    at the shifted contiguous position and, with ``inner`` = (d, a, b, n), at each of its
    border positions (a row-level scalar added where it maps to)."""
    compute = dt_of(src).compute

    def body(*i):
        per_dim = [[(valid, tirx.max(tirx.min(o, src.shape[d] - 1), _i64(0)))
                    for valid, o in _pad_sources(mode, a, b, i[d], n)] for d, a, b, n in dims]
        lets = []

        def rows_at(col):
            acc = None
            for combo in itertools.product(*per_dim):
                idx = list(i)
                valid = None
                for (d, _, _, _), (ok, o) in zip(dims, combo):
                    idx[d] = o
                    valid = ok if valid is None else tirx.all(valid, ok)
                if col is not None:
                    idx[inner[0]] = col
                if valid is None:        # a let-bound load: read once for the row and its borders
                    v = tirx.Var(f"v{len(lets)}", compute)
                    lets.append((v, load(src, *idx)))
                    term = v
                else:                    # a branch on a row-level flag: no load where it is off
                    term = tirx.if_then_else(valid, load(src, *idx), tirx.const(0, compute))
                acc = term if acc is None else acc + term
            return acc

        if inner is None:
            acc = rows_at(None)
        else:
            d, a, b, n = inner
            acc = rows_at(i[d] + a)
            for at, o in _border_sources(mode, a, b, n):
                acc = acc + tirx.Select(i[d] == at, rows_at(o), tirx.const(0, compute))
        acc = acc.astype(out_dtype)
        for v, value in reversed(lets):
            acc = tirx.Let(v, value, acc)
        return acc
    return body


@shape_op(infer_meta="Pad3dInferMeta", runtime=("paddings",), dtypes=CPLX + ("int32", "int64"),
          views=lambda call, outs: {"grad_x_grad": _pad_view(call.meta("grad_x_grad").shape,
                                                             call.attrs["data_format"]),
                                    "grad_out_grad": _pad_view(outs[0].shape,
                                                               call.attrs["data_format"])})
def pad3d_double_grad(grad_x_grad, paddings, mode, pad_value, data_format, ctx):
    """grad_out_grad = pad3d(grad_x_grad) (Paddle's pad3d kernel): out[o] = x[map(o)] per dim,
    map = o - a reflected (reflect), clamped (replicate) or wrapped (circular); constant mode
    writes ``pad_value`` outside (complex: pad_value + 0i; integers: pad_value truncated, as
    Paddle's static_cast). Pads and pad_value are runtime scalars: a kernel per mode."""
    x = grad_x_grad
    pairs = _pad_pairs(paddings)
    shape = [x.shape[0]] + [x.shape[k + 1] + sum(pairs[k]) for k in range(3)] + list(x.shape[4:])

    def src(k, o):
        return _pad_map(mode, o - pairs[k][0], x.shape[k + 1])

    def body(o, d, h, w, *c):
        idx = [o, src(0, d), src(1, h), src(2, w), *c]
        if mode != "constant":
            return x(*idx)
        inside = tirx.all(*[_inside(v, pairs[k][0], x.shape[k + 1]) for k, v in enumerate((d, h, w))])
        fill = pad_value.astype(str(x.dtype))
        if ctx.pair:                                   # the imaginary part of the fill is 0
            fill = tirx.Select(c[-1] == 0, fill, zero(x))
        return te.if_then_else(inside, x(*idx), fill)
    return te.compute(shape, body, name="grad_out_grad")


# ------------------------------------------------------------------------------------------
# diag / diagonal / fill_diagonal / fill_diagonal_tensor

def _diag_check(call, outs):
    x, g = call.meta("x"), call.meta("out_grad")
    k = int(call.attrs["offset"])
    if x.ndim == 1:
        n = x.shape[0] + abs(k)
        want = (n, n)
    elif x.ndim == 2:
        r, c = x.shape
        length = min(r, c - k) if k >= 0 else min(r + k, c)
        want = (max(length, 0),)
    else:
        raise ValueError(f"{call.op}: x has rank {x.ndim}; diag takes a 1-D or 2-D tensor")
    if g.shape != want:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)} for "
                         f"x of shape {list(x.shape)} and offset {k}")


@shape_op(runtime=("offset",), validate=_diag_check, dtypes=CPLX + ("int32", "int64"),
          canon=lambda call, outs: {"offset": (max(-int(call.attrs["offset"]), 0),
                                               max(int(call.attrs["offset"]), 0))})
def diag_grad(x, out_grad, offset, ctx):
    """x 1-D: x_grad[i] = out_grad[i + r0, i + c0] (the offset-th diagonal; r0 = max(-offset, 0),
    c0 = max(offset, 0)). x 2-D: x_grad[i, j] = out_grad[i - r0] where j - i = offset, else 0."""
    r0, c0 = offset
    if len(x.shape) - ctx.pair == 1:
        return te.compute(x.shape, lambda i, *p: out_grad[(i + r0, i + c0) + p], name="x_grad")
    return te.compute(x.shape, lambda i, j, *p: te.if_then_else(
        j - i == c0 - r0, out_grad[(i - r0,) + p], zero(out_grad)), name="x_grad")


def _diagonal_parts(call):
    x = call.meta("x")
    if x.ndim < 2:
        raise ValueError(f"{call.op}: x has rank {x.ndim}; diagonal needs rank >= 2")
    a1 = norm_axis(int(call.attrs["axis1"]), x.ndim, "axis1", of="x", op=call.op)
    a2 = norm_axis(int(call.attrs["axis2"]), x.ndim, "axis2", of="x", op=call.op)
    if a1 == a2:
        raise ValueError(f"{call.op}: attributes 'axis1' and 'axis2' name the same dim {a1}")
    return x, a1, a2


def _diagonal_check(call, outs):
    x, a1, a2 = _diagonal_parts(call)
    k = int(call.attrs["offset"])
    n1, n2 = x.shape[a1], x.shape[a2]
    length = max(min(n1, n2 - k) if k >= 0 else min(n1 + k, n2), 0)
    want = tuple(n for d, n in enumerate(x.shape) if d not in (a1, a2)) + (length,)
    g = call.meta("out_grad")
    if g.shape != want:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)} for "
                         f"x {list(x.shape)} with offset {k}, axis1 {a1} and axis2 {a2}")


@shape_op(runtime=("offset",), validate=_diagonal_check, dtypes=MOVES,
          canon=lambda call, outs: {"axis1": _diagonal_parts(call)[1],
                                    "axis2": _diagonal_parts(call)[2],
                                    "offset": (max(-int(call.attrs["offset"]), 0),
                                               max(int(call.attrs["offset"]), 0))})
def diagonal_grad(x, out_grad, offset, axis1, axis2, ctx):
    """x_grad[idx] = out_grad[idx without axis1/axis2, idx[axis1] - r0] where idx[axis2] -
    idx[axis1] = offset (r0 = max(-offset, 0)), else 0."""
    r0, c0 = offset
    rank = len(x.shape) - ctx.pair

    def body(*i):
        rest = [i[d] for d in range(rank) if d not in (axis1, axis2)]
        return te.if_then_else(i[axis2] - i[axis1] == c0 - r0,
                               out_grad(*rest, i[axis1] - r0, *i[rank:]), zero(out_grad))
    return te.compute(x.shape, body, name="x_grad")


def _fill_diagonal_canon(call, outs):
    """Paddle's FillDiagonalGradKernel on the flat tensor: positions p = i + offset for i in
    range(0, wrapsize, stride) with 0 <= i % d1 + offset < d1 are zeroed."""
    g = call.meta("out_grad")
    size, d1 = math.prod(g.shape), g.shape[1]
    stride, prod = 0, 1
    for n in reversed(g.shape):
        stride += prod
        prod *= n
    wrapsize = size if call.attrs["wrap"] else min(size, d1 * d1)
    return {"offset": (int(call.attrs["offset"]), stride, wrapsize, max(d1, 1)), "value": None,
            "wrap": None}


def _flat_views(*names):
    def views(call, outs):
        size = math.prod(call.meta(names[0]).shape)
        return {n: (size,) for n in names}
    return views


@shape_op(runtime=("offset",), static=("value",), canon=_fill_diagonal_canon,
          views=_flat_views("out_grad", "x_grad"), dtypes=FLOATS + ("bool", "int32", "int64"))
def fill_diagonal_grad(out_grad, value, offset, wrap):
    """x_grad = out_grad with the filled positions zeroed: flat position q is filled when
    i = q - offset satisfies 0 <= i < wrapsize, i % stride == 0 and 0 <= i % d1 + offset < d1
    (stride = 1 + d_last + d_last·d_prev + ..., wrapsize = numel with wrap, else
    min(numel, d1²); d1 = dims[1], as Paddle's kernel for any rank)."""
    off, stride, wrapsize, d1 = offset

    def body(q):
        i = q - off
        col = tirx.floormod(i, d1) + off
        filled = tirx.all(i >= 0, i < wrapsize, tirx.floormod(i, stride) == 0, col >= 0, col < d1)
        return tirx.Select(filled, zero(out_grad), out_grad[q])
    return te.compute(out_grad.shape, body, name="x_grad")


def _fdt_canon(call, outs):
    g = call.meta("out_grad")
    return {"dim1": norm_axis(int(call.attrs["dim1"]), g.ndim, "dim1", of="out_grad", op=call.op),
            "dim2": norm_axis(int(call.attrs["dim2"]), g.ndim, "dim2", of="out_grad", op=call.op)}


@shape_op(runtime=("offset",), canon=_fdt_canon, dtypes=ALL)
def fill_diagonal_tensor_grad(out_grad, offset, dim1, dim2):
    """x_grad = out_grad with the (dim1, dim2, offset) diagonal zeroed: positions where
    idx[dim2] - idx[dim1] = offset (the ones fill_diagonal_tensor overwrote)."""
    def body(*i):
        return tirx.Select(i[dim2] - i[dim1] == offset, zero(out_grad), out_grad(*i))
    return te.compute(out_grad.shape, body, name="x_grad")


# ------------------------------------------------------------------------------------------
# fold / unfold (im2col and col2im)

def _conv_attrs(call, spatial, pads=None, spatial_of="x"):
    """(kernel, strides, pads [top, left, bottom, right], dilations) as validated int tuples and
    the block grid (bh, bw) for a spatial size (h, w)."""
    a = call.attrs
    k, s, p, d = (tuple(a["kernel_sizes"]), tuple(a["strides"]), tuple(a["paddings"]),
                  tuple(a["dilations"]))
    if pads is not None and len(p) == 4 and all(e >= 0 for e in p):
        p = tuple(pads)
    for name, v, n in (("kernel_sizes", k, 2), ("strides", s, 2), ("dilations", d, 2)):
        if len(v) != n or any(e <= 0 for e in v):
            raise ValueError(f"{call.op}: attribute {name!r} = {list(v)} must be {n} positive ints")
    if len(p) != 4 or any(e < 0 for e in p):
        raise ValueError(f"{call.op}: attribute 'paddings' = {list(a['paddings'])} must be 4 "
                         f"non-negative ints (top, left, bottom, right)")
    grid = []
    for ax in range(2):
        span = spatial[ax] + p[ax] + p[ax + 2] - (d[ax] * (k[ax] - 1) + 1)
        if span < 0:
            raise ValueError(f"{call.op}: the kernel (kernel_sizes {list(k)}, dilations "
                             f"{list(d)}) does not fit the padded input of spatial size {list(spatial)} "
                             f"({spatial_of}) with paddings {list(p)}")
        grid.append(span // s[ax] + 1)
    return k, s, p, d, tuple(grid)


def _fold_parts(call):
    x, g = call.meta("x"), call.meta("out_grad")
    if x.ndim != 3:
        raise ValueError(f"{call.op}: x has rank {x.ndim}; fold takes [N, C·kh·kw, L]")
    out_sizes = tuple(call.attrs["output_sizes"])
    if len(out_sizes) != 2:
        raise ValueError(f"{call.op}: attribute 'output_sizes' = {list(out_sizes)} must have 2 ints")
    if any(e <= 0 for e in out_sizes):
        raise ValueError(f"{call.op}: attribute 'output_sizes' = {list(out_sizes)} must be positive")
    # Paddle's fold pads symmetrically by paddings[0] (height) and paddings[1] (width) whatever the
    # other two say (FoldInferMeta and its im2col); fold_grad follows it
    pads = tuple(call.attrs["paddings"])
    k, s, p, d, grid = _conv_attrs(call, out_sizes, pads[:2] * 2 if len(pads) == 4 else None,
                                   "output_sizes")
    n, ckk, length = x.shape
    if ckk % (k[0] * k[1]) or length != grid[0] * grid[1]:
        raise ValueError(f"{call.op}: x of shape {list(x.shape)} does not match kernel_sizes "
                         f"{list(k)} and the {grid[0]}x{grid[1]} blocks of output_sizes "
                         f"{list(out_sizes)} (strides {list(s)}, paddings {list(pads)}, dilations "
                         f"{list(d)})")
    c = ckk // (k[0] * k[1])
    if g.shape != (n, c) + out_sizes:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected "
                         f"{[n, c, *out_sizes]} from x {list(x.shape)}, kernel_sizes {list(k)} and "
                         f"output_sizes {list(out_sizes)}")
    return (n, c, k[0], k[1], grid[0], grid[1]), s, p, d


@shape_op(runtime=("strides", "paddings", "dilations"), validate=lambda call, outs: _fold_parts(call),
          dtypes=CPLX,
          canon=lambda call, outs: {"output_sizes": None, "kernel_sizes": None,
                                    "strides": _fold_parts(call)[1],
                                    "paddings": _fold_parts(call)[2][:2],
                                    "dilations": _fold_parts(call)[3]},
          views=lambda call, outs: {"x": _fold_parts(call)[0], "x_grad": _fold_parts(call)[0]})
def fold_grad(x, out_grad, output_sizes, kernel_sizes, strides, paddings, dilations):
    """x_grad = unfold(out_grad) (im2col), seen as (N, C, kh, kw, bh, bw):
    x_grad[n, c, i, j, bi, bj] = out_grad[n, c, bi·sh - pt + i·dh, bj·sw - pl + j·dw], 0 in the
    padding. As Paddle's fold, the padding is symmetric: paddings[0] above and below,
    paddings[1] left and right (a 4-element paddings' last two are not used)."""
    sh, sw = strides
    pt, pl = paddings
    dh, dw = dilations
    H, W = out_grad.shape[2], out_grad.shape[3]

    def body(n, c, i, j, bi, bj, *p):
        h = bi * sh - pt + i * dh
        w = bj * sw - pl + j * dw
        inside = tirx.all(h >= 0, h < H, w >= 0, w < W)
        return te.if_then_else(inside, out_grad[(n, c, h, w) + p], zero(out_grad))
    return te.compute(x.shape, body, name="x_grad")


def _unfold_parts(call):
    x, g = call.meta("x"), call.meta("out_grad")
    if x.ndim != 4:
        raise ValueError(f"{call.op}: x has rank {x.ndim}; unfold takes [N, C, H, W]")
    k, s, p, d, grid = _conv_attrs(call, x.shape[2:])
    n, c = x.shape[:2]
    want = (n, c * k[0] * k[1], grid[0] * grid[1])
    if g.shape != want:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)} for "
                         f"x {list(x.shape)} with kernel_sizes {list(k)}, strides {list(s)}, "
                         f"paddings {list(call.attrs['paddings'])} and dilations {list(d)}")
    return (n, c, k[0], k[1], grid[0], grid[1]), s, p, d


@shape_op(runtime=("strides", "paddings", "dilations"), pattern="gather_sums",
          validate=lambda call, outs: _unfold_parts(call),
          canon=lambda call, outs: {"kernel_sizes": None, "strides": _unfold_parts(call)[1],
                                    "paddings": _unfold_parts(call)[2][:2],
                                    "dilations": _unfold_parts(call)[3]},
          views=lambda call, outs: {"out_grad": _unfold_parts(call)[0]})
def unfold_grad(x, out_grad, kernel_sizes, strides, paddings, dilations):
    """x_grad = fold(out_grad) (col2im) as a gather, out_grad seen as (N, C, kh, kw, bh, bw):
    x_grad[n, c, h, w] = Σ_{i, j} out_grad[n, c, i, j, bi, bj] over the kernel taps whose block
    (bi, bj) = ((h + pt - i·dh) / sh, (w + pl - j·dw) / sw) is whole and in range."""
    sh, sw = strides
    pt, pl = paddings
    dh, dw = dilations
    kh, kw, bh, bw = out_grad.shape[2:]
    i = te.reduce_axis((0, kh), name="i")
    j = te.reduce_axis((0, kw), name="j")
    dt = dt_of(out_grad)

    def body(n, c, h, w):
        hh = h + pt - i * dh
        ww = w + pl - j * dw
        bi = tirx.floordiv(hh, sh)
        bj = tirx.floordiv(ww, sw)
        ok = tirx.all(hh >= 0, ww >= 0, tirx.floormod(hh, sh) == 0, tirx.floormod(ww, sw) == 0,
                      bi < bh, bj < bw)
        return te.sum(te.if_then_else(ok, load(out_grad, n, c, i, j, bi, bj),
                                      tirx.const(0, dt.compute)), axis=[i, j])
    if dt.storage == dt.compute:
        return te.compute(x.shape, body, name="x_grad")
    acc = te.compute(x.shape, body, name="x_grad_acc")
    return te.compute(x.shape, lambda *q: acc(*q).astype(dt.storage), name="x_grad")


# ------------------------------------------------------------------------------------------
# frame / tensor_unfold (overlap-add)

def _overlap_add(g, t, hop, size, nf, pre_idx, frame_point):
    """Σ_r g[frame_point(f, i)] over the windows f that cover position t (window f covers
    f·hop .. f·hop + size - 1): f = t // hop - r, i = t % hop + r·hop, r < ceil(size / hop)
    (in ``_sum_dtype``: bool counts)."""
    dt = dt_of(g)
    acc = _sum_dtype(dt)
    count = tirx.floordiv(size + hop - 1, hop)
    r = te.reduce_axis((0, count), name="r")
    f = tirx.floordiv(t, hop) - r
    i = tirx.floormod(t, hop) + r * hop
    ok = tirx.all(f >= 0, f < nf, i < size)
    value = load(g, *frame_point(f, i))
    value = value if acc == dt.compute else value.astype(acc)
    return te.sum(te.if_then_else(ok, value, tirx.const(0, acc)), axis=r)


def _cast_stage(shape, body, g, name):
    """te.compute of a summing ``body`` (``_sum_dtype``), stored in g's dtype."""
    dt = dt_of(g)
    if dt.storage == _sum_dtype(dt):
        return te.compute(shape, body, name=name)
    acc = te.compute(shape, body, name=f"{name}_acc")
    return te.compute(shape, lambda *q: _from_sum(acc(*q), dt), name=name)


def _frame_parts(call):
    x, g = call.meta("x"), call.meta("out_grad")
    a = call.attrs
    length, hop, axis = int(a["frame_length"]), int(a["hop_length"]), int(a["axis"])
    if axis not in (0, -1):
        raise ValueError(f"{call.op}: attribute 'axis' = {axis} must be 0 or -1")
    if x.ndim < 1:
        raise ValueError(f"{call.op}: x is 0-D; frame needs a tensor of rank >= 1")
    if hop <= 0:
        raise ValueError(f"{call.op}: attribute 'hop_length' = {hop} must be positive")
    seq = x.shape[-1] if axis == -1 else x.shape[0]
    if not 0 < length <= seq:
        raise ValueError(f"{call.op}: attribute 'frame_length' = {length} must be in [1, {seq}] "
                         f"(the length of x along axis {axis})")
    nf = 1 + (seq - length) // hop
    if axis == -1:
        want = x.shape[:-1] + (length, nf)
        batch = math.prod(x.shape[:-1])
        views = {"x": (batch, seq), "x_grad": (batch, seq), "out_grad": (batch, length, nf)}
    else:
        want = (nf, length) + x.shape[1:]
        batch = math.prod(x.shape[1:])
        views = {"x": (seq, batch), "x_grad": (seq, batch), "out_grad": (nf, length, batch)}
    if g.shape != want:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)} for "
                         f"x {list(x.shape)} with frame_length {length}, hop_length {hop} and axis "
                         f"{axis}")
    return views, axis


@shape_op(runtime=("frame_length", "hop_length"), shape_only=("x",), pattern="gather_sums",
          dtypes=CPLX + ("int32", "int64"),
          validate=lambda call, outs: (_same_dtype_check("x", "out_grad")(call, outs),
                                        _frame_parts(call)),
          canon=lambda call, outs: {"axis": _frame_parts(call)[1]},
          views=lambda call, outs: _frame_parts(call)[0])
def frame_grad(x, out_grad, frame_length, hop_length, axis):
    """x_grad[t] = Σ out_grad[i, f] over the frames f and offsets i with f·hop + i = t
    (overlap-add), seen as (batch, seq) <- (batch, length, n_frames) for axis -1 and
    (seq, batch) <- (n_frames, length, batch) for axis 0."""
    if axis == -1:
        nf = out_grad.shape[2]
        body = lambda b, t, *p: _overlap_add(out_grad, t, hop_length, frame_length, nf, None,  # noqa
                                             lambda f, i: (b, i, f, *p))
    else:
        nf = out_grad.shape[0]
        body = lambda t, b, *p: _overlap_add(out_grad, t, hop_length, frame_length, nf, None,  # noqa
                                             lambda f, i: (f, i, b, *p))
    return _cast_stage(x.shape, body, out_grad, "x_grad")


def _unfold_t_parts(call):
    x, g = call.meta("input"), call.meta("out_grad")
    a = call.attrs
    size, step = int(a["size"]), int(a["step"])
    if x.ndim == 0:
        raise ValueError(f"{call.op}: input is 0-D; tensor_unfold needs a tensor of rank >= 1")
    axis = norm_axis(int(a["axis"]), x.ndim, of="input", op=call.op)
    n = x.shape[axis]
    if step <= 0:
        raise ValueError(f"{call.op}: attribute 'step' = {step} must be positive")
    if not 0 < size <= n:
        raise ValueError(f"{call.op}: attribute 'size' = {size} must be in [1, {n}] (input's size "
                         f"along axis {axis})")
    nf = (n - size) // step + 1
    want = x.shape[:axis] + (nf,) + x.shape[axis + 1:] + (size,)
    if g.shape != want:
        raise ValueError(f"{call.op}: out_grad has shape {list(g.shape)}, expected {list(want)} for "
                         f"input {list(x.shape)} with axis {axis}, size {size} and step {step}")
    pre, post = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    return {"input": (pre, n, post), "input_grad": (pre, n, post),
            "out_grad": (pre, nf, post, size)}


def _unfold_t_overlaps(call):
    """Do two windows share an element (more than one window and step < size)?"""
    windows = _unfold_t_parts(call)["out_grad"][1]
    return windows > 1 and int(call.attrs["step"]) < int(call.attrs["size"])


@shape_op(runtime=("size", "step"), shape_only=("input",), pattern="gather_sums", dtypes=MOVES,
          validate=lambda call, outs: (_same_dtype_check("input", "out_grad")(call, outs),
                                        _unfold_t_parts(call),
                                        _no_float8_sums(call, _unfold_t_overlaps(call))),
          canon=lambda call, outs: {"axis": None},
          views=lambda call, outs: _unfold_t_parts(call))
def tensor_unfold_grad(input, out_grad, axis, size, step):
    """input_grad[p, t, q] = Σ out_grad[p, f, q, i] over the windows f and offsets i with
    f·step + i = t (the adjoint of tensor_unfold; overlapping windows sum, see the module doc)."""
    nf = out_grad.shape[1]
    body = lambda p, t, q, *z: _overlap_add(out_grad, t, step, size, nf, None,  # noqa: E731
                                            lambda f, i: (p, f, q, i, *z))
    return _cast_stage(input.shape, body, out_grad, "input_grad")


# ------------------------------------------------------------------------------------------
# as_strided

def _as_strided_parts(call):
    """(element offset, strides, dims of out_grad, mode, order) with mode 'inject' (no two view
    elements share storage: each input element is found by greedy division over the strides in
    decreasing order) or 'overlap' (the dim with the largest stride is solved for, the others
    looped over)."""
    inp, g = call.meta("input"), call.meta("out_grad")
    a = call.attrs
    dims, strides, offset = tuple(a["dims"]), tuple(a["stride"]), int(a["offset"])
    if dims != g.shape:
        raise ValueError(f"{call.op}: attribute 'dims' = {list(dims)} must equal out_grad's shape "
                         f"{list(g.shape)}")
    if len(strides) != len(dims):
        raise ValueError(f"{call.op}: attribute 'stride' = {list(strides)} must have one entry per "
                         f"dim of 'dims' = {list(dims)}")
    if any(s < 0 for s in strides):
        raise ValueError(f"{call.op}: attribute 'stride' = {list(strides)} must be >= 0")
    item = inp.dtype.numpy.itemsize
    if offset < 0 or offset % item:
        raise ValueError(f"{call.op}: attribute 'offset' = {offset} is in bytes (as Paddle's) and "
                         f"must be a non-negative multiple of the element size {item}")
    off = offset // item
    size = math.prod(inp.shape)
    if math.prod(dims) and off + sum((n - 1) * s for n, s in zip(dims, strides)) >= size:
        raise ValueError(f"{call.op}: the view (dims {list(dims)}, stride {list(strides)}, offset "
                         f"{offset} bytes) reaches past input's {size} elements")
    if math.prod(dims) == 0:
        return off, strides, dims, "empty", ()
    live = [d for d, n in enumerate(dims) if n > 1]
    order = sorted(live, key=lambda d: -strides[d])
    inject = all(strides[d] > 0 for d in live)
    for k, d in enumerate(order):
        if strides[d] <= sum(strides[e] * (dims[e] - 1) for e in order[k + 1:]):
            inject = False
    return off, strides, dims, ("inject" if inject else "overlap"), tuple(order)


def _as_strided_overlaps(call):
    """Do two view elements share an input element? (Only asked of float8 calls whose view the
    greedy test of ``_as_strided_parts`` cannot prove injective: counted exactly on the host.)"""
    off, strides, dims, mode, _ = _as_strided_parts(call)
    if mode != "overlap" or call.meta("out_grad").dtype.name not in FLOAT8:
        return False
    positions = sum(np.arange(n, dtype=np.int64).reshape((-1,) + (1,) * (len(dims) - d - 1)) * s
                    for d, (n, s) in enumerate(zip(dims, strides)))
    positions = np.asarray(positions).reshape(-1)
    return np.unique(positions).size < positions.size


def _as_strided_canon(call, outs):
    off, strides, dims, mode, order = _as_strided_parts(call)
    return {"offset": off, "stride": strides, "dims": (mode, order)}


@shape_op(runtime=("offset", "stride"), shape_only=("input",), canon=_as_strided_canon,
          pattern="gather_sums", dtypes=MOVES,
          validate=lambda call, outs: (_same_dtype_check("input", "out_grad")(call, outs),
                                        _no_float8_sums(call, _as_strided_overlaps(call))),
          views=lambda call, outs: {"input": (math.prod(call.meta("input").shape),),
                                    "input_grad": (math.prod(call.meta("input").shape),)})
def as_strided_grad(input, out_grad, dims, stride, offset, ctx):
    """input_grad.flat[p] = Σ out_grad[idx] over the view elements idx with offset + Σ idx·stride
    = p (offset in elements here; the attribute is in bytes). Without overlap the idx is found by
    greedy division (strides in decreasing order); with overlap the largest-stride dim is solved
    for and the other dims are summed over."""
    mode, order = dims
    rank = len(out_grad.shape) - ctx.pair          # (a complex pair follows, on both tensors)
    shape = out_grad.shape
    dt = dt_of(out_grad)
    acc = _sum_dtype(dt)
    if mode == "empty":
        return te.compute(input.shape, lambda p, *z: zero(out_grad), name="input_grad")
    if rank == 0:
        return te.compute(input.shape, lambda p, *z: te.if_then_else(p == offset, out_grad(*z),
                                                                     zero(out_grad)), name="input_grad")
    if mode == "inject":
        def body(p, *z):
            rem = p - offset
            ok = rem >= 0
            idx = [tirx.const(0, "int64")] * rank
            for d in order:
                q = tirx.floordiv(rem, tirx.max(stride[d], _i64(1)))
                ok = tirx.all(ok, q < shape[d])
                idx[d] = q
                rem = rem - q * stride[d]
            ok = tirx.all(ok, rem == 0)
            return te.if_then_else(ok, out_grad(*idx, *z), zero(out_grad))
        return te.compute(input.shape, body, name="input_grad")
    solved = order[0] if order else 0
    others = [d for d in range(rank) if d != solved]
    axes = {d: te.reduce_axis((0, shape[d]), name=f"r{d}") for d in others}

    def body(p, *z):
        rem = p - offset - total(axes[d] * stride[d] for d in others)
        s = tirx.max(stride[solved], _i64(1))
        q = tirx.floordiv(rem, s)
        ok = tirx.all(rem >= 0, q < shape[solved],
                      tirx.floormod(rem, s) == 0 if order else rem == 0)
        idx = [q if d == solved else axes[d] for d in range(rank)]
        value = load(out_grad, *idx, *z)
        value = value if acc == dt.compute else value.astype(acc)
        value = te.if_then_else(ok, value, tirx.const(0, acc))
        return te.sum(value, axis=list(axes.values())) if axes else value
    if not axes:
        return te.compute(input.shape, lambda *p: _from_sum(body(*p), dt), name="input_grad")
    return _cast_stage(input.shape, body, out_grad, "input_grad")


# ------------------------------------------------------------------------------------------
# pixel_shuffle / pixel_unshuffle / temporal_shift

def _pixel_views(call, outs, r, shuffle):
    """6-D views in which pixel_(un)shuffle is a transpose (r = the factor)."""
    fmt = call.attrs["data_format"]
    g = call.meta("out_grad").shape
    x = outs[0].shape
    if shuffle:            # x: (N, C·r², H, W) <- out: (N, C, H·r, W·r)
        if fmt == "NCHW":
            n, c, h, w = x
            return {"x_grad": (n, c // (r * r), r, r, h, w), "out_grad": (n, g[1], h, r, w, r)}
        n, h, w, c = x
        return {"x_grad": (n, h, w, c // (r * r), r, r), "out_grad": (n, h, r, w, r, g[3])}
    if fmt == "NCHW":      # x: (N, C, H·r, W·r) <- out: (N, C·r², H, W)
        n, c, h, w = g
        return {"x_grad": (n, x[1], h, r, w, r), "out_grad": (n, c // (r * r), r, r, h, w)}
    n, h, w, c = g
    return {"x_grad": (n, h, r, w, r, x[3]), "out_grad": (n, h, w, c // (r * r), r, r)}


@shape_op(canon=lambda call, outs: {"upscale_factor": None},
          views=lambda call, outs: _pixel_views(call, outs, call.attrs["upscale_factor"], True))
def pixel_shuffle_grad(out_grad, upscale_factor, data_format):
    """x_grad[n, c·r² + i·r + j, h, w] = out_grad[n, c, h·r + i, w·r + j] (NCHW; NHWC likewise
    with channels last): over 6-D views (N, C, r, r, H, W) <- (N, C, H, r, W, r) a transpose."""
    g = out_grad
    if data_format == "NCHW":
        n, c, r, _, h, w = g.shape[0], g.shape[1], g.shape[3], g.shape[5], g.shape[2], g.shape[4]
        return te.compute((n, c, r, r, h, w), lambda a, b, i, j, y, x: g[a, b, y, i, x, j],
                          name="x_grad")
    n, h, r, w, c = g.shape[0], g.shape[1], g.shape[2], g.shape[3], g.shape[5]
    return te.compute((n, h, w, c, r, r), lambda a, y, x, b, i, j: g[a, y, i, x, j, b], name="x_grad")


@shape_op(canon=lambda call, outs: {"downscale_factor": None},
          views=lambda call, outs: _pixel_views(call, outs, call.attrs["downscale_factor"], False))
def pixel_unshuffle_grad(out_grad, downscale_factor, data_format):
    """x_grad[n, c, h·r + i, w·r + j] = out_grad[n, c·r² + i·r + j, h, w] (NCHW; NHWC likewise
    with channels last): over 6-D views (N, C, H, r, W, r) <- (N, C, r, r, H, W) a transpose."""
    g = out_grad
    if data_format == "NCHW":
        n, c, r, h, w = g.shape[0], g.shape[1], g.shape[2], g.shape[4], g.shape[5]
        return te.compute((n, c, h, r, w, r), lambda a, b, y, i, x, j: g[a, b, i, j, y, x],
                          name="x_grad")
    n, h, w, c, r = g.shape[0], g.shape[1], g.shape[2], g.shape[3], g.shape[4]
    return te.compute((n, h, r, w, r, c), lambda a, y, i, x, j, b: g[a, y, x, b, i, j], name="x_grad")


def _temporal_parts(call):
    g = call.meta("out_grad")
    a = call.attrs
    seg, fmt = int(a["seg_num"]), a["data_format"]
    if g.ndim != 4:
        raise ValueError(f"{call.op}: out_grad has rank {g.ndim}; temporal_shift takes 4-D tensors")
    if fmt not in ("NCHW", "NHWC"):
        raise ValueError(f"{call.op}: attribute 'data_format' = {fmt!r} must be 'NCHW' or 'NHWC'")
    if seg <= 0 or g.shape[0] % seg:
        raise ValueError(f"{call.op}: attribute 'seg_num' = {seg} must be positive and divide "
                         f"out_grad's first dim {g.shape[0]} (N·T)")
    if fmt == "NCHW":
        nt, c, h, w = g.shape
        view = (nt // seg, seg, c, h * w)
    else:
        nt, h, w, c = g.shape
        view = (nt // seg, seg, h * w, c)
    if not 0.0 <= a["shift_ratio"] <= 0.5:
        raise ValueError(f"{call.op}: attribute 'shift_ratio' = {a['shift_ratio']} must be in [0, 0.5] "
                         f"(Paddle's documented range: the two shifted parts of the channels)")
    ratio = np.float32(a["shift_ratio"])
    c1 = int(np.float32(c) * ratio)
    c2 = int(np.float32(c) * np.float32(2.0) * ratio)
    return view, (c1, c2)


@shape_op(runtime=("shift_ratio",), validate=lambda call, outs: _temporal_parts(call),
          canon=lambda call, outs: {"seg_num": None, "shift_ratio": _temporal_parts(call)[1]},
          views=lambda call, outs: {"out_grad": _temporal_parts(call)[0],
                                    "x_grad": _temporal_parts(call)[0]})
def temporal_shift_grad(out_grad, seg_num, shift_ratio, data_format):
    """Seen as (N, T, C, HW) (NCHW) or (N, T, HW, C) (NHWC): channels c < c1 take the grad from
    frame t + 1, c1 <= c < c2 from frame t - 1, the rest from t; 0 past the ends. c1 =
    int(C·ratio), c2 = int(C·2·ratio) in float32, as Paddle."""
    c1, c2 = shift_ratio
    T = out_grad.shape[1]

    def pick(n, t, c, rest, point):
        src = tirx.Select(c < c1, t + 1, tirx.Select(c < c2, t - 1, t))
        ok = tirx.all(src >= 0, src < T)
        return te.if_then_else(ok, out_grad(*point(src)), zero(out_grad))

    if data_format == "NCHW":
        body = lambda n, t, c, s: pick(n, t, c, s, lambda u: (n, u, c, s))  # noqa: E731
    else:
        body = lambda n, t, s, c: pick(n, t, c, s, lambda u: (n, u, s, c))  # noqa: E731
    return te.compute(out_grad.shape, body, name="x_grad")
