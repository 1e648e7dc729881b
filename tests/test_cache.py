"""The kernel cache: hits, invalidation, corrupt entries, concurrent builders."""

import importlib.util
import json
import multiprocessing
import os
import pathlib

import numpy as np
import pytest

import tvmgrad
from tvmgrad import registry
from tvmgrad.build import _file_digest, source_digest
from tvmgrad.cache import KernelCache
from tvmgrad.families.pointwise import Pointwise
from tvmgrad.call import bind
from tvmgrad.targets import resolve

LLVM = resolve("llvm")


def _plan(op="relu_grad", shape=(3, 5), dtype="float32"):
    entry = registry.get(op)
    x = np.linspace(-1, 1, int(np.prod(shape))).reshape(shape).astype(dtype)
    call = bind(entry.spec, {"out": x, "out_grad": x + 1}, None)
    return entry, entry.impl.plan(call, registry.infer_outputs(entry, call)), x


def _run_with(cache, x):
    launch = tvmgrad.prepare("relu_grad", {"out": x, "out_grad": x + 1}, cache=cache)
    return launch()["x_grad"]


def test_build_then_memo_then_disk(tmp_path):
    cache = KernelCache(tmp_path)
    entry, plan, x = _plan()
    first = cache.get(plan, entry.impl, LLVM)
    assert first.origin == "built" and first.path.exists()
    assert cache.get(plan, entry.impl, LLVM) is first
    assert cache.stats == {"memo": 1, "disk": 0, "built": 1, "rebuilt_corrupt": 0}
    fresh = KernelCache(tmp_path)                     # a new process, in effect
    again = fresh.get(plan, entry.impl, LLVM)
    assert again.origin == "disk" and again.path == first.path
    np.testing.assert_array_equal(_run_with(fresh, x), np.where(x > 0, x + 1, 0))


def test_one_kernel_serves_every_size_and_rank(tmp_path):
    cache = KernelCache(tmp_path)
    for shape in [(7,), (2, 3), (4, 1, 5), (2, 2, 2, 2), ()]:
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        np.testing.assert_array_equal(_run_with(cache, x), np.where(x > 0, x + 1, 0))
    assert cache.stats["built"] == 1


def test_entries_differ_by_dtype_target_and_tvm_version(tmp_path, monkeypatch):
    cache = KernelCache(tmp_path)
    entry, plan32, _ = _plan(dtype="float32")
    _, plan64, _ = _plan(dtype="float64")
    p32 = cache.entry_path(plan32, entry.impl, LLVM)
    assert p32 != cache.entry_path(plan64, entry.impl, LLVM)
    assert p32 != cache.entry_path(plan32, entry.impl, resolve("cuda:sm_90"))
    import tvm
    monkeypatch.setattr(tvm, "__version__", "0.0.0-other")
    assert p32 != cache.entry_path(plan32, entry.impl, LLVM)


def test_source_change_changes_the_key(tmp_path):
    """Editing the te_defs module that defines an op changes its kernels' cache key."""
    module = tmp_path / "family.py"
    module.write_text("def relu_grad(out, out_grad):\n    return out_grad\n")
    spec = importlib.util.spec_from_file_location("family_under_test", module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    impl = Pointwise(mod.relu_grad)
    before = source_digest(impl, "llvm")
    module.write_text("def relu_grad(out, out_grad):\n    return out_grad * 1.0\n")
    _file_digest.cache_clear()
    assert source_digest(impl, "llvm") != before
    entry, plan, _ = _plan()
    cache = KernelCache(tmp_path)
    assert cache.entry_path(plan, impl, LLVM) != cache.entry_path(plan, entry.impl, LLVM)


def _build_elsewhere(root):
    """Build relu_grad's kernel in another process (this one must not have the library mapped:
    corrupting a loaded library in place would crash it, which is not what we test)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        ok, built = pool.map(_worker, [(str(root), 0)])[0]
    assert ok and built == 1
    (path,) = pathlib.Path(root).rglob("*.so")
    return path


def test_corrupt_entry_is_rebuilt(tmp_path):
    path = _build_elsewhere(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])          # truncated library
    cache = KernelCache(tmp_path)
    x = np.linspace(-1, 1, 64).astype("float32")
    np.testing.assert_array_equal(_run_with(cache, x), np.where(x > 0, x + 1, 0))
    assert cache.stats["rebuilt_corrupt"] == 1 and cache.stats["built"] == 1


@pytest.mark.parametrize("damage", ["bad_checksum", "no_sidecar"])
def test_bad_sidecar_is_rebuilt(tmp_path, damage):
    path = _build_elsewhere(tmp_path)
    side = path.with_suffix(".json")
    if damage == "no_sidecar":
        side.unlink()
    else:
        meta = json.loads(side.read_text())
        meta["sha256"] = "0" * 64
        side.write_text(json.dumps(meta))
    cache = KernelCache(tmp_path)
    x = np.linspace(-1, 1, 64).astype("float32")
    np.testing.assert_array_equal(_run_with(cache, x), np.where(x > 0, x + 1, 0))
    assert cache.stats["built"] == 1


def _worker(args):
    root, seed = args
    os.environ["TVMGRAD_CACHE_DIR"] = root
    import numpy as np
    import tvmgrad
    from tvmgrad.cache import KernelCache
    cache = KernelCache(root)
    x = np.random.default_rng(seed).standard_normal((64,)).astype("float32")
    launch = tvmgrad.prepare("relu_grad", {"out": x, "out_grad": x * 2}, cache=cache)
    ok = np.array_equal(launch()["x_grad"], np.where(x > 0, x * 2, 0))
    return ok, cache.stats["built"]


def test_concurrent_builders_build_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_worker, [(str(tmp_path), s) for s in range(4)])
    assert all(ok for ok, _ in results)
    assert sum(built for _, built in results) == 1      # the others waited on the lock and loaded
    libs = list(tmp_path.rglob("*.so"))
    assert len(libs) == 1
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith((".so.tmp",)) or p.suffix == ".tmp"]


def test_default_location_honours_env(tmp_path, monkeypatch):
    from tvmgrad.cache import cache_dir
    monkeypatch.setenv("TVMGRAD_CACHE_DIR", str(tmp_path / "k"))
    assert cache_dir() == tmp_path / "k"
    monkeypatch.delenv("TVMGRAD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "tvmgrad"


@pytest.mark.parametrize("n", [0, 1, 3])
def test_empty_and_tiny_tensors(tmp_path, n):
    x = np.ones((n, 2), dtype="float32")
    np.testing.assert_array_equal(_run_with(KernelCache(tmp_path), x), x + 1)
