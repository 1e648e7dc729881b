"""The dtype layer: how a user's array dtype is stored in a TVM buffer and computed in TE.

One place decides that half types compute in float32, that bfloat16 crosses DLPack as uint16, that
complex numbers (which TVM lacks) are stored as a trailing pair of reals and that float8 is stored
as its uint8 bit pattern. Kernels and the runtime ask this module; nobody else special-cases a
dtype.

float8 (``FLOAT8``: e4m3fn, e5m2) is storage only: Paddle registers it for grads that move data
(reshapes, views, gathers, concat), never for arithmetic. Its kernels are the uint8 kernels (a copy,
a select against 0 and a zero fill are exact on bit patterns: +0.0 is 0x00 in both formats), and
numpy/torch cannot export float8 over DLPack, so the runtime passes uint8 views. No dtype tuple
here includes it: an op accepts float8 only by listing ``FLOAT8`` in its ``dtypes``, which it may
do only if its kernels never compute on elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["DType", "dtype", "FLOATS", "HALF", "FLOAT8", "COMPLEX", "INTS", "ALL_INTS",
           "is_integer"]


@dataclass(frozen=True)
class DType:
    name: str             # user-facing name, numpy spelling ("bfloat16", "complex64", "int64")
    numpy: np.dtype       # numpy dtype of the user's array
    storage: str          # TVM dtype of a buffer element
    lanes: int            # 2 for complex (a trailing dim of real/imag pairs), else 1
    compute: str          # TVM dtype the math runs in
    kind: str             # "float", "complex", "int", "bool", "float8" (storage only)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def dlpack_view(self) -> np.dtype | None:
        """numpy dtype to view the array as before DLPack export (numpy can't export bfloat16 or
        float8)."""
        if self.name == "bfloat16":
            return np.dtype(np.uint16)
        return np.dtype(self.storage) if self.lanes == 2 or self.kind == "float8" else None

    @property
    def viewed_from_every_framework(self) -> bool:
        """Do DLPack arrays of every framework (not only numpy's) reach a kernel viewed in the
        storage dtype? float8's do: torch and paddle export float8, its kernels take uint8."""
        return self.kind == "float8"

    def __str__(self) -> str:
        return self.name


_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")     # numpy dtypes from ml_dtypes


def _make(name, storage=None, lanes=1, compute=None, kind="float"):
    npd = np.dtype(getattr(ml_dtypes, name)) if name in _ML_DTYPES else np.dtype(name)
    storage = storage or name
    return DType(name, npd, storage, lanes, compute or storage, kind)


_ALL = {
    "float16": _make("float16", compute="float32"),
    "bfloat16": _make("bfloat16", compute="float32"),
    "float32": _make("float32"),
    "float64": _make("float64"),
    "complex64": _make("complex64", storage="float32", lanes=2, kind="complex"),
    "complex128": _make("complex128", storage="float64", lanes=2, kind="complex"),
    "bool": _make("bool", kind="bool"),
    "int8": _make("int8", kind="int"),
    "uint8": _make("uint8", kind="int"),
    "int16": _make("int16", kind="int"),
    "int32": _make("int32", kind="int"),
    "int64": _make("int64", kind="int"),
    "float8_e4m3fn": _make("float8_e4m3fn", storage="uint8", kind="float8"),
    "float8_e5m2": _make("float8_e5m2", storage="uint8", kind="float8"),
}

FLOATS = ("float32", "float64", "float16", "bfloat16")
HALF = ("float16", "bfloat16")
COMPLEX = ("complex64", "complex128")
INTS = ("int32", "int64")
ALL_INTS = ("int8", "uint8", "int16", "int32", "int64")
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")     # storage only: for ops that never compute (above)


def is_integer(name: str) -> bool:
    """An integer or bool TVM dtype name (its kernels compute in C++ integer arithmetic)."""
    return name.startswith(("int", "uint", "bool"))


_BY_KEY: dict = {}          # dtype objects seen before (numpy, torch, paddle, tvm_ffi, names) -> DType

# other spellings of our dtype names: torch/paddle print theirs with a prefix (torch.float32,
# paddle.bfloat16), DLPack/tvm_ffi and TVM use bare names, torch has aliases
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "cfloat": "complex64",
            "cdouble": "complex128", "long": "int64", "int": "int32", "short": "int16",
            "uint1": "bool"}


def dtype(x) -> DType:
    """The DType of a name, a dtype object (numpy, ml_dtypes, torch, paddle, jax, cupy, tvm_ffi),
    a DType, or an array of any of those frameworks."""
    if isinstance(x, DType):
        return x
    try:
        return _BY_KEY[x]
    except (KeyError, TypeError):          # unseen, or unhashable (a numpy array)
        pass
    key = x
    if hasattr(x, "dtype") and not isinstance(x, (np.dtype, type)):
        x = x.dtype
        key = None                         # never memoise an array, only dtype objects
        if isinstance(x, DType):
            return x
        try:
            return _BY_KEY[x]
        except (KeyError, TypeError):
            key = x
    try:
        name = np.dtype(x).name
    except TypeError:
        name = str(x)
    if name not in _ALL:
        name = name.rpartition(".")[2]     # torch.bfloat16, paddle.float32
        name = _ALIASES.get(name, name)
    if name not in _ALL:
        raise TypeError(f"unsupported dtype {str(x)!r}; tvmgrad handles {sorted(_ALL)}")
    result = _ALL[name]
    if key is not None:
        try:
            _BY_KEY[key] = result
        except TypeError:
            pass
    return result


def to_compute(value, dt: DType):
    """A loaded element in the compute dtype.

    bfloat16 widens by bit shift: TVM 0.27's LLVM bf16 legalisation turns a bf16 load inside a
    ``Let`` value into a numeric uint16 -> float conversion (garbage); the shift is exact on every
    target.
    """
    from tvm import tirx
    if dt.name == "bfloat16":
        bits = tirx.reinterpret("uint16", value).astype("uint32") << tirx.const(16, "uint32")
        return tirx.reinterpret("float32", bits)
    return value if dt.storage == dt.compute else value.astype(dt.compute)
