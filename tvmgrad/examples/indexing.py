"""Sample calls of the indexing, scan and sort/select grads (te_defs/indexing.py, scan.py,
sort.py) for the generic tests: valid float64 inputs, int64 indices with repeats."""

import numpy as np

from . import factory


def _g(rng, *shape):
    return rng.standard_normal(shape)


@factory("gather_grad")
def _gather(rng):
    return {"x": _g(rng, 4, 6), "index": np.array([1, 3, 1, -1]), "out_grad": _g(rng, 4, 4)}, \
        {"axis": 1}


@factory("index_select_grad")
def _index_select(rng):
    return {"x": _g(rng, 5, 3), "index": np.array([0, 4, 0]), "out_grad": _g(rng, 3, 3)}, \
        {"axis": 0}


@factory("gather_nd_grad")
def _gather_nd(rng):
    return {"x": _g(rng, 4, 3, 2), "index": np.array([[1, 2], [3, 0], [1, 2]]),
            "out_grad": _g(rng, 3, 2)}, {}


@factory("index_add_grad")
def _index_add(rng):
    return {"index": np.array([0, 2, 0]), "add_value": _g(rng, 4, 3), "out_grad": _g(rng, 4, 5)}, \
        {"axis": 1}


@factory("index_put_grad")
def _index_put(rng):
    return {"x": _g(rng, 4, 3), "indices": [np.array([1, 3, 1]), np.array([0, 2, 0])],
            "value": _g(rng, 3), "out_grad": _g(rng, 4, 3)}, {"accumulate": False}


@factory("index_sample_grad")
def _index_sample(rng):
    return {"x": _g(rng, 3, 5), "index": np.array([[0, 0, 4], [1, 2, 1], [3, 3, 3]]),
            "out_grad": _g(rng, 3, 3)}, {}


@factory("index_select_strided_grad")
def _strided(rng):
    return {"x": _g(rng, 3, 4, 2), "out_grad": _g(rng, 3, 2)}, {"index": 2, "axis": 1}


@factory("masked_select_grad")
def _masked(rng):
    mask = np.array([[True, False, True], [False, True, True]])
    return {"x": _g(rng, 2, 3), "mask": mask, "out_grad": _g(rng, 4)}, {}


@factory("multiplex_grad")
def _multiplex(rng):
    return {"inputs": [_g(rng, 3, 2) for _ in range(3)], "index": np.array([[2], [0], [2]]),
            "out_grad": _g(rng, 3, 2)}, {}


@factory("put_along_axis_grad")
def _put_along(rng):
    arr = _g(rng, 3, 4)
    idx = np.array([[0, 0], [3, 1], [2, 2]])
    values = _g(rng, 3, 2)
    out = arr.copy()
    for i in range(3):
        for j in range(2):
            out[i, idx[i, j]] += values[i, j]
    return {"arr": arr, "indices": idx, "values": values, "out": out, "out_grad": _g(rng, 3, 4)}, \
        {"axis": 1, "reduce": "add", "include_self": True}


@factory("scatter_grad")
def _scatter(rng):
    return {"index": np.array([1, 3, 1]), "updates": _g(rng, 3, 2), "out_grad": _g(rng, 4, 2)}, \
        {"overwrite": True}


@factory("scatter_nd_add_grad")
def _scatter_nd(rng):
    return {"index": np.array([[1, 0], [3, 1], [1, 0]]), "updates": _g(rng, 3),
            "out_grad": _g(rng, 4, 2)}, {}


def _graph(rng):
    return np.array([0, 1, 2, 0, 3]), np.array([1, 2, 1, 0, 1])


@factory("send_u_recv_grad")
def _send_u_recv(rng):
    src, dst = _graph(rng)
    x = _g(rng, 4, 3)
    out = np.zeros((3, 3))
    np.add.at(out, dst, x[src])
    return {"x": x, "src_index": src, "dst_index": dst, "out": out,
            "dst_count": np.bincount(dst, minlength=3).astype("int32"),
            "out_grad": _g(rng, 3, 3)}, {"reduce_op": "MEAN"}


@factory("send_ue_recv_grad")
def _send_ue_recv(rng):
    src, dst = _graph(rng)
    x, y = _g(rng, 4, 3), _g(rng, 5, 1)
    out = np.zeros((3, 3))
    np.add.at(out, dst, x[src] * y)
    return {"x": x, "y": y, "src_index": src, "dst_index": dst, "out": out,
            "dst_count": np.bincount(dst, minlength=3).astype("int32"),
            "out_grad": _g(rng, 3, 3)}, {"message_op": "MUL", "reduce_op": "SUM"}


@factory("send_uv_grad")
def _send_uv(rng):
    src, dst = _graph(rng)
    return {"x": _g(rng, 4, 3), "y": _g(rng, 3, 3), "src_index": src, "dst_index": dst,
            "out_grad": _g(rng, 5, 3)}, {"message_op": "MUL"}


@factory("take_along_axis_grad")
def _take_along(rng):
    return {"arr": _g(rng, 3, 4), "indices": np.array([[0, 0], [3, 1], [2, -2]]),
            "out_grad": _g(rng, 3, 2)}, {"axis": 1}


@factory("where_grad")
def _where(rng):
    return {"condition": rng.random((4, 6)) > 0.5, "x": _g(rng, 4, 6), "y": _g(rng, 4, 6),
            "out_grad": _g(rng, 4, 6)}, {}


def _cum_indices(x, better):
    idx = np.zeros(x.shape, dtype="int64")
    for r in range(x.shape[0]):
        best = 0
        for j in range(x.shape[1]):
            if better(x[r, j], x[r, best]):
                best = j
            idx[r, j] = best
    return idx


@factory("cummax_grad")
def _cummax(rng):
    x = _g(rng, 4, 6)
    return {"x": x, "indices": _cum_indices(x, lambda a, b: a >= b), "out_grad": _g(rng, 4, 6)}, \
        {"axis": -1, "dtype": "int64"}


@factory("cummin_grad")
def _cummin(rng):
    x = _g(rng, 4, 6)
    return {"x": x, "indices": _cum_indices(x, lambda a, b: a <= b), "out_grad": _g(rng, 4, 6)}, \
        {"axis": -1, "dtype": "int64"}


@factory("cumprod_grad")
def _cumprod(rng):
    x = _g(rng, 4, 6)
    return {"x": x, "out": np.cumprod(x, axis=1), "out_grad": _g(rng, 4, 6)}, {"dim": 1}


@factory("cumsum_grad")
def _cumsum(rng):
    return {"x": _g(rng, 4, 6), "out_grad": _g(rng, 4, 6)}, \
        {"axis": 1, "flatten": False, "exclusive": False, "reverse": False}


@factory("logcumsumexp_grad")
def _logcumsumexp(rng):
    x = _g(rng, 4, 6)
    return {"x": x, "out": np.logaddexp.accumulate(x, axis=1), "out_grad": _g(rng, 4, 6)}, \
        {"axis": 1, "flatten": False, "exclusive": False, "reverse": False}


@factory("argsort_grad")
def _argsort(rng):
    x = _g(rng, 4, 6)
    return {"indices": np.argsort(x, axis=1), "x": x, "out_grad": _g(rng, 4, 6)}, \
        {"axis": 1, "descending": False, "stable": True}


@factory("topk_grad")
def _topk(rng):
    x = _g(rng, 4, 6)
    return {"x": x, "indices": np.argsort(-x, axis=1)[:, :2], "out_grad": _g(rng, 4, 2)}, \
        {"k": 2, "axis": 1, "largest": True, "sorted": True}


@factory("kthvalue_grad")
def _kthvalue(rng):
    x = _g(rng, 4, 6)
    return {"x": x, "indices": np.argsort(x, axis=1)[:, 1], "out_grad": _g(rng, 4)}, \
        {"k": 2, "axis": 1, "keepdim": False}


@factory("mode_grad")
def _mode(rng):
    x = np.round(_g(rng, 4, 6))
    return {"x": x, "indices": np.array([0, 5, 2, 3]), "out_grad": _g(rng, 4)}, \
        {"axis": -1, "keepdim": False}


@factory("nanmedian_grad")
def _nanmedian(rng):
    x = _g(rng, 4, 6)
    order = np.argsort(x, axis=1)
    return {"x": x, "medians": np.stack([order[:, 2], order[:, 3]], axis=1),
            "out_grad": _g(rng, 4)}, {"axis": [1], "keepdim": False, "mode": "avg"}
