"""The gradient of ``relax.nn.batch_norm`` (neither TVM nor backward.yaml has one).

``batch_norm(x, gamma, beta, moving_mean, moving_var, axis, epsilon, center, scale, momentum,
training)`` returns (y, new moving mean, new moving var). The moving statistics are running
averages that training updates, not values anything is differentiated through (as in torch):
their cotangents are ignored and ``moving_mean`` / ``moving_var`` get ``no_grad``.

* ``training=True``: y uses the batch statistics (biased variance, as TVM's kernel computes
  them), recomputed here; dx carries the terms through the mean and the variance;
* ``training=False``: y uses the moving statistics, constants: dx = γ·g/√(var + ε).

Any rank and channel ``axis`` (NCHW, NHWC, (N, C), (N, C, L), ...): the data is viewed as
(P, C, S) around the channel axis (S = 1 dropped), one kernel (``kernels.batch_norm_grad_plan``)
reduces over every axis but the channel. Without ``scale`` gamma gets no_grad (and dx no γ),
without ``center`` beta does.
"""

from __future__ import annotations

from .kernels import batch_norm_grad_plan, dims_of, emit_plan

__all__ = ["batch_norm_grad"]


def _prod(dims):
    out = 1
    for d in dims:
        out = out * d
    return out


def batch_norm_grad(ctx, call, out, grad, target):
    from tvm import relax
    from tvm.relax.op.grad import no_grad
    x, gamma, beta, mmean, mvar = call.args[:5]
    a = call.attrs
    shape = list(x.ty.shape.values)
    rank = len(shape)
    axis = int(a.axis) % rank
    training = bool(a.training)
    scale, center = bool(a.scale), bool(a.center)
    pre, post = shape[:axis], shape[axis + 1:]
    view = [_prod(pre), shape[axis]] + ([_prod(post)] if post and dims_of(post) != (1,) * len(post) else [])
    if isinstance(grad, relax.Tuple):
        g = grad.fields[0]
    else:
        g = ctx.emit(relax.TupleGetItem(grad, 0))
    xv = ctx.emit(relax.op.reshape(x, view))
    gv = ctx.emit(relax.op.reshape(g, view))
    dtype, pdt = str(x.ty.dtype), str(gamma.ty.dtype)
    plan = batch_norm_grad_plan(dims_of(view), dtype, pdt, training=training,
                                epsilon=float(a.epsilon), scale=scale)
    args = [xv, gv, gamma] + ([] if training else [mmean, mvar])
    vshape = xv.ty.shape
    res = emit_plan(ctx, "batch_norm_grad", plan, args,
                    [relax.TensorType(vshape, dtype), relax.TensorType(gamma.ty.shape, pdt),
                     relax.TensorType(gamma.ty.shape, pdt)], target=target)
    dx = ctx.emit(relax.op.reshape(ctx.emit(relax.TupleGetItem(res, 0)), x.ty.shape))
    dgamma = ctx.emit(relax.TupleGetItem(res, 1)) if scale else no_grad(gamma)
    dbeta = ctx.emit(relax.TupleGetItem(res, 2)) if center else no_grad(beta)
    return [dx, dgamma, dbeta, no_grad(mmean), no_grad(mvar)]
