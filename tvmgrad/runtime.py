"""``tvmgrad.run`` and the lower-level ``prepare``: validate, infer, fetch a kernel, call it.

Arrays cross into TVM by DLPack without copies (a view with the kernel's coalesced shape); the
dtype layer decides how bfloat16 and complex storage are viewed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import registry, rt
from .cache import KernelCache, default_cache
from .call import BoundCall, bind
from .dtypes import DType, dtype as as_dtype
from .families.base import Arg, Plan
from .infer_meta import TensorMeta
from .targets import Resolved, resolve

__all__ = ["run", "prepare", "Launch"]


@dataclass
class Launch:
    """A validated call bound to its compiled kernel: call it (repeatedly) to get the outputs."""

    op: "registry.Op"
    call: BoundCall
    plan: Plan
    outputs: list                 # TensorMeta per output (None: not produced)
    target: Resolved
    function: object              # None when every output is an alias of an input

    def __call__(self, out: dict | None = None, *, inplace: bool = False) -> dict:
        """Run the kernel. ``out`` may supply output arrays (contiguous, right shape and dtype);
        ``inplace`` writes each YAML ``inplace`` output into its input's buffer."""
        spec = self.op.spec
        given = dict(out or {})
        copy_back = {}
        if inplace:
            for src, dst in spec.inplace:
                meta = self.outputs[spec.output_names.index(dst)]
                if dst in given or meta is None:
                    continue
                source = self.call.tensors[src]
                if isinstance(meta, list):          # a Tensor[] pair: element by element
                    buffer = [_inplace_view(spec.name, f"{dst}[{i}]", a, m)
                              for i, (a, m) in enumerate(zip(source, meta))]
                    buffer = None if any(b is None for b in buffer) else buffer
                else:
                    buffer = _inplace_view(spec.name, dst, source, meta)
                if buffer is None:
                    continue               # sizes differ (e.g. identity_loss_grad with a reduction)
                if self.plan.inplace_safe:
                    given[dst] = buffer
                else:                      # the kernel may read src after writing dst
                    copy_back[dst] = buffer
        results = {}
        for o, meta in zip(spec.outputs, self.outputs):
            if meta is None:
                results[o.name] = None
            elif o.name in given and isinstance(meta, list):
                buffers = [_check_out(spec.name, f"{o.name}[{i}]", b, m)
                           for i, (b, m) in enumerate(zip(given[o.name], meta))]
                if self.function is not None and any(_misaligned(b) for b in buffers):
                    copy_back[o.name] = buffers
                    buffers = [aligned_empty(m.shape, m.dtype.numpy) for m in meta]
                results[o.name] = buffers
            elif o.name in given:
                buffer = _check_out(spec.name, o.name, given[o.name], meta)
                if _misaligned(buffer) and self.function is not None:
                    copy_back[o.name] = buffer
                    buffer = aligned_empty(meta.shape, meta.dtype.numpy)
                results[o.name] = buffer
            elif o.name in self.plan.aliases and self.call.options["alias"]:
                src, shape = self.plan.aliases[o.name]
                results[o.name] = np.asarray(self.call.tensors[src]).reshape(shape)
            elif isinstance(meta, list):                       # a Tensor[] output
                results[o.name] = [aligned_empty(m.shape, m.dtype.numpy) for m in meta]
            else:
                results[o.name] = aligned_empty(meta.shape, meta.dtype.numpy)
        for name, (src, shape) in self.plan.aliases.items():
            data = np.asarray(self.call.tensors[src]).reshape(shape)
            if results[name] is not None and not np.shares_memory(results[name], data):
                np.copyto(results[name], data)
        if self.function is not None:
            if self.target.is_gpu:
                self._call_device(results)
            else:
                self.function(*[self._arg(a, results) for a in self.plan.args])
        for name, buffer in copy_back.items():
            for dst, computed in (zip(buffer, results[name]) if isinstance(buffer, list)
                                  else [(buffer, results[name])]):
                np.copyto(dst, computed)
            results[name] = buffer
        return results

    def _arg(self, a: Arg, results: dict):
        if a.kind == "scalar":
            return a.value
        array = self.call.tensors[a.name] if a.kind == "input" else results[a.name]
        if a.index is not None:
            array = array[a.index]
        return to_tvm(array, a.shape, as_dtype(array.dtype))

    def _call_device(self, results: dict) -> dict:
        dev = rt.device("cuda", 0)
        args, copies = [], []
        for a in self.plan.args:
            if a.kind == "scalar":
                args.append(a.value)
                continue
            host = self.call.tensors[a.name] if a.kind == "input" else results[a.name]
            if a.index is not None:
                host = host[a.index]
            dt = as_dtype(host.dtype)
            shape = tuple(a.shape if a.shape is not None else host.shape) + ((2,) if dt.lanes == 2 else ())
            tensor = rt.to_device(_storage_view(np.ascontiguousarray(host), dt), shape, dt.storage, dev)
            args.append(tensor)
            if a.kind == "output":
                copies.append((tensor, host))
        self.function(*args)
        rt.sync(dev)
        for tensor, host in copies:
            rt.to_host(tensor, _storage_view(host, as_dtype(host.dtype)))
        return results


def _storage_view(array: np.ndarray, dt: DType) -> np.ndarray:
    view = dt.dlpack_view
    return array.view(view) if view is not None else array


ALIGN = 64     # TVM declares every buffer argument 64-byte aligned (LLVM may emit aligned loads)


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ALIGN-byte boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def _misaligned(array) -> bool:
    return isinstance(array, np.ndarray) and array.size > 0 and array.ctypes.data % ALIGN != 0


def to_tvm(array, shape, dt: DType):
    """A TVM tensor over a host array, viewed with ``shape`` in the storage dtype: zero-copy when
    the array is contiguous and 64-byte aligned (as large numpy arrays are; read-only ones, e.g.
    ``np.load(..., mmap_mode='r')``, included), else via an aligned copy (kernels may use aligned
    vector loads)."""
    import tvm_ffi
    if isinstance(array, np.ndarray):
        if not array.flags.c_contiguous or _misaligned(array):
            copy = aligned_empty(array.shape, array.dtype)
            np.copyto(copy, array)
            array = copy
        tensor = _from_numpy(_storage_view(array, dt))
    else:
        tensor = tvm_ffi.from_dlpack(array, require_alignment=0)
    shape = tuple(shape if shape is not None else array.shape)
    if dt.lanes == 2:
        shape += (2,)
    if dt.dlpack_view is not None or tuple(tensor.shape) != shape or array.size == 0:
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
    try:
        capsule = array.__dlpack__(max_version=(1, 0))
    except TypeError:                       # numpy without DLPack 1.0
        if not array.flags.writeable:
            copy = aligned_empty(array.shape, array.dtype)
            np.copyto(copy, array)
            array = copy
        capsule = array.__dlpack__()
    return tvm_ffi.from_dlpack(capsule, require_alignment=0)


def _inplace_view(op: str, name: str, array, meta: TensorMeta):
    """The input buffer an in-place output is written into, viewed with the output's shape (for
    grads that reshape, e.g. flatten_grad); None when the sizes differ and it cannot hold it."""
    size = int(np.prod(meta.shape, dtype=np.int64))
    if isinstance(array, np.ndarray) and array.size != size:
        return None
    if isinstance(array, np.ndarray) and array.flags.c_contiguous and tuple(array.shape) != meta.shape:
        array = array.reshape(meta.shape)
    return _check_out(op, name, array, meta)


def _check_out(op: str, name: str, array, meta: TensorMeta):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{op}: output {name!r} must be a numpy array")
    if tuple(array.shape) != meta.shape or as_dtype(array.dtype) != meta.dtype:
        raise ValueError(f"{op}: output {name!r} must have shape {list(meta.shape)} and dtype "
                         f"{meta.dtype.name}, got {list(array.shape)} {array.dtype}")
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"{op}: output {name!r} must be a writable C-contiguous array")
    return array


def prepare(op: str, inputs: dict | None, attrs: dict | None = None, *, target="llvm",
            cache: KernelCache | None = None, **options) -> Launch:
    """Validate a call, infer its outputs and fetch (or build) its kernel.

    Options: ``deterministic`` (default True: scatter-type grads accumulate in a fixed order;
    False allows atomics where faster) and ``alias`` (default False: grads that are a reshape of
    an input may return a view of it)."""
    entry = registry.get(op)
    call = bind(entry.spec, inputs, attrs, **options)
    if not entry.available:
        raise NotImplementedError(f"{op}: listed in backward.yaml but not implemented yet")
    try:
        outs = registry.infer_outputs(entry, call)
        plan = entry.impl.plan(call, outs)
    except (ValueError, TypeError) as exc:
        # every error of a bad call names the op (a check deep in a planner, or numpy's own
        # message about an array it was given, may not)
        if str(exc).startswith(f"{op}: "):
            raise
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(f"{op}: {exc}") from exc
    tgt = resolve(target)
    tgt.check_runs_here(op)
    if tgt.is_gpu and not rt.cuda_available():
        raise RuntimeError(f"{op}: target {tgt.kind} needs a CUDA driver and GPU, and this machine "
                           f"has none (CUDA kernels can still be built: tvmgrad build --target cuda)")
    from .tune import tuned_plan
    plan = tuned_plan(plan, call, outs, tgt)
    function = None
    if plan.make is not None:
        function = (cache or default_cache).get(plan, entry.impl, tgt).function
    return Launch(entry, call, plan, outs, tgt, function)


def run(op: str, inputs: dict | None, attrs: dict | None = None, *, target="llvm",
        inplace: bool = False, **options) -> dict:
    """Run backward op ``op``: inputs and attrs keyed by the YAML names, outputs likewise.

    ``inplace=True`` honours the YAML ``inplace`` pairs: the output is written into the
    input's array, which must be a writable contiguous array of the output's dtype and size (it is
    viewed with the output's shape); a pair whose sizes differ is computed out of place.
    ``deterministic`` and ``alias`` are passed to ``prepare``.
    """
    return prepare(op, inputs, attrs, target=target, **options)(inplace=inplace)
