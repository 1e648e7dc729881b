"""Example calls: a valid (inputs, attrs) call of every implemented op.

They feed everything that must exercise every op without knowing it: the generic tests (CUDA
builds, higher-order chains, in-place pairs), ``tvmgrad check --build`` and ahead-of-time libraries
(one kernel variant per example, plus every broadcast pattern of a pointwise op).

Pointwise ops get an example generically: every tensor input has the same shape, values are
normals kept away from the kinks at 0 and ±1 (``DOMAINS`` moves an input into its op's domain),
attributes take their YAML defaults or a neutral value of their type. Other ops register a factory
with ``@factory(op)`` in a module of this package (one per family; they are imported on first use).
"""

from __future__ import annotations

import numpy as np

from .. import registry

SHAPE = (4, 6)

# Inputs that must lie in a domain: op -> {input: (low, high)} (uniform); others are normals.
DOMAINS = {
    "acos_grad": {"x": (-0.9, 0.9)}, "asin_grad": {"x": (-0.9, 0.9)}, "atanh_grad": {"x": (-0.9, 0.9)},
    "acosh_grad": {"x": (1.2, 3.0)}, "log_grad": {"x": (0.3, 3.0)}, "log2_grad": {"x": (0.3, 3.0)},
    "log10_grad": {"x": (0.3, 3.0)}, "log1p_grad": {"x": (-0.5, 3.0)}, "log_double_grad": {"x": (0.3, 3.0)},
    "sqrt_grad": {"out": (0.3, 3.0)}, "sqrt_double_grad": {"out": (0.3, 3.0)},
    "rsqrt_grad": {"out": (0.3, 3.0)}, "rsqrt_double_grad": {"out": (0.3, 3.0)},
    "sigmoid_grad": {"out": (0.05, 0.95)}, "sigmoid_double_grad": {"out": (0.05, 0.95)},
    "sigmoid_triple_grad": {"out": (0.05, 0.95)}, "tanh_grad": {"out": (-0.95, 0.95)},
    "tanh_double_grad": {"out": (-0.95, 0.95)}, "tanh_triple_grad": {"out": (-0.95, 0.95)},
    "relu_grad": {"out": (0.1, 2.0)}, "relu6_grad": {"out": (0.1, 5.9)},
    "erfinv_grad": {"out": (-1.5, 1.5)}, "logit_grad": {"x": (0.05, 0.95)},
    "digamma_grad": {"x": (0.3, 5.0)}, "lgamma_grad": {"x": (0.3, 5.0)}, "gammaln_grad": {"x": (0.3, 5.0)},
    "polygamma_grad": {"x": (0.3, 5.0)}, "gammaincc_grad": {"x": (0.5, 3.0), "y": (0.5, 3.0)},
    "pow_grad": {"x": (0.3, 3.0)}, "pow_double_grad": {"x": (0.3, 3.0)}, "pow_triple_grad": {"x": (0.3, 3.0)},
    "reciprocal_grad": {"out": (0.3, 3.0)},
}

# Neutral values for required attributes (no default in the YAML), by attribute type.
ATTR_BY_TYPE = {"float": 0.5, "double": 0.5, "Scalar": 2.0, "int": 1, "int64_t": 1, "bool": False}
ATTRS = {"pow_grad": {"y": 2.5}, "pow_double_grad": {"y": 2.5},
         "pow_triple_grad": {"y": 2.5}, "softplus_grad": {"beta": 1.5, "threshold": 20.0},
         "softplus_double_grad": {"beta": 1.5, "threshold": 20.0}, "celu_grad": {"alpha": 1.2},
         "celu_double_grad": {"alpha": 1.2}, "elu_grad": {"alpha": 1.2}, "elu_double_grad": {"alpha": 1.2}}

FACTORIES = {}


def factory(op):
    def register(fn):
        FACTORIES[op] = fn
        return fn
    return register


@factory("prelu_grad")
def _prelu(rng):
    x = _away_from_kinks(rng.standard_normal((2, 3, 4)))
    return {"x": x, "alpha": rng.random((3,)), "out_grad": rng.standard_normal(x.shape)}, \
        {"mode": "channel", "data_format": "NCHW"}


@factory("swiglu_grad")
def _swiglu(rng):
    x = rng.standard_normal(SHAPE)
    return {"x": x, "y": rng.standard_normal(SHAPE), "out_grad": rng.standard_normal(SHAPE)}, {}


def np_dtype(name: str):
    """The numpy dtype of a tvmgrad dtype name (bfloat16 from ml_dtypes)."""
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def cast(value, dtype: str):
    """An example's float arrays (and lists of them) in ``dtype``, its complex arrays in the
    complex dtype of that precision (complex128 for float64, else complex64); index and bool
    arrays as they are."""
    if value is None:
        return None
    if isinstance(value, list):
        return [cast(v, dtype) for v in value]
    value = np.asarray(value)
    if value.dtype.kind == "f" or value.dtype == np_dtype("bfloat16"):
        return value.astype(np_dtype(dtype))
    if value.dtype.kind == "c":
        return value.astype(np.complex128 if dtype == "float64" else np.complex64)
    return value


def each_tensor(first, *others):
    """One tuple per tensor of an output, for checks that walk outputs: (first[i], other[i], ...)
    for a Tensor[] output (``first`` a list), else the one tuple (first, *others)."""
    if isinstance(first, list):
        return zip(first, *others)
    return [(first, *others)]


def float_dtypes(op: str) -> list[str]:
    """The real float dtypes ``op`` supports (of an invoke op: its forward op's)."""
    entry = registry.get(op)
    impl = entry.implementation
    return [d for d in ("float32", "float64", "float16", "bfloat16") if d in impl.dtypes]


def _away_from_kinks(x):
    """Shift values off the common kinks 0 and ±1 (finite differences need smooth points)."""
    x = np.where(np.abs(x) < 0.15, np.sign(x + 1e-9) * (0.15 + np.abs(x)), x)
    return np.where(np.abs(np.abs(x) - 1) < 0.1, x * 1.25, x)


def sample(op: str, seed: int = 0):
    """(inputs, attrs) of a valid float64 call of ``op``."""
    rng = np.random.default_rng(seed)
    if op in FACTORIES:
        return FACTORIES[op](rng)
    spec = registry.get(op).spec
    inputs = {}
    for p in spec.tensor_args:
        lo_hi = DOMAINS.get(op, {}).get(p.name)
        if lo_hi:
            inputs[p.name] = rng.uniform(*lo_hi, size=SHAPE)
        else:
            inputs[p.name] = _away_from_kinks(rng.standard_normal(SHAPE))
    attrs = {}
    defaults = spec.defaults
    for p in spec.attrs:
        if p.name in ATTRS.get(op, {}):
            attrs[p.name] = ATTRS[op][p.name]
        elif p.name not in defaults:
            attrs[p.name] = ATTR_BY_TYPE[p.base_type]
    return inputs, attrs


def broadcast_variant(op: str, seed: int = 0):
    """For a broadcasting binary op: the sample with its second broadcast input reduced to a row."""
    impl = registry.get(op).impl
    inputs, attrs = sample(op, seed)
    spec = registry.get(op).spec
    free = impl.broadcasting_inputs(spec) if hasattr(impl, "broadcasting_inputs") else set()
    names = [p.name for p in spec.tensor_args if p.name in free]
    if len(names) < 2:
        return None
    inputs = dict(inputs)
    second = np.asarray(inputs[names[1]])
    if second.ndim == 0:
        return None
    inputs[names[1]] = second[:1]                    # (1, n): broadcasts along dim 0
    return inputs, attrs


def implemented_ops(kind: str | None = None) -> list[str]:
    """Available backward ops (optionally of a family kind: pointwise, tensor, ...)."""
    out = []
    for op in registry.ops().values():
        if op.is_forward or not op.available:
            continue
        impl = op.implementation
        if kind is None or impl.family_kind == kind:
            out.append(op.name)
    return out


def _load_family_examples() -> None:
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_load_family_examples()
