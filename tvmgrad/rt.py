"""The TVM *runtime* without the TVM compiler: what calling a compiled kernel needs.

``import tvm`` loads the whole compiler. Calling kernels needs only ``tvm_ffi`` and
``libtvm_runtime.so`` (plus ``libtvm_runtime_cuda.so`` for CUDA), whose global functions create
views, allocate device memory and copy. Everything the runtime and ahead-of-time libraries do with
tensors goes through here, so a process that only loads libraries never imports ``tvm``.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os

import numpy as np

__all__ = ["load_runtime", "load_module", "create_view", "device", "to_device", "to_host",
           "cuda_available", "empty", "copy", "shape", "Foreign", "is_foreign", "framework_of",
           "wrap", "shape_of", "is_contiguous", "data_ptr", "HOST", "CUDA"]


def _tvm_lib_dir() -> str:
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the apache-tvm package is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


@functools.cache
def load_runtime(cuda: bool = False) -> None:
    """dlopen libtvm_runtime (and the CUDA runtime) globally; idempotent."""
    ctypes.CDLL(os.path.join(_tvm_lib_dir(), "libtvm_runtime.so"), mode=ctypes.RTLD_GLOBAL)
    if cuda:
        try:
            ctypes.CDLL(os.path.join(_tvm_lib_dir(), "libtvm_runtime_cuda.so"), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise RuntimeError(f"the TVM CUDA runtime does not load here (no CUDA driver?): {exc}") from None


@functools.cache
def cuda_available() -> bool:
    try:
        load_runtime(cuda=True)
    except RuntimeError:
        return False
    return True


@functools.cache
def _global(name: str):
    import tvm_ffi
    load_runtime()
    return tvm_ffi.get_global_func(name)


def load_module(path: str):
    import tvm_ffi
    load_runtime()
    return tvm_ffi.load_module(path)


@functools.lru_cache(maxsize=4096)
def shape(dims: tuple):
    """A ``tvm_ffi.Shape`` (building one costs microseconds: views of a launch reuse theirs)."""
    import tvm_ffi
    return tvm_ffi.Shape([int(d) for d in dims])


def create_view(tensor, dims, dtype: str):
    """A view of a contiguous tensor with another shape and/or dtype of the same byte size."""
    dims = tuple(dims) if not isinstance(dims, tuple) else dims
    return _global("runtime.TVMTensorCreateView")(tensor, shape(dims), dtype, 0)


def empty(dims, dtype: str, dev):
    """A new uninitialised TVM tensor (TVM's allocator: 64-byte aligned) on ``dev``."""
    import tvm_ffi
    return _global("runtime.TVMTensorAllocWithScope")(shape(tuple(dims)), tvm_ffi.dtype(dtype), dev, None)


def copy(src, dst) -> None:
    """Copy between two contiguous TVM tensors of the same byte size (any devices)."""
    _global("runtime.TVMTensorCopyFromTo")(src, dst)


def device(kind: str, index: int = 0):
    import tvm_ffi
    return tvm_ffi.device(kind, index)


def to_device(host: np.ndarray, shape, dtype: str, dev):
    """Copy a contiguous host array into a new device tensor of ``shape`` and TVM ``dtype``."""
    import tvm_ffi
    host = np.ascontiguousarray(host)
    tensor = _global("runtime.TVMTensorAllocWithScope")(
        tvm_ffi.Shape([int(d) for d in shape]), tvm_ffi.dtype(dtype), dev, None)
    if host.nbytes:
        _global("runtime.TVMTensorCopyFromBytes")(tensor, host.ctypes.data_as(ctypes.c_void_p), host.nbytes)
    return tensor


def to_host(tensor, out: np.ndarray) -> None:
    """Copy a device tensor into a contiguous host array of the same byte size."""
    if out.nbytes:
        _global("runtime.TVMTensorCopyToBytes")(tensor, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)


def sync(dev) -> None:
    _global("runtime.Device_StreamSync")(dev, None)


# ------------------------------------------------------------------------------------------
# Arrays of other frameworks, by DLPack

HOST, CUDA = "cpu", "cuda"
_DL_HOST = (1, 3)              # kDLCPU, kDLCUDAHost (pinned host memory)
_DL_CUDA = (2, 13)             # kDLCUDA, kDLCUDAManaged


def is_foreign(value) -> bool:
    """An array tvmgrad takes by DLPack: not a numpy array, but it exports ``__dlpack__``."""
    return not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__")


@functools.lru_cache(maxsize=None)
def _framework_of_type(cls) -> str:
    root = cls.__module__.partition(".")[0]
    return {"jaxlib": "jax"}.get(root, root)


def framework_of(value) -> str:
    """The framework an array belongs to: "numpy", "torch", "paddle", "jax", "cupy", "tvm_ffi"
    (tvm_ffi and tvm tensors) or the root module of its type."""
    if isinstance(value, Foreign):
        return value.framework
    if isinstance(value, np.ndarray):
        return "numpy"
    name = _framework_of_type(type(value))
    return "tvm_ffi" if name == "tvm" else name


def _dl_device(value) -> tuple[str, int]:
    """(HOST or CUDA, index) of a DLPack producer (ValueError for another kind of device)."""
    kind, index = value.__dlpack_device__()
    kind = int(kind)
    index = int(index or 0)
    if kind in _DL_HOST:
        return HOST, 0
    if kind in _DL_CUDA:
        return CUDA, index
    raise ValueError(f"arrays on DLPack device type {kind} are not supported (only host and CUDA)")


def device_of(value) -> tuple[str, int]:
    """(HOST or CUDA, index) of a DLPack array (torch: without asking DLPack)."""
    if _framework_of_type(type(value)) == "torch":
        index = value.get_device()
        return (HOST, 0) if index < 0 else (CUDA, index)
    return _dl_device(value)


def signature(value) -> tuple:
    """What a plan may depend on of a DLPack array: (type, dtype, shape, device); TypeError if
    it is not hashable."""
    t = type(value)
    if _framework_of_type(t) == "torch":
        return (t, value.dtype, value.shape, value.get_device())
    sig = (t, value.dtype, tuple(value.shape), device_of(value))
    hash(sig)
    return sig


class Foreign:
    """A caller's array that is not a numpy array (a torch, paddle, jax or cupy tensor, a
    tvm_ffi tensor, anything exporting ``__dlpack__``), seen without converting it.

    ``shape``, ``dtype`` (a numpy dtype: ``ml_dtypes.bfloat16`` for bfloat16) and ``device``
    (``(HOST|CUDA, index)``) come from the object's attributes, else from its DLPack export
    (``tensor()``, a zero-copy ``tvm_ffi.Tensor``). ``numpy()`` / ``np.asarray`` give its data on
    the host (zero-copy for host memory; copied from a GPU), for planners that read index data.
    """

    __slots__ = ("obj", "shape", "dtype", "device", "framework", "sig", "_tensor")

    def __init__(self, obj):
        from .dtypes import dtype as as_dtype
        self.framework = framework_of(obj)
        try:
            self.sig = signature(obj)
        except (TypeError, AttributeError):
            self.sig = None
        if self.framework == "torch" and obj.requires_grad:
            obj = obj.detach()              # DLPack refuses tensors that require grad
        self.obj = obj
        self._tensor = None
        shape_, dt = getattr(obj, "shape", None), getattr(obj, "dtype", None)
        try:
            dt = as_dtype(dt) if dt is not None else None
        except TypeError:
            dt = None
        if shape_ is None or dt is None:    # a bare DLPack producer: ask DLPack
            t = self.tensor()
            shape_ = t.shape if shape_ is None else shape_
            if dt is None:
                try:
                    dt = as_dtype(str(t.dtype))
                except (TypeError, ValueError):
                    raise TypeError(f"dtype {getattr(obj, 'dtype', '?')} of a "
                                    f"{type(obj).__name__} is not one tvmgrad handles") from None
        self.shape = tuple(int(d) for d in shape_)
        self.dtype = dt.numpy
        if hasattr(obj, "__dlpack_device__"):
            self.device = _dl_device(obj)
        else:
            self.device = _dl_device(self.tensor())

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def is_cuda(self) -> bool:
        return self.device[0] == CUDA

    def tensor(self):
        """The array as a ``tvm_ffi.Tensor`` (zero-copy, its own strides)."""
        if self._tensor is None:
            self._tensor = to_tensor(self.obj)
        return self._tensor

    def numpy(self) -> np.ndarray:
        """The data as a numpy array: a view of host memory, a copy of GPU memory."""
        from .dtypes import dtype as as_dtype
        dt = as_dtype(self.dtype)
        if self.is_cuda:
            src = contiguous(self.obj)
            host = np.empty(self.shape, dt.numpy)
            view = host.view(dt.dlpack_view) if dt.dlpack_view is not None else host
            tensor = to_tensor(src)
            if dt.dlpack_view is not None and host.size:
                tensor = create_view(tensor, view.shape, str(view.dtype))
            to_host(tensor, view)
            return host
        tensor = self.tensor()
        if dt.dlpack_view is not None and dt.lanes == 1:      # bfloat16, float8
            if not tensor.is_contiguous():
                return np.asarray(Foreign(contiguous(self.obj)))
            bits = create_view(tensor, self.shape, str(dt.dlpack_view))
            return np.from_dlpack(bits).view(dt.numpy)
        if dt.lanes == 2:                 # complex: tvm_ffi cannot name DLPack's complex dtype
            return np.from_dlpack(self.obj)
        return np.from_dlpack(tensor)

    def __array__(self, dtype=None, copy=None):
        data = self.numpy()
        return data if dtype is None else data.astype(dtype)

    def __repr__(self) -> str:
        return (f"Foreign({self.framework} {list(self.shape)} {np.dtype(self.dtype).name} "
                f"{self.device[0]}:{self.device[1]})")


def to_tensor(obj):
    """A zero-copy ``tvm_ffi.Tensor`` over any DLPack producer (no alignment demanded)."""
    import tvm_ffi
    if isinstance(obj, tvm_ffi.Tensor):
        return obj
    if isinstance(obj, np.ndarray) and not obj.flags.writeable:
        # numpy exports a read-only array only as a versioned (DLPack 1.0) capsule
        return tvm_ffi.from_dlpack(obj.__dlpack__(max_version=(1, 0)), require_alignment=0)
    return tvm_ffi.from_dlpack(obj, require_alignment=0)


def contiguous(obj):
    """``obj`` itself when C-contiguous, else a contiguous copy in the same framework (on the
    same device); a host array of another framework may come back as a numpy copy."""
    fw = framework_of(obj)
    if fw == "numpy":
        return np.ascontiguousarray(obj)
    if fw == "torch":
        return obj.contiguous()
    if fw == "cupy":
        import cupy
        return cupy.ascontiguousarray(obj)
    t = to_tensor(obj)
    if t.is_contiguous():
        return obj
    if fw == "paddle":
        return obj.contiguous()
    if t.device.type == "cpu":
        return np.ascontiguousarray(np.from_dlpack(t))
    raise ValueError(f"a non-contiguous {type(obj).__name__} on {t.device}: tvmgrad cannot make it "
                     f"contiguous; pass a contiguous array")


def shape_of(value) -> tuple:
    """The shape of any array (numpy, torch, a DLPack producer)."""
    return tuple(value.shape) if hasattr(value, "shape") else tuple(to_tensor(value).shape)


def is_contiguous(value) -> bool:
    """Is any array (numpy, torch, a DLPack producer) C-contiguous?"""
    if isinstance(value, np.ndarray):
        return value.flags.c_contiguous
    if framework_of(value) == "torch":
        return value.is_contiguous()
    return to_tensor(value).is_contiguous()


def data_ptr(value) -> int:
    """The address of any array's first element (numpy, torch, a DLPack producer)."""
    if isinstance(value, np.ndarray):
        return value.ctypes.data
    if framework_of(value) == "torch":
        return value.data_ptr()
    return to_tensor(value).data_ptr()


def _module(framework: str):
    import importlib
    try:
        return importlib.import_module({"jax": "jax.numpy"}.get(framework, framework))
    except ImportError:
        return None


def wrap(framework: str, tensor):
    """A zero-copy array of ``framework`` over a tvm_ffi tensor or numpy array (the
    ``from_dlpack`` of that framework; a framework without one gets numpy on the host and the
    tvm_ffi tensor on a GPU)."""
    if framework == "numpy":
        return tensor if isinstance(tensor, np.ndarray) else np.from_dlpack(tensor)
    if framework == "tvm_ffi":
        return to_tensor(tensor)
    module = _module(framework)
    fn = getattr(module, "from_dlpack", None) if module is not None else None
    if fn is None and framework == "paddle":
        from paddle.utils.dlpack import from_dlpack as fn
    if fn is None:
        t = to_tensor(tensor)
        return np.from_dlpack(t) if t.device.type == "cpu" else t
    return fn(tensor)


@functools.cache
def _torch_dtypes() -> dict:
    import torch
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
            "float64": torch.float64, "complex64": torch.complex64, "complex128": torch.complex128,
            "bool": torch.bool, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
            "int32": torch.int32, "int64": torch.int64, "float8_e4m3fn": torch.float8_e4m3fn,
            "float8_e5m2": torch.float8_e5m2}


def torch_dtype(dt):
    """The torch dtype of a tvmgrad DType (or name)."""
    from .dtypes import dtype as as_dtype
    return _torch_dtypes()[as_dtype(dt).name]


def allocate(framework: str, dims: tuple, dt, where: tuple[str, int]):
    """A new uninitialised array of ``framework`` with shape ``dims`` and DType ``dt`` on
    ``where`` (``(HOST|CUDA, index)``): the framework's own allocator where tvmgrad knows it
    (numpy, torch, cupy: torch's caching allocator on a GPU), else TVM's, handed over by DLPack."""
    kind, index = where
    if framework == "torch":
        import torch
        return torch.empty(dims, dtype=_torch_dtypes()[dt.name],
                           device="cpu" if kind == HOST else f"cuda:{index}")
    if kind == HOST and framework == "numpy":
        return np.empty(dims, dt.numpy)
    if framework == "cupy" and kind == CUDA:
        import cupy
        with cupy.cuda.Device(index):
            return cupy.empty(dims, dt.numpy)
    if kind == HOST:
        if dt.dlpack_view is None or dt.lanes == 2:   # numpy exports complex, not bfloat16
            return wrap(framework, np.empty(dims, dt.numpy))
        tensor = empty(dims, dt.name, device(HOST, 0))       # (float8: not its uint8 storage)
    else:
        if dt.lanes == 2:
            raise TypeError(f"tvmgrad cannot allocate a complex {framework} array on a GPU")
        tensor = empty(dims, dt.name, device(CUDA, index))
    return wrap(framework, tensor)


def current_stream(framework: str, index: int):
    """The caller's current CUDA stream on device ``index`` as an integer handle, where the
    framework exposes one (torch, cupy); None otherwise (TVM's default stream)."""
    try:
        if framework == "torch":
            import torch
            return int(torch.cuda.current_stream(index).cuda_stream)
        if framework == "cupy":
            import cupy
            with cupy.cuda.Device(index):
                return int(cupy.cuda.get_current_stream().ptr)
        if framework == "paddle":
            import paddle
            return int(paddle.device.current_stream(f"gpu:{index}").cuda_stream)
    except Exception:  # noqa: BLE001 - no stream API: the default stream
        return None
    return None


def reshape(value, dims: tuple):
    """``value`` viewed with another shape (numpy, torch, ... ``reshape``; a view when contiguous)."""
    if hasattr(value, "reshape"):
        return value.reshape(dims)
    return create_view(to_tensor(value), dims, str(to_tensor(value).dtype))


def copy_into(dst, src) -> None:
    """Copy array ``src`` into array ``dst`` (same shape and dtype; any framework and device)."""
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        np.copyto(dst, src)
        return
    if framework_of(dst) == "torch" and framework_of(src) == "torch":
        dst.copy_(src)
        return
    if isinstance(dst, np.ndarray) and framework_of(src) != "numpy" and _dl_device(src)[0] == HOST:
        np.copyto(dst, np.asarray(Foreign(src)))
        return
    from .dtypes import dtype as as_dtype
    dt = as_dtype(getattr(dst, "dtype", None) or to_tensor(dst).dtype)
    a, b = _storage_tensor(contiguous(src), dt), _storage_tensor(dst, dt)
    if a.numel():
        copy(a, b)


def _storage_tensor(value, dt):
    """A contiguous value as a tvm_ffi tensor in the storage dtype (bfloat16 numpy as uint16,
    complex as trailing pairs of reals)."""
    if isinstance(value, np.ndarray) and dt.dlpack_view is not None:
        value = value.view(dt.dlpack_view)
    t = to_tensor(value)
    if dt.lanes == 2 and not isinstance(value, np.ndarray):
        t = create_view(t, tuple(t.shape) + (2,), dt.storage)
    return t
