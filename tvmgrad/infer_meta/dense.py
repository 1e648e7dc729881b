"""InferMetas of the dense grads (matmul family, conv, pooling): each grad has its input's meta.

Paddle's versions only copy metas; the ops' planners (te_defs/matmul.py, conv.py, pool.py) check
the shapes against each other, where the attributes are known too.
"""

from __future__ import annotations

from . import MetaError, TensorMeta, register
from ._common import need as _need


@register
def BmmGradInferMeta(x, y, out_grad):
    """x_grad = x, y_grad = y."""
    return _need(x, "x"), _need(y, "y")


@register
def BilinearGradInferMeta(x, y, weight, out_grad):
    """x_grad = x, y_grad = y, weight_grad = weight, bias_grad = [1, out_grad.shape[1]]."""
    x, y, weight, out_grad = (_need(x, "x"), _need(y, "y"), _need(weight, "weight"),
                              _need(out_grad, "out_grad"))
    if out_grad.ndim != 2:
        raise MetaError(f"out_grad must be 2-D [batch, out_features], got {list(out_grad.shape)}")
    return x, y, weight, TensorMeta((1, out_grad.shape[1]), out_grad.dtype)


@register
def MultiDotGradInferMeta(x, out_grad):
    """x_grad[i] = x[i]."""
    if not x:
        raise MetaError("x must hold at least one tensor")
    return ([_need(m, f"x[{i}]") for i, m in enumerate(x)],)


@register
def ConvTransposeGradInferMeta(x, filter, out_grad, strides, paddings, output_padding,
                               output_size, padding_algorithm, groups, dilations, data_format):
    """x_grad = x, filter_grad = filter."""
    return _need(x, "x"), _need(filter, "filter")


@register
def MaxPoolWithIndexGradInferMeta(x, mask, out_grad, kernel_size, strides, paddings,
                                  global_pooling, adaptive):
    """x_grad = x."""
    return (_need(x, "x"),)


@register
def WeightOnlyLinearGradInferMeta(x, weight, bias, weight_scale, out_grad, weight_dtype, arch,
                                  group_size):
    """x_grad = x; Paddle supports arch 80/86 and per-channel scales (group_size -1) only."""
    if arch not in (80, 86):
        raise MetaError(f"attribute 'arch' must be 80 or 86 (weight-only linear grad), got {arch}")
    if group_size != -1:
        raise MetaError(f"attribute 'group_size' must be -1 (per-channel scales; the grad has no "
                        f"group-wise mode), got {group_size}")
    return (_need(x, "x").with_dtype(out_grad.dtype) if out_grad is not None else _need(x, "x"),)
