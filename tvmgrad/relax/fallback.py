"""TVM's own gradient as the fallback for the forms a tvmgrad rule does not cover (a layout, an
``out_dtype`` cast): the rules (``rules``, ``conv``) hand such calls here, and each hand-over is
recorded in ``FALLBACKS`` (the model tests assert it stays empty). A leaf, so that the gradient
modules need not import the registry that imports them."""

from __future__ import annotations

from .tvm_own import tvm_differentiable

__all__ = ["FALLBACKS", "tvm_fallback"]

FALLBACKS: list = []      # (relax op, why) each time a rule handed a call to TVM's own gradient


def tvm_fallback(ctx, call, out, grad, why: str):
    """Forms a mapping does not cover go to TVM's own gradient for the op (our registration
    shadows it for every call), else raise NotImplementedError saying why. Each hand-over is
    recorded in ``FALLBACKS``."""
    from tvm.relax.op import _op_gradient
    name = str(call.op.name)
    fn = getattr(_op_gradient, name.rsplit(".", 1)[-1] + "_grad", None)
    if fn is None or name not in tvm_differentiable():
        raise NotImplementedError(f"tvmgrad gradient of {name}: {why} (and TVM has no gradient for it)")
    FALLBACKS.append((name, why))
    return list(fn(out, call, grad, ctx))
