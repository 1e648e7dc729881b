"""GPU bundles: everything a machine with a GPU but no TVM needs to run and check an AOT library.

A bundle is built here (``scripts/gpu_bundle.py``, which calls ``build_bundle``) and run there
(``scripts/gpu_run.py``, a copy of which is in the bundle). It is one folder:

* ``bundle.json``: the manifest (what is in it, sizes and digests, ops, dtypes, shards, how the
  references were computed, versions);
* ``gpu_run.py``: the device-side runner (stdlib and numpy until it has unpacked the rest);
* ``lib.tar.xz``: the AOT library (``aot.build``'s folder: manifest.json, ``.so`` per shard and,
  for CUDA, the nvcc fatbin per shard);
* ``cases/<shard>.npz``: per library shard, each entry point's example call (inputs cast to the
  shard's dtype, attributes) and its reference outputs computed here on LLVM;
* ``python.zip``: the tvmgrad package as a wheel would install it (te_defs/, schedules/, specs/
  mapped under tvmgrad/), the pure-Python dependencies the device may lack (``PURE_DEPS``), and a
  stub ``tvm`` package whose ``lib/`` holds the runtime libraries and whose ``__init__`` refuses
  to import (``tvmgrad.rt`` finds ``libtvm_runtime.so`` through the ``tvm`` package's folder;
  nothing may import the compiler);
* ``native.tar.xz``: ``libtvm_runtime.so``, for CUDA ``libtvm_runtime_cuda.so`` and a fallback
  ``libcudart.so.13`` (the device's own is used when it has one);
* ``wheels/apache_tvm_ffi-*.whl``: tvm_ffi for the device's Python (unzipped there, no pip).

This module holds what both sides share (the case format, tolerances, comparison) and the builder.
Importing it imports neither tvm nor tvm_ffi: the device imports it from the bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

import numpy as np

__all__ = ["build_bundle", "save_cases", "load_cases", "encode", "decode", "compare",
           "bit_identical", "TOL", "SCATTERS", "LIMIT_MIB", "MANIFEST", "FORMAT"]

FORMAT = 1
MANIFEST = "bundle.json"
LIMIT_MIB = 60                       # what one device call may carry, less room for the checkout
TOL = {"float64": 1e-9, "float32": 2e-4, "float16": 2e-2, "bfloat16": 5e-2}   # tests/test_gpu.py
# scatter-type grads that must be bit-identical run to run (tests/test_gpu.py)
SCATTERS = ("gather_grad", "index_select_grad", "scatter_grad", "send_u_recv_grad",
            "put_along_axis_grad", "index_add_grad")
DEVICE_HAS = ("numpy", "ml_dtypes", "yaml")          # the device image's own Python packages
PURE_DEPS = ("filelock", "typing_extensions")        # imported by load_library's chain (tvmgrad.cache,
                                                     # tvm_ffi), pure Python, maybe not on the device
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"
DEVICE_PYTHON = "3.12"
CUDART = "libcudart.so.13"                           # what libtvm_runtime_cuda.so links against
STUB = '''"""Stand-in for the TVM package in a tvmgrad GPU bundle: only the runtime libraries (lib/).

tvmgrad.rt finds libtvm_runtime.so through this folder; the compiler is not here and must not be
needed: importing this package records who tried and fails."""
import os as _os
import traceback as _tb
_log = _os.environ.get("TVMGRAD_TVM_STUB_LOG")
if _log:
    with open(_log, "a") as _fh:
        _fh.write("".join(_tb.format_stack(limit=12)) + "\\n----\\n")
raise ImportError("tvm is not installed here: this tvmgrad GPU bundle ships the TVM runtime only")
'''


# ------------------------------------------------------------------------------------------
# Cases: calls, inputs and references in one npz per shard

def _np_dtype_name(a: np.ndarray) -> str:
    return "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.str if a.dtype.kind == "V" else a.dtype.name


def encode(value, arrays: dict, prefix: str):
    """A JSON-able tree for ``value`` (arrays go into ``arrays`` under names from ``prefix``):
    tuples, dicts and numpy scalars are tagged so that decoding gives back the same types (a
    kernel's variant key may depend on them)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) and type(value) in (int, float):
        return value
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        name = _np_dtype_name(a)
        arrays[prefix] = a.view(np.uint16) if name == "bfloat16" else a
        return {"__a": prefix, "dtype": name}
    if isinstance(value, np.generic):
        return {"__np": _np_dtype_name(np.asarray(value)), "v": value.item()
                if np.asarray(value).dtype.name != "bfloat16" else float(value)}
    if isinstance(value, tuple):
        return {"__t": [encode(v, arrays, f"{prefix}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, arrays, f"{prefix}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {"__d": [[k, encode(v, arrays, f"{prefix}.{k}")] for k, v in value.items()]}
    if isinstance(value, (int, float)):                  # bool/int/float subclasses
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a bundle case ({prefix})")


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def decode(node, arrays):
    """The value ``encode`` stored."""
    if isinstance(node, list):
        return [decode(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    if "__a" in node:
        a = arrays[node["__a"]]
        if node["dtype"] == "bfloat16":
            return a.view(_np_dtype("bfloat16"))
        if a.dtype != _np_dtype(node["dtype"]):
            raise ValueError(f"case array {node['__a']}: dtype {a.dtype} is not {node['dtype']}")
        return a
    if "__np" in node:
        return _np_dtype(node["__np"]).type(node["v"])
    if "__t" in node:
        return tuple(decode(v, arrays) for v in node["__t"])
    if "__d" in node:
        return {k: decode(v, arrays) for k, v in node["__d"]}
    raise ValueError(f"unknown case node {sorted(node)}")


def save_cases(path, index: dict, arrays: dict) -> None:
    """One compressed npz: the arrays, and the JSON index as ``__index__`` (uint8)."""
    blob = np.frombuffer(json.dumps(index, sort_keys=True).encode(), dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez_compressed(fh, __index__=blob, **arrays)


def load_cases(path):
    """(index, arrays) of a cases file (arrays loaded eagerly: a corrupt file fails here)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    index = json.loads(bytes(arrays.pop("__index__")).decode())
    return index, arrays


# ------------------------------------------------------------------------------------------
# Comparison

def _leaves(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def compare(got: dict, want: dict, dtype: str) -> dict:
    """Outputs vs references, as tests/test_gpu.py compares them (rtol = atol = TOL[dtype], in
    float64 or complex128, NaN where the reference has NaN): {"ok", "max_abs", "max_rel",
    "tol", "problems"}."""
    tol = TOL.get(dtype, TOL["float32"])
    problems, max_abs, max_rel = [], 0.0, 0.0
    if sorted(got) != sorted(want):
        problems.append(f"outputs {sorted(got)} != reference outputs {sorted(want)}")
    w_leaves = dict(_leaves({k: want[k] for k in want if k in got}))
    g_leaves = dict(_leaves({k: got[k] for k in want if k in got}))
    if sorted(g_leaves) != sorted(w_leaves):
        problems.append(f"output structure {sorted(g_leaves)} != {sorted(w_leaves)}")
    for name, w in w_leaves.items():
        g = g_leaves.get(name)
        if w is None or g is None:
            if (w is None) != (g is None):
                problems.append(f"{name}: {'missing' if g is None else 'unexpected'}")
            continue
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            problems.append(f"{name}: shape {g.shape} != {w.shape}")
            continue
        if g.dtype != w.dtype:
            problems.append(f"{name}: dtype {g.dtype} != {w.dtype}")
        kind = np.complex128 if np.iscomplexobj(w) or np.iscomplexobj(g) else np.float64
        g64, w64 = g.astype(kind), w.astype(kind)
        if not g64.size:
            continue
        nan_w, nan_g = np.isnan(w64), np.isnan(g64)
        if np.any(nan_w != nan_g):
            problems.append(f"{name}: NaN at {int(np.sum(nan_w != nan_g))} places where the "
                            f"reference {'has none' if np.any(nan_g & ~nan_w) else 'has NaN'}")
        both = ~(nan_w | nan_g)
        inf_w = np.isinf(w64) & both
        if np.any(inf_w & (g64 != w64)):
            problems.append(f"{name}: infinities differ")
        fin = both & ~np.isinf(w64) & ~np.isinf(g64)
        err = np.abs(g64[fin] - w64[fin])
        if err.size:
            bound = tol + tol * np.abs(w64[fin])
            max_abs = max(max_abs, float(err.max()))
            rel = err / np.maximum(np.abs(w64[fin]), 1e-30)
            max_rel = max(max_rel, float(rel.max()))
            bad = int(np.sum(err > bound))
            if bad:
                worst = int(np.argmax(err - bound))
                problems.append(f"{name}: {bad} of {err.size} values off by more than "
                                f"{tol:g} + {tol:g}*|ref| (worst {g64[fin][worst]!r} vs "
                                f"{w64[fin][worst]!r})")
        if np.any(np.isinf(g64) & ~np.isinf(w64) & both):
            problems.append(f"{name}: infinite where the reference is finite")
    return {"ok": not problems, "max_abs": max_abs, "max_rel": max_rel, "tol": tol,
            "problems": problems[:8]}


def bit_identical(a: dict, b: dict) -> bool:
    la, lb = dict(_leaves(a)), dict(_leaves(b))
    if sorted(la) != sorted(lb):
        return False
    for k, x in la.items():
        y = lb[k]
        if x is None or y is None:
            if (x is None) != (y is None):
                return False
            continue
        x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            return False
    return True


# ------------------------------------------------------------------------------------------
# Building (here: needs TVM for the libraries; imported lazily)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _mib(n: int) -> float:
    return n / (1 << 20)


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _package_files(root: pathlib.Path = ROOT) -> list[tuple[str, pathlib.Path]]:
    """(name in the zip, file) of the tvmgrad package as its wheel holds it: setup.py's package
    list and folder mapping (te_defs/ -> tvmgrad/te_defs, ...) and package data."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_tvmgrad_setup", root / "setup.py")
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)              # defines packages(); setup() runs only as __main__
    packages, package_dir = setup.packages(root)
    data = getattr(setup, "PACKAGE_DATA", {})
    files = []
    for pkg in packages:
        folder = root / package_dir.get(pkg, pkg.replace(".", "/"))
        prefix = pkg.replace(".", "/")
        for path in sorted(folder.glob("*.py")):
            files.append((f"{prefix}/{path.name}", path))
        for pattern in data.get(pkg, []):
            for path in sorted(folder.glob(pattern)):
                files.append((f"{prefix}/{path.name}", path))
    return files


def _dep_files(name: str) -> list[tuple[str, pathlib.Path]]:
    """A pure-Python module or package as installed here."""
    import importlib.util
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{name} is not installed here: pip install {name}")
    if spec.submodule_search_locations:
        folder = pathlib.Path(list(spec.submodule_search_locations)[0])
        out = []
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                if path.suffix in (".so", ".pyd"):
                    raise RuntimeError(f"{name} is not pure Python ({path.name})")
                out.append((f"{name}/{path.relative_to(folder).as_posix()}", path))
        return out
    return [(pathlib.Path(spec.origin).name, pathlib.Path(spec.origin))]


def _version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _write_python_zip(path: pathlib.Path) -> dict:
    files = _package_files()
    deps = {}
    for dep in PURE_DEPS:
        dep_files = _dep_files(dep)
        files += [(f"deps/{name}", p) for name, p in dep_files]
        deps[dep] = _version(dep.replace("_", "-")) or _version(dep)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, p in files:
            z.write(p, f"py/{name}" if not name.startswith("deps/") else name)
        z.writestr("py/tvm/__init__.py", STUB)
    return {"files": len(files) + 1, "deps": deps}


def _tvm_lib_dir() -> pathlib.Path:
    import importlib.util
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the apache-tvm package is not installed here")
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / "lib"


def _find_cudart() -> pathlib.Path | None:
    from .cuda import nvcc_path
    roots = []
    nvcc = nvcc_path()
    if nvcc:
        real = pathlib.Path(os.path.realpath(nvcc)).parent.parent
        roots += [real / "lib64", real / "lib", real / "targets" / "x86_64-linux" / "lib"]
    roots += [pathlib.Path("/usr/local/cuda/lib64"), pathlib.Path("/usr/local/cuda/lib")]
    for root in roots:
        if (root / CUDART).is_file():
            return root / CUDART
    return None


def _write_native(path: pathlib.Path, cuda: bool) -> dict:
    lib = _tvm_lib_dir()
    names = ["libtvm_runtime.so"] + (["libtvm_runtime_cuda.so"] if cuda else [])
    record = {}
    with tarfile.open(path, "w:xz", preset=9) as tar:
        for name in names:
            src = lib / name
            size = src.stat().st_size
            # the runtime is a few MiB; anything near the compiler's size is the wrong file
            if size > 32 << 20:
                raise RuntimeError(f"{src} is {_mib(size):.0f} MiB: not the TVM runtime")
            tar.add(src, f"py/tvm/lib/{name}")
            record[name] = {"bytes": size, "sha256": _sha256(src), "from": str(src)}
        if cuda:
            cudart = _find_cudart()
            if cudart is not None:
                tar.add(os.path.realpath(cudart), f"native/{CUDART}")
                record[CUDART] = {"bytes": os.path.getsize(os.path.realpath(cudart)),
                                  "from": str(cudart), "note": "fallback: the device's own is "
                                  "preferred"}
    return record


def _wheel_tag(python_version: str) -> str:
    major, minor = python_version.split(".")[:2]
    return f"cp{major}{minor}"


def _obtain_ffi_wheel(dest: pathlib.Path, python_version: str, plat: str, given=None) -> dict:
    """apache-tvm-ffi (the installed version) for the device's Python: a given wheel, else the
    wheel cache, else pip download (PyPI), else, when the device's Python is this one, the
    installed package zipped as a wheel."""
    from .cachedir import cache_dir
    version = _version("apache-tvm-ffi")
    if version is None:
        raise RuntimeError("apache-tvm-ffi is not installed here")
    tag = _wheel_tag(python_version)
    dest.mkdir(parents=True, exist_ok=True)
    if given is not None:
        given = pathlib.Path(given)
        shutil.copyfile(given, dest / given.name)
        return {"file": f"wheels/{given.name}", "version": version, "source": str(given)}
    cache = cache_dir() / "wheels"
    arch = "x86_64" if plat.endswith("x86_64") else plat.rsplit("_", 1)[-1]
    glob = f"apache_tvm_ffi-{version}-{tag}-*{arch}.whl"
    found = sorted(cache.glob(glob)) if cache.exists() else []
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", f"apache-tvm-ffi=={version}", "--no-deps",
               "--only-binary=:all:", "--python-version", python_version, "--platform", plat,
               "-d", str(cache), "-q", "--timeout", "15", "--retries", "1"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        found = sorted(cache.glob(glob))
        if not found:
            here = f"{sys.version_info.major}.{sys.version_info.minor}"
            if python_version != here:
                raise RuntimeError(f"pip download of apache-tvm-ffi {version} for Python "
                                   f"{python_version} ({plat}) failed (pass --ffi-wheel):\n"
                                   f"{proc.stderr[-2000:]}")
            return _zip_installed_ffi(dest, version, tag)
        source = "pip download (PyPI)"
    else:
        source = f"wheel cache {cache}"
    wheel = found[-1]
    shutil.copyfile(wheel, dest / wheel.name)
    return {"file": f"wheels/{wheel.name}", "version": version, "source": source}


def _zip_installed_ffi(dest: pathlib.Path, version: str, tag: str) -> dict:
    import importlib.util
    folder = pathlib.Path(list(importlib.util.find_spec("tvm_ffi").submodule_search_locations)[0])
    name = f"apache_tvm_ffi-{version}-{tag}-{tag}-linux_{platform.machine()}.whl"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest / name, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                z.write(path, f"tvm_ffi/{path.relative_to(folder).as_posix()}")
        info = folder.parent / f"apache_tvm_ffi-{version}.dist-info"
        if info.is_dir():
            for path in sorted(info.iterdir()):
                if path.is_file():
                    z.write(path, f"{info.name}/{path.name}")
    return {"file": f"wheels/{name}", "version": version,
            "source": f"the installed package {folder} (offline; this machine's Python)"}


def _cases_for_library(lib: dict, reference, progress) -> tuple[dict, dict, list]:
    """The cases of one library shard: per entry point, the first variant call that plans to it
    (as aot.plans_for picks it), its inputs and the reference outputs."""
    from .aot import variant_calls
    from .examples import cast
    from .planning import plan_call
    dtype = lib["dtype"]
    by_key = {(e["op"], e["key"]): e for e in lib["entries"] if e.get("tuned_shapes") is None}
    arrays, cases, covered = {}, [], set()
    for op in lib["ops"]:
        for inputs, attrs in variant_calls(op):
            data = {k: cast(v, dtype) for k, v in inputs.items()}
            try:
                plan = plan_call(op, data, attrs).plan
            except (ValueError, TypeError, NotImplementedError):
                continue
            if plan.make is None:
                continue
            found = by_key.get((op, repr(plan.key)))
            if found is None or found["symbol"] in covered:
                continue
            covered.add(found["symbol"])
            n = len(cases)
            case = {"op": op, "symbol": found["symbol"], "key": found["key"], "dtype": dtype,
                    "inputs": encode(data, arrays, f"c{n}.in"),
                    "attrs": encode(dict(attrs), arrays, f"c{n}.attr"), "ref": None,
                    "ref_error": None}
            try:
                case["ref"] = encode(reference(op, data, attrs), arrays, f"c{n}.ref")
            except Exception as exc:  # noqa: BLE001 - recorded; the device runs it unchecked
                case["ref_error"] = f"{type(exc).__name__}: {exc}"[:500]
            cases.append(case)
            progress()
    uncovered = [e["symbol"] for e in lib["entries"] if e["symbol"] not in covered]
    index = {"format": FORMAT, "dtype": dtype, "shard": lib["shard"], "lib_file": lib["file"],
             "ops": lib["ops"], "cases": cases}
    return index, arrays, uncovered


def _tar_folder(folder: pathlib.Path, path: pathlib.Path, arcname: str) -> None:
    with tarfile.open(path, "w:xz", preset=6) as tar:
        for p in sorted(folder.iterdir()):
            tar.add(p, f"{arcname}/{p.name}")


def build_bundle(out, *, target: str = "cuda", dtypes=("float32",), ops=None, archs=("sm_90",),
                 jobs: int = 0, python_version: str | None = None, plat: str = DEFAULT_PLATFORM,
                 refs: str | None = None, ffi_wheel=None, limit_mib: float = LIMIT_MIB,
                 progress: bool = True, log=print) -> dict:
    """Build a GPU bundle into ``out`` (replaced); returns its manifest. Raises RuntimeError when
    the bundle is over ``limit_mib`` (it is still written, for inspection).

    ``target``: "cuda" (the library under test is CUDA for ``archs``; references from an LLVM
    library of the same ops and dtypes) or "llvm" (a CPU dry run: the same layout with an LLVM
    library). ``refs``: "llvm-lib" (the LLVM AOT library of the same ops and dtypes: the same
    plans and PrimFuncs, compiled once per shard, cached) or "run" (``tvmgrad.run`` on LLVM per
    call, compiling each kernel on demand); default "llvm-lib" for cuda, "run" for llvm (the
    library under test is then LLVM itself). ``python_version``: the device's Python (the wheel's
    tag; default 3.12 for cuda, this interpreter's for llvm).
    """
    from . import aot, registry
    t_start = time.time()
    out = pathlib.Path(out)
    target = target.strip()
    is_cuda = target.startswith("cuda")
    if not is_cuda and not target.startswith("llvm"):
        raise ValueError(f"unknown target {target!r}: cuda or llvm")
    refs = refs or ("llvm-lib" if is_cuda else "run")
    if refs not in ("llvm-lib", "run"):
        raise ValueError(f"refs must be llvm-lib or run, not {refs!r}")
    python_version = python_version or (DEVICE_PYTHON if is_cuda else
                                        f"{sys.version_info.major}.{sys.version_info.minor}")
    dtypes = tuple(dtypes)
    if ops is None:
        ops = [op.name for op in registry.ops().values() if op.available and not op.is_forward]
    ops = sorted(ops)
    timings = {}

    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"{out.name}.building-", dir=parent))
    try:
        stage = work / "bundle"
        stage.mkdir()
        # (a) the library under test
        t = time.time()
        log(f"[1/5] {target} library: {len(ops)} ops, {', '.join(dtypes)}"
            + (f", {', '.join(archs)}" if is_cuda else ""))
        libdir = work / "lib"
        manifest = aot.build(libdir, target="cuda" if is_cuda else target, dtypes=dtypes, ops=ops,
                             archs=tuple(archs), jobs=jobs, progress=progress)
        timings["library_s"] = round(time.time() - t, 1)

        # (b) cases and references
        t = time.time()
        if refs == "llvm-lib":
            log("[2/5] references: LLVM library of the same ops and dtypes")
            ref_dir = work / "ref-llvm"
            aot.build(ref_dir, target="llvm", dtypes=dtypes, ops=ops, jobs=jobs, progress=progress)
            ref_lib = aot.load_library(ref_dir)

            def reference(op, data, attrs):
                try:
                    return ref_lib.run(op, data, attrs)
                except ValueError as exc:      # the loader cannot find a kernel the build has
                    if "has no kernel for this call" not in str(exc):
                        raise
                    import tvmgrad
                    return tvmgrad.run(op, data, attrs)
            refs_how = ("the LLVM AOT library of the same ops and dtypes (aot.build target=llvm, "
                        "the portable CPU baseline), Library.run per call: the same plans and "
                        "PrimFuncs as tvmgrad.run on LLVM; tvmgrad.run where that library's "
                        "loader finds no kernel for a call its build holds")
        else:
            log("[2/5] references: tvmgrad.run on LLVM per call")
            import tvmgrad
            reference = tvmgrad.run
            refs_how = "tvmgrad.run(op, inputs, attrs) on LLVM (target='llvm', this host)"
        timings["ref_library_s"] = round(time.time() - t, 1)
        t = time.time()
        log("[3/5] cases: each entry point's call, its inputs and reference outputs")
        (stage / "cases").mkdir()
        total_entries = sum(len(lib["entries"]) for lib in manifest["libraries"])
        bar = _bar(total_entries, progress, "cases")
        shards, uncovered = [], {}
        for lib in manifest["libraries"]:
            if not lib.get("file"):
                continue
            index, arrays, missing = _cases_for_library(lib, reference, lambda: bar.update(1))
            stem = lib["file"][: -len(".so")]
            save_cases(stage / "cases" / f"{stem}.npz", index, arrays)
            if missing:
                uncovered[stem] = missing
            shards.append({"stem": stem, "dtype": lib["dtype"], "shard": lib["shard"],
                           "lib_file": lib["file"], "cases_file": f"cases/{stem}.npz",
                           "ops": lib["ops"], "entries": len(lib["entries"]),
                           "cases": len(index["cases"]),
                           "items": [[c["op"], c["symbol"]] for c in index["cases"]],
                           "ref_errors": sum(1 for c in index["cases"] if c["ref_error"])})
        bar.close()
        timings["cases_s"] = round(time.time() - t, 1)

        # (c)-(e) the runtime: library archive, python, natives, wheel
        t = time.time()
        log("[4/5] packing the library, tvmgrad, the TVM runtime and the tvm_ffi wheel")
        _tar_folder(libdir, stage / "lib.tar.xz", "lib")
        python = _write_python_zip(stage / "python.zip")
        native = _write_native(stage / "native.tar.xz", is_cuda)
        wheel = _obtain_ffi_wheel(stage / "wheels", python_version, plat, ffi_wheel)
        runner = ROOT / "scripts" / "gpu_run.py"
        shutil.copyfile(runner, stage / "gpu_run.py")
        timings["pack_s"] = round(time.time() - t, 1)

        # the manifest
        files = {}
        for path in sorted(stage.rglob("*")):
            if path.is_file():
                files[path.relative_to(stage).as_posix()] = {"bytes": path.stat().st_size,
                                                             "sha256": _sha256(path)}
        lib_bytes = {}
        for lib in manifest["libraries"]:
            for name in ("file", "fatbin"):
                if lib.get(name):
                    lib_bytes[lib[name]] = (libdir / lib[name]).stat().st_size
        total = sum(f["bytes"] for f in files.values())
        skipped = [s for lib in manifest["libraries"] for s in lib.get("skipped", [])]
        import tvm
        bundle = {
            "format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "built_on": {"host": platform.node(), "python": platform.python_version(),
                         "tvm": tvm.__version__, "tvm_ffi": wheel["version"]},
            "target": "cuda" if is_cuda else "llvm", "library_target": manifest["target"],
            "archs": manifest["archs"], "cpu": manifest.get("cpu"), "dtypes": list(dtypes),
            "ops": manifest["ops"], "python_version": python_version, "platform": plat,
            "wheel": wheel, "python": python, "native": native,
            "references": {"method": refs, "how": refs_how,
                           "tolerance": {d: TOL[d] for d in dtypes if d in TOL},
                           "comparison": "rtol = atol = tolerance per dtype, in float64 "
                                         "(complex128), NaN where the reference has NaN "
                                         "(tests/test_gpu.py)"},
            "shards": shards,
            "entries": sum(s["entries"] for s in shards),
            "cases": sum(s["cases"] for s in shards),
            "uncovered_entries": uncovered, "skipped": skipped,
            "library": {"files": len(lib_bytes), "bytes": sum(lib_bytes.values()),
                        "so_bytes": sum(v for k, v in lib_bytes.items() if k.endswith(".so")),
                        "fatbin_bytes": sum(v for k, v in lib_bytes.items() if k.endswith(".fatbin")),
                        "inputs_digest": manifest["inputs_digest"]},
            "files": files, "bytes": total, "limit_bytes": int(limit_mib * (1 << 20)),
            "timings": timings,
        }
        timings["total_s"] = round(time.time() - t_start, 1)
        (stage / MANIFEST).write_text(json.dumps(bundle, indent=1, sort_keys=True))
        total += (stage / MANIFEST).stat().st_size
        bundle["bytes"] = total

        old = None
        if out.exists():
            old = work / "old"
            os.replace(out, old)
        os.replace(stage, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"[5/5] {out}: {_mib(total):.1f} MiB ({len(shards)} shards, {bundle['entries']} entry "
        f"points, {bundle['cases']} cases) in {timings['total_s']:.0f} s")
    if total > limit_mib * (1 << 20):
        raise RuntimeError(f"{out} is {_mib(total):.1f} MiB, over the {limit_mib:g} MiB a device "
                           f"call can carry: split it (fewer --dtypes or --ops per bundle)")
    return bundle


def _bar(total: int, show: bool, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:                                  # pragma: no cover
        show = False
    if not show:
        class _Null:
            def update(self, n=1):
                pass

            def close(self):
                pass
        return _Null()
    return tqdm(total=total, unit="entry", desc=desc)


def describe(bundle: dict) -> str:
    """A few lines on a bundle manifest (sizes per part)."""
    lines = [f"bundle: target {bundle['target']} {','.join(bundle['archs']) or ''} dtypes "
             f"{','.join(bundle['dtypes'])}: {len(bundle['ops'])} ops, {len(bundle['shards'])} "
             f"shards, {bundle['entries']} entry points, {bundle['cases']} cases, "
             f"{_mib(bundle['bytes']):.1f} MiB (limit {_mib(bundle['limit_bytes']):.0f} MiB)"]
    groups = {}
    for name, f in bundle["files"].items():
        group = name.split("/")[0] if "/" in name else name
        groups[group] = groups.get(group, 0) + f["bytes"]
    lines.append("  " + ", ".join(f"{k} {_mib(v):.2f} MiB" for k, v in sorted(groups.items())))
    lib = bundle["library"]
    lines.append(f"  library uncompressed: {_mib(lib['bytes']):.1f} MiB ({_mib(lib['so_bytes']):.1f} "
                 f"MiB .so, {_mib(lib['fatbin_bytes']):.1f} MiB fatbin); timings {bundle['timings']}")
    if bundle["skipped"]:
        lines.append(f"  skipped by the build: {len(bundle['skipped'])} (op, dtype) pairs, e.g. "
                     + "; ".join(f"{s['op']} [{s['dtype']}]" for s in bundle["skipped"][:5]))
    if bundle["uncovered_entries"]:
        n = sum(len(v) for v in bundle["uncovered_entries"].values())
        lines.append(f"  entry points without a case: {n}")
    return "\n".join(lines)
