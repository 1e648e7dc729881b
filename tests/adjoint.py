"""The adjoint identity ⟨A x, y⟩ = ⟨x, Aᵀ y⟩ that the tests of linear grads check (float64)."""

import numpy as np


def inner(a, b) -> float:
    """The real inner product Re Σ conj(a)·b in float64 (complex128 for complex data); a list or
    tuple of arrays (a Tensor[] argument) counts as one long vector."""
    if isinstance(a, (list, tuple)):
        return sum(inner(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return float(np.real(np.vdot(a.ravel(), b.ravel())))
    return float(np.sum(a.astype(np.float64) * b.astype(np.float64)))


def assert_adjoint(fwd, bwd, x, y, rtol=1e-12):
    """<fwd(x), y> == <x, bwd(y)> (float64)."""
    lhs, rhs = inner(fwd(x), y), inner(x, bwd(y))
    assert abs(lhs - rhs) <= rtol * max(1.0, abs(lhs), abs(rhs)), (lhs, rhs)
