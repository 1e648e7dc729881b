"""PyTorch references and realistic inputs for the interpolation / sampling grads.

Bench targets of issue 5 (part B): bilinear_interp_grad (8×64×112×112 upsampled to 224×224,
half-pixel centres: align_corners=False, align_mode=0, which is PyTorch's align_corners=False)
and grid_sample_grad (bilinear, zeros padding). ``--size N`` scales the batch: about N elements
of output_grad.
"""

from __future__ import annotations

import numpy as np

from ..examples import np_dtype
from . import aten


def _rand(rng, shape, dtype, lo=None, hi=None):
    x = (rng.standard_normal(shape, dtype=np.float32) if lo is None
         else rng.uniform(lo, hi, shape).astype(np.float32))
    return x.astype(np_dtype(dtype))


# -- inputs -----------------------------------------------------------------------------------

def _interp_inputs(C, in_sp, out_sp, method):
    names = {1: ["out_w"], 2: ["out_h", "out_w"], 3: ["out_d", "out_h", "out_w"]}[len(out_sp)]

    def make(size, dtype):
        per = C * int(np.prod(out_sp))
        n = max(1, int(round(size / per)))
        rng = np.random.default_rng(0)
        inputs = {"x": np.zeros((n, C) + tuple(in_sp), np_dtype(dtype)),
                  "output_grad": _rand(rng, (n, C) + tuple(out_sp), dtype)}
        attrs = dict(zip(names, out_sp), interp_method=method, align_corners=False, align_mode=0)
        return inputs, attrs
    return make


def _grid_inputs(size, dtype):
    C, H, W, Ho, Wo = 32, 64, 64, 128, 128
    n = max(1, int(round(size / (C * Ho * Wo))))
    rng = np.random.default_rng(0)
    return ({"x": _rand(rng, (n, C, H, W), dtype), "grid": _rand(rng, (n, Ho, Wo, 2), dtype, -1, 1),
             "out_grad": _rand(rng, (n, C, Ho, Wo), dtype)},
            {"mode": "bilinear", "padding_mode": "zeros", "align_corners": False})


def _affine_inputs(size, dtype):
    H = W = 224
    n = max(1, int(round(size / (H * W * 2))))
    rng = np.random.default_rng(0)
    return ({"input": _rand(rng, (n, 2, 3), dtype), "output_grad": _rand(rng, (n, H, W, 2), dtype)},
            {"output_shape": [n, 3, H, W], "align_corners": False})


def _roi_align_inputs(size, dtype):
    """A detector's second stage: 7 x 7 bins of 256 channels on a 56 x 56 feature map (2 images),
    about ``size`` elements of out_grad, boxes in feature-map units."""
    C, H, W, P = 256, 56, 56, 7
    rois = max(2, int(round(size / (C * P * P))))
    rng = np.random.default_rng(0)
    x1, y1 = rng.uniform(0, W - 8, rois), rng.uniform(0, H - 8, rois)
    boxes = np.stack([x1, y1, x1 + rng.uniform(4, 24, rois), y1 + rng.uniform(4, 24, rois)], 1)
    return ({"x": np.zeros((2, C, H, W), np_dtype(dtype)), "boxes": boxes.astype(np_dtype(dtype)),
             "boxes_num": np.array([rois // 2, rois - rois // 2], np.int32),
             "out_grad": _rand(rng, (rois, C, P, P), dtype)},
            {"pooled_height": P, "pooled_width": P, "spatial_scale": 1.0, "sampling_ratio": 2,
             "aligned": True})


INPUTS = {
    "bilinear_interp_grad": _interp_inputs(64, (112, 112), (224, 224), "bilinear"),
    "nearest_interp_grad": _interp_inputs(64, (112, 112), (224, 224), "nearest"),
    "bicubic_interp_grad": _interp_inputs(64, (112, 112), (224, 224), "bicubic"),
    "linear_interp_grad": _interp_inputs(64, (1024,), (2048,), "linear"),
    "trilinear_interp_grad": _interp_inputs(16, (16, 28, 28), (32, 56, 56), "trilinear"),
    "grid_sample_grad": _grid_inputs,
    "affine_grid_grad": _affine_inputs,
    "roi_align_grad": _roi_align_inputs,
}


# -- PyTorch ----------------------------------------------------------------------------------

def _upsample(fn_name, with_align=True):
    def make(t, a):
        g, x = t["output_grad"], t["x"]
        out_size, in_size = list(g.shape[2:]), list(x.shape)
        fn = getattr(aten(), fn_name)
        if with_align:
            return lambda: fn(g, out_size, in_size, bool(a["align_corners"]))
        return lambda: fn(g, out_size, in_size)
    return make


def _grid_sample(t, a):
    mode = {"bilinear": 0, "nearest": 1}[a["mode"]]
    pad = {"zeros": 0, "border": 1, "reflection": 2}[a["padding_mode"]]
    return lambda: aten().grid_sampler_2d_backward(t["out_grad"], t["x"], t["grid"], mode, pad,
                                                    bool(a["align_corners"]), [True, True])


def _affine_grid(t, a):
    return lambda: aten().affine_grid_generator_backward(t["output_grad"], list(a["output_shape"]),
                                                          bool(a["align_corners"]))


def _roi_align(t, a):
    """torchvision's roi_align backward (rois as [image, x1, y1, x2, y2] rows); None without
    torchvision."""
    import importlib
    try:
        importlib.import_module("torchvision.ops")           # registers torch.ops.torchvision
    except ImportError:
        return None
    import torch
    x, boxes, g = t["x"], t["boxes"], t["out_grad"]
    image = torch.repeat_interleave(torch.arange(len(t["boxes_num"])), t["boxes_num"].to(torch.int64))
    rois = torch.cat([image[:, None].to(boxes.dtype), boxes], 1)
    n, c, h, w = x.shape
    return lambda: torch.ops.torchvision._roi_align_backward(
        g, rois, float(a["spatial_scale"]), int(a["pooled_height"]), int(a["pooled_width"]), n, c, h,
        w, int(a["sampling_ratio"]), bool(a["aligned"]))


TORCH = {
    "bilinear_interp_grad": _upsample("upsample_bilinear2d_backward"),
    "bicubic_interp_grad": _upsample("upsample_bicubic2d_backward"),
    "nearest_interp_grad": _upsample("upsample_nearest2d_backward", with_align=False),
    "linear_interp_grad": _upsample("upsample_linear1d_backward"),
    "trilinear_interp_grad": _upsample("upsample_trilinear3d_backward"),
    "grid_sample_grad": _grid_sample,
    "affine_grid_grad": _affine_grid,
    "roi_align_grad": _roi_align,
}


# -- Paddle (the optional size tensors are absent: pass None) ---------------------------------

def _paddle_interp(op):
    def make(t, a):
        import paddle
        fn = getattr(paddle._C_ops, op)
        args = [t["x"], None, None, None, t["output_grad"], a["data_format"], a["out_d"],
                a["out_h"], a["out_w"], list(a["scale"]), a["interp_method"], a["align_corners"],
                a["align_mode"]]
        return lambda: fn(*args)
    return make


PADDLE = {op: _paddle_interp(op) for op in ("bilinear_interp_grad", "nearest_interp_grad",
                                             "bicubic_interp_grad", "linear_interp_grad",
                                             "trilinear_interp_grad")}
