"""The kernel cache: hits, invalidation, corrupt entries, concurrent builders."""

import importlib.util
import json
import multiprocessing
import os
import pathlib
import tempfile

import numpy as np
import pytest

import tvmgrad
from tvmgrad import registry
from tvmgrad.sources import file_digest, source_digest
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
    file_digest.cache_clear()
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
    from tvmgrad.cachedir import cache_dir
    monkeypatch.setenv("TVMGRAD_CACHE_DIR", str(tmp_path / "k"))
    assert cache_dir() == tmp_path / "k"
    monkeypatch.delenv("TVMGRAD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "tvmgrad"


@pytest.mark.parametrize("n", [0, 1, 3])
def test_empty_and_tiny_tensors(tmp_path, n):
    x = np.ones((n, 2), dtype="float32")
    np.testing.assert_array_equal(_run_with(KernelCache(tmp_path), x), x + 1)


# -- temp files and unwritable cache directories ----------------------------------------------

def test_leftover_temp_files_of_an_entry_are_removed(tmp_path, monkeypatch):
    """A builder killed mid-write leaves empty temp files; the next lock holder removes that
    entry's (and only that entry's) before writing, and its own are named recognisably."""
    cache = KernelCache(tmp_path)
    entry, plan, _ = _plan()
    path = cache.entry_path(plan, entry.impl, LLVM)
    path.parent.mkdir(parents=True)
    orphans = [path.parent / f".{path.stem}.k3j_x9q2.tmp.so", path.parent / f".{path.stem}.a1b2c3d4.tmp.json",
               path.parent / f"{path.stem}ab12cd34.so", path.parent / f"{path.stem}zz_9yy8x.json"]  # older naming
    other = path.parent / f".{'f' * 32}.k3j_x9q2.tmp.so"        # another entry's: its holder may be writing
    for p in orphans + [other]:
        p.write_bytes(b"")
    made = []
    real = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    assert cache.get(plan, entry.impl, LLVM).origin == "built"
    assert not [p for p in orphans if p.exists()] and other.exists()
    ours = [pathlib.Path(name) for _, name in made if pathlib.Path(name).parent == path.parent]
    assert sorted(p.name.rsplit(".", 1)[-1] for p in ours) == ["json", "so"]
    assert all(p.name.startswith(f".{path.stem}.") and ".tmp." in p.name and not p.exists() for p in ours)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(
        [path.name, path.with_suffix(".json").name, other.name]
        + ([path.name + ".lock"] if pathlib.Path(str(path) + ".lock").exists() else []))


def _read_only(monkeypatch, root, *, dirs=True, files=True):
    """Make ``root`` behave as a read-only filesystem for the cache: creating directories, lock
    files (``dirs``) and temp files (``files``) under it fails with EROFS."""
    import errno

    import tvmgrad.cache as cache_mod
    root = os.path.realpath(root)
    inside = lambda p: os.path.realpath(p) == root or os.path.realpath(p).startswith(root + os.sep)  # noqa: E731
    erofs = lambda p: OSError(errno.EROFS, "Read-only file system", str(p))  # noqa: E731
    if dirs:
        real_mkdir = pathlib.Path.mkdir

        def mkdir(self, *a, **k):
            if inside(self) and not self.is_dir():
                raise erofs(self)
            return real_mkdir(self, *a, **k)
        monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)

        real_lock = cache_mod.FileLock

        class Lock:
            def __init__(self, path, *a, **k):
                self.path, self.real = path, real_lock(path, *a, **k)

            def acquire(self, *a, **k):
                if inside(self.path):
                    raise erofs(self.path)
                return self.real.acquire(*a, **k)

            def release(self, *a, **k):
                return self.real.release(*a, **k)
        monkeypatch.setattr(cache_mod, "FileLock", Lock)
    if files:
        real_mkstemp = tempfile.mkstemp

        def mkstemp(*a, dir=None, **k):
            if dir is not None and inside(dir):
                raise erofs(dir)
            return real_mkstemp(*a, dir=dir, **k)
        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def _fresh_warning_state(monkeypatch):
    """As in a new process: no warning given yet, no private build directory yet."""
    import tvmgrad.cache as cache_mod
    monkeypatch.setattr(cache_mod, "_warned", set())
    monkeypatch.setattr(cache_mod, "_private_root", None)


def _check_read_only_cache(root):
    """An existing entry loads from the read-only ``root``; new kernels are built elsewhere,
    work, and one warning in all names ``root``."""
    import warnings

    from tvmgrad.cache import CacheNotWritableWarning
    entry, plan32, x = _plan(dtype="float32")
    before = sorted(root.rglob("*"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = KernelCache(root)
        assert cache.get(plan32, entry.impl, LLVM).origin == "disk"
        built = []
        for dtype in ("float64", "float16"):
            _, plan, _ = _plan(dtype=dtype)
            got = cache.get(plan, entry.impl, LLVM)
            assert got.origin == "built" and root not in got.path.parents and got.path.exists()
            built.append(got)
        again = KernelCache(root)                         # another cache object, same process
        _, plan64, _ = _plan(dtype="float64")
        assert again.get(plan64, entry.impl, LLVM).origin == "disk"
        np.testing.assert_array_equal(_run_with(cache, x), np.where(x > 0, x + 1, 0))
    ours = [w for w in caught if issubclass(w.category, CacheNotWritableWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    text = str(ours[0].message)
    assert str(root) in text and "will not persist" in text
    assert sorted(root.rglob("*")) == before             # nothing written there
    return built


def test_read_only_cache_dir_serves_entries_and_builds_elsewhere(tmp_path, monkeypatch):
    """Simulated with failing mkdir, lock and temp-file creation, so that it runs as root too."""
    root = tmp_path / "ro"
    entry, plan32, _ = _plan()
    KernelCache(root).get(plan32, entry.impl, LLVM)          # an entry made while it was writable
    _fresh_warning_state(monkeypatch)
    _read_only(monkeypatch, root)
    _check_read_only_cache(root)


def test_unwritable_entry_dir_reuses_the_compiled_kernel(tmp_path, monkeypatch):
    """Directories and lock exist (made while writable) but temp files cannot be created: the
    kernel compiled for the cache is stored in the private directory, not compiled again."""
    import tvmgrad.cache as cache_mod
    root = tmp_path / "ro"
    entry, plan32, _ = _plan()
    _, plan64, _ = _plan(dtype="float64")
    KernelCache(root).get(plan32, entry.impl, LLVM)
    KernelCache(root).entry_path(plan64, entry.impl, LLVM).parent.mkdir(parents=True, exist_ok=True)
    _fresh_warning_state(monkeypatch)
    _read_only(monkeypatch, root, dirs=False)
    compiled = []
    real = cache_mod.compile_plan
    monkeypatch.setattr(cache_mod, "compile_plan", lambda *a: compiled.append(a) or real(*a))
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = KernelCache(root).get(plan64, entry.impl, LLVM)
    assert got.origin == "built" and root not in got.path.parents
    assert len(compiled) == 1 and len(caught) == 1


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs a non-root POSIX user (root writes through mode 0o555)")
def test_read_only_cache_dir_by_permissions(tmp_path, monkeypatch):
    root = tmp_path / "ro"
    entry, plan32, _ = _plan()
    KernelCache(root).get(plan32, entry.impl, LLVM)
    _fresh_warning_state(monkeypatch)
    dirs = [root, *[p for p in root.rglob("*") if p.is_dir()]]
    for d in dirs:
        d.chmod(0o555)
    try:
        _check_read_only_cache(root)
    finally:
        for d in dirs:
            d.chmod(0o755)


def test_private_build_dir_is_made_once_and_removed_at_exit(tmp_path):
    """In a child process: two kernels built while the cache is unwritable share one private
    directory, which is gone once the process has exited."""
    code = f"""
import errno, os, pathlib, warnings
import numpy as np
import tvmgrad, tvmgrad.cache as c
root = {str(tmp_path / "never")!r}
real = pathlib.Path.mkdir
def mkdir(self, *a, **k):
    if str(self).startswith(root):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))
    return real(self, *a, **k)
pathlib.Path.mkdir = mkdir
cache = c.KernelCache(root)
x = np.ones(4, "float32")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for dt in ("float32", "float64"):
        tvmgrad.prepare("relu_grad", {{"out": x.astype(dt), "out_grad": x.astype(dt)}}, cache=cache)()
paths = {{str(e.path) for e in cache._memo.values()}}
print(len([m for m in w if issubclass(m.category, c.CacheNotWritableWarning)]))
print(c._private_root)
print(all(p.startswith(str(c._private_root)) for p in paths) and len(paths) == 2)
"""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}).stdout.split("\n")
    assert out[0] == "1" and out[2] == "True", out
    assert not pathlib.Path(out[1]).exists()
    assert not (tmp_path / "never").exists()
