"""PyTorch references and realistic inputs for the shape / linear grads (issue 4 bench targets:
concat_grad and pad3d_grad).

* concat_grad: out_grad of about N elements, ``(N/256, 256)`` split along axis 1 into pieces of
  64, 128 and 64 columns. PyTorch's autograd of ``torch.cat`` returns *views* of the cotangent
  (``narrow``, no copy); the reference materialises them (``.contiguous()``) as our kernel does.
  (``inputs["x"]`` is a list: the bench must pass Tensor[] inputs as lists.)
* pad3d_grad: NCDHW ``x`` of 8 channels and 16³ voxels per channel (batch chosen so out_grad has
  about N elements), every pad 1, reflect mode (the interesting case; ``mode`` may be changed);
  PyTorch: autograd through ``torch.nn.functional.pad`` (its reflection/replication/circular pad
  backward kernels; slicing for constant).
"""

from __future__ import annotations

import numpy as np

from ..examples import np_dtype


def _normal(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(np_dtype(dtype))


# -- inputs -----------------------------------------------------------------------------------

CONCAT_PIECES = (64, 128, 64)
PAD_CHANNELS, PAD_SIDE, PAD = 8, 16, 1


def _concat_inputs(size, dtype):
    rng = np.random.default_rng(0)
    rows = max(size // sum(CONCAT_PIECES), 1)
    x = [np.zeros((rows, n), np_dtype(dtype)) for n in CONCAT_PIECES]
    return {"x": x, "out_grad": _normal(rng, (rows, sum(CONCAT_PIECES)), dtype)}, {"axis": 1}


def _pad3d_inputs(size, dtype):
    rng = np.random.default_rng(0)
    side = PAD_SIDE + 2 * PAD
    batch = max(size // (PAD_CHANNELS * side ** 3), 1)
    x = np.zeros((batch, PAD_CHANNELS, PAD_SIDE, PAD_SIDE, PAD_SIDE), np_dtype(dtype))
    g = _normal(rng, (batch, PAD_CHANNELS, side, side, side), dtype)
    return {"x": x, "out_grad": g}, {"paddings": [PAD] * 6, "mode": "reflect", "pad_value": 0.0,
                                     "data_format": "NCDHW"}


INPUTS = {"concat_grad": _concat_inputs, "pad3d_grad": _pad3d_inputs}


# -- PyTorch ----------------------------------------------------------------------------------

def _concat_torch(t, a):
    import torch
    g, axis = t["out_grad"], int(a.get("axis", 0))
    sizes = [x.shape[axis] for x in t["x"]]
    return lambda: [p.contiguous() for p in torch.split(g, sizes, dim=axis)]


def _pad3d_torch(t, a):
    import torch
    import torch.nn.functional as F
    x, g = t["x"], t["out_grad"]
    channels_last = a.get("data_format", "NCDHW") == "NDHWC"
    if channels_last:
        x, g = x.permute(0, 4, 1, 2, 3), g.permute(0, 4, 1, 2, 3)
    x = x.detach().clone().requires_grad_()
    mode = a.get("mode", "constant")
    out = F.pad(x, list(a["paddings"]), mode=mode, **({"value": float(a.get("pad_value", 0.0))}
                                                        if mode == "constant" else {}))
    return lambda: torch.autograd.grad(out, [x], g, retain_graph=True)


TORCH = {"concat_grad": _concat_torch, "pad3d_grad": _pad3d_torch}


# -- Paddle -----------------------------------------------------------------------------------

def _concat_paddle(t, a):
    """_C_ops.concat_grad is unusable in Paddle 3.3.1 (it raises); time autograd on concat."""
    import paddle
    xs = [x.detach() for x in t["x"]]
    for x in xs:
        x.stop_gradient = False
    g = t["out_grad"]
    axis = int(a.get("axis", 0))

    def run():
        out = paddle.concat(xs, axis=axis)
        return paddle.grad([out], xs, [g])
    return run


PADDLE = {"concat_grad": _concat_paddle}
