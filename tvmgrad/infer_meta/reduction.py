"""InferMetas of the reduction, normalisation, softmax and loss grads (te_defs/norm.py, softmax.py,
loss.py).

Output dtypes follow Paddle 3.3.1's kernel registrations, which the YAML does not state:

* normalisation *parameters* (scale, bias, saved mean/variance) of a float16/bfloat16 input may be
  float32 (Paddle's GPU kernels keep them in ``BatchNormParamType`` / ``LayerNormParamType``, i.e.
  float32) or the input's own dtype; a parameter grad has its parameter's dtype (layer_norm,
  group_norm, rms_norm: ``share_meta``), instance_norm's scale/bias grads are float32 for a half
  input (its GPU kernel allocates ``BatchNormParamType``) and the input's dtype otherwise;
* every other grad has its primal's meta (``UnchangedInferMeta`` and friends).
"""

from __future__ import annotations

from ..dtypes import HALF
from . import MetaError, TensorMeta, norm_axis, register, same_shape
from ._common import need as _need

__all__ = ["param_dtype_ok", "check_param", "MAX_POWER_ITERS"]

MAX_POWER_ITERS = 100     # spectral_norm_grad unrolls its power iterations


def param_dtype_ok(param: TensorMeta, x: TensorMeta) -> bool:
    """A norm parameter of input ``x``: x's dtype, or float32 when x is a half type."""
    return param.dtype == x.dtype or (x.dtype.name in HALF and param.dtype.name == "float32")


def check_param(param: TensorMeta | None, x: TensorMeta, name: str, shape=None,
                what: str | None = None) -> None:
    """A norm parameter: x's dtype (or float32 for half x) and ``shape`` (``what`` says where
    that shape comes from)."""
    if param is None:
        return
    if not param_dtype_ok(param, x):
        allowed = f"{x.dtype.name} or float32" if x.dtype.name in HALF else x.dtype.name
        raise MetaError(f"input {name!r} has dtype {param.dtype.name}, expected {allowed} "
                        f"(the dtype of x is {x.dtype.name})")
    if shape is not None and not same_shape(param.shape, shape):
        why = f" ({what})" if what else ""
        raise MetaError(f"input {name!r} has shape {list(param.shape)}, expected "
                        f"{list(shape)}{why}")


def _same_shape(a: TensorMeta, b: TensorMeta, an: str, bn: str) -> None:
    if not same_shape(a.shape, b.shape):
        raise MetaError(f"input {bn!r} has shape {list(b.shape)}, expected {list(a.shape)} "
                        f"(the shape of {an!r})")


def _same_dtype(a: TensorMeta, b: TensorMeta, an: str, bn: str) -> None:
    if a.dtype != b.dtype:
        raise MetaError(f"input {bn!r} has dtype {b.dtype.name}, expected {a.dtype.name} "
                        f"(the dtype of {an!r})")


# ------------------------------------------------------------------------------------------
# normalisation

@register
def LayerNormGradInferMeta(x, scale, bias):
    """x_grad: x; scale_grad: scale (absent without scale); bias_grad: bias (absent without)."""
    x = _need(x, "x")
    return x, scale, bias


@register
def UnchangedExceptLayoutInferMeta(x):
    """out = x (layout aside, which tvmgrad does not track)."""
    return (_need(x, "x"),)


def _instance_param_meta(x: TensorMeta, scale) -> TensorMeta:
    c = x.shape[1] if x.ndim > 1 else 1
    dt = "float32" if x.dtype.name in HALF else x.dtype.name
    return TensorMeta((c,), dt)


def _check_instance(x, scale, mean, var, scale_name="scale"):
    if x.ndim < 2 or x.ndim > 5:
        raise MetaError(f"input 'x' must have rank 2 to 5 (N, C, ...), got shape {list(x.shape)}")
    n, c = x.shape[0], x.shape[1]
    check_param(scale, x, scale_name, (c,), "the channels of 'x'")
    for meta, name in ((mean, "saved_mean"), (var, "saved_variance")):
        check_param(meta, x, name, (n * c,), "batch·channels of 'x'")


@register
def InstanceNormGradInferMeta(x, scale, saved_mean, saved_variance, y_grad, epsilon):
    """x_grad: x; scale_grad (absent without scale), bias_grad: (C,), float32 for a half x."""
    x = _need(x, "x")
    _check_instance(x, scale, _need(saved_mean, "saved_mean"), _need(saved_variance, "saved_variance"))
    y_grad = _need(y_grad, "y_grad")
    _same_shape(x, y_grad, "x", "y_grad")
    _same_dtype(x, y_grad, "x", "y_grad")
    p = _instance_param_meta(x, scale)
    return x, (p if scale is not None else None), p


@register
def InstanceNormDoubleGradInferMeta(x, fwd_scale, saved_mean, saved_variance, grad_y, grad_x_grad,
                                    grad_scale_grad, grad_bias_grad, epsilon):
    """x_grad: x; fwd_scale_grad: (C,) (float32 for a half x); grad_y_grad: x."""
    x = _need(x, "x")
    _check_instance(x, fwd_scale, _need(saved_mean, "saved_mean"),
                    _need(saved_variance, "saved_variance"), "fwd_scale")
    grad_y = _need(grad_y, "grad_y")
    _same_shape(x, grad_y, "x", "grad_y")
    _same_dtype(x, grad_y, "x", "grad_y")
    if grad_x_grad is not None:
        _same_shape(x, grad_x_grad, "x", "grad_x_grad")
        _same_dtype(x, grad_x_grad, "x", "grad_x_grad")
    c = x.shape[1]
    check_param(grad_scale_grad, x, "grad_scale_grad", (c,), "the channels of 'x'")
    check_param(grad_bias_grad, x, "grad_bias_grad", (c,), "the channels of 'x'")
    return x, _instance_param_meta(x, fwd_scale), x


@register
def RmsNormGradInferMeta(x, norm_weight):
    """x_grad: x; norm_weight_grad: norm_weight."""
    return _need(x, "x"), _need(norm_weight, "norm_weight")


@register
def SpectralNormGradInferMeta(weight, u, v, out_grad, dim, power_iters, eps):
    """weight_grad: weight (u, v: the power-iteration vectors of its (h, w) matrix view)."""
    weight = _need(weight, "weight")
    if weight.ndim < 2:
        raise MetaError(f"input 'weight' must have rank >= 2, got shape {list(weight.shape)}")
    if dim not in (0, 1) or dim >= weight.ndim:
        raise MetaError(f"attribute 'dim' must be 0 or 1, got {dim}")
    if not 0 <= power_iters <= MAX_POWER_ITERS:
        raise MetaError(f"attribute 'power_iters' must be in [0, {MAX_POWER_ITERS}], got "
                        f"{power_iters} (the power iterations are unrolled into the kernel)")
    h = weight.shape[dim]
    w = 1
    for i, s in enumerate(weight.shape):
        if i != dim:
            w *= s
    for meta, name, size, what in ((u, "u", h, f"dim {dim} of 'weight'"),
                                   (v, "v", w, f"the other dims of 'weight' {list(weight.shape)}")):
        meta = _need(meta, name)
        if meta.shape != (size,):
            raise MetaError(f"input {name!r} has shape {list(meta.shape)}, expected [{size}] "
                            f"({what})")
        _same_dtype(weight, meta, "weight", name)
    out_grad = _need(out_grad, "out_grad")
    _same_shape(weight, out_grad, "weight", "out_grad")
    return (weight,)


# ------------------------------------------------------------------------------------------
# softmax and losses

@register
def GumbelSoftmaxGradInferMeta(out, out_grad, axis):
    """x_grad: out_grad (out and out_grad must agree)."""
    out, out_grad = _need(out, "out"), _need(out_grad, "out_grad")
    _same_shape(out, out_grad, "out", "out_grad")
    norm_axis(axis, out.ndim, of="out", zero_d_axis=True)
    return (out_grad,)


@register
def IdentityLossGradInferMeta(x, out_grad, reduction):
    """x_grad: x's shape in out_grad's dtype."""
    x, out_grad = _need(x, "x"), _need(out_grad, "out_grad")
    if reduction not in (0, 1, 2):
        raise MetaError(f"attribute 'reduction' must be 0 (sum), 1 (mean) or 2 (none), got {reduction}")
    if reduction == 2:
        _same_shape(x, out_grad, "x", "out_grad")
    elif len(out_grad.shape) > 1 or (out_grad.shape and out_grad.shape[0] != 1):
        raise MetaError(f"input 'out_grad' must hold one value for reduction {reduction}, got "
                        f"shape {list(out_grad.shape)}")
    return (x.with_dtype(out_grad.dtype),)


@register
def CrossEntropyWithSoftmaxGradInferMeta(label, softmax, loss_grad, soft_label, use_softmax,
                                         numeric_stable_mode, ignore_index, axis):
    """input_grad: softmax. label: softmax's shape (soft) or 1 along axis (hard); loss_grad: 1
    along axis."""
    label, softmax, loss_grad = (_need(label, "label"), _need(softmax, "softmax"),
                                 _need(loss_grad, "loss_grad"))
    rank = softmax.ndim
    if rank == 0:
        raise MetaError("input 'softmax' must have rank >= 1")
    ax = norm_axis(axis, rank, of="softmax", zero_d_axis=True)
    expect = list(softmax.shape)
    expect[ax] = 1
    if soft_label:
        if label.shape != softmax.shape:
            raise MetaError(f"input 'label' has shape {list(label.shape)}, expected "
                            f"{list(softmax.shape)} (soft labels: the shape of 'softmax')")
        _same_dtype(softmax, label, "softmax", "label")
    else:
        if label.dtype.kind != "int":
            raise MetaError(f"input 'label' has dtype {label.dtype.name}; hard labels must be "
                            f"int32 or int64 (soft_label=False)")
        if list(label.shape) != expect:
            raise MetaError(f"input 'label' has shape {list(label.shape)}, expected {expect} "
                            f"(hard labels: the shape of 'softmax' with 1 along axis {axis})")
    if list(loss_grad.shape) != expect:
        raise MetaError(f"input 'loss_grad' has shape {list(loss_grad.shape)}, expected {expect} "
                        f"(the shape of 'softmax' with 1 along axis {axis})")
    _same_dtype(softmax, loss_grad, "softmax", "loss_grad")
    return (softmax,)


@register
def MarginCrossEntropyGradInferMeta(logits, label, softmax, loss_grad, return_softmax, ring_id,
                                    rank, nranks, margin1, margin2, margin3, scale):
    """logits_grad: logits (N, C); label (N,) or (N, 1); loss_grad (N, 1)."""
    logits, label, softmax, loss_grad = (_need(logits, "logits"), _need(label, "label"),
                                         _need(softmax, "softmax"), _need(loss_grad, "loss_grad"))
    if nranks != 1 or rank != 0:
        raise MetaError(f"only the single-process case is supported (nranks=1, rank=0); got "
                        f"nranks={nranks}, rank={rank}")
    if logits.ndim != 2:
        raise MetaError(f"input 'logits' must have rank 2 (N, C), got shape {list(logits.shape)}")
    n = logits.shape[0]
    _same_shape(logits, softmax, "logits", "softmax")
    _same_dtype(logits, softmax, "logits", "softmax")
    if label.shape not in ((n,), (n, 1)):
        raise MetaError(f"input 'label' has shape {list(label.shape)}, expected [{n}] or [{n}, 1]")
    if label.dtype.kind != "int":
        raise MetaError(f"input 'label' has dtype {label.dtype.name}, expected int32 or int64")
    if loss_grad.shape not in ((n, 1), (n,)):
        raise MetaError(f"input 'loss_grad' has shape {list(loss_grad.shape)}, expected [{n}, 1]")
    _same_dtype(logits, loss_grad, "logits", "loss_grad")
    return (logits,)


@register
def NllLossGradInferMeta(input, label, weight, total_weight, out_grad, ignore_index, reduction):
    """input_grad: input (N, C) or (N, C, H, W)."""
    x, label = _need(input, "input"), _need(label, "label")
    if x.ndim not in (2, 4):
        raise MetaError(f"input 'input' must have rank 2 (N, C) or 4 (N, C, H, W), got shape "
                        f"{list(x.shape)}")
    if reduction not in ("none", "mean", "sum"):
        raise MetaError(f"attribute 'reduction' must be 'none', 'mean' or 'sum', got {reduction!r}")
    expect = (x.shape[0],) + tuple(x.shape[2:])
    if tuple(label.shape) != expect:
        raise MetaError(f"input 'label' has shape {list(label.shape)}, expected {list(expect)}")
    if label.dtype.name != "int64":
        raise MetaError(f"input 'label' has dtype {label.dtype.name}, expected int64")
    if weight is not None:
        if weight.shape != (x.shape[1],):
            raise MetaError(f"input 'weight' has shape {list(weight.shape)}, expected [{x.shape[1]}]")
        _same_dtype(x, weight, "input", "weight")
    tw = _need(total_weight, "total_weight")
    if tw.shape not in ((), (1,)):
        raise MetaError(f"input 'total_weight' has shape {list(tw.shape)}, expected [] or [1]")
    _same_dtype(x, tw, "input", "total_weight")
    out_grad = _need(out_grad, "out_grad")
    if reduction == "none":
        if tuple(out_grad.shape) != expect:
            raise MetaError(f"input 'out_grad' has shape {list(out_grad.shape)}, expected "
                            f"{list(expect)} (reduction 'none')")
    elif out_grad.shape not in ((), (1,)):
        raise MetaError(f"input 'out_grad' has shape {list(out_grad.shape)}, expected [] "
                        f"(reduction {reduction!r})")
    _same_dtype(x, out_grad, "input", "out_grad")
    return (x,)
