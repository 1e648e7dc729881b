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
inference, baked attributes), the target, arches, TVM version, source digests and, for a CPU
library, the CPU it was built for (``"cpu"``: LLVM triple, ``mcpu``, ``mattr`` and the full sorted
list of LLVM features its code may use).

A CPU library is built for a *portable baseline* by default, not for the build host
(``baseline_cpu``: ``x86-64-v3`` on x86-64, ``generic`` on aarch64), so that a library built on
a new server runs on an older one; ``cpu="host"`` (``tvmgrad build --cpu host``) or
``target="llvm:<cpu>"`` builds for a given CPU instead.

Shards are the unit of work and of reuse: a process pool builds them in parallel, and each built
shard is kept in the kernel cache (``<cache>/aot/``) under a digest of everything that shapes
its code (its ops' sources, the schedule rules, TVM, target, arches, dtype, tuning records). A
rebuild after editing one te_defs module recompiles that module's shards only. The output
directory is replaced atomically; building again with the same inputs is a no-op.

``load_library(dir)`` plans calls with the same family planners as ``tvmgrad.run`` (pure Python),
finds the entry point by variant key and calls it through ``tvm_ffi`` and ``libtvm_runtime``:
``tvm`` itself (the compiler) is never imported. It refuses, with a ValueError rather than a
crash, a CPU library that needs a CPU feature this host does not enable (it would die of SIGILL:
``tvmgrad.hostcpu`` says what the host enables) or another architecture, and a shard whose file
is not the one the manifest's sha256 names (a truncated ``.so`` would die of SIGBUS).

A build killed half way leaves temporary folders; the next build of the same shard (under its
file lock) or of the same output directory (when the process that made them is gone) removes them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import platform
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass

import numpy as np

from . import hostcpu, registry, rt
from ._version import __version__
from .dtypes import FLOATS, dtype as as_dtype
from .planning import plan_call
from .runtime import Launch

__all__ = ["build", "load_library", "Library", "variant_calls", "shards", "MANIFEST",
           "baseline_cpu", "BASELINE_CPU"]

MANIFEST = "manifest.json"
FORMAT = 3              # 3: CPU libraries record their CPU ("cpu") and default to the baseline
SHARD_OPS = 12          # ops per shard: small enough to spread over cores and to rebuild alone
_ARCH = re.compile(r"^sm_\d+a?$")

# The CPU a CPU library is built for unless told otherwise, per architecture (platform.machine()).
#
# x86-64-v3 (AVX, AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE) is what every x86 server since about 2015
# runs: Intel Haswell (2013) and later Xeons, AMD Zen (2017) and later EPYCs, every current cloud
# instance type. The kernels are mostly memory-bound and AVX2 with FMA gets most of what SIMD
# gives them; x86-64-v4 (AVX-512) would shut out every AMD server before Zen 4 and hosts whose
# hypervisor masks AVX-512. A CPU without AVX2 (old Atoms, some Pentiums) is refused by
# load_library with a message, it does not crash.
#
# aarch64 "generic" is ARMv8-A with NEON: every 64-bit Arm core (Graviton 1-4, Ampere, Apple,
# Raspberry Pi); --cpu neoverse-n1 or --cpu host gives newer cores their extensions.
BASELINE_CPU = {"x86_64": "x86-64-v3", "aarch64": "generic"}


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
    free = [n for n in impl.broadcasting_inputs(entry.spec) if inputs.get(n) is not None]
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
            planned = plan_call(entry, {k: cast(v, dtype) for k, v in inputs.items()}, attrs)
        except (ValueError, TypeError, NotImplementedError) as exc:
            refused = refused or exc        # an attribute combination the op refuses
            continue
        accepted += 1
        if planned.plan.make is not None:
            plans.setdefault(repr(planned.plan.key), (planned.call, planned.plan))
    if not accepted and refused is not None:
        raise refused
    return list(plans.values())


# ------------------------------------------------------------------------------------------
# Building

def _machine(name: str) -> str:
    name = name.lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(name, name)


def baseline_cpu(machine: str | None = None) -> str:
    """The portable LLVM CPU that CPU libraries are built for by default on this architecture
    (``BASELINE_CPU``; "generic" for an architecture it does not list)."""
    return BASELINE_CPU.get(_machine(machine or platform.machine()), "generic")


def build_target(target: str = "llvm", cpu: str | None = None, archs=("sm_80",)) -> dict:
    """The target dict a build compiles for.

    ``target``: "llvm", "llvm:<cpu>" (that LLVM CPU, "llvm:host" for this host) or "cuda"
    (compiled for ``archs[0]``; the fatbin holds every arch). ``cpu``: None for the portable
    baseline (``baseline_cpu()``), "host" for this host as it really is
    (``targets.host_cpu_spec``) or an LLVM CPU name. An unknown CPU raises ValueError.
    """
    from .targets import cpu_spec, host_cpu_spec
    if not isinstance(target, str):
        raise TypeError(f"target must be a string such as 'llvm', 'llvm:znver3' or 'cuda', "
                        f"got {type(target).__name__}")
    kind, _, name = target.strip().partition(":")
    if kind == "cuda":
        if cpu is not None:
            raise ValueError("--cpu applies to CPU (llvm) libraries, not to cuda")
        return {"kind": "cuda", "arch": archs[0]}
    if kind != "llvm":
        raise ValueError(f"unknown build target {target!r}: use llvm, llvm:<cpu> or cuda")
    name, cpu = name.strip(), (cpu.strip() if cpu is not None else None)
    if name and cpu and name != cpu:
        raise ValueError(f"target {target!r} names CPU {name!r} and cpu={cpu!r} another one: "
                         f"name one")
    name = name or cpu or baseline_cpu()
    return dict(host_cpu_spec()) if name == "host" else cpu_spec(name)


def _target_spec(spec):
    from .targets import resolve
    return resolve(spec)


def _cpu_record(tgt) -> dict | None:
    """What a CPU library's code needs of the CPU: triple, mcpu, mattr and every LLVM feature."""
    if tgt.kind != "llvm":
        return None
    from tvm.target import codegen
    attrs = tgt.target.attrs
    triple = str(attrs.get("mtriple", "") or "") or str(codegen.llvm_get_system_triple())
    return {"triple": triple, "mcpu": str(attrs.get("mcpu", "") or "generic"),
            "mattr": [str(a) for a in attrs.get("mattr", ()) or ()],
            "features": sorted(tgt.features)}


def _describe_cpu(cpu: dict) -> str:
    return cpu["mcpu"] + (f" (mattr {','.join(cpu['mattr'])})" if cpu.get("mattr") else "")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _entry_json(op, call, plan, tuned_shapes=None) -> dict:
    return {
        "op": op, "symbol": plan.symbol, "key": repr(plan.base_key), "pattern": plan.pattern,
        "call_dtype": _call_dtype(call),      # what a call is looked up by (complex variants too)
        "schedule": "tuned" if tuned_shapes is not None else "rules", "tuned_shapes": tuned_shapes,
        "args": [{"kind": a.kind, "name": a.name, "index": a.index,
                  "dtype": a.dtype} for a in plan.args],
        "infer_meta": call.spec.infer_meta.func if call.spec.infer_meta else None,
        "static_attrs": {k: v for k, v in call.attrs.items()
                         if not any(a.kind == "scalar" and a.name == k for a in plan.args)},
    }


def _tuned_plans(db_root, tgt, op, dtype) -> list:
    """Size-specialised kernels of ``op`` that a tuning database holds for this target/dtype."""
    from .tuned import Database, call_shapes, record_call
    if db_root is None:
        return []
    db = Database(db_root)
    plans = []
    for record in db.records(tgt.key, dtype):
        if record.op != op or record.inputs is None:
            continue
        inputs, attrs = record_call(record)
        p = plan_call(op, inputs, attrs, target=tgt, db=db)
        if p.plan.trace is not None:
            plans.append((p.call, p.plan, call_shapes(p.plan, p.call, p.outputs)))
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


def _shard_digest(shard: Shard, spec: dict, archs, tuning_digest: str) -> str:
    """Everything that shapes a shard's code: its ops' sources and schedule rules, TVM, the
    resolved target (CPU and mattr included) and triple, the arches, the tuning records (a
    different digest: a different shard)."""
    import tvm

    from . import cuda
    from .sources import file_digest, source_digest
    tgt = _target_spec(spec)
    kind = tgt.kind
    cpu = _cpu_record(tgt)
    h = hashlib.sha256(repr((FORMAT, __version__, tvm.__version__, tgt.key,
                             cpu and cpu["triple"], tuple(archs), shard,
                             tuning_digest)).encode())
    from . import examples
    # how shards are built and compiled, and the example calls that pick their variants
    example_files = sorted(str(p) for p in pathlib.Path(examples.__file__).parent.glob("*.py"))
    for builder in (__file__, cuda.__file__, *example_files):
        h.update(file_digest(builder).encode())
    for op in shard.ops:
        entry = registry.get(op)          # an invoke op is scheduled by its forward op's pattern
        pattern = getattr(entry.implementation, "pattern", "generic")
        h.update(source_digest(entry.impl, kind, pattern).encode())
    return h.hexdigest()


def _shard_cache(spec: dict) -> pathlib.Path:
    """The cache folder of a target's shards: named after its CPU or arch and a digest of its
    resolved key (x86-64-v3 and host builds never share a folder)."""
    import tvm

    from .cachedir import cache_dir
    tgt = _target_spec(spec)
    label = str(tgt.target.attrs.get("mcpu", "") or "generic") if tgt.kind == "llvm" else tgt.arch
    key = hashlib.sha256(tgt.key.encode()).hexdigest()[:10]
    return cache_dir() / "aot" / f"tvm-{_slug(tvm.__version__)}" / _slug(f"{tgt.kind}-{label}-{key}")


def _cached_shard(folder: pathlib.Path):
    """A built shard's library record, if the folder holds one whose files are intact."""
    lib = _read_json(folder / "shard.json")
    if lib is None or not _verify(folder, {"libraries": [lib]}):
        return None
    return lib


def _obtain_shard(job) -> tuple[str, dict]:
    """(digest, library record) of a shard, built into the shard cache unless it is there (runs
    in a worker; a file lock keeps concurrent builds of the same shard to one)."""
    shard, digest, spec, archs, db_root = job
    from filelock import FileLock
    folder = _shard_cache(spec) / digest
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        lib = _cached_shard(folder)
        if lib is not None:
            return digest, lib
        # a temp folder of this digest is only ever made under this lock, which we hold: any
        # left is an orphan of a build killed half way
        for stale in folder.parent.glob(f".{digest[:12]}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=folder.parent))
        try:
            lib = _build_shard(shard, tmp, spec, archs, db_root)
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


def _build_shard(shard: Shard, out_dir: pathlib.Path, spec, archs, db_root) -> dict:
    """One library: every plan of the shard's ops in its dtype."""
    from .build import compile_lowered, lower
    from .cuda import compile_cubin, device_source, fatbin_contents
    tgt = _target_spec(spec)
    dtype = shard.dtype
    entries, skipped, funcs = [], [], {}
    for op in shard.ops:
        try:
            plans = [(c, p, None) for c, p in plans_for(op, dtype)]
            plans += _tuned_plans(db_root, tgt, op, dtype)
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


def build(out, *, target: str = "llvm", cpu: str | None = None, dtypes=("float32",), ops=None,
          archs=("sm_80", "sm_90"), jobs: int = 0, progress: bool = True, tuning_db=None) -> dict:
    """Build (or leave, if up to date) an AOT library directory; returns its manifest.

    A CPU library is built for the portable baseline (``baseline_cpu()``) unless ``cpu`` ("host"
    or an LLVM CPU name) or ``target="llvm:<cpu>"`` says otherwise (``build_target``).
    """
    from .workers import imap_unordered

    out = pathlib.Path(out)
    dtypes = tuple(dtypes)
    for dt in dtypes:
        if dt not in FLOATS:
            raise ValueError(f"unknown dtype {dt!r}: choose from {', '.join(FLOATS)}")
    is_cuda = isinstance(target, str) and target.strip().startswith("cuda")
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
    spec = build_target(target, cpu, archs or ("sm_80",))    # unknown target or CPU -> ValueError
    tgt = _target_spec(spec)
    if tuning_db is None:
        from .tuned import active_database
        db = active_database()
        tuning_db = str(db.root) if db is not None else None
    tuning = _tuning_digest(tuning_db)
    work = [(shard, _shard_digest(shard, spec, archs, tuning)) for shard in shards(ops, dtypes)]
    digest = hashlib.sha256(repr([d for _, d in work]).encode()).hexdigest()
    _remove_orphans(out)
    current = _read_json(out / MANIFEST)
    if current is not None and current.get("inputs_digest") == digest and _verify(out, current):
        return current

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}-tmp-{_owner()}-", dir=out.parent))
    try:
        jobs_list = [(shard, d, spec, archs, tuning_db) for shard, d in work]
        cached = {d: _cached_shard(_shard_cache(spec) / d) for _, d in work}
        todo = [j for j in jobs_list if cached[j[1]] is None]
        bar = _bar(sum(len(s.ops) for s, _ in work), progress)
        bar.update(sum(len(s.ops) for s, d in work if cached[d] is not None))
        workers = min(len(todo), jobs or len(os.sched_getaffinity(0)))
        if workers > 1:          # a worker that dies raises WorkerDied naming its shard
            _collect(imap_unordered(_obtain_shard, todo, workers=workers, describe=_describe_job),
                     cached, bar)
        else:
            _collect(map(_obtain_shard, todo), cached, bar)
        bar.close()
        libs = []
        for shard, d in work:
            lib = cached[d]
            for name in ("file", "fatbin"):
                if lib.get(name):
                    shutil.copyfile(_shard_cache(spec) / d / lib[name], tmp / lib[name])
            libs.append(dict(lib, shard_digest=d))
        import tvm
        manifest = {
            "format": FORMAT, "tvmgrad": __version__, "tvm": tvm.__version__, "target": target,
            "target_key": tgt.key, "cpu": _cpu_record(tgt), "archs": list(archs),
            "dtypes": list(dtypes), "ops": list(ops), "inputs_digest": digest, "libraries": libs,
            "tuning_db": tuning_db,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        _swap_in(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _describe_job(job) -> str:
    shard = job[0]
    return f"shard {shard.name} [{shard.dtype}] ({', '.join(shard.ops)})"


def _collect(results, cached, bar) -> None:
    """Record each built shard (in completion order: imap_unordered) and advance the bar."""
    for digest, lib in results:
        cached[digest] = lib
        bar.update(len(lib["ops"]))


def _bar(total: int, show: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="op", desc="tvmgrad build", disable=not show)


def _owner() -> str:
    """<host>-<pid>: who made a temporary folder beside an output directory."""
    return f"{re.sub(r'[^A-Za-z0-9_.]', '_', socket.gethostname())}-{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                   # PermissionError: a live process of someone else
        return True
    return True


def _remove_orphans(out: pathlib.Path) -> None:
    """Remove the temporary folders (``.<out>-tmp-<host>-<pid>-*``, ``.<out>-old-<host>-<pid>``)
    that builds of ``out`` on this host left when killed: those whose process is gone."""
    owned = re.compile(rf"\.{re.escape(out.name)}-(?:tmp|old)-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)"
                       rf"(?:-[a-z0-9_]+)?")
    here = _owner().rsplit("-", 1)[0]
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return
    for path in entries:
        m = owned.fullmatch(path.name)
        if m and m["host"] == here and not _pid_alive(int(m["pid"])) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _swap_in(tmp: pathlib.Path, out: pathlib.Path) -> None:
    """Replace ``out`` by ``tmp`` so that readers see the old or the new library, never a mix."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}-old-{_owner()}")
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
        if not self.is_cuda:
            _check_cpu(path, manifest.get("cpu"))
        self.target = _LibTarget("cuda" if self.is_cuda else "llvm",
                                 (manifest["archs"] or [None])[0], manifest["target_key"])
        self._index = {}
        for lib in manifest["libraries"]:
            for e in lib["entries"]:
                tuned = json.dumps(e["tuned_shapes"]) if e.get("tuned_shapes") is not None else None
                self._index[(e["op"], e.get("call_dtype", lib["dtype"]), e["key"], tuned)] = (lib, e)
        self._modules = {}

    def ops(self) -> list[str]:
        """The ops this library holds kernels for."""
        return sorted({op for op, *_ in self._index})

    def _module(self, lib):
        module = self._modules.get(lib["file"])
        if module is None:
            for name in ("file", "fatbin"):
                if lib.get(name):
                    _check_sha256(self.path / lib[name], lib.get(name + "_sha256"))
            if self.is_cuda:
                from . import cuda
                rt.load_runtime(cuda=True)
                cuda.PREBUILT[lib["device_source_sha256"]] = str(self.path / lib["fatbin"])
                cuda.install_load_time_compiler()
            module = rt.load_module(str(self.path / lib["file"]))
            self._modules[lib["file"]] = module
        return module

    def prepare(self, op: str, inputs: dict | None, attrs: dict | None = None, **options) -> Launch:
        p = plan_call(op, inputs, attrs, **options)
        entry, call, outs, plan = p.entry, p.call, p.outputs, p.plan
        function = None
        if plan.make is not None:
            from .tuned import call_shapes
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


def _check_cpu(path: pathlib.Path, cpu: dict | None) -> None:
    """Refuse a CPU library this host cannot run: another architecture, or code using a CPU
    feature the host does not enable (it would die of SIGILL on the first call)."""
    if not cpu or "features" not in cpu:
        raise ValueError(f"{path}: the manifest does not say which CPU the library is built for; "
                         f"rebuild it with tvmgrad build")
    host = hostcpu.host()
    arch = _machine(cpu["triple"].split("-")[0])
    if arch != host.arch:
        raise ValueError(f"{path}: built for {arch} ({cpu['triple']}, {_describe_cpu(cpu)}); this "
                         f"host is {host.arch}: build the library for this architecture")
    missing = host.lacks(cpu["features"])
    if missing:
        raise ValueError(f"{path}: built for {_describe_cpu(cpu)}: needs {', '.join(missing)}, which "
                         f"this CPU does not enable (per {host.source}; it would die with an illegal "
                         f"instruction); rebuild with tvmgrad build --cpu host, or with the default "
                         f"portable baseline ({baseline_cpu()})")


def _check_sha256(path: pathlib.Path, want: str | None) -> None:
    """Refuse a shard file that is not the one built (a truncated .so would die of SIGBUS)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read this library file ({exc}); rebuild the library "
                         f"with tvmgrad build") from None
    got = h.hexdigest()
    if got != want:
        raise ValueError(f"{path}: its sha256 {got[:16]}... is not the manifest's "
                         f"{(want or 'none')[:16]}...: the file is truncated or changed since the "
                         f"build; rebuild the library with tvmgrad build")


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
