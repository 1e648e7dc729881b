"""Op families: the shared machinery that turns a short TE definition into kernels."""

from .base import Arg, OpError, OpImpl, Plan
from .pointwise import pointwise
from .tensor import tensor_op

__all__ = ["Arg", "OpError", "OpImpl", "Plan", "pointwise", "tensor_op"]
