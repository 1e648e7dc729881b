"""What this host's CPU really enables, in LLVM's feature names, without importing TVM.

LLVM names the host CPU from its family and model (``znver4``), and that name implies features
(AVX-512) that a hypervisor may mask or an OS may not enable. Code built for the name then dies
with SIGILL. The features the host really runs are those the kernel reports: ``/proc/cpuinfo``
lists a flag only when CPUID has it *and* the OS enabled its register state (XSAVE). Elsewhere
numpy's ``__cpu_features__`` (CPUID + XGETBV) stands in for the SIMD features.

A source *vouches* for the features it can tell about; only a vouched-for feature that is absent
counts as missing (LLVM's tuning flags such as ``fast-lzcnt`` are never vouched for).

Pure Python: the runtime-only layer (``tvmgrad.aot.load_library``) checks libraries with it.
"""

from __future__ import annotations

import functools
import platform
import re
from dataclasses import dataclass

__all__ = ["HostCPU", "host", "from_cpuinfo", "X86_FLAGS", "AARCH64_FLAGS"]

# LLVM feature -> the /proc/cpuinfo flag that says the host has it (x86: "flags" line).
X86_FLAGS = {
    "64bit": "lm", "adx": "adx", "aes": "aes", "amx-bf16": "amx_bf16", "amx-complex": "amx_complex",
    "amx-fp16": "amx_fp16", "amx-int8": "amx_int8", "amx-tile": "amx_tile", "avx": "avx",
    "avx2": "avx2", "avx512bf16": "avx512_bf16", "avx512bitalg": "avx512_bitalg",
    "avx512bw": "avx512bw", "avx512cd": "avx512cd", "avx512dq": "avx512dq", "avx512f": "avx512f",
    "avx512fp16": "avx512_fp16", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni",
    "avx512vp2intersect": "avx512_vp2intersect", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avxifma": "avx_ifma", "avxneconvert": "avx_ne_convert", "avxvnni": "avx_vnni",
    "avxvnniint8": "avx_vnni_int8", "avxvnniint16": "avx_vnni_int16", "bmi": "bmi1", "bmi2": "bmi2",
    "cldemote": "cldemote", "clflushopt": "clflushopt", "clwb": "clwb", "clzero": "clzero",
    "cmov": "cmov", "cmpccxadd": "cmpccxadd", "crc32": "sse4_2", "cx16": "cx16", "cx8": "cx8",
    "enqcmd": "enqcmd", "ermsb": "erms", "f16c": "f16c", "fma": "fma", "fma4": "fma4",
    "fsgsbase": "fsgsbase", "fsrm": "fsrm", "fxsr": "fxsr", "gfni": "gfni", "invpcid": "invpcid",
    "lwp": "lwp", "lzcnt": "abm", "mmx": "mmx", "movbe": "movbe", "movdir64b": "movdir64b",
    "movdiri": "movdiri", "mwaitx": "mwaitx", "pclmul": "pclmulqdq", "pconfig": "pconfig",
    "pku": "pku", "popcnt": "popcnt", "prfchw": "3dnowprefetch", "ptwrite": "ptwrite",
    "rdpid": "rdpid", "rdpru": "rdpru", "rdrnd": "rdrand", "rdseed": "rdseed", "rtm": "rtm",
    "sahf": "lahf_lm", "serialize": "serialize", "sha": "sha_ni", "sha512": "sha512",
    "shstk": "user_shstk", "sm3": "sm3", "sm4": "sm4", "sse": "sse", "sse2": "sse2",
    "sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "sse4a": "sse4a", "ssse3": "ssse3",
    "tbm": "tbm", "tsxldtrk": "tsxldtrk", "uintr": "uintr", "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq", "waitpkg": "waitpkg", "wbnoinvd": "wbnoinvd", "x87": "fpu",
    "xop": "xop", "xsave": "xsave", "xsavec": "xsavec", "xsaveopt": "xsaveopt", "xsaves": "xsaves",
}

# LLVM feature -> /proc/cpuinfo flag on aarch64 ("Features" line).
AARCH64_FLAGS = {
    "fp-armv8": "fp", "neon": "asimd", "aes": "aes", "sha2": "sha2", "sha3": "sha3", "sm4": "sm4",
    "crc": "crc32", "lse": "atomics", "rdm": "asimdrdm", "fullfp16": "fphp", "dotprod": "asimddp",
    "fp16fml": "asimdfhm", "rcpc": "lrcpc", "jsconv": "jscvt", "complxnum": "fcma", "sve": "sve",
    "sve2": "sve2", "i8mm": "i8mm", "bf16": "bf16", "sme": "sme", "flagm": "flagm", "ssbs": "ssbs",
    "sb": "sb", "mte": "mte", "bti": "bti", "rand": "rng", "frint3264": "frint", "f32mm": "svef32mm",
    "f64mm": "svef64mm",
}

# numpy's __cpu_features__ name -> LLVM feature (x86 SIMD only: what numpy itself dispatches on).
_NUMPY_X86 = {
    "SSE": "sse", "SSE2": "sse2", "SSE3": "sse3", "SSSE3": "ssse3", "SSE41": "sse4.1",
    "SSE42": "sse4.2", "POPCNT": "popcnt", "AVX": "avx", "F16C": "f16c", "FMA3": "fma",
    "AVX2": "avx2", "AVX512F": "avx512f", "AVX512CD": "avx512cd", "AVX512VL": "avx512vl",
    "AVX512BW": "avx512bw", "AVX512DQ": "avx512dq", "AVX512VNNI": "avx512vnni",
    "AVX512IFMA": "avx512ifma", "AVX512VBMI": "avx512vbmi", "AVX512VBMI2": "avx512vbmi2",
    "AVX512BITALG": "avx512bitalg", "AVX512VPOPCNTDQ": "avx512vpopcntdq",
    "AVX512FP16": "avx512fp16", "AVX512BF16": "avx512bf16",
}
_NUMPY_ARM = {"NEON": "neon", "ASIMD": "neon", "ASIMDHP": "fullfp16", "ASIMDDP": "dotprod",
              "ASIMDFHM": "fp16fml", "SVE": "sve"}


@dataclass(frozen=True)
class HostCPU:
    """The features a host enables (``present``) among those its source can tell about."""

    arch: str                        # "x86_64", "aarch64", ...
    source: str                      # where the facts came from
    present: frozenset
    vouched: frozenset

    def lacks(self, features) -> list[str]:
        """The vouched-for features of ``features`` this host does not enable (sorted)."""
        return sorted(f for f in set(features) if f in self.vouched and f not in self.present)


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _flag_table(arch: str) -> dict:
    return X86_FLAGS if arch == "x86_64" else AARCH64_FLAGS if arch == "aarch64" else {}


def from_cpuinfo(text: str, arch: str) -> HostCPU | None:
    """The host features that a ``/proc/cpuinfo`` text lists (its first CPU); None if it lists none."""
    m = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.MULTILINE)
    table = _flag_table(arch)
    if m is None or not table:
        return None
    flags = set(m.group(1).split())
    present = frozenset(f for f, flag in table.items() if flag in flags)
    return HostCPU(arch, "/proc/cpuinfo", present, frozenset(table))


def _from_numpy(arch: str) -> HostCPU | None:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as found
        except ImportError:
            return None
    table = _NUMPY_X86 if arch == "x86_64" else _NUMPY_ARM if arch == "aarch64" else {}
    if not table:
        return None
    present = frozenset(f for name, f in table.items() if found.get(name))
    return HostCPU(arch, "numpy __cpu_features__", present, frozenset(table.values()))


@functools.cache
def host() -> HostCPU:
    """This host's CPU features (``/proc/cpuinfo``, else numpy's CPUID/XGETBV probe)."""
    arch = _machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            found = from_cpuinfo(fh.read(), arch)
    except OSError:
        found = None
    return found or _from_numpy(arch) or HostCPU(arch, "nothing", frozenset(), frozenset())
