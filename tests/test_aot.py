"""Ahead-of-time libraries: build once, reload without the TVM compiler, reproducible, atomic."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tvmgrad
from tvmgrad import aot, hostcpu
from tvmgrad.cuda import fatbin_contents, nvcc_path

OPS = ["relu_grad", "atan2_grad", "gelu_grad", "prelu_grad", "sign_grad", "lerp_grad"]


@pytest.fixture(scope="module")
def llvm_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot") / "lib"
    manifest = aot.build(out, target="llvm", dtypes=("float32", "bfloat16"), ops=OPS, jobs=1,
                         progress=False)
    return out, manifest


def test_manifest_lists_every_entry_point(llvm_lib):
    out, manifest = llvm_lib
    assert sorted(manifest["ops"]) == sorted(OPS)
    assert list(dict.fromkeys(lib["dtype"] for lib in manifest["libraries"])) == ["float32", "bfloat16"]
    for dtype in ("float32", "bfloat16"):
        libs = [lib for lib in manifest["libraries"] if lib["dtype"] == dtype]
        assert len(libs) == len({lib["file"] for lib in libs}) > 1       # shards per te_defs module
        entries = [e for lib in libs for e in lib["entries"]]
        for lib in libs:
            assert (out / lib["file"]).exists() and not lib["skipped"]
            assert {e["op"] for e in lib["entries"]} == set(lib["ops"])
        assert {e["op"] for e in entries} == set(OPS)
        # every broadcast pattern of the broadcasting ops, both gelu variants
        atan2 = [e for e in entries if e["op"] == "atan2_grad"]
        assert len(atan2) >= 8
        assert {e["static_attrs"]["approximate"] for e in entries if e["op"] == "gelu_grad"} == {False, True}
        for e in entries:
            assert e["args"] and {a["kind"] for a in e["args"]} <= {"input", "output", "scalar"}
    assert manifest["tvm"] and manifest["target"] == "llvm"


def test_building_twice_is_a_no_op(llvm_lib):
    out, manifest = llvm_lib
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = aot.build(out, target="llvm", dtypes=("float32", "bfloat16"), ops=OPS, jobs=1, progress=False)
    assert again == manifest
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_same_inputs_give_the_same_manifest(llvm_lib, tmp_path):
    _, manifest = llvm_lib
    other = aot.build(tmp_path / "lib2", target="llvm", dtypes=("float32", "bfloat16"), ops=OPS,
                      jobs=1, progress=False)
    strip = lambda m: [[{k: v for k, v in e.items()} for e in lib["entries"]] for lib in m["libraries"]]  # noqa: E731
    assert strip(other) == strip(manifest)
    assert other["inputs_digest"] == manifest["inputs_digest"]


LOADER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tvmgrad
    lib = tvmgrad.load_library(sys.argv[1])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype("float32"); y = rng.standard_normal(6).astype("float32")
    g = rng.standard_normal((4, 6)).astype("float32")
    out = {}
    r = lib.run("atan2_grad", {"x": x, "y": y, "out_grad": g})
    out["atan2"] = [r["x_grad"].tolist(), r["y_grad"].tolist()]
    r = lib.run("gelu_grad", {"x": x, "out_grad": g}, {"approximate": True})
    out["gelu"] = r["x_grad"].tolist()
    out["modules"] = sorted(m for m in sys.modules if m == "tvm" or m.startswith("tvm."))
    print(json.dumps(out))
""")


def test_fresh_process_loads_and_runs_without_the_tvm_compiler(llvm_lib, tmp_path):
    out, _ = llvm_lib
    script = tmp_path / "load.py"
    script.write_text(LOADER)
    env = dict(os.environ, TVMGRAD_CACHE_DIR=str(tmp_path / "empty-cache"))
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == [], f"the loader imported {len(got['modules'])} TVM modules, e.g. {got['modules'][:3]}"
    assert not (tmp_path / "empty-cache").exists(), "the loader compiled something"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype("float32"); y = rng.standard_normal(6).astype("float32")
    g = rng.standard_normal((4, 6)).astype("float32")
    want = tvmgrad.run("atan2_grad", {"x": x, "y": y, "out_grad": g})
    np.testing.assert_allclose(got["atan2"][0], want["x_grad"], rtol=1e-6)
    np.testing.assert_allclose(got["atan2"][1], want["y_grad"], rtol=1e-5)
    want = tvmgrad.run("gelu_grad", {"x": x, "out_grad": g}, {"approximate": True})
    np.testing.assert_allclose(got["gelu"], want["x_grad"], rtol=1e-6)


def test_loader_rejects_calls_it_has_no_kernel_for(llvm_lib):
    out, _ = llvm_lib
    lib = tvmgrad.load_library(out)
    assert lib.ops() == sorted(OPS)
    x = np.ones((2, 3), "float64")
    with pytest.raises(ValueError, match="atan2_grad: this library has no kernel for this call"):
        lib.run("atan2_grad", {"x": x, "y": x, "out_grad": x})
    with pytest.raises(ValueError, match="unknown op"):
        lib.run("nope_grad", {})


def test_bad_build_requests(tmp_path):
    with pytest.raises(ValueError, match="unknown dtype"):
        aot.build(tmp_path / "a", dtypes=("float8",), ops=["relu_grad"], progress=False)
    with pytest.raises(ValueError, match="unknown CUDA arch"):
        aot.build(tmp_path / "a", target="cuda", archs=("volta",), ops=["relu_grad"], progress=False)
    with pytest.raises(ValueError, match="unknown op"):
        aot.build(tmp_path / "a", ops=["relu_gard"], progress=False)
    assert not (tmp_path / "a").exists()


def test_a_failed_build_leaves_the_previous_library(llvm_lib, tmp_path, tmp_path_factory, monkeypatch):
    # a cache of its own: the shard that fails to build must not be in the shared one already
    monkeypatch.setenv("TVMGRAD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    out = tmp_path / "lib"
    aot.build(out, dtypes=("float32",), ops=["relu_grad"], jobs=1, progress=False)
    before = json.loads((out / aot.MANIFEST).read_text())

    def broken(*args, **kwargs):
        raise RuntimeError("simulated compiler crash")
    monkeypatch.setattr("tvmgrad.build.compile_lowered", broken)
    with pytest.raises(RuntimeError, match="simulated"):
        aot.build(out, dtypes=("float32",), ops=["relu_grad", "gelu_grad"], jobs=1, progress=False)
    assert json.loads((out / aot.MANIFEST).read_text()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["lib"]          # no temp dirs left behind


def test_shards_group_ops_by_module_in_bounded_chunks():
    ops = [op.name for op in tvmgrad.registry.ops().values() if op.available and not op.is_forward]
    shards = aot.shards(ops, ("float32", "float16"))
    assert sorted(op for s in shards if s.dtype == "float16" for op in s.ops) == sorted(ops)
    assert all(0 < len(s.ops) <= aot.SHARD_OPS for s in shards)
    for s in shards:
        assert len({tvmgrad.registry.get(op).implementation.module for op in s.ops}) == 1
    assert aot.shards(reversed(ops), ("float32",)) == [s for s in shards if s.dtype == "float32"]


def test_editing_one_module_rebuilds_only_its_shards(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    ops = ["relu_grad", "concat_grad", "cumsum_grad"]          # three te_defs modules
    built = []
    real = aot._build_shard
    monkeypatch.setattr(aot, "_build_shard", lambda shard, *a: built.append(shard.name) or real(shard, *a))
    aot.build(tmp_path / "a", dtypes=("float32",), ops=ops, jobs=1, progress=False)
    assert len(built) == 3
    built.clear()
    again = aot.build(tmp_path / "b", dtypes=("float32",), ops=ops, jobs=1, progress=False)
    assert built == []                                        # every shard from the cache

    from tvmgrad import sources
    edited = tvmgrad.registry.get("concat_grad").impl.source_file
    real_digest = sources.file_digest
    monkeypatch.setattr(sources, "file_digest",
                        lambda path: "edited" if path == edited else real_digest(path))
    manifest = aot.build(tmp_path / "c", dtypes=("float32",), ops=ops, jobs=1, progress=False)
    module = tvmgrad.registry.get("concat_grad").impl.module.rsplit(".", 1)[-1]
    assert built == [f"{module}-0"]
    assert manifest["inputs_digest"] != again["inputs_digest"]
    lib = tvmgrad.load_library(tmp_path / "c")
    x = [np.ones((2, 3), "float32"), np.ones((2, 2), "float32")]
    g = np.arange(10, dtype="float32").reshape(2, 5)
    grads = lib.run("concat_grad", {"x": x, "out_grad": g}, {"axis": 1})["x_grad"]
    np.testing.assert_array_equal(grads[1], g[:, 3:])


@pytest.mark.cuda
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_library_has_precompiled_device_code(tmp_path):
    manifest = aot.build(tmp_path / "cuda", target="cuda", archs=("sm_80", "sm_90"),
                         dtypes=("float16",), ops=["relu_grad", "atan2_grad"], jobs=1, progress=False)
    assert manifest["archs"] == ["sm_80", "sm_90"] and len(manifest["libraries"]) == 2   # 2 modules
    for lib in manifest["libraries"]:
        fatbin = (tmp_path / "cuda" / lib["fatbin"]).read_bytes()
        # SASS (an ELF cubin) per arch, and PTX of the newest for later GPUs
        assert fatbin_contents(fatbin) == [("elf", "sm_80"), ("ptx", "sm_90"), ("elf", "sm_90")]
        assert lib["fatbin_images"] == ["elf sm_80", "ptx sm_90", "elf sm_90"]
        assert lib["device_source_sha256"]
        for arch in ("sm_80", "sm_90"):
            stats = lib["ptxas"][arch]
            for e in lib["entries"]:
                kernels = [k for k in stats if k.startswith(e["symbol"] + "_kernel")]
                assert kernels, (arch, e["symbol"])
                assert all(stats[k]["spill_stores"] == 0 == stats[k]["spill_loads"] for k in kernels)


# ------------------------------------------------------------------------------------------
# CPU portability, file integrity, orphans

def test_cpu_libraries_default_to_the_portable_baseline(llvm_lib):
    _, manifest = llvm_lib
    cpu = manifest["cpu"]
    assert cpu["mcpu"] == aot.baseline_cpu() and cpu["mattr"] == []
    if platform.machine() in ("x86_64", "AMD64"):
        assert cpu["mcpu"] == "x86-64-v3"
        assert {"avx", "avx2", "fma", "f16c", "bmi2"} <= set(cpu["features"])
        assert not any(f.startswith("avx512") for f in cpu["features"])
    assert cpu["features"] == sorted(cpu["features"]) and cpu["triple"].startswith(
        {"x86_64": "x86_64", "AMD64": "x86_64", "arm64": "a"}.get(platform.machine(), platform.machine()))
    assert json.loads(manifest["target_key"])["mcpu"] == cpu["mcpu"]


def _copy(src, dst, edit=None):
    shutil.copytree(src, dst)
    if edit is not None:
        manifest = json.loads((dst / aot.MANIFEST).read_text())
        edit(manifest)
        (dst / aot.MANIFEST).write_text(json.dumps(manifest))
    return dst


def test_a_library_needing_a_feature_the_host_lacks_is_refused(llvm_lib, tmp_path, monkeypatch):
    out, manifest = llvm_lib
    host = hostcpu.host()
    lacking = sorted(host.vouched - host.present)
    if not lacking:
        pytest.skip("this host enables every CPU feature hostcpu can tell about")
    lib = _copy(out, tmp_path / "lib", lambda m: m["cpu"]["features"].append(lacking[0]))
    with pytest.raises(ValueError, match=rf"lib: built for {re.escape(manifest['cpu']['mcpu'])}: needs "
                                         rf"{re.escape(lacking[0])}, which this CPU does not enable"
                                         rf".*--cpu host"):
        tvmgrad.load_library(lib)

    # a host without AVX2 (or NEON) refuses the baseline library itself
    needed = {"x86_64": "avx2", "aarch64": "neon"}.get(host.arch)
    if needed is None or needed not in manifest["cpu"]["features"]:
        return
    weak = hostcpu.HostCPU(host.arch, "test", host.present - {needed}, host.vouched | {needed})
    monkeypatch.setattr(hostcpu, "host", lambda: weak)
    with pytest.raises(ValueError, match=rf"needs {needed}, which this CPU does not enable"):
        tvmgrad.load_library(out)


def test_a_library_for_another_architecture_is_refused(llvm_lib, tmp_path):
    out, _ = llvm_lib
    other = "riscv64-unknown-linux-gnu"
    lib = _copy(out, tmp_path / "lib", lambda m: m["cpu"].update(triple=other))
    with pytest.raises(ValueError, match=r"built for riscv64 .*this host is"):
        tvmgrad.load_library(lib)


TRUNCATED = textwrap.dedent("""
    import sys
    import numpy as np
    import tvmgrad
    lib = tvmgrad.load_library(sys.argv[1])
    try:
        lib.run("relu_grad", {"out": np.ones(4, "float32"), "out_grad": np.ones(4, "float32")})
    except ValueError as exc:
        print("REFUSED", exc)
    print("tvm" in sys.modules)
""")


def test_a_truncated_shard_is_refused_not_loaded(llvm_lib, tmp_path):
    out, manifest = llvm_lib
    lib = _copy(out, tmp_path / "lib")
    record = next(r for r in manifest["libraries"] if "relu_grad" in r["ops"] and r["dtype"] == "float32")
    so = lib / record["file"]
    so.write_bytes(so.read_bytes()[: so.stat().st_size // 2])
    script = tmp_path / "load.py"
    script.write_text(TRUNCATED)
    proc = subprocess.run([sys.executable, str(script), str(lib)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]           # not SIGBUS
    refused, tvm_loaded = proc.stdout.strip().splitlines()[-2:]
    assert refused.startswith(f"REFUSED {so}: its sha256 ") and "truncated or changed" in refused
    assert tvm_loaded == "False"


def test_a_host_build_has_its_own_shards(tmp_path, capsys):
    from tvmgrad import cli
    from tvmgrad.targets import host_cpu_spec
    base = aot.build(tmp_path / "base", ops=["relu_grad"], jobs=1, progress=False)
    assert cli.main(["build", "--cpu", "host", "--ops", "relu_grad", "--out", str(tmp_path / "host"),
                     "--jobs", "1"]) == 0
    assert f"cpu {host_cpu_spec()['mcpu']}" in capsys.readouterr().out
    host = json.loads((tmp_path / "host" / aot.MANIFEST).read_text())
    spec = host_cpu_spec()
    assert host["cpu"]["mcpu"] == spec["mcpu"] and host["cpu"]["mattr"] == spec.get("mattr", [])
    assert host["target_key"] != base["target_key"] and host["cpu"] != base["cpu"]
    assert host["libraries"][0]["shard_digest"] != base["libraries"][0]["shard_digest"]
    assert aot._shard_cache(aot.build_target(cpu="host")) != aot._shard_cache(aot.build_target())
    x = np.linspace(-1, 1, 8, dtype="float32")
    got = tvmgrad.load_library(tmp_path / "host").run("relu_grad", {"out": x, "out_grad": x})
    np.testing.assert_array_equal(got["x_grad"], np.where(x > 0, x, 0))
    # llvm:<cpu> names a CPU too, and must agree with cpu=
    assert aot.build_target("llvm:znver3") == {"kind": "llvm", "mcpu": "znver3"} or \
        platform.machine() not in ("x86_64", "AMD64")
    with pytest.raises(ValueError, match="names CPU"):
        aot.build(tmp_path / "x", target="llvm:znver3", cpu="host", ops=["relu_grad"], progress=False)


def test_unknown_cpus_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown CPU 'no-such-cpu'"):
        aot.build(tmp_path / "a", target="llvm:no-such-cpu", ops=["relu_grad"], progress=False)
    with pytest.raises(ValueError, match="unknown CPU 'znver99'"):
        aot.build(tmp_path / "a", cpu="znver99", ops=["relu_grad"], progress=False)
    assert not (tmp_path / "a").exists()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_orphans_of_killed_builds_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "lib"
    manifest = aot.build(out, ops=["relu_grad"], jobs=1, progress=False)
    # a build killed while building a shard: its temp folder beside the shard cache
    digest = manifest["libraries"][0]["shard_digest"]
    folder = aot._shard_cache(aot.build_target()) / digest
    stale = folder.parent / f".{digest[:12]}-killed"
    stale.mkdir()
    (stale / "half.so").write_bytes(b"\0" * 10)
    shutil.rmtree(folder)                                  # so that the shard is built again
    # builds of out killed before swapping in (tmp) or half way through it (old)
    host, dead = aot._owner().rsplit("-", 1)[0], _dead_pid()
    orphans = [tmp_path / f".lib-tmp-{host}-{dead}-abc12_x", tmp_path / f".lib-old-{host}-{dead}"]
    kept = [tmp_path / f".lib-tmp-{host}-{os.getpid()}-live1",        # a live build's
            tmp_path / f".lib-tmp-elsewhere-{dead}-abc",               # another host's
            tmp_path / f".libx-tmp-{host}-{dead}-abc"]                 # another library's
    for path in orphans + kept:
        path.mkdir()
    again = aot.build(out, ops=["relu_grad"], jobs=1, progress=False)
    assert again == manifest                                          # up to date: left as is
    assert not any(p.exists() for p in orphans) and all(p.exists() for p in kept)
    assert stale.exists()
    other = aot.build(tmp_path / "other", ops=["relu_grad"], jobs=1, progress=False)
    assert other["libraries"][0]["shard_digest"] == digest
    assert not stale.exists() and (folder / "shard.json").exists()
    assert not [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_complex_variants_are_found_in_their_precision(tmp_path):
    """A float32 library holds an op's complex64 variant, a float64 one its complex128 variant,
    and calls find them by their own dtype."""
    out = tmp_path / "lib"
    aot.build(out, ops=["angle_grad"], dtypes=("float32", "float64"), jobs=1, progress=False)
    lib = tvmgrad.load_library(out)
    rng = np.random.default_rng(0)
    for complex_dt, real_dt in (("complex64", "float32"), ("complex128", "float64")):
        x = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(complex_dt)
        g = rng.standard_normal((3, 4)).astype(real_dt)
        got = lib.run("angle_grad", {"x": x, "out_grad": g})["x_grad"]
        assert got.dtype == complex_dt
        np.testing.assert_array_equal(got, tvmgrad.run("angle_grad", {"x": x, "out_grad": g})["x_grad"])
