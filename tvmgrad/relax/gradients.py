"""Registering the rules with Relax's Gradient pass, and the coverage next to TVM's own."""

from __future__ import annotations

from .. import registry
from .emit import emit
from .rules import GRADIENTS, RelaxGrad
from .tvm_own import tvm_differentiable

__all__ = ["register_gradients", "coverage"]


LEVEL = 11            # above TVM's own gradients (registered at level 10)
_registered: dict[str, str] = {}


def _make_gradient(relax_op: str, rule: RelaxGrad, target):
    def gradient(orig_var, orig_call, output_grad, ctx):
        from tvm import relax
        if rule.custom is not None:
            return rule.custom(ctx, orig_call, orig_var, output_grad, target)
        grads = emit(ctx, rule.op, rule.inputs(orig_call, orig_var, output_grad), rule.attrs(orig_call),
                     target=target)
        grads = grads if isinstance(grads, tuple) else (grads,)
        by_name = dict(zip(registry.get(rule.op).spec.output_names, grads))
        out = []
        for arg, name in zip(orig_call.args, rule.results):
            if name is None:
                out.append(relax.op.zeros_like(arg) if isinstance(arg.ty, relax.TensorType)
                           else relax.op.zeros(relax.ShapeExpr([]), "float32"))
            else:
                out.append(by_name[name])
        return out
    gradient.__name__ = f"tvmgrad_{relax_op.replace('.', '_')}_grad"
    return gradient


def register_gradients(target=None) -> dict[str, str]:
    """Register tvmgrad-backed gradients for every mapped Relax op whose backward.yaml op is
    implemented; returns {relax op: backward op}. Idempotent (TVM allows one override)."""
    from tvm.relax.op.base import register_gradient
    tvm_differentiable()                 # remember TVM's own set before shadowing it
    for relax_op, rule in GRADIENTS.items():
        if relax_op in _registered or not registry.get(rule.op).available:
            continue
        register_gradient(relax_op, _make_gradient(relax_op, rule, target), level=LEVEL)
        _registered[relax_op] = rule.op
    return dict(_registered)


def coverage() -> list[tuple[str, str | None, bool]]:
    """(relax op, tvmgrad backward op or None, has TVM's own gradient) for every Relax op that
    either tvmgrad or TVM differentiates."""
    rows = []
    for name in sorted({*GRADIENTS, *tvm_differentiable()}):
        rule = GRADIENTS.get(name)
        ours = rule.op if rule is not None and registry.get(rule.op).available else None
        rows.append((name, ours, name in tvm_differentiable()))
    return rows
