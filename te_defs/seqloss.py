"""Sequence-loss grads: CTC (warpctc) and RNN-T (warprnnt).

Both losses compute their gradient w.r.t. the logits in the *forward* op (warp-ctc's / the warp
transducer's alpha-beta recursions, log-space, with norm_by_times / fastemit_lambda applied there)
and hand it to the backward op as ``warpctcgrad`` / ``warprnntgrad``; the backward ops only scale
that tensor by the incoming loss gradient (Paddle 3.3.1, phi/kernels/impl/warpctc_grad_kernel_impl.h
and warprnnt_grad_kernel_impl.h):

* warpctc_grad: logits_grad[t, b, :] = warpctcgrad[t, b, :] · loss_grad[b] (· 1/logits_length[b]
  when norm_by_times; Paddle multiplies by the float reciprocal, so a zero length gives inf/NaN
  as in Paddle). Without ``logits_length`` Paddle takes the LoD path, which segfaults in 3.3.1
  (there is no LoD in dynamic mode): here a 3-D ``logits`` [Tmax, B, C] means every sequence is
  Tmax long, and a 2-D ``logits`` [T, C] is one sequence (B = 1, T <= Tmax) whose rows are the
  first T steps of warpctcgrad; a 2-D ``logits`` with B > 1 needs ``logits_length``.
* warprnnt_grad: input_grad[b, ...] = warprnntgrad[b, ...] · loss_grad[b] (input_lengths, blank
  and fastemit_lambda are not used by the backward, but checked: lengths in [0, max_time], blank
  a class index, fastemit_lambda >= 0; likewise warpctc's logits_length and blank).

Half types compute in float32 and round once.
"""

from __future__ import annotations

from tvmgrad.families import tensor_op
from tvmgrad.infer_meta import MetaError


def _shape(call, name):
    m = call.meta(name)
    return None if m is None else tuple(m.shape)


def _lengths(call, name, limit, what):
    """A length tensor's values must lie in [0, limit] (a negative or too large length would
    change the result silently)."""
    import numpy as np
    v = np.asarray(call.tensors[name])
    if v.dtype.kind not in "iu":
        raise TypeError(f"{call.op}: input {name!r} has dtype {v.dtype}; it must be int32 or int64")
    if v.size and (v.min() < 0 or v.max() > limit):
        bad = int(v.min()) if v.min() < 0 else int(v.max())
        raise ValueError(f"{call.op}: input {name!r} holds {bad}, out of range [0, {limit}] "
                         f"({what})")


def _blank(call, classes):
    blank = call.attrs["blank"]
    if not 0 <= blank < max(classes, 1):
        raise ValueError(f"{call.op}: attribute 'blank' = {blank} is out of range [0, {classes}) "
                         f"(a class index)")


def _warpctc_check(call, outs):
    op = call.op
    wg = _shape(call, "warpctcgrad")
    if len(wg) != 3:
        raise ValueError(f"{op}: input 'warpctcgrad' must be 3-D [max_time, batch, classes], got "
                         f"{list(wg)}")
    T, B, C = wg
    _blank(call, C)
    lg = _shape(call, "loss_grad")
    if lg not in ((B, 1), (B,)):
        raise ValueError(f"{op}: input 'loss_grad' must have shape [{B}, 1] (one loss per "
                         f"sequence), got {list(lg)}")
    logits = _shape(call, "logits")
    length = _shape(call, "logits_length")
    if length is not None:
        if logits != wg:
            raise ValueError(f"{op}: input 'logits' must have warpctcgrad's shape {list(wg)} "
                             f"(padded [max_time, batch, classes]), got {list(logits)}")
        if length != (B,):
            raise ValueError(f"{op}: input 'logits_length' must have shape [{B}] (the batch of "
                             f"'warpctcgrad'), got {list(length)}")
        _lengths(call, "logits_length", T, f"the max_time of 'warpctcgrad' is {T}")
        return
    if len(logits) == 3:
        if logits != wg:
            raise ValueError(f"{op}: input 'logits' must have warpctcgrad's shape {list(wg)}, got "
                             f"{list(logits)}")
        return
    if len(logits) != 2 or logits[1] != C:
        raise ValueError(f"{op}: input 'logits' must be [max_time, batch, {C}] or (one sequence, "
                         f"no logits_length) [time, {C}], got {list(logits)}")
    if B != 1:
        raise ValueError(f"{op}: without 'logits_length' a 2-D 'logits' (LoD layout) is only "
                         f"defined for one sequence; warpctcgrad has batch {B}: pass "
                         f"logits_length (Paddle 3.3.1 segfaults here)")
    if logits[0] > T:
        raise ValueError(f"{op}: input 'logits' has {logits[0]} time steps but warpctcgrad only "
                         f"{T}")


@tensor_op(float_inputs=("logits", "warpctcgrad", "loss_grad"), validate=_warpctc_check)
def warpctc_grad(logits, logits_length, warpctcgrad, loss_grad, blank, norm_by_times):
    """logits_grad[t, b, c] = warpctcgrad[t, b, c] · loss_grad[b] (· 1/logits_length[b] if
    norm_by_times; without logits_length every sequence spans all of logits' time steps)"""
    from tvm import te, tirx

    from tvmgrad.dtypes import dtype as as_dtype, to_compute

    dt = as_dtype(str(warpctcgrad.dtype))
    cdt = dt.compute
    T = warpctcgrad.shape[0]

    def lg(b):
        idx = (b, 0) if len(loss_grad.shape) == 2 else (b,)
        return to_compute(loss_grad[idx], dt)

    def inv_len(b):
        if logits_length is not None:
            n = logits_length[b].astype(cdt)
        elif len(logits.shape) == 3:
            n = T.astype(cdt)
        else:
            n = logits.shape[0].astype(cdt)
        return tirx.const(1.0, cdt) / n

    def value(t, b, c):
        g = to_compute(warpctcgrad[t, b, c], dt) * lg(b)
        if norm_by_times:
            g = g * inv_len(b)
        return g.astype(dt.storage)

    if len(logits.shape) == 3:
        return te.compute(logits.shape, value, name="logits_grad")
    return te.compute(logits.shape, lambda t, c: value(t, tirx.const(0, "int64"), c),
                      name="logits_grad")


def _warprnnt_check(call, outs):
    op = call.op
    wg = _shape(call, "warprnntgrad")
    if len(wg) != 4:
        raise ValueError(f"{op}: input 'warprnntgrad' must be 4-D [batch, max_time, max_label + 1, "
                         f"classes], got {list(wg)}")
    if _shape(call, "input") != wg:
        raise ValueError(f"{op}: input 'input' must have warprnntgrad's shape {list(wg)}, got "
                         f"{list(_shape(call, 'input'))}")
    if _shape(call, "loss_grad") != (wg[0],):
        raise ValueError(f"{op}: input 'loss_grad' must have shape [{wg[0]}] (one loss per "
                         f"sequence), got {list(_shape(call, 'loss_grad'))}")
    if _shape(call, "input_lengths") != (wg[0],):
        raise ValueError(f"{op}: input 'input_lengths' must have shape [{wg[0]}] (the batch of "
                         f"'warprnntgrad'), got {list(_shape(call, 'input_lengths'))}")
    _lengths(call, "input_lengths", wg[1], f"the max_time of 'warprnntgrad' is {wg[1]}")
    _blank(call, wg[3])
    if not call.attrs["fastemit_lambda"] >= 0:
        raise ValueError(f"{op}: attribute 'fastemit_lambda' must be >= 0, got "
                         f"{call.attrs['fastemit_lambda']}")


@tensor_op(float_inputs=("input", "warprnntgrad", "loss_grad"), validate=_warprnnt_check)
def warprnnt_grad(input, input_lengths, warprnntgrad, loss_grad, blank, fastemit_lambda):
    """input_grad[b, t, u, c] = warprnntgrad[b, t, u, c] · loss_grad[b]"""
    from tvm import te

    from tvmgrad.dtypes import dtype as as_dtype, to_compute

    dt = as_dtype(str(warprnntgrad.dtype))
    return te.compute(input.shape, lambda b, t, u, c: (
        to_compute(warprnntgrad[b, t, u, c], dt) * to_compute(loss_grad[b], dt)).astype(dt.storage),
        name="input_grad")


__all__ = ["warpctc_grad", "warprnnt_grad", "MetaError"]
