"""Softmax-family grads: log_softmax, gumbel_softmax, cross_entropy_with_softmax, margin CE.

Arrays are viewed around the softmax axis as ``(pre, n)`` (axis last, or everything after it of
size 1) or ``(pre, n, post)``, so one kernel serves every rank and axis; reductions run along
``n`` and accumulate in float32 for half types. Semantics: Paddle 3.3.1
(``cpu/log_softmax_grad_kernel.cc``, ``funcs/softmax_impl.h``, ``cpu/cross_entropy_grad_kernel.cc``,
``gpu/margin_cross_entropy_grad_kernel.cu``).
"""

from __future__ import annotations

import numpy as np

from tvmgrad.dtypes import FLOATS
from tvmgrad.families.view import view_op
from tvmgrad.infer_meta import norm_axis, same_shape
from tvmgrad.lazy import te, tirx

from ._math import const, float_attr, where
from ._reduction import axis_view, cdtype, ld, store

INDEX = ("int32", "int64")


def _axis_views(names, axis_attr="axis", ref=None):
    """views(call, outs): every name viewed around the (canonical) axis of ``ref``'s shape; the
    other inputs must have that shape (ValueError naming the input otherwise)."""
    def views(call, outs):
        ref_name = ref or names[0]
        shape = call.meta(ref_name).shape
        for n in names:
            m = call.meta(n) if n in call.tensors else None
            if m is not None and not same_shape(m.shape, shape):
                raise ValueError(f"{call.op}: input {n!r} has shape {list(m.shape)}, expected "
                                 f"{ref_name}'s {list(shape)}")
        ax = norm_axis(call.attrs[axis_attr], len(shape), op=call.op, zero_d_axis=True)
        v, sizes = axis_view(shape, ax)
        return {n: v for n in names}, sizes
    return views


def _reduce_n(name, shape, body, acc):
    """sum over the n dim of a (pre, n) / (pre, n, post) view: result (pre,) / (pre, post)."""
    if len(shape) == 2:
        k = te.reduce_axis((0, shape[1]), name=f"{name}_k")
        return te.compute((shape[0],), lambda i: te.sum(body(i, k).astype(acc), axis=k), name=name,
                          attrs={"rows.role": "reduce"})
    k = te.reduce_axis((0, shape[1]), name=f"{name}_k")
    return te.compute((shape[0], shape[2]), lambda i, p: te.sum(body(i, k, p).astype(acc), axis=k),
                      name=name, attrs={"rows.role": "reduce"})


def _row(idx):
    """The reduced-tensor index of an element index of the view."""
    return (idx[0],) if len(idx) == 2 else (idx[0], idx[2])


# ------------------------------------------------------------------------------------------
# log_softmax / gumbel_softmax

@view_op(views=_axis_views(("out", "out_grad", "x_grad")), pattern="red_rows")
def log_softmax_grad(out, out_grad, axis):
    """x_grad = out_grad − exp(out) · Σ_axis out_grad   (sum in float32 for half types)"""
    acc = cdtype(out)
    s = _reduce_n("rs_dsum", out.shape, lambda *i: ld(out_grad, *i), acc)
    return te.compute(out.shape, lambda *i: store(
        out, ld(out_grad, *i) - tirx.exp(ld(out, *i)) * s(*_row(i))), name="ro_x_grad",
        attrs={"rows.role": "output"})


@view_op(views=_axis_views(("out", "out_grad", "x_grad")), pattern="red_rows")
def gumbel_softmax_grad(out, out_grad, axis):
    """x_grad = out · (out_grad − Σ_axis out·out_grad)   (Paddle's SoftmaxGrad functor; the
    straight-through ``hard`` variant has the same grad)"""
    acc = cdtype(out)
    s = _reduce_n("rs_dot", out.shape, lambda *i: ld(out, *i) * ld(out_grad, *i), acc)
    return te.compute(out.shape, lambda *i: store(
        out, ld(out, *i) * (ld(out_grad, *i) - s(*_row(i)))), name="ro_x_grad",
        attrs={"rows.role": "output"})


# ------------------------------------------------------------------------------------------
# cross_entropy_with_softmax

def _ce_views(call, outs):
    shape = call.meta("softmax").shape
    ax = norm_axis(call.attrs["axis"], len(shape), op=call.op, zero_d_axis=True)
    v, sizes = axis_view(shape, ax)
    ones = (v[0], 1) if len(v) == 2 else (v[0], 1, v[2])
    lab = v if call.attrs["soft_label"] else ones
    return {"softmax": v, "input_grad": v, "label": lab, "loss_grad": ones}, sizes


def _ce_check(call, outs):
    if call.attrs["soft_label"]:
        return
    label = np.asarray(call.tensors["label"])
    shape = call.meta("softmax").shape
    n = shape[norm_axis(call.attrs["axis"], len(shape), op=call.op, zero_d_axis=True)]
    _check_labels(call.op, "label", label, n, call.attrs["ignore_index"])


def _check_labels(op, name, label, n, ignore_index=None):
    if label.size == 0:
        return
    bad = (label < 0) | (label >= n)
    if ignore_index is not None:
        bad &= label != ignore_index
    if bad.any():
        v = label[bad].reshape(-1)[0]
        extra = f" or equal ignore_index ({ignore_index})" if ignore_index is not None else ""
        raise ValueError(f"{op}: input {name!r} holds {v}, out of range: class labels must lie in "
                         f"[0, {n}){extra}")


@view_op(views=_ce_views, check=_ce_check, float_inputs=("softmax", "loss_grad"),
         index_dtypes=INDEX + FLOATS)
def cross_entropy_with_softmax_grad(label, softmax, loss_grad, soft_label, use_softmax,
                                    numeric_stable_mode, ignore_index, axis):
    """use_softmax: input_grad = loss_grad · (softmax − y), y the soft label or the one-hot of
    the hard label (0 where label = ignore_index);
    not use_softmax (softmax holds probabilities): input_grad = −loss_grad · y / softmax
    (hard: only the label's class, 0 where ignored)."""
    dt = cdtype(softmax)
    ones3 = len(softmax.shape) == 3

    def row(i):
        return (i[0], 0) if not ones3 else (i[0], 0, i[2])

    def body(*i):
        g = ld(loss_grad, *row(i))
        p = ld(softmax, *i)
        if soft_label:
            y = ld(label, *i, to=dt)
            r = g * (p - y) if use_softmax else g * (-y / p)
        else:
            lbl = label(*row(i)).astype("int64")
            hit = lbl == i[1].astype("int64")
            keep = lbl != tirx.const(ignore_index, "int64")
            one, zero = const(1.0, dt), const(0.0, dt)
            if use_softmax:
                r = where(keep, p * g - where(hit, g, zero), zero)
            else:
                r = where(tirx.all(keep, hit), (-one / p) * g, zero)
        return store(softmax, r)

    return te.compute(softmax.shape, body, name="input_grad")


# ------------------------------------------------------------------------------------------
# margin_cross_entropy

def _mce_views(call, outs):
    n, c = call.meta("logits").shape
    v = ("n", "c")
    return ({"logits": v, "softmax": v, "logits_grad": v, "label": ("n",), "loss_grad": ("n",)},
            {"n": n, "c": c})


def _mce_check(call, outs):
    n, c = call.meta("logits").shape
    _check_labels(call.op, "label", np.asarray(call.tensors["label"]), c)


def _above(v, eps):
    """Paddle's ``fabs(attr - ...) > 1e-8`` on a float attribute: compared in double."""
    return tirx.abs(v.astype("float64")) > tirx.const(eps, "float64")


@view_op(views=_mce_views, check=_mce_check, float_inputs=("logits", "softmax", "loss_grad"),
         index_dtypes=INDEX)
def margin_cross_entropy_grad(logits, label, softmax, loss_grad, return_softmax, ring_id, rank,
                              nranks, margin1, margin2, margin3, scale):
    """logits_grad = scale · loss_grad · (softmax − onehot(label)) off the label's class; at it
    (softmax − 1) · loss_grad · m1·sin(m1·acos(x) + m2)/√(1 − x²) (x = logits, the cosine;
    the factor only when m1 ≠ 1 or m2 ≠ 0). Single process (nranks = 1); margin3 only shifts
    the forward. Float attributes are float32 in Paddle's kernel (also for float64 data)."""
    dt = cdtype(softmax)
    m1, m2, sc = float_attr(margin1), float_attr(margin2), float_attr(scale)
    one = const(1.0, dt)

    def body(i, j):
        g = ld(loss_grad, i)
        p = ld(softmax, i, j)
        hit = label(i).astype("int64") == j.astype("int64")
        x = ld(logits, i, j)
        d = m1 * tirx.sin(m1 * tirx.acos(x) + m2) / tirx.sqrt(one - x * x)
        one64 = tirx.const(1.0, "float64")
        use_d = tirx.any(_above(m1.astype("float64") - one64, 1e-8), _above(m2, 1e-8))
        at_label = (p - one) * g * where(use_d, d, one)
        r = where(hit, at_label, p * g)
        r = where(_above(sc.astype("float64") - one64, 1e-8), r * sc, r)
        return store(softmax, r)

    return te.compute(softmax.shape, body, name="logits_grad")
