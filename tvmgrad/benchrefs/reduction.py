"""PyTorch references and realistic inputs for the reduction / norm / softmax / loss grads.

Bench targets of issue 3: layer_norm_grad and log_softmax_grad on 4096×4096 float32,
cross_entropy_with_softmax_grad on 8192×32000 (``tvmgrad bench OP --size N`` with N the element
count: the row length is fixed per op below, the number of rows is N / row).
"""

from __future__ import annotations

import numpy as np

from ..examples import np_dtype
from . import aten


def _rows(size, cols):
    return max(size // cols, 1), cols


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- inputs -----------------------------------------------------------------------------------

def _layer_norm_inputs(size, dtype):
    rows, cols = _rows(size, 4096)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    return ({"x": x.astype(np_dtype(dtype)), "scale": rng.standard_normal(cols, dtype=np.float32).astype(np_dtype(dtype)),
             "bias": np.zeros(cols, np_dtype(dtype)), "mean": x.mean(1).astype(np_dtype(dtype)),
             "variance": x.var(1).astype(np_dtype(dtype)),
             "out_grad": rng.standard_normal((rows, cols), dtype=np.float32).astype(np_dtype(dtype))},
            {"epsilon": 1e-5, "begin_norm_axis": 1})


def _log_softmax_inputs(size, dtype):
    rows, cols = _rows(size, 4096)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    out = np.log(_softmax(x))
    return ({"out": out.astype(np_dtype(dtype)),
             "out_grad": rng.standard_normal((rows, cols), dtype=np.float32).astype(np_dtype(dtype))},
            {"axis": -1})


def _ce_inputs(size, dtype):
    rows, cols = _rows(size, 32000)
    rng = np.random.default_rng(0)
    p = _softmax(rng.standard_normal((rows, cols), dtype=np.float32))
    return ({"label": rng.integers(0, cols, (rows, 1)).astype("int64"), "softmax": p.astype(np_dtype(dtype)),
             "loss_grad": rng.standard_normal((rows, 1), dtype=np.float32).astype(np_dtype(dtype))},
            {"soft_label": False, "use_softmax": True, "numeric_stable_mode": True,
             "ignore_index": -100, "axis": -1})


def _gumbel_inputs(size, dtype):
    inputs, attrs = _log_softmax_inputs(size, dtype)
    return {"out": np.exp(inputs["out"].astype(np.float32)).astype(np_dtype(dtype)),
            "out_grad": inputs["out_grad"]}, attrs


def _rms_inputs(size, dtype):
    rows, cols = _rows(size, 4096)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    return ({"x": x.astype(np_dtype(dtype)), "norm_weight": rng.standard_normal(cols, dtype=np.float32).astype(np_dtype(dtype)),
             "inv_var": (1 / np.sqrt((x * x).mean(1) + 1e-6)).astype(np_dtype(dtype)),
             "out_grad": rng.standard_normal((rows, cols), dtype=np.float32).astype(np_dtype(dtype))},
            {"epsilon": 1e-6, "begin_norm_axis": 1, "quant_scale": -1.0})


def _group_norm_inputs(size, dtype):
    n, c = max(size // (64 * 1024), 1), 64
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, 32, 32), dtype=np.float32)
    g = x.reshape(n, 8, -1)
    return ({"x": x.astype(np_dtype(dtype)), "scale": np.ones(c, np_dtype(dtype)), "bias": np.zeros(c, np_dtype(dtype)),
             "y": x.astype(np_dtype(dtype)), "mean": g.mean(2).astype(np_dtype(dtype)),
             "variance": g.var(2).astype(np_dtype(dtype)),
             "y_grad": rng.standard_normal(x.shape, dtype=np.float32).astype(np_dtype(dtype))},
            {"epsilon": 1e-5, "groups": 8, "data_format": "NCHW"})


def _cast(arrays, dtype):
    return {k: (v.astype(np.float32).astype(np_dtype(dtype)) if v.dtype.kind == "f" else v)
            for k, v in arrays.items()}


def _scalar_grad(name):
    def make(size, dtype):
        rng = np.random.default_rng(0)
        return _cast({"x": rng.standard_normal(size), "out_grad": np.asarray(1.5)}, dtype), {}
    return make


def _identity_inputs(size, dtype):
    inputs, _ = _scalar_grad("identity_loss_grad")(size, dtype)
    return inputs, {"reduction": 1}


def _kldiv_inputs(size, dtype):
    rows, cols = _rows(size, 1024)
    rng = np.random.default_rng(0)
    return (_cast({"x": rng.standard_normal((rows, cols)), "label": rng.uniform(0.1, 1, (rows, cols)),
                   "out_grad": np.asarray(1.0)}, dtype), {"reduction": "batchmean", "log_target": False})


def _p_norm_inputs(size, dtype):
    rows, cols = _rows(size, 1024)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols))
    return (_cast({"x": x, "out": np.linalg.norm(x, axis=1), "out_grad": rng.standard_normal(rows)}, dtype),
            {"porder": 2.0, "axis": 1})


def _renorm_inputs(size, dtype):
    rows, cols = _rows(size, 1024)
    rng = np.random.default_rng(0)
    return (_cast({"x": rng.standard_normal((rows, cols)), "out_grad": rng.standard_normal((rows, cols))}, dtype),
            {"p": 2.0, "axis": 0, "max_norm": 1.0})


def _instance_inputs(size, dtype, double=False):
    n, c = 2, 8
    m = max(size // (n * c), 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, m))
    flat = x.reshape(n * c, m)
    inputs = {"x": x, "saved_mean": flat.mean(1), "saved_variance": 1 / np.sqrt(flat.var(1) + 1e-5)}
    if double:
        inputs.update(fwd_scale=rng.standard_normal(c), grad_y=rng.standard_normal(x.shape),
                      grad_x_grad=rng.standard_normal(x.shape), grad_scale_grad=rng.standard_normal(c),
                      grad_bias_grad=rng.standard_normal(c))
    else:
        inputs.update(scale=rng.standard_normal(c), y_grad=rng.standard_normal(x.shape))
    return _cast(inputs, dtype), {"epsilon": 1e-5}


def _margin_inputs(size, dtype):
    rows, cols = _rows(size, 1024)
    rng = np.random.default_rng(0)
    logits = rng.uniform(-0.9, 0.9, (rows, cols))
    return (_cast({"logits": logits, "label": rng.integers(0, cols, rows).astype("int64"),
                   "softmax": _softmax(logits * 8), "loss_grad": rng.standard_normal((rows, 1))}, dtype),
            {"return_softmax": False, "ring_id": 0, "rank": 0, "nranks": 1, "margin1": 1.0,
             "margin2": 0.5, "margin3": 0.0, "scale": 8.0})


def _maxout_inputs(size, dtype):
    hw = max(size // (2 * 16), 1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, hw, 1))
    out = x.reshape(2, 8, 2, hw, 1).max(2)
    return (_cast({"x": x, "out": out, "out_grad": rng.standard_normal(out.shape)}, dtype),
            {"groups": 2, "axis": 1})


def _nll_inputs(size, dtype):
    rows, cols = _rows(size, 1000)
    rng = np.random.default_rng(0)
    return (_cast({"input": rng.standard_normal((rows, cols)),
                   "label": rng.integers(0, cols, rows).astype("int64"),
                   "weight": rng.uniform(0.5, 2, cols), "total_weight": np.asarray(float(rows)),
                   "out_grad": np.asarray(1.0)}, dtype),
            {"ignore_index": -100, "reduction": "mean"})


def _segment_inputs(size, dtype):
    rows, cols = _rows(size, 64)
    rng = np.random.default_rng(0)
    ids = np.sort(rng.integers(0, max(rows // 4, 1), rows)).astype("int64")
    s = int(ids.max()) + 1
    counts = np.bincount(ids, minlength=s).reshape(s, 1).astype(np.float64)
    return (_cast({"x": rng.standard_normal((rows, cols)), "segment_ids": ids,
                   "out": rng.standard_normal((s, cols)), "summed_ids": counts,
                   "out_grad": rng.standard_normal((s, cols))}, dtype),
            {"pooltype": "MEAN"})


def _spectral_inputs(size, dtype):
    h, w = 64, max(size // 64, 1)
    rng = np.random.default_rng(0)
    return (_cast({"weight": rng.standard_normal((h, w)), "u": rng.standard_normal(h),
                   "v": rng.standard_normal(w), "out_grad": rng.standard_normal((h, w))}, dtype),
            {"dim": 0, "power_iters": 1, "eps": 1e-12})


INPUTS = {
    "l1_norm_grad": _scalar_grad("l1_norm_grad"),
    "squared_l2_norm_grad": _scalar_grad("squared_l2_norm_grad"),
    "mean_all_grad": _scalar_grad("mean_all_grad"),
    "identity_loss_grad": _identity_inputs,
    "kldiv_loss_grad": _kldiv_inputs,
    "p_norm_grad": _p_norm_inputs,
    "renorm_grad": _renorm_inputs,
    "instance_norm_grad": _instance_inputs,
    "instance_norm_double_grad": lambda size, dtype: _instance_inputs(size, dtype, double=True),
    "margin_cross_entropy_grad": _margin_inputs,
    "maxout_grad": _maxout_inputs,
    "nll_loss_grad": _nll_inputs,
    "segment_pool_grad": _segment_inputs,
    "spectral_norm_grad": _spectral_inputs,
    "layer_norm_grad": _layer_norm_inputs,
    "log_softmax_grad": _log_softmax_inputs,
    "gumbel_softmax_grad": _gumbel_inputs,
    "cross_entropy_with_softmax_grad": _ce_inputs,
    "rms_norm_grad": _rms_inputs,
    "group_norm_grad": _group_norm_inputs,
}


# -- PyTorch ----------------------------------------------------------------------------------

def _torch_layer_norm(t, a):
    import torch
    x, g = t["x"], t["out_grad"]
    cols = x.shape[-1]
    mean = t["mean"].reshape(-1, 1)
    rstd = torch.rsqrt(t["variance"].reshape(-1, 1) + a["epsilon"])
    return lambda: aten().native_layer_norm_backward(g, x, [cols], mean, rstd, t["scale"], t["bias"],
                                                      [True, True, True])


def _torch_log_softmax(t, a):
    return lambda: aten()._log_softmax_backward_data(t["out_grad"], t["out"], a["axis"], t["out"].dtype)


def _torch_gumbel(t, a):
    return lambda: aten()._softmax_backward_data(t["out_grad"], t["out"], a["axis"], t["out"].dtype)


def _torch_ce(t, a):
    """cross_entropy(logits, labels, reduction='none') backward given the softmax: the grad of
    nll_loss on log-probabilities, through log_softmax."""
    import torch
    logp = torch.log(t["softmax"])
    target = t["label"].reshape(-1)
    g = t["loss_grad"].reshape(-1)
    total = torch.tensor(0.0, dtype=logp.dtype)

    def run():
        gl = aten().nll_loss_backward(g, logp, target, None, 0, -100, total)
        return aten()._log_softmax_backward_data(gl, logp, 1, logp.dtype)
    return run


def _torch_rms(t, a):
    import torch
    x = t["x"].clone().requires_grad_()
    w = t["norm_weight"].clone().requires_grad_()
    out = torch.nn.functional.rms_norm(x, [x.shape[-1]], w, a["epsilon"])
    return lambda: torch.autograd.grad(out, [x, w], t["out_grad"], retain_graph=True)


def _torch_group_norm(t, a):
    x, g = t["x"], t["y_grad"]
    n, c = x.shape[:2]
    hw = x[0, 0].numel()
    mean = t["mean"]
    import torch
    rstd = torch.rsqrt(t["variance"] + a["epsilon"])
    return lambda: aten().native_group_norm_backward(g, x, mean, rstd, t["scale"], n, c, hw,
                                                      a["groups"], [True, True, True])


TORCH = {
    "layer_norm_grad": _torch_layer_norm,
    "log_softmax_grad": _torch_log_softmax,
    "gumbel_softmax_grad": _torch_gumbel,
    "cross_entropy_with_softmax_grad": _torch_ce,
    "rms_norm_grad": _torch_rms,
    "group_norm_grad": _torch_group_norm,
}


# -- Paddle (where _C_ops.<op> with the YAML args is not the right call) ----------------------

def _paddle_instance_norm(t, a):
    import paddle
    c = t["x"].shape[1]
    bias = paddle.zeros([c], dtype=t["x"].dtype)
    return lambda: paddle._C_ops.instance_norm_grad(t["x"], t["scale"], bias, t["saved_mean"],
                                                    t["saved_variance"], t["y_grad"], a["epsilon"])


PADDLE = {
    # 3.3.1's rms_norm_grad binding is another (non-fused) op, and it has no CPU kernel;
    # margin_cross_entropy_grad has no CPU kernel; instance_norm_double_grad has no binding
    "rms_norm_grad": lambda t, a: None,
    "margin_cross_entropy_grad": lambda t, a: None,
    "instance_norm_double_grad": lambda t, a: None,
    # the binding takes an extra bias (x, scale, bias, saved_mean, saved_variance, y_grad, eps)
    "instance_norm_grad": _paddle_instance_norm,
}
