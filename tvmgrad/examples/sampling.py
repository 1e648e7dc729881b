"""Sample calls of the sampling grads (te_defs/interp.py, roi.py, signal.py) for the generic tests
(CUDA build, VJP chain): float64 inputs, valid for the op; index inputs stay integer."""

import numpy as np

from . import factory


def _n(rng, *shape):
    return rng.standard_normal(shape)


def _interp(rng, method, x_shape, g_shape, **attrs):
    names = {3: ["out_w"], 4: ["out_h", "out_w"], 5: ["out_d", "out_h", "out_w"]}[len(g_shape)]
    sizes = dict(zip(names, g_shape[2:]))
    return {"x": _n(rng, *x_shape), "output_grad": _n(rng, *g_shape)}, \
        dict(sizes, interp_method=method, **attrs)


@factory("linear_interp_grad")
def _linear(rng):
    return _interp(rng, "linear", (2, 3, 5), (2, 3, 9), align_corners=False, align_mode=0)


@factory("bilinear_interp_grad")
def _bilinear(rng):
    return _interp(rng, "bilinear", (2, 3, 5, 4), (2, 3, 8, 7), align_corners=False, align_mode=0)


@factory("trilinear_interp_grad")
def _trilinear(rng):
    return _interp(rng, "trilinear", (1, 2, 3, 4, 5), (1, 2, 5, 3, 8), align_corners=True)


@factory("bicubic_interp_grad")
def _bicubic(rng):
    return _interp(rng, "bicubic", (2, 3, 5, 4), (2, 3, 8, 7), align_corners=False)


@factory("nearest_interp_grad")
def _nearest(rng):
    return _interp(rng, "nearest", (2, 3, 5, 4), (2, 3, 8, 7), align_corners=False)


@factory("grid_sample_grad")
def _grid_sample(rng):
    return {"x": _n(rng, 2, 3, 5, 4), "grid": rng.uniform(-1.1, 1.1, (2, 6, 7, 2)),
            "out_grad": _n(rng, 2, 3, 6, 7)}, \
        {"mode": "bilinear", "padding_mode": "zeros", "align_corners": False}


@factory("affine_grid_grad")
def _affine_grid(rng):
    return {"input": _n(rng, 2, 2, 3), "output_grad": _n(rng, 2, 5, 6, 2)}, \
        {"output_shape": [2, 3, 5, 6], "align_corners": False}


@factory("correlation_grad")
def _correlation(rng):
    return {"input1": _n(rng, 2, 3, 7, 8), "input2": _n(rng, 2, 3, 7, 8),
            "out_grad": _n(rng, 2, 25, 7, 8)}, \
        {"pad_size": 2, "kernel_size": 1, "max_displacement": 2, "stride1": 1, "stride2": 1,
         "corr_type_multiply": 1}


@factory("overlap_add_grad")
def _overlap_add(rng):
    return {"x": _n(rng, 3, 5, 4), "out_grad": _n(rng, 3, 11)}, {"hop_length": 2, "axis": -1}


def _boxes(rng, R, H, W):
    x1 = rng.uniform(0, W - 1, R)
    y1 = rng.uniform(0, H - 1, R)
    return np.stack([x1, y1, x1 + rng.uniform(1, W, R), y1 + rng.uniform(1, H, R)], 1)


@factory("roi_align_grad")
def _roi_align(rng):
    return {"x": _n(rng, 2, 3, 8, 9), "boxes": _boxes(rng, 5, 8, 9),
            "boxes_num": np.array([3, 2], "int32"), "out_grad": _n(rng, 5, 3, 2, 2)}, \
        {"pooled_height": 2, "pooled_width": 2, "spatial_scale": 1.0, "sampling_ratio": -1,
         "aligned": False}


@factory("roi_pool_grad")
def _roi_pool(rng):
    return {"x": _n(rng, 2, 3, 8, 9), "boxes": _boxes(rng, 5, 8, 9),
            "boxes_num": np.array([3, 2], "int32"),
            "arg_max": rng.integers(-1, 72, (5, 3, 2, 2)).astype("int64"),
            "out_grad": _n(rng, 5, 3, 2, 2)}, \
        {"pooled_height": 2, "pooled_width": 2, "spatial_scale": 1.0}


@factory("psroi_pool_grad")
def _psroi_pool(rng):
    return {"x": _n(rng, 2, 8, 8, 9), "boxes": _boxes(rng, 5, 8, 9),
            "boxes_num": np.array([3, 2], "int32"), "out_grad": _n(rng, 5, 2, 2, 2)}, \
        {"pooled_height": 2, "pooled_width": 2, "output_channels": 2, "spatial_scale": 1.0}
