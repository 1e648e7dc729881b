"""InferMetas of shape and data-movement ops (concat/stack/expand/pad/squeeze/... and their grads).

Each follows Paddle 3.3.1's InferMeta of that name (``paddle/phi/infermeta/*.cc``): the same
output shapes, the same checks (as MetaError naming the argument). Axes are normalised here the
way Paddle does; the te_defs builders get their normalised values through ``canon``.
"""

from __future__ import annotations

import math

from . import MetaError, TensorMeta, norm_axes, norm_axis, register
from ._common import need as _need


def _need_list(metas, what: str) -> list[TensorMeta]:
    if metas is None or len(metas) == 0:
        raise MetaError(f"{what} must be a non-empty list of tensors")
    return [_need(m, f"{what}[{i}]") for i, m in enumerate(metas)]


def _same_dtype(metas: list[TensorMeta], what: str) -> None:
    for i, m in enumerate(metas):
        if m.dtype != metas[0].dtype:
            raise MetaError(f"{what}[{i}] has dtype {m.dtype.name} but {what}[0] has "
                            f"{metas[0].dtype.name}")


# ------------------------------------------------------------------------------------------
# shape only: the grad has its input's meta

@register
def StridedUnChangedInferMeta(input):
    """input_grad = input (a strided view's grad has the viewed tensor's meta)."""
    return (_need(input, "input"),)


@register
def KernelWithXShapeInferMeta(xshape, out_grad):
    """x_grad has the shape that ``xshape`` carries and out_grad's dtype.

    Paddle 3.3.1 takes the forward input x itself as ``xshape`` (its dims are x's dims; the
    legacy XShape of dims [0, *x.dims] is accepted too when unambiguous)."""
    xshape, out_grad = _need(xshape, "xshape"), _need(out_grad, "out_grad")
    if xshape.dtype != out_grad.dtype:
        raise MetaError(f"input 'xshape' has dtype {xshape.dtype.name} but 'out_grad' has "
                        f"{out_grad.dtype.name}; they must match (xshape is the forward's x)")
    size = math.prod(out_grad.shape)
    if math.prod(xshape.shape) == size:
        shape = xshape.shape
    elif xshape.ndim >= 1 and xshape.shape[0] == 0 and math.prod(xshape.shape[1:]) == size:
        shape = xshape.shape[1:]
    else:
        raise MetaError(f"out_grad of shape {list(out_grad.shape)} ({size} elements) cannot be "
                        f"reshaped to the shape of xshape {list(xshape.shape)}")
    return (TensorMeta(shape, out_grad.dtype),)


# ------------------------------------------------------------------------------------------
# lists

@register
def ConcatInferMeta(x, axis):
    """out: the inputs joined along ``axis`` (all other dims equal)."""
    x = _need_list(x, "x")
    _same_dtype(x, "x")
    rank = x[0].ndim
    if rank == 0:
        raise MetaError("x[0] is 0-D; concat needs tensors of rank >= 1")
    ax = norm_axis(int(axis), rank, of="x[0]")
    shape = list(x[0].shape)
    for i, m in enumerate(x[1:], 1):
        if m.ndim != rank:
            raise MetaError(f"x[{i}] has rank {m.ndim} but x[0] has rank {rank}")
        for d in range(rank):
            if d != ax and m.shape[d] != x[0].shape[d]:
                raise MetaError(f"x[{i}] of shape {list(m.shape)} does not match x[0] of shape "
                                f"{list(x[0].shape)} outside axis {ax}")
        shape[ax] += m.shape[ax]
    return (TensorMeta(shape, x[0].dtype),)


def _stack(x, axis, what):
    x = _need_list(x, what)
    _same_dtype(x, what)
    for i, m in enumerate(x):
        if m.shape != x[0].shape:
            raise MetaError(f"{what}[{i}] has shape {list(m.shape)} but {what}[0] has "
                            f"{list(x[0].shape)}; stacked tensors must have equal shapes")
    rank = x[0].ndim
    ax = norm_axis(int(axis), rank, extra=1, of=f"{what}[0]")
    shape = list(x[0].shape)
    shape.insert(ax, len(x))
    return (TensorMeta(shape, x[0].dtype),)


@register
def StackInferMeta(x, axis):
    """out: the (equal-shaped) inputs stacked along a new dim ``axis``."""
    return _stack(x, axis, "x")


@register
def StackGradInferMeta(out_grad, axis):
    """x_grad[i] = out_grad's slice i along ``axis`` (that dim removed)."""
    out_grad = _need(out_grad, "out_grad")
    if out_grad.ndim == 0:
        raise MetaError("out_grad is 0-D; it must have the stacked axis")
    ax = norm_axis(int(axis), out_grad.ndim, of="out_grad")
    shape = out_grad.shape[:ax] + out_grad.shape[ax + 1:]
    return ([TensorMeta(shape, out_grad.dtype) for _ in range(out_grad.shape[ax])],)


@register
def UnStackGradInferMeta(out_grad, axis):
    """x_grad: the out_grad pieces stacked along ``axis``."""
    return _stack(out_grad, axis, "out_grad")


@register
def MeshgridGradInferMeta(inputs, outputs_grad):
    """inputs_grad[i] has inputs[i]'s meta; outputs_grad[i] has shape [n_0, ..., n_{k-1}]."""
    inputs = _need_list(inputs, "inputs")
    grads = _need_list(outputs_grad, "outputs_grad")
    if len(grads) != len(inputs):
        raise MetaError(f"outputs_grad has {len(grads)} tensors but inputs has {len(inputs)}")
    if len(inputs) < 2:
        raise MetaError("meshgrid_grad needs at least 2 inputs (as Paddle's MeshgridGradInferMeta)")
    for i, m in enumerate(inputs):
        if m.ndim > 1:
            raise MetaError(f"inputs[{i}] has rank {m.ndim}; meshgrid takes 0-D or 1-D tensors")
    grid = tuple(math.prod(m.shape) for m in inputs)
    for i, g in enumerate(grads):
        if g.shape != grid:
            raise MetaError(f"outputs_grad[{i}] has shape {list(g.shape)}, expected {list(grid)} "
                            f"(the sizes of inputs[0..{len(inputs) - 1}])")
    _same_dtype(grads, "outputs_grad")
    for i, m in enumerate(inputs):
        if m.dtype != grads[0].dtype:
            raise MetaError(f"inputs[{i}] has dtype {m.dtype.name} but outputs_grad[0] has "
                            f"{grads[0].dtype.name}; they must match")
    return ([TensorMeta(m.shape, grads[0].dtype) for m in inputs],)


def _partial_check(x):
    x = _need_list(x, "x")
    for i, m in enumerate(x):
        if m.ndim != 2:
            raise MetaError(f"x[{i}] has rank {m.ndim}; partial ops take 2-D tensors")
        if m.shape != x[0].shape:
            raise MetaError(f"x[{i}] has shape {list(m.shape)} but x[0] has {list(x[0].shape)}")
    _same_dtype(x, "x")
    return x


@register
def PartialConcatGradInferMeta(x):
    """x_grad[i] has x[i]'s meta."""
    return (_partial_check(x),)


@register
def PartialSumGradInferMeta(x):
    """x_grad[i] has x[i]'s meta."""
    return (_partial_check(x),)


# ------------------------------------------------------------------------------------------
# forwards that invoke ops name

@register
def ExpandInferMeta(x, shape):
    """out: x broadcast to ``shape`` (-1 keeps x's dim; new leading dims must be given)."""
    x = _need(x, "x")
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        shape = (-1,) * x.ndim
    if len(shape) < x.ndim:
        raise MetaError(f"attribute 'shape' = {list(shape)} has fewer elements than the rank "
                        f"{x.ndim} of x")
    if len(shape) > 8:
        raise MetaError(f"attribute 'shape' = {list(shape)}: expand supports rank <= 8")
    diff = len(shape) - x.ndim
    out = []
    for i, s in enumerate(shape):
        xd = x.shape[i - diff] if i >= diff else None
        if s == -1:
            if xd is None:
                raise MetaError(f"attribute 'shape' = {list(shape)}: -1 is not allowed for the new "
                                f"leading dim {i}")
            out.append(xd)
        elif s < 0:
            raise MetaError(f"attribute 'shape' = {list(shape)} has a negative size at dim {i}")
        else:
            if xd is not None and xd != 1 and xd != s:
                raise MetaError(f"attribute 'shape' = {list(shape)} does not match x's "
                                f"non-singleton dim {i - diff} of size {xd}")
            out.append(s)
    return (TensorMeta(out, x.dtype),)


@register
def FlipInferMeta(x, axis):
    """out = x reversed along ``axis`` (no duplicates)."""
    x = _need(x, "x")
    norm_axes(axis, x.ndim, of="x")
    return (x,)


@register
def ReverseInferMeta(x, axis):
    """out = x reversed along ``axis`` (non-empty; a repeated axis reverses twice)."""
    x = _need(x, "x")
    if len(axis) == 0:
        raise MetaError("attribute 'axis' can not be empty")
    norm_axes(axis, x.ndim, unique=False, of="x")
    return (x,)


def squeeze_shape(shape: tuple[int, ...], axes, of: str = "x") -> tuple[int, ...]:
    """Paddle's squeeze: the size-1 dims among ``axes`` of the tensor ``of`` go (all size-1 dims
    when empty)."""
    rank = len(shape)
    if len(axes) == 0:
        return tuple(d for d in shape if d != 1)
    drop = set()
    for a in axes:
        ax = norm_axis(int(a), rank, of=of, zero_d_axis=True)
        if rank and shape[ax] == 1:
            drop.add(ax)
    return tuple(d for i, d in enumerate(shape) if i not in drop)


def unsqueeze_shape(shape: tuple[int, ...], axes, of: str = "x") -> tuple[int, ...]:
    """Paddle's unsqueeze (GetUnsqueezeShape): the new dims are inserted one by one, each axis
    relative to the rank reached so far."""
    rank = len(shape)
    out_rank = rank + len(axes)
    marks = [0] * (out_rank + 1)
    cur = rank
    for a in axes:
        a = int(a)
        pos = a + cur + 1 if a < 0 else a
        if not 0 <= pos <= cur:
            raise MetaError(f"attribute 'axis' = {list(axes)}: axis {a} is out of range "
                            f"[{-cur - 1}, {cur}] (inserting into {of} of rank {rank})")
        for i in range(cur, pos - 1, -1):
            if marks[i] == 1:
                marks[i + 1], marks[i] = 1, 0
        marks[pos] = 1
        cur += 1
    it = iter(shape)
    return tuple(1 if marks[i] == 1 else next(it) for i in range(out_rank))


@register
def SqueezeWithXShapeInferMeta(x, axis):
    """out = x without the size-1 dims in ``axis``; xshape carries x's shape (Paddle 3.3.1)."""
    x = _need(x, "x")
    return TensorMeta(squeeze_shape(x.shape, axis), x.dtype), x


@register
def UnsqueezeWithXShapeInferMeta(x, axis):
    """out = x with size-1 dims inserted at ``axis``; xshape carries x's shape (Paddle 3.3.1)."""
    x = _need(x, "x")
    if x.ndim + len(axis) > 8:
        raise MetaError(f"attribute 'axis' = {list(axis)}: unsqueeze supports rank <= 8")
    return TensorMeta(unsqueeze_shape(x.shape, axis), x.dtype), x


def pad3d_out_shape(shape, paddings, data_format) -> tuple[int, ...]:
    n, a, b, c, d = shape
    pl, pr, pt, pb, pf, pk = paddings
    if data_format == "NCDHW":
        return (n, a, b + pf + pk, c + pt + pb, d + pl + pr)
    return (n, a + pf + pk, b + pt + pb, c + pl + pr, d)


def check_pad3d(x: TensorMeta, paddings, mode, data_format, what="x") -> None:
    if x.ndim != 5:
        raise MetaError(f"{what} has rank {x.ndim}; pad3d takes 5-D tensors")
    if data_format not in ("NCDHW", "NDHWC"):
        raise MetaError(f"attribute 'data_format' = {data_format!r} must be 'NCDHW' or 'NDHWC'")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise MetaError(f"attribute 'mode' = {mode!r} must be one of constant, reflect, replicate, "
                        f"circular")
    if len(paddings) != 6:
        raise MetaError(f"attribute 'paddings' = {list(paddings)} must have 6 elements "
                        f"(left, right, top, bottom, front, back)")
    if any(p < 0 for p in paddings):
        raise MetaError(f"attribute 'paddings' = {list(paddings)} must be >= 0")
    spatial = x.shape[2:] if data_format == "NCDHW" else x.shape[1:4]
    names = ("depth", "height", "width")
    pairs = ((paddings[4], paddings[5]), (paddings[2], paddings[3]), (paddings[0], paddings[1]))
    if mode == "reflect":
        for size, name, (lo, hi) in zip(spatial, names, pairs):
            if size and (lo >= size or hi >= size):
                raise MetaError(f"attribute 'paddings' = {list(paddings)}: reflect mode needs pads "
                                f"smaller than the {name} {size} of {what}")
    if mode in ("reflect", "replicate", "circular") and 0 in spatial and any(paddings):
        for size, name, (lo, hi) in zip(spatial, names, pairs):
            if size == 0 and (lo or hi):
                raise MetaError(f"{what} has an empty {name}, which {mode} mode cannot pad")


@register
def Pad3dInferMeta(x, paddings, mode, pad_value, data_format):
    """out: x padded in its three spatial dims (paddings: left, right, top, bottom, front, back)."""
    x = _need(x, "x")
    check_pad3d(x, paddings, mode, data_format)
    return (TensorMeta(pad3d_out_shape(x.shape, paddings, data_format), x.dtype),)


# ------------------------------------------------------------------------------------------
# grads with their own InferMeta

@register
def CropGradInferMeta(x, out_grad, offsets):
    """x_grad has x's meta; out_grad is the crop of x at ``offsets``."""
    x, out_grad = _need(x, "x"), _need(out_grad, "out_grad")
    if out_grad.ndim != x.ndim:
        raise MetaError(f"out_grad has rank {out_grad.ndim} but x has rank {x.ndim}")
    if len(offsets) != x.ndim:
        raise MetaError(f"attribute 'offsets' = {list(offsets)} must have one entry per dim of x "
                        f"(rank {x.ndim})")
    for d, (o, n, m) in enumerate(zip(offsets, out_grad.shape, x.shape)):
        if o < 0 or o + n > m:
            raise MetaError(f"attribute 'offsets' = {list(offsets)}: out_grad of shape "
                            f"{list(out_grad.shape)} at offset {o} does not fit x's dim {d} of "
                            f"size {m}")
    return (x,)


@register
def FillDiagonalGradInferMeta(out_grad, value, offset, wrap):
    """x_grad has out_grad's meta."""
    out_grad = _need(out_grad, "out_grad")
    if out_grad.ndim < 2:
        raise MetaError(f"out_grad has rank {out_grad.ndim}; fill_diagonal needs rank >= 2")
    if out_grad.ndim > 2 and len(set(out_grad.shape)) != 1:
        raise MetaError(f"out_grad of shape {list(out_grad.shape)}: fill_diagonal of a tensor of "
                        f"rank > 2 needs all dims equal")
    return (out_grad,)


@register
def FillDiagonalTensorGradInferMeta(out_grad, offset, dim1, dim2):
    """x_grad has out_grad's meta."""
    out_grad = _need(out_grad, "out_grad")
    if out_grad.ndim < 2:
        raise MetaError(f"out_grad has rank {out_grad.ndim}; fill_diagonal_tensor needs rank >= 2")
    d1 = norm_axis(int(dim1), out_grad.ndim, "dim1", of="out_grad")
    d2 = norm_axis(int(dim2), out_grad.ndim, "dim2", of="out_grad")
    if d1 == d2:
        raise MetaError(f"attributes 'dim1' = {dim1} and 'dim2' = {dim2} name the same dim")
    return (out_grad,)


def _pixel_check(meta, factor, data_format, what, factor_name):
    if meta.ndim != 4:
        raise MetaError(f"{what} has rank {meta.ndim}; it must be a 4-D tensor [N, C, H, W] or "
                        f"[N, H, W, C]")
    if data_format not in ("NCHW", "NHWC"):
        raise MetaError(f"attribute 'data_format' = {data_format!r} must be 'NCHW' or 'NHWC'")
    if factor <= 0:
        raise MetaError(f"the factor ({factor}) must be positive (attribute {factor_name!r})")


@register
def PixelShuffleGradInferMeta(out_grad, upscale_factor, data_format):
    """x_grad: [N, C·r², H/r, W/r] for out_grad [N, C, H, W] (NCHW; likewise NHWC)."""
    g = _need(out_grad, "out_grad")
    r = int(upscale_factor)
    _pixel_check(g, r, data_format, "out_grad", "upscale_factor")
    if data_format == "NCHW":
        n, c, h, w = g.shape
    else:
        n, h, w, c = g.shape
    if h % r or w % r:
        raise MetaError(f"out_grad of shape {list(g.shape)}: height and width must be divisible by "
                        f"upscale_factor {r}")
    if data_format == "NCHW":
        return (TensorMeta((n, c * r * r, h // r, w // r), g.dtype),)
    return (TensorMeta((n, h // r, w // r, c * r * r), g.dtype),)


@register
def PixelUnshuffleGradInferMeta(out_grad, downscale_factor, data_format):
    """x_grad: [N, C/r², H·r, W·r] for out_grad [N, C, H, W] (NCHW; likewise NHWC)."""
    g = _need(out_grad, "out_grad")
    r = int(downscale_factor)
    _pixel_check(g, r, data_format, "out_grad", "downscale_factor")
    if data_format == "NCHW":
        n, c, h, w = g.shape
    else:
        n, h, w, c = g.shape
    if c % (r * r):
        raise MetaError(f"out_grad of shape {list(g.shape)}: its channels must be divisible by "
                        f"downscale_factor^2 = {r * r}")
    if data_format == "NCHW":
        return (TensorMeta((n, c // (r * r), h * r, w * r), g.dtype),)
    return (TensorMeta((n, h * r, w * r, c // (r * r)), g.dtype),)
