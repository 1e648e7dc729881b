"""InferMetas of indexing, scatter and sort/select grads (Paddle's names, phi/infermeta/backward.cc).

Each grad has its primal's shape and the cotangent's dtype; shapes that no kernel can accept raise
``MetaError``. Index *values* are checked by the ops themselves (te_defs/indexing.py), which see
the data.
"""

from __future__ import annotations

from . import MetaError, TensorMeta, norm_axis, register
from ._common import need as _need

INDEX_DTYPES = ("int32", "int64")


def _index(meta, what: str, dtypes=INDEX_DTYPES) -> TensorMeta:
    meta = _need(meta, what)
    if meta.dtype.name not in dtypes:
        raise MetaError(f"{what} must be an integer tensor ({', '.join(dtypes)}), got "
                        f"{meta.dtype.name}")
    return meta


def _like(meta: TensorMeta, dtype_of: TensorMeta) -> TensorMeta:
    return TensorMeta(meta.shape, dtype_of.dtype)


def _check_nd(index, x, x_name, rows, rows_name):
    """The gather_nd/scatter_nd shape rule: the last dim of ``index`` (k) addresses the first k
    dims of ``x``, and ``rows`` (the gathered/scattered slices) is index.shape[:-1] + x.shape[k:]."""
    if index.ndim == 0:
        raise MetaError(f"index must have at least one dim, got shape {list(index.shape)}")
    k = index.shape[-1]
    if k > x.ndim:
        raise MetaError(f"index's last dim ({k}) exceeds {x_name}'s rank ({x.ndim})")
    want = index.shape[:-1] + x.shape[k:]
    if rows.shape != want:
        raise MetaError(f"{rows_name} has shape {list(rows.shape)}, expected {list(want)} "
                        f"(index.shape[:-1] + {x_name}.shape[{k}:], index {list(index.shape)}, "
                        f"{x_name} {list(x.shape)})")


@register
def GatherNdGradInferMeta(x, index, out_grad):
    """x_grad: x's shape, out_grad's dtype; out_grad = index.shape[:-1] + x.shape[index.shape[-1]:]."""
    x, g = _need(x, "x"), _need(out_grad, "out_grad")
    _check_nd(_index(index, "index"), x, "x", g, "out_grad")
    return (_like(x, g),)


@register
def IndexAddGradInferMeta(index, add_value, out_grad, axis):
    """x_grad: out_grad's meta; add_value_grad: add_value's shape, out_grad's dtype."""
    g, v = _need(out_grad, "out_grad"), _need(add_value, "add_value")
    index = _index(index, "index")
    if index.ndim > 1:
        raise MetaError(f"index must be 0-d or 1-d, got shape {list(index.shape)}")
    if g.ndim == 0:
        raise MetaError("out_grad must have at least one dim")
    a = norm_axis(axis, g.ndim, of="out_grad")
    n = index.shape[0] if index.ndim else 1
    want = g.shape[:a] + (n,) + g.shape[a + 1:]
    if v.shape != want:
        raise MetaError(f"add_value has shape {list(v.shape)}, expected {list(want)} from "
                        f"out_grad {list(g.shape)}, axis {a} and index {list(index.shape)}")
    return g, _like(v, g)


@register
def IndexPutGradInferMeta(x, indices, value, out_grad, accumulate):
    """x_grad: x's shape; value_grad: value's shape (both in out_grad's dtype)."""
    x, g, v = _need(x, "x"), _need(out_grad, "out_grad"), _need(value, "value")
    if g.shape != x.shape:
        raise MetaError(f"out_grad has shape {list(g.shape)}, expected x's {list(x.shape)}")
    if not indices:
        raise MetaError("indices must hold at least one tensor")
    for i, m in enumerate(indices):
        _index(m, f"indices[{i}]", INDEX_DTYPES + ("bool",))
    return _like(x, g), _like(v, g)


@register
def MultiplexGradInferMeta(index, out_grad):
    """inputs_grad[k]: out_grad's meta, one per input (the op sets the count: the YAML
    ``{inputs.size()}`` is not visible from these parameters)."""
    index = _index(index, "index")
    g = _need(out_grad, "out_grad")
    if g.ndim == 0:
        raise MetaError("out_grad must have at least one dim")
    if not (index.ndim == 2 and index.shape[1] == 1 or index.ndim == 1):
        raise MetaError(f"index must have shape [N, 1], got {list(index.shape)}")
    if index.shape[0] != g.shape[0]:
        raise MetaError(f"index has {index.shape[0]} rows but out_grad has {g.shape[0]}")
    return ([g],)


@register
def NanmedianGradInferMeta(x, medians, out_grad, axis, keepdim, mode):
    """x_grad: x's shape, out_grad's dtype."""
    x, g = _need(x, "x"), _need(out_grad, "out_grad")
    _index(medians, "medians", ("int64",))
    return (_like(x, g),)


@register
def ScatterGradInferMeta(index, updates, out_grad, overwrite):
    """x_grad: out_grad's meta; updates_grad: updates' shape, out_grad's dtype."""
    g, u = _need(out_grad, "out_grad"), _need(updates, "updates")
    _index(index, "index")
    return g, _like(u, g)


@register
def ScatterNdAddGradInferMeta(index, updates, out_grad):
    """x_grad: out_grad's meta; updates_grad: updates' shape, out_grad's dtype."""
    g, u = _need(out_grad, "out_grad"), _need(updates, "updates")
    _check_nd(_index(index, "index"), g, "out_grad", u, "updates")
    return g, _like(u, g)
