"""tvmgrad kernels inside TVM Relax graphs.

* ``emit(bb, op, inputs, attrs)`` adds one tvmgrad op to the function a ``BlockBuilder`` is
  building: a ``call_tir`` to the op's PrimFunc, with the output types from our InferMeta. Dims that
  are Relax shape variables stay symbolic (one kernel serves every size, as in ``tvmgrad.run``).
* ``register_gradients()`` makes ``relax.transform.Gradient`` differentiate Relax ops with tvmgrad
  kernels: for each Relax op in ``GRADIENTS`` whose backward.yaml op is implemented, a gradient
  is registered above TVM's own (level 11; TVM registers at 10). Ops TVM has no gradient for
  (gelu, erf, rsqrt, square, clip, ...) become differentiable. Since a registration replaces TVM's
  gradient for every call of the op, forms a mapping does not cover (layouts, attributes, symbolic
  dims some planners cannot take) go to TVM's own gradient where it has one (``_tvm_fallback``),
  else raise NotImplementedError saying why.
* ``coverage()``: which Relax ops get tvmgrad gradients, next to the ones TVM differentiates itself.
"""

from .emit import emit, schedule_kernels
from .gradients import coverage, register_gradients
from .rules import GRADIENTS, RelaxGrad

__all__ = ["emit", "register_gradients", "schedule_kernels", "coverage", "GRADIENTS", "RelaxGrad"]
