"""``tvmgrad.run`` and the lower-level ``prepare``: validate, infer, fetch a kernel, call it.

Arrays cross into TVM by DLPack without copies: numpy arrays and any object with ``__dlpack__``
(torch, paddle, jax, cupy, tvm_ffi; on the host or a CUDA device; bfloat16 and complex
included). The outputs come back in the caller's framework on the caller's device: the framework
of the first tensor input (numpy in, numpy out; torch in, torch out; on a CUDA launch, the first
CUDA input's). Only non-contiguous arrays are copied (into a contiguous one), and host arrays
given to a CUDA target (copied to the device and back).

Layers, from the top:

* ``run`` keeps the bound plan of each *call signature* (op, attributes, options, target, and per
  tensor input its array type, dtype, shape and device): a repeated call skips binding, shape
  inference, planning and the kernel lookup, and goes straight to ``_Bound.execute``. Plans that
  read input *data* (index tensors whose values shape the kernel, data checks) are never reused:
  the first call plans with probing stand-ins that notice any use beyond shape and dtype.
* ``prepare`` returns a ``Launch``: the call bound to its compiled kernel; ``launch()`` runs it
  on the prepared arrays, ``launch(new_inputs)`` (or ``launch.run(new_inputs)``) on others of the
  same kind: same signature -> no checks beyond comparing it; new shapes -> shape inference and
  the planner's view rules again, and the same kernel (symbolic sizes), else a ValueError.
* ``_Bound``: a plan with everything precomputed that does not depend on the data (view shapes,
  storage dtypes, output metas, the output framework and device).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import threading

import numpy as np

from . import registry, rt, streaming, tuned
from .cache import KernelCache, default_cache
from .call import BoundCall
from .dtypes import DType, dtype as as_dtype
from .families.base import Plan
from .infer_meta import TensorMeta
from .planning import plan_call
from .targets import Resolved

__all__ = ["run", "prepare", "Launch", "clear_run_cache", "run_cache_info", "aligned_empty",
           "to_tvm", "ALIGN"]


ALIGN = 64     # TVM's default buffer alignment: what CUDA kernels, old AOT libraries and streamed outputs assume


def _element_aligned(target) -> int | None:
    """The buffer alignment a kernel of ``target`` compiled by this tvmgrad assumes: None for
    "the element size" (``build.BUFFER_ALIGNMENT``: CPU kernels), else a byte count."""
    return None if target.kind == "llvm" else ALIGN


# ------------------------------------------------------------------------------------------
# Call signatures

_NO = object()       # a value with no signature (a number, a list of numbers): never cached


def _sig(value):
    """What the plan of a call may depend on of one tensor argument: its array type, dtype,
    shape and device (never the data); _NO if it has none."""
    t = type(value)
    if t is np.ndarray:
        return (t, value.dtype, value.shape)
    if value is None:
        return None
    if t is list:
        sigs = tuple(_sig(v) for v in value)
        return _NO if _NO in sigs or None in sigs else (t, sigs)
    if t is rt.Foreign:
        return _NO if value.sig is None else value.sig
    if t is TensorMeta:
        return (t, value)
    if hasattr(value, "__dlpack__"):
        try:
            return rt.signature(value)
        except (TypeError, AttributeError, ValueError):
            return _NO
    return _NO


def _inputs_sig(inputs) -> tuple | None:
    if type(inputs) is not dict:
        return None
    sig = []
    for name, value in inputs.items():
        if value is None:
            continue
        s = _sig(value)
        if s is _NO:
            return None
        sig.append((name, s))
    return tuple(sig)


def _attr_key(value):
    t = type(value)
    if t is float:
        return (t, repr(value))                 # -0.0 and nan are their own keys
    if t is bool or t is int or t is str or value is None:
        return (t, value)
    if t is tuple or t is list:
        parts = tuple(_attr_key(v) for v in value)
        return _NO if _NO in parts else (t, parts)
    if isinstance(value, np.generic):
        return (t, repr(value))
    try:
        hash(value)
    except TypeError:
        return _NO
    return (t, value) if not isinstance(value, np.ndarray) else _NO


def _run_key(op, inputs, attrs, target, options):
    """The signature cache key of a ``run`` call, None when it has none (every part must be
    hashable and mean the same later: a dict target, a non-default cache are not cached)."""
    if type(op) is not str or type(target) is not str or "cache" in options:
        return None
    sig = _inputs_sig(inputs)
    if sig is None:
        return None
    if attrs:
        if type(attrs) is not dict:
            return None
        akey = tuple((k, _attr_key(v)) for k, v in attrs.items())
        if any(v is _NO for _, v in akey):
            return None
    else:
        akey = ()
    okey = tuple(sorted(options.items())) if options else ()
    cpu, arch, db_path = _key_environment()
    db = tuned._ACTIVE if tuned._ACTIVE is not None or not db_path else tuned.active_database()
    return (op, target, cpu, arch, db, akey, okey, sig)


_KEY_ENV = ("TVMGRAD_CPU", "TVMGRAD_CUDA_ARCH", "TVMGRAD_TUNING_DB")


def _key_environment_reader():
    """A function giving the variables a run key depends on ("llvm" means another CPU when
    $TVMGRAD_CPU changes, "cuda" another arch likewise; $TVMGRAD_TUNING_DB names the tuned
    database), as values to compare, not to use: the raw bytes of CPython's POSIX
    ``os.environ`` mapping's own dict where it has one (``os.environ.get`` encodes and decodes
    in Python, ~0.6 us a lookup: most of a cached ``run``'s key), else ``os.environ.get``'s."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and type(data) is dict and all(type(k) is bytes for k in data):
        keys = tuple(os.fsencode(k) for k in _KEY_ENV)
        return lambda: tuple(map(data.get, keys))
    return lambda: tuple(map(os.environ.get, _KEY_ENV))


_key_environment = _key_environment_reader()


class _RunCache:
    """A bounded LRU of bound plans by call signature (thread-safe)."""

    def __init__(self, size: int = 512):
        self.size = size
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.uncacheable = 0

    def get(self, key):
        item = self._items.get(key)
        if item is not None:
            self.hits += 1
        return item

    def put(self, key, bound) -> None:
        with self._lock:
            self._items[key] = bound
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = self.uncacheable = 0


_RUN_CACHE = _RunCache()


def clear_run_cache() -> None:
    """Forget every bound plan ``run`` keeps (kernels stay in the kernel cache)."""
    _RUN_CACHE.clear()


def run_cache_info() -> dict:
    """``run``'s signature cache: entries, hits, misses (planned calls), uncacheable calls."""
    c = _RUN_CACHE
    return {"entries": len(c._items), "hits": c.hits, "misses": c.misses,
            "uncacheable": c.uncacheable, "size": c.size}


# ------------------------------------------------------------------------------------------
# Plans kept by bound calls

def _no_make():
    raise RuntimeError("this plan's kernel is compiled already (a bound plan keeps no builder)")


def _stripped(plan: Plan) -> Plan:
    """The plan without its builders (closures that may hold the first call's arrays)."""
    if plan.make is None:
        return plan
    plain = None if plan.plain is None else _stripped(plan.plain)     # a streamed plan's twin
    return dataclasses.replace(plan, make=_no_make, make_static=None, plain=plain,
                               stream_variant=None)


# ------------------------------------------------------------------------------------------
# Arrays

def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ALIGN-byte boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def _storage_view(array: np.ndarray, dt: DType) -> np.ndarray:
    """The array in the storage dtype DLPack can name (bfloat16 as uint16, complex as pairs of
    reals: numpy views a 0-d array with another itemsize only once it has a dim)."""
    view = dt.dlpack_view
    if view is None:
        return array
    if array.ndim == 0 and np.dtype(view).itemsize != array.itemsize:
        return array.reshape(1).view(view)
    return array.view(view)


def _misaligned(array, align: int | None) -> bool:
    """Does a numpy array break the alignment a kernel assumes (None: its element size)?"""
    if not isinstance(array, np.ndarray) or array.size == 0:
        return False
    if align is None:
        return not array.flags.aligned
    return array.ctypes.data % align != 0


def to_tvm(array, shape, dt: DType, align: int | None = None):
    """A TVM tensor over a host array, viewed with ``shape`` in the storage dtype: zero-copy when
    the array is contiguous and aligned as the kernel assumes (``align``: None for its element
    size, as tvmgrad's CPU kernels assume; read-only arrays, e.g. ``np.load(..., mmap_mode='r')``,
    included), else via a contiguous (aligned) copy."""
    if isinstance(array, np.ndarray):
        if not array.flags.c_contiguous or _misaligned(array, align):
            copy = aligned_empty(array.shape, array.dtype) if align else np.empty_like(array, order="C")
            np.copyto(copy, array)
            array = copy
        tensor = _from_numpy(_storage_view(array, dt))
        size, own = array.size, array.shape
    else:
        tensor = rt.to_tensor(rt.contiguous(array))
        size, own = tensor.numel(), tuple(tensor.shape)
    shape = tuple(shape if shape is not None else own)
    if dt.lanes == 2:
        shape += (2,)
    if dt.dlpack_view is not None or tuple(tensor.shape) != shape or size == 0:
        # (a zero-size numpy array exports zero strides, which TVM calls non-compact)
        tensor = rt.create_view(tensor, shape, dt.storage)
    return tensor


def _from_numpy(array: np.ndarray):
    """A TVM tensor over a numpy array's memory, zero-copy, read-only arrays included.

    numpy exports a read-only array only as a *versioned* DLPack capsule (DLPack >= 1.0 carries
    a read-only flag); ``tvm_ffi.from_dlpack`` asks for the legacy one, which numpy refuses with
    a BufferError. Kernels never write their inputs (outputs are separate, writable buffers), so
    the capsule is requested explicitly. numpy < 2.1 has no versioned export: a read-only array
    is copied there, as the last resort (the copy is never written back)."""
    import tvm_ffi
    if array.flags.writeable:
        return tvm_ffi.from_dlpack(array, require_alignment=0)
    try:
        capsule = array.__dlpack__(max_version=(1, 0))
    except TypeError:                       # numpy without DLPack 1.0
        copy = np.empty_like(array, order="C")
        np.copyto(copy, array)
        capsule = copy.__dlpack__()
    return tvm_ffi.from_dlpack(capsule, require_alignment=0)


def _raw(value):
    return value.obj if type(value) is rt.Foreign else value


def _where(value) -> tuple[str, int]:
    """(HOST|CUDA, index) of an array."""
    if isinstance(value, np.ndarray):
        return rt.HOST, 0
    if type(value) is rt.Foreign:
        return value.device
    return rt.device_of(value)


def _same_memory(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.shares_memory(a, b)
    try:
        return rt.data_ptr(a) == rt.data_ptr(b)
    except Exception:  # noqa: BLE001
        return False


def _inplace_view(op: str, name: str, array, meta: TensorMeta, where):
    """The input buffer an in-place output is written into, viewed with the output's shape (for
    grads that reshape, e.g. flatten_grad); None when the sizes differ and it cannot hold it."""
    array = _raw(array)
    size = int(np.prod(meta.shape, dtype=np.int64))
    shape = rt.shape_of(array)
    if math.prod(shape) != size:
        return None
    if shape != meta.shape and rt.is_contiguous(array):
        array = rt.reshape(array, meta.shape)
    return _check_out(op, name, array, meta, where)


def _check_out(op: str, name: str, array, meta: TensorMeta, where=None):
    array = _raw(array)
    if not (isinstance(array, np.ndarray) or hasattr(array, "__dlpack__")):
        raise TypeError(f"{op}: output {name!r} must be an array (numpy, or any object with "
                        f"__dlpack__), got {type(array).__name__}")
    try:
        dt = as_dtype(array.dtype) if hasattr(array, "dtype") else as_dtype(str(rt.to_tensor(array).dtype))
    except TypeError:
        dt = None
    shape = rt.shape_of(array)
    swapped = not getattr(getattr(array, "dtype", None), "isnative", True)    # DLPack refuses it
    if shape != meta.shape or dt != meta.dtype or swapped:
        raise ValueError(f"{op}: output {name!r} must have shape {list(meta.shape)} and dtype "
                         f"{meta.dtype.name}, got {list(shape)} {getattr(array, 'dtype', '?')}")
    writable = array.flags.writeable if isinstance(array, np.ndarray) else True
    if not rt.is_contiguous(array) or not writable:
        raise ValueError(f"{op}: output {name!r} must be a writable C-contiguous array")
    if where is not None and _where(array) != where:
        raise ValueError(f"{op}: output {name!r} is on {_describe(_where(array))}, but this call "
                         f"computes on {_describe(where)}")
    return array


def _describe(where) -> str:
    return "the host" if where[0] == rt.HOST else f"{where[0]}:{where[1]}"


# ------------------------------------------------------------------------------------------
# The bound plan

# how an argument reaches the kernel: P (pass the array itself: tvm_ffi takes numpy and DLPack
# objects as they are), V (a view: another shape, or the storage dtype of bfloat16 numpy arrays,
# of complex arrays and of float8 arrays), S (scalar)
_PASS, _VIEW, _SCALAR = 0, 1, 2


class _Bound:
    """A plan bound to a call signature: what to pass to the kernel, per argument, and what to
    allocate, per output, computed once; ``execute`` does only what depends on the arrays."""

    def __init__(self, spec, plan: Plan, outputs: list, target, function, options: dict,
                 tensors: dict, align: int | None, data_free: bool):
        self.spec, self.plan, self.outputs, self.target = spec, plan, outputs, target
        self.function = function
        # numpy outputs: aligned where a streamed kernel may write them (it takes only aligned ones)
        self._empty = aligned_empty if isinstance(function, streaming.Streaming) else np.empty
        self.alias = bool(options.get("alias"))
        self.align = align
        self.data_free = data_free
        self.sig = _inputs_sig({k: v for k, v in tensors.items()})
        present = [(p.name, tensors.get(p.name)) for p in spec.tensor_args]
        arrays = []
        for name, value in present:
            for v in (value if isinstance(value, list) else [value]):
                if v is not None and not isinstance(v, TensorMeta):
                    arrays.append((name, v))
        cuda = [(n, v) for n, v in arrays if _where(v)[0] == rt.CUDA]
        if cuda:
            devices = {_where(v) for _, v in cuda}
            if len(devices) > 1:
                raise ValueError(f"{spec.name}: inputs are on several devices "
                                 f"({', '.join(sorted(map(_describe, devices)))})")
            if not target.is_gpu:
                n, v = cuda[0]
                raise ValueError(f"{spec.name}: input {n!r} is on {_describe(_where(v))} but the "
                                 f"target ({target.kind}) runs on the host: pass target='cuda', "
                                 f"or host arrays")
            self.where = _where(cuda[0][1])
            self.framework = rt.framework_of(cuda[0][1])
            self.mode = "device"               # the arrays stay on the GPU
        else:
            self.where = (rt.HOST, 0)
            self.framework = rt.framework_of(arrays[0][1]) if arrays else "numpy"
            self.mode = "copy" if target.is_gpu else "host"
        # a TVM tensor has no framework of its own to return: tvm_ffi tensors come back
        self.out_meta = {o.name: m for o, m in zip(spec.outputs, outputs)}
        self.recipe = []
        for a in plan.args:
            if a.kind == "scalar":
                self.recipe.append((_SCALAR, a.value, None, None, None))
                continue
            if a.kind == "input":
                value = tensors[a.name]
                value = value[a.index] if a.index is not None else value
                meta = value if isinstance(value, TensorMeta) else TensorMeta.of(value)
                fw = "meta" if isinstance(value, TensorMeta) else rt.framework_of(value)
            else:
                meta = self.out_meta[a.name]
                meta = meta[a.index] if a.index is not None else meta
                fw = self.framework
            dt = meta.dtype
            dims = tuple(a.shape if a.shape is not None else meta.shape)
            own = tuple(meta.shape)
            if dt.lanes == 2:
                dims += (2,)
            view = (dims != own or dt.lanes == 2 or math.prod(dims) == 0
                    or (fw == "numpy" or dt.viewed_from_every_framework)
                    and dt.dlpack_view is not None)
            self.recipe.append((_VIEW if view else _PASS, a.kind == "input", a.name, a.index,
                                (rt.shape(dims) if view else None, dims, dt)))
        self.simple = (self.mode == "host" and not plan.aliases)
        self._held = None                  # held_args' kept arguments
        self._direct = self._direct_outputs()
        # the arguments of a call without held inputs: scalars in place, arrays filled per call
        self._template = [e[1] if e[0] == _SCALAR else None for e in self.recipe]
        self._inputs = [(i, e) for i, e in enumerate(self.recipe) if e[0] != _SCALAR and e[1]]

    def _direct_outputs(self):
        """The common call's outputs, when every one is a numpy array the kernel writes as it is
        (a host call, numpy in, element alignment, no aliases, no Tensor[] outputs, no views):
        per output (name, (shape, numpy dtype) or None for an absent output, its argument
        positions); None otherwise (``execute`` takes the general path)."""
        if not self.simple or self.framework != "numpy" or self.align is not None \
                or self.function is None:
            return None
        direct = []
        for name, meta in self.out_meta.items():
            if isinstance(meta, list):
                return None
            places = [i for i, e in enumerate(self.recipe)
                      if e[0] != _SCALAR and not e[1] and e[2] == name]
            if any(self.recipe[i][0] != _PASS or self.recipe[i][3] is not None for i in places):
                return None
            direct.append((name, None if meta is None else (meta.shape, meta.dtype.numpy), places))
        return direct

    # -- outputs -------------------------------------------------------------------------------
    def _new(self, meta: TensorMeta):
        if self.mode == "device":
            return rt.allocate(self.framework, meta.shape, meta.dtype, self.where)
        if self.framework == "numpy":
            return self._empty(meta.shape, meta.dtype.numpy)
        return rt.allocate(self.framework, meta.shape, meta.dtype, (rt.HOST, 0))

    def _scratch(self, meta: TensorMeta):
        """An output buffer the kernel can take where the caller's is misaligned."""
        if self.mode == "device":
            return rt.allocate(self.framework, meta.shape, meta.dtype, self.where)
        return aligned_empty(meta.shape, meta.dtype.numpy)

    def _needs_scratch(self, buffer) -> bool:
        if self.mode == "copy":
            return False                     # copied to the device anyway
        if isinstance(buffer, np.ndarray):
            return _misaligned(buffer, self.align)
        align = self.align or 1
        return align > 1 and rt.data_ptr(buffer) % align != 0

    def execute(self, tensors: dict, out: dict | None = None, inplace: bool = False, *,
                held: bool = False) -> dict:
        """Run on ``tensors`` (``held``: a Launch's own prepared arrays, see ``held_args``)."""
        if self._direct is not None and not inplace:
            results = self._execute_direct(tensors, out, held)
            if results is not None:
                return results
        spec = self.spec
        results = {}
        if self.simple and not out and not inplace:
            for name, meta in self.out_meta.items():
                if meta is None:
                    results[name] = None
                elif isinstance(meta, list):
                    results[name] = [self._new(m) for m in meta]
                else:
                    results[name] = self._new(meta)
            if self.function is not None:
                args = self.held_args if held else self._args
                self.function(*args(tensors, results))
            return results

        given = dict(out or {})
        copy_back = {}
        if inplace:
            for src, dst in spec.inplace:
                meta = self.out_meta[dst]
                if dst in given or meta is None:
                    continue
                source = tensors[src]
                if isinstance(meta, list):          # a Tensor[] pair: element by element
                    buffer = [_inplace_view(spec.name, f"{dst}[{i}]", a, m, self.where)
                              for i, (a, m) in enumerate(zip(source, meta))]
                    buffer = None if any(b is None for b in buffer) else buffer
                else:
                    buffer = _inplace_view(spec.name, dst, source, meta, self.where)
                if buffer is None:
                    continue               # sizes differ (e.g. identity_loss_grad with a reduction)
                if self.plan.inplace_safe:
                    given[dst] = buffer
                else:                      # the kernel may read src after writing dst
                    copy_back[dst] = buffer
        where = self.where if self.mode != "copy" else (rt.HOST, 0)
        for o in spec.outputs:
            meta = self.out_meta[o.name]
            if meta is None:
                results[o.name] = None
            elif o.name in given and isinstance(meta, list):
                buffers = [_check_out(spec.name, f"{o.name}[{i}]", b, m, where)
                           for i, (b, m) in enumerate(zip(given[o.name], meta))]
                if self.function is not None and any(self._needs_scratch(b) for b in buffers):
                    copy_back[o.name] = buffers
                    buffers = [self._scratch(m) for m in meta]
                results[o.name] = buffers
            elif o.name in given:
                buffer = _check_out(spec.name, o.name, given[o.name], meta, where)
                if self.function is not None and self._needs_scratch(buffer):
                    copy_back[o.name] = buffer
                    buffer = self._scratch(meta)
                results[o.name] = buffer
            elif o.name in self.plan.aliases and self.alias:
                src, shape = self.plan.aliases[o.name]
                results[o.name] = rt.reshape(_host_or_raw(tensors[src]), shape)
            elif isinstance(meta, list):                       # a Tensor[] output
                results[o.name] = [self._new(m) for m in meta]
            else:
                results[o.name] = self._new(meta)
        for name, (src, shape) in self.plan.aliases.items():
            data = rt.reshape(_host_or_raw(tensors[src]), shape)
            if results[name] is not None and not _same_memory(results[name], data):
                rt.copy_into(results[name], data)
        if self.function is not None:
            if self.mode == "copy":
                self._call_copying(tensors, results)
            else:
                self._invoke(self._args(tensors, results))
        for name, buffer in copy_back.items():
            for dst, computed in (zip(buffer, results[name]) if isinstance(buffer, list)
                                  else [(buffer, results[name])]):
                rt.copy_into(dst, computed)
            results[name] = buffer
        return results

    def _execute_direct(self, tensors: dict, out: dict | None, held: bool) -> dict | None:
        """``execute`` for ``_direct`` outputs: new numpy arrays, or the caller's ``out`` arrays
        where each is one the kernel writes as it is (else None, before any work: the general
        path checks them and raises, or computes through scratch buffers)."""
        if out and type(out) is not dict:
            return None
        if held:
            args = list(self._held_template(tensors))
            fill = self._held_inputs
        else:
            args = list(self._template)
            fill = self._inputs
        results = {}
        for name, alloc, places in self._direct:
            if alloc is None:
                results[name] = None
                continue
            buffer = out.get(name, _NO) if out else _NO
            if buffer is _NO:
                buffer = self._empty(alloc[0], alloc[1])
            elif not (type(buffer) is np.ndarray and buffer.shape == alloc[0]
                      and buffer.dtype == alloc[1] and _direct_flags(buffer.flags)):
                return None
            results[name] = buffer
            for i in places:
                args[i] = buffer
        for i, entry in fill:
            # _recipe_value and _arg's first case, inline: calling _recipe_value cost ~0.2 us an input
            value = tensors[entry[2]]
            if entry[3] is not None:
                value = value[entry[3]]
            # (a numpy array the kernel takes as it is)
            args[i] = (value if type(value) is np.ndarray and entry[0] == _PASS
                       and _direct_flags(value.flags) else self._arg(entry, value))
        self.function(*args)
        return results

    # -- arguments -----------------------------------------------------------------------------
    def _args(self, tensors: dict, results: dict) -> list:
        args = []
        for entry in self.recipe:
            if entry[0] == _SCALAR:
                args.append(entry[1])              # (the scalar's value)
                continue
            args.append(self._arg(entry, _recipe_value(entry, tensors, results)))
        return args

    def _arg(self, entry, value):
        """The kernel argument for one array of the recipe."""
        how, view = entry[0], entry[4]
        t = type(value)
        if t is rt.Foreign:
            value = value.obj
            t = type(value)
        if t is np.ndarray:
            flags = value.flags
            if (how == _PASS and flags.c_contiguous and flags.writeable
                    and (flags.aligned if self.align is None else value.ctypes.data % self.align == 0)):
                return value
            return to_tvm(value, view[1][:len(view[1]) - (view[2].lanes == 2)], view[2], self.align)
        device = self.mode == "device"
        if device and _where(value)[0] == rt.HOST:
            return _to_device(value, view, self.where)
        return _foreign_arg(value, how, view, self.align if device else None)

    def held_args(self, tensors: dict, results: dict) -> list:
        """``_args`` for a Launch's own prepared arrays (the same objects every call): an input
        the kernel takes as it is (a numpy array passed whole) is kept as a TVM tensor over its
        memory (no DLPack export per call); the outputs, new each call, and inputs that need a
        copy or a view made (strided, half or complex arrays) are converted each call."""
        args = list(self._held_template(tensors))
        for i, entry in enumerate(self.recipe):
            if args[i] is None:
                args[i] = self._arg(entry, _recipe_value(entry, tensors, results))
        return args

    def _held_template(self, tensors: dict) -> list:
        """``held_args``' kept arguments (made on the first call): the scalars and held inputs in
        place, None where an argument is converted per call (``_held_inputs``: those inputs)."""
        if self._held is None:
            import tvm_ffi
            held = list(self._template)
            for i, entry in self._inputs:
                value = self._arg(entry, _recipe_value(entry, tensors, {}))
                held[i] = tvm_ffi.from_dlpack(value) if type(value) is np.ndarray else None
            self._held_inputs = [(i, e) for i, e in self._inputs if held[i] is None]
            self._held = held
        return self._held

    def _invoke(self, args: list) -> None:
        """Call the kernel; a device-resident call runs on the caller's current stream (torch's
        ``torch.cuda.current_stream()``, cupy's), set as tvm_ffi's stream for the device."""
        if self.mode == "device":
            stream = rt.current_stream(self.framework, self.where[1])
            if stream is not None:
                import tvm_ffi
                with tvm_ffi.use_raw_stream(rt.device("cuda", self.where[1]), stream):
                    self.function(*args)
                return
        self.function(*args)

    def _call_copying(self, tensors: dict, results: dict) -> None:
        """Host arrays, a CUDA kernel: copy in, run, copy the outputs back (synchronously)."""
        dev = rt.device("cuda", 0)
        args, copies = [], []
        for how, is_input, name, index, view in self.recipe:
            if how == _SCALAR:
                args.append(is_input)
                continue
            host = tensors[name] if is_input else results[name]
            if index is not None:
                host = host[index]
            tensor = _to_device(host, view, (rt.CUDA, 0))
            args.append(tensor)
            if not is_input:
                copies.append((tensor, host, view[2]))
        self.function(*args)
        rt.sync(dev)
        for tensor, host, dt in copies:
            if isinstance(host, np.ndarray):
                rt.to_host(tensor, _storage_view(host, dt))
            else:
                rt.copy(tensor, rt._storage_tensor(host, dt))
                rt.sync(dev)


def _direct_flags(flags) -> bool:
    """May the kernel write a numpy array of the right shape and dtype as it is?"""
    return flags.c_contiguous and flags.writeable and flags.aligned


def _host_or_raw(value):
    return _raw(value)


def _foreign_arg(value, how, view, align: int | None):
    """A DLPack array as a kernel argument: itself when tvm_ffi can take it as it is (contiguous,
    the kernel's shape and dtype), else a zero-copy view; a contiguous copy only when it is not
    contiguous, an aligned one when it breaks the kernel's alignment (``align``: CUDA)."""
    fw = rt.framework_of(value)
    if fw == "torch":
        if value.requires_grad:
            value = value.detach()
        if not value.is_contiguous():
            value = value.contiguous()
        if align and value.numel() and value.data_ptr() % align:
            value = value.clone()           # torch's allocator aligns to 512 bytes
        if how == _PASS:
            return value
        tensor = rt.to_tensor(value)
    else:
        tensor = rt.to_tensor(value)
        if not tensor.is_contiguous():
            tensor = rt.to_tensor(rt.contiguous(value))
        if align and tensor.numel() and tensor.data_ptr() % align:
            fresh = rt.empty(tuple(tensor.shape), str(tensor.dtype), tensor.device)
            rt.copy(tensor, fresh)
            tensor = fresh
        if how == _PASS:
            return tensor
    return rt.create_view(tensor, view[1], view[2].storage)


def _to_device(host, view, where):
    """A new device tensor holding a host array (numpy or another framework's), with the
    kernel's shape and storage dtype."""
    dt = view[2]
    if not isinstance(host, np.ndarray):
        host = np.asarray(rt.Foreign(host))
    host = np.ascontiguousarray(host)
    return rt.to_device(_storage_view(host, dt), view[1], dt.storage, rt.device("cuda", where[1]))


# ------------------------------------------------------------------------------------------
# Launch

class Launch:
    """A validated call bound to its compiled kernel.

    ``launch()`` runs it on the prepared arrays; ``launch(inputs)`` / ``launch.run(inputs)`` on
    new arrays of the same op and attributes: with the same signature (array types, dtypes,
    shapes, devices) nothing is checked again beyond comparing it; other shapes go through shape
    inference and the planner's view rules again and must map onto this launch's kernel (its
    sizes are symbolic; a ValueError otherwise). ``out`` may supply output arrays (contiguous,
    right shape, dtype and device), ``inplace`` writes each YAML ``inplace`` output into its
    input's buffer. Outputs are new arrays of the caller's framework on the caller's device.
    """

    def __init__(self, op: "registry.Op", call: BoundCall, plan: Plan, outputs: list, target,
                 function, *, alignment: int | None | str = "auto", data_free: bool = False):
        self.op, self.call, self.plan, self.outputs = op, call, plan, outputs
        self.target, self.function = target, function
        self.alignment = _element_aligned(target) if alignment == "auto" else alignment
        self.data_free = data_free
        self._bound = None
        self._others: dict = {}            # other signatures this launch has run: their _Bound

    def bound(self) -> _Bound:
        if self._bound is None:
            self._bound = _Bound(self.op.spec, _stripped(self.plan), self.outputs, self.target,
                                 self.function, self.call.options, self.call.tensors,
                                 self.alignment, self.data_free)
        return self._bound

    def __call__(self, inputs: dict | None = None, out: dict | None = None, *,
                 inplace: bool = False) -> dict:
        """Run the kernel (on ``inputs`` if given, else the prepared arrays)."""
        if inputs is None:
            return self.bound().execute(self.call.tensors, out, inplace, held=True)
        return _run_bound(self._bound_for(inputs), inputs, out, inplace)

    def run(self, inputs: dict | None = None, *, out: dict | None = None,
            inplace: bool = False) -> dict:
        """``launch(inputs, out, inplace=...)``."""
        return self(inputs, out, inplace=inplace)

    def _bound_for(self, inputs: dict) -> _Bound:
        bound = self.bound()
        sig = _inputs_sig(inputs)
        if sig is not None and self.data_free:
            if sig == bound.sig:
                return bound
            other = self._others.get(sig)
            if other is not None:
                return other
        # new shapes (or a plan that reads data): InferMeta and the planner again (a library's
        # launch: its prebuilt kernels, never a tuned variant)
        spec = self.op.spec
        planned = plan_call(self.op, inputs, self.call.attrs, probe=sig is not None,
                            target=self.target if isinstance(self.target, Resolved) else None,
                            **self.call.options)
        call, plan, outs, data_free = planned.call, planned.plan, planned.outputs, planned.data_free
        if plan.variant_key != self.plan.variant_key:
            raise ValueError(f"{spec.name}: these inputs need kernel variant {plan.variant_key}, "
                             f"not this launch's {self.plan.variant_key}: prepare a new launch "
                             f"for them")
        new = _Bound(spec, _stripped(plan), outs, self.target, self.function, call.options,
                     call.tensors, self.alignment, data_free)
        if data_free and sig is not None:
            if len(self._others) >= 64:
                self._others.clear()
            self._others[sig] = new
            return new
        # a plan that read the data: run on the bound arrays (the planner may have replaced some)
        new._tensors = call.tensors
        return new

    def __repr__(self) -> str:
        return f"<Launch {self.op.name} {self.plan.symbol}>"


def _recipe_value(entry, tensors: dict, results: dict):
    """The array a recipe entry of an input or output names (a Tensor[] element by index)."""
    _, is_input, name, index = entry[:4]
    value = tensors[name] if is_input else results[name]
    return value if index is None else value[index]


def _run_bound(bound: _Bound, tensors, out, inplace) -> dict:
    tensors = getattr(bound, "_tensors", tensors)
    return bound.execute(tensors, out, inplace)


# ------------------------------------------------------------------------------------------
# prepare / run

def prepare(op: str, inputs: dict | None, attrs: dict | None = None, *, target="llvm",
            cache: KernelCache | None = None, **options) -> Launch:
    """Validate a call, infer its outputs and fetch (or build) its kernel: a ``Launch``.

    Inputs: numpy arrays, or any array with ``__dlpack__`` (torch, paddle, jax, cupy; host or
    CUDA). Options: ``deterministic`` (default True: scatter-type grads accumulate in a fixed
    order; False allows atomics where faster) and ``alias`` (default False: grads that are a
    reshape of an input may return a view of it)."""
    return _prepare(op, inputs, attrs, target, cache, options)


def _prepare(op, inputs, attrs, target, cache, options, probe: bool = True) -> Launch:
    p = plan_call(op, inputs, attrs, target=target, probe=probe, **options)
    tgt = p.target
    tgt.check_runs_here(op)
    if tgt.is_gpu and not rt.cuda_available():
        raise RuntimeError(f"{op}: target {tgt.kind} needs a CUDA driver and GPU, and this machine "
                           f"has none (CUDA kernels can still be built: tvmgrad build --target cuda)")
    function = None
    if p.plan.make is not None:
        cache = cache or default_cache
        function = cache.get(p.plan, p.entry.impl, tgt).function
        if p.plan.stream:              # with its ordinary twin, for outputs not in memory yet
            plain = cache.get(p.plan.plain, p.entry.impl, tgt).function
            outputs = [i for i, a in enumerate(p.plan.args) if a.kind == "output"]
            function = streaming.Streaming(plain, function, outputs, streaming.min_bytes() or 0,
                                           ALIGN, p.plan.baked)
    return Launch(p.entry, p.call, p.plan, p.outputs, tgt, function, data_free=p.data_free)


def run(op: str, inputs: dict | None, attrs: dict | None = None, *, target="llvm",
        inplace: bool = False, cache: KernelCache | None = None, **options) -> dict:
    """Run backward op ``op``: inputs and attrs keyed by the YAML names, outputs likewise.

    Inputs may be numpy arrays or any array with ``__dlpack__`` (torch, paddle, jax, cupy; on the
    host or, with ``target="cuda"``, on a CUDA device, where they stay); the outputs are arrays
    of the first tensor input's framework on its device.

    ``inplace=True`` honours the YAML ``inplace`` pairs: the output is written into the
    input's array, which must be a writable contiguous array of the output's dtype and size (it is
    viewed with the output's shape); a pair whose sizes differ is computed out of place.
    ``deterministic``, ``alias`` and ``cache`` (a KernelCache; default the user's) are passed to
    ``prepare``.

    A repeated call with the same signature (op, attributes, options, target and, per tensor,
    array type, dtype, shape and device) reuses the bound plan of the first: no binding, shape
    inference, planning or kernel lookup (``run_cache_info()``; ``clear_run_cache()``).
    """
    key = _run_key(op, inputs, attrs, target, options) if cache is None else None
    if key is not None:
        bound = _RUN_CACHE.get(key)
        if bound is not None:
            return _run_bound(bound, inputs, None, inplace)
        _RUN_CACHE.misses += 1
    else:
        _RUN_CACHE.uncacheable += 1
    launch = _prepare(op, inputs, attrs, target, cache, options, probe=key is not None)
    bound = launch.bound()
    if key is not None and launch.data_free:
        _RUN_CACHE.put(key, bound)
    return _run_bound(bound, launch.call.tensors, None, inplace)
