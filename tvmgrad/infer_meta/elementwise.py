"""InferMetas of elementwise grads: each grad has the meta of the tensor it differentiates."""

from __future__ import annotations

from . import register
from ._common import need as _need


@register
def UnchangedInferMeta(x):
    """out = x."""
    return (_need(x, "x"),)


@register
def UnchangedMultiInferMeta(x):
    """outs[i] = x[i] for a tensor list."""
    return ([_need(m, f"x[{i}]") for i, m in enumerate(x)],)


@register
def GeneralUnaryGradInferMeta(x):
    """dx = x."""
    return (_need(x, "x"),)


@register
def GeneralBinaryGradInferMeta(x, y):
    """dx = x, dy = y."""
    return _need(x, "x"), y


@register
def GeneralTernaryGradInferMeta(x, y, z):
    """dx = x, dy = y, dz = z."""
    return _need(x, "x"), y, z


@register
def PreluGradInferMeta(x, alpha):
    """dx = x, dalpha = alpha."""
    return _need(x, "x"), _need(alpha, "alpha")


@register
def SwiGLUGradInferMeta(x, y):
    """dx = x, dy = y (absent when x holds both halves)."""
    return _need(x, "x"), y


@register
def UniformRandomInplaceGradInferMeta(out_grad, min, max, seed, diag_num, diag_step, diag_val):
    """x_grad has out_grad's meta (the grad of a random fill is zero)."""
    return (_need(out_grad, "out_grad"),)
