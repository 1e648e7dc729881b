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
           "cuda_available"]


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


def create_view(tensor, shape, dtype: str):
    import tvm_ffi
    return _global("runtime.TVMTensorCreateView")(tensor, tvm_ffi.Shape([int(d) for d in shape]), dtype, 0)


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
