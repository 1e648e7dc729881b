"""CUDA device code -> cubin with nvcc, and what ptxas says about each kernel.

TVM 0.27 exports CUDA *source* and compiles it when a library is loaded, by default with NVRTC and
``--use_fast_math``. Gradients need IEEE division, denormals and accurate transcendentals, so
tvmgrad compiles with nvcc, without fast math, and registers itself as TVM's load-time compiler
(``tvm_callback_cuda_compile``), caching the cubin per source text and arch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from .cachedir import cache_dir

__all__ = ["KernelStats", "CubinResult", "compile_cubin", "nvcc_path", "device_source", "fatbin_contents",
           "install_load_time_compiler"]

NVCC_FLAGS = (
    "-O3", "--expt-relaxed-constexpr",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
)


@dataclass
class KernelStats:
    """ptxas's resource report for one kernel on one arch."""

    name: str
    arch: str
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    shared: int = 0

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


@dataclass
class CubinResult:
    arch: str
    data: bytes
    kernels: dict[str, KernelStats] = field(default_factory=dict)


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def parse_ptxas(text: str) -> dict[str, KernelStats]:
    """ptxas -v output -> stats per kernel."""
    stats: dict[str, KernelStats] = {}
    current = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = stats.setdefault(m.group(1), KernelStats(m.group(1), m.group(2)))
            continue
        if current is None:
            continue
        m = _PROPS.search(line)
        if m:
            current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
            continue
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            current.shared = int(m.group(2) or 0)
    return stats


_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)\)")


def for_nvcc(source: str) -> str:
    """TVM's CUDA source as tvmgrad compiles it: each ``__launch_bounds__(threads)`` also says
    one resident block per SM is enough. With the thread count alone ptxas aims at several
    blocks per SM and spills loop-carried values at 32-48 registers; with it, a kernel keeps
    what it needs in registers (the memory-bound kernels still use few)."""
    return _LAUNCH_BOUNDS.sub(r"__launch_bounds__(\1, 1)", source)


def compile_cubin(source: str, arch: str, *, fmt: str = "cubin") -> CubinResult:
    """Compile CUDA C source for one arch (``sm_90``); ptxas statistics parsed per kernel."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc not found on PATH: CUDA kernels cannot be compiled here")
    with tempfile.TemporaryDirectory(prefix="tvmgrad-nvcc-") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        out = os.path.join(tmp, f"kernels.{fmt}")
        with open(src, "w") as fh:
            fh.write(for_nvcc(source))
        cmd = [nvcc, f"--{fmt}", *NVCC_FLAGS, f"-arch={arch}", "-Xptxas", "-v", "-o", out, src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed for {arch}:\n{proc.stderr[-4000:]}")
        with open(out, "rb") as fh:
            data = fh.read()
    return CubinResult(arch, data, parse_ptxas(proc.stdout + proc.stderr))


def device_source(executable) -> str:
    """The CUDA C source of a compiled TVM executable's device module(s)."""
    mods = executable.mod._collect_from_import_tree(lambda m: m.kind == "cuda")
    if not mods:
        raise ValueError("no CUDA device module in this executable")
    return "\n".join(m.inspect_source() for m in mods)


def _cubin_cache_dir() -> str:
    return str(cache_dir() / "cubin")


@functools.lru_cache(maxsize=None)
def _cached_cubin(source_hash: str, arch: str, source: str) -> bytes:
    path = os.path.join(_cubin_cache_dir(), f"{source_hash}-{arch}.cubin")
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        pass
    data = compile_cubin(source, arch).data
    tmp = None
    try:                     # persisting is a convenience: an unwritable cache keeps it in memory
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{source_hash}-{arch}.", suffix=".tmp", dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return data


_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_KINDS = {1: "ptx", 2: "elf"}


def fatbin_contents(data: bytes) -> list[tuple[str, str]]:
    """(kind, arch) of each image in a fatbin, e.g. [("elf", "sm_80"), ("ptx", "sm_90")]: what
    ``cuobjdump --list-elf/--list-ptx`` shows, read from the container's headers (a 16-byte file
    header, then per image a header holding kind, header size, padded payload size and, at byte
    28, the SM version)."""
    import struct
    if len(data) < 16 or struct.unpack_from("<I", data)[0] != _FATBIN_MAGIC:
        raise ValueError("not a CUDA fatbin (bad magic)")
    _, _, header, size = struct.unpack_from("<IHHQ", data)
    images, offset = [], header
    while offset < min(header + size, len(data)):
        kind, _, image_header, padded = struct.unpack_from("<HHII", data, offset)
        sm = struct.unpack_from("<I", data, offset + 28)[0]
        images.append((_FATBIN_KINDS.get(kind, f"kind{kind}"), f"sm_{sm}"))
        offset += image_header + padded
    return images


PREBUILT: dict[str, str] = {}     # sha256 of a device source -> path of its prebuilt fatbin


def install_load_time_compiler() -> None:
    """Make TVM's load-time CUDA compile return a prebuilt fatbin when an AOT library registered
    one for this exact source (no compiler needed), else compile with tvmgrad's nvcc flags (no
    fast math), caching the cubin per source and arch."""
    import sys

    import tvm_ffi
    if "tvm" in sys.modules:
        import tvm.support.nvcc  # noqa: F401 - registers TVM's callback first, then we override it

    from .targets import default_cuda_arch

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code, target=None):  # noqa: ARG001 - TVM passes the target on some paths
        digest = hashlib.sha256(code.encode()).hexdigest()
        if digest in PREBUILT:
            with open(PREBUILT[digest], "rb") as fh:
                return fh.read()
        return _cached_cubin(digest[:32], default_cuda_arch(), code)
