"""Binding a user's ``inputs``/``attrs`` to an op's YAML signature, with clear errors.

Everything a user can get wrong is caught here or in shape inference, before any kernel is built,
and every message names the op and the argument.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import rt
from .dtypes import dtype as as_dtype
from .infer_meta import TensorMeta
from .spec import OpSpec, Param

__all__ = ["BoundCall", "bind", "coerce_attr"]


@dataclass
class BoundCall:
    """A validated call: every tensor arg (array, list of arrays, TensorMeta or None) and every
    attribute (defaults filled in, types normalised)."""

    spec: OpSpec
    tensors: dict[str, Any]
    attrs: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)   # run-time choices, not YAML attributes

    @property
    def op(self) -> str:
        return self.spec.name

    @property
    def has_data(self) -> bool:
        """False when planning without data (a graph: tvmgrad.relax); data checks are skipped then."""
        return not any(isinstance(v, TensorMeta) for value in self.tensors.values()
                       for v in (value if isinstance(value, list) else [value]))

    def meta(self, name: str):
        """TensorMeta (or list of them, or None) of a tensor arg."""
        value = self.tensors[name]
        if value is None:
            return None
        if isinstance(value, list):
            return [_meta(v) for v in value]
        return _meta(value)

    def value(self, name: str):
        """A tensor's meta or an attribute's value, as InferMeta functions take them."""
        return self.attrs[name] if name in self.attrs else self.meta(name)


def _meta(value) -> TensorMeta:
    return value if isinstance(value, TensorMeta) else TensorMeta.of(value)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def coerce_attr(op: str, param: Param, value: Any) -> Any:
    """The attribute value in its canonical Python type, or TypeError naming op and attribute."""
    base = param.base_type

    def fail(expected: str):
        raise TypeError(f"{op}: attribute {param.name!r} ({param.type}) expects {expected}, "
                        f"got {type(value).__name__} {value!r}")

    if base in ("float", "double"):
        if not _is_real(value):
            fail("a real number")
        return float(value)
    if base in ("int", "int64_t"):
        if not _is_int(value):
            fail("an integer")
        return int(value)
    if base == "bool":
        if not isinstance(value, (bool, np.bool_)):
            fail("a bool")
        return bool(value)
    if base == "str":
        if not isinstance(value, str):
            fail("a string")
        return value
    if base == "Scalar":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if _is_int(value):
            return int(value)
        if _is_real(value):
            return float(value)
        fail("a number")
    if base == "DataType":
        try:
            return as_dtype(value).name
        except TypeError:
            fail("a dtype")
    if base in ("IntArray", "int[]", "int64_t[]"):
        if _is_int(value) and base == "IntArray":
            return (int(value),)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
            fail("a sequence of integers")
        return tuple(int(v) for v in value)
    if base in ("float[]", "double[]"):
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, (list, tuple)) or not all(_is_real(v) for v in value):
            fail("a sequence of numbers")
        return tuple(float(v) for v in value)
    if base == "str[]":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            fail("a sequence of strings")
        return tuple(value)
    if base == "bool[]":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (bool, np.bool_)) for v in value):
            fail("a sequence of bools")
        return tuple(bool(v) for v in value)
    raise TypeError(f"{op}: attribute {param.name!r} has type {param.type}, which tvmgrad cannot take")


def _as_array(op: str, name: str, value: Any, allow_meta: bool):
    """A tensor argument as the runtime holds it: a numpy array (numbers and lists become one), a
    ``rt.Foreign`` for any other array with ``__dlpack__`` (torch, paddle, jax, cupy, tvm_ffi; CPU
    or CUDA: its shape, dtype and device are read without converting it), or a TensorMeta."""
    if isinstance(value, TensorMeta):
        if not allow_meta:
            raise TypeError(f"{op}: input {name!r} must hold data (only no_need_buffer inputs "
                            f"may be given as a TensorMeta)")
        return value
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__"):
        try:
            return rt.Foreign(value)
        except TypeError as exc:
            raise TypeError(f"{op}: input {name!r}: {exc}") from None
        except (ValueError, BufferError, RuntimeError) as exc:
            raise ValueError(f"{op}: input {name!r} ({type(value).__name__}) cannot be read by "
                             f"DLPack: {exc}") from None
    elif isinstance(value, (numbers.Number, list, tuple)) or hasattr(value, "__array__"):
        arr = np.asarray(value)
    else:
        raise TypeError(f"{op}: input {name!r} must be an array (numpy, or any object with "
                        f"__dlpack__), got {type(value).__name__}")
    try:
        as_dtype(arr.dtype)
    except TypeError:
        raise TypeError(f"{op}: input {name!r} has dtype {arr.dtype}, which tvmgrad does not "
                        f"handle") from None
    return arr


OPTIONS = {
    # deterministic: scatter-type grads accumulate in a fixed order (bit-identical runs); False
    # allows atomics where a family has a faster racy path.
    "deterministic": True,
    # alias: grads that are a reshape of an input may return a view of it instead of a copy.
    "alias": False,
}


def bind(spec: OpSpec, inputs: dict | None, attrs: dict | None, *, metas_only: bool = False,
         **options) -> BoundCall:
    """Check names, presence and types; fill in attribute defaults.

    ``metas_only``: every tensor is a TensorMeta (planning a graph, e.g. tvmgrad.relax, where
    shapes may be symbolic and there is no data)."""
    op = spec.name
    if not isinstance(inputs or {}, dict) or not isinstance(attrs or {}, dict):
        raise TypeError(f"{op}: inputs and attrs must be dicts keyed by the YAML names")
    inputs = dict(inputs or {})
    attrs = dict(attrs or {})

    tensor_params = {p.name: p for p in spec.tensor_args}
    attr_params = {p.name: p for p in spec.attrs}
    for name in inputs:
        if name not in tensor_params:
            hint = " (it is an attribute: pass it in attrs)" if name in attr_params else ""
            raise ValueError(f"{op}: unknown input {name!r}{hint}; inputs are {list(tensor_params)}")
    for name in attrs:
        if name not in attr_params:
            hint = " (it is a tensor: pass it in inputs)" if name in tensor_params else ""
            raise ValueError(f"{op}: unknown attribute {name!r}{hint}; attributes are {list(attr_params)}")

    tensors: dict[str, Any] = {}
    for name, param in tensor_params.items():
        value = inputs.get(name)
        if value is None:
            if name not in spec.optional:
                raise ValueError(f"{op}: missing input {name!r}")
            tensors[name] = None
            continue
        allow_meta = metas_only or name in spec.no_need_buffer
        if param.is_tensor_list:
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"{op}: input {name!r} is a Tensor[]: pass a list of arrays")
            tensors[name] = [_as_array(op, f"{name}[{i}]", v, allow_meta) for i, v in enumerate(value)]
        else:
            if isinstance(value, (list, tuple)) and value and hasattr(value[0], "shape"):
                raise TypeError(f"{op}: input {name!r} is a single Tensor, got a list of arrays")
            tensors[name] = _as_array(op, name, value, allow_meta)

    bound_attrs: dict[str, Any] = {}
    defaults = spec.defaults
    for name, param in attr_params.items():
        if name in attrs and attrs[name] is not None:
            bound_attrs[name] = coerce_attr(op, param, attrs[name])
        elif name in defaults:
            bound_attrs[name] = defaults[name]
        else:
            raise ValueError(f"{op}: missing attribute {name!r} ({param.type}; it has no default)")
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"{op}: unknown option(s) {sorted(unknown)}; options are {sorted(OPTIONS)}")
    return BoundCall(spec, tensors, bound_attrs, {**OPTIONS, **options})
