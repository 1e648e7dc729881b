"""Numerical gradients: the reference where no oracle computes a grad (float64 central differences)."""

import numpy as np


def central_diff(f, x, h=1e-6):
    """∂f/∂x by central differences, element by element: (f(x + h·e_i) − f(x − h·e_i)) / 2h, with
    ``f`` a scalar function of an array shaped like ``x``."""
    grad = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        grad[idx] = (f(xp) - f(xm)) / (2 * h)
    return grad
