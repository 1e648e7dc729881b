"""Pooling grads that route by recorded indices against Paddle 3.3.1 (te_defs/pool.py):
max_pool2d/3d_with_index_grad, fractional_max_pool2d/3d_grad (scatter by mask) and
unpool3d_grad (gather by indices).

Masks come from Paddle's own forward ops (overlapping windows, padding, adaptive and fractional
windows) and, since Paddle's grad accepts any in-range mask, also at random with repeated
indices (the summation order is Paddle's: outputs in order). Paddle 3.3.1's
max_pool*_with_index bindings take an extra ``ceil_mode`` argument the YAML lacks (called with
the YAML's arguments they segfault), so their oracle passes it.
"""

import numpy as np
import pytest

import tvmgrad
from harness import FLOATS, check, from_paddle, rng, to_paddle
from tvmgrad.spec import load_specs


def N(*shape, seed=0):
    return rng(seed + 11 * len(shape) + sum(shape)).standard_normal(shape)


def _paddle():
    import paddle
    paddle.set_device("cpu")
    return paddle


def with_index_oracle(op):
    def oracle(inputs, attrs):
        C = _paddle()._C_ops
        a = {**load_specs()[op].defaults, **attrs}
        res = getattr(C, op)(to_paddle(inputs["x"]), to_paddle(inputs["mask"]),
                             to_paddle(inputs["out_grad"]), a["kernel_size"], a["strides"],
                             a["paddings"], a["global_pooling"], a["adaptive"], False)
        return {"x_grad": from_paddle(res)}
    return oracle


# ------------------------------------------------------------------------------------------
# max_pool with index

POOL2D = {
    "k3s2p1": ((2, 3, 7, 6), dict(kernel_size=[3, 3], strides=[2, 2], paddings=[1, 1])),
    "k2s1": ((1, 2, 5, 5), dict(kernel_size=[2, 2], strides=[1, 1], paddings=[0, 0])),
    "adaptive": ((2, 2, 7, 5), dict(kernel_size=[3, 2], strides=[1, 1], paddings=[0, 0], adaptive=True)),
    "global": ((2, 3, 4, 5), dict(kernel_size=[1, 1], strides=[1, 1], paddings=[0, 0], global_pooling=True)),
}


def forward2d(x, attrs):
    a = dict(strides=[1, 1], paddings=[0, 0], global_pooling=False, adaptive=False)
    a.update(attrs)
    out, mask = _paddle()._C_ops.max_pool2d_with_index(
        to_paddle(x), a["kernel_size"], a["strides"], a["paddings"], a["global_pooling"],
        a["adaptive"], False)
    return mask.numpy()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(POOL2D))
def test_max_pool2d_with_index_grad(name, dtype):
    if dtype != "float64" and name != "k3s2p1":
        return
    shape, attrs = POOL2D[name]
    x = N(*shape)
    mask = forward2d(x, attrs)
    check("max_pool2d_with_index_grad", {"x": x, "mask": mask, "out_grad": N(*mask.shape, seed=1)},
          attrs, dtype, oracle=with_index_oracle("max_pool2d_with_index_grad"))


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool_with_index_grad_repeated_indices(dtype):
    """Any in-range mask, many outputs on one input: Paddle's summation order."""
    x = N(2, 3, 6, 6)
    mask = rng(3).integers(0, 5, size=(2, 3, 4, 4)).astype(np.int32)
    check("max_pool2d_with_index_grad", {"x": x, "mask": mask, "out_grad": N(2, 3, 4, 4, seed=1)},
          {"kernel_size": [3, 3], "strides": [1, 1]}, dtype,
          oracle=with_index_oracle("max_pool2d_with_index_grad"))


def test_max_pool_with_index_grad_int64_mask_and_empty():
    x = N(2, 3, 6, 6)
    mask = rng(3).integers(0, 36, size=(2, 3, 3, 3))
    check("max_pool2d_with_index_grad", {"x": x, "mask": mask, "out_grad": N(2, 3, 3, 3, seed=1)},
          {"kernel_size": [2, 2], "strides": [2, 2]}, "float64",
          oracle=lambda i, a: with_index_oracle("max_pool2d_with_index_grad")(
              dict(i, mask=i["mask"].astype(np.int32)), a))
    out = tvmgrad.run("max_pool2d_with_index_grad",
                      {"x": N(0, 3, 6, 6), "mask": np.zeros((0, 3, 3, 3), np.int32),
                       "out_grad": N(0, 3, 3, 3)}, {"kernel_size": [2, 2]})
    assert out["x_grad"].shape == (0, 3, 6, 6)
    out = tvmgrad.run("max_pool2d_with_index_grad",
                      {"x": N(1, 2, 3, 3), "mask": np.zeros((1, 2, 0, 3), np.int32),
                       "out_grad": N(1, 2, 0, 3)}, {"kernel_size": [2, 2]})
    np.testing.assert_array_equal(out["x_grad"], 0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool3d_with_index_grad(dtype):
    x = N(2, 2, 5, 6, 7)
    attrs = dict(kernel_size=[2, 3, 2], strides=[2, 2, 1], paddings=[1, 0, 1])
    out, mask = _paddle()._C_ops.max_pool3d_with_index(
        to_paddle(x), attrs["kernel_size"], attrs["strides"], attrs["paddings"], False, False, False)
    mask = mask.numpy()
    check("max_pool3d_with_index_grad", {"x": x, "mask": mask, "out_grad": N(*mask.shape, seed=1)},
          attrs, dtype, oracle=with_index_oracle("max_pool3d_with_index_grad"))


def test_max_pool_with_index_grad_errors():
    x, g = N(2, 3, 6, 6), N(2, 3, 3, 3)
    with pytest.raises(ValueError, match=r"max_pool2d_with_index_grad: input 'mask' holds 36, outside \[0, 36\)"):
        tvmgrad.run("max_pool2d_with_index_grad",
                    {"x": x, "mask": np.full((2, 3, 3, 3), 36, np.int32), "out_grad": g}, {"kernel_size": [2, 2]})
    with pytest.raises(ValueError, match=r"max_pool2d_with_index_grad: input 'mask' holds -1"):
        tvmgrad.run("max_pool2d_with_index_grad",
                    {"x": x, "mask": np.full((2, 3, 3, 3), -1, np.int32), "out_grad": g}, {"kernel_size": [2, 2]})
    with pytest.raises(ValueError, match=r"max_pool2d_with_index_grad: input 'mask' has shape \[2, 3, 3, 2\]"):
        tvmgrad.run("max_pool2d_with_index_grad",
                    {"x": x, "mask": np.zeros((2, 3, 3, 2), np.int32), "out_grad": g}, {"kernel_size": [2, 2]})
    with pytest.raises(ValueError, match=r"max_pool2d_with_index_grad: input 'x' must be 4-D"):
        tvmgrad.run("max_pool2d_with_index_grad",
                    {"x": N(2, 3, 6), "mask": np.zeros((2, 3, 3, 3), np.int32), "out_grad": g}, {"kernel_size": [2, 2]})
    with pytest.raises(TypeError, match=r"max_pool2d_with_index_grad: input 'mask' has dtype float64"):
        tvmgrad.run("max_pool2d_with_index_grad",
                    {"x": x, "mask": np.zeros((2, 3, 3, 3)), "out_grad": g}, {"kernel_size": [2, 2]})


# ------------------------------------------------------------------------------------------
# fractional max pool

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kernel", [None, 2])
def test_fractional_max_pool2d_grad(dtype, kernel):
    x = N(2, 3, 9, 7)
    ks = [kernel, kernel] if kernel else [0, 0]
    attrs = {"output_size": [4, 3], "kernel_size": ks, "random_u": 0.37, "return_mask": True}
    out, mask = _paddle()._C_ops.fractional_max_pool2d(to_paddle(x), [4, 3], ks, 0.37, True)
    check("fractional_max_pool2d_grad", {"x": x, "mask": mask.numpy(), "out_grad": N(2, 3, 4, 3, seed=1)},
          attrs, dtype)


def test_fractional_max_pool2d_grad_random_u():
    """random_u = 0: the forward draws its own u; the grad only follows the recorded mask (and
    every value of random_u shares one kernel)."""
    x = N(2, 3, 9, 7)
    out, mask = _paddle()._C_ops.fractional_max_pool2d(to_paddle(x), [5, 4], [0, 0], 0.0, True)
    for u in (0.0, 0.9):
        check("fractional_max_pool2d_grad", {"x": x, "mask": mask.numpy(), "out_grad": N(2, 3, 5, 4, seed=1)},
              {"output_size": [5, 4], "random_u": u}, "float64")


@pytest.mark.parametrize("dtype", FLOATS)
def test_fractional_max_pool3d_grad(dtype):
    x = N(1, 2, 7, 6, 5)
    out, mask = _paddle()._C_ops.fractional_max_pool3d(to_paddle(x), [3, 4, 2], [0, 0, 0], 0.61, True)
    check("fractional_max_pool3d_grad", {"x": x, "mask": mask.numpy(), "out_grad": N(1, 2, 3, 4, 2, seed=1)},
          {"output_size": [3, 4, 2], "kernel_size": [0, 0, 0], "random_u": 0.61, "return_mask": True},
          dtype)


# ------------------------------------------------------------------------------------------
# unpool3d

UNPOOL = {"ksize": [2, 2, 2], "strides": [2, 2, 2], "paddings": [0, 0, 0], "output_size": [4, 6, 4],
          "data_format": "NCDHW"}


@pytest.mark.parametrize("dtype", FLOATS)
def test_unpool3d_grad(dtype):
    xin = N(2, 3, 4, 6, 4)
    x, idx = _paddle()._C_ops.max_pool3d_with_index(to_paddle(xin), [2, 2, 2], [2, 2, 2], [0, 0, 0],
                                                   False, False, False)
    check("unpool3d_grad", {"x": x.numpy(), "indices": idx.numpy(), "out": xin,
                            "out_grad": N(2, 3, 4, 6, 4, seed=1)}, UNPOOL, dtype)


def test_unpool3d_grad_repeated_indices():
    x = N(1, 2, 2, 3, 2)
    idx = rng(5).integers(0, 3, size=x.shape).astype(np.int32)     # a gather: repeats are fine
    check("unpool3d_grad", {"x": x, "indices": idx, "out": N(1, 2, 4, 6, 4),
                            "out_grad": N(1, 2, 4, 6, 4, seed=1)}, UNPOOL, "float64")


def test_unpool3d_grad_errors():
    x, out = N(1, 2, 2, 3, 2), N(1, 2, 4, 6, 4)
    with pytest.raises(ValueError, match=r"unpool3d_grad: input 'indices' holds 96, outside \[0, 96\)"):
        tvmgrad.run("unpool3d_grad", {"x": x, "indices": np.full(x.shape, 96, np.int32), "out": out,
                                      "out_grad": out}, UNPOOL)
    with pytest.raises(ValueError, match=r"unpool3d_grad: attribute 'data_format' must be 'NCDHW'"):
        tvmgrad.run("unpool3d_grad", {"x": x, "indices": np.zeros(x.shape, np.int32), "out": out,
                                      "out_grad": out}, dict(UNPOOL, data_format="NDHWC"))
    with pytest.raises(ValueError, match=r"unpool3d_grad: input 'out_grad' has shape \[1, 2, 4, 6, 3\]"):
        tvmgrad.run("unpool3d_grad", {"x": x, "indices": np.zeros(x.shape, np.int32), "out": out,
                                      "out_grad": N(1, 2, 4, 6, 3)}, UNPOOL)
