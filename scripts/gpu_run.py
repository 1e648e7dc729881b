#!/usr/bin/env python3
"""Run a tvmgrad GPU bundle (scripts/gpu_bundle.py) where it is to be checked: a machine with a GPU
(or, for a bundle built with --target llvm, any x86-64 CPU) and Python with numpy, ml_dtypes and
PyYAML, but no TVM, no compiler and no network.

    python3 scripts/gpu_run.py gpu-bundle --out "$OUT"          # or gpu-bundle/gpu_run.py

It unpacks the bundle into a private folder (tvm_ffi from the bundled wheel, the tvmgrad package,
the TVM runtime libraries), then runs one worker process per library shard (``--jobs`` at a time,
``--shard-timeout`` each): a worker loads the library with ``tvmgrad.load_library`` (tvm_ffi and
libtvm_runtime only), runs every entry point's call on the device, compares with the references
computed on LLVM when the bundle was built (rtol = atol per dtype, as tests/test_gpu.py), runs it
again for bit-identity, times the kernel alone, and at ``--bench-size`` elements times each op's
kernel next to PyTorch's backward (tvmgrad.benchrefs) and a device-to-device copy of the same
bytes. A worker that crashes or hangs loses the call it was in (reported as crashed/timeout); the
shard resumes after it in a fresh process (``--max-restarts``). Results: ``results.json`` and
``results.txt`` in ``--out`` (default $OUT, else ./gpu-bundle-results); the table is printed too.

Timing (CUDA): device tensors are allocated once (tvmgrad.rt.to_device), the entry point is called
directly between two CUDA events (torch.cuda.Event, else CuPy's), after a torch.cuda._sleep that
keeps the GPU busy while the host enqueues, so the interval is the kernel(s) alone, not the
Python call; best of ``--reps`` after ``--warmup``. On the CPU: time.perf_counter around the direct
call, TVM tensors made once. Exit status 0 when every entry point passed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

MANIFEST = "bundle.json"
SLEEP_CYCLES = 400_000            # ~0.2 ms of GPU time before each timed call (torch.cuda._sleep)


# ------------------------------------------------------------------------------------------
# Unpacking and paths (stdlib only)

def _extract_tar(path: pathlib.Path, dest: pathlib.Path) -> None:
    with tarfile.open(path) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:                                                  # pragma: no cover - old Pythons
            tar.extractall(dest)


def _extract_wheel(path: pathlib.Path, dest: pathlib.Path) -> None:
    with zipfile.ZipFile(path) as z:
        z.extractall(dest)
    for data in dest.glob("*.data"):                           # purelib/platlib of a wheel
        for sub in ("purelib", "platlib"):
            if (data / sub).is_dir():
                for item in (data / sub).iterdir():
                    shutil.move(str(item), str(dest / item.name))


def _sha256(path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unpack(bundle: pathlib.Path, work: pathlib.Path, manifest: dict) -> dict:
    """Check the bundle's files against its manifest and unpack the runtime into ``work``:
    py/ (tvmgrad, the tvm stub with lib/), deps/, ffi/ (the wheel), native/, lib/ (the library).
    Returns {"bad_files": [...], "seconds": ...}; a bad runtime file raises RuntimeError."""
    t0 = time.time()
    bad = []
    for name, record in manifest["files"].items():
        path = bundle / name
        if not path.is_file() or path.stat().st_size != record["bytes"] or _sha256(path) != record["sha256"]:
            bad.append(name)
    # a changed case file fails its shard only; the bundle's copy of this script is not used by
    # a run started from another copy
    runtime = [n for n in bad if not n.startswith("cases/") and n != "gpu_run.py"]
    if runtime:
        raise RuntimeError(f"bundle files missing or changed since the build: {', '.join(runtime)}")
    work.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(bundle / "python.zip") as z:
        z.extractall(work)
    _extract_tar(bundle / "native.tar.xz", work)
    _extract_tar(bundle / "lib.tar.xz", work)
    _extract_wheel(bundle / manifest["wheel"]["file"], work / "ffi")
    for sub in ("lines", "cache"):
        (work / sub).mkdir(exist_ok=True)
    return {"bad_files": bad, "seconds": round(time.time() - t0, 2)}


def use_paths(work: pathlib.Path) -> None:
    """The bundle's tvm_ffi and tvmgrad first, its pure-Python deps after the device's own."""
    for p in (str(work / "py"), str(work / "ffi")):
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    if str(work / "deps") not in sys.path:
        sys.path.append(str(work / "deps"))


def _python_flags() -> list[str]:
    """The interpreter flags this process runs with, for its workers."""
    if sys.flags.isolated:
        return ["-I"] + (["-S"] if sys.flags.no_site else [])
    flags = []
    if sys.flags.ignore_environment:
        flags.append("-E")
    if sys.flags.no_user_site:
        flags.append("-s")
    if sys.flags.no_site:
        flags.append("-S")
    return flags


# ------------------------------------------------------------------------------------------
# Worker side (one process per shard attempt)

def _preload_cudart(work: pathlib.Path) -> str:
    """libtvm_runtime_cuda.so links libcudart.so.13: the device's own if the loader or a CUDA
    install has it, else the bundle's copy; loaded globally so the runtime finds it."""
    import ctypes
    import glob
    name = "libcudart.so.13"
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        return f"{name} (system loader path)"
    except OSError:
        pass
    candidates = sorted(glob.glob(f"/usr/local/cuda*/lib64/{name}")) + \
        sorted(glob.glob(f"/usr/local/cuda*/targets/*/lib/{name}"))
    for entry in sys.path:
        candidates += sorted(glob.glob(os.path.join(entry, "nvidia", "*", "lib", name)))
    candidates.append(str(work / "native" / name))
    for path in candidates:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return path
        except OSError:
            continue
    raise RuntimeError(f"{name} not found (not on the loader path, under /usr/local/cuda*, in "
                       f"pip's nvidia packages, nor in the bundle)")


class _Emitter:
    def __init__(self, path):
        self.fh = open(path, "a", buffering=1)

    def __call__(self, **record):
        self.fh.write(json.dumps(record, default=str) + "\n")
        self.fh.flush()


class _Timer:
    """Best-of-N seconds of ``fn()``: CUDA events (kernel time) or perf_counter (CPU)."""

    def __init__(self, cuda: bool, reps: int, warmup: int, sync=None, lock=None):
        self.reps, self.warmup, self.cuda, self.sync = reps, warmup, cuda, sync
        self.lock = lock          # a file that serialises timing across the workers (flock)
        self.torch = self.cupy = None
        if cuda:
            try:
                import torch
                if torch.cuda.is_available():
                    self.torch = torch
            except ImportError:
                pass
            if self.torch is None:
                try:
                    import cupy
                    self.cupy = cupy
                except ImportError:
                    pass
        if self.torch is not None:
            self.method = ("CUDA events (torch.cuda.Event) around one direct call of the entry "
                           "point on device tensors, after torch.cuda._sleep so that the GPU "
                           "waits for the host: kernel time only")
            self.start = self.torch.cuda.Event(enable_timing=True)
            self.end = self.torch.cuda.Event(enable_timing=True)
        elif self.cupy is not None:
            self.method = ("CUDA events (cupy.cuda.Event) around one direct call on device "
                           "tensors (no GPU padding: includes the launch's host time)")
            self.start, self.end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        elif cuda:
            self.method = "time.perf_counter around a call and a stream sync (no event API)"
        else:
            self.method = "time.perf_counter around one direct call on TVM tensors made once"

    def best(self, fn) -> float:
        if self.lock is None:
            return self._best(fn)
        import fcntl
        with open(self.lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)       # one worker times at a time: no GPU contention
            try:
                return self._best(fn)
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _best(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        best = float("inf")
        if self.torch is not None:
            torch = self.torch
            torch.cuda.synchronize()
            for _ in range(self.reps):
                torch.cuda._sleep(SLEEP_CYCLES)
                self.start.record()
                fn()
                self.end.record()
                self.end.synchronize()
                best = min(best, self.start.elapsed_time(self.end) * 1e-3)
            return best
        if self.cupy is not None:
            self.cupy.cuda.Device().synchronize()
            for _ in range(self.reps):
                self.start.record()
                fn()
                self.end.record()
                self.end.synchronize()
                best = min(best, self.cupy.cuda.get_elapsed_time(self.start, self.end) * 1e-3)
            return best
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            if self.sync is not None:
                self.sync()
            best = min(best, time.perf_counter() - t0)
        return best


def _outputs_for(launch, aligned_empty):
    results = {}
    for o, meta in zip(launch.op.spec.outputs, launch.outputs):
        if meta is None:
            results[o.name] = None
        elif isinstance(meta, list):
            results[o.name] = [aligned_empty(m.shape, m.dtype.numpy) for m in meta]
        else:
            results[o.name] = aligned_empty(meta.shape, meta.dtype.numpy)
    return results


def _direct_call(launch, cuda: bool):
    """(fn, nbytes): the entry point on argument tensors made once (device tensors for CUDA, as
    runtime.Launch._call_device makes them per call), and the bytes its tensors hold."""
    import numpy as np

    from tvmgrad import rt
    from tvmgrad.dtypes import dtype as as_dtype
    from tvmgrad.runtime import aligned_empty, to_tvm
    if launch.function is None:
        return None, 0
    results = _outputs_for(launch, aligned_empty)
    dev = rt.device("cuda", 0) if cuda else None
    args, nbytes = [], 0
    for a in launch.plan.args:
        if a.kind == "scalar":
            args.append(a.value)
            continue
        host = launch.call.tensors[a.name] if a.kind == "input" else results[a.name]
        if a.index is not None:
            host = host[a.index]
        nbytes += host.nbytes
        dt = as_dtype(host.dtype)
        if cuda:
            shape = tuple(a.shape if a.shape is not None else host.shape) + ((2,) if dt.lanes == 2 else ())
            view = np.ascontiguousarray(host)
            view = view.view(dt.dlpack_view) if dt.dlpack_view is not None else view
            args.append(rt.to_device(view, shape, dt.storage, dev))
        else:
            args.append(to_tvm(host, a.shape, dt))
    function = launch.function
    return (lambda: function(*args)), nbytes


def _torch_call(op, inputs, attrs, cuda: bool):
    """PyTorch's own backward for ``op`` (tvmgrad.benchrefs.TORCH) on these inputs, or None."""
    try:
        import torch
    except ImportError:
        return None, "torch not importable"
    from tvmgrad import registry
    from tvmgrad.benchrefs import torch_refs
    make = torch_refs().get(op)
    if make is None:
        return None, "no PyTorch reference in tvmgrad.benchrefs"
    tensors = {k: _to_torch(torch, v, "cuda" if cuda else "cpu") for k, v in inputs.items()}
    return make(tensors, {**registry.get(op).spec.defaults, **attrs}), None


def _to_torch(torch, v, device: str):
    """A numpy input (or list of them) as torch tensors on ``device`` (bfloat16 through float32,
    which holds every bfloat16 value exactly)."""
    if isinstance(v, list):
        return [_to_torch(torch, x, device) for x in v]
    if v is None:
        return None
    import numpy as np
    name = v.dtype.name
    wide = v.astype(np.float32) if name == "bfloat16" else v
    t = torch.from_numpy(np.ascontiguousarray(wide)).to(device)
    return t.to(getattr(torch, name)) if hasattr(torch, name) else t


def _from_torch(v):
    """A torch result (or list) as numpy on the host (bfloat16 as float32)."""
    if isinstance(v, list):
        return [_from_torch(x) for x in v]
    if v is None:
        return None
    import torch
    return (v.float() if v.dtype == torch.bfloat16 else v).cpu().numpy()


def _resident_check(lib, op, dtype, inputs, attrs, got, cuda: bool, gb, np) -> str | None:
    """The device path of run (arrays of another framework, by DLPack): the same call with torch
    tensors on the device (the host in a CPU dry run) must give torch tensors there, equal to the
    numpy call's results. None where torch (with CUDA, for a CUDA library) is not available."""
    try:
        import torch
    except ImportError:
        return None
    if cuda and not torch.cuda.is_available():
        return None
    device = "cuda" if cuda else "cpu"
    try:
        results = lib.run(op, {k: _to_torch(torch, v, device) for k, v in inputs.items()}, attrs)
    except Exception as exc:  # noqa: BLE001
        return f"error: {_error(exc)}"
    for name, value in results.items():
        for v in (value if isinstance(value, list) else [value]):
            if v is not None and (not isinstance(v, torch.Tensor) or v.device.type != device):
                return f"wrong result type: {name} is {type(v).__name__} on {getattr(v, 'device', '?')}"
    def widened(v):              # bfloat16 numpy results as float32, as _from_torch gives them
        if isinstance(v, list):
            return [widened(x) for x in v]
        return v.astype(np.float32) if v is not None and v.dtype.name == "bfloat16" else v
    want = {k: widened(v) for k, v in got.items()}
    cmp = gb.compare({k: _from_torch(v) for k, v in results.items()}, want, dtype)
    return "passed" if cmp["ok"] or op in gb.SCATTERS else "mismatch: " + "; ".join(cmp["problems"])[:300]


def _copy_call(nbytes: int, cuda: bool):
    """A copy moving ``nbytes`` (reads plus writes): the bandwidth reference."""
    half = max(nbytes // 2, 1)
    if cuda:
        try:
            import torch
            src = torch.empty(half, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            return lambda: dst.copy_(src)
        except ImportError:
            pass
        try:
            import cupy
            src = cupy.empty(half, dtype=cupy.uint8)
            dst = cupy.empty_like(src)
            return lambda: cupy.copyto(dst, src)
        except ImportError:
            return None
    import numpy as np
    src = np.ones(half, np.uint8)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def _tvm_evidence(work: pathlib.Path, stub_log: str) -> dict:
    """What shows that the compiler was not used: tvm modules imported, attempts to import the
    stub, libtvm* files mapped into this process, where tvmgrad and tvm_ffi came from."""
    import importlib.util

    import tvm_ffi

    import tvmgrad
    maps = set()
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libtvm"):
                    maps.add(path)
    except OSError:
        pass
    attempts = 0
    if os.path.exists(stub_log):
        with open(stub_log) as fh:
            attempts = fh.read().count("\n----\n")
    spec = importlib.util.find_spec("tvm")
    return {"modules": sorted(m for m in sys.modules if m == "tvm" or m.startswith("tvm.")),
            "stub_import_attempts": attempts, "mapped": sorted(maps),
            "tvm_found_at": spec.origin if spec else None,
            "tvmgrad_from": os.path.dirname(tvmgrad.__file__),
            "tvm_ffi_from": os.path.dirname(tvm_ffi.__file__),
            "compiler_mapped": any(os.path.basename(p).startswith(("libtvm_compiler", "libtvm.so"))
                                   for p in maps),
            "cache_files": sum(len(f) for _, _, f in os.walk(work / "cache"))}


def _worker_setup(args):
    work = pathlib.Path(args.work)
    use_paths(work)
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")    # no JIT of torch's addon
    os.environ["TVMGRAD_CACHE_DIR"] = str(work / "cache")           # nothing compiles into it
    manifest = json.loads((pathlib.Path(args.bundle) / MANIFEST).read_text())
    cuda = manifest["target"] == "cuda"
    cudart = _preload_cudart(work) if cuda else None
    if cuda and "TVMGRAD_CUDA_ARCH" not in os.environ:
        try:                      # the arch tvmgrad would compile for if a fatbin did not match
            import torch
            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability(0)
                os.environ["TVMGRAD_CUDA_ARCH"] = f"sm_{major}{minor}"
        except ImportError:
            pass
    import tvm_ffi  # noqa: F401 - loads libtvm_ffi globally, which libtvm_runtime links

    from tvmgrad import rt
    rt.load_runtime(cuda=cuda)
    return work, manifest, cuda, cudart


def _device_info(cuda: bool) -> dict:
    import platform
    info = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        import torch
        info["torch"] = torch.__version__
        if cuda and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(name=p.name, capability=f"sm_{p.major}{p.minor}",
                        memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,
                        torch_cuda=torch.version.cuda,
                        torch_stream=torch.cuda.current_stream().cuda_stream)
    except ImportError:
        info["torch"] = None
    if not cuda:
        info["name"] = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as fh:
                info["name"] = next(l.split(":", 1)[1].strip() for l in fh if l.startswith("model name"))
        except (OSError, StopIteration):
            pass
        info["cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return info


def probe(args) -> int:
    """Load the runtime (and CUDA), report the device and the tvm evidence; nothing else."""
    emit = _Emitter(args.lines)
    try:
        work, manifest, cuda, cudart = _worker_setup(args)
        import tvmgrad
        lib = tvmgrad.load_library(work / "lib")
        info = _device_info(cuda)
        info["cudart"] = cudart
        if cuda:
            from tvmgrad import rt
            info["tvm_cuda_device"] = bool(rt.cuda_available())
        info["library_ops"] = len(lib.manifest["ops"])     # (Library.ops() unpacks 3 of 4 key parts)
        # one call end to end (module load, device code, copies), so that a broken setup fails
        # here, once, rather than in every shard
        import numpy as np

        from tvmgrad import gpu_bundle as gb
        shard = next(s for s in manifest["shards"] if s["cases"])
        index, arrays = gb.load_cases(pathlib.Path(args.bundle) / shard["cases_file"])
        first, _ = _run_case(index["cases"][0], arrays, lib, cuda, _Timer(cuda, 2, 1), gb, np)
        info["first_call"] = {k: first.get(k) for k in ("op", "dtype", "status", "error", "time_us")}
        if first["status"] not in ("passed", "mismatch", "nondeterministic", "no_ref"):
            raise RuntimeError(f"the first call ({first['op']} [{first['dtype']}]) failed: "
                               f"{first.get('error')}")
        copy = _copy_call(64 << 20, cuda)
        if copy is not None:
            from tvmgrad import rt as _rt
            timer = _Timer(cuda, 5, 2, sync=(lambda: _rt.sync(_rt.device("cuda", 0))) if cuda else None)
            info["copy_64mib_gbs"] = round((64 << 20) / timer.best(copy) / 1e9, 1)
            info["timer"] = timer.method
        emit(event="probe", ok=True, info=info,
             tvm=_tvm_evidence(work, os.environ.get("TVMGRAD_TVM_STUB_LOG", "")))
        return 0
    except Exception as exc:  # noqa: BLE001 - reported to the driver
        import traceback
        emit(event="probe", ok=False, error=f"{type(exc).__name__}: {exc}",
             traceback=traceback.format_exc()[-3000:])
        return 2


def worker(args) -> int:
    emit = _Emitter(args.lines)
    try:
        work, manifest, cuda, _ = _worker_setup(args)
        import numpy as np

        import tvmgrad
        from tvmgrad import gpu_bundle as gb, rt
        shard = next(s for s in manifest["shards"] if s["stem"] == args.worker)
        index, arrays = gb.load_cases(pathlib.Path(args.bundle) / shard["cases_file"])
        lib = tvmgrad.load_library(work / "lib")
    except Exception as exc:  # noqa: BLE001
        import traceback
        emit(event="shard_error", error=f"{type(exc).__name__}: {exc}",
             traceback=traceback.format_exc()[-3000:])
        return 2
    sync = (lambda: rt.sync(rt.device("cuda", 0))) if cuda else None
    timer = _Timer(cuda, args.reps, args.warmup, sync=sync, lock=str(work / "timing.lock"))
    cases = index["cases"]
    bench_ops = shard["ops"] if args.bench_size > 0 else []
    items = [("case", c) for c in cases] + [("bench", op) for op in bench_ops]
    inject = dict(f.split(":", 1) for f in args.inject_fault or [])
    if timer.torch is not None:
        # TVM launches on tvm_ffi's current stream for the device: make it torch's current stream
        # (the legacy default stream, as TVM's default), so the events bracket our kernels
        import tvm_ffi
        tvm_ffi.use_raw_stream(rt.device("cuda", 0),
                               timer.torch.cuda.current_stream().cuda_stream).__enter__()
    fatal = False
    for i in range(args.skip, len(items)):
        kind, item = items[i]
        emit(event="start", i=i, kind=kind)
        if i == 0 and args.worker in inject:
            mode = inject[args.worker]
            if mode == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif mode == "hang":
                time.sleep(10 ** 6)
            elif mode == "exit":
                os._exit(7)
        if kind == "case":
            record, fatal = _run_case(item, arrays, lib, cuda, timer, gb, np)
        else:
            first = next((c for c in cases if c["op"] == item), None)
            example = (lambda c=first: (gb.decode(c["inputs"], arrays), gb.decode(c["attrs"], arrays))) \
                if first is not None else None
            record, fatal = _run_bench(item, shard["dtype"], lib, cuda, timer, args.bench_size, example)
        emit(event="done", i=i, kind=kind, **record)
        if fatal and cuda:       # a CUDA error may be sticky: continue in a fresh process
            emit(event="restart", i=i, reason=record.get("error"))
            return 3
    emit(event="end", timer=timer.method,
         tvm=_tvm_evidence(work, os.environ.get("TVMGRAD_TVM_STUB_LOG", "")))
    return 0


def _error(exc) -> str:
    return f"{type(exc).__name__}: {exc}"[:800]


def _run_case(case, arrays, lib, cuda, timer, gb, np):
    op, dtype = case["op"], case["dtype"]
    rec = {"op": op, "dtype": dtype, "symbol": case["symbol"], "key": case["key"]}
    try:
        inputs = gb.decode(case["inputs"], arrays)
        attrs = gb.decode(case["attrs"], arrays)
        ref = gb.decode(case["ref"], arrays) if case["ref"] is not None else None
        launch = lib.prepare(op, inputs, attrs)
    except Exception as exc:  # noqa: BLE001 - validation or lookup: not a device fault
        missing = isinstance(exc, ValueError) and "has no kernel for this call" in str(exc)
        rec.update(status="no_kernel" if missing else "error", error=_error(exc), stage="prepare")
        return rec, False
    try:
        got = launch()
        again = launch()
    except Exception as exc:  # noqa: BLE001
        rec.update(status="error", error=_error(exc), stage="run")
        return rec, True
    rec["bit_identical"] = gb.bit_identical(got, again)
    resident = _resident_check(lib, op, dtype, inputs, attrs, got, cuda, gb, np)
    if resident is not None:
        rec["resident"] = resident
    if ref is None:
        rec.update(status="no_ref", error=case.get("ref_error"))
    else:
        cmp = gb.compare(got, ref, dtype)
        rec.update(max_abs=cmp["max_abs"], max_rel=cmp["max_rel"], tol=cmp["tol"])
        if not cmp["ok"]:
            rec.update(status="mismatch", problems=cmp["problems"])
        elif not rec["bit_identical"] and op in gb.SCATTERS:
            rec.update(status="nondeterministic")
        else:
            rec["status"] = "passed"
    try:
        fn, nbytes = _direct_call(launch, cuda)
        if fn is not None:
            t = timer.best(fn)
            rec.update(time_us=round(t * 1e6, 3), nbytes=nbytes, gbs=round(nbytes / t / 1e9, 3))
    except Exception as exc:  # noqa: BLE001
        rec.update(timing_error=_error(exc))
        return rec, True
    return rec, False


def _numel(v) -> int:
    if isinstance(v, list):
        return sum(_numel(x) for x in v)
    return int(getattr(v, "size", 0) or 0)


def _shapes(inputs) -> dict:
    out = {}
    for k, v in inputs.items():
        if isinstance(v, list):
            out[k] = [list(x.shape) for x in v if x is not None]
        elif v is not None:
            out[k] = list(getattr(v, "shape", ()))
    return out


def _run_bench(op, dtype, lib, cuda, timer, n, example=None):
    """Time ``op`` at ``n`` elements (tvmgrad.workloads.make_inputs) against torch and a copy; where
    the library has no kernel for that call, at the example call's size (``example``)."""
    rec = {"op": op, "dtype": dtype, "n": n, "size": "bench"}
    try:
        from tvmgrad.workloads import make_inputs
        inputs, attrs = make_inputs(op, n, dtype, False)
        launch = lib.prepare(op, inputs, attrs)
        fn, nbytes = _direct_call(launch, cuda)
    except Exception as exc:  # noqa: BLE001 - this op has no kernel for the bench call
        if example is None:
            rec.update(status="n/a", note=_error(exc)[:300])
            return rec, False
        rec.update(size="example", note=f"bench call: {_error(exc)[:200]}")
        try:
            inputs, attrs = example()
            launch = lib.prepare(op, inputs, attrs)
            fn, nbytes = _direct_call(launch, cuda)
        except Exception as exc2:  # noqa: BLE001
            rec.update(status="n/a", note=_error(exc2)[:300])
            return rec, False
    rec["shapes"] = _shapes(inputs)
    rec["n"] = max([_numel(v) for v in inputs.values()] or [0])
    if fn is None:
        rec.update(status="n/a", note="no kernel (outputs alias inputs)")
        return rec, False
    try:
        t = timer.best(fn)
    except Exception as exc:  # noqa: BLE001
        rec.update(status="error", error=_error(exc))
        return rec, True
    rec.update(status="ok", nbytes=nbytes, ours_us=round(t * 1e6, 3), ours_gbs=round(nbytes / t / 1e9, 2))
    try:
        tfn, why = _torch_call(op, inputs, attrs, cuda)
        if tfn is not None:
            tt = timer.best(tfn)
            rec.update(torch_us=round(tt * 1e6, 3), torch_gbs=round(nbytes / tt / 1e9, 2))
        else:
            rec["torch_note"] = why
    except Exception as exc:  # noqa: BLE001 - a reference that does not run here
        rec["torch_note"] = _error(exc)[:300]
    try:
        cfn = _copy_call(nbytes, cuda)
        if cfn is not None:
            tc = timer.best(cfn)
            rec.update(copy_us=round(tc * 1e6, 3), copy_gbs=round(2 * max(nbytes // 2, 1) / tc / 1e9, 2))
    except Exception as exc:  # noqa: BLE001
        rec["copy_note"] = _error(exc)[:300]
    return rec, False


# ------------------------------------------------------------------------------------------
# Driver

class _Shard:
    def __init__(self, record, bench: bool):
        self.record = record
        self.stem = record["stem"]
        self.items = [("case", op, sym) for op, sym in record["items"]] + \
                     ([("bench", op, None) for op in record["ops"]] if bench else [])
        self.results: dict[int, dict] = {}
        self.attempts: list[dict] = []
        self.next = 0
        self.error = None
        self.done = False
        self.crashes = 0
        self.timer = None
        self.tvm = None


def _read_lines(path: pathlib.Path) -> list[dict]:
    out = []
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass                      # a line cut by a kill
    except OSError:
        pass
    return out


def _tail(path: pathlib.Path, n: int = 2000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode(errors="replace")


def _describe_rc(rc) -> str:
    if rc == "timeout":
        return "timeout"
    if isinstance(rc, int) and rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


class Driver:
    def __init__(self, args, bundle, work, manifest):
        self.args, self.bundle, self.work, self.manifest = args, bundle, work, manifest
        self.cmd = [sys.executable, *_python_flags(), os.path.abspath(__file__)]
        self.env = dict(os.environ, TVM_FFI_DISABLE_TORCH_C_DLPACK="1")
        if manifest["target"] != "cuda":
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            self.env["TVM_NUM_THREADS"] = str(max(1, cores // max(1, args.jobs)))

    def _common(self) -> list[str]:
        a = self.args
        out = [str(self.bundle), "--work", str(self.work), "--reps", str(a.reps),
               "--warmup", str(a.warmup), "--bench-size", str(a.bench_size)]
        for f in a.inject_fault or []:
            out += ["--inject-fault", f]
        return out

    def _spawn(self, name: str, extra: list[str], attempt: int):
        lines = self.work / "lines" / f"{name}.{attempt}.jsonl"
        log = self.work / "lines" / f"{name}.{attempt}.log"
        env = dict(self.env, TVMGRAD_TVM_STUB_LOG=str(self.work / "lines" / f"{name}.{attempt}.tvm"))
        for stale in (lines, pathlib.Path(env["TVMGRAD_TVM_STUB_LOG"])):
            stale.unlink(missing_ok=True)
        with open(log, "wb") as fh:
            proc = subprocess.Popen(self.cmd + extra + self._common() + ["--lines", str(lines)],
                                    stdout=fh, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        return proc, lines, log

    @staticmethod
    def _kill(proc) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)       # the worker's own session: it and its children
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def probe(self) -> dict:
        proc, lines, log = self._spawn("probe", ["--probe"], 0)
        try:
            proc.wait(timeout=self.args.shard_timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            return {"ok": False, "error": f"the probe did not finish in {self.args.shard_timeout} s",
                    "log": _tail(log)}
        rec = next((r for r in _read_lines(lines) if r.get("event") == "probe"), None)
        if rec is None:
            return {"ok": False, "error": f"the probe died ({_describe_rc(proc.returncode)})",
                    "log": _tail(log)}
        rec.pop("event")
        if not rec["ok"]:
            rec["log"] = _tail(log)
        return rec

    def run(self, shards: list[_Shard], deadline: float, hard: float) -> None:
        a = self.args
        pending = collections.deque(shards)
        running = {}
        while pending or running:
            now = time.time()
            while pending and len(running) < a.jobs and now < deadline:
                s = pending.popleft()
                attempt = len(s.attempts)
                proc, lines, log = self._spawn(s.stem, ["--worker", s.stem, "--skip", str(s.next),
                                                        "--attempt", str(attempt)], attempt)
                running[s.stem] = (s, proc, time.time(), lines, log)
            if now >= deadline and pending:
                for s in pending:
                    s.error = s.error or "not run: past --deadline"
                pending.clear()
            for stem, (s, proc, t0, lines, log) in list(running.items()):
                rc = proc.poll()
                if rc is None and (time.time() - t0 > a.shard_timeout or time.time() > hard):
                    self._kill(proc)
                    rc = "timeout"
                    if time.time() > hard:
                        s.error = "not run: past --hard-deadline"
                if rc is None:
                    continue
                del running[stem]
                if self._finish(s, rc, lines, log, time.time() - t0):
                    pending.appendleft(s)
            time.sleep(0.05)

    def _finish(self, s: _Shard, rc, lines, log, seconds) -> bool:
        """Record an attempt; True when the shard should resume in a fresh worker."""
        records = _read_lines(lines)
        started, ended, shard_error = None, False, None
        for r in records:
            ev = r.get("event")
            if ev == "start":
                started = r["i"]
            elif ev == "done":
                s.results[r["i"]] = r
                started = None if started == r["i"] else started
            elif ev == "end":
                ended = True
                s.timer = r.get("timer")
                s.tvm = r.get("tvm")
            elif ev == "shard_error":
                shard_error = r
        s.attempts.append({"rc": rc if rc != "timeout" else None, "outcome": _describe_rc(rc),
                           "seconds": round(seconds, 2), "from_item": s.next,
                           "log_tail": _tail(log, 1500) if (rc != 0 or not ended) else ""})
        if rc == 0 and ended:
            s.done = True
            s.next = len(s.items)
            return False
        if shard_error is not None:
            s.error = shard_error["error"]
            s.attempts[-1]["traceback"] = shard_error.get("traceback")
            return False
        if started is not None:           # the item it was in when it died or hung
            kind, op, sym = s.items[started]
            status = "timeout" if rc == "timeout" else "crashed"
            s.results[started] = {"i": started, "kind": kind, "op": op, "symbol": sym,
                                  "dtype": s.record["dtype"], "status": status,
                                  "error": f"worker {_describe_rc(rc)} during this call"}
            s.next = started + 1
        else:
            done = [i for i in s.results if i >= s.next]
            s.next = (max(done) + 1) if done else s.next
            if not done and rc != 3:
                s.error = f"worker {_describe_rc(rc)} before its first call"
                return False
        if rc != 3:
            s.crashes += 1
        if s.next >= len(s.items):
            s.done = True
            return False
        if s.crashes > self.args.max_restarts:
            s.error = f"gave up after {s.crashes} crashed or hung workers"
            return False
        return True


def _summarize(shards, probe, manifest, args, started, unpack_info) -> dict:
    entries, bench = [], []
    for s in shards:
        for i, (kind, op, sym) in enumerate(s.items):
            r = s.results.get(i)
            if r is None:
                failed = s.error is not None and not s.error.startswith("not run")
                r = {"i": i, "kind": kind, "op": op, "symbol": sym, "dtype": s.record["dtype"],
                     "status": "shard_failed" if failed else "not_run", "error": s.error}
            r = {k: v for k, v in r.items() if k not in ("event",)}
            r["shard"] = s.stem
            (entries if kind == "case" else bench).append(r)
    counts = collections.Counter(e["status"] for e in entries)
    by_dtype = {}
    for e in entries:
        d = by_dtype.setdefault(e["dtype"], collections.Counter())
        d[e["status"]] += 1
        d["entries"] += 1
    evidence = [s.tvm for s in shards if s.tvm]
    if probe.get("tvm"):
        evidence.append(probe["tvm"])
    tvm_free = bool(evidence) and all(not ev["modules"] and not ev["stub_import_attempts"]
                                      and not ev["compiler_mapped"] for ev in evidence)
    timer = next((s.timer for s in shards if s.timer), None)
    nondet = sorted({e["op"] for e in entries if e.get("bit_identical") is False})
    summary = {
        "entries": len(entries), "passed": counts.get("passed", 0),
        "statuses": dict(counts), "by_dtype": {k: dict(v) for k, v in by_dtype.items()},
        "shards": len(shards), "shards_complete": sum(1 for s in shards if s.done and not s.error),
        "shards_failed": [s.stem for s in shards if s.error or any(
            r.get("status") not in ("passed",) for r in s.results.values() if r.get("kind") == "case")],
        "all_passed": bool(entries) and counts.get("passed", 0) == len(entries),
        "tvm_free": tvm_free, "not_bit_identical_ops": nondet,
        # files in the workers' kernel cache: > 0 means a kernel was compiled on the device (nvcc),
        # i.e. a prebuilt fatbin did not match its device source
        "compiled_on_device_files": max([ev.get("cache_files", 0) for ev in evidence] or [0]),
        "bench_ok": sum(1 for b in bench if b["status"] == "ok"), "bench_items": len(bench),
        # the same calls with torch tensors on the device (run's DLPack path): passed / checked
        "resident_passed": sum(1 for e in entries if e.get("resident") == "passed"),
        "resident_checked": sum(1 for e in entries if e.get("resident") is not None),
        "wall_s": round(time.time() - started, 1),
    }
    return {
        "summary": summary,
        "bundle": {k: manifest.get(k) for k in ("target", "library_target", "archs", "dtypes",
                                                 "python_version", "created", "built_on",
                                                 "references", "entries", "cases", "skipped")},
        "device": probe.get("info"), "probe": {k: v for k, v in probe.items() if k != "info"},
        "timer": timer, "options": {k: v for k, v in vars(args).items() if k not in ("worker",)},
        "unpack": unpack_info,
        "shards": [{"stem": s.stem, "dtype": s.record["dtype"], "ops": s.record["ops"],
                    "items": len(s.items), "complete": s.done, "error": s.error,
                    "attempts": s.attempts, "tvm": s.tvm} for s in shards],
        "entries": entries, "bench": bench,
    }


def _fmt(v, width=9, digits=2):
    if v is None:
        return f"{'n/a':>{width}}"
    return f"{v:>{width}.{digits}f}"


def render(result: dict) -> str:
    s = result["summary"]
    dev = result.get("device") or {}
    lines = [f"tvmgrad GPU bundle run: {result['bundle']['target']} "
             f"({','.join(result['bundle'].get('archs') or []) or result['bundle'].get('library_target')})"
             f" on {dev.get('name', '?')} {dev.get('capability', '')}, python {dev.get('python', '?')},"
             f" torch {dev.get('torch')}",
             f"entries: {s['passed']}/{s['entries']} passed  {s['statuses']}",
             f"per dtype: " + "; ".join(f"{d}: {c.get('passed', 0)}/{c['entries']}"
                                        for d, c in s["by_dtype"].items()),
             f"shards: {s['shards_complete']}/{s['shards']} complete; with failures: "
             f"{len(s['shards_failed'])}; tvm-free: {s['tvm_free']}; wall {s['wall_s']} s",
             f"timer: {result.get('timer')}",
             f"torch tensors on the device (DLPack): {s['resident_passed']}/{s['resident_checked']} "
             f"calls give torch results equal to the numpy call's"]
    if not result["probe"].get("ok", True):
        lines.append(f"PROBE FAILED: {result['probe'].get('error')}")
    if s.get("compiled_on_device_files"):
        lines.append(f"WARNING: {s['compiled_on_device_files']} files in the kernel cache: kernels "
                     f"were compiled on the device (a prebuilt fatbin did not match)")
    if s["not_bit_identical_ops"]:
        lines.append(f"not bit-identical across two runs: {', '.join(s['not_bit_identical_ops'])}")
    bad = [e for e in result["entries"] if e["status"] != "passed"]
    if bad and result["probe"].get("ok", True):
        lines.append(f"\nnot passed ({len(bad)}):")
        for e in bad[:60]:
            why = e.get("error") or "; ".join(e.get("problems") or [])
            lines.append(f"  {e['status']:<16} {e['op']} [{e['dtype']}] {e.get('symbol') or ''}: {why}"[:240])
        if len(bad) > 60:
            lines.append(f"  ... {len(bad) - 60} more in results.json")
    for sh in result["shards"]:
        if sh["error"]:
            lines.append(f"shard {sh['stem']}: {sh['error']}")
    ok = [b for b in result["bench"] if b["status"] == "ok"]
    if ok:
        lines.append(f"\nkernel times (best of {result['options']['reps']}) at --bench-size "
                     f"{result['options']['bench_size']} elements, or at the example's size (x) where "
                     f"the library has no kernel for the bench call; n: elements of the largest input;"
                     f" GB/s: bytes of every input and output / time; copy: a copy of the same bytes")
        lines.append(f"{'op':<34} {'dtype':<9} {'n':>9} {'ours us':>9} {'GB/s':>8} {'torch us':>9} "
                     f"{'torch/us':>8} {'copy us':>9} {'%copy':>6}")
        for b in sorted(ok, key=lambda b: (b["dtype"], b["op"])):
            ratio = b["torch_us"] / b["ours_us"] if b.get("torch_us") else None
            pct = 100 * b["ours_gbs"] / b["copy_gbs"] if b.get("copy_gbs") else None
            n = f"{b['n']}{'x' if b.get('size') == 'example' else ' '}"
            lines.append(f"{b['op']:<34} {b['dtype']:<9} {n:>9} {_fmt(b['ours_us'])} {_fmt(b['ours_gbs'], 8, 1)} "
                         f"{_fmt(b.get('torch_us'))} {_fmt(ratio, 8)} {_fmt(b.get('copy_us'))} "
                         f"{_fmt(pct, 6, 0)}")
        lines.append("torch/us: PyTorch's time over ours (> 1: tvmgrad is faster)")
    timed = [e for e in result["entries"] if e.get("time_us") is not None]
    if timed:
        t = sorted(e["time_us"] for e in timed)
        lines.append(f"\nentry points at their example sizes: {len(timed)} timed, median "
                     f"{t[len(t) // 2]:.2f} us, max {t[-1]:.2f} us")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", nargs="?", help="the bundle folder (scripts/gpu_bundle.py --out)")
    p.add_argument("--out", help="where results.json and results.txt go (default $OUT, else ./gpu-bundle-results)")
    p.add_argument("--work", help="unpack here (default: a temporary folder, removed after)")
    p.add_argument("--keep-work", action="store_true")
    p.add_argument("--jobs", type=int, default=0, help="workers at a time (default 6 on CUDA, 1 on CPU)")
    p.add_argument("--shard-timeout", type=float, default=150.0, help="seconds per worker attempt")
    p.add_argument("--deadline", type=float, default=360.0,
                   help="seconds after which no shard is started (default 360)")
    p.add_argument("--hard-deadline", type=float, default=0,
                   help="seconds after which running workers are killed and the results written "
                        "(default --deadline + 90)")
    p.add_argument("--max-restarts", type=int, default=3, help="fresh workers per shard after a crash")
    p.add_argument("--reps", type=int, default=0, help="timed calls per kernel (default 20 CUDA, 5 CPU)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bench-size", type=int, default=-1,
                   help="elements for the per-op timing against torch and a copy (0: off; default "
                        "4194304 on CUDA, 16384 on CPU)")
    p.add_argument("--dtypes", help="only these dtypes (comma-separated)")
    p.add_argument("--ops", help="only shards holding these ops (comma-separated)")
    p.add_argument("--check-no-tvm", action="store_true",
                   help="fail unless every worker shows no tvm module, no import attempt of tvm and "
                        "no TVM compiler library in the process")
    p.add_argument("--inject-fault", action="append", help=argparse.SUPPRESS)   # STEM:segv|hang|exit
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--skip", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--attempt", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lines", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.probe:
        return probe(args)
    if not args.bundle:
        p.error("give the bundle folder")

    started = time.time()
    bundle = pathlib.Path(args.bundle).resolve()
    out = pathlib.Path(args.out or os.environ.get("OUT") or "gpu-bundle-results")
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((bundle / MANIFEST).read_text())
    cuda = manifest["target"] == "cuda"
    args.jobs = args.jobs or (6 if cuda else 1)
    args.hard_deadline = args.hard_deadline or args.deadline + 90
    args.reps = args.reps or (20 if cuda else 5)
    if args.bench_size < 0:
        args.bench_size = (1 << 22) if cuda else (1 << 14)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheel = manifest["wheel"]["file"]
    if f"-{tag}-" not in os.path.basename(wheel):
        print(f"this bundle's tvm_ffi wheel ({os.path.basename(wheel)}) is for Python "
              f"{manifest['python_version']}, and this is {sys.version.split()[0]}: run it with that "
              f"Python, or rebuild the bundle with --python-version", file=sys.stderr)
        return 2
    work = pathlib.Path(args.work) if args.work else pathlib.Path(tempfile.mkdtemp(prefix="tvmgrad-gpu-run-"))
    result = None
    try:
        try:
            unpack_info = unpack(bundle, work, manifest)
        except Exception as exc:  # noqa: BLE001
            result = {"summary": {"all_passed": False, "error": f"unpacking failed: {exc}"}}
            raise
        bad = set(unpack_info["bad_files"])
        selected = manifest["shards"]
        if args.dtypes:
            keep = set(args.dtypes.split(","))
            selected = [s for s in selected if s["dtype"] in keep]
        if args.ops:
            keep = set(args.ops.split(","))
            selected = [s for s in selected if keep & set(s["ops"])]
        shards = [_Shard(s, args.bench_size > 0) for s in selected]
        for s in shards:
            if s.record["cases_file"] in bad:
                s.error = f"{s.record['cases_file']} is not the file the bundle was built with (sha256)"
        driver = Driver(args, bundle, work, manifest)
        print(f"gpu_run: {len(shards)} shards, {sum(len(s.items) for s in shards)} items, "
              f"{args.jobs} at a time, unpacked in {unpack_info['seconds']} s", flush=True)
        probe_rec = driver.probe()
        if not probe_rec.get("ok"):
            print(f"gpu_run: the probe failed: {probe_rec.get('error')}\n{probe_rec.get('log', '')}",
                  file=sys.stderr, flush=True)
            for s in shards:
                s.error = s.error or f"not run: the probe failed ({probe_rec.get('error')})"
        else:
            info = probe_rec.get("info", {})
            first = info.get("first_call") or {}
            print(f"gpu_run: probe ok: {info.get('name')} {info.get('capability', '')}, copy "
                  f"{info.get('copy_64mib_gbs')} GB/s, first call {first.get('op')} "
                  f"{first.get('status')} ({first.get('time_us')} us)", flush=True)
            runnable = [s for s in shards if not s.error]
            driver.run(runnable, started + args.deadline, started + args.hard_deadline)
        result = _summarize(shards, probe_rec, manifest, args, started, unpack_info)
        if args.check_no_tvm and not result["summary"]["tvm_free"]:
            result["summary"]["all_passed"] = False
            result["summary"]["error"] = "--check-no-tvm: a worker imported or mapped TVM (see shards[].tvm)"
    finally:
        if result is not None:
            (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
            if "entries" in result:
                text = render(result)
                (out / "results.txt").write_text(text)
                print(text, flush=True)
        if not args.keep_work and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if result["summary"]["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
