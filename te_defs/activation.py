"""Activation grads."""

from tvmgrad.families import pointwise

from ._math import where


@pointwise
def relu_grad(out, out_grad):
    """x_grad = out_grad · [out > 0]"""
    return where(out > 0, out_grad, 0.0)
