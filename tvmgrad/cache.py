"""The kernel cache: an in-process memo over a disk cache of shared libraries.

One entry per kernel identity: the plan key (op, dtype, broadcast pattern, code-changing attrs),
the target, the TVM version and the digest of every source file that shapes the code. Entries are
written atomically (temp file + rename) under a per-entry file lock, and carry a SHA-256 of the
library in a sidecar written last: an entry without a valid sidecar (truncated, corrupt, a crash
mid-write) is rebuilt, never loaded. Temp files are named ``.<entry>.<random>.tmp.so`` (``.json``);
the lock holder deletes its entry's leftovers (a builder killed mid-write) before writing.

A cache directory that cannot be written (read-only filesystem, no permission) still serves the
entries it holds; kernels it lacks are built into a private temporary directory of this process,
removed at exit, with one ``CacheNotWritableWarning`` per directory and process.

Location: ``tvmgrad.cachedir.cache_dir()`` (``$TVMGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvmgrad``,
else ``~/.cache/tvmgrad``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import os
import pathlib
import re
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass

from filelock import FileLock

from . import streaming, tuned
from .build import compile_plan
from .cachedir import cache_dir
from .sources import file_digest, source_digest
from .families.base import Plan
from .targets import Resolved

__all__ = ["KernelCache", "default_cache", "CacheEntry", "CacheNotWritableWarning",
           "usage", "clear", "prune"]


@dataclass
class CacheEntry:
    """A loaded kernel and where it came from (``memo``, ``disk`` or ``built``)."""

    function: object
    module: object
    path: pathlib.Path
    origin: str


class CacheNotWritableWarning(UserWarning):
    """The kernel cache directory cannot be written: kernels built now will not persist."""


# errnos that mean "this directory cannot be written", as opposed to a real failure
_UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class _Unwritable(Exception):
    def __init__(self, error: OSError, ex=None):
        super().__init__(str(error))
        self.error, self.ex = error, ex        # ex: the compiled module, if it got that far


def _unwritable(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _UNWRITABLE


_private_lock = threading.Lock()
_private_root: pathlib.Path | None = None
_warned: set[str] = set()


def _private_dir() -> pathlib.Path:
    """This process's own build directory for kernels an unwritable cache cannot take (created
    once, removed at exit)."""
    global _private_root
    with _private_lock:
        if _private_root is None or not _private_root.is_dir():
            _private_root = pathlib.Path(tempfile.mkdtemp(prefix="tvmgrad-kernels-"))
            atexit.register(shutil.rmtree, str(_private_root), True)
        return _private_root


def _warn_unwritable(root: pathlib.Path, error: OSError, private: pathlib.Path) -> None:
    key = str(root)
    with _private_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"tvmgrad: the kernel cache directory {root} cannot be written ({error}); "
                  f"kernels it does not hold are built into {private} and will not persist "
                  f"after this process (set TVMGRAD_CACHE_DIR to a writable directory)",
                  CacheNotWritableWarning, stacklevel=4)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60]


class KernelCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self._root = pathlib.Path(root) if root else None
        self._memo: dict[tuple, CacheEntry] = {}
        self._lock = threading.Lock()
        self.stats = {"memo": 0, "disk": 0, "built": 0, "rebuilt_corrupt": 0}

    @property
    def root(self) -> pathlib.Path:
        return self._root or cache_dir()

    def entry_path(self, plan: Plan, impl, target: Resolved) -> pathlib.Path:
        import tvm
        sources = source_digest(impl, target.kind, plan.pattern)
        if plan.trace is not None:                  # a tuned plan: scheduled by replaying its trace
            sources += file_digest(tuned.__file__)
        if plan.stream:                              # its stores rewritten by streaming.py
            sources += file_digest(streaming.__file__)
        ident = repr((plan.key, target.key, tvm.__version__, sources))
        digest = hashlib.sha256(ident.encode()).hexdigest()[:32]
        tslug = _slug(target.kind + ("_" + target.arch if target.arch else ""))
        return self.root / f"tvm-{_slug(tvm.__version__)}" / tslug / _slug(plan.key[1]) / f"{digest}.so"

    def get(self, plan: Plan, impl, target: Resolved) -> CacheEntry:
        memo_key = (plan.key, target.key)
        entry = self._memo.get(memo_key)
        if entry is not None:
            self.stats["memo"] += 1
            return entry
        with self._lock:
            entry = self._memo.get(memo_key)
            if entry is None:
                entry = self._load_or_build(plan, impl, target)
                self._memo[memo_key] = entry
        return entry

    def clear_memo(self) -> None:
        self._memo.clear()

    # -- disk ----------------------------------------------------------------------------------
    def _load_or_build(self, plan, impl, target) -> CacheEntry:
        if target.is_gpu:
            from .cuda import install_load_time_compiler
            install_load_time_compiler()
        path = self.entry_path(plan, impl, target)
        entry = self._try_load(path, plan)
        if entry is not None:
            self.stats["disk"] += 1
            return entry
        try:
            return self._build(path, plan, target)
        except _Unwritable as exc:
            root = self.root
            private = _private_dir()
            _warn_unwritable(root, exc.error, private)
            try:
                where = private / path.relative_to(root)
            except ValueError:
                where = private / path.name
            try:
                return self._build(where, plan, target, exc.ex)
            except _Unwritable as again:
                raise OSError(again.error.errno, f"{plan.symbol}: cannot store its kernel: neither "
                              f"the cache directory {root} ({exc.error}) nor the temporary "
                              f"directory {private} ({again.error}) can be written") from again.error

    def _build(self, path: pathlib.Path, plan, target, ex=None) -> CacheEntry:
        """Build (or, if another process just did, load) the entry at ``path`` under its file lock;
        _Unwritable if the directory cannot be written."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(path) + ".lock")
            lock.acquire()
        except OSError as exc:
            if _unwritable(exc):
                raise _Unwritable(exc, ex) from exc
            raise
        try:
            entry = self._try_load(path, plan)       # another process may have built it meanwhile
            if entry is not None:
                self.stats["disk"] += 1
                return entry
            _remove_leftovers(path)
            if path.exists() or _sidecar(path).exists():
                self.stats["rebuilt_corrupt"] += 1
            if ex is None:
                ex = compile_plan(plan, target)
            try:
                self._write(ex, path, plan, target)
            except OSError as exc:
                if _unwritable(exc):
                    raise _Unwritable(exc, ex) from exc
                raise
        finally:
            lock.release()
        entry = self._try_load(path, plan)
        if entry is None:
            raise RuntimeError(f"{plan.symbol}: freshly built cache entry {path} does not load")
        entry.origin = "built"
        self.stats["built"] += 1
        return entry

    def _try_load(self, path: pathlib.Path, plan: Plan) -> CacheEntry | None:
        side = _sidecar(path)
        try:
            meta = json.loads(side.read_text())
            data = path.read_bytes()
        except (OSError, ValueError):
            return None
        if meta.get("sha256") != hashlib.sha256(data).hexdigest() or meta.get("symbol") != plan.symbol:
            return None
        import tvm
        try:
            module = tvm.runtime.load_module(str(path))
            function = module[plan.symbol]
        except Exception:  # noqa: BLE001 - a library that does not load is a corrupt entry
            return None
        with contextlib.suppress(OSError):          # last use, for `tvmgrad cache prune`
            os.utime(side)
        return CacheEntry(function, module, path, "disk")

    @staticmethod
    def _write(ex, path: pathlib.Path, plan: Plan, target: Resolved) -> None:
        import tvm
        tmp = _temp(path, ".so")
        try:
            ex.export_library(tmp)
            digest = hashlib.sha256(pathlib.Path(tmp).read_bytes()).hexdigest()
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        meta = {"sha256": digest, "symbol": plan.symbol, "key": repr(plan.key),
                "target": target.key, "tvm": tvm.__version__}
        tmp = _temp(path, ".json")
        try:
            with open(tmp, "w") as fh:
                json.dump(meta, fh, indent=1)
            os.replace(tmp, _sidecar(path))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _temp(path: pathlib.Path, suffix: str) -> str:
    """A new empty temp file beside an entry: ``.<stem>.<random>.tmp<suffix>`` (the suffix last:
    export_library picks the format by it)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{suffix}", dir=path.parent)
    os.close(fd)
    return tmp


def _remove_leftovers(path: pathlib.Path) -> None:
    """Delete an entry's temp files left by a builder that died mid-write (call with the entry's
    lock held: only its holder writes temps for the entry). Also those of the older naming,
    ``<stem><8 random chars>.so``/``.json``."""
    old = re.compile(re.escape(path.stem) + r"[A-Za-z0-9_]{8}\.(so|json)")
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        if (name.startswith(f".{path.stem}.") and ".tmp." in name) or old.fullmatch(name):
            try:
                os.unlink(path.parent / name)
            except OSError:
                pass


def _sidecar(path: pathlib.Path) -> pathlib.Path:
    return path.with_suffix(".json")


default_cache = KernelCache()


# -- managing the cache directory (``tvmgrad cache info|clear|prune``) -----------------------------
#
# Layout: <root>/tvm-<version>/<target>/<op>/<digest>.so (+ .json sidecar, .lock), the AOT shards
# under <root>/aot/tvm-<version>/<target>/<digest>/ (+ .lock) and nvcc's cubins under <root>/cubin/.
# An entry is used when loaded (its sidecar's mtime is touched), so age is time since last use.

def _units(root: pathlib.Path):
    """(part, unit path, files of the unit, last use) of every cache entry under ``root``."""
    for so in root.glob("tvm-*/*/*/*.so"):
        files = [so, _sidecar(so), pathlib.Path(str(so) + ".lock")]
        yield so.parts[len(root.parts)], so, files, _last_use(files)
    for shard in root.glob("aot/tvm-*/*/*"):
        if shard.is_dir() and not shard.name.startswith("."):
            files = [p for p in shard.rglob("*") if p.is_file()] + [pathlib.Path(str(shard) + ".lock")]
            yield f"aot/{shard.parts[len(root.parts) + 1]}", shard, files, _last_use(files)
    for cubin in root.glob("cubin/*.cubin"):
        yield "cubin", cubin, [cubin], _last_use([cubin])


def _last_use(files) -> float:
    times = [max(st.st_mtime, st.st_atime) for f in files for st in [_stat(f)] if st is not None]
    return max(times, default=0.0)


def _stat(path: pathlib.Path):
    try:
        return path.stat()
    except OSError:
        return None


def _size(files) -> int:
    return sum(st.st_size for f in files for st in [_stat(f)] if st is not None)


def usage(root=None) -> dict:
    """The cache directory's size and entries per part (``tvm-<version>`` kernels, AOT shards
    per TVM version, cubins); ``current`` names the parts this TVM reads."""
    import tvm
    root = pathlib.Path(root) if root else cache_dir()
    parts: dict[str, dict] = {}
    for part, _, files, _ in _units(root):
        rec = parts.setdefault(part, {"entries": 0, "bytes": 0})
        rec["entries"] += 1
        rec["bytes"] += _size(files)
    current = f"tvm-{_slug(tvm.__version__)}"
    return {"root": str(root), "exists": root.is_dir(), "parts": dict(sorted(parts.items())),
            "entries": sum(p["entries"] for p in parts.values()),
            "bytes": sum(p["bytes"] for p in parts.values()),
            "current": [current, f"aot/{current}", "cubin"]}


def _remove(unit: pathlib.Path, files) -> bool:
    """Delete one entry under its lock (skipped if a build holds it); True if removed."""
    from filelock import Timeout
    lock = FileLock(str(unit) + ".lock", timeout=0)
    try:
        with lock:
            if unit.is_dir():
                shutil.rmtree(unit, ignore_errors=True)
            for f in files:
                if not str(f).endswith(".lock"):
                    with contextlib.suppress(FileNotFoundError):
                        f.unlink()
    except Timeout:
        return False
    with contextlib.suppress(OSError):
        os.unlink(str(unit) + ".lock")
    return True


def prune(root=None, *, older_than: float | None = None, dry_run: bool = False) -> dict:
    """Remove entries not used for ``older_than`` seconds, and every entry of another TVM
    version (this TVM never reads them); -> {"removed": n, "bytes": freed, "kept": n}."""
    import time
    root = pathlib.Path(root) if root else cache_dir()
    current = set(usage(root)["current"])
    cutoff = None if older_than is None else time.time() - older_than
    removed = freed = kept = 0
    for part, unit, files, last in list(_units(root)):
        size = _size(files)
        stale = part not in current or (cutoff is not None and last < cutoff)
        if stale and (dry_run or _remove(unit, files)):
            removed, freed = removed + 1, freed + size
        else:
            kept += 1
    if not dry_run and root.is_dir():
        for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                folder.rmdir()                      # only empty ones go
    return {"root": str(root), "removed": removed, "kept": kept, "bytes": freed, "dry_run": dry_run}


def clear(root=None) -> dict:
    """Remove every entry of the cache directory (entries a build holds locked are kept)."""
    return prune(root, older_than=-1.0)
