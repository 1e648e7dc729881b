"""Registering the rules with Relax's Gradient pass, and the coverage next to TVM's own."""

from __future__ import annotations

from .. import registry
from .emit import emit
from .rules import GRADIENTS, NO_GRAD, RelaxGrad
from .tvm_own import tvm_differentiable

__all__ = ["register_gradients", "coverage"]


LEVEL = 11            # above TVM's own gradients (registered at level 10)
_registered: dict[str, str] = {}


def _is_float(ty) -> bool:
    """Whether a value of Relax type ``ty`` can carry a gradient: a float tensor, or a tuple
    holding one (shapes, PrimValues, integer and boolean tensors cannot)."""
    from tvm import relax
    if isinstance(ty, relax.TensorType):
        return ty.dtype != "" and "float" in str(ty.dtype)
    if isinstance(ty, relax.TupleType):
        return any(_is_float(f) for f in ty.fields)
    return False


def non_differentiable(call) -> list:
    """``no_grad`` for every argument: what a gradient returns for an op whose outputs are
    integers or booleans (comparisons, logical ops, argmax, ...). ``no_grad`` (unlike a zero
    tensor) stops the Gradient pass: it never walks into the subgraph that computed the args."""
    from tvm.relax.op.grad import no_grad
    return [no_grad(a) for a in call.args]


def _make_gradient(relax_op: str, rule: RelaxGrad, target):
    def gradient(orig_var, orig_call, output_grad, ctx):
        from tvm.relax.op.grad import no_grad
        if not _is_float(orig_var.ty):            # an integer/boolean result: nothing flows back
            return non_differentiable(orig_call)
        if rule.custom is not None:
            grads = rule.custom(ctx, orig_call, orig_var, output_grad, target)
        else:
            grads = emit(ctx, rule.op, rule.inputs(orig_call, orig_var, output_grad), rule.attrs(orig_call),
                         target=target)
            grads = grads if isinstance(grads, tuple) else (grads,)
            by_name = dict(zip(registry.get(rule.op).spec.output_names, grads))
            grads = [no_grad(arg) if name is None else by_name[name]
                     for arg, name in zip(orig_call.args, rule.results)]
        # conditions, masks, integer labels and indices, shapes and scalars: never differentiated
        return [g if _is_float(a.ty) else no_grad(a) for a, g in zip(orig_call.args, grads)]
    gradient.__name__ = f"tvmgrad_{relax_op.replace('.', '_')}_grad"
    return gradient


def _no_grad_rule(orig_var, orig_call, output_grad, ctx):
    return non_differentiable(orig_call)


def register_gradients(target=None) -> dict[str, str]:
    """Register tvmgrad-backed gradients for every mapped Relax op whose kernel is implemented,
    and ``no_grad`` ones for the integer/boolean ops TVM has none for (``NO_GRAD``); returns
    {relax op: backward op, or "no_grad"}. Idempotent (TVM allows one override).

    ``target`` schedules every kernel as it is emitted; without it (the default) kernels are
    scheduled when the module is compiled, for the target it is compiled for (the tvmgrad
    pipeline, installed here into ``tvm.compile``'s default pipeline: ``pipeline.install``)."""
    from tvm.relax.op.base import register_gradient
    from . import passes
    tvm_differentiable()                 # remember TVM's own set before shadowing it
    for relax_op, rule in GRADIENTS.items():
        if relax_op in _registered or not rule.available:
            continue
        register_gradient(relax_op, _make_gradient(relax_op, rule, target), level=LEVEL)
        _registered[relax_op] = rule.op
    for relax_op in NO_GRAD:
        if relax_op in _registered or relax_op in tvm_differentiable() or not _is_op(relax_op):
            continue
        register_gradient(relax_op, _no_grad_rule, level=LEVEL)
        _registered[relax_op] = "no_grad"
    passes.install()
    return dict(_registered)


def _is_op(name: str) -> bool:
    import tvm
    try:
        tvm.ir.Op.get(name)
    except Exception:  # noqa: BLE001 - not an op in this TVM build
        return False
    return True


def coverage() -> list[tuple[str, str | None, bool]]:
    """(relax op, tvmgrad kernel or "no_grad" or None, has TVM's own gradient) for every Relax op
    that either tvmgrad or TVM differentiates. The kernel is a backward.yaml op, or one that
    tvmgrad.relax builds itself (``batch_norm_grad``)."""
    rows = []
    for name in sorted({*GRADIENTS, *tvm_differentiable(), *(n for n in NO_GRAD if _is_op(n))}):
        rule = GRADIENTS.get(name)
        if rule is not None:
            ours = rule.op if rule.available else None
        else:
            ours = "no_grad" if name in NO_GRAD and name not in tvm_differentiable() else None
        rows.append((name, ours, name in tvm_differentiable()))
    return rows
