"""Sample calls of the shape / linear grads (te_defs/shape.py, te_defs/linear.py) for the generic
tests (CUDA builds, VJP chains, in-place pairs). Float64 inputs, valid for each op."""

from . import factory


def _n(rng, *shape):
    return rng.standard_normal(shape)


@factory("as_strided_grad")
def _(rng):
    return {"input": _n(rng, 12), "out_grad": _n(rng, 3, 4)}, \
        {"dims": [3, 4], "stride": [2, 1], "offset": 8}


@factory("broadcast_tensors_grad")
def _(rng):
    return {"input": [_n(rng, 3, 1), _n(rng, 4), _n(rng, 2, 3, 4)],
            "out_grad": [_n(rng, 2, 3, 4) for _ in range(3)]}, {}


@factory("concat_grad")
def _(rng):
    return {"x": [_n(rng, 2, 3, 4), _n(rng, 2, 1, 4)], "out_grad": _n(rng, 2, 4, 4)}, {"axis": 1}


@factory("concat_double_grad")
def _(rng):
    return {"grad_x_grad": [_n(rng, 2, 3, 4), _n(rng, 2, 1, 4)]}, {"axis": 1}


@factory("crop_grad")
def _(rng):
    return {"x": _n(rng, 4, 6), "out_grad": _n(rng, 2, 3)}, {"offsets": [1, 2]}


@factory("diag_grad")
def _(rng):
    return {"x": _n(rng, 4), "out_grad": _n(rng, 5, 5)}, {"offset": 1}


@factory("diagonal_grad")
def _(rng):
    return {"x": _n(rng, 3, 4, 5), "out_grad": _n(rng, 4, 3)}, {"offset": 1, "axis1": 0, "axis2": 2}


@factory("expand_as_grad")
def _(rng):
    return {"x": _n(rng, 3, 1), "out_grad": _n(rng, 2, 3, 4)}, {"target_shape": [2, 3, 4]}


@factory("expand_grad")
def _(rng):
    return {"x": _n(rng, 3, 1), "out_grad": _n(rng, 2, 3, 4)}, {"shape": [2, 3, 4]}


@factory("expand_double_grad")
def _(rng):
    return {"grad_x_grad": _n(rng, 3, 1)}, {"shape": [2, 3, 4]}


@factory("fill_diagonal_grad")
def _(rng):
    return {"out_grad": _n(rng, 5, 3)}, {"value": 1.0, "offset": 0, "wrap": True}


@factory("fill_diagonal_tensor_grad")
def _(rng):
    return {"out_grad": _n(rng, 2, 3, 4)}, {"offset": 1, "dim1": 1, "dim2": 2}


@factory("flatten_grad")
def _(rng):
    return {"xshape": _n(rng, 2, 3, 4), "out_grad": _n(rng, 2, 12)}, {}


@factory("flip_grad")
def _(rng):
    return {"out_grad": _n(rng, 3, 4, 5)}, {"axis": [0, 2]}


@factory("fold_grad")
def _(rng):
    return {"x": _n(rng, 2, 12, 4), "out_grad": _n(rng, 2, 3, 3, 3)}, \
        {"output_sizes": [3, 3], "kernel_sizes": [2, 2], "strides": [1, 1],
         "paddings": [0, 0, 0, 0], "dilations": [1, 1]}


@factory("frame_grad")
def _(rng):
    return {"x": _n(rng, 2, 10), "out_grad": _n(rng, 2, 4, 3)}, \
        {"frame_length": 4, "hop_length": 3, "axis": -1}


@factory("meshgrid_grad")
def _(rng):
    return {"inputs": [_n(rng, 2), _n(rng, 3)],
            "outputs_grad": [_n(rng, 2, 3), _n(rng, 2, 3)]}, {}


@factory("pad3d_grad")
def _(rng):
    return {"x": _n(rng, 1, 2, 3, 4, 5), "out_grad": _n(rng, 1, 2, 5, 6, 7)}, \
        {"paddings": [1, 1, 1, 1, 1, 1], "mode": "reflect", "pad_value": 0.0,
         "data_format": "NCDHW"}


@factory("pad3d_double_grad")
def _(rng):
    return {"grad_x_grad": _n(rng, 1, 2, 3, 4, 5)}, \
        {"paddings": [1, 1, 1, 1, 1, 1], "mode": "reflect", "pad_value": 0.0,
         "data_format": "NCDHW"}


@factory("partial_concat_grad")
def _(rng):
    return {"x": [_n(rng, 3, 5), _n(rng, 3, 5)], "out_grad": _n(rng, 3, 4)}, \
        {"start_index": 1, "length": 2}


@factory("partial_sum_grad")
def _(rng):
    return {"x": [_n(rng, 3, 5), _n(rng, 3, 5)], "out_grad": _n(rng, 3, 2)}, \
        {"start_index": 1, "length": 2}


@factory("pixel_shuffle_grad")
def _(rng):
    return {"out_grad": _n(rng, 2, 3, 4, 6)}, {"upscale_factor": 2, "data_format": "NCHW"}


@factory("pixel_unshuffle_grad")
def _(rng):
    return {"out_grad": _n(rng, 2, 12, 2, 3)}, {"downscale_factor": 2, "data_format": "NCHW"}


@factory("reverse_grad")
def _(rng):
    return {"out_grad": _n(rng, 3, 4, 5)}, {"axis": [1]}


@factory("roll_grad")
def _(rng):
    return {"x": _n(rng, 3, 4, 5), "out_grad": _n(rng, 3, 4, 5)}, {"shifts": [1, -2], "axis": [0, 2]}


@factory("squeeze_grad")
def _(rng):
    return {"xshape": _n(rng, 2, 1, 3), "out_grad": _n(rng, 2, 3)}, {"axis": [1]}


@factory("squeeze_double_grad")
def _(rng):
    return {"grad_x_grad": _n(rng, 2, 1, 3)}, {"axis": [1]}


@factory("stack_grad")
def _(rng):
    return {"x": [_n(rng, 2, 3), _n(rng, 2, 3)], "out_grad": _n(rng, 2, 2, 3)}, {"axis": 1}


@factory("stack_double_grad")
def _(rng):
    return {"grad_x_grad": [_n(rng, 2, 3), _n(rng, 2, 3)]}, {"axis": 1}


@factory("temporal_shift_grad")
def _(rng):
    return {"out_grad": _n(rng, 4, 8, 2, 3)}, {"seg_num": 2, "shift_ratio": 0.25,
                                                "data_format": "NCHW"}


@factory("tensor_unfold_grad")
def _(rng):
    return {"input": _n(rng, 3, 9), "out_grad": _n(rng, 3, 4, 3)}, {"axis": 1, "size": 3, "step": 2}


@factory("unbind_grad")
def _(rng):
    return {"out_grad": [_n(rng, 2, 3), _n(rng, 2, 3)]}, {"axis": 1}


@factory("unfold_grad")
def _(rng):
    return {"x": _n(rng, 2, 3, 4, 4), "out_grad": _n(rng, 2, 12, 9)}, \
        {"kernel_sizes": [2, 2], "strides": [1, 1], "paddings": [0, 0, 0, 0], "dilations": [1, 1]}


@factory("unsqueeze_grad")
def _(rng):
    return {"xshape": _n(rng, 2, 3), "out_grad": _n(rng, 2, 1, 3)}, {"axis": [1]}


@factory("unsqueeze_double_grad")
def _(rng):
    return {"grad_x_grad": _n(rng, 2, 3)}, {"axis": [1]}


@factory("unstack_grad")
def _(rng):
    return {"out_grad": [_n(rng, 2, 3), _n(rng, 2, 3)]}, {"axis": 1}


@factory("view_dtype_grad")
def _(rng):
    return {"input": _n(rng, 2, 3), "out_grad": _n(rng, 2, 3)}, {"dtype": "float64"}


@factory("view_shape_grad")
def _(rng):
    return {"input": _n(rng, 2, 3), "out_grad": _n(rng, 3, 2)}, {"dims": [3, 2]}
