"""Target names as users write them -> TVM targets, and a stable key for caching.

Accepted: ``"llvm"`` (this host's CPU), ``"llvm:skylake-avx512"`` (a named CPU), ``"cuda"`` (arch of
the visible GPU, else sm_80), ``"cuda:sm_90"``, a dict in TVM 0.27's JSON form
(``{"kind": "cuda", "arch": "sm_90"}``) or a ``tvm.target.Target``.
"""

from __future__ import annotations

import functools
import json
import os

__all__ = ["resolve", "Resolved", "default_cuda_arch"]

DEFAULT_CUDA_ARCH = "sm_80"


class Resolved:
    """A TVM target plus what tvmgrad derives from it once."""

    def __init__(self, target):
        self.target = target
        self.kind = target.kind.name
        self.arch = str(target.attrs["arch"]) if "arch" in target.attrs else None
        self.key = json.dumps(_exported(target), sort_keys=True, default=str)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    def device(self):
        from . import rt
        return rt.device("cuda" if self.is_gpu else "cpu", 0)

    def __repr__(self) -> str:
        return f"<target {self.kind}{' ' + self.arch if self.arch else ''}>"


def _exported(target) -> dict:
    out = dict(target.export())
    host = out.pop("host", None)
    if isinstance(host, dict):
        out["host"] = {k: v for k, v in host.items() if k in ("kind", "mtriple", "mcpu", "mattr")}
    return out


@functools.cache
def default_cuda_arch() -> str:
    """The arch of GPU 0 when one is visible, else sm_80 (the oldest arch we ship for)."""
    env = os.environ.get("TVMGRAD_CUDA_ARCH")
    if env:
        return env
    try:
        import tvm
        dev = tvm.cuda(0)
        if dev.exist:
            return "sm_" + dev.compute_version.replace(".", "")
    except Exception:  # noqa: BLE001 - no CUDA runtime at all
        pass
    return DEFAULT_CUDA_ARCH


@functools.lru_cache(maxsize=64)
def _resolve_str(text: str) -> Resolved:
    import tvm
    text = text.strip()
    if text.startswith("{"):
        return _resolve_dict(text)
    kind, _, arch = text.partition(":")
    if kind == "cuda":
        return Resolved(tvm.target.Target({"kind": "cuda", "arch": arch or default_cuda_arch()},
                                          host="llvm"))
    if kind == "llvm":
        from tvm.target import codegen
        return Resolved(tvm.target.Target({"kind": "llvm", "mcpu": arch or codegen.llvm_get_system_cpu()}))
    try:
        return Resolved(tvm.target.Target(text))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"unknown target {text!r}: use 'llvm', 'cuda', 'cuda:sm_90' or a dict "
                         f"like {{'kind': 'cuda', 'arch': 'sm_90'}} ({exc})") from None


@functools.lru_cache(maxsize=64)
def _resolve_dict(text: str) -> Resolved:
    import tvm
    spec = json.loads(text)
    if spec.get("kind") == "cuda":
        spec.setdefault("arch", default_cuda_arch())
        return Resolved(tvm.target.Target(spec, host="llvm"))
    try:
        return Resolved(tvm.target.Target(spec))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"unknown target {spec!r}: {exc}") from None


def resolve(target) -> Resolved:
    if isinstance(target, Resolved):
        return target
    if isinstance(target, str):
        return _resolve_str(target)
    if isinstance(target, dict):
        return _resolve_dict(json.dumps(target, sort_keys=True))
    if hasattr(target, "kind") and hasattr(target, "export"):
        if target.kind.name == "cuda" and target.host is None:
            import tvm
            target = tvm.target.Target(target, host="llvm")
        return Resolved(target)
    raise TypeError(f"target must be a string, dict or tvm.target.Target, got {type(target).__name__}")
