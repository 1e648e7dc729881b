"""PyTorch references and realistic inputs for the indexing, scan and sort/select grads.

Bench targets of issue 4 (``tvmgrad bench OP --size N``, N the element count of out_grad):
gather_grad and index_select_grad with heavy index repetition (an embedding-style table of 1000
rows × 64 columns, N/64 lookups drawn from its first 100 rows), cumsum_grad on one long axis (one
row of N elements).
"""

from __future__ import annotations

import numpy as np

from ..examples import np_dtype


def _torch():
    import torch
    return torch


# -- inputs -----------------------------------------------------------------------------------

TABLE_ROWS, TABLE_COLS, HOT_ROWS = 1000, 64, 100


def _lookup_inputs(size, dtype):
    rng = np.random.default_rng(0)
    n = max(size // TABLE_COLS, 1)
    index = rng.integers(0, HOT_ROWS, n).astype("int64")          # ~n/100 repeats of every row
    return ({"x": np.zeros((TABLE_ROWS, TABLE_COLS), np_dtype(dtype)), "index": index,
             "out_grad": rng.standard_normal((n, TABLE_COLS), dtype=np.float32).astype(np_dtype(dtype))},
            {"axis": 0})


def _long_row(size, dtype):
    rng = np.random.default_rng(0)
    g = rng.standard_normal(size, dtype=np.float32).astype(np_dtype(dtype))
    return {"x": np.zeros(size, np_dtype(dtype)), "out_grad": g}, \
        {"axis": 0, "flatten": False, "exclusive": False, "reverse": False}


def _logcumsumexp_row(size, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(size).astype(np.float64)
    out = np.logaddexp.accumulate(x)
    g = rng.standard_normal(size)
    return {"x": x.astype(np_dtype(dtype)), "out": out.astype(np_dtype(dtype)), "out_grad": g.astype(np_dtype(dtype))}, \
        {"axis": 0, "flatten": False, "exclusive": False, "reverse": False}


def _rows_of(size, cols=1024):
    return max(size // cols, 1), cols


def _take_along(size, dtype):
    rows, cols = _rows_of(size)
    rng = np.random.default_rng(0)
    return ({"arr": np.zeros((rows, cols), np_dtype(dtype)),
             "indices": rng.integers(0, cols, (rows, cols)).astype("int64"),
             "out_grad": rng.standard_normal((rows, cols), dtype=np.float32).astype(np_dtype(dtype))},
            {"axis": 1})


def _argsort(size, dtype):
    rows, cols = _rows_of(size)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    return ({"indices": np.argsort(x, axis=1).astype("int64"), "x": x.astype(np_dtype(dtype)),
             "out_grad": rng.standard_normal((rows, cols), dtype=np.float32).astype(np_dtype(dtype))},
            {"axis": 1, "descending": False, "stable": True})


def _topk(size, dtype):
    """The top 32 of each row of 1024 (about ``size`` elements of x)."""
    k = 32
    rows, cols = _rows_of(size)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    return ({"x": x.astype(np_dtype(dtype)), "indices": np.argsort(-x, axis=1)[:, :k].astype("int64"),
             "out_grad": rng.standard_normal((rows, k), dtype=np.float32).astype(np_dtype(dtype))},
            {"k": k, "axis": 1, "largest": True, "sorted": True})


INPUTS = {
    "gather_grad": _lookup_inputs,
    "index_select_grad": _lookup_inputs,
    "cumsum_grad": _long_row,
    "logcumsumexp_grad": _logcumsumexp_row,
    "take_along_axis_grad": _take_along,
    "argsort_grad": _argsort,
    "topk_grad": _topk,
}


# -- PyTorch ------------------------------------------------------------------------------------

def _index_add(t, a):
    torch = _torch()
    x, idx, g = t["x"], t["index"], t["out_grad"]
    axis = int(a["axis"]) % x.dim()
    return lambda: torch.zeros_like(x).index_add_(axis, idx.reshape(-1), g)


def _take_along(t, a):
    torch = _torch()
    arr, idx, g = t["arr"], t["indices"], t["out_grad"]
    idx = torch.where(idx < 0, idx + arr.shape[int(a["axis"])], idx)
    return lambda: torch.zeros_like(arr).scatter_add_(int(a["axis"]), idx, g)


def _cumsum(t, a):
    torch = _torch()
    g, axis = t["out_grad"], int(a["axis"])
    return lambda: torch.flip(torch.cumsum(torch.flip(g, [axis]), axis), [axis])


def _autograd_unary(forward):
    def make(t, a):
        torch = _torch()
        x = t["x"].clone().requires_grad_()
        out = forward(x, t, a)
        g = t["out_grad"].reshape(out.shape)
        return lambda: torch.autograd.grad(out, [x], g, retain_graph=True)
    return make


def _scatter_assign(t, a):
    torch = _torch()
    x, idx, g = t["x"], t["indices"], t["out_grad"]
    return lambda: torch.zeros_like(x).scatter_(int(a["axis"]), idx, g)


def _index_sample(t, a):
    torch = _torch()
    x, idx, g = t["x"], t["index"], t["out_grad"]
    return lambda: torch.zeros_like(x).scatter_add_(1, idx, g)


def _masked_select(t, a):
    torch = _torch()
    x, mask, g = t["x"], t["mask"], t["out_grad"]
    return lambda: torch.zeros_like(x).masked_scatter_(mask, g)


def _where(t, a):
    torch = _torch()
    c, g = t["condition"], t["out_grad"]
    zero = torch.zeros_like(g)
    return lambda: (torch.where(c, g, zero), torch.where(c, zero, g))


def _gather_nd(t, a):
    torch = _torch()
    x, idx, g = t["x"], t["index"], t["out_grad"]
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    strides = torch.tensor([int(np.prod(x.shape[j + 1:k])) for j in range(k)], dtype=torch.int64)
    rows = (flat * strides).sum(1)
    lead = int(np.prod(x.shape[:k]))

    def run():
        out = torch.zeros((lead,) + tuple(x.shape[k:]), dtype=g.dtype)
        return out.index_add_(0, rows, g.reshape((-1,) + tuple(x.shape[k:]))).reshape(x.shape)
    return run


def _send_u_recv(t, a):
    torch = _torch()
    x, src, dst, g = t["x"], t["src_index"], t["dst_index"], t["out_grad"]
    return lambda: torch.zeros_like(x).index_add_(0, src, g.index_select(0, dst))


TORCH = {
    "gather_grad": _index_add,
    "index_select_grad": _index_add,
    "take_along_axis_grad": _take_along,
    "index_sample_grad": _index_sample,
    "gather_nd_grad": _gather_nd,
    "masked_select_grad": _masked_select,
    "where_grad": _where,
    "send_u_recv_grad": _send_u_recv,
    "argsort_grad": _scatter_assign,
    "topk_grad": _scatter_assign,
    "cumsum_grad": _cumsum,
    "logcumsumexp_grad": _autograd_unary(lambda x, t, a: _torch().logcumsumexp(x, int(a["axis"]))),
    "cumprod_grad": _autograd_unary(lambda x, t, a: _torch().cumprod(x, int(a["dim"]))),
    "cummax_grad": _autograd_unary(lambda x, t, a: _torch().cummax(x, int(a["axis"])).values),
    "cummin_grad": _autograd_unary(lambda x, t, a: _torch().cummin(x, int(a["axis"])).values),
}


# -- Paddle (where _C_ops with the YAML args is not the right call) ----------------------------

def _paddle_cumprod(t, a):
    import paddle
    return lambda: paddle._C_ops.cumprod_grad(t["x"], t["out"], t["out_grad"], int(a["dim"]),
                                              False, False)


PADDLE = {"cumprod_grad": _paddle_cumprod}
