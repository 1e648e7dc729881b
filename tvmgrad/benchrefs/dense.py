"""PyTorch (and Paddle) references for the dense grads: convolutions, the matmul family and
pooling by indices, with realistic benchmark inputs (``INPUTS``: the issue's conv2d_grad
8 x 64 x 56 x 56 with a 3 x 3, 64 -> 64 filter, and bmm_grad 8 x 512 x 512)."""

from __future__ import annotations

import numpy as np

from . import aten, uniform


def _conv_backward(t, a, transposed=False):
    """aten.convolution_backward for a Paddle conv grad call (NCHW/NCDHW, explicit paddings)."""
    S = t["filter"].dim() - 2
    pads = list(a["paddings"])
    if len(pads) == 2 * S:
        if pads[0::2] != pads[1::2]:
            raise ValueError("torch has no asymmetric paddings")
        pads = pads[0::2]
    x, w, g = t["input"], t["filter"], t["out_grad"]
    return lambda: aten().convolution_backward(
        g, x, w, None, list(a["strides"]), pads, list(a["dilations"]), transposed,
        [0] * S, a["groups"], [True, True, False])


def _autograd(forward, names, grad="out_grad"):
    """torch.autograd.grad of ``forward(*leaves)`` with the op's cotangent."""
    def make(t, a):
        import torch
        leaves = [t[n].detach().requires_grad_() for n in names]
        out = forward(*leaves, a)
        return lambda: torch.autograd.grad(out, leaves, t[grad], retain_graph=True)
    return make


def _bmm(t, a):
    import torch
    x, y, g = t["x"], t["y"], t["out_grad"]
    return lambda: (torch.bmm(g, y.transpose(1, 2)), torch.bmm(x.transpose(1, 2), g))


def _addmm(t, a):
    x, y, g = t["x"], t["y"], t["out_grad"]
    alpha, beta = a["alpha"], a["beta"]
    return lambda: (beta * g.sum(0), alpha * (g @ y.T), alpha * (x.T @ g))


def _max_pool2d_index(t, a):
    import torch
    x, g, mask = t["x"], t["out_grad"], t["mask"].to(torch.int64)
    return lambda: aten().max_pool2d_with_indices_backward(
        g, x, list(a["kernel_size"]), list(a["strides"]), list(a["paddings"]), [1, 1], False, mask)


TORCH = {
    "conv2d_grad": _conv_backward,
    "conv3d_grad": _conv_backward,
    "depthwise_conv2d_grad": _conv_backward,
    "bmm_grad": _bmm,
    "addmm_grad": _addmm,
    "mv_grad": _autograd(lambda x, v, a: x @ v, ["x", "vec"]),
    "dot_grad": _autograd(lambda x, y, a: (x * y).sum(-1), ["x", "y"]),
    "kron_grad": _autograd(lambda x, y, a: __import__("torch").kron(x, y), ["x", "y"]),
    "multi_dot_grad": None,         # Tensor[] input: not in the generic bench
    "bilinear_grad": _autograd(
        lambda x, y, w, a: __import__("torch").nn.functional.bilinear(x, y, w), ["x", "y", "weight"]),
    "max_pool2d_with_index_grad": _max_pool2d_index,
}
TORCH = {k: v for k, v in TORCH.items() if v is not None}


def _paddle_max_pool2d_index(t, a):
    import paddle
    C = paddle._C_ops
    mask = t["mask"].astype("int32")
    return lambda: C.max_pool2d_with_index_grad(t["x"], mask, t["out_grad"], a["kernel_size"],
                                                a["strides"], a["paddings"], a["global_pooling"],
                                                a["adaptive"], False)


PADDLE = {"max_pool2d_with_index_grad": _paddle_max_pool2d_index}


# ------------------------------------------------------------------------------------------
# inputs


def _conv2d_inputs(size, dtype):
    x, w = (8, 64, 56, 56), (64, 64, 3, 3)
    return ({"input": uniform(x, dtype), "filter": uniform(w, dtype, 1),
             "out_grad": uniform(x, dtype, 2)},
            {"strides": [1, 1], "paddings": [1, 1], "padding_algorithm": "EXPLICIT",
             "dilations": [1, 1], "groups": 1, "data_format": "NCHW"})


def _depthwise_inputs(size, dtype):
    x, w = (8, 128, 56, 56), (128, 1, 3, 3)
    return ({"input": uniform(x, dtype), "filter": uniform(w, dtype, 1),
             "out_grad": uniform(x, dtype, 2)},
            {"strides": [1, 1], "paddings": [1, 1], "padding_algorithm": "EXPLICIT",
             "dilations": [1, 1], "groups": 128, "data_format": "NCHW"})


def _conv3d_inputs(size, dtype):
    """A video model's 3 x 3 x 3 convolution: 2 clips of 16 frames, 64 -> 64 channels at 56 x 56."""
    x, w = (2, 64, 16, 56, 56), (64, 64, 3, 3, 3)
    return ({"input": uniform(x, dtype), "filter": uniform(w, dtype, 1),
             "out_grad": uniform(x, dtype, 2)},
            {"strides": [1, 1, 1], "paddings": [1, 1, 1], "padding_algorithm": "EXPLICIT",
             "dilations": [1, 1, 1], "groups": 1, "data_format": "NCDHW"})


def _bmm_inputs(size, dtype):
    s = (8, 512, 512)
    return {"x": uniform(s, dtype), "y": uniform(s, dtype, 1), "out_grad": uniform(s, dtype, 2)}, {}


def _addmm_inputs(size, dtype):
    return ({"input": uniform((1024,), dtype), "x": uniform((1024, 1024), dtype, 1),
             "y": uniform((1024, 1024), dtype, 2), "out_grad": uniform((1024, 1024), dtype, 3)},
            {"alpha": 1.0, "beta": 1.0})


def _max_pool_inputs(size, dtype):
    x = uniform((8, 64, 112, 112), dtype)
    rng = np.random.default_rng(4)
    # the argmax of each 3x3 / stride-2 / pad-1 window (a random position inside it)
    oh = np.arange(56)
    h = np.clip(oh[:, None] * 2 - 1 + rng.integers(0, 3, size=(56, 56)), 0, 111)
    w = np.clip(oh[None, :] * 2 - 1 + rng.integers(0, 3, size=(56, 56)), 0, 111)
    mask = np.broadcast_to((h * 112 + w).astype(np.int32), (8, 64, 56, 56)).copy()
    return ({"x": x, "mask": mask, "out_grad": uniform((8, 64, 56, 56), dtype, 1)},
            {"kernel_size": [3, 3], "strides": [2, 2], "paddings": [1, 1]})


INPUTS = {
    "conv2d_grad": _conv2d_inputs,
    "depthwise_conv2d_grad": _depthwise_inputs,
    "conv3d_grad": _conv3d_inputs,
    "bmm_grad": _bmm_inputs,
    "addmm_grad": _addmm_inputs,
    "max_pool2d_with_index_grad": _max_pool_inputs,
}


def _conv_flops(inputs, attrs):
    """input and filter grads: 2 x the forward's 2·N·Cout·(output positions)·(Cin/groups)·(kernel
    positions), channels first."""
    n, _, *out = inputs["out_grad"].shape
    cout, cin_g, *kernel = inputs["filter"].shape
    return 2 * 2.0 * n * cout * np.prod(out) * cin_g * np.prod(kernel)


def _bmm_flops(inputs, attrs):
    """x and y grads: two batched matmuls of the forward's size (2·B·M·N·K each)."""
    b, m, k = inputs["x"].shape
    n = inputs["y"].shape[-1]
    return 2 * 2.0 * b * m * n * k


FLOPS = {"conv2d_grad": _conv_flops, "depthwise_conv2d_grad": _conv_flops, "conv3d_grad": _conv_flops,
         "bmm_grad": _bmm_flops}
