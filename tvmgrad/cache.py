"""The kernel cache: an in-process memo over a disk cache of shared libraries.

One entry per kernel identity: the plan key (op, dtype, broadcast pattern, code-changing attrs),
the target, the TVM version and the digest of every source file that shapes the code. Entries are
written atomically (temp file + rename) under a per-entry file lock, and carry a SHA-256 of the
library in a sidecar written last: an entry without a valid sidecar (truncated, corrupt, a crash
mid-write) is rebuilt, never loaded.

Location: ``$TVMGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvmgrad``, else ``~/.cache/tvmgrad``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import tempfile
import threading
from dataclasses import dataclass

from filelock import FileLock

from .build import compile_plan, source_digest
from .families.base import Plan
from .targets import Resolved

__all__ = ["cache_dir", "KernelCache", "default_cache", "CacheEntry"]


def cache_dir() -> pathlib.Path:
    env = os.environ.get("TVMGRAD_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "tvmgrad"


@dataclass
class CacheEntry:
    """A loaded kernel and where it came from (``memo``, ``disk`` or ``built``)."""

    function: object
    module: object
    path: pathlib.Path
    origin: str


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
        ident = repr((plan.key, target.key, tvm.__version__, source_digest(impl, target.kind, plan.pattern)))
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
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            entry = self._try_load(path, plan)       # another process may have built it meanwhile
            if entry is not None:
                self.stats["disk"] += 1
                return entry
            if path.exists() or _sidecar(path).exists():
                self.stats["rebuilt_corrupt"] += 1
            ex = compile_plan(plan, target)
            self._write(ex, path, plan, target)
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
        return CacheEntry(function, module, path, "disk")

    @staticmethod
    def _write(ex, path: pathlib.Path, plan: Plan, target: Resolved) -> None:
        import tvm
        fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".so", dir=path.parent)
        os.close(fd)
        try:
            ex.export_library(tmp)
            digest = hashlib.sha256(pathlib.Path(tmp).read_bytes()).hexdigest()
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        meta = {"sha256": digest, "symbol": plan.symbol, "key": repr(plan.key),
                "target": target.key, "tvm": tvm.__version__}
        fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(meta, fh, indent=1)
        os.replace(tmp, _sidecar(path))


def _sidecar(path: pathlib.Path) -> pathlib.Path:
    return path.with_suffix(".json")


default_cache = KernelCache()
