"""Sample calls of the reduction / normalisation / softmax / loss grads (te_defs/norm.py,
softmax.py, loss.py) for the generic tests (CUDA builds, higher-order chains, errors).

Every input is float64 (the generic tests cast floats to each dtype); index inputs are int64.
"""

from __future__ import annotations

import numpy as np

from . import factory


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@factory("log_softmax_grad")
def _log_softmax(rng):
    x = rng.standard_normal((4, 6))
    return {"out": np.log(_softmax(x)), "out_grad": rng.standard_normal((4, 6))}, {"axis": -1}


@factory("gumbel_softmax_grad")
def _gumbel(rng):
    x = rng.standard_normal((3, 5, 4))
    return {"out": _softmax(x, 1), "out_grad": rng.standard_normal((3, 5, 4))}, {"axis": 1}


@factory("cross_entropy_with_softmax_grad")
def _ce(rng):
    x = rng.standard_normal((4, 6))
    label = rng.integers(0, 6, (4, 1)).astype("int64")
    return ({"label": label, "softmax": _softmax(x), "loss_grad": rng.standard_normal((4, 1))},
            {"soft_label": False, "use_softmax": True, "numeric_stable_mode": True,
             "ignore_index": -100, "axis": -1})


@factory("margin_cross_entropy_grad")
def _mce(rng):
    logits = rng.uniform(-0.9, 0.9, (4, 6))
    label = rng.integers(0, 6, (4,)).astype("int64")
    return ({"logits": logits, "label": label, "softmax": _softmax(logits * 4),
             "loss_grad": rng.standard_normal((4, 1))},
            {"return_softmax": False, "ring_id": 0, "rank": 0, "nranks": 1, "margin1": 1.0,
             "margin2": 0.5, "margin3": 0.0, "scale": 4.0})



@factory("layer_norm_grad")
def _layer_norm(rng):
    x = rng.standard_normal((4, 3, 5))
    x2 = x.reshape(4, 15)
    return ({"x": x, "scale": rng.standard_normal(15), "bias": rng.standard_normal(15),
             "mean": x2.mean(1), "variance": x2.var(1), "out_grad": rng.standard_normal(x.shape)},
            {"epsilon": 1e-5, "begin_norm_axis": 1})


def _group_stats(x, groups, channel_last=False):
    n = x.shape[0]
    xs = np.moveaxis(x, -1, 1) if channel_last else x
    g = xs.reshape(n, groups, -1)
    return g.mean(2), g.var(2)


@factory("group_norm_grad")
def _group_norm(rng):
    x = rng.standard_normal((2, 4, 3, 2))
    mean, var = _group_stats(x, 2)
    return ({"x": x, "scale": rng.standard_normal(4), "bias": rng.standard_normal(4),
             "y": rng.standard_normal(x.shape), "mean": mean, "variance": var,
             "y_grad": rng.standard_normal(x.shape)},
            {"epsilon": 1e-5, "groups": 2, "data_format": "NCHW"})


@factory("rms_norm_grad")
def _rms_norm(rng):
    x = rng.standard_normal((4, 6))
    inv = 1 / np.sqrt((x ** 2).mean(1) + 1e-5)
    return ({"x": x, "norm_weight": rng.standard_normal(6), "inv_var": inv,
             "out_grad": rng.standard_normal(x.shape)},
            {"epsilon": 1e-5, "begin_norm_axis": 1, "quant_scale": -1.0})


def _instance(rng, shape=(2, 3, 4, 2)):
    x = rng.standard_normal(shape)
    flat = x.reshape(shape[0] * shape[1], -1)
    return x, flat.mean(1), 1 / np.sqrt(flat.var(1) + 1e-5)


@factory("instance_norm_grad")
def _instance_norm(rng):
    x, mean, inv = _instance(rng)
    return ({"x": x, "scale": rng.standard_normal(3), "saved_mean": mean, "saved_variance": inv,
             "y_grad": rng.standard_normal(x.shape)}, {"epsilon": 1e-5})


@factory("instance_norm_double_grad")
def _instance_norm_double(rng):
    x, mean, inv = _instance(rng)
    return ({"x": x, "fwd_scale": rng.standard_normal(3), "saved_mean": mean,
             "saved_variance": inv, "grad_y": rng.standard_normal(x.shape),
             "grad_x_grad": rng.standard_normal(x.shape), "grad_scale_grad": rng.standard_normal(3),
             "grad_bias_grad": rng.standard_normal(3)}, {"epsilon": 1e-5})


@factory("bce_loss_grad")
def _bce(rng):
    return ({"input": rng.uniform(0.1, 0.9, (4, 6)), "label": rng.uniform(0, 1, (4, 6)),
             "out_grad": rng.standard_normal((4, 6))}, {})


@factory("log_loss_grad")
def _log_loss(rng):
    return ({"input": rng.uniform(0.1, 0.9, (4, 1)), "label": rng.uniform(0, 1, (4, 1)),
             "out_grad": rng.standard_normal((4, 1))}, {"epsilon": 1e-4})


@factory("kldiv_loss_grad")
def _kldiv(rng):
    return ({"x": rng.standard_normal((4, 6)), "label": rng.uniform(0.1, 1, (4, 6)),
             "out_grad": np.array(1.5)}, {"reduction": "mean", "log_target": False})


@factory("l1_norm_grad")
def _l1(rng):
    return {"x": rng.standard_normal((4, 6)), "out_grad": np.array(1.5)}, {}


@factory("squared_l2_norm_grad")
def _sql2(rng):
    return {"x": rng.standard_normal((4, 6)), "out_grad": np.array([1.5])}, {}


@factory("mean_all_grad")
def _mean_all(rng):
    return {"x": rng.standard_normal((4, 6)), "out_grad": np.array(1.5)}, {}


@factory("identity_loss_grad")
def _identity(rng):
    return {"x": rng.standard_normal((4, 6)), "out_grad": np.array(1.5)}, {"reduction": 1}


@factory("reduce_as_grad")
def _reduce_as(rng):
    return ({"x": rng.standard_normal((4, 6)), "target": rng.standard_normal((1, 6)),
             "out_grad": rng.standard_normal((1, 6))}, {})


@factory("dist_grad")
def _dist(rng):
    x, y = rng.standard_normal((4, 6)), rng.standard_normal((6,))
    out = np.array(np.linalg.norm((x - y).ravel(), 3.0))
    return {"x": x, "y": y, "out": out, "out_grad": np.array(1.5)}, {"p": 3.0}


@factory("p_norm_grad")
def _p_norm(rng):
    x = rng.standard_normal((4, 6))
    out = np.linalg.norm(x, 2.0, axis=1)
    return ({"x": x, "out": out, "out_grad": rng.standard_normal(4)},
            {"porder": 2.0, "axis": 1, "epsilon": 1e-12, "keepdim": False, "asvector": False})


@factory("renorm_grad")
def _renorm(rng):
    return ({"x": rng.standard_normal((3, 4, 5)), "out_grad": rng.standard_normal((3, 4, 5))},
            {"p": 2.0, "axis": 1, "max_norm": 2.0})


@factory("spectral_norm_grad")
def _spectral(rng):
    return ({"weight": rng.standard_normal((4, 3, 2)), "u": rng.standard_normal(4),
             "v": rng.standard_normal(6), "out_grad": rng.standard_normal((4, 3, 2))},
            {"dim": 0, "power_iters": 2, "eps": 1e-12})


@factory("sigmoid_cross_entropy_with_logits_grad")
def _sce(rng):
    return ({"x": rng.standard_normal((4, 6)), "label": rng.uniform(0, 1, (4, 6)),
             "pos_weight": rng.uniform(0.5, 2, (4, 6)), "out_grad": rng.standard_normal((4, 6))},
            {"normalize": True, "ignore_index": -100})


@factory("nll_loss_grad")
def _nll(rng):
    label = rng.integers(0, 5, (4,)).astype("int64")
    return ({"input": rng.standard_normal((4, 5)), "label": label, "weight": rng.uniform(0.5, 2, 5),
             "total_weight": np.array(3.0), "out_grad": np.array(1.5)},
            {"ignore_index": -100, "reduction": "mean"})


@factory("segment_pool_grad")
def _segment(rng):
    ids = np.array([0, 0, 1, 3, 3, 3], dtype="int64")
    x = rng.standard_normal((6, 5))
    out = np.stack([x[ids == s].mean(0) if (ids == s).any() else np.zeros(5) for s in range(4)])
    counts = np.array([[max((ids == s).sum(), 1)] for s in range(4)], dtype="float64")
    return ({"x": x, "segment_ids": ids, "out": out, "summed_ids": counts,
             "out_grad": rng.standard_normal((4, 5))}, {"pooltype": "MEAN"})


@factory("maxout_grad")
def _maxout(rng):
    x = rng.standard_normal((2, 6, 3, 2))
    out = x.reshape(2, 3, 2, 3, 2).max(2)
    return ({"x": x, "out": out, "out_grad": rng.standard_normal(out.shape)},
            {"groups": 2, "axis": 1})
