"""The Relax ops TVM differentiates itself (read before tvmgrad's registrations shadow them)."""

from __future__ import annotations

import functools

__all__ = ["tvm_differentiable"]


@functools.cache
def tvm_differentiable() -> frozenset[str]:
    """Relax ops for which TVM itself registers a gradient; read once, before ours shadow them."""
    import tvm
    from tvm.relax.op import _op_gradient  # noqa: F401 - registers TVM's gradients
    found = set()
    for name in _all_relax_ops():
        try:
            op = tvm.ir.Op.get(name)
        except Exception:  # noqa: BLE001 - a global function that is not an op
            continue
        if op.get_attr("FPrimalGradient") is not None:
            found.add(name)
    return frozenset(found)


def _all_relax_ops() -> list[str]:
    import tvm_ffi
    return sorted({"relax." + n[len("relax.op."):] for n in tvm_ffi.registry.list_global_func_names()
                   if n.startswith("relax.op.")})
