"""Activation grads."""

from tvmgrad.families import pointwise

from ._math import where


@pointwise
def relu_grad(out, out_grad):
    """x_grad = out_grad · [out > 0]"""
    return where(out > 0, out_grad, 0.0)


def _prelu_views(shapes, attrs):
    """alpha (and its grad) viewed so that it broadcasts against x."""
    x, alpha = shapes["x"], shapes["alpha"]
    if attrs["mode"] == "channel":
        c_axis = 1 if attrs["data_format"] == "NCHW" else len(x) - 1
        view = tuple(x[c_axis] if d == c_axis else 1 for d in range(len(x)))
    elif attrs["mode"] == "element":
        view = (1,) + tuple(x[1:])
    else:
        view = (1,) * len(x)
    return {"alpha": view, "alpha_grad": view}


@pointwise(broadcast=("alpha",), views=_prelu_views)
def prelu_grad(x, alpha, out_grad, data_format, mode):
    """x_grad = out_grad · (x > 0 ? 1 : alpha),  alpha_grad = Σ out_grad · (x > 0 ? 0 : x)"""
    return where(x > 0, out_grad, alpha * out_grad), where(x > 0, 0.0, x * out_grad)
