"""Ahead-of-time kernel libraries: build on a machine without a GPU, load with the runtime only.

``build(out, target=..., dtypes=..., ops=...)`` writes, per dtype, a few *shards*: the selected
ops grouped by their te_defs module, at most ``SHARD_OPS`` ops each. A shard is

* ``<target>-<dtype>-<module>-<n>.so``: its ops' kernel variants in one shared library (symbolic
  shapes; one entry point per variant: an op's example calls, every bool attribute value, and
  every broadcast pattern of a broadcasting pointwise op over up to two coalesced dims);
* for CUDA, ``<target>-<dtype>-<module>-<n>.fatbin``: the device code precompiled with nvcc for
  every requested arch (no fast math), so that loading needs only the TVM runtime and the CUDA
  driver;

and one ``manifest.json`` lists each entry point (op, dtype, variant key, argument list, shape
inference, baked attributes), the target, arches, TVM version and source digests.

Shards are the unit of work and of reuse: a process pool builds them in parallel, and each built
shard is kept in the kernel cache (``<cache>/aot/``) under a digest of everything that shapes
its code (its ops' sources, the schedule rules, TVM, target, arches, dtype, tuning records). A
rebuild after editing one te_defs module recompiles that module's shards only. The output
directory is replaced atomically; building again with the same inputs is a no-op.

``load_library(dir)`` plans calls with the same family planners as ``tvmgrad.run`` (pure Python),
finds the entry point by variant key and calls it through ``tvm_ffi`` and ``libtvm_runtime``:
``tvm`` itself (the compiler) is never imported.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import re
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from . import __version__, registry, rt
from .call import bind
from .dtypes import FLOATS, dtype as as_dtype
from .runtime import Launch

__all__ = ["build", "load_library", "Library", "variant_calls", "shards", "MANIFEST"]

MANIFEST = "manifest.json"
FORMAT = 2
SHARD_OPS = 12          # ops per shard: small enough to spread over cores and to rebuild alone
_ARCH = re.compile(r"^sm_\d+a?$")


# ------------------------------------------------------------------------------------------
# Variants

def variant_calls(op: str) -> list[tuple[dict, dict]]:
    """Example calls of ``op`` covering the kernel variants a library should hold."""
    from . import examples
    entry = registry.get(op)
    base = [examples.sample(op)]
    bcast = examples.broadcast_variant(op)
    if bcast is not None:
        base.append(bcast)
    impl = entry.implementation
    if impl.family_kind == "pointwise":
        base += _broadcast_patterns(entry, impl, base[0])
    calls = []
    bools = [p.name for p in entry.spec.attrs if p.base_type == "bool"]
    for inputs, attrs in base:
        for values in itertools.product((False, True), repeat=len(bools)):
            calls.append((inputs, {**attrs, **dict(zip(bools, values))}))
    return calls


def _broadcast_patterns(entry, impl, example):
    """Every way the broadcasting inputs of a pointwise op can broadcast over 2 dims."""
    inputs, attrs = example
    free = [n for n in impl._broadcasting_inputs(entry.spec) if inputs.get(n) is not None]
    if len(free) < 2:
        return []
    full = (3, 5)
    shapes = {"full": full, "row": (1, 5), "col": (3, 1), "scalar": (1, 1)}
    out = []
    for combo in itertools.product(shapes, repeat=len(free)):
        if all(c != "full" for c in combo) and not ("row" in combo and "col" in combo):
            continue                         # every dim must be set by someone
        new = {}
        for name, value in inputs.items():
            if value is None:
                new[name] = None
                continue
            shape = shapes[combo[free.index(name)]] if name in free else full
            flat = np.asarray(value).reshape(-1)
            new[name] = np.resize(flat, shape)
        out.append((new, attrs))
    return out


def plans_for(op: str, dtype: str) -> list:
    """The distinct kernel plans of ``op``'s variants in ``dtype`` (ValueError if unsupported)."""
    entry = registry.get(op)
    impl = entry.implementation
    if dtype not in impl.dtypes:
        raise ValueError(f"{op} does not support {dtype} (it supports {', '.join(impl.dtypes)})")
    from .examples import cast
    plans, accepted, refused = {}, 0, None
    for inputs, attrs in variant_calls(op):
        try:
            call = bind(entry.spec, {k: cast(v, dtype) for k, v in inputs.items()}, attrs)
            plan = entry.impl.plan(call, registry.infer_outputs(entry, call))
        except (ValueError, TypeError, NotImplementedError) as exc:
            refused = refused or exc        # an attribute combination the op refuses
            continue
        accepted += 1
        if plan.make is not None:
            plans.setdefault(repr(plan.key), (call, plan))
    if not accepted and refused is not None:
        raise refused
    return list(plans.values())


# ------------------------------------------------------------------------------------------
# Building

def _target_spec(target: str, archs):
    from .targets import resolve
    if target == "cuda" or target.startswith("cuda"):
        return resolve({"kind": "cuda", "arch": archs[0]})
    return resolve(target)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _entry_json(op, call, plan, tuned_shapes=None) -> dict:
    base_key = plan.key[:-3] if tuned_shapes is not None else plan.key
    return {
        "op": op, "symbol": plan.symbol, "key": repr(base_key), "pattern": plan.pattern,
        "schedule": "tuned" if tuned_shapes is not None else "rules", "tuned_shapes": tuned_shapes,
        "args": [{"kind": a.kind, "name": a.name, "index": a.index,
                  "dtype": a.dtype} for a in plan.args],
        "infer_meta": call.spec.infer_meta.func if call.spec.infer_meta else None,
        "static_attrs": {k: v for k, v in call.attrs.items()
                         if not any(a.kind == "scalar" and a.name == k for a in plan.args)},
    }


def _tuned_plans(db_root, target_key, op, dtype) -> list:
    """Size-specialised kernels of ``op`` that a tuning database holds for this target/dtype."""
    from .tune import Database, call_shapes, record_call, tuned_plan
    if db_root is None:
        return []
    db = Database(db_root)
    entry = registry.get(op)
    plans = []
    for record in db.records(target_key, dtype):
        if record.op != op or record.inputs is None:
            continue
        inputs, attrs = record_call(record)
        call = bind(entry.spec, inputs, attrs)
        outs = registry.infer_outputs(entry, call)
        plan = tuned_plan(entry.impl.plan(call, outs), call, outs, _LibTarget("", None, target_key), db)
        if plan.trace is not None:
            plans.append((call, plan, call_shapes(plan, call, outs)))
    return plans


@dataclass(frozen=True)
class Shard:
    """Some ops of one te_defs module, built for one dtype into one library file."""

    dtype: str
    name: str                 # <module>-<n>
    ops: tuple[str, ...]

    def stem(self, kind: str) -> str:
        return f"{_slug(kind)}-{self.dtype}-{self.name}"


def shards(ops, dtypes) -> list[Shard]:
    """The shards of a build: per dtype, the ops grouped by te_defs module in chunks of
    ``SHARD_OPS`` (sorted, so the same selection always gives the same shards)."""
    by_module: dict[str, list[str]] = {}
    for op in sorted(ops):
        module = registry.get(op).implementation.module.rsplit(".", 1)[-1]
        by_module.setdefault(module, []).append(op)
    out = []
    for dtype in dtypes:
        for module, names in sorted(by_module.items()):
            for n, i in enumerate(range(0, len(names), SHARD_OPS)):
                out.append(Shard(dtype, f"{module}-{n}", tuple(names[i:i + SHARD_OPS])))
    return out


def _shard_digest(shard: Shard, target, archs, tuning_digest: str) -> str:
    """Everything that shapes a shard's code: its ops' sources and schedule rules, TVM, the
    target and arches, the tuning records (a different digest: a different shard)."""
    import tvm

    from . import cuda
    from .build import _file_digest, source_digest
    kind = "cuda" if target.startswith("cuda") else "llvm"
    h = hashlib.sha256(repr((FORMAT, __version__, tvm.__version__, target, tuple(archs), shard,
                             tuning_digest)).encode())
    for builder in (__file__, cuda.__file__):          # how shards are built and compiled
        h.update(_file_digest(builder).encode())
    for op in shard.ops:
        entry = registry.get(op)          # an invoke op is scheduled by its forward op's pattern
        pattern = getattr(entry.implementation, "pattern", "generic")
        h.update(source_digest(entry.impl, kind, pattern).encode())
    return h.hexdigest()


def _shard_cache(target) -> pathlib.Path:
    import tvm

    from .cache import cache_dir
    return cache_dir() / "aot" / f"tvm-{_slug(tvm.__version__)}" / _slug(target)


def _cached_shard(folder: pathlib.Path):
    """A built shard's library record, if the folder holds one whose files are intact."""
    lib = _read_json(folder / "shard.json")
    if lib is None or not _verify(folder, {"libraries": [lib]}):
        return None
    return lib


def _obtain_shard(job) -> tuple[str, dict]:
    """(digest, library record) of a shard, built into the shard cache unless it is there (runs
    in a worker; a file lock keeps concurrent builds of the same shard to one)."""
    shard, digest, target, archs, db_root = job
    from filelock import FileLock
    folder = _shard_cache(target) / digest
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        lib = _cached_shard(folder)
        if lib is not None:
            return digest, lib
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=folder.parent))
        try:
            lib = _build_shard(shard, tmp, target, archs, db_root)
            for name in ("file", "fatbin"):
                if lib.get(name):
                    lib[name + "_sha256"] = hashlib.sha256((tmp / lib[name]).read_bytes()).hexdigest()
            (tmp / "shard.json").write_text(json.dumps(lib, indent=1, sort_keys=True))
            if folder.exists():
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return digest, lib


def _build_shard(shard: Shard, out_dir: pathlib.Path, target, archs, db_root) -> dict:
    """One library: every plan of the shard's ops in its dtype."""
    from .build import compile_lowered, lower
    from .cuda import compile_cubin, device_source, fatbin_contents
    tgt = _target_spec(target, archs)
    dtype = shard.dtype
    entries, skipped, funcs = [], [], {}
    for op in shard.ops:
        try:
            plans = [(c, p, None) for c, p in plans_for(op, dtype)]
            plans += _tuned_plans(db_root, tgt.key, op, dtype)
        except (ValueError, TypeError, NotImplementedError) as exc:
            skipped.append({"op": op, "dtype": dtype, "reason": str(exc)})
            continue
        for call, plan, tuned_shapes in plans:
            if plan.symbol in funcs:
                continue
            try:
                funcs[plan.symbol] = lower(plan, tgt)["main"]
            except Exception as exc:  # noqa: BLE001 - a variant that does not build is listed
                skipped.append({"op": op, "dtype": dtype, "key": repr(plan.key),
                                "reason": f"{type(exc).__name__}: {exc}"[:500]})
                continue
            entries.append(_entry_json(op, call, plan, tuned_shapes))
    stem = shard.stem(tgt.kind)
    lib = {"dtype": dtype, "shard": shard.name, "ops": list(shard.ops), "file": None,
           "entries": sorted(entries, key=lambda e: e["symbol"]), "skipped": skipped}
    if not funcs:
        return lib
    lib["file"] = f"{stem}.so"
    ex = compile_lowered(funcs, tgt)
    ex.export_library(str(out_dir / lib["file"]))
    if tgt.is_gpu:
        source = device_source(ex)
        lib["device_source_sha256"] = hashlib.sha256(source.encode()).hexdigest()
        lib["fatbin"] = f"{stem}.fatbin"
        cubins = {arch: compile_cubin(source, arch) for arch in archs}
        _write_fatbin(str(out_dir / lib["fatbin"]), source, archs)
        lib["fatbin_images"] = [f"{kind} {arch}" for kind, arch in
                                fatbin_contents((out_dir / lib["fatbin"]).read_bytes())]
        lib["ptxas"] = {arch: {k.name: {"registers": k.registers, "spill_stores": k.spill_stores,
                                        "spill_loads": k.spill_loads, "shared": k.shared}
                               for k in c.kernels.values()} for arch, c in cubins.items()}
    return lib


def _write_fatbin(path, source, archs):
    """nvcc once for all arches: a fatbin with SASS for each and PTX of the newest."""
    import subprocess

    from .cuda import NVCC_FLAGS, for_nvcc, nvcc_path
    with tempfile.TemporaryDirectory(prefix="tvmgrad-fatbin-") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        pathlib.Path(src).write_text(for_nvcc(source))
        gencode = []
        for arch in archs:
            num = arch[3:]
            gencode += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
        newest = max(archs, key=lambda a: int(re.sub(r"\D", "", a)))[3:]
        gencode += ["-gencode", f"arch=compute_{newest},code=compute_{newest}"]
        proc = subprocess.run([nvcc_path(), "--fatbin", *NVCC_FLAGS, *gencode, "-o", path, src],
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"nvcc fatbin failed:\n{proc.stderr[-3000:]}")


def _tuning_digest(tuning_db) -> str:
    h = hashlib.sha256()
    if tuning_db is not None:
        for path in sorted(pathlib.Path(tuning_db).rglob("*.json")):
            h.update(path.read_bytes())
    return h.hexdigest()


def build(out, *, target: str = "llvm", dtypes=("float32",), ops=None, archs=("sm_80", "sm_90"),
          jobs: int = 0, progress: bool = True, tuning_db=None) -> dict:
    """Build (or leave, if up to date) an AOT library directory; returns its manifest."""
    import multiprocessing

    out = pathlib.Path(out)
    dtypes = tuple(dtypes)
    for dt in dtypes:
        if dt not in FLOATS:
            raise ValueError(f"unknown dtype {dt!r}: choose from {', '.join(FLOATS)}")
    is_cuda = target.startswith("cuda")
    archs = tuple(archs) if is_cuda else ()
    for arch in archs:
        if not _ARCH.match(arch):
            raise ValueError(f"unknown CUDA arch {arch!r}: use names like sm_80, sm_90")
    available = [op.name for op in registry.ops().values() if op.available and not op.is_forward]
    if ops is None:
        ops = available
    for op in ops:
        entry = registry.get(op)            # unknown op -> ValueError with suggestions
        if not entry.available:
            raise ValueError(f"{op} is not implemented yet")
    ops = tuple(sorted(ops))
    _target_spec(target, archs or ("sm_80",))            # unknown target -> ValueError
    if tuning_db is None:
        from .tune import active_database
        db = active_database()
        tuning_db = str(db.root) if db is not None else None
    tuning = _tuning_digest(tuning_db)
    work = [(shard, _shard_digest(shard, target, archs, tuning)) for shard in shards(ops, dtypes)]
    digest = hashlib.sha256(repr([d for _, d in work]).encode()).hexdigest()
    current = _read_json(out / MANIFEST)
    if current is not None and current.get("inputs_digest") == digest and _verify(out, current):
        return current

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        jobs_list = [(shard, d, target, archs, tuning_db) for shard, d in work]
        cached = {d: _cached_shard(_shard_cache(target) / d) for _, d in work}
        todo = [j for j in jobs_list if cached[j[1]] is None]
        bar = _bar(sum(len(s.ops) for s, _ in work), progress)
        bar.update(sum(len(s.ops) for s, d in work if cached[d] is not None))
        workers = min(len(todo), jobs or len(os.sched_getaffinity(0)))
        if workers > 1:
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                _collect(pool.imap_unordered(_obtain_shard, todo), cached, bar)
        else:
            _collect(map(_obtain_shard, todo), cached, bar)
        bar.close()
        libs = []
        for shard, d in work:
            lib = cached[d]
            for name in ("file", "fatbin"):
                if lib.get(name):
                    shutil.copyfile(_shard_cache(target) / d / lib[name], tmp / lib[name])
            libs.append(dict(lib, shard_digest=d))
        import tvm
        manifest = {
            "format": FORMAT, "tvmgrad": __version__, "tvm": tvm.__version__, "target": target,
            "target_key": _target_spec(target, archs or ("sm_80",)).key, "archs": list(archs),
            "dtypes": list(dtypes), "ops": list(ops), "inputs_digest": digest, "libraries": libs,
            "tuning_db": tuning_db,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        _swap_in(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _collect(results, cached, bar) -> None:
    """Record each built shard (in completion order: imap_unordered) and advance the bar."""
    for digest, lib in results:
        cached[digest] = lib
        bar.update(len(lib["ops"]))


def _bar(total: int, show: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="op", desc="tvmgrad build", disable=not show)


def _swap_in(tmp: pathlib.Path, out: pathlib.Path) -> None:
    """Replace ``out`` by ``tmp`` so that readers see the old or the new library, never a mix."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}-old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _verify(out: pathlib.Path, manifest) -> bool:
    for lib in manifest.get("libraries", []):
        for name in ("file", "fatbin"):
            if lib.get(name):
                path = out / lib[name]
                if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != lib[name + "_sha256"]:
                    return False
    return True


# ------------------------------------------------------------------------------------------
# Loading (runtime only)

@dataclass
class _LibTarget:
    """What a Launch needs of a target, without TVM's Target class (which needs the compiler)."""

    kind: str
    arch: str | None
    key: str

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"


class Library:
    """A loaded AOT library directory: ``run``/``prepare`` like ``tvmgrad``'s, from prebuilt kernels."""

    def __init__(self, path):
        path = pathlib.Path(path)
        if path.is_file():
            path = path.parent
        self.path = path
        manifest = _read_json(path / MANIFEST)
        if manifest is None:
            raise ValueError(f"{path} holds no tvmgrad library ({MANIFEST} missing or unreadable)")
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{path}: library format {manifest.get('format')} is not {FORMAT}")
        self.manifest = manifest
        self.is_cuda = manifest["target"].startswith("cuda")
        self.target = _LibTarget("cuda" if self.is_cuda else "llvm",
                                 (manifest["archs"] or [None])[0], manifest["target_key"])
        self._index = {}
        for lib in manifest["libraries"]:
            for e in lib["entries"]:
                tuned = json.dumps(e["tuned_shapes"]) if e.get("tuned_shapes") is not None else None
                self._index[(e["op"], lib["dtype"], e["key"], tuned)] = (lib, e)
        self._modules = {}

    def ops(self) -> list[str]:
        return sorted({op for op, _, _ in self._index})

    def _module(self, lib):
        module = self._modules.get(lib["file"])
        if module is None:
            if self.is_cuda:
                from . import cuda
                rt.load_runtime(cuda=True)
                cuda.PREBUILT[lib["device_source_sha256"]] = str(self.path / lib["fatbin"])
                cuda.install_load_time_compiler()
            module = rt.load_module(str(self.path / lib["file"]))
            self._modules[lib["file"]] = module
        return module

    def prepare(self, op: str, inputs: dict | None, attrs: dict | None = None, **options) -> Launch:
        entry = registry.get(op)
        call = bind(entry.spec, inputs, attrs, **options)
        if not entry.available:
            raise NotImplementedError(f"{op}: not implemented")
        outs = registry.infer_outputs(entry, call)
        plan = entry.impl.plan(call, outs)
        function = None
        if plan.make is not None:
            from .tune import call_shapes
            dtype = _call_dtype(call)
            found = self._index.get((op, dtype, repr(plan.key), json.dumps(call_shapes(plan, call, outs))))
            found = found or self._index.get((op, dtype, repr(plan.key), None))
            if found is None:
                raise ValueError(f"{op}: this library has no kernel for this call ({dtype}, variant "
                                 f"{plan.key}); rebuild it with an example of the call, or use "
                                 f"tvmgrad.run to compile on demand")
            lib, e = found
            function = self._module(lib)[e["symbol"]]
        return Launch(entry, call, plan, outs, self.target, function)

    def run(self, op: str, inputs: dict | None, attrs: dict | None = None, *, inplace: bool = False,
            **options) -> dict:
        return self.prepare(op, inputs, attrs, **options)(inplace=inplace)


def _call_dtype(call) -> str:
    """The float dtype a call's library is built for (the first float tensor input)."""
    for value in call.tensors.values():
        for v in (value if isinstance(value, list) else [value]):
            if v is not None and as_dtype(v.dtype).kind in ("float", "complex"):
                return as_dtype(v.dtype).name
    raise ValueError(f"{call.op}: no float input to choose a library by")


def load_library(path) -> Library:
    """Open an AOT library directory (or any file in it) built by ``tvmgrad build``."""
    return Library(path)
