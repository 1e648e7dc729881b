"""Grads of broadcasting binary math ops."""

from tvmgrad.families import pointwise


@pointwise
def atan2_grad(x, y, out_grad):
    """x_grad = out_grad · y / (x² + y²),  y_grad = -out_grad · x / (x² + y²)"""
    d = x * x + y * y
    return out_grad * y / d, -out_grad * x / d
