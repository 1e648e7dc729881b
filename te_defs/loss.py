"""Loss grads and whole-tensor reductions: bce, huber, kldiv, log_loss, label_smooth, nll,
sigmoid cross entropy, identity_loss, mean_all, reduce_as, segment_pool, maxout.

Semantics follow Paddle 3.3.1's CPU kernels (``phi/kernels/cpu/*_grad_kernel.cc``,
``impl/*_grad_kernel_impl.h``, ``funcs/segment_pooling.cc``, ``funcs/maxouting.cc``); half types
compute in float32. Notes on where Paddle's kernel misbehaves are in the docstrings.
"""

from __future__ import annotations

import numpy as np

from tvmgrad.dtypes import ALL_INTS, COMPLEX, FLOATS, INTS
from tvmgrad.families import OpError, pointwise
from tvmgrad.families.broadcast import coalesce
from tvmgrad.families.view import view_op
from tvmgrad.infer_meta import norm_axis
from tvmgrad.lazy import te, tirx

from ._math import const, float_attr, where
from ._reduction import cdtype, ld, need_same_shape, store
from ._scatter import div

INDEX = ("int32", "int64")


def _mask(cond, like):
    """1.0 where ``cond`` else 0.0 (to multiply by, keeping 0·inf = NaN like Paddle)."""
    return where(cond, const(1.0, like), const(0.0, like))


# ------------------------------------------------------------------------------------------
# elementwise losses

@pointwise
def bce_loss_grad(input, label, out_grad):
    """input_grad = out_grad · (input − label) / max((1 − input)·input, 1e-12)"""
    one = const(1.0, input)
    return out_grad * (input - label) / tirx.max((one - input) * input, const(1e-12, input))


@pointwise
def huber_loss_grad(residual, out_grad, delta):
    """residual = label − input: input_grad = −clip(residual, −δ, δ)·out_grad (−residual·g inside
    |r| ≤ δ, ∓δ·g outside), label_grad = −input_grad"""
    d = float_attr(delta)
    inside = tirx.abs(residual) <= d
    v = where(inside, residual, where(residual > 0, d, -d))
    return -v * out_grad, v * out_grad


@pointwise
def log_loss_grad(input, label, out_grad, epsilon):
    """input_grad = out_grad · (−label/(input + ε) + (1 − label)/(1 − input + ε))"""
    eps = float_attr(epsilon)
    one = const(1.0, input)
    return out_grad * (-(label / (input + eps)) + (one - label) / (one - input + eps))


@pointwise
def label_smooth_grad(out_grad, epsilon):
    """label_grad = (1 − ε)·out_grad, with 1 − ε formed in float32 (Paddle's kernel computes it
    from the float attribute before casting to the data type)"""
    c = const(1.0, "float32") - epsilon.astype("float32")
    return c.astype(str(out_grad.ty)) * out_grad


# ------------------------------------------------------------------------------------------
# kldiv_loss (x is no_need_buffer: its shape only)

def _kldiv_views(call, outs):
    shape = call.meta("label").shape
    need_same_shape(call.op, call, "label", "x")
    if call.meta("x").dtype != call.meta("label").dtype:
        raise TypeError(f"{call.op}: input 'label' has dtype {call.meta('label').dtype.name}, "
                        f"expected {call.meta('x').dtype.name} (the dtype of 'x')")
    red = call.attrs["reduction"]
    if red not in ("none", "mean", "sum", "batchmean"):
        raise OpError(f"{call.op}: attribute 'reduction' must be 'none', 'mean', 'sum' or "
                      f"'batchmean', got {red!r}")
    g = call.meta("out_grad")
    if red == "none":
        need_same_shape(call.op, call, "label", "out_grad")
        gt = ("b", "r")
    else:
        if g.shape not in ((), (1,)):
            raise OpError(f"{call.op}: input 'out_grad' has shape {list(g.shape)}, expected [] "
                          f"(reduction {red!r})")
        gt = (1, 1)
    b = shape[0] if shape else 1
    r = int(np.prod(shape[1:])) if shape else 1
    return ({"x": ("b", "r"), "label": ("b", "r"), "x_grad": ("b", "r"), "out_grad": gt},
            {"b": b, "r": r})


@view_op(views=_kldiv_views, float_inputs=("label", "out_grad"), index_dtypes=FLOATS)
def kldiv_loss_grad(x, label, out_grad, reduction, log_target):
    """x_grad = −label·g (0 where label ≤ 0; NaN labels give NaN), or −exp(label)·g with
    log_target; g = out_grad, divided by numel for 'mean' and by the batch size (dim 0) for
    'batchmean'"""
    dt = cdtype(label)
    b, r = label.shape

    def body(i, j):
        y = ld(label, i, j)
        g = ld(out_grad, i, j) if reduction == "none" else ld(out_grad, 0, 0)
        if log_target:
            v = -tirx.exp(y) * g
        else:
            v = where(y > 0, -y * g, where(tirx.isnan(y), y, const(0.0, dt)))
        if reduction == "mean":
            v = v / (b * r).astype(dt)
        elif reduction == "batchmean":
            v = v / b.astype(dt)
        return store(label, v)

    return te.compute((b, r), body, name="x_grad")


# ------------------------------------------------------------------------------------------
# sigmoid_cross_entropy_with_logits

def _sce_views(call, outs):
    for n in ("label", "pos_weight", "out_grad"):
        if call.meta(n) is not None:
            need_same_shape(call.op, call, "x", n)
    n = int(np.prod(call.meta("x").shape))
    return {k: ("n",) for k in ("x", "label", "pos_weight", "out_grad", "x_grad")}, {"n": n}


@view_op(views=_sce_views, pattern="red_rows")
def sigmoid_cross_entropy_with_logits_grad(x, label, pos_weight, out_grad, normalize, ignore_index):
    """Paddle's CPU formula: 0 where int(label) = ignore_index, else out_grad ·
    (x > 0 − label − sign⁺(x)·e^{−|x|}/(1 + e^{−|x|})) without pos_weight, and
    out_grad · (pw·(term2/(d1 + d2) + term1) + 1 − label) with it (d1 = e^{−max(−x, 0)},
    d2 = e^{−x − max(−x, 0)}, term1 = −[x < 0], term2 = d1·(−term1) + d2·(−1 − term1); one of
    d1, d2 is 1, so this takes a single exp);
    normalize divides by the number of labels farther than 1e-6 from ignore_index (an integer
    count; 0 when every label is ignored, which divides by zero as Paddle does)."""
    dt = cdtype(x)
    (n,) = x.shape
    one, zero = const(1.0, dt), const(0.0, dt)
    ign = tirx.const(ignore_index, "int32")

    def value(i):
        xv, y, g = ld(x, i), ld(label, i), ld(out_grad, i)
        if pos_weight is None:
            t1 = where(xv > 0, one, zero)
            e = tirx.exp(-tirx.abs(xv))
            sgn = where(xv >= 0, one, -one)
            diff = t1 - y + (-e * sgn) / (one + e)
        else:
            # d1 = e^{-max(-x,0)}, d2 = e^{-x-max(-x,0)}: one of them is 1 and the other e^{-|x|},
            # so term2 = ∓e^{-|x|} and d1 + d2 = 1 + e^{-|x|} exactly as Paddle forms them
            pw = ld(pos_weight, i)
            t1 = where(xv < 0, -one, zero)
            e = tirx.exp(-tirx.abs(xv))
            t2 = where(xv < 0, e, -e)
            diff = pw * (t2 / (one + e) + t1) + (one - y)
        return where(y.astype("int32") == ign, zero, g * diff)

    if not normalize:
        return te.compute((n,), lambda i: store(x, value(i)), name="x_grad")
    k = te.reduce_axis((0, n), name="k")
    eps = const(1e-6, dt)

    def counted(j):
        d = ld(label, j) - tirx.const(float(ignore_index), dt)
        return where(tirx.any(d < -eps, d > eps), tirx.const(1, "int64"), tirx.const(0, "int64"))

    cnt = te.compute((1,), lambda _: te.sum(counted(k), axis=k), name="count")
    inv = te.compute((1,), lambda _: one / cnt[0].astype(dt), name="rv_inv",
                     attrs={"rows.role": "scalar"})
    return te.compute((n,), lambda i: store(x, value(i) * inv[0]), name="x_grad")


# ------------------------------------------------------------------------------------------
# identity_loss / mean_all / reduce_as

def _identity_views(call, outs):
    x = call.meta("x")
    n = int(np.prod(x.shape))
    g = ("n",) if call.attrs["reduction"] == 2 else (1,)
    return {"x": ("n",), "x_grad": ("n",), "out_grad": g}, {"n": n}


@view_op(views=_identity_views, float_inputs=("x", "out_grad"))
def identity_loss_grad(x, out_grad, reduction):
    """x_grad = out_grad broadcast (0: sum), out_grad / numel (1: mean), out_grad (2: none);
    x_grad has x's shape and dtype (x and out_grad share it: out_grad is the grad of a loss of
    x; only x's shape is read)"""
    (n,) = x.shape
    dt = cdtype(out_grad)
    if reduction == 2:
        return te.compute((n,), lambda i: out_grad[i], name="x_grad")
    if reduction == 0:
        return te.compute((n,), lambda i: out_grad[0], name="x_grad")
    return te.compute((n,), lambda i: store(out_grad, ld(out_grad, 0) / n.astype(dt)), name="x_grad")


def _mean_all_views(call, outs):
    n = int(np.prod(call.meta("x").shape))
    g = call.meta("out_grad")
    if g.shape not in ((), (1,)):
        raise OpError(f"{call.op}: input 'out_grad' has shape {list(g.shape)}, expected []")
    return {"x": ("n",), "x_grad": ("n",), "out_grad": (1,)}, {"n": n}


@view_op(views=_mean_all_views, float_inputs=("x", "out_grad"), dtypes=FLOATS + COMPLEX)
def mean_all_grad(x, out_grad):
    """x_grad = out_grad / numel(x), broadcast to x's shape (x and out_grad share a dtype; only x's
    shape is read; a complex pair divides both parts)"""
    n = x.shape[0]
    dt = cdtype(out_grad)
    return te.compute(x.shape, lambda i, *c: store(out_grad, ld(out_grad, 0, *c) / n.astype(dt)),
                      name="x_grad")


def _reduce_as_check(call, outs):
    xs, ts, gs = (call.meta(n).shape for n in ("x", "target", "out_grad"))
    if tuple(ts) != tuple(gs):
        raise OpError(f"{call.op}: input 'out_grad' has shape {list(gs)}, expected {list(ts)} "
                      f"(the shape of 'target')")
    if len(ts) > len(xs) or any(t not in (1, x) for t, x in zip(ts[::-1], xs[::-1])):
        raise OpError(f"{call.op}: 'target' of shape {list(ts)} cannot be broadcast to x's "
                      f"shape {list(xs)}")


def _reduce_as_views(call, outs):
    _reduce_as_check(call, outs)
    xs, ts = call.meta("x").shape, call.meta("target").shape
    groups, masks = coalesce(xs, [ts], ["target"], call.op)
    names = [f"d{i}" for i in range(len(groups))]
    xt = tuple(names)
    gt = tuple(1 if m[0] else nm for nm, m in zip(names, masks))
    return ({"x": xt, "x_grad": xt, "target": gt, "out_grad": gt},
            dict(zip(names, groups)))


@view_op(views=_reduce_as_views, dtypes=FLOATS + COMPLEX + ("bool",) + ALL_INTS)
def reduce_as_grad(x, target, out_grad):
    """x_grad = out_grad broadcast to x's shape (reduce_as sums x down to target's shape; a
    complex pair moves as it is)"""
    def body(*i):
        return out_grad(*[0 if isinstance(d, tirx.IntImm) and d.value == 1 else v
                          for v, d in zip(i, out_grad.shape)])

    return te.compute(x.shape, body, name="x_grad")


# ------------------------------------------------------------------------------------------
# nll_loss

def _nll_views(call, outs):
    x = call.meta("input").shape
    n, c = x[0], x[1]
    m = int(np.prod(x[2:])) if len(x) > 2 else 1
    red = call.attrs["reduction"]
    g = ("n", "m") if red == "none" else (1, 1)
    return ({"input": ("n", "c", "m"), "input_grad": ("n", "c", "m"), "label": ("n", "m"),
             "weight": ("c",), "total_weight": (1,), "out_grad": g},
            {"n": n, "c": c, "m": m})


def _nll_check(call, outs):
    label = np.asarray(call.tensors["label"])
    c = call.meta("input").shape[1]
    ign = call.attrs["ignore_index"]
    if label.size:
        bad = ((label < 0) | (label >= c)) & (label != ign)
        if bad.any():
            raise ValueError(f"{call.op}: input 'label' holds {label[bad].reshape(-1)[0]}, out of "
                             f"range: class labels must lie in [0, {c}) or equal ignore_index ({ign})")


@view_op(views=_nll_views, check=_nll_check, float_inputs=("input", "weight", "total_weight", "out_grad"),
         index_dtypes=("int64",))
def nll_loss_grad(input, label, weight, total_weight, out_grad, ignore_index, reduction):
    """input_grad[n, c, ...] = −w[c]·g (divided by total_weight for 'mean') where c = label[n, ...]
    ≠ ignore_index, else 0 (w = 1 without weight; g = out_grad[n, ...] for 'none', the scalar
    otherwise)"""
    dt = cdtype(input)
    n_, c_, m_ = input.shape
    zero = const(0.0, dt)

    def body(i, c, m):
        lbl = label[i, m].astype("int64")
        valid = lbl != tirx.const(ignore_index, "int64")
        safe = where(valid, lbl, tirx.const(0, "int64"))
        w = ld(weight, safe) if weight is not None else const(1.0, dt)
        g = ld(out_grad, i, m) if reduction == "none" else ld(out_grad, 0, 0)
        v = -g * w
        if reduction == "mean":
            v = v / ld(total_weight, 0)
        return store(input, where(tirx.all(valid, c.astype("int64") == lbl), v, zero))

    return te.compute((n_, c_, m_), body, name="input_grad")


# ------------------------------------------------------------------------------------------
# segment_pool

def _seg_shapes(call):
    op = call.op
    x = call.meta("x").shape
    if not x:
        raise OpError(f"{op}: x must have rank >= 1")
    ids = call.meta("segment_ids")
    if ids.shape != (x[0],):
        raise OpError(f"{op}: input 'segment_ids' has shape {list(ids.shape)}, expected [{x[0]}] "
                      f"(one id per row of 'x' {list(x)})")
    out = call.meta("out").shape
    if len(out) != len(x) or tuple(out[1:]) != tuple(x[1:]):
        raise OpError(f"{op}: input 'out' has shape {list(out)}, expected [S] + {list(x[1:])} "
                      f"(S segments of the rows of 'x' {list(x)})")
    need_same_shape(op, call, "out", "out_grad")
    pool = call.attrs["pooltype"]
    if pool not in ("SUM", "MEAN", "MAX", "MIN"):
        raise OpError(f"{op}: attribute 'pooltype' must be SUM, MEAN, MAX or MIN, got {pool!r}")
    s = call.meta("summed_ids")
    if s is not None and int(np.prod(s.shape)) != out[0]:
        raise OpError(f"{op}: input 'summed_ids' has shape {list(s.shape)}, expected [{out[0]}, 1] "
                      f"(one count per segment of 'out')")
    return x, out


def _seg_views(call, outs):
    x, out = _seg_shapes(call)
    w = int(np.prod(x[1:]))
    return ({"x": ("n", "w"), "x_grad": ("n", "w"), "segment_ids": ("n",), "out": ("s", "w"),
             "out_grad": ("s", "w"), "summed_ids": ("s",)}, {"n": x[0], "w": w, "s": out[0]})


def _seg_check(call, outs):
    _seg_shapes(call)
    ids = np.asarray(call.tensors["segment_ids"])
    s = call.meta("out").shape[0]
    if ids.size:
        if (ids < 0).any() or (ids >= s).any():
            bad = ids[(ids < 0) | (ids >= s)][0]
            raise ValueError(f"{call.op}: input 'segment_ids' holds {bad}, out of range [0, {s}) "
                             f"(out has {s} segments)")
        if (np.diff(ids) < 0).any():
            i = int(np.argmax(np.diff(ids) < 0))
            raise ValueError(f"{call.op}: input 'segment_ids' must be sorted, but "
                             f"segment_ids[{i}] = {ids[i]} > segment_ids[{i + 1}] = {ids[i + 1]}")


@view_op(views=_seg_views, check=_seg_check, float_inputs=("x", "out", "summed_ids", "out_grad"),
         index_dtypes=INDEX, pattern="red_rows", dtypes=FLOATS + INTS)
def segment_pool_grad(x, segment_ids, out, summed_ids, out_grad, pooltype):
    """x_grad[i] = out_grad[s] with s = segment_ids[i] (SUM); out_grad[s]/count(s) (MEAN, count the
    rows of segment s: from summed_ids when given, else counted; integers divide truncating, as
    Paddle's ``out_g / static_cast<T>(h)``); out_grad[s]·[x[i] = out[s]] (MAX/MIN: every tied
    row gets the full grad)"""
    dt = cdtype(x)
    n_, w_ = x.shape

    def seg(i):
        return segment_ids[i].astype("int64")

    if pooltype == "MEAN":
        if summed_ids is not None:
            def count(s):
                return ld(summed_ids, s, to=dt)
        else:
            s_ = out_grad.shape[0]
            k = te.reduce_axis((0, n_), name="k")
            cnt = te.compute((s_,), lambda s: te.sum(
                where(seg(k) == s.astype("int64"), const(1.0, dt), const(0.0, dt)), axis=k),
                name="seg_count")

            def count(s):
                return cnt[s]

        def body(i, j):
            s = seg(i)
            return store(x, div(ld(out_grad, s, j), count(s)))    # integers: truncated
    elif pooltype == "SUM":
        def body(i, j):
            return store(x, ld(out_grad, seg(i), j))
    else:
        def body(i, j):
            s = seg(i)
            return store(x, ld(out_grad, s, j) * _mask(ld(x, i, j) == ld(out, s, j), dt))

    return te.compute((n_, w_), body, name="x_grad")


# ------------------------------------------------------------------------------------------
# maxout

def _maxout_views(call, outs):
    op = call.op
    x = call.meta("x").shape
    if len(x) != 4:
        raise OpError(f"{op}: x must have rank 4 (NCHW or NHWC), got {list(x)}")
    axis = call.attrs["axis"]
    if axis not in (1, 3, -1):
        raise OpError(f"{op}: attribute 'axis' must be 1 (NCHW) or 3 / -1 (NHWC), got {axis}")
    ax = norm_axis(axis, 4, of="x", op=op, zero_d_axis=True)
    g = call.attrs["groups"]
    c = x[ax]
    if g <= 0 or c % g:
        raise OpError(f"{op}: attribute 'groups' = {g} must be positive and divide the {c} "
                      f"channels of x {list(x)}")
    want = list(x)
    want[ax] = c // g
    for n in ("out", "out_grad"):
        if list(call.meta(n).shape) != want:
            raise OpError(f"{op}: input {n!r} has shape {list(call.meta(n).shape)}, expected {want} "
                          f"(the shape of 'x' {list(x)} with its channels divided by groups)")
    pre = int(np.prod(x[:ax]))
    post = int(np.prod(x[ax + 1:]))
    return ({"x": ("pre", "co", "g", "post"), "x_grad": ("pre", "co", "g", "post"),
             "out": ("pre", "co", "post"), "out_grad": ("pre", "co", "post")},
            {"pre": pre, "co": c // g, "g": g, "post": post})


@view_op(views=_maxout_views, pattern="red_rows")
def maxout_grad(x, out, out_grad, groups, axis):
    """x_grad = out_grad at the first channel of each group where x equals out (Paddle's
    MaxOutGradFunctor stops at the first match), 0 elsewhere"""
    pre, co, g, post = x.shape
    k = te.reduce_axis((0, g), name="k")
    first = te.compute((pre, co, post), lambda p, c, q: te.min(
        where(ld(x, p, c, k, q) == ld(out, p, c, q), k.var, g), axis=k), name="rs_first",
        attrs={"rows.role": "reduce"})
    zero = const(0.0, cdtype(x))
    return te.compute(x.shape, lambda p, c, j, q: store(
        x, where(j == first[p, c, q], ld(out_grad, p, c, q), zero)), name="ro_x_grad",
        attrs={"rows.role": "output"})
