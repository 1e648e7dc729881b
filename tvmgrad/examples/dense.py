"""Sample calls of the dense grads (te_defs/matmul.py, conv.py, pool.py) for the generic tests
(CUDA builds, higher-order chains, errors): float64 inputs, valid for the op."""

import numpy as np

from . import factory


def _n(rng, *shape):
    return rng.standard_normal(shape)


@factory("bmm_grad")
def _bmm(rng):
    return {"x": _n(rng, 2, 5, 7), "y": _n(rng, 2, 7, 3), "out_grad": _n(rng, 2, 5, 3)}, {}


@factory("addmm_grad")
def _addmm(rng):
    return {"input": _n(rng, 5, 3), "x": _n(rng, 5, 4), "y": _n(rng, 4, 3),
            "out_grad": _n(rng, 5, 3)}, {"alpha": 0.5, "beta": 1.5}


@factory("dot_grad")
def _dot(rng):
    return {"x": _n(rng, 3, 6), "y": _n(rng, 3, 6), "out_grad": _n(rng, 3)}, {}


@factory("mv_grad")
def _mv(rng):
    return {"x": _n(rng, 5, 6), "vec": _n(rng, 6), "out_grad": _n(rng, 5)}, {}


@factory("multi_dot_grad")
def _multi_dot(rng):
    return {"x": [_n(rng, 3, 4), _n(rng, 4, 5), _n(rng, 5, 2)], "out_grad": _n(rng, 3, 2)}, {}


@factory("kron_grad")
def _kron(rng):
    return {"x": _n(rng, 2, 3), "y": _n(rng, 3, 2), "out_grad": _n(rng, 6, 6)}, {}


@factory("bilinear_grad")
def _bilinear(rng):
    return {"x": _n(rng, 3, 4), "y": _n(rng, 3, 5), "weight": _n(rng, 2, 4, 5),
            "out_grad": _n(rng, 3, 2)}, {}


@factory("cross_grad")
def _cross(rng):
    return {"x": _n(rng, 3, 4), "y": _n(rng, 3, 4), "out_grad": _n(rng, 3, 4)}, {"axis": 0}


@factory("trace_grad")
def _trace(rng):
    return {"x": _n(rng, 2, 4, 5), "out_grad": _n(rng, 2)}, {"offset": 1, "axis1": 1, "axis2": 2}


@factory("weight_only_linear_grad")
def _weight_only(rng):
    # int8 weights in Paddle's arch-80 layout are a permutation of [n, k] bytes: any bytes are
    # a valid weight
    return {"x": _n(rng, 3, 64), "weight": rng.integers(-127, 128, (16, 64)).astype(np.int8),
            "weight_scale": rng.random(16) + 0.5, "out_grad": _n(rng, 3, 16)}, \
        {"weight_dtype": "int8", "arch": 80, "group_size": -1}


_CONV2D = dict(strides=[1, 1], paddings=[1, 1], padding_algorithm="EXPLICIT", dilations=[1, 1],
               groups=1, data_format="NCHW")
_CONV3D = dict(strides=[1, 1, 1], paddings=[1, 0, 1], padding_algorithm="EXPLICIT",
               dilations=[1, 1, 1], groups=1, data_format="NCDHW")


@factory("conv2d_grad")
def _conv2d(rng):
    return {"input": _n(rng, 2, 3, 6, 5), "filter": _n(rng, 4, 3, 3, 3),
            "out_grad": _n(rng, 2, 4, 6, 5)}, dict(_CONV2D)


@factory("conv2d_grad_grad")
def _conv2d_gg(rng):
    return {"input": _n(rng, 2, 3, 6, 5), "filter": _n(rng, 4, 3, 3, 3),
            "grad_out": _n(rng, 2, 4, 6, 5), "grad_input_grad": _n(rng, 2, 3, 6, 5),
            "grad_filter_grad": _n(rng, 4, 3, 3, 3)}, dict(_CONV2D)


@factory("depthwise_conv2d_grad")
def _dw(rng):
    return {"input": _n(rng, 2, 4, 6, 5), "filter": _n(rng, 4, 1, 3, 3),
            "out_grad": _n(rng, 2, 4, 6, 5)}, dict(_CONV2D, groups=4)


@factory("depthwise_conv2d_double_grad")
def _dw_gg(rng):
    return {"input": _n(rng, 2, 4, 6, 5), "filter": _n(rng, 4, 1, 3, 3),
            "grad_out": _n(rng, 2, 4, 6, 5), "grad_input_grad": _n(rng, 2, 4, 6, 5),
            "grad_filter_grad": _n(rng, 4, 1, 3, 3)}, dict(_CONV2D, groups=4)


@factory("conv3d_grad")
def _conv3d(rng):
    return {"input": _n(rng, 2, 3, 4, 5, 4), "filter": _n(rng, 2, 3, 3, 2, 3),
            "out_grad": _n(rng, 2, 2, 4, 4, 4)}, dict(_CONV3D)


@factory("conv3d_double_grad")
def _conv3d_gg(rng):
    return {"input": _n(rng, 2, 3, 4, 5, 4), "filter": _n(rng, 2, 3, 3, 2, 3),
            "grad_out": _n(rng, 2, 2, 4, 4, 4), "grad_input_grad": _n(rng, 2, 3, 4, 5, 4),
            "grad_filter_grad": _n(rng, 2, 3, 3, 2, 3)}, dict(_CONV3D)


@factory("conv3d_transpose_grad")
def _conv3d_t(rng):
    return {"x": _n(rng, 2, 3, 3, 4, 3), "filter": _n(rng, 3, 2, 2, 3, 2),
            "out_grad": _n(rng, 2, 2, 4, 6, 4)}, \
        dict(strides=[1, 1, 1], paddings=[0, 0, 0], output_padding=[], output_size=[],
             padding_algorithm="EXPLICIT", groups=1, dilations=[1, 1, 1], data_format="NCDHW")


def _pool_mask(rng, out_shape, plane):
    return rng.integers(0, plane, out_shape).astype(np.int32)


@factory("max_pool2d_with_index_grad")
def _mp2(rng):
    return {"x": _n(rng, 2, 3, 6, 6), "mask": _pool_mask(rng, (2, 3, 3, 3), 36),
            "out_grad": _n(rng, 2, 3, 3, 3)}, {"kernel_size": [2, 2], "strides": [2, 2]}


@factory("max_pool3d_with_index_grad")
def _mp3(rng):
    return {"x": _n(rng, 2, 2, 4, 4, 4), "mask": _pool_mask(rng, (2, 2, 2, 2, 2), 64),
            "out_grad": _n(rng, 2, 2, 2, 2, 2)}, {"kernel_size": [2, 2, 2], "strides": [2, 2, 2]}


@factory("fractional_max_pool2d_grad")
def _fmp2(rng):
    return {"x": _n(rng, 2, 3, 7, 7), "mask": _pool_mask(rng, (2, 3, 4, 4), 49),
            "out_grad": _n(rng, 2, 3, 4, 4)}, {"output_size": [4, 4], "random_u": 0.3}


@factory("fractional_max_pool3d_grad")
def _fmp3(rng):
    return {"x": _n(rng, 1, 2, 5, 5, 5), "mask": _pool_mask(rng, (1, 2, 3, 3, 3), 125),
            "out_grad": _n(rng, 1, 2, 3, 3, 3)}, {"output_size": [3, 3, 3], "random_u": 0.3}


@factory("unpool3d_grad")
def _unpool3d(rng):
    idx = np.stack([rng.permutation(64)[:8] for _ in range(6)]).reshape(2, 3, 2, 2, 2)
    return {"x": _n(rng, 2, 3, 2, 2, 2), "indices": idx.astype(np.int32),
            "out": _n(rng, 2, 3, 4, 4, 4), "out_grad": _n(rng, 2, 3, 4, 4, 4)}, \
        {"ksize": [2, 2, 2], "strides": [2, 2, 2], "output_size": [4, 4, 4]}
