"""Target names as users write them -> TVM targets, and a stable key for caching.

Accepted: ``"llvm"`` (this host's CPU), ``"llvm:skylake-avx512"`` (a named LLVM CPU),
``"cuda"`` (arch of the visible GPU, else sm_80), ``"cuda:sm_90"``, a dict in TVM 0.27's JSON
form (``{"kind": "cuda", "arch": "sm_90"}``) or a ``tvm.target.Target``.

``"llvm"`` is this host as it really is: LLVM's name for the CPU (``mcpu``) plus an ``mattr``
that turns off every feature the name implies but the host does not enable (a hypervisor may
mask AVX-512 on a CPU LLVM calls ``znver4``) and turns on vector features the name lacks
(``tvmgrad.hostcpu`` says which). ``$TVMGRAD_CPU`` (an LLVM CPU name such as ``x86-64-v3``)
makes ``"llvm"`` mean that CPU instead: the test suite runs the AVX2 code path that way on any
x86-64 machine, since code for a lesser ISA runs on a greater one.

The CPU targets tvmgrad makes (the host's, ``"llvm:<cpu>"``, ``$TVMGRAD_CPU``) switch off LLVM's
``prefer-256-bit`` tuning where the CPU has AVX-512: the schedules vectorise at the target's
full width (``schedules/cpu/_isa.py``), and with that flag (set for Intel's AVX-512 CPUs, against
old Skylake's frequency drop) LLVM splits each 512-bit vector into two 256-bit halves: half the
FMA width (measured here: conv2d_grad 37 -> 18 ms, gelu_grad 12.8 -> 9.7 ms). A target given
as a dict or ``tvm.target.Target`` is used as written.
"""

from __future__ import annotations

import difflib
import functools
import json
import os

from . import hostcpu

__all__ = ["resolve", "Resolved", "default_cuda_arch", "host_cpu_spec", "cpu_spec", "CPU_ENV"]

DEFAULT_CUDA_ARCH = "sm_80"
CPU_ENV = "TVMGRAD_CPU"

# Vector features worth switching on when the host has them but LLVM's CPU name does not imply
# them (an unknown model that LLVM names after an older one).
_VECTOR = ("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi",
           "bmi2", "lzcnt", "movbe", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl",
           "avx512vnni", "avx512bf16", "avx512fp16", "avx512ifma", "avx512vbmi", "avx512vbmi2",
           "neon", "fullfp16", "dotprod", "i8mm", "bf16", "sve", "sve2")


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

    @functools.cached_property
    def features(self) -> tuple[str, ...]:
        """Every LLVM feature the CPU code may use (its mcpu's, after mattr); () for CUDA."""
        if self.kind != "llvm":
            return ()
        from .schedules.cpu._isa import features
        return tuple(sorted(features(self.target)))

    @functools.cached_property
    def missing_on_host(self) -> tuple[str, ...]:
        """Features this CPU target's code needs that this host does not enable."""
        if self.kind != "llvm":
            return ()
        triple = str(self.target.attrs.get("mtriple", "") or "")
        if triple and not triple.startswith(hostcpu.host().arch):
            return (f"a {triple.split('-')[0]} CPU",)
        return tuple(hostcpu.host().lacks(self.features))

    def check_runs_here(self, op: str) -> None:
        """Refuse to run code this host cannot execute (it would die with SIGILL)."""
        missing = self.missing_on_host
        if missing:
            raise ValueError(f"{op}: target {self.describe()} needs {', '.join(missing)}, which this "
                             f"CPU does not enable (it would die with an illegal instruction); use "
                             f"target='llvm' for this host, or build for that CPU with tvmgrad build")

    def describe(self) -> str:
        if self.kind != "llvm":
            return repr(self)
        attrs = self.target.attrs
        mattr = ",".join(str(a) for a in attrs.get("mattr", ()) or ())
        return f"llvm:{attrs.get('mcpu', 'generic')}" + (f" (mattr {mattr})" if mattr else "")

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


def cpu_spec(name: str, triple: str | None = None) -> dict:
    """The LLVM target dict of a named CPU; ValueError (with close names) if LLVM knows no such CPU."""
    import tvm
    from tvm.target import codegen
    triple = triple or codegen.llvm_get_system_triple()
    if not codegen.llvm_is_valid_cpu(name, triple):
        known = list(codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm", "mtriple": triple})))
        close = difflib.get_close_matches(name, known, n=4)
        raise ValueError(f"unknown CPU {name!r} for {triple}"
                         + (f" (did you mean {', '.join(close)}?)" if close else "")
                         + f"; LLVM knows {len(known)} CPUs, e.g. x86-64-v3, x86-64-v4, znver3, "
                           f"skylake-avx512 ('host': this machine)")
    implied = codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": name,
                                                               "mtriple": triple}))
    return _full_width({"kind": "llvm", "mcpu": name}, implied)


def _full_width(spec: dict, features) -> dict:
    """``spec`` with LLVM's 256-bit preference switched off where its CPU has AVX-512."""
    if "avx512f" in features and "prefer-256-bit" in features:
        spec["mattr"] = [*spec.get("mattr", ()), "-prefer-256-bit"]
    return spec


@functools.cache
def host_cpu_spec() -> dict:
    """This host's LLVM target dict: LLVM's CPU name corrected by the features the host really
    enables (``-f`` for each implied feature it lacks, ``+f`` for each vector feature it adds)."""
    import tvm
    from tvm.target import codegen
    name = codegen.llvm_get_system_cpu()
    implied = set(codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": name})))
    host = hostcpu.host()
    lacks = host.lacks(implied)
    adds = [f for f in _VECTOR if f in host.present and f not in implied]
    mattr = [f"-{f}" for f in lacks] + [f"+{f}" for f in adds]
    spec = {"kind": "llvm", "mcpu": name}
    if mattr:
        spec["mattr"] = mattr
    return _full_width(spec, (implied - set(lacks)) | set(adds))


def _default_cpu_spec() -> dict:
    name = os.environ.get(CPU_ENV, "").strip()
    if name and name != "host":
        return cpu_spec(name)
    return host_cpu_spec()


def _resolve_str(text: str) -> Resolved:
    text = text.strip()
    if text == "llvm":                  # what "llvm" means can change with $TVMGRAD_CPU
        return _resolve_dict(json.dumps(_default_cpu_spec(), sort_keys=True))
    return _resolve_text(text)


@functools.lru_cache(maxsize=64)
def _resolve_text(text: str) -> Resolved:
    import tvm
    if text.startswith("{"):
        return _resolve_dict(text)
    kind, _, arch = text.partition(":")
    if kind == "cuda":
        return Resolved(tvm.target.Target({"kind": "cuda", "arch": arch or default_cuda_arch()},
                                          host="llvm"))
    if kind == "llvm":
        spec = host_cpu_spec() if arch == "host" else cpu_spec(arch)
        return _resolve_dict(json.dumps(spec, sort_keys=True))
    try:
        return Resolved(tvm.target.Target(text))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"unknown target {text!r}: use 'llvm', 'llvm:<cpu>', 'cuda', 'cuda:sm_90' or "
                         f"a dict like {{'kind': 'cuda', 'arch': 'sm_90'}} ({exc})") from None


@functools.lru_cache(maxsize=64)
def _resolve_dict(text: str) -> Resolved:
    import tvm
    spec = json.loads(text)
    if spec.get("kind") == "cuda":
        spec.setdefault("arch", default_cuda_arch())
        return Resolved(tvm.target.Target(spec, host="llvm"))
    if spec.get("kind") == "llvm" and spec.get("mcpu"):
        cpu_spec(spec["mcpu"], spec.get("mtriple"))          # unknown CPU -> ValueError
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
