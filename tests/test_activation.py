"""Activation grads against Paddle 3.3.1 (te_defs/activation.py)."""

import numpy as np
import pytest

from harness import FLOATS, check, rng


def with_kinks(shape, kinks=(0.0,), seed=0):
    """Random normals with some entries exactly at the kinks (ties, zeros) of a piecewise grad."""
    x = rng(seed).standard_normal(shape)
    flat = x.reshape(-1)
    for i, k in enumerate(kinks):
        flat[i::7 + i] = k
    return x


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(7,), (3, 1, 5), (2, 3, 4, 5), ()])
def test_relu_grad(dtype, shape):
    out = np.maximum(with_kinks(shape), 0)
    check("relu_grad", {"out": out, "out_grad": rng(1).standard_normal(shape)}, dtype=dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mode,data_format,alpha_shape", [
    ("all", "NCHW", (1,)),
    ("channel", "NCHW", (3,)),
    ("channel", "NHWC", (5,)),
])
def test_prelu_grad(dtype, mode, data_format, alpha_shape):
    x = with_kinks((2, 3, 4, 5))
    check("prelu_grad", {"x": x, "alpha": rng(2).random(alpha_shape), "out_grad": rng(3).standard_normal(x.shape)},
          {"data_format": data_format, "mode": mode}, dtype=dtype)
