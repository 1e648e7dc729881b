"""InferMetas of the sampling grads (te_defs/interp.py, roi.py, signal.py): affine_grid_grad and
overlap_add_grad. (The interpolation, grid_sample, ROI and correlation grads use the generic
Unchanged/GeneralUnaryGrad/GeneralBinaryGrad metas; their value checks live in the planners.)"""

from __future__ import annotations

from . import MetaError, TensorMeta, register
from ._common import need as _need


@register
def AffineGridGradInferMeta(output_grad, output_shape, align_corners):
    """theta_grad: [N, 2, 3] for a 4-D output_shape (output_grad [N, H, W, 2]), [N, 3, 4] for a
    5-D one (output_grad [N, D, H, W, 3]); the dtype of output_grad."""
    g = _need(output_grad, "output_grad")
    shape = tuple(output_shape)
    if len(shape) not in (4, 5):
        raise MetaError(f"attribute 'output_shape' must hold 4 values [N, C, H, W] or 5 "
                        f"[N, C, D, H, W], got {list(shape)}")
    S = len(shape) - 2
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise MetaError(f"attribute 'output_shape' holds a negative size: {list(shape)}")
    want = (shape[0],) + shape[2:] + (S,)
    if g.ndim != S + 2:
        raise MetaError(f"input 'output_grad' must be {S + 2}-D {['N'] + ['D', 'H', 'W'][3 - S:] + [S]} "
                        f"for output_shape {list(shape)}, got shape {list(g.shape)}")
    for got, exp in zip(g.shape, want):
        if isinstance(got, int) and isinstance(exp, int) and got != exp:
            raise MetaError(f"input 'output_grad' has shape {list(g.shape)} but output_shape "
                            f"{list(shape)} makes the grid {list(want)}")
    return (TensorMeta((g.shape[0], S, S + 1), g.dtype),)


@register
def OverlapAddGradInferMeta(x, out_grad, hop_length, axis):
    """x_grad: x's meta. x holds frames: [..., frame_length, n_frames] (axis = -1) or
    [n_frames, frame_length, ...] (axis = 0); out_grad holds the signal, [..., seq_length] or
    [seq_length, ...] with seq_length = (n_frames − 1)·hop_length + frame_length."""
    x = _need(x, "x")
    g = _need(out_grad, "out_grad")
    if axis not in (0, -1):
        raise MetaError(f"attribute 'axis' must be 0 or -1, got {axis}")
    if hop_length <= 0:
        raise MetaError(f"attribute 'hop_length' must be > 0, got {hop_length}")
    if x.ndim < 2:
        raise MetaError(f"input 'x' must be at least 2-D (frames), got shape {list(x.shape)}")
    if axis == -1:
        frame, frames, rest = x.shape[-2], x.shape[-1], x.shape[:-2]
    else:
        frame, frames, rest = x.shape[1], x.shape[0], x.shape[2:]
    if all(isinstance(d, int) for d in (frame, frames)):
        seq = (frames - 1) * hop_length + frame if frames > 0 else 0
        want = rest + (seq,) if axis == -1 else (seq,) + rest
        if g.ndim != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                      for a, b in zip(g.shape, want)):
            raise MetaError(f"input 'out_grad' has shape {list(g.shape)}; x {list(x.shape)} with "
                            f"hop_length {hop_length}, axis {axis} gives the signal shape "
                            f"{list(want)}")
    if g.dtype != x.dtype:
        raise MetaError(f"input 'out_grad' has dtype {g.dtype.name} but 'x' has {x.dtype.name}")
    return (x,)
